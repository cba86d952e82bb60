//! `repair`: cuts a group's journal at its first bad record, so that it opens again.

use std::fmt;
use std::path::PathBuf;

use crate::error::JournalError;
use crate::format::{Slot, HEADER_LEN};
use crate::fs::{Fs, FsFile, OsFs};
use crate::journal::open_dir;
use crate::scan::{scan, PreadSource, ZERO_WINDOW};
use crate::segment::{list_segment_ids, read_header, replaced_ids, sync_dir};
use crate::segment_file_name;

/// What `repair` did.
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    pub group: u32,
    /// Where the journal was cut (file, offset, why); `None` when nothing was wrong.
    pub cut: Option<(PathBuf, u64, String)>,
    /// Valid records kept (before the cut).
    pub records_kept: u64,
    /// Segments after the cut, renamed to `<name>.cut`.
    pub segments_set_aside: Vec<PathBuf>,
}

impl fmt::Display for RepairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cut {
            None => write!(
                f,
                "group {}: no damage found ({} records)",
                self.group, self.records_kept
            )?,
            Some((file, offset, why)) => write!(
                f,
                "group {}: cut {} at offset {offset} ({why}); {} records kept, everything from \
                 that offset on is gone",
                self.group,
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
        Ok(())
    }
}

/// Cuts the journal of `group` under `root` at its first bad record (damage before the synced
/// offset, a torn tail, missing records between segments, an unreadable segment header): the
/// bad record's first bytes are zeroed, the segment's synced offset is set to the cut, and later
/// segments are renamed to `seg-….jnl.cut` (kept for inspection, ignored by the journal). Takes
/// the group lock: the relay must be stopped. Segments of another group or partitioning are not
/// touched ([`JournalError::Mismatch`]): move them away by hand.
pub fn repair(root: &std::path::Path, group: u32) -> Result<RepairReport, JournalError> {
    repair_on(&OsFs, root, group)
}

/// [`repair`] on the file system `fs`.
pub fn repair_on<F: Fs>(
    fs: &F,
    root: &std::path::Path,
    group: u32,
) -> Result<RepairReport, JournalError> {
    let (dir, _lock) = open_dir(fs, root, group)?;
    let mut ids = list_segment_ids(fs, &dir)?;
    // Leftovers of an interrupted compaction are not part of the journal (open removes them too).
    let replaced = replaced_ids(fs, &dir, &ids)?;
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
    let mut next_seq: Option<u64> = None;
    let mut prev_id: Option<u64> = None;
    let mut cut_from: Option<usize> = None;
    for (i, &id) in ids.iter().enumerate() {
        let path = dir.join(segment_file_name(id));
        let file = fs
            .open(&path, true)
            .map_err(|e| JournalError::io(&path, "open", e))?;
        let (header, slot, len) = match read_header(&file, &path) {
            Ok(x) => x,
            Err(JournalError::Header { reason, .. }) => {
                rep.cut = Some((path, 0, format!("bad segment header: {reason}")));
                cut_from = Some(i);
                break;
            }
            Err(e) => return Err(e),
        };
        header.check(&path, group, id, len)?;
        if let (Some(n), Some(p)) = (next_seq, prev_id) {
            let ok = if p + 1 == id {
                header.first_seq == n
            } else {
                header.first_seq >= n
            };
            if !ok {
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
        next_seq = Some(end.last_seq.map_or(header.first_seq, |s| s + 1));
        prev_id = Some(id);
        let follows = |fs: &F| {
            let n = end.last_seq.map_or(header.first_seq, |s| s + 1);
            crate::journal::next_follows(fs, &dir, id, ids.get(i + 1).copied(), n)
        };
        let bad = match end.bad {
            // Leftovers after the records of a segment the next one follows on exactly.
            Some(b) if b.offset >= slot.synced_end && !b.zero && follows(fs)? => continue,
            Some(b) if !b.zero || b.offset < slot.synced_end => b,
            _ => continue,
        };
        // Zero the bad record's start (as far as the scanner looks for a torn tail), so the
        // segment's records end cleanly there; then say "durable up to the cut".
        let n = ZERO_WINDOW.min(len - bad.offset) as usize;
        file.write_all_at(&vec![0u8; n], bad.offset)
            .map_err(|e| JournalError::io(&path, "pwrite", e))?;
        let next = Slot {
            count: slot.count + 1,
            synced_end: bad.offset.min(slot.synced_end).max(HEADER_LEN),
            // The segments after it are set aside: it is the last.
            flags: slot.flags & !crate::format::SLOT_SUCCESSOR,
        };
        file.write_all_at(&next.encode(header.version), slot.next_at() as u64)
            .map_err(|e| JournalError::io(&path, "pwrite", e))?;
        file.sync_data()
            .map_err(|e| JournalError::io(&path, "fdatasync", e))?;
        let why = if bad.offset < slot.synced_end {
            format!("damage before the synced offset {}", slot.synced_end)
        } else {
            "torn tail".to_string()
        };
        rep.cut = Some((path, bad.offset, format!("{why}: {}", bad.reason)));
        cut_from = Some(i + 1);
        break;
    }
    if let Some(from) = cut_from {
        for &id in &ids[from..] {
            let path = dir.join(segment_file_name(id));
            let to = dir.join(format!("{}.cut", segment_file_name(id)));
            fs.rename(&path, &to)
                .map_err(|e| JournalError::io(&path, "rename", e))?;
            rep.segments_set_aside.push(path);
        }
        sync_dir(fs, &dir)?;
    }
    if rep.cut.is_some() {
        // The checkpoint may cover records the cut removed: the next open replays everything.
        crate::checkpoint::remove_checkpoint(fs, &dir)?;
    }
    Ok(rep)
}
