//! Running the benchmark's guest program (`host/bench/guest`, built as
//! `controller_bench.wasm`) and reading back what it measured.
//!
//! The guest measures with the monotonic clock WASI grants every program
//! and logs one line per metric, `BENCH <metric> <value> <unit>`; other
//! lines (spreads, notes) are passed on to the log.

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, bail};

use crate::report::Unit;

/// Where `cd guest-sdk && cargo build --release --target wasm32-wasip2`
/// leaves the guest program, relative to the repository root.
pub const DEFAULT_PROGRAM: &str = "guest-sdk/target/wasm32-wasip2/release/controller_bench.wasm";

/// One figure the guest reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The metric's name.
    pub metric: String,
    /// Its value, in `unit`.
    pub value: f64,
    /// Its unit.
    pub unit: Unit,
}

/// Fails with how to build the guest program when `program` is missing.
pub fn check_program(program: &Path) -> anyhow::Result<()> {
    if !program.exists() {
        bail!(
            "{} does not exist: build the guest programs first with `cd guest-sdk && cargo build --release --target wasm32-wasip2`, or name the program with --program",
            program.display()
        );
    }
    Ok(())
}

/// Runs `program` with `args` in `sandbox` and returns its records in the
/// order it reported them. Its other log lines (spreads, notes) go to
/// stderr.
pub async fn run(
    program: &Path,
    args: &[String],
    sandbox: monarch_host::Sandbox,
) -> anyhow::Result<Vec<Record>> {
    Ok(run_watched(program, args, sandbox, |_| {}).await?.0)
}

/// [`run`], calling `watch` with each line of the guest's log as it is
/// logged, before the guest goes on (so that `watch` can sample the
/// machine at a moment the guest marks); returns every line too.
pub async fn run_watched(
    program: &Path,
    args: &[String],
    sandbox: monarch_host::Sandbox,
    watch: impl Fn(&str) + Send + Sync + 'static,
) -> anyhow::Result<(Vec<Record>, Vec<String>)> {
    check_program(program)?;
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = {
        let lines = lines.clone();
        Arc::new(move |line: &str| {
            watch(line);
            log_unless_record(line);
            if let Ok(mut lines) = lines.lock() {
                lines.push(line.to_string());
            }
        })
    };
    let outcome = monarch_host::run_program(program, args, sandbox, sink).await;
    let lines = lines.lock().map(|l| l.clone()).unwrap_or_default();
    if let Err(e) = outcome {
        return Err(anyhow::Error::new(e)).with_context(|| {
            format!(
                "the benchmark program failed; its output:\n{}",
                lines.join("\n")
            )
        });
    }
    Ok((records_of(&lines)?, lines))
}

/// [`run_watched`] in a child process of its own, as `monarch-host run`
/// runs a program: `command` runs the program and writes each line of its
/// log to stdout as the guest logs it (`monarch-bench mesh-round`), and
/// `watch` sees each line as it comes. The child, with every process it
/// started, is killed if it runs past `limit`.
pub async fn run_in_child(
    mut command: tokio::process::Command,
    limit: std::time::Duration,
    watch: impl Fn(&str),
) -> anyhow::Result<(Vec<Record>, Vec<String>)> {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = spawn_group(&mut command)
        .context("cannot start the process that runs the benchmark program")?;
    tracing::info!(
        pid = child.id(),
        "the benchmark program runs in a process of its own"
    );
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let mut lines = Vec::new();
    let read = async {
        let mut reader = tokio::io::BufReader::new(stdout).lines();
        while let Some(line) = reader.next_line().await? {
            watch(&line);
            log_unless_record(&line);
            lines.push(line);
        }
        anyhow::Ok(child.wait().await?)
    };
    let status = match tokio::time::timeout(limit, read).await {
        Ok(status) => status?,
        Err(_) => {
            // Its procs are in its process group.
            kill_group(&mut child).await;
            bail!(
                "the benchmark program ran past {} s and was killed with its procs",
                limit.as_secs()
            );
        }
    };
    if !status.success() {
        bail!(
            "the benchmark program failed ({status}; its error is above); its output:\n{}",
            lines.join("\n")
        );
    }
    Ok((records_of(&lines)?, lines))
}

/// Starts `command` leading a process group of its own (so that
/// [`kill_group`] reaches every process it starts), its stdout piped, its
/// stderr this process's, and killed if dropped.
pub(crate) fn spawn_group(
    command: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    use std::process::Stdio;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
}

/// Kills `child` and every process of its group (it leads one).
pub(crate) async fn kill_group(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = tokio::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stdin(std::process::Stdio::null())
            .status()
            .await;
    }
    let _ = child.kill().await;
}

/// A sink for the guest's log that writes each line to stdout as it
/// comes, for [`run_in_child`] to read.
pub fn stdout_sink() -> Arc<dyn Fn(&str) + Send + Sync> {
    Arc::new(|line: &str| {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    })
}

/// Passes a line of the guest's log other than a record on to the log.
fn log_unless_record(line: &str) {
    if !line.contains("BENCH ") {
        tracing::info!("{line}");
    }
}

/// The records in `lines`, in order.
fn records_of(lines: &[String]) -> anyhow::Result<Vec<Record>> {
    let mut records = Vec::new();
    for line in lines {
        if let Some(record) = parse_line(line)? {
            records.push(record);
        }
    }
    Ok(records)
}

/// The record in one line of the guest's log, if it holds one.
pub fn parse_line(line: &str) -> anyhow::Result<Option<Record>> {
    let Some(record) = line.split("BENCH ").nth(1) else {
        return Ok(None);
    };
    let fields: Vec<&str> = record.split_whitespace().collect();
    let [metric, value, unit] = fields[..] else {
        bail!("malformed benchmark line from the guest: {line}");
    };
    let value: f64 = value
        .parse()
        .with_context(|| format!("malformed value in {line}"))?;
    let unit = match unit {
        "ns" => Unit::Nanos,
        "us" => Unit::Micros,
        "ms" => Unit::Millis,
        "calls/s" => Unit::CallsPerSec,
        other => bail!("unknown unit {other} in {line}"),
    };
    Ok(Some(Record {
        metric: metric.to_string(),
        value,
        unit,
    }))
}

/// Checks that `records` hold each of `expected` exactly once, in any
/// order.
pub fn expect_metrics(records: &[Record], expected: &[&str]) -> anyhow::Result<()> {
    for metric in expected {
        let count = records.iter().filter(|r| r.metric == *metric).count();
        if count != 1 {
            bail!(
                "the guest reported {metric} {count} times, not once; it reported: {:?}",
                records.iter().map(|r| &r.metric).collect::<Vec<_>>()
            );
        }
    }
    if let Some(extra) = records
        .iter()
        .find(|r| !expected.contains(&r.metric.as_str()))
    {
        bail!("the guest reported an unexpected metric {}", extra.metric);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_lines_parse_and_other_lines_are_skipped() {
        let line = "[controller] BENCH call_gather_8_us 812.5 us";
        assert_eq!(
            parse_line(line).unwrap(),
            Some(Record {
                metric: "call_gather_8_us".into(),
                value: 812.5,
                unit: Unit::Micros,
            })
        );
        assert_eq!(parse_line("SPREAD x n=3").unwrap(), None);
        assert!(parse_line("BENCH x 1").is_err());
        assert!(parse_line("BENCH x one us").is_err());
        assert!(parse_line("BENCH x 1 parsecs").is_err());
    }

    #[test]
    fn every_expected_metric_must_come_once() {
        let record = |metric: &str| Record {
            metric: metric.into(),
            value: 1.0,
            unit: Unit::Micros,
        };
        assert!(expect_metrics(&[record("a"), record("b")], &["a", "b"]).is_ok());
        assert!(expect_metrics(&[record("a")], &["a", "b"]).is_err());
        assert!(expect_metrics(&[record("a"), record("a"), record("b")], &["a", "b"]).is_err());
        assert!(expect_metrics(&[record("a"), record("c")], &["a"]).is_err());
    }
}
