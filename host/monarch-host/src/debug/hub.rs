//! The debug hub of a run: where paused actors wait, and where debuggers
//! (`monarch-host debug`) and probes (`monarch-host stacks`) connect.
//!
//! One process (the run's, or the server's for a job) holds the hub. It
//! listens on a unix socket beside the run's record (for local clients)
//! and, with debugging on, on TCP (for paused actors on any host, and
//! clients elsewhere). Every connection speaks JSON lines and opens with
//! the run's token and its role:
//! - `actor`: a paused instance ([`super::pause`]);
//! - `client`: a `monarch_dbg>` session: the client sends `line`s, the
//!   hub sends `out` text, `prompt`s and a final `bye`;
//! - `request`: one `op` and one JSON reply (`stacks`).
//!
//! The hub counts the time during which any actor of the run is paused;
//! the controller's casts move their deadlines on by it, so that a call
//! waiting on a paused rank does not time out while it is paused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{broadcast, mpsc};

use super::LiveRun;
use super::pause::{Hello, PauseClock};
use super::select::{Command, Selection};

/// The prompt of the hub's command line.
pub const PROMPT: &str = "monarch_dbg> ";

/// How long `cast` and `continue` wait for paused ranks to answer before
/// they print what came.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long `interrupt` waits for a rank running its own code to stop
/// (it stops at its next epoch tick, 10 ms, and pauses at the hub).
const INTERRUPT_WAIT: Duration = Duration::from_secs(3);

/// One paused instance.
struct Paused {
    hello: Hello,
    since: Instant,
    /// Lines to the actor.
    to_actor: mpsc::UnboundedSender<String>,
    /// Its output since the last input it was sent.
    output: String,
    /// Whether it waits for a line.
    waiting: bool,
}

/// What happens to paused instances, for the clients watching.
#[derive(Debug, Clone)]
enum News {
    Paused(u64),
    Output(u64, String),
    Waiting(u64),
    Done(u64),
}

/// A run's debug hub; see the module docs.
pub struct Hub {
    token: String,
    pause_limit: Duration,
    live: LiveRun,
    paused: Mutex<BTreeMap<u64, Paused>>,
    next_id: AtomicU64,
    news: broadcast::Sender<News>,
    /// Clients connected now, and when the last one left.
    clients: AtomicUsize,
    last_client: Mutex<Instant>,
    /// The time during which any instance was paused.
    clock: Arc<PauseClock>,
    /// The TCP address actors reach the hub at, when debugging is on.
    pub tcp: Option<std::net::SocketAddr>,
    /// The unix socket local clients reach the hub at.
    pub control: PathBuf,
    /// The run's instances on the debug engine and its breakpoints
    /// (`run --debug`).
    pub engine: super::engine::Registry,
}

/// The hubs of this process, by token, for the casters of their runs.
static HUBS: Mutex<Vec<(String, Weak<Hub>)>> = Mutex::new(Vec::new());

/// The clock of paused time of the run whose debug token is `token`, if
/// its hub is in this process.
pub(crate) fn clock(token: &str) -> Option<Arc<PauseClock>> {
    find(token).map(|hub| hub.clock.clone())
}

/// The hub of the run whose debug token is `token`, if it is in this
/// process (a server's job: its debug bridges reach it through
/// [`Hub::control`]).
pub(crate) fn find(token: &str) -> Option<Arc<Hub>> {
    let mut hubs = HUBS.lock().unwrap_or_else(|p| p.into_inner());
    hubs.retain(|(_, hub)| hub.strong_count() > 0);
    hubs.iter()
        .find(|(t, _)| t == token)
        .and_then(|(_, hub)| hub.upgrade())
}

impl Hub {
    /// Starts a hub listening on the unix socket `control` and, when
    /// `listen` is given, on TCP there (port 0: any).
    pub async fn start(
        token: String,
        control: &Path,
        listen: Option<&str>,
        pause_limit: Duration,
        live: LiveRun,
    ) -> Result<Arc<Hub>, String> {
        let _ = std::fs::remove_file(control);
        let unix = tokio::net::UnixListener::bind(control)
            .map_err(|e| format!("cannot listen for debuggers at {}: {e}", control.display()))?;
        let tcp = match listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("cannot listen for debuggers on {addr}: {e}"))?,
            ),
            None => None,
        };
        let hub = Arc::new(Hub {
            token: token.clone(),
            pause_limit,
            live,
            paused: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            news: broadcast::channel(4096).0,
            clients: AtomicUsize::new(0),
            last_client: Mutex::new(Instant::now()),
            clock: Arc::default(),
            tcp: tcp.as_ref().and_then(|l| l.local_addr().ok()),
            control: control.to_path_buf(),
            engine: Default::default(),
        });
        HUBS.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((token, Arc::downgrade(&hub)));
        let weak = Arc::downgrade(&hub);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = unix.accept().await else {
                    continue;
                };
                let Some(hub) = weak.upgrade() else { return };
                tokio::spawn(async move { hub.serve(stream).await });
            }
        });
        if let Some(tcp) = tcp {
            let weak = Arc::downgrade(&hub);
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = tcp.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let Some(hub) = weak.upgrade() else { return };
                    tokio::spawn(async move { hub.serve(stream).await });
                }
            });
        }
        let weak = Arc::downgrade(&hub);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Some(hub) = weak.upgrade() else { return };
                hub.abandon_unattended();
            }
        });
        Ok(hub)
    }

    /// Ends pauses that have had no client connected for the pause limit.
    fn abandon_unattended(&self) {
        if self.clients.load(Ordering::Acquire) > 0 {
            return;
        }
        let left = *self.last_client.lock().unwrap_or_else(|p| p.into_inner());
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        for entry in paused.values() {
            let unattended = entry.since.max(left).elapsed();
            if unattended >= self.pause_limit {
                let why = format!(
                    "no debugger connected for {} s (the pause limit, --debug-pause-limit)",
                    self.pause_limit.as_secs_f64()
                );
                let _ = entry.to_actor.send(json!({ "abandon": why }).to_string());
            }
        }
    }

    /// Instances paused now.
    pub fn paused_count(&self) -> usize {
        self.paused.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(self: Arc<Self>, stream: S) {
        let (read, mut write) = tokio::io::split(stream);
        let mut lines = BufReader::new(read);
        let hello = match read_line(&mut lines, HELLO_MAX).await {
            Ok(Some(first)) => serde_json::from_str::<Value>(&first)
                .map_err(|e| format!("the first line is not JSON: {e}")),
            Ok(None) => return,
            Err(e) => Err(e.to_string()),
        };
        let hello = match hello {
            Ok(hello) if hello.get("token").and_then(Value::as_str) == Some(&self.token) => hello,
            Ok(_) => json!({ "error": "wrong token for this run's debug hub" }),
            Err(e) => json!({ "error": format!("not a debug hub request: {e}") }),
        };
        if hello.get("error").is_some() {
            let _ = send(&mut write, &hello).await;
            return;
        }
        match hello.get("role").and_then(Value::as_str) {
            Some("actor") => {
                if let Ok(hello) = serde_json::from_value::<Hello>(hello) {
                    self.serve_actor(hello, lines, write).await;
                }
            }
            Some("client") => self.serve_client(lines, write).await,
            Some("instance") => self.engine.serve_instance(&hello, lines, write).await,
            Some("request") => {
                let reply = self.answer_request(&hello).await;
                let _ = send(&mut write, &reply).await;
            }
            other => {
                let error = format!("unknown role {other:?}: actor, client or request");
                let _ = send(&mut write, &json!({ "error": error })).await;
            }
        }
    }

    async fn answer_request(&self, request: &Value) -> Value {
        match request.get("op").and_then(Value::as_str) {
            Some("stacks") => match self.live.cluster() {
                Some(cluster) => super::stacks::collect(&cluster).await,
                None => json!({ "error": "the run has not started its controller, or has ended" }),
            },
            Some("list") => json!({ "paused": self.list_rows() }),
            other => json!({ "error": format!("unknown request {other:?}") }),
        }
    }

    async fn serve_actor<R, W>(self: Arc<Self>, hello: Hello, mut lines: BufReader<R>, mut write: W)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (to_actor, mut outgoing) = mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Some(mut line) = outgoing.recv().await {
                line.push('\n');
                if write.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        {
            let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
            if paused.is_empty() {
                self.clock.pause();
            }
            paused.insert(
                id,
                Paused {
                    hello,
                    since: Instant::now(),
                    to_actor,
                    output: String::new(),
                    waiting: false,
                },
            );
        }
        let _ = self.news.send(News::Paused(id));
        while let Ok(Some(line)) = read_line(&mut lines, LINE_MAX).await {
            let Ok(said) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            if let Some(text) = said.get("out").and_then(Value::as_str) {
                if let Some(entry) = self.entry(id).as_mut() {
                    entry.output.push_str(text);
                }
                let _ = self.news.send(News::Output(id, text.to_string()));
            } else if said.get("want").is_some() {
                if let Some(entry) = self.entry(id).as_mut() {
                    entry.waiting = true;
                }
                let _ = self.news.send(News::Waiting(id));
            } else if said.get("done").is_some() {
                break;
            }
        }
        {
            let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
            paused.remove(&id);
            if paused.is_empty() {
                self.clock.resume();
            }
        }
        let _ = self.news.send(News::Done(id));
    }

    fn entry(&self, id: u64) -> EntryGuard<'_> {
        EntryGuard {
            guard: self.paused.lock().unwrap_or_else(|p| p.into_inner()),
            id,
        }
    }

    /// The paused instances, as `list` shows them.
    fn list_rows(&self) -> Vec<Value> {
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        paused
            .values()
            .map(|p| {
                json!({
                    "mesh": p.hello.mesh,
                    "rank": p.hello.rank,
                    "coords": coords_text(&p.hello.extent, p.hello.rank),
                    "host": p.hello.host,
                    "function": p.hello.function,
                    "location": p.hello.location,
                    "reason": p.hello.reason,
                    "paused_s": p.since.elapsed().as_secs_f64(),
                })
            })
            .collect()
    }

    /// Sends `line` to the paused instance `id`; false when it is gone.
    fn send_input(&self, id: u64, line: &str) -> bool {
        let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = paused.get_mut(&id) else {
            return false;
        };
        entry.output.clear();
        entry.waiting = false;
        entry
            .to_actor
            .send(json!({ "in": line }).to_string())
            .is_ok()
    }

    /// The id of the paused instance `rank` of `mesh`.
    fn find(&self, mesh: &str, rank: u32) -> Option<u64> {
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        paused
            .iter()
            .find(|(_, p)| p.hello.mesh == mesh && p.hello.rank == rank)
            .map(|(id, _)| *id)
    }

    fn name_of(&self, id: u64) -> String {
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        paused
            .get(&id)
            .map(|p| format!("{} {}", p.hello.mesh, p.hello.rank))
            .unwrap_or_else(|| format!("#{id}"))
    }

    async fn serve_client<R, W>(self: Arc<Self>, mut lines: BufReader<R>, mut write: W)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin,
    {
        // Lines are read by a task of their own: a read is not cancel-safe,
        // and the loop below waits for news at the same time.
        let (line_tx, mut line_rx) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            loop {
                let line = read_line(&mut lines, LINE_MAX).await;
                let end = !matches!(line, Ok(Some(_)));
                if line_tx.send(line).await.is_err() || end {
                    return;
                }
            }
        });
        self.clients.fetch_add(1, Ordering::AcqRel);
        let mut news = self.news.subscribe();
        let mut client = Client {
            attached: None,
            names: BTreeMap::new(),
        };
        let mut out = String::new();
        let count = self.paused_count();
        out.push_str(&format!(
            "monarch-host debugger: {count} paused; `list`, `attach MESH RANK`, `cast MESH ranks(SEL) CMD`, `continue`, `quit`, `help`\n"
        ));
        let _ = send(&mut write, &json!({ "out": out, "prompt": PROMPT })).await;
        loop {
            tokio::select! {
                line = line_rx.recv() => {
                    let Some(Ok(Some(line))) = line else { break };
                    let Ok(said) = serde_json::from_str::<Value>(&line) else { break };
                    let Some(line) = said.get("line").and_then(Value::as_str) else { continue };
                    let (text, quit) = self.client_line(&mut client, line, &mut news).await;
                    let prompt = match (quit, client.attached) {
                        (true, _) => None,
                        (false, Some(_)) => Some(""),
                        (false, None) => Some(PROMPT),
                    };
                    let reply = json!({ "out": text, "prompt": prompt, "bye": quit });
                    if send(&mut write, &reply).await.is_err() || quit {
                        break;
                    }
                }
                news_item = news.recv() => {
                    let Ok(item) = news_item else { continue };
                    if let Some(text) = self.client_news(&mut client, item) {
                        let prompt = if client.attached.is_some() { "" } else { PROMPT };
                        if send(&mut write, &json!({ "out": text, "prompt": prompt })).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
        reader.abort();
        *self.last_client.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.clients.fetch_sub(1, Ordering::AcqRel);
    }

    /// What a client sees of `item` without asking, if anything.
    fn client_news(&self, client: &mut Client, item: News) -> Option<String> {
        match item {
            News::Paused(id) => {
                let name = self.name_of(id);
                client.names.insert(id, name.clone());
                if client.attached.is_some() {
                    return None;
                }
                let at = {
                    let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
                    paused
                        .get(&id)
                        .map(|p| format!("{} in {}", p.hello.location, p.hello.function))
                        .unwrap_or_default()
                };
                Some(format!("\n[{name}] paused at {at}\n"))
            }
            News::Output(id, text) if client.attached == Some(id) => Some(text),
            News::Done(id) if client.attached == Some(id) => {
                client.attached = None;
                let name = client.names.get(&id).cloned().unwrap_or_default();
                Some(format!("\n[{name}] continued; detached\n"))
            }
            _ => None,
        }
    }

    /// Answers one line of a client: the text to print, and whether the
    /// client quits.
    async fn client_line(
        &self,
        client: &mut Client,
        line: &str,
        news: &mut broadcast::Receiver<News>,
    ) -> (String, bool) {
        if let Some(id) = client.attached {
            if line.trim() == "detach" {
                client.attached = None;
                return ("detached\n".into(), false);
            }
            if !self.send_input(id, line) {
                client.attached = None;
                return ("the rank is no longer paused; detached\n".into(), false);
            }
            // The output streams in as news.
            return (String::new(), false);
        }
        let command = match Command::parse(line) {
            Ok(command) => command,
            Err(e) => return (format!("*** {e}\n"), false),
        };
        match command {
            Command::Empty => (String::new(), false),
            Command::Help => (HELP.into(), false),
            Command::Quit => ("bye; paused ranks stay paused\n".into(), true),
            Command::List => (self.list_table(), false),
            Command::Detach => ("not attached\n".into(), false),
            Command::Attach { mesh, rank } => match self.find(&mesh, rank) {
                Some(id) => {
                    client.attached = Some(id);
                    client.names.insert(id, format!("{mesh} {rank}"));
                    let replay = self
                        .paused
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&id)
                        .map(|p| p.output.clone())
                        .unwrap_or_default();
                    (format!("attached to {mesh} {rank}\n{replay}"), false)
                }
                None => (
                    format!("*** {mesh} {rank} is not paused; `list` shows what is\n"),
                    false,
                ),
            },
            Command::Cast {
                mesh,
                selection,
                line,
            } => {
                let ids = self.select(&mesh, &selection);
                if ids.is_empty() {
                    return (
                        format!("*** no paused rank of `{mesh}` is in {selection}\n"),
                        false,
                    );
                }
                (self.send_and_wait(&ids, &line, news).await, false)
            }
            Command::Interrupt { mesh, selection } => {
                (self.interrupt(&mesh, &selection, news).await, false)
            }
            Command::Continue => {
                let ids: Vec<u64> = self
                    .paused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .keys()
                    .copied()
                    .collect();
                if ids.is_empty() {
                    return ("nothing is paused\n".into(), false);
                }
                let text = self.send_and_wait(&ids, "c", news).await;
                (text, false)
            }
        }
    }

    /// `interrupt`: the selected ranks of `mesh` that run on the debug
    /// engine and are not paused stop at their next epoch tick; waits for
    /// them to pause (at most [`INTERRUPT_WAIT`]) and says where each
    /// stopped. A rank that has not stopped by then runs none of its own
    /// code (it is idle, or waits in a host call): its interrupt is
    /// withdrawn, so that it does not stop at some later message.
    async fn interrupt(
        &self,
        mesh: &str,
        selection: &Selection,
        news: &mut broadcast::Receiver<News>,
    ) -> String {
        // News from before is not the answer.
        while news.try_recv().is_ok() {}
        let (ranks, paused) = self
            .engine
            .interrupt(mesh, selection, |rank| self.find(mesh, rank).is_some());
        if ranks.is_empty() && paused.is_empty() {
            return format!(
                "*** no rank of `{mesh}` in {selection} runs on the debug engine (start the run with --debug)\n"
            );
        }
        let mut said: BTreeMap<u32, String> = paused
            .iter()
            .map(|rank| (*rank, "is paused already".to_string()))
            .collect();
        let mut left: std::collections::BTreeSet<u32> = ranks.iter().copied().collect();
        let until = tokio::time::Instant::now() + INTERRUPT_WAIT;
        while !left.is_empty() {
            let item = tokio::select! {
                item = news.recv() => item,
                _ = tokio::time::sleep_until(until) => break,
            };
            match item {
                Ok(News::Paused(id)) => {
                    let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(p) = paused.get(&id)
                        && p.hello.mesh == mesh
                        && left.remove(&p.hello.rank)
                    {
                        said.insert(
                            p.hello.rank,
                            format!("stopped at {} in {}", p.hello.location, p.hello.function),
                        );
                    }
                }
                Err(broadcast::error::RecvError::Closed) => break,
                _ => {}
            }
        }
        let idle: Vec<u32> = left.into_iter().collect();
        self.engine.withdraw_interrupt(mesh, &idle);
        for rank in idle {
            said.insert(
                rank,
                "runs none of its own code (idle, or waiting in a host call): nothing to interrupt"
                    .to_string(),
            );
        }
        said.iter()
            .map(|(rank, what)| format!("[{mesh} {rank}] {what}\n"))
            .collect()
    }

    /// The paused ranks of `mesh` that `selection` picks.
    fn select(&self, mesh: &str, selection: &Selection) -> Vec<u64> {
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        paused
            .iter()
            .filter(|(_, p)| {
                p.hello.mesh == mesh && selection.matches(p.hello.rank, &p.hello.extent)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Sends `line` to each of `ids` and waits until each asks for the
    /// next line or continues (at most [`ANSWER_WAIT`]); returns their
    /// output, each line after its rank.
    async fn send_and_wait(
        &self,
        ids: &[u64],
        line: &str,
        news: &mut broadcast::Receiver<News>,
    ) -> String {
        // News from before is not the answer.
        while news.try_recv().is_ok() {}
        let mut names = BTreeMap::new();
        let mut answers: BTreeMap<u64, String> = BTreeMap::new();
        let mut left = std::collections::BTreeSet::new();
        let mut finished = std::collections::BTreeSet::new();
        for &id in ids {
            names.insert(id, self.name_of(id));
            if self.send_input(id, line) {
                left.insert(id);
                answers.insert(id, String::new());
            }
        }
        let until = tokio::time::Instant::now() + ANSWER_WAIT;
        while !left.is_empty() {
            let item = tokio::select! {
                item = news.recv() => item,
                _ = tokio::time::sleep_until(until) => break,
            };
            match item {
                Ok(News::Output(id, text)) => {
                    if let Some(answer) = answers.get_mut(&id) {
                        answer.push_str(&text);
                    }
                }
                Ok(News::Waiting(id)) => {
                    left.remove(&id);
                }
                Ok(News::Done(id)) => {
                    if left.remove(&id) {
                        finished.insert(id);
                    }
                }
                Ok(News::Paused(_)) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => break,
            }
        }
        let mut text = String::new();
        for (id, answer) in answers {
            let name = &names[&id];
            for part in answer.split_inclusive('\n') {
                text.push_str(&format!("[{name}] {part}"));
            }
            if !answer.is_empty() && !answer.ends_with('\n') {
                text.push('\n');
            }
            if finished.contains(&id) {
                text.push_str(&format!("[{name}] continued\n"));
            } else if left.contains(&id) {
                text.push_str(&format!(
                    "[{name}] (still running after {} s)\n",
                    ANSWER_WAIT.as_secs()
                ));
            }
        }
        text
    }

    fn list_table(&self) -> String {
        let rows = self.list_rows();
        if rows.is_empty() {
            return "nothing is paused\n".into();
        }
        let header = [
            "mesh", "rank", "coords", "host", "function", "location", "reason",
        ];
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|row| {
                header
                    .iter()
                    .map(|key| match &row[*key] {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect()
            })
            .collect();
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|row| row[i].chars().count())
                    .chain([header[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |row: Vec<&str>| {
            let mut text = row
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect::<Vec<_>>()
                .join("  ");
            text.truncate(text.trim_end().len());
            text.push('\n');
            text
        };
        let mut text = line(header.to_vec());
        for row in &cells {
            text.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        text
    }
}

/// A guard on one paused entry, by id.
struct EntryGuard<'a> {
    guard: std::sync::MutexGuard<'a, BTreeMap<u64, Paused>>,
    id: u64,
}

impl EntryGuard<'_> {
    fn as_mut(&mut self) -> Option<&mut Paused> {
        self.guard.get_mut(&self.id)
    }
}

/// A client's state.
struct Client {
    /// The paused instance its lines go to.
    attached: Option<u64>,
    /// Names of instances it has heard of, for after they are gone.
    names: BTreeMap<u64, String>,
}

/// The `help` text.
const HELP: &str = "\
commands:
  list                         the paused ranks: mesh, rank, coords, host, function, location, reason
  attach MESH RANK             talk to one paused rank (pdb, or the breakpoint's own debugger);
                               `detach` comes back here
  cast MESH ranks(SEL) CMD     send CMD to the selected paused ranks of MESH and show their answers;
                               SEL: *, 1,3  0:4  0:8:2  or by dimension: hosts=1, gpus=0:2
  interrupt MESH ranks(SEL)    stop the selected ranks where they run (a spinning loop): for runs on
                               the debug engine (`run --debug`); then `attach` or `cast` as above
  continue                     continue every paused rank
  quit                         leave; paused ranks stay paused (for --debug-pause-limit)
";

/// The coordinates of `rank` in `extent`, as `hosts=1, gpus=0`.
pub(crate) fn coords_text(extent: &[(String, u32)], rank: u32) -> String {
    super::select::coords(extent, rank)
        .iter()
        .map(|(name, at)| format!("{name}={at}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The longest first line the hub reads (a hello), before it knows the
/// token.
const HELLO_MAX: usize = 64 << 10;

/// The longest line it reads after (a debugger's output, a stack).
const LINE_MAX: usize = 4 << 20;

/// Reads one line of at most `max` bytes, without its newline; None at
/// the end. A longer line is an error, not a growing buffer.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    max: usize,
) -> std::io::Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let read = (&mut *reader)
        .take(max as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await?;
    if read == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a line longer than {max} bytes"),
        ));
    }
    String::from_utf8(buf).map(Some).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "a line that is not UTF-8")
    })
}

async fn send<W: AsyncWrite + Unpin>(write: &mut W, value: &Value) -> std::io::Result<()> {
    let mut line = value.to_string();
    line.push('\n');
    write.write_all(line.as_bytes()).await
}

/// Where a client reaches a run's hub: its unix socket, or its TCP
/// address, with the token.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// A unix socket on this machine.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(String),
}

/// Connects to a hub as `role`, saying `hello` (the token and role are
/// added).
pub async fn connect(
    endpoint: &Endpoint,
    token: &str,
    role: &str,
    mut hello: Value,
) -> Result<
    (
        Box<dyn AsyncRead + Unpin + Send>,
        Box<dyn AsyncWrite + Unpin + Send>,
    ),
    String,
> {
    hello["token"] = json!(token);
    hello["role"] = json!(role);
    let (read, mut write): (
        Box<dyn AsyncRead + Unpin + Send>,
        Box<dyn AsyncWrite + Unpin + Send>,
    ) = match endpoint {
        Endpoint::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| format!("cannot reach the run at {}: {e}", path.display()))?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Endpoint::Tcp(addr) => {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| format!("cannot reach the run's debug hub at {addr}: {e}"))?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
    };
    send(&mut write, &hello)
        .await
        .map_err(|e| format!("cannot talk to the run: {e}"))?;
    Ok((read, write))
}

/// Sends one request (`op`, with its fields) to a local run's hub and
/// returns its reply.
pub async fn request(record: &super::runs::RunRecord, op: Value) -> Result<Value, String> {
    let endpoint = Endpoint::Unix(record.control.clone());
    let (read, _write) = connect(&endpoint, &record.token, "request", op).await?;
    let mut lines = BufReader::new(read).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| "the run did not answer within 30 s".to_string())?
        .map_err(|e| format!("reading the run's answer: {e}"))?
        .ok_or("the run closed the connection without answering")?;
    let reply: Value =
        serde_json::from_str(&line).map_err(|e| format!("the run answered badly: {e}"))?;
    match reply.get("error").and_then(Value::as_str) {
        Some(error) => Err(error.to_string()),
        None => Ok(reply),
    }
}
