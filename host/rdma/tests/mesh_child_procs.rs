//! RDMA buffers on procs that are child processes: transfers cross process
//! boundaries (the TCP backend, or ibverbs where there is a device), and a
//! proc that dies fails the requests that need it, by name.
//!
//! This test binary is its own bootstrap command: started by a
//! `LocalAllocator` (with `MONARCH_BOOTSTRAP` set) it serves one mesh proc
//! whose registry has the `rdma` kind. Otherwise it runs the tests below.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::{
    Allocator, BOOTSTRAP_ENV, BootstrapCommand, LocalAllocator, bootstrap_main,
};
use hyperactor_mesh::client::MeshClient;
use monarch_rdma::mesh::{RdmaMesh, RdmaMeshError};

/// SIGKILL's number on Linux.
const SIGKILL: i32 = 9;

fn registry(blob_dir: std::path::PathBuf) -> Registry {
    let mut registry = Registry::new(blob_dir);
    monarch_rdma::mesh::register(&mut registry);
    registry
}

fn main() {
    if std::env::var_os(BOOTSTRAP_ENV).is_some() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let result = runtime.block_on(bootstrap_main(|config| registry(config.blob_dir.clone())));
        if let Err(e) = result {
            eprintln!("rdma mesh proc: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        bytes_move_between_child_procs().await;
        println!("test bytes_move_between_child_procs ... ok");
        a_dead_proc_fails_requests_by_name().await;
        println!("test a_dead_proc_fails_requests_by_name ... ok");
    });
}

async fn client(tag: &str) -> Arc<MeshClient> {
    let command = BootstrapCommand::current_exe(&[]).expect("this test's path");
    let blobs = std::env::temp_dir().join("rdma-mesh-child-blobs");
    let allocator: Arc<dyn Allocator> = Arc::new(
        LocalAllocator::new(command, Arc::new(registry(blobs))).expect("a socket directory"),
    );
    let socket = std::env::temp_dir().join(format!("rdma-{tag}-{}.sock", std::process::id()));
    std::fs::remove_file(&socket).ok();
    MeshClient::new(
        format!("unix:{}", socket.display())
            .parse()
            .expect("an address"),
        allocator,
        Arc::new(|_: &str| {}),
    )
    .await
    .expect("a mesh client")
}

async fn bytes_move_between_child_procs() {
    let client = client("move").await;
    let allocated = client.spawn_procs(2).await.expect("two child procs");
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let mesh = RdmaMesh::spawn(client.clone(), &procs)
        .await
        .expect("rdma actors");
    // Several TCP chunks (512 KiB each by default).
    let len = 3 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let a = mesh.alloc(0, len as u64).await.expect("alloc on rank 0");
    let b = mesh.alloc(1, len as u64).await.expect("alloc on rank 1");
    assert_ne!(
        a.handle().owner(),
        b.handle().owner(),
        "each process has its own manager"
    );
    mesh.write(&a, 0, &data).await.expect("write");
    mesh.read_into(&a, &b).await.expect("rank 1 reads rank 0");
    assert!(mesh.read(&b, 0, len as u64).await.expect("read") == data);

    let other: Vec<u8> = data.iter().map(|v| v ^ 0x5a).collect();
    mesh.write(&b, 0, &other).await.expect("write");
    mesh.write_from(&a, &b).await.expect("rank 1 writes rank 0");
    assert!(mesh.read(&a, 0, len as u64).await.expect("read") == other);
    mesh.stop().await;
    client.stop_all();
}

async fn a_dead_proc_fails_requests_by_name() {
    let client = client("death").await;
    let allocated = client.spawn_procs(2).await.expect("two child procs");
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let mesh = RdmaMesh::spawn(client.clone(), &procs)
        .await
        .expect("rdma actors");
    let on_0 = mesh.alloc(0, 64).await.expect("alloc on rank 0");
    let on_1 = mesh.alloc(1, 64).await.expect("alloc on rank 1");
    mesh.read_into(&on_1, &on_0)
        .await
        .expect("a transfer before the kill");

    client.kill(&procs[1], SIGKILL).expect("kill");
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        match mesh.read(&on_1, 0, 64).await {
            Err(e) => break e,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(_) => panic!("rank 1 still answers after SIGKILL"),
        }
    };
    let RdmaMeshError::ProcDied {
        rank: 1, reason, ..
    } = &error
    else {
        panic!("not the death of rank 1: {error}")
    };
    assert!(reason.contains("signal 9"), "names the signal: {reason}");
    assert!(error.to_string().starts_with("rank 1: proc "), "{error}");
    let error = mesh.alloc(1, 8).await.unwrap_err();
    assert!(
        matches!(error, RdmaMeshError::ProcDied { rank: 1, .. }),
        "{error}"
    );

    // Rank 0 lives on; reading the dead proc's buffer fails there, at once.
    let started = Instant::now();
    let error = mesh.read_into(&on_1, &on_0).await.unwrap_err();
    assert!(
        matches!(error, RdmaMeshError::Failed { rank: 0, .. }),
        "{error}"
    );
    assert!(
        error.to_string().contains(&format!("buffer {}", on_1.id())),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{error}");
    mesh.write(&on_0, 0, b"still here")
        .await
        .expect("rank 0 answers");
    assert_eq!(
        mesh.read(&on_0, 0, 10).await.expect("rank 0 answers"),
        b"still here"
    );
    client.stop_all();
}
