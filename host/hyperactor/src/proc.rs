//! Procs: where actors live, and the router between their mailboxes.
//!
//! A [`Proc`] serves one channel address. It routes each message to a local
//! mailbox directly, as the value itself, or to another proc through the
//! link for that proc's address. It receives other procs' frames on its
//! listener, validates them, drops duplicates, and acknowledges in batches.
//!
//! Invariants:
//! - PR-1: messages from one sender actor to one receiver actor arrive in the
//!   order they were sent, across procs and across reconnects (one link per
//!   destination, sequence numbers, in-order delivery per session).
//! - PR-2: a bad frame (garbage, truncated, oversized, misaligned, an invalid
//!   archive) closes only the connection that carried it; the proc and its
//!   other connections go on.
//! - PR-3: a message that cannot be delivered comes back to its sender as an
//!   [`Undeliverable`], and the call waiting on it fails (DF-1).
//! - PR-6: a proc with a cluster token ([`ProcConfig::cluster_token`])
//!   accepts only connections whose handshake carries the same token; any
//!   other is closed before a single message is delivered.
//! - PR-7: a proc restarted at the same address (a new incarnation) tells
//!   a sender whose link began with the old one so (`Restarted`), instead
//!   of refusing its frames as a sequence gap forever; the sender's link
//!   dies at once (LK-7), failing what it held, and the next message opens
//!   a fresh session.
//! - PR-8: a receiver forgets a sender's session once it has had no
//!   connection for `session_ttl` (at least twice the delivery timeout, by
//!   which the sender's link has died), so memory stays flat as peers come
//!   and go.
//! - PR-9: a receiver stops reading a connection while an actor it just fed
//!   holds more than `port_window` queued messages, until that actor's
//!   queue is down to half, so a fast sender fills its link's window
//!   (LK-8) and waits instead of growing the receiver's memory. A queue
//!   that does not move for `PORT_STALL` (its actor is waiting on
//!   something, perhaps a reply behind it on this very connection) lets
//!   reading go on: a bound never becomes a deadlock.
//! - PR-10: a connection another proc dialed becomes this proc's way back to
//!   it (LK-9): the link to the address its hello names adopts it, unless
//!   that link keeps a connection it dialed itself (the smaller proc id's
//!   dial stays). The connection's reader then hands acknowledgements to
//!   that link and writes its own through it.
//! - PR-11: while PR-9 holds back an actor's messages, a connection that a
//!   link of this proc writes on (PR-10) is still read: its
//!   acknowledgements reach that link, and its data frames wait in order,
//!   unacknowledged, up to `link_window` bytes, so the peer's window
//!   still fills and stops it. One direction's backlog never stalls the
//!   other's acknowledgements.
//! - PR-12: a proc whose connections may not busy-poll
//!   ([`Proc::set_busy_poll`]) sleeps in epoll as soon as a connection has
//!   nothing to read; it never spins on a core its peers need.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rkyv::rancor;
use rkyv::util::AlignedVec;
use tokio::sync::{mpsc, watch};

use crate::FastMap;
use crate::actor::{self, Actor, ActorHandle, Owner, meta_for};
use crate::channel::frame::{
    FrameError, FrameHeader, FrameKind, FrameReader, HEADER_LEN, compact_frame, finish_frame,
    frame_buffer, scratch_frame, small_frame,
};
use crate::channel::link::{Link, LinkConfig, Reader};
use crate::channel::transport::{Conn, Listener, ReadHalf, WriteHalf};
use crate::channel::{ChannelAddr, ChannelStats};
use crate::failure::{ActorSupervisionEvent, DeliveryFailure, Undeliverable};
use crate::id::{ActorId, ArchivedPortId, IdParseError, PortId, ProcId, validate_name};
use crate::impair::{Admit, Held, Impairments};
use crate::mailbox::{Backlog, Mailbox, MailboxEntry, Meta, Payload, TypeName, UNDELIVERABLE_PORT};
use crate::message::{
    ArchivedBody, ArchivedEnvelope, Body, Envelope, RemoteMessage, encode_envelope,
};
use crate::sim::Simulation;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a busy-polling connection holds its worker between yields.
const SPIN_SLICE: Duration = Duration::from_micros(5);
/// CPU pauses between two reads of a busy-polling connection.
const SPIN_PAUSES: usize = 10;
/// How far off a connection's acknowledgement timer waits while nothing
/// needs acknowledging: it is moved, not made anew, for the next deadline.
const ACK_TIMER_PARKED: Duration = Duration::from_secs(3600);
/// The longest a busy-polling connection polls (see [`Pace`]).
const SPIN_MAX: Duration = Duration::from_millis(1);
/// How long a waiter that lost the CPU while it polled polls only its
/// floor.
const CALM: Duration = Duration::from_millis(100);
/// How much of a poll's time a thread may spend off the CPU before the
/// poll counts as contended: more than a kernel thread or a timer takes,
/// less than one time slice of another process.
const LOST: Duration = Duration::from_micros(200);

/// How long a waiter polls before it sleeps: its floor, or twice as long
/// as what it waits for has lately taken to come, up to a ceiling, so that
/// a conversation whose turns take a little longer than the floor (a call
/// to a handler that computes for 20 us) does not pay a sleeping thread's
/// wake-up on every turn, which costs tens of microseconds on virtual
/// machines. Never when the floor is zero; only the floor when what it
/// waits for comes later than the ceiling would reach.
///
/// Polling pays only while the CPU is otherwise idle: a thread that sleeps
/// is given the CPU back at once when woken, one that polls waits its turn
/// behind other processes. So a waiter that lost the CPU for a while during
/// a poll past its floor (another process wanted it) polls only its floor
/// for the next 100 ms.
#[derive(Debug, Clone)]
pub struct Pace {
    floor: Duration,
    ceiling: Duration,
    /// How long what it waits for has lately taken (a moving average).
    typical: Duration,
    /// Until when it polls only its floor, after a contended poll.
    calm_until: Option<std::time::Instant>,
}

/// When a poll began, by the clock and by this thread's CPU time; what
/// [`Pace::polled`] needs.
#[derive(Debug, Clone, Copy)]
pub struct Polling(Option<(std::time::Instant, Duration)>);

impl Pace {
    /// A pace that polls at least `floor` and at most `ceiling`.
    pub fn new(floor: Duration, ceiling: Duration) -> Self {
        Pace {
            floor,
            ceiling: ceiling.max(floor),
            typical: floor / 2,
            calm_until: None,
        }
    }

    /// How long the next wait polls.
    pub fn budget(&self) -> Duration {
        let twice = self.typical * 2;
        let calm = self
            .calm_until
            .is_some_and(|until| std::time::Instant::now() < until);
        if self.floor.is_zero() || calm || twice > self.ceiling {
            return self.floor;
        }
        twice.max(self.floor)
    }

    /// What the waiter waited for came `after` it began to wait.
    pub fn came(&mut self, after: Duration) {
        self.typical = (self.typical * 3 + after.min(self.ceiling * 4)) / 4;
    }

    /// A poll of `budget` begins.
    pub fn polling(&self, budget: Duration) -> Polling {
        let cpu = (budget > self.floor).then(thread_cpu_time).flatten();
        Polling(cpu.map(|cpu| (std::time::Instant::now(), cpu)))
    }

    /// The poll that `polling` began has ended: if the thread spent more
    /// than a moment of it off the CPU, the waits of the next 100 ms poll
    /// only the floor.
    pub fn polled(&mut self, polling: Polling) {
        let Some((began, cpu_then)) = polling.0 else {
            return;
        };
        let Some(cpu_now) = thread_cpu_time() else {
            return;
        };
        let off_cpu = began
            .elapsed()
            .saturating_sub(cpu_now.saturating_sub(cpu_then));
        if off_cpu > LOST {
            self.calm_until = Some(std::time::Instant::now() + CALM);
        }
    }
}

/// The CPU time this thread has used.
fn thread_cpu_time() -> Option<Duration> {
    cpu_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The CPU time `clock` (a CPU-time clock of this thread or process) reads.
fn cpu_time(clock: libc::clockid_t) -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into memory we own.
    let done = unsafe { libc::clock_gettime(clock, &mut now) };
    let secs = u64::try_from(now.tv_sec).ok()?;
    let nanos = u32::try_from(now.tv_nsec).ok()?;
    (done == 0).then(|| Duration::new(secs, nanos))
}

/// Settings of a proc. Every field has a default that suits one machine.
#[derive(Debug, Clone)]
pub struct ProcConfig {
    /// How long a link keeps trying to reach a peer before it reports the
    /// messages waiting for it undeliverable. Default 30 s.
    pub delivery_timeout: Duration,
    /// How long [`ActorRef::call`](crate::ActorRef::call) waits for a reply.
    /// Default 60 s.
    pub call_timeout: Duration,
    /// The largest frame accepted or sent, in bytes. Default 64 MiB.
    pub max_frame_size: usize,
    /// How long a receiver may hold an acknowledgement. Default 5 ms.
    pub ack_interval: Duration,
    /// A receiver acknowledges at least every this many frames. Default 512.
    pub ack_every: u64,
    /// How long a connection keeps polling for the next frame before its
    /// task sleeps, trading a little CPU for latency. Zero turns it off.
    /// A connection whose frames have lately come a little later than this
    /// (a peer that computes for tens of microseconds between them) polls
    /// up to twice as long as they took, at most 1 ms. Default 50 us.
    pub busy_poll: Duration,
    /// A shared secret of the procs of one cluster: sent in the handshake
    /// of every link this proc opens, and, when set, required of every
    /// connection it accepts (PR-6). Default none: no check.
    pub cluster_token: Option<ClusterToken>,
    /// How long a receiver remembers a sender's session once its last
    /// connection closed (PR-8); at least twice `delivery_timeout`, past
    /// which the sender's link is dead anyway. Default 10 min.
    pub session_ttl: Duration,
    /// Unacknowledged bytes a link to one peer holds before
    /// [`Mailbox::ready`] makes a sender wait (LK-8). Default 8 MiB.
    pub link_window: usize,
    /// Queued messages of one actor past which a receiver stops reading
    /// the connection that feeds it (PR-9). Default 8192.
    pub port_window: usize,
}

/// How long a queue over its window may stay still before the receiver
/// reads on regardless (PR-9).
const PORT_STALL: Duration = Duration::from_millis(250);

/// A cluster token; its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterToken(String);

impl ClusterToken {
    /// A token; `None` for an empty one.
    pub fn new(token: &str) -> Option<ClusterToken> {
        (!token.is_empty()).then(|| ClusterToken(token.to_string()))
    }

    /// Whether `other` is this token, in time that does not depend on
    /// where they differ.
    pub fn matches(&self, other: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        let mut diff = mine.len() ^ other.len();
        for i in 0..mine.len().max(other.len()) {
            diff |=
                (mine.get(i).copied().unwrap_or(0) ^ other.get(i).copied().unwrap_or(0)) as usize;
        }
        diff == 0
    }

    /// The token's text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(..)")
    }
}

impl Default for ProcConfig {
    fn default() -> Self {
        ProcConfig {
            delivery_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
            max_frame_size: 64 << 20,
            ack_interval: Duration::from_millis(5),
            ack_every: 512,
            busy_poll: Duration::from_micros(50),
            cluster_token: None,
            session_ttl: Duration::from_secs(600),
            link_window: 8 << 20,
            port_window: 8192,
        }
    }
}

/// Why a proc could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// The listener could not be bound.
    #[error("cannot serve on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: ChannelAddr,
        /// The system's reason.
        source: std::io::Error,
    },
    /// A name is not valid in an identity.
    #[error(transparent)]
    Name(#[from] IdParseError),
    /// A live actor or client already has this name and rank.
    #[error("{0} already exists in this proc")]
    Duplicate(ActorId),
    /// Not called from inside a tokio runtime.
    #[error("a proc must be created inside a tokio runtime")]
    NoRuntime,
}

type Session = Arc<Mutex<u64>>;

/// What a receiver keeps of one sender's session: the last sequence
/// number delivered, its open connections, and since when it has had none.
struct SessionSlot {
    last: Session,
    open: usize,
    closed_at: std::time::Instant,
}

pub(crate) struct ProcInner {
    id: ProcId,
    config: ProcConfig,
    runtime: tokio::runtime::Handle,
    actors: RwLock<FastMap<String, FastMap<u32, Arc<MailboxEntry>>>>,
    links: Mutex<FastMap<ChannelAddr, Arc<Link<Option<Meta>>>>>,
    /// Peers known to have ended ([`Proc::peer_ended`]), with why.
    ended: Mutex<HashMap<ChannelAddr, String>>,
    sessions: Mutex<HashMap<u64, SessionSlot>>,
    supervision_tx: mpsc::UnboundedSender<ActorSupervisionEvent>,
    supervision_rx: Mutex<Option<mpsc::UnboundedReceiver<ActorSupervisionEvent>>>,
    stats: Arc<ChannelStats>,
    /// Whether connections may busy-poll ([`Proc::set_busy_poll`]).
    polling: Arc<AtomicBool>,
    shutdown: watch::Sender<bool>,
    /// Faults made on purpose to the messages it sends ([`Proc::cut_to`]).
    impairments: Impairments,
    /// Ended as by a crash ([`Proc::crash`]).
    crashed: AtomicBool,
}

impl ProcInner {
    pub(crate) fn runtime_handle(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    pub(crate) fn proc_id(&self) -> &ProcId {
        &self.id
    }

    pub(crate) fn config_ref(&self) -> &ProcConfig {
        &self.config
    }

    pub(crate) fn impairments(&self) -> &Impairments {
        &self.impairments
    }
}

impl Drop for ProcInner {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        if let ChannelAddr::Local(name) = self.id.addr() {
            let mut procs = IN_PROCESS.write();
            if procs.get(name).is_some_and(|proc| proc.strong_count() == 0) {
                procs.remove(name);
            }
        }
    }
}

/// The `local:` procs of this process, by name: messages between them are
/// handed over as values, like messages inside one proc, never encoded.
static IN_PROCESS: std::sync::LazyLock<RwLock<HashMap<String, Weak<ProcInner>>>> =
    std::sync::LazyLock::new(Default::default);

/// A proc: a set of actors behind one channel address. Cheap to clone.
#[derive(Clone)]
pub struct Proc(Arc<ProcInner>);

impl Proc {
    /// Serves a proc named `name` on `addr` with the default settings.
    pub async fn serve(name: &str, addr: ChannelAddr) -> Result<Proc, ProcError> {
        Self::serve_with_config(name, addr, ProcConfig::default()).await
    }

    /// Serves a proc named `name` on `addr`. A TCP port 0 picks a free port;
    /// [`Proc::id`] tells which.
    pub async fn serve_with_config(
        name: &str,
        addr: ChannelAddr,
        config: ProcConfig,
    ) -> Result<Proc, ProcError> {
        validate_name(name)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| ProcError::NoRuntime)?;
        let (listener, bound) = Listener::bind(&addr)
            .await
            .map_err(|source| ProcError::Bind { addr, source })?;
        let (supervision_tx, supervision_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(ProcInner {
            id: ProcId::new(bound, name)?,
            config,
            runtime,
            actors: RwLock::new(FastMap::default()),
            links: Mutex::new(FastMap::default()),
            ended: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            supervision_tx,
            supervision_rx: Mutex::new(Some(supervision_rx)),
            stats: Arc::default(),
            polling: Arc::new(AtomicBool::new(true)),
            shutdown: watch::Sender::new(false),
            impairments: Impairments::default(),
            crashed: AtomicBool::new(false),
        });
        let shutdown = inner.shutdown.subscribe();
        if let ChannelAddr::Local(name) = inner.id.addr() {
            IN_PROCESS
                .write()
                .insert(name.clone(), Arc::downgrade(&inner));
        }
        inner
            .runtime
            .spawn(accept_loop(Arc::downgrade(&inner), listener, shutdown));
        inner.runtime.spawn(session_sweeper(Arc::downgrade(&inner)));
        tracing::debug!(proc = %inner.id, "serving");
        Ok(Proc(inner))
    }

    pub(crate) fn from_inner(inner: Arc<ProcInner>) -> Proc {
        Proc(inner)
    }

    /// Delays every message this proc sends to the proc at `peer` by
    /// `delay`, for `duration` from now, keeping their order (IM-1, IM-2
    /// in `impair.rs`): half of a slow network between two procs, made on
    /// purpose; the peer's [`Proc::delay_to`] this proc is the other half.
    pub fn delay_to(&self, peer: &ChannelAddr, delay: Duration, duration: Duration) {
        self.0.impairments.delay(peer, delay, duration);
    }

    /// Holds every message this proc sends to the proc at `peer` for
    /// `duration` from now, as a link holds them while it cannot connect;
    /// one held past the delivery timeout fails as undeliverable (IM-3):
    /// half of a network cut made on purpose.
    pub fn cut_to(&self, peer: &ChannelAddr, duration: Duration) {
        self.0.impairments.cut(peer, duration);
    }

    /// Ends the delays and cuts to `peer` (every peer: None) now; what
    /// they held goes on at once, in order (IM-4).
    pub fn heal_to(&self, peer: Option<&ChannelAddr>) {
        self.0.impairments.heal(peer);
        if let Some(sim) = Simulation::current() {
            sim.heal(self.0.id.addr(), peer);
        }
    }

    /// Ends this proc as a crash of its process would, for a proc that
    /// shares its process with others (a simulation's): from now on it
    /// sends nothing, and every message to it from another proc fails as
    /// to an unreachable proc. Its actors are left to the embedding to
    /// stop, as a dead process's are never stopped.
    pub fn crash(&self) {
        self.0.crashed.store(true, Ordering::Relaxed);
    }

    /// Whether [`Proc::crash`] ended it.
    pub fn crashed(&self) -> bool {
        self.0.crashed.load(Ordering::Relaxed)
    }

    /// The peers this proc's messages to are delayed or cut now.
    pub fn impaired_peers(&self) -> Vec<ChannelAddr> {
        self.0.impairments.impaired_peers()
    }

    /// This proc's id; its address is where other procs reach it.
    pub fn id(&self) -> &ProcId {
        &self.0.id
    }

    /// This proc's settings.
    pub fn config(&self) -> &ProcConfig {
        &self.0.config
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.0.runtime
    }

    /// Channel counters: retransmissions, reconnects, duplicates dropped, bad frames.
    pub fn stats(&self) -> &ChannelStats {
        &self.0.stats
    }

    /// Lets this proc's connections busy-poll for their next frame
    /// (`ProcConfig::busy_poll`), or makes them sleep at once while `on`
    /// is false: a proc whose peers run on this machine's every core
    /// should not hold one of them spinning (PR-12).
    pub fn set_busy_poll(&self, on: bool) {
        self.0.polling.store(on, Ordering::Relaxed);
    }

    /// Spawns a root actor `name[rank]`. Its supervision events go to
    /// [`Proc::supervision_events`].
    pub fn spawn<A: Actor>(
        &self,
        name: &str,
        rank: u32,
        actor: A,
    ) -> Result<ActorHandle<A>, ProcError> {
        let owner: Arc<dyn Owner> = Arc::new(ProcOwner(self.0.supervision_tx.clone()));
        self.spawn_owned(name, rank, actor, owner)
    }

    pub(crate) fn spawn_owned<A: Actor>(
        &self,
        name: &str,
        rank: u32,
        actor: A,
        owner: Arc<dyn Owner>,
    ) -> Result<ActorHandle<A>, ProcError> {
        let id = self.0.id.actor_id(name, rank)?;
        actor::start(self, id, actor, owner)
    }

    /// A mailbox for code that is not an actor (a controller, a test, a
    /// benchmark), named `name[0]`, and the receiver of its undeliverable
    /// messages. The mailbox leaves the proc when its last clone is dropped.
    pub fn attach(
        &self,
        name: &str,
    ) -> Result<(Mailbox, mpsc::UnboundedReceiver<Undeliverable>), ProcError> {
        let id = self.0.id.actor_id(name, 0)?;
        let entry = Arc::new(MailboxEntry::new(id, Box::new(|| false)));
        self.register(entry.clone())?;
        Ok(Mailbox::for_client(self.clone(), entry))
    }

    /// The supervision events of root actors that failed. Can be taken once;
    /// events are kept until then.
    pub fn supervision_events(&self) -> Option<mpsc::UnboundedReceiver<ActorSupervisionEvent>> {
        self.0.supervision_rx.lock().take()
    }

    /// Tells this proc that the proc at `addr` has ended (its process
    /// exited, or it was stopped): the link to it dies at once instead of
    /// retrying for the delivery timeout, so messages it still holds come
    /// back as undeliverable and calls waiting on replies from there fail
    /// now, with `reason`.
    pub fn peer_ended(&self, addr: &ChannelAddr, reason: &str) {
        self.0
            .ended
            .lock()
            .entry(addr.clone())
            .or_insert_with(|| reason.to_string());
        let link = self.0.links.lock().get(addr).cloned();
        match link {
            Some(link) => link.end(reason.to_string()),
            None => {
                let failure = DeliveryFailure::Unreachable {
                    addr: addr.to_string(),
                    timeout_ms: 0,
                    detail: reason.to_string(),
                };
                let entries: Vec<Arc<MailboxEntry>> = self
                    .0
                    .actors
                    .read()
                    .values()
                    .flat_map(|ranks| ranks.values().cloned())
                    .collect();
                for entry in entries {
                    entry.fail_expecting(addr, &failure);
                }
            }
        }
    }

    /// Why the peer at `addr` ended, if [`Proc::peer_ended`] said it did:
    /// senders that know this fail their requests to it at once instead of
    /// waiting for a link to time out.
    pub fn ended_peer(&self, addr: &ChannelAddr) -> Option<String> {
        self.0.ended.lock().get(addr).cloned()
    }

    /// Waits until a message to `dest` may be sent without queuing past the
    /// window of the link to its proc (LK-8): at once within this process
    /// or while the link has room, else when the peer acknowledges enough.
    /// A sender that may outrun its receiver awaits this before each send.
    pub async fn ready(&self, dest: &ActorId) {
        // No link is past its window: one load, the common case.
        if self.0.stats.links_over_window.load(Ordering::Relaxed) == 0 {
            return;
        }
        let addr = dest.proc_id().addr();
        if matches!(addr, ChannelAddr::Local(_)) && self.in_process(dest).is_some() {
            return;
        }
        let link = self.0.links.lock().get(addr).cloned();
        if let Some(link) = link {
            link.ready().await;
        }
    }

    /// Whether every link of this proc has room in its window now (LK-8):
    /// [`Proc::ready_all`] would return at once. One atomic load.
    pub fn all_ready_now(&self) -> bool {
        self.0.stats.links_over_window.load(Ordering::Relaxed) == 0
    }

    /// A reference to this proc that does not keep it alive.
    pub(crate) fn downgrade(&self) -> Weak<ProcInner> {
        Arc::downgrade(&self.0)
    }

    /// The proc a [`Proc::downgrade`] refers to, while it lives.
    pub(crate) fn upgrade(weak: &Weak<ProcInner>) -> Option<Proc> {
        weak.upgrade().map(Proc)
    }

    /// Waits until every link of this proc has room in its window (LK-8):
    /// for a sender whose messages fan out through many links (a cast).
    /// One atomic load while no link is full.
    pub async fn ready_all(&self) {
        while self.0.stats.links_over_window.load(Ordering::Relaxed) > 0 {
            let full: Vec<_> = self
                .0
                .links
                .lock()
                .values()
                .filter(|link| link.over_window())
                .cloned()
                .collect();
            if full.is_empty() {
                // Counted, but opened meanwhile.
                return;
            }
            for link in full {
                link.ready().await;
            }
        }
    }

    /// The unacknowledged bytes of every link this proc holds now (LK-8).
    pub fn unacked_bytes(&self) -> usize {
        self.0
            .links
            .lock()
            .values()
            .map(|l| l.unacked_bytes())
            .sum()
    }

    /// Drops every outgoing connection at once. Links reconnect and write
    /// every unacknowledged message again; receivers drop what they already
    /// have. Useful after a network change, and to test exactly that.
    pub fn reset_links(&self) {
        for link in self.0.links.lock().values() {
            link.reset();
        }
    }

    pub(crate) fn register(&self, entry: Arc<MailboxEntry>) -> Result<(), ProcError> {
        let mut actors = self.0.actors.write();
        let ranks = actors.entry(entry.id.name().to_string()).or_default();
        if let Some(existing) = ranks.get(&entry.id.rank())
            && !(existing.terminated)()
        {
            return Err(ProcError::Duplicate(entry.id.clone()));
        }
        ranks.insert(entry.id.rank(), entry);
        Ok(())
    }

    pub(crate) fn unregister(&self, id: &ActorId) {
        let mut actors = self.0.actors.write();
        if let Some(ranks) = actors.get_mut(id.name()) {
            ranks.remove(&id.rank());
            if ranks.is_empty() {
                actors.remove(id.name());
            }
        }
    }

    fn lookup(&self, name: &str, rank: u32) -> Option<Arc<MailboxEntry>> {
        self.0.actors.read().get(name)?.get(&rank).cloned()
    }

    /// The proc of `actor` if it lives in this OS process: this proc, or a
    /// `local:` proc, which takes messages as values.
    fn in_process(&self, actor: &ActorId) -> Option<Proc> {
        let proc_id = actor.proc_id();
        if proc_id.same(&self.0.id) {
            return Some(self.clone());
        }
        let ChannelAddr::Local(name) = proc_id.addr() else {
            return None;
        };
        let inner = IN_PROCESS.read().get(name)?.upgrade()?;
        inner.id.same(proc_id).then_some(Proc(inner))
    }

    /// Sends `message` from `sender` to `dest`; `return_port` is the port
    /// waiting for its reply, failed if the message is not delivered.
    pub(crate) fn post<M: RemoteMessage>(
        &self,
        sender: &ActorId,
        dest: &PortId,
        message: M,
        return_port: Option<PortId>,
    ) {
        if self.0.crashed.load(Ordering::Relaxed) {
            // A crashed proc sends nothing.
            return;
        }
        if self.0.impairments.active() || Simulation::active() {
            let to = dest.actor_id().proc_id();
            if !to.same(&self.0.id) {
                let (from, port) = (sender.clone(), dest.clone());
                let held: Held = Box::new(move |proc, failure| match failure {
                    None => proc.post_now(&from, &port, message, return_port),
                    Some(failure) => {
                        let meta = meta_for::<M>(&from, &port, return_port);
                        proc.fail_delivery(&meta, failure);
                    }
                });
                if let Some(sim) = Simulation::current() {
                    let floor = self.0.impairments.floor(to.addr());
                    let kind = std::any::type_name::<M>();
                    sim.schedule(&self.0, sender, dest, kind, floor, held);
                    return;
                }
                if let Admit::Now(held) = self.0.impairments.admit(&self.0, to.addr(), held) {
                    held(self, None);
                }
                return;
            }
        }
        self.post_now(sender, dest, message, return_port);
    }

    /// [`Proc::post`] of a copy of `message`, with no reply port: archived
    /// straight from `message` when it goes to another process (see
    /// [`crate::PortRef::send_ref`]); cloned where the value itself is
    /// handed over (this process) or held (impairments, simulation).
    pub(crate) fn post_ref<M: RemoteMessage + Clone>(
        &self,
        sender: &ActorId,
        dest: &PortId,
        message: &M,
    ) {
        if self.0.crashed.load(Ordering::Relaxed) {
            return;
        }
        if self.0.impairments.active()
            || Simulation::active()
            || self.in_process(dest.actor_id()).is_some()
        {
            return self.post(sender, dest, message.clone(), None);
        }
        let _span = tracing::trace_span!("send", from = %sender, to = %dest).entered();
        self.post_remote(sender, dest, message, None);
    }

    /// [`Proc::post`] past the impairments.
    fn post_now<M: RemoteMessage>(
        &self,
        sender: &ActorId,
        dest: &PortId,
        message: M,
        return_port: Option<PortId>,
    ) {
        let _span = tracing::trace_span!("send", from = %sender, to = %dest).entered();
        if let Some(proc) = self.in_process(dest.actor_id()) {
            let meta = meta_for::<M>(sender, dest, return_port);
            if proc.0.crashed.load(Ordering::Relaxed) && !proc.0.id.same(&self.0.id) {
                let failure = DeliveryFailure::Unreachable {
                    addr: proc.0.id.addr().to_string(),
                    timeout_ms: self.0.config.delivery_timeout.as_millis() as u64,
                    detail: "the proc crashed".into(),
                };
                self.fail_delivery(&meta, failure);
                return;
            }
            proc.deliver_local(Payload::Local(Box::new(message)), meta);
            return;
        }
        self.post_remote(sender, dest, &message, return_port);
    }

    /// Archives `message` into a frame for the proc of `dest`, in another
    /// process, and hands it to the link there.
    fn post_remote<M: RemoteMessage>(
        &self,
        sender: &ActorId,
        dest: &PortId,
        message: &M,
        return_port: Option<PortId>,
    ) {
        let meta = meta_for::<M>(sender, dest, return_port);
        // The message is archived straight into the frame, the envelope after it.
        let frame = scratch_frame();
        let encoded = message
            .encode_into(frame)
            .map_err(|e| e.to_string())
            .and_then(|frame| {
                let len = u32::try_from(frame.len() - HEADER_LEN)
                    .map_err(|_| "message larger than 4 GiB".to_string())?;
                Ok((frame, len))
            });
        let (frame, len) = match encoded {
            Ok(encoded) => encoded,
            Err(e) => {
                let failure = DeliveryFailure::Malformed {
                    port: dest.clone(),
                    detail: format!("message does not encode: {e}"),
                };
                self.fail_delivery(&meta, failure);
                return;
            }
        };
        let envelope = Envelope {
            sender: sender.clone(),
            dest: dest.clone(),
            return_port: meta.return_port.clone(),
            message_type: meta.message_type.clone(),
            body: Body::Message { offset: 0, len },
        };
        self.send_remote(frame, &envelope, Some(meta));
    }

    fn deliver_local(&self, payload: Payload<'_>, meta: Meta) {
        let dest = meta.dest.actor_id();
        let result = match self.lookup(dest.name(), dest.rank()) {
            Some(entry) => entry.deliver(payload, meta.clone()),
            None => Err(DeliveryFailure::UnknownActor {
                actor: dest.clone(),
            }),
        };
        if let Err(failure) = result {
            self.fail_delivery(&meta, failure);
        }
    }

    /// Reports an undelivered message: an [`Undeliverable`] to its sender and
    /// a failure to the port waiting for its reply (PR-3).
    pub(crate) fn fail_delivery(&self, meta: &Meta, failure: DeliveryFailure) {
        tracing::debug!(from = %meta.sender, to = %meta.dest, reason = %failure, "undeliverable");
        // The sender hears of it before the call does, so that code woken by
        // the failed call finds the returned message already there.
        let undeliverable = Undeliverable {
            dest: meta.dest.clone(),
            message_type: meta.message_type.to_string(),
            reason: failure.clone(),
        };
        let to = meta.sender.port_id(UNDELIVERABLE_PORT);
        self.post_failure(
            &to,
            &meta.dest,
            Body::Undeliverable(Box::new(undeliverable)),
        );
        if let Some(return_port) = &meta.return_port {
            self.post_failure(return_port, &meta.dest, Body::Failure(Box::new(failure)));
        }
    }

    /// Sends a failure body; failures are never answered with failures (DF-2).
    fn post_failure(&self, to: &PortId, from: &PortId, body: Body) {
        let actor = to.actor_id();
        if let Some(proc) = self.in_process(actor) {
            if let Some(entry) = proc.lookup(actor.name(), actor.rank()) {
                match body {
                    Body::Failure(failure) => entry.fail(to.index(), *failure),
                    Body::Undeliverable(undeliverable) => entry.undeliverable(*undeliverable),
                    Body::Message { .. } => {}
                }
            }
            return;
        }
        let envelope = Envelope {
            sender: from.actor_id().clone(),
            dest: to.clone(),
            return_port: None,
            message_type: TypeName::Static(""),
            body,
        };
        self.send_remote(frame_buffer(256), &envelope, None);
    }

    /// Archives `envelope` into `frame` (after the message, if any) and
    /// hands the frame to the link for the destination's address.
    fn send_remote(&self, frame: rkyv::util::AlignedVec, envelope: &Envelope, meta: Option<Meta>) {
        let mut frame = match encode_envelope(envelope, frame) {
            Ok(frame) => frame,
            Err(e) => {
                if let Some(meta) = meta {
                    let failure = DeliveryFailure::Malformed {
                        port: envelope.dest.clone(),
                        detail: format!("envelope does not encode: {e}"),
                    };
                    self.fail_delivery(&meta, failure);
                }
                return;
            }
        };
        if frame.len() - HEADER_LEN > self.0.config.max_frame_size {
            if meta.is_none() {
                // Nobody waits on it to hear why: say so here.
                tracing::warn!(
                    dest = %envelope.dest,
                    bytes = frame.len() - HEADER_LEN,
                    limit = self.0.config.max_frame_size,
                    "dropped a message over the frame limit"
                );
            }
            if let Some(meta) = meta {
                let failure = DeliveryFailure::Malformed {
                    port: envelope.dest.clone(),
                    detail: format!(
                        "message of {} bytes exceeds the frame limit of {} bytes",
                        frame.len() - HEADER_LEN,
                        self.0.config.max_frame_size
                    ),
                };
                self.fail_delivery(&meta, failure);
            }
            return;
        }
        finish_frame(&mut frame, FrameKind::Data, 0);
        let frame = compact_frame(frame);
        crate::channel::traffic::count_sent(frame.len());
        let addr = envelope.dest.actor_id().proc_id().addr();
        // A link may die between lookup and send; the second try gets a new one.
        let mut pending = (frame, meta);
        for _ in 0..2 {
            match self.link(addr).send(pending.0, pending.1) {
                Ok(()) => return,
                Err(back) => pending = back,
            }
        }
        if let Some(meta) = pending.1 {
            let failure = DeliveryFailure::Unreachable {
                addr: addr.to_string(),
                timeout_ms: self.0.config.delivery_timeout.as_millis() as u64,
                detail: "link died while sending".into(),
            };
            self.fail_delivery(&meta, failure);
        }
    }

    fn link(&self, addr: &ChannelAddr) -> Arc<Link<Option<Meta>>> {
        let mut links = self.0.links.lock();
        if let Some(link) = links.get(addr)
            && !link.is_dead()
        {
            return link.clone();
        }
        let link = self.new_link(addr, true);
        links.insert(addr.clone(), link.clone());
        self.0.runtime.spawn(link.clone().run());
        link
    }

    /// A link to `addr`, not started; `dials`: whether it connects by
    /// itself or waits to adopt its peer's connection (LK-9).
    fn new_link(&self, addr: &ChannelAddr, dials: bool) -> Arc<Link<Option<Meta>>> {
        let weak = Arc::downgrade(&self.0);
        let on_dead = Box::new(
            move |addr: &ChannelAddr, undelivered: Vec<Option<Meta>>, reason: String| {
                if let Some(inner) = weak.upgrade() {
                    Proc(inner).link_died(addr, undelivered, reason);
                }
            },
        );
        let weak = Arc::downgrade(&self.0);
        let max_frame_size = self.0.config.max_frame_size;
        let reader: Reader<Option<Meta>> = Box::new(move |rd, link, generation| {
            let weak = weak.clone();
            Box::pin(async move {
                let reader = FrameReader::new(max_frame_size);
                let sink = Sink::Link(link, generation);
                match serve_connection(weak.clone(), reader, rd, sink, None).await {
                    Ok(()) => "the connection ended".to_string(),
                    Err(e) => {
                        if let Some(inner) = weak.upgrade() {
                            connection_failed(&Proc(inner), &e);
                        }
                        e.to_string()
                    }
                }
            })
        });
        let config = LinkConfig {
            delivery_timeout: self.0.config.delivery_timeout,
            window_bytes: self.0.config.link_window.max(1),
            dials,
        };
        // The handshake names this proc, and carries the cluster token
        // after a newline when there is one (PR-6).
        let mut hello = self.0.id.to_string();
        if let Some(token) = &self.0.config.cluster_token {
            hello.push('\n');
            hello.push_str(token.expose());
        }
        Link::new(
            addr.clone(),
            new_session_id(),
            &hello,
            config,
            self.0.stats.clone(),
            on_dead,
            reader,
        )
    }

    /// A connection from the proc `from` (its hello said so) becomes
    /// the transport of this proc's link back to it, unless that link keeps
    /// a connection it dialed (LK-9). The sink the connection's reader
    /// writes through either way.
    fn adopt(&self, from: &str, wr: WriteHalf) -> Sink {
        let Ok(peer) = from.parse::<ProcId>() else {
            // Not a proc (a tool, a test): its connection is only read.
            return Sink::Direct(wr);
        };
        let addr = peer.addr();
        if addr == self.0.id.addr() {
            return Sink::Direct(wr);
        }
        let peer_is_smaller = from < self.0.id.to_string().as_str();
        let wr = Arc::new(wr);
        let mut links = self.0.links.lock();
        let (link, fresh) = match links.get(addr) {
            Some(link) if !link.is_dead() => (link.clone(), false),
            _ => (self.new_link(addr, false), true),
        };
        match link.adopt(wr.clone(), peer_is_smaller) {
            Some(generation) => {
                if fresh {
                    links.insert(addr.clone(), link.clone());
                    self.0.runtime.spawn(link.clone().run());
                }
                Sink::Link(link, generation)
            }
            None => {
                drop(links);
                match Arc::try_unwrap(wr) {
                    Ok(wr) => Sink::Direct(wr),
                    // Not kept by a link that refused it: unreachable.
                    Err(_) => Sink::Closed,
                }
            }
        }
    }

    fn link_died(&self, addr: &ChannelAddr, undelivered: Vec<Option<Meta>>, reason: String) {
        {
            let mut links = self.0.links.lock();
            if links.get(addr).is_some_and(|link| link.is_dead()) {
                links.remove(addr);
            }
        }
        let failure = DeliveryFailure::Unreachable {
            addr: addr.to_string(),
            timeout_ms: self.0.config.delivery_timeout.as_millis() as u64,
            detail: reason,
        };
        for meta in undelivered.iter().flatten() {
            self.fail_delivery(meta, failure.clone());
        }
        let entries: Vec<Arc<MailboxEntry>> = self
            .0
            .actors
            .read()
            .values()
            .flat_map(|ranks| ranks.values().cloned())
            .collect();
        for entry in entries {
            entry.fail_expecting(addr, &failure);
        }
    }

    /// Routes one validated envelope from another proc; `body` is the whole
    /// frame body, which holds the message archive.
    fn deliver_archived(
        &self,
        body: &[u8],
        envelope: &ArchivedEnvelope,
        type_names: &mut TypeNames,
    ) -> Result<Option<Arc<Backlog>>, FrameError> {
        let dest = decode_port(&envelope.dest)?;
        let actor = dest.actor_id();
        let entry = if actor.proc_id().name() == self.0.id.name() {
            self.lookup(actor.name(), actor.rank())
        } else {
            None
        };
        match &envelope.body {
            ArchivedBody::Message { offset, len } => {
                let start = offset.to_native() as usize;
                let bytes = start
                    .checked_add(len.to_native() as usize)
                    .and_then(|end| body.get(start..end))
                    .ok_or_else(|| FrameError::Invalid("message outside its frame".into()))?;
                let return_port = match envelope.return_port.as_deref() {
                    Some(port) => Some(decode_port(port)?),
                    None => None,
                };
                let meta = Meta {
                    sender: decode(&envelope.sender)?,
                    return_port,
                    message_type: type_names.type_name(envelope.message_type.as_str()),
                    dest,
                };
                let result = match entry {
                    Some(entry) => entry.deliver_within(
                        Payload::Remote(bytes),
                        meta.clone(),
                        self.0.config.port_window,
                    ),
                    None => Err(DeliveryFailure::UnknownActor {
                        actor: meta.dest.actor_id().clone(),
                    }),
                };
                match result {
                    Ok(full) => return Ok(full),
                    Err(failure) => self.fail_delivery(&meta, failure),
                }
            }
            ArchivedBody::Failure(failure) => {
                if let Some(entry) = entry {
                    entry.fail(dest.index(), decode(failure.get())?);
                }
            }
            ArchivedBody::Undeliverable(undeliverable) => {
                if let Some(entry) = entry {
                    entry.undeliverable(decode(undeliverable.get())?);
                }
            }
        }
        Ok(None)
    }

    /// Opens a connection of session `id`; [`Proc::session_closed`] ends it.
    fn session(&self, id: u64) -> Session {
        let mut sessions = self.0.sessions.lock();
        let slot = sessions.entry(id).or_insert_with(|| SessionSlot {
            last: Session::default(),
            open: 0,
            closed_at: std::time::Instant::now(),
        });
        slot.open += 1;
        slot.last.clone()
    }

    fn session_closed(&self, id: u64) {
        if let Some(slot) = self.0.sessions.lock().get_mut(&id) {
            slot.open = slot.open.saturating_sub(1);
            slot.closed_at = std::time::Instant::now();
        }
    }

    /// The senders' sessions this proc remembers (PR-8).
    pub fn receiver_sessions(&self) -> usize {
        self.0.sessions.lock().len()
    }

    /// PR-8: forgets the sessions with no connection for the TTL.
    fn forget_idle_sessions(&self) {
        let ttl = self
            .0
            .config
            .session_ttl
            .max(self.0.config.delivery_timeout * 2);
        self.0
            .sessions
            .lock()
            .retain(|_, slot| slot.open > 0 || slot.closed_at.elapsed() < ttl);
    }
}

/// Forgets idle sessions now and then, while the proc lives (PR-8).
async fn session_sweeper(proc: Weak<ProcInner>) {
    let every = match proc.upgrade() {
        Some(inner) => (inner
            .config
            .session_ttl
            .max(inner.config.delivery_timeout * 2)
            / 4)
        .clamp(Duration::from_millis(10), Duration::from_secs(60)),
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = proc.upgrade() else { return };
        if *inner.shutdown.borrow() {
            return;
        }
        Proc(inner).forget_idle_sessions();
    }
}

fn decode<T>(archived: &T::Archived) -> Result<T, FrameError>
where
    T: rkyv::Archive,
    T::Archived: rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rancor::Error>>,
{
    rkyv::deserialize::<T, rancor::Error>(archived).map_err(|e| FrameError::Invalid(e.to_string()))
}

/// The type names one connection saw lately, so that a steady stream
/// allocates none. (Ids need no cache here: their decoder reuses recent
/// ones, see `id.rs`.)
#[derive(Default)]
struct TypeNames {
    recent: [Option<Arc<str>>; 2],
    next: usize,
}

fn decode_port(archived: &ArchivedPortId) -> Result<PortId, FrameError> {
    let (actor, port) = archived.parts();
    Ok(decode::<ActorId>(actor)?.port_id(port))
}

impl TypeNames {
    fn type_name(&mut self, name: &str) -> TypeName {
        if let Some(known) = self.recent.iter().flatten().find(|known| &***known == name) {
            return TypeName::Shared(known.clone());
        }
        let shared: Arc<str> = Arc::from(name);
        self.recent[self.next] = Some(shared.clone());
        self.next = (self.next + 1) % self.recent.len();
        TypeName::Shared(shared)
    }
}

/// The owner of root actors: the proc's supervision stream.
struct ProcOwner(mpsc::UnboundedSender<ActorSupervisionEvent>);

impl Owner for ProcOwner {
    fn supervise(&self, event: ActorSupervisionEvent) {
        let _ = self.0.send(event);
    }
}

fn new_session_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(now.as_nanos());
    }
    hasher.finish()
}

async fn accept_loop(
    proc: Weak<ProcInner>,
    mut listener: Listener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped(&mut shutdown) => return,
        };
        let Some(inner) = proc.upgrade() else { return };
        match accepted {
            Ok(conn) => {
                let proc = Proc(inner);
                let runtime = proc.0.runtime.clone();
                runtime.spawn(async move {
                    let weak = Arc::downgrade(&proc.0);
                    if let Err(e) = receive(proc, conn).await
                        && let Some(inner) = weak.upgrade()
                    {
                        connection_failed(&Proc(inner), &e);
                    }
                });
            }
            Err(e) => {
                tracing::warn!(proc = %inner.id, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Counts a connection that ended on an error: a bad frame is counted and
/// logged; a peer that went away is not a bad frame.
fn connection_failed(proc: &Proc, e: &FrameError) {
    match e {
        // The peer went away (it exited, or was stopped): not a bad frame,
        // and nothing to warn about.
        FrameError::Io(e) if peer_gone(e) => {
            tracing::debug!(proc = %proc.0.id, error = %e, "a peer closed its connection");
        }
        // Connected and closed without a byte: a TCP probe (a readiness
        // check, a port scan), not a peer.
        FrameError::Truncated(0) => {
            tracing::debug!(proc = %proc.0.id, "a connection closed before its hello");
        }
        e => {
            proc.0.stats.bad_frames.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(proc = %proc.0.id, error = %e, "closed a connection after a bad frame");
        }
    }
}

/// Whether a socket error only means that the peer closed or vanished.
fn peer_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof
    )
}

/// How a connection's reader writes its acknowledgements: straight to a
/// connection only it uses, or through the link that owns the connection,
/// in order with that link's frames (LK-9).
enum Sink {
    Direct(WriteHalf),
    Link(Arc<Link<Option<Meta>>>, u64),
    /// Nothing may be written: the connection is closing.
    Closed,
}

impl Sink {
    /// Writes `frame`; false when the connection is no longer this
    /// reader's to write (a link replaced or ended it).
    async fn write(&self, frame: &[u8]) -> Result<bool, FrameError> {
        match self {
            Sink::Direct(wr) => {
                wr.write_all(frame).await?;
                Ok(true)
            }
            Sink::Link(link, generation) => Ok(link.control(*generation, frame)),
            Sink::Closed => Ok(false),
        }
    }

    async fn ack(&self, seq: u64) -> Result<bool, FrameError> {
        self.write(&small_frame(FrameKind::Ack, seq, &[])).await
    }
}

/// The sender's session a connection carries to this proc, from its
/// hello; it counts as an open connection of that session until dropped
/// (PR-8).
struct PeerSession {
    id: u64,
    from: String,
    last: Session,
    /// A session this proc has never seen whose first frame is numbered
    /// past 1 began with an earlier incarnation of this proc (PR-7).
    fresh: bool,
    proc: Weak<ProcInner>,
}

impl PeerSession {
    fn open(proc: &Proc, id: u64, from: String) -> PeerSession {
        let fresh = !proc.0.sessions.lock().contains_key(&id);
        PeerSession {
            id,
            from,
            last: proc.session(id),
            fresh,
            proc: Arc::downgrade(&proc.0),
        }
    }
}

impl Drop for PeerSession {
    fn drop(&mut self) {
        if let Some(inner) = self.proc.upgrade() {
            Proc(inner).session_closed(self.id);
        }
    }
}

/// Reads a hello body, `PROC_ID[\nTOKEN]`: the sender's proc id, once its
/// token is checked against this proc's (PR-6).
fn check_hello(proc: &Proc, body: &[u8]) -> Result<String, FrameError> {
    let (from, token) = match body.iter().position(|&b| b == b'\n') {
        Some(at) => (&body[..at], Some(&body[at + 1..])),
        None => (body, None),
    };
    if let Some(required) = &proc.0.config.cluster_token
        && !token.is_some_and(|token| required.matches(token))
    {
        return Err(FrameError::Invalid(format!(
            "{} did not present this cluster's token",
            String::from_utf8_lossy(from)
        )));
    }
    Ok(String::from_utf8_lossy(from).into_owned())
}

/// Serves one incoming connection: its hello, then whatever it carries
/// (see [`serve_connection`]). Returns an error for a bad frame, which
/// closes only this connection (PR-2).
async fn receive(proc: Proc, conn: Conn) -> Result<(), FrameError> {
    // A TCP connection's TLS handshake, here and not in the accept loop (TL-3).
    let (mut rd, wr) = conn.accept_tls().await?.into_split()?;
    let mut reader = FrameReader::new(proc.0.config.max_frame_size);
    let (session_id, from) = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        loop {
            if let Some((header, body)) = reader.next_frame()? {
                if header.kind != FrameKind::Hello {
                    return Err(FrameError::BadKind(header.kind as u8));
                }
                return Ok((header.seq, check_hello(&proc, reader.body(body))?));
            }
            if !reader.fill(&mut rd).await? {
                return Err(FrameError::Truncated(0));
            }
        }
    })
    .await
    .map_err(|_| FrameError::Invalid("no hello within the handshake timeout".into()))??;
    tracing::debug!(proc = %proc.0.id, %from, "accepted a link");
    let sink = proc.adopt(&from, wr);
    let session = PeerSession::open(&proc, session_id, from);
    let weak = Arc::downgrade(&proc.0);
    drop(proc);
    serve_connection(weak, reader, rd, sink, Some(session)).await
}

/// Serves a connection after its handshake, accepted or dialed: the
/// peer's data frames in sequence order, acknowledged in batches through
/// `sink`, and, when a link of this proc writes on it, the acknowledgements
/// of that link's frames (LK-9). `session`: the peer's sending session
/// when its hello came first; on a dialed connection the peer says its
/// hello before its first data frame, if it sends any. Holds the proc only
/// while handling frames, never while it waits, so a proc with open
/// connections can still end.
async fn serve_connection(
    weak: Weak<ProcInner>,
    mut reader: FrameReader,
    mut rd: ReadHalf,
    sink: Sink,
    mut session: Option<PeerSession>,
) -> Result<(), FrameError> {
    let stats = match weak.upgrade() {
        Some(inner) => inner.stats.clone(),
        None => return Ok(()),
    };
    // Counted down however the reading ends: a dialed connection's reader
    // is dropped when its link lets the connection go.
    struct Open(Arc<ChannelStats>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
        }
    }
    stats.open_connections.fetch_add(1, Ordering::Relaxed);
    let _open = Open(stats);
    let result = serve_frames(&weak, &mut reader, &mut rd, &sink, &mut session).await;
    if let Sink::Link(link, generation) = &sink {
        link.detach(*generation);
    }
    result
}

/// What became of one data frame.
enum Taken {
    /// Delivered now or before (a duplicate); the backlog of an actor now
    /// past its window (PR-9).
    Delivered(Option<Arc<Backlog>>),
    /// The session began with an earlier incarnation of this proc (PR-7):
    /// answer `restarted` and close.
    Restarted,
}

/// What a connection's reader has delivered, to acknowledge.
#[derive(Default)]
struct Progress {
    /// The highest sequence number delivered.
    delivered: u64,
    /// A duplicate came since the last look: the sender is writing again
    /// what it holds unacknowledged, so tell it at once what arrived.
    resent: bool,
}

/// Takes data frame `seq` of the connection's peer session: delivers it
/// in sequence order, drops a duplicate, refuses a gap.
fn take_data(
    proc: &Proc,
    session: &mut Option<PeerSession>,
    seq: u64,
    bytes: &[u8],
    type_names: &mut TypeNames,
    progress: &mut Progress,
) -> Result<Taken, FrameError> {
    let Some(peer) = session.as_mut() else {
        return Err(FrameError::Invalid("a data frame before the hello".into()));
    };
    if peer.fresh && seq > 1 {
        proc.0.sessions.lock().remove(&peer.id);
        tracing::info!(proc = %proc.0.id, from = %peer.from, seq, "a peer's link began with an earlier incarnation of this proc; told it so");
        return Ok(Taken::Restarted);
    }
    peer.fresh = false;
    let mut last = peer.last.lock();
    if seq <= *last {
        // Delivered on an earlier connection whose ack was lost: drop it,
        // and acknowledge it here so that the sender lets it go.
        proc.0
            .stats
            .duplicates_dropped
            .fetch_add(1, Ordering::Relaxed);
        progress.delivered = progress.delivered.max(seq);
        progress.resent = true;
        return Ok(Taken::Delivered(None));
    }
    if seq != *last + 1 {
        return Err(FrameError::Invalid(format!(
            "sequence gap: expected {}, got {seq}",
            *last + 1
        )));
    }
    let envelope = rkyv::access::<ArchivedEnvelope, rancor::Error>(bytes)
        .map_err(|e| FrameError::Invalid(e.to_string()))?;
    let full = proc.deliver_archived(bytes, envelope, type_names)?;
    crate::channel::traffic::count_received(HEADER_LEN + bytes.len());
    *last = seq;
    progress.delivered = seq;
    Ok(Taken::Delivered(full))
}

/// Answers a session from an earlier incarnation of this proc (PR-7); the
/// connection ends.
async fn restarted(sink: &Sink) -> Result<(), FrameError> {
    let _ = sink.write(&small_frame(FrameKind::Restarted, 0, &[])).await;
    Ok(())
}

/// Takes a frame that is not data: an acknowledgement or a `restarted`
/// for the link that writes on this connection (LK-9), or, on a dialed
/// connection, the peer's hello. False when the connection ends here.
fn control_frame(
    proc: &Proc,
    header: FrameHeader,
    body: &[u8],
    sink: &Sink,
    session: &mut Option<PeerSession>,
    read_at: std::time::Instant,
) -> Result<bool, FrameError> {
    match header.kind {
        FrameKind::Ack => {
            // A connection only read here carries none.
            if let Sink::Link(link, _) = sink {
                link.acked(header.seq, read_at);
            }
            Ok(true)
        }
        FrameKind::Restarted => {
            if let Sink::Link(link, _) = sink {
                link.restarted();
            }
            Ok(false)
        }
        FrameKind::Hello if session.is_none() => {
            let from = check_hello(proc, body)?;
            tracing::debug!(proc = %proc.0.id, %from, "a dialed connection carries its peer's link too");
            *session = Some(PeerSession::open(proc, header.seq, from));
            Ok(true)
        }
        other => Err(FrameError::BadKind(other as u8)),
    }
}

async fn serve_frames(
    weak: &Weak<ProcInner>,
    reader: &mut FrameReader,
    rd: &mut ReadHalf,
    sink: &Sink,
    session: &mut Option<PeerSession>,
) -> Result<(), FrameError> {
    let (config, mut shutdown, polling) = match weak.upgrade() {
        Some(inner) => (
            inner.config.clone(),
            inner.shutdown.subscribe(),
            inner.polling.clone(),
        ),
        None => return Ok(()),
    };
    let mut type_names = TypeNames::default();
    let mut progress = Progress::default();
    let mut acked = 0u64;
    let mut ack_deadline: Option<tokio::time::Instant> = None;
    // One timer for the connection's life, armed at the earliest deadline
    // and moved on when it fires early: a timer made for each wait would
    // be set and cancelled for every message that a reply then carries
    // the acknowledgement of.
    let ack_timer = tokio::time::sleep(ACK_TIMER_PARKED);
    tokio::pin!(ack_timer);
    let mut ack_armed: Option<tokio::time::Instant> = None;
    let mut pace = Pace::new(config.busy_poll, SPIN_MAX);
    // PR-11: data frames read while an actor's queue is past its window,
    // held (unacknowledged) until it drains, in order, up to the window.
    let mut held: VecDeque<(u64, AlignedVec)> = VecDeque::new();
    let mut held_bytes = 0usize;
    let hold_limit = config.link_window.max(config.max_frame_size.min(1 << 20));
    // Held frames reached the limit (a sender that does not wait for its
    // window, such as replies sent by handlers): they go to the actor past
    // its window, as a stalled queue's do.
    let mut overflow = false;
    // When the reader last filled: the clock is read once a fill, for the
    // pace, the acknowledgements it brought and the deadline of ours.
    let mut read_at = std::time::Instant::now();
    loop {
        let mut full: Option<Arc<Backlog>> = None;
        progress.resent = false;
        {
            let Some(inner) = weak.upgrade() else {
                return Ok(());
            };
            let proc = Proc(inner);
            // What was held comes first, then what the reader has.
            while let Some((seq, frame)) = held.pop_front() {
                held_bytes -= frame.len();
                match take_data(&proc, session, seq, &frame, &mut type_names, &mut progress)? {
                    Taken::Delivered(backlog) => full = backlog,
                    Taken::Restarted => return restarted(sink).await,
                }
                if full.is_some() && !overflow {
                    break;
                }
            }
            overflow = false;
            while full.is_none() {
                let Some((header, body)) = reader.next_frame()? else {
                    break;
                };
                if header.kind != FrameKind::Data {
                    let body = reader.body(body);
                    if !control_frame(&proc, header, body, sink, session, read_at)? {
                        return Ok(());
                    }
                    continue;
                }
                let bytes = reader.body(body);
                match take_data(
                    &proc,
                    session,
                    header.seq,
                    bytes,
                    &mut type_names,
                    &mut progress,
                )? {
                    Taken::Delivered(backlog) => full = backlog,
                    Taken::Restarted => return restarted(sink).await,
                }
            }
            if let Sink::Link(link, generation) = sink {
                // LK-10: what a data frame the other way already carried
                // needs no acknowledgement of its own; what is left rides
                // on the next one, if one goes before the deadline.
                let carried = link.piggybacked(*generation).min(progress.delivered);
                if carried > acked {
                    acked = carried;
                    // What is left came after what the data frame carried:
                    // its deadline starts now. Kept from the first frame,
                    // a conversation's steady stream of requests would
                    // each time reach it and write an acknowledgement of
                    // its own, waking the peer for nothing.
                    ack_deadline = None;
                }
                if progress.delivered > acked {
                    link.offer_ack(*generation, progress.delivered);
                }
            }
            if ack_deadline.is_none() && progress.delivered > acked {
                let from = tokio::time::Instant::from_std(read_at);
                ack_deadline = Some(from + config.ack_interval);
            }
            if full.is_some() {
                proc.0.stats.paused_reads.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(backlog) = full {
            // PR-9: what was delivered is acknowledged (the sender's window
            // counts only what is in flight); delivering waits for the actor.
            if progress.delivered > acked {
                if !sink.ack(progress.delivered).await? {
                    return Ok(());
                }
                acked = progress.delivered;
                ack_deadline = None;
            }
            let low = config.port_window / 2;
            let drained = backlog.drain_to(low, PORT_STALL);
            tokio::pin!(drained);
            // PR-11: a connection a link of this proc writes on also brings
            // that link's acknowledgements (LK-9): reading goes on, and data
            // frames wait, unacknowledged, so the sender's window still
            // fills and stops it.
            let reads_on = matches!(sink, Sink::Link(..));
            loop {
                tokio::select! {
                    biased;
                    moved = &mut drained => {
                        if !moved {
                            tracing::debug!(queued = backlog.queued(), "an actor's queue is past its window and not moving; reading on");
                        }
                        break;
                    }
                    filled = reader.fill(rd), if reads_on && held_bytes < hold_limit => {
                        if !filled? {
                            if progress.delivered > acked {
                                let _ = sink.ack(progress.delivered).await;
                            }
                            return Ok(());
                        }
                        let Some(inner) = weak.upgrade() else {
                            return Ok(());
                        };
                        let proc = Proc(inner);
                        while held_bytes < hold_limit {
                            let Some((header, body)) = reader.next_frame()? else {
                                break;
                            };
                            let bytes = reader.body(body);
                            if header.kind == FrameKind::Data {
                                let mut frame = AlignedVec::with_capacity(bytes.len());
                                frame.extend_from_slice(bytes);
                                held_bytes += frame.len();
                                held.push_back((header.seq, frame));
                            } else if !control_frame(
                                &proc,
                                header,
                                bytes,
                                sink,
                                session,
                                std::time::Instant::now(),
                            )? {
                                return Ok(());
                            }
                        }
                        if held_bytes >= hold_limit {
                            tracing::debug!(held_bytes, "frames held for a full actor reached the window; delivering them");
                            overflow = true;
                            break;
                        }
                    }
                }
            }
            continue;
        }
        if progress.delivered > acked
            && (progress.resent || progress.delivered - acked >= config.ack_every)
        {
            if !sink.ack(progress.delivered).await? {
                return Ok(());
            }
            acked = progress.delivered;
            ack_deadline = None;
        }
        // Poll briefly before sleeping in epoll: a peer in a conversation
        // usually answers within microseconds, and waking a sleeping thread
        // costs more than that on virtual machines. The first yield lets the
        // actors this connection just fed run; later ones, every few
        // microseconds, keep the rest of this worker's tasks going.
        let spin = if polling.load(Ordering::Relaxed) {
            pace.budget()
        } else {
            Duration::ZERO
        };
        // The pace learns how long a wait took only where it polls.
        let started = (!spin.is_zero()).then(std::time::Instant::now);
        if let Some(started) = started {
            let polling = pace.polling(spin);
            let mut filled;
            let mut yielded = started;
            tokio::task::yield_now().await;
            loop {
                filled = reader.fill_now(rd)?;
                let now = std::time::Instant::now();
                if filled.is_some() || now - started >= spin {
                    read_at = now;
                    break;
                }
                if now - yielded >= SPIN_SLICE {
                    tokio::task::yield_now().await;
                    yielded = now;
                } else {
                    for _ in 0..SPIN_PAUSES {
                        std::hint::spin_loop();
                    }
                }
            }
            pace.polled(polling);
            match filled {
                Some(true) => {
                    pace.came(read_at - started);
                    // Polling is how this connection's frames come now:
                    // off the reactor until a wait sleeps again (TR-3).
                    rd.poll_alone();
                    continue;
                }
                Some(false) => {
                    if progress.delivered > acked {
                        let _ = sink.ack(progress.delivered).await;
                    }
                    return Ok(());
                }
                None => {}
            }
        }
        // LK-11: before a wait arms the acknowledgement's timer, the actors
        // this connection fed have their turn (a poll above gave it; else
        // one yield, which runs them and the link's writes first), and an
        // acknowledgement their replies carried needs no timer. An armed
        // timer bounds the sleep in epoll: the kernel then arms a timer of
        // its own at every wait and the reader wakes at every deadline,
        // which a request answered at once never needs.
        if ack_deadline.is_some()
            && let Sink::Link(link, generation) = sink
        {
            if started.is_none() {
                tokio::task::yield_now().await;
            }
            let carried = link.piggybacked(*generation).min(progress.delivered);
            if carried > acked {
                acked = carried;
                if acked == progress.delivered {
                    ack_deadline = None;
                }
            }
        }
        match ack_deadline {
            Some(deadline) if ack_armed.is_none_or(|at| at > deadline) => {
                ack_timer.as_mut().reset(deadline);
                ack_armed = Some(deadline);
            }
            Some(_) => {}
            None if ack_armed.is_some() => {
                ack_timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + ACK_TIMER_PARKED);
                ack_armed = None;
            }
            None => {}
        }
        tokio::select! {
            biased;
            filled = reader.fill(rd) => {
                if !filled? {
                    if progress.delivered > acked {
                        let _ = sink.ack(progress.delivered).await;
                    }
                    return Ok(());
                }
                read_at = std::time::Instant::now();
                if let Some(started) = started {
                    pace.came(read_at - started);
                }
            }
            _ = ack_timer.as_mut(), if ack_armed.is_some() => {
                ack_armed = None;
                if let Some(inner) = weak.upgrade() {
                    inner.stats.ack_timer_wakes.fetch_add(1, Ordering::Relaxed);
                }
                match ack_deadline {
                    // Acknowledged meanwhile, or due later: armed again
                    // before the next wait.
                    None => continue,
                    Some(deadline) if deadline > tokio::time::Instant::now() => continue,
                    Some(_) => {}
                }
                let carried = match sink {
                    Sink::Link(link, generation) => link.piggybacked(*generation),
                    _ => 0,
                };
                if carried < progress.delivered {
                    if let Some(inner) = weak.upgrade() {
                        inner.stats.acks_alone.fetch_add(1, Ordering::Relaxed);
                    }
                    if !sink.ack(progress.delivered).await? {
                        return Ok(());
                    }
                }
                acked = progress.delivered;
                ack_deadline = None;
            }
            _ = stopped(&mut shutdown) => return Ok(()),
        }
    }
}

async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|down| *down).await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::testing::{Echo, EchoActor, Fail, Numbered, Panic, Sleep, StreamReport};
    use crate::{ActorRef, ActorStatus, CallError};

    fn quick() -> ProcConfig {
        ProcConfig {
            delivery_timeout: Duration::from_millis(500),
            call_timeout: Duration::from_secs(10),
            ..ProcConfig::default()
        }
    }

    async fn local(name: &str) -> Proc {
        let addr = format!("local:{name}-{}", new_session_id())
            .parse()
            .unwrap();
        Proc::serve_with_config(name, addr, quick()).await.unwrap()
    }

    #[tokio::test]
    async fn calls_cross_procs_and_port_refs_work_from_there() {
        let a = local("a").await;
        let b = local("b").await;
        let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client, _) = a.attach("client").unwrap();
        let reply = echo
            .call(&client, |reply| Echo {
                payload: b"hi".to_vec(),
                reply,
            })
            .await
            .unwrap();
        assert_eq!(reply, b"hi");

        // A port opened in proc a, passed by reference to proc b's actor.
        let mut port = client.open_port::<Vec<u8>>();
        let port_ref = port.bind();
        let (b_client, _) = b.attach("b-client").unwrap();
        port_ref.send(&b_client, b"from b".to_vec());
        assert_eq!(port.recv().await.unwrap(), b"from b");
    }

    #[tokio::test]
    async fn pr1_order_holds_across_procs() {
        let a = local("a").await;
        let b = local("b").await;
        let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client, _) = a.attach("client").unwrap();
        for seq in 0..5000 {
            echo.send(&client, Numbered { stream: 1, seq });
        }
        let stats = echo
            .call(&client, |reply| StreamReport { stream: 1, reply })
            .await
            .unwrap();
        assert_eq!(stats.received, 5000);
        assert_eq!(stats.out_of_order, 0);
    }

    #[tokio::test]
    async fn lk5_corked_sends_reach_another_process_together_and_in_order() {
        let dir = std::env::temp_dir();
        let sock = |n: &str| {
            format!("unix:{}/lk5-{}-{n}.sock", dir.display(), new_session_id())
                .parse()
                .unwrap()
        };
        let a = Proc::serve_with_config("a", sock("a"), quick())
            .await
            .unwrap();
        let b = Proc::serve_with_config("b", sock("b"), quick())
            .await
            .unwrap();
        let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client, _) = a.attach("client").unwrap();
        // Interleave corked bursts with plain sends: order holds across both.
        for burst in 0..50u64 {
            crate::channel::corked(|| {
                for i in 0..40 {
                    echo.send(
                        &client,
                        Numbered {
                            stream: 5,
                            seq: burst * 41 + i,
                        },
                    );
                }
            });
            echo.send(
                &client,
                Numbered {
                    stream: 5,
                    seq: burst * 41 + 40,
                },
            );
        }
        let stats = echo
            .call(&client, |reply| StreamReport { stream: 5, reply })
            .await
            .unwrap();
        assert_eq!(stats.received, 50 * 41);
        assert_eq!(stats.out_of_order, 0);
    }

    /// LK-8 and PR-9: a burst of 200,000 messages to an actor that is
    /// busy when it starts. The receiver stops reading once the actor's
    /// queue passes its window, the sender's link fills its window and the
    /// sender waits; every message arrives, in order, and the sending
    /// side never holds more than its window and one frame.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lk8_a_burst_waits_for_the_window_and_loses_nothing() {
        const BURST: u64 = 200_000;
        const WINDOW: usize = 1 << 20;
        let dir = std::env::temp_dir();
        let sock = |n: &str| {
            format!("unix:{}/lk8-{}-{n}.sock", dir.display(), new_session_id())
                .parse()
                .unwrap()
        };
        let config = ProcConfig {
            link_window: WINDOW,
            port_window: 1024,
            ..quick()
        };
        let a = Proc::serve_with_config("a", sock("a"), config.clone())
            .await
            .unwrap();
        let b = Proc::serve_with_config("b", sock("b"), config)
            .await
            .unwrap();
        let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client, _) = a.attach("client").unwrap();
        // Keep the actor busy while the burst starts: long enough for the
        // sender to fill both windows on a loaded machine.
        let busy = client.open_once_port::<()>();
        echo.send(
            &client,
            Sleep {
                millis: 1500,
                reply: busy.bind(),
            },
        );
        let dest = echo.port::<Numbered>().id().clone();
        for seq in 0..BURST {
            client.ready(&dest).await;
            echo.send(&client, Numbered { stream: 8, seq });
        }
        let stats = echo
            .call(&client, |reply| StreamReport { stream: 8, reply })
            .await
            .unwrap();
        assert_eq!(stats.received, BURST, "every message arrives");
        assert_eq!(stats.out_of_order, 0, "in order");
        let sent = a.stats();
        let peak = sent.peak_unacked_bytes.load(Ordering::Relaxed) as usize;
        assert!(
            peak <= WINDOW + 4096,
            "the sender held {peak} unacknowledged bytes, past its window of {WINDOW}"
        );
        assert!(
            sent.window_waits.load(Ordering::Relaxed) > 0,
            "the sender never waited: the burst did not outrun the busy actor"
        );
        assert!(
            b.stats().paused_reads.load(Ordering::Relaxed) > 0,
            "the receiver never stopped reading for the busy actor"
        );
        // The last acknowledgement may follow the reply by an ack interval.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while a.unacked_bytes() > 0 && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(a.unacked_bytes(), 0, "everything is acknowledged");
    }

    fn unix_addr(test: &str, n: &str) -> ChannelAddr {
        let dir = std::env::temp_dir();
        format!(
            "unix:{}/{test}-{}-{n}.sock",
            dir.display(),
            new_session_id()
        )
        .parse()
        .unwrap()
    }

    /// Two procs on Unix sockets, an echo actor and a client in each.
    async fn pair(
        test: &str,
    ) -> (
        Proc,
        Proc,
        ActorRef<EchoActor>,
        ActorRef<EchoActor>,
        Mailbox,
        Mailbox,
    ) {
        pair_with(test, quick()).await
    }

    /// [`pair`] with `config`.
    async fn pair_with(
        test: &str,
        config: ProcConfig,
    ) -> (
        Proc,
        Proc,
        ActorRef<EchoActor>,
        ActorRef<EchoActor>,
        Mailbox,
        Mailbox,
    ) {
        let a = Proc::serve_with_config("a", unix_addr(test, "a"), config.clone())
            .await
            .unwrap();
        let b = Proc::serve_with_config("b", unix_addr(test, "b"), config)
            .await
            .unwrap();
        let echo_a = a.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let echo_b = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client_a, _) = a.attach("client").unwrap();
        let (client_b, _) = b.attach("client").unwrap();
        (a, b, echo_a, echo_b, client_a, client_b)
    }

    /// This process's CPU time.
    fn process_cpu_time() -> Duration {
        cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID).expect("the process CPU clock reads")
    }

    /// The CPU two procs in this process burn in the 150 ms after a call
    /// between them, with a busy-poll window longer than that.
    async fn idle_cpu_after_a_call(test: &str, polling: bool) -> Duration {
        let config = ProcConfig {
            busy_poll: Duration::from_millis(400),
            ..quick()
        };
        let (a, b, _, echo_b, client_a, _) = pair_with(test, config).await;
        a.set_busy_poll(polling);
        b.set_busy_poll(polling);
        let ping = |reply| Echo {
            payload: vec![1],
            reply,
        };
        assert_eq!(echo_b.call(&client_a, ping).await.unwrap(), vec![1]);
        let before = process_cpu_time();
        tokio::time::sleep(Duration::from_millis(150)).await;
        process_cpu_time().saturating_sub(before)
    }

    /// PR-12: connections of a proc told not to busy-poll sleep as soon as
    /// they have nothing to read; with polling on, the same pair spins
    /// through its window (so the measurement can tell the two apart).
    #[tokio::test]
    async fn pr12_a_proc_told_not_to_poll_sleeps_at_once() {
        // Sleeping first: the spinning pair's connections go on spinning
        // for their window after the pair is dropped.
        let sleeping = idle_cpu_after_a_call("pr12-off", false).await;
        assert!(
            sleeping <= Duration::from_millis(30),
            "with polling off the connections sleep: {sleeping:?} of CPU in 150 ms"
        );
        let spinning = idle_cpu_after_a_call("pr12-on", true).await;
        assert!(
            spinning >= Duration::from_millis(60),
            "with polling on the connections spin while idle: {spinning:?} of CPU in 150 ms"
        );
    }

    /// One call of the LK-10 and LK-11 conversations: `round` goes to the
    /// echo actor and comes back.
    async fn echo_round(echo: &ActorRef<EchoActor>, client: &Mailbox, round: u32) {
        let payload = round.to_le_bytes().to_vec();
        let ping = |reply| Echo {
            payload: payload.clone(),
            reply,
        };
        assert_eq!(echo.call(client, ping).await.unwrap(), payload);
    }

    /// LK-10: on a shared connection a call's reply carries the
    /// acknowledgement of the call, and the next call that of the reply:
    /// with a 10 s ack interval, nothing waits for one.
    #[tokio::test]
    async fn lk10_calls_and_replies_acknowledge_each_other() {
        let config = ProcConfig {
            ack_interval: Duration::from_secs(10),
            ..quick()
        };
        let (a, b, _, echo_b, client_a, _) = pair_with("lk10", config).await;
        for round in 0..200u32 {
            echo_round(&echo_b, &client_a, round).await;
            assert_eq!(
                a.unacked_bytes(),
                0,
                "round {round}: the reply acknowledged the call"
            );
        }
        // Every reply but the last was acknowledged by the call after it.
        let piggybacked = |p: &Proc| p.stats().acks_piggybacked.load(Ordering::Relaxed);
        assert!(piggybacked(&b) >= 199, "b: {}", piggybacked(&b));
        assert!(piggybacked(&a) >= 198, "a: {}", piggybacked(&a));
        assert!(b.unacked_bytes() > 0, "the last reply waits for its ack");
    }

    /// LK-10: in a conversation whose calls come more often than the ack
    /// interval but never before the last reply, each reply and call
    /// carries the other's acknowledgement: the deadline of what is left
    /// starts when a data frame carried the rest, so it never passes and
    /// no acknowledgement is written alone to wake the peer.
    #[tokio::test]
    async fn lk10_a_steady_conversation_writes_no_acknowledgement_alone() {
        let config = ProcConfig {
            ack_interval: Duration::from_millis(20),
            ..quick()
        };
        let (a, b, _, echo_b, client_a, _) = pair_with("lk10-steady", config).await;
        let started = std::time::Instant::now();
        for round in 0..60u32 {
            echo_round(&echo_b, &client_a, round).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(started.elapsed() >= Duration::from_millis(200));
        let alone = |p: &Proc| p.stats().acks_alone.load(Ordering::Relaxed);
        // The last reply's may have gone alone by now; nothing else did.
        assert!(
            alone(&a) + alone(&b) <= 1,
            "acknowledgements written alone: a {}, b {}",
            alone(&a),
            alone(&b)
        );
    }

    /// LK-11: a proc that answers each call at once sleeps between calls
    /// with no acknowledgement timer: its replies carried every
    /// acknowledgement before it waited, so nothing wakes it until the
    /// next call. The caller, whose acknowledgement of a reply nothing
    /// carries within the interval, still writes it alone at its deadline.
    #[tokio::test]
    async fn lk11_a_request_answered_at_once_arms_no_acknowledgement_timer() {
        let config = ProcConfig {
            ack_interval: Duration::from_millis(5),
            ..quick()
        };
        let (a, b, _, echo_b, client_a, _) = pair_with("lk11", config).await;
        let wakes = |p: &Proc| p.stats().ack_timer_wakes.load(Ordering::Relaxed);
        let rounds = 30u32;
        for round in 0..rounds {
            echo_round(&echo_b, &client_a, round).await;
            tokio::time::sleep(Duration::from_millis(12)).await;
        }
        assert_eq!(
            wakes(&b),
            0,
            "the callee woke for its acknowledgement timer {} times in {rounds} calls",
            wakes(&b)
        );
        let alone = a.stats().acks_alone.load(Ordering::Relaxed);
        assert!(
            wakes(&a) >= u64::from(rounds / 2) && alone >= u64::from(rounds / 2),
            "the caller acknowledged the replies alone at their deadlines: {} wakes, {alone} alone",
            wakes(&a)
        );
    }

    /// LK-10: an acknowledgement that no data frame carries goes alone at
    /// its deadline, also after calls whose replies carried the earlier
    /// ones (the connection's one timer, moved on as the deadlines move).
    #[tokio::test]
    async fn lk10_an_acknowledgement_nothing_carries_goes_alone_at_its_deadline() {
        let config = ProcConfig {
            ack_interval: Duration::from_millis(30),
            ..quick()
        };
        let (a, b, _, echo_b, client_a, _) = pair_with("lk10-alone", config).await;
        for round in 0..20u32 {
            echo_round(&echo_b, &client_a, round).await;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        // The last reply waits for its acknowledgement, which nothing
        // carries: a writes it alone 30 ms after the reply came.
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while b.unacked_bytes() > 0 && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(b.unacked_bytes(), 0, "the last reply was acknowledged");
        let alone = a.stats().acks_alone.load(Ordering::Relaxed);
        assert!(alone >= 1, "a wrote its acknowledgement alone: {alone}");
    }

    /// LK-9: a proc that answers the proc that called it does so on the
    /// connection the caller dialed; neither dials a second one.
    #[tokio::test]
    async fn lk9_procs_that_talk_both_ways_share_one_connection() {
        let (a, b, echo_a, echo_b, client_a, client_b) = pair("lk9").await;
        for round in 0..3u8 {
            let ping = |payload: Vec<u8>| move |reply| Echo { payload, reply };
            assert_eq!(
                echo_b.call(&client_a, ping(vec![round])).await.unwrap(),
                vec![round]
            );
            assert_eq!(
                echo_a.call(&client_b, ping(vec![round, 1])).await.unwrap(),
                vec![round, 1]
            );
        }
        let dialed = |p: &Proc| p.stats().dialed.load(Ordering::Relaxed);
        let adopted = |p: &Proc| p.stats().adopted.load(Ordering::Relaxed);
        assert_eq!(
            (dialed(&a), dialed(&b)),
            (1, 0),
            "a dialed once; b answered, and called, on a's connection"
        );
        assert_eq!(adopted(&b), 1);
    }

    /// LK-9: two procs whose first messages cross both dial; the
    /// connection the smaller proc id dialed stays, and every message of
    /// both arrives once, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lk9_procs_that_dial_each_other_at_once_keep_one_connection() {
        for attempt in 0..5 {
            let test = format!("lk9x{attempt}");
            let (a, b, echo_a, echo_b, client_a, client_b) = pair(&test).await;
            for seq in 0..200 {
                echo_b.send(&client_a, Numbered { stream: 1, seq });
                echo_a.send(&client_b, Numbered { stream: 2, seq });
            }
            let (to_b, to_a) = tokio::join!(
                echo_b.call(&client_a, |reply| StreamReport { stream: 1, reply }),
                echo_a.call(&client_b, |reply| StreamReport { stream: 2, reply }),
            );
            for stats in [to_b.unwrap(), to_a.unwrap()] {
                assert_eq!((stats.received, stats.out_of_order), (200, 0));
            }
            // However the race went, the pair ends with the connection the
            // smaller id dialed, used both ways.
            let until = std::time::Instant::now() + Duration::from_secs(5);
            let open = |p: &Proc| p.stats().open_connections.load(Ordering::Relaxed);
            let shared = || open(&a) == 1 && open(&b) == 1;
            while !shared() && std::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let dialed = |p: &Proc| p.stats().dialed.load(Ordering::Relaxed);
            let adopted = |p: &Proc| p.stats().adopted.load(Ordering::Relaxed);
            let (small, large) = match a.id().to_string() < b.id().to_string() {
                true => (&a, &b),
                false => (&b, &a),
            };
            assert!(shared(), "{} and {} connections open", open(&a), open(&b));
            if dialed(small) + dialed(large) == 2 {
                assert!(
                    adopted(large) >= 1,
                    "both dialed: the larger proc adopted the smaller's connection (adopted {} and {})",
                    adopted(small),
                    adopted(large)
                );
            }
        }
    }

    /// LK-9 with LK-2: the one connection two procs share is cut again
    /// and again, from either end, while both stream to each other; every
    /// message arrives exactly once and in order both ways.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lk9_cutting_the_shared_connection_mid_stream_loses_nothing_both_ways() {
        const N: u64 = 20_000;
        let (a, b, echo_a, echo_b, client_a, client_b) = pair("lk9cut").await;
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stream = |client: Mailbox,
                      to: ActorRef<EchoActor>,
                      stream: u64,
                      done: Arc<std::sync::atomic::AtomicUsize>| async move {
            let dest = to.port::<Numbered>().id().clone();
            for seq in 0..N {
                client.ready(&dest).await;
                to.send(&client, Numbered { stream, seq });
                if seq % 50 == 49 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            done.fetch_add(1, Ordering::SeqCst);
            client
        };
        let ab = tokio::spawn(stream(client_a, echo_b.clone(), 1, done.clone()));
        let ba = tokio::spawn(stream(client_b, echo_a.clone(), 2, done.clone()));
        let mut cuts = 0;
        while done.load(Ordering::SeqCst) < 2 || cuts < 20 {
            tokio::time::sleep(Duration::from_millis(5 + 3 * (cuts % 4))).await;
            match cuts % 2 {
                0 => a.reset_links(),
                _ => b.reset_links(),
            }
            cuts += 1;
        }
        let client_a = ab.await.unwrap();
        let client_b = ba.await.unwrap();
        let to_b = echo_b
            .call(&client_a, |reply| StreamReport { stream: 1, reply })
            .await
            .unwrap();
        let to_a = echo_a
            .call(&client_b, |reply| StreamReport { stream: 2, reply })
            .await
            .unwrap();
        assert_eq!((to_b.received, to_b.out_of_order), (N, 0), "a to b");
        assert_eq!((to_a.received, to_a.out_of_order), (N, 0), "b to a");
        let reconnects = a.stats().reconnects.load(Ordering::Relaxed)
            + b.stats().reconnects.load(Ordering::Relaxed);
        assert!(
            reconnects >= 10,
            "{cuts} cuts made only {reconnects} reconnects"
        );
    }

    /// PR-11: while an actor is past its window and its messages are held
    /// back (PR-9), the same connection still brings this proc's link its
    /// acknowledgements: a stream the other way goes on at full speed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pr11_a_full_actor_does_not_stall_the_other_direction() {
        let config = ProcConfig {
            link_window: 16 << 10,
            port_window: 512,
            ..quick()
        };
        let (a, _b, echo_a, echo_b, client_a, client_b) = pair_with("pr11", config).await;
        // One connection both ways: a dials, b adopts it.
        let hi = echo_b
            .call(&client_a, |reply| Echo {
                payload: b"hi".to_vec(),
                reply,
            })
            .await
            .unwrap();
        assert_eq!(hi, b"hi");
        // a's actor sleeps while b floods it without waiting for its window.
        let asleep = client_b.open_once_port::<()>();
        echo_a.send(
            &client_b,
            Sleep {
                millis: 5000,
                reply: asleep.bind(),
            },
        );
        const FLOOD: u64 = 20_000;
        for seq in 0..FLOOD {
            echo_a.send(&client_b, Numbered { stream: 2, seq });
        }
        // Meanwhile a streams to b, waiting for its window before each send.
        const STREAM: u64 = 5_000;
        let started = std::time::Instant::now();
        let dest = echo_b.port::<Numbered>().id().clone();
        for seq in 0..STREAM {
            client_a.ready(&dest).await;
            echo_b.send(&client_a, Numbered { stream: 1, seq });
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(4),
            "a's stream took {took:?} while a's actor was full: its acknowledgements were held up"
        );
        assert!(a.stats().paused_reads.load(Ordering::Relaxed) > 0);
        let to_b = echo_b
            .call(&client_a, |reply| StreamReport { stream: 1, reply })
            .await
            .unwrap();
        assert_eq!((to_b.received, to_b.out_of_order), (STREAM, 0));
        let to_a = echo_a
            .call(&client_b, |reply| StreamReport { stream: 2, reply })
            .await
            .unwrap();
        assert_eq!((to_a.received, to_a.out_of_order), (FLOOD, 0));
    }

    #[tokio::test]
    async fn lk6_a_peer_known_to_have_ended_fails_calls_at_once() {
        let dir = std::env::temp_dir();
        let addr: ChannelAddr = format!("unix:{}/lk6-{}.sock", dir.display(), new_session_id())
            .parse()
            .unwrap();
        let a = local("a").await;
        let b = Proc::serve_with_config("b", addr.clone(), quick())
            .await
            .unwrap();
        let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client, _) = a.attach("client").unwrap();
        let reply = echo.start_call(&client, |reply| Sleep {
            millis: 5_000,
            reply,
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = std::time::Instant::now();
        a.peer_ended(&addr, "stopped by its owner");
        let err = reply
            .recv_timeout(Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "{err}");
        assert!(err.to_string().contains("stopped by its owner"), "{err}");
    }

    #[tokio::test]
    async fn a_message_sent_by_reference_arrives_whole_and_the_sender_keeps_it() {
        let near = Proc::serve_with_config("near", unix_addr("sref", "a"), quick())
            .await
            .unwrap();
        // Over a socket (archived from the sender's value) and within the
        // proc (a copy handed over), the receiver gets the same value.
        let far = Proc::serve_with_config("far", unix_addr("sref", "b"), quick())
            .await
            .unwrap();
        let (sender, _) = near.attach("sender").unwrap();
        for receiving in [&far, &near] {
            let (receiver, _) = receiving.attach("receiver").unwrap();
            let mut port = receiver.open_port::<(u64, Vec<String>)>();
            let port_ref = port.bind();
            let mut message = (0u64, vec!["first".to_string()]);
            for n in 1..=3u64 {
                message.0 = n;
                message.1.push(format!("name {n}"));
                port_ref.send_ref(&sender, &message);
            }
            assert_eq!(message.1.len(), 4, "the sender keeps its value");
            for n in 1..=3u64 {
                let (got, names) = port.recv().await.unwrap();
                assert_eq!(got, n);
                assert_eq!(names.len(), n as usize + 1);
                assert_eq!(names.last().unwrap(), &format!("name {n}"));
            }
        }
    }

    #[tokio::test]
    async fn pr6_a_proc_with_a_token_refuses_procs_without_it() {
        let dir = std::env::temp_dir();
        let sock = |n: &str| -> ChannelAddr {
            format!("unix:{}/pr6-{}-{n}.sock", dir.display(), new_session_id())
                .parse()
                .unwrap()
        };
        let with = |token: Option<&str>| ProcConfig {
            cluster_token: token.and_then(ClusterToken::new),
            delivery_timeout: Duration::from_millis(300),
            ..quick()
        };
        let guarded = Proc::serve_with_config("guarded", sock("g"), with(Some("s3cret")))
            .await
            .unwrap();
        let echo = guarded
            .spawn("echo", 0, EchoActor::default())
            .unwrap()
            .bind();
        let echo_call = |client: Mailbox| {
            let echo = echo.clone();
            async move {
                echo.call_timeout(
                    &client,
                    |reply| Echo {
                        payload: b"hi".to_vec(),
                        reply,
                    },
                    Duration::from_secs(2),
                )
                .await
            }
        };
        let friend = Proc::serve_with_config("friend", sock("f"), with(Some("s3cret")))
            .await
            .unwrap();
        let (client, _) = friend.attach("client").unwrap();
        assert_eq!(echo_call(client).await.unwrap(), b"hi");
        for (name, token) in [("stranger", None), ("impostor", Some("guess"))] {
            let other = Proc::serve_with_config(name, sock(name), with(token))
                .await
                .unwrap();
            let (client, _) = other.attach("client").unwrap();
            assert!(echo_call(client).await.is_err(), "{name} got through");
        }
        assert!(guarded.stats().bad_frames.load(Ordering::Relaxed) >= 2);
        assert!(format!("{:?}", with(Some("s3cret"))).contains("ClusterToken(..)"));
    }

    #[tokio::test]
    async fn pr3_unknown_actor_comes_back_and_fails_the_call() {
        let a = local("a").await;
        let b = local("b").await;
        let (client, mut returned) = a.attach("client").unwrap();
        let ghost: ActorRef<EchoActor> = ActorRef::attest(b.id().actor_id("ghost", 0).unwrap());
        let err = ghost
            .call(&client, |reply| Echo {
                payload: vec![],
                reply,
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Undeliverable(DeliveryFailure::UnknownActor { .. })
            ),
            "{err}"
        );
        let undeliverable = returned.recv().await.unwrap();
        assert!(
            undeliverable.message_type.ends_with("Echo"),
            "{undeliverable}"
        );
        assert!(matches!(
            undeliverable.reason,
            DeliveryFailure::UnknownActor { .. }
        ));
    }

    #[tokio::test]
    async fn pr3_unreachable_peer_fails_the_call_after_the_delivery_timeout() {
        let a = local("a").await;
        let (client, mut returned) = a.attach("client").unwrap();
        let nowhere: ProcId = "local:nobody-serves-this,x".parse().unwrap();
        let ghost: ActorRef<EchoActor> = ActorRef::attest(nowhere.actor_id("echo", 0).unwrap());
        let started = std::time::Instant::now();
        let err = ghost
            .call(&client, |reply| Echo {
                payload: vec![],
                reply,
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Undeliverable(DeliveryFailure::Unreachable { .. })
            ),
            "{err}"
        );
        assert!(started.elapsed() >= Duration::from_millis(500));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(matches!(
            returned.recv().await.unwrap().reason,
            DeliveryFailure::Unreachable { .. }
        ));
    }

    #[tokio::test]
    async fn ac3_a_panicking_actor_fails_alone_and_its_callers_hear_why() {
        let a = local("a").await;
        let b = local("b").await;
        let mut events = b.supervision_events().unwrap();
        let doomed = b.spawn("doomed", 0, EchoActor::default()).unwrap();
        let sibling = b.spawn("sibling", 0, EchoActor::default()).unwrap().bind();
        let doomed_ref = doomed.bind();
        let (client, _) = a.attach("client").unwrap();
        // A call queued behind the panic fails with the same event.
        let slow = doomed_ref.call(&client, |reply| Sleep { millis: 50, reply });
        let boom = doomed_ref.call(&client, |reply| Panic {
            text: "boom".into(),
            reply,
        });
        let queued = doomed_ref.call(&client, |reply| Echo {
            payload: vec![1],
            reply,
        });
        let (slow, boom, queued) = tokio::join!(slow, boom, queued);
        slow.unwrap();
        let CallError::Supervision(event) = boom.unwrap_err() else {
            panic!("expected supervision")
        };
        assert_eq!(event.actor_id, *doomed.actor_id());
        assert!(event.reason.contains("boom"), "{event}");
        assert!(event.message.as_deref().unwrap().ends_with("Panic"));
        assert_eq!(queued.unwrap_err(), CallError::Supervision(event.clone()));
        assert_eq!(events.recv().await.unwrap(), event);
        assert_eq!(doomed.join().await, ActorStatus::Failed(event.clone()));
        // Later calls fail at once with the event; the sibling lives on.
        let later = doomed_ref
            .call(&client, |reply| Echo {
                payload: vec![],
                reply,
            })
            .await
            .unwrap_err();
        assert_eq!(later, CallError::Supervision(event));
        let alive = sibling
            .call(&client, |reply| Echo {
                payload: vec![7],
                reply,
            })
            .await
            .unwrap();
        assert_eq!(alive, vec![7]);
    }

    #[tokio::test]
    async fn ac3_a_handler_error_is_fatal_too() {
        let a = local("a").await;
        let actor = a.spawn("failing", 0, EchoActor::default()).unwrap();
        let (client, _) = a.attach("client").unwrap();
        let err = actor
            .bind()
            .call(&client, |reply| Fail {
                text: "bad state".into(),
                reply,
            })
            .await
            .unwrap_err();
        let CallError::Supervision(event) = err else {
            panic!("{err}")
        };
        assert!(event.reason.contains("bad state"));
    }

    #[tokio::test]
    async fn ac2_stop_drains_then_refuses() {
        let a = local("a").await;
        let actor = a.spawn("draining", 0, EchoActor::default()).unwrap();
        let echo = actor.bind();
        let (client, _) = a.attach("client").unwrap();
        let queued: Vec<_> = (0..10u8)
            .map(|i| {
                echo.call(&client, move |reply| Echo {
                    payload: vec![i],
                    reply,
                })
            })
            .collect();
        // The calls are posted only when polled; poll them into the queue first.
        let mut queued: Vec<_> = queued.into_iter().map(Box::pin).collect();
        for call in &mut queued {
            assert!(futures::poll!(call.as_mut()).is_pending());
        }
        actor.stop();
        for (i, call) in queued.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), vec![i as u8]);
        }
        assert_eq!(actor.join().await, ActorStatus::Stopped);
        let err = echo
            .call(&client, |reply| Echo {
                payload: vec![],
                reply,
            })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                CallError::Undeliverable(DeliveryFailure::StoppedReceiver { .. })
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn calls_time_out_when_no_reply_comes() {
        let a = local("a").await;
        let echo = a.spawn("sleepy", 0, EchoActor::default()).unwrap().bind();
        let (client, _) = a.attach("client").unwrap();
        let err = echo
            .call_timeout(
                &client,
                |reply| Sleep {
                    millis: 2000,
                    reply,
                },
                Duration::from_millis(50),
            )
            .await
            .unwrap_err();
        assert_eq!(err, CallError::Timeout(Duration::from_millis(50)));
    }

    #[tokio::test]
    async fn duplicate_names_are_refused_until_the_first_ends() {
        let a = local("a").await;
        let first = a.spawn("solo", 0, EchoActor::default()).unwrap();
        assert!(matches!(
            a.spawn("solo", 0, EchoActor::default()),
            Err(ProcError::Duplicate(_))
        ));
        first.stop();
        first.join().await;
        a.spawn("solo", 0, EchoActor::default()).unwrap();
    }

    /// LK-2 from the receiver's side: frames resent on a new connection of
    /// the same session are dropped, and acknowledged, so the sender can
    /// let them go.
    #[tokio::test]
    async fn duplicates_after_a_reconnect_are_dropped_and_acknowledged() {
        use crate::channel::transport;
        use crate::message::handler_port;

        let b = local("b").await;
        let echo = b.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let sender = b.id().actor_id("peer", 0).unwrap();
        let frames: Vec<_> = (0..3u64)
            .map(|seq| {
                let frame = Numbered { stream: 9, seq }
                    .encode_into(frame_buffer(256))
                    .unwrap();
                let len = (frame.len() - HEADER_LEN) as u32;
                let envelope = Envelope {
                    sender: sender.clone(),
                    dest: echo.actor_id().port_id(handler_port::<Numbered>()),
                    return_port: None,
                    message_type: TypeName::Static("Numbered"),
                    body: Body::Message { offset: 0, len },
                };
                let mut frame = encode_envelope(&envelope, frame).unwrap();
                finish_frame(&mut frame, FrameKind::Data, seq + 1);
                frame
            })
            .collect();
        for round in 0..2 {
            let (mut rd, wr) = transport::connect(b.id().addr())
                .await
                .unwrap()
                .into_split()
                .unwrap();
            wr.write_all(&small_frame(FrameKind::Hello, 77, b"peer"))
                .await
                .unwrap();
            for frame in &frames {
                wr.write_all(frame).await.unwrap();
            }
            let mut reader = FrameReader::new(1 << 16);
            let acked = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    if let Some((header, _)) = reader.next_frame().unwrap() {
                        assert_eq!(header.kind, FrameKind::Ack);
                        break header.seq;
                    }
                    assert!(
                        reader.fill(&mut rd).await.unwrap(),
                        "round {round}: connection closed"
                    );
                }
            })
            .await
            .expect("an acknowledgement within 5 s");
            assert_eq!(acked, 3, "round {round}: everything acknowledged");
        }
        let (client, _) = b.attach("client").unwrap();
        let stats = echo
            .call(&client, |reply| StreamReport { stream: 9, reply })
            .await
            .unwrap();
        assert_eq!(stats.received, 3, "each frame delivered once");
        assert_eq!(b.stats().duplicates_dropped.load(Ordering::Relaxed), 3);
    }

    /// PR-8: sessions of senders gone past the TTL are forgotten, so a
    /// churn of peers leaves nothing behind; a session with a connection
    /// open stays however long it idles.
    #[tokio::test]
    async fn sessions_of_senders_gone_past_the_ttl_are_forgotten() {
        use crate::channel::transport;

        let config = ProcConfig {
            delivery_timeout: Duration::from_millis(50),
            session_ttl: Duration::from_millis(100),
            ..ProcConfig::default()
        };
        let addr = format!("local:ttl-{}", new_session_id()).parse().unwrap();
        let b = Proc::serve_with_config("b", addr, config).await.unwrap();
        let hello = |session: u64| small_frame(FrameKind::Hello, session, b"peer");
        let (_kept_rd, kept) = transport::connect(b.id().addr())
            .await
            .unwrap()
            .into_split()
            .unwrap();
        kept.write_all(&hello(1)).await.unwrap();
        for session in 2..=200u64 {
            let (rd, wr) = transport::connect(b.id().addr())
                .await
                .unwrap()
                .into_split()
                .unwrap();
            wr.write_all(&hello(session)).await.unwrap();
            drop((rd, wr));
        }
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while b.receiver_sessions() < 200 && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(b.receiver_sessions() > 1, "{}", b.receiver_sessions());
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(b.receiver_sessions(), 1, "only the open one is left");
    }

    /// A connection that closes before its first byte (a readiness probe,
    /// a port scan) is no bad frame: nothing is counted or warned about.
    #[tokio::test]
    async fn a_probe_that_connects_and_hangs_up_is_not_a_bad_frame() {
        use crate::channel::transport;

        let b = local("b").await;
        for _ in 0..3 {
            drop(transport::connect(b.id().addr()).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(b.stats().bad_frames.load(Ordering::Relaxed), 0);
        // A connection that breaks off inside its hello still is one.
        let (_rd, wr) = transport::connect(b.id().addr())
            .await
            .unwrap()
            .into_split()
            .unwrap();
        wr.write_all(&small_frame(FrameKind::Hello, 1, b"peer")[..10])
            .await
            .unwrap();
        drop(wr);
        drop(_rd);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(b.stats().bad_frames.load(Ordering::Relaxed), 1);
    }

    /// PR-7: a session this proc never saw, whose first frame is numbered
    /// past 1, began with an earlier incarnation: the proc answers
    /// `Restarted` and delivers nothing; a new session from 1 is accepted.
    #[tokio::test]
    async fn a_link_from_an_earlier_incarnation_is_told_of_the_restart() {
        use crate::channel::transport;

        let b = local("b").await;
        let frame = |seq: u64| {
            let mut frame = frame_buffer(8);
            frame.extend_from_slice(&[0u8; 8]);
            finish_frame(&mut frame, FrameKind::Data, seq);
            frame
        };
        let (mut rd, wr) = transport::connect(b.id().addr())
            .await
            .unwrap()
            .into_split()
            .unwrap();
        wr.write_all(&small_frame(FrameKind::Hello, 5150, b"peer"))
            .await
            .unwrap();
        wr.write_all(&frame(6)).await.unwrap();
        let mut reader = FrameReader::new(1 << 16);
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some((header, _)) = reader.next_frame().unwrap() {
                    break Some(header.kind);
                }
                if !reader.fill(&mut rd).await.unwrap() {
                    break None;
                }
            }
        })
        .await
        .expect("an answer within 5 s");
        assert_eq!(answer, Some(FrameKind::Restarted));
        assert_eq!(b.stats().bad_frames.load(Ordering::Relaxed), 0);
    }

    /// A connection polls twice as long as its frames have lately taken to
    /// come, between `busy_poll` and 1 ms; only `busy_poll` when they come
    /// further apart; never when `busy_poll` is zero.
    #[test]
    fn a_connection_polls_as_long_as_its_peer_lately_took() {
        let us = Duration::from_micros;
        let mut pace = Pace::new(us(50), SPIN_MAX);
        assert_eq!(pace.budget(), us(50));
        for _ in 0..20 {
            pace.came(us(80));
        }
        let budget = pace.budget();
        assert!(budget > us(150) && budget <= us(160), "{budget:?}");
        for _ in 0..20 {
            pace.came(Duration::from_millis(30));
        }
        assert_eq!(pace.budget(), us(50));
        let mut off = Pace::new(Duration::ZERO, SPIN_MAX);
        for _ in 0..20 {
            off.came(us(80));
        }
        assert_eq!(off.budget(), Duration::ZERO);
    }
    /// A call from `client` to `echo` that must come back; how long it took.
    async fn echo_time(echo: &ActorRef<EchoActor>, client: &Mailbox) -> Duration {
        let started = std::time::Instant::now();
        echo.call(client, |reply| Echo {
            payload: b"ping".to_vec(),
            reply,
        })
        .await
        .expect("the echo answers");
        started.elapsed()
    }

    /// IM-1, IM-2: a cut holds what a proc sends to its peer until the
    /// cut ends, then delivers all of it, in order and once, over a link
    /// (Unix sockets) and between in-process procs alike.
    #[tokio::test]
    async fn im1_a_cut_holds_messages_until_it_ends_then_delivers_them_in_order() {
        let (a, b, _, echo_b, client_a, _) = pair("im1").await;
        let (la, lb) = (local("im1a").await, local("im1b").await);
        let echo_lb = lb.spawn("echo", 0, EchoActor::default()).unwrap().bind();
        let (client_la, _) = la.attach("client").unwrap();
        for (from, to, echo, client) in [
            (&a, &b, &echo_b, &client_a),
            (&la, &lb, &echo_lb, &client_la),
        ] {
            echo_time(echo, client).await;
            let cut = Duration::from_millis(300);
            from.cut_to(to.id().addr(), cut);
            assert_eq!(from.impaired_peers(), vec![to.id().addr().clone()]);
            let started = std::time::Instant::now();
            for seq in 0..1000 {
                echo.send(client, Numbered { stream: 7, seq });
            }
            let stats = echo
                .call(client, |reply| StreamReport { stream: 7, reply })
                .await
                .unwrap();
            assert!(started.elapsed() >= cut, "held for the cut");
            assert_eq!((stats.received, stats.out_of_order), (1000, 0));
            // Over: messages go at once again, and nothing is left impaired.
            assert!(echo_time(echo, client).await < Duration::from_millis(200));
            assert!(from.impaired_peers().is_empty());
        }
    }

    /// IM-1: a delay adds itself to each message for as long as it lasts,
    /// and only in the direction it was made.
    #[tokio::test]
    async fn im1_a_delay_slows_one_direction_for_its_duration() {
        let (a, b, _, echo_b, client_a, _) = pair("im1d").await;
        echo_time(&echo_b, &client_a).await;
        let delay = Duration::from_millis(500);
        a.delay_to(b.id().addr(), delay, Duration::from_millis(1600));
        for _ in 0..2 {
            // The request waits; the reply, from b to a, does not.
            let took = echo_time(&echo_b, &client_a).await;
            assert!(
                (delay..delay * 2).contains(&took),
                "a to b is delayed once: {took:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(echo_time(&echo_b, &client_a).await < Duration::from_millis(400));
    }

    /// IM-3: a message held past the delivery timeout fails as
    /// undeliverable, as over a real cut; IM-4: healing sends the rest at
    /// once.
    #[tokio::test]
    async fn im3_a_cut_past_the_delivery_timeout_fails_the_call_and_heal_ends_it() {
        let (a, b, _, echo_b, client_a, _) = pair("im3").await;
        echo_time(&echo_b, &client_a).await;
        // quick(): a delivery timeout of 500 ms.
        a.cut_to(b.id().addr(), Duration::from_secs(30));
        let started = std::time::Instant::now();
        let failed = echo_b
            .call(&client_a, |reply| Echo {
                payload: vec![],
                reply,
            })
            .await
            .expect_err("held past the delivery timeout");
        let took = started.elapsed();
        assert!(
            matches!(
                failed,
                CallError::Undeliverable(DeliveryFailure::Unreachable { .. })
            ),
            "{failed}"
        );
        assert!(failed.to_string().contains("on purpose"), "{failed}");
        assert!(
            (Duration::from_millis(450)..Duration::from_secs(5)).contains(&took),
            "fails at the delivery timeout: {took:?}"
        );
        // Still cut: a new call waits; healing lets it through at once.
        let call = {
            let (echo, client) = (echo_b.clone(), client_a.clone());
            tokio::spawn(async move { echo_time(&echo, &client).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.heal_to(None);
        let took = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .expect("healing sends what the cut held")
            .unwrap();
        assert!(took < Duration::from_millis(450), "{took:?}");
    }
}

#[cfg(test)]
mod tracing_tests {
    use std::sync::{Arc, Mutex};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::{Context, SubscriberExt};

    use crate::Proc;
    use crate::testing::{Echo, EchoActor};

    /// Records each new span as `name field=value ...`.
    #[derive(Clone, Default)]
    struct Spans(Arc<Mutex<Vec<String>>>);

    struct Fields(String);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={:?}", field.name(), value));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Spans {
        fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
            let mut fields = Fields(attrs.metadata().name().to_string());
            attrs.record(&mut fields);
            if let Ok(mut spans) = self.0.lock() {
                spans.push(fields.0);
            }
        }
    }

    #[test]
    fn send_deliver_and_handle_have_spans_with_actor_ids() {
        let spans = Spans::default();
        let subscriber = tracing_subscriber::registry()
            .with(spans.clone())
            .with(tracing_subscriber::filter::LevelFilter::TRACE);
        tracing::subscriber::with_default(subscriber, || {
            // Other tests' threads may have registered these spans'
            // callsites while this subscriber was being set, caching an
            // interest that leaves it out; recompute it with it in.
            tracing::callsite::rebuild_interest_cache();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let proc = Proc::serve("traced", "local:tracing-test".parse().unwrap())
                    .await
                    .unwrap();
                let echo = proc.spawn("echo", 0, EchoActor::default()).unwrap().bind();
                let (client, _) = proc.attach("client").unwrap();
                echo.call(&client, |reply| Echo {
                    payload: vec![1],
                    reply,
                })
                .await
                .unwrap();
            });
        });
        let spans = spans.0.lock().unwrap().clone();
        let find = |prefix: &str, needle: &str| {
            spans
                .iter()
                .any(|span| span.starts_with(prefix) && span.contains(needle))
        };
        assert!(
            find("send", "from=local:tracing-test,traced,client[0]"),
            "{spans:#?}"
        );
        assert!(
            find("send", "to=local:tracing-test,traced,echo[0]"),
            "{spans:#?}"
        );
        assert!(
            find("deliver", "actor=local:tracing-test,traced,echo[0]"),
            "{spans:#?}"
        );
        assert!(
            find("handle", "actor=local:tracing-test,traced,echo[0]"),
            "{spans:#?}"
        );
        assert!(
            find("handle", "message=hyperactor::testing::Echo"),
            "{spans:#?}"
        );
    }
}
