//! The commands a controller sends to rdma actors, as rkyv archives.
//!
//! Each command travels as the message of a [`hyperactor_mesh::MeshCall`]
//! to the endpoint [`RdmaCommand::endpoint`] names (`rdma.alloc`,
//! `rdma.read_into`...). Buffers are named by their handle's bytes
//! ([`crate::BufferHandle::to_bytes`]), which the actor validates and
//! checks against its proc's buffers; bytes that are not a command are an
//! error reply, never a panic (RM-2).

use hyperactor::RemoteMessage;
use rkyv::rancor;

/// A command to an rdma actor.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum RdmaCommand {
    /// Allocates and registers a zeroed buffer of `len` bytes; replies with
    /// its handle's bytes.
    Alloc {
        /// The length in bytes.
        len: u64,
    },
    /// Copies `bytes` into the buffer at `offset`; replies empty.
    WriteBytes {
        /// The buffer's handle.
        buffer: Vec<u8>,
        /// Where.
        offset: u64,
        /// What.
        bytes: Vec<u8>,
    },
    /// Replies with `len` bytes of the buffer from `offset`.
    ReadBytes {
        /// The buffer's handle.
        buffer: Vec<u8>,
        /// Where.
        offset: u64,
        /// How many bytes.
        len: u64,
    },
    /// One-sided READ: copies `len` bytes of `remote` from `remote_offset`
    /// into this proc's `local` at `local_offset`; replies with the bytes
    /// moved (a little-endian u64).
    ReadInto {
        /// This proc's buffer (handle bytes).
        local: Vec<u8>,
        /// Where in it.
        local_offset: u64,
        /// The other buffer (handle bytes), on any proc.
        remote: Vec<u8>,
        /// Where in it.
        remote_offset: u64,
        /// How many bytes.
        len: u64,
        /// How long the transfer may take, in milliseconds.
        timeout_ms: u64,
    },
    /// One-sided WRITE: copies `len` bytes of this proc's `local` from
    /// `local_offset` into `remote` at `remote_offset`; replies as
    /// [`RdmaCommand::ReadInto`].
    WriteFrom {
        /// This proc's buffer (handle bytes).
        local: Vec<u8>,
        /// Where in it.
        local_offset: u64,
        /// The other buffer (handle bytes), on any proc.
        remote: Vec<u8>,
        /// Where in it.
        remote_offset: u64,
        /// How many bytes.
        len: u64,
        /// How long the transfer may take, in milliseconds.
        timeout_ms: u64,
    },
    /// Frees (deregisters) the buffer; replies empty, or an error if this
    /// proc holds no such buffer.
    Free {
        /// The buffer's handle.
        buffer: Vec<u8>,
    },
}

/// Every endpoint of an rdma actor, in the order of [`RdmaCommand`]'s variants.
pub const ENDPOINTS: [&str; 6] = [
    "rdma.alloc",
    "rdma.write",
    "rdma.read",
    "rdma.read_into",
    "rdma.write_from",
    "rdma.free",
];

impl RdmaCommand {
    /// The endpoint this command is sent to.
    pub fn endpoint(&self) -> &'static str {
        let index = match self {
            RdmaCommand::Alloc { .. } => 0,
            RdmaCommand::WriteBytes { .. } => 1,
            RdmaCommand::ReadBytes { .. } => 2,
            RdmaCommand::ReadInto { .. } => 3,
            RdmaCommand::WriteFrom { .. } => 4,
            RdmaCommand::Free { .. } => 5,
        };
        ENDPOINTS[index]
    }

    /// The command's archive: the message of its [`hyperactor_mesh::MeshCall`].
    pub fn encode(&self) -> Vec<u8> {
        let hint = match self {
            RdmaCommand::WriteBytes { bytes, .. } => bytes.len() + 512,
            _ => 512,
        };
        // Serializing into a Vec cannot fail: it only grows the Vec, and
        // every field has a fixed archived form.
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, Vec::with_capacity(hint))
            .unwrap_or_default()
    }

    /// Validates an archive and decodes it.
    pub fn decode(bytes: &[u8]) -> Result<RdmaCommand, String> {
        <RdmaCommand as RemoteMessage>::decode(bytes)
            .map_err(|e| format!("the message is not a valid rdma command: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rm2_commands_round_trip_and_garbage_is_an_error() {
        let commands = [
            RdmaCommand::Alloc { len: 7 },
            RdmaCommand::WriteBytes {
                buffer: vec![1, 2, 3],
                offset: 4,
                bytes: b"hello".to_vec(),
            },
            RdmaCommand::ReadInto {
                local: vec![9],
                local_offset: 1,
                remote: vec![8],
                remote_offset: 2,
                len: 3,
                timeout_ms: 1000,
            },
        ];
        for command in commands {
            let bytes = command.encode();
            assert_eq!(RdmaCommand::decode(&bytes).unwrap(), command);
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&bytes);
            assert_eq!(RdmaCommand::decode(&shifted[1..]).unwrap(), command);
        }
        assert!(RdmaCommand::decode(b"not a command").is_err());
        assert!(RdmaCommand::decode(&[]).is_err());
        assert!(RdmaCommand::decode(&[0xff; 64]).is_err());
        assert_eq!(RdmaCommand::Free { buffer: vec![] }.endpoint(), "rdma.free");
    }
}
