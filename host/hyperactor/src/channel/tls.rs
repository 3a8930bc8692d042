//! TLS between hosts: mutual TLS 1.3 on every TCP channel connection.
//!
//! A cluster has one certificate authority (the *cluster CA*); every host
//! holds a certificate signed by it, usable both to serve and to connect.
//! A process that calls [`install`] with a [`TlsConfig`] (read from a
//! directory by [`TlsConfig::from_dir`]) speaks TLS on all its TCP
//! connections, accepted and opened. `unix:` and `local:` channels never
//! leave the machine and stay plain.
//!
//! Authentication is being signed by the cluster CA, both ways: a server
//! asks every client for its certificate, and a client checks the server's.
//! Host addresses are often bare IPs that change with each allocation, so
//! certificates do not name hosts for the check: every one carries the DNS
//! name [`SERVER_NAME`], which clients verify the server against.
//!
//! - TL-1: with TLS installed, every TCP connection is TLS 1.3 and both
//!   peers present a certificate of the cluster CA; unix and local
//!   connections stay plain.
//! - TL-2: a peer whose certificate the cluster CA did not sign, or that
//!   presents none, fails the handshake; nothing it sent is delivered, and
//!   only its connection closes.
//! - TL-3: a server handshake runs in the connection's own task with a
//!   timeout ([`HANDSHAKE_TIMEOUT`]), never in a proc's accept loop, so a
//!   slow client stalls nobody else.
//! - TL-4: bytes a write accepted are never lost: ciphertext the socket
//!   could not take waits in the session and a flusher task writes it as
//!   soon as the socket has room.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// The DNS name every host certificate carries and every client checks
/// the server's certificate against (see the module docs).
pub const SERVER_NAME: &str = "monarch-host";

/// The cluster CA's certificate in a TLS directory.
pub const CA_FILE: &str = "ca.pem";
/// The host's certificate (chain) in a TLS directory.
pub const CERT_FILE: &str = "host.pem";
/// The host's private key in a TLS directory.
pub const KEY_FILE: &str = "host.key";

/// How long a TLS handshake may take before the connection is dropped (TL-3).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Ciphertext the session encrypts before it writes it out.
const SEND_BUFFER: usize = 256 << 10;
/// Ciphertext one `recv` takes.
const RECV_BUFFER: usize = 128 << 10;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file of the TLS directory could not be read.
    #[error(
        "cannot read {path}: {source} (make the directory with `monarch-host certs new --dir DIR`)"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no PEM item of the kind expected.
    #[error("{path} holds no {what} in PEM form")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
    /// A file is not valid PEM.
    #[error("{path} is not valid PEM: {detail}")]
    BadPem {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        detail: String,
    },
    /// rustls refused the certificates or key.
    #[error("TLS setup with {dir} failed: {detail}")]
    Setup {
        /// The TLS directory.
        dir: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// [`install`] was called before, with another directory.
    #[error("TLS is already set up with {0} in this process")]
    AlreadyInstalled(PathBuf),
}

/// What a process needs to speak TLS: its host certificate and key, and
/// the cluster CA to check peers with.
#[derive(Clone)]
pub struct TlsConfig {
    dir: PathBuf,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").field("dir", &self.dir).finish()
    }
}

impl TlsConfig {
    /// Reads `DIR/ca.pem` (the cluster CA), `DIR/host.pem` and
    /// `DIR/host.key` (this host's certificate and key), as `monarch-host
    /// certs new` writes them.
    pub fn from_dir(dir: &Path) -> Result<TlsConfig, TlsError> {
        let ca_path = dir.join(CA_FILE);
        let cert_path = dir.join(CERT_FILE);
        let key_path = dir.join(KEY_FILE);
        let cas = read_certs(&ca_path)?;
        let chain = read_certs(&cert_path)?;
        let key = read_key(&key_path)?;
        let setup = |detail: String| TlsError::Setup {
            dir: dir.to_path_buf(),
            detail,
        };
        let mut roots = RootCertStore::empty();
        for ca in cas {
            roots
                .add(ca)
                .map_err(|e| setup(format!("{}: {e}", ca_path.display())))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| setup(e.to_string()))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| setup(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| setup(format!("{}: {e}", cert_path.display())))?;
        // Every connection authenticates afresh: no tickets, no resumption.
        server.send_tls13_tickets = 0;
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| setup(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| setup(format!("{}: {e}", cert_path.display())))?;
        client.resumption = rustls::client::Resumption::disabled();
        Ok(TlsConfig {
            dir: dir.to_path_buf(),
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The directory the configuration was read from; child procs read it
    /// again (key material never travels in their environment).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadPem {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            path: path.to_path_buf(),
            what: "private key",
        },
        e => TlsError::BadPem {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
    })
}

static INSTALLED: OnceLock<Arc<TlsConfig>> = OnceLock::new();

/// Makes every TCP channel connection of this process TLS (TL-1), from
/// now on. Call it once at start, before any proc serves or connects.
/// Installing the same directory again is a no-op; another one is an
/// error.
pub fn install(config: TlsConfig) -> Result<(), TlsError> {
    let dir = config.dir.clone();
    let installed = INSTALLED.get_or_init(|| Arc::new(config));
    if installed.dir != dir {
        return Err(TlsError::AlreadyInstalled(installed.dir.clone()));
    }
    ensure_provider();
    Ok(())
}

/// The TLS configuration of this process, if [`install`] was called.
pub fn installed() -> Option<&'static TlsConfig> {
    INSTALLED.get().map(|c| &**c)
}

/// rustls asks for a process-wide provider in a few places that take none
/// explicitly; make it the one the configurations use.
fn ensure_provider() {
    if CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Opens a TLS connection to `addr` with the installed configuration and
/// closes it: an early, clear error when the peer's certificate is not of
/// this cluster (or it speaks no TLS), before any message waits on it.
/// TLS 1.3 tells a client that the server refused *its* certificate only
/// when it next reads, so that case shows later, as a lost connection.
/// Without TLS installed it only connects.
pub async fn probe(addr: &super::ChannelAddr) -> io::Result<()> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT * 2, super::transport::connect(addr))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{addr}: no connection within {} s",
                    HANDSHAKE_TIMEOUT.as_secs() * 2
                ),
            )
        })?
        .map(drop)
}

/// Reads from a tokio TCP stream without blocking.
struct StreamIo<'a>(&'a TcpStream);

impl Read for StreamIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for StreamIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs a handshake to its end on `stream`.
async fn handshake(stream: &TcpStream, tls: &mut rustls::Connection) -> io::Result<()> {
    let mut read_any = false;
    loop {
        while tls.wants_write() {
            match tls.write_tls(&mut StreamIo(stream)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
                Err(e) => return Err(e),
            }
        }
        if !tls.is_handshaking() {
            return Ok(());
        }
        stream.readable().await?;
        match tls.read_tls(&mut StreamIo(stream)) {
            Ok(0) if !read_any => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection before the TLS handshake",
                ));
            }
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the peer closed the connection during the TLS handshake \
                     (does it use the same cluster CA, and TLS at all?)",
                ));
            }
            Ok(_) => {
                read_any = true;
                if let Err(e) = tls.process_new_packets() {
                    // Tell the peer why (an alert), as far as the socket takes it.
                    let _ = tls.write_tls(&mut StreamIo(stream));
                    return Err(handshake_error(e));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

fn handshake_error(e: rustls::Error) -> io::Error {
    let hint = match &e {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::AlertReceived(_) => {
            " (are both hosts' --tls-dir made by the same `monarch-host certs new`?)"
        }
        rustls::Error::InvalidMessage(_) => " (does the peer speak TLS? give it --tls-dir)",
        _ => "",
    };
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("TLS handshake failed: {e}{hint}"),
    )
}

/// The client side of a handshake on a connected stream (TL-1).
pub(crate) async fn connect(
    stream: &TcpStream,
    config: &TlsConfig,
) -> io::Result<rustls::Connection> {
    let name = ServerName::try_from(SERVER_NAME).map_err(io::Error::other)?;
    let mut tls = rustls::ClientConnection::new(config.client.clone(), name)
        .map_err(io::Error::other)?
        .into();
    timed(handshake(stream, &mut tls)).await?;
    Ok(tls)
}

/// The server side of a handshake on an accepted stream (TL-1, TL-3).
pub(crate) async fn accept(
    stream: &TcpStream,
    config: &TlsConfig,
) -> io::Result<rustls::Connection> {
    let mut tls = rustls::ServerConnection::new(config.server.clone())
        .map_err(io::Error::other)?
        .into();
    timed(handshake(stream, &mut tls)).await?;
    Ok(tls)
}

async fn timed(handshake: impl Future<Output = io::Result<()>>) -> io::Result<()> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
            )
        })?
}

/// The state of one TLS connection, shared by its halves and its flusher.
pub(crate) struct Session {
    fd: Arc<OwnedFd>,
    state: Mutex<State>,
    /// Wakes the flusher: ciphertext waits, or the write half is gone.
    kick: Notify,
    /// The write half is gone: flush what is left, close, and end.
    closing: AtomicBool,
}

struct State {
    tls: rustls::Connection,
    /// Ciphertext read from the socket and not yet given to rustls.
    inbuf: Box<[u8]>,
    in_start: usize,
    in_end: usize,
    /// The socket's end of stream was read.
    eof: bool,
    /// Plaintext may wait in rustls, so a reader should look before it
    /// waits for the socket.
    buffered: bool,
    /// The flusher's write failed: later writes fail too.
    write_error: Option<io::ErrorKind>,
}

impl Session {
    /// A session over `fd` after a finished handshake; starts its flusher
    /// task (TL-4), so it must be called inside a tokio runtime.
    pub(crate) fn start(fd: Arc<OwnedFd>, mut tls: rustls::Connection) -> Arc<Session> {
        tls.set_buffer_limit(Some(SEND_BUFFER));
        let session = Arc::new(Session {
            fd,
            state: Mutex::new(State {
                tls,
                inbuf: vec![0u8; RECV_BUFFER].into_boxed_slice(),
                in_start: 0,
                in_end: 0,
                eof: false,
                // The handshake may have read bytes past its end.
                buffered: true,
                write_error: None,
            }),
            kick: Notify::new(),
            closing: AtomicBool::new(false),
        });
        tokio::spawn(session.clone().flusher());
        session
    }

    /// Whether a read may find plaintext without asking the socket.
    pub(crate) fn buffered(&self) -> bool {
        self.state.lock().buffered
    }

    /// Reads plaintext into `buf` with at most one `recv`: `WouldBlock`
    /// when there is none yet, `Ok(0)` at the end of the stream.
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let mut filled = 0;
        loop {
            match st.tls.reader().read(&mut buf[filled..]) {
                Ok(0) => {
                    // close_notify: a clean end, after what was read.
                    st.buffered = true;
                    return Ok(filled);
                }
                Ok(n) => {
                    filled += n;
                    if filled == buf.len() {
                        st.buffered = true;
                        return Ok(filled);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The socket ended without close_notify: the frame layer
                // tells a cut frame from a clean end.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    st.buffered = true;
                    return Ok(filled);
                }
                Err(e) => return Err(e),
            }
            if st.in_start < st.in_end {
                let mut pending = &st.inbuf[st.in_start..st.in_end];
                let taken = st.tls.read_tls(&mut pending)?;
                st.in_start += taken;
                if let Err(e) = st.tls.process_new_packets() {
                    drop(guard);
                    self.kick.notify_one(); // the alert
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("TLS: {e}"),
                    ));
                }
                if st.tls.wants_write() {
                    // A post-handshake message (a key update) to answer.
                    self.kick.notify_one();
                }
                continue;
            }
            if filled > 0 {
                st.buffered = false;
                return Ok(filled);
            }
            if st.eof {
                st.buffered = true;
                return Ok(0);
            }
            match recv(self.fd.as_raw_fd(), &mut st.inbuf) {
                Ok(0) => {
                    st.eof = true;
                    // Tells rustls the stream ended.
                    st.tls.read_tls(&mut &[][..])?;
                }
                Ok(n) => {
                    st.in_start = 0;
                    st.in_end = n;
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        st.buffered = false;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Encrypts as much of `bufs` as it can and writes the ciphertext out:
    /// the plaintext bytes taken, or `WouldBlock` when none could be
    /// because earlier ciphertext still waits for room. What it took and
    /// could not write yet the flusher writes (TL-4).
    pub(crate) fn write(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut st = self.state.lock();
        if let Some(kind) = st.write_error {
            return Err(io::Error::new(kind, "an earlier TLS write failed"));
        }
        let mut taken = 0;
        loop {
            if !flush(&mut st, self.fd.as_raw_fd())? {
                if taken == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                drop(st);
                self.kick.notify_one();
                return Ok(taken);
            }
            if taken == total {
                return Ok(taken);
            }
            let rest = skip(bufs, taken);
            let n = st.tls.writer().write_vectored(&rest)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            taken += n;
        }
    }

    /// Whether every ciphertext byte has left; writes what it can.
    pub(crate) fn flushed(&self) -> io::Result<bool> {
        let mut st = self.state.lock();
        if let Some(kind) = st.write_error {
            return Err(io::Error::new(kind, "an earlier TLS write failed"));
        }
        flush(&mut st, self.fd.as_raw_fd())
    }

    /// Called when the write half is dropped: says close_notify, and
    /// leaves the rest to the flusher, which shuts the socket down for
    /// writing once all is out (or after a few seconds).
    pub(crate) fn close(&self) {
        self.state.lock().tls.send_close_notify();
        self.closing.store(true, Ordering::Release);
        self.kick.notify_one();
    }

    /// Writes waiting ciphertext whenever there is some and the socket has
    /// room (TL-4); after `close`, finishes and shuts the socket down.
    async fn flusher(self: Arc<Self>) {
        let mut wait_for_kick = true;
        loop {
            if wait_for_kick {
                self.kick.notified().await;
            }
            wait_for_kick = true;
            let drained = async {
                loop {
                    let done = {
                        let mut st = self.state.lock();
                        match flush(&mut st, self.fd.as_raw_fd()) {
                            Ok(done) => done,
                            Err(e) => {
                                st.write_error = Some(e.kind());
                                return;
                            }
                        }
                    };
                    if done || wait_writable(&self.fd).await.is_err() {
                        return;
                    }
                }
            };
            if self.closing.load(Ordering::Acquire) {
                let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, drained).await;
                // SAFETY: shutdown on a socket this session keeps open.
                unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) };
                return;
            }
            tokio::select! {
                _ = drained => {}
                // More to write, or the write half is gone: go round.
                _ = self.kick.notified() => wait_for_kick = false,
            }
        }
    }
}

/// Writes ciphertext until none waits (`true`) or the socket is full.
fn flush(st: &mut State, fd: RawFd) -> io::Result<bool> {
    while st.tls.wants_write() {
        match st.tls.write_tls(&mut FdWriter(fd)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// `bufs` without their first `n` bytes.
fn skip<'a>(bufs: &'a [io::IoSlice<'a>], mut n: usize) -> Vec<io::IoSlice<'a>> {
    let mut rest = Vec::with_capacity(bufs.len());
    for buf in bufs {
        if n >= buf.len() {
            n -= buf.len();
            continue;
        }
        rest.push(io::IoSlice::new(&buf[n..]));
        n = 0;
    }
    rest
}

/// Waits until `fd` has room, through a duplicate registered only for
/// the wait (as the plain write half does, TR-1).
async fn wait_writable(fd: &OwnedFd) -> io::Result<()> {
    let dup = fd.try_clone()?;
    // SAFETY: the `OwnedFd` moves into the `AsyncFd`, which keeps it
    // open, and always answers the same descriptor.
    let registered = unsafe { AsyncFd::register_with_interest(dup, Interest::WRITABLE)? };
    let _ready = registered.writable().await?;
    Ok(())
}

/// Non-blocking sends of ciphertext.
struct FdWriter(RawFd);

impl Write for FdWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        super::transport::sendmsg(self.0, bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    super::transport::recv(fd, buf)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::AtomicUsize;

    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::channel::ChannelAddr;
    use crate::channel::frame::{FrameKind, FrameReader, finish_frame, frame_buffer};
    use crate::channel::transport::{self, Conn, Listener, ReadHalf, WriteHalf};

    /// A cluster CA for tests.
    pub(crate) struct TestCa {
        pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    impl TestCa {
        pub(crate) fn new(name: &str) -> TestCa {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let cert = params.self_signed(&key).unwrap();
            TestCa {
                pem: cert.pem(),
                issuer: Issuer::new(params, key),
            }
        }

        /// A TLS directory with this CA and a host certificate signed by
        /// `signer` (this CA unless another is given).
        pub(crate) fn dir(&self, signer: Option<&TestCa>) -> PathBuf {
            static DIRS: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "hyperactor-tls-{}-{}",
                std::process::id(),
                DIRS.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()]).unwrap();
            params.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ];
            let cert = params
                .signed_by(&key, &signer.unwrap_or(self).issuer)
                .unwrap();
            std::fs::write(dir.join(CA_FILE), &self.pem).unwrap();
            std::fs::write(dir.join(CERT_FILE), cert.pem()).unwrap();
            std::fs::write(dir.join(KEY_FILE), key.serialize_pem()).unwrap();
            dir
        }

        pub(crate) fn config(&self, signer: Option<&TestCa>) -> TlsConfig {
            let dir = self.dir(signer);
            let config = TlsConfig::from_dir(&dir).unwrap();
            std::fs::remove_dir_all(&dir).ok();
            config
        }
    }

    /// A listener on 127.0.0.1 whose next connection is accepted with
    /// `config`: the halves, or the handshake's error.
    async fn serve_one(
        config: TlsConfig,
    ) -> (
        ChannelAddr,
        tokio::task::JoinHandle<io::Result<(ReadHalf, WriteHalf)>>,
    ) {
        let (mut listener, addr) = Listener::bind(&"tcp:127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let accepted = tokio::spawn(async move {
            let conn = listener.accept().await?;
            conn.accept_tls_with(Some(&config)).await?.into_split()
        });
        (addr, accepted)
    }

    fn body_of(seq: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u64 ^ seq) as u8).collect()
    }

    fn data_frame(seq: u64, len: usize) -> rkyv::util::AlignedVec {
        let mut frame = frame_buffer(len);
        frame.extend_from_slice(&body_of(seq, len));
        finish_frame(&mut frame, FrameKind::Data, seq);
        frame
    }

    /// Writes `frames` as the link does: `try_write_vectored` for as much
    /// as the socket takes, `writable` when it takes nothing, and no final
    /// flush (the session's flusher owns that, TL-4).
    async fn write_like_a_link(wr: &WriteHalf, frames: &[rkyv::util::AlignedVec]) {
        let mut at = 0; // index of the first frame not fully written
        let mut pos = 0; // bytes of it written
        while at < frames.len() {
            let slices: Vec<io::IoSlice<'_>> = frames[at..]
                .iter()
                .take(64)
                .enumerate()
                .map(|(i, f)| io::IoSlice::new(if i == 0 { &f[pos..] } else { &f[..] }))
                .collect();
            match wr.try_write_vectored(&slices) {
                Ok(mut n) => {
                    while n > 0 {
                        let rest = frames[at].len() - pos;
                        if n >= rest {
                            n -= rest;
                            at += 1;
                            pos = 0;
                        } else {
                            pos += n;
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wr.writable().await.unwrap(),
                Err(e) => panic!("write failed: {e}"),
            }
        }
    }

    /// TL-1, TL-4: many frames, from a burst of small ones to ones past
    /// 1 MiB, written the way a link writes them while the reader lags,
    /// cross a TLS connection whole and in order; the busy-poll read path
    /// (`recv_now`) reads the same stream.
    #[tokio::test]
    async fn tl1_tl4_frames_cross_a_tls_connection_whole_and_in_order() {
        let ca = TestCa::new("cluster");
        let (addr, accepted) = serve_one(ca.config(None)).await;
        let client = transport::connect_with(&addr, Some(&ca.config(None)))
            .await
            .unwrap();
        assert!(matches!(client, Conn::Tls(..)));
        let (mut server_rd, server_wr) = accepted.await.unwrap().unwrap();
        let (mut client_rd, client_wr) = client.into_split().unwrap();

        let mut lens: Vec<usize> = (0..2000).map(|i| 8 + (i % 97) * 8).collect();
        lens.extend([(1 << 20) + 8, 3 << 20, 24, (2 << 20) + 40]);
        lens.extend((0..500).map(|i| 16 + (i % 13) * 8));
        let frames: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(seq, &len)| data_frame(seq as u64 + 1, len))
            .collect();
        let expected = frames.len();
        let writer = tokio::spawn(async move {
            write_like_a_link(&client_wr, &frames).await;
            client_wr
        });
        // Let the writer fill the socket and leave ciphertext behind.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut reader = FrameReader::new(8 << 20);
        let mut got = 0;
        let mut polled = 0;
        while got < expected {
            while let Some((header, body)) = reader.next_frame().unwrap() {
                let seq = got as u64 + 1;
                assert_eq!(header.seq, seq, "frames out of order");
                assert!(
                    reader.body(body) == body_of(seq, lens[got]),
                    "frame {seq} differs"
                );
                got += 1;
            }
            if got == expected {
                break;
            }
            // Alternate the busy-poll path with the ordinary one.
            if polled % 2 == 0
                && let Some(more) = reader.fill_now(&server_rd).unwrap()
            {
                assert!(more, "stream ended early");
                polled += 1;
                continue;
            }
            polled += 1;
            let filled = tokio::time::timeout(Duration::from_secs(10), reader.fill(&mut server_rd))
                .await
                .expect("the rest never came")
                .unwrap();
            assert!(filled, "stream ended after {got} frames");
        }
        let client_wr = writer.await.unwrap();

        // And back: an answer the other way, then a clean end.
        server_wr.write_all(b"ack!").await.unwrap();
        let mut ack = [0u8; 4];
        client_rd.read_exact(&mut ack).await.unwrap();
        assert_eq!(&ack, b"ack!");
        drop(client_wr);
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), server_rd.read_to_end(&mut rest))
            .await
            .expect("no end of stream")
            .unwrap();
        assert!(rest.is_empty());
    }

    /// TL-2: a client whose certificate another CA signed is refused: the
    /// server's handshake fails, and the client cannot deliver a byte.
    #[tokio::test]
    async fn tl2_a_client_with_another_cas_certificate_is_refused() {
        let ca = TestCa::new("cluster");
        let stranger = TestCa::new("stranger");
        // Trusts the cluster CA (so it accepts the server) but holds a
        // certificate of another CA.
        let (addr, accepted) = serve_one(ca.config(None)).await;
        let client = transport::connect_with(&addr, Some(&ca.config(Some(&stranger)))).await;
        let server = accepted.await.unwrap();
        let err = server.err().expect("the server accepted a stranger");
        assert!(err.to_string().contains("TLS handshake failed"), "{err}");
        if let Ok(conn) = client {
            // TLS 1.3 lets the client finish first; it learns of the refusal
            // when it reads.
            let (mut rd, wr) = conn.into_split().unwrap();
            let _ = wr.write_all(b"hello").await;
            let mut buf = [0u8; 16];
            let read = tokio::time::timeout(Duration::from_secs(5), rd.read(&mut buf))
                .await
                .expect("no answer to a refused client");
            assert!(
                !matches!(read, Ok(n) if n > 0),
                "the refused client read data"
            );
        }

        // One that trusts only another CA refuses the server itself.
        let (addr, accepted) = serve_one(ca.config(None)).await;
        let err = transport::connect_with(&addr, Some(&stranger.config(None)))
            .await
            .err()
            .expect("a client of another CA connected");
        assert!(err.to_string().contains("UnknownIssuer"), "{err}");
        assert!(err.to_string().contains("--tls-dir"), "{err}");
        assert!(accepted.await.unwrap().is_err());
    }

    /// TL-2: a client that presents no certificate is refused; so is one
    /// that speaks no TLS at all.
    #[tokio::test]
    async fn tl2_a_client_without_a_certificate_is_refused() {
        let ca = TestCa::new("cluster");
        let (addr, accepted) = serve_one(ca.config(None)).await;
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut anonymous = ca.config(None);
        anonymous.client = Arc::new(
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        );
        let _ = transport::connect_with(&addr, Some(&anonymous)).await;
        let err = accepted
            .await
            .unwrap()
            .err()
            .expect("accepted without a certificate");
        assert!(err.to_string().contains("TLS handshake failed"), "{err}");

        // Plain bytes (a peer without TLS, or a probe) are refused too.
        let (addr, accepted) = serve_one(ca.config(None)).await;
        let conn = transport::connect_with(&addr, None).await.unwrap();
        let (_rd, wr) = conn.into_split().unwrap();
        wr.write_all(&data_frame(1, 64)).await.unwrap();
        assert!(accepted.await.unwrap().is_err());
    }

    #[test]
    fn a_missing_tls_directory_says_how_to_make_one() {
        let err = TlsConfig::from_dir(Path::new("/nonexistent/tls")).unwrap_err();
        assert!(err.to_string().contains("certs new"), "{err}");
    }
}
