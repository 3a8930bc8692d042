//! `monarch-host test app.py`: a Python program's tests, its `test*`
//! functions, built and run as a user runs them. A deliberately failing
//! program (`tests/programs/python-tests/py_failing_tests.py`) is counted
//! test by test, exits 1, and shows the failed assert's values and line,
//! and the traceback of a test that raised; its JUnit report validates;
//! `examples/python/counter.py`'s tests pass, in source order, among them
//! one that crashes a proc with `monarch.faults` and checks that the
//! program recovers.
//!
//! The build needs componentize-py (scripts/setup). Without it these tests
//! fail, saying so; set MONARCH_SKIP_ANYLANG=1 to skip them on a machine
//! that cannot have it (as tests/anylang.rs).

#[path = "support/cli.rs"]
mod cli;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cli::{Command, assert_junit_validates, assert_verdicts, monarch_host_command, test_report};

/// Long enough to build a program with componentize-py, compile its
/// component in a debug build on a busy machine, and run its tests.
const LIMIT: Duration = Duration::from_secs(1200);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn program(path: &str) -> String {
    repo().join(path).to_string_lossy().into_owned()
}

/// False (and a line saying why) when the Python toolchain is to be
/// skipped.
fn toolchain() -> bool {
    if std::env::var_os("MONARCH_SKIP_ANYLANG").is_some() {
        eprintln!("skipped: MONARCH_SKIP_ANYLANG is set");
        return false;
    }
    true
}

fn test_command(args: &[&str]) -> Command {
    let args: Vec<&str> = std::iter::once("test")
        .chain(args.iter().copied())
        .collect();
    let run = monarch_host_command(&args, LIMIT, &[]);
    assert!(
        !run.stderr.contains("componentize-py was not found"),
        "these tests need componentize-py: run scripts/setup (or set MONARCH_SKIP_ANYLANG=1 to skip them)\n{run:?}"
    );
    run
}

/// The failing program: 1 passed, 2 failed, exit 1; the failed assert's
/// values and line, the raised exception's traceback, what each printed;
/// a JUnit report that validates and says the same.
#[test]
fn a_failing_python_test_shows_its_values_and_line_and_the_run_exits_1() {
    if !toolchain() {
        return;
    }
    let app = program("tests/programs/python-tests/py_failing_tests.py");
    let dir = std::env::temp_dir().join(format!("monarch-py-junit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let report = dir.join("report.xml");
    let run = test_command(&[
        &app,
        "--timeout",
        "300",
        "--junit",
        report.to_str().expect("a UTF-8 path"),
    ]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_verdicts(
        &run,
        &[
            ("test_passes", "ok"),
            ("test_assert_fails", "FAILED"),
            ("test_raises", "FAILED"),
        ],
    );
    assert!(
        run.after("test result: ")
            .starts_with("FAILED. 1 passed; 2 failed; 0 filtered out; finished in "),
        "{run:?}"
    );

    let failed = test_report(&run, "test_assert_fails");
    let asked = failed
        .find("test_assert_fails asks an actor")
        .unwrap_or_else(|| panic!("its output is in its report:\n{failed}"));
    let why = failed
        .find("Error: AssertionError: assert 3 == 4 (at ")
        .unwrap_or_else(|| panic!("the report says the values compared:\n{failed}"));
    assert!(asked < why, "output first, then why:\n{failed}");
    let why_line = failed[why..].lines().next().unwrap_or_default();
    assert!(
        why_line.ends_with("py_failing_tests.py:24)"),
        "the first line names the assert's file and line: {why_line}\n{failed}"
    );
    for needle in [
        "  where left = 3, right = 4",
        "Traceback (most recent call last):",
        "py_failing_tests.py\", line 24, in test_assert_fails",
        "    assert total == 4",
    ] {
        assert!(failed.contains(needle), "no {needle:?} in:\n{failed}");
    }

    let raised = test_report(&run, "test_raises");
    for needle in [
        "test_raises is about to raise",
        "Error: ValueError: no such widget: 'sprocket' (at ",
        "py_failing_tests.py:29)",
        "py_failing_tests.py\", line 29, in test_raises",
    ] {
        assert!(raised.contains(needle), "no {needle:?} in:\n{raised}");
    }
    assert!(
        !raised.contains("where left"),
        "a raise is not an assert:\n{raised}"
    );
    assert!(
        run.lines_with("---- test_passes ----").is_empty(),
        "a passed test has no report:\n{run:?}"
    );

    let xml = std::fs::read_to_string(&report).expect("the JUnit report");
    assert_junit_validates(&report, true);
    assert!(
        xml.contains(
            "<testsuite name=\"py_failing_tests\" tests=\"3\" failures=\"2\" errors=\"0\" skipped=\"0\""
        ),
        "{xml}"
    );
    assert!(
        xml.contains("<testcase classname=\"py_failing_tests\" name=\"test_passes\" time=\""),
        "{xml}"
    );
    assert!(
        xml.contains("<failure message=\"Error: AssertionError: assert 3 == 4 (at "),
        "the failure's message is its first line:\n{xml}"
    );
    assert!(xml.contains("where left = 3, right = 4"), "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 2, "{xml}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `examples/python/counter.py`: its tests pass, listed in source order
/// (the order they run in with one job), the one that crashes a proc with
/// `monarch.faults.kill` and recovers among them; `--filter` runs one.
#[test]
fn the_python_counter_example_passes_its_tests_with_a_crash_injected() {
    if !toolchain() {
        return;
    }
    let app = program("examples/python/counter.py");
    let run = test_command(&[&app, "--timeout", "300"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let ran: Vec<&str> = run.lines_with(" ... ");
    assert_eq!(
        ran,
        [
            "test test_counters_count_up ... ok",
            "test test_a_negative_amount_raises_value_error_and_the_counter_lives_on ... ok",
            "test test_a_crashed_proc_is_seen_and_the_counters_recover ... ok",
            "test test_a_partitioned_proc_answers_once_the_partition_ends ... ok",
        ],
        "{run:?}"
    );
    assert!(
        run.after("test result: ")
            .starts_with("ok. 4 passed; 0 failed; 0 filtered out; finished in "),
        "{run:?}"
    );

    let run = test_command(&[&app, "--filter", "crashed", "--timeout", "300"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.lines_with(" ... "),
        ["test test_a_crashed_proc_is_seen_and_the_counters_recover ... ok"],
        "{run:?}"
    );
    assert!(
        run.after("test result: ")
            .starts_with("ok. 1 passed; 0 failed; 3 filtered out; "),
        "{run:?}"
    );
}

/// Every Python example has tests, and they pass: hello, ping-pong
/// (a refused ping among them) and data-parallel (training lowers the
/// loss; settings that cannot train are refused by name).
#[test]
fn the_python_examples_tests_pass() {
    if !toolchain() {
        return;
    }
    for (example, count) in [("hello", 1), ("ping_pong", 2), ("data_parallel", 2)] {
        let app = program(&format!("examples/python/{example}.py"));
        let run = test_command(&[&app, "--timeout", "300"]);
        assert_eq!(run.code, Some(0), "{example}: {run:?}");
        assert_eq!(run.lines_with(" ... ok").len(), count, "{example}: {run:?}");
        assert!(
            run.after("test result: ")
                .starts_with(&format!("ok. {count} passed; 0 failed")),
            "{example}: {run:?}"
        );
    }
}

/// Python faults under simulation: the counter example's tests, a crash
/// and a partition among them, pass under several seeds, and one seed's
/// whole output, its trace included, is the same twice.
#[test]
fn the_python_counter_example_passes_under_simulation_the_same_way_twice() {
    if !toolchain() {
        return;
    }
    let app = program("examples/python/counter.py");
    let run = test_command(&[&app, "--sim", "--seeds", "1..5"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.lines_with("... ok (5 seeds)").len(), 4, "{run:?}");
    let traced = || test_command(&[&app, "--sim", "--seed", "9", "--trace"]);
    let output = |run: &Command| -> Vec<String> {
        run.stdout
            .iter()
            .map(|(_, line)| line.clone())
            .filter(|line| !line.starts_with("test result: "))
            .collect()
    };
    let (first, second) = (traced(), traced());
    assert_eq!(first.code, Some(0), "{first:?}");
    assert!(first.lines_with(" ms  ").len() > 20, "{first:?}");
    assert_eq!(output(&first), output(&second));
}

/// A script whose tests cannot be listed, because it does not build (a
/// syntax error), exits 2 and says where, before any test runs (TT-3; as
/// pytest's collection errors).
#[test]
fn a_python_program_that_does_not_build_exits_2_saying_where() {
    if !toolchain() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("monarch-py-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let app = dir.join("broken_tests.py");
    std::fs::write(&app, "def test_one():\n    assert 1 ==\n").expect("the script");
    let run = test_command(&[app.to_str().expect("a UTF-8 path")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("broken_tests.py:2:") && run.stderr.contains("SyntaxError"),
        "{run:?}"
    );
    assert!(run.stdout.is_empty(), "no test ran: {run:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
