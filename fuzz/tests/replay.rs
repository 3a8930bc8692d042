//! Replays the seed corpus and every regression input through the fuzz
//! targets' checks (a plain `cargo test` in `fuzz/`, no libFuzzer or
//! nightly flags), and checks that the seeds are still what they claim to
//! be: valid inputs the code accepts, so the fuzzer starts from inside
//! the formats.

use std::path::{Path, PathBuf};

use hyperactor::ClusterToken;
use hyperactor::fuzzing::receive_stream;
use monarch_host_fuzz::{MAX_FRAME, api_json, component, frame, hello, mesh_ref, reference, shape};

/// A fuzz target's check.
type Check = fn(&[u8]);

const TARGETS: [(&str, Check); 6] = [
    ("frame", frame),
    ("hello", hello),
    ("shape", shape),
    ("component", component),
    ("api_json", api_json),
    ("reference", reference),
];

fn inputs(dir: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_regression_input_runs_clean() {
    for (target, check) in TARGETS {
        for path in inputs("regressions", target) {
            eprintln!("replaying {}", path.display());
            check(&read(&path));
        }
    }
}

#[test]
fn every_seed_runs_clean() {
    for (target, check) in TARGETS {
        let seeds = inputs("corpus", target);
        assert!(!seeds.is_empty(), "corpus/{target} has no seeds");
        for path in seeds {
            check(&read(&path));
        }
    }
}

#[test]
fn frame_seeds_are_accepted_streams_with_envelopes() {
    let token = ClusterToken::new("fuzz-cluster-token");
    for path in inputs("corpus", "frame") {
        let bytes = read(&path);
        let wants_token = bytes[1] & 1 == 1;
        let summary = receive_stream(
            &bytes[2..],
            usize::from(bytes[0].max(1)),
            MAX_FRAME,
            token.as_ref().filter(|_| wants_token),
        )
        .unwrap_or_else(|e| panic!("{} is refused: {e}", path.display()));
        assert!(summary.hello_from.is_some(), "{}", path.display());
        assert!(summary.envelopes > 0, "{}", path.display());
    }
}

#[test]
fn a_stream_without_the_token_is_refused() {
    let token = ClusterToken::new("fuzz-cluster-token");
    let path = inputs("corpus", "frame")
        .into_iter()
        .find(|p| p.ends_with("seed-plain"))
        .expect("the plain seed");
    let bytes = read(&path);
    let refused = receive_stream(&bytes[2..], 64, MAX_FRAME, token.as_ref());
    assert!(refused.is_err(), "a hello without the token got in");
}

#[test]
fn api_json_seeds_are_requests_the_server_reads() {
    use monarch_host_fuzz::api::{InputRequest, JobRequest, MeshRequest, SessionRequest};

    for path in inputs("corpus", "api_json") {
        let bytes = read(&path);
        let body = &bytes[1..];
        let read = match bytes[0] {
            0 => serde_json::from_slice::<JobRequest>(body).map(drop),
            1 => serde_json::from_slice::<MeshRequest>(body).map(drop),
            2 => serde_json::from_slice::<SessionRequest>(body).map(drop),
            3 => serde_json::from_slice::<InputRequest>(body).map(drop),
            _ => serde_json::from_slice::<monarch_host_fuzz::api::PartialLimits>(body).map(drop),
        };
        read.unwrap_or_else(|e| panic!("{} is refused: {e}", path.display()));
    }
}

#[test]
fn reference_seeds_are_references_the_host_reads() {
    let mut raw = 0;
    for path in inputs("corpus", "reference") {
        let bytes = read(&path);
        if bytes[0].is_multiple_of(2) {
            mesh_ref::parse(&bytes[1..])
                .unwrap_or_else(|e| panic!("{} is refused: {e}", path.display()));
            raw += 1;
        }
    }
    assert!(raw >= 3, "too few raw references among the seeds");
}

#[test]
fn a_reference_whose_ranks_leave_the_mesh_is_refused() {
    let path = inputs("corpus", "reference")
        .into_iter()
        .find(|p| p.ends_with("seed-mesh"))
        .expect("the mesh seed");
    let text = String::from_utf8(read(&path)[1..].to_vec()).expect("JSON text");
    let outside = text.replace("[0,1]", "[0,2]");
    assert_ne!(outside, text, "the seed's ranks are [0,1]");
    let error = mesh_ref::parse(outside.as_bytes()).unwrap_err();
    assert!(error.contains("a rank is outside the mesh"), "{error}");
}
