//! End-to-end: the built `monarch-bench` binary keeps its output contract.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_monarch-bench");

/// Every metric of the runtime suite, with its unit.
const RUNTIME_METRICS: [(&str, &str); 7] = [
    ("inproc_call_rtt_us", "us"),
    ("ipc_call_rtt_us", "us"),
    ("tcp_call_rtt_us", "us"),
    ("raw_unix_rtt_us", "us"),
    ("raw_tcp_rtt_us", "us"),
    ("ipc_calls_per_s", "calls/s"),
    ("oneway_msgs_per_s", "msgs/s"),
];

/// Runs the binary with `args`, killing it if it runs past `limit`.
fn run(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
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

#[test]
fn runtime_quick_prints_each_metric_once_as_json_and_nothing_else() {
    let output = run(&["runtime", "--quick"], Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("stdout is UTF-8");

    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in stdout.lines() {
        let record: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        let fields = record.as_object().expect("a record is a JSON object");
        assert_eq!(fields.len(), 4, "unexpected fields in {line}");
        assert_eq!(record["suite"], "runtime", "{line}");
        let metric = record["metric"].as_str().expect("metric is a string");
        let (_, unit) = RUNTIME_METRICS
            .iter()
            .find(|(name, _)| *name == metric)
            .unwrap_or_else(|| panic!("unknown metric {metric} in {line}"));
        assert_eq!(record["unit"], *unit, "{line}");
        let value = record["value"].as_f64().expect("value is a number");
        assert!(value.is_finite() && value > 0.0, "{line}");
        *seen.entry(metric.to_string()).or_default() += 1;
    }
    for (metric, _) in RUNTIME_METRICS {
        assert_eq!(
            seen.get(metric),
            Some(&1),
            "{metric} must appear exactly once in:\n{stdout}"
        );
    }
    assert!(stdout.ends_with('\n'), "the last record ends its line");
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
    assert!(!help.contains("raw-echo"), "{help}");
}
