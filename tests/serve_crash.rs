//! The server's store survives `kill -9` at any moment: a loop kills the
//! server while clients submit jobs and upload components, restarts it on
//! the same data directory, and checks after every restart:
//! - KS-1: the server starts (its SQLite store opens and is consistent);
//! - KS-2: every job the server accepted (answered with an id) is listed,
//!   with its arguments; what was running when the server died is marked
//!   `server restarted`, and what was queued runs after the restart and
//!   succeeds (unless a later kill comes while it runs): no accepted job
//!   is lost, and none fails for another reason;
//! - KS-3: every component it accepted can still run a job;
//! - KS-4: ids stay unique: no job accepted after a restart reuses an id.
//!
//! The kill comes at a moment drawn from a seed printed at the start
//! (`MONARCH_CRASH_SEED` replays it); `MONARCH_CRASH_ROUNDS` sets the
//! number of kills (default 12).

#[path = "support/serve.rs"]
mod serve_support;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus};
use monarch_host::serve::client::ApiClient;
use serve_support::{Scratch, ServeProcess};

fn job(component: &str, args: &[String]) -> JobRequest {
    JobRequest {
        component: component.to_string(),
        args: args.to_vec(),
        ..Default::default()
    }
}

/// Submits jobs until the server stops answering; the accepted ones.
async fn submit_until_gone(client: ApiClient, component: String, round: u64) -> Vec<(u64, String)> {
    let mut accepted = Vec::new();
    for n in 0.. {
        let tag = format!("r{round}n{n}");
        let args = vec!["echo".to_string(), "1".to_string(), tag.clone()];
        match client.submit(&job(&component, &args)).await {
            Ok(id) => accepted.push((id, tag)),
            Err(_) => break,
        }
    }
    accepted
}

/// Waits for job `id` to end, within `within`; its status and error.
async fn ended(client: &ApiClient, id: u64, within: Duration) -> (JobStatus, Option<String>) {
    let until = Instant::now() + within;
    loop {
        let job = client.job(id).await.expect("the job");
        if job.status.is_final() {
            return (job.status, job.error);
        }
        assert!(
            Instant::now() < until,
            "job {id} did not end within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_survives_kill_9_while_jobs_are_submitted() {
    let rounds: u64 = std::env::var("MONARCH_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let mut seed: u64 = std::env::var("MONARCH_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("kill -9 loop: {rounds} rounds, seed {seed} (MONARCH_CRASH_SEED replays it)");
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let dir = Scratch::new("crash");
    let mut server = ServeProcess::start(&dir.0, &["--rate-limit", "100000"]);
    let semantics = std::fs::read(env!("GUEST_SEMANTICS")).unwrap();
    let component = server.client().upload(semantics).await.expect("upload").id;
    let accepted: Arc<Mutex<BTreeMap<u64, String>>> = Arc::default();
    let mut uploads = vec![component.clone()];
    // Jobs found unfinished right after a restart: queued at the kill,
    // and queued again (a job running at the kill is failed before the
    // server listens).
    let mut requeued = 0;
    let mut requeued_last = Vec::new();

    for round in 0..rounds {
        let client = server.client();
        let submitter = tokio::spawn(submit_until_gone(client.clone(), component.clone(), round));
        // An upload of fresh bytes in flight too, now and then: a custom
        // section makes each one a new component.
        let uploader = {
            let client = client.clone();
            let mut bytes = std::fs::read(env!("GUEST_SEMANTICS")).unwrap();
            let name = format!("crash-round-{round}");
            bytes.push(0); // custom section id
            bytes.push((name.len() + 1) as u8);
            bytes.push(name.len() as u8);
            bytes.extend_from_slice(name.as_bytes());
            tokio::spawn(async move { client.upload(bytes).await.ok().map(|u| u.id) })
        };
        tokio::time::sleep(Duration::from_millis(100 + next(1900))).await;
        server.kill();
        let mine = submitter.await.expect("the submitter");
        if let Ok(Some(id)) = uploader.await {
            uploads.push(id);
        }
        {
            let mut all = accepted.lock().unwrap();
            for (id, tag) in mine {
                assert!(
                    all.insert(id, tag.clone()).is_none(),
                    "job id {id} was given twice (KS-4)"
                );
            }
        }
        // KS-1: the server starts again on the same data.
        server = ServeProcess::start(&dir.0, &["--rate-limit", "100000"]);
        let client = server.client();
        // KS-2: every accepted job is there, with its arguments, and
        // nothing is left running from before the kill.
        let listed = client.jobs(100_000).await.expect("the job list");
        let by_id: BTreeMap<u64, _> = listed.iter().map(|j| (j.id, j)).collect();
        for (id, tag) in accepted.lock().unwrap().iter() {
            let Some(job) = by_id.get(id) else {
                panic!(
                    "job {id} ({tag}) was accepted, then lost by a kill -9 (KS-2); the server log:\n{}",
                    server.log_text()
                )
            };
            assert!(
                job.args.iter().any(|a| a == tag),
                "job {id} lost its arguments: {:?}",
                job.args
            );
        }
        requeued_last = listed
            .iter()
            .filter(|j| !j.status.is_final())
            .map(|j| j.id)
            .collect();
        requeued += requeued_last.len();
    }
    // What was running when a kill came ended, one way or another.
    let client = server.client();
    let all: Vec<u64> = accepted.lock().unwrap().keys().copied().collect();
    assert!(!all.is_empty(), "no job was accepted between the kills");
    let mut statuses = BTreeMap::<String, usize>::new();
    for id in &all {
        let (status, error) = ended(&client, *id, Duration::from_secs(120)).await;
        // KS-2: a job fails only by being run at a kill.
        assert!(
            status == JobStatus::Succeeded
                || (status == JobStatus::Failed
                    && error
                        .as_deref()
                        .is_some_and(|e| e.starts_with("server restarted"))),
            "job {id} ended {status:?} ({error:?}); the server log:\n{}",
            server.log_text()
        );
        *statuses.entry(format!("{status:?}")).or_default() += 1;
    }
    // The jobs queued at the last kill ran after it, with no kill since.
    for id in &requeued_last {
        let (status, error) = ended(&client, *id, Duration::from_secs(120)).await;
        assert_eq!(
            status,
            JobStatus::Succeeded,
            "job {id}, queued at the last kill: {error:?}"
        );
    }
    // KS-3: every accepted component still runs a job.
    let distinct: HashSet<String> = uploads.into_iter().collect();
    for component in &distinct {
        let id = client
            .submit(&job(component, &["echo".into(), "1".into()]))
            .await
            .unwrap_or_else(|e| panic!("component {component} is gone after the kills: {e}"));
        assert_eq!(
            ended(&client, id, Duration::from_secs(120)).await.0,
            JobStatus::Succeeded,
            "a job of component {component}"
        );
    }
    println!(
        "kill -9 summary: {rounds} kills, {} jobs accepted and all kept ({statuses:?}), {requeued} requeued at restarts (queued at a kill), {} components kept",
        all.len(),
        distinct.len()
    );
}
