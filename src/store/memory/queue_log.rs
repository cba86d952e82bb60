//! The memory store's queue log (`[STORE_LOG] enable = on`, `docs/ARCHITECTURE.md` §5): every
//! queue change — create, record update (keys, notifier, status, links, the daily touch, service
//! associations) and delete — is appended to a journal of its partition group under
//! `<data>/memory/queue-log/` before it is answered, and made durable as `--fsync` says, as the
//! reference's store log keeps every queue change (simplexmq `src/Simplex/Messaging/Server/
//! StoreLog.hs`). Messages are not in it: they are saved at a clean stop as before
//! (`restore_messages`, `persist.rs`).
//!
//! The log holds the queue changes since the group's file (`group-NN.bin` or its `.bak`) was
//! written. A load applies it on top of that file ([`apply_logs`]); each record carries the whole
//! queue record, so applying a record the file already holds changes nothing, and a log that
//! outlived the save that covered it (a crash between the save and [`reset`]) is harmless.
//! A start folds the logs it finds into the group files first ([`fold`]), and a clean stop, after
//! its save, empties them, so a log grows only with the changes between two starts.
//!
//! A failed sync leaves the group's changes since its last durable point uncertain: the change
//! that waited for it gets [`StoreError::Uncertain`] (no answer; its connection is closed), and
//! the group refuses later queue changes until the relay is restarted, as the journal store does.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use smp_journal::{Journal, Options, OsFs, Priority, Record, SyncPoint};

use super::MemoryData;
use crate::store::journal::{
    decode_queue_record, encode_queue_record, failed, Durability, Runner, Syncer, SYNC_FAILED,
};
use crate::store::{QueueRec, StoreError};

/// The directory of the logs, under the memory store's directory.
pub const QUEUE_LOG_DIR: &str = "queue-log";

/// Segment sizes: queue records are a few hundred bytes, and a log holds one start's changes
/// (64 groups × 16 KiB for a new relay).
const INITIAL_SEGMENT: u64 = 16 << 10;
const SEGMENT: u64 = 16 << 20;

pub fn root(store_dir: &Path) -> PathBuf {
    store_dir.join(QUEUE_LOG_DIR)
}

fn options() -> Options {
    Options {
        segment_size: SEGMENT,
        initial_segment_size: INITIAL_SEGMENT,
        ..Options::on(OsFs)
    }
}

/// The groups whose log holds any segment file.
pub fn logged_groups(store_dir: &Path) -> Vec<u32> {
    smp_journal::reader::list_groups(&root(store_dir))
        .unwrap_or_default()
        .into_iter()
        .filter(|&g| {
            fs::read_dir(group_dir(store_dir, g))
                .map(|d| {
                    d.flatten().any(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(smp_journal::parse_segment_file_name)
                            .is_some()
                    })
                })
                .unwrap_or(false)
        })
        .collect()
}

fn group_dir(store_dir: &Path, g: u32) -> PathBuf {
    root(store_dir).join(format!("g{g:02}"))
}

/// Applies the logs of `groups` to `data`, read only (a torn tail after a crash ends a
/// segment's records; records are checked one by one). Damage stops the load, naming the file
/// and the way out.
pub fn apply_logs(store_dir: &Path, groups: &[u32], data: &mut MemoryData) -> Result<u64, String> {
    let logged = logged_groups(store_dir);
    let mut applied = 0;
    for &g in groups.iter().filter(|g| logged.contains(g)) {
        let rep = smp_journal::reader::read_group(&root(store_dir), g, |_, _, rec| {
            applied += 1;
            apply(data, rec)
        })
        .map_err(|e| damaged(store_dir, g, &e.to_string()))?;
        if let Some(d) = rep.damage.first() {
            return Err(damaged(store_dir, g, d));
        }
    }
    Ok(applied)
}

fn damaged(store_dir: &Path, g: u32, what: &str) -> String {
    format!(
        "the memory store's queue log {} is damaged ({what}): run `smp-journal verify {}` to see \
         what is readable; moving the directory {} away starts from the group's saved file \
         alone, without the queue changes made since the last clean stop",
        group_dir(store_dir, g).display(),
        root(store_dir).display(),
        group_dir(store_dir, g).display(),
    )
}

/// One record of the log, applied as the live store applied it.
fn apply(data: &mut MemoryData, rec: Record<'_>) -> Result<(), String> {
    match rec {
        Record::QueueCreate { data: b, .. } | Record::QueueUpdate { data: b, .. } => {
            data.put_record(decode_queue_record(b)?);
        }
        Record::QueueDelete { recipient_id } => {
            let _ = data.delete(recipient_id);
        }
        other => return Err(format!("a {other:?} record has no place in a queue log")),
    }
    Ok(())
}

/// Folds the logs of `groups` into their group files: loads each group with its log, saves it,
/// then empties the log. Only the groups with a log are touched.
pub fn fold(store_dir: &Path, groups: &[u32]) -> Result<(), String> {
    let logged = logged_groups(store_dir);
    let todo: Vec<u32> = groups
        .iter()
        .copied()
        .filter(|g| logged.contains(g))
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let store = super::MemoryStore::load_with_ntf_ttl(store_dir, &todo, None, None, 0)
        .map_err(|e| e.to_string())?;
    store.save(store_dir, &todo).map_err(|e| e.to_string())?;
    reset(store_dir, &todo).map_err(|e| e.to_string())
}

/// Empties the logs of `groups` (their changes are in the group files): each group's directory
/// is renamed aside and the rename made durable before its files go, so that a crash leaves
/// either the whole log or none of it.
pub fn reset(store_dir: &Path, groups: &[u32]) -> io::Result<()> {
    let root = root(store_dir);
    let mut renamed = false;
    for &g in groups {
        let dir = group_dir(store_dir, g);
        if dir.exists() {
            fs::rename(&dir, root.join(format!("g{g:02}.old")))?;
            renamed = true;
        }
    }
    if renamed {
        fs::File::open(&root)?.sync_all()?;
    }
    remove_old(store_dir, groups)
}

/// Removes what an interrupted [`reset`] of `groups` left (each shard only its own groups: the
/// shards stop at once).
fn remove_old(store_dir: &Path, groups: &[u32]) -> io::Result<()> {
    for &g in groups {
        match fs::remove_dir_all(root(store_dir).join(format!("g{g:02}.old"))) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// The logs of a shard's groups while the relay runs.
pub struct QueueLog {
    store_dir: PathBuf,
    journals: RefCell<BTreeMap<u32, Journal>>,
    syncer: Syncer<OsFs>,
}

impl std::fmt::Debug for QueueLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueLog")
            .field("groups", &self.journals.borrow().len())
            .finish()
    }
}

impl QueueLog {
    /// The logs of `groups`, each opened at its first change (an idle group costs no file).
    pub fn open(store_dir: &Path, groups: &[u32], durability: Durability) -> Result<Self, String> {
        remove_old(store_dir, groups).map_err(|e| format!("{}: {e}", root(store_dir).display()))?;
        Ok(QueueLog {
            store_dir: store_dir.to_path_buf(),
            journals: RefCell::new(BTreeMap::new()),
            syncer: Syncer::start(durability, Vec::new(), &Runner::Threads),
        })
    }

    /// Opens group `g`'s (folded, so empty) log.
    fn open_group(&self, g: u32) -> Result<Journal, StoreError> {
        let root = root(&self.store_dir);
        smp_journal::create_dir_durable(&OsFs, &root).map_err(failed)?;
        let (j, _) = Journal::open(&root, g, &options(), |_, _, _| {
            Err("the queue log was not folded before the start".into())
        })
        .map_err(failed)?;
        self.syncer.add(g, j.sync_handle());
        Ok(j)
    }

    /// Appends `recs` (one change) to group `g`'s log; refused before anything is written once
    /// the group's sync failed. Returns the point that makes the change durable.
    pub fn append(&self, g: u32, recs: &[Record<'_>]) -> Result<SyncPoint, StoreError> {
        let mut journals = self.journals.borrow_mut();
        let j = match journals.entry(g) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(self.open_group(g)?),
        };
        if j.sync_failed() {
            return Err(StoreError::Failed(SYNC_FAILED.into()));
        }
        let priority = if recs.iter().any(|r| matches!(r, Record::QueueCreate { .. })) {
            Priority::Ordinary
        } else {
            Priority::Release
        };
        let done = j.append_batch(recs, priority).map_err(failed)?;
        Ok(done.last().map_or_else(|| j.written(), |a| a.end))
    }

    /// Waits until `g` is durable up to `upto`, as `--fsync` says.
    pub async fn wait(&self, g: u32, upto: SyncPoint) -> Result<(), StoreError> {
        self.syncer.wait(g, upto).await
    }

    /// Syncs every log (a clean stop, before the save: should the save fail, the logs still
    /// hold every change).
    pub fn sync(&self) {
        for (g, j) in self.journals.borrow().iter() {
            if let Err(e) = j.sync_handle().sync_all() {
                tracing::error!(group = g, error = %e, "the queue log's sync failed at the stop");
            }
        }
    }

    /// Stops the sync thread and closes the logs (`reset` empties them once the save is done).
    pub fn close(self) {
        let QueueLog {
            journals,
            mut syncer,
            ..
        } = self;
        syncer.stop();
        drop(journals);
    }
}

/// The record of a queue change.
pub fn change_record<'a>(rec: &'a QueueRec, bytes: &'a [u8], create: bool) -> Record<'a> {
    if create {
        Record::QueueCreate {
            recipient_id: &rec.recipient_id,
            data: bytes,
        }
    } else {
        Record::QueueUpdate {
            recipient_id: &rec.recipient_id,
            data: bytes,
        }
    }
}

pub fn encode(rec: &QueueRec) -> Vec<u8> {
    encode_queue_record(rec)
}

#[cfg(test)]
mod tests {
    use futures_lite::future::block_on;

    use super::*;
    use crate::store::memory::tests::{msg, rec};
    use crate::store::{
        all_groups, MessageStore, QueueStatus, QueueStore, ShardStore, StoreSettings,
    };

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smp-qlog-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn settings(dir: &Path) -> StoreSettings {
        StoreSettings::for_tests(dir)
    }

    /// What a store serves, for comparisons: each queue's record and message count.
    fn state(s: &crate::store::memory::MemoryStore) -> Vec<(QueueRec, usize)> {
        let mut v = Vec::new();
        s.for_each_queue(&mut |r| v.push((r.clone(), s.size(&r.recipient_id))));
        v.sort_by(|a, b| a.0.recipient_id.cmp(&b.0.recipient_id));
        v
    }

    /// Queue changes made after a clean stop reach the next open through the log alone (the
    /// store is dropped without a stop, as a crash leaves it); a log that outlived the save that
    /// covered it changes nothing when applied again; a clean stop empties the log.
    #[test]
    fn the_log_keeps_queue_changes_without_a_stop_and_applies_idempotently() {
        let dir = temp("keeps");
        let s = settings(&dir);
        let groups = all_groups();
        let store = crate::store::memory::MemoryStore::open(&s, &groups, 0).unwrap();
        block_on(async {
            store.create(rec(b"kept")).await.unwrap();
            store.write(b"kept", msg(1, 10), 10).await.unwrap();
            store.create(rec(b"gone")).await.unwrap();
        });
        store.close(&s, &groups).unwrap();
        let mem = dir.join(crate::store::memory::MEMORY_STORE_DIR);
        assert!(
            logged_groups(&mem).is_empty(),
            "a clean stop empties the log"
        );

        let store = crate::store::memory::MemoryStore::open(&s, &groups, 0).unwrap();
        block_on(async {
            let mut r = rec(b"kept");
            r.status = QueueStatus::Off;
            store.update(r).await.unwrap();
            store.delete(b"gone").await.unwrap();
            store.create(rec(b"new")).await.unwrap();
            store
                .associate_many(&[b"new".to_vec()], Some(&b"svc".to_vec()), 77)
                .await
                .unwrap();
        });
        let served = state(&store);
        assert!(!logged_groups(&mem).is_empty());
        drop(store);

        // Read only, as the offline tools read it.
        let read = crate::store::memory::MemoryStore::load(&mem, &groups, None, 0).unwrap();
        assert_eq!(
            state(&read),
            served,
            "the file and the log give what was served"
        );
        // The group files saved while the log still holds the same changes (a crash between the
        // save and the reset): applying the log again changes nothing.
        read.save(&mem, &groups).unwrap();
        let again = crate::store::memory::MemoryStore::load(&mem, &groups, None, 0).unwrap();
        assert_eq!(state(&again), served);

        let reopened = crate::store::memory::MemoryStore::open(&s, &groups, 0).unwrap();
        assert_eq!(state(&reopened), served, "a start folds the log in");
        assert!(logged_groups(&mem).is_empty(), "and empties it");
        let new = reopened.get(b"new").unwrap();
        assert_eq!(new.rcv_service_id.as_deref(), Some(&b"svc"[..]));
        assert_eq!(new.updated_at, Some(77));
        let _ = fs::remove_dir_all(&dir);
    }

    /// A damaged log stops the load, naming the group's directory and the way out.
    #[test]
    fn a_damaged_log_is_refused_naming_its_directory() {
        let dir = temp("damaged");
        let s = settings(&dir);
        let groups = all_groups();
        let store = crate::store::memory::MemoryStore::open(&s, &groups, 0).unwrap();
        block_on(store.create(rec(b"q"))).unwrap();
        drop(store);
        let mem = dir.join(crate::store::memory::MEMORY_STORE_DIR);
        let g = crate::store::group_of(b"q");
        let seg = group_dir(&mem, g).join(smp_journal::segment_file_name(1));
        let mut bytes = fs::read(&seg).unwrap();
        // A byte of the first record's payload (past the 4096-byte header and the record header).
        bytes[4096 + 40] ^= 0xff;
        fs::write(&seg, &bytes).unwrap();
        // The record was synced (every-batch), so a bad one is damage, not a torn tail.
        let err = crate::store::memory::MemoryStore::load(&mem, &groups, None, 0)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        let _ = fs::remove_dir_all(&dir);
        let name = format!("g{g:02}");
        assert!(
            err.contains(&name) && err.contains("damaged") && err.contains("away"),
            "the error names the group's log and the way out: {err}"
        );
    }
}
