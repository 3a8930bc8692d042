//! Faults between OS processes: a receiver killed mid-stream, and bad frames
//! thrown at a proc's listener.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hyperactor::testing::{Echo, Sleep};
use hyperactor::{CallError, ChannelAddr, DeliveryFailure, ProcConfig};
use support::{Worker, client_proc};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Killing the receiving process mid-stream: every call ends, with its reply
/// or with an error; none hangs and none is dropped without a word. Calls
/// already handed to the dead process and calls sent after its death both
/// fail with `Unreachable` once the delivery timeout passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_receiver_mid_stream_ends_every_call() {
    let mut worker = Worker::unix().await;
    let delivery_timeout = Duration::from_millis(1000);
    let proc = client_proc(
        &worker,
        ProcConfig {
            delivery_timeout,
            call_timeout: Duration::from_secs(60),
            ..ProcConfig::default()
        },
    )
    .await;
    let (client, mut returned) = proc.attach("client").unwrap();
    let echo = worker.echo(0);

    // Batch A: slow calls, so that most are still queued in the worker when it dies.
    const A: usize = 2000;
    let mut batch_a: FuturesUnordered<_> = (0..A)
        .map(|_| {
            let echo = echo.clone();
            let client = client.clone();
            async move { echo.call(&client, |reply| Sleep { millis: 1, reply }).await }
        })
        .collect();
    let mut ok_a = 0;
    while ok_a < 50 {
        batch_a.next().await.unwrap().unwrap();
        ok_a += 1;
    }
    worker.kill().await;
    let killed_at = Instant::now();

    // Batch B: sent after the kill, never acknowledged.
    const B: usize = 500;
    let batch_b: FuturesUnordered<_> = (0..B)
        .map(|i| {
            let echo = echo.clone();
            let client = client.clone();
            async move {
                echo.call(&client, |reply| Echo {
                    payload: vec![i as u8],
                    reply,
                })
                .await
            }
        })
        .collect();

    let results_a: Vec<_> =
        tokio::time::timeout(Duration::from_secs(20), batch_a.collect::<Vec<_>>())
            .await
            .expect("no call of batch A hangs");
    let results_b: Vec<_> =
        tokio::time::timeout(Duration::from_secs(20), batch_b.collect::<Vec<_>>())
            .await
            .expect("no call of batch B hangs");
    assert!(
        killed_at.elapsed() < delivery_timeout * 10,
        "failures arrive within a few delivery timeouts"
    );

    let mut failed_a = 0;
    for result in results_a {
        match result {
            Ok(()) => ok_a += 1,
            Err(CallError::Undeliverable(DeliveryFailure::Unreachable { .. })) => failed_a += 1,
            Err(other) => panic!("unexpected error for a call to a killed proc: {other}"),
        }
    }
    assert_eq!(ok_a + failed_a, A, "every call of batch A ended");
    assert!(failed_a > 0, "some calls were pending when the worker died");
    for result in &results_b {
        assert!(
            matches!(
                result,
                Err(CallError::Undeliverable(
                    DeliveryFailure::Unreachable { .. }
                ))
            ),
            "a call sent after the kill fails as unreachable: {result:?}"
        );
    }
    // The unacknowledged requests also came back to the sender's mailbox.
    let mut notices = 0;
    while let Ok(undeliverable) = returned.try_recv() {
        assert!(matches!(
            undeliverable.reason,
            DeliveryFailure::Unreachable { .. }
        ));
        notices += 1;
    }
    assert!(
        notices >= B,
        "each unacknowledged request was returned ({notices} < {B})"
    );
}

/// A frame header as the protocol defines it (see hyperactor's `channel::frame`).
fn header(len: u32, kind: u8, seq: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&0x484du16.to_le_bytes());
    // This build's version: a frame of another is refused at its header,
    // before any of the faults below could be reached.
    h.push(hyperactor::channel::PROTOCOL_VERSION);
    h.push(kind);
    h.extend_from_slice(&seq.to_le_bytes());
    h
}

/// A hello frame; bodies are padded to a multiple of 16 bytes.
fn hello(session: u64) -> Vec<u8> {
    let mut frame = header(8, 1, session);
    frame.extend_from_slice(b"attacker");
    frame.extend_from_slice(&[0u8; 8]);
    frame
}

/// Pseudo-random bytes, reproducible.
fn noise(len: usize, mut state: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

enum Stream {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn connect(addr: &ChannelAddr) -> Stream {
    match addr {
        ChannelAddr::Unix(path) => {
            Stream::Unix(tokio::net::UnixStream::connect(path).await.unwrap())
        }
        ChannelAddr::Tcp(sock) => Stream::Tcp(tokio::net::TcpStream::connect(sock).await.unwrap()),
        ChannelAddr::Local(_) => unreachable!("workers serve unix or tcp"),
    }
}

/// Sends `bytes` (then half-closes when `finish`), and waits for the proc to
/// close the connection. Returns whether it closed within the deadline.
async fn closed_after(addr: &ChannelAddr, bytes: &[u8], finish: bool) -> bool {
    async fn run<S: AsyncReadExt + AsyncWriteExt + Unpin>(
        mut s: S,
        bytes: &[u8],
        finish: bool,
    ) -> bool {
        // The proc may close before it has read everything; a failed write is fine.
        let _ = s.write_all(bytes).await;
        if finish {
            let _ = s.shutdown().await;
        }
        let mut buf = [0u8; 256];
        let closed = async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {} // acknowledgements
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), closed)
            .await
            .is_ok()
    }
    match connect(addr).await {
        Stream::Unix(s) => run(s, bytes, finish).await,
        Stream::Tcp(s) => run(s, bytes, finish).await,
    }
}

/// PR-2: each kind of bad frame closes its connection, the proc does not
/// panic, and a well-behaved connection carries calls before, between and
/// after them.
async fn bad_frames_close_only_their_connection(worker: Worker) {
    let proc = client_proc(
        &worker,
        ProcConfig {
            delivery_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(10),
            ..ProcConfig::default()
        },
    )
    .await;
    let (client, _) = proc.attach("client").unwrap();
    let echo = worker.echo(0);
    let check_alive = |round: u8| {
        let echo = echo.clone();
        let client = client.clone();
        async move {
            let reply = echo
                .call(&client, |reply| Echo {
                    payload: vec![round; 64],
                    reply,
                })
                .await
                .expect("a well-behaved connection still works");
            assert_eq!(reply, vec![round; 64]);
        }
    };
    check_alive(0).await;

    let mut truncated = hello(1);
    truncated.extend_from_slice(&header(1024, 2, 1));
    truncated.extend_from_slice(&[0u8; 100]);

    let mut oversized = hello(2);
    oversized.extend_from_slice(&header(u32::MAX, 2, 1));

    let mut misaligned = hello(3);
    misaligned.extend_from_slice(&header(12, 2, 1));
    misaligned.extend_from_slice(&[0u8; 16]);

    let mut invalid_archive = hello(4);
    invalid_archive.extend_from_slice(&header(256, 2, 1));
    invalid_archive.extend_from_slice(&noise(256, 99));

    let mut data_before_hello = header(64, 2, 1);
    data_before_hello.extend_from_slice(&[0u8; 64]);

    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("random bytes", noise(4096, 7), false),
        ("truncated frame", truncated, true),
        ("oversized length", oversized, false),
        ("misaligned body", misaligned, false),
        ("invalid archive", invalid_archive, false),
        ("data before hello", data_before_hello, false),
    ];
    for (round, (name, bytes, finish)) in cases.into_iter().enumerate() {
        assert!(
            closed_after(worker.addr(), &bytes, finish).await,
            "the proc closed the connection after a {name}"
        );
        check_alive(round as u8 + 1).await;
    }
    // Many garbage connections at once do not disturb the good one.
    let storms = (0..20u64).map(|i| {
        let addr = worker.addr().clone();
        async move { closed_after(&addr, &noise(1 << 16, i + 1), false).await }
    });
    let calls = futures::future::join_all((0..20u8).map(check_alive));
    let (closed, _) = tokio::join!(futures::future::join_all(storms), calls);
    assert!(closed.into_iter().all(|c| c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_their_connection_over_unix() {
    bad_frames_close_only_their_connection(Worker::unix().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_close_only_their_connection_over_tcp() {
    bad_frames_close_only_their_connection(Worker::tcp().await).await;
}
