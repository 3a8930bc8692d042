//! Throughput of the TCP backend over loopback, beside a bare TCP stream.
//!
//! ```text
//! cargo run --release -p monarch-rdma --example throughput -- \
//!     [--mib 1024] [--runs 3] [--chunk-kib N] [--connections N] [--sweep]
//! ```
//!
//! Moves `--mib` MiB (default 1024) between two managers in this process,
//! as a one-sided WRITE and as a one-sided READ, and the same number of bytes
//! through one plain TCP connection (one `write_all`, one `read_exact`, no
//! protocol), `--runs` times each. Prints one JSON object per line with the
//! best run in Gbit/s, and the ratio of each transfer to the bare stream
//! (the benchmark target is at least 0.8). `--sweep` also tries other chunk
//! sizes and connection counts.

use std::time::{Duration, Instant};

use monarch_rdma::{Buffer, RdmaConfig, RdmaManager, Region};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Options {
    bytes: usize,
    runs: usize,
    sweep: bool,
    chunk_kib: Option<usize>,
    connections: Option<usize>,
}

fn options() -> Options {
    let mut options = Options {
        bytes: 1024 << 20,
        runs: 3,
        sweep: false,
        chunk_kib: None,
        connections: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> usize {
            args.next()
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--mib" => options.bytes = number("--mib") << 20,
            "--runs" => options.runs = number("--runs").max(1),
            "--sweep" => options.sweep = true,
            "--chunk-kib" => options.chunk_kib = Some(number("--chunk-kib")),
            "--connections" => options.connections = Some(number("--connections")),
            other => panic!("unknown argument {other}; see the example's documentation"),
        }
    }
    options
}

fn gbps(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 * 8.0 / elapsed.as_secs_f64() / 1e9
}

/// One connection, one write of every byte, one read of every byte, straight
/// between the two regions' memory: the ceiling for loopback TCP here.
async fn bare_tcp(source: &Region, destination: &Region) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let len = source.len();
    let destination_ptr = destination.as_ptr() as usize;
    let reader = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        // SAFETY: the destination region outlives this task (the caller
        // awaits it) and nothing else touches it meanwhile.
        let into = unsafe { std::slice::from_raw_parts_mut(destination_ptr as *mut u8, len) };
        stream.read_exact(into).await.unwrap();
    });
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let started = Instant::now();
    // SAFETY: the source region lives for the whole call and is only read.
    let from = unsafe { std::slice::from_raw_parts(source.as_ptr(), len) };
    stream.write_all(from).await.unwrap();
    reader.await.unwrap();
    started.elapsed()
}

struct Setup {
    writer: RdmaManager,
    source: Buffer,
    owner: RdmaManager,
    destination: Buffer,
}

async fn setup(config: &RdmaConfig, source: &Region, destination: &Region) -> Setup {
    let writer = RdmaManager::new(config.clone()).await.unwrap();
    let owner = RdmaManager::new(config.clone()).await.unwrap();
    Setup {
        source: writer.register(source.clone()).unwrap(),
        destination: owner.register(destination.clone()).unwrap(),
        writer,
        owner,
    }
}

/// Best and median of a set of runs.
struct Stats {
    best: Duration,
    median: Duration,
}

impl Stats {
    fn of(mut runs: Vec<Duration>) -> Stats {
        runs.sort();
        Stats {
            best: runs[0],
            median: runs[runs.len() / 2],
        }
    }
}

fn report(name: &str, config: &RdmaConfig, bytes: usize, runs: &Stats, bare: &Stats) {
    println!(
        "{{\"bench\":\"{name}\",\"chunk_kib\":{},\"connections\":{},\"bytes\":{bytes},\"best_secs\":{:.4},\"gbps\":{:.2},\"median_gbps\":{:.2},\"vs_raw_tcp\":{:.3},\"median_vs_raw_tcp\":{:.3}}}",
        config.chunk_size / 1024,
        config.connections_per_peer,
        runs.best.as_secs_f64(),
        gbps(bytes, runs.best),
        gbps(bytes, runs.median),
        bare.best.as_secs_f64() / runs.best.as_secs_f64(),
        bare.median.as_secs_f64() / runs.median.as_secs_f64(),
    );
}

#[tokio::main]
async fn main() {
    let options = options();
    let bytes = options.bytes;
    let source = Region::new(bytes).unwrap();
    let destination = Region::new(bytes).unwrap();
    // Touch every page of both regions so no run pays for first faults.
    let pattern: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    for offset in (0..bytes).step_by(pattern.len()) {
        let len = pattern.len().min(bytes - offset);
        source.write(offset, &pattern[..len]).unwrap();
        destination.write(offset, &pattern[..len]).unwrap();
    }

    let mut first = RdmaConfig::default();
    if let Some(chunk_kib) = options.chunk_kib {
        first.chunk_size = chunk_kib * 1024;
    }
    if let Some(connections) = options.connections {
        first.connections_per_peer = connections;
    }
    let mut configs = vec![first];
    if options.sweep {
        for chunk_kib in [256, 1024, 4096, 16384] {
            for connections in [1, 2, 4, 8] {
                configs.push(RdmaConfig {
                    chunk_size: chunk_kib * 1024,
                    connections_per_peer: connections,
                    ..RdmaConfig::default()
                });
            }
        }
        configs.push(RdmaConfig {
            socket_buffer_size: Some(4 << 20),
            ..RdmaConfig::default()
        });
    }
    for mut config in configs {
        config.op_timeout = Duration::from_secs(600);
        let setup = setup(&config, &source, &destination).await;
        if let Some(reason) = setup.writer.ibverbs_unavailable() {
            eprintln!("ibverbs: {reason}");
        }
        let handle = setup.destination.handle();
        let source_handle = setup.source.handle();
        // The machine is shared and noisy: the bare stream and both
        // directions take turns, and each reports its best run.
        let (mut bare, mut write, mut read) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..options.runs {
            bare.push(bare_tcp(&source, &destination).await);
            let started = Instant::now();
            setup
                .writer
                .write_from(&setup.source, 0, &handle, 0, bytes as u64)
                .await
                .unwrap();
            write.push(started.elapsed());
            // The owner of the destination reads the writer's source.
            let started = Instant::now();
            setup
                .owner
                .read_into(&setup.destination, 0, &source_handle, 0, bytes as u64)
                .await
                .unwrap();
            read.push(started.elapsed());
        }
        let bare = Stats::of(bare);
        println!(
            "{{\"bench\":\"raw_tcp\",\"bytes\":{bytes},\"best_secs\":{:.4},\"gbps\":{:.2},\"median_gbps\":{:.2}}}",
            bare.best.as_secs_f64(),
            gbps(bytes, bare.best),
            gbps(bytes, bare.median),
        );
        report("rdma_tcp_write", &config, bytes, &Stats::of(write), &bare);
        report("rdma_tcp_read", &config, bytes, &Stats::of(read), &bare);
        let mut check = vec![0u8; pattern.len()];
        destination.read(bytes - check.len(), &mut check).unwrap();
        assert_eq!(
            check,
            {
                let mut expected = vec![0u8; check.len()];
                source.read(bytes - expected.len(), &mut expected).unwrap();
                expected
            },
            "the destination does not hold the source's bytes"
        );
    }
}
