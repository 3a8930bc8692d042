//! The peer of the mesh tests.
//!
//! - With `MONARCH_BOOTSTRAP` set (started by an allocator): one proc of a
//!   mesh whose actors are `hyperactor_mesh::testing::EchoMeshActor`s.
//! - With `MONARCH_FORK_SERVER` set: the fork server of such procs
//!   (`hyperactor_mesh::fork`).
//! - `mesh-worker controller N [fork]`: a stand-in controller that starts N
//!   child procs (forked by its fork server with `fork`), prints `PIDS p1
//!   p2 ...` and waits; the no-orphans tests kill it.
//! - `mesh-worker agent IP:PORT TOKEN`: a host agent whose procs are
//!   mesh-workers; prints `AGENT ADDR` and serves until stdin closes.

use std::sync::Arc;

use hyperactor_mesh::alloc::{Allocator, BootstrapCommand, LocalAllocator, bootstrap_main};
use hyperactor_mesh::client::MeshClient;
use hyperactor_mesh::testing::echo_registry;

fn main() -> anyhow::Result<()> {
    // Started as a fork server (`LocalAllocator::with_fork_server`), this
    // returns only in each proc it forks, before any runtime exists.
    hyperactor_mesh::fork::serve_forks_prepared(|| {}, hyperactor_mesh::testing::record_preload);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,hyperactor::actor=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("controller") {
        let count: usize = args.get(1).map(|n| n.parse()).transpose()?.unwrap_or(2);
        let fork = args.get(2).map(String::as_str) == Some("fork");
        let command = BootstrapCommand::current_exe(&[])?;
        let blobs = std::env::temp_dir().join("mesh-worker-blobs");
        let allocator =
            LocalAllocator::new(command, Arc::new(echo_registry(blobs)))?.with_fork_server(fork);
        let socket = std::env::temp_dir().join(format!("mesh-ctl-{}.sock", std::process::id()));
        let allocator: Arc<dyn Allocator> = Arc::new(allocator);
        let client = MeshClient::new(
            format!("unix:{}", socket.display()).parse()?,
            allocator,
            Arc::new(|_: &str| {}),
        )
        .await?;
        let procs = client.spawn_procs(count).await?;
        let pids: Vec<String> = procs
            .iter()
            .filter_map(|p| p.pid)
            .map(|p| p.to_string())
            .collect();
        println!("PIDS {}", pids.join(" "));
        hyperactor::testing::stdin_closed().await?;
        return Ok(());
    }
    if args.first().map(String::as_str) == Some("agent") {
        let addr = format!(
            "tcp:{}",
            args.get(1).map(String::as_str).unwrap_or("127.0.0.1:0")
        );
        let token = args.get(2).cloned();
        let command = BootstrapCommand::current_exe(&[])?;
        let blobs = std::env::temp_dir().join(format!("mesh-agent-blobs-{}", std::process::id()));
        let proc = hyperactor_mesh::remote::serve_agent(hyperactor_mesh::remote::AgentConfig {
            addr: addr.parse()?,
            token,
            command,
            registry: echo_registry(blobs),
            node: "mesh-worker".into(),
        })
        .await?;
        println!("AGENT {}", proc.id().addr());
        hyperactor::testing::stdin_closed().await?;
        return Ok(());
    }
    bootstrap_main(|config| echo_registry(config.blob_dir.clone())).await
}
