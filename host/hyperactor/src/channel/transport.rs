//! Byte streams for each transport: listening, connecting, and the two halves
//! of a connection.
//!
//! `local:` channels are socket pairs handed to an in-process listener, so all
//! three transports share the same stream code.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream, tcp, unix};
use tokio::sync::mpsc;

use super::ChannelAddr;

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

/// Opens a connection to `addr`.
pub(crate) async fn connect(addr: &ChannelAddr) -> io::Result<Conn> {
    match addr {
        ChannelAddr::Tcp(sock) => {
            let stream = TcpStream::connect(sock).await?;
            stream.set_nodelay(true)?;
            Ok(Conn::Tcp(stream))
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
}

impl Conn {
    pub(crate) fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Conn::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Conn::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        }
    }
}

/// The reading half of a connection.
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

impl ReadHalf {
    /// Reads what the socket holds right now with one `recv` system call,
    /// without asking the runtime's reactor first (which only learns of new
    /// bytes when it next polls); `WouldBlock` when nothing is there. For
    /// busy polling. Bytes read here are simply not there for the next
    /// ordinary read, which the reactor handles like any spurious wakeup.
    pub(crate) fn recv_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = match self {
            ReadHalf::Tcp(r) => r.as_ref().as_raw_fd(),
            ReadHalf::Unix(r) => r.as_ref().as_raw_fd(),
        };
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes, and `fd`
        // stays open while `self` (which owns the socket's read half) lives.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Tcp(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Unix(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

/// The writing half of a connection. Writes never block: `try_write` says
/// `WouldBlock` and `writable` waits for room.
pub(crate) enum WriteHalf {
    Tcp(tcp::OwnedWriteHalf),
    Unix(unix::OwnedWriteHalf),
}

impl WriteHalf {
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(w) => w.try_write(buf),
            WriteHalf::Unix(w) => w.try_write(buf),
        }
    }

    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => w.writable().await,
            WriteHalf::Unix(w) => w.writable().await,
        }
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
        Ok(())
    }
}
