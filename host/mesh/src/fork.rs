//! The fork server: child procs forked from one started process instead of
//! each started from the program (AL-5 of [`crate::alloc`]).
//!
//! Starting a proc as a new process pays for its `execve`, the dynamic
//! loader's relocations of a large binary, and the C library's and Rust's
//! start-up (which on a VM traps to the hypervisor for `cpuid`), every
//! time. A [`LocalAllocator`](crate::alloc::LocalAllocator) with its fork
//! server on starts its bootstrap command once more, as a fork server
//! (the command's process with [`FORK_SERVER_ENV`] set), and asks it for
//! each proc; the server forks, and the child carries on into the
//! bootstrap command's body as a started proc would.
//!
//! ```text
//! allocator process                      fork server (single-threaded)
//!   fork request: env, cwd  ---------->  fork()
//!   + stdin, stdout, stderr (fds)          child: stdio, env, cwd,
//!   <----------  forked: pid                      parent-death signal,
//!   <----------  exited: pid, status, CPU         returns to bootstrap
//! ```
//!
//! - FS-1: a forked proc is set up as a started one: its stdin and stdout
//!   are the allocator's pipes, its stderr the allocator's, its environment
//!   and working directory the allocator's at the request; it dies with the
//!   server (a parent-death signal), which dies with the allocator's
//!   process (its own parent-death signal, and its control socket's end).
//! - FS-2: the server reaps every child it forked and reports its wait
//!   status and CPU time, in the order they end; a child's fork is
//!   reported before its end.
//! - FS-3: a fork the server cannot make or does not answer within
//!   [`FORK_TIMEOUT`] is the allocator's to start itself (it then starts
//!   the program as before); a server that ended is started again for the
//!   next proc. Its children's waits end with "the fork server ended".
//! - FS-4: the server must fork while it has one thread:
//!   [`serve_forks`] runs first in the bootstrap command, before anything
//!   that could start a thread.
//! - FS-5: the server's command line reads `NAME fork-server` (the
//!   program's file name), and its children's the bootstrap command's own
//!   (`PROGRAM bootstrap`), so that
//!   whoever looks for a proc's process by its command line finds procs
//!   only.
//! - FS-6: an allocator that stores a blob tells its server
//!   ([`ForkServer::preload`]), which hands it to the command's `preload`
//!   ([`serve_forks_prepared`]) before it reads the next request: the
//!   procs it forks after that inherit what `preload` made of it (AL-7 of
//!   [`crate::alloc`]). A preload is not answered; one that fails or
//!   panics costs the server nothing but the time.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The environment variable that makes a bootstrap command a fork server.
pub const FORK_SERVER_ENV: &str = "MONARCH_FORK_SERVER";

/// How long a fork may take before the allocator starts the proc itself.
pub const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest fork request: its environment and working directory.
const MAX_REQUEST: usize = 128 << 10;

/// Request kinds, allocator to server: the first byte of each.
const FORK: u8 = 1;
const PRELOAD: u8 = 2;

/// Reply tags, server to allocator.
const FORKED: u8 = 1;
const FORK_FAILED: u8 = 2;
const EXITED: u8 = 3;

/// A reply's size: a tag and three 8-byte fields.
const REPLY: usize = 25;

/// Runs the fork server if this process was started as one
/// ([`FORK_SERVER_ENV`]), and returns at once otherwise. In a fork server
/// it returns only in each forked child, set up as a started proc (FS-1),
/// which goes on into the bootstrap command's body; the server itself
/// exits when its allocator's process goes away. Call it first in the
/// bootstrap command, before anything starts a thread (FS-4).
pub fn serve_forks() {
    serve_forks_prepared(|| {}, |_, _| {});
}

/// [`serve_forks`], where a fork server first runs `prepare`, once, before
/// it forks: what every proc would otherwise make for itself (an engine,
/// say), made once and inherited by each child (AL-6); and runs
/// `preload(path, sha256)` for each blob its allocator stores (FS-6), so
/// that the procs forked after it inherit what it makes of the blob (the
/// program loaded, AL-7). Both run only in a fork server, and must start
/// no thread (FS-4).
pub fn serve_forks_prepared(prepare: impl FnOnce(), preload: impl FnMut(&Path, &str)) {
    if std::env::var_os(FORK_SERVER_ENV).is_none() {
        return;
    }
    if let Err(e) = serve(prepare, preload) {
        eprintln!("monarch fork server: {e}");
        std::process::exit(1);
    }
}

/// The server's loop; returns `Ok` only in a forked child.
fn serve(prepare: impl FnOnce(), mut preload: impl FnMut(&Path, &str)) -> io::Result<()> {
    // The control socket is stdin.
    let control: RawFd = 0;
    // SAFETY: plain C calls on a signal set this function owns; SIGCHLD is
    // read from a signalfd instead of a handler.
    let (children, unblocked) = unsafe {
        let mut chld: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut chld);
        libc::sigaddset(&mut chld, libc::SIGCHLD);
        check(libc::sigprocmask(libc::SIG_BLOCK, &chld, &mut before))?;
        let fd = check(libc::signalfd(
            -1,
            &chld,
            libc::SFD_CLOEXEC | libc::SFD_NONBLOCK,
        ))?;
        (OwnedFd::from_raw_fd(fd), before)
    };
    let server = std::process::id() as libc::pid_t;
    let title = Title::of_this_process();
    if let Some(title) = &title {
        title.set("fork-server");
    }
    // Requests wait in the socket meanwhile. The binary's path is read
    // here once, for every proc (a read of `/proc/self/exe` in each would
    // leave the server dentries to clear as it reaps them).
    let _ = crate::exe::current_exe();
    prepare();
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let mut polled = [
            libc::pollfd {
                fd: control,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: children.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll(2) on two pollfds this frame owns.
        if unsafe { libc::poll(polled.as_mut_ptr(), 2, -1) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if polled[1].revents != 0 {
            drain(&children);
            reap(control)?;
        }
        if polled[0].revents == 0 {
            continue;
        }
        let (len, fds) = recv_with_fds(control, &mut buf)?;
        if len == 0 {
            // The allocator's process went away; the children follow (FS-1).
            std::process::exit(0);
        }
        let asked = match buf[0] {
            FORK => Request::decode(&buf[1..len]),
            PRELOAD => {
                if let Some((path, sha256)) = decode_preload(&buf[1..len]) {
                    // A preload that panics leaves the server as it was:
                    // its procs load the program themselves.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        preload(&path, &sha256)
                    }));
                }
                continue;
            }
            _ => None,
        };
        let Some((id, request)) = asked else {
            eprintln!("monarch fork server: a request it cannot read ({len} bytes); ignored");
            continue;
        };
        let [stdin, stdout, stderr]: [OwnedFd; 3] = match fds.try_into() {
            Ok(fds) => fds,
            Err(_) => {
                reply(control, FORK_FAILED, id, libc::EINVAL as u64, 0)?;
                continue;
            }
        };
        // SAFETY: this process has one thread (FS-4), so the child may go
        // on running Rust code after the fork.
        match unsafe { libc::fork() } {
            -1 => {
                let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
                reply(control, FORK_FAILED, id, errno as u64, 0)?;
            }
            0 => {
                drop(children);
                if let Some(title) = &title {
                    title.restore();
                }
                return become_child(server, unblocked, [stdin, stdout, stderr], request).map_err(
                    |e| io::Error::new(e.kind(), format!("setting up a forked proc: {e}")),
                );
            }
            pid => reply(control, FORKED, id, pid as u64, 0)?,
        }
    }
}

/// This process's command line, where the kernel reads
/// `/proc/PID/cmdline` from (FS-5).
struct Title {
    /// Its first byte.
    start: usize,
    /// The bytes there at start.
    original: Vec<u8>,
}

impl Title {
    /// This process's command line, from the `arg_start` and `arg_end` of
    /// `/proc/self/stat` (fields 48 and 49); None where they cannot be read.
    fn of_this_process() -> Option<Title> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The fields after the command's name, which ends at the last `)`:
        // the third field is the first of them.
        let fields: Vec<&str> = stat
            .get(stat.rfind(')')? + 1..)?
            .split_whitespace()
            .collect();
        let start: usize = fields.get(48 - 3)?.parse().ok()?;
        let end: usize = fields.get(49 - 3)?.parse().ok()?;
        let len = end.checked_sub(start).filter(|len| *len > 1)?;
        // SAFETY: [arg_start, arg_end) is this process's argument area on
        // its stack, mapped for as long as it lives; it is read here once.
        let original = unsafe { std::slice::from_raw_parts(start as *const u8, len) }.to_vec();
        Some(Title { start, original })
    }

    /// The program's file name and `what`: `monarch-host fork-server`.
    fn set(&self, what: &str) {
        let program = self.original.split(|b| *b == 0).next().unwrap_or_default();
        let name = program.rsplit(|b| *b == b'/').next().unwrap_or(program);
        let mut title = name.to_vec();
        title.push(b' ');
        title.extend_from_slice(what.as_bytes());
        let mut bytes = vec![0u8; self.original.len()];
        let len = title.len().min(bytes.len() - 1);
        bytes[..len].copy_from_slice(&title[..len]);
        self.write(&bytes);
    }

    /// Puts the arguments back as they were.
    fn restore(&self) {
        self.write(&self.original);
    }

    fn write(&self, bytes: &[u8]) {
        // SAFETY: the same area as in `of_this_process`, of the same
        // length; nothing holds a reference into it (the standard library
        // reads it afresh when asked for the arguments, and a child puts
        // it back before anything asks).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.start as *mut u8, bytes.len())
        };
    }
}

unsafe extern "C" {
    /// The C library's environment: a null-terminated array of
    /// `KEY=VALUE` strings.
    static mut environ: *mut *mut libc::c_char;
}

/// Sets up a forked child as a started proc (FS-1).
fn become_child(
    server: libc::pid_t,
    unblocked: libc::sigset_t,
    stdio: [OwnedFd; 3],
    request: Request,
) -> io::Result<()> {
    // SAFETY: plain C calls on descriptors this child owns; dup2 onto 0
    // also closes the control socket, which the child must not hold.
    unsafe {
        check(libc::sigprocmask(
            libc::SIG_SETMASK,
            &unblocked,
            std::ptr::null_mut(),
        ))?;
        for (fd, onto) in stdio.iter().zip(0..) {
            check(libc::dup2(fd.as_raw_fd(), onto))?;
        }
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
        if libc::getppid() != server {
            // The server died between the fork and the signal's setting.
            libc::_exit(1);
        }
    }
    drop(stdio);
    // The request's environment becomes the child's whole: one array,
    // made here and never freed, instead of a `setenv` for each entry (each
    // scans the environment and copies it, 3 % of a forked proc's CPU).
    // Entries without a name, or with a NUL, are left out.
    let entries: Vec<*mut libc::c_char> = request
        .env
        .iter()
        .filter(|pair| pair.as_bytes().iter().skip(1).any(|b| *b == b'='))
        .filter_map(|pair| std::ffi::CString::new(pair.as_bytes()).ok())
        .map(std::ffi::CString::into_raw)
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect();
    // SAFETY: this child has one thread, so nothing reads `environ`
    // meanwhile; the array and its strings are leaked, so they live as
    // long as the process, and the C library copies the array before it
    // changes it (`setenv` of a later `std::env::set_var`).
    unsafe { environ = entries.leak().as_mut_ptr() };
    // A directory removed since is the server's to keep, as a started
    // child would keep its parent's.
    let _ = std::env::set_current_dir(&request.cwd);
    Ok(())
}

/// Empties the signalfd of its pending SIGCHLDs.
fn drain(signals: &OwnedFd) {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    // SAFETY: read(2) into a buffer of the size it is given.
    while unsafe { libc::read(signals.as_raw_fd(), info.as_mut_ptr().cast(), info.len()) } > 0 {}
}

/// Reaps every child that has ended and reports each (FS-2).
fn reap(control: RawFd) -> io::Result<()> {
    loop {
        let mut status = 0;
        // SAFETY: both are plain C values the kernel fills in.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4(2) with pointers valid for the call.
        let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
        if pid <= 0 {
            return Ok(());
        }
        let cpu = crate::alloc::rusage_cpu(&usage).as_nanos() as u64;
        reply(control, EXITED, pid as u64, status as u32 as u64, cpu)?;
    }
}

fn reply(control: RawFd, tag: u8, a: u64, b: u64, c: u64) -> io::Result<()> {
    let mut out = [0u8; REPLY];
    out[0] = tag;
    out[1..9].copy_from_slice(&a.to_le_bytes());
    out[9..17].copy_from_slice(&b.to_le_bytes());
    out[17..25].copy_from_slice(&c.to_le_bytes());
    // SAFETY: send(2) of a buffer this frame owns.
    let sent = unsafe { libc::send(control, out.as_ptr().cast(), out.len(), libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(result)
}

/// A fork request: the child's environment and working directory.
#[derive(Debug, PartialEq)]
struct Request {
    cwd: PathBuf,
    /// `KEY=VALUE` entries.
    env: Vec<OsString>,
}

impl Request {
    /// The allocator's environment and working directory now, with
    /// `extra` added.
    fn here(extra: &[(&str, &str)]) -> io::Result<Self> {
        let mut env: Vec<OsString> = std::env::vars_os()
            .filter(|(k, _)| {
                k != FORK_SERVER_ENV
                    && k != crate::alloc::DIE_WITH_ENV
                    && !extra.iter().any(|(e, _)| k.as_bytes() == e.as_bytes())
            })
            .map(|(k, v)| {
                let mut pair = k;
                pair.push("=");
                pair.push(v);
                pair
            })
            .collect();
        env.extend(
            extra
                .iter()
                .map(|(k, v)| OsString::from(format!("{k}={v}"))),
        );
        Ok(Request {
            cwd: std::env::current_dir()?,
            env,
        })
    }

    /// `id`, then each string as a 4-byte length and its bytes: the
    /// working directory, then the environment.
    fn encode(&self, id: u64) -> Vec<u8> {
        let mut out = id.to_le_bytes().to_vec();
        let strings =
            std::iter::once(self.cwd.as_os_str()).chain(self.env.iter().map(|e| e.as_os_str()));
        for s in strings {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        out
    }

    fn decode(mut bytes: &[u8]) -> Option<(u64, Self)> {
        let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        bytes = &bytes[8..];
        let mut strings = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
            strings.push(OsString::from_vec(bytes.get(4..4 + len)?.to_vec()));
            bytes = &bytes[4 + len..];
        }
        let mut strings = strings.into_iter();
        let cwd = PathBuf::from(strings.next()?);
        Some((
            id,
            Request {
                cwd,
                env: strings.collect(),
            },
        ))
    }
}

/// Receives one message and the descriptors it carries (close-on-exec).
fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    const MAX_FDS: usize = 4;
    let mut control = [0u64; 16]; // aligned room for one cmsg of MAX_FDS fds
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; its pointers are set below to
    // buffers that outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure computation.
    msg.msg_controllen =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let len = loop {
        // SAFETY: recvmsg(2) with the header above.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* walk stays within `msg.msg_control`, as the
    // kernel filled it; each SCM_RIGHTS descriptor is new and ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::other(
            "a fork request larger than the server reads",
        ));
    }
    Ok((len, fds))
}

/// Sends one message with `fds`.
fn send_with_fds(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: as in `recv_with_fds`; the cmsg is written within
    // `control`, which CMSG_SPACE of these fds fits.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as usize;
        let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
        for (i, fd) in fds.iter().enumerate() {
            data.add(i).write_unaligned(*fd);
        }
        loop {
            if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// How a forked child ended, as its server reported it (FS-2).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForkedExit {
    /// The wait status.
    pub status: i32,
    /// Its CPU time, user and system, with its own children's.
    pub cpu: Duration,
}

/// A child the server forked.
pub(crate) struct Forked {
    pub pid: u32,
    /// Its end, or an error when the server ended first.
    pub exit: oneshot::Receiver<ForkedExit>,
}

type Answer = io::Result<Forked>;

/// This process's side of one fork server.
pub(crate) struct ForkServer {
    control: OwnedFd,
    /// Serialises requests, which carry descriptors.
    sending: Mutex<()>,
    next: AtomicU64,
    /// Requests not yet answered, by id.
    asked: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    /// Forked children not yet ended, by pid.
    children: Mutex<HashMap<u32, oneshot::Sender<ForkedExit>>>,
    alive: AtomicBool,
    /// Whether it has forked a child: a server that ends before it forks
    /// any is a command that does not serve forks, and is not started
    /// again.
    forked_any: AtomicBool,
    /// The server's process.
    pid: std::sync::OnceLock<u32>,
}

/// The CPU time this process's live fork servers have used themselves
/// (their forks and reaping; their children's is counted as they end, in
/// [`crate::alloc::ended_procs_cpu`]), from `/proc/PID/schedstat`: a server
/// has one thread.
pub fn servers_cpu() -> Duration {
    let pids: Vec<u32> = SERVERS
        .lock()
        .iter()
        .filter(|(_, _, s)| s.alive.load(Ordering::Acquire))
        .filter_map(|(_, _, s)| s.pid.get().copied())
        .collect();
    pids.into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .sum()
}

/// A bootstrap command's program and arguments, and its fork server.
type Served = (PathBuf, Vec<String>, Arc<ForkServer>);

/// This process's fork servers, one for each bootstrap command.
static SERVERS: Mutex<Vec<Served>> = Mutex::new(Vec::new());

impl ForkServer {
    /// The live fork server of `program args`, started now if there is none
    /// (or the last one ended).
    pub(crate) fn of(program: &Path, args: &[String]) -> io::Result<Arc<ForkServer>> {
        let mut servers = SERVERS.lock();
        servers.retain(|(_, _, s)| {
            s.alive.load(Ordering::Acquire) || !s.forked_any.load(Ordering::Acquire)
        });
        if let Some((_, _, server)) = servers.iter().find(|(p, a, _)| p == program && a == args) {
            if !server.alive.load(Ordering::Acquire) {
                return Err(io::Error::other(format!(
                    "{} {} ended without forking: it does not serve forks (crate::fork::serve_forks)",
                    program.display(),
                    args.join(" ")
                )));
            }
            return Ok(server.clone());
        }
        let server = ForkServer::start(program, args)?;
        servers.push((program.to_path_buf(), args.to_vec(), server.clone()));
        Ok(server)
    }

    /// Starts the server from a thread of its own, which then reads its
    /// replies until it ends: a parent-death signal follows the thread
    /// that started a process, so the server lives as long as this thread,
    /// which lives as long as the server (FS-1).
    fn start(program: &Path, args: &[String]) -> io::Result<Arc<ForkServer>> {
        let (ours, theirs) = seqpacket_pair()?;
        let reader = ours.try_clone()?;
        let server = Arc::new(ForkServer {
            control: ours,
            sending: Mutex::new(()),
            next: AtomicU64::new(0),
            asked: Mutex::default(),
            children: Mutex::default(),
            alive: AtomicBool::new(true),
            forked_any: AtomicBool::new(false),
            pid: std::sync::OnceLock::new(),
        });
        let mut command = Command::new(program);
        command
            .args(args)
            .env(FORK_SERVER_ENV, "1")
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (started_tx, started) = std::sync::mpsc::channel();
        let reading = server.clone();
        std::thread::Builder::new()
            .name("fork-server".into())
            .spawn(move || {
                let child = command.spawn();
                let _ = started_tx.send(
                    child
                        .as_ref()
                        .map(|c| c.id())
                        .map_err(|e| io::Error::new(e.kind(), e.to_string())),
                );
                drop(command);
                if let Ok(mut child) = child {
                    reading.read_replies(&reader);
                    let _ = child.kill();
                    let _ = child.wait();
                }
            })?;
        let pid = started
            .recv()
            .map_err(|_| io::Error::other("the fork server's thread ended"))??;
        let _ = server.pid.set(pid);
        tracing::debug!(pid, program = %program.display(), "fork server started");
        Ok(server)
    }

    /// Reads the server's replies until it ends, then fails whatever waits.
    fn read_replies(&self, reader: &OwnedFd) {
        let mut buf = [0u8; REPLY];
        loop {
            // SAFETY: recv(2) into a buffer this frame owns.
            let n = unsafe { libc::recv(reader.as_raw_fd(), buf.as_mut_ptr().cast(), REPLY, 0) };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n != REPLY as isize {
                break;
            }
            let field = |i: usize| {
                u64::from_le_bytes(buf[1 + 8 * i..9 + 8 * i].try_into().unwrap_or_default())
            };
            match buf[0] {
                FORKED => {
                    let (id, pid) = (field(0), field(1) as u32);
                    let (tx, exit) = oneshot::channel();
                    self.forked_any.store(true, Ordering::Release);
                    self.children.lock().insert(pid, tx);
                    if let Some(asked) = self.asked.lock().remove(&id) {
                        let _ = asked.send(Ok(Forked { pid, exit }));
                    }
                }
                FORK_FAILED => {
                    if let Some(asked) = self.asked.lock().remove(&field(0)) {
                        let _ = asked.send(Err(io::Error::from_raw_os_error(field(1) as i32)));
                    }
                }
                EXITED => {
                    let pid = field(0) as u32;
                    if let Some(child) = self.children.lock().remove(&pid) {
                        let _ = child.send(ForkedExit {
                            status: field(1) as u32 as i32,
                            cpu: Duration::from_nanos(field(2)),
                        });
                    }
                }
                _ => break,
            }
        }
        // FS-3: what waits learns the server ended.
        self.alive.store(false, Ordering::Release);
        self.asked.lock().clear();
        self.children.lock().clear();
    }

    /// Asks for a child whose stdin, stdout and stderr are `stdio`, with
    /// this process's environment and `env`.
    pub(crate) async fn fork(
        self: &Arc<Self>,
        env: &[(&str, &str)],
        stdio: [OwnedFd; 3],
    ) -> io::Result<Forked> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(io::Error::other("the fork server ended"));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut bytes = vec![FORK];
        bytes.extend(Request::here(env)?.encode(id));
        if bytes.len() > MAX_REQUEST {
            return Err(io::Error::other(format!(
                "the environment is too large to send to the fork server ({} bytes)",
                bytes.len()
            )));
        }
        let (tx, answer) = oneshot::channel();
        self.asked.lock().insert(id, tx);
        let server = self.clone();
        // A request of a few KiB; the send may wait for the server to read.
        let sent = tokio::task::spawn_blocking(move || {
            let _one = server.sending.lock();
            let fds = stdio.each_ref().map(|fd| fd.as_raw_fd());
            send_with_fds(server.control.as_raw_fd(), &bytes, &fds)
        })
        .await
        .map_err(|e| io::Error::other(format!("sending a fork request panicked: {e}")))?;
        if let Err(e) = sent {
            self.asked.lock().remove(&id);
            return Err(e);
        }
        match tokio::time::timeout(FORK_TIMEOUT, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(io::Error::other("the fork server ended")),
            Err(_) => {
                self.asked.lock().remove(&id);
                Err(io::Error::other(format!(
                    "the fork server did not answer within {} s",
                    FORK_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

impl ForkServer {
    /// Tells the server that its allocator stored the blob `sha256` at
    /// `path` (FS-6), so that the procs it forks from now on have it
    /// loaded. Blocks while the server's socket is full.
    pub(crate) fn preload(&self, path: &Path, sha256: &str) -> io::Result<()> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(io::Error::other("the fork server ended"));
        }
        let bytes = encode_preload(path, sha256);
        let _one = self.sending.lock();
        loop {
            // SAFETY: send(2) of a buffer this frame owns.
            let sent = unsafe {
                libc::send(
                    self.control.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if sent >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// A preload request: its kind, then the path and the sha256, each as a
/// 4-byte length and its bytes.
fn encode_preload(path: &Path, sha256: &str) -> Vec<u8> {
    let mut out = vec![PRELOAD];
    for s in [path.as_os_str().as_bytes(), sha256.as_bytes()] {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    out
}

/// An [`encode_preload`] after its kind byte; None if cut, or with
/// anything more.
fn decode_preload(mut bytes: &[u8]) -> Option<(PathBuf, String)> {
    let mut strings = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        strings.push(bytes.get(4..4 + len)?.to_vec());
        bytes = &bytes[4 + len..];
    }
    let [path, sha256] = <[Vec<u8>; 2]>::try_from(strings).ok()?;
    Some((
        PathBuf::from(OsString::from_vec(path)),
        String::from_utf8(sha256).ok()?,
    ))
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: socketpair(2) fills two descriptors that become ours.
    unsafe {
        check(libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        ))?;
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// A pipe whose two ends close on exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills two descriptors that become ours.
    unsafe {
        check(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC))?;
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back_as_it_was_written() {
        let request = Request {
            cwd: PathBuf::from("/tmp/x y"),
            env: vec![
                OsString::from("A=1"),
                OsString::from_vec(b"B=\xff=2".to_vec()),
            ],
        };
        let bytes = request.encode(42);
        assert_eq!(Request::decode(&bytes), Some((42, request)));
        assert_eq!(
            Request::decode(&bytes[..bytes.len() - 1]),
            None,
            "a cut request is refused"
        );
        assert_eq!(Request::decode(&bytes[..5]), None);
    }

    #[test]
    fn a_preload_reads_back_as_it_was_written_and_a_cut_one_is_refused() {
        let bytes = encode_preload(Path::new("/blobs/ab.blob"), "ab");
        assert_eq!(bytes[0], PRELOAD);
        assert_eq!(
            decode_preload(&bytes[1..]),
            Some((PathBuf::from("/blobs/ab.blob"), "ab".to_string()))
        );
        assert_eq!(decode_preload(&bytes[1..bytes.len() - 1]), None);
        let mut padded = bytes[1..].to_vec();
        padded.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(decode_preload(&padded), None, "a third string is refused");
        padded.truncate(padded.len() - 2);
        assert_eq!(decode_preload(&padded), None, "and so is a cut length");
    }

    #[test]
    fn the_environment_sent_is_this_process_with_the_extra_entries_replacing_its_own() {
        let request = Request::here(&[("PATH", "/nowhere"), ("MONARCH_X", "1")]).unwrap();
        let paths: Vec<_> = request
            .env
            .iter()
            .filter(|e| e.as_bytes().starts_with(b"PATH="))
            .collect();
        assert_eq!(paths, vec![&OsString::from("PATH=/nowhere")]);
        assert!(request.env.contains(&OsString::from("MONARCH_X=1")));
    }
}
