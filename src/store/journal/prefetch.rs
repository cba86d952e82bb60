//! The store's background thread. Heads of queues read from cold pages are brought into memory
//! off the shard
//! (`docs/ARCHITECTURE.md` §5): before a SUB batch (or a single SUB) reads its heads' bodies from
//! the mapping, the journal is asked which of those records have pages not in memory (one mincore
//! each, none for the segment being appended to), and a thread of the store reads those pages
//! while the shard serves other work. The heads are then read without a disk wait on the shard.
//! The same thread removes the files of dead and compacted segments and unmaps them.

use std::thread::JoinHandle;

use smp_journal::{Fs, Location, Prefetch, Retired};

use super::{Data, JournalStore, Map, Runner};
use crate::store::group_of;

/// Prefetch jobs waiting for the thread at most; a batch that finds the queue full waits.
pub(super) const PREFETCH_QUEUE: usize = 64;

/// What the store's background thread does.
pub(super) enum Job<F: Fs> {
    /// Read the pages, then say so.
    Prefetch(Prefetch<F>, flume::Sender<()>),
    /// Let go of segments the journal no longer uses: remove their files, unmap them.
    Retire(Retired<F>),
}

/// The store's prefetch thread (none when the store's work is run by hand: segments are let go
/// of through the runner, and the simulated disk has no cold pages).
pub(super) struct Prefetcher<F: Fs> {
    tx: Option<flume::Sender<Job<F>>>,
    thread: Option<JoinHandle<()>>,
}

impl<F: Fs> Prefetcher<F> {
    pub(super) fn start(runner: &Runner) -> Self {
        if runner.is_manual() {
            return Prefetcher {
                tx: None,
                thread: None,
            };
        }
        let (tx, rx) = flume::bounded::<Job<F>>(PREFETCH_QUEUE);
        let thread = std::thread::Builder::new()
            .name("journal-prefetch".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    match job {
                        Job::Prefetch(p, done) => {
                            p.run();
                            let _ = done.send(());
                        }
                        Job::Retire(r) => drop(r),
                    }
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
    async fn run(&self, p: Prefetch<F>) {
        let Some(tx) = self.tx.as_ref().filter(|_| !p.is_empty()) else {
            return;
        };
        let (done_tx, done_rx) = flume::bounded(1);
        if tx.send_async(Job::Prefetch(p, done_tx)).await.is_ok() {
            let _ = done_rx.recv_async().await;
        }
    }

    /// A sender for `Data::retire`.
    pub(super) fn sender(&self) -> Option<flume::Sender<Job<F>>> {
        self.tx.clone()
    }

    pub(super) fn stop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<F: Fs> Drop for Prefetcher<F> {
    fn drop(&mut self) {
        self.stop();
    }
}

impl<F: Fs> Data<F> {
    /// Hands segments the journal let go of to the background thread (files removed and
    /// mappings dropped there: freeing a large file's pages takes a while); on the shard when
    /// the thread is busy with a full queue or gone.
    pub(super) fn retire(&self, r: Retired<F>) {
        if let Runner::Manual(_) = &self.runner {
            let _ = self.runner.spawn("journal-retire", move || drop(r));
            return;
        }
        if let Some(tx) = &self.background {
            if let Err(e) = tx.try_send(Job::Retire(r)) {
                drop(e.into_inner());
            }
        }
    }

    /// The head records of `rids` whose pages are not all in memory.
    fn cold_heads(&self, rids: &[&[u8]]) -> Prefetch<F> {
        let mut by_group: Map<u32, Vec<(Location, u64)>> = Map::default();
        for rid in rids {
            let g = group_of(rid);
            let Some(q) = self.groups.get(&g).and_then(|grp| grp.queues.get(*rid)) else {
                continue;
            };
            match q.msgs.front() {
                Some(m) if !m.is_quota() => by_group
                    .entry(g)
                    .or_default()
                    .push((m.loc, u64::from(m.len))),
                _ => {}
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

impl<F: Fs> JournalStore<F> {
    /// Brings the pages of the heads of `rids` into memory off the shard, if any are cold.
    pub(super) async fn warm_heads(&self, rids: &[&[u8]]) {
        let p = self.data.borrow().cold_heads(rids);
        if p.is_empty() {
            return;
        }
        self.data.borrow_mut().activity.prefetched += p.len() as u64;
        self.prefetcher.run(p).await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{all, settings, temp};
    use super::super::Durability;
    use super::*;
    use crate::store::group_of;
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
            // 1.6 MB: the group's segments of 256 KiB and 512 KiB fill, so the head is older
            // than the segment before the one being appended to.
            for i in 0..100u8 {
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
        assert_eq!(
            d.activity.prefetched,
            rids.len() as u64,
            "read off the shard first"
        );
        assert!(d.cold_heads(&ids).is_empty(), "and in memory now");
    }
}
