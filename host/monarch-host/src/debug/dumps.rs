//! Post-mortem records of trapped actors ("dumps").
//!
//! A trap ends an actor's instance, and with it the memory and stack that
//! would say what went wrong; the callers hear only the trap's reason. A
//! run with dumps on keeps, for each trap, a record in the run's dump
//! directory on the host where the actor ran:
//!
//! - `<mesh>-<rank>.json` ([`Record`]): who trapped (mesh, rank, host,
//!   pid), in which endpoint, why and when, and the guest's backtrace,
//!   innermost frame first, symbolized to functions and, where the program
//!   carries DWARF line tables, to files and lines. Frames of the standard
//!   library's panic machinery and of WASI adapters are marked `folded`,
//!   so that for a Rust panic the first frame that is not names the
//!   function that panicked.
//! - `<mesh>-<rank>.coredump`: a standard Wasm core dump (the
//!   tool-conventions `Coredump.md` format, as wasmtime writes it) of the
//!   instance's memories, globals and stack, for Wasm debuggers. wasmtime
//!   writes every byte of every memory, so when the instance's memory is
//!   larger than [`DumpConfig::max_memory`] the core dump is left out and
//!   the record says why.
//!
//! The fault the actor's callers and owner see ends with
//! `(post-mortem: <path of the record>)`. `monarch-host run` keeps dumps
//! under `<cache>/dumps/<RUN>` ([`for_local_run`]; `--no-dumps` turns them
//! off), `monarch-host serve` under `<data>/dumps/<job>` ([`for_job`]);
//! `monarch-host dumps list` and `dumps show` read them ([`command`]).
//!
//! Invariants:
//!
//! - DU-1: a record that can be read is whole: it is written aside and
//!   renamed into place (its name is held meanwhile by an empty file,
//!   which readers skip).
//! - DU-2: no record replaces another: a second trap under the same mesh
//!   name and rank in one run is `<mesh>-<rank>.2.json`.
//! - DU-3: a record that cannot be written changes nothing else: the fault
//!   is the one a run without dumps gets, and a warning says why.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hyperactor_mesh::Fault;
use serde::{Deserialize, Serialize};
use wasmtime::{AsContextMut, FrameInfo, WasmBacktrace, WasmCoreDump};

/// Where a run's actors write their post-mortem records, and how much.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DumpConfig {
    /// The run's dump directory on each host; its name is the run's id.
    /// Made at the first trap.
    pub dir: PathBuf,
    /// Linear memory larger than this is left out of a core dump.
    pub max_memory: u64,
}

/// The memory a core dump holds at most unless configured otherwise.
pub const DEFAULT_MAX_MEMORY: u64 = 64 << 20;

/// The most bytes of core dumps one run's directory takes on one host;
/// past it, records are written without core dumps (and say so), so that
/// a mesh whose every actor traps does not fill the disk.
pub const MAX_RUN_COREDUMP_BYTES: u64 = 256 << 20;

/// How many runs from the command line keep their records: starting a
/// run removes the records of older ones.
pub const KEEP_LOCAL_RUNS: usize = 20;

/// The dump configuration of a run started from the command line: a new
/// directory `<cache>/dumps/<RUN>`, where RUN is the start time (UTC) and
/// this process's id, e.g. `20261202-121501-4242`, so that runs sort by
/// when they started. The directory is made at the first trap; the
/// records of all but the newest [`KEEP_LOCAL_RUNS`] earlier runs are
/// removed now.
pub fn for_local_run() -> Option<DumpConfig> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let run = format!("{}-{}", compact_utc(now.as_secs()), std::process::id());
    // Absolute, since procs elsewhere (and the fault's reader) get it.
    let root = local_root();
    let root = std::path::absolute(&root).unwrap_or(root);
    prune_local_runs(&root, KEEP_LOCAL_RUNS);
    Some(DumpConfig {
        dir: root.join(run),
        max_memory: DEFAULT_MAX_MEMORY,
    })
}

/// Removes the directories of local runs (named as [`for_local_run`] names
/// them; nothing else) under `root` but the newest `keep`.
fn prune_local_runs(root: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut runs: Vec<String> = entries
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| is_local_run_id(name))
        .collect();
    runs.sort_by(|a, b| newest_first(a, b));
    for old in runs.iter().skip(keep) {
        if let Err(e) = std::fs::remove_dir_all(root.join(old)) {
            tracing::warn!(run = %old, "cannot remove old post-mortem records: {e}");
        }
    }
}

/// Whether `name` is a run id of [`for_local_run`]'s:
/// `YYYYMMDD-HHMMSS-PID`.
fn is_local_run_id(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    let digits = |part: &str, len: Option<usize>| {
        !part.is_empty()
            && part.bytes().all(|b| b.is_ascii_digit())
            && len.is_none_or(|len| part.len() == len)
    };
    parts.len() == 3
        && digits(parts[0], Some(8))
        && digits(parts[1], Some(6))
        && digits(parts[2], None)
}

/// The dump configuration of job `job` of a server whose data directory
/// is `data`: `<data>/dumps/<job>`.
pub fn for_job(data: &Path, job: u64) -> DumpConfig {
    DumpConfig {
        dir: data.join("dumps").join(job.to_string()),
        max_memory: DEFAULT_MAX_MEMORY,
    }
}

/// Where runs from the command line keep their dumps: beside the compile
/// cache, or in the temporary directory (as the blob store).
pub fn local_root() -> PathBuf {
    crate::engine::cache_dir()
        .unwrap_or_else(|| std::env::temp_dir().join("monarch-host"))
        .join("dumps")
}

/// The post-mortem record of one trap, as `<mesh>-<rank>.json` holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Record {
    /// The actor mesh.
    pub mesh: String,
    /// The actor's rank in it.
    pub rank: u32,
    /// The host it ran on.
    pub host: String,
    /// The process (proc) it ran in.
    pub pid: u32,
    /// The export that trapped: an endpoint, or `create` or `supervise`.
    pub endpoint: String,
    /// The fault's kind, as WIT names it: `trap` or `out-of-memory`.
    pub kind: String,
    /// Why, as the trap says (without its backtrace).
    pub reason: String,
    /// When, in UTC (RFC 3339).
    pub time: String,
    /// The run's id: its dump directory's name.
    pub run: String,
    /// The sha256 of the program.
    pub program: String,
    /// The core dump's file name, beside this record; None when there is
    /// none, and `coredump_omitted` says why.
    pub coredump: Option<String>,
    /// Why there is no core dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coredump_omitted: Option<String>,
    /// The instance's linear memory at the trap, in bytes (all memories).
    pub memory_bytes: u64,
    /// The guest's backtrace, innermost first; a frame inlined into
    /// another comes before it.
    pub frames: Vec<Frame>,
}

/// One frame of a record's backtrace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Frame {
    /// The function, demangled, without hashes.
    pub function: String,
    /// Its source file, where the program has line tables.
    pub file: Option<String>,
    /// The line in `file`.
    pub line: Option<u32>,
    /// The core module the code is in.
    pub module: Option<String>,
    /// Machinery rather than the guest's own code: the standard library
    /// (panics, aborts, allocation), wasi-libc's exit, WASI adapters.
    pub folded: bool,
}

/// A record and its file name in its run's directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Dump {
    /// The record's file name, e.g. `workers-3.json`.
    pub file: String,
    /// What it says.
    pub record: Record,
}

/// The actor that trapped.
pub(crate) struct Trapped<'a> {
    pub(crate) mesh: &'a str,
    pub(crate) rank: u32,
    /// The program's sha256.
    pub(crate) program: &'a str,
}

/// Writes the post-mortem record of `error`, the trap that `fault`
/// describes, if `config` asks for records, and names the record's path
/// at the end of the fault's message (DU-3: if it cannot be written, a
/// warning says why and the fault is unchanged). `store` is the trapped
/// instance's: its memories go into the core dump.
pub(crate) async fn record(
    config: Option<&DumpConfig>,
    who: Trapped<'_>,
    store: impl AsContextMut,
    error: &wasmtime::Error,
    fault: &mut Fault,
) {
    let Some(config) = config else { return };
    let prepared = prepare(config, &who, store, error, fault);
    let dir = config.dir.clone();
    let written = tokio::task::spawn_blocking(move || prepared.write(&dir))
        .await
        .map_err(|e| format!("the writer failed: {e}"))
        .and_then(|written| written);
    match written {
        Ok(path) => {
            let _ = write!(fault.message, " (post-mortem: {})", path.display());
        }
        Err(why) => tracing::warn!(
            mesh = who.mesh,
            rank = who.rank,
            dir = %config.dir.display(),
            "no post-mortem record of the trap: {why}"
        ),
    }
}

/// A record ready to be written, with its core dump.
pub(crate) struct Prepared {
    /// The file name the record and core dump start with.
    stem: String,
    record: Record,
    coredump: Option<Vec<u8>>,
}

/// Makes the record of `error` (and serializes its core dump, which needs
/// the store); writes nothing.
pub(crate) fn prepare(
    config: &DumpConfig,
    who: &Trapped<'_>,
    mut store: impl AsContextMut,
    error: &wasmtime::Error,
    fault: &Fault,
) -> Prepared {
    let dump = error.downcast_ref::<WasmCoreDump>();
    let memory_bytes: u64 = dump
        .map(|dump| {
            dump.memories()
                .iter()
                .map(|memory| memory.data_size(&store) as u64)
                .sum()
        })
        .unwrap_or(0);
    let (coredump, omitted) = match dump {
        None => (None, Some("the trap carried no core dump".to_string())),
        Some(_) if memory_bytes > config.max_memory => (
            None,
            Some(format!(
                "the instance's linear memory ({}) is larger than the core dump limit ({})",
                mib(memory_bytes),
                mib(config.max_memory)
            )),
        ),
        Some(_) if coredump_bytes_in(&config.dir) + memory_bytes > MAX_RUN_COREDUMP_BYTES => (
            None,
            Some(format!(
                "the run's core dumps on this host would take more than {}",
                mib(MAX_RUN_COREDUMP_BYTES)
            )),
        ),
        Some(dump) => {
            let name = format!("{}[{}]", who.mesh, who.rank);
            // wasmtime 48 panics serializing some components' dumps (a
            // QuickJS stack overflow: a global it did not index); the
            // record is written without the core dump then.
            let serialized = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dump.serialize(&mut store, &name)
            }));
            match serialized {
                Ok(bytes) => (Some(bytes), None),
                Err(_) => (
                    None,
                    Some(
                        "wasmtime could not write this component's core dump (it panicked)".into(),
                    ),
                ),
            }
        }
    };
    let frames = error
        .downcast_ref::<WasmBacktrace>()
        .map(|trace| trace.frames())
        .or(dump.map(|dump| dump.frames()))
        .unwrap_or_default();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let record = Record {
        mesh: who.mesh.to_string(),
        rank: who.rank,
        host: hostname(),
        pid: std::process::id(),
        endpoint: fault.endpoint.clone().unwrap_or_default(),
        kind: fault.kind.name().to_string(),
        reason: fault.message.clone(),
        time: rfc3339_utc(now),
        run: config
            .dir
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        program: who.program.to_string(),
        coredump: None,
        coredump_omitted: omitted,
        memory_bytes,
        frames: symbolize(frames),
    };
    Prepared {
        stem: file_stem(who.mesh, who.rank),
        record,
        coredump,
    }
}

impl Prepared {
    /// Writes the record (and its core dump) into `dir`, made if missing;
    /// returns the record's path.
    pub(crate) fn write(mut self, dir: &Path) -> Result<PathBuf, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let stem = claim(dir, &self.stem)?;
        let path = dir.join(format!("{stem}.json"));
        let written = (|| {
            if let Some(bytes) = &self.coredump {
                let name = format!("{stem}.coredump");
                match write_aside(&dir.join(&name), bytes) {
                    Ok(()) => self.record.coredump = Some(name),
                    Err(e) => {
                        self.record.coredump_omitted =
                            Some(format!("the core dump could not be written: {e}"))
                    }
                }
            }
            let json = serde_json::to_vec_pretty(&self.record)
                .map_err(|e| format!("cannot encode the record: {e}"))?;
            write_aside(&path, &json).map_err(|e| format!("cannot write {}: {e}", path.display()))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        written.map(|()| path)
    }
}

/// The bytes of the core dumps in `dir`.
fn coredump_bytes_in(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".coredump"))
        .filter_map(|entry| entry.metadata().ok())
        .map(|meta| meta.len())
        .sum()
}

/// Takes the first free name `stem`, `stem.2`, ... in `dir` by making its
/// record file, empty until the record is renamed over it (DU-1, DU-2).
fn claim(dir: &Path, stem: &str) -> Result<String, String> {
    for n in 1..=1000 {
        let candidate = match n {
            1 => stem.to_string(),
            n => format!("{stem}.{n}"),
        };
        let path = dir.join(format!("{candidate}.json"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => return Ok(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot write {}: {e}", path.display())),
        }
    }
    Err(format!(
        "{} already holds 1000 records of {stem}",
        dir.display()
    ))
}

/// Writes `bytes` beside `path`, then renames them into place.
fn write_aside(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = path.with_file_name(format!(".{name}.{}.part", std::process::id()));
    let written = std::fs::File::create(&aside).and_then(|mut file| file.write_all(bytes));
    let renamed = written.and_then(|()| std::fs::rename(&aside, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&aside);
    }
    renamed
}

/// `<mesh>-<rank>`, with what a file name should not hold replaced.
fn file_stem(mesh: &str, rank: u32) -> String {
    let mut safe: String = mesh
        .chars()
        .take(100)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' | '.' => c,
            _ => '_',
        })
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        safe.insert(0, '_');
    }
    format!("{safe}-{rank}")
}

/// The frames of a backtrace, innermost first, each wasm frame expanded
/// into the functions inlined at its address (innermost first too).
fn symbolize(trace: &[FrameInfo]) -> Vec<Frame> {
    let mut frames = Vec::new();
    for info in trace {
        let module = info.module().name().map(str::to_string);
        let own_name = || match info.func_name() {
            Some(name) => clean_name(name),
            None => format!("function #{}", info.func_index()),
        };
        let symbols = info.symbols();
        if symbols.is_empty() {
            let function = own_name();
            let folded = is_folded(&function, None, module.as_deref());
            frames.push(Frame {
                function,
                file: None,
                line: None,
                module,
                folded,
            });
            continue;
        }
        for (i, symbol) in symbols.iter().enumerate() {
            let function = match symbol.name() {
                Some(name) => demangle(name),
                // The outermost is the wasm function itself.
                None if i + 1 == symbols.len() => own_name(),
                None => "<inlined>".to_string(),
            };
            let file = symbol.file().map(str::to_string);
            let folded = is_folded(&function, file.as_deref(), module.as_deref());
            frames.push(Frame {
                function,
                file,
                line: symbol.line(),
                module: module.clone(),
                folded,
            });
        }
    }
    frames
}

/// The crates whose frames are machinery: the standard library and the
/// runtime pieces it links in.
const FOLDED_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "panic_abort",
    "panic_unwind",
    "__rustc",
    "compiler_builtins",
    "dlmalloc",
];

/// Functions without a crate path that are machinery: the panic and
/// allocation entry points and wasi-libc's exits.
const FOLDED_FUNCTIONS: &[&str] = &[
    "abort",
    "exit",
    "_Exit",
    "_exit",
    "rust_begin_unwind",
    "rust_panic",
    "rust_oom",
];

/// Whether a frame is machinery rather than the guest's own code (see
/// [`Frame::folded`]).
fn is_folded(function: &str, file: Option<&str>, module: Option<&str>) -> bool {
    // The WASI adapter and the shims wit-component adds.
    if module.is_some_and(|m| m.starts_with("wit-component:")) {
        return true;
    }
    // The standard library's sources, as rustc records them.
    if file.is_some_and(|f| f.starts_with("/rustc/")) {
        return true;
    }
    if FOLDED_FUNCTIONS.contains(&function)
        || ["__rust_", "__rdl_", "__rg_", "__wasi_", "__wasilibc_"]
            .iter()
            .any(|prefix| function.starts_with(prefix))
    {
        return true;
    }
    // `std::panicking::...`, `<alloc::boxed::Box<F> as core::ops::Fn>::call`:
    // the crate that the path (or the impl's self type) starts with.
    let path = function.trim_start_matches(['<', '&', '*']);
    let path = path.strip_prefix("mut ").unwrap_or(path);
    let krate = path.split("::").next().unwrap_or(path);
    path.contains("::") && FOLDED_CRATES.contains(&krate)
}

/// A symbol name as DWARF holds it (mangled, usually), demangled and
/// cleaned as [`clean_name`] does.
fn demangle(name: &str) -> String {
    match rustc_demangle::try_demangle(name) {
        Ok(demangled) => clean_name(&format!("{demangled:#}")),
        Err(_) => clean_name(name),
    }
}

/// A function name without the hashes of Rust symbols: the crate
/// disambiguators (`std[d123b7a1a2ed1472]::`) and the trailing
/// `::h3bf1f6db5552fa60`.
fn clean_name(name: &str) -> String {
    let name = match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            head
        }
        _ => name,
    };
    let mut clean = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let close = after.find(']');
        let is_hash = close.is_some_and(|close| {
            close > 0 && after[..close].bytes().all(|b| b.is_ascii_hexdigit())
        });
        match (close, is_hash) {
            (Some(close), true) => {
                clean.push_str(&rest[..open]);
                rest = &after[close + 1..];
            }
            _ => {
                clean.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    clean.push_str(rest);
    clean
}

/// This machine's name.
fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: gethostname writes at most `buffer.len()` bytes into it.
    let rc = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// A size in MiB, for sentences.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// The UTC calendar date and time of `secs` seconds since 1970:
/// (year, month, day, hour, minute, second).
fn utc(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let of_day = (secs % 86_400) as u32;
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (
        year,
        month,
        day,
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60,
    )
}

/// `20261202-121501`: a run id's time, sortable.
pub(crate) fn compact_utc(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = utc(secs);
    format!("{y:04}{mo:02}{d:02}-{h:02}{mi:02}{s:02}")
}

/// `2026-12-02T12:15:01.123Z`.
fn rfc3339_utc(since_epoch: Duration) -> String {
    let (y, mo, d, h, mi, s) = utc(since_epoch.as_secs());
    let ms = since_epoch.subsec_millis();
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

// ---- reading records -------------------------------------------------------

/// A run's directory and its records.
#[derive(Debug, Serialize)]
pub struct Run {
    /// The run's id: its directory's name.
    pub run: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Its records, by file name.
    pub dumps: Vec<Dump>,
}

/// The records in `dir`, by mesh and rank. A record being written (an
/// empty file, DU-1) is skipped; one that cannot be read is an error that
/// names it.
pub fn read_dumps(dir: &Path) -> Result<Vec<Dump>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut dumps = Vec::new();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if !file.ends_with(".json") || file.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if bytes.is_empty() {
            continue;
        }
        let record: Record = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not a post-mortem record: {e}", path.display()))?;
        dumps.push(Dump { file, record });
    }
    dumps.sort_by(|a, b| {
        (&a.record.mesh, a.record.rank, &a.record.time, &a.file).cmp(&(
            &b.record.mesh,
            b.record.rank,
            &b.record.time,
            &b.file,
        ))
    });
    Ok(dumps)
}

/// The runs under `root` that have records, newest first: run ids that
/// are numbers (a server's jobs) by number, others (`20261202-121501-4242`)
/// by name.
pub fn read_runs(root: &Path) -> Result<Vec<Run>, String> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", root.display())),
    };
    let mut runs = Vec::new();
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let dir = entry.path();
        let dumps = read_dumps(&dir)?;
        if dumps.is_empty() {
            continue;
        }
        runs.push(Run {
            run: entry.file_name().to_string_lossy().into_owned(),
            dir,
            dumps,
        });
    }
    runs.sort_by(|a, b| newest_first(&a.run, &b.run));
    Ok(runs)
}

fn newest_first(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => b.cmp(&a),
        _ => b.cmp(a),
    }
}

/// Whether `file` may be served from a run's directory: a record or a
/// core dump by its plain name, nothing that leads elsewhere.
pub fn is_dump_file_name(file: &str) -> bool {
    !file.is_empty()
        && !file.starts_with('.')
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && (file.ends_with(".json") || file.ends_with(".coredump"))
}

// ---- the command -------------------------------------------------------------

/// `monarch-host dumps`.
#[derive(Debug, clap::Args)]
pub struct DumpsArgs {
    /// The directory of runs to read: a server's `<data>/dumps`, say.
    /// Default: where `monarch-host run` writes them (`$MONARCH_CACHE_DIR/dumps`,
    /// else `~/.cache/monarch-host/dumps`).
    #[arg(long, global = true, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: DumpsCommand,
}

/// The subcommands of `monarch-host dumps`.
#[derive(Debug, clap::Subcommand)]
pub enum DumpsCommand {
    /// Lists the runs with records, newest first, and their records: mesh,
    /// rank, endpoint and reason.
    List {
        /// Prints the runs and their whole records as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Shows the record of one actor: why it trapped, where (the
    /// backtrace, innermost first, with the standard library's panic
    /// machinery folded) and its core dump.
    ///
    /// Example: monarch-host dumps show latest workers 3
    Show {
        /// The run, as `dumps list` names it, or `latest`.
        run: String,
        /// The actor mesh.
        mesh: String,
        /// The rank.
        rank: u32,
        /// Shows the folded frames too.
        #[arg(long)]
        all: bool,
        /// Prints the record as JSON, as it is on disk.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `monarch-host dumps`.
pub fn command(args: DumpsArgs) -> std::process::ExitCode {
    let root = args.dir.unwrap_or_else(local_root);
    let done = match args.command {
        DumpsCommand::List { json } => list(&root, json),
        DumpsCommand::Show {
            run,
            mesh,
            rank,
            all,
            json,
        } => show(&root, &run, &mesh, rank, all, json),
    };
    match done {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("monarch-host dumps: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// What `dumps list` prints.
fn list(root: &Path, json: bool) -> Result<String, String> {
    let runs = read_runs(root)?;
    if json {
        return serde_json::to_string_pretty(&runs)
            .map(|text| text + "\n")
            .map_err(|e| e.to_string());
    }
    if runs.is_empty() {
        return Ok(format!(
            "no post-mortem records in {} (an actor that traps in `monarch-host run` writes one)\n",
            root.display()
        ));
    }
    let mut out = String::new();
    for run in &runs {
        let count = match run.dumps.len() {
            1 => "1 record".to_string(),
            n => format!("{n} records"),
        };
        let _ = writeln!(out, "{}  ({count}, {})", run.run, run.dir.display());
        let rows: Vec<[String; 4]> = run
            .dumps
            .iter()
            .map(|dump| {
                let r = &dump.record;
                [
                    r.mesh.clone(),
                    r.rank.to_string(),
                    r.endpoint.clone(),
                    format!("{}: {}", r.kind, r.reason),
                ]
            })
            .collect();
        let header = ["MESH", "RANK", "ENDPOINT", "REASON"].map(String::from);
        let widths: Vec<usize> = (0..3)
            .map(|i| {
                std::iter::once(&header)
                    .chain(&rows)
                    .map(|row| row[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in std::iter::once(&header).chain(&rows) {
            let _ = writeln!(
                out,
                "  {:w0$}  {:w1$}  {:w2$}  {}",
                row[0],
                row[1],
                row[2],
                row[3],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "`monarch-host dumps show RUN MESH RANK` shows one record."
    );
    Ok(out)
}

/// What `dumps show` prints.
fn show(
    root: &Path,
    run: &str,
    mesh: &str,
    rank: u32,
    all: bool,
    json: bool,
) -> Result<String, String> {
    let dir = match run {
        "latest" => read_runs(root)?
            .into_iter()
            .next()
            .map(|run| run.dir)
            .ok_or_else(|| format!("no runs with records in {}", root.display()))?,
        _ => {
            let dir = root.join(run);
            if run.contains(['/', '\\']) || run.starts_with('.') || !dir.is_dir() {
                return Err(format!(
                    "no run `{run}` in {}; `monarch-host dumps list` lists the runs",
                    root.display()
                ));
            }
            dir
        }
    };
    let dumps = read_dumps(&dir)?;
    let (matching, others): (Vec<&Dump>, Vec<&Dump>) = dumps
        .iter()
        .partition(|dump| dump.record.mesh == mesh && dump.record.rank == rank);
    if matching.is_empty() {
        let have: Vec<String> = others
            .iter()
            .map(|dump| format!("{} {}", dump.record.mesh, dump.record.rank))
            .collect();
        return Err(format!(
            "run `{}` has no record of {mesh}[{rank}]; it has records of: {}",
            dir.file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_default(),
            match have.is_empty() {
                true => "none".to_string(),
                false => have.join(", "),
            }
        ));
    }
    let mut out = String::new();
    for dump in matching {
        if json {
            let text = serde_json::to_string_pretty(&dump.record).map_err(|e| e.to_string())?;
            out.push_str(&text);
            out.push('\n');
        } else {
            out.push_str(&readable(&dir, dump, all));
        }
    }
    Ok(out)
}

/// A record as `dumps show` prints it.
fn readable(dir: &Path, dump: &Dump, all: bool) -> String {
    let r = &dump.record;
    let mut out = String::new();
    let _ = writeln!(out, "{}[{}] of run {}", r.mesh, r.rank, r.run);
    let _ = writeln!(out, "  reason:   {}: {}", r.kind, r.reason);
    let _ = writeln!(out, "  endpoint: {}", r.endpoint);
    let _ = writeln!(out, "  when:     {} on {} (pid {})", r.time, r.host, r.pid);
    let _ = writeln!(out, "  program:  sha256 {}", r.program);
    let _ = writeln!(out, "  record:   {}", dir.join(&dump.file).display());
    let _ = writeln!(out, "backtrace, innermost first:");
    if r.frames.is_empty() {
        let _ = writeln!(out, "  (no frames)");
    }
    let folded_run = |out: &mut String, hidden: usize| {
        let _ = match hidden {
            1 => writeln!(out, "  ... 1 frame of machinery folded (--all shows it)"),
            n => writeln!(
                out,
                "  ... {n} frames of machinery (the standard library, panics, WASI) folded (--all shows them)"
            ),
        };
    };
    let mut hidden = 0;
    for frame in &r.frames {
        if frame.folded && !all {
            hidden += 1;
            continue;
        }
        if hidden > 0 {
            folded_run(&mut out, hidden);
            hidden = 0;
        }
        let location = match (&frame.file, frame.line, &frame.module) {
            (Some(file), Some(line), _) => format!("{file}:{line}"),
            (Some(file), None, _) => file.clone(),
            (None, _, Some(module)) => format!("in {module}"),
            (None, _, None) => "unknown location".to_string(),
        };
        let mark = if frame.folded { "  [folded]" } else { "" };
        let _ = writeln!(out, "  {} ({location}){mark}", frame.function);
    }
    if hidden > 0 {
        folded_run(&mut out, hidden);
    }
    match (&r.coredump, &r.coredump_omitted) {
        (Some(name), _) => {
            let _ = writeln!(out, "coredump: {}", dir.join(name).display());
        }
        (None, Some(why)) => {
            let _ = writeln!(out, "coredump: none: {why}");
        }
        (None, None) => {
            let _ = writeln!(out, "coredump: none");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyperactor_mesh::FaultKind;

    #[test]
    fn utc_dates_are_the_calendars() {
        assert_eq!(utc(0), (1970, 1, 1, 0, 0, 0));
        // A leap day, and the day after a century's.
        assert_eq!(utc(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(utc(951_868_800 + 3_599), (2000, 3, 1, 0, 59, 59));
        assert_eq!(compact_utc(1_764_677_701), "20251202-121501");
        assert_eq!(
            rfc3339_utc(Duration::from_millis(1_764_677_701_042)),
            "2025-12-02T12:15:01.042Z"
        );
    }

    #[test]
    fn only_the_newest_local_runs_keep_their_records() {
        let root = scratch("prune");
        let names = [
            "20251202-121501-7",
            "20251202-121502-1",
            "20261202-090000-3",
            "20261202-090000-4",
            "7",
            "notes",
        ];
        for name in names {
            std::fs::create_dir_all(root.join(name)).unwrap();
        }
        prune_local_runs(&root, 2);
        let mut left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // Job directories and anything else are not a local run's.
        assert_eq!(
            left,
            ["20261202-090000-3", "20261202-090000-4", "7", "notes"]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn runs_sort_newest_first_by_time_or_job_number() {
        let mut names = vec![
            "20251202-121501-7",
            "20261202-090000-3",
            "20251202-121502-1",
        ];
        names.sort_by(|a, b| newest_first(a, b));
        assert_eq!(
            names,
            [
                "20261202-090000-3",
                "20251202-121502-1",
                "20251202-121501-7"
            ]
        );
        let mut jobs = vec!["9", "10", "2"];
        jobs.sort_by(|a, b| newest_first(a, b));
        assert_eq!(jobs, ["10", "9", "2"]);
    }

    #[test]
    fn names_lose_their_hashes_and_keep_their_paths() {
        assert_eq!(
            clean_name("std[d123b7a1a2ed1472]::panicking::panic_handler::{closure#0}"),
            "std::panicking::panic_handler::{closure#0}"
        );
        assert_eq!(
            clean_name("monarch_guest::executor::block_on_with::h3bf1f6db5552fa60"),
            "monarch_guest::executor::block_on_with"
        );
        assert_eq!(clean_name("slice[i]::get"), "slice[i]::get");
        assert_eq!(
            demangle("_ZN4core9panicking9panic_fmt17h0123456789abcdefE"),
            "core::panicking::panic_fmt"
        );
    }

    #[test]
    fn the_panic_machinery_is_folded_and_the_guests_code_is_not() {
        let folded = |function: &str| is_folded(function, None, Some("counter.wasm"));
        for machinery in [
            "abort",
            "std::sys::pal::wasi::helpers::abort_internal",
            "__rustc::__rust_start_panic",
            "__rust_alloc_error_handler",
            "core::panicking::panic_fmt",
            "<alloc::boxed::Box<F,A> as core::ops::function::Fn<Args>>::call",
            "rust_begin_unwind",
        ] {
            assert!(folded(machinery), "{machinery} is machinery");
        }
        for own in [
            "<counter::Counter as monarch_guest::actor::Handler<counter::Crash>>::handle::{closure#0}",
            "monarch_guest::executor::block_on_with",
            "counter::main",
            "monarch:host/actor-class@0.2.0#handle",
        ] {
            assert!(!folded(own), "{own} is the guest's");
        }
        assert!(is_folded(
            "fd_write",
            None,
            Some("wit-component:adapter:wasi_snapshot_preview1")
        ));
        assert!(is_folded(
            "<inlined>",
            Some("/rustc/abc/library/core/src/fmt/mod.rs"),
            None
        ));
    }

    #[test]
    fn file_names_hold_no_path() {
        assert_eq!(file_stem("workers", 3), "workers-3");
        assert_eq!(file_stem("j7.workers", 0), "j7.workers-0");
        assert_eq!(file_stem("../etc/x y", 1), "_.._etc_x_y-1");
        assert_eq!(file_stem("", 2), "_-2");
        assert!(is_dump_file_name("workers-3.json"));
        assert!(is_dump_file_name("workers-3.2.coredump"));
        for bad in [
            "../x.json",
            ".workers-3.json",
            "a/b.json",
            "workers-3.txt",
            "",
        ] {
            assert!(!is_dump_file_name(bad), "{bad}");
        }
    }

    /// A core module whose export `crash` (function 0, named `crash_here`)
    /// executes `unreachable`, with one page of memory that holds a byte.
    fn crashing_module() -> Vec<u8> {
        fn section(id: u8, body: &[u8]) -> Vec<u8> {
            let mut out = vec![id, body.len() as u8];
            out.extend_from_slice(body);
            out
        }
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        wasm.extend(section(1, &[1, 0x60, 0, 0])); // type 0: [] -> []
        wasm.extend(section(3, &[1, 0])); // function 0: type 0
        wasm.extend(section(5, &[1, 0, 1])); // memory 0: min 1 page
        wasm.extend(section(7, &[1, 5, b'c', b'r', b'a', b's', b'h', 0, 0]));
        wasm.extend(section(10, &[1, 3, 0, 0x00, 0x0b])); // unreachable
        wasm.extend(section(11, &[1, 0, 0x41, 0, 0x0b, 1, 42])); // data: [42] at 0
        // The name section: the module's name, then function 0's.
        let mut custom = vec![4];
        custom.extend_from_slice(b"name");
        custom.extend_from_slice(&[0, 9, 8]);
        custom.extend_from_slice(b"crashing");
        let name = b"crash_here";
        custom.extend_from_slice(&[1, 3 + name.len() as u8, 1, 0, name.len() as u8]);
        custom.extend_from_slice(name);
        wasm.extend(section(0, &custom));
        wasm
    }

    /// Traps the crashing module in a store of the host's engine; returns
    /// the store and the error.
    fn trap() -> (wasmtime::Store<()>, wasmtime::Error) {
        let shape = crate::engine::PoolShape::any_program(4, 64 << 20);
        trap_in(&crate::engine::pooled_engine(&shape).unwrap())
    }

    fn trap_in(engine: &wasmtime::Engine) -> (wasmtime::Store<()>, wasmtime::Error) {
        let module = wasmtime::Module::new(engine, crashing_module()).unwrap();
        let mut store = wasmtime::Store::new(engine, ());
        store.set_epoch_deadline(1 << 40);
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
        let crash = instance
            .get_typed_func::<(), ()>(&mut store, "crash")
            .unwrap();
        let error = crash.call(&mut store, ()).unwrap_err();
        (store, error)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("monarch-dumps-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_trap_writes_a_record_and_a_core_dump_that_the_reader_finds() {
        let (mut store, error) = trap();
        let root = scratch("write");
        let config = DumpConfig {
            dir: root.join("20251202-121501-1"),
            max_memory: DEFAULT_MAX_MEMORY,
        };
        let fault = crate::wasm_actor::trap_fault(&error, "crash", None);
        let who = Trapped {
            mesh: "workers",
            rank: 3,
            program: "abc",
        };
        let path = prepare(&config, &who, &mut store, &error, &fault)
            .write(&config.dir)
            .unwrap();
        assert_eq!(path, config.dir.join("workers-3.json"));
        let dumps = read_dumps(&config.dir).unwrap();
        assert_eq!(dumps.len(), 1);
        let record = &dumps[0].record;
        assert_eq!(
            (record.mesh.as_str(), record.rank, record.endpoint.as_str()),
            ("workers", 3, "crash")
        );
        assert_eq!(record.kind, "trap");
        assert_eq!(record.run, "20251202-121501-1");
        assert!(record.reason.contains("unreachable"), "{}", record.reason);
        assert_eq!(record.memory_bytes, 65_536);
        assert_eq!(record.frames[0].function, "crash_here");
        assert_eq!(record.frames[0].module.as_deref(), Some("crashing"));
        assert!(!record.frames[0].folded);
        // The core dump is a Wasm module with the `core` section first,
        // and holds the memory's byte.
        let coredump = std::fs::read(config.dir.join("workers-3.coredump")).unwrap();
        assert_eq!(record.coredump.as_deref(), Some("workers-3.coredump"));
        assert!(coredump.starts_with(b"\0asm\x01\0\0\0\0"));
        assert!(coredump.windows(4).any(|w| w == b"core"));
        // A second trap under the same name takes the next one (DU-2).
        let again = prepare(&config, &who, &mut store, &error, &fault)
            .write(&config.dir)
            .unwrap();
        assert_eq!(again, config.dir.join("workers-3.2.json"));
        let runs = read_runs(&root).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].dumps.len(), 2);
        let shown = show(&root, "latest", "workers", 3, false, false).unwrap();
        assert!(shown.contains("crash_here (in crashing)"), "{shown}");
        let missing = show(&root, "latest", "workers", 4, false, false).unwrap_err();
        assert!(missing.contains("no record of workers[4]"), "{missing}");
        assert!(missing.contains("workers 3"), "{missing}");
        let unknown = show(&root, "nope", "workers", 3, false, false).unwrap_err();
        assert!(unknown.contains("no run `nope`"), "{unknown}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn memory_over_the_limit_leaves_the_core_dump_out_and_says_so() {
        let (mut store, error) = trap();
        let root = scratch("limit");
        let config = DumpConfig {
            dir: root.join("1"),
            max_memory: 1024,
        };
        let fault = Fault::new(FaultKind::Trap, "wasm trap").at_endpoint("crash");
        let who = Trapped {
            mesh: "big",
            rank: 0,
            program: "abc",
        };
        prepare(&config, &who, &mut store, &error, &fault)
            .write(&config.dir)
            .unwrap();
        let dumps = read_dumps(&config.dir).unwrap();
        let record = &dumps[0].record;
        assert_eq!(record.coredump, None);
        let why = record.coredump_omitted.as_deref().unwrap_or_default();
        assert!(why.contains("larger than the core dump limit"), "{why}");
        assert!(!config.dir.join("big-0.coredump").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_trap_text_leaves_the_core_dump_summary_out() {
        let (_store, error) = trap();
        assert!(error.downcast_ref::<WasmCoreDump>().is_some());
        let text = crate::wasm_actor::trap_text(&error);
        assert!(!text.contains("coredump"), "{text}");
        assert!(text.contains("crash_here"), "{text}");
        assert!(text.contains("Caused by:"), "{text}");
        assert!(text.contains("unreachable"), "{text}");
        let fault = crate::wasm_actor::trap_fault(&error, "crash", None);
        assert!(!fault.message.contains("coredump"), "{}", fault.message);
        let backtrace = fault.backtrace.unwrap_or_default();
        assert!(!backtrace.contains("coredump"), "{backtrace}");
        // Without a core dump it is the error's `{:?}`, as logs and
        // messages showed traps before.
        let (_store, plain) = trap_in(&wasmtime::Engine::default());
        assert!(plain.downcast_ref::<WasmCoreDump>().is_none());
        assert_eq!(crate::wasm_actor::trap_text(&plain), format!("{plain:?}"));
    }
}
