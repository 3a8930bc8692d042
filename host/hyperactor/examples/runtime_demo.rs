//! A tour of the runtime across two OS processes.
//!
//! The demo starts a second copy of itself as a worker proc on a Unix
//! socket, then, from a proc in this process:
//!
//! 1. calls an echo actor in the worker and times the round trip;
//! 2. streams 100,000 one-way messages and checks that they arrived in order;
//! 3. makes one actor panic, shows the supervision error its caller gets,
//!    and shows that the worker and its other actor live on;
//! 4. kills the worker with SIGKILL while calls are pending, and shows every
//!    call ending with an error within the delivery timeout.
//!
//! Run it with `cargo run --release -p hyperactor --example runtime_demo`.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hyperactor::testing::{Echo, EchoActor, Numbered, Panic, Sleep, StreamReport};
use hyperactor::{ActorRef, CallError, ChannelAddr, Proc, ProcConfig, ProcId};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        let addr = args
            .get(2)
            .ok_or_else(|| anyhow!("worker needs an address"))?;
        return worker(addr.parse()?).await;
    }
    // The controller runs as a task on the runtime's workers, as actors do,
    // not on the thread that waits in `main`: replies then need no hop to
    // another thread.
    tokio::spawn(controller()).await?
}

/// The worker process: two echo actors, until stdin closes.
async fn worker(addr: ChannelAddr) -> anyhow::Result<()> {
    // The panic in step 4 is on purpose: one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| eprintln!("worker: {info}")));
    let proc = hyperactor::testing::serve_echo_worker(addr).await?;
    println!("READY {}", proc.id());
    hyperactor::testing::stdin_closed().await?;
    Ok(())
}

async fn controller() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("monarch-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = tour(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn tour(dir: &std::path::Path) -> anyhow::Result<()> {
    let worker_addr = format!("unix:{}/worker.sock", dir.display());
    println!("[1/5] starting a worker proc in a second process on {worker_addr}");
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .args(["worker", &worker_addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the worker process")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("worker has no stdout"))?;
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        BufReader::new(stdout).lines().next_line(),
    )
    .await
    .context("worker did not start within 30 s")??
    .ok_or_else(|| anyhow!("worker exited before it was ready"))?;
    let worker: ProcId = line
        .strip_prefix("READY ")
        .ok_or_else(|| anyhow!("unexpected worker output: {line}"))?
        .parse()?;
    let echo0: ActorRef<EchoActor> = ActorRef::attest(worker.actor_id("echo", 0)?);
    let echo1: ActorRef<EchoActor> = ActorRef::attest(worker.actor_id("echo", 1)?);

    let delivery_timeout = Duration::from_secs(2);
    let config = ProcConfig {
        delivery_timeout,
        ..ProcConfig::default()
    };
    let proc = Proc::serve_with_config(
        "controller",
        format!("unix:{}/controller.sock", dir.display()).parse()?,
        config,
    )
    .await?;
    let (client, _returned) = proc.attach("client")?;

    println!("[2/5] calling {} across processes", echo0.actor_id());
    let mut times = Vec::new();
    for i in 0..2000u32 {
        let started = Instant::now();
        let reply = echo0
            .call(&client, |reply| Echo {
                payload: i.to_le_bytes().repeat(16),
                reply,
            })
            .await?;
        times.push(started.elapsed());
        if reply != i.to_le_bytes().repeat(16) {
            bail!("echo {i} came back wrong");
        }
    }
    times.sort();
    println!(
        "      2000 calls, 64-byte payload: median round trip {:.1} us",
        times[times.len() / 2].as_secs_f64() * 1e6
    );

    println!("[3/5] streaming 100,000 one-way messages");
    let started = Instant::now();
    for seq in 0..100_000 {
        echo0.send(&client, Numbered { stream: 1, seq });
    }
    let stats = echo0
        .call(&client, |reply| StreamReport { stream: 1, reply })
        .await?;
    println!(
        "      received {} in {:.0} ms, {} out of order",
        stats.received,
        started.elapsed().as_secs_f64() * 1e3,
        stats.out_of_order
    );
    if stats.received != 100_000 || stats.out_of_order != 0 {
        bail!("messages were lost or reordered");
    }

    println!("[4/5] making {} panic", echo0.actor_id());
    match echo0
        .call(&client, |reply| Panic {
            text: "demo panic".into(),
            reply,
        })
        .await
    {
        Err(CallError::Supervision(event)) => {
            println!("      the call failed with a supervision event: {event}")
        }
        other => bail!("expected a supervision error, got {other:?}"),
    }
    let alive = echo1
        .call(&client, |reply| Echo {
            payload: b"still here".to_vec(),
            reply,
        })
        .await?;
    println!(
        "      {} still answers: {:?}",
        echo1.actor_id(),
        String::from_utf8_lossy(&alive)
    );

    println!("[5/5] killing the worker with SIGKILL while 1000 calls are pending");
    let mut pending: FuturesUnordered<_> = (0..1000)
        .map(|_| {
            let echo1 = echo1.clone();
            let client = client.clone();
            async move {
                echo1
                    .call(&client, |reply| Sleep { millis: 1, reply })
                    .await
            }
        })
        .collect();
    let mut answered = 0;
    while answered < 100 {
        pending
            .next()
            .await
            .ok_or_else(|| anyhow!("calls ran out"))??;
        answered += 1;
    }
    child.kill().await?;
    let killed = Instant::now();
    let mut failed = 0;
    while let Some(result) = pending.next().await {
        match result {
            Ok(()) => answered += 1,
            Err(CallError::Undeliverable(failure)) => {
                if failed == 0 {
                    println!("      first failure: {failure}");
                }
                failed += 1;
            }
            Err(other) => bail!("unexpected error: {other}"),
        }
    }
    println!(
        "      {answered} answered, {failed} failed, all ended {:.1} s after the kill (delivery timeout {} s)",
        killed.elapsed().as_secs_f64(),
        delivery_timeout.as_secs()
    );
    if answered + failed != 1000 {
        bail!("calls went missing");
    }
    println!("done: every call ended with a reply or an error.");
    Ok(())
}
