//! `monarch-bench`: benchmarks of monarch-host, each read against a floor
//! measured in the same run.
//!
//! # Output
//!
//! `monarch-bench SUITE` prints one JSON object a line on stdout and
//! nothing else; logs, spreads and ratios go to stderr:
//!
//! ```text
//! {"suite":"runtime","metric":"ipc_call_rtt_us","value":14.2,"unit":"us"}
//! ```
//!
//! Metric names are a contract (see `docs/benchmarks.md`): scripts and the
//! table in the docs key on them, so they do not change.
//!
//! # Reading the figures
//!
//! The machines these run on are shared and noisy: absolute times drift by
//! tens of percent from run to run, while a figure divided by the floor
//! measured beside it in the same run holds. So each suite measures its own
//! floor, and a figure is best read as a ratio: `ipc_call_rtt_us /
//! raw_unix_rtt_us` is how many bare socket round trips an actor call
//! across processes costs. A ratio near 1 means the runtime adds little to
//! what the kernel charges anyway; a large ratio points at the runtime.
//!
//! Ratios are steadier than times, not immune: where waking an idle CPU is
//! slow (a VM), cross-process round trips move between runs more than
//! their floors do; `docs/benchmarks.md` shows by how much.
//!
//! Every figure is a median: of individual round trips (after a warm-up),
//! or of several timed runs for rates.
//!
//! # Suites
//!
//! ## `runtime`: the actor runtime against raw sockets
//!
//! All actor figures are measured from inside an actor (a *driver*) calling
//! `hyperactor::testing::EchoActor` with a 64-byte payload, as one actor of
//! an application calls another. The cross-process peer is this binary run
//! again as a worker process (`worker`, `raw-echo`: hidden subcommands),
//! which exits when its stdin closes, so no worker outlives the suite.
//!
//! | metric | what | unit |
//! | --- | --- | --- |
//! | `raw_unix_rtt_us` | floor: 64 bytes there and back over a Unix socket, blocking std sockets, two processes | us |
//! | `raw_tcp_rtt_us` | floor: the same over loopback TCP, Nagle off | us |
//! | `inproc_call_rtt_us` | an actor calls an actor of the same proc and gets the reply | us |
//! | `ipc_call_rtt_us` | the same, to an actor in another process, over `unix:` | us |
//! | `tcp_call_rtt_us` | the same over `tcp:127.0.0.1` | us |
//! | `ipc_calls_per_s` | calls completed per second with 256 in flight, over `unix:` | calls/s |
//! | `oneway_msgs_per_s` | one-way messages delivered per second (sent back to back, then one call to confirm), over `unix:` | msgs/s |
//! | `tcp_tls_call_rtt_us` | `tcp_call_rtt_us` over mutual TLS 1.3 (`--tls-dir`), in the same rounds | us |
//! | `tcp_calls_per_s`, `tcp_tls_calls_per_s` | `ipc_calls_per_s` over `tcp:127.0.0.1`, plain and TLS | calls/s |
//! | `tcp_oneway_msgs_per_s`, `tcp_tls_oneway_msgs_per_s` | `oneway_msgs_per_s` over `tcp:127.0.0.1`, plain and TLS | msgs/s |
//!
//! Read `ipc_call_rtt_us` against `raw_unix_rtt_us` and `tcp_call_rtt_us`
//! against `raw_tcp_rtt_us`. `inproc_call_rtt_us` has no socket in it: it
//! is two queue hand-offs and two task wake-ups. The rates have no floor of
//! their own; the round-trip floor bounds what a single call could cost.
//!
//! Every process of the suite runs a current-thread tokio runtime, as
//! `monarch-host` runs every proc (and, by default, its controller):
//! `--flavor multi-thread --worker-threads N` measures a multi-thread one.
//! With busy polling a current-thread runtime's round trips are as fast
//! as or faster than a multi-thread one's, which wakes its idle worker
//! at every yield of a polling connection (figures in
//! `docs/benchmarks.md`, "Issue 19 ... 2026-12-07, 08:10 UTC").
//!
//! The full suite takes about 15 s on two cores; `--quick` runs a few
//! seconds and is for smoke tests, not for figures.
//!
//! ## `mesh`: Wasm actors on child-process procs, driven by a Wasm controller
//!
//! The guest program (`host/bench/guest`, mode `mesh`) runs on
//! `monarch-host`'s library as `monarch-host run` would run it: every proc
//! is a child process (this binary's hidden `bootstrap` subcommand, which
//! serves a proc as `monarch-host bootstrap` does), and calls go down the
//! multicast tree of per-proc comm actors (`--fanout`, default 16). The
//! controller times everything itself (see `mesh.rs`).
//!
//! | metric | what | unit |
//! | --- | --- | --- |
//! | `raw_unix_rtt_us` | floor: 64 bytes there and back over a Unix socket, blocking std sockets, two processes | us |
//! | `spawn_procs_8_ms` | spawn 8 procs, an actor on each, and gather a first call from them; median of 5, each of fresh procs | ms |
//! | `spawn_procs_16_ms` | the same with 16 procs | ms |
//! | `call_gather_8_us` | a call to one actor in each of 8 procs, replies gathered in rank order | us |
//! | `call_gather_16_us` | the same over 16 procs | us |
//! | `broadcast_100_then_call_16_ms` | 100 broadcasts, then one gathered call, over 16 procs | ms |
//! | `cast_reduce_1024_us` | a call to 1,024 actors (64 on each of 16 procs, `spawn_many`) summed by the host's `sum-i64` reducer | us |
//!
//! The full suite takes about 10 s on two cores; `--quick` a few seconds.
//! `--peers` then runs the same workloads on PyTorch Monarch 0.7.0 and Ray
//! 2.60.0 (`host/bench/peers`) and prints their records with a `peer`
//! field, `{"suite":"mesh","metric":...,"peer":"monarch-0.7.0",...}`,
//! each system's figure the median of 3 rounds taken in turn (`--rounds`);
//! rounds during which the hypervisor took more than `--max-steal` % of the
//! CPUs are run again and the least-stolen ones used.
//!
//! ## `serve`: `monarch-host serve` over HTTP, as its users see it
//!
//! A server (`monarch-host`'s `serve::Server`) runs in this process on a
//! runtime and thread of its own (`--threads`, 2 as `monarch-host serve`);
//! the client (`serve::client::ApiClient`, what `monarch-host submit`
//! uses) runs on one thread of its own. Procs are child processes of this
//! binary (`bootstrap`, as in the mesh suite). The job is the `hello`
//! example with argument `2`: 2 procs, a `Greeter` on each, one gathered
//! call, 3 log lines; every job's log is checked, and one that fails fails
//! the suite. Uploads compile for real: `MONARCH_CACHE_DIR` points at an
//! empty scratch directory, emptied before each repetition, and each
//! repetition has a fresh server and data directory (see `serve.rs`).
//!
//! | metric | what | unit |
//! | --- | --- | --- |
//! | `http_rtt_us` | floor: `GET /healthz` on one keep-alive loopback connection to the same server, written and parsed by hand; half before the jobs, half after | us |
//! | `upload_compile_hello_ms` | `POST /v1/components` of `hello.wasm` as the client sees it (stream, hash, compile, type-check, store), no compile cache; median of 3 | ms |
//! | `upload_compile_counter_ms` | the same for `counter.wasm` | ms |
//! | `upload_compile_ping_pong_ms` | the same for `ping_pong.wasm` | ms |
//! | `submit_to_first_log_ms` | from sending `POST /v1/jobs` (`hello 2` on a persistent mesh of 2 procs) to the first `event: log` of the job's log stream, opened as the submission returns; median of 21 | ms |
//! | `jobs_per_s` | `hello 2` jobs on the persistent mesh, 200 of them, 16 in flight (`--submitters`: each submits, follows the log to its end, submits the next); from the first submission to the last end; median of 3 runs | jobs/s |
//! | `fresh_mesh_jobs_per_s` | the same job with no mesh (2 fresh child procs per job), 40 of them, 4 in flight (`--fresh-submitters`); median of 3 runs | jobs/s |
//! | `fresh_mesh_proc_cpu_ms` | the CPU time (user and system) of one of those fresh procs from its start to its exit, read as each ends (`hyperactor_mesh::alloc::ended_procs_cpu`): all of a run's, over their number; median of the 3 runs | ms |
//! | `fresh_mesh_forked_jobs_per_s` | `fresh_mesh_jobs_per_s` with every proc forked by the fork server (`serve --fork-server`, `hyperactor_mesh::fork`) | jobs/s |
//! | `fresh_mesh_forked_proc_cpu_ms` | `fresh_mesh_proc_cpu_ms` of those forked procs, the fork server's own CPU time shared among them | ms |
//!
//! The log (stderr) adds each run's rate, the server's record of how long
//! jobs queued and ran, `GET /v1/jobs/ID` through the client for scale,
//! and every figure as a multiple of the floor. Needs the example
//! programs: `cd guest-sdk && cargo build --release --target
//! wasm32-wasip2`. About 8 s on two cores; `--quick` about 5 s (debug build).
//!
//! ## `dataplane`: bulk bytes between procs, tensor matmul and all-reduce
//!
//! Two `monarch-rdma` managers (default `RdmaConfig`, so the TCP backend
//! where there is no RDMA device), one in this process and one in a worker
//! process (this binary again, hidden subcommand `dataplane-worker`, which
//! exits when its stdin closes), move 1 GiB between registered buffers. The
//! floor is a bare TCP stream between the same two processes, into the
//! same memory, taking turns with the transfers (see `dataplane.rs`).
//! Matmul is `monarch_tensor::Tensor::matmul` on random tensors, `2 N^3`
//! flops a product.
//!
//! | metric | what | unit |
//! | --- | --- | --- |
//! | `raw_tcp_gbps` | floor: 1 GiB through one loopback TCP connection to the worker (one `write_all`, one `read_exact` into the worker's buffer, a one-byte answer), blocking std sockets; median of 7 turns after 1 | Gbit/s |
//! | `rdma_tcp_gbps` | 1 GiB one-sided WRITE (`write_from`) into the worker's buffer, TCP backend; median, in turns with the floor | Gbit/s |
//! | `rdma_tcp_read_gbps` | 1 GiB one-sided READ (`read_into`) of the worker's buffer into this process's | Gbit/s |
//! | `matmul_gflops` | CPU f32 `[1024, 1024] x [1024, 1024]`, median of 7 after 1 | GFLOP/s |
//! | `matmul_f64_gflops` | the same in f64 | GFLOP/s |
//! | `matmul_floor_gflops` | a naive `i-k-j` loop on f32 at N = 256: what the obvious code gets on this machine | GFLOP/s |
//! | `cuda_matmul_gflops` | only with the `cuda` feature and a GPU: f32 at N = 4096 on `cuda:0` (cuBLAS), 8 products a sample, median of 7; otherwise skipped with a line on stderr | GFLOP/s |
//! | `tensor_allreduce_floor_gbps` | floor: `2 k S` bytes (each of `k` = 4 peer processes' `S` = 64 MiB in, then `S` back to each) over one Unix socket per peer, 4 threads, blocking std sockets, buffers touched once; median of 7 turns after 1 | Gbit/s |
//! | `tensor_allreduce_gbps` | `TensorMesh::all_reduce` of a `Partial` f32 tensor of 64 MiB a rank over 4 child procs (hidden subcommand `tensor-bootstrap`; round a ring of the workers, `--allreduce-ring-min-bytes` to change), as the bytes a star through the controller moves (`2 k S * 8 / t`, the floor's bytes); median of 7 turns after a checked one, in turns with the floor (see `allreduce.rs`) | Gbit/s |
//! | `tensor_allreduce_busbw_gbps` | the same all-reduce's bus bandwidth as NCCL's tests define it: `algbw = S / t`, `busbw = algbw * 2 (k - 1) / k` | Gbit/s |
//!
//! Read `rdma_tcp_gbps` against `raw_tcp_gbps` (the target is at least
//! 0.8 x; the log prints the ratio), and `tensor_allreduce_gbps` against
//! `tensor_allreduce_floor_gbps` (the target is at least 0.5 x, within 2x
//! of the floor; the log prints the ratio and the per-rank `S / t`). The
//! TCP backend moves chunks on up to 4 connections at once, so it can beat
//! the single bare stream. About 20 s on two cores (3 GiB resident across
//! the two processes of the transfers); `--quick` moves 64 MiB, multiplies
//! at N = 256, all-reduces 8 MiB a rank and takes a few seconds.
//!
//! ## `anylang`: the same program in Rust, Python and JavaScript
//!
//! One program written three times (`host/bench/guest`'s `anylang` mode,
//! `host/bench/programs/python/anylang.py`,
//! `host/bench/programs/js/anylang.js`), built by the suite (cargo,
//! `monarch-host build`, `node guest-sdk/js/build.mjs`; not timed) and run
//! with `monarch-host run` as a user runs it, languages taking turns in
//! each phase. The programs time calls and spawns themselves with the WASI
//! monotonic clock (see `anylang.rs`); the suite times whole runs.
//! `PREFIX` is `rust`, `py` or `js`.
//!
//! | metric | what | unit |
//! | --- | --- | --- |
//! | `raw_unix_rtt_us` | floor: 64 bytes there and back over a Unix socket, blocking std sockets, two processes | us |
//! | `host_exec_ms` | floor: `monarch-host --version` end to end (starting the host's process); median of 10 | ms |
//! | `PREFIX_call_rtt_child_us` | sequential `call_one` from the controller to one actor in a child proc, handler replies at once; median of 3,000 after 300 | us |
//! | `PREFIX_call_rtt_child_20us_handler_us` | the same, the handler busy-waits 20 us on the clock first | us |
//! | `PREFIX_call_rtt_inproc_us` | `call_one` to an actor in the controller's process (`run --in-process`) | us |
//! | `PREFIX_call_rtt_inproc_20us_handler_us` | the same with the 20 us handler | us |
//! | `PREFIX_actor_cost_ms` | `(t(200) - t(1)) / 199`, `t(N)` the time to spawn a mesh of N actors on one proc (median of 3, each on a fresh proc whose first actor is already up) | ms |
//! | `PREFIX_cold_start_s` | `monarch-host run APP -- hello` (a proc, an actor, one call) with an empty `MONARCH_CACHE_DIR`, so the component is compiled; median of 3 | s |
//! | `PREFIX_warm_start_s` | the same with the compile cache of the first cold run; median of 3 | s |
//!
//! A language whose toolchain is missing (cargo with `wasm32-wasip2`,
//! componentize-py, node and jco) is skipped with a line on stderr and its
//! metrics are not printed; `--require-all` fails instead. About 80 s on
//! two cores, most of it Python's cold starts; `--quick` (100 calls, one
//! run of each start, meshes of 1 and 10) about 35 s.
//!
//! ## `scale`: casts to 10,000 Wasm actors over 64 simulated hosts
//!
//! 64 host agents (what `monarch-host agent` serves), each on a loopback
//! address of its own (127.0.0.2 onwards), all in one child process
//! (hidden subcommand `scale-agents`, which exits when its stdin closes);
//! the guest program (mode `scale`) spawns a proc on each and meshes of
//! 64, 256, 1,024, 4,096 and 10,048 actors (157 a proc) on them. This
//! process holds only the controller, so hyperactor's process-wide frame
//! counters count the controller's messages. Per size `N`:
//! `spawn_actors_ms_N`, `cast_reduce_us_N` (median of 100; p10 and p90
//! as `cast_reduce_p10_us_N`, `cast_reduce_p90_us_N`),
//! `controller_msgs_sent_per_cast_N`, `controller_msgs_received_per_cast_N`
//! (data frames; the suite fails if they grow with N),
//! `cpu_per_cast_per_actor_us_N`, `controller_cpu_per_cast_us_N`,
//! `cast_cores_busy_N`, `cast_residual_us_N` (latency less the procs' CPU
//! per cast over the cores), `rss_per_actor_kib_N`; once:
//! `spawn_procs_ms`, `rss_per_proc_mib`, least-squares fits of the latency
//! and of the residual against log2 N and N (`cast_fit_log_r2`,
//! `cast_fit_linear_r2`, ...: `a_us`, `b_us`, `r2` of each), and the floor
//! `raw_unix_rtt_us`. Slopes and residuals may be negative, so these
//! records are any finite number. About 60 s on two cores; `--quick` (8
//! agents, 8, 64 and 256 actors) about 2 s. See `docs/scale.md`.

mod allreduce;
mod anylang;
mod controller;
mod dataplane;
mod driver;
mod guest;
mod mesh;
mod raw;
mod report;
mod runtime;
mod scale;
mod serve;
mod steal;
mod worker;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use hyperactor::ChannelAddr;
use tracing_subscriber::EnvFilter;
use worker::Flavor;

const AFTER_HELP: &str = "\
Output: one JSON object a line on stdout, nothing else, e.g.
  {\"suite\":\"runtime\",\"metric\":\"ipc_call_rtt_us\",\"value\":14.2,\"unit\":\"us\"}
Logs, spreads (p10/p50/p90/p99) and ratios go to stderr; RUST_LOG sets their level
(default: info for monarch_bench, warn for everything else).

Each suite measures its own floor in the same run. Absolute times drift on shared
machines; read a figure as a ratio to its floor. See docs/benchmarks.md.

Examples:
  monarch-bench runtime            the full runtime suite (about 15 s on 2 cores)
  monarch-bench runtime --quick    a smoke test, a few seconds, rough figures
  monarch-bench mesh               procs as child processes (about 10 s; needs the guest
                                   program: cd guest-sdk && cargo build --release --target wasm32-wasip2)
  monarch-bench mesh --peers       then the same workloads on PyTorch Monarch 0.7.0 and Ray 2.60.0
                                   in the same run (records with a \"peer\" field; needs
                                   target/peers-venv, see --help of mesh)
  monarch-bench serve              the HTTP server: uploads, submit to first log, jobs/s (about
                                   8 s; needs the example programs, built as for mesh)
  monarch-bench dataplane          1 GiB between two processes through monarch-rdma's TCP
                                   backend next to a bare TCP stream, tensor matmul GFLOP/s, and
                                   a tensor all-reduce over 4 child procs next to raw Unix sockets
                                   (about 20 s; --quick moves 64 MiB)
  monarch-bench scale              casts to 10,000 Wasm actors over 64 simulated hosts (agents on
                                   127.0.0.2..): spawn, cast-and-reduce latency, memory, the
                                   controller's messages per cast, fits in log N and N (a few
                                   minutes; --quick under a minute; needs the guest program)
  monarch-bench anylang            the same program in Rust, Python and JavaScript side by side:
                                   call round trips, cost per actor, cold and warm starts through
                                   monarch-host run (about a minute; needs target/release/monarch-host,
                                   componentize-py, node and jco; a missing one skips its language)";

/// Benchmarks of monarch-host, each read against a floor measured in the same run.
#[derive(Debug, Parser)]
#[command(name = "monarch-bench", version, after_help = AFTER_HELP)]
#[command(subcommand_required = true, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Debug, Subcommand)]
enum Suite {
    /// The actor runtime's round trips and throughput, next to raw socket round trips.
    ///
    /// Measures actor call round trips in one process, across processes over a
    /// Unix socket and over loopback TCP, pipelined calls and one-way messages
    /// per second across processes, and bare socket round trips (the floor)
    /// in the same run.
    ///
    /// Metrics: raw_unix_rtt_us, raw_tcp_rtt_us, inproc_call_rtt_us,
    /// ipc_call_rtt_us, tcp_call_rtt_us (medians, us), ipc_calls_per_s
    /// (calls/s), oneway_msgs_per_s (msgs/s). Payloads are 64 bytes.
    Runtime(RuntimeArgs),

    /// The Wasm controller: host calls, calls to Wasm actors and spawning,
    /// measured from inside a controller program, next to the same call
    /// between two native actors (the floor).
    ///
    /// Metrics: hostcall_ns, controller_call_rtt_us (median),
    /// controller_calls_per_s (1,000 concurrent calls), actor_instantiate_us
    /// (median), spawn_1000_actors_ms, and the floor native_call_rtt_us.
    /// Needs the guest program: `cd guest-sdk && cargo build --release
    /// --target wasm32-wasip2`.
    Controller(controller::ControllerArgs),

    /// Wasm actors on procs that are child processes, driven by a Wasm
    /// controller: spawning procs, gathered calls, broadcasts and a reduction
    /// over 1,024 actors, next to a bare Unix socket round trip (the floor).
    ///
    /// Metrics: spawn_procs_8_ms, spawn_procs_16_ms (spawn the procs, an
    /// actor on each and a first call; median of 5), call_gather_8_us,
    /// call_gather_16_us (median), broadcast_100_then_call_16_ms (median of
    /// 21), cast_reduce_1024_us (64 actors on each of 16 procs, summed in
    /// the host; median), and the floor raw_unix_rtt_us. Needs the guest
    /// program: `cd guest-sdk && cargo build --release --target
    /// wasm32-wasip2`. About 10 s on 2 cores. `--peers` then measures the
    /// same workloads on PyTorch Monarch 0.7.0 and Ray 2.60.0 in the same
    /// run.
    Mesh(mesh::MeshArgs),

    /// `monarch-host serve` over HTTP, in this process: uploads that
    /// compile, the time from a submission to its first log line, and jobs
    /// per second on a persistent mesh and on fresh meshes, next to a bare
    /// `GET /healthz` round trip (the floor).
    ///
    /// Metrics: upload_compile_hello_ms, upload_compile_counter_ms,
    /// upload_compile_ping_pong_ms (no compile cache; median of 3),
    /// submit_to_first_log_ms (median of 21), jobs_per_s (`hello 2` on a
    /// persistent mesh of 2 procs, 200 jobs, 16 in flight; median of 3
    /// runs), fresh_mesh_jobs_per_s (the same on fresh meshes, 40 jobs, 4
    /// in flight), fresh_mesh_proc_cpu_ms (the CPU time of one of their
    /// procs, start to exit), the same two with procs forked by the fork
    /// server (fresh_mesh_forked_*), and the floor http_rtt_us. Needs the example programs:
    /// `cd guest-sdk && cargo build --release --target wasm32-wasip2`.
    /// About 8 s on 2 cores.
    Serve(serve::ServeArgs),

    /// Bulk bytes between two processes through monarch-rdma (TCP backend),
    /// next to a bare loopback TCP stream between the same processes (the
    /// floor), matmul throughput of monarch-tensor, and a sharded tensor's
    /// all-reduce over child procs next to the same bytes over raw Unix
    /// sockets (its floor).
    ///
    /// Metrics: raw_tcp_gbps (the floor), rdma_tcp_gbps (one-sided WRITE),
    /// rdma_tcp_read_gbps (one-sided READ), each 1 GiB, median of 7 turns
    /// (Gbit/s); matmul_gflops, matmul_f64_gflops (CPU, N = 1024),
    /// matmul_floor_gflops (naive loop, N = 256), and with the `cuda`
    /// feature and a GPU cuda_matmul_gflops (f32, N = 4096), all GFLOP/s;
    /// tensor_allreduce_gbps (4 child procs x 64 MiB of f32, as the bytes
    /// a star through the controller moves), its floor
    /// tensor_allreduce_floor_gbps and NCCL's bus bandwidth
    /// tensor_allreduce_busbw_gbps, median of 7 turns (Gbit/s). About 20 s
    /// on 2 cores.
    Dataplane(dataplane::DataplaneArgs),

    /// The same program in Rust, Python and JavaScript, side by side in one
    /// run through `monarch-host run`: call round trips to an actor in a
    /// child proc and in process (a handler that replies at once, and one
    /// that busy-waits 20 us), the cost of one more actor in a mesh on one
    /// proc, and cold (empty compile cache) and warm starts, next to a bare
    /// Unix socket round trip and `monarch-host --version` (the floors).
    ///
    /// Metrics, each with the prefix rust_, py_ and js_: call_rtt_child_us,
    /// call_rtt_child_20us_handler_us, call_rtt_inproc_us,
    /// call_rtt_inproc_20us_handler_us (medians of 3,000 calls, us),
    /// actor_cost_ms ((t(200) - t(1)) / 199 for spawning a mesh of N actors
    /// on one proc, medians of 3, ms), cold_start_s, warm_start_s (`monarch-host
    /// run APP -- hello`, medians of 3, s); and the floors raw_unix_rtt_us and
    /// host_exec_ms. Builds the programs first (cargo, `monarch-host build`
    /// with componentize-py, node with jco); a language whose toolchain is
    /// missing is skipped with a line on stderr (`--require-all` fails
    /// instead). About a minute on 2 cores, most of it Python's cold starts.
    Anylang(anylang::AnylangArgs),

    /// Casts to up to 10,000 Wasm actors over 64 simulated hosts (host
    /// agents on loopback addresses of their own, 127.0.0.2 onwards, all
    /// in one child process; a proc on each), next to a bare Unix socket
    /// round trip (the floor).
    ///
    /// At 64, 256, 1,024, 4,096 and 10,048 actors (157 on each of 64
    /// procs): spawn_actors_ms_N, cast_reduce_us_N (median; p10 and p90
    /// too), controller_msgs_sent_per_cast_N and
    /// controller_msgs_received_per_cast_N (data frames at the controller,
    /// which must stay flat in N), cpu_per_cast_per_actor_us_N,
    /// controller_cpu_per_cast_us_N, cast_residual_us_N (latency less the
    /// procs' CPU per cast over the cores), rss_per_actor_kib_N; once:
    /// spawn_procs_ms, rss_per_proc_mib, fits of the latency and of the
    /// residual against log2 N and N (cast_fit_log_r2,
    /// cast_fit_linear_r2, ...), and the floor raw_unix_rtt_us. Needs the
    /// guest program: `cd guest-sdk && cargo build --release --target
    /// wasm32-wasip2`. See docs/scale.md.
    Scale(scale::ScaleArgs),

    /// The simulated hosts of the scale suite: serves COUNT host agents on
    /// 127.0.0.2 onwards, prints `READY <pid> <addr>,...`, exits when stdin
    /// closes.
    #[command(hide = true, name = "scale-agents")]
    ScaleAgents {
        /// How many agents.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: u32,
    },

    /// A proc of the mesh and serve suites, as `monarch-host bootstrap`: started by the
    /// suite itself, configured through the environment.
    #[command(hide = true)]
    Bootstrap,

    /// One round of the mesh suite's workloads on this host, in a process of
    /// its own: runs the guest program and writes each line of its log to
    /// stdout as it is logged. Started by `mesh` itself.
    #[command(hide = true, name = "mesh-round")]
    MeshRound(mesh::MeshRoundArgs),

    /// A proc of the dataplane suite's all-reduce, whose actors are tensor
    /// workers: started by the suite itself, configured through the
    /// environment.
    #[command(hide = true, name = "tensor-bootstrap")]
    TensorBootstrap,

    /// Peer of the dataplane suite's all-reduce floor: connects to SOCKET,
    /// prints `READY <socket>`, then sends BYTES and takes BYTES back on
    /// every round; exits when the socket or stdin closes.
    #[command(hide = true, name = "allreduce-floor-peer")]
    AllreduceFloorPeer {
        /// The suite's Unix socket.
        #[arg(long)]
        socket: std::path::PathBuf,
        /// Bytes each way a round.
        #[arg(long)]
        bytes: usize,
    },

    /// Worker process of the runtime suite: serves a proc with an echo actor
    /// at ADDR, prints `READY <proc id>`, exits when stdin closes.
    #[command(hide = true)]
    Worker {
        /// Where to serve: unix:PATH or tcp:IP:PORT.
        #[arg(long)]
        addr: ChannelAddr,
        /// Tokio worker threads.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
        worker_threads: u16,
        /// Tokio scheduler.
        #[arg(long, value_enum, default_value_t = Flavor::CurrentThread)]
        flavor: Flavor,
        /// Busy-poll window of the proc's connections, in microseconds.
        #[arg(long, default_value_t = DEFAULT_BUSY_POLL_US)]
        busy_poll_us: u64,
        /// Speaks TLS on TCP with the certificates in DIR (the runtime
        /// suite's `tcp_tls_*` figures).
        #[arg(long, value_name = "DIR")]
        tls_dir: Option<std::path::PathBuf>,
    },

    /// Worker process of the dataplane suite: registers a buffer of BYTES
    /// bytes, prints `READY <handle hex> <sink address>`, exits when stdin
    /// closes.
    #[command(hide = true, name = "dataplane-worker")]
    DataplaneWorker {
        /// Length of the buffer.
        #[arg(long)]
        bytes: usize,
    },

    /// Raw floor of the runtime suite: a blocking echo server at ADDR;
    /// prints `READY <addr>`, exits when stdin closes.
    #[command(hide = true, name = "raw-echo")]
    RawEcho {
        /// Where to serve: unix:PATH or tcp:IP:PORT.
        #[arg(long)]
        addr: ChannelAddr,
    },
}

#[derive(Debug, Args)]
struct RuntimeArgs {
    /// Run far fewer iterations: finishes in a few seconds. For smoke tests;
    /// the figures are rough.
    #[arg(long)]
    quick: bool,

    /// Tokio worker threads in this process and in each worker process
    /// (multi-thread scheduler only).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    worker_threads: u16,

    /// Tokio scheduler in this process and in each worker process. The
    /// default is the one `monarch-host` runs its procs on (and, with
    /// `--threads 1`, its default, the controller).
    #[arg(long, value_enum, default_value_t = Flavor::CurrentThread)]
    flavor: Flavor,

    /// How long each proc's connections poll for the next frame before
    /// their task sleeps (hyperactor's `ProcConfig::busy_poll`), in
    /// microseconds, in this process and in each worker process. 0 turns
    /// busy polling off.
    #[arg(long, default_value_t = DEFAULT_BUSY_POLL_US)]
    busy_poll_us: u64,
}

/// hyperactor's default busy-poll window, in microseconds.
const DEFAULT_BUSY_POLL_US: u64 = 50;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.suite, Suite::Bootstrap) {
        // A fork server returns here only in each proc it forks (AL-5),
        // which then reads its environment as a started proc would.
        hyperactor_mesh::fork::serve_forks_prepared(
            || {
                monarch_host::wasm_actor::prepare_forked_procs();
                monarch_host::proc_log::prepare(monarch_host::proc_log::PROC_FILTER);
            },
            monarch_host::wasm_actor::preload_forked_program,
        );
    }
    if !matches!(cli.suite, Suite::Bootstrap | Suite::TensorBootstrap) {
        // The controller's code on 2 MiB pages, as `monarch-host run`'s
        // (docs/mesh.md); procs start from the copy anyway.
        hyperactor_mesh::exe::run_from_copy();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("monarch-bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if matches!(cli.suite, Suite::Bootstrap | Suite::TensorBootstrap) {
        // A proc logs as `monarch-host bootstrap` does (PL-1), with the log
        // its fork server made if it was forked (PL-2).
        monarch_host::proc_log::init(monarch_host::proc_log::PROC_FILTER);
    } else {
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("warn,monarch_bench=info"));
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init();
    }
    match cli.suite {
        Suite::Runtime(args) => {
            let threads = usize::from(args.worker_threads);
            let mut settings = if args.quick {
                runtime::Settings::quick(args.flavor, threads)
            } else {
                runtime::Settings::full(args.flavor, threads)
            };
            settings.busy_poll = std::time::Duration::from_micros(args.busy_poll_us);
            let rt = worker::runtime(args.flavor, threads)?;
            let result = rt.block_on(runtime::run(&settings));
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            result
        }
        Suite::Controller(args) => on_runtime(args.threads, controller::run(args)),
        Suite::Mesh(args) => on_runtime(args.workload.threads, mesh::run(args)),
        Suite::MeshRound(args) => on_runtime(args.workload.threads, mesh::run_round(args)),
        Suite::Scale(args) => on_runtime(args.threads, scale::run(args)),
        Suite::ScaleAgents { count } => scale::serve_agents(count),
        // Before any runtime: it sets the compile cache's directory.
        Suite::Serve(args) => serve::main(args),
        Suite::Dataplane(args) => dataplane::main(args),
        Suite::Anylang(args) => anylang::main(args),
        Suite::DataplaneWorker { bytes } => dataplane::serve_worker(bytes),
        Suite::Bootstrap => bootstrap(),
        Suite::TensorBootstrap => allreduce::serve_tensor_proc(),
        Suite::AllreduceFloorPeer { socket, bytes } => allreduce::serve_floor_peer(&socket, bytes),
        Suite::Worker {
            addr,
            worker_threads,
            flavor,
            busy_poll_us,
            tls_dir,
        } => {
            if let Some(dir) = tls_dir {
                use hyperactor::channel::tls;
                tls::install(tls::TlsConfig::from_dir(&dir)?)?;
            }
            worker::serve_echo_proc(
                addr,
                flavor,
                usize::from(worker_threads),
                std::time::Duration::from_micros(busy_poll_us),
            )
        }
        Suite::RawEcho { addr } => raw::serve_echo(addr),
    }
}

/// Runs `suite` to its end on a runtime of `threads` threads, as
/// `monarch-host run --threads` does: 1 is a current-thread runtime.
fn on_runtime(
    threads: u16,
    suite: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let rt = match threads {
        1 => worker::runtime(Flavor::CurrentThread, 1)?,
        n => worker::runtime(Flavor::MultiThread, n.into())?,
    };
    let result = rt.block_on(suite);
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// The `bootstrap` subcommand: serves one proc of the mesh or serve suite, whose
/// actors are the program's Wasm actors, exactly as `monarch-host
/// bootstrap` does, until the suite goes away.
fn bootstrap() -> anyhow::Result<()> {
    let rt = worker::runtime(Flavor::CurrentThread, 1)?;
    rt.block_on(hyperactor_mesh::alloc::bootstrap_main(|config| {
        monarch_host::wasm_actor::registry(config.blob_dir.clone(), None)
    }))
}
