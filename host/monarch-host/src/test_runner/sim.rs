//! `monarch-host test --sim`: each test runs in a deterministic
//! simulation (hyperactor's `sim.rs`): its procs inside this process, on a
//! current-thread runtime whose clock is paused and advanced by tokio when
//! every task waits (a virtual clock), and every message between procs
//! delivered after a latency drawn from the seed.
//!
//! - TS-1 (sim): one test and one seed give one trace, byte for byte,
//!   run after run; `--trace` prints it.
//! - TS-2 (sim): `--seeds A..B` runs each test under each seed in turn
//!   and stops that test at its first failing seed, which the report
//!   names with the command that replays it.
//! - TS-3 (sim): verdicts, exit status and JUnit are as without `--sim`
//!   (TT-3, TT-4).

use std::ops::RangeInclusive;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyperactor::sim::Simulation;

use super::{
    BAD_INPUT, Settings, TestArgs, TestOutcome, final_report, junit_xml, list, run_one, suite_name,
    write_atomic,
};
use crate::Prepared;
use crate::engine::Placement;

/// The most seeds one run may try.
const MAX_SEEDS: u64 = 1_000_000;

/// Parses `A..B` (both included) or a single seed `N`.
pub(super) fn parse_seeds(text: &str) -> Result<RangeInclusive<u64>, String> {
    let number = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{s}` is not a seed (a whole number)"))
    };
    let range = match text.split_once("..") {
        Some((a, b)) => {
            let b = b.strip_prefix('=').unwrap_or(b);
            number(a)?..=number(b)?
        }
        None => {
            let n = number(text)?;
            n..=n
        }
    };
    if range.is_empty() {
        return Err(format!("{text}: the first seed is past the last"));
    }
    if range.end() - range.start() >= MAX_SEEDS {
        return Err(format!("{text}: at most {MAX_SEEDS} seeds at once"));
    }
    Ok(range)
}

/// Runs `run` in a fresh simulation seeded with `seed`, on a runtime of
/// its own with a virtual clock; its output and the trace.
fn simulate<T>(
    seed: u64,
    run: impl std::future::Future<Output = T>,
) -> Result<(T, Vec<String>), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot start the simulation's runtime: {e}"))?;
    let out = runtime.block_on(async {
        let guard = Simulation::install(seed)?;
        let out = run.await;
        let trace = guard.simulation().trace();
        Ok::<_, String>((out, trace))
    });
    runtime.shutdown_timeout(Duration::from_millis(100));
    out
}

/// The command that replays `test` under `seed`.
fn replay(args: &TestArgs, test: &str, seed: u64) -> String {
    format!(
        "monarch-host test {} --sim --seed {seed} --filter {test} --trace",
        args.app.display()
    )
}

/// Runs `monarch-host test --sim`; see the module docs.
pub(super) fn command(args: &TestArgs, prepared: Arc<Prepared>) -> ExitCode {
    let bad_input = |e: String| {
        eprintln!("monarch-host test: error: {e}");
        ExitCode::from(BAD_INPUT)
    };
    let seeds = match (&args.seed, &args.seeds) {
        (Some(seed), _) => *seed..=*seed,
        (None, Some(range)) => range.clone(),
        (None, None) => 1..=1,
    };
    let settings = Settings {
        placement: Placement::InProcess,
        timeout: Duration::from_secs(args.timeout),
        call_timeout: Duration::from_secs(args.call_timeout),
        memory_bytes: args.memory as usize * (1 << 20),
        procs: args.procs as usize,
    };
    let started = Instant::now();
    let names = match simulate(*seeds.start(), list(&prepared, &settings)) {
        Ok((Ok(names), _)) => names,
        Ok((Err(e), _)) | Err(e) => return bad_input(e),
    };
    let total = names.len();
    let names: Vec<String> = match &args.filter {
        Some(filter) => names.into_iter().filter(|n| n.contains(filter)).collect(),
        None => names,
    };
    let filtered_out = total - names.len();
    let count = seeds.end() - seeds.start() + 1;
    println!();
    println!(
        "running {} test{} under simulation, seed{} {}",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        if count == 1 { "" } else { "s" },
        if count == 1 {
            seeds.start().to_string()
        } else {
            format!("{}..{}", seeds.start(), seeds.end())
        }
    );
    let mut outcomes = Vec::with_capacity(names.len());
    for name in names {
        let mut last = None;
        let mut tried = 0u64;
        for seed in seeds.clone() {
            tried += 1;
            let ran = simulate(
                seed,
                run_one(
                    &prepared,
                    name.clone(),
                    settings.sandbox(),
                    settings.timeout,
                ),
            );
            let (mut outcome, trace) = match ran {
                Ok(ran) => ran,
                Err(e) => return bad_input(e),
            };
            if args.trace {
                println!("trace of {name}, seed {seed} ({} deliveries):", trace.len());
                for line in &trace {
                    println!("  {line}");
                }
            }
            if let Some(failure) = &mut outcome.failure {
                *failure = format!(
                    "{failure}\n\nfailed under seed {seed}; replay it with:\n    {}",
                    replay(args, &name, seed)
                );
                last = Some((seed, outcome));
                break;
            }
            last = Some((seed, outcome));
        }
        let Some((seed, outcome)) = last else {
            continue;
        };
        match outcome.failure {
            Some(_) => println!("test {name} ... FAILED (seed {seed})"),
            None if tried == 1 => println!("test {name} ... ok"),
            None => println!("test {name} ... ok ({tried} seeds)"),
        }
        outcomes.push(outcome);
    }
    let elapsed = started.elapsed();
    print!("{}", final_report(&outcomes, filtered_out, elapsed));
    if let Some(file) = &args.junit {
        let xml = junit_xml(&suite_name(&args.app), &outcomes, elapsed);
        if let Err(e) = write_atomic(file, xml.as_bytes()) {
            return bad_input(format!(
                "cannot write the JUnit report {}: {e}",
                file.display()
            ));
        }
    }
    match outcomes.iter().any(|o: &TestOutcome| o.failure.is_some()) {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_a_range_with_both_ends_or_one_seed() {
        assert_eq!(parse_seeds("1..1000"), Ok(1..=1000));
        assert_eq!(parse_seeds("3..=5"), Ok(3..=5));
        assert_eq!(parse_seeds("42"), Ok(42..=42));
        assert!(parse_seeds("5..1").unwrap_err().contains("past the last"));
        assert!(
            parse_seeds("a..3")
                .unwrap_err()
                .contains("`a` is not a seed")
        );
        assert!(parse_seeds("0..9999999").unwrap_err().contains("at most"));
    }
}
