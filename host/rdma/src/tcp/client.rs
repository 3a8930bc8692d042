//! The initiator's side: connection pools per peer, chunking and workers.
//!
//! Invariants (tested in `tests.rs`):
//! - RD-1: a transfer ends by its deadline: waiting for a connection slot,
//!   connecting, and every read and write run inside it.
//! - RD-8: when a transfer fails (a chunk failed, the deadline passed, the
//!   manager shut down) its workers are aborted and awaited before the error
//!   is returned, so none of them writes into local memory afterwards.
//! - RD-9: at most `connections_per_peer` connections to one peer carry
//!   chunks at once; idle ones are kept and reused, after a check that the
//!   peer has not closed them.
//!
//! A worker takes a connection slot and a connection for a *turn* of about
//! 16 MiB of chunks, keeps two requests in flight on it (the next request
//! goes out before the current response is read, so the connection never
//! waits a round trip between chunks), then gives the slot back, so that
//! concurrent transfers to the same peer take turns.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::wire::{Op, RESPONSE_LEN, Request, Response, Status};
use super::{connect, stopped};
use crate::backend::{Backend, BackendKind, Direction, Job, TransferFuture};
use crate::error::{RdmaError, Side};
use crate::handle::BufferHandle;
use crate::ibverbs::handshake::{HANDSHAKE_LEN, QpInfo};

/// The TCP backend of one manager.
pub(crate) struct TcpBackend {
    chunk_size: u64,
    connections_per_peer: usize,
    socket_buffer_size: Option<usize>,
    peers: Mutex<HashMap<SocketAddr, Arc<Peer>>>,
    shutdown: watch::Receiver<bool>,
}

/// Connections to one peer address.
struct Peer {
    addr: SocketAddr,
    slots: Arc<Semaphore>,
    idle: Mutex<Vec<TcpStream>>,
    socket_buffer_size: Option<usize>,
}

impl Peer {
    /// An idle connection that is still open, or a new one.
    async fn checkout(&self) -> Result<TcpStream, RdmaError> {
        loop {
            let Some(stream) = self.idle.lock().pop() else {
                break;
            };
            if still_open(&stream) {
                return Ok(stream);
            }
        }
        connect(self.addr, self.socket_buffer_size)
            .await
            .map_err(|err| RdmaError::connection(self.addr, format!("cannot connect: {err}")))
    }

    fn checkin(&self, stream: TcpStream) {
        self.idle.lock().push(stream);
    }
}

/// An idle connection is open when a non-blocking peek finds nothing to read
/// (the owner never sends unasked): end of stream or an error means it closed.
fn still_open(stream: &TcpStream) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    match socket2::SockRef::from(stream).peek(&mut byte) {
        Err(err) => err.kind() == io::ErrorKind::WouldBlock,
        Ok(_) => false,
    }
}

impl TcpBackend {
    pub(crate) fn new(
        chunk_size: usize,
        connections_per_peer: usize,
        socket_buffer_size: Option<usize>,
        shutdown: watch::Receiver<bool>,
    ) -> TcpBackend {
        TcpBackend {
            chunk_size: chunk_size as u64,
            connections_per_peer,
            socket_buffer_size,
            peers: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    fn peer(&self, addr: SocketAddr) -> Arc<Peer> {
        let mut peers = self.peers.lock();
        Arc::clone(peers.entry(addr).or_insert_with(|| {
            Arc::new(Peer {
                addr,
                slots: Arc::new(Semaphore::new(self.connections_per_peer)),
                idle: Mutex::new(Vec::new()),
                socket_buffer_size: self.socket_buffer_size,
            })
        }))
    }

    /// Connections to `addr` waiting in the pool (for tests).
    #[cfg(test)]
    pub(crate) fn idle_connections(&self, addr: SocketAddr) -> usize {
        self.peers
            .lock()
            .get(&addr)
            .map_or(0, |peer| peer.idle.lock().len())
    }

    async fn run(&self, job: Job) -> Result<u64, RdmaError> {
        let peer = self.peer(job.remote.tcp);
        // A zero-length transfer still asks the owner once, so that the
        // handle is checked like any other.
        let chunks = job.len.div_ceil(self.chunk_size).max(1);
        let workers = chunks.min(self.connections_per_peer as u64);
        let plan = Arc::new(Plan {
            job,
            chunk_size: self.chunk_size,
            chunks,
            next: AtomicU64::new(0),
        });
        let mut set = JoinSet::new();
        for _ in 0..workers {
            set.spawn(worker(Arc::clone(&peer), Arc::clone(&plan)));
        }
        let outcome = tokio::select! {
            outcome = join_all(&mut set, peer.addr) => outcome,
            () = tokio::time::sleep_until(plan.job.deadline) => Err(RdmaError::Timeout(plan.job.timeout)),
            () = stopped(self.shutdown.clone()) => Err(RdmaError::Shutdown),
        };
        if outcome.is_err() {
            // RD-8: no worker of a failed transfer outlives it.
            set.shutdown().await;
        }
        outcome.map(|()| plan.job.len)
    }

    /// Runs the ibverbs handshake with the owner of `remote` over a pooled
    /// connection: sends our half, returns theirs.
    #[cfg_attr(not(feature = "ibverbs"), allow(dead_code))]
    pub(crate) async fn handshake(
        &self,
        remote: &BufferHandle,
        ours: &QpInfo,
    ) -> Result<QpInfo, RdmaError> {
        let peer = self.peer(remote.tcp);
        let addr = peer.addr;
        let _slot = peer
            .slots
            .acquire()
            .await
            .map_err(|_| RdmaError::Shutdown)?;
        let mut stream = peer.checkout().await?;
        let request = Request {
            op: Op::IbvConnect,
            owner: remote.owner,
            buffer: remote.id,
            key: remote.key,
            offset: 0,
            len: HANDSHAKE_LEN as u64,
        };
        let broken = |err: io::Error| {
            RdmaError::connection(addr, format!("during the ibverbs handshake: {err}"))
        };
        stream.write_all(&request.encode()).await.map_err(broken)?;
        stream.write_all(&ours.encode()).await.map_err(broken)?;
        let response = read_response(&mut stream, addr).await?;
        if response.status != Status::Ok {
            peer.checkin(stream);
            return Err(status_error(response, remote, 0, 0, addr));
        }
        if response.value != HANDSHAKE_LEN as u64 {
            return Err(RdmaError::protocol(
                addr,
                format!("handshake answer of {} bytes", response.value),
            ));
        }
        let mut message = [0u8; HANDSHAKE_LEN];
        stream.read_exact(&mut message).await.map_err(broken)?;
        peer.checkin(stream);
        QpInfo::decode(&message).map_err(|err| RdmaError::protocol(addr, err))
    }
}

impl Backend for TcpBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Tcp
    }

    fn transfer(&self, job: Job) -> TransferFuture<'_> {
        Box::pin(self.run(job))
    }
}

/// How one transfer is cut into chunks, and which chunk is next.
struct Plan {
    job: Job,
    chunk_size: u64,
    chunks: u64,
    next: AtomicU64,
}

impl Plan {
    /// Takes the next chunk no worker has taken yet.
    fn claim(&self) -> Option<u64> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        (index < self.chunks).then_some(index)
    }

    /// Offset (from the start of the transfer) and length of chunk `index`.
    fn chunk(&self, index: u64) -> (u64, u64) {
        let start = index * self.chunk_size;
        (
            start,
            self.chunk_size.min(self.job.len - start.min(self.job.len)),
        )
    }

    /// Chunks a worker moves per turn on a connection before it lets
    /// other transfers to the same peer have the connection slot.
    fn chunks_per_turn(&self) -> u64 {
        (TURN_BYTES / self.chunk_size).max(PIPELINE_DEPTH as u64)
    }
}

/// Requests a worker keeps outstanding on its connection, so that the
/// connection is not idle for a round trip between chunks.
const PIPELINE_DEPTH: usize = 2;
/// About how many bytes a worker moves before giving its slot back.
const TURN_BYTES: u64 = 16 * 1024 * 1024;

async fn join_all(
    set: &mut JoinSet<Result<(), RdmaError>>,
    addr: SocketAddr,
) -> Result<(), RdmaError> {
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(err),
            Err(err) => {
                return Err(RdmaError::connection(
                    addr,
                    format!("a transfer worker failed: {err}"),
                ));
            }
        }
    }
    Ok(())
}

/// Takes chunks until there are none left. Each turn holds one connection
/// slot and one connection for up to `chunks_per_turn` chunks, pipelined.
async fn worker(peer: Arc<Peer>, plan: Arc<Plan>) -> Result<(), RdmaError> {
    while let Some(first) = plan.claim() {
        let _slot = peer
            .slots
            .acquire()
            .await
            .map_err(|_| RdmaError::Shutdown)?;
        let mut stream = peer.checkout().await?;
        // A failed turn drops its connection: with requests in flight it is
        // no longer in step, and failures are rare enough not to matter.
        run_turn(&mut stream, &plan, first, peer.addr).await?;
        peer.checkin(stream);
    }
    Ok(())
}

async fn run_turn(
    stream: &mut TcpStream,
    plan: &Plan,
    first: u64,
    addr: SocketAddr,
) -> Result<(), RdmaError> {
    let mut in_flight = VecDeque::with_capacity(PIPELINE_DEPTH);
    let mut first = Some(first);
    let mut taken = 0;
    loop {
        while in_flight.len() < PIPELINE_DEPTH && taken < plan.chunks_per_turn() {
            let Some(index) = first.take().or_else(|| plan.claim()) else {
                break;
            };
            taken += 1;
            send_request(stream, plan, index, addr).await?;
            in_flight.push_back(index);
        }
        let Some(index) = in_flight.pop_front() else {
            return Ok(());
        };
        receive_response(stream, plan, index, addr).await?;
    }
}

fn broken(addr: SocketAddr) -> impl Fn(io::Error) -> RdmaError {
    move |err| {
        let reason = if err.kind() == io::ErrorKind::UnexpectedEof {
            "the peer closed the connection in the middle of a chunk".to_string()
        } else {
            err.to_string()
        };
        RdmaError::connection(addr, reason)
    }
}

fn chunk_request(job: &Job, start: u64, len: u64) -> Request {
    Request {
        op: match job.direction {
            Direction::Read => Op::Read,
            Direction::Write => Op::Write,
        },
        owner: job.remote.owner,
        buffer: job.remote.id,
        key: job.remote.key,
        offset: job.remote_offset + start,
        len,
    }
}

/// Sends chunk `index`'s request, and for a write its data.
async fn send_request(
    stream: &mut TcpStream,
    plan: &Plan,
    index: u64,
    addr: SocketAddr,
) -> Result<(), RdmaError> {
    let job = &plan.job;
    let (start, len) = plan.chunk(index);
    let request = chunk_request(job, start, len);
    stream
        .write_all(&request.encode())
        .await
        .map_err(broken(addr))?;
    if job.direction == Direction::Write {
        // SAFETY: the manager checked the local range before the job
        // started; the job holds the entry, so the region outlives the
        // slice; the bytes are only read.
        let source = unsafe {
            job.local
                .region
                .slice((job.local_offset + start) as usize, len as usize)
        };
        stream.write_all(source).await.map_err(broken(addr))?;
    }
    Ok(())
}

/// Reads chunk `index`'s response, and for a read its data.
async fn receive_response(
    stream: &mut TcpStream,
    plan: &Plan,
    index: u64,
    addr: SocketAddr,
) -> Result<(), RdmaError> {
    let job = &plan.job;
    let (start, len) = plan.chunk(index);
    let response = read_response(stream, addr).await?;
    if response.status != Status::Ok {
        return Err(status_error(
            response,
            &job.remote,
            job.remote_offset + start,
            len,
            addr,
        ));
    }
    if response.value != len {
        return Err(RdmaError::protocol(
            addr,
            format!(
                "a chunk of {len} bytes was answered with {}",
                response.value
            ),
        ));
    }
    if job.direction == Direction::Read {
        // SAFETY: the local range was checked; chunk `index` belongs to this
        // worker alone; the job holds the entry, so the region outlives the
        // slice.
        let destination = unsafe {
            job.local
                .region
                .slice_mut((job.local_offset + start) as usize, len as usize)
        };
        stream.read_exact(destination).await.map_err(broken(addr))?;
    }
    Ok(())
}

async fn read_response(stream: &mut TcpStream, addr: SocketAddr) -> Result<Response, RdmaError> {
    let mut header = [0u8; RESPONSE_LEN];
    stream.read_exact(&mut header).await.map_err(|err| {
        let reason = if err.kind() == io::ErrorKind::UnexpectedEof {
            "the peer closed the connection before answering".to_string()
        } else {
            err.to_string()
        };
        RdmaError::connection(addr, reason)
    })?;
    Response::decode(&header).map_err(|err| RdmaError::protocol(addr, err))
}

/// The error for a refusal, with what the initiator knows about the request.
fn status_error(
    response: Response,
    remote: &BufferHandle,
    offset: u64,
    len: u64,
    addr: SocketAddr,
) -> RdmaError {
    let owner = remote.owner;
    let id = remote.id;
    match response.status {
        Status::UnknownBuffer => RdmaError::UnknownBuffer { owner, id },
        Status::Deregistered => RdmaError::Deregistered { owner, id },
        Status::WrongKey => RdmaError::WrongKey { owner, id },
        Status::OutOfRange => RdmaError::OutOfRange {
            side: Side::Remote,
            offset,
            len,
            buffer_len: response.value,
        },
        Status::StaleOwner => RdmaError::StaleHandle { owner, addr },
        Status::NoIbverbs => RdmaError::Refused {
            addr,
            reason: "it has no RDMA device".into(),
        },
        Status::HandshakeFailed => RdmaError::Refused {
            addr,
            reason: "it could not set up its queue pair".into(),
        },
        Status::Ok => RdmaError::protocol(addr, "success reported as a refusal"),
    }
}
