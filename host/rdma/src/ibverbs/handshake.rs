//! The queue-pair handshake message.
//!
//! Two managers connect a reliable-connected queue pair by exchanging one
//! message each over the TCP control connection (a request with op
//! `IbvConnect` that carries the initiator's message, and a response that
//! carries the owner's). The message is 64 bytes, little-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | magic `MRQP` |
//! | 4 | version, 1 |
//! | 5 | path MTU, as `ibv_mtu` (1 = 256 ... 5 = 4096) |
//! | 6 | RDMA reads the sender accepts at once as responder (at least 1) |
//! | 7 | reserved, zero |
//! | 8..12 | queue pair number (24 bits, not zero) |
//! | 12..16 | initial packet sequence number (24 bits) |
//! | 16..18 | LID |
//! | 18..24 | reserved, zero |
//! | 24..40 | GID |
//! | 40..56 | the sender's manager id |
//! | 56..64 | reserved, zero |
//!
//! Invariants (tested below):
//! - RD-10: a message with a wrong magic or version, non-zero reserved bytes,
//!   a queue pair number or PSN outside 24 bits, an MTU outside 1..=5, zero
//!   read credits, or neither a GID nor a LID is rejected with a
//!   [`HandshakeError`] before any verbs call uses it.

use crate::handle::ManagerId;

/// Size of a handshake message.
pub(crate) const HANDSHAKE_LEN: usize = 64;
const MAGIC: [u8; 4] = *b"MRQP";
const VERSION: u8 = 1;
const MAX_24_BITS: u32 = (1 << 24) - 1;

/// One side's half of a queue-pair connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpInfo {
    /// The manager that sent the message.
    pub(crate) manager: ManagerId,
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    /// Active MTU of the sender's port, as `ibv_mtu`.
    pub(crate) mtu: u8,
    /// Outstanding RDMA reads the sender serves as responder.
    pub(crate) max_rd_atomic: u8,
}

/// A handshake message that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("bad handshake magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported handshake version {0}")]
    BadVersion(u8),
    #[error("reserved handshake bytes are not zero")]
    Reserved,
    #[error("queue pair number {0:#x} is zero or wider than 24 bits")]
    BadQpn(u32),
    #[error("packet sequence number {0:#x} is wider than 24 bits")]
    BadPsn(u32),
    #[error("MTU code {0} is not 1..=5")]
    BadMtu(u8),
    #[error("zero RDMA read credits")]
    NoReadCredits,
    #[error("neither a GID nor a LID: the peer cannot be addressed")]
    NoAddress,
}

impl QpInfo {
    pub(crate) fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut out = [0u8; HANDSHAKE_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.mtu;
        out[6] = self.max_rd_atomic;
        out[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        out[12..16].copy_from_slice(&self.psn.to_le_bytes());
        out[16..18].copy_from_slice(&self.lid.to_le_bytes());
        out[24..40].copy_from_slice(&self.gid);
        out[40..56].copy_from_slice(&self.manager.0);
        out
    }

    pub(crate) fn decode(bytes: &[u8; HANDSHAKE_LEN]) -> Result<QpInfo, HandshakeError> {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&bytes[0..4]);
        if magic != MAGIC {
            return Err(HandshakeError::BadMagic(magic));
        }
        if bytes[4] != VERSION {
            return Err(HandshakeError::BadVersion(bytes[4]));
        }
        if bytes[7] != 0
            || bytes[18..24].iter().any(|&b| b != 0)
            || bytes[56..64].iter().any(|&b| b != 0)
        {
            return Err(HandshakeError::Reserved);
        }
        let word = |range: std::ops::Range<usize>| {
            let mut raw = [0u8; 4];
            raw.copy_from_slice(&bytes[range]);
            u32::from_le_bytes(raw)
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[24..40]);
        let mut manager = [0u8; 16];
        manager.copy_from_slice(&bytes[40..56]);
        let info = QpInfo {
            manager: ManagerId(manager),
            qpn: word(8..12),
            psn: word(12..16),
            lid: u16::from_le_bytes([bytes[16], bytes[17]]),
            gid,
            mtu: bytes[5],
            max_rd_atomic: bytes[6],
        };
        if info.qpn == 0 || info.qpn > MAX_24_BITS {
            return Err(HandshakeError::BadQpn(info.qpn));
        }
        if info.psn > MAX_24_BITS {
            return Err(HandshakeError::BadPsn(info.psn));
        }
        if !(1..=5).contains(&info.mtu) {
            return Err(HandshakeError::BadMtu(info.mtu));
        }
        if info.max_rd_atomic == 0 {
            return Err(HandshakeError::NoReadCredits);
        }
        if info.lid == 0 && info.gid == [0; 16] {
            return Err(HandshakeError::NoAddress);
        }
        Ok(info)
    }

    /// A fresh random 24-bit initial packet sequence number.
    #[cfg_attr(not(feature = "ibverbs"), allow(dead_code))]
    pub(crate) fn random_psn() -> u32 {
        let mut raw = [0u8; 4];
        // A predictable PSN is harmless (the queue pair is bound to one peer
        // by the handshake), so a failing generator falls back to zero.
        let _ = getrandom::fill(&mut raw);
        u32::from_le_bytes(raw) & MAX_24_BITS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> QpInfo {
        QpInfo {
            manager: ManagerId([1; 16]),
            qpn: 0x1234,
            psn: 0xabcdef,
            lid: 0,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            mtu: 5,
            max_rd_atomic: 16,
        }
    }

    #[test]
    fn handshake_messages_round_trip() {
        let info = sample();
        assert_eq!(QpInfo::decode(&info.encode()).unwrap(), info);
        let infiniband = QpInfo {
            lid: 3,
            gid: [0; 16],
            ..sample()
        };
        assert_eq!(QpInfo::decode(&infiniband.encode()).unwrap(), infiniband);
        assert!(QpInfo::random_psn() <= MAX_24_BITS);
    }

    #[test]
    fn rd10_bad_handshake_messages_are_rejected() {
        let check = |info: QpInfo, expected: HandshakeError| {
            assert_eq!(QpInfo::decode(&info.encode()), Err(expected));
        };
        check(QpInfo { qpn: 0, ..sample() }, HandshakeError::BadQpn(0));
        check(
            QpInfo {
                qpn: 1 << 24,
                ..sample()
            },
            HandshakeError::BadQpn(1 << 24),
        );
        check(
            QpInfo {
                psn: 1 << 24,
                ..sample()
            },
            HandshakeError::BadPsn(1 << 24),
        );
        check(QpInfo { mtu: 0, ..sample() }, HandshakeError::BadMtu(0));
        check(QpInfo { mtu: 6, ..sample() }, HandshakeError::BadMtu(6));
        check(
            QpInfo {
                max_rd_atomic: 0,
                ..sample()
            },
            HandshakeError::NoReadCredits,
        );
        check(
            QpInfo {
                lid: 0,
                gid: [0; 16],
                ..sample()
            },
            HandshakeError::NoAddress,
        );

        let good = sample().encode();
        let mut bad = good;
        bad[0] = 0;
        assert!(matches!(
            QpInfo::decode(&bad),
            Err(HandshakeError::BadMagic(_))
        ));
        let mut bad = good;
        bad[4] = 9;
        assert_eq!(QpInfo::decode(&bad), Err(HandshakeError::BadVersion(9)));
        for index in [7, 20, 60] {
            let mut bad = good;
            bad[index] = 1;
            assert_eq!(QpInfo::decode(&bad), Err(HandshakeError::Reserved));
        }
        assert!(QpInfo::decode(&[0; HANDSHAKE_LEN]).is_err());
    }
}
