//! `monarch-host stacks`: each actor's current stack, sampled at its next
//! epoch tick without stopping it (`debug::stacks`, ST-1..3).
//!
//! The guest is `spin stacks PROCS RANK SECONDS` (tests/programs/spin): a
//! `Spinner` on each proc, the one at RANK spinning in `spin_forever`, the
//! others idle, the controller waiting in the host. The same run is
//! sampled three ways: through the library (`collect`, procs in this
//! process), through a server's job (`GET /v1/jobs/{id}/stacks` and
//! `stacks --server`, procs as child processes), and from the command line
//! (`run`, then `stacks`, which finds the run by its record).

#[path = "support/serve.rs"]
mod serve_support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monarch_host::Sandbox;
use monarch_host::debug::LiveRun;
use monarch_host::debug::stacks::{ActorStack, ActorState, Report, collect, is_std, render};
use monarch_host::engine::EPOCH_TICK;
use monarch_host::host::LogSink;
use monarch_host::serve::api::JobRequest;
use serve_support::{Scratch, ServeProcess};

const SPIN: &str = env!("GUEST_SPIN");
const SPIN_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/programs/spin/src/lib.rs");
const CLI: &str = env!("CARGO_BIN_EXE_monarch-host-cli");

/// The lines of `spin_forever`, from its `fn` to its closing brace.
fn spin_lines() -> std::ops::RangeInclusive<u32> {
    let source = std::fs::read_to_string(SPIN_SOURCE).expect("the spin program's source");
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("fn spin_forever"))
        .expect("fn spin_forever in the spin program");
    let end = start
        + lines[start..]
            .iter()
            .position(|l| *l == "}")
            .expect("the end of spin_forever");
    (start as u32 + 1)..=(end as u32 + 1)
}

/// The actor `mesh[rank]` of a report.
fn actor<'a>(report: &'a Report, mesh: &str, rank: u32) -> &'a ActorStack {
    report
        .actors
        .iter()
        .find(|a| a.mesh == mesh && a.rank == Some(rank))
        .unwrap_or_else(|| panic!("no {mesh}[{rank}] in {report:#?}"))
}

/// Panics unless `spinner` runs `spin`, its innermost frame of its own
/// being `spin_forever` on one of its lines.
fn assert_spins_in_spin_forever(spinner: &ActorStack) {
    assert_eq!(spinner.state, ActorState::Running, "{spinner:#?}");
    assert_eq!(spinner.endpoint.as_deref(), Some("spin"), "{spinner:#?}");
    let at = spinner
        .frames
        .iter()
        .find(|frame| !is_std(frame))
        .unwrap_or_else(|| panic!("no frame of the program's own: {spinner:#?}"));
    assert!(
        at.function.ends_with("spin_forever"),
        "the innermost frame is {at:?}"
    );
    let file = at.file.as_deref().unwrap_or_default();
    assert!(
        file.ends_with("programs/spin/src/lib.rs"),
        "the frame's file is {file:?}: {at:?}"
    );
    let line = at.line.unwrap_or_default();
    assert!(
        spin_lines().contains(&line),
        "line {line} is not in spin_forever ({:?})",
        spin_lines()
    );
}

/// A log sink that keeps the lines.
fn kept_lines() -> (LogSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink: LogSink = {
        let lines = lines.clone();
        Arc::new(move |line: &str| lines.lock().unwrap().push(line.to_string()))
    };
    (sink, lines)
}

/// Runs `spin ARGS` with procs in this process until a log line contains
/// `ready`, then collects its stacks `count` times, 300 ms apart, and ends
/// the run; each report with how long collecting it took.
fn sample_run(args: &[&str], ready: &str, count: usize) -> Vec<(Duration, Report)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let live = LiveRun::default();
    let sandbox = Sandbox {
        deadline: Duration::from_secs(300),
        live: live.clone(),
        ..Sandbox::default()
    };
    let (log, lines) = kept_lines();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let reports = runtime.block_on(async move {
        let run = tokio::spawn(async move {
            monarch_host::run_program(Path::new(SPIN), &args, sandbox, log).await
        });
        let until = Instant::now() + Duration::from_secs(120);
        while !lines.lock().unwrap().iter().any(|l| l.contains(ready)) {
            assert!(!run.is_finished(), "the run ended: {:?}", lines.lock());
            assert!(
                Instant::now() < until,
                "never {ready:?}: {:?}",
                lines.lock()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cluster = live.cluster().expect("the run's cluster while it runs");
        let mut reports = Vec::new();
        for _ in 0..count {
            let asked = Instant::now();
            let value = collect(&cluster).await;
            let took = asked.elapsed();
            let report: Report =
                serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value:#}"));
            reports.push((took, report));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        assert!(!run.is_finished(), "the run ended while sampled");
        run.abort();
        reports
    });
    // The spinners yield at every tick, so this is quick.
    runtime.shutdown_timeout(Duration::from_secs(1));
    reports
}

/// ST-2 and ST-3 through the library, procs in this process: the spinning
/// rank is named at its line within two epoch ticks of each request, and
/// keeps spinning (sampled again later, still in `spin`, for longer); the
/// other ranks are idle at once; the controller waits in the host.
#[test]
fn st3_a_spinning_rank_is_named_at_its_line_within_two_ticks_and_keeps_spinning() {
    let reports = sample_run(&["stacks", "3", "1", "600"], "spinner 1 starts spinning", 3);
    let two_ticks = (2 * EPOCH_TICK).as_secs_f64() * 1000.0;
    for (took, report) in &reports {
        let spinner = actor(report, "spinners", 1);
        assert_spins_in_spin_forever(spinner);
        let after = spinner.sampled_after_ms.expect("when it was sampled");
        assert!(
            after <= two_ticks,
            "sampled {after:.1} ms after the request, past two epoch ticks ({two_ticks} ms)"
        );
        for idle in [0, 2] {
            assert_eq!(actor(report, "spinners", idle).state, ActorState::Idle);
        }
        let controller = report.controller.as_ref().expect("the controller");
        assert_eq!(controller.state, ActorState::Waiting, "{controller:#?}");
        assert_eq!(controller.endpoint.as_deref(), Some("run"));
        // The controller waits in the host: reported after a few ticks,
        // not after a proc's timeout.
        assert!(*took < Duration::from_millis(900), "collect took {took:?}");
        assert_eq!(report.procs.len(), 3, "{report:#?}");
        assert!(report.procs.iter().all(|p| p.error.is_none()));
    }
    // Not stopped: still in the same `spin`, for longer.
    let first = actor(&reports[0].1, "spinners", 1).for_s.unwrap();
    let last = actor(&reports[2].1, "spinners", 1).for_s.unwrap();
    assert!(
        last >= first + 0.5,
        "in `spin` for {first} s, then {last} s"
    );
    let stuck = |report: &Report, limit| report.actors.iter().any(|a| a.stuck(limit));
    assert!(stuck(&reports[2].1, Duration::from_millis(100)));
    assert!(!stuck(&reports[2].1, Duration::from_secs(600)));
}

/// ST-3 for the procs an actor spawned itself (AO-1): their actors are
/// found through the owner's own mesh client, and named with their owner.
#[test]
fn st3_the_actors_on_procs_an_actor_spawned_are_sampled_too() {
    let reports = sample_run(&["nested", "600"], "spinner 0 starts spinning", 1);
    let (_, report) = &reports[0];
    assert_eq!(actor(report, "owners", 0).state, ActorState::Idle);
    let inner = actor(report, "inner", 0);
    assert_spins_in_spin_forever(inner);
    assert_eq!(inner.owner.as_deref(), Some("owners[0]"), "{inner:#?}");
    let owned: Vec<_> = report.procs.iter().filter(|p| p.owner.is_some()).collect();
    assert_eq!(owned.len(), 1, "{report:#?}");
    assert!(owned[0].error.is_none(), "{report:#?}");
    let text = render(report);
    assert!(
        text.lines()
            .any(|l| l.starts_with("inner[0] (host local, proc 0 of owners[0]): in `spin` for ")),
        "{text}"
    );
}

/// What `monarch-host stacks ARGS` did.
struct Stacks {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn stacks_command(args: &[&str], env: &[(&str, &Path)]) -> Stacks {
    let out = Command::new(CLI)
        .arg("stacks")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run monarch-host stacks");
    Stacks {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

impl std::fmt::Debug for Stacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {:?}; stdout:\n{}stderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Panics unless the text names spinner 1 at `spin_forever`'s line and
/// spinner 0 idle, each on its proc.
fn assert_text_names_the_spinner(out: &Stacks) {
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("spinners[1] (host local, proc 1): in `spin` for "))
        .unwrap_or_else(|| panic!("no line for spinners[1]: {out:?}"));
    let (_, at) = line
        .split_once(" s at ")
        .unwrap_or_else(|| panic!("no place in {line:?}"));
    let (function, place) = at.split_once(" (").expect("function (file:line)");
    assert!(function.ends_with("spin_forever"), "{line}");
    let number: u32 = place
        .trim_end_matches(')')
        .rsplit(':')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no line number in {line:?}"));
    assert!(place.contains("programs/spin/src/lib.rs:"), "{line}");
    assert!(spin_lines().contains(&number), "{line}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l == "spinners[0] (host local, proc 0): idle"),
        "{out:?}"
    );
}

/// A server's job, its procs child processes: `GET /v1/jobs/{id}/stacks`
/// and `stacks --server URL JOB` name the spinner at its line; the exit
/// status is 1 past `--stuck-after`, 0 before it, 2 for a job that is not
/// running.
#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_stacks_come_from_its_procs_and_stuck_after_sets_the_exit_status() {
    let dir = Scratch::new("stacks");
    let server = ServeProcess::start(&dir.0, &[]);
    let client = server.client();
    let uploaded = client
        .upload(std::fs::read(SPIN).expect("the spin program"))
        .await
        .expect("upload");
    let id = client
        .submit(&JobRequest {
            component: uploaded.id,
            args: ["stacks", "2", "1", "600"].map(String::from).to_vec(),
            limits: None,
            mesh: None,
            dirs: Vec::new(),
            env: Vec::new(),
            ..Default::default()
        })
        .await
        .expect("submit");
    let until = Instant::now() + Duration::from_secs(120);
    let report: Report = loop {
        match client.stacks(id).await {
            Ok(value) => {
                let report: Report = serde_json::from_value(value).expect("a report");
                if report
                    .actors
                    .iter()
                    .any(|a| a.rank == Some(1) && a.state == ActorState::Running)
                {
                    break report;
                }
            }
            Err(e) => assert!(!e.contains("404"), "{e}"),
        }
        assert!(
            Instant::now() < until,
            "the job's spinner never ran: {:?}",
            client.job(id).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let spinner = actor(&report, "spinners", 1);
    assert_spins_in_spin_forever(spinner);
    assert_eq!(spinner.proc_index, Some(1));
    assert_ne!(spinner.pid, Some(std::process::id()), "a child proc's");
    assert_eq!(actor(&report, "spinners", 0).state, ActorState::Idle);

    let token = dir.0.join("token");
    let token = token.to_str().unwrap();
    let job = id.to_string();
    let base = server.base.clone();
    let run = |extra: &'static [&'static str]| {
        let mut args = vec!["--server", &base, "--token-file", token, &job];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            stacks_command(&args, &[])
        })
    };
    let stuck = run(&["--stuck-after", "0.1"]).await.unwrap();
    assert_eq!(stuck.code, Some(1), "{stuck:?}");
    assert_text_names_the_spinner(&stuck);
    let fine = run(&["--stuck-after", "600"]).await.unwrap();
    assert_eq!(fine.code, Some(0), "{fine:?}");
    assert_text_names_the_spinner(&fine);
    let json = run(&["--json", "--stuck-after", "600"]).await.unwrap();
    assert_eq!(json.code, Some(0), "{json:?}");
    let report: Report = serde_json::from_str(&json.stdout).expect("--json prints a report");
    let spinner = actor(&report, "spinners", 1);
    assert_spins_in_spin_forever(spinner);
    // Through the command and the server too, within two epoch ticks.
    let two_ticks = (2 * EPOCH_TICK).as_secs_f64() * 1000.0;
    let after = spinner.sampled_after_ms.expect("when it was sampled");
    assert!(
        after <= two_ticks,
        "sampled {after:.1} ms after the request, past two epoch ticks ({two_ticks} ms)"
    );

    client.cancel(id).await.expect("cancel");
    let until = Instant::now() + Duration::from_secs(30);
    while !client.job(id).await.expect("the job").status.is_final() {
        assert!(Instant::now() < until, "the job did not end when cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ended = run(&[]).await.unwrap();
    assert_eq!(ended.code, Some(2), "{ended:?}");
    assert!(ended.stderr.contains("is not running"), "{ended:?}");
}

/// A `monarch-host run` child; killed when dropped.
struct RunProcess(Child);

impl Drop for RunProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// From the command line: `stacks` finds the newest live run on this
/// machine by its record and names its spinner; 1 past `--stuck-after`,
/// 0 before; 2 when there is no run.
#[test]
fn stacks_of_the_newest_local_run_name_its_spinner() {
    let cache = Scratch::new("stacks-cache");
    let empty = Scratch::new("stacks-empty");
    let env = [("MONARCH_CACHE_DIR", cache.0.as_path())];
    let mut child = Command::new(CLI)
        .args(["run", SPIN, "--", "stacks", "2", "1", "600"])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start monarch-host run");
    let stdout = child.stdout.take().expect("its stdout");
    let _run = RunProcess(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("spinner 1 starts spinning") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the run's spinner starts");
    let stuck = stacks_command(&["--stuck-after", "0.1"], &env);
    assert_eq!(stuck.code, Some(1), "{stuck:?}");
    assert_text_names_the_spinner(&stuck);
    assert!(
        stuck
            .stdout
            .lines()
            .any(|l| l.starts_with("controller (pid ") && l.contains("in `run` for ")),
        "{stuck:?}"
    );
    let fine = stacks_command(&["--stuck-after", "600"], &env);
    assert_eq!(fine.code, Some(0), "{fine:?}");
    let none = stacks_command(&[], &[("MONARCH_CACHE_DIR", empty.0.as_path())]);
    assert_eq!(none.code, Some(2), "{none:?}");
    assert!(
        none.stderr.contains("no live `monarch-host run`"),
        "{none:?}"
    );
}
