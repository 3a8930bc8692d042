//! The sending side of a channel: one link per destination address.
//!
//! A link numbers its data frames, keeps each one until the peer acknowledges
//! it, and survives broken connections:
//!
//! - LK-1: frames are written in sequence order on each connection.
//! - LK-2: after a reconnect every unacknowledged frame is written again, in
//!   order, before any new one; the receiver drops the ones it already has
//!   (see `proc::Session`), so nothing is lost and nothing is delivered twice.
//! - LK-3: when no connection can be made for the delivery timeout, or the
//!   peer acknowledges nothing for that long while frames wait, the link dies
//!   and hands every unacknowledged frame's return info back to its owner,
//!   which reports them undeliverable. A dead link takes no more frames.
//! - LK-4: writes never block the sender. A frame sent to an idle link is
//!   written at once by the sending task; frames that arrive while a write is
//!   under way, or in a burst (within `BURST_WINDOW` of the last write), are
//!   appended and written together by the link's own task, which also
//!   writes whatever the socket could not take when it has room again.
//! - LK-5: inside [`corked`], every frame takes the burst path, so frames
//!   sent back to back by one task reach the socket together.
//! - LK-6: a link whose peer is known to have ended (`Proc::peer_ended`)
//!   dies at once, without the delivery timeout.
//! - LK-7: a link whose peer answers that it restarted (a new incarnation
//!   at the same address, which never saw the frames it acknowledged)
//!   dies at once: its unacknowledged frames went to a proc that is gone,
//!   and the next message starts a new link, and a new session, with it.
//! - LK-8: a link holds at most its window of unacknowledged bytes before
//!   [`Link::ready`] makes a sender wait (async) for acknowledgements; a
//!   sender that awaits it before each send never queues more than the
//!   window plus one frame, however far it outruns its receiver.
//!   Synchronous sends never wait (a handler must not block its worker),
//!   so their bytes count toward the window without being held back.
//! - LK-9 (duplex): one connection carries both directions between two
//!   procs. A proc that accepts a connection *adopts* it for its own link
//!   to the dialer ([`Link::adopt`]): it says its own hello on it and
//!   writes its frames there, and the proc's reader of that connection
//!   hands the acknowledgements to it. Each direction keeps its own
//!   session, sequence numbers and acknowledgements, so LK-1..3 hold per
//!   direction across reconnects. The dialer owns reconnecting; a link
//!   that adopted its connection dials only when it holds frames and no
//!   connection came back within `ADOPT_GRACE`. When both procs dialed,
//!   the connection dialed by the smaller proc id stays and the other is
//!   closed, so a pair ends with one connection and a partition is
//!   noticed once; this holds too when the smaller proc's own dial
//!   completes after it adopted the larger's connection (it keeps its
//!   own, as the larger will). Every frame written on a connection,
//!   acknowledgements included, goes through the link that owns it
//!   ([`Link::control`]), so frames never interleave.
//! - LK-10: on a connection both directions share, the reader offers its
//!   acknowledgement to the link ([`Link::offer_ack`]), which writes it in
//!   front of its next data frame, in the same system call; the reader
//!   writes one alone only if no data frame took it by its ack interval.
//!   A request and its reply thus acknowledge each other, and neither
//!   peer is woken for an acknowledgement alone. The interval runs from the
//!   first frame no data frame has carried: when one carries some, the
//!   deadline of the rest starts again.
//! - LK-11: a reader arms its acknowledgement's timer only for what no
//!   data frame has carried once the actors it fed had their turn, and
//!   disarms it when one carries the rest: a request answered at once
//!   leaves its receiver asleep with no timer, so its sleep in epoll has
//!   no deadline and nothing wakes it before the next request.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use rkyv::util::AlignedVec;
use tokio::sync::Notify;

use super::ChannelAddr;
use super::frame::{FrameKind, HEADER_LEN, set_seq, small_frame, write_header};
use super::transport::{self, ReadHalf, WriteHalf};

const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
const MAX_CONNECT_WAIT: Duration = Duration::from_secs(5);
/// A frame sent this soon after the last write is part of a burst; the
/// link's task writes it with whatever else arrives meanwhile. Shorter than
/// any cross-process round trip, so a lone call is never held back.
const BURST_WINDOW: Duration = Duration::from_micros(4);
/// How long a link whose adopted connection ended waits for its peer,
/// which owns reconnecting, before it dials itself to deliver what it
/// holds (LK-9).
const ADOPT_GRACE: Duration = Duration::from_millis(200);

thread_local! {
    /// Set by [`corked`]: sends leave the writing to the links' tasks.
    static CORKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's sends *corked*: a frame sent to a remote
/// proc inside `f` is not written at once by the sender but by its link's
/// task, together with every frame that follows before that task runs, in
/// one system call (LK-5). Use it around many sends that belong together,
/// such as the messages of a cast: the sender goes on at once, and each
/// peer wakes up once for the lot. Sends within one proc are unaffected.
pub fn corked<R>(f: impl FnOnce() -> R) -> R {
    let before = CORKED.replace(true);
    let result = f();
    CORKED.set(before);
    result
}

/// Counters shared by the links and receivers of a proc.
#[derive(Debug, Default)]
pub struct ChannelStats {
    /// Frames written again after a reconnect.
    pub retransmitted: AtomicU64,
    /// Connections re-established after a loss.
    pub reconnects: AtomicU64,
    /// Data frames a receiver dropped because it already had them.
    pub duplicates_dropped: AtomicU64,
    /// Connections closed because of a bad frame.
    pub bad_frames: AtomicU64,
    /// The most unacknowledged bytes any one link has held (LK-8).
    pub peak_unacked_bytes: AtomicU64,
    /// Times a sender waited for a link's window (LK-8).
    pub window_waits: AtomicU64,
    /// Times a receiver stopped reading for an actor past its window (PR-9).
    pub paused_reads: AtomicU64,
    /// Links at or past their window now (LK-8): while none is, waiting
    /// for every link's room costs one load.
    pub links_over_window: AtomicU64,
    /// Connections this proc's links dialed.
    pub dialed: AtomicU64,
    /// Connections a link took over from the peer that dialed it (LK-9).
    pub adopted: AtomicU64,
    /// Connections open now, dialed or accepted.
    pub open_connections: AtomicU64,
    /// Acknowledgements written in front of a data frame the other way
    /// instead of alone (LK-10).
    pub acks_piggybacked: AtomicU64,
    /// Acknowledgements written alone, their deadline passed with no data
    /// frame the other way to carry them (LK-10).
    pub acks_alone: AtomicU64,
    /// Times a reader woke for its acknowledgement's timer, whether or not
    /// it then wrote one alone (LK-11).
    pub ack_timer_wakes: AtomicU64,
}

/// Settings a link needs.
#[derive(Debug, Clone)]
pub(crate) struct LinkConfig {
    pub(crate) delivery_timeout: Duration,
    /// Unacknowledged bytes past which [`Link::ready`] waits (LK-8).
    pub(crate) window_bytes: usize,
    /// Whether the link connects by itself (a link opened to send), or
    /// waits to adopt its peer's connection (LK-9).
    pub(crate) dials: bool,
}

/// What a queued frame costs the sender beyond its bytes: the `Pending`
/// record, the `Arc` and the allocation's header.
const FRAME_OVERHEAD: usize = 96;

/// The most frames one `sendmsg` takes.
const MAX_SLICES: usize = 64;

/// Drops the first `n` bytes of `queue` (its first frame from `pos`).
fn advance(queue: &mut VecDeque<Arc<AlignedVec>>, pos: &mut usize, mut n: usize) {
    while let Some(front) = queue.front() {
        let rest = front.len() - *pos;
        if n < rest {
            *pos += n;
            return;
        }
        n -= rest;
        *pos = 0;
        queue.pop_front();
    }
}

/// Called once when a link dies, with the return info of every frame that was
/// not acknowledged, in order, and the last connection error.
pub(crate) type OnDead<T> = Box<dyn Fn(&ChannelAddr, Vec<T>, String) + Send + Sync>;

/// Reads a connection the link dialed, with the link and the connection's
/// generation, until it ends; says why it ended. The proc's reader: it
/// delivers the peer's frames and hands acknowledgements to the link
/// (LK-9).
pub(crate) type Reader<T> = Box<
    dyn Fn(
            ReadHalf,
            Arc<Link<T>>,
            u64,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>
        + Send
        + Sync,
>;

/// Who opened a link's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Dialed,
    Adopted,
}

struct Pending<T> {
    seq: u64,
    /// Shared with `out` while it waits to be written: frames are never
    /// copied into a write buffer (a 1 MiB frame would be copied whole).
    frame: Arc<AlignedVec>,
    sent: Instant,
    /// What this frame counts toward the window (LK-8).
    cost: usize,
    ret: T,
}

struct LinkState<T> {
    next_seq: u64,
    unacked: VecDeque<Pending<T>>,
    /// The bytes `unacked` holds, by `Pending::cost` (LK-8).
    unacked_bytes: usize,
    /// A sender waits in [`Link::ready`] for the window to open.
    window_waiting: bool,
    /// Counted in `ChannelStats::links_over_window`.
    over_window: bool,
    conn: Option<Arc<WriteHalf>>,
    /// Who opened `conn`.
    origin: Origin,
    /// Whether the peer whose connection `conn` is, when adopted, has the
    /// smaller proc id: then that connection is the one both keep.
    adopted_from_smaller: bool,
    generation: u64,
    /// Whether the link reconnects as soon as its connection is lost: a
    /// link opened to send does, until it adopts a connection (LK-9).
    dials: bool,
    /// Frames for the current connection that nobody is writing yet; the
    /// first from byte `out_pos`. They go out with one `sendmsg` for many
    /// frames, as one buffer did.
    out: VecDeque<Arc<AlignedVec>>,
    out_pos: usize,
    flushing: bool,
    /// The link's task will write `out` soon (LK-4).
    flush_scheduled: bool,
    last_write: Instant,
    waiting_writable: bool,
    broken: bool,
    dead: bool,
    last_ack: Instant,
    /// The acknowledgement the reader of the current connection offers to
    /// send with the next data frame (LK-10); 0 for none.
    offered_ack: u64,
    /// The highest acknowledgement written with data frames on the current
    /// connection (LK-10).
    piggybacked: u64,
    /// The buffer of the last piggybacked acknowledgement, written again
    /// for the next one once nothing else holds it.
    ack_buf: Option<Arc<AlignedVec>>,
}

impl<T> LinkState<T> {
    /// An acknowledgement frame for `seq`, in the buffer of the last one
    /// when that has been written (a reply carries one each time).
    fn ack_frame(&mut self, seq: u64) -> Arc<AlignedVec> {
        fn fill(buf: &mut AlignedVec, seq: u64) {
            buf.clear();
            buf.resize(HEADER_LEN, 0);
            write_header(buf.as_mut_slice(), FrameKind::Ack, 0, seq);
        }
        let mut ack = self.ack_buf.take().unwrap_or_default();
        match Arc::get_mut(&mut ack) {
            Some(buf) => fill(buf, seq),
            None => {
                let mut buf = AlignedVec::with_capacity(HEADER_LEN);
                fill(&mut buf, seq);
                ack = Arc::new(buf);
            }
        }
        self.ack_buf = Some(ack.clone());
        ack
    }
}

/// The sending side of a channel to one address.
pub(crate) struct Link<T> {
    dest: ChannelAddr,
    /// The hello frame, written first on every connection (shared with
    /// `out` on an adopted one).
    hello: Arc<AlignedVec>,
    config: LinkConfig,
    state: Mutex<LinkState<T>>,
    wake: Notify,
    /// Wakes senders waiting for the window (LK-8).
    room: Notify,
    on_dead: OnDead<T>,
    reader: Reader<T>,
    stats: Arc<ChannelStats>,
}

impl<T: Send + 'static> Link<T> {
    /// A link to `dest`; `hello_from` names the sending proc in the handshake.
    /// Start it with [`Link::run`].
    pub(crate) fn new(
        dest: ChannelAddr,
        session: u64,
        hello_from: &str,
        config: LinkConfig,
        stats: Arc<ChannelStats>,
        on_dead: OnDead<T>,
        reader: Reader<T>,
    ) -> Arc<Self> {
        let dials = config.dials;
        Arc::new(Link {
            dest,
            hello: {
                let frame = small_frame(FrameKind::Hello, session, hello_from.as_bytes());
                let mut aligned = AlignedVec::with_capacity(frame.len());
                aligned.extend_from_slice(&frame);
                Arc::new(aligned)
            },
            config,
            state: Mutex::new(LinkState {
                next_seq: 1,
                unacked: VecDeque::new(),
                unacked_bytes: 0,
                window_waiting: false,
                over_window: false,
                conn: None,
                origin: Origin::Dialed,
                adopted_from_smaller: false,
                generation: 0,
                dials,
                out: VecDeque::new(),
                out_pos: 0,
                flushing: false,
                flush_scheduled: false,
                last_write: Instant::now(),
                waiting_writable: false,
                broken: false,
                dead: false,
                last_ack: Instant::now(),
                offered_ack: 0,
                piggybacked: 0,
                ack_buf: None,
            }),
            wake: Notify::new(),
            room: Notify::new(),
            on_dead,
            reader,
            stats,
        })
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// Queues a data frame (made by `frame::frame_buffer` and
    /// `frame::finish_frame`); its sequence number is filled in here.
    /// A dead link hands both back.
    pub(crate) fn send(&self, mut frame: AlignedVec, ret: T) -> Result<(), (AlignedVec, T)> {
        let mut st = self.state.lock();
        if st.dead {
            return Err((frame, ret));
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        set_seq(frame.as_mut_slice(), seq);
        // One reading of the clock serves the frame's record, the burst
        // test and the write.
        let now = Instant::now();
        let cost = frame.capacity() + FRAME_OVERHEAD;
        let frame = Arc::new(frame);
        if st.conn.is_some() {
            if st.offered_ack > st.piggybacked {
                // LK-10: the reader's acknowledgement goes out with this frame.
                let seq = st.offered_ack;
                st.piggybacked = seq;
                let ack = st.ack_frame(seq);
                st.out.push_back(ack);
                self.stats.acks_piggybacked.fetch_add(1, Ordering::Relaxed);
            }
            st.out.push_back(frame.clone());
        }
        st.unacked.push_back(Pending {
            seq,
            frame,
            sent: now,
            cost,
            ret,
        });
        st.unacked_bytes += cost;
        if !st.over_window && st.unacked_bytes >= self.config.window_bytes {
            st.over_window = true;
            self.stats.links_over_window.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .peak_unacked_bytes
            .fetch_max(st.unacked_bytes as u64, Ordering::Relaxed);
        if st.conn.is_none() {
            // The link's task connects (or waits for its peer) and writes it.
            drop(st);
            self.wake.notify_one();
            return Ok(());
        }
        if st.flushing || st.waiting_writable || st.flush_scheduled {
            // Whoever is writing, or about to, takes this frame too.
            return Ok(());
        }
        if CORKED.get() || now.saturating_duration_since(st.last_write) < BURST_WINDOW {
            // Part of a burst (or corked by the sender): let the link's task
            // write what piles up meanwhile in one system call.
            st.flush_scheduled = true;
            drop(st);
            self.wake.notify_one();
            return Ok(());
        }
        self.flush_at(st, now);
        Ok(())
    }

    /// Waits until the link holds less than its window of unacknowledged
    /// bytes, or is dead (its sends then fail at once) (LK-8).
    pub(crate) async fn ready(&self) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut st = self.state.lock();
                if st.dead || st.unacked_bytes < self.config.window_bytes {
                    return;
                }
                st.window_waiting = true;
            }
            self.stats.window_waits.fetch_add(1, Ordering::Relaxed);
            room.await;
        }
    }

    /// The window is open again: wakes the senders waiting for it.
    fn opened(&self, st: &mut LinkState<T>) {
        if st.over_window {
            st.over_window = false;
            self.stats.links_over_window.fetch_sub(1, Ordering::Relaxed);
        }
        if st.window_waiting {
            st.window_waiting = false;
            self.room.notify_waiters();
        }
    }

    /// Whether the link holds its window or more, so that [`Link::ready`]
    /// would wait (LK-8).
    pub(crate) fn over_window(&self) -> bool {
        self.state.lock().over_window
    }

    /// The unacknowledged bytes this link holds now (LK-8).
    pub(crate) fn unacked_bytes(&self) -> usize {
        self.state.lock().unacked_bytes
    }

    /// Drops the current connection; the link reconnects and retransmits.
    pub(crate) fn reset(&self) {
        self.state.lock().broken = true;
        self.wake.notify_one();
    }

    /// Writes `out` unless someone else is already writing (LK-4).
    fn flush(&self, st: MutexGuard<'_, LinkState<T>>) {
        self.flush_at(st, Instant::now());
    }

    /// [`Link::flush`], the clock read at `now`.
    fn flush_at(&self, mut st: MutexGuard<'_, LinkState<T>>, now: Instant) {
        if st.flushing || st.waiting_writable || st.out.is_empty() {
            return;
        }
        let Some(conn) = st.conn.clone() else {
            return;
        };
        let generation = st.generation;
        st.flushing = true;
        st.flush_scheduled = false;
        st.last_write = now;
        let mut queue = std::mem::take(&mut st.out);
        let mut pos = std::mem::take(&mut st.out_pos);
        drop(st);
        loop {
            let mut failed = None;
            let mut blocked = false;
            while !queue.is_empty() {
                let written = {
                    let mut slices = [io::IoSlice::new(&[]); MAX_SLICES];
                    let mut count = 0;
                    for (slot, frame) in slices.iter_mut().zip(&queue) {
                        let from = if count == 0 { pos } else { 0 };
                        *slot = io::IoSlice::new(&frame[from..]);
                        count += 1;
                    }
                    match count {
                        // One frame (a lone call): a plain send costs less.
                        1 => conn.try_write(&slices[0]),
                        _ => conn.try_write_vectored(&slices[..count]),
                    }
                };
                match written {
                    Ok(0) => {
                        failed = Some(io::Error::from(io::ErrorKind::WriteZero));
                        break;
                    }
                    Ok(n) => advance(&mut queue, &mut pos, n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        blocked = true;
                        break;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let mut st = self.state.lock();
            if st.generation != generation {
                // A new connection replaced this one and rewrote everything unacknowledged.
                return;
            }
            if let Some(e) = failed {
                tracing::debug!(dest = %self.dest, error = %e, "write failed");
                st.flushing = false;
                st.broken = true;
                drop(st);
                self.wake.notify_one();
                return;
            }
            if blocked {
                // The unwritten rest goes back in front of what was queued
                // meanwhile.
                queue.append(&mut st.out);
                st.out = queue;
                st.out_pos = pos;
                st.flushing = false;
                st.waiting_writable = true;
                drop(st);
                self.wake.notify_one();
                return;
            }
            pos = 0;
            if st.out.is_empty() {
                st.flushing = false;
                // The emptied queue keeps its buffer for the next frames.
                st.out = queue;
                return;
            }
            std::mem::swap(&mut queue, &mut st.out);
            st.last_write = Instant::now();
        }
    }

    /// Takes over `wr`, a connection its peer dialed, unless the link keeps
    /// a connection it dialed itself: it does when `peer_is_smaller` is
    /// false (the connection dialed by the smaller proc id stays) (LK-9).
    /// Returns the connection's generation when adopted: the reader of the
    /// connection hands acknowledgements to [`Link::acked`], writes through
    /// [`Link::control`] and calls [`Link::detach`] when it ends.
    pub(crate) fn adopt(&self, wr: Arc<WriteHalf>, peer_is_smaller: bool) -> Option<u64> {
        let mut st = self.state.lock();
        if st.dead {
            return None;
        }
        if st.conn.is_some() && st.origin == Origin::Dialed && !peer_is_smaller {
            return None;
        }
        let connected_before = st.generation > 0;
        st.generation += 1;
        let generation = st.generation;
        if let Some(old) = st.conn.replace(wr) {
            // Its reader ends, and so does the peer's side of it.
            old.abort();
        }
        st.origin = Origin::Adopted;
        st.adopted_from_smaller = peer_is_smaller;
        st.dials = false;
        self.install(&mut st, connected_before);
        st.out.push_front(self.hello.clone());
        self.stats.adopted.fetch_add(1, Ordering::Relaxed);
        self.flush(st);
        // The link's task tends the new connection (and drops the one it
        // may have dialed).
        self.wake.notify_one();
        Some(generation)
    }

    /// Resets the write state for a new connection in `st.conn` and queues
    /// every unacknowledged frame on it, in order (LK-2).
    fn install(&self, st: &mut LinkState<T>, connected_before: bool) {
        st.broken = false;
        st.flushing = false;
        st.waiting_writable = false;
        st.flush_scheduled = false;
        st.last_ack = Instant::now();
        st.last_write = Instant::now() - BURST_WINDOW;
        st.out_pos = 0;
        st.out = st.unacked.iter().map(|p| p.frame.clone()).collect();
        // Acknowledgements belong to the connection their reader read.
        st.offered_ack = 0;
        st.piggybacked = 0;
        if connected_before {
            self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
            self.stats
                .retransmitted
                .fetch_add(st.unacked.len() as u64, Ordering::Relaxed);
            tracing::debug!(dest = %self.dest, resent = st.unacked.len(), "reconnected");
        }
    }

    /// The peer acknowledged every frame up to `seq`, in a frame read at
    /// `read_at`.
    pub(crate) fn acked(&self, seq: u64, read_at: Instant) {
        let mut st = self.state.lock();
        while st.unacked.front().is_some_and(|p| p.seq <= seq) {
            if let Some(acked) = st.unacked.pop_front() {
                st.unacked_bytes -= acked.cost;
            }
        }
        st.last_ack = st.last_ack.max(read_at);
        if st.unacked_bytes < self.config.window_bytes {
            self.opened(&mut st);
        }
    }

    /// Writes `frame` (an acknowledgement, or a `restarted`) on connection
    /// `generation`, in order with the link's own frames. False when that
    /// connection is no longer the link's: its reader should end.
    pub(crate) fn control(&self, generation: u64, frame: &[u8]) -> bool {
        let mut st = self.state.lock();
        if st.dead || st.generation != generation || st.conn.is_none() {
            return false;
        }
        let mut owned = AlignedVec::with_capacity(frame.len());
        owned.extend_from_slice(frame);
        st.out.push_back(Arc::new(owned));
        if st.flushing || st.waiting_writable || st.flush_scheduled {
            return true;
        }
        self.flush(st);
        true
    }

    /// The reader of connection `generation` has delivered every frame up
    /// to `seq`: the link writes that acknowledgement in front of its next
    /// data frame on that connection (LK-10).
    pub(crate) fn offer_ack(&self, generation: u64, seq: u64) {
        let mut st = self.state.lock();
        if st.generation == generation && seq > st.offered_ack {
            st.offered_ack = seq;
        }
    }

    /// The highest acknowledgement written with data frames on connection
    /// `generation` (LK-10); 0 once that connection is no longer the link's.
    pub(crate) fn piggybacked(&self, generation: u64) -> u64 {
        let st = self.state.lock();
        if st.generation == generation {
            st.piggybacked
        } else {
            0
        }
    }

    /// The reader of connection `generation` ended: the link lets it go.
    pub(crate) fn detach(&self, generation: u64) {
        let mut st = self.state.lock();
        if st.generation == generation && st.conn.is_some() {
            st.broken = true;
            drop(st);
            self.wake.notify_one();
        }
    }

    /// The peer answered that it restarted (LK-7): the link dies now.
    pub(crate) fn restarted(&self) {
        self.die(format!(
            "the proc at {} restarted: what was sent to its earlier incarnation is lost",
            self.dest
        ));
    }

    /// The link's task: dials and redials with backoff (or tends the
    /// connection it adopted), and watches the delivery timeout, until the
    /// link dies.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut backoff = MIN_BACKOFF;
        let mut down_since = Instant::now();
        let mut last_error = String::from("never connected");
        loop {
            // A wake-up that comes while nobody waits is kept for the next
            // wait (`Notify` stores one permit), so none is lost between
            // this look at the state and the wait below.
            let (adopted, dials, holds) = {
                let st = self.state.lock();
                if st.dead {
                    return;
                }
                let adopted =
                    (st.conn.is_some() && st.origin == Origin::Adopted).then_some(st.generation);
                (adopted, st.dials, !st.unacked.is_empty())
            };
            if let Some(generation) = adopted {
                let outcome = self.tend(generation).await;
                if let Some(wr) = self.release(generation) {
                    // Its reader sees the end too.
                    wr.abort();
                }
                match outcome {
                    Served::Lost(reason) => {
                        tracing::debug!(dest = %self.dest, %reason, "adopted connection lost");
                        last_error = reason;
                        down_since = Instant::now();
                        backoff = MIN_BACKOFF;
                        continue;
                    }
                    Served::Dead(reason) => {
                        self.die(reason);
                        return;
                    }
                }
            }
            if !dials && !holds {
                // Nothing to deliver: wait for a frame, or for the peer.
                self.wake.notified().await;
                down_since = Instant::now();
                continue;
            }
            let elapsed = down_since.elapsed();
            if elapsed >= self.config.delivery_timeout {
                self.die(format!("could not connect: {last_error}"));
                return;
            }
            let remaining = self.config.delivery_timeout - elapsed;
            if !dials && elapsed < ADOPT_GRACE {
                // The peer dials back soon if it lives (LK-9).
                let _ = tokio::time::timeout(ADOPT_GRACE - elapsed, self.wake.notified()).await;
                continue;
            }
            let attempt = tokio::time::timeout(
                remaining.min(MAX_CONNECT_WAIT),
                transport::connect(&self.dest),
            )
            .await;
            let conn = match attempt {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    last_error = e.to_string();
                    self.back_off(backoff.min(remaining)).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
                Err(_) => {
                    last_error = "connect timed out".into();
                    continue;
                }
            };
            let (rd, wr) = match conn.into_split() {
                Ok(halves) => halves,
                Err(e) => {
                    last_error = e.to_string();
                    continue;
                }
            };
            if let Err(e) = wr.write_all(&self.hello).await {
                last_error = e.to_string();
                continue;
            }
            self.stats.dialed.fetch_add(1, Ordering::Relaxed);
            let wr = Arc::new(wr);
            let generation = {
                let mut st = self.state.lock();
                if st.dead {
                    return;
                }
                if st.conn.is_some() {
                    if st.origin == Origin::Adopted && !st.adopted_from_smaller {
                        // The peer's connection came first and was adopted,
                        // but this proc has the smaller id: the peer keeps
                        // this one when it arrives, and drops its own, so
                        // this link does too (LK-9). Keeping the adopted
                        // one would leave both ends holding a connection
                        // the other closed, each waiting for the other to
                        // dial.
                        if let Some(adopted) = st.conn.take() {
                            adopted.abort();
                        }
                        st.dials = true;
                    } else {
                        // The peer's connection came first and was adopted.
                        drop(st);
                        wr.abort();
                        continue;
                    }
                }
                let connected_before = st.generation > 0;
                st.generation += 1;
                st.conn = Some(wr.clone());
                st.origin = Origin::Dialed;
                self.install(&mut st, connected_before);
                let generation = st.generation;
                self.flush(st);
                generation
            };
            backoff = MIN_BACKOFF;
            let reading = (self.reader)(rd, self.clone(), generation);
            let outcome = tokio::select! {
                reason = reading => Served::Lost(reason),
                served = self.tend(generation) => served,
            };
            self.release(generation);
            wr.abort();
            if self.state.lock().dead {
                return;
            }
            match outcome {
                Served::Lost(reason) => {
                    tracing::debug!(dest = %self.dest, %reason, "connection lost; reconnecting");
                    last_error = reason;
                    down_since = Instant::now();
                }
                Served::Dead(reason) => {
                    self.die(reason);
                    return;
                }
            }
        }
    }

    /// Waits `pause` before the next dial, unless the peer's connection
    /// is adopted (or the link ends) meanwhile: frames sent meanwhile do
    /// not cut the wait short.
    async fn back_off(&self, pause: Duration) {
        let until = tokio::time::Instant::now() + pause;
        loop {
            {
                let st = self.state.lock();
                if st.dead || st.conn.is_some() {
                    return;
                }
            }
            if tokio::time::timeout_at(until, self.wake.notified())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Forgets connection `generation` if it is still the link's; hands
    /// back its write half.
    fn release(&self, generation: u64) -> Option<Arc<WriteHalf>> {
        let mut st = self.state.lock();
        if st.generation != generation {
            return None;
        }
        st.out.clear();
        st.out_pos = 0;
        st.flushing = false;
        st.waiting_writable = false;
        st.flush_scheduled = false;
        st.conn.take()
    }

    /// Does the writing side of connection `generation` until it is lost,
    /// replaced or stalled: writes what bursts leave to the link's task
    /// (LK-4), waits for room when the socket is full, and watches for
    /// acknowledgements (LK-3). Reading is the reader's.
    async fn tend(&self, generation: u64) -> Served {
        let check_every = (self.config.delivery_timeout / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        // One timer for the link's life, moved on as it fires: a timer made
        // for each wake-up would be set and cancelled for every burst.
        let check = tokio::time::sleep(check_every);
        tokio::pin!(check);
        loop {
            let wake = self.wake.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            let (conn, waiting_writable) = {
                let mut st = self.state.lock();
                if st.dead {
                    return Served::Lost("the link ended".into());
                }
                if st.generation != generation {
                    return Served::Lost("replaced by the peer's connection".into());
                }
                let Some(conn) = st.conn.clone() else {
                    return Served::Lost("connection closed".into());
                };
                if st.broken {
                    return Served::Lost("connection reset".into());
                }
                if st.flush_scheduled && !st.waiting_writable {
                    // Scheduled while this task still tended the connection
                    // this one replaced, which took the wake-up: written
                    // now, or it would wait for the next send (LK-4).
                    st.flush_scheduled = false;
                    self.flush(st);
                    continue;
                }
                (conn, st.waiting_writable)
            };
            tokio::select! {
                biased;
                ready = conn.writable(), if waiting_writable => {
                    if let Err(e) = ready {
                        return Served::Lost(e.to_string());
                    }
                    let mut st = self.state.lock();
                    if st.generation == generation {
                        st.waiting_writable = false;
                        self.flush(st);
                    }
                }
                _ = wake => {
                    let mut st = self.state.lock();
                    if st.generation == generation && st.flush_scheduled {
                        st.flush_scheduled = false;
                        self.flush(st);
                    }
                }
                _ = check.as_mut() => {
                    check.as_mut().reset(tokio::time::Instant::now() + check_every);
                    let st = self.state.lock();
                    let timeout = self.config.delivery_timeout;
                    let stalled = st
                        .unacked
                        .front()
                        .is_some_and(|p| p.sent.elapsed() > timeout)
                        && st.last_ack.elapsed() > timeout;
                    if stalled {
                        return Served::Dead(format!(
                            "no acknowledgement for {} ms",
                            timeout.as_millis()
                        ));
                    }
                }
            }
        }
    }

    fn die(&self, reason: String) {
        if let Some(undelivered) = self.kill() {
            tracing::warn!(
                dest = %self.dest,
                undelivered = undelivered.len(),
                %reason,
                "link dead: peer unreachable past the delivery timeout"
            );
            (self.on_dead)(&self.dest, undelivered, reason);
        }
    }

    /// Ends the link now because its peer is known to have ended (LK-6):
    /// what it still holds is handed back as undeliverable at once, and
    /// nothing is retried.
    pub(crate) fn end(&self, reason: String) {
        if let Some(undelivered) = self.kill() {
            tracing::debug!(dest = %self.dest, undelivered = undelivered.len(), %reason, "link ended: the peer ended");
            (self.on_dead)(&self.dest, undelivered, reason);
            self.wake.notify_one();
        }
    }

    /// Marks the link dead; the unacknowledged frames' return info, unless
    /// it was dead already.
    fn kill(&self) -> Option<Vec<T>> {
        let mut st = self.state.lock();
        if st.dead {
            return None;
        }
        st.dead = true;
        if let Some(conn) = st.conn.take() {
            // Its reader ends too, and the peer hears of it.
            conn.abort();
        }
        st.out = VecDeque::new();
        st.unacked_bytes = 0;
        self.opened(&mut st);
        Some(st.unacked.drain(..).map(|p| p.ret).collect())
    }
}

enum Served {
    /// The connection broke; try again.
    Lost(String),
    /// The peer is unreachable past the delivery timeout.
    Dead(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::frame::{FrameHeader, FrameReader, finish_frame, frame_buffer};
    use crate::channel::transport::Listener;
    use tokio::sync::mpsc;

    fn frames(lens: &[usize]) -> VecDeque<Arc<AlignedVec>> {
        lens.iter()
            .map(|&n| {
                let mut v = AlignedVec::new();
                v.extend_from_slice(&vec![n as u8; n]);
                Arc::new(v)
            })
            .collect()
    }

    /// A partial `sendmsg` leaves the queue at the first unwritten byte,
    /// across frame boundaries: what is written next is exactly the rest.
    #[test]
    fn advance_resumes_at_the_first_unwritten_byte() {
        let mut queue = frames(&[3, 5, 2]);
        let mut pos = 0;
        advance(&mut queue, &mut pos, 2);
        assert_eq!((queue.len(), pos), (3, 2));
        advance(&mut queue, &mut pos, 1); // the end of the first frame
        assert_eq!((queue.len(), pos), (2, 0));
        advance(&mut queue, &mut pos, 6); // all of the second, one of the third
        assert_eq!((queue.len(), pos), (1, 1));
        assert_eq!(queue[0].len(), 2);
        advance(&mut queue, &mut pos, 1);
        assert!(queue.is_empty());
        assert_eq!(pos, 0);
    }

    fn data(value: u8) -> AlignedVec {
        let mut frame = frame_buffer(32);
        frame.extend_from_slice(&[value; 8]);
        finish_frame(&mut frame, FrameKind::Data, 0);
        frame
    }

    /// A reader that hands acknowledgements to the link, as the proc's does.
    fn ack_reader() -> Reader<u8> {
        Box::new(|mut rd, link: Arc<Link<u8>>, _generation| {
            Box::pin(async move {
                let mut reader = FrameReader::new(1 << 20);
                loop {
                    while let Ok(Some((header, _))) = reader.next_frame() {
                        if header.kind == FrameKind::Ack {
                            link.acked(header.seq, Instant::now());
                        }
                    }
                    match reader.fill(&mut rd).await {
                        Ok(true) => {}
                        Ok(false) => return "peer closed".to_string(),
                        Err(e) => return e.to_string(),
                    }
                }
            })
        })
    }

    /// A dialing link to `addr` as the tests use it: session `session`,
    /// hello "tester", a window of 1 MiB, and `on_dead` told of its death.
    fn test_link(
        addr: &ChannelAddr,
        session: u64,
        delivery_timeout: Duration,
        on_dead: impl Fn(&ChannelAddr, Vec<u8>, String) + Send + Sync + 'static,
    ) -> Arc<Link<u8>> {
        Link::new(
            addr.clone(),
            session,
            "tester",
            LinkConfig {
                delivery_timeout,
                window_bytes: 1 << 20,
                dials: true,
            },
            Arc::default(),
            Box::new(on_dead),
            ack_reader(),
        )
    }

    async fn next(reader: &mut FrameReader, rd: &mut ReadHalf) -> (FrameHeader, Vec<u8>) {
        loop {
            if let Some((header, body)) = reader.next_frame().unwrap() {
                return (header, reader.body(body).to_vec());
            }
            assert!(reader.fill(rd).await.unwrap(), "stream ended");
        }
    }

    #[tokio::test]
    async fn lk2_unacknowledged_frames_are_resent_in_order_after_a_reconnect() {
        let addr: ChannelAddr = "local:link-test-resend".parse().unwrap();
        let (mut listener, _) = Listener::bind(&addr).await.unwrap();
        let (dead_tx, _dead_rx) = mpsc::unbounded_channel();
        let link = test_link(
            &addr,
            42,
            Duration::from_secs(10),
            move |_, undelivered, _| {
                let _ = dead_tx.send(undelivered);
            },
        );
        tokio::spawn(link.clone().run());
        for value in 1..=3u8 {
            link.send(data(value), value).map_err(|_| ()).unwrap();
        }

        let (mut rd, wr) = listener.accept().await.unwrap().into_split().unwrap();
        let mut reader = FrameReader::new(1 << 20);
        let (hello, from) = next(&mut reader, &mut rd).await;
        assert_eq!((hello.kind, hello.seq), (FrameKind::Hello, 42));
        assert_eq!(from, b"tester");
        for seq in 1..=3u64 {
            let (header, body) = next(&mut reader, &mut rd).await;
            assert_eq!((header.kind, header.seq), (FrameKind::Data, seq));
            assert_eq!(body, vec![seq as u8; 8]);
        }
        wr.write_all(&small_frame(FrameKind::Ack, 2, &[]))
            .await
            .unwrap();
        // Wait until the ack is processed, then break the connection.
        while link.state.lock().unacked.len() != 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop((rd, wr));

        let (mut rd, _wr) = listener.accept().await.unwrap().into_split().unwrap();
        let mut reader = FrameReader::new(1 << 20);
        assert_eq!(next(&mut reader, &mut rd).await.0.kind, FrameKind::Hello);
        let (header, body) = next(&mut reader, &mut rd).await;
        assert_eq!(
            (header.kind, header.seq),
            (FrameKind::Data, 3),
            "only the unacknowledged frame"
        );
        assert_eq!(body, vec![3u8; 8]);
        link.send(data(4), 4).map_err(|_| ()).unwrap();
        assert_eq!(
            next(&mut reader, &mut rd).await.0.seq,
            4,
            "new frames follow"
        );
    }

    /// LK-9 with LK-4: a burst sent just after the link adopts a new
    /// connection, before its task has left the one it dialed, is written
    /// on the new connection (the wake-up it sent went to the task while
    /// it still tended the old one, and was lost with it).
    #[tokio::test]
    async fn lk9_a_burst_sent_as_a_connection_is_adopted_is_written_on_it() {
        let addr: ChannelAddr = "local:link-test-adopt-burst".parse().unwrap();
        let (mut listener, _) = Listener::bind(&addr).await.unwrap();
        let link = test_link(&addr, 9, Duration::from_secs(10), |_, _, _| {});
        tokio::spawn(link.clone().run());
        link.send(data(1), 1).map_err(|_| ()).unwrap();
        let (mut dialed_rd, _dialed_wr) = listener.accept().await.unwrap().into_split().unwrap();
        let mut reader = FrameReader::new(1 << 20);
        assert_eq!(
            next(&mut reader, &mut dialed_rd).await.0.kind,
            FrameKind::Hello
        );
        assert_eq!(next(&mut reader, &mut dialed_rd).await.0.seq, 1);

        // The peer's connection: this end is adopted, the other read here.
        let ours = transport::connect(&addr).await.unwrap();
        let (mut peer_rd, _peer_wr) = listener.accept().await.unwrap().into_split().unwrap();
        let (_ours_rd, ours_wr) = ours.into_split().unwrap();
        // No await between these: the link's task has not run since.
        assert!(link.adopt(Arc::new(ours_wr), true).is_some());
        corked(|| link.send(data(2), 2)).map_err(|_| ()).unwrap();

        let mut reader = FrameReader::new(1 << 20);
        let read = async {
            let mut seqs = Vec::new();
            while seqs.len() < 2 {
                let (header, _) = next(&mut reader, &mut peer_rd).await;
                if header.kind == FrameKind::Data {
                    seqs.push(header.seq);
                }
            }
            seqs
        };
        let seqs = tokio::time::timeout(Duration::from_secs(2), read)
            .await
            .expect("the burst was never written on the adopted connection");
        assert_eq!(
            seqs,
            vec![1, 2],
            "the unacknowledged frame again, then the burst"
        );
    }

    #[tokio::test]
    async fn lk3_a_link_that_cannot_connect_dies_and_returns_every_frame() {
        let addr: ChannelAddr = "local:link-test-nobody".parse().unwrap();
        let (dead_tx, mut dead_rx) = mpsc::unbounded_channel();
        let link = test_link(
            &addr,
            7,
            Duration::from_millis(200),
            move |_, undelivered, reason| {
                let _ = dead_tx.send((undelivered, reason));
            },
        );
        tokio::spawn(link.clone().run());
        for value in 1..=5u8 {
            link.send(data(value), value).map_err(|_| ()).unwrap();
        }
        let started = Instant::now();
        let (undelivered, reason) = dead_rx.recv().await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(undelivered, vec![1, 2, 3, 4, 5]);
        assert!(reason.contains("could not connect"), "{reason}");
        assert!(link.is_dead());
        assert!(
            link.send(data(6), 6).is_err(),
            "a dead link takes no more frames"
        );
    }
}
