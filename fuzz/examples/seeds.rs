//! Writes the seed corpus, `corpus/TARGET/seed-*`: small valid inputs made
//! by the code under test itself (frames by the frame code, archives by
//! rkyv, components by hand). Run it from `fuzz/` after a change to a wire
//! format: `cargo run --example seeds`. `corpus/component/seed-controller-only.wasm`
//! is a copy of the `controller_only` test program (tests/programs), a
//! real Rust component of 66 KB.

use std::path::Path;

use hyperactor::PortId;
use hyperactor::fuzzing::sample_stream;
use hyperactor_mesh::remote::{AgentHello, AgentInfo};
use hyperactor_mesh::shape::{Extent, Selection, Shape};
use monarch_host_fuzz::mesh_ref::{self, MeshRef};
use monarch_host_fuzz::seeds;

/// The archived layout of `AgentHello`: a `OncePortRef` archives as its
/// port id alone, and only a mailbox can make one.
#[derive(rkyv::Archive, rkyv::Serialize)]
struct HelloWire {
    token: String,
    version: String,
    reply: PortId,
}

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("write a seed");
}

fn tagged(tag: &[u8], rest: &[u8]) -> Vec<u8> {
    [tag, rest].concat()
}

fn main() {
    let token = "fuzz-cluster-token";
    let stream = sample_stream("local:peer,peer", Some(token), &["hello", "world"]);
    write("frame", "token-two-messages", &tagged(&[0, 1], &stream));
    write("frame", "token-chunked", &tagged(&[7, 1], &stream));
    let plain = sample_stream("tcp:127.0.0.1:4000,peer", None, &["x"]);
    write("frame", "plain", &tagged(&[3, 0], &plain));

    write(
        "hello",
        "channel-token",
        &tagged(&[0], format!("local:peer,peer\n{token}").as_bytes()),
    );
    write(
        "hello",
        "channel-plain",
        &tagged(&[0], b"tcp:10.0.0.1:7000,peer"),
    );
    let reply: PortId = "local:ctl,ctl,client[0][12]".parse().expect("a port id");
    let hello = HelloWire {
        token: token.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        reply,
    };
    let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&hello).expect("archive a hello");
    assert!(
        <AgentHello as hyperactor::RemoteMessage>::decode(&bytes).is_ok(),
        "the mirror archives as an AgentHello"
    );
    write("hello", "agent-hello", &tagged(&[1], &bytes));
    let info: Result<AgentInfo, String> = Ok(AgentInfo {
        version: "0.1.0".into(),
        incarnation: 42,
        node: "node1".into(),
    });
    let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(&info).expect("archive an info");
    write("hello", "agent-info", &tagged(&[9], &bytes));

    write("shape", "extent-text", &tagged(&[0], b"hosts=2,gpus=4"));
    write("shape", "extent-number", &tagged(&[0], b"8"));
    let extent: Extent = "hosts=2,gpus=4".parse().expect("an extent");
    let shape = Shape::new(&extent);
    let json = serde_json::to_vec(&(shape.clone(), Selection::range("gpus", 1, 3)))
        .expect("shape as JSON");
    write("shape", "json", &tagged(&[3], &json));
    let archived = rkyv::to_bytes::<rkyv::rancor::Error>(&shape).expect("archive a shape");
    write("shape", "rkyv", &tagged(&[4], &archived));
    write(
        "shape",
        "selections",
        &tagged(
            &[1],
            &[
                2, 5, b'h', b'o', b's', b't', b's', 2, 0, 3, b'g', b'p', b'u', 4, 0, 1, 0, 1, 0, 0,
                0, 1, 1, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0,
            ],
        ),
    );

    let bodies: [(&str, u8, &str); 6] = [
        (
            "job",
            0,
            r#"{"component":"3f2a","args":["--steps","3"],"limits":{"memory_mib":64,"handler_timeout_s":1.5},"mesh":{"procs":2},"dirs":["/srv/data::/data:ro"],"env":["KEY=value"],"debug":false}"#,
        ),
        ("job-on-mesh", 0, r#"{"component":"3f2a","mesh":"workers"}"#),
        ("mesh", 1, r#"{"name":"workers","procs":4}"#),
        (
            "session",
            2,
            r#"{"name":"s1","mesh":"workers","idle_ttl_s":60,"args":[],"limits":{"procs":2}}"#,
        ),
        ("input", 3, r#"{"line":"print(1 + 1)"}"#),
        (
            "limits",
            4,
            r#"{"memory_mib":128,"timeout_s":30,"call_timeout_s":5}"#,
        ),
    ];
    for (name, kind, body) in bodies {
        write("api_json", name, &tagged(&[kind], body.as_bytes()));
    }

    // Mesh references as the host writes them (`to-ref`): a mesh on two
    // procs, a slice of a mesh of two actors per proc, one actor (no
    // dimensions left); then a structured input (byte 0 odd) that
    // `arbitrary` reads as fields.
    let procs: Vec<hyperactor::ProcId> = [
        "unix:/tmp/monarch-run1-0.sock,proc0",
        "tcp:10.0.0.2:7071,proc1",
    ]
    .iter()
    .map(|p| p.parse().expect("a proc id"))
    .collect();
    let references = [
        (
            "mesh",
            MeshRef {
                name: "workers".into(),
                procs: procs.clone(),
                per_proc: 1,
                extent: vec![("hosts".into(), 2)],
                ranks: vec![0, 1],
            },
        ),
        (
            "slice",
            MeshRef {
                name: "j7.counter".into(),
                procs: procs.clone(),
                per_proc: 2,
                extent: vec![("hosts".into(), 2), ("gpus".into(), 1)],
                ranks: vec![1, 3],
            },
        ),
        (
            "one-actor",
            MeshRef {
                name: "hostile".into(),
                procs,
                per_proc: 1,
                extent: vec![],
                ranks: vec![1],
            },
        ),
    ];
    for (name, reference) in references {
        let bytes = mesh_ref::encode(&reference);
        assert_eq!(mesh_ref::parse(&bytes).as_ref(), Ok(&reference));
        write("reference", name, &tagged(&[0], &bytes));
    }
    // Fields that make an accepted reference (two procs, extent
    // `H=2, procs=1`), found by a search over random inputs.
    write(
        "reference",
        "fields",
        &tagged(
            &[1],
            &[
                0, 192, 49, 89, 251, 62, 220, 143, 214, 195, 146, 85, 39, 37, 27, 217, 106, 48,
                120, 210, 215, 26, 248, 107, 3, 127, 15, 99, 63, 141, 72, 232, 119, 169, 18, 250,
                177, 86, 212, 175, 18, 54, 58, 236, 123, 59, 137, 174,
            ],
        ),
    );

    for (name, bytes) in seeds::components() {
        write("component", name, &bytes);
    }
}
