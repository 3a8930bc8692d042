//! Procs in two OS processes, over Unix sockets and TCP: calls, order across
//! a forced reconnect, and supervision of a panicking remote actor.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use hyperactor::testing::{Echo, Numbered, Panic, StreamReport};
use hyperactor::{CallError, ProcConfig};
use support::{Worker, client_proc};

fn config() -> ProcConfig {
    ProcConfig {
        delivery_timeout: Duration::from_secs(10),
        call_timeout: Duration::from_secs(30),
        ..ProcConfig::default()
    }
}

async fn calls_round_trip(worker: Worker) {
    let proc = client_proc(&worker, config()).await;
    let (client, _) = proc.attach("client").unwrap();
    // The reply port travels inside the request to the other process and
    // works from there.
    for i in 0..100u32 {
        let payload = i.to_le_bytes().repeat(16);
        let reply = worker
            .echo(i % 2)
            .call(&client, |reply| Echo {
                payload: payload.clone(),
                reply,
            })
            .await
            .unwrap();
        assert_eq!(reply, payload);
    }
    // Many calls in flight at once all come back, each with its own reply.
    let calls = (0..1000u32).map(|i| {
        let echo = worker.echo(0);
        let client = client.clone();
        async move {
            let reply = echo
                .call(&client, |reply| Echo {
                    payload: i.to_le_bytes().to_vec(),
                    reply,
                })
                .await
                .unwrap();
            assert_eq!(reply, i.to_le_bytes());
        }
    });
    futures::future::join_all(calls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_talk_over_unix() {
    calls_round_trip(Worker::unix().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_talk_over_tcp() {
    calls_round_trip(Worker::tcp().await).await;
}

/// PR-1 and LK-2: 100,000 messages from one sender to one receiver arrive
/// once each and in order, although every connection is dropped mid-stream.
async fn order_across_a_forced_reconnect(worker: Worker) {
    let proc = client_proc(&worker, config()).await;
    let (client, _) = proc.attach("client").unwrap();
    let echo = worker.echo(0);
    const N: u64 = 100_000;
    for seq in 0..N {
        echo.send(&client, Numbered { stream: 7, seq });
        if seq == N / 2 {
            proc.reset_links();
        }
        if seq % 10_000 == 0 {
            // Let the link task run, so the reset meets a live connection
            // with frames in flight.
            tokio::task::yield_now().await;
        }
    }
    let stats = echo
        .call(&client, |reply| StreamReport { stream: 7, reply })
        .await
        .unwrap();
    assert_eq!(stats.received, N, "every message arrives exactly once");
    assert_eq!(stats.out_of_order, 0, "in order");
    let channel = proc.stats();
    assert!(
        channel.reconnects.load(Ordering::Relaxed) >= 1,
        "the link reconnected"
    );
    assert!(
        channel.retransmitted.load(Ordering::Relaxed) > 0,
        "unacknowledged messages were written again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_holds_across_a_forced_reconnect_over_unix() {
    order_across_a_forced_reconnect(Worker::unix().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_holds_across_a_forced_reconnect_over_tcp() {
    order_across_a_forced_reconnect(Worker::tcp().await).await;
}

/// AC-3 across processes: the panicking actor fails, its caller gets the
/// supervision event, and the proc and its other actors live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_panic_fails_the_call_and_the_proc_lives() {
    let worker = Worker::unix().await;
    let proc = client_proc(&worker, config()).await;
    let (client, _) = proc.attach("client").unwrap();
    let err = worker
        .echo(0)
        .call(&client, |reply| Panic {
            text: "remote boom".into(),
            reply,
        })
        .await
        .unwrap_err();
    let CallError::Supervision(event) = err else {
        panic!("expected a supervision error, got {err}")
    };
    assert_eq!(event.actor_id, *worker.echo(0).actor_id());
    assert!(event.reason.contains("remote boom"), "{event}");
    assert!(event.message.as_deref().unwrap_or("").ends_with("Panic"));

    let again = worker
        .echo(0)
        .call(&client, |reply| Echo {
            payload: vec![1],
            reply,
        })
        .await
        .unwrap_err();
    assert_eq!(again, CallError::Supervision(event));

    let alive = worker
        .echo(1)
        .call(&client, |reply| Echo {
            payload: vec![2],
            reply,
        })
        .await
        .unwrap();
    assert_eq!(alive, vec![2]);
}
