//! Where a cluster's agents come from: Slurm allocations, SSH logins and
//! Kubernetes pods. This crate only places `monarch-host agent`s and says
//! where they listen (ARCHITECTURE: it knows nothing of meshes or Wasm);
//! the caller handshakes with them and runs programs on them.
//!
//! A cluster that `slurm up` (or `k8s attach`) brought up is remembered in
//! a *cluster file*, `NAME.json` in [`clusters_dir`], which `run --cluster
//! NAME` and `serve --cluster NAME` read.
//!
//! - CL-1: the cluster token is never in an argv or a batch script: agents
//!   read it from a file (mode 0600) or from stdin.
//! - CL-2: a cluster file is written whole or not at all (temp file and
//!   rename), so a reader never sees half of one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub mod hostlist;
pub mod k8s;
pub mod slurm;
pub mod ssh;

/// What went wrong placing or finding agents. Every message names what
/// to do about it where there is something to do.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The user asked for something that cannot be done as asked.
    #[error("{0}")]
    Invalid(String),
    /// No cluster file under that name.
    #[error(
        "no cluster named `{name}` (looked for {path}); bring one up with `monarch-host slurm up --name {name} --nodes K`"
    )]
    Unknown {
        /// The cluster's name.
        name: String,
        /// Where its file would be.
        path: PathBuf,
    },
    /// A scheduler command failed or answered something unreadable.
    #[error("{0}")]
    Scheduler(String),
    /// Reading or writing a file failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Waited too long.
    #[error("{0}")]
    Timeout(String),
}

impl ClusterError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
        let what = what.into();
        move |source| ClusterError::Io { what, source }
    }
}

/// Where cluster files are kept: `$MONARCH_CLUSTER_DIR`, else
/// `$XDG_STATE_HOME/monarch-host/clusters`, else
/// `~/.local/state/monarch-host/clusters`. On Slurm this must be on a
/// filesystem the compute nodes share (home directories usually are):
/// agents write their addresses there.
pub fn clusters_dir() -> Result<PathBuf, ClusterError> {
    if let Some(dir) = std::env::var_os("MONARCH_CLUSTER_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME") {
        return Ok(PathBuf::from(dir).join("monarch-host/clusters"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".local/state/monarch-host/clusters")),
        None => Err(ClusterError::Invalid(
            "set MONARCH_CLUSTER_DIR or HOME: there is nowhere to keep cluster files".into(),
        )),
    }
}

/// Checks a cluster name: letters, digits, `-` and `_`, at most 64, not
/// starting with `-` (it names files and Slurm jobs).
pub fn check_name(name: &str) -> Result<(), ClusterError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match ok {
        true => Ok(()),
        false => Err(ClusterError::Invalid(format!(
            "`{name}` is not a cluster name: use 1 to 64 letters, digits, `-` or `_`, not starting with `-`"
        ))),
    }
}

/// The scheduler that placed a cluster's agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Placed {
    /// A Slurm allocation.
    Slurm {
        /// The job id `sbatch --parsable` answered.
        job_id: String,
    },
    /// Pods of a StatefulSet.
    Kubernetes {
        /// The namespace.
        namespace: String,
    },
    /// Agents started over SSH.
    Ssh,
}

/// One agent of a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agent {
    /// The node (host name) it runs on.
    pub node: String,
    /// Where it listens: `IP:PORT` or `HOST:PORT`.
    pub addr: String,
}

/// What `run --cluster NAME` needs to reach a cluster; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// The format's version (1).
    pub version: u32,
    /// The cluster's name.
    pub name: String,
    /// Who placed the agents.
    pub placed: Placed,
    /// The flags it was brought up with, compared by a later `up` of the
    /// same name (which refuses different ones without `--replace`).
    pub spec: BTreeMap<String, String>,
    /// The agents, in rank order.
    pub agents: Vec<Agent>,
    /// The file holding the cluster token (CL-1).
    pub token_file: PathBuf,
    /// The monarch-host version the agents run.
    pub agent_version: String,
    /// When it came up (seconds since the epoch).
    pub created_unix: u64,
}

/// The current format of [`ClusterFile`].
pub const CLUSTER_FILE_VERSION: u32 = 1;

impl ClusterFile {
    /// The path of `name`'s cluster file.
    pub fn path(name: &str) -> Result<PathBuf, ClusterError> {
        check_name(name)?;
        Ok(clusters_dir()?.join(format!("{name}.json")))
    }

    /// Reads `name`'s cluster file.
    pub fn load(name: &str) -> Result<ClusterFile, ClusterError> {
        let path = ClusterFile::path(name)?;
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ClusterError::Unknown {
                    name: name.to_string(),
                    path,
                });
            }
            Err(e) => return Err(ClusterError::io(format!("reading {}", path.display()))(e)),
        };
        let file: ClusterFile = serde_json::from_str(&text).map_err(|e| {
            ClusterError::Invalid(format!(
                "{} is not a cluster file: {e}; remove it or bring the cluster up again with --replace",
                path.display()
            ))
        })?;
        if file.version != CLUSTER_FILE_VERSION {
            return Err(ClusterError::Invalid(format!(
                "{} has format version {}; this monarch-host reads version {CLUSTER_FILE_VERSION}",
                path.display(),
                file.version
            )));
        }
        Ok(file)
    }

    /// Writes it (CL-2).
    pub fn save(&self) -> Result<PathBuf, ClusterError> {
        let path = ClusterFile::path(&self.name)?;
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| ClusterError::Invalid(format!("cannot encode the cluster file: {e}")))?;
        write_atomic(&path, format!("{text}\n").as_bytes(), 0o644)?;
        Ok(path)
    }

    /// Removes `name`'s cluster file, its token and its scratch directory.
    pub fn remove(name: &str) -> Result<(), ClusterError> {
        let path = ClusterFile::path(name)?;
        let dir = clusters_dir()?;
        for file in [path, dir.join(format!("{name}.token"))] {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ClusterError::io(format!("removing {}", file.display()))(e)),
            }
        }
        let scratch = scratch_dir(name)?;
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch)
                .map_err(ClusterError::io(format!("removing {}", scratch.display())))?;
        }
        Ok(())
    }

    /// The agents' addresses.
    pub fn addrs(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.addr.clone()).collect()
    }
}

/// `name`'s scratch directory: batch scripts, job output and the files
/// in which agents say where they listen.
pub fn scratch_dir(name: &str) -> Result<PathBuf, ClusterError> {
    check_name(name)?;
    Ok(clusters_dir()?.join(name))
}

/// Writes `bytes` to `path` through a temp file and a rename, with `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), ClusterError> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(ClusterError::io(format!("creating {}", dir.display())))?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ClusterError::io(format!("writing {}", path.display()))(e)
    })
}

/// A fresh cluster token: 32 random bytes as hex, from the kernel.
pub fn new_token() -> Result<String, ClusterError> {
    let mut bytes = [0u8; 32];
    let mut filled = 0;
    while filled < bytes.len() {
        // SAFETY: the pointer and length are of the unfilled part of `bytes`.
        let got = unsafe {
            libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
        };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ClusterError::io("reading random bytes for the token")(e));
        }
        filled += got as usize;
    }
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes a new token to `name`'s token file (mode 0600) and returns its
/// path (CL-1).
pub fn write_token(name: &str) -> Result<PathBuf, ClusterError> {
    let path = clusters_dir()?.join(format!("{name}.token"));
    write_atomic(&path, format!("{}\n", new_token()?).as_bytes(), 0o600)?;
    Ok(path)
}

/// Starts `command`, again a few times over 100 ms while its program is
/// busy (`ETXTBSY`): a program written a moment ago (a wrapper script, an
/// agent binary just copied) stays busy while any thread's child, forked
/// before the writer closed it, has not yet exec'd. Other errors, and a
/// program still busy after that, are returned as they are.
pub fn spawn_when_ready(
    command: &mut std::process::Command,
) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 10 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            spawned => return spawned,
        }
    }
}

/// Seconds since the epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs `program args`, for at most `timeout`, and returns its stdout;
/// a failure names the command and carries its stderr.
pub fn command_output(
    program: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<String, ClusterError> {
    command_output_with(program, args, timeout, false)
}

/// [`command_output`]; with `ignore_sigterm`, the command ignores SIGTERM
/// (for a question asked while Slurm signals every process of a job
/// step, the asker's children included).
pub fn command_output_with(
    program: &str,
    args: &[&str],
    timeout: Duration,
    ignore_sigterm: bool,
) -> Result<String, ClusterError> {
    use std::os::unix::process::CommandExt;
    let shown = || format!("`{program} {}`", args.join(" "));
    let mut command = std::process::Command::new(program);
    if ignore_sigterm {
        // SAFETY: signal(2) is async-signal-safe, and an ignored signal
        // stays ignored across exec.
        unsafe {
            command.pre_exec(|| {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = spawn_when_ready(&mut command).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ClusterError::Scheduler(format!(
            "{program} is not installed here (running {})",
            shown()
        )),
        _ => ClusterError::io(format!("starting {}", shown()))(e),
    })?;
    // Read both pipes on threads, so that a chatty command cannot block.
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stdout.as_mut() {
            let _ = std::io::Read::read_to_string(pipe, &mut text);
        }
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(pipe) = stderr.as_mut() {
            let _ = std::io::Read::read_to_string(pipe, &mut text);
        }
        text
    });
    let until = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ClusterError::Timeout(format!(
                    "{} did not answer within {timeout:?}",
                    shown()
                )));
            }
            Err(e) => return Err(ClusterError::io(format!("waiting for {}", shown()))(e)),
        }
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if !status.success() {
        return Err(ClusterError::Scheduler(format!(
            "{} failed ({status}): {}",
            shown(),
            err.trim()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A program still open for writing (as in a child forked while it was
    /// written) cannot be run; once it is closed, it starts.
    #[test]
    fn a_program_busy_for_a_moment_still_starts() {
        use std::os::unix::fs::OpenOptionsExt as _;
        let dir = std::env::temp_dir().join(format!("spawn-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("prog");
        let mut open = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&script)
            .unwrap();
        open.write_all(b"#!/bin/sh\nexit 3\n").unwrap();
        open.flush().unwrap();
        let busy = std::process::Command::new(&script).spawn().unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::ETXTBSY), "{busy}");
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(open);
        });
        let mut child = spawn_when_ready(&mut std::process::Command::new(&script))
            .expect("started once the writer closed it");
        assert_eq!(child.wait().unwrap().code(), Some(3));
        closer.join().unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }
}
