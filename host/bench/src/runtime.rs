//! The `runtime` suite: the actor runtime's round trips and throughput,
//! each next to the raw socket floor measured in the same run.
//!
//! Layout of one run:
//!
//! ```text
//! this process                                  worker processes
//! proc "bench" on unix:  driver[0], echo[0] <-- unix --> proc "worker" echo[0]
//! proc "bench" on tcp:   driver[0]          <-- tcp  --> proc "worker" echo[0]
//! proc "bench" on tcp:   driver[0]          <-- tls  --> proc "worker" echo[0]
//! raw client (blocking std sockets)         <-- unix --> raw-echo
//! raw client (blocking std sockets)         <-- tcp  --> raw-echo
//! ```
//!
//! TLS is installed for the whole process (`hyperactor::channel::tls`), and
//! a connection keeps what it was made as: the plain TCP pair connects
//! both ways before TLS is installed, the TLS pair after, with
//! certificates of a CA made for the run.
//!
//! Round trips are sampled in rounds that take turns (raw unix, in-proc,
//! unix, raw tcp, tcp, tcp over TLS), so that a machine that gets slower halfway through
//! slows a figure and its floor alike; the median of all samples of a
//! metric is reported. Throughput figures are the median of several timed
//! runs.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hyperactor::testing::EchoActor;
use hyperactor::{ActorId, ActorRef, Mailbox, Proc, ProcConfig, ProcId};

use crate::driver::{Completed, Driver, OneWay, Pipeline, TimeCalls};
use crate::raw::RawStream;
use crate::report::{Unit, emit, log_spread, median};
use crate::worker::{ECHO_ACTOR, Flavor, Scratch, Worker};

const SUITE: &str = "runtime";

/// Quiet time before each round of a raw floor.
const FLOOR_SETTLE: Duration = Duration::from_millis(200);

/// How much to measure.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Payload of every message, in bytes.
    pub payload: usize,
    /// Untimed round trips per kind before the first timed one.
    pub warmup: usize,
    /// Timed round trips per kind, in all rounds together.
    pub rtt_samples: usize,
    /// Rounds the timed round trips are spread over.
    pub rounds: usize,
    /// Timed runs per throughput metric.
    pub throughput_runs: usize,
    /// Length of one throughput run.
    pub run_time: Duration,
    /// Calls outstanding at once in the pipelined run.
    pub in_flight: usize,
    /// Messages per one-way run: one burst, then one call to confirm.
    pub oneway_count: u64,
    /// Tokio scheduler, here and in each worker process.
    pub flavor: Flavor,
    /// Tokio worker threads of a multi-thread scheduler.
    pub worker_threads: usize,
    /// Busy-poll window of every proc's connections.
    pub busy_poll: Duration,
}

impl Settings {
    /// The full suite: about 15 s on a 2-core machine.
    pub fn full(flavor: Flavor, worker_threads: usize) -> Settings {
        Settings {
            payload: 64,
            warmup: 2_000,
            rtt_samples: 20_000,
            rounds: 5,
            throughput_runs: 5,
            run_time: Duration::from_secs(1),
            in_flight: 256,
            oneway_count: 200_000,
            flavor,
            worker_threads,
            busy_poll: ProcConfig::default().busy_poll,
        }
    }

    /// A smoke test: a few seconds, rough figures.
    pub fn quick(flavor: Flavor, worker_threads: usize) -> Settings {
        Settings {
            payload: 64,
            warmup: 100,
            rtt_samples: 1_000,
            rounds: 2,
            throughput_runs: 2,
            run_time: Duration::from_millis(150),
            in_flight: 256,
            oneway_count: 5_000,
            flavor,
            worker_threads,
            busy_poll: ProcConfig::default().busy_poll,
        }
    }
}

/// The actor procs of this process and the worker each one talks to.
struct Transport {
    /// Keeps the proc (and its listener) alive.
    proc: Proc,
    client: Mailbox,
    driver: ActorRef<Driver>,
    remote_echo: ActorId,
}

impl Transport {
    async fn start(
        kind: &str,
        own_addr: hyperactor::ChannelAddr,
        worker: &Worker,
        busy_poll: Duration,
    ) -> anyhow::Result<Transport> {
        let config = ProcConfig {
            busy_poll,
            ..ProcConfig::default()
        };
        let proc = Proc::serve_with_config("bench", own_addr.clone(), config)
            .await
            .with_context(|| format!("cannot serve the {kind} bench proc on {own_addr}"))?;
        let driver = proc.spawn("driver", 0, Driver)?.bind();
        let (client, _undeliverable) = proc.attach("client")?;
        let worker_proc: ProcId = worker.ready().parse().with_context(|| {
            format!(
                "the {kind} worker reported {:?}, not a proc id",
                worker.ready()
            )
        })?;
        let remote_echo = worker_proc.actor_id(ECHO_ACTOR, 0)?;
        Ok(Transport {
            proc,
            client,
            driver,
            remote_echo,
        })
    }

    /// Sequential call round trips from the driver to `target`, in microseconds.
    async fn rtt(
        &self,
        target: &ActorId,
        calls: usize,
        payload: usize,
    ) -> anyhow::Result<Vec<f64>> {
        let nanos = self
            .driver
            .call(&self.client, |reply| TimeCalls {
                target: target.clone(),
                calls: u32::try_from(calls).unwrap_or(u32::MAX),
                payload: u32::try_from(payload).unwrap_or(u32::MAX),
                reply,
            })
            .await
            .with_context(|| format!("timing calls to {target} failed"))?;
        Ok(nanos.into_iter().map(|n| n as f64 / 1e3).collect())
    }

    async fn pipeline(&self, settings: &Settings) -> anyhow::Result<Completed> {
        let target = &self.remote_echo;
        self.driver
            .call(&self.client, |reply| Pipeline {
                target: target.clone(),
                in_flight: u32::try_from(settings.in_flight).unwrap_or(u32::MAX),
                payload: u32::try_from(settings.payload).unwrap_or(u32::MAX),
                millis: u64::try_from(settings.run_time.as_millis()).unwrap_or(u64::MAX),
                reply,
            })
            .await
            .with_context(|| format!("pipelined calls to {target} failed"))
    }

    async fn oneway(&self, stream: u64, count: u64) -> anyhow::Result<Completed> {
        let target = &self.remote_echo;
        let completed = self
            .driver
            .call(&self.client, |reply| OneWay {
                target: target.clone(),
                stream,
                count,
                reply,
            })
            .await
            .with_context(|| format!("one-way messages to {target} failed"))?;
        if completed.count != count || completed.out_of_order != 0 {
            tracing::warn!(
                sent = count,
                received = completed.count,
                out_of_order = completed.out_of_order,
                "one-way stream arrived incomplete or out of order"
            );
        }
        anyhow::ensure!(
            completed.count == count,
            "sent {count} one-way messages but {} arrived",
            completed.count
        );
        Ok(completed)
    }
}

/// A TLS directory (`hyperactor::channel::tls`) in `dir`: a CA made for
/// this run and one host certificate both ends use.
fn write_tls_dir(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    use hyperactor::channel::tls::{CA_FILE, CERT_FILE, KEY_FILE, SERVER_NAME};
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut host = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
    host.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = host.signed_by(&key, &issuer)?;
    for (file, text) in [
        (CA_FILE, ca_cert.pem()),
        (CERT_FILE, cert.pem()),
        (KEY_FILE, key.serialize_pem()),
    ] {
        std::fs::write(dir.join(file), text)
            .with_context(|| format!("cannot write {}", dir.join(file).display()))?;
    }
    Ok(dir.to_path_buf())
}

/// Raw round trips on a blocking thread; the stream goes there and back.
pub(crate) async fn raw_rtt(
    mut stream: RawStream,
    payload: usize,
    count: usize,
) -> anyhow::Result<(RawStream, Vec<f64>)> {
    tokio::task::spawn_blocking(move || {
        let micros = stream.round_trips(payload, count)?;
        Ok((stream, micros))
    })
    .await
    .context("the raw round-trip thread panicked")?
}

/// Timed samples of one round-trip metric, gathered over the rounds.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn add(&mut self, more: Vec<f64>) {
        self.0.extend(more);
    }

    fn median(&self, metric: &str) -> anyhow::Result<f64> {
        log_spread(metric, &self.0, "round trip, us");
        median(&self.0).with_context(|| format!("no samples for {metric}"))
    }
}

fn median_rate(metric: &str, runs: &[Completed]) -> anyhow::Result<f64> {
    let rates: Vec<f64> = runs.iter().map(Completed::per_second).collect();
    tracing::info!(
        metric,
        runs = ?rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "per second"
    );
    median(&rates).with_context(|| format!("no runs for {metric}"))
}

/// Runs the suite and writes its records to stdout.
pub async fn run(settings: &Settings) -> anyhow::Result<()> {
    let began = Instant::now();
    let scratch = Scratch::new()?;
    tracing::info!(?settings, scratch = %scratch.path().display(), "runtime suite");
    let threads = settings.worker_threads.to_string();
    let busy_poll_us = settings.busy_poll.as_micros().to_string();
    let echo_worker = |addr: String| {
        [
            "worker".to_string(),
            "--addr".into(),
            addr,
            "--worker-threads".into(),
            threads.clone(),
            "--flavor".into(),
            settings.flavor.as_arg().into(),
            "--busy-poll-us".into(),
            busy_poll_us.clone(),
        ]
    };
    let raw_worker = |addr: String| ["raw-echo".to_string(), "--addr".into(), addr];

    let unix_worker = Worker::start(
        "unix echo",
        &echo_worker(scratch.unix_addr("worker.sock")?.to_string()),
    )
    .await?;
    let tcp_worker = Worker::start("tcp echo", &echo_worker("tcp:127.0.0.1:0".into())).await?;
    let raw_unix_worker = Worker::start(
        "raw unix echo",
        &raw_worker(scratch.unix_addr("raw.sock")?.to_string()),
    )
    .await?;
    let raw_tcp_worker =
        Worker::start("raw tcp echo", &raw_worker("tcp:127.0.0.1:0".into())).await?;

    let unix = Transport::start(
        "unix",
        scratch.unix_addr("bench.sock")?,
        &unix_worker,
        settings.busy_poll,
    )
    .await?;
    let tcp = Transport::start(
        "tcp",
        "tcp:127.0.0.1:0".parse()?,
        &tcp_worker,
        settings.busy_poll,
    )
    .await?;
    // The in-process target lives in the unix bench proc, beside its driver.
    let local_echo = unix
        .proc
        .spawn(ECHO_ACTOR, 0, EchoActor::default())?
        .actor_id()
        .clone();
    let mut raw_unix = RawStream::connect(raw_unix_worker.ready())?;
    let mut raw_tcp = RawStream::connect(raw_tcp_worker.ready())?;

    let payload = settings.payload;
    let mut raw_unix_us = Samples::default();
    let mut raw_tcp_us = Samples::default();
    let mut inproc_us = Samples::default();
    let mut ipc_us = Samples::default();
    let mut tcp_us = Samples::default();

    let mut tls_us = Samples::default();

    // Warm-up: connections, caches, allocator pools and CPU frequency.
    (raw_unix, _) = raw_rtt(raw_unix, payload, settings.warmup).await?;
    (raw_tcp, _) = raw_rtt(raw_tcp, payload, settings.warmup).await?;
    unix.rtt(&local_echo, settings.warmup, payload).await?;
    unix.rtt(&unix.remote_echo, settings.warmup, payload)
        .await?;
    tcp.rtt(&tcp.remote_echo, settings.warmup, payload).await?;

    // Plain TCP is connected both ways: from here on, new TCP connections
    // of this process are TLS.
    let tls_dir = write_tls_dir(&scratch.path().join("tls"))?;
    hyperactor::channel::tls::install(hyperactor::channel::tls::TlsConfig::from_dir(&tls_dir)?)?;
    let mut tls_args = echo_worker("tcp:127.0.0.1:0".into()).to_vec();
    tls_args.extend(["--tls-dir".to_string(), tls_dir.display().to_string()]);
    let tls_worker = Worker::start("tcp tls echo", &tls_args).await?;
    let tls = Transport::start(
        "tcp tls",
        "tcp:127.0.0.1:0".parse()?,
        &tls_worker,
        settings.busy_poll,
    )
    .await?;
    tls.rtt(&tls.remote_echo, settings.warmup, payload).await?;

    let rounds = settings.rounds.max(1);
    let per_round = settings.rtt_samples.div_ceil(rounds);
    for _ in 0..rounds {
        // Busy-polling procs leave the CPUs looking loaded to the kernel's
        // scheduler for a few tens of milliseconds, which changes where it
        // wakes the raw echo's threads and can put the floor in its slow
        // mode. Letting that fade first keeps the floor a floor.
        tokio::time::sleep(FLOOR_SETTLE).await;
        let samples;
        (raw_unix, samples) = raw_rtt(raw_unix, payload, per_round).await?;
        raw_unix_us.add(samples);
        inproc_us.add(unix.rtt(&local_echo, per_round, payload).await?);
        ipc_us.add(unix.rtt(&unix.remote_echo, per_round, payload).await?);
        tokio::time::sleep(FLOOR_SETTLE).await;
        let samples;
        (raw_tcp, samples) = raw_rtt(raw_tcp, payload, per_round).await?;
        raw_tcp_us.add(samples);
        tcp_us.add(tcp.rtt(&tcp.remote_echo, per_round, payload).await?);
        tls_us.add(tls.rtt(&tls.remote_echo, per_round, payload).await?);
    }
    drop((raw_unix, raw_tcp));

    let raw_unix_rtt = raw_unix_us.median("raw_unix_rtt_us")?;
    let raw_tcp_rtt = raw_tcp_us.median("raw_tcp_rtt_us")?;
    let inproc_rtt = inproc_us.median("inproc_call_rtt_us")?;
    let ipc_rtt = ipc_us.median("ipc_call_rtt_us")?;
    let tcp_rtt = tcp_us.median("tcp_call_rtt_us")?;
    let tls_rtt = tls_us.median("tcp_tls_call_rtt_us")?;
    emit(SUITE, "raw_unix_rtt_us", raw_unix_rtt, Unit::Micros)?;
    emit(SUITE, "raw_tcp_rtt_us", raw_tcp_rtt, Unit::Micros)?;
    emit(SUITE, "inproc_call_rtt_us", inproc_rtt, Unit::Micros)?;
    emit(SUITE, "ipc_call_rtt_us", ipc_rtt, Unit::Micros)?;
    emit(SUITE, "tcp_call_rtt_us", tcp_rtt, Unit::Micros)?;
    emit(SUITE, "tcp_tls_call_rtt_us", tls_rtt, Unit::Micros)?;
    tracing::info!(
        ipc_over_raw_unix = format!("{:.2}", ipc_rtt / raw_unix_rtt),
        tcp_over_raw_tcp = format!("{:.2}", tcp_rtt / raw_tcp_rtt),
        tls_over_tcp = format!("{:.2}", tls_rtt / tcp_rtt),
        "round trips as multiples of their floor"
    );

    // Throughput, one untimed run of each first. The one-way burst has a
    // fixed size rather than a fixed time; the driver waits for its link's
    // window before each send (LK-8), so the sender holds at most the
    // window however large the burst (see docs/benchmarks.md).
    unix.pipeline(settings).await?;
    unix.oneway(0, settings.oneway_count.min(10_000)).await?;
    let mut pipelined = Vec::new();
    let mut oneway = Vec::new();
    for run in 0..settings.throughput_runs.max(1) {
        pipelined.push(unix.pipeline(settings).await?);
        oneway.push(unix.oneway(run as u64 + 1, settings.oneway_count).await?);
    }
    emit(
        SUITE,
        "ipc_calls_per_s",
        median_rate("ipc_calls_per_s", &pipelined)?,
        Unit::CallsPerSec,
    )?;
    emit(
        SUITE,
        "oneway_msgs_per_s",
        median_rate("oneway_msgs_per_s", &oneway)?,
        Unit::MsgsPerSec,
    )?;
    // What the sender held unacknowledged at most during those bursts
    // (LK-8: at most the link's window and one frame).
    let peak = unix.proc.stats().peak_unacked_bytes.load(Ordering::Relaxed);
    emit(
        SUITE,
        "oneway_peak_queued_mib",
        peak as f64 / (1024.0 * 1024.0),
        Unit::MiB,
    )?;

    // The same over TCP, plain and TLS, taking turns.
    for transport in [&tcp, &tls] {
        transport.pipeline(settings).await?;
        transport
            .oneway(0, settings.oneway_count.min(10_000))
            .await?;
    }
    let mut runs: [(Vec<Completed>, Vec<Completed>); 2] = Default::default();
    for run in 0..settings.throughput_runs.max(1) {
        for (transport, (pipelined, oneway)) in [&tcp, &tls].into_iter().zip(runs.iter_mut()) {
            pipelined.push(transport.pipeline(settings).await?);
            oneway.push(
                transport
                    .oneway(run as u64 + 1, settings.oneway_count)
                    .await?,
            );
        }
    }
    for (prefix, (pipelined, oneway)) in ["tcp", "tcp_tls"].into_iter().zip(&runs) {
        let calls = format!("{prefix}_calls_per_s");
        emit(
            SUITE,
            &calls,
            median_rate(&calls, pipelined)?,
            Unit::CallsPerSec,
        )?;
        let msgs = format!("{prefix}_oneway_msgs_per_s");
        emit(SUITE, &msgs, median_rate(&msgs, oneway)?, Unit::MsgsPerSec)?;
    }

    for worker in [
        unix_worker,
        tcp_worker,
        tls_worker,
        raw_unix_worker,
        raw_tcp_worker,
    ] {
        worker.stop().await?;
    }
    tracing::info!(
        seconds = format!("{:.1}", began.elapsed().as_secs_f64()),
        "runtime suite done"
    );
    Ok(())
}
