//! Errors are values: a failed call, a failed actor and a refused mesh
//! operation each come back as one of these types, never as a trap.
//!
//! - [`CallError`]: why a request did not return a value. It carries an
//!   [`ErrorKind`] (what went wrong, to act on), the [`Origin`] it is about
//!   (mesh, rank, endpoint), the message, and for endpoint errors the
//!   error's type name and backtrace as the actor gave them.
//! - [`EndpointError`]: what a [`Handler`](crate::Handler) returns instead
//!   of a reply; the caller sees it as a `CallError` of kind
//!   [`ErrorKind::Endpoint`].
//! - [`SupervisionFailure`]: an actor of a mesh the program owns failed.
//! - [`MeshError`]: the host refused a mesh operation.

use std::fmt;

use crate::bindings::monarch::host::types as wit;

/// What kind of thing went wrong: the WIT `error-kind`, plus
/// [`ErrorKind::Decode`] for the SDK's own case of a reply that does not
/// decode.
///
/// [`name`](Self::name) (and `Display`) give the WIT's kebab-case names:
/// `endpoint`, `trap`, `deadline`, `out-of-memory`, `proc-lost`, `stopped`,
/// `timeout`, `invalid`, `supervision`, and `decode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The endpoint returned an error. In a call the actor lives on; after
    /// a `broadcast` the actor is stopped and its owner told.
    Endpoint,
    /// The actor trapped (a Rust panic, `unreachable`, a bad memory
    /// access...) and failed.
    Trap,
    /// A handler ran past its deadline
    /// ([`SpawnOptions::handler_timeout`](crate::SpawnOptions::handler_timeout),
    /// [`set_handler_timeout`](crate::set_handler_timeout)) and the actor
    /// failed.
    Deadline,
    /// The actor's memory reached its cap and the actor failed.
    OutOfMemory,
    /// The actor's proc exited, was killed, or its host was lost.
    ProcLost,
    /// The actor, its mesh or its proc mesh was stopped by its owner.
    Stopped,
    /// No reply within the call timeout
    /// ([`set_call_timeout`](crate::set_call_timeout)).
    Timeout,
    /// The request was not valid: a size mismatch, an empty mesh, a
    /// message that could not be encoded...
    Invalid,
    /// A mesh the actor owned had a failure its supervisor did not handle,
    /// so the actor failed in turn.
    Supervision,
    /// The SDK's own: a reply arrived but is not the type the endpoint
    /// promised (caller and actor disagree about the message types).
    Decode,
}

impl ErrorKind {
    /// The kind's name as the WIT spells it (`proc-lost`), or `decode`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Endpoint => "endpoint",
            ErrorKind::Trap => "trap",
            ErrorKind::Deadline => "deadline",
            ErrorKind::OutOfMemory => "out-of-memory",
            ErrorKind::ProcLost => "proc-lost",
            ErrorKind::Stopped => "stopped",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Supervision => "supervision",
            ErrorKind::Decode => "decode",
        }
    }

    /// Whether the kind means the actor failed (and a failure event names
    /// it): a trap, a deadline, out of memory, a lost proc, a supervision.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            ErrorKind::Trap
                | ErrorKind::Deadline
                | ErrorKind::OutOfMemory
                | ErrorKind::ProcLost
                | ErrorKind::Supervision
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<wit::ErrorKind> for ErrorKind {
    fn from(kind: wit::ErrorKind) -> Self {
        match kind {
            wit::ErrorKind::Endpoint => ErrorKind::Endpoint,
            wit::ErrorKind::Trap => ErrorKind::Trap,
            wit::ErrorKind::Deadline => ErrorKind::Deadline,
            wit::ErrorKind::OutOfMemory => ErrorKind::OutOfMemory,
            wit::ErrorKind::ProcLost => ErrorKind::ProcLost,
            wit::ErrorKind::Stopped => ErrorKind::Stopped,
            wit::ErrorKind::Timeout => ErrorKind::Timeout,
            wit::ErrorKind::Invalid => ErrorKind::Invalid,
            wit::ErrorKind::Supervision => ErrorKind::Supervision,
        }
    }
}

impl From<ErrorKind> for wit::ErrorKind {
    /// [`ErrorKind::Decode`], which the WIT lacks, becomes `invalid`.
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::Endpoint => wit::ErrorKind::Endpoint,
            ErrorKind::Trap => wit::ErrorKind::Trap,
            ErrorKind::Deadline => wit::ErrorKind::Deadline,
            ErrorKind::OutOfMemory => wit::ErrorKind::OutOfMemory,
            ErrorKind::ProcLost => wit::ErrorKind::ProcLost,
            ErrorKind::Stopped => wit::ErrorKind::Stopped,
            ErrorKind::Timeout => wit::ErrorKind::Timeout,
            ErrorKind::Invalid | ErrorKind::Decode => wit::ErrorKind::Invalid,
            ErrorKind::Supervision => wit::ErrorKind::Supervision,
        }
    }
}

/// The actor an error is about: its mesh, its rank in the mesh as spawned
/// (also when a slice was called), and the endpoint it was handling.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The actor mesh, by name.
    pub mesh: String,
    /// The actor's rank in the mesh as spawned.
    pub rank: u32,
    /// The endpoint being handled, when it was handling one.
    pub endpoint: Option<String>,
}

impl Origin {
    /// The actor `mesh[rank]`, handling no endpoint.
    pub fn new(mesh: impl Into<String>, rank: u32) -> Self {
        Self {
            mesh: mesh.into(),
            rank,
            endpoint: None,
        }
    }

    /// The same actor, handling `endpoint`.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }
}

impl fmt::Display for Origin {
    /// `workers[3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.mesh, self.rank)
    }
}

impl From<wit::Origin> for Origin {
    fn from(o: wit::Origin) -> Self {
        Self {
            mesh: o.mesh,
            rank: o.rank,
            endpoint: o.endpoint,
        }
    }
}

/// An actor that failed: it trapped, ran past its deadline or out of
/// memory, failed a broadcast, failed a supervision, or was lost with its
/// proc. Each failed actor is reported once.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SupervisionFailure {
    /// The mesh, by name.
    pub mesh: String,
    /// The actor's rank in that mesh.
    pub rank: u32,
    /// What happened.
    pub kind: ErrorKind,
    /// The endpoint the actor was handling when it failed, if any.
    pub endpoint: Option<String>,
    /// For [`ErrorKind::Endpoint`] (an error returned to a broadcast): the
    /// error's type as the actor named it.
    pub type_name: Option<String>,
    /// What happened, in the host's words.
    pub reason: String,
    /// The guest backtrace of a trap, or the traceback an endpoint gave.
    pub backtrace: Option<String>,
}

impl fmt::Display for SupervisionFailure {
    /// ``actor workers[3] failed in `step`: trap: wasm unreachable
    /// executed``; the alternate form (`{:#}`) adds the backtrace.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "actor {}[{}] failed", self.mesh, self.rank)?;
        if let Some(endpoint) = &self.endpoint {
            write!(f, " in `{endpoint}`")?;
        }
        write!(f, ": {}: {}", self.kind, self.reason)?;
        write_backtrace(f, self.backtrace.as_deref())
    }
}

impl From<wit::SupervisionFailure> for SupervisionFailure {
    fn from(f: wit::SupervisionFailure) -> Self {
        Self {
            mesh: f.mesh,
            rank: f.rank,
            kind: f.kind.into(),
            endpoint: f.endpoint,
            type_name: f.type_name,
            reason: f.reason,
            backtrace: f.backtrace,
        }
    }
}

impl From<SupervisionFailure> for wit::SupervisionFailure {
    fn from(f: SupervisionFailure) -> Self {
        Self {
            mesh: f.mesh,
            rank: f.rank,
            kind: f.kind.into(),
            endpoint: f.endpoint,
            type_name: f.type_name,
            reason: f.reason,
            backtrace: f.backtrace,
        }
    }
}

/// Why a call did not return a value: the WIT `call-error`, or a reply
/// that does not decode ([`ErrorKind::Decode`]).
///
/// Act on [`kind`](Self::kind); [`origin`](Self::origin) (or
/// [`mesh`](Self::mesh), [`rank`](Self::rank), [`endpoint`](Self::endpoint))
/// names the actor, and an endpoint's error keeps the
/// [`type_name`](Self::type_name) and [`backtrace`](Self::backtrace) it was
/// given. `?` turns a `CallError` into a `String` (for `main`) or an
/// [`EndpointError`] (for a handler).
///
/// ```
/// use monarch_guest::{CallError, ErrorKind, Origin};
///
/// let err = CallError::new(ErrorKind::Endpoint, "bad value")
///     .with_origin(Origin::new("workers", 1).with_endpoint("fail"))
///     .with_type("ValueError");
/// assert_eq!(err.kind(), ErrorKind::Endpoint);
/// assert_eq!(err.rank(), Some(1));
/// assert_eq!(
///     err.to_string(),
///     "the endpoint `fail` at workers[1] returned an error: ValueError: bad value"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    kind: ErrorKind,
    origin: Option<Origin>,
    message: String,
    type_name: Option<String>,
    backtrace: Option<String>,
}

impl CallError {
    /// An error of `kind` about no actor in particular.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            origin: None,
            message: message.into(),
            type_name: None,
            backtrace: None,
        }
    }

    /// The same error, about the actor `origin`.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }

    /// The same error, with the type name of an endpoint's error.
    pub fn with_type(mut self, type_name: impl Into<String>) -> Self {
        self.type_name = Some(type_name.into());
        self
    }

    /// The same error, with a backtrace.
    pub fn with_backtrace(mut self, backtrace: impl Into<String>) -> Self {
        self.backtrace = Some(backtrace.into());
        self
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }

    pub(crate) fn decode(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Decode, message)
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The actor the error is about; `None` for errors of the request as a
    /// whole (an invalid request, a reply that does not decode).
    pub fn origin(&self) -> Option<&Origin> {
        self.origin.as_ref()
    }

    /// The mesh the error names, where it names one.
    pub fn mesh(&self) -> Option<&str> {
        self.origin.as_ref().map(|o| o.mesh.as_str())
    }

    /// The rank (in the mesh as spawned) the error names, where it names
    /// one.
    pub fn rank(&self) -> Option<u32> {
        self.origin.as_ref().map(|o| o.rank)
    }

    /// The endpoint the actor was handling, where the error names one.
    pub fn endpoint(&self) -> Option<&str> {
        self.origin.as_ref().and_then(|o| o.endpoint.as_deref())
    }

    /// What went wrong, in words: the endpoint's error text, the trap, the
    /// deadline...
    pub fn message(&self) -> &str {
        &self.message
    }

    /// For [`ErrorKind::Endpoint`]: the error's type as the actor named it
    /// (see [`EndpointError::with_type`]).
    pub fn type_name(&self) -> Option<&str> {
        self.type_name.as_deref()
    }

    /// A guest backtrace or traceback, where one is known.
    pub fn backtrace(&self) -> Option<&str> {
        self.backtrace.as_deref()
    }
}

impl fmt::Display for CallError {
    /// One line that says what failed where; the alternate form (`{:#}`)
    /// adds the backtrace on the lines after it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |f: &mut fmt::Formatter<'_>| match &self.origin {
            Some(origin) => write!(f, " {origin}"),
            None => Ok(()),
        };
        match self.kind {
            ErrorKind::Endpoint => {
                match self.endpoint() {
                    Some(endpoint) => write!(f, "the endpoint `{endpoint}`")?,
                    None => f.write_str("an endpoint")?,
                }
                if let Some(origin) = &self.origin {
                    write!(f, " at {origin}")?;
                }
                f.write_str(" returned an error: ")?;
                if let Some(type_name) = &self.type_name {
                    write!(f, "{type_name}: ")?;
                }
                f.write_str(&self.message)?;
            }
            ErrorKind::Timeout => {
                f.write_str("no reply")?;
                if let Some(origin) = &self.origin {
                    write!(f, " from {origin}")?;
                }
                if let Some(endpoint) = self.endpoint() {
                    write!(f, " to `{endpoint}`")?;
                }
                write!(
                    f,
                    " within the call timeout (see set_call_timeout): {}",
                    self.message
                )?;
            }
            ErrorKind::Invalid => write!(f, "the request was not valid: {}", self.message)?,
            ErrorKind::Decode => write!(
                f,
                "cannot decode the reply ({}); do caller and actor agree on the message types?",
                self.message
            )?,
            kind => {
                f.write_str("actor")?;
                at(f)?;
                f.write_str(if kind == ErrorKind::Stopped {
                    " is stopped"
                } else {
                    " failed"
                })?;
                if let Some(endpoint) = self.endpoint() {
                    write!(f, " in `{endpoint}`")?;
                }
                if kind == ErrorKind::Stopped {
                    write!(f, ": {}", self.message)?;
                } else {
                    write!(f, ": {kind}: {}", self.message)?;
                }
            }
        }
        write_backtrace(f, self.backtrace.as_deref())
    }
}

fn write_backtrace(f: &mut fmt::Formatter<'_>, backtrace: Option<&str>) -> fmt::Result {
    match backtrace {
        Some(backtrace) if f.alternate() => write!(f, "\nbacktrace:\n{backtrace}"),
        _ => Ok(()),
    }
}

impl std::error::Error for CallError {}

impl From<wit::CallError> for CallError {
    fn from(e: wit::CallError) -> Self {
        Self {
            kind: e.kind.into(),
            origin: e.origin.map(Origin::from),
            message: e.message,
            type_name: e.type_name,
            backtrace: e.backtrace,
        }
    }
}

impl From<CallError> for String {
    fn from(e: CallError) -> Self {
        e.to_string()
    }
}

/// What a [`Handler`](crate::Handler) returns instead of a reply: the
/// caller's call ends with a [`CallError`] of kind
/// [`ErrorKind::Endpoint`] carrying the message, type name and backtrace.
/// In a call the actor lives on; after a `broadcast`, where nobody waits
/// for the reply, the actor fails and its owner is told.
///
/// A `String` or `&str` converts into one with no type name, and so does a
/// [`CallError`] (keeping its type name and backtrace), so `?` on a call
/// inside a handler passes the callee's error on:
///
/// ```
/// use monarch_guest::EndpointError;
///
/// let plain: EndpointError = "no such key".into();
/// assert_eq!(plain.type_name(), None);
/// let typed = EndpointError::new("bad value").with_type("ValueError");
/// assert_eq!(typed.to_string(), "ValueError: bad value");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointError {
    message: String,
    type_name: Option<String>,
    backtrace: Option<String>,
}

impl EndpointError {
    /// An error with this message and no type name.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            type_name: None,
            backtrace: None,
        }
    }

    /// The same error, with a type name (an exception class, a Rust type)
    /// that the caller sees as [`CallError::type_name`].
    pub fn with_type(mut self, type_name: impl Into<String>) -> Self {
        self.type_name = Some(type_name.into());
        self
    }

    /// The same error, with a backtrace or traceback as text.
    pub fn with_backtrace(mut self, backtrace: impl Into<String>) -> Self {
        self.backtrace = Some(backtrace.into());
        self
    }

    /// The error, in words.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error's type name, if it has one.
    pub fn type_name(&self) -> Option<&str> {
        self.type_name.as_deref()
    }

    /// The backtrace, if it has one.
    pub fn backtrace(&self) -> Option<&str> {
        self.backtrace.as_deref()
    }
}

impl fmt::Display for EndpointError {
    /// `ValueError: bad value`, or the message alone.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(type_name) = &self.type_name {
            write!(f, "{type_name}: ")?;
        }
        f.write_str(&self.message)?;
        write_backtrace(f, self.backtrace.as_deref())
    }
}

impl std::error::Error for EndpointError {}

impl From<String> for EndpointError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for EndpointError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl From<CallError> for EndpointError {
    /// The call's error, said in full (which actor, which endpoint), with
    /// its type name and backtrace.
    fn from(e: CallError) -> Self {
        Self {
            message: e.to_string(),
            type_name: e.type_name,
            backtrace: e.backtrace,
        }
    }
}

impl From<MeshError> for EndpointError {
    fn from(e: MeshError) -> Self {
        Self::new(e.to_string())
    }
}

impl From<crate::time::Elapsed> for EndpointError {
    fn from(e: crate::time::Elapsed) -> Self {
        Self::new(e.to_string())
    }
}

impl From<EndpointError> for wit::EndpointError {
    fn from(e: EndpointError) -> Self {
        Self {
            message: e.message,
            type_name: e.type_name,
            backtrace: e.backtrace,
        }
    }
}

/// The host refused a mesh operation: spawning procs or actors, slicing,
/// resolving a reference, killing a proc.
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

    fn wit_error(kind: wit::ErrorKind, endpoint: Option<&str>, message: &str) -> wit::CallError {
        wit::CallError {
            kind,
            origin: Some(wit::Origin {
                mesh: "workers".into(),
                rank: 3,
                endpoint: endpoint.map(Into::into),
            }),
            message: message.into(),
            type_name: None,
            backtrace: None,
        }
    }

    #[test]
    fn wit_call_errors_keep_kind_origin_and_text() {
        let err = CallError::from(wit::CallError {
            type_name: Some("ValueError".into()),
            backtrace: Some("frame 0".into()),
            ..wit_error(wit::ErrorKind::Endpoint, Some("fail"), "bad value")
        });
        assert_eq!(err.kind(), ErrorKind::Endpoint);
        assert_eq!(
            (err.mesh(), err.rank(), err.endpoint()),
            (Some("workers"), Some(3), Some("fail"))
        );
        assert_eq!(err.message(), "bad value");
        assert_eq!(err.type_name(), Some("ValueError"));
        assert_eq!(err.backtrace(), Some("frame 0"));
        assert_eq!(
            err.to_string(),
            "the endpoint `fail` at workers[3] returned an error: ValueError: bad value"
        );
        assert_eq!(
            format!("{err:#}"),
            "the endpoint `fail` at workers[3] returned an error: ValueError: bad value\n\
             backtrace:\nframe 0"
        );
    }

    #[test]
    fn failures_read_as_what_failed_where() {
        let trap = CallError::from(wit_error(
            wit::ErrorKind::Trap,
            Some("step"),
            "wasm unreachable executed",
        ));
        assert_eq!(
            trap.to_string(),
            "actor workers[3] failed in `step`: trap: wasm unreachable executed"
        );
        let stopped = CallError::from(wit_error(wit::ErrorKind::Stopped, None, "by its owner"));
        assert_eq!(
            stopped.to_string(),
            "actor workers[3] is stopped: by its owner"
        );
        let invalid = CallError::from(wit::CallError {
            origin: None,
            ..wit_error(wit::ErrorKind::Invalid, None, "unknown mesh")
        });
        assert_eq!(invalid.rank(), None);
        assert_eq!(
            invalid.to_string(),
            "the request was not valid: unknown mesh"
        );
    }

    #[test]
    fn kinds_are_named_as_the_wit_names_them() {
        let names: Vec<_> = [
            ErrorKind::Endpoint,
            ErrorKind::Trap,
            ErrorKind::Deadline,
            ErrorKind::OutOfMemory,
            ErrorKind::ProcLost,
            ErrorKind::Stopped,
            ErrorKind::Timeout,
            ErrorKind::Invalid,
            ErrorKind::Supervision,
            ErrorKind::Decode,
        ]
        .iter()
        .map(|k| k.to_string())
        .collect();
        assert_eq!(
            names,
            [
                "endpoint",
                "trap",
                "deadline",
                "out-of-memory",
                "proc-lost",
                "stopped",
                "timeout",
                "invalid",
                "supervision",
                "decode"
            ]
        );
        assert_eq!(
            ErrorKind::from(wit::ErrorKind::ProcLost),
            ErrorKind::ProcLost
        );
    }

    #[test]
    fn supervision_failures_name_kind_and_endpoint() {
        let failure = SupervisionFailure::from(wit::SupervisionFailure {
            mesh: "m".into(),
            rank: 1,
            kind: wit::ErrorKind::Deadline,
            endpoint: Some("spin".into()),
            type_name: None,
            reason: "ran past 1000 ms".into(),
            backtrace: None,
        });
        assert_eq!(failure.kind, ErrorKind::Deadline);
        assert_eq!(
            failure.to_string(),
            "actor m[1] failed in `spin`: deadline: ran past 1000 ms"
        );
    }

    #[test]
    fn errors_become_strings_with_question_mark() {
        fn handler() -> Result<(), String> {
            Err(CallError::invalid("unknown mesh"))?
        }
        assert_eq!(
            handler().unwrap_err(),
            "the request was not valid: unknown mesh"
        );
    }

    #[test]
    fn a_call_error_becomes_an_endpoint_error_that_keeps_its_type() {
        fn handler() -> Result<(), EndpointError> {
            Err(CallError::from(wit::CallError {
                type_name: Some("ValueError".into()),
                ..wit_error(wit::ErrorKind::Endpoint, Some("fail"), "bad")
            }))?
        }
        let err = handler().unwrap_err();
        assert_eq!(err.type_name(), Some("ValueError"));
        assert_eq!(
            err.message(),
            "the endpoint `fail` at workers[3] returned an error: ValueError: bad"
        );
        let plain: EndpointError = format!("no {}", "key").into();
        assert_eq!((plain.message(), plain.type_name()), ("no key", None));
    }
}
