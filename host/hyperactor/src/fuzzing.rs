//! Entry points for the fuzz targets in `fuzz/` (see docs/fuzzing.md).
//!
//! Not part of the API: these functions run what a proc does with the
//! bytes a peer sends it, without sockets or actors, so that a fuzzer can
//! feed them anything. Every one returns an error for bad input; a panic,
//! abort or unbounded allocation here is a bug in the code it calls.
//!
//! The steps mirror the receive path (`proc::receive`, `serve_frames` and
//! `Proc::deliver_archived`): frames are cut by the real `FrameReader`
//! (channel/frame.rs), hello bodies are split and checked against a
//! [`ClusterToken`] as `receive` does, and data bodies are validated with
//! rkyv's bytecheck as archived envelopes and decoded field by field as
//! delivery decodes them. A change to either of those functions belongs
//! here too.

use std::pin::Pin;
use std::task::{Context, Poll};

use rkyv::rancor;
use tokio::io::{AsyncRead, ReadBuf};

use crate::channel::FrameError;
use crate::channel::frame::{FrameKind, FrameReader};
use crate::failure::{DeliveryFailure, Undeliverable};
use crate::id::{ActorId, PortId};
use crate::message::{ArchivedBody, ArchivedEnvelope, RemoteMessage};
use crate::proc::ClusterToken;

/// What a stream of frames came to, for the fuzz target to check.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// The peer named in the hello, if one arrived.
    pub hello_from: Option<String>,
    /// Data frames whose envelope validated and decoded.
    pub envelopes: usize,
    /// Acknowledgements after the hello (LK-9).
    pub acks: usize,
}

/// Reads `stream` as one incoming connection would be read: a hello, then
/// data frames, each validated as an envelope. The stream is handed to the
/// reader in pieces of `chunk` bytes (at least 1), so that frames that
/// straddle reads are exercised too. `token` is the cluster token the
/// receiving proc requires, if any.
pub fn receive_stream(
    stream: &[u8],
    chunk: usize,
    max_frame: usize,
    token: Option<&ClusterToken>,
) -> Result<StreamSummary, FrameError> {
    let mut reader = FrameReader::new(max_frame);
    let mut source = Chunked {
        rest: stream,
        chunk: chunk.max(1),
    };
    let mut summary = StreamSummary::default();
    loop {
        while let Some((header, range)) = reader.next_frame()? {
            let body = reader.body(range);
            match (header.kind, &summary.hello_from) {
                (FrameKind::Hello, None) => {
                    summary.hello_from = Some(check_hello(body, token)?);
                }
                (FrameKind::Data, Some(_)) => {
                    check_envelope(body)?;
                    summary.envelopes += 1;
                }
                // The peer acknowledges what this proc's link wrote on the
                // connection (LK-9): a count, nothing to decode.
                (FrameKind::Ack, Some(_)) => summary.acks += 1,
                // The peer says it restarted: the connection ends here.
                (FrameKind::Restarted, Some(_)) => return Ok(summary),
                (kind, _) => return Err(FrameError::BadKind(kind as u8)),
            }
        }
        // Reading from a slice never waits, so polling once completes it.
        let filled = poll_once(reader.fill(&mut source)).unwrap_or_else(|| {
            Err(FrameError::Invalid(
                "reading a slice did not complete".into(),
            ))
        })?;
        if !filled {
            return Ok(summary);
        }
    }
}

/// Checks the body of a hello frame, `from` or `from\ntoken`, as a
/// receiving proc does: with `token` set, the hello must carry it. Returns
/// the peer's name.
pub fn check_hello(body: &[u8], token: Option<&ClusterToken>) -> Result<String, FrameError> {
    let (from, given) = match body.iter().position(|&b| b == b'\n') {
        Some(at) => (&body[..at], Some(&body[at + 1..])),
        None => (body, None),
    };
    if let Some(required) = token
        && !given.is_some_and(|given| required.matches(given))
    {
        return Err(FrameError::Invalid(format!(
            "{} did not present this cluster's token",
            String::from_utf8_lossy(from)
        )));
    }
    Ok(String::from_utf8_lossy(from).into_owned())
}

/// Validates a data frame's body as an envelope and decodes what delivery
/// decodes: the sender, the destination and return ports, and the message
/// (whose bounds must lie inside the body), a failure, or an undeliverable
/// message. The message itself is decoded as a `String` and as a
/// `Vec<u64>`, two of the shapes actors receive; either may fail.
pub fn check_envelope(body: &[u8]) -> Result<(), FrameError> {
    let invalid = |e: rancor::Error| FrameError::Invalid(e.to_string());
    let envelope = rkyv::access::<ArchivedEnvelope, rancor::Error>(body).map_err(invalid)?;
    let _dest: PortId =
        rkyv::deserialize::<PortId, rancor::Error>(&envelope.dest).map_err(invalid)?;
    let _sender: ActorId =
        rkyv::deserialize::<ActorId, rancor::Error>(&envelope.sender).map_err(invalid)?;
    if let Some(port) = envelope.return_port.as_deref() {
        rkyv::deserialize::<PortId, rancor::Error>(port).map_err(invalid)?;
    }
    let _type_name: &str = envelope.message_type.as_str();
    match &envelope.body {
        ArchivedBody::Message { offset, len } => {
            let start = offset.to_native() as usize;
            let bytes = start
                .checked_add(len.to_native() as usize)
                .and_then(|end| body.get(start..end))
                .ok_or_else(|| FrameError::Invalid("message outside its frame".into()))?;
            let _ = String::decode(bytes);
            let _ = Vec::<u64>::decode(bytes);
        }
        ArchivedBody::Failure(failure) => {
            rkyv::deserialize::<DeliveryFailure, rancor::Error>(failure.get()).map_err(invalid)?;
        }
        ArchivedBody::Undeliverable(undeliverable) => {
            rkyv::deserialize::<Undeliverable, rancor::Error>(undeliverable.get())
                .map_err(invalid)?;
        }
    }
    Ok(())
}

/// Frames a seed corpus can start from: a hello from `from` with `token`,
/// then one data frame per message, each an envelope from `local:peer,peer,sender[0]`
/// to `local:proc,proc,actor[0]` on port 7 carrying a `String`.
pub fn sample_stream(from: &str, token: Option<&str>, messages: &[&str]) -> Vec<u8> {
    use crate::channel::frame::{finish_frame, frame_buffer, small_frame};
    use crate::message::{Body, Envelope, encode_envelope};

    let mut hello = from.as_bytes().to_vec();
    if let Some(token) = token {
        hello.push(b'\n');
        hello.extend_from_slice(token.as_bytes());
    }
    let mut stream = small_frame(FrameKind::Hello, 1, &hello);
    let id = |text: &str| text.parse::<ActorId>();
    let (Ok(sender), Ok(dest)) = (
        id("local:peer,peer,sender[0]"),
        id("local:proc,proc,actor[0]"),
    ) else {
        return stream;
    };
    for (seq, message) in messages.iter().enumerate() {
        let buf = frame_buffer(256);
        let Ok(buf) = message.to_string().encode_into(buf) else {
            continue;
        };
        let len = (buf.len() - crate::channel::frame::HEADER_LEN) as u32;
        // The envelope follows the message at an 8-byte boundary.
        let mut buf = buf;
        while !buf.len().is_multiple_of(8) {
            buf.push(0);
        }
        let envelope = Envelope {
            sender: sender.clone(),
            dest: dest.port_id(7),
            return_port: Some(sender.port_id(9)),
            message_type: crate::mailbox::TypeName::Static("alloc::string::String"),
            body: Body::Message { offset: 0, len },
        };
        let Ok(mut buf) = encode_envelope(&envelope, buf) else {
            continue;
        };
        finish_frame(&mut buf, FrameKind::Data, seq as u64 + 1);
        stream.extend_from_slice(&buf);
    }
    stream
}

/// A reader over a slice that hands out at most `chunk` bytes per read.
struct Chunked<'a> {
    rest: &'a [u8],
    chunk: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self.chunk.min(self.rest.len()).min(buf.remaining());
        let (head, tail) = self.rest.split_at(n);
        buf.put_slice(head);
        self.rest = tail;
        Poll::Ready(Ok(()))
    }
}

/// Polls a future once with a waker that does nothing.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "sample-token";

    #[test]
    fn a_sample_stream_is_read_whole_in_any_read_size() {
        let token = ClusterToken::new(TOKEN);
        let stream = sample_stream("local:peer,peer", Some(TOKEN), &["a", "bc", "def"]);
        for chunk in [1, 7, 16, 4096] {
            let summary = receive_stream(&stream, chunk, 1 << 20, token.as_ref()).unwrap();
            assert_eq!(summary.hello_from.as_deref(), Some("local:peer,peer"));
            assert_eq!(summary.envelopes, 3);
        }
    }

    #[test]
    fn bad_streams_are_errors() {
        let token = ClusterToken::new(TOKEN);
        let stream = sample_stream("local:peer,peer", None, &["a"]);
        assert!(matches!(
            receive_stream(&stream, 64, 1 << 20, token.as_ref()),
            Err(FrameError::Invalid(_))
        ));
        let cut = &stream[..stream.len() - 8];
        assert!(matches!(
            receive_stream(cut, 64, 1 << 20, None),
            Err(FrameError::Truncated(_))
        ));
        // The data frame's body (after the 32-byte hello frame and the
        // data frame's header), garbled: not an archived envelope.
        let mut garbled = stream.clone();
        garbled[48..].fill(0xff);
        assert!(matches!(
            receive_stream(&garbled, 64, 1 << 20, None),
            Err(FrameError::Invalid(_))
        ));
    }
}
