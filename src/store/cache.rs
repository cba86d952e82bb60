//! Decoded queue records of the queues in use (`docs/ARCHITECTURE.md` §5, memory per queue): the
//! journal store reads records from its mapping and the memory store keeps them packed
//! (`codec.rs`), and both keep the records of the queues used lately decoded here, so that a busy
//! queue is not decoded again for every command.

use std::collections::HashMap;
use std::rc::Rc;

use super::id::IdKey;
use super::QueueRec;

/// Decoded records of the queues used lately (`limits::RECORD_CACHE`): two generations,
/// the current one and the one before it; a record found in the older one moves to the current
/// one, and when the current one is full the older one is dropped and the current one takes its
/// place. So a queue used within the last half of the bound's worth of distinct queues is never
/// read again, lookups and evictions cost O(1), and the cache never holds more than the bound.
/// Every change of a queue's record forgets it here first.
#[derive(Debug)]
pub struct RecordCache {
    current: HashMap<IdKey, Rc<QueueRec>, foldhash::fast::RandomState>,
    older: HashMap<IdKey, Rc<QueueRec>, foldhash::fast::RandomState>,
    generation: usize,
}

impl Default for RecordCache {
    fn default() -> Self {
        RecordCache::with_bound(crate::limits::RECORD_CACHE)
    }
}

impl RecordCache {
    pub fn with_bound(bound: usize) -> Self {
        RecordCache {
            current: HashMap::default(),
            older: HashMap::default(),
            generation: (bound / 2).max(1),
        }
    }

    pub fn get(&mut self, rid: &[u8]) -> Option<Rc<QueueRec>> {
        if let Some(r) = self.current.get(rid) {
            return Some(r.clone());
        }
        let (k, r) = self.older.remove_entry(rid)?;
        self.insert(k, r.clone());
        Some(r)
    }

    pub fn put(&mut self, rid: &[u8], rec: Rc<QueueRec>) {
        self.older.remove(rid);
        self.insert(IdKey::new(rid), rec);
    }

    fn insert(&mut self, k: IdKey, rec: Rc<QueueRec>) {
        if self.current.len() >= self.generation {
            self.older = std::mem::take(&mut self.current);
        }
        self.current.insert(k, rec);
    }

    pub fn forget(&mut self, rid: &[u8]) {
        self.current.remove(rid);
        self.older.remove(rid);
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.current.len() + self.older.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::tests::rec;
    use std::rc::Rc;

    #[test]
    fn the_record_cache_keeps_what_is_used_within_its_bound_and_forgets_changed_records() {
        let mut c = RecordCache::with_bound(8);
        let id = |i: u32| i.to_be_bytes().to_vec();
        for i in 0..4 {
            c.put(&id(i), Rc::new(rec(&id(i))));
        }
        // Queue 0 is used again and again while 100 others pass through once each: it stays,
        // and the cache never holds more than its bound.
        for i in 4..104 {
            assert!(c.get(&id(0)).is_some(), "queue 0 evicted at {i}");
            c.put(&id(i), Rc::new(rec(&id(i))));
            assert!(c.held() <= 8, "{} records held", c.held());
        }
        assert!(c.get(&id(1)).is_none(), "an unused record was kept");
        let r = c.get(&id(0)).unwrap();
        assert_eq!(r.recipient_id, id(0));
        // A changed record is forgotten, not served stale.
        c.forget(&id(0));
        assert!(c.get(&id(0)).is_none());
    }
}
