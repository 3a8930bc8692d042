//! SSH: `run --hosts ssh:[USER@]HOST[:PORT],...` starts one `monarch-host
//! agent` per host over ssh, for the length of the run.
//!
//! For every target at once, [`start_agents`]:
//!
//! 1. *probes* the host with one ssh: its OS and architecture, the address
//!    the ssh connection reached, and which builds of this version are in
//!    the remote directory, while the local binary is hashed to name this
//!    build (so that a host that is down or refuses the key fails at once);
//! 2. *copies* the binary if this build is not there, by streaming it
//!    through ssh's stdin into a temporary file that is then renamed (no
//!    scp or sftp needed);
//! 3. *starts* `BINARY agent --listen IP:0 --token-file - --node HOST
//!    --idle-exit 0` through a second ssh, writes the cluster token and a
//!    newline to its stdin, and waits for the line in which the agent says
//!    where it serves (`monarch-host agent: serving on tcp:IP:PORT ...`).
//!
//! The agent listens on the address this machine resolves the host to (the
//! one the controller will dial), falling back to the address the ssh
//! connection reached when the name does not resolve here (an alias of
//! `~/.ssh/config`). What an agent prints afterwards reaches this stderr,
//! each line prefixed with `[ssh HOST]`.
//!
//! The ssh command is `$MONARCH_SSH` (split at whitespace, as
//! `GIT_SSH_COMMAND`; default `ssh`), and the binary goes to
//! `$MONARCH_SSH_REMOTE_DIR` (default `.cache/monarch-host/bin`, under the
//! remote home); see [`SshOptions::from_env`].
//!
//! - SSH-1: the token is in no argv and no environment variable of the
//!   ssh processes or the agents: it goes on the agent's stdin (CL-1).
//! - SSH-2: ssh never prompts: every ssh runs with `-o BatchMode=yes`
//!   (ahead of `$MONARCH_SSH`'s own options, where ssh takes the first
//!   value of an option) and without a terminal (`-T`).
//! - SSH-3: an agent lives as long as its ssh's stdin is open. Dropping
//!   [`SshAgents`] closes it, and so does the end of this process however
//!   it ends (even SIGKILL); the agent then stops its procs and exits. The
//!   ssh processes are in a process group of their own, so a Ctrl-C at the
//!   terminal reaches the controller, which decides, and not them.
//! - SSH-4: a remote binary is named after the version and the first 12
//!   hex digits of the SHA-256 of the local binary, and written under a
//!   temporary name then linked into place: different builds never clash,
//!   a half copy is never run, and a copy never replaces a whole one that
//!   is there already (hosts that share a file system, NFS home
//!   directories say, copy at once to one path; replacing the file would
//!   leave an agent started from it running a deleted binary, which then
//!   cannot start its procs).
//! - SSH-5: [`start_agents`] starts every agent or none: on a failure it
//!   stops those already started and cuts short the others' copies.
//! - SSH-6: every step but a copy has a deadline (`startup_timeout`), and
//!   a copy ends with the link (ssh's keepalives): a host that is down or
//!   refuses the key fails within the timeout, by name, and never hangs.

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use sha2::Digest;

use crate::ClusterError;

/// This build's version, part of the remote binary's name (SSH-4).
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Where the binary goes on a host, relative to the remote home.
const DEFAULT_REMOTE_DIR: &str = ".cache/monarch-host/bin";
/// How long a host has to answer and its agent to start, by default.
const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopped agent's ssh has to exit before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How many of a failed ssh's last stderr lines an error quotes.
const TAIL_LINES: usize = 8;
/// What the agent prints, on stderr, once it listens.
const SERVING: &str = "monarch-host agent: serving on ";
/// Marks the probe's own lines among whatever a login shell prints.
const PROBE: &str = "monarch-host-probe";

/// One `[USER@]HOST[:PORT]` of `--hosts ssh:...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// The login user, if given.
    pub user: Option<String>,
    /// The host.
    pub host: String,
    /// The ssh port, if given.
    pub port: Option<u16>,
}

impl SshTarget {
    /// What ssh is given: `USER@HOST` or `HOST` (the port goes in `-p`).
    fn destination(&self) -> String {
        match &self.user {
            Some(user) => format!("{user}@{}", self.host),
            None => self.host.clone(),
        }
    }
}

impl fmt::Display for SshTarget {
    /// As it was written: `[USER@]HOST[:PORT]`, an IPv6 host in brackets
    /// when a port follows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        match self.port {
            Some(port) if self.host.contains(':') => write!(f, "[{}]:{port}", self.host),
            Some(port) => write!(f, "{}:{port}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

/// Parses `ssh:[USER@]HOST[:PORT],...`. Every item may carry its own
/// `ssh:` (as `--hosts ssh:a --hosts ssh:b`, joined, does); an IPv6 host
/// with a port goes in brackets, `[ADDR]:PORT`.
pub fn parse_targets(spec: &str) -> Result<Vec<SshTarget>, ClusterError> {
    let spec = spec.trim();
    let body = spec.strip_prefix("ssh:").unwrap_or(spec);
    if body.trim().is_empty() {
        return Err(ClusterError::Invalid(format!(
            "`{spec}` names no host: write ssh:[USER@]HOST[:PORT],... (for instance ssh:alice@node1,node2)"
        )));
    }
    body.split(',')
        .map(|item| {
            let item = item.trim();
            let item = item.strip_prefix("ssh:").unwrap_or(item);
            parse_target(item).map_err(|why| {
                ClusterError::Invalid(format!(
                    "{why} in `{spec}`: write ssh:[USER@]HOST[:PORT],... (an IPv6 host with a port as [ADDR]:PORT)"
                ))
            })
        })
        .collect()
}

/// One item of [`parse_targets`]; the error says what is wrong with it.
fn parse_target(item: &str) -> Result<SshTarget, String> {
    if item.is_empty() {
        return Err("an empty host (two commas, or one at an end)".into());
    }
    let (user, rest) = match item.rsplit_once('@') {
        Some((user, rest)) => (Some(user), rest),
        None => (None, item),
    };
    if let Some(user) = user
        && !is_name(user)
    {
        return Err(format!(
            "`{item}` has a bad user `{user}` (letters, digits, `.`, `_`, `-`)"
        ));
    }
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| format!("`{item}` opens a `[` it does not close"))?;
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(format!("`[{host}]` in `{item}` is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("`{item}` has `{after}` after its `]`"))?,
            ),
        };
        (host, port)
    } else if rest.matches(':').count() > 1 {
        if rest.parse::<Ipv6Addr>().is_err() {
            return Err(format!("`{item}` has more than one `:`"));
        }
        (rest, None)
    } else {
        match rest.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err(format!("`{item}` has an empty host"));
    }
    if !host.contains(':') && !is_name(host) {
        return Err(format!(
            "`{item}` has a bad host `{host}` (letters, digits, `.`, `_`, `-`, not starting with `-`)"
        ));
    }
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => {
                return Err(format!(
                    "`{item}` has a bad port `{port}` (a number from 1 to 65535)"
                ));
            }
        },
    };
    Ok(SshTarget {
        user: user.map(str::to_string),
        host: host.to_string(),
        port,
    })
}

/// A user or host name that is safe on ssh's command line and in a remote
/// shell: letters, digits, `.`, `_`, `-`, not starting with `-` (which ssh
/// would take for an option).
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// How agents are started over ssh.
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// The ssh command and its arguments ($MONARCH_SSH, else `ssh`).
    pub ssh: Vec<String>,
    /// The local monarch-host binary, copied where missing.
    pub binary: PathBuf,
    /// How long a host has to answer ssh, and then its agent to say where
    /// it listens ($MONARCH_SSH_TIMEOUT seconds, else 30).
    pub startup_timeout: Duration,
    /// The directory on each host that the binary goes to
    /// ($MONARCH_SSH_REMOTE_DIR, else `.cache/monarch-host/bin`): relative
    /// to the remote home unless absolute; a leading `~/` is the home too.
    pub remote_dir: String,
    /// The cluster's TLS directory, at the same path on every host: the
    /// agents get `--tls-dir DIR`. Without it they get `--insecure`, as
    /// they listen off loopback (traffic and token in clear).
    pub tls_dir: Option<PathBuf>,
}

impl SshOptions {
    /// From the environment: `$MONARCH_SSH` (the ssh command and its
    /// arguments, split at whitespace; default `ssh`),
    /// `$MONARCH_SSH_REMOTE_DIR` and `$MONARCH_SSH_TIMEOUT` (seconds).
    pub fn from_env(binary: PathBuf) -> Result<SshOptions, ClusterError> {
        SshOptions::from_vars(binary, |name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) with the variables from `var`.
    fn from_vars(
        binary: PathBuf,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<SshOptions, ClusterError> {
        let ssh: Vec<String> = var("MONARCH_SSH")
            .map(|command| command.split_whitespace().map(str::to_string).collect())
            .filter(|words: &Vec<String>| !words.is_empty())
            .unwrap_or_else(|| vec!["ssh".to_string()]);
        let remote_dir = match var("MONARCH_SSH_REMOTE_DIR") {
            Some(dir) if !dir.trim().is_empty() => dir.trim().to_string(),
            _ => DEFAULT_REMOTE_DIR.to_string(),
        };
        if remote_dir.chars().any(char::is_control) {
            return Err(ClusterError::Invalid(format!(
                "MONARCH_SSH_REMOTE_DIR {remote_dir:?} has a control character"
            )));
        }
        let startup_timeout = match var("MONARCH_SSH_TIMEOUT") {
            None => DEFAULT_STARTUP_TIMEOUT,
            Some(text) => match text.trim().parse::<f64>() {
                Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 => {
                    Duration::from_secs_f64(seconds)
                }
                _ => {
                    return Err(ClusterError::Invalid(format!(
                        "MONARCH_SSH_TIMEOUT is `{text}`: give a number of seconds, more than 0"
                    )));
                }
            },
        };
        Ok(SshOptions {
            ssh,
            binary,
            startup_timeout,
            remote_dir,
            tls_dir: None,
        })
    }

    /// `ssh ... DESTINATION sh -c SCRIPT`, which runs `script` in a POSIX
    /// shell whatever the login shell is (SSH-2, SSH-3).
    fn command(&self, target: &SshTarget, script: &str) -> Command {
        let mut command = Command::new(&self.ssh[0]);
        command.args(["-o", "BatchMode=yes", "-T"]);
        command.args(&self.ssh[1..]);
        // After $MONARCH_SSH's options, which take precedence.
        let connect = self.startup_timeout.as_secs().saturating_sub(1).max(1);
        command.args(["-o", &format!("ConnectTimeout={connect}")]);
        command.args([
            "-o",
            "ServerAliveInterval=10",
            "-o",
            "ServerAliveCountMax=3",
        ]);
        if let Some(port) = target.port {
            command.args(["-p", &port.to_string()]);
        }
        command
            .arg(target.destination())
            .arg(format!("sh -c {}", quote(script)));
        command.process_group(0);
        command
    }

    /// How the ssh command reads in messages.
    fn shown(&self) -> String {
        self.ssh.join(" ")
    }
}

/// Quotes `text` as one word for a POSIX shell (and for csh and fish,
/// which read single quotes the same way).
fn quote(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A remote path as a shell word: quoted, except that a leading `~/` (or
/// `~` alone) becomes `"$HOME"`.
fn remote_path(path: &str) -> String {
    match path.strip_prefix('~') {
        Some("") => "\"$HOME\"".to_string(),
        Some(rest) if rest.starts_with('/') => format!("\"$HOME\"{}", quote(rest)),
        _ => quote(path),
    }
}

/// The local binary's remote name, `monarch-host-VERSION-HASH` where HASH
/// is the first 12 hex digits of its SHA-256 (SSH-4), and its size; `None`
/// if `abort` is set first.
fn remote_binary_name(
    binary: &Path,
    abort: &AtomicBool,
) -> Result<Option<(String, u64)>, ClusterError> {
    let what = || format!("reading {} to copy it to the hosts", binary.display());
    let mut file = File::open(binary).map_err(ClusterError::io(what()))?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        if abort.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let n = file.read(&mut buf).map_err(ClusterError::io(what()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    let digest = hasher.finalize();
    let hash: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    Ok(Some((format!("monarch-host-{VERSION}-{hash}"), size)))
}

/// One agent started over ssh, with its ssh's stdin (SSH-3).
struct RunningAgent {
    /// The target, as written.
    label: String,
    /// Where it listens, `tcp:IP:PORT`.
    addr: String,
    /// The ssh that runs it.
    child: Child,
    /// The agent's stdin, through ssh; closing it stops the agent.
    stdin: Option<ChildStdin>,
    /// Set once it is being stopped: what it says then (that its
    /// controller is gone) is for the log, not the terminal.
    stopping: Arc<AtomicBool>,
}

/// Agents started over ssh; dropping it stops them (SSH-3).
pub struct SshAgents {
    addrs: Vec<String>,
    agents: Vec<RunningAgent>,
}

impl SshAgents {
    /// Where they listen, in the order of the targets: `tcp:IP:PORT`.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }
}

impl Drop for SshAgents {
    /// Closes every agent's stdin, so that each stops its procs and exits;
    /// kills the ssh of any that has not ended within a few seconds.
    fn drop(&mut self) {
        stop(&mut self.agents);
    }
}

impl Drop for RunningAgent {
    /// Stops the agent, unless [`stop`] already has (then it returns at once).
    fn drop(&mut self) {
        stop(std::slice::from_mut(self));
    }
}

/// Closes the agents' stdins, waits up to [`STOP_GRACE`] for their ssh
/// processes to end, and kills those left.
fn stop(agents: &mut [RunningAgent]) {
    for agent in agents.iter_mut() {
        agent.stopping.store(true, Ordering::SeqCst);
        agent.stdin = None;
    }
    let until = Instant::now() + STOP_GRACE;
    let mut left: Vec<&mut RunningAgent> = agents.iter_mut().collect();
    while !left.is_empty() && Instant::now() < until {
        left.retain_mut(|agent| matches!(agent.child.try_wait(), Ok(None)));
        std::thread::sleep(Duration::from_millis(20));
    }
    for agent in left {
        tracing::warn!(host = %agent.label, "the agent's ssh did not end; killing it");
        let _ = agent.child.kill();
        let _ = agent.child.wait();
    }
}

/// Starts one agent per target, all at once; see the module docs. Fails,
/// naming the host, if any cannot be reached or started, and then none
/// runs (SSH-5).
pub fn start_agents(
    targets: &[SshTarget],
    token: &str,
    options: &SshOptions,
) -> Result<SshAgents, ClusterError> {
    if targets.is_empty() {
        return Err(ClusterError::Invalid(
            "no ssh hosts given: write ssh:[USER@]HOST[:PORT],...".into(),
        ));
    }
    if options.ssh.is_empty() {
        return Err(ClusterError::Invalid(
            "the ssh command is empty: set MONARCH_SSH to one, or unset it for `ssh`".into(),
        ));
    }
    let token = token.trim();
    if token.is_empty() || token.contains(['\n', '\r']) {
        return Err(ClusterError::Invalid(
            "the cluster token must be one non-empty line".into(),
        ));
    }
    let dir = match options.remote_dir.trim_end_matches('/') {
        "" => "/",
        dir => dir,
    };
    let abort = AtomicBool::new(false);
    // The hosts are probed while the binary is hashed: a host that is
    // down or refuses the key fails at once, not after the hash.
    let (hashed, probes) = std::thread::scope(|scope| {
        let hashing = scope.spawn(|| remote_binary_name(&options.binary, &abort));
        let probes = each_target(targets, &abort, |_, target| {
            probe(target, options, dir, &abort)
        });
        let hashed = hashing
            .join()
            .unwrap_or_else(|_| Err(ClusterError::Invalid("hashing the binary panicked".into())));
        (hashed, probes)
    });
    let probes = all_or_errors(targets, probes, drop)?;
    let Some((name, size)) = hashed? else {
        return Err(ClusterError::Invalid(
            "hashing the binary was cut short".into(),
        ));
    };
    let binary = Remote {
        path: match dir {
            "/" => format!("/{name}"),
            dir => format!("{dir}/{name}"),
        },
        dir: dir.to_string(),
        name,
        size,
    };
    let started = each_target(targets, &abort, |i, target| {
        start_one(target, &probes[i], token, options, &binary, &abort)
    });
    let agents = all_or_errors(targets, started, |mut agents| stop(&mut agents))?;
    Ok(SshAgents {
        addrs: agents.iter().map(|a| a.addr.clone()).collect(),
        agents,
    })
}

/// Runs `step` for every target at once, each on a thread, and returns
/// their results in the targets' order; the first failure sets `abort`, so
/// that the others cut short (SSH-5) and return `None`.
fn each_target<T: Send>(
    targets: &[SshTarget],
    abort: &AtomicBool,
    step: impl Fn(usize, &SshTarget) -> Result<Option<T>, ClusterError> + Sync,
) -> Vec<Result<Option<T>, ClusterError>> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = targets
            .iter()
            .enumerate()
            .map(|(i, target)| {
                let step = &step;
                scope.spawn(move || {
                    let result = step(i, target);
                    if result.is_err() {
                        abort.store(true, Ordering::SeqCst);
                    }
                    result
                })
            })
            .collect();
        threads
            .into_iter()
            .zip(targets)
            .map(|(thread, target)| {
                thread.join().unwrap_or_else(|_| {
                    abort.store(true, Ordering::SeqCst);
                    Err(ClusterError::Invalid(format!(
                        "starting the agent on {target} panicked"
                    )))
                })
            })
            .collect()
    })
}

/// Every result of [`each_target`], or the errors: one as it is, several
/// in one message. On an error, what succeeded goes to `undo` (SSH-5).
fn all_or_errors<T>(
    targets: &[SshTarget],
    results: Vec<Result<Option<T>, ClusterError>>,
    undo: impl FnOnce(Vec<T>),
) -> Result<Vec<T>, ClusterError> {
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for result in results {
        match result {
            Ok(Some(value)) => done.push(value),
            // Cut short because another host failed; that one says why.
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() && done.len() == targets.len() {
        return Ok(done);
    }
    undo(done);
    match errors.len() {
        0 => Err(ClusterError::Invalid(
            "starting the agents was cut short with no error".into(),
        )),
        1 => Err(errors.remove(0)),
        n => {
            let all: Vec<String> = errors.iter().map(|e| format!("- {e}")).collect();
            Err(ClusterError::Scheduler(format!(
                "{n} of {} ssh hosts failed:\n{}",
                targets.len(),
                all.join("\n")
            )))
        }
    }
}

/// The binary on the hosts.
struct Remote {
    /// Its path, relative to the remote home unless absolute.
    path: String,
    /// Its directory.
    dir: String,
    /// Its file name (SSH-4).
    name: String,
    /// The local binary's size, in bytes.
    size: u64,
}

/// Copies the binary to `target` if it lacks it, and starts its agent;
/// `None` if cut short because another host failed (SSH-5).
fn start_one(
    target: &SshTarget,
    probe: &Probe,
    token: &str,
    options: &SshOptions,
    binary: &Remote,
    abort: &AtomicBool,
) -> Result<Option<RunningAgent>, ClusterError> {
    let ip = listen_ip(target, probe.reached)?;
    if probe.binaries.contains(&binary.name) {
        eprintln!(
            "monarch-host: {target} has monarch-host {VERSION} already ({})",
            binary.path
        );
    } else if !copy(target, options, binary, abort)? {
        return Ok(None);
    }
    if abort.load(Ordering::SeqCst) {
        return Ok(None);
    }
    start_agent(target, token, options, binary, ip, abort)
}

/// What [`probe`] found on a host.
struct Probe {
    /// The executable `monarch-host-VERSION-*` files in the remote
    /// directory: the builds of this version the host has.
    binaries: Vec<String>,
    /// The address the ssh connection reached (from `$SSH_CONNECTION`).
    reached: Option<IpAddr>,
}

/// Asks `target` for its OS and architecture, the address the connection
/// reached, and the builds of this version that are in `dir` (SSH-6:
/// within the timeout).
fn probe(
    target: &SshTarget,
    options: &SshOptions,
    dir: &str,
    abort: &AtomicBool,
) -> Result<Option<Probe>, ClusterError> {
    let pattern = match dir {
        "/" => format!("/monarch-host-{VERSION}-*"),
        dir => format!(
            "{}/{}-*",
            remote_path(dir),
            quote(&format!("monarch-host-{VERSION}"))
        ),
    };
    let script = format!(
        "echo \"{PROBE} uname $(uname -sm 2>/dev/null)\"; \
         echo \"{PROBE} connection $SSH_CONNECTION\"; \
         for f in {pattern}; do \
         if test -f \"$f\" && test -x \"$f\"; then echo \"{PROBE} binary ${{f##*/}}\"; fi; \
         done; echo '{PROBE} done'"
    );
    let deadline = Instant::now() + options.startup_timeout;
    let ran = run(
        options.command(target, &script),
        None,
        Some(deadline),
        abort,
    )
    .map_err(|e| not_started(options, target, e))?;
    let finished = match ran {
        Ran::Aborted => return Ok(None),
        Ran::TimedOut { stderr } => {
            return Err(ClusterError::Timeout(format!(
                "{target} did not answer ssh within {:.0?}{}\n\
                 is it up, and reachable from here? ($MONARCH_SSH_TIMEOUT sets the timeout)",
                options.startup_timeout,
                tail_suffix(&stderr),
            )));
        }
        Ran::Finished(finished) => finished,
    };
    let said: Vec<(&str, &str)> = finished
        .stdout
        .lines()
        .filter_map(|line| line.strip_prefix(PROBE)?.trim().split_once(' '))
        .collect();
    let said_one = |key: &str| said.iter().find(|(k, _)| *k == key).map(|(_, v)| v.trim());
    let done = finished
        .stdout
        .lines()
        .any(|l| l.trim() == format!("{PROBE} done"));
    if !done {
        return Err(ClusterError::Scheduler(format!(
            "cannot run a command on {target} over ssh ({}){}\n{}",
            finished.status,
            tail_suffix(&finished.stderr),
            ssh_hint(&finished.stderr, options, target),
        )));
    }
    if let Some(uname) = said_one("uname") {
        check_platform(target, uname)?;
    }
    let reached = said_one("connection")
        .and_then(|connection| connection.split_whitespace().nth(2))
        .and_then(|ip| ip.parse().ok());
    let binaries = said
        .iter()
        .filter(|(key, _)| *key == "binary")
        .map(|(_, name)| name.trim().to_string())
        .collect();
    Ok(Some(Probe { binaries, reached }))
}

/// What to do about an ssh that failed with `stderr`.
fn ssh_hint(stderr: &str, options: &SshOptions, target: &SshTarget) -> String {
    let port = target.port.unwrap_or(22);
    let has = |needle: &str| stderr.contains(needle);
    if has("Could not resolve hostname") {
        format!("check the name `{}`, or give its IP address", target.host)
    } else if has("connect to host") || has("Connection closed by") || has("Connection reset") {
        format!("is {target} up, with sshd listening on port {port}, and reachable from here?")
    } else if has("Host key verification failed") || has("HOST IDENTIFICATION HAS CHANGED") {
        format!(
            "ssh does not know {target}'s host key: log in once with `ssh {}`, \
             or add `-o StrictHostKeyChecking=accept-new` to $MONARCH_SSH",
            target.destination()
        )
    } else {
        format!(
            "`{} {}{} true` must work without a prompt (BatchMode): add your key \
             to the host (ssh-copy-id), or set $MONARCH_SSH to the ssh command and \
             options to use (such as -i KEY)",
            options.shown(),
            target.port.map_or(String::new(), |p| format!("-p {p} ")),
            target.destination()
        )
    }
}

/// Refuses a host this binary cannot run on, by its `uname -sm`.
fn check_platform(target: &SshTarget, uname: &str) -> Result<(), ClusterError> {
    let mut words = uname.split_whitespace();
    let (Some(os), Some(arch)) = (words.next(), words.next()) else {
        return Ok(());
    };
    let arch = match arch {
        "arm64" => "aarch64",
        "amd64" => "x86_64",
        arch => arch,
    };
    let (here_os, here_arch) = (std::env::consts::OS, std::env::consts::ARCH);
    if os.eq_ignore_ascii_case(here_os) && arch == here_arch {
        return Ok(());
    }
    Err(ClusterError::Invalid(format!(
        "{target} is {os} {arch}, and this monarch-host is built for {here_os} {here_arch}: \
         run the controller from a machine like the hosts"
    )))
}

/// The address the agent on `target` listens on: the one this machine
/// resolves the host to (where the controller dials), else the one the
/// ssh connection reached.
fn listen_ip(target: &SshTarget, reached: Option<IpAddr>) -> Result<IpAddr, ClusterError> {
    let resolved = (target.host.as_str(), target.port.unwrap_or(22))
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .map(|addr| addr.ip());
    resolved.or(reached).ok_or_else(|| {
        ClusterError::Invalid(format!(
            "cannot tell which address of {target} to serve on: `{}` does not resolve here, \
             and the host did not say ($SSH_CONNECTION); use its IP address",
            target.host
        ))
    })
}

/// Streams the binary to `target` (SSH-4); `false` if cut short (SSH-5).
fn copy(
    target: &SshTarget,
    options: &SshOptions,
    binary: &Remote,
    abort: &AtomicBool,
) -> Result<bool, ClusterError> {
    let megabytes = binary.size.div_ceil(1_000_000);
    eprintln!("monarch-host: copying monarch-host ({megabytes} MB) to {target} ...");
    let started = Instant::now();
    let (dir, tmp) = (
        remote_path(&binary.dir),
        format!("{}.tmp.$$", remote_path(&binary.path)),
    );
    // A copy cut short leaves `cat` a short file and a clean end of input:
    // the size check keeps it from being put into place (SSH-4). A hard
    // link fails where the name is taken: a whole copy (only whole ones get
    // the name) by another host of a shared file system, kept; `mv` is for
    // a file system without hard links.
    let script = format!(
        "mkdir -p {dir} && cat > {tmp} && test $(wc -c < {tmp}) -eq {size} \
         && chmod 755 {tmp} && {{ ln {tmp} {path} 2>/dev/null || test -f {path} \
         || mv -f {tmp} {path}; }} && rm -f {tmp} || {{ rm -f {tmp}; exit 1; }}",
        size = binary.size,
        path = remote_path(&binary.path),
    );
    let input = File::open(&options.binary).map_err(ClusterError::io(format!(
        "reading {} to copy it to {target}",
        options.binary.display()
    )))?;
    let ran = run(options.command(target, &script), Some(input), None, abort)
        .map_err(|e| not_started(options, target, e))?;
    match ran {
        Ran::Aborted => Ok(false),
        Ran::TimedOut { .. } => unreachable!("a copy has no deadline"),
        Ran::Finished(finished) if finished.status.success() => {
            eprintln!(
                "monarch-host: copied monarch-host to {target}:{} in {:.1?}",
                binary.path,
                started.elapsed()
            );
            Ok(true)
        }
        Ran::Finished(finished) => Err(ClusterError::Scheduler(format!(
            "copying monarch-host to {target}:{} failed ({}){}",
            binary.path,
            finished.status,
            tail_suffix(&finished.stderr)
        ))),
    }
}

/// What the agent's stderr says while it starts.
enum Startup {
    /// A line before it listens.
    Line(String),
    /// It listens here.
    Serving(String),
    /// Stderr ended: ssh or the agent ended.
    Ended,
}

/// Starts the agent on `target` and waits until it says where it listens
/// (SSH-1, SSH-6); `None` if cut short (SSH-5).
fn start_agent(
    target: &SshTarget,
    token: &str,
    options: &SshOptions,
    binary: &Remote,
    ip: IpAddr,
    abort: &AtomicBool,
) -> Result<Option<RunningAgent>, ClusterError> {
    let listen = SocketAddr::new(ip, 0).to_string();
    let tls = match &options.tls_dir {
        Some(dir) => format!("--tls-dir {}", quote(&dir.display().to_string())),
        None if ip.is_loopback() => String::new(),
        None => "--insecure".to_string(),
    };
    let script = format!(
        "exec {} agent --listen {} --token-file - --node {} --idle-exit 0{}{}",
        remote_path(&binary.path),
        quote(&listen),
        quote(&target.host),
        if tls.is_empty() { "" } else { " " },
        tls,
    );
    let mut command = options.command(target, &script);
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        crate::spawn_when_ready(&mut command).map_err(|e| not_started(options, target, e))?;
    let prefix = format!("[ssh {}]", target.host);
    let stopping = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    if let Some(stderr) = child.stderr.take() {
        relay_stderr(stderr, prefix.clone(), stopping.clone(), tx);
    }
    if let Some(stdout) = child.stdout.take() {
        relay(stdout, prefix, stopping.clone());
    }
    let mut agent = RunningAgent {
        label: target.to_string(),
        addr: String::new(),
        stdin: child.stdin.take(),
        child,
        stopping,
    };
    // SSH-1: the token goes on stdin, which then stays open (SSH-3).
    let sent = match agent.stdin.as_mut() {
        Some(stdin) => stdin
            .write_all(format!("{token}\n").as_bytes())
            .and_then(|()| stdin.flush()),
        None => Err(std::io::Error::other("no stdin")),
    };
    let deadline = Instant::now() + options.startup_timeout;
    let mut said: VecDeque<String> = VecDeque::new();
    let failure = loop {
        if abort.load(Ordering::SeqCst) {
            stop(std::slice::from_mut(&mut agent));
            return Ok(None);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(Startup::Serving(addr)) if sent.is_ok() => {
                agent.addr = addr;
                return Ok(Some(agent));
            }
            Ok(Startup::Line(line)) => {
                tracing::debug!(host = %target, "{line}");
                if said.len() == TAIL_LINES {
                    said.pop_front();
                }
                said.push_back(line);
            }
            Ok(Startup::Serving(_))
            | Ok(Startup::Ended)
            | Err(mpsc::RecvTimeoutError::Disconnected) => {
                break None;
            }
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() >= deadline => {
                break Some(options.startup_timeout);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    };
    let said: Vec<String> = said.into();
    let said = tail_suffix(&said.join("\n"));
    let status = match failure {
        Some(_) => None,
        None => wait_briefly(&mut agent.child),
    };
    stop(std::slice::from_mut(&mut agent));
    Err(match failure {
        Some(timeout) => ClusterError::Timeout(format!(
            "the agent on {target} did not say where it listens within {timeout:.0?}{said}"
        )),
        None => ClusterError::Scheduler(format!(
            "the agent on {target} ended before it listened ({}){said}",
            status.map_or_else(|| "still running".to_string(), |s| s.to_string()),
        )),
    })
}

/// Reads an agent's stderr: until it listens, hands lines to the starter;
/// then relays them (see [`relay`]) until ssh ends.
fn relay_stderr(
    stderr: impl Read + Send + 'static,
    prefix: String,
    stopping: Arc<AtomicBool>,
    tx: mpsc::Sender<Startup>,
) {
    std::thread::spawn(move || {
        let mut lines = lines(stderr);
        let serving = lines
            .by_ref()
            .find_map(|line| match line.split_once(SERVING) {
                Some((_, rest)) => Some(
                    rest.split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                ),
                None => {
                    let _ = tx.send(Startup::Line(line));
                    None
                }
            });
        let _ = tx.send(match serving {
            Some(addr) => Startup::Serving(addr),
            None => Startup::Ended,
        });
        relay_lines(lines, &prefix, &stopping);
    });
}

/// Relays what `from` prints to this stderr, each line after `prefix`;
/// to the log only once the agent is being stopped.
fn relay(from: impl Read + Send + 'static, prefix: String, stopping: Arc<AtomicBool>) {
    std::thread::spawn(move || relay_lines(lines(from), &prefix, &stopping));
}

fn relay_lines(lines: impl Iterator<Item = String>, prefix: &str, stopping: &AtomicBool) {
    for line in lines {
        match stopping.load(Ordering::SeqCst) {
            true => tracing::info!("{prefix} {line}"),
            false => eprintln!("{prefix} {line}"),
        }
    }
}

/// The lines of `from`, lossily decoded, until it ends or fails.
fn lines(from: impl Read) -> impl Iterator<Item = String> {
    let mut reader = BufReader::new(from);
    std::iter::from_fn(move || {
        let mut buf = Vec::new();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(String::from_utf8_lossy(&buf).trim_end().to_string()),
        }
    })
}

/// Waits up to a second for `child` to end (its stderr just closed).
fn wait_briefly(child: &mut Child) -> Option<ExitStatus> {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// An ssh command that ended.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// How [`run`] went.
enum Ran {
    Finished(Finished),
    /// Past its deadline, and killed; what it had said on stderr.
    TimedOut {
        stderr: String,
    },
    /// Another host failed (SSH-5), and this one was killed.
    Aborted,
}

/// Runs `command` to its end, with `input` on its stdin (else nothing),
/// until `deadline` if any, or until `abort` is set.
fn run(
    mut command: Command,
    input: Option<File>,
    deadline: Option<Instant>,
    abort: &AtomicBool,
) -> std::io::Result<Ran> {
    command
        .stdin(match input {
            Some(_) => Stdio::piped(),
            None => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = crate::spawn_when_ready(&mut command)?;
    if let (Some(mut input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A remote failure shows in ssh's status; a broken pipe here adds nothing.
        std::thread::spawn(move || std::io::copy(&mut input, &mut stdin));
    }
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            let _ = tx.send(String::from_utf8_lossy(&text).into_owned());
        });
        rx
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    // A process ssh left behind (a ProxyCommand) may hold a pipe open.
    let collect =
        |rx: mpsc::Receiver<String>| rx.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ran::Finished(Finished {
                status,
                stdout: collect(stdout),
                stderr: collect(stderr),
            }));
        }
        let late = deadline.is_some_and(|deadline| Instant::now() >= deadline);
        if late || abort.load(Ordering::SeqCst) {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(match late {
                true => Ran::TimedOut {
                    stderr: collect(stderr),
                },
                false => Ran::Aborted,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The error for an ssh that could not even start.
fn not_started(options: &SshOptions, target: &SshTarget, e: std::io::Error) -> ClusterError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ClusterError::Invalid(format!(
            "`{}` is not installed here (to reach {target}); install OpenSSH's client, \
             or set $MONARCH_SSH to the ssh command to use",
            options.ssh[0]
        )),
        _ => ClusterError::io(format!("starting `{}` for {target}", options.shown()))(e),
    }
}

/// `: ` and the last [`TAIL_LINES`] non-empty lines of `text`, indented on
/// lines of their own; nothing if it has none.
fn tail_suffix(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.len() {
        0 => String::new(),
        1 => format!(": {}", lines[0]),
        n => format!(
            ":\n  {}",
            lines[n.saturating_sub(TAIL_LINES)..].join("\n  ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(user: Option<&str>, host: &str, port: Option<u16>) -> SshTarget {
        SshTarget {
            user: user.map(str::to_string),
            host: host.to_string(),
            port,
        }
    }

    #[test]
    fn targets_with_users_ports_and_ipv6() {
        assert_eq!(
            parse_targets("ssh:alice@node1,node2:2222, bob@10.0.0.3:22").unwrap(),
            [
                target(Some("alice"), "node1", None),
                target(None, "node2", Some(2222)),
                target(Some("bob"), "10.0.0.3", Some(22)),
            ]
        );
        // `--hosts ssh:a --hosts ssh:b`, joined.
        assert_eq!(
            parse_targets("ssh:a,ssh:b.example.com").unwrap(),
            [target(None, "a", None), target(None, "b.example.com", None)]
        );
        assert_eq!(
            parse_targets("ssh:root@[fe80::1]:2200,[::1],::2").unwrap(),
            [
                target(Some("root"), "fe80::1", Some(2200)),
                target(None, "::1", None),
                target(None, "::2", None),
            ]
        );
    }

    #[test]
    fn targets_print_as_written() {
        for spec in ["alice@node1", "node2:2222", "root@[fe80::1]:2200", "::1"] {
            let parsed = parse_targets(&format!("ssh:{spec}")).unwrap();
            assert_eq!(parsed[0].to_string(), spec);
        }
    }

    #[test]
    fn bad_targets_are_refused_with_the_reason() {
        for (bad, why) in [
            ("ssh:", "names no host"),
            ("ssh:  ", "names no host"),
            ("ssh:a,,b", "an empty host"),
            ("ssh:a,", "an empty host"),
            ("ssh:alice@", "an empty host"),
            ("ssh::22", "an empty host"),
            ("ssh:@node", "bad user"),
            ("ssh:node:0", "bad port `0`"),
            ("ssh:node:http", "bad port `http`"),
            ("ssh:node:70000", "bad port `70000`"),
            ("ssh:-oProxyCommand=x", "bad host"),
            ("ssh:no;de", "bad host"),
            ("ssh:a b", "bad host"),
            ("ssh:[fe80::1", "does not close"),
            ("ssh:[node1]:22", "not an IPv6 address"),
            ("ssh:[::1]x", "after its `]`"),
            ("ssh:a:b:c", "more than one `:`"),
        ] {
            let e = parse_targets(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("ssh:[USER@]HOST[:PORT]"), "{bad}: {e}");
        }
    }

    #[test]
    fn options_come_from_the_environment() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| value.to_string())
            }
        };
        let options = SshOptions::from_vars("/bin/mh".into(), vars(&[])).unwrap();
        assert_eq!(options.ssh, ["ssh"]);
        assert_eq!(options.remote_dir, DEFAULT_REMOTE_DIR);
        assert_eq!(options.startup_timeout, DEFAULT_STARTUP_TIMEOUT);
        let options = SshOptions::from_vars(
            "/bin/mh".into(),
            vars(&[
                ("MONARCH_SSH", " ssh  -i /k/id -o  Port=2 "),
                ("MONARCH_SSH_REMOTE_DIR", "/opt/mh/"),
                ("MONARCH_SSH_TIMEOUT", "2.5"),
            ]),
        )
        .unwrap();
        assert_eq!(options.ssh, ["ssh", "-i", "/k/id", "-o", "Port=2"]);
        assert_eq!(options.remote_dir, "/opt/mh/");
        assert_eq!(options.startup_timeout, Duration::from_millis(2500));
        for bad in ["0", "-1", "soon", "inf"] {
            let e = SshOptions::from_vars("/bin/mh".into(), move |name: &str| {
                (name == "MONARCH_SSH_TIMEOUT").then(|| bad.to_string())
            })
            .unwrap_err();
            assert!(e.to_string().contains("MONARCH_SSH_TIMEOUT"), "{bad}: {e}");
        }
    }

    /// SSH-2: BatchMode comes before $MONARCH_SSH's own options, the
    /// script is one quoted word, and the port goes in `-p`.
    #[test]
    fn ssh_never_prompts_and_gets_one_quoted_script() {
        let options = SshOptions {
            ssh: vec!["ssh".into(), "-o".into(), "BatchMode=no".into()],
            binary: "/bin/mh".into(),
            startup_timeout: Duration::from_secs(10),
            remote_dir: DEFAULT_REMOTE_DIR.into(),
            tls_dir: None,
        };
        let command = options.command(&target(Some("al"), "h1", Some(2222)), "echo 'hi' $$");
        let args: Vec<String> = command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(command.get_program(), "ssh");
        assert_eq!(
            args[..5],
            ["-o", "BatchMode=yes", "-T", "-o", "BatchMode=no"]
        );
        assert!(args.contains(&"ConnectTimeout=9".to_string()), "{args:?}");
        let n = args.len();
        assert_eq!(args[n - 4..n - 2], ["-p", "2222"]);
        assert_eq!(args[n - 2], "al@h1");
        assert_eq!(args[n - 1], r#"sh -c 'echo '\''hi'\'' $$'"#);
    }

    #[test]
    fn remote_paths_are_quoted_for_the_shell() {
        assert_eq!(quote(".cache/monarch-host/bin"), ".cache/monarch-host/bin");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME;rm"), "'$HOME;rm'");
        assert_eq!(quote("[::1]:0"), "'[::1]:0'");
        assert_eq!(quote(""), "''");
        assert_eq!(remote_path("~/mh bin/x"), "\"$HOME\"'/mh bin/x'");
        assert_eq!(remote_path("~"), "\"$HOME\"");
        assert_eq!(remote_path("~bob/x"), "'~bob/x'");
        assert_eq!(remote_path("/opt/mh/x"), "/opt/mh/x");
    }

    /// SSH-4: the name carries the version and the binary's hash.
    #[test]
    fn the_remote_name_is_the_version_and_a_hash_of_the_binary() {
        let dir = std::env::temp_dir().join(format!("ssh-name-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, b"one build").unwrap();
        std::fs::write(&b, b"another build").unwrap();
        let go = AtomicBool::new(false);
        let (name_a, size) = remote_binary_name(&a, &go).unwrap().unwrap();
        // sha256("one build")
        let expected = sha2::Sha256::digest(b"one build");
        let hash: String = expected
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(name_a, format!("monarch-host-{VERSION}-{hash}"));
        assert_eq!(size, 9);
        assert_ne!(remote_binary_name(&b, &go).unwrap().unwrap().0, name_a);
        assert!(
            remote_binary_name(&b, &AtomicBool::new(true))
                .unwrap()
                .is_none()
        );
        let e = remote_binary_name(&dir.join("missing"), &go).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_host_of_another_platform_is_refused() {
        let here = format!("{} {}", std::env::consts::OS, std::env::consts::ARCH);
        let h = target(None, "h1", None);
        assert!(check_platform(&h, &here).is_ok());
        assert!(check_platform(&h, "").is_ok());
        let e = check_platform(&h, "Plan9 mips").unwrap_err().to_string();
        assert!(e.contains("h1 is Plan9 mips"), "{e}");
    }

    #[test]
    fn the_agent_listens_where_the_host_resolves_else_where_ssh_reached() {
        let reached: IpAddr = "10.1.2.3".parse().unwrap();
        let ip = listen_ip(&target(None, "127.0.0.1", None), Some(reached)).unwrap();
        assert_eq!(ip, "127.0.0.1".parse::<IpAddr>().unwrap());
        let alias = target(None, "no-such-host.invalid", None);
        assert_eq!(listen_ip(&alias, Some(reached)).unwrap(), reached);
        let e = listen_ip(&alias, None).unwrap_err().to_string();
        assert!(e.contains("no-such-host.invalid"), "{e}");
    }

    #[test]
    fn errors_quote_the_last_lines() {
        assert_eq!(tail_suffix(""), "");
        assert_eq!(
            tail_suffix("\nPermission denied (publickey).\n"),
            ": Permission denied (publickey)."
        );
        let many: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
        let suffix = tail_suffix(&many.join("\n"));
        assert!(suffix.starts_with(":\n  line 12\n"), "{suffix}");
        assert!(suffix.ends_with("line 19"), "{suffix}");
    }

    /// SSH-6, SSH-5: a host that never answers fails by name within the
    /// timeout, with a fake ssh that hangs.
    #[test]
    fn a_host_that_never_answers_fails_within_the_timeout() {
        let dir = std::env::temp_dir().join(format!("ssh-hang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = dir.join("mh");
        std::fs::write(&binary, b"binary").unwrap();
        let hang = dir.join("ssh");
        std::fs::write(&hang, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&hang, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let options = SshOptions {
            ssh: vec![hang.display().to_string()],
            binary,
            startup_timeout: Duration::from_millis(500),
            remote_dir: DEFAULT_REMOTE_DIR.into(),
            tls_dir: None,
        };
        let started = Instant::now();
        let targets = parse_targets("ssh:h1,h2").unwrap();
        let Err(e) = start_agents(&targets, "token", &options) else {
            panic!("agents started with a hanging ssh");
        };
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let e = e.to_string();
        assert!(
            e.contains("h1 did not answer ssh") && e.contains("h2"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_missing_ssh_is_named() {
        let binary = std::env::temp_dir().join(format!("ssh-none-{}", std::process::id()));
        std::fs::write(&binary, b"binary").unwrap();
        let options = SshOptions {
            ssh: vec!["/no/such/ssh".into()],
            binary: binary.clone(),
            startup_timeout: Duration::from_secs(1),
            remote_dir: DEFAULT_REMOTE_DIR.into(),
            tls_dir: None,
        };
        let targets = parse_targets("ssh:h1").unwrap();
        let Err(e) = start_agents(&targets, "token", &options) else {
            panic!("started without ssh");
        };
        assert!(
            e.to_string().contains("`/no/such/ssh` is not installed"),
            "{e}"
        );
        std::fs::remove_file(&binary).ok();
    }

    /// A fake `ssh` that runs the remote command here, and a fake
    /// monarch-host whose `agent` behaves by its `--node`: `silent` never
    /// listens, `broken` fails as a refused login would, any other listens
    /// on port 4242 of its `--listen` address. Each agent notes the token it
    /// read and its argv in `seen-NODE`, and `stopped-NODE` when stdin ends.
    struct Fakes {
        dir: PathBuf,
        options: SshOptions,
    }

    impl Fakes {
        fn new(name: &str) -> Fakes {
            use std::os::unix::fs::PermissionsExt;
            let dir = std::env::temp_dir().join(format!("ssh-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let d = dir.display();
            let scripts = [
                (
                    "ssh",
                    "#!/bin/sh\nfor last; do :; done\n\
                     SSH_CONNECTION='127.0.0.1 50000 127.0.0.1 22' exec sh -c \"$last\"\n"
                        .to_string(),
                ),
                (
                    "ssh-short",
                    "#!/bin/sh\nfor last; do :; done\nhead -c 3 | sh -c \"$last\"\n".to_string(),
                ),
                (
                    "monarch-host",
                    format!(
                        "#!/bin/sh\nnode=$7\nread -r token\n\
                         echo \"$token|$*\" > {d}/seen-$node\n\
                         echo 'starting up' >&2\n\
                         case $node in\n\
                         silent) cat > /dev/null; exit 0;;\n\
                         broken) echo 'Permission denied (publickey).' >&2; exit 3;;\n\
                         esac\n\
                         echo \"monarch-host agent: serving on tcp:${{3%:0}}:4242 (node $node, monarch-host 0)\" >&2\n\
                         cat > /dev/null\n\
                         echo stopped > {d}/stopped-$node\n"
                    ),
                ),
            ];
            for (name, text) in scripts {
                let path = dir.join(name);
                std::fs::write(&path, text).unwrap();
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let options = SshOptions {
                ssh: vec![dir.join("ssh").display().to_string()],
                binary: dir.join("monarch-host"),
                startup_timeout: Duration::from_secs(5),
                remote_dir: dir.join("remote dir").display().to_string(),
                tls_dir: None,
            };
            Fakes { dir, options }
        }

        fn read(&self, name: &str) -> Option<String> {
            std::fs::read_to_string(self.dir.join(name)).ok()
        }

        /// Every agent that started has stopped.
        fn assert_all_stopped(&self) {
            for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(node) = name.strip_prefix("seen-")
                    && node != "silent"
                    && node != "broken"
                {
                    assert!(
                        self.read(&format!("stopped-{node}")).is_some(),
                        "{node} runs"
                    );
                }
            }
        }
    }

    impl Drop for Fakes {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// SSH-1, SSH-3, SSH-4 with the fakes: the first start copies the
    /// binary, the second finds it; the token goes on stdin only; dropping
    /// the agents ends their stdin.
    #[test]
    fn agents_get_the_binary_once_the_token_on_stdin_and_stop_on_drop() {
        let fakes = Fakes::new("flow");
        let targets = parse_targets("ssh:127.0.0.1,me@127.0.0.1:2222").unwrap();
        let token = "0123456789abcdef";
        let agents = start_agents(&targets, token, &fakes.options).unwrap();
        assert_eq!(agents.addrs(), ["tcp:127.0.0.1:4242", "tcp:127.0.0.1:4242"]);
        let go = AtomicBool::new(false);
        let (name, size) = remote_binary_name(&fakes.options.binary, &go)
            .unwrap()
            .unwrap();
        let copied = Path::new(&fakes.options.remote_dir).join(&name);
        let meta = std::fs::metadata(&copied).unwrap();
        assert_eq!(meta.len(), size);
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o755
        );
        let seen = fakes.read("seen-127.0.0.1").unwrap();
        assert_eq!(
            seen.trim(),
            format!(
                "{token}|agent --listen 127.0.0.1:0 --token-file - --node 127.0.0.1 --idle-exit 0"
            )
        );
        assert!(fakes.read("stopped-127.0.0.1").is_none());
        drop(agents);
        assert_eq!(
            fakes.read("stopped-127.0.0.1").as_deref(),
            Some("stopped\n")
        );
        // The second start finds the binary: no copy rewrites it.
        let modified = meta.modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let agents = start_agents(&targets[..1], token, &fakes.options).unwrap();
        assert_eq!(
            std::fs::metadata(&copied).unwrap().modified().unwrap(),
            modified
        );
        let files = std::fs::read_dir(copied.parent().unwrap()).unwrap().count();
        assert_eq!(files, 1, "no temporary file is left");
        drop(agents);
        fakes.assert_all_stopped();
    }

    /// SSH-5, SSH-6 with the fakes: an agent that fails or never listens
    /// fails the start by host, with what it said, and no agent is left.
    #[test]
    fn an_agent_that_fails_or_never_listens_is_named_and_none_is_left() {
        let mut fakes = Fakes::new("fail");
        fakes.options.startup_timeout = Duration::from_secs(1);
        let targets = parse_targets("ssh:127.0.0.1,broken").unwrap();
        let Err(e) = start_agents(&targets, "t", &fakes.options) else {
            panic!("a broken agent started");
        };
        let e = e.to_string();
        assert!(
            e.contains("the agent on broken ended before it listened"),
            "{e}"
        );
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(
            e.contains("starting up\n  Permission denied (publickey)."),
            "{e}"
        );
        fakes.assert_all_stopped();
        let started = Instant::now();
        let targets = parse_targets("ssh:silent").unwrap();
        let Err(e) = start_agents(&targets, "t", &fakes.options) else {
            panic!("a silent agent started");
        };
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let e = e.to_string();
        assert!(
            e.contains("the agent on silent did not say where it listens within 1s: starting up"),
            "{e}"
        );
    }

    /// SSH-4 with the fakes: a copy cut short is not renamed into place.
    #[test]
    fn a_copy_cut_short_leaves_no_binary() {
        let mut fakes = Fakes::new("short");
        fakes.options.ssh = vec![fakes.dir.join("ssh-short").display().to_string()];
        let targets = parse_targets("ssh:127.0.0.1").unwrap();
        let Err(e) = start_agents(&targets, "t", &fakes.options) else {
            panic!("started from a short copy");
        };
        assert!(
            e.to_string().contains("copying monarch-host to 127.0.0.1:"),
            "{e}"
        );
        let left = std::fs::read_dir(&fakes.options.remote_dir)
            .unwrap()
            .count();
        assert_eq!(left, 0, "a short copy was left");
        assert!(fakes.read("seen-127.0.0.1").is_none());
    }

    #[test]
    fn failed_logins_come_with_what_to_do() {
        let options = SshOptions::from_vars("/bin/mh".into(), |_| None).unwrap();
        let h = target(Some("al"), "h1", Some(2222));
        for (stderr, hint) in [
            (
                "al@h1: Permission denied (publickey).",
                "`ssh -p 2222 al@h1 true` must work",
            ),
            (
                "ssh: connect to host h1 port 2222: Connection refused",
                "listening on port 2222",
            ),
            (
                "ssh: Could not resolve hostname h1: Name or service not known",
                "check the name `h1`",
            ),
            (
                "Host key verification failed.",
                "StrictHostKeyChecking=accept-new",
            ),
        ] {
            let said = ssh_hint(stderr, &options, &h);
            assert!(said.contains(hint), "{stderr}: {said}");
        }
    }
}
