//! Casting: messages to many actors carried down a multicast tree of
//! per-proc comm actors, and their replies folded on the way back up.
//!
//! A cast names its procs in tree order, each with the ranks to deliver to
//! there. The caster sends it to at most `fanout` children; each child
//! delivers to its own actors and forwards the rest of its subtree the same
//! way. Replies travel back up the same tree: every node folds its actors'
//! replies and its children's partial results ([`crate::reduce`]) into one
//! message for its parent.
//!
//! Invariants:
//! - CA-1: the tree depends only on the caster's list of procs and the
//!   fan-out, never on which ranks are selected: a subtree without selected
//!   ranks is skipped whole, but the path to a proc never changes. With each
//!   hop FIFO and each comm actor handling messages in order, messages from
//!   one sender reach each actor in the order they were sent.
//! - CA-2: a node sends at most `fanout` messages per cast; the caster
//!   receives one reply per call (streams: one per rank).
//! - CA-3: when a proc dies, the node waiting on it (its parent in the tree)
//!   fails the dead proc's own ranks and forwards the cast to the dead
//!   proc's children itself; a node that gets a cast again answers the new
//!   parent with what it has or will have. Ranks on live procs complete.
//! - CA-4: every local delivery of a node ends within the cast's timeout,
//!   so every live subtree answers.
//! - CA-5: broadcasts send nothing back up the tree: each rank's error goes
//!   straight to the caster, and nodes keep a broadcast (to take over the
//!   children of a proc that dies) until its timeout passes.
//! - CA-6: a leaf whose parent is the caster folds each local actor's reply
//!   in the task that delivers it (`Mailbox::start_call_then`): no task or
//!   timer per rank. The caster keeps the cast's deadline itself; a call
//!   still unanswered at the timeout is ended, its port closed and its
//!   rank failed with `Timeout`, when the comm actor next takes a cast.
//! - CA-7: such a leaf cast from another proc is taken in the task that
//!   read it, when the comm actor is idle with nothing queued
//!   (`Exports::handle_inline`, AC-5 of hyperactor) and every link has
//!   room: the comm actor's task is not woken for it. It is the same
//!   delivery as CA-6, and a cast the comm actor has seen before (CA-3)
//!   still goes to its queue.
//! - CA-8: a node with a parent or children of its own folds its local
//!   actors' replies the same way, in the task that delivers each, and
//!   keeps one timer for all of them (CA-4), dropped with the last reply:
//!   no task or timer per rank there either.
//!
//! A cast's message is shared, not copied, between the children it goes to
//! ([`SharedBytes`]): each child's frame is archived from the one buffer, and
//! a leaf hands the buffer it decoded to its last local actor.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use hyperactor::message::handler_port;
use hyperactor::{
    Actor, ActorId, Context, DeliveryFailure, Exports, Handler, Mailbox, OncePortRef, PendingCall,
    PortId, PortRef, ProcId, RemoteMessage,
};
use parking_lot::{Mutex, MutexGuard};
use rkyv::Place;
use rkyv::rancor::Fallible;
use rkyv::ser::{Allocator, Writer};
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::with::{ArchiveWith, DeserializeWith, SerializeWith};

use crate::reduce::{Fold, Partial, RankError, Reducer};
use crate::trace::{NodeTrace, SpanRecord, TraceParent};

/// The name of the comm actor in every proc of a mesh.
pub const COMM_ACTOR: &str = "monarch.comm";

/// The default fan-out of multicast trees.
pub const DEFAULT_FANOUT: u32 = 16;

/// The message every actor of an actor mesh handles: a named endpoint and
/// bytes; the reply is the endpoint's bytes or its error text.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct MeshCall {
    /// The endpoint's name.
    pub endpoint: String,
    /// The message bytes.
    pub message: Vec<u8>,
    /// Whether nobody waits for the reply (a broadcast): an actor whose
    /// endpoint returns an error to it fails, as in Monarch, since no
    /// caller would hear of the error.
    pub broadcast: bool,
    /// How long the handler may take, in milliseconds; 0 leaves it to
    /// the actor's own default.
    pub handler_timeout_ms: u64,
    /// Where the result goes. The error is the endpoint's error text, or
    /// an encoded [`Fault`](crate::Fault).
    pub reply: OncePortRef<Result<Vec<u8>, String>>,
}

/// What a cast does with replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum CastMode {
    /// Gather every reply in rank order.
    Gather,
    /// Reduce the replies with a host-native reducer.
    Reduce(Reducer),
    /// Send each reply to the caster as it comes.
    Stream,
    /// Fire and forget; errors go to the caster.
    Broadcast,
}

impl CastMode {
    /// How nodes fold replies in this mode.
    pub fn fold(self) -> Fold {
        match self {
            CastMode::Gather => Fold::Gather,
            CastMode::Reduce(reducer) => Fold::Reduce(reducer),
            CastMode::Stream | CastMode::Broadcast => Fold::Discard,
        }
    }
}

/// Part of a cast's tree: procs in tree order, each with its ranks.
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Subtree {
    /// The position of `procs[0]` among all the caster's procs.
    pub start: u32,
    /// The procs; `procs[0]` is the subtree's root.
    pub procs: Vec<ProcId>,
    /// The ranks to deliver to on each proc.
    pub ranks: Vec<Vec<u32>>,
}

/// A cast on its way down the tree.
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Cast {
    /// The caster's reply port; with `seq` it names the cast.
    pub origin: PortId,
    /// The caster's number for the cast.
    pub seq: u64,
    /// The actor mesh: actors are `mesh[rank]` in their procs.
    pub mesh: String,
    /// This node's subtree.
    pub tree: Subtree,
    /// The endpoint to call.
    pub endpoint: String,
    /// The message bytes, shared by the casts to every child (archived as
    /// a plain `Vec<u8>`).
    #[rkyv(with = SharedBytes)]
    pub message: Arc<Vec<u8>>,
    /// What to do with replies.
    pub mode: CastMode,
    /// Where this subtree's partial result goes.
    pub parent: PortRef<CastReply>,
    /// How long each actor has to reply, in milliseconds.
    pub timeout_ms: u64,
    /// How long each actor's handler may take, in milliseconds (0: the
    /// actor's own default).
    pub handler_timeout_ms: u64,
    /// The tree's fan-out.
    pub fanout: u32,
    /// The trace context of a traced cast ([`crate::trace`]); `None` when
    /// the caster does not trace (TR-1).
    pub trace: Option<TraceParent>,
}

/// Archives an `Arc<Vec<u8>>` exactly as a `Vec<u8>` (the same bytes on
/// the wire), straight from the shared buffer: a cast to `n` children
/// archives its message `n` times, into each child's frame, instead of
/// cloning it `n` times first. Decoding makes a new, unshared buffer.
pub struct SharedBytes;

impl ArchiveWith<Arc<Vec<u8>>> for SharedBytes {
    type Archived = ArchivedVec<u8>;
    type Resolver = VecResolver;

    fn resolve_with(field: &Arc<Vec<u8>>, resolver: VecResolver, out: Place<ArchivedVec<u8>>) {
        ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> SerializeWith<Arc<Vec<u8>>, S> for SharedBytes {
    fn serialize_with(field: &Arc<Vec<u8>>, serializer: &mut S) -> Result<VecResolver, S::Error> {
        ArchivedVec::<u8>::serialize_from_slice(field.as_slice(), serializer)
    }
}

impl<D: Fallible + ?Sized> DeserializeWith<ArchivedVec<u8>, Arc<Vec<u8>>, D> for SharedBytes {
    fn deserialize_with(field: &ArchivedVec<u8>, _: &mut D) -> Result<Arc<Vec<u8>>, D::Error> {
        Ok(Arc::new(field.as_slice().to_vec()))
    }
}

/// The bytes of a shared message for one more receiver: the buffer itself
/// when nothing else holds it, else a copy.
fn unshare(message: Arc<Vec<u8>>) -> Vec<u8> {
    Arc::try_unwrap(message).unwrap_or_else(|shared| shared.as_ref().clone())
}

/// A reply travelling up the tree, or straight to the caster.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum CastReply {
    /// A subtree (positions `start..end`) has finished.
    Subtree {
        /// The caster's reply port.
        origin: PortId,
        /// The cast.
        seq: u64,
        /// The first position of the subtree.
        start: u32,
        /// One past its last position.
        end: u32,
        /// Its folded replies.
        partial: Partial,
        /// The finished spans of the subtree, when the cast is traced.
        spans: Vec<SpanRecord>,
    },
    /// One rank's reply, sent straight to the caster: every reply of a
    /// stream, the errors of a broadcast.
    Item {
        /// The cast.
        seq: u64,
        /// The rank.
        rank: u32,
        /// Its reply.
        result: Result<Vec<u8>, RankError>,
    },
}

/// A proc has died; comm actors waiting on it fail its ranks and take over
/// its children (CA-3).
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ProcDied {
    /// The proc.
    pub proc: ProcId,
    /// Why: its exit status, a signal, or lost heartbeats.
    pub reason: String,
}

/// Why a proc is gone, as its owner says it when it stops one on purpose
/// (the reason of [`ProcDied`] and of the client's events).
pub const STOPPED_BY_OWNER: &str = "stopped by its owner";

/// The error of a rank whose proc is gone: stopped by its owner, or lost.
pub fn proc_gone(proc: &ProcId, reason: &str) -> RankError {
    if reason.contains(STOPPED_BY_OWNER) {
        RankError::Stopped(format!("proc {proc} was {STOPPED_BY_OWNER}"))
    } else {
        RankError::Lost(format!("proc {proc} died: {reason}"))
    }
}

/// The comm actor port of `proc` for messages of type `M`.
pub fn comm_port<M: RemoteMessage>(proc: &ProcId) -> Option<PortRef<M>> {
    let actor = proc.actor_id(COMM_ACTOR, 0).ok()?;
    Some(PortRef::attest(actor.port_id(handler_port::<M>())))
}

/// Splits positions `lo..hi` into at most `fanout` contiguous, balanced
/// chunks; each chunk's first position is the child that heads it.
pub fn split(lo: usize, hi: usize, fanout: usize) -> Vec<(usize, usize)> {
    let n = hi.saturating_sub(lo);
    if n == 0 {
        return Vec::new();
    }
    let chunks = n.min(fanout.max(1));
    let (base, extra) = (n / chunks, n % chunks);
    let mut out = Vec::with_capacity(chunks);
    let mut at = lo;
    for i in 0..chunks {
        let len = base + usize::from(i < extra);
        out.push((at, at + len));
        at += len;
    }
    out
}

/// What a node of the tree (a comm actor, or the caster at the root)
/// knows about one cast in flight.
pub(crate) struct Node {
    pub(crate) origin: PortId,
    pub(crate) seq: u64,
    pub(crate) mesh: String,
    pub(crate) tree: Subtree,
    pub(crate) endpoint: String,
    pub(crate) message: Arc<Vec<u8>>,
    pub(crate) mode: CastMode,
    pub(crate) timeout_ms: u64,
    pub(crate) handler_timeout_ms: u64,
    pub(crate) fanout: u32,
    /// Child subtrees not yet reported, as index ranges into `tree.procs`.
    pub(crate) waiting: Vec<(usize, usize)>,
    /// Local deliveries not yet answered.
    pub(crate) local_left: usize,
    pub(crate) partial: Partial,
    pub(crate) deadline: Instant,
    /// This node's span and its subtree's, when the cast is traced.
    pub(crate) trace: Option<NodeTrace>,
}

impl Node {
    fn has_ranks(&self, lo: usize, hi: usize) -> bool {
        self.tree.ranks[lo..hi].iter().any(|r| !r.is_empty())
    }

    /// Sends the cast to the subtrees in `chunks`, taking over the children
    /// of any that is known dead. Returns the ranks failed on the way.
    pub(crate) fn forward(
        &mut self,
        sender: &Mailbox,
        me: &PortRef<CastReply>,
        chunks: Vec<(usize, usize)>,
        dead: &HashMap<ProcId, String>,
    ) -> Vec<(u32, RankError)> {
        let mut failed = Vec::new();
        let mut queue: VecDeque<(usize, usize)> = chunks.into();
        // One cast for every child, its subtree changed between sends: the
        // names and the message are not copied once per child.
        let mut cast: Option<Cast> = None;
        while let Some((lo, hi)) = queue.pop_front() {
            if !self.has_ranks(lo, hi) {
                continue;
            }
            let head = &self.tree.procs[lo];
            if let Some(reason) = dead.get(head) {
                failed.extend(self.fail_own(lo, reason));
                queue.extend(split(lo + 1, hi, self.fanout as usize));
                continue;
            }
            let Some(port) = comm_port::<Cast>(head) else {
                failed.extend(self.fail_own(lo, "the proc's name is not valid"));
                queue.extend(split(lo + 1, hi, self.fanout as usize));
                continue;
            };
            self.waiting.push((lo, hi));
            let cast = cast.get_or_insert_with(|| Cast {
                origin: self.origin.clone(),
                seq: self.seq,
                mesh: self.mesh.clone(),
                tree: Subtree {
                    start: 0,
                    procs: Vec::new(),
                    ranks: Vec::new(),
                },
                endpoint: self.endpoint.clone(),
                message: self.message.clone(),
                mode: self.mode,
                parent: me.clone(),
                timeout_ms: self.timeout_ms,
                handler_timeout_ms: self.handler_timeout_ms,
                fanout: self.fanout,
                trace: None,
            });
            cast.tree.start = self.tree.start + lo as u32;
            cast.tree.procs.clear();
            cast.tree.procs.extend_from_slice(&self.tree.procs[lo..hi]);
            // Reuses the rank lists' buffers of the child before.
            self.tree.ranks[lo..hi].clone_into(&mut cast.tree.ranks);
            cast.trace = self.trace.as_ref().map(NodeTrace::child_parent);
            port.send_ref(sender, cast);
        }
        failed
    }

    /// Fails the ranks of the proc at index `at` itself.
    fn fail_own(&mut self, at: usize, reason: &str) -> Vec<(u32, RankError)> {
        let error = proc_gone(&self.tree.procs[at], reason);
        let fold = self.mode.fold();
        let ranks = self.tree.ranks[at].clone();
        for &rank in &ranks {
            self.partial.add(fold, rank, Err(error.clone()));
        }
        ranks.into_iter().map(|r| (r, error.clone())).collect()
    }

    /// Takes a child's report; false when it is not one this node waits
    /// for (a duplicate after a re-forward).
    pub(crate) fn take_subtree(
        &mut self,
        start: u32,
        end: u32,
        partial: Partial,
        spans: Vec<SpanRecord>,
    ) -> bool {
        let (Some(lo), Some(hi)) = (
            start.checked_sub(self.tree.start),
            end.checked_sub(self.tree.start),
        ) else {
            return false;
        };
        let Some(at) = self
            .waiting
            .iter()
            .position(|&w| w == (lo as usize, hi as usize))
        else {
            return false;
        };
        self.waiting.swap_remove(at);
        self.partial.merge(self.mode.fold(), partial);
        if let Some(trace) = &mut self.trace {
            trace.took_reply(spans);
        }
        true
    }

    /// Closes this node's trace, if the cast is traced: the spans of its
    /// subtree, its reduce span and its own (`name`).
    pub(crate) fn close_trace(
        &mut self,
        name: String,
        attrs: Vec<(String, String)>,
    ) -> Vec<SpanRecord> {
        let error = self.partial.error.is_some();
        match self.trace.take() {
            Some(trace) => trace.close(name, attrs, &fold_name(self.mode), error),
            None => Vec::new(),
        }
    }

    /// A proc died: if this node waits on it, fail its ranks and forward
    /// to its children (CA-3). Returns the ranks failed.
    pub(crate) fn proc_died(
        &mut self,
        sender: &Mailbox,
        me: &PortRef<CastReply>,
        proc: &ProcId,
        dead: &HashMap<ProcId, String>,
    ) -> Vec<(u32, RankError)> {
        let Some(at) = self
            .waiting
            .iter()
            .position(|&(lo, _)| &self.tree.procs[lo] == proc)
        else {
            return Vec::new();
        };
        let (lo, hi) = self.waiting.swap_remove(at);
        let reason = dead.get(proc).map(String::as_str).unwrap_or("lost");
        let mut failed = self.fail_own(lo, reason);
        let children = split(lo + 1, hi, self.fanout as usize);
        failed.extend(self.forward(sender, me, children, dead));
        failed
    }

    pub(crate) fn complete(&self) -> bool {
        self.waiting.is_empty() && self.local_left == 0
    }

    /// The ranks of subtrees not yet reported.
    pub(crate) fn missing_ranks(&self) -> Vec<u32> {
        let mut ranks: Vec<u32> = self
            .waiting
            .iter()
            .flat_map(|&(lo, hi)| self.tree.ranks[lo..hi].iter().flatten().copied())
            .collect();
        ranks.sort_unstable();
        ranks
    }
}

type Key = (PortId, u64);

/// A subtree's result, kept after it was sent in case a new parent asks.
struct Sent {
    start: u32,
    end: u32,
    partial: Partial,
    expires: Instant,
}

#[derive(Default)]
struct CommState {
    pending: hyperactor::FastMap<Key, (Node, PortRef<CastReply>)>,
    sent: hyperactor::FastMap<Key, Sent>,
    sent_order: VecDeque<Key>,
    dead: HashMap<ProcId, String>,
    last_sweep: Option<Instant>,
    /// The calls of leaf deliveries (CA-6), soonest deadline first.
    calls: std::collections::BinaryHeap<Expiring>,
    /// When `calls` is next cleared of the calls already answered.
    compact_at: usize,
    /// The ids of the actors leaf casts went to lately.
    actors: RecentActors,
}

/// A leaf delivery's call to a local actor and when it times out (CA-6).
struct Expiring {
    at: Instant,
    timeout: Duration,
    call: PendingCall<Result<Vec<u8>, String>>,
}

impl PartialEq for Expiring {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Expiring {}

impl PartialOrd for Expiring {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Expiring {
    /// Reversed, so that the heap's top is the soonest deadline.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at)
    }
}

/// Calls kept before the answered ones are first cleared out of them.
const CALLS_COMPACT_MIN: usize = 256;

/// How long after its timeout a cast's state is dropped by a comm actor.
const GRACE: Duration = Duration::from_secs(2);

impl CommState {
    /// Keeps leaf calls until they are answered or time out (CA-6).
    fn track(&mut self, call: Expiring) {
        self.calls.push(call);
        if self.calls.len() > self.compact_at.max(CALLS_COMPACT_MIN) {
            self.calls.retain(|e| e.call.waiting());
            self.compact_at = self.calls.len() * 2;
        }
    }

    /// Takes the leaf calls whose deadline is past.
    fn expired(&mut self, now: Instant) -> Vec<Expiring> {
        let mut out = Vec::new();
        while self.calls.peek().is_some_and(|e| e.at <= now) {
            out.extend(self.calls.pop());
        }
        out
    }

    /// Sends a finished node's partial to its parent and keeps a copy.
    fn finish(&mut self, sender: &Mailbox, key: Key) {
        if self
            .pending
            .get(&key)
            .is_some_and(|(node, _)| node.mode == CastMode::Broadcast)
        {
            // CA-5: nothing goes up; the node is kept for its children.
            return;
        }
        let Some((node, parent)) = self.pending.remove(&key) else {
            return;
        };
        let mut node = node;
        let start = node.tree.start;
        let end = start + node.tree.procs.len() as u32;
        let spans = if node.trace.is_some() {
            let attrs = hop_attrs(sender, &node.tree);
            node.close_trace("hop".into(), attrs)
        } else {
            Vec::new()
        };
        parent.send(
            sender,
            CastReply::Subtree {
                origin: node.origin.clone(),
                seq: node.seq,
                start,
                end,
                partial: node.partial.clone(),
                spans,
            },
        );
        self.sent.insert(
            key.clone(),
            Sent {
                start,
                end,
                partial: node.partial,
                expires: node.deadline + GRACE,
            },
        );
        self.sent_order.push_back(key);
    }

    /// Drops state of casts long past their timeout.
    fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|at| now.duration_since(at) < Duration::from_millis(500))
        {
            return;
        }
        self.last_sweep = Some(now);
        while let Some(key) = self.sent_order.front() {
            match self.sent.get(key) {
                Some(sent) if sent.expires > now => break,
                _ => {
                    let key = self.sent_order.pop_front().expect("front exists");
                    self.sent.remove(&key);
                }
            }
        }
        self.pending
            .retain(|_, (node, _)| node.deadline + GRACE > now);
    }
}

/// The comm actor of a proc: delivers casts to its actors, forwards them
/// to its children and folds the replies.
#[derive(Default)]
pub struct CommActor {
    state: Arc<Mutex<CommState>>,
}

impl Actor for CommActor {
    fn exports(exports: &mut Exports<Self>) {
        exports
            .handle::<Cast>()
            .handle::<CastReply>()
            .handle::<ProcDied>();
    }

    fn inline_exports(&self, exports: &mut Exports<Self>) {
        let state = self.state.clone();
        exports.handle_inline::<Cast>(move |mailbox, cast| {
            // The handler waits for room in the links first (LK-8).
            if !mailbox.proc().all_ready_now() {
                return Some(cast);
            }
            take_leaf(&state, mailbox, cast)
        });
    }

    async fn handle_undeliverable(
        &mut self,
        cx: &Context<Self>,
        undeliverable: hyperactor::Undeliverable,
    ) -> anyhow::Result<()> {
        tracing::debug!(actor = %cx.actor_id(), %undeliverable, "cast message returned");
        Ok(())
    }
}

fn me(cx: &Context<CommActor>) -> PortRef<CastReply> {
    PortRef::attest(cx.actor_id().port_id(handler_port::<CastReply>()))
}

impl Handler<Cast> for CommActor {
    async fn handle(&mut self, cx: &Context<Self>, cast: Cast) -> anyhow::Result<()> {
        // Forward only while the links down the tree have room (LK-8): a
        // slow subtree backs the cast up here, then (PR-9) upstream.
        cx.proc().ready_all().await;
        let Some(cast) = take_leaf(&self.state, cx, cast) else {
            return Ok(());
        };
        let key: Key = (cast.origin.clone(), cast.seq);
        let now = Instant::now();
        let mut state = tidy(&self.state, now);
        // Asked again by a new parent after a death (CA-3).
        if let Some(sent) = state.sent.get(&key) {
            cast.parent.send(
                cx,
                CastReply::Subtree {
                    origin: cast.origin,
                    seq: cast.seq,
                    start: sent.start,
                    end: sent.end,
                    partial: sent.partial.clone(),
                    spans: Vec::new(),
                },
            );
            return Ok(());
        }
        if let Some((_, parent)) = state.pending.get_mut(&key) {
            *parent = cast.parent;
            return Ok(());
        }
        if cast.tree.procs.is_empty() || cast.tree.procs.len() != cast.tree.ranks.len() {
            tracing::warn!(origin = %cast.origin, "a cast with a malformed tree; dropped");
            return Ok(());
        }
        let timeout = Duration::from_millis(cast.timeout_ms);
        let local: Vec<u32> = cast.tree.ranks[0].clone();
        let mut node = Node {
            origin: cast.origin,
            seq: cast.seq,
            mesh: cast.mesh,
            tree: cast.tree,
            endpoint: cast.endpoint,
            message: cast.message,
            mode: cast.mode,
            timeout_ms: cast.timeout_ms,
            handler_timeout_ms: cast.handler_timeout_ms,
            fanout: cast.fanout.max(1),
            waiting: Vec::new(),
            local_left: local.len(),
            partial: Partial::new(cast.mode.fold()),
            deadline: now + timeout,
            trace: cast.trace.map(NodeTrace::under),
        };
        let children = split(1, node.tree.procs.len(), node.fanout as usize);
        let dead = std::mem::take(&mut state.dead);
        node.forward(cx, &me(cx), children, &dead);
        state.dead = dead;
        let proc = cx.proc().id().clone();
        let origin_port: PortRef<CastReply> = PortRef::attest(node.origin.clone());
        let (mode, mesh, deadline) = (node.mode, node.mesh.clone(), node.deadline);
        let (endpoint, message) = (node.endpoint.clone(), node.message.clone());
        let (handler_timeout_ms, traced) = (node.handler_timeout_ms, node.trace.is_some());
        state.pending.insert(key.clone(), (node, cast.parent));
        // A rank's reply may be folded at once (its call failing as it is
        // posted), and folding takes the lock.
        drop(state);
        // CA-8: each local actor's reply is folded in the task that
        // delivers it; one timer for the node ends what is unanswered at
        // the deadline (CA-4), and goes when the last reply is in.
        let answered = Arc::new(tokio::sync::Notify::new());
        let mut calls = Vec::with_capacity(local.len());
        for rank in local {
            let actor = match proc.actor_id(&mesh, rank) {
                Ok(actor) => actor,
                Err(e) => {
                    let error = RankError::Invalid(format!("bad mesh name: {e}"));
                    fold_local(&self.state, cx, &key, None, rank, Err(error), None);
                    continue;
                }
            };
            let dest = actor.port_id(handler_port::<MeshCall>());
            let took = traced.then(crate::trace::now_ns);
            let (state, mailbox, key) = (self.state.clone(), (**cx).clone(), key.clone());
            let (origin_port, answered) = (origin_port.clone(), answered.clone());
            let (endpoint, message) = (endpoint.clone(), message.as_ref().clone());
            let then = move |reply| {
                let result = rank_result(reply);
                let to_caster = Some((&origin_port, mode));
                if fold_local(&state, &mailbox, &key, to_caster, rank, result, took) {
                    answered.notify_one();
                }
            };
            calls.push(cx.start_call_then(
                &dest,
                |reply| MeshCall {
                    endpoint,
                    message,
                    broadcast: mode == CastMode::Broadcast,
                    handler_timeout_ms,
                    reply,
                },
                then,
            ));
        }
        let waiting = {
            let mut state = self.state.lock();
            let node = state.pending.get(&key).map(|(node, _)| node);
            let waiting = node.is_some_and(|node| node.local_left > 0);
            if node.is_some_and(Node::complete) {
                state.finish(cx, key);
            }
            waiting
        };
        if waiting {
            tokio::spawn(async move {
                tokio::select! {
                    _ = answered.notified() => {}
                    _ = tokio::time::sleep_until(deadline) => {
                        for call in calls {
                            call.expire(hyperactor::CallError::Timeout(timeout));
                        }
                    }
                }
            });
        }
        Ok(())
    }
}

/// Folds a local actor's result into its node (CA-8): a stream's item (or
/// a broadcast's error) goes to the caster at once when `origin_port` is
/// given, and a node whose last rank and subtree this was is finished.
/// True when the node waits on no local actor any more.
fn fold_local(
    state: &Mutex<CommState>,
    mailbox: &Mailbox,
    key: &Key,
    origin_port: Option<(&PortRef<CastReply>, CastMode)>,
    rank: u32,
    result: Result<Vec<u8>, RankError>,
    took: Option<u64>,
) -> bool {
    if let Some((origin_port, mode)) = origin_port
        && (mode == CastMode::Stream || (mode == CastMode::Broadcast && result.is_err()))
    {
        origin_port.send(
            mailbox,
            CastReply::Item {
                seq: key.1,
                rank,
                result: result.clone(),
            },
        );
    }
    let mut state = state.lock();
    let Some((node, _)) = state.pending.get_mut(key) else {
        return true;
    };
    let mode = node.mode;
    node.local_left -= 1;
    if let (Some(start_ns), Some(trace)) = (took, &mut node.trace) {
        took_handler(trace, &node.endpoint, &node.mesh, rank, start_ns, &result);
    }
    node.partial.add(mode.fold(), rank, result);
    let none_left = node.local_left == 0;
    if node.complete() {
        state.finish(mailbox, key.clone());
    }
    none_left
}

impl Handler<CastReply> for CommActor {
    async fn handle(&mut self, cx: &Context<Self>, reply: CastReply) -> anyhow::Result<()> {
        let CastReply::Subtree {
            origin,
            seq,
            start,
            end,
            partial,
            spans,
        } = reply
        else {
            return Ok(());
        };
        let key = (origin, seq);
        let mut state = self.state.lock();
        let Some((node, _)) = state.pending.get_mut(&key) else {
            return Ok(());
        };
        if node.take_subtree(start, end, partial, spans) && node.complete() {
            state.finish(cx, key);
        }
        Ok(())
    }
}

impl Handler<ProcDied> for CommActor {
    async fn handle(&mut self, cx: &Context<Self>, died: ProcDied) -> anyhow::Result<()> {
        cx.proc().peer_ended(died.proc.addr(), &died.reason);
        let mut state = self.state.lock();
        state.dead.insert(died.proc.clone(), died.reason);
        let dead = std::mem::take(&mut state.dead);
        let me = me(cx);
        let mut finished = Vec::new();
        for (key, (node, _)) in state.pending.iter_mut() {
            node.proc_died(cx, &me, &died.proc, &dead);
            if node.complete() {
                finished.push(key.clone());
            }
        }
        state.dead = dead;
        for key in finished {
            state.finish(cx, key);
        }
        Ok(())
    }
}

/// Delivers `cast` if it is a leaf whose parent is the caster itself and
/// new to this proc (CA-6, CA-7): no child to wait for or take over, and
/// the caster never asks again, so nothing need be kept. Hands back any
/// other cast, for the comm actor's handler.
fn take_leaf(state: &Mutex<CommState>, mailbox: &Mailbox, cast: Cast) -> Option<Cast> {
    if cast.tree.procs.len() != 1 || cast.tree.ranks.len() != 1 || cast.parent.id() != &cast.origin
    {
        return Some(cast);
    }
    let now = Instant::now();
    {
        let state = tidy(state, now);
        let key: Key = (cast.origin.clone(), cast.seq);
        if state.sent.contains_key(&key) || state.pending.contains_key(&key) {
            // Asked again (CA-3): the handler answers.
            return Some(cast);
        }
    }
    deliver_leaf(state, mailbox, cast, now);
    None
}

/// Ends the leaf calls past their timeout (CA-6) and forgets what has
/// expired, before a cast is taken; returns the state, locked.
fn tidy(state: &Mutex<CommState>, now: Instant) -> MutexGuard<'_, CommState> {
    // Outside the lock: a call's function sends its leaf's result.
    let expired = state.lock().expired(now);
    for e in expired {
        e.call.expire(hyperactor::CallError::Timeout(e.timeout));
    }
    let mut locked = state.lock();
    locked.sweep(now);
    locked
}

/// What a local actor's call ended with, as a rank's result.
fn rank_result(
    reply: Result<Result<Vec<u8>, String>, hyperactor::CallError>,
) -> Result<Vec<u8>, RankError> {
    match reply {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(text)) => Err(RankError::Endpoint(text)),
        Err(hyperactor::CallError::Timeout(t)) => Err(RankError::Timeout(t.as_millis() as u64)),
        Err(hyperactor::CallError::Supervision(event)) => Err(RankError::Failed(event.reason)),
        Err(hyperactor::CallError::Undeliverable(failure)) => Err(match failure {
            DeliveryFailure::UnknownActor { actor } => RankError::Stopped(format!(
                "actor {actor} does not run (stopped, or never spawned)"
            )),
            DeliveryFailure::StoppedReceiver { actor } => {
                RankError::Stopped(format!("actor {actor} was stopped"))
            }
            DeliveryFailure::Unreachable { .. } => RankError::Lost(failure.to_string()),
            DeliveryFailure::ActorFailed(event) => RankError::Failed(event.reason),
            other => RankError::Failed(other.to_string()),
        }),
        Err(other) => Err(RankError::Failed(other.to_string())),
    }
}

/// Delivers a leaf cast whose parent is the caster: each local actor's
/// reply is folded by the function its call ends with, and the last one
/// sends the subtree's result (CA-6). The calls go to `state`, for the
/// comm actor to end those still unanswered at the cast's timeout, which
/// counts from `now`.
fn deliver_leaf(state: &Mutex<CommState>, sender: &Mailbox, cast: Cast, now: Instant) {
    let Cast {
        origin,
        seq,
        mesh,
        tree,
        endpoint,
        message,
        mode,
        parent,
        timeout_ms,
        handler_timeout_ms,
        trace,
        ..
    } = cast;
    let fold = mode.fold();
    let ranks = tree.ranks.into_iter().next().unwrap_or_default();
    let traced = trace.is_some();
    let trace = trace.map(NodeTrace::under);
    let hop = trace.as_ref().map(|_| {
        let mut attrs = vec![("proc".to_string(), sender.proc().id().to_string())];
        attrs.push(("ranks".into(), ranks.len().to_string()));
        attrs
    });
    // One count per rank, plus one for this loop, so that exactly one of
    // them (the last to finish) sends the result.
    let call = LeafCall {
        origin,
        parent,
        seq,
        start: tree.start,
        mode,
        hop,
        leaf: Mutex::new(Leaf {
            left: ranks.len() + 1,
            partial: Partial::new(fold),
            trace,
        }),
    };
    if ranks.is_empty() {
        call.count_down(sender, |_| {});
        return;
    }
    let call = Arc::new(call);
    let timeout = Duration::from_millis(timeout_ms);
    let deadline = now + timeout;
    let proc = sender.proc().id();
    // The last rank takes the decoded buffer and the endpoint themselves;
    // only a proc with several ranks copies them for the others.
    let last = ranks.len() - 1;
    let mut message = Some(message);
    let mut endpoint = Some(endpoint);
    for (at, rank) in ranks.into_iter().enumerate() {
        let actor = state.lock().actors.get(proc, &mesh, rank);
        let actor = match actor {
            Ok(actor) => actor,
            Err(e) => {
                let error = Err(RankError::Invalid(format!("bad mesh name: {e}")));
                call.count_down(sender, |leaf| leaf.partial.add(fold, rank, error));
                continue;
            }
        };
        let dest = actor.port_id(handler_port::<MeshCall>());
        let (body, endpoint) = if at == last {
            (
                message.take().map(unshare).unwrap_or_default(),
                endpoint.take().unwrap_or_default(),
            )
        } else {
            (
                message.as_deref().cloned().unwrap_or_default(),
                endpoint.clone().unwrap_or_default(),
            )
        };
        let traced = traced.then(|| (crate::trace::now_ns(), endpoint.clone(), mesh.clone()));
        let (shared, mailbox) = (call.clone(), sender.clone());
        let then = move |reply| {
            let result = rank_result(reply);
            shared.took(&mailbox, rank, result, traced);
        };
        let pending = sender.start_call_then(
            &dest,
            |reply| MeshCall {
                endpoint,
                message: body,
                broadcast: mode == CastMode::Broadcast,
                handler_timeout_ms,
                reply,
            },
            then,
        );
        state.lock().track(Expiring {
            at: deadline,
            timeout,
            call: pending,
        });
    }
    call.count_down(sender, |_| {});
}

/// A leaf delivery (CA-6), shared by the calls to its ranks.
struct LeafCall {
    /// The caster's reply port, where a stream's items go.
    origin: PortId,
    parent: PortRef<CastReply>,
    seq: u64,
    /// The leaf's position among the caster's procs.
    start: u32,
    mode: CastMode,
    /// The attributes of the hop span, when the cast is traced.
    hop: Option<Vec<(String, String)>>,
    leaf: Mutex<Leaf>,
}

impl LeafCall {
    /// Takes one rank's reply: a stream's item (or a broadcast's error)
    /// goes to the caster at once, and the fold takes it.
    fn took(
        &self,
        mailbox: &Mailbox,
        rank: u32,
        result: Result<Vec<u8>, RankError>,
        traced: Option<(u64, String, String)>,
    ) {
        let mode = self.mode;
        if mode == CastMode::Stream || (mode == CastMode::Broadcast && result.is_err()) {
            let item = CastReply::Item {
                seq: self.seq,
                rank,
                result: result.clone(),
            };
            PortRef::<CastReply>::attest(self.origin.clone()).send(mailbox, item);
        }
        self.count_down(mailbox, |leaf| {
            if let (Some((start_ns, endpoint, mesh)), Some(trace)) = (traced, &mut leaf.trace) {
                took_handler(trace, &endpoint, &mesh, rank, start_ns, &result);
            }
            leaf.partial.add(mode.fold(), rank, result);
        });
    }

    /// Counts one delivery (or the loop that starts them) done, after
    /// `took` has had the leaf; the last sends the subtree's result to the
    /// parent, except for a broadcast's (CA-5).
    fn count_down(&self, mailbox: &Mailbox, took: impl FnOnce(&mut Leaf)) {
        let done = {
            let mut guard = self.leaf.lock();
            guard.left -= 1;
            took(&mut guard);
            (guard.left == 0).then(|| guard.take(self.mode.fold()))
        };
        let Some(leaf) = done else { return };
        if self.mode == CastMode::Broadcast {
            return;
        }
        let error = leaf.partial.error.is_some();
        let spans = match (leaf.trace, self.hop.clone()) {
            (Some(trace), Some(attrs)) => {
                trace.close("hop".into(), attrs, &fold_name(self.mode), error)
            }
            _ => Vec::new(),
        };
        let reply = CastReply::Subtree {
            origin: self.origin.clone(),
            seq: self.seq,
            start: self.start,
            end: self.start + 1,
            partial: leaf.partial,
            spans,
        };
        self.parent.send(mailbox, reply);
    }
}

/// What a leaf delivery has so far: the deliveries still out (and one for
/// the loop that starts them), the folded replies, and the hop's trace.
struct Leaf {
    left: usize,
    partial: Partial,
    trace: Option<NodeTrace>,
}

impl Leaf {
    fn take(&mut self, fold: Fold) -> Leaf {
        Leaf {
            left: 0,
            partial: std::mem::replace(&mut self.partial, Partial::new(fold)),
            trace: self.trace.take(),
        }
    }
}

/// The ids of the actors a proc's leaf casts went to lately: casts come
/// to the same few again and again, and making an id allocates twice.
#[derive(Default)]
struct RecentActors {
    ids: [Option<ActorId>; RECENT_ACTORS],
    next: usize,
}

const RECENT_ACTORS: usize = 8;

impl RecentActors {
    /// The id of actor `mesh[rank]` on `proc`.
    fn get(&mut self, proc: &ProcId, mesh: &str, rank: u32) -> Result<ActorId, String> {
        let known = self
            .ids
            .iter()
            .flatten()
            .find(|id| id.rank() == rank && id.name() == mesh && id.proc_id() == proc);
        if let Some(id) = known {
            return Ok(id.clone());
        }
        let id = proc.actor_id(mesh, rank).map_err(|e| e.to_string())?;
        self.ids[self.next] = Some(id.clone());
        self.next = (self.next + 1) % RECENT_ACTORS;
        Ok(id)
    }
}

/// The name of a cast's fold in its reduce spans.
pub(crate) fn fold_name(mode: CastMode) -> String {
    match mode {
        CastMode::Gather => "gather".into(),
        CastMode::Reduce(reducer) => format!("reduce {}", reducer.name()),
        CastMode::Stream => "stream".into(),
        CastMode::Broadcast => "broadcast".into(),
    }
}

/// The attributes of a hop span: the proc and the size of its subtree.
fn hop_attrs(sender: &Mailbox, tree: &Subtree) -> Vec<(String, String)> {
    vec![
        ("proc".into(), sender.proc().id().to_string()),
        (
            "ranks".into(),
            tree.ranks.first().map_or(0, Vec::len).to_string(),
        ),
        ("subtree_procs".into(), tree.procs.len().to_string()),
    ]
}

/// Takes a local actor's reply into a traced node: its handler span,
/// from `start_ns` to now, under the node's hop.
fn took_handler(
    trace: &mut NodeTrace,
    endpoint: &str,
    mesh: &str,
    rank: u32,
    start_ns: u64,
    result: &Result<Vec<u8>, RankError>,
) {
    let span = trace.child_span(
        format!("handle {endpoint}"),
        start_ns,
        handler_attrs(mesh, rank, result),
        result.is_err(),
    );
    trace.took_reply(vec![span]);
}

/// The attributes of a handler span.
fn handler_attrs(
    mesh: &str,
    rank: u32,
    result: &Result<Vec<u8>, RankError>,
) -> Vec<(String, String)> {
    let mut attrs = vec![
        ("mesh".to_string(), mesh.to_string()),
        ("rank".to_string(), rank.to_string()),
    ];
    if let Err(e) = result {
        attrs.push(("error".into(), e.to_string()));
    }
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperactor::RemoteMessage;

    /// The message field as it was archived before it was shared.
    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Plain {
        endpoint: String,
        message: Vec<u8>,
    }

    #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Shared {
        endpoint: String,
        #[rkyv(with = SharedBytes)]
        message: Arc<Vec<u8>>,
    }

    #[test]
    fn a_shared_message_is_archived_as_the_same_bytes_and_decodes_unshared() {
        let bytes: Vec<u8> = (0..=255).cycle().take(100_000).collect();
        let shared = Arc::new(bytes.clone());
        let plain = Plain {
            endpoint: "e".into(),
            message: bytes.clone(),
        };
        let archived = Shared {
            endpoint: "e".into(),
            message: shared.clone(),
        }
        .encode_into(rkyv::util::AlignedVec::new())
        .unwrap();
        // Same wire format: procs of either kind read each other's casts.
        assert_eq!(
            archived.as_slice(),
            plain
                .encode_into(rkyv::util::AlignedVec::new())
                .unwrap()
                .as_slice()
        );
        let decoded = Shared::decode(&archived).unwrap();
        assert_eq!(*decoded.message, bytes);
        // The decoded buffer is the receiver's own, so a leaf hands it on
        // without a copy; the sender's stays shared with its other casts.
        assert_eq!(Arc::strong_count(&decoded.message), 1);
        assert_eq!(Arc::strong_count(&shared), 1);
        assert_eq!(unshare(decoded.message), bytes);
        let other = shared.clone();
        assert_eq!(unshare(other), bytes);
        assert_eq!(*shared, bytes);
    }

    #[test]
    fn ca2_split_makes_at_most_fanout_balanced_contiguous_chunks() {
        assert_eq!(split(0, 0, 16), vec![]);
        assert_eq!(split(1, 4, 16), vec![(1, 2), (2, 3), (3, 4)]);
        let chunks = split(0, 100, 16);
        assert_eq!(chunks.len(), 16);
        assert_eq!(chunks.first().unwrap().0, 0);
        assert_eq!(chunks.last().unwrap().1, 100);
        for pair in chunks.windows(2) {
            assert_eq!(pair[0].1, pair[1].0);
        }
        let sizes: Vec<usize> = chunks.iter().map(|(lo, hi)| hi - lo).collect();
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
    }

    /// CA-6: a leaf's calls are kept until answered or past their deadline;
    /// one past it is ended with `Timeout`, and answered ones are cleared
    /// out as more come, so the comm actor keeps only what is in flight.
    #[tokio::test]
    async fn ca6_leaf_calls_time_out_at_the_next_cast_and_answered_ones_are_dropped() {
        let addr = format!("local:comm-ca6-{}", std::process::id())
            .parse()
            .unwrap();
        let proc = hyperactor::Proc::serve_with_config("ca6", addr, Default::default())
            .await
            .unwrap();
        let (server, _) = proc.attach("server").unwrap();
        let (client, _) = proc.attach("client").unwrap();
        let mut requests = server.open_port::<(u64, OncePortRef<Result<Vec<u8>, String>>)>();
        let (tx, mut got) = tokio::sync::mpsc::unbounded_channel();
        let dest = requests.id().clone();
        let call = |n: u64, at: Instant| {
            let tx = tx.clone();
            let call = client.start_call_then(
                &dest,
                |reply| (n, reply),
                move |reply| {
                    let _ = tx.send((n, rank_result(reply)));
                },
            );
            Expiring {
                at,
                timeout: Duration::from_millis(100),
                call,
            }
        };
        let now = Instant::now();
        let mut state = CommState::default();
        // Answered calls, more than are kept before the answered are
        // cleared out: what is kept stays bounded.
        for n in 0..(CALLS_COMPACT_MIN as u64 * 3) {
            state.track(call(n, now + Duration::from_secs(60)));
            let (m, reply) = requests.recv().await.unwrap();
            reply.send(&server, Ok(m.to_le_bytes().to_vec()));
            let (answered, result) = got.recv().await.unwrap();
            assert_eq!((answered, result.unwrap()), (n, n.to_le_bytes().to_vec()));
        }
        assert!(
            state.calls.len() <= CALLS_COMPACT_MIN + 1,
            "{} answered calls kept",
            state.calls.len()
        );
        // One nobody answers: not yet due, then due and ended with Timeout.
        state.track(call(999, now + Duration::from_millis(100)));
        assert!(state.expired(now).is_empty());
        let due = state.expired(now + Duration::from_millis(100));
        assert_eq!(due.len(), 1);
        for e in due {
            e.call.expire(hyperactor::CallError::Timeout(e.timeout));
        }
        let (n, result) = got.recv().await.unwrap();
        assert_eq!(n, 999);
        assert!(matches!(result, Err(RankError::Timeout(100))), "{result:?}");
    }
}
