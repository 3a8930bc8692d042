//! `monarch-host debug`: the `monarch_dbg>` prompt of a run's debug hub.
//!
//! The client is a terminal: it sends each line typed to the hub and
//! prints what the hub sends (see [`super::hub`] for the commands).

use std::io::Write;
use std::process::ExitCode;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::hub::{Endpoint, connect};

/// `monarch-host debug`.
#[derive(Debug, clap::Args)]
pub struct DebugArgs {
    /// The run to debug, by the id it printed (default: the newest live
    /// run on this machine), or with --server the job id.
    #[arg(value_name = "RUN|JOB")]
    pub target: Option<String>,
    /// Debugs job JOB of this server (http://HOST:PORT), submitted with
    /// breakpoints on (`submit --debug`, or `"debug": true`).
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
    match runtime.block_on(session(args)) {
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
            let client = crate::serve::client::ApiClient::new(
                server,
                token,
                std::time::Duration::from_secs(30),
            )?;
            let found = client.debug_endpoint(job).await?;
            let field = |name: &str| {
                found
                    .get(name)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("the server's answer has no `{name}`"))
            };
            (Endpoint::Tcp(field("addr")?), field("token")?)
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
                let said: Value = serde_json::from_str(&line)
                    .map_err(|e| format!("the run sent a bad line: {e}"))?;
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
                if said.get("bye").and_then(Value::as_bool) == Some(true) {
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
