//! The `serve` suite: `monarch-host serve` as its users see it, over HTTP.
//!
//! The server runs in this process on `monarch-host`'s library
//! ([`Server`]), on a runtime and thread of its own (`--threads`, 2 as
//! `monarch-host serve`), and the client ([`ApiClient`], what `monarch-host
//! submit` uses) on a current-thread runtime of its own, as it would in
//! another process. Procs are child processes of this binary (its hidden
//! `bootstrap` subcommand, as in the mesh suite).
//!
//! ```text
//! client runtime (this thread)          server thread (--threads)        child procs (bootstrap)
//!   raw HTTP/1.1 GET /healthz  -- tcp keep-alive -->  axum
//!   ApiClient: upload, submit  -- tcp ------------->  SQLite, job task: controller (Wasm)
//!   ApiClient: follow logs     <- SSE --------------   job log           -- unix --> Greeters
//! ```
//!
//! The floor (`http_rtt_us`) is a bare HTTP/1.1 `GET /healthz` on one
//! keep-alive connection to the same server, written and parsed by hand so
//! that no client library is in it; half its samples are taken before the
//! jobs and half after.
//!
//! Uploads compile for real: the suite points `MONARCH_CACHE_DIR` at an
//! empty scratch directory (before any thread starts, see [`main`]) and
//! empties it before each repetition, and each repetition has a fresh
//! server and data directory, so no upload is `existing` and none is
//! served from the compile cache.
//!
//! The job of the job metrics is the `hello` example with argument `2`:
//! its controller spawns 2 procs (on a persistent mesh: takes the mesh's
//! 2), a `Greeter` on each, gathers one call and logs 3 lines. Every job's
//! log is checked: it must succeed with those 3 lines, or the suite fails.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use monarch_host::serve::api::{JobInfo, JobRequest, JobStatus, LogEnd, MeshChoice};
use monarch_host::serve::client::ApiClient;
use monarch_host::serve::quotas::RateLimit;
use monarch_host::serve::{ServeConfig, Server};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::report::{Unit, emit, log_spread, median};
use crate::worker::{Flavor, Scratch};

const SUITE: &str = "serve";

/// Where `cd guest-sdk && cargo build --release --target wasm32-wasip2`
/// leaves the example programs, relative to the repository root.
pub const DEFAULT_PROGRAMS: &str = "guest-sdk/target/wasm32-wasip2/release";

/// The examples uploaded, each with its metric.
pub const UPLOADS: [(&str, &str); 3] = [
    ("hello", "upload_compile_hello_ms"),
    ("counter", "upload_compile_counter_ms"),
    ("ping_pong", "upload_compile_ping_pong_ms"),
];

/// The persistent mesh the jobs run on, and its procs.
const MESH: &str = "workers";
const MESH_PROCS: u32 = 2;

/// The argument of `hello`: how many procs (and greeters) it asks for.
const HELLO_PROCS: &str = "2";

/// Quiet time before a round of the floor.
const FLOOR_SETTLE: Duration = Duration::from_millis(200);

/// How long the server may take to stop.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Arguments of the serve suite.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Far fewer repetitions: a smoke test of a few seconds; rough figures.
    #[arg(long)]
    quick: bool,
    /// Threads of the server's runtime, as `monarch-host serve --threads`
    /// (2 there too); 1 is a current-thread runtime. The client always
    /// runs on one thread of its own.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Jobs kept in flight by the throughput runs on the persistent mesh
    /// (the server runs 16 at once by default).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    submitters: u32,
    /// Jobs kept in flight by the throughput runs on fresh meshes (each
    /// starts 2 child procs).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    fresh_submitters: u32,
    /// The directory holding hello.wasm, counter.wasm and ping_pong.wasm.
    #[arg(long, default_value = DEFAULT_PROGRAMS, value_name = "DIR")]
    programs: PathBuf,
    /// The binary every proc runs as `PROC_PROGRAM bootstrap`: by default
    /// this one; a `monarch-host` binary works too.
    #[arg(long)]
    proc_program: Option<PathBuf>,
}

/// How much of everything the suite does.
struct Settings {
    upload_reps: usize,
    floor_warmup: usize,
    /// Floor round trips, half before the jobs and half after.
    floor_samples: usize,
    /// `GET /v1/jobs/{id}` through the client, for the log only.
    api_samples: usize,
    first_log_warmup: usize,
    first_log_samples: usize,
    jobs: usize,
    fresh_jobs: usize,
    runs: usize,
}

impl Settings {
    fn new(quick: bool) -> Settings {
        if quick {
            Settings {
                upload_reps: 1,
                floor_warmup: 100,
                floor_samples: 400,
                api_samples: 20,
                first_log_warmup: 1,
                first_log_samples: 3,
                jobs: 20,
                fresh_jobs: 4,
                runs: 1,
            }
        } else {
            Settings {
                upload_reps: 3,
                floor_warmup: 1_000,
                floor_samples: 4_000,
                api_samples: 500,
                first_log_warmup: 3,
                first_log_samples: 21,
                jobs: 200,
                fresh_jobs: 40,
                runs: 3,
            }
        }
    }
}

/// Runs the suite. Call it before any thread of this process starts: it
/// sets `MONARCH_CACHE_DIR` for this process and its procs.
pub fn main(args: ServeArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    let programs = load_programs(&args.programs)?;
    let proc_program = match &args.proc_program {
        Some(path) => path.clone(),
        None => {
            hyperactor_mesh::exe::current_exe().context("cannot find this binary to start procs")?
        }
    };
    anyhow::ensure!(
        proc_program.exists(),
        "{} does not exist; --proc-program names a binary with a `bootstrap` subcommand (monarch-bench or monarch-host: `cargo build --release -p monarch-host`)",
        proc_program.display()
    );
    let scratch = Scratch::new()?;
    let cache = scratch.path().join("compile-cache");
    // SAFETY: no other thread of this process runs yet (the runtimes are
    // built below, and nothing before this starts threads), so nothing
    // reads the environment while it changes. The procs inherit it.
    unsafe { std::env::set_var("MONARCH_CACHE_DIR", &cache) };
    tracing::info!(
        quick = args.quick,
        threads = args.threads,
        submitters = args.submitters,
        fresh_submitters = args.fresh_submitters,
        procs = %proc_program.display(),
        cache = %cache.display(),
        "serve suite"
    );
    let settings = Settings::new(args.quick);
    let client_rt = crate::worker::runtime(Flavor::CurrentThread, 1)?;
    let suite = Suite {
        args: &args,
        settings: &settings,
        scratch: &scratch,
        cache: &cache,
        proc_program,
        programs,
    };
    let result = client_rt.block_on(suite.run());
    client_rt.shutdown_timeout(Duration::from_secs(1));
    drop(scratch);
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "serve suite done"
    );
    result
}

/// The example programs' bytes, in the order of [`UPLOADS`].
fn load_programs(dir: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    UPLOADS
        .iter()
        .map(|(name, _)| {
            let path = dir.join(format!("{name}.wasm"));
            if !path.exists() {
                bail!(
                    "{} does not exist: build the example programs first with `cd guest-sdk && cargo build --release --target wasm32-wasip2`, or name their directory with --programs",
                    path.display()
                );
            }
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
        })
        .collect()
}

struct Suite<'a> {
    args: &'a ServeArgs,
    settings: &'a Settings,
    scratch: &'a Scratch,
    cache: &'a Path,
    proc_program: PathBuf,
    programs: Vec<Vec<u8>>,
}

impl Suite<'_> {
    async fn run(&self) -> anyhow::Result<()> {
        let uploads = self.uploads().await?;

        let data = self.scratch.path().join("jobs-data");
        let mut config = self.config(&data);
        config.meshes = vec![(MESH.to_string(), MESH_PROCS)];
        let server = ServerThread::start(config, self.args.threads).await?;
        let outcome = self.jobs(&server).await;
        server.stop().await?;
        let _ = std::fs::remove_dir_all(&data);
        let jobs = outcome?;

        log_ratios(&uploads, &jobs);
        Ok(())
    }

    /// A server as `monarch-host serve` makes one, but with no rate limit:
    /// the suite's clients poll and submit faster than the default 100
    /// requests a second of one principal, and it measures the server,
    /// not its limiter.
    fn config(&self, data: &Path) -> ServeConfig {
        let mut config = ServeConfig::new(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            data.to_path_buf(),
            self.proc_program.clone(),
        );
        config.rate_limit = RateLimit {
            per_second: 0.0,
            burst: 0,
        };
        config
    }

    /// `upload_compile_*_ms`: each example uploaded to a fresh server with
    /// an empty compile cache; median over the repetitions.
    async fn uploads(&self) -> anyhow::Result<Vec<UploadFigure>> {
        let reps = self.settings.upload_reps;
        let mut total_ms = vec![Vec::new(); UPLOADS.len()];
        let mut compile_ms = vec![Vec::new(); UPLOADS.len()];
        for rep in 0..reps {
            // Nothing runs that could read the cache: the last server has
            // stopped and the next has not started.
            if self.cache.exists() {
                std::fs::remove_dir_all(self.cache)
                    .with_context(|| format!("cannot empty {}", self.cache.display()))?;
            }
            let data = self.scratch.path().join(format!("upload-data-{rep}"));
            let server = ServerThread::start(self.config(&data), self.args.threads).await?;
            let client = api_client(server.addr)?;
            let mut outcome = Ok(());
            for (i, (name, _)) in UPLOADS.iter().enumerate() {
                let bytes = self.programs[i].clone();
                let started = Instant::now();
                let reply = client.upload(bytes).await;
                let took = started.elapsed().as_secs_f64() * 1e3;
                match reply {
                    Ok(reply) if reply.existing => {
                        outcome = Err(anyhow::anyhow!(
                            "the server had {name} already: the upload did not compile"
                        ));
                        break;
                    }
                    Ok(reply) => {
                        tracing::debug!(
                            program = name,
                            ms = took,
                            compile_ms = reply.compile_ms,
                            "upload"
                        );
                        total_ms[i].push(took);
                        compile_ms[i].push(reply.compile_ms as f64);
                    }
                    Err(e) => {
                        outcome = Err(anyhow::anyhow!("uploading {name}.wasm failed: {e}"));
                        break;
                    }
                }
            }
            server.stop().await?;
            let _ = std::fs::remove_dir_all(&data);
            outcome?;
        }
        let mut figures = Vec::new();
        for (i, (name, metric)) in UPLOADS.iter().enumerate() {
            let total = median(&total_ms[i]).context("no upload samples")?;
            let compile = median(&compile_ms[i]).context("no upload samples")?;
            tracing::info!(
                program = name,
                reps,
                size = self.programs[i].len(),
                runs_ms = format_list(&total_ms[i]),
                server_compile_ms = format_list(&compile_ms[i]),
                "upload, as the client sees it, and the server's compile_ms"
            );
            emit(SUITE, metric, total, Unit::Millis)?;
            figures.push(UploadFigure {
                metric,
                total_ms: total,
                compile_ms: compile,
            });
        }
        Ok(figures)
    }

    /// `runs` runs of fresh-mesh jobs, their procs forked by the fork
    /// server when `fork` is set: the median rate, and the median CPU time
    /// of a proc (with the fork server's own, shared among its procs).
    async fn fresh(
        &self,
        client: &ApiClient,
        fresh: &JobRequest,
        fork: bool,
    ) -> anyhow::Result<FreshFigures> {
        let s = self.settings;
        let submitters = self.args.fresh_submitters as usize;
        let procs_a_job: u64 = HELLO_PROCS.parse()?;
        let mode = if fork { "forked" } else { "started" };
        // The allocator of each job reads it when the job starts; it is
        // put back however the runs end.
        hyperactor_mesh::alloc::use_fork_server(fork);
        let runs = async {
            let mut rates = Vec::new();
            let mut proc_cpu = Vec::new();
            for run in 0..s.runs {
                let before = hyperactor_mesh::alloc::ended_procs_cpu();
                let servers_before = hyperactor_mesh::fork::servers_cpu();
                let (rate, ids) = throughput(client, fresh, s.fresh_jobs, submitters).await?;
                let procs = s.fresh_jobs as u64 * procs_a_job;
                let ended = ended_procs_cpu_after(before, procs).await?;
                let servers = hyperactor_mesh::fork::servers_cpu().saturating_sub(servers_before);
                let cpu_ms = (ended + servers).as_secs_f64() * 1e3 / procs as f64;
                tracing::info!(
                    run,
                    procs = mode,
                    jobs = s.fresh_jobs,
                    submitters,
                    rate = format!("{rate:.1}"),
                    proc_cpu_ms = format!("{cpu_ms:.2}"),
                    fork_server_cpu_ms = format!("{:.1}", servers.as_secs_f64() * 1e3),
                    "jobs/s on fresh meshes, and the CPU of each of their procs"
                );
                log_phases(client, &ids, &format!("fresh mesh, {mode}")).await?;
                rates.push(rate);
                proc_cpu.push(cpu_ms);
            }
            anyhow::Ok((rates, proc_cpu))
        }
        .await;
        hyperactor_mesh::alloc::use_fork_server(false);
        let (rates, proc_cpu) = runs?;
        Ok(FreshFigures {
            jobs_per_s: median(&rates).context("no fresh-mesh runs")?,
            proc_cpu_ms: median(&proc_cpu).context("no fresh-mesh runs")?,
        })
    }

    /// The floor and every job metric, on one server with a persistent
    /// mesh.
    async fn jobs(&self, server: &ServerThread) -> anyhow::Result<JobFigures> {
        let s = self.settings;
        let client = api_client(server.addr)?;
        let upload = client
            .upload(self.programs[0].clone())
            .await
            .map_err(|e| anyhow::anyhow!("uploading hello.wasm failed: {e}"))?;
        let on_mesh = JobRequest {
            component: upload.id.clone(),
            args: vec![HELLO_PROCS.to_string()],
            limits: None,
            mesh: Some(MeshChoice::Name(MESH.to_string())),
            dirs: Vec::new(),
            env: Vec::new(),
            ..Default::default()
        };
        let fresh = JobRequest {
            mesh: None,
            ..on_mesh.clone()
        };

        // The floor, first half.
        let mut raw = RawHttp::connect(server.addr).await?;
        for _ in 0..s.floor_warmup {
            raw.healthz().await?;
        }
        tokio::time::sleep(FLOOR_SETTLE).await;
        let mut floor = raw.rtts(s.floor_samples / 2).await?;

        // submit_to_first_log_ms; its warm-up is the first jobs on the
        // mesh's procs, which load the program.
        for _ in 0..s.first_log_warmup {
            submit_to_first_log(&client, &on_mesh).await?;
        }
        let mut first_log = Vec::new();
        for _ in 0..s.first_log_samples {
            first_log.push(submit_to_first_log(&client, &on_mesh).await?);
        }
        log_spread("submit_to_first_log_ms", &first_log, "spread, ms");
        let first_log = median(&first_log).context("no submit_to_first_log samples")?;

        // An API call with a database read, through the client, for scale.
        let mut api = Vec::with_capacity(s.api_samples);
        let probe = client
            .jobs(1)
            .await
            .map_err(|e| anyhow::anyhow!("GET /v1/jobs failed: {e}"))?
            .first()
            .map(|j| j.id)
            .context("no job to look up")?;
        for _ in 0..s.api_samples {
            let started = Instant::now();
            client
                .job(probe)
                .await
                .map_err(|e| anyhow::anyhow!("GET /v1/jobs/{probe} failed: {e}"))?;
            api.push(started.elapsed().as_secs_f64() * 1e6);
        }
        log_spread("get_job_us (ApiClient, not a metric)", &api, "spread, us");

        // jobs_per_s on the persistent mesh.
        let submitters = self.args.submitters as usize;
        let mut rates = Vec::new();
        for run in 0..s.runs {
            let (rate, ids) = throughput(&client, &on_mesh, s.jobs, submitters).await?;
            tracing::info!(
                run,
                jobs = s.jobs,
                submitters,
                rate = format!("{rate:.1}"),
                "jobs/s on the persistent mesh"
            );
            log_phases(&client, &ids, "persistent mesh").await?;
            rates.push(rate);
        }
        let jobs_per_s = median(&rates).context("no throughput runs")?;

        // fresh_mesh_jobs_per_s, with each proc started from the program
        // (the default) and then forked by the fork server (`--fork-server`).
        let fresh_submitters = self.args.fresh_submitters as usize;
        let started = self.fresh(&client, &fresh, false).await?;
        let forked = self.fresh(&client, &fresh, true).await?;
        // Every job the server recorded succeeded.
        let recorded = client
            .jobs(10_000)
            .await
            .map_err(|e| anyhow::anyhow!("GET /v1/jobs failed: {e}"))?;
        if let Some(bad) = recorded.iter().find(|j| j.status != JobStatus::Succeeded) {
            bail!(
                "job {} is {} ({}) in the server's records",
                bad.id,
                bad.status.as_str(),
                bad.error.as_deref().unwrap_or("no error")
            );
        }

        // The floor, second half.
        tokio::time::sleep(FLOOR_SETTLE).await;
        floor.extend(raw.rtts(s.floor_samples / 2).await?);
        log_spread("http_rtt_us", &floor, "spread, us");
        let floor = median(&floor).context("no samples for http_rtt_us")?;

        emit(SUITE, "submit_to_first_log_ms", first_log, Unit::Millis)?;
        emit_jobs_per_s("jobs_per_s", jobs_per_s)?;
        emit_jobs_per_s("fresh_mesh_jobs_per_s", started.jobs_per_s)?;
        emit(
            SUITE,
            "fresh_mesh_proc_cpu_ms",
            started.proc_cpu_ms,
            Unit::Millis,
        )?;
        emit_jobs_per_s("fresh_mesh_forked_jobs_per_s", forked.jobs_per_s)?;
        emit(
            SUITE,
            "fresh_mesh_forked_proc_cpu_ms",
            forked.proc_cpu_ms,
            Unit::Millis,
        )?;
        emit(SUITE, "http_rtt_us", floor, Unit::Micros)?;
        Ok(JobFigures {
            http_rtt_us: floor,
            get_job_us: median(&api).unwrap_or(f64::NAN),
            first_log_ms: first_log,
            jobs_per_s,
            fresh_per_s: started.jobs_per_s,
            submitters,
            fresh_submitters,
        })
    }
}

/// How long the procs of a run's fresh meshes have to end after its last
/// job did.
const FRESH_PROCS_END: Duration = Duration::from_secs(30);

/// The CPU time of the `procs` that a run of fresh-mesh jobs started
/// (this process's allocators count each child's as it ends:
/// `hyperactor_mesh::alloc::ended_procs_cpu`), once all of them have ended
/// since `before`.
async fn ended_procs_cpu_after(before: (u64, Duration), procs: u64) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + FRESH_PROCS_END;
    loop {
        let (ended, cpu) = hyperactor_mesh::alloc::ended_procs_cpu();
        let ended = ended - before.0;
        if ended >= procs {
            return Ok(cpu - before.1);
        }
        if Instant::now() >= deadline {
            bail!(
                "{ended} of the {procs} procs of the fresh-mesh jobs ended within {} s of the last job",
                FRESH_PROCS_END.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The fresh-mesh figures of one way of starting procs.
struct FreshFigures {
    jobs_per_s: f64,
    proc_cpu_ms: f64,
}

struct UploadFigure {
    metric: &'static str,
    total_ms: f64,
    compile_ms: f64,
}

struct JobFigures {
    http_rtt_us: f64,
    get_job_us: f64,
    first_log_ms: f64,
    jobs_per_s: f64,
    fresh_per_s: f64,
    submitters: usize,
    fresh_submitters: usize,
}

/// A client with a generous timeout: a slow answer is a figure, not an
/// error.
fn api_client(addr: SocketAddr) -> anyhow::Result<ApiClient> {
    ApiClient::new(&format!("http://{addr}"), None, Duration::from_secs(60))
        .map_err(|e| anyhow::anyhow!(e))
}

/// Submits `request` and follows its log; returns the milliseconds from
/// sending the submission to the first log line.
async fn submit_to_first_log(client: &ApiClient, request: &JobRequest) -> anyhow::Result<f64> {
    let started = Instant::now();
    let id = client
        .submit(request)
        .await
        .map_err(|e| anyhow::anyhow!("submitting a job failed: {e}"))?;
    let mut first = None;
    let mut lines = Vec::new();
    let end = client
        .follow_logs(id, |line| {
            first.get_or_insert_with(|| started.elapsed());
            lines.push(line.to_string());
        })
        .await
        .map_err(|e| anyhow::anyhow!("following job {id}'s log failed: {e}"))?;
    check_job(id, &end, &lines)?;
    let first = first.context("no log line")?;
    Ok(first.as_secs_f64() * 1e3)
}

/// Fails unless job `id` of `hello 2` succeeded and logged what it should.
fn check_job(id: u64, end: &LogEnd, lines: &[String]) -> anyhow::Result<()> {
    if end.status != JobStatus::Succeeded {
        bail!(
            "job {id} {}: {}; its log:\n{}",
            end.status.as_str(),
            end.error.as_deref().unwrap_or("no error given"),
            lines.join("\n")
        );
    }
    let expected = format!("[controller] {HELLO_PROCS} greetings from a mesh shaped");
    let procs: usize = HELLO_PROCS.parse()?;
    if lines.len() != procs + 1 || !lines[0].starts_with(&expected) {
        bail!(
            "job {id} succeeded but logged {} lines, not {} starting with {expected:?}:\n{}",
            lines.len(),
            procs + 1,
            lines.join("\n")
        );
    }
    Ok(())
}

/// `jobs` jobs of `request`, `submitters` at a time: each submitter
/// submits a job, follows its log to its end, and submits the next.
/// Returns jobs per second from the first submission to the last end, and
/// the jobs' ids.
async fn throughput(
    client: &ApiClient,
    request: &JobRequest,
    jobs: usize,
    submitters: usize,
) -> anyhow::Result<(f64, Vec<u64>)> {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let submitter = || async {
        let mut ids = Vec::new();
        let mut last = started;
        while next.fetch_add(1, Ordering::Relaxed) < jobs {
            let id = client
                .submit(request)
                .await
                .map_err(|e| anyhow::anyhow!("submitting a job failed: {e}"))?;
            let mut lines = Vec::new();
            let end = client
                .follow_logs(id, |line| lines.push(line.to_string()))
                .await
                .map_err(|e| anyhow::anyhow!("following job {id}'s log failed: {e}"))?;
            last = Instant::now();
            check_job(id, &end, &lines)?;
            ids.push(id);
        }
        anyhow::Ok((last, ids))
    };
    let done =
        futures::future::try_join_all((0..submitters.min(jobs)).map(|_| submitter())).await?;
    let last = done.iter().map(|(last, _)| *last).max().unwrap_or(started);
    let ids: Vec<u64> = done.into_iter().flat_map(|(_, ids)| ids).collect();
    anyhow::ensure!(ids.len() == jobs, "{} jobs ran, not {jobs}", ids.len());
    let seconds = (last - started).as_secs_f64();
    Ok((jobs as f64 / seconds, ids))
}

/// Logs, from the server's records of `ids`, how long jobs waited for a
/// slot and how long they ran (millisecond timestamps).
async fn log_phases(client: &ApiClient, ids: &[u64], what: &str) -> anyhow::Result<()> {
    let recorded: Vec<JobInfo> = client
        .jobs(ids.len().max(1))
        .await
        .map_err(|e| anyhow::anyhow!("GET /v1/jobs failed: {e}"))?;
    let mine: Vec<&JobInfo> = recorded.iter().filter(|j| ids.contains(&j.id)).collect();
    let phase = |f: &dyn Fn(&JobInfo) -> Option<i64>| -> Vec<f64> {
        mine.iter()
            .filter_map(|j| f(j))
            .map(|ms| ms as f64)
            .collect()
    };
    let queued = phase(&|j| Some(j.started_at_ms? - j.created_at_ms));
    let ran = phase(&|j| Some(j.finished_at_ms? - j.started_at_ms?));
    let p = |v: &[f64], q| crate::report::quantile(v, q).unwrap_or(f64::NAN);
    tracing::info!(
        jobs = mine.len(),
        queued_ms_p50 = p(&queued, 0.5),
        queued_ms_p90 = p(&queued, 0.9),
        ran_ms_p50 = p(&ran, 0.5),
        ran_ms_p90 = p(&ran, 0.9),
        "{what}: the server's record of each job (created -> started -> finished)"
    );
    Ok(())
}

/// Writes a record of `metric` in jobs per second (a unit the shared
/// [`Unit`] lacks), in the same form as [`emit`]: one decimal.
fn emit_jobs_per_s(metric: &str, value: f64) -> anyhow::Result<()> {
    use std::io::Write as _;
    let rounded = (value * 10.0).round() / 10.0;
    anyhow::ensure!(
        rounded.is_finite() && rounded > 0.0,
        "{metric} measured {value} jobs/s, which is not a positive rate"
    );
    let text = |s: &str| serde_json::Value::from(s).to_string();
    let record = format!(
        "{{\"suite\":{},\"metric\":{},\"value\":{},\"unit\":{}}}",
        text(SUITE),
        text(metric),
        serde_json::Value::from(rounded),
        text("jobs/s")
    );
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{record}")?;
    stdout.flush()?;
    Ok(())
}

fn format_list(values: &[f64]) -> String {
    values
        .iter()
        .map(|v| format!("{v:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Logs the figures as multiples of the floor, and beside each other.
fn log_ratios(uploads: &[UploadFigure], jobs: &JobFigures) {
    let floor = jobs.http_rtt_us;
    for upload in uploads {
        tracing::info!(
            metric = upload.metric,
            over_http_rtt = format!("{:.0}", upload.total_ms * 1e3 / floor),
            server_compile_share = format!("{:.2}", upload.compile_ms / upload.total_ms),
            "upload as a multiple of the floor; the share of it the server spent compiling"
        );
    }
    tracing::info!(
        metric = "get_job_us",
        over_http_rtt = format!("{:.1}", jobs.get_job_us / floor),
        "GET /v1/jobs/ID through ApiClient as a multiple of the floor"
    );
    tracing::info!(
        metric = "submit_to_first_log_ms",
        over_http_rtt = format!("{:.1}", jobs.first_log_ms * 1e3 / floor),
        "as a multiple of the floor"
    );
    // Wall time per job, and the time each job took with `submitters` in
    // flight (Little's law).
    let per_job_us = 1e6 / jobs.jobs_per_s;
    tracing::info!(
        metric = "jobs_per_s",
        wall_us_per_job = format!("{per_job_us:.0}"),
        over_http_rtt = format!("{:.1}", per_job_us / floor),
        latency_ms_in_flight = format!("{:.1}", jobs.submitters as f64 * per_job_us / 1e3),
        "wall time per job as a multiple of the floor"
    );
    let fresh_per_job_us = 1e6 / jobs.fresh_per_s;
    tracing::info!(
        metric = "fresh_mesh_jobs_per_s",
        wall_us_per_job = format!("{fresh_per_job_us:.0}"),
        over_http_rtt = format!("{:.1}", fresh_per_job_us / floor),
        latency_ms_in_flight = format!(
            "{:.1}",
            jobs.fresh_submitters as f64 * fresh_per_job_us / 1e3
        ),
        persistent_over_fresh = format!("{:.1}", jobs.jobs_per_s / jobs.fresh_per_s),
        "wall time per job as a multiple of the floor; a persistent mesh's rate over a fresh one's"
    );
}

/// A [`Server`] on a thread and runtime of its own, as if in another
/// process.
struct ServerThread {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl ServerThread {
    async fn start(config: ServeConfig, threads: u16) -> anyhow::Result<ServerThread> {
        let (ready_tx, ready) = tokio::sync::oneshot::channel::<anyhow::Result<SocketAddr>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("serve-bench-server".into())
            .spawn(move || {
                let rt = match threads {
                    1 => crate::worker::runtime(Flavor::CurrentThread, 1),
                    n => crate::worker::runtime(Flavor::MultiThread, n.into()),
                };
                let rt = match rt {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Server::start(config).await {
                        Ok(server) => {
                            let _ = ready_tx.send(Ok(server.addr()));
                            let _ = stopped.await;
                            server.stop(STOP_GRACE).await;
                        }
                        Err(e) => {
                            let _ = ready_tx
                                .send(Err(anyhow::anyhow!("the server did not start: {e}")));
                        }
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .context("cannot start the server's thread")?;
        let addr = match ready.await {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                return Err(e);
            }
            Err(_) => {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                bail!("the server's thread ended before the server started");
            }
        };
        tracing::debug!(%addr, "server started");
        Ok(ServerThread { addr, stop, thread })
    }

    /// Stops the server (its meshes' procs with it) and waits for its
    /// thread.
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        let thread = self.thread;
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(())) => Ok(()),
            _ => bail!("the server's thread panicked"),
        }
    }
}

/// One keep-alive HTTP/1.1 connection that sends `GET /healthz` and reads
/// the answer by hand: the floor, with no client library in it.
struct RawHttp {
    stream: tokio::net::TcpStream,
    buffer: Vec<u8>,
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

impl RawHttp {
    async fn connect(addr: SocketAddr) -> anyhow::Result<RawHttp> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to the server at {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(RawHttp {
            stream,
            buffer: Vec::with_capacity(1024),
        })
    }

    /// `count` timed round trips, in microseconds.
    async fn rtts(&mut self, count: usize) -> anyhow::Result<Vec<f64>> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            self.healthz().await?;
            samples.push(started.elapsed().as_secs_f64() * 1e6);
        }
        Ok(samples)
    }

    /// One request and its whole answer, which must be `200` and `ok`.
    async fn healthz(&mut self) -> anyhow::Result<()> {
        self.stream.write_all(HEALTHZ).await?;
        self.buffer.clear();
        loop {
            if let Some(length) = answer_length(&self.buffer)? {
                anyhow::ensure!(
                    self.buffer.len() == length,
                    "the server sent more than one answer"
                );
                anyhow::ensure!(
                    self.buffer.starts_with(b"HTTP/1.1 200")
                        && self.buffer.ends_with(b"\r\n\r\nok"),
                    "GET /healthz answered {:?}",
                    String::from_utf8_lossy(&self.buffer)
                );
                return Ok(());
            }
            let n = self.stream.read_buf(&mut self.buffer).await?;
            if n == 0 {
                bail!("the server closed the keep-alive connection");
            }
        }
    }
}

/// The length of the HTTP answer at the start of `bytes` once all of it
/// is there (head and `Content-Length` body); `None` while it is not.
fn answer_length(bytes: &[u8]) -> anyhow::Result<Option<usize>> {
    let Some(head_end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&bytes[..head_end]).context("an answer head not in UTF-8")?;
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .context("an answer without Content-Length")?;
    let total = head_end + 4 + length;
    Ok((bytes.len() >= total).then_some(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_complete_once_its_body_is_there() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(answer_length(answer).unwrap(), Some(answer.len()));
        assert_eq!(answer_length(&answer[..answer.len() - 1]).unwrap(), None);
        assert_eq!(answer_length(&answer[..20]).unwrap(), None);
        assert!(answer_length(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }

    #[test]
    fn every_upload_metric_is_named_for_its_program() {
        for (program, metric) in UPLOADS {
            assert_eq!(metric, format!("upload_compile_{program}_ms"));
        }
    }
}
