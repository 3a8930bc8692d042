//! [`Tensor`]: a shape, a dtype and contiguous storage on one device.
//!
//! Every operation checks its operands first (device, then dtype, then shape)
//! and returns an [`Error`] naming the operation and the mismatch; only then
//! does it hand the storage to the CPU or CUDA backend. Operations never move
//! data between devices on their own.

use std::fmt;

use crate::cpu::{self, CpuStorage, Num};
#[cfg(feature = "cuda")]
use crate::cuda::{self, CudaStorage};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::{BinaryOp, UnaryOp};
use crate::rng::Xoshiro256;
use crate::{Device, Shape};

/// Where a tensor's elements are.
pub(crate) enum Storage {
    Cpu(CpuStorage),
    #[cfg(feature = "cuda")]
    Cuda(CudaStorage),
}

impl Storage {
    fn device(&self) -> Device {
        match self {
            Storage::Cpu(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Device::Cuda(s.ordinal()),
        }
    }

    fn dtype(&self) -> DType {
        match self {
            Storage::Cpu(s) => s.dtype(),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => s.dtype(),
        }
    }

    /// Host storage on `device`: kept as is for the CPU, uploaded for CUDA.
    fn place(cpu: CpuStorage, device: Device) -> Result<Storage> {
        match device {
            Device::Cpu => Ok(Storage::Cpu(cpu)),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => Ok(Storage::Cuda(cuda::upload(&cpu, ordinal)?)),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => Err(Error::CudaNotCompiled),
        }
    }

    /// A host copy (or the host storage itself, borrowed).
    fn to_cpu(&self) -> Result<std::borrow::Cow<'_, CpuStorage>> {
        match self {
            Storage::Cpu(s) => Ok(std::borrow::Cow::Borrowed(s)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(std::borrow::Cow::Owned(cuda::download(s)?)),
        }
    }

    fn as_cpu(&self) -> Option<&CpuStorage> {
        match self {
            Storage::Cpu(s) => Some(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => None,
        }
    }

    #[cfg(feature = "cuda")]
    fn as_cuda(&self) -> Option<&CudaStorage> {
        match self {
            Storage::Cpu(_) => None,
            Storage::Cuda(s) => Some(s),
        }
    }

    fn try_clone(&self) -> Result<Storage> {
        match self {
            Storage::Cpu(s) => Ok(Storage::Cpu(s.try_clone()?)),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => Ok(Storage::Cuda(cuda::try_clone(s)?)),
        }
    }
}

/// A dense tensor: contiguous row-major elements of one [`DType`] on one [`Device`].
///
/// See the crate documentation for the invariants (T-1 .. T-8) and an example.
pub struct Tensor {
    shape: Shape,
    storage: Storage,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.shape.dims())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .finish()
    }
}

// Construction.
impl Tensor {
    fn new(shape: Shape, storage: Storage) -> Tensor {
        Tensor { shape, storage }
    }

    /// A tensor of `dims` filled with `value`. For i64, `value` must be a whole
    /// number in range ([`Error::InvalidScalar`] otherwise).
    pub fn full(dims: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let shape = Shape::new(dims)?;
        shape.byte_len(dtype)?;
        let storage = match device {
            Device::Cpu => Storage::Cpu(CpuStorage::full(dtype, shape.numel(), value)?),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => {
                Storage::Cuda(cuda::full(dtype, shape.numel(), value, ordinal)?)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => return Err(Error::CudaNotCompiled),
        };
        Ok(Tensor::new(shape, storage))
    }

    /// A tensor of `dims` filled with zeros.
    pub fn zeros(dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(dims, 0.0, dtype, device)
    }

    /// A tensor of `dims` filled with ones.
    pub fn ones(dims: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(dims, 1.0, dtype, device)
    }

    /// The 1-D tensor `[0, 1, .., n - 1]`.
    pub fn arange(n: usize, dtype: DType, device: Device) -> Result<Tensor> {
        let storage = match dtype {
            DType::F32 => CpuStorage::F32(collect(n, |i| i as f32)?),
            DType::F64 => CpuStorage::F64(collect(n, |i| i as f64)?),
            DType::I64 => CpuStorage::I64(collect(n, |i| i as i64)?),
        };
        Tensor::from_cpu(Shape::new(&[n])?, storage, device)
    }

    /// Uniform random values in `[low, high)`, reproducible from `seed`.
    ///
    /// Floats are `low + (high - low) * u` with `u` uniform in `[0, 1)` (24 random
    /// bits for f32, 53 for f64). For i64, `low` and `high` must be whole
    /// numbers and the values are uniform integers in `[low, high)`.
    /// Values are generated on the host and copied to `device`, so a seed gives
    /// the same tensor on every device (T-7).
    pub fn rand_uniform(
        dims: &[usize],
        low: f64,
        high: f64,
        seed: u64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        const OP: &str = "rand_uniform";
        let shape = Shape::new(dims)?;
        shape.byte_len(dtype)?;
        let n = shape.numel();
        let mut rng = Xoshiro256::seed_from_u64(seed);
        let bad = |reason: String| Error::InvalidRandom { op: OP, reason };
        let storage = match dtype {
            DType::F32 => {
                let (lo, hi) = (low as f32, high as f32);
                let width = hi - lo;
                if !(lo < hi && width.is_finite()) {
                    return Err(bad(format!(
                        "need finite low < high with a finite width in f32, got [{low}, {high})"
                    )));
                }
                CpuStorage::F32(collect(n, |_| {
                    let v = lo + width * rng.next_f32();
                    if v < hi { v } else { hi.next_down() }
                })?)
            }
            DType::F64 => {
                let width = high - low;
                if !(low < high && width.is_finite()) {
                    return Err(bad(format!(
                        "need finite low < high with a finite width, got [{low}, {high})"
                    )));
                }
                CpuStorage::F64(collect(n, |_| {
                    let v = low + width * rng.next_f64();
                    if v < high { v } else { high.next_down() }
                })?)
            }
            DType::I64 => {
                let lo = i64::from_scalar(OP, low)?;
                let hi = i64::from_scalar(OP, high)?;
                if lo >= hi {
                    return Err(bad(format!("need low < high, got [{lo}, {hi})")));
                }
                // hi - lo fits in u64 for any lo < hi.
                let range = (hi as i128 - lo as i128) as u64;
                CpuStorage::I64(collect(n, |_| lo.wrapping_add(rng.below(range) as i64))?)
            }
        };
        Tensor::from_cpu(shape, storage, device)
    }

    /// Normally distributed random values with `mean` and standard deviation
    /// `std`, reproducible from `seed` (floats only). As with
    /// [`Tensor::rand_uniform`], generated on the host and copied to `device`.
    pub fn rand_normal(
        dims: &[usize],
        mean: f64,
        std: f64,
        seed: u64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        const OP: &str = "rand_normal";
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op: OP,
                dtype,
                needs: "a float dtype (f32 or f64)",
            });
        }
        if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
            return Err(Error::InvalidRandom {
                op: OP,
                reason: format!("need a finite mean and a finite std >= 0, got {mean} and {std}"),
            });
        }
        let shape = Shape::new(dims)?;
        shape.byte_len(dtype)?;
        let mut rng = Xoshiro256::seed_from_u64(seed);
        let mut pending: Option<f64> = None;
        let mut next = move || match pending.take() {
            Some(z) => mean + std * z,
            None => {
                let (z0, z1) = rng.normal_pair();
                pending = Some(z1);
                mean + std * z0
            }
        };
        let n = shape.numel();
        let storage = match dtype {
            DType::F32 => CpuStorage::F32(collect(n, |_| next() as f32)?),
            _ => CpuStorage::F64(collect(n, |_| next())?),
        };
        Tensor::from_cpu(shape, storage, device)
    }

    /// A tensor whose elements are the little-endian encoding `bytes`, which must
    /// be exactly `numel * dtype.size_of()` long ([`Error::ByteLength`] otherwise).
    pub fn from_le_bytes(
        bytes: &[u8],
        dims: &[usize],
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let shape = Shape::new(dims)?;
        let expected = shape.byte_len(dtype)?;
        if bytes.len() != expected {
            return Err(Error::ByteLength {
                len: bytes.len(),
                expected,
                shape,
                dtype,
            });
        }
        let storage = CpuStorage::from_le_bytes(dtype, bytes)?;
        Tensor::from_cpu(shape, storage, device)
    }

    /// A CPU tensor that takes ownership of `values` (no copy).
    /// `values.len()` must equal the element count of `dims`.
    pub fn from_vec<T: Element>(values: Vec<T>, dims: &[usize]) -> Result<Tensor> {
        let shape = shape_for::<T>(values.len(), dims)?;
        Ok(Tensor::new(shape, Storage::Cpu(T::into_storage(values))))
    }

    /// A tensor on `device` holding a copy of `values`.
    pub fn from_slice<T: Element>(values: &[T], dims: &[usize], device: Device) -> Result<Tensor> {
        let shape = shape_for::<T>(values.len(), dims)?;
        let mut v = cpu::try_alloc(values.len())?;
        v.extend_from_slice(values);
        Tensor::from_cpu(shape, T::into_storage(v), device)
    }

    fn from_cpu(shape: Shape, storage: CpuStorage, device: Device) -> Result<Tensor> {
        Ok(Tensor::new(shape, Storage::place(storage, device)?))
    }

    fn storage_into_cpu(self) -> Result<CpuStorage> {
        match self.storage {
            Storage::Cpu(s) => Ok(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(s) => cuda::download(&s),
        }
    }
}

/// The shape `dims`, checked to hold exactly `len` elements of `T`.
fn shape_for<T: Element>(len: usize, dims: &[usize]) -> Result<Shape> {
    let shape = Shape::new(dims)?;
    let expected = shape.byte_len(T::DTYPE)?;
    if len != shape.numel() {
        return Err(Error::ByteLength {
            len: len.saturating_mul(T::DTYPE.size_of()),
            expected,
            shape,
            dtype: T::DTYPE,
        });
    }
    Ok(shape)
}

fn collect<T>(n: usize, mut f: impl FnMut(usize) -> T) -> Result<Vec<T>> {
    let mut v = cpu::try_alloc(n)?;
    v.extend((0..n).map(&mut f));
    Ok(v)
}

// Metadata and data access.
impl Tensor {
    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimension sizes, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// The device that holds the storage.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// Bytes of storage: `numel * dtype.size_of()`.
    pub fn byte_len(&self) -> usize {
        self.numel() * self.dtype().size_of()
    }

    /// The elements as little-endian bytes (copied from the device if needed).
    pub fn to_le_bytes(&self) -> Result<Vec<u8>> {
        self.storage.to_cpu()?.to_le_bytes()
    }

    /// A copy of the elements in row-major order; `T` must match the dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_element::<T>("to_vec")?;
        let host = self.storage.to_cpu()?;
        let values = T::slice(&host).ok_or_else(|| self.wrong_element::<T>("to_vec"))?;
        let mut out = cpu::try_alloc(values.len())?;
        out.extend_from_slice(values);
        Ok(out)
    }

    /// The elements in row-major order, without a copy for a CPU tensor.
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>> {
        self.check_element::<T>("into_vec")?;
        let wrong = self.wrong_element::<T>("into_vec");
        T::from_storage(self.storage_into_cpu()?).ok_or(wrong)
    }

    /// The single element of a one-element tensor (any rank), as f64.
    /// i64 values beyond 2^53 are rounded.
    pub fn to_scalar(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(Error::NotAScalar {
                op: "to_scalar",
                shape: self.shape.clone(),
                numel: self.numel(),
            });
        }
        self.storage
            .to_cpu()?
            .get_f64(0)
            .ok_or_else(|| Error::NotAScalar {
                op: "to_scalar",
                shape: self.shape.clone(),
                numel: 0,
            })
    }

    /// The elements of a CPU tensor, borrowed; `T` must match the dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        self.check_element::<T>("as_slice")?;
        let wrong = self.wrong_element::<T>("as_slice");
        T::slice(self.cpu_storage("as_slice")?).ok_or(wrong)
    }

    /// The elements of a CPU tensor, mutably borrowed; `T` must match the dtype.
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<&mut [T]> {
        self.check_element::<T>("as_mut_slice")?;
        let wrong = self.wrong_element::<T>("as_mut_slice");
        T::slice_mut(self.cpu_storage_mut("as_mut_slice")?).ok_or(wrong)
    }

    /// The raw storage of a CPU tensor: `byte_len()` little-endian bytes,
    /// aligned to the dtype size (invariants T-1 .. T-4).
    pub fn as_bytes(&self) -> Result<&[u8]> {
        Ok(self.cpu_storage("as_bytes")?.as_bytes())
    }

    /// The raw storage of a CPU tensor, writable; any bytes are valid elements.
    ///
    /// This is the entry point for registering a tensor with RDMA: the
    /// pointer and length of the returned slice stay valid and fixed until the
    /// tensor is dropped or consumed (T-3), because no operation reallocates a
    /// tensor's storage in place. Whoever keeps the raw pointer past this
    /// borrow must also keep the tensor alive and must not let a remote write
    /// race with Rust reads or writes of it.
    pub fn as_bytes_mut(&mut self) -> Result<&mut [u8]> {
        Ok(self.cpu_storage_mut("as_bytes_mut")?.as_bytes_mut())
    }

    /// A copy of this tensor on `device` (a copy even when already there).
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        let storage = match (&self.storage, device) {
            (Storage::Cpu(s), Device::Cpu) => Storage::Cpu(s.try_clone()?),
            #[cfg(feature = "cuda")]
            (Storage::Cpu(s), Device::Cuda(ordinal)) => Storage::Cuda(cuda::upload(s, ordinal)?),
            #[cfg(not(feature = "cuda"))]
            (Storage::Cpu(_), Device::Cuda(_)) => return Err(Error::CudaNotCompiled),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(s), Device::Cuda(ordinal)) if s.ordinal() == ordinal => {
                Storage::Cuda(cuda::try_clone(s)?)
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(s), _) => Storage::place(cuda::download(s)?, device)?,
        };
        Ok(Tensor::new(self.shape.clone(), storage))
    }

    /// A copy on the same device. (Not `Clone`: copying device memory can fail.)
    pub fn try_clone(&self) -> Result<Tensor> {
        Ok(Tensor::new(self.shape.clone(), self.storage.try_clone()?))
    }

    /// The largest `|self - other|` over all elements, computed on the host
    /// (either tensor may be on any device). Positions where exactly one side
    /// is NaN count as infinitely far apart; NaN on both sides counts as equal.
    pub fn max_abs_diff(&self, other: &Tensor) -> Result<f64> {
        self.check_dtype("max_abs_diff", other)?;
        self.check_shape("max_abs_diff", other)?;
        let (a, b) = (self.storage.to_cpu()?, other.storage.to_cpu()?);
        let mut worst = 0.0f64;
        for i in 0..self.numel() {
            let (x, y) = (a.get_f64(i), b.get_f64(i));
            let d = match (x, y) {
                (Some(x), Some(y)) if x.is_nan() && y.is_nan() => 0.0,
                (Some(x), Some(y)) if x.is_nan() || y.is_nan() => f64::INFINITY,
                (Some(x), Some(y)) if x == y => 0.0,
                (Some(x), Some(y)) => (x - y).abs(),
                _ => f64::INFINITY,
            };
            worst = worst.max(d);
        }
        Ok(worst)
    }

    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn cpu_storage(&self, op: &'static str) -> Result<&CpuStorage> {
        match &self.storage {
            Storage::Cpu(s) => Ok(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::NotOnCpu {
                op,
                device: self.device(),
            }),
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn cpu_storage_mut(&mut self, op: &'static str) -> Result<&mut CpuStorage> {
        let device = self.device();
        match &mut self.storage {
            Storage::Cpu(s) => Ok(s),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => Err(Error::NotOnCpu { op, device }),
        }
    }

    fn check_element<T: Element>(&self, op: &'static str) -> Result<()> {
        if T::DTYPE == self.dtype() {
            Ok(())
        } else {
            Err(self.wrong_element::<T>(op))
        }
    }

    fn wrong_element<T: Element>(&self, op: &'static str) -> Error {
        Error::WrongElementType {
            op,
            requested: T::DTYPE,
            actual: self.dtype(),
        }
    }
}

// Checks shared by the operations.
impl Tensor {
    fn check_device(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.device() == other.device() {
            Ok(())
        } else {
            Err(Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: other.device(),
            })
        }
    }

    fn check_dtype(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.dtype() == other.dtype() {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: other.dtype(),
            })
        }
    }

    fn check_shape(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.shape == other.shape {
            Ok(())
        } else {
            Err(Error::ShapeMismatch {
                op,
                lhs: self.shape.clone(),
                rhs: other.shape.clone(),
            })
        }
    }

    /// Device, dtype and shape all equal: what elementwise operations need.
    fn check_same(&self, op: &'static str, other: &Tensor) -> Result<()> {
        self.check_device(op, other)?;
        self.check_dtype(op, other)?;
        self.check_shape(op, other)
    }

    fn check_float(&self, op: &'static str) -> Result<()> {
        if self.dtype().is_float() {
            Ok(())
        } else {
            Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype(),
                needs: "a float dtype (f32 or f64)",
            })
        }
    }

    /// The scalar converts to this tensor's dtype.
    fn check_scalar(&self, op: &'static str, value: f64) -> Result<()> {
        if self.dtype() == DType::I64 {
            i64::from_scalar(op, value)?;
        }
        Ok(())
    }

    fn check_rank(&self, op: &'static str, expected: usize) -> Result<()> {
        if self.rank() == expected {
            Ok(())
        } else {
            Err(Error::RankMismatch {
                op,
                expected,
                shape: self.shape.clone(),
            })
        }
    }

    #[cfg(feature = "cuda")]
    fn mixed(&self, op: &'static str, other: &Tensor) -> Error {
        Error::DeviceMismatch {
            op,
            lhs: self.device(),
            rhs: other.device(),
        }
    }
}

// Elementwise operations.
impl Tensor {
    fn binary(&self, op: BinaryOp, other: &Tensor) -> Result<Tensor> {
        self.check_same(op.name(), other)?;
        let storage = match (&self.storage, &other.storage) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::binary(op, a, b)?),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => Storage::Cuda(cuda::binary(op, a, b)?),
            #[cfg(feature = "cuda")]
            _ => return Err(self.mixed(op.name(), other)),
        };
        Ok(Tensor::new(self.shape.clone(), storage))
    }

    fn binary_scalar(&self, op: BinaryOp, scalar: f64) -> Result<Tensor> {
        self.check_scalar(op.scalar_name(), scalar)?;
        if op == BinaryOp::Div && self.dtype() == DType::I64 && scalar == 0.0 {
            return Err(Error::DivisionByZero {
                op: op.scalar_name(),
            });
        }
        let storage = match &self.storage {
            Storage::Cpu(a) => Storage::Cpu(cpu::binary_scalar(op, a, scalar)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(a) => Storage::Cuda(cuda::binary_scalar(op, a, scalar)?),
        };
        Ok(Tensor::new(self.shape.clone(), storage))
    }

    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        if op.float_only() {
            self.check_float(op.name())?;
        }
        let storage = match &self.storage {
            Storage::Cpu(a) => Storage::Cpu(cpu::unary(op, a)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(a) => Storage::Cuda(cuda::unary(op, a)?),
        };
        Ok(Tensor::new(self.shape.clone(), storage))
    }

    /// `self + other`, elementwise (same device, dtype and shape). i64 wraps.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Add, other)
    }

    /// `self - other`, elementwise.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Sub, other)
    }

    /// `self * other`, elementwise.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Mul, other)
    }

    /// `self / other`, elementwise. Floats follow IEEE 754 (x/0 is inf or NaN);
    /// i64 truncates toward zero and a zero divisor is [`Error::DivisionByZero`].
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(BinaryOp::Div, other)
    }

    /// `self + scalar`. For i64 the scalar must be a whole number in range.
    pub fn add_scalar(&self, scalar: f64) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Add, scalar)
    }

    /// `self - scalar`.
    pub fn sub_scalar(&self, scalar: f64) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Sub, scalar)
    }

    /// `self * scalar`.
    pub fn mul_scalar(&self, scalar: f64) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Mul, scalar)
    }

    /// `self / scalar` (i64: truncating, and 0 is [`Error::DivisionByZero`]).
    pub fn div_scalar(&self, scalar: f64) -> Result<Tensor> {
        self.binary_scalar(BinaryOp::Div, scalar)
    }

    /// `-self`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    /// `max(self, 0)`, keeping NaN.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// `e^self` (floats only).
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    /// `self += other` in place (same device, dtype and shape).
    pub fn add_assign(&mut self, other: &Tensor) -> Result<()> {
        self.axpy_named("add_assign", 1.0, other)
    }

    /// `self += alpha * x` in place: the update of a gradient step
    /// (`w.axpy(-lr, &grad)`) and of all-reduce accumulation.
    /// For i64, `alpha` must be a whole number in range.
    pub fn axpy(&mut self, alpha: f64, x: &Tensor) -> Result<()> {
        self.axpy_named("axpy", alpha, x)
    }

    fn axpy_named(&mut self, op: &'static str, alpha: f64, x: &Tensor) -> Result<()> {
        self.check_same(op, x)?;
        self.check_scalar(op, alpha)?;
        match (&mut self.storage, &x.storage) {
            (Storage::Cpu(y), Storage::Cpu(x)) => cpu::axpy(y, alpha, x),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(y), Storage::Cuda(x)) => cuda::axpy(y, alpha, x),
            #[cfg(feature = "cuda")]
            _ => Err(Error::DeviceMismatch {
                op,
                lhs: self.storage.device(),
                rhs: x.device(),
            }),
        }
    }

    /// `self *= alpha` in place (for example, averaging after an all-reduce sum).
    pub fn scale_assign(&mut self, alpha: f64) -> Result<()> {
        self.check_scalar("scale_assign", alpha)?;
        match &mut self.storage {
            Storage::Cpu(y) => cpu::scale(y, alpha),
            #[cfg(feature = "cuda")]
            Storage::Cuda(y) => cuda::scale(y, alpha),
        }
    }
}

// Matrix multiplication and reductions.
impl Tensor {
    /// `[m, k] x [k, n] -> [m, n]` for 2-D tensors of one dtype on one device.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        const OP: &str = "matmul";
        self.check_device(OP, other)?;
        self.check_dtype(OP, other)?;
        self.check_rank(OP, 2)?;
        other.check_rank(OP, 2)?;
        let (m, k) = (self.dims()[0], self.dims()[1]);
        let (k2, n) = (other.dims()[0], other.dims()[1]);
        if k != k2 {
            return Err(Error::MatmulShape {
                lhs: self.shape.clone(),
                rhs: other.shape.clone(),
            });
        }
        let shape = Shape::new(&[m, n])?;
        shape.byte_len(self.dtype())?;
        let storage = match (&self.storage, &other.storage) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::matmul(a, b, m, k, n)?),
            #[cfg(feature = "cuda")]
            (Storage::Cuda(a), Storage::Cuda(b)) => Storage::Cuda(cuda::matmul(a, b, m, k, n)?),
            #[cfg(feature = "cuda")]
            _ => return Err(self.mixed(OP, other)),
        };
        Ok(Tensor::new(shape, storage))
    }

    fn reduce_all(&self, mean: bool) -> Result<Tensor> {
        let storage = match &self.storage {
            Storage::Cpu(a) => Storage::Cpu(cpu::reduce_dim(a, 1, self.numel(), 1, mean)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(a) => Storage::Cuda(cuda::reduce_all(a, mean)?),
        };
        Ok(Tensor::new(Shape::scalar(), storage))
    }

    fn reduce_dim(&self, op: &'static str, dim: usize, mean: bool) -> Result<Tensor> {
        self.shape.check_dim(op, dim)?;
        let (outer, d, inner) = self.shape.split_at_dim(dim);
        let storage = match &self.storage {
            Storage::Cpu(a) => Storage::Cpu(cpu::reduce_dim(a, outer, d, inner, mean)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(a) => Storage::Cuda(cuda::reduce_dim(a, outer, d, inner, mean)?),
        };
        Ok(Tensor::new(self.shape.without_dim(dim), storage))
    }

    /// The sum of all elements, as a rank-0 tensor of the same dtype.
    /// Floats accumulate in f64; i64 wraps.
    pub fn sum(&self) -> Result<Tensor> {
        self.reduce_all(false)
    }

    /// Sums along `dim`, removing it: `[2, 3].sum_dim(0)` is `[3]`.
    pub fn sum_dim(&self, dim: usize) -> Result<Tensor> {
        self.reduce_dim("sum_dim", dim, false)
    }

    /// The mean of all elements as a rank-0 tensor (floats only; NaN when empty).
    pub fn mean(&self) -> Result<Tensor> {
        self.check_float("mean")?;
        self.reduce_all(true)
    }

    /// Means along `dim`, removing it (floats only).
    pub fn mean_dim(&self, dim: usize) -> Result<Tensor> {
        self.check_float("mean_dim")?;
        self.reduce_dim("mean_dim", dim, true)
    }
}

// Layout: narrow, cat, reshape, transpose.
impl Tensor {
    /// Indices `start .. start + len` of dimension `dim`, as a new contiguous
    /// tensor: the shard of a tensor split along `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        self.shape.check_dim("narrow", dim)?;
        let (outer, d, inner) = self.shape.split_at_dim(dim);
        if start.checked_add(len).is_none_or(|end| end > d) {
            return Err(Error::NarrowOutOfRange {
                dim,
                start,
                len,
                size: d,
            });
        }
        let shape = self.shape.with_dim(dim, len)?;
        let storage = match &self.storage {
            Storage::Cpu(a) => Storage::Cpu(cpu::narrow(a, outer, d, inner, start, len)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(a) => Storage::Cuda(cuda::narrow(a, outer, d, inner, start, len)?),
        };
        Ok(Tensor::new(shape, storage))
    }

    /// Concatenates `tensors` along `dim`: the inverse of splitting with
    /// [`Tensor::narrow`]. All must share device, dtype, rank and every
    /// dimension but `dim`.
    pub fn cat(tensors: &[&Tensor], dim: usize) -> Result<Tensor> {
        const OP: &str = "cat";
        let first = tensors.first().ok_or(Error::EmptyCat)?;
        first.shape.check_dim(OP, dim)?;
        let mut total = 0usize;
        for (index, t) in tensors.iter().enumerate() {
            first.check_device(OP, t)?;
            first.check_dtype(OP, t)?;
            let same_outside = t.rank() == first.rank()
                && t.dims()
                    .iter()
                    .zip(first.dims())
                    .enumerate()
                    .all(|(k, (a, b))| k == dim || a == b);
            if !same_outside {
                return Err(Error::CatShape {
                    index,
                    shape: t.shape.clone(),
                    first: first.shape.clone(),
                    dim,
                });
            }
            total = total
                .checked_add(t.dims()[dim])
                .ok_or_else(|| Error::ShapeOverflow {
                    dims: first.dims().to_vec(),
                })?;
        }
        let shape = first.shape.with_dim(dim, total)?;
        shape.byte_len(first.dtype())?;
        let (outer, _, inner) = first.shape.split_at_dim(dim);
        let storage = match &first.storage {
            Storage::Cpu(_) => {
                let parts: Vec<_> = tensors
                    .iter()
                    .filter_map(|t| t.storage.as_cpu().map(|s| (s, t.dims()[dim])))
                    .collect();
                Storage::Cpu(cpu::cat(&parts, outer, inner, total)?)
            }
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => {
                let parts: Vec<_> = tensors
                    .iter()
                    .filter_map(|t| t.storage.as_cuda().map(|s| (s, t.dims()[dim])))
                    .collect();
                Storage::Cuda(cuda::cat(&parts, outer, inner, total)?)
            }
        };
        Ok(Tensor::new(shape, storage))
    }

    /// A copy with the same elements in the same order under a new shape of
    /// equal element count.
    pub fn reshape(&self, dims: &[usize]) -> Result<Tensor> {
        let shape = self.reshaped(dims)?;
        Ok(Tensor::new(shape, self.storage.try_clone()?))
    }

    /// Like [`Tensor::reshape`] but consumes the tensor and keeps its storage
    /// (no copy; the raw storage address is unchanged, T-3).
    pub fn into_reshape(self, dims: &[usize]) -> Result<Tensor> {
        let shape = self.reshaped(dims)?;
        Ok(Tensor::new(shape, self.storage))
    }

    fn reshaped(&self, dims: &[usize]) -> Result<Shape> {
        let to = Shape::new(dims)?;
        if to.numel() != self.numel() {
            return Err(Error::ReshapeNumel {
                from: self.shape.clone(),
                from_numel: self.numel(),
                to_numel: to.numel(),
                to,
            });
        }
        Ok(to)
    }

    /// The transpose of a 2-D tensor, as a new contiguous tensor.
    pub fn transpose(&self) -> Result<Tensor> {
        self.check_rank("transpose", 2)?;
        let (rows, cols) = (self.dims()[0], self.dims()[1]);
        let storage = match &self.storage {
            Storage::Cpu(a) => Storage::Cpu(cpu::transpose(a, rows, cols)?),
            #[cfg(feature = "cuda")]
            Storage::Cuda(a) => Storage::Cuda(cuda::transpose(a, rows, cols)?),
        };
        Ok(Tensor::new(Shape::new(&[cols, rows])?, storage))
    }
}
