//! Debugging across ranks: post-mortem dumps of trapped actors
//! ([`dumps`]), breakpoints that pause an actor for a debugger
//! ([`pause`], [`hub`], [`select`], [`client`]), the debug engine of
//! `run --debug`, which stops compiled guests by source line, at traps and
//! when interrupted ([`engine`]), and the stacks of running actors, sampled
//! without stopping them ([`stacks`]).
//!
//! A run that can be debugged writes a record of itself ([`runs`]) that
//! `monarch-host debug` and `monarch-host stacks` find it by.

pub mod client;
pub mod dumps;
pub mod engine;
pub mod hub;
pub mod pause;
pub mod runs;
pub mod select;
pub mod stacks;

use std::sync::{Arc, Mutex};

use crate::host::Cluster;

/// What a debugger reaches of a live run: its cluster, from when the run
/// starts its controller until it ends. A caller that wants to inspect a
/// run keeps a clone of the [`crate::Sandbox`]'s.
#[derive(Clone, Default)]
pub struct LiveRun(Arc<Mutex<Option<Arc<Cluster>>>>);

impl std::fmt::Debug for LiveRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveRun")
    }
}

impl LiveRun {
    pub(crate) fn set(&self, cluster: Option<Arc<Cluster>>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = cluster;
    }

    /// The run's cluster, while it runs.
    pub fn cluster(&self) -> Option<Arc<Cluster>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
