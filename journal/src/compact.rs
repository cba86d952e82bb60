//! Compaction: a group's oldest segments rewritten as one segment that holds only the records the
//! caller still needs (`journal/FORMAT.md`, "Compaction").
//!
//! The caller (the relay, which knows which records are live) picks a prefix of the group's
//! segments, oldest first and never the active one, and lists the records to keep
//! ([`Journal::start_compaction`]). A [`CompactJob`] then runs on any thread: it writes the kept
//! records, in their order, into a new file under a temporary name, preallocated and fsynced, with
//! the [`SEGMENT_COMPACTED`] flag and the number of the prefix's last segment; renames it over
//! that segment; fsyncs the directory; removes the prefix's other files; fsyncs again. The
//! appender goes on meanwhile: the prefix is never written to, and its old mappings stay valid
//! until [`Journal::install_compaction`] swaps in the new segment and hands back where each kept
//! record went.
//!
//! Why a crash at any point is safe: before the rename the old files are untouched (a leftover
//! `.tmp` is removed at open). After it, the compacted segment replaces every lower-numbered one,
//! and open removes any still there. Kept records stay ahead of every later segment, in their
//! order, so a replay applies them before the records that were appended after them; dropped
//! records were dead (deleted by records in the prefix or later, or overwritten), and delete
//! records are only ever dropped with the prefix that holds what they deleted.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{JournalError, Warning};
use crate::format::{
    align, record_crc, RecordHeader, SegmentHeader, Slot, FORMAT_VERSION, HEADER_LEN,
    MIN_SEGMENT_SIZE, RECORD_HEADER_LEN, SEGMENT_COMPACTED, SLOT_FIRST, SLOT_SUCCESSOR,
};
use crate::fs::{is_no_space, Fs, FsFile, OsFs};
use crate::segment::{preallocate, random_u32, segment_file_name, sync_dir, Segment};
use crate::{Location, SyncHandle, SyncPoint};

/// A compaction to run off the appending thread (see the module comment). Dropping it unrun
/// leaves the journal as it was; tell the journal with [`crate::Journal::abandon_compaction`].
pub struct CompactJob<F: Fs = OsFs> {
    /// The group's written point when the records to keep were chosen: every record that made
    /// a dropped one dead ends at or before it, and is durable before the compacted segment
    /// replaces the old ones.
    pub(crate) after: SyncPoint,
    pub(crate) sync: SyncHandle<F>,
    pub(crate) fs: F,
    pub(crate) dir: PathBuf,
    pub(crate) group: u32,
    /// The prefix, ascending; the last one's number is the new segment's.
    pub(crate) sources: Vec<Arc<Segment<F>>>,
    /// Records to keep, ascending.
    pub(crate) keep: Vec<Location>,
    /// The first sequence number of the segment after the prefix: the kept records are numbered
    /// up to just before it, so that it follows the compacted segment.
    pub(crate) next_seq: u64,
}

/// A finished compaction, for [`crate::Journal::install_compaction`].
pub struct Compacted<F: Fs = OsFs> {
    pub(crate) upto: u64,
    pub(crate) segment: Segment<F>,
    /// Every kept record: where it was, where it is now.
    pub moved: Vec<(Location, Location)>,
    /// Bytes of the files it replaced, and of the new one.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Steps after the rename that failed (the compaction stands; open cleans up).
    pub warnings: Vec<Warning>,
}

/// The sync slot of a compacted segment: durable to its end, the group's first segment, and
/// followed by the segment after the prefix it replaces.
fn compacted_slot(end: u64) -> Slot {
    Slot {
        count: 1,
        synced_end: end,
        flags: SLOT_FIRST | SLOT_SUCCESSOR,
    }
}

impl<F: Fs> CompactJob<F> {
    /// The number of the segment the job writes (the prefix's last).
    pub fn upto(&self) -> u64 {
        self.sources.last().map_or(0, |s| s.id)
    }

    /// Writes, renames, removes (see the module comment). Blocks on I/O: run it off the appending
    /// thread. An error before the rename leaves everything as it was (the temporary file
    /// removed); [`JournalError::NoSpace`] when the new file cannot be preallocated.
    pub fn run(self) -> Result<Compacted<F>, JournalError> {
        let upto = self.upto();
        let path = self.dir.join(segment_file_name(upto));
        let tmp = self.dir.join(format!("{}.tmp", segment_file_name(upto)));
        let records = self.kept_records()?;
        let n = records.len() as u64;
        let used: u64 = records
            .iter()
            .map(|(_, _, p)| align(RECORD_HEADER_LEN + p.len() as u64))
            .sum();
        let len = (HEADER_LEN + used)
            .div_ceil(HEADER_LEN)
            .saturating_mul(HEADER_LEN)
            .max(MIN_SEGMENT_SIZE);
        let header = SegmentHeader {
            version: FORMAT_VERSION,
            group: self.group,
            groups: crate::JOURNAL_GROUPS,
            partitions: crate::PARTITIONS,
            partition_function: crate::PARTITION_FUNCTION.to_string(),
            segment: upto,
            segment_len: len,
            first_seq: self.next_seq.saturating_sub(n),
            chain_seed: random_u32(upto),
            flags: SEGMENT_COMPACTED,
        };
        let end = HEADER_LEN + used;
        let (file, moved) = match self.write_tmp(&tmp, &header, &records, end) {
            Ok(x) => x,
            Err(e) => {
                let _ = self.fs.remove_file(&tmp);
                return Err(e);
            }
        };
        // What made the dropped records dead must be durable before they are gone.
        if let Err(e) = self.sync.sync_to(self.after) {
            let _ = self.fs.remove_file(&tmp);
            return Err(e);
        }
        if let Err(e) = self.fs.rename(&tmp, &path) {
            let _ = self.fs.remove_file(&tmp);
            return Err(JournalError::io(&tmp, "rename", e));
        }
        // From here on the compaction stands: failures are warnings, and open finishes the job.
        let mut warnings = Vec::new();
        let mut warn = |e: JournalError| {
            warnings.push(Warning {
                file: path.clone(),
                offset: 0,
                message: format!("compaction: {e} (the next open removes what is left)"),
            })
        };
        if let Err(e) = sync_dir(&self.fs, &self.dir) {
            warn(e);
        }
        let mut removed = false;
        for s in &self.sources[..self.sources.len() - 1] {
            match self.fs.remove_file(&s.path) {
                Ok(()) => removed = true,
                Err(e) => warn(JournalError::io(&s.path, "remove", e)),
            }
        }
        if removed {
            if let Err(e) = sync_dir(&self.fs, &self.dir) {
                warn(e);
            }
        }
        let bytes_before = self.sources.iter().map(|s| s.len).sum();
        let segment = Segment::map(&self.fs, path, file, header, len, compacted_slot(end))?;
        segment.written_end.store(end, Ordering::Release);
        Ok(Compacted {
            upto,
            segment,
            moved,
            bytes_before,
            bytes_after: len,
            warnings,
        })
    }

    /// The kept records: location, kind, payload (copied, so that the sources need not be held
    /// while writing).
    fn kept_records(&self) -> Result<Vec<(Location, u16, Vec<u8>)>, JournalError> {
        let mut out = Vec::with_capacity(self.keep.len());
        for &loc in &self.keep {
            let seg = self
                .sources
                .iter()
                .find(|s| s.id == loc.segment)
                .ok_or_else(|| JournalError::BadLocation {
                    segment: loc.segment,
                    offset: loc.offset,
                    reason: "not in the segments being compacted".into(),
                })?;
            let (h, payload) =
                seg.record_at(loc.offset, true)
                    .map_err(|reason| JournalError::BadLocation {
                        segment: loc.segment,
                        offset: loc.offset,
                        reason: reason.to_string(),
                    })?;
            out.push((loc, h.kind, payload.to_vec()));
        }
        Ok(out)
    }

    /// The new segment under its temporary name: preallocated, header, records (renumbered and
    /// chained afresh), a sync slot saying all of it is durable, fsynced.
    #[allow(clippy::type_complexity)]
    fn write_tmp(
        &self,
        tmp: &std::path::Path,
        header: &SegmentHeader,
        records: &[(Location, u16, Vec<u8>)],
        end: u64,
    ) -> Result<(F::File, Vec<(Location, Location)>), JournalError> {
        let _ = self.fs.remove_file(tmp);
        let file = self.fs.create_new(tmp).map_err(|e| {
            if is_no_space(&e) {
                JournalError::NoSpace {
                    path: tmp.to_path_buf(),
                    source: e,
                }
            } else {
                JournalError::io(tmp, "create", e)
            }
        })?;
        preallocate(&file, tmp, header.segment_len)?;
        let mut buf = vec![0u8; (end - HEADER_LEN) as usize];
        let mut moved = Vec::with_capacity(records.len());
        let writer = random_u32(header.segment ^ 0x5eed);
        let mut prev_crc = header.chain_seed;
        let mut at = 0usize;
        for (i, (old, kind, payload)) in records.iter().enumerate() {
            let h = RecordHeader {
                len: payload.len() as u32,
                seq: header.first_seq + i as u64,
                kind: *kind,
                // Each kept record stands alone: the change it was part of is complete.
                flags: 0,
                prev_crc,
                writer,
                crc: 0,
            };
            let hb = h.encode_without_crc();
            let crc = record_crc(&hb, payload);
            let hl = RECORD_HEADER_LEN as usize;
            buf[at..at + hl].copy_from_slice(&hb);
            buf[at + 28..at + 32].copy_from_slice(&crc.to_le_bytes());
            buf[at + hl..at + hl + payload.len()].copy_from_slice(payload);
            moved.push((
                *old,
                Location {
                    segment: header.segment,
                    offset: HEADER_LEN + at as u64,
                },
            ));
            prev_crc = crc;
            at += align(RECORD_HEADER_LEN + payload.len() as u64) as usize;
        }
        let io = |op: &'static str| move |e| JournalError::io(tmp, op, e);
        file.write_all_at(&header.encode(), 0)
            .map_err(io("write header"))?;
        file.write_all_at(&buf, HEADER_LEN)
            .map_err(io("write records"))?;
        let slot = compacted_slot(end);
        let none = Slot {
            count: 0,
            synced_end: 0,
            flags: 0,
        };
        file.write_all_at(&slot.encode(header.version), none.next_at() as u64)
            .map_err(io("write sync slot"))?;
        file.sync_all().map_err(io("fsync"))?;
        Ok((file, moved))
    }
}
