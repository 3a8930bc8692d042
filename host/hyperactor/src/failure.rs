//! What can go wrong with a message, as values: delivery failures,
//! supervision events and call errors.
//!
//! Invariants:
//! - DF-1: a message that cannot be delivered comes back to its sender as an
//!   [`Undeliverable`] naming the reason; a call waiting on a reply to it ends
//!   with [`CallError::Undeliverable`] or [`CallError::Supervision`].
//! - DF-2: a failure is never answered with another failure, so failures
//!   cannot loop between procs.

use std::fmt;
use std::time::Duration;

use crate::id::{ActorId, PortId};

/// A failed actor, as its owner and its callers see it.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ActorSupervisionEvent {
    /// The actor that failed.
    pub actor_id: ActorId,
    /// Why it failed: the panic text or the handler's error.
    pub reason: String,
    /// The type of the message it was handling, if any.
    pub message: Option<String>,
}

impl fmt::Display for ActorSupervisionEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "actor {} failed: {}", self.actor_id, self.reason)?;
        if let Some(message) = &self.message {
            write!(f, " (while handling {message})")?;
        }
        Ok(())
    }
}

/// Why a message was not delivered.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum DeliveryFailure {
    /// No actor with that id lives in the destination proc.
    UnknownActor {
        /// The actor that was addressed.
        actor: ActorId,
    },
    /// The actor lives but has no such port: the port was closed, or the
    /// actor does not export a handler for the message type.
    UnknownPort {
        /// The port that was addressed.
        port: PortId,
        /// The Rust type of the message.
        message_type: String,
    },
    /// The destination proc could not be reached within the delivery timeout.
    Unreachable {
        /// The address of the destination proc.
        addr: String,
        /// The delivery timeout that expired, in milliseconds.
        timeout_ms: u64,
        /// The last connection error.
        detail: String,
    },
    /// The receiving actor is stopping or stopped.
    StoppedReceiver {
        /// The actor that was addressed.
        actor: ActorId,
    },
    /// The receiving actor failed; this is its supervision event.
    ActorFailed(ActorSupervisionEvent),
    /// The payload did not decode as the port's message type.
    Malformed {
        /// The port that was addressed.
        port: PortId,
        /// The decoder's complaint.
        detail: String,
    },
}

impl fmt::Display for DeliveryFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryFailure::UnknownActor { actor } => write!(f, "no actor {actor}"),
            DeliveryFailure::UnknownPort { port, message_type } => write!(
                f,
                "no port {port} for {message_type} (closed, or the actor does not export a handler for it)"
            ),
            DeliveryFailure::Unreachable {
                addr,
                timeout_ms,
                detail,
            } => write!(
                f,
                "proc at {addr} unreachable for {timeout_ms} ms (delivery timeout): {detail}"
            ),
            DeliveryFailure::StoppedReceiver { actor } => write!(f, "actor {actor} is stopped"),
            DeliveryFailure::ActorFailed(event) => write!(f, "{event}"),
            DeliveryFailure::Malformed { port, detail } => {
                write!(f, "payload for {port} does not decode: {detail}")
            }
        }
    }
}

/// A message that came back to its sender.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Undeliverable {
    /// Where the message was going.
    pub dest: PortId,
    /// The Rust type of the message.
    pub message_type: String,
    /// Why it did not arrive.
    pub reason: DeliveryFailure,
}

impl fmt::Display for Undeliverable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "undeliverable {} to {}: {}",
            self.message_type, self.dest, self.reason
        )
    }
}

/// Why a call did not return a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The request (or its reply) could not be delivered.
    #[error("undeliverable: {0}")]
    Undeliverable(DeliveryFailure),
    /// The actor failed before it replied.
    #[error("supervision: {0}")]
    Supervision(ActorSupervisionEvent),
    /// No reply within the call timeout.
    #[error("no reply within {0:?} (call timeout)")]
    Timeout(Duration),
    /// The mailbox waiting for the reply was closed.
    #[error("the reply port was closed")]
    Closed,
}

impl From<DeliveryFailure> for CallError {
    fn from(failure: DeliveryFailure) -> Self {
        match failure {
            DeliveryFailure::ActorFailed(event) => CallError::Supervision(event),
            other => CallError::Undeliverable(other),
        }
    }
}
