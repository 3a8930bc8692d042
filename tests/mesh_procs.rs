//! Meshes across OS processes on one machine: procs are child processes
//! (`mesh-worker`, through the local allocator), actors are
//! `hyperactor_mesh::testing::EchoMeshActor`s, and the controller is this
//! test.
//!
//! What a user would notice: calls over many processes come back whole and
//! in order; a proc killed by SIGKILL, crashed by SIGSEGV or exiting with a
//! code fails exactly its own ranks, with a reason that says which, while
//! the other ranks complete; and no proc outlives its controller.

#[path = "support/mesh.rs"]
mod mesh_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::alloc::{Allocated, BootstrapCommand, LocalAllocator};
use hyperactor_mesh::client::{ActorSpec, MeshClient};
use hyperactor_mesh::testing::echo_registry;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError, Reducer};
use mesh_support::{alive, next_outcome};
use tokio::sync::mpsc;

const TIMEOUT: Duration = Duration::from_secs(20);

struct Mesh {
    client: Arc<MeshClient>,
    procs: Vec<Allocated>,
    target: CastTarget,
    events: mpsc::UnboundedReceiver<MeshEvent>,
}

async fn mesh(procs: usize, per_proc: u32) -> Mesh {
    let command = BootstrapCommand {
        program: env!("CARGO_BIN_EXE_mesh-worker").into(),
        args: vec![],
    };
    mesh_of(command, false, procs, per_proc).await
}

/// A controller whose procs are started by `command`, forked by its fork
/// server when `fork` is set.
async fn client_of(command: BootstrapCommand, fork: bool) -> Arc<MeshClient> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let blobs = std::env::temp_dir().join("mesh-procs-blobs");
    let allocator = LocalAllocator::new(command, Arc::new(echo_registry(blobs)))
        .unwrap()
        .with_fork_server(fork);
    let socket = std::env::temp_dir().join(format!("mesh-procs-{}-{n}.sock", std::process::id()));
    MeshClient::new(
        format!("unix:{}", socket.display()).parse().unwrap(),
        Arc::new(allocator),
        Arc::new(|_: &str| {}),
    )
    .await
    .unwrap()
}

/// A mesh of `procs` procs started by `command`, forked by its fork server
/// when `fork` is set.
async fn mesh_of(command: BootstrapCommand, fork: bool, procs: usize, per_proc: u32) -> Mesh {
    let client = client_of(command, fork).await;
    let events = client.subscribe();
    let allocated = client.spawn_procs(procs).await.unwrap();
    let ids: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let spec = ActorSpec {
        kind: "echo".into(),
        name: "echo".into(),
        extent: vec![("procs".into(), procs as u32), ("actors".into(), per_proc)],
        params: vec![],
        per_proc,
    };
    client.spawn_actors(&ids, &spec, TIMEOUT).await.unwrap();
    let ranks = (0..procs as u32)
        .map(|p| (p * per_proc..(p + 1) * per_proc).collect())
        .collect();
    Mesh {
        client,
        procs: allocated,
        target: CastTarget {
            mesh: "echo".into(),
            procs: ids,
            ranks,
        },
        events,
    }
}

/// The next outcome, feeding proc deaths to the caster as they come.
async fn next(mesh: &mut Mesh, caster: &mut Caster) -> Outcome {
    next_outcome(&mut mesh.events, caster, TIMEOUT).await
}

/// A reply number as the echo actor writes it: a CBOR integer.
fn int(v: i64) -> Vec<u8> {
    hyperactor_mesh::cbor::int(v)
}

/// Every rank's answer to `rank`, gathered.
async fn gather_ranks(mesh: &mut Mesh, caster: &mut Caster) -> Vec<Vec<u8>> {
    let seq = caster.cast(
        mesh.target.clone(),
        "rank",
        vec![],
        CastMode::Gather,
        TIMEOUT,
    );
    let Outcome::Done { seq: s, result } = next(mesh, caster).await else {
        panic!("not a final outcome")
    };
    assert_eq!(s, seq);
    result.unwrap()
}

/// The reason the proc stopped, from the client's events.
async fn stopped(mesh: &mut Mesh) -> String {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Some(MeshEvent::ProcStopped { reason, .. }) = mesh.events.recv().await {
                return reason;
            }
        }
    })
    .await
    .expect("the proc's end is reported")
}

#[tokio::test]
async fn gathers_and_reductions_span_processes() {
    let mut mesh = mesh(4, 3).await;
    assert!(mesh.procs.iter().all(|p| p.pid.is_some()));
    let mut caster = Caster::new(mesh.client.mailbox(), 2);
    assert_eq!(
        gather_ranks(&mut mesh, &mut caster).await,
        (0..12).map(int).collect::<Vec<_>>()
    );
    let seq = caster.cast(
        mesh.target.clone(),
        "rank",
        vec![],
        CastMode::Reduce(Reducer::MaxI64),
        TIMEOUT,
    );
    assert_eq!(
        next(&mut mesh, &mut caster).await,
        Outcome::Done {
            seq,
            result: Ok(vec![int(11)])
        }
    );
}

/// SV-1, CA-3: a proc killed mid-call fails its own ranks quickly; the
/// other ranks of a stream complete, and a gather names the dead rank.
#[tokio::test]
async fn a_proc_killed_mid_call_fails_only_its_ranks() {
    let mut mesh = mesh(4, 1).await;
    let mut caster = Caster::new(mesh.client.mailbox(), 2);
    let started = Instant::now();
    let message = 500u64.to_le_bytes().to_vec();
    let stream = caster.cast(
        mesh.target.clone(),
        "sleep",
        message.clone(),
        CastMode::Stream,
        TIMEOUT,
    );
    let gather = caster.cast(
        mesh.target.clone(),
        "sleep",
        message,
        CastMode::Gather,
        TIMEOUT,
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let victim = mesh.target.procs[2].clone();
    mesh.client.kill(&victim, libc::SIGKILL).unwrap();
    let mut items = Vec::new();
    let mut gathered = None;
    while items.len() < 4 || gathered.is_none() {
        match next(&mut mesh, &mut caster).await {
            Outcome::Item { seq, rank, result } if seq == stream => items.push((rank, result)),
            Outcome::Done { seq, result } if seq == gather => gathered = Some(result),
            Outcome::End { seq } if seq == stream => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "failures took {:?}",
        started.elapsed()
    );
    items.sort_by_key(|(rank, _)| *rank);
    for (rank, result) in &items {
        match (rank, result) {
            (2, Err(RankError::Lost(reason))) => {
                assert!(reason.contains("SIGKILL"), "{reason}")
            }
            (2, other) => panic!("rank 2 answered {other:?}"),
            (_, result) => assert!(result.is_ok(), "rank {rank}: {result:?}"),
        }
    }
    let (rank, error) = gathered.unwrap().unwrap_err();
    assert_eq!(rank, 2);
    assert!(
        error.to_string().contains("killed by signal 9 (SIGKILL)"),
        "{error}"
    );
    assert!(mesh.client.dead(&victim).is_some());
    // A slice sees its parent's failure at once: a new cast that includes
    // the dead rank fails it without waiting for anything.
    let mut slice = mesh.target.clone();
    slice.ranks[0].clear();
    let started = Instant::now();
    let seq = caster.cast(slice.clone(), "rank", vec![], CastMode::Gather, TIMEOUT);
    let Outcome::Done { seq: s, result } = next(&mut mesh, &mut caster).await else {
        panic!("no outcome")
    };
    assert_eq!(s, seq);
    assert_eq!(result.unwrap_err().0, 2);
    assert!(started.elapsed() < Duration::from_secs(1));
    // SV-2: the dead proc refuses new actors, by name.
    let spec = ActorSpec {
        kind: "echo".into(),
        name: "again".into(),
        extent: vec![("procs".into(), 1)],
        params: vec![],
        per_proc: 1,
    };
    let err = mesh
        .client
        .spawn_actors(std::slice::from_ref(&victim), &spec, TIMEOUT)
        .await
        .unwrap_err();
    assert!(err.contains(&victim.to_string()), "{err}");
    // A failed proc's place can be taken by a new proc.
    let fresh = mesh.client.spawn_procs(1).await.unwrap();
    mesh.client
        .spawn_actors(&[fresh[0].proc.clone()], &spec, TIMEOUT)
        .await
        .unwrap();
}

#[tokio::test]
async fn crashes_and_exit_codes_are_reported_by_name() {
    let mut mesh = mesh(3, 1).await;
    let mut caster = Caster::new(mesh.client.mailbox(), 16);
    let all = mesh.target.clone();
    let only = |rank: usize| {
        let mut target = all.clone();
        for (i, ranks) in target.ranks.iter_mut().enumerate() {
            if i != rank {
                ranks.clear();
            }
        }
        target
    };
    let (segv, exit) = (only(1), only(2));
    let seq = caster.cast(segv.clone(), "segfault", vec![], CastMode::Gather, TIMEOUT);
    let reason = stopped(&mut mesh).await;
    assert!(reason.contains("SIGSEGV"), "{reason}");
    caster.proc_died(&mesh.target.procs[1], &reason);
    let Outcome::Done { seq: s, result } = next(&mut mesh, &mut caster).await else {
        panic!("no outcome")
    };
    assert_eq!(s, seq);
    assert!(result.unwrap_err().1.to_string().contains("SIGSEGV"));

    caster.cast(
        exit.clone(),
        "exit",
        3u64.to_le_bytes().to_vec(),
        CastMode::Broadcast,
        TIMEOUT,
    );
    assert_eq!(stopped(&mut mesh).await, "exited with code 3");
    // The survivor still answers.
    let seq = caster.cast(only(0), "rank", vec![], CastMode::Gather, TIMEOUT);
    loop {
        match next(&mut mesh, &mut caster).await {
            Outcome::Done { seq: s, result } if s == seq => {
                assert_eq!(result.unwrap(), vec![int(0)]);
                break;
            }
            _ => {}
        }
    }
}

/// CA-1: 10,000 casts through a tree three levels deep reach every actor
/// in the order they were sent.
#[tokio::test]
async fn ten_thousand_casts_arrive_in_order_through_the_tree() {
    let mut mesh = mesh(8, 2).await;
    let mut caster = Caster::new(mesh.client.mailbox(), 2);
    for n in 0..10_000u64 {
        caster.cast(
            mesh.target.clone(),
            "seq",
            n.to_le_bytes().to_vec(),
            CastMode::Broadcast,
            TIMEOUT,
        );
    }
    let seq = caster.cast(
        mesh.target.clone(),
        "count",
        vec![],
        CastMode::Reduce(Reducer::MinI64),
        TIMEOUT,
    );
    let check = caster.cast(
        mesh.target.clone(),
        "seq",
        10_000u64.to_le_bytes().to_vec(),
        CastMode::Reduce(Reducer::SumI64),
        TIMEOUT,
    );
    let mut results = std::collections::HashMap::new();
    while results.len() < 2 {
        match next(&mut mesh, &mut caster).await {
            Outcome::Done { seq, result } => {
                results.insert(seq, result.unwrap());
            }
            Outcome::Failed { rank, error, .. } => panic!("rank {rank} failed: {error}"),
            _ => {}
        }
    }
    assert_eq!(
        results[&seq],
        vec![int(10_000)],
        "every actor got all 10,000"
    );
    assert_eq!(
        results[&check],
        vec![int(0)],
        "no actor saw one out of order"
    );
}

/// AL-1: killing the controller outright takes its procs with it.
#[test]
fn no_proc_outlives_a_killed_controller() {
    no_proc_outlives_a_killed(&["controller", "3"]);
}

/// AL-1 and FS-1: so it does when its procs were forked by its fork
/// server, which goes too.
#[test]
fn no_forked_proc_outlives_a_killed_controller() {
    no_proc_outlives_a_killed(&["controller", "3", "fork"]);
}

/// Starts a stand-in controller with `args`, kills it, and waits for its
/// procs, and every other process it started, to be gone.
fn no_proc_outlives_a_killed(args: &[&str]) {
    use std::io::BufRead;
    let mut controller = std::process::Command::new(env!("CARGO_BIN_EXE_mesh-worker"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(controller.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pids: Vec<u32> = line
        .trim()
        .strip_prefix("PIDS ")
        .expect("the controller lists its procs")
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&pid| alive(pid)));
    // Its fork server, if it has one: the parent of its procs.
    let mut all = pids.clone();
    all.extend(
        pids.iter()
            .map(|&pid| parent(pid))
            .filter(|&p| p != controller.id()),
    );
    controller.kill().unwrap();
    controller.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while all.iter().any(|&pid| alive(pid)) {
        assert!(Instant::now() < deadline, "orphans left: {all:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The parent of process `pid`, from `/proc`.
fn parent(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Process `pid`'s command line, its arguments joined by spaces.
fn cmdline(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// AL-5, FS-1, FS-2, FS-5: procs forked by the fork server answer as
/// started ones; their crashes and exit codes are reported by name, and
/// their CPU time counted; the server is their parent, and only its own
/// command line says so.
#[tokio::test]
async fn forked_procs_answer_and_end_as_started_ones() {
    let command = BootstrapCommand {
        program: env!("CARGO_BIN_EXE_mesh-worker").into(),
        args: vec![],
    };
    let mut mesh = mesh_of(command, true, 3, 2).await;
    let pids: Vec<u32> = mesh.procs.iter().map(|p| p.pid.unwrap()).collect();
    let server = parent(pids[0]);
    assert_ne!(server, std::process::id(), "the procs were not forked");
    assert!(pids.iter().all(|&pid| parent(pid) == server));
    assert!(
        cmdline(server).ends_with("fork-server"),
        "{}",
        cmdline(server)
    );
    for &pid in &pids {
        assert!(
            cmdline(pid).ends_with("mesh-worker"),
            "a proc reads as the command it runs: {}",
            cmdline(pid)
        );
    }
    let mut caster = Caster::new(mesh.client.mailbox(), 16);
    assert_eq!(
        gather_ranks(&mut mesh, &mut caster).await,
        (0..6).map(int).collect::<Vec<_>>()
    );
    let before = hyperactor_mesh::alloc::ended_procs_cpu();
    let mut exit = mesh.target.clone();
    exit.ranks = vec![vec![], vec![2], vec![]];
    caster.cast(
        exit,
        "exit",
        3u64.to_le_bytes().to_vec(),
        CastMode::Broadcast,
        TIMEOUT,
    );
    assert_eq!(stopped(&mut mesh).await, "exited with code 3");
    mesh.client
        .kill(&mesh.target.procs[2], libc::SIGKILL)
        .unwrap();
    assert_eq!(stopped(&mut mesh).await, "killed by signal 9 (SIGKILL)");
    let after = hyperactor_mesh::alloc::ended_procs_cpu();
    assert_eq!(
        after.0 - before.0,
        2,
        "each proc that ended is counted once"
    );
    assert!(
        after.1 > before.1,
        "their CPU time is counted: {before:?} {after:?}"
    );
    let mut first = mesh.target.clone();
    first.procs.truncate(1);
    first.ranks.truncate(1);
    let seq = caster.cast(first, "rank", vec![], CastMode::Gather, TIMEOUT);
    let Outcome::Done { seq: s, result } = next(&mut mesh, &mut caster).await else {
        panic!("no outcome")
    };
    assert_eq!(s, seq);
    assert_eq!(
        result.unwrap(),
        vec![int(0), int(1)],
        "the survivor answers"
    );
}

/// FS-6, AL-7: a blob the allocator stores is handed to its fork server
/// before the next fork, so the procs forked after it inherit what the
/// server made of it (a program loaded once, in `monarch-host`); a proc
/// forked before does not.
#[tokio::test]
async fn procs_forked_after_a_blob_is_stored_inherit_what_the_server_loaded() {
    let command = BootstrapCommand {
        program: env!("CARGO_BIN_EXE_mesh-worker").into(),
        args: vec![],
    };
    let client = client_of(command, true).await;
    let events = client.subscribe();
    let before = client.spawn_procs(1).await.unwrap();
    let program = format!("a program stored at {:?}", Instant::now()).into_bytes();
    let sha256 = hyperactor_mesh::agent::sha256_hex(&program);
    client.put_blob(&sha256, Arc::new(program)).await.unwrap();
    let after = client.spawn_procs(1).await.unwrap();
    let ids = vec![before[0].proc.clone(), after[0].proc.clone()];
    let spec = ActorSpec {
        kind: "echo".into(),
        name: "echo".into(),
        extent: vec![("procs".into(), 2), ("actors".into(), 1)],
        params: vec![],
        per_proc: 1,
    };
    client.spawn_actors(&ids, &spec, TIMEOUT).await.unwrap();
    let mut mesh = Mesh {
        client,
        procs: [before, after].concat(),
        target: CastTarget {
            mesh: "echo".into(),
            procs: ids,
            ranks: vec![vec![0], vec![1]],
        },
        events,
    };
    let mut caster = Caster::new(mesh.client.mailbox(), 16);
    caster.cast(
        mesh.target.clone(),
        "preloaded",
        vec![],
        CastMode::Gather,
        TIMEOUT,
    );
    let Outcome::Done { result, .. } = next(&mut mesh, &mut caster).await else {
        panic!("no outcome")
    };
    let told: Vec<String> = result
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8(r).unwrap())
        .collect();
    assert!(
        !told[0].split(',').any(|s| s == sha256),
        "a proc forked before the blob was stored: {told:?}"
    );
    assert!(
        told[1].split(',').any(|s| s == sha256),
        "a proc forked after it: {told:?}"
    );
}

/// FS-3: a command that does not serve forks still gets its procs, started
/// as before.
#[tokio::test]
async fn a_command_without_a_fork_server_starts_its_procs_itself() {
    // A shell that ends at once as a fork server and runs the worker
    // otherwise.
    let command = BootstrapCommand {
        program: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            r#"[ -n "$MONARCH_FORK_SERVER" ] && exit 0; exec "$0""#.into(),
            env!("CARGO_BIN_EXE_mesh-worker").into(),
        ],
    };
    let started = Instant::now();
    let mut mesh = mesh_of(command, true, 2, 1).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "falling back took {:?}",
        started.elapsed()
    );
    for proc in &mesh.procs {
        assert_eq!(parent(proc.pid.unwrap()), std::process::id());
    }
    let mut caster = Caster::new(mesh.client.mailbox(), 2);
    assert_eq!(
        gather_ranks(&mut mesh, &mut caster).await,
        vec![int(0), int(1)]
    );
}

/// Stopping procs is not a failure: they exit on their own, no failure
/// event comes, and they take no new actors.
#[tokio::test]
async fn stopped_procs_end_quietly_and_refuse_new_actors() {
    let mut mesh = mesh(2, 1).await;
    let pid = mesh.procs[0].pid.unwrap();
    let first = mesh.target.procs[0].clone();
    mesh.client.stop_procs(std::slice::from_ref(&first));
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) || mesh.client.dead(&first).is_none() {
        assert!(Instant::now() < deadline, "the stopped proc still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mesh.client.dead(&first).unwrap(), "stopped by its owner");
    assert!(mesh.events.try_recv().is_err(), "a stop is not a failure");
    let spec = ActorSpec {
        kind: "echo".into(),
        name: "later".into(),
        extent: vec![("procs".into(), 1)],
        params: vec![],
        per_proc: 1,
    };
    let err = mesh
        .client
        .spawn_actors(std::slice::from_ref(&first), &spec, TIMEOUT)
        .await
        .unwrap_err();
    assert!(err.contains("stopped by its owner"), "{err}");
}

/// Where procs and their controller outnumber the cores, every proc runs
/// as `SCHED_BATCH`, so that the procs a cast wakes do not preempt the
/// controller still writing it (`hyperactor_mesh::alloc::run_as_batch`),
/// and the mesh answers as before.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn procs_that_outnumber_the_cores_run_as_batch() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 16 {
        eprintln!("skipped: outnumbering {cores} cores takes {cores} procs");
        return;
    }
    let mut mesh = mesh(cores, 1).await;
    for proc in &mesh.procs {
        let pid = proc.pid.unwrap();
        // SAFETY: sched_getscheduler(2) only reads the policy of a pid.
        let policy = unsafe { libc::sched_getscheduler(pid as libc::pid_t) };
        assert_eq!(policy, libc::SCHED_BATCH, "the policy of proc {pid}");
    }
    let mut caster = Caster::new(mesh.client.mailbox(), 2);
    assert_eq!(
        gather_ranks(&mut mesh, &mut caster).await,
        (0..cores as i64).map(int).collect::<Vec<_>>()
    );
}

/// `monarch-host run --fork-server`: the program runs as without it, its
/// procs forked by the fork server rather than started one by one.
#[test]
fn run_with_a_fork_server_forks_its_procs() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args([
            "run",
            "--fork-server",
            env!("GUEST_HELLO"),
            "--timeout",
            "120",
            "--",
            "4",
        ])
        .env(
            "RUST_LOG",
            "warn,hyperactor_mesh::fork=debug,hyperactor_mesh::alloc=debug",
        )
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run monarch-host");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("hello from rank 3 of 4"), "{stdout}");
    assert!(stderr.contains("fork server started"), "{stderr}");
    assert!(
        !stderr.contains("did not fork"),
        "every proc was forked: {stderr}"
    );
}
