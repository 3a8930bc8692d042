//! Shapes of meshes: named dimensions, slices of ranks and selections.
//!
//! # Concepts
//!
//! An **extent** names the dimensions of a mesh, outermost first, with their
//! sizes: `hosts=2,gpus=4` is 2 hosts with 4 GPUs each, 8 points in all.
//! Points are numbered by **rank** in row-major order: the last dimension
//! varies fastest, so the point `[h, g]` has rank `h * 4 + g`.
//!
//! A **slice** maps the points of a (part of a) mesh to ranks of the base
//! mesh with an offset, sizes and strides: the point `p` has the rank
//! `offset + Σ p[i] * strides[i]`. The whole mesh above is the slice with
//! offset 0, sizes `[2, 4]` and strides `[4, 1]`.
//!
//! A **shape** is a slice whose dimensions carry the extent's names. Slicing
//! a shape along a named dimension narrows it:
//! - an **index** picks one coordinate and drops the dimension: `gpus` index 2
//!   of `hosts=2,gpus=4` leaves `hosts=2` with ranks `[2, 6]`;
//! - a **range** keeps the dimension with the chosen coordinates: `gpus`
//!   range `1..4` step 2 leaves `hosts=2,gpus=2` with ranks `[1, 3, 5, 7]`.
//!
//! The ranks stay those of the base mesh, so a sliced shape still names the
//! same procs. A shape with every dimension dropped is a single point.
//!
//! A **selection** ([`Selection`]) chooses points of a shape without
//! changing it, e.g. the destinations of a cast: all of them, the first,
//! a range along one dimension, or a union of selections.
//!
//! # Invariants
//!
//! - SH-1: [`Extent::new`] accepts only a non-empty list of dimensions with
//!   sizes of at least 1 and distinct names that are non-empty and free of
//!   `,`, `=` and whitespace; its number of points fits in `usize`.
//! - SH-2: ranks are row-major: `rank_of(point_of(r)) == r` for every rank
//!   below `len()`, and `point_of(r)` is `None` from `len()` on.
//! - SH-3: the text form round-trips: parsing an extent's `Display` gives it
//!   back; a bare number `n` parses as `procs=n`.
//! - SH-4: a [`Slice`] never maps two points to one rank ([`Slice::new`]
//!   refuses overlapping strides), so `location` and `coordinates` are
//!   inverse, and `contains`/`index_of` agree with `iter`.
//! - SH-5: selecting an index drops the dimension; a range keeps it with
//!   `ceil((min(end, size) - start) / step)` coordinates; a bad selector is
//!   an error naming the dimension and its size.
//! - SH-6: the ranks of a selected shape are a subset of its parent's, in
//!   increasing order, as many as the product of the new sizes.
//! - SH-7: selections on different dimensions commute; `select_many`
//!   applies each once and refuses a dimension named twice.
//! - SH-8: [`Selection::eval`] returns base ranks of the shape, sorted and
//!   without duplicates; a union containing `All` selects all.
//! - SH-9: a shape with every dimension dropped has 0 dimensions and 1 point.
//!
//! Values received in messages are not re-checked; methods on a malformed
//! one never panic, but their answers are meaningless.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The name of the one dimension of an extent written as a bare number
/// (`8` reads as `procs=8`).
pub const DEFAULT_DIM: &str = "procs";

/// What is wrong with an extent, slice, shape or selection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// An extent was declared with no dimensions.
    #[error("an extent needs at least one dimension")]
    NoDimensions,
    /// A dimension name is empty or holds `,`, `=` or whitespace.
    #[error("invalid dimension name `{0}`: names must be non-empty, without `,`, `=` or spaces")]
    InvalidName(String),
    /// Two dimensions of an extent have this name.
    #[error("dimension `{0}` appears twice")]
    DuplicateDimension(String),
    /// The named dimension has size 0.
    #[error("dimension `{0}` has size 0; sizes must be at least 1")]
    ZeroSize(String),
    /// The number of points or the largest rank does not fit in `usize`.
    #[error("the shape is too large: its points or ranks do not fit in usize")]
    Overflow,
    /// No dimension has this name.
    #[error("no dimension `{name}` (the shape has {available})")]
    UnknownDimension {
        /// The name asked for.
        name: String,
        /// The shape's names, comma-separated, or "no dimensions".
        available: String,
    },
    /// An index is not below the dimension's size.
    #[error("index {index} is outside `{name}` (size {size})")]
    IndexOutOfRange {
        /// The dimension.
        name: String,
        /// The index asked for.
        index: usize,
        /// The dimension's size: valid indices are `0..size`.
        size: usize,
    },
    /// A range with step 0 or no coordinate of the dimension.
    #[error(
        "range {start}..{end} step {step} selects nothing in `{name}` (size {size}): \
         the start must be below {size} and the end, the step at least 1"
    )]
    BadRange {
        /// The dimension.
        name: String,
        /// The range's start.
        start: usize,
        /// The range's end, as given.
        end: usize,
        /// The range's step.
        step: usize,
        /// The dimension's size.
        size: usize,
    },
    /// `select_many` names this dimension twice.
    #[error("dimension `{0}` is selected twice")]
    SelectedTwice(String),
    /// Offset, sizes and strides that do not make a slice.
    #[error("invalid slice: {0}")]
    InvalidSlice(String),
    /// A point with the wrong number of coordinates or one out of range.
    #[error("invalid point: {0}")]
    InvalidPoint(String),
    /// A rank that no point of the slice has.
    #[error("rank {rank} is not in the slice ({slice})")]
    RankNotInSlice {
        /// The rank.
        rank: usize,
        /// The slice's offset, sizes and strides.
        slice: String,
    },
    /// Text that is not an extent.
    #[error("cannot read extent `{text}`: {reason} (write e.g. `hosts=2,gpus=4` or `8`)")]
    Parse {
        /// The text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One named dimension of an extent.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Dim {
    /// The dimension's name, e.g. `hosts`.
    pub name: String,
    /// Its number of coordinates (at least 1).
    pub size: usize,
}

/// Named dimensions, outermost first, whose points are ranked row-major.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Extent {
    dims: Vec<Dim>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c == ',' || c == '=' || c.is_whitespace())
}

fn checked_product(sizes: &[usize]) -> Option<usize> {
    sizes.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s))
}

/// Row-major strides for `sizes`, saturating (callers check the product).
fn row_major_strides(sizes: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(sizes[i + 1]);
    }
    strides
}

impl Extent {
    /// An extent from `(name, size)` pairs, outermost first (SH-1).
    pub fn new<I, N>(dims: I) -> Result<Self, ShapeError>
    where
        I: IntoIterator<Item = (N, usize)>,
        N: Into<String>,
    {
        let dims: Vec<Dim> = dims
            .into_iter()
            .map(|(name, size)| Dim {
                name: name.into(),
                size,
            })
            .collect();
        if dims.is_empty() {
            return Err(ShapeError::NoDimensions);
        }
        for (i, dim) in dims.iter().enumerate() {
            if !valid_name(&dim.name) {
                return Err(ShapeError::InvalidName(dim.name.clone()));
            }
            if dims[..i].iter().any(|d| d.name == dim.name) {
                return Err(ShapeError::DuplicateDimension(dim.name.clone()));
            }
            if dim.size == 0 {
                return Err(ShapeError::ZeroSize(dim.name.clone()));
            }
        }
        let extent = Self { dims };
        checked_product(&extent.sizes()).ok_or(ShapeError::Overflow)?;
        Ok(extent)
    }

    /// The extent of a single point: no dimensions, one point. It is what
    /// [`Shape::extent`] gives once every dimension has been dropped.
    pub fn unit() -> Self {
        Self { dims: Vec::new() }
    }

    /// The number of points (the product of the sizes).
    pub fn len(&self) -> usize {
        self.dims
            .iter()
            .fold(1usize, |acc, d| acc.saturating_mul(d.size))
    }

    /// Always false: an extent has at least one point.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of dimensions.
    pub fn num_dims(&self) -> usize {
        self.dims.len()
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// The sizes, outermost first.
    pub fn sizes(&self) -> Vec<usize> {
        self.dims.iter().map(|d| d.size).collect()
    }

    /// The size of the dimension `name`, if there is one.
    pub fn size_of(&self, name: &str) -> Option<usize> {
        self.dims.iter().find(|d| d.name == name).map(|d| d.size)
    }

    /// The point (one coordinate per dimension) of a rank, or `None` when
    /// the rank is not below [`len`](Self::len).
    pub fn point_of(&self, rank: usize) -> Option<Vec<usize>> {
        if rank >= self.len() {
            return None;
        }
        let mut point = vec![0; self.dims.len()];
        let mut rest = rank;
        for (coord, dim) in point.iter_mut().zip(&self.dims).rev() {
            *coord = rest % dim.size;
            rest /= dim.size;
        }
        Some(point)
    }

    /// The rank of a point, or `None` when it has the wrong number of
    /// coordinates or one is outside its dimension.
    pub fn rank_of(&self, point: &[usize]) -> Option<usize> {
        if point.len() != self.dims.len() {
            return None;
        }
        point
            .iter()
            .zip(&self.dims)
            .try_fold(0usize, |rank, (&c, dim)| {
                (c < dim.size).then_some(())?;
                rank.checked_mul(dim.size)?.checked_add(c)
            })
    }
}

impl fmt::Display for Extent {
    /// `hosts=2,gpus=8`; the unit extent prints as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, dim) in self.dims.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}={}", dim.name, dim.size)?;
        }
        Ok(())
    }
}

impl FromStr for Extent {
    type Err = ShapeError;

    /// Reads `name=size,name=size` (spaces around parts allowed) or a bare
    /// number `n`, which is one dimension `procs=n`.
    fn from_str(text: &str) -> Result<Self, ShapeError> {
        let parse_err = |reason: String| ShapeError::Parse {
            text: text.to_string(),
            reason,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(parse_err("it is empty".into()));
        }
        if let Ok(n) = trimmed.parse::<usize>() {
            return Self::new([(DEFAULT_DIM, n)]);
        }
        let mut dims = Vec::new();
        for part in trimmed.split(',') {
            let (name, size) = part
                .split_once('=')
                .ok_or_else(|| parse_err(format!("`{}` is not name=size", part.trim())))?;
            let size = size.trim();
            let size = size
                .parse::<usize>()
                .map_err(|_| parse_err(format!("size `{size}` is not a number")))?;
            dims.push((name.trim().to_string(), size));
        }
        Self::new(dims)
    }
}

/// A map from the points of an n-dimensional box to ranks of a base mesh:
/// the point `p` has rank `offset + Σ p[i] * strides[i]`.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slice {
    offset: usize,
    sizes: Vec<usize>,
    strides: Vec<usize>,
}

impl Slice {
    /// A slice; refuses sizes and strides of different lengths, a zero size,
    /// overlapping dimensions (SH-4) and ranks past `usize::MAX`. No
    /// dimensions at all is a single point at `offset`.
    ///
    /// Dimensions must nest: taken by increasing stride (skipping those of
    /// size 1), each stride must exceed the farthest offset reached by the
    /// ones before it. Row-major layouts and all their selections do.
    pub fn new(offset: usize, sizes: Vec<usize>, strides: Vec<usize>) -> Result<Self, ShapeError> {
        let invalid = |why: String| Err(ShapeError::InvalidSlice(why));
        if sizes.len() != strides.len() {
            return invalid(format!(
                "{} sizes but {} strides",
                sizes.len(),
                strides.len()
            ));
        }
        if let Some(dim) = sizes.iter().position(|&s| s == 0) {
            return invalid(format!("dimension {dim} has size 0"));
        }
        checked_product(&sizes).ok_or(ShapeError::Overflow)?;
        let mut order: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] > 1).collect();
        order.sort_by_key(|&i| strides[i]);
        let mut span = 0usize;
        for dim in order {
            let stride = strides[dim];
            if stride <= span {
                return invalid(format!(
                    "dimension {dim} has stride {stride} but must step past {span}, the \
                     farthest offset reached by dimensions with smaller strides"
                ));
            }
            let reach = (sizes[dim] - 1).checked_mul(stride);
            span = reach
                .and_then(|r| r.checked_add(span))
                .ok_or(ShapeError::Overflow)?;
        }
        offset.checked_add(span).ok_or(ShapeError::Overflow)?;
        Ok(Self {
            offset,
            sizes,
            strides,
        })
    }

    /// The row-major slice over `sizes`: offset 0, ranks `0..product`.
    pub fn row_major(sizes: Vec<usize>) -> Result<Self, ShapeError> {
        checked_product(&sizes).ok_or(ShapeError::Overflow)?;
        let strides = row_major_strides(&sizes);
        Self::new(0, sizes, strides)
    }

    /// The rank of the point with every coordinate 0.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The sizes of the dimensions.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The strides of the dimensions.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The number of points (the product of the sizes; 1 with no dimensions).
    pub fn len(&self) -> usize {
        self.sizes
            .iter()
            .fold(1usize, |acc, &s| acc.saturating_mul(s))
    }

    /// Always false for a slice made by [`Slice::new`].
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The base rank of a point.
    pub fn location(&self, point: &[usize]) -> Result<usize, ShapeError> {
        if point.len() != self.sizes.len() {
            let (got, dims) = (point.len(), self.sizes.len());
            return Err(ShapeError::InvalidPoint(format!(
                "{got} coordinates for {dims} dimensions"
            )));
        }
        let mut rank = self.offset;
        let dims = self.sizes.iter().zip(&self.strides);
        for (dim, (&coord, (&size, &stride))) in point.iter().zip(dims).enumerate() {
            if coord >= size {
                let why = format!("coordinate {coord} is outside dimension {dim} (size {size})");
                return Err(ShapeError::InvalidPoint(why));
            }
            let step = coord.checked_mul(stride);
            rank = step
                .and_then(|s| rank.checked_add(s))
                .ok_or(ShapeError::Overflow)?;
        }
        Ok(rank)
    }

    /// The point of a base rank: the inverse of [`location`](Self::location).
    pub fn coordinates(&self, rank: usize) -> Result<Vec<usize>, ShapeError> {
        let not_in = || ShapeError::RankNotInSlice {
            rank,
            slice: format!(
                "offset {}, sizes {:?}, strides {:?}",
                self.offset, self.sizes, self.strides
            ),
        };
        let mut rest = rank.checked_sub(self.offset).ok_or_else(not_in)?;
        // By decreasing stride, each coordinate is what is left divided by
        // the stride: the smaller strides together never reach it (SH-4).
        let mut dims: Vec<(usize, usize, usize)> = (self.sizes.iter().zip(&self.strides))
            .enumerate()
            .filter(|&(_, (&size, &stride))| size > 1 && stride > 0)
            .map(|(i, (&size, &stride))| (i, size, stride))
            .collect();
        dims.sort_by_key(|&(_, _, stride)| std::cmp::Reverse(stride));
        let mut point = vec![0; self.sizes.len()];
        for (i, size, stride) in dims {
            let coord = rest / stride;
            if coord >= size {
                return Err(not_in());
            }
            point[i] = coord;
            rest -= coord * stride;
        }
        if rest != 0 {
            return Err(not_in());
        }
        Ok(point)
    }

    /// The base rank of the `index`-th point in row-major order, if any.
    pub fn get(&self, index: usize) -> Option<usize> {
        (index < self.len()).then(|| self.rank_at(index))
    }

    fn rank_at(&self, index: usize) -> usize {
        let mut rest = index;
        let mut rank = self.offset;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides).rev() {
            let size = size.max(1);
            rank = rank.saturating_add((rest % size).saturating_mul(stride));
            rest /= size;
        }
        rank
    }

    /// The base ranks of the points, in row-major order of the points.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        (0..self.len()).map(move |i| self.rank_at(i))
    }

    /// Whether some point of the slice has this base rank.
    pub fn contains(&self, rank: usize) -> bool {
        self.coordinates(rank).is_ok()
    }

    /// The position of a base rank in [`iter`](Self::iter)'s order.
    pub fn index_of(&self, rank: usize) -> Option<usize> {
        let point = self.coordinates(rank).ok()?;
        let mut dims = point.iter().zip(&self.sizes);
        dims.try_fold(0usize, |index, (&c, &size)| {
            index.checked_mul(size)?.checked_add(c)
        })
    }
}

/// How to narrow one dimension of a [`Shape`].
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Selector {
    /// One coordinate; the dimension is dropped.
    Index(usize),
    /// Coordinates `start, start + step, …` below `end`; the dimension is kept.
    Range {
        /// First coordinate.
        start: usize,
        /// Exclusive end; clamped to the dimension's size.
        end: usize,
        /// Distance between coordinates (at least 1).
        step: usize,
    },
}

impl Selector {
    /// The range `start..end` with step 1.
    pub fn range(start: usize, end: usize) -> Self {
        Selector::Range {
            start,
            end,
            step: 1,
        }
    }
}

/// Named dimensions over a [`Slice`] of base ranks.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    labels: Vec<String>,
    slice: Slice,
}

impl Shape {
    /// The whole mesh of an extent: ranks `0..extent.len()`, row-major.
    pub fn new(extent: &Extent) -> Self {
        let sizes = extent.sizes();
        let strides = row_major_strides(&sizes);
        let labels = extent.dims().iter().map(|d| d.name.clone()).collect();
        Shape {
            labels,
            slice: Slice {
                offset: 0,
                sizes,
                strides,
            },
        }
    }

    /// The dimension names, outermost first.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The slice mapping the shape's points to base ranks.
    pub fn slice(&self) -> &Slice {
        &self.slice
    }

    /// The shape's own extent: its labels with the slice's sizes
    /// ([`Extent::unit`] when every dimension has been dropped).
    pub fn extent(&self) -> Extent {
        let dims = self.labels.iter().zip(&self.slice.sizes);
        Extent {
            dims: dims
                .map(|(name, &size)| Dim {
                    name: name.clone(),
                    size,
                })
                .collect(),
        }
    }

    /// The number of dimensions.
    pub fn num_dims(&self) -> usize {
        self.labels.len()
    }

    /// The number of points.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Always false: a shape has at least one point.
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// The size of the dimension `name`, if there is one.
    pub fn size_of(&self, name: &str) -> Option<usize> {
        let i = self.labels.iter().position(|l| l == name)?;
        self.slice.sizes.get(i).copied()
    }

    /// The base ranks of the shape's points, in row-major order of the points.
    pub fn ranks(&self) -> Vec<usize> {
        self.slice.iter().collect()
    }

    /// Position, size and stride of the dimension `name`.
    fn dim(&self, name: &str) -> Result<(usize, usize, usize), ShapeError> {
        let i = self.labels.iter().position(|l| l == name);
        let found =
            i.and_then(|i| Some((i, *self.slice.sizes.get(i)?, *self.slice.strides.get(i)?)));
        found.ok_or_else(|| ShapeError::UnknownDimension {
            name: name.to_string(),
            available: match self.labels.is_empty() {
                true => "no dimensions".into(),
                false => self.labels.join(", "),
            },
        })
    }

    /// Narrows the dimension `name` (SH-5): an index drops it, a range keeps it.
    pub fn select(&self, name: &str, selector: Selector) -> Result<Shape, ShapeError> {
        let (i, size, stride) = self.dim(name)?;
        let mut out = self.clone();
        match selector {
            Selector::Index(index) => {
                if index >= size {
                    return Err(ShapeError::IndexOutOfRange {
                        name: name.into(),
                        index,
                        size,
                    });
                }
                out.slice.offset = out
                    .slice
                    .offset
                    .saturating_add(index.saturating_mul(stride));
                out.labels.remove(i);
                out.slice.sizes.remove(i);
                out.slice.strides.remove(i);
            }
            Selector::Range { start, end, step } => {
                if step == 0 || start >= end.min(size) {
                    let name = name.into();
                    return Err(ShapeError::BadRange {
                        name,
                        start,
                        end,
                        step,
                        size,
                    });
                }
                let count = (end.min(size) - start).div_ceil(step);
                out.slice.offset = out
                    .slice
                    .offset
                    .saturating_add(start.saturating_mul(stride));
                out.slice.sizes[i] = count;
                if count > 1 {
                    out.slice.strides[i] = stride.saturating_mul(step);
                }
            }
        }
        Ok(out)
    }

    /// Applies each `(name, selector)` in turn; a name given twice is an
    /// error (SH-7).
    pub fn select_many<S>(&self, selections: &[(S, Selector)]) -> Result<Shape, ShapeError>
    where
        S: AsRef<str>,
    {
        for (i, (name, _)) in selections.iter().enumerate() {
            let name = name.as_ref();
            if selections[..i]
                .iter()
                .any(|(other, _)| other.as_ref() == name)
            {
                return Err(ShapeError::SelectedTwice(name.to_string()));
            }
        }
        let mut shape = self.clone();
        for (name, selector) in selections {
            shape = shape.select(name.as_ref(), *selector)?;
        }
        Ok(shape)
    }
}

/// A choice of points of a shape, e.g. the destinations of a cast;
/// [`eval`](Selection::eval) turns it into base ranks.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
// `Union` holds selections: its field omits the derived (recursive) bounds,
// and these state what its `Vec` needs instead.
#[rkyv(serialize_bounds(
    __S: rkyv::ser::Writer + rkyv::ser::Allocator,
    __S::Error: rkyv::rancor::Source,
))]
#[rkyv(deserialize_bounds(__D::Error: rkyv::rancor::Source))]
#[rkyv(bytecheck(bounds(__C: rkyv::validation::ArchiveContext)))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Selection {
    /// Every point.
    All,
    /// The first point: every coordinate 0, which has the lowest rank.
    First,
    /// The points whose coordinate on `dim` is in the range; checked as
    /// [`Selector::Range`] (end clamped; unknown dim, empty or step 0: error).
    Range {
        /// The dimension's name.
        dim: String,
        /// First coordinate.
        start: usize,
        /// Exclusive end, clamped to the size.
        end: usize,
        /// Distance between coordinates (at least 1).
        step: usize,
    },
    /// The points chosen by any of these; an empty union chooses nothing.
    Union(#[rkyv(omit_bounds)] Vec<Selection>),
}

impl Selection {
    /// The points whose coordinate on `dim` is in `start..end` (step 1).
    pub fn range(dim: impl Into<String>, start: usize, end: usize) -> Self {
        Selection::Range {
            dim: dim.into(),
            start,
            end,
            step: 1,
        }
    }

    /// The selected base ranks, sorted ascending without duplicates (SH-8);
    /// any invalid part makes the whole an error.
    pub fn eval(&self, shape: &Shape) -> Result<Vec<usize>, ShapeError> {
        let mut ranks = Vec::new();
        self.collect(shape, &mut ranks)?;
        ranks.sort_unstable();
        ranks.dedup();
        Ok(ranks)
    }

    fn collect(&self, shape: &Shape, out: &mut Vec<usize>) -> Result<(), ShapeError> {
        match self {
            Selection::All => out.extend(shape.slice.iter()),
            Selection::First => out.extend(shape.slice.get(0)),
            Selection::Range {
                dim,
                start,
                end,
                step,
            } => {
                let selector = Selector::Range {
                    start: *start,
                    end: *end,
                    step: *step,
                };
                out.extend(shape.select(dim, selector)?.slice.iter());
            }
            Selection::Union(items) => {
                for item in items {
                    item.collect(shape, out)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn extent(dims: &[(&str, usize)]) -> Result<Extent, ShapeError> {
        Extent::new(dims.iter().copied())
    }

    fn hosts_gpus() -> Shape {
        Shape::new(&extent(&[("hosts", 2), ("gpus", 4)]).unwrap())
    }

    fn strided(start: usize, end: usize, step: usize) -> Selector {
        Selector::Range { start, end, step }
    }

    #[test]
    fn sh1_extent_refuses_bad_dims() {
        use ShapeError::*;
        assert_eq!(extent(&[]), Err(NoDimensions));
        assert_eq!(extent(&[("a", 0)]), Err(ZeroSize("a".into())));
        assert_eq!(
            extent(&[("a", 1), ("a", 2)]),
            Err(DuplicateDimension("a".into()))
        );
        for bad in ["", "a,b", "a=b", "a b"] {
            assert_eq!(extent(&[(bad, 1)]), Err(InvalidName(bad.into())));
        }
        assert_eq!(extent(&[("a", usize::MAX), ("b", 2)]), Err(Overflow));
        let e = extent(&[("hosts", 2), ("gpus", 4)]).unwrap();
        let got = (e.len(), e.num_dims(), e.size_of("gpus"), e.size_of("x"));
        assert_eq!(got, (8, 2, Some(4), None));
    }

    #[test]
    fn sh2_ranks_are_row_major() {
        let e = extent(&[("hosts", 2), ("gpus", 4)]).unwrap();
        assert_eq!((e.point_of(5), e.point_of(8)), (Some(vec![1, 1]), None));
        assert_eq!(e.rank_of(&[1, 3]), Some(7));
        assert_eq!((e.rank_of(&[2, 0]), e.rank_of(&[1])), (None, None));
    }

    #[test]
    fn sh3_text_form() {
        let e: Extent = " hosts = 2 , gpus=4 ".parse().unwrap();
        assert_eq!(e.to_string(), "hosts=2,gpus=4");
        assert_eq!("8".parse(), extent(&[("procs", 8)]));
        for bad in ["", "hosts", "hosts=x", "hosts=2,", "=2"] {
            assert!(bad.parse::<Extent>().is_err(), "{bad}");
        }
        let zero = ShapeError::ZeroSize("hosts".into());
        assert_eq!("hosts=0".parse::<Extent>(), Err(zero));
    }

    #[test]
    fn sh4_slice_checks_and_inverts() {
        assert!(Slice::new(0, vec![2], vec![]).is_err());
        assert!(Slice::new(0, vec![2, 0], vec![1, 1]).is_err());
        assert!(Slice::new(0, vec![2], vec![0]).is_err());
        let overlap = Slice::new(0, vec![2, 2], vec![1, 1]).unwrap_err();
        let text = "dimension 1 has stride 1 but must step past 1";
        assert!(overlap.to_string().contains(text), "{overlap}");
        let too_far = Slice::new(usize::MAX, vec![2], vec![1]);
        assert_eq!(too_far, Err(ShapeError::Overflow));
        // A transposed view: sizes [4, 2], strides [1, 4].
        let t = Slice::new(10, vec![4, 2], vec![1, 4]).unwrap();
        let ranks: Vec<usize> = t.iter().collect();
        assert_eq!(ranks, vec![10, 14, 11, 15, 12, 16, 13, 17]);
        assert_eq!(t.coordinates(15), Ok(vec![1, 1]));
        assert_eq!(t.index_of(15), Some(3));
        assert!(t.coordinates(9).is_err() && t.coordinates(18).is_err());
        let err = t.location(&[4, 0]).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid point: coordinate 4 is outside dimension 0 (size 4)"
        );
        assert!(t.location(&[0]).is_err());
        let s = Slice::row_major(vec![2, 3]).unwrap();
        assert_eq!((s.strides(), s.len()), (&[3, 1][..], 6));
        assert_eq!((s.get(5), s.get(6)), (Some(5), None));
    }

    #[test]
    fn sh5_index_drops_range_keeps() {
        let shape = hosts_gpus();
        let host1 = shape.select("hosts", Selector::Index(1)).unwrap();
        assert_eq!(host1.labels(), ["gpus".to_string()]);
        assert_eq!(host1.ranks(), vec![4, 5, 6, 7]);
        let odd = shape.select("gpus", strided(1, 4, 2)).unwrap();
        assert_eq!(odd.extent().to_string(), "hosts=2,gpus=2");
        assert_eq!(odd.ranks(), vec![1, 3, 5, 7]);
        let clamped = shape.select("gpus", Selector::range(2, 100)).unwrap();
        assert_eq!(clamped.ranks(), vec![2, 3, 6, 7]);
    }

    #[test]
    fn sh5_errors_name_the_dimension() {
        let shape = hosts_gpus();
        let err = |name, sel| shape.select(name, sel).unwrap_err().to_string();
        let index = err("gpus", Selector::Index(4));
        assert_eq!(index, "index 4 is outside `gpus` (size 4)");
        assert!(err("gpus", Selector::range(4, 6)).contains("in `gpus` (size 4)"));
        assert!(err("gpus", strided(0, 2, 0)).contains("step 0"));
        let gpus = shape.select("hosts", Selector::Index(0)).unwrap();
        let unknown = gpus.select("hosts", Selector::Index(0)).unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "no dimension `hosts` (the shape has gpus)"
        );
    }

    #[test]
    fn sh7_select_many_refuses_twice() {
        let shape = hosts_gpus();
        let twice = [("gpus", Selector::Index(0)), ("gpus", Selector::Index(1))];
        let err = ShapeError::SelectedTwice("gpus".into());
        assert_eq!(shape.select_many(&twice), Err(err));
        let both = [
            ("gpus", Selector::range(1, 3)),
            ("hosts", Selector::Index(1)),
        ];
        assert_eq!(shape.select_many(&both).unwrap().ranks(), vec![5, 6]);
    }

    #[test]
    fn sh8_selection_examples() {
        let shape = hosts_gpus().select("gpus", Selector::range(2, 4)).unwrap();
        let eval = |sel: Selection| sel.eval(&shape);
        assert_eq!(eval(Selection::All), Ok(vec![2, 3, 6, 7]));
        assert_eq!(eval(Selection::First), Ok(vec![2]));
        assert_eq!(eval(Selection::range("hosts", 1, 2)), Ok(vec![6, 7]));
        let union = vec![Selection::range("gpus", 1, 2), Selection::First];
        assert_eq!(eval(Selection::Union(union)), Ok(vec![2, 3, 7]));
        assert_eq!(eval(Selection::Union(vec![])), Ok(vec![]));
        assert!(eval(Selection::range("racks", 0, 1)).is_err());
    }

    #[test]
    fn sh9_all_dims_dropped_is_a_point() {
        let both = [("hosts", Selector::Index(1)), ("gpus", Selector::Index(2))];
        let point = hosts_gpus().select_many(&both).unwrap();
        assert_eq!((point.num_dims(), point.len()), (0, 1));
        assert_eq!(point.ranks(), vec![6]);
        assert_eq!(point.extent(), Extent::unit());
        assert_eq!(point.slice().coordinates(6), Ok(vec![]));
        assert_eq!(Selection::All.eval(&point), Ok(vec![6]));
    }

    #[test]
    fn wire_round_trips() {
        use rkyv::rancor::Error;
        let shape = hosts_gpus().select("gpus", Selector::range(1, 3)).unwrap();
        let inner = Selection::Union(vec![Selection::range("gpus", 0, 1)]);
        let sel = Selection::Union(vec![Selection::First, inner]);
        let json = serde_json::to_string(&(&shape, &sel)).unwrap();
        let back: (Shape, Selection) = serde_json::from_str(&json).unwrap();
        assert_eq!(back, (shape.clone(), sel.clone()));
        let bytes = rkyv::to_bytes::<Error>(&shape).unwrap();
        assert_eq!(rkyv::from_bytes::<Shape, Error>(&bytes).ok(), Some(shape));
        let bytes = rkyv::to_bytes::<Error>(&sel).unwrap();
        assert_eq!(rkyv::from_bytes::<Selection, Error>(&bytes).ok(), Some(sel));
    }

    /// Extents of `min_dims..=4` dimensions `d0, d1, …` of sizes 1 to 6.
    fn extent_strategy(min_dims: usize) -> impl Strategy<Value = Extent> {
        prop::collection::vec(1usize..=6, min_dims..=4).prop_map(|sizes| {
            Extent::new(sizes.iter().enumerate().map(|(i, &s)| (format!("d{i}"), s))).unwrap()
        })
    }

    /// Raw numbers, turned into a valid selector for a dimension by `selector_for`.
    type RawSelector = (bool, usize, usize, usize);

    fn raw_selector() -> impl Strategy<Value = RawSelector> {
        (any::<bool>(), 0usize..64, 0usize..64, 1usize..4)
    }

    fn selector_for(size: usize, (index, a, b, step): RawSelector) -> Selector {
        let start = a % size;
        match index {
            true => Selector::Index(start),
            false => Selector::Range {
                start,
                end: start + 1 + b % (size - start + 1),
                step,
            },
        }
    }

    /// The whole shape of `extent`, with some dimensions narrowed at random.
    fn sliced(extent: &Extent, raws: &[(bool, RawSelector)]) -> Shape {
        let mut shape = Shape::new(extent);
        for (dim, (apply, raw)) in extent.dims().iter().zip(raws) {
            if *apply {
                shape = shape
                    .select(&dim.name, selector_for(dim.size, *raw))
                    .unwrap();
            }
        }
        shape
    }

    fn raws() -> impl Strategy<Value = Vec<(bool, RawSelector)>> {
        prop::collection::vec((any::<bool>(), raw_selector()), 4)
    }

    fn selection_strategy() -> impl Strategy<Value = Selection> {
        let range =
            (0usize..5, 0usize..7, 0usize..8, 0usize..3).prop_map(|(d, start, end, step)| {
                Selection::Range {
                    dim: format!("d{d}"),
                    start,
                    end,
                    step,
                }
            });
        let leaf = prop_oneof![Just(Selection::All), Just(Selection::First), range];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop::collection::vec(inner, 0..4).prop_map(Selection::Union)
        })
    }

    proptest! {
        #[test]
        fn sh2_rank_point_round_trip(extent in extent_strategy(1)) {
            for r in 0..extent.len() {
                let point = extent.point_of(r).unwrap();
                prop_assert_eq!(extent.rank_of(&point), Some(r));
            }
            prop_assert_eq!(extent.point_of(extent.len()), None);
        }

        #[test]
        fn sh3_text_round_trip(
            dims in prop::collection::vec(("[a-z_][a-z0-9_.-]{0,5}", 1usize..1000), 1..=4),
        ) {
            let named = dims.iter().enumerate().map(|(i, (n, s))| (format!("{n}{i}"), *s));
            let extent = Extent::new(named).unwrap();
            prop_assert_eq!(extent.to_string().parse::<Extent>(), Ok(extent));
        }

        #[test]
        fn sh4_location_coordinates_round_trip(extent in extent_strategy(1), raws in raws()) {
            let shape = sliced(&extent, &raws);
            let slice = shape.slice();
            let (sizes, strides) = (slice.sizes().to_vec(), slice.strides().to_vec());
            prop_assert!(Slice::new(slice.offset(), sizes, strides).is_ok());
            let ranks = shape.ranks();
            for (i, &rank) in ranks.iter().enumerate() {
                let point = slice.coordinates(rank).unwrap();
                prop_assert_eq!(slice.location(&point), Ok(rank));
                prop_assert_eq!(slice.index_of(rank), Some(i));
            }
            for rank in 0..=extent.len() {
                prop_assert_eq!(slice.contains(rank), ranks.contains(&rank));
            }
        }

        #[test]
        fn sh6_selected_ranks_are_ordered_subset(
            extent in extent_strategy(1),
            raws in raws(),
            (which, raw) in (0usize..4, raw_selector()),
        ) {
            let parent = sliced(&extent, &raws);
            if parent.num_dims() == 0 {
                return Ok(());
            }
            let name = parent.labels()[which % parent.num_dims()].clone();
            let size = parent.size_of(&name).unwrap();
            let child = parent.select(&name, selector_for(size, raw)).unwrap();
            let (ranks, parent_ranks) = (child.ranks(), parent.ranks());
            prop_assert!(ranks.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(ranks.iter().all(|r| parent_ranks.contains(r)));
            prop_assert_eq!(ranks.len(), child.slice().sizes().iter().product::<usize>());
        }

        #[test]
        fn sh7_selections_commute(
            extent in extent_strategy(2),
            (first, gap) in (0usize..4, 1usize..4),
            a in raw_selector(),
            b in raw_selector(),
        ) {
            let n = extent.num_dims();
            let (i, j) = (first % n, (first + gap % (n - 1) + 1) % n);
            let (di, dj) = (&extent.dims()[i], &extent.dims()[j]);
            let sa = (di.name.as_str(), selector_for(di.size, a));
            let sb = (dj.name.as_str(), selector_for(dj.size, b));
            let shape = Shape::new(&extent);
            let ab = shape.select(sa.0, sa.1).unwrap().select(sb.0, sb.1).unwrap();
            let ba = shape.select(sb.0, sb.1).unwrap().select(sa.0, sa.1).unwrap();
            prop_assert_eq!(&ab, &ba);
            prop_assert_eq!(shape.select_many(&[sa, sb]), Ok(ab));
        }

        #[test]
        fn sh8_selection_eval(
            extent in extent_strategy(1),
            raws in raws(),
            sel in selection_strategy(),
        ) {
            let shape = sliced(&extent, &raws);
            let all = Selection::All.eval(&shape).unwrap();
            let union = Selection::Union(vec![sel.clone(), Selection::All]).eval(&shape);
            match sel.eval(&shape) {
                Ok(ranks) => {
                    prop_assert!(ranks.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(ranks.iter().all(|r| shape.slice().contains(*r)));
                    prop_assert_eq!(union, Ok(all));
                }
                Err(_) => prop_assert!(union.is_err()),
            }
        }
    }
}
