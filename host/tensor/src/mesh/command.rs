//! The commands a controller sends to tensor workers, as rkyv archives.
//!
//! Each command travels as the message of a [`hyperactor_mesh::MeshCall`]
//! to the endpoint [`Command::endpoint`] names (`tensor.create`,
//! `tensor.binary`...). Ids are chosen by the controller, so a command can
//! name the result of one sent just before it without waiting for it: the
//! workers handle commands in the order they were sent (the casts' FIFO,
//! CA-1).
//!
//! Workers validate every archive before reading it ([`Command::decode`]);
//! bytes that are not a command are an error reply, never a panic.

use hyperactor::{PortId, RemoteMessage};
use rkyv::rancor;
use rkyv::util::AlignedVec;

use super::sharding::Sharding;
use crate::{DType, Device};

/// A dtype on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireDType {
    /// [`DType::F32`].
    F32,
    /// [`DType::F64`].
    F64,
    /// [`DType::I64`].
    I64,
}

impl From<DType> for WireDType {
    fn from(dtype: DType) -> Self {
        match dtype {
            DType::F32 => WireDType::F32,
            DType::F64 => WireDType::F64,
            DType::I64 => WireDType::I64,
        }
    }
}

impl From<WireDType> for DType {
    fn from(dtype: WireDType) -> Self {
        match dtype {
            WireDType::F32 => DType::F32,
            WireDType::F64 => DType::F64,
            WireDType::I64 => DType::I64,
        }
    }
}

/// A device on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireDevice {
    /// [`Device::Cpu`].
    Cpu,
    /// [`Device::Cuda`] with this ordinal.
    Cuda(u64),
}

impl From<Device> for WireDevice {
    fn from(device: Device) -> Self {
        match device {
            Device::Cpu => WireDevice::Cpu,
            Device::Cuda(ordinal) => WireDevice::Cuda(ordinal as u64),
        }
    }
}

impl From<WireDevice> for Device {
    fn from(device: WireDevice) -> Self {
        match device {
            WireDevice::Cpu => Device::Cpu,
            WireDevice::Cuda(ordinal) => Device::Cuda(ordinal as usize),
        }
    }
}

/// What a new tensor holds. Every rank makes the same global tensor and
/// keeps its shard (see [`super::worker`]).
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Every element this value.
    Full(f64),
    /// [`crate::Tensor::rand_uniform`] of the global shape with this seed.
    Uniform {
        /// Lowest value.
        low: f64,
        /// Values are below this.
        high: f64,
        /// The seed.
        seed: u64,
    },
    /// [`crate::Tensor::rand_normal`] of the global shape with this seed.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
        /// The seed.
        seed: u64,
    },
    /// The little-endian bytes of the whole global tensor.
    FromBytes(Vec<u8>),
}

/// An elementwise operation of two operands (or of a tensor and a scalar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl BinaryOp {
    /// The operation's name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// An elementwise operation of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum UnaryOp {
    /// `-a`.
    Neg,
    /// `max(a, 0)`.
    Relu,
    /// `e^a` (floats).
    Exp,
}

impl UnaryOp {
    /// The operation's name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Relu => "relu",
            UnaryOp::Exp => "exp",
        }
    }
}

/// A command to the tensor workers. Tensors are named by ids (`u64`) the
/// controller chooses; an op's output id may be new or replace a tensor.
///
/// Ops never reply with an error: a failed op stores its reason under its
/// output id (the id is **poisoned**), an op with a poisoned input poisons
/// its output with the same reason, and the reason comes back from
/// [`Command::Fetch`] or [`Command::Sync`].
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum Command {
    /// Makes tensor `id`: the rank's shard of a global tensor of `dims`.
    Create {
        /// The new tensor.
        id: u64,
        /// What it holds.
        init: Init,
        /// The global dimensions.
        dims: Vec<u64>,
        /// The element type.
        dtype: WireDType,
        /// Where the shard lives.
        device: WireDevice,
        /// How the global tensor is laid out over the mesh.
        sharding: Sharding,
    },
    /// `out = a op b` on local shards.
    Binary {
        /// The result.
        out: u64,
        /// The operation.
        op: BinaryOp,
        /// Left operand.
        a: u64,
        /// Right operand.
        b: u64,
    },
    /// `out = a op value`.
    Scalar {
        /// The result.
        out: u64,
        /// The operation.
        op: BinaryOp,
        /// The tensor operand.
        a: u64,
        /// The scalar operand.
        value: f64,
    },
    /// `out = op(a)`.
    Unary {
        /// The result.
        out: u64,
        /// The operation.
        op: UnaryOp,
        /// The operand.
        a: u64,
    },
    /// `out = a b` on local shards (2-D).
    Matmul {
        /// The result.
        out: u64,
        /// Left operand, `[m, k]`.
        a: u64,
        /// Right operand, `[k, n]`.
        b: u64,
    },
    /// `out = aᵀ` (2-D).
    Transpose {
        /// The result.
        out: u64,
        /// The operand.
        a: u64,
    },
    /// `out` = the local sum of `a`: everything (a rank-0 tensor) or along
    /// `dim` (removed).
    Sum {
        /// The result.
        out: u64,
        /// The operand.
        a: u64,
        /// The dimension, or everything.
        dim: Option<u64>,
    },
    /// `y += alpha * x`, in place.
    Axpy {
        /// Updated in place.
        y: u64,
        /// The factor.
        alpha: f64,
        /// The addend.
        x: u64,
    },
    /// `out` = a copy of `a`.
    Copy {
        /// The copy.
        out: u64,
        /// The original.
        a: u64,
    },
    /// Copies `src`'s elements into `dst`'s storage, in place (equal
    /// shapes and dtypes; `dst` keeps its storage).
    Assign {
        /// Overwritten.
        dst: u64,
        /// Read.
        src: u64,
    },
    /// Forgets these tensors; unknown ids are ignored.
    Drop {
        /// The tensors.
        ids: Vec<u64>,
    },
    /// Replies with elements `start .. start + len` of the local shard
    /// (row-major), little-endian; a poisoned tensor replies its reason as
    /// an endpoint error.
    Fetch {
        /// The tensor.
        id: u64,
        /// The first element.
        start: u64,
        /// How many elements.
        len: u64,
    },
    /// Overwrites elements from `start` of the local shard with `bytes`
    /// (little-endian), in place; replies empty, or the error (which also
    /// poisons the tensor).
    Write {
        /// The tensor.
        id: u64,
        /// The first element written.
        start: u64,
        /// The elements.
        bytes: Vec<u8>,
    },
    /// Replies empty once every command sent before it has run, or with
    /// the reason of the first of `ids` that is poisoned or missing.
    Sync {
        /// The tensors to check.
        ids: Vec<u64>,
    },
}

/// Every endpoint of a tensor worker, in the order of [`Command`]'s variants.
pub const ENDPOINTS: [&str; 14] = [
    "tensor.create",
    "tensor.binary",
    "tensor.scalar",
    "tensor.unary",
    "tensor.matmul",
    "tensor.transpose",
    "tensor.sum",
    "tensor.axpy",
    "tensor.copy",
    "tensor.assign",
    "tensor.drop",
    "tensor.fetch",
    "tensor.write",
    "tensor.sync",
];

impl Command {
    /// The endpoint this command is sent to.
    pub fn endpoint(&self) -> &'static str {
        let index = match self {
            Command::Create { .. } => 0,
            Command::Binary { .. } => 1,
            Command::Scalar { .. } => 2,
            Command::Unary { .. } => 3,
            Command::Matmul { .. } => 4,
            Command::Transpose { .. } => 5,
            Command::Sum { .. } => 6,
            Command::Axpy { .. } => 7,
            Command::Copy { .. } => 8,
            Command::Assign { .. } => 9,
            Command::Drop { .. } => 10,
            Command::Fetch { .. } => 11,
            Command::Write { .. } => 12,
            Command::Sync { .. } => 13,
        };
        ENDPOINTS[index]
    }

    /// The command's archive: the message of its [`hyperactor_mesh::MeshCall`].
    pub fn encode(&self) -> Vec<u8> {
        let hint = match self {
            Command::Write { bytes, .. } => bytes.len() + 64,
            Command::Create {
                init: Init::FromBytes(bytes),
                dims,
                ..
            } => bytes.len() + 8 * dims.len() + 128,
            _ => 128,
        };
        // Serializing into a Vec cannot fail: it only grows the Vec, and
        // every field has a fixed archived form.
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, Vec::with_capacity(hint))
            .unwrap_or_default()
    }

    /// Validates an archive and decodes it.
    pub fn decode(bytes: &[u8]) -> Result<Command, String> {
        <Command as RemoteMessage>::decode(bytes)
            .map_err(|e| format!("the message is not a valid tensor command: {e}"))
    }

    /// Validates an archive and hands its archived form to `f`, without
    /// copying (bytes that are not 16-byte aligned are copied once to an
    /// aligned buffer first).
    pub fn with_archived<R>(
        bytes: &[u8],
        f: impl FnOnce(&ArchivedCommand) -> R,
    ) -> Result<R, String> {
        let fail = |e: rancor::Error| format!("the message is not a valid tensor command: {e}");
        if (bytes.as_ptr() as usize).is_multiple_of(16) {
            let archived = rkyv::access::<ArchivedCommand, rancor::Error>(bytes).map_err(fail)?;
            Ok(f(archived))
        } else {
            let mut aligned = AlignedVec::<16>::with_capacity(bytes.len());
            aligned.extend_from_slice(bytes);
            let archived =
                rkyv::access::<ArchivedCommand, rancor::Error>(&aligned).map_err(fail)?;
            Ok(f(archived))
        }
    }
}

/// The commands that move a shard between procs through RDMA buffers
/// ([`super::TensorMesh::send_shard`]). They go to the same workers through
/// the same casts as [`Command`]s, so they stay in order with ops.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum ShardCommand {
    /// Registers tensor `id`'s local shard with the process's RDMA manager
    /// under `lease` and replies with the buffer handle's bytes. A CPU
    /// shard is registered in place and held out of use until the
    /// [`ShardCommand::Release`]; other shards are copied to the host first.
    /// A poisoned or missing tensor replies its reason as an endpoint error.
    Lend {
        /// The tensor.
        id: u64,
        /// Names the registration for its release.
        lease: u64,
    },
    /// Overwrites tensor `id`'s whole local shard, in place, with the bytes
    /// of the buffer `handle` names (a one-sided READ, within `timeout_ms`);
    /// replies empty, or the error (a failed read also poisons the tensor).
    ReadInto {
        /// The tensor written.
        id: u64,
        /// The source buffer's handle bytes.
        handle: Vec<u8>,
        /// How long the read may take, in milliseconds.
        timeout_ms: u64,
    },
    /// Deregisters `lease` and puts its shard back; replies empty (also for
    /// an unknown lease).
    Release {
        /// The registration.
        lease: u64,
    },
}

/// Every endpoint of [`ShardCommand`], in the order of its variants.
pub const SHARD_ENDPOINTS: [&str; 3] = ["tensor.lend", "tensor.read_into", "tensor.release"];

impl ShardCommand {
    /// The endpoint this command is sent to.
    pub fn endpoint(&self) -> &'static str {
        let index = match self {
            ShardCommand::Lend { .. } => 0,
            ShardCommand::ReadInto { .. } => 1,
            ShardCommand::Release { .. } => 2,
        };
        SHARD_ENDPOINTS[index]
    }

    /// The command's archive.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing into a Vec cannot fail: it only grows the Vec.
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, Vec::with_capacity(512))
            .unwrap_or_default()
    }

    /// Validates an archive and decodes it.
    pub fn decode(bytes: &[u8]) -> Result<ShardCommand, String> {
        <ShardCommand as RemoteMessage>::decode(bytes)
            .map_err(|e| format!("the message is not a valid tensor shard command: {e}"))
    }
}

/// The commands of the ring all-reduce ([`super::TensorMesh::all_reduce`]
/// of large CPU shards; `worker/ring.rs`). They go to the same workers
/// through the same casts as [`Command`]s, so they stay in order with ops;
/// the chunks themselves go from worker to worker as [`RingMessage`]s.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum RingCommand {
    /// Replies with the archive of the [`PortId`] of the worker's ring
    /// port, where its ring neighbour sends [`RingMessage`]s (opened on
    /// the first ask, kept while the worker lives).
    Port,
    /// Sums tensor `id` over the ring `ports` (this rank sits at
    /// `position`), in place: a reduce-scatter then an all-gather, each
    /// `ports.len() - 1` steps, every step cut into chunks of at most
    /// `chunk_bytes`, with up to `window` of this rank's own chunks ahead
    /// of what it received. Replies empty, or the error (after which a
    /// shard that was written in part is poisoned).
    AllReduce {
        /// The tensor.
        id: u64,
        /// The run's number: messages of other runs are told apart by it.
        op: u64,
        /// Elements of every rank's shard.
        numel: u64,
        /// Their type.
        dtype: WireDType,
        /// This rank's place in `ports`.
        position: u32,
        /// The ring ports of the group's ranks, in ring order.
        ports: Vec<PortId>,
        /// The most bytes of one chunk.
        chunk_bytes: u64,
        /// How many of this rank's own chunks may be ahead.
        window: u32,
        /// How long the whole run may take, in milliseconds.
        timeout_ms: u64,
    },
}

/// Every endpoint of [`RingCommand`], in the order of its variants.
pub const RING_ENDPOINTS: [&str; 2] = ["tensor.ring_port", "tensor.ring_all_reduce"];

impl RingCommand {
    /// The endpoint this command is sent to.
    pub fn endpoint(&self) -> &'static str {
        match self {
            RingCommand::Port => RING_ENDPOINTS[0],
            RingCommand::AllReduce { .. } => RING_ENDPOINTS[1],
        }
    }

    /// The command's archive.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing into a Vec cannot fail: it only grows the Vec.
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, Vec::with_capacity(512))
            .unwrap_or_default()
    }

    /// Validates an archive and decodes it.
    pub fn decode(bytes: &[u8]) -> Result<RingCommand, String> {
        <RingCommand as RemoteMessage>::decode(bytes)
            .map_err(|e| format!("the message is not a valid tensor ring command: {e}"))
    }
}

/// What one worker of a ring all-reduce sends the next one, to its ring
/// port.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum RingMessage {
    /// Chunk `chunk` of step `step` of run `op`: steps `0 .. n - 1` are
    /// the reduce-scatter (partial sums), steps `n - 1 .. 2 (n - 1)` the
    /// all-gather (final sums); little-endian elements.
    Chunk {
        /// The run.
        op: u64,
        /// The step.
        step: u32,
        /// The chunk of the step's segment.
        chunk: u64,
        /// The elements.
        bytes: Vec<u8>,
    },
    /// Run `op` failed for `reason`: stop, pass it on once, reply it.
    Abort {
        /// The run.
        op: u64,
        /// Why.
        reason: String,
    },
}

impl RingMessage {
    /// The run it belongs to.
    pub fn op(&self) -> u64 {
        match self {
            RingMessage::Chunk { op, .. } | RingMessage::Abort { op, .. } => *op,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_and_garbage_is_an_error() {
        let commands = [
            Command::Create {
                id: 1,
                init: Init::Normal {
                    mean: 0.0,
                    std: 1.0,
                    seed: 7,
                },
                dims: vec![3, 4],
                dtype: WireDType::F32,
                device: WireDevice::Cpu,
                sharding: Sharding::Shard {
                    mesh_dim: 0,
                    tensor_dim: 1,
                },
            },
            Command::Sum {
                out: 2,
                a: 1,
                dim: Some(0),
            },
            Command::Write {
                id: 2,
                start: 3,
                bytes: vec![1, 2, 3, 4],
            },
        ];
        for command in commands {
            let bytes = command.encode();
            assert_eq!(Command::decode(&bytes).unwrap(), command);
            // Also from an unaligned copy.
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&bytes);
            assert_eq!(Command::decode(&shifted[1..]).unwrap(), command);
            assert!(Command::with_archived(&shifted[1..], |_| ()).is_ok());
        }
        assert!(Command::decode(b"not a command").is_err());
        assert!(Command::decode(&[]).is_err());
        assert!(Command::with_archived(&[0xff; 64], |_| ()).is_err());
        assert_eq!(
            Command::Drop { ids: vec![] }.endpoint(),
            "tensor.drop",
            "endpoints follow the variants"
        );
    }
}
