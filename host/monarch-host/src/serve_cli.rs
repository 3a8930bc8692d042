//! The `serve` subcommand, and the client subcommands that talk to a
//! server: `submit`, `jobs`, `logs`, `cancel`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use monarch_host::progress;
use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice, MeshSpec, PartialLimits};
use monarch_host::serve::client::ApiClient;
use monarch_host::serve::{Limits, ServeConfig, Server};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Where to listen: IP:PORT. Off loopback, --token-file is required.
    #[arg(long, default_value = "127.0.0.1:7171")]
    listen: std::net::SocketAddr,
    /// Where the server keeps its database, components and job logs.
    #[arg(long)]
    data: PathBuf,
    /// A file of bearer tokens clients may present, one a line; each is an
    /// admin. For users, roles and quotas use --tokens-file.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// A file naming the principals, one a line: `NAME ROLE TOKEN
    /// [max_jobs=N] [max_procs=N] [max_memory_mib=N]`, ROLE `admin` (sees
    /// and acts on everything) or `user` (on its own jobs, components,
    /// sessions and meshes). `#` comments. A bad line stops the server
    /// with FILE:LINE and why. See docs/serve.md.
    #[arg(long, value_name = "FILE")]
    tokens_file: Option<PathBuf>,
    /// Speaks mutual TLS to the cluster's agents and procs (--cluster),
    /// with the certificates in DIR (see `monarch-host certs new`).
    #[arg(long, env = "MONARCH_TLS_DIR", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// The most unfinished (queued or running) jobs, console sessions
    /// included, each principal may have. Default: no cap.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_jobs_per_principal: Option<u64>,
    /// The most procs each principal's unfinished jobs (each counts its
    /// limits.procs on a fresh mesh) and persistent meshes may hold.
    /// Default: no cap.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_procs_per_principal: Option<u64>,
    /// The most Wasm memory (limits.memory_mib, summed) each principal's
    /// unfinished jobs may ask for, in MiB. Default: no cap.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    max_memory_per_principal_mib: Option<u64>,
    /// Requests a second each principal may make, sustained; more are
    /// answered 429 with Retry-After. 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 100.0)]
    rate_limit: f64,
    /// Requests each principal may make at once, above --rate-limit.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    rate_burst: u32,
    /// How long a client may take to send a request's headers (and how
    /// long an idle connection is kept): then its connection is closed.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = monarch_host::console::parse_duration)]
    header_timeout: Duration,
    /// How long a client may take to send a request's body, an upload's
    /// included: then it is answered 408.
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = monarch_host::console::parse_duration)]
    body_timeout: Duration,
    /// A persistent mesh to start with, as NAME=PROCS (repeatable).
    #[arg(long = "mesh", value_parser = parse_mesh)]
    meshes: Vec<(String, u32)>,
    /// Writes the address the server listens on (IP:PORT and a newline)
    /// to this file once it listens; useful with port 0.
    #[arg(long)]
    port_file: Option<PathBuf>,
    /// Jobs that run at once; more wait in the queue.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_jobs: u32,
    /// The largest component accepted, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    max_upload_mib: u64,
    /// The largest log a job may write, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    max_log_mib: u64,
    /// The most linear memory a job may ask for per instance, in MiB.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_memory_mib: u32,
    /// The longest a job may ask to run, in seconds (also caps call timeouts).
    #[arg(long, default_value_t = 86400, value_parser = clap::value_parser!(u64).range(1..))]
    max_timeout: u64,
    /// The most procs a job's fresh mesh, or a persistent mesh, may have.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_procs: u32,
    /// Threads serving HTTP and running controllers.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// A directory whose contents jobs may be granted (`submit --dir`):
    /// a job may ask for it or any directory inside it, read-only or
    /// read-write as it asks. Repeat for more. Without any, no job is
    /// granted a directory. Resolved at start (symlinks and `..`), so a
    /// granted path cannot lead out of it; a missing one stops the server.
    #[arg(long = "allow-dir", value_name = "DIR")]
    allow_dirs: Vec<PathBuf>,
    /// Traces every call with replies of every job's controller (the
    /// call, each hop of its multicast tree, the handlers, the
    /// reductions) into DATA/traces/ID.jsonl: `GET /v1/jobs/{id}/trace`,
    /// `monarch-host trace ID`.
    #[arg(long)]
    trace: bool,
    /// How long a console session may sit without input before it is
    /// closed (and what it spawned stopped), unless it asks for its own
    /// (`console --idle-ttl`): seconds, or 90s, 30m, 8h, 2d.
    #[arg(long, default_value = "8h", value_name = "DURATION", value_parser = monarch_host::console::parse_duration)]
    session_idle_ttl: Duration,
    /// Runs every job's procs, and the persistent meshes, on the agents of
    /// a cluster that `monarch-host slurm up` (or `k8s attach`) brought up
    /// under this name, instead of as child processes of the server.
    #[arg(long)]
    cluster: Option<String>,
    /// Seconds without an answer to heartbeats after which a host of the
    /// cluster is lost and its procs fail (--cluster).
    #[arg(long, default_value_t = 5.0)]
    heartbeat_timeout: f64,
    /// Forks every child proc from one started process, the fork server
    /// (a child of the server, `monarch-host fork-server` in `ps`, whose
    /// children the procs are), instead of starting this binary for each:
    /// a fresh mesh's procs then cost less than half the CPU, and
    /// fresh-mesh jobs run about twice as often (docs/benchmarks.md,
    /// "Fresh meshes").
    #[arg(long)]
    fork_server: bool,
}

fn parse_mesh(text: &str) -> Result<(String, u32), String> {
    let (name, procs) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not NAME=PROCS"))?;
    let procs = procs
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`{procs}` is not a number of procs"))?;
    Ok((name.to_string(), procs))
}

/// `--env`: checked here for a quick answer, sent as written.
fn check_env(text: &str) -> Result<String, String> {
    monarch_host::parse_env(text).map(|_| text.to_string())
}

/// Where the client subcommands find the server.
#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// The server's address.
    #[arg(long, env = "MONARCH_SERVER", default_value = "http://127.0.0.1:7171")]
    server: String,
    /// A file holding the server's bearer token.
    #[arg(long, env = "MONARCH_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Seconds each request may take (log streams excepted).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    http_timeout: u64,
}

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    /// The program component to run (a `.wasm`, or a `.py`, which is
    /// built first as by `monarch-host build`).
    app: PathBuf,
    #[command(flatten)]
    server: ServerArgs,
    /// Runs on this persistent mesh (see `serve --mesh`).
    #[arg(long, conflicts_with = "procs")]
    mesh: Option<String>,
    /// The most procs the job's fresh mesh may start.
    #[arg(long)]
    procs: Option<u32>,
    /// Linear memory per instance, in MiB.
    #[arg(long)]
    memory: Option<u32>,
    /// Wall-clock limit of the job, in seconds.
    #[arg(long)]
    timeout: Option<u64>,
    /// The default timeout of each call, in seconds.
    #[arg(long)]
    call_timeout: Option<u64>,
    /// The most time one actor handler may take, in seconds (fractions
    /// allowed), unless a mesh or a call sets its own; at most the server's
    /// --max-timeout. Default: no limit.
    #[arg(long, value_name = "SECS", value_parser = crate::parse_seconds)]
    handler_timeout: Option<Duration>,
    /// Grants the job a directory of the server's machine:
    /// HOST[::GUEST][:ro|:rw], read-only unless `:rw`; guests see it at
    /// GUEST (default: HOST). HOST is an absolute path on the server, inside
    /// one of its --allow-dir; the server resolves and checks it. Repeat
    /// for more.
    #[arg(long = "dir", value_name = "HOST[::GUEST][:ro|:rw]")]
    dirs: Vec<String>,
    /// Sets an environment variable for the program and its actors:
    /// KEY=VALUE. Repeat for more.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = check_env)]
    env: Vec<String>,
    /// Prints the job's log as it runs, and exits 0 only if it succeeds.
    #[arg(long)]
    follow: bool,
    /// Turns breakpoints on: they pause until `monarch-host debug --server
    /// URL JOB` continues them (without it they do nothing).
    #[arg(long)]
    debug: bool,
    /// Arguments passed to the program's `run`.
    #[arg(last = true)]
    args: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct JobsArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// How many of the newest jobs to list.
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

#[derive(Debug, clap::Args)]
pub struct JobArgs {
    /// The job's id.
    id: u64,
    #[command(flatten)]
    server: ServerArgs,
}

fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

fn failed(command: &str, error: String) -> ExitCode {
    eprintln!("monarch-host {command}: error: {error}");
    ExitCode::FAILURE
}

/// Serves until SIGINT or SIGTERM.
pub fn serve(args: ServeArgs) -> ExitCode {
    hyperactor_mesh::alloc::use_fork_server(args.fork_server);
    if let Some(dir) = &args.tls_dir
        && let Err(e) = crate::certs::install(dir)
    {
        return failed("serve", e);
    }
    let token = match args
        .token_file
        .as_deref()
        .map(crate::read_token)
        .transpose()
    {
        Ok(token) => token,
        Err(e) => return failed("serve", e),
    };
    let bootstrap = match hyperactor_mesh::exe::current_exe() {
        Ok(path) => path,
        Err(e) => {
            return failed(
                "serve",
                format!("cannot find this binary to start procs: {e}"),
            );
        }
    };
    let mut config = ServeConfig::new(args.listen, args.data, bootstrap);
    if let Some(name) = &args.cluster {
        match crate::cluster_placement(name, None, args.heartbeat_timeout) {
            Ok(placement) => config.placement = Some(placement),
            Err(e) => return failed("serve", e),
        }
    }
    config.token = token;
    config.tokens_file = args.tokens_file;
    config.quota = monarch_host::serve::principals::Quota {
        max_jobs: args.max_jobs_per_principal,
        max_procs: args.max_procs_per_principal,
        max_memory_mib: args.max_memory_per_principal_mib,
    };
    if !(args.rate_limit.is_finite() && args.rate_limit >= 0.0) {
        return failed(
            "serve",
            format!(
                "--rate-limit {}: give requests a second, 0 or more",
                args.rate_limit
            ),
        );
    }
    config.rate_limit = monarch_host::serve::quotas::RateLimit {
        per_second: args.rate_limit,
        burst: args.rate_burst,
    };
    config.header_timeout = args.header_timeout;
    config.body_timeout = args.body_timeout;
    config.meshes = args.meshes;
    config.allowed_dirs = args.allow_dirs;
    config.trace = args.trace;
    config.session_idle_ttl = args.session_idle_ttl;
    config.max_running_jobs = args.max_jobs as usize;
    config.max_upload_bytes = args.max_upload_mib << 20;
    config.max_log_bytes = args.max_log_mib << 20;
    config.max_limits = Limits {
        memory_mib: args.max_memory_mib,
        timeout_s: args.max_timeout,
        call_timeout_s: args.max_timeout,
        procs: args.max_procs,
        handler_timeout_s: None,
    };
    let defaults = Limits::default();
    config.default_limits = Limits {
        memory_mib: defaults.memory_mib.min(args.max_memory_mib),
        timeout_s: defaults.timeout_s.min(args.max_timeout),
        call_timeout_s: defaults.call_timeout_s.min(args.max_timeout),
        procs: defaults.procs.min(args.max_procs),
        handler_timeout_s: None,
    };
    let runtime = match runtime(args.threads.into()) {
        Ok(runtime) => runtime,
        Err(e) => return failed("serve", e),
    };
    let port_file = args.port_file;
    runtime.block_on(async move {
        let server = match Server::start(config).await {
            Ok(server) => server,
            Err(e) => return failed("serve", e),
        };
        if let Some(file) = &port_file {
            let partial = file.with_extension("partial");
            let written = std::fs::write(&partial, format!("{}\n", server.addr()))
                .and_then(|()| std::fs::rename(&partial, file));
            if let Err(e) = written {
                return failed("serve", format!("cannot write {}: {e}", file.display()));
            }
        }
        eprintln!(
            "monarch-host serve: listening on http://{} (dashboard at /)",
            server.addr()
        );
        wait_for_signal().await;
        eprintln!("monarch-host serve: stopping");
        server.stop(Duration::from_secs(10)).await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn client(args: &ServerArgs) -> Result<ApiClient, String> {
    let token = args
        .token_file
        .as_deref()
        .map(crate::read_token)
        .transpose()?;
    ApiClient::new(&args.server, token, Duration::from_secs(args.http_timeout))
}

/// Runs `body` with a client of the server, reporting its error.
fn with_client<F, Fut>(command: &str, args: &ServerArgs, body: F) -> ExitCode
where
    F: FnOnce(ApiClient) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode, String>>,
{
    let outcome = client(args).and_then(|client| runtime(1)?.block_on(body(client)));
    match outcome {
        Ok(code) => code,
        Err(e) => failed(command, e),
    }
}

/// Uploads a program and submits a job that runs it.
pub fn submit(args: SubmitArgs) -> ExitCode {
    let SubmitArgs {
        app,
        server,
        mesh,
        procs,
        memory,
        timeout,
        call_timeout,
        handler_timeout,
        dirs,
        env,
        follow,
        debug,
        args,
    } = args;
    let app = match crate::source_program(&app) {
        Ok(app) => app,
        Err(e) => return failed("submit", e),
    };
    progress::enable(false);
    with_client("submit", &server, |client| async move {
        let bytes =
            std::fs::read(&app).map_err(|e| format!("cannot read {}: {e}", app.display()))?;
        eprintln!(
            "monarch-host submit: uploading {} ({} KiB); the server compiles it",
            app.display(),
            bytes.len().div_ceil(1024)
        );
        let name = app.file_name().map_or_else(
            || app.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        );
        let uploading = progress::bytes(bytes.len() as u64, format!("uploading {name}"));
        let uploaded = client
            .upload_with_progress(bytes, uploading.counter())
            .await?;
        uploading.clear();
        if uploaded.existing {
            eprintln!(
                "monarch-host submit: the server has it already ({})",
                short(&uploaded.id)
            );
        } else {
            eprintln!(
                "monarch-host submit: uploaded {}, a `{}` component, compiled in {} ms",
                short(&uploaded.id),
                uploaded.world,
                uploaded.compile_ms
            );
        }
        let job = JobRequest {
            component: uploaded.id,
            args,
            limits: Some(PartialLimits {
                memory_mib: memory,
                timeout_s: timeout,
                call_timeout_s: call_timeout,
                procs: None,
                handler_timeout_s: handler_timeout.map(|t| t.as_secs_f64()),
            }),
            mesh: match (mesh, procs) {
                (Some(name), _) => Some(MeshChoice::Name(name)),
                (None, Some(procs)) => Some(MeshChoice::Spec(MeshSpec { procs })),
                (None, None) => None,
            },
            dirs,
            env,
            debug,
        };
        let id = client.submit(&job).await?;
        if !follow {
            println!("{id}");
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("monarch-host submit: job {id}");
        let said = Arc::new(Mutex::new(None));
        let watcher = tokio::spawn(say_states(client.clone(), id, said.clone()));
        let followed = finish_following(&client, id, async |end| {
            watcher.abort();
            // A poll may have missed the whole run of a short job: its
            // start time tells that it ran.
            let started = client
                .job(id)
                .await
                .is_ok_and(|job| job.started_at_ms.is_some());
            tell(&said, id, end, started);
        })
        .await;
        watcher.abort();
        followed
    })
}

/// How often `submit --follow` asks for its job's state.
const STATE_POLL: Duration = Duration::from_millis(200);

/// Says job `id`'s state on stderr whenever it changes, until it is over;
/// `said` holds the last one said.
async fn say_states(client: ApiClient, id: u64, said: Arc<Mutex<Option<JobStatus>>>) {
    loop {
        // A failed poll is skipped: the log stream says how the job ended.
        if let Ok(job) = client.job(id).await {
            tell(&said, id, job.status, job.started_at_ms.is_some());
            if job.status.is_final() {
                return;
            }
        }
        tokio::time::sleep(STATE_POLL).await;
    }
}

/// Says on stderr the states job `id` went through since the last one
/// `said`, now that it is `status` (and `started`, if its controller
/// started).
fn tell(said: &Mutex<Option<JobStatus>>, id: u64, status: JobStatus, started: bool) {
    let mut said = said.lock().unwrap_or_else(|e| e.into_inner());
    for state in states_since(*said, status, started) {
        progress::say(&format!(
            "monarch-host submit: job {id}: {}",
            state.as_str()
        ));
        *said = Some(state);
    }
}

/// The states to say after `said` for a job that is now `status`:
/// none if it is the same; else `status`, after `running` if the job
/// started and ended between two looks.
fn states_since(said: Option<JobStatus>, status: JobStatus, started: bool) -> Vec<JobStatus> {
    if said == Some(status) {
        return Vec::new();
    }
    let missed_run = status.is_final() && started && said != Some(JobStatus::Running);
    match missed_run {
        true => vec![JobStatus::Running, status],
        false => vec![status],
    }
}

/// Prints job `id`'s log until it ends, then hands how it ended to
/// `ended`; exit 0 only if it succeeded.
async fn finish_following(
    client: &ApiClient,
    id: u64,
    ended: impl AsyncFnOnce(JobStatus),
) -> Result<ExitCode, String> {
    let end = client.follow_logs(id, |line| println!("{line}")).await?;
    ended(end.status).await;
    match end.status {
        JobStatus::Succeeded => Ok(ExitCode::SUCCESS),
        status => {
            eprintln!(
                "monarch-host: job {id} {}{}",
                status.as_str(),
                end.error.map(|e| format!(": {e}")).unwrap_or_default()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Lists the newest jobs.
pub fn jobs(args: JobsArgs) -> ExitCode {
    let limit = args.limit.max(1);
    with_client("jobs", &args.server, |client| async move {
        let jobs = client.jobs(limit).await?;
        println!(
            "{:>6}  {:<10}  {:<12}  {:<12}  ARGS / ERROR",
            "ID", "STATUS", "MESH", "COMPONENT"
        );
        for job in jobs {
            let detail = match &job.error {
                Some(error) => error.clone(),
                None => job.args.join(" "),
            };
            println!(
                "{:>6}  {:<10}  {:<12}  {:<12}  {detail}",
                job.id,
                job.status.as_str(),
                job.mesh.as_deref().unwrap_or("(fresh)"),
                short(&job.component),
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Prints a job's log, following it until the job ends.
pub fn logs(args: JobArgs) -> ExitCode {
    let id = args.id;
    with_client("logs", &args.server, |client| async move {
        finish_following(&client, id, async |_| {}).await
    })
}

/// Cancels a job.
pub fn cancel(args: JobArgs) -> ExitCode {
    let id = args.id;
    with_client("cancel", &args.server, |client| async move {
        client.cancel(id).await?;
        eprintln!("monarch-host cancel: job {id} is being cancelled");
        Ok(ExitCode::SUCCESS)
    })
}

/// The first 12 characters of a component id, as listings show it.
fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `submit --follow` says each state once, in order, and says
    /// `running` for a job that ran between two looks, but not for one
    /// that never started.
    #[test]
    fn each_state_is_said_once_and_a_missed_run_is_said() {
        use JobStatus::*;
        assert_eq!(states_since(None, Queued, false), [Queued]);
        assert!(states_since(Some(Queued), Queued, false).is_empty());
        assert_eq!(states_since(Some(Queued), Running, true), [Running]);
        assert_eq!(states_since(Some(Running), Succeeded, true), [Succeeded]);
        assert_eq!(
            states_since(Some(Queued), Succeeded, true),
            [Running, Succeeded]
        );
        assert_eq!(states_since(None, Failed, true), [Running, Failed]);
        assert_eq!(states_since(Some(Queued), Cancelled, false), [Cancelled]);
        assert!(states_since(Some(Failed), Failed, true).is_empty());
    }
}
