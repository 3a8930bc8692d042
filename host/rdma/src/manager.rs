//! The per-process manager: registers buffers, serves remote access to
//! them, and runs transfers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{
    Backend, BackendKind, Direction, FallbackLog, Job, LocalIbverbs, Selection, SelectionInput,
    TransferFuture, select,
};
use crate::config::RdmaConfig;
use crate::error::{RdmaError, Side, check_range};
use crate::handle::{AccessKey, BufferHandle, ManagerId};
use crate::ibverbs::{IbvState, IbverbsBackend};
use crate::region::Region;
use crate::registry::{AccessRequest, Entry, Registry};
use crate::tcp::client::TcpBackend;
use crate::tcp::server::{ServerContext, spawn_listener};
use crate::tcp::wire::Status;

/// Registers buffers, serves peers' reads and writes of them, and runs this
/// process's transfers. One per process (per proc) is the intended use.
///
/// Cloning is cheap and shares the manager. When the last clone is dropped
/// (or [`shutdown`](Self::shutdown) is called) the listener and every
/// connection it accepted close, so peers' transfers from this manager fail
/// at once instead of hanging.
#[derive(Clone)]
pub struct RdmaManager {
    inner: Arc<Inner>,
}

struct Inner {
    id: ManagerId,
    tcp_addr: SocketAddr,
    op_timeout: Duration,
    registry: Arc<Registry>,
    local: LocalBackend,
    tcp: Arc<TcpBackend>,
    ibverbs: Option<IbverbsBackend>,
    ibverbs_status: LocalIbverbs,
    /// Peers with which connecting a queue pair failed, and why.
    ibverbs_failed: Mutex<HashMap<ManagerId, String>>,
    fallback: FallbackLog,
    shutdown: watch::Sender<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

impl RdmaManager {
    /// Starts a manager: binds the TCP listener and, unless turned off, tries
    /// to open an RDMA device. Must run inside a tokio runtime.
    pub async fn new(config: RdmaConfig) -> Result<RdmaManager, RdmaError> {
        config.validate()?;
        let id = ManagerId::random()?;
        let (ibverbs_state, ibverbs_status) = if config.ibverbs.enabled {
            match IbvState::open(&config.ibverbs, id) {
                Ok(state) => (Some(state), LocalIbverbs::Available),
                Err(err) => {
                    tracing::info!(manager = %id, "{err}; transfers of this manager use TCP");
                    (None, LocalIbverbs::Unavailable(err.to_string()))
                }
            }
        } else {
            (None, LocalIbverbs::Disabled)
        };

        let listener = crate::tcp::bind(config.listen_addr, config.socket_buffer_size)?;
        let bound = listener.local_addr().map_err(|err| RdmaError::Io {
            what: "reading the listener's address".into(),
            reason: err.to_string(),
        })?;
        let tcp_addr = match config.advertise_addr {
            Some(addr) => addr,
            None if bound.ip().is_unspecified() => {
                return Err(RdmaError::Config(format!(
                    "listening on {bound} needs advertise_addr: peers need an address they can dial"
                )));
            }
            None => bound,
        };

        let (shutdown, shutdown_rx) = watch::channel(false);
        let registry = Arc::new(Registry::new(id));
        let context = Arc::new(ServerContext {
            registry: Arc::clone(&registry),
            ibverbs: ibverbs_state.clone(),
            socket_buffer_size: config.socket_buffer_size,
            #[cfg(test)]
            gate: config.serve_gate.clone(),
        });
        spawn_listener(listener, context, shutdown_rx.clone());

        let tcp = Arc::new(TcpBackend::new(
            config.chunk_size,
            config.connections_per_peer,
            config.socket_buffer_size,
            shutdown_rx,
        ));
        let ibverbs = ibverbs_state.map(|state| IbverbsBackend {
            state,
            tcp: Arc::clone(&tcp),
        });
        tracing::debug!(manager = %id, %tcp_addr, "rdma manager started");
        Ok(RdmaManager {
            inner: Arc::new(Inner {
                id,
                tcp_addr,
                op_timeout: config.op_timeout,
                local: LocalBackend {
                    registry: Arc::clone(&registry),
                },
                registry,
                tcp,
                ibverbs,
                ibverbs_status,
                ibverbs_failed: Mutex::new(HashMap::new()),
                fallback: FallbackLog::default(),
                shutdown,
            }),
        })
    }

    /// This manager's id (found in every handle it makes).
    pub fn id(&self) -> ManagerId {
        self.inner.id
    }

    /// The TCP address put in handles.
    pub fn tcp_addr(&self) -> SocketAddr {
        self.inner.tcp_addr
    }

    /// Why no RDMA device is in use (`None` when one is, or when ibverbs is
    /// turned off in the configuration).
    pub fn ibverbs_unavailable(&self) -> Option<&str> {
        match &self.inner.ibverbs_status {
            LocalIbverbs::Unavailable(reason) => Some(reason),
            LocalIbverbs::Available | LocalIbverbs::Disabled => None,
        }
    }

    /// Registers a region: peers holding the buffer's handle can now read and
    /// write it. With an RDMA device the memory is also registered with it;
    /// if that fails the buffer is served over TCP only (and a warning says why).
    pub fn register(&self, region: Region) -> Result<Buffer, RdmaError> {
        let key = AccessKey::random()?;
        let (registration, ibverbs) = match &self.inner.ibverbs {
            Some(backend) if !region.is_empty() => match backend.state.register(&region) {
                Ok((registration, remote)) => (Some(registration), Some(remote)),
                Err(err) => {
                    tracing::warn!(
                        len = region.len(),
                        "cannot register a buffer with the RDMA device ({err}); it is served over TCP only"
                    );
                    (None, None)
                }
            },
            _ => (None, None),
        };
        let len = region.len() as u64;
        let entry = self.inner.registry.insert(key, region, registration);
        let handle = BufferHandle {
            owner: self.inner.id,
            id: entry.id,
            len,
            key: key.0,
            tcp: self.inner.tcp_addr,
            ibverbs,
        };
        Ok(Buffer {
            entry,
            registry: Arc::clone(&self.inner.registry),
            handle,
        })
    }

    /// Allocates a zeroed region of `len` bytes and registers it.
    pub fn alloc(&self, len: usize) -> Result<Buffer, RdmaError> {
        self.register(Region::new(len)?)
    }

    /// One-sided READ: copies `len` bytes of `remote` from `remote_offset`
    /// into `local` at `local_offset`. Returns the number of bytes moved.
    /// Ends within the configured `op_timeout`.
    pub async fn read_into(
        &self,
        local: &Buffer,
        local_offset: u64,
        remote: &BufferHandle,
        remote_offset: u64,
        len: u64,
    ) -> Result<u64, RdmaError> {
        self.transfer(Transfer {
            direction: Direction::Read,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
            timeout: None,
        })
        .await
    }

    /// One-sided WRITE: copies `len` bytes of `local` from `local_offset`
    /// into `remote` at `remote_offset`. Returns the number of bytes moved.
    /// Ends within the configured `op_timeout`.
    pub async fn write_from(
        &self,
        local: &Buffer,
        local_offset: u64,
        remote: &BufferHandle,
        remote_offset: u64,
        len: u64,
    ) -> Result<u64, RdmaError> {
        self.transfer(Transfer {
            direction: Direction::Write,
            local,
            local_offset,
            remote,
            remote_offset,
            len,
            timeout: None,
        })
        .await
    }

    /// Runs a transfer, with its own timeout if it has one.
    ///
    /// The ranges are checked first (the local one against the buffer, the
    /// remote one against the handle; the owner checks again). Then the
    /// backend is chosen ([`backend_for`](Self::backend_for)) and the
    /// transfer runs until it ends or the timeout passes.
    ///
    /// Dropping the returned future abandons the transfer: chunks already on
    /// their way may still land in either buffer, as with a cancelled RDMA
    /// operation.
    pub async fn transfer(&self, transfer: Transfer<'_>) -> Result<u64, RdmaError> {
        let inner = &self.inner;
        if *inner.shutdown.borrow() {
            return Err(RdmaError::Shutdown);
        }
        let local = transfer.local;
        if local.handle.owner != inner.id {
            return Err(RdmaError::ForeignBuffer {
                owner: local.handle.owner,
                id: local.handle.id,
            });
        }
        check_range(
            Side::Local,
            transfer.local_offset,
            transfer.len,
            local.handle.len,
        )?;
        check_range(
            Side::Remote,
            transfer.remote_offset,
            transfer.len,
            transfer.remote.len,
        )?;
        let timeout = transfer.timeout.unwrap_or(inner.op_timeout);
        let deadline = Instant::now() + timeout;
        let job = Job {
            direction: transfer.direction,
            local: Arc::clone(&local.entry),
            local_offset: transfer.local_offset,
            remote: transfer.remote.clone(),
            remote_offset: transfer.remote_offset,
            len: transfer.len,
            deadline,
            timeout,
        };
        let backend = self.backend(&job).await?;
        tracing::trace!(
            backend = ?backend.kind(),
            direction = ?job.direction,
            peer = %job.remote.owner,
            buffer = job.remote.id,
            len = job.len,
            "rdma transfer"
        );
        backend.transfer(job).await
    }

    /// The backend a transfer between `local` and `remote` would use now.
    pub fn backend_for(&self, local: &Buffer, remote: &BufferHandle) -> BackendKind {
        match self.selection(&local.entry, remote) {
            Selection::Local => BackendKind::Local,
            Selection::Ibverbs => BackendKind::Ibverbs,
            Selection::Tcp { .. } => BackendKind::Tcp,
        }
    }

    fn selection(&self, local: &Entry, remote: &BufferHandle) -> Selection {
        let local_buffer_registered = local.ibverbs.lock().is_some();
        let failed = self.inner.ibverbs_failed.lock();
        select(&SelectionInput {
            local_manager: self.inner.id,
            local_ibverbs: &self.inner.ibverbs_status,
            local_buffer_registered,
            remote,
            pair_failed: failed.get(&remote.owner).map(String::as_str),
        })
    }

    /// Chooses the backend for a job (RD-7 warnings included); connects an
    /// ibverbs queue pair first when that is the choice. When connecting
    /// fails because of the pair (the owner has no device, refused the
    /// handshake, a verbs call failed) this pair uses TCP from then on; when
    /// it fails because of the handle, the peer or the deadline, the
    /// transfer fails with that error, as it would over TCP.
    async fn backend(&self, job: &Job) -> Result<&dyn Backend, RdmaError> {
        let inner = &self.inner;
        let remote = &job.remote;
        let mut selection = self.selection(&job.local, remote);
        if selection == Selection::Ibverbs
            && let Some(ibverbs) = &inner.ibverbs
        {
            match ibverbs
                .state
                .connect(remote, &inner.tcp, job.deadline)
                .await
            {
                Ok(()) => return Ok(ibverbs),
                Err(
                    err @ (RdmaError::Refused { .. }
                    | RdmaError::Ibverbs(_)
                    | RdmaError::Protocol { .. }),
                ) => {
                    let reason = err.to_string();
                    inner
                        .ibverbs_failed
                        .lock()
                        .insert(remote.owner, reason.clone());
                    selection = Selection::Tcp {
                        fallback: Some(format!("connecting a queue pair failed: {reason}")),
                    };
                }
                Err(err) => return Err(err),
            }
        }
        Ok(match selection {
            Selection::Local => &inner.local,
            Selection::Tcp { fallback } => {
                if let Some(reason) = fallback
                    && inner.fallback.first_time(remote.owner)
                {
                    tracing::warn!(
                        manager = %inner.id,
                        peer = %remote.owner,
                        addr = %remote.tcp,
                        "RDMA is not available between these managers ({reason}); using TCP"
                    );
                }
                &*inner.tcp
            }
            // Only reachable with a device, handled above.
            Selection::Ibverbs => &*inner.tcp,
        })
    }

    /// Stops serving: the listener and every connection it accepted close,
    /// and transfers this manager runs fail with [`RdmaError::Shutdown`].
    /// Dropping the last clone does the same.
    pub fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
    }

    #[cfg(test)]
    pub(crate) fn idle_connections(&self, addr: SocketAddr) -> usize {
        self.inner.tcp.idle_connections(addr)
    }
}

/// A transfer with every parameter spelled out; see
/// [`RdmaManager::transfer`].
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// Read (remote to local) or write (local to remote).
    pub direction: Direction,
    /// A buffer of the manager that runs the transfer.
    pub local: &'a Buffer,
    /// Where in `local` the bytes start.
    pub local_offset: u64,
    /// The other buffer, on any manager (this one included).
    pub remote: &'a BufferHandle,
    /// Where in the remote buffer the bytes start.
    pub remote_offset: u64,
    /// How many bytes.
    pub len: u64,
    /// Overrides the manager's `op_timeout` for this transfer.
    pub timeout: Option<Duration>,
}

/// A registered buffer of this process.
///
/// Peers reach it through its [`handle`](Self::handle). Dropping the buffer
/// deregisters it at once: no new access starts (peers get
/// [`RdmaError::Deregistered`]), and one that is copying may finish. Use
/// [`deregister`](Self::deregister) to also wait for those.
pub struct Buffer {
    entry: Arc<Entry>,
    registry: Arc<Registry>,
    handle: BufferHandle,
}

impl Buffer {
    /// The handle peers use to read and write this buffer.
    pub fn handle(&self) -> BufferHandle {
        self.handle.clone()
    }

    /// The memory this buffer exposes, to fill or inspect it locally (mind
    /// the data-race rule of [`Region`] while transfers run).
    pub fn region(&self) -> &Region {
        &self.entry.region
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.handle.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.handle.len == 0
    }

    /// Deregisters the buffer and waits until no remote access to its memory
    /// runs (RD-6). After this returns, the memory is the caller's alone.
    pub async fn deregister(self) {
        self.registry.remove(self.entry.id);
        self.entry.revoke_and_wait().await;
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.registry.remove(self.entry.id);
        self.entry.revoke();
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("handle", &self.handle)
            .finish()
    }
}

/// Transfers between two buffers of one manager: a memory copy after the
/// checks a peer's request would pass.
struct LocalBackend {
    registry: Arc<Registry>,
}

impl LocalBackend {
    fn run(&self, job: &Job) -> Result<u64, RdmaError> {
        let remote = &job.remote;
        let guard = self
            .registry
            .access(&AccessRequest {
                owner: remote.owner,
                buffer: remote.id,
                key: &remote.key,
                offset: job.remote_offset,
                len: job.len,
            })
            .map_err(|(status, value)| local_refusal(status, value, job))?;
        let remote_ptr = guard.entry.region.as_ptr();
        let local_ptr = job.local.region.as_ptr();
        let len = job.len as usize;
        // SAFETY: both ranges were checked against their regions; both
        // regions are alive (the job and the guard hold them); `copy` allows
        // the ranges to overlap (a buffer copied onto itself).
        unsafe {
            let remote_ptr = remote_ptr.add(job.remote_offset as usize);
            let local_ptr = local_ptr.add(job.local_offset as usize);
            match job.direction {
                Direction::Read => std::ptr::copy(remote_ptr, local_ptr, len),
                Direction::Write => std::ptr::copy(local_ptr, remote_ptr, len),
            }
        }
        Ok(job.len)
    }
}

fn local_refusal(status: Status, value: u64, job: &Job) -> RdmaError {
    let owner = job.remote.owner;
    let id = job.remote.id;
    match status {
        Status::Deregistered => RdmaError::Deregistered { owner, id },
        Status::WrongKey => RdmaError::WrongKey { owner, id },
        Status::OutOfRange => RdmaError::OutOfRange {
            side: Side::Remote,
            offset: job.remote_offset,
            len: job.len,
            buffer_len: value,
        },
        _ => RdmaError::UnknownBuffer { owner, id },
    }
}

impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn transfer(&self, job: Job) -> TransferFuture<'_> {
        let result = self.run(&job);
        Box::pin(async move { result })
    }
}
