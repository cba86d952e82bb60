//! Heads of queues read from cold pages are brought into memory off the shard
//! (`docs/ARCHITECTURE.md` §5): before a SUB batch (or a single SUB) reads its heads' bodies from
//! the mapping, the journal is asked which of those records have pages not in memory (one mincore
//! each, none for the segment being appended to), and a thread of the store reads those pages
//! while the shard serves other work. The heads are then read without a disk wait on the shard.

use std::collections::HashMap;
use std::thread::JoinHandle;

use smp_journal::{Location, Prefetch};

use super::{group_of, Data, JournalStore};

/// Prefetch jobs waiting for the thread at most; a batch that finds the queue full waits.
pub(super) const PREFETCH_QUEUE: usize = 64;

type Job = (Prefetch, flume::Sender<()>);

/// The store's prefetch thread.
pub(super) struct Prefetcher {
    tx: Option<flume::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Prefetcher {
    pub(super) fn start() -> Prefetcher {
        let (tx, rx) = flume::bounded::<Job>(PREFETCH_QUEUE);
        let thread = std::thread::Builder::new()
            .name("journal-prefetch".into())
            .spawn(move || {
                while let Ok((p, done)) = rx.recv() {
                    p.run();
                    let _ = done.send(());
                }
            })
            .ok();
        Prefetcher {
            tx: thread.as_ref().map(|_| tx),
            thread,
        }
    }

    /// Runs `p` on the thread and waits for it (at once when there is nothing to read, or no
    /// thread: the shard then reads the pages itself).
    async fn run(&self, p: Prefetch) {
        let Some(tx) = self.tx.as_ref().filter(|_| !p.is_empty()) else {
            return;
        };
        let (done_tx, done_rx) = flume::bounded(1);
        if tx.send_async((p, done_tx)).await.is_ok() {
            let _ = done_rx.recv_async().await;
        }
    }

    pub(super) fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Data {
    /// The head records of `rids` whose pages are not all in memory.
    fn cold_heads(&self, rids: &[&[u8]]) -> Prefetch {
        let mut by_group: HashMap<u32, Vec<(Location, u64)>> = HashMap::new();
        for rid in rids {
            let Some(m) = self.queues.get(*rid).and_then(|q| q.msgs.front()) else {
                continue;
            };
            if !m.is_quota() {
                by_group
                    .entry(group_of(rid))
                    .or_default()
                    .push((m.loc, u64::from(m.len)));
            }
        }
        let mut all = Prefetch::default();
        for (g, records) in by_group {
            if let Some(j) = self.journals.get(&g) {
                all.append(j.prefetch(&records));
            }
        }
        all
    }
}

impl JournalStore {
    /// Brings the pages of the heads of `rids` into memory off the shard, if any are cold.
    pub(super) async fn warm_heads(&self, rids: &[&[u8]]) {
        let p = self.data.borrow().cold_heads(rids);
        if p.is_empty() {
            return;
        }
        self.data.borrow_mut().prefetched += p.len() as u64;
        self.prefetcher.run(p).await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{all, settings, temp};
    use super::super::Durability;
    use super::*;
    use crate::store::memory::tests::rec;
    use crate::store::{Message, MessageStore, QueueStore, ShardStore, StoreSettings};
    use futures_lite::future::block_on;
    use std::rc::Rc;

    /// Heads whose pages the kernel dropped are read into memory by the prefetch thread before
    /// a SUB batch reads them, and the batch gets them right.
    #[test]
    fn cold_heads_are_prefetched_before_a_batch_reads_them() {
        let dir = temp("prefetch");
        let s = StoreSettings {
            durability: Durability::Never,
            ..settings(&dir)
        };
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        // Queues of eight groups, so that each head is in its group's first segment.
        let mut groups = std::collections::HashSet::new();
        let rids: Vec<Vec<u8>> = (1..=255u8)
            .map(|x| vec![x; 24])
            .filter(|r| groups.insert(group_of(r)))
            .take(8)
            .collect();
        let body = |q: usize, i: u8| vec![q as u8 ^ i; 16_000];
        for (q, rid) in rids.iter().enumerate() {
            block_on(st.create(rec(rid))).unwrap();
            // 320 KB: the group's 256 KiB first segment fills, so the head is not in the
            // segment being appended to.
            for i in 0..20u8 {
                let mut id = [0u8; 24];
                id[0] = i;
                let m = Message::Message {
                    msg_id: id,
                    ts: 1,
                    notification: false,
                    body: Rc::from(&body(q, i)[..]),
                };
                block_on(st.write(rid, m, 100)).unwrap();
            }
        }
        let ids: Vec<&[u8]> = rids.iter().map(|r| &r[..]).collect();
        {
            let d = st.data.borrow();
            for j in d.journals.values() {
                j.sync_handle().sync_all().unwrap();
                for seg in j.segment_sizes().filter(|s| !s.active) {
                    j.evict(seg.id).unwrap();
                }
            }
            assert_eq!(d.cold_heads(&ids).len(), rids.len(), "every head is cold");
        }
        let heads = block_on(st.peek_first_many(&ids)).unwrap();
        for (q, h) in heads.into_iter().enumerate() {
            match h {
                Some(Message::Message { body: b, .. }) => assert_eq!(&b[..], &body(q, 0)[..]),
                other => panic!("head of queue {q}: {other:?}"),
            }
        }
        let d = st.data.borrow();
        assert_eq!(d.prefetched, rids.len() as u64, "read off the shard first");
        assert!(d.cold_heads(&ids).is_empty(), "and in memory now");
    }
}
