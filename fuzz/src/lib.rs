//! The checks behind the fuzz targets in `fuzz_targets/`, one function
//! per target, so that `cargo test` in this crate can replay the seed
//! corpus and every regression input through the same code (see
//! `tests/replay.rs` and docs/fuzzing.md).
//!
//! Each function takes arbitrary bytes and must return normally: the code
//! under test answers bad input with an error. Where the code states an
//! invariant, the check asserts it on what it accepted, so a violation is a
//! crash the fuzzer reports like a panic.

use std::str::FromStr;

use arbitrary::{Arbitrary, Unstructured};
use hyperactor::ClusterToken;
use hyperactor::fuzzing;
use hyperactor::message::RemoteMessage;
use hyperactor_mesh::remote::{
    AgentHeartbeat, AgentHello, AgentInfo, AgentKill, AgentPutBlob, AgentSpawn, AgentStop,
    AgentStopProcs,
};
use hyperactor_mesh::shape::{Extent, Selection, Selector, Shape, Slice};

/// The host's footprint reader, built from its source: the monarch-host
/// crate (wasmtime and all) takes far too long to build with fuzzing
/// instrumentation, and this file depends on wasmparser alone.
#[path = "../../host/monarch-host/src/engine/footprint.rs"]
mod footprint;

/// The HTTP API's types, built from their source for the same reason;
/// [`debug`] stands in for the two types of monarch-host it names.
#[path = "../../host/monarch-host/src/serve/api.rs"]
#[allow(dead_code)]
pub mod api;

/// The host's reader and writer of actor mesh references
/// (`ActorMeshHandle::from_ref`/`to_ref`), built from their source for the
/// same reason; it depends on serde_json and hyperactor alone.
#[path = "../../host/monarch-host/src/mesh/reference.rs"]
pub mod mesh_ref;

/// Stand-ins for the `crate::debug` types `api.rs` names, which only
/// answers (never requests) carry.
pub mod debug {
    /// Stand-in for `monarch_host::debug::stacks`.
    pub mod stacks {
        /// Stand-in for the stacks report.
        #[derive(Debug, Clone, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        pub struct Report {}
    }
    /// Stand-in for `monarch_host::debug::dumps`.
    pub mod dumps {
        /// Stand-in for a dump's record.
        #[derive(
            Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        pub struct Dump {}
    }
}

pub mod seeds;

/// The largest frame the `frame` target's reader accepts (the default
/// `ProcConfig::max_frame_size` is larger; a smaller limit keeps runs fast
/// and still lets the fuzzer cross it).
pub const MAX_FRAME: usize = 1 << 20;

/// Shapes with more points than this are not enumerated: listing a
/// legitimately huge mesh is not a bug, only slow.
const MAX_POINTS: usize = 1 << 12;

/// The token the receiving proc requires when the first byte asks for one.
const CLUSTER_TOKEN: &str = "fuzz-cluster-token";

/// Target `frame`: a byte stream read as one incoming connection (hello,
/// then data frames validated as rkyv envelopes).
///
/// Byte 0 picks the read size (1 to 256 bytes, or whole), byte 1 whether
/// the proc requires a cluster token; the rest is the stream.
pub fn frame(data: &[u8]) {
    let [chunk, token, stream @ ..] = data else {
        return;
    };
    let chunk = match *chunk {
        0 => usize::MAX,
        n => n as usize,
    };
    let required = ClusterToken::new(CLUSTER_TOKEN);
    let token = if token & 1 == 1 {
        required.as_ref()
    } else {
        None
    };
    let _ = fuzzing::receive_stream(stream, chunk, MAX_FRAME, token);
}

/// Target `hello`: the handshakes a peer starts with.
///
/// Byte 0 picks what the rest is: the body of a channel hello frame
/// (`from` or `from\ntoken`), checked against a cluster token; or an
/// archived request to a host agent (`AgentHello` first of all, and the
/// others it handles), decoded as the agent's port decodes it, with the
/// agent's token and version checks; or the agent's reply to a hello as
/// the controller decodes it.
pub fn hello(data: &[u8]) {
    let [kind, body @ ..] = data else {
        return;
    };
    let token = ClusterToken::new(CLUSTER_TOKEN);
    match kind % 10 {
        0 => {
            let accepted = fuzzing::check_hello(body, token.as_ref());
            // Only a hello carrying the token gets in.
            if accepted.is_ok() {
                let needle = format!("\n{CLUSTER_TOKEN}");
                assert!(body.ends_with(needle.as_bytes()));
            }
        }
        1 => {
            if let Ok(hello) = AgentHello::decode(body) {
                agent_checks(&hello.token);
                let _ = hello.version == env!("CARGO_PKG_VERSION");
            }
        }
        2 => {
            if let Ok(spawn) = AgentSpawn::decode(body) {
                agent_checks(&spawn.token);
            }
        }
        3 => {
            if let Ok(beat) = AgentHeartbeat::decode(body) {
                agent_checks(&beat.token);
            }
        }
        4 => {
            if let Ok(blob) = AgentPutBlob::decode(body) {
                agent_checks(&blob.token);
            }
        }
        5 => {
            if let Ok(kill) = AgentKill::decode(body) {
                agent_checks(&kill.token);
                let _ = kill.proc.to_string();
            }
        }
        6 => {
            if let Ok(stop) = AgentStopProcs::decode(body) {
                agent_checks(&stop.token);
            }
        }
        7 => {
            if let Ok(stop) = AgentStop::decode(body) {
                agent_checks(&stop.token);
            }
        }
        _ => {
            if let Ok(Ok(info)) = Result::<AgentInfo, String>::decode(body) {
                let _ = (info.version.len(), info.node.len(), info.incarnation);
            }
        }
    }
}

/// What a host agent checks first in every request: the cluster token,
/// compared in constant time through [`ClusterToken::matches`], which must
/// admit exactly the agent's token.
fn agent_checks(given: &str) {
    let agent = ClusterToken::new(CLUSTER_TOKEN);
    let admitted = match &agent {
        Some(token) => token.matches(given.as_bytes()),
        None => given.is_empty(),
    };
    assert_eq!(admitted, given == CLUSTER_TOKEN);
}

/// Target `component`: the bytes of an uploaded component, read the way
/// the host reads them before compiling (`engine::inspect`: the header,
/// then the footprint pass over every section with wasmparser).
pub fn component(data: &[u8]) {
    if data.len() < 8 || &data[0..4] != b"\0asm" {
        return;
    }
    if let Ok(footprint) = footprint::footprint(data) {
        let _ = (footprint.needs, footprint.interfaces.len());
    }
}

/// Target `api_json`: a request body of the HTTP API, deserialized with
/// serde_json into every request type the server reads (byte 0 picks
/// which), as axum's `Json` extractor does. What deserializes must
/// serialize and read back the same (the CLI client sends what the
/// server reads).
pub fn api_json(data: &[u8]) {
    use api::{InputRequest, JobRequest, MeshRequest, PartialLimits, SessionRequest};

    let [kind, body @ ..] = data else {
        return;
    };
    match kind % 5 {
        0 => round_trip::<JobRequest>(body),
        1 => round_trip::<MeshRequest>(body),
        2 => round_trip::<SessionRequest>(body),
        3 => round_trip::<InputRequest>(body),
        _ => round_trip::<PartialLimits>(body),
    }
}

fn round_trip<T>(body: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let Ok(value) = serde_json::from_slice::<T>(body) else {
        return;
    };
    let text = serde_json::to_string(&value).expect("a request serializes");
    let again: T = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("a request does not read back: {e}: {text}"));
    assert_eq!(
        serde_json::to_string(&again).expect("a request serializes"),
        text
    );
}

/// Target `reference`: the bytes of an actor mesh reference that a guest
/// hands back to `actor-mesh.from-ref` (`mesh_ref::parse`).
///
/// Byte 0 picks the form: the rest as raw bytes, or the rest read by
/// `arbitrary` as the fields of a reference (mostly plausible ones), which
/// are written as JSON and then edited byte by byte, so that the fuzzer
/// reaches the checks past JSON quickly. What `parse` accepts must hold
/// MR-1 (ranks fill the extent, each inside the mesh, `per_proc > 0`, no
/// dimension twice) and MR-2 (`encode` writes what reads back the same).
pub fn reference(data: &[u8]) {
    let [kind, rest @ ..] = data else {
        return;
    };
    if kind.is_multiple_of(2) {
        check_reference(rest);
    } else if let Ok(fields) = Unstructured::new(rest).arbitrary::<RefFields>() {
        check_reference(&fields.to_bytes());
    }
}

fn check_reference(bytes: &[u8]) {
    let Ok(parsed) = mesh_ref::parse(bytes) else {
        return;
    };
    // MR-1.
    let points = parsed
        .extent
        .iter()
        .try_fold(1u64, |size, (_, n)| size.checked_mul(u64::from(*n)));
    assert_eq!(points, Some(parsed.ranks.len() as u64), "{parsed:?}");
    assert!(parsed.per_proc > 0, "{parsed:?}");
    let limit = parsed.procs.len() as u64 * u64::from(parsed.per_proc);
    assert!(
        parsed.ranks.iter().all(|&r| u64::from(r) < limit),
        "{parsed:?}"
    );
    let mut names: Vec<&str> = parsed.extent.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), parsed.extent.len(), "{parsed:?}");
    // A view made from it slices like any other: its extent is one.
    if !parsed.extent.is_empty() {
        let dims = parsed.extent.iter().map(|(n, s)| (n.clone(), *s as usize));
        if let Err(e) = Extent::new(dims) {
            panic!("an accepted reference's extent is refused: {e}: {parsed:?}");
        }
    }
    // MR-2.
    let encoded = mesh_ref::encode(&parsed);
    let again = mesh_ref::parse(&encoded).unwrap_or_else(|e| {
        panic!(
            "an encoded reference does not read back: {e}: {}",
            String::from_utf8_lossy(&encoded)
        )
    });
    assert_eq!(again, parsed);
}

/// Proc ids of every transport, as the host writes them.
const PROCS: [&str; 4] = [
    "local:ctl,proc0",
    "unix:/tmp/monarch-run1-0.sock,proc1",
    "tcp:10.0.0.2:7071,proc3",
    "tcp:[::1]:4000,p",
];

/// The fields of a mesh reference, mostly plausible, then edits of its
/// JSON: the structured mode of the `reference` target.
#[derive(Debug, Arbitrary)]
struct RefFields {
    /// `monarch`: absent, right, or any text.
    monarch: Option<Option<String>>,
    version: Option<u32>,
    name: Pick,
    procs: Vec<Pick>,
    per_proc: Size,
    extent: Vec<(Pick, Size)>,
    ranks: Ranks,
    edits: Vec<Edit>,
}

/// A value among a few valid ones (by index), or any text.
#[derive(Debug, Arbitrary)]
enum Pick {
    Known(u8),
    Any(String),
}

/// A size: small mostly, any `u32` at times.
#[derive(Debug, Arbitrary)]
enum Size {
    Small(u8),
    Any(u32),
}

impl Size {
    fn get(&self) -> u32 {
        match *self {
            Size::Small(n) => u32::from(n % 8),
            Size::Any(n) => n,
        }
    }
}

/// The ranks: the extent's points in order (of a small mesh), reversed,
/// or any list.
#[derive(Debug, Arbitrary)]
enum Ranks {
    InOrder,
    Reversed,
    Given(Vec<u32>),
}

/// A byte edit of the written JSON.
#[derive(Debug, Arbitrary)]
enum Edit {
    Flip(u16, u8),
    Insert(u16, u8),
    Delete(u16),
    Truncate(u16),
}

impl RefFields {
    fn to_bytes(&self) -> Vec<u8> {
        let pick = |p: &Pick, known: &[&str]| match p {
            Pick::Known(i) => known[usize::from(*i) % known.len()].to_string(),
            Pick::Any(text) => text.clone(),
        };
        let extent: Vec<(String, u32)> = self
            .extent
            .iter()
            .map(|(name, size)| (pick(name, &["hosts", "gpus", "procs", "x"]), size.get()))
            .collect();
        let points = extent
            .iter()
            .try_fold(1u32, |size, (_, n)| size.checked_mul(*n))
            .filter(|&n| n as usize <= MAX_POINTS)
            .unwrap_or(0);
        let ranks: Vec<u32> = match &self.ranks {
            Ranks::InOrder => (0..points).collect(),
            Ranks::Reversed => (0..points).rev().collect(),
            Ranks::Given(ranks) => ranks.clone(),
        };
        let mut value = serde_json::json!({
            "name": pick(&self.name, &["workers", "hostile", "j7.counter", "p.persist"]),
            "procs": self.procs.iter().map(|p| pick(p, &PROCS)).collect::<Vec<_>>(),
            "per_proc": self.per_proc.get(),
            "extent": extent,
            "ranks": ranks,
        });
        if let Some(marker) = &self.monarch {
            value["monarch"] = marker.as_deref().unwrap_or("actor-mesh").into();
        }
        if let Some(version) = self.version {
            value["version"] = (version % 3).into();
        }
        let mut bytes = value.to_string().into_bytes();
        for edit in &self.edits {
            let at = |i: u16, len: usize| usize::from(i) % (len + 1);
            match *edit {
                Edit::Flip(i, mask) if !bytes.is_empty() => {
                    let i = usize::from(i) % bytes.len();
                    bytes[i] ^= mask;
                }
                Edit::Insert(i, byte) => bytes.insert(at(i, bytes.len()), byte),
                Edit::Delete(i) if !bytes.is_empty() => {
                    bytes.remove(usize::from(i) % bytes.len());
                }
                Edit::Truncate(i) => bytes.truncate(at(i, bytes.len())),
                _ => {}
            }
        }
        bytes
    }
}

/// One selection step as a guest asks for it through WIT (`slice-dim`):
/// a dimension and an index or a strided range.
#[derive(Debug, Arbitrary)]
struct Step {
    /// Index of an existing dimension, or past them an unknown name.
    dim: u8,
    selector: GuestSelector,
}

/// WIT's `selector`: u32 fields, widened to `usize` by the host.
#[derive(Debug, Arbitrary)]
enum GuestSelector {
    Index(u32),
    Range(u32, u32, u32),
}

impl GuestSelector {
    fn to_selector(&self) -> Selector {
        match *self {
            GuestSelector::Index(i) => Selector::Index(i as usize),
            GuestSelector::Range(start, end, step) => Selector::Range {
                start: start as usize,
                end: end as usize,
                step: step as usize,
            },
        }
    }
}

/// Target `shape`: extents, slices and selections as a guest or a peer
/// gives them.
///
/// Byte 0 picks the form: extent text (`Extent::from_str`, SH-3 round
/// trip), dimensions plus WIT-style selection steps (`Shape::select_many`,
/// `Selection::eval`), raw slice parameters (`Slice::new`, SH-4), or
/// serialized shapes and selections (JSON and rkyv archives, which bypass
/// the constructors).
pub fn shape(data: &[u8]) {
    let [kind, rest @ ..] = data else {
        return;
    };
    match kind % 5 {
        0 => extent_text(rest),
        1 => {
            let mut u = Unstructured::new(rest);
            let _ = selections(&mut u);
        }
        2 => {
            let mut u = Unstructured::new(rest);
            let _ = slice_params(&mut u);
        }
        3 => {
            if let Ok(shape) = serde_json::from_slice::<Shape>(rest) {
                exercise(&shape);
            }
            if let Ok(selection) = serde_json::from_slice::<(Shape, Selection)>(rest) {
                let _ = selection.1.eval(&selection.0);
            }
        }
        _ => {
            let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(rest.len());
            aligned.extend_from_slice(rest);
            if let Ok(shape) = rkyv::from_bytes::<Shape, rkyv::rancor::Error>(&aligned) {
                exercise(&shape);
            }
            if let Ok(selection) = rkyv::from_bytes::<Selection, rkyv::rancor::Error>(&aligned) {
                let shape = Shape::new(&Extent::unit());
                let _ = selection.eval(&shape);
            }
        }
    }
}

fn extent_text(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(extent) = Extent::from_str(text) else {
        return;
    };
    // SH-3: the text form reads back as the same extent.
    let shown = extent.to_string();
    assert_eq!(Extent::from_str(&shown).as_ref(), Ok(&extent), "{shown}");
    exercise(&Shape::new(&extent));
}

fn selections(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let dims: Vec<(String, u16)> = u.arbitrary()?;
    let Ok(extent) = Extent::new(
        dims.iter()
            .map(|(name, size)| (name.clone(), *size as usize)),
    ) else {
        return Ok(());
    };
    let shape = Shape::new(&extent);
    let steps: Vec<Step> = u.arbitrary()?;
    let named: Vec<(String, Selector)> = steps
        .iter()
        .map(|step| {
            let name = match shape.labels().get(step.dim as usize) {
                Some(label) => label.clone(),
                None => format!("unknown{}", step.dim),
            };
            (name, step.selector.to_selector())
        })
        .collect();
    if let Ok(sliced) = shape.select_many(&named) {
        // SH-5: a slice of a mesh names only ranks of that mesh.
        if sliced.len() <= MAX_POINTS && shape.len() <= MAX_POINTS {
            let all = shape.ranks();
            assert!(sliced.ranks().iter().all(|r| all.contains(r)));
        }
        exercise(&sliced);
    }
    let selection = selection(u, &shape, 3)?;
    if shape.len() <= MAX_POINTS
        && let Ok(ranks) = selection.eval(&shape)
    {
        // SH-8: sorted, without duplicates, all in the shape.
        assert!(ranks.windows(2).all(|w| w[0] < w[1]));
        assert!(ranks.iter().all(|&r| shape.slice().contains(r)));
    }
    Ok(())
}

fn selection(u: &mut Unstructured<'_>, shape: &Shape, depth: u32) -> arbitrary::Result<Selection> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => Selection::All,
        1 => Selection::First,
        2 if depth > 0 => {
            let n = u.int_in_range(0..=3usize)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(selection(u, shape, depth - 1)?);
            }
            Selection::Union(items)
        }
        _ => {
            let step: Step = u.arbitrary()?;
            let dim = match shape.labels().get(step.dim as usize) {
                Some(label) => label.clone(),
                None => format!("unknown{}", step.dim),
            };
            let (start, end, step) = match step.selector {
                GuestSelector::Index(i) => (i as usize, i as usize + 1, 1),
                GuestSelector::Range(a, b, c) => (a as usize, b as usize, c as usize),
            };
            Selection::Range {
                dim,
                start,
                end,
                step,
            }
        }
    })
}

fn slice_params(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let offset: usize = u.arbitrary()?;
    let sizes: Vec<usize> = u.arbitrary()?;
    let strides: Vec<usize> = u.arbitrary()?;
    let Ok(slice) = Slice::new(offset, sizes, strides) else {
        return Ok(());
    };
    // SH-4: points and ranks map one to one.
    for index in 0..slice.len().min(64) {
        let rank = slice.get(index).expect("an index below len has a rank");
        let point = slice
            .coordinates(rank)
            .expect("a slice's own rank has a point");
        assert_eq!(slice.location(&point), Ok(rank));
        assert_eq!(slice.index_of(rank), Some(index));
    }
    let probe: usize = u.arbitrary()?;
    if let Ok(point) = slice.coordinates(probe) {
        assert_eq!(slice.location(&point), Ok(probe));
    }
    Ok(())
}

/// Calls what the host calls on a shape it holds, without enumerating huge ones.
fn exercise(shape: &Shape) {
    let _ = (shape.len(), shape.num_dims(), shape.extent().to_string());
    if shape.len() <= MAX_POINTS {
        let ranks = shape.ranks();
        for (index, &rank) in ranks.iter().enumerate().take(64) {
            let _ = shape.slice().index_of(rank);
            let _ = shape.slice().get(index);
        }
        let _ = Selection::All.eval(shape);
        let _ = Selection::First.eval(shape);
    }
    for label in shape.labels().iter().take(4) {
        let _ = shape.select(label, Selector::Index(0));
        let _ = shape.select(label, Selector::range(0, usize::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structured seed of `reference` starts the fuzzer past JSON and
    /// past the checks: its fields make a reference the host accepts.
    #[test]
    fn the_fields_seed_makes_an_accepted_reference() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/reference/seed-fields");
        let seed = std::fs::read(path).expect("the seed");
        assert_eq!(seed[0] % 2, 1, "a structured input");
        let fields: RefFields = Unstructured::new(&seed[1..]).arbitrary().expect("fields");
        let accepted = mesh_ref::parse(&fields.to_bytes()).expect("an accepted reference");
        assert_eq!(accepted.procs.len(), 2);
        assert_eq!(accepted.ranks.len(), 2);
    }
}
