//! dataplane: drives the `tensor` and `rdma` interfaces on a 2 x 2 mesh of
//! procs and checks what comes back, results and errors alike. Every check
//! that holds logs `ok: <name>`; the first that does not fails the run with
//! what it saw. `tests/component.rs` runs it and looks for every line.
//!
//! Arguments pick a part: `tensor`, `rdma`, or both when none is given.

use monarch_guest::prelude::*;
use monarch_guest::rdma::{Buffer, BufferRef};
use monarch_guest::tensor::{DType, Device, Init, Sharding, Tensor, TensorEngine};

type Checked = Result<(), String>;

fn ensure(ok: bool, what: &str, detail: impl FnOnce() -> String) -> Checked {
    if ok {
        info!("ok: {what}");
        Ok(())
    } else {
        Err(format!("{what}: {}", detail()))
    }
}

/// Checks that `result` is an error whose text contains `needle`.
fn fails_with<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, impl std::fmt::Display>,
    needle: &str,
) -> Checked {
    match result {
        Ok(value) => Err(format!(
            "{what}: expected an error with {needle:?}, got {value:?}"
        )),
        Err(e) => {
            let text = e.to_string();
            if text.contains(needle) {
                info!("ok: {what}: {text}");
                Ok(())
            } else {
                Err(format!(
                    "{what}: expected an error with {needle:?}, got {text:?}"
                ))
            }
        }
    }
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs()))
}

async fn fetch_f32(t: &Tensor) -> Result<Vec<f32>, String> {
    t.fetch::<f32>().await.map_err(|e| e.to_string())
}

async fn tensors(procs: &ProcMesh) -> Checked {
    let engine = TensorEngine::spawn(procs)?;
    let cpu = Device::Cpu;
    let normal = Init::Normal {
        mean: 0.0,
        std: 1.0,
        seed: 7,
    };

    // The same seeded tensor whatever the layout.
    let whole = engine.create(
        &[6, 4],
        DType::F32,
        cpu,
        Sharding::Replicate,
        normal.clone(),
    );
    let by_rows = engine.create(
        &[6, 4],
        DType::F32,
        cpu,
        Sharding::shard("gpus", 0),
        normal.clone(),
    );
    let by_cols = engine.create(
        &[6, 4],
        DType::F32,
        cpu,
        Sharding::shard("hosts", 1),
        normal,
    );
    let reference = fetch_f32(&whole).await?;
    ensure(
        reference.len() == 24,
        "a fetch returns every element",
        || format!("{} elements", reference.len()),
    )?;
    let rows = fetch_f32(&by_rows).await?;
    let cols = fetch_f32(&by_cols).await?;
    ensure(
        rows == reference && cols == reference,
        "shardings hold the same global tensor",
        || format!("{reference:?} vs {rows:?} vs {cols:?}"),
    )?;

    // Uneven blocks: 5 rows over gpus=2 are 3 + 2 (the first block is larger).
    let values: Vec<f32> = (0..15).map(|v| v as f32).collect();
    let uneven = engine.from_slice(&values, &[5, 3], cpu, Sharding::shard("gpus", 0));
    let shard0 = uneven
        .fetch_shard::<f32>(0)
        .await
        .map_err(|e| e.to_string())?;
    let shard1 = uneven
        .fetch_shard::<f32>(1)
        .await
        .map_err(|e| e.to_string())?;
    let shard2 = uneven
        .fetch_shard::<f32>(2)
        .await
        .map_err(|e| e.to_string())?;
    ensure(
        shard0 == values[..9] && shard1 == values[9..] && shard2 == shard0,
        "fetch-shard returns each rank's block",
        || format!("{shard0:?} / {shard1:?} / {shard2:?}"),
    )?;

    // Elementwise ops, a matmul and a sum, against the same on the CPU here.
    let a = engine.from_slice(
        &[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0],
        &[2, 3],
        cpu,
        Sharding::Replicate,
    );
    let tripled = &(&a * 2.0) + &a;
    ensure(
        fetch_f32(&tripled).await? == [3.0, -6.0, 9.0, -12.0, 15.0, -18.0],
        "scalar and elementwise ops",
        || "&(&a * 2.0) + &a".into(),
    )?;
    ensure(
        fetch_f32(&a.relu().neg()).await? == [-1.0, 0.0, -3.0, 0.0, -5.0, 0.0],
        "unary ops",
        || "-relu(a)".into(),
    )?;
    let product = fetch_f32(&a.matmul(&a.t())).await?;
    ensure(
        product == [14.0, -32.0, -32.0, 77.0],
        "matmul and transpose",
        || format!("{product:?}"),
    )?;
    let total = a.sum().item().await.map_err(|e| e.to_string())?;
    ensure(total == -3.0, "sum to one value", || format!("{total}"))?;

    // Partial sums and an all-reduce over one dimension.
    let x = engine.from_slice(&values[..12], &[4, 3], cpu, Sharding::shard("gpus", 0));
    let gram = x.t().matmul(&x);
    ensure(
        gram.layout().sharding == Sharding::partial("gpus"),
        "xᵀx of row blocks is partial",
        || format!("{:?}", gram.layout()),
    )?;
    gram.all_reduce("gpus").await.map_err(|e| e.to_string())?;
    ensure(
        gram.layout().sharding == Sharding::Replicate,
        "an all-reduce replicates",
        || format!("{:?}", gram.layout()),
    )?;
    let mut expected = vec![0.0f32; 9];
    for i in 0..3 {
        for j in 0..3 {
            expected[i * 3 + j] = (0..4).map(|r| values[r * 3 + i] * values[r * 3 + j]).sum();
        }
    }
    let got = fetch_f32(&gram).await?;
    ensure(
        close(&got, &expected),
        "the all-reduced sum is xᵀx",
        || format!("{got:?} vs {expected:?}"),
    )?;
    let w = engine.zeros(&[3, 3], DType::F32, Sharding::Replicate);
    w.axpy(0.5, &gram);
    let half: Vec<f32> = expected.iter().map(|v| v * 0.5).collect();
    ensure(
        close(&fetch_f32(&w).await?, &half),
        "axpy after an all-reduce sees the sum",
        || "w = 0.5 xᵀx".into(),
    )?;

    // A tensor bigger than one message goes to the ranks in chunks.
    let big: Vec<f32> = (0..(600 * 1024)).map(|v| (v % 1000) as f32).collect();
    let uploaded = engine.from_slice(&big, &[600, 1024], cpu, Sharding::shard("hosts", 0));
    ensure(
        fetch_f32(&uploaded).await? == big,
        "a 2.4 MB tensor from bytes",
        || "the fetched tensor differs".into(),
    )?;

    // Moving a shard from proc to proc through RDMA buffers.
    let dst = engine.zeros(&[4, 3], DType::F32, Sharding::shard("gpus", 0));
    x.send_shard(0, &dst, 3).await.map_err(|e| e.to_string())?;
    let moved = dst.fetch_shard::<f32>(3).await.map_err(|e| e.to_string())?;
    let untouched = dst.fetch_shard::<f32>(1).await.map_err(|e| e.to_string())?;
    ensure(
        moved == values[..6] && untouched == [0.0; 6],
        "send-shard copies one rank's shard into another's",
        || format!("{moved:?}, {untouched:?}"),
    )?;
    fails_with(
        "send-shard of unequal shards is refused",
        x.send_shard(0, &uneven, 0).await,
        "must be equal",
    )?;

    // Errors are values, and they name what failed.
    let other_shape = engine.ones(&[3, 2], DType::F32, Sharding::Replicate);
    let bad = a.add(&other_shape);
    fails_with(
        "a shape mismatch poisons the result",
        bad.fetch::<f32>().await,
        "shapes differ",
    )?;
    fails_with(
        "and what is computed from it",
        bad.exp().sum().item().await,
        "shapes differ",
    )?;
    let ints = engine.from_slice(&[4i64, 2], &[2], cpu, Sharding::Replicate);
    let zeros = engine.zeros(&[2], DType::I64, Sharding::Replicate);
    let quotient = ints.div(&zeros);
    match quotient.fetch::<i64>().await {
        Err(e) if e.kind() == ErrorKind::Endpoint && e.message().contains("division by zero") => {
            info!("ok: a rank's failure poisons the result and names the op")
        }
        other => return Err(format!("integer division by zero: {other:?}")),
    }
    fails_with(
        "an unknown mesh dimension in a sharding",
        engine
            .zeros(&[4], DType::F32, Sharding::shard("nope", 0))
            .fetch::<f32>()
            .await,
        "no dimension `nope`",
    )?;
    fails_with(
        "an all-reduce over an unknown dimension",
        x.all_reduce("nope").await,
        "no dimension `nope`",
    )?;
    fails_with(
        "a fetch from a rank out of range",
        x.fetch_shard::<f32>(9).await,
        "out of range",
    )?;
    fails_with(
        "bytes that do not fill the shape",
        engine
            .create(
                &[4],
                DType::F32,
                cpu,
                Sharding::Replicate,
                Init::Bytes(vec![1, 2, 3]),
            )
            .fetch::<f32>()
            .await,
        "do not hold",
    )?;
    fails_with(
        "a fetch as the wrong dtype",
        a.fetch::<f64>().await,
        "fetch it as f32",
    )?;
    let second = TensorEngine::spawn(procs)?;
    let foreign = second.ones(&[2, 3], DType::F32, Sharding::Replicate);
    fails_with(
        "operands of two engines",
        a.add(&foreign).fetch::<f32>().await,
        "different tensor engines",
    )?;
    ensure(
        fetch_f32(&a.add(&a)).await? == [2.0, -4.0, 6.0, -8.0, 10.0, -12.0],
        "the engine carries on after errors",
        || "a + a".into(),
    )?;
    engine.sync().await.map_err(|e| e.to_string())?;
    info!("ok: sync");
    Ok(())
}

async fn buffers(procs: &ProcMesh) -> Checked {
    let a = Buffer::allocate(procs, 0, 11)?;
    let b = Buffer::allocate(procs, 3, 11)?;
    ensure(a.size() == 11, "a buffer has its size", || {
        format!("{}", a.size())
    })?;
    a.write(0, b"hello world")
        .await
        .map_err(|e| e.to_string())?;
    a.read_into(&b).await.map_err(|e| e.to_string())?;
    let world = b.read(6, 5).await.map_err(|e| e.to_string())?;
    ensure(world == b"world", "read-into copies proc to proc", || {
        format!("{world:?}")
    })?;
    let c = Buffer::allocate(procs, 1, 11)?;
    c.write_from(&a).await.map_err(|e| e.to_string())?;
    let all = c.read(0, 11).await.map_err(|e| e.to_string())?;
    ensure(
        all == b"hello world",
        "write-from copies proc to proc",
        || format!("{all:?}"),
    )?;
    let reopened = Buffer::from_ref(&a.to_ref())?;
    let hello = reopened.read(0, 5).await.map_err(|e| e.to_string())?;
    ensure(
        hello == b"hello",
        "a reference names the same buffer",
        || format!("{hello:?}"),
    )?;

    let small = Buffer::allocate(procs, 2, 4)?;
    fails_with(
        "transfers between buffers of different sizes",
        a.read_into(&small).await,
        "sizes differ",
    )?;
    fails_with("a read past the end", a.read(8, 8).await, "exceeds")?;
    fails_with(
        "a write past the end",
        small.write(2, b"abc").await,
        "exceeds",
    )?;
    fails_with(
        "an allocation on a rank out of range",
        Buffer::allocate(procs, 4, 8),
        "out of range",
    )?;
    fails_with(
        "a reference that is not one",
        Buffer::from_ref(&BufferRef(vec![1, 2, 3])),
        "not a buffer reference",
    )?;
    a.free().await.map_err(|e| e.to_string())?;
    fails_with(
        "a freed buffer cannot be read",
        reopened.read(0, 5).await,
        "not allocated",
    )?;
    fails_with(
        "nor read from by another proc",
        reopened.read_into(&b).await,
        "deregistered",
    )?;
    let still = b.read(0, 5).await.map_err(|e| e.to_string())?;
    ensure(still == b"hello", "other buffers live on", || {
        format!("{still:?}")
    })?;
    Ok(())
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let procs = spawn_procs(&extent!(hosts = 2, gpus = 2))?;
    let all = args.is_empty();
    if all || args.iter().any(|a| a == "tensor") {
        tensors(&procs).await?;
    }
    if all || args.iter().any(|a| a == "rdma") {
        buffers(&procs).await?;
    }
    info!("all checks passed");
    Ok(())
}

monarch_guest::program! {
    main: main,
}
