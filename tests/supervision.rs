//! A supervision tree below the controller, three levels deep, across
//! processes: `tests/programs/tree` run by the `monarch-host` command. The
//! controller spawns `level1` on a child proc; each level's actor spawns
//! the next level's procs (child processes of its own process) and mesh.
//! A failure goes to the owning actor's `supervise` first (AO-2); one it
//! does not handle fails that actor with kind `supervision`, and so on up
//! to the controller (AO-3); stopping an actor stops what it spawned
//! (AO-1).

#[path = "support/cli.rs"]
mod cli;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cli::monarch_host;

const PROGRAM: &str = env!("GUEST_TREE");

/// AO-2: a leaf's trap goes to its owner (level 2), whose `supervise`
/// handles it: the controller hears nothing, and levels 1 and 2 answer.
#[test]
fn a_failure_handled_by_its_owner_goes_no_further() {
    let out = monarch_host(&[PROGRAM, "--", "handled"], Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        !out.lines_with("[level2[0]] level2 handled a failure of level3[0]: trap")
            .is_empty(),
        "{out:?}"
    );
    assert_eq!(out.after("[controller] failures="), "0", "{out:?}");
    assert_eq!(
        out.after("[controller] ping "),
        "level1 ok,level2 ok,level3 failed:trap",
        "{out:?}"
    );
    assert_eq!(out.after("[controller] handled "), "0,1", "{out:?}");
}

/// AO-3: nobody handles the leaf's trap: level 2 fails with kind
/// `supervision`, then level 1, and the controller gets level 1's failure,
/// whose reason tells the whole chain.
#[test]
fn an_unhandled_failure_climbs_the_tree_to_the_controller() {
    let out = monarch_host(&[PROGRAM, "--", "unhandled"], Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "{out:?}");
    let failure = out.after("[controller] failure ");
    assert!(
        failure.starts_with("mesh=level1 rank=0 kind=supervision reason="),
        "{out:?}"
    );
    for link in ["level2[0]", "level3[0]", "trap"] {
        assert!(failure.contains(link), "{link}: {out:?}");
    }
    assert_eq!(
        out.after("[controller] after kind="),
        "supervision",
        "{out:?}"
    );
}

/// The tree is as deep as the program makes it.
#[test]
fn a_tree_grows_five_levels() {
    let out = monarch_host(&[PROGRAM, "--", "depth", "5"], Duration::from_secs(120));
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(
        !out.lines_with("[controller] depth 5 ok").is_empty(),
        "{out:?}"
    );
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn pids(text: &str) -> Vec<i32> {
    text.split(',')
        .map(|p| p.trim().parse().expect("a pid"))
        .collect()
}

/// AO-1: stopping level 1's actors stops what they spawned, recursively:
/// the procs of levels 2 and 3 exit within 2 s, while the controller and
/// its own proc keep running; and stopping is not a failure.
#[test]
fn stopping_an_actor_stops_what_it_spawned_all_the_way_down() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_monarch-host-cli"))
        .args(["run", PROGRAM, "--", "stop"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start monarch-host");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines = stdout.lines().map_while(Result::ok);
    let mut seen = Vec::new();
    let mut next_with = |prefix: &str| -> String {
        for line in lines.by_ref() {
            seen.push(line.clone());
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_string();
            }
        }
        panic!("no line starting {prefix:?}; saw {seen:#?}");
    };
    let own = pids(&next_with("[controller] level1-pids "));
    let descendants = pids(&next_with("[controller] pids "));
    assert_eq!(descendants.len(), 2);
    assert!(descendants.iter().all(|&p| alive(p)), "{descendants:?}");
    next_with("[controller] stopped");
    let stopped = Instant::now();
    while descendants.iter().any(|&p| alive(p)) {
        assert!(
            stopped.elapsed() < Duration::from_secs(2),
            "procs {descendants:?} outlived their owner by {:?}",
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        own.iter().all(|&p| alive(p)),
        "the controller's proc stays up"
    );
    assert_eq!(next_with("[controller] failures="), "0");
    next_with("[controller] done");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
}
