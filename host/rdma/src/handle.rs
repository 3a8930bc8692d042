//! Buffer handles: what a peer needs to read or write a registered buffer.
//!
//! A [`BufferHandle`] is plain data. It travels inside payloads (serde or
//! rkyv, validated with bytecheck) and grants access to exactly one buffer:
//! it names the owning manager ([`ManagerId`]), the buffer id and length, the
//! owner's endpoints per backend (its TCP address, and with ibverbs its GID,
//! LID, the buffer's address and rkey), and a random 128-bit access key.
//! Whoever holds the handle can read and write the buffer; nobody else can
//! guess it. The owner checks every field of every request made with a handle
//! (RD-2): a handle is network input.

use std::fmt;
use std::net::SocketAddr;

use rkyv::rancor;
use serde::{Deserialize, Serialize};

use crate::error::RdmaError;

/// Identifies one [`RdmaManager`](crate::RdmaManager) instance: random, new
/// for every manager, so a handle made before a proc restarted is recognised
/// as stale by the proc that replaced it.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(PartialEq, Eq))]
pub struct ManagerId(pub [u8; 16]);

impl ManagerId {
    /// A fresh random id.
    pub(crate) fn random() -> Result<ManagerId, RdmaError> {
        random_bytes().map(ManagerId)
    }
}

impl fmt::Display for ManagerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ManagerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ManagerId({self})")
    }
}

/// The 128-bit secret that grants access to one buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct AccessKey(pub(crate) [u8; 16]);

impl AccessKey {
    pub(crate) fn random() -> Result<AccessKey, RdmaError> {
        random_bytes().map(AccessKey)
    }

    /// Compares in time independent of where the keys differ.
    pub(crate) fn matches(&self, other: &[u8; 16]) -> bool {
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(other) {
            diff |= a ^ b;
        }
        std::hint::black_box(diff) == 0
    }
}

/// Keys must be unguessable: they come from the operating system's generator
/// or not at all.
fn random_bytes() -> Result<[u8; 16], RdmaError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|err| RdmaError::Io {
        what: "reading the operating system's random number generator".into(),
        reason: err.to_string(),
    })?;
    Ok(bytes)
}

/// Where an ibverbs peer is on the fabric: what a queue pair needs to reach it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct IbvEndpoint {
    /// The port's GID (all zero on InfiniBand without global routing).
    pub gid: [u8; 16],
    /// The port's LID (zero on RoCE).
    pub lid: u16,
}

/// What ibverbs needs to read or write one buffer remotely.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct IbvRemote {
    /// The owner's port.
    pub endpoint: IbvEndpoint,
    /// Virtual address of the buffer's first byte in the owner's process.
    pub addr: u64,
    /// The memory region's remote key.
    pub rkey: u32,
}

/// A serializable reference to a registered buffer on some manager.
///
/// Made by [`Buffer::handle`](crate::Buffer::handle). Its `Debug` output
/// leaves out the access key.
#[derive(
    Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct BufferHandle {
    pub(crate) owner: ManagerId,
    pub(crate) id: u64,
    pub(crate) len: u64,
    pub(crate) key: [u8; 16],
    pub(crate) tcp: SocketAddr,
    pub(crate) ibverbs: Option<IbvRemote>,
}

impl BufferHandle {
    /// The manager that owns the buffer.
    pub fn owner(&self) -> ManagerId {
        self.owner
    }

    /// The buffer's id on its manager (never reused by that manager).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The owner's TCP address (transfers and the ibverbs handshake go there).
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp
    }

    /// The ibverbs endpoint, address and rkey, when the owner has an RDMA device.
    pub fn ibverbs(&self) -> Option<&IbvRemote> {
        self.ibverbs.as_ref()
    }

    /// Encodes the handle as an rkyv archive.
    pub fn to_bytes(&self) -> Vec<u8> {
        match rkyv::to_bytes::<rancor::Error>(self) {
            Ok(bytes) => bytes.into_vec(),
            // A handle holds only fixed-size fields; archiving cannot fail.
            Err(err) => unreachable!("archiving a buffer handle failed: {err}"),
        }
    }

    /// Decodes and validates an archive made by [`to_bytes`](Self::to_bytes).
    ///
    /// Any byte string is accepted as input: garbage gives
    /// [`RdmaError::BadHandle`], never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<BufferHandle, RdmaError> {
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(bytes.len());
        aligned.extend_from_slice(bytes);
        rkyv::from_bytes::<BufferHandle, rancor::Error>(&aligned)
            .map_err(|err| RdmaError::BadHandle(err.to_string()))
    }
}

impl fmt::Debug for BufferHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferHandle")
            .field("owner", &self.owner)
            .field("id", &self.id)
            .field("len", &self.len)
            .field("tcp", &self.tcp)
            .field("ibverbs", &self.ibverbs)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample_handle() -> BufferHandle {
        BufferHandle {
            owner: ManagerId([3; 16]),
            id: 42,
            len: 1 << 20,
            key: [0xAB; 16],
            tcp: "127.0.0.1:4567".parse().unwrap(),
            ibverbs: Some(IbvRemote {
                endpoint: IbvEndpoint {
                    gid: [0xfe; 16],
                    lid: 7,
                },
                addr: 0x7f00_0000_1000,
                rkey: 0x1234,
            }),
        }
    }

    #[test]
    fn handles_round_trip_through_rkyv_and_serde() {
        let handle = sample_handle();
        let bytes = handle.to_bytes();
        assert_eq!(BufferHandle::from_bytes(&bytes).unwrap(), handle);
        // Unaligned input is fine too.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&bytes);
        assert_eq!(BufferHandle::from_bytes(&shifted[1..]).unwrap(), handle);

        let json = serde_json::to_string(&handle).unwrap();
        assert_eq!(serde_json::from_str::<BufferHandle>(&json).unwrap(), handle);

        let tcp_only = BufferHandle {
            ibverbs: None,
            ..sample_handle()
        };
        assert_eq!(
            BufferHandle::from_bytes(&tcp_only.to_bytes()).unwrap(),
            tcp_only
        );
    }

    #[test]
    fn rd2_garbage_handle_bytes_are_an_error_not_a_panic() {
        let bytes = sample_handle().to_bytes();
        for len in 0..bytes.len() {
            let _ = BufferHandle::from_bytes(&bytes[..len]);
        }
        let mut corrupt = bytes.clone();
        // An `Option` tag of 7 is invalid.
        for byte in corrupt.iter_mut() {
            *byte = 7;
        }
        assert!(matches!(
            BufferHandle::from_bytes(&corrupt),
            Err(RdmaError::BadHandle(_))
        ));
        assert!(BufferHandle::from_bytes(&[]).is_err());
    }

    #[test]
    fn debug_output_leaves_out_the_key() {
        let text = format!("{:?}", sample_handle());
        assert!(text.contains("id: 42"));
        assert!(!text.to_lowercase().contains("ab, ab") && !text.contains("171"));
    }

    #[test]
    fn keys_are_random_and_compared_exactly() {
        let a = AccessKey::random().unwrap();
        let b = AccessKey::random().unwrap();
        assert_ne!(a.0, b.0);
        assert!(a.matches(&a.0));
        let mut near = a.0;
        near[15] ^= 1;
        assert!(!a.matches(&near));
    }
}
