//! Call statistics of actor meshes, process-wide: how many requests a
//! controller made to each actor mesh, how long they took, how many failed,
//! and how many messages went out and came back. `monarch-host serve`
//! samples them every interval (`serve::metrics`) into its time series.
//!
//! The controller's host records a request where its cast completes
//! ([`record_call`]); the sampler takes what accumulated since the last
//! sample ([`take`]). Nothing is recorded until a server [`enable`]s it,
//! so a plain `monarch-host run` pays one atomic load per call.
//!
//! - OB-1: recording takes one short lock, never held across an await or
//!   any I/O, and allocates only for the first call to a mesh in an
//!   interval.
//! - OB-2: a percentile read from a [`Histogram`] is within one bucket of
//!   the true one: at most [`BUCKET_ERROR`] off, relatively, between
//!   1 µs and [`Histogram::MAX_US`].
//! - OB-3: memory is bounded: at most [`MAX_MESHES`] meshes are tracked
//!   between two samples; calls to more are counted in [`dropped`] only.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Buckets per doubling of the latency.
const PER_OCTAVE: f64 = 8.0;

/// How many buckets a histogram has: 8 per doubling from 1 µs to about
/// 16.8 s (2^24 µs); the last one holds everything longer.
const BUCKETS: usize = 24 * PER_OCTAVE as usize + 1;

/// The largest relative error of a percentile (OB-2): half a bucket's
/// width, as a ratio, 2^(1/16) - 1.
pub const BUCKET_ERROR: f64 = 0.045;

/// The most meshes tracked between two samples (OB-3).
pub const MAX_MESHES: usize = 4096;

/// A latency histogram of fixed size: bucket `i` holds latencies up to
/// 2^(i/8) µs.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u32; BUCKETS]>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .finish()
    }
}

impl Histogram {
    /// The longest latency told apart from longer ones, in µs.
    pub const MAX_US: f64 = (1u64 << 24) as f64;

    fn bucket(latency: Duration) -> usize {
        let us = latency.as_secs_f64() * 1e6;
        if us <= 1.0 {
            return 0;
        }
        let at = (us.log2() * PER_OCTAVE).ceil();
        (at as usize).min(BUCKETS - 1)
    }

    /// The upper bound of bucket `i`, in µs.
    fn upper_us(i: usize) -> f64 {
        (i as f64 / PER_OCTAVE).exp2()
    }

    /// Counts one latency.
    pub fn record(&mut self, latency: Duration) {
        let at = Self::bucket(latency);
        self.counts[at] = self.counts[at].saturating_add(1);
        self.total += 1;
    }

    /// How many latencies it holds.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The latency below which a fraction `q` (0 to 1) of those recorded
    /// lie, in milliseconds: the geometric middle of its bucket (OB-2).
    /// None when it holds none.
    pub fn percentile_ms(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        // Less a hair, so that 0.99 of 100 is the 99th, not the 100th.
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64 - 1e-9).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, count) in self.counts.iter().enumerate() {
            seen += u64::from(*count);
            if seen >= rank {
                let upper = Self::upper_us(i);
                let lower = if i == 0 { upper } else { Self::upper_us(i - 1) };
                return Some((lower * upper).sqrt() / 1000.0);
            }
        }
        None
    }
}

/// What the calls to one actor mesh came to since the last [`take`].
#[derive(Debug, Clone, Default)]
pub struct MeshCalls {
    /// The job whose controller made the calls, when known.
    pub job: Option<u64>,
    /// The actor mesh, as its job named it (without the `j<job>.` scope
    /// of a job's mesh on a persistent proc mesh).
    pub mesh: String,
    /// Calls that completed.
    pub calls: u64,
    /// Calls that completed with an error.
    pub errors: u64,
    /// Messages sent: one per rank a call addressed.
    pub msgs_out: u64,
    /// Replies that came back.
    pub msgs_in: u64,
    /// The calls' latencies.
    pub latency: Histogram,
}

#[derive(Default)]
struct Registry {
    meshes: HashMap<Option<u64>, HashMap<String, MeshCalls>>,
    tracked: usize,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// Starts recording calls (a server does, as it starts its sampler).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether calls are recorded.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Calls not recorded because [`MAX_MESHES`] meshes were tracked (OB-3).
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Splits a job's scoped actor mesh name `j<job>.<name>` into the job and
/// the name; a persistent actor mesh's `p.<name>` loses its prefix.
fn unscope(job: Option<u64>, mesh: &str) -> (Option<u64>, &str) {
    if let Some(rest) = mesh.strip_prefix('j')
        && let Some((digits, name)) = rest.split_once('.')
        && let Ok(scoped) = digits.parse::<u64>()
    {
        return (job.or(Some(scoped)), name);
    }
    match mesh.strip_prefix("p.") {
        Some(name) => (job, name),
        None => (job, mesh),
    }
}

/// Records one completed call of the controller of `job` to the actor
/// mesh `mesh`: how long it took, whether it succeeded, and how many
/// messages it sent and got back (OB-1).
pub fn record_call(
    job: Option<u64>,
    mesh: &str,
    latency: Duration,
    ok: bool,
    msgs_out: u64,
    msgs_in: u64,
) {
    if !enabled() {
        return;
    }
    let (job, mesh) = unscope(job, mesh);
    let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let registry = guard.get_or_insert_with(Registry::default);
    let full = registry.tracked >= MAX_MESHES;
    let by_name = registry.meshes.entry(job).or_default();
    let entry = match by_name.get_mut(mesh) {
        Some(entry) => entry,
        None if full => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        None => {
            registry.tracked += 1;
            by_name
                .entry(mesh.to_string())
                .or_insert_with(|| MeshCalls {
                    job,
                    mesh: mesh.to_string(),
                    ..MeshCalls::default()
                })
        }
    };
    entry.calls += 1;
    entry.errors += u64::from(!ok);
    entry.msgs_out += msgs_out;
    entry.msgs_in += msgs_in;
    entry.latency.record(latency);
}

/// Takes what was recorded since the last call, and starts afresh.
pub fn take() -> Vec<MeshCalls> {
    let taken = REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    taken
        .meshes
        .into_values()
        .flat_map(HashMap::into_values)
        .collect()
}

/// A request in flight, as the host remembers it for [`record_call`]:
/// when it was sent and to how many ranks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Started {
    /// None while nothing records calls: no clock read per call then.
    at: Option<Instant>,
    ranks: u64,
}

impl Started {
    /// A request sent now to `ranks` ranks.
    pub(crate) fn now(ranks: usize) -> Started {
        Started {
            at: enabled().then(Instant::now),
            ranks: ranks as u64,
        }
    }

    /// Records the end of this request of `cluster`'s controller to the
    /// actor mesh `mesh`: every rank replied when `ok`.
    pub(crate) fn done(&self, cluster: &crate::host::Cluster, mesh: &str, ok: bool) {
        let Some(at) = self.at.filter(|_| enabled()) else {
            return;
        };
        let job = cluster.job.observer.as_ref().and_then(|o| o.job());
        let replies = if ok { self.ranks } else { 0 };
        record_call(job, mesh, at.elapsed(), ok, self.ranks, replies);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ob_2_percentiles_are_within_a_bucket_of_the_true_ones() {
        let mut histogram = Histogram::default();
        assert_eq!(histogram.percentile_ms(0.5), None);
        // 1..=1000 ms: p50 is 500 ms, p99 990 ms.
        for ms in 1..=1000u64 {
            histogram.record(Duration::from_millis(ms));
        }
        assert_eq!(histogram.count(), 1000);
        let close = |got: f64, want: f64| (got - want).abs() / want <= BUCKET_ERROR + 1e-9;
        let p50 = histogram.percentile_ms(0.5).unwrap();
        let p99 = histogram.percentile_ms(0.99).unwrap();
        assert!(close(p50, 500.0), "p50 {p50}");
        assert!(close(p99, 990.0), "p99 {p99}");
        // One slow call among fast ones moves p99 only when it is 1 % of them.
        let mut skewed = Histogram::default();
        for _ in 0..99 {
            skewed.record(Duration::from_micros(400));
        }
        skewed.record(Duration::from_secs(2));
        assert!(close(skewed.percentile_ms(0.5).unwrap(), 0.4));
        assert!(close(skewed.percentile_ms(0.99).unwrap(), 0.4));
        assert!(close(skewed.percentile_ms(1.0).unwrap(), 2000.0));
        // Beyond the last bucket: counted, not lost.
        skewed.record(Duration::from_secs(3600));
        assert_eq!(skewed.count(), 101);
        assert!(skewed.percentile_ms(1.0).unwrap() >= Histogram::MAX_US / 1000.0 * 0.9);
    }

    #[test]
    fn scoped_names_give_their_job() {
        assert_eq!(unscope(None, "j7.echoers"), (Some(7), "echoers"));
        assert_eq!(unscope(Some(3), "echoers"), (Some(3), "echoers"));
        assert_eq!(unscope(None, "p.counter"), (None, "counter"));
        assert_eq!(unscope(None, "jobs.x"), (None, "jobs.x"));
    }

    #[test]
    fn ob_1_ob_3_calls_accumulate_until_taken_and_meshes_are_bounded() {
        // The registry is process-wide: this is the only test that uses it.
        enable();
        take();
        record_call(Some(1), "a", Duration::from_millis(2), true, 2, 2);
        record_call(None, "j1.a", Duration::from_millis(4), false, 2, 0);
        record_call(Some(2), "a", Duration::from_millis(1), true, 1, 1);
        let mut taken = take();
        taken.sort_by_key(|m| m.job);
        assert_eq!(taken.len(), 2);
        let a = &taken[0];
        assert_eq!((a.job, a.mesh.as_str()), (Some(1), "a"));
        assert_eq!((a.calls, a.errors, a.msgs_out, a.msgs_in), (2, 1, 4, 2));
        assert!(take().is_empty(), "taken once");
        for n in 0..MAX_MESHES + 10 {
            record_call(None, &format!("m{n}"), Duration::ZERO, true, 1, 1);
        }
        assert_eq!(take().len(), MAX_MESHES);
        assert!(dropped() >= 10);
    }
}
