//! monarch-tensor: tensors and their CPU and CUDA backends.
//!
//! The host owns tensors; a controller (a Wasm component) holds only handles
//! to them. At its core this crate is the single-process library under that: a
//! [`Tensor`] is a [`Shape`], a [`DType`] and contiguous row-major storage on
//! one [`Device`]. Operations check their operands and dispatch to the
//! backend of the device the storage is on:
//!
//! - **CPU** (always built): `Vec` storage, elementwise loops the compiler
//!   vectorizes, sgemm/dgemm from `matrixmultiply`.
//! - **CUDA** (cargo feature `cuda`): device memory through cudarc, cuBLAS for
//!   f32/f64 matmul, the other kernels compiled once per process with NVRTC.
//!   cudarc loads the CUDA libraries at run time, so the feature builds
//!   anywhere; without a driver, creating a CUDA tensor returns
//!   [`Error::CudaUnavailable`].
//!
//! Above one process, [`mesh`] puts tensors on the procs of an actor mesh:
//! a tensor worker per rank holds the shards, and the controller holds
//! handles, pipelines operations, fetches and all-reduces (see its docs).
//!
//! Sharding (a tensor split over a mesh dimension) is built from
//! [`Tensor::narrow`] and [`Tensor::cat`]; gradient steps and all-reduce
//! accumulation from [`Tensor::axpy`] and [`Tensor::add_assign`]; moving a
//! shard through an RDMA buffer from [`Tensor::as_bytes_mut`] or the
//! little-endian bytes of [`Tensor::to_le_bytes`] / [`Tensor::from_le_bytes`].
//!
//! # Example
//!
//! ```
//! use monarch_tensor::{DType, Device, Tensor};
//!
//! # fn main() -> Result<(), monarch_tensor::Error> {
//! // y = x w + b, on the CPU.
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = Tensor::rand_normal(&[2, 1], 0.0, 0.1, 42, DType::F32, Device::Cpu)?;
//! let b = Tensor::full(&[2, 1], 0.5, DType::F32, Device::Cpu)?;
//! let y = x.matmul(&w)?.add(&b)?;
//! assert_eq!(y.dims(), &[2, 1]);
//!
//! // A gradient step in place: w -= 0.01 * grad.
//! let grad = Tensor::ones(&[2, 1], DType::F32, Device::Cpu)?;
//! let mut w = w;
//! w.axpy(-0.01, &grad)?;
//!
//! // Shard along dim 0 and put the shards back together.
//! let top = x.narrow(0, 0, 1)?;
//! let bottom = x.narrow(0, 1, 1)?;
//! let whole = Tensor::cat(&[&top, &bottom], 0)?;
//! assert_eq!(whole.to_vec::<f32>()?, x.to_vec::<f32>()?);
//!
//! // Mismatches are errors, not panics.
//! let ints = Tensor::arange(4, DType::I64, Device::Cpu)?;
//! assert!(x.reshape(&[4])?.add(&ints).is_err());
//! # Ok(())
//! # }
//! ```
//!
//! # Invariants
//!
//! - **T-1 Contiguous.** A tensor's storage holds exactly `numel` elements in
//!   row-major order, `numel * dtype.size_of()` bytes; there are no views or
//!   strides other than [`Shape::strides`]. `narrow`, `transpose` and
//!   `reshape` return new contiguous tensors.
//! - **T-2 Little-endian.** Storage bytes are the little-endian encoding of the
//!   elements, so [`Tensor::as_bytes`] equals [`Tensor::to_le_bytes`] and a
//!   shard's bytes can travel between hosts unchanged. (The crate refuses to
//!   build for big-endian targets.)
//! - **T-3 Stable address.** A CPU tensor's storage is one allocation that
//!   never moves or changes size while the tensor lives: in-place operations
//!   (`add_assign`, `axpy`, `scale_assign`, writes through `as_mut_slice` or
//!   `as_bytes_mut`) write into it, `into_reshape` keeps it, and every other
//!   operation returns a new tensor. A pointer taken from
//!   [`Tensor::as_bytes_mut`] (for RDMA registration) stays valid until the
//!   tensor is dropped or consumed.
//! - **T-4 Aligned.** Storage is aligned to `dtype.size_of()`.
//! - **T-5 One device.** An operation's operands must be on the same device
//!   ([`Error::DeviceMismatch`] otherwise); data moves between devices only
//!   through [`Tensor::to_device`].
//! - **T-6 Checked.** Every operation validates device, dtype, shape, ranges,
//!   byte lengths and scalars before touching data and reports a mismatch as an
//!   [`Error`]; none panics on bad input. Host allocation failure is
//!   [`Error::OutOfMemory`], not an abort.
//! - **T-7 Reproducible randomness.** [`Tensor::rand_uniform`] and
//!   [`Tensor::rand_normal`] give the same tensor for the same arguments and
//!   seed, on every device and every run (values are generated on the host
//!   with a fixed xoshiro256** stream, then copied).
//! - **T-8 Empty is fine.** Dimensions of size 0 are allowed everywhere; a
//!   rank-0 tensor holds one element.
//!
//! Arithmetic follows the dtype: floats are IEEE 754 (division by zero gives
//! infinity or NaN), i64 wraps on overflow and integer division by zero is
//! [`Error::DivisionByZero`]. Sums of floats accumulate in f64.

#[cfg(target_endian = "big")]
compile_error!(
    "monarch-tensor stores elements little-endian in place (invariant T-2); big-endian targets are not supported"
);

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod dtype;
mod error;
pub mod mesh;
mod ops;
mod rng;
mod shape;
mod tensor;
pub mod throughput;

pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use shape::Shape;
pub use tensor::Tensor;

/// The number of CUDA devices this process can use.
///
/// [`Error::CudaNotCompiled`] without the `cuda` feature; with it,
/// [`Error::CudaUnavailable`] when there is no driver library or the driver
/// cannot be initialized. Tests use this to decide whether to skip GPU checks.
pub fn cuda_device_count() -> Result<usize> {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(Error::CudaNotCompiled)
    }
}
