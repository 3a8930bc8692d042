//! A proc in its own OS process, for tests that need a peer to talk to,
//! kill, or feed bad frames.
//!
//! `proc-worker ADDR` serves a proc named `worker` on ADDR with two
//! [`EchoActor`]s, `echo[0]` and `echo[1]`, prints `READY <proc id>` on
//! stdout, and exits when its stdin closes, so it never outlives the test.

use hyperactor::ChannelAddr;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let addr: ChannelAddr = std::env::args()
        .nth(1)
        .ok_or_else(|| {
            anyhow::anyhow!("usage: proc-worker ADDR (local:NAME, unix:PATH or tcp:IP:PORT)")
        })?
        .parse()?;
    let proc = hyperactor::testing::serve_echo_worker(addr).await?;
    println!("READY {}", proc.id());
    hyperactor::testing::stdin_closed().await?;
    Ok(())
}
