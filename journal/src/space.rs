//! Room to append when the journal cannot grow: the release reserve at the end of each segment
//! and the size cap shared by all groups (`journal/FORMAT.md`, "Space").
//!
//! A relay whose disk is full must still accept the records that let space come back (message
//! and queue deletes), or no client could ever empty it. So records carry a [`Priority`]: an
//! ordinary append fills a segment only up to its last `reserve` bytes and rotates after that;
//! when the rotation fails for lack of room, the ordinary append fails and a release append still
//! goes into the reserve of the active segment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::JournalError;

/// How an append may use a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// Up to the segment's reserve; rotates past it (growing records: messages, new queues).
    Ordinary,
    /// Up to the segment's end, the reserve included: for records that end or shrink state
    /// (deletes), which must go on when no new segment can be made.
    Release,
}

/// The default upper bound of the release reserve: 64 KiB holds about 740 message-delete records
/// (88 bytes each with a 24-byte recipient ID).
pub const DEFAULT_RELEASE_RESERVE: u64 = 64 << 10;

/// The reserve is at most one part in this many of a segment, so that small segments (a group's
/// first is 256 KiB) stay mostly for ordinary records.
pub const RESERVE_SHARE_DIVISOR: u64 = 8;

/// The release reserve of a segment of `len` bytes when the options allow `max` bytes.
pub(crate) fn reserve_of(len: u64, max: u64) -> u64 {
    max.min(len / RESERVE_SHARE_DIVISOR)
}

/// A cap on the bytes of segment files, shared by every journal opened with a clone of it (the
/// relay gives one to all groups of all shards). Each journal counts the segments it found at
/// open and those it creates, and gives back the bytes of the segments it removes and, when
/// dropped, all it counted. A new segment that would take the total over the cap is refused with
/// [`JournalError::SizeCap`], as a full disk refuses it with [`JournalError::NoSpace`]. Segments
/// found at open count even when they are over the cap: the journal opens, and only new segments
/// wait until removals bring the total under it.
#[derive(Debug, Clone)]
pub struct SpaceBudget(Arc<Budget>);

#[derive(Debug)]
struct Budget {
    cap_bytes: u64,
    used_bytes: AtomicU64,
}

impl SpaceBudget {
    /// A budget of `cap_bytes` over every journal opened with it.
    pub fn new(cap_bytes: u64) -> SpaceBudget {
        SpaceBudget(Arc::new(Budget {
            cap_bytes,
            used_bytes: AtomicU64::new(0),
        }))
    }

    pub fn cap_bytes(&self) -> u64 {
        self.0.cap_bytes
    }

    /// Bytes of the segment files counted now.
    pub fn used_bytes(&self) -> u64 {
        self.0.used_bytes.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes for a new segment, or refuses when the total would pass the cap.
    pub(crate) fn take(&self, n: u64) -> Result<(), JournalError> {
        let used = &self.0.used_bytes;
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(n);
            if next > self.0.cap_bytes {
                return Err(JournalError::SizeCap {
                    cap: self.0.cap_bytes,
                    used: cur,
                    need: n,
                });
            }
            match used.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Counts `n` bytes of files found at open or written by a compaction, over the cap or not.
    pub(crate) fn count(&self, n: u64) {
        self.0.used_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back `n` bytes of removed (or no longer counted) segments.
    pub(crate) fn give_back(&self, n: u64) {
        let used = &self.0.used_bytes;
        let mut cur = used.load(Ordering::Relaxed);
        loop {
            debug_assert!(cur >= n, "giving back {n} bytes of {cur} counted");
            match used.compare_exchange_weak(
                cur,
                cur.saturating_sub(n),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }
}

/// Two budgets are equal when they are the same budget (clones of one).
impl PartialEq for SpaceBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SpaceBudget {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_the_smaller_of_the_option_and_an_eighth() {
        assert_eq!(reserve_of(256 << 10, DEFAULT_RELEASE_RESERVE), 32 << 10);
        assert_eq!(reserve_of(64 << 20, DEFAULT_RELEASE_RESERVE), 64 << 10);
        assert_eq!(reserve_of(64 << 20, 0), 0);
    }

    #[test]
    fn a_budget_refuses_past_its_cap_and_takes_back_what_is_given() {
        let b = SpaceBudget::new(100);
        let c = b.clone();
        b.take(60).unwrap();
        match c.take(41) {
            Err(JournalError::SizeCap { cap, used, need }) => {
                assert_eq!((cap, used, need), (100, 60, 41))
            }
            other => panic!("{other:?}"),
        }
        c.take(40).unwrap();
        assert_eq!(b.used_bytes(), 100);
        b.give_back(60);
        assert_eq!(c.used_bytes(), 40);
        // Found at open: counted even over the cap.
        c.count(200);
        assert_eq!(b.used_bytes(), 240);
        assert!(b.take(1).is_err());
        assert_eq!(b, c);
        assert_ne!(b, SpaceBudget::new(100));
    }
}
