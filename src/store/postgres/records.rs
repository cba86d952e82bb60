//! The queue records one PostgreSQL shard holds (`docs/ARCHITECTURE.md` §5, "PostgreSQL: records
//! read when used"): those of the queues a job is working on (pinned by `prepare` until `release`),
//! those the owner says to keep (its subscribed queues), and up to a bound of others, the least
//! recently used of which go first. The database holds every record; nothing is read at start.

use std::collections::{HashMap, VecDeque};

use crate::store::id::IdKey;
use crate::store::QueueRec;

#[derive(Debug)]
struct Entry {
    rec: QueueRec,
    /// Jobs working on the queue (`prepare` without its `release` yet).
    pins: u32,
    /// When it was last used: the one of its places in `order` that counts.
    stamp: u64,
}

/// A bounded set of queue records with least-recently-used eviction.
///
/// `order` lists the records from the least to the most recently used, each with the stamp it had
/// when listed; a use lists it again with a new stamp, and the older listing becomes stale (its
/// stamp is no longer the entry's). Eviction takes listings from the front: a stale one is
/// dropped, a pinned or kept one is listed again at the back, any other is evicted. Stale listings
/// are compacted away when they outnumber the records, so `order` stays within twice the records
/// (plus a constant) and every operation costs O(1) amortized.
#[derive(Debug)]
pub struct Records {
    map: HashMap<IdKey, Entry, foldhash::fast::RandomState>,
    /// Pins of queues that have no record (yet, or any more): a job prepared a queue that its NEW
    /// then creates, or its DEL deleted; the record created takes them, `unpin` ends them.
    absent: HashMap<IdKey, u32, foldhash::fast::RandomState>,
    order: VecDeque<(IdKey, u64)>,
    next_stamp: u64,
    /// Records held beyond those pinned or kept.
    bound: usize,
}

impl Records {
    pub fn new(bound: usize) -> Self {
        Records {
            map: HashMap::default(),
            absent: HashMap::default(),
            order: VecDeque::new(),
            next_stamp: 0,
            bound: bound.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn get(&self, rid: &[u8]) -> Option<&QueueRec> {
        self.map.get(rid).map(|e| &e.rec)
    }

    pub fn get_mut(&mut self, rid: &[u8]) -> Option<&mut QueueRec> {
        self.map.get_mut(rid).map(|e| &mut e.rec)
    }

    pub fn contains(&self, rid: &[u8]) -> bool {
        self.map.contains_key(rid)
    }

    /// Pins a held record for a job (and marks it used); false if it is not held.
    pub fn pin(&mut self, rid: &[u8]) -> bool {
        let stamp = self.stamp();
        let Some(k) = self.map.get_key_value(rid).map(|(k, _)| k.clone()) else {
            return false;
        };
        let e = self.map.get_mut(&k).expect("found above");
        e.pins += 1;
        e.stamp = stamp;
        self.order.push_back((k, stamp));
        self.compact();
        true
    }

    /// Pins a queue that has no record, for a job that may create it.
    pub fn pin_absent(&mut self, rid: &[u8]) {
        *self.absent.entry(IdKey::new(rid)).or_default() += 1;
    }

    /// Ends a job's pin.
    pub fn unpin(&mut self, rid: &[u8]) {
        if let Some(e) = self.map.get_mut(rid) {
            debug_assert!(e.pins > 0, "release without prepare");
            e.pins = e.pins.saturating_sub(1);
        } else if let Some(n) = self.absent.get_mut(rid) {
            *n -= 1;
            if *n == 0 {
                self.absent.remove(rid);
            }
        } else {
            debug_assert!(false, "release without prepare");
        }
    }

    /// Holds `rec` as the most recently used (a record read for a job, or one just created). A
    /// record already held is replaced and keeps its pins; one created takes the pins its queue
    /// had while absent.
    pub fn insert(&mut self, rec: QueueRec) {
        let stamp = self.stamp();
        let k = IdKey::new(&rec.recipient_id);
        let pins = self.map.get(k.as_slice()).map_or(0, |e| e.pins)
            + self.absent.remove(k.as_slice()).unwrap_or(0);
        self.order.push_back((k.clone(), stamp));
        self.map.insert(k, Entry { rec, pins, stamp });
        self.compact();
    }

    /// Lets go of a deleted queue's record; its pins wait for their `unpin`s.
    pub fn remove(&mut self, rid: &[u8]) -> Option<QueueRec> {
        let (k, e) = self.map.remove_entry(rid)?;
        if e.pins > 0 {
            self.absent.insert(k, e.pins);
        }
        Some(e.rec)
    }

    /// Evicts the least recently used records until at most `bound` are held, skipping the pinned
    /// ones and those `keep` names (they are listed again as used). Returns how many went. When
    /// every record is pinned or kept, more than `bound` stay: they are in use.
    pub fn evict(&mut self, keep: &dyn Fn(&[u8]) -> bool) -> usize {
        let mut evicted = 0;
        // Each held record is looked at once at most, so that a cache full of kept records ends
        // the pass instead of cycling.
        let mut looks = self.map.len();
        while self.map.len() > self.bound && looks > 0 {
            let Some((k, stamp)) = self.order.pop_front() else {
                break;
            };
            let Some(e) = self.map.get_mut(k.as_slice()) else {
                continue;
            };
            if e.stamp != stamp {
                continue;
            }
            looks -= 1;
            if e.pins > 0 || keep(k.as_slice()) {
                self.next_stamp += 1;
                e.stamp = self.next_stamp;
                self.order.push_back((k, self.next_stamp));
            } else {
                self.map.remove(k.as_slice());
                evicted += 1;
            }
        }
        evicted
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Drops the stale listings once they outnumber the records, keeping the order of the rest.
    fn compact(&mut self) {
        if self.order.len() <= 2 * self.map.len() + 1024 {
            return;
        }
        let map = &self.map;
        self.order
            .retain(|(k, stamp)| map.get(k.as_slice()).is_some_and(|e| e.stamp == *stamp));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u32) -> QueueRec {
        crate::store::memory::tests::rec(&rid(i))
    }

    fn rid(i: u32) -> Vec<u8> {
        format!("rid-{i:08}").into_bytes()
    }

    #[test]
    fn evicts_the_least_recently_used_first() {
        let mut r = Records::new(3);
        for i in 0..3 {
            r.insert(rec(i));
        }
        // 0 used again: 1 is now the least recently used.
        assert!(r.pin(&rid(0)));
        r.unpin(&rid(0));
        r.insert(rec(3));
        assert_eq!(r.evict(&|_| false), 1);
        assert!(!r.contains(&rid(1)), "the least recently used went");
        for i in [0, 2, 3] {
            assert!(r.contains(&rid(i)), "{i} stays");
        }
    }

    #[test]
    fn never_evicts_a_pinned_or_kept_record() {
        let mut r = Records::new(2);
        r.insert(rec(0));
        assert!(r.pin(&rid(0)));
        r.insert(rec(1));
        for i in 2..100 {
            r.insert(rec(i));
            r.evict(&|k| k == rid(1).as_slice());
            assert!(r.contains(&rid(0)), "pinned, after {i}");
            assert!(r.contains(&rid(1)), "kept, after {i}");
            assert!(r.len() <= 3, "the bound beyond the pinned one: {}", r.len());
        }
        r.unpin(&rid(0));
        r.insert(rec(100));
        r.insert(rec(101));
        r.evict(&|_| false);
        assert_eq!(r.len(), 2);
        assert!(!r.contains(&rid(0)), "unpinned, it can go");
        assert!(r.contains(&rid(101)), "the most recently used stays");
    }

    #[test]
    fn a_cache_of_kept_records_ends_its_pass() {
        let mut r = Records::new(4);
        for i in 0..50 {
            r.insert(rec(i));
        }
        assert_eq!(r.evict(&|_| true), 0);
        assert_eq!(r.len(), 50, "all kept: all stay");
        assert_eq!(
            r.evict(&|k| k > rid(9).as_slice()),
            10,
            "the ten not kept go"
        );
    }

    #[test]
    fn pins_of_a_queue_without_a_record_pass_to_the_record_created_and_back() {
        let mut r = Records::new(1);
        r.pin_absent(&rid(0));
        r.insert(rec(0));
        r.insert(rec(1));
        r.evict(&|_| false);
        assert!(
            r.contains(&rid(0)),
            "created in a job: pinned until its release"
        );
        assert!(r.remove(&rid(0)).is_some());
        r.unpin(&rid(0));
        assert!(r.absent.is_empty(), "the deleted queue's pin ended");
        r.pin_absent(&rid(5));
        r.unpin(&rid(5));
        assert!(r.absent.is_empty());
    }

    #[test]
    fn stale_listings_are_compacted() {
        let mut r = Records::new(10);
        for i in 0..10 {
            r.insert(rec(i));
        }
        for _ in 0..100_000 {
            assert!(r.pin(&rid(3)));
            r.unpin(&rid(3));
        }
        assert!(r.order.len() <= 2 * r.len() + 1025, "{}", r.order.len());
        r.insert(rec(10));
        assert_eq!(r.evict(&|_| false), 1);
        assert!(!r.contains(&rid(0)));
        assert!(r.contains(&rid(3)));
    }
}
