//! Allocation: starting the procs of a mesh.
//!
//! An [`Allocator`] starts procs and says when they stop:
//! - [`InProcessAllocator`]: procs inside this process (`local:`), for
//!   tests and for programs too small to pay for processes;
//! - [`LocalAllocator`]: child OS processes of this one, each a proc on a
//!   Unix socket, started through a bootstrap command (`monarch-host
//!   bootstrap`) that runs [`bootstrap_main`];
//! - remote agents ([`crate::client`]) start such children on other hosts.
//!
//! - AL-1: no orphans. A child proc exits when its parent goes away: its
//!   stdin is a pipe from the parent, and it exits when that pipe closes;
//!   a parent-death signal (SIGKILL) covers a parent killed outright.
//! - AL-2: every child that ends is reported once, with its exit code or
//!   the signal that killed it.
//! - AL-3: procs of one request start in parallel; a request fails whole if
//!   one proc does not come up within the bootstrap timeout.
//! - AL-4: the CPU time of every child proc that ends is read once it has
//!   exited and before it is reaped, and added to this process's count
//!   ([`ended_procs_cpu`]): what a proc costs, from its start to its exit.
//! - AL-5: with its fork server on ([`LocalAllocator::with_fork_server`],
//!   [`use_fork_server`]; off by default),
//!   an allocator forks its children from one started process of the
//!   bootstrap command ([`crate::fork`]) instead of starting the program
//!   for each, and starts the program when it cannot; a forked child keeps
//!   AL-1, AL-2 and AL-4.
//! - AL-7: such an allocator tells its fork server of each blob it stores
//!   ([`crate::fork::ForkServer::preload`], FS-6), so that the server can
//!   load the program before it forks the next procs, which then inherit
//!   it instead of each loading it.
//! - AL-8: the children's Unix sockets live in a directory of their own
//!   (mode 0700) under [`socket_root`]: `MONARCH_SOCKET_DIR`, else
//!   `XDG_RUNTIME_DIR`, else `/dev/shm` where it is a tmpfs, else the
//!   temporary directory. A socket is an inode, and on a disk file system
//!   making one costs far more than in memory (ext4 searches its inode
//!   bitmap past every inode freed in the last seconds, so the cost grows
//!   with the rate procs come and go).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyperactor::{ChannelAddr, PortRef, Proc, ProcId};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::agent::{BoxFuture, MeshEvent, Registry, start_mesh_proc};

/// How long a child proc has to report that it is ready.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that carries a child's [`BootstrapConfig`].
pub const BOOTSTRAP_ENV: &str = "MONARCH_BOOTSTRAP";

/// The environment variable that gives a started child proc the pid of
/// the process that started it: the child asks for a parent-death signal
/// itself, then checks that its parent is still that process (AL-1).
pub const DIE_WITH_ENV: &str = "MONARCH_DIE_WITH";

/// The environment variable naming the directory under which allocators
/// make their children's socket directories (AL-8).
pub const SOCKET_DIR_ENV: &str = "MONARCH_SOCKET_DIR";

/// The longest socket directory an allocator accepts: a Unix socket's
/// path holds at most 107 bytes, and a proc's socket in it is named
/// after the proc.
const MAX_SOCKET_DIR_LEN: usize = 72;

/// Where allocators make their children's socket directories (AL-8):
/// `MONARCH_SOCKET_DIR` if set, else `XDG_RUNTIME_DIR` (the per-user
/// directory for sockets), else `/dev/shm` if it is a tmpfs this process
/// may write to, else [`std::env::temp_dir`].
pub fn socket_root() -> PathBuf {
    socket_root_from(|name| std::env::var_os(name), Path::new("/dev/shm"))
}

/// [`socket_root`], with the environment read through `var` and `shm`
/// in place of `/dev/shm`.
fn socket_root_from(var: impl Fn(&str) -> Option<std::ffi::OsString>, shm: &Path) -> PathBuf {
    let from_env = |name: &str| var(name).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(dir) = from_env(SOCKET_DIR_ENV) {
        return dir;
    }
    if let Some(dir) = from_env("XDG_RUNTIME_DIR").filter(|d| d.is_dir()) {
        return dir;
    }
    if in_memory_and_writable(shm) {
        return shm.to_path_buf();
    }
    std::env::temp_dir()
}

/// Whether `dir` is a tmpfs directory this process may make files in.
fn in_memory_and_writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a statfs is plain data, for which all zeroes is a value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `fs` a statfs to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 || fs.f_type != libc::TMPFS_MAGIC {
        return false;
    }
    // SAFETY: `c` is a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The lock file in an allocator's socket directory.
const SOCKET_DIR_LOCK: &str = ".lock";

/// How old a leftover must be before [`sweep_stale`] removes it: a
/// directory is made before its lock is taken.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// Takes the lock of the socket directory `dir` (AL-8), making its lock
/// file if `make`; an error when a process holds it, or (not `make`) when
/// there is no lock file.
fn lock_socket_dir(dir: &Path, make: bool) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(make)
        .truncate(false)
        .write(true)
        .open(dir.join(SOCKET_DIR_LOCK))?;
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

/// Sweeps `root` ([`sweep_stale`]) once in this process, on a thread of
/// its own so that no allocator waits for it.
fn sweep_stale_once(root: &Path) {
    static SWEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    {
        let mut swept = SWEPT.lock();
        if swept.iter().any(|r| r == root) {
            return;
        }
        swept.push(root.to_path_buf());
    }
    let root = root.to_path_buf();
    let _ = std::thread::Builder::new()
        .name("socket-sweep".into())
        .spawn(move || {
            let removed = sweep_stale(&root, STALE_AFTER);
            if removed > 0 {
                tracing::debug!(root = %root.display(), removed, "removed leftover sockets");
            }
        });
}

/// Removes from `root` what processes of this user left there when they
/// ended without cleaning up (killed, or exited past their destructors),
/// and returns how many entries it removed (AL-8):
/// - socket directories `monarch-PID-N` whose lock no process holds (or,
///   made before there were locks, whose process is gone);
/// - controller sockets `monarch-runPID-N.sock` and
///   `monarch-serve-PID-N.sock` whose process is gone and that refuse a
///   connection.
///
/// Nothing younger than `older_than`, nothing of another user and
/// nothing of a process still alive is touched.
pub fn sweep_stale(root: &Path, older_than: Duration) -> usize {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, socket)) = name.to_str().and_then(leftover_owner) else {
            continue;
        };
        let path = entry.path();
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= older_than);
        if meta.uid() != me || !old || pid == std::process::id() {
            continue;
        }
        let gone = !process_alive(pid);
        if socket {
            // Only a gone process's socket is tried, and only a refused
            // one goes (the pid may be of another pid namespace).
            if meta.file_type().is_socket()
                && gone
                && std::os::unix::net::UnixStream::connect(&path).is_err()
                && std::fs::remove_file(&path).is_ok()
            {
                removed += 1;
            }
            continue;
        }
        if !meta.is_dir() {
            continue;
        }
        // The lock, taken and held while the directory goes; without
        // one, the directory predates locks and goes if its process did.
        let lock = lock_socket_dir(&path, false);
        let free = match &lock {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => gone,
            Err(_) => false,
        };
        if free && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
        drop(lock);
    }
    removed
}

/// Whose controller socket [`controller_socket`] names.
#[derive(Debug, Clone, Copy)]
pub enum ControllerSocket {
    /// A mesh of `monarch-host run`: `monarch-runPID-N.sock`.
    Run,
    /// A fresh mesh of a `serve` job: `monarch-serve-PID-N.sock`.
    Serve,
}

impl ControllerSocket {
    fn prefix(self) -> &'static str {
        match self {
            ControllerSocket::Run => "monarch-run",
            ControllerSocket::Serve => "monarch-serve-",
        }
    }
}

/// Where the controller of this process's `nth` mesh of `kind` listens,
/// under [`socket_root`], by a name [`sweep_stale`] knows (AL-8).
pub fn controller_socket(kind: ControllerSocket, nth: u64) -> PathBuf {
    socket_root().join(format!(
        "{}{}-{nth}.sock",
        kind.prefix(),
        std::process::id()
    ))
}

/// The pid in the name of an allocator's leftover, and whether it is a
/// controller's socket (else a socket directory): `monarch-PID-N`, or a
/// [`controller_socket`].
fn leftover_owner(name: &str) -> Option<(u32, bool)> {
    let numbered = |rest: &str| -> Option<u32> {
        let (pid, n) = rest.split_once('-')?;
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        (digits(pid) && digits(n))
            .then(|| pid.parse().ok())
            .flatten()
    };
    for kind in [ControllerSocket::Run, ControllerSocket::Serve] {
        if let Some(rest) = name.strip_prefix(kind.prefix()) {
            return numbered(rest.strip_suffix(".sock")?).map(|pid| (pid, true));
        }
    }
    numbered(name.strip_prefix("monarch-")?).map(|pid| (pid, false))
}

/// Whether a process `pid` exists (in this pid namespace).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let sent = unsafe { libc::kill(pid, 0) } == 0;
    sent || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether allocators made from now on fork their children (AL-5).
static FORK_SERVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the [`LocalAllocator`]s this process makes from now on fork their
/// children from a fork server (AL-5; `monarch-host run --fork-server`,
/// `serve --fork-server`), or start each from the program (the default).
pub fn use_fork_server(on: bool) {
    FORK_SERVER.store(on, Ordering::Relaxed);
}

/// How long a stopped child has to exit on its own before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The line a child prints on stdout when its proc is ready.
const READY: &str = "MONARCH_PROC_READY ";

/// A proc an allocator started.
#[derive(Debug, Clone)]
pub struct Allocated {
    /// The proc.
    pub proc: ProcId,
    /// The host it runs on, as the allocator numbers them.
    pub host: usize,
    /// Its OS process, when it has one of its own.
    pub pid: Option<u32>,
}

/// Why procs could not be started.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct AllocError(pub String);

tokio::task_local! {
    /// Told how many more procs of an allocation are up
    /// ([`reporting_procs_up`]).
    static PROCS_UP: Arc<dyn Fn(usize) + Send + Sync>;
}

/// Runs `allocation` (a future that starts procs, such as
/// [`crate::client::MeshClient::spawn_procs`]) with `up` told how many
/// more procs are up as each comes up, before the whole request is done:
/// how a command line shows "N of M procs up".
pub async fn reporting_procs_up<F: std::future::Future>(
    up: Arc<dyn Fn(usize) + Send + Sync>,
    allocation: F,
) -> F::Output {
    PROCS_UP.scope(up, allocation).await
}

/// Tells the hook of [`reporting_procs_up`], if the caller set one, that
/// `count` more procs are up.
pub(crate) fn procs_up(count: usize) {
    let _ = PROCS_UP.try_with(|up| up(count));
}

/// Starts procs; see the module docs.
pub trait Allocator: Send + Sync + 'static {
    /// Starts `count` procs named `names`, whose actors report to `events`;
    /// when one ends, a [`MeshEvent::ProcStopped`] goes to `stopped`.
    fn allocate(
        &self,
        names: Vec<String>,
        events: PortRef<MeshEvent>,
        stopped: mpsc::UnboundedSender<MeshEvent>,
    ) -> BoxFuture<Result<Vec<Allocated>, AllocError>>;

    /// Stores a blob on every host, once per host.
    fn put_blob(&self, sha256: String, bytes: Arc<Vec<u8>>) -> BoxFuture<Result<(), AllocError>>;

    /// Stops every proc it started.
    fn stop_all(&self);

    /// Stops these procs: each exits on its own, or is killed after a
    /// grace period.
    fn stop(&self, procs: &[ProcId]);

    /// Ends one proc, as a failure would (tests and chaos).
    fn kill(&self, proc: &ProcId, signal: i32) -> Result<(), AllocError>;

    /// Makes one proc end as if its main returned, if this allocator does
    /// that itself; None: ask the proc's agent ([`crate::agent::ExitProc`]).
    fn exit(&self, _proc: &ProcId) -> Option<Result<(), AllocError>> {
        None
    }

    /// The name of the host numbered `host` in [`Allocated::host`]: its
    /// agent's address, or `local` for this machine.
    fn host_name(&self, _host: usize) -> String {
        "local".into()
    }
}

/// Procs inside this process; see the module docs.
pub struct InProcessAllocator {
    registry: Arc<Registry>,
    prefix: String,
    procs: Arc<Mutex<Vec<Proc>>>,
    /// Where a proc ended on purpose ([`Allocator::kill`]) is reported.
    stopped: Arc<Mutex<Option<mpsc::UnboundedSender<MeshEvent>>>>,
}

impl InProcessAllocator {
    /// An allocator whose procs spawn actors from `registry`.
    pub fn new(registry: Arc<Registry>) -> Self {
        static ALLOCATORS: AtomicUsize = AtomicUsize::new(0);
        InProcessAllocator {
            registry,
            prefix: format!(
                "mesh{}-{}",
                std::process::id(),
                ALLOCATORS.fetch_add(1, Ordering::Relaxed)
            ),
            procs: Arc::default(),
            stopped: Arc::default(),
        }
    }

    /// Crashes `proc` (`Proc::crash`), stops its actors' inbox, and
    /// reports it ended with `status` (a wait status: a signal, or an exit
    /// code shifted left by 8), as a child proc's end is reported.
    fn end(&self, proc: &ProcId, status: i32) -> Result<(), AllocError> {
        use std::os::unix::process::ExitStatusExt;
        let ended = {
            let mut procs = self.procs.lock();
            let index = procs
                .iter()
                .position(|p| p.id() == proc)
                .ok_or_else(|| AllocError(format!("no proc {proc} in this process")))?;
            procs.remove(index)
        };
        ended.crash();
        let reason = describe_exit(std::process::ExitStatus::from_raw(status));
        if let Some(stopped) = self.stopped.lock().as_ref() {
            let _ = stopped.send(MeshEvent::ProcStopped {
                proc: proc.clone(),
                reason,
            });
        }
        Ok(())
    }
}

impl Allocator for InProcessAllocator {
    fn allocate(
        &self,
        names: Vec<String>,
        events: PortRef<MeshEvent>,
        stopped: mpsc::UnboundedSender<MeshEvent>,
    ) -> BoxFuture<Result<Vec<Allocated>, AllocError>> {
        *self.stopped.lock() = Some(stopped);
        let (registry, prefix, procs) = (
            self.registry.clone(),
            self.prefix.clone(),
            self.procs.clone(),
        );
        Box::pin(async move {
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let fail = |e: &dyn std::fmt::Display| {
                    AllocError(format!("cannot start proc {name}: {e}"))
                };
                let addr: ChannelAddr = format!("local:{prefix}-{name}")
                    .parse()
                    .map_err(|e| fail(&e))?;
                let proc = Proc::serve(&name, addr).await.map_err(|e| fail(&e))?;
                start_mesh_proc(&proc, registry.clone(), events.clone()).map_err(|e| fail(&e))?;
                out.push(Allocated {
                    proc: proc.id().clone(),
                    host: 0,
                    pid: None,
                });
                procs.lock().push(proc);
                procs_up(1);
            }
            Ok(out)
        })
    }

    fn put_blob(&self, sha256: String, bytes: Arc<Vec<u8>>) -> BoxFuture<Result<(), AllocError>> {
        let registry = self.registry.clone();
        Box::pin(async move { put_local_blob(registry, sha256, bytes, |_, _| {}).await })
    }

    fn stop_all(&self) {
        self.procs.lock().clear();
    }

    fn stop(&self, procs: &[ProcId]) {
        self.procs.lock().retain(|p| !procs.contains(p.id()));
    }

    /// A proc inside this process cannot get a signal: it crashes
    /// (`Proc::crash`) and is reported killed by `signal`.
    fn kill(&self, proc: &ProcId, signal: i32) -> Result<(), AllocError> {
        if !(1..=64).contains(&signal) {
            return Err(AllocError(format!("{signal} is not a signal number")));
        }
        self.end(proc, signal)
    }

    fn exit(&self, proc: &ProcId) -> Option<Result<(), AllocError>> {
        Some(self.end(proc, 0))
    }
}

/// Stores a blob in `registry`'s directory, then runs `stored` with its
/// path and sha256, off the runtime.
async fn put_local_blob(
    registry: Arc<Registry>,
    sha256: String,
    bytes: Arc<Vec<u8>>,
    stored: impl FnOnce(&Path, &str) + Send + 'static,
) -> Result<(), AllocError> {
    tokio::task::spawn_blocking(move || {
        let path = registry.put_blob(&sha256, &bytes)?;
        stored(&path, &sha256);
        Ok(())
    })
    .await
    .map_err(|e| AllocError(format!("storing a blob panicked: {e}")))?
    .map_err(AllocError)
}

/// What a child proc is told at start, as JSON in [`BOOTSTRAP_ENV`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BootstrapConfig {
    /// The proc's name.
    pub name: String,
    /// Where to listen: `unix:DIR` for a socket in DIR, or `tcp:IP:PORT`.
    pub listen: String,
    /// The controller's events port, as text.
    pub events: String,
    /// Where this host keeps blobs.
    pub blob_dir: PathBuf,
    /// How long the proc's connections busy-poll, in microseconds (see
    /// `hyperactor::ProcConfig::busy_poll`); 0 when procs outnumber cores.
    #[serde(default)]
    pub busy_poll_us: u64,
    /// Whether the proc runs as `SCHED_BATCH` ([`run_as_batch`]): set when
    /// procs outnumber cores.
    #[serde(default)]
    pub batch: bool,
    /// The cluster token the proc requires of its peers and presents to
    /// them (hyperactor's PR-6); none on one machine.
    #[serde(default)]
    pub cluster_token: Option<String>,
    /// The TLS directory of the parent (`hyperactor::channel::tls`): the
    /// child reads its certificates from there and speaks TLS on TCP as
    /// its parent does. A path, never key material.
    #[serde(default)]
    pub tls_dir: Option<PathBuf>,
}

/// A command that starts a child proc: a program and its arguments, to
/// which the allocator adds the environment.
#[derive(Debug, Clone)]
pub struct BootstrapCommand {
    /// The program, usually this very binary.
    pub program: PathBuf,
    /// Its arguments, e.g. `["bootstrap"]`.
    pub args: Vec<String>,
}

impl BootstrapCommand {
    /// This binary with `args`.
    pub fn current_exe(args: &[&str]) -> std::io::Result<Self> {
        Ok(BootstrapCommand {
            program: crate::exe::current_exe()?,
            args: args.iter().map(|a| a.to_string()).collect(),
        })
    }
}

struct ChildEntry {
    proc: ProcId,
    pid: u32,
    kill: Option<oneshot::Sender<()>>,
}

/// Procs as child processes of this one; see the module docs.
pub struct LocalAllocator {
    command: BootstrapCommand,
    /// What runs for `command.program`: a copy of it whose code the
    /// kernel can map with 2 MiB pages ([`crate::exe`]), if one helps.
    run: Option<PathBuf>,
    registry: Arc<Registry>,
    /// `unix` for sockets in a directory of this allocator, or `tcp:IP`.
    listen: String,
    socket_dir: PathBuf,
    /// Held while this allocator lives: a socket directory whose lock
    /// can be taken is left over (AL-8, [`sweep_stale`]).
    _lock: std::fs::File,
    children: Arc<Mutex<Vec<ChildEntry>>>,
    /// Set by `stop_all`: the last child to end removes the socket directory.
    stopped: Arc<std::sync::atomic::AtomicBool>,
    cluster_token: Option<String>,
    /// Whether children are forked by the fork server (AL-5).
    fork_server: bool,
}

impl LocalAllocator {
    /// Children started by `command`, on Unix sockets, whose host keeps
    /// blobs where `registry` says.
    pub fn new(command: BootstrapCommand, registry: Arc<Registry>) -> std::io::Result<Self> {
        Self::new_under(command, registry, &socket_root())
    }

    /// [`LocalAllocator::new`], with its socket directory under `root`.
    fn new_under(
        command: BootstrapCommand,
        registry: Arc<Registry>,
        root: &Path,
    ) -> std::io::Result<Self> {
        static ALLOCATORS: AtomicUsize = AtomicUsize::new(0);
        let socket_dir = root.join(format!(
            "monarch-{}-{}",
            std::process::id(),
            ALLOCATORS.fetch_add(1, Ordering::Relaxed)
        ));
        // A Unix socket's path holds at most 107 bytes; leave the procs'
        // names room, and say so now rather than as each proc fails.
        let len = socket_dir.as_os_str().len();
        if len > MAX_SOCKET_DIR_LEN {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the procs' socket directory {} is {len} bytes long, more than the {MAX_SOCKET_DIR_LEN} \
                     that leave room for a proc's socket in a Unix socket's 107: \
                     set {SOCKET_DIR_ENV} to a shorter directory",
                    socket_dir.display()
                ),
            ));
        }
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&socket_dir)
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "cannot make the procs' socket directory {}: {e}",
                            socket_dir.display()
                        ),
                    )
                })?;
        }
        let lock = lock_socket_dir(&socket_dir, true)?;
        sweep_stale_once(root);
        // The copy of the program procs run, made now if it is not yet.
        let run = crate::exe::for_procs(&command.program);
        Ok(LocalAllocator {
            _lock: lock,
            run: (run != command.program).then_some(run),
            command,
            registry,
            listen: "unix".into(),
            socket_dir,
            children: Arc::default(),
            stopped: Arc::default(),
            cluster_token: None,
            fork_server: FORK_SERVER.load(Ordering::Relaxed),
        })
    }

    /// Forks children from one started process of the command, its fork
    /// server (AL-5, [`crate::fork`]), instead of starting the program for
    /// each: a fresh proc then skips the program's `execve` and start-up.
    /// The command must call [`crate::fork::serve_forks`] first thing;
    /// where the server cannot fork, the program is started as without it.
    /// The default is [`use_fork_server`]'s. The server stays, as a child
    /// of this process, until this process ends; the procs are its
    /// children.
    pub fn with_fork_server(mut self, on: bool) -> Self {
        self.fork_server = on;
        self
    }

    /// Children listen on TCP at `ip` (any free port) instead of Unix
    /// sockets, so that other hosts can reach them.
    pub fn listen_tcp(mut self, ip: std::net::IpAddr) -> Self {
        std::fs::remove_dir_all(&self.socket_dir).ok();
        self.listen = format!("tcp:{}", std::net::SocketAddr::new(ip, 0));
        self
    }

    /// Children require `token` of their peers and present it to them.
    pub fn with_cluster_token(mut self, token: Option<String>) -> Self {
        self.cluster_token = token.filter(|t| !t.is_empty());
        self
    }

    /// The pids of the children alive now.
    pub fn pids(&self) -> Vec<(ProcId, u32)> {
        self.children
            .lock()
            .iter()
            .map(|c| (c.proc.clone(), c.pid))
            .collect()
    }
}

impl Drop for LocalAllocator {
    fn drop(&mut self) {
        self.stop_all();
        std::fs::remove_dir_all(&self.socket_dir).ok();
    }
}

impl Allocator for LocalAllocator {
    fn allocate(
        &self,
        names: Vec<String>,
        events: PortRef<MeshEvent>,
        stopped: mpsc::UnboundedSender<MeshEvent>,
    ) -> BoxFuture<Result<Vec<Allocated>, AllocError>> {
        let listen = if self.listen == "unix" {
            format!("unix:{}", self.socket_dir.display())
        } else {
            self.listen.clone()
        };
        // Procs that spin while they wait only pay off when each can have
        // a core: past that, a spinning proc holds the core another needs.
        // Every allocator of this process counts (several agents may share
        // one machine's process, as in `monarch-bench scale`).
        let reserved: Vec<ProcHere> = names.iter().map(|_| ProcHere::new()).collect();
        let procs_here = PROCS_HERE.load(Ordering::Relaxed) + 1;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let oversubscribed = procs_here > cores;
        let busy_poll_us = if oversubscribed {
            0
        } else {
            hyperactor::ProcConfig::default().busy_poll.as_micros() as u64
        };
        let starts: Vec<_> = names
            .into_iter()
            .zip(reserved)
            .map(|(name, here)| {
                let config = BootstrapConfig {
                    name,
                    listen: listen.clone(),
                    events: events.id().to_string(),
                    blob_dir: self.registry.blob_dir().to_path_buf(),
                    busy_poll_us,
                    batch: oversubscribed,
                    cluster_token: self.cluster_token.clone(),
                    tls_dir: hyperactor::channel::tls::installed()
                        .map(|tls| tls.dir().to_path_buf()),
                };
                start_child(
                    self.command.clone(),
                    self.run.clone(),
                    self.fork_server,
                    config,
                    here,
                    stopped.clone(),
                    Cleanup {
                        children: self.children.clone(),
                        stopped: self.stopped.clone(),
                        socket_dir: (self.listen == "unix").then(|| self.socket_dir.clone()),
                    },
                )
            })
            .collect();
        let children = self.children.clone();
        Box::pin(async move {
            let results = futures::future::join_all(starts.into_iter().map(|start| async {
                let started = start.await;
                if started.is_ok() {
                    procs_up(1);
                }
                started
            }))
            .await;
            let mut out = Vec::with_capacity(results.len());
            let mut first_error = None;
            for result in results {
                match result {
                    Ok(allocated) => out.push(allocated),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(error) = first_error {
                // AL-3: all or nothing.
                let mut children = children.lock();
                for child in children.iter_mut() {
                    if out.iter().any(|a| a.proc == child.proc)
                        && let Some(kill) = child.kill.take()
                    {
                        let _ = kill.send(());
                    }
                }
                return Err(error);
            }
            Ok(out)
        })
    }

    fn put_blob(&self, sha256: String, bytes: Arc<Vec<u8>>) -> BoxFuture<Result<(), AllocError>> {
        let registry = self.registry.clone();
        // AL-7: the fork server loads the program once, for the procs it
        // forks from now on.
        let server = self.fork_server.then(|| {
            let program = self.run.as_deref().unwrap_or(&self.command.program);
            (program.to_path_buf(), self.command.args.clone())
        });
        Box::pin(put_local_blob(
            registry,
            sha256,
            bytes,
            move |path, sha256| {
                if let Some((program, args)) = server {
                    let told = crate::fork::ForkServer::of(&program, &args)
                        .and_then(|server| server.preload(path, sha256));
                    if let Err(e) = told {
                        tracing::debug!(error = %e, "cannot have the fork server load a program");
                    }
                }
            },
        ))
    }

    fn stop_all(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        let mut children = self.children.lock();
        if children.is_empty() && self.listen == "unix" {
            std::fs::remove_dir_all(&self.socket_dir).ok();
        }
        for child in children.iter_mut() {
            if let Some(kill) = child.kill.take() {
                let _ = kill.send(());
            }
        }
    }

    fn stop(&self, procs: &[ProcId]) {
        for child in self.children.lock().iter_mut() {
            if procs.contains(&child.proc)
                && let Some(kill) = child.kill.take()
            {
                let _ = kill.send(());
            }
        }
    }

    fn kill(&self, proc: &ProcId, signal: i32) -> Result<(), AllocError> {
        let pid = self
            .children
            .lock()
            .iter()
            .find(|c| &c.proc == proc)
            .map(|c| c.pid)
            .ok_or_else(|| AllocError(format!("no child proc {proc}")))?;
        // SAFETY: kill(2) with a pid this allocator started and still watches.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(AllocError(format!(
                "kill {pid}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }
}

/// Describes how a child ended: "exited with code 3", "killed by signal 9 (SIGKILL)".
pub fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    match status.signal() {
        Some(signal) => format!("killed by signal {signal} ({})", signal_name(signal)),
        None => "ended".into(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGTERM => "SIGTERM",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGPIPE => "SIGPIPE",
        _ => "signal",
    }
}

/// What a child's watcher tidies when the child ends.
struct Cleanup {
    children: Arc<Mutex<Vec<ChildEntry>>>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    socket_dir: Option<PathBuf>,
}

/// Child procs of this process's allocators, started or starting.
static PROCS_HERE: AtomicUsize = AtomicUsize::new(0);

/// One child proc counted in [`PROCS_HERE`] while this lives.
struct ProcHere;

impl ProcHere {
    fn new() -> Self {
        PROCS_HERE.fetch_add(1, Ordering::Relaxed);
        ProcHere
    }
}

impl Drop for ProcHere {
    fn drop(&mut self) {
        PROCS_HERE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Child procs of this process's allocators that have ended (AL-4), and
/// the CPU time they used, in nanoseconds.
static ENDED_PROCS: AtomicU64 = AtomicU64::new(0);
static ENDED_PROCS_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// How many child procs of this process's allocators have ended, and the
/// CPU time (user and system, with that of their own children) they used
/// in all, from each one's start to its exit (AL-4). What a fresh proc
/// costs is the growth of both over a run of jobs. Procs that remote
/// agents start are counted in the agent's process; a child whose CPU
/// could not be read (no `pidfd` on this kernel) is not counted.
pub fn ended_procs_cpu() -> (u64, Duration) {
    // `count_ended` adds the CPU before the count: a proc read as counted
    // here has its CPU in the total read after it.
    let procs = ENDED_PROCS.load(Ordering::Acquire);
    let nanos = ENDED_PROCS_CPU_NS.load(Ordering::Acquire);
    (procs, Duration::from_nanos(nanos))
}

/// A child's exit, watched through a `pidfd` so that its CPU time can be
/// read after it exits and before [`tokio::process::Child::wait`] reaps
/// it (AL-4).
struct ExitWatch(Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>);

impl ExitWatch {
    /// Watches `pid`, a child of this process not yet reaped.
    fn new(pid: u32) -> Self {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new
        // descriptor or -1; nothing else is touched.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            tracing::debug!(pid, error = %std::io::Error::last_os_error(), "no pidfd; the proc's CPU is not counted");
            return ExitWatch(None);
        }
        // SAFETY: `fd` is a descriptor pidfd_open just returned, owned by
        // nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) };
        // SAFETY: the `OwnedFd` moves into the `AsyncFd`, which keeps it
        // open for as long as it is registered.
        let watched = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        };
        ExitWatch(
            watched
                .inspect_err(|e| tracing::debug!(pid, error = %e, "pidfd not watched; the proc's CPU is not counted"))
                .ok(),
        )
    }

    /// Waits for `child` to end and reaps it, counting its CPU time first.
    async fn wait(
        &mut self,
        child: &mut tokio::process::Child,
    ) -> std::io::Result<std::process::ExitStatus> {
        if let Some(fd) = &self.0 {
            // A pidfd is readable once its process has exited. A wait
            // dropped before then (a stop's timeout) leaves it watched.
            if fd.readable().await.is_ok() {
                count_exited(fd);
            }
            self.0 = None;
        }
        child.wait().await
    }
}

/// Adds the CPU time of the exited, unreaped process behind `pidfd` to
/// [`ended_procs_cpu`].
fn count_exited(pidfd: &impl std::os::fd::AsRawFd) {
    /// waitid(2)'s id type for a pidfd (Linux 5.4).
    const P_PIDFD: libc::c_int = 3;
    // SAFETY: both are plain C structs that the kernel fills in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the raw waitid takes a fifth argument, the rusage to fill;
    // WNOWAIT leaves the child to be reaped by its `Child`. Both pointers
    // are valid for the call.
    let done = unsafe {
        libc::syscall(
            libc::SYS_waitid,
            P_PIDFD,
            pidfd.as_raw_fd(),
            &mut info as *mut libc::siginfo_t,
            libc::WEXITED | libc::WNOWAIT,
            &mut usage as *mut libc::rusage,
        )
    };
    if done == 0 {
        count_ended(rusage_cpu(&usage));
    }
}

/// The CPU time, user and system, that `usage` reports.
pub(crate) fn rusage_cpu(usage: &libc::rusage) -> Duration {
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// Counts one ended proc and its CPU time (AL-4).
fn count_ended(cpu: Duration) {
    ENDED_PROCS_CPU_NS.fetch_add(cpu.as_nanos() as u64, Ordering::Release);
    ENDED_PROCS.fetch_add(1, Ordering::Release);
}

/// A child proc's process: started from the program, or forked by the
/// fork server (AL-5).
enum ProcProcess {
    Started {
        child: Box<tokio::process::Child>,
        exit: ExitWatch,
    },
    Forked {
        pid: u32,
        exit: oneshot::Receiver<crate::fork::ForkedExit>,
        ended: Option<std::process::ExitStatus>,
    },
}

impl ProcProcess {
    /// Waits for it to end (cancel-safe: a dropped wait can be made again).
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            ProcProcess::Started { child, exit } => exit.wait(child.as_mut()).await,
            ProcProcess::Forked { ended, exit, .. } => {
                if let Some(status) = ended {
                    return Ok(*status);
                }
                let reported = exit
                    .await
                    .map_err(|_| std::io::Error::other("the fork server ended"))?;
                count_ended(reported.cpu);
                use std::os::unix::process::ExitStatusExt;
                Ok(*ended.insert(std::process::ExitStatus::from_raw(reported.status)))
            }
        }
    }

    /// Sends it SIGKILL.
    fn start_kill(&mut self) {
        match self {
            ProcProcess::Started { child, .. } => {
                let _ = child.start_kill();
            }
            ProcProcess::Forked {
                pid, ended: None, ..
            } => {
                // SAFETY: kill(2) of a child of our fork server not yet
                // reported ended (so not yet reaped).
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
            }
            ProcProcess::Forked { .. } => {}
        }
    }
}

/// What a new child proc's process is, and the ends of its stdin and
/// stdout that this process holds.
type Launched = (
    ProcProcess,
    u32,
    Box<dyn std::any::Any + Send>,
    Box<dyn tokio::io::AsyncRead + Unpin + Send>,
);

/// Starts `program` as a child proc.
fn launch_started(
    program: &Path,
    command: &BootstrapCommand,
    json: &str,
) -> std::io::Result<Launched> {
    let mut child = spawn(program, command, json)?;
    let pid = child.id().unwrap_or(0);
    let exit = ExitWatch::new(pid);
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    Ok((
        ProcProcess::Started {
            child: Box::new(child),
            exit,
        },
        pid,
        Box::new(stdin),
        Box::new(stdout),
    ))
}

/// Has the fork server of `program command.args` fork a child proc (AL-5).
async fn launch_forked(
    program: &Path,
    command: &BootstrapCommand,
    json: &str,
) -> std::io::Result<Launched> {
    let server = crate::fork::ForkServer::of(program, &command.args)?;
    let (stdin_read, stdin_write) = crate::fork::pipe()?;
    let (stdout_read, stdout_write) = crate::fork::pipe()?;
    let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
    let forked = server
        .fork(&[(BOOTSTRAP_ENV, json)], [stdin_read, stdout_write, stderr])
        .await?;
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_read)?;
    Ok((
        ProcProcess::Forked {
            pid: forked.pid,
            exit: forked.exit,
            ended: None,
        },
        forked.pid,
        Box::new(stdin_write),
        Box::new(stdout),
    ))
}

/// Starts `program` with `command`'s arguments and the bootstrap `json`.
fn spawn(
    program: &Path,
    command: &BootstrapCommand,
    json: &str,
) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(program);
    // AL-1: the child sets its own parent-death signal ([`DIE_WITH_ENV`]):
    // a hook run before its exec would make the standard library fork this
    // whole process (its page tables copied, then torn down by the exec, a
    // third of a started proc's CPU), where without one it starts the
    // child with `posix_spawn`, which shares this process's memory until
    // the exec.
    cmd.args(&command.args)
        .env(BOOTSTRAP_ENV, json)
        .env(DIE_WITH_ENV, std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd.spawn()
}

fn start_child(
    command: BootstrapCommand,
    run: Option<PathBuf>,
    fork: bool,
    config: BootstrapConfig,
    here: ProcHere,
    stopped: mpsc::UnboundedSender<MeshEvent>,
    cleanup: Cleanup,
) -> BoxFuture<Result<Allocated, AllocError>> {
    let children = cleanup.children.clone();
    Box::pin(async move {
        let name = config.name.clone();
        let started = std::time::Instant::now();
        let fail = |what: String| AllocError(format!("proc {name}: {what}"));
        let json = serde_json::to_string(&config).map_err(|e| fail(e.to_string()))?;
        let program = run.as_deref().unwrap_or(&command.program);
        let forked = match fork {
            true => launch_forked(program, &command, &json)
                .await
                .inspect_err(|e| {
                    tracing::debug!(proc = %name, "the fork server did not fork the proc: {e}; starting it")
                })
                .ok(),
            false => None,
        };
        let launched = match forked {
            Some(forked) => Ok(forked),
            None => match &run {
                Some(copy) => match launch_started(copy, &command, &json) {
                    // The copy went, another thread's child still held it
                    // open for writing when it was made, or the cache
                    // directory's file system does not run programs
                    // (`noexec`): the program itself.
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ENOENT | libc::ETXTBSY | libc::EACCES | libc::EPERM)
                        ) =>
                    {
                        tracing::debug!(copy = %copy.display(), "cannot start the copy of the program: {e}");
                        launch_started(&command.program, &command, &json)
                    }
                    launched => launched,
                },
                None => launch_started(&command.program, &command, &json),
            },
        };
        let (mut child, pid, stdin, stdout) = launched
            .map_err(|e| fail(format!("cannot start {}: {e}", command.program.display())))?;
        let stdin = Some(stdin);
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(BOOTSTRAP_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(id) = line.strip_prefix(READY) {
                    return Ok(Some(id.trim().to_string()));
                }
                println!("{line}");
            }
            Ok::<_, std::io::Error>(None)
        })
        .await;
        let proc: ProcId = match ready {
            Ok(Ok(Some(id))) => id
                .parse()
                .map_err(|e| fail(format!("reported a bad proc id `{id}`: {e}")))?,
            Ok(Ok(None)) | Ok(Err(_)) => {
                let status = child.wait().await.map(describe_exit);
                return Err(fail(format!(
                    "ended before it was ready ({})",
                    status.unwrap_or_else(|e| e.to_string())
                )));
            }
            Err(_) => {
                child.start_kill();
                return Err(fail(format!(
                    "not ready within {} s",
                    BOOTSTRAP_TIMEOUT.as_secs()
                )));
            }
        };
        tracing::info!(
            %proc,
            pid,
            bootstrap_ms = started.elapsed().as_secs_f64() * 1e3,
            "proc started"
        );
        let (kill_tx, kill_rx) = oneshot::channel();
        children.lock().push(ChildEntry {
            proc: proc.clone(),
            pid,
            kill: Some(kill_tx),
        });
        // What the child's actors print goes to this process's stdout.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                println!("{line}");
            }
        });
        let watched = proc.clone();
        tokio::spawn(async move {
            let mut stdin = stdin; // AL-1: closing it tells the child to exit.
            let _here = here;
            let status = tokio::select! {
                status = child.wait() => status,
                _ = kill_rx => {
                    drop(stdin.take());
                    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
                        Ok(status) => status,
                        Err(_) => {
                            child.start_kill();
                            child.wait().await
                        }
                    }
                }
            };
            let reason = status
                .map(describe_exit)
                .unwrap_or_else(|e| format!("lost: {e}"));
            let last = {
                let mut children = children.lock();
                children.retain(|c| c.proc != watched);
                children.is_empty()
            };
            if last
                && cleanup.stopped.load(Ordering::Relaxed)
                && let Some(dir) = &cleanup.socket_dir
            {
                std::fs::remove_dir_all(dir).ok();
            }
            // AL-2: reported once.
            let _ = stopped.send(MeshEvent::ProcStopped {
                proc: watched,
                reason,
            });
        });
        Ok(Allocated {
            proc,
            host: 0,
            pid: Some(pid),
        })
    })
}

/// Makes the allocator keep freed memory for reuse rather than hand it
/// back to the kernel: with glibc, blocks up to 32 MiB come from its heaps
/// and up to 1 GiB of free memory stays mapped. Messages of several MiB
/// (tensor chunks, their frames and replies) are allocated and freed many
/// times a second; returning each to the kernel makes every next one fault
/// its pages in afresh, which cost more than copying them (see
/// docs/mesh.md, "Bulk messages"). [`bootstrap_main`] calls it in every
/// child proc; a controller that moves bulk data should call it at start.
/// Settings given in `GLIBC_TUNABLES` are left alone; on other C
/// libraries this does nothing.
pub fn keep_freed_memory() {
    if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // The largest block served from the heaps (glibc's ceiling for
        // it), and the free memory a heap keeps before it is trimmed.
        const MMAP_THRESHOLD: libc::c_int = 32 << 20;
        const TRIM_THRESHOLD: libc::c_int = 1 << 30;
        // SAFETY: mallopt only changes allocator parameters; both values
        // are within glibc's ranges (a refused one is ignored).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        }
    }
}

/// Makes the calling thread, and the threads it starts from now on,
/// `SCHED_BATCH` on Linux: a thread of this kind that wakes does not
/// preempt the one running on its CPU, but waits for it to block or to
/// use up its slice. [`bootstrap_main`] does it in a proc started where
/// procs outnumber cores: there the procs a cast wakes preempted the
/// controller still writing it, and a 16-proc gather on 2 vCPUs switched
/// the controller 2.2 times instead of 1.2 and took 4 - 5 % longer
/// (docs/benchmarks.md, "Issue 19", 2026-12-06 evening). Elsewhere, and
/// where the kernel refuses, nothing changes.
pub fn run_as_batch() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler(2) on the calling thread (pid 0) with
        // a valid parameter block that outlives the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "SCHED_BATCH refused; the proc keeps its policy"
            );
        }
    }
}

/// The body of a child proc: reads its [`BootstrapConfig`], serves a mesh
/// proc whose actors come from `registry`, says it is ready, and runs until
/// its parent goes away (AL-1). Returns only on error. It keeps freed
/// memory for reuse ([`keep_freed_memory`]).
pub async fn bootstrap_main(
    make_registry: impl FnOnce(&BootstrapConfig) -> Registry,
) -> anyhow::Result<()> {
    keep_freed_memory();
    let text = std::env::var(BOOTSTRAP_ENV).map_err(|_| {
        anyhow::anyhow!(
            "{BOOTSTRAP_ENV} is not set; this command is started by monarch-host itself"
        )
    })?;
    let config: BootstrapConfig = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{BOOTSTRAP_ENV} is not valid: {e}"))?;
    // AL-1: a started proc dies with the process that started it, even one
    // killed outright; asked for here, after the exec, so a parent that
    // ended before is caught by its pid. (A forked proc's server asked for
    // it before the fork, and does not pass this on.)
    if let Some(parent) = std::env::var_os(DIE_WITH_ENV) {
        let parent: Option<libc::pid_t> = parent.to_str().and_then(|p| p.parse().ok());
        // SAFETY: prctl(2) with plain integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
            anyhow::bail!(
                "cannot ask to die with the parent: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: getppid has no preconditions.
        if Some(unsafe { libc::getppid() }) != parent {
            anyhow::bail!("the parent exited before this proc started");
        }
    }
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == 1 {
        anyhow::bail!("the parent exited before this proc started");
    }
    if config.batch {
        run_as_batch();
    }
    let addr: ChannelAddr = match config.listen.strip_prefix("unix:") {
        Some(dir) => format!(
            "unix:{}",
            Path::new(dir)
                .join(format!("{}.sock", config.name))
                .display()
        )
        .parse()?,
        None => config.listen.parse()?,
    };
    let events: hyperactor::PortId = config.events.parse()?;
    if let Some(dir) = &config.tls_dir {
        hyperactor::channel::tls::install(hyperactor::channel::tls::TlsConfig::from_dir(dir)?)?;
    }
    let mut registry = make_registry(&config);
    registry.owns_process();
    let registry = Arc::new(registry);
    let proc_config = hyperactor::ProcConfig {
        busy_poll: Duration::from_micros(config.busy_poll_us),
        cluster_token: config
            .cluster_token
            .as_deref()
            .and_then(hyperactor::ClusterToken::new),
        ..hyperactor::ProcConfig::default()
    };
    let proc = Proc::serve_with_config(&config.name, addr, proc_config).await?;
    start_mesh_proc(&proc, registry, PortRef::attest(events))?;
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{READY}{}", proc.id())?;
        stdout.flush()?;
    }
    // AL-1: the parent holds the other end of stdin.
    let _ = hyperactor::testing::stdin_closed().await;
    if let Some(path) = proc.id().addr().unix_path() {
        std::fs::remove_file(path).ok();
    }
    // What was written is flushed; then the process ends without the C
    // library's exit handlers (the allocator's statistics, the loader's
    // destructors), which have nothing to keep and cost a fresh proc a few
    // percent of its CPU (AL-6).
    {
        use std::io::Write;
        std::io::stdout().flush().ok();
        std::io::stderr().flush().ok();
    }
    // SAFETY: _exit(2) ends the process; nothing runs after it.
    unsafe { libc::_exit(0) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::MeshClient;

    /// What an allocator that starts no proc is made of.
    fn idle_parts() -> (BootstrapCommand, Arc<Registry>) {
        let command = BootstrapCommand {
            program: "/bin/true".into(),
            args: vec![],
        };
        let registry = crate::testing::echo_registry(std::env::temp_dir().join("mesh-test-blobs"));
        (command, Arc::new(registry))
    }

    /// AL-8: the socket root is the one the environment names, else the
    /// per-user runtime directory, else an in-memory file system, else
    /// the temporary directory; a relative or missing directory is passed
    /// over.
    #[test]
    fn sockets_go_where_the_environment_says_else_in_memory_else_in_tmp() {
        let existing = std::env::temp_dir();
        let env = |pairs: Vec<(&'static str, std::ffi::OsString)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
            }
        };
        let tmp = std::env::temp_dir();
        let named = env(vec![
            (SOCKET_DIR_ENV, "/somewhere/else".into()),
            ("XDG_RUNTIME_DIR", existing.clone().into()),
        ]);
        assert_eq!(
            socket_root_from(named, Path::new("/proc")),
            PathBuf::from("/somewhere/else")
        );
        let runtime = env(vec![
            (SOCKET_DIR_ENV, "relative/dir".into()),
            ("XDG_RUNTIME_DIR", existing.clone().into()),
        ]);
        assert_eq!(socket_root_from(runtime, Path::new("/proc")), existing);
        let missing = env(vec![("XDG_RUNTIME_DIR", "/no/such/runtime/dir".into())]);
        assert_eq!(socket_root_from(missing, Path::new("/no/such/shm")), tmp);
        // /proc is no tmpfs: sockets cannot go there.
        assert_eq!(socket_root_from(env(vec![]), Path::new("/proc")), tmp);
        if in_memory_and_writable(Path::new("/dev/shm")) {
            assert_eq!(
                socket_root_from(env(vec![]), Path::new("/dev/shm")),
                PathBuf::from("/dev/shm")
            );
        }
    }

    /// AL-8: an allocator's socket directory is under the socket root,
    /// only its owner may enter it, and it goes with the allocator.
    #[test]
    fn the_socket_directory_is_private_and_removed_with_its_allocator() {
        use std::os::unix::fs::PermissionsExt;
        let (command, registry) = idle_parts();
        let allocator = LocalAllocator::new(command, registry).unwrap();
        let dir = allocator.socket_dir.clone();
        assert_eq!(dir.parent(), Some(socket_root().as_path()));
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        drop(allocator);
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }

    /// AL-8: the names of an allocator's leftovers, and no others.
    #[test]
    fn leftovers_are_known_by_their_names_only() {
        assert_eq!(leftover_owner("monarch-123-4"), Some((123, false)));
        assert_eq!(leftover_owner("monarch-run123-4.sock"), Some((123, true)));
        assert_eq!(leftover_owner("monarch-serve-77-0.sock"), Some((77, true)));
        for other in [
            "monarch-bench-760",
            "monarch-host",
            "monarch-123-4.sock",
            "monarch-123-",
            "monarch--4",
            "monarch-run123.sock",
            "monarch-demo-12",
            "something-else",
        ] {
            assert_eq!(leftover_owner(other), None, "{other}");
        }
    }

    /// AL-8: a sweep removes the socket directories no allocator holds
    /// and the controller sockets of processes that are gone, and keeps
    /// a live allocator's directory, a live process's socket, anything
    /// younger than asked, and what is not an allocator's.
    #[test]
    fn a_sweep_removes_what_ended_processes_left_and_keeps_the_rest() {
        let root = std::env::temp_dir().join(format!("sweep-test-{}", std::process::id()));
        std::fs::remove_dir_all(&root).ok();
        std::fs::create_dir_all(&root).unwrap();
        let dead = {
            let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
            let pid = child.id();
            child.wait().unwrap();
            pid
        };
        // SAFETY: getppid has no preconditions.
        let alive = unsafe { libc::getppid() } as u32;
        let (command, registry) = idle_parts();
        let live = LocalAllocator::new_under(command, registry, &root).unwrap();
        // A directory whose allocator ended: its lock is free.
        let unlocked = root.join(format!("monarch-{alive}-90"));
        std::fs::create_dir(&unlocked).unwrap();
        drop(lock_socket_dir(&unlocked, true).unwrap());
        std::fs::write(unlocked.join("proc0.sock"), b"").unwrap();
        // Directories from before locks: gone with their process or not.
        let old_dead = root.join(format!("monarch-{dead}-91"));
        let old_alive = root.join(format!("monarch-{alive}-92"));
        std::fs::create_dir(&old_dead).unwrap();
        std::fs::create_dir(&old_alive).unwrap();
        // Controller sockets: nobody listens on either.
        let socket_dead = root.join(format!("monarch-run{dead}-0.sock"));
        let socket_alive = root.join(format!("monarch-serve-{alive}-0.sock"));
        drop(std::os::unix::net::UnixListener::bind(&socket_dead).unwrap());
        drop(std::os::unix::net::UnixListener::bind(&socket_alive).unwrap());
        let unrelated = root.join(format!("monarch-bench-{dead}"));
        std::fs::create_dir(&unrelated).unwrap();

        assert_eq!(
            sweep_stale(&root, Duration::from_secs(3600)),
            0,
            "nothing is old enough"
        );
        assert_eq!(sweep_stale(&root, Duration::ZERO), 3);
        assert!(!unlocked.exists() && !old_dead.exists() && !socket_dead.exists());
        assert!(
            live.socket_dir.exists(),
            "a live allocator's directory stays"
        );
        assert!(old_alive.exists() && socket_alive.exists() && unrelated.exists());
        drop(live);
        std::fs::remove_dir_all(&root).ok();
    }

    /// AL-8: an allocator whose procs listen on TCP keeps no socket
    /// directory.
    #[test]
    fn an_allocator_on_tcp_keeps_no_socket_directory() {
        let (command, registry) = idle_parts();
        let allocator = LocalAllocator::new(command, registry)
            .unwrap()
            .listen_tcp(std::net::Ipv4Addr::LOCALHOST.into());
        assert!(
            !allocator.socket_dir.exists(),
            "{} is left",
            allocator.socket_dir.display()
        );
    }

    /// AL-8: a socket root too long for the procs' sockets is refused
    /// when the allocator is made, naming the variable that moves it.
    #[test]
    fn a_socket_root_too_long_for_unix_sockets_is_refused_up_front() {
        let (command, registry) = idle_parts();
        let long = std::env::temp_dir().join("x".repeat(80));
        let err = LocalAllocator::new_under(command, registry, &long)
            .err()
            .expect("a directory too long for sockets");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        let text = err.to_string();
        assert!(
            text.contains(SOCKET_DIR_ENV) && text.contains("107"),
            "{text}"
        );
        assert!(!long.exists(), "nothing is made for a refused allocator");
    }

    /// The hook of `reporting_procs_up` hears of each proc as it comes
    /// up, and only for the allocation it wraps.
    #[tokio::test]
    async fn each_proc_is_reported_up_within_the_wrapped_allocation_only() {
        let registry = crate::testing::echo_registry(std::env::temp_dir().join("mesh-test-blobs"));
        let allocator = Arc::new(InProcessAllocator::new(Arc::new(registry)));
        let addr = format!("local:procs-up-test-{}", std::process::id())
            .parse()
            .unwrap();
        let client = MeshClient::new(addr, allocator, Arc::new(|_: &str| {}))
            .await
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hook = {
            let seen = seen.clone();
            Arc::new(move |count: usize| seen.lock().push(count))
        };
        let procs = reporting_procs_up(hook, client.spawn_procs(3))
            .await
            .unwrap();
        assert_eq!(procs.len(), 3);
        assert_eq!(*seen.lock(), vec![1, 1, 1]);
        client.spawn_procs(2).await.unwrap();
        assert_eq!(
            seen.lock().len(),
            3,
            "a request outside the scope is not reported"
        );
    }
}
