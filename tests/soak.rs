//! Soak: jobs and console sessions through `monarch-host serve`, with
//! faults, for a set time, watching the server for leaks.
//!
//! Four clients loop at once:
//! - jobs that succeed (`semantics echo 2`);
//! - jobs cancelled while their actors sleep (`semantics sleep-forever 2`);
//! - jobs whose procs are killed by the job itself (`semantics info-kill`)
//!   and, now and then, a proc of a running job killed with SIGKILL from
//!   outside;
//! - console sessions opened, fed a few lines and closed (`session-echo`).
//!
//! Every 2 s it samples the server's resident memory, open file
//! descriptors and descendant processes, and prints the series. It fails
//! when a job or session does not end, when processes or descriptors are
//! left behind once the load stops (SK-1), or when memory grows from the
//! middle of the run to its end by more than a quarter and 24 MiB (SK-2):
//! a leak grows with the work done, a warm-up does not.
//!
//! The run lasts `MONARCH_SOAK_SECS` (default 120, the CI form);
//! `scripts/soak MINUTES` runs it longer.

#[path = "support/serve.rs"]
mod serve_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus, SessionRequest};
use monarch_host::serve::client::ApiClient;
use serve_support::{Scratch, ServeProcess};

/// What the server holds at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_s: u64,
    rss_kib: u64,
    fds: usize,
    processes: usize,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The processes below `pid` (children, grandchildren...), alive or zombie.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = std::collections::HashMap::<u32, Vec<u32>>::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.entry(ppid).or_default().push(child);
            }
        }
    }
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for &c in parents.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            found.push(c);
            todo.push(c);
        }
    }
    found
}

fn sample(pid: u32, started: Instant) -> Sample {
    Sample {
        at_s: started.elapsed().as_secs(),
        rss_kib: rss_kib(pid),
        fds: fds(pid),
        processes: descendants(pid).len(),
    }
}

fn job(component: &str, args: &[&str]) -> JobRequest {
    JobRequest {
        component: component.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

/// Waits for job `id` to end, within `within`; its status and error.
async fn finished(client: &ApiClient, id: u64, within: Duration) -> (JobStatus, String) {
    let job = serve_support::finished(client, id, within).await;
    (job.status, job.error.unwrap_or_default())
}

#[derive(Default)]
struct Counts {
    succeeded: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    sessions: AtomicU64,
    outside_kills: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stays_flat_under_jobs_sessions_and_faults() {
    let secs: u64 = std::env::var("MONARCH_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let dir = Scratch::new("soak");
    // Four clients polling their jobs as fast as they can: more requests
    // than any fixed rate limit allows once the build is optimized (they
    // passed 2,000 a second in a release build), and limits are not what
    // this test is about. 0: no limit.
    let server = ServeProcess::start(&dir.0, &["--rate-limit", "0"]);
    let pid = server.pid().expect("the server's pid");
    let client = Arc::new(server.client());
    let semantics = client
        .upload(std::fs::read(env!("GUEST_SEMANTICS")).unwrap())
        .await
        .expect("upload semantics")
        .id;
    let session_echo = client
        .upload(std::fs::read(env!("GUEST_SESSION_ECHO")).unwrap())
        .await
        .expect("upload session-echo")
        .id;
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let limit = Duration::from_secs(60);
    let mut tasks = tokio::task::JoinSet::new();

    // Jobs that succeed.
    {
        let (client, stop, counts, component) = (
            client.clone(),
            stop.clone(),
            counts.clone(),
            semantics.clone(),
        );
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let id = client
                    .submit(&job(&component, &["echo", "2"]))
                    .await
                    .expect("submit");
                // It succeeds, unless a kill from outside (below) hit it.
                match finished(&client, id, limit).await {
                    (JobStatus::Succeeded, _) => counts.succeeded.fetch_add(1, Ordering::Relaxed),
                    (_, error) if error.contains("SIGKILL") => {
                        counts.failed.fetch_add(1, Ordering::Relaxed)
                    }
                    (status, error) => panic!("echo job {id}: {status:?}: {error}"),
                };
            }
        });
    }
    // Jobs cancelled while their actors sleep.
    {
        let (client, stop, counts, component) = (
            client.clone(),
            stop.clone(),
            counts.clone(),
            semantics.clone(),
        );
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let id = client
                    .submit(&job(&component, &["sleep-forever", "2"]))
                    .await
                    .expect("submit");
                tokio::time::sleep(Duration::from_millis(400)).await;
                // A kill from outside (below) may have ended it first.
                if let Err(e) = client.cancel(id).await {
                    assert!(e.contains("already finished"), "cancel job {id}: {e}");
                }
                finished(&client, id, limit).await;
                counts.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    // Jobs that kill their own procs, and kills from outside.
    {
        let (client, stop, counts, component) = (
            client.clone(),
            stop.clone(),
            counts.clone(),
            semantics.clone(),
        );
        tasks.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let args: &[&str] = if n.is_multiple_of(2) {
                    &["info-kill"]
                } else {
                    &["sleep-call", "2", "3000"]
                };
                let id = client.submit(&job(&component, args)).await.expect("submit");
                if !n.is_multiple_of(2) {
                    // A proc of this job, killed from outside mid-call.
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    let procs: Vec<u32> = descendants(pid)
                        .into_iter()
                        .filter(|p| {
                            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                                .is_ok_and(|c| c.contains("bootstrap"))
                        })
                        .collect();
                    if let Some(&victim) = procs.last() {
                        // SAFETY: kill(2) on a pid read from /proc just now.
                        unsafe { libc::kill(victim as i32, libc::SIGKILL) };
                        counts.outside_kills.fetch_add(1, Ordering::Relaxed);
                    }
                }
                match finished(&client, id, limit).await.0 {
                    JobStatus::Succeeded => counts.succeeded.fetch_add(1, Ordering::Relaxed),
                    _ => counts.failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    // Console sessions.
    {
        let (client, stop, counts, component) = (
            client.clone(),
            stop.clone(),
            counts.clone(),
            session_echo.clone(),
        );
        tasks.spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let name = format!("soak{n}");
                client
                    .open_session(&SessionRequest {
                        name: Some(name.clone()),
                        component: Some(component.clone()),
                        args: vec!["x".into()],
                        ..Default::default()
                    })
                    .await
                    .expect("open a session");
                for _ in 0..5 {
                    client.input(&name, "args").await.expect("an input");
                }
                client
                    .close_session(&name)
                    .await
                    .expect("close the session");
                counts.sessions.fetch_add(1, Ordering::Relaxed);
            }
        });
    }

    let mut samples = vec![sample(pid, started)];
    let first_fds = samples[0].fds;
    while started.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(done) = tasks.try_join_next() {
            done.expect("a soak client failed");
            panic!("a soak client ended early");
        }
        samples.push(sample(pid, started));
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = tokio::time::timeout(Duration::from_secs(120), tasks.join_next())
        .await
        .expect("the soak clients end within 2 minutes of the stop")
    {
        done.expect("a soak client failed");
    }
    // Once idle, what the server holds settles (SK-1): its procs exit, and
    // the connections to them close as their ends are noticed.
    let quiet = Instant::now() + Duration::from_secs(20);
    let mut last = sample(pid, started);
    while (last.processes > 0 || last.fds > first_fds + 8) && Instant::now() < quiet {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = sample(pid, started);
    }
    samples.push(last);

    println!("soak series: t(s) rss(MiB) fds processes");
    for s in &samples {
        println!(
            "  {:>5} {:>8.1} {:>5} {:>4}",
            s.at_s,
            s.rss_kib as f64 / 1024.0,
            s.fds,
            s.processes
        );
    }
    let mid = samples[samples.len() / 2];
    let peak_late = samples[samples.len() / 2..]
        .iter()
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(0);
    let first = samples[0];
    println!(
        "soak summary: {secs} s: {} jobs succeeded, {} cancelled, {} failed by faults ({} procs killed from outside), {} sessions; rss {:.1} MiB at start, {:.1} MiB mid-run, {:.1} MiB at most after, {:.1} MiB at the end; fds {} -> {}; processes left {}",
        counts.succeeded.load(Ordering::Relaxed),
        counts.cancelled.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.outside_kills.load(Ordering::Relaxed),
        counts.sessions.load(Ordering::Relaxed),
        first.rss_kib as f64 / 1024.0,
        mid.rss_kib as f64 / 1024.0,
        peak_late as f64 / 1024.0,
        last.rss_kib as f64 / 1024.0,
        first.fds,
        last.fds,
        last.processes,
    );
    assert!(
        counts.succeeded.load(Ordering::Relaxed) > 0 && counts.sessions.load(Ordering::Relaxed) > 0,
        "the load did not run"
    );
    assert_eq!(last.processes, 0, "processes left behind (SK-1)");
    assert!(
        last.fds <= first.fds + 8,
        "descriptors grew from {} to {} (SK-1)",
        first.fds,
        last.fds
    );
    let allowed = mid.rss_kib + (mid.rss_kib / 4).max(24 * 1024);
    assert!(
        peak_late <= allowed,
        "memory grew from {} KiB mid-run to {} KiB (SK-2)",
        mid.rss_kib,
        peak_late
    );
}
