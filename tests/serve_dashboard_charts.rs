//! The dashboard's observability views (issue 20), as a user sees them:
//! the real server runs as a process with a persistent mesh `workers` of
//! two procs; the test runs the `hello` example there (calls to its actor
//! mesh `greeters`) and the `counter` example on a fresh mesh (its counter
//! 2 panics in `crash`: a failed rank with a post-mortem record), waits
//! until the metrics sampler has a few samples, then opens the dashboard
//! in headless Chromium and reads the DOM it rendered (`--dump-dom`):
//!
//! - every job's row has a duration, the server's `duration_ms`;
//! - the timeline has a bar per job, coloured by its status;
//! - the counter job's actor meshes show rank 2 of `counters` failed
//!   (`data-state="failed"`, a ✕), its hover text naming the reason the
//!   server gave, the endpoint and a link to the post-mortem record;
//! - the CPU, memory and calls/s charts each drew points (`data-points`,
//!   one `circle.pt` each) with a legend naming the series;
//! - a log filter in the address (`&mesh=counters&rank=2`) leaves the
//!   lines of counter 2 only.
//!
//! It also saves screenshots into `target/test-artefacts/dashboard/`, for
//! a person to look at. The test needs Chromium at `/usr/bin/chromium`;
//! without it, it says so and passes.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/serve.rs"]
mod serve_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use monarch_host::serve::api::{JobRequest, JobStatus, MeshChoice};
use reqwest::Method;
use serde_json::Value;
use serve_support::{Scratch, ServeProcess, TOKEN, send};

use browser::{
    attr, body_of, by_id, element, has_class, is_hidden, open_tags, strip_tags, tag_name, text_of,
};

/// How long a job may take to finish.
const JOB_DEADLINE: Duration = Duration::from_secs(60);
/// How long the sampler may take to have what the charts need.
const SAMPLES_DEADLINE: Duration = Duration::from_secs(30);
/// The window of the screenshots.
const SHOT_SIZE: (u32, u32) = (1400, 1800);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_durations_a_timeline_failed_ranks_and_live_charts() {
    if !browser::available() {
        return;
    }
    // Declared first so that it is dropped last, after the server.
    let scratch = Scratch::new("dashboard-charts");
    let server = ServeProcess::start(&scratch.0, &["--mesh", "workers=2"]);
    let client = server.client();

    // `hello 2` on the persistent mesh: two calls to `greeters`.
    let hello = client
        .upload(std::fs::read(env!("GUEST_HELLO")).expect("read the hello example"))
        .await
        .expect("upload hello")
        .id;
    let hello = client
        .submit(&JobRequest {
            component: hello,
            args: vec!["2".into()],
            mesh: Some(MeshChoice::Name("workers".into())),
            ..Default::default()
        })
        .await
        .expect("submit hello");
    let hello_job = serve_support::finished(&client, hello, JOB_DEADLINE).await;
    assert_eq!(hello_job.status, JobStatus::Succeeded, "{hello_job:?}");

    // `counter` on a fresh mesh: counter 2 traps in `crash`, and the job
    // carries on and succeeds.
    let counter = client
        .upload(std::fs::read(env!("GUEST_COUNTER")).expect("read the counter example"))
        .await
        .expect("upload counter")
        .id;
    let counter = client
        .submit(&JobRequest {
            component: counter,
            ..Default::default()
        })
        .await
        .expect("submit counter");
    let counter_job = serve_support::finished(&client, counter, JOB_DEADLINE).await;
    assert_eq!(counter_job.status, JobStatus::Succeeded, "{counter_job:?}");

    // What the server says, that the page must show.
    let hello_info = client.job(hello).await.expect("the hello job");
    let counter_info = client.job(counter).await.expect("the counter job");
    let failed = failed_rank(&server, counter).await;
    wait_for_samples(&server, hello).await;

    let addr = server.base.trim_start_matches("http://");
    let url = format!("http://{addr}/?token={TOKEN}#job={counter}");
    let dom = browser::dump_dom(&url, &scratch.0.join("profile-charts"));
    let context = || format!("the page showed:\n{}", shown(&dom));
    assert!(
        is_hidden(&dom, "error"),
        "an error banner is shown: {:?}; {}",
        text_of(&dom, "error-text"),
        context()
    );

    // A duration in each job's row: the server's `duration_ms`.
    for info in [&hello_info, &counter_info] {
        let row = job_row(&dom, info.id)
            .unwrap_or_else(|| panic!("no row for job {} in #jobs; {}", info.id, context()));
        let cell = open_tags(row)
            .find(|tag| tag_name(tag) == "td" && has_class(tag, "duration"))
            .unwrap_or_else(|| panic!("no td.duration in the row of job {}: {row}", info.id));
        let expected = info
            .duration_ms
            .unwrap_or_else(|| panic!("job {} has no duration_ms: {info:?}", info.id));
        assert_eq!(
            attr(cell, "data-ms"),
            Some(expected.to_string().as_str()),
            "job {}'s duration cell {cell} in {row}",
            info.id
        );
        let text = strip_tags(element(row, cell));
        assert!(
            text.chars().any(|c| c.is_ascii_digit()),
            "job {}'s duration cell shows `{text}`",
            info.id
        );
    }

    // The timeline: one bar per job, with its status.
    let timeline = by_id(&dom, "timeline")
        .map(|tag| element(&dom, tag))
        .unwrap_or_else(|| panic!("no #timeline; {}", context()));
    let bars: Vec<&str> = open_tags(timeline)
        .filter(|tag| tag_name(tag) == "rect" && has_class(tag, "bar"))
        .collect();
    assert_eq!(
        bars.len(),
        2,
        "the timeline's bars: {bars:?}; {}",
        context()
    );
    for id in [hello, counter] {
        let id = id.to_string();
        let bar = bars
            .iter()
            .find(|bar| attr(bar, "data-id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no bar for job {id} in the timeline: {timeline}"));
        assert_eq!(attr(bar, "data-status"), Some("succeeded"), "{bar}");
        let hover = strip_tags(element(timeline, bar));
        assert!(
            hover.contains(&format!("job {id}: succeeded")),
            "the bar's hover text `{hover}`"
        );
    }

    // The counter job's actor meshes: rank 2 of `counters` failed, its hover
    // text says why, where, and links the post-mortem record.
    let actors = by_id(&dom, "job-actors")
        .map(|tag| element(&dom, tag))
        .unwrap_or_else(|| panic!("no #job-actors; {}", context()));
    let boxes: Vec<&str> = open_tags(actors)
        .filter(|tag| has_class(tag, "rank") && attr(tag, "data-mesh") == Some("counters"))
        .collect();
    assert_eq!(
        boxes.len(),
        3,
        "the ranks of counters: {boxes:?}; {}",
        context()
    );
    let failed_box = boxes
        .iter()
        .find(|tag| attr(tag, "data-state") == Some("failed"))
        .unwrap_or_else(|| panic!("no failed rank among {boxes:?}; {}", context()));
    assert_eq!(attr(failed_box, "data-rank"), Some("2"), "{failed_box}");
    let markup = element(actors, failed_box);
    let hover = strip_tags(markup);
    assert!(hover.contains('✕'), "the failed rank has no ✕: {markup}");
    for shown in [
        format!("reason: {}", failed.reason),
        "endpoint: crash".to_string(),
        "post-mortem".to_string(),
    ] {
        assert!(
            hover.contains(&shown),
            "the failed rank's hover text `{hover}` misses `{shown}`"
        );
    }
    let link = open_tags(markup)
        .find(|tag| tag_name(tag) == "a")
        .unwrap_or_else(|| panic!("no link in the failed rank's hover text: {markup}"));
    assert_eq!(attr(link, "href"), Some(failed.dump.as_str()), "{markup}");

    // The charts: points drawn, one circle each, and a legend.
    for (chart, series) in [
        (
            "chart-cpu",
            vec!["workers[0]".to_string(), "workers[1]".to_string()],
        ),
        (
            "chart-memory",
            vec!["workers[0]".to_string(), "workers[1]".to_string()],
        ),
        ("chart-calls", vec![format!("j{hello} greeters")]),
    ] {
        let figure = by_id(&dom, chart)
            .map(|tag| element(&dom, tag))
            .unwrap_or_else(|| panic!("no #{chart}; {}", context()));
        let svg = open_tags(figure)
            .find(|tag| tag_name(tag) == "svg")
            .unwrap_or_else(|| panic!("no svg in #{chart}: {figure}"));
        let points: usize = attr(svg, "data-points")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("#{chart}'s svg has no data-points: {svg}"));
        assert!(
            points > 0,
            "#{chart} drew no points: {}",
            strip_tags(figure)
        );
        let circles = open_tags(figure)
            .filter(|tag| tag_name(tag) == "circle" && has_class(tag, "pt"))
            .count();
        assert_eq!(circles, points, "#{chart}: data-points={points}");
        let lines = open_tags(figure)
            .filter(|tag| matches!(tag_name(tag), "path" | "polyline") && has_class(tag, "line"))
            .count();
        assert!(lines >= series.len(), "#{chart} has {lines} lines");
        let legend = open_tags(figure)
            .find(|tag| has_class(tag, "series-legend"))
            .map(|tag| strip_tags(element(figure, tag)))
            .unwrap_or_default();
        for name in &series {
            assert!(
                legend.contains(name.as_str()),
                "#{chart}'s legend `{legend}` misses `{name}`"
            );
        }
    }

    // A log filter from the address: counter 2's lines only.
    let url = format!("http://{addr}/?token={TOKEN}#job={counter}&mesh=counters&rank=2");
    let filtered = browser::dump_dom(&url, &scratch.0.join("profile-filter"));
    let logs = text_of(&filtered, "logs")
        .unwrap_or_else(|| panic!("no #logs; the page showed:\n{}", shown(&filtered)));
    let lines: Vec<&str> = logs.lines().collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|line| line.starts_with("[counters[2]] ")),
        "#logs filtered to counters rank 2: {lines:#?}"
    );
    assert!(
        lines.iter().any(|line| line.contains("was asked to crash")),
        "#logs misses counter 2's panic: {lines:#?}"
    );
    let count = text_of(&filtered, "log-count").unwrap_or_default();
    assert!(
        count.starts_with(&format!("{} of ", lines.len())),
        "#log-count says `{count}`"
    );

    // Screenshots, for a person to look at.
    let dir = artefacts();
    std::fs::create_dir_all(&dir).expect("the screenshots' directory");
    for (name, fragment) in [
        ("failed-rank", format!("job={counter}")),
        ("hello", format!("job={hello}")),
        ("log-filter", format!("job={counter}&mesh=counters&rank=2")),
    ] {
        let file = dir.join(format!("{name}.png"));
        let url = format!("http://{addr}/?token={TOKEN}#{fragment}");
        browser::screenshot(
            &url,
            &scratch.0.join(format!("profile-shot-{name}")),
            &file,
            SHOT_SIZE.0,
            SHOT_SIZE.1,
        );
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        assert!(size > 0, "{} is empty", file.display());
    }
}

/// Rank 2 of `counters` in job `id`, failed, as `GET /v1/jobs/{id}/actors`
/// has it.
struct FailedRank {
    reason: String,
    dump: String,
}

async fn failed_rank(server: &ServeProcess, id: u64) -> FailedRank {
    let (status, body) = send(server.request(Method::GET, &format!("/v1/jobs/{id}/actors"))).await;
    assert_eq!(status, 200, "GET /v1/jobs/{id}/actors: {body}");
    let rank = body
        .as_array()
        .into_iter()
        .flatten()
        .filter(|mesh| mesh["mesh"] == "counters")
        .flat_map(|mesh| mesh["ranks"].as_array().into_iter().flatten())
        .find(|rank| rank["rank"] == 2)
        .unwrap_or_else(|| panic!("no rank 2 of counters in {body:#}"));
    assert_eq!(rank["state"], "failed", "{body:#}");
    assert_eq!(rank["endpoint"], "crash", "{body:#}");
    FailedRank {
        reason: rank["reason"]
            .as_str()
            .unwrap_or_else(|| panic!("no reason: {rank:#}"))
            .to_string(),
        dump: rank["dump"]
            .as_str()
            .unwrap_or_else(|| panic!("no dump: {rank:#}"))
            .to_string(),
    }
}

/// Waits until the series route has what the charts need: the CPU of both
/// procs of `workers` (two samples each: the first has no CPU) and the
/// calls of job `hello` to `greeters`.
async fn wait_for_samples(server: &ServeProcess, hello: u64) {
    let started = Instant::now();
    loop {
        let (status, body) = send(server.request(Method::GET, "/v1/metrics/series")).await;
        if status == 200 && charts_have_data(&body, hello) {
            return;
        }
        assert!(
            started.elapsed() < SAMPLES_DEADLINE,
            "the metrics series lack the procs of workers or the calls to greeters after \
             {SAMPLES_DEADLINE:?}: {status} {body:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn charts_have_data(series: &Value, hello: u64) -> bool {
    let procs = series["procs"].as_array().into_iter().flatten();
    let busy = procs
        .filter(|p| p["mesh"] == "workers")
        .filter(|p| {
            p["points"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|point| point["cpu_pct"].is_number())
        })
        .count();
    let greeters = series["meshes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["job"] == hello && m["mesh"] == "greeters");
    busy == 2 && greeters
}

/// The row of job `id` in #jobs, up to its `</tr>`.
fn job_row(dom: &str, id: u64) -> Option<&str> {
    let id = id.to_string();
    let tag = open_tags(dom).find(|tag| {
        tag_name(tag) == "tr" && has_class(tag, "job") && attr(tag, "data-id") == Some(id.as_str())
    })?;
    Some(element(dom, tag))
}

/// The page's body for a failure message, without the charts' points.
fn shown(dom: &str) -> String {
    let body = body_of(dom);
    let mut text = String::new();
    let mut rest = body;
    while let Some(start) = rest.find("<circle") {
        text.push_str(&rest[..start]);
        rest = rest[start..]
            .find("</circle>")
            .map_or("", |end| &rest[start + end + "</circle>".len()..]);
    }
    text.push_str(rest);
    text
}

/// Where screenshots go: `test-artefacts/dashboard` in the target directory.
fn artefacts() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map_or_else(|| root.join("target"), |dir| root.join(dir));
    target.join("test-artefacts").join("dashboard")
}
