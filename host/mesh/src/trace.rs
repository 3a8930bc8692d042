//! Traces of casts: one span per hop of a multicast tree, carried in the
//! cast itself and returned with its replies.
//!
//! A traced cast carries a [`TraceParent`] (the trace and the span of the
//! node that sent it). Each comm actor that takes it opens a hop span under
//! it, a handler span under the hop for every local actor it calls, and a
//! reduce span for the window in which it folds its replies; the spans of
//! a subtree travel up with its partial result ([`crate::comm::CastReply`]).
//! The caster opens the root span and, when the cast ends, hands every span
//! of the tree to the sink installed in its process ([`install_sink`]).
//!
//! Invariants:
//! - TR-1: with no sink installed, casts carry no trace context and no
//!   span is made: tracing off costs one relaxed load per cast.
//! - TR-2: the spans of one cast form one tree: one root (the caster's
//!   span, no parent), every other span's parent is a span of the same
//!   trace, and a child's interval lies within its parent's on a host with
//!   one clock.
//! - TR-3: spans travel only with replies: a broadcast, which sends nothing
//!   back up the tree (CA-5), yields its root span alone.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The trace context a cast carries down the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TraceParent {
    /// The trace's id (128 bits, W3C trace context).
    pub trace: u128,
    /// The id of the span under which the receiver opens its own.
    pub span: u64,
}

/// A finished span, as it travels up the tree and out to the sink.
#[derive(Debug, Clone, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SpanRecord {
    /// The trace's id.
    pub trace: u128,
    /// This span's id.
    pub span: u64,
    /// Its parent's id; 0 for the root.
    pub parent: u64,
    /// What it covers: `cast ENDPOINT`, `hop`, `handle ENDPOINT`, `reduce`.
    pub name: String,
    /// When it started, in nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// When it ended, in nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// Its attributes (proc, rank, mesh, ...).
    pub attrs: Vec<(String, String)>,
    /// Whether what it covers failed.
    pub error: bool,
}

impl SpanRecord {
    /// How long it lasted, in nanoseconds.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }

    /// The value of attribute `key`, if it has one.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Where the spans of finished casts go.
pub type Sink = Box<dyn Fn(Vec<SpanRecord>) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Installs the sink of this process's traced casts and turns tracing on
/// for the casts this process makes from then on. One per process; false
/// when one was installed already.
pub fn install_sink(sink: Sink) -> bool {
    let installed = SINK.set(sink).is_ok();
    if installed {
        ENABLED.store(true, Ordering::Release);
    }
    installed
}

/// Whether casts made in this process are traced (TR-1).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Hands finished spans to the sink, if there is one.
pub(crate) fn emit(spans: Vec<SpanRecord>) {
    if let Some(sink) = SINK.get() {
        sink(spans);
    }
}

/// Now, in nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A new, non-zero span id.
pub fn new_span_id() -> u64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        let local = 0u8;
        now_ns() ^ (u64::from(std::process::id()) << 32) ^ (&local as *const u8 as u64)
    });
    loop {
        let n = STATE.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        let id = mix(n ^ seed);
        if id != 0 {
            return id;
        }
    }
}

/// A new trace id.
pub fn new_trace_id() -> u128 {
    (u128::from(new_span_id()) << 64) | u128::from(new_span_id())
}

/// splitmix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A node's part of a traced cast: its own span, open, and the finished
/// spans of its subtree so far.
#[derive(Debug, Clone)]
pub(crate) struct NodeTrace {
    pub(crate) trace: u128,
    /// This node's span.
    pub(crate) span: u64,
    /// Its parent's span; 0 at the root.
    pub(crate) parent: u64,
    pub(crate) start_ns: u64,
    /// When the first reply (local or a child's) came in: the reduce
    /// span starts there.
    pub(crate) first_reply_ns: Option<u64>,
    /// Replies folded (local ranks and child subtrees).
    pub(crate) inputs: u32,
    pub(crate) spans: Vec<SpanRecord>,
}

impl NodeTrace {
    /// The trace of a node that took a cast sent under `parent`.
    pub(crate) fn under(parent: TraceParent) -> NodeTrace {
        NodeTrace {
            trace: parent.trace,
            span: new_span_id(),
            parent: parent.span,
            start_ns: now_ns(),
            first_reply_ns: None,
            inputs: 0,
            spans: Vec::new(),
        }
    }

    /// The trace of a caster's new cast: a new trace.
    pub(crate) fn root() -> NodeTrace {
        NodeTrace {
            trace: new_trace_id(),
            span: new_span_id(),
            parent: 0,
            start_ns: now_ns(),
            first_reply_ns: None,
            inputs: 0,
            spans: Vec::new(),
        }
    }

    /// What this node's children carry.
    pub(crate) fn child_parent(&self) -> TraceParent {
        TraceParent {
            trace: self.trace,
            span: self.span,
        }
    }

    /// Takes a reply (with the spans that came with it, if any).
    pub(crate) fn took_reply(&mut self, spans: Vec<SpanRecord>) {
        self.first_reply_ns.get_or_insert_with(now_ns);
        self.inputs += 1;
        self.spans.extend(spans);
    }

    /// A finished span under this node's.
    pub(crate) fn child_span(
        &self,
        name: String,
        start_ns: u64,
        attrs: Vec<(String, String)>,
        error: bool,
    ) -> SpanRecord {
        SpanRecord {
            trace: self.trace,
            span: new_span_id(),
            parent: self.span,
            name,
            start_ns,
            end_ns: now_ns(),
            attrs,
            error,
        }
    }

    /// Closes the node: its reduce span (from the first reply to now) and
    /// its own span, after every span of its subtree.
    pub(crate) fn close(
        mut self,
        name: String,
        attrs: Vec<(String, String)>,
        fold: &str,
        error: bool,
    ) -> Vec<SpanRecord> {
        let end_ns = now_ns();
        if self.inputs > 0 {
            let start_ns = self.first_reply_ns.unwrap_or(end_ns);
            self.spans.push(SpanRecord {
                trace: self.trace,
                span: new_span_id(),
                parent: self.span,
                name: "reduce".into(),
                start_ns,
                end_ns,
                attrs: vec![
                    ("fold".into(), fold.into()),
                    ("inputs".into(), self.inputs.to_string()),
                ],
                error: false,
            });
        }
        self.spans.push(SpanRecord {
            trace: self.trace,
            span: self.span,
            parent: self.parent,
            name,
            start_ns: self.start_ns,
            end_ns,
            attrs,
            error,
        });
        self.spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_ids_are_distinct_and_never_zero() {
        let ids: std::collections::HashSet<u64> = (0..100_000).map(|_| new_span_id()).collect();
        assert_eq!(ids.len(), 100_000);
        assert!(!ids.contains(&0));
    }

    #[test]
    fn a_closed_node_puts_its_reduce_span_inside_its_own() {
        let mut root = NodeTrace::root();
        let mut child = NodeTrace::under(root.child_parent());
        std::thread::sleep(std::time::Duration::from_millis(2));
        child.took_reply(Vec::new());
        let spans = child.close("hop".into(), Vec::new(), "gather", false);
        assert_eq!(spans.len(), 2);
        let (reduce, hop) = (&spans[0], &spans[1]);
        assert_eq!(reduce.name, "reduce");
        assert_eq!(reduce.parent, hop.span);
        assert_eq!(hop.parent, root.span);
        assert!(hop.start_ns <= reduce.start_ns && reduce.end_ns <= hop.end_ns);
        root.took_reply(spans);
        let all = root.close("cast e".into(), Vec::new(), "gather", false);
        // Every span of the subtree, the root's reduce span, then the root.
        assert_eq!(all.len(), 4);
        assert_eq!(all.last().map(|s| s.parent), Some(0));
        assert!(all.iter().all(|s| s.trace == all[0].trace));
    }
}
