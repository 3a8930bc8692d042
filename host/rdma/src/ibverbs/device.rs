//! The device side of the ibverbs backend (feature `ibverbs`): the opened
//! device, memory registrations, queue pairs and completion polling.
//!
//! Nothing here has run against RDMA hardware (see the module above); the
//! code follows the verbs specification and `sideway`'s API.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    BasicCompletionQueue, PollCompletionQueueError, WorkCompletionStatus,
};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;

use super::handshake::QpInfo;
use crate::backend::{Direction, Job};
use crate::config::IbverbsConfig;
use crate::error::RdmaError;
use crate::handle::{BufferHandle, IbvEndpoint, IbvRemote, ManagerId};
use crate::region::Region;
use crate::tcp::client::TcpBackend;

/// Work completions the completion queue holds; also the most work
/// requests outstanding on all queue pairs of a manager together.
const CQ_DEPTH: u32 = 4096;
/// The largest single RDMA READ or WRITE work request.
const MAX_WORK_REQUEST: u64 = 8 * 1024 * 1024;
/// The most queue pairs a manager serves as responder.
const MAX_RESPONDERS: usize = 4096;

/// A buffer's memory registered with the device; dropping it deregisters.
pub(crate) struct Registration {
    mr: Arc<MemoryRegion>,
}

impl Registration {
    fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
}

/// One manager's open device.
pub(crate) struct IbvState {
    manager: ManagerId,
    pd: Arc<ProtectionDomain>,
    cq: Arc<BasicCompletionQueue>,
    port: u8,
    gid_index: u8,
    endpoint: IbvEndpoint,
    /// Active MTU of the port, as `ibv_mtu`.
    mtu: u8,
    /// RDMA reads this side serves at once as responder.
    responder_reads: u8,
    /// RDMA reads this side may have outstanding as initiator.
    initiator_reads: u8,
    queue_depth: u32,
    completions: Arc<Completions>,
    cq_slots: Arc<Semaphore>,
    /// Queue pairs peers connected to us, by the peer's manager id.
    responders: Mutex<HashMap<ManagerId, BasicQueuePair>>,
    /// Queue pairs we connected to peers.
    initiators: Mutex<HashMap<ManagerId, Arc<Connection>>>,
    /// One handshake at a time per manager.
    connecting: tokio::sync::Mutex<()>,
}

/// Work requests waiting for their completion, and the polling thread's
/// stop flag.
struct Completions {
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
    stop: AtomicBool,
    poller: Mutex<Option<std::thread::Thread>>,
}

struct Pending {
    done: oneshot::Sender<Result<(), String>>,
    /// Keeps the local memory alive until the device is done with it.
    _memory: Region,
    /// The queue pair the request was posted on.
    qpn: u32,
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

/// A queue pair connected to one peer, as initiator.
struct Connection {
    qp: Mutex<Option<BasicQueuePair>>,
    qpn: u32,
    slots: Arc<Semaphore>,
    broken: AtomicBool,
    completions: Arc<Completions>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(mut qp) = self.qp.lock().take() {
            // Moving to the error state flushes what is outstanding;
            // destroying the queue pair ends every use of local memory.
            let mut attr = QueuePairAttribute::new();
            attr.setup_state(QueuePairState::Error);
            let _ = qp.modify(&attr);
            drop(qp);
        }
        // The device will not touch these requests' memory any more; their
        // transfers see the sender dropped.
        self.completions
            .pending
            .lock()
            .retain(|_, pending| pending.qpn != self.qpn);
    }
}

impl Drop for IbvState {
    fn drop(&mut self) {
        self.completions.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.completions.poller.lock().take() {
            thread.unpark();
        }
    }
}

/// The error's message with its sources, for errors whose `Display` alone
/// says little ("failed to open device").
fn describe(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn mtu_from_code(code: u8) -> Option<Mtu> {
    Some(match code {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

impl IbvState {
    /// Opens the configured device and port, or says why not (`NoDevice`).
    pub(crate) fn open(
        config: &IbverbsConfig,
        manager: ManagerId,
    ) -> Result<Arc<IbvState>, RdmaError> {
        let no_device = |what: String| RdmaError::NoDevice(what);
        let list = DeviceList::new()
            .map_err(|err| no_device(format!("cannot list RDMA devices: {}", describe(&err))))?;
        if list.is_empty() {
            return Err(no_device("no RDMA devices found".into()));
        }
        let device = match &config.device {
            Some(name) => list
                .iter()
                .find(|device| device.name() == *name)
                .ok_or_else(|| {
                    let names: Vec<String> = list.iter().map(|device| device.name()).collect();
                    no_device(format!(
                        "device {name} not found (there are: {})",
                        names.join(", ")
                    ))
                })?,
            None => list
                .iter()
                .next()
                .ok_or_else(|| no_device("no RDMA devices found".into()))?,
        };
        let name = device.name();
        let context = device
            .open()
            .map_err(|err| no_device(format!("cannot open {name}: {}", describe(&err))))?;
        let port_attr = context.query_port(config.port).map_err(|err| {
            no_device(format!(
                "cannot query port {} of {name}: {}",
                config.port,
                describe(&err)
            ))
        })?;
        if port_attr.port_state() != PortState::Active {
            return Err(no_device(format!(
                "port {} of {name} is {:?}, not active",
                config.port,
                port_attr.port_state()
            )));
        }
        let gid_index = match config.gid_index {
            Some(index) => index,
            None => pick_gid(
                &context,
                config.port,
                port_attr.gid_tbl_len(),
                port_attr.link_layer(),
            ),
        };
        let gid = context
            .query_gid(config.port, u32::from(gid_index))
            .map(|gid| gid.raw)
            .unwrap_or([0; 16]);
        let lid = port_attr.lid();
        if gid == [0; 16] && lid == 0 {
            return Err(no_device(format!(
                "port {} of {name} has neither a GID at index {gid_index} nor a LID",
                config.port
            )));
        }
        let device_attr = context
            .query_device()
            .map_err(|err| no_device(format!("cannot query {name}: {}", describe(&err))))?;
        let clamp = |value: i32| value.clamp(1, 255) as u8;
        let pd = context.alloc_pd().map_err(|err| {
            no_device(format!(
                "cannot allocate a protection domain on {name}: {}",
                describe(&err)
            ))
        })?;
        let cq = context
            .create_cq_builder()
            .setup_cqe(CQ_DEPTH)
            .build()
            .map_err(|err| {
                no_device(format!(
                    "cannot create a completion queue on {name}: {}",
                    describe(&err)
                ))
            })?;

        let completions = Arc::new(Completions {
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            poller: Mutex::new(None),
        });
        let thread = {
            let cq = Arc::clone(&cq);
            let completions = Arc::clone(&completions);
            std::thread::Builder::new()
                .name(format!("rdma-cq-{name}"))
                .spawn(move || poll_completions(&cq, &completions))
                .map_err(|err| no_device(format!("cannot start the completion thread: {err}")))?
        };
        *completions.poller.lock() = Some(thread.thread().clone());

        tracing::info!(
            device = %name,
            port = config.port,
            gid_index,
            lid,
            "rdma: opened an RDMA device"
        );
        Ok(Arc::new(IbvState {
            manager,
            pd,
            cq,
            port: config.port,
            gid_index,
            endpoint: IbvEndpoint { gid, lid },
            mtu: port_attr.active_mtu() as u32 as u8,
            responder_reads: clamp(device_attr.max_qp_rd_atom()),
            initiator_reads: clamp(device_attr.max_qp_init_rd_atom()),
            queue_depth: config.queue_depth,
            completions,
            cq_slots: Arc::new(Semaphore::new(CQ_DEPTH as usize)),
            responders: Mutex::new(HashMap::new()),
            initiators: Mutex::new(HashMap::new()),
            connecting: tokio::sync::Mutex::new(()),
        }))
    }

    /// Registers a region's memory for local and remote read and write.
    pub(crate) fn register(&self, region: &Region) -> Result<(Registration, IbvRemote), RdmaError> {
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        // SAFETY: the region's memory is valid for its length and does not
        // move while the region lives; the registration is dropped (memory
        // deregistered) when the buffer is revoked, and the entry holding the
        // region outlives the registration.
        let mr = unsafe {
            self.pd
                .reg_mr(region.as_ptr() as usize, region.len(), access)
        }
        .map_err(|err| RdmaError::Ibverbs(format!("ibv_reg_mr: {}", describe(&err))))?;
        let remote = IbvRemote {
            endpoint: self.endpoint,
            addr: region.as_ptr() as u64,
            rkey: mr.rkey(),
        };
        Ok((Registration { mr }, remote))
    }

    fn create_qp(&self) -> Result<BasicQueuePair, RdmaError> {
        let mut qp = self
            .pd
            .create_qp_builder()
            .setup_max_send_wr(self.queue_depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_cq(Arc::clone(&self.cq))
            .setup_recv_cq(Arc::clone(&self.cq))
            .build()
            .map_err(|err| RdmaError::Ibverbs(format!("ibv_create_qp: {}", describe(&err))))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.port)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            );
        qp.modify(&attr)
            .map_err(|err| RdmaError::Ibverbs(format!("queue pair to INIT: {}", describe(&err))))?;
        Ok(qp)
    }

    fn our_info(&self, qp: &BasicQueuePair, psn: u32) -> QpInfo {
        QpInfo {
            manager: self.manager,
            qpn: qp.qp_number(),
            psn,
            lid: self.endpoint.lid,
            gid: self.endpoint.gid,
            mtu: self.mtu,
            max_rd_atomic: self.responder_reads,
        }
    }

    /// Moves a queue pair in INIT to ready-to-send, connected to `peer`.
    fn connect_qp(
        &self,
        qp: &mut BasicQueuePair,
        peer: &QpInfo,
        our_psn: u32,
    ) -> Result<(), RdmaError> {
        let mtu = mtu_from_code(self.mtu.min(peer.mtu)).ok_or_else(|| {
            RdmaError::Ibverbs(format!("no common MTU with peer {}", peer.manager))
        })?;
        let mut path = AddressHandleAttribute::new();
        path.setup_dest_lid(peer.lid)
            .setup_port(self.port)
            .setup_service_level(0);
        if peer.gid != [0; 16] {
            path.setup_grh(&Gid { raw: peer.gid }, 0, self.gid_index, 64, 0);
        }
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(peer.qpn)
            .setup_rq_psn(peer.psn)
            .setup_max_dest_read_atomic(self.responder_reads)
            .setup_min_rnr_timer(12)
            .setup_address_vector(&path);
        qp.modify(&attr)
            .map_err(|err| RdmaError::Ibverbs(format!("queue pair to RTR: {}", describe(&err))))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(our_psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(self.initiator_reads.min(peer.max_rd_atomic));
        qp.modify(&attr)
            .map_err(|err| RdmaError::Ibverbs(format!("queue pair to RTS: {}", describe(&err))))?;
        Ok(())
    }

    /// The owner's side of the handshake: a queue pair for the initiator,
    /// connected to it; returns our half.
    pub(crate) fn accept(&self, initiator: &QpInfo) -> Result<QpInfo, RdmaError> {
        {
            let responders = self.responders.lock();
            if responders.len() >= MAX_RESPONDERS && !responders.contains_key(&initiator.manager) {
                return Err(RdmaError::Ibverbs(format!(
                    "already serving {MAX_RESPONDERS} queue pairs"
                )));
            }
        }
        let mut qp = self.create_qp()?;
        let psn = QpInfo::random_psn();
        self.connect_qp(&mut qp, initiator, psn)?;
        let ours = self.our_info(&qp, psn);
        // A peer that connects again (its old queue pair failed) replaces
        // the old one, which is destroyed here.
        self.responders.lock().insert(initiator.manager, qp);
        Ok(ours)
    }

    /// The connected queue pair to the owner of `remote`, connecting one
    /// (over the owner's TCP listener) if there is none or it failed.
    async fn connection(
        &self,
        remote: &BufferHandle,
        tcp: &TcpBackend,
        deadline: Instant,
    ) -> Result<Arc<Connection>, RdmaError> {
        let live = |map: &HashMap<ManagerId, Arc<Connection>>| {
            map.get(&remote.owner)
                .filter(|connection| !connection.broken.load(Ordering::SeqCst))
                .cloned()
        };
        if let Some(connection) = live(&self.initiators.lock()) {
            return Ok(connection);
        }
        let timeout = || RdmaError::Timeout(deadline.saturating_duration_since(Instant::now()));
        let _one_at_a_time = tokio::time::timeout_at(deadline, self.connecting.lock())
            .await
            .map_err(|_| timeout())?;
        if let Some(connection) = live(&self.initiators.lock()) {
            return Ok(connection);
        }
        let mut qp = self.create_qp()?;
        let psn = QpInfo::random_psn();
        let ours = self.our_info(&qp, psn);
        let theirs = tokio::time::timeout_at(deadline, tcp.handshake(remote, &ours))
            .await
            .map_err(|_| timeout())??;
        if theirs.manager != remote.owner {
            return Err(RdmaError::protocol(
                remote.tcp,
                format!(
                    "handshake answered by manager {}, not {}",
                    theirs.manager, remote.owner
                ),
            ));
        }
        self.connect_qp(&mut qp, &theirs, psn)?;
        let connection = Arc::new(Connection {
            qpn: qp.qp_number(),
            qp: Mutex::new(Some(qp)),
            slots: Arc::new(Semaphore::new(self.queue_depth as usize)),
            broken: AtomicBool::new(false),
            completions: Arc::clone(&self.completions),
        });
        self.initiators
            .lock()
            .insert(remote.owner, Arc::clone(&connection));
        tracing::debug!(peer = %remote.owner, qpn = connection.qpn, "rdma: queue pair connected");
        Ok(connection)
    }

    /// Connects a queue pair to the owner of `remote` if there is none.
    pub(crate) async fn connect(
        &self,
        remote: &BufferHandle,
        tcp: &TcpBackend,
        deadline: Instant,
    ) -> Result<(), RdmaError> {
        self.connection(remote, tcp, deadline).await.map(|_| ())
    }

    /// Takes a failed queue pair out of use; the next transfer connects anew.
    fn retire(&self, peer: ManagerId, connection: &Arc<Connection>) {
        connection.broken.store(true, Ordering::SeqCst);
        let mut initiators = self.initiators.lock();
        if initiators
            .get(&peer)
            .is_some_and(|current| Arc::ptr_eq(current, connection))
        {
            initiators.remove(&peer);
        }
    }

    /// Runs one transfer: a signaled RDMA READ or WRITE per piece of at most
    /// [`MAX_WORK_REQUEST`] bytes, then waits for all completions.
    pub(crate) async fn transfer(&self, job: Job, tcp: &TcpBackend) -> Result<u64, RdmaError> {
        let remote = job
            .remote
            .ibverbs
            .ok_or_else(|| RdmaError::Ibverbs("the handle has no ibverbs endpoint".into()))?;
        let lkey = job
            .local
            .ibverbs
            .lock()
            .as_ref()
            .map(Registration::lkey)
            .ok_or_else(|| RdmaError::Ibverbs("the local buffer is no longer registered".into()))?;
        let connection = self.connection(&job.remote, tcp, job.deadline).await?;
        let timeout = RdmaError::Timeout(job.timeout);

        let mut waiting = Vec::new();
        let mut start = 0;
        // A zero-length transfer posts one empty request, so that the
        // owner's rkey is still checked.
        while start < job.len || (job.len == 0 && waiting.is_empty()) {
            let len = MAX_WORK_REQUEST.min(job.len - start);
            let slots = tokio::time::timeout_at(job.deadline, async {
                let queue = Arc::clone(&connection.slots).acquire_owned().await;
                let cq = Arc::clone(&self.cq_slots).acquire_owned().await;
                queue.and_then(|queue| cq.map(|cq| (queue, cq)))
            })
            .await
            .map_err(|_| timeout.clone())?
            .map_err(|_| RdmaError::Shutdown)?;
            let (done, finished) = oneshot::channel();
            let id = self.completions.next_id.fetch_add(1, Ordering::Relaxed);
            self.completions.pending.lock().insert(
                id,
                Pending {
                    done,
                    _memory: job.local.region.clone(),
                    qpn: connection.qpn,
                    _slots: slots,
                },
            );
            let local_addr = job.local.region.as_ptr() as u64 + job.local_offset + start;
            let remote_addr = remote.addr + job.remote_offset + start;
            if let Err(err) = post(
                &connection,
                job.direction,
                id,
                lkey,
                local_addr,
                remote.rkey,
                remote_addr,
                len,
            ) {
                self.completions.pending.lock().remove(&id);
                self.retire(job.remote.owner, &connection);
                return Err(err);
            }
            if let Some(thread) = self.completions.poller.lock().as_ref() {
                thread.unpark();
            }
            waiting.push(finished);
            start += len;
        }

        let all = async {
            for finished in waiting {
                match finished.await {
                    Ok(Ok(())) => {}
                    Ok(Err(reason)) => return Err(RdmaError::Ibverbs(reason)),
                    Err(_) => {
                        return Err(RdmaError::Ibverbs(
                            "the queue pair was closed before the request completed".into(),
                        ));
                    }
                }
            }
            Ok(())
        };
        match tokio::time::timeout_at(job.deadline, all).await {
            Ok(Ok(())) => Ok(job.len),
            Ok(Err(err)) => {
                self.retire(job.remote.owner, &connection);
                Err(err)
            }
            Err(_) => {
                // The queue pair may be stuck; retiring it (and destroying
                // it once no transfer uses it) stops its requests.
                self.retire(job.remote.owner, &connection);
                Err(timeout)
            }
        }
    }
}

/// Posts one signaled RDMA READ or WRITE.
#[allow(clippy::too_many_arguments)]
fn post(
    connection: &Connection,
    direction: Direction,
    id: u64,
    lkey: u32,
    local_addr: u64,
    rkey: u32,
    remote_addr: u64,
    len: u64,
) -> Result<(), RdmaError> {
    let mut qp = connection.qp.lock();
    let qp = qp
        .as_mut()
        .ok_or_else(|| RdmaError::Ibverbs("the queue pair has been closed".into()))?;
    let mut guard = qp.start_post_send();
    let request = guard.construct_wr(id, WorkRequestFlags::Signaled);
    let request = match direction {
        Direction::Read => request.setup_read(rkey, remote_addr),
        Direction::Write => request.setup_write(rkey, remote_addr),
    };
    // SAFETY: the local range is inside a registered region (checked by the
    // manager), and the pending entry keeps the region alive until the
    // completion arrives or the queue pair is destroyed.
    unsafe { request.setup_sge(lkey, local_addr, len as u32) };
    guard
        .post()
        .map_err(|err| RdmaError::Ibverbs(format!("ibv_post_send: {}", describe(&err))))
}

/// The polling thread: hands completions to their transfers; sleeps when
/// nothing is outstanding.
fn poll_completions(cq: &BasicCompletionQueue, completions: &Completions) {
    while !completions.stop.load(Ordering::SeqCst) {
        match cq.start_poll() {
            Ok(poller) => {
                for completion in poller {
                    let status = completion.status();
                    let result = if status == WorkCompletionStatus::Success as u32 {
                        Ok(())
                    } else {
                        Err(format!(
                            "work request failed: {} (status {status}, vendor error {:#x})",
                            status_text(status),
                            completion.vendor_err()
                        ))
                    };
                    if let Some(pending) = completions.pending.lock().remove(&completion.wr_id()) {
                        let _ = pending.done.send(result);
                    }
                }
            }
            Err(PollCompletionQueueError::CompletionQueueEmpty) => {
                if completions.pending.lock().is_empty() {
                    std::thread::park_timeout(Duration::from_millis(10));
                } else {
                    std::thread::yield_now();
                }
            }
            Err(err) => {
                tracing::warn!(error = %describe(&err), "rdma: polling the completion queue failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn status_text(status: u32) -> &'static str {
    use WorkCompletionStatus as S;
    let known = [
        (S::LocalLengthError, "local length error"),
        (
            S::LocalQueuePairOperationError,
            "local queue pair operation error",
        ),
        (
            S::LocalProtectionError,
            "local protection error (local buffer deregistered?)",
        ),
        (
            S::WorkRequestFlushedError,
            "flushed (the queue pair failed earlier)",
        ),
        (S::RemoteInvalidRequestError, "remote invalid request"),
        (
            S::RemoteAccessError,
            "remote access error (the buffer was deregistered, or the rkey or range is wrong)",
        ),
        (S::RemoteOperationError, "remote operation error"),
        (
            S::RetryCounterExceededError,
            "retry count exceeded (the peer is unreachable)",
        ),
        (
            S::ResponderNotReadyRetryCounterExceededError,
            "receiver-not-ready retries exceeded",
        ),
        (S::FatalError, "fatal error"),
        (S::GeneralError, "general error"),
    ];
    known
        .iter()
        .find(|(code, _)| *code as u32 == status)
        .map_or("error", |(_, text)| text)
}

/// Picks a GID: a RoCE v2 IPv4-mapped one if any, else any RoCE v2, else
/// the first non-zero one, else index 0 (InfiniBand addresses by LID).
fn pick_gid(context: &DeviceContext, port: u8, table_len: i32, link: LinkLayer) -> u8 {
    if link == LinkLayer::InfiniBand {
        return 0;
    }
    let mut best: Option<(u8, u8)> = None;
    for index in 0..table_len.clamp(0, 256) as u32 {
        let Ok(gid) = context.query_gid(port, index) else {
            continue;
        };
        if gid.is_zero() {
            continue;
        }
        let roce_v2 = context
            .query_gid_type(port, index)
            .is_ok_and(|kind| kind == 1);
        let ipv4 = gid.raw[..10] == [0; 10] && gid.raw[10..12] == [0xff, 0xff];
        let rank = match (roce_v2, ipv4) {
            (true, true) => 3,
            (true, false) => 2,
            _ => 1,
        };
        if best.is_none_or(|(_, best_rank)| rank > best_rank) {
            best = Some((index as u8, rank));
        }
    }
    best.map_or(0, |(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_a_device_says_no_rdma_device() {
        let err = match IbvState::open(&IbverbsConfig::default(), ManagerId([1; 16])) {
            Ok(_) => {
                // A machine with RDMA hardware: nothing to check here.
                return;
            }
            Err(err) => err,
        };
        assert!(matches!(err, RdmaError::NoDevice(_)), "{err}");
        assert!(err.to_string().starts_with("no RDMA device: "), "{err}");
    }

    #[test]
    fn mtu_codes_outside_the_verbs_range_are_refused() {
        assert!(mtu_from_code(0).is_none());
        assert!(mtu_from_code(6).is_none());
        assert_eq!(mtu_from_code(5), Some(Mtu::Mtu4096));
    }

    #[test]
    fn completion_statuses_have_readable_names() {
        assert!(
            status_text(WorkCompletionStatus::RemoteAccessError as u32).contains("deregistered")
        );
        assert_eq!(status_text(9999), "error");
    }
}
