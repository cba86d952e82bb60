//! The journal store's checkpoints (`docs/ARCHITECTURE.md` §5, `journal/FORMAT.md`
//! "Checkpoints"): a group's part of the index written as the blob of the group's checkpoint, so
//! that a start loads it and replays only the records after its point.
//!
//! - *While running*, once a group has taken [`Tuning::checkpoint_records`] records (or
//!   [`Tuning::checkpoint_bytes`] of them) since its last checkpoint, the shard takes a new one in bounded steps ([`Tuning::checkpoint_step`]
//!   queues or notification lists per appended record), walking the group's queues by ID while
//!   they change: the point is where the walk began, and each queue is written as it is when the
//!   walk reaches it, so the snapshot holds some changes after the point; the replay from the
//!   point meets those again and takes them as already there (`index.rs`). When the walk is done
//!   the checkpoint is sealed (everything appended up to then must be durable for it to be
//!   used) and written off the shard. So the replay after a crash is bounded by the setting, not
//!   by the history since the last clean stop.
//! - *At a clean stop* every group changed since open gets a checkpoint at its end.
//!
//! A checkpoint whose segments were compacted or cut since is not used: the whole group is
//! replayed, as without one; a compaction therefore asks for the next checkpoint of its group
//! at once, and its installation waits while that group's walk is under way (it moves records).
//!
//! The blob (big-endian, `protocol/encoding.rs` primitives): a version byte (2), the number of
//! queues, each queue (recipient ID, queue record in the `store/codec.rs` encoding, the record's
//! location and bytes, its messages: ID, time, flags, location and record bytes), then the number
//! of notification lists, each (notifier ID, each notification in the codec encoding with its
//! record's location and bytes). Version 1 had a flag per queue after the record's location,
//! which is read and ignored (it is the last message's quota flag).

use std::collections::VecDeque;
use std::ops::Bound;

use smp_journal::{CheckpointBase, Fs, JournalError, Location};

use super::index::{MsgEntry, NtfEntry, QueueEntry};
use super::Data;
use super::{decode_notification, encode_notification, record_ids};
use crate::protocol::encoding::{put_int64, put_word32, DResult, Reader};
use crate::store::id::IdKey;
use crate::store::{EntityId, StoreError};

const BLOB_VERSION: u8 = 2;

fn put_id(out: &mut Vec<u8>, id: &[u8]) {
    out.push(id.len() as u8);
    out.extend_from_slice(id);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_word32(out, b.len() as u32);
    out.extend_from_slice(b);
}

fn put_loc(out: &mut Vec<u8>, loc: Location, len: u32) {
    put_int64(out, loc.segment as i64);
    put_int64(out, loc.offset as i64);
    put_word32(out, len);
}

fn id<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.byte()? as usize;
    r.take(n)
}

fn bytes<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.word32()? as usize;
    r.take(n)
}

fn loc(r: &mut Reader<'_>) -> DResult<(Location, u32)> {
    let segment = r.int64()? as u64;
    let offset = r.int64()? as u64;
    Ok((Location { segment, offset }, r.word32()?))
}

/// One queue; `rec` is its record's encoding, as its journal holds it.
fn put_queue(out: &mut Vec<u8>, rid: &[u8], rec: &[u8], q: &QueueEntry) {
    put_id(out, rid);
    put_bytes(out, rec);
    put_loc(out, q.rec_loc, q.rec_len);
    put_word32(out, q.msgs.len() as u32);
    for m in q.msgs.iter() {
        out.extend_from_slice(&m.msg_id);
        put_int64(out, m.ts);
        out.push(m.flags);
        put_loc(out, m.loc, m.len);
    }
}

fn put_ntfs(out: &mut Vec<u8>, nid: &[u8], list: &VecDeque<NtfEntry>) {
    put_id(out, nid);
    put_word32(out, list.len() as u32);
    for e in list {
        put_bytes(out, &encode_notification(&e.ntf));
        put_loc(out, e.loc, e.len);
    }
}

/// A blob being written: the queues part and the notifications part, with their counts.
#[derive(Default)]
struct Blob {
    queues: u32,
    queue_bytes: Vec<u8>,
    lists: u32,
    list_bytes: Vec<u8>,
}

impl Blob {
    fn finish(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.queue_bytes.len() + self.list_bytes.len() + 9);
        out.push(BLOB_VERSION);
        put_word32(&mut out, self.queues);
        out.extend_from_slice(&self.queue_bytes);
        put_word32(&mut out, self.lists);
        out.extend_from_slice(&self.list_bytes);
        out
    }
}

/// Where the walk of a checkpoint is.
enum Walk {
    /// Queues after this ID (all, at first).
    Queues(Option<EntityId>),
    /// Notification lists after this notifier ID.
    Lists(Option<EntityId>),
}

/// A checkpoint of one group being taken while the relay runs.
pub(super) struct Checkpointing<F: Fs> {
    pub g: u32,
    base: CheckpointBase<F>,
    walk: Walk,
    blob: Blob,
}

/// A checkpoint being written off the shard.
pub(super) struct Writing {
    pub g: u32,
    done: flume::Receiver<Result<(), JournalError>>,
}

impl<F: Fs> Data<F> {
    /// The blob of group `g` as it is now, in one go (at a clean stop).
    pub fn checkpoint_blob(&self, g: u32) -> Result<Vec<u8>, StoreError> {
        let mut blob = Blob::default();
        if let Some(grp) = self.groups.get(&g) {
            for (rid, q) in &grp.queues {
                blob.queues += 1;
                put_queue(
                    &mut blob.queue_bytes,
                    rid.as_slice(),
                    self.record_bytes(g, q)?,
                    q,
                );
            }
            for (nid, list) in &grp.ntfs {
                blob.lists += 1;
                put_ntfs(&mut blob.list_bytes, nid, list);
            }
        }
        Ok(blob.finish())
    }

    /// One bounded step of the store's checkpoints, after a change of group `changed`: the write
    /// of the last one looked at, the walk under way advanced, or a new one begun for `changed`
    /// when it has taken [`super::Tuning::checkpoint_records`] records since its last.
    pub fn checkpoint_step(&mut self, changed: u32) {
        if let Some(w) = &self.checkpoint_writing {
            match w.done.try_recv() {
                Ok(r) => {
                    let g = w.g;
                    self.checkpoint_writing = None;
                    match r {
                        Ok(()) => self.activity.checkpoints_written += 1,
                        Err(e) => {
                            tracing::warn!(group = g, error = %e, "journal checkpoint not written");
                        }
                    }
                }
                Err(flume::TryRecvError::Empty) => return,
                Err(flume::TryRecvError::Disconnected) => self.checkpoint_writing = None,
            }
        }
        if self.checkpoint.is_some() {
            self.walk_step();
            return;
        }
        let (Some(j), Some(grp)) = (self.journals.get(&changed), self.groups.get_mut(&changed))
        else {
            return;
        };
        if !grp.since_checkpoint.due(&self.tuning) || j.sync_failed() {
            return;
        }
        grp.since_checkpoint = Default::default();
        self.checkpoint = Some(Checkpointing {
            g: changed,
            base: j.checkpoint_base(),
            walk: Walk::Queues(None),
            blob: Blob::default(),
        });
    }

    fn walk_step(&mut self) {
        let Some(mut c) = self.checkpoint.take() else {
            return;
        };
        let Some(grp) = self.groups.get(&c.g) else {
            return;
        };
        let step = self.tuning.checkpoint_step;
        let after = |a: &Option<EntityId>| match a {
            Some(id) => Bound::Excluded(id.clone()),
            None => Bound::Unbounded,
        };
        match &c.walk {
            Walk::Queues(a) => {
                let mut last = None;
                let from = match a {
                    Some(id) => Bound::Excluded(&id[..]),
                    None => Bound::Unbounded,
                };
                for (rid, q) in grp
                    .queues
                    .range::<[u8], _>((from, Bound::Unbounded))
                    .take(step)
                {
                    let rec = match self.record_bytes(c.g, q) {
                        Ok(rec) => rec,
                        Err(e) => {
                            // Never a checkpoint without a queue: this one is dropped, and the
                            // next one due is tried.
                            tracing::warn!(group = c.g, error = %e, "journal checkpoint dropped");
                            return;
                        }
                    };
                    c.blob.queues += 1;
                    put_queue(&mut c.blob.queue_bytes, rid.as_slice(), rec, q);
                    last = Some(rid.to_vec());
                }
                c.walk = match last {
                    Some(rid) => Walk::Queues(Some(rid)),
                    None => Walk::Lists(None),
                };
            }
            Walk::Lists(a) => {
                let mut last = None;
                for (nid, list) in grp.ntfs.range((after(a), Bound::Unbounded)).take(step) {
                    c.blob.lists += 1;
                    put_ntfs(&mut c.blob.list_bytes, nid, list);
                    last = Some(nid.clone());
                }
                match last {
                    Some(nid) => c.walk = Walk::Lists(Some(nid)),
                    None => return self.seal(c),
                }
            }
        }
        self.checkpoint = Some(c);
    }

    /// The walk is done: seal the checkpoint and write it off the shard.
    fn seal(&mut self, c: Checkpointing<F>) {
        let Checkpointing {
            g, mut base, blob, ..
        } = c;
        let Some(j) = self.journals.get(&g) else {
            return;
        };
        j.checkpoint_seal(&mut base);
        let blob = blob.finish();
        let (tx, rx) = flume::bounded(1);
        let spawned = self.runner.spawn("journal-checkpoint", move || {
            let _ = tx.send(base.write(&blob));
        });
        match spawned {
            Ok(_) => self.checkpoint_writing = Some(Writing { g, done: rx }),
            Err(e) => tracing::warn!(group = g, error = %e, "journal checkpoint not written"),
        }
    }

    /// Waits for the checkpoint being written, if any, and drops a walk under way (at close).
    pub fn finish_checkpoints(&mut self) {
        self.checkpoint = None;
        if let Some(w) = self.checkpoint_writing.take() {
            if let Ok(Err(e)) = w.done.recv() {
                tracing::warn!(group = w.g, error = %e, "journal checkpoint not written");
            }
        }
    }

    /// Whether the walk of a checkpoint of group `g` is under way (a compaction of the group
    /// waits to install: it moves the records the walk refers to).
    pub fn walking(&self, g: u32) -> bool {
        self.checkpoint.as_ref().is_some_and(|c| c.g == g)
    }

    /// Loads the blob of group `g` (before its records after the checkpoint are replayed).
    pub fn load_checkpoint(&mut self, g: u32, blob: &[u8]) -> Result<(), String> {
        let bad = |what: &str| format!("checkpoint of group {g}: bad {what}");
        let mut r = Reader::new(blob);
        let version = r.byte().map_err(|_| bad("version"))?;
        if version != 1 && version != BLOB_VERSION {
            return Err(bad("version"));
        }
        let nq = r.word32().map_err(|_| bad("queue count"))?;
        let mut queues = Vec::with_capacity((nq as usize).min(1 << 20));
        for _ in 0..nq {
            queues.push(
                self.load_queue(g, &mut r, version)
                    .map_err(|_| bad("queue"))??,
            );
        }
        // Built at once, the index's B-tree has full nodes; inserted one by one in key order
        // (the order a checkpoint keeps) it would split every node half full, costing an idle
        // queue about 40 bytes more (`docs/ARCHITECTURE.md` §5, memory per queue).
        let grp = self.group_mut(g);
        if grp.queues.is_empty() {
            grp.queues = queues.into_iter().collect();
        } else {
            grp.queues.extend(queues);
        }
        let nn = r.word32().map_err(|_| bad("notifier count"))?;
        for _ in 0..nn {
            self.load_ntfs(g, &mut r)
                .map_err(|_| bad("notifications"))??;
        }
        if !r.is_empty() {
            return Err(bad("end (trailing bytes)"));
        }
        self.activity.checkpoints_loaded += 1;
        Ok(())
    }

    fn load_queue(
        &mut self,
        g: u32,
        r: &mut Reader<'_>,
        version: u8,
    ) -> DResult<Result<(IdKey, QueueEntry), String>> {
        let rid = IdKey::new(id(r)?);
        let ids = match record_ids(bytes(r)?) {
            Ok(ids) => ids,
            Err(e) => return Ok(Err(e)),
        };
        let (rec_loc, rec_len) = loc(r)?;
        if version == 1 {
            r.bool()?;
        }
        let n = r.word32()? as usize;
        let mut msgs = VecDeque::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let msg_id = r.array::<24>()?;
            let ts = r.int64()?;
            let flags = r.byte()?;
            let (loc, len) = loc(r)?;
            msgs.push_back(MsgEntry {
                msg_id,
                ts,
                flags,
                len,
                loc,
            });
        }
        let notifier = ids.notifier_id.map(|n| Box::new(IdKey::new(n)));
        if let Some(nid) = &notifier {
            self.notifiers.insert(IdKey::clone(nid), g);
        }
        self.total_messages += msgs.len();
        let grp = self.group_mut(g);
        grp.live.add(rec_loc.segment, rec_len);
        for m in &msgs {
            grp.live.add(m.loc.segment, m.len);
        }
        Ok(Ok((
            rid,
            QueueEntry {
                rec_loc,
                rec_len,
                msgs: msgs.into(),
                notifier,
            },
        )))
    }

    fn load_ntfs(&mut self, g: u32, r: &mut Reader<'_>) -> DResult<Result<(), String>> {
        let nid: EntityId = id(r)?.to_vec();
        let n = r.word32()? as usize;
        let mut list = VecDeque::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let ntf = match decode_notification(bytes(r)?) {
                Ok(x) => x,
                Err(e) => return Ok(Err(e)),
            };
            let (loc, len) = loc(r)?;
            list.push_back(NtfEntry { ntf, loc, len });
        }
        let grp = self.group_mut(g);
        for e in &list {
            grp.live.add(e.loc.segment, e.len);
        }
        grp.ntfs.insert(nid, list);
        Ok(Ok(()))
    }
}

/// What the checkpoint of group `g` says was lost with damage found at open (`damage`: the
/// segment file and offset named, from which on records are not read; records in segments no
/// longer on disk are lost too): the queues whose record, messages or notifications were there,
/// for the operator. `None` when there is no checkpoint to tell, or it names nothing there.
pub(super) fn lost_by_checkpoint<F: Fs>(
    fs: &F,
    root: &std::path::Path,
    g: u32,
    damage: Option<(u64, u64)>,
) -> Option<String> {
    let (cp, _) = smp_journal::read_checkpoint(fs, root, g).ok()?;
    let cp = cp?;
    let on_disk: std::collections::BTreeSet<u64> = fs
        .list(&smp_journal::group_dir(root, g))
        .ok()?
        .iter()
        .filter_map(|n| smp_journal::parse_segment_file_name(n))
        .collect();
    let lost = |loc: Location| {
        !on_disk.contains(&loc.segment)
            || damage.is_some_and(|(s, off)| (loc.segment, loc.offset) >= (s, off))
    };
    let mut d: Data<F> = Data::new(super::Tuning::default(), super::Runner::default());
    d.load_checkpoint(g, &cp.blob).ok()?;
    let grp = d.groups.get(&g)?;
    let mut lines = Vec::new();
    for (rid, q) in &grp.queues {
        let msgs = q.msgs.iter().filter(|m| lost(m.loc)).count();
        let rec = lost(q.rec_loc);
        if rec || msgs > 0 {
            lines.push(format!(
                "queue {}: {}{msgs} message(s)",
                crate::crypto::hash::b64url(rid.as_slice()),
                if rec { "its record, " } else { "" }
            ));
        }
    }
    let ntfs = grp.ntfs.values().flatten().filter(|n| lost(n.loc)).count();
    if ntfs > 0 {
        lines.push(format!("{ntfs} notification(s)"));
    }
    if lines.is_empty() {
        return None;
    }
    const SHOWN: usize = 20;
    let more = lines.len().saturating_sub(SHOWN);
    lines.truncate(SHOWN);
    if more > 0 {
        lines.push(format!("and {more} more queue(s)"));
    }
    Some(format!(
        "the group's checkpoint of {} names what was there: {}",
        smp_journal::segment_file_name(cp.at.point.segment),
        lines.join("; ")
    ))
}
