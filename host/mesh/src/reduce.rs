//! Reducers and partial results: how the replies of a cast are combined on
//! their way back up the multicast tree.
//!
//! Every node of the tree folds the replies of its own actors and the
//! partial results of its children into one [`Partial`], and sends that one
//! message to its parent, so the caster receives one message per call
//! whatever the size of the mesh.
//!
//! - RD-1: a numeric reducer reads each reply as one little-endian i64 or
//!   f64; a reply of another length is an `Invalid` error for its rank.
//! - RD-2: a partial keeps only the error of the lowest rank; once it holds
//!   an error it drops its values, since the call fails anyway.
//! - RD-3: gathered values come out in rank order, whatever order the
//!   partials were merged in; `concat` joins them in that order.
//! - RD-4: integer sums wrap; float sums may differ in the last bits with
//!   the shape of the tree, as float addition is not associative.

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
            Reducer::Concat => a,
        }
    }
}

/// Why one rank did not contribute a value.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum RankError {
    /// The endpoint returned an error; the actor lives on.
    Endpoint(String),
    /// The actor or its proc failed.
    Failed(String),
    /// No reply within this many milliseconds.
    Timeout(u64),
    /// The reply could not be reduced, or the request was not valid.
    Invalid(String),
}

impl std::fmt::Display for RankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RankError::Endpoint(text) => write!(f, "endpoint error: {text}"),
            RankError::Failed(reason) => write!(f, "{reason}"),
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
        match (&mut self.values, other.values) {
            (Values::Gathered(mine), Values::Gathered(theirs)) => mine.extend(theirs),
            (Values::Word(mine), Values::Word(Some(theirs))) => {
                if let Fold::Reduce(reducer) = fold {
                    *mine = Some(match *mine {
                        Some(acc) => reducer.combine(acc, theirs),
                        None => theirs,
                    });
                }
            }
            _ => {}
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
            Values::Word(None) => Err((
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
}
