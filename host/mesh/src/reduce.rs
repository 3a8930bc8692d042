//! Reducers and partial results: how the replies of a cast are combined on
//! their way back up the multicast tree.
//!
//! Every node of the tree folds the replies of its own actors and the
//! partial results of its children into one [`Partial`], and sends that one
//! message to its parent, so the caster receives one message per call
//! whatever the size of the mesh.
//!
//! - RD-1: a scalar numeric reducer (`sum-i64` .. `max-f64`) reads each
//!   reply as one little-endian i64 or f64; a reply of another length is an
//!   `Invalid` error for its rank.
//! - RD-2: a partial keeps only the error of the lowest rank; once it holds
//!   an error it drops its values, since the call fails anyway.
//! - RD-3: gathered values come out in rank order, whatever order the
//!   partials were merged in; `concat` joins them in that order.
//! - RD-4: integer sums wrap; float sums may differ in the last bits with
//!   the shape of the tree, as float addition is not associative.
//! - RD-5: an elementwise reducer (`sum-f32s`, `sum-f64s`, `sum-i64s`)
//!   reads each reply as a little-endian array of its element type and
//!   sums the arrays element by element (integers wrapping, floats in their
//!   own precision: f32 arrays add in f32). A reply that is not a whole
//!   number of elements, or whose length differs from the replies folded
//!   before it, is an `Invalid` error for its rank; the empty array is a
//!   valid reply.
//! - RD-6: elementwise reducers fold at every hop like the scalar ones: a
//!   node sends its parent one array, the sum of its subtree, so the
//!   caster receives one array per call whatever the size of the mesh.
//!   (A node that is not a leaf keeps its subtree's sum until the cast's
//!   timeout, to answer a new parent after a death: CA-3.)

/// A host-native reducer for the replies of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Reducer {
    /// Wrapping sum of little-endian i64s.
    SumI64,
    /// Minimum of little-endian i64s.
    MinI64,
    /// Maximum of little-endian i64s.
    MaxI64,
    /// Sum of little-endian f64s.
    SumF64,
    /// Minimum of little-endian f64s.
    MinF64,
    /// Maximum of little-endian f64s.
    MaxF64,
    /// The replies joined in rank order.
    Concat,
    /// Elementwise sum of equally long little-endian f32 arrays (RD-5).
    SumF32s,
    /// Elementwise sum of equally long little-endian f64 arrays (RD-5).
    SumF64s,
    /// Elementwise wrapping sum of equally long little-endian i64 arrays
    /// (RD-5).
    SumI64s,
}

impl Reducer {
    /// The reducer's name, as in the WIT.
    pub fn name(self) -> &'static str {
        match self {
            Reducer::SumI64 => "sum-i64",
            Reducer::MinI64 => "min-i64",
            Reducer::MaxI64 => "max-i64",
            Reducer::SumF64 => "sum-f64",
            Reducer::MinF64 => "min-f64",
            Reducer::MaxF64 => "max-f64",
            Reducer::Concat => "concat",
            Reducer::SumF32s => "sum-f32s",
            Reducer::SumF64s => "sum-f64s",
            Reducer::SumI64s => "sum-i64s",
        }
    }

    /// Every reducer, in a fixed order.
    pub const ALL: [Reducer; 10] = [
        Reducer::SumI64,
        Reducer::MinI64,
        Reducer::MaxI64,
        Reducer::SumF64,
        Reducer::MinF64,
        Reducer::MaxF64,
        Reducer::Concat,
        Reducer::SumF32s,
        Reducer::SumF64s,
        Reducer::SumI64s,
    ];

    /// The reducer named `name` (see [`Reducer::name`]).
    pub fn from_name(name: &str) -> Option<Reducer> {
        Reducer::ALL.into_iter().find(|r| r.name() == name)
    }

    /// For an elementwise reducer (RD-5), the size of one element in bytes.
    pub fn element_size(self) -> Option<usize> {
        match self {
            Reducer::SumF32s => Some(4),
            Reducer::SumF64s | Reducer::SumI64s => Some(8),
            _ => None,
        }
    }

    /// Adds `other` into `acc`, element by element; both hold a whole
    /// number of elements and are equally long (checked by the caller).
    fn combine_elements(self, acc: &mut [u8], other: &[u8]) {
        fn add<const N: usize>(
            acc: &mut [u8],
            other: &[u8],
            f: impl Fn([u8; N], [u8; N]) -> [u8; N],
        ) {
            let (acc, _) = acc.as_chunks_mut::<N>();
            let (other, _) = other.as_chunks::<N>();
            for (a, b) in acc.iter_mut().zip(other) {
                *a = f(*a, *b);
            }
        }
        match self {
            Reducer::SumF32s => add::<4>(acc, other, |a, b| {
                (f32::from_le_bytes(a) + f32::from_le_bytes(b)).to_le_bytes()
            }),
            Reducer::SumF64s => add::<8>(acc, other, |a, b| {
                (f64::from_le_bytes(a) + f64::from_le_bytes(b)).to_le_bytes()
            }),
            Reducer::SumI64s => add::<8>(acc, other, |a, b| {
                i64::from_le_bytes(a)
                    .wrapping_add(i64::from_le_bytes(b))
                    .to_le_bytes()
            }),
            _ => {}
        }
    }

    fn combine(self, a: [u8; 8], b: [u8; 8]) -> [u8; 8] {
        let (i, j) = (i64::from_le_bytes(a), i64::from_le_bytes(b));
        let (x, y) = (f64::from_le_bytes(a), f64::from_le_bytes(b));
        match self {
            Reducer::SumI64 => i.wrapping_add(j).to_le_bytes(),
            Reducer::MinI64 => i.min(j).to_le_bytes(),
            Reducer::MaxI64 => i.max(j).to_le_bytes(),
            Reducer::SumF64 => (x + y).to_le_bytes(),
            Reducer::MinF64 => x.min(y).to_le_bytes(),
            Reducer::MaxF64 => x.max(y).to_le_bytes(),
            Reducer::Concat | Reducer::SumF32s | Reducer::SumF64s | Reducer::SumI64s => a,
        }
    }
}

/// Why one rank did not contribute a value.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum RankError {
    /// The endpoint returned an error; the actor lives on.
    Endpoint(String),
    /// The actor failed; the reason may be an encoded
    /// [`Fault`](crate::Fault).
    Failed(String),
    /// The actor, or its proc, was stopped by its owner, or never existed.
    Stopped(String),
    /// The actor's proc exited, was killed, or cannot be reached.
    Lost(String),
    /// No reply within this many milliseconds.
    Timeout(u64),
    /// The reply could not be reduced, or the request was not valid.
    Invalid(String),
}

impl std::fmt::Display for RankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankError::Endpoint(text) => {
                write!(f, "endpoint error: {}", crate::Fault::readable(text))
            }
            RankError::Failed(reason) => write!(f, "{}", crate::Fault::readable(reason)),
            RankError::Stopped(reason) | RankError::Lost(reason) => write!(f, "{reason}"),
            RankError::Timeout(ms) => write!(f, "no reply within {ms} ms"),
            RankError::Invalid(reason) => write!(f, "{reason}"),
        }
    }
}

/// What a partial result holds besides its error.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Values {
    /// No values are kept (streams and broadcasts report per rank).
    None,
    /// Replies by rank, for gathering and `concat`.
    Gathered(Vec<(u32, Vec<u8>)>),
    /// The running value of a numeric reducer; `None` until a reply came.
    Word(Option<[u8; 8]>),
    /// The running sum of an elementwise reducer (RD-5), with the lowest
    /// rank folded into it; `None` until a reply came.
    Elements(Option<(u32, Vec<u8>)>),
}

/// The folded replies of part of a mesh (RD-2).
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Partial {
    /// The values so far.
    pub values: Values,
    /// The error of the lowest rank that failed, if any.
    pub error: Option<(u32, RankError)>,
}

/// How replies are folded: gathered, reduced, or not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fold {
    /// Keep every reply by rank.
    Gather,
    /// Reduce with a host-native reducer.
    Reduce(Reducer),
    /// Keep nothing but errors.
    Discard,
}

impl Partial {
    /// An empty partial for `fold`.
    pub fn new(fold: Fold) -> Partial {
        let values = match fold {
            Fold::Gather | Fold::Reduce(Reducer::Concat) => Values::Gathered(Vec::new()),
            Fold::Reduce(reducer) if reducer.element_size().is_some() => Values::Elements(None),
            Fold::Reduce(_) => Values::Word(None),
            Fold::Discard => Values::None,
        };
        Partial {
            values,
            error: None,
        }
    }

    /// Folds in one rank's reply (RD-1).
    pub fn add(&mut self, fold: Fold, rank: u32, reply: Result<Vec<u8>, RankError>) {
        let bytes = match reply {
            Ok(bytes) => bytes,
            Err(error) => return self.fail(rank, error),
        };
        if self.error.is_some() {
            return;
        }
        match &mut self.values {
            Values::None => {}
            Values::Gathered(values) => values.push((rank, bytes)),
            Values::Word(word) => {
                let Fold::Reduce(reducer) = fold else { return };
                let Ok(value) = <[u8; 8]>::try_from(bytes.as_slice()) else {
                    let reason = format!(
                        "rank {rank} replied {} bytes; {} needs 8",
                        bytes.len(),
                        reducer.name()
                    );
                    return self.fail(rank, RankError::Invalid(reason));
                };
                *word = Some(match *word {
                    Some(acc) => reducer.combine(acc, value),
                    None => value,
                });
            }
            Values::Elements(sum) => {
                let Fold::Reduce(reducer) = fold else { return };
                let size = reducer.element_size().unwrap_or(1);
                if !bytes.len().is_multiple_of(size) {
                    let reason = format!(
                        "rank {rank} replied {} bytes, not a whole number of {size}-byte elements ({})",
                        bytes.len(),
                        reducer.name()
                    );
                    return self.fail(rank, RankError::Invalid(reason));
                }
                match sum {
                    None => *sum = Some((rank, bytes)),
                    Some((lowest, acc)) if acc.len() == bytes.len() => {
                        reducer.combine_elements(acc, &bytes);
                        *lowest = (*lowest).min(rank);
                    }
                    Some((lowest, acc)) => {
                        let reason = format!(
                            "rank {rank} replied {} bytes where rank {lowest} replied {}; {} needs equally long arrays",
                            bytes.len(),
                            acc.len(),
                            reducer.name()
                        );
                        self.fail(rank, RankError::Invalid(reason));
                    }
                }
            }
        }
    }

    /// Records that `rank` failed, keeping the lowest rank's error (RD-2).
    pub fn fail(&mut self, rank: u32, error: RankError) {
        if self.error.as_ref().is_none_or(|(r, _)| rank < *r) {
            self.error = Some((rank, error));
        }
        self.values = match self.values {
            Values::None => Values::None,
            Values::Gathered(_) => Values::Gathered(Vec::new()),
            Values::Word(_) => Values::Word(None),
            Values::Elements(_) => Values::Elements(None),
        };
    }

    /// Folds in another partial of the same request.
    pub fn merge(&mut self, fold: Fold, other: Partial) {
        if let Some((rank, error)) = other.error {
            self.fail(rank, error);
        }
        if self.error.is_some() {
            return;
        }
        let mismatch = match (&mut self.values, other.values) {
            (Values::Gathered(mine), Values::Gathered(theirs)) => {
                mine.extend(theirs);
                None
            }
            (Values::Word(mine), Values::Word(Some(theirs))) => {
                if let Fold::Reduce(reducer) = fold {
                    *mine = Some(match *mine {
                        Some(acc) => reducer.combine(acc, theirs),
                        None => theirs,
                    });
                }
                None
            }
            (Values::Elements(mine), Values::Elements(Some((their_lowest, theirs)))) => {
                let Fold::Reduce(reducer) = fold else { return };
                match mine {
                    None => {
                        *mine = Some((their_lowest, theirs));
                        None
                    }
                    Some((lowest, acc)) if acc.len() == theirs.len() => {
                        reducer.combine_elements(acc, &theirs);
                        *lowest = (*lowest).min(their_lowest);
                        None
                    }
                    // Blame the subtree whose lowest rank is higher: the
                    // other one's length is the reference.
                    Some((lowest, acc)) => {
                        let ((rank, len), (reference, reference_len)) = if their_lowest > *lowest {
                            ((their_lowest, theirs.len()), (*lowest, acc.len()))
                        } else {
                            ((*lowest, acc.len()), (their_lowest, theirs.len()))
                        };
                        let reason = format!(
                            "rank {rank} replied {len} bytes where rank {reference} replied {reference_len}; {} needs equally long arrays",
                            reducer.name()
                        );
                        Some((rank, reason))
                    }
                }
            }
            _ => None,
        };
        if let Some((rank, reason)) = mismatch {
            self.fail(rank, RankError::Invalid(reason));
        }
    }

    /// The final result: gathered replies in rank order, or the reduced
    /// bytes, or the lowest rank's error (RD-3).
    pub fn finish(self, fold: Fold) -> Result<Vec<Vec<u8>>, (u32, RankError)> {
        if let Some(error) = self.error {
            return Err(error);
        }
        match self.values {
            Values::None => Ok(Vec::new()),
            Values::Gathered(mut values) => {
                values.sort_by_key(|(rank, _)| *rank);
                let values = values.into_iter().map(|(_, bytes)| bytes);
                Ok(match fold {
                    Fold::Reduce(Reducer::Concat) => vec![values.flatten().collect()],
                    _ => values.collect(),
                })
            }
            Values::Word(Some(word)) => Ok(vec![word.to_vec()]),
            Values::Elements(Some((_, sum))) => Ok(vec![sum]),
            Values::Word(None) | Values::Elements(None) => Err((
                0,
                RankError::Invalid("nothing to reduce: the mesh is empty".into()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: i64) -> Result<Vec<u8>, RankError> {
        Ok(v.to_le_bytes().to_vec())
    }

    #[test]
    fn rd1_numeric_reducers_read_words_and_refuse_other_lengths() {
        let fold = Fold::Reduce(Reducer::SumI64);
        let mut p = Partial::new(fold);
        for rank in 0..10 {
            p.add(fold, rank, int(rank as i64));
        }
        assert_eq!(
            p.clone().finish(fold).unwrap(),
            vec![45i64.to_le_bytes().to_vec()]
        );
        p.add(fold, 3, Ok(vec![1, 2, 3]));
        let (rank, error) = p.finish(fold).unwrap_err();
        assert_eq!(rank, 3);
        assert!(error.to_string().contains("replied 3 bytes"), "{error}");

        let fold = Fold::Reduce(Reducer::MaxF64);
        let mut p = Partial::new(fold);
        for (rank, x) in [1.5f64, -2.0, 7.25].into_iter().enumerate() {
            p.add(fold, rank as u32, Ok(x.to_le_bytes().to_vec()));
        }
        assert_eq!(p.finish(fold).unwrap()[0], 7.25f64.to_le_bytes().to_vec());
    }

    #[test]
    fn rd2_the_lowest_rank_error_wins_across_merges() {
        let fold = Fold::Gather;
        let mut a = Partial::new(fold);
        a.add(fold, 4, Err(RankError::Failed("four".into())));
        let mut b = Partial::new(fold);
        b.add(fold, 2, Err(RankError::Timeout(5)));
        b.add(fold, 9, Err(RankError::Failed("nine".into())));
        a.merge(fold, b);
        assert_eq!(a.finish(fold).unwrap_err(), (2, RankError::Timeout(5)));
    }

    #[test]
    fn rd3_gathered_values_come_out_in_rank_order_whatever_the_merge_order() {
        let fold = Fold::Reduce(Reducer::Concat);
        let mut high = Partial::new(fold);
        high.add(fold, 3, Ok(b"d".to_vec()));
        high.add(fold, 2, Ok(b"c".to_vec()));
        let mut root = Partial::new(fold);
        root.merge(fold, high);
        root.add(fold, 0, Ok(b"a".to_vec()));
        root.add(fold, 1, Ok(b"b".to_vec()));
        assert_eq!(root.finish(fold).unwrap(), vec![b"abcd".to_vec()]);
    }

    #[test]
    fn rd4_integer_sums_wrap_and_partials_reduce_like_one_pass() {
        let fold = Fold::Reduce(Reducer::SumI64);
        let mut left = Partial::new(fold);
        left.add(fold, 0, int(i64::MAX));
        let mut right = Partial::new(fold);
        right.add(fold, 1, int(1));
        left.merge(fold, right);
        assert_eq!(
            left.finish(fold).unwrap()[0],
            i64::MIN.to_le_bytes().to_vec()
        );
        let empty = Partial::new(fold);
        assert!(matches!(
            empty.finish(fold),
            Err((_, RankError::Invalid(_)))
        ));
    }

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn read_f32s(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn rd5_elementwise_reducers_sum_arrays_element_by_element() {
        let fold = Fold::Reduce(Reducer::SumF32s);
        let mut p = Partial::new(fold);
        for rank in 0..4u32 {
            let r = rank as f32;
            p.add(fold, rank, Ok(f32s(&[r, 10.0 * r, -r, 0.5])));
        }
        let sum = p.finish(fold).unwrap();
        assert_eq!(sum.len(), 1);
        assert_eq!(read_f32s(&sum[0]), vec![6.0, 60.0, -6.0, 2.0]);

        let fold = Fold::Reduce(Reducer::SumI64s);
        let mut p = Partial::new(fold);
        let ints = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        p.add(fold, 0, Ok(ints(&[i64::MAX, 5, -7])));
        p.add(fold, 1, Ok(ints(&[1, 6, 7])));
        assert_eq!(
            p.finish(fold).unwrap(),
            vec![ints(&[i64::MIN, 11, 0])],
            "i64 arrays wrap like sum-i64 (RD-4)"
        );

        let fold = Fold::Reduce(Reducer::SumF64s);
        let mut p = Partial::new(fold);
        p.add(fold, 2, Ok(1.25f64.to_le_bytes().to_vec()));
        p.add(fold, 0, Ok(2.5f64.to_le_bytes().to_vec()));
        assert_eq!(
            p.finish(fold).unwrap(),
            vec![3.75f64.to_le_bytes().to_vec()]
        );

        // Empty arrays are valid replies; their sum is empty.
        let mut p = Partial::new(fold);
        p.add(fold, 0, Ok(Vec::new()));
        p.add(fold, 1, Ok(Vec::new()));
        assert_eq!(p.finish(fold).unwrap(), vec![Vec::<u8>::new()]);
    }

    #[test]
    fn rd5_a_length_mismatch_is_invalid_for_that_rank() {
        let fold = Fold::Reduce(Reducer::SumF32s);
        let mut p = Partial::new(fold);
        p.add(fold, 0, Ok(f32s(&[1.0, 2.0])));
        p.add(fold, 1, Ok(f32s(&[1.0, 2.0, 3.0])));
        let (rank, error) = p.finish(fold).unwrap_err();
        assert_eq!(rank, 1);
        assert!(matches!(error, RankError::Invalid(_)));
        assert!(
            error
                .to_string()
                .contains("rank 1 replied 12 bytes where rank 0 replied 8"),
            "{error}"
        );

        // Not a whole number of elements.
        let fold = Fold::Reduce(Reducer::SumF64s);
        let mut p = Partial::new(fold);
        p.add(fold, 3, Ok(vec![0; 12]));
        let (rank, error) = p.finish(fold).unwrap_err();
        assert_eq!(rank, 3);
        assert!(error.to_string().contains("8-byte elements"), "{error}");

        // Between subtrees: the one with the higher lowest rank is blamed.
        let fold = Fold::Reduce(Reducer::SumI64s);
        let mut low = Partial::new(fold);
        low.add(fold, 1, Ok(vec![0; 16]));
        let mut high = Partial::new(fold);
        high.add(fold, 6, Ok(vec![0; 8]));
        high.add(fold, 5, Ok(vec![0; 8]));
        let mut root = Partial::new(fold);
        root.merge(fold, high);
        root.merge(fold, low);
        let (rank, error) = root.finish(fold).unwrap_err();
        assert_eq!(rank, 5, "{error}");
        assert!(matches!(error, RankError::Invalid(_)));
    }

    #[test]
    fn rd6_elementwise_partials_fold_at_every_hop_like_one_pass() {
        // A three-level tree: leaves fold their ranks, inner nodes merge
        // leaves, the root merges inner nodes, in a scrambled order.
        let fold = Fold::Reduce(Reducer::SumI64s);
        let reply = |rank: u32| -> Vec<u8> {
            (0..100i64)
                .flat_map(|i| (i * 1000 + rank as i64).to_le_bytes())
                .collect()
        };
        let leaf = |ranks: &[u32]| {
            let mut p = Partial::new(fold);
            for &r in ranks {
                p.add(fold, r, Ok(reply(r)));
            }
            p
        };
        let mut left = leaf(&[4, 5]);
        left.merge(fold, leaf(&[0, 1]));
        let mut right = leaf(&[2, 3]);
        right.merge(fold, leaf(&[7, 6]));
        let mut root = Partial::new(fold);
        root.merge(fold, right);
        root.merge(fold, left);
        let Values::Elements(Some((lowest, _))) = &root.values else {
            panic!("the root holds one array")
        };
        assert_eq!(*lowest, 0);

        let mut one_pass = Partial::new(fold);
        for r in 0..8 {
            one_pass.add(fold, r, Ok(reply(r)));
        }
        let expected: Vec<u8> = (0..100i64)
            .flat_map(|i| (8 * i * 1000 + 28).to_le_bytes())
            .collect();
        assert_eq!(one_pass.finish(fold).unwrap(), vec![expected.clone()]);
        assert_eq!(root.finish(fold).unwrap(), vec![expected]);

        // An error anywhere below drops the arrays (RD-2).
        let mut p = leaf(&[0, 1]);
        p.merge(fold, {
            let mut q = Partial::new(fold);
            q.add(fold, 2, Err(RankError::Failed("gone".into())));
            q
        });
        assert_eq!(p.values, Values::Elements(None));
        assert_eq!(
            p.finish(fold).unwrap_err(),
            (2, RankError::Failed("gone".into()))
        );
    }

    #[test]
    fn reducer_names_round_trip() {
        for reducer in Reducer::ALL {
            assert_eq!(Reducer::from_name(reducer.name()), Some(reducer));
        }
        assert_eq!(Reducer::from_name("sum-f32s"), Some(Reducer::SumF32s));
        assert_eq!(Reducer::from_name("sum-f16s"), None);
    }
}
