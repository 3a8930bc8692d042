//! `monarch-host test` (`monarch_host::test_runner`), run as a user runs
//! it: the examples' tests pass; `failing-tests`, whose tests end every
//! way a test can, is reported test by test with what each printed and
//! why it failed (TT-2); the exit status says which (TT-3); `--filter`,
//! `--jobs` and `--timeout` do what they say; `--junit` writes a report a
//! CI server reads (TT-4); faults made from tests are seen as real ones,
//! and `--sim` finds a racy test's failing seed and replays it with the
//! same trace (TS-1, TS-2).

#[path = "support/cli.rs"]
mod cli;

use std::time::Duration;

use cli::{Command, assert_junit_validates, assert_verdicts, monarch_host_command, test_report};

/// Long enough for a debug build to compile a program into a cold cache
/// and run its tests on a busy machine.
const LIMIT: Duration = Duration::from_secs(300);

fn test_command(args: &[&str]) -> Command {
    let args: Vec<&str> = std::iter::once("test")
        .chain(args.iter().copied())
        .collect();
    monarch_host_command(&args, LIMIT, &[])
}

fn stdout_text(run: &Command) -> String {
    run.stdout
        .iter()
        .map(|(_, line)| format!("{line}\n"))
        .collect()
}

/// Asserts that every test of a program passes, and that the counts agree.
fn assert_all_pass(program: &str) {
    let run = test_command(&[program, "--timeout", "120"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let running: usize = run
        .after("running ")
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `running N tests` line:\n{run:?}"));
    assert!(running >= 1, "{program} has tests:\n{run:?}");
    let ok = run.lines_with(" ... ok").len();
    assert_eq!(ok, running, "one `ok` line per test:\n{run:?}");
    assert!(run.lines_with("FAILED").is_empty(), "{run:?}");
    assert!(
        run.after("test result: ").starts_with(&format!(
            "ok. {running} passed; 0 failed; 0 filtered out; finished in "
        )),
        "{run:?}"
    );
}

/// TT-3: the examples' tests pass, and the run exits 0.
#[test]
fn tt3_the_examples_tests_pass_and_exit_0() {
    assert_all_pass(env!("GUEST_HELLO"));
    assert_all_pass(env!("GUEST_COUNTER"));
    assert_all_pass(env!("GUEST_PING_PONG"));
    assert_all_pass(env!("GUEST_DATA_PARALLEL"));
}

/// Faults made on purpose (`monarch_guest::faults`): a crash, an exit and
/// a lost host are each seen as `proc-lost` with their own reason; a
/// delay slows the calls between two ranks until healed; dropped messages
/// arrive once the network is back; a partitioned rank times out and
/// answers once healed; faults outside the mesh are refused by name.
#[test]
fn faults_made_from_a_test_are_seen_as_the_real_ones() {
    assert_all_pass(env!("GUEST_FAULTS"));
}

/// TT-2, TT-3: each failing test is reported with what it printed and
/// why it failed (a panic's values and source line, an `Err`'s text, a
/// timeout); the passing one is not; the run exits 1.
#[test]
fn tt2_failing_tests_are_reported_with_their_output_and_why() {
    let run = test_command(&[env!("GUEST_FAILING_TESTS"), "--timeout", "10"]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_verdicts(
        &run,
        &[
            ("passes", "ok"),
            ("panics_on_an_assertion", "FAILED"),
            ("returns_an_error", "FAILED"),
            ("never_finishes", "FAILED"),
        ],
    );
    assert!(
        run.after("test result: ")
            .starts_with("FAILED. 1 passed; 3 failed; 0 filtered out; finished in "),
        "{run:?}"
    );

    let panicked = test_report(&run, "panics_on_an_assertion");
    for needle in [
        "panicked at",
        "lib.rs:",
        "left: 2",
        "right: 3",
        "wasm backtrace",
    ] {
        assert!(panicked.contains(needle), "no {needle:?} in:\n{panicked}");
    }
    assert!(
        panicked.contains("\nthe test panicked at ") && panicked.contains("lib.rs:"),
        "after its output, the report says first that it panicked, and where:\n{panicked}"
    );
    let errored = test_report(&run, "returns_an_error");
    let said = errored
        .find("returns_an_error says hello")
        .unwrap_or_else(|| panic!("its stdout is in its report:\n{errored}"));
    let failed = errored
        .find("the value was 7, expected 8")
        .unwrap_or_else(|| panic!("its Err is in its report:\n{errored}"));
    assert!(said < failed, "output first, then the error:\n{errored}");
    assert!(
        errored.contains("returns_an_error logs hello"),
        "its log line is in its report:\n{errored}"
    );
    assert!(
        !errored.contains("left: 2"),
        "another test's output stays out of it:\n{errored}"
    );
    let hung = test_report(&run, "never_finishes");
    assert!(hung.contains("timed out after 10 s"), "{hung}");
    assert!(
        !stdout_text(&run).contains("---- passes ----"),
        "a passed test has no report:\n{run:?}"
    );
    let lines: Vec<&str> = run.stdout.iter().map(|(_, l)| l.as_str()).collect();
    let list = lines
        .iter()
        .rposition(|l| *l == "failures:")
        .unwrap_or_else(|| panic!("no list of failures:\n{run:?}"));
    let mut listed: Vec<&str> = lines[list + 1..]
        .iter()
        .take_while(|l| !l.is_empty())
        .map(|l| l.trim())
        .collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        [
            "never_finishes",
            "panics_on_an_assertion",
            "returns_an_error"
        ],
        "the failures are listed after their reports:\n{run:?}"
    );
}

/// `--filter` runs only the matching tests, counted as filtered out;
/// `--timeout` ends a test that never finishes, and the run with it.
#[test]
fn filter_narrows_and_timeout_ends_a_test_that_never_finishes() {
    let run = test_command(&[
        env!("GUEST_FAILING_TESTS"),
        "--filter",
        "never",
        "--timeout",
        "2",
    ]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.after("running "), "1 test", "{run:?}");
    assert_eq!(run.lines_with(" ... "), ["test never_finishes ... FAILED"]);
    assert!(
        test_report(&run, "never_finishes").contains("timed out after 2 s"),
        "{run:?}"
    );
    assert!(
        run.after("test result: ")
            .starts_with("FAILED. 0 passed; 1 failed; 3 filtered out; "),
        "{run:?}"
    );
    assert!(
        run.elapsed < Duration::from_secs(60),
        "the timed-out test's procs were stopped and the run ended: {run:?}"
    );

    let run = test_command(&[env!("GUEST_FAILING_TESTS"), "--filter", "passes"]);
    assert_eq!(run.code, Some(0), "only the passing test ran:\n{run:?}");
    assert!(
        run.after("test result: ")
            .starts_with("ok. 1 passed; 0 failed; 3 filtered out; "),
        "{run:?}"
    );
}

/// Checks that `xml` is well formed as far as a report needs: every tag
/// closed in order, attributes quoted, only the five entities and
/// character references.
fn assert_well_formed(xml: &str) {
    let body = xml
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
        .unwrap_or_else(|| panic!("no XML declaration:\n{xml}"));
    let mut open: Vec<&str> = Vec::new();
    let mut rest = body;
    while let Some(at) = rest.find('<') {
        assert_text(&rest[..at], xml);
        let end = rest[at..]
            .find('>')
            .unwrap_or_else(|| panic!("an unclosed tag:\n{xml}"));
        let tag = &rest[at + 1..at + end];
        rest = &rest[at + end + 1..];
        if let Some(closed) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(closed), "tags close in order:\n{xml}");
            continue;
        }
        let (name, attributes) = tag.split_once(' ').unwrap_or((tag, ""));
        let attributes = attributes.strip_suffix('/').unwrap_or(attributes);
        assert_eq!(
            attributes.matches('"').count() % 2,
            0,
            "attributes are quoted: <{tag}>"
        );
        assert_text(attributes, xml);
        if !tag.ends_with('/') {
            open.push(name);
        }
    }
    assert_text(rest, xml);
    assert!(open.is_empty(), "unclosed: {open:?}\n{xml}");
}

/// Text with no markup characters but the known entity references.
fn assert_text(text: &str, xml: &str) {
    for (at, _) in text.match_indices('&') {
        let entity = &text[at..];
        let known = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"]
            .iter()
            .any(|e| entity.starts_with(e));
        assert!(known, "a bare `&` at {entity:.20}:\n{xml}");
    }
    assert!(!text.contains('>'), "a bare `>` in {text:?}:\n{xml}");
}

/// TT-4: `--jobs 3` runs the same tests with the same verdicts, and
/// `--junit` writes a well-formed report with the counts and failures.
#[test]
fn tt4_jobs_give_the_same_verdicts_and_junit_writes_a_report() {
    let dir = std::env::temp_dir().join(format!("monarch-test-junit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let report = dir.join("report.xml");
    let report_arg = report.to_str().expect("a UTF-8 path");
    let run = test_command(&[
        env!("GUEST_FAILING_TESTS"),
        "--jobs",
        "3",
        "--timeout",
        "10",
        "--junit",
        report_arg,
    ]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.lines_with(" ... ").len(), 4, "{run:?}");
    assert!(
        run.after("test result: ")
            .starts_with("FAILED. 1 passed; 3 failed; 0 filtered out; "),
        "{run:?}"
    );
    let xml = std::fs::read_to_string(&report).expect("the JUnit report");
    assert_well_formed(&xml);
    assert_junit_validates(&report, true);
    // The schema check can fail: a test case without its name does.
    let broken = dir.join("broken.xml");
    std::fs::write(&broken, xml.replacen(" name=\"passes\"", "", 1)).expect("a broken copy");
    assert_junit_validates(&broken, false);
    std::fs::remove_file(&broken).expect("removed");
    assert!(
        xml.contains(
            "<testsuite name=\"failing_tests\" tests=\"4\" failures=\"3\" errors=\"0\" skipped=\"0\""
        ),
        "{xml}"
    );
    assert_eq!(xml.matches("<testcase ").count(), 4, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 3, "{xml}");
    assert!(
        xml.contains("<testcase classname=\"failing_tests\" name=\"passes\" time=\""),
        "{xml}"
    );
    assert!(xml.contains("the value was 7, expected 8"), "{xml}");
    assert!(xml.contains("left: 2"), "{xml}");
    assert!(xml.contains("timed out after 10 s"), "{xml}");
    // The report was renamed into place: nothing else is left beside it.
    let left = std::fs::read_dir(&dir).expect("listed").count();
    assert_eq!(left, 1, "only the report is in {}", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
}

/// TT-3: what has no tests to list exits 2 and says why: a file that is
/// not a component, a component without the `tests` export, a missing
/// file, a bad flag, a JUnit report that cannot be written.
#[test]
fn tt3_what_has_no_tests_exits_2_with_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("monarch-test-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let text = dir.join("notes.wasm");
    std::fs::write(&text, "not a component").expect("a text file");
    let run = test_command(&[text.to_str().expect("a UTF-8 path")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("notes.wasm"), "{run:?}");
    assert!(run.stdout.is_empty(), "no tests were run: {run:?}");

    let run = test_command(&[env!("GUEST_CONTROLLER_ONLY")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains(
            "has no tests: it does not export monarch:host/tests (build it with the Rust SDK's #[monarch_guest::test], or write a Python script's `test_*` functions)"
        ),
        "{run:?}"
    );

    let missing = dir.join("missing.wasm");
    let run = test_command(&[missing.to_str().expect("a UTF-8 path")]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("missing.wasm"), "{run:?}");

    let run = test_command(&[env!("GUEST_HELLO"), "--jobs", "0"]);
    assert_eq!(run.code, Some(2), "a bad flag: {run:?}");

    let nowhere = dir.join("no-such-dir").join("report.xml");
    let run = test_command(&[
        env!("GUEST_HELLO"),
        "--junit",
        nowhere.to_str().expect("a UTF-8 path"),
    ]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--junit"), "{run:?}");
    assert!(run.stdout.is_empty(), "said before any test ran: {run:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lines a simulated run printed, less the one that says how long it
/// took in real time: what must be identical from one run to the next.
fn simulated_output(run: &Command) -> Vec<String> {
    run.stdout
        .iter()
        .map(|(_, line)| line.clone())
        .filter(|line| !line.starts_with("test result: "))
        .collect()
}

/// TS-1, TS-2 (sim): the racy program's racy test fails under a seed
/// within 1,000; the report names that seed with the command that replays
/// it; replayed twice, it fails the same way with byte-identical traces;
/// its fixed twin passes under all 1,000 seeds.
#[test]
fn sim_finds_the_racy_seed_and_its_replay_is_identical() {
    let racy = env!("GUEST_RACY");
    let told = "the_first_writer_told_claims_the_name";
    let run = test_command(&[racy, "--sim", "--seeds", "1..1000", "--filter", told]);
    assert_eq!(run.code, Some(1), "{run:?}");
    let seed: u64 = run
        .after(&format!("test {told} ... FAILED (seed "))
        .trim_end_matches(')')
        .parse()
        .unwrap_or_else(|_| panic!("no failing seed named:\n{run:?}"));
    assert!((1..=1000).contains(&seed));
    let report = test_report(&run, told);
    assert!(
        report.contains("writer 0 was told first, so it should have claimed first"),
        "{report}"
    );
    let replay = format!("--sim --seed {seed} --filter {told} --trace");
    assert!(report.contains(&replay), "{report}");

    let seed = seed.to_string();
    let again = || test_command(&[racy, "--sim", "--seed", &seed, "--filter", told, "--trace"]);
    let (first, second) = (again(), again());
    assert_eq!(first.code, Some(1), "{first:?}");
    let output = simulated_output(&first);
    let deliveries = output.iter().filter(|l| l.contains(" ms  ")).count();
    assert!(
        deliveries >= 10,
        "the trace shows the deliveries:\n{first:?}"
    );
    // Both writers' claims travel to the registry's proc.
    for writer in ["proc1/writers[0] -> proc0/", "proc2/writers[1] -> proc0/"] {
        assert!(
            output.iter().any(|l| l.contains(writer)),
            "{writer} is in the trace:\n{first:?}"
        );
    }
    assert_eq!(
        output,
        simulated_output(&second),
        "TS-1: one seed, one trace"
    );

    let fixed = test_command(&[
        racy,
        "--sim",
        "--seeds",
        "1..1000",
        "--filter",
        "the_first_writer_done_claims_the_name",
    ]);
    assert_eq!(fixed.code, Some(0), "{fixed:?}");
    assert_eq!(
        fixed
            .lines_with("the_first_writer_done_claims_the_name ... ok (1000 seeds)")
            .len(),
        1,
        "{fixed:?}"
    );
}

/// Faults under simulation: the fault tests pass under every seed tried,
/// the counter example's (one kills a rank) too, and one seed's whole
/// output, traces included, is the same run after run.
#[test]
fn sim_runs_faults_the_same_way_every_time() {
    for program in [env!("GUEST_FAULTS"), env!("GUEST_COUNTER")] {
        let run = test_command(&[program, "--sim", "--seeds", "1..20"]);
        assert_eq!(run.code, Some(0), "{run:?}");
        assert!(run.lines_with("... ok (20 seeds)").len() >= 4, "{run:?}");
    }
    let traced = || test_command(&[env!("GUEST_FAULTS"), "--sim", "--seed", "7", "--trace"]);
    let (first, second) = (traced(), traced());
    assert_eq!(first.code, Some(0), "{first:?}");
    assert!(
        first.lines_with("hyperactor_mesh::agent::Impair").len() >= 3,
        "the faults' requests are in the trace:\n{first:?}"
    );
    assert_eq!(simulated_output(&first), simulated_output(&second));
}

/// Flags that need `--sim`, and seeds that are not seeds, exit 2.
#[test]
fn sim_flags_are_checked() {
    let racy = env!("GUEST_RACY");
    for args in [
        vec![racy, "--seed", "3"],
        vec![racy, "--trace"],
        vec![racy, "--sim", "--seeds", "9..2"],
        vec![racy, "--sim", "--seeds", "x..2"],
        vec![racy, "--sim", "--seed", "1", "--seeds", "1..2"],
    ] {
        let run = test_command(&args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
    }
}
