//! Tensors on meshes: [`TensorEngine`] and [`Tensor`].
//!
//! The host keeps every tensor on the procs of a mesh; the program holds
//! handles. A [`TensorEngine`] runs a native tensor worker on every proc of
//! a [`ProcMesh`], and lays each tensor out over that mesh by a
//! [`Sharding`]: whole on every rank, split along one tensor dimension
//! over one mesh dimension, or held as partial sums.
//!
//! Ops ([`Tensor::add`], [`Tensor::matmul`], [`Tensor::sum`]...) return a
//! new tensor at once and run on every rank in the order they were made,
//! so a program queues a whole step without waiting (the operators work
//! too: `&a + &b`, `&a * 0.5`, `-&a`). Only
//! [`Tensor::all_reduce`], [`Tensor::fetch`], [`Tensor::fetch_shard`],
//! [`Tensor::sync`] and [`Tensor::send_shard`] are [`Call`]s to await.
//!
//! An op that fails on a rank (shapes that do not match, an integer
//! division by zero, no CUDA device) **poisons** its result and everything
//! computed from it; the error, naming the op, comes back from the next
//! wait on a poisoned tensor, as a [`CallError`].
//!
//! ```
//! # async fn example() -> Result<(), String> {
//! use monarch_guest::prelude::*;
//! use monarch_guest::tensor::{DType, Sharding, TensorEngine};
//!
//! let procs = spawn_procs(&extent!(procs = 4))?;
//! let engine = TensorEngine::spawn(&procs)?;
//! let rows = Sharding::shard("procs", 0);
//! let x = engine.normal(&[256, 8], 0.0, 1.0, 42, DType::F32, rows);
//! let w = engine.zeros(&[8, 1], DType::F32, Sharding::Replicate);
//! let g = x.t().matmul(&x.matmul(&w));   // [8, 1], partial sums over `procs`
//! g.all_reduce("procs").await?;          // now the replicated total
//! w.axpy(-0.01, &g);                     // w -= 0.01 g, on every rank
//! let w_now: Vec<f32> = w.fetch().await?;
//! # let _ = w_now; Ok(()) }
//! ```
//!
//! Dropping the last handle of a tensor frees it on every rank; dropping
//! the engine and its tensors stops the workers.

use std::fmt;
use std::rc::Rc;

use crate::bindings::monarch::host::tensor as wit;
use crate::call::{Call, Done, decode_raw, decode_unit};
use crate::{CallError, MeshError, ProcMesh};

/// Element types. Elements travel as little-endian bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i64`.
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I64 => "i64",
        })
    }
}

impl From<DType> for wit::Dtype {
    fn from(d: DType) -> Self {
        match d {
            DType::F32 => wit::Dtype::Float32,
            DType::F64 => wit::Dtype::Float64,
            DType::I64 => wit::Dtype::Int64,
        }
    }
}

impl From<wit::Dtype> for DType {
    fn from(d: wit::Dtype) -> Self {
        match d {
            wit::Dtype::Float32 => DType::F32,
            wit::Dtype::Float64 => DType::F64,
            wit::Dtype::Int64 => DType::I64,
        }
    }
}

/// The element types a tensor holds, for typed fetches and uploads.
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The dtype of this type.
    const DTYPE: DType;
    /// Appends the little-endian bytes of `self`.
    fn put(self, out: &mut Vec<u8>);
    /// Reads one element from exactly `DTYPE.size_of()` bytes.
    fn get(bytes: &[u8]) -> Self;
    /// The value as an `f64` (an `i64` beyond 2^53 rounds).
    fn to_f64(self) -> f64;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i64 {}
}

macro_rules! element {
    ($t:ty, $d:expr, $n:literal) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                let mut raw = [0u8; $n];
                raw.copy_from_slice(&bytes[..$n]);
                <$t>::from_le_bytes(raw)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    };
}

element!(f32, DType::F32, 4);
element!(f64, DType::F64, 8);
element!(i64, DType::I64, 8);

/// Where each shard lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory of the shard's proc.
    Cpu,
    /// The CUDA device with this ordinal on the shard's host.
    Cuda(u32),
}

impl std::str::FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device; use cpu, cuda or cuda:N")),
        }
    }
}

impl From<Device> for wit::Device {
    fn from(d: Device) -> Self {
        match d {
            Device::Cpu => wit::Device::Cpu,
            Device::Cuda(n) => wit::Device::Cuda(n),
        }
    }
}

impl From<wit::Device> for Device {
    fn from(d: wit::Device) -> Self {
        match d {
            wit::Device::Cpu => Device::Cpu,
            wit::Device::Cuda(n) => Device::Cuda(n),
        }
    }
}

/// How a global tensor is laid out over the engine's mesh. Mesh dimensions
/// are named as in the proc mesh's extent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// Every rank holds the whole tensor.
    Replicate,
    /// Split along `tensor_dim` over the ranks of `mesh_dim`; the first
    /// `n % k` blocks get one extra element when the size does not divide.
    Shard {
        /// The mesh dimension, by name.
        mesh_dim: String,
        /// The tensor dimension that is split.
        tensor_dim: u32,
    },
    /// The tensor is the sum over `mesh_dim` of the ranks' tensors;
    /// [`Tensor::all_reduce`] makes it replicated.
    Partial(String),
}

impl Sharding {
    /// Split along `tensor_dim` over `mesh_dim`.
    pub fn shard(mesh_dim: &str, tensor_dim: u32) -> Sharding {
        Sharding::Shard {
            mesh_dim: mesh_dim.to_string(),
            tensor_dim,
        }
    }

    /// Partial sums over `mesh_dim`.
    pub fn partial(mesh_dim: &str) -> Sharding {
        Sharding::Partial(mesh_dim.to_string())
    }
}

impl From<&Sharding> for wit::Sharding {
    fn from(s: &Sharding) -> Self {
        match s {
            Sharding::Replicate => wit::Sharding::Replicate,
            Sharding::Shard {
                mesh_dim,
                tensor_dim,
            } => wit::Sharding::Shard(wit::ShardSpec {
                mesh_dim: mesh_dim.clone(),
                tensor_dim: *tensor_dim,
            }),
            Sharding::Partial(dim) => wit::Sharding::Partial(dim.clone()),
        }
    }
}

impl From<wit::Sharding> for Sharding {
    fn from(s: wit::Sharding) -> Self {
        match s {
            wit::Sharding::Replicate => Sharding::Replicate,
            wit::Sharding::Shard(spec) => Sharding::Shard {
                mesh_dim: spec.mesh_dim,
                tensor_dim: spec.tensor_dim,
            },
            wit::Sharding::Partial(dim) => Sharding::Partial(dim),
        }
    }
}

/// What a new tensor holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element this value.
    Full(f64),
    /// Uniform in `[low, high)`, from `seed`: the same global tensor for
    /// every sharding.
    Uniform {
        /// Lowest value.
        low: f64,
        /// Values are below this.
        high: f64,
        /// The seed.
        seed: u64,
    },
    /// Normal with `mean` and `std`, from `seed`.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
        /// The seed.
        seed: u64,
    },
    /// The little-endian bytes of the whole global tensor.
    Bytes(Vec<u8>),
}

impl From<Init> for wit::Init {
    fn from(init: Init) -> Self {
        match init {
            Init::Zeros => wit::Init::Zeros,
            Init::Ones => wit::Init::Ones,
            Init::Full(v) => wit::Init::Full(v),
            Init::Uniform { low, high, seed } => {
                wit::Init::Uniform(wit::Uniform { low, high, seed })
            }
            Init::Normal { mean, std, seed } => wit::Init::Normal(wit::Normal { mean, std, seed }),
            Init::Bytes(bytes) => wit::Init::FromBytes(bytes),
        }
    }
}

/// What the program knows of a tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The global dimensions.
    pub dims: Vec<u64>,
    /// The element type.
    pub dtype: DType,
    /// Where the shards live.
    pub device: Device,
    /// How it is laid out over the mesh.
    pub sharding: Sharding,
}

/// Native tensor workers on the procs of a [`ProcMesh`]; makes
/// [`Tensor`]s. Cheap to clone.
#[derive(Clone)]
pub struct TensorEngine {
    raw: Rc<wit::Engine>,
}

impl fmt::Debug for TensorEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorEngine")
            .field("handle", &self.raw.handle())
            .finish()
    }
}

impl TensorEngine {
    /// Starts a tensor worker on every proc of `procs`. The engine's mesh
    /// has the proc mesh's extent.
    pub fn spawn(procs: &ProcMesh) -> Result<TensorEngine, MeshError> {
        wit::Engine::spawn(procs.raw())
            .map(|raw| TensorEngine { raw: Rc::new(raw) })
            .map_err(|e| MeshError::new("starting a tensor engine", e))
    }

    /// A tensor of global shape `dims`, filled by `init`. An invalid
    /// request (an unknown mesh dimension, bytes that do not fill the
    /// shape) gives a poisoned tensor that says why at its first wait.
    pub fn create(
        &self,
        dims: &[u64],
        dtype: DType,
        device: Device,
        sharding: Sharding,
        init: Init,
    ) -> Tensor {
        Tensor::from_raw(self.raw.create(
            dims,
            dtype.into(),
            device.into(),
            &(&sharding).into(),
            &init.into(),
        ))
    }

    /// Zeros on the CPU.
    pub fn zeros(&self, dims: &[u64], dtype: DType, sharding: Sharding) -> Tensor {
        self.create(dims, dtype, Device::Cpu, sharding, Init::Zeros)
    }

    /// Ones on the CPU.
    pub fn ones(&self, dims: &[u64], dtype: DType, sharding: Sharding) -> Tensor {
        self.create(dims, dtype, Device::Cpu, sharding, Init::Ones)
    }

    /// Seeded normal values on the CPU.
    pub fn normal(
        &self,
        dims: &[u64],
        mean: f64,
        std: f64,
        seed: u64,
        dtype: DType,
        sharding: Sharding,
    ) -> Tensor {
        let init = Init::Normal { mean, std, seed };
        self.create(dims, dtype, Device::Cpu, sharding, init)
    }

    /// The tensor holding `values` (row-major, the whole global tensor) on
    /// `device`; every rank gets its shard.
    pub fn from_slice<T: Element>(
        &self,
        values: &[T],
        dims: &[u64],
        device: Device,
        sharding: Sharding,
    ) -> Tensor {
        let mut bytes = Vec::with_capacity(values.len() * T::DTYPE.size_of());
        values.iter().for_each(|v| v.put(&mut bytes));
        self.create(dims, T::DTYPE, device, sharding, Init::Bytes(bytes))
    }

    /// Completes when every op made so far has run on every rank.
    pub fn sync(&self) -> Call<()> {
        Call::in_flight(self.raw.sync(), decode_unit)
    }
}

/// A tensor on an engine's mesh. Clones are handles to the same tensor;
/// dropping the last frees it on every rank, after the ops already made
/// from it.
#[derive(Clone)]
pub struct Tensor {
    raw: Rc<wit::Tensor>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("handle", &self.raw.handle())
            .field("layout", &self.layout())
            .finish()
    }
}

impl Tensor {
    fn from_raw(raw: wit::Tensor) -> Tensor {
        Tensor { raw: Rc::new(raw) }
    }

    /// Shape, dtype, device and sharding.
    pub fn layout(&self) -> Layout {
        let raw = self.raw.layout();
        Layout {
            dims: raw.dims,
            dtype: raw.dtype.into(),
            device: raw.device.into(),
            sharding: raw.sharding.into(),
        }
    }

    /// The global dimensions.
    pub fn dims(&self) -> Vec<u64> {
        self.raw.layout().dims
    }

    fn binary(&self, op: wit::BinaryOp, other: &Tensor) -> Tensor {
        Tensor::from_raw(self.raw.binary(op, &other.raw))
    }

    fn scalar(&self, op: wit::BinaryOp, value: f64) -> Tensor {
        Tensor::from_raw(self.raw.scalar(op, value))
    }

    /// `self + other`, elementwise (equal shapes, dtypes and shardings).
    pub fn add(&self, other: &Tensor) -> Tensor {
        self.binary(wit::BinaryOp::Add, other)
    }

    /// `self - other`, elementwise.
    pub fn sub(&self, other: &Tensor) -> Tensor {
        self.binary(wit::BinaryOp::Sub, other)
    }

    /// `self * other`, elementwise.
    pub fn mul(&self, other: &Tensor) -> Tensor {
        self.binary(wit::BinaryOp::Mul, other)
    }

    /// `self / other`, elementwise.
    pub fn div(&self, other: &Tensor) -> Tensor {
        self.binary(wit::BinaryOp::Div, other)
    }

    /// `self + value`.
    pub fn add_scalar(&self, value: f64) -> Tensor {
        self.scalar(wit::BinaryOp::Add, value)
    }

    /// `self - value`.
    pub fn sub_scalar(&self, value: f64) -> Tensor {
        self.scalar(wit::BinaryOp::Sub, value)
    }

    /// `self * value`.
    pub fn mul_scalar(&self, value: f64) -> Tensor {
        self.scalar(wit::BinaryOp::Mul, value)
    }

    /// `self / value`.
    pub fn div_scalar(&self, value: f64) -> Tensor {
        self.scalar(wit::BinaryOp::Div, value)
    }

    /// `-self`.
    pub fn neg(&self) -> Tensor {
        Tensor::from_raw(self.raw.unary(wit::UnaryOp::Neg))
    }

    /// `max(self, 0)`.
    pub fn relu(&self) -> Tensor {
        Tensor::from_raw(self.raw.unary(wit::UnaryOp::Relu))
    }

    /// `e^self` (floats).
    pub fn exp(&self) -> Tensor {
        Tensor::from_raw(self.raw.unary(wit::UnaryOp::Exp))
    }

    /// `self other` (2-D) on local shards: rows of `self` split, columns of
    /// `other` split, or the inner dimension split on both, which leaves
    /// partial sums.
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        Tensor::from_raw(self.raw.matmul(&other.raw))
    }

    /// The transpose (2-D); a split dimension moves with it.
    pub fn t(&self) -> Tensor {
        Tensor::from_raw(self.raw.transpose())
    }

    /// The sum of every element, a rank-0 tensor. Summing a split tensor
    /// leaves partial sums.
    pub fn sum(&self) -> Tensor {
        Tensor::from_raw(self.raw.sum(None))
    }

    /// The sum along `dim`, which goes away.
    pub fn sum_dim(&self, dim: u32) -> Tensor {
        Tensor::from_raw(self.raw.sum(Some(dim)))
    }

    /// A copy.
    pub fn copy(&self) -> Tensor {
        Tensor::from_raw(self.raw.copy())
    }

    /// `self += alpha * x`, in place on every rank.
    pub fn axpy(&self, alpha: f64, x: &Tensor) {
        self.raw.axpy(alpha, &x.raw);
    }

    /// Copies `src`'s elements into `self`, in place.
    pub fn assign(&self, src: &Tensor) {
        self.raw.assign(&src.raw);
    }

    /// Sums `self` over the mesh dimension `mesh_dim`, in place: partial
    /// sums become the replicated total. Ops made after this call run after
    /// the sum, so awaiting it is needed only to see its error.
    pub fn all_reduce(&self, mesh_dim: &str) -> Call<()> {
        Call::in_flight(self.raw.all_reduce(mesh_dim), decode_unit)
    }

    /// The whole global tensor's elements, row-major, assembled from the
    /// shards (partial sums summed). `T` must be the tensor's dtype (else
    /// an [`Invalid`](crate::ErrorKind::Invalid) [`CallError`], without
    /// asking the host).
    pub fn fetch<T: Element>(&self) -> Call<Vec<T>> {
        match self.check_dtype::<T>("fetch") {
            Ok(()) => Call::in_flight(self.raw.fetch(), decode_elements::<T>),
            Err(e) => Call::refused(e),
        }
    }

    /// An error unless `T` is this tensor's element type.
    fn check_dtype<T: Element>(&self, what: &str) -> Result<(), CallError> {
        let dtype = self.layout().dtype;
        if dtype == T::DTYPE {
            Ok(())
        } else {
            Err(CallError::invalid(format!(
                "{what}::<{}> of a tensor of {dtype}: fetch it as {dtype}",
                T::DTYPE
            )))
        }
    }

    /// One value: the only element of a rank-0 (or one-element) tensor, as
    /// an `f64`.
    pub fn item(&self) -> Call<f64> {
        let decode = match self.layout().dtype {
            DType::F32 => decode_item::<f32>,
            DType::F64 => decode_item::<f64>,
            DType::I64 => decode_item::<i64>,
        };
        Call::in_flight(self.raw.fetch(), decode)
    }

    /// The elements of the shard that `rank` holds.
    pub fn fetch_shard<T: Element>(&self, rank: u32) -> Call<Vec<T>> {
        match self.check_dtype::<T>("fetch_shard") {
            Ok(()) => Call::in_flight(self.raw.fetch_shard(rank), decode_elements::<T>),
            Err(e) => Call::refused(e),
        }
    }

    /// Completes when this tensor has been computed on every rank; an error
    /// says why it could not be.
    pub fn sync(&self) -> Call<()> {
        Call::in_flight(self.raw.sync(), decode_unit)
    }

    /// Copies the shard that rank `from` holds of `self` into the shard that
    /// rank `to` holds of `dst`, from proc to proc through RDMA buffers
    /// (equal shard sizes and dtypes).
    pub fn send_shard(&self, from: u32, dst: &Tensor, to: u32) -> Call<()> {
        Call::in_flight(self.raw.send_shard(from, &dst.raw, to), decode_unit)
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        /// Elementwise, as the method of the same name: `&a + &b`.
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            fn $method(self, other: &Tensor) -> Tensor {
                self.binary(wit::BinaryOp::$op, other)
            }
        }

        /// With a scalar: `&a * 2.0`.
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Tensor;
            fn $method(self, value: f64) -> Tensor {
                self.scalar(wit::BinaryOp::$op, value)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}

/// Little-endian elements of type `T`.
pub(crate) fn elements<T: Element>(bytes: &[u8]) -> Result<Vec<T>, CallError> {
    let size = T::DTYPE.size_of();
    if !bytes.len().is_multiple_of(size) {
        return Err(CallError::decode(format!(
            "{} bytes are not whole {} elements",
            bytes.len(),
            T::DTYPE
        )));
    }
    Ok(bytes.chunks_exact(size).map(T::get).collect())
}

fn decode_elements<T: Element>(done: Done) -> Result<Vec<T>, CallError> {
    elements(&decode_raw(done)?)
}

fn decode_item<T: Element>(done: Done) -> Result<f64, CallError> {
    let values = decode_elements::<T>(done)?;
    match values.as_slice() {
        [one] => Ok(one.to_f64()),
        _ => Err(CallError::decode(format!(
            "item() needs a tensor of one element; this one has {}",
            values.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::monarch::host::types as wit_types;

    #[test]
    fn elements_round_trip_little_endian() {
        let mut bytes = Vec::new();
        [1.5f32, -2.0, 3.25].iter().for_each(|v| v.put(&mut bytes));
        assert_eq!(bytes[..4], 1.5f32.to_le_bytes());
        assert_eq!(elements::<f32>(&bytes), Ok(vec![1.5, -2.0, 3.25]));
        let mut ints = Vec::new();
        [-7i64, 1 << 40].iter().for_each(|v| v.put(&mut ints));
        assert_eq!(elements::<i64>(&ints), Ok(vec![-7, 1 << 40]));
    }

    #[test]
    fn bytes_of_the_wrong_length_are_a_decode_error() {
        assert_eq!(
            elements::<f64>(&[0u8; 12]).map_err(|e| e.kind()),
            Err(crate::ErrorKind::Decode)
        );
    }

    #[test]
    fn item_needs_exactly_one_element() {
        let one = Ok(wit_types::Reply::Single(2.5f64.to_le_bytes().to_vec()));
        assert_eq!(decode_item::<f64>(one), Ok(2.5));
        let two = Ok(wit_types::Reply::Single(vec![0u8; 16]));
        assert_eq!(
            decode_item::<f64>(two).map_err(|e| e.kind()),
            Err(crate::ErrorKind::Decode)
        );
    }

    #[test]
    fn devices_parse_as_users_write_them() {
        assert_eq!("cpu".parse(), Ok(Device::Cpu));
        assert_eq!("cuda".parse(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(Device::Cuda(3)));
        assert!("gpu".parse::<Device>().is_err());
    }

    #[test]
    fn host_errors_pass_through() {
        let failed = || {
            Err(wit_types::CallError {
                kind: wit_types::ErrorKind::Endpoint,
                origin: Some(wit_types::Origin {
                    mesh: "tensor<1>".into(),
                    rank: 2,
                    endpoint: None,
                }),
                message: "tensor 5 is poisoned".into(),
                type_name: None,
                backtrace: None,
            })
        };
        assert_eq!(
            decode_unit(failed()),
            Err(CallError::from(failed().unwrap_err()))
        );
        let err = decode_unit(failed()).unwrap_err();
        assert_eq!(
            (err.rank(), err.message()),
            (Some(2), "tensor 5 is poisoned")
        );
    }
}
