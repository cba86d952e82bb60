//! The journal store (`docs/ARCHITECTURE.md` §5): queues, messages and notifications of a shard's
//! partition groups in the memory-mapped journals of the `smp-journal` crate (`journal/`, its
//! format in `journal/FORMAT.md`), one journal per group under `<data-dir>/journal/`.
//!
//! Every change is a record appended to its queue's group journal before the call returns, so a
//! killed relay loses nothing it answered: the record is in the page cache. When it is on the disk
//! depends on the durability setting ([`Durability`], `sync.rs`): after every batch of changes
//! (the change's call waits for the sync, which a sync thread runs for all changes waiting then:
//! group commit), every N milliseconds (the default, 50), or when the system writes the pages
//! back. An OS crash or power loss may lose what was not synced yet; a failed sync stops the
//! group from taking changes (`sync.rs`).
//!
//! In memory (`index.rs`): each queue's record and, per message, its ID, time, flags and where its
//! record is; bodies stay in the mapping and are read (and their CRC checked) when a head is
//! peeked. At start each group loads its latest checkpoint and replays the records after it, or
//! replays everything when there is none that fits (`checkpoint.rs`); checkpoints are taken while
//! the relay runs, so that the replay after a crash stays short, and at a clean stop.
//!
//! Space: a segment is removed once it and every older segment of its group hold no live record
//! (a queue's latest record, a message not deleted, a stored notification), after the records
//! that made them dead are durable; the state is a function of the records left, whichever were
//! removed (`index.rs`). Oldest segments that hold mostly dead bytes are compacted in the
//! background (`compaction.rs`). When the journal cannot grow (a full disk, or the cap of `start
//! --journal-max-size`), records that end or shrink state go on in the active segment's reserve
//! (`index::priority_of`) and the others answer `ERR STORE` ([`NO_SPACE`], [`SIZE_CAP`]) with
//! nothing recorded.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use smp_journal::{Fs, Journal, JournalError, Options, OsFs, Priority, Record, SyncPoint};

use super::codec::{decode_ntf, decode_rec, encode_ntf, encode_rec};
use super::memory::MAX_NTFS_PER_NOTIFIER;
use super::{
    group_of, EntityId, Message, MessageStore, MsgId, MsgNtf, QueueData, QueueRec, QueueStatus,
    QueueStore, ShardStore, StoreCounters, StoreError, StoreSettings, WriteOutcome,
};
use crate::protocol::encoding::Reader;

mod checkpoint;
mod compaction;
mod index;
mod prefetch;
mod runner;
#[cfg(test)]
mod sim;
mod sync;
use checkpoint::{Checkpointing, Writing};
use compaction::Compaction;
pub use index::SYNC_FAILED;
use index::{Activity, GroupIndex, MsgEntry, NtfEntry};
use prefetch::Job;
use prefetch::Prefetcher;
#[cfg(test)]
pub(crate) use runner::Manual;
pub(crate) use runner::Runner;
pub(crate) use sync::Syncer;

/// The store's maps hash with fixed keys: their keys are IDs the relay drew at random (no client
/// chooses them), and a fixed order of iteration makes the same calls write the same records in
/// the same order, which the storage fault simulator's seeds rely on.
type Map<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<DefaultHasher>>;

/// The store's state on its shard: the index of what the records say (`journal/index.rs`, which
/// also holds its methods) and the work under way off the shard on its behalf (`checkpoint.rs`,
/// `compaction.rs`, `prefetch.rs`). Declared here, above both, so that neither imports the other.
struct Data<F: Fs> {
    /// The compaction under way, if any (first, so that it is dropped, and its thread joined,
    /// before the journals' locks go).
    pub compaction: Option<Compaction<F>>,
    /// The checkpoint being taken, if any, and the one being written.
    pub checkpoint: Option<Checkpointing<F>>,
    pub checkpoint_writing: Option<Writing>,
    pub tuning: Tuning,
    pub runner: Runner,
    /// Records to append before a failed compaction is tried again.
    pub compaction_backoff: u64,
    pub activity: Activity,
    /// The store's background thread, for segments to let go of off the shard.
    pub background: Option<flume::Sender<Job<F>>>,
    pub journals: BTreeMap<u32, Journal<F>>,
    pub groups: BTreeMap<u32, GroupIndex>,
    /// Notifier ID → the group of its queue, where its notifications are recorded.
    pub notifiers: Map<crate::store::id::IdKey, u32>,
    /// Records of the queues used lately, decoded (`index.rs`); the rest are read from the
    /// journal when used.
    pub records: RefCell<super::cache::RecordCache>,
    /// At open: messages replayed before any record of their queue (whose older records were
    /// removed as dead or compacted away), waiting for the queue's record that follows them.
    pub parked: Map<EntityId, VecDeque<MsgEntry>>,
    /// At open: notifications replayed before the record that gave their notifier to a queue.
    pub parked_ntfs: Map<EntityId, VecDeque<NtfEntry>>,
    pub total_messages: usize,
    pub counters: StoreCounters,
}

/// Queue records and notifications in the journal: the memory store's encodings
/// (`store/codec.rs`), each record's payload exactly one of them.
fn encoded<T>(x: &T, encode: fn(&mut Vec<u8>, &T)) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out, x);
    out
}

fn decoded<T>(
    b: &[u8],
    what: &str,
    decode: fn(&mut Reader<'_>) -> crate::protocol::encoding::DResult<T>,
) -> Result<T, String> {
    let mut r = Reader::new(b);
    let x = decode(&mut r).map_err(|_| format!("bad {what}"))?;
    if !r.rest().is_empty() {
        return Err(format!("bad {what}: trailing bytes"));
    }
    Ok(x)
}

pub(crate) fn encode_queue_record(rec: &QueueRec) -> Vec<u8> {
    encoded(rec, encode_rec)
}

pub(crate) fn decode_queue_record(b: &[u8]) -> Result<QueueRec, String> {
    decoded(b, "queue record", decode_rec)
}

/// The IDs in an encoded queue record, borrowed from it (`codec::read_ids`).
pub(crate) fn record_ids(b: &[u8]) -> Result<super::RecordIds<'_>, String> {
    let mut r = Reader::new(b);
    let ids = super::codec::read_ids(&mut r).map_err(|_| "bad queue record".to_string())?;
    if !r.rest().is_empty() {
        return Err("bad queue record: trailing bytes".into());
    }
    Ok(ids)
}

fn encode_notification(n: &MsgNtf) -> Vec<u8> {
    encoded(n, encode_ntf)
}

fn decode_notification(b: &[u8]) -> Result<MsgNtf, String> {
    decoded(b, "notification", decode_ntf)
}

/// A queue's record that could not be read from its journal (a record the relay wrote and checked
/// at start, changed on the disk since): the queue is served as missing, and the operator told,
/// at most once per `limits::WARNING_INTERVAL`.
fn unreadable_record(rid: &[u8], e: &StoreError) {
    static UNREADABLE: crate::log_limit::RateLimited =
        crate::log_limit::RateLimited::new("queue records that could not be read");
    if let crate::log_limit::Decision::Write { suppressed } =
        UNREADABLE.decide(std::time::Instant::now())
    {
        tracing::error!(
            queue = %crate::crypto::hash::b64url(rid),
            error = %e,
            suppressed,
            "a queue's record could not be read from the journal: the queue is served as missing; \
             stop the relay and run `smp-journal check` on the data directory's journal"
        );
    }
}

/// Where the journals live, under the data directory.
pub const JOURNAL_STORE_DIR: &str = "journal";

/// When appended records are made durable (`start --fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// A change's call returns after a sync covering its record.
    EveryBatch,
    /// A sync thread syncs every group this often.
    Interval(Duration),
    /// Only the system's own write-back.
    Never,
}

/// The default: every 50 ms.
pub const DEFAULT_DURABILITY: Durability = Durability::Interval(Duration::from_millis(50));

/// Message flags in `MsgAppend` records.
const FLAG_NOTIFICATION: u8 = 1;
const FLAG_QUOTA: u8 = 2;

/// A group takes a checkpoint once it has taken this many records since its last one (`start
/// --journal-checkpoint-records`, ini `[STORE_LOG] journal_checkpoint_records`): the most a start
/// after a crash replays per group, beyond the checkpoint it loads.
pub const DEFAULT_CHECKPOINT_RECORDS: u64 = 10_000;

/// …or this many bytes of records, whichever comes first: large messages cost a replay their
/// reading.
pub const CHECKPOINT_BYTES: u64 = 64 << 20;

/// Queues (or notification lists) a checkpoint writes per record appended while it is taken.
pub(crate) const CHECKPOINT_STEP: usize = 64;

/// The journal store's sizes and thresholds. The relay uses [`Tuning::default`] (with the
/// checkpoint setting); the storage fault simulator makes them small, so that a few kilobytes of
/// records exercise rotation, retirement, compaction and checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub segment_size: u64,
    pub initial_segment_size: u64,
    pub release_reserve: u64,
    /// `compaction.rs`: a group's oldest segments are compacted once they take at least this
    /// much disk…
    pub compact_min_bytes: u64,
    /// …and at most one byte in this many is live.
    pub compact_live_share: u64,
    /// The most live bytes one compaction copies.
    pub compact_max_live_bytes: u64,
    /// Records looked at per appended record while finding what to keep.
    pub compact_scan_step: usize,
    /// Records appended before a compaction that failed is tried again.
    pub compact_retry_after: u64,
    /// `checkpoint.rs`: records, or bytes of records, after which a group takes a checkpoint…
    pub checkpoint_records: u64,
    pub checkpoint_bytes: u64,
    /// …writing this many queues per record appended meanwhile.
    pub checkpoint_step: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            segment_size: smp_journal::DEFAULT_SEGMENT_SIZE,
            initial_segment_size: smp_journal::DEFAULT_INITIAL_SEGMENT_SIZE,
            release_reserve: smp_journal::DEFAULT_RELEASE_RESERVE,
            compact_min_bytes: compaction::COMPACT_MIN_BYTES,
            compact_live_share: compaction::COMPACT_LIVE_SHARE,
            compact_max_live_bytes: compaction::COMPACT_MAX_LIVE_BYTES,
            compact_scan_step: compaction::COMPACT_SCAN_STEP,
            compact_retry_after: compaction::COMPACT_RETRY_AFTER,
            checkpoint_records: DEFAULT_CHECKPOINT_RECORDS,
            checkpoint_bytes: CHECKPOINT_BYTES,
            checkpoint_step: CHECKPOINT_STEP,
        }
    }
}

/// The store of one shard's groups; see the module comment.
pub struct JournalStore<F: Fs = OsFs> {
    data: RefCell<Data<F>>,
    syncer: Syncer<F>,
    prefetcher: Prefetcher<F>,
}

/// What a client gets (`ERR STORE …`) when the journal cannot grow: the disk is full.
pub const NO_SPACE: &str = "no space left for the journal";
/// The same for the configured size cap (`start --journal-max-size`).
pub const SIZE_CAP: &str = "journal size cap reached";

pub(crate) fn failed(e: JournalError) -> StoreError {
    match e {
        JournalError::NoSpace { .. } => StoreError::Failed(NO_SPACE.into()),
        JournalError::SizeCap { .. } => StoreError::Failed(SIZE_CAP.into()),
        e => StoreError::Failed(format!("journal: {e}")),
    }
}

/// Why a group does not open, and, for damage, what was lost with it as far as the group's
/// checkpoint knows (queues and message counts), so that the operator learns it before
/// `smp-journal repair` cuts it away.
fn lost_report<F: Fs>(fs: &F, root: &std::path::Path, g: u32, e: JournalError) -> String {
    // A bad record at an offset loses what follows it (repair cuts there); a damage named at a
    // segment's start (offset 0: missing segments) loses what was in the missing files.
    let damage = match &e {
        JournalError::Damage { file, offset, .. } => file
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(smp_journal::parse_segment_file_name)
            .filter(|_| *offset >= smp_journal::HEADER_LEN)
            .map(|s| (s, *offset)),
        _ => return e.to_string(),
    };
    match checkpoint::lost_by_checkpoint(fs, root, g, damage) {
        Some(lost) => format!("{e}; {lost}"),
        None => format!(
            "{e}; what the lost records held is not known (no checkpoint of the group names it)"
        ),
    }
}

/// A message's flags and body as its `MsgAppend` record holds them.
fn flags_and_body(m: &Message) -> (u8, &[u8]) {
    match m {
        Message::Message {
            notification, body, ..
        } => (if *notification { FLAG_NOTIFICATION } else { 0 }, &body[..]),
        Message::Quota { .. } => (FLAG_QUOTA, &[]),
    }
}

impl JournalStore {
    fn dir(s: &StoreSettings) -> PathBuf {
        s.data_dir.join(JOURNAL_STORE_DIR)
    }

    /// Opens (replays) the journals of `groups`, then drops what expired while the relay was
    /// stopped.
    pub fn open_groups(
        s: &StoreSettings,
        groups: &[u32],
        now: i64,
        durability: Durability,
    ) -> Result<Self, String> {
        let tuning = Tuning {
            checkpoint_records: s.journal_checkpoint_records,
            ..Tuning::default()
        };
        JournalStore::open_on(OsFs, s, groups, now, durability, tuning, Runner::Threads)
    }
}

impl<F: Fs> JournalStore<F> {
    /// [`JournalStore::open_groups`] on the file system `fs`, with the sizes of `tuning`, its
    /// background work run by `runner`.
    pub(crate) fn open_on(
        fs: F,
        s: &StoreSettings,
        groups: &[u32],
        now: i64,
        durability: Durability,
        tuning: Tuning,
        runner: Runner,
    ) -> Result<Self, String> {
        let root = JournalStore::dir(s);
        smp_journal::create_dir_durable(&fs, &root)
            .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        let opts = Options {
            budget: s.journal_budget.clone(),
            segment_size: tuning.segment_size,
            initial_segment_size: tuning.initial_segment_size,
            release_reserve: tuning.release_reserve,
            ..Options::on(fs)
        };
        let mut data = Data::new(tuning, runner.clone());
        let mut handles = Vec::new();
        let started = std::time::Instant::now();
        let (mut opened_records, mut opened_from_checkpoint) = (0u64, 0usize);
        for &g in groups {
            data.groups.insert(g, GroupIndex::default());
            // Both callbacks build `data`: the checkpoint's (if one is used) first.
            let cell = RefCell::new(&mut data);
            let mut replayed = index::Since::default();
            let opened = Journal::open_from_checkpoint(
                &root,
                g,
                &opts,
                |cp| cell.borrow_mut().load_checkpoint(g, &cp.blob),
                |loc, _seq, rec| {
                    replayed.add(1, rec.stored_len());
                    cell.borrow_mut().replay(g, loc, rec)
                },
            );
            let (journal, report) = opened.map_err(|e| lost_report(&opts.fs, &root, g, e))?;
            for w in &report.warnings {
                tracing::warn!("{w}");
            }
            // What is still parked has no queue: its queue's records were all dead.
            data.parked.clear();
            data.parked_ntfs.clear();
            // An empty group, or one opened from a checkpoint at its end, is already as cheap
            // to open as it gets.
            let empty = report.records == 0 && report.checkpoint.is_none();
            let grp = data.group_mut(g);
            if empty || report.checkpoint == Some(report.written) {
                grp.ended_at_open = Some(report.written);
            }
            // The records replayed after the checkpoint count towards the next one; a group
            // replayed whole takes one at once.
            grp.since_checkpoint = replayed;
            if report.checkpoint.is_none() && report.records > 0 {
                grp.since_checkpoint.force();
            }
            opened_records += report.records;
            opened_from_checkpoint += usize::from(report.checkpoint.is_some());
            handles.push((g, journal.sync_handle()));
            data.journals.insert(g, journal);
            data.check_locations(g).map_err(|e| {
                format!(
                    "{}: {e}; the journal lost records it had served: run `smp-journal repair`, \
                     which removes the checkpoint that refers to them",
                    smp_journal::group_dir(&root, g).display()
                )
            })?;
        }
        // Said at info only when records were replayed past the checkpoints (after a crash, or
        // a stop that wrote none): that is when the time of a start depends on history, and a
        // tool opening a cleanly stopped store stays quiet.
        let seconds = started.elapsed().as_secs_f64();
        let queues = data.queue_count();
        if opened_records > 0 {
            tracing::info!(
                groups = groups.len(),
                from_checkpoints = opened_from_checkpoint,
                records_replayed = opened_records,
                queues,
                seconds,
                "journal store opened"
            );
        } else if !groups.is_empty() {
            tracing::debug!(
                groups = groups.len(),
                from_checkpoints = opened_from_checkpoint,
                queues,
                seconds,
                "journal store opened"
            );
        }
        let prefetcher = Prefetcher::start(&runner);
        data.background = prefetcher.sender();
        let store = JournalStore {
            data: RefCell::new(data),
            syncer: Syncer::start(durability, handles, &runner),
            prefetcher,
        };
        // What expired while the relay was stopped goes now, as the memory store does not load it.
        // On a full journal (the reserve used up) they are left for the periodic expiry: a relay
        // that cannot grow must still start and serve its deletes.
        let later = |r: Result<usize, StoreError>| match r {
            Err(StoreError::Failed(e)) if e == NO_SPACE || e == SIZE_CAP => {
                tracing::warn!("what expired while the relay was stopped is deleted later: {e}");
                Ok(0)
            }
            r => r.map_err(|e| e.to_string()),
        };
        if s.message_ttl_secs < i64::MAX {
            let old = now.saturating_sub(s.message_ttl_secs);
            later(futures_lite::future::block_on(store.expire_all(old)))?;
        }
        if s.ntf_ttl_secs < i64::MAX {
            let old = now.saturating_sub(s.ntf_ttl_secs);
            later(futures_lite::future::block_on(store.expire_ntfs(old)))?;
        }
        Ok(store)
    }

    /// What the store did since open (for the tests).
    #[cfg(test)]
    pub(crate) fn activity(&self) -> index::Activity {
        self.data.borrow().activity.clone()
    }
}

impl<F: Fs> QueueStore for JournalStore<F> {
    fn with_queue<R>(&self, recipient_id: &[u8], f: impl FnOnce(&QueueRec) -> R) -> Option<R> {
        // The record is taken out of the store's borrow first: `f` may call the store again.
        let rec = self.data.borrow().record_of(recipient_id);
        match rec {
            Ok(rec) => rec.map(|r| f(&r)),
            Err(e) => {
                unreadable_record(recipient_id, &e);
                None
            }
        }
    }

    fn for_each_queue(&self, f: &mut dyn FnMut(&QueueRec)) {
        let d = self.data.borrow();
        for (g, grp) in &d.groups {
            for (rid, q) in &grp.queues {
                match d.read_record(*g, q) {
                    Ok(r) => f(&r),
                    Err(e) => unreadable_record(rid.as_slice(), &e),
                }
            }
        }
    }

    fn for_each_queue_ids(&self, f: &mut dyn FnMut(&super::RecordIds<'_>)) -> Result<(), String> {
        let d = self.data.borrow();
        for (g, grp) in &d.groups {
            for (rid, q) in &grp.queues {
                let ids = d
                    .record_bytes(*g, q)
                    .and_then(|b| record_ids(b).map_err(StoreError::Failed));
                match ids {
                    Ok(ids) => f(&ids),
                    Err(e) => unreadable_record(rid.as_slice(), &e),
                }
            }
        }
        Ok(())
    }

    fn queue_count(&self) -> usize {
        self.data.borrow().queue_count()
    }

    /// The notifier → group map holds every notifier of the shard.
    fn notifier_count_hint(&self) -> usize {
        self.data.borrow().notifiers.len()
    }

    async fn create(&self, rec: QueueRec) -> Result<(), StoreError> {
        let g = group_of(&rec.recipient_id);
        let end = {
            let mut d = self.data.borrow_mut();
            if d.queue(&rec.recipient_id).is_some() {
                return Err(StoreError::Duplicate);
            }
            let bytes = encode_queue_record(&rec);
            d.record(
                g,
                &Record::QueueCreate {
                    recipient_id: &rec.recipient_id,
                    data: &bytes,
                },
            )?
        };
        self.syncer.wait(g, end).await
    }

    async fn update(&self, rec: QueueRec) -> Result<(), StoreError> {
        let g = group_of(&rec.recipient_id);
        let end = {
            let mut d = self.data.borrow_mut();
            if d.queue(&rec.recipient_id).is_none() {
                return Err(StoreError::NotFound);
            }
            let bytes = encode_queue_record(&rec);
            let end = d.record(
                g,
                &Record::QueueUpdate {
                    recipient_id: &rec.recipient_id,
                    data: &bytes,
                },
            )?;
            d.release_dead_segments(g);
            end
        };
        self.syncer.wait(g, end).await
    }

    async fn delete(&self, recipient_id: &[u8]) -> Result<QueueRec, StoreError> {
        let g = group_of(recipient_id);
        let (rec, end) = {
            let mut d = self.data.borrow_mut();
            let Some(rec) = d.record_of(recipient_id)? else {
                return Err(StoreError::NotFound);
            };
            let rec = Rc::unwrap_or_clone(rec);
            let end = d.record(g, &Record::QueueDelete { recipient_id })?;
            d.release_dead_segments(g);
            (rec, end)
        };
        self.syncer.wait(g, end).await?;
        Ok(rec)
    }
}

impl<F: Fs> MessageStore for JournalStore<F> {
    async fn write(
        &self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError> {
        let g = group_of(recipient_id);
        let (outcome, end) = {
            let mut d = self.data.borrow_mut();
            d.counters.store_writes += 1;
            let q = d.queue(recipient_id).ok_or(StoreError::NotFound)?;
            let was_empty = q.msgs.is_empty();
            if !(q.can_write() || was_empty) {
                return Ok(WriteOutcome::Full);
            }
            // Over the quota the message becomes the marker, with its ID and time.
            let under_quota = q.msgs.len() < quota;
            let (flags, body) = if under_quota {
                flags_and_body(&msg)
            } else {
                (FLAG_QUOTA, &[][..])
            };
            let end = d.record(
                g,
                &Record::MsgAppend {
                    recipient_id,
                    msg_id: msg.msg_id(),
                    ts: msg.ts(),
                    flags,
                    body,
                },
            )?;
            let outcome = if under_quota {
                WriteOutcome::Written { was_empty }
            } else {
                WriteOutcome::QuotaMarker { was_empty }
            };
            (outcome, end)
        };
        self.syncer.wait(g, end).await?;
        Ok(outcome)
    }

    async fn peek_first(&self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        self.warm_heads(&[recipient_id]).await;
        let mut d = self.data.borrow_mut();
        d.counters.store_peek_first_calls += 1;
        d.head(recipient_id)
    }

    async fn peek_first_many(
        &self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        self.warm_heads(recipient_ids).await;
        let mut d = self.data.borrow_mut();
        d.counters.store_peek_first_many_calls += 1;
        recipient_ids.iter().map(|rid| d.head(rid)).collect()
    }

    async fn try_del(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError> {
        let (deleted, _) = self.del_head(recipient_id, msg_id, false).await?;
        Ok(deleted)
    }

    async fn try_del_peek(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        self.del_head(recipient_id, msg_id, true).await
    }

    async fn delete_expired(
        &self,
        recipient_id: &[u8],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        let g = group_of(recipient_id);
        let (n, end) = {
            let mut d = self.data.borrow_mut();
            d.expire_queue(g, recipient_id, older_than)?
        };
        if let Some(end) = end {
            self.syncer.wait(g, end).await?;
        }
        Ok(n)
    }

    fn size(&self, recipient_id: &[u8]) -> usize {
        let d = self.data.borrow();
        d.queue(recipient_id).map_or(0, |q| q.msgs.len())
    }

    fn total_messages(&self) -> usize {
        self.data.borrow().total_messages
    }

    fn expiry_candidates(&self) -> Vec<EntityId> {
        let d = self.data.borrow();
        d.groups
            .values()
            .flat_map(|grp| grp.queues.iter())
            .filter(|(_, q)| !q.msgs.is_empty())
            .map(|(rid, _)| rid.to_vec())
            .collect()
    }

    async fn expire_all(&self, older_than: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut ends: Vec<(u32, SyncPoint)> = Vec::new();
        {
            let mut d = self.data.borrow_mut();
            // Group by group, each in the order of its queues' IDs: the records of one call go
            // in a defined order. Only queues holding messages are looked at: most hold none.
            let groups: Vec<u32> = d.groups.keys().copied().collect();
            for g in groups {
                let rids: Vec<EntityId> = d.groups[&g]
                    .queues
                    .iter()
                    .filter(|(_, q)| !q.msgs.is_empty())
                    .map(|(rid, _)| rid.to_vec())
                    .collect();
                let mut last = None;
                for rid in rids {
                    let (k, end) = d.expire_queue(g, &rid, older_than)?;
                    n += k;
                    last = end.or(last);
                }
                if let Some(e) = last {
                    ends.push((g, e));
                }
            }
        }
        for (g, end) in ends {
            self.syncer.wait(g, end).await?;
        }
        Ok(n)
    }

    async fn add_ntf(&self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError> {
        let Some(g) = self.notifier_group(notifier_id) else {
            return Ok(());
        };
        let end = {
            let mut d = self.data.borrow_mut();
            let bytes = encode_notification(&ntf);
            d.record(
                g,
                &Record::NtfAppend {
                    notifier_id,
                    data: &bytes,
                },
            )?
        };
        self.syncer.wait(g, end).await
    }

    async fn take_ntfs(
        &self,
        notifier_id: &[u8],
        max: usize,
    ) -> Result<(Vec<MsgNtf>, bool), StoreError> {
        let Some(g) = self.notifier_group(notifier_id) else {
            return Ok((Vec::new(), false));
        };
        let (part, more, end) = {
            let mut d = self.data.borrow_mut();
            let list = d.groups.get(&g).and_then(|grp| grp.ntfs.get(notifier_id));
            let taken: Vec<MsgNtf> = match list {
                Some(list) => list.iter().take(max).map(|n| n.ntf.clone()).collect(),
                None => return Ok((Vec::new(), false)),
            };
            let mut end = None;
            for n in &taken {
                end = Some(d.record(
                    g,
                    &Record::NtfDelete {
                        notifier_id,
                        msg_id: &n.msg_id,
                    },
                )?);
            }
            let more = d
                .groups
                .get(&g)
                .and_then(|grp| grp.ntfs.get(notifier_id))
                .is_some_and(|l| !l.is_empty());
            d.release_dead_segments(g);
            (taken, more, end)
        };
        if let Some(end) = end {
            self.syncer.wait(g, end).await?;
        }
        Ok((part, more))
    }

    async fn return_ntfs(&self, notifier_id: &[u8], ntfs: Vec<MsgNtf>) -> Result<(), StoreError> {
        let Some(g) = self.notifier_group(notifier_id) else {
            return Ok(());
        };
        // Returned notifications go ahead of those stored since: the list is written again in
        // its new order (returns are rare: a connection closed with NMSGs unwritten), as one
        // change, so that a crash keeps the old list or the new one, never an empty one.
        let end = {
            let mut d = self.data.borrow_mut();
            let mut list: Vec<MsgNtf> = ntfs;
            if let Some(kept) = d.groups.get(&g).and_then(|grp| grp.ntfs.get(notifier_id)) {
                list.extend(kept.iter().map(|n| n.ntf.clone()));
            }
            let skip = list.len().saturating_sub(MAX_NTFS_PER_NOTIFIER);
            let bytes: Vec<Vec<u8>> = list.iter().skip(skip).map(encode_notification).collect();
            let mut recs = vec![Record::NtfClear { notifier_id }];
            recs.extend(bytes.iter().map(|b| Record::NtfAppend {
                notifier_id,
                data: b,
            }));
            // Ordinary, not the reserve: the change grows the journal.
            d.record_change(g, &recs, Priority::Ordinary)?
        };
        self.syncer.wait(g, end).await
    }

    async fn delete_ntfs(&self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        let Some(g) = self.notifier_group(notifier_id) else {
            return Ok(0);
        };
        let (n, end) = {
            let mut d = self.data.borrow_mut();
            let n = d
                .groups
                .get(&g)
                .and_then(|grp| grp.ntfs.get(notifier_id))
                .map_or(0, VecDeque::len);
            if n == 0 {
                return Ok(0);
            }
            let end = d.record(g, &Record::NtfClear { notifier_id })?;
            d.release_dead_segments(g);
            (n, end)
        };
        self.syncer.wait(g, end).await?;
        Ok(n)
    }

    fn ntf_count(&self) -> usize {
        let d = self.data.borrow();
        d.groups
            .values()
            .flat_map(|grp| grp.ntfs.values())
            .map(VecDeque::len)
            .sum()
    }

    fn ntf_ids(&self) -> Vec<EntityId> {
        let d = self.data.borrow();
        d.groups
            .values()
            .flat_map(|grp| grp.ntfs.iter())
            .filter(|(_, l)| !l.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    async fn expire_ntfs(&self, older_than: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut ends: Vec<(u32, SyncPoint)> = Vec::new();
        {
            let mut d = self.data.borrow_mut();
            let groups: Vec<u32> = d.groups.keys().copied().collect();
            for g in groups {
                // By notifier ID, each notifier's oldest first: a defined order.
                let old: Vec<(EntityId, MsgId)> = d.groups[&g]
                    .ntfs
                    .iter()
                    .flat_map(|(nid, l)| {
                        l.iter()
                            .filter(|e| e.ntf.ts < older_than)
                            .map(|e| (nid.clone(), e.ntf.msg_id))
                    })
                    .collect();
                let mut last = None;
                for (nid, msg_id) in old {
                    last = Some(d.record(
                        g,
                        &Record::NtfDelete {
                            notifier_id: &nid,
                            msg_id: &msg_id,
                        },
                    )?);
                    n += 1;
                }
                if let Some(e) = last {
                    ends.push((g, e));
                }
            }
        }
        for (g, end) in ends {
            self.syncer.wait(g, end).await?;
        }
        Ok(n)
    }

    async fn messages(&self, recipient_id: &[u8]) -> Result<Vec<Message>, StoreError> {
        let d = self.data.borrow();
        let Some(q) = d.queue(recipient_id) else {
            return Ok(Vec::new());
        };
        let g = group_of(recipient_id);
        q.msgs.iter().map(|m| d.message(g, m)).collect()
    }

    async fn ntfs(&self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError> {
        let d = self.data.borrow();
        let Some(&g) = d.notifiers.get(notifier_id) else {
            return Ok(Vec::new());
        };
        Ok(d.groups
            .get(&g)
            .and_then(|grp| grp.ntfs.get(notifier_id))
            .map(|l| l.iter().map(|n| n.ntf.clone()).collect())
            .unwrap_or_default())
    }

    fn counters(&self) -> StoreCounters {
        self.data.borrow().counters
    }
}

impl<F: Fs> JournalStore<F> {
    /// The group whose journal holds a notifier's notifications: its queue's. Notifications of a
    /// notifier no queue of this store has are not kept.
    fn notifier_group(&self, nid: &[u8]) -> Option<u32> {
        self.data.borrow().notifiers.get(nid).copied()
    }

    /// Deletes the head of `rid` if it is `msg_id`; with `peek`, also returns the new head.
    async fn del_head(
        &self,
        rid: &[u8],
        msg_id: &MsgId,
        peek: bool,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        let g = group_of(rid);
        let (deleted, end) = {
            let mut d = self.data.borrow_mut();
            d.counters.store_deletes += 1;
            let head = d.queue(rid).and_then(|q| q.msgs.front()).copied();
            let mut deleted = None;
            let mut end = None;
            if let Some(h) = head.filter(|h| &h.msg_id == msg_id) {
                // What went, from the index: its 16 KB body is not read back (no one uses it).
                let m = h.without_body();
                end = Some(d.record(
                    g,
                    &Record::MsgDelete {
                        recipient_id: rid,
                        msg_id,
                    },
                )?);
                d.release_dead_segments(g);
                deleted = Some(m);
            }
            (deleted, end)
        };
        // The next head, its pages brought in off the shard if cold (the owner runs nothing else
        // on this queue meanwhile).
        let next = if peek {
            self.warm_heads(&[rid]).await;
            self.data.borrow().head(rid)?
        } else {
            None
        };
        if let Some(end) = end {
            self.syncer.wait(g, end).await?;
        }
        Ok((deleted, next))
    }
}

impl ShardStore for JournalStore {
    fn open(s: &StoreSettings, groups: &[u32], now: i64) -> Result<Self, String> {
        JournalStore::open_groups(s, groups, now, s.durability)
    }

    fn all_opened(_s: &StoreSettings) -> Result<(), String> {
        Ok(())
    }

    async fn restore(&self, q: QueueData) -> Result<(), StoreError> {
        q.check()?;
        let QueueData { rec, msgs, ntfs } = q;
        let rid = rec.recipient_id.clone();
        let g = group_of(&rid);
        let nid = rec.notifier.as_ref().map(|n| n.notifier_id.clone());
        self.create(rec).await?;
        let end = {
            let mut d = self.data.borrow_mut();
            let mut end = None;
            for m in &msgs {
                let (flags, body) = flags_and_body(m);
                end = Some(d.record(
                    g,
                    &Record::MsgAppend {
                        recipient_id: &rid,
                        msg_id: m.msg_id(),
                        ts: m.ts(),
                        flags,
                        body,
                    },
                )?);
            }
            if let Some(nid) = &nid {
                for n in ntfs {
                    let bytes = encode_notification(&n);
                    end = Some(d.record(
                        g,
                        &Record::NtfAppend {
                            notifier_id: nid,
                            data: &bytes,
                        },
                    )?);
                }
            }
            end
        };
        if let Some(end) = end {
            self.syncer.wait(g, end).await?;
        }
        Ok(())
    }

    fn close(self, _s: &StoreSettings, _groups: &[u32]) -> Result<(), String> {
        self.close_groups()
    }

    /// Every group of a stopped relay, as it is: nothing dropped for its age, synced once at
    /// `close`.
    fn open_offline(s: &StoreSettings) -> Result<Self, String> {
        let s = StoreSettings {
            message_ttl_secs: i64::MAX,
            ntf_ttl_secs: i64::MAX,
            ..s.clone()
        };
        JournalStore::open_groups(&s, &super::all_groups(), 0, Durability::Never)
    }

    fn find_offline(s: &StoreSettings, id: &[u8]) -> Result<Option<QueueRec>, String> {
        let store = Self::open_offline(s)?;
        Ok(store
            .find_rec(|r| r.sender_id == id || r.link.as_ref().is_some_and(|l| l.link_id == id)))
    }

    fn set_status_offline(
        s: &StoreSettings,
        sender_id: &[u8],
        status: QueueStatus,
    ) -> Result<(), String> {
        let store = Self::open_offline(s)?;
        let rec = store
            .find_rec(|r| r.sender_id == sender_id)
            .ok_or_else(|| "no queue has this sender ID".to_string())?;
        futures_lite::future::block_on(store.update(QueueRec { status, ..rec }))
            .map_err(|e| e.to_string())?;
        store.close(s, &super::all_groups())
    }
}

impl<F: Fs> JournalStore<F> {
    /// A clean stop: everything synced, a checkpoint per changed group.
    pub(crate) fn close_groups(mut self) -> Result<(), String> {
        {
            let mut d = self.data.borrow_mut();
            d.finish_compaction();
            d.finish_checkpoints();
            d.background = None;
        }
        self.prefetcher.stop();
        // The sync thread syncs everything before it ends.
        self.syncer.stop();
        // Each group's checkpoint (which syncs its journal first), so that the next start loads
        // the state instead of replaying the journal.
        let d = self.data.borrow();
        for (g, j) in &d.journals {
            if d.groups.get(g).and_then(|grp| grp.ended_at_open) == Some(j.written()) {
                continue;
            }
            j.checkpoint_base()
                .write(
                    &d.checkpoint_blob(*g)
                        .map_err(|e| format!("journal checkpoint: {e}"))?,
                )
                .map_err(|e| format!("journal checkpoint: {e}"))?;
        }
        Ok(())
    }

    /// The first queue record `matches`, searched over every queue (offline tools only).
    fn find_rec(&self, matches: impl Fn(&QueueRec) -> bool) -> Option<QueueRec> {
        let d = self.data.borrow();
        d.groups.iter().find_map(|(g, grp)| {
            grp.queues
                .values()
                .filter_map(|q| d.read_record(*g, q).ok())
                .find(|r| matches(r))
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::memory::tests::{msg, ntf, rec};
    use futures_lite::future::block_on;
    use std::rc::Rc;

    pub(super) struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub(super) fn temp(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("smp-jstore-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    pub(super) fn settings(dir: &TempDir) -> StoreSettings {
        StoreSettings::for_tests(&dir.0)
    }

    pub(super) fn all() -> Vec<u32> {
        (0..crate::store::PARTITION_GROUPS).collect()
    }

    fn body(m: Option<Message>) -> Option<Vec<u8>> {
        match m? {
            Message::Message { body, .. } => Some(body.to_vec()),
            Message::Quota { .. } => Some(b"QUOTA".to_vec()),
        }
    }

    /// Queues, messages (the quota marker included), deletions and notifications survive a
    /// reopen exactly.
    #[test]
    fn what_was_written_is_there_after_a_reopen() {
        let dir = temp("reopen");
        let s = settings(&dir);
        let (a, b) = (vec![1u8; 24], vec![2u8; 24]);
        {
            let st = JournalStore::open(&s, &all(), 0).unwrap();
            let mut ra = rec(&a);
            ra.notifier = Some(Box::new(crate::store::NotifierCreds {
                notifier_id: vec![9; 24],
                notifier_key: ra.recipient_keys[0].clone(),
                rcv_ntf_dh_secret: [3; 32],
                ntf_service_id: None,
            }));
            block_on(st.create(ra)).unwrap();
            block_on(st.create(rec(&b))).unwrap();
            for i in 1..=3 {
                block_on(st.write(&a, msg(i, 100 + i64::from(i)), 2)).unwrap();
            }
            block_on(st.write(&b, msg(7, 100), 10)).unwrap();
            block_on(st.try_del(&b, msg(7, 100).msg_id())).unwrap();
            block_on(st.add_ntf(&[9; 24], ntf(1, 5))).unwrap();
            block_on(st.add_ntf(&[9; 24], ntf(2, 6))).unwrap();
            let (taken, more) = block_on(st.take_ntfs(&[9; 24], 1)).unwrap();
            assert_eq!((taken.len(), more), (1, true));
            st.close(&s, &all()).unwrap();
        }
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        let used: std::collections::HashSet<u32> = [group_of(&a), group_of(&b)].into();
        assert_eq!(
            st.activity().checkpoints_loaded as usize,
            used.len(),
            "a clean close left a checkpoint per group with records"
        );
        assert_eq!(st.queue_count(), 2);
        assert_eq!(st.size(&a), 3, "two messages and the quota marker");
        assert_eq!(st.size(&b), 0);
        assert_eq!(
            body(block_on(st.peek_first(&a)).unwrap()),
            body(Some(msg(1, 101)))
        );
        block_on(st.try_del(&a, msg(1, 101).msg_id())).unwrap();
        block_on(st.try_del(&a, msg(2, 102).msg_id())).unwrap();
        assert_eq!(
            body(block_on(st.peek_first(&a)).unwrap()),
            Some(b"QUOTA".to_vec())
        );
        let (left, more) = block_on(st.take_ntfs(&[9; 24], 10)).unwrap();
        assert_eq!(left, vec![ntf(2, 6)]);
        assert!(!more);
        assert_eq!(st.total_messages(), 1);
        // No clean close this time (as after a crash): the checkpoints of the last clean close
        // are loaded and the changes since replayed on top.
        block_on(st.write(&b, msg(8, 200), 10)).unwrap();
        block_on(st.delete(&a)).unwrap();
        drop(st);
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        assert_eq!(st.activity().checkpoints_loaded as usize, used.len());
        assert_eq!(
            st.queue_count(),
            1,
            "the deletion after the checkpoint is replayed"
        );
        assert_eq!(
            body(block_on(st.peek_first(&b)).unwrap()),
            body(Some(msg(8, 200)))
        );
        assert_eq!(st.total_messages(), 1);
        assert!(block_on(st.ntfs(&[9; 24])).unwrap().is_empty());
    }

    /// Segments whose records are all dead go, oldest first; without compaction (turned off
    /// here), a live record in the oldest segment keeps the later ones too, until it is rewritten
    /// (here: the queue record updated).
    #[test]
    fn dead_segments_are_removed_oldest_first() {
        let dir = temp("dead");
        let s = StoreSettings {
            durability: Durability::Never,
            ..settings(&dir)
        };
        let a = vec![5u8; 24];
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        st.data.borrow_mut().compaction_backoff = u64::MAX;
        block_on(st.create(rec(&a))).unwrap();
        let g = group_of(&a);
        // 64 MiB segments: ~16 KB bodies fill one in ~4,000 messages.
        let big = vec![7u8; 16_000];
        for i in 0..9_000u32 {
            let mut id = [0u8; 24];
            id[..4].copy_from_slice(&i.to_be_bytes());
            let m = Message::Message {
                msg_id: id,
                ts: 1,
                notification: false,
                body: Rc::from(&big[..]),
            };
            block_on(st.write(&a, m, 100)).unwrap();
            block_on(st.try_del(&a, &id)).unwrap();
        }
        let segments = || st.data.borrow().journals[&g].segments().len();
        assert!(
            segments() >= 3,
            "the queue record's segment holds the rest: {}",
            segments()
        );
        block_on(st.update(rec(&a))).unwrap();
        assert_eq!(segments(), 1, "only the active segment is left");
        st.close(&s, &all()).unwrap();
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        assert_eq!(st.queue_count(), 1);
        assert_eq!(st.size(&a), 0);
    }

    fn big_msg(i: u32, body: &[u8]) -> Message {
        let mut id = [0u8; 24];
        id[..4].copy_from_slice(&i.to_be_bytes());
        Message::Message {
            msg_id: id,
            ts: i64::from(i),
            notification: false,
            body: Rc::from(body),
        }
    }

    /// Bytes of the group's segment files that are not being appended to.
    fn inactive_bytes(st: &JournalStore, g: u32) -> u64 {
        let d = st.data.borrow();
        d.journals[&g]
            .segment_sizes()
            .filter(|s| !s.active)
            .map(|s| s.len)
            .sum()
    }

    /// A live record in an old segment (a queue's record, messages nobody received) no longer
    /// keeps the later segments: compaction moves it, and the messages stay in order, before and
    /// after a reopen.
    #[test]
    fn compaction_moves_old_live_records_and_keeps_message_order() {
        let dir = temp("compact");
        let s = StoreSettings {
            durability: Durability::Never,
            ..settings(&dir)
        };
        // Two queues of one group: `a` keeps a message in every thousand, `b` churns.
        let a = vec![5u8; 24];
        let g = group_of(&a);
        let b = (0..=255u8)
            .map(|x| vec![x; 24])
            .find(|b| *b != a && group_of(b) == g)
            .unwrap();
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        let mut ra = rec(&a);
        let nid = vec![9u8; 24];
        ra.notifier = Some(Box::new(crate::store::NotifierCreds {
            notifier_id: nid.clone(),
            notifier_key: ra.recipient_keys[0].clone(),
            rcv_ntf_dh_secret: [3; 32],
            ntf_service_id: None,
        }));
        block_on(st.create(ra)).unwrap();
        block_on(st.create(rec(&b))).unwrap();
        let body_for = |i: u32| vec![(i % 251) as u8; 16_000];
        let mut kept = Vec::new();
        for i in 0..9_000u32 {
            if i % 1000 == 0 {
                block_on(st.write(&a, big_msg(i, &body_for(i)), 100)).unwrap();
                block_on(st.add_ntf(&nid, ntf(i as u8, i64::from(i)))).unwrap();
                kept.push(i);
            }
            block_on(st.write(&b, big_msg(i, &body_for(i)), 100)).unwrap();
            block_on(st.try_del(&b, big_msg(i, &[]).msg_id())).unwrap();
        }
        st.data.borrow_mut().settle_compaction(g);
        let first = st.data.borrow().journals[&g].segments()[0].path.clone();
        let header = std::fs::read(&first).unwrap();
        assert_eq!(
            u32::from_le_bytes(header[60..64].try_into().unwrap()),
            smp_journal::SEGMENT_COMPACTED,
            "the oldest segment is a compacted one"
        );
        // 144 MB went through the group; without compaction `a`'s first message would keep all
        // of it.
        let left = inactive_bytes(&st, g);
        assert!(left < 4 << 20, "{left} bytes of inactive segments left");
        let bodies = |st: &JournalStore| -> Vec<Vec<u8>> {
            block_on(st.messages(&a))
                .unwrap()
                .into_iter()
                .map(|m| body(Some(m)).unwrap())
                .collect()
        };
        let want: Vec<Vec<u8>> = kept.iter().map(|&i| body_for(i)).collect();
        assert_eq!(bodies(&st), want, "read from their new places, in order");
        st.close(&s, &all()).unwrap();
        let st = JournalStore::open(&s, &all(), 0).unwrap();
        assert_eq!(st.queue_count(), 2);
        assert_eq!(st.size(&b), 0);
        assert_eq!(bodies(&st), want, "the same after a reopen");
        let ntfs: Vec<MsgNtf> = kept.iter().map(|&i| ntf(i as u8, i64::from(i))).collect();
        assert_eq!(
            block_on(st.ntfs(&nid)).unwrap(),
            ntfs,
            "and the notifications"
        );
        // Acknowledged in order, head by head.
        for &i in &kept {
            let head = block_on(st.peek_first(&a)).unwrap();
            assert_eq!(body(head), Some(body_for(i)));
            block_on(st.try_del(&a, big_msg(i, &[]).msg_id())).unwrap();
        }
        assert_eq!(st.size(&a), 0);
    }
}
