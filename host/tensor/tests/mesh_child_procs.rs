//! Tensor meshes on procs that are child processes, and the all-reduce
//! measurement.
//!
//! This test binary is its own bootstrap command: started by a
//! `LocalAllocator` (with `MONARCH_BOOTSTRAP` set) it serves one mesh proc
//! whose registry has the `tensor` kind; started with `MESH_RAW_PEER` set it
//! is a peer of the raw-socket floor. Otherwise it runs:
//!
//! 1. `a_dead_proc_fails_fetches_from_its_ranks`: SIGKILL one of two child
//!    procs; fetches from its rank fail naming the signal, the other rank
//!    still answers.
//! 2. `rg2_a_proc_killed_during_a_ring_all_reduce_fails_it_promptly`:
//!    SIGKILL one of 3 child procs while a ring all-reduce runs; the
//!    controller aborts the ring, so the all-reduce fails within seconds
//!    (not the 300 s timeout) naming the signal, and poisons the tensor.
//! 3. The all-reduce measurement: 4 procs, each holding `--mib` MiB of f32
//!    (default 1, a smoke test; 64 for the figure in docs/tensor.md), summed
//!    over the mesh, with in-process procs and with child-process procs,
//!    beside the floor: the same bytes moved raw over Unix sockets between
//!    the same kind of endpoints (each rank's shard to the controller, the
//!    sum back to each rank; threads and blocking sockets, buffers reused).
//!    The first all-reduce of each kind is checked on every rank and not
//!    timed. Prints `monarch-bench` JSON lines; times are never asserted
//!    (the build machines are shared), and a debug build's are meaningless.
//!
//! ```sh
//! cargo test --release -p monarch-tensor --test mesh_child_procs -- --mib 64 --reps 5
//! ```
//!
//! More options: `--chunk-kib N` and `--window N` (see `TensorMeshOptions`),
//! `--only inproc|procs`, and `--breakdown` (times the reducing fetches and
//! the writes of one all-reduce apart, on stderr).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::{
    Allocator, BOOTSTRAP_ENV, BootstrapCommand, InProcessAllocator, LocalAllocator, bootstrap_main,
};
use hyperactor_mesh::client::MeshClient;
use monarch_tensor::mesh::{BinaryOp, Init, MeshError, Sharding, TensorMesh, TensorMeshOptions};
use monarch_tensor::{DType, Device};

const RAW_PEER_ENV: &str = "MESH_RAW_PEER";
const PROCS: usize = 4;
/// SIGKILL's number on Linux (this crate has no `libc`).
const SIGKILL: i32 = 9;

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
    if let Ok(path) = std::env::var(RAW_PEER_ENV) {
        let stream = UnixStream::connect(&path).expect("connect to the floor's controller");
        raw_peer(stream);
        return;
    }
    // The controller receives and sends chunks of several MiB too.
    hyperactor_mesh::alloc::keep_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (mib, reps) = (value("--mib", 1), value("--reps", 2));
    let options = TensorMeshOptions {
        chunk_bytes: value("--chunk-kib", 1 << 10) << 10,
        window: value("--window", 4),
        ..TensorMeshOptions::default()
    };
    let breakdown = args.iter().any(|a| a == "--breakdown");
    // `--only inproc` or `--only procs`: one kind of procs.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        if only.is_none() {
            a_dead_proc_fails_fetches_from_its_ranks().await;
            println!("test a_dead_proc_fails_fetches_from_its_ranks ... ok");
            rg2_a_proc_killed_during_a_ring_all_reduce_fails_it_promptly().await;
            println!("test rg2_a_proc_killed_during_a_ring_all_reduce_fails_it_promptly ... ok");
        }
        measure_all_reduce(mib, reps, options, breakdown, only.as_deref()).await;
    });
}

fn child_allocator() -> Arc<dyn Allocator> {
    let command = BootstrapCommand::current_exe(&[]).expect("this test's path");
    let blobs = std::env::temp_dir().join("tensor-mesh-child-blobs");
    Arc::new(LocalAllocator::new(command, Arc::new(registry(blobs))).expect("a socket directory"))
}

fn in_process_allocator() -> Arc<dyn Allocator> {
    let blobs = std::env::temp_dir().join("tensor-mesh-child-blobs");
    Arc::new(InProcessAllocator::new(Arc::new(registry(blobs))))
}

async fn client(allocator: Arc<dyn Allocator>, tag: &str) -> Arc<MeshClient> {
    let addr = if tag == "local" {
        format!("local:tensor-bench-{}", std::process::id())
    } else {
        let socket = std::env::temp_dir().join(format!("tensor-{tag}-{}.sock", std::process::id()));
        std::fs::remove_file(&socket).ok();
        format!("unix:{}", socket.display())
    };
    MeshClient::new(
        addr.parse().expect("an address"),
        allocator,
        Arc::new(|_: &str| {}),
    )
    .await
    .expect("a mesh client")
}

async fn a_dead_proc_fails_fetches_from_its_ranks() {
    let client = client(child_allocator(), "death").await;
    let allocated = client.spawn_procs(2).await.expect("two child procs");
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let mut mesh = TensorMesh::spawn(client.clone(), &procs, vec![("ranks".into(), 2)])
        .await
        .expect("tensor workers");
    let rows = Sharding::Shard {
        mesh_dim: 0,
        tensor_dim: 0,
    };
    let t = mesh.create(Init::Full(2.0), &[6, 2], DType::F32, Device::Cpu, rows);
    let whole = mesh.fetch(&t).await.expect("a fetch before the kill");
    assert_eq!(whole.to_vec::<f32>().unwrap(), vec![2.0; 12]);

    client.kill(&procs[1], SIGKILL).expect("kill");
    // The fetch in flight (or the next one) fails once the death is known.
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        match mesh.fetch_shard(&t, 1).await {
            Err(e) => break e,
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(_) => panic!("rank 1 still answers after SIGKILL"),
        }
    };
    let MeshError::Failed { rank: 1, reason } = &error else {
        panic!("not a failure of rank 1: {error}")
    };
    assert!(reason.contains("signal 9"), "names the signal: {reason}");
    let global = mesh.fetch(&t).await.unwrap_err();
    assert!(global.to_string().contains("signal 9"), "{global}");
    assert!(mesh.sync(&[&t]).await.is_err(), "a sync reaches every rank");
    // Rank 0 lives on, and ops still run there.
    let doubled = mesh.scalar(BinaryOp::Mul, &t, 2.0);
    let shard = mesh.fetch_shard(&doubled, 0).await.expect("rank 0 answers");
    assert_eq!(shard.to_vec::<f32>().unwrap(), vec![4.0; 6]);
    client.stop_all();
}

async fn rg2_a_proc_killed_during_a_ring_all_reduce_fails_it_promptly() {
    let client = client(child_allocator(), "ring-death").await;
    let allocated = client.spawn_procs(3).await.expect("three child procs");
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    // Small chunks, a window of one: the ring takes many round trips (87,000
    // hops in all; about 0.4 s in a release build on 2 cores, longer in a
    // debug one), so the kill lands while it runs, after rank 0 wrote its
    // first sums.
    let options = TensorMeshOptions {
        chunk_bytes: 1 << 10,
        window: 1,
        ring_min_bytes: 0,
        ..TensorMeshOptions::default()
    };
    let mut mesh =
        TensorMesh::spawn_with(client.clone(), &procs, vec![("ranks".into(), 3)], options)
            .await
            .expect("tensor workers");
    let partial = Sharding::Partial { mesh_dim: 0 };
    let mut t = mesh.create(Init::Ones, &[16 << 20], DType::F32, Device::Cpu, partial);
    mesh.sync(&[&t]).await.expect("the tensor");
    let killer = {
        let (client, victim) = (client.clone(), procs[1].clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.kill(&victim, SIGKILL).expect("kill");
        })
    };
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(60), mesh.all_reduce(&mut t, 0))
        .await
        .expect("the all-reduce ends within a minute of a death");
    killer.await.expect("the killer");
    let error = result.expect_err("a ring with a rank killed in its middle cannot sum");
    assert!(
        started.elapsed() > Duration::from_millis(200),
        "the ring ended before the kill ({:?}): make it longer",
        started.elapsed()
    );
    assert!(
        error.to_string().contains("signal 9"),
        "names the death: {error}"
    );
    let poisoned = mesh
        .fetch_shard(&t, 0)
        .await
        .expect_err("the tensor is poisoned");
    assert!(matches!(poisoned, MeshError::Poisoned { .. }), "{poisoned}");
    client.stop_all();
}

/// One all-reduce of `mib` MiB of f32 per rank over 4 ranks, `reps` times;
/// the median time, in seconds.
async fn time_all_reduce(
    client: Arc<MeshClient>,
    mib: usize,
    reps: usize,
    options: TensorMeshOptions,
    breakdown: bool,
) -> f64 {
    let allocated = client.spawn_procs(PROCS).await.expect("procs");
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let extent = vec![("ranks".to_string(), PROCS as u32)];
    let mut mesh = TensorMesh::spawn_with(client.clone(), &procs, extent, options.clone())
        .await
        .expect("tensor workers");
    let numel = (mib << 20) / 4;
    let mut times = Vec::new();
    for rep in 0..reps + 1 {
        // Rank 0 holds ones, the others zeros: the sum is ones everywhere.
        // Times 1, as a gradient is the result of an op: every shard's
        // pages are in memory (a fresh tensor of zeros is not, and the
        // all-reduce's writes would pay for its page faults).
        let partial = Sharding::Partial { mesh_dim: 0 };
        let created = mesh.create(Init::Ones, &[numel], DType::F32, Device::Cpu, partial);
        let mut t = mesh.scalar(BinaryOp::Mul, &created, 1.0);
        mesh.drop(&[&created]);
        mesh.sync(&[&t]).await.expect("created");
        let start = Instant::now();
        mesh.all_reduce(&mut t, 0).await.expect("all-reduce");
        let elapsed = start.elapsed().as_secs_f64();
        if rep == 0 {
            // Warm-up, and a check that the sum is right on every rank.
            for rank in 0..PROCS {
                let shard = mesh.fetch_shard(&t, rank).await.expect("fetch");
                let values = shard.as_slice::<f32>().expect("f32");
                assert!(
                    values.iter().all(|&v| v == 1.0),
                    "rank {rank} holds a wrong sum"
                );
            }
        } else {
            times.push(elapsed);
        }
        if breakdown && rep == reps {
            phases(&client, &mesh, &t, numel, &options).await;
        }
        mesh.drop(&[&t]);
    }
    mesh.stop().await;
    client.stop_all();
    median(&mut times)
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The floor peer: sends its shard, receives the sum, acknowledges.
fn raw_peer(mut stream: UnixStream) {
    let mut header = [0u8; 16];
    if stream.read_exact(&mut header).is_err() {
        return;
    }
    let bytes = u64::from_le_bytes(header[..8].try_into().unwrap()) as usize;
    let reps = u64::from_le_bytes(header[8..].try_into().unwrap());
    let shard = vec![1u8; bytes];
    let mut sum = vec![0u8; bytes];
    for _ in 0..reps {
        let mut go = [0u8; 1];
        if stream.read_exact(&mut go).is_err() || stream.write_all(&shard).is_err() {
            return;
        }
        if stream.read_exact(&mut sum).is_err() || stream.write_all(&[1]).is_err() {
            return;
        }
    }
}

/// The bytes-moved floor over `streams` (one per rank): each rank's
/// shard to the controller, then the sum to each rank, concurrently per
/// rank as the all-reduce does, with buffers allocated (and touched) once;
/// the median time of `reps`, in seconds.
fn raw_floor(mut streams: Vec<UnixStream>, bytes: usize, reps: usize) -> f64 {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&(bytes as u64).to_le_bytes());
    header[8..].copy_from_slice(&(reps as u64 + 1).to_le_bytes());
    for s in &mut streams {
        s.write_all(&header).expect("header");
    }
    let sum = vec![2u8; bytes];
    let mut shards: Vec<Vec<u8>> = streams.iter().map(|_| vec![0u8; bytes]).collect();
    let mut times = Vec::new();
    for rep in 0..reps + 1 {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for (s, shard) in streams.iter_mut().zip(&mut shards) {
                let sum = &sum;
                scope.spawn(move || {
                    s.write_all(&[0]).expect("go");
                    s.read_exact(shard).expect("a shard");
                    s.write_all(sum).expect("the sum");
                    let mut ack = [0u8; 1];
                    s.read_exact(&mut ack).expect("an ack");
                });
            }
        });
        if rep > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    median(&mut times)
}

fn floor_in_process(bytes: usize, reps: usize) -> f64 {
    let mut mine = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..PROCS {
        let (a, b) = UnixStream::pair().expect("a socket pair");
        mine.push(a);
        peers.push(std::thread::spawn(move || raw_peer(b)));
    }
    let t = raw_floor(mine, bytes, reps);
    for p in peers {
        p.join().ok();
    }
    t
}

fn floor_child_processes(bytes: usize, reps: usize) -> f64 {
    let path = std::env::temp_dir().join(format!("tensor-floor-{}.sock", std::process::id()));
    std::fs::remove_file(&path).ok();
    let listener = UnixListener::bind(&path).expect("a floor socket");
    let exe = std::env::current_exe().expect("this test's path");
    let mut children: Vec<_> = (0..PROCS)
        .map(|_| {
            std::process::Command::new(&exe)
                .env(RAW_PEER_ENV, &path)
                .spawn()
                .expect("a floor peer")
        })
        .collect();
    let streams = (0..PROCS)
        .map(|_| listener.accept().expect("a peer").0)
        .collect();
    let t = raw_floor(streams, bytes, reps);
    for c in &mut children {
        c.wait().ok();
    }
    std::fs::remove_file(&path).ok();
    t
}

fn report(metric: &str, value: f64, unit: &str) {
    println!(r#"{{"suite":"tensor","metric":"{metric}","value":{value:.3},"unit":"{unit}"}}"#);
}

/// Times the halves of an all-reduce with raw casts: the reducing fetches
/// alone, and the writes alone.
async fn phases(
    client: &MeshClient,
    mesh: &TensorMesh,
    t: &monarch_tensor::mesh::TensorRef,
    numel: usize,
    options: &TensorMeshOptions,
) {
    use hyperactor_mesh::{CastMode, CastTarget, Caster, Reducer};
    use monarch_tensor::mesh::Command;
    let mut caster = Caster::new(client.mailbox(), options.fanout);
    let target = CastTarget {
        mesh: mesh.name().to_string(),
        procs: mesh.procs().to_vec(),
        ranks: (0..PROCS as u32).map(|r| vec![r]).collect(),
    };
    let chunk = options.chunk_bytes / 4;
    let timeout = Duration::from_secs(60);
    for (what, mode) in [
        ("reduce", CastMode::Reduce(Reducer::SumF32s)),
        ("gather", CastMode::Gather),
    ] {
        let start = Instant::now();
        let mut in_flight = 0;
        let mut at = 0;
        while at < numel || in_flight > 0 {
            while at < numel && in_flight < options.window {
                let len = chunk.min(numel - at);
                let command = Command::Fetch {
                    id: t.id(),
                    start: at as u64,
                    len: len as u64,
                };
                caster.cast(
                    target.clone(),
                    command.endpoint(),
                    command.encode(),
                    mode,
                    timeout,
                );
                at += len;
                in_flight += 1;
            }
            caster.next().await.expect("an outcome");
            in_flight -= 1;
        }
        eprintln!(
            "  {what} only: {:.1} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
    let payload = vec![0u8; chunk * 4];
    let start = Instant::now();
    let (mut in_flight, mut at) = (0, 0);
    while at < numel || in_flight > 0 {
        while at < numel && in_flight < options.window {
            let len = chunk.min(numel - at);
            let command = Command::Write {
                id: t.id(),
                start: at as u64,
                bytes: payload[..len * 4].to_vec(),
            };
            caster.cast(
                target.clone(),
                command.endpoint(),
                command.encode(),
                CastMode::Gather,
                timeout,
            );
            at += len;
            in_flight += 1;
        }
        caster.next().await.expect("an outcome");
        in_flight -= 1;
    }
    eprintln!(
        "  write only: {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
}

async fn measure_all_reduce(
    mib: usize,
    reps: usize,
    options: TensorMeshOptions,
    breakdown: bool,
    only: Option<&str>,
) {
    let bytes = mib << 20;
    let gb = bytes as f64 / 1e9;
    let moved = 2.0 * PROCS as f64 * gb;
    for (tag, allocator) in [
        ("inproc", in_process_allocator()),
        ("procs", child_allocator()),
    ] {
        if only.is_some_and(|o| o != tag) {
            continue;
        }
        let client = client(allocator, if tag == "inproc" { "local" } else { tag }).await;
        let t = time_all_reduce(client, mib, reps, options.clone(), breakdown).await;
        let floor = if tag == "inproc" {
            floor_in_process(bytes, reps)
        } else {
            floor_child_processes(bytes, reps)
        };
        let name = format!("all_reduce_{PROCS}x{mib}mib_{tag}");
        report(&format!("{name}_ms"), t * 1e3, "ms");
        report(&format!("{name}_gbps"), gb / t, "GB/s");
        report(&format!("{name}_moved_gbps"), moved / t, "GB/s");
        report(&format!("{name}_floor_ms"), floor * 1e3, "ms");
        report(&format!("{name}_over_floor"), t / floor, "x");
    }
    if cfg!(debug_assertions) {
        eprintln!("(a debug build: the figures above say nothing; add --release)");
    }
    println!("test measure_all_reduce ... ok");
}
