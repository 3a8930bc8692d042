//! [`ValueMesh`]: one value per rank of a mesh, in rank order.

use serde::de::DeserializeOwned;

use crate::bindings::monarch::host::types as wit;
use crate::{CallError, Extent, codec};

/// One value per rank, in rank order, shaped like the mesh that produced
/// them: what [`ActorMesh::call`](crate::ActorMesh::call) returns.
///
/// ```
/// use monarch_guest::{ValueMesh, extent};
///
/// let mesh = ValueMesh::new(extent!(gpus = 2), vec!["a", "b"]).unwrap();
/// assert_eq!(mesh.get(1), Some(&"b"));
/// for (rank, value) in mesh.iter() {
///     println!("rank {rank}: {value}");
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ValueMesh<T> {
    extent: Extent,
    values: Vec<T>,
}

impl<T> ValueMesh<T> {
    /// A value mesh from an extent and one value per rank, or `None` when
    /// the counts differ.
    pub fn new(extent: Extent, values: Vec<T>) -> Option<Self> {
        (extent.num_ranks() == values.len()).then_some(Self { extent, values })
    }

    /// The shape of the mesh the values came from.
    pub fn extent(&self) -> &Extent {
        &self.extent
    }

    /// How many values (ranks) there are.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are no values (a mesh with a dimension of size 0).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The value of `rank`.
    pub fn get(&self, rank: u32) -> Option<&T> {
        self.values.get(rank as usize)
    }

    /// `(rank, value)` pairs in rank order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (u32, &T)> {
        self.values
            .iter()
            .enumerate()
            .map(|(rank, v)| (rank as u32, v))
    }

    /// The values in rank order.
    pub fn values(&self) -> &[T] {
        &self.values
    }

    /// The values in rank order, without the extent.
    pub fn into_values(self) -> Vec<T> {
        self.values
    }

    /// A value mesh of the same shape with `f` applied to every value.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> ValueMesh<U> {
        ValueMesh {
            extent: self.extent,
            values: self.values.into_iter().map(f).collect(),
        }
    }
}

impl<T: DeserializeOwned + 'static> ValueMesh<T> {
    /// Decodes the host's gathered replies. A value that does not decode, or
    /// a count that does not match the extent, is a [`CallError`] of kind
    /// [`Decode`](crate::ErrorKind::Decode) naming the rank.
    pub(crate) fn decode(raw: wit::ValueMesh) -> Result<Self, CallError> {
        let extent = Extent::from(raw.extent);
        if extent.num_ranks() != raw.values.len() {
            return Err(CallError::decode(format!(
                "the host gathered {} replies for a mesh of {} ranks ({extent})",
                raw.values.len(),
                extent.num_ranks()
            )));
        }
        let values = (0u32..)
            .zip(&raw.values)
            .map(|(rank, bytes)| {
                codec::decode(bytes).map_err(|e| CallError::decode(format!("rank {rank}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { extent, values })
    }
}

impl<T> IntoIterator for ValueMesh<T> {
    type Item = (u32, T);
    type IntoIter = std::iter::Zip<std::ops::RangeFrom<u32>, std::vec::IntoIter<T>>;

    /// `(rank, value)` pairs in rank order.
    fn into_iter(self) -> Self::IntoIter {
        (0u32..).zip(self.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent;

    fn raw(extent: &Extent, values: Vec<Vec<u8>>) -> wit::ValueMesh {
        wit::ValueMesh {
            extent: extent.into(),
            values,
        }
    }

    #[test]
    fn decodes_values_in_rank_order() {
        let shape = extent!(hosts = 2, gpus = 2);
        let values = (0..4i64)
            .map(|v| codec::encode(&(v * v)).unwrap())
            .collect();
        let mesh = ValueMesh::<i64>::decode(raw(&shape, values)).unwrap();
        assert_eq!(mesh.len(), 4);
        assert_eq!(mesh.get(3), Some(&9));
        assert_eq!(mesh.get(4), None);
        assert_eq!(
            mesh.iter().collect::<Vec<_>>(),
            [(0, &0), (1, &1), (2, &4), (3, &9)]
        );
        assert_eq!(mesh.map(|v| v + 1).into_iter().last(), Some((3, 10)));
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_rank() {
        let shape = extent!(gpus = 2);
        let values = vec![codec::encode(&1i64).unwrap(), vec![1, 2]];
        let err = ValueMesh::<i64>::decode(raw(&shape, values)).unwrap_err();
        assert!(
            err.kind() == crate::ErrorKind::Decode && err.message().starts_with("rank 1:"),
            "{err}"
        );
    }

    #[test]
    fn a_count_that_does_not_match_the_extent_is_an_error() {
        let shape = extent!(gpus = 3);
        let values = vec![codec::encode(&1i64).unwrap()];
        let err = ValueMesh::<i64>::decode(raw(&shape, values)).unwrap_err();
        assert!(
            err.to_string().contains("1 replies for a mesh of 3 ranks"),
            "{err}"
        );
        assert!(ValueMesh::new(shape, vec![1]).is_none());
    }
}
