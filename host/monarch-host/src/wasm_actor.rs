//! A Wasm actor: one instance of the program component inside a hyperactor
//! actor.
//!
//! The instance is made in the actor's `init` (so the actors of a mesh are
//! instantiated in parallel, each on its proc), which also calls the
//! component's `create`. Each [`WasmCall`] runs the component's `handle`.
//! An endpoint error is a reply; a trap fails the actor, and hyperactor's
//! supervision turns it into a failure for every pending caller.

use std::sync::Arc;

use anyhow::anyhow;
use hyperactor::{Actor, Context, Exports, Handler, OncePortRef};
use wasmtime::Store;

use crate::bindings::{Dim, Program};
use crate::host::{Cluster, HostState, new_store};

/// A message to one endpoint of a Wasm actor; the reply is the endpoint's
/// result: its bytes, or its error text.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WasmCall {
    /// The endpoint's name.
    pub endpoint: String,
    /// The message bytes.
    pub message: Vec<u8>,
    /// Where the result goes.
    pub reply: OncePortRef<Result<Vec<u8>, String>>,
}

/// A Wasm actor; see the module docs.
pub struct WasmActor {
    cluster: Arc<Cluster>,
    mesh: String,
    class: String,
    init: Vec<u8>,
    rank: u32,
    extent: Vec<Dim>,
    instance: Option<(Store<HostState>, Program)>,
}

impl WasmActor {
    pub(crate) fn new(
        cluster: Arc<Cluster>,
        mesh: String,
        class: String,
        init: Vec<u8>,
        rank: u32,
        extent: Vec<Dim>,
    ) -> Self {
        WasmActor {
            cluster,
            mesh,
            class,
            init,
            rank,
            extent,
            instance: None,
        }
    }
}

impl Actor for WasmActor {
    fn exports(exports: &mut Exports<Self>) {
        exports.handle::<WasmCall>();
    }

    async fn init(&mut self, cx: &Context<Self>) -> anyhow::Result<()> {
        let who = format!("{}[{}]", self.mesh, self.rank);
        let mailbox: hyperactor::Mailbox = (**cx).clone();
        let state = HostState::new(self.cluster.clone(), mailbox, who);
        let mut store = new_store(&self.cluster, state);
        let program = self
            .cluster
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| anyhow!("instantiating the program: {e:?}"))?;
        let created = program
            .monarch_host_actor_class()
            .call_create(&mut store, &self.class, &self.init, self.rank, &self.extent)
            .await
            .map_err(|trap| {
                tracing::info!(actor = %cx.actor_id(), "trap in create: {trap:?}");
                anyhow!("`create` trapped: {}", trap_reason(&trap))
            })?;
        created.map_err(|error| anyhow!("`create` of class `{}` failed: {error}", self.class))?;
        self.instance = Some((store, program));
        Ok(())
    }
}

impl Handler<WasmCall> for WasmActor {
    async fn handle(&mut self, cx: &Context<Self>, call: WasmCall) -> anyhow::Result<()> {
        let (store, program) = self
            .instance
            .as_mut()
            .ok_or_else(|| anyhow!("the actor has no instance"))?;
        let result = program
            .monarch_host_actor_class()
            .call_handle(&mut *store, &call.endpoint, &call.message)
            .await;
        match result {
            Ok(reply) => {
                call.reply.send(cx, reply);
                Ok(())
            }
            // A trap is fatal: hyperactor fails the actor and every caller
            // waiting on it, this one included. Callers get the trap's
            // reason; the Wasm backtrace goes to the host's log.
            Err(trap) => {
                tracing::info!(actor = %cx.actor_id(), endpoint = %call.endpoint, "trap: {trap:?}");
                Err(anyhow!(
                    "trapped in `{}`: {}",
                    call.endpoint,
                    trap_reason(&trap)
                ))
            }
        }
    }
}

/// The reason of a trap without its backtrace: "wasm `unreachable`
/// instruction executed", "out of bounds memory access"...
pub(crate) fn trap_reason(error: &wasmtime::Error) -> String {
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(trap) => trap.to_string(),
        // Not a Trap (memory growth refused, a deadline): the innermost
        // cause says why; the outer layers are the backtrace.
        None => error.root_cause().to_string(),
    }
}
