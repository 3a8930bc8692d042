//! The executor: how futures of calls are driven by the host's event
//! mailbox.
//!
//! The WIT is synchronous: `call`, `call-one`, `choose` and `stream` return a
//! request id at once, and `next-events` hands over what happened since. The
//! [`Reactor`] keeps one slot per request id in flight; [`block_on`] polls a
//! future, and while it is pending fetches a batch of events and routes each
//! one to its slot, waking the task that waits there. One `block_on` can
//! therefore await thousands of calls at once, for example with
//! [`futures::future::join_all`].
//!
//! Invariants (the tests below are named after them):
//!
//! - EX-1: every event reaches the slot of its request id, in arrival order,
//!   whatever the order in which the ids were issued or are awaited.
//! - EX-2: a request's slot is gone once its final event (`done`, or `end`
//!   for a stream) has been taken, or once the future that owned it was
//!   dropped; events for an id without a slot are dropped and counted.
//! - EX-3: `failure` events (id 0) go to a queue of their own, read by
//!   [`take_failures`] and [`next_failure`].
//! - EX-6: a failure is handled when a task waits for it in
//!   [`next_failure`] or the supervisor ([`supervise`]) returns true; an
//!   unhandled failure ends the controller's `main` with an error at its
//!   next wait for the host.
//! - EX-4: a future that is pending while no request is waiting for the host,
//!   no timer is pending and nothing woke it can never finish: `block_on`
//!   panics with a message instead of waiting forever. A pending timer
//!   ([`sleep`](crate::sleep)) can wake it, so a future waiting only on a
//!   sleep is fine.
//! - EX-7: timers never make `block_on` spin: while one is pending it asks
//!   the host to wait until the earliest deadline, rounded up to whole
//!   milliseconds (at most `WAIT_MS`), and wakes every timer that is due
//!   after each wait.
//! - EX-5: `block_on` may be nested (a handler that blocks inside an actor's
//!   `handle`); events the inner loop fetches for the outer futures wake
//!   them, and are not lost.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::bindings::monarch::host::mesh as wit_mesh;
use crate::bindings::monarch::host::types::{Event, EventKind};
use crate::error::SupervisionFailure;

/// A request, as the host numbers it.
pub(crate) type RequestId = u64;

/// The most events fetched with one `next-events`.
const MAX_EVENTS: u32 = 1024;
/// How long one `next-events` waits before `block_on` checks again (the
/// host's call timeout bounds every request, so this only paces the loop).
const WAIT_MS: u64 = 60_000;

/// Where events come from: the host, or a script in tests.
pub(crate) trait EventSource {
    fn next_events(&mut self, max: u32, timeout_ms: u64) -> Vec<Event>;
}

/// The host's event mailbox.
struct HostEvents;

impl EventSource for HostEvents {
    fn next_events(&mut self, max: u32, timeout_ms: u64) -> Vec<Event> {
        wit_mesh::next_events(max, timeout_ms)
    }
}

#[derive(Default)]
struct Slot {
    events: VecDeque<EventKind>,
    waker: Option<Waker>,
    /// The final event has arrived (it may not have been taken yet).
    finished: bool,
}

/// The routing table from request ids to the futures that wait on them.
#[derive(Default)]
pub(crate) struct Reactor {
    slots: BTreeMap<RequestId, Slot>,
    failures: VecDeque<SupervisionFailure>,
    failure_waiters: BTreeMap<u64, Waker>,
    /// Failures fetched but not yet offered to a waiter or the supervisor.
    fresh: Vec<SupervisionFailure>,
    supervisor: Option<Supervisor>,
    /// The first failure nobody handled (EX-6), and who waits for it.
    unhandled: Option<SupervisionFailure>,
    unhandled_waker: Option<Waker>,
    next_waiter: u64,
    dropped: u64,
    /// Pending timers by deadline, then by key (EX-7).
    timers: BTreeMap<(Instant, u64), Waker>,
    next_timer: u64,
    /// The call timeout and handler deadline the program set (`None`: not
    /// set, the host's default), so that a per-call override can restore
    /// them.
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) handler_timeout: Option<Duration>,
}

fn is_final(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Done(_) | EventKind::End)
}

impl Reactor {
    /// Starts routing events for `id` (EX-1).
    pub(crate) fn register(&mut self, id: RequestId) {
        self.slots.entry(id).or_default();
    }

    /// Stops routing events for `id`; later ones are dropped (EX-2).
    pub(crate) fn cancel(&mut self, id: RequestId) {
        self.slots.remove(&id);
    }

    /// Routes one event, collecting the wakers to wake once the reactor is
    /// no longer borrowed.
    fn deliver(&mut self, event: Event, wake: &mut Vec<Waker>) {
        if let EventKind::Failure(failure) = event.kind {
            self.fresh.push(failure.into());
            return;
        }
        match self.slots.get_mut(&event.id) {
            Some(slot) => {
                slot.finished |= is_final(&event.kind);
                slot.events.push_back(event.kind);
                wake.extend(slot.waker.take());
            }
            None => self.dropped += 1,
        }
    }

    /// Takes the next event for `id`, or leaves `waker` to be woken when one
    /// comes. `Ready(None)` means the id has no slot.
    pub(crate) fn poll_event(&mut self, id: RequestId, waker: &Waker) -> Poll<Option<EventKind>> {
        let Some(slot) = self.slots.get_mut(&id) else {
            return Poll::Ready(None);
        };
        match slot.events.pop_front() {
            Some(kind) => {
                if is_final(&kind) {
                    self.slots.remove(&id);
                }
                Poll::Ready(Some(kind))
            }
            None => {
                slot.waker = Some(waker.clone());
                Poll::Pending
            }
        }
    }

    /// How many waiters can still be woken by an event from the host: the
    /// requests whose final event has not come, and any task waiting for a
    /// failure (EX-4).
    fn waiting_for_host(&self) -> usize {
        self.slots.values().filter(|s| !s.finished).count() + self.failure_waiters.len()
    }

    /// Arms (or re-arms, with a fresh waker) the timer `key` for
    /// `deadline`; returns its key.
    pub(crate) fn set_timer(&mut self, deadline: Instant, key: Option<u64>, waker: &Waker) -> u64 {
        let key = key.unwrap_or_else(|| {
            self.next_timer += 1;
            self.next_timer
        });
        self.timers.insert((deadline, key), waker.clone());
        key
    }

    /// Disarms a timer; nothing happens if it already fired.
    pub(crate) fn cancel_timer(&mut self, deadline: Instant, key: u64) {
        self.timers.remove(&(deadline, key));
    }

    /// The earliest pending deadline.
    fn next_deadline(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(deadline, _)| *deadline)
    }

    /// Takes the wakers of the timers due at `now` (EX-7).
    fn fire_timers(&mut self, now: Instant, wake: &mut Vec<Waker>) {
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            wake.push(entry.remove());
        }
    }

    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    #[cfg(test)]
    pub(crate) fn timers(&self) -> usize {
        self.timers.len()
    }
}

/// How long `next-events` may wait for the earliest timer due at
/// `deadline`: whole milliseconds, rounded up so that the wait never ends
/// before the deadline (EX-7), and at most [`WAIT_MS`].
fn wait_ms(deadline: Option<Instant>, now: Instant) -> u64 {
    match deadline {
        Some(deadline) => {
            let left = deadline.saturating_duration_since(now).as_nanos();
            u64::try_from(left.div_ceil(1_000_000))
                .unwrap_or(u64::MAX)
                .min(WAIT_MS)
        }
        None => WAIT_MS,
    }
}

thread_local! {
    static REACTOR: RefCell<Reactor> = RefCell::new(Reactor::default());
}

/// Runs `f` on this instance's reactor. Never call it from inside `f`.
pub(crate) fn with_reactor<R>(f: impl FnOnce(&mut Reactor) -> R) -> R {
    REACTOR.with_borrow_mut(f)
}

/// Like [`with_reactor`], but does nothing while the thread is being torn
/// down (for `Drop` impls).
pub(crate) fn try_with_reactor(f: impl FnOnce(&mut Reactor)) {
    let _ = REACTOR.try_with(|r| {
        if let Ok(mut r) = r.try_borrow_mut() {
            f(&mut r);
        }
    });
}

/// Wakes `block_on` by raising a flag.
#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `future` to completion, waiting for host events while it is pending.
///
/// Use it for the controller's `main` (the [`program!`](crate::program!)
/// macro does) and wherever synchronous code must wait for calls, such as an
/// actor's [`create`](crate::Actor::create). Async handlers need not call
/// it: the SDK already runs them with `block_on`. Nesting is allowed.
///
/// # Panics
///
/// When `future` is pending, nothing has woken it, and no request is
/// waiting for the host: it could never finish (for example a future that
/// awaits a channel no one sends on). The panic traps the instance, which
/// fails the run or the actor with the message.
pub fn block_on<F: Future>(future: F) -> F::Output {
    block_on_with(&mut HostEvents, future)
}

pub(crate) fn block_on_with<F: Future>(source: &mut impl EventSource, future: F) -> F::Output {
    let flag = Arc::new(Flag::default());
    let waker = Waker::from(flag.clone());
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        flag.0.store(false, Ordering::Release);
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        while !flag.0.load(Ordering::Acquire) {
            let (waiting, deadline) = with_reactor(|r| (r.waiting_for_host(), r.next_deadline()));
            if waiting == 0 && deadline.is_none() {
                panic!(
                    "monarch_guest::block_on: the future is pending, yet no request is waiting \
                     for the host, no timer is set and nothing woke it, so it can never finish; \
                     is it waiting on something other than a call, a stream, a sleep or \
                     next_failure?"
                );
            }
            // Reading the clock is a host call: only with a timer set.
            let wait = deadline.map_or(WAIT_MS, |at| wait_ms(Some(at), Instant::now()));
            let events = source.next_events(MAX_EVENTS, wait);
            let mut wake = Vec::new();
            with_reactor(|r| {
                for event in events {
                    r.deliver(event, &mut wake);
                }
                if r.next_deadline().is_some() {
                    r.fire_timers(Instant::now(), &mut wake);
                }
            });
            wake.extend(offer_failures());
            wake.into_iter().for_each(Waker::wake);
        }
    }
}

/// Decides whether a failure is handled (EX-6): true keeps the program
/// going.
type Supervisor = Box<dyn FnMut(&SupervisionFailure) -> bool>;

/// Sets the controller's supervisor: it is called with every failure of
/// the meshes the program owns (an actor trapped, a proc exited, was killed
/// or lost, a broadcast failed) that no task awaits with [`next_failure`].
/// `true` means handled: the program carries on. `false`, or a failure with
/// no supervisor set, ends `main` with an error naming the failure, the
/// next time it waits for the host, as Monarch's controller fails on an
/// unhandled supervision event.
///
/// ```no_run
/// monarch_guest::supervise(|failure| {
///     monarch_guest::warn!("carrying on without {}[{}]", failure.mesh, failure.rank);
///     true
/// });
/// ```
pub fn supervise(supervisor: impl FnMut(&SupervisionFailure) -> bool + 'static) {
    with_reactor(|r| r.supervisor = Some(Box::new(supervisor)));
}

/// Offers the failures just fetched to waiters, else to the supervisor;
/// returns the wakers to wake.
fn offer_failures() -> Vec<Waker> {
    let fresh = with_reactor(|r| std::mem::take(&mut r.fresh));
    let mut wake = Vec::new();
    for failure in fresh {
        let awaited = with_reactor(|r| !r.failure_waiters.is_empty());
        let handled = awaited || {
            // Called outside the reactor, which it may use.
            let supervisor = with_reactor(|r| r.supervisor.take());
            match supervisor {
                Some(mut supervisor) => {
                    let handled = supervisor(&failure);
                    with_reactor(|r| {
                        r.supervisor.get_or_insert(supervisor);
                    });
                    handled
                }
                None => false,
            }
        };
        with_reactor(|r| {
            r.failures.push_back(failure.clone());
            wake.extend(std::mem::take(&mut r.failure_waiters).into_values());
            if !handled && r.unhandled.is_none() {
                r.unhandled = Some(failure);
                wake.extend(r.unhandled_waker.take());
            }
        });
    }
    wake
}

/// The first failure nobody handled (EX-6); pending until there is one.
pub(crate) struct Unhandled;

impl Future for Unhandled {
    type Output = SupervisionFailure;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<SupervisionFailure> {
        with_reactor(|r| match r.unhandled.take() {
            Some(failure) => Poll::Ready(failure),
            None => {
                r.unhandled_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        })
    }
}

/// Takes the failures that `failure` events reported so far: actors of the
/// meshes this program owns that died outside any call, such as a
/// `broadcast` that failed. Each failed actor is reported once, here, even
/// when calls that waited on it also ended with a
/// [`CallError`](crate::CallError) naming it.
///
/// Only events already fetched count; a `block_on` that awaited calls has
/// fetched everything up to its last call's reply.
pub fn take_failures() -> Vec<SupervisionFailure> {
    with_reactor(|r| r.failures.drain(..).collect())
}

/// Waits for the next failure that a `failure` event reports (see
/// [`take_failures`]).
pub fn next_failure() -> NextFailure {
    NextFailure { waiter: None }
}

/// The future of [`next_failure`].
#[must_use = "futures do nothing unless awaited"]
pub struct NextFailure {
    waiter: Option<u64>,
}

impl Future for NextFailure {
    type Output = SupervisionFailure;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<SupervisionFailure> {
        let waiter = self.waiter;
        let (ready, waiter) = with_reactor(|r| {
            if let Some(waiter) = waiter {
                r.failure_waiters.remove(&waiter);
            }
            match r.failures.pop_front() {
                Some(failure) => (Some(failure), None),
                None => {
                    let waiter = r.next_waiter;
                    r.next_waiter += 1;
                    r.failure_waiters.insert(waiter, cx.waker().clone());
                    (None, Some(waiter))
                }
            }
        });
        self.waiter = waiter;
        ready.map_or(Poll::Pending, Poll::Ready)
    }
}

impl Drop for NextFailure {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter {
            try_with_reactor(|r| {
                r.failure_waiters.remove(&waiter);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bindings::monarch::host::types as wit;
    use crate::call::{Call, CallStream};
    use crate::value_mesh::ValueMesh;
    use crate::{CallError, codec, extent};
    use futures::future::join_all;

    /// Replays scripted batches of events; each `next_events` returns one
    /// batch (at most `max` of it; the rest waits for the next call). It
    /// records the timeouts it was asked for; once `waits` is set, it
    /// sleeps for the timeout when it has no batch left, as the host waits
    /// when no event comes.
    #[derive(Default)]
    struct Script {
        batches: VecDeque<Vec<Event>>,
        fetches: usize,
        timeouts: Vec<u64>,
        waits: bool,
    }

    impl Script {
        fn new(batches: impl IntoIterator<Item = Vec<Event>>) -> Self {
            Self {
                batches: batches.into_iter().collect(),
                ..Self::default()
            }
        }

        /// A script that then waits out every timeout, like the host.
        fn waiting(batches: impl IntoIterator<Item = Vec<Event>>) -> Self {
            Self {
                waits: true,
                ..Self::new(batches)
            }
        }
    }

    impl EventSource for Script {
        fn next_events(&mut self, max: u32, timeout_ms: u64) -> Vec<Event> {
            self.fetches += 1;
            self.timeouts.push(timeout_ms);
            if self.batches.is_empty() && self.waits {
                std::thread::sleep(Duration::from_millis(timeout_ms));
                return Vec::new();
            }
            let mut batch = self.batches.pop_front().unwrap_or_default();
            if batch.len() > max as usize {
                let rest = batch.split_off(max as usize);
                self.batches.push_front(rest);
            }
            batch
        }
    }

    fn single(id: RequestId, bytes: Vec<u8>) -> Event {
        Event {
            id,
            kind: EventKind::Done(Ok(wit::Reply::Single(bytes))),
        }
    }

    fn failure(mesh: &str, rank: u32) -> wit::SupervisionFailure {
        wit::SupervisionFailure {
            mesh: mesh.into(),
            rank,
            kind: wit::ErrorKind::Trap,
            endpoint: None,
            type_name: None,
            reason: "trapped".into(),
            backtrace: None,
        }
    }

    #[test]
    fn ex1_thousands_of_calls_complete_whatever_the_reply_order() {
        let calls: Vec<Call<i64>> = (1..=3000).map(Call::<i64>::single).collect();
        // Replies arrive newest first, in batches larger than MAX_EVENTS.
        let replies: Vec<Event> = (1..=3000u64)
            .rev()
            .map(|id| single(id, codec::encode(&(id as i64 * 10)).unwrap()))
            .collect();
        let mut script = Script::new([replies]);
        let results = block_on_with(&mut script, join_all(calls));
        let expected: Vec<_> = (1..=3000).map(|id| Ok(id * 10)).collect();
        assert_eq!(results, expected);
        assert_eq!(script.fetches, 3, "3000 events in batches of at most 1024");
        assert_eq!(with_reactor(|r| r.slots()), 0);
    }

    #[test]
    fn ex1_a_stream_yields_items_in_arrival_order_then_ends() {
        let stream = CallStream::<String>::start(7);
        let refused = wit::CallError {
            kind: wit::ErrorKind::Endpoint,
            origin: Some(wit::Origin {
                mesh: "m".into(),
                rank: 0,
                endpoint: Some("s".into()),
            }),
            message: "no".into(),
            type_name: None,
            backtrace: None,
        };
        let item = |rank: u32, r: Result<&str, wit::CallError>| Event {
            id: 7,
            kind: EventKind::Item((rank, r.map(|s| codec::encode(&s.to_string()).unwrap()))),
        };
        let mut script = Script::new([
            vec![item(2, Ok("two"))],
            vec![
                item(0, Err(refused.clone())),
                item(1, Ok("one")),
                Event {
                    id: 7,
                    kind: EventKind::End,
                },
            ],
        ]);
        let items = block_on_with(&mut script, futures::StreamExt::collect::<Vec<_>>(stream));
        assert_eq!(
            items,
            vec![
                (2, Ok("two".to_string())),
                (0, Err(CallError::from(refused))),
                (1, Ok("one".to_string())),
            ]
        );
        assert_eq!(with_reactor(|r| r.slots()), 0);
    }

    #[test]
    fn ex2_a_dropped_call_leaves_no_slot_and_its_reply_is_dropped() {
        let kept = Call::<i64>::single(1);
        drop(Call::<i64>::single(2));
        assert_eq!(with_reactor(|r| r.slots()), 1);
        let mut script = Script::new([vec![
            single(2, codec::encode(&5i64).unwrap()),
            single(1, codec::encode(&6i64).unwrap()),
        ]]);
        assert_eq!(block_on_with(&mut script, kept), Ok(6));
        assert_eq!(with_reactor(|r| (r.slots(), r.dropped)), (0, 1));
    }

    #[test]
    fn ex3_failure_events_go_to_their_own_queue() {
        let call = Call::<i64>::single(1);
        let mut script = Script::new([vec![
            Event {
                id: 0,
                kind: EventKind::Failure(failure("workers", 3)),
            },
            single(1, codec::encode(&1i64).unwrap()),
        ]]);
        assert_eq!(block_on_with(&mut script, call), Ok(1));
        let failures = take_failures();
        assert_eq!(failures.len(), 1);
        assert_eq!(
            (failures[0].mesh.as_str(), failures[0].rank),
            ("workers", 3)
        );
        assert!(take_failures().is_empty());
    }

    #[test]
    fn ex3_next_failure_waits_for_a_failure_event() {
        let mut script = Script::new([
            vec![],
            vec![Event {
                id: 0,
                kind: EventKind::Failure(failure("workers", 1)),
            }],
        ]);
        let failure = block_on_with(&mut script, next_failure());
        assert_eq!(failure.rank, 1);
        assert_eq!(script.fetches, 2, "an empty batch means the wait timed out");
        assert!(with_reactor(|r| r.failure_waiters.is_empty()));
    }

    #[test]
    #[should_panic(expected = "can never finish")]
    fn ex4_a_future_nothing_can_wake_panics_instead_of_hanging() {
        block_on_with(&mut Script::default(), std::future::pending::<()>());
    }

    #[test]
    fn ex4_a_reply_buffered_for_a_call_nobody_awaits_does_not_keep_block_on_waiting() {
        let _unawaited = Call::<i64>::single(1);
        let stuck = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut script = Script::new([vec![single(1, codec::encode(&1i64).unwrap())]]);
            block_on_with(&mut script, std::future::pending::<()>())
        }));
        assert!(stuck.is_err());
    }

    #[test]
    fn ex5_nested_block_on_wakes_the_outer_futures() {
        let outer = Call::<i64>::single(1);
        let inner_then_outer = async {
            // A handler that blocks inside its actor's `handle`: the inner
            // loop fetches the outer call's reply along with its own.
            let inner = Call::<i64>::single(2);
            let mut inner_script = Script::new([vec![
                single(1, codec::encode(&100i64).unwrap()),
                single(2, codec::encode(&200i64).unwrap()),
            ]]);
            let inner = block_on_with(&mut inner_script, inner);
            let outer = outer.await;
            (inner, outer)
        };
        let mut outer_script = Script::default();
        let (inner, outer) = block_on_with(&mut outer_script, inner_then_outer);
        assert_eq!((inner, outer), (Ok(200), Ok(100)));
        assert_eq!(outer_script.fetches, 0, "the inner loop fetched everything");
    }

    #[test]
    fn ex4_a_future_waiting_only_on_a_sleep_does_not_panic() {
        let mut script = Script::waiting([]);
        let start = Instant::now();
        block_on_with(&mut script, crate::sleep(Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(with_reactor(|r| r.timers()), 0);
    }

    #[test]
    fn ex7_a_sleep_asks_the_host_to_wait_until_its_deadline_without_spinning() {
        let mut script = Script::waiting([]);
        let start = Instant::now();
        block_on_with(&mut script, crate::sleep(Duration::from_millis(40)));
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(40), "{elapsed:?}");
        // Rounded up: the first wait covers the whole sleep, so the host
        // is asked at most once more (for what the rounding left).
        let first = script.timeouts[0];
        assert!((39..=40).contains(&first), "{:?}", script.timeouts);
        assert!(script.fetches <= 2, "{:?}", script.timeouts);
    }

    #[test]
    fn ex7_the_wait_is_the_earliest_deadline_in_whole_milliseconds() {
        let now = Instant::now();
        let at = |micros| Some(now + Duration::from_micros(micros));
        assert_eq!(wait_ms(None, now), WAIT_MS);
        assert_eq!(wait_ms(at(0), now), 0);
        assert_eq!(wait_ms(at(1), now), 1, "never 0 before the deadline");
        assert_eq!(wait_ms(at(2_500), now), 3);
        assert_eq!(wait_ms(at(1_000_000_000_000), now), WAIT_MS);
        assert_eq!(wait_ms(Some(now), now + Duration::from_secs(1)), 0);
    }

    #[test]
    fn ex7_sleeps_end_in_deadline_order() {
        let order = RefCell::new(Vec::new());
        let sleeper = |ms: u64| {
            let order = &order;
            async move {
                crate::sleep(Duration::from_millis(ms)).await;
                order.borrow_mut().push(ms);
            }
        };
        let mut script = Script::waiting([]);
        block_on_with(
            &mut script,
            join_all([sleeper(30), sleeper(10), sleeper(20)]),
        );
        assert_eq!(order.into_inner(), [10, 20, 30]);
        assert_eq!(with_reactor(|r| r.timers()), 0);
    }

    #[test]
    fn ex2_a_timeout_around_a_call_that_never_replies_elapses_and_leaves_no_slot() {
        let call = Call::<i64>::single(1);
        let mut script = Script::waiting([]);
        let start = Instant::now();
        let result = block_on_with(&mut script, crate::timeout(Duration::from_millis(20), call));
        assert_eq!(
            result.map_err(|e| e.after()),
            Err(Duration::from_millis(20))
        );
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(
            script.timeouts.iter().all(|&ms| ms <= 20),
            "{:?}",
            script.timeouts
        );
        assert_eq!(with_reactor(|r| (r.slots(), r.timers())), (0, 0));
    }

    #[test]
    fn a_timeout_around_a_call_that_replies_in_time_is_its_reply() {
        let call = Call::<i64>::single(1);
        let mut script = Script::waiting([vec![single(1, codec::encode(&9i64).unwrap())]]);
        let result = block_on_with(&mut script, crate::timeout(Duration::from_secs(60), call));
        assert_eq!(result, Ok(Ok(9)));
        assert_eq!(with_reactor(|r| (r.slots(), r.timers())), (0, 0));
    }

    #[test]
    fn select_between_a_call_and_a_sleep_takes_whichever_comes_first() {
        let mut script = Script::waiting([vec![], vec![single(1, codec::encode(&3i64).unwrap())]]);
        let winner = block_on_with(&mut script, async {
            let mut call = Call::<i64>::single(1);
            let mut long = crate::sleep(Duration::from_secs(60));
            crate::select! {
                reply = call => format!("call {reply:?}"),
                () = long => "sleep".to_string(),
            }
        });
        assert_eq!(winner, "call Ok(3)");

        let mut script = Script::waiting([]);
        let winner = block_on_with(&mut script, async {
            crate::select! {
                reply = Call::<i64>::single(2) => format!("call {reply:?}"),
                () = crate::sleep(Duration::from_millis(10)) => "sleep".to_string(),
            }
        });
        assert_eq!(winner, "sleep");
        assert_eq!(with_reactor(|r| (r.slots(), r.timers())), (0, 0));
    }

    #[test]
    fn gathered_replies_decode_into_a_value_mesh() {
        let call = Call::<ValueMesh<String>>::gathered(4);
        let values = ["a", "b"].map(|s| codec::encode(&s.to_string()).unwrap());
        let mut script = Script::new([vec![Event {
            id: 4,
            kind: EventKind::Done(Ok(wit::Reply::Gathered(wit::ValueMesh {
                extent: (&extent!(gpus = 2)).into(),
                values: values.to_vec(),
            }))),
        }]]);
        let mesh = block_on_with(&mut script, call).unwrap();
        assert_eq!(mesh.extent(), &extent!(gpus = 2));
        assert_eq!(mesh.values(), ["a", "b"]);
    }
}
