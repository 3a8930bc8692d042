//! The `monarch-host` command.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use monarch_host::{DirGrant, Grants, Placement, RunError, Sandbox, parse_env};

mod certs;
mod k8s_cli;
mod serve_cli;
mod slurm_cli;

/// Runs single-controller distributed programs: a sandboxed WebAssembly
/// controller that spawns meshes of procs and actors, calls them, and
/// handles their failures as values.
#[derive(Debug, Parser)]
#[command(name = "monarch-host", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs a program (a component built for the WIT world
    /// `monarch:host/program`) and exits 0 when its `run` returns Ok. Its
    /// procs are child processes of this one (or, with --in-process, run
    /// inside it).
    ///
    /// Example: monarch-host run hello.wasm -- --greeting hi
    Run(RunArgs),
    /// Builds a Python (`.py`) or JavaScript (`.js`) program into a
    /// component of the world `program`, with the bundled SDK and WIT, and
    /// compiles it into the cache so that its first run starts at once.
    /// `run app.py` does this itself; `build` is for shipping the `.wasm`.
    ///
    /// Example: monarch-host build app.py -o app.wasm
    Build(BuildArgs),
    /// Serves this machine to controllers: starts procs for them (as child
    /// processes of this agent) and keeps the programs they ship.
    ///
    /// Example: monarch-host agent --listen 10.0.0.2:7070 --token-file /etc/monarch/token
    Agent(AgentArgs),
    /// Serves programs over HTTP: uploads, jobs that run them (on fresh
    /// meshes or on persistent meshes that outlive jobs), their logs, and a
    /// dashboard at /.
    ///
    /// Example: monarch-host serve --data /var/lib/monarch --mesh workers=4
    Serve(serve_cli::ServeArgs),
    /// Uploads a program to a server and runs it as a job; prints the
    /// job's id, or with --follow its log.
    ///
    /// Example: monarch-host submit hello.wasm --mesh workers --follow -- 2
    Submit(serve_cli::SubmitArgs),
    /// Lists a server's newest jobs.
    Jobs(serve_cli::JobsArgs),
    /// An interactive session on a server (a Python REPL unless
    /// --component says otherwise) whose variables, meshes and actors
    /// outlive the console: Ctrl-D detaches, --session NAME attaches again.
    /// Without --server the session runs in this process.
    ///
    /// Example: monarch-host console --server http://10.0.0.1:7171 --session train
    Console(monarch_host::console::ConsoleArgs),
    /// Lists a server's console sessions: name, job, owner, state, idle
    /// time, idle TTL and actor meshes.
    Sessions(monarch_host::console::SessionsArgs),
    /// Prints a job's log, following it until the job ends; exits 0 only
    /// if the job succeeded.
    Logs(serve_cli::JobArgs),
    /// Cancels a job.
    Cancel(serve_cli::JobArgs),
    /// Lists and shows the post-mortem records of trapped actors.
    ///
    /// Example: monarch-host dumps show RUN workers 3
    Dumps(monarch_host::debug::dumps::DumpsArgs),
    /// A debugger for the paused actors of a run (`run --debug-listen`),
    /// at the `monarch_dbg>` prompt: list, attach, cast, continue.
    ///
    /// Example: monarch-host debug
    Debug(monarch_host::debug::client::DebugArgs),
    /// Prints each actor's current stack, sampled without stopping it;
    /// exits 1 when one has been in a handler longer than --stuck-after.
    ///
    /// Example: monarch-host stacks --stuck-after 30
    Stacks(monarch_host::debug::stacks::StacksArgs),
    /// Brings up agents on a Slurm cluster (`up`, `status`, `down`), or
    /// runs a program inside an allocation that ends with it (`run`).
    ///
    /// Example: monarch-host slurm up --name train --nodes 4 --partition gpu
    Slurm(slurm_cli::SlurmArgs),
    /// Prints Kubernetes manifests for agents, attaches to their pods, and
    /// deletes them.
    ///
    /// Example: monarch-host k8s manifest --name train --replicas 4 --image IMG
    K8s(k8s_cli::K8sArgs),
    /// Makes the certificates for TLS between hosts: a cluster CA and host
    /// certificates that agents, controllers and servers use with
    /// --tls-dir.
    ///
    /// Example: monarch-host certs new --dir tls --hosts node1,node2
    Certs(certs::CertsArgs),
    /// Prints the span tree of a traced call (`run --trace-file F`, or a
    /// job of `serve --trace`): every hop of its multicast tree, the
    /// handlers and the reductions, with durations.
    ///
    /// Example: monarch-host trace trace.jsonl
    Trace(monarch_host::traces::TraceArgs),
    /// Runs a program's tests (`#[monarch_guest::test]` functions), each
    /// on a fresh cluster of its own, and reports them as `cargo test`
    /// does; exits 0 when all pass, 1 when one fails.
    ///
    /// Example: monarch-host test app.wasm --junit report.xml
    Test(monarch_host::test_runner::TestArgs),
    /// Serves one proc of a mesh; monarch-host starts it, not users.
    #[command(hide = true)]
    Bootstrap,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The program: a .wasm component (e.g. built with `cargo build
    /// --release --target wasm32-wasip2`), or a Python (`.py`) or
    /// JavaScript (`.js`) program, built first as by `monarch-host build`
    /// (cached: later runs start at once).
    app: PathBuf,
    /// The most procs the program may spawn; each is a child process.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    procs: u32,
    /// Runs the procs inside this process instead of as child
    /// processes: calls are cheaper, but a crash ends everything.
    #[arg(long, conflicts_with_all = ["hosts", "hosts_file", "cluster"])]
    in_process: bool,
    /// Runs the procs on other machines, through the agents at these
    /// addresses (`IP:PORT` or `HOST:PORT`, comma-separated), round-robin.
    /// `ssh:[USER@]HOST[:PORT],...` starts the agents over ssh first (the
    /// binary is copied where missing, the token goes on stdin) and stops
    /// them when the run ends; $MONARCH_SSH is the ssh command to use
    /// (default `ssh`).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["hosts_file", "cluster"])]
    hosts: Vec<String>,
    /// Runs the procs on the agents of a cluster that `monarch-host slurm
    /// up` (or `k8s attach`) brought up under this name, with its token.
    #[arg(long, conflicts_with = "hosts_file")]
    cluster: Option<String>,
    /// Like --hosts, one agent address per line (`#` starts a comment).
    #[arg(long)]
    hosts_file: Option<PathBuf>,
    /// The cluster token the agents were started with (--hosts).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Speaks mutual TLS to the agents and their procs, with the cluster
    /// certificates in DIR (ca.pem, host.pem, host.key; see `monarch-host
    /// certs new`). Agents must use the same CA. With `--hosts ssh:`, the
    /// agents are started with `--tls-dir DIR` too: DIR must exist at
    /// that path on every host.
    #[arg(long, env = "MONARCH_TLS_DIR", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Seconds without an answer to heartbeats after which a host is lost
    /// and its procs fail (--hosts).
    #[arg(long, default_value_t = 5.0)]
    heartbeat_timeout: f64,
    /// The fan-out of the multicast trees that carry casts to meshes.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    fanout: u32,
    /// Linear memory per instance, in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    memory: u32,
    /// Wall-clock limit for the whole run, in seconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// How long a call waits for replies unless the program sets
    /// another timeout, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    call_timeout: u64,
    /// The most time one actor handler may take, in seconds (fractions
    /// allowed), unless a mesh or a call sets its own. A handler past it is
    /// interrupted and its actor fails with kind `deadline`; its proc and
    /// the other actors go on. Default: no limit.
    #[arg(long, value_parser = parse_seconds)]
    handler_timeout: Option<Duration>,
    /// Preopens a host directory for the program and its actors:
    /// HOST[::GUEST][:ro|:rw], read-only unless `:rw`; guests see it at
    /// GUEST (default: the same path). Repeat for more. Nothing is granted
    /// by default.
    #[arg(long = "dir", value_name = "HOST[::GUEST][:ro|:rw]")]
    dirs: Vec<DirGrant>,
    /// Sets an environment variable for the program and its actors:
    /// KEY=VALUE. Repeat for more. None is passed by default.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Threads of this process, which runs the controller (and, with
    /// --in-process, the actors). With 1 (the default) a call to an actor
    /// in this process costs a few microseconds; more threads let busy
    /// in-process actors compute in parallel, at the price of waking
    /// threads (tens of microseconds per call on virtual machines). Each
    /// child proc runs on a thread of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Forks every child proc from one started process, the fork server
    /// (a child of this one, `monarch-host fork-server` in `ps`, whose
    /// children the procs are), instead of starting this binary for each:
    /// each proc then costs less than half the CPU to start and stop, as
    /// the server holds the program loaded.
    #[arg(long, conflicts_with = "in_process")]
    fork_server: bool,
    /// Component instances one process holds at once: with
    /// --in-process the controller and every actor, else the actors of one
    /// proc. The pool is sized for the program (an interpreter such as
    /// Python makes more core instances than Rust), and reserves address
    /// space, not memory, for each.
    #[arg(long, default_value_t = monarch_host::engine::DEFAULT_MAX_INSTANCES, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_instances: u32,
    /// An actor library: another program (a `.wasm`, `.py` or `.js`, in
    /// any language) whose actor classes this one spawns as `NAME/Class`,
    /// e.g. `--actors rust=counter.wasm` and, in Python,
    /// `procs.spawn("counters", "rust/Counter", 0)`. Repeat for more.
    #[arg(long = "actors", value_name = "NAME=PATH", value_parser = parse_library)]
    actors: Vec<(String, PathBuf)>,
    /// Writes no post-mortem records of trapped actors (by default each
    /// writes a core dump and a JSON record; see `monarch-host dumps`).
    #[arg(long)]
    no_dumps: bool,
    /// Turns breakpoints on: a paused actor waits for `monarch-host
    /// debug`, which connects here (IP:PORT; port 0 picks one). Without
    /// it a breakpoint does nothing.
    #[arg(long, value_name = "IP:PORT")]
    debug_listen: Option<String>,
    /// How long a breakpoint waits with no debugger connected before it
    /// ends with the error "breakpoint abandoned", in seconds.
    #[arg(long, default_value = "600", value_parser = parse_seconds)]
    debug_pause_limit: Duration,
    /// Runs the program on the debug engine, for compiled (Rust) programs
    /// built with debug info: `--break` and `break` stop every actor at a
    /// source line or function, a trap stops before it unwinds, and
    /// `monarch-host debug` steps (`step`, `next`, `finish`), shows frames
    /// and Wasm locals, and interrupts spinning actors (`interrupt MESH
    /// ranks(SEL)`). Compiles about 3 times and runs 2 to 6 times slower
    /// than the normal engine. Turns breakpoints on (--debug-listen, by
    /// default 127.0.0.1:0).
    #[arg(long)]
    debug: bool,
    /// Under --debug, where every actor stops from the start of the run:
    /// FILE:LINE (a path ending, e.g. `lib.rs:42`) or FUNCTION (e.g.
    /// `my_crate::train`). Repeat for more.
    #[arg(long = "break", value_name = "FILE:LINE|FUNCTION", requires = "debug")]
    breaks: Vec<String>,
    /// Sends a span tree of every cast with replies (the controller's
    /// call, each comm actor hop, the leaf handlers and the reductions) to
    /// an OpenTelemetry collector over OTLP/HTTP JSON: its base URL
    /// (`http://HOST:4318`) or its traces URL.
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
    /// Writes the same spans to FILE, one OTLP JSON request per cast
    /// (`monarch-host trace FILE` prints them).
    #[arg(long, value_name = "FILE")]
    trace_file: Option<PathBuf>,
    /// Arguments passed to the program's `run`.
    #[arg(last = true)]
    args: Vec<String>,
}

fn parse_library(text: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: give NAME=PATH, e.g. rust=counter.wasm"))?;
    if name.is_empty() || name.contains('/') || path.is_empty() {
        return Err(format!("`{text}`: give NAME=PATH with a NAME without `/`"));
    }
    Ok((name.to_string(), PathBuf::from(path)))
}

#[derive(Debug, clap::Args)]
struct BuildArgs {
    /// The program: a Python (`.py`) or JavaScript (`.js`) file. The
    /// sources next to it (Python files and packages, JavaScript modules)
    /// are bundled too, so it may import them.
    app: PathBuf,
    /// Where to write the component. Default: the cache that `run app.py`
    /// uses, whose path is printed.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Linear memory per instance, in MiB, that the precompiled form is
    /// made for (as `run --memory`).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    memory: u32,
}

#[derive(Debug, clap::Args)]
struct AgentArgs {
    /// Where to listen for controllers: IP:PORT or HOST:PORT with a
    /// specific address, which is also where this machine's procs are
    /// reached. Port 0 picks a free port (see --address-file).
    #[arg(long)]
    listen: String,
    /// A file holding the cluster token; controllers must present it.
    /// Required unless the address is a loopback one. `-` reads it from
    /// the first line of stdin, and then the agent exits when stdin closes
    /// (how `run --hosts ssh:...` starts agents). The token is never an
    /// argument: `ps` would show it.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Writes the address the agent listens on (`tcp:IP:PORT` and a
    /// newline) to this file once it listens: how `slurm up` finds agents
    /// that listen on port 0.
    #[arg(long)]
    address_file: Option<PathBuf>,
    /// Exits after this many seconds without a controller (0: never), so
    /// that a forgotten allocation ends. Slurm's agents use it.
    #[arg(long, default_value_t = 600.0)]
    idle_exit: f64,
    /// The node's name in reasons such as `host lost: NODE (slurm:
    /// CANCELLED)`. Default: $SLURMD_NODENAME, else the host name.
    #[arg(long)]
    node: Option<String>,
    /// Speaks mutual TLS with controllers and procs, with the cluster
    /// certificates in DIR (ca.pem, host.pem, host.key; see `monarch-host
    /// certs new`); the procs this agent starts use it too. Required off
    /// loopback unless --insecure.
    #[arg(long, env = "MONARCH_TLS_DIR", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Listens off loopback without TLS: traffic, and the cluster token,
    /// travel in clear. Only for networks nobody else can read. A TLS
    /// directory (--tls-dir or $MONARCH_TLS_DIR) wins over it.
    #[arg(long)]
    insecure: bool,
    /// Forks the procs it starts from one started process, the fork server
    /// (a child of the agent), instead of starting this binary for each;
    /// as `run --fork-server`.
    #[arg(long)]
    fork_server: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Run(_) | Command::Serve(_)) {
        // The controller's code on 2 MiB pages, as its procs' (docs/mesh.md).
        hyperactor_mesh::exe::run_from_copy();
    }
    let RunArgs {
        app,
        procs,
        in_process,
        hosts,
        hosts_file,
        cluster,
        token_file,
        tls_dir,
        heartbeat_timeout,
        fanout,
        memory,
        timeout,
        call_timeout,
        handler_timeout,
        dirs,
        env,
        threads,
        fork_server,
        max_instances,
        actors,
        no_dumps,
        debug_listen,
        debug_pause_limit,
        debug,
        breaks,
        otlp,
        trace_file,
        args,
    } = match cli.command {
        Command::Bootstrap => return bootstrap(),
        Command::Agent(args) => return agent(args),
        Command::Slurm(args) => return slurm_cli::command(args),
        Command::K8s(args) => return k8s_cli::command(args),
        Command::Certs(args) => return certs::command(args),
        Command::Serve(args) => {
            init_tracing();
            return serve_cli::serve(args);
        }
        Command::Submit(args) => return serve_cli::submit(args),
        Command::Jobs(args) => return serve_cli::jobs(args),
        Command::Console(args) => return monarch_host::console::command(args),
        Command::Sessions(args) => return monarch_host::console::sessions_command(args),
        Command::Logs(args) => return serve_cli::logs(args),
        Command::Cancel(args) => return serve_cli::cancel(args),
        Command::Dumps(args) => return monarch_host::debug::dumps::command(args),
        Command::Debug(args) => return monarch_host::debug::client::command(args),
        Command::Stacks(args) => return monarch_host::debug::stacks::command(args),
        Command::Build(args) => return build(args),
        Command::Trace(args) => return monarch_host::traces::command(args),
        Command::Test(args) => return monarch_host::test_runner::command(args),
        Command::Run(run) => run,
    };
    init_tracing();
    hyperactor_mesh::alloc::use_fork_server(fork_server);
    monarch_host::progress::enable(false);
    if let Some(dir) = &tls_dir
        && let Err(e) = certs::install(dir)
    {
        eprintln!("monarch-host: error: {e}");
        return ExitCode::FAILURE;
    }
    let built = source_program(&app).and_then(|app| {
        let libraries = actors
            .iter()
            .map(|(name, path)| source_program(path).map(|built| (name.clone(), built)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok((app, libraries))
    });
    let (app, libraries) = match built {
        Ok(built) => built,
        Err(e) => {
            eprintln!("monarch-host: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // A program's tensor fetches and all-reduces pass multi-MiB chunks
    // through this process, as through its child procs (which do the same).
    hyperactor_mesh::alloc::keep_freed_memory();
    // Agents started over ssh live as long as this binding.
    let mut _ssh_agents = None;
    let placement = if let Some(name) = &cluster {
        match cluster_placement(name, token_file, heartbeat_timeout) {
            Ok(placement) => placement,
            Err(e) => {
                eprintln!("monarch-host: error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else if hosts.first().is_some_and(|h| h.starts_with("ssh:")) {
        match ssh_placement(
            &hosts.join(","),
            token_file,
            tls_dir.as_deref(),
            heartbeat_timeout,
        ) {
            Ok((placement, agents)) => {
                _ssh_agents = Some(agents);
                placement
            }
            Err(e) => {
                eprintln!("monarch-host: error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else if !hosts.is_empty() || hosts_file.is_some() {
        match remote_placement(hosts, hosts_file, token_file, heartbeat_timeout) {
            Ok(placement) => placement,
            Err(e) => {
                eprintln!("monarch-host: error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else if in_process {
        Placement::InProcess
    } else {
        match hyperactor_mesh::exe::current_exe() {
            Ok(program) => Placement::Local { program },
            Err(e) => {
                eprintln!("monarch-host: error: cannot find this binary to start procs: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads.into());
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monarch-host: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if hyperactor::channel::tls::installed().is_some()
        && let Placement::Hosts { agents, .. } = &placement
    {
        // A certificate of another cluster fails here, by name, rather
        // than as an agent that never answers.
        let agents = agents.clone();
        let probed = runtime.block_on(async move {
            let mut probes = tokio::task::JoinSet::new();
            for agent in agents {
                probes.spawn(async move { hyperactor::channel::tls::probe(&agent).await });
            }
            while let Some(probe) = probes.join_next().await {
                probe.map_err(|e| std::io::Error::other(e.to_string()))??;
            }
            Ok::<_, std::io::Error>(())
        });
        if let Err(e) = probed {
            eprintln!("monarch-host: error: cannot reach an agent over TLS: {e}");
            return ExitCode::FAILURE;
        }
    }
    let sandbox = Sandbox {
        memory_bytes: memory as usize * (1 << 20),
        deadline: Duration::from_secs(timeout),
        call_timeout: Duration::from_secs(call_timeout),
        max_procs: procs as usize,
        placement,
        fanout,
        handler_timeout,
        grants: Grants { dirs, env },
        max_instances,
        dumps: match no_dumps {
            true => None,
            false => monarch_host::debug::dumps::for_local_run(),
        },
        debug: None,
        debug_engine: false,
        live: Default::default(),
    };
    let debugging = monarch_host::debug::runs::Debugging {
        listen: debug_listen,
        pause_limit: debug_pause_limit,
        engine: debug,
        breaks,
    };
    let traces = if otlp.is_some() || trace_file.is_some() {
        match monarch_host::traces::TraceOutput::start(otlp.as_deref(), trace_file.as_deref()) {
            Ok(traces) => Some(traces),
            Err(e) => {
                eprintln!("monarch-host: error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    // A line of the program drawn above any progress bar, never over it.
    let log = Arc::new(|line: &str| monarch_host::progress::suspend(|| println!("{line}")));
    let outcome = runtime.block_on(async move {
        tokio::spawn(async move {
            monarch_host::debug::runs::run_local(&app, &libraries, &args, sandbox, log, debugging)
                .await
        })
        .await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    if let Some(traces) = traces {
        let report = traces.finish(Duration::from_secs(15));
        if let Some(e) = &report.error {
            eprintln!(
                "monarch-host: warning: {e} ({} of {} spans lost)",
                report.dropped,
                report.spans + report.dropped
            );
        }
    }
    match outcome {
        Ok(Ok(())) => ExitCode::SUCCESS,
        // The program's own exit status, as a native program's would be.
        Ok(Err(RunError::Exit(code))) => {
            eprintln!("monarch-host: the program exited with status {code}");
            ExitCode::from(u8::try_from(code).unwrap_or(1).max(1))
        }
        Ok(Err(e)) => {
            eprintln!("monarch-host: error: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("monarch-host: error: the run panicked: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `app` itself for a `.wasm`; for a program in a language `build` takes,
/// the component built from it (through the cache).
pub(crate) fn source_program(app: &std::path::Path) -> Result<PathBuf, String> {
    if monarch_host::build::Language::of(app).is_none() {
        return Ok(app.to_path_buf());
    }
    let progress = |line: &str| eprintln!("monarch-host: {line}");
    monarch_host::build::build(app, None, &progress)
        .map(|built| built.path)
        .map_err(|e| e.to_string())
}

fn build(args: BuildArgs) -> ExitCode {
    let progress = |line: &str| eprintln!("monarch-host build: {line}");
    let built = match monarch_host::build::build(&args.app, args.output.as_deref(), &progress) {
        Ok(built) => built,
        Err(e) => {
            eprintln!("monarch-host build: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if built.cached {
        progress(&format!("{} is up to date", built.path.display()));
    }
    // Compile it into the cache now, so that the first run is warm.
    let compiled = monarch_host::engine::new_engine(args.memory as usize * (1 << 20))
        .map_err(|e| e.to_string())
        .and_then(|engine| {
            monarch_host::engine::load(&engine, &built.path).map_err(|e| e.to_string())
        });
    match compiled {
        Ok(loaded) => {
            if !loaded.cached {
                progress("compiled into the cache");
            }
            println!("{}", built.path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("monarch-host build: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses seconds, fractions allowed (`1`, `0.5`).
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(seconds > 0.0 && seconds.is_finite() && seconds < 1e9) {
        return Err(format!("`{text}`: give a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            // Actor failures reach the program as values; their Wasm
            // backtraces are logged at info (RUST_LOG=monarch_host=info).
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| monarch_host::proc_log::PROC_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// A child proc: serves until its parent goes away.
fn bootstrap() -> ExitCode {
    // A fork server returns here only in each proc it forks (AL-5).
    hyperactor_mesh::fork::serve_forks_prepared(
        || {
            monarch_host::wasm_actor::prepare_forked_procs();
            monarch_host::proc_log::prepare(monarch_host::proc_log::PROC_FILTER);
        },
        monarch_host::wasm_actor::preload_forked_program,
    );
    monarch_host::proc_log::init(monarch_host::proc_log::PROC_FILTER);
    if std::env::var_os(IGNORE_SIGTERM_ENV).is_some() {
        // SAFETY: setting a signal's disposition to SIG_IGN.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monarch-host bootstrap: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(hyperactor_mesh::alloc::bootstrap_main(|config| {
        monarch_host::wasm_actor::registry(config.blob_dir.clone(), None)
    }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monarch-host bootstrap: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parses `IP:PORT`, `tcp:IP:PORT` or `HOST:PORT` into an agent address.
fn agent_addr(text: &str) -> Result<hyperactor::ChannelAddr, String> {
    use std::net::ToSocketAddrs;
    let text = text.trim();
    let bare = text.strip_prefix("tcp:").unwrap_or(text);
    let addr = bare
        .to_socket_addrs()
        .map_err(|e| format!("`{text}` is not an address (IP:PORT or HOST:PORT): {e}"))?
        .next()
        .ok_or_else(|| format!("`{text}` resolves to no address"))?;
    Ok(hyperactor::ChannelAddr::Tcp(addr))
}

fn read_token(path: &std::path::Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", path.display()));
    }
    Ok(token)
}

fn remote_placement(
    hosts: Vec<String>,
    hosts_file: Option<PathBuf>,
    token_file: Option<PathBuf>,
    heartbeat_timeout: f64,
) -> Result<Placement, String> {
    let lines: Vec<String> = match hosts_file {
        Some(file) => std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read the hosts file {}: {e}", file.display()))?
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
        None => hosts,
    };
    if lines.is_empty() {
        return Err("no hosts given".into());
    }
    let agents = lines
        .iter()
        .map(|l| agent_addr(l))
        .collect::<Result<Vec<_>, _>>()?;
    let token = match token_file {
        Some(path) => read_token(&path)?,
        None if agents.iter().all(is_loopback) => String::new(),
        None => {
            return Err(
                "--hosts needs --token-file: the cluster token the agents were started with".into(),
            );
        }
    };
    hosts_placement(agents, token, heartbeat_timeout)
}

fn hosts_placement(
    agents: Vec<hyperactor::ChannelAddr>,
    token: String,
    heartbeat_timeout: f64,
) -> Result<Placement, String> {
    if !(heartbeat_timeout.is_finite() && heartbeat_timeout > 0.0) {
        return Err("--heartbeat-timeout must be a positive number of seconds".into());
    }
    let host_timeout = Duration::from_secs_f64(heartbeat_timeout);
    let liveness = hyperactor_mesh::remote::Liveness {
        heartbeat: (host_timeout / 5).max(Duration::from_millis(50)),
        host_timeout,
        keepalive: host_timeout * 2,
    };
    Ok(Placement::Hosts {
        agents,
        token,
        liveness,
    })
}

/// `--cluster NAME`: the agents and token of a cluster file.
pub(crate) fn cluster_placement(
    name: &str,
    token_file: Option<PathBuf>,
    heartbeat_timeout: f64,
) -> Result<Placement, String> {
    let cluster = monarch_cluster::ClusterFile::load(name).map_err(|e| e.to_string())?;
    // A TLS controller and plain agents (or the other way round) would
    // fail at the handshake; say which flag is missing instead (K8-7).
    monarch_cluster::k8s::check_controller_tls(
        &cluster,
        hyperactor::channel::tls::installed().is_some(),
    )
    .map_err(|e| e.to_string())?;
    let agents = cluster
        .addrs()
        .iter()
        .map(|a| agent_addr(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("cluster `{name}`: {e}"))?;
    if agents.is_empty() {
        return Err(format!("cluster `{name}` has no agents"));
    }
    let token = read_token(&token_file.unwrap_or(cluster.token_file))?;
    hosts_placement(agents, token, heartbeat_timeout)
}

/// `--hosts ssh:...`: starts the agents over ssh, each with the token on
/// its stdin (a fresh one unless --token-file gives one).
fn ssh_placement(
    spec: &str,
    token_file: Option<PathBuf>,
    tls_dir: Option<&std::path::Path>,
    heartbeat_timeout: f64,
) -> Result<(Placement, monarch_cluster::ssh::SshAgents), String> {
    let targets = monarch_cluster::ssh::parse_targets(spec).map_err(|e| e.to_string())?;
    let token = match token_file {
        Some(path) => read_token(&path)?,
        None => monarch_cluster::new_token().map_err(|e| e.to_string())?,
    };
    let binary = hyperactor_mesh::exe::current_exe()
        .map_err(|e| format!("cannot find this binary to copy to the hosts: {e}"))?;
    let mut options =
        monarch_cluster::ssh::SshOptions::from_env(binary).map_err(|e| e.to_string())?;
    options.tls_dir = tls_dir.map(std::path::Path::to_path_buf);
    let agents = monarch_cluster::ssh::start_agents(&targets, &token, &options)
        .map_err(|e| e.to_string())?;
    let addrs = agents
        .addrs()
        .iter()
        .map(|a| agent_addr(a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((hosts_placement(addrs, token, heartbeat_timeout)?, agents))
}

fn is_loopback(addr: &hyperactor::ChannelAddr) -> bool {
    matches!(addr, hyperactor::ChannelAddr::Tcp(a) if a.ip().is_loopback())
}

/// Serves this machine to controllers until killed, idle past
/// --idle-exit, or (with the token on stdin) stdin closes. SIGTERM reports
/// every proc stopped with `host lost: NODE (REASON)` before exiting; under
/// Slurm the reason is the job's state (CANCELLED, TIMEOUT, PREEMPTED,
/// NODE_FAIL).
fn agent(args: AgentArgs) -> ExitCode {
    init_tracing();
    hyperactor_mesh::alloc::use_fork_server(args.fork_server);
    let fail = |e: String| {
        eprintln!("monarch-host agent: error: {e}");
        ExitCode::FAILURE
    };
    let addr = match agent_addr(&args.listen) {
        Ok(addr) => addr,
        Err(e) => return fail(e),
    };
    if !(args.idle_exit.is_finite() && args.idle_exit >= 0.0) {
        return fail("--idle-exit must be a number of seconds, 0 or more".into());
    }
    match (&args.tls_dir, args.insecure) {
        (Some(dir), _) => {
            if let Err(e) = certs::install(dir) {
                return fail(e);
            }
        }
        (None, _) if is_loopback(&addr) => {}
        (None, true) => eprintln!(
            "monarch-host agent: WARNING: --insecure: listening on {addr} without TLS; \
             traffic and the cluster token travel in clear"
        ),
        (None, false) => {
            return fail(format!(
                "{addr} is not a loopback address, and without TLS traffic and the cluster \
                 token would travel in clear: give --tls-dir DIR (make one with `monarch-host \
                 certs new --dir DIR`), or --insecure on a network nobody else can read"
            ));
        }
    }
    let from_stdin = args.token_file.as_deref() == Some(std::path::Path::new("-"));
    let token = match (&args.token_file, from_stdin) {
        (_, true) => {
            let mut line = String::new();
            match std::io::stdin().read_line(&mut line) {
                Ok(_) if !line.trim().is_empty() => Some(line.trim().to_string()),
                Ok(_) => return fail("--token-file -: stdin gave no token".into()),
                Err(e) => return fail(format!("--token-file -: cannot read stdin: {e}")),
            }
        }
        (Some(path), false) => match read_token(path) {
            Ok(token) => Some(token),
            Err(e) => return fail(e),
        },
        (None, false) => None,
    };
    let node = args
        .node
        .clone()
        .or_else(|| std::env::var("SLURMD_NODENAME").ok())
        .unwrap_or_else(hostname);
    let under_slurm = std::env::var("SLURM_JOB_ID").ok();
    if under_slurm.is_some() {
        // Slurm signals every process of the job at once: the procs leave
        // SIGTERM to this agent, which reports why they end (RM-7) and
        // then stops them.
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var(IGNORE_SIGTERM_ENV, "1") };
    }
    let command = match hyperactor_mesh::alloc::BootstrapCommand::current_exe(&["bootstrap"]) {
        Ok(command) => command,
        Err(e) => return fail(format!("cannot find this binary to start procs: {e}")),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    runtime.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = match signal(SignalKind::terminate()) {
            Ok(terminate) => terminate,
            Err(e) => return fail(format!("cannot handle SIGTERM: {e}")),
        };
        let registry = monarch_host::wasm_actor::registry(monarch_host::blob_dir(), None);
        let config = hyperactor_mesh::remote::AgentConfig {
            addr,
            token,
            command,
            registry,
            node: node.clone(),
        };
        let agent = match hyperactor_mesh::remote::serve_agent(config).await {
            Ok(agent) => agent,
            Err(e) => return fail(e.to_string()),
        };
        let listening = agent.id().addr().to_string();
        eprintln!(
            "monarch-host agent: serving on {listening} (node {node}, monarch-host {})",
            agent.info().version
        );
        if let Some(file) = &args.address_file {
            let written = monarch_cluster::write_atomic(file, format!("{listening}\n").as_bytes(), 0o644);
            if let Err(e) = written {
                return fail(e.to_string());
            }
        }
        // With the token on stdin, stdin's end is the controller's end.
        let (closed_tx, mut closed) = tokio::sync::oneshot::channel::<()>();
        if from_stdin {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
                let _ = closed_tx.send(());
            });
        } else {
            std::mem::forget(closed_tx);
        }
        let idle_exit = Duration::from_secs_f64(args.idle_exit);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
                _ = terminate.recv() => {
                    let why = match under_slurm.clone() {
                        Some(job) => {
                            let asked = tokio::task::spawn_blocking(move || {
                                monarch_cluster::slurm::ending_state(&job)
                            });
                            format!("slurm: {}", asked.await.unwrap_or_else(|_| "SIGTERM".into()))
                        }
                        None => "the agent was stopped by SIGTERM".to_string(),
                    };
                    let reason = format!("host lost: {node} ({why})");
                    eprintln!("monarch-host agent: {reason}");
                    agent.go(reason, Duration::from_secs(2)).await;
                    return ExitCode::SUCCESS;
                }
                _ = &mut closed => {
                    eprintln!("monarch-host agent: stdin closed: the controller is gone; exiting");
                    agent.go(format!("host lost: {node} (its controller's connection closed)"), Duration::from_secs(2)).await;
                    return ExitCode::SUCCESS;
                }
                _ = tick.tick() => {
                    if idle_exit > Duration::ZERO
                        && agent.idle_for().is_some_and(|idle| idle >= idle_exit)
                    {
                        eprintln!(
                            "monarch-host agent: no controller for {}s (--idle-exit); exiting",
                            idle_exit.as_secs()
                        );
                        return ExitCode::SUCCESS;
                    }
                }
            }
        }
    })
}

/// Set in an agent's environment under Slurm: its procs ignore SIGTERM
/// (the agent stops them itself, with the reason).
const IGNORE_SIGTERM_ENV: &str = "MONARCH_PROC_IGNORE_SIGTERM";

/// This machine's host name.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
