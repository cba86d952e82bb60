//! The ID directory (`docs/ARCHITECTURE.md` §1): sender, link and notifier IDs → recipient ID,
//! shared by all shards. Reads are lock-free; only a queue's owner writes its IDs,
//! insert-if-absent, so two queues can never share an ID however the shards interleave.

mod table;

pub use table::Batch;

use std::sync::Arc;

use crate::store::EntityId;

/// Its tables hold an entry for every queue (and one more per link and notifier), so entries sit
/// inline in the table (`directory/table.rs`), and IDs hash with foldhash's seeded quality
/// hasher: a start fills them with every queue, and a client may choose some IDs (link IDs, the
/// corrId a short link's sender ID is derived from) but not the process's random seed.
type Map = table::IdTable;

#[derive(Default)]
pub struct Directory {
    senders: Map,
    links: Map,
    notifiers: Map,
    /// Open service connections, by shard and number. A connection leaves it before its owners
    /// are told it closed, so an owner that finds a connection here when it makes it a service's
    /// subscriber will be told of its close afterwards: no closed connection stays a subscriber
    /// (the messages that make it one travel by other shards than its close does).
    live_services: papaya::HashSet<(usize, u64)>,
}

/// Which ID space an entity ID is looked up in (the party of the command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSpace {
    Sender,
    Link,
    Notifier,
}

impl Directory {
    pub fn new() -> Arc<Self> {
        Arc::new(Directory::default())
    }

    fn map(&self, space: IdSpace) -> &Map {
        match space {
            IdSpace::Sender => &self.senders,
            IdSpace::Link => &self.links,
            IdSpace::Notifier => &self.notifiers,
        }
    }

    pub fn lookup(&self, space: IdSpace, id: &[u8]) -> Option<EntityId> {
        self.map(space).get(id)
    }

    /// Inserts `id → recipient_id` unless `id` is taken; true if inserted.
    pub fn insert(&self, space: IdSpace, id: &[u8], recipient_id: &[u8]) -> bool {
        self.map(space).insert(id, recipient_id)
    }

    /// Removes `id` if it still maps to `recipient_id` (an owner only ever removes its own IDs).
    pub fn remove(&self, space: IdSpace, id: &[u8], recipient_id: &[u8]) {
        self.map(space).remove_if(id, recipient_id);
    }

    pub fn service_conn_opened(&self, shard: usize, conn: u64) {
        self.live_services.pin().insert((shard, conn));
    }

    pub fn service_conn_closed(&self, shard: usize, conn: u64) {
        self.live_services.pin().remove(&(shard, conn));
    }

    pub fn is_live_service(&self, shard: usize, conn: u64) -> bool {
        self.live_services.pin().contains(&(shard, conn))
    }

    /// Makes room for `n` IDs of `space` in all at once, instead of growing step by step (each
    /// shard's start asks for the total it expects; asking again costs nothing).
    pub fn reserve(&self, space: IdSpace, n: usize) {
        self.map(space).reserve(n);
    }

    /// Inserts gathered a partition at a time (a start's fill; `table::Batch`): insert-if-absent
    /// as [`Directory::insert`], done at the latest when the batch is dropped.
    pub fn batch(&self, space: IdSpace) -> Batch<'_> {
        self.map(space).batch()
    }

    pub fn len(&self, space: IdSpace) -> usize {
        self.map(space).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_is_insert_if_absent_and_remove_checks_the_owner() {
        let d = Directory::new();
        assert!(d.insert(IdSpace::Sender, b"s1", b"r1"));
        assert!(!d.insert(IdSpace::Sender, b"s1", b"r2"));
        assert_eq!(d.lookup(IdSpace::Sender, b"s1"), Some(b"r1".to_vec()));
        // Spaces are separate.
        assert!(d.insert(IdSpace::Link, b"s1", b"r2"));
        d.remove(IdSpace::Sender, b"s1", b"r2");
        assert_eq!(d.lookup(IdSpace::Sender, b"s1"), Some(b"r1".to_vec()));
        d.remove(IdSpace::Sender, b"s1", b"r1");
        assert_eq!(d.lookup(IdSpace::Sender, b"s1"), None);
    }
}
