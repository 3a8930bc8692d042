//! The TCP frame protocol: fixed-size little-endian headers.
//!
//! A connection carries requests from the initiator and responses from the
//! owner, strictly alternating. A request is a 64-byte header, followed for a
//! write by `len` data bytes and for an ibverbs handshake by the initiator's
//! handshake message:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | magic `MRDQ` |
//! | 4 | version, 1 |
//! | 5 | op: 1 read, 2 write, 3 ibverbs handshake |
//! | 6..8 | reserved, zero |
//! | 8..24 | the owning manager's id |
//! | 24..32 | buffer id |
//! | 32..48 | access key |
//! | 48..56 | offset in the buffer |
//! | 56..64 | length |
//!
//! A response is a 16-byte header, followed for a successful read by `len`
//! data bytes and for a successful handshake by the owner's handshake message:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | magic `MRDP` |
//! | 4 | version, 1 |
//! | 5 | status (see [`Status`]) |
//! | 6..8 | reserved, zero |
//! | 8..16 | on success the bytes that follow (read, handshake) or were written; on `OutOfRange` the buffer's length |
//!
//! Invariants (tested below):
//! - RD-3: a header with a wrong magic, version, op or status, non-zero
//!   reserved bytes, a length above [`MAX_CHUNK_SIZE`], or an offset whose end
//!   overflows is a [`FrameError`] before any data byte is read; the
//!   connection that carried it is closed.

use crate::config::MAX_CHUNK_SIZE;
use crate::handle::ManagerId;
use crate::ibverbs::handshake::HANDSHAKE_LEN;

/// Size of a request header.
pub(crate) const REQUEST_LEN: usize = 64;
/// Size of a response header.
pub(crate) const RESPONSE_LEN: usize = 16;
const REQUEST_MAGIC: [u8; 4] = *b"MRDQ";
const RESPONSE_MAGIC: [u8; 4] = *b"MRDP";
const VERSION: u8 = 1;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Send `len` bytes of the buffer from `offset`.
    Read = 1,
    /// Store the `len` bytes that follow at `offset`.
    Write = 2,
    /// Connect an ibverbs queue pair; a handshake message follows.
    IbvConnect = 3,
}

/// The owner's answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok = 0,
    UnknownBuffer = 1,
    Deregistered = 2,
    WrongKey = 3,
    OutOfRange = 4,
    /// The request names another manager than the one that received it.
    StaleOwner = 5,
    /// The owner has no ibverbs device.
    NoIbverbs = 6,
    /// The owner could not set up its side of the queue pair.
    HandshakeFailed = 7,
}

impl Status {
    fn from_byte(byte: u8) -> Option<Status> {
        Some(match byte {
            0 => Status::Ok,
            1 => Status::UnknownBuffer,
            2 => Status::Deregistered,
            3 => Status::WrongKey,
            4 => Status::OutOfRange,
            5 => Status::StaleOwner,
            6 => Status::NoIbverbs,
            7 => Status::HandshakeFailed,
            _ => return None,
        })
    }
}

/// A header that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("bad magic {0:02x?}: the peer does not speak the monarch-rdma protocol")]
    BadMagic([u8; 4]),
    #[error("unsupported protocol version {0}")]
    BadVersion(u8),
    #[error("unknown op {0}")]
    BadOp(u8),
    #[error("unknown status {0}")]
    BadStatus(u8),
    #[error("reserved header bytes are not zero")]
    Reserved,
    #[error("length {len} exceeds the limit of {max} bytes")]
    TooLong { len: u64, max: u64 },
    #[error("offset {offset} + length {len} overflows")]
    Overflow { offset: u64, len: u64 },
}

/// A request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) op: Op,
    pub(crate) owner: ManagerId,
    pub(crate) buffer: u64,
    pub(crate) key: [u8; 16],
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl Request {
    pub(crate) fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[0..4].copy_from_slice(&REQUEST_MAGIC);
        out[4] = VERSION;
        out[5] = self.op as u8;
        out[8..24].copy_from_slice(&self.owner.0);
        out[24..32].copy_from_slice(&self.buffer.to_le_bytes());
        out[32..48].copy_from_slice(&self.key);
        out[48..56].copy_from_slice(&self.offset.to_le_bytes());
        out[56..64].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8; REQUEST_LEN]) -> Result<Request, FrameError> {
        let magic: [u8; 4] = array(&bytes[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if bytes[4] != VERSION {
            return Err(FrameError::BadVersion(bytes[4]));
        }
        let op = match bytes[5] {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::IbvConnect,
            other => return Err(FrameError::BadOp(other)),
        };
        if bytes[6..8] != [0, 0] {
            return Err(FrameError::Reserved);
        }
        let request = Request {
            op,
            owner: ManagerId(array(&bytes[8..24])),
            buffer: u64::from_le_bytes(array(&bytes[24..32])),
            key: array(&bytes[32..48]),
            offset: u64::from_le_bytes(array(&bytes[48..56])),
            len: u64::from_le_bytes(array(&bytes[56..64])),
        };
        let max = match op {
            Op::Read | Op::Write => MAX_CHUNK_SIZE as u64,
            Op::IbvConnect => HANDSHAKE_LEN as u64,
        };
        if request.len > max || (op == Op::IbvConnect && request.len != max) {
            return Err(FrameError::TooLong {
                len: request.len,
                max,
            });
        }
        if request.offset.checked_add(request.len).is_none() {
            return Err(FrameError::Overflow {
                offset: request.offset,
                len: request.len,
            });
        }
        Ok(request)
    }
}

/// A response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    pub(crate) status: Status,
    pub(crate) value: u64,
}

impl Response {
    pub(crate) fn ok(value: u64) -> Response {
        Response {
            status: Status::Ok,
            value,
        }
    }

    pub(crate) fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut out = [0u8; RESPONSE_LEN];
        out[0..4].copy_from_slice(&RESPONSE_MAGIC);
        out[4] = VERSION;
        out[5] = self.status as u8;
        out[8..16].copy_from_slice(&self.value.to_le_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8; RESPONSE_LEN]) -> Result<Response, FrameError> {
        let magic: [u8; 4] = array(&bytes[0..4]);
        if magic != RESPONSE_MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if bytes[4] != VERSION {
            return Err(FrameError::BadVersion(bytes[4]));
        }
        let status = Status::from_byte(bytes[5]).ok_or(FrameError::BadStatus(bytes[5]))?;
        if bytes[6..8] != [0, 0] {
            return Err(FrameError::Reserved);
        }
        Ok(Response {
            status,
            value: u64::from_le_bytes(array(&bytes[8..16])),
        })
    }
}

/// Copies a slice whose length the caller has fixed into an array.
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: Op, len: u64) -> Request {
        Request {
            op,
            owner: ManagerId([9; 16]),
            buffer: 77,
            key: [5; 16],
            offset: 4096,
            len,
        }
    }

    #[test]
    fn headers_round_trip() {
        for op in [Op::Read, Op::Write] {
            let req = request(op, 1 << 20);
            assert_eq!(Request::decode(&req.encode()).unwrap(), req);
        }
        let connect = request(Op::IbvConnect, HANDSHAKE_LEN as u64);
        assert_eq!(Request::decode(&connect.encode()).unwrap(), connect);
        let resp = Response {
            status: Status::OutOfRange,
            value: 123,
        };
        assert_eq!(Response::decode(&resp.encode()).unwrap(), resp);
    }

    #[test]
    fn rd3_bad_request_headers_are_rejected() {
        let good = request(Op::Read, 10).encode();

        let mut bad = good;
        bad[0] = b'X';
        assert!(matches!(
            Request::decode(&bad),
            Err(FrameError::BadMagic(_))
        ));
        let mut bad = good;
        bad[4] = 2;
        assert_eq!(Request::decode(&bad), Err(FrameError::BadVersion(2)));
        let mut bad = good;
        bad[5] = 0;
        assert_eq!(Request::decode(&bad), Err(FrameError::BadOp(0)));
        let mut bad = good;
        bad[7] = 1;
        assert_eq!(Request::decode(&bad), Err(FrameError::Reserved));

        let huge = request(Op::Write, MAX_CHUNK_SIZE as u64 + 1).encode();
        assert!(matches!(
            Request::decode(&huge),
            Err(FrameError::TooLong { .. })
        ));
        let wrong_handshake = request(Op::IbvConnect, 8).encode();
        assert!(matches!(
            Request::decode(&wrong_handshake),
            Err(FrameError::TooLong { .. })
        ));
        let mut overflow = request(Op::Read, 10);
        overflow.offset = u64::MAX - 5;
        assert!(matches!(
            Request::decode(&overflow.encode()),
            Err(FrameError::Overflow { .. })
        ));
        assert!(Request::decode(&[0u8; REQUEST_LEN]).is_err());
        assert!(Request::decode(&[0xFF; REQUEST_LEN]).is_err());
    }

    #[test]
    fn rd3_bad_response_headers_are_rejected() {
        let good = Response::ok(5).encode();
        let mut bad = good;
        bad[5] = 200;
        assert_eq!(Response::decode(&bad), Err(FrameError::BadStatus(200)));
        let mut bad = good;
        bad[1] = 0;
        assert!(Response::decode(&bad).is_err());
        let mut bad = good;
        bad[6] = 9;
        assert_eq!(Response::decode(&bad), Err(FrameError::Reserved));
    }
}
