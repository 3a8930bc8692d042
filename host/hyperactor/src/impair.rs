//! Impairments: network faults between this proc and a peer, made on
//! purpose, so that a program's tests can check that it survives them
//! ([`Proc::delay_to`], [`Proc::cut_to`], [`Proc::heal_to`]).
//!
//! An impairment acts on the messages this proc *sends* to one peer
//! address, at the one place every message leaves a proc
//! (`Proc::post`), before the link or the in-process hand-over; a fault
//! between two procs is an impairment in each, one per direction. A
//! message that must wait is held here, in order, and sent by a task of
//! the proc when its time comes, so the receiver sees what a slow or
//! broken network would give it:
//!
//! - IM-1: a delay holds each message sent while it lasts for the delay,
//!   and a cut holds each until the cut ends: it then goes on as a link
//!   that reconnects would send it. Nothing is lost or duplicated.
//! - IM-2: messages to a peer keep their order across holds: once one is
//!   held, every later one to that peer waits behind it, even after the
//!   impairment has ended.
//! - IM-3: a message held longer than the proc's delivery timeout fails
//!   then, as undeliverable (`DeliveryFailure::Unreachable`), exactly as
//!   over a real cut (LK-3): its sender and the call waiting on it hear.
//! - IM-4: healing ends the impairment now and sends what it held at
//!   once, in order.
//! - IM-5: a proc with no impairment pays one relaxed atomic load per
//!   message.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::channel::ChannelAddr;
use crate::failure::DeliveryFailure;
use crate::proc::{Proc, ProcInner};

/// A held message: sends it (None) or fails it (Some) when its time comes.
pub(crate) type Held = Box<dyn FnOnce(&Proc, Option<DeliveryFailure>) + Send>;

struct Waiting {
    /// When it goes on.
    due: Instant,
    /// When it was sent; it fails a delivery timeout after (IM-3).
    sent: Instant,
    held: Held,
}

struct Peer {
    delay: Duration,
    delay_until: Instant,
    cut_until: Instant,
    queue: VecDeque<Waiting>,
    /// A task sends what the queue holds.
    draining: bool,
    /// That task is sending one message now (IM-2: later ones wait).
    busy: bool,
    wake: Arc<Notify>,
}

impl Peer {
    fn new(now: Instant) -> Peer {
        Peer {
            delay: Duration::ZERO,
            delay_until: now,
            cut_until: now,
            queue: VecDeque::new(),
            draining: false,
            busy: false,
            wake: Arc::new(Notify::new()),
        }
    }

    fn over(&self, now: Instant) -> bool {
        now >= self.delay_until && now >= self.cut_until
    }

    fn idle(&self) -> bool {
        self.queue.is_empty() && !self.busy && !self.draining
    }
}

/// A proc's impairments, by peer address.
#[derive(Default)]
pub(crate) struct Impairments {
    /// Whether any peer has an entry (IM-5).
    any: AtomicBool,
    peers: Mutex<HashMap<ChannelAddr, Peer>>,
}

/// What [`Impairments::admit`] decided.
pub(crate) enum Admit {
    /// Send it now.
    Now(Held),
    /// Held; a task sends it.
    Held,
}

impl Impairments {
    /// Whether any impairment may apply (IM-5).
    pub(crate) fn active(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Holds `held`, a message to `peer`, if an impairment says so
    /// (IM-1, IM-2); otherwise hands it back to be sent now.
    pub(crate) fn admit(&self, proc: &Arc<ProcInner>, peer: &ChannelAddr, held: Held) -> Admit {
        let now = Instant::now();
        let mut peers = self.peers.lock();
        let Some(entry) = peers.get_mut(peer) else {
            return Admit::Now(held);
        };
        let mut due = now;
        if now < entry.delay_until {
            due = now + entry.delay;
        }
        due = due.max(entry.cut_until);
        if let Some(last) = entry.queue.back() {
            due = due.max(last.due);
        }
        if due <= now && entry.queue.is_empty() && !entry.busy {
            return Admit::Now(held);
        }
        entry.queue.push_back(Waiting {
            due,
            sent: now,
            held,
        });
        if !entry.draining {
            entry.draining = true;
            let weak = Arc::downgrade(proc);
            let peer = peer.clone();
            proc.runtime_handle().spawn(drain(weak, peer));
        }
        Admit::Held
    }

    /// When a message sent to `peer` now may leave at the earliest, if an
    /// impairment holds it: for a simulated network, which schedules
    /// every message itself (`sim.rs`).
    pub(crate) fn floor(&self, peer: &ChannelAddr) -> Option<Instant> {
        if !self.active() {
            return None;
        }
        let now = Instant::now();
        let peers = self.peers.lock();
        let entry = peers.get(peer)?;
        let mut due = now;
        if now < entry.delay_until {
            due = now + entry.delay;
        }
        due = due.max(entry.cut_until);
        (due > now).then_some(due)
    }

    /// Delays messages to `peer` by `delay` for `duration`.
    pub(crate) fn delay(&self, peer: &ChannelAddr, delay: Duration, duration: Duration) {
        let now = Instant::now();
        let mut peers = self.peers.lock();
        let entry = peers.entry(peer.clone()).or_insert_with(|| Peer::new(now));
        entry.delay = delay;
        entry.delay_until = now + duration;
        self.any.store(true, Ordering::Relaxed);
    }

    /// Holds messages to `peer` for `duration`.
    pub(crate) fn cut(&self, peer: &ChannelAddr, duration: Duration) {
        let now = Instant::now();
        let mut peers = self.peers.lock();
        let entry = peers.entry(peer.clone()).or_insert_with(|| Peer::new(now));
        entry.cut_until = entry.cut_until.max(now + duration);
        self.any.store(true, Ordering::Relaxed);
    }

    /// Ends the impairments of `peer`, or of every peer (IM-4).
    pub(crate) fn heal(&self, peer: Option<&ChannelAddr>) {
        let now = Instant::now();
        let mut peers = self.peers.lock();
        for (addr, entry) in peers.iter_mut() {
            if peer.is_some_and(|p| p != addr) {
                continue;
            }
            entry.delay_until = now;
            entry.cut_until = now;
            for waiting in entry.queue.iter_mut() {
                waiting.due = now;
            }
            entry.wake.notify_one();
        }
        peers.retain(|_, entry| !entry.idle());
        self.any.store(!peers.is_empty(), Ordering::Relaxed);
    }

    /// The peers with an impairment now, for tests and reports.
    pub(crate) fn impaired_peers(&self) -> Vec<ChannelAddr> {
        let now = Instant::now();
        let peers = self.peers.lock();
        let mut out: Vec<ChannelAddr> = peers
            .iter()
            .filter(|(_, entry)| !entry.over(now))
            .map(|(addr, _)| addr.clone())
            .collect();
        out.sort_by_key(|addr| addr.to_string());
        out
    }
}

/// Sends what is held for `peer`, each when its time comes (IM-1..3).
async fn drain(proc: std::sync::Weak<ProcInner>, peer: ChannelAddr) {
    loop {
        let Some(inner) = proc.upgrade() else {
            return;
        };
        let timeout = inner.config_ref().delivery_timeout;
        let impairments = inner.impairments();
        let (at, wake) = {
            let mut peers = impairments.peers.lock();
            let Some(entry) = peers.get_mut(&peer) else {
                return;
            };
            entry.busy = false;
            let Some(front) = entry.queue.front() else {
                entry.draining = false;
                if entry.over(Instant::now()) {
                    peers.remove(&peer);
                    impairments.any.store(!peers.is_empty(), Ordering::Relaxed);
                }
                return;
            };
            (front.due.min(front.sent + timeout), entry.wake.clone())
        };
        drop(inner);
        if at > Instant::now() {
            tokio::select! {
                _ = tokio::time::sleep_until(at) => {}
                // Healed: the dues changed.
                _ = wake.notified() => continue,
            }
        }
        let Some(inner) = proc.upgrade() else {
            return;
        };
        let now = Instant::now();
        let next = {
            let mut peers = inner.impairments().peers.lock();
            let Some(entry) = peers.get_mut(&peer) else {
                return;
            };
            match entry.queue.front() {
                Some(front) if front.due <= now || front.sent + timeout <= now => {
                    let waiting = entry.queue.pop_front().expect("a front");
                    entry.busy = true;
                    Some(waiting)
                }
                _ => None,
            }
        };
        let Some(waiting) = next else {
            continue;
        };
        let failure = (waiting.due > now).then(|| DeliveryFailure::Unreachable {
            addr: peer.to_string(),
            timeout_ms: timeout.as_millis() as u64,
            detail:
                "the network to it was down (a fault made on purpose) past the delivery timeout"
                    .into(),
        });
        (waiting.held)(&Proc::from_inner(inner), failure);
    }
}
