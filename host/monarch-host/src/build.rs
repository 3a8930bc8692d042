//! `monarch-host build`: programs written in Python (and JavaScript) made
//! into components of the WIT world `program`, with the SDK and the WIT
//! bundled in this binary.
//!
//! - Python: componentize-py, with the `monarch` package
//!   (`guest-sdk/python`) and the program's directory on its path. The SDK
//!   runs the program's top level in actor mode at build time (see
//!   `guest-sdk/python/monarch/_program.py`), so errors in it (a syntax
//!   error, a missing module) are reported with file and line here. The
//!   component is of the world `test` (`program` and its `tests` export,
//!   the script's `test*` functions), so that `monarch-host test app.py`
//!   runs the same component as `run app.py`.
//! - JavaScript: `guest-sdk/js/build.mjs` under node, which runs jco's
//!   QuickJS backend.
//!
//! `monarch-host run app.py` builds through a cache keyed by the sources
//! and the SDK, so a second run starts without building or compiling.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sha2::{Digest, Sha256};

/// A file bundled in this binary: its path under the SDK directory, and
/// its text.
type Bundled = (&'static str, &'static str);

const WIT: &[Bundled] = &[("wit/monarch.wit", include_str!("../../../wit/monarch.wit"))];

const PYTHON_SDK: &[Bundled] = &[
    (
        "python/monarch_program.py",
        include_str!("../../../guest-sdk/python/monarch_program.py"),
    ),
    (
        "python/monarch_session.py",
        include_str!("../../../guest-sdk/python/monarch_session.py"),
    ),
    (
        "python/monarch/__init__.py",
        include_str!("../../../guest-sdk/python/monarch/__init__.py"),
    ),
    (
        "python/monarch/actor.py",
        include_str!("../../../guest-sdk/python/monarch/actor.py"),
    ),
    (
        "python/monarch/rdma.py",
        include_str!("../../../guest-sdk/python/monarch/rdma.py"),
    ),
    (
        "python/monarch/tensor.py",
        include_str!("../../../guest-sdk/python/monarch/tensor.py"),
    ),
    (
        "python/monarch/_codec.py",
        include_str!("../../../guest-sdk/python/monarch/_codec.py"),
    ),
    (
        "python/monarch/_errors.py",
        include_str!("../../../guest-sdk/python/monarch/_errors.py"),
    ),
    (
        "python/monarch/_loop.py",
        include_str!("../../../guest-sdk/python/monarch/_loop.py"),
    ),
    (
        "python/monarch/_debug.py",
        include_str!("../../../guest-sdk/python/monarch/_debug.py"),
    ),
    (
        "python/monarch/_preload.py",
        include_str!("../../../guest-sdk/python/monarch/_preload.py"),
    ),
    (
        "python/monarch/_program.py",
        include_str!("../../../guest-sdk/python/monarch/_program.py"),
    ),
    (
        "python/monarch/_runtime.py",
        include_str!("../../../guest-sdk/python/monarch/_runtime.py"),
    ),
    (
        "python/monarch/_session.py",
        include_str!("../../../guest-sdk/python/monarch/_session.py"),
    ),
    (
        "python/monarch/_shape.py",
        include_str!("../../../guest-sdk/python/monarch/_shape.py"),
    ),
    (
        "python/monarch/_testing.py",
        include_str!("../../../guest-sdk/python/monarch/_testing.py"),
    ),
    (
        "python/monarch/faults.py",
        include_str!("../../../guest-sdk/python/monarch/faults.py"),
    ),
];

const JS_SDK: &[Bundled] = &[
    (
        "js/build.mjs",
        include_str!("../../../guest-sdk/js/build.mjs"),
    ),
    (
        "js/monarch.js",
        include_str!("../../../guest-sdk/js/monarch.js"),
    ),
    ("js/core.js", include_str!("../../../guest-sdk/js/core.js")),
    ("js/cbor.js", include_str!("../../../guest-sdk/js/cbor.js")),
];

/// The languages `build` takes, by the program's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `.py`, through componentize-py.
    Python,
    /// `.js` or `.mjs`, through jco's QuickJS backend.
    JavaScript,
}

impl Language {
    /// The language of a program file, if `build` takes it.
    pub fn of(path: &Path) -> Option<Language> {
        match path.extension()?.to_str()? {
            "py" => Some(Language::Python),
            "js" | "mjs" => Some(Language::JavaScript),
            _ => None,
        }
    }

    /// The extensions of the sources a program of this language may
    /// import from its directory (part of the build's cache key).
    fn source_extensions(self) -> &'static [&'static str] {
        match self {
            Language::Python => &["py"],
            Language::JavaScript => &["js", "mjs"],
        }
    }

    fn sdk(self) -> &'static [Bundled] {
        match self {
            Language::Python => PYTHON_SDK,
            Language::JavaScript => JS_SDK,
        }
    }
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The program's file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a language `build` takes.
    #[error("{0}: build takes a Python (.py) or JavaScript (.js) program; a .wasm is run as it is")]
    Language(PathBuf),
    /// The tool that builds the language is not installed.
    #[error("{tool} was not found ({why}); install it with `{install}` (scripts/setup does)")]
    Tool {
        /// The tool.
        tool: &'static str,
        /// How to install it.
        install: &'static str,
        /// What went wrong running it.
        why: String,
    },
    /// The program has errors; each names a file and line where known.
    #[error("{}", .0.join("\n"))]
    Program(Vec<String>),
    /// The toolchain failed for another reason.
    #[error("{tool} failed:\n{output}")]
    Toolchain {
        /// The tool.
        tool: &'static str,
        /// The end of what it printed.
        output: String,
    },
    /// Writing the SDK, the staging files or the output failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being written.
        what: String,
        /// Why.
        source: std::io::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BuildError {
    let what = what.into();
    move |source| BuildError::Io { what, source }
}

/// The WIT and the SDK files of a language: those bundled in this binary,
/// or, with `MONARCH_SDK_CHECKOUT` set to a checkout of this repository,
/// that checkout's (for working on the SDKs without rebuilding the host).
fn sdk_files(files: &[Bundled]) -> Result<Vec<(String, String)>, BuildError> {
    let bundled = WIT.iter().chain(files);
    let Some(checkout) = std::env::var_os("MONARCH_SDK_CHECKOUT") else {
        return Ok(bundled
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect());
    };
    let checkout = PathBuf::from(checkout);
    bundled
        .map(|(path, _)| {
            let file = match path.strip_prefix("wit/") {
                Some(_) => checkout.join(path),
                None => checkout.join("guest-sdk").join(path),
            };
            std::fs::read_to_string(&file)
                .map(|text| (path.to_string(), text))
                .map_err(|source| BuildError::Read { path: file, source })
        })
        .collect()
}

/// The files of [`sdk_files`], written once under the cache directory (a
/// directory per content hash), and that directory.
fn sdk_dir(cache: &Path, files: &[(String, String)]) -> Result<PathBuf, BuildError> {
    let mut hash = Sha256::new();
    for (path, text) in files {
        hash.update(path.as_bytes());
        hash.update([0]);
        hash.update(text.as_bytes());
        hash.update([0]);
    }
    let dir = cache.join("sdk").join(hex(&hash.finalize()[..12]));
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let staging = cache
        .join("sdk")
        .join(format!(".staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    for (path, text) in files {
        let file = staging.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io_error(format!("creating {}", parent.display())))?;
        }
        std::fs::write(&file, text).map_err(io_error(format!("writing {}", file.display())))?;
    }
    std::fs::write(staging.join(".complete"), "").map_err(io_error("marking the SDK complete"))?;
    match std::fs::rename(&staging, &dir) {
        Ok(()) => Ok(dir),
        // Another build wrote it first.
        Err(_) if dir.join(".complete").exists() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(dir)
        }
        Err(e) => Err(io_error(format!("installing the SDK in {}", dir.display()))(e)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The program's own sources: the file, and the Python files and packages
/// next to it (which it may import), as (path relative to its directory,
/// bytes), sorted.
fn program_sources(app: &Path, language: Language) -> Result<Vec<(PathBuf, Vec<u8>)>, BuildError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| BuildError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let main = read(app)?;
    let dir = app
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut out = Vec::new();
    let name = app.file_name().map(PathBuf::from).unwrap_or_default();
    out.push((name.clone(), main));
    collect_sources(dir, Path::new(""), 0, language, &mut |rel, path| {
        if rel != name {
            out.push((rel, read(path)?));
        }
        Ok(())
    })?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Calls `found` for the source files of `dir` and of the directories
/// under it that hold sources of the language (for Python, packages: with
/// an `__init__.py`), a few levels deep.
fn collect_sources(
    dir: &Path,
    rel: &Path,
    depth: usize,
    language: Language,
    found: &mut dyn FnMut(PathBuf, &Path) -> Result<(), BuildError>,
) -> Result<(), BuildError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let is_source = |p: &Path| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| language.source_extensions().contains(&e))
        };
        if kind.is_file() && is_source(&path) {
            found(rel.join(&name), &path)?;
        } else if kind.is_dir()
            && depth < 4
            && name != "node_modules"
            && !name.to_string_lossy().starts_with('.')
            && (language != Language::Python || path.join("__init__.py").is_file())
        {
            collect_sources(&path, &rel.join(&name), depth + 1, language, found)?;
        }
    }
    Ok(())
}

fn cache_root() -> Result<PathBuf, BuildError> {
    crate::engine::cache_dir().ok_or_else(|| BuildError::Io {
        what: "finding a cache directory".into(),
        source: std::io::Error::other("set MONARCH_CACHE_DIR or HOME"),
    })
}

fn language_files(language: Language) -> Result<Vec<(String, String)>, BuildError> {
    sdk_files(language.sdk())
}

/// The cache's path for `app` built with `files` from `sources` (its
/// [`program_sources`]): a hash of the SDK, the program's path and its
/// sources.
fn cached_program(
    app: &Path,
    cache: &Path,
    files: &[(String, String)],
    sources: &[(PathBuf, Vec<u8>)],
) -> PathBuf {
    let mut key = Sha256::new();
    for (path, text) in files {
        key.update(path.as_bytes());
        key.update(text.as_bytes());
    }
    key.update(
        app.canonicalize()
            .unwrap_or_else(|_| app.to_path_buf())
            .to_string_lossy()
            .as_bytes(),
    );
    for (path, bytes) in sources {
        key.update(path.to_string_lossy().as_bytes());
        key.update([0]);
        key.update((bytes.len() as u64).to_le_bytes());
        key.update(bytes);
    }
    cache
        .join("programs")
        .join(format!("{}.wasm", hex(&key.finalize()[..16])))
}

/// What a build did.
#[derive(Debug)]
pub struct Built {
    /// The component.
    pub path: PathBuf,
    /// Whether it was already built (nothing ran).
    pub cached: bool,
}

/// Builds `app` into `out` (the cache, where `run app.py` looks, when
/// `None`), unless the cache already holds it. `progress` receives lines to show
/// while a build runs.
pub fn build(app: &Path, out: Option<&Path>, progress: &dyn Fn(&str)) -> Result<Built, BuildError> {
    let language = Language::of(app).ok_or_else(|| BuildError::Language(app.to_path_buf()))?;
    let cache = cache_root()?;
    let files = language_files(language)?;
    let sources = program_sources(app, language)?;
    let cached_path = cached_program(app, &cache, &files, &sources);
    if cached_path.exists() {
        if let Some(out) = out {
            std::fs::copy(&cached_path, out)
                .map_err(io_error(format!("writing {}", out.display())))?;
            return Ok(Built {
                path: out.to_path_buf(),
                cached: true,
            });
        }
        return Ok(Built {
            path: cached_path,
            cached: true,
        });
    }
    let target = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| cached_path.clone());
    let started = Instant::now();
    match language {
        Language::Python => build_python(
            app,
            &sources,
            &cache,
            &sdk_dir(&cache, &files)?,
            &target,
            progress,
        )?,
        Language::JavaScript => build_js(app, &sdk_dir(&cache, &files)?, &target, progress)?,
    }
    if out.is_some() {
        if let Some(parent) = cached_path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::copy(&target, &cached_path);
    }
    progress(&format!(
        "built {} in {:.1} s",
        target.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(Built {
        path: target,
        cached: false,
    })
}

/// The cache's path for the Python session built with `files`: a hash of
/// the SDK (and of what it is, so that no program's key equals it).
fn cached_session(cache: &Path, files: &[(String, String)]) -> PathBuf {
    let mut key = Sha256::new();
    key.update(b"python-session\0");
    for (path, text) in files {
        key.update(path.as_bytes());
        key.update([0]);
        key.update(text.as_bytes());
        key.update([0]);
    }
    cache
        .join("programs")
        .join(format!("session-{}.wasm", hex(&key.finalize()[..16])))
}

/// The built-in Python session (`monarch-host console`'s REPL): the SDK's
/// `monarch_session` module built by componentize-py for the WIT world
/// `session-program`, so that it is a session and its actors run in
/// instances of it. Built once per SDK (the one bundled in this binary, or
/// `MONARCH_SDK_CHECKOUT`'s) into the cache where programs go; later calls
/// return the cached component at once. `progress` receives lines to show
/// while a build runs. Returns the component's path.
pub fn python_session(progress: &dyn Fn(&str)) -> Result<PathBuf, BuildError> {
    let cache = cache_root()?;
    let files = language_files(Language::Python)?;
    let path = cached_session(&cache, &files);
    if path.exists() {
        return Ok(path);
    }
    let started = Instant::now();
    let sdk = sdk_dir(&cache, &files)?;
    progress("building the Python session with componentize-py (about 10 s; cached after)");
    let python = sdk.join("python");
    componentize_py(
        &sdk,
        "session-program",
        "monarch_session",
        &[&python],
        &path,
    )?;
    progress(&format!(
        "built {} in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(path)
}

fn build_python(
    app: &Path,
    program: &[(PathBuf, Vec<u8>)],
    cache: &Path,
    sdk: &Path,
    out: &Path,
    progress: &dyn Fn(&str),
) -> Result<(), BuildError> {
    let module = app
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| {
            !s.is_empty()
                && s.chars().all(|c| c.is_alphanumeric() || c == '_')
                && !s.starts_with(|c: char| c.is_ascii_digit())
        })
        .ok_or_else(|| {
            BuildError::Program(vec![format!(
                "{}: a Python program's file name must be a module name (letters, digits and _)",
                app.display()
            )])
        })?;
    if matches!(
        module,
        "monarch" | "monarch_program" | "monarch_session" | "wit_world" | "_monarch_build"
    ) {
        return Err(BuildError::Program(vec![format!(
            "{}: the name `{module}` is the SDK's; rename the program",
            app.display()
        )]));
    }
    let display = app.canonicalize().unwrap_or_else(|_| app.to_path_buf());
    let staging = tempdir(cache, "build")?;
    let generated = staging.join("gen");
    let sources = staging.join("src");
    std::fs::create_dir_all(&generated).map_err(io_error("creating the build directory"))?;
    std::fs::create_dir_all(&sources).map_err(io_error("creating the build directory"))?;
    let config = format!(
        "MODULE = {}\nDISPLAY = {}\n",
        serde_json::Value::from(module),
        serde_json::Value::from(display.to_string_lossy().into_owned())
    );
    std::fs::write(generated.join("_monarch_build.py"), config)
        .map_err(io_error("writing the build's settings"))?;
    for (rel, bytes) in program {
        let file = sources.join(rel);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(io_error("copying the program"))?;
        }
        std::fs::write(&file, bytes).map_err(io_error("copying the program"))?;
    }
    progress(&format!(
        "building {} with componentize-py (about 10 s; cached after)",
        app.display()
    ));
    let python = sdk.join("python");
    // `test` is `program` with the `tests` export: `run` and the actors
    // are the same, and `monarch-host test` finds the tests.
    let result = componentize_py(
        sdk,
        "test",
        "monarch_program",
        &[&generated, &python, &sources],
        out,
    );
    let _ = std::fs::remove_dir_all(&staging);
    result
}

/// Runs componentize-py on `module` of the Python path `paths` for the
/// WIT `world` of the SDK's WIT, into `out` (written whole, or not at
/// all). Lines of its output marked `monarch-build-error: ` (the SDK's
/// reports of the program's errors) become [`BuildError::Program`].
fn componentize_py(
    sdk: &Path,
    world: &str,
    module: &str,
    paths: &[&Path],
    out: &Path,
) -> Result<(), BuildError> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(io_error(format!("creating {}", parent.display())))?;
    }
    // Builds of one component may run at once (two sessions starting):
    // each writes its own partial file, and the last rename wins.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let partial = out.with_extension(format!(
        "wasm.{}-{}.partial",
        std::process::id(),
        BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let tool =
        std::env::var_os("MONARCH_COMPONENTIZE_PY").unwrap_or_else(|| "componentize-py".into());
    let mut command = Command::new(&tool);
    command
        .arg("-d")
        .arg(sdk.join("wit"))
        .args(["-w", world, "componentize", module]);
    for path in paths {
        command.arg("-p").arg(path);
    }
    let output = command
        .arg("-o")
        .arg(&partial)
        .env_remove("VIRTUAL_ENV")
        .output()
        .map_err(|e| BuildError::Tool {
            tool: "componentize-py",
            install: "pip install componentize-py==0.25.1",
            why: e.to_string(),
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        let problems: Vec<String> = text
            .lines()
            .filter_map(|l| {
                l.split_once("monarch-build-error: ")
                    .map(|(_, p)| p.to_string())
            })
            .collect();
        if !problems.is_empty() {
            return Err(BuildError::Program(problems));
        }
        return Err(BuildError::Toolchain {
            tool: "componentize-py",
            output: tail(&text, 40),
        });
    }
    std::fs::rename(&partial, out).map_err(io_error(format!("writing {}", out.display())))?;
    Ok(())
}

fn build_js(app: &Path, sdk: &Path, out: &Path, progress: &dyn Fn(&str)) -> Result<(), BuildError> {
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(io_error(format!("creating {}", parent.display())))?;
    }
    let node = std::env::var_os("MONARCH_NODE").unwrap_or_else(|| "node".into());
    progress(&format!(
        "building {} with jco (QuickJS; a few seconds, cached after)",
        app.display()
    ));
    let partial = out.with_extension("wasm.partial");
    let output = Command::new(&node)
        .arg(sdk.join("js").join("build.mjs"))
        .arg(app)
        .arg("-o")
        .arg(&partial)
        .arg("--wit")
        .arg(sdk.join("wit"))
        .output()
        .map_err(|e| BuildError::Tool {
            tool: "node",
            install: "apt-get install nodejs npm",
            why: e.to_string(),
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        return Err(BuildError::Program(vec![tail(text.trim_end(), 40)]));
    }
    std::fs::rename(&partial, out).map_err(io_error(format!("writing {}", out.display())))?;
    Ok(())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A fresh directory under the cache.
fn tempdir(cache: &Path, what: &str) -> Result<PathBuf, BuildError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = cache
        .join("tmp")
        .join(format!("{what}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
    Ok(dir)
}
