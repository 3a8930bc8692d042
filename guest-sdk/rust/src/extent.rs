//! Shapes of meshes: [`Extent`], its [`Dim`]s, and the [`SliceDim`]s that
//! cut a sub-mesh out of a mesh.
//!
//! An extent names its dimensions outermost first, such as `hosts=2, gpus=8`.
//! Ranks are row-major: the last dimension varies fastest, so in
//! `hosts=2, gpus=8` rank 9 is `hosts=1, gpus=1`. An extent with no
//! dimensions holds exactly one rank (a single actor, say after indexing
//! every dimension of a mesh).

use std::fmt;
use std::ops::Range;

use crate::bindings::monarch::host::types as wit;

/// One named dimension of a mesh, such as `gpus=8`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dim {
    /// The dimension's name.
    pub name: String,
    /// How many ranks lie along it.
    pub size: u32,
}

/// The shape of a mesh: its dimensions, outermost first.
///
/// Build one with [`extent!`](crate::extent!) or [`Extent::new`]:
///
/// ```
/// use monarch_guest::{Extent, extent};
///
/// let shape = extent!(hosts = 2, gpus = 4);
/// assert_eq!(shape, Extent::new([("hosts", 2), ("gpus", 4)]));
/// assert_eq!(shape.num_ranks(), 8);
/// assert_eq!(shape.coords(5), Some(vec![1, 1]));
/// assert_eq!(shape.to_string(), "hosts=2, gpus=4");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Extent {
    dims: Vec<Dim>,
}

impl Extent {
    /// An extent from `(name, size)` pairs, outermost first.
    pub fn new<N: Into<String>>(dims: impl IntoIterator<Item = (N, u32)>) -> Self {
        Self {
            dims: dims
                .into_iter()
                .map(|(name, size)| Dim {
                    name: name.into(),
                    size,
                })
                .collect(),
        }
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// The size of the dimension called `name`, if there is one.
    pub fn size(&self, name: &str) -> Option<u32> {
        self.dims.iter().find(|d| d.name == name).map(|d| d.size)
    }

    /// How many ranks the extent holds: the product of its sizes (1 when
    /// it has no dimensions).
    pub fn num_ranks(&self) -> usize {
        self.dims.iter().map(|d| d.size as usize).product()
    }

    /// The coordinates of `rank`, one per dimension, or `None` when the
    /// extent has no such rank.
    pub fn coords(&self, rank: u32) -> Option<Vec<u32>> {
        if rank as usize >= self.num_ranks() {
            return None;
        }
        let mut rest = rank;
        let mut coords = vec![0; self.dims.len()];
        for (coord, dim) in coords.iter_mut().zip(&self.dims).rev() {
            *coord = rest % dim.size;
            rest /= dim.size;
        }
        Some(coords)
    }

    /// The rank at `coords` (one per dimension), or `None` when they lie
    /// outside the extent.
    pub fn rank_of(&self, coords: &[u32]) -> Option<u32> {
        if coords.len() != self.dims.len() {
            return None;
        }
        let mut rank: u64 = 0;
        for (&coord, dim) in coords.iter().zip(&self.dims) {
            if coord >= dim.size {
                return None;
            }
            rank = rank * u64::from(dim.size) + u64::from(coord);
        }
        u32::try_from(rank).ok()
    }
}

impl fmt::Display for Extent {
    /// `hosts=2, gpus=4`; an extent with no dimensions shows as `(single)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dims.is_empty() {
            return f.write_str("(single)");
        }
        for (i, dim) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}={}", dim.name, dim.size)?;
        }
        Ok(())
    }
}

impl<N: Into<String>> FromIterator<(N, u32)> for Extent {
    fn from_iter<I: IntoIterator<Item = (N, u32)>>(iter: I) -> Self {
        Self::new(iter)
    }
}

impl From<wit::Extent> for Extent {
    fn from(dims: wit::Extent) -> Self {
        Self {
            dims: dims
                .into_iter()
                .map(|d| Dim {
                    name: d.name,
                    size: d.size,
                })
                .collect(),
        }
    }
}

impl From<&Extent> for wit::Extent {
    fn from(extent: &Extent) -> Self {
        extent
            .dims
            .iter()
            .map(|d| wit::Dim {
                name: d.name.clone(),
                size: d.size,
            })
            .collect()
    }
}

/// Builds an [`Extent`]: `extent!(hosts = 1, gpus = 4)`.
#[macro_export]
macro_rules! extent {
    ($($name:ident = $size:expr),* $(,)?) => {
        $crate::Extent::new([$((::core::stringify!($name), $size)),*])
    };
}

/// What to keep of one dimension when slicing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selector {
    /// One index; the dimension is dropped from the slice's extent.
    Index(u32),
    /// Indices `start..end` by `step`; the dimension is kept.
    Range {
        /// The first index kept.
        start: u32,
        /// One past the last index that may be kept.
        end: u32,
        /// The distance between kept indices (1 keeps every one).
        step: u32,
    },
}

/// How to slice one dimension, by name. Pass several to
/// [`ActorMesh::slice`](crate::ActorMesh::slice) or
/// [`ProcMesh::slice`](crate::ProcMesh::slice); dimensions not named are
/// kept whole.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SliceDim {
    /// The dimension's name.
    pub dim: String,
    /// What to keep of it.
    pub select: Selector,
}

impl SliceDim {
    /// Keeps index `index` of `dim` and drops the dimension.
    pub fn index(dim: impl Into<String>, index: u32) -> Self {
        Self {
            dim: dim.into(),
            select: Selector::Index(index),
        }
    }

    /// Keeps the indices `range` of `dim`.
    pub fn range(dim: impl Into<String>, range: Range<u32>) -> Self {
        Self::range_step(dim, range, 1)
    }

    /// Keeps every `step`th index of `range` along `dim`.
    pub fn range_step(dim: impl Into<String>, range: Range<u32>, step: u32) -> Self {
        Self {
            dim: dim.into(),
            select: Selector::Range {
                start: range.start,
                end: range.end,
                step,
            },
        }
    }
}

pub(crate) fn to_wit_slice(dims: &[SliceDim]) -> Vec<wit::SliceDim> {
    dims.iter()
        .map(|d| wit::SliceDim {
            dim: d.dim.clone(),
            select: match d.select {
                Selector::Index(i) => wit::Selector::Index(i),
                Selector::Range { start, end, step } => wit::Selector::Range((start, end, step)),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_row_major() {
        let shape = extent!(hosts = 2, gpus = 3);
        assert_eq!(shape.num_ranks(), 6);
        let all: Vec<_> = (0..6).map(|r| shape.coords(r).unwrap()).collect();
        assert_eq!(
            all,
            [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]].map(Vec::from)
        );
        for rank in 0..6 {
            assert_eq!(shape.rank_of(&shape.coords(rank).unwrap()), Some(rank));
        }
        assert_eq!(shape.coords(6), None);
        assert_eq!(shape.rank_of(&[2, 0]), None);
        assert_eq!(shape.rank_of(&[0]), None);
    }

    #[test]
    fn an_extent_without_dimensions_holds_one_rank() {
        let single = Extent::default();
        assert_eq!(single.num_ranks(), 1);
        assert_eq!(single.coords(0), Some(vec![]));
        assert_eq!(single.coords(1), None);
        assert_eq!(single.to_string(), "(single)");
    }

    #[test]
    fn extent_round_trips_through_wit() {
        let shape = extent!(hosts = 1, gpus = 4);
        let wire: wit::Extent = (&shape).into();
        assert_eq!(Extent::from(wire), shape);
        assert_eq!(shape.size("gpus"), Some(4));
        assert_eq!(shape.size("nodes"), None);
    }
}
