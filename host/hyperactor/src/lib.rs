//! hyperactor: the actor runtime of monarch-host.
//!
//! This crate knows nothing of Wasm, HTTP or meshes. It gives the layers
//! above a small set of pieces, named as in PyTorch Monarch:
//!
//! - an **actor** ([`Actor`], [`Handler`]) is private state that handles
//!   typed messages one at a time, with a lifecycle ([`ActorStatus`]) and
//!   graceful stop;
//! - a **mailbox** ([`Mailbox`]) is where an actor's messages land, on
//!   numbered **ports**: [`Port`] for many messages, [`OncePort`] for one
//!   reply. References to them ([`ActorRef`], [`PortRef`], [`OncePortRef`])
//!   travel inside messages and work from any proc;
//! - a **proc** ([`Proc`]) holds actors and routes messages: directly within
//!   the proc, and over **channels** ([`channel`]) to other procs by address
//!   (`local:`, `unix:`, `tcp:`), with sequence numbers, acknowledgements,
//!   reconnects and retransmission;
//! - **failures are values**: an undeliverable message comes back as an
//!   [`Undeliverable`], a failed actor produces an [`ActorSupervisionEvent`]
//!   for its owner, and a call ends with its reply or a [`CallError`].
//!
//! ```
//! use hyperactor::{Actor, Context, Handler, OncePortRef, Proc};
//!
//! #[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
//! struct Add { n: u64, reply: OncePortRef<u64> }
//!
//! #[derive(Default)]
//! struct Counter { total: u64 }
//!
//! impl Actor for Counter {
//!     fn exports(exports: &mut hyperactor::Exports<Self>) {
//!         exports.handle::<Add>();
//!     }
//! }
//!
//! impl Handler<Add> for Counter {
//!     async fn handle(&mut self, cx: &Context<Self>, add: Add) -> anyhow::Result<()> {
//!         self.total += add.n;
//!         add.reply.send(cx, self.total);
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> anyhow::Result<()> {
//! let proc = Proc::serve("demo", "local:doc-demo".parse()?).await?;
//! let counter = proc.spawn("counter", 0, Counter::default())?.bind();
//! let (client, _undeliverable) = proc.attach("client")?;
//! counter.call(&client, |reply| Add { n: 2, reply }).await?;
//! let total = counter.call(&client, |reply| Add { n: 3, reply }).await?;
//! assert_eq!(total, 5);
//! # Ok(()) }
//! ```

pub mod actor;
pub mod channel;
pub mod failure;
#[doc(hidden)]
pub mod fuzzing;
pub mod id;
mod impair;
pub mod mailbox;
pub mod message;
pub mod proc;
pub mod sim;
pub mod testing;

pub use actor::{Actor, ActorHandle, ActorRef, ActorStatus, Context, Exports, Handler};
pub use channel::ChannelAddr;
pub use failure::{ActorSupervisionEvent, CallError, DeliveryFailure, Undeliverable};
pub use id::{ActorId, PortId, ProcId};
pub use mailbox::{Mailbox, OncePort, OncePortRef, PendingCall, Port, PortRef};
pub use message::RemoteMessage;
pub use proc::{ClusterToken, Proc, ProcConfig, ProcError};

/// A hash map with a fast, randomly seeded hasher (foldhash) for the maps
/// every message looks up: ports, actors, links, casts in flight. The
/// standard SipHash costs more than the rest of such a lookup.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
