//! Starting worker processes and procs for the tests.

#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use hyperactor::testing::EchoActor;
use hyperactor::{ActorRef, ChannelAddr, Proc, ProcConfig, ProcId};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A `proc-worker` child process; killed when dropped.
pub struct Worker {
    pub child: Child,
    pub proc_id: ProcId,
    _dir: Option<TempDir>,
}

impl Worker {
    /// Starts a worker on a fresh Unix socket.
    pub async fn unix() -> Worker {
        let dir = TempDir::new();
        let addr = format!("unix:{}/worker.sock", dir.0.display());
        Worker::start(&addr, Some(dir)).await
    }

    /// Starts a worker on a free loopback TCP port.
    pub async fn tcp() -> Worker {
        Worker::start("tcp:127.0.0.1:0", None).await
    }

    async fn start(addr: &str, dir: Option<TempDir>) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_proc-worker"))
            .arg(addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn proc-worker");
        let stdout = child.stdout.take().expect("worker stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("worker ready within 30 s")
            .expect("read worker stdout")
            .expect("worker printed READY");
        let proc_id: ProcId = line
            .strip_prefix("READY ")
            .expect("READY line")
            .parse()
            .expect("worker proc id");
        Worker {
            child,
            proc_id,
            _dir: dir,
        }
    }

    /// The worker's `echo[rank]`.
    pub fn echo(&self, rank: u32) -> ActorRef<EchoActor> {
        ActorRef::attest(self.proc_id.actor_id("echo", rank).expect("actor id"))
    }

    /// The worker's address.
    pub fn addr(&self) -> &ChannelAddr {
        self.proc_id.addr()
    }

    /// Kills the worker with SIGKILL and reaps it.
    pub async fn kill(&mut self) {
        self.child.kill().await.expect("kill worker");
    }
}

/// A proc in the test process, served on the same transport as `worker`.
pub async fn client_proc(worker: &Worker, config: ProcConfig) -> Proc {
    let addr: ChannelAddr = match worker.addr() {
        ChannelAddr::Unix(path) => format!("unix:{path}.client").parse().expect("unix addr"),
        _ => "tcp:127.0.0.1:0".parse().expect("tcp addr"),
    };
    Proc::serve_with_config("client", addr, config)
        .await
        .expect("serve client proc")
}

/// A directory removed when dropped.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "monarch-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
