//! Programs written in Python and JavaScript, end to end through the
//! `monarch-host` command, as a user runs them: `run app.py` (built and
//! cached implicitly), `build`, `submit` to a server, the examples, every
//! feature of the Python SDK (tests/programs/python/features.py), and the
//! SDKs' own unit tests (pytest, node --test).
//!
//! The toolchains (componentize-py, pytest, jco) come from scripts/setup.
//! Without them these tests fail, saying so; set MONARCH_SKIP_ANYLANG=1 to
//! skip them on a machine that cannot have them.

#[path = "support/cli.rs"]
mod cli;

#[path = "support/serve.rs"]
mod serve_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cli::monarch_host;

const BUILD_LIMIT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// False (and a line saying why) when the toolchains are to be skipped.
fn toolchains() -> bool {
    if std::env::var_os("MONARCH_SKIP_ANYLANG").is_some() {
        eprintln!("skipped: MONARCH_SKIP_ANYLANG is set");
        return false;
    }
    true
}

fn cli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
}

fn example(path: &str) -> String {
    repo().join(path).to_string_lossy().into_owned()
}

#[test]
fn every_python_sdk_feature_works_on_child_procs() {
    if !toolchains() {
        return;
    }
    let features = example("tests/programs/python/features.py");
    let run = monarch_host(&[&features], BUILD_LIMIT);
    assert_eq!(run.code, Some(0), "{run:?}");
    let done: usize = run.after("done ").trim().parse().expect("a count");
    assert!(done >= 28, "{run:?}");
    assert!(run.lines_with("FAIL").is_empty(), "{run:?}");
    // Output printed by actors reaches the controller's output, prefixed.
    assert_eq!(run.lines_with("] worker").len(), 4, "{run:?}");
}

#[test]
fn every_python_sdk_feature_works_in_process() {
    if !toolchains() {
        return;
    }
    let features = example("tests/programs/python/features.py");
    let run = monarch_host(&["--in-process", &features], BUILD_LIMIT);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.lines_with("FAIL").is_empty(), "{run:?}");
}

#[test]
fn the_python_examples_run_like_their_rust_twins() {
    if !toolchains() {
        return;
    }
    let hello = monarch_host(
        &[&example("examples/python/hello.py"), "--", "3"],
        BUILD_LIMIT,
    );
    assert_eq!(hello.code, Some(0), "{hello:?}");
    assert_eq!(hello.lines_with("hello from rank").len(), 3, "{hello:?}");
    assert!(
        !hello
            .lines_with("rank 2: hello from rank 2 of 3")
            .is_empty(),
        "{hello:?}"
    );

    let ping = monarch_host(&[&example("examples/python/ping_pong.py")], BUILD_LIMIT);
    assert_eq!(ping.code, Some(0), "{ping:?}");
    assert_eq!(ping.after("total hits: "), "6", "{ping:?}");

    let counter = monarch_host(&[&example("examples/python/counter.py")], BUILD_LIMIT);
    assert_eq!(counter.code, Some(0), "{counter:?}");
    assert!(
        !counter.lines_with("ValueError]: cannot add -1").is_empty(),
        "{counter:?}"
    );
    assert!(
        !counter.lines_with("SupervisionError, kind trap").is_empty(),
        "{counter:?}"
    );
    assert_eq!(
        counter.after("counter 0 still counts: "),
        "15",
        "{counter:?}"
    );

    let train = monarch_host(
        &[
            &example("examples/python/data_parallel.py"),
            "--",
            "--procs",
            "2",
            "--steps",
            "8",
        ],
        BUILD_LIMIT,
    );
    assert_eq!(train.code, Some(0), "{train:?}");
    assert_eq!(
        train
            .stdout
            .iter()
            .filter(|(_, l)| l.starts_with("step "))
            .count(),
        8,
        "{train:?}"
    );
    assert!(
        !train.lines_with("the loss fell every step").is_empty(),
        "{train:?}"
    );
}

#[test]
fn a_python_controller_drives_rust_actors() {
    if !toolchains() {
        return;
    }
    let library = format!("rust={}", env!("GUEST_COUNTER"));
    let example = example("examples/python/cross_language.py");
    for mode in [&[][..], &["--in-process"][..]] {
        let mut args: Vec<&str> = mode.to_vec();
        args.extend([example.as_str(), "--actors", &library]);
        let run = monarch_host(&args, BUILD_LIMIT);
        assert_eq!(run.code, Some(0), "{run:?}");
        assert_eq!(
            run.after("Rust counters after adding 5: "),
            "[15, 15, 15]",
            "{run:?}"
        );
        assert_eq!(run.after("summed in the host: "), "45", "{run:?}");
        assert_eq!(
            run.after("Rust said no: "),
            "True cannot add -1: counters only count up",
            "{run:?}"
        );
        assert_eq!(
            run.after("a Python actor summed the Rust counters: "),
            "45",
            "{run:?}"
        );
    }
    // A class of a library that was not given is refused by name.
    let run = monarch_host(&[&example], BUILD_LIMIT);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("no actor library `rust`"), "{run:?}");
}

#[test]
fn a_second_run_of_a_python_program_does_not_build_again() {
    if !toolchains() {
        return;
    }
    let hello = example("examples/python/hello.py");
    let first = monarch_host(&[&hello, "--", "1"], BUILD_LIMIT);
    assert_eq!(first.code, Some(0), "{first:?}");
    let second = monarch_host(&[&hello, "--", "1"], Duration::from_secs(60));
    assert_eq!(second.code, Some(0), "{second:?}");
    assert!(!second.stderr.contains("building"), "{second:?}");
}

#[test]
fn python_build_errors_name_the_file_and_line() {
    if !toolchains() {
        return;
    }
    let dir = tempdir("build-errors");
    let syntax = dir.join("broken.py");
    std::fs::write(&syntax, "from monarch.actor import Actor\n\nx = (1,\n").unwrap();
    let out = cli().arg("build").arg(&syntax).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("broken.py:3") && stderr.contains("SyntaxError"),
        "{stderr}"
    );

    let missing = dir.join("needs_missing.py");
    std::fs::write(&missing, "import no_such_module_here\n").unwrap();
    let out = cli().arg("build").arg(&missing).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no_such_module_here"), "{stderr}");

    // An exception at run time is a Python traceback with the program's
    // file and line, and a failed run.
    let raises = dir.join("raises.py");
    std::fs::write(&raises, "def f():\n    return {}['key']\n\nf()\n").unwrap();
    let run = monarch_host(&[&raises.to_string_lossy()], BUILD_LIMIT);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("raises.py\", line 2"), "{run:?}");
    assert!(run.stderr.contains("KeyError"), "{run:?}");
}

#[test]
fn a_built_python_component_runs_and_is_accepted_by_a_server() {
    if !toolchains() {
        return;
    }
    let dir = tempdir("built");
    let wasm = dir.join("hello.wasm");
    let out = cli()
        .arg("build")
        .arg(example("examples/python/hello.py"))
        .arg("-o")
        .arg(&wasm)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = monarch_host(
        &[&wasm.to_string_lossy(), "--", "2"],
        Duration::from_secs(120),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.lines_with("hello from rank").len(), 2, "{run:?}");

    // `submit app.py` builds it and runs it as a job on a server.
    let server = serve_support::ServeProcess::start(&dir, &[]);
    std::fs::write(dir.join("client-token"), serve_support::TOKEN).unwrap();
    let out = cli()
        .arg("submit")
        .arg(example("examples/python/ping_pong.py"))
        .args(["--server", &server.base, "--token-file"])
        .arg(dir.join("client-token"))
        .arg("--follow")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("total hits: 6"), "{stdout}");
}

#[test]
fn the_javascript_examples_and_sdk_tests_pass() {
    if !toolchains() {
        return;
    }
    let hello = monarch_host(&[&example("examples/js/hello.js"), "--", "3"], BUILD_LIMIT);
    assert_eq!(hello.code, Some(0), "{hello:?}");
    assert_eq!(hello.lines_with("hello from rank").len(), 3, "{hello:?}");

    let unit = Command::new("node")
        .args(["--test"])
        .arg(repo().join("guest-sdk/js/test"))
        .output()
        .expect("node (scripts/setup installs it)");
    assert!(
        unit.status.success(),
        "{}",
        String::from_utf8_lossy(&unit.stdout)
    );

    let e2e = Command::new("bash")
        .arg(repo().join("guest-sdk/js/test/e2e.sh"))
        .env("MONARCH_HOST", env!("CARGO_BIN_EXE_monarch-host-cli"))
        .output()
        .unwrap();
    assert!(
        e2e.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&e2e.stdout),
        String::from_utf8_lossy(&e2e.stderr)
    );
}

#[test]
fn the_python_sdk_unit_tests_pass() {
    if !toolchains() {
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "pytest", "-q"])
        .arg(repo().join("guest-sdk/python/tests"))
        .output()
        .expect("python3 with pytest (scripts/setup installs it)");
    assert!(
        out.status.success(),
        "pytest failed (run scripts/setup if it is missing):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("monarch-anylang-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
