//! semantics: what each failure, deadline, stop and sleep looks like to the
//! caller and to the supervisor, one mode per case (`monarch-host run
//! semantics.wasm -- MODE [ARGS]`). The host's tests read the `info!`
//! lines each mode prints and its exit status.
//!
//! Every mode prints all its lines, then fails the run (non-zero exit) if
//! anything differed from what WIT 0.2 promises, naming what. Kinds print
//! as the WIT names them (`proc-lost`), `decode` for the SDK's own case,
//! and `ok` for a call that succeeded. Times are whole milliseconds.
//!
//! | mode | what it checks |
//! | --- | --- |
//! | `stopped` | calls to a stopped mesh, its slice, a reference to it, and a mesh on stopped procs fail at once with `stopped` |
//! | `broadcast-error` | an endpoint error returned to a broadcast fails that actor (one failure event), not its neighbour |
//! | `deadline` | a handler deadline from spawn options and one per call fail the actor with `deadline`; a bystander on the same proc lives on |
//! | `trap-once` | a trap fails every call waiting on the actor with `trap`, and yields one failure event |
//! | `typed-error` | an endpoint error keeps its type name |
//! | `time` | `sleep`, `timeout` and `select!` in the controller, `sleep` in an actor |
//! | `info-kill` | `ProcMesh::info` and `ProcMesh::kill`: the killed proc's actor fails with `proc-lost` |
//! | `sleep-forever [N]` | actors blocked in a WASI sleep and a controller asleep, for cancellation tests |
//! | `sleep-call N MS` | a call to N actors that sleep MS each; prints how it ended and when (for host-loss tests) |
//! | `echo [N]` | a plain call |
//! | `exit CODE` | `std::process::exit` |
//! | `print` | actors' stdout and stderr, and the controller's stdout |
//! | `files PATH VAR` | file and environment access, in the controller and in an actor |

use std::fmt::Display;
use std::time::{Duration, Instant};

use monarch_guest::futures::future::join_all;
use monarch_guest::prelude::*;
use monarch_guest::{
    MeshError, SpawnOptions, SupervisionFailure, next_failure, select, take_failures, timeout,
};
use serde::{Deserialize, Serialize};

#[path = "../../expect.rs"]
mod expect;
use expect::{Expect, kind_of, record_failures};

/// `echo`: replies with its input.
#[derive(Serialize, Deserialize)]
struct Echo(u64);

impl Message for Echo {
    const ENDPOINT: &'static str = "echo";
    type Reply = u64;
}

/// `fail`: returns an endpoint error of type `ValueError` with this message.
#[derive(Serialize, Deserialize)]
struct Fail(String);

impl Message for Fail {
    const ENDPOINT: &'static str = "fail";
    type Reply = ();
}

/// `trap`: panics with "boom".
#[derive(Serialize, Deserialize)]
struct Trap;

impl Message for Trap {
    const ENDPOINT: &'static str = "trap";
    type Reply = ();
}

/// `spin`: computes forever.
#[derive(Serialize, Deserialize)]
struct Spin;

impl Message for Spin {
    const ENDPOINT: &'static str = "spin";
    type Reply = ();
}

/// `sleep_wasi`: blocks in a WASI sleep for this many milliseconds.
#[derive(Serialize, Deserialize)]
struct SleepWasi(u64);

impl Message for SleepWasi {
    const ENDPOINT: &'static str = "sleep_wasi";
    type Reply = ();
}

/// `sleep_sdk`: awaits `monarch_guest::sleep` for this many milliseconds;
/// replies with the milliseconds that passed.
#[derive(Serialize, Deserialize)]
struct SleepSdk(u64);

impl Message for SleepSdk {
    const ENDPOINT: &'static str = "sleep_sdk";
    type Reply = u64;
}

/// `call_ref`: calls `echo(1)` on the mesh a reference names; replies `ok`
/// or the error's kind, then the milliseconds the call took.
#[derive(Serialize, Deserialize)]
struct CallRef(MeshRef<Worker>);

impl Message for CallRef {
    const ENDPOINT: &'static str = "call_ref";
    type Reply = String;
}

/// `print`: writes the text to stdout, and with `err: ` to stderr.
#[derive(Serialize, Deserialize)]
struct Print(String);

impl Message for Print {
    const ENDPOINT: &'static str = "print";
    type Reply = ();
}

/// `read_file`: the file's contents, or an endpoint error saying why not.
#[derive(Serialize, Deserialize)]
struct ReadFile(String);

impl Message for ReadFile {
    const ENDPOINT: &'static str = "read_file";
    type Reply = String;
}

/// `getenv`: an environment variable, if set.
#[derive(Serialize, Deserialize)]
struct GetEnv(String);

impl Message for GetEnv {
    const ENDPOINT: &'static str = "getenv";
    type Reply = Option<String>;
}

struct Worker;

impl Actor for Worker {
    const CLASS: &'static str = "Worker";
    type Init = u32;

    fn create(_unused: u32, _cx: &Context) -> Result<Self, String> {
        Ok(Worker)
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints
            .handle::<Echo>()
            .handle::<Fail>()
            .handle::<Trap>()
            .handle::<Spin>()
            .handle::<SleepWasi>()
            .handle::<SleepSdk>()
            .handle::<CallRef>()
            .handle::<Print>()
            .handle::<ReadFile>()
            .handle::<GetEnv>();
    }
}

impl Handler<Echo> for Worker {
    async fn handle(&mut self, _cx: &Context, Echo(value): Echo) -> Result<u64, EndpointError> {
        Ok(value)
    }
}

impl Handler<Fail> for Worker {
    async fn handle(&mut self, _cx: &Context, Fail(message): Fail) -> Result<(), EndpointError> {
        Err(EndpointError::new(message).with_type("ValueError"))
    }
}

impl Handler<Trap> for Worker {
    async fn handle(&mut self, _cx: &Context, _: Trap) -> Result<(), EndpointError> {
        panic!("boom");
    }
}

impl Handler<Spin> for Worker {
    async fn handle(&mut self, _cx: &Context, _: Spin) -> Result<(), EndpointError> {
        // A counter the optimizer must keep, and no call out of the
        // instance: only the host's epoch deadline takes the thread back.
        let mut turns = 0u64;
        loop {
            turns = std::hint::black_box(turns.wrapping_add(1));
        }
    }
}

impl Handler<SleepWasi> for Worker {
    async fn handle(
        &mut self,
        _cx: &Context,
        SleepWasi(ms): SleepWasi,
    ) -> Result<(), EndpointError> {
        std::thread::sleep(Duration::from_millis(ms));
        Ok(())
    }
}

impl Handler<SleepSdk> for Worker {
    async fn handle(
        &mut self,
        _cx: &Context,
        SleepSdk(ms): SleepSdk,
    ) -> Result<u64, EndpointError> {
        let started = Instant::now();
        sleep(Duration::from_millis(ms)).await;
        Ok(millis(started))
    }
}

impl Handler<CallRef> for Worker {
    async fn handle(
        &mut self,
        _cx: &Context,
        CallRef(r): CallRef,
    ) -> Result<String, EndpointError> {
        let mesh = r.resolve()?;
        let started = Instant::now();
        let result = mesh.call(&Echo(1)).await;
        Ok(format!("{} {}", kind_of(&result), millis(started)))
    }
}

impl Handler<Print> for Worker {
    async fn handle(&mut self, _cx: &Context, Print(text): Print) -> Result<(), EndpointError> {
        println!("{text}");
        eprintln!("err: {text}");
        Ok(())
    }
}

impl Handler<ReadFile> for Worker {
    async fn handle(
        &mut self,
        _cx: &Context,
        ReadFile(path): ReadFile,
    ) -> Result<String, EndpointError> {
        std::fs::read_to_string(&path).map_err(|e| EndpointError::new(e.to_string()))
    }
}

impl Handler<GetEnv> for Worker {
    async fn handle(
        &mut self,
        _cx: &Context,
        GetEnv(name): GetEnv,
    ) -> Result<Option<String>, EndpointError> {
        Ok(std::env::var(name).ok())
    }
}

/// Milliseconds since `started`, whole.
fn millis(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The next failure event, within 10 s.
async fn next_failure_within_10s() -> Result<SupervisionFailure, String> {
    timeout(Duration::from_secs(10), next_failure())
        .await
        .map_err(|e| format!("no failure event: {e}"))
}

/// `args[index]` as a number, else `default`.
fn arg<T: std::str::FromStr>(args: &[String], index: usize, default: T) -> Result<T, String>
where
    T::Err: Display,
{
    match args.get(index) {
        None => Ok(default),
        Some(text) => text
            .parse()
            .map_err(|e| format!("argument {index} ({text:?}): {e}")),
    }
}

fn hosts(n: u32) -> Extent {
    extent!(hosts = n)
}

async fn stopped() -> Result<(), String> {
    let mut expect = Expect::default();
    let procs = spawn_procs(&hosts(2))?;
    let workers = procs.spawn::<Worker>("workers", &0)?;
    let replies = workers.call(&Echo(7)).await?;
    if replies.values() != [7, 7] {
        return Err(format!("echo(7) on workers: {:?}", replies.values()));
    }
    let reference = workers.to_ref();
    let other = procs.spawn::<Worker>("other", &0)?;
    let slice = workers.at("hosts", 1)?;
    workers.stop();

    let started = Instant::now();
    let result = workers.call(&Echo(1)).await;
    info!(
        "stopped-call kind={} ms={}",
        kind_of(&result),
        millis(started)
    );
    expect.kind("a call to a stopped mesh", &result, "stopped");

    let started = Instant::now();
    let result = slice.call_one(&Echo(1)).await;
    info!(
        "stopped-slice kind={} ms={}",
        kind_of(&result),
        millis(started)
    );
    expect.kind("a call to a slice of a stopped mesh", &result, "stopped");

    match other.at("hosts", 0)?.call_one(&CallRef(reference)).await {
        Ok(reply) => {
            info!("stopped-ref {reply}");
            expect.that(reply.starts_with("stopped "), || {
                format!("a call through a reference to a stopped mesh: {reply}")
            });
        }
        Err(e) => {
            info!("stopped-ref error {}", e.kind());
            expect.that(false, || format!("call_ref failed: {e}"));
        }
    }

    let procs2 = spawn_procs(&hosts(1))?;
    let third = procs2.spawn::<Worker>("third", &0)?;
    procs2.stop();
    let started = Instant::now();
    let result = third.call(&Echo(1)).await;
    info!(
        "stopped-procs kind={} ms={}",
        kind_of(&result),
        millis(started)
    );
    expect.kind("a call to a mesh on stopped procs", &result, "stopped");
    expect.done()
}

async fn broadcast_error() -> Result<(), String> {
    let mut expect = Expect::default();
    let procs = spawn_procs(&hosts(2))?;
    let workers = procs.spawn::<Worker>("workers", &0)?;
    let recorded = record_failures();
    workers
        .at("hosts", 1)?
        .broadcast(&Fail("bad".into()))
        .map_err(|e| format!("broadcast: {e}"))?;
    let failure = next_failure_within_10s().await?;
    info!(
        "failure mesh={} rank={} kind={} endpoint={} reason={}",
        failure.mesh,
        failure.rank,
        failure.kind,
        failure.endpoint.as_deref().unwrap_or("-"),
        failure.reason
    );
    expect.that(
        failure.mesh == "workers" && failure.rank == 1 && failure.kind == ErrorKind::Endpoint,
        || format!("expected workers[1] to fail with kind endpoint: {failure}"),
    );

    let result = workers.at("hosts", 1)?.call_one(&Echo(1)).await;
    match &result {
        Ok(_) => info!("after-failure ok"),
        Err(e) => info!("after-failure kind={}", e.kind()),
    }
    expect.kind("a call to the failed actor", &result, "endpoint");

    let result = workers.at("hosts", 0)?.call_one(&Echo(2)).await;
    match &result {
        Ok(_) => info!("other-rank ok"),
        Err(e) => info!("other-rank kind={}", e.kind()),
    }
    expect.kind("a call to the other rank", &result, "ok");

    // `choose` skips the rank whose failure the controller heard of, even
    // when the live one is busier: four in flight at once all go to rank 0.
    let chosen: Vec<_> = (0..4).map(|_| workers.choose(&Echo(3))).collect();
    for result in futures::future::join_all(chosen).await {
        match &result {
            Ok(_) => info!("choose ok"),
            Err(e) => info!("choose kind={}", e.kind()),
        }
        expect.kind("a choose after the failure", &result, "ok");
    }

    // A stream answers for the failed rank at once, and asks the live one.
    let items: Vec<_> = futures::StreamExt::collect::<Vec<_>>(workers.stream(&Echo(4))).await;
    for (rank, result) in &items {
        match result {
            Ok(_) => info!("stream rank={rank} ok"),
            Err(e) => info!("stream rank={rank} {}", e.kind()),
        }
    }
    expect.that(items.len() == 2, || {
        format!("a stream of 2 ranks gave {items:?}")
    });

    sleep(Duration::from_millis(500)).await;
    // The awaited failure, and any the supervisor saw (each failure event
    // also lands in the queue that take_failures drains).
    let others = take_failures();
    let total = 1 + others.len();
    info!("failures={total}");
    expect.that(total == 1, || {
        format!(
            "expected one failure event, got {total}: {others:?} (supervisor saw {:?})",
            recorded.borrow()
        )
    });
    expect.done()
}

async fn deadline() -> Result<(), String> {
    let mut expect = Expect::default();
    let recorded = record_failures();
    let procs = spawn_procs(&hosts(1))?;
    let options = SpawnOptions::new().handler_timeout(Duration::from_millis(1000));
    let spinners = procs.spawn_with::<Worker>("spinners", &0, options)?;
    let bystanders = procs.spawn::<Worker>("bystanders", &0)?;

    let started = Instant::now();
    let result = spinners.call_one(&Spin).await;
    let message = result.as_ref().err().map(CallError::message).unwrap_or("-");
    info!(
        "spin kind={} ms={} message={message}",
        kind_of(&result),
        millis(started)
    );
    expect.kind("a handler past its spawn deadline", &result, "deadline");

    let result = bystanders.call_one(&Echo(5)).await;
    match &result {
        Ok(value) => info!("bystander {value}"),
        Err(e) => info!("bystander error {}", e.kind()),
    }
    expect.kind("a bystander on the same proc", &result, "ok");

    sleep(Duration::from_millis(500)).await;
    let spinner_failures = recorded
        .borrow()
        .iter()
        .filter(|f| f.mesh == "spinners")
        .count();
    info!("failures={spinner_failures}");
    expect.that(spinner_failures == 1, || {
        format!(
            "expected one failure event for spinners, got {:?}",
            recorded.borrow()
        )
    });

    let sleepers = procs.spawn::<Worker>("sleepers", &0)?;
    let started = Instant::now();
    let result = sleepers
        .with_handler_timeout(Duration::from_millis(300))
        .call_one(&SleepSdk(2000))
        .await;
    info!("override kind={} ms={}", kind_of(&result), millis(started));
    expect.kind("a handler past its per-call deadline", &result, "deadline");

    let result = bystanders.call_one(&Echo(5)).await;
    match &result {
        Ok(value) => info!("bystander-after {value}"),
        Err(e) => info!("bystander-after error {}", e.kind()),
    }
    expect.kind("the bystander afterwards", &result, "ok");
    expect.done()
}

async fn trap_once() -> Result<(), String> {
    let mut expect = Expect::default();
    let recorded = record_failures();
    let procs = spawn_procs(&hosts(1))?;
    let workers = procs.spawn::<Worker>("workers", &0)?;
    // Three calls in flight before any is awaited.
    let trap = workers.call_one(&Trap);
    let one = workers.call_one(&Echo(1));
    let two = workers.call_one(&Echo(2));
    let (trap, echoes) = (trap.await, join_all([one, two]).await);
    let errors: Vec<&CallError> = std::iter::once(trap.as_ref().err())
        .chain(echoes.iter().map(|r| r.as_ref().err()))
        .flatten()
        .collect();
    let kinds: Vec<&str> = errors.iter().map(|e| e.kind().name()).collect();
    info!(
        "errors={} kinds={}",
        errors.len(),
        if kinds.is_empty() {
            "-".to_string()
        } else {
            kinds.join(",")
        }
    );
    expect.that(kinds == ["trap", "trap", "trap"], || {
        format!("expected the three calls to fail with trap, got {kinds:?}")
    });
    let backtrace = trap.as_ref().err().and_then(CallError::backtrace).is_some();
    info!("backtrace={}", if backtrace { "yes" } else { "no" });

    sleep(Duration::from_millis(500)).await;
    let failures = recorded.borrow().len();
    info!("failures={failures}");
    expect.that(failures == 1, || {
        format!("expected one failure event, got {:?}", recorded.borrow())
    });
    expect.done()
}

async fn typed_error() -> Result<(), String> {
    let procs = spawn_procs(&hosts(1))?;
    let workers = procs.spawn::<Worker>("workers", &0)?;
    match workers.call_one(&Fail("bad value".into())).await {
        Ok(()) => Err("fail(\"bad value\") succeeded".into()),
        Err(e) => {
            info!(
                "type={} kind={} message={}",
                e.type_name().unwrap_or("-"),
                e.kind(),
                e.message()
            );
            let mut expect = Expect::default();
            expect.that(
                e.kind() == ErrorKind::Endpoint
                    && e.type_name() == Some("ValueError")
                    && e.message() == "bad value",
                || format!("expected ValueError: bad value, got {e}"),
            );
            expect.done()
        }
    }
}

async fn time() -> Result<(), String> {
    let mut expect = Expect::default();
    let started = Instant::now();
    sleep(Duration::from_millis(200)).await;
    let slept = millis(started);
    info!("sleep ms={slept}");
    expect.that(slept >= 200, || format!("sleep(200 ms) took {slept} ms"));

    let procs = spawn_procs(&hosts(1))?;
    let sleepers = procs.spawn::<Worker>("sleepers", &0)?;
    let started = Instant::now();
    let result = timeout(
        Duration::from_millis(100),
        sleepers.call_one(&SleepSdk(1000)),
    )
    .await;
    info!("timeout elapsed={} ms={}", result.is_err(), millis(started));
    expect.that(result.is_err(), || {
        format!("timeout(100 ms) around a 1 s call returned {result:?}")
    });

    // Another mesh, so that the still sleeping actor does not delay it.
    let quick = procs.spawn::<Worker>("quick", &0)?;
    let started = Instant::now();
    let winner = select! {
        result = quick.call_one(&SleepSdk(50)) => {
            expect.kind("sleep_sdk(50)", &result, "ok");
            "call"
        },
        () = sleep(Duration::from_millis(2000)) => "sleep",
    };
    info!("select winner={winner} ms={}", millis(started));
    expect.that(winner == "call", || format!("select: the {winner} won"));

    let slept = quick.call_one(&SleepSdk(150)).await?;
    info!("actor-sleep ms={slept}");
    expect.that(slept >= 150, || format!("sleep_sdk(150) took {slept} ms"));
    expect.done()
}

async fn info_kill() -> Result<(), String> {
    let mut expect = Expect::default();
    let procs = spawn_procs(&hosts(2))?;
    let workers = procs.spawn::<Worker>("workers", &0)?;
    for proc in procs.info() {
        info!(
            "proc rank={} host={} pid={} state={}",
            proc.rank,
            proc.host,
            proc.pid.map_or("-".to_string(), |pid| pid.to_string()),
            proc.state.name()
        );
    }
    let _recorded = record_failures();
    procs.kill(1, 9).map_err(|e: MeshError| e.to_string())?;
    let failure = next_failure_within_10s().await?;
    info!("failure rank={} kind={}", failure.rank, failure.kind);
    expect.that(
        failure.rank == 1 && failure.kind == ErrorKind::ProcLost,
        || format!("expected rank 1 to fail with proc-lost: {failure}"),
    );
    let state = procs
        .info()
        .into_iter()
        .find(|p| p.rank == 1)
        .map_or("-", |p| p.state.name());
    info!("after-kill state={state}");
    expect.that(state == "failed", || format!("the killed proc is {state}"));
    let result = workers.at("hosts", 0)?.call_one(&Echo(3)).await;
    match &result {
        Ok(_) => info!("survivor ok"),
        Err(e) => info!("survivor kind={}", e.kind()),
    }
    expect.kind("the surviving rank", &result, "ok");
    expect.done()
}

async fn sleep_forever(args: &[String]) -> Result<(), String> {
    let count = arg(args, 1, 1u32)?;
    let procs = spawn_procs(&hosts(count))?;
    let sleepers = procs.spawn::<Worker>("sleepers", &0)?;
    sleepers
        .broadcast(&SleepWasi(600_000))
        .map_err(|e| format!("broadcast: {e}"))?;
    info!("sleeping");
    sleep(Duration::from_secs(600)).await;
    Ok(())
}

async fn sleep_call(args: &[String]) -> Result<(), String> {
    let count = arg(args, 1, 1u32)?;
    let millis = arg(args, 2, 60_000u64)?;
    // The failure is the call's to report: the supervisor carries on.
    monarch_guest::supervise(|_| true);
    let procs = spawn_procs(&hosts(count))?;
    let sleepers = procs.spawn::<Worker>("sleepers", &0)?;
    let started = Instant::now();
    info!("calling {count} sleepers");
    let result = sleepers.call(&SleepWasi(millis)).await;
    let elapsed = started.elapsed().as_millis();
    match &result {
        Ok(_) => info!("the call returned after {elapsed} ms"),
        Err(e) => info!(
            "the call failed after {elapsed} ms: {} ({e})",
            kind_of(&result)
        ),
    }
    Ok(())
}

async fn echo(args: &[String]) -> Result<(), String> {
    let count = arg(args, 1, 1u32)?;
    let procs = spawn_procs(&hosts(count))?;
    let workers = procs.spawn::<Worker>("workers", &0)?;
    let replies = workers.call(&Echo(42)).await?;
    if replies.values().iter().any(|&v| v != 42) || replies.len() != count as usize {
        return Err(format!("echo(42) on {count} procs: {:?}", replies.values()));
    }
    info!("echo ok");
    Ok(())
}

async fn print() -> Result<(), String> {
    let procs = spawn_procs(&hosts(2))?;
    let printers = procs.spawn::<Worker>("printers", &0)?;
    for rank in 0..2 {
        printers
            .at("hosts", rank)?
            .call_one(&Print(format!("hello from {rank}")))
            .await?;
    }
    println!("controller stdout");
    info!("print done");
    Ok(())
}

async fn files(args: &[String]) -> Result<(), String> {
    let (Some(path), Some(var)) = (args.get(1), args.get(2)) else {
        return Err("usage: files PATH ENV-VAR".into());
    };
    match std::fs::read_to_string(path) {
        Ok(text) => info!("controller-file {}", text.trim()),
        Err(e) => info!("controller-file error {e}"),
    }
    info!(
        "controller-env {}",
        std::env::var(var).unwrap_or_else(|_| "-".into())
    );

    let procs = spawn_procs(&hosts(1))?;
    let readers = procs.spawn::<Worker>("readers", &0)?;
    match readers.call_one(&ReadFile(path.clone())).await {
        Ok(text) => info!("actor-file {}", text.trim()),
        Err(e) if e.kind() == ErrorKind::Endpoint => info!("actor-file error {}", e.message()),
        Err(e) => return Err(format!("read_file: {e}")),
    }
    let value = readers.call_one(&GetEnv(var.clone())).await?;
    info!("actor-env {}", value.as_deref().unwrap_or("-"));

    let written = std::path::Path::new(path)
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("written.txt");
    match std::fs::write(written, "x") {
        Ok(()) => info!("write ok"),
        Err(_) => info!("write error"),
    }
    Ok(())
}

const USAGE: &str = "usage: semantics MODE [ARGS]; modes: stopped, broadcast-error, deadline, \
                     trap-once, typed-error, time, info-kill, sleep-forever [N], sleep-call N MS, echo [N], \
                     exit CODE, print, files PATH VAR";

async fn main(args: Vec<String>) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("stopped") => stopped().await,
        Some("broadcast-error") => broadcast_error().await,
        Some("deadline") => deadline().await,
        Some("trap-once") => trap_once().await,
        Some("typed-error") => typed_error().await,
        Some("time") => time().await,
        Some("info-kill") => info_kill().await,
        Some("sleep-forever") => sleep_forever(&args).await,
        Some("sleep-call") => sleep_call(&args).await,
        Some("echo") => echo(&args).await,
        Some("exit") => std::process::exit(arg(&args, 1, 0i32)?),
        Some("print") => print().await,
        Some("files") => files(&args).await,
        Some(other) => Err(format!("unknown mode `{other}`; {USAGE}")),
        None => Err(USAGE.into()),
    }
}

monarch_guest::program! {
    main: main,
    actors: [Worker],
}
