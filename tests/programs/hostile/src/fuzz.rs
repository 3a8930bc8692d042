//! `fuzz SEED COUNT`: COUNT random calls of the WIT imports a guest
//! controls, picked by a xorshift generator seeded with SEED, against a
//! mesh of its own (`hosts=2, gpus=2`, four `Hostile` actors): slices with
//! any dimensions and selectors, `from-ref` of random bytes and of mutated
//! real references, calls and casts of payloads of every size up to just
//! past the host's limit, replies of such sizes, calls to endpoints that
//! do not exist, and drops of the handles it holds in random order.
//!
//! Every operation must end with a value, Ok or Err: a trap fails the run.
//! A payload or reply past the host's limit that ends Ok fails it too, and
//! at the end every actor of the mesh must still answer. The summary line
//! counts what ended Ok and Err, per kind of operation, and the payloads
//! near the limit.

use std::time::Duration;

use monarch_guest::SpawnOptions;
use monarch_guest::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{Blob, Hostile, Ping, Sink, Swell, mesh_ref, reference_json};

/// The most bytes the host takes in one message (`MAX_MESSAGE`: 64 MiB
/// less 64 KiB of room for the envelope of a frame between procs).
const MAX_MESSAGE: usize = (64 << 20) - (64 << 10);

/// What one run may allocate for payloads and replies, both ends
/// counted (a payload is held once as bytes and once encoded).
const BUDGET: usize = 200 << 20;

/// Payloads larger than this go to one actor only, not to the mesh.
const LARGE: usize = 1 << 20;

/// The most handles the run holds besides its mesh (the host's cap is
/// thousands: HG-3 is another mode's business).
const MAX_HANDLES: usize = 32;

/// Calls through references the host accepted after they were mutated:
/// they may name a proc nobody listens on, so each waits at most
/// [`FORGED_TIMEOUT`], and a run makes at most this many.
const MAX_FORGED_CALLS: u32 = 8;
/// The call timeout through a mutated reference.
const FORGED_TIMEOUT: Duration = Duration::from_millis(300);

/// Endpoints no actor of the program has.
const UNKNOWN_ENDPOINTS: [&str; 4] = ["no-such-endpoint", "", "sink ", "ping/../attack"];

/// A message to `UNKNOWN_ENDPOINTS[N]`.
#[derive(Serialize, Deserialize)]
struct Unknown<const N: usize>(Blob);

impl<const N: usize> Message for Unknown<N> {
    const ENDPOINT: &'static str = UNKNOWN_ENDPOINTS[N];
    type Reply = ();
}

/// A class that claims to handle [`Unknown`] messages, to send them
/// through a view of the `Hostile` mesh (a reference does not say its
/// class). Never spawned.
struct Decoy;

impl Actor for Decoy {
    const CLASS: &'static str = "Decoy";
    type Init = ();

    fn create((): (), _cx: &Context) -> Result<Self, String> {
        Err("Decoy is never spawned".into())
    }

    fn endpoints(_endpoints: &mut Endpoints<Self>) {}
}

impl<const N: usize> Handler<Unknown<N>> for Decoy {
    async fn handle(&mut self, _cx: &Context, _: Unknown<N>) -> Result<(), EndpointError> {
        Err(EndpointError::new("Decoy is never spawned"))
    }
}

/// Xorshift64*: small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // Zero is xorshift's fixed point; any other start will do.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    /// A `u32` that is often an edge: 0, 1, small, `u32::MAX`.
    fn edgy_u32(&mut self) -> u32 {
        match self.below(6) {
            0 => 0,
            1 => 1,
            2 | 3 => self.below(5) as u32,
            4 => u32::MAX - self.below(2) as u32,
            _ => self.next() as u32,
        }
    }
}

/// The kinds of operation, in the summary's order.
#[derive(Clone, Copy)]
enum Op {
    Slice,
    RefBytes,
    RefMutated,
    RefRoundTrip,
    Call,
    Cast,
    Reply,
    UnknownEndpoint,
    Drop,
}

const OPS: [(Op, &str); 9] = [
    (Op::Slice, "slice"),
    (Op::RefBytes, "from-ref-bytes"),
    (Op::RefMutated, "from-ref-mutated"),
    (Op::RefRoundTrip, "to-ref"),
    (Op::Call, "call"),
    (Op::Cast, "cast"),
    (Op::Reply, "reply"),
    (Op::UnknownEndpoint, "unknown-endpoint"),
    (Op::Drop, "drop"),
];

/// A handle the run holds, and whether it came from a reference the run
/// mutated (then calls through it may wait for a proc nobody runs).
struct Held {
    mesh: ActorMesh<Hostile>,
    forged: bool,
}

/// The run's state.
struct Fuzz {
    rng: Rng,
    /// The mesh the run spawned.
    mesh: ActorMesh<Hostile>,
    /// One actor of it, for large payloads.
    single: ActorMesh<Hostile>,
    held: Vec<Held>,
    /// Bytes still to spend on payloads and replies.
    budget: usize,
    forged_calls: u32,
    /// Payloads and replies just below the host's limit: how many, how
    /// many ended Ok.
    below_limit: (u32, u32),
    /// The same just past the limit, where Ok is a failure of the host.
    past_limit: (u32, u32),
    /// Per kind of operation: how many ended Ok, how many Err.
    counts: [(u32, u32); OPS.len()],
}

/// Runs `fuzz SEED COUNT` (the words after `fuzz`); returns the summary
/// line.
pub(crate) async fn run(args: &[&str]) -> Result<String, String> {
    let usage = "usage: hostile fuzz SEED COUNT [actor] (SEED and COUNT whole numbers)";
    let [seed, count] = args else {
        return Err(usage.into());
    };
    let seed: u64 = seed.parse().map_err(|e| format!("{usage}: SEED: {e}"))?;
    let count: u32 = count.parse().map_err(|e| format!("{usage}: COUNT: {e}"))?;
    monarch_guest::set_call_timeout(Duration::from_secs(20));
    let procs = spawn_procs(&extent!(hosts = 2))?;
    let mesh = procs.spawn_with::<Hostile>(
        "fuzz",
        &(),
        SpawnOptions::new().per_proc(extent!(gpus = 2)),
    )?;
    let single = mesh.slice(&[SliceDim::index("hosts", 1), SliceDim::index("gpus", 0)])?;
    let mut fuzz = Fuzz {
        rng: Rng::new(seed),
        mesh,
        single,
        held: Vec::new(),
        budget: BUDGET,
        forged_calls: 0,
        below_limit: (0, 0),
        past_limit: (0, 0),
        counts: [(0, 0); OPS.len()],
    };
    for _ in 0..count {
        let op = match OPS[fuzz.rng.below(OPS.len())].0 {
            // Nothing to drop: make a handle instead.
            Op::Drop if fuzz.held.is_empty() => Op::RefRoundTrip,
            op => op,
        };
        let ok = fuzz.step(op).await;
        let (oks, errs) = &mut fuzz.counts[op as usize];
        if ok {
            *oks += 1;
        } else {
            *errs += 1;
        }
    }
    let answers = fuzz
        .mesh
        .call(&Ping)
        .await
        .map_err(|e| format!("after {count} operations the mesh no longer answers: {e}"))?;
    if answers.len() != 4 {
        return Err(format!("{} of 4 actors answered", answers.len()));
    }
    if fuzz.past_limit.1 > 0 {
        return Err(format!(
            "{} of {} payloads or replies past the host's limit of {MAX_MESSAGE} bytes ended Ok",
            fuzz.past_limit.1, fuzz.past_limit.0
        ));
    }
    fuzz.held.clear();
    procs.stop();
    let (ok, err) = fuzz
        .counts
        .iter()
        .fold((0, 0), |(o, e), (oks, errs)| (o + oks, e + errs));
    let kinds: Vec<String> = OPS
        .iter()
        .zip(fuzz.counts)
        .map(|((_, name), (oks, errs))| format!("{name} {oks}/{errs}"))
        .collect();
    let (below, below_ok) = fuzz.below_limit;
    let past = fuzz.past_limit.0;
    Ok(format!(
        "fuzz seed {seed}: {count} operations, {ok} ok, {err} err, every actor answers ({}; ok/err); near the limit: {below} just below ({below_ok} ok), {past} just past (all err); {} MiB allocated for payloads",
        kinds.join(", "),
        (BUDGET - fuzz.budget) >> 20
    ))
}

impl Fuzz {
    /// One operation; whether it ended Ok (an Err is as good an end).
    async fn step(&mut self, op: Op) -> bool {
        match op {
            Op::Slice => self.slice(),
            Op::RefBytes => {
                let len = self.rng.below(300);
                let bytes: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
                self.resolve(&bytes, true)
            }
            Op::RefMutated => {
                let (mesh, _) = self.pick();
                let Ok(mut bytes) = reference_json(&mesh.to_ref()) else {
                    return false;
                };
                for _ in 0..=self.rng.below(3) {
                    mutate(&mut self.rng, &mut bytes);
                }
                self.resolve(&bytes, true)
            }
            Op::RefRoundTrip => {
                let (mesh, forged) = self.pick();
                match reference_json(&mesh.to_ref()) {
                    Ok(bytes) => self.resolve(&bytes, forged),
                    Err(_) => false,
                }
            }
            Op::Call => {
                let size = self.payload_size(usize::MAX);
                let ok = self.call(size).await;
                self.note(size, ok)
            }
            Op::Cast => {
                let size = self.payload_size(usize::MAX);
                let to = if size > LARGE {
                    self.single.clone()
                } else {
                    self.mesh.clone()
                };
                let ok = to.broadcast(&Sink(Blob(vec![0x5A; size]))).is_ok();
                self.note(size, ok)
            }
            Op::Reply => {
                let size = self.payload_size(usize::MAX);
                let ok = self.single.call_one(&Swell(size as u64)).await.is_ok();
                self.note(size, ok)
            }
            Op::UnknownEndpoint => self.unknown().await,
            Op::Drop => {
                let at = self.rng.below(self.held.len());
                if at < self.held.len() {
                    drop(self.held.swap_remove(at));
                }
                true
            }
        }
    }

    /// A mesh to work on, the run's own or one it holds, and whether it
    /// came from a mutated reference.
    fn pick(&mut self) -> (ActorMesh<Hostile>, bool) {
        let at = self.rng.below(self.held.len() + 1);
        match self.held.get(at) {
            Some(held) => (held.mesh.clone(), held.forged),
            None => (self.mesh.clone(), false),
        }
    }

    fn keep(&mut self, mesh: ActorMesh<Hostile>, forged: bool) {
        if self.held.len() < MAX_HANDLES {
            self.held.push(Held { mesh, forged });
        }
    }

    /// `from-ref` of `bytes`; an accepted handle is kept.
    fn resolve(&mut self, bytes: &[u8], forged: bool) -> bool {
        let Ok(reference) = mesh_ref::<Hostile>(bytes) else {
            return false;
        };
        match ActorMesh::<Hostile>::from_ref(&reference) {
            Ok(mesh) => {
                self.keep(mesh, forged);
                true
            }
            Err(_) => false,
        }
    }

    fn slice(&mut self) -> bool {
        let (mesh, forged) = self.pick();
        let names: Vec<String> = mesh
            .extent()
            .dims()
            .iter()
            .map(|d| d.name.clone())
            .collect();
        let dims: Vec<SliceDim> = (0..self.rng.below(4))
            .map(|_| {
                let dim = match self.rng.below(names.len() + 2) {
                    i if i < names.len() => names[i].clone(),
                    i if i == names.len() => "nosuch".to_string(),
                    _ => String::new(),
                };
                if self.rng.chance(2) {
                    SliceDim::index(dim, self.rng.edgy_u32())
                } else {
                    let (start, end, step) = (
                        self.rng.edgy_u32(),
                        self.rng.edgy_u32(),
                        self.rng.edgy_u32(),
                    );
                    SliceDim::range_step(dim, start..end, step)
                }
            })
            .collect();
        match mesh.slice(&dims) {
            Ok(sliced) => {
                self.keep(sliced, forged);
                true
            }
            Err(_) => false,
        }
    }

    /// A payload size: mostly small, at times around 64 KiB, and within
    /// the budget one just below or just past the host's limit; at most
    /// `max`.
    fn payload_size(&mut self, max: usize) -> usize {
        let size = match self.rng.below(10) {
            0 => 0,
            1 => 1,
            2 | 3 => self.rng.below(256),
            4 | 5 => (64 << 10) - 8 + self.rng.below(16),
            6 => self.rng.below(LARGE),
            7 => LARGE + self.rng.below(3 * LARGE),
            8 => MAX_MESSAGE - 64 - self.rng.below(64),
            _ => MAX_MESSAGE + 1 + self.rng.below(64),
        }
        .min(max);
        // Held as bytes and again encoded.
        let cost = 2 * size;
        if cost <= self.budget {
            self.budget -= cost;
            size
        } else {
            self.rng.below(256)
        }
    }

    /// Counts a payload or reply of `size` near the host's limit, and
    /// how it ended; passes `ok` on.
    fn note(&mut self, size: usize, ok: bool) -> bool {
        if size > MAX_MESSAGE {
            self.past_limit.0 += 1;
            self.past_limit.1 += u32::from(ok);
        } else if size + 1024 > MAX_MESSAGE {
            self.below_limit.0 += 1;
            self.below_limit.1 += u32::from(ok);
        }
        ok
    }

    async fn call(&mut self, size: usize) -> bool {
        let at = self.rng.below(self.held.len() + 1);
        let (mesh, forged) = match self.held.get(at) {
            Some(held) if size <= LARGE => (held.mesh.clone(), held.forged),
            _ if size > LARGE => (self.single.clone(), false),
            _ => (self.mesh.clone(), false),
        };
        let mesh = if forged {
            if self.forged_calls >= MAX_FORGED_CALLS {
                return false;
            }
            self.forged_calls += 1;
            mesh.with_call_timeout(FORGED_TIMEOUT)
        } else {
            mesh
        };
        let sink = Sink(Blob(vec![0xA5; size]));
        match self.rng.below(3) {
            0 => mesh.call(&sink).await.is_ok(),
            1 => mesh.call_one(&sink).await.is_ok(),
            _ => mesh.choose(&sink).await.is_ok(),
        }
    }

    async fn unknown(&mut self) -> bool {
        let size = self.payload_size(LARGE);
        let Ok(reference) = reference_json(&self.mesh.to_ref()) else {
            return false;
        };
        let Ok(decoy) = mesh_ref::<Decoy>(&reference)
            .and_then(|r| ActorMesh::<Decoy>::from_ref(&r).map_err(|e| e.to_string()))
        else {
            return false;
        };
        let blob = || Blob(vec![0; size]);
        match self.rng.below(UNKNOWN_ENDPOINTS.len()) {
            0 => decoy.call(&Unknown::<0>(blob())).await.is_ok(),
            1 => decoy.call(&Unknown::<1>(blob())).await.is_ok(),
            2 => decoy.call(&Unknown::<2>(blob())).await.is_ok(),
            _ => decoy.call(&Unknown::<3>(blob())).await.is_ok(),
        }
    }
}

/// Numbers that sit on an edge of what a reference's fields hold.
const EDGE_NUMBERS: [&str; 9] = [
    "0",
    "1",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    "-1",
    "99999999999999999999999999",
    "1e9",
    "0.5",
];

/// One random edit of a reference's JSON: a flipped bit, an inserted or
/// deleted byte, a number replaced by an edge, a part repeated, or a cut.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        bytes.push(b'{');
        return;
    }
    let at = rng.below(bytes.len());
    match rng.below(6) {
        0 => bytes[at] ^= 1 << rng.below(8),
        1 => bytes.insert(at, b"{}[]\",:0a\\"[rng.below(10)]),
        2 => {
            bytes.remove(at);
        }
        3 => {
            // Replace the digits that start at or after `at` with an edge.
            let Some(start) = bytes[at..].iter().position(u8::is_ascii_digit) else {
                return;
            };
            let start = at + start;
            let end = bytes[start..]
                .iter()
                .position(|b| !b.is_ascii_digit())
                .map_or(bytes.len(), |n| start + n);
            let edge = EDGE_NUMBERS[rng.below(EDGE_NUMBERS.len())].as_bytes();
            bytes.splice(start..end, edge.iter().copied());
        }
        4 => {
            let end = (at + 1 + rng.below(40)).min(bytes.len());
            let part = bytes[at..end].to_vec();
            bytes.splice(at..at, part);
        }
        _ => bytes.truncate(at),
    }
}
