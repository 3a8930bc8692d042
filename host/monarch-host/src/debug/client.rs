//! `monarch-host debug`: the `monarch_dbg>` prompt of a run's debug hub.
//!
//! The client is a terminal: it sends each line typed to the hub and
//! prints what the hub sends (see [`super::hub`] for the commands). A
//! local run's hub is reached on its unix socket (or `--addr`, over TCP);
//! a server's job only through the server's HTTP API, by a debug bridge
//! (`serve::debug_bridge`): the same lines, as an SSE stream of what the
//! hub sends and a `POST` per line typed.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::hub::{Endpoint, connect};
use crate::serve::client::{ApiClient, SseParser};

/// How long a debug bridge's stream may go without a byte (the server
/// sends a keep-alive every 5 s) before the server counts as gone.
const STREAM_SILENCE: Duration = Duration::from_secs(30);

/// `monarch-host debug`.
#[derive(Debug, clap::Args)]
pub struct DebugArgs {
    /// The run to debug, by the id it printed (default: the newest live
    /// run on this machine), or with --server the job id.
    #[arg(value_name = "RUN|JOB")]
    pub target: Option<String>,
    /// Debugs job JOB of this server (http://HOST:PORT), submitted with
    /// breakpoints on (`submit --debug`, or `"debug": true`), through the
    /// server's HTTP API alone (a debug bridge).
    #[arg(long, value_name = "URL", conflicts_with = "addr")]
    pub server: Option<String>,
    /// A run's debug hub elsewhere, as `IP:PORT` (what the run printed),
    /// with --token-file.
    #[arg(long, requires = "token_file")]
    pub addr: Option<String>,
    /// With --addr, a file holding that run's debug token (its record's
    /// `token`); with --server, the server's bearer token.
    #[arg(long, env = "MONARCH_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// Reads a token file.
fn read_token(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|token| token.trim().to_string())
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))
}

/// Runs `monarch-host debug`.
pub fn command(args: DebugArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("monarch-host debug: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ended = runtime.block_on(session(args));
    // A read of stdin holds a thread that cannot be cancelled: leave
    // without waiting for it (for the next Enter) once the session ends.
    runtime.shutdown_background();
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("monarch-host debug: error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn session(args: DebugArgs) -> Result<(), String> {
    let (endpoint, token) = match (&args.server, &args.addr, &args.token_file) {
        (Some(server), _, token_file) => {
            let job = args
                .target
                .as_deref()
                .ok_or("with --server, give the job id: monarch-host debug --server URL JOB")?;
            let job: u64 = job.parse().map_err(|_| {
                format!("`{job}` is not a job id (a number, as `monarch-host jobs` lists them)")
            })?;
            let token = token_file.as_deref().map(read_token).transpose()?;
            let client = ApiClient::new(server, token, Duration::from_secs(30))?;
            return server_session(&client, job).await;
        }
        (None, Some(addr), Some(file)) => (Endpoint::Tcp(addr.clone()), read_token(file)?),
        _ => {
            let record = super::runs::find(args.target.as_deref())?;
            if record.debug_addr.is_none() {
                eprintln!(
                    "monarch-host debug: note: run {} has breakpoints off (start it with --debug-listen 127.0.0.1:0); nothing will pause",
                    record.id
                );
            }
            (Endpoint::Unix(record.control), record.token)
        }
    };
    let (read, mut write) = connect(&endpoint, &token, "client", json!({})).await?;
    let mut from_hub = BufReader::new(read).lines();
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    loop {
        tokio::select! {
            line = from_hub.next_line() => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) => {
                        println!("\nthe run has ended");
                        return Ok(());
                    }
                    Err(e) => return Err(format!("reading from the run: {e}")),
                };
                if show(&line)? {
                    return Ok(());
                }
            }
            line = stdin.next_line(), if stdin_open => {
                match line {
                    Ok(Some(line)) => {
                        let mut message = json!({ "line": line }).to_string();
                        message.push('\n');
                        write
                            .write_all(message.as_bytes())
                            .await
                            .map_err(|e| format!("the run went away: {e}"))?;
                    }
                    // End of input: leave as `quit` would.
                    _ => {
                        stdin_open = false;
                        let mut message = json!({ "line": "quit" }).to_string();
                        message.push('\n');
                        let _ = write.write_all(message.as_bytes()).await;
                    }
                }
            }
        }
    }
}

/// Prints one line the hub sent (its text, then its prompt); true after
/// its `bye`.
fn show(line: &str) -> Result<bool, String> {
    let said: Value =
        serde_json::from_str(line).map_err(|e| format!("the run sent a bad line: {e}"))?;
    if let Some(error) = said.get("error").and_then(Value::as_str) {
        return Err(error.to_string());
    }
    let mut out = std::io::stdout().lock();
    if let Some(text) = said.get("out").and_then(Value::as_str) {
        let _ = out.write_all(text.as_bytes());
    }
    if let Some(prompt) = said.get("prompt").and_then(Value::as_str) {
        let _ = out.write_all(prompt.as_bytes());
    }
    let _ = out.flush();
    Ok(said.get("bye").and_then(Value::as_bool) == Some(true))
}

/// `debug --server URL JOB`: the session through a debug bridge of the
/// server, which alone is reached (its HTTP address and token); the
/// bridge is closed on the way out unless it ended by itself.
async fn server_session(client: &ApiClient, job: u64) -> Result<(), String> {
    let opened = client.debug_bridge(job).await?;
    let bridge = opened
        .get("bridge")
        .and_then(Value::as_str)
        .ok_or("the server's answer has no `bridge`")?
        .to_string();
    let bridged = bridged_session(client, job, &bridge).await;
    if bridged.is_err() {
        let closing = client.debug_bridge_close(job, &bridge);
        let _ = tokio::time::timeout(Duration::from_secs(5), closing).await;
    }
    bridged
}

async fn bridged_session(client: &ApiClient, job: u64, bridge: &str) -> Result<(), String> {
    let mut response = client.debug_bridge_stream(job, bridge).await?;
    // The stream is read by a task of its own, so that a line typed is
    // sent while the hub's output keeps coming.
    let (events_tx, mut events) =
        tokio::sync::mpsc::channel::<Result<(String, String), String>>(64);
    let reader = tokio::spawn(async move {
        let mut parser = SseParser::default();
        loop {
            let failure = match tokio::time::timeout(STREAM_SILENCE, response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    for event in parser.feed(&chunk) {
                        if events_tx.send(Ok(event)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                Ok(Ok(None)) => "the server closed the debug stream".to_string(),
                Ok(Err(e)) => format!("the debug stream was cut off: {e}"),
                Err(_) => format!("the server sent nothing for {} s", STREAM_SILENCE.as_secs()),
            };
            let _ = events_tx.send(Err(failure)).await;
            return;
        }
    });
    let _reader = AbortOnDrop(reader);
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    loop {
        tokio::select! {
            event = events.recv() => {
                let (event, data) = match event {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => return Err(e),
                    None => return Err("the server closed the debug stream".into()),
                };
                match event.as_str() {
                    "hub" if show(&data)? => return Ok(()),
                    "end" => {
                        let end: Value = serde_json::from_str(&data).unwrap_or_default();
                        if end.get("job_ended").and_then(Value::as_bool) == Some(true) {
                            println!("\nthe run has ended");
                            return Ok(());
                        }
                        let reason = end.get("reason").and_then(Value::as_str).unwrap_or("closed");
                        return Err(format!("the server closed the debug session: {reason}"));
                    }
                    _ => {}
                }
            }
            line = stdin.next_line(), if stdin_open => {
                match line {
                    Ok(Some(line)) => {
                        client
                            .debug_bridge_input(job, bridge, &line)
                            .await
                            .map_err(|e| format!("the run went away: {e}"))?;
                    }
                    // End of input: leave as `quit` would.
                    _ => {
                        stdin_open = false;
                        let _ = client.debug_bridge_input(job, bridge, "quit").await;
                    }
                }
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
