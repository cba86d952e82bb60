//! When the journal store's records reach the disk (`--fsync`, [`Durability`]): the shard's sync
//! thread syncs every group each interval, or syncs what every-batch changes wait for, each group
//! once for all the changes waiting then (group commit). With `never` nothing syncs but the
//! system's write-back, a clean stop, and what a retirement, compaction or checkpoint needs first.
//!
//! A failed sync: after a failed msync or fsync, a later success proves nothing (the system may
//! have marked the pages it could not write clean), so everything since the group's last durable
//! point may or may not be on the disk. The journal remembers the failure
//! (`Journal::sync_failed`): the group then refuses every change before applying it (`index.rs`),
//! until the relay is restarted and recovery reads what is really on the disk. A change that
//! waited for its own sync (`every-batch`) and saw it fail gets [`StoreError::Uncertain`]: its
//! record is in the index and may or may not be on the disk, so it is not answered at all, and
//! its connection is closed, as a crash would do (`server/owner/commands/mod.rs`).

use smp_journal::{Fs, SyncHandle, SyncPoint};

use super::{Durability, Map, Runner};
use crate::store::StoreError;

/// The shard's sync thread (none for `Never`; none either when the store's work is run by hand,
/// which syncs inline: every batch in `wait`, every interval in `tick`).
pub(crate) struct Syncer<F: Fs> {
    durability: Durability,
    tx: Option<flume::Sender<SyncReq<F>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The handles, when there is no thread.
    inline: Option<Map<u32, SyncHandle<F>>>,
}

enum SyncReq<F: Fs> {
    /// Sync group `.0` to `.1`, then answer.
    To(u32, SyncPoint, flume::Sender<Result<(), String>>),
    /// A group opened after the start (the memory store's queue log opens each at its first
    /// change).
    Add(u32, SyncHandle<F>),
    Stop,
}

/// What a client's change gets when its own sync failed: no answer (`StoreError::Uncertain`).
fn uncertain(e: impl std::fmt::Display) -> StoreError {
    StoreError::Uncertain(format!("journal sync failed: {e}"))
}

impl<F: Fs> Syncer<F> {
    pub fn start(
        durability: Durability,
        handles: Vec<(u32, SyncHandle<F>)>,
        runner: &Runner,
    ) -> Self {
        if durability == Durability::Never || runner.is_manual() {
            return Syncer {
                durability,
                tx: None,
                thread: None,
                inline: runner.is_manual().then(|| handles.into_iter().collect()),
            };
        }
        let (tx, rx) = flume::unbounded::<SyncReq<F>>();
        let handles: Map<u32, SyncHandle<F>> = handles.into_iter().collect();
        let thread = std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || sync_thread(durability, handles, &rx))
            .ok();
        Syncer {
            durability,
            tx: Some(tx),
            thread,
            inline: None,
        }
    }

    /// What the sync thread does each interval, when there is no thread.
    #[cfg(test)]
    pub fn tick(&self) {
        if let (Durability::Interval(_), Some(handles)) = (self.durability, &self.inline) {
            let mut failed = std::collections::BTreeSet::new();
            sync_every_group(handles, &mut failed);
        }
    }

    /// Waits until group `g` is durable up to `upto` (only with `EveryBatch`); a failed sync is
    /// [`StoreError::Uncertain`].
    pub async fn wait(&self, g: u32, upto: SyncPoint) -> Result<(), StoreError> {
        if self.durability != Durability::EveryBatch {
            return Ok(());
        }
        if let Some(h) = self.inline.as_ref().and_then(|hs| hs.get(&g)) {
            return h.sync_to(upto).map(|_| ()).map_err(uncertain);
        }
        let Some(tx) = &self.tx else {
            return Ok(());
        };
        let (done_tx, done_rx) = flume::bounded(1);
        tx.send(SyncReq::To(g, upto, done_tx))
            .map_err(|_| uncertain("the sync thread stopped"))?;
        match done_rx.recv_async().await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(uncertain(e)),
            Err(_) => Err(uncertain("the sync thread stopped")),
        }
    }

    /// Syncs group `g` too from now on (with a sync thread; inline syncing is for tests of the
    /// journal store, which opens every group at start).
    pub fn add(&self, g: u32, handle: SyncHandle<F>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(SyncReq::Add(g, handle));
        }
    }

    pub fn stop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(SyncReq::Stop);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<F: Fs> Drop for Syncer<F> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Syncs every group but those whose sync failed already (`failed`, added to here: a failed
/// journal refuses every later sync, and the shard says so once per group).
fn sync_every_group<F: Fs>(
    handles: &Map<u32, SyncHandle<F>>,
    failed: &mut std::collections::BTreeSet<u32>,
) {
    for (&g, h) in handles {
        if failed.contains(&g) {
            continue;
        }
        if let Err(e) = h.sync_all() {
            failed.insert(g);
            tracing::error!(
                group = g,
                error = %e,
                "journal sync failed: what was appended since the last sync may be lost; the \
                 group refuses changes until the relay is restarted (check the disk, then \
                 restart the relay)"
            );
        }
    }
}

/// Every-batch: takes every waiting request, syncs each group once to the furthest point asked,
/// answers them all (group commit). Interval: syncs every group each period.
fn sync_thread<F: Fs>(
    durability: Durability,
    mut handles: Map<u32, SyncHandle<F>>,
    rx: &flume::Receiver<SyncReq<F>>,
) {
    let mut failed = std::collections::BTreeSet::new();
    loop {
        let first = match durability {
            Durability::Interval(every) => match rx.recv_timeout(every) {
                Ok(r) => r,
                Err(flume::RecvTimeoutError::Timeout) => {
                    sync_every_group(&handles, &mut failed);
                    continue;
                }
                Err(flume::RecvTimeoutError::Disconnected) => SyncReq::Stop,
            },
            _ => rx.recv().unwrap_or(SyncReq::Stop),
        };
        let mut reqs = vec![first];
        reqs.extend(rx.try_iter());
        let mut stop = false;
        let mut furthest: Map<u32, SyncPoint> = Map::default();
        let mut waiting = Vec::new();
        for r in reqs {
            match r {
                SyncReq::To(g, p, done) => {
                    let f = furthest.entry(g).or_default();
                    *f = (*f).max(p);
                    waiting.push((g, done));
                }
                SyncReq::Add(g, h) => {
                    handles.insert(g, h);
                }
                SyncReq::Stop => stop = true,
            }
        }
        let mut results: Map<u32, Result<(), String>> = Map::default();
        for (g, p) in furthest {
            let r = match handles.get(&g) {
                Some(h) => h.sync_to(p).map(|_| ()).map_err(|e| e.to_string()),
                None => Err(format!("group {g} has no journal here")),
            };
            results.insert(g, r);
        }
        for (g, done) in waiting {
            let _ = done.send(results.get(&g).cloned().unwrap_or(Ok(())));
        }
        if stop {
            sync_every_group(&handles, &mut failed);
            return;
        }
    }
}
