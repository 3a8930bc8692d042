//! The debug engine (`monarch-host run --debug`): breakpoints by source
//! line or function, stepping by source line, stops at traps and
//! interrupts of spinning actors, for compiled guests.
//!
//! A run under `--debug` compiles its program on a second wasmtime engine
//! with guest-debug instrumentation ([`crate::engine::pooled_debug_engine`]):
//! every Wasm instruction can take a breakpoint, every frame's Wasm locals
//! can be read, and a trap stops before it unwinds. Each instance's store
//! gets a [`Debugger`] as its debug handler. When the guest reaches a
//! breakpoint, finishes a step, traps, or is interrupted, the handler
//! pauses the instance at the run's debug hub, exactly as `breakpoint!()`
//! does ([`super::pause`]): `monarch-host debug` lists it, attaches to it
//! and casts to it; the paused instance answers at its own prompt
//! ([`PROMPT`]: `bt`, `locals`, `break`, `step`, `next`, `finish`, `c`).
//!
//! Source lines come from the DWARF line tables of the component's core
//! modules (a program built with debug info: `debug = "line-tables-only"`
//! or more), function names from their name sections ([`Symbols`]).
//!
//! Invariants:
//! - DE-1: only engines made by `pooled_debug_engine` are instrumented, and
//!   only their stores get a handler; a normal run's engine, its compiled
//!   forms (cached apart: the compatibility hash covers `guest_debug`) and
//!   its speed are untouched.
//! - DE-2: a run's breakpoints live at its hub ([`Registry`]). Every
//!   instance of the run registers there when it is made, and applies the
//!   hub's set before each export it starts, at each epoch tick and at each
//!   stop; so `break` reaches every actor of the component, in every
//!   process, the running ones within a tick.
//! - DE-3: a stop is a pause at the hub: the guest's frames stay on its
//!   stack, intact, until it resumes.
//! - DE-4: stepping keeps the pause open, as pdb's stepping does;
//!   `continue` and the end of the export close it. An export starts with
//!   no step in progress.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use wasmtime::{
    AsContextMut, DebugEvent, DebugHandler, Engine, FrameHandle, Module, ModulePC, StoreContextMut,
    Val,
};

use super::pause::{DebugConfig, Whoami};
use super::select::Selection;
use crate::host::{Cluster, HostState};

/// The prompt of a paused instance of the debug engine.
pub const PROMPT: &str = "(wasm) ";

/// How long registering with the hub may take before the instance runs
/// on without it (no `break` or `interrupt` reaches it then).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// How many lines past the one asked for `break FILE:LINE` looks for code
/// (a blank line, a comment or a `}` has none).
const LINE_SLACK: u32 = 5;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The engines made with guest-debug instrumentation (DE-1).
static DEBUG_ENGINES: Mutex<Vec<wasmtime::EngineWeak>> = Mutex::new(Vec::new());

/// Notes that `engine` has guest-debug instrumentation.
pub(crate) fn remember(engine: &Engine) {
    let mut engines = lock(&DEBUG_ENGINES);
    engines.retain(|weak| weak.upgrade().is_some());
    engines.push(engine.weak());
}

/// Whether `engine` is a debug engine ([`crate::engine::pooled_debug_engine`]).
pub fn is_debug_engine(engine: &Engine) -> bool {
    lock(&DEBUG_ENGINES)
        .iter()
        .filter_map(|weak| weak.upgrade())
        .any(|other| Engine::same(&other, engine))
}

// ---------------------------------------------------------------------------
// Where to stop: breakpoint specifications.

/// A breakpoint as typed: `FILE:LINE` or `FUNCTION`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// Every place where code of `line` of a file whose path ends with
    /// `file` (at a `/`) begins.
    Line {
        /// The file, or the end of its path (`lib.rs`, `src/lib.rs`).
        file: String,
        /// The line, from 1.
        line: u32,
    },
    /// The start of every function named so (`compute`,
    /// `my_crate::compute`, or the full demangled name).
    Function(String),
}

impl Spec {
    /// Parses `FILE:LINE` or `FUNCTION`.
    pub fn parse(text: &str) -> Result<Spec, String> {
        let text = text.trim();
        let usage = "give FILE:LINE (e.g. lib.rs:42) or FUNCTION (e.g. my_crate::train)";
        if text.is_empty() || text.contains(char::is_whitespace) {
            return Err(format!("`{text}`: {usage}"));
        }
        if let Some((file, line)) = text.rsplit_once(':')
            && !file.is_empty()
            && !file.ends_with(':')
            && !line.is_empty()
            && line.bytes().all(|b| b.is_ascii_digit())
        {
            return match line.parse::<u32>() {
                Ok(line) if line > 0 => Ok(Spec::Line {
                    file: file.trim_start_matches("./").to_string(),
                    line,
                }),
                _ => Err(format!("`{text}`: lines are numbered from 1")),
            };
        }
        if text.ends_with(':') {
            return Err(format!("`{text}`: {usage}"));
        }
        Ok(Spec::Function(text.to_string()))
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spec::Line { file, line } => write!(f, "{file}:{line}"),
            Spec::Function(name) => f.write_str(name),
        }
    }
}

/// Whether `path` is `file` or ends with `/file`.
fn path_matches(path: &str, file: &str) -> bool {
    path == file
        || path
            .strip_suffix(file)
            .is_some_and(|head| head.ends_with('/'))
}

/// Whether the demangled function `name` is the one `wanted` names: the
/// same, or the same after a `::`.
fn function_matches(name: &str, wanted: &str) -> bool {
    name == wanted
        || name
            .strip_suffix(wanted)
            .is_some_and(|head| head.ends_with("::"))
}

/// `path` with `.` and `dir/..` taken out, as the file system would.
fn normalize(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|last| *last != "..") => {
                parts.pop();
            }
            ".." if absolute => {}
            part => parts.push(part),
        }
    }
    let joined = parts.join("/");
    match absolute {
        true => format!("/{joined}"),
        false => joined,
    }
}

// ---------------------------------------------------------------------------
// What the code is: the symbols of a core module.

/// What the debug engine knows of one core module of a component: its
/// functions (by the name section) and its source lines (by the DWARF
/// line tables), in module-relative PCs, which is what wasmtime's frames
/// and breakpoints speak.
pub struct Symbols {
    functions: Vec<Function>,
    rows: Vec<Row>,
    files: Vec<String>,
}

struct Function {
    /// Where its body starts and ends, as module PCs.
    start: u32,
    end: u32,
    /// Demangled, without the hash; `func[N]` when the module names none.
    name: String,
}

/// One row of a line table: from `pc` on, the code is of `line` of
/// `file` (none at the end of a sequence).
#[derive(Debug, Clone, Copy)]
struct Row {
    pc: u32,
    file: u32,
    line: u32,
    stmt: bool,
    end: bool,
    prologue_end: bool,
}

/// A source position: a file (its path) and a line.
type At = Option<(String, u32)>;

impl Symbols {
    /// Reads the core module `bytes` (its ids, name section and DWARF).
    /// What cannot be read is left out: a module without debug info has
    /// functions and no lines.
    pub fn read(bytes: &[u8]) -> Symbols {
        use wasmparser::{KnownCustom, Name, Parser, Payload, TypeRef};
        let mut imported = 0u32;
        let mut code_start = 0u32;
        let mut bodies: Vec<(u32, u32)> = Vec::new();
        let mut names: HashMap<u32, String> = HashMap::new();
        let mut dwarf: HashMap<String, &[u8]> = HashMap::new();
        for payload in Parser::new(0).parse_all(bytes) {
            let Ok(payload) = payload else { break };
            match payload {
                Payload::ImportSection(imports) => {
                    for import in imports.into_imports().flatten() {
                        if matches!(import.ty, TypeRef::Func(_) | TypeRef::FuncExact(_)) {
                            imported += 1;
                        }
                    }
                }
                Payload::CodeSectionStart { range, .. } => {
                    code_start = u32::try_from(range.start).unwrap_or(u32::MAX);
                }
                Payload::CodeSectionEntry(body) => {
                    let range = body.range();
                    if let (Ok(start), Ok(end)) =
                        (u32::try_from(range.start), u32::try_from(range.end))
                    {
                        bodies.push((start, end));
                    }
                }
                Payload::CustomSection(section) => {
                    if section.name().starts_with(".debug_") {
                        dwarf.insert(section.name().to_string(), section.data());
                    } else if let KnownCustom::Name(reader) = section.as_known() {
                        for name in reader.into_iter().flatten() {
                            if let Name::Function(map) = name {
                                for naming in map.into_iter().flatten() {
                                    names.insert(naming.index, demangle(naming.name));
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        let functions = bodies
            .iter()
            .enumerate()
            .map(|(i, &(start, end))| {
                let index = imported + i as u32;
                Function {
                    start,
                    end,
                    name: names
                        .remove(&index)
                        .unwrap_or_else(|| format!("func[{index}]")),
                }
            })
            .collect();
        let mut files = Vec::new();
        let mut rows = Vec::new();
        if let Err(e) = read_lines(&dwarf, code_start, &mut files, &mut rows) {
            tracing::debug!(error = %e, "the program's DWARF line tables could not be read");
        }
        // At one PC an end of sequence comes before the start of the next.
        rows.sort_by_key(|row| (row.pc, !row.end));
        Symbols {
            functions,
            rows,
            files,
        }
    }

    /// The function whose body holds `pc`.
    fn function(&self, pc: u32) -> Option<&Function> {
        let i = self.functions.partition_point(|f| f.start <= pc);
        self.functions.get(i.checked_sub(1)?).filter(|f| pc < f.end)
    }

    /// The source line of the code at `pc`, if the line tables say.
    fn at(&self, pc: u32) -> At {
        let i = self.rows.partition_point(|row| row.pc <= pc);
        let row = self.rows.get(i.checked_sub(1)?)?;
        if row.end || row.line == 0 {
            return None;
        }
        Some((self.files.get(row.file as usize)?.clone(), row.line))
    }

    /// The PCs where `spec` stops, and the line it stops at (for
    /// `FILE:LINE`, the first line at or after it that has code).
    fn places(&self, spec: &Spec) -> (Vec<u32>, Option<u32>) {
        match spec {
            Spec::Line { file, line } => {
                let files: HashSet<u32> = self
                    .files
                    .iter()
                    .enumerate()
                    .filter(|(_, path)| path_matches(path, file))
                    .map(|(i, _)| i as u32)
                    .collect();
                if files.is_empty() {
                    return (Vec::new(), None);
                }
                for line in *line..=line.saturating_add(LINE_SLACK) {
                    // The first PC of the line in each function it has code in.
                    let mut first: BTreeMap<u32, u32> = BTreeMap::new();
                    for row in &self.rows {
                        if row.end || !row.stmt || row.line != line || !files.contains(&row.file) {
                            continue;
                        }
                        let key = self.function(row.pc).map_or(row.pc, |f| f.start);
                        let pc = first.entry(key).or_insert(row.pc);
                        *pc = (*pc).min(row.pc);
                    }
                    if !first.is_empty() {
                        return (first.into_values().collect(), Some(line));
                    }
                }
                (Vec::new(), None)
            }
            Spec::Function(wanted) => {
                let pcs = self
                    .functions
                    .iter()
                    .filter(|f| function_matches(&f.name, wanted))
                    .map(|f| self.body_start(f))
                    .collect();
                (pcs, None)
            }
        }
    }

    /// Where a function's own code starts: past its prologue when the line
    /// tables mark it, else at its first line, else its first byte.
    fn body_start(&self, function: &Function) -> u32 {
        let from = self.rows.partition_point(|row| row.pc < function.start);
        let inside = self.rows[from..]
            .iter()
            .take_while(|row| row.pc < function.end)
            .filter(|row| !row.end && row.line != 0);
        let mut first = None;
        for row in inside {
            if row.prologue_end {
                return row.pc;
            }
            first.get_or_insert(row.pc);
        }
        first.unwrap_or(function.start)
    }
}

/// `name` demangled, without its hash (`stepper::compute`).
fn demangle(name: &str) -> String {
    match rustc_demangle::try_demangle(name) {
        Ok(demangled) => format!("{demangled:#}"),
        Err(_) => name.to_string(),
    }
}

/// Reads the line tables of the DWARF `sections` into `rows` (as module
/// PCs: DWARF addresses of Wasm are code-section relative) and `files`.
fn read_lines(
    sections: &HashMap<String, &[u8]>,
    code_start: u32,
    files: &mut Vec<String>,
    rows: &mut Vec<Row>,
) -> Result<(), gimli::Error> {
    use gimli::{EndianSlice, LittleEndian};
    let dwarf = gimli::Dwarf::load(|id| -> Result<_, gimli::Error> {
        let data = sections.get(id.name()).copied().unwrap_or(&[]);
        Ok(EndianSlice::new(data, LittleEndian))
    })?;
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let unit = dwarf.unit(header)?;
        let unit_ref = unit.unit_ref(&dwarf);
        let Some(program) = unit.line_program.clone() else {
            continue;
        };
        let comp_dir = unit
            .comp_dir
            .map(|dir| dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut local: HashMap<u64, u32> = HashMap::new();
        let mut sequence: Vec<Row> = Vec::new();
        let mut program_rows = program.rows();
        while let Some((header, row)) = program_rows.next_row()? {
            let file = match local.get(&row.file_index()) {
                Some(id) => *id,
                None => {
                    let mut path = comp_dir.clone();
                    if let Some(entry) = row.file(header) {
                        if entry.directory_index() != 0
                            && let Some(dir) = entry.directory(header)
                        {
                            push_path(&mut path, &unit_ref.attr_string(dir)?.to_string_lossy());
                        }
                        let name = unit_ref.attr_string(entry.path_name())?;
                        push_path(&mut path, &name.to_string_lossy());
                    }
                    let path = normalize(&path);
                    let next = files.len() as u32;
                    let id = *ids.entry(path.clone()).or_insert_with(|| {
                        files.push(path);
                        next
                    });
                    local.insert(row.file_index(), id);
                    id
                }
            };
            let pc = row.address().saturating_add(u64::from(code_start));
            sequence.push(Row {
                pc: u32::try_from(pc).unwrap_or(u32::MAX),
                file,
                line: row
                    .line()
                    .map_or(0, |l| u32::try_from(l.get()).unwrap_or(0)),
                stmt: row.is_stmt(),
                end: row.end_sequence(),
                prologue_end: row.prologue_end(),
            });
            if row.end_sequence() {
                // The linker points the line tables of the code it dropped
                // at address 0 (the code section's count, never code) or
                // past the end: those sequences describe nothing.
                let dead = sequence
                    .first()
                    .is_none_or(|first| first.pc <= code_start || first.pc == u32::MAX);
                if !dead {
                    rows.append(&mut sequence);
                }
                sequence.clear();
            }
        }
    }
    Ok(())
}

fn push_path(path: &mut String, part: &str) {
    // Absolute: `/...`, or with a scheme or drive (`wasisdk://...`, `C:/`).
    let scheme = part.find(":/").is_some_and(|at| !part[..at].contains('/'));
    if part.starts_with('/') || scheme {
        *path = part.to_string();
    } else {
        if !path.is_empty() && !path.ends_with('/') {
            path.push('/');
        }
        path.push_str(part);
    }
}

/// The symbols of the modules this process has debugged, read once each.
/// The modules are kept: a process that runs the debug engine runs one
/// program.
static SYMBOLS: Mutex<Vec<(Module, Arc<Symbols>)>> = Mutex::new(Vec::new());

/// The symbols of `module`; None when its bytes are not kept (not a debug
/// engine's module).
fn symbols(module: &Module) -> Option<Arc<Symbols>> {
    let mut known = lock(&SYMBOLS);
    if let Some((_, symbols)) = known.iter().find(|(m, _)| Module::same(m, module)) {
        return Some(symbols.clone());
    }
    let symbols = Arc::new(Symbols::read(module.debug_bytecode()?));
    known.push((module.clone(), symbols.clone()));
    Some(symbols)
}

// ---------------------------------------------------------------------------
// Where the guest is: its frames.

/// One Wasm frame of a stopped instance, innermost first. Valid only until
/// the instance runs again: never kept across an await.
struct Frame {
    handle: FrameHandle,
    module: Option<Module>,
    pc: Option<u32>,
}

impl Frame {
    fn symbols(&self) -> Option<Arc<Symbols>> {
        symbols(self.module.as_ref()?)
    }

    fn function(&self) -> String {
        let name = self
            .pc
            .zip(self.symbols())
            .and_then(|(pc, symbols)| symbols.function(pc).map(|f| f.name.clone()));
        name.unwrap_or_else(|| "<host trampoline>".into())
    }

    fn at(&self) -> At {
        let pc = self.pc?;
        self.symbols()?.at(pc)
    }

    fn location(&self) -> String {
        match (self.at(), self.pc) {
            (Some((file, line)), _) => format!("{file}:{line}"),
            (None, Some(pc)) => format!("wasm pc {pc:#x}"),
            (None, None) => "?".into(),
        }
    }

    /// The PC where the call this (outer) frame is in returns to: wasmtime
    /// places an outer frame at the instruction after its call.
    fn return_pc(&self) -> Option<u32> {
        self.pc
    }
}

/// The frames of the stopped instance, innermost first, through every
/// activation (Wasm that the host called from a host call).
fn frames(store: &mut StoreContextMut<'_, HostState>) -> Vec<Frame> {
    let exits: Vec<FrameHandle> = store.debug_exit_frames().collect();
    let mut frames = Vec::new();
    for exit in exits {
        let mut next = Some(exit);
        while let Some(handle) = next {
            let module = handle
                .module(store.as_context_mut())
                .ok()
                .flatten()
                .cloned();
            let pc = handle
                .wasm_function_index_and_pc(store.as_context_mut())
                .ok()
                .flatten()
                .map(|(_, pc)| pc.raw());
            next = handle.parent(store.as_context_mut()).ok().flatten();
            frames.push(Frame { handle, module, pc });
        }
    }
    frames
}

fn value_text(value: &Val) -> String {
    match value {
        Val::I32(v) => format!("i32 = {v}"),
        Val::I64(v) => format!("i64 = {v}"),
        Val::F32(bits) => format!("f32 = {}", f32::from_bits(*bits)),
        Val::F64(bits) => format!("f64 = {}", f64::from_bits(*bits)),
        Val::V128(v) => format!("v128 = {:#034x}", v.as_u128()),
        Val::FuncRef(f) => format!("funcref = {}", if f.is_some() { "func" } else { "null" }),
        _ => "ref".into(),
    }
}

/// The sources read, by path (None: not on this machine).
static SOURCES: Mutex<Vec<(String, Option<Arc<str>>)>> = Mutex::new(Vec::new());

/// The text of `file`, if this machine has it (read once).
fn source(file: &str) -> Option<Arc<str>> {
    let mut sources = lock(&SOURCES);
    if let Some((_, text)) = sources.iter().find(|(path, _)| path == file) {
        return text.clone();
    }
    let text: Option<Arc<str>> = std::fs::read_to_string(file).ok().map(Arc::from);
    sources.push((file.to_string(), text.clone()));
    text
}

/// The text of line `line` of `file`, if this machine has the file.
fn source_line(file: &str, line: u32) -> Option<String> {
    let text = source(file)?;
    let at = usize::try_from(line).ok()?.checked_sub(1)?;
    text.lines()
        .nth(at)
        .map(|source| source.trim_end().to_string())
}

/// `line` of `file` as a stop shows it: `   84  let total = ...`.
fn source_text(at: &At) -> String {
    at.as_ref()
        .and_then(|(file, line)| {
            source_line(file, *line).map(|text| format!("{line:>5}  {text}\n"))
        })
        .unwrap_or_default()
}

/// The innermost frame of the program's own code: the first whose source
/// is on this machine (a trap stops in `abort`, an interrupt may stop in
/// the standard library). None: no frame has.
fn own_frame(frames: &[Frame]) -> Option<usize> {
    frames
        .iter()
        .position(|frame| frame.at().is_some_and(|(file, _)| source(&file).is_some()))
}

// ---------------------------------------------------------------------------
// An instance's link to the hub: the run's breakpoints, and interrupts.

/// What the hub tells an instance, kept where its handler reads it.
#[derive(Default)]
struct Heard {
    /// `interrupt`: stop at the next epoch tick.
    interrupt: AtomicBool,
    /// Bumped at each change of `breakpoints`.
    version: AtomicU64,
    /// The run's breakpoints, by id (0: typed here, not yet numbered).
    breakpoints: Mutex<Vec<(u32, String)>>,
}

impl Heard {
    fn set_breakpoints(&self, list: Vec<(u32, String)>) {
        *lock(&self.breakpoints) = list;
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

/// An instance's registration at its run's hub (DE-2): one connection,
/// kept while the instance lives.
struct Link {
    heard: Arc<Heard>,
    to_hub: Option<mpsc::UnboundedSender<String>>,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// What the hub sends a registered instance.
#[derive(Debug, serde::Deserialize)]
struct HubNews {
    #[serde(default)]
    breakpoints: Option<Vec<(u32, String)>>,
    /// Stop at the next epoch tick (true), or no longer (false).
    #[serde(default)]
    interrupt: Option<bool>,
}

impl Link {
    fn offline() -> Link {
        Link {
            heard: Arc::default(),
            to_hub: None,
            task: None,
        }
    }

    /// Registers `whoami` at the hub of `config` and waits for the run's
    /// breakpoints; runs on without the hub (with a warning) when it cannot.
    async fn connect(config: &DebugConfig, whoami: &Whoami) -> Link {
        match tokio::time::timeout(REGISTER_TIMEOUT, Link::register(config, whoami)).await {
            Ok(Ok(link)) => link,
            Ok(Err(e)) => {
                tracing::warn!(addr = %config.addr, error = %e, "this instance could not register with the debug hub: `break` and `interrupt` do not reach it");
                Link::offline()
            }
            Err(_) => {
                tracing::warn!(addr = %config.addr, "registering with the debug hub timed out: `break` and `interrupt` do not reach this instance");
                Link::offline()
            }
        }
    }

    async fn register(config: &DebugConfig, whoami: &Whoami) -> Result<Link, String> {
        let stream = tokio::net::TcpStream::connect(&config.addr)
            .await
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let hello = json!({
            "token": config.token,
            "role": "instance",
            "mesh": whoami.mesh,
            "rank": whoami.rank,
            "extent": whoami.extent,
        });
        write
            .write_all(format!("{hello}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut lines = BufReader::new(read).lines();
        let first = lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the hub closed the connection")?;
        let said: Value =
            serde_json::from_str(&first).map_err(|e| format!("the hub said {first:?}: {e}"))?;
        if let Some(error) = said.get("error").and_then(Value::as_str) {
            return Err(error.to_string());
        }
        let news: HubNews =
            serde_json::from_value(said).map_err(|e| format!("the hub said {first:?}: {e}"))?;
        let heard = Arc::new(Heard::default());
        heard.set_breakpoints(news.breakpoints.unwrap_or_default());
        let (to_hub, mut outgoing) = mpsc::unbounded_channel::<String>();
        let listener = heard.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    line = lines.next_line() => {
                        let Ok(Some(line)) = line else { return };
                        let Ok(news) = serde_json::from_str::<HubNews>(&line) else { continue };
                        if let Some(list) = news.breakpoints {
                            listener.set_breakpoints(list);
                        }
                        if let Some(interrupt) = news.interrupt {
                            listener.interrupt.store(interrupt, Ordering::Release);
                        }
                    }
                    out = outgoing.recv() => {
                        let Some(mut out) = out else { return };
                        out.push('\n');
                        if write.write_all(out.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(Link {
            heard,
            to_hub: Some(to_hub),
            task: Some(task.abort_handle()),
        })
    }

    fn send(&self, value: Value) {
        if let Some(to_hub) = &self.to_hub {
            let _ = to_hub.send(value.to_string());
        }
    }
}

// ---------------------------------------------------------------------------
// An instance's debugger: the store's debug handler.

/// What a resumed instance is doing.
#[derive(Debug, Clone, Default, PartialEq)]
enum Mode {
    /// Running to the next breakpoint.
    #[default]
    Run,
    /// `step`: to the next source line, into calls.
    Step { depth: usize, at: At },
    /// `next`: to the next source line of this frame or its callers.
    Next { depth: usize, at: At },
    /// `finish`: until the frame at `depth` returns.
    Finish { depth: usize },
}

#[derive(Default)]
struct State {
    /// The version of the run's breakpoints applied to the store.
    applied: u64,
    /// The places of the run's breakpoints in the store's modules.
    user: Vec<(Module, u32)>,
    /// A breakpoint of `next` or `finish` where a call returns.
    temp: Option<(Module, u32)>,
    mode: Mode,
    /// The frame `locals` and `frame` show, innermost 0.
    selected: usize,
    /// Breakpoints the controller warned match nothing.
    warned: HashSet<String>,
}

/// An instance's debugger on the debug engine: its store's
/// [`DebugHandler`], cheap to clone (see the module docs).
#[derive(Clone)]
pub struct Debugger(Arc<Inner>);

struct Inner {
    link: Link,
    /// Whether this is the controller: it warns of `--break`s that match
    /// no code (the actors would each say the same).
    controller: bool,
    state: Mutex<State>,
}

/// Gives `store` a debugger when its engine is a debug engine, registered
/// at the run's hub: None for a normal engine (DE-1).
pub(crate) async fn attach(
    store: &mut wasmtime::Store<HostState>,
    cluster: &Cluster,
) -> Option<Debugger> {
    if !is_debug_engine(store.engine()) {
        return None;
    }
    let whoami = store.data().debug.whoami.clone();
    let link = match &cluster.sandbox.debug {
        Some(config) => Link::connect(config, &whoami).await,
        None => Link::offline(),
    };
    let debugger = Debugger(Arc::new(Inner {
        link,
        controller: whoami.mesh == "controller",
        state: Mutex::default(),
    }));
    store.set_debug_handler(debugger.clone());
    Some(debugger)
}

impl DebugHandler for Debugger {
    type Data = HostState;

    async fn handle(&self, mut store: StoreContextMut<'_, HostState>, event: DebugEvent<'_>) {
        match event {
            DebugEvent::Trap(trap) => {
                let trap = trap.to_string();
                let reason = format!(
                    "trap: {}",
                    trap.strip_prefix("wasm trap: ").unwrap_or(&trap)
                );
                self.stop(&mut store, reason, true).await;
            }
            DebugEvent::EpochYield => {
                self.sync(&mut store);
                if self.0.link.heard.interrupt.swap(false, Ordering::AcqRel) {
                    self.stop(&mut store, "interrupt".into(), false).await;
                }
            }
            DebugEvent::Breakpoint => {
                if let Some(reason) = self.breakpoint(&mut store) {
                    self.stop(&mut store, reason, false).await;
                }
            }
            _ => {}
        }
    }
}

impl Debugger {
    /// Before an export starts: the run's breakpoints are applied and no
    /// step is in progress (DE-2, DE-4).
    pub(crate) fn begin_export(&self, store: &mut wasmtime::Store<HostState>) {
        let mut store = store.as_context_mut();
        self.sync(&mut store);
        self.quiet(&mut store);
    }

    /// Applies the run's breakpoints to the store if they changed.
    fn sync(&self, store: &mut StoreContextMut<'_, HostState>) {
        let version = self.0.link.heard.version.load(Ordering::Acquire);
        let mut state = lock(&self.0.state);
        if version == state.applied {
            return;
        }
        state.applied = version;
        let specs = lock(&self.0.link.heard.breakpoints).clone();
        let modules = store.as_context_mut().debug_all_modules();
        let mut wanted: Vec<(Module, u32)> = Vec::new();
        for (_, text) in &specs {
            let Ok(spec) = Spec::parse(text) else {
                continue;
            };
            let before = wanted.len();
            for module in &modules {
                if let Some(symbols) = symbols(module) {
                    let (pcs, _) = symbols.places(&spec);
                    wanted.extend(pcs.into_iter().map(|pc| (module.clone(), pc)));
                }
            }
            if wanted.len() == before && self.0.controller && state.warned.insert(text.clone()) {
                tracing::warn!(
                    "breakpoint `{text}` matches no code of the program (it needs debug info: `debug = \"line-tables-only\"` or more)"
                );
            }
        }
        let same =
            |(m, pc): &(Module, u32), (n, qc): &(Module, u32)| pc == qc && Module::same(m, n);
        let old = std::mem::take(&mut state.user);
        if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
            for place in old.iter().filter(|p| !wanted.iter().any(|w| same(p, w))) {
                let _ = edit.remove_breakpoint(&place.0, ModulePC::new(place.1));
            }
            for place in wanted.iter().filter(|w| !old.iter().any(|p| same(p, w))) {
                let _ = edit.add_breakpoint(&place.0, ModulePC::new(place.1));
            }
        }
        state.user = wanted;
    }

    /// No step in progress: single-stepping off, no return breakpoint.
    fn quiet(&self, store: &mut StoreContextMut<'_, HostState>) {
        let mut state = lock(&self.0.state);
        let temp = state.temp.take();
        if state.mode == Mode::Run && temp.is_none() {
            return;
        }
        state.mode = Mode::Run;
        if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
            let _ = edit.single_step(false);
            if let Some((module, pc)) = temp {
                let _ = edit.remove_breakpoint(&module, ModulePC::new(pc));
            }
        }
    }

    /// Whether a breakpoint event stops the instance, and why.
    fn breakpoint(&self, store: &mut StoreContextMut<'_, HostState>) -> Option<String> {
        let frames = frames(store);
        let top = frames.first()?;
        let depth = frames.len();
        let module = top.module.as_ref()?;
        let pc = top.pc?;
        let mut state = lock(&self.0.state);
        let is = |place: &(Module, u32)| place.1 == pc && Module::same(&place.0, module);
        let user = state.user.iter().any(is);
        let returned = state.temp.as_ref().is_some_and(is);
        match state.mode.clone() {
            Mode::Run => user.then(|| "break".to_string()),
            Mode::Step { depth: from, at } => match top.at() {
                Some(here) if Some(&here) != at.as_ref() || depth != from => Some("step".into()),
                _ => None,
            },
            Mode::Next { depth: from, at } => {
                if returned && depth <= from {
                    // Back from the call it stepped over: step on.
                    let temp = state.temp.take();
                    if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
                        if let Some((module, pc)) = temp {
                            let _ = edit.remove_breakpoint(&module, ModulePC::new(pc));
                        }
                        let _ = edit.single_step(true);
                    }
                }
                if depth > from {
                    if user {
                        return Some("break".into());
                    }
                    // A call: run it at full speed, to where it returns.
                    if state.temp.is_none()
                        && let Some(caller) = frames.get(depth - from)
                        && let (Some(module), Some(ret)) =
                            (caller.module.clone(), caller.return_pc())
                    {
                        // Two edits: wasmtime 48 loses a breakpoint added
                        // in the edit that also turns single-stepping off.
                        if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
                            let _ = edit.single_step(false);
                        }
                        if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
                            let _ = edit.add_breakpoint(&module, ModulePC::new(ret));
                        }
                        state.temp = Some((module, ret));
                    }
                    return None;
                }
                // Code inlined from another file (a `From`, an iterator's
                // `next`) is part of the line that calls it, as a call is.
                match (top.at(), &at) {
                    (Some(_), _) if depth < from => Some("step".into()),
                    (Some((file, line)), Some((from_file, from_line)))
                        if file == *from_file && line != *from_line =>
                    {
                        Some("step".into())
                    }
                    (Some(_), None) => Some("step".into()),
                    _ => None,
                }
            }
            Mode::Finish { depth: from } => {
                if returned && depth < from {
                    Some("finish".into())
                } else {
                    user.then(|| "break".to_string())
                }
            }
        }
    }

    /// Stops the instance: a pause at the hub, answered until a command
    /// resumes the guest (DE-3). `trapped`: the guest cannot run on, only
    /// unwind.
    async fn stop(
        &self,
        store: &mut StoreContextMut<'_, HostState>,
        reason: String,
        trapped: bool,
    ) {
        self.sync(store);
        self.quiet(store);
        // The hub lists, and `locals` first shows, the program's own frame.
        let (function, location, at, own, top) = {
            let frames = frames(store);
            let own = own_frame(&frames).unwrap_or(0);
            let describe = |frame: Option<&Frame>| match frame {
                Some(frame) => (frame.function(), frame.location(), frame.at()),
                None => ("?".to_string(), "?".to_string(), None),
            };
            let (function, location, at) = describe(frames.get(own));
            let top = match own {
                0 => String::new(),
                own => {
                    let (function, location, _) = describe(frames.first());
                    format!(
                        "  (frame #{own}, the innermost of the program's own code; #0 is {function} at {location}; `bt` shows all)\n"
                    )
                }
            };
            (function, location, at, own, top)
        };
        lock(&self.0.state).selected = own;
        let already = store.data().debug.clock.is_paused();
        if !store
            .data_mut()
            .open_pause(function.clone(), location.clone(), reason.clone())
            .await
        {
            return;
        }
        let source = source_text(&at);
        let lead = match already {
            true => "",
            false => "stopped by the debug engine; `help` lists its commands\n",
        };
        store.data_mut().output(&format!(
            "{lead}> {location} in {function} ({reason})\n{source}{top}{PROMPT}"
        ));
        loop {
            let line = match store.data_mut().next_input().await {
                Ok(line) => line,
                // Abandoned, or the actor stopped: the pause is closed;
                // the guest runs on (or unwinds, if it trapped).
                Err(e) => {
                    tracing::info!("a stop of the debug engine ended: {e:#}");
                    self.sync(store);
                    return;
                }
            };
            let command = match Command::parse(&line) {
                Ok(command) => command,
                Err(e) => {
                    store.data_mut().output(&format!("*** {e}\n{PROMPT}"));
                    continue;
                }
            };
            let resume = match command {
                Command::Continue => {
                    // Breakpoints set while it was stopped apply from here
                    // on, even before its next epoch tick.
                    self.sync(store);
                    store.data_mut().debug.close();
                    return;
                }
                Command::Step | Command::Next | Command::Finish if trapped => Err(
                    "the guest trapped: it cannot run on; `c` lets the trap unwind (the actor fails)"
                        .to_string(),
                ),
                Command::Step => self.resume(store, |depth, at| Some(Mode::Step { depth, at })),
                Command::Next => self.resume(store, |depth, at| Some(Mode::Next { depth, at })),
                Command::Finish => self.finish(store),
                other => {
                    let text = self.answer(store, other);
                    store.data_mut().output(&format!("{text}{PROMPT}"));
                    continue;
                }
            };
            match resume {
                // The pause stays open while it steps (DE-4).
                Ok(()) => {
                    self.sync(store);
                    return;
                }
                Err(e) => store.data_mut().output(&format!("*** {e}\n{PROMPT}")),
            }
        }
    }

    /// Starts `step` or `next` from the innermost frame.
    fn resume(
        &self,
        store: &mut StoreContextMut<'_, HostState>,
        mode: impl FnOnce(usize, At) -> Option<Mode>,
    ) -> Result<(), String> {
        let (depth, at) = {
            let frames = frames(store);
            (frames.len(), frames.first().and_then(Frame::at))
        };
        let mode = mode(depth, at).ok_or("nothing to step")?;
        lock(&self.0.state).mode = mode;
        if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
            edit.single_step(true).map_err(|e| format!("{e:#}"))?;
        }
        Ok(())
    }

    /// Starts `finish`: a breakpoint where the innermost frame returns.
    fn finish(&self, store: &mut StoreContextMut<'_, HostState>) -> Result<(), String> {
        let (depth, place) = {
            let frames = frames(store);
            let caller = frames.get(1);
            let place = caller.and_then(|c| Some((c.module.clone()?, c.return_pc()?)));
            (frames.len(), place)
        };
        let (module, pc) = place
            .ok_or("this frame was called by the host, not by Wasm: `c` runs it to its end")?;
        if let Some(mut edit) = store.as_context_mut().edit_breakpoints() {
            edit.add_breakpoint(&module, ModulePC::new(pc))
                .map_err(|e| format!("{e:#}"))?;
        }
        let mut state = lock(&self.0.state);
        state.temp = Some((module, pc));
        state.mode = Mode::Finish { depth };
        Ok(())
    }

    /// The answer to a command that does not resume the guest.
    fn answer(&self, store: &mut StoreContextMut<'_, HostState>, command: Command) -> String {
        match command {
            Command::Empty => String::new(),
            Command::Help => HELP.into(),
            Command::Backtrace => {
                let frames = frames(store);
                let selected = lock(&self.0.state).selected;
                frames
                    .iter()
                    .enumerate()
                    .map(|(i, frame)| {
                        let mark = if i == selected { '>' } else { ' ' };
                        format!(
                            "{mark}#{i:<3} {} at {}\n",
                            frame.function(),
                            frame.location()
                        )
                    })
                    .collect()
            }
            Command::Locals => {
                let frames = frames(store);
                let selected = lock(&self.0.state).selected;
                let Some(frame) = frames.get(selected) else {
                    return "*** no such frame\n".into();
                };
                let count = frame.handle.num_locals(store.as_context_mut()).unwrap_or(0);
                let mut text = format!(
                    "#{selected} {} at {}: {count} Wasm locals\n",
                    frame.function(),
                    frame.location()
                );
                for i in 0..count {
                    match frame.handle.local(store.as_context_mut(), i) {
                        Ok(value) => {
                            text.push_str(&format!("  local{i}: {}\n", value_text(&value)))
                        }
                        Err(e) => text.push_str(&format!("  local{i}: ({e})\n")),
                    }
                }
                text
            }
            Command::Frame(to) => {
                let frames = frames(store);
                let mut state = lock(&self.0.state);
                let at = match to {
                    FrameTo::Index(i) => i,
                    FrameTo::Up => state.selected + 1,
                    FrameTo::Down => state.selected.saturating_sub(1),
                    FrameTo::Here => state.selected,
                };
                match frames.get(at) {
                    Some(frame) => {
                        state.selected = at;
                        let source = source_text(&frame.at());
                        format!(
                            "#{at} {} at {}\n{source}",
                            frame.function(),
                            frame.location()
                        )
                    }
                    None => format!("*** no frame {at}: there are {} (`bt`)\n", frames.len()),
                }
            }
            Command::List => {
                let frames = frames(store);
                let selected = lock(&self.0.state).selected;
                let Some((file, line)) = frames.get(selected).and_then(Frame::at) else {
                    return "*** this frame has no source line (the code has no debug info)\n"
                        .into();
                };
                let Some(text) = source(&file) else {
                    return format!("*** {file} is not on this machine\n");
                };
                let first = line.saturating_sub(5).max(1);
                text.lines()
                    .enumerate()
                    .skip(first as usize - 1)
                    .take(11)
                    .map(|(i, source)| {
                        let n = i as u32 + 1;
                        let mark = if n == line { "->" } else { "  " };
                        format!("{n:>5} {mark} {source}\n")
                    })
                    .collect()
            }
            Command::Breakpoints => {
                let list = lock(&self.0.link.heard.breakpoints).clone();
                if list.is_empty() {
                    return "no breakpoints; `break FILE:LINE` or `break FUNCTION` sets one\n"
                        .into();
                }
                list.iter()
                    .map(|(id, spec)| match id {
                        0 => format!("   {spec}\n"),
                        id => format!("{id:>2} {spec}\n"),
                    })
                    .collect()
            }
            Command::Break(spec) => self.add_breakpoint(store, spec),
            Command::Delete(id) => {
                let heard = &self.0.link.heard;
                let mut list = lock(&heard.breakpoints).clone();
                let before = list.len();
                match id {
                    Some(id) => list.retain(|(other, _)| *other != id),
                    None => list.clear(),
                }
                if list.len() == before && id.is_some() {
                    return format!(
                        "*** no breakpoint {}; `break` lists them\n",
                        id.unwrap_or(0)
                    );
                }
                self.0.link.send(json!({ "delete": id }));
                heard.set_breakpoints(list);
                self.sync(store);
                match id {
                    Some(id) => format!("deleted breakpoint {id} for every actor of the run\n"),
                    None => "deleted every breakpoint of the run\n".into(),
                }
            }
            Command::Continue | Command::Step | Command::Next | Command::Finish => String::new(),
        }
    }

    /// `break SPEC` at a stop: for every actor of the run (DE-2), applied
    /// here at once.
    fn add_breakpoint(&self, store: &mut StoreContextMut<'_, HostState>, spec: Spec) -> String {
        let modules = store.as_context_mut().debug_all_modules();
        let mut places: Vec<String> = Vec::new();
        let mut line_found = None;
        for module in &modules {
            let Some(symbols) = symbols(module) else {
                continue;
            };
            let (pcs, line) = symbols.places(&spec);
            line_found = line_found.or(line);
            for pc in pcs {
                let at = symbols.at(pc).map(|(file, line)| format!("{file}:{line}"));
                let function = symbols
                    .function(pc)
                    .map(|f| f.name.clone())
                    .unwrap_or_default();
                places.push(format!(
                    "{} in {function}",
                    at.unwrap_or_else(|| format!("pc {pc:#x}"))
                ));
            }
        }
        if places.is_empty() {
            return format!(
                "*** no code of the program is at `{spec}` (a file's path ends with FILE; a function's name ends with FUNCTION after `::`; the program needs debug info)\n"
            );
        }
        let text = spec.to_string();
        self.0.link.send(json!({ "break": text }));
        let heard = &self.0.link.heard;
        let mut list = lock(&heard.breakpoints).clone();
        list.push((0, text));
        heard.set_breakpoints(list);
        self.sync(store);
        let moved = match (&spec, line_found) {
            (Spec::Line { line, .. }, Some(found)) if found != *line => {
                format!(" (line {line} has no code; line {found} is next)")
            }
            _ => String::new(),
        };
        let mut text = format!(
            "breakpoint at {} place{}{moved}; every actor of the run stops there:\n",
            places.len(),
            if places.len() == 1 { "" } else { "s" }
        );
        for place in places {
            text.push_str(&format!("  {place}\n"));
        }
        text
    }
}

/// Which frame `frame`, `up` and `down` select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameTo {
    Index(usize),
    Up,
    Down,
    Here,
}

/// A line typed at a stop of the debug engine.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Empty,
    Help,
    Backtrace,
    Locals,
    Frame(FrameTo),
    List,
    Breakpoints,
    Break(Spec),
    Delete(Option<u32>),
    Step,
    Next,
    Finish,
    Continue,
}

impl Command {
    fn parse(line: &str) -> Result<Command, String> {
        let line = line.trim();
        let (word, rest) = line
            .split_once(char::is_whitespace)
            .map_or((line, ""), |(w, r)| (w, r.trim()));
        let none = |command: Command| match rest.is_empty() {
            true => Ok(command),
            false => Err(format!("`{word}` takes nothing after it")),
        };
        match word {
            "" => Ok(Command::Empty),
            "h" | "help" | "?" => none(Command::Help),
            "bt" | "backtrace" | "where" | "w" => none(Command::Backtrace),
            "locals" => none(Command::Locals),
            "info" => match rest {
                "locals" => Ok(Command::Locals),
                "break" | "breakpoints" => Ok(Command::Breakpoints),
                "frame" => Ok(Command::Frame(FrameTo::Here)),
                _ => Err("`info locals`, `info break` or `info frame`".into()),
            },
            "up" => none(Command::Frame(FrameTo::Up)),
            "down" => none(Command::Frame(FrameTo::Down)),
            "f" | "frame" => match rest {
                "" => Ok(Command::Frame(FrameTo::Here)),
                n => n
                    .parse()
                    .map(|n| Command::Frame(FrameTo::Index(n)))
                    .map_err(|_| format!("`{n}` is not a frame number (`bt` shows them)")),
            },
            "l" | "list" => none(Command::List),
            "b" | "break" => match rest {
                "" => Ok(Command::Breakpoints),
                spec => Spec::parse(spec).map(Command::Break),
            },
            "d" | "delete" => match rest {
                "" => Ok(Command::Delete(None)),
                n => n
                    .parse()
                    .map(|n| Command::Delete(Some(n)))
                    .map_err(|_| format!("`{n}` is not a breakpoint number (`break` lists them)")),
            },
            "s" | "step" => none(Command::Step),
            "n" | "next" => none(Command::Next),
            "fin" | "finish" => none(Command::Finish),
            "c" | "cont" | "continue" => none(Command::Continue),
            "p" | "print" => Err(
                "the debug engine reads Wasm locals, not source variables: `locals` shows the frame's".into(),
            ),
            other => Err(format!("unknown command `{other}`; try `help`")),
        }
    }
}

/// The `help` text of a stop.
const HELP: &str = "\
commands of the debug engine:
  bt                  the frames, innermost first: function at file:line
  locals              the Wasm locals of the selected frame (`frame N`, `up`, `down`)
  list                the source around the selected frame's line
  break FILE:LINE     stop every actor of the run where LINE of FILE begins
  break FUNCTION      stop every actor of the run at the start of FUNCTION
  break               the run's breakpoints; `delete N` (or `delete`, all) removes them
  step                run to the next source line, into calls
  next                run to the next source line, over calls
  finish              run until this function returns
  c                   continue
";

// ---------------------------------------------------------------------------
// The hub's side: registered instances, and the run's breakpoints.

/// The instances of a run on the debug engine, registered at its hub, and
/// the run's breakpoints (DE-2); the hub holds one.
#[derive(Default)]
pub struct Registry {
    instances: Mutex<BTreeMap<u64, Registered>>,
    next_instance: AtomicU64,
    breakpoints: Mutex<Breakpoints>,
}

#[derive(Default)]
struct Breakpoints {
    next_id: u32,
    list: Vec<(u32, String)>,
}

struct Registered {
    mesh: String,
    rank: u32,
    extent: Vec<(String, u32)>,
    to_instance: mpsc::UnboundedSender<String>,
}

impl Registry {
    /// Adds breakpoints (`run --break`); says which does not parse.
    pub fn add_breakpoints(&self, specs: &[String]) -> Result<(), String> {
        for spec in specs {
            Spec::parse(spec)?;
        }
        let mut breakpoints = lock(&self.breakpoints);
        for spec in specs {
            breakpoints.next_id += 1;
            let id = breakpoints.next_id;
            breakpoints.list.push((id, spec.trim().to_string()));
        }
        drop(breakpoints);
        self.broadcast_breakpoints();
        Ok(())
    }

    fn breakpoints_line(&self) -> String {
        json!({ "breakpoints": lock(&self.breakpoints).list }).to_string()
    }

    fn broadcast_breakpoints(&self) {
        let line = self.breakpoints_line();
        for instance in lock(&self.instances).values() {
            let _ = instance.to_instance.send(line.clone());
        }
    }

    /// Serves one instance's registration until it ends: sends it the
    /// run's breakpoints, now and at each change, and its interrupts, and
    /// takes the breakpoints it sets and deletes.
    pub(crate) async fn serve_instance<R, W>(
        &self,
        hello: &Value,
        mut lines: BufReader<R>,
        mut write: W,
    ) where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let id = self.next_instance.fetch_add(1, Ordering::Relaxed);
        let (to_instance, mut outgoing) = mpsc::unbounded_channel::<String>();
        let _ = to_instance.send(self.breakpoints_line());
        let registered = Registered {
            mesh: hello["mesh"].as_str().unwrap_or_default().to_string(),
            rank: hello["rank"]
                .as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .unwrap_or(0),
            extent: serde_json::from_value(hello["extent"].clone()).unwrap_or_default(),
            to_instance,
        };
        lock(&self.instances).insert(id, registered);
        // A writer of its own: reading a line is not cancel-safe, so it is
        // never raced against writing. It ends when the registration does
        // (its sender goes with the entry).
        let writer = tokio::spawn(async move {
            while let Some(mut out) = outgoing.recv().await {
                out.push('\n');
                if write.write_all(out.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
        while let Ok(Some(line)) = read_line(&mut lines, INSTANCE_LINE_MAX).await {
            let Ok(said) = serde_json::from_str::<Value>(&line) else {
                break;
            };
            if let Some(spec) = said.get("break").and_then(Value::as_str) {
                let _ = self.add_breakpoints(&[spec.to_string()]);
            } else if let Some(delete) = said.get("delete") {
                let mut breakpoints = lock(&self.breakpoints);
                match delete.as_u64() {
                    Some(id) => breakpoints
                        .list
                        .retain(|(other, _)| u64::from(*other) != id),
                    None => breakpoints.list.clear(),
                }
                drop(breakpoints);
                self.broadcast_breakpoints();
            }
        }
        lock(&self.instances).remove(&id);
        writer.abort();
    }

    /// Tells the registered ranks of `mesh` that `selection` picks to stop
    /// at their next epoch tick, except those `paused` says are paused
    /// already; returns the ranks told, and those left alone as paused.
    pub(crate) fn interrupt(
        &self,
        mesh: &str,
        selection: &Selection,
        paused: impl Fn(u32) -> bool,
    ) -> (Vec<u32>, Vec<u32>) {
        let line = json!({ "interrupt": true }).to_string();
        let mut told = Vec::new();
        let mut left = Vec::new();
        for instance in lock(&self.instances).values() {
            if instance.mesh != mesh || !selection.matches(instance.rank, &instance.extent) {
                continue;
            }
            if paused(instance.rank) {
                left.push(instance.rank);
            } else if instance.to_instance.send(line.clone()).is_ok() {
                told.push(instance.rank);
            }
        }
        for ranks in [&mut told, &mut left] {
            ranks.sort_unstable();
            ranks.dedup();
        }
        (told, left)
    }

    /// Withdraws the interrupts of `ranks` of `mesh` that have not stopped.
    pub(crate) fn withdraw_interrupt(&self, mesh: &str, ranks: &[u32]) {
        let line = json!({ "interrupt": false }).to_string();
        for instance in lock(&self.instances).values() {
            if instance.mesh == mesh && ranks.contains(&instance.rank) {
                let _ = instance.to_instance.send(line.clone());
            }
        }
    }
}

/// The longest line a registered instance sends (a breakpoint).
const INSTANCE_LINE_MAX: usize = 64 << 10;

/// Reads one line of at most `max` bytes, without its newline; None at the
/// end. A longer line is an error.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    max: usize,
) -> std::io::Result<Option<String>> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let read = (&mut *reader)
        .take(limit)
        .read_until(b'\n', &mut line)
        .await?;
    if read == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > max {
        return Err(std::io::Error::other(format!(
            "a line longer than {max} bytes"
        )));
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_lines_or_functions() {
        assert_eq!(
            Spec::parse("lib.rs:42").unwrap(),
            Spec::Line {
                file: "lib.rs".into(),
                line: 42
            }
        );
        assert_eq!(
            Spec::parse("./src/lib.rs:7").unwrap(),
            Spec::Line {
                file: "src/lib.rs".into(),
                line: 7
            }
        );
        assert_eq!(
            Spec::parse("stepper::compute").unwrap(),
            Spec::Function("stepper::compute".into())
        );
        assert_eq!(
            Spec::parse("compute").unwrap(),
            Spec::Function("compute".into())
        );
        for (bad, says) in [
            ("", "FILE:LINE"),
            ("lib.rs:0", "from 1"),
            ("a b", "FILE:LINE"),
            ("x:", "FILE:LINE"),
        ] {
            let err = Spec::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        assert_eq!(Spec::parse(" lib.rs:42 ").unwrap().to_string(), "lib.rs:42");
    }

    #[test]
    fn files_match_by_whole_path_components() {
        let path = "/work/tests/programs/stepper/src/lib.rs";
        assert!(path_matches(path, "lib.rs"));
        assert!(path_matches(path, "src/lib.rs"));
        assert!(path_matches(path, "stepper/src/lib.rs"));
        assert!(path_matches(path, path));
        assert!(!path_matches(path, "b.rs"), "not a component's end");
        assert!(!path_matches(path, "per/src/lib.rs"));
        assert!(function_matches("stepper::compute", "compute"));
        assert!(function_matches("stepper::compute", "stepper::compute"));
        assert!(!function_matches("stepper::precompute", "compute"));
    }

    #[test]
    fn paths_are_normalized_as_the_file_system_would() {
        assert_eq!(
            normalize("/work/main/guest-sdk/../tests/programs/stepper/./src/lib.rs"),
            "/work/main/tests/programs/stepper/src/lib.rs"
        );
        assert_eq!(normalize("src//lib.rs"), "src/lib.rs");
        assert_eq!(normalize("../a/b"), "../a/b");
        assert_eq!(normalize("/../a"), "/a");
        let mut path = "/work/main".to_string();
        push_path(&mut path, "src/lib.rs");
        assert_eq!(path, "/work/main/src/lib.rs");
        push_path(&mut path, "/rustc/abc/library/core/src/lib.rs");
        assert_eq!(path, "/rustc/abc/library/core/src/lib.rs");
    }

    #[test]
    fn commands_of_a_stop() {
        let parse = |line: &str| Command::parse(line);
        assert_eq!(parse("bt").unwrap(), Command::Backtrace);
        assert_eq!(parse("where").unwrap(), Command::Backtrace);
        assert_eq!(parse("info locals").unwrap(), Command::Locals);
        assert_eq!(parse("n").unwrap(), Command::Next);
        assert_eq!(parse("s").unwrap(), Command::Step);
        assert_eq!(parse("finish").unwrap(), Command::Finish);
        assert_eq!(parse("c").unwrap(), Command::Continue);
        assert_eq!(parse("frame 2").unwrap(), Command::Frame(FrameTo::Index(2)));
        assert_eq!(parse("up").unwrap(), Command::Frame(FrameTo::Up));
        assert_eq!(parse("break").unwrap(), Command::Breakpoints);
        assert_eq!(
            parse("b lib.rs:9").unwrap(),
            Command::Break(Spec::Line {
                file: "lib.rs".into(),
                line: 9
            })
        );
        assert_eq!(parse("delete").unwrap(), Command::Delete(None));
        assert_eq!(parse("delete 3").unwrap(), Command::Delete(Some(3)));
        assert_eq!(parse("").unwrap(), Command::Empty);
        for (bad, says) in [
            ("frame x", "frame number"),
            ("delete x", "breakpoint number"),
            ("next 2", "takes nothing"),
            ("p x", "Wasm locals"),
            ("jump", "unknown command"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    /// A module without DWARF has functions and no lines; its names come
    /// from the name section, demangled.
    #[test]
    fn symbols_of_a_module_without_debug_info() {
        // (module (func $a) (func $_ZN7stepper7compute17h0123456789abcdefE nop))
        let mut bytes = b"\0asm\x01\0\0\0".to_vec();
        bytes.extend([1, 4, 1, 0x60, 0, 0]); // type: func()
        bytes.extend([3, 3, 2, 0, 0]); // two functions of type 0
        let code_at = bytes.len() as u32 + 2;
        bytes.extend([10, 8, 2, 2, 0, 0x0b, 3, 0, 0x01, 0x0b]); // bodies
        let mangled = b"_ZN7stepper7compute17h0123456789abcdefE";
        let mut names = vec![1u8]; // function names
        let mut map = vec![2u8, 0, 1, b'a', 1, mangled.len() as u8];
        map.extend(mangled);
        names.push(map.len() as u8);
        names.extend(map);
        let mut custom = vec![4u8];
        custom.extend(b"name");
        custom.extend(names);
        bytes.push(0);
        bytes.push(custom.len() as u8);
        bytes.extend(custom);
        let symbols = Symbols::read(&bytes);
        assert_eq!(symbols.functions.len(), 2);
        let first = symbols.functions[0].start;
        assert!(first > code_at, "bodies are within the code section");
        assert_eq!(symbols.function(first).map(|f| f.name.as_str()), Some("a"));
        assert!(
            symbols.function(code_at).is_none(),
            "the count is no function's"
        );
        let second = symbols.functions[1].start;
        assert_eq!(
            symbols.function(second).map(|f| f.name.as_str()),
            Some("stepper::compute")
        );
        assert!(symbols.at(second).is_none(), "no line tables");
        let (pcs, _) = symbols.places(&Spec::Function("compute".into()));
        assert_eq!(
            pcs,
            vec![second],
            "a function without lines stops at its first byte"
        );
        assert!(
            symbols
                .places(&Spec::parse("lib.rs:1").unwrap())
                .0
                .is_empty()
        );
    }
}
