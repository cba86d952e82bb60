//! The inspection reader: reads segment files with `pread`, never maps them and takes no lock,
//! so it may run while the relay appends. It verifies every record's CRC and chain, and calls a
//! bad record before a segment's synced offset damage; past it, the relay may still be writing,
//! so a bad record there is only "the end so far" (a torn tail if the relay is stopped).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::JournalError;
use crate::format::SEGMENT_COMPACTED;
use crate::format::{Kind, Record, HEADER_LEN};
use crate::fs::{Fs, FsFile, OsFs};
use crate::scan::{scan, PreadSource};
use crate::segment::{list_segment_ids, read_header};
use crate::{group_dir, segment_file_name, Location};

/// How the records of a segment end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentEnd {
    /// Records fill the file to its end.
    Full,
    /// Zero bytes follow the last record: the preallocated rest.
    Zeros { offset: u64 },
    /// A bad record at or past the synced offset: a torn tail (or, on a running relay, a record
    /// being written).
    Torn { offset: u64, reason: String },
    /// A bad record (or missing records) before the synced offset: damage.
    Damage { offset: u64, reason: String },
}

/// One segment as the reader found it.
#[derive(Debug, Clone)]
pub struct SegmentReport {
    pub id: u64,
    pub path: PathBuf,
    /// File length.
    pub len: u64,
    pub first_seq: u64,
    /// The durable end its header records.
    pub synced_end: u64,
    /// End of the last valid record.
    pub end: u64,
    /// Valid records.
    pub records: u64,
    /// Sequence number of the last valid record.
    pub last_seq: Option<u64>,
    /// Valid records per kind.
    pub by_kind: BTreeMap<Kind, u64>,
    pub stop: SegmentEnd,
    /// The segment's fixed header and its sync slot as read.
    pub(crate) header: crate::format::SegmentHeader,
    pub(crate) slot: crate::format::Slot,
}

/// Reads one segment file (which must belong to `group`), calling `f` with every valid record in
/// order, and reports how it ends.
pub fn read_segment(
    path: &Path,
    group: u32,
    mut f: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
) -> Result<SegmentReport, JournalError> {
    let file = OsFs
        .open(path, false)
        .map_err(|e| JournalError::io(path, "open", e))?;
    read_open_segment(file, path, group, &mut f)
}

/// [`read_segment`] of a file already open.
fn read_open_segment<T: FsFile>(
    file: T,
    path: &Path,
    group: u32,
    mut f: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
) -> Result<SegmentReport, JournalError> {
    let (header, slot, len) = read_header(&file, path)?;
    let id = header.segment;
    // A file shorter than its header says lost its end (someone cut it): its records up to
    // there are read, and it is damage. Any other disagreement is not a segment of this journal.
    let truncated = len < header.segment_len;
    header.check(
        path,
        group,
        id,
        if truncated { header.segment_len } else { len },
    )?;
    let mut by_kind = BTreeMap::new();
    let end = scan(
        &mut PreadSource::new(file, path, len),
        path,
        &header,
        |loc, seq, rec| {
            *by_kind.entry(rec.kind()).or_insert(0) += 1;
            f(loc, seq, rec)
        },
    )?;
    let stop = match end.bad {
        _ if truncated => SegmentEnd::Damage {
            offset: end.bad.as_ref().map_or(end.end, |b| b.offset),
            reason: format!(
                "the file has {len} bytes, its header says {}: it was cut short, and the \
                 records from here on are lost (`smp-journal repair` extends it with zeros and \
                 cuts the journal here)",
                header.segment_len
            ),
        },
        None => SegmentEnd::Full,
        Some(b) if b.offset < slot.synced_end => SegmentEnd::Damage {
            offset: b.offset,
            reason: format!(
                "{} (before the synced offset {})",
                b.reason, slot.synced_end
            ),
        },
        Some(b) if b.zero => SegmentEnd::Zeros { offset: b.offset },
        Some(b) => SegmentEnd::Torn {
            offset: b.offset,
            reason: b.reason,
        },
    };
    Ok(SegmentReport {
        id,
        path: path.to_path_buf(),
        len,
        first_seq: header.first_seq,
        synced_end: slot.synced_end,
        end: end.end,
        records: end.records,
        last_seq: end.last_seq,
        by_kind,
        stop,
        header,
        slot,
    })
}

impl SegmentReport {
    /// The segment's fixed header.
    pub fn header(&self) -> &crate::format::SegmentHeader {
        &self.header
    }

    /// The flags of its sync slot in force: [`crate::SLOT_FIRST`], [`crate::SLOT_SUCCESSOR`]
    /// (always 0 in a segment of format version 1 or 2).
    pub fn slot_flags(&self) -> u32 {
        self.slot.flags
    }

    /// Whether the group's records may start here with the records before them gone: its first
    /// sequence number is past 1, it is compacted, or its sync slot says it is the group's first
    /// (segments before it were removed as dead). As the group's first segment, it makes the
    /// group trimmed ([`GroupReport::trimmed`]).
    pub fn starts_later(&self) -> bool {
        self.first_seq > 1
            || self.header.flags & SEGMENT_COMPACTED != 0
            || self.slot.flags & crate::format::SLOT_FIRST != 0
    }
}

/// One group as the reader found it.
#[derive(Debug, Clone)]
pub struct GroupReport {
    pub group: u32,
    pub dir: PathBuf,
    pub segments: Vec<SegmentReport>,
    /// Valid records over all segments.
    pub records: u64,
    /// Valid records per kind over all segments.
    pub by_kind: BTreeMap<Kind, u64>,
    /// Bytes of segment files (as preallocated).
    pub file_bytes: u64,
    /// Bytes of records (headers, payloads, padding) up to each segment's last valid record.
    pub record_bytes: u64,
    /// Damage found: each names the file and offset. Empty when the group is sound.
    pub damage: Vec<String>,
    /// What is not damage but worth saying, each naming the file and offset: a torn tail (on a
    /// running relay, a record being written; after a crash, writes that were never synced),
    /// which `Journal::open` cuts.
    pub warnings: Vec<String>,
}

impl GroupReport {
    /// Whether the group's history starts later than its records do ("trimmed"): its first
    /// segment [starts later](SegmentReport::starts_later). Its records may then refer to queues
    /// and messages whose older records are gone (`crate::check`); a group without segments is
    /// not trimmed.
    pub fn trimmed(&self) -> bool {
        self.segments.first().is_some_and(|s| s.starts_later())
    }
}

/// Reads every segment of `group` under `root` in order, calling `f` with each valid record, and
/// checks that sequence numbers go on from one segment to the next. Segment files that cannot
/// be read at all (bad header, another journal's, longer than its header says) are listed as
/// damage and skipped; a file shorter than its header says is read up to its end and is damage
/// there; a segment removed while the group is read (a running relay dropping a dead segment) is
/// skipped.
///
/// Damage and warnings follow `Journal::open`'s rules (`journal/FORMAT.md`, "Recovery"): a bad
/// record before a segment's synced offset is damage; a bad record past it (a torn tail), or
/// records missing between two segments, is damage only when a later segment has durable
/// records, and otherwise a warning (open cuts there). Records after such a cut are still given
/// to `f`.
pub fn read_group(
    root: &Path,
    group: u32,
    f: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
) -> Result<GroupReport, JournalError> {
    read_group_on(&OsFs, root, group, f)
}

/// [`read_group`] on the file system `fs`.
pub fn read_group_on<F: Fs>(
    fs: &F,
    root: &Path,
    group: u32,
    mut f: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
) -> Result<GroupReport, JournalError> {
    let dir = group_dir(root, group);
    let ids = list_segment_ids(fs, &dir)?;
    let mut rep = GroupReport {
        group,
        dir: dir.clone(),
        segments: Vec::new(),
        records: 0,
        by_kind: BTreeMap::new(),
        file_bytes: 0,
        record_bytes: 0,
        damage: Vec::new(),
        warnings: Vec::new(),
    };
    // Cut points found on the way (index into `rep.segments`, message), judged once every
    // segment's synced offset is known.
    let mut cuts: Vec<(usize, String)> = Vec::new();
    let mut next_seq: Option<u64> = None;
    let mut prev_id: Option<u64> = None;
    // The cut of the previous segment's torn tail, if it ended with one.
    let mut torn_cut: Option<usize> = None;
    // Every file is opened before any is read, so that a running relay's compaction (which
    // renames a compacted segment over the last one it replaces, then removes the others) is
    // seen whole or not at all: files opened before it are read as they were.
    let mut files = Vec::new();
    for id in ids {
        let path = dir.join(segment_file_name(id));
        match fs.open(&path, false) {
            Ok(file) => files.push((id, path, file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(JournalError::io(&path, "open", e)),
        }
    }
    // Files before the group's first segment (a compacted one, or one whose sync slot says the
    // segments before it were removed as dead) are leftovers that open removes: not read.
    let first = files.iter().rposition(|(_, path, file)| {
        read_header(file, path).is_ok_and(|(h, slot, _)| {
            h.flags & SEGMENT_COMPACTED != 0 || slot.flags & crate::format::SLOT_FIRST != 0
        })
    });
    if let Some(i) = first {
        files.drain(..i);
    }
    for (id, path, file) in files {
        let s = match read_open_segment(file, &path, group, &mut f) {
            Ok(s) => s,
            Err(e @ (JournalError::Header { .. } | JournalError::Mismatch { .. })) => {
                rep.damage.push(e.to_string());
                continue;
            }
            Err(JournalError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        if let (Some(n), Some(p)) = (next_seq, prev_id) {
            let ok = if p + 1 == id {
                s.first_seq == n
            } else {
                s.first_seq >= n
            };
            // The previous segment's "torn tail" was bytes left from an earlier life of the file
            // after its records, when this one follows on exactly: nothing is missing.
            let after_torn = torn_cut.take();
            if let Some(c) = after_torn {
                if p + 1 == id && s.first_seq == n {
                    cuts.remove(c);
                }
            }
            // After a torn tail the gap is that cut's, reported once.
            if !ok && after_torn.is_none() {
                cuts.push((
                    rep.segments.len(),
                    format!(
                        "{}: first sequence number {}, expected {n} (records missing between \
                         segments)",
                        path.display(),
                        s.first_seq
                    ),
                ));
            }
        }
        match &s.stop {
            SegmentEnd::Damage { offset, reason } => rep.damage.push(format!(
                "{}: damaged at offset {offset}: {reason}",
                path.display()
            )),
            SegmentEnd::Torn { offset, reason } => {
                torn_cut = Some(cuts.len());
                cuts.push((
                    rep.segments.len() + 1,
                    format!(
                        "{}: torn tail at offset {offset}, past the synced offset {}: {reason}",
                        path.display(),
                        s.synced_end
                    ),
                ))
            }
            _ => {}
        }
        // After damage the records that follow are unknown: do not report the gap again.
        next_seq = match s.stop {
            SegmentEnd::Damage { .. } => None,
            _ => Some(s.last_seq.map_or(s.first_seq, |x| x + 1)),
        };
        prev_id = Some(id);
        rep.records += s.records;
        for (k, n) in &s.by_kind {
            *rep.by_kind.entry(*k).or_insert(0) += n;
        }
        rep.file_bytes += s.len;
        rep.record_bytes += s.end - HEADER_LEN;
        rep.segments.push(s);
    }
    // Segment files missing (`Journal::open`'s rule): a gap, the first one not the group's
    // first, the last one followed by one that is gone. A running relay may have made the next
    // segment since the directory was listed: then the last one's word is true.
    let list: Vec<_> = rep
        .segments
        .iter()
        .map(|s| (s.id, &s.header, &s.slot))
        .collect();
    if let Some((id, reason)) = crate::journal::segment_list_problem(&list, cuts.is_empty()) {
        let last = rep.segments.last().map(|s| s.id);
        let made_since =
            Some(id) == last && fs.open(&dir.join(segment_file_name(id + 1)), false).is_ok();
        if !made_since {
            rep.damage.push(format!(
                "{}: {reason}",
                dir.join(segment_file_name(id)).display()
            ));
        }
    }
    // A cut loses the segments from `from` on: damage if one of them has durable records.
    for (from, msg) in cuts {
        match rep.segments[from.min(rep.segments.len())..]
            .iter()
            .find(|s| s.synced_end > HEADER_LEN)
        {
            Some(later) => rep.damage.push(format!(
                "{msg} (and a later segment, {}, has durable records)",
                later.path.display()
            )),
            None if from >= rep.segments.len() => rep.warnings.push(msg),
            None => rep.warnings.push(format!(
                "{msg}; the segments after it hold no durable record (opening the journal cuts \
                 there)"
            )),
        }
    }
    Ok(rep)
}

/// The groups that have a directory under `root`, ascending.
pub fn list_groups(root: &Path) -> Result<Vec<u32>, JournalError> {
    list_groups_on(&OsFs, root)
}

/// [`list_groups`] on the file system `fs`.
pub fn list_groups_on<F: Fs>(fs: &F, root: &Path) -> Result<Vec<u32>, JournalError> {
    let mut out = Vec::new();
    for g in 0..crate::JOURNAL_GROUPS {
        if fs.is_dir(&group_dir(root, g)) {
            out.push(g);
        }
    }
    if out.is_empty() && !fs.is_dir(root) {
        return Err(JournalError::io(
            root,
            "read journal root",
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    Ok(out)
}
