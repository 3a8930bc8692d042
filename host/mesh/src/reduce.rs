//! Reducers and partial results: how the replies of a cast are combined on
//! their way back up the multicast tree.
//!
//! Every node of the tree folds the replies of its own actors and the
//! partial results of its children into one [`Partial`], and sends that one
//! message to its parent, so the caster receives one message per call
//! whatever the size of the mesh.
//!
//! - RD-1: a scalar numeric reducer (`sum-i64` .. `max-f64`) reads each
//!   reply as one CBOR number, as every SDK encodes replies
//!   (`wit/ENCODING.md`; [`crate::cbor`]): the `i64` ones an integer in the
//!   i64 range, written back as an integer with the shortest head; the
//!   `f64` ones a float of 16, 32 or 64 bits or an integer, written back as
//!   a 64-bit float. A reply that is anything else, or holds more than the
//!   number, is an `Invalid` error for its rank that says what it held.
//!   Between hops the running value travels as the i64's or f64's
//!   little-endian bytes ([`Values::Word`]); only the final result is
//!   CBOR.
//! - RD-2: a partial keeps only the error of the lowest rank; once it holds
//!   an error it drops its values, since the call fails anyway.
//! - RD-3: gathered values come out in rank order, whatever order the
//!   partials were merged in; `concat` joins them in that order.
//! - RD-4: integer sums wrap; float sums may differ in the last bits with
//!   the shape of the tree, as float addition is not associative.
//! - RD-5: an elementwise reducer (`sum-f32s`, `sum-f64s`, `sum-i64s`),
//!   which the host uses for tensors and the WIT does not offer, reads
//!   each reply as a raw little-endian array of its element type (not
//!   CBOR) and
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

use crate::cbor::{self, Number};

/// A host-native reducer for the replies of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Reducer {
    /// Wrapping sum of CBOR integers in the i64 range (RD-1).
    SumI64,
    /// Minimum of CBOR integers in the i64 range.
    MinI64,
    /// Maximum of CBOR integers in the i64 range.
    MaxI64,
    /// Sum of CBOR numbers, as f64s.
    SumF64,
    /// Minimum of CBOR numbers, as f64s.
    MinF64,
    /// Maximum of CBOR numbers, as f64s.
    MaxF64,
    /// The replies joined in rank order (a CBOR sequence of the replies).
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

    /// Adds `other` into `acc`, element by element (integers wrapping);
    /// both hold a whole number of elements and are equally long (checked
    /// by the caller). Does nothing for a reducer that is not elementwise.
    pub fn combine_elements(self, acc: &mut [u8], other: &[u8]) {
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

    /// Whether a scalar reducer reads integers (the `i64` ones).
    fn reads_integers(self) -> bool {
        matches!(self, Reducer::SumI64 | Reducer::MinI64 | Reducer::MaxI64)
    }

    /// Reads one reply of a scalar reducer as the word the partials fold
    /// (RD-1). The error says what the reply held instead.
    fn read_word(self, reply: &[u8]) -> Result<[u8; 8], String> {
        match (self.reads_integers(), cbor::read_number(reply)?) {
            (true, Number::Int(n)) => i64::try_from(n)
                .map(i64::to_le_bytes)
                .map_err(|_| format!("the integer {n}, outside the i64 range")),
            (true, Number::Float(x)) => Err(format!("the float {x:?}")),
            (false, Number::Int(n)) => Ok((n as f64).to_le_bytes()),
            (false, Number::Float(x)) => Ok(x.to_le_bytes()),
        }
    }

    /// The final result of a scalar reducer: its word as a CBOR number.
    fn write_word(self, word: [u8; 8]) -> Vec<u8> {
        if self.reads_integers() {
            cbor::int(i64::from_le_bytes(word))
        } else {
            cbor::float(f64::from_le_bytes(word))
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
    /// The running value of a numeric reducer, as the little-endian bytes
    /// of an i64 or f64 (RD-1); `None` until a reply came.
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

    /// An empty partial for `fold` with room for `ranks` replies, when it
    /// gathers them.
    pub fn with_capacity(fold: Fold, ranks: usize) -> Partial {
        let mut partial = Partial::new(fold);
        if let Values::Gathered(values) = &mut partial.values {
            values.reserve_exact(ranks);
        }
        partial
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
                let value = match reducer.read_word(&bytes) {
                    Ok(value) => value,
                    Err(found) => {
                        let needs = if reducer.reads_integers() {
                            "a CBOR integer in the i64 range"
                        } else {
                            "a CBOR float or integer"
                        };
                        let reason = format!(
                            "rank {rank} replied {found}; {} needs {needs} (wit/ENCODING.md)",
                            reducer.name()
                        );
                        return self.fail(rank, RankError::Invalid(reason));
                    }
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
            Values::Word(Some(word)) => Ok(vec![match fold {
                Fold::Reduce(reducer) => reducer.write_word(word),
                _ => word.to_vec(),
            }]),
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
        Ok(cbor::int(v))
    }

    #[test]
    fn rd1_numeric_reducers_read_cbor_numbers_and_refuse_anything_else() {
        let fold = Fold::Reduce(Reducer::SumI64);
        let mut p = Partial::new(fold);
        for rank in 0..10 {
            p.add(fold, rank, int(rank as i64 * 100));
        }
        assert_eq!(p.clone().finish(fold).unwrap(), vec![cbor::int(4500)]);
        assert_eq!(cbor::int(4500), [0x19, 0x11, 0x94], "the shortest head");
        p.add(fold, 3, Ok(vec![0x61, b'a']));
        let (rank, error) = p.finish(fold).unwrap_err();
        assert_eq!(rank, 3);
        assert!(matches!(error, RankError::Invalid(_)));
        assert_eq!(
            error.to_string(),
            "rank 3 replied text; sum-i64 needs a CBOR integer in the i64 range (wit/ENCODING.md)"
        );

        // Integers outside the i64 range, floats, and the old 8
        // little-endian bytes are refused by the i64 reducers.
        for (reply, found) in [
            (
                vec![0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                "the integer 18446744073709551615, outside the i64 range",
            ),
            (cbor::float(2.0), "the float 2.0"),
            (
                7i64.to_le_bytes().to_vec(),
                "a number followed by 7 more bytes",
            ),
            (vec![], "no bytes"),
        ] {
            let fold = Fold::Reduce(Reducer::MinI64);
            let mut p = Partial::new(fold);
            p.add(fold, 0, int(1));
            p.add(fold, 1, Ok(reply));
            let (rank, error) = p.finish(fold).unwrap_err();
            assert_eq!(rank, 1);
            assert!(
                error.to_string().contains(&format!("replied {found};")),
                "{error}"
            );
        }

        // The f64 reducers read floats of every width, and integers.
        let fold = Fold::Reduce(Reducer::MaxF64);
        let mut p = Partial::new(fold);
        p.add(fold, 0, Ok(cbor::float(1.5)));
        p.add(fold, 1, Ok(vec![0xf9, 0x3e, 0x00])); // f16 1.5
        p.add(fold, 2, Ok(vec![0xfa, 0x40, 0xe8, 0x00, 0x00])); // f32 7.25
        p.add(fold, 3, int(-2));
        assert_eq!(p.finish(fold).unwrap(), vec![cbor::float(7.25)]);
        let fold = Fold::Reduce(Reducer::SumF64);
        let mut p = Partial::new(fold);
        p.add(fold, 0, int(2));
        p.add(fold, 1, int(3));
        assert_eq!(p.clone().finish(fold).unwrap(), vec![cbor::float(5.0)]);
        p.add(fold, 2, Ok(vec![0xf6]));
        let (_, error) = p.finish(fold).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("replied null; sum-f64 needs a CBOR float or integer"),
            "{error}"
        );
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
        assert_eq!(left.finish(fold).unwrap()[0], cbor::int(i64::MIN));
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
