//! The metrics sampler: every interval (a second by default) it samples
//! each proc of every mesh the server knows (CPU and resident memory of its
//! OS process) and the calls jobs' controllers made to their actor meshes
//! (from [`crate::observe`]), keeps the samples in a ring in memory and in
//! the database, and hands each to the subscribers of
//! `GET /v1/metrics/stream`. `GET /v1/metrics/series` reads them back as
//! time series.
//!
//! A proc's Wasm memory (`wasm_bytes`) is null: the procs are other OS
//! processes, which do not report their instances' memories to the server.
//!
//! - MT-1: the ring holds at most [`RING_SPAN`] of samples; the database
//!   the last [`KEEP`] only: older samples are deleted as each is written.
//! - MT-2: a proc's `cpu_pct` is its OS process's user and system time
//!   (`/proc/PID/stat`) over the interval, in percent of one core; null in
//!   its first sample, which has nothing to compare with.
//! - MT-3: a principal that is not an admin sees the procs of the meshes it
//!   may use and the actor meshes of its own jobs only (HA-1).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::State;
use super::api::{
    ActorMeshPoint, ActorMeshSeries, JobInfo, JobSummary, MetricsSeries, ProcPoint, ProcSeries,
};
use super::db::now_ms;
use super::handlers::Caller;

/// How far back the ring in memory reaches (MT-1).
pub(crate) const RING_SPAN: Duration = Duration::from_secs(600);

/// How far back the database keeps samples (MT-1).
pub(crate) const KEEP: Duration = Duration::from_secs(3600);

/// How long an actor mesh of a running job that is no longer called keeps
/// getting points (of zero calls).
const IDLE_MESH: Duration = Duration::from_secs(60);

/// The most jobs a series or a sample lists.
const MAX_JOBS: usize = 1000;

/// Who may see a series (MT-3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Visible {
    /// Every principal: the server's own persistent meshes.
    All,
    /// This principal (and admins).
    Owner(String),
    /// Admins only: calls whose job is not known.
    Admin,
}

impl Visible {
    fn to(&self, caller: &Caller) -> bool {
        match self {
            Visible::All => true,
            Visible::Owner(owner) => caller.may_see(Some(owner)),
            Visible::Admin => caller.0.is_admin(),
        }
    }
}

/// One proc at one sample.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ProcSample {
    mesh: String,
    rank: u32,
    proc: String,
    pid: Option<u32>,
    job: Option<u64>,
    visible: Visible,
    cpu_pct: Option<f64>,
    rss_bytes: Option<u64>,
}

/// The calls to one actor mesh over one interval.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MeshSample {
    job: Option<u64>,
    mesh: String,
    visible: Visible,
    calls_per_s: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    errors: u64,
    msgs_in: u64,
    msgs_out: u64,
}

/// Everything sampled at one time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Sample {
    /// When (ms since the epoch).
    t: i64,
    procs: Vec<ProcSample>,
    meshes: Vec<MeshSample>,
}

/// The samples in memory, and the subscribers to new ones.
pub(crate) struct Metrics {
    interval: Duration,
    ring: Mutex<VecDeque<Arc<Sample>>>,
    capacity: usize,
    /// None once stopped: streams end.
    sender: Mutex<Option<broadcast::Sender<Arc<Sample>>>>,
}

impl Metrics {
    /// Samples every `interval` (at least 10 ms), keeping [`RING_SPAN`] of
    /// them in memory.
    pub(crate) fn new(interval: Duration) -> Metrics {
        let interval = interval.max(Duration::from_millis(10));
        let capacity = (RING_SPAN.as_millis() / interval.as_millis()).max(1) as usize;
        let (sender, _) = broadcast::channel(16);
        Metrics {
            interval,
            ring: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
            sender: Mutex::new(Some(sender)),
        }
    }

    /// How often it samples.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<Arc<Sample>>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a sample to the ring, dropping the oldest past its capacity
    /// (MT-1), and hands it to the subscribers.
    fn push(&self, sample: Arc<Sample>) {
        {
            let mut ring = self.ring();
            ring.push_back(sample.clone());
            while ring.len() > self.capacity {
                ring.pop_front();
            }
        }
        if let Some(sender) = &*self.sender.lock().unwrap_or_else(|p| p.into_inner()) {
            let _ = sender.send(sample);
        }
    }

    /// The newest sample.
    pub(crate) fn latest(&self) -> Option<Arc<Sample>> {
        self.ring().back().cloned()
    }

    /// New samples as they are taken; None once stopped.
    pub(crate) fn subscribe(&self) -> Option<broadcast::Receiver<Arc<Sample>>> {
        self.sender
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(broadcast::Sender::subscribe)
    }

    /// Stops sampling; the streams end.
    pub(crate) fn stop(&self) {
        self.sender.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn stopped(&self) -> bool {
        self.sender
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }
}

/// Starts the sampler of `state`, which runs until [`Metrics::stop`] or
/// the server's state is gone.
pub(crate) fn start(state: &Arc<State>) {
    crate::observe::enable();
    let weak: Weak<State> = Arc::downgrade(state);
    let interval = state.metrics.interval();
    tokio::spawn(async move {
        let mut sampler = Sampler::default();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Some(state) = weak.upgrade() else { break };
            if state.metrics.stopped() {
                break;
            }
            let sample = Arc::new(sampler.sample(&state));
            let keep_from = sample.t - KEEP.as_millis() as i64;
            match serde_json::to_string(&*sample) {
                Ok(json) => {
                    if let Err(e) = state.db.insert_metric_sample(sample.t, &json, keep_from) {
                        tracing::warn!(error = %e, "cannot record a metrics sample");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot encode a metrics sample"),
            }
            state.metrics.push(sample);
        }
    });
}

/// What the sampler remembers between samples.
#[derive(Default)]
struct Sampler {
    /// Each OS process's CPU time (clock ticks) at the last sample.
    cpu: HashMap<u32, (u64, Instant)>,
    /// When the last sample was taken.
    last: Option<Instant>,
    /// Actor meshes of running jobs called lately, for zero points.
    recent: HashMap<(Option<u64>, String), (Visible, Instant)>,
}

impl Sampler {
    fn sample(&mut self, state: &State) -> Sample {
        let now = Instant::now();
        let elapsed = self
            .last
            .replace(now)
            .map_or(state.metrics.interval, |last| now - last)
            .as_secs_f64()
            .max(1e-3);
        let live: HashMap<u64, String> = state
            .live()
            .iter()
            .map(|(id, job)| (*id, job.owner.clone()))
            .collect();
        let mut procs = Vec::new();
        let persistent: Vec<_> = state
            .persistent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for mesh in persistent {
            let visible = match &mesh.owner {
                None => Visible::All,
                Some(owner) => Visible::Owner(owner.clone()),
            };
            for (rank, (proc, pid)) in mesh.view.procs_and_pids().into_iter().enumerate() {
                procs.push(self.proc(mesh.view.name(), rank, &proc, pid, None, &visible, now));
            }
        }
        let fresh: Vec<_> = state
            .fresh
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(job, view)| (*job, view.clone()))
            .collect();
        for (job, view) in fresh {
            let visible = live
                .get(&job)
                .map_or(Visible::Admin, |owner| Visible::Owner(owner.clone()));
            let client = state
                .live()
                .get(&job)
                .and_then(|live| live.run.cluster())
                .and_then(|cluster| cluster.client().ok().cloned());
            for (rank, (proc, pid)) in view.procs_and_pids().into_iter().enumerate() {
                let pid = pid.or_else(|| client.as_ref()?.proc_info(&proc)?.pid);
                procs.push(self.proc(view.name(), rank, &proc, pid, Some(job), &visible, now));
            }
        }
        // Processes gone since are forgotten.
        let seen: std::collections::HashSet<u32> = procs.iter().filter_map(|p| p.pid).collect();
        self.cpu.retain(|pid, _| seen.contains(pid));

        let mut meshes = Vec::new();
        for calls in crate::observe::take() {
            let visible = match calls.job {
                Some(job) => match live.get(&job) {
                    Some(owner) => Visible::Owner(owner.clone()),
                    None => state.owner_of(job).map_or(Visible::Admin, Visible::Owner),
                },
                None => Visible::Admin,
            };
            self.recent
                .insert((calls.job, calls.mesh.clone()), (visible.clone(), now));
            meshes.push(MeshSample {
                job: calls.job,
                mesh: calls.mesh,
                visible,
                calls_per_s: calls.calls as f64 / elapsed,
                p50_ms: calls.latency.percentile_ms(0.5),
                p99_ms: calls.latency.percentile_ms(0.99),
                errors: calls.errors,
                msgs_in: calls.msgs_in,
                msgs_out: calls.msgs_out,
            });
        }
        // Meshes of running jobs not called in this interval: zero points.
        self.recent.retain(|(job, _), (_, at)| {
            now.duration_since(*at) < IDLE_MESH && job.is_none_or(|job| live.contains_key(&job))
        });
        for ((job, mesh), (visible, _)) in &self.recent {
            if meshes.iter().any(|m| m.job == *job && m.mesh == *mesh) {
                continue;
            }
            meshes.push(MeshSample {
                job: *job,
                mesh: mesh.clone(),
                visible: visible.clone(),
                calls_per_s: 0.0,
                p50_ms: None,
                p99_ms: None,
                errors: 0,
                msgs_in: 0,
                msgs_out: 0,
            });
        }
        Sample {
            t: now_ms(),
            procs,
            meshes,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn proc(
        &mut self,
        mesh: &str,
        rank: usize,
        proc: &hyperactor::ProcId,
        pid: Option<u32>,
        job: Option<u64>,
        visible: &Visible,
        now: Instant,
    ) -> ProcSample {
        let (mut cpu_pct, mut rss_bytes) = (None, None);
        if let Some(pid) = pid {
            if let Some(ticks) = cpu_ticks(pid)
                && let Some((before, at)) = self.cpu.insert(pid, (ticks, now))
            {
                let seconds = now.duration_since(at).as_secs_f64();
                cpu_pct = cpu_percent(before, ticks, seconds, clock_ticks_per_second());
            }
            rss_bytes = rss(pid);
        }
        ProcSample {
            mesh: mesh.to_string(),
            rank: rank as u32,
            proc: proc.to_string(),
            pid,
            job,
            visible: visible.clone(),
            cpu_pct,
            rss_bytes,
        }
    }
}

/// The CPU time of process `pid` so far (user and system), in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

/// utime + stime of a `/proc/PID/stat` line: fields 14 and 15, counted
/// after the command name, which may hold spaces and parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Percent of one core between two readings `seconds` apart (MT-2).
fn cpu_percent(before: u64, after: u64, seconds: f64, ticks_per_second: f64) -> Option<f64> {
    if seconds <= 0.0 || after < before {
        return None;
    }
    Some((after - before) as f64 / ticks_per_second / seconds * 100.0)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no
    // preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// The resident memory of process `pid`, in bytes (`/proc/PID/statm`).
fn rss(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * if page > 0 { page as u64 } else { 4096 })
}

/// A Prometheus label value, escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The newest sample in the Prometheus text format: the gauges
/// `monarch_proc_cpu_percent`, `monarch_proc_resident_bytes`,
/// `monarch_actor_mesh_calls_per_second` and
/// `monarch_actor_mesh_latency_p99_ms`.
pub(crate) fn prometheus(sample: &Sample) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, values: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, value) in values {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let proc_labels = |p: &ProcSample| format!("mesh=\"{}\",rank=\"{}\"", label(&p.mesh), p.rank);
    let mesh_labels = |m: &MeshSample| {
        let job = m.job.map(|j| j.to_string()).unwrap_or_default();
        format!("job=\"{job}\",mesh=\"{}\"", label(&m.mesh))
    };
    gauge(
        "monarch_proc_cpu_percent",
        "CPU of each proc over the last sample interval, in percent of one core.",
        sample
            .procs
            .iter()
            .filter_map(|p| Some((proc_labels(p), p.cpu_pct?)))
            .collect(),
    );
    gauge(
        "monarch_proc_resident_bytes",
        "Resident memory of each proc's OS process.",
        sample
            .procs
            .iter()
            .filter_map(|p| Some((proc_labels(p), p.rss_bytes? as f64)))
            .collect(),
    );
    gauge(
        "monarch_actor_mesh_calls_per_second",
        "Calls of jobs' controllers to each actor mesh over the last sample interval.",
        sample
            .meshes
            .iter()
            .map(|m| (mesh_labels(m), m.calls_per_s))
            .collect(),
    );
    gauge(
        "monarch_actor_mesh_latency_p99_ms",
        "The 99th percentile latency of those calls, in ms.",
        sample
            .meshes
            .iter()
            .filter_map(|m| Some((mesh_labels(m), m.p99_ms?)))
            .collect(),
    );
    out
}

/// What `GET /v1/metrics/series` and `/stream` select.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Query {
    /// From when (ms since the epoch); default 10 minutes ago.
    pub(crate) since_ms: Option<i64>,
    /// Only this job's procs, actor meshes and status.
    pub(crate) job: Option<u64>,
    /// Only the procs of this mesh and the actor meshes of this name.
    pub(crate) mesh: Option<String>,
}

impl Query {
    /// Reads a query string; a bad or unknown parameter is an error that
    /// says which (`token`, which the dashboard may send, is ignored).
    pub(crate) fn parse(query: Option<&str>) -> Result<Query, String> {
        let mut parsed = Query::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)
                .ok_or_else(|| format!("the value of `{}` is not UTF-8", key.escape_debug()))?;
            match key {
                "since_ms" => {
                    parsed.since_ms = Some(value.parse::<i64>().map_err(|_| {
                        format!(
                            "since_ms `{}` is not a time in ms since the Unix epoch",
                            value.escape_debug()
                        )
                    })?)
                }
                "job" => {
                    parsed.job =
                        Some(value.parse::<u64>().map_err(|_| {
                            format!("job `{}` is not a job id", value.escape_debug())
                        })?)
                }
                "mesh" => {
                    if value.is_empty() || value.len() > 256 {
                        return Err("mesh must name a mesh (1 to 256 bytes)".into());
                    }
                    parsed.mesh = Some(value)
                }
                "token" => {}
                other => {
                    return Err(format!(
                        "unknown parameter `{}`; use since_ms, job and mesh",
                        other.escape_debug()
                    ));
                }
            }
        }
        Ok(parsed)
    }
}

/// `%XX` and `+` decoded; None when the result is not UTF-8 or an escape
/// is cut off.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                at += 3;
            }
            b'+' => {
                out.push(b' ');
                at += 1;
            }
            b => {
                out.push(b);
                at += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Groups `samples` (oldest first) into the series `caller` may see and
/// `query` selects (MT-3).
fn series_of<'a>(
    samples: impl Iterator<Item = &'a Sample>,
    caller: &Caller,
    query: &Query,
) -> (Vec<ProcSeries>, Vec<ActorMeshSeries>) {
    let mut procs: BTreeMap<(String, u32, String), ProcSeries> = BTreeMap::new();
    let mut meshes: BTreeMap<(Option<u64>, String), ActorMeshSeries> = BTreeMap::new();
    let wanted = |job: Option<u64>, mesh: &str| {
        query.job.is_none_or(|j| job == Some(j)) && query.mesh.as_deref().is_none_or(|m| m == mesh)
    };
    for sample in samples {
        for p in &sample.procs {
            if !p.visible.to(caller) || !wanted(p.job, &p.mesh) {
                continue;
            }
            procs
                .entry((p.mesh.clone(), p.rank, p.proc.clone()))
                .or_insert_with(|| ProcSeries {
                    mesh: p.mesh.clone(),
                    rank: p.rank,
                    proc: p.proc.clone(),
                    pid: p.pid,
                    job: p.job,
                    points: Vec::new(),
                })
                .points
                .push(ProcPoint {
                    t: sample.t,
                    cpu_pct: p.cpu_pct,
                    rss_bytes: p.rss_bytes,
                    wasm_bytes: None,
                });
        }
        for m in &sample.meshes {
            if !m.visible.to(caller) || !wanted(m.job, &m.mesh) {
                continue;
            }
            meshes
                .entry((m.job, m.mesh.clone()))
                .or_insert_with(|| ActorMeshSeries {
                    job: m.job,
                    mesh: m.mesh.clone(),
                    points: Vec::new(),
                })
                .points
                .push(ActorMeshPoint {
                    t: sample.t,
                    calls_per_s: m.calls_per_s,
                    p50_ms: m.p50_ms,
                    p99_ms: m.p99_ms,
                    errors: m.errors,
                    msgs_in: m.msgs_in,
                    msgs_out: m.msgs_out,
                });
        }
    }
    (
        procs.into_values().collect(),
        meshes.into_values().collect(),
    )
}

fn summary(job: JobInfo) -> JobSummary {
    JobSummary {
        id: job.id,
        status: job.status,
        created_at_ms: job.created_at_ms,
        started_at_ms: job.started_at_ms,
        ended_at_ms: job.finished_at_ms,
        duration_ms: job.duration_ms,
    }
}

/// The jobs that had not ended by `since`, that `caller` may see.
fn jobs_since(
    state: &State,
    caller: &Caller,
    since: i64,
    query: &Query,
) -> Result<Vec<JobSummary>, String> {
    Ok(state
        .db
        .jobs_since(since, MAX_JOBS, caller.filter())?
        .into_iter()
        .filter(|job| query.job.is_none_or(|id| id == job.id))
        .map(summary)
        .collect())
}

/// `GET /v1/metrics/series`: the samples since `query.since_ms` (from the
/// ring, and from the database for what is older than the ring).
pub(crate) fn series(
    state: &State,
    caller: &Caller,
    query: &Query,
) -> Result<MetricsSeries, String> {
    let now = now_ms();
    let since = query.since_ms.unwrap_or(now - RING_SPAN.as_millis() as i64);
    let ring: Vec<Arc<Sample>> = state
        .metrics
        .ring()
        .iter()
        .filter(|s| s.t >= since)
        .cloned()
        .collect();
    let ring_start = state.metrics.ring().front().map_or(now + 1, |s| s.t);
    let mut older = Vec::new();
    if since < ring_start {
        for (t, json) in state.db.metric_samples(since, ring_start)? {
            match serde_json::from_str::<Sample>(&json) {
                Ok(sample) => older.push(sample),
                Err(e) => tracing::warn!(t, error = %e, "a recorded metrics sample is unreadable"),
            }
        }
    }
    let samples = older.iter().chain(ring.iter().map(|s| &**s));
    let (procs, meshes) = series_of(samples, caller, query);
    Ok(MetricsSeries {
        interval_ms: state.metrics.interval.as_millis() as u64,
        now_ms: now,
        procs,
        meshes,
        jobs: jobs_since(state, caller, since, query)?,
    })
}

/// One sample of `GET /v1/metrics/stream`: `sample` in the shape of the
/// series, each with one point, and the jobs running or ended within the
/// last ten seconds.
pub(crate) fn stream_item(
    state: &State,
    caller: &Caller,
    query: &Query,
    sample: &Sample,
) -> Result<MetricsSeries, String> {
    let (procs, meshes) = series_of(std::iter::once(sample), caller, query);
    Ok(MetricsSeries {
        interval_ms: state.metrics.interval.as_millis() as u64,
        now_ms: sample.t,
        procs,
        meshes,
        jobs: jobs_since(state, caller, sample.t - 10_000, query)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: i64) -> Arc<Sample> {
        Arc::new(Sample {
            t,
            procs: vec![ProcSample {
                mesh: "workers".into(),
                rank: 0,
                proc: "unix:/x,p0".into(),
                pid: Some(1),
                job: None,
                visible: Visible::All,
                cpu_pct: Some(1.0),
                rss_bytes: Some(10),
            }],
            meshes: vec![MeshSample {
                job: Some(7),
                mesh: "echoers".into(),
                visible: Visible::Owner("ann".into()),
                calls_per_s: 2.0,
                p50_ms: Some(0.5),
                p99_ms: Some(1.0),
                errors: 0,
                msgs_in: 2,
                msgs_out: 2,
            }],
        })
    }

    #[test]
    fn mt_1_the_ring_keeps_ten_minutes_of_samples() {
        let metrics = Metrics::new(Duration::from_secs(1));
        assert_eq!(metrics.capacity, 600);
        for t in 0..700 {
            metrics.push(sample(t));
        }
        let ring = metrics.ring();
        assert_eq!(ring.len(), 600);
        assert_eq!(ring.front().map(|s| s.t), Some(100));
        assert_eq!(ring.back().map(|s| s.t), Some(699));
        drop(ring);
        // A faster sampler keeps as many more, for the same span.
        assert_eq!(Metrics::new(Duration::from_millis(100)).capacity, 6000);
    }

    #[test]
    fn mt_1_streams_end_when_the_sampler_stops() {
        let metrics = Metrics::new(Duration::from_secs(1));
        let mut rx = metrics.subscribe().unwrap();
        metrics.push(sample(1));
        assert_eq!(rx.try_recv().unwrap().t, 1);
        metrics.stop();
        assert!(matches!(
            rx.try_recv(),
            Err(broadcast::error::TryRecvError::Closed)
        ));
        assert!(metrics.subscribe().is_none());
    }

    #[test]
    fn mt_2_cpu_is_the_tick_delta_over_the_interval() {
        // The command name may hold spaces and parentheses.
        let stat =
            "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 1000 200";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        assert_eq!(parse_cpu_ticks("garbage"), None);
        assert_eq!(cpu_percent(300, 350, 1.0, 100.0), Some(50.0));
        assert_eq!(cpu_percent(300, 500, 0.5, 100.0), Some(400.0));
        assert_eq!(cpu_percent(300, 200, 1.0, 100.0), None);
        // This process: it has used some CPU, and has memory.
        let me = std::process::id();
        assert!(cpu_ticks(me).is_some());
        assert!(rss(me).unwrap() > 0);
    }

    #[test]
    fn queries_are_checked() {
        assert_eq!(Query::parse(None).unwrap(), Query::default());
        let q = Query::parse(Some("since_ms=5&job=7&mesh=my%20mesh&token=x")).unwrap();
        assert_eq!(q.since_ms, Some(5));
        assert_eq!(q.job, Some(7));
        assert_eq!(q.mesh.as_deref(), Some("my mesh"));
        for bad in ["since_ms=soon", "job=-1", "mesh=", "color=red", "mesh=%zz"] {
            assert!(Query::parse(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn mt_3_a_user_sees_shared_procs_and_its_own_meshes_only() {
        let admin = Caller(Arc::new(crate::serve::principals::Principal::anonymous(
            Default::default(),
        )));
        let bob = Caller(Arc::new(crate::serve::principals::Principal::former("bob")));
        let samples = [sample(1), sample(2)];
        let (procs, meshes) = series_of(samples.iter().map(|s| &**s), &admin, &Query::default());
        assert_eq!(procs.len(), 1);
        assert_eq!(procs[0].points.len(), 2);
        assert_eq!(meshes.len(), 1);
        assert_eq!(meshes[0].points[1].t, 2);
        let (procs, meshes) = series_of(samples.iter().map(|s| &**s), &bob, &Query::default());
        assert_eq!((procs.len(), meshes.len()), (1, 0));
        let only_job = Query {
            job: Some(7),
            ..Query::default()
        };
        let (procs, meshes) = series_of(samples.iter().map(|s| &**s), &admin, &only_job);
        assert_eq!((procs.len(), meshes.len()), (0, 1));
    }
}
