//! Process-wide totals of the data frames this process's procs hand to
//! their links and take from their connections.
//!
//! They let a benchmark count the messages one process (a controller)
//! sends and receives for an operation, whatever procs and links carry
//! them. Only data frames count: hellos, acknowledgements and `restarted`
//! frames are control traffic and are left out. A frame is counted once,
//! when a proc hands it to a link (retransmissions after a reconnect are
//! not counted again) and when a proc delivers it (duplicates dropped by
//! the receiver are not counted). Bytes include the frame header.
//!
//! The counters are `Relaxed` atomics: one uncontended add per frame.

use std::sync::atomic::{AtomicU64, Ordering};

static FRAMES_SENT: AtomicU64 = AtomicU64::new(0);
static BYTES_SENT: AtomicU64 = AtomicU64::new(0);
static FRAMES_RECEIVED: AtomicU64 = AtomicU64::new(0);
static BYTES_RECEIVED: AtomicU64 = AtomicU64::new(0);

/// A reading of the process-wide data-frame totals; subtract two readings
/// ([`Traffic::since`]) for what moved in between.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Data frames handed to links (one per message to another process).
    pub frames_sent: u64,
    /// Their bytes, headers included.
    pub bytes_sent: u64,
    /// Data frames delivered from connections (duplicates not counted).
    pub frames_received: u64,
    /// Their bytes, headers included.
    pub bytes_received: u64,
}

impl Traffic {
    /// What moved between `earlier` and this reading.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        Traffic {
            frames_sent: self.frames_sent.saturating_sub(earlier.frames_sent),
            bytes_sent: self.bytes_sent.saturating_sub(earlier.bytes_sent),
            frames_received: self.frames_received.saturating_sub(earlier.frames_received),
            bytes_received: self.bytes_received.saturating_sub(earlier.bytes_received),
        }
    }
}

/// The data frames this process has sent and received so far.
pub fn process_traffic() -> Traffic {
    Traffic {
        frames_sent: FRAMES_SENT.load(Ordering::Relaxed),
        bytes_sent: BYTES_SENT.load(Ordering::Relaxed),
        frames_received: FRAMES_RECEIVED.load(Ordering::Relaxed),
        bytes_received: BYTES_RECEIVED.load(Ordering::Relaxed),
    }
}

/// Counts a data frame of `bytes` handed to a link.
pub(crate) fn count_sent(bytes: usize) {
    FRAMES_SENT.fetch_add(1, Ordering::Relaxed);
    BYTES_SENT.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts a data frame of `bytes` delivered from a connection.
pub(crate) fn count_received(bytes: usize) {
    FRAMES_RECEIVED.fetch_add(1, Ordering::Relaxed);
    BYTES_RECEIVED.fetch_add(bytes as u64, Ordering::Relaxed);
}
