//! Tests that make faults on purpose (`monarch_guest::faults`) and check
//! that the program sees each as it would see the real one. Run with
//! `monarch-host test faults.wasm` (tests/test_runner.rs).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use monarch_guest::faults::{self, KillMode};
use monarch_guest::prelude::*;
use monarch_guest::{SupervisionFailure, next_failure, set_call_timeout, timeout};
use serde::{Deserialize, Serialize};

/// Asks a node for its rank.
#[derive(Serialize, Deserialize)]
struct Rank;

impl Message for Rank {
    const ENDPOINT: &'static str = "rank";
    type Reply = u32;
}

/// Asks a node to ask its peer at `to` for its rank; the reply is how
/// long that took, in milliseconds.
#[derive(Serialize, Deserialize)]
struct Ask {
    peers: MeshRef<Node>,
    to: u32,
}

impl Message for Ask {
    const ENDPOINT: &'static str = "ask";
    type Reply = u64;
}

struct Node {
    rank: u32,
}

impl Actor for Node {
    const CLASS: &'static str = "Node";
    type Init = ();

    fn create((): (), cx: &Context) -> Result<Self, String> {
        Ok(Node { rank: cx.rank() })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Rank>().handle::<Ask>();
    }
}

impl Handler<Rank> for Node {
    async fn handle(&mut self, _cx: &Context, _: Rank) -> Result<u32, EndpointError> {
        Ok(self.rank)
    }
}

impl Handler<Ask> for Node {
    async fn handle(&mut self, _cx: &Context, ask: Ask) -> Result<u64, EndpointError> {
        let peer = ask.peers.resolve()?.at("procs", ask.to)?;
        let started = Instant::now();
        let rank = peer.call_one(&Rank).await?;
        if rank != ask.to {
            return Err(format!("asked rank {} and rank {rank} answered", ask.to).into());
        }
        Ok(started.elapsed().as_millis() as u64)
    }
}

/// The next failure the program hears of, within 20 s.
async fn failure() -> Result<SupervisionFailure, String> {
    timeout(Duration::from_secs(20), next_failure())
        .await
        .map_err(|_| "no failure was reported within 20 s".to_string())
}

#[monarch_guest::test]
async fn a_crash_is_proc_lost_and_a_fresh_mesh_recovers() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 3))?;
    let nodes = procs.spawn::<Node>("nodes", &())?;
    faults::kill(&procs, 1, KillMode::Crash)?;
    let lost = failure().await?;
    assert_eq!((lost.mesh.as_str(), lost.rank), ("nodes", 1), "{lost}");
    assert_eq!(lost.kind, ErrorKind::ProcLost, "{lost}");
    assert!(lost.reason.contains("signal 9"), "{lost}");
    // A call to it fails at once with the same kind; the others answer.
    let err = nodes.at("procs", 1)?.call_one(&Rank).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ProcLost, "{err}");
    assert_eq!(nodes.at("procs", 2)?.call_one(&Rank).await?, 2);
    // A rank that has ended cannot be faulted again.
    let again = faults::kill(&procs, 1, KillMode::Crash).unwrap_err();
    assert!(again.reason().contains("has ended"), "{again}");
    // Recovery: a fresh proc mesh takes the lost one's place.
    let fresh = spawn_procs(&extent!(procs = 3))?.spawn::<Node>("fresh", &())?;
    assert_eq!(fresh.call(&Rank).await?.values(), [0, 1, 2]);
    Ok(())
}

#[monarch_guest::test]
async fn an_exit_is_proc_lost_with_its_status() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 2))?;
    let nodes = procs.spawn::<Node>("nodes", &())?;
    faults::kill(&procs, 0, KillMode::Exit)?;
    let lost = failure().await?;
    assert_eq!((lost.rank, lost.kind), (0, ErrorKind::ProcLost), "{lost}");
    assert!(lost.reason.contains("exited with code 0"), "{lost}");
    assert_eq!(nodes.at("procs", 1)?.call_one(&Rank).await?, 1);
    Ok(())
}

#[monarch_guest::test]
async fn a_lost_host_takes_every_proc_on_it() -> Result<(), String> {
    let first = spawn_procs(&extent!(procs = 2))?;
    let second = spawn_procs(&extent!(procs = 1))?;
    let _a = first.spawn::<Node>("a", &())?;
    let _b = second.spawn::<Node>("b", &())?;
    // The three failures come together: a supervisor takes each.
    let seen = Rc::new(RefCell::new(Vec::new()));
    let sink = Rc::clone(&seen);
    monarch_guest::supervise(move |failure| {
        sink.borrow_mut().push(failure.clone());
        true
    });
    // Every proc of this test runs on this machine: one host.
    faults::kill(&first, 1, KillMode::HostLost)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.borrow().len() < 3 && Instant::now() < deadline {
        sleep(Duration::from_millis(20)).await;
    }
    let mut lost = Vec::new();
    for failure in seen.borrow().iter() {
        assert_eq!(failure.kind, ErrorKind::ProcLost, "{failure}");
        assert!(failure.reason.contains("lost with its host"), "{failure}");
        lost.push((failure.mesh.clone(), failure.rank));
    }
    lost.sort();
    assert_eq!(lost, [("a".into(), 0), ("a".into(), 1), ("b".into(), 0)]);
    Ok(())
}

#[monarch_guest::test]
async fn a_delay_between_two_ranks_slows_their_calls_until_it_ends() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 2))?;
    let nodes = procs.spawn::<Node>("nodes", &())?;
    let ask = Ask {
        peers: nodes.to_ref(),
        to: 1,
    };
    let zero = nodes.at("procs", 0)?;
    zero.call_one(&ask).await?;
    faults::delay(
        &procs,
        0,
        1,
        Duration::from_secs(1),
        Duration::from_secs(60),
    )?;
    // The request waits 1 s one way, the reply 1 s the other.
    let took = zero.call_one(&ask).await?;
    assert!(took >= 2000, "a delayed round trip took {took} ms");
    // The controller's own calls are not delayed.
    let started = Instant::now();
    assert_eq!(nodes.at("procs", 1)?.call_one(&Rank).await?, 1);
    assert!(started.elapsed() < Duration::from_secs(1));
    faults::heal(&procs)?;
    let took = zero.call_one(&ask).await?;
    assert!(took < 1000, "a healed round trip took {took} ms");
    Ok(())
}

#[monarch_guest::test]
async fn dropped_messages_arrive_once_the_network_is_back() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 2))?;
    let nodes = procs.spawn::<Node>("nodes", &())?;
    let ask = Ask {
        peers: nodes.to_ref(),
        to: 0,
    };
    let one = nodes.at("procs", 1)?;
    one.call_one(&ask).await?;
    faults::drop_messages(&procs, 0, 1, Duration::from_millis(1500))?;
    let took = one.call_one(&ask).await?;
    assert!(took >= 1300, "the call went through a cut in {took} ms");
    Ok(())
}

#[monarch_guest::test]
async fn a_partitioned_rank_times_out_then_answers_once_healed() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 3))?;
    let nodes = procs.spawn::<Node>("nodes", &())?;
    faults::partition(&procs, &[2], Duration::from_secs(60))?;
    set_call_timeout(Duration::from_secs(3));
    let err = nodes.at("procs", 2)?.call_one(&Rank).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // The majority side carries on, among itself too.
    assert_eq!(nodes.at("procs", 0)?.call_one(&Rank).await?, 0);
    let ask = Ask {
        peers: nodes.to_ref(),
        to: 1,
    };
    nodes.at("procs", 0)?.call_one(&ask).await?;
    faults::heal(&procs)?;
    set_call_timeout(Duration::from_secs(10));
    assert_eq!(nodes.at("procs", 2)?.call_one(&Rank).await?, 2);
    Ok(())
}

#[monarch_guest::test]
async fn faults_outside_the_mesh_are_refused_by_name() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 2))?;
    let err = faults::kill(&procs, 5, KillMode::Crash).unwrap_err();
    assert!(err.reason().contains("rank 5 is outside"), "{err}");
    let err = faults::partition(&procs, &[0, 9], Duration::from_secs(1)).unwrap_err();
    assert!(err.reason().contains("rank 9 is outside"), "{err}");
    let err = faults::delay(
        &procs,
        0,
        1,
        Duration::from_secs(1),
        Duration::from_secs(100_000),
    )
    .unwrap_err();
    assert!(err.reason().contains("longer than a day"), "{err}");
    Ok(())
}

async fn main(_args: Vec<String>) -> Result<(), String> {
    info!("faults has only tests: run them with `monarch-host test faults.wasm`");
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Node],
}
