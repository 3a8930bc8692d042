//! Channels: how envelopes move between procs.
//!
//! A channel is chosen by its address ([`ChannelAddr`]): in-process, Unix
//! socket or TCP. All three carry the same length-prefixed frames
//! (`frame`). The sending side is a *link* per destination address, which
//! numbers frames, keeps them until acknowledged, and reconnects with backoff
//! (`link`); the receiving side, in the proc, drops duplicates and
//! acknowledges in batches. Together they keep messages from one proc to
//! another in order and exactly once while the peer is reachable, and report
//! every unacknowledged message when it is not.
//!
//! TCP connections are mutual TLS 1.3 once a process installs its cluster's
//! certificates ([`tls::install`]); see [`tls`].

mod addr;
pub(crate) mod frame;
pub(crate) mod link;
pub mod tls;
pub(crate) mod traffic;
pub(crate) mod transport;

pub use addr::{AddrParseError, ChannelAddr};
pub use frame::{FrameError, PROTOCOL_VERSION};
pub use link::{ChannelStats, corked};
pub use traffic::{Traffic, process_traffic};
