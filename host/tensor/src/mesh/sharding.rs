//! How a global tensor is laid out over the ranks of a mesh, and what
//! each operation does to that layout.
//!
//! A mesh's **extent** is named dimensions, outermost first; ranks are
//! row-major, so rank `r` has one coordinate per mesh dimension
//! ([`MeshShape::coords`]). A [`Sharding`] says what each rank holds of a
//! global tensor:
//!
//! - [`Sharding::Replicate`]: every rank holds the whole tensor.
//! - [`Sharding::Shard`]: the tensor is split along `tensor_dim` into
//!   `extent[mesh_dim]` contiguous blocks; the rank at coordinate `c` of
//!   `mesh_dim` holds block `c` ([`block`]: a dimension of size `n` split
//!   `k` ways gives the first `n % k` blocks `n / k + 1` elements and the
//!   rest `n / k`). Ranks that differ only in other mesh dimensions hold
//!   the same block.
//! - [`Sharding::Partial`]: every rank holds a tensor of the global shape,
//!   and the global tensor is the **sum** over `mesh_dim` of those: what a
//!   local matmul or sum over a sharded dimension leaves behind, until an
//!   all-reduce over `mesh_dim` makes it [`Sharding::Replicate`].
//!
//! The `*_meta` functions are the controller's side of every operation:
//! they compute the output's global shape and sharding, or say why the
//! operands cannot be combined; the workers only ever see local shards.

use std::fmt;

use crate::{DType, Device};

/// How a tensor is laid out over a mesh; see the module docs.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub enum Sharding {
    /// Every rank holds the whole tensor.
    Replicate,
    /// Split along `tensor_dim` over the ranks of mesh dimension `mesh_dim`.
    Shard {
        /// The mesh dimension (an index into the extent).
        mesh_dim: usize,
        /// The tensor dimension that is split.
        tensor_dim: usize,
    },
    /// The global tensor is the sum over `mesh_dim` of the ranks' tensors.
    Partial {
        /// The mesh dimension summed over.
        mesh_dim: usize,
    },
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sharding::Replicate => f.write_str("replicate"),
            Sharding::Shard {
                mesh_dim,
                tensor_dim,
            } => write!(f, "shard(mesh dim {mesh_dim}, tensor dim {tensor_dim})"),
            Sharding::Partial { mesh_dim } => write!(f, "partial(mesh dim {mesh_dim})"),
        }
    }
}

/// Block `index` of a dimension of size `n` split `parts` ways, as
/// `(start, len)`: contiguous blocks in order, the first `n % parts` one
/// element longer than the rest.
pub fn block(n: usize, parts: usize, index: usize) -> (usize, usize) {
    let parts = parts.max(1);
    let (base, extra) = (n / parts, n % parts);
    let start = index * base + index.min(extra);
    (start, base + usize::from(index < extra))
}

/// The sizes of a mesh's dimensions, and its row-major ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshShape {
    sizes: Vec<usize>,
}

impl MeshShape {
    /// A mesh of these dimension sizes.
    pub fn new(sizes: Vec<usize>) -> MeshShape {
        MeshShape { sizes }
    }

    /// The sizes of an extent's dimensions.
    pub fn of_extent(extent: &[(String, u32)]) -> MeshShape {
        MeshShape::new(extent.iter().map(|(_, n)| *n as usize).collect())
    }

    /// The dimension sizes.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Whether the mesh has no ranks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The coordinates of `rank`, one per dimension (row-major).
    pub fn coords(&self, rank: usize) -> Vec<usize> {
        let mut coords = vec![0; self.sizes.len()];
        let mut rest = rank;
        for (coord, &size) in coords.iter_mut().zip(&self.sizes).rev() {
            let size = size.max(1);
            *coord = rest % size;
            rest /= size;
        }
        coords
    }

    /// The rank at `coords`.
    pub fn rank(&self, coords: &[usize]) -> usize {
        coords
            .iter()
            .zip(&self.sizes)
            .fold(0, |rank, (&c, &size)| rank * size + c)
    }

    /// The groups of ranks that differ only in `mesh_dim`, each in the
    /// order of that coordinate; the groups in rank order of their first.
    pub fn groups(&self, mesh_dim: usize) -> Vec<Vec<usize>> {
        let Some(&size) = self.sizes.get(mesh_dim) else {
            return Vec::new();
        };
        (0..self.len())
            .filter(|&rank| self.coords(rank)[mesh_dim] == 0)
            .map(|first| {
                let mut coords = self.coords(first);
                (0..size)
                    .map(|c| {
                        coords[mesh_dim] = c;
                        self.rank(&coords)
                    })
                    .collect()
            })
            .collect()
    }

    /// Checks that `sharding` names dimensions of this mesh and of a
    /// tensor of rank `tensor_rank`.
    pub fn check(&self, sharding: Sharding, tensor_rank: usize) -> Result<(), String> {
        let mesh_dims = self.sizes.len();
        match sharding {
            Sharding::Replicate => Ok(()),
            Sharding::Shard {
                mesh_dim,
                tensor_dim,
            } => {
                if mesh_dim >= mesh_dims {
                    Err(format!(
                        "{sharding}: mesh dim {mesh_dim} does not exist; the mesh's dimensions are 0..{mesh_dims}"
                    ))
                } else if tensor_dim >= tensor_rank {
                    Err(format!(
                        "{sharding}: the tensor has rank {tensor_rank}; shard one of its dimensions 0..{tensor_rank}"
                    ))
                } else {
                    Ok(())
                }
            }
            Sharding::Partial { mesh_dim } if mesh_dim >= mesh_dims => Err(format!(
                "{sharding}: mesh dim {mesh_dim} does not exist; the mesh's dimensions are 0..{mesh_dims}"
            )),
            Sharding::Partial { .. } => Ok(()),
        }
    }

    /// The part of dimension `tensor_dim` that `rank` holds, as
    /// `(start, len)`, for a sharded tensor; `None` when the sharding
    /// splits no dimension.
    pub fn shard_range(
        &self,
        dims: &[usize],
        sharding: Sharding,
        rank: usize,
    ) -> Option<(usize, usize)> {
        let Sharding::Shard {
            mesh_dim,
            tensor_dim,
        } = sharding
        else {
            return None;
        };
        let parts = *self.sizes.get(mesh_dim)?;
        let n = *dims.get(tensor_dim)?;
        Some(block(n, parts, self.coords(rank)[mesh_dim]))
    }

    /// The dimensions of the shard `rank` holds of a tensor of global
    /// `dims` (checked with [`MeshShape::check`] first).
    pub fn local_dims(&self, dims: &[usize], sharding: Sharding, rank: usize) -> Vec<usize> {
        let mut local = dims.to_vec();
        if let (Sharding::Shard { tensor_dim, .. }, Some((_, len))) =
            (sharding, self.shard_range(dims, sharding, rank))
        {
            local[tensor_dim] = len;
        }
        local
    }
}

/// What the controller knows of a tensor: its global shape, element type,
/// device and layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// The global dimensions.
    pub dims: Vec<usize>,
    /// The element type.
    pub dtype: DType,
    /// The device of every shard.
    pub device: Device,
    /// The layout over the mesh.
    pub sharding: Sharding,
}

fn same_kind(op: &str, a: &Meta, b: &Meta) -> Result<(), String> {
    if a.dtype != b.dtype {
        return Err(format!(
            "{op}: dtypes differ ({} vs {}); convert one operand first",
            a.dtype, b.dtype
        ));
    }
    if a.device != b.device {
        return Err(format!(
            "{op}: operands are on different devices ({} vs {})",
            a.device, b.device
        ));
    }
    Ok(())
}

fn same_layout(op: &str, a: &Meta, b: &Meta) -> Result<(), String> {
    same_kind(op, a, b)?;
    if a.dims != b.dims {
        return Err(format!(
            "{op}: shapes differ ({:?} vs {:?}); elementwise operations need equal shapes",
            a.dims, b.dims
        ));
    }
    if a.sharding != b.sharding {
        return Err(format!(
            "{op}: shardings differ ({} vs {}); elementwise operations need equal shardings",
            a.sharding, b.sharding
        ));
    }
    Ok(())
}

fn not_partial(op: &str, a: &Meta, why: &str) -> Result<(), String> {
    match a.sharding {
        Sharding::Partial { mesh_dim } => Err(format!(
            "{op} of a partial sum is not {why}; all-reduce it over mesh dim {mesh_dim} first"
        )),
        _ => Ok(()),
    }
}

/// An elementwise `a op b`: equal shapes, dtypes, devices and shardings;
/// of partial sums only `add` and `sub` (the sum of the parts' sums).
pub fn binary_meta(op: &str, linear: bool, a: &Meta, b: &Meta) -> Result<Meta, String> {
    same_layout(op, a, b)?;
    if !linear {
        not_partial(op, a, "the partial sum of the result")?;
    }
    Ok(a.clone())
}

/// An elementwise `a op scalar` or `op(a)`: the layout is kept; of a
/// partial sum only linear operations (`mul`, `div` by a scalar, `neg`).
pub fn elementwise_meta(op: &str, linear: bool, a: &Meta) -> Result<Meta, String> {
    if !linear {
        not_partial(op, a, "the partial sum of the result")?;
    }
    Ok(a.clone())
}

/// `a` (`[m, k]`) times `b` (`[k, n]`). Local shards multiply to the
/// right thing only for these layouts (`m` the mesh dimension):
///
/// | a | b | result |
/// | --- | --- | --- |
/// | replicate | replicate | replicate |
/// | shard(m, 0) (rows) | replicate | shard(m, 0) |
/// | replicate | shard(m, 1) (columns) | shard(m, 1) |
/// | shard(m, 1) | shard(m, 0) (the inner dimension, split alike) | partial(m) |
/// | partial(m) | replicate | partial(m) |
/// | replicate | partial(m) | partial(m) |
pub fn matmul_meta(a: &Meta, b: &Meta) -> Result<Meta, String> {
    const OP: &str = "matmul";
    same_kind(OP, a, b)?;
    let (&[m, k], &[k2, n]) = (a.dims.as_slice(), b.dims.as_slice()) else {
        return Err(format!(
            "{OP} needs two 2-D tensors, got {:?} x {:?}",
            a.dims, b.dims
        ));
    };
    if k != k2 {
        return Err(format!(
            "{OP}: inner dimensions differ ({:?} x {:?}); need [m, k] x [k, n]",
            a.dims, b.dims
        ));
    }
    use Sharding::{Partial, Replicate, Shard};
    let sharding = match (a.sharding, b.sharding) {
        (Replicate, Replicate) => Replicate,
        (
            Shard {
                mesh_dim,
                tensor_dim: 0,
            },
            Replicate,
        ) => Shard {
            mesh_dim,
            tensor_dim: 0,
        },
        (
            Replicate,
            Shard {
                mesh_dim,
                tensor_dim: 1,
            },
        ) => Shard {
            mesh_dim,
            tensor_dim: 1,
        },
        (
            Shard {
                mesh_dim: ma,
                tensor_dim: 1,
            },
            Shard {
                mesh_dim: mb,
                tensor_dim: 0,
            },
        ) if ma == mb => Partial { mesh_dim: ma },
        (Partial { mesh_dim }, Replicate) | (Replicate, Partial { mesh_dim }) => {
            Partial { mesh_dim }
        }
        (sa, sb) => {
            return Err(format!(
                "{OP}: {sa} x {sb} does not multiply shard by shard; valid layouts: \
                 replicate x replicate, shard(m, 0) x replicate, replicate x shard(m, 1), \
                 shard(m, 1) x shard(m, 0) (gives partial(m)), partial(m) x replicate, \
                 replicate x partial(m)"
            ));
        }
    };
    Ok(Meta {
        dims: vec![m, n],
        dtype: a.dtype,
        device: a.device,
        sharding,
    })
}

/// The transpose of a 2-D tensor: a split dimension moves with it.
pub fn transpose_meta(a: &Meta) -> Result<Meta, String> {
    let &[r, c] = a.dims.as_slice() else {
        return Err(format!("transpose needs a 2-D tensor, got {:?}", a.dims));
    };
    let sharding = match a.sharding {
        Sharding::Shard {
            mesh_dim,
            tensor_dim,
        } => Sharding::Shard {
            mesh_dim,
            tensor_dim: 1 - tensor_dim,
        },
        other => other,
    };
    Ok(Meta {
        dims: vec![c, r],
        sharding,
        ..a.clone()
    })
}

/// A local sum, of everything (`dim` `None`, a rank-0 result) or along
/// `dim` (removed). Summing over the split dimension leaves partial sums.
pub fn sum_meta(a: &Meta, dim: Option<usize>) -> Result<Meta, String> {
    let (dims, sharding) = match dim {
        None => {
            let sharding = match a.sharding {
                Sharding::Shard { mesh_dim, .. } => Sharding::Partial { mesh_dim },
                other => other,
            };
            (Vec::new(), sharding)
        }
        Some(d) => {
            if d >= a.dims.len() {
                return Err(format!(
                    "sum: dimension {d} is out of range for a tensor of rank {}",
                    a.dims.len()
                ));
            }
            let mut dims = a.dims.clone();
            dims.remove(d);
            let sharding = match a.sharding {
                Sharding::Shard {
                    mesh_dim,
                    tensor_dim,
                } if tensor_dim == d => Sharding::Partial { mesh_dim },
                Sharding::Shard {
                    mesh_dim,
                    tensor_dim,
                } if tensor_dim > d => Sharding::Shard {
                    mesh_dim,
                    tensor_dim: tensor_dim - 1,
                },
                other => other,
            };
            (dims, sharding)
        }
    };
    Ok(Meta {
        dims,
        sharding,
        ..a.clone()
    })
}

/// `y += alpha * x` and `dst := src`: equal shapes, dtypes, devices and
/// shardings (partial sums included: both are linear).
pub fn in_place_meta(op: &str, y: &Meta, x: &Meta) -> Result<Meta, String> {
    same_layout(op, y, x)?;
    Ok(y.clone())
}

/// The layout after an all-reduce (a sum) over `mesh_dim`: partial sums
/// over it become the replicated total; replicas stay replicas (each now
/// the sum of the group's copies); a tensor split over `mesh_dim` cannot
/// be summed, its blocks being different parts.
pub fn all_reduce_meta(a: &Meta, mesh_dim: usize, mesh: &MeshShape) -> Result<Meta, String> {
    let dims = mesh.sizes().len();
    if mesh_dim >= dims {
        return Err(format!(
            "all_reduce: mesh dim {mesh_dim} does not exist; the mesh's dimensions are 0..{dims}"
        ));
    }
    let sharding = match a.sharding {
        Sharding::Partial { mesh_dim: m } if m == mesh_dim => Sharding::Replicate,
        Sharding::Shard { mesh_dim: m, .. } if m == mesh_dim => {
            return Err(format!(
                "all_reduce: the tensor is {}; its blocks over mesh dim {mesh_dim} are different parts, not summands",
                a.sharding
            ));
        }
        other => other,
    };
    Ok(Meta {
        sharding,
        ..a.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_contiguous_and_the_first_take_the_remainder() {
        let blocks: Vec<_> = (0..4).map(|i| block(10, 4, i)).collect();
        assert_eq!(blocks, vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
        let blocks: Vec<_> = (0..3).map(|i| block(2, 3, i)).collect();
        assert_eq!(blocks, vec![(0, 1), (1, 1), (2, 0)]);
        for n in 0..30 {
            for k in 1..7 {
                let mut at = 0;
                for i in 0..k {
                    let (start, len) = block(n, k, i);
                    assert_eq!(start, at);
                    at += len;
                }
                assert_eq!(at, n);
            }
        }
    }

    #[test]
    fn coordinates_are_row_major_and_groups_vary_one_dimension() {
        let mesh = MeshShape::new(vec![2, 3]);
        assert_eq!(mesh.coords(4), vec![1, 1]);
        assert_eq!(mesh.rank(&[1, 2]), 5);
        for r in 0..6 {
            assert_eq!(mesh.rank(&mesh.coords(r)), r);
        }
        assert_eq!(mesh.groups(0), vec![vec![0, 3], vec![1, 4], vec![2, 5]]);
        assert_eq!(mesh.groups(1), vec![vec![0, 1, 2], vec![3, 4, 5]]);
        assert!(mesh.groups(2).is_empty());
    }

    #[test]
    fn local_dims_follow_the_sharding() {
        let mesh = MeshShape::new(vec![2, 2]);
        let split_rows = Sharding::Shard {
            mesh_dim: 1,
            tensor_dim: 0,
        };
        assert_eq!(mesh.local_dims(&[5, 3], split_rows, 0), vec![3, 3]);
        assert_eq!(mesh.local_dims(&[5, 3], split_rows, 1), vec![2, 3]);
        assert_eq!(mesh.local_dims(&[5, 3], split_rows, 2), vec![3, 3]);
        assert_eq!(mesh.local_dims(&[5, 3], Sharding::Replicate, 3), vec![5, 3]);
        assert!(mesh.check(split_rows, 2).is_ok());
        assert!(mesh.check(split_rows, 0).is_err());
        assert!(mesh.check(Sharding::Partial { mesh_dim: 2 }, 1).is_err());
    }

    fn meta(dims: &[usize], sharding: Sharding) -> Meta {
        Meta {
            dims: dims.to_vec(),
            dtype: DType::F32,
            device: Device::Cpu,
            sharding,
        }
    }

    #[test]
    fn the_gradient_of_a_row_sharded_regression_is_a_partial_sum() {
        let rows = Sharding::Shard {
            mesh_dim: 0,
            tensor_dim: 0,
        };
        let x = meta(&[256, 8], rows);
        let w = meta(&[8, 1], Sharding::Replicate);
        let xw = matmul_meta(&x, &w).unwrap();
        assert_eq!(xw.sharding, rows);
        let xt = transpose_meta(&x).unwrap();
        let g = matmul_meta(&xt, &xw).unwrap();
        assert_eq!(g.dims, vec![8, 1]);
        assert_eq!(g.sharding, Sharding::Partial { mesh_dim: 0 });
        let mesh = MeshShape::new(vec![4]);
        assert_eq!(
            all_reduce_meta(&g, 0, &mesh).unwrap().sharding,
            Sharding::Replicate
        );
        assert!(all_reduce_meta(&x, 0, &mesh).is_err());
        // A partial sum cannot be squared, nor multiplied by a replica's
        // layout-mismatched operand.
        assert!(binary_meta("mul", false, &g, &g).is_err());
        assert!(binary_meta("add", true, &g, &g).is_ok());
        assert!(matmul_meta(&x, &x).is_err());
        let loss = sum_meta(&xw, None).unwrap();
        assert_eq!(loss.sharding, Sharding::Partial { mesh_dim: 0 });
        assert_eq!(
            sum_meta(&xw, Some(1)).unwrap().sharding,
            rows,
            "summing another dimension keeps the split"
        );
    }
}
