//! End-to-end: the built `monarch-bench` binary keeps its output contract.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_monarch-bench");

/// Every metric of the runtime suite, with its unit.
const RUNTIME_METRICS: [(&str, &str); 13] = [
    ("inproc_call_rtt_us", "us"),
    ("ipc_call_rtt_us", "us"),
    ("tcp_call_rtt_us", "us"),
    ("tcp_tls_call_rtt_us", "us"),
    ("raw_unix_rtt_us", "us"),
    ("raw_tcp_rtt_us", "us"),
    ("ipc_calls_per_s", "calls/s"),
    ("oneway_msgs_per_s", "msgs/s"),
    ("oneway_peak_queued_mib", "MiB"),
    ("tcp_calls_per_s", "calls/s"),
    ("tcp_oneway_msgs_per_s", "msgs/s"),
    ("tcp_tls_calls_per_s", "calls/s"),
    ("tcp_tls_oneway_msgs_per_s", "msgs/s"),
];

/// Every metric of the mesh suite, with its unit.
const MESH_METRICS: [(&str, &str); 9] = [
    ("spawn_procs_8_ms", "ms"),
    ("spawn_procs_16_ms", "ms"),
    ("call_gather_8_us", "us"),
    ("call_gather_16_us", "us"),
    ("broadcast_100_then_call_16_ms", "ms"),
    ("cast_reduce_1024_us", "us"),
    ("raw_unix_rtt_us", "us"),
    ("raw_gather_8_us", "us"),
    ("raw_gather_16_us", "us"),
];

/// Every metric of the serve suite, with its unit.
const SERVE_METRICS: [(&str, &str); 10] = [
    ("upload_compile_hello_ms", "ms"),
    ("upload_compile_counter_ms", "ms"),
    ("upload_compile_ping_pong_ms", "ms"),
    ("submit_to_first_log_ms", "ms"),
    ("jobs_per_s", "jobs/s"),
    ("fresh_mesh_jobs_per_s", "jobs/s"),
    ("fresh_mesh_proc_cpu_ms", "ms"),
    ("fresh_mesh_forked_jobs_per_s", "jobs/s"),
    ("fresh_mesh_forked_proc_cpu_ms", "ms"),
    ("http_rtt_us", "us"),
];

/// Every metric of the dataplane suite, with its unit, but
/// `cuda_matmul_gflops` (only with the `cuda` feature and a GPU).
const DATAPLANE_METRICS: [(&str, &str); 9] = [
    ("raw_tcp_gbps", "Gbit/s"),
    ("rdma_tcp_gbps", "Gbit/s"),
    ("rdma_tcp_read_gbps", "Gbit/s"),
    ("matmul_gflops", "GFLOP/s"),
    ("matmul_f64_gflops", "GFLOP/s"),
    ("matmul_floor_gflops", "GFLOP/s"),
    ("tensor_allreduce_gbps", "Gbit/s"),
    ("tensor_allreduce_floor_gbps", "Gbit/s"),
    ("tensor_allreduce_busbw_gbps", "Gbit/s"),
];

/// Every metric of the anylang suite for Rust alone, with its unit (the
/// Python and JavaScript ones are the same with `py_` and `js_`).
const ANYLANG_RUST_METRICS: [(&str, &str); 9] = [
    ("rust_cold_start_s", "s"),
    ("rust_warm_start_s", "s"),
    ("rust_call_rtt_child_us", "us"),
    ("rust_call_rtt_child_20us_handler_us", "us"),
    ("rust_call_rtt_inproc_us", "us"),
    ("rust_call_rtt_inproc_20us_handler_us", "us"),
    ("rust_actor_cost_ms", "ms"),
    ("raw_unix_rtt_us", "us"),
    ("host_exec_ms", "ms"),
];

/// Runs the binary with `args`, killing it if it runs past `limit`.
fn run(args: &[&str], limit: Duration) -> Output {
    run_with_env(args, &[], limit)
}

/// [`run`] with more environment variables.
fn run_with_env(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-bench");
    let mut stdout = child.stdout.take().expect("stdout pipe");
    let mut stderr = child.stderr.take().expect("stderr pipe");
    let out = std::thread::spawn(move || {
        let mut text = Vec::new();
        stdout.read_to_end(&mut text).map(|_| text)
    });
    let err = std::thread::spawn(move || {
        let mut text = Vec::new();
        stderr.read_to_end(&mut text).map(|_| text)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for monarch-bench") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("monarch-bench {args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap().expect("read stdout"),
        stderr: err.join().unwrap().expect("read stderr"),
    }
}

/// Checks that `output` succeeded and printed each of `metrics` exactly
/// once, as a JSON record of `suite` with its unit and a positive value,
/// and nothing else on stdout.
fn assert_records(output: Output, suite: &str, metrics: &[(&str, &str)]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");

    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in stdout.lines() {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        let fields = record.as_object().expect("a record is a JSON object");
        assert_eq!(fields.len(), 4, "unexpected fields in {line}");
        assert_eq!(record["suite"], suite, "{line}");
        let metric = record["metric"].as_str().expect("metric is a string");
        let (_, unit) = metrics
            .iter()
            .find(|(name, _)| *name == metric)
            .unwrap_or_else(|| panic!("unknown metric {metric} in {line}"));
        assert_eq!(record["unit"], *unit, "{line}");
        let value = record["value"].as_f64().expect("value is a number");
        assert!(value.is_finite() && value > 0.0, "{line}");
        *seen.entry(metric.to_string()).or_default() += 1;
    }
    for (metric, _) in metrics {
        assert_eq!(
            seen.get(*metric),
            Some(&1),
            "{metric} must appear exactly once in:\n{stdout}"
        );
    }
    assert!(stdout.ends_with('\n'), "the last record ends its line");
}

#[test]
fn runtime_quick_prints_each_metric_once_as_json_and_nothing_else() {
    let output = run(&["runtime", "--quick"], Duration::from_secs(120));
    assert_records(output, "runtime", &RUNTIME_METRICS);
}

/// Builds the guest program of the controller and mesh suites (a no-op
/// when it is up to date) and returns its path.
fn guest_program() -> PathBuf {
    let dir = build_guests(&["controller-bench"]);
    let wasm = dir.join("controller_bench.wasm");
    assert!(wasm.exists(), "{} was not built", wasm.display());
    wasm
}

/// Builds the example programs the serve suite uploads (a no-op when they
/// are up to date) and returns their directory.
fn example_programs() -> PathBuf {
    let dir = build_guests(&["hello", "counter", "ping-pong"]);
    for name in ["hello", "counter", "ping_pong"] {
        let wasm = dir.join(format!("{name}.wasm"));
        assert!(wasm.exists(), "{} was not built", wasm.display());
    }
    dir
}

/// Builds the guest `packages` for `wasm32-wasip2` in release and returns
/// the directory they are built in.
fn build_guests(packages: &[&str]) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--locked", "--quiet"])
        .args(["--target", "wasm32-wasip2"]);
    for package in packages {
        command.args(["-p", package]);
    }
    command
        .arg("--manifest-path")
        .arg(repo.join("guest-sdk/Cargo.toml"))
        .stdin(Stdio::null());
    // What an outer build sets would change the guest build's target or
    // flags.
    for name in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        command.env_remove(name);
    }
    let status = command
        .status()
        .expect("run cargo to build the guest programs");
    assert!(
        status.success(),
        "building the guest programs {packages:?} failed ({status}); it needs `rustup target add wasm32-wasip2`"
    );
    repo.join("guest-sdk/target/wasm32-wasip2/release")
}

#[test]
fn mesh_quick_prints_each_metric_once_as_json_and_nothing_else() {
    let program = guest_program();
    let program = program.to_str().expect("a UTF-8 path");
    let started = Instant::now();
    let output = run(
        &["mesh", "--quick", "--program", program],
        Duration::from_secs(60),
    );
    let took = started.elapsed();
    assert_records(output, "mesh", &MESH_METRICS);
    // Procs are child processes of this binary (`bootstrap`); a smoke run
    // that gets slow is a regression worth seeing.
    assert!(took < Duration::from_secs(20), "mesh --quick took {took:?}");
}

/// `--rounds 2`: the workloads run twice, each round's figures go to the
/// log, and stdout still holds one record a metric (the median).
#[test]
fn mesh_rounds_log_each_round_and_print_each_metric_once() {
    let program = guest_program();
    let program = program.to_str().expect("a UTF-8 path");
    let output = run(
        &["mesh", "--quick", "--rounds", "2", "--program", program],
        Duration::from_secs(90),
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_records(output, "mesh", &MESH_METRICS);
    let rounds = stderr.lines().filter(|l| l.contains("this host: ")).count();
    assert_eq!(rounds, 2, "{stderr}");
    // Each round in a process of its own, as `monarch-host run` runs a
    // program: none inherits what the one before left in its process.
    let pids: std::collections::BTreeSet<&str> = stderr
        .lines()
        .filter(|l| l.contains("runs in a process of its own"))
        .filter_map(|l| l.split("pid=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or(rest))
        .collect();
    assert_eq!(pids.len(), 2, "two rounds, two processes: {stderr}");
}

#[test]
fn serve_quick_prints_each_metric_once_as_json_and_nothing_else() {
    let programs = example_programs();
    let programs = programs.to_str().expect("a UTF-8 path");
    let started = Instant::now();
    let output = run(
        &["serve", "--quick", "--programs", programs],
        Duration::from_secs(60),
    );
    let took = started.elapsed();
    assert_records(output, "serve", &SERVE_METRICS);
    // A server, a persistent mesh of 2 procs and a few dozen jobs; a smoke
    // run that gets slow is a regression worth seeing.
    assert!(
        took < Duration::from_secs(30),
        "serve --quick took {took:?}"
    );
}

/// A chunk or window the all-reduce cannot run with is refused by name
/// before anything starts.
#[test]
fn dataplane_refuses_a_chunk_or_window_out_of_range() {
    for (flag, value) in [
        ("--allreduce-chunk-bytes", "2"),
        ("--allreduce-window", "0"),
    ] {
        let output = Command::new(BIN)
            .args(["dataplane", "--quick", flag, value])
            .output()
            .expect("monarch-bench runs");
        assert!(!output.status.success(), "{flag} {value} was taken");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{stderr}");
        assert!(output.stdout.is_empty(), "nothing measured");
    }
}

#[test]
fn dataplane_quick_prints_each_metric_once_as_json_and_nothing_else() {
    let started = Instant::now();
    let output = run(&["dataplane", "--quick"], Duration::from_secs(120));
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let gpu = monarch_tensor::cuda_device_count().is_ok_and(|count| count > 0);
    let mut metrics = DATAPLANE_METRICS.to_vec();
    if gpu {
        metrics.push(("cuda_matmul_gflops", "GFLOP/s"));
    }
    assert_records(output, "dataplane", &metrics);
    // The log says how the transfers compare with the floor, and why there
    // is no CUDA figure (RUST_LOG could hide both).
    if std::env::var_os("RUST_LOG").is_none() {
        assert!(stderr.contains("rdma_tcp_gbps / raw_tcp_gbps"), "{stderr}");
        assert!(
            stderr.contains("tensor_allreduce_gbps / tensor_allreduce_floor_gbps"),
            "{stderr}"
        );
        // The line names the chunk and window it ran with: the mesh's.
        assert!(
            stderr.contains("chunk_bytes=1048576") && stderr.contains("window=4"),
            "{stderr}"
        );
        if !gpu {
            assert!(
                stderr.contains("cuda_matmul_gflops not measured"),
                "{stderr}"
            );
        }
    }
    // 64 MiB three ways a few times between two processes, small matmuls,
    // and a few all-reduces of 8 MiB a rank over 4 child procs; a smoke run
    // that gets slow is a regression worth seeing.
    assert!(
        took < Duration::from_secs(30),
        "dataplane --quick took {took:?}"
    );
}

/// The `monarch-host` next to this binary, which the anylang suite runs
/// by default; `None` (the test says so and passes) when this profile has
/// none: `cargo build -p monarch-host` makes it.
fn monarch_host() -> Option<PathBuf> {
    let host = Path::new(BIN).with_file_name("monarch-host");
    if host.is_file() {
        Some(host)
    } else {
        eprintln!(
            "skipped: {} does not exist (cargo build -p monarch-host)",
            host.display()
        );
        None
    }
}

#[test]
fn anylang_quick_measures_rust_and_skips_a_missing_toolchain_with_a_line() {
    let Some(_) = monarch_host() else { return };
    let program = guest_program();
    let program = program.to_str().expect("a UTF-8 path");
    // An empty cache, so that the Python build cannot be found there, and
    // no componentize-py or node: both languages are skipped.
    let cache = std::env::temp_dir().join(format!("monarch-bench-smoke-{}", std::process::id()));
    let output = run_with_env(
        &[
            "anylang",
            "--quick",
            "--rust-program",
            program,
            "--node",
            "/nonexistent/monarch-bench/node",
        ],
        &[
            ("MONARCH_CACHE_DIR", cache.to_str().expect("a UTF-8 path")),
            (
                "MONARCH_COMPONENTIZE_PY",
                "/nonexistent/monarch-bench/componentize-py",
            ),
        ],
        Duration::from_secs(180),
    );
    let _ = std::fs::remove_dir_all(&cache);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_records(output, "anylang", &ANYLANG_RUST_METRICS);
    if std::env::var_os("RUST_LOG").is_none() {
        assert!(stderr.contains("Python (py_* metrics) skipped"), "{stderr}");
        assert!(stderr.contains("componentize-py"), "{stderr}");
        assert!(
            stderr.contains("JavaScript (js_* metrics) skipped"),
            "{stderr}"
        );
        assert!(stderr.contains("jco"), "{stderr}");
    }
}

#[test]
fn anylang_require_all_fails_before_measuring_when_a_toolchain_is_missing() {
    let Some(_) = monarch_host() else { return };
    let output = run(
        &[
            "anylang",
            "--quick",
            "--languages",
            "js",
            "--node",
            "/nonexistent/monarch-bench/node",
            "--require-all",
        ],
        Duration::from_secs(60),
    );
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "no records on stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("JavaScript (js_* metrics) could not be built"),
        "{stderr}"
    );
    assert!(stderr.contains("--require-all"), "{stderr}");
}

#[test]
fn an_unknown_suite_fails_with_a_message_and_no_records() {
    let output = run(&["no-such-suite"], Duration::from_secs(30));
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "no records on stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no-such-suite"), "{stderr}");
}

#[test]
fn a_bad_argument_fails_before_measuring_anything() {
    let output = run(
        &["runtime", "--worker-threads", "0"],
        Duration::from_secs(30),
    );
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "no records on stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--worker-threads"), "{stderr}");
}

#[test]
fn help_names_the_suites_and_hides_the_worker_modes() {
    let output = run(&["--help"], Duration::from_secs(30));
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("runtime"), "{help}");
    assert!(help.contains("JSON"), "{help}");
    assert!(help.contains("mesh"), "{help}");
    assert!(help.contains("serve"), "{help}");
    assert!(help.contains("dataplane"), "{help}");
    assert!(help.contains("anylang"), "{help}");
    assert!(!help.contains("raw-echo"), "{help}");
    assert!(!help.contains("dataplane-worker"), "{help}");
    assert!(!help.contains("bootstrap"), "{help}");
    assert!(!help.contains("mesh-round"), "{help}");
}

#[test]
fn mesh_peers_without_python_warns_how_to_install_and_keeps_stdout_clean() {
    let program = guest_program();
    let program = program.to_str().expect("a UTF-8 path");
    let output = run(
        &[
            "mesh",
            "--quick",
            "--program",
            program,
            "--peers",
            "--peers-python",
            "/nonexistent/monarch-bench-peers/python",
        ],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_records(output, "mesh", &MESH_METRICS);
    assert!(
        stderr.contains("pip install torchmonarch==0.7.0 ray==2.60.0"),
        "{stderr}"
    );
}

/// The scale suite's records at one size `n` (actors), with their units.
fn scale_size_metrics(n: u32) -> Vec<(String, &'static str)> {
    [
        ("spawn_actors_ms", "ms"),
        ("cast_reduce_us", "us"),
        ("cast_reduce_p10_us", "us"),
        ("cast_reduce_p90_us", "us"),
        ("controller_msgs_sent_per_cast", "msgs"),
        ("controller_msgs_received_per_cast", "msgs"),
        ("cpu_per_cast_per_actor_us", "us"),
        ("controller_cpu_per_cast_us", "us"),
        ("cast_cores_busy", "cores"),
        ("cast_residual_us", "us"),
        ("rss_per_actor_kib", "KiB"),
    ]
    .into_iter()
    .map(|(name, unit)| (format!("{name}_{n}"), unit))
    .collect()
}

#[test]
fn scale_quick_prints_each_metric_once_and_the_controllers_messages_stay_flat() {
    let program = guest_program();
    let program = program.to_str().expect("a UTF-8 path");
    let started = Instant::now();
    let output = run(
        &["scale", "--quick", "--program", program],
        Duration::from_secs(120),
    );
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The suite fails when a reduced sum is wrong or the controller's
    // messages per cast grow with N.
    assert!(output.status.success(), "failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");

    let sizes = [8, 64, 256];
    let mut expected: Vec<(String, &str)> = vec![
        ("spawn_procs_ms".into(), "ms"),
        ("rss_per_proc_mib".into(), "MiB"),
        ("raw_unix_rtt_us".into(), "us"),
    ];
    for n in sizes {
        expected.extend(scale_size_metrics(n));
    }
    for prefix in ["cast_fit", "cast_residual_fit"] {
        for (fit, unit) in [
            ("log_a_us", "us"),
            ("log_b_us", "us"),
            ("log_r2", "1"),
            ("linear_a_us", "us"),
            ("linear_b_us", "us"),
            ("linear_r2", "1"),
        ] {
            expected.push((format!("{prefix}_{fit}"), unit));
        }
    }
    let mut values: HashMap<String, Vec<f64>> = HashMap::new();
    for line in stdout.lines() {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        let fields = record.as_object().expect("a record is a JSON object");
        assert_eq!(fields.len(), 4, "unexpected fields in {line}");
        assert_eq!(record["suite"], "scale", "{line}");
        let metric = record["metric"].as_str().expect("metric is a string");
        let (_, unit) = expected
            .iter()
            .find(|(name, _)| name == metric)
            .unwrap_or_else(|| panic!("unknown metric {metric} in {line}"));
        assert_eq!(record["unit"], *unit, "{line}");
        let value = record["value"].as_f64().expect("value is a number");
        assert!(value.is_finite(), "{line}");
        values.entry(metric.to_string()).or_default().push(value);
    }
    for (metric, _) in &expected {
        assert_eq!(
            values.get(metric).map(Vec::len),
            Some(1),
            "{metric} must appear exactly once in:\n{stdout}"
        );
    }
    let value = |metric: &str| values[metric][0];
    for n in sizes {
        for metric in ["spawn_actors_ms", "cast_reduce_us"] {
            assert!(value(&format!("{metric}_{n}")) > 0.0, "{metric}_{n}");
        }
        // Every cast reaches the controller's children in the tree and
        // comes back reduced: some messages, as many at 256 actors as at 8.
        for way in ["sent", "received"] {
            let at = |n: u32| value(&format!("controller_msgs_{way}_per_cast_{n}"));
            assert!(at(n) >= 1.0, "controller_msgs_{way}_per_cast_{n}");
            assert!(
                at(n) <= at(8) * 1.5 + 1.0,
                "the controller's messages {way} per cast grew from {} at 8 actors to {} at {n}",
                at(8),
                at(n)
            );
        }
    }
    for fit in ["cast_fit_log_r2", "cast_fit_linear_r2"] {
        assert!((0.0..=1.0).contains(&value(fit)), "{fit} = {}", value(fit));
    }
    assert!(
        took < Duration::from_secs(60),
        "scale --quick took {took:?}"
    );
}
