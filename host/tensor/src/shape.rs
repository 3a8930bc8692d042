//! Shapes: the dimensions of a tensor.
//!
//! A [`Shape`] is a list of dimension sizes, outermost first. Storage is always
//! contiguous and row-major, so the shape alone fixes where every element lives:
//! element `[i0, i1, ..]` is at offset `sum(ik * strides()[k])`.
//!
//! - A rank-0 shape (`[]`) holds one element (a scalar).
//! - A dimension of size 0 is allowed; the tensor then has no elements.
//! - [`Shape::new`] refuses shapes whose element count overflows `usize`.

use std::fmt;

use crate::DType;
use crate::error::{Error, Result};

/// The dimensions of a tensor, outermost first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: Vec<usize>,
    numel: usize,
}

impl Shape {
    /// A shape with these dimensions. Fails if the element count overflows `usize`.
    pub fn new(dims: &[usize]) -> Result<Shape> {
        let numel = dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::ShapeOverflow {
                dims: dims.to_vec(),
            })?;
        Ok(Shape {
            dims: dims.to_vec(),
            numel,
        })
    }

    /// The rank-0 shape of a scalar.
    pub fn scalar() -> Shape {
        Shape {
            dims: Vec::new(),
            numel: 1,
        }
    }

    /// The dimension sizes, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The number of elements (1 for a scalar, 0 if any dimension is 0).
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// The size of dimension `dim`, or [`Error::DimOutOfRange`].
    pub fn dim(&self, dim: usize) -> Result<usize> {
        self.check_dim("dim", dim)?;
        Ok(self.dims[dim])
    }

    /// Element strides of contiguous row-major storage: the last dimension has
    /// stride 1, and each other dimension the product of the sizes after it.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1usize; self.dims.len()];
        for k in (0..self.dims.len().saturating_sub(1)).rev() {
            // Cannot overflow: the product of all dims fits (checked in `new`)
            // unless some later dim is 0, and then saturating is harmless.
            strides[k] = strides[k + 1].saturating_mul(self.dims[k + 1]);
        }
        strides
    }

    /// Bytes needed to hold this shape's elements of `dtype`.
    pub fn byte_len(&self, dtype: DType) -> Result<usize> {
        self.numel
            .checked_mul(dtype.size_of())
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| Error::ShapeOverflow {
                dims: self.dims.clone(),
            })
    }

    pub(crate) fn check_dim(&self, op: &'static str, dim: usize) -> Result<()> {
        if dim < self.dims.len() {
            Ok(())
        } else {
            Err(Error::DimOutOfRange {
                op,
                dim,
                rank: self.dims.len(),
            })
        }
    }

    /// `(outer, size, inner)`: the product of the dims before `dim`, the size of
    /// `dim`, and the product of the dims after it. Every layout operation along
    /// one dimension sees the tensor as `[outer, size, inner]`. `dim` must be valid.
    pub(crate) fn split_at_dim(&self, dim: usize) -> (usize, usize, usize) {
        let outer = self.dims[..dim].iter().product();
        let inner = self.dims[dim + 1..].iter().product();
        (outer, self.dims[dim], inner)
    }

    /// This shape with dimension `dim` set to `size`. `dim` must be valid.
    pub(crate) fn with_dim(&self, dim: usize, size: usize) -> Result<Shape> {
        let mut dims = self.dims.clone();
        dims[dim] = size;
        Shape::new(&dims)
    }

    /// This shape without dimension `dim`. `dim` must be valid.
    pub(crate) fn without_dim(&self, dim: usize) -> Shape {
        let mut dims = self.dims.clone();
        dims.remove(dim);
        let numel = dims.iter().product();
        Shape { dims, numel }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numel_strides_display() {
        let s = Shape::new(&[2, 3, 4]).unwrap();
        assert_eq!(s.rank(), 3);
        assert_eq!(s.numel(), 24);
        assert_eq!(s.strides(), vec![12, 4, 1]);
        assert_eq!(s.to_string(), "[2, 3, 4]");
        assert_eq!(s.dim(1).unwrap(), 3);
        assert_eq!(s.byte_len(DType::F64).unwrap(), 192);
        assert_eq!(s.split_at_dim(1), (2, 3, 4));
        assert_eq!(s.split_at_dim(0), (1, 2, 12));
        assert_eq!(s.split_at_dim(2), (6, 4, 1));
    }

    #[test]
    fn scalar_and_empty_shapes() {
        let s = Shape::scalar();
        assert_eq!(s.numel(), 1);
        assert_eq!(s.rank(), 0);
        assert_eq!(s.strides(), Vec::<usize>::new());
        assert_eq!(s, Shape::new(&[]).unwrap());
        assert_eq!(s.to_string(), "[]");
        let e = Shape::new(&[3, 0, 2]).unwrap();
        assert_eq!(e.numel(), 0);
        assert_eq!(e.strides(), vec![0, 2, 1]);
    }

    #[test]
    fn overflow_and_bad_dim_are_errors() {
        let err = Shape::new(&[usize::MAX, 2]).unwrap_err();
        assert!(matches!(err, Error::ShapeOverflow { .. }));
        let big = Shape::new(&[usize::MAX / 4]).unwrap();
        assert!(matches!(
            big.byte_len(DType::F64),
            Err(Error::ShapeOverflow { .. })
        ));
        let s = Shape::new(&[2, 3]).unwrap();
        assert_eq!(
            s.dim(2).unwrap_err(),
            Error::DimOutOfRange {
                op: "dim",
                dim: 2,
                rank: 2
            }
        );
    }
}
