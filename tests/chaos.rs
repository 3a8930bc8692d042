//! Chaos: a steady stream of calls across three hosts (network namespaces)
//! while procs are killed, hosts are cut off from the bridge and healed,
//! and hosts are paused with SIGSTOP, again and again for a set time.
//!
//! What a user would notice, and what this checks:
//! - CH-1: every call ends, within its timeout, with one outcome per rank:
//!   a reply carrying what was sent, or an error for that rank. None hangs.
//! - CH-2: no rank answers a call twice, and no reply belongs to another
//!   call (a retransmission delivered twice would show here).
//! - CH-3: the mesh recovers: killed procs are replaced by a fresh mesh
//!   when too few ranks are left, and once the faults stop, a call reaches
//!   every rank of the current mesh.
//!
//! The run lasts `MONARCH_CHAOS_SECS` seconds (default 30; `scripts/soak`
//! and longer local runs set more). It prints the seed of its fault
//! schedule (`MONARCH_CHAOS_SEED` replays it) and a summary line that
//! docs/benchmarks.md quotes. It needs root and iproute2; without them it
//! says why and passes, as the other multi-host tests do.

#[path = "support/mesh.rs"]
mod mesh_support;
#[path = "support/netns.rs"]
mod netns;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use hyperactor_mesh::agent::MeshEvent;
use hyperactor_mesh::client::{ActorSpec, MeshClient};
use hyperactor_mesh::remote::Liveness;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError};
use netns::{Agent, NetCluster, mesh_client, start_agent};

const TOKEN: &str = "chaos-test-token";
const HOSTS: usize = 3;
/// Procs of each mesh: two per host.
const PROCS: usize = 6;
/// A call's own timeout; every call must end by then (CH-1).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Calls in flight at once.
const IN_FLIGHT: usize = 6;

/// The mesh-worker agent of host `i`.
fn start_mesh_agent(net: &NetCluster, i: usize) -> Agent {
    let args = [
        "agent".to_string(),
        format!("{}:7070", net.host_ip(i)),
        TOKEN.to_string(),
    ];
    start_agent(net, i, env!("CARGO_BIN_EXE_mesh-worker"), &args)
}

/// What undoes a fault (heals a cut, resumes a paused host).
type Undo = Box<dyn FnOnce(&NetCluster) + Send>;

/// A small deterministic generator for the fault schedule.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One actor mesh of `PROCS` procs over the hosts.
struct Mesh {
    target: CastTarget,
    pids: Vec<u32>,
    /// Ranks whose proc was killed.
    dead: HashSet<u32>,
}

impl Mesh {
    fn live(&self) -> CastTarget {
        let mut target = self.target.clone();
        for (rank, ranks) in target.ranks.iter_mut().enumerate() {
            if self.dead.contains(&(rank as u32)) {
                ranks.clear();
            }
        }
        target
    }
}

async fn spawn_mesh(client: &MeshClient, generation: usize) -> Result<Mesh, String> {
    let allocated = client.spawn_procs(PROCS).await.map_err(|e| e.to_string())?;
    let ids: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let name = format!("echo{generation}");
    let spec = ActorSpec {
        kind: "echo".into(),
        name: name.clone(),
        extent: vec![("procs".into(), PROCS as u32)],
        params: vec![],
        per_proc: 1,
    };
    client
        .spawn_actors(&ids, &spec, Duration::from_secs(10))
        .await?;
    Ok(Mesh {
        target: CastTarget {
            mesh: name,
            procs: ids,
            ranks: (0..PROCS as u32).map(|r| vec![r]).collect(),
        },
        pids: allocated.iter().map(|a| a.pid.unwrap_or(0)).collect(),
        dead: HashSet::new(),
    })
}

/// A call in flight: the ranks it went to and those that answered.
struct Call {
    payload: Vec<u8>,
    expected: HashSet<u32>,
    answered: HashSet<u32>,
    started: Instant,
}

#[derive(Default)]
struct Tally {
    calls: u64,
    replies: u64,
    rank_errors: u64,
    kills: u64,
    partitions: u64,
    pauses: u64,
    respawns: u64,
    errors: HashMap<&'static str, u64>,
}

fn kind(error: &RankError) -> &'static str {
    match error {
        RankError::Endpoint(_) => "endpoint",
        RankError::Failed(_) => "failed",
        RankError::Stopped(_) => "stopped",
        RankError::Lost(_) => "lost",
        RankError::Timeout(_) => "timeout",
        RankError::Invalid(_) => "invalid",
    }
}

/// Sends SIGSTOP or SIGCONT to every process in host `i`'s namespace.
fn signal_host(net: &NetCluster, i: usize, signal: i32) {
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", net.namespace(i)])
        .output()
        .expect("ip netns pids");
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(pid) = pid.parse::<i32>() {
            // SAFETY: kill(2) with a pid read from the kernel just now.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_kills_partitions_and_pauses() {
    if let Some(reason) = NetCluster::unavailable() {
        eprintln!("skipped: {reason}");
        return;
    }
    let secs: u64 = std::env::var("MONARCH_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("MONARCH_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("chaos: {secs} s, seed {seed} (MONARCH_CHAOS_SEED={seed} replays the schedule)");
    let mut rng = Rng(seed);

    let net = NetCluster::new(HOSTS).expect("namespaces");
    let agents: Vec<Agent> = (0..HOSTS).map(|i| start_mesh_agent(&net, i)).collect();
    // A host is lost only past 5 s of silence: the pauses and cuts below
    // last about one second, so they test stalls, not host loss.
    let liveness = Liveness {
        heartbeat: Duration::from_millis(250),
        host_timeout: Duration::from_secs(5),
        keepalive: Duration::from_secs(8),
    };
    let client = mesh_client(&net, &agents, TOKEN, liveness).await;
    let mut events = client.subscribe();
    let mut generation = 0;
    let mut mesh = spawn_mesh(&client, generation)
        .await
        .expect("the first mesh");
    let mut caster = Caster::new(client.mailbox(), 2);

    let mut calls: HashMap<u64, Call> = HashMap::new();
    let mut tally = Tally::default();
    let started = Instant::now();
    let chaos_ends = started + Duration::from_secs(secs);
    let mut next_fault = Instant::now() + Duration::from_millis(800);
    // A fault undone at a time: (when, what).
    let mut undo: Option<(Instant, Undo)> = None;
    let mut round = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(20));

    loop {
        let now = Instant::now();
        let chaos = now < chaos_ends;
        if !chaos && undo.is_none() && calls.is_empty() {
            break;
        }
        assert!(
            now < chaos_ends + CALL_TIMEOUT * 2,
            "calls still in flight {:?} after the faults stopped: {:?}",
            now - chaos_ends,
            calls.keys().collect::<Vec<_>>()
        );
        if let Some((at, _)) = &undo
            && now >= *at
        {
            let (_, heal) = undo.take().unwrap();
            heal(&net);
        }
        // Replace the mesh when too few of its ranks are left (CH-3).
        if mesh.dead.len() > PROCS / 2 && undo.is_none() {
            generation += 1;
            match spawn_mesh(&client, generation).await {
                Ok(fresh) => {
                    tally.respawns += 1;
                    mesh = fresh;
                }
                Err(e) => eprintln!("chaos: respawn {generation} failed, trying again: {e}"),
            }
        }
        if chaos && now >= next_fault && undo.is_none() {
            next_fault = now + Duration::from_millis(700 + rng.below(900) as u64);
            match rng.below(3) {
                0 => {
                    let live: Vec<u32> = (0..PROCS as u32)
                        .filter(|r| !mesh.dead.contains(r))
                        .collect();
                    if let Some(&rank) = live.get(rng.below(live.len().max(1))) {
                        let proc = mesh.target.procs[rank as usize].clone();
                        if client.kill(&proc, libc::SIGKILL).is_ok() {
                            mesh.dead.insert(rank);
                            tally.kills += 1;
                        }
                    }
                }
                1 => {
                    let host = rng.below(HOSTS);
                    net.partition(host).expect("cut a host off");
                    tally.partitions += 1;
                    let heal: Undo =
                        Box::new(move |net: &NetCluster| net.heal(host).expect("heal"));
                    undo = Some((
                        now + Duration::from_millis(400 + rng.below(800) as u64),
                        heal,
                    ));
                }
                _ => {
                    let host = rng.below(HOSTS);
                    signal_host(&net, host, libc::SIGSTOP);
                    tally.pauses += 1;
                    let resume: Undo =
                        Box::new(move |net: &NetCluster| signal_host(net, host, libc::SIGCONT));
                    undo = Some((
                        now + Duration::from_millis(400 + rng.below(800) as u64),
                        resume,
                    ));
                }
            }
        }
        if chaos && calls.len() < IN_FLIGHT {
            round += 1;
            let payload = round.to_le_bytes().to_vec();
            let target = mesh.live();
            let expected: HashSet<u32> = target.ranks.iter().flatten().copied().collect();
            let seq = caster.cast(
                target,
                "echo",
                payload.clone(),
                CastMode::Stream,
                CALL_TIMEOUT,
            );
            tally.calls += 1;
            calls.insert(
                seq,
                Call {
                    payload,
                    expected,
                    answered: HashSet::new(),
                    started: Instant::now(),
                },
            );
        }
        tokio::select! {
            outcome = caster.next(), if !calls.is_empty() => match outcome {
                Some(Outcome::Item { seq, rank, result }) => {
                    let call = calls
                        .get_mut(&seq)
                        .unwrap_or_else(|| panic!("rank {rank} answered call {seq}, which had ended (CH-2)"));
                    assert!(call.expected.contains(&rank), "rank {rank} answered call {seq}, not sent to it");
                    assert!(call.answered.insert(rank), "rank {rank} answered call {seq} twice (CH-2)");
                    match result {
                        Ok(reply) => {
                            assert_eq!(reply, call.payload, "rank {rank} answered call {seq} with another call's reply (CH-2)");
                            tally.replies += 1;
                        }
                        Err(error) => {
                            tally.rank_errors += 1;
                            *tally.errors.entry(kind(&error)).or_default() += 1;
                        }
                    }
                }
                Some(Outcome::End { seq }) => {
                    let call = calls.remove(&seq).expect("an end for a call in flight");
                    assert_eq!(
                        call.answered, call.expected,
                        "call {seq} ended without an outcome for every rank (CH-1)"
                    );
                    assert!(
                        call.started.elapsed() <= CALL_TIMEOUT + Duration::from_secs(3),
                        "call {seq} took {:?}, past its timeout (CH-1)",
                        call.started.elapsed()
                    );
                }
                Some(other) => panic!("unexpected outcome {other:?}"),
                None => panic!("the caster has nothing in flight, but {} calls are", calls.len()),
            },
            Some(event) = events.recv() => {
                if let MeshEvent::ProcStopped { proc, reason } = event {
                    caster.proc_died(&proc, &reason);
                    if let Some(rank) = mesh.target.procs.iter().position(|p| *p == proc) {
                        mesh.dead.insert(rank as u32);
                    }
                }
            }
            _ = tick.tick() => {}
        }
    }

    // CH-3: with the faults over, a call reaches every live rank.
    let target = mesh.live();
    let live = target.ranks.iter().flatten().count();
    let seq = caster.cast(
        target,
        "echo",
        b"after".to_vec(),
        CastMode::Gather,
        CALL_TIMEOUT,
    );
    let outcome = mesh_support::next_outcome(&mut events, &mut caster, CALL_TIMEOUT * 2).await;
    let Outcome::Done { seq: done, result } = outcome else {
        panic!("the last call ended with {outcome:?}")
    };
    assert_eq!(done, seq);
    let replies =
        result.unwrap_or_else(|(rank, e)| panic!("rank {rank} failed after the faults: {e}"));
    assert_eq!(replies.len(), live);
    assert!(
        tally.kills + tally.partitions + tally.pauses > 0,
        "no fault was injected"
    );
    assert!(tally.replies > 0, "no call was answered");
    let mut errors: Vec<_> = tally.errors.iter().collect();
    errors.sort();
    println!(
        "chaos summary: {secs} s, seed {seed}: {} faults ({} kills, {} partitions, {} pauses), {} mesh respawns; {} calls: {} rank replies, {} rank errors {:?}; 0 calls lost, 0 answered twice; mesh pids {:?}",
        tally.kills + tally.partitions + tally.pauses,
        tally.kills,
        tally.partitions,
        tally.pauses,
        tally.respawns,
        tally.calls,
        tally.replies,
        tally.rank_errors,
        errors,
        mesh.pids,
    );
    drop(agents);
}
