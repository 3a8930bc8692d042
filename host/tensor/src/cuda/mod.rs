//! The CUDA backend (cargo feature `cuda`).
//!
//! One [`Backend`] per device ordinal, created on first use and kept for the
//! life of the process: a context, one stream on which every operation of
//! that device is queued in order, and lazily a cuBLAS handle and the kernel
//! module. Kernels are compiled from [`kernels::source`] with NVRTC to a
//! CUBIN for the device's architecture, once per process and architecture
//! (see [`nvrtc`] for why not PTX), and loaded once per device.
//!
//! cudarc opens libcuda, libnvrtc and libcublas at run time and panics when
//! one is missing, so each is checked with its `is_culib_present()` before
//! first use and reported as [`Error::CudaUnavailable`]. As a last resort the
//! few initialization calls (device count, context, NVRTC compile, module
//! load, cuBLAS handle) also run under `catch_unwind`, which turns cudarc's
//! "missing symbol" panic (a library older than the CUDA 12.8 API cudarc is
//! built against) into an error; that needs the default `panic = "unwind"`.
//!
//! Only the libraries an operation needs are required: copies and `zeros`
//! need the driver; other kernels need NVRTC too; f32/f64 `matmul` needs
//! cuBLAS.
//!
//! Results are read back with blocking copies; everything else is queued
//! asynchronously on the device's stream, so a kernel fault surfaces as an
//! error of the next copy back to the host.

pub(crate) mod kernels;
mod nvrtc;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};

use crate::DType;
use crate::cpu::{CpuStorage, Num, try_alloc};
use crate::error::{Error, Result};
use crate::ops::{BinaryOp, UnaryOp};
use kernels::{BLOCK, kernel_name};

/// Most blocks a grid-stride launch uses; more would only add scheduling.
const MAX_BLOCKS: usize = 65_535;
/// Blocks of the first pass of a full sum (each writes one partial sum).
const SUM_BLOCKS: usize = 1_024;

/// One CUDA device as this process uses it.
pub(crate) struct Backend {
    ordinal: usize,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    blas: OnceLock<std::result::Result<CudaBlas, String>>,
    kernels: OnceLock<std::result::Result<HashMap<String, CudaFunction>, String>>,
}

/// Runs a cudarc call, turning its error, or a panic inside it, into an [`Error`].
fn guarded<T, E: std::fmt::Display>(
    op: &'static str,
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::Cuda {
            op,
            message: e.to_string(),
        }),
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(Error::CudaUnavailable(format!(
                "cudarc panicked during {op}: {message} (is a CUDA library older than 12.8?)"
            )))
        }
    }
}

fn driver_present() -> Result<()> {
    // SAFETY: only tries to open the library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::CudaUnavailable(
            "no CUDA driver library (libcuda.so) on this machine; install the NVIDIA driver \
             or use Device::Cpu"
                .into(),
        ))
    }
}

/// The number of CUDA devices, after checking the driver library is there.
pub(crate) fn device_count() -> Result<usize> {
    driver_present()?;
    let n = guarded("cuDeviceGetCount", CudaContext::device_count)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The backend of device `ordinal`, created on first use.
pub(crate) fn backend(ordinal: usize) -> Result<Arc<Backend>> {
    static BACKENDS: Mutex<BTreeMap<usize, Arc<Backend>>> = Mutex::new(BTreeMap::new());
    let mut backends = BACKENDS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = backends.get(&ordinal) {
        return Ok(b.clone());
    }
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::CudaUnavailable(format!(
            "CUDA device {ordinal} does not exist: this machine has {count}"
        )));
    }
    let ctx = guarded("creating a CUDA context", || CudaContext::new(ordinal))?;
    let stream = guarded("creating a CUDA stream", || ctx.new_stream())?;
    tracing::debug!(ordinal, "CUDA backend ready");
    let backend = Arc::new(Backend {
        ordinal,
        stream,
        ctx,
        blas: OnceLock::new(),
        kernels: OnceLock::new(),
    });
    backends.insert(ordinal, backend.clone());
    Ok(backend)
}

impl Backend {
    fn function(&self, name: &str) -> Result<&CudaFunction> {
        let functions = self
            .kernels
            .get_or_init(|| {
                let (major, minor) = self
                    .ctx
                    .compute_capability()
                    .map_err(|e| format!("reading the compute capability: {e}"))?;
                let arch = nvrtc::arch_for(major, minor);
                let (src, names) = kernels::source();
                let cubin = nvrtc::compile_cubin(&src, &arch)?;
                let module = guarded("loading the tensor kernels", || {
                    self.ctx
                        .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.to_vec()))
                })
                .map_err(|e| e.to_string())?;
                let mut functions = HashMap::new();
                for name in names {
                    let f = module
                        .load_function(&name)
                        .map_err(|e| format!("kernel {name}: {e}"))?;
                    functions.insert(name, f);
                }
                Ok(functions)
            })
            .as_ref()
            .map_err(|m| Error::CudaUnavailable(m.clone()))?;
        functions.get(name).ok_or_else(|| Error::Cuda {
            op: "kernel lookup",
            message: format!("no kernel {name} in the compiled module"),
        })
    }

    fn blas(&self) -> Result<&CudaBlas> {
        self.blas
            .get_or_init(|| {
                // SAFETY: only tries to open the library.
                if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                    return Err("no cuBLAS library (libcublas.so.12) found, needed for \
                                f32/f64 matmul; install the CUDA toolkit or `pip install \
                                nvidia-cublas-cu12` and add its lib folder to LD_LIBRARY_PATH"
                        .into());
                }
                guarded("creating a cuBLAS handle", || {
                    CudaBlas::new(self.stream.clone())
                })
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|m| Error::CudaUnavailable(m.clone()))
    }
}

/// Device storage of one dtype.
pub(crate) enum CudaData {
    F32(CudaSlice<f32>),
    F64(CudaSlice<f64>),
    I64(CudaSlice<i64>),
}

/// Contiguous row-major storage on one device. The allocation holds at least
/// one element (CUDA refuses empty allocations); `len` is the element count.
pub(crate) struct CudaStorage {
    backend: Arc<Backend>,
    data: CudaData,
    len: usize,
}

impl CudaStorage {
    pub(crate) fn ordinal(&self) -> usize {
        self.backend.ordinal
    }

    pub(crate) fn dtype(&self) -> DType {
        match self.data {
            CudaData::F32(_) => DType::F32,
            CudaData::F64(_) => DType::F64,
            CudaData::I64(_) => DType::I64,
        }
    }
}

/// Element types with device kernels.
trait DeviceElement: Num + DeviceRepr + ValidAsZeroBits {
    /// The type full sums are accumulated in on the device.
    type Partial: DeviceRepr + ValidAsZeroBits;
    fn wrap(slice: CudaSlice<Self>) -> CudaData;
}

impl DeviceElement for f32 {
    type Partial = f64;
    fn wrap(slice: CudaSlice<Self>) -> CudaData {
        CudaData::F32(slice)
    }
}

impl DeviceElement for f64 {
    type Partial = f64;
    fn wrap(slice: CudaSlice<Self>) -> CudaData {
        CudaData::F64(slice)
    }
}

impl DeviceElement for i64 {
    type Partial = i64;
    fn wrap(slice: CudaSlice<Self>) -> CudaData {
        CudaData::I64(slice)
    }
}

/// Runs `$body` with `$v` the typed slice of `$s` and `$T` its element type.
macro_rules! with_slice {
    ($s:expr, |$v:ident: $T:ident| $body:expr) => {
        match &$s.data {
            CudaData::F32($v) => {
                type $T = f32;
                $body
            }
            CudaData::F64($v) => {
                type $T = f64;
                $body
            }
            CudaData::I64($v) => {
                type $T = i64;
                $body
            }
        }
    };
}

/// Like `with_slice!` for two storages that must share a dtype.
macro_rules! with_pair {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident: $T:ident| $body:expr) => {
        match (&$a.data, &$b.data) {
            (CudaData::F32($x), CudaData::F32($y)) => {
                type $T = f32;
                $body
            }
            (CudaData::F64($x), CudaData::F64($y)) => {
                type $T = f64;
                $body
            }
            (CudaData::I64($x), CudaData::I64($y)) => {
                type $T = i64;
                $body
            }
            _ => Err(Error::DTypeMismatch {
                op: $op,
                lhs: $a.dtype(),
                rhs: $b.dtype(),
            }),
        }
    };
}

fn drv(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        message: e.to_string(),
    }
}

fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn storage<T: DeviceElement>(be: &Arc<Backend>, slice: CudaSlice<T>, len: usize) -> CudaStorage {
    CudaStorage {
        backend: be.clone(),
        data: T::wrap(slice),
        len,
    }
}

/// Device memory for `n` elements (at least one), left uninitialized: every
/// caller writes all `n` elements before anything reads them.
fn alloc<T: DeviceRepr>(be: &Backend, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: see above; nothing reads the memory before a kernel or copy fills it.
    unsafe { be.stream.alloc::<T>(n.max(1)) }.map_err(drv("allocating device memory"))
}

fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(be: &Backend, n: usize) -> Result<CudaSlice<T>> {
    be.stream
        .alloc_zeros::<T>(n.max(1))
        .map_err(drv("allocating device memory"))
}

fn u64_of(n: usize) -> u64 {
    n as u64
}

// Copies.

fn upload_typed<T: DeviceElement>(be: &Arc<Backend>, values: &[T]) -> Result<CudaStorage> {
    let mut dst = alloc::<T>(be, values.len())?;
    if !values.is_empty() {
        be.stream
            .memcpy_htod(values, &mut dst)
            .map_err(drv("copying to the device"))?;
    }
    Ok(storage(be, dst, values.len()))
}

/// A device copy of host storage.
pub(crate) fn upload(cpu: &CpuStorage, ordinal: usize) -> Result<CudaStorage> {
    let be = backend(ordinal)?;
    match cpu {
        CpuStorage::F32(v) => upload_typed(&be, v),
        CpuStorage::F64(v) => upload_typed(&be, v),
        CpuStorage::I64(v) => upload_typed(&be, v),
    }
}

fn download_typed<T: DeviceElement>(
    be: &Backend,
    src: &CudaSlice<T>,
    len: usize,
) -> Result<Vec<T>> {
    let mut out = try_alloc(len)?;
    out.resize(len, T::ZERO);
    if len > 0 {
        be.stream
            .memcpy_dtoh(&src.slice(0..len), &mut out)
            .map_err(drv("copying to the host"))?;
    }
    be.stream
        .synchronize()
        .map_err(drv("waiting for the device"))?;
    Ok(out)
}

/// A host copy of device storage (waits for queued work).
pub(crate) fn download(s: &CudaStorage) -> Result<CpuStorage> {
    let be = &s.backend;
    Ok(match &s.data {
        CudaData::F32(v) => CpuStorage::F32(download_typed(be, v, s.len)?),
        CudaData::F64(v) => CpuStorage::F64(download_typed(be, v, s.len)?),
        CudaData::I64(v) => CpuStorage::I64(download_typed(be, v, s.len)?),
    })
}

/// A copy on the same device.
pub(crate) fn try_clone(s: &CudaStorage) -> Result<CudaStorage> {
    let be = &s.backend;
    with_slice!(s, |v: T| {
        let copy = be
            .stream
            .clone_dtod(v)
            .map_err(drv("copying on the device"))?;
        Ok(storage::<T>(be, copy, s.len))
    })
}

// Construction.

fn fill_typed<T: DeviceElement>(be: &Arc<Backend>, n: usize, value: f64) -> Result<CudaStorage> {
    let v = T::from_scalar("full", value)?;
    if value.to_bits() == 0 {
        // All-zero bits: a memset, which needs no kernel (and so no NVRTC).
        return Ok(storage(be, alloc_zeros::<T>(be, n)?, n));
    }
    let mut out = alloc::<T>(be, n)?;
    if n > 0 {
        let f = be.function(&kernel_name("fill", T::DTYPE))?;
        let n64 = u64_of(n);
        let mut launch = be.stream.launch_builder(f);
        launch.arg(&mut out).arg(&v).arg(&n64);
        // SAFETY: fill_T(T* out, T v, u64 n) writes out[0..n]; out holds n elements.
        unsafe { launch.launch(grid(n)) }.map_err(drv("fill"))?;
    }
    Ok(storage(be, out, n))
}

/// `n` copies of `value` on device `ordinal`.
pub(crate) fn full(dtype: DType, n: usize, value: f64, ordinal: usize) -> Result<CudaStorage> {
    let be = backend(ordinal)?;
    match dtype {
        DType::F32 => fill_typed::<f32>(&be, n, value),
        DType::F64 => fill_typed::<f64>(&be, n, value),
        DType::I64 => fill_typed::<i64>(&be, n, value),
    }
}

// Elementwise operations.

fn binary_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    op: BinaryOp,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    n: usize,
) -> Result<CudaStorage> {
    let mut out = alloc::<T>(be, n)?;
    if n == 0 {
        return Ok(storage(be, out, n));
    }
    let f = be.function(&kernel_name(&format!("binary_{}", op.name()), T::DTYPE))?;
    let n64 = u64_of(n);
    let int_div = op == BinaryOp::Div && T::DTYPE == DType::I64;
    let mut err_flag = if int_div {
        Some(alloc_zeros::<i32>(be, 1)?)
    } else {
        None
    };
    let mut launch = be.stream.launch_builder(f);
    launch.arg(a).arg(b).arg(&mut out).arg(&n64);
    if let Some(flag) = err_flag.as_mut() {
        launch.arg(flag);
    }
    // SAFETY: binary_<op>_T(const T* a, const T* b, T* out, u64 n[, int* err])
    // reads a[0..n], b[0..n] and writes out[0..n]; all hold n elements.
    unsafe { launch.launch(grid(n)) }.map_err(drv("elementwise kernel"))?;
    if let Some(flag) = err_flag {
        let flag = be
            .stream
            .clone_dtoh(&flag)
            .map_err(drv("reading the division flag"))?;
        if flag.first().copied().unwrap_or(0) != 0 {
            return Err(Error::DivisionByZero { op: "div" });
        }
    }
    Ok(storage(be, out, n))
}

/// `a op b`, elementwise.
pub(crate) fn binary(op: BinaryOp, a: &CudaStorage, b: &CudaStorage) -> Result<CudaStorage> {
    let be = &a.backend;
    with_pair!(op.name(), a, b, |x, y: T| binary_typed::<T>(
        be, op, x, y, a.len
    ))
}

fn binary_scalar_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    op: BinaryOp,
    a: &CudaSlice<T>,
    scalar: f64,
    n: usize,
) -> Result<CudaStorage> {
    let s = T::from_scalar(op.scalar_name(), scalar)?;
    if op == BinaryOp::Div && T::DTYPE == DType::I64 && s.is_zero() {
        return Err(Error::DivisionByZero {
            op: op.scalar_name(),
        });
    }
    let mut out = alloc::<T>(be, n)?;
    if n > 0 {
        let f = be.function(&kernel_name(&format!("scalar_{}", op.name()), T::DTYPE))?;
        let n64 = u64_of(n);
        let mut launch = be.stream.launch_builder(f);
        launch.arg(a).arg(&s).arg(&mut out).arg(&n64);
        // SAFETY: scalar_<op>_T(const T* a, T s, T* out, u64 n) reads a[0..n], writes out[0..n].
        unsafe { launch.launch(grid(n)) }.map_err(drv("elementwise kernel"))?;
    }
    Ok(storage(be, out, n))
}

/// `a op scalar`, elementwise.
pub(crate) fn binary_scalar(op: BinaryOp, a: &CudaStorage, scalar: f64) -> Result<CudaStorage> {
    let be = &a.backend;
    with_slice!(a, |v: T| binary_scalar_typed::<T>(be, op, v, scalar, a.len))
}

fn unary_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    op: UnaryOp,
    a: &CudaSlice<T>,
    n: usize,
) -> Result<CudaStorage> {
    if op.float_only() && !T::DTYPE.is_float() {
        return Err(Error::UnsupportedDType {
            op: op.name(),
            dtype: T::DTYPE,
            needs: "a float dtype (f32 or f64)",
        });
    }
    let mut out = alloc::<T>(be, n)?;
    if n > 0 {
        let f = be.function(&kernel_name(&format!("unary_{}", op.name()), T::DTYPE))?;
        let n64 = u64_of(n);
        let mut launch = be.stream.launch_builder(f);
        launch.arg(a).arg(&mut out).arg(&n64);
        // SAFETY: unary_<op>_T(const T* a, T* out, u64 n) reads a[0..n], writes out[0..n].
        unsafe { launch.launch(grid(n)) }.map_err(drv("elementwise kernel"))?;
    }
    Ok(storage(be, out, n))
}

pub(crate) fn unary(op: UnaryOp, a: &CudaStorage) -> Result<CudaStorage> {
    let be = &a.backend;
    with_slice!(a, |v: T| unary_typed::<T>(be, op, v, a.len))
}

fn axpy_typed<T: DeviceElement>(
    be: &Backend,
    y: &mut CudaSlice<T>,
    alpha: f64,
    x: &CudaSlice<T>,
    n: usize,
) -> Result<()> {
    let alpha = T::from_scalar("axpy", alpha)?;
    if n == 0 {
        return Ok(());
    }
    let f = be.function(&kernel_name("axpy", T::DTYPE))?;
    let n64 = u64_of(n);
    let mut launch = be.stream.launch_builder(f);
    launch.arg(y).arg(x).arg(&alpha).arg(&n64);
    // SAFETY: axpy_T(T* y, const T* x, T alpha, u64 n) updates y[0..n] from x[0..n].
    unsafe { launch.launch(grid(n)) }.map_err(drv("axpy"))?;
    Ok(())
}

/// `y += alpha * x` in place.
pub(crate) fn axpy(y: &mut CudaStorage, alpha: f64, x: &CudaStorage) -> Result<()> {
    let (be, n) = (y.backend.clone(), y.len);
    match (&mut y.data, &x.data) {
        (CudaData::F32(y), CudaData::F32(x)) => axpy_typed(&be, y, alpha, x, n),
        (CudaData::F64(y), CudaData::F64(x)) => axpy_typed(&be, y, alpha, x, n),
        (CudaData::I64(y), CudaData::I64(x)) => axpy_typed(&be, y, alpha, x, n),
        _ => Err(Error::DTypeMismatch {
            op: "axpy",
            lhs: y.dtype(),
            rhs: x.dtype(),
        }),
    }
}

fn scale_typed<T: DeviceElement>(
    be: &Backend,
    y: &mut CudaSlice<T>,
    alpha: f64,
    n: usize,
) -> Result<()> {
    let alpha = T::from_scalar("scale_assign", alpha)?;
    if n == 0 {
        return Ok(());
    }
    let f = be.function(&kernel_name("scale", T::DTYPE))?;
    let n64 = u64_of(n);
    let mut launch = be.stream.launch_builder(f);
    launch.arg(y).arg(&alpha).arg(&n64);
    // SAFETY: scale_T(T* y, T alpha, u64 n) updates y[0..n].
    unsafe { launch.launch(grid(n)) }.map_err(drv("scale"))?;
    Ok(())
}

/// `y *= alpha` in place.
pub(crate) fn scale(y: &mut CudaStorage, alpha: f64) -> Result<()> {
    let (be, n) = (y.backend.clone(), y.len);
    match &mut y.data {
        CudaData::F32(y) => scale_typed(&be, y, alpha, n),
        CudaData::F64(y) => scale_typed(&be, y, alpha, n),
        CudaData::I64(y) => scale_typed(&be, y, alpha, n),
    }
}

// Matrix multiplication.

fn cublas_dim(d: usize) -> Result<i32> {
    i32::try_from(d).map_err(|_| Error::Cuda {
        op: "matmul",
        message: format!("dimension {d} exceeds cuBLAS's 32-bit limit"),
    })
}

fn gemm_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<CudaStorage>
where
    CudaBlas: Gemm<T>,
{
    let (mi, ki, ni) = (cublas_dim(m)?, cublas_dim(k)?, cublas_dim(n)?);
    let mut c = alloc::<T>(be, m * n)?;
    // cuBLAS is column-major. A row-major [r, c] buffer read column-major is
    // its transpose, so row-major C = A B is column-major C^T = B^T A^T:
    // swap the operands and the roles of m and n, no transposes needed.
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: ni,
        n: mi,
        k: ki,
        alpha: T::ONE,
        lda: ni,
        ldb: ki,
        beta: T::ZERO,
        ldc: ni,
    };
    let blas = be.blas()?;
    // SAFETY: b holds k*n elements (ld n), a holds m*k (ld k), c holds m*n
    // (ld n); all dims are nonzero (the caller handles empty products).
    unsafe { blas.gemm(cfg, b, a, &mut c) }.map_err(|e| Error::Cuda {
        op: "matmul (cuBLAS gemm)",
        message: e.to_string(),
    })?;
    Ok(storage(be, c, m * n))
}

fn matmul_i64(
    be: &Arc<Backend>,
    a: &CudaSlice<i64>,
    b: &CudaSlice<i64>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<CudaStorage> {
    let mut c = alloc::<i64>(be, m * n)?;
    let f = be.function(&kernel_name("matmul", DType::I64))?;
    let (m64, k64, n64) = (u64_of(m), u64_of(k), u64_of(n));
    let mut launch = be.stream.launch_builder(f);
    launch
        .arg(a)
        .arg(b)
        .arg(&mut c)
        .arg(&m64)
        .arg(&k64)
        .arg(&n64);
    // SAFETY: matmul_i64(a, b, c, m, k, n) reads a[0..m*k], b[0..k*n], writes c[0..m*n].
    unsafe { launch.launch(grid(m * n)) }.map_err(drv("matmul"))?;
    Ok(storage(be, c, m * n))
}

/// `[m, k] x [k, n] -> [m, n]`, row-major.
pub(crate) fn matmul(
    a: &CudaStorage,
    b: &CudaStorage,
    m: usize,
    k: usize,
    n: usize,
) -> Result<CudaStorage> {
    let be = &a.backend;
    if m == 0 || n == 0 || k == 0 {
        // An empty product, or a sum of nothing: zeros without cuBLAS.
        return full(a.dtype(), m * n, 0.0, be.ordinal);
    }
    match (&a.data, &b.data) {
        (CudaData::F32(x), CudaData::F32(y)) => gemm_typed(be, x, y, m, k, n),
        (CudaData::F64(x), CudaData::F64(y)) => gemm_typed(be, x, y, m, k, n),
        (CudaData::I64(x), CudaData::I64(y)) => matmul_i64(be, x, y, m, k, n),
        _ => Err(Error::DTypeMismatch {
            op: "matmul",
            lhs: a.dtype(),
            rhs: b.dtype(),
        }),
    }
}

// Reductions.

fn reduce_all_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    a: &CudaSlice<T>,
    n: usize,
    mean: bool,
) -> Result<CudaStorage> {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, SUM_BLOCKS);
    let mut partial = alloc::<T::Partial>(be, blocks)?;
    let mut out = alloc::<T>(be, 1)?;
    let n64 = u64_of(n);
    let partials = if n == 0 { 0 } else { u64_of(blocks) };
    if n > 0 {
        let f = be.function(&kernel_name("sum_partial", T::DTYPE))?;
        let mut launch = be.stream.launch_builder(f);
        launch.arg(a).arg(&mut partial).arg(&n64);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: sum_partial_T(in, partial, n) reads in[0..n] and writes
        // partial[0..gridDim.x]; partial holds `blocks` elements; blockDim is BLOCK.
        unsafe { launch.launch(cfg) }.map_err(drv("sum"))?;
    }
    let divisor = if mean { n as f64 } else { 1.0 };
    let f = be.function(&kernel_name("sum_final", T::DTYPE))?;
    let mut launch = be.stream.launch_builder(f);
    launch
        .arg(&partial)
        .arg(&mut out)
        .arg(&partials)
        .arg(&divisor);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: sum_final_T(partial, out, n, divisor) reads partial[0..n] (n is
    // `blocks` or 0) and writes out[0]; one block of BLOCK threads.
    unsafe { launch.launch(cfg) }.map_err(drv("sum"))?;
    Ok(storage(be, out, 1))
}

/// The sum (or mean) of all elements, as one element.
pub(crate) fn reduce_all(a: &CudaStorage, mean: bool) -> Result<CudaStorage> {
    let be = &a.backend;
    with_slice!(a, |v: T| reduce_all_typed::<T>(be, v, a.len, mean))
}

fn reduce_dim_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    a: &CudaSlice<T>,
    (outer, d, inner): (usize, usize, usize),
    mean: bool,
) -> Result<CudaStorage> {
    let n = outer * inner;
    let mut out = alloc::<T>(be, n)?;
    if n > 0 {
        let f = be.function(&kernel_name("reduce_dim", T::DTYPE))?;
        let (o64, d64, i64_) = (u64_of(outer), u64_of(d), u64_of(inner));
        let divisor = if mean { d as f64 } else { 1.0 };
        let mut launch = be.stream.launch_builder(f);
        launch
            .arg(a)
            .arg(&mut out)
            .arg(&o64)
            .arg(&d64)
            .arg(&i64_)
            .arg(&divisor);
        // SAFETY: reduce_dim_T reads in[0..outer*d*inner], writes out[0..outer*inner].
        unsafe { launch.launch(grid(n)) }.map_err(drv("sum_dim"))?;
    }
    Ok(storage(be, out, n))
}

/// Sum (or mean) over the middle dimension of `[outer, d, inner]`.
pub(crate) fn reduce_dim(
    a: &CudaStorage,
    outer: usize,
    d: usize,
    inner: usize,
    mean: bool,
) -> Result<CudaStorage> {
    let be = &a.backend;
    with_slice!(a, |v: T| reduce_dim_typed::<T>(
        be,
        v,
        (outer, d, inner),
        mean
    ))
}

// Layout.

fn narrow_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    a: &CudaSlice<T>,
    (outer, d, inner): (usize, usize, usize),
    start: usize,
    len: usize,
) -> Result<CudaStorage> {
    let n = outer * len * inner;
    let mut out = alloc::<T>(be, n)?;
    if n > 0 {
        let f = be.function(&kernel_name("narrow", T::DTYPE))?;
        let args = [outer, d, start, len, inner].map(u64_of);
        let mut launch = be.stream.launch_builder(f);
        launch.arg(a).arg(&mut out);
        for v in &args {
            launch.arg(v);
        }
        // SAFETY: narrow_T reads in[0..outer*d*inner] (start + len <= d, checked
        // by the tensor layer) and writes out[0..outer*len*inner].
        unsafe { launch.launch(grid(n)) }.map_err(drv("narrow"))?;
    }
    Ok(storage(be, out, n))
}

/// Indices `start..start + len` of the middle dimension of `[outer, d, inner]`.
pub(crate) fn narrow(
    a: &CudaStorage,
    outer: usize,
    d: usize,
    inner: usize,
    start: usize,
    len: usize,
) -> Result<CudaStorage> {
    let be = &a.backend;
    with_slice!(a, |v: T| narrow_typed::<T>(
        be,
        v,
        (outer, d, inner),
        start,
        len
    ))
}

fn cat_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    parts: &[(&CudaStorage, usize)],
    outer: usize,
    inner: usize,
    total: usize,
    pick: impl Fn(&CudaData) -> Option<&CudaSlice<T>>,
) -> Result<CudaStorage> {
    let n = outer * total * inner;
    let mut out = alloc::<T>(be, n)?;
    let f = be.function(&kernel_name("place", T::DTYPE))?;
    let mut offset = 0usize;
    for (part, len) in parts {
        let src = pick(&part.data).ok_or(Error::DTypeMismatch {
            op: "cat",
            lhs: T::DTYPE,
            rhs: part.dtype(),
        })?;
        let chunk = outer * len * inner;
        if chunk > 0 {
            let args = [outer, *len, total, offset, inner].map(u64_of);
            let mut launch = be.stream.launch_builder(f);
            launch.arg(src).arg(&mut out);
            for v in &args {
                launch.arg(v);
            }
            // SAFETY: place_T reads in[0..outer*len*inner] and writes inside
            // out[0..outer*total*inner] (offset + len <= total).
            unsafe { launch.launch(grid(chunk)) }.map_err(drv("cat"))?;
        }
        offset += len;
    }
    Ok(storage(be, out, n))
}

/// Concatenation along the middle dimension of `[outer, len_p, inner]` parts.
pub(crate) fn cat(
    parts: &[(&CudaStorage, usize)],
    outer: usize,
    inner: usize,
    total: usize,
) -> Result<CudaStorage> {
    let Some((first, _)) = parts.first() else {
        return Err(Error::EmptyCat);
    };
    let be = &first.backend;
    if let Some((other, _)) = parts.iter().find(|(p, _)| p.ordinal() != be.ordinal) {
        return Err(Error::DeviceMismatch {
            op: "cat",
            lhs: crate::Device::Cuda(be.ordinal),
            rhs: crate::Device::Cuda(other.ordinal()),
        });
    }
    match first.dtype() {
        DType::F32 => cat_typed::<f32>(be, parts, outer, inner, total, |d| match d {
            CudaData::F32(s) => Some(s),
            _ => None,
        }),
        DType::F64 => cat_typed::<f64>(be, parts, outer, inner, total, |d| match d {
            CudaData::F64(s) => Some(s),
            _ => None,
        }),
        DType::I64 => cat_typed::<i64>(be, parts, outer, inner, total, |d| match d {
            CudaData::I64(s) => Some(s),
            _ => None,
        }),
    }
}

fn transpose_typed<T: DeviceElement>(
    be: &Arc<Backend>,
    a: &CudaSlice<T>,
    rows: usize,
    cols: usize,
) -> Result<CudaStorage> {
    let n = rows * cols;
    let mut out = alloc::<T>(be, n)?;
    if n > 0 {
        let f = be.function(&kernel_name("transpose", T::DTYPE))?;
        let (r64, c64) = (u64_of(rows), u64_of(cols));
        let mut launch = be.stream.launch_builder(f);
        launch.arg(a).arg(&mut out).arg(&r64).arg(&c64);
        // SAFETY: transpose_T reads in[0..rows*cols] and writes out[0..rows*cols].
        unsafe { launch.launch(grid(n)) }.map_err(drv("transpose"))?;
    }
    Ok(storage(be, out, n))
}

/// `[rows, cols] -> [cols, rows]`.
pub(crate) fn transpose(a: &CudaStorage, rows: usize, cols: usize) -> Result<CudaStorage> {
    let be = &a.backend;
    with_slice!(a, |v: T| transpose_typed::<T>(be, v, rows, cols))
}
