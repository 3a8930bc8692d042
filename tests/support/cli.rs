//! Running the `monarch-host` command as a process, as a user does: its
//! exit status, its stdout line by line (with when each line came), and
//! its stderr.

#![allow(dead_code)]

use std::time::{Duration, Instant};

/// What the `monarch-host` command did.
pub struct Command {
    /// The exit code; `None` if a signal ended it.
    pub code: Option<i32>,
    /// Its stdout, line by line, each with when it came.
    pub stdout: Vec<(Duration, String)>,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Command {
    /// When the first stdout line that contains `needle` came.
    pub fn printed_at(&self, needle: &str) -> Duration {
        self.stdout
            .iter()
            .find(|(_, line)| line.contains(needle))
            .map(|(at, _)| *at)
            .unwrap_or_else(|| panic!("no line of stdout contains {needle:?}:\n{self:?}"))
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "exit code {:?} after {:?}; stdout:",
            self.code, self.elapsed
        )?;
        for (_, line) in &self.stdout {
            writeln!(f, "{line}")?;
        }
        write!(f, "stderr:\n{}", self.stderr)
    }
}

/// Runs `monarch-host run ARGS...`; kills it and panics past `limit`.
pub fn monarch_host(args: &[&str], limit: Duration) -> Command {
    monarch_host_env(args, limit, &[])
}

/// [`monarch_host`] with environment variables.
pub fn monarch_host_env(args: &[&str], limit: Duration, env: &[(&str, &str)]) -> Command {
    let args: Vec<&str> = std::iter::once("run").chain(args.iter().copied()).collect();
    monarch_host_command(&args, limit, env)
}

/// Runs `monarch-host ARGS...` (any subcommand) with environment
/// variables; kills it and panics past `limit`.
pub fn monarch_host_command(args: &[&str], limit: Duration, env: &[(&str, &str)]) -> Command {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;

    let started = Instant::now();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start monarch-host");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let stdout = std::thread::spawn(move || {
        stdout
            .lines()
            .map_while(Result::ok)
            .map(|line| (started.elapsed(), line))
            .collect()
    });
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for monarch-host") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("monarch-host {args:?} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    Command {
        code: status.code(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        elapsed,
    }
}

impl Command {
    /// The stdout lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<&str> {
        self.stdout
            .iter()
            .filter(|(_, line)| line.contains(needle))
            .map(|(_, line)| line.as_str())
            .collect()
    }

    /// The rest of the first stdout line after `prefix`, wherever in the
    /// line `prefix` starts; panics, showing the run, if none has it.
    pub fn after(&self, prefix: &str) -> &str {
        self.stdout
            .iter()
            .find_map(|(_, line)| line.find(prefix).map(|at| &line[at + prefix.len()..]))
            .unwrap_or_else(|| panic!("no line of stdout contains {prefix:?}:\n{self:?}"))
    }
}

/// The report of the failed test `name` in a `monarch-host test` run: the
/// lines from `---- name ----` to the next such heading or the
/// `failures:` list.
pub fn test_report(run: &Command, name: &str) -> String {
    let heading = format!("---- {name} ----");
    let lines: Vec<&str> = run.stdout.iter().map(|(_, l)| l.as_str()).collect();
    let start = lines
        .iter()
        .position(|l| *l == heading)
        .unwrap_or_else(|| panic!("no report of {name}:\n{run:?}"));
    lines[start + 1..]
        .iter()
        .take_while(|l| !l.starts_with("---- ") && **l != "failures:")
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Asserts that xmllint finds the JUnit report valid (or not, `valid`)
/// against `tests/junit.xsd`; without xmllint, says so and checks nothing.
pub fn assert_junit_validates(report: &std::path::Path, valid: bool) {
    let xmllint = std::path::Path::new("/usr/bin/xmllint");
    if !xmllint.exists() {
        eprintln!(
            "xmllint is missing (apt-get install libxml2-utils): the schema check is skipped"
        );
        return;
    }
    let schema = concat!(env!("CARGO_MANIFEST_DIR"), "/junit.xsd");
    let out = std::process::Command::new(xmllint)
        .args(["--noout", "--schema", schema])
        .arg(report)
        .output()
        .expect("run xmllint");
    assert_eq!(
        out.status.success(),
        valid,
        "xmllint on {}: {}",
        report.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that a `monarch-host test` run ran exactly `verdicts`, one
/// `test NAME ... VERDICT` line each (`ok`, `FAILED`).
pub fn assert_verdicts(run: &Command, verdicts: &[(&str, &str)]) {
    let count = verdicts.len();
    let plural = if count == 1 { "" } else { "s" };
    assert_eq!(
        run.after("running "),
        format!("{count} test{plural}"),
        "{run:?}"
    );
    for (test, verdict) in verdicts {
        assert_eq!(
            run.lines_with(&format!("test {test} ... ")),
            [format!("test {test} ... {verdict}")],
            "{run:?}"
        );
    }
}
