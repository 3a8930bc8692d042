//! The `scale` suite: casts to up to 10,000 Wasm actors over 64 simulated
//! hosts, on one machine.
//!
//! Every simulated host is a host agent (`hyperactor_mesh::remote`, what
//! `monarch-host agent` serves) on a loopback address of its own:
//! 127.0.0.2, 127.0.0.3, ... All the agents run in one child process of
//! this binary (hidden subcommand `scale-agents`, which exits when its
//! stdin closes), and each agent starts its procs as its own child
//! processes (this binary's `bootstrap`), listening on the agent's address.
//! So this process holds nothing but the controller, and the process-wide
//! counters of `hyperactor::channel::process_traffic` count the
//! controller's messages alone.
//!
//! ```text
//! this process: controller (Wasm)        scale-agents: 64 agents         bootstrap x 64
//!   spawn_procs(procs = 64)  ---------->  127.0.0.2 .. 127.0.0.65  ---->  one proc each
//!   spawn_many(actors = k)   -------- multicast tree (fan-out 16) ---->  comm -> k Wasm actors
//!   sum_i64(ping)            <------------- reduced in the tree ------
//! ```
//!
//! The guest program (`host/bench/guest`, mode `scale`) spawns one proc on
//! each agent (procs are placed round-robin over the hosts), then for each
//! size a mesh of `procs x k` actors: it times the spawn up to the first
//! reduced reply, then `reps` cast-and-reduce calls (every actor answers
//! 1; the host sums; the sum is checked) after a warm-up. It logs
//! `MARK <moment> <actors>` at the moments this side samples, from /proc,
//! the procs' resident memory and CPU time, this process's CPU time and
//! the message counters (see [`Sample`]).
//!
//! Heartbeats to the agents are rare in this suite ([`liveness`]), so that
//! they do not land among the counted messages of a cast.
//!
//! The floor is the mesh suite's: a bare Unix socket round trip between
//! two processes, half before the program and half after.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use hyperactor::ChannelAddr;
use hyperactor::channel::{Traffic, process_traffic};
use monarch_host::{Placement, Sandbox};

use crate::guest;
use crate::report::{Unit, emit, log_spread, median, quantile};
use crate::runtime::raw_rtt;
use crate::worker::{Scratch, Worker};

const SUITE: &str = "scale";

/// Actor counts of the full suite; each is rounded up to a multiple of
/// the agents (10,000 over 64 agents is 157 a proc: 10,048 actors).
const FULL_SIZES: [u32; 5] = [64, 256, 1_024, 4_096, 10_000];
/// Actor counts of `--quick`.
const QUICK_SIZES: [u32; 3] = [8, 64, 256];

/// Payload of a floor round trip, as the mesh suite's.
const FLOOR_PAYLOAD: usize = 64;

/// How much a size's messages per cast at the controller may exceed the
/// smallest size's before the suite calls it growth with N: a heartbeat
/// landing among the timed casts adds a few.
const MSGS_GROWTH_SLACK: f64 = 1.5;

/// Arguments of the scale suite.
#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// A smoke test: 8 agents, meshes of 8, 64 and 256 actors, few
    /// repetitions; under a minute. Rough figures.
    #[arg(long)]
    quick: bool,
    /// Simulated hosts: agents on 127.0.0.2, 127.0.0.3, ..., one proc each
    /// (default 64; 8 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    agents: Option<u32>,
    /// Actor counts, comma-separated; each is rounded up to a multiple of
    /// the agents, and the records name the exact count (default
    /// 64,256,1024,4096,10000; 8,64,256 with --quick).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=100_000))]
    sizes: Option<Vec<u32>>,
    /// Timed cast-and-reduce calls at each size (default 100; 8 with
    /// --quick), after a fifth as many untimed ones.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    reps: Option<u32>,
    /// The fan-out of the multicast trees that carry casts.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    fanout: u32,
    /// Threads of this process's runtime, as `monarch-host run --threads`:
    /// 1 (the default) is a current-thread runtime.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// The guest program.
    #[arg(long, default_value = guest::DEFAULT_PROGRAM)]
    program: PathBuf,
}

/// Heartbeats and timeouts of the run: a heartbeat to every agent every
/// 60 s, longer than the whole suite takes on two cores (about a minute),
/// so that at most one round of them (one message to each agent and its
/// answer) lands among the timed casts, and timeouts far above it. The
/// agents' process ends with this one's (its stdin), so the long
/// keepalive leaves no procs behind.
pub fn liveness() -> hyperactor_mesh::remote::Liveness {
    hyperactor_mesh::remote::Liveness {
        heartbeat: Duration::from_secs(60),
        host_timeout: Duration::from_secs(300),
        keepalive: Duration::from_secs(600),
    }
}

/// What the suite will run, from the arguments.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    agents: u32,
    /// Actors per proc at each size.
    per_proc: Vec<u32>,
    reps: u32,
    warmup: u32,
}

impl Plan {
    fn of(args: &ScaleArgs) -> anyhow::Result<Plan> {
        let agents = args.agents.unwrap_or(if args.quick { 8 } else { 64 });
        let sizes = match &args.sizes {
            Some(sizes) => sizes.clone(),
            None if args.quick => QUICK_SIZES.to_vec(),
            None => FULL_SIZES.to_vec(),
        };
        if sizes.is_empty() {
            bail!("--sizes names no size");
        }
        let mut per_proc: Vec<u32> = sizes.iter().map(|n| n.div_ceil(agents)).collect();
        per_proc.sort_unstable();
        per_proc.dedup();
        let reps = args.reps.unwrap_or(if args.quick { 8 } else { 100 });
        Ok(Plan {
            agents,
            per_proc,
            reps,
            warmup: (reps / 5).max(1),
        })
    }

    fn totals(&self) -> Vec<u32> {
        self.per_proc.iter().map(|k| k * self.agents).collect()
    }
}

/// What /proc and the counters said at a moment the guest marked.
#[derive(Debug, Clone)]
struct Sample {
    /// The mark: `procs`, `before`, `spawned`, `casts` or `casted`.
    moment: String,
    /// The actors of the mark's size (0 for `procs`).
    actors: u32,
    /// The procs found (children of the agents' process).
    procs: usize,
    /// Their resident memory, summed, in KiB.
    procs_rss_kib: u64,
    /// Their CPU time (user and system), summed, in seconds.
    procs_cpu_s: f64,
    /// This process's CPU time, in seconds.
    self_cpu_s: f64,
    /// This process's resident memory, in KiB.
    self_rss_kib: u64,
    /// The message counters of this process.
    traffic: Traffic,
    /// When.
    at: Instant,
}

/// Reads what a [`Sample`] holds; `agents_pid` is the agents' process,
/// whose children are the procs.
fn sample(moment: &str, actors: u32, agents_pid: u32) -> Sample {
    let traffic = process_traffic();
    let mut procs = 0;
    let mut procs_rss_kib = 0;
    let mut procs_cpu_s = 0.0;
    for pid in children_of(agents_pid) {
        if let Some((cpu_s, rss)) = usage(&format!("/proc/{pid}")) {
            procs += 1;
            procs_cpu_s += cpu_s;
            procs_rss_kib += rss;
        }
    }
    let (self_cpu_s, self_rss_kib) = usage("/proc/self").unwrap_or_default();
    Sample {
        moment: moment.to_string(),
        actors,
        procs,
        procs_rss_kib,
        procs_cpu_s,
        self_cpu_s,
        self_rss_kib,
        traffic,
        at: Instant::now(),
    }
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parse_ppid(&stat))
                .is_some_and(|ppid| ppid == parent)
        })
        .collect()
}

/// The parent in the text of a `/proc/PID/stat`.
fn parse_ppid(stat: &str) -> Option<u32> {
    // The command name may hold spaces and parentheses: fields start
    // after the last ')', with the state, then the parent.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    fields.get(1)?.parse().ok()
}

/// The resident memory in KiB in the text of a `/proc/PID/status`.
fn parse_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time in seconds (every thread's, from `task/*/schedstat`, in
/// nanoseconds: /proc's `stat` counts in ticks of 10 ms, too coarse for a
/// few casts) and resident KiB of the process at `dir` (`/proc/PID`).
fn usage(dir: &str) -> Option<(f64, u64)> {
    let rss = parse_rss_kib(&std::fs::read_to_string(format!("{dir}/status")).ok()?)?;
    let mut nanos: u64 = 0;
    for task in std::fs::read_dir(format!("{dir}/task")).ok()?.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            // A thread that ended between the listing and the read.
            continue;
        };
        nanos += parse_schedstat(&text).unwrap_or(0);
    }
    Some((nanos as f64 / 1e9, rss))
}

/// The nanoseconds on a CPU in the text of a `/proc/PID/task/TID/schedstat`.
fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// A line `MARK <moment> <actors>` of the guest's log, if it is one.
fn parse_mark(line: &str) -> Option<(&str, u32)> {
    let rest = line.split("MARK ").nth(1)?;
    let mut fields = rest.split_whitespace();
    let moment = fields.next()?;
    let actors = fields.next()?.parse().ok()?;
    Some((moment, actors))
}

/// The samples of a line `SAMPLES <metric> <value> ...`, if it is one.
fn parse_samples(line: &str) -> anyhow::Result<Option<(String, Vec<f64>)>> {
    let Some(rest) = line.split("SAMPLES ").nth(1) else {
        return Ok(None);
    };
    let mut fields = rest.split_whitespace();
    let Some(metric) = fields.next() else {
        bail!("malformed samples line from the guest: {line}");
    };
    let values = fields
        .map(|v| v.parse::<f64>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("malformed samples line from the guest: {line}"))?;
    Ok(Some((metric.to_string(), values)))
}

/// A least-squares line `y = a + b x` and its coefficient of
/// determination.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fit {
    a: f64,
    b: f64,
    r2: f64,
}

/// Fits `y = a + b x` to the points; `None` for fewer than two distinct x.
fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx == 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let a = mean_y - b * mean_x;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - mean_y).powi(2)).sum();
    let ss_res: f64 = points.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let r2 = if ss_tot == 0.0 {
        1.0
    } else {
        1.0 - ss_res / ss_tot
    };
    Some(Fit { a, b, r2 })
}

/// Writes a record whose value may be any finite number (a slope, a
/// difference), unlike [`emit`]'s positive times and rates; same format.
fn emit_value(metric: &str, value: f64, unit: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    anyhow::ensure!(value.is_finite(), "{metric} measured {value} {unit}");
    let rounded = if value.abs() >= 1.0 {
        (value * 100.0).round() / 100.0
    } else {
        (value * 10_000.0).round() / 10_000.0
    };
    let text = |s: &str| serde_json::Value::from(s).to_string();
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{{\"suite\":{},\"metric\":{},\"value\":{},\"unit\":{}}}",
        text(SUITE),
        text(metric),
        serde_json::Value::from(rounded),
        text(unit)
    )?;
    stdout.flush()?;
    Ok(())
}

/// The figures of one size.
#[derive(Debug, Clone)]
struct Row {
    actors: u32,
    spawn_ms: f64,
    cast_us: Vec<f64>,
    median_us: f64,
    sent_per_cast: f64,
    received_per_cast: f64,
    bytes_sent_per_cast: f64,
    bytes_received_per_cast: f64,
    /// The procs' CPU per cast, in microseconds.
    procs_cpu_per_cast_us: f64,
    /// This process's CPU per cast, in microseconds.
    self_cpu_per_cast_us: f64,
    /// The cores the procs and this process kept busy over the timed
    /// casts: CPU time over wall time. Below the machine's cores, other
    /// work had the rest (or the casts left cores idle).
    cores_busy: f64,
    /// Resident growth over the spawn, KiB per actor added.
    rss_per_actor_kib: f64,
    /// The procs' resident memory with the mesh up, MiB.
    procs_rss_mib: f64,
}

/// Runs the suite and writes its records to stdout.
pub async fn run(args: ScaleArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    guest::check_program(&args.program)?;
    let plan = Plan::of(&args)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tracing::info!(
        agents = plan.agents,
        actors = ?plan.totals(),
        reps = plan.reps,
        fanout = args.fanout,
        cores,
        program = %args.program.display(),
        "scale suite"
    );

    let samples = if args.quick { 1_000 } else { 4_000 };
    let scratch = Scratch::new()?;
    let (raw_worker, mut raw, mut floor) = crate::mesh::unix_floor(&scratch, samples).await?;

    let started = Instant::now();
    let agents_worker = Worker::start(
        "scale agents",
        &[
            "scale-agents".to_string(),
            "--count".into(),
            plan.agents.to_string(),
        ],
    )
    .await?;
    let (agents_pid, agents) = parse_agents_ready(agents_worker.ready())?;
    tracing::info!(
        agents = agents.len(),
        first = %agents[0],
        pid = agents_pid,
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "agents up"
    );

    let sandbox = Sandbox {
        placement: Placement::Hosts {
            agents,
            token: String::new(),
            liveness: liveness(),
        },
        fanout: args.fanout,
        max_procs: plan.agents as usize,
        deadline: Duration::from_secs(900),
        call_timeout: Duration::from_secs(120),
        ..Sandbox::default()
    };
    let guest_args = vec![
        "scale".to_string(),
        format!("procs={}", plan.agents),
        format!(
            "sizes={}",
            plan.per_proc
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!("reps={}", plan.reps),
        format!("warmup={}", plan.warmup),
    ];
    let samples_taken: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let watch = {
        let samples_taken = samples_taken.clone();
        move |line: &str| {
            if let Some((moment, actors)) = parse_mark(line) {
                let sample = sample(moment, actors, agents_pid);
                if let Ok(mut taken) = samples_taken.lock() {
                    taken.push(sample);
                }
            }
        }
    };
    let outcome = guest::run_watched(&args.program, &guest_args, sandbox, watch).await;
    let stopped = agents_worker.stop().await;
    let (records, lines) = outcome.context("the scale benchmark program failed")?;
    if let Err(e) = stopped {
        tracing::warn!("{e:#}");
    }
    let taken = samples_taken.lock().map(|s| s.clone()).unwrap_or_default();

    let more;
    (raw, more) = raw_rtt(raw, FLOOR_PAYLOAD, samples / 2).await?;
    floor.extend(more);
    drop(raw);
    raw_worker.stop().await?;

    let mut cast_samples = Vec::new();
    for line in &lines {
        if let Some(found) = parse_samples(line)? {
            cast_samples.push(found);
        }
    }
    let rows = rows(&plan, &records, &cast_samples, &taken)?;

    // Records: per proc, then each size, then the fits, then the floor.
    let spawn_procs = records
        .iter()
        .find(|r| r.metric == "spawn_procs_ms")
        .context("the guest did not report spawn_procs_ms")?;
    emit(SUITE, "spawn_procs_ms", spawn_procs.value, Unit::Millis)?;
    let at_procs = taken
        .iter()
        .find(|s| s.moment == "procs")
        .context("the guest marked no `procs` moment")?;
    anyhow::ensure!(
        at_procs.procs == plan.agents as usize,
        "found {} procs under the agents' process, expected {}",
        at_procs.procs,
        plan.agents
    );
    let per_proc_mib = at_procs.procs_rss_kib as f64 / 1024.0 / at_procs.procs as f64;
    emit(SUITE, "rss_per_proc_mib", per_proc_mib, Unit::MiB)?;
    for row in &rows {
        let n = row.actors;
        emit(
            SUITE,
            &format!("spawn_actors_ms_{n}"),
            row.spawn_ms,
            Unit::Millis,
        )?;
        emit(
            SUITE,
            &format!("cast_reduce_us_{n}"),
            row.median_us,
            Unit::Micros,
        )?;
        let p10 = quantile(&row.cast_us, 0.1).unwrap_or(row.median_us);
        let p90 = quantile(&row.cast_us, 0.9).unwrap_or(row.median_us);
        emit(SUITE, &format!("cast_reduce_p10_us_{n}"), p10, Unit::Micros)?;
        emit(SUITE, &format!("cast_reduce_p90_us_{n}"), p90, Unit::Micros)?;
        emit_value(
            &format!("controller_msgs_sent_per_cast_{n}"),
            row.sent_per_cast,
            "msgs",
        )?;
        emit_value(
            &format!("controller_msgs_received_per_cast_{n}"),
            row.received_per_cast,
            "msgs",
        )?;
        emit_value(
            &format!("cpu_per_cast_per_actor_us_{n}"),
            row.procs_cpu_per_cast_us / f64::from(n),
            "us",
        )?;
        emit_value(
            &format!("controller_cpu_per_cast_us_{n}"),
            row.self_cpu_per_cast_us,
            "us",
        )?;
        emit_value(&format!("cast_cores_busy_{n}"), row.cores_busy, "cores")?;
        emit_value(&format!("cast_residual_us_{n}"), residual(row, cores), "us")?;
        emit_value(
            &format!("rss_per_actor_kib_{n}"),
            row.rss_per_actor_kib,
            "KiB",
        )?;
        log_spread(
            &format!("cast_reduce_us_{n}"),
            &row.cast_us,
            "cast and reduce, us",
        );
    }
    log_table(&rows, cores, per_proc_mib);
    report_fits(&rows, cores)?;
    check_messages(&rows)?;

    log_spread("raw_unix_rtt_us", &floor, "round trip, us");
    let floor = median(&floor).context("no samples for raw_unix_rtt_us")?;
    emit(SUITE, "raw_unix_rtt_us", floor, Unit::Micros)?;
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "scale suite done"
    );
    Ok(())
}

/// The part of a size's median latency that the procs' measured CPU per
/// cast, spread over every core, does not explain.
fn residual(row: &Row, cores: usize) -> f64 {
    row.median_us - row.procs_cpu_per_cast_us / cores as f64
}

/// Puts the guest's records, samples and the marks' readings together,
/// one row a size.
fn rows(
    plan: &Plan,
    records: &[guest::Record],
    cast_samples: &[(String, Vec<f64>)],
    taken: &[Sample],
) -> anyhow::Result<Vec<Row>> {
    let find = |moment: &str, actors: u32| {
        taken
            .iter()
            .find(|s| s.moment == moment && s.actors == actors)
            .with_context(|| format!("the guest marked no `{moment} {actors}` moment"))
    };
    let mut rows = Vec::new();
    for n in plan.totals() {
        let spawn_ms = records
            .iter()
            .find(|r| r.metric == format!("spawn_actors_ms_{n}"))
            .with_context(|| format!("the guest did not report spawn_actors_ms_{n}"))?
            .value;
        let cast_us = cast_samples
            .iter()
            .find(|(m, _)| *m == format!("cast_reduce_us_{n}"))
            .map(|(_, v)| v.clone())
            .with_context(|| format!("the guest logged no samples of cast_reduce_us_{n}"))?;
        anyhow::ensure!(
            cast_us.len() == plan.reps as usize,
            "{} samples of cast_reduce_us_{n}, expected {}",
            cast_us.len(),
            plan.reps
        );
        let median_us = median(&cast_us).context("no cast samples")?;
        let (before, spawned) = (find("before", n)?, find("spawned", n)?);
        let (casts, casted) = (find("casts", n)?, find("casted", n)?);
        let moved = casted.traffic.since(&casts.traffic);
        let reps = f64::from(plan.reps);
        tracing::debug!(
            actors = n,
            window_s = format!("{:.3}", casted.at.duration_since(casts.at).as_secs_f64()),
            "timed casts"
        );
        rows.push(Row {
            actors: n,
            spawn_ms,
            median_us,
            sent_per_cast: moved.frames_sent as f64 / reps,
            received_per_cast: moved.frames_received as f64 / reps,
            bytes_sent_per_cast: moved.bytes_sent as f64 / reps,
            bytes_received_per_cast: moved.bytes_received as f64 / reps,
            procs_cpu_per_cast_us: (casted.procs_cpu_s - casts.procs_cpu_s) * 1e6 / reps,
            self_cpu_per_cast_us: (casted.self_cpu_s - casts.self_cpu_s) * 1e6 / reps,
            cores_busy: (casted.procs_cpu_s - casts.procs_cpu_s + casted.self_cpu_s
                - casts.self_cpu_s)
                / casted.at.duration_since(casts.at).as_secs_f64().max(1e-9),
            rss_per_actor_kib: (spawned.procs_rss_kib as f64 - before.procs_rss_kib as f64)
                / f64::from(n),
            procs_rss_mib: spawned.procs_rss_kib as f64 / 1024.0,
            cast_us,
        });
        tracing::debug!(
            actors = n,
            controller_rss_mib = format!("{:.1}", spawned.self_rss_kib as f64 / 1024.0),
            "controller memory with the mesh up"
        );
    }
    Ok(rows)
}

/// The table of every size on stderr.
fn log_table(rows: &[Row], cores: usize, per_proc_mib: f64) {
    let mut table = format!(
        "{:>7} {:>10} {:>11} {:>11} {:>11} {:>9} {:>9} {:>10} {:>10} {:>12} {:>11} {:>5} {:>10} {:>10}",
        "actors",
        "spawn ms",
        "cast p50us",
        "p10 us",
        "p90 us",
        "sent/cast",
        "recv/cast",
        "B out/cast",
        "B in/cast",
        "cpu/cast/act",
        "ctl cpu us",
        "busy",
        "resid us",
        "KiB/actor",
    );
    for row in rows {
        table.push_str(&format!(
            "\n{:>7} {:>10.1} {:>11.1} {:>11.1} {:>11.1} {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>12.2} {:>11.1} {:>5.2} {:>10.1} {:>10.1}",
            row.actors,
            row.spawn_ms,
            row.median_us,
            quantile(&row.cast_us, 0.1).unwrap_or_default(),
            quantile(&row.cast_us, 0.9).unwrap_or_default(),
            row.sent_per_cast,
            row.received_per_cast,
            row.bytes_sent_per_cast,
            row.bytes_received_per_cast,
            row.procs_cpu_per_cast_us / f64::from(row.actors),
            row.self_cpu_per_cast_us,
            row.cores_busy,
            residual(row, cores),
            row.rss_per_actor_kib,
        ));
    }
    let procs_mib: Vec<String> = rows
        .iter()
        .map(|r| format!("{}={:.0}", r.actors, r.procs_rss_mib))
        .collect();
    eprintln!(
        "scale suite, {cores} cores, {per_proc_mib:.1} MiB resident a proc before any mesh; procs' resident MiB with each mesh up: {}\n{table}",
        procs_mib.join(" ")
    );
}

/// Fits the median latencies, and the residuals, against log2 N and N;
/// logs and emits both fits and which is better.
fn report_fits(rows: &[Row], cores: usize) -> anyhow::Result<()> {
    let log_points = |y: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|r| (f64::from(r.actors).log2(), y(r)))
            .collect()
    };
    let lin_points = |y: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
        rows.iter().map(|r| (f64::from(r.actors), y(r))).collect()
    };
    let latency = |r: &Row| r.median_us;
    let resid = |r: &Row| residual(r, cores);
    for (prefix, what, y) in [
        ("cast_fit", "cast latency", &latency as &dyn Fn(&Row) -> f64),
        ("cast_residual_fit", "latency less leaf CPU / cores", &resid),
    ] {
        let (Some(log), Some(lin)) = (fit(&log_points(y)), fit(&lin_points(y))) else {
            tracing::info!("one size only: no fit of the {what}");
            return Ok(());
        };
        eprintln!(
            "{what}: us = {:.1} + {:.1} * log2(N), R^2 = {:.3}; us = {:.1} + {:.4} * N, R^2 = {:.3}; {} fits better",
            log.a,
            log.b,
            log.r2,
            lin.a,
            lin.b,
            lin.r2,
            if log.r2 >= lin.r2 { "log N" } else { "N" }
        );
        emit_value(&format!("{prefix}_log_a_us"), log.a, "us")?;
        emit_value(&format!("{prefix}_log_b_us"), log.b, "us")?;
        emit_value(&format!("{prefix}_log_r2"), log.r2, "1")?;
        emit_value(&format!("{prefix}_linear_a_us"), lin.a, "us")?;
        emit_value(&format!("{prefix}_linear_b_us"), lin.b, "us")?;
        emit_value(&format!("{prefix}_linear_r2"), lin.r2, "1")?;
    }
    Ok(())
}

/// Fails when the controller's messages per cast grow with N: each size's
/// must stay within [`MSGS_GROWTH_SLACK`] times the smallest size's, plus
/// one.
fn check_messages(rows: &[Row]) -> anyhow::Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    for row in rows {
        for (what, base, now) in [
            ("sent", first.sent_per_cast, row.sent_per_cast),
            ("received", first.received_per_cast, row.received_per_cast),
        ] {
            if now > base * MSGS_GROWTH_SLACK + 1.0 {
                tracing::warn!(
                    actors = row.actors,
                    "the controller {what} {now:.2} messages a cast at {} actors, {base:.2} at {}: it grows with N",
                    row.actors,
                    first.actors
                );
                bail!(
                    "the controller's messages {what} per cast grew from {base:.2} at {} actors to {now:.2} at {}",
                    first.actors,
                    row.actors
                );
            }
        }
    }
    tracing::info!(
        sent = first.sent_per_cast,
        received = first.received_per_cast,
        "the controller's messages per cast stay flat over the sizes"
    );
    Ok(())
}

/// Reads the agents' `READY <pid> <addr>,<addr>,...` line.
fn parse_agents_ready(ready: &str) -> anyhow::Result<(u32, Vec<ChannelAddr>)> {
    let (pid, addrs) = ready
        .split_once(' ')
        .with_context(|| format!("the agents said {ready:?}, not `<pid> <addresses>`"))?;
    let pid = pid
        .parse()
        .with_context(|| format!("the agents' pid {pid:?} is not a number"))?;
    let addrs = addrs
        .split(',')
        .map(|a| {
            a.parse::<ChannelAddr>()
                .with_context(|| format!("the agents reported a bad address {a:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!addrs.is_empty(), "the agents reported no address");
    Ok((pid, addrs))
}

/// The address agent `index` listens on: 127.0.0.2 onwards, port 0.
fn agent_addr(index: u32) -> anyhow::Result<ChannelAddr> {
    let ip = u32::from(std::net::Ipv4Addr::new(127, 0, 0, 2))
        .checked_add(index)
        .map(std::net::Ipv4Addr::from)
        .filter(|ip| ip.is_loopback())
        .with_context(|| format!("no loopback address for agent {index}"))?;
    Ok(format!("tcp:{ip}:0").parse()?)
}

/// Resolves when stdin reaches its end (or fails): the suite is gone or
/// wants the agents to stop.
fn stdin_closed() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = tx.send(());
    });
    rx
}

/// The `scale-agents` subcommand: serves `count` host agents in this
/// process, each on a loopback address of its own, whose procs are this
/// binary's `bootstrap`; prints `READY <pid> <addr>,...` and serves until
/// stdin closes, then stops every agent's procs.
pub fn serve_agents(count: u32) -> anyhow::Result<()> {
    let runtime = crate::worker::runtime(crate::worker::Flavor::MultiThread, 2)?;
    runtime.block_on(async {
        let closed = stdin_closed();
        let command = hyperactor_mesh::alloc::BootstrapCommand::current_exe(&["bootstrap"])
            .context("cannot find this binary to start procs")?;
        let mut agents = Vec::with_capacity(count as usize);
        for index in 0..count {
            let config = hyperactor_mesh::remote::AgentConfig {
                addr: agent_addr(index)?,
                token: None,
                command: command.clone(),
                registry: monarch_host::wasm_actor::registry(monarch_host::blob_dir(), None),
                node: format!("sim{index}"),
            };
            let agent = hyperactor_mesh::remote::serve_agent(config)
                .await
                .with_context(|| format!("cannot serve agent {index}"))?;
            agents.push(agent);
        }
        let addrs: Vec<String> = agents.iter().map(|a| a.id().addr().to_string()).collect();
        println!("READY {} {}", std::process::id(), addrs.join(","));
        let _ = closed.await;
        let grace = Duration::from_secs(3);
        futures::future::join_all(
            agents
                .iter()
                .map(|a| a.go("host lost: the scale suite ended".into(), grace)),
        )
        .await;
        anyhow::Ok(())
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_recover_lines_in_log_n_and_in_n() {
        let log: Vec<(f64, f64)> = [64.0f64, 256.0, 1024.0, 4096.0]
            .iter()
            .map(|n| (n.log2(), 100.0 + 20.0 * n.log2()))
            .collect();
        let f = fit(&log).unwrap();
        assert!((f.a - 100.0).abs() < 1e-9 && (f.b - 20.0).abs() < 1e-9);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        // A line in N, fitted against log N, fits worse than against N.
        let n: Vec<f64> = vec![64.0, 256.0, 1024.0, 4096.0, 10048.0];
        let lin: Vec<(f64, f64)> = n.iter().map(|n| (*n, 50.0 + 3.0 * n)).collect();
        let as_log: Vec<(f64, f64)> = lin.iter().map(|(n, y)| (n.log2(), *y)).collect();
        assert!((fit(&lin).unwrap().r2 - 1.0).abs() < 1e-12);
        assert!(fit(&as_log).unwrap().r2 < 0.95);
        assert_eq!(fit(&[(1.0, 2.0)]), None);
        assert_eq!(fit(&[(1.0, 2.0), (1.0, 3.0)]), None);
    }

    #[test]
    fn sizes_round_up_to_a_multiple_of_the_agents() {
        let args = |sizes: Option<Vec<u32>>, quick| ScaleArgs {
            quick,
            agents: None,
            sizes,
            reps: None,
            fanout: 16,
            threads: 1,
            program: PathBuf::from("p.wasm"),
        };
        let plan = Plan::of(&args(None, false)).unwrap();
        assert_eq!(plan.totals(), vec![64, 256, 1024, 4096, 10048]);
        assert_eq!(plan.per_proc, vec![1, 4, 16, 64, 157]);
        let plan = Plan::of(&args(None, true)).unwrap();
        assert_eq!(plan.totals(), vec![8, 64, 256]);
        let plan = Plan::of(&args(Some(vec![100, 1, 64]), false)).unwrap();
        assert_eq!(plan.totals(), vec![64, 128]);
    }

    #[test]
    fn proc_stat_status_and_schedstat_parse() {
        let stat = "4242 (monarch (bench)) S 77 4242 77 0 -1 4194560 500 0 0 0 120 35 0 0 20 0 3 0 100 0 0";
        assert_eq!(parse_ppid(stat), Some(77));
        assert_eq!(parse_ppid("garbage"), None);
        assert_eq!(parse_schedstat("123456789 4567 89\n"), Some(123456789));
        assert_eq!(parse_schedstat(""), None);
        let status = "Name:\tx\nVmPeak:\t 9 kB\nVmRSS:\t   12345 kB\nThreads: 2\n";
        assert_eq!(parse_rss_kib(status), Some(12345));
        assert_eq!(parse_rss_kib("Name: x\n"), None);
    }

    #[test]
    fn marks_samples_and_ready_lines_parse() {
        assert_eq!(
            parse_mark("[controller] MARK spawned 10048"),
            Some(("spawned", 10048))
        );
        assert_eq!(parse_mark("MARK spawned"), None);
        assert_eq!(parse_mark("nothing"), None);
        let (metric, values) = parse_samples("SAMPLES cast_reduce_us_64 1.5 2.5")
            .unwrap()
            .unwrap();
        assert_eq!(
            (metric.as_str(), values),
            ("cast_reduce_us_64", vec![1.5, 2.5])
        );
        assert!(parse_samples("SAMPLES x 1.5 two").is_err());
        assert!(parse_samples("other").unwrap().is_none());
        let (pid, addrs) = parse_agents_ready("12 tcp:127.0.0.2:4000,tcp:127.0.0.3:4001").unwrap();
        assert_eq!((pid, addrs.len()), (12, 2));
        assert!(parse_agents_ready("12").is_err());
        assert!(parse_agents_ready("x tcp:127.0.0.2:1").is_err());
        assert_eq!(agent_addr(0).unwrap().to_string(), "tcp:127.0.0.2:0");
        assert_eq!(agent_addr(300).unwrap().to_string(), "tcp:127.0.1.46:0");
    }

    #[test]
    fn messages_that_grow_with_n_fail_the_suite() {
        let row = |actors, sent, received| Row {
            actors,
            spawn_ms: 1.0,
            cast_us: vec![1.0],
            median_us: 1.0,
            sent_per_cast: sent,
            received_per_cast: received,
            bytes_sent_per_cast: 0.0,
            bytes_received_per_cast: 0.0,
            procs_cpu_per_cast_us: 0.0,
            self_cpu_per_cast_us: 0.0,
            cores_busy: 0.0,
            rss_per_actor_kib: 0.0,
            procs_rss_mib: 0.0,
        };
        assert!(check_messages(&[row(64, 16.0, 16.0), row(10048, 16.2, 16.0)]).is_ok());
        assert!(check_messages(&[row(64, 16.0, 16.0), row(10048, 16.0, 160.0)]).is_err());
        assert!(check_messages(&[row(64, 1.0, 1.0), row(4096, 64.0, 1.0)]).is_err());
    }
}
