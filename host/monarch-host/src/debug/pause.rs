//! Breakpoints: the host side of the WIT interface `debug`.

/// How a run's actors reach its debugger.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DebugConfig {
    /// The debug hub's address for actors (`IP:PORT`).
    pub addr: String,
    /// The secret an actor or a client shows the hub.
    pub token: String,
    /// How long a pause with no debugger connected lasts, in milliseconds.
    pub pause_limit_ms: u64,
}

/// An instance's breakpoint state.
#[derive(Default)]
pub struct ActorDebug {}
