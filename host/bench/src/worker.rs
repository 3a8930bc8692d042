//! The second process of a cross-process benchmark, from both ends.
//!
//! The suite re-executes its own binary with a hidden subcommand
//! (`worker` or `raw-echo`). The worker serves an address, prints exactly
//! one line, `READY <where>`, on stdout, and lives until its stdin closes.
//! Tying its life to stdin means a parent that dies, however it dies,
//! takes its workers with it: the kernel closes the pipe.
//!
//! [`Worker`] is the parent's handle: it starts the process, waits for the
//! `READY` line, and closes stdin to stop it (or kills it when dropped).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hyperactor::testing::EchoActor;
use hyperactor::{ChannelAddr, Proc};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long a worker may take to print its `READY` line.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a worker may take to exit once its stdin is closed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The name of the proc a `worker` serves, and of its echo actor.
pub const WORKER_PROC: &str = "worker";
/// The name of the echo actor a `worker` spawns, at rank 0.
pub const ECHO_ACTOR: &str = "echo";

/// A worker process started by this one.
pub struct Worker {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    _stdout: BufReader<ChildStdout>,
    ready: String,
}

impl Worker {
    /// Starts this binary with `args` and waits for its `READY` line.
    /// `what` names the worker in errors.
    pub async fn start(what: &str, args: &[String]) -> anyhow::Result<Worker> {
        let exe = hyperactor_mesh::exe::current_exe()
            .context("cannot find this binary to start a worker")?;
        let mut child = Command::new(&exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the {what} worker ({})", exe.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("the {what} worker has no stdin or stdout pipe");
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        let read = tokio::time::timeout(READY_TIMEOUT, stdout.read_line(&mut line)).await;
        let ready = match read {
            Err(_) => bail!(
                "the {what} worker printed no READY line within {} s",
                READY_TIMEOUT.as_secs()
            ),
            Ok(Err(e)) => bail!("cannot read the {what} worker's stdout: {e}"),
            Ok(Ok(0)) => {
                let status = child.wait().await?;
                bail!(
                    "the {what} worker exited before it was ready ({status}); see its stderr above"
                )
            }
            Ok(Ok(_)) => match line.trim_end().strip_prefix("READY ") {
                Some(ready) if !ready.is_empty() => ready.to_string(),
                _ => bail!(
                    "the {what} worker said {:?} where `READY <address>` was expected",
                    line.trim_end()
                ),
            },
        };
        tracing::debug!(worker = what, %ready, "worker ready");
        Ok(Worker {
            what: what.to_string(),
            child,
            stdin: Some(stdin),
            _stdout: stdout,
            ready,
        })
    }

    /// What the worker printed after `READY `: where it serves.
    pub fn ready(&self) -> &str {
        &self.ready
    }

    /// Closes the worker's stdin and waits for it to exit; kills it if it
    /// does not exit in time.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        drop(self.stdin.take());
        match tokio::time::timeout(EXIT_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => bail!("the {} worker exited with {status}", self.what),
            Ok(Err(e)) => bail!("cannot wait for the {} worker: {e}", self.what),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!(
                    "the {} worker did not exit within {} s of its stdin closing; killed it",
                    self.what,
                    EXIT_TIMEOUT.as_secs()
                )
            }
        }
    }
}

/// A private directory for socket files, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Creates `$TMPDIR/monarch-bench-<pid>`.
    pub fn new() -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("monarch-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {} for socket files", dir.display()))?;
        Ok(Scratch(dir))
    }

    /// A `unix:` address for a socket file named `name` in the directory.
    pub fn unix_addr(&self, name: &str) -> anyhow::Result<ChannelAddr> {
        let path = self.0.join(name);
        let Some(path) = path.to_str() else {
            bail!(
                "{} is not valid UTF-8; set TMPDIR elsewhere",
                path.display()
            );
        };
        Ok(format!("unix:{path}").parse()?)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Which tokio scheduler the processes of a suite run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    /// `worker_threads` threads that steal work from each other.
    MultiThread,
    /// Everything on the thread that calls `block_on`.
    CurrentThread,
}

impl Flavor {
    /// The name as written on the command line.
    pub fn as_arg(self) -> &'static str {
        match self {
            Flavor::MultiThread => "multi-thread",
            Flavor::CurrentThread => "current-thread",
        }
    }
}

/// Builds the tokio runtime every process of the suite uses.
pub fn runtime(flavor: Flavor, worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = match flavor {
        Flavor::MultiThread => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(worker_threads);
            builder
        }
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    builder
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")
}

/// Resolves when stdin reaches its end (or fails): the parent is gone or
/// wants this worker to stop.
fn stdin_closed() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = tx.send(());
    });
    rx
}

/// The `worker` subcommand: serves a proc named [`WORKER_PROC`] at `addr`
/// with an [`EchoActor`] named [`ECHO_ACTOR`]`[0]`, prints `READY <proc id>`
/// and runs until stdin closes.
pub fn serve_echo_proc(
    addr: ChannelAddr,
    flavor: Flavor,
    worker_threads: usize,
    busy_poll: Duration,
) -> anyhow::Result<()> {
    let runtime = runtime(flavor, worker_threads)?;
    runtime.block_on(async {
        let closed = stdin_closed();
        let config = hyperactor::ProcConfig {
            busy_poll,
            ..hyperactor::ProcConfig::default()
        };
        let proc = Proc::serve_with_config(WORKER_PROC, addr, config).await?;
        let _echo = proc.spawn(ECHO_ACTOR, 0, EchoActor::default())?;
        println!("READY {}", proc.id());
        let _ = closed.await;
        tracing::debug!(proc = %proc.id(), "stdin closed; exiting");
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
