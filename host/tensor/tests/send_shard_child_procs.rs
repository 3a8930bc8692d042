//! `TensorMesh::send_shard` between procs that are child processes: the
//! shard's bytes cross a process boundary (monarch-rdma's TCP backend, or
//! ibverbs where there is a device), registered in place on both sides.
//!
//! This test binary is its own bootstrap command: started by a
//! `LocalAllocator` (with `MONARCH_BOOTSTRAP` set) it serves one mesh proc
//! whose registry has the `tensor` kind. Otherwise it runs the test.

use std::sync::Arc;

use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::{
    Allocator, BOOTSTRAP_ENV, BootstrapCommand, LocalAllocator, bootstrap_main,
};
use hyperactor_mesh::client::MeshClient;
use monarch_tensor::mesh::{BinaryOp, Init, Sharding, TensorMesh};
use monarch_tensor::{DType, Device};

fn registry(blob_dir: std::path::PathBuf) -> Registry {
    let mut registry = Registry::new(blob_dir);
    monarch_tensor::mesh::register(&mut registry);
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
            eprintln!("tensor mesh proc: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(shards_move_between_child_processes());
    println!("test shards_move_between_child_processes ... ok");
}

async fn shards_move_between_child_processes() {
    let command = BootstrapCommand::current_exe(&[]).expect("this test's path");
    let blobs = std::env::temp_dir().join("tensor-send-shard-blobs");
    let allocator: Arc<dyn Allocator> = Arc::new(
        LocalAllocator::new(command, Arc::new(registry(blobs))).expect("a socket directory"),
    );
    let socket =
        std::env::temp_dir().join(format!("tensor-send-shard-{}.sock", std::process::id()));
    std::fs::remove_file(&socket).ok();
    let client = MeshClient::new(
        format!("unix:{}", socket.display())
            .parse()
            .expect("an address"),
        allocator,
        Arc::new(|_: &str| {}),
    )
    .await
    .expect("a mesh client");
    let allocated = client.spawn_procs(2).await.expect("two child procs");
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let mut mesh = TensorMesh::spawn(client.clone(), &procs, vec![("ranks".into(), 2)])
        .await
        .expect("tensor workers");
    let rows = Sharding::Shard {
        mesh_dim: 0,
        tensor_dim: 0,
    };
    // 1 MiB shards: several of the TCP backend's 512 KiB chunks.
    let dims = [8192, 64];
    let init = Init::Uniform {
        low: -1.0,
        high: 1.0,
        seed: 3,
    };
    let a = mesh.create(init, &dims, DType::F32, Device::Cpu, rows);
    let b = mesh.create(Init::Zeros, &dims, DType::F32, Device::Cpu, rows);
    let a0 = mesh.fetch_shard(&a, 0).await.expect("rank 0's shard");
    let a1 = mesh.fetch_shard(&a, 1).await.expect("rank 1's shard");

    mesh.send_shard(&a, 0, &b, 1)
        .await
        .expect("rank 0 to rank 1");
    let b1 = mesh.fetch_shard(&b, 1).await.expect("rank 1's shard of b");
    assert!(b1.to_vec::<f32>().unwrap() == a0.to_vec::<f32>().unwrap());
    mesh.send_shard(&a, 1, &b, 0)
        .await
        .expect("rank 1 to rank 0");
    let b0 = mesh.fetch_shard(&b, 0).await.expect("rank 0's shard of b");
    assert!(b0.to_vec::<f32>().unwrap() == a1.to_vec::<f32>().unwrap());

    // Both sources were given back and still compute.
    let sum = mesh.binary(BinaryOp::Add, &a, &b);
    let expected = a0.add(&a1).unwrap();
    for rank in 0..2 {
        let got = mesh.fetch_shard(&sum, rank).await.expect("a + b");
        assert!(got.max_abs_diff(&expected).unwrap() == 0.0, "rank {rank}");
    }
    mesh.stop().await;
    client.stop_all();
}
