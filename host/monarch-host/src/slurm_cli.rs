//! `monarch-host slurm`: agents on a Slurm allocation (`up`, `status`,
//! `down`), or a program inside one that ends with it (`run`). The
//! placing is `monarch_cluster::slurm`'s; the handshake with each agent
//! (token and version, RM-5) is the mesh layer's.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use monarch_cluster::slurm::{self, JobFiles, SlurmSpec};
use monarch_cluster::{ClusterError, ClusterFile, Placed};

/// `monarch-host slurm`.
#[derive(Debug, clap::Args)]
pub struct SlurmArgs {
    #[command(subcommand)]
    command: SlurmCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SlurmCommand {
    /// Submits a job that runs one agent per node (`sbatch`), waits until
    /// every agent answers, and writes the cluster file that `run
    /// --cluster NAME` and `serve --cluster NAME` read. The agents exit
    /// after --idle-exit without a controller, which ends the allocation.
    ///
    /// Example: monarch-host slurm up --name train --nodes 4 --partition gpu --time 2:00:00
    Up(UpArgs),
    /// Shows a cluster's job (state, time left) and each agent's health.
    Status(NameArgs),
    /// Cancels a cluster's job (`scancel`), waits until it is over, checks
    /// that no agent answers, and forgets the cluster.
    Down(DownArgs),
    /// Runs a program inside a new allocation: agents on every node, the
    /// controller on the first; the allocation ends with the program, and
    /// this exits with its status. Its output streams here.
    ///
    /// Example: monarch-host slurm run --nodes 4 train.wasm -- --epochs 3
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct NameArgs {
    /// The cluster's name.
    #[arg(long)]
    name: String,
}

#[derive(Debug, clap::Args)]
struct DownArgs {
    /// The cluster's name.
    #[arg(long)]
    name: String,
    /// Seconds to wait for the job to end after `scancel`.
    #[arg(long, default_value_t = 120)]
    wait: u64,
}

/// What Slurm is asked for.
#[derive(Debug, clap::Args)]
struct SpecArgs {
    /// Nodes, one agent each.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    nodes: u32,
    /// The partition (`sbatch --partition`).
    #[arg(long)]
    partition: Option<String>,
    /// The time limit (`sbatch --time`: MM, HH:MM:SS, D-HH, ...).
    #[arg(long)]
    time: Option<String>,
    /// GPUs per node (`sbatch --gpus-per-node`).
    #[arg(long)]
    gpus_per_node: Option<u32>,
    /// The account to charge (`sbatch --account`).
    #[arg(long)]
    account: Option<String>,
    /// The quality of service (`sbatch --qos`).
    #[arg(long)]
    qos: Option<String>,
    /// One more `sbatch` argument, e.g. `--sbatch-arg=--constraint=a100`.
    /// Repeat for more.
    #[arg(long = "sbatch-arg", allow_hyphen_values = true)]
    sbatch_args: Vec<String>,
    /// Seconds an agent waits without a controller before it exits (and
    /// the allocation ends); 0: never.
    #[arg(long, default_value_t = 600)]
    idle_exit: u64,
    /// The cluster token's file (made fresh, mode 0600, if not given). It
    /// must be readable on the nodes.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The monarch-host binary the nodes run (default: this one, which
    /// must then be on a filesystem the nodes share).
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Seconds to wait for the job to start and its agents to listen.
    #[arg(long, default_value_t = 600)]
    wait: u64,
    /// The cluster's TLS directory (`monarch-host certs new`), on a
    /// filesystem the nodes share: the agents (and `slurm run`'s
    /// controller) use TLS with it instead of --insecure. It reaches them
    /// as $MONARCH_TLS_DIR in the job's environment (sbatch exports it
    /// unless told --export=NONE).
    #[arg(long, env = "MONARCH_TLS_DIR", value_name = "DIR")]
    tls_dir: Option<PathBuf>,
}

impl SpecArgs {
    /// Checks --tls-dir and hands it to the job through the environment
    /// that sbatch exports. Call it before any thread starts.
    fn export_tls_dir(&self) -> Result<(), String> {
        let Some(dir) = &self.tls_dir else {
            return Ok(());
        };
        let dir =
            std::fs::canonicalize(dir).map_err(|e| format!("--tls-dir {}: {e}", dir.display()))?;
        hyperactor::channel::tls::TlsConfig::from_dir(&dir)
            .map_err(|e| format!("--tls-dir: {e}"))?;
        // SAFETY: `slurm` commands set it before any other thread starts.
        unsafe { std::env::set_var("MONARCH_TLS_DIR", &dir) };
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// The cluster's name, for `run --cluster NAME`.
    #[arg(long)]
    name: String,
    #[command(flatten)]
    spec: SpecArgs,
    /// Replaces a cluster already up under this name with other flags
    /// (its job is cancelled first).
    #[arg(long)]
    replace: bool,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// A name for the job (`monarch-NAME`) and its files.
    #[arg(long, default_value = "run")]
    name: String,
    #[command(flatten)]
    spec: SpecArgs,
    /// One more flag of `monarch-host run`, e.g. `--run-arg=--timeout=900`.
    /// Repeat for more.
    #[arg(long = "run-arg", allow_hyphen_values = true)]
    run_args: Vec<String>,
    /// The program (`.wasm`, `.py` or `.js`; built here first), on a
    /// filesystem the nodes share.
    app: PathBuf,
    /// Arguments passed to the program's `run`.
    #[arg(last = true)]
    args: Vec<String>,
}

/// Runs `monarch-host slurm`.
pub fn command(args: SlurmArgs) -> ExitCode {
    let exported = match &args.command {
        SlurmCommand::Up(up) => up.spec.export_tls_dir(),
        SlurmCommand::Run(run) => run.spec.export_tls_dir(),
        _ => Ok(()),
    };
    if let Err(e) = exported {
        eprintln!("monarch-host slurm: error: {e}");
        return ExitCode::FAILURE;
    }
    monarch_host::progress::enable(false);
    let result = match args.command {
        SlurmCommand::Up(args) => up(args),
        SlurmCommand::Status(args) => status(&args.name),
        SlurmCommand::Down(args) => down(&args.name, Duration::from_secs(args.wait)),
        SlurmCommand::Run(args) => return run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monarch-host slurm: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn progress(line: &str) {
    monarch_host::progress::say(&format!("monarch-host slurm: {line}"));
}

/// Runs `wait`, showing what it says as a spinner (the job's id and
/// state, and the time waited) on a terminal, else as lines.
fn waiting<T>(first: String, wait: impl FnOnce(&dyn Fn(&str)) -> T) -> T {
    let spinner = monarch_host::progress::spinner(first);
    let say = |line: &str| match spinner.is_shown() {
        // The spinner shows the time waited itself.
        true => spinner.set_message(line.split("; waited ").next().unwrap_or(line).to_string()),
        false => progress(line),
    };
    let result = wait(&say);
    spinner.clear();
    result
}

impl SpecArgs {
    fn spec(&self, name: &str) -> SlurmSpec {
        SlurmSpec {
            name: name.to_string(),
            nodes: self.nodes,
            partition: self.partition.clone(),
            time: self.time.clone(),
            gpus_per_node: self.gpus_per_node,
            account: self.account.clone(),
            qos: self.qos.clone(),
            sbatch_args: self.sbatch_args.clone(),
            idle_exit_s: self.idle_exit,
        }
    }

    fn binary(&self) -> Result<PathBuf, String> {
        let binary = match &self.binary {
            Some(binary) => binary.clone(),
            None => hyperactor_mesh::exe::current_exe()
                .map_err(|e| format!("cannot find this binary for the nodes: {e}"))?,
        };
        absolute(&binary)
    }

    /// The token's file: the one given (checked), or a fresh one.
    fn token_file(&self, name: &str) -> Result<PathBuf, String> {
        match &self.token_file {
            Some(path) => {
                read_token(path)?;
                absolute(path)
            }
            None => monarch_cluster::write_token(name).map_err(|e| e.to_string()),
        }
    }
}

fn absolute(path: &std::path::Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn read_token(path: &std::path::Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    match token.trim() {
        "" => Err(format!("the token file {} is empty", path.display())),
        token => Ok(token.to_string()),
    }
}

/// One agent's answer to a hello: who it is and the round trip, or why
/// it did not answer.
type Answer = Result<(hyperactor_mesh::remote::AgentInfo, Duration), String>;

/// Says hello to every agent (RM-5).
fn probe(agents: &[String], token: &str) -> Result<Vec<Answer>, String> {
    let addrs = agents
        .iter()
        .map(|a| {
            use std::net::ToSocketAddrs;
            a.to_socket_addrs()
                .ok()
                .and_then(|mut found| found.next())
                .map(hyperactor::ChannelAddr::Tcp)
                .ok_or_else(|| format!("`{a}` is not an address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    Ok(runtime.block_on(hyperactor_mesh::remote::probe(
        &addrs,
        token,
        Duration::from_secs(5),
    )))
}

fn up(args: UpArgs) -> Result<(), String> {
    let name = &args.name;
    monarch_cluster::check_name(name).map_err(|e| e.to_string())?;
    let spec = args.spec.spec(name);
    // The same name again: the same flags are a no-op while its job
    // lives; other flags need --replace.
    match ClusterFile::load(name) {
        Ok(old) => {
            let alive = match &old.placed {
                Placed::Slurm { job_id } => slurm::job(job_id)
                    .map_err(|e| e.to_string())?
                    .filter(|j| !j.is_over()),
                _ => None,
            };
            match alive {
                Some(_) if old.spec == spec.flags() && !old.agents.is_empty() => {
                    progress(&format!("cluster `{name}` is already up with these flags"));
                    return status(name);
                }
                Some(_) if !args.replace => {
                    return Err(format!(
                        "cluster `{name}` is already up with other flags ({}); give --replace to cancel it and bring up the new one, or `monarch-host slurm down --name {name}` first",
                        differences(&old.spec, &spec.flags())
                    ));
                }
                Some(_) => {
                    progress(&format!("replacing cluster `{name}`"));
                    down(name, Duration::from_secs(120))?;
                }
                None => {}
            }
        }
        Err(ClusterError::Unknown { .. }) => {}
        Err(e) if args.replace => progress(&format!("replacing an unreadable cluster file: {e}")),
        Err(e) => return Err(e.to_string()),
    }
    let binary = args.spec.binary()?;
    let token_file = args.spec.token_file(name)?;
    let token = read_token(&token_file)?;
    let files = JobFiles {
        dir: monarch_cluster::scratch_dir(name).map_err(|e| e.to_string())?,
    };
    let script = slurm::up_script(&spec, &binary, &token_file, &files);
    monarch_cluster::write_atomic(&files.script(), script.as_bytes(), 0o755)
        .map_err(|e| e.to_string())?;
    let job_id = slurm::submit(&spec, &files.script(), &files).map_err(|e| e.to_string())?;
    progress(&format!(
        "submitted job {job_id} ({} nodes); its output: {}",
        spec.nodes,
        files.output(&job_id).display()
    ));
    // Written now, so that `slurm down` finds the job even if this is
    // interrupted before the agents answer.
    let mut cluster = ClusterFile {
        version: monarch_cluster::CLUSTER_FILE_VERSION,
        name: name.clone(),
        placed: Placed::Slurm {
            job_id: job_id.clone(),
        },
        spec: spec.flags(),
        agents: Vec::new(),
        token_file,
        agent_version: hyperactor_mesh::remote::VERSION.to_string(),
        created_unix: monarch_cluster::now_unix(),
    };
    cluster.save().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let wait = Duration::from_secs(args.spec.wait);
    let fail = |e: String| -> String {
        // An allocation that cannot serve is not left holding nodes.
        let _ = slurm::cancel(&job_id, Duration::from_secs(60), &progress);
        let _ = ClusterFile::remove(name);
        format!("{e}; job {job_id} was cancelled")
    };
    let info = match waiting(format!("job {job_id}: waiting for the allocation"), |say| {
        slurm::wait_running(&job_id, wait, say)
    }) {
        Ok(info) => info,
        // Still pending: left queued, as the message says.
        Err(e @ ClusterError::Timeout(_)) => return Err(e.to_string()),
        Err(e) => return Err(fail(e.to_string())),
    };
    progress(&format!(
        "job {job_id} runs on {} ({}s)",
        info.nodes.join(","),
        started.elapsed().as_secs()
    ));
    let agents = waiting(format!("job {job_id}: waiting for its agents"), |say| {
        slurm::wait_agents(
            &files,
            &job_id,
            spec.nodes as usize,
            wait.saturating_sub(started.elapsed())
                .max(Duration::from_secs(30)),
            say,
        )
    })
    .map_err(|e| fail(e.to_string()))?;
    let addrs: Vec<String> = agents.iter().map(|a| a.addr.clone()).collect();
    let answers = probe(&addrs, &token).map_err(fail)?;
    let refused: Vec<String> = agents
        .iter()
        .zip(&answers)
        .filter_map(|(agent, answer)| {
            answer
                .as_ref()
                .err()
                .map(|e| format!("{} ({}): {e}", agent.node, agent.addr))
        })
        .collect();
    if !refused.is_empty() {
        return Err(fail(format!(
            "agents did not answer the handshake: {}",
            refused.join("; ")
        )));
    }
    cluster.agents = agents;
    let path = cluster.save().map_err(|e| e.to_string())?;
    println!(
        "cluster {name} is up: slurm job {job_id}, {} agents, in {}s",
        cluster.agents.len(),
        started.elapsed().as_secs()
    );
    for (rank, agent) in cluster.agents.iter().enumerate() {
        println!("  rank {rank}  {}  {}", agent.node, agent.addr);
    }
    println!("cluster file: {}", path.display());
    println!("run on it:    monarch-host run --cluster {name} app.wasm");
    println!("tear it down: monarch-host slurm down --name {name}");
    Ok(())
}

/// The flags that differ between two specs, as `--nodes 2 (now 3)`.
fn differences(
    old: &std::collections::BTreeMap<String, String>,
    new: &std::collections::BTreeMap<String, String>,
) -> String {
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| v.map_or("unset".to_string(), |v| v.clone());
            format!("--{k} {} asked, {} up", show(new.get(k)), show(old.get(k)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn status(name: &str) -> Result<(), String> {
    let cluster = ClusterFile::load(name).map_err(|e| e.to_string())?;
    let Placed::Slurm { job_id } = &cluster.placed else {
        return Err(format!("cluster `{name}` was not placed by Slurm"));
    };
    let info = slurm::job_detailed(job_id).map_err(|e| e.to_string())?;
    match &info {
        Some(info) => println!(
            "cluster {name}: slurm job {job_id} {} ({}), time left {}, nodes {}",
            info.state,
            info.reason,
            info.time_left.as_deref().unwrap_or("-"),
            if info.nodes.is_empty() {
                "-".to_string()
            } else {
                info.nodes.join(",")
            }
        ),
        None => println!("cluster {name}: slurm job {job_id} is no longer known to Slurm"),
    }
    if cluster.agents.is_empty() {
        println!("  no agents yet (the job has not started, or `slurm up` was interrupted)");
        return Ok(());
    }
    let token = read_token(&cluster.token_file)?;
    let answers = probe(&cluster.addrs(), &token)?;
    let mut healthy = 0;
    for (rank, (agent, answer)) in cluster.agents.iter().zip(answers).enumerate() {
        let health = match answer {
            Ok((info, rtt)) => {
                healthy += 1;
                format!(
                    "ok: monarch-host {}, round trip {:.1} ms",
                    info.version,
                    rtt.as_secs_f64() * 1e3
                )
            }
            Err(e) => format!("NOT ANSWERING: {e}"),
        };
        println!("  rank {rank}  {}  {}  {health}", agent.node, agent.addr);
    }
    println!("  {healthy}/{} agents healthy", cluster.agents.len());
    Ok(())
}

fn down(name: &str, wait: Duration) -> Result<(), String> {
    let cluster = ClusterFile::load(name).map_err(|e| e.to_string())?;
    let Placed::Slurm { job_id } = &cluster.placed else {
        return Err(format!("cluster `{name}` was not placed by Slurm"));
    };
    let state = match slurm::job(job_id).map_err(|e| e.to_string())? {
        Some(info) if !info.is_over() => {
            progress(&format!("cancelling job {job_id}"));
            slurm::cancel(job_id, wait, &progress).map_err(|e| e.to_string())?
        }
        Some(info) => info.state,
        None => "gone".to_string(),
    };
    // Verify: no agent of the cluster answers any more.
    let until = Instant::now() + Duration::from_secs(15);
    let mut answering = cluster.agents.len();
    while answering > 0 {
        answering = cluster
            .addrs()
            .iter()
            .filter(|addr| {
                use std::net::ToSocketAddrs;
                addr.to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .is_some_and(|a| {
                        std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
                    })
            })
            .count();
        if answering > 0 && Instant::now() >= until {
            return Err(format!(
                "job {job_id} is {state}, but {answering} agents still accept connections; the cluster file is kept"
            ));
        }
        if answering > 0 {
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    ClusterFile::remove(name).map_err(|e| e.to_string())?;
    println!(
        "cluster {name} is down: slurm job {job_id} {state}, {} agents gone",
        cluster.agents.len()
    );
    Ok(())
}

fn run(args: RunArgs) -> ExitCode {
    match run_batch(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("monarch-host slurm: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_batch(args: RunArgs) -> Result<ExitCode, String> {
    let name = &args.name;
    monarch_cluster::check_name(name).map_err(|e| e.to_string())?;
    let spec = args.spec.spec(name);
    let app = absolute(&crate::source_program(&args.app)?)?;
    if !app.is_file() {
        return Err(format!("{}: no such program", app.display()));
    }
    let binary = args.spec.binary()?;
    let token_file = args.spec.token_file(name)?;
    let files = JobFiles {
        dir: monarch_cluster::scratch_dir(name).map_err(|e| e.to_string())?,
    };
    let mut run_args = args.run_args.clone();
    run_args.push(app.display().to_string());
    if !args.args.is_empty() {
        run_args.push("--".into());
        run_args.extend(args.args.iter().cloned());
    }
    let script = slurm::run_script(
        &spec,
        &binary,
        &token_file,
        &files,
        &run_args,
        args.spec.wait,
    );
    monarch_cluster::write_atomic(&files.script(), script.as_bytes(), 0o755)
        .map_err(|e| e.to_string())?;
    let job_id = slurm::submit(&spec, &files.script(), &files).map_err(|e| e.to_string())?;
    progress(&format!("submitted job {job_id} ({} nodes)", spec.nodes));
    let wait = Duration::from_secs(args.spec.wait);
    let started = waiting(format!("job {job_id}: waiting for the allocation"), |say| {
        slurm::wait_started(&job_id, wait, say)
    });
    if let Err(e) = started {
        if !matches!(e, ClusterError::Timeout(_)) {
            return Err(e.to_string());
        }
        // Nobody would be there to see it start: it goes.
        let _ = slurm::cancel(&job_id, Duration::from_secs(60), &progress);
        return Err(format!(
            "job {job_id} did not start within {}s (--wait), so it was cancelled",
            wait.as_secs()
        ));
    }
    // The job's output streams here until the job is over.
    let output = files.output(&job_id);
    let mut shown = 0u64;
    let mut stdout = std::io::stdout();
    let state = loop {
        let info = slurm::job(&job_id).map_err(|e| e.to_string())?;
        shown += copy_new(&output, shown, &mut stdout);
        match info {
            Some(info) if !info.is_over() => std::thread::sleep(Duration::from_millis(200)),
            Some(info) => break info.state,
            None => break "gone".to_string(),
        }
    };
    copy_new(&output, shown, &mut stdout);
    let status = std::fs::read_to_string(files.status(&job_id))
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok());
    let _ = std::fs::remove_dir_all(files.dir.join(&job_id));
    match status {
        Some(0) => {
            progress(&format!("job {job_id} {state}; the allocation is released"));
            Ok(ExitCode::SUCCESS)
        }
        Some(code) => {
            progress(&format!(
                "job {job_id} {state}: the program exited with status {code}"
            ));
            Ok(ExitCode::from(code.max(1)))
        }
        None => Err(format!(
            "job {job_id} ended {state} before the program finished; see {}",
            output.display()
        )),
    }
}

/// Copies what `path` has past `from` to `out`; returns how many bytes.
fn copy_new(path: &std::path::Path, from: u64, out: &mut impl std::io::Write) -> u64 {
    use std::io::{Read, Seek};
    let Ok(mut file) = std::fs::File::open(path) else {
        return 0;
    };
    if file.seek(std::io::SeekFrom::Start(from)).is_err() {
        return 0;
    }
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let _ = out.write_all(&bytes);
    let _ = out.flush();
    bytes.len() as u64
}
