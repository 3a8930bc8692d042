//! Deterministic simulation of the network between procs: while a
//! [`Simulation`] is installed, every message that leaves a proc for
//! another is delivered after a latency drawn from the simulation's seed,
//! on the runtime's clock (paused and advanced by tokio, a virtual clock,
//! when the simulation runs on a runtime built with `start_paused`).
//!
//! - SIM-1: a message's latency depends only on the seed, its sender
//!   actor, its destination proc and how many messages that sender sent
//!   to that proc before it, never on which task happened to run first;
//!   so one seed gives one interleaving of deliveries, and another seed
//!   another.
//! - SIM-2: messages from one sender actor to one proc are delivered in
//!   the order they were sent (PR-1 holds under simulation).
//! - SIM-3: every delivery is written to the trace (virtual time, sender,
//!   destination, message type), which [`Simulation::trace`] returns; two
//!   runs of the same program with the same seed give the same trace.
//!
//! The simulation belongs to the thread that installed it, whose
//! current-thread runtime runs every proc it simulates; procs on other
//! threads are left alone, and [`Simulation::install`] refuses a second
//! one on the same thread while the first lives.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::channel::ChannelAddr;
use crate::failure::DeliveryFailure;
use crate::id::{ActorId, PortId};
use crate::impair::Held;
use crate::proc::{Proc, ProcInner};

thread_local! {
    /// The simulation of the runtime on this thread: a simulation runs on
    /// a current-thread runtime, so every task it simulates runs here, and
    /// other threads' procs (other tests, other runtimes) are left alone.
    static CURRENT: std::cell::RefCell<Option<Arc<Simulation>>> =
        const { std::cell::RefCell::new(None) };
    static ACTIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The shortest and longest latency of a simulated message.
const MIN_LATENCY: Duration = Duration::from_micros(20);
const MAX_LATENCY: Duration = Duration::from_millis(2);

/// A seeded network; see the module docs.
pub struct Simulation {
    seed: u64,
    start: Instant,
    inner: Mutex<State>,
    wake: Notify,
    stopped: AtomicBool,
}

/// Orders deliveries: by due time, then by sender, destination and the
/// sender's count, so that the order never depends on which task posted
/// first (SIM-1).
type Key = (Instant, String, String, u64);

struct Pending {
    proc: Weak<ProcInner>,
    from: ChannelAddr,
    to: ChannelAddr,
    latency: Duration,
    /// Fails instead of delivering (held past the delivery timeout).
    failure: Option<DeliveryFailure>,
    label: String,
    held: Held,
}

#[derive(Default)]
struct State {
    /// Per sender actor and destination proc: messages sent, and when the
    /// last one is due (SIM-2).
    links: HashMap<(String, String), (u64, Instant)>,
    pending: BTreeMap<Key, Pending>,
    trace: Vec<String>,
}

/// Uninstalls the simulation when dropped.
pub struct SimulationGuard(Arc<Simulation>);

impl SimulationGuard {
    /// The simulation.
    pub fn simulation(&self) -> &Arc<Simulation> {
        &self.0
    }
}

impl Drop for SimulationGuard {
    fn drop(&mut self) {
        self.0.stopped.store(true, Ordering::SeqCst);
        self.0.wake.notify_one();
        let _ = CURRENT.try_with(|current| {
            let mut current = current.borrow_mut();
            if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.0)) {
                *current = None;
                ACTIVE.set(false);
            }
        });
    }
}

/// splitmix64: a well-mixed 64-bit hash step.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash_str(mut h: u64, text: &str) -> u64 {
    for chunk in text.as_bytes().chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h = mix(h ^ u64::from_le_bytes(word));
    }
    mix(h ^ text.len() as u64)
}

/// How an actor is named in the trace: proc name, actor and rank, with
/// no address (addresses hold OS process ids).
pub(crate) fn actor_label(actor: &ActorId) -> String {
    format!(
        "{}/{}[{}]",
        actor.proc_id().name(),
        actor.name(),
        actor.rank()
    )
}

impl Simulation {
    /// Installs a simulation seeded with `seed` for the messages posted
    /// on this thread, which must run a current-thread runtime; it uses
    /// that runtime's clock (build it with `start_paused` for a virtual
    /// clock). Errors outside a runtime, or if one is installed on this
    /// thread already.
    pub fn install(seed: u64) -> Result<SimulationGuard, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "a simulation needs a tokio runtime".to_string())?;
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread {
            return Err("a simulation needs a current-thread runtime".into());
        }
        if ACTIVE.get() {
            return Err("a simulation is running on this thread already".into());
        }
        let simulation = Arc::new(Simulation {
            seed,
            start: Instant::now(),
            inner: Mutex::default(),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
        });
        CURRENT.with(|current| *current.borrow_mut() = Some(simulation.clone()));
        ACTIVE.set(true);
        runtime.spawn(drive(Arc::downgrade(&simulation)));
        Ok(SimulationGuard(simulation))
    }

    /// The simulation installed on this thread, if any.
    pub(crate) fn current() -> Option<Arc<Simulation>> {
        if !Self::active() {
            return None;
        }
        CURRENT
            .try_with(|current| current.borrow().clone())
            .ok()
            .flatten()
    }

    /// Whether a simulation is installed on this thread (one
    /// thread-local read).
    pub fn active() -> bool {
        ACTIVE.try_with(|active| active.get()).unwrap_or(false)
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Schedules `held`, a message from `sender` (in `proc`) to `dest`,
    /// for delivery after its seeded latency (SIM-1, SIM-2), and no
    /// earlier than `not_before` (an impairment of the sending proc); one
    /// that would wait past the proc's delivery timeout fails then
    /// instead.
    pub(crate) fn schedule(
        &self,
        proc: &Arc<ProcInner>,
        sender: &ActorId,
        dest: &PortId,
        message_type: &str,
        not_before: Option<Instant>,
        held: Held,
    ) {
        let timeout = proc.config_ref().delivery_timeout;
        let now = Instant::now();
        let from_label = actor_label(sender);
        let to_proc = dest.actor_id().proc_id();
        let key = (from_label.clone(), to_proc.name().to_string());
        let mut state = self.inner.lock();
        let (sent, last) = state.links.entry(key).or_insert((0, now));
        let h = mix(hash_str(hash_str(mix(self.seed), &from_label), to_proc.name()) ^ mix(*sent));
        let seq = *sent;
        *sent += 1;
        let span = (MAX_LATENCY - MIN_LATENCY).as_nanos() as u64;
        let latency = MIN_LATENCY + Duration::from_nanos(h % span);
        let mut due = (now + latency).max(*last + Duration::from_nanos(1));
        if let Some(floor) = not_before {
            due = due.max(floor);
        }
        let mut failure = None;
        if due > now + timeout {
            due = now + timeout;
            failure = Some(DeliveryFailure::Unreachable {
                addr: to_proc.addr().to_string(),
                timeout_ms: timeout.as_millis() as u64,
                detail:
                    "the network to it was down (a fault made on purpose) past the delivery timeout"
                        .into(),
            });
        } else {
            *last = due;
        }
        let label = format!(
            "{from_label} -> {}:{}  {message_type}",
            actor_label(dest.actor_id()),
            dest.index()
        );
        let pending = Pending {
            proc: Arc::downgrade(proc),
            from: proc.proc_id().addr().clone(),
            to: to_proc.addr().clone(),
            latency,
            failure,
            label,
            held,
        };
        state
            .pending
            .insert((due, from_label, to_proc.name().to_string(), seq), pending);
        drop(state);
        self.wake.notify_one();
    }

    /// Brings forward what `from` holds for `to` (every peer: None) past
    /// a cut that a heal ended: each goes after its own latency from now.
    pub(crate) fn heal(&self, from: &ChannelAddr, to: Option<&ChannelAddr>) {
        let now = Instant::now();
        let mut state = self.inner.lock();
        let keys: Vec<Key> = state
            .pending
            .iter()
            .filter(|(key, p)| {
                &p.from == from && to.is_none_or(|to| &p.to == to) && key.0 > now + p.latency
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in keys {
            if let Some(mut pending) = state.pending.remove(&key) {
                pending.failure = None;
                let (_, from_label, to_name, seq) = key;
                state
                    .pending
                    .insert((now + pending.latency, from_label, to_name, seq), pending);
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Every delivery so far, in order (SIM-3).
    pub fn trace(&self) -> Vec<String> {
        self.inner.lock().trace.clone()
    }

    /// A number from the seed and `salt`, the same every run: for other
    /// seeded choices of the simulation (a guest's random bytes).
    pub fn seeded(&self, salt: u64) -> u64 {
        mix(mix(self.seed) ^ mix(salt))
    }
}

/// With a simulation installed on this thread: a number from its seed and
/// `salt` (a hash of `name`), the same every run; None otherwise. For the
/// embedding's own seeded choices, such as a guest's random bytes.
pub fn seeded(name: &str) -> Option<u64> {
    Simulation::current().map(|sim| sim.seeded(hash_str(0, name)))
}

/// A generator of the simulation's numbers from a seed ([`seeded`]):
/// splitmix64, the same sequence every run.
#[derive(Debug, Clone)]
pub struct SeededNumbers(u64);

impl SeededNumbers {
    /// Numbers from `seed`.
    pub fn new(seed: u64) -> SeededNumbers {
        SeededNumbers(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Fills `bytes`.
    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Delivers what is due, in key order, one at a time (SIM-1..3).
async fn drive(simulation: Weak<Simulation>) {
    loop {
        let Some(sim) = simulation.upgrade() else {
            return;
        };
        if sim.stopped.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let next = {
            let mut state = sim.inner.lock();
            match state.pending.first_key_value() {
                Some((key, _)) if key.0 <= now => state.pending.pop_first(),
                _ => None,
            }
        };
        if let Some((key, pending)) = next {
            let at = key.0.saturating_duration_since(sim.start);
            let line = format!(
                "{:>12.6} ms  {}{}",
                at.as_nanos() as f64 / 1e6,
                pending.label,
                if pending.failure.is_some() {
                    "  (undeliverable)"
                } else {
                    ""
                }
            );
            sim.inner.lock().trace.push(line);
            if let Some(proc) = pending.proc.upgrade() {
                (pending.held)(&Proc::from_inner(proc), pending.failure);
            }
            // Let what it woke run before the next delivery of this
            // instant, so each delivery's effects follow it in order.
            tokio::task::yield_now().await;
            continue;
        }
        let due = sim.inner.lock().pending.first_key_value().map(|(k, _)| k.0);
        match due {
            Some(due) => {
                tokio::select! {
                    biased;
                    _ = sim.wake.notified() => {}
                    _ = tokio::time::sleep_until(due) => {}
                }
            }
            None => sim.wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{EchoActor, Numbered, StreamReport};

    #[test]
    fn sim1_the_mix_spreads_nearby_inputs() {
        let a = mix(1);
        let b = mix(2);
        assert_ne!(a, b);
        assert!((a ^ b).count_ones() > 16, "{a:x} {b:x}");
        assert_ne!(hash_str(0, "proc0"), hash_str(0, "proc1"));
    }

    /// Three procs; a's client and b's client each send a numbered stream
    /// to the echo actors of the others, then ask what arrived. The
    /// trace, and how many arrived out of order.
    async fn scenario(seed: u64) -> (Vec<String>, u64) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let guard = Simulation::install(seed).unwrap();
        let n = N.fetch_add(1, Ordering::Relaxed);
        let mut procs = Vec::new();
        for name in ["a", "b", "c"] {
            let addr = format!("local:sim-{name}-{n}").parse().unwrap();
            procs.push(Proc::serve(name, addr).await.unwrap());
        }
        let echo_b = procs[1]
            .spawn("echo", 0, EchoActor::default())
            .unwrap()
            .bind();
        let echo_c = procs[2]
            .spawn("echo", 0, EchoActor::default())
            .unwrap()
            .bind();
        let (client_a, _) = procs[0].attach("client").unwrap();
        let (client_b, _) = procs[1].attach("client").unwrap();
        for seq in 0..20 {
            echo_b.send(&client_a, Numbered { stream: 1, seq });
            echo_c.send(&client_a, Numbered { stream: 1, seq });
            echo_c.send(&client_b, Numbered { stream: 2, seq });
        }
        let mut out_of_order = 0;
        for (echo, stream) in [(&echo_b, 1), (&echo_c, 1), (&echo_c, 2)] {
            let stats = echo
                .call(&client_a, |reply| StreamReport { stream, reply })
                .await
                .unwrap();
            assert_eq!(stats.received, 20);
            out_of_order += stats.out_of_order;
        }
        let trace = guard.simulation().trace();
        (trace, out_of_order)
    }

    /// SIM-1..3: one seed, one trace, byte for byte; another seed, another
    /// interleaving; per-sender order kept under every seed.
    #[tokio::test(start_paused = true)]
    async fn sim3_the_same_seed_gives_the_same_trace_and_another_seed_another() {
        let (first, disorder) = scenario(7).await;
        assert_eq!(disorder, 0, "SIM-2");
        assert!(first.len() >= 63, "every delivery traced: {first:#?}");
        assert!(
            first
                .iter()
                .any(|l| l.contains("a/client[0] -> b/echo[0]:")),
            "{first:#?}"
        );
        let (again, _) = scenario(7).await;
        assert_eq!(first, again, "SIM-3");
        let (other, disorder) = scenario(8).await;
        assert_eq!(disorder, 0, "SIM-2");
        assert_ne!(first, other, "SIM-1: another seed, another interleaving");
    }

    #[tokio::test]
    async fn a_second_simulation_on_one_thread_is_refused() {
        let _first = Simulation::install(1).unwrap();
        let refused = Simulation::install(2).err().unwrap();
        assert!(refused.contains("already"), "{refused}");
    }
}
