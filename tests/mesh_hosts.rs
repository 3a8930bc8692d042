//! Meshes across hosts: agents in Linux network namespaces at addresses of
//! their own, a controller in this test reaching them over a bridge.
//!
//! What a user would notice: a host cut off in the middle of a call fails
//! its own ranks within the heartbeat timeout while the other host's ranks
//! complete, and the cut-off agent stops its procs; kills and crashes on a
//! remote host are reported by name; casts through a tree that spans hosts
//! arrive in order; and `monarch-host run --hosts` runs a program there.
//!
//! These tests need root and iproute2; without them they say why and pass.

#[path = "support/mesh.rs"]
mod mesh_support;
#[path = "support/netns.rs"]
mod netns;

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::cbor;
use hyperactor_mesh::client::{ActorSpec, MeshClient};
use hyperactor_mesh::remote::Liveness;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError, Reducer};
use mesh_support::{alive, next_outcome};
use netns::{Agent, NetCluster, mesh_client, start_agent};
use tokio::sync::mpsc;

const TOKEN: &str = "mesh-hosts-test-token";
const TIMEOUT: Duration = Duration::from_secs(30);

fn skip() -> bool {
    match NetCluster::unavailable() {
        Some(reason) => {
            eprintln!("skipped: {reason}");
            true
        }
        None => false,
    }
}

struct Hosts {
    net: NetCluster,
    _agents: Vec<Agent>,
    client: Arc<MeshClient>,
    target: CastTarget,
    hosts_of: Vec<usize>,
    pids: Vec<u32>,
    events: mpsc::UnboundedReceiver<MeshEvent>,
}

async fn hosts(count: usize, procs: usize, liveness: Liveness) -> Hosts {
    let net = NetCluster::new(count).expect("namespaces");
    let agents: Vec<Agent> = (0..count)
        .map(|i| {
            let args = vec![
                "agent".to_string(),
                format!("{}:7070", net.host_ip(i)),
                TOKEN.to_string(),
            ];
            start_agent(&net, i, env!("CARGO_BIN_EXE_mesh-worker"), &args)
        })
        .collect();
    let client = mesh_client(&net, &agents, TOKEN, liveness).await;
    let events = client.subscribe();
    let allocated = client.spawn_procs(procs).await.unwrap();
    let ids: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let spec = ActorSpec {
        kind: "echo".into(),
        name: "echo".into(),
        extent: vec![("procs".into(), procs as u32)],
        params: vec![],
        per_proc: 1,
    };
    client.spawn_actors(&ids, &spec, TIMEOUT).await.unwrap();
    Hosts {
        net,
        _agents: agents,
        target: CastTarget {
            mesh: "echo".into(),
            procs: ids,
            ranks: (0..procs as u32).map(|r| vec![r]).collect(),
        },
        hosts_of: allocated.iter().map(|a| a.host).collect(),
        pids: allocated.iter().map(|a| a.pid.unwrap_or(0)).collect(),
        client,
        events,
    }
}

async fn next(hosts: &mut Hosts, caster: &mut Caster) -> Outcome {
    next_outcome(&mut hosts.events, caster, TIMEOUT).await
}

/// RM-2, RM-3, CA-3: a partition in the middle of a call.
#[tokio::test]
async fn a_partitioned_host_fails_its_ranks_and_the_other_host_completes() {
    if skip() {
        return;
    }
    let liveness = Liveness {
        heartbeat: Duration::from_millis(250),
        host_timeout: Duration::from_secs(2),
        keepalive: Duration::from_secs(3),
    };
    let mut hosts = hosts(2, 4, liveness).await;
    assert_eq!(hosts.hosts_of, vec![0, 1, 0, 1], "round-robin over hosts");
    let mut caster = Caster::new(hosts.client.mailbox(), 16);
    let sleep = 3500u64.to_le_bytes().to_vec();
    let stream = caster.cast(
        hosts.target.clone(),
        "sleep",
        sleep.clone(),
        CastMode::Stream,
        TIMEOUT,
    );
    let gather = caster.cast(
        hosts.target.clone(),
        "sleep",
        sleep,
        CastMode::Gather,
        TIMEOUT,
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    hosts.net.partition(1).unwrap();
    let cut = Instant::now();
    let mut items = Vec::new();
    let mut gathered = None;
    while items.len() < 4 || gathered.is_none() {
        match next(&mut hosts, &mut caster).await {
            Outcome::Item { seq, rank, result } if seq == stream => {
                items.push((rank, result, cut.elapsed()))
            }
            Outcome::Done { seq, result } if seq == gather => gathered = Some(result),
            _ => {}
        }
    }
    for (rank, result, after) in &items {
        if rank % 2 == 1 {
            let Err(RankError::Lost(reason)) = result else {
                panic!("rank {rank} on the cut-off host answered {result:?}")
            };
            assert!(reason.contains("lost with its host"), "{reason}");
            assert!(
                *after < Duration::from_millis(3000),
                "rank {rank} failed after {after:?}"
            );
        } else {
            assert_eq!(result.as_ref().map(Vec::len), Ok(0), "rank {rank}");
        }
    }
    let (rank, error) = gathered.unwrap().unwrap_err();
    assert_eq!(rank, 1, "{error}");
    // RM-2: the cut-off agent stops its procs once the keepalive passes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let cut_off: Vec<u32> = (0..4)
        .filter(|r| r % 2 == 1)
        .map(|r| hosts.pids[r])
        .collect();
    while cut_off.iter().any(|&pid| alive(pid)) {
        assert!(
            Instant::now() < deadline,
            "procs of the cut-off host still run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hosts.net.heal(1).unwrap();
}

#[tokio::test]
async fn remote_kills_crashes_and_ordered_casts() {
    if skip() {
        return;
    }
    let mut hosts = hosts(2, 6, Liveness::default()).await;
    // RM-4: a proc without the cluster token cannot reach a remote proc.
    let stranger = hyperactor::Proc::serve_with_config(
        "stranger",
        format!("tcp:{}:0", hosts.net.root_ip()).parse().unwrap(),
        hyperactor::ProcConfig {
            delivery_timeout: Duration::from_millis(500),
            ..hyperactor::ProcConfig::default()
        },
    )
    .await
    .unwrap();
    let (outsider, _) = stranger.attach("outsider").unwrap();
    let mut refused = Caster::new(&outsider, 16);
    refused.cast(
        hosts.target.clone(),
        "rank",
        vec![],
        CastMode::Gather,
        Duration::from_millis(1500),
    );
    let Some(Outcome::Done { result, .. }) = refused.next().await else {
        panic!("the stranger's cast did not end")
    };
    assert!(
        result.is_err(),
        "a stranger reached a remote proc: {result:?}"
    );
    let mut caster = Caster::new(hosts.client.mailbox(), 2);
    // kill -9 of a proc on host 1.
    let victim = hosts.target.procs[1].clone();
    hosts.client.kill(&victim, libc::SIGKILL).unwrap();
    let reason = loop {
        if let Some(MeshEvent::ProcStopped { proc, reason }) = hosts.events.recv().await {
            assert_eq!(proc, victim);
            caster.proc_died(&proc, &reason);
            break reason;
        }
    };
    assert!(reason.contains("SIGKILL"), "{reason}");
    // A crash by SIGSEGV on host 0.
    let mut only = hosts.target.clone();
    for (i, ranks) in only.ranks.iter_mut().enumerate() {
        if i != 2 {
            ranks.clear();
        }
    }
    let seq = caster.cast(only.clone(), "segfault", vec![], CastMode::Gather, TIMEOUT);
    let Outcome::Done { seq: s, result } = next(&mut hosts, &mut caster).await else {
        panic!("no outcome")
    };
    assert_eq!(s, seq);
    let (_, error) = result.unwrap_err();
    assert!(error.to_string().contains("SIGSEGV"), "{error}");
    // 10,000 casts through a tree across both hosts, around the dead procs.
    let mut live = hosts.target.clone();
    live.ranks[1].clear();
    live.ranks[2].clear();
    for n in 0..10_000u64 {
        caster.cast(
            live.clone(),
            "seq",
            n.to_le_bytes().to_vec(),
            CastMode::Broadcast,
            TIMEOUT,
        );
    }
    let count = caster.cast(
        live.clone(),
        "count",
        vec![],
        CastMode::Reduce(Reducer::MinI64),
        TIMEOUT,
    );
    let check = caster.cast(
        live.clone(),
        "seq",
        10_000u64.to_le_bytes().to_vec(),
        CastMode::Reduce(Reducer::SumI64),
        TIMEOUT,
    );
    let mut results = std::collections::HashMap::new();
    while results.len() < 2 {
        match next(&mut hosts, &mut caster).await {
            Outcome::Done { seq, result } => {
                results.insert(seq, result.unwrap());
            }
            Outcome::Failed { rank, error, .. } => panic!("rank {rank} failed: {error}"),
            _ => {}
        }
    }
    assert_eq!(results[&count], vec![cbor::int(10_000)]);
    assert_eq!(results[&check], vec![cbor::int(0)]);
}

/// `monarch-host run --hosts` runs a program on procs that agents start.
#[test]
fn monarch_host_runs_a_program_on_remote_hosts() {
    if skip() {
        return;
    }
    let net = NetCluster::new(2).expect("namespaces");
    let cli = env!("CARGO_BIN_EXE_monarch-host-cli");
    let dir = std::env::temp_dir().join(format!("mesh-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let args = vec![
                "agent".to_string(),
                "--listen".to_string(),
                format!("{}:7071", net.host_ip(i)),
                "--token-file".to_string(),
                token.display().to_string(),
                // Namespaces on this machine: nobody else reads the traffic.
                "--insecure".to_string(),
            ];
            start_agent_stderr(&net, i, cli, &args)
        })
        .collect();
    let hosts: Vec<String> = agents.iter().map(|a| a.addr.clone()).collect();
    let out = std::process::Command::new(cli)
        .args(["run", env!("GUEST_HELLO"), "--hosts", &hosts.join(",")])
        .arg("--token-file")
        .arg(&token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("hello from rank 3 of 4"), "{stdout}");
    // What actors print on the agents' hosts reaches this terminal,
    // prefixed with mesh and rank (one printer on each host).
    let out = std::process::Command::new(cli)
        .args(["run", env!("GUEST_SEMANTICS"), "--hosts", &hosts.join(",")])
        .arg("--token-file")
        .arg(&token)
        .args(["--", "print"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for line in [
        "[printers 0] hello from 0",
        "[printers 1] err: hello from 1",
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in {stdout}");
    }
    // A wrong token is refused by name.
    std::fs::write(dir.join("wrong"), "nope").unwrap();
    let out = std::process::Command::new(cli)
        .args(["run", env!("GUEST_HELLO"), "--hosts", &hosts.join(",")])
        .arg("--token-file")
        .arg(dir.join("wrong"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cluster token"), "{stderr}");
    std::fs::remove_dir_all(dir).ok();
}

/// Starts `monarch-host agent`, which says where it serves on stderr.
fn start_agent_stderr(net: &NetCluster, i: usize, program: &str, args: &[String]) -> Agent {
    let mut child = net
        .command(i, std::path::Path::new(program))
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host agent");
    let addr = serving_addr(&mut child);
    Agent { child, addr }
}

/// Reads an agent's stderr up to `monarch-host agent: serving on
/// tcp:IP:PORT (node N, monarch-host V)` and returns `IP:PORT`; the rest of
/// its stderr is read and dropped, so that it never blocks on a full pipe.
fn serving_addr(child: &mut Child) -> String {
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving on") {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("the agent ended: {line}");
        }
    }
    std::thread::spawn(move || for _ in stderr.lines() {});
    line.split("serving on tcp:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// A `monarch-host agent` on loopback (no namespace), with `extra` flags.
fn loopback_agent(port: u16, extra: &[&str]) -> Agent {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host agent");
    let addr = serving_addr(&mut child);
    Agent { child, addr }
}

/// RM-6 and PR-7: an agent killed and started again at the same address
/// is a new incarnation. The controller's links to the old one are told
/// so (not refused forever as a sequence gap), the new agent does not know
/// the controller's session, and the host is lost at once, well inside a
/// heartbeat timeout of 20 s, saying the agent restarted.
#[test]
fn an_agent_restarted_at_the_same_address_is_a_lost_host_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut first = loopback_agent(port, &[]);
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["run", "--hosts", &first.addr, "--heartbeat-timeout", "20"])
        .arg(env!("GUEST_SEMANTICS"))
        .args(["--", "sleep-call", "1", "60000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let out = run.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    let (_, line) = lines.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(line.contains("calling 1 sleepers"), "{line}");
    std::thread::sleep(Duration::from_millis(500));
    let _ = first.child.kill();
    let _ = first.child.wait();
    let restarted = Instant::now();
    let _second = loopback_agent(port, &[]);
    let (at, line) = lines
        .recv_timeout(Duration::from_secs(60))
        .expect("the call ended");
    let _ = run.kill();
    let _ = run.wait();
    assert!(line.contains("the call failed"), "{line}");
    assert!(
        line.contains("no longer knows this controller") || line.contains("restarted"),
        "{line}"
    );
    assert!(
        at - restarted < Duration::from_secs(15),
        "{:?}: {line}",
        at - restarted
    );
}

/// An agent with no controller for --idle-exit seconds exits by itself.
#[test]
fn an_idle_agent_exits_after_its_idle_exit() {
    let mut agent = loopback_agent(0, &["--idle-exit", "1"]);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the agent is still up"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(started.elapsed() >= Duration::from_millis(900));
}

/// `monarch-host agent --fork-server`: the procs a controller asks it for
/// are forked by its fork server, and the program runs as without it.
#[test]
fn an_agent_with_a_fork_server_forks_its_procs() {
    use std::io::BufRead;
    let cli = env!("CARGO_BIN_EXE_monarch-host-cli");
    let mut agent = std::process::Command::new(cli)
        .args(["agent", "--listen", "127.0.0.1:0", "--fork-server"])
        .env("RUST_LOG", "warn,hyperactor_mesh::fork=debug,hyperactor_mesh::alloc=debug,hyperactor_mesh::remote=info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host agent");
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = agent.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let addr = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("the agent says where it serves");
        if let Some(rest) = line.split("serving on tcp:").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
    };
    let out = std::process::Command::new(cli)
        .args(["run", env!("GUEST_HELLO"), "--hosts", &addr, "--", "3"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("hello from rank 2 of 3"), "{stdout}");
    // The rest of its log, until its stderr closes (its fork server, which
    // holds it too, dies with it).
    let mut logged = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        logged.push(line);
    }
    assert!(
        logged.iter().any(|l| l.contains("fork server started")),
        "{logged:#?}"
    );
    assert!(
        !logged.iter().any(|l| l.contains("did not fork")),
        "every proc was forked: {logged:#?}"
    );
}
