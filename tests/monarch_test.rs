//! `monarch-test`: a component's actors under native `cargo test`, the way
//! a user tests their program from Rust. The counter example's classes are
//! spawned on an in-process cluster and called with typed payloads; an
//! endpoint error, a killed proc and a partition are seen as a guest
//! controller sees them.

use std::time::{Duration, Instant};

use monarch_test::{ErrorKind, KillMode, Program};
use serde::Serialize;

/// The counter example's `add` message: a newtype, as the Rust SDK
/// writes it.
#[derive(Serialize)]
struct Add(i64);

/// Its `get` message.
#[derive(Serialize)]
struct Get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_components_actors_are_called_faulted_and_watched_from_native_code() {
    let program = Program::load(env!("GUEST_COUNTER")).expect("the counter example loads");
    let mut cluster = program.cluster().await.expect("a cluster");
    let procs = cluster.spawn_procs(&[("procs", 3)]).await.unwrap();
    let counters = cluster
        .spawn(&procs, "counters", "Counter", &1i64)
        .await
        .unwrap();

    // Typed calls: every rank, then one.
    let totals: Vec<i64> = cluster.call(&counters, "add", &Add(5)).await.unwrap();
    assert_eq!(totals, [6, 6, 6]);
    let one: i64 = cluster
        .call_one(&counters, 1, "add", &Add(4))
        .await
        .unwrap();
    assert_eq!(one, 10);
    let all: Vec<i64> = cluster.call(&counters, "get", &Get).await.unwrap();
    assert_eq!(all, [6, 10, 6]);

    // An endpoint's error keeps its kind, type and message.
    let refused = cluster
        .call_one::<_, i64>(&counters, 0, "add", &Add(-1))
        .await
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::Endpoint, "{refused:?}");
    assert_eq!(refused.type_name.as_deref(), Some("ValueError"));
    assert!(refused.message.contains("cannot add -1"), "{refused:?}");

    // A reply of another type is an error, not a guess.
    let wrong = cluster
        .call_one::<_, String>(&counters, 0, "get", &Get)
        .await
        .unwrap_err();
    assert_eq!(wrong.kind, ErrorKind::Invalid, "{wrong:?}");

    // A partition holds calls to the cut-off rank until it heals.
    cluster
        .partition(&procs, &[2], Duration::from_millis(800))
        .await
        .unwrap();
    let started = Instant::now();
    let held: i64 = cluster.call_one(&counters, 2, "get", &Get).await.unwrap();
    assert_eq!(held, 6);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );

    // A killed proc is a failure event of kind proc-lost, and calls to
    // its rank fail the same way.
    cluster.kill(&procs, 2, KillMode::Crash).await.unwrap();
    let failure = cluster
        .next_failure(Duration::from_secs(20))
        .await
        .expect("the lost counter is reported");
    assert_eq!(
        (failure.mesh.as_str(), failure.rank, failure.kind),
        ("counters", 2, ErrorKind::ProcLost),
        "{failure:?}"
    );
    let lost = cluster
        .call_one::<_, i64>(&counters, 2, "get", &Get)
        .await
        .unwrap_err();
    assert_eq!(lost.kind, ErrorKind::ProcLost, "{lost:?}");

    // Bad requests are refused by name.
    let outside = cluster
        .call_one::<_, i64>(&counters, 7, "get", &Get)
        .await
        .unwrap_err();
    assert!(outside.message.contains("rank 7 is outside"), "{outside:?}");
    let fresh = cluster.spawn_procs(&[("procs", 1)]).await.unwrap();
    let unknown = cluster
        .spawn(&fresh, "nobody", "NoSuchClass", &())
        .await
        .unwrap_err();
    assert!(unknown.contains("NoSuchClass"), "{unknown}");
    cluster.stop().await;
}
