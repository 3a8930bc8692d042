//! Slurm, live: a controller and three nodes on this machine (Debian's
//! Slurm 22.05 and munge, tests/support/slurm.rs), each agent on its own
//! port. `slurm up`, a real example on the three nodes, `slurm status`,
//! `slurm down` leaving nothing behind; batch mode freeing its allocation;
//! and a `scancel` in the middle of a call failing it with Slurm's reason.

#[path = "support/cli.rs"]
mod cli;
#[path = "support/slurm.rs"]
mod slurm;

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use slurm::{SlurmCluster, wait_until};

const LIMIT: Duration = Duration::from_secs(240);

/// `slurm up` of the cluster `dp`.
const UP_DP: &[&str] = &[
    "slurm",
    "up",
    "--name",
    "dp",
    "--nodes",
    "3",
    "--idle-exit",
    "300",
];

fn skip() -> bool {
    match SlurmCluster::unavailable() {
        Some(why) => {
            eprintln!("skipped: {why}");
            true
        }
        None => false,
    }
}

/// `monarch-host ARGS` against `cluster`.
fn monarch(cluster: &SlurmCluster, args: &[&str]) -> cli::Command {
    let env = cluster.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cli::monarch_host_command(args, LIMIT, &env)
}

fn stdout(run: &cli::Command) -> String {
    run.stdout
        .iter()
        .map(|(_, line)| line.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The cluster file of `name`, as JSON.
fn cluster_file(cluster: &SlurmCluster, name: &str) -> serde_json::Value {
    let path = cluster.clusters.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).expect("the cluster file");
    serde_json::from_str(&text).expect("a JSON cluster file")
}

/// Waits until Slurm has no job left and no process of ours is left.
fn assert_nothing_left(cluster: &SlurmCluster) {
    wait_until(Duration::from_secs(20), "no job in squeue", || {
        cluster.active_jobs().is_empty()
    });
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let left = cluster.monarch_processes();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "processes left: {left:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn up_runs_an_example_on_three_nodes_and_down_leaves_nothing() {
    if skip() {
        return;
    }
    let cluster = SlurmCluster::start(3);
    let up = monarch(&cluster, UP_DP);
    assert_eq!(up.code, Some(0), "{up:?}\n{}", cluster.logs());
    let text = stdout(&up);
    assert!(text.contains("cluster dp is up: slurm job"), "{text}");
    let file = cluster_file(&cluster, "dp");
    let agents = file["agents"].as_array().expect("agents");
    let nodes: Vec<&str> = agents.iter().map(|a| a["node"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["n1", "n2", "n3"], "{file}");
    // All three share 127.0.0.1: each has a port of its own.
    let mut addrs: Vec<&str> = agents.iter().map(|a| a["addr"].as_str().unwrap()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 3, "{file}");
    // The token is in a 0600 file, and on no command line.
    let token_file = file["token_file"].as_str().unwrap();
    let token = std::fs::read_to_string(token_file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let agents_running = cluster.monarch_processes();
    assert_eq!(agents_running.len(), 3, "{agents_running:#?}");
    for (_, cmdline) in &agents_running {
        assert!(!cmdline.contains(token.trim()), "the token is in {cmdline}");
    }

    let status = monarch(&cluster, &["slurm", "status", "--name", "dp"]);
    assert_eq!(status.code, Some(0), "{status:?}");
    let text = stdout(&status);
    assert!(
        text.contains("RUNNING") && text.contains("3/3 agents healthy"),
        "{text}"
    );

    // `up` again: the same flags are a no-op, others need --replace.
    let again = monarch(&cluster, UP_DP);
    assert_eq!(again.code, Some(0), "{again:?}");
    assert!(
        again.stderr.contains("already up with these flags"),
        "{again:?}"
    );
    let other = monarch(&cluster, &["slurm", "up", "--name", "dp", "--nodes", "2"]);
    assert_eq!(other.code, Some(1), "{other:?}");
    assert!(
        other.stderr.contains("--replace") && other.stderr.contains("--nodes 2 asked, 3 up"),
        "{other:?}"
    );
    assert_eq!(
        cluster.active_jobs().len(),
        1,
        "{:?}",
        cluster.active_jobs()
    );

    // A real example, data-parallel over the three nodes' procs.
    let example = env!("GUEST_DATA_PARALLEL");
    let run = monarch(
        &cluster,
        &[
            "run",
            "--cluster",
            "dp",
            example,
            "--",
            "--procs",
            "3",
            "--steps",
            "5",
        ],
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let text = stdout(&run);
    assert!(
        text.contains("split by rows over 3 procs") && text.contains("the loss fell every step"),
        "{text}"
    );

    // serve --cluster: its persistent mesh's procs, and its jobs, run on
    // the agents.
    serve_on_the_cluster(&cluster, example);

    let down = monarch(&cluster, &["slurm", "down", "--name", "dp"]);
    assert_eq!(down.code, Some(0), "{down:?}");
    assert!(stdout(&down).contains("cluster dp is down"), "{down:?}");
    assert_nothing_left(&cluster);
    assert!(!cluster.clusters.join("dp.json").exists());
    let gone = monarch(&cluster, &["run", "--cluster", "dp", example]);
    assert_eq!(gone.code, Some(1));
    assert!(gone.stderr.contains("no cluster named `dp`"), "{gone:?}");
}

#[test]
fn batch_mode_runs_inside_the_allocation_and_frees_it() {
    if skip() {
        return;
    }
    let cluster = SlurmCluster::start(3);
    let example = env!("GUEST_DATA_PARALLEL");
    let run = monarch(
        &cluster,
        &[
            "slurm", "run", "--nodes", "3", example, "--", "--procs", "3", "--steps", "3",
        ],
    );
    assert_eq!(run.code, Some(0), "{run:?}\n{}", cluster.logs());
    let text = stdout(&run);
    assert!(text.contains("the loss fell every step"), "{text}");
    assert!(run.stderr.contains("the allocation is released"), "{run:?}");
    assert_nothing_left(&cluster);

    // A program that fails: its status comes back, and nothing is left.
    let failing = monarch(
        &cluster,
        &[
            "slurm",
            "run",
            "--nodes",
            "2",
            env!("GUEST_SEMANTICS"),
            "--",
            "no-such-mode",
        ],
    );
    assert_eq!(failing.code, Some(1), "{failing:?}");
    assert!(
        stdout(&failing).contains("unknown mode") || failing.stderr.contains("unknown mode"),
        "{failing:?}"
    );
    assert!(
        failing.stderr.contains("the program exited with status 1"),
        "{failing:?}"
    );
    assert_nothing_left(&cluster);
}

#[test]
fn scancel_in_the_middle_of_a_call_fails_it_with_the_slurm_reason() {
    if skip() {
        return;
    }
    let cluster = SlurmCluster::start(3);
    let up = monarch(&cluster, &["slurm", "up", "--name", "c", "--nodes", "3"]);
    assert_eq!(up.code, Some(0), "{up:?}\n{}", cluster.logs());
    let file = cluster_file(&cluster, "c");
    let job = file["placed"]["job_id"].as_str().unwrap().to_string();
    let heartbeat_timeout = 3.0;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args([
            "run",
            "--cluster",
            "c",
            "--heartbeat-timeout",
            &heartbeat_timeout.to_string(),
        ])
        .arg(env!("GUEST_SEMANTICS"))
        .args(["--", "sleep-call", "3", "60000"])
        .envs(cluster.env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = lines_tx.send((Instant::now(), line));
        }
    });
    let next = |what: &str| -> (Instant, String) {
        loop {
            let (at, line) = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no line with {what:?}"));
            if line.contains(what) {
                return (at, line);
            }
        }
    };
    next("calling 3 sleepers");
    std::thread::sleep(Duration::from_millis(1500));
    let cancelled = Instant::now();
    assert!(cluster.slurm("scancel", &[&job]).is_some());
    let (failed_at, line) = next("the call failed");
    let took = failed_at - cancelled;
    assert!(
        took < Duration::from_secs_f64(heartbeat_timeout + 2.0),
        "the call failed {took:?} after scancel: {line}"
    );
    assert!(
        line.contains("host lost: n") && line.contains("(slurm: CANCELLED)"),
        "{line}"
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_nothing_left(&cluster);
    assert!(
        cluster.job_state(&job).contains("CANCELLED"),
        "{}",
        cluster.job_state(&job)
    );
}

/// `serve --cluster dp --mesh workers=3`: the mesh's procs are children of
/// the agents, and a submitted job runs to its end.
fn serve_on_the_cluster(cluster: &SlurmCluster, example: &str) {
    let data = cluster.dir.join("serve");
    let port_file = data.join("address");
    std::fs::create_dir_all(&data).unwrap();
    let mut serve = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args([
            "serve",
            "--cluster",
            "dp",
            "--listen",
            "127.0.0.1:0",
            "--mesh",
            "workers=3",
        ])
        .arg("--data")
        .arg(&data)
        .arg("--port-file")
        .arg(&port_file)
        .envs(cluster.env())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(60), "the server's address", || {
        std::fs::read_to_string(&port_file).is_ok_and(|a| a.ends_with('\n'))
    });
    let server = format!(
        "http://{}",
        std::fs::read_to_string(&port_file).unwrap().trim()
    );
    let agents: Vec<u32> = cluster
        .monarch_processes()
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains(" agent "))
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(agents.len(), 3);
    let on_agents = cluster
        .monarch_processes()
        .into_iter()
        .filter(|(pid, _)| parent(*pid).is_some_and(|p| agents.contains(&p)))
        .count();
    assert_eq!(
        on_agents, 3,
        "the mesh's procs are not the agents' children"
    );
    let job = monarch(
        cluster,
        &[
            "submit", example, "--server", &server, "--follow", "--", "--procs", "3", "--steps",
            "3",
        ],
    );
    assert_eq!(job.code, Some(0), "{job:?}");
    assert!(stdout(&job).contains("the loss fell every step"), "{job:?}");
    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    let _ = serve.wait();
}

/// A process's parent, from /proc.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces.
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

#[test]
fn a_time_limit_fails_the_ranks_with_slurm_timeout() {
    if skip() {
        return;
    }
    let cluster = SlurmCluster::start(2);
    let up = monarch(
        &cluster,
        &["slurm", "up", "--name", "t", "--nodes", "2", "--time", "1"],
    );
    assert_eq!(up.code, Some(0), "{up:?}\n{}", cluster.logs());
    let job = cluster_file(&cluster, "t")["placed"]["job_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The job reaches its one-minute limit while two actors sleep in a
    // call that would wait five.
    let run = monarch(
        &cluster,
        &[
            "run",
            "--cluster",
            "t",
            "--heartbeat-timeout",
            "3",
            "--call-timeout",
            "300",
            env!("GUEST_SEMANTICS"),
            "--",
            "sleep-call",
            "2",
            "300000",
        ],
    );
    let text = stdout(&run);
    assert!(
        text.contains("the call failed") && text.contains("(slurm: TIMEOUT)"),
        "{run:?}"
    );
    assert_nothing_left(&cluster);
    assert!(
        cluster.job_state(&job).contains("TIMEOUT"),
        "{}",
        cluster.job_state(&job)
    );
}
