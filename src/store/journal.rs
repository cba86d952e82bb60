//! The journal store (`docs/ARCHITECTURE.md` §5): queues, messages and notifications of a shard's
//! partition groups in the memory-mapped journals of the `smp-journal` crate (`journal/`, its
//! format in `journal/FORMAT.md`), one journal per group under `<data-dir>/journal/`.
//!
//! Every change is a record appended to its queue's group journal before the call returns, so a
//! killed relay loses nothing it answered: the record is in the page cache. When it is on the disk
//! depends on the durability setting ([`Durability`]): after every batch of changes (the change's
//! call waits for the sync, which a sync thread runs for all changes waiting then: group commit),
//! every N milliseconds (the default, 50), or when the system writes the pages back. An OS crash or
//! power loss may lose what was not synced yet.
//!
//! In memory: each queue's record and, per message, its ID, time, flags and where its record is
//! ([`MsgEntry`]); bodies stay in the mapping and are read (and their CRC checked) when a head is
//! peeked. At start each group loads its checkpoint (written at a clean stop) and replays the records
//! after it, or replays everything when there is none that fits (`journal/checkpoint.rs`).
//!
//! Space: a segment is removed once it and every older segment of its group hold no live record
//! (a queue's latest record, a message not deleted, a stored notification); delete records in a
//! segment only ever kill records of the same or older segments, so removing the oldest segments
//! first never brings anything back. Oldest segments that hold mostly dead bytes are compacted in
//! the background (`journal/compaction.rs`). When the
//! journal cannot grow (a full disk, or the cap of `start --journal-max-size`), records that end
//! or shrink state go on in the active segment's reserve (`priority_of`) and the others answer
//! `ERR STORE` ([`NO_SPACE`], [`SIZE_CAP`]) with nothing recorded.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{BuildHasherDefault, DefaultHasher};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use smp_journal::{
    Fs, Journal, JournalError, Location, Options, OsFs, Priority, Record, SyncHandle, SyncPoint,
};

use super::codec::{decode_ntf, decode_rec, encode_ntf, encode_rec};
use super::memory::MAX_NTFS_PER_NOTIFIER;
use super::{
    group_of, EntityId, Message, MessageStore, MsgId, MsgNtf, QueueData, QueueRec, QueueStatus,
    QueueStore, ShardStore, StoreCounters, StoreError, StoreSettings, WriteOutcome,
};
use crate::protocol::encoding::Reader;

mod checkpoint;
mod compaction;
mod prefetch;
mod runner;
#[cfg(test)]
mod sim;
use compaction::Compaction;
use prefetch::Prefetcher;
pub(crate) use runner::Runner;

/// The store's maps hash with fixed keys: their keys are IDs the relay drew at random (no client
/// chooses them), and a fixed order of iteration makes the same calls write the same records in
/// the same order, which the storage fault simulator's seeds rely on.
type Map<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<DefaultHasher>>;

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

fn encode_queue_record(rec: &QueueRec) -> Vec<u8> {
    encoded(rec, encode_rec)
}

fn decode_queue_record(b: &[u8]) -> Result<QueueRec, String> {
    decoded(b, "queue record", decode_rec)
}

fn encode_notification(n: &MsgNtf) -> Vec<u8> {
    encoded(n, encode_ntf)
}

fn decode_notification(b: &[u8]) -> Result<MsgNtf, String> {
    decoded(b, "notification", decode_ntf)
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

/// A message as the index keeps it.
#[derive(Debug, Clone, Copy)]
struct MsgEntry {
    msg_id: MsgId,
    ts: i64,
    flags: u8,
    /// Bytes of its record in the journal.
    len: u32,
    loc: Location,
}

impl MsgEntry {
    fn is_quota(&self) -> bool {
        self.flags & FLAG_QUOTA != 0
    }
}

struct QueueEntry {
    rec: QueueRec,
    /// Its partition group (known at replay, so that reads need not hash the ID again).
    group: u8,
    /// The record that holds `rec` (its latest create or update), and its bytes.
    rec_loc: Location,
    rec_len: u32,
    msgs: VecDeque<MsgEntry>,
    /// As the memory store's: false once a quota marker was written, until the queue is empty.
    can_write: bool,
}

// A group number fits `QueueEntry::group`.
const _: () = assert!(smp_journal::JOURNAL_GROUPS <= 256);

struct NtfEntry {
    ntf: MsgNtf,
    loc: Location,
    len: u32,
}

/// Bytes of live records per segment of one group's journal (a record takes at least its
/// 32-byte header, so a segment with no live bytes holds no live record).
#[derive(Default)]
struct Live(BTreeMap<u64, u64>);

/// The journal store's sizes and thresholds. The relay uses [`Tuning::default`]; the storage
/// fault simulator makes them small, so that a few kilobytes of records exercise rotation,
/// retirement, compaction and checkpoints.
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
        }
    }
}

struct Data<F: Fs> {
    /// The compaction under way, if any (first, so that it is dropped, and its thread joined,
    /// before the journals' locks go).
    compaction: Option<Compaction<F>>,
    tuning: Tuning,
    runner: Runner,
    /// Records to append before a failed compaction is tried again.
    compaction_backoff: u64,
    /// Head records whose pages were brought into memory off the shard.
    prefetched: u64,
    /// Groups opened from their checkpoint.
    checkpoints_loaded: usize,
    /// Segments let go of as dead, and compactions installed, since open.
    segments_retired: u64,
    compactions: u64,
    /// The store's background thread, for segments to let go of off the shard.
    background: Option<flume::Sender<prefetch::Job<F>>>,
    /// Where each group's journal ended at open: a group still there at a clean close needs no
    /// new checkpoint.
    ended_at_open: Map<u32, SyncPoint>,
    queues: Map<EntityId, QueueEntry>,
    ntfs: Map<EntityId, VecDeque<NtfEntry>>,
    journals: Map<u32, Journal<F>>,
    live: Map<u32, Live>,
    /// Notifier ID → the group of its queue, where its notifications are recorded.
    notifiers: Map<EntityId, u32>,
    /// At open: messages replayed before any record of their queue (whose older records were
    /// retired or compacted away), waiting for the queue's record that follows them.
    parked: Map<EntityId, VecDeque<MsgEntry>>,
    /// At open: notifications replayed before the record that gave their notifier to a queue.
    parked_ntfs: Map<EntityId, VecDeque<NtfEntry>>,
    /// Groups whose journal could not grow, with the segment that was active then: logged once,
    /// and again when an append goes to a later segment.
    full_groups: Map<u32, u64>,
    total_messages: usize,
    counters: StoreCounters,
}

impl<F: Fs> Data<F> {
    fn new(tuning: Tuning, runner: Runner) -> Self {
        Data {
            compaction: None,
            tuning,
            runner,
            compaction_backoff: 0,
            prefetched: 0,
            checkpoints_loaded: 0,
            segments_retired: 0,
            compactions: 0,
            background: None,
            ended_at_open: Map::default(),
            queues: Map::default(),
            ntfs: Map::default(),
            journals: Map::default(),
            live: Map::default(),
            notifiers: Map::default(),
            parked: Map::default(),
            parked_ntfs: Map::default(),
            full_groups: Map::default(),
            total_messages: 0,
            counters: StoreCounters::default(),
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

fn failed(e: JournalError) -> StoreError {
    match e {
        JournalError::NoSpace { .. } => StoreError::Failed(NO_SPACE.into()),
        JournalError::SizeCap { .. } => StoreError::Failed(SIZE_CAP.into()),
        e => StoreError::Failed(format!("journal: {e}")),
    }
}

/// How a record may use its segment (`journal/FORMAT.md`, "Space"): records that end or shrink
/// state go on in the segment's reserve when the journal cannot grow, so that on a full disk ACK,
/// DEL, the daily queue-record touch of SUB and the other queue updates keep working while SEND
/// (messages, notifications) and NEW (queue records) answer `ERR STORE`.
fn priority_of(rec: &Record<'_>) -> Priority {
    match rec {
        Record::QueueUpdate { .. }
        | Record::QueueDelete { .. }
        | Record::MsgDelete { .. }
        | Record::NtfDelete { .. }
        | Record::NtfClear { .. } => Priority::Release,
        Record::QueueCreate { .. }
        | Record::MsgAppend { .. }
        | Record::NtfAppend { .. }
        | Record::Checkpoint { .. } => Priority::Ordinary,
    }
}

impl Live {
    fn add(&mut self, segment: u64, bytes: u32) {
        *self.0.entry(segment).or_insert(0) += u64::from(bytes);
    }

    fn sub(&mut self, segment: u64, bytes: u32) {
        if let Some(e) = self.0.get_mut(&segment) {
            *e = e.saturating_sub(u64::from(bytes));
        }
    }

    fn bytes(&self, segment: u64) -> u64 {
        self.0.get(&segment).copied().unwrap_or(0)
    }
}

impl<F: Fs> Data<F> {
    fn live(&mut self, g: u32) -> &mut Live {
        self.live.entry(g).or_default()
    }

    /// Appends `rec` to the journal of group `g`. When the journal cannot grow, the operator is
    /// told once (and again once it grew).
    fn append(
        &mut self,
        g: u32,
        rec: &Record<'_>,
        priority: Priority,
    ) -> Result<(Location, SyncPoint), StoreError> {
        let j = self
            .journals
            .get_mut(&g)
            .ok_or_else(|| StoreError::Failed(format!("group {g} is not this shard's")))?;
        let active = j.written().segment;
        match j.append_with(rec, priority) {
            Ok(a) => {
                if self.full_groups.get(&g).is_some_and(|&s| a.loc.segment > s) {
                    self.full_groups.remove(&g);
                    tracing::info!(group = g, "the journal has room again");
                }
                Ok((a.loc, a.end))
            }
            Err(e) => {
                if e.is_out_of_space() && self.full_groups.insert(g, active).is_none() {
                    tracing::warn!(
                        group = g,
                        error = %e,
                        "the journal cannot grow: SEND and NEW answer ERR STORE, deletes use the \
                         segment's reserve until that is full; free disk space or raise \
                         --journal-max-size"
                    );
                }
                Err(failed(e))
            }
        }
    }

    /// Appends `rec` to group `g` and applies it to the index exactly as the replay at start does,
    /// so that what a restart rebuilds is what was served. Returns the point that makes it durable.
    fn record(&mut self, g: u32, rec: &Record<'_>) -> Result<SyncPoint, StoreError> {
        self.record_with(g, rec, priority_of(rec))
    }

    /// As `record`, with the priority given instead of the record kind's.
    fn record_with(
        &mut self,
        g: u32,
        rec: &Record<'_>,
        priority: Priority,
    ) -> Result<SyncPoint, StoreError> {
        let (loc, end) = self.append(g, rec, priority)?;
        self.replay(g, loc, *rec)
            .map_err(|e| StoreError::Failed(format!("journal: {e}")))?;
        self.compaction_step();
        Ok(end)
    }

    /// Removes the oldest segments of group `g` while they hold no live record (never the active
    /// one).
    fn release_dead_segments(&mut self, g: u32) {
        let Some(j) = self.journals.get_mut(&g) else {
            return;
        };
        let live = self.live.entry(g).or_default();
        let dead: Vec<u64> = j
            .segment_sizes()
            .take_while(|s| !s.active && live.bytes(s.id) == 0)
            .map(|s| s.id)
            .collect();
        let mut retired = Vec::new();
        for id in dead {
            match j.remove_segment(id) {
                Ok(r) => retired.push(r),
                Err(_) => break,
            }
            self.segments_retired += 1;
            live.0.remove(&id);
        }
        for r in retired {
            self.retire(r);
        }
        self.consider_compaction(g);
    }

    /// Replays one record of group `g` into the index.
    fn replay(&mut self, g: u32, loc: Location, rec: Record<'_>) -> Result<(), String> {
        let len = rec.stored_len() as u32;
        match rec {
            Record::QueueCreate { recipient_id, data }
            | Record::QueueUpdate { recipient_id, data } => {
                let rec = decode_queue_record(data)?;
                if rec.recipient_id != recipient_id {
                    return Err("a queue record under another recipient ID".into());
                }
                let old_nid = self
                    .queues
                    .get(recipient_id)
                    .and_then(|q| q.rec.notifier.as_ref().map(|n| n.notifier_id.clone()));
                let new_nid = rec.notifier.as_ref().map(|n| &n.notifier_id);
                if let Some(old) = old_nid.filter(|o| Some(o) != new_nid) {
                    // A replaced or removed notifier's notifications go with it.
                    self.notifiers.remove(&old);
                    self.clear_ntfs(g, &old);
                }
                if let Some(n) = &rec.notifier {
                    self.notifiers.insert(n.notifier_id.clone(), g);
                    if let Some(parked) = self.parked_ntfs.remove(&n.notifier_id) {
                        for e in parked {
                            self.push_ntf(g, &n.notifier_id, e.ntf, e.loc, e.len);
                        }
                    }
                }
                match self.queues.get_mut(recipient_id) {
                    Some(q) => {
                        let (old, old_len) = (q.rec_loc.segment, q.rec_len);
                        q.rec = rec;
                        q.rec_loc = loc;
                        q.rec_len = len;
                        self.live(g).sub(old, old_len);
                    }
                    None => {
                        let msgs = self.parked.remove(recipient_id).unwrap_or_default();
                        let can_write = msgs.back().is_none_or(|m| !m.is_quota());
                        self.total_messages += msgs.len();
                        for m in &msgs {
                            self.live(g).add(m.loc.segment, m.len);
                        }
                        self.queues.insert(
                            recipient_id.to_vec(),
                            QueueEntry {
                                rec,
                                group: g as u8,
                                rec_loc: loc,
                                rec_len: len,
                                msgs,
                                can_write,
                            },
                        );
                    }
                }
                self.live(g).add(loc.segment, len);
            }
            Record::QueueDelete { recipient_id } => {
                self.parked.remove(recipient_id);
                self.forget_queue(g, recipient_id)
            }
            Record::MsgAppend {
                recipient_id,
                msg_id,
                ts,
                flags,
                ..
            } => {
                let Some(q) = self.queues.get_mut(recipient_id) else {
                    self.parked
                        .entry(recipient_id.to_vec())
                        .or_default()
                        .push_back(MsgEntry {
                            msg_id: *msg_id,
                            ts,
                            flags,
                            len,
                            loc,
                        });
                    return Ok(());
                };
                q.msgs.push_back(MsgEntry {
                    msg_id: *msg_id,
                    ts,
                    flags,
                    len,
                    loc,
                });
                q.can_write = flags & FLAG_QUOTA == 0;
                self.total_messages += 1;
                self.live(g).add(loc.segment, len);
            }
            Record::MsgDelete {
                recipient_id,
                msg_id,
            } => {
                if let Some(p) = self.parked.get_mut(recipient_id) {
                    p.retain(|m| &m.msg_id != msg_id);
                }
                self.remove_msg(g, recipient_id, msg_id);
            }
            Record::NtfAppend { notifier_id, data } => {
                let ntf = decode_notification(data)?;
                if self.notifiers.contains_key(notifier_id) {
                    self.push_ntf(g, notifier_id, ntf, loc, len);
                } else {
                    self.parked_ntfs
                        .entry(notifier_id.to_vec())
                        .or_default()
                        .push_back(NtfEntry { ntf, loc, len });
                }
            }
            Record::NtfDelete {
                notifier_id,
                msg_id,
            } => {
                if let Some(p) = self.parked_ntfs.get_mut(notifier_id) {
                    p.retain(|n| &n.ntf.msg_id != msg_id);
                }
                self.remove_ntf(g, notifier_id, msg_id)
            }
            Record::NtfClear { notifier_id } => {
                self.parked_ntfs.remove(notifier_id);
                self.clear_ntfs(g, notifier_id);
            }
            Record::Checkpoint { .. } => {}
        }
        Ok(())
    }

    fn forget_queue(&mut self, g: u32, rid: &[u8]) {
        let Some(q) = self.queues.remove(rid) else {
            return;
        };
        self.total_messages -= q.msgs.len();
        let live = self.live(g);
        live.sub(q.rec_loc.segment, q.rec_len);
        for m in &q.msgs {
            live.sub(m.loc.segment, m.len);
        }
        if let Some(n) = &q.rec.notifier {
            self.notifiers.remove(&n.notifier_id);
            self.clear_ntfs(g, &n.notifier_id.clone());
        }
    }

    /// Removes message `msg_id` of queue `rid` from the index (normally its head).
    fn remove_msg(&mut self, g: u32, rid: &[u8], msg_id: &MsgId) -> Option<MsgEntry> {
        let q = self.queues.get_mut(rid)?;
        let i = q.msgs.iter().position(|m| &m.msg_id == msg_id)?;
        let m = q.msgs.remove(i)?;
        if q.msgs.is_empty() {
            q.can_write = true;
        }
        self.total_messages -= 1;
        self.live(g).sub(m.loc.segment, m.len);
        Some(m)
    }

    fn push_ntf(&mut self, g: u32, nid: &[u8], ntf: MsgNtf, loc: Location, len: u32) {
        let list = self.ntfs.entry(nid.to_vec()).or_default();
        let dropped = if list.len() >= MAX_NTFS_PER_NOTIFIER {
            list.pop_front()
        } else {
            None
        };
        list.push_back(NtfEntry { ntf, loc, len });
        let live = self.live(g);
        live.add(loc.segment, len);
        if let Some(d) = dropped {
            live.sub(d.loc.segment, d.len);
        }
    }

    fn remove_ntf(&mut self, g: u32, nid: &[u8], msg_id: &MsgId) {
        let Some(list) = self.ntfs.get_mut(nid) else {
            return;
        };
        let Some(i) = list.iter().position(|n| &n.ntf.msg_id == msg_id) else {
            return;
        };
        let n = list.remove(i);
        if list.is_empty() {
            self.ntfs.remove(nid);
        }
        if let Some(n) = n {
            self.live(g).sub(n.loc.segment, n.len);
        }
    }

    fn clear_ntfs(&mut self, g: u32, nid: &[u8]) -> usize {
        let Some(list) = self.ntfs.remove(nid) else {
            return 0;
        };
        let live = self.live(g);
        for n in &list {
            live.sub(n.loc.segment, n.len);
        }
        list.len()
    }

    /// The message at the head of `rid`, its body read from the journal.
    fn head(&self, rid: &[u8]) -> Result<Option<Message>, StoreError> {
        let Some(q) = self.queues.get(rid) else {
            return Ok(None);
        };
        let Some(m) = q.msgs.front() else {
            return Ok(None);
        };
        self.message(u32::from(q.group), m).map(Some)
    }

    /// Message `m` of a queue of group `g`.
    fn message(&self, g: u32, m: &MsgEntry) -> Result<Message, StoreError> {
        if m.is_quota() {
            return Ok(Message::Quota {
                msg_id: m.msg_id,
                ts: m.ts,
            });
        }
        let j = self
            .journals
            .get(&g)
            .ok_or_else(|| StoreError::Failed(format!("group {g} is not this shard's")))?;
        match j.read(m.loc).map_err(failed)? {
            (_, Record::MsgAppend { body, .. }) => Ok(Message::Message {
                msg_id: m.msg_id,
                ts: m.ts,
                notification: m.flags & FLAG_NOTIFICATION != 0,
                body: Rc::from(body),
            }),
            _ => Err(StoreError::Failed(
                "journal: a message's record is not a message".into(),
            )),
        }
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

/// The shard's sync thread (none for `Never`; none either when the store's work is run by hand,
/// which syncs inline: every batch in `wait`, every interval in `tick`).
struct Syncer<F: Fs> {
    durability: Durability,
    tx: Option<flume::Sender<SyncReq>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The handles, when there is no thread.
    inline: Option<Map<u32, SyncHandle<F>>>,
}

enum SyncReq {
    /// Sync group `.0` to `.1`, then answer.
    To(u32, SyncPoint, flume::Sender<Result<(), String>>),
    Stop,
}

impl<F: Fs> Syncer<F> {
    fn start(durability: Durability, handles: Vec<(u32, SyncHandle<F>)>, runner: &Runner) -> Self {
        if durability == Durability::Never || runner.is_manual() {
            return Syncer {
                durability,
                tx: None,
                thread: None,
                inline: runner.is_manual().then(|| handles.into_iter().collect()),
            };
        }
        let (tx, rx) = flume::unbounded::<SyncReq>();
        let handles: Arc<Map<u32, SyncHandle<F>>> = Arc::new(handles.into_iter().collect());
        let thread = std::thread::Builder::new()
            .name("journal-sync".into())
            .spawn(move || sync_thread(durability, &handles, &rx))
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
    fn tick(&self) {
        if let (Durability::Interval(_), Some(handles)) = (self.durability, &self.inline) {
            for (g, h) in handles {
                if let Err(e) = h.sync_all() {
                    tracing::warn!(group = g, error = %e, "journal sync failed");
                }
            }
        }
    }

    /// Waits until group `g` is durable up to `upto` (only with `EveryBatch`).
    async fn wait(&self, g: u32, upto: SyncPoint) -> Result<(), StoreError> {
        if self.durability != Durability::EveryBatch {
            return Ok(());
        }
        if let Some(h) = self.inline.as_ref().and_then(|hs| hs.get(&g)) {
            return h
                .sync_to(upto)
                .map(|_| ())
                .map_err(|e| StoreError::Failed(format!("journal sync: {e}")));
        }
        let Some(tx) = &self.tx else {
            return Ok(());
        };
        let (done_tx, done_rx) = flume::bounded(1);
        tx.send(SyncReq::To(g, upto, done_tx))
            .map_err(|_| StoreError::Failed("journal: the sync thread stopped".into()))?;
        match done_rx.recv_async().await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Failed(format!("journal sync: {e}"))),
            Err(_) => Err(StoreError::Failed(
                "journal: the sync thread stopped".into(),
            )),
        }
    }

    fn stop(&mut self) {
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

/// Every-batch: takes every waiting request, syncs each group once to the furthest point asked,
/// answers them all (group commit). Interval: syncs every group each period.
fn sync_thread<F: Fs>(
    durability: Durability,
    handles: &Map<u32, SyncHandle<F>>,
    rx: &flume::Receiver<SyncReq>,
) {
    let sync_all = || {
        for (g, h) in handles {
            if let Err(e) = h.sync_all() {
                tracing::warn!(group = g, error = %e, "journal sync failed");
            }
        }
    };
    loop {
        let first = match durability {
            Durability::Interval(every) => match rx.recv_timeout(every) {
                Ok(r) => r,
                Err(flume::RecvTimeoutError::Timeout) => {
                    sync_all();
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
            sync_all();
            return;
        }
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
        JournalStore::open_on(
            OsFs,
            s,
            groups,
            now,
            durability,
            Tuning::default(),
            Runner::Threads,
        )
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
        for &g in groups {
            // Both callbacks build `data`: the checkpoint's (if one is used) first.
            let cell = RefCell::new(&mut data);
            let (journal, report) = Journal::open_from_checkpoint(
                &root,
                g,
                &opts,
                |cp| cell.borrow_mut().load_checkpoint(g, &cp.blob),
                |loc, _seq, rec| cell.borrow_mut().replay(g, loc, rec),
            )
            .map_err(|e| e.to_string())?;
            for w in &report.warnings {
                tracing::warn!("{w}");
            }
            // An empty group, or one opened from a checkpoint at its end, is already as cheap
            // to open as it gets.
            let empty = report.records == 0 && report.checkpoint.is_none();
            if empty || report.checkpoint == Some(report.written) {
                data.ended_at_open.insert(g, report.written);
            }
            handles.push((g, journal.sync_handle()));
            data.journals.insert(g, journal);
        }
        // What is still parked has no queue: its queue's records were all dead.
        data.parked.clear();
        data.parked_ntfs.clear();
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
}

impl<F: Fs> QueueStore for JournalStore<F> {
    fn with_queue<R>(&self, recipient_id: &[u8], f: impl FnOnce(&QueueRec) -> R) -> Option<R> {
        self.data
            .borrow()
            .queues
            .get(recipient_id)
            .map(|q| f(&q.rec))
    }

    fn for_each_queue(&self, f: &mut dyn FnMut(&QueueRec)) {
        self.data.borrow().queues.values().for_each(|q| f(&q.rec));
    }

    fn queue_count(&self) -> usize {
        self.data.borrow().queues.len()
    }

    async fn create(&self, rec: QueueRec) -> Result<(), StoreError> {
        let g = group_of(&rec.recipient_id);
        let end = {
            let mut d = self.data.borrow_mut();
            if d.queues.contains_key(&rec.recipient_id) {
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
            if !d.queues.contains_key(&rec.recipient_id) {
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
            let Some(rec) = d.queues.get(recipient_id).map(|q| q.rec.clone()) else {
                return Err(StoreError::NotFound);
            };
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
            d.counters.writes += 1;
            let q = d.queues.get(recipient_id).ok_or(StoreError::NotFound)?;
            let was_empty = q.msgs.is_empty();
            if !(q.can_write || was_empty) {
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
        d.counters.peek_first += 1;
        d.head(recipient_id)
    }

    async fn peek_first_many(
        &self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        self.warm_heads(recipient_ids).await;
        let mut d = self.data.borrow_mut();
        d.counters.peek_first_many += 1;
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
        d.queues.get(recipient_id).map_or(0, |q| q.msgs.len())
    }

    fn total_messages(&self) -> usize {
        self.data.borrow().total_messages
    }

    fn expiry_candidates(&self) -> Vec<EntityId> {
        self.data.borrow().queues.keys().cloned().collect()
    }

    async fn expire_all(&self, older_than: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut ends: Map<u32, SyncPoint> = Map::default();
        {
            let mut d = self.data.borrow_mut();
            // In the order of their IDs: the records of one call go in a defined order.
            let mut rids: Vec<EntityId> = d.queues.keys().cloned().collect();
            rids.sort_unstable();
            for rid in rids {
                let g = group_of(&rid);
                let (k, end) = d.expire_queue(g, &rid, older_than)?;
                n += k;
                if let Some(e) = end {
                    let f = ends.entry(g).or_default();
                    *f = (*f).max(e);
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
            let taken: Vec<MsgNtf> = match d.ntfs.get(notifier_id) {
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
            let more = d.ntfs.get(notifier_id).is_some_and(|l| !l.is_empty());
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
        // its new order (returns are rare: a connection closed with NMSGs unwritten).
        let end = {
            let mut d = self.data.borrow_mut();
            let mut list: Vec<MsgNtf> = ntfs;
            if let Some(kept) = d.ntfs.get(notifier_id) {
                list.extend(kept.iter().map(|n| n.ntf.clone()));
            }
            // Ordinary, not the reserve: the clear is the start of a rewrite, whose appends would
            // fail after it when the journal cannot grow.
            let mut end =
                d.record_with(g, &Record::NtfClear { notifier_id }, Priority::Ordinary)?;
            let skip = list.len().saturating_sub(MAX_NTFS_PER_NOTIFIER);
            for n in list.into_iter().skip(skip) {
                let bytes = encode_notification(&n);
                end = d.record(
                    g,
                    &Record::NtfAppend {
                        notifier_id,
                        data: &bytes,
                    },
                )?;
            }
            end
        };
        self.syncer.wait(g, end).await
    }

    async fn delete_ntfs(&self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        let Some(g) = self.notifier_group(notifier_id) else {
            return Ok(0);
        };
        let (n, end) = {
            let mut d = self.data.borrow_mut();
            if !d.ntfs.contains_key(notifier_id) {
                return Ok(0);
            }
            let n = d.ntfs.get(notifier_id).map_or(0, VecDeque::len);
            let end = d.record(g, &Record::NtfClear { notifier_id })?;
            d.release_dead_segments(g);
            (n, end)
        };
        self.syncer.wait(g, end).await?;
        Ok(n)
    }

    fn ntf_count(&self) -> usize {
        self.data.borrow().ntfs.values().map(|l| l.len()).sum()
    }

    fn ntf_ids(&self) -> Vec<EntityId> {
        let d = self.data.borrow();
        d.ntfs
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    async fn expire_ntfs(&self, older_than: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        let mut ends: Map<u32, SyncPoint> = Map::default();
        {
            let mut d = self.data.borrow_mut();
            let mut old: Vec<(EntityId, MsgId)> = d
                .ntfs
                .iter()
                .flat_map(|(nid, l)| {
                    l.iter()
                        .filter(|e| e.ntf.ts < older_than)
                        .map(|e| (nid.clone(), e.ntf.msg_id))
                })
                .collect();
            // By notifier ID, each notifier's oldest first: a defined order.
            old.sort_by(|a, b| a.0.cmp(&b.0));
            for (nid, msg_id) in old {
                let Some(g) = notifier_group_in(&d, &nid) else {
                    continue;
                };
                let e = d.record(
                    g,
                    &Record::NtfDelete {
                        notifier_id: &nid,
                        msg_id: &msg_id,
                    },
                )?;
                n += 1;
                let f = ends.entry(g).or_default();
                *f = (*f).max(e);
            }
        }
        for (g, end) in ends {
            self.syncer.wait(g, end).await?;
        }
        Ok(n)
    }

    async fn messages(&self, recipient_id: &[u8]) -> Result<Vec<Message>, StoreError> {
        let d = self.data.borrow();
        let Some(q) = d.queues.get(recipient_id) else {
            return Ok(Vec::new());
        };
        let g = u32::from(q.group);
        q.msgs.iter().map(|m| d.message(g, m)).collect()
    }

    async fn ntfs(&self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError> {
        let d = self.data.borrow();
        Ok(d.ntfs
            .get(notifier_id)
            .map(|l| l.iter().map(|n| n.ntf.clone()).collect())
            .unwrap_or_default())
    }

    fn counters(&self) -> StoreCounters {
        self.data.borrow().counters.clone()
    }
}

/// The group whose journal holds a notifier's notifications: its queue's. Notifications of a
/// notifier no queue of this store has are not kept.
fn notifier_group_in<F: Fs>(d: &Data<F>, nid: &[u8]) -> Option<u32> {
    d.notifiers.get(nid).copied()
}

impl<F: Fs> JournalStore<F> {
    fn notifier_group(&self, nid: &[u8]) -> Option<u32> {
        notifier_group_in(&self.data.borrow(), nid)
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
            d.counters.deletes += 1;
            let head = d.queues.get(rid).and_then(|q| q.msgs.front()).copied();
            let mut deleted = None;
            let mut end = None;
            if let Some(h) = head.filter(|h| &h.msg_id == msg_id) {
                let m = d.message(g, &h)?;
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

impl<F: Fs> Data<F> {
    /// Deletes the expired head messages of `rid` (never the quota marker); returns how many, and
    /// the point that makes the deletions durable.
    fn expire_queue(
        &mut self,
        g: u32,
        rid: &[u8],
        older_than: i64,
    ) -> Result<(usize, Option<SyncPoint>), StoreError> {
        let mut n = 0;
        let mut end = None;
        while let Some(h) = self.queues.get(rid).and_then(|q| q.msgs.front()).copied() {
            if h.is_quota() || h.ts >= older_than {
                break;
            }
            end = Some(self.record(
                g,
                &Record::MsgDelete {
                    recipient_id: rid,
                    msg_id: &h.msg_id,
                },
            )?);
            n += 1;
        }
        if n > 0 {
            self.release_dead_segments(g);
        }
        Ok((n, end))
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
        self.data.borrow_mut().finish_compaction();
        self.data.borrow_mut().background = None;
        self.prefetcher.stop();
        // The sync thread syncs everything before it ends.
        self.syncer.stop();
        // Each group's checkpoint (which syncs its journal first), so that the next start loads
        // the state instead of replaying the journal.
        let d = self.data.borrow();
        let mut blobs = d.checkpoint_blobs();
        for (g, j) in &d.journals {
            if d.ended_at_open.get(g) == Some(&j.written()) {
                continue;
            }
            let blob = blobs.remove(g).unwrap_or_default();
            j.checkpoint_base()
                .write(&blob)
                .map_err(|e| format!("journal checkpoint: {e}"))?;
        }
        Ok(())
    }

    /// The first queue record `matches`, searched over every queue (offline tools only).
    fn find_rec(&self, matches: impl Fn(&QueueRec) -> bool) -> Option<QueueRec> {
        let d = self.data.borrow();
        d.queues
            .values()
            .map(|q| &q.rec)
            .find(|r| matches(r))
            .cloned()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::memory::tests::{msg, ntf, rec};
    use futures_lite::future::block_on;

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
        StoreSettings {
            data_dir: dir.0.clone(),
            keep: crate::store::Keep::ALL,
            message_ttl_secs: i64::MAX,
            ntf_ttl_secs: i64::MAX,
            test_delay: None,
            durability: Durability::EveryBatch,
            journal_budget: None,
            postgres: None,
        }
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
            st.data.borrow().checkpoints_loaded,
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
        assert_eq!(st.data.borrow().checkpoints_loaded, used.len());
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
