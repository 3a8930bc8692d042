//! Where the traces of casts go, and how `monarch-host trace` shows them.
//!
//! `run --trace-file F` writes each traced cast as one line of OTLP JSON
//! (an `ExportTraceServiceRequest`, the OTLP/HTTP JSON encoding: hex ids,
//! times as decimal strings); `run --otlp URL` sends the same spans to an
//! OpenTelemetry collector over OTLP/HTTP with `opentelemetry-otlp`.
//! Either installs the process's trace sink ([`hyperactor_mesh::trace`]),
//! which turns tracing on for the controller's casts; without them casts
//! carry no trace context at all (TR-1).
//!
//! Spans are handed to a thread of their own, so the caster never waits on
//! a file or the network. [`TraceOutput::finish`] flushes what is left when
//! the run ends, within a timeout.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use hyperactor_mesh::trace::SpanRecord;

/// The service name spans are exported under.
pub const SERVICE_NAME: &str = "monarch-host";

/// How many spans the OTLP exporter sends at once, at most.
const OTLP_BATCH: usize = 2048;
/// How long spans may wait for a batch to fill before they are sent.
const OTLP_LINGER: Duration = Duration::from_millis(500);
/// How long one export to a collector may take.
const OTLP_TIMEOUT: Duration = Duration::from_secs(10);

enum Msg {
    Spans(Vec<SpanRecord>),
    Finish(mpsc::Sender<Report>),
}

/// What the trace thread did, as [`TraceOutput::finish`] reports it.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Casts traced.
    pub traces: u64,
    /// Spans written or exported.
    pub spans: u64,
    /// Spans that could not be written or exported.
    pub dropped: u64,
    /// The first error, if any.
    pub error: Option<String>,
}

/// The trace outputs of a run; see the module docs.
pub struct TraceOutput {
    tx: mpsc::Sender<Msg>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TraceOutput {
    /// Opens the outputs and installs this process's trace sink. `otlp` is
    /// a collector's base URL (`http://HOST:4318`) or its traces URL
    /// (`.../v1/traces`).
    pub fn start(otlp: Option<&str>, file: Option<&Path>) -> Result<TraceOutput, String> {
        let writer = match file {
            Some(path) => Some(std::io::BufWriter::new(
                std::fs::File::create(path)
                    .map_err(|e| format!("cannot write the trace file {}: {e}", path.display()))?,
            )),
            None => None,
        };
        let exporter = match otlp {
            Some(url) => Some(otlp_exporter(url)?),
            None => None,
        };
        let (tx, rx) = mpsc::channel::<Msg>();
        let thread = std::thread::Builder::new()
            .name("monarch-traces".into())
            .spawn(move || trace_thread(rx, writer, exporter))
            .map_err(|e| format!("cannot start the trace thread: {e}"))?;
        let sink_tx = std::sync::Mutex::new(tx.clone());
        let installed = hyperactor_mesh::trace::install_sink(Box::new(move |spans| {
            let tx = sink_tx.lock().unwrap_or_else(|p| p.into_inner());
            let _ = tx.send(Msg::Spans(spans));
        }));
        if !installed {
            return Err("a trace output is installed already in this process".into());
        }
        Ok(TraceOutput {
            tx,
            thread: Some(thread),
        })
    }

    /// Writes and sends what is left, waiting at most `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Report {
        let (reply_tx, reply_rx) = mpsc::channel();
        if self.tx.send(Msg::Finish(reply_tx)).is_err() {
            return Report {
                error: Some("the trace thread ended early".into()),
                ..Report::default()
            };
        }
        let report = reply_rx.recv_timeout(timeout).unwrap_or_else(|_| Report {
            error: Some(format!(
                "traces not flushed within {} s; some may be lost",
                timeout.as_secs()
            )),
            ..Report::default()
        });
        if report.error.is_none()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
        report
    }
}

fn trace_thread(
    rx: mpsc::Receiver<Msg>,
    mut writer: Option<std::io::BufWriter<std::fs::File>>,
    exporter: Option<Otlp>,
) {
    let mut report = Report::default();
    let mut pending: Vec<SpanRecord> = Vec::new();
    let mut oldest: Option<Instant> = None;
    let fail = |report: &mut Report, n: usize, e: String| {
        report.dropped += n as u64;
        if report.error.is_none() {
            tracing::warn!("traces: {e}");
            report.error = Some(e);
        }
    };
    loop {
        let wait = oldest.map_or(Duration::from_secs(3600), |at| {
            OTLP_LINGER.saturating_sub(at.elapsed())
        });
        let msg = rx.recv_timeout(wait);
        let finish = match msg {
            Ok(Msg::Spans(spans)) => {
                report.traces += 1;
                if let Some(w) = &mut writer {
                    let line = otlp_json(&spans).to_string();
                    match writeln!(w, "{line}").and_then(|()| w.flush()) {
                        Ok(()) => report.spans += spans.len() as u64,
                        Err(e) => fail(&mut report, spans.len(), format!("cannot write: {e}")),
                    }
                }
                if exporter.is_some() {
                    oldest.get_or_insert_with(Instant::now);
                    pending.extend(spans);
                }
                None
            }
            Ok(Msg::Finish(reply)) => Some(reply),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        let due = oldest.is_some_and(|at| at.elapsed() >= OTLP_LINGER);
        if let Some(otlp) = &exporter
            && !pending.is_empty()
            && (due || finish.is_some() || pending.len() >= OTLP_BATCH)
        {
            for batch in pending.chunks(OTLP_BATCH) {
                match otlp.export(batch) {
                    Ok(()) => {
                        if writer.is_none() {
                            report.spans += batch.len() as u64;
                        }
                    }
                    Err(e) => fail(&mut report, batch.len(), e),
                }
            }
            pending.clear();
            oldest = None;
        }
        if let Some(reply) = finish {
            let _ = reply.send(report.clone());
            return;
        }
    }
}

/// A sink that appends each traced call to the file at `path` as one
/// OTLP JSON line (a server job's traces, `serve --trace`), opening it
/// (and its directory) at the first call. A line is written whole by one
/// `write`, so a reader never sees half a call.
pub fn append_sink(path: PathBuf) -> hyperactor_mesh::cast::TraceSink {
    let file = std::sync::Mutex::new(None::<std::fs::File>);
    std::sync::Arc::new(move |spans| {
        let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            let opened = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                });
            match opened {
                Ok(f) => *file = Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot write a job's traces");
                    return;
                }
            }
        }
        let line = format!("{}\n", otlp_json(&spans));
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(line.as_bytes())
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write a job's traces");
        }
    })
}

/// An OTLP/HTTP JSON exporter and the runtime its client runs on.
struct Otlp {
    exporter: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Runtime,
}

impl Otlp {
    fn export(&self, spans: &[SpanRecord]) -> Result<(), String> {
        use opentelemetry_sdk::trace::SpanExporter as _;
        let batch = spans.iter().map(span_data).collect();
        self.runtime
            .block_on(self.exporter.export(batch))
            .map_err(|e| format!("cannot export to the OTLP collector: {e}"))
    }
}

/// The traces URL of a collector given as its base URL or traces URL.
pub fn otlp_traces_url(url: &str) -> Result<String, String> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| format!("--otlp {url}: not a URL ({e}); give e.g. http://HOST:4318"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("--otlp {url}: give an http:// or https:// URL"));
    }
    if parsed.path().trim_end_matches('/').is_empty() {
        Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
    } else {
        Ok(url.to_string())
    }
}

fn otlp_exporter(url: &str) -> Result<Otlp, String> {
    use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
    use opentelemetry_sdk::trace::SpanExporter as _;
    let endpoint = otlp_traces_url(url)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the OTLP exporter's runtime: {e}"))?;
    let client = HttpClient(
        reqwest::Client::builder()
            .timeout(OTLP_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot make the OTLP client: {e}"))?,
    );
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(endpoint)
        .with_timeout(OTLP_TIMEOUT)
        .build()
        .map_err(|e| format!("--otlp {url}: {e}"))?;
    exporter.set_resource(
        &opentelemetry_sdk::Resource::builder()
            .with_service_name(SERVICE_NAME)
            .build(),
    );
    Ok(Otlp { exporter, runtime })
}

/// The HTTP client of the OTLP exporter: the reqwest this binary already
/// uses for its server API.
#[derive(Debug)]
struct HttpClient(reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for HttpClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let (parts, body) = request.into_parts();
        let mut out = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body.to_vec());
        for (name, value) in &parts.headers {
            out = out.header(name, value);
        }
        let response = out.send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        Ok(opentelemetry_http::Response::builder()
            .status(status)
            .body(bytes)?)
    }
}

fn span_data(span: &SpanRecord) -> opentelemetry_sdk::trace::SpanData {
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    let at = |ns: u64| UNIX_EPOCH + Duration::from_nanos(ns);
    opentelemetry_sdk::trace::SpanData {
        span_context: SpanContext::new(
            TraceId::from(span.trace),
            SpanId::from(span.span),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::from(span.parent),
        parent_span_is_remote: span.parent != 0,
        span_kind: match span.parent {
            0 => SpanKind::Client,
            _ => SpanKind::Internal,
        },
        name: span.name.clone().into(),
        start_time: at(span.start_ns),
        end_time: at(span.end_ns),
        attributes: span
            .attrs
            .iter()
            .map(|(k, v)| opentelemetry::KeyValue::new(k.clone(), v.clone()))
            .collect(),
        dropped_attributes_count: 0,
        events: Default::default(),
        links: Default::default(),
        status: match span.error {
            true => Status::error("failed"),
            false => Status::Unset,
        },
        instrumentation_scope: opentelemetry::InstrumentationScope::builder(SERVICE_NAME).build(),
    }
}

/// Spans as one OTLP/HTTP JSON `ExportTraceServiceRequest`.
pub fn otlp_json(spans: &[SpanRecord]) -> serde_json::Value {
    let spans: Vec<serde_json::Value> = spans
        .iter()
        .map(|s| {
            let mut span = serde_json::json!({
                "traceId": format!("{:032x}", s.trace),
                "spanId": format!("{:016x}", s.span),
                "name": s.name,
                "kind": if s.parent == 0 { 3 } else { 1 },
                "startTimeUnixNano": s.start_ns.to_string(),
                "endTimeUnixNano": s.end_ns.to_string(),
                "attributes": s.attrs.iter().map(|(k, v)| serde_json::json!({
                    "key": k, "value": {"stringValue": v}
                })).collect::<Vec<_>>(),
                "status": if s.error { serde_json::json!({"code": 2}) } else { serde_json::json!({}) },
            });
            if s.parent != 0 {
                span["parentSpanId"] = format!("{:016x}", s.parent).into();
            }
            span
        })
        .collect();
    serde_json::json!({
        "resourceSpans": [{
            "resource": {"attributes": [
                {"key": "service.name", "value": {"stringValue": SERVICE_NAME}}
            ]},
            "scopeSpans": [{"scope": {"name": SERVICE_NAME}, "spans": spans}]
        }]
    })
}

/// The spans of an OTLP JSON `ExportTraceServiceRequest` (as
/// [`otlp_json`] writes it, or a collector receives it).
pub fn parse_otlp_json(request: &serde_json::Value) -> Result<Vec<SpanRecord>, String> {
    let mut out = Vec::new();
    let resource_spans = request
        .get("resourceSpans")
        .and_then(|v| v.as_array())
        .ok_or("no `resourceSpans` array: not an OTLP trace request")?;
    for rs in resource_spans {
        let scopes = rs.get("scopeSpans").and_then(|v| v.as_array());
        for scope in scopes.into_iter().flatten() {
            let spans = scope.get("spans").and_then(|v| v.as_array());
            for span in spans.into_iter().flatten() {
                out.push(parse_span(span)?);
            }
        }
    }
    Ok(out)
}

fn parse_span(span: &serde_json::Value) -> Result<SpanRecord, String> {
    let text = |key: &str| span.get(key).and_then(|v| v.as_str());
    let hex = |key: &str, len: usize| -> Result<u128, String> {
        match text(key) {
            None | Some("") => Ok(0),
            Some(h) if h.len() == len => {
                u128::from_str_radix(h, 16).map_err(|_| format!("`{key}` {h:?} is not hexadecimal"))
            }
            Some(h) => Err(format!("`{key}` {h:?} is not {len} hex digits")),
        }
    };
    let nanos = |key: &str| -> Result<u64, String> {
        match span.get(key) {
            Some(serde_json::Value::String(s)) => s
                .parse()
                .map_err(|_| format!("`{key}` {s:?} is not a number")),
            Some(serde_json::Value::Number(n)) => n
                .as_u64()
                .ok_or_else(|| format!("`{key}` {n} is not a time")),
            _ => Err(format!("a span without `{key}`")),
        }
    };
    let trace = hex("traceId", 32)?;
    if trace == 0 {
        return Err("a span without `traceId`".into());
    }
    let attrs = span
        .get("attributes")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|kv| {
            let key = kv.get("key")?.as_str()?.to_string();
            let value = kv.get("value")?;
            let value = match value.get("stringValue") {
                Some(s) => s.as_str()?.to_string(),
                None => value
                    .as_object()?
                    .values()
                    .next()
                    .map(|v| v.to_string().trim_matches('"').to_string())?,
            };
            Some((key, value))
        })
        .collect();
    Ok(SpanRecord {
        trace,
        span: hex("spanId", 16)? as u64,
        parent: hex("parentSpanId", 16)? as u64,
        name: text("name").unwrap_or_default().to_string(),
        start_ns: nanos("startTimeUnixNano")?,
        end_ns: nanos("endTimeUnixNano")?,
        attrs,
        error: span
            .get("status")
            .and_then(|s| s.get("code"))
            .and_then(|c| c.as_u64())
            == Some(2),
    })
}

/// Reads a trace file (`run --trace-file`): one OTLP JSON request per
/// line. A line that does not parse is an error naming it.
pub fn read_trace_file(path: &Path) -> Result<Vec<SpanRecord>, String> {
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot read the trace file {}: {e}", path.display()))?;
    let mut spans = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), n + 1))?;
        spans.extend(
            parse_otlp_json(&value).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?,
        );
    }
    Ok(spans)
}

/// The traces among `spans`, each its spans, in the order their roots
/// started.
pub fn group_traces(spans: Vec<SpanRecord>) -> Vec<Vec<SpanRecord>> {
    let mut by_trace: HashMap<u128, Vec<SpanRecord>> = HashMap::new();
    for span in spans {
        by_trace.entry(span.trace).or_default().push(span);
    }
    let mut traces: Vec<Vec<SpanRecord>> = by_trace.into_values().collect();
    traces.sort_by_key(|t| t.iter().map(|s| s.start_ns).min().unwrap_or(0));
    traces
}

/// What is wrong with a trace's tree, if anything: not one root, a span
/// whose parent is missing, or a child outside its parent's interval
/// (TR-2).
pub fn check_tree(spans: &[SpanRecord]) -> Result<(), String> {
    let by_id: HashMap<u64, &SpanRecord> = spans.iter().map(|s| (s.span, s)).collect();
    if by_id.len() != spans.len() {
        return Err("two spans share an id".into());
    }
    let roots: Vec<&SpanRecord> = spans.iter().filter(|s| s.parent == 0).collect();
    if roots.len() != 1 {
        return Err(format!("{} roots, not 1", roots.len()));
    }
    for span in spans.iter().filter(|s| s.parent != 0) {
        let Some(parent) = by_id.get(&span.parent) else {
            return Err(format!("span `{}` has no parent in the trace", span.name));
        };
        if span.start_ns < parent.start_ns || span.end_ns > parent.end_ns {
            return Err(format!(
                "span `{}` ({}..{}) is not within its parent `{}` ({}..{})",
                span.name, span.start_ns, span.end_ns, parent.name, parent.start_ns, parent.end_ns
            ));
        }
    }
    Ok(())
}

/// A trace as an indented tree: each span's name, duration, start after
/// the root's, and attributes.
pub fn render_tree(spans: &[SpanRecord]) -> String {
    let mut children: HashMap<u64, Vec<&SpanRecord>> = HashMap::new();
    let ids: std::collections::HashSet<u64> = spans.iter().map(|s| s.span).collect();
    let mut roots = Vec::new();
    for span in spans {
        if span.parent == 0 || !ids.contains(&span.parent) {
            roots.push(span);
        } else {
            children.entry(span.parent).or_default().push(span);
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| (s.start_ns, s.span));
    }
    roots.sort_by_key(|s| s.start_ns);
    let origin = roots.first().map_or(0, |r| r.start_ns);
    let mut out = String::new();
    if let Some(root) = roots.first() {
        let _ = writeln!(
            out,
            "trace {:032x}: {} spans, {}",
            root.trace,
            spans.len(),
            millis(root.duration_ns())
        );
    }
    fn walk(
        out: &mut String,
        span: &SpanRecord,
        children: &HashMap<u64, Vec<&SpanRecord>>,
        origin: u64,
        prefix: &str,
        last: bool,
        top: bool,
    ) {
        let branch = match (top, last) {
            (true, _) => "",
            (false, true) => "└─ ",
            (false, false) => "├─ ",
        };
        let attrs: Vec<String> = span.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            out,
            "{prefix}{branch}{}  {}  (at +{}){}{}",
            span.name,
            millis(span.duration_ns()),
            millis(span.start_ns.saturating_sub(origin)),
            if span.error { "  FAILED" } else { "" },
            if attrs.is_empty() {
                String::new()
            } else {
                format!("  {}", attrs.join(" "))
            }
        );
        let next_prefix = match (top, last) {
            (true, _) => prefix.to_string(),
            (false, true) => format!("{prefix}   "),
            (false, false) => format!("{prefix}│  "),
        };
        let kids = children.get(&span.span).map(Vec::as_slice).unwrap_or(&[]);
        for (i, kid) in kids.iter().enumerate() {
            walk(
                out,
                kid,
                children,
                origin,
                &next_prefix,
                i + 1 == kids.len(),
                false,
            );
        }
    }
    for root in roots {
        walk(&mut out, root, &children, origin, "", true, true);
    }
    out
}

fn millis(ns: u64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

/// `monarch-host trace`: prints the span trees of a trace file.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// A trace file written by `run --trace-file`, or the id of a job of
    /// a server started with `serve --trace`.
    pub source: String,
    /// The server whose job to read (a job id as source).
    #[arg(long, env = "MONARCH_SERVER", default_value = "http://127.0.0.1:7171")]
    pub server: String,
    /// A file holding the server's bearer token.
    #[arg(long, env = "MONARCH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Prints the trace with this id (a prefix is enough) instead of the
    /// newest one.
    #[arg(long, value_name = "ID", conflicts_with = "all")]
    pub trace: Option<String>,
    /// Prints every trace, oldest first.
    #[arg(long)]
    pub all: bool,
    /// Exits 1 unless every printed trace is one complete, well-nested
    /// tree.
    #[arg(long)]
    pub check: bool,
}

/// Runs `monarch-host trace`.
pub fn command(args: TraceArgs) -> std::process::ExitCode {
    use std::process::ExitCode;
    let spans = match load(&args) {
        Ok(spans) => spans,
        Err(e) => {
            eprintln!("monarch-host trace: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let traces = group_traces(spans);
    if traces.is_empty() {
        eprintln!(
            "monarch-host trace: no traces in {} (only casts with replies are traced)",
            args.source
        );
        return ExitCode::FAILURE;
    }
    let chosen: Vec<&Vec<SpanRecord>> = match (&args.trace, args.all) {
        (_, true) => traces.iter().collect(),
        (Some(id), _) => {
            let id = id.to_lowercase();
            let found: Vec<_> = traces
                .iter()
                .filter(|t| format!("{:032x}", t[0].trace).starts_with(&id))
                .collect();
            if found.is_empty() {
                eprintln!(
                    "monarch-host trace: no trace {id} among the {} in {}",
                    traces.len(),
                    args.source
                );
                return ExitCode::FAILURE;
            }
            found
        }
        (None, false) => traces.last().into_iter().collect(),
    };
    let mut ok = true;
    for trace in &chosen {
        print!("{}", render_tree(trace));
        if let Err(e) = check_tree(trace) {
            ok = false;
            println!("  (incomplete: {e})");
        }
    }
    if !args.all && traces.len() > 1 {
        eprintln!(
            "monarch-host trace: {} traces in {}; --all prints every one, --trace ID one of them",
            traces.len(),
            args.source
        );
    }
    if args.check && !ok {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn load(args: &TraceArgs) -> Result<Vec<SpanRecord>, String> {
    let path = Path::new(&args.source);
    if path.exists() {
        return read_trace_file(path);
    }
    let job: u64 = args
        .source
        .parse()
        .map_err(|_| format!("{}: no such trace file (and not a job id)", args.source))?;
    let server = args.server.clone();
    let token = match &args.token_file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let url = format!("{}/v1/jobs/{job}/trace", server.trim_end_matches('/'));
    let body = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| e.to_string())?;
        let mut request = client.get(&url);
        if let Some(token) = &token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("cannot reach {server}: {e}"))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{url}: {status}: {}", text.trim()));
        }
        Ok(text)
    })?;
    let mut spans = Vec::new();
    for (n, line) in body.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{url}: line {}: {e}", n + 1))?;
        spans.extend(parse_otlp_json(&value)?);
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperactor_mesh::trace::now_ns;

    fn span(trace: u128, id: u64, parent: u64, name: &str, start: u64, end: u64) -> SpanRecord {
        SpanRecord {
            trace,
            span: id,
            parent,
            name: name.into(),
            start_ns: start,
            end_ns: end,
            attrs: vec![("proc".into(), "p0".into())],
            error: false,
        }
    }

    #[test]
    fn otlp_json_round_trips_and_the_tree_renders_nested() {
        let t0 = now_ns();
        let spans = vec![
            span(7, 1, 0, "cast ping", t0, t0 + 5_000_000),
            span(7, 2, 1, "hop", t0 + 1_000, t0 + 4_000_000),
            span(7, 3, 2, "handle ping", t0 + 2_000, t0 + 3_000_000),
            span(7, 4, 2, "reduce", t0 + 3_000_000, t0 + 3_900_000),
        ];
        let json = otlp_json(&spans);
        assert_eq!(
            json["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"],
            "00000000000000000000000000000007"
        );
        let back = parse_otlp_json(&json).expect("parses");
        assert_eq!(back, spans);
        check_tree(&back).expect("one well-nested tree");
        let text = render_tree(&back);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("trace 0000"), "{text}");
        assert!(lines[1].starts_with("cast ping  5.000 ms"), "{text}");
        assert!(lines[2].starts_with("└─ hop  3.999 ms"), "{text}");
        assert!(lines[3].starts_with("   ├─ handle ping"), "{text}");
        assert!(lines[4].starts_with("   └─ reduce"), "{text}");
    }

    #[test]
    fn a_broken_tree_is_reported() {
        let orphan = vec![span(1, 1, 0, "cast", 0, 10), span(1, 2, 9, "hop", 1, 2)];
        assert!(check_tree(&orphan).unwrap_err().contains("no parent"));
        let outside = vec![span(1, 1, 0, "cast", 0, 10), span(1, 2, 1, "hop", 5, 11)];
        assert!(check_tree(&outside).unwrap_err().contains("not within"));
        let two_roots = vec![span(1, 1, 0, "a", 0, 10), span(1, 2, 0, "b", 0, 10)];
        assert!(check_tree(&two_roots).unwrap_err().contains("2 roots"));
    }

    #[test]
    fn bad_otlp_input_is_an_error_not_a_panic() {
        for bad in [
            serde_json::json!({}),
            serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}),
            serde_json::json!({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "00000000000000000000000000000001", "spanId": "0000000000000001"}]}]}]}),
        ] {
            assert!(parse_otlp_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn otlp_urls_get_the_traces_path_when_they_have_none() {
        assert_eq!(
            otlp_traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            otlp_traces_url("http://c:4318/custom/v1/traces").unwrap(),
            "http://c:4318/custom/v1/traces"
        );
        assert!(otlp_traces_url("collector:4318").is_err());
        assert!(otlp_traces_url("not a url").is_err());
    }
}
