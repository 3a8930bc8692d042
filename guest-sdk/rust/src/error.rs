//! Errors are values: a failed call, a failed actor and a refused mesh
//! operation each come back as one of these types, never as a trap.

use std::fmt;
use std::time::Duration;

use crate::bindings::monarch::host::types as wit;

/// An actor that failed: it trapped, was stopped, or was lost with its proc.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SupervisionFailure {
    /// The mesh, by name.
    pub mesh: String,
    /// The actor's rank in that mesh.
    pub rank: u32,
    /// What happened, in the host's words.
    pub reason: String,
}

impl fmt::Display for SupervisionFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "actor {}[{}] failed: {}",
            self.mesh, self.rank, self.reason
        )
    }
}

impl From<wit::SupervisionFailure> for SupervisionFailure {
    fn from(f: wit::SupervisionFailure) -> Self {
        Self {
            mesh: f.mesh,
            rank: f.rank,
            reason: f.reason,
        }
    }
}

impl From<SupervisionFailure> for wit::SupervisionFailure {
    fn from(f: SupervisionFailure) -> Self {
        Self {
            mesh: f.mesh,
            rank: f.rank,
            reason: f.reason,
        }
    }
}

/// Why a call did not return a value.
///
/// The first four variants mirror the WIT `call-error`; [`CallError::Decode`]
/// is the SDK's own, for a reply that is not the type the endpoint promised.
/// `?` turns a `CallError` into a `String`, so handlers and `main` can
/// return it as their error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The endpoint at `rank` returned an error; the actor lives on.
    Endpoint {
        /// The rank whose endpoint failed.
        rank: u32,
        /// The endpoint's error text.
        message: String,
    },
    /// An actor failed (trapped, stopped, lost) before it replied.
    Supervision(SupervisionFailure),
    /// No reply within the call timeout
    /// ([`set_call_timeout`](crate::set_call_timeout)).
    Timeout(Duration),
    /// The host refused the request: an unknown mesh, `call_one` on a mesh
    /// of several actors, a message that could not be encoded...
    Invalid(String),
    /// A reply arrived but is not the type the endpoint promised: the two
    /// sides disagree about the message types.
    Decode(String),
}

impl CallError {
    /// The rank the error names, where it names one.
    pub fn rank(&self) -> Option<u32> {
        match self {
            CallError::Endpoint { rank, .. } => Some(*rank),
            CallError::Supervision(failure) => Some(failure.rank),
            _ => None,
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Endpoint { rank, message } => {
                write!(
                    f,
                    "the endpoint at rank {rank} returned an error: {message}"
                )
            }
            CallError::Supervision(failure) => failure.fmt(f),
            CallError::Timeout(after) => write!(
                f,
                "no reply within {} ms (the call timeout; see set_call_timeout)",
                after.as_millis()
            ),
            CallError::Invalid(why) => write!(f, "the request was not valid: {why}"),
            CallError::Decode(why) => write!(
                f,
                "cannot decode the reply ({why}); do caller and actor agree on the message types?"
            ),
        }
    }
}

impl std::error::Error for CallError {}

impl From<wit::CallError> for CallError {
    fn from(e: wit::CallError) -> Self {
        match e {
            wit::CallError::Endpoint((rank, message)) => CallError::Endpoint { rank, message },
            wit::CallError::Supervision(failure) => CallError::Supervision(failure.into()),
            wit::CallError::Timeout(ms) => CallError::Timeout(Duration::from_millis(ms)),
            wit::CallError::Invalid(why) => CallError::Invalid(why),
        }
    }
}

impl From<CallError> for String {
    fn from(e: CallError) -> Self {
        e.to_string()
    }
}

/// The host refused a mesh operation: spawning procs or actors, slicing,
/// resolving a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshError {
    what: String,
    reason: String,
}

impl MeshError {
    pub(crate) fn new(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// What the program tried, such as ``spawning `counters` (class Counter)``.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// Why it failed, in the host's words.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for MeshError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.what, self.reason)
    }
}

impl std::error::Error for MeshError {}

impl From<MeshError> for String {
    fn from(e: MeshError) -> Self {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wit_call_errors_map_to_their_variants() {
        assert_eq!(
            CallError::from(wit::CallError::Endpoint((3, "no".into()))),
            CallError::Endpoint {
                rank: 3,
                message: "no".into()
            }
        );
        let failure = wit::SupervisionFailure {
            mesh: "m".into(),
            rank: 1,
            reason: "trap".into(),
        };
        let err = CallError::from(wit::CallError::Supervision(failure));
        assert_eq!(err.rank(), Some(1));
        assert_eq!(err.to_string(), "actor m[1] failed: trap");
        assert_eq!(
            CallError::from(wit::CallError::Timeout(250)),
            CallError::Timeout(Duration::from_millis(250))
        );
        assert_eq!(
            CallError::from(wit::CallError::Invalid("x".into())).rank(),
            None
        );
    }

    #[test]
    fn errors_become_strings_with_question_mark() {
        fn handler() -> Result<(), String> {
            Err(CallError::Invalid("unknown mesh".into()))?
        }
        assert_eq!(
            handler().unwrap_err(),
            "the request was not valid: unknown mesh"
        );
    }
}
