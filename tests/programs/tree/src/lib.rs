//! tree: a supervision tree, one mode per case (`monarch-host run
//! tree.wasm -- MODE [ARGS]`). The host's tests read the `info!` lines the
//! controller prints and its exit status.
//!
//! Every `Node` actor at `level` below `max_level` spawns procs of its own
//! from inside its `grow` handler (child processes of its own proc) and a
//! mesh `level{level+1}` of one `Node` on them, which grows in turn: the
//! controller owns `level1`, `level1` owns `level2`, and so on. A failure in
//! a mesh a node owns goes to that node's `supervise`: policy `Handle`
//! counts it and carries on; `Escalate` declines it, so the node fails with
//! kind `supervision` and its own owner hears of it, up to the controller.
//!
//! Every mode prints all its lines, then fails the run (non-zero exit) if
//! anything differed from what it expects, naming what. Kinds print as the
//! WIT names them (`proc-lost`).
//!
//! | mode | prints | what it checks |
//! | --- | --- | --- |
//! | `handled` | `grown`, `failures=0`, `ping level1 ok,level2 ok,level3 failed:trap`, `handled 0,1` | a leaf that traps is handled by its owner (`level2`); the controller hears nothing |
//! | `unhandled` | `grown`, `failure mesh=level1 rank=0 kind=supervision reason=...`, `after kind=supervision` | declined failures climb the tree: the controller sees `level1` fail with `supervision` |
//! | `stop` | `pids P1,P2`, `stopped`, `failures=0` | the procs the nodes spawned (their pids), and stopping `level1` is no failure |
//! | `depth N` | `depth N ok` | a tree N levels deep grows and answers `ping_down` from every level |

use std::time::Duration;

use monarch_guest::prelude::*;
use monarch_guest::{SupervisionFailure, next_failure, take_failures, timeout};
use serde::{Deserialize, Serialize};

#[path = "../../expect.rs"]
mod expect;
use expect::{Expect, kind_of, record_failures};

/// What a node does with a failure in the mesh it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Policy {
    /// Count it and carry on (`supervise` returns true).
    Handle,
    /// Decline it (`supervise` returns false): the node fails in turn.
    Escalate,
}

/// A node's init value.
#[derive(Serialize, Deserialize)]
struct NodeInit {
    level: u32,
    max_level: u32,
    policy: Policy,
}

/// `grow`: below `max_level`, spawns procs and the next level's mesh on
/// them, and grows it.
#[derive(Serialize, Deserialize)]
struct Grow;

impl Message for Grow {
    const ENDPOINT: &'static str = "grow";
    type Reply = ();
}

/// `pids`: the OS pids of the procs this node and the nodes below it
/// spawned, top-down.
#[derive(Serialize, Deserialize)]
struct Pids;

impl Message for Pids {
    const ENDPOINT: &'static str = "pids";
    type Reply = Vec<u32>;
}

/// `ping`: `level{level} ok`.
#[derive(Serialize, Deserialize)]
struct Ping;

impl Message for Ping {
    const ENDPOINT: &'static str = "ping";
    type Reply = String;
}

/// `ping_down`: this node's `ping` and those of every level below it,
/// top-down; a child that cannot answer shows as `level{n} failed:<kind>`.
#[derive(Serialize, Deserialize)]
struct PingDown;

impl Message for PingDown {
    const ENDPOINT: &'static str = "ping_down";
    type Reply = Vec<String>;
}

/// `handled`: how many failures this node and the nodes below it handled,
/// top-down; a child that cannot answer adds nothing.
#[derive(Serialize, Deserialize)]
struct Handled;

impl Message for Handled {
    const ENDPOINT: &'static str = "handled";
    type Reply = Vec<u32>;
}

/// `trap_leaf`: makes the last level trap. The node just above it
/// broadcasts `trap` and returns at once; the nodes above that pass the
/// call down. A node without children panics itself.
#[derive(Serialize, Deserialize)]
struct TrapLeaf;

impl Message for TrapLeaf {
    const ENDPOINT: &'static str = "trap_leaf";
    type Reply = ();
}

/// `trap`: panics with "leaf trapped".
#[derive(Serialize, Deserialize)]
struct Trap;

impl Message for Trap {
    const ENDPOINT: &'static str = "trap";
    type Reply = ();
}

struct Node {
    level: u32,
    max_level: u32,
    policy: Policy,
    /// The procs this node spawned for its children; kept so that they
    /// live as long as the node.
    procs: Option<ProcMesh>,
    children: Option<ActorMesh<Node>>,
    handled: u32,
}

impl Actor for Node {
    const CLASS: &'static str = "Node";
    type Init = NodeInit;

    fn create(init: NodeInit, _cx: &Context) -> Result<Self, String> {
        Ok(Node {
            level: init.level,
            max_level: init.max_level,
            policy: init.policy,
            procs: None,
            children: None,
            handled: 0,
        })
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints
            .handle::<Grow>()
            .handle::<Pids>()
            .handle::<Ping>()
            .handle::<PingDown>()
            .handle::<Handled>()
            .handle::<TrapLeaf>()
            .handle::<Trap>();
    }

    fn supervise(&mut self, _cx: &Context, failure: &SupervisionFailure) -> bool {
        match self.policy {
            Policy::Handle => {
                self.handled += 1;
                info!(
                    "level{} handled a failure of {}[{}]: {}",
                    self.level, failure.mesh, failure.rank, failure.kind
                );
                true
            }
            Policy::Escalate => {
                info!(
                    "level{} escalates a failure of {}[{}]: {}",
                    self.level, failure.mesh, failure.rank, failure.kind
                );
                false
            }
        }
    }
}

impl Node {
    /// The next level's name.
    fn child_name(&self) -> String {
        format!("level{}", self.level + 1)
    }
}

impl Handler<Grow> for Node {
    async fn handle(&mut self, _cx: &Context, _: Grow) -> Result<(), EndpointError> {
        if self.level >= self.max_level {
            return Ok(());
        }
        let procs = spawn_procs(&extent!(hosts = 1))?;
        let init = NodeInit {
            level: self.level + 1,
            max_level: self.max_level,
            policy: self.policy,
        };
        let children = procs.spawn::<Node>(&self.child_name(), &init)?;
        // Kept before growing them, so that they are this node's even if
        // growing fails.
        self.procs = Some(procs);
        self.children = Some(children.clone());
        children.call_one(&Grow).await?;
        Ok(())
    }
}

impl Handler<Pids> for Node {
    async fn handle(&mut self, _cx: &Context, _: Pids) -> Result<Vec<u32>, EndpointError> {
        let mut pids: Vec<u32> = self
            .procs
            .iter()
            .flat_map(ProcMesh::info)
            .filter_map(|proc| proc.pid)
            .collect();
        if let Some(children) = &self.children {
            pids.extend(children.call_one(&Pids).await?);
        }
        Ok(pids)
    }
}

impl Handler<Ping> for Node {
    async fn handle(&mut self, _cx: &Context, _: Ping) -> Result<String, EndpointError> {
        Ok(format!("level{} ok", self.level))
    }
}

impl Handler<PingDown> for Node {
    async fn handle(&mut self, _cx: &Context, _: PingDown) -> Result<Vec<String>, EndpointError> {
        let mut pongs = vec![format!("level{} ok", self.level)];
        if let Some(children) = &self.children {
            match children.call_one(&PingDown).await {
                Ok(below) => pongs.extend(below),
                Err(e) => pongs.push(format!("{} failed:{}", self.child_name(), e.kind())),
            }
        }
        Ok(pongs)
    }
}

impl Handler<Handled> for Node {
    async fn handle(&mut self, _cx: &Context, _: Handled) -> Result<Vec<u32>, EndpointError> {
        let mut counts = vec![self.handled];
        if let Some(children) = &self.children
            && let Ok(below) = children.call_one(&Handled).await
        {
            counts.extend(below);
        }
        Ok(counts)
    }
}

impl Handler<TrapLeaf> for Node {
    async fn handle(&mut self, _cx: &Context, _: TrapLeaf) -> Result<(), EndpointError> {
        let Some(children) = &self.children else {
            panic!("level{} has no children to trap", self.level);
        };
        if self.level + 1 == self.max_level {
            children.broadcast(&Trap)?;
            Ok(())
        } else {
            children.call_one(&TrapLeaf).await?;
            Ok(())
        }
    }
}

impl Handler<Trap> for Node {
    async fn handle(&mut self, _cx: &Context, _: Trap) -> Result<(), EndpointError> {
        panic!("leaf trapped");
    }
}

/// The failures the supervisor saw, for error messages.
fn describe(failures: &[SupervisionFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Spawns `level1` (on procs of its own, returned so that they live on)
/// and grows the tree under it to `max_level`.
async fn grow(max_level: u32, policy: Policy) -> Result<(ProcMesh, ActorMesh<Node>), String> {
    let procs = spawn_procs(&extent!(hosts = 1))?;
    let init = NodeInit {
        level: 1,
        max_level,
        policy,
    };
    let level1 = procs.spawn::<Node>("level1", &init)?;
    level1
        .call_one(&Grow)
        .await
        .map_err(|e| format!("growing the tree to level {max_level}: {e}"))?;
    Ok((procs, level1))
}

async fn handled() -> Result<(), String> {
    let mut expect = Expect::default();
    let recorded = record_failures();
    let (_procs, level1) = grow(3, Policy::Handle).await?;
    info!("grown");

    let result = level1.call_one(&TrapLeaf).await;
    expect.that(result.is_ok(), || {
        format!("trap_leaf: {}", kind_of(&result))
    });
    sleep(Duration::from_secs(1)).await;
    let failures = recorded.borrow().len();
    info!("failures={failures}");
    expect.that(failures == 0, || {
        format!(
            "expected the controller to see no failure, got {failures}: {}",
            describe(&recorded.borrow())
        )
    });

    let pongs = level1
        .call_one(&PingDown)
        .await
        .map_err(|e| format!("ping_down on level1: {e}"))?;
    let pongs = pongs.join(",");
    info!("ping {pongs}");
    expect.that(pongs == "level1 ok,level2 ok,level3 failed:trap", || {
        format!("ping_down: expected level1 ok,level2 ok,level3 failed:trap, got {pongs}")
    });

    let counts = level1
        .call_one(&Handled)
        .await
        .map_err(|e| format!("handled on level1: {e}"))?;
    let counts = counts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    info!("handled {counts}");
    expect.that(counts == "0,1", || {
        format!("handled: expected 0,1 (level2 handled level3's trap), got {counts}")
    });
    expect.done()
}

async fn unhandled() -> Result<(), String> {
    let mut expect = Expect::default();
    let recorded = record_failures();
    let (_procs, level1) = grow(3, Policy::Escalate).await?;
    info!("grown");

    let result = level1.call_one(&TrapLeaf).await;
    expect.that(result.is_ok(), || {
        format!(
            "trap_leaf: expected it to return before level3 traps, got {}",
            kind_of(&result)
        )
    });
    let failure = timeout(Duration::from_secs(10), next_failure())
        .await
        .map_err(|e| format!("no failure event within 10 s: {e}"))?;
    info!(
        "failure mesh={} rank={} kind={} reason={}",
        failure.mesh, failure.rank, failure.kind, failure.reason
    );
    expect.that(
        failure.mesh == "level1"
            && failure.rank == 0
            && failure.kind == ErrorKind::Supervision
            && failure.reason.contains("level2"),
        || format!("expected level1[0] to fail with supervision, for level2's failure: {failure}"),
    );

    let result = level1.call_one(&Ping).await;
    info!("after kind={}", kind_of(&result));
    expect.that(kind_of(&result) == "supervision", || match &result {
        Ok(reply) => format!("ping on the failed level1 answered {reply}"),
        Err(e) => format!("ping on the failed level1: expected supervision, got {e}"),
    });

    // Only level1's failure reaches the controller: level3's went to
    // level2, and level2's to level1.
    // (The failure may have come before `next_failure` waited for it, in
    // which case the supervisor saw it too.)
    let mut others = take_failures();
    others.extend(recorded.borrow().iter().filter(|f| **f != failure).cloned());
    expect.that(others.is_empty(), || {
        format!(
            "expected only level1's failure at the controller, also got {}",
            describe(&others)
        )
    });
    expect.done()
}

async fn stop() -> Result<(), String> {
    let mut expect = Expect::default();
    let recorded = record_failures();
    let (procs, level1) = grow(3, Policy::Handle).await?;
    // The controller's own proc, which stopping level1's actors leaves up.
    let own: Vec<String> = procs
        .info()
        .iter()
        .map(|p| p.pid.map_or_else(|| "-".to_string(), |pid| pid.to_string()))
        .collect();
    info!("level1-pids {}", own.join(","));

    let pids = level1
        .call_one(&Pids)
        .await
        .map_err(|e| format!("pids on level1: {e}"))?;
    info!(
        "pids {}",
        pids.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    expect.that(pids.len() == 2 && pids[0] != pids[1], || {
        format!("expected two distinct pids (level2's proc and level3's), got {pids:?}")
    });

    level1.stop();
    info!("stopped");
    sleep(Duration::from_millis(300)).await;
    let failures = recorded.borrow().len();
    info!("failures={failures}");
    expect.that(failures == 0, || {
        format!(
            "stopping level1 is not a failure, yet the controller saw {}",
            describe(&recorded.borrow())
        )
    });
    // Stay up a while, so that a test can see the descendants gone while
    // the controller and its own procs still run.
    sleep(Duration::from_millis(3000)).await;
    info!("done");
    expect.done()
}

async fn depth(args: &[String]) -> Result<(), String> {
    let levels: u32 = match args.get(1) {
        None => 3,
        Some(text) => text
            .parse()
            .map_err(|e| format!("depth: the number of levels ({text:?}): {e}"))?,
    };
    if levels == 0 {
        return Err("depth: a tree has at least one level".into());
    }
    let recorded = record_failures();
    let (_procs, level1) = grow(levels, Policy::Handle).await?;
    let pongs = level1
        .call_one(&PingDown)
        .await
        .map_err(|e| format!("ping_down on level1: {e}"))?;
    let expected: Vec<String> = (1..=levels).map(|l| format!("level{l} ok")).collect();
    if pongs != expected || !recorded.borrow().is_empty() {
        return Err(format!(
            "depth {levels}: expected ping_down to answer {}, got {}; failures: {}",
            expected.join(","),
            pongs.join(","),
            describe(&recorded.borrow())
        ));
    }
    info!("depth {levels} ok");
    Ok(())
}

const USAGE: &str = "usage: tree MODE [ARGS]; modes: handled, unhandled, stop, depth [N]";

async fn main(args: Vec<String>) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("handled") => handled().await,
        Some("unhandled") => unhandled().await,
        Some("stop") => stop().await,
        Some("depth") => depth(&args).await,
        Some(other) => Err(format!("unknown mode `{other}`; {USAGE}")),
        None => Err(USAGE.into()),
    }
}

monarch_guest::program! {
    main: main,
    actors: [Node],
}
