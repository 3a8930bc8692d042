//! Builds the guest programs that the component tests run.
//!
//! The guest workspace (`guest-sdk/Cargo.toml`: the SDK, the programs in
//! `examples/` and the edge-case programs in `tests/programs/`) is built for
//! `wasm32-wasip2` by a nested `cargo build`, into a target directory of its
//! own, `guest-programs` beside this profile's `build` directory (for
//! instance `target/debug/guest-programs`), so that it never waits on the
//! lock of the target directory this build holds, and so that `cargo
//! clippy` and `cargo test`, whose runs of this script get different
//! `OUT_DIR`s, share one guest build. Then, for every program (every
//! `cdylib` of that workspace):
//!
//! - `GUEST_<NAME>` (e.g. `GUEST_PING_PONG`) is set, at compile time, to the
//!   absolute path of its `.wasm`; tests read it with `env!`;
//! - if it is an example or a test program (under `examples/` or
//!   `tests/programs/`), `$OUT_DIR/guest_programs.rs` lists it in
//!   `foreach_guest_program!`, which calls a macro with each program's name
//!   (`ping_pong`), so that a test file can require a test named after every
//!   program. Other members of the guest workspace (the benchmark's guest)
//!   get their `GUEST_<NAME>` only.

use std::env;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target guest programs are built for.
const GUEST_TARGET: &str = "wasm32-wasip2";

/// Where the programs that must each have a test live, relative to the
/// repository root.
const TESTED_PROGRAMS: &[&str] = &["examples", "tests/programs"];

/// What the guest build depends on, relative to the repository root; the
/// directory of every program cargo reports is added to it. `guest-sdk/target`
/// is left out: the guests are built elsewhere, and a build there must not
/// rerun this script.
const GUEST_SOURCES: &[&str] = &[
    "guest-sdk/Cargo.toml",
    "guest-sdk/Cargo.lock",
    "guest-sdk/rust",
    "examples",
    "tests/programs",
    "wit",
];

fn main() {
    let manifest_dir = cargo_path("CARGO_MANIFEST_DIR");
    // Canonical, as the paths in cargo's messages are.
    let repo = std::fs::canonicalize(&manifest_dir)
        .unwrap_or(manifest_dir)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| fail("the tests crate has no parent directory"));
    let out_dir = cargo_path("OUT_DIR");
    for source in GUEST_SOURCES {
        println!("cargo::rerun-if-changed={}", repo.join(source).display());
    }
    if let Err(message) = check_guest_target() {
        fail(&message);
    }
    let programs = build_guests(&repo, &guest_target_dir(&out_dir));
    let mut foreach = String::from(
        "/// Calls `$mac!(name)` for every example and test program, by library name.\n\
         macro_rules! foreach_guest_program {\n    ($mac:ident) => {\n",
    );
    for program in &programs {
        if let Some(dir) = program.manifest.parent() {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
        println!(
            "cargo::rustc-env=GUEST_{}={}",
            program.name.to_uppercase(),
            program.wasm.display()
        );
        let tested = TESTED_PROGRAMS
            .iter()
            .any(|dir| program.manifest.starts_with(repo.join(dir)));
        if tested {
            let _ = writeln!(foreach, "        $mac!({});", program.name);
        }
    }
    foreach.push_str("    };\n}\n");
    let generated = out_dir.join("guest_programs.rs");
    if let Err(e) = std::fs::write(&generated, foreach) {
        fail(&format!("cannot write {}: {e}", generated.display()));
    }
}

/// A path that cargo gives every build script.
fn cargo_path(name: &str) -> PathBuf {
    env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| fail(&format!("cargo did not set {name}")))
}

/// The guest build's target directory: `guest-programs` in the directory
/// that holds `build/<package>-<hash>/out`, else in `OUT_DIR`.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "build"))
        .and_then(Path::parent)
        .unwrap_or(out_dir)
        .join("guest-programs")
}

/// Stops the build with `message`, shown by cargo as an error.
fn fail(message: &str) -> ! {
    for line in message.lines() {
        println!("cargo::error={line}");
    }
    // Cargo fails the build for the errors, and shows them as such; a
    // non-zero exit would show this script's raw output instead.
    std::process::exit(0);
}

/// Checks that the standard library for [`GUEST_TARGET`] is installed,
/// before a nested build fails with `can't find crate for core`.
fn check_guest_target() -> Result<(), String> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let output = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", GUEST_TARGET])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", rustc.to_string_lossy()))?;
    let libdir = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if output.status.success() && Path::new(&libdir).is_dir() {
        return Ok(());
    }
    Err(format!(
        "the Rust target `{GUEST_TARGET}` is not installed, and the component tests \
         need it to build their guest programs.\n\
         Install it with `rustup target add {GUEST_TARGET}` (scripts/setup does), then build again."
    ))
}

/// A guest program: a `cdylib` of the guest workspace.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Program {
    /// The library's name, such as `ping_pong`.
    name: String,
    /// Its crate's `Cargo.toml`.
    manifest: PathBuf,
    /// The component cargo made.
    wasm: PathBuf,
}

/// Builds the guest workspace into `target_dir`; returns every program,
/// sorted by name.
fn build_guests(repo: &Path, target_dir: &Path) -> Vec<Program> {
    let cargo = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let manifest = repo.join("guest-sdk/Cargo.toml");
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--release")
        .arg("--locked")
        .args(["--target", GUEST_TARGET])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    clear_outer_build_env(&mut command);
    let output = command
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", cargo.to_string_lossy())));
    if !output.status.success() {
        // Exit non-zero, so that cargo shows this script's stderr: the
        // compiler's messages about the guests.
        eprintln!(
            "error: building the guest programs failed ({}); the messages are above.\n\
             To build them on their own: cd guest-sdk && cargo build --release --target {GUEST_TARGET} --locked",
            output.status
        );
        std::process::exit(1);
    }
    let mut programs = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some(program) = program_artifact(line) {
            programs.push(program);
        }
    }
    programs.sort();
    programs.dedup();
    if programs.is_empty() {
        fail("the guest build made no .wasm programs");
    }
    programs
}

/// Removes what the outer build sets for this script and would otherwise
/// leak into the guest build: host flags, target and target-directory
/// overrides, clippy's wrapper, the host linker, and the outer target's
/// cfgs and features.
fn clear_outer_build_env(command: &mut Command) {
    const NAMES: &[&str] = &[
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_TARGET_DIR",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_LINKER",
    ];
    const PREFIXES: &[&str] = &["CARGO_ENCODED_", "CARGO_CFG_", "CARGO_FEATURE_"];
    for (name, _) in env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if NAMES.contains(&name) || PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
            command.env_remove(name);
        }
    }
}

/// The program a line of cargo's JSON output names: a `cdylib` and its
/// `.wasm`.
fn program_artifact(line: &str) -> Option<Program> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let target = &message["target"];
    let is_cdylib = target["kind"]
        .as_array()?
        .iter()
        .any(|kind| kind == "cdylib");
    if !is_cdylib {
        return None;
    }
    let name = target["name"].as_str()?.replace('-', "_");
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        fail(&format!(
            "guest program `{name}`: name it in lowercase letters, digits and `-`"
        ));
    }
    let wasm = message["filenames"]
        .as_array()?
        .iter()
        .filter_map(|file| file.as_str())
        .find(|file| file.ends_with(".wasm"))?;
    Some(Program {
        name,
        manifest: PathBuf::from(message["manifest_path"].as_str()?),
        wasm: PathBuf::from(wasm),
    })
}
