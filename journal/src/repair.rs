//! `repair`: gives a damaged group's journal a way to open again (the relay stopped), for every
//! damage the reader reports, and says what that cost per queue.
//!
//! - A bad record (damage before the synced offset, a torn tail, a change cut short), records
//!   missing between segments, a gap in the segment numbers, an unreadable segment header: the
//!   journal is cut there. The bad record's start is zeroed and the segment's synced offset set to
//!   the cut; later segments are set aside as `seg-….jnl.cut`; the segment cut becomes the last.
//! - A segment file shorter than its header says (someone cut it): extended back with zeros, then
//!   repaired as any segment (its records end where the file was cut, so the journal is cut
//!   there). A file longer than its header says is not changed: an error says so.
//! - The group's first segment is not its first, and no segment was removed as dead to make it so
//!   (its first segment file was deleted): the loss is accepted, the segment's sync slot says it
//!   is the group's first.
//! - The last segment's sync slot says a segment follows it, and that file is gone: its sync slot
//!   is written without that word.
//!
//! What was dropped is reported per queue and notifier: the records past the cut (read leniently,
//! past the bad record: `scan::scan_lenient`) and in the segments set aside, judged against what
//! the records kept give (`crate::check`, the relay's replay rules): messages lost, acknowledged
//! messages that come back, queues lost or back, record changes and notifications lost. Records
//! that cannot be read (a missing segment, a torn record, a file's cut-off end) are named as
//! lost, what they were not known.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::check::{b64, check_group_on, Index};
use crate::error::JournalError;
use crate::format::{
    Kind, MsgId, Record, SegmentHeader, Slot, HEADER_LEN, SLOT_FIRST, SLOT_SUCCESSOR,
};
use crate::fs::{Fs, FsFile, OsFs};
use crate::journal::{open_dir, segment_list_problem};
use crate::scan::{scan, scan_lenient, PreadSource, ZERO_WINDOW};
use crate::segment::{
    list_segment_ids, preallocate, read_header, replaced_ids, rewrite_slot, sync_dir,
};
use crate::segment_file_name;

/// What the records a repair dropped meant for one queue (recipient ID), judged against the
/// records kept as the relay replays them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueLoss {
    pub recipient_id: Vec<u8>,
    /// Messages appended after the cut and not deleted after it either: the recipient never gets
    /// them.
    pub messages_lost: u64,
    /// Messages kept whose msg-delete (the recipient's acknowledgement) was dropped: they are
    /// delivered again.
    pub messages_back: u64,
    /// The queue was created after the cut (and not deleted after it): it is lost.
    pub created_lost: bool,
    /// The queue's deletion was dropped: it is back, with `back_with` messages.
    pub deletion_lost: bool,
    pub back_with: u64,
    /// Queue-updates of a kept queue dropped: its record is older than it was.
    pub changes_lost: u64,
    /// Messages kept whose queue has no record left (a missing first segment held it, or the cut
    /// dropped it): the relay drops them at every start.
    pub messages_unowned: u64,
    /// The queue's records start with a queue-update after the group's first segment was found
    /// missing: its older records are gone, and with them any message it held then.
    pub history_lost: bool,
}

impl fmt::Display for QueueLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.created_lost {
            parts.push("created after the cut, the queue is lost".to_string());
        }
        if self.deletion_lost {
            parts.push(format!(
                "its deletion is lost: the queue is back with {} message(s)",
                self.back_with
            ));
        }
        if self.history_lost {
            parts.push(
                "its older records are missing: messages it held then, if any, are lost (how \
                 many is not known)"
                    .to_string(),
            );
        }
        if self.messages_lost > 0 {
            parts.push(format!("{} message(s) lost", self.messages_lost));
        }
        if self.messages_unowned > 0 {
            parts.push(format!(
                "{} message(s) lost with its queue's record (the relay drops messages of a queue \
                 that has no record)",
                self.messages_unowned
            ));
        }
        if self.messages_back > 0 {
            parts.push(format!(
                "{} acknowledged message(s) may be delivered again",
                self.messages_back
            ));
        }
        if self.changes_lost > 0 {
            parts.push("its later record changes are lost".to_string());
        }
        write!(f, "queue {}: {}", b64(&self.recipient_id), parts.join(", "))
    }
}

/// What the records a repair dropped meant for one notifier ID's notifications.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifierLoss {
    pub notifier_id: Vec<u8>,
    /// Notifications stored after the cut and not removed after it.
    pub lost: u64,
    /// Notifications kept whose removal (ntf-delete, ntf-clear) was dropped: they come back.
    pub back: u64,
}

impl fmt::Display for NotifierLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.lost > 0 {
            parts.push(format!("{} notification(s) lost", self.lost));
        }
        if self.back > 0 {
            parts.push(format!("{} deleted notification(s) come back", self.back));
        }
        write!(
            f,
            "notifier {}: {}",
            b64(&self.notifier_id),
            parts.join(", ")
        )
    }
}

/// What `repair` did.
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    pub group: u32,
    /// Where the journal was cut (file, offset, why); `None` when it was not.
    pub cut: Option<(PathBuf, u64, String)>,
    /// Valid records kept (before the cut).
    pub records_kept: u64,
    /// Segments after the cut, renamed to `<name>.cut`.
    pub segments_set_aside: Vec<PathBuf>,
    /// Segment files that were shorter than their header says, extended back with zeros: file,
    /// its length before, its length now.
    pub extended: Vec<(PathBuf, u64, u64)>,
    /// The first segment, marked as the group's first since the segments before it are missing:
    /// file, and what was wrong.
    pub marked_first: Option<(PathBuf, String)>,
    /// The missing segment file that the last segment's sync slot said was made (that word was
    /// taken back).
    pub missing_last: Option<PathBuf>,
    /// Records found past the cut and in the segments set aside (read past bad records).
    pub records_dropped: u64,
    /// What the dropped records meant, per queue with a loss (ascending recipient ID).
    pub queues: Vec<QueueLoss>,
    /// What they meant per notifier with a loss (ascending notifier ID).
    pub notifiers: Vec<NotifierLoss>,
    /// Lost records that could not be read, what they were not known: each names the file.
    pub unknown: Vec<String>,
}

impl RepairReport {
    /// Whether the repair changed anything (then the group's checkpoint was removed too).
    pub fn changed(&self) -> bool {
        self.cut.is_some()
            || !self.segments_set_aside.is_empty()
            || !self.extended.is_empty()
            || self.marked_first.is_some()
            || self.missing_last.is_some()
    }
}

impl fmt::Display for RepairReport {
    /// One line for what was done (as before), one for each other fix and each loss that cannot
    /// be told apart, then one per queue and per notifier with a loss.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = self.group;
        match &self.cut {
            None if !self.changed() => write!(
                f,
                "group {g}: no damage found ({} records)",
                self.records_kept
            )?,
            None => write!(f, "group {g}: {} records kept, none cut", self.records_kept)?,
            Some((file, offset, why)) => write!(
                f,
                "group {g}: cut {} at offset {offset} ({why}); {} records kept, everything from \
                 that offset on is gone",
                file.display(),
                self.records_kept
            )?,
        }
        for p in &self.segments_set_aside {
            write!(
                f,
                "; later segment set aside as {}.cut (inspect or delete it)",
                p.display()
            )?;
        }
        for (file, was, now) in &self.extended {
            write!(
                f,
                "\ngroup {g}: {} was cut short to {was} bytes (its header says {now}): extended \
                 back with zeros",
                file.display()
            )?;
        }
        if let Some((file, why)) = &self.marked_first {
            write!(
                f,
                "\ngroup {g}: {}: {why}; marked as the group's first segment: the records \
                 before it are lost, and what they were is not known",
                file.display()
            )?;
        }
        if let Some(file) = &self.missing_last {
            write!(
                f,
                "\ngroup {g}: {} is missing (the segment before it says it was made): its \
                 records are lost, and what they were is not known; the segment before it is \
                 now the last",
                file.display()
            )?;
        }
        for u in &self.unknown {
            write!(f, "\ngroup {g}: {u}")?;
        }
        if self.records_dropped > 0 {
            write!(
                f,
                "\ngroup {g}: {} record(s) dropped past the cut; what they meant:",
                self.records_dropped
            )?;
            if self.queues.is_empty() && self.notifiers.is_empty() {
                write!(f, " nothing that a replay of the kept records misses")?;
            }
        }
        for q in &self.queues {
            write!(f, "\n{q}")?;
        }
        for n in &self.notifiers {
            write!(f, "\n{n}")?;
        }
        Ok(())
    }
}

/// Repairs the journal of `group` under `root` (see the module's comment): cuts it at its first
/// bad record (damage before the synced offset, a torn tail, missing records between segments,
/// a gap in the segment numbers, an unreadable segment header; the bad record's first bytes are
/// zeroed, the segment's synced offset is set to the cut, and later segments are renamed to
/// `seg-….jnl.cut`, kept for inspection and ignored by the journal), extends a segment file that
/// was cut short, and accepts a missing first or last segment in the sync slots. Removes the
/// group's checkpoint when anything changed. Idempotent: a repaired group is left as it is.
///
/// Takes the group lock: the relay must be stopped. Segments of another group or partitioning,
/// and files longer than their header says, are not touched ([`JournalError::Mismatch`]): move
/// them away by hand.
pub fn repair(root: &Path, group: u32) -> Result<RepairReport, JournalError> {
    repair_on(&OsFs, root, group)
}

/// A segment kept, as last seen.
struct Kept<T> {
    id: u64,
    path: PathBuf,
    file: T,
    header: SegmentHeader,
    slot: Slot,
}

/// A record dropped, as far as the report needs it.
struct Dropped {
    kind: Kind,
    id: Vec<u8>,
    msg_id: Option<MsgId>,
}

impl Dropped {
    fn of(rec: &Record<'_>) -> Option<Dropped> {
        let msg_id = match *rec {
            Record::MsgAppend { msg_id, .. }
            | Record::MsgDelete { msg_id, .. }
            | Record::NtfDelete { msg_id, .. } => Some(*msg_id),
            _ => None,
        };
        Some(Dropped {
            kind: rec.kind(),
            id: rec.id()?.to_vec(),
            msg_id,
        })
    }
}

/// Writes the next sync slot of a segment (`synced_end`, `flags`) and makes it durable.
fn write_slot<T: FsFile>(
    file: &T,
    path: &Path,
    header: &SegmentHeader,
    slot: Slot,
    synced_end: u64,
    flags: u32,
) -> Result<Slot, JournalError> {
    let next = Slot {
        count: slot.count + 1,
        synced_end,
        flags: if header.version >= 3 { flags } else { 0 },
    };
    file.write_all_at(&next.encode(header.version), slot.next_at() as u64)
        .map_err(|e| JournalError::io(path, "pwrite", e))?;
    file.sync_data()
        .map_err(|e| JournalError::io(path, "fdatasync", e))?;
    Ok(next)
}

/// The records of `path` found leniently from `from` (nothing if it is shorter than a header).
fn dropped_from<T: FsFile>(
    file: &T,
    path: &Path,
    from: u64,
    out: &mut Vec<Dropped>,
) -> Result<Option<u64>, JournalError> {
    let len = file.size().map_err(|e| JournalError::io(path, "stat", e))?;
    if len < HEADER_LEN {
        return Ok(None);
    }
    let reader = file
        .try_clone()
        .map_err(|e| JournalError::io(path, "dup", e))?;
    let mut first = None;
    scan_lenient(
        &mut PreadSource::new(reader, path, len),
        from,
        |off, rec| {
            first.get_or_insert(off);
            out.extend(Dropped::of(&rec));
        },
    )?;
    Ok(first)
}

/// "seg-…5.jnl" or "seg-…5.jnl to seg-…7.jnl".
fn segment_range(from: u64, to: u64) -> String {
    if from == to {
        segment_file_name(from)
    } else {
        format!("{} to {}", segment_file_name(from), segment_file_name(to))
    }
}

/// [`repair`] on the file system `fs`.
pub fn repair_on<F: Fs>(fs: &F, root: &Path, group: u32) -> Result<RepairReport, JournalError> {
    let (dir, _lock) = open_dir(fs, root, group)?;
    let mut ids = list_segment_ids(fs, &dir)?;
    // Leftovers of an interrupted compaction are not part of the journal (open removes them too).
    let replaced = replaced_ids(fs, &dir, &ids)?;
    if !replaced.is_empty() {
        rewrite_slot(fs, &dir.join(segment_file_name(ids[replaced.len()])))?;
    }
    for &id in &replaced {
        let path = dir.join(segment_file_name(id));
        fs.remove_file(&path)
            .map_err(|e| JournalError::io(&path, "remove", e))?;
    }
    if !replaced.is_empty() {
        sync_dir(fs, &dir)?;
        ids.drain(..replaced.len());
    }
    let mut rep = RepairReport {
        group,
        ..Default::default()
    };
    let mut dropped: Vec<Dropped> = Vec::new();
    let mut next_seq: Option<u64> = None;
    let mut kept: Option<Kept<F::File>> = None;
    let mut cut_from: Option<usize> = None;
    for (i, &id) in ids.iter().enumerate() {
        let path = dir.join(segment_file_name(id));
        // A gap in the numbers: the segments in it are gone, the journal ends before it.
        if let Some(k) = kept.as_ref().filter(|k| id != k.id + 1) {
            let missing = segment_range(k.id + 1, id - 1);
            rep.cut = Some((
                path,
                HEADER_LEN,
                format!("segments before it are missing ({missing})"),
            ));
            let (its, first) = if k.id + 2 == id {
                ("its", dir.join(missing.as_str()).display().to_string())
            } else {
                ("their", dir.join(&missing).display().to_string())
            };
            rep.unknown.push(format!(
                "{first}: missing, {its} records are lost, and what they were is not known"
            ));
            cut_from = Some(i);
            break;
        }
        let file = fs
            .open(&path, true)
            .map_err(|e| JournalError::io(&path, "open", e))?;
        let (header, mut slot, mut len) = match read_header(&file, &path) {
            Ok(x) => x,
            Err(JournalError::Header { reason, .. }) => {
                rep.cut = Some((path, 0, format!("bad segment header: {reason}")));
                cut_from = Some(i);
                break;
            }
            Err(e) => return Err(e),
        };
        // Everything but the file's length, then a longer file is refused and a shorter one
        // extended back to its length (the bytes cut off are zeros now, which end its records).
        header.check(&path, group, id, header.segment_len)?;
        let cut_short = (len < header.segment_len).then_some(len);
        if cut_short.is_none() {
            header.check(&path, group, id, len)?;
        } else {
            preallocate(&file, &path, header.segment_len)?;
            file.sync_all()
                .map_err(|e| JournalError::io(&path, "fsync", e))?;
            rep.extended.push((path.clone(), len, header.segment_len));
            len = header.segment_len;
        }
        if i == 0 {
            if let Some((_, why)) = segment_list_problem(&[(id, &header, &slot)], false) {
                slot = write_slot(
                    &file,
                    &path,
                    &header,
                    slot,
                    slot.synced_end,
                    slot.flags | SLOT_FIRST,
                )?;
                rep.marked_first = Some((path.clone(), why));
            }
        }
        if let Some(n) = next_seq.filter(|&n| header.first_seq != n) {
            rep.cut = Some((
                path,
                HEADER_LEN,
                format!(
                    "first sequence number {}, expected {n}: records missing",
                    header.first_seq
                ),
            ));
            cut_from = Some(i);
            break;
        }
        let reader = file
            .try_clone()
            .map_err(|e| JournalError::io(&path, "dup", e))?;
        let end = scan(
            &mut PreadSource::new(reader, &path, len),
            &path,
            &header,
            |_, _, _| Ok(()),
        )?;
        rep.records_kept += end.records;
        let n = end.last_seq.map_or(header.first_seq, |s| s + 1);
        next_seq = Some(n);
        let follows =
            |fs: &F| crate::journal::next_follows(fs, &dir, id, ids.get(i + 1).copied(), n);
        let bad = match end.bad {
            // Leftovers after the records of a segment the next one follows on exactly.
            Some(b) if b.offset >= slot.synced_end && !b.zero && follows(fs)? => None,
            Some(b) if !b.zero || b.offset < slot.synced_end => Some(b),
            _ => None,
        };
        let Some(bad) = bad else {
            kept = Some(Kept {
                id,
                path,
                file,
                header,
                slot,
            });
            continue;
        };
        // What the cut drops in this segment, read before the bad record's start is zeroed.
        let first_found = dropped_from(&file, &path, bad.offset, &mut dropped)?;
        match cut_short {
            Some(was) => rep.unknown.push(format!(
                "{}: the records from offset {} on were cut off with the file's end (at {was}): \
                 what they were is not known",
                path.display(),
                bad.offset
            )),
            None if bad.zero => rep.unknown.push(format!(
                "{}: zeros from offset {} where durable records were (up to the synced offset \
                 {}): what they were is not known",
                path.display(),
                bad.offset,
                slot.synced_end
            )),
            None if first_found != Some(bad.offset) => rep.unknown.push(format!(
                "{}: the record at offset {} cannot be read ({}): what it was is not known",
                path.display(),
                bad.offset,
                bad.reason
            )),
            None => {}
        }
        // Zero the bad record's start (as far as the scanner looks for a torn tail), so the
        // segment's records end cleanly there; then say "durable up to the cut", and (the
        // segments after it are set aside) that it is the last.
        let z = ZERO_WINDOW.min(len - bad.offset) as usize;
        file.write_all_at(&vec![0u8; z], bad.offset)
            .map_err(|e| JournalError::io(&path, "pwrite", e))?;
        let synced_before = slot.synced_end;
        let slot = write_slot(
            &file,
            &path,
            &header,
            slot,
            bad.offset.min(synced_before).max(HEADER_LEN),
            slot.flags & !SLOT_SUCCESSOR,
        )?;
        let mut why = if bad.offset < synced_before {
            format!("damage before the synced offset {synced_before}")
        } else {
            "torn tail".to_string()
        };
        if let Some(was) = cut_short {
            why = format!("the file was cut short at {was}; {why}");
        }
        rep.cut = Some((path.clone(), bad.offset, format!("{why}: {}", bad.reason)));
        kept = Some(Kept {
            id,
            path,
            file,
            header,
            slot,
        });
        cut_from = Some(i + 1);
        break;
    }

    if let Some(from) = cut_from {
        for (k, &id) in ids[from..].iter().enumerate() {
            let path = dir.join(segment_file_name(id));
            let file = fs
                .open(&path, false)
                .map_err(|e| JournalError::io(&path, "open", e))?;
            dropped_from(&file, &path, HEADER_LEN, &mut dropped)?;
            // The last one said a segment follows it, and none does: that one is lost too.
            if from + k + 1 == ids.len() {
                if let Ok((_, s, _)) = read_header(&file, &path) {
                    if s.flags & SLOT_SUCCESSOR != 0 {
                        rep.unknown.push(format!(
                            "{} is missing (the segment before it, set aside, says it was made): \
                             its records are lost, and what they were is not known",
                            dir.join(segment_file_name(id + 1)).display()
                        ));
                    }
                }
            }
            drop(file);
            let to = dir.join(format!("{}.cut", segment_file_name(id)));
            fs.rename(&path, &to)
                .map_err(|e| JournalError::io(&path, "rename", e))?;
            rep.segments_set_aside.push(path);
        }
        sync_dir(fs, &dir)?;
    }
    // The last segment kept is the last: no segment follows it (the segments after it were set
    // aside, or its successor is missing).
    if let Some(k) = &kept {
        if k.slot.flags & SLOT_SUCCESSOR != 0 {
            write_slot(
                &k.file,
                &k.path,
                &k.header,
                k.slot,
                k.slot.synced_end,
                k.slot.flags & !SLOT_SUCCESSOR,
            )?;
            if cut_from.is_none() {
                rep.missing_last = Some(dir.join(segment_file_name(k.id + 1)));
            }
        }
    }
    if !rep.changed() {
        return Ok(rep);
    }
    // The checkpoint may cover records the cut removed: the next open replays everything.
    crate::checkpoint::remove_checkpoint(fs, &dir)?;
    let (_, kept_index) = check_group_on(fs, root, group, None)?;
    rep.records_dropped = dropped.len() as u64;
    let (queues, notifiers) = losses(&kept_index, &dropped, rep.marked_first.is_some());
    rep.queues = queues;
    rep.notifiers = notifiers;
    Ok(rep)
}

/// What the `dropped` records (in order) meant, against the records kept (`kept`, finished): per
/// queue and per notifier with a loss. `missing_first`: the group's first segment was found
/// missing, so queues whose records start with an update lost their older ones.
fn losses(
    kept: &Index,
    dropped: &[Dropped],
    missing_first: bool,
) -> (Vec<QueueLoss>, Vec<NotifierLoss>) {
    /// A queue as the dropped records go on.
    struct Q {
        loss: QueueLoss,
        exists: bool,
        /// Messages appended after the cut, still live.
        appended: HashSet<MsgId>,
        /// Kept messages whose delete was dropped.
        back: HashSet<MsgId>,
    }
    let mut qs: BTreeMap<Vec<u8>, Q> = BTreeMap::new();
    let mut ns: BTreeMap<Vec<u8>, (NotifierLoss, u64)> = BTreeMap::new();
    for d in dropped {
        let ntf = matches!(d.kind, Kind::NtfAppend | Kind::NtfDelete | Kind::NtfClear);
        if ntf {
            let (n, pending_kept) = ns.entry(d.id.clone()).or_insert_with(|| {
                (
                    NotifierLoss {
                        notifier_id: d.id.clone(),
                        ..Default::default()
                    },
                    kept.ntfs.get(&d.id).copied().unwrap_or(0),
                )
            });
            match d.kind {
                Kind::NtfAppend => n.lost += 1,
                Kind::NtfDelete if n.lost > 0 => n.lost -= 1,
                Kind::NtfDelete if *pending_kept > 0 => {
                    *pending_kept -= 1;
                    n.back += 1;
                }
                Kind::NtfClear => {
                    n.back += *pending_kept;
                    *pending_kept = 0;
                    n.lost = 0;
                }
                _ => {}
            }
            continue;
        }
        let kept_q = kept.queues.get(&d.id);
        let q = qs.entry(d.id.clone()).or_insert_with(|| Q {
            loss: QueueLoss {
                recipient_id: d.id.clone(),
                ..Default::default()
            },
            exists: kept_q.is_some(),
            appended: HashSet::new(),
            back: HashSet::new(),
        });
        match d.kind {
            Kind::QueueCreate | Kind::QueueUpdate => {
                if !q.exists {
                    // As the relay: an update of an unknown queue makes it.
                    q.exists = true;
                    q.loss.created_lost = true;
                } else if d.kind == Kind::QueueUpdate && !q.loss.created_lost {
                    q.loss.changes_lost += 1;
                }
            }
            Kind::QueueDelete => {
                if q.exists && !q.loss.created_lost && kept_q.is_some() {
                    q.loss.deletion_lost = true;
                    q.loss.back_with = kept_q.map_or(0, |k| k.msgs.len() as u64);
                }
                // Created and deleted after the cut: nothing of it is missed.
                q.loss.created_lost = false;
                q.loss.changes_lost = 0;
                q.exists = false;
                q.appended.clear();
                q.back.clear();
            }
            Kind::MsgAppend => {
                q.appended.extend(d.msg_id);
            }
            Kind::MsgDelete => {
                let Some(m) = d.msg_id else { continue };
                if !q.appended.remove(&m) && kept_q.is_some_and(|k| k.has(&m)) {
                    q.back.insert(m);
                }
            }
            _ => {}
        }
    }
    for q in qs.values_mut() {
        q.loss.messages_lost = q.appended.len() as u64;
        q.loss.messages_back = if q.loss.deletion_lost {
            // Counted in the queue that comes back.
            0
        } else {
            q.back.len() as u64
        };
    }
    let mut out: BTreeMap<Vec<u8>, QueueLoss> =
        qs.into_iter().map(|(id, q)| (id, q.loss)).collect();
    fn entry<'a>(out: &'a mut BTreeMap<Vec<u8>, QueueLoss>, id: &[u8]) -> &'a mut QueueLoss {
        out.entry(id.to_vec()).or_insert_with(|| QueueLoss {
            recipient_id: id.to_vec(),
            ..Default::default()
        })
    }
    for (id, q) in kept.parked() {
        entry(&mut out, id).messages_unowned = q.msgs.len() as u64;
    }
    if missing_first {
        for (id, q) in &kept.queues {
            if q.made_by == Kind::QueueUpdate {
                entry(&mut out, id).history_lost = true;
            }
        }
    }
    let queues = out
        .into_values()
        .filter(|l| {
            l.messages_lost > 0
                || l.messages_back > 0
                || l.created_lost
                || l.deletion_lost
                || l.changes_lost > 0
                || l.messages_unowned > 0
                || l.history_lost
        })
        .collect();
    let notifiers = ns
        .into_values()
        .map(|(n, _)| n)
        .filter(|n| n.lost > 0 || n.back > 0)
        .collect();
    (queues, notifiers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Location;

    fn rid(n: u8) -> Vec<u8> {
        (0u32..)
            .map(|k| {
                let mut id = vec![n; 8];
                id.extend_from_slice(&k.to_le_bytes());
                id
            })
            .find(|id| crate::group_of(id) == 0)
            .unwrap()
    }

    /// The index of the records kept (group 0, whole history).
    fn kept(recs: &[Record<'_>]) -> Index {
        let mut ix = Index::new(0, PathBuf::from("/j/g00"), None);
        for (i, r) in recs.iter().enumerate() {
            let loc = Location {
                segment: 1,
                offset: 4096 + 64 * i as u64,
            };
            ix.record(loc, i as u64 + 1, r);
        }
        ix.finish(false);
        ix
    }

    fn dropped(recs: &[Record<'_>]) -> Vec<Dropped> {
        recs.iter().filter_map(Dropped::of).collect()
    }

    fn append<'a>(q: &'a [u8], m: &'a MsgId) -> Record<'a> {
        Record::MsgAppend {
            recipient_id: q,
            msg_id: m,
            ts: 0,
            flags: 0,
            body: b"",
        }
    }

    #[test]
    fn a_queue_made_and_deleted_past_the_cut_costs_nothing() {
        let q = rid(1);
        let m = [1; 24];
        let k = kept(&[]);
        let d = dropped(&[
            Record::QueueCreate {
                recipient_id: &q,
                data: b"",
            },
            append(&q, &m),
            Record::QueueUpdate {
                recipient_id: &q,
                data: b"",
            },
            Record::QueueDelete { recipient_id: &q },
        ]);
        let (qs, ns) = losses(&k, &d, false);
        assert!(qs.is_empty(), "{qs:?}");
        assert!(ns.is_empty());
    }

    #[test]
    fn a_lost_deletion_brings_the_queue_back_with_its_messages() {
        let q = rid(1);
        let (m1, m2) = ([1; 24], [2; 24]);
        let k = kept(&[
            Record::QueueCreate {
                recipient_id: &q,
                data: b"",
            },
            append(&q, &m1),
            append(&q, &m2),
        ]);
        let d = dropped(&[
            Record::MsgDelete {
                recipient_id: &q,
                msg_id: &m1,
            },
            Record::QueueDelete { recipient_id: &q },
        ]);
        let (qs, _) = losses(&k, &d, false);
        assert_eq!(
            qs,
            [QueueLoss {
                recipient_id: q.clone(),
                deletion_lost: true,
                back_with: 2,
                ..Default::default()
            }]
        );
        assert_eq!(
            qs[0].to_string(),
            format!(
                "queue {}: its deletion is lost: the queue is back with 2 message(s)",
                b64(&q)
            )
        );
    }

    #[test]
    fn notifications_lost_and_back_follow_the_dropped_records_in_order() {
        let n = b"notifier".to_vec();
        let ntf = |d: &'static [u8]| Record::NtfAppend {
            notifier_id: b"notifier",
            data: d,
        };
        let del = Record::NtfDelete {
            notifier_id: b"notifier",
            msg_id: &[0; 24],
        };
        // Kept: 3 pending.
        let k = kept(&[ntf(b"1"), ntf(b"2"), ntf(b"3")]);
        // Dropped: one new, two deletes (the new one, then a kept one), two more new.
        let d = dropped(&[ntf(b"4"), del, del, ntf(b"5"), ntf(b"6")]);
        let (_, ns) = losses(&k, &d, false);
        assert_eq!(
            ns,
            [NotifierLoss {
                notifier_id: n.clone(),
                lost: 2,
                back: 1,
            }]
        );
        // A clear brings back every kept one still pending and ends what was new before it.
        let d = dropped(&[
            ntf(b"4"),
            del,
            del,
            Record::NtfClear { notifier_id: &n },
            ntf(b"5"),
        ]);
        let (_, ns) = losses(&k, &d, false);
        assert_eq!((ns[0].lost, ns[0].back), (1, 3));
        assert_eq!(
            ns[0].to_string(),
            format!(
                "notifier {}: 1 notification(s) lost, 3 deleted notification(s) come back",
                b64(&n)
            )
        );
    }

    #[test]
    fn a_missing_first_segment_names_queues_made_by_an_update_and_unowned_messages() {
        let (q, orphan) = (rid(1), rid(2));
        let m = [1; 24];
        let mut ix = Index::new(0, PathBuf::from("/j/g00"), None);
        let recs = [
            Record::QueueUpdate {
                recipient_id: &q,
                data: b"",
            },
            append(&orphan, &m),
        ];
        for (i, r) in recs.iter().enumerate() {
            let loc = Location {
                segment: 2,
                offset: 4096 + 64 * i as u64,
            };
            ix.record(loc, 10 + i as u64, r);
        }
        ix.finish(true);
        let (mut qs, _) = losses(&ix, &[], true);
        qs.sort_by(|a, b| a.recipient_id.cmp(&b.recipient_id));
        let mut want = vec![
            QueueLoss {
                recipient_id: q.clone(),
                history_lost: true,
                ..Default::default()
            },
            QueueLoss {
                recipient_id: orphan.clone(),
                messages_unowned: 1,
                ..Default::default()
            },
        ];
        want.sort_by(|a, b| a.recipient_id.cmp(&b.recipient_id));
        assert_eq!(qs, want);
        // Without a missing first segment, only the unowned message is a loss.
        let (qs, _) = losses(&ix, &[], false);
        assert_eq!(qs.len(), 1);
        assert_eq!(qs[0].recipient_id, orphan);
    }
}
