//! Messages and the envelopes that carry them between procs.
//!
//! A message is any Rust value that rkyv can archive: derive
//! `rkyv::Archive, rkyv::Serialize, rkyv::Deserialize` and it is a
//! [`RemoteMessage`]. Inside one proc a message is handed over as the value
//! itself, never encoded; between procs it travels as an archive in the
//! frame, beside the [`Envelope`] that addresses it, and the receiving port
//! validates the archive before it decodes it.
//!
//! An actor's handler for message type `M` listens on a port numbered from
//! `M`'s Rust type name (see [`handler_port`]), so every proc of a job must be
//! built from the same source.

use std::any::type_name;

use rkyv::Place;
use rkyv::api::high::{HighDeserializer, HighSerializer, HighValidator};
use rkyv::bytecheck::CheckBytes;
use rkyv::niche::option_box::{ArchivedOptionBox, OptionBoxResolver};
use rkyv::rancor::{self, Fallible};
use rkyv::ser::Writer;
use rkyv::ser::allocator::ArenaHandle;
use rkyv::string::{ArchivedString, StringResolver};
use rkyv::util::AlignedVec;
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};

use crate::failure::{DeliveryFailure, Undeliverable};
use crate::id::{ActorId, ArchivedPortId, PortId};
use crate::mailbox::TypeName;

/// A value that can be sent to an actor in the same proc or another one.
///
/// Implemented for every type that derives rkyv's `Archive`, `Serialize` and
/// `Deserialize` (with the default validation) and is `Send + 'static`.
pub trait RemoteMessage: Send + Sized + 'static {
    /// Archives the message at the end of `buf` (which keeps its alignment).
    fn encode_into(&self, buf: AlignedVec) -> Result<AlignedVec, rancor::Error>;
    /// Validates an archive and decodes it.
    fn decode(bytes: &[u8]) -> Result<Self, rancor::Error>;
}

impl<T> RemoteMessage for T
where
    T: Send + 'static + rkyv::Archive,
    T: for<'a> rkyv::Serialize<HighSerializer<AlignedVec, ArenaHandle<'a>, rancor::Error>>,
    T::Archived: for<'a> CheckBytes<HighValidator<'a, rancor::Error>>
        + rkyv::Deserialize<T, HighDeserializer<rancor::Error>>,
{
    fn encode_into(&self, buf: AlignedVec) -> Result<AlignedVec, rancor::Error> {
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, buf)
    }

    fn decode(bytes: &[u8]) -> Result<Self, rancor::Error> {
        // Archives are validated in place when aligned, as they are in frames
        // read from a channel; other bytes are copied to an aligned buffer.
        if (bytes.as_ptr() as usize).is_multiple_of(16) {
            rkyv::from_bytes::<T, rancor::Error>(bytes)
        } else {
            let mut aligned = AlignedVec::<16>::with_capacity(bytes.len());
            aligned.extend_from_slice(bytes);
            rkyv::from_bytes::<T, rancor::Error>(&aligned)
        }
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Ports at or above this number are handler ports; below it, ports opened at run time.
pub(crate) const HANDLER_PORT_BASE: u64 = 1 << 63;

/// The port on which an actor's handler for `M` listens.
pub fn handler_port<M: 'static>() -> u64 {
    fnv1a(type_name::<M>().as_bytes()) | HANDLER_PORT_BASE
}

/// The body of an envelope.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) enum Body {
    /// An archived message, stored in the frame body before the envelope at
    /// this offset and length, so that it is archived once, straight into
    /// the frame, and validated in place on arrival.
    Message {
        /// Where the message archive starts in the frame body.
        offset: u32,
        /// Its length.
        len: u32,
    },
    /// A failure for a call's reply port. Boxed, as is the next: archived
    /// inline, the largest variant sets the size of every body, and a
    /// message's would carry a few hundred bytes of padding.
    Failure(Box<DeliveryFailure>),
    /// A message returned to its sender's mailbox.
    Undeliverable(Box<Undeliverable>),
}

/// What travels between procs: a message with its addressing.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Envelope {
    /// The actor (or client mailbox) that sent it.
    pub(crate) sender: ActorId,
    /// Where it goes.
    pub(crate) dest: PortId,
    /// The port waiting for a reply to this message, to fail if it is not
    /// delivered. Archived out of line: a reply, which has none, then
    /// carries four bytes rather than a port's worth of padding.
    #[rkyv(with = OutOfLine)]
    pub(crate) return_port: Option<PortId>,
    /// The Rust type of the message, for error messages: archived as a
    /// string, sent from the sender's static name without a copy.
    #[rkyv(with = AsName)]
    pub(crate) message_type: TypeName,
    /// The message or failure.
    pub(crate) body: Body,
}

/// Archives an `Option<PortId>` as a relative pointer to the port, null for
/// `None` (rkyv's archived `Option<Box<_>>`), without a box on either side.
pub(crate) struct OutOfLine;

impl ArchiveWith<Option<PortId>> for OutOfLine {
    type Archived = ArchivedOptionBox<ArchivedPortId>;
    type Resolver = OptionBoxResolver;

    fn resolve_with(
        field: &Option<PortId>,
        resolver: OptionBoxResolver,
        out: Place<Self::Archived>,
    ) {
        ArchivedOptionBox::resolve_from_option(field.as_ref(), resolver, out);
    }
}

impl<S: Fallible + Writer + ?Sized> SerializeWith<Option<PortId>, S> for OutOfLine
where
    PortId: rkyv::Serialize<S>,
{
    fn serialize_with(
        field: &Option<PortId>,
        serializer: &mut S,
    ) -> Result<OptionBoxResolver, S::Error> {
        ArchivedOptionBox::serialize_from_option(field.as_ref(), serializer)
    }
}

impl<D: Fallible + ?Sized> DeserializeWith<ArchivedOptionBox<ArchivedPortId>, Option<PortId>, D>
    for OutOfLine
where
    ArchivedPortId: rkyv::Deserialize<PortId, D>,
{
    fn deserialize_with(
        field: &ArchivedOptionBox<ArchivedPortId>,
        deserializer: &mut D,
    ) -> Result<Option<PortId>, D::Error> {
        field
            .as_deref()
            .map(|port| rkyv::Deserialize::deserialize(port, deserializer))
            .transpose()
    }
}

/// Archives a [`TypeName`] as the string it names (the same bytes as a
/// `String`), straight from the name a sender holds; decoding shares it.
pub(crate) struct AsName;

impl ArchiveWith<TypeName> for AsName {
    type Archived = ArchivedString;
    type Resolver = StringResolver;

    fn resolve_with(field: &TypeName, resolver: StringResolver, out: Place<ArchivedString>) {
        ArchivedString::resolve_from_str(field, resolver, out);
    }
}

impl<S: Fallible + Writer + ?Sized> SerializeWith<TypeName, S> for AsName
where
    S::Error: rancor::Source,
{
    fn serialize_with(field: &TypeName, serializer: &mut S) -> Result<StringResolver, S::Error> {
        ArchivedString::serialize_from_str(field, serializer)
    }
}

impl<D: Fallible + ?Sized> DeserializeWith<ArchivedString, TypeName, D> for AsName {
    fn deserialize_with(field: &ArchivedString, _: &mut D) -> Result<TypeName, D::Error> {
        Ok(TypeName::Shared(field.as_str().into()))
    }
}

/// Archives an envelope at the end of `buf`.
pub(crate) fn encode_envelope(
    envelope: &Envelope,
    buf: AlignedVec,
) -> Result<AlignedVec, rancor::Error> {
    rkyv::api::high::to_bytes_in::<_, rancor::Error>(envelope, buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Sample {
        text: String,
        values: Vec<u64>,
    }

    #[test]
    fn messages_round_trip_from_unaligned_bytes() {
        let sample = Sample {
            text: "hello".into(),
            values: vec![1, 2, 3],
        };
        let bytes = sample.encode_into(AlignedVec::new()).unwrap();
        let mut shifted = vec![0u8; bytes.len() + 1];
        shifted[1..].copy_from_slice(&bytes);
        assert_eq!(Sample::decode(&shifted[1..]).unwrap(), sample);
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(Sample::decode(&[0xff; 24]).is_err());
        assert!(Sample::decode(&[]).is_err());
    }

    fn envelope(return_port: Option<PortId>) -> Envelope {
        let proc: crate::ProcId = "unix:/tmp/monarch-bench-4683/worker.sock,worker"
            .parse()
            .unwrap();
        let sender = proc.actor_id("driver", 0).unwrap();
        Envelope {
            dest: proc.actor_id("echo", 0).unwrap().port_id(7),
            return_port,
            message_type: TypeName::Static("alloc::vec::Vec<u8>"),
            body: Body::Message { offset: 0, len: 0 },
            sender,
        }
    }

    /// A message's envelope is its ids and type name with little else: the
    /// rare failure bodies and an absent return port are not padded into
    /// every frame (they made a reply's envelope 544 bytes, not 304).
    #[test]
    fn a_message_envelope_carries_no_padding_for_what_it_lacks() {
        let reply = encode_envelope(&envelope(None), AlignedVec::new()).unwrap();
        assert!(
            reply.len() <= 240,
            "a reply's envelope is {} bytes",
            reply.len()
        );
        let port = envelope(None).sender.port_id(3);
        let call = encode_envelope(&envelope(Some(port.clone())), AlignedVec::new()).unwrap();
        assert!(
            call.len() <= reply.len() + 128,
            "a call's envelope is {} bytes, a reply's {}",
            call.len(),
            reply.len()
        );
        let archived = rkyv::access::<ArchivedEnvelope, rancor::Error>(&call).unwrap();
        let back: PortId =
            rkyv::deserialize::<PortId, rancor::Error>(archived.return_port.as_deref().unwrap())
                .unwrap();
        assert_eq!(back, port);
        let archived = rkyv::access::<ArchivedEnvelope, rancor::Error>(&reply).unwrap();
        assert!(archived.return_port.as_deref().is_none());
    }

    #[test]
    fn handler_ports_differ_by_type_and_are_stable() {
        assert_ne!(handler_port::<Sample>(), handler_port::<u64>());
        assert_eq!(handler_port::<Sample>(), handler_port::<Sample>());
        assert!(handler_port::<u64>() >= HANDLER_PORT_BASE);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
