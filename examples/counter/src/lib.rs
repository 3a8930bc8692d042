//! counter: errors are values. Three `Counter` actors; the controller
//!
//! 1. adds to all of them,
//! 2. sends one a negative amount, which its endpoint refuses with a typed
//!    error (`ValueError`): a call error of kind `endpoint`, and the actor
//!    lives on,
//! 3. makes another panic: its instance traps, the actor fails, and the
//!    call ends with an error of kind `trap` naming the actor and endpoint,
//! 4. carries on: the other counters still answer, a call to the whole
//!    mesh names the failed rank, and a new mesh on the same procs works.
//!
//! Its tests (`monarch-host test counter.wasm`) check the same, one case
//! per test.

use monarch_guest::prelude::*;
use monarch_guest::take_failures;
use serde::{Deserialize, Serialize};

/// `add`: adds a non-negative amount; replies with the new total.
#[derive(Serialize, Deserialize)]
struct Add(i64);

impl Message for Add {
    const ENDPOINT: &'static str = "add";
    type Reply = i64;
}

/// `get`: replies with the total.
#[derive(Serialize, Deserialize)]
struct Get;

impl Message for Get {
    const ENDPOINT: &'static str = "get";
    type Reply = i64;
}

/// `crash`: panics, which traps the actor's instance.
#[derive(Serialize, Deserialize)]
struct Crash;

impl Message for Crash {
    const ENDPOINT: &'static str = "crash";
    type Reply = ();
}

struct Counter {
    total: i64,
}

impl Actor for Counter {
    const CLASS: &'static str = "Counter";
    type Init = i64;

    fn create(start: i64, _cx: &Context) -> Result<Self, String> {
        Ok(Counter { total: start })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints.handle::<Add>().handle::<Get>().handle::<Crash>();
    }
}

impl Handler<Add> for Counter {
    async fn handle(&mut self, _cx: &Context, Add(amount): Add) -> Result<i64, EndpointError> {
        if amount < 0 {
            let why = format!("cannot add {amount}: counters only count up");
            return Err(EndpointError::new(why).with_type("ValueError"));
        }
        self.total += amount;
        Ok(self.total)
    }
}

impl Handler<Get> for Counter {
    async fn handle(&mut self, _cx: &Context, _: Get) -> Result<i64, EndpointError> {
        Ok(self.total)
    }
}

impl Handler<Crash> for Counter {
    async fn handle(&mut self, cx: &Context, _: Crash) -> Result<(), EndpointError> {
        panic!("counter {} was asked to crash", cx.rank());
    }
}

async fn main(_args: Vec<String>) -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 3))?;
    let counters = procs.spawn::<Counter>("counters", &0)?;

    info!("step 1: add 5 to every counter");
    for (rank, total) in counters.call(&Add(5)).await?.iter() {
        info!("  counter {rank}: {total}");
    }

    info!("step 2: add -1 to counter 1");
    match counters.at("procs", 1)?.call_one(&Add(-1)).await {
        Err(err) if err.kind() == ErrorKind::Endpoint => {
            info!("  kind {}: {err}", err.kind());
            info!(
                "  type {}, message: {}",
                err.type_name().unwrap_or("-"),
                err.message()
            );
        }
        other => return Err(format!("expected an endpoint error, got {other:?}")),
    }
    let total = counters.at("procs", 1)?.call_one(&Get).await?;
    info!("  counter 1 lives on, still at {total}");

    // A failed counter is expected from here on: handle failures by
    // carrying on (without a supervisor, the first one would end `main`).
    monarch_guest::supervise(|failure| {
        info!("  supervisor: {failure}; carrying on");
        true
    });
    info!("step 3: crash counter 2");
    match counters.at("procs", 2)?.call_one(&Crash).await {
        Err(err) if err.kind() == ErrorKind::Trap => info!("  kind {}: {err}", err.kind()),
        other => return Err(format!("expected a trap, got {other:?}")),
    }

    info!("step 4: carry on");
    let total = counters.at("procs", 0)?.call_one(&Add(10)).await?;
    info!("  counter 0 still counts: {total}");
    match counters.call(&Get).await {
        Err(err) => info!("  a call to the whole mesh fails: {err}"),
        Ok(totals) => info!("  a call to the whole mesh answered: {:?}", totals.values()),
    }
    // A stream reports each rank on its own; sort by rank for a stable printout.
    let mut replies: Vec<_> = counters.stream(&Get).collect().await;
    replies.sort_by_key(|(rank, _)| *rank);
    for (rank, reply) in replies {
        match reply {
            Ok(total) => info!("  stream: counter {rank} at {total}"),
            Err(err) => info!("  stream: counter {rank}: {err}"),
        }
    }
    let fresh = procs.spawn::<Counter>("fresh-counters", &100)?;
    info!(
        "  a new mesh on the same procs sums to {}",
        fresh.sum_i64(&Get).await?
    );

    for failure in take_failures() {
        info!("  failure reported to the controller: {failure}");
    }
    procs.stop();
    Ok(())
}

// The tests: `monarch-host test counter.wasm` runs each on a cluster of its
// own, as the controller.

#[monarch_guest::test]
async fn counters_count_on_a_mesh() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 3))?;
    let counters = procs.spawn::<Counter>("counters", &1)?;
    assert_eq!(counters.call(&Add(5)).await?.values(), [6, 6, 6]);
    assert_eq!(counters.at("procs", 1)?.call_one(&Add(4)).await?, 10);
    assert_eq!(counters.call(&Get).await?.values(), [6, 10, 6]);
    assert_eq!(counters.sum_i64(&Get).await?, 22);
    procs.stop();
    Ok(())
}

#[monarch_guest::test]
async fn a_refused_amount_is_an_endpoint_error() -> Result<(), String> {
    let procs = spawn_procs(&extent!(procs = 2))?;
    let counters = procs.spawn::<Counter>("counters", &3)?;
    let counter = counters.at("procs", 1)?;
    let err = match counter.call_one(&Add(-1)).await {
        Err(err) => err,
        Ok(total) => return Err(format!("adding -1 was accepted: the total is {total}")),
    };
    assert_eq!(err.kind(), ErrorKind::Endpoint, "{err}");
    assert_eq!(err.type_name(), Some("ValueError"), "{err}");
    assert_eq!(err.message(), "cannot add -1: counters only count up");
    assert_eq!(err.rank(), Some(1), "{err}");
    // The counter refused the amount and lives on, unchanged.
    assert_eq!(counter.call_one(&Get).await?, 3);
    procs.stop();
    Ok(())
}

#[monarch_guest::test]
async fn a_trapped_counter_is_reported_and_the_rest_carry_on() -> Result<(), String> {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    let procs = spawn_procs(&extent!(procs = 3))?;
    let counters = procs.spawn::<Counter>("counters", &0)?;
    let failures = Rc::new(RefCell::new(Vec::new()));
    let seen = Rc::clone(&failures);
    monarch_guest::supervise(move |failure| {
        seen.borrow_mut().push(failure.clone());
        true
    });

    let err = match counters.at("procs", 2)?.call_one(&Crash).await {
        Err(err) => err,
        Ok(()) => return Err("counter 2 was asked to crash and did not".into()),
    };
    assert_eq!(err.kind(), ErrorKind::Trap, "{err}");
    assert_eq!(err.rank(), Some(2), "{err}");

    // The rest carry on, and a new mesh on the same procs works.
    assert_eq!(counters.at("procs", 0)?.call_one(&Add(10)).await?, 10);
    let fresh = procs.spawn::<Counter>("fresh-counters", &100)?;
    assert_eq!(fresh.sum_i64(&Get).await?, 300);

    // The supervisor hears of the trap once; the event may come after the
    // call's error, so wait for it (a bounded while).
    let deadline = Instant::now() + Duration::from_secs(10);
    while failures.borrow().is_empty() && Instant::now() < deadline {
        sleep(Duration::from_millis(50)).await;
    }
    let failures = failures.borrow();
    let [failure] = failures.as_slice() else {
        return Err(format!(
            "expected one failure reported, got {}: {failures:?}",
            failures.len()
        ));
    };
    assert_eq!(
        (failure.mesh.as_str(), failure.rank, failure.kind),
        ("counters", 2, ErrorKind::Trap),
        "{failure}"
    );
    procs.stop();
    Ok(())
}

/// A crashed proc takes its counter with it: the program hears of it,
/// the other counters keep their counts, and a fresh proc mesh takes the
/// lost one's place, restarted from what the survivors hold.
#[monarch_guest::test]
async fn a_killed_rank_is_reported_and_the_mesh_recovers() -> Result<(), String> {
    use std::time::Duration;

    use monarch_guest::faults::{self, KillMode};
    use monarch_guest::{next_failure, timeout};

    let procs = spawn_procs(&extent!(procs = 3))?;
    let counters = procs.spawn::<Counter>("counters", &0)?;
    assert_eq!(counters.call(&Add(7)).await?.values(), [7, 7, 7]);

    faults::kill(&procs, 1, KillMode::Crash)?;
    let failure = timeout(Duration::from_secs(20), next_failure())
        .await
        .map_err(|_| "the lost counter was not reported within 20 s")?;
    assert_eq!(
        (failure.mesh.as_str(), failure.rank, failure.kind),
        ("counters", 1, ErrorKind::ProcLost),
        "{failure}"
    );
    let err = counters.at("procs", 1)?.call_one(&Get).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ProcLost, "{err}");

    // Recovery: the survivors' count seeds a fresh mesh on fresh procs.
    let survivor = counters.at("procs", 0)?.call_one(&Get).await?;
    let fresh_procs = spawn_procs(&extent!(procs = 3))?;
    let fresh = fresh_procs.spawn::<Counter>("counters-2", &survivor)?;
    assert_eq!(fresh.call(&Add(1)).await?.values(), [8, 8, 8]);
    procs.stop();
    fresh_procs.stop();
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Counter],
}
