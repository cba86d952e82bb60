//! The journal store's index (`docs/ARCHITECTURE.md` §5): per partition group, its journal, its
//! queues (each record, and per message its ID, time, flags and the location of its record) and
//! its notification lists, with the bytes of live records per segment. Every change is a record
//! appended to the group's journal and then applied here by [`Data::replay`], the same function
//! that rebuilds the index at start, so that a restart rebuilds exactly what was served.
//!
//! Replay rules (the state is a function of the records in the segments left, whichever were
//! removed as dead or compacted, `journal/FORMAT.md` "Recovery"):
//! - a queue record (create or update) creates the queue or replaces its record; a notifier it
//!   replaces or removes takes its notifications along;
//! - a message or notification whose queue (notifier) is unknown yet is parked until the record
//!   that names it: its queue's older records may have been removed as dead; at the end of the
//!   replay what is still parked belongs to no queue and is dropped;
//! - a message append (notification append) whose queue (list) holds a record at the same or a
//!   later location is already there: a checkpoint made in steps while records were appended
//!   (`checkpoint.rs`) holds some changes after its point, and the replay from the point meets
//!   them again. Every other record is idempotent.

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use smp_journal::{Fs, Journal, Location, Priority, Record, SyncPoint};

use super::{
    decode_notification, decode_queue_record, failed, record_ids, Data, Map, Runner, Tuning,
    FLAG_NOTIFICATION, FLAG_QUOTA,
};
use crate::store::id::IdKey;
use crate::store::memory::MAX_NTFS_PER_NOTIFIER;
use crate::store::{
    group_of, EntityId, Message, MsgId, MsgNtf, QueueRec, StoreCounters, StoreError,
};

/// A message as the index keeps it.
#[derive(Debug, Clone, Copy)]
pub(super) struct MsgEntry {
    pub msg_id: MsgId,
    pub ts: i64,
    pub flags: u8,
    /// Bytes of its record in the journal.
    pub len: u32,
    pub loc: Location,
}

impl MsgEntry {
    pub fn is_quota(&self) -> bool {
        self.flags & FLAG_QUOTA != 0
    }

    /// The message as the index knows it, its body left empty: what a deletion reports
    /// (`MessageStore::try_del`), without reading its record.
    pub fn without_body(&self) -> Message {
        if self.is_quota() {
            Message::Quota {
                msg_id: self.msg_id,
                ts: self.ts,
            }
        } else {
            Message::Message {
                msg_id: self.msg_id,
                ts: self.ts,
                notification: self.flags & FLAG_NOTIFICATION != 0,
                body: Rc::from(&[][..]),
            }
        }
    }
}

/// A queue as the index keeps it: where its record is, not the record (read from the mapping when
/// used, `RecordCache`), so that an idle queue costs the index a few dozen bytes.
pub(super) struct QueueEntry {
    /// The record that holds the queue's record (its latest create or update), and its bytes.
    pub rec_loc: Location,
    pub rec_len: u32,
    pub msgs: Msgs,
    /// The record's notifier ID, if it has a notifier: its notifications go when it is replaced
    /// or the queue deleted.
    pub notifier: Option<Box<IdKey>>,
}

impl QueueEntry {
    /// As the memory store's rule: a queue whose last message is the quota marker takes no
    /// message until it is empty (the marker is always last: nothing is written after it).
    pub fn can_write(&self) -> bool {
        !self.msgs.back().is_some_and(MsgEntry::is_quota)
    }
}

/// A queue's messages: no allocation while it has none (most queues, most of the time), and 8
/// bytes in the entry instead of an empty `VecDeque`'s 32.
#[derive(Default)]
#[allow(clippy::box_collection)]
pub(super) struct Msgs(Option<Box<VecDeque<MsgEntry>>>);

static NO_MSGS: VecDeque<MsgEntry> = VecDeque::new();

impl std::ops::Deref for Msgs {
    type Target = VecDeque<MsgEntry>;
    fn deref(&self) -> &VecDeque<MsgEntry> {
        self.0.as_deref().unwrap_or(&NO_MSGS)
    }
}

impl From<VecDeque<MsgEntry>> for Msgs {
    fn from(q: VecDeque<MsgEntry>) -> Self {
        Msgs((!q.is_empty()).then(|| Box::new(q)))
    }
}

impl Msgs {
    pub fn push_back(&mut self, m: MsgEntry) {
        self.0.get_or_insert_with(Default::default).push_back(m);
    }

    /// Removes the message at `i`; the last one gives the allocation back.
    pub fn remove(&mut self, i: usize) -> Option<MsgEntry> {
        let q = self.0.as_mut()?;
        let m = q.remove(i);
        if q.is_empty() {
            self.0 = None;
        }
        m
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut MsgEntry> {
        self.0.iter_mut().flat_map(|q| q.iter_mut())
    }
}

pub(super) struct NtfEntry {
    pub ntf: MsgNtf,
    pub loc: Location,
    pub len: u32,
}

/// Bytes of live records per segment of one group's journal (a record takes at least its
/// 32-byte header, so a segment with no live bytes holds no live record).
#[derive(Default)]
pub(super) struct Live(pub BTreeMap<u64, u64>);

impl Live {
    pub fn add(&mut self, segment: u64, bytes: u32) {
        *self.0.entry(segment).or_insert(0) += u64::from(bytes);
    }

    pub fn sub(&mut self, segment: u64, bytes: u32) {
        if let Some(e) = self.0.get_mut(&segment) {
            debug_assert!(
                *e >= u64::from(bytes),
                "live bytes of segment {segment} below 0"
            );
            *e = e.saturating_sub(u64::from(bytes));
        }
    }

    pub fn bytes(&self, segment: u64) -> u64 {
        self.0.get(&segment).copied().unwrap_or(0)
    }
}

/// What the records of one partition group say (its journal is [`Data::journals`]'). Queues and
/// notification lists are ordered by ID, so that a checkpoint can walk them in steps while they
/// change.
#[derive(Default)]
pub(super) struct GroupIndex {
    pub live: Live,
    pub queues: BTreeMap<IdKey, QueueEntry>,
    /// Notification lists by notifier ID (the notifier of a queue of this group).
    pub ntfs: BTreeMap<EntityId, VecDeque<NtfEntry>>,
    /// The segment that was active when the journal could not grow (logged once, and again when
    /// an append goes to a later segment).
    pub full_at: Option<u64>,
    /// Where the journal ended at open, when the state came whole from a checkpoint there (or
    /// the group is empty): a clean stop with nothing appended since needs no new checkpoint.
    pub ended_at_open: Option<SyncPoint>,
    /// Records appended since the last checkpoint of the group began.
    pub since_checkpoint: Since,
    /// The group's sync failed: logged once.
    pub sync_failure_logged: bool,
}

/// Records, and their bytes, since a group's last checkpoint began.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Since {
    pub records: u64,
    pub bytes: u64,
}

impl Since {
    pub fn add(&mut self, records: u64, bytes: u64) {
        self.records += records;
        self.bytes += bytes;
    }

    /// Whether a checkpoint is due (`Tuning::checkpoint_records`, `checkpoint_bytes`).
    pub fn due(&self, t: &Tuning) -> bool {
        self.records >= t.checkpoint_records || self.bytes >= t.checkpoint_bytes
    }

    /// Makes a checkpoint due at once (the last one is stale).
    pub fn force(&mut self) {
        self.records = u64::MAX / 2;
    }
}

/// What the store did, for the metrics and the tests.
#[derive(Debug, Default, Clone)]
pub(crate) struct Activity {
    /// Head records whose pages were brought into memory off the shard.
    pub prefetched: u64,
    /// Groups opened from their checkpoint.
    pub checkpoints_loaded: u64,
    /// Segments let go of as dead, compactions installed, checkpoints written while running.
    pub segments_retired: u64,
    pub compactions: u64,
    pub checkpoints_written: u64,
}

/// How a record may use its segment (`journal/FORMAT.md`, "Space"): records that end or shrink
/// state go on in the segment's reserve when the journal cannot grow, so that on a full disk ACK,
/// DEL, the daily queue-record touch of SUB and the other queue updates keep working while SEND
/// (messages, notifications) and NEW (queue records) answer `ERR STORE`.
pub(super) fn priority_of(rec: &Record<'_>) -> Priority {
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

/// What a client gets (`ERR STORE …`) once its group's journal could not be synced: nothing is
/// applied, until the relay restarts and reads what is really on the disk.
pub const SYNC_FAILED: &str = "journal sync failed; the relay must be restarted";

/// Changes refused after a failed sync: logged at most once per `limits::WARNING_INTERVAL`, with
/// the count held back.
static SYNC_REFUSED: crate::log_limit::RateLimited =
    crate::log_limit::RateLimited::new("changes refused after a failed journal sync");

impl<F: Fs> Data<F> {
    pub fn new(tuning: Tuning, runner: Runner) -> Self {
        Data {
            compaction: None,
            checkpoint: None,
            checkpoint_writing: None,
            tuning,
            runner,
            compaction_backoff: 0,
            activity: Activity::default(),
            background: None,
            journals: BTreeMap::new(),
            groups: BTreeMap::new(),
            notifiers: Map::default(),
            records: Default::default(),
            parked: Map::default(),
            parked_ntfs: Map::default(),
            total_messages: 0,
            counters: StoreCounters::default(),
        }
    }

    pub fn journal(&self, g: u32) -> Result<&Journal<F>, StoreError> {
        self.journals
            .get(&g)
            .ok_or_else(|| StoreError::Failed(format!("group {g} is not this shard's")))
    }

    /// The state of group `g` (every group of the store has one from its open on; a group
    /// being opened gets it before its records are replayed).
    pub fn group_mut(&mut self, g: u32) -> &mut GroupIndex {
        self.groups.entry(g).or_default()
    }

    /// The index entry of queue `rid`.
    pub fn queue(&self, rid: &[u8]) -> Option<&QueueEntry> {
        self.groups.get(&group_of(rid))?.queues.get(rid)
    }

    pub fn queue_count(&self) -> usize {
        self.groups.values().map(|g| g.queues.len()).sum()
    }

    /// Appends the records of one change to the journal of group `g` (one record, or several
    /// that a replay applies whole or not at all). Nothing is appended to a group whose sync
    /// failed; when the journal cannot grow, the operator is told once (and again once it grew).
    fn append(
        &mut self,
        g: u32,
        recs: &[Record<'_>],
        priority: Priority,
    ) -> Result<Vec<(Location, SyncPoint)>, StoreError> {
        let j = self
            .journals
            .get_mut(&g)
            .ok_or_else(|| StoreError::Failed(format!("group {g} is not this shard's")))?;
        if j.sync_failed() {
            let grp = self.groups.entry(g).or_default();
            if !grp.sync_failure_logged {
                grp.sync_failure_logged = true;
                self.counters.store_sync_failures += 1;
                tracing::error!(
                    group = g,
                    "the journal's sync failed: what it took since its last sync may be lost, so \
                     it takes no change (ERR STORE) until the relay is restarted and recovery \
                     reads what is on the disk; check the disk (dmesg), then restart the relay"
                );
            }
            self.counters.store_sync_refused += 1;
            if let crate::log_limit::Decision::Write { suppressed } =
                SYNC_REFUSED.decide(std::time::Instant::now())
            {
                tracing::warn!(
                    group = g,
                    suppressed,
                    "a change refused: its group's journal sync failed; restart the relay"
                );
            }
            return Err(StoreError::Failed(SYNC_FAILED.into()));
        }
        let active = j.written().segment;
        let r = if let [one] = recs {
            j.append_with(one, priority).map(|a| vec![a])
        } else {
            j.append_batch(recs, priority)
        };
        let grp = self.groups.entry(g).or_default();
        match r {
            Ok(done) => {
                let seg = done.last().map_or(active, |a| a.loc.segment);
                if grp.full_at.is_some_and(|s| seg > s) {
                    grp.full_at = None;
                    tracing::info!(group = g, "the journal has room again");
                }
                grp.since_checkpoint.add(
                    done.len() as u64,
                    done.iter()
                        .map(|a| a.end.offset.saturating_sub(a.loc.offset))
                        .sum(),
                );
                Ok(done.iter().map(|a| (a.loc, a.end)).collect())
            }
            Err(e) => {
                if e.is_out_of_space() && grp.full_at.is_none() {
                    grp.full_at = Some(active);
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
    pub fn record(&mut self, g: u32, rec: &Record<'_>) -> Result<SyncPoint, StoreError> {
        self.record_change(g, std::slice::from_ref(rec), priority_of(rec))
    }

    /// As `record`, for the records of one change, with the priority given.
    pub fn record_change(
        &mut self,
        g: u32,
        recs: &[Record<'_>],
        priority: Priority,
    ) -> Result<SyncPoint, StoreError> {
        let done = self.append(g, recs, priority)?;
        let mut end = SyncPoint::default();
        for (rec, (loc, e)) in recs.iter().zip(done) {
            self.replay(g, loc, *rec)
                .map_err(|e| StoreError::Failed(format!("journal: {e}")))?;
            end = e;
        }
        self.compaction_step();
        self.checkpoint_step(g);
        Ok(end)
    }

    /// Removes the oldest segments of group `g` while they hold no live record (never the active
    /// one).
    pub fn release_dead_segments(&mut self, g: u32) {
        let (Some(j), Some(grp)) = (self.journals.get_mut(&g), self.groups.get_mut(&g)) else {
            return;
        };
        let dead: Vec<u64> = j
            .segment_sizes()
            .take_while(|s| !s.active && grp.live.bytes(s.id) == 0)
            .map(|s| s.id)
            .collect();
        let mut retired = Vec::new();
        for id in dead {
            match j.remove_segment(id) {
                Ok(r) => retired.push(r),
                Err(_) => break,
            }
            grp.live.0.remove(&id);
        }
        self.activity.segments_retired += retired.len() as u64;
        for r in retired {
            self.retire(r);
        }
        self.consider_compaction(g);
    }

    /// Applies one record of group `g` to the index (see the module comment for the rules).
    pub fn replay(&mut self, g: u32, loc: Location, rec: Record<'_>) -> Result<(), String> {
        let len = rec.stored_len() as u32;
        match rec {
            Record::QueueCreate { recipient_id, data }
            | Record::QueueUpdate { recipient_id, data } => {
                let ids = record_ids(data)?;
                if ids.recipient_id != recipient_id {
                    return Err("a queue record under another recipient ID".into());
                }
                self.set_record(g, recipient_id, ids.notifier_id, loc, len);
            }
            Record::QueueDelete { recipient_id } => {
                if !self.parked.is_empty() {
                    self.parked.remove(recipient_id);
                }
                self.forget_queue(g, recipient_id);
            }
            Record::MsgAppend {
                recipient_id,
                msg_id,
                ts,
                flags,
                ..
            } => {
                let m = MsgEntry {
                    msg_id: *msg_id,
                    ts,
                    flags,
                    len,
                    loc,
                };
                let grp = self.group_mut(g);
                let Some(q) = grp.queues.get_mut(recipient_id) else {
                    self.parked
                        .entry(recipient_id.to_vec())
                        .or_default()
                        .push_back(m);
                    return Ok(());
                };
                if q.msgs.back().is_some_and(|last| last.loc >= loc) {
                    return Ok(());
                }
                q.msgs.push_back(m);
                grp.live.add(loc.segment, len);
                self.total_messages += 1;
            }
            Record::MsgDelete {
                recipient_id,
                msg_id,
            } => {
                if !self.parked.is_empty() {
                    if let Some(p) = self.parked.get_mut(recipient_id) {
                        p.retain(|m| &m.msg_id != msg_id);
                    }
                }
                self.remove_msg(g, recipient_id, msg_id);
            }
            Record::NtfAppend { notifier_id, data } => {
                let ntf = decode_notification(data)?;
                let e = NtfEntry { ntf, loc, len };
                if self.notifiers.contains_key(notifier_id) {
                    self.push_ntf(g, notifier_id, e);
                } else {
                    self.parked_ntfs
                        .entry(notifier_id.to_vec())
                        .or_default()
                        .push_back(e);
                }
            }
            Record::NtfDelete {
                notifier_id,
                msg_id,
            } => {
                if let Some(p) = self.parked_ntfs.get_mut(notifier_id) {
                    p.retain(|n| &n.ntf.msg_id != msg_id);
                }
                self.remove_ntf(g, notifier_id, msg_id);
            }
            Record::NtfClear { notifier_id } => {
                self.parked_ntfs.remove(notifier_id);
                self.clear_ntfs(g, notifier_id);
            }
            Record::Checkpoint { .. } => {}
        }
        Ok(())
    }

    /// A queue record: creates the queue (with what was parked for it) or replaces its record.
    fn set_record(&mut self, g: u32, rid: &[u8], notifier: Option<&[u8]>, loc: Location, len: u32) {
        self.records.get_mut().forget(rid);
        let old_nid = self
            .group_mut(g)
            .queues
            .get(rid)
            .and_then(|q| q.notifier.as_deref().cloned());
        let new_nid = notifier.map(IdKey::new);
        if let Some(old) = old_nid.filter(|o| Some(o) != new_nid.as_ref()) {
            // A replaced or removed notifier's notifications go with it.
            self.notifiers.remove(old.as_slice());
            self.clear_ntfs(g, old.as_slice());
        }
        let notifier = new_nid.clone().map(Box::new);
        let grp = self.group_mut(g);
        match grp.queues.get_mut(rid) {
            Some(q) => {
                let (old, old_len) = (q.rec_loc.segment, q.rec_len);
                q.rec_loc = loc;
                q.rec_len = len;
                q.notifier = notifier;
                grp.live.sub(old, old_len);
            }
            None => {
                let msgs = self.parked.remove(rid).unwrap_or_default();
                let grp = self.groups.entry(g).or_default();
                for m in &msgs {
                    grp.live.add(m.loc.segment, m.len);
                }
                self.total_messages += msgs.len();
                grp.queues.insert(
                    IdKey::new(rid),
                    QueueEntry {
                        rec_loc: loc,
                        rec_len: len,
                        msgs: msgs.into(),
                        notifier,
                    },
                );
            }
        }
        self.group_mut(g).live.add(loc.segment, len);
        if let Some(nid) = new_nid {
            self.notifiers.insert(nid.clone(), g);
            if let Some(parked) = self.parked_ntfs.remove(nid.as_slice()) {
                for e in parked {
                    self.push_ntf(g, nid.as_slice(), e);
                }
            }
        }
    }

    pub fn forget_queue(&mut self, g: u32, rid: &[u8]) {
        self.records.get_mut().forget(rid);
        let grp = self.group_mut(g);
        let Some(q) = grp.queues.remove(rid) else {
            return;
        };
        grp.live.sub(q.rec_loc.segment, q.rec_len);
        for m in q.msgs.iter() {
            grp.live.sub(m.loc.segment, m.len);
        }
        self.total_messages -= q.msgs.len();
        if let Some(nid) = &q.notifier {
            self.notifiers.remove(nid.as_slice());
            self.clear_ntfs(g, nid.as_slice());
        }
    }

    /// The record of queue `rid`, from the cache of recently used records or read from its group's
    /// journal (`RecordCache`).
    pub fn record_of(&self, rid: &[u8]) -> Result<Option<Rc<QueueRec>>, StoreError> {
        // A cached record is of a queue that exists: a delete forgets it.
        if let Some(r) = self.records.borrow_mut().get(rid) {
            return Ok(Some(r));
        }
        let Some(q) = self.queue(rid) else {
            return Ok(None);
        };
        let rec = Rc::new(self.read_record(group_of(rid), q)?);
        self.records.borrow_mut().put(rid, rec.clone());
        Ok(Some(rec))
    }

    /// The record of queue entry `q` of group `g`, read and decoded from the journal.
    pub fn read_record(&self, g: u32, q: &QueueEntry) -> Result<QueueRec, StoreError> {
        decode_queue_record(self.record_bytes(g, q)?).map_err(StoreError::Failed)
    }

    /// The bytes of queue entry `q`'s record in group `g` (its encoding, as a checkpoint keeps it).
    pub fn record_bytes(&self, g: u32, q: &QueueEntry) -> Result<&[u8], StoreError> {
        match self.journal(g)?.read(q.rec_loc).map_err(failed)? {
            (_, Record::QueueCreate { data, .. } | Record::QueueUpdate { data, .. }) => Ok(data),
            _ => Err(StoreError::Failed(
                "journal: a queue's record is not a queue record".into(),
            )),
        }
    }

    /// Removes message `msg_id` of queue `rid` from the index (normally its head).
    pub fn remove_msg(&mut self, g: u32, rid: &[u8], msg_id: &MsgId) -> Option<MsgEntry> {
        let grp = self.group_mut(g);
        let q = grp.queues.get_mut(rid)?;
        let i = q.msgs.iter().position(|m| &m.msg_id == msg_id)?;
        let m = q.msgs.remove(i)?;
        grp.live.sub(m.loc.segment, m.len);
        self.total_messages -= 1;
        Some(m)
    }

    fn push_ntf(&mut self, g: u32, nid: &[u8], e: NtfEntry) {
        let grp = self.group_mut(g);
        let list = grp.ntfs.entry(nid.to_vec()).or_default();
        if list.back().is_some_and(|last| last.loc >= e.loc) {
            return;
        }
        let dropped = if list.len() >= MAX_NTFS_PER_NOTIFIER {
            list.pop_front()
        } else {
            None
        };
        grp.live.add(e.loc.segment, e.len);
        list.push_back(e);
        if let Some(d) = dropped {
            grp.live.sub(d.loc.segment, d.len);
        }
    }

    fn remove_ntf(&mut self, g: u32, nid: &[u8], msg_id: &MsgId) {
        let grp = self.group_mut(g);
        let Some(list) = grp.ntfs.get_mut(nid) else {
            return;
        };
        let Some(i) = list.iter().position(|n| &n.ntf.msg_id == msg_id) else {
            return;
        };
        let n = list.remove(i);
        if list.is_empty() {
            grp.ntfs.remove(nid);
        }
        if let Some(n) = n {
            grp.live.sub(n.loc.segment, n.len);
        }
    }

    pub fn clear_ntfs(&mut self, g: u32, nid: &[u8]) -> usize {
        let grp = self.group_mut(g);
        let Some(list) = grp.ntfs.remove(nid) else {
            return 0;
        };
        for n in &list {
            grp.live.sub(n.loc.segment, n.len);
        }
        list.len()
    }

    /// The message at the head of `rid`, its body read from the journal.
    pub fn head(&self, rid: &[u8]) -> Result<Option<Message>, StoreError> {
        let g = group_of(rid);
        let Some(m) = self
            .groups
            .get(&g)
            .and_then(|grp| grp.queues.get(rid))
            .and_then(|q| q.msgs.front())
        else {
            return Ok(None);
        };
        self.message(g, m).map(Some)
    }

    /// Message `m` of a queue of group `g`.
    pub fn message(&self, g: u32, m: &MsgEntry) -> Result<Message, StoreError> {
        if m.is_quota() {
            return Ok(m.without_body());
        }
        match self.journal(g)?.read(m.loc).map_err(failed)? {
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

    /// Deletes the expired head messages of `rid` (never the quota marker); returns how many, and
    /// the point that makes the deletions durable.
    pub fn expire_queue(
        &mut self,
        g: u32,
        rid: &[u8],
        older_than: i64,
    ) -> Result<(usize, Option<SyncPoint>), StoreError> {
        let mut n = 0;
        let mut end = None;
        while let Some(h) = self
            .groups
            .get(&g)
            .and_then(|grp| grp.queues.get(rid))
            .and_then(|q| q.msgs.front())
            .copied()
        {
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

    /// Every location the index holds in group `g` is in a segment the journal has: what the
    /// store serves can be read. An index that holds another was rebuilt from a checkpoint that
    /// referred to records since lost: the queues and messages concerned, for the operator.
    pub fn check_locations(&self, g: u32) -> Result<(), String> {
        let have: std::collections::BTreeSet<u64> = self
            .journal(g)
            .map_err(|e| e.to_string())?
            .segment_sizes()
            .map(|s| s.id)
            .collect();
        let Some(grp) = self.groups.get(&g) else {
            return Ok(());
        };
        let mut lost = Vec::new();
        for (rid, q) in &grp.queues {
            let msgs = q
                .msgs
                .iter()
                .filter(|m| !have.contains(&m.loc.segment))
                .count();
            let rec = !have.contains(&q.rec_loc.segment);
            if rec || msgs > 0 {
                lost.push(format!(
                    "queue {}: {}{msgs} message(s)",
                    crate::crypto::hash::b64url(rid.as_slice()),
                    if rec { "its record, " } else { "" }
                ));
            }
        }
        let ntfs: usize = grp
            .ntfs
            .values()
            .flatten()
            .filter(|n| !have.contains(&n.loc.segment))
            .count();
        if ntfs > 0 {
            lost.push(format!("{ntfs} notification(s)"));
        }
        if lost.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the state refers to records in segments that are gone: {}",
                lost.join("; ")
            ))
        }
    }
}
