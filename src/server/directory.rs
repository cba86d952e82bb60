//! The ID directory (`docs/ARCHITECTURE.md` §1): sender, link and notifier IDs → recipient ID,
//! shared by all shards. Reads are lock-free; only a queue's owner writes its IDs,
//! insert-if-absent, so two queues can never share an ID however the shards interleave.
//!
//! On a store that keeps every queue's IDs itself behind unique indexes (PostgreSQL) the
//! directory is a bounded cache in front of it ([`Directory::cache`]): an ID it does not hold is
//! looked up in the store ([`IdSource`], one statement for many IDs), and the store's unique
//! indexes decide whether an ID is taken.

mod table;

pub use table::Batch;

use std::sync::Arc;

use crate::store::EntityId;
pub use crate::store::{IdSource, IdSpace};

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
    /// Set on a cache: where the IDs it does not hold are.
    source: Option<Arc<dyn IdSource>>,
    /// Open service connections, by shard and number. A connection leaves it before its owners
    /// are told it closed, so an owner that finds a connection here when it makes it a service's
    /// subscriber will be told of its close afterwards: no closed connection stays a subscriber
    /// (the messages that make it one travel by other shards than its close does).
    live_services: papaya::HashSet<(usize, u64)>,
}

impl Directory {
    pub fn new() -> Arc<Self> {
        Arc::new(Directory::default())
    }

    /// A cache of at most about `limit` IDs of each space in front of `source`.
    pub fn cache(limit: usize, source: Arc<dyn IdSource>) -> Arc<Self> {
        Arc::new(Directory {
            senders: Map::bounded(limit),
            links: Map::bounded(limit),
            notifiers: Map::bounded(limit),
            source: Some(source),
            live_services: Default::default(),
        })
    }

    /// Whether this is a cache: a miss does not mean that no queue has the ID.
    pub fn is_cache(&self) -> bool {
        self.source.is_some()
    }

    /// Looks up in the source the IDs of `space` among `ids` that the cache does not hold, and
    /// caches what it finds. Without a source, nothing to do.
    pub async fn fetch(&self, space: IdSpace, ids: Vec<EntityId>) -> Result<(), String> {
        let Some(source) = &self.source else {
            return Ok(());
        };
        let missing: Vec<EntityId> = ids
            .into_iter()
            .filter(|id| self.lookup(space, id).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let found = source
            .find(space, missing)
            .recv_async()
            .await
            .map_err(|_| "the ID look-up was dropped".to_string())??;
        for (id, rid) in found {
            // Insert-if-absent: an owner's newer entry for the ID stays (`insert`).
            self.insert(space, &id, &rid);
        }
        Ok(())
    }

    /// As `lookup`, asking the source on a miss (paths that may wait, not the connections').
    pub async fn find(&self, space: IdSpace, id: &[u8]) -> Option<EntityId> {
        if let Some(rid) = self.lookup(space, id) {
            return Some(rid);
        }
        if self.is_cache() {
            if let Err(e) = self.fetch(space, vec![id.to_vec()]).await {
                tracing::warn!(error = %e, "looking up an ID");
            }
            return self.lookup(space, id);
        }
        None
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

    /// Inserts `id → recipient_id` unless `id` is taken; true if inserted. On a cache, taken in
    /// the cache only: the store's unique indexes have the last word (an owner that finds its
    /// insert refused by them removes its entry again).
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

    /// The IDs of `space` held: on a cache, those cached (not every queue's).
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
