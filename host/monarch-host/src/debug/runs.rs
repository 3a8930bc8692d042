//! Runs from the command line that debuggers can find: while it runs,
//! each keeps a record of itself (`runs/<id>.json` in the cache
//! directory, readable by its user only) and a debug hub on the unix
//! socket beside it. `monarch-host debug` and `monarch-host stacks` read
//! the newest record of a live run, or the one they are given.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::hub::Hub;
use super::pause::DebugConfig;
use crate::host::LogSink;
use crate::{RunError, Sandbox};

/// How a run from the command line is debugged.
#[derive(Debug, Clone)]
pub struct Debugging {
    /// `--debug-listen`: breakpoints on, the hub on this address.
    pub listen: Option<String>,
    /// `--debug-pause-limit`.
    pub pause_limit: Duration,
    /// `--debug`: the program runs on the debug engine
    /// ([`super::engine`]); the hub listens on `listen`, or on
    /// `127.0.0.1:0` when none is given.
    pub engine: bool,
    /// `--break`: where every actor of the run stops, from its start.
    pub breaks: Vec<String>,
}

/// What a live run says of itself.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    /// The run's id (also its record's name).
    pub id: String,
    /// The process that runs it.
    pub pid: u32,
    /// The program it runs.
    pub program: String,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// Its hub's unix socket.
    pub control: PathBuf,
    /// Its hub's TCP address, when debugging is on.
    pub debug_addr: Option<String>,
    /// The secret its hub asks for.
    pub token: String,
}

/// Where run records are kept.
pub fn runs_dir() -> PathBuf {
    crate::engine::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("monarch-host"))
        .join("runs")
}

/// A random secret, hex.
pub(crate) fn random_token() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom for a token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The records of live runs, newest first; records of runs that are gone
/// are removed.
pub fn live_runs() -> Vec<RunRecord> {
    let dir = runs_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut runs: Vec<RunRecord> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Ok(record) = serde_json::from_str::<RunRecord>(&text) else {
            continue;
        };
        if !alive(record.pid) {
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(&record.control);
            continue;
        }
        runs.push(record);
    }
    runs.sort_by(|a, b| b.started_ms.cmp(&a.started_ms).then(b.id.cmp(&a.id)));
    runs
}

/// The live run `run` (an id), or the newest live run.
pub fn find(run: Option<&str>) -> Result<RunRecord, String> {
    let runs = live_runs();
    match run {
        Some(id) => runs.into_iter().find(|r| r.id == id).ok_or_else(|| {
            format!(
                "no live run `{id}` on this machine (records in {})",
                runs_dir().display()
            )
        }),
        None => runs.into_iter().next().ok_or_else(|| {
            "no live `monarch-host run` on this machine; start one (with --debug-listen for breakpoints), or give --server URL JOB".to_string()
        }),
    }
}

/// A run's record, removed when dropped.
struct Recorded(PathBuf, PathBuf);

impl Drop for Recorded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(&self.1);
    }
}

/// Runs a program from the command line, findable by debuggers: with a
/// record and a hub; with `debugging.listen`, breakpoints pause.
pub async fn run_local(
    app: &std::path::Path,
    libraries: &[(String, PathBuf)],
    args: &[String],
    mut sandbox: Sandbox,
    log: LogSink,
    debugging: Debugging,
) -> Result<(), RunError> {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    // The run's id is its dump directory's name when it has one, so that
    // `dumps show RUN` and `debug RUN` name a run alike.
    let id = sandbox
        .dumps
        .as_ref()
        .and_then(|dumps| dumps.dir.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| {
            format!(
                "{}-{}",
                super::dumps::compact_utc(started.as_secs()),
                std::process::id()
            )
        });
    let token = random_token().map_err(RunError::Host)?;
    let dir = runs_dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| RunError::Host(format!("cannot create {}: {e}", dir.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
    }
    let control = dir.join(format!("{id}.sock"));
    let listen = match (&debugging.listen, debugging.engine) {
        (None, true) => Some("127.0.0.1:0".to_string()),
        (listen, _) => listen.clone(),
    };
    let hub = Hub::start(
        token.clone(),
        &control,
        listen.as_deref(),
        debugging.pause_limit,
        sandbox.live.clone(),
    )
    .await
    .map_err(RunError::Host)?;
    sandbox.debug_engine = debugging.engine;
    hub.engine
        .add_breakpoints(&debugging.breaks)
        .map_err(|e| RunError::Host(format!("--break {e}")))?;
    let debug_addr = hub.tcp.map(|addr| addr.to_string());
    if let Some(addr) = &debug_addr {
        sandbox.debug = Some(DebugConfig {
            addr: addr.clone(),
            token: token.clone(),
            pause_limit_ms: u64::try_from(debugging.pause_limit.as_millis()).unwrap_or(u64::MAX),
        });
        let engine = match debugging.engine {
            true => " (debug engine)",
            false => "",
        };
        eprintln!(
            "monarch-host: breakpoints are on{engine}; debug with `monarch-host debug` (hub at {addr}, run {id})"
        );
    }
    let record = RunRecord {
        id: id.clone(),
        pid: std::process::id(),
        program: app.display().to_string(),
        started_ms: u64::try_from(started.as_millis()).unwrap_or(u64::MAX),
        control: control.clone(),
        debug_addr,
        token,
    };
    let path = dir.join(format!("{id}.json"));
    write_private(
        &path,
        &serde_json::to_vec_pretty(&record).unwrap_or_default(),
    )
    .map_err(|e| RunError::Host(format!("cannot write {}: {e}", path.display())))?;
    let _recorded = Recorded(path, control);
    let outcome = crate::run_program_with(app, libraries, args, sandbox, log).await;
    drop(hub);
    outcome
}

/// Writes `bytes` to a new file at `path` that only its user can read.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)?.write_all(bytes)
}
