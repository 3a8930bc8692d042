//! The `dataplane` suite: bulk bytes between two processes through
//! `monarch-rdma`'s TCP backend, next to a bare TCP stream between the same
//! two processes (the floor), matmul throughput of `monarch-tensor`, and
//! last its mesh all-reduce over child procs next to raw Unix sockets
//! ([`crate::allreduce`]).
//!
//! ```text
//! this process (2 tokio workers)               worker process (dataplane-worker, 2 tokio workers)
//!   RdmaManager, source + back buffers  -- rdma tcp (4 conns) -->  RdmaManager, destination buffer
//!   bare TCP client (blocking std)      -- 1 tcp connection -->    bare TCP sink (blocking std),
//!                                                                  reading into the same destination
//! ```
//!
//! The worker is this binary run again (`dataplane-worker`, hidden). It
//! allocates and registers the destination buffer, fills it (so no timed
//! run pays for its first page faults), starts the bare sink, prints `READY
//! <handle as hex> <sink address>` and lives until its stdin closes.
//!
//! Each turn moves the same bytes three ways, in this order:
//!
//! - `raw_tcp_gbps`: one `write_all` of the whole source region on one
//!   connection (kept across turns, so its buffers stay grown), read by the
//!   worker with one `read_exact` straight into the destination region; the
//!   worker answers one byte when every byte is in. No protocol, no runtime.
//! - `rdma_tcp_gbps`: `write_from` of the source buffer into the
//!   destination's handle (a one-sided WRITE, default `RdmaConfig`).
//! - `rdma_tcp_read_gbps`: `read_into` of the destination's handle into a
//!   second local buffer (a one-sided READ).
//!
//! The transfers take turns with the floor, as
//! `host/rdma/examples/throughput.rs` does, so that a machine that slows
//! down slows a figure and its floor alike;
//! each metric is the median over the timed turns, after untimed warm-up
//! turns. Before the warm-up the suite checks that the bytes arrive: a READ
//! of the worker's pattern and a WRITE then READ of this process's; after
//! the timed turns the last READ must hold the source's bytes.
//!
//! Matmul (`matmul_gflops`, `matmul_f64_gflops`) multiplies two random
//! 1024 x 1024 CPU tensors with `Tensor::matmul`, `2 N^3` flops a product,
//! median after one warm-up; `matmul_floor_gflops` is a plain `i-k-j` loop
//! on f32 at N = 256, what the obvious code gets on this machine (as in
//! `host/tensor/examples/matmul_gflops.rs`). With the `cuda` feature and a
//! GPU, `cuda_matmul_gflops` does f32 at N = 4096 on `cuda:0`.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Args;
use monarch_rdma::{BackendKind, Buffer, BufferHandle, RdmaConfig, RdmaManager, Region};
use monarch_tensor::{DType, Device};
use tokio::runtime::Runtime;

use crate::allreduce::AllReduceSettings;
use crate::report::{Rate, Spread, emit_rate, median};
use crate::worker::{Flavor, Worker};

const SUITE: &str = "dataplane";

/// Tokio worker threads of both processes: the size of the machines the
/// suite is meant for.
const THREADS: usize = 2;

/// Side of the CPU matmuls.
const MATMUL_N: usize = 1024;
/// Side of the CPU matmuls with `--quick`: a debug build (the smoke test)
/// multiplies at about 1 GFLOP/s, so N = 1024 would take half a minute.
const QUICK_MATMUL_N: usize = 256;
/// Side of the naive loop (the matmul floor).
const FLOOR_N: usize = 256;
/// Side of the CUDA matmul.
const CUDA_N: usize = 4096;
/// CUDA products per timed sample, so that the wait for the result
/// (one element copied back) is a small part of it.
const CUDA_PRODUCTS_PER_SAMPLE: usize = 8;

/// The byte the worker fills its buffer with before anything moves.
const WORKER_FILL: u8 = 0x5a;

/// Arguments of the dataplane suite.
#[derive(Debug, Args)]
pub struct DataplaneArgs {
    /// Move 64 MiB instead of 1 GiB, multiply at N = 256 instead of 1024,
    /// all-reduce 8 MiB a rank instead of 64, and repeat less: a smoke test
    /// of a few seconds; rough figures.
    #[arg(long)]
    quick: bool,
    /// The smallest shard the all-reduce sums round a ring of the workers
    /// (`TensorMeshOptions::ring_min_bytes`; default the mesh's, 256 KiB).
    /// 18446744073709551615 sends it through the controller's multicast
    /// tree instead, as the comparisons in docs/benchmarks.md do.
    #[arg(long, value_name = "BYTES")]
    allreduce_ring_min_bytes: Option<usize>,
    /// Bytes of a chunk the all-reduce moves at a time
    /// (`TensorMeshOptions::chunk_bytes`; default the mesh's, 1 MiB).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(4..=(1 << 30)))]
    allreduce_chunk_bytes: Option<u64>,
    /// Chunks the all-reduce keeps in flight (`TensorMeshOptions::window`;
    /// default the mesh's, 4).
    #[arg(long, value_name = "CHUNKS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    allreduce_window: Option<u32>,
}

/// How much the suite does.
struct Settings {
    /// Bytes moved by each transfer.
    bytes: usize,
    /// Untimed turns (each: floor, write, read) before the timed ones.
    warmup_turns: usize,
    /// Timed turns.
    turns: usize,
    /// Side of the CPU matmuls.
    matmul_n: usize,
    /// Timed products per CPU matmul metric, after one warm-up.
    matmul_reps: usize,
    /// Timed runs of the naive loop, after one warm-up.
    floor_reps: usize,
    /// Timed samples of the CUDA matmul, after one warm-up sample.
    cuda_reps: usize,
    /// The all-reduce: bytes of f32 per rank, timed turns.
    allreduce: AllReduceSettings,
}

impl Settings {
    fn new(quick: bool) -> Settings {
        if quick {
            Settings {
                bytes: 64 << 20,
                warmup_turns: 1,
                turns: 3,
                matmul_n: QUICK_MATMUL_N,
                matmul_reps: 3,
                floor_reps: 3,
                cuda_reps: 3,
                allreduce: AllReduceSettings {
                    bytes: 8 << 20,
                    turns: 3,
                    ring_min_bytes: None,
                    chunk_bytes: None,
                    window: None,
                },
            }
        } else {
            Settings {
                bytes: 1 << 30,
                warmup_turns: 1,
                turns: 7,
                matmul_n: MATMUL_N,
                matmul_reps: 7,
                floor_reps: 21,
                cuda_reps: 7,
                allreduce: AllReduceSettings {
                    bytes: 64 << 20,
                    turns: 7,
                    ring_min_bytes: None,
                    chunk_bytes: None,
                    window: None,
                },
            }
        }
    }
}

/// Runs the suite.
pub fn main(args: DataplaneArgs) -> anyhow::Result<()> {
    let began = Instant::now();
    let mut settings = Settings::new(args.quick);
    settings.allreduce.ring_min_bytes = args.allreduce_ring_min_bytes;
    settings.allreduce.chunk_bytes = args.allreduce_chunk_bytes.map(|b| b as usize);
    settings.allreduce.window = args.allreduce_window.map(|w| w as usize);
    tracing::info!(
        quick = args.quick,
        bytes = settings.bytes,
        turns = settings.turns,
        "dataplane suite"
    );
    let rt = crate::worker::runtime(Flavor::MultiThread, THREADS)?;
    let result = transfers(&rt, &settings)
        .and_then(|()| matmuls(&settings))
        .and_then(|()| crate::allreduce::run(&rt, SUITE, &settings.allreduce));
    rt.shutdown_timeout(Duration::from_secs(1));
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "dataplane suite done"
    );
    result
}

/// `raw_tcp_gbps`, `rdma_tcp_gbps` and `rdma_tcp_read_gbps`, against a
/// worker process.
fn transfers(rt: &Runtime, s: &Settings) -> anyhow::Result<()> {
    let bytes = s.bytes;
    let worker = rt.block_on(Worker::start(
        "dataplane",
        &["dataplane-worker".to_string(), format!("--bytes={bytes}")],
    ))?;
    let outcome = transfer_turns(rt, s, worker.ready());
    // Stop the worker (and free its buffer) before anything else runs.
    let stopped = rt.block_on(worker.stop());
    let figures = outcome?;
    stopped?;

    let raw = median(&figures.raw).context("no raw samples")?;
    let write = median(&figures.write).context("no write samples")?;
    let read = median(&figures.read).context("no read samples")?;
    for (metric, samples) in [
        ("raw_tcp_gbps", &figures.raw),
        ("rdma_tcp_gbps", &figures.write),
        ("rdma_tcp_read_gbps", &figures.read),
    ] {
        log_runs(metric, samples, "Gbit/s");
    }
    emit_rate(SUITE, "raw_tcp_gbps", raw, Rate::Gbps)?;
    emit_rate(SUITE, "rdma_tcp_gbps", write, Rate::Gbps)?;
    emit_rate(SUITE, "rdma_tcp_read_gbps", read, Rate::Gbps)?;
    let target = |ratio: f64| if ratio >= 0.8 { "met" } else { "NOT met" };
    tracing::info!(
        write_over_raw = format!("{:.2}", write / raw),
        read_over_raw = format!("{:.2}", read / raw),
        "rdma_tcp_gbps / raw_tcp_gbps = {:.2} (target >= 0.8: {}); rdma_tcp_read_gbps / raw_tcp_gbps = {:.2}",
        write / raw,
        target(write / raw),
        read / raw,
    );
    Ok(())
}

/// Samples of each transfer, in Gbit/s, one a timed turn.
struct TransferFigures {
    raw: Vec<f64>,
    write: Vec<f64>,
    read: Vec<f64>,
}

fn transfer_turns(rt: &Runtime, s: &Settings, ready: &str) -> anyhow::Result<TransferFigures> {
    let bytes = s.bytes;
    let (remote, sink_addr) = parse_ready(ready)?;
    ensure!(
        remote.len() == bytes as u64,
        "the worker's buffer holds {} bytes, not {bytes}",
        remote.len()
    );

    let setup = Instant::now();
    let manager = rt.block_on(RdmaManager::new(RdmaConfig::default()))?;
    let source = manager.alloc(bytes)?;
    let back = manager.alloc(bytes)?;
    fill_pattern(source.region())?;
    tracing::debug!(
        seconds = format!("{:.2}", setup.elapsed().as_secs_f64()),
        "source filled"
    );
    let backend = manager.backend_for(&source, &remote);
    ensure!(
        backend == BackendKind::Tcp,
        "transfers to the worker would use the {backend:?} backend, not TCP"
    );
    if let Some(reason) = manager.ibverbs_unavailable() {
        tracing::debug!("ibverbs: {reason}");
    }

    // The bytes arrive, both ways: the worker's fill comes back, then the
    // source goes there and comes back.
    read(rt, &manager, &back, &remote)?;
    check_filled(back.region(), WORKER_FILL).context("a READ from the worker")?;
    write(rt, &manager, &source, &remote)?;
    read(rt, &manager, &back, &remote)?;
    check_same(source.region(), back.region()).context("a WRITE to the worker read back")?;
    tracing::debug!(
        seconds = format!("{:.2}", setup.elapsed().as_secs_f64()),
        "bytes checked both ways"
    );

    let mut raw_stream = RawStream::connect(sink_addr)?;
    let mut figures = TransferFigures {
        raw: Vec::new(),
        write: Vec::new(),
        read: Vec::new(),
    };
    let gbps = |took: Duration| bytes as f64 * 8.0 / took.as_secs_f64() / 1e9;
    for turn in 0..s.warmup_turns + s.turns {
        let raw = raw_stream.send(source.region())?;
        let written = write(rt, &manager, &source, &remote)?;
        let read = read(rt, &manager, &back, &remote)?;
        tracing::debug!(
            turn,
            raw = gbps(raw),
            write = gbps(written),
            read = gbps(read),
            "turn, Gbit/s"
        );
        if turn >= s.warmup_turns {
            figures.raw.push(gbps(raw));
            figures.write.push(gbps(written));
            figures.read.push(gbps(read));
        }
    }
    check_same(source.region(), back.region()).context("the last READ")?;
    manager.shutdown();
    Ok(figures)
}

/// Times one WRITE of all of `source` into `remote`.
fn write(
    rt: &Runtime,
    manager: &RdmaManager,
    source: &Buffer,
    remote: &BufferHandle,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let moved = rt
        .block_on(manager.write_from(source, 0, remote, 0, source.len()))
        .context("an rdma WRITE to the worker failed")?;
    let took = started.elapsed();
    ensure!(moved == source.len(), "a WRITE moved {moved} bytes");
    Ok(took)
}

/// Times one READ of all of `remote` into `local`.
fn read(
    rt: &Runtime,
    manager: &RdmaManager,
    local: &Buffer,
    remote: &BufferHandle,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let moved = rt
        .block_on(manager.read_into(local, 0, remote, 0, local.len()))
        .context("an rdma READ from the worker failed")?;
    let took = started.elapsed();
    ensure!(moved == local.len(), "a READ moved {moved} bytes");
    Ok(took)
}

/// Fills a region with a pattern that differs from [`WORKER_FILL`]
/// everywhere, touching every page.
fn fill_pattern(region: &Region) -> anyhow::Result<()> {
    let pattern: Vec<u8> = (0..1 << 20)
        .map(|i: usize| {
            let byte = (i.wrapping_mul(7) + 3) as u8;
            if byte == WORKER_FILL { 0 } else { byte }
        })
        .collect();
    for offset in (0..region.len()).step_by(pattern.len()) {
        let len = pattern.len().min(region.len() - offset);
        region.write(offset, &pattern[..len])?;
    }
    Ok(())
}

/// Checks that every byte of `region` is `byte`.
fn check_filled(region: &Region, byte: u8) -> anyhow::Result<()> {
    let mut chunk = vec![0u8; 1 << 20];
    for offset in (0..region.len()).step_by(chunk.len()) {
        let len = chunk.len().min(region.len() - offset);
        region.read(offset, &mut chunk[..len])?;
        if let Some(at) = chunk[..len].iter().position(|&b| b != byte) {
            bail!(
                "byte {} is {:#04x}, expected {byte:#04x}",
                offset + at,
                chunk[at]
            );
        }
    }
    Ok(())
}

/// Checks that two regions hold the same bytes.
fn check_same(expected: &Region, actual: &Region) -> anyhow::Result<()> {
    ensure!(
        expected.len() == actual.len(),
        "the regions' lengths differ"
    );
    let (mut a, mut b) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for offset in (0..expected.len()).step_by(a.len()) {
        let len = a.len().min(expected.len() - offset);
        expected.read(offset, &mut a[..len])?;
        actual.read(offset, &mut b[..len])?;
        if let Some(at) = (0..len).find(|&i| a[i] != b[i]) {
            bail!(
                "byte {} is {:#04x}, expected {:#04x}",
                offset + at,
                b[at],
                a[at]
            );
        }
    }
    Ok(())
}

/// Reads the worker's `READY` line (after `READY `): its buffer handle as
/// hex and the address of its bare sink.
fn parse_ready(ready: &str) -> anyhow::Result<(BufferHandle, SocketAddr)> {
    let mut words = ready.split_whitespace();
    let (Some(handle), Some(addr), None) = (words.next(), words.next(), words.next()) else {
        bail!("the dataplane worker said {ready:?}, expected `<handle hex> <sink address>`");
    };
    let handle = BufferHandle::from_bytes(&from_hex(handle)?)?;
    let addr = addr
        .parse()
        .with_context(|| format!("the dataplane worker's sink address {addr:?}"))?;
    Ok((handle, addr))
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> anyhow::Result<Vec<u8>> {
    ensure!(
        text.len().is_multiple_of(2) && text.is_ascii(),
        "{text:?} is not a hex string"
    );
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&text[i..i + 2], 16).with_context(|| format!("{text:?} is not hex"))
        })
        .collect()
}

/// This process's end of the floor: one blocking TCP connection to the
/// worker's sink.
struct RawStream(TcpStream);

impl RawStream {
    fn connect(addr: SocketAddr) -> anyhow::Result<RawStream> {
        let stream =
            TcpStream::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(RawStream(stream))
    }

    /// Sends every byte of `region` (its length first, 8 bytes) and waits
    /// for the sink's one-byte answer that all of them are in.
    fn send(&mut self, region: &Region) -> anyhow::Result<Duration> {
        // SAFETY: the region lives for the whole call, and nothing writes
        // it meanwhile (no transfer runs: turns follow each other).
        let bytes = unsafe { std::slice::from_raw_parts(region.as_ptr(), region.len()) };
        let mut answer = [0u8; 1];
        let started = Instant::now();
        self.0.write_all(&(bytes.len() as u64).to_le_bytes())?;
        self.0.write_all(bytes)?;
        self.0
            .read_exact(&mut answer)
            .context("the dataplane worker's sink did not answer")?;
        let took = started.elapsed();
        ensure!(answer == [1], "the sink answered {answer:?}");
        Ok(took)
    }
}

/// The `dataplane-worker` subcommand: registers a buffer of `bytes` bytes
/// with an [`RdmaManager`], serves a bare TCP sink into the same memory,
/// prints `READY <handle hex> <sink address>` and runs until stdin closes.
pub fn serve_worker(bytes: usize) -> anyhow::Result<()> {
    let rt = crate::worker::runtime(Flavor::MultiThread, THREADS)?;
    rt.block_on(async {
        let closed = stdin_closed();
        let manager = RdmaManager::new(RdmaConfig::default()).await?;
        let region = Region::new(bytes)?;
        let chunk = vec![WORKER_FILL; 1 << 20];
        for offset in (0..bytes).step_by(chunk.len()) {
            region.write(offset, &chunk[..chunk.len().min(bytes - offset)])?;
        }
        let buffer = manager.register(region.clone())?;
        let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind the bare sink")?;
        let sink = listener.local_addr()?;
        std::thread::Builder::new()
            .name("bare-sink".into())
            .spawn(move || serve_sink(listener, region))?;
        {
            let mut stdout = std::io::stdout().lock();
            writeln!(
                stdout,
                "READY {} {sink}",
                to_hex(&buffer.handle().to_bytes())
            )?;
            stdout.flush()?;
        }
        let _ = closed.await;
        tracing::debug!("stdin closed; exiting");
        manager.shutdown();
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// Accepts connections one after another; on each, reads a length and that
/// many bytes into `region`, then answers one byte, until the peer closes.
fn serve_sink(listener: TcpListener, region: Region) {
    for stream in listener.incoming() {
        let result = stream
            .map_err(anyhow::Error::from)
            .and_then(|stream| sink_connection(stream, &region));
        if let Err(err) = result {
            tracing::warn!("bare sink: {err:#}");
        }
    }
}

fn sink_connection(mut stream: TcpStream, region: &Region) -> anyhow::Result<()> {
    stream.set_nodelay(true)?;
    loop {
        let mut header = [0u8; 8];
        match stream.read_exact(&mut header) {
            Err(err) if err.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let len = usize::try_from(u64::from_le_bytes(header))?;
        ensure!(
            len <= region.len(),
            "asked to take {len} bytes into a buffer of {}",
            region.len()
        );
        // SAFETY: the region lives as long as this thread holds its clone;
        // nothing else reads or writes its bytes while this runs (the
        // suite's turns follow each other, and it waits for the answer
        // below before the next transfer starts).
        let into = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), len) };
        stream.read_exact(into)?;
        stream.write_all(&[1])?;
    }
}

/// Resolves when stdin reaches its end (or fails): the suite is done or
/// gone.
fn stdin_closed() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = tx.send(());
    });
    rx
}

/// `matmul_gflops`, `matmul_f64_gflops`, `matmul_floor_gflops` and, with a
/// GPU, `cuda_matmul_gflops`.
fn matmuls(s: &Settings) -> anyhow::Result<()> {
    let n = s.matmul_n;
    let f32s = matmul_samples(n, s.matmul_reps, 1, DType::F32, Device::Cpu)?;
    let f64s = matmul_samples(n, s.matmul_reps, 1, DType::F64, Device::Cpu)?;
    let floor = monarch_tensor::throughput::naive_matmul_gflops(FLOOR_N, s.floor_reps);
    log_runs("matmul_gflops", &f32s, "GFLOP/s");
    log_runs("matmul_f64_gflops", &f64s, "GFLOP/s");
    log_runs("matmul_floor_gflops", &floor, "GFLOP/s");
    let f32_median = median(&f32s).context("no matmul samples")?;
    let floor_median = median(&floor).context("no floor samples")?;
    emit_rate(SUITE, "matmul_gflops", f32_median, Rate::Gflops)?;
    emit_rate(
        SUITE,
        "matmul_f64_gflops",
        median(&f64s).context("no matmul samples")?,
        Rate::Gflops,
    )?;
    emit_rate(SUITE, "matmul_floor_gflops", floor_median, Rate::Gflops)?;
    tracing::info!(
        "matmul_gflops / matmul_floor_gflops = {:.1} (Tensor::matmul f32 at N = {n} over a naive loop at N = {FLOOR_N})",
        f32_median / floor_median
    );

    match monarch_tensor::cuda_device_count() {
        Ok(count) if count > 0 => {
            tracing::info!(devices = count, "CUDA matmul on cuda:0, N = {CUDA_N}");
            let samples = matmul_samples(
                CUDA_N,
                s.cuda_reps,
                CUDA_PRODUCTS_PER_SAMPLE,
                DType::F32,
                Device::Cuda(0),
            )?;
            log_runs("cuda_matmul_gflops", &samples, "GFLOP/s");
            let value = median(&samples).context("no CUDA matmul samples")?;
            emit_rate(SUITE, "cuda_matmul_gflops", value, Rate::Gflops)?;
        }
        Ok(_) => tracing::info!("no CUDA device: cuda_matmul_gflops not measured"),
        Err(err) if cfg!(feature = "cuda") => {
            tracing::info!("cuda_matmul_gflops not measured: {err}")
        }
        Err(_) => tracing::info!(
            "cuda_matmul_gflops not measured: built without the `cuda` feature (cargo build --release -p monarch-bench --features cuda)"
        ),
    }
    Ok(())
}

/// [`monarch_tensor::throughput::matmul_gflops`], with its error as anyhow's.
fn matmul_samples(
    n: usize,
    reps: usize,
    products: usize,
    dtype: DType,
    device: Device,
) -> anyhow::Result<Vec<f64>> {
    monarch_tensor::throughput::matmul_gflops(n, reps, products, dtype, device)
        .map_err(|e| anyhow::anyhow!(e))
}

/// Logs each run of a rate and their spread.
pub(crate) fn log_runs(metric: &str, samples: &[f64], unit: &str) {
    let runs = samples
        .iter()
        .map(|v| format!("{v:.2}"))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(spread) = Spread::of(samples) {
        tracing::info!(
            metric,
            runs,
            p10 = format!("{:.2}", spread.p10),
            p50 = format!("{:.2}", spread.p50),
            p90 = format!("{:.2}", spread.p90),
            "runs, {unit}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(to_hex(&[0x0a, 0xff]), "0aff");
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
        assert!(from_hex("é").is_err());
    }

    #[test]
    fn the_pattern_never_looks_like_the_workers_fill() {
        let region = Region::new(3 << 20).unwrap();
        fill_pattern(&region).unwrap();
        assert!(region.to_vec().iter().all(|&b| b != WORKER_FILL));
        assert!(check_filled(&region, WORKER_FILL).is_err());
        let copy = Region::new(3 << 20).unwrap();
        copy.write(0, &region.to_vec()).unwrap();
        check_same(&region, &copy).unwrap();
        copy.write(5, &[WORKER_FILL]).unwrap();
        let err = check_same(&region, &copy).unwrap_err().to_string();
        assert!(err.contains("byte 5"), "{err}");
    }

    #[tokio::test]
    async fn a_ready_line_carries_a_handle_and_an_address() {
        let manager = RdmaManager::new(RdmaConfig::default()).await.unwrap();
        let buffer = manager.alloc(4096).unwrap();
        let line = format!("{} 127.0.0.1:4242", to_hex(&buffer.handle().to_bytes()));
        let (handle, addr) = parse_ready(&line).unwrap();
        assert_eq!(handle, buffer.handle());
        assert_eq!(addr, SocketAddr::from(([127, 0, 0, 1], 4242)));
        assert!(parse_ready(&format!("{line} more")).is_err());
    }

    #[test]
    fn a_ready_line_needs_a_handle_and_an_address() {
        assert!(parse_ready("").is_err());
        assert!(parse_ready("00 127.0.0.1:1").is_err());
        assert!(parse_ready("00").is_err());
    }
}
