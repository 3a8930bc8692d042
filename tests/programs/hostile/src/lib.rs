//! hostile: a program that attacks the host that runs it, from the
//! controller or from inside an actor's endpoint. tests/hostile.rs runs
//! every mode both ways and checks that each attack ends with an error that
//! says what happened, and that the host and other jobs carry on.
//!
//! `hostile MODE [ARGS...] [actor]`. Without `actor` the controller
//! attacks; with it, rank 0 of a `Hostile` mesh on two procs attacks
//! inside its `attack` endpoint, the controller logs how the call ended
//! (`the attack ended: KIND: MESSAGE`), checks that rank 1, on the other
//! proc, still answers, and returns Ok. With `actor later`, a mesh of
//! one proc is spawned and stopped first, so that the attacking procs
//! start after the program was stored on the host (with a fork server,
//! they are forked with the program loaded, AL-7). The modes:
//!
//! - `loop`: computes forever without calling the host. Only the run's
//!   deadline (`--timeout`) or the handler deadline (`--handler-timeout`)
//!   stops it.
//! - `memory`: allocates 1 MiB after 1 MiB until the memory cap (`--memory`)
//!   refuses to grow it.
//! - `recursion`: recurses without end until the Wasm stack is exhausted.
//! - `handles`: makes mesh handles (`from-ref` of one reference) without
//!   dropping any, until the host's cap on resources per instance refuses
//!   one.
//! - `requests`: makes calls without ever awaiting one, until the host's
//!   cap on requests whose events were not taken refuses one.
//! - `payload`: cannot even allocate a 1 GiB payload under the memory cap
//!   (logged); sends a message just below the host's 64 MiB per call to
//!   rank 1, which is larger than a frame between procs may be, then one
//!   of 32 MiB, which fits, and asks rank 1 for a reply just below 64 MiB (each
//!   logged); then hands the host 80 MiB in one call, which traps.
//! - `payload-len`: hands the host a payload whose (pointer, length) claims
//!   1 GiB that its memory does not have, which traps.
//! - `forged`: resolves and calls references it made up: garbage, a mesh
//!   name nobody spawned on a real proc, a proc at an address nobody
//!   listens on, ranks outside the mesh, an extent whose size overflows,
//!   and a mesh that was stopped. Each is logged as `forged WHAT: ERROR`;
//!   any call that is answered fails the run.
//! - `files`: reads files it was not granted: `/etc/passwd`, a `..` escape
//!   of the granted `/data`, a symlink in `/data` to a file outside it. Each
//!   refusal is logged as `reading PATH was refused: ERROR`; any read that
//!   succeeds fails the run. `/data/granted.txt` must be readable.
//! - `fuzz SEED COUNT` (`hostile fuzz 7 400 [actor]`): COUNT random WIT
//!   calls on a mesh of its own, picked by a generator seeded with SEED
//!   (see `fuzz.rs`): slices, `from-ref` of random and mutated references,
//!   payloads and replies of every size up to just past the host's limit,
//!   unknown endpoints, drops of handles in random order. Each must end
//!   with Ok or Err, never a trap; the mode ends with the summary `fuzz
//!   seed SEED: COUNT operations, N ok, M err, every actor answers (...)`
//!   once every actor of its mesh still answers.
//! - `stale-handle`: drops an actor mesh handle, then calls `name` through
//!   the same handle number again (the bindings' unsafe `from_handle`),
//!   which the host must refuse with a trap naming the handle.

use std::time::Duration;

use monarch_guest::bindings::monarch::host::mesh as wit_mesh;
use monarch_guest::prelude::*;
use monarch_guest::{MeshRef, codec};
use serde::{Deserialize, Serialize};

mod fuzz;

/// `attack`: runs one mode against `target`; replies with what the mode
/// saw, when it ends at all.
#[derive(Serialize, Deserialize)]
struct Attack {
    mode: String,
    target: MeshRef<Hostile>,
}

impl Message for Attack {
    const ENDPOINT: &'static str = "attack";
    type Reply = String;
}

/// `sink`: takes bytes; replies with how many came.
#[derive(Serialize, Deserialize)]
struct Sink(Blob);

impl Message for Sink {
    const ENDPOINT: &'static str = "sink";
    type Reply = u64;
}

/// `swell`: replies with this many bytes.
#[derive(Serialize, Deserialize)]
struct Swell(u64);

impl Message for Swell {
    const ENDPOINT: &'static str = "swell";
    type Reply = Blob;
}

/// `ping`: answers at once.
#[derive(Serialize, Deserialize)]
struct Ping;

impl Message for Ping {
    const ENDPOINT: &'static str = "ping";
    type Reply = ();
}

/// Bytes that travel as one CBOR byte string, not as a list of numbers.
struct Blob(Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Blob;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(v))
            }
        }
        d.deserialize_byte_buf(Visitor)
    }
}

struct Hostile;

impl Actor for Hostile {
    const CLASS: &'static str = "Hostile";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Ok(Hostile)
    }

    fn endpoints(endpoints: &mut Endpoints<Self>) {
        endpoints
            .handle::<Attack>()
            .handle::<Sink>()
            .handle::<Swell>()
            .handle::<Ping>();
    }
}

impl Handler<Attack> for Hostile {
    async fn handle(&mut self, cx: &Context, attack: Attack) -> Result<String, EndpointError> {
        let target = attack.target.resolve().map_err(|e| e.to_string())?;
        let who = format!("hostile {}", cx.rank());
        Ok(run_mode(&attack.mode, &target, &who).await?)
    }
}

impl Handler<Sink> for Hostile {
    async fn handle(&mut self, _cx: &Context, Sink(bytes): Sink) -> Result<u64, EndpointError> {
        Ok(bytes.0.len() as u64)
    }
}

impl Handler<Swell> for Hostile {
    async fn handle(&mut self, _cx: &Context, Swell(n): Swell) -> Result<Blob, EndpointError> {
        Ok(Blob(vec![0; n as usize]))
    }
}

impl Handler<Ping> for Hostile {
    async fn handle(&mut self, _cx: &Context, _: Ping) -> Result<(), EndpointError> {
        Ok(())
    }
}

/// Runs `mode` (its name, then its arguments, separated by spaces) as
/// `who`, against the actor mesh `target` (one actor, on another proc)
/// where the mode needs one.
async fn run_mode(mode: &str, target: &ActorMesh<Hostile>, who: &str) -> Result<String, String> {
    info!("{who} attacks: {mode}");
    let words: Vec<&str> = mode.split(' ').collect();
    match words[0] {
        "loop" => spin_forever(),
        "memory" => eat(who),
        "recursion" => {
            let depth = recurse(core::hint::black_box(0));
            Err(format!("the recursion returned at depth {depth}"))
        }
        "handles" => flood(target, who),
        "requests" => requests(target, who),
        "payload" => payload(target, who).await,
        "payload-len" => forged_length(target),
        "forged" => forged(target).await,
        "files" => files(),
        "fuzz" => fuzz::run(&words[1..]).await,
        "stale-handle" => stale_handle(target, who),
        other => Err(format!(
            "unknown mode `{other}`; the modes are {}",
            MODES.join(", ")
        )),
    }
}

/// Every mode, as `run_mode` knows it.
const MODES: [&str; 11] = [
    "loop",
    "memory",
    "recursion",
    "handles",
    "requests",
    "payload",
    "payload-len",
    "forged",
    "files",
    "fuzz",
    "stale-handle",
];

/// `stale-handle`; see the crate docs.
fn stale_handle(target: &ActorMesh<Hostile>, who: &str) -> Result<String, String> {
    let raw = raw_mesh(target)?;
    let number = raw.handle();
    info!("{who} holds the actor mesh handle {number}: {}", raw.name());
    drop(raw);
    info!("{who} dropped handle {number} and calls `name` through it");
    // SAFETY: none; the handle was dropped on purpose, so that the guest
    // hands the host a handle number it no longer owns. The host must
    // refuse it (the canonical ABI checks every handle against the
    // instance's table).
    let stale = unsafe { wit_mesh::ActorMesh::from_handle(number) };
    let name = stale.name();
    // Reached only if the host took the dropped handle; dropping it again
    // would hand it the same handle a second time.
    std::mem::forget(stale);
    Err(format!(
        "the host answered through the dropped handle {number}: `{name}`"
    ))
}

/// A loop the optimizer must keep, with no call out of the instance.
fn spin_forever() -> ! {
    loop {
        core::hint::black_box(());
    }
}

/// Holds ever more memory, written to so that none of it can be elided.
fn eat(who: &str) -> ! {
    let mut held: Vec<Vec<u8>> = Vec::new();
    loop {
        held.push(core::hint::black_box(vec![0xA5; 1 << 20]));
        if held.len().is_multiple_of(16) {
            info!("{who} holds {} MiB", held.len());
        }
    }
}

/// Recurses without end: each frame is a Wasm frame (its values are Wasm
/// locals, not the shadow stack in linear memory), so the Wasm stack runs
/// out, not the memory.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if core::hint::black_box(depth) == u64::MAX {
        return depth;
    }
    recurse(core::hint::black_box(depth + 1)).wrapping_add(1)
}

/// Makes handles without end, logging every 1,000.
fn flood(target: &ActorMesh<Hostile>, who: &str) -> Result<String, String> {
    let reference = reference_json(&target.to_ref())?;
    let mut held = Vec::new();
    loop {
        match wit_mesh::ActorMesh::from_ref(&reference) {
            Ok(handle) => held.push(handle),
            Err(e) => return Err(format!("from-ref failed after {} handles: {e}", held.len())),
        }
        if held.len().is_multiple_of(1000) {
            info!("{who} holds {} handles", held.len());
        }
    }
}

/// Makes calls without ever awaiting one, logging every 10,000.
fn requests(target: &ActorMesh<Hostile>, who: &str) -> Result<String, String> {
    let mut calls = Vec::new();
    loop {
        calls.push(target.call_one(&Ping));
        if calls.len().is_multiple_of(10_000) {
            info!("{who} has {} calls in flight", calls.len());
        }
    }
}

/// The most bytes the host takes in one call (its hostcall fuel).
const HOST_CALL_LIMIT: usize = 64 << 20;

/// `payload`; see the crate docs.
async fn payload(target: &ActorMesh<Hostile>, who: &str) -> Result<String, String> {
    let mut gib: Vec<u8> = Vec::new();
    match gib.try_reserve_exact(1 << 30) {
        Ok(()) => {
            return Err(format!(
                "{who} allocated a 1 GiB payload under the memory cap"
            ));
        }
        Err(e) => info!("{who} cannot allocate a 1 GiB payload: {e}"),
    }
    drop(gib);
    // Just below what one host call takes: the frame it would make
    // between procs, with the envelope around it, is larger than a frame
    // may be, so the host refuses it at once.
    let big = Sink(Blob(vec![0; HOST_CALL_LIMIT - 32]));
    match target.call_one(&big).await {
        Ok(n) => info!("{who}: a payload of {n} bytes was delivered"),
        Err(e) => info!(
            "{who}: a payload just below 64 MiB failed: {}: {e}",
            e.kind().name()
        ),
    }
    drop(big);
    // A payload that fits is delivered.
    let fits = Sink(Blob(vec![0; 32 << 20]));
    match target.call_one(&fits).await {
        Ok(n) => info!("{who}: a payload of {n} bytes was delivered"),
        Err(e) => return Err(format!("a 32 MiB payload failed: {e}")),
    }
    drop(fits);
    // A reply too large for a frame, though not for the host call that
    // returns it, comes back as an error.
    match target
        .call_one(&Swell((HOST_CALL_LIMIT - 1024) as u64))
        .await
    {
        Ok(blob) => info!("{who}: a reply of {} bytes came back", blob.0.len()),
        Err(e) => info!(
            "{who}: a reply just below 64 MiB failed: {}: {e}",
            e.kind().name()
        ),
    }
    info!(
        "{who}: the target still answers: {:?}",
        target.call_one(&Ping).await
    );
    // Past what one host call takes: the host traps the guest before it
    // copies the bytes.
    let raw = raw_mesh(target)?;
    let huge = vec![0u8; 80 << 20];
    info!("{who} hands the host {} MiB in one call", huge.len() >> 20);
    let sent = raw.broadcast(Sink::ENDPOINT, &huge);
    Err(format!(
        "the host took {} MiB in one call: {sent:?}",
        huge.len() >> 20
    ))
}

/// `payload-len`: a (pointer, length) pair that claims 1 GiB.
fn forged_length(target: &ActorMesh<Hostile>) -> Result<String, String> {
    let raw = raw_mesh(target)?;
    let byte = [0u8; 16];
    // SAFETY: none; the slice is a lie on purpose, so that the pointer and
    // length this guest hands the host claim memory it does not have. The
    // guest never reads it; the host must refuse it.
    let claimed = unsafe { std::slice::from_raw_parts(byte.as_ptr(), 1 << 30) };
    let sent = raw.broadcast(Sink::ENDPOINT, core::hint::black_box(claimed));
    Err(format!("the host took a forged 1 GiB list: {sent:?}"))
}

/// `forged`; see the crate docs.
async fn forged(target: &ActorMesh<Hostile>) -> Result<String, String> {
    monarch_guest::set_call_timeout(Duration::from_secs(10));
    let real = reference_json(&target.to_ref())?;
    let real = String::from_utf8(real).map_err(|e| e.to_string())?;
    let proc = first_proc(&real).ok_or(format!("no proc in the reference {real}"))?;
    let forgeries: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\xff\xfe not a reference at all".to_vec()),
        (
            "json of another shape",
            br#"{"monarch":"buffer","version":1}"#.to_vec(),
        ),
        (
            "an unknown mesh on a real proc",
            mesh_json("nosuchmesh", &[&proc], 1, &[("procs", 1)], &[0]),
        ),
        (
            "a proc nobody listens on",
            mesh_json(
                "hostile",
                &["unix:/nonexistent/monarch-forged.sock,proc0"],
                1,
                &[("procs", 1)],
                &[0],
            ),
        ),
        (
            "a proc at a made-up tcp address",
            mesh_json(
                "hostile",
                &["tcp:192.0.2.1:9,proc0"],
                1,
                &[("procs", 1)],
                &[0],
            ),
        ),
        (
            "ranks outside the mesh",
            mesh_json("hostile", &[&proc], 1, &[("procs", 2)], &[0, 7]),
        ),
        (
            "an extent whose size overflows",
            mesh_json(
                "hostile",
                &[&proc],
                1,
                &[("a", u32::MAX), ("b", u32::MAX), ("c", u32::MAX)],
                &[],
            ),
        ),
        (
            "an extent that wraps to zero",
            mesh_json(
                "hostile",
                &[&proc],
                1,
                &[
                    ("a", 1 << 16),
                    ("b", 1 << 16),
                    ("c", 1 << 16),
                    ("d", 1 << 16),
                ],
                &[],
            ),
        ),
        (
            "a dimension named twice",
            mesh_json("hostile", &[&proc], 1, &[("x", 1), ("x", 1)], &[0]),
        ),
    ];
    for (what, bytes) in forgeries {
        let reference = mesh_ref::<Hostile>(&bytes)?;
        match ActorMesh::from_ref(&reference) {
            Err(e) => info!("forged {what}: {e}"),
            Ok(mesh) => match mesh.call(&Ping).await {
                Err(e) => info!("forged {what}: {}: {e}", e.kind().name()),
                Ok(_) => {
                    return Err(format!(
                        "a call through a forged reference ({what}) was answered"
                    ));
                }
            },
        }
    }
    // A mesh that was stopped: its reference outlives it.
    let procs = spawn_procs(&extent!(procs = 1))?;
    let gone = procs.spawn::<Hostile>("gone", &())?;
    let reference = reference_json(&gone.to_ref())?;
    gone.stop();
    procs.stop();
    drop(gone);
    let stale =
        ActorMesh::<Hostile>::from_ref(&mesh_ref(&reference)?).map_err(|e| e.to_string())?;
    match stale.call_one(&Ping).await {
        Err(e) => info!("forged a stopped mesh: {}: {e}", e.kind().name()),
        Ok(()) => return Err("a call to a stopped mesh was answered".into()),
    }
    Ok("every forged reference was refused".into())
}

/// `files`; see the crate docs.
fn files() -> Result<String, String> {
    match std::fs::read_to_string("/data/granted.txt") {
        Ok(text) => info!("read the granted /data/granted.txt: {}", text.trim()),
        Err(e) => return Err(format!("cannot read the granted /data/granted.txt: {e}")),
    }
    for path in [
        "/etc/passwd",
        "/data/../etc/passwd",
        "/data/../../../../etc/passwd",
        "/data/escape/passwd",
        "/data/link-to-passwd",
    ] {
        match std::fs::read(path) {
            Ok(bytes) => {
                return Err(format!(
                    "read {} bytes of {path}, which was not granted",
                    bytes.len()
                ));
            }
            Err(e) => info!("reading {path} was refused: {e}"),
        }
    }
    match std::fs::write("/data/written.txt", b"hostile") {
        Ok(()) => return Err("wrote into the read-only /data".into()),
        Err(e) => info!("writing /data/written.txt was refused: {e}"),
    }
    Ok("every file outside the grant was refused".into())
}

/// A mesh reference's JSON (`wit/README.md`), as the WIT's `to-ref` wrote it.
fn reference_json<A>(reference: &MeshRef<A>) -> Result<Vec<u8>, String> {
    let cbor = codec::encode(reference).map_err(|e| e.to_string())?;
    // Tag 40100 (0xd9 0x9c 0xa4), then a byte string.
    let rest = cbor
        .strip_prefix(&[0xd9, 0x9c, 0xa4][..])
        .ok_or("a mesh reference without its tag")?;
    let (&head, rest) = rest.split_first().ok_or("an empty mesh reference")?;
    let (len, rest) = match head {
        0x40..=0x57 => (usize::from(head - 0x40), rest),
        0x58 => (usize::from(*rest.first().ok_or("short")?), &rest[1..]),
        0x59 => (
            usize::from(u16::from_be_bytes([rest[0], rest[1]])),
            &rest[2..],
        ),
        0x5a => (
            u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize,
            &rest[4..],
        ),
        _ => {
            return Err(format!(
                "a mesh reference that is not a byte string ({head:#x})"
            ));
        }
    };
    rest.get(..len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| "a mesh reference shorter than it says".into())
}

/// A mesh reference over `json`, whatever it holds.
fn mesh_ref<A>(json: &[u8]) -> Result<MeshRef<A>, String> {
    let mut cbor = vec![0xd9, 0x9c, 0xa4, 0x5a];
    cbor.extend_from_slice(&(json.len() as u32).to_be_bytes());
    cbor.extend_from_slice(json);
    codec::decode(&cbor).map_err(|e| e.to_string())
}

/// The raw WIT handle of `mesh`, for calls the typed API does not make.
fn raw_mesh(mesh: &ActorMesh<Hostile>) -> Result<wit_mesh::ActorMesh, String> {
    wit_mesh::ActorMesh::from_ref(&reference_json(&mesh.to_ref())?)
}

/// The first proc id of a reference's JSON.
fn first_proc(json: &str) -> Option<String> {
    let procs = json.split("\"procs\":[\"").nth(1)?;
    Some(procs.split('"').next()?.to_string())
}

/// An actor mesh reference's JSON (`wit/README.md`) with these fields.
fn mesh_json(
    name: &str,
    procs: &[&str],
    per_proc: u32,
    extent: &[(&str, u32)],
    ranks: &[u32],
) -> Vec<u8> {
    let list = |items: Vec<String>| items.join(",");
    format!(
        r#"{{"monarch":"actor-mesh","version":1,"name":"{name}","procs":[{}],"per_proc":{per_proc},"extent":[{}],"ranks":[{}]}}"#,
        list(procs.iter().map(|p| format!("\"{p}\"")).collect()),
        list(extent.iter().map(|(d, s)| format!("[\"{d}\",{s}]")).collect()),
        list(ranks.iter().map(u32::to_string).collect()),
    )
    .into_bytes()
}

async fn main(args: Vec<String>) -> Result<(), String> {
    let usage = "usage: hostile MODE [actor [later]], or hostile fuzz SEED COUNT [actor [later]]";
    let first = args.first().ok_or(usage)?;
    // A mode and its arguments travel to the attacking actor as one string.
    let words = if first == "fuzz" { 3 } else { 1 };
    if args.len() < words {
        return Err(usage.into());
    }
    let mode = args[..words].join(" ");
    let (in_actor, later) = match &args[words..] {
        [] => (false, false),
        [last] if last == "actor" => (true, false),
        [actor, later] if actor == "actor" && later == "later" => (true, true),
        rest => return Err(format!("{usage}; unknown `{}`", rest.join(" "))),
    };
    if mode == "files" && !in_actor {
        return files().map(|done| info!("{done}"));
    }
    // The actors' failures are handled here: what an attack does to its
    // actor is what the controller reports.
    monarch_guest::supervise(|_| true);
    if later {
        let first = spawn_procs(&extent!(procs = 1))?;
        first
            .spawn::<Hostile>("first", &())?
            .call_one(&Ping)
            .await
            .map_err(|e| format!("the first mesh does not answer: {e}"))?;
        first.stop();
    }
    let procs = spawn_procs(&extent!(procs = 2))?;
    let actors = procs.spawn::<Hostile>("hostile", &())?;
    let attacker = actors.at("procs", 0)?;
    let target = actors.at("procs", 1)?;
    if !in_actor {
        let done = run_mode(&mode, &target, "the controller").await?;
        info!("{done}");
        return Ok(());
    }
    let attack = Attack {
        mode,
        target: target.to_ref(),
    };
    match attacker.call_one(&attack).await {
        Ok(done) => info!("the attack ended: {done}"),
        Err(e) => info!("the attack ended: {}: {e}", e.kind().name()),
    }
    target
        .call_one(&Ping)
        .await
        .map_err(|e| format!("the other actor no longer answers: {e}"))?;
    info!("the other actor still answers");
    procs.stop();
    Ok(())
}

monarch_guest::program! {
    main: main,
    actors: [Hostile],
}
