//! The one error type of this crate.
//!
//! Every failed check (shape, dtype, device, byte length, range) and every
//! backend failure is a value of [`Error`]; no operation panics on bad input.
//! Messages say what was wrong and, where there is one, what to do instead.

use crate::{DType, Device, Shape};

/// Everything that can go wrong in monarch-tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A shape whose element count (or byte length) does not fit in memory addresses.
    #[error("shape {dims:?} is too large: its element count or byte length overflows usize")]
    ShapeOverflow {
        /// The dimensions asked for.
        dims: Vec<usize>,
    },

    /// Two operands of an elementwise operation have different shapes.
    #[error("{op}: shapes differ ({lhs} vs {rhs}); elementwise operations need equal shapes")]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// Shape of the left operand (or of `self`).
        lhs: Shape,
        /// Shape of the right operand.
        rhs: Shape,
    },

    /// Two operands have different dtypes.
    #[error("{op}: dtypes differ ({lhs} vs {rhs}); convert one operand first")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// Dtype of the left operand (or of `self`).
        lhs: DType,
        /// Dtype of the right operand.
        rhs: DType,
    },

    /// Two operands live on different devices.
    #[error(
        "{op}: operands are on different devices ({lhs} vs {rhs}); move one with `to_device` first"
    )]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// Device of the left operand (or of `self`).
        lhs: Device,
        /// Device of the right operand.
        rhs: Device,
    },

    /// The operation is not defined for this dtype (for example `exp` of i64).
    #[error("{op} does not support dtype {dtype}; it needs {needs}")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What the operation accepts, in words.
        needs: &'static str,
    },

    /// A dimension index is not smaller than the rank.
    #[error("{op}: dimension {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension asked for.
        dim: usize,
        /// The tensor's rank.
        rank: usize,
    },

    /// `narrow(dim, start, len)` reaches past the end of the dimension.
    #[error("narrow: start {start} + length {len} exceeds size {size} of dimension {dim}")]
    NarrowOutOfRange {
        /// The dimension.
        dim: usize,
        /// First index taken.
        start: usize,
        /// Number of indices taken.
        len: usize,
        /// Size of the dimension.
        size: usize,
    },

    /// An operation needs a tensor of a particular rank.
    #[error("{op} needs a tensor of rank {expected}, got shape {shape}")]
    RankMismatch {
        /// The operation.
        op: &'static str,
        /// The rank the operation needs.
        expected: usize,
        /// The shape given.
        shape: Shape,
    },

    /// `matmul` operands whose inner dimensions differ.
    #[error("matmul: inner dimensions differ ({lhs} x {rhs}); need [m, k] x [k, n]")]
    MatmulShape {
        /// Shape of the left operand.
        lhs: Shape,
        /// Shape of the right operand.
        rhs: Shape,
    },

    /// `cat` of tensors whose shapes differ outside the concatenated dimension.
    #[error("cat: shape {shape} of tensor {index} does not match {first} outside dimension {dim}")]
    CatShape {
        /// Position of the offending tensor in the input list.
        index: usize,
        /// Its shape.
        shape: Shape,
        /// Shape of the first tensor.
        first: Shape,
        /// The concatenated dimension.
        dim: usize,
    },

    /// `cat` of an empty list.
    #[error("cat needs at least one tensor")]
    EmptyCat,

    /// `reshape` to a shape with a different element count.
    #[error("reshape: cannot view {from} ({from_numel} elements) as {to} ({to_numel} elements)")]
    ReshapeNumel {
        /// The tensor's shape.
        from: Shape,
        /// Its element count.
        from_numel: usize,
        /// The shape asked for.
        to: Shape,
        /// That shape's element count.
        to_numel: usize,
    },

    /// A byte buffer whose length is not `numel * dtype size`.
    #[error("{len} bytes do not hold a {dtype} tensor of shape {shape}: expected {expected} bytes")]
    ByteLength {
        /// Length of the buffer given.
        len: usize,
        /// The length the shape and dtype need.
        expected: usize,
        /// The shape.
        shape: Shape,
        /// The dtype.
        dtype: DType,
    },

    /// A scalar that cannot be represented in the tensor's dtype.
    #[error(
        "{op}: scalar {value} cannot be represented as {dtype} (integers need a whole number in range)"
    )]
    InvalidScalar {
        /// The operation.
        op: &'static str,
        /// The scalar given.
        value: f64,
        /// The dtype it had to become.
        dtype: DType,
    },

    /// Integer division by zero.
    #[error("{op}: integer division by zero")]
    DivisionByZero {
        /// The operation.
        op: &'static str,
    },

    /// Bad parameters for a random constructor.
    #[error("{op}: {reason}")]
    InvalidRandom {
        /// The constructor.
        op: &'static str,
        /// What was wrong.
        reason: String,
    },

    /// A typed accessor was asked for a dtype the tensor does not have.
    #[error("{op}: the tensor holds {actual}, not {requested}")]
    WrongElementType {
        /// The accessor.
        op: &'static str,
        /// The dtype asked for.
        requested: DType,
        /// The tensor's dtype.
        actual: DType,
    },

    /// A tensor with more than one element where a single value is needed.
    #[error("{op}: tensor of shape {shape} has {numel} elements, need exactly one")]
    NotAScalar {
        /// The operation.
        op: &'static str,
        /// The tensor's shape.
        shape: Shape,
        /// Its element count.
        numel: usize,
    },

    /// Host-memory access to a tensor that is not on the CPU.
    #[error(
        "{op} needs a CPU tensor, this one is on {device}; copy it with `to_device(Device::Cpu)` first"
    )]
    NotOnCpu {
        /// The operation.
        op: &'static str,
        /// Where the tensor is.
        device: Device,
    },

    /// Host memory could not be allocated.
    #[error("out of host memory allocating {bytes} bytes")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },

    /// A string that names no dtype.
    #[error("unknown dtype {0:?}: expected one of f32, f64, i64")]
    ParseDType(String),

    /// A string that names no device.
    #[error("unknown device {0:?}: expected \"cpu\", \"cuda\" or \"cuda:N\"")]
    ParseDevice(String),

    /// A CUDA device was asked for but this build has no CUDA backend.
    #[error("this build of monarch-tensor has no CUDA backend; rebuild with the `cuda` feature")]
    CudaNotCompiled,

    /// The CUDA backend cannot run here (library or device missing).
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),

    /// A CUDA call failed.
    #[error("CUDA error in {op}: {message}")]
    Cuda {
        /// What was being done.
        op: &'static str,
        /// The driver's, NVRTC's or cuBLAS's message.
        message: String,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
