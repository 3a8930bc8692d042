//! Errors as the WIT gives them to guests: the mesh layer's rank errors
//! and faults ([`hyperactor_mesh::Fault`]) turned into `call-error`s and
//! `supervision-failure`s with a kind, an origin and a backtrace.
//!
//! - ER-1: an error about an actor names its mesh and rank (its origin);
//!   the call errors of requests that waited on a failed actor have the
//!   kind of that actor's one failure event.

use hyperactor_mesh::{Fault, FaultKind, RankError};

use crate::bindings::{CallError, ErrorKind, Origin, SupervisionFailure};

/// The WIT kind of a fault kind.
pub(crate) fn wit_kind(kind: FaultKind) -> ErrorKind {
    match kind {
        FaultKind::Endpoint => ErrorKind::Endpoint,
        FaultKind::Trap => ErrorKind::Trap,
        FaultKind::Deadline => ErrorKind::Deadline,
        FaultKind::OutOfMemory => ErrorKind::OutOfMemory,
        FaultKind::ProcLost => ErrorKind::ProcLost,
        FaultKind::Stopped => ErrorKind::Stopped,
        FaultKind::Timeout => ErrorKind::Timeout,
        FaultKind::Invalid => ErrorKind::Invalid,
        FaultKind::Supervision => ErrorKind::Supervision,
    }
}

/// The kind's name as the WIT spells it (`proc-lost`).
pub(crate) fn kind_name(kind: ErrorKind) -> &'static str {
    FaultKind::ALL
        .into_iter()
        .find(|fault| wit_kind(*fault) == kind)
        .map_or("unknown", FaultKind::name)
}

/// A request refused before anything was sent.
pub(crate) fn invalid(message: impl Into<String>) -> CallError {
    unattributed(ErrorKind::Invalid, message)
}

/// An error of the request as a whole, about no one actor.
pub(crate) fn unattributed(kind: ErrorKind, message: impl Into<String>) -> CallError {
    CallError {
        kind,
        origin: None,
        message: message.into(),
        type_name: None,
        backtrace: None,
    }
}

/// An error of kind `kind` about `mesh[rank]`.
pub(crate) fn at_rank(
    kind: ErrorKind,
    mesh: &str,
    rank: u32,
    endpoint: Option<&str>,
    message: impl Into<String>,
) -> CallError {
    CallError {
        kind,
        origin: Some(Origin {
            mesh: mesh.to_string(),
            rank,
            endpoint: endpoint.map(str::to_string),
        }),
        message: message.into(),
        type_name: None,
        backtrace: None,
    }
}

/// The fault a rank error stands for (ER-1).
pub(crate) fn rank_fault(error: RankError) -> Fault {
    match error {
        // An endpoint's error text, or a fault the actor encoded in it (a
        // deadline, a stop while it was handling the request).
        RankError::Endpoint(text) => Fault::decode(&text, FaultKind::Endpoint),
        // The actor's failure, as its host encoded it; plain text is a
        // panic of a native actor.
        RankError::Failed(reason) => Fault::decode(&reason, FaultKind::Trap),
        RankError::Stopped(reason) => Fault::new(FaultKind::Stopped, reason),
        RankError::Lost(reason) => Fault::new(FaultKind::ProcLost, reason),
        RankError::Timeout(ms) => Fault::new(
            FaultKind::Timeout,
            format!("no reply within {ms} ms (the call timeout)"),
        ),
        RankError::Invalid(reason) => Fault::new(FaultKind::Invalid, reason),
    }
}

/// The call error of `mesh[rank]`'s `error`, for a request to `endpoint`.
pub(crate) fn call_error(mesh: &str, rank: u32, endpoint: &str, error: RankError) -> CallError {
    fault_error(mesh, rank, endpoint, rank_fault(error))
}

/// The call error of `mesh[rank]`'s `fault`.
pub(crate) fn fault_error(mesh: &str, rank: u32, endpoint: &str, fault: Fault) -> CallError {
    CallError {
        kind: wit_kind(fault.kind),
        origin: Some(Origin {
            mesh: mesh.to_string(),
            rank,
            endpoint: Some(fault.endpoint.unwrap_or_else(|| endpoint.to_string())),
        }),
        message: fault.message,
        type_name: fault.type_name,
        backtrace: fault.backtrace,
    }
}

/// The failure event of `mesh[rank]`.
pub(crate) fn failure(mesh: &str, rank: u32, fault: Fault) -> SupervisionFailure {
    SupervisionFailure {
        mesh: mesh.to_string(),
        rank,
        kind: wit_kind(fault.kind),
        endpoint: fault.endpoint,
        type_name: fault.type_name,
        reason: fault.message,
        backtrace: fault.backtrace,
    }
}

/// The call error that a request to a failed actor gets: the failure's
/// kind and words, and the endpoint it failed in (ER-1). A request that
/// reaches the dead actor's proc gets the same error from there, so the
/// two agree whichever way the race between the failure event and the
/// request goes.
pub(crate) fn from_failure(failure: &SupervisionFailure, endpoint: &str) -> CallError {
    CallError {
        kind: failure.kind,
        origin: Some(Origin {
            mesh: failure.mesh.clone(),
            rank: failure.rank,
            endpoint: Some(
                failure
                    .endpoint
                    .clone()
                    .unwrap_or_else(|| endpoint.to_string()),
            ),
        }),
        message: failure.reason.clone(),
        type_name: failure.type_name.clone(),
        backtrace: failure.backtrace.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn er1_rank_errors_keep_their_kind_and_origin() {
        let mut fault = Fault::new(FaultKind::Endpoint, "bad value").at_endpoint("fail");
        fault.type_name = Some("ValueError".into());
        let error = call_error("w", 3, "fail", RankError::Endpoint(fault.encode()));
        assert_eq!(error.kind, ErrorKind::Endpoint);
        assert_eq!(error.type_name.as_deref(), Some("ValueError"));
        let origin = error.origin.unwrap();
        assert_eq!((origin.mesh.as_str(), origin.rank), ("w", 3));
        assert_eq!(origin.endpoint.as_deref(), Some("fail"));

        let plain = call_error("w", 1, "step", RankError::Endpoint("no".into()));
        assert_eq!(
            (plain.kind, plain.message.as_str()),
            (ErrorKind::Endpoint, "no")
        );
        let kinds = [
            (RankError::Stopped("s".into()), ErrorKind::Stopped),
            (RankError::Lost("l".into()), ErrorKind::ProcLost),
            (RankError::Timeout(5), ErrorKind::Timeout),
            (RankError::Failed("panicked".into()), ErrorKind::Trap),
            (
                RankError::Failed(Fault::new(FaultKind::Deadline, "d").encode()),
                ErrorKind::Deadline,
            ),
        ];
        for (rank_error, kind) in kinds {
            assert_eq!(call_error("w", 0, "e", rank_error).kind, kind);
        }
    }

    #[test]
    fn every_kind_has_the_wit_name_of_its_fault_kind() {
        for kind in FaultKind::ALL {
            assert_eq!(kind_name(wit_kind(kind)), kind.name());
        }
    }

    #[test]
    fn er1_a_failure_and_the_errors_that_refer_to_it_agree() {
        let mut fault = Fault::new(FaultKind::Endpoint, "bad").at_endpoint("fail");
        fault.type_name = Some("ValueError".into());
        let failed = failure("w", 2, fault);
        assert_eq!(failed.type_name.as_deref(), Some("ValueError"));
        let later = from_failure(&failed, "echo");
        assert_eq!(
            (later.kind, later.message.as_str()),
            (ErrorKind::Endpoint, "bad")
        );
        assert_eq!(later.type_name.as_deref(), Some("ValueError"));
        let origin = later.origin.unwrap();
        assert_eq!((origin.mesh.as_str(), origin.rank), ("w", 2));
        // The endpoint the actor failed in, not the one asked of it later.
        assert_eq!(origin.endpoint.as_deref(), Some("fail"));
    }
}
