//! RDMA buffers on meshes of in-process procs: bytes put on one rank come
//! out of another after a one-sided transfer between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyperactor::ProcId;
use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::InProcessAllocator;
use hyperactor_mesh::client::MeshClient;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError};
use monarch_rdma::mesh::{RdmaMesh, RdmaMeshError, RemoteBuffer};

async fn procs(count: usize) -> (Arc<MeshClient>, Vec<ProcId>) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut registry = Registry::new(std::env::temp_dir().join("rdma-mesh-test-blobs"));
    monarch_rdma::mesh::register(&mut registry);
    let allocator = Arc::new(InProcessAllocator::new(Arc::new(registry)));
    let addr = format!(
        "local:rdma-mesh-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
    .parse()
    .unwrap();
    let client = MeshClient::new(addr, allocator, Arc::new(|_: &str| {}))
        .await
        .unwrap();
    let procs = client
        .spawn_procs(count)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.proc)
        .collect();
    (client, procs)
}

async fn mesh(count: usize) -> (Arc<MeshClient>, RdmaMesh) {
    let (client, procs) = procs(count).await;
    let mesh = RdmaMesh::spawn(client.clone(), &procs).await.unwrap();
    (client, mesh)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn bytes_written_on_one_rank_are_read_into_and_written_from_another() {
    let (_client, mesh) = mesh(2).await;
    let data = pattern(1000, 7);
    let a = mesh.alloc(0, 1000).await.unwrap();
    let b = mesh.alloc(1, 1000).await.unwrap();
    assert_eq!((a.rank(), b.rank()), (0, 1));
    assert_eq!(a.len(), 1000);
    assert_eq!(
        mesh.read(&b, 0, 1000).await.unwrap(),
        vec![0; 1000],
        "zeroed"
    );

    mesh.write(&a, 0, &data).await.unwrap();
    mesh.read_into(&a, &b).await.unwrap();
    assert_eq!(mesh.read(&b, 0, 1000).await.unwrap(), data);

    // The other way: rank 1 writes a new pattern into rank 0's buffer.
    let other = pattern(1000, 99);
    mesh.write(&b, 0, &other).await.unwrap();
    mesh.write_from(&a, &b).await.unwrap();
    assert_eq!(mesh.read(&a, 0, 1000).await.unwrap(), other);

    // Ranges: bytes 100..150 of `a` land at 10..60 of a fresh buffer.
    let c = mesh.alloc(1, 64).await.unwrap();
    mesh.read_into_range(&a, 100, &c, 10, 50).await.unwrap();
    let got = mesh.read(&c, 0, 64).await.unwrap();
    assert_eq!(&got[10..60], &other[100..150]);
    assert_eq!(&got[..10], &[0; 10]);
    assert_eq!(&got[60..], &[0; 4]);
    mesh.write_from_range(&c, 0, &a, 0, 4).await.unwrap();
    assert_eq!(mesh.read(&c, 0, 4).await.unwrap(), &other[..4]);
    mesh.stop().await;
}

#[tokio::test]
async fn requests_run_concurrently_from_clones_of_a_mesh() {
    let (_client, mesh) = mesh(2).await;
    let mut tasks = Vec::new();
    for i in 0..8u8 {
        let mesh = mesh.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(4096, i);
            let src = mesh.alloc(usize::from(i % 2), 4096).await?;
            let dst = mesh.alloc(usize::from(1 - i % 2), 4096).await?;
            mesh.write(&src, 0, &data).await?;
            mesh.read_into(&src, &dst).await?;
            let back = mesh.read(&dst, 0, 4096).await?;
            mesh.free(src).await?;
            mesh.free(dst).await?;
            Ok::<bool, RdmaMeshError>(back == data)
        }));
    }
    for task in tasks {
        assert!(task.await.unwrap().unwrap(), "bytes came back changed");
    }
}

#[tokio::test]
async fn a_buffer_from_bytes_works_in_another_mesh_of_the_same_procs() {
    let (client, procs) = procs(2).await;
    let first = RdmaMesh::spawn(client.clone(), &procs).await.unwrap();
    let second = RdmaMesh::spawn(client.clone(), &procs).await.unwrap();
    let data = pattern(300, 3);
    let src = first.alloc(0, 300).await.unwrap();
    first.write(&src, 0, &data).await.unwrap();

    // The handle travels as bytes, say inside a payload.
    let bytes = src.to_bytes();
    let decoded = RemoteBuffer::from_bytes(&bytes).unwrap();
    assert_eq!(decoded, src);
    let dst = second.alloc(1, 300).await.unwrap();
    second.read_into(&decoded, &dst).await.unwrap();
    assert_eq!(second.read(&dst, 0, 300).await.unwrap(), data);
    // And the other mesh's actors serve the first mesh's buffer too.
    assert_eq!(second.read(&decoded, 0, 300).await.unwrap(), data);

    // A truncated or altered encoding is refused.
    assert!(matches!(
        RemoteBuffer::from_bytes(&bytes[..bytes.len() / 2]),
        Err(RdmaMeshError::BadHandle(_))
    ));
}

#[tokio::test]
async fn transfers_between_buffers_of_different_sizes_are_refused() {
    let (_client, mesh) = mesh(2).await;
    let a = mesh.alloc(0, 10).await.unwrap();
    let b = mesh.alloc(1, 12).await.unwrap();
    let error = mesh.read_into(&a, &b).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "sizes differ: buffer {} on rank 0 has 10 bytes, buffer {} on rank 1 has 12",
            a.id(),
            b.id()
        )
    );
    assert!(matches!(
        mesh.write_from(&b, &a).await,
        Err(RdmaMeshError::SizeMismatch { .. })
    ));
    let error = mesh.read_into_range(&a, 5, &b, 0, 6).await.unwrap_err();
    assert!(
        matches!(error, RdmaMeshError::OutOfRange { rank: 0, .. }),
        "{error}"
    );
    let error = mesh.write(&a, 8, b"abc").await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "rank 0: offset 8 + length 3 exceeds buffer {}'s 10 bytes",
            a.id()
        )
    );
    let error = mesh.alloc(2, 1).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "rank 2 is out of range; the rdma mesh has 2 ranks"
    );
}

#[tokio::test]
async fn garbage_sent_to_an_rdma_actor_is_an_error_reply() {
    let (client, mesh) = mesh(1).await;
    let mut caster = Caster::new(client.mailbox(), 16);
    let target = CastTarget {
        mesh: mesh.name().to_string(),
        procs: mesh.procs().to_vec(),
        ranks: vec![vec![0]],
    };
    for (endpoint, payload) in [
        ("rdma.alloc", b"\xde\xad\xbe\xef garbage".to_vec()),
        ("rdma.read", Vec::new()),
        ("rdma.read_into", vec![0xff; 256]),
        ("rdma.nope", Vec::new()),
    ] {
        let seq = caster.cast(
            target.clone(),
            endpoint,
            payload,
            CastMode::Gather,
            Duration::from_secs(10),
        );
        let outcome = tokio::time::timeout(Duration::from_secs(10), caster.next())
            .await
            .unwrap();
        let Some(Outcome::Done {
            seq: s,
            result: Err((0, RankError::Endpoint(text))),
        }) = outcome
        else {
            panic!("{endpoint}: not an endpoint error: {outcome:?}")
        };
        assert_eq!(s, seq);
        assert!(
            text.contains("not a valid rdma command") || text.contains("no endpoint"),
            "{endpoint}: {text}"
        );
    }
    // The actor lives on.
    let buffer = mesh.alloc(0, 3).await.unwrap();
    mesh.write(&buffer, 0, b"ok!").await.unwrap();
    assert_eq!(mesh.read(&buffer, 0, 3).await.unwrap(), b"ok!");
}

#[tokio::test]
async fn rm3_transfers_from_or_into_a_freed_buffer_fail_naming_it() {
    let (_client, mesh) = mesh(2).await;
    let src = mesh.alloc(0, 16).await.unwrap();
    let dst = mesh.alloc(1, 16).await.unwrap();
    let (src_id, dst_id) = (src.id(), dst.id());
    mesh.free(src.clone()).await.unwrap();

    // The remote side is gone: the owner's manager says so.
    let error = mesh.read_into(&src, &dst).await.unwrap_err();
    let RdmaMeshError::Failed { rank: 1, .. } = &error else {
        panic!("not a failure on rank 1: {error:?}");
    };
    let text = error.to_string();
    assert!(
        text.contains(&format!("buffer {src_id} on manager")) && text.contains("deregistered"),
        "{text}"
    );
    let error = mesh.write_from(&src, &dst).await.unwrap_err();
    assert!(error.to_string().contains("deregistered"), "{error}");

    // The local side is gone: the rank says it has no such buffer.
    let other = mesh.alloc(0, 16).await.unwrap();
    mesh.free(dst.clone()).await.unwrap();
    let error = mesh.read_into(&other, &dst).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "rank 1: read of 16 bytes of buffer {} (rank 0) into buffer {dst_id} failed: buffer {dst_id} is not allocated on this proc (freed, or never allocated)",
            other.id()
        )
    );
    let error = mesh.read(&dst, 0, 1).await.unwrap_err();
    assert!(
        error.to_string().contains("not allocated on this proc"),
        "{error}"
    );
    let error = mesh.free(dst).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("free of buffer {dst_id}")),
        "{error}"
    );
}

#[tokio::test]
async fn a_stopped_mesh_refuses_requests_and_a_foreign_proc_is_named() {
    let (_client, mesh) = mesh(1).await;
    let (_other_client, other) = mesh_on_new_procs().await;
    let foreign = other.alloc(0, 4).await.unwrap();
    let error = mesh.read(&foreign, 0, 4).await.unwrap_err();
    assert!(matches!(error, RdmaMeshError::NotOnMesh { .. }), "{error}");
    assert!(
        error.to_string().contains("not a proc of this rdma mesh"),
        "{error}"
    );

    let buffer = mesh.alloc(0, 4).await.unwrap();
    let clone = mesh.clone();
    mesh.stop().await;
    let error = clone.read(&buffer, 0, 4).await.unwrap_err();
    assert_eq!(error, RdmaMeshError::Stopped(mesh.name().to_string()));
}

async fn mesh_on_new_procs() -> (Arc<MeshClient>, RdmaMesh) {
    mesh(1).await
}

#[tokio::test]
async fn stopping_a_mesh_frees_the_buffers_its_actors_allocated() {
    let (client, procs) = procs(1).await;
    let first = RdmaMesh::spawn(client.clone(), &procs).await.unwrap();
    let second = RdmaMesh::spawn(client.clone(), &procs).await.unwrap();
    let kept = second.alloc(0, 4).await.unwrap();
    let gone = first.alloc(0, 4).await.unwrap();
    assert_eq!(second.read(&gone, 0, 4).await.unwrap(), vec![0; 4]);
    first.stop().await;
    let error = second.read(&gone, 0, 4).await.unwrap_err();
    assert!(
        error.to_string().contains(&format!(
            "buffer {} is not allocated on this proc",
            gone.id()
        )),
        "{error}"
    );
    second.write(&kept, 0, b"live").await.unwrap();
    assert_eq!(second.read(&kept, 0, 4).await.unwrap(), b"live");
}
