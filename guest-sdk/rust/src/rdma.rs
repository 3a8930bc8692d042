//! RDMA buffers: byte buffers in host memory on procs, and one-sided
//! transfers between them.
//!
//! A [`Buffer`] lives on one proc of a [`ProcMesh`]. Its memory is the
//! host's, never the program's: bytes go in with [`Buffer::write`] and come
//! out with [`Buffer::read`], and between two buffers they move proc to
//! proc without passing through the program ([`Buffer::read_into`],
//! [`Buffer::write_from`]), over RDMA where the hardware has it and TCP
//! otherwise. A [`BufferRef`] names a buffer inside a message.
//!
//! ```
//! # async fn example() -> Result<(), String> {
//! use monarch_guest::prelude::*;
//! use monarch_guest::rdma::Buffer;
//!
//! let procs = spawn_procs(&extent!(procs = 2))?;
//! let a = Buffer::allocate(&procs, 0, 11)?;
//! let b = Buffer::allocate(&procs, 1, 11)?;
//! a.write(0, b"hello world").await?;
//! a.read_into(&b).await?;              // proc 1 reads proc 0's bytes
//! assert_eq!(b.read(6, 5).await?, b"world");
//! a.free().await?;
//! # Ok(()) }
//! ```
//!
//! Memory lives until [`Buffer::free`] or the end of the program: dropping
//! a handle frees nothing, since references to the buffer may be out.

use std::fmt;
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::bindings::monarch::host::rdma as wit;
use crate::call::{Call, decode_raw, decode_unit};
use crate::{MeshError, ProcMesh, codec};

/// A buffer on a proc. Clones are handles to the same buffer.
#[derive(Clone)]
pub struct Buffer {
    raw: Rc<wit::Buffer>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("handle", &self.raw.handle())
            .field("size", &self.size())
            .finish()
    }
}

/// A reference to a [`Buffer`] that travels inside a message; turn it back
/// into a buffer with [`Buffer::from_ref`]. It travels as tag 40101 over
/// the bytes of the WIT's `buffer.to-ref` (`wit/ENCODING.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferRef(pub Vec<u8>);

impl Serialize for BufferRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        codec::serialize_tagged(codec::TAGGED_BUFFER, &self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for BufferRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        codec::deserialize_tagged(codec::TAGGED_BUFFER, deserializer).map(BufferRef)
    }
}

impl Buffer {
    /// `size` zeroed bytes on the proc at `rank` of `procs`.
    pub fn allocate(procs: &ProcMesh, rank: u32, size: u64) -> Result<Buffer, MeshError> {
        wit::Buffer::allocate(procs.raw(), rank, size)
            .map(|raw| Buffer { raw: Rc::new(raw) })
            .map_err(|e| MeshError::new(format!("allocating {size} bytes on rank {rank}"), e))
    }

    /// The buffer a reference names.
    pub fn from_ref(reference: &BufferRef) -> Result<Buffer, MeshError> {
        wit::Buffer::from_ref(&reference.0)
            .map(|raw| Buffer { raw: Rc::new(raw) })
            .map_err(|e| MeshError::new("opening a buffer reference", e))
    }

    /// A reference to put in a message.
    pub fn to_ref(&self) -> BufferRef {
        BufferRef(self.raw.to_ref())
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.raw.size()
    }

    /// Puts `bytes` at `offset`.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Call<()> {
        Call::in_flight(self.raw.write(offset, bytes), decode_unit)
    }

    /// `len` bytes from `offset`.
    pub fn read(&self, offset: u64, len: u64) -> Call<Vec<u8>> {
        Call::in_flight(self.raw.read(offset, len), decode_raw)
    }

    /// Copies this buffer's bytes into `dst`: `dst`'s proc reads them, one
    /// sided. The sizes must be equal.
    pub fn read_into(&self, dst: &Buffer) -> Call<()> {
        Call::in_flight(self.raw.read_into(&dst.raw), decode_unit)
    }

    /// Copies `src`'s bytes into this buffer: `src`'s proc writes them, one
    /// sided. The sizes must be equal.
    pub fn write_from(&self, src: &Buffer) -> Call<()> {
        Call::in_flight(self.raw.write_from(&src.raw), decode_unit)
    }

    /// Frees the memory; later transfers naming the buffer fail.
    pub fn free(&self) -> Call<()> {
        Call::in_flight(self.raw.free(), decode_unit)
    }
}
