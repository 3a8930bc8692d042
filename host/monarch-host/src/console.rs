//! `monarch-host console` and `monarch-host sessions`: a terminal on a
//! session that lives on a server (`serve::sessions`). The console edits
//! lines (rustyline: history, cursor keys, Ctrl-R), sends each line to the
//! session, and prints what the session and its actors print as it comes.
//!
//! - CO-1: Ctrl-C while an input runs interrupts that input (the session
//!   goes on); at the prompt it drops the line being typed.
//! - CO-2: Ctrl-D, `:detach` or a killed console leave the session
//!   running; `--session NAME` attaches again and first shows what it
//!   printed since the last input began.
//! - CO-3: lines that begin with `:` are the console's own (`:help`).
//!
//! Without `--server` the console starts a server inside itself (on
//! 127.0.0.1, with a data directory of its own), so the session ends with
//! the console.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::sync::mpsc;

use crate::serve::api::{InputReply, SessionHello, SessionInfo, SessionRequest};
use crate::serve::client::{ApiClient, SseParser};

/// `monarch-host console`.
#[derive(Debug, clap::Args)]
pub struct ConsoleArgs {
    /// The server (http://HOST:PORT); without it, a server is started in
    /// this process and the session ends with the console.
    #[arg(long, env = "MONARCH_SERVER")]
    pub server: Option<String>,
    /// A file holding the server's bearer token.
    #[arg(long, env = "MONARCH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Attaches to the session NAME, or opens it under that name.
    #[arg(long, value_name = "NAME")]
    pub session: Option<String>,
    /// A new session's procs come from this persistent mesh (`serve
    /// --mesh`) instead of fresh ones.
    #[arg(long, value_name = "MESH")]
    pub mesh: Option<String>,
    /// A new session closes after this long without input: seconds, or
    /// with a unit (`90s`, `30m`, `8h`, `2d`). Default: the server's (8 h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub idle_ttl: Option<Duration>,
    /// A session component (`.wasm` of the WIT world `session`) to run
    /// instead of the built-in Python REPL.
    #[arg(long, value_name = "FILE")]
    pub component: Option<PathBuf>,
    /// Arguments of a new session's `init`.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// `monarch-host sessions`.
#[derive(Debug, clap::Args)]
pub struct SessionsArgs {
    /// The server (http://HOST:PORT).
    #[arg(long, env = "MONARCH_SERVER", default_value = "http://127.0.0.1:7171")]
    pub server: String,
    /// A file holding the server's bearer token.
    #[arg(long, env = "MONARCH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// Reads `90`, `90s`, `30m`, `8h` or `2d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => {
            return Err(format!(
                "`{text}`: give seconds, or a number with s, m, h or d"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (90s, 30m, 8h, 2d)"))?;
    let seconds = value * scale;
    if !(1.0..1e9).contains(&seconds) {
        return Err(format!("`{text}`: give at least one second"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn read_token(path: &std::path::Path) -> Result<String, String> {
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = token.trim().to_string();
    match token.is_empty() {
        true => Err(format!("the token file {} is empty", path.display())),
        false => Ok(token),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// Runs `monarch-host sessions`.
pub fn sessions_command(args: SessionsArgs) -> ExitCode {
    let listed = (|| {
        let token = args.token_file.as_deref().map(read_token).transpose()?;
        let client = ApiClient::new(&args.server, token, Duration::from_secs(30))?;
        runtime()?.block_on(client.sessions())
    })();
    match listed {
        Ok(sessions) => {
            print!("{}", table(&sessions));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("monarch-host sessions: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sessions as a table: name, job, owner, state, meshes, idle time, TTL.
fn table(sessions: &[SessionInfo]) -> String {
    let mut out = format!(
        "{:<20} {:>5}  {:<12}  {:<8}  {:>8}  {:>8}  MESHES\n",
        "NAME", "JOB", "OWNER", "STATE", "IDLE", "TTL"
    );
    for s in sessions {
        let meshes = match s.meshes.is_empty() {
            true => "-".to_string(),
            false => s.meshes.join(","),
        };
        let state = match (s.state.as_str(), &s.reason) {
            ("active", _) | (_, None) => s.state.clone(),
            (state, Some(reason)) => format!("{state}: {reason}"),
        };
        out += &format!(
            "{:<20} {:>5}  {:<12}  {:<8}  {:>8}  {:>8}  {meshes}\n",
            s.name,
            s.job,
            s.owner,
            state,
            human(s.idle_s),
            human(s.idle_ttl_s)
        );
    }
    out
}

/// `95` is `1m35s`.
fn human(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// Runs `monarch-host console`.
pub fn command(args: ConsoleArgs) -> ExitCode {
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monarch-host console: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(console(args));
    // The line editor's thread may still wait on the terminal.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match code {
        Ok(code) => code,
        Err(e) => {
            eprintln!("monarch-host console: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A server started for a console without `--server`.
async fn embedded_server() -> Result<(crate::serve::Server, String), String> {
    let data = crate::engine::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("monarch-host"))
        .join("console")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&data).map_err(|e| format!("{}: {e}", data.display()))?;
    let bootstrap = hyperactor_mesh::exe::current_exe()
        .map_err(|e| format!("cannot find this program to start procs: {e}"))?;
    let config = crate::serve::ServeConfig::new(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        data,
        bootstrap,
    );
    let server = crate::serve::Server::start(config).await?;
    let url = format!("http://{}", server.addr());
    Ok((server, url))
}

/// What the console shows, from the session's stream.
enum Shown {
    Out(String),
    Result(InputReply),
    End(String),
}

/// What the line editor read.
enum Typed {
    Line(String),
    Interrupted,
    Eof,
}

async fn console(args: ConsoleArgs) -> Result<ExitCode, String> {
    let token = args.token_file.as_deref().map(read_token).transpose()?;
    let (server, url) = match &args.server {
        Some(url) => (None, url.clone()),
        None => {
            let (server, url) = embedded_server().await?;
            eprintln!(
                "monarch-host console: a server for this console only (the session ends with it; `monarch-host serve` keeps sessions)"
            );
            (Some(server), url)
        }
    };
    let client = ApiClient::new(&url, token, Duration::from_secs(60))?;
    let outcome = attach_or_open(&client, &args).await;
    let (info, reattached) = match outcome {
        Ok(found) => found,
        Err(e) => {
            if let Some(server) = server {
                server.stop(Duration::from_secs(5)).await;
            }
            return Err(e);
        }
    };
    let code = run_console(&client, &info, reattached, args.server.as_deref()).await;
    if let Some(server) = server {
        server.stop(Duration::from_secs(10)).await;
    }
    code
}

/// The session of `--session NAME` (attached), or a new one.
async fn attach_or_open(
    client: &ApiClient,
    args: &ConsoleArgs,
) -> Result<(SessionInfo, bool), String> {
    if let Some(name) = &args.session {
        match client.session(name).await {
            Ok(info) if info.state == "active" || info.state == "starting" => {
                return Ok((info, true));
            }
            Ok(info) => {
                return Err(format!(
                    "the session `{name}` has ended ({}{}); open a new one under another name",
                    info.state,
                    info.reason.map(|r| format!(": {r}")).unwrap_or_default()
                ));
            }
            Err((Some(StatusCode::NOT_FOUND), _)) => {}
            Err((_, e)) => return Err(e),
        }
    }
    let component = match &args.component {
        None => {
            eprintln!(
                "monarch-host console: opening a Python session (the first one on a server builds the REPL: about 30 s)"
            );
            None
        }
        Some(path) => {
            let bytes =
                std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            Some(client.upload(bytes).await?.id)
        }
    };
    let request = SessionRequest {
        name: args.session.clone(),
        component,
        mesh: args.mesh.clone(),
        idle_ttl_s: args.idle_ttl.map(|d| d.as_secs().max(1)),
        args: args.args.clone(),
        limits: None,
    };
    let info = client.open_session(&request).await?;
    Ok((info, false))
}

/// Reads the session's stream into `shown`; the first event (`hello`) is
/// returned.
async fn attach(
    client: &ApiClient,
    name: &str,
    shown: mpsc::UnboundedSender<Shown>,
) -> Result<SessionHello, String> {
    let mut response = client.session_stream(name).await?;
    let mut parser = SseParser::default();
    let mut pending = Vec::new();
    let hello = loop {
        let chunk = response
            .chunk()
            .await
            .map_err(|e| format!("the session's stream was cut off: {e}"))?
            .ok_or("the session's stream ended at once")?;
        pending.extend(parser.feed(&chunk));
        if let Some(at) = pending.iter().position(|(event, _)| event == "hello") {
            let (_, data) = pending.remove(at);
            break serde_json::from_str::<SessionHello>(&data)
                .map_err(|e| format!("a bad hello from the session: {e}"))?;
        }
    };
    tokio::spawn(async move {
        let forward = |events: Vec<(String, String)>| {
            for (event, data) in events {
                let item = match event.as_str() {
                    "out" => Shown::Out(data),
                    "result" => match serde_json::from_str(&data) {
                        Ok(reply) => Shown::Result(reply),
                        Err(_) => continue,
                    },
                    "end" => Shown::End(data),
                    _ => continue,
                };
                if shown.send(item).is_err() {
                    return false;
                }
            }
            true
        };
        if !forward(pending) {
            return;
        }
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if !forward(parser.feed(&chunk)) {
                        return;
                    }
                }
                Ok(None) | Err(_) => {
                    let _ = shown.send(Shown::End("the connection to the server was lost".into()));
                    return;
                }
            }
        }
    });
    Ok(hello)
}

/// The line editor, on a thread of its own: it reads a line for each
/// prompt sent to it. Output that comes while it reads (an actor's) is
/// printed above the prompt, which is drawn again after it.
///
/// Not rustyline's `ExternalPrinter`: with one, rustyline 17 waits on the
/// terminal before it reads what it has buffered, so a pasted line stops
/// after its first character.
struct Editor {
    prompts: std::sync::mpsc::Sender<String>,
    typed: mpsc::UnboundedReceiver<Typed>,
    /// The prompt being shown, while the editor reads a line.
    reading: Option<String>,
}

impl Editor {
    fn start() -> Result<Editor, String> {
        let (prompts, prompt_rx) = std::sync::mpsc::channel::<String>();
        let (typed_tx, typed) = mpsc::unbounded_channel();
        let (made_tx, made) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("console-editor".into())
            .spawn(move || {
                let config = rustyline::Config::builder().auto_add_history(true).build();
                let mut editor = match rustyline::DefaultEditor::with_config(config) {
                    Ok(editor) => editor,
                    Err(e) => {
                        let _ = typed_tx.send(Typed::Line(format!(":error {e}")));
                        return;
                    }
                };
                let history = history_file();
                if let Some(history) = &history {
                    let _ = editor.load_history(history);
                }
                let _ = made_tx.send(());
                while let Ok(prompt) = prompt_rx.recv() {
                    let typed = match editor.readline(&prompt) {
                        Ok(line) => Typed::Line(line),
                        Err(rustyline::error::ReadlineError::Interrupted) => Typed::Interrupted,
                        Err(_) => Typed::Eof,
                    };
                    if let Some(history) = &history {
                        let _ = editor.save_history(history);
                    }
                    if typed_tx.send(typed).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start the line editor: {e}"))?;
        // Making the editor installs rustyline's SIGINT handler, for as
        // long as the editor lives: the console installs its own after it
        // (`run_console`), so that Ctrl-C while an input runs reaches the
        // console (CO-1).
        let _ = made.recv();
        Ok(Editor {
            prompts,
            typed,
            reading: None,
        })
    }

    fn print(&self, text: impl Into<String>) {
        let mut text = text.into();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let mut out = std::io::stdout().lock();
        let _ = match &self.reading {
            // In raw mode: from the start of the prompt's line, cleared;
            // then the prompt again (what was typed so far shows again at
            // the next key).
            Some(prompt) => {
                out.write_all(format!("\r\x1b[K{}{prompt}", text.replace('\n', "\r\n")).as_bytes())
            }
            None => out.write_all(text.as_bytes()),
        };
        let _ = out.flush();
    }

    /// Asks the editor's thread for a line after `prompt`.
    fn ask(&mut self, prompt: &str) {
        self.reading = Some(prompt.to_string());
        let _ = self.prompts.send(prompt.to_string());
    }
}

/// Where the console keeps its history: beside the compile cache.
fn history_file() -> Option<PathBuf> {
    let dir = crate::engine::cache_dir()?;
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("console_history"))
}

const HELP: &str = "\
Lines are run in the session (Python: statements, expressions, blocks).
Console commands:
  :meshes              the actor meshes of this session, and the server's persistent ones
  :sessions            the server's sessions
  :logs MESH[RANK] -f  the lines MESH (or one rank of it) printed; -f follows until Ctrl-C
  :stacks              what each actor of this session is doing now
  :detach              leave; the session keeps running (Ctrl-D too)
  :close               stop the session and everything it spawned
  :help                this
Ctrl-C stops the running input; the session goes on.";

async fn run_console(
    client: &ApiClient,
    info: &SessionInfo,
    reattached: bool,
    server: Option<&str>,
) -> Result<ExitCode, String> {
    let name = info.name.clone();
    let (shown_tx, mut shown) = mpsc::unbounded_channel();
    let hello = attach(client, &name, shown_tx).await?;
    let mut editor = Editor::start()?;
    let again = match server {
        Some(url) => format!("monarch-host console --server {url} --session {name}"),
        None => format!("monarch-host console --session {name}"),
    };
    if reattached {
        editor.print("<output since your last input follows>");
        if hello.truncated {
            editor.print("[console] (older lines were dropped)");
        }
        for line in &hello.replay {
            editor.print(line.clone());
        }
    } else {
        editor.print(format!(
            "session {name} (job {}); :help for console commands, Ctrl-D to detach",
            info.job
        ));
    }
    let mut prompt = match hello.session.prompt.is_empty() {
        true => ">>> ".to_string(),
        false => hello.session.prompt.clone(),
    };
    // Ctrl-C while an input runs reaches this process as SIGINT (the
    // editor, which reads keys raw, is not reading then).
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| format!("cannot catch Ctrl-C: {e}"))?;
    loop {
        editor.ask(&prompt);
        let typed = loop {
            tokio::select! {
                typed = editor.typed.recv() => {
                    editor.reading = None;
                    break typed.unwrap_or(Typed::Eof)
                }
                item = shown.recv() => match item {
                    Some(Shown::Out(line)) => editor.print(line),
                    Some(Shown::Result(reply)) => show_result(&editor, &reply),
                    Some(Shown::End(why)) => {
                        editor.print(format!("[console] the session ended: {why}"));
                        return Ok(ExitCode::SUCCESS);
                    }
                    None => {
                        editor.print("[console] the session's stream ended");
                        return Ok(ExitCode::FAILURE);
                    }
                },
                _ = sigint.recv() => {}
            }
        };
        let line = match typed {
            Typed::Line(line) => line,
            Typed::Interrupted => {
                editor.print("KeyboardInterrupt");
                continue;
            }
            Typed::Eof => {
                editor.print(format!(
                    "[console] detached; the session {name} keeps running. Re-attach with: {again}"
                ));
                return Ok(ExitCode::SUCCESS);
            }
        };
        if let Some(command) = line.trim_start().strip_prefix(':') {
            match builtin(client, info, &editor, command, &mut sigint).await {
                Builtin::Stay => {}
                Builtin::Detach => {
                    editor.print(format!(
                        "[console] detached; the session {name} keeps running. Re-attach with: {again}"
                    ));
                    return Ok(ExitCode::SUCCESS);
                }
                Builtin::Closed => return Ok(ExitCode::SUCCESS),
            }
            continue;
        }
        let sent = {
            let client = client.clone();
            let name = name.clone();
            tokio::spawn(async move { client.input(&name, &line).await })
        };
        tokio::pin!(sent);
        let mut reply: Option<InputReply> = None;
        let mut results: Vec<InputReply> = Vec::new();
        loop {
            // Done once the server answered and its result came down the
            // stream after the input's output.
            if let Some(mine) = &reply
                && let Some(at) = results.iter().position(|r| r.seq == mine.seq)
            {
                let result = results.remove(at);
                show_result(&editor, &result);
                prompt = result.prompt.clone();
                break;
            }
            tokio::select! {
                answered = &mut sent, if reply.is_none() => match answered {
                    Ok(Ok(answer)) => reply = Some(answer),
                    Ok(Err(e)) => {
                        editor.print(format!("[console] {e}"));
                        if e.contains("410") {
                            return Ok(ExitCode::FAILURE);
                        }
                        break;
                    }
                    Err(e) => return Err(format!("the input's task failed: {e}")),
                },
                item = shown.recv() => match item {
                    Some(Shown::Out(line)) => editor.print(line),
                    Some(Shown::Result(result)) => results.push(result),
                    Some(Shown::End(why)) => {
                        editor.print(format!("[console] the session ended: {why}"));
                        return Ok(ExitCode::SUCCESS);
                    }
                    None => {
                        // The stream is gone: show the answer as it came.
                        if let Some(mine) = reply.take() {
                            show_result(&editor, &mine);
                        }
                        editor.print("[console] the session's stream ended");
                        return Ok(ExitCode::FAILURE);
                    }
                },
                _ = sigint.recv() => {
                    // The input may not have reached the server yet: ask
                    // again while it says that nothing runs.
                    for _ in 0..30 {
                        match client.interrupt(&name).await {
                            Ok(info) if !info.busy && reply.is_none() => {
                                tokio::time::sleep(Duration::from_millis(100)).await
                            }
                            Ok(_) => break,
                            Err(e) => {
                                editor.print(format!("[console] cannot interrupt: {e}"));
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
}

fn show_result(editor: &Editor, reply: &InputReply) {
    if let Some(output) = reply.output.as_deref().filter(|o| !o.is_empty()) {
        editor.print(output.to_string());
    }
    if let Some(error) = reply.error.as_deref() {
        editor.print(error.to_string());
    }
}

enum Builtin {
    Stay,
    Detach,
    Closed,
}

async fn builtin(
    client: &ApiClient,
    info: &SessionInfo,
    editor: &Editor,
    command: &str,
    sigint: &mut tokio::signal::unix::Signal,
) -> Builtin {
    let mut words = command.split_whitespace();
    let verb = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    let said = |result: Result<String, String>| match result {
        Ok(text) => editor.print(text),
        Err(e) => editor.print(format!("[console] {e}")),
    };
    match verb {
        "help" | "h" | "?" => editor.print(HELP),
        "detach" => return Builtin::Detach,
        "close" => match client.close_session(&info.name).await {
            Ok(ended) => {
                editor.print(format!(
                    "[console] the session {} is {}; what it spawned was stopped",
                    info.name, ended.state
                ));
                return Builtin::Closed;
            }
            Err(e) => editor.print(format!("[console] cannot close the session: {e}")),
        },
        "sessions" => said(client.sessions().await.map(|s| table(&s))),
        "meshes" => said(meshes(client, info).await),
        "stacks" => said(
            client
                .stacks(info.job)
                .await
                .and_then(|value| {
                    serde_json::from_value::<crate::debug::stacks::Report>(value).map_err(|e| {
                        format!("the server answered what this console cannot read: {e}")
                    })
                })
                .map(|report| crate::debug::stacks::render(&report)),
        ),
        "logs" => {
            let follow = rest.contains(&"-f");
            let target = rest.iter().find(|w| !w.starts_with('-')).copied();
            match LogFilter::parse(target) {
                Ok(filter) => {
                    if let Err(e) = logs(client, info.job, &filter, follow, editor, sigint).await {
                        editor.print(format!("[console] {e}"));
                    }
                }
                Err(e) => editor.print(format!("[console] {e}")),
            }
        }
        other => editor.print(format!(
            "[console] no console command `:{other}`; :help lists them"
        )),
    }
    Builtin::Stay
}

/// `:meshes`: the session's actor meshes, then the server's persistent
/// ones.
async fn meshes(client: &ApiClient, info: &SessionInfo) -> Result<String, String> {
    let all = client.meshes().await?;
    let scope = format!("j{}.", info.job);
    let mut out = String::new();
    for mesh in &all {
        for actors in mesh.actors.iter().filter(|a| a.job == info.job) {
            let running = actors.ranks.iter().filter(|r| r.state == "running").count();
            let name = actors.name.strip_prefix(&scope).unwrap_or(&actors.name);
            // A class defined in a Python session travels as
            // `__session__:Name`.
            let class = actors
                .class
                .strip_prefix("__session__:")
                .unwrap_or(&actors.class);
            out += &format!(
                "{name}: {} ranks of {class} ({running} running)",
                actors.ranks.len(),
            );
            for rank in actors.ranks.iter().filter(|r| r.state != "running") {
                out += &format!(
                    "\n  [{}] {}{}",
                    rank.rank,
                    rank.state,
                    rank.reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
            }
            out.push('\n');
        }
    }
    let persistent: Vec<&str> = all
        .iter()
        .filter(|m| m.persistent)
        .map(|m| m.name.as_str())
        .collect();
    if out.is_empty() {
        out += "no actor meshes in this session\n";
    }
    if !persistent.is_empty() {
        out += &format!("persistent meshes: {}\n", persistent.join(", "));
    }
    Ok(out.trim_end().to_string())
}

/// Which lines `:logs` shows: a mesh's, or one rank's.
#[derive(Debug, PartialEq)]
struct LogFilter {
    mesh: Option<String>,
    rank: Option<u32>,
}

impl LogFilter {
    fn parse(target: Option<&str>) -> Result<LogFilter, String> {
        let Some(target) = target else {
            return Ok(LogFilter {
                mesh: None,
                rank: None,
            });
        };
        let bad = || format!("`{target}`: give MESH or MESH[RANK], as in :logs counters[2] -f");
        match target.split_once('[') {
            None => Ok(LogFilter {
                mesh: Some(target.to_string()),
                rank: None,
            }),
            Some((mesh, rest)) => {
                let rank = rest
                    .strip_suffix(']')
                    .and_then(|r| r.parse().ok())
                    .ok_or_else(bad)?;
                if mesh.is_empty() {
                    return Err(bad());
                }
                Ok(LogFilter {
                    mesh: Some(mesh.to_string()),
                    rank: Some(rank),
                })
            }
        }
    }

    /// Whether `line` (as the console shows it: `[mesh rank] text`) is
    /// one of these.
    fn keeps(&self, line: &str) -> bool {
        let Some(mesh) = &self.mesh else { return true };
        let Some(rest) = line.strip_prefix('[') else {
            return false;
        };
        let Some((who, _)) = rest.split_once(']') else {
            return false;
        };
        let (name, rank) = who.rsplit_once(' ').unwrap_or((who, ""));
        name == mesh && self.rank.is_none_or(|r| rank == r.to_string())
    }
}

/// `:logs`: the session's log lines that pass `filter`; with `follow`,
/// until Ctrl-C.
async fn logs(
    client: &ApiClient,
    job: u64,
    filter: &LogFilter,
    follow: bool,
    editor: &Editor,
    sigint: &mut tokio::signal::unix::Signal,
) -> Result<(), String> {
    let mut response = client.log_stream(job).await?;
    let mut parser = SseParser::default();
    let scope = format!("[j{job}.");
    // Without -f: what is there, which comes at once.
    let quiet = Duration::from_millis(300);
    loop {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk.map_err(|e| format!("the log was cut off: {e}"))?,
            _ = tokio::time::sleep(quiet), if !follow => return Ok(()),
            _ = sigint.recv() => return Ok(()),
        };
        let Some(chunk) = chunk else { return Ok(()) };
        for (event, data) in parser.feed(&chunk) {
            match event.as_str() {
                "log" => {
                    let line = match data.strip_prefix(&scope) {
                        Some(rest) => format!("[{rest}"),
                        None => data,
                    };
                    if filter.keeps(&line) {
                        editor.print(line);
                    }
                }
                "end" => return Ok(()),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_duration("8h").unwrap(), Duration::from_secs(8 * 3600));
        assert_eq!(parse_duration("1.5d").unwrap(), Duration::from_secs(129600));
        for bad in ["", "0", "x", "3w", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn logs_filter_by_mesh_and_rank() {
        let rank = LogFilter::parse(Some("counters[2]")).unwrap();
        assert!(rank.keeps("[counters 2] at 5"));
        assert!(!rank.keeps("[counters 1] at 5"));
        assert!(!rank.keeps("[counter 2] at 5"));
        let mesh = LogFilter::parse(Some("counters")).unwrap();
        assert!(mesh.keeps("[counters 1] at 5"));
        assert!(!mesh.keeps("plain text"));
        assert!(LogFilter::parse(None).unwrap().keeps("anything"));
        assert!(LogFilter::parse(Some("counters[x]")).is_err());
        assert!(LogFilter::parse(Some("[1]")).is_err());
    }

    #[test]
    fn idle_times_read_as_people_write_them() {
        assert_eq!(human(5), "5s");
        assert_eq!(human(95), "1m35s");
        assert_eq!(human(8 * 3600), "8h00m");
        assert_eq!(human(90000), "1d01h");
    }
}
