//! The dashboard of `monarch-host serve`, as a user sees it: the real
//! server runs as a process with a persistent mesh `workers` of two procs,
//! this test uploads the `hello` example and runs it there as a job, then
//! headless Chromium opens the dashboard on that job and the test reads the
//! page it rendered (`--dump-dom`): the job's row and final status, its log
//! lines, and the mesh's procs. A console session (the Rust test guest
//! `session-echo`, opened over the API on `workers`) is listed `active`,
//! and once closed (`DELETE /v1/sessions/NAME`) `closed` with its reason,
//! its job selected from its row. Opened without a token, the page asks
//! for one and shows no jobs and no sessions.
//!
//! The test needs Chromium at `/usr/bin/chromium`; without it, it says so
//! and passes.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/serve.rs"]
mod serve_support;

use std::time::{Duration, Instant};

use browser::{
    attr, body_of, by_id, has_class, is_hidden, open_tags, strip_tags, tag_name, text_of,
};
use monarch_host::serve::api::{JobInfo, JobRequest, JobStatus, MeshChoice, SessionRequest};
use serve_support::{Scratch, ServeProcess, TOKEN};

/// How long a job may take to finish.
const JOB_DEADLINE: Duration = Duration::from_secs(60);
/// How long one request may go without a byte: a log stream that does not
/// end is reported, not waited on.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The console session the test opens.
const SESSION: &str = "dash-echo";

#[test]
fn dashboard_shows_a_job_its_logs_the_mesh_and_sessions() {
    if !browser::available() {
        return;
    }
    // Declared first so that it is dropped last, after the server.
    let scratch = Scratch::new("dashboard");
    let server = ServeProcess::start(&scratch.0, &["--mesh", "workers=2"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let client = server.client();

    // Upload `hello` and run it on the persistent mesh.
    let wasm = std::fs::read(env!("GUEST_HELLO")).expect("read the hello example");
    let component = rt.block_on(client.upload(wasm)).expect("upload").id;
    let job = JobRequest {
        component,
        args: vec!["2".into()],
        limits: None,
        mesh: Some(MeshChoice::Name("workers".into())),
        dirs: Vec::new(),
        env: Vec::new(),
        ..Default::default()
    };
    let id = rt.block_on(client.submit(&job)).expect("submit");
    let finished = wait_for_job(&rt, &server, id);
    assert_eq!(
        finished.status,
        JobStatus::Succeeded,
        "job {id}: {finished:?}\n{}",
        diagnostics(&rt, &server, id)
    );
    let addr = server.base.trim_start_matches("http://");

    // A console session on `workers`, with the Rust test guest: it is
    // active once `open_session` answers.
    let wasm = std::fs::read(env!("GUEST_SESSION_ECHO")).expect("read the session-echo guest");
    let echo = rt.block_on(client.upload(wasm)).expect("upload").id;
    let opened = rt
        .block_on(client.open_session(&SessionRequest {
            name: Some(SESSION.into()),
            component: Some(echo),
            mesh: Some("workers".into()),
            ..Default::default()
        }))
        .unwrap_or_else(|e| panic!("open a session: {e}\n{}", server.log_text()));
    assert_eq!(opened.state, "active", "{opened:?}");

    // The page, opened as a user would from a link that carries the token.
    let url = format!("http://{addr}/?token={TOKEN}#job={id}");
    let dom = browser::dump_dom(&url, &scratch.0.join("profile-token"));
    let context = || {
        format!(
            "the page showed:\n{}\n{}",
            body_of(&dom),
            diagnostics(&rt, &server, id)
        )
    };
    // No error banner and no token form.
    assert!(
        is_hidden(&dom, "error"),
        "an error banner is shown; {}",
        context()
    );
    assert!(
        is_hidden(&dom, "token-form"),
        "the token form is shown; {}",
        context()
    );
    // The job's row in #jobs, succeeded.
    let id_text = id.to_string();
    let row = open_tags(&dom).find(|tag| {
        tag_name(tag) == "tr"
            && has_class(tag, "job")
            && attr(tag, "data-id") == Some(id_text.as_str())
    });
    let row = row.unwrap_or_else(|| panic!("no row for job {id} in #jobs; {}", context()));
    assert_eq!(
        attr(row, "data-status"),
        Some("succeeded"),
        "row {row}; {}",
        context()
    );
    // The selected job: its final status, from the log stream's `end` event,
    // and its log lines, one per line.
    assert_eq!(
        text_of(&dom, "job-status").as_deref(),
        Some("succeeded"),
        "#job-status; {}",
        context()
    );
    let logs_state = by_id(&dom, "logs-state").and_then(|tag| attr(tag, "data-state"));
    assert_eq!(
        logs_state,
        Some("ended"),
        "the page did not read the log stream to its `end` event; {}",
        context()
    );
    assert_eq!(
        text_of(&dom, "logs-state").as_deref(),
        Some("end of log: job succeeded"),
        "#logs-state; {}",
        context()
    );
    let logs = text_of(&dom, "logs").unwrap_or_else(|| panic!("no #logs; {}", context()));
    for rank in 0..2 {
        let greeting = format!("rank {rank}: hello from rank {rank} of 2");
        assert!(
            logs.lines()
                .any(|line| line.starts_with("[controller] ") && line.ends_with(&greeting)),
            "#logs has no line `[controller] ... {greeting}`; {}",
            context()
        );
    }
    assert!(
        logs.lines()
            .any(|line| line.contains("2 greetings from a mesh shaped")),
        "#logs misses the greetings header; {}",
        context()
    );
    // The persistent mesh, two procs running.
    let workers = mesh_div(&dom, "workers")
        .unwrap_or_else(|| panic!("no .mesh[data-name=workers] in #meshes; {}", context()));
    let procs: Vec<&str> = open_tags(workers)
        .filter(|tag| has_class(tag, "rank") && has_class(tag, "proc"))
        .collect();
    assert_eq!(procs.len(), 2, "procs of workers: {procs:?}; {}", context());
    assert!(
        procs
            .iter()
            .all(|tag| attr(tag, "data-state") == Some("running")),
        "procs of workers: {procs:?}; {}",
        context()
    );
    assert!(
        workers.contains("persistent"),
        "workers is not shown as persistent: {workers}"
    );
    // The session, active, waiting for input, with a link to its job.
    let row = session_row(&dom, SESSION).unwrap_or_else(|| {
        panic!(
            "no tr.session[data-name={SESSION}] in #sessions; {}",
            context()
        )
    });
    let session_job = opened.job.to_string();
    assert_eq!(
        attr(row, "data-state"),
        Some("active"),
        "{row}; {}",
        context()
    );
    assert_eq!(attr(row, "data-job"), Some(session_job.as_str()), "{row}");
    assert_eq!(attr(row, "data-busy"), Some("false"), "{row}");
    let link = format!("href=\"#job={}\"", opened.job);
    assert!(row.contains(&link), "no job link in {row}");
    let text = strip_tags(row);
    for shown in ["active", "workers", "waiting", &opened.owner] {
        assert!(
            text.contains(shown),
            "the session's row `{text}` misses `{shown}`"
        );
    }

    // Closed over the API: the page lists it `closed`, with the reason;
    // opened on the session's job, its row is the selected one.
    let closed = rt
        .block_on(client.close_session(SESSION))
        .unwrap_or_else(|e| panic!("close the session: {e}\n{}", server.log_text()));
    assert_eq!(closed.state, "closed", "{closed:?}");
    let url = format!("http://{addr}/?token={TOKEN}#job={}", opened.job);
    let dom = browser::dump_dom(&url, &scratch.0.join("profile-closed"));
    let context = || format!("the page showed:\n{}\n{}", body_of(&dom), server.log_text());
    let row = session_row(&dom, SESSION).unwrap_or_else(|| {
        panic!(
            "no tr.session[data-name={SESSION}] in #sessions; {}",
            context()
        )
    });
    assert_eq!(
        attr(row, "data-state"),
        Some("closed"),
        "{row}; {}",
        context()
    );
    assert!(
        has_class(row, "selected"),
        "the session's row is not selected: {row}"
    );
    let text = strip_tags(row);
    assert!(text.contains("closed"), "the session's row: `{text}`");
    let reason = closed.reason.as_deref().expect("a closed session's reason");
    assert!(
        text.contains(reason),
        "the session's row `{text}` misses its reason `{reason}`"
    );
    assert_eq!(
        text_of(&dom, "job-id").as_deref(),
        Some(session_job.as_str()),
        "#job-id; {}",
        context()
    );
    assert_eq!(
        text_of(&dom, "job-session").as_deref(),
        Some(format!("{SESSION} (closed)").as_str()),
        "#job-session; {}",
        context()
    );

    // Without a token: the form that asks for one, and no jobs.
    let url = format!("http://{addr}/");
    let dom = browser::dump_dom(&url, &scratch.0.join("profile-no-token"));
    assert!(
        by_id(&dom, "token-form").is_some(),
        "GET / without a token did not serve the dashboard; the page showed:\n{}\n{}",
        body_of(&dom),
        server.log_text()
    );
    assert!(
        !is_hidden(&dom, "token-form"),
        "no token form without a token; the page showed:\n{}\n{}",
        body_of(&dom),
        server.log_text()
    );
    let rows = open_tags(&dom)
        .filter(|tag| tag_name(tag) == "tr" && has_class(tag, "job"))
        .count();
    assert_eq!(
        rows,
        0,
        "job rows without a token; the page showed:\n{}",
        body_of(&dom)
    );
    assert!(
        session_row(&dom, SESSION).is_none(),
        "a session row without a token; the page showed:\n{}",
        body_of(&dom)
    );
}

/// A log of the server and what the logs route of job `id` sends, for
/// failure messages: never panics, never waits past [`HTTP_TIMEOUT`].
fn diagnostics(rt: &tokio::runtime::Runtime, server: &ServeProcess, id: u64) -> String {
    let mut lines = Vec::new();
    let client = server.client();
    let followed = rt.block_on(tokio::time::timeout(
        HTTP_TIMEOUT,
        client.follow_logs(id, |line| lines.push(line.to_string())),
    ));
    let log = server.log_text();
    let tail = (log.len().saturating_sub(8000)..log.len())
        .find(|&i| log.is_char_boundary(i))
        .unwrap_or(log.len());
    format!(
        "the logs route sent {lines:#?} then {followed:?}\nserver log:\n{}",
        &log[tail..]
    )
}

/// Waits until job `id` has finished; returns it.
fn wait_for_job(rt: &tokio::runtime::Runtime, server: &ServeProcess, id: u64) -> JobInfo {
    let client = server.client();
    let started = Instant::now();
    loop {
        let job = rt.block_on(client.job(id)).expect("the job");
        if job.status.is_final() {
            return job;
        }
        assert!(
            started.elapsed() < JOB_DEADLINE,
            "job {id} did not finish within {JOB_DEADLINE:?}: {job:?}\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The markup of `<div class="mesh" data-name="NAME">`, up to the next
/// mesh or the end of the page.
fn mesh_div<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let is_mesh = |tag: &&str| tag_name(tag) == "div" && has_class(tag, "mesh");
    let tag = open_tags(dom).find(|tag| is_mesh(tag) && attr(tag, "data-name") == Some(name))?;
    let start = tag.as_ptr() as usize - dom.as_ptr() as usize;
    let rest = &dom[start + tag.len()..];
    let end = open_tags(rest)
        .find(is_mesh)
        .map(|next| next.as_ptr() as usize - rest.as_ptr() as usize)
        .unwrap_or(rest.len());
    Some(&dom[start..start + tag.len() + end])
}

/// The markup of `<tr class="session" data-name="NAME">` up to its `</tr>`.
fn session_row<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let tag = open_tags(dom).find(|tag| {
        tag_name(tag) == "tr" && has_class(tag, "session") && attr(tag, "data-name") == Some(name)
    })?;
    let start = tag.as_ptr() as usize - dom.as_ptr() as usize;
    let end = dom[start..]
        .find("</tr>")
        .map_or(dom.len(), |end| start + end);
    Some(&dom[start..end])
}
