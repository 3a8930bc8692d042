//! Byte streams for each transport: listening, connecting, and the two halves
//! of a connection.
//!
//! `local:` channels are socket pairs handed to an in-process listener, so all
//! three transports share the same stream code.
//!
//! - TR-1: a connection's socket is registered with the reactor for reading
//!   only; room to write is waited for through a duplicate registered just
//!   for that wait. A process is woken by what it reads, not by its peer
//!   reading what it wrote.
//! - TR-2: a plain read that fills less than its buffer emptied the socket:
//!   the next read waits for the reactor, with no `recv` that can only say
//!   `EAGAIN` (one system call fewer per frame a sleeping peer is woken
//!   for).
//! - TR-3: a busy-polling reader takes its socket off the reactor
//!   ([`ReadHalf::poll_alone`]) and puts it back only when it waits. A
//!   socket on the reactor has the kernel wake the process's sleeping
//!   worker (the one parked in `epoll_wait`) for every frame that arrives
//!   and for every frame the peer reads of ours, though the reader that
//!   polls reads them itself; that sleeping worker then wakes the other
//!   one. Off the reactor, a conversation of two polling readers wakes no
//!   thread at all.
//!
//! With TLS installed (`tls::install`), a TCP connection is a `Conn::Tls`
//! after its handshake: the client's runs in [`connect`], the server's in
//! [`Conn::accept_tls`], which the connection's own task calls (TL-3). Its
//! halves share one rustls session (`tls::Session`); plain connections do
//! not pay for it.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;

use super::ChannelAddr;
use super::tls::{self, TlsConfig};

type LocalRegistry = Mutex<HashMap<String, mpsc::UnboundedSender<UnixStream>>>;

/// In-process listeners by name.
static LOCAL_LISTENERS: LazyLock<LocalRegistry> = LazyLock::new(Default::default);

/// A bound listener of any transport.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, String),
    Local(mpsc::UnboundedReceiver<UnixStream>, String),
}

impl Listener {
    /// Binds `addr`; returns the listener and the address it is reachable at
    /// (a TCP port 0 becomes the port chosen).
    pub(crate) async fn bind(addr: &ChannelAddr) -> io::Result<(Listener, ChannelAddr)> {
        match addr {
            ChannelAddr::Tcp(sock) => {
                let listener = TcpListener::bind(sock).await?;
                let bound = listener.local_addr()?;
                Ok((Listener::Tcp(listener), ChannelAddr::Tcp(bound)))
            }
            ChannelAddr::Unix(path) => {
                remove_stale_socket(path).await?;
                let listener = UnixListener::bind(path)?;
                Ok((Listener::Unix(listener, path.clone()), addr.clone()))
            }
            ChannelAddr::Local(name) => {
                let mut listeners = LOCAL_LISTENERS.lock();
                if listeners.get(name).is_some_and(|tx| !tx.is_closed()) {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("local:{name} is already served in this process"),
                    ));
                }
                let (tx, rx) = mpsc::unbounded_channel();
                listeners.insert(name.clone(), tx);
                Ok((Listener::Local(rx, name.clone()), addr.clone()))
            }
        }
    }

    /// Waits for the next connection.
    pub(crate) async fn accept(&mut self) -> io::Result<Conn> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept().await?;
                stream.set_nodelay(true)?;
                Ok(Conn::Tcp(stream))
            }
            Listener::Unix(listener, _) => Ok(Conn::Unix(listener.accept().await?.0)),
            Listener::Local(rx, _) => {
                rx.recv().await.map(Conn::Unix).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::BrokenPipe, "local listener closed")
                })
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        match self {
            Listener::Tcp(_) => {}
            Listener::Unix(_, path) => {
                let _ = std::fs::remove_file(path);
            }
            Listener::Local(_, name) => {
                let mut listeners = LOCAL_LISTENERS.lock();
                if listeners.get(name).is_some_and(|tx| tx.is_closed()) {
                    listeners.remove(name);
                }
            }
        }
    }
}

/// A socket file left by a process that died is removed; a live one is not.
async fn remove_stale_socket(path: &str) -> io::Result<()> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(());
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("unix:{path} is served by a live process"),
        )),
        Err(_) => std::fs::remove_file(path),
    }
}

/// Opens a connection to `addr`; over TCP, a TLS one (handshake done)
/// when TLS is installed.
pub(crate) async fn connect(addr: &ChannelAddr) -> io::Result<Conn> {
    connect_with(addr, tls::installed()).await
}

/// Opens a connection to `addr`, over TCP with `tls` when given.
pub(crate) async fn connect_with(addr: &ChannelAddr, tls: Option<&TlsConfig>) -> io::Result<Conn> {
    match addr {
        ChannelAddr::Tcp(sock) => {
            let stream = TcpStream::connect(sock).await?;
            stream.set_nodelay(true)?;
            match tls {
                None => Ok(Conn::Tcp(stream)),
                Some(config) => match tls::connect(&stream, config).await {
                    Ok(session) => Ok(Conn::Tls(stream, Box::new(session))),
                    Err(e) => Err(io::Error::new(e.kind(), format!("{addr}: {e}"))),
                },
            }
        }
        ChannelAddr::Unix(path) => Ok(Conn::Unix(UnixStream::connect(path).await?)),
        ChannelAddr::Local(name) => {
            let (ours, theirs) = UnixStream::pair()?;
            let refused = || {
                io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("no proc serves local:{name} in this process"),
                )
            };
            let listeners = LOCAL_LISTENERS.lock();
            let tx = listeners.get(name).ok_or_else(refused)?;
            tx.send(theirs).map_err(|_| refused())?;
            Ok(Conn::Unix(ours))
        }
    }
}

/// An open connection.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TCP after a TLS handshake.
    Tls(TcpStream, Box<rustls::Connection>),
}

impl Conn {
    /// An accepted TCP connection after the server side of its TLS
    /// handshake when TLS is installed; any other connection as it is.
    /// Call it in the connection's own task, not the accept loop (TL-3):
    /// it waits for the peer, up to `tls::HANDSHAKE_TIMEOUT`.
    pub(crate) async fn accept_tls(self) -> io::Result<Conn> {
        self.accept_tls_with(tls::installed()).await
    }

    /// Like [`Conn::accept_tls`], with `tls` (none: as it is).
    pub(crate) async fn accept_tls_with(self, tls: Option<&TlsConfig>) -> io::Result<Conn> {
        match (self, tls) {
            (Conn::Tcp(stream), Some(config)) => {
                let session = tls::accept(&stream, config).await?;
                Ok(Conn::Tls(stream, Box::new(session)))
            }
            (conn, _) => Ok(conn),
        }
    }

    /// Splits the connection into its halves. Both share the socket; it
    /// closes when both are gone, and the write half shuts the socket down
    /// for writing when it is dropped.
    ///
    /// The read half registers the socket with the reactor for reading
    /// only (TR-1), when a read first waits and again after
    /// [`ReadHalf::poll_alone`] (TR-3): a socket registered for writing too
    /// wakes its process every time the peer reads and frees room, which
    /// on a mesh is once per reply per proc. The write half registers a
    /// duplicate of the socket only while a write waits for room.
    ///
    /// A TLS connection's halves share its session, which also starts a
    /// task that writes ciphertext a write left behind (TL-4).
    pub(crate) fn into_split(self) -> io::Result<(ReadHalf, WriteHalf)> {
        let (fd, tls): (OwnedFd, _) = match self {
            Conn::Tcp(s) => (s.into_std()?.into(), None),
            Conn::Unix(s) => (s.into_std()?.into(), None),
            Conn::Tls(s, session) => (s.into_std()?.into(), Some(session)),
        };
        let fd = Arc::new(fd);
        let tls = tls.map(|session| tls::Session::start(fd.clone(), *session));
        Ok((
            ReadHalf {
                fd: fd.clone(),
                registered: None,
                tls: tls.clone(),
            },
            WriteHalf { fd, tls },
        ))
    }
}

/// A socket shared by the two halves of a connection.
struct SharedFd(Arc<OwnedFd>);

impl AsRawFd for SharedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One non-blocking `recv`.
pub(super) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and the caller
    // keeps `fd` open for the call.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// The reading half of a connection.
pub(crate) struct ReadHalf {
    fd: Arc<OwnedFd>,
    /// The socket's registration with the reactor, for reading only
    /// (TR-1): made by the first read that waits, dropped (taken off the
    /// reactor) by [`ReadHalf::poll_alone`] (TR-3).
    registered: Option<AsyncFd<SharedFd>>,
    tls: Option<Arc<tls::Session>>,
}

impl ReadHalf {
    /// The socket `fd` on the reactor, registered now if `registered`
    /// holds no registration.
    fn registration<'a>(
        fd: &Arc<OwnedFd>,
        registered: &'a mut Option<AsyncFd<SharedFd>>,
    ) -> io::Result<&'a AsyncFd<SharedFd>> {
        if let Some(registration) = registered {
            return Ok(registration);
        }
        // SAFETY: `SharedFd` keeps the socket open (it holds an `Arc` of
        // it) and always answers the same descriptor.
        let registration =
            unsafe { AsyncFd::register_with_interest(SharedFd(fd.clone()), Interest::READABLE)? };
        Ok(registered.insert(registration))
    }

    /// Takes the socket off the reactor until a read waits again (TR-3):
    /// for a reader that polls with [`ReadHalf::recv_now`], so that what
    /// arrives wakes no sleeping thread of this process. Nothing is lost:
    /// the socket's readiness is read afresh when it is registered again.
    pub(crate) fn poll_alone(&mut self) {
        self.registered = None;
    }

    /// Whether the socket is on the reactor now.
    #[cfg(test)]
    pub(crate) fn on_reactor(&self) -> bool {
        self.registered.is_some()
    }

    /// Reads what the socket holds right now with one `recv` system call,
    /// without asking the runtime's reactor first (which only learns of new
    /// bytes when it next polls); `WouldBlock` when nothing is there. For
    /// busy polling. Bytes read here are simply not there for the next
    /// ordinary read, which the reactor handles like any spurious wakeup.
    /// Over TLS, the plaintext that one `recv` of ciphertext yields.
    pub(crate) fn recv_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.tls {
            None => recv(self.fd.as_raw_fd(), buf),
            Some(session) => session.read(buf),
        }
    }

    /// `poll_read` of a TLS connection: plaintext the session holds
    /// first, then the socket when it is readable.
    fn poll_read_tls(
        fd: &Arc<OwnedFd>,
        registered: &mut Option<AsyncFd<SharedFd>>,
        session: &tls::Session,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let guard = if session.buffered() {
                None
            } else {
                let registration = match ReadHalf::registration(fd, registered) {
                    Ok(registration) => registration,
                    Err(e) => return Poll::Ready(Err(e)),
                };
                match registration.poll_read_ready(cx) {
                    Poll::Ready(Ok(guard)) => Some(guard),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            };
            match session.read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(mut guard) = guard {
                        guard.clear_ready();
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(session) = &this.tls {
            return ReadHalf::poll_read_tls(&this.fd, &mut this.registered, session, cx, buf);
        }
        let registration = match ReadHalf::registration(&this.fd, &mut this.registered) {
            Ok(registration) => registration,
            Err(e) => return Poll::Ready(Err(e)),
        };
        loop {
            let mut guard = match registration.poll_read_ready(cx) {
                Poll::Ready(Ok(guard)) => guard,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            let asked = unfilled.len();
            match recv(guard.get_inner().as_raw_fd(), unfilled) {
                Ok(n) => {
                    // TR-2: a stream socket's `recv` returns less than it
                    // was asked for only when it emptied the socket's
                    // queue, so the next read waits for the reactor
                    // instead of asking the kernel once more, for an
                    // `EAGAIN`, after every frame. The guard clears only
                    // the readiness it saw: bytes that came since keep
                    // theirs.
                    if n > 0 && n < asked {
                        guard.clear_ready();
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// The writing half of a connection. Writes never block: `try_write` says
/// `WouldBlock` and `writable` waits for room.
pub(crate) struct WriteHalf {
    fd: Arc<OwnedFd>,
    tls: Option<Arc<tls::Session>>,
}

/// One non-blocking `sendmsg` of `bufs` (at most IOV_MAX of them).
pub(super) fn sendmsg(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // The kernel takes at most IOV_MAX (1024 on Linux) slices a call.
    let bufs = &bufs[..bufs.len().min(1024)];
    retry_interrupted(|| {
        // SAFETY: an all-zero msghdr is a valid empty message; the iovec
        // pointer and count name `bufs`, whose `IoSlice`s have the layout
        // of `iovec` (std guarantees it on Unix) and are valid for reads
        // while this call runs; the caller keeps `fd` open for the call.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = bufs.len() as _;
            libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        }
    })
}

/// Runs a send system call until a signal does not interrupt it: the
/// bytes it wrote, or its error.
fn retry_interrupted(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl WriteHalf {
    /// Writes as much of `buf` as the socket takes now. Over TLS, the
    /// plaintext bytes taken: their ciphertext leaves now or, when the
    /// socket is full, as soon as it has room (TL-4).
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        if let Some(session) = &self.tls {
            return session.write(&[io::IoSlice::new(buf)]);
        }
        retry_interrupted(|| {
            // SAFETY: `buf` is valid for reads of `buf.len()` bytes, and
            // `self.fd` is open while `self` lives.
            unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    buf.as_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            }
        })
    }

    /// Writes as much of `bufs`, in order, as the socket takes now (one
    /// `sendmsg`, like `writev`), without copying them together first.
    pub(crate) fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match &self.tls {
            None => sendmsg(self.fd.as_raw_fd(), bufs),
            Some(session) => session.write(bufs),
        }
    }

    /// Waits until the socket has room, through a duplicate of it that is
    /// registered for writing only for the wait (TR-1).
    pub(crate) async fn writable(&self) -> io::Result<()> {
        let dup = self.fd.try_clone()?;
        // SAFETY: the `OwnedFd` moves into the `AsyncFd`, which keeps it
        // open, and always answers the same descriptor.
        let registered = unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE)? };
        let _ready = registered.writable().await?;
        Ok(())
    }

    /// Ends the connection in both directions now: the peer reads its
    /// end, and so does this side's read half, whoever holds it. What is
    /// not written yet is dropped.
    pub(crate) fn abort(&self) {
        // SAFETY: shutdown on a socket this half shares; errors are moot
        // (the socket may have ended already).
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Writes all of `buf`, waiting for room as needed.
    pub(crate) async fn write_all(&self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.try_write(buf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
        if let Some(session) = &self.tls {
            // All of it on the wire, as a plain write_all leaves it.
            while !session.flushed()? {
                self.writable().await?;
            }
        }
        Ok(())
    }
}

impl Drop for WriteHalf {
    fn drop(&mut self) {
        if let Some(session) = &self.tls {
            // The session says close_notify and shuts the socket down once
            // what it holds is out (TL-4).
            session.close();
            return;
        }
        // As a stream's write half does: the peer reads the end of the
        // stream even while this side's read half lives on.
        // SAFETY: shutdown on a socket this half shares; errors are moot.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) };
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// TR-1: a writer that fills the socket waits for room through its
    /// duplicate registration, and every byte arrives in order.
    #[tokio::test]
    async fn tr1_writes_wait_for_room_and_arrive_whole() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = Conn::Unix(a).into_split().unwrap();
        let (mut b_rd, _b_wr) = Conn::Unix(b).into_split().unwrap();
        let sent: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let expected = sent.clone();
        let writer = tokio::spawn(async move { a_wr.write_all(&sent).await });
        let mut got = vec![0u8; expected.len()];
        // Let the writer fill the socket before reading anything.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        b_rd.read_exact(&mut got).await.unwrap();
        writer.await.unwrap().unwrap();
        assert!(got == expected, "the bytes differ");
    }

    /// What one read of `rd` returns within 5 s; `what` says which read
    /// hung otherwise.
    async fn read_within(rd: &mut ReadHalf, what: &str) -> Vec<u8> {
        let mut buf = [0u8; 16];
        let wait = std::time::Duration::from_secs(5);
        let n = tokio::time::timeout(wait, rd.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .unwrap();
        buf[..n].to_vec()
    }

    /// TR-3: a socket taken off the reactor while its reader polls loses
    /// nothing: bytes that came meanwhile are read by the next read that
    /// waits, at once, and a read that waits before bytes come is woken
    /// by them.
    #[tokio::test]
    async fn tr3_a_socket_taken_off_the_reactor_still_wakes_its_reader() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_a_rd, a_wr) = Conn::Unix(a).into_split().unwrap();
        let (mut b_rd, _b_wr) = Conn::Unix(b).into_split().unwrap();
        assert!(!b_rd.on_reactor(), "on the reactor before any read waited");

        a_wr.try_write(b"one").unwrap();
        assert_eq!(read_within(&mut b_rd, "the first read hung").await, b"one");
        assert!(b_rd.on_reactor(), "a read that waited left the reactor");

        b_rd.poll_alone();
        assert!(!b_rd.on_reactor());
        a_wr.try_write(b"two").unwrap();
        let what = "bytes that came off the reactor were not seen";
        assert_eq!(read_within(&mut b_rd, what).await, b"two");

        b_rd.poll_alone();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            a_wr.try_write(b"three").unwrap();
            a_wr
        });
        let what = "a read that waited was not woken by the bytes";
        assert_eq!(read_within(&mut b_rd, what).await, b"three");
        drop(writer.await.unwrap());
    }
}
