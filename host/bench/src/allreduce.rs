//! `tensor_allreduce_gbps`: a sharded tensor summed over a mesh of procs
//! that are child processes, next to the same bytes moved raw over Unix
//! sockets between the same kinds of processes (the floor).
//!
//! ```text
//! this process (controller, 2 tokio workers)      4 child procs (this binary, `tensor-bootstrap`)
//!   TensorMesh::all_reduce of a Partial tensor  -- Unix sockets, hyperactor frames -->  a tensor worker each
//!   floor: 4 threads, blocking std sockets      -- 4 Unix sockets -->  4 floor peers (`allreduce-floor-peer`)
//! ```
//!
//! Each proc holds `S` bytes of f32 (64 MiB; 8 MiB with `--quick`): the
//! shard of a `Partial { mesh_dim: 0 }` tensor (ones on rank 0, zeros
//! elsewhere, computed by an op so that its pages are in memory, as a
//! gradient's would be), and [`TensorMesh::all_reduce`] sums it over the 4
//! ranks with the mesh's defaults: shards this large go round a ring of
//! the workers (chunks of 1 MiB, 4 of a rank's own ahead), so the
//! controller only starts it. The figures are **bytes moved** as a star
//! through the controller would move them, the definition the floor
//! measures: with `k = 4` ranks, `k S` in (the shards) and `k S` out (the
//! sum, once per rank), `2 k S` in all, so
//!
//! - `tensor_allreduce_gbps` is `2 k S * 8 / t` (Gbit/s) for an
//!   all-reduce that takes `t` (whatever path it takes: a ring moves
//!   `2 (k - 1) S` between the workers instead), and
//! - `tensor_allreduce_floor_gbps` is `2 k S * 8 / t_floor`: the floor
//!   moves the same bytes, each peer's `S` to this process and `S` back to
//!   each peer, over one Unix socket per peer, from 4 threads at once with
//!   blocking reads and writes into buffers allocated (and touched) once.
//!   No protocol, no runtime, no copies but the kernel's.
//! - `tensor_allreduce_busbw_gbps` is the all-reduce's bus bandwidth as
//!   NCCL's tests define it: `algbw = S / t`, `busbw = algbw * 2 (k - 1) /
//!   k` (Gbit/s), 3/16 of `tensor_allreduce_gbps` with `k = 4`.
//!
//! Divide the first by the second for how close the all-reduce comes to the
//! floor (the log prints it; the target is at least 0.5, "within 2x"). The
//! per-rank figure collectives often quote, `S / t`, is `k * 2` times
//! smaller than `tensor_allreduce_gbps` and goes to the log.
//!
//! Turns alternate, as in the transfers of the suite: the floor, then an
//! all-reduce, so that a machine that slows down slows both. The floor
//! runs two rounds a turn and keeps the second: the first finds its
//! buffers evicted by the all-reduce before it (15-20 % slower than rounds
//! back to back), and the floor is meant at its best. Each turn
//! creates the tensor afresh (untimed, synced), times the all-reduce
//! alone, and drops it. The first turn is a warm-up whose result is
//! checked on every rank: each rank's shard must be all ones. The floor's
//! bytes are checked once too.

use std::io::{ErrorKind, Read as _, Write as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use hyperactor_mesh::agent::Registry;
use hyperactor_mesh::alloc::{BootstrapCommand, LocalAllocator};
use hyperactor_mesh::client::MeshClient;
use monarch_tensor::mesh::{BinaryOp, Init, Sharding, TensorMesh, TensorMeshOptions, TensorRef};
use monarch_tensor::{DType, Device};
use tokio::runtime::Runtime;

use crate::report::{Rate, emit_rate, median};
use crate::worker::{Scratch, Worker};

/// Ranks (and procs) of the mesh.
pub const RANKS: usize = 4;

/// The byte each floor peer sends as its shard.
const PEER_FILL: u8 = 0x3c;
/// The byte of the floor's sum.
const SUM_FILL: u8 = 0xc3;

/// How much the all-reduce measurement does.
pub struct AllReduceSettings {
    /// Bytes of f32 per rank (`S`).
    pub bytes: usize,
    /// Timed turns after the checked warm-up turn.
    pub turns: usize,
    /// `TensorMeshOptions::ring_min_bytes`, when not the default.
    pub ring_min_bytes: Option<usize>,
    /// `TensorMeshOptions::chunk_bytes`, when not the default.
    pub chunk_bytes: Option<usize>,
    /// `TensorMeshOptions::window`, when not the default.
    pub window: Option<usize>,
}

/// Samples of one measurement, in Gbit/s of bytes moved.
struct Figures {
    reduce: Vec<f64>,
    floor: Vec<f64>,
}

/// Measures and emits `tensor_allreduce_gbps` and
/// `tensor_allreduce_floor_gbps` for the `suite`.
pub fn run(rt: &Runtime, suite: &str, s: &AllReduceSettings) -> anyhow::Result<()> {
    ensure!(
        s.bytes.is_multiple_of(4) && s.bytes > 0 && s.turns > 0,
        "an all-reduce needs a whole, non-zero number of f32s and one turn"
    );
    // Chunks of a MiB are allocated and freed many times a second on both
    // sides; the procs keep freed memory (`bootstrap_main` does it), and
    // so does this process from here on.
    hyperactor_mesh::alloc::keep_freed_memory();
    let started = Instant::now();
    let scratch = Scratch::new()?;
    let floor = rt.block_on(Floor::start(&scratch, s.bytes))?;
    let figures = rt.block_on(turns(&scratch, floor, s));
    let figures = figures?;
    tracing::debug!(
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "all-reduce measured"
    );

    crate::dataplane::log_runs("tensor_allreduce_gbps", &figures.reduce, "Gbit/s");
    crate::dataplane::log_runs("tensor_allreduce_floor_gbps", &figures.floor, "Gbit/s");
    let reduce = median(&figures.reduce).context("no all-reduce samples")?;
    let floor = median(&figures.floor).context("no floor samples")?;
    emit_rate(suite, "tensor_allreduce_gbps", reduce, Rate::Gbps)?;
    emit_rate(suite, "tensor_allreduce_floor_gbps", floor, Rate::Gbps)?;
    emit_rate(
        suite,
        "tensor_allreduce_busbw_gbps",
        busbw_of(reduce),
        Rate::Gbps,
    )?;
    let ratio = reduce / floor;
    let options = mesh_options(s);
    let moved = moved_bytes(s.bytes) as f64;
    tracing::info!(
        over_floor = format!("{:.2}", ratio),
        all_reduce_ms = format!("{:.1}", moved * 8.0 / reduce / 1e6),
        floor_ms = format!("{:.1}", moved * 8.0 / floor / 1e6),
        per_rank_gbytes_per_s = format!("{:.2}", s.bytes as f64 * reduce / moved / 8.0),
        ring_min_bytes = options.ring_min_bytes,
        chunk_bytes = options.chunk_bytes,
        window = options.window,
        "tensor_allreduce_gbps / tensor_allreduce_floor_gbps = {ratio:.2} (target >= 0.5, within 2x of the floor: {}); {RANKS} child procs x {} MiB of f32",
        if ratio >= 0.5 { "met" } else { "NOT met" },
        s.bytes >> 20,
    );
    Ok(())
}

/// The mesh's options with the settings' ring threshold, chunk and window
/// where they name one.
fn mesh_options(s: &AllReduceSettings) -> TensorMeshOptions {
    let mut options = TensorMeshOptions::default();
    if let Some(bytes) = s.ring_min_bytes {
        options.ring_min_bytes = bytes;
    }
    if let Some(bytes) = s.chunk_bytes {
        options.chunk_bytes = bytes;
    }
    if let Some(window) = s.window {
        options.window = window;
    }
    options
}

/// `2 k S`: what a star through the controller carries in one all-reduce.
fn moved_bytes(bytes: usize) -> usize {
    2 * RANKS * bytes
}

/// NCCL's bus bandwidth of an all-reduce, in Gbit/s, from its figure in
/// bytes moved (`tensor_allreduce_gbps`, `2 k S * 8 / t`): NCCL's tests
/// define `algbw = S / t` (`S` the bytes of one rank's buffer) and, for an
/// all-reduce over `n` ranks, `busbw = algbw * 2 (n - 1) / n`, the rate
/// each rank's link would need in an optimal ring, comparable across `n`.
fn busbw_of(moved_gbps: f64) -> f64 {
    let n = RANKS as f64;
    let algbw = moved_gbps * BYTES_PER_RANK_OF_MOVED;
    algbw * 2.0 * (n - 1.0) / n
}

/// `S / (2 k S)`: a rank's buffer as a share of the bytes moved.
const BYTES_PER_RANK_OF_MOVED: f64 = 1.0 / (2 * RANKS) as f64;

/// Gbit/s of bytes moved by one all-reduce (or floor round) of `bytes` per
/// rank that took `took`.
fn gbps(bytes: usize, took: Duration) -> f64 {
    moved_bytes(bytes) as f64 * 8.0 / took.as_secs_f64() / 1e9
}

async fn turns(
    scratch: &Scratch,
    mut floor: Floor,
    s: &AllReduceSettings,
) -> anyhow::Result<Figures> {
    let registry = Arc::new(registry(scratch.path().join("blobs")));
    let command = BootstrapCommand::current_exe(&["tensor-bootstrap"])
        .context("cannot find this binary to start tensor procs")?;
    let allocator = LocalAllocator::new(command, registry)
        .context("cannot make a socket directory for the tensor procs")?;
    let client = MeshClient::new(
        scratch.unix_addr("controller.sock")?,
        Arc::new(allocator),
        Arc::new(|_: &str| {}),
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot start the controller's proc: {e}"))?;
    let result = turns_on(&client, &mut floor, s).await;
    client.stop_all();
    let stopped = floor.stop().await;
    let figures = result?;
    stopped?;
    Ok(figures)
}

async fn turns_on(
    client: &Arc<MeshClient>,
    floor: &mut Floor,
    s: &AllReduceSettings,
) -> anyhow::Result<Figures> {
    let allocated = client
        .spawn_procs(RANKS)
        .await
        .map_err(|e| anyhow::anyhow!("cannot start {RANKS} tensor procs: {e}"))?;
    let procs: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
    let extent = vec![("ranks".to_string(), RANKS as u32)];
    let mut mesh = TensorMesh::spawn_with(client.clone(), &procs, extent, mesh_options(s))
        .await
        .context("cannot spawn the tensor workers")?;
    let numel = s.bytes / 4;
    let mut figures = Figures {
        reduce: Vec::new(),
        floor: Vec::new(),
    };
    for turn in 0..=s.turns {
        // The floor's second round of the turn is the one kept: the first
        // finds its buffers evicted by the all-reduce before it, which made
        // it 15-20 % slower than rounds back to back.
        floor.round(turn == 0).await?;
        let floor_took = floor.round(false).await?;
        let mut t = resident_partial(&mut mesh, numel);
        mesh.sync(&[&t]).await.context("creating the tensor")?;
        let started = Instant::now();
        mesh.all_reduce(&mut t, 0).await.context("the all-reduce")?;
        let took = started.elapsed();
        tracing::debug!(
            turn,
            all_reduce = gbps(s.bytes, took),
            floor = gbps(s.bytes, floor_took),
            "turn, Gbit/s"
        );
        if turn == 0 {
            for rank in 0..RANKS {
                let shard = mesh
                    .fetch_shard(&t, rank)
                    .await
                    .with_context(|| format!("fetching rank {rank}'s shard"))?;
                let values = shard.as_slice::<f32>()?;
                ensure!(
                    values.len() == numel,
                    "rank {rank} holds {} elements",
                    values.len()
                );
                if let Some(at) = values.iter().position(|&v| v != 1.0) {
                    bail!(
                        "after the all-reduce rank {rank} holds {} at element {at}, not 1",
                        values[at]
                    );
                }
            }
        } else {
            figures.reduce.push(gbps(s.bytes, took));
            figures.floor.push(gbps(s.bytes, floor_took));
        }
        mesh.drop(&[&t]);
    }
    mesh.stop().await;
    Ok(figures)
}

/// A `Partial` f32 tensor of `numel` elements whose ranks' shards sum to
/// ones: rank 0 holds ones, the others zeros. It is the product of an op
/// (times 1), as a gradient would be, so every shard's pages are in memory
/// before the all-reduce writes them: a freshly created tensor of zeros is
/// not, and its first write would pay for the page faults.
fn resident_partial(mesh: &mut TensorMesh, numel: usize) -> TensorRef {
    let partial = Sharding::Partial { mesh_dim: 0 };
    let created = mesh.create(Init::Ones, &[numel], DType::F32, Device::Cpu, partial);
    let t = mesh.scalar(BinaryOp::Mul, &created, 1.0);
    mesh.drop(&[&created]);
    t
}

/// The registry of a tensor proc: tensor workers only.
fn registry(blob_dir: std::path::PathBuf) -> Registry {
    let mut registry = Registry::new(blob_dir);
    monarch_tensor::mesh::register(&mut registry);
    registry
}

/// The `tensor-bootstrap` subcommand: one proc of the all-reduce's mesh,
/// whose actors are tensor workers, until the suite goes away.
pub fn serve_tensor_proc() -> anyhow::Result<()> {
    let rt = crate::worker::runtime(crate::worker::Flavor::CurrentThread, 1)?;
    rt.block_on(hyperactor_mesh::alloc::bootstrap_main(|config| {
        registry(config.blob_dir.clone())
    }))
}

/// This process's end of the floor: a Unix socket to each of [`RANKS`]
/// peer processes and the buffers, allocated and touched once.
struct Floor {
    peers: Vec<Worker>,
    streams: Vec<UnixStream>,
    shards: Vec<Vec<u8>>,
    sum: Vec<u8>,
}

impl Floor {
    /// Starts the peers (`allreduce-floor-peer`), which connect to a
    /// socket of `scratch`.
    async fn start(scratch: &Scratch, bytes: usize) -> anyhow::Result<Floor> {
        let path = scratch.path().join("floor.sock");
        let listener = UnixListener::bind(&path)
            .with_context(|| format!("cannot bind the floor's socket {}", path.display()))?;
        let mut peers = Vec::with_capacity(RANKS);
        for _ in 0..RANKS {
            peers.push(
                Worker::start(
                    "all-reduce floor",
                    &[
                        "allreduce-floor-peer".to_string(),
                        format!("--socket={}", path.display()),
                        format!("--bytes={bytes}"),
                    ],
                )
                .await?,
            );
        }
        // Each peer connected before it printed READY.
        listener.set_nonblocking(true)?;
        let mut streams = Vec::with_capacity(RANKS);
        for _ in 0..RANKS {
            let (stream, _) = listener
                .accept()
                .context("a floor peer said it was ready but has not connected")?;
            stream.set_nonblocking(false)?;
            streams.push(stream);
        }
        Ok(Floor {
            peers,
            streams,
            shards: (0..RANKS).map(|_| vec![0u8; bytes]).collect(),
            sum: vec![SUM_FILL; bytes],
        })
    }

    /// One round: every peer sends its shard and receives the sum, all at
    /// once, each on a thread of its own; `check` also checks the shards.
    async fn round(&mut self, check: bool) -> anyhow::Result<Duration> {
        let (streams, shards, sum) = (&mut self.streams, &mut self.shards, &self.sum);
        let took = tokio::task::block_in_place(|| floor_round(streams, shards, sum))?;
        if check {
            for (peer, shard) in self.shards.iter().enumerate() {
                if let Some(at) = shard.iter().position(|&b| b != PEER_FILL) {
                    bail!(
                        "floor peer {peer} sent {:#04x} at byte {at}, not {PEER_FILL:#04x}",
                        shard[at]
                    );
                }
            }
        }
        Ok(took)
    }

    /// Closes the sockets and stops the peers.
    async fn stop(self) -> anyhow::Result<()> {
        drop(self.streams);
        let mut first_error = None;
        for peer in self.peers {
            if let Err(e) = peer.stop().await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn floor_round(
    streams: &mut [UnixStream],
    shards: &mut [Vec<u8>],
    sum: &[u8],
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = streams
            .iter_mut()
            .zip(shards.iter_mut())
            .map(|(stream, shard)| {
                scope.spawn(move || -> anyhow::Result<()> {
                    stream.write_all(&[1])?;
                    stream.read_exact(shard)?;
                    stream.write_all(sum)?;
                    let mut ack = [0u8; 1];
                    stream.read_exact(&mut ack)?;
                    ensure!(ack == [1], "a floor peer answered {ack:?}");
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a floor thread panicked")))
            })
            .collect()
    });
    let took = started.elapsed();
    for result in results {
        result.context("a floor round")?;
    }
    Ok(took)
}

/// The `allreduce-floor-peer` subcommand: connects to `socket`, prints
/// `READY`, then for every round this process asks for (one byte) sends
/// `bytes` bytes of its shard, reads the sum and answers one byte, until
/// the socket or stdin closes.
pub fn serve_floor_peer(socket: &std::path::Path, bytes: usize) -> anyhow::Result<()> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to the floor's socket {}", socket.display()))?;
    let shard = vec![PEER_FILL; bytes];
    let mut sum = vec![0u8; bytes];
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "READY {}", socket.display())?;
        stdout.flush()?;
    }
    // The suite closes stdin to stop a peer; closing the socket does too.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        std::process::exit(0);
    });
    let mut checked = false;
    loop {
        let mut go = [0u8; 1];
        match stream.read_exact(&mut go) {
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        stream.write_all(&shard)?;
        stream.read_exact(&mut sum)?;
        if !checked {
            if let Some(at) = sum.iter().position(|&b| b != SUM_FILL) {
                bail!("the floor's sum holds {:#04x} at byte {at}", sum[at]);
            }
            checked = true;
        }
        stream.write_all(&[1])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_moved_are_each_ranks_shard_in_and_the_sum_out() {
        assert_eq!(moved_bytes(64 << 20), 8 * (64 << 20));
        // 512 MiB in a second is 4.29 Gbit/s.
        let rate = gbps(64 << 20, Duration::from_secs(1));
        assert!((rate - 4.294_967_296).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn bus_bandwidth_is_nccls_algbw_times_2_n_minus_1_over_n() {
        // 64 MiB a rank in a second: algbw = 0.537 Gbit/s, and with 4
        // ranks busbw = algbw * 6 / 4.
        let moved = gbps(64 << 20, Duration::from_secs(1));
        let algbw = (64u64 << 20) as f64 * 8.0 / 1e9;
        let busbw = busbw_of(moved);
        assert!((busbw - algbw * 1.5).abs() < 1e-12, "{busbw}");
    }
}
