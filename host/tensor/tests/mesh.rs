//! Sharded tensors on meshes of in-process procs: every result fetched
//! from the mesh is compared with the same computation on one local tensor.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::InProcessAllocator;
use hyperactor_mesh::client::MeshClient;
use hyperactor_mesh::{CastMode, CastTarget, Caster, Outcome, RankError};
use monarch_tensor::mesh::{
    BinaryOp, Init, MeshError, Sharding, TensorMesh, TensorMeshOptions, TensorRef, UnaryOp,
};
use monarch_tensor::{DType, Device, Tensor};

const ROWS0: Sharding = Sharding::Shard {
    mesh_dim: 0,
    tensor_dim: 0,
};

async fn mesh_with(
    procs: usize,
    extent: &[(&str, u32)],
    options: TensorMeshOptions,
) -> (Arc<MeshClient>, TensorMesh) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut registry = Registry::new(std::env::temp_dir().join("tensor-mesh-test-blobs"));
    monarch_tensor::mesh::register(&mut registry);
    let allocator = Arc::new(InProcessAllocator::new(Arc::new(registry)));
    let addr = format!(
        "local:tensor-mesh-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
    .parse()
    .unwrap();
    let client = MeshClient::new(addr, allocator, Arc::new(|_: &str| {}))
        .await
        .unwrap();
    let procs: Vec<_> = client
        .spawn_procs(procs)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.proc)
        .collect();
    let extent = extent.iter().map(|(n, s)| (n.to_string(), *s)).collect();
    let mesh = TensorMesh::spawn_with(client.clone(), &procs, extent, options)
        .await
        .unwrap();
    (client, mesh)
}

async fn mesh(procs: usize, extent: &[(&str, u32)]) -> (Arc<MeshClient>, TensorMesh) {
    mesh_with(procs, extent, TensorMeshOptions::default()).await
}

/// Options that cut every transfer into many small chunks.
fn tiny_chunks() -> TensorMeshOptions {
    TensorMeshOptions {
        chunk_bytes: 40,
        window: 3,
        ..TensorMeshOptions::default()
    }
}

fn assert_close(got: &Tensor, expected: &Tensor, tolerance: f64, what: &str) {
    assert_eq!(got.dims(), expected.dims(), "{what}: shape");
    assert_eq!(got.dtype(), expected.dtype(), "{what}: dtype");
    let diff = got.max_abs_diff(expected).unwrap();
    assert!(diff <= tolerance, "{what}: off by {diff}");
}

fn local_shard(whole: &Tensor, sharding: Sharding, sizes: &[usize], coords: &[usize]) -> Tensor {
    match sharding {
        Sharding::Shard {
            mesh_dim,
            tensor_dim,
        } => {
            let (start, len) = monarch_tensor::mesh::sharding::block(
                whole.dims()[tensor_dim],
                sizes[mesh_dim],
                coords[mesh_dim],
            );
            whole.narrow(tensor_dim, start, len).unwrap()
        }
        Sharding::Partial { mesh_dim } if coords[mesh_dim] != 0 => {
            Tensor::zeros(whole.dims(), whole.dtype(), Device::Cpu).unwrap()
        }
        _ => whole.try_clone().unwrap(),
    }
}

#[tokio::test]
async fn create_and_fetch_give_the_local_tensor_for_every_sharding_and_dtype() {
    // A 2x2 mesh and a 5x3 tensor: every split is uneven.
    let (_client, mut mesh) = mesh_with(4, &[("a", 2), ("b", 2)], tiny_chunks()).await;
    let sizes = [2, 2];
    let dims = [5, 3];
    let shardings = [
        Sharding::Replicate,
        ROWS0,
        Sharding::Shard {
            mesh_dim: 1,
            tensor_dim: 1,
        },
        Sharding::Shard {
            mesh_dim: 0,
            tensor_dim: 1,
        },
        Sharding::Partial { mesh_dim: 1 },
    ];
    for dtype in DType::ALL {
        let (low, high) = if dtype == DType::I64 {
            (-50.0, 50.0)
        } else {
            (-1.0, 1.0)
        };
        let uniform = Tensor::rand_uniform(&dims, low, high, 7, dtype, Device::Cpu).unwrap();
        let mut inits = vec![
            (
                Init::Uniform { low, high, seed: 7 },
                uniform.try_clone().unwrap(),
            ),
            (
                Init::FromBytes(uniform.to_le_bytes().unwrap()),
                uniform.try_clone().unwrap(),
            ),
            (
                Init::Full(3.0),
                Tensor::full(&dims, 3.0, dtype, Device::Cpu).unwrap(),
            ),
        ];
        if dtype.is_float() {
            let normal = Tensor::rand_normal(&dims, 1.0, 2.0, 9, dtype, Device::Cpu).unwrap();
            let init = Init::Normal {
                mean: 1.0,
                std: 2.0,
                seed: 9,
            };
            inits.push((init, normal));
        }
        for sharding in shardings {
            for (init, expected) in &inits {
                let what = format!("{dtype} {sharding} {init:?}");
                let t = mesh.create(init.clone(), &dims, dtype, Device::Cpu, sharding);
                assert_eq!(t.dims(), &dims);
                assert_eq!(t.sharding(), sharding);
                let fetched = mesh.fetch(&t).await.unwrap();
                assert_close(&fetched, expected, 0.0, &what);
                for rank in 0..4 {
                    let coords = mesh.shape().coords(rank);
                    let shard = mesh.fetch_shard(&t, rank).await.unwrap();
                    let local = local_shard(expected, sharding, &sizes, &coords);
                    assert_close(&shard, &local, 0.0, &format!("{what} rank {rank}"));
                }
                mesh.drop(&[&t]);
            }
            // Upload sends each rank only its shard, in chunks.
            let up = mesh.upload(&uniform, sharding).await.unwrap();
            let fetched = mesh.fetch(&up).await.unwrap();
            assert_close(
                &fetched,
                &uniform,
                0.0,
                &format!("upload {dtype} {sharding}"),
            );
            mesh.drop(&[&up]);
        }
    }
    mesh.sync(&[]).await.unwrap();
}

#[tokio::test]
async fn elementwise_ops_and_a_row_sharded_matmul_equal_the_local_computation() {
    let (_client, mut mesh) = mesh(4, &[("ranks", 4)]).await;
    let (f64s, cpu) = (DType::F64, Device::Cpu);
    let normal = |seed| Init::Normal {
        mean: 0.0,
        std: 1.0,
        seed,
    };
    let xl = Tensor::rand_normal(&[10, 3], 0.0, 1.0, 1, f64s, cpu).unwrap();
    let zl = Tensor::rand_normal(&[10, 3], 0.0, 1.0, 2, f64s, cpu).unwrap();
    let wl = Tensor::rand_normal(&[3, 2], 0.0, 1.0, 3, f64s, cpu).unwrap();
    let x = mesh.create(normal(1), &[10, 3], f64s, cpu, ROWS0);
    let z = mesh.create(normal(2), &[10, 3], f64s, cpu, ROWS0);
    let w = mesh.create(normal(3), &[3, 2], f64s, cpu, Sharding::Replicate);

    let mut checks: Vec<(TensorRef, Tensor, &str)> = Vec::new();
    for (op, local) in [
        (BinaryOp::Add, xl.add(&zl).unwrap()),
        (BinaryOp::Sub, xl.sub(&zl).unwrap()),
        (BinaryOp::Mul, xl.mul(&zl).unwrap()),
        (BinaryOp::Div, xl.div(&zl).unwrap()),
    ] {
        checks.push((mesh.binary(op, &x, &z), local, op.name()));
    }
    for (op, local) in [
        (BinaryOp::Add, xl.add_scalar(2.5).unwrap()),
        (BinaryOp::Sub, xl.sub_scalar(2.5).unwrap()),
        (BinaryOp::Mul, xl.mul_scalar(2.5).unwrap()),
        (BinaryOp::Div, xl.div_scalar(2.5).unwrap()),
    ] {
        checks.push((mesh.scalar(op, &x, 2.5), local, "scalar"));
    }
    for (op, local) in [
        (UnaryOp::Neg, xl.neg().unwrap()),
        (UnaryOp::Relu, xl.relu().unwrap()),
        (UnaryOp::Exp, xl.exp().unwrap()),
    ] {
        checks.push((mesh.unary(op, &x), local, op.name()));
    }
    // X (rows split) times a replicated w: rows split.
    let xw = mesh.matmul(&x, &w);
    assert_eq!(xw.sharding(), ROWS0);
    checks.push((xw.clone(), xl.matmul(&wl).unwrap(), "matmul"));
    // Xᵀ (columns split) times X (rows split): partial sums of XᵀX.
    let xt = mesh.transpose(&x);
    assert_eq!(
        xt.sharding(),
        Sharding::Shard {
            mesh_dim: 0,
            tensor_dim: 1
        }
    );
    checks.push((xt.clone(), xl.transpose().unwrap(), "transpose"));
    let gram = mesh.matmul(&xt, &x);
    assert_eq!(gram.sharding(), Sharding::Partial { mesh_dim: 0 });
    checks.push((
        gram.clone(),
        xl.transpose().unwrap().matmul(&xl).unwrap(),
        "gram",
    ));
    // Sums: over the split dimension they are partial, fetched as totals.
    let total = mesh.sum(&x, None);
    assert_eq!(total.sharding(), Sharding::Partial { mesh_dim: 0 });
    checks.push((total, xl.sum().unwrap(), "sum"));
    let columns = mesh.sum(&x, Some(0));
    checks.push((columns, xl.sum_dim(0).unwrap(), "sum dim 0"));
    let rows = mesh.sum(&x, Some(1));
    assert_eq!(rows.sharding(), ROWS0);
    checks.push((rows, xl.sum_dim(1).unwrap(), "sum dim 1"));
    // In place: y = copy(x); y += -0.5 z; then w2 := w.
    let y = mesh.copy(&x);
    mesh.axpy(&y, -0.5, &z);
    let mut yl = xl.try_clone().unwrap();
    yl.axpy(-0.5, &zl).unwrap();
    checks.push((y, yl, "axpy"));
    let w2 = mesh.create(Init::Zeros, &[3, 2], f64s, cpu, Sharding::Replicate);
    mesh.assign(&w2, &w);
    checks.push((w2, wl.try_clone().unwrap(), "assign"));

    for (t, local, what) in &checks {
        let got = mesh.fetch(t).await.unwrap();
        assert_close(&got, local, 1e-12, what);
    }
    // The original is untouched by the in-place ops on its copy.
    assert_close(&mesh.fetch(&x).await.unwrap(), &xl, 0.0, "x");
    mesh.sync(&[&x, &z, &w]).await.unwrap();
}

#[tokio::test]
async fn ops_pipeline_in_order_without_waiting() {
    let (_client, mut mesh) = mesh(3, &[("ranks", 3)]).await;
    let mut t = mesh.create(
        Init::Zeros,
        &[4],
        DType::I64,
        Device::Cpu,
        Sharding::Replicate,
    );
    for _ in 0..300 {
        let next = mesh.scalar(BinaryOp::Add, &t, 1.0);
        mesh.drop(&[&t]);
        t = next;
    }
    let got = mesh.fetch(&t).await.unwrap();
    assert_eq!(got.to_vec::<i64>().unwrap(), vec![300; 4]);
    for rank in 0..3 {
        let shard = mesh.fetch_shard(&t, rank).await.unwrap();
        assert_eq!(shard.to_vec::<i64>().unwrap(), vec![300; 4]);
    }
}

/// A tensor whose rank `r` holds a different summand on every rank: the
/// local sum over dimension 0 of a tensor split by rows over `mesh_dim`.
fn summands(mesh: &mut TensorMesh, whole: &Tensor, mesh_dim: usize) -> TensorRef {
    let split = Sharding::Shard {
        mesh_dim,
        tensor_dim: 0,
    };
    let init = Init::FromBytes(whole.to_le_bytes().unwrap());
    let x = mesh.create(init, whole.dims(), whole.dtype(), Device::Cpu, split);
    let partial = mesh.sum(&x, Some(0));
    assert_eq!(partial.sharding(), Sharding::Partial { mesh_dim });
    partial
}

#[tokio::test]
async fn all_reduce_sums_over_each_dimension_of_a_2x2_mesh() {
    let (_client, mut mesh) = mesh_with(4, &[("a", 2), ("b", 2)], tiny_chunks()).await;
    for dtype in DType::ALL {
        let whole = Tensor::rand_uniform(&[4, 37], -100.0, 100.0, 5, dtype, Device::Cpu).unwrap();
        for mesh_dim in 0..2 {
            let what = format!("{dtype} over mesh dim {mesh_dim}");
            let mut t = summands(&mut mesh, &whole, mesh_dim);
            mesh.all_reduce(&mut t, mesh_dim).await.unwrap();
            assert_eq!(t.sharding(), Sharding::Replicate, "{what}");
            let expected = whole.sum_dim(0).unwrap();
            let tolerance = if dtype == DType::F32 { 1e-4 } else { 1e-9 };
            // Every rank holds the sum of its group: here, of everything.
            for rank in 0..4 {
                let shard = mesh.fetch_shard(&t, rank).await.unwrap();
                assert_close(&shard, &expected, tolerance, &format!("{what} rank {rank}"));
            }
        }
    }
    // Groups are separate: with rows split over dim 0 and summed over dim
    // 1, ranks (a, 0) and (a, 1) hold block a's copies, whose sum is twice
    // block a's.
    let whole = Tensor::rand_uniform(&[4, 5], -1.0, 1.0, 6, DType::F64, Device::Cpu).unwrap();
    let mut x = mesh.create(
        Init::FromBytes(whole.to_le_bytes().unwrap()),
        &[4, 5],
        DType::F64,
        Device::Cpu,
        ROWS0,
    );
    mesh.all_reduce(&mut x, 1).await.unwrap();
    assert_eq!(x.sharding(), ROWS0, "split over dim 0 still");
    let got = mesh.fetch(&x).await.unwrap();
    assert_close(
        &got,
        &whole.mul_scalar(2.0).unwrap(),
        1e-12,
        "per-group sums",
    );

    // Blocks of a split are parts, not summands.
    let error = mesh.all_reduce(&mut x, 0).await.unwrap_err();
    assert!(matches!(error, MeshError::Invalid(_)), "{error}");
    assert!(error.to_string().contains("not summands"), "{error}");
    assert!(matches!(
        mesh.all_reduce(&mut x, 2).await,
        Err(MeshError::Invalid(_))
    ));
}

#[tokio::test]
async fn all_reduce_folds_through_a_deep_tree() {
    // Fan-out 2 over 8 procs: sums are folded in the procs on the way up.
    let options = TensorMeshOptions {
        fanout: 2,
        chunk_bytes: 256,
        ..TensorMeshOptions::default()
    };
    let (_client, mut mesh) = mesh_with(8, &[("ranks", 8)], options).await;
    let whole = Tensor::rand_uniform(&[8, 300], -1.0, 1.0, 8, DType::F64, Device::Cpu).unwrap();
    let mut t = summands(&mut mesh, &whole, 0);
    mesh.all_reduce(&mut t, 0).await.unwrap();
    let expected = whole.sum_dim(0).unwrap();
    for rank in [0, 3, 7] {
        let shard = mesh.fetch_shard(&t, rank).await.unwrap();
        assert_close(&shard, &expected, 1e-12, &format!("rank {rank}"));
    }
}

/// Options that send every CPU all-reduce round a ring of the workers, in
/// many small chunks.
fn ring_chunks() -> TensorMeshOptions {
    TensorMeshOptions {
        chunk_bytes: 40,
        window: 2,
        ring_min_bytes: 0,
        ..TensorMeshOptions::default()
    }
}

/// RG-1: the ring all-reduce gives every rank of a group the same bytes,
/// the group's sum, over each dimension of a 2x2 mesh, for every dtype,
/// also with fewer elements than ranks.
#[tokio::test]
async fn rg1_a_ring_all_reduce_sums_over_each_dimension_of_a_2x2_mesh() {
    let (_client, mut mesh) = mesh_with(4, &[("a", 2), ("b", 2)], ring_chunks()).await;
    for dtype in DType::ALL {
        let whole = Tensor::rand_uniform(&[4, 37], -100.0, 100.0, 5, dtype, Device::Cpu).unwrap();
        for mesh_dim in 0..2 {
            let what = format!("{dtype} over mesh dim {mesh_dim}");
            let mut t = summands(&mut mesh, &whole, mesh_dim);
            mesh.all_reduce(&mut t, mesh_dim).await.unwrap();
            assert_eq!(t.sharding(), Sharding::Replicate, "{what}");
            let expected = whole.sum_dim(0).unwrap();
            let tolerance = if dtype == DType::F32 { 1e-4 } else { 1e-9 };
            let first = mesh.fetch_shard(&t, 0).await.unwrap();
            assert_close(&first, &expected, tolerance, &what);
            if dtype == DType::I64 {
                assert_eq!(
                    first.to_vec::<i64>().unwrap(),
                    expected.to_vec::<i64>().unwrap()
                );
            }
            for rank in 1..4 {
                let shard = mesh.fetch_shard(&t, rank).await.unwrap();
                assert_eq!(
                    shard.to_le_bytes().unwrap(),
                    first.to_le_bytes().unwrap(),
                    "{what}: rank {rank} holds other bytes than rank 0"
                );
            }
        }
    }
    // One element over two ranks: one segment is empty.
    let whole = Tensor::rand_uniform(&[2, 1], -1.0, 1.0, 3, DType::F64, Device::Cpu).unwrap();
    let mut t = summands(&mut mesh, &whole, 1);
    mesh.all_reduce(&mut t, 1).await.unwrap();
    let got = mesh.fetch(&t).await.unwrap();
    assert_close(&got, &whole.sum_dim(0).unwrap(), 1e-12, "one element");
}

/// The ring folds an 8-rank group through a deep tree of casts (fan-out
/// 2): the commands travel down the tree, the chunks from worker to worker.
#[tokio::test]
async fn a_ring_all_reduce_of_8_ranks_under_a_deep_tree() {
    let options = TensorMeshOptions {
        fanout: 2,
        chunk_bytes: 256,
        ring_min_bytes: 0,
        ..TensorMeshOptions::default()
    };
    let (_client, mut mesh) = mesh_with(8, &[("ranks", 8)], options).await;
    let whole = Tensor::rand_uniform(&[8, 300], -1.0, 1.0, 8, DType::F64, Device::Cpu).unwrap();
    let mut t = summands(&mut mesh, &whole, 0);
    mesh.all_reduce(&mut t, 0).await.unwrap();
    let expected = whole.sum_dim(0).unwrap();
    for rank in [0, 3, 7] {
        let shard = mesh.fetch_shard(&t, rank).await.unwrap();
        assert_close(&shard, &expected, 1e-12, &format!("rank {rank}"));
    }
}

/// Two ranks a proc: chunks between ranks of one proc are handed over in
/// the proc, the others cross procs; the sums are the same.
#[tokio::test]
async fn a_ring_all_reduce_with_two_ranks_a_proc() {
    let (_client, mut mesh) = mesh_with(2, &[("ranks", 4)], ring_chunks()).await;
    let whole = Tensor::rand_uniform(&[4, 50], -10.0, 10.0, 9, DType::I64, Device::Cpu).unwrap();
    let mut t = summands(&mut mesh, &whole, 0);
    mesh.all_reduce(&mut t, 0).await.unwrap();
    let expected = whole.sum_dim(0).unwrap().to_vec::<i64>().unwrap();
    for rank in 0..4 {
        let shard = mesh.fetch_shard(&t, rank).await.unwrap();
        assert_eq!(shard.to_vec::<i64>().unwrap(), expected, "rank {rank}");
    }
}

/// RG-2, RG-4: a ring whose shards are poisoned on the workers fails on
/// every rank with the poison's reason and poisons the tensor; a ring run
/// after it is not confused by the aborted run's leftovers.
#[tokio::test]
async fn rg2_a_poisoned_shard_fails_the_ring_and_the_next_ring_still_sums() {
    let (_client, mut mesh) = mesh_with(4, &[("ranks", 4)], ring_chunks()).await;
    let cpu = Device::Cpu;
    let partial = Sharding::Partial { mesh_dim: 0 };
    let ones = mesh.create(Init::Ones, &[40], DType::I64, cpu, partial);
    let mut quotient = mesh.scalar(BinaryOp::Div, &ones, 0.0);
    let error = mesh.all_reduce(&mut quotient, 0).await.unwrap_err();
    let MeshError::Poisoned { reason, .. } = &error else {
        panic!("not poison: {error}")
    };
    assert!(reason.contains("division by zero"), "{reason}");
    assert!(
        mesh.fetch(&quotient).await.is_err(),
        "the tensor is poisoned"
    );
    let mut good = mesh.create(Init::Full(3.0), &[40], DType::I64, cpu, partial);
    mesh.all_reduce(&mut good, 0).await.unwrap();
    for rank in 0..4 {
        let shard = mesh.fetch_shard(&good, rank).await.unwrap();
        assert_eq!(shard.to_vec::<i64>().unwrap(), vec![3; 40], "rank {rank}");
    }
}

#[tokio::test]
async fn poison_names_the_op_and_spreads_to_dependent_ops() {
    let (_client, mut mesh) = mesh(2, &[("ranks", 2)]).await;
    let cpu = Device::Cpu;
    // Found by the controller: shapes differ.
    let a = mesh.create(Init::Ones, &[2, 3], DType::F32, cpu, Sharding::Replicate);
    let b = mesh.create(Init::Ones, &[3, 2], DType::F32, cpu, Sharding::Replicate);
    let bad = mesh.binary(BinaryOp::Add, &a, &b);
    let error = mesh.fetch(&bad).await.unwrap_err();
    let MeshError::Poisoned { id, rank, reason } = &error else {
        panic!("not poison: {error}")
    };
    assert_eq!((*id, *rank), (bad.id(), None));
    assert!(reason.contains("add("), "names the op: {reason}");
    assert!(reason.contains("shapes differ"), "says why: {reason}");
    let dependent = mesh.unary(UnaryOp::Exp, &bad);
    let later = mesh.scalar(BinaryOp::Mul, &dependent, 2.0);
    match mesh.fetch(&later).await.unwrap_err() {
        MeshError::Poisoned { reason: r, .. } => assert_eq!(&r, reason, "inherited unchanged"),
        other => panic!("{other}"),
    }
    assert!(mesh.sync(&[&later]).await.is_err());
    // An invalid layout is poison too, named by its op.
    let rows = mesh.create(Init::Ones, &[4, 3], DType::F32, cpu, ROWS0);
    let wrong = mesh.matmul(&rows, &rows);
    let error = mesh.fetch(&wrong).await.unwrap_err().to_string();
    assert!(error.contains("matmul"), "{error}");

    // Found by the workers: integer division by zero.
    let ones = mesh.create(Init::Ones, &[3], DType::I64, cpu, Sharding::Replicate);
    let zeros = mesh.create(Init::Zeros, &[3], DType::I64, cpu, Sharding::Replicate);
    let quotient = mesh.binary(BinaryOp::Div, &ones, &zeros);
    let sum = mesh.binary(BinaryOp::Add, &quotient, &ones);
    let mut total = mesh.sum(&sum, None);
    let error = mesh.fetch(&quotient).await.unwrap_err();
    let MeshError::Poisoned {
        rank: Some(0),
        reason,
        ..
    } = &error
    else {
        panic!("not a worker's poison: {error}")
    };
    assert!(reason.contains("div("), "names the op: {reason}");
    assert!(reason.contains("division by zero"), "says why: {reason}");
    for dependent in [&sum, &total] {
        match mesh.fetch(dependent).await.unwrap_err() {
            MeshError::Poisoned { reason: r, .. } => assert_eq!(&r, reason),
            other => panic!("{other}"),
        }
    }
    let error = mesh.sync(&[&ones, &sum]).await.unwrap_err();
    assert!(error.to_string().contains("division by zero"), "{error}");
    let error = mesh.all_reduce(&mut total, 0).await.unwrap_err();
    assert!(matches!(error, MeshError::Poisoned { .. }), "{error}");
    // A worker-side failure of an in-place op poisons its target.
    let exp_of_ints = mesh.unary(UnaryOp::Exp, &ones);
    mesh.axpy(&zeros, 1.0, &exp_of_ints);
    let error = mesh.fetch(&zeros).await.unwrap_err().to_string();
    assert!(error.contains("exp"), "{error}");
    // Bad creations: a mesh dimension that does not exist, bytes that do
    // not fill the shape, a value an i64 cannot hold (found by the workers).
    let far = Sharding::Shard {
        mesh_dim: 3,
        tensor_dim: 0,
    };
    let nowhere = mesh.create(Init::Zeros, &[4], DType::F32, cpu, far);
    let short = mesh.create(Init::FromBytes(vec![0; 3]), &[4], DType::F32, cpu, ROWS0);
    let half = mesh.create(Init::Full(0.5), &[4], DType::I64, cpu, ROWS0);
    for (t, why) in [
        (&nowhere, "mesh dim 3 does not exist"),
        (&short, "3 bytes"),
        (&half, "cannot be represented as i64"),
    ] {
        let error = mesh.fetch(t).await.unwrap_err().to_string();
        assert!(error.contains("create") && error.contains(why), "{error}");
    }
    // Healthy tensors are unaffected.
    mesh.sync(&[&a, &b, &ones]).await.unwrap();
    assert_eq!(
        mesh.fetch(&ones).await.unwrap().to_vec::<i64>().unwrap(),
        vec![1; 3]
    );
}

#[tokio::test]
async fn a_garbage_payload_is_an_error_reply_and_the_worker_lives_on() {
    let (client, mut mesh) = mesh(2, &[("ranks", 2)]).await;
    let t = mesh.create(
        Init::Full(4.0),
        &[2],
        DType::F64,
        Device::Cpu,
        Sharding::Replicate,
    );
    let mut caster = Caster::new(client.mailbox(), 16);
    let target = CastTarget {
        mesh: mesh.name().to_string(),
        procs: mesh.procs().to_vec(),
        ranks: vec![vec![0], vec![1]],
    };
    for (endpoint, payload) in [
        ("tensor.create", b"\xde\xad\xbe\xef garbage".to_vec()),
        ("tensor.fetch", Vec::new()),
        ("tensor.write", vec![0xff; 256]),
        ("tensor.nope", Vec::new()),
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
            text.contains("not a valid tensor command") || text.contains("no endpoint"),
            "{endpoint}: {text}"
        );
    }
    assert_eq!(
        mesh.fetch(&t).await.unwrap().to_vec::<f64>().unwrap(),
        vec![4.0, 4.0]
    );
}

#[tokio::test]
async fn data_parallel_linear_regression_on_4_procs() {
    let (_client, mut mesh) = mesh(4, &[("dp", 4)]).await;
    let (n, d, steps, lr) = (256usize, 8usize, 20, 0.5);
    let (f32s, cpu) = (DType::F32, Device::Cpu);
    let truth: Vec<f32> = (0..d).map(|i| i as f32 * 0.5 - 1.5).collect();
    let true_w = Tensor::from_vec(truth.clone(), &[d, 1]).unwrap();
    let x_local = Tensor::rand_normal(&[n, d], 0.0, 1.0, 42, f32s, cpu).unwrap();
    let y_local = x_local.matmul(&true_w).unwrap();

    // X and y split by rows over the 4 ranks; w replicated.
    let init = Init::Normal {
        mean: 0.0,
        std: 1.0,
        seed: 42,
    };
    let x = mesh.create(init, &[n, d], f32s, cpu, ROWS0);
    let w_true = mesh.upload(&true_w, Sharding::Replicate).await.unwrap();
    let y = mesh.matmul(&x, &w_true);
    let xt = mesh.transpose(&x);
    let w = mesh.create(Init::Zeros, &[d, 1], f32s, cpu, Sharding::Replicate);

    let mut w_ref = Tensor::zeros(&[d, 1], f32s, cpu).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let prediction = mesh.matmul(&x, &w);
        let residual = mesh.binary(BinaryOp::Sub, &prediction, &y);
        let mut gradient = mesh.matmul(&xt, &residual); // partial sums
        let squares = mesh.binary(BinaryOp::Mul, &residual, &residual);
        let mut loss = mesh.sum(&squares, None); // partial sums
        mesh.all_reduce(&mut gradient, 0).await.unwrap();
        mesh.all_reduce(&mut loss, 0).await.unwrap();
        mesh.axpy(&w, -lr / n as f64, &gradient);
        let loss = mesh.fetch(&loss).await.unwrap().to_scalar().unwrap();
        losses.push(loss);
        mesh.drop(&[&prediction, &residual, &gradient, &squares]);

        // The same step on one process.
        let r = x_local.matmul(&w_ref).unwrap().sub(&y_local).unwrap();
        let g = x_local.transpose().unwrap().matmul(&r).unwrap();
        let local_loss = r.mul(&r).unwrap().sum().unwrap().to_scalar().unwrap();
        w_ref.axpy(-lr / n as f64, &g).unwrap();
        assert!(
            (loss - local_loss).abs() <= 1e-4 * local_loss.max(1e-3),
            "step {step}: loss {loss} on the mesh, {local_loss} locally"
        );
    }
    for pair in losses.windows(2) {
        assert!(
            pair[1] < pair[0],
            "the loss must fall every step: {losses:?}"
        );
    }
    assert!(
        losses[steps - 1] < losses[0] * 1e-6,
        "the loss must reach near zero: {losses:?}"
    );
    let w_final = mesh.fetch(&w).await.unwrap();
    assert_close(&w_final, &true_w, 1e-3, "w");
    assert_close(&w_final, &w_ref, 1e-4, "w against the local run");
    mesh.stop().await;
}

#[tokio::test]
async fn send_shard_moves_one_ranks_shard_into_another_ranks_through_rdma() {
    let (_client, mut mesh) = mesh(4, &[("dp", 4)]).await;
    let (f32s, cpu) = (DType::F32, Device::Cpu);
    let init = Init::Uniform {
        low: -1.0,
        high: 1.0,
        seed: 5,
    };
    let a = mesh.create(init, &[8, 3], f32s, cpu, ROWS0);
    let b = mesh.create(Init::Zeros, &[8, 3], f32s, cpu, ROWS0);
    mesh.send_shard(&a, 0, &b, 3).await.unwrap();
    let sent = mesh.fetch_shard(&a, 0).await.unwrap();
    assert_eq!(
        mesh.fetch_shard(&b, 3)
            .await
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        sent.to_vec::<f32>().unwrap()
    );
    for rank in 0..3 {
        let other = mesh.fetch_shard(&b, rank).await.unwrap();
        assert_eq!(other.to_vec::<f32>().unwrap(), vec![0.0; 6], "rank {rank}");
    }
    // The source was given back: ops read it on rank 0 as before.
    let doubled = mesh.scalar(BinaryOp::Mul, &a, 2.0);
    let expected = sent.mul_scalar(2.0).unwrap();
    assert_close(
        &mesh.fetch_shard(&doubled, 0).await.unwrap(),
        &expected,
        0.0,
        "2a",
    );

    // Shapes may differ when the bytes agree: a replicated [6] into rank
    // 1's [2, 3] block; and within one rank.
    let values: Vec<f32> = (0..6).map(|i| i as f32 + 0.5).collect();
    let flat = mesh
        .upload(
            &Tensor::from_vec(values.clone(), &[6]).unwrap(),
            Sharding::Replicate,
        )
        .await
        .unwrap();
    mesh.send_shard(&flat, 2, &b, 1).await.unwrap();
    assert_eq!(
        mesh.fetch_shard(&b, 1)
            .await
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        values
    );
    mesh.send_shard(&b, 1, &a, 1).await.unwrap();
    assert_eq!(
        mesh.fetch_shard(&a, 1)
            .await
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        values
    );
    // A shard into itself changes nothing.
    mesh.send_shard(&a, 1, &a, 1).await.unwrap();
    mesh.sync(&[&a, &b, &flat]).await.unwrap();
    mesh.stop().await;
}

#[tokio::test]
async fn send_shard_refuses_mismatched_shards_and_reports_poisoned_sources() {
    let (_client, mut mesh) = mesh(4, &[("dp", 4)]).await;
    let cpu = Device::Cpu;
    let a = mesh.create(Init::Ones, &[8, 3], DType::F32, cpu, ROWS0);
    let wide = mesh.create(Init::Ones, &[8, 4], DType::F32, cpu, ROWS0);
    let error = mesh.send_shard(&a, 0, &wide, 3).await.unwrap_err();
    let MeshError::Invalid(text) = &error else {
        panic!("not refused: {error}")
    };
    assert!(
        text.contains("[2, 3] (24 bytes)") && text.contains("[2, 4] (32 bytes)"),
        "names both shapes: {text}"
    );
    let doubles = mesh.create(Init::Ones, &[8, 3], DType::F64, cpu, ROWS0);
    let halves = mesh.create(Init::Ones, &[4, 3], DType::F64, cpu, ROWS0);
    let error = mesh.send_shard(&halves, 0, &a, 1).await.unwrap_err();
    assert!(
        matches!(&error, MeshError::Invalid(t) if t.contains("f64") && t.contains("f32")),
        "same bytes, other dtype: {error}"
    );
    let error = mesh.send_shard(&a, 0, &doubles, 4).await.unwrap_err();
    assert!(
        error.to_string().contains("rank 4 is out of range"),
        "{error}"
    );

    // Poisoned by the controller: reported, nothing sent.
    let bad = mesh.binary(BinaryOp::Add, &a, &wide);
    let error = mesh.send_shard(&bad, 0, &a, 3).await.unwrap_err();
    let MeshError::Poisoned { id, rank: None, .. } = &error else {
        panic!("not the controller's poison: {error}")
    };
    assert_eq!(*id, bad.id());

    // Poisoned on the worker: rank 0 reports it, the destination keeps its bytes.
    let zeros = mesh.create(Init::Zeros, &[8], DType::I64, cpu, ROWS0);
    let quotient = mesh.binary(BinaryOp::Div, &zeros, &zeros);
    let target = mesh.create(Init::Full(7.0), &[8], DType::I64, cpu, ROWS0);
    let error = mesh.send_shard(&quotient, 0, &target, 3).await.unwrap_err();
    let MeshError::Poisoned {
        id,
        rank: Some(0),
        reason,
    } = &error
    else {
        panic!("not rank 0's poison: {error}")
    };
    assert_eq!(*id, quotient.id());
    assert!(reason.contains("div"), "names the op: {reason}");
    assert_eq!(
        mesh.fetch_shard(&target, 3)
            .await
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![7, 7]
    );
    // A poisoned destination is reported as such, and left poisoned.
    let error = mesh.send_shard(&target, 0, &quotient, 3).await.unwrap_err();
    assert!(
        matches!(&error, MeshError::Poisoned { id, rank: Some(3), .. } if *id == quotient.id()),
        "{error}"
    );
    mesh.sync(&[&a, &target]).await.unwrap();
}
