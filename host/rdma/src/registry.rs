//! The table of registered buffers of one manager, and the checks every
//! remote access passes.
//!
//! Invariants (tested in `tests.rs` and below):
//! - RD-2: a request is served only if it names this manager, a registered
//!   buffer, that buffer's key (compared in constant time) and a range inside
//!   the buffer; otherwise it gets a status saying which check failed and no
//!   byte of any buffer is touched.
//! - RD-6: an access holds an [`AccessGuard`]. Once a buffer is revoked no new
//!   guard is handed out, running accesses are told to stop
//!   ([`Entry::wait_revoked`]), and [`Entry::revoke_and_wait`] returns only
//!   when the last guard is gone. The region (and so the memory) lives as
//!   long as the entry, which every guard holds.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::error::{Side, check_range};
use crate::handle::{AccessKey, ManagerId};
use crate::ibverbs::Registration;
use crate::region::Region;
use crate::tcp::wire::Status;

/// One registered buffer.
pub(crate) struct Entry {
    pub(crate) id: u64,
    pub(crate) key: AccessKey,
    pub(crate) region: Region,
    /// The ibverbs memory registration, dropped (deregistered) on revoke.
    pub(crate) ibverbs: Mutex<Option<Registration>>,
    gate: Mutex<Gate>,
    /// Woken when the last access ends after a revoke.
    idle: Notify,
    /// Woken when the entry is revoked, so that running accesses stop.
    revoked: Notify,
}

#[derive(Default)]
struct Gate {
    revoked: bool,
    active: usize,
}

/// Proof that an access to an entry's memory is running; the entry cannot
/// finish revoking while one exists.
pub(crate) struct AccessGuard {
    pub(crate) entry: Arc<Entry>,
}

impl Drop for AccessGuard {
    fn drop(&mut self) {
        let mut gate = self.entry.gate.lock();
        gate.active -= 1;
        if gate.revoked && gate.active == 0 {
            self.entry.idle.notify_waiters();
        }
    }
}

impl Entry {
    fn enter(self: &Arc<Self>) -> Option<AccessGuard> {
        let mut gate = self.gate.lock();
        if gate.revoked {
            return None;
        }
        gate.active += 1;
        Some(AccessGuard {
            entry: Arc::clone(self),
        })
    }

    /// Stops new accesses, tells running ones to stop, and deregisters the
    /// memory from the device.
    pub(crate) fn revoke(&self) {
        self.gate.lock().revoked = true;
        self.revoked.notify_waiters();
        // Dropping the registration deregisters it: the device refuses
        // further remote access with this rkey.
        let registration = self.ibverbs.lock().take();
        #[cfg_attr(not(feature = "ibverbs"), allow(clippy::drop_non_drop))]
        drop(registration);
    }

    /// Resolves once the entry is revoked. An access that may block on a
    /// peer (a socket copy) races against this and gives up when it
    /// resolves, so a stalled peer cannot hold up a deregistration.
    pub(crate) async fn wait_revoked(&self) {
        loop {
            // Registered before the check, so a revoke in between still wakes it.
            let revoked = self.revoked.notified();
            if self.gate.lock().revoked {
                return;
            }
            revoked.await;
        }
    }

    /// Revokes, then waits until no access is running.
    pub(crate) async fn revoke_and_wait(&self) {
        self.revoke();
        loop {
            let idle = self.idle.notified();
            if self.gate.lock().active == 0 {
                return;
            }
            idle.await;
        }
    }

    #[cfg(test)]
    pub(crate) fn active_accesses(&self) -> usize {
        self.gate.lock().active
    }
}

/// A request's view of a buffer: which one, with what key, which range.
pub(crate) struct AccessRequest<'a> {
    pub(crate) owner: ManagerId,
    pub(crate) buffer: u64,
    pub(crate) key: &'a [u8; 16],
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// The buffers of one manager.
pub(crate) struct Registry {
    owner: ManagerId,
    next_id: AtomicU64,
    entries: RwLock<HashMap<u64, Arc<Entry>>>,
}

impl Registry {
    pub(crate) fn new(owner: ManagerId) -> Registry {
        Registry {
            owner,
            next_id: AtomicU64::new(1),
            entries: RwLock::new(HashMap::new()),
        }
    }

    #[cfg(test)]
    pub(crate) fn owner(&self) -> ManagerId {
        self.owner
    }

    pub(crate) fn insert(
        &self,
        key: AccessKey,
        region: Region,
        ibverbs: Option<Registration>,
    ) -> Arc<Entry> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(Entry {
            id,
            key,
            region,
            ibverbs: Mutex::new(ibverbs),
            gate: Mutex::new(Gate::default()),
            idle: Notify::new(),
            revoked: Notify::new(),
        });
        self.entries.write().insert(id, Arc::clone(&entry));
        entry
    }

    /// Removes a buffer; later requests for it get `Deregistered`.
    pub(crate) fn remove(&self, id: u64) -> Option<Arc<Entry>> {
        self.entries.write().remove(&id)
    }

    /// Looks up an entry without any access check (for the owner's own buffers).
    pub(crate) fn get(&self, id: u64) -> Option<Arc<Entry>> {
        self.entries.read().get(&id).cloned()
    }

    /// Runs every check of RD-2 and, if all pass, starts an access.
    /// On failure: the status, and the value the response carries with it.
    pub(crate) fn access(&self, req: &AccessRequest<'_>) -> Result<AccessGuard, (Status, u64)> {
        if req.owner != self.owner {
            return Err((Status::StaleOwner, 0));
        }
        let Some(entry) = self.get(req.buffer) else {
            // Ids are handed out in order and never reused, so an id below
            // the next one was registered once and has been deregistered.
            let issued = req.buffer >= 1 && req.buffer < self.next_id.load(Ordering::Relaxed);
            let status = if issued {
                Status::Deregistered
            } else {
                Status::UnknownBuffer
            };
            return Err((status, 0));
        };
        if !entry.key.matches(req.key) {
            return Err((Status::WrongKey, 0));
        }
        let len = entry.region.len() as u64;
        if check_range(Side::Remote, req.offset, req.len, len).is_err() {
            return Err((Status::OutOfRange, len));
        }
        entry.enter().ok_or((Status::Deregistered, 0))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request<'a>(registry: &Registry, entry: &Entry, key: &'a [u8; 16]) -> AccessRequest<'a> {
        AccessRequest {
            owner: registry.owner(),
            buffer: entry.id,
            key,
            offset: 0,
            len: 8,
        }
    }

    #[test]
    fn rd2_every_check_has_its_own_status() {
        let registry = Registry::new(ManagerId([1; 16]));
        let key = AccessKey::random().unwrap();
        let entry = registry.insert(key, Region::new(16).unwrap(), None);
        let good = request(&registry, &entry, &key.0);
        assert!(registry.access(&good).is_ok());

        let stale = AccessRequest {
            owner: ManagerId([2; 16]),
            ..request(&registry, &entry, &key.0)
        };
        assert_eq!(registry.access(&stale).err(), Some((Status::StaleOwner, 0)));
        let unknown = AccessRequest {
            buffer: 99,
            ..request(&registry, &entry, &key.0)
        };
        assert_eq!(
            registry.access(&unknown).err(),
            Some((Status::UnknownBuffer, 0))
        );
        let wrong = [0u8; 16];
        assert_eq!(
            registry.access(&request(&registry, &entry, &wrong)).err(),
            Some((Status::WrongKey, 0))
        );
        let past_end = AccessRequest {
            offset: 9,
            ..request(&registry, &entry, &key.0)
        };
        assert_eq!(
            registry.access(&past_end).err(),
            Some((Status::OutOfRange, 16))
        );

        registry.remove(entry.id);
        assert_eq!(
            registry.access(&request(&registry, &entry, &key.0)).err(),
            Some((Status::Deregistered, 0))
        );
    }

    #[tokio::test]
    async fn rd6_revoke_waits_for_running_accesses_and_refuses_new_ones() {
        let registry = Registry::new(ManagerId([1; 16]));
        let key = AccessKey::random().unwrap();
        let entry = registry.insert(key, Region::new(16).unwrap(), None);
        let guard = registry
            .access(&request(&registry, &entry, &key.0))
            .unwrap();
        assert_eq!(entry.active_accesses(), 1);

        let waiter = {
            let entry = Arc::clone(&entry);
            tokio::spawn(async move { entry.revoke_and_wait().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "revoke returned while an access ran");
        // Revoked but still in the table: new accesses are refused.
        assert_eq!(
            registry.access(&request(&registry, &entry, &key.0)).err(),
            Some((Status::Deregistered, 0))
        );
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("revoke did not finish after the last access")
            .unwrap();
    }
}
