//! Memory regions: the bytes a buffer exposes.
//!
//! A [`Region`] is a span of host memory that stays at one address for as
//! long as any clone of the region lives. It is either
//!
//! - **owned**: allocated by this crate ([`Region::new`]), zeroed and aligned
//!   to [`REGION_ALIGN`] bytes, freed when the last clone is dropped; or
//! - **external**: memory someone else owns (a tensor's storage), wrapped
//!   with [`Region::from_raw_parts`] together with a keep-alive value that is
//!   dropped only when the last clone of the region is.
//!
//! Transfers read and write a region's memory from other tasks and, with
//! ibverbs, from the network card, exactly like RDMA hardware does: while a
//! transfer that touches some bytes runs, the program must not read or write
//! those bytes itself (through [`Region::read`], [`Region::write`] or any
//! other alias). Doing so is a data race; the bytes may be torn. The crate
//! cannot check this, as RDMA verbs cannot.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{RdmaError, Side, check_range};

/// Alignment of regions allocated by [`Region::new`]: a cache line, and
/// enough for any element type a tensor might hold.
pub const REGION_ALIGN: usize = 64;

/// A span of host memory that transfers can read and write.
///
/// Cloning is cheap and shares the memory.
#[derive(Clone)]
pub struct Region {
    inner: Arc<RegionInner>,
}

struct RegionInner {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
}

enum Owner {
    /// Allocated here with this layout (none for a zero-length region).
    Crate(Option<Layout>),
    /// Kept alive by someone else's value.
    External(#[allow(dead_code)] Arc<dyn Any + Send + Sync>),
}

// SAFETY: the region is a span of plain bytes whose owner (this crate, or the
// keep-alive value, which is itself Send + Sync) outlives every clone. Access
// to the bytes goes through raw pointers and copies; the data-race contract
// is documented on the type and on `from_raw_parts`.
unsafe impl Send for RegionInner {}
// SAFETY: as above.
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if let Owner::Crate(Some(layout)) = self.owner {
            // SAFETY: `ptr` came from `alloc_zeroed` with this layout and is
            // freed exactly once, when the last clone goes.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl Region {
    /// Allocates `len` zeroed bytes, aligned to [`REGION_ALIGN`].
    pub fn new(len: usize) -> Result<Region, RdmaError> {
        if len == 0 {
            return Ok(Region {
                inner: Arc::new(RegionInner {
                    ptr: NonNull::<[u8; REGION_ALIGN]>::dangling().cast(),
                    len: 0,
                    owner: Owner::Crate(None),
                }),
            });
        }
        let layout =
            Layout::from_size_align(len, REGION_ALIGN).map_err(|_| RdmaError::Alloc(len))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(RdmaError::Alloc(len))?;
        Ok(Region {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                owner: Owner::Crate(Some(layout)),
            }),
        })
    }

    /// Wraps memory owned by someone else, such as a tensor's storage.
    ///
    /// `keep_alive` is held until the last clone of the region (and so every
    /// registration and every transfer using it) is gone; dropping it must be
    /// what eventually allows the memory to be freed.
    ///
    /// # Safety
    ///
    /// - `ptr` is valid for reads and writes of `len` bytes, and stays valid,
    ///   at the same address, until `keep_alive` is dropped: the owner must
    ///   not free, move or reallocate the memory while the region lives.
    /// - Nobody else accesses bytes that a transfer is touching while it runs
    ///   (the same rule as for RDMA hardware; see the module documentation).
    /// - A null `ptr` is allowed only with `len == 0`.
    pub unsafe fn from_raw_parts(
        ptr: *mut u8,
        len: usize,
        keep_alive: Arc<dyn Any + Send + Sync>,
    ) -> Region {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        Region {
            inner: Arc::new(RegionInner {
                ptr,
                len,
                owner: Owner::External(keep_alive),
            }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The address of the first byte. Stable for the region's lifetime.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.ptr.as_ptr()
    }

    /// Whether the memory was allocated by this crate (not wrapped).
    pub fn is_owned(&self) -> bool {
        matches!(self.inner.owner, Owner::Crate(_))
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), RdmaError> {
        self.check(offset, dst.len())?;
        // SAFETY: the range is inside the region (checked), the region's
        // memory is valid while `self` lives, and `dst` is a distinct
        // allocation the caller holds exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// Copies `src` into the region starting at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), RdmaError> {
        self.check(offset, src.len())?;
        // SAFETY: as in `read`; `src` may alias the region only if the caller
        // built it from the region's pointer, which `copy` tolerates.
        unsafe {
            std::ptr::copy(src.as_ptr(), self.as_ptr().add(offset), src.len());
        }
        Ok(())
    }

    /// Copies the whole region into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len()];
        // The range is the whole region, so this cannot fail.
        let _ = self.read(0, &mut out);
        out
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), RdmaError> {
        check_range(Side::Local, offset as u64, len as u64, self.len() as u64)
    }

    /// A shared view of `offset..offset + len`.
    ///
    /// # Safety
    ///
    /// The range is inside the region, and nothing writes those bytes while
    /// the slice lives (the region's data-race contract).
    pub(crate) unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        debug_assert!(offset + len <= self.len());
        // SAFETY: the caller guarantees the range and the absence of writers.
        unsafe { std::slice::from_raw_parts(self.as_ptr().add(offset), len) }
    }

    /// An exclusive view of `offset..offset + len`.
    ///
    /// # Safety
    ///
    /// The range is inside the region, and nothing else reads or writes those
    /// bytes while the slice lives (the region's data-race contract; the
    /// crate hands each chunk of a transfer to one task only).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        debug_assert!(offset + len <= self.len());
        // SAFETY: the caller guarantees the range and exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().add(offset), len) }
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.inner.ptr)
            .field("len", &self.inner.len)
            .field("owned", &self.is_owned())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn owned_regions_are_zeroed_and_aligned() {
        let region = Region::new(1000).unwrap();
        assert_eq!(region.len(), 1000);
        assert_eq!(region.as_ptr() as usize % REGION_ALIGN, 0);
        assert!(region.to_vec().iter().all(|&b| b == 0));
        assert!(Region::new(0).unwrap().is_empty());
    }

    #[test]
    fn reads_and_writes_are_bounds_checked() {
        let region = Region::new(16).unwrap();
        region.write(4, b"hello").unwrap();
        let mut out = [0u8; 5];
        region.read(4, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(matches!(
            region.write(12, b"hello"),
            Err(RdmaError::OutOfRange { buffer_len: 16, .. })
        ));
        assert!(region.read(17, &mut []).is_err());
        assert!(region.read(16, &mut []).is_ok());
    }

    #[test]
    fn external_memory_is_kept_alive_until_the_last_clone_drops() {
        struct Storage {
            bytes: Box<[u8]>,
            dropped: Arc<AtomicBool>,
        }
        impl Drop for Storage {
            fn drop(&mut self) {
                self.dropped.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let mut storage = Storage {
            bytes: vec![7u8; 32].into_boxed_slice(),
            dropped: dropped.clone(),
        };
        let ptr = storage.bytes.as_mut_ptr();
        let keep_alive: Arc<dyn Any + Send + Sync> = Arc::new(storage);
        // SAFETY: the boxed slice does not move while `keep_alive` holds it.
        let region = unsafe { Region::from_raw_parts(ptr, 32, keep_alive) };
        let clone = region.clone();
        drop(region);
        assert!(!dropped.load(Ordering::SeqCst));
        assert_eq!(clone.to_vec(), vec![7u8; 32]);
        assert!(!clone.is_owned());
        drop(clone);
        assert!(dropped.load(Ordering::SeqCst));
    }
}
