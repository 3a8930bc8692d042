//! A mesh actor for tests, demos and benchmarks, and the registry that
//! spawns it (kind `echo`).
//!
//! Endpoints: `echo` replies with the message; `rank` with the rank;
//! `fail` replies with an endpoint error; `sleep` waits the message's
//! milliseconds first; `stall` never answers on the rank the message names
//! and answers with the rank elsewhere; `seq` checks that the numbers it
//! gets count up from 0 and replies with how many came out of order;
//! `count` replies with the next number `seq` expects; `exit` ends the whole process with the
//! message's code, `abort` and `segfault` end it by a signal;
//! `preloaded` replies with the sha256s its fork server had been told of
//! before it forked this proc ([`record_preload`]), comma-separated.
//!
//! Numbers in replies are CBOR integers, as the SDKs encode them
//! (`wit/ENCODING.md`), so the host's reducers read them (RD-1). Numbers in
//! messages are 8 little-endian bytes: only host tests and benchmarks call
//! this actor, never a program.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyperactor::{Actor, Context, Exports, Handler};

use crate::agent::{Registry, SpawnArgs, SpawnedActor};
use crate::cbor;
use crate::comm::MeshCall;

/// The blobs this process was told of as a fork server (FS-6), inherited
/// by each proc it forked after.
static PRELOADED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// A fork server's `preload` ([`crate::fork::serve_forks_prepared`]) for
/// procs of this actor: notes the blob, which the procs it forks after
/// that answer `preloaded` with.
pub fn record_preload(_path: &Path, sha256: &str) {
    PRELOADED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(sha256.to_string());
}

/// See the module docs.
pub struct EchoMeshActor {
    rank: u32,
    next_seq: u64,
    out_of_order: u64,
}

impl Actor for EchoMeshActor {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<MeshCall>();
    }
}

fn word(bytes: &[u8]) -> u64 {
    bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}

impl Handler<MeshCall> for EchoMeshActor {
    async fn handle(&mut self, cx: &Context<Self>, call: MeshCall) -> anyhow::Result<()> {
        let reply = match call.endpoint.as_str() {
            "echo" => Ok(call.message),
            "rank" => Ok(cbor::int(self.rank.into())),
            "fail" => Err(format!("rank {} refuses", self.rank)),
            "stall" if u64::from(self.rank) == word(&call.message) => {
                // Holds the call's reply port and never answers.
                std::mem::forget(call.reply);
                return Ok(());
            }
            "stall" => Ok(cbor::int(self.rank.into())),
            "sleep" => {
                tokio::time::sleep(std::time::Duration::from_millis(word(&call.message))).await;
                Ok(Vec::new())
            }
            "seq" => {
                let n = word(&call.message);
                if n != self.next_seq {
                    self.out_of_order += 1;
                }
                self.next_seq = n + 1;
                Ok(cbor::int(self.out_of_order as i64))
            }
            "count" => Ok(cbor::int(self.next_seq as i64)),
            "preloaded" => Ok(PRELOADED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .join(",")
                .into_bytes()),
            "exit" => std::process::exit(word(&call.message) as i32),
            "abort" => std::process::abort(),
            "segfault" => {
                // Rust's own SIGSEGV handler (for stack overflows) would
                // return from a raised signal: restore the default first.
                // SAFETY: crashing this process, on purpose.
                unsafe {
                    libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                    libc::raise(libc::SIGSEGV);
                }
                Ok(Vec::new())
            }
            other => Err(format!("no endpoint `{other}`")),
        };
        call.reply.send(cx, reply);
        Ok(())
    }
}

/// A registry with the `echo` kind, keeping blobs in `blob_dir`.
pub fn echo_registry(blob_dir: PathBuf) -> Registry {
    let mut registry = Registry::new(blob_dir);
    registry.register(
        "echo",
        Arc::new(|args: SpawnArgs| {
            Box::pin(async move {
                let actor = EchoMeshActor {
                    rank: args.rank,
                    next_seq: 0,
                    out_of_order: 0,
                };
                SpawnedActor::start(&args, actor).await
            })
        }),
    );
    registry
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::alloc::InProcessAllocator;
    use crate::cast::{CastTarget, Caster, Outcome};
    use crate::client::MeshClient;
    use crate::comm::CastMode;
    use crate::reduce::{RankError, Reducer};

    async fn mesh(procs: usize, per_proc: u32) -> (Arc<MeshClient>, CastTarget) {
        let registry = Arc::new(echo_registry(std::env::temp_dir().join("mesh-test-blobs")));
        let allocator = Arc::new(InProcessAllocator::new(registry));
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let addr = format!(
            "local:mesh-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )
        .parse()
        .unwrap();
        let client = MeshClient::new(addr, allocator, Arc::new(|_: &str| {}))
            .await
            .unwrap();
        let allocated = client.spawn_procs(procs).await.unwrap();
        let ids: Vec<_> = allocated.iter().map(|a| a.proc.clone()).collect();
        let extent = vec![
            ("procs".to_string(), procs as u32),
            ("actors".to_string(), per_proc),
        ];
        client
            .spawn_actors(
                &ids,
                &crate::client::ActorSpec {
                    kind: "echo".into(),
                    name: "e".into(),
                    extent,
                    params: vec![],
                    per_proc,
                },
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let ranks = (0..procs as u32)
            .map(|p| (p * per_proc..(p + 1) * per_proc).collect())
            .collect();
        let target = CastTarget {
            mesh: "e".into(),
            procs: ids,
            ranks,
        };
        (client, target)
    }

    /// TR-2 and TR-3: a traced reduction over 40 procs through a tree of
    /// fan-out 4 yields one tree: the root, a hop per proc with its
    /// handlers and reduction, every parent in the trace and every child
    /// within its parent; a broadcast yields its root alone; an untraced
    /// caster hands nothing to anyone (TR-1).
    #[tokio::test]
    async fn tr2_a_traced_cast_comes_back_as_one_tree_of_spans() {
        use crate::trace::SpanRecord;
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex};
        let (client, target) = mesh(40, 3).await;
        let got: Arc<Mutex<Vec<Vec<SpanRecord>>>> = Arc::default();
        let mut caster = Caster::new(client.mailbox(), 4);
        let store = got.clone();
        caster.set_trace_sink(Arc::new(move |spans| store.lock().unwrap().push(spans)));
        caster.cast(
            target.clone(),
            "rank",
            vec![],
            CastMode::Reduce(Reducer::SumI64),
            Duration::from_secs(5),
        );
        assert!(matches!(
            caster.next().await,
            Some(Outcome::Done { result: Ok(_), .. })
        ));
        let traces = std::mem::take(&mut *got.lock().unwrap());
        assert_eq!(traces.len(), 1);
        let spans = &traces[0];
        let by_id: HashMap<u64, &SpanRecord> = spans.iter().map(|s| (s.span, s)).collect();
        assert_eq!(by_id.len(), spans.len(), "distinct span ids");
        let roots: Vec<_> = spans.iter().filter(|s| s.parent == 0).collect();
        assert_eq!(roots.len(), 1);
        assert_eq!(roots[0].name, "cast rank");
        let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
        assert_eq!(count("hop"), 40);
        assert_eq!(count("handle rank"), 120);
        assert_eq!(count("reduce"), 41, "one per proc and the root's");
        let mut depth_of_deepest = 0;
        for span in spans.iter().filter(|s| s.parent != 0) {
            let parent = by_id[&span.parent];
            assert_eq!(span.trace, parent.trace);
            assert!(parent.start_ns <= span.start_ns && span.end_ns <= parent.end_ns);
            let mut depth = 0;
            let mut at = span;
            while at.parent != 0 {
                at = by_id[&at.parent];
                depth += 1;
            }
            depth_of_deepest = depth_of_deepest.max(depth);
        }
        // 40 procs under fan-out 4 need hops at least 3 deep, plus the
        // handler under the deepest hop.
        assert!(depth_of_deepest >= 4, "{depth_of_deepest}");
        caster.cast(
            target.clone(),
            "rank",
            vec![],
            CastMode::Broadcast,
            Duration::from_secs(5),
        );
        let traces = std::mem::take(&mut *got.lock().unwrap());
        assert_eq!(traces.len(), 1);
        assert_eq!(traces[0].len(), 1, "a broadcast's root alone");
        // Without a sink (and none in this process), nothing is traced.
        let mut plain = Caster::new(client.mailbox(), 4);
        plain.cast(
            target,
            "rank",
            vec![],
            CastMode::Gather,
            Duration::from_secs(5),
        );
        assert!(matches!(
            plain.next().await,
            Some(Outcome::Done { result: Ok(_), .. })
        ));
        assert!(got.lock().unwrap().is_empty());
        assert!(!crate::trace::enabled());
    }

    #[tokio::test]
    async fn ca2_a_reduction_over_many_procs_comes_back_as_one_value() {
        let (client, target) = mesh(40, 3).await;
        let mut caster = Caster::new(client.mailbox(), 4);
        let seq = caster.cast(
            target.clone(),
            "rank",
            vec![],
            CastMode::Reduce(Reducer::SumI64),
            Duration::from_secs(5),
        );
        let n = 40 * 3;
        assert_eq!(
            caster.next().await,
            Some(Outcome::Done {
                seq,
                result: Ok(vec![cbor::int((n * (n - 1) / 2) as i64)])
            })
        );
        let seq = caster.cast(
            target.clone(),
            "rank",
            vec![],
            CastMode::Gather,
            Duration::from_secs(5),
        );
        let Some(Outcome::Done {
            result: Ok(values), ..
        }) = caster.next().await
        else {
            panic!("no gather")
        };
        let _ = seq;
        let ranks: Vec<_> = values.iter().map(|v| cbor::read_number(v)).collect();
        assert_eq!(
            ranks,
            (0..n as i128)
                .map(|r| Ok(cbor::Number::Int(r)))
                .collect::<Vec<_>>()
        );
        assert!(caster.is_idle());
    }

    /// CA-4, CA-8: a node with a parent and children of its own ends an
    /// unanswered local call at the cast's deadline, so its subtree's
    /// answer reaches the caster before the caster's own grace runs out:
    /// the cast ends at its timeout, with the silent rank's `Timeout`.
    #[tokio::test]
    async fn ca8_a_node_deep_in_the_tree_times_out_its_silent_actor() {
        let (client, target) = mesh(12, 3).await;
        let mut caster = Caster::new(client.mailbox(), 2);
        // Rank 10 is on proc 3: under the caster's first child, with
        // children of its own at fan-out 2.
        let timeout = Duration::from_millis(400);
        let started = std::time::Instant::now();
        let seq = caster.cast(
            target,
            "stall",
            10u64.to_le_bytes().to_vec(),
            CastMode::Reduce(Reducer::SumI64),
            timeout,
        );
        let outcome = caster.next().await;
        let took = started.elapsed();
        assert_eq!(
            outcome,
            Some(Outcome::Done {
                seq,
                result: Err((10, RankError::Timeout(400)))
            })
        );
        // The caster alone would fail the missing ranks at the timeout
        // and its grace (250 ms): the node answered first.
        assert!(
            took < timeout + Duration::from_millis(200),
            "the cast ended after {took:?}"
        );
        assert!(caster.is_idle());
    }

    #[tokio::test]
    async fn ca1_slices_keep_per_actor_order_through_the_tree() {
        let (client, target) = mesh(20, 1).await;
        let mut caster = Caster::new(client.mailbox(), 2);
        // Alternate casts to the whole mesh and to one deep proc.
        let mut only_last = target.clone();
        for (i, ranks) in only_last.ranks.iter_mut().enumerate() {
            if i != 19 {
                ranks.clear();
            }
        }
        // Even numbers go to the whole mesh, odd ones to the last proc
        // only: the last actor must see them all, in order (CA-1).
        let mut sent = 0u64;
        for _ in 0..300 {
            let to = if sent.is_multiple_of(2) {
                &target
            } else {
                &only_last
            };
            caster.cast(
                to.clone(),
                "seq",
                sent.to_le_bytes().to_vec(),
                CastMode::Broadcast,
                Duration::from_secs(5),
            );
            sent += 1;
        }
        let seq = caster.cast(
            only_last.clone(),
            "seq",
            sent.to_le_bytes().to_vec(),
            CastMode::Reduce(Reducer::SumI64),
            Duration::from_secs(5),
        );
        loop {
            match caster.next().await {
                Some(Outcome::Done { seq: s, result }) if s == seq => {
                    assert_eq!(result.unwrap()[0], cbor::int(0), "out-of-order deliveries");
                    break;
                }
                Some(Outcome::Failed { error, .. }) => panic!("broadcast failed: {error}"),
                Some(_) => {}
                None => panic!("the cast never ended"),
            }
        }
    }

    #[tokio::test]
    async fn streams_answer_per_rank_and_errors_name_the_lowest_rank() {
        let (client, target) = mesh(5, 2).await;
        let mut caster = Caster::new(client.mailbox(), 16);
        let seq = caster.cast(
            target.clone(),
            "rank",
            vec![],
            CastMode::Stream,
            Duration::from_secs(5),
        );
        let mut seen = Vec::new();
        loop {
            match caster.next().await.unwrap() {
                Outcome::Item {
                    seq: s,
                    rank,
                    result,
                } => {
                    assert_eq!(s, seq);
                    assert_eq!(result.unwrap(), cbor::int(rank.into()));
                    seen.push(rank);
                }
                Outcome::End { seq: s } => {
                    assert_eq!(s, seq);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());

        let seq = caster.cast(
            target.clone(),
            "fail",
            vec![],
            CastMode::Gather,
            Duration::from_secs(5),
        );
        assert_eq!(
            caster.next().await,
            Some(Outcome::Done {
                seq,
                result: Err((0, RankError::Endpoint("rank 0 refuses".into())))
            })
        );
        let seq = caster.cast(
            target.clone(),
            "sleep",
            2000u64.to_le_bytes().to_vec(),
            CastMode::Gather,
            Duration::from_millis(100),
        );
        let Some(Outcome::Done {
            seq: s,
            result: Err((_, RankError::Timeout(100))),
        }) = caster.next().await
        else {
            panic!("no timeout")
        };
        assert_eq!(s, seq);
    }
}
