//! Background compaction of the journal store (`docs/ARCHITECTURE.md` §5, `journal/FORMAT.md`
//! "Compaction").
//!
//! Dead segments go as soon as they and every older one hold nothing live. A live record in an
//! old segment (a queue created long ago, a message nobody has received) would keep every later
//! segment of its group; compaction moves such records out of the way. When a group's oldest
//! segments (never the one appended to) are at least [`COMPACT_MIN_BYTES`] and at most a
//! [`COMPACT_LIVE_SHARE`]th of their bytes is live, they are rewritten as one segment holding only
//! the live records:
//!
//! 1. *Scan*, on the shard, a few records per appended record ([`COMPACT_SCAN_STEP`]): each record
//!    of those segments is looked up in the index, and the live ones are listed.
//! 2. *Write*, on a thread of its own: the journal crate copies the listed records into a new file,
//!    syncs it and renames it over the last of those segments, then removes the others.
//! 3. *Install*, on the shard when the thread is done: the journal maps the new segment and the
//!    index's locations of the moved records are updated.
//!
//! A record that dies while this runs is copied anyway; its deletion is recorded in a later
//! segment, so a replay kills it again, and it is not counted live in the new segment. Nothing
//! changes order: the kept records come before every later segment, as they did.

use std::collections::HashSet;
use std::thread::JoinHandle;

use smp_journal::{Compacted, Fs, JournalError, Location, Record, HEADER_LEN};

use super::index::GroupIndex;
use super::Data;
use super::{EntityId, Map};

/// A group's oldest segments are compacted once they take at least this much disk…
pub(super) const COMPACT_MIN_BYTES: u64 = 8 << 20;

/// …and at most one byte in this many is live.
pub(super) const COMPACT_LIVE_SHARE: u64 = 4;

/// The most live bytes one compaction copies (the size of a full segment).
pub(super) const COMPACT_MAX_LIVE_BYTES: u64 = smp_journal::DEFAULT_SEGMENT_SIZE;

/// Records looked at per appended record while finding what to keep.
pub(super) const COMPACT_SCAN_STEP: usize = 256;

/// Records appended before a compaction that failed is tried again.
pub(super) const COMPACT_RETRY_AFTER: u64 = 100_000;

/// A compaction under way: its group, the last segment it replaces, the live records found.
pub(super) struct Compaction<F: Fs> {
    g: u32,
    upto: u64,
    keep: Vec<(Location, Kept)>,
    phase: Phase<F>,
}

enum Phase<F: Fs> {
    /// Looking for live records from this point on.
    Scanning { segment: u64, offset: u64 },
    /// The new segment is being written by `thread`.
    Writing {
        rx: flume::Receiver<Result<Compacted<F>, JournalError>>,
        thread: Option<JoinHandle<()>>,
    },
}

/// What a kept record is, to find its index entry again.
enum Kept {
    Queue(EntityId),
    Msg(EntityId),
    Ntf(EntityId),
}

impl<F: Fs> Drop for Compaction<F> {
    fn drop(&mut self) {
        if let Phase::Writing { thread, .. } = &mut self.phase {
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Whether the record at `loc` is live in the index of its group, and how to find it again.
/// Messages and notifications are kept in the order of their records' locations.
fn kept(grp: &GroupIndex, loc: Location, rec: &Record<'_>) -> Option<Kept> {
    match *rec {
        Record::QueueCreate { recipient_id, .. } | Record::QueueUpdate { recipient_id, .. } => grp
            .queues
            .get(recipient_id)
            .filter(|q| q.rec_loc == loc)
            .map(|_| Kept::Queue(recipient_id.to_vec())),
        Record::MsgAppend { recipient_id, .. } => grp
            .queues
            .get(recipient_id)
            .filter(|q| q.msgs.binary_search_by(|m| m.loc.cmp(&loc)).is_ok())
            .map(|_| Kept::Msg(recipient_id.to_vec())),
        Record::NtfAppend { notifier_id, .. } => grp
            .ntfs
            .get(notifier_id)
            .filter(|l| l.binary_search_by(|n| n.loc.cmp(&loc)).is_ok())
            .map(|_| Kept::Ntf(notifier_id.to_vec())),
        _ => None,
    }
}

impl<F: Fs> Data<F> {
    /// Starts compacting group `g` if its oldest segments are worth it (see the module comment)
    /// and no compaction runs.
    pub(super) fn consider_compaction(&mut self, g: u32) {
        if self.compaction.is_some() || self.compaction_backoff > 0 {
            return;
        }
        let t = &self.tuning;
        let (min_bytes, live_share, max_live) = (
            t.compact_min_bytes,
            t.compact_live_share,
            t.compact_max_live_bytes,
        );
        let (Some(j), Some(live)) = (self.journals.get(&g), self.groups.get(&g).map(|x| &x.live))
        else {
            return;
        };
        let (mut disk, mut kept, mut upto) = (0u64, 0u64, None);
        for s in j.segment_sizes() {
            let bytes = live.bytes(s.id);
            if s.active || kept + bytes > max_live {
                break;
            }
            disk += s.len;
            kept += bytes;
            if disk >= min_bytes && kept * live_share <= disk {
                upto = Some(s.id);
            }
        }
        let (Some(upto), Some(first)) = (upto, j.segment_sizes().next()) else {
            return;
        };
        self.compaction = Some(Compaction {
            g,
            upto,
            keep: Vec::new(),
            phase: Phase::Scanning {
                segment: first.id,
                offset: HEADER_LEN,
            },
        });
    }

    /// One bounded step of the compaction under way: a few records scanned, the writing thread
    /// started, or its result installed.
    pub(super) fn compaction_step(&mut self) {
        if self.compaction_backoff > 0 {
            self.compaction_backoff -= 1;
        }
        let Some(c) = &self.compaction else {
            return;
        };
        let g = c.g;
        let result = match c.phase {
            Phase::Scanning { segment, offset } => self.scan_step(segment, offset),
            // A checkpoint's walk of the group refers to the records' places: it ends first.
            Phase::Writing { .. } if self.walking(g) => Ok(()),
            Phase::Writing { .. } => self.install_if_done(),
        };
        if let Err(e) = result {
            self.compaction = None;
            tracing::warn!(group = g, error = %e, "journal compaction failed; tried again later");
            if let Some(j) = self.journals.get_mut(&g) {
                j.abandon_compaction();
            }
            self.compaction_backoff = self.tuning.compact_retry_after;
        }
    }

    fn scan_step(&mut self, segment: u64, offset: u64) -> Result<(), JournalError> {
        let c = self.compaction.as_ref().expect("a compaction is under way");
        let (g, upto) = (c.g, c.upto);
        let j = &self.journals[&g];
        let empty = GroupIndex::default();
        let grp = self.groups.get(&g).unwrap_or(&empty);
        let mut found = Vec::new();
        let next = j.scan_segment(
            segment,
            offset,
            self.tuning.compact_scan_step,
            |loc, rec| {
                if let Some(k) = kept(grp, loc, &rec) {
                    found.push((loc, k));
                }
            },
        )?;
        let next_segment = match next {
            Some(_) => None,
            None => j.segment_sizes().map(|s| s.id).find(|&id| id > segment),
        };
        let c = self.compaction.as_mut().expect("a compaction is under way");
        c.keep.extend(found);
        c.phase = match (next, next_segment) {
            (Some(offset), _) => Phase::Scanning { segment, offset },
            (None, Some(s)) if s <= upto => Phase::Scanning {
                segment: s,
                offset: HEADER_LEN,
            },
            _ => {
                let keep = c.keep.iter().map(|(l, _)| *l).collect();
                let job = self
                    .journals
                    .get_mut(&g)
                    .expect("the compacted group is this shard's")
                    .start_compaction(upto, keep)?;
                let (tx, rx) = flume::bounded(1);
                let thread = self
                    .runner
                    .spawn("journal-compact", move || {
                        let _ = tx.send(job.run());
                    })
                    .map_err(|e| JournalError::BadCompaction(format!("no thread: {e}")))?;
                Phase::Writing { rx, thread }
            }
        };
        Ok(())
    }

    fn install_if_done(&mut self) -> Result<(), JournalError> {
        let c = self.compaction.as_ref().expect("a compaction is under way");
        let Phase::Writing { rx, .. } = &c.phase else {
            return Ok(());
        };
        let done = match rx.try_recv() {
            Ok(r) => r?,
            Err(flume::TryRecvError::Empty) => return Ok(()),
            Err(flume::TryRecvError::Disconnected) => {
                return Err(JournalError::BadCompaction(
                    "the compaction thread ended without a result".into(),
                ))
            }
        };
        self.install(done)
    }

    /// Waits for a compaction being written and installs it; drops one still scanning (at
    /// close: the files are consistent either way).
    pub(super) fn finish_compaction(&mut self) {
        let Some(c) = &self.compaction else {
            return;
        };
        let g = c.g;
        let done = match &c.phase {
            Phase::Writing { rx, .. } => rx.recv().ok(),
            Phase::Scanning { .. } => None,
        };
        let r = match done {
            Some(Ok(done)) => self.install(done),
            Some(Err(e)) => Err(e),
            None => Ok(()),
        };
        self.compaction = None;
        if let Err(e) = r {
            tracing::warn!(group = g, error = %e, "journal compaction failed");
        }
        if let Some(j) = self.journals.get_mut(&g) {
            j.abandon_compaction();
        }
    }

    /// Swaps the compacted segment in and points the index at the records' new places.
    fn install(&mut self, done: Compacted<F>) -> Result<(), JournalError> {
        let c = self.compaction.take().expect("a compaction is under way");
        for w in &done.warnings {
            tracing::warn!("{w}");
        }
        let (before, after) = (done.bytes_before, done.bytes_after);
        let j = self
            .journals
            .get_mut(&c.g)
            .expect("the compacted group is this shard's");
        let (moved, retired) = j.install_compaction(done)?;
        self.activity.compactions += 1;
        self.retire(retired);
        let grp = self.group_mut(c.g);
        // Old locations to new ones. Each entry is looked at once: a new location can equal
        // the old location of another record of the same segment number.
        let moved: Map<Location, Location> = moved.into_iter().collect();
        let mut msg_queues = HashSet::new();
        let mut notifiers = HashSet::new();
        let (mut count, mut bytes) = (0u64, 0u64);
        let mut moved_one = |loc: &mut Location, len: u32| {
            if let Some(new) = moved.get(loc) {
                *loc = *new;
                count += 1;
                bytes += u64::from(len);
            }
        };
        for (_, k) in &c.keep {
            match k {
                Kept::Queue(rid) => {
                    if let Some(q) = grp.queues.get_mut(&rid[..]) {
                        moved_one(&mut q.rec_loc, q.rec_len);
                    }
                }
                Kept::Msg(rid) => {
                    if msg_queues.insert(rid) {
                        if let Some(q) = grp.queues.get_mut(&rid[..]) {
                            for m in q.msgs.iter_mut() {
                                moved_one(&mut m.loc, m.len);
                            }
                        }
                    }
                }
                Kept::Ntf(nid) => {
                    if notifiers.insert(nid) {
                        if let Some(l) = grp.ntfs.get_mut(nid) {
                            for n in l.iter_mut() {
                                moved_one(&mut n.loc, n.len);
                            }
                        }
                    }
                }
            }
        }
        grp.live.0.retain(|&id, _| id > c.upto);
        grp.live.0.insert(c.upto, bytes);
        // The group's checkpoint covers segments that are gone now: the next one comes soon.
        grp.since_checkpoint.force();
        tracing::info!(
            group = c.g,
            upto = c.upto,
            records = count,
            bytes_before = before,
            bytes_after = after,
            "journal compacted"
        );
        Ok(())
    }

    /// Runs compactions of group `g` to the end, with every dead segment removed between them.
    #[cfg(test)]
    pub(super) fn settle_compaction(&mut self, g: u32) {
        for _ in 0..1_000_000 {
            self.release_dead_segments(g);
            match &self.compaction {
                None => return,
                Some(Compaction {
                    phase: Phase::Scanning { .. },
                    ..
                }) => self.compaction_step(),
                Some(_) => self.finish_compaction(),
            }
        }
        panic!("compaction of group {g} does not settle");
    }
}
