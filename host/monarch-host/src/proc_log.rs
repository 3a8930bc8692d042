//! A proc's log: where the tracing of a child proc (`monarch-host
//! bootstrap`) goes, set up once per process.
//!
//! - PL-1: a proc logs to its stderr, filtered by `RUST_LOG`, else by
//!   [`PROC_FILTER`] (actor failures reach the program as values, so
//!   hyperactor's own report of them is noise).
//! - PL-2: a fork server makes that log before it forks ([`prepare`]), so
//!   that each proc it forks inherits it made (the tracing registry's
//!   tables are 4 % of a forked proc's CPU to make and touch); a proc takes
//!   it only if its `RUST_LOG` is the one the server made it under, and
//!   makes its own otherwise ([`init`]).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::sync::Mutex;

use tracing::Dispatch;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::util::SubscriberInitExt;

/// What a proc logs without `RUST_LOG` (PL-1).
pub const PROC_FILTER: &str = "warn,hyperactor::actor=off";

/// The log a fork server made, and the `RUST_LOG` it was made under (PL-2).
static AHEAD: Mutex<Option<(Option<OsString>, Dispatch)>> = Mutex::new(None);

/// A log to stderr filtered by `RUST_LOG`, else by `default`.
fn make(default: &str) -> Dispatch {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish()
        .into()
}

/// Makes, in a fork server before it forks, the log its procs would make
/// first thing (PL-2), without installing it. Starts no thread.
pub fn prepare(default: &str) {
    let made = (std::env::var_os("RUST_LOG"), make(default));
    *AHEAD.lock().unwrap_or_else(|p| p.into_inner()) = Some(made);
}

/// Installs this process's log (PL-1): the one its fork server made, when
/// made under the `RUST_LOG` this process has, else a new one. A second
/// call changes nothing.
pub fn init(default: &str) {
    let ahead = AHEAD.lock().unwrap_or_else(|p| p.into_inner()).take();
    let dispatch = match ahead {
        Some((made_under, dispatch)) if made_under == std::env::var_os("RUST_LOG") => dispatch,
        _ => make(default),
    };
    let _ = dispatch.try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PL-2: a log made ahead under this process's `RUST_LOG` is taken by
    /// the first `init`; one made under another is dropped for a new one.
    #[test]
    fn the_log_made_ahead_is_taken_once_under_the_same_rust_log() {
        prepare(PROC_FILTER);
        let under = AHEAD.lock().unwrap().as_ref().map(|(env, _)| env.clone());
        assert_eq!(under, Some(std::env::var_os("RUST_LOG")));
        init(PROC_FILTER);
        assert!(AHEAD.lock().unwrap().is_none(), "taken");
        let other = Some(OsString::from("a filter nobody runs under"));
        *AHEAD.lock().unwrap() = Some((other, make(PROC_FILTER)));
        init(PROC_FILTER);
        assert!(AHEAD.lock().unwrap().is_none(), "dropped");
    }
}
