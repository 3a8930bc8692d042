//! The caster: the root of multicast trees, on the controller or on any
//! actor that calls a mesh.
//!
//! [`Caster::cast`] sends a cast to the heads of at most `fanout` subtrees
//! and returns its sequence number at once; [`Caster::next`] hands over
//! what came back: the one result of a call, the items of a stream, the
//! errors of a broadcast. Every cast ends: with its replies, with the
//! failure of the procs it waited on, or at its deadline.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::FutureExt;
use hyperactor::{Mailbox, Port, PortRef, ProcId};

use crate::comm::{CastMode, CastReply, Node, Subtree, split};
use crate::reduce::{Partial, RankError};
use crate::trace::{self, NodeTrace};

/// How long the caster waits past a cast's timeout for the tree to answer
/// before it fails the ranks still missing: each actor already has the
/// timeout itself (CA-4); this covers the hops.
const ROOT_GRACE: Duration = Duration::from_millis(250);

/// Where a cast goes: a mesh's procs in a fixed order (CA-1) and the ranks
/// selected on each.
#[derive(Debug, Clone)]
pub struct CastTarget {
    /// The actor mesh's name; its actors are `mesh[rank]`.
    pub mesh: String,
    /// Every proc of the mesh, in the mesh's order.
    pub procs: Vec<ProcId>,
    /// The ranks to deliver to on each proc.
    pub ranks: Vec<Vec<u32>>,
}

/// What came back for a cast.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A gather or a reduction finished: the values in rank order (one for
    /// a reduction), or the lowest rank's error.
    Done {
        /// The cast.
        seq: u64,
        /// Its result.
        result: Result<Vec<Vec<u8>>, (u32, RankError)>,
    },
    /// One rank of a stream answered.
    Item {
        /// The cast.
        seq: u64,
        /// The rank.
        rank: u32,
        /// Its reply.
        result: Result<Vec<u8>, RankError>,
    },
    /// Every rank of a stream has answered.
    End {
        /// The cast.
        seq: u64,
    },
    /// One rank of a broadcast failed.
    Failed {
        /// The cast.
        seq: u64,
        /// The actor mesh.
        mesh: String,
        /// The rank.
        rank: u32,
        /// Why.
        error: RankError,
    },
}

struct Request {
    node: Node,
    /// The held time (see [`Caster::set_hold`]) when it was cast.
    held_at: Duration,
    /// Its timeout, as the caller gave it.
    timeout_ms: u64,
    /// Streams and broadcasts: ranks already reported.
    reported: HashSet<u32>,
    total: usize,
}

/// The root of this mailbox's casts; see the module docs.
pub struct Caster {
    mailbox: Mailbox,
    port: Port<CastReply>,
    me: PortRef<CastReply>,
    fanout: u32,
    next_seq: u64,
    requests: HashMap<u64, Request>,
    /// Broadcasts until their deadline (CA-5), to take over the children
    /// of a proc that dies; oldest first.
    broadcasts: HashMap<u64, Node>,
    broadcast_order: VecDeque<(Instant, u64)>,
    dead: HashMap<ProcId, String>,
    ready: VecDeque<Outcome>,
    /// Time that does not count against deadlines; see [`Caster::set_hold`].
    hold: Option<Hold>,
    /// Where this caster's traces go, instead of the process's sink; see
    /// [`Caster::set_trace_sink`].
    trace_sink: Option<TraceSink>,
}

/// Where one caster's traces go ([`Caster::set_trace_sink`]).
pub type TraceSink = Arc<dyn Fn(Vec<crate::trace::SpanRecord>) + Send + Sync>;

/// How long the run has been held (a debugger's pauses), in total.
pub type Hold = Arc<dyn Fn() -> Duration + Send + Sync>;

/// How long the procs of a cast wait for its ranks when the root holds its
/// deadline (a debugged run): the root's deadline decides.
const HELD_TREE_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

impl Caster {
    /// A caster that sends from `mailbox` through trees of `fanout`.
    pub fn new(mailbox: &Mailbox, fanout: u32) -> Caster {
        let port = mailbox.open_port::<CastReply>();
        let me = port.bind();
        Caster {
            mailbox: mailbox.clone(),
            port,
            me,
            fanout: fanout.max(1),
            next_seq: 1,
            requests: HashMap::new(),
            broadcasts: HashMap::new(),
            broadcast_order: VecDeque::new(),
            dead: HashMap::new(),
            ready: VecDeque::new(),
            hold: None,
            trace_sink: None,
        }
    }

    /// Traces every cast of this caster with replies and hands its spans
    /// to `sink` (a server's job, say, whose traces are its own), whether
    /// or not the process traces its casts ([`crate::trace`]).
    pub fn set_trace_sink(&mut self, sink: TraceSink) {
        self.trace_sink = Some(sink);
    }

    fn traced(&self) -> bool {
        self.trace_sink.is_some() || trace::enabled()
    }

    /// Moves the deadlines of casts on by the time `hold` counts (the time
    /// a debugged run's actors spent paused at breakpoints), so that a
    /// call waiting on a paused rank does not time out while it is paused.
    /// The procs on the way then wait as long as the root does: the root
    /// alone times the cast out.
    pub fn set_hold(&mut self, hold: Hold) {
        self.hold = Some(hold);
    }

    fn held(&self) -> Duration {
        self.hold.as_ref().map_or(Duration::ZERO, |hold| hold())
    }

    /// When `request` times out, its held time counted.
    fn due(&self, request: &Request) -> Instant {
        request.node.deadline + self.held().saturating_sub(request.held_at)
    }

    /// Waits until the links casts leave by have room in their windows
    /// (LK-8): a caster that may cast faster than the mesh takes its
    /// casts awaits this before each one, so that they wait here instead
    /// of queuing without bound.
    pub async fn ready(&self) {
        self.mailbox.proc().ready_all().await
    }

    /// Casts `message` to `endpoint` of the ranks `target` selects and
    /// returns the cast's number; what comes back arrives through
    /// [`Caster::next`].
    pub fn cast(
        &mut self,
        target: CastTarget,
        endpoint: &str,
        message: Vec<u8>,
        mode: CastMode,
        timeout: Duration,
    ) -> u64 {
        self.cast_with(target, endpoint, message, mode, timeout, None)
    }

    /// [`Caster::cast`] with a deadline for each actor's handler (`None`:
    /// each actor's own default).
    pub fn cast_with(
        &mut self,
        target: CastTarget,
        endpoint: &str,
        message: Vec<u8>,
        mode: CastMode,
        timeout: Duration,
        handler_timeout: Option<Duration>,
    ) -> u64 {
        // Procs this proc was told have ended fail their ranks now, not at
        // the cast's deadline (a mesh reference held after its procs were
        // stopped, say).
        for proc in &target.procs {
            if !self.dead.contains_key(proc)
                && let Some(reason) = self.mailbox.proc().ended_peer(proc.addr())
            {
                self.dead.insert(proc.clone(), reason);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let total = target.ranks.iter().map(Vec::len).sum();
        let timeout_ms = timeout.as_millis().max(1) as u64;
        let held_at = self.held();
        let tree_timeout = match self.hold {
            Some(_) => timeout.max(HELD_TREE_TIMEOUT),
            None => timeout,
        };
        let mut node = Node {
            origin: self.me.id().clone(),
            seq,
            mesh: target.mesh,
            tree: Subtree {
                start: 0,
                procs: target.procs,
                ranks: target.ranks,
            },
            endpoint: endpoint.to_string(),
            message: Arc::new(message),
            mode,
            timeout_ms: tree_timeout.as_millis().max(1) as u64,
            handler_timeout_ms: handler_timeout.map_or(0, |t| t.as_millis().max(1) as u64),
            fanout: self.fanout,
            waiting: Vec::new(),
            local_left: 0,
            partial: Partial::with_capacity(mode.fold(), total),
            deadline: Instant::now() + timeout + ROOT_GRACE,
            trace: self.traced().then(NodeTrace::root),
        };
        let chunks = split(0, node.tree.procs.len(), self.fanout as usize);
        let failed = node.forward(&self.mailbox, &self.me, chunks, &self.dead);
        if mode == CastMode::Broadcast {
            for (rank, error) in failed {
                let mesh = node.mesh.clone();
                self.ready.push_back(Outcome::Failed {
                    seq,
                    mesh,
                    rank,
                    error,
                });
            }
            // TR-3: nothing comes back up; the root span is all there is.
            emit_root(&mut node, false, self.trace_sink.as_ref());
            self.broadcast_order.push_back((node.deadline, seq));
            self.broadcasts.insert(seq, node);
            return seq;
        }
        let mut request = Request {
            node,
            held_at,
            timeout_ms,
            reported: HashSet::new(),
            total,
        };
        self.report(seq, &mut request, failed);
        self.settle(seq, request);
        seq
    }

    /// Tells the caster that `proc` died: casts waiting on it fail its
    /// ranks and go on to its children (CA-3).
    pub fn proc_died(&mut self, proc: &ProcId, reason: &str) {
        self.dead.insert(proc.clone(), reason.to_string());
        // Broadcasts go on to the dead proc's children; its own ranks are
        // reported by supervision, not once per broadcast.
        for node in self.broadcasts.values_mut() {
            node.proc_died(&self.mailbox, &self.me, proc, &self.dead);
        }
        let seqs: Vec<u64> = self.requests.keys().copied().collect();
        for seq in seqs {
            let Some(mut request) = self.requests.remove(&seq) else {
                continue;
            };
            let mut failed = request
                .node
                .proc_died(&self.mailbox, &self.me, proc, &self.dead);
            // Stream replies come straight from each proc, so the dead
            // proc's unreported ranks fail here wherever it sat.
            if request.node.mode == CastMode::Stream
                && let Some(at) = request.node.tree.procs.iter().position(|p| p == proc)
            {
                let error = crate::comm::proc_gone(proc, reason);
                for &rank in &request.node.tree.ranks[at] {
                    failed.push((rank, error.clone()));
                }
            }
            self.report(seq, &mut request, failed);
            self.settle(seq, request);
        }
    }

    /// Whether no cast is waiting for replies (or, for broadcasts, for
    /// errors) and nothing is ready.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty() && self.ready.is_empty() && self.broadcasts.is_empty()
    }

    /// How many casts wait for replies.
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    /// The next outcome, waiting for it; `None` when nothing is in flight.
    pub async fn next(&mut self) -> Option<Outcome> {
        loop {
            if let Some(outcome) = self.ready.pop_front() {
                return Some(outcome);
            }
            let deadline = self
                .requests
                .values()
                .map(|r| self.due(r))
                .chain(self.broadcast_order.front().map(|(at, _)| *at))
                .min()?;
            tokio::select! {
                reply = self.port.recv() => match reply {
                    Some(reply) => self.take(reply),
                    None => return None,
                },
                _ = tokio::time::sleep_until(deadline) => self.expire(Instant::now()),
            }
        }
    }

    /// The next outcome if one is ready now, without waiting.
    pub fn try_next(&mut self) -> Option<Outcome> {
        loop {
            if let Some(outcome) = self.ready.pop_front() {
                return Some(outcome);
            }
            match self.port.recv().now_or_never() {
                Some(Some(reply)) => self.take(reply),
                _ => {
                    let now = Instant::now();
                    let broadcast_due = self
                        .broadcast_order
                        .front()
                        .is_some_and(|(at, _)| *at <= now);
                    if broadcast_due || self.requests.values().any(|r| self.due(r) <= now) {
                        self.expire(now);
                        continue;
                    }
                    return None;
                }
            }
        }
    }

    fn take(&mut self, reply: CastReply) {
        match reply {
            CastReply::Subtree {
                seq,
                start,
                end,
                partial,
                spans,
                ..
            } => {
                if let Some(mut request) = self.requests.remove(&seq) {
                    request.node.take_subtree(start, end, partial, spans);
                    self.settle(seq, request);
                }
            }
            CastReply::Item { seq, rank, result } => {
                if let Some(node) = self.broadcasts.get(&seq) {
                    let error = result
                        .err()
                        .unwrap_or(RankError::Invalid("a broadcast reported a success".into()));
                    let mesh = node.mesh.clone();
                    self.ready.push_back(Outcome::Failed {
                        seq,
                        mesh,
                        rank,
                        error,
                    });
                } else if let Some(mut request) = self.requests.remove(&seq) {
                    if request.reported.insert(rank) {
                        self.ready.push_back(Outcome::Item { seq, rank, result });
                    }
                    self.settle(seq, request);
                }
            }
        }
    }

    /// Reports ranks failed by dead procs.
    fn report(&mut self, seq: u64, request: &mut Request, failed: Vec<(u32, RankError)>) {
        for (rank, error) in failed {
            let outcome = match request.node.mode {
                CastMode::Stream => Outcome::Item {
                    seq,
                    rank,
                    result: Err(error),
                },
                _ => continue,
            };
            if request.reported.insert(rank) {
                self.ready.push_back(outcome);
            }
        }
    }

    /// Finishes a request whose replies are all in, or keeps it.
    fn settle(&mut self, seq: u64, request: Request) {
        let done = match request.node.mode {
            CastMode::Stream => request.reported.len() >= request.total,
            _ => request.node.complete(),
        };
        if !done {
            self.requests.insert(seq, request);
            return;
        }
        let mut request = request;
        let failed = request.node.partial.error.is_some();
        emit_root(&mut request.node, failed, self.trace_sink.as_ref());
        match request.node.mode {
            CastMode::Stream => self.ready.push_back(Outcome::End { seq }),
            mode => self.ready.push_back(Outcome::Done {
                seq,
                result: request.node.partial.finish(mode.fold()),
            }),
        }
    }

    /// Fails what is still missing of casts past their deadline.
    fn expire(&mut self, now: Instant) {
        // A broadcast's ranks report their own timeouts (CA-4).
        while let Some(&(at, seq)) = self.broadcast_order.front() {
            if at > now {
                break;
            }
            self.broadcast_order.pop_front();
            self.broadcasts.remove(&seq);
        }
        let expired: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| self.due(r) <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in expired {
            let Some(mut request) = self.requests.remove(&seq) else {
                continue;
            };
            let error = RankError::Timeout(request.timeout_ms);
            match request.node.mode {
                CastMode::Stream => {
                    let mut all: Vec<u32> =
                        request.node.tree.ranks.iter().flatten().copied().collect();
                    all.sort_unstable();
                    for rank in all {
                        if request.reported.insert(rank) {
                            self.ready.push_back(Outcome::Item {
                                seq,
                                rank,
                                result: Err(error.clone()),
                            });
                        }
                    }
                    emit_root(&mut request.node, true, self.trace_sink.as_ref());
                    self.ready.push_back(Outcome::End { seq });
                }
                mode => {
                    let fold = mode.fold();
                    for rank in request.node.missing_ranks() {
                        request.node.partial.add(fold, rank, Err(error.clone()));
                    }
                    request.node.waiting.clear();
                    emit_root(&mut request.node, true, self.trace_sink.as_ref());
                    let result = request.node.partial.finish(fold);
                    self.ready.push_back(Outcome::Done { seq, result });
                }
            }
        }
    }
}

/// Closes a cast's root span, if it is traced, and hands the trace to the
/// sink (TR-2: the root is the one span without a parent).
fn emit_root(node: &mut Node, failed: bool, sink: Option<&TraceSink>) {
    if node.trace.is_none() {
        return;
    }
    let procs = node.tree.procs.len();
    let ranks: usize = node.tree.ranks.iter().map(Vec::len).sum();
    let attrs = vec![
        ("mesh".to_string(), node.mesh.clone()),
        ("endpoint".to_string(), node.endpoint.clone()),
        ("mode".to_string(), crate::comm::fold_name(node.mode)),
        ("procs".to_string(), procs.to_string()),
        ("ranks".to_string(), ranks.to_string()),
        ("fanout".to_string(), node.fanout.to_string()),
    ];
    let name = format!("cast {}", node.endpoint);
    let mut spans = node.close_trace(name, attrs);
    if failed && let Some(root) = spans.last_mut() {
        root.error = true;
    }
    match sink {
        Some(sink) => sink(spans),
        None => trace::emit(spans),
    }
}
