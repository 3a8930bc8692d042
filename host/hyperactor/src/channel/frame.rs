//! Length-prefixed frames.
//!
//! Every frame starts with a 16-byte header, then `len` body bytes, then zero
//! padding up to a multiple of 16, so that every body starts 16-byte aligned in
//! the reader's buffer and an rkyv archive can be validated in place:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | body length, u32 little-endian |
//! | 4..6 | magic `0x484d` ("MH") |
//! | 6 | protocol version, 2 (version 1 archived an envelope's failure bodies and return port inline) |
//! | 7 | kind: 1 hello, 2 data, 3 ack |
//! | 8..16 | u64 little-endian: session id (hello), sequence number (data), highest sequence delivered (ack) |
//!
//! Invariants (tested below):
//! - FR-1: a header with a wrong magic, version or kind, or a length above the
//!   limit, is an error before any body byte is read.
//! - FR-2: a body shorter than its header says, at end of stream, is an error
//!   (truncated), not a hang and not a partial frame.
//! - FR-3: data bodies are validated as rkyv archives by the caller; a body
//!   whose length is not a multiple of 8 is misaligned and rejected here.

use std::io;
use std::ops::Range;

use rkyv::util::AlignedVec;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::transport::ReadHalf;

/// Size of the frame header.
pub(crate) const HEADER_LEN: usize = 16;
const MAGIC: u16 = 0x484d;
/// The frame protocol version this build speaks; a frame of any other is
/// refused ([`FrameError::BadVersion`]).
pub const PROTOCOL_VERSION: u8 = 2;
const INITIAL_BUFFER: usize = 256 * 1024;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// First frame of a connection: the sender's session id in `seq`, its proc id as UTF-8 in the body.
    Hello = 1,
    /// An envelope (rkyv archive) with its sequence number.
    Data = 2,
    /// Everything up to `seq` was delivered. No body.
    Ack = 3,
    /// From a receiver that does not know the connection's session though
    /// its first data frame is numbered past 1: the receiver restarted
    /// since the sender's earlier frames reached it (a new incarnation at
    /// the same address). No body; the receiver closes the connection.
    Restarted = 4,
}

/// A frame that breaks the protocol. The connection that carried it is closed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The header's magic bytes are wrong: the peer does not speak this protocol.
    #[error("bad magic {0:#06x}: the peer does not speak the monarch-host frame protocol")]
    BadMagic(u16),
    /// The protocol version is not this build's.
    #[error(
        "unsupported frame protocol version {0} (this build speaks version {ours}: run the same monarch-host build on both ends)",
        ours = PROTOCOL_VERSION
    )]
    BadVersion(u8),
    /// The kind byte is unknown, or the kind does not fit the place it came in.
    #[error("unexpected frame kind {0}")]
    BadKind(u8),
    /// The length exceeds the configured maximum frame size.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    Oversized {
        /// The length the header claims.
        len: usize,
        /// The configured limit.
        max: usize,
    },
    /// The body length would leave the archive misaligned.
    #[error("frame body of {0} bytes is not a multiple of 8 (misaligned archive)")]
    Misaligned(usize),
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({0} bytes of it received)")]
    Truncated(usize),
    /// The body is not a valid archive of what the kind promises.
    #[error("invalid frame body: {0}")]
    Invalid(String),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The parsed header of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) kind: FrameKind,
    pub(crate) seq: u64,
}

/// Frames take whole multiples of this many bytes in the stream.
const FRAME_ALIGN: usize = 16;

fn padded(len: usize) -> usize {
    len.div_ceil(FRAME_ALIGN) * FRAME_ALIGN
}

/// Writes a header into the first 16 bytes of `frame`.
pub(crate) fn write_header(frame: &mut [u8], kind: FrameKind, body_len: usize, seq: u64) {
    let len = u32::try_from(body_len).unwrap_or(u32::MAX);
    frame[0..4].copy_from_slice(&len.to_le_bytes());
    frame[4..6].copy_from_slice(&MAGIC.to_le_bytes());
    frame[6] = PROTOCOL_VERSION;
    frame[7] = kind as u8;
    frame[8..16].copy_from_slice(&seq.to_le_bytes());
}

/// Overwrites the sequence number of an encoded frame.
pub(crate) fn set_seq(frame: &mut [u8], seq: u64) {
    frame[8..16].copy_from_slice(&seq.to_le_bytes());
}

/// A whole frame with a small body (hello, ack).
pub(crate) fn small_frame(kind: FrameKind, seq: u64, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; HEADER_LEN + padded(body.len())];
    write_header(&mut frame, kind, body.len(), seq);
    frame[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
    frame
}

/// A buffer that starts with room for a header; archive the body after it,
/// then call [`finish_frame`].
pub(crate) fn frame_buffer(capacity: usize) -> AlignedVec {
    let mut buf = AlignedVec::with_capacity(capacity.max(HEADER_LEN));
    buf.extend_from_slice(&[0u8; HEADER_LEN]);
    buf
}

/// Capacity of a thread's scratch frame ([`scratch_frame`]).
const SCRATCH_CAPACITY: usize = 4096;
/// A scratch frame grown past this (a large message) is not kept.
const SCRATCH_KEEP: usize = 64 << 10;

thread_local! {
    static SCRATCH: std::cell::Cell<Option<AlignedVec>> = const { std::cell::Cell::new(None) };
}

/// [`frame_buffer`] from this thread's scratch buffer: archiving a message
/// and its envelope into it grows nothing (a 256-byte start grew twice for
/// a cast of 900 bytes); [`compact_frame`] then copies the frame out at
/// its own size and hands the buffer back for the next one.
pub(crate) fn scratch_frame() -> AlignedVec {
    let mut buf = SCRATCH
        .take()
        .unwrap_or_else(|| AlignedVec::with_capacity(SCRATCH_CAPACITY));
    buf.clear();
    buf.extend_from_slice(&[0u8; HEADER_LEN]);
    buf
}

/// `frame` in a buffer of its own length; a scratch buffer goes back to
/// this thread for the next [`scratch_frame`]. A frame that already fits
/// its buffer is kept as it is, and so is one whose buffer grew past what
/// a thread keeps as scratch: that buffer would be dropped anyway, and
/// copying a large frame out of it (a tensor's megabyte chunk) cost more
/// than the slack it keeps, which is at most the frame's length (buffers
/// grow to powers of two) and is never written.
pub(crate) fn compact_frame(frame: AlignedVec) -> AlignedVec {
    if frame.capacity() < SCRATCH_CAPACITY || frame.capacity() > SCRATCH_KEEP {
        return frame;
    }
    let mut exact = AlignedVec::with_capacity(frame.len());
    exact.extend_from_slice(&frame);
    if frame.capacity() <= SCRATCH_KEEP {
        SCRATCH.set(Some(frame));
    }
    exact
}

/// Pads the frame and writes its header.
pub(crate) fn finish_frame(buf: &mut AlignedVec, kind: FrameKind, seq: u64) {
    let body_len = buf.len() - HEADER_LEN;
    let pad = padded(body_len) - body_len;
    for _ in 0..pad {
        buf.push(0);
    }
    write_header(buf.as_mut_slice(), kind, body_len, seq);
}

/// Reads frames from a byte stream into one aligned, reused buffer.
pub(crate) struct FrameReader {
    buf: AlignedVec,
    start: usize,
    end: usize,
    max_frame: usize,
}

impl FrameReader {
    pub(crate) fn new(max_frame: usize) -> Self {
        let mut buf = AlignedVec::with_capacity(INITIAL_BUFFER);
        buf.resize(INITIAL_BUFFER, 0);
        FrameReader {
            buf,
            start: 0,
            end: 0,
            max_frame,
        }
    }

    /// The next whole frame already in the buffer, or `None` if more bytes are needed.
    /// The body is at the returned range; see [`FrameReader::body`].
    pub(crate) fn next_frame(&mut self) -> Result<Option<(FrameHeader, Range<usize>)>, FrameError> {
        let avail = self.end - self.start;
        if avail < HEADER_LEN {
            return Ok(None);
        }
        let h = &self.buf[self.start..self.start + HEADER_LEN];
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let magic = u16::from_le_bytes([h[4], h[5]]);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if h[6] != PROTOCOL_VERSION {
            return Err(FrameError::BadVersion(h[6]));
        }
        let kind = match h[7] {
            1 => FrameKind::Hello,
            2 => FrameKind::Data,
            3 => FrameKind::Ack,
            4 => FrameKind::Restarted,
            other => return Err(FrameError::BadKind(other)),
        };
        if len > self.max_frame {
            return Err(FrameError::Oversized {
                len,
                max: self.max_frame,
            });
        }
        if kind == FrameKind::Data && !len.is_multiple_of(8) {
            return Err(FrameError::Misaligned(len));
        }
        if matches!(kind, FrameKind::Ack | FrameKind::Restarted) && len != 0 {
            return Err(FrameError::BadKind(h[7]));
        }
        let seq = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
        let total = HEADER_LEN + padded(len);
        if avail < total {
            self.make_room(total);
            return Ok(None);
        }
        let body = self.start + HEADER_LEN..self.start + HEADER_LEN + len;
        self.start += total;
        Ok(Some((FrameHeader { kind, seq }, body)))
    }

    /// The bytes of a body returned by [`FrameReader::next_frame`]. Valid until
    /// the next call to [`FrameReader::fill`].
    pub(crate) fn body(&self, range: Range<usize>) -> &[u8] {
        &self.buf[range]
    }

    /// Makes sure a frame of `total` bytes starting at `start` fits.
    fn make_room(&mut self, total: usize) {
        if self.start + total <= self.buf.len() {
            return;
        }
        self.compact();
        if total > self.buf.len() {
            self.buf.resize(padded(total), 0);
        }
    }

    /// Moves unread bytes to the front. Frames are multiples of 8 long, so
    /// `start` is a multiple of 16 and bodies keep their alignment.
    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.as_mut_slice().copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Reads more bytes. `Ok(false)` at a clean end of stream (between frames);
    /// [`FrameError::Truncated`] when the stream ends inside a frame.
    pub(crate) async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        rd: &mut R,
    ) -> Result<bool, FrameError> {
        let n = rd.read(self.spare()).await?;
        self.filled(n)
    }

    /// Like [`FrameReader::fill`] without waiting: `Ok(None)` when no bytes
    /// are there yet. See [`ReadHalf::recv_now`].
    pub(crate) fn fill_now(&mut self, rd: &ReadHalf) -> Result<Option<bool>, FrameError> {
        match rd.recv_now(self.spare()) {
            Ok(n) => self.filled(n).map(Some),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Room to read into, after the unread bytes.
    fn spare(&mut self) -> &mut [u8] {
        if self.end == self.buf.len() {
            self.compact();
            if self.end == self.buf.len() {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
        }
        &mut self.buf.as_mut_slice()[self.end..]
    }

    fn filled(&mut self, n: usize) -> Result<bool, FrameError> {
        if n == 0 {
            let partial = self.end - self.start;
            return if partial == 0 {
                Ok(false)
            } else {
                Err(FrameError::Truncated(partial))
            };
        }
        self.end += n;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(
        bytes: Vec<u8>,
        max: usize,
    ) -> Result<Vec<(FrameHeader, Vec<u8>)>, FrameError> {
        let mut reader = FrameReader::new(max);
        let mut src = &bytes[..];
        let mut frames = Vec::new();
        loop {
            while let Some((header, body)) = reader.next_frame()? {
                frames.push((header, reader.body(body).to_vec()));
            }
            if !reader.fill(&mut src).await? {
                return Ok(frames);
            }
        }
    }

    /// A frame archived into this thread's scratch buffer leaves in a
    /// buffer of its own length and the scratch stays for the next one; a
    /// frame too large for the scratch to be kept leaves in the buffer it
    /// was archived into, not copied (a tensor chunk of a megabyte).
    #[test]
    fn a_large_frame_keeps_its_buffer_and_a_small_one_is_copied_out() {
        let mut small = scratch_frame();
        small.extend_from_slice(&[7u8; 5000]);
        let scratch_at = small.as_ptr();
        let out = compact_frame(small);
        assert_eq!(out.len(), HEADER_LEN + 5000);
        assert_eq!(out.capacity(), out.len());
        assert_ne!(out.as_ptr(), scratch_at);
        assert_eq!(
            scratch_frame().as_ptr(),
            scratch_at,
            "the scratch came back"
        );

        let mut large = scratch_frame();
        large.extend_from_slice(&vec![9u8; 1 << 20]);
        let large_at = large.as_ptr();
        let out = compact_frame(large);
        assert_eq!(out.as_ptr(), large_at, "not copied");
        assert_eq!(out.len(), HEADER_LEN + (1 << 20));
        assert!(out[HEADER_LEN..].iter().all(|&b| b == 9));
    }

    #[tokio::test]
    async fn frames_round_trip_and_bodies_are_aligned() {
        let mut stream = Vec::new();
        for i in 0..1000u64 {
            let mut buf = frame_buffer(64);
            buf.extend_from_slice(&i.to_le_bytes());
            finish_frame(&mut buf, FrameKind::Data, i);
            stream.extend_from_slice(&buf);
        }
        stream.extend_from_slice(&small_frame(FrameKind::Ack, 99, &[]));
        let frames = read_all(stream, 1 << 20).await.unwrap();
        assert_eq!(frames.len(), 1001);
        for (i, (header, body)) in frames.iter().take(1000).enumerate() {
            assert_eq!(header.kind, FrameKind::Data);
            assert_eq!(header.seq, i as u64);
            assert_eq!(body, &(i as u64).to_le_bytes());
        }
        assert_eq!(frames[1000].0.kind, FrameKind::Ack);
        assert_eq!(frames[1000].0.seq, 99);
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_buffer_is_read_whole() {
        let mut buf = frame_buffer(1 << 20);
        buf.extend_from_slice(&vec![7u8; 600 * 1024]);
        finish_frame(&mut buf, FrameKind::Data, 1);
        let frames = read_all(buf.to_vec(), 1 << 20).await.unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].1.len(), 600 * 1024);
    }

    #[tokio::test]
    async fn fr1_bad_headers_are_rejected() {
        let garbage = vec![0xAB; 64];
        assert!(matches!(
            read_all(garbage, 1 << 20).await,
            Err(FrameError::BadMagic(_))
        ));

        let mut huge = small_frame(FrameKind::Data, 1, &[]);
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_all(huge, 1 << 20).await,
            Err(FrameError::Oversized { .. })
        ));

        let mut kind = small_frame(FrameKind::Data, 1, &[]);
        kind[7] = 9;
        assert!(matches!(
            read_all(kind, 1 << 20).await,
            Err(FrameError::BadKind(9))
        ));

        let mut version = small_frame(FrameKind::Data, 1, &[]);
        version[6] = 1;
        assert!(matches!(
            read_all(version, 1 << 20).await,
            Err(FrameError::BadVersion(1))
        ));
    }

    #[tokio::test]
    async fn fr2_truncated_frames_are_errors() {
        let mut buf = frame_buffer(64);
        buf.extend_from_slice(&[1u8; 40]);
        finish_frame(&mut buf, FrameKind::Data, 1);
        let cut = buf[..30].to_vec();
        assert!(matches!(
            read_all(cut, 1 << 20).await,
            Err(FrameError::Truncated(30))
        ));
        let half_header = buf[..5].to_vec();
        assert!(matches!(
            read_all(half_header, 1 << 20).await,
            Err(FrameError::Truncated(5))
        ));
    }

    #[tokio::test]
    async fn fr3_misaligned_data_is_rejected() {
        let frame = small_frame(FrameKind::Data, 1, &[1, 2, 3]);
        assert!(matches!(
            read_all(frame, 1 << 20).await,
            Err(FrameError::Misaligned(3))
        ));
    }
}
