//! Breakpoints: the host side of the WIT interface `debug`.
//!
//! A pause is one TCP connection from the paused instance to its run's
//! debug hub ([`super::hub`]), in JSON lines: the instance says who and
//! where it is, then asks for lines (`want`) and sends output (`out`)
//! until it resumes (`done`). The hub answers with input lines (`in`), or
//! abandons the pause (`abandon`) when no debugger has come for the run's
//! pause limit. `breakpoint` runs a small debugger of its own over the
//! values the guest shows (`p`, `locals`, `where`, `c`); `pause`,
//! `read-line`, `write` and `resume` carry a language's own (pdb).
//!
//! While paused, an instance counts the time on its [`PauseClock`], by
//! which its handler deadline is moved on; the hub counts the run's, by
//! which the controller's call timeouts are (see [`super::hub`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::bindings::monarch::host::debug;
use crate::host::HostState;

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

/// Time spent paused: in total, and since when if paused now.
#[derive(Debug, Default)]
pub struct PauseClock {
    /// Finished pauses, in microseconds.
    total_us: AtomicU64,
    /// When the pause going on began; None: not paused.
    since: std::sync::Mutex<Option<Instant>>,
}

impl PauseClock {
    /// Marks the start of a pause (nested starts count once).
    pub fn pause(&self) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        since.get_or_insert_with(Instant::now);
    }

    /// Marks the end of the pause going on, if any.
    pub fn resume(&self) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = since.take() {
            let us = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.total_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    /// Whether a pause is going on.
    pub fn is_paused(&self) -> bool {
        self.since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// All the time spent paused, the pause going on included.
    pub fn paused(&self) -> Duration {
        let done = Duration::from_micros(self.total_us.load(Ordering::Relaxed));
        let now = self
            .since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Duration::ZERO, |at| at.elapsed());
        done + now
    }
}

/// Who an instance is, for the debugger's list.
#[derive(Debug, Clone, Default)]
pub struct Whoami {
    /// The actor mesh (`controller` for the controller).
    pub mesh: String,
    /// The rank.
    pub rank: u32,
    /// The mesh's extent.
    pub extent: Vec<(String, u32)>,
}

/// An instance's breakpoint state.
#[derive(Default)]
pub struct ActorDebug {
    /// Who the instance is.
    pub(crate) whoami: Whoami,
    /// Its time paused.
    pub(crate) clock: Arc<PauseClock>,
    /// Its pause, while paused.
    session: Option<Session>,
}

impl ActorDebug {
    /// Ends the pause going on, if any: the export that opened it has
    /// returned (or trapped).
    pub(crate) fn close(&mut self) {
        if let Some(session) = self.session.take() {
            session.send(serde_json::json!({ "done": true }));
            self.clock.resume();
        }
    }
}

/// One pause's connection to the hub.
struct Session {
    /// Lines to the hub, written by a task of their own.
    to_hub: mpsc::UnboundedSender<String>,
    /// What the hub says, line by line.
    from_hub: mpsc::UnboundedReceiver<Result<HubSays, String>>,
}

impl Session {
    fn send(&self, value: serde_json::Value) {
        let _ = self.to_hub.send(value.to_string());
    }
}

/// What the hub sends a paused instance.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HubSays {
    /// A line of input.
    In(String),
    /// The pause is over with this error.
    Abandon(String),
}

/// How long connecting to the hub may take before the breakpoint is
/// skipped (with a warning): a hub that cannot be reached must not hang
/// the actor.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the actor says when it pauses.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Hello {
    pub(crate) token: String,
    pub(crate) role: String,
    pub(crate) mesh: String,
    pub(crate) rank: u32,
    pub(crate) extent: Vec<(String, u32)>,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) function: String,
    pub(crate) location: String,
    pub(crate) reason: String,
}

/// This machine's host name.
pub(crate) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl HostState {
    /// Opens a pause at the hub; false when debugging is off or the hub
    /// cannot be reached (then the guest runs on).
    pub(crate) async fn open_pause(
        &mut self,
        function: String,
        location: String,
        reason: String,
    ) -> bool {
        let Some(config) = self.cluster.sandbox.debug.clone() else {
            return false;
        };
        if self.debug.session.is_some() {
            // Already paused (pdb's own breakpoint inside a pause).
            return true;
        }
        let whoami = self.debug.whoami.clone();
        let hello = Hello {
            token: config.token.clone(),
            role: "actor".into(),
            mesh: whoami.mesh,
            rank: whoami.rank,
            extent: whoami.extent,
            host: host_name(),
            pid: std::process::id(),
            function,
            location,
            reason,
        };
        let connected = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect(&config.addr),
        )
        .await;
        let stream = match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::warn!(addr = %config.addr, error = %e, "a breakpoint could not reach the debug hub; running on");
                return false;
            }
            Err(_) => {
                tracing::warn!(addr = %config.addr, "a breakpoint timed out reaching the debug hub; running on");
                return false;
            }
        };
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let (to_hub, mut outgoing) = mpsc::unbounded_channel::<String>();
        let (incoming, from_hub) = mpsc::unbounded_channel();
        let first = serde_json::to_string(&hello).unwrap_or_default();
        tokio::spawn(async move {
            let mut line = first;
            loop {
                line.push('\n');
                if write.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
                match outgoing.recv().await {
                    Some(next) => line = next,
                    None => {
                        let _ = write.shutdown().await;
                        return;
                    }
                }
            }
        });
        tokio::spawn(async move {
            let mut lines = BufReader::new(read).lines();
            loop {
                let said = match lines.next_line().await {
                    Ok(Some(line)) => serde_json::from_str::<HubSays>(&line)
                        .map_err(|e| format!("the debug hub sent a bad line: {e}")),
                    Ok(None) => Err("the debug hub went away".to_string()),
                    Err(e) => Err(format!("the connection to the debug hub failed: {e}")),
                };
                let end = said.is_err();
                if incoming.send(said).is_err() || end {
                    return;
                }
            }
        });
        self.debug.session = Some(Session { to_hub, from_hub });
        self.debug.clock.pause();
        true
    }

    /// The next input line of the pause; traps when the pause is
    /// abandoned, the hub is gone, or the actor is stopped.
    pub(crate) async fn next_input(&mut self) -> wasmtime::Result<String> {
        let interrupt = self.interrupt.clone();
        let Some(session) = self.debug.session.as_mut() else {
            wasmtime::bail!("`read-line` was called with no pause open (call `pause` first)");
        };
        session.send(serde_json::json!({ "want": true }));
        let said = tokio::select! {
            said = session.from_hub.recv() => said,
            _ = interrupt.raised() => {
                self.debug.close();
                wasmtime::bail!("the actor was stopped while it was paused at a breakpoint");
            }
        };
        match said {
            Some(Ok(HubSays::In(line))) => Ok(line),
            Some(Ok(HubSays::Abandon(why))) => {
                self.debug.close();
                wasmtime::bail!("breakpoint abandoned: {why}")
            }
            Some(Err(why)) => {
                self.debug.close();
                wasmtime::bail!("breakpoint abandoned: {why}")
            }
            None => {
                self.debug.close();
                wasmtime::bail!("breakpoint abandoned: the debug hub went away")
            }
        }
    }

    pub(crate) fn output(&mut self, text: &str) {
        if let Some(session) = &self.debug.session {
            session.send(serde_json::json!({ "out": text }));
        }
    }
}

/// The prompt of the host's own breakpoint debugger.
pub const PROMPT: &str = "(monarch) ";

/// What the host's breakpoint debugger answers to `line`, and whether it
/// continues.
pub fn answer(
    line: &str,
    function: &str,
    location: &str,
    values: &[(String, String)],
) -> (String, bool) {
    let line = line.trim();
    let (command, rest) = line
        .split_once(char::is_whitespace)
        .map_or((line, ""), |(c, r)| (c, r.trim()));
    let names = || {
        values
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match command {
        "c" | "cont" | "continue" => (String::new(), true),
        "p" | "print" | "pp" if !rest.is_empty() => {
            match values.iter().find(|(name, _)| name == rest) {
                Some((_, value)) => (format!("{value}\n"), false),
                None if values.is_empty() => (
                    format!(
                        "*** no value named `{rest}`: this breakpoint shows none (name them: breakpoint!({rest} = ...))\n"
                    ),
                    false,
                ),
                None => (
                    format!("*** no value named `{rest}`; this breakpoint shows: {}\n", names()),
                    false,
                ),
            }
        }
        "locals" | "info" | "a" | "args" => {
            let text = values
                .iter()
                .map(|(name, value)| format!("{name} = {value}\n"))
                .collect::<String>();
            match text.is_empty() {
                true => ("(this breakpoint shows no values)\n".into(), false),
                false => (text, false),
            }
        }
        "w" | "where" | "bt" | "l" | "list" => (format!("> {location} in {function}\n"), false),
        "n" | "next" | "s" | "step" => (
            "*** breakpoint!() cannot step; run with --debug for the debug engine, or `c` to continue\n"
                .into(),
            false,
        ),
        "h" | "help" | "?" => (
            "commands: p NAME (a value shown by the breakpoint), locals, where, c (continue), help\n"
                .into(),
            false,
        ),
        "" => (String::new(), false),
        other => (
            format!("*** unknown command `{other}`; try `help`\n"),
            false,
        ),
    }
}

impl debug::Host for HostState {
    async fn enabled(&mut self) -> wasmtime::Result<bool> {
        Ok(self.cluster.sandbox.debug.is_some())
    }

    async fn breakpoint(
        &mut self,
        function: String,
        location: String,
        values: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        if !self
            .open_pause(function.clone(), location.clone(), "breakpoint".into())
            .await
        {
            return Ok(());
        }
        let shown = values
            .iter()
            .map(|(name, value)| format!("{name} = {value}\n"))
            .collect::<String>();
        self.output(&format!("> {location} in {function}\n{shown}{PROMPT}"));
        loop {
            let line = self.next_input().await?;
            let (reply, go_on) = answer(&line, &function, &location, &values);
            if go_on {
                self.debug.close();
                return Ok(());
            }
            self.output(&format!("{reply}{PROMPT}"));
        }
    }

    async fn pause(
        &mut self,
        function: String,
        location: String,
        reason: String,
    ) -> wasmtime::Result<bool> {
        Ok(self.open_pause(function, location, reason).await)
    }

    async fn read_line(&mut self) -> wasmtime::Result<String> {
        self.next_input().await
    }

    async fn write(&mut self, text: String) -> wasmtime::Result<()> {
        self.output(&text);
        Ok(())
    }

    async fn resume(&mut self) -> wasmtime::Result<()> {
        self.debug.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breakpoint_debugger_prints_values_and_continues() {
        let values = vec![("lr".to_string(), "0.5".to_string())];
        let ask = |line: &str| answer(line, "train", "src/lib.rs:10", &values);
        assert_eq!(ask("p lr"), ("0.5\n".to_string(), false));
        assert!(ask("p x").0.contains("shows: lr"), "{:?}", ask("p x"));
        assert_eq!(ask("locals").0, "lr = 0.5\n");
        assert_eq!(ask("where").0, "> src/lib.rs:10 in train\n");
        assert!(ask("c").1 && ask("continue").1);
        assert!(ask("bogus").0.contains("unknown command"));
        assert!(!ask("n").1, "stepping is refused, not a continue");
    }

    #[test]
    fn the_clock_counts_pauses() {
        let clock = PauseClock::default();
        assert_eq!(clock.paused(), Duration::ZERO);
        clock.pause();
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.is_paused());
        clock.resume();
        let after = clock.paused();
        assert!(after >= Duration::from_millis(20), "{after:?}");
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(clock.paused(), after, "no time counts while running");
    }
}
