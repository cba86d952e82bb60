//! One segment file: created preallocated, mapped `MAP_SHARED`, never truncated.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::error::JournalError;
use crate::format::{
    record_crc, RecordHeader, SegmentHeader, Slot, FORMAT_VERSION, HEADER_LEN, RECORD_ALIGN,
    RECORD_HEADER_LEN, RECORD_MAGIC, SLOT_LEN,
};
use crate::fs::{is_no_space, Fs, FsFile, FsMap};

/// The file name of segment `id`: `seg-000000001.jnl`.
pub fn segment_file_name(id: u64) -> String {
    format!("seg-{id:09}.jnl")
}

/// The segment number of a file name made by [`segment_file_name`].
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".jnl")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Segment numbers in a group directory, ascending.
pub(crate) fn list_segment_ids<F: Fs>(fs: &F, dir: &Path) -> Result<Vec<u64>, JournalError> {
    let mut ids: Vec<u64> = fs
        .list(dir)
        .map_err(|e| JournalError::io(dir, "read_dir", e))?
        .iter()
        .filter_map(|name| parse_segment_file_name(name))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// The segments of `ids` (ascending) that are no longer the group's: every one numbered below the
/// highest segment that is the group's first, by its header (`SEGMENT_COMPACTED`: a compacted
/// segment replaces the ones before it) or its sync slot (`SLOT_FIRST`: the ones before it were
/// removed as dead). Such files are left over from a compaction interrupted between its rename
/// and its removals, or from a removal that failed; they are not read.
pub(crate) fn replaced_ids<F: Fs>(
    fs: &F,
    dir: &Path,
    ids: &[u64],
) -> Result<Vec<u64>, JournalError> {
    for (i, &id) in ids.iter().enumerate().rev() {
        let path = dir.join(segment_file_name(id));
        let file = match fs.open(&path, false) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(JournalError::io(&path, "open", e)),
        };
        if let Ok((h, slot, _)) = read_header(&file, &path) {
            if h.flags & crate::format::SEGMENT_COMPACTED != 0
                || slot.flags & crate::format::SLOT_FIRST != 0
            {
                return Ok(ids[..i].to_vec());
            }
        }
    }
    Ok(Vec::new())
}

/// Makes the current sync slot of the segment at `path` durable, by writing it again in the next
/// slot and fsyncing the file. Its flags may be ones whose write-back failed (the page cache
/// holds them, a power loss would not): the open that trusts them before it removes files must
/// make them durable first.
pub(crate) fn rewrite_slot<F: Fs>(fs: &F, path: &Path) -> Result<(), JournalError> {
    let file = fs
        .open(path, true)
        .map_err(|e| JournalError::io(path, "open", e))?;
    let (h, slot, _) = read_header(&file, path)?;
    let next = crate::format::Slot {
        count: slot.count + 1,
        ..slot
    };
    file.write_all_at(&next.encode(h.version), slot.next_at() as u64)
        .map_err(|e| JournalError::io(path, "pwrite", e))?;
    file.sync_all()
        .map_err(|e| JournalError::io(path, "fsync", e))
}

/// fsyncs a directory, so that file creations, renames and removals in it are durable.
pub(crate) fn sync_dir<F: Fs>(fs: &F, dir: &Path) -> Result<(), JournalError> {
    fs.sync_dir(dir)
        .map_err(|e| JournalError::io(dir, "fsync directory", e))
}

/// Creates `dir` and the missing directories above it, each made durable in its parent (the
/// parent fsynced after the child was made): a directory whose name a crash may lose would take
/// every durable file in it along.
pub fn create_dir_durable<F: Fs>(fs: &F, dir: &Path) -> Result<(), JournalError> {
    if fs.is_dir(dir) {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(fs, parent)?;
        fs.create_dir_all(dir)
            .map_err(|e| JournalError::io(dir, "create directory", e))?;
        sync_dir(fs, parent)
    } else {
        fs.create_dir_all(dir)
            .map_err(|e| JournalError::io(dir, "create directory", e))
    }
}

/// A random-enough number: a chain seed only has to differ from the seed of an earlier file of
/// the same name, a writer number from the previous open's.
pub(crate) fn random_u32(id: u64) -> u32 {
    use std::sync::atomic::AtomicU32;
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut b = Vec::with_capacity(36);
    b.extend_from_slice(&nanos.to_le_bytes());
    b.extend_from_slice(&std::process::id().to_le_bytes());
    b.extend_from_slice(&id.to_le_bytes());
    b.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    crc32c::crc32c(&b)
}

/// Allocates `len` bytes of disk for `file` (and sets its length), so that writes through the
/// mapping never need new blocks: a full disk shows up here, never later as SIGBUS.
pub(crate) fn preallocate<F: FsFile>(file: &F, path: &Path, len: u64) -> Result<(), JournalError> {
    file.allocate(len).map_err(|e| {
        if is_no_space(&e) {
            JournalError::NoSpace {
                path: path.to_path_buf(),
                source: e,
            }
        } else {
            JournalError::io(path, "fallocate", e)
        }
    })
}

/// A mapped segment. Shared (`Arc`) between the journal, which appends, and its sync handles,
/// which msync and write the sync slots.
///
/// Who touches which bytes: the appender (the `Journal`, one thread, `&mut`) writes record bytes
/// at and after `written_end`, then publishes the new `written_end` (Release); readers on the
/// appender's thread read record bytes below `written_end`; sync handles write only the sync slots
/// in the header page, under the journal's sync lock, and never read or write record bytes (the
/// kernel reads them for msync). No byte is written by one thread while another reads or writes
/// it.
pub(crate) struct Segment<F: Fs> {
    pub id: u64,
    pub path: PathBuf,
    pub header: SegmentHeader,
    pub len: u64,
    map: F::Map,
    /// End of the last appended record.
    pub written_end: AtomicU64,
    /// End of the records made durable (the current sync slot's value).
    pub synced_end: AtomicU64,
    /// The count and flags of the current sync slot; written under the sync lock only.
    pub slot_count: AtomicU64,
    slot_flags: AtomicU32,
    _file: F::File,
}

impl<F: Fs> Segment<F> {
    /// Creates segment `id` of `group` in `dir`: written under a temporary name, preallocated,
    /// header written, then renamed. The directory is not fsynced here (a sync handle does it
    /// before it reports anything in this segment durable).
    pub fn create(
        fs: &F,
        dir: &Path,
        group: u32,
        id: u64,
        len: u64,
        first_seq: u64,
    ) -> Result<Segment<F>, JournalError> {
        let path = dir.join(segment_file_name(id));
        let tmp = dir.join(format!("{}.tmp", segment_file_name(id)));
        let _ = fs.remove_file(&tmp);
        let file = fs.create_new(&tmp).map_err(|e| {
            if is_no_space(&e) {
                JournalError::NoSpace {
                    path: tmp.clone(),
                    source: e,
                }
            } else {
                JournalError::io(&tmp, "create", e)
            }
        })?;
        let header = SegmentHeader {
            version: FORMAT_VERSION,
            group,
            groups: crate::JOURNAL_GROUPS,
            partitions: crate::PARTITIONS,
            partition_function: crate::PARTITION_FUNCTION.to_string(),
            segment: id,
            segment_len: len,
            first_seq,
            chain_seed: random_u32(id),
            flags: 0,
        };
        let made = preallocate(&file, &tmp, len).and_then(|()| {
            file.write_all_at(&header.encode(), 0)
                .map_err(|e| JournalError::io(&tmp, "write header", e))?;
            fs.rename(&tmp, &path)
                .map_err(|e| JournalError::io(&tmp, "rename", e))
        });
        if let Err(e) = made {
            let _ = fs.remove_file(&tmp);
            return Err(e);
        }
        Segment::map(
            fs,
            path,
            file,
            header,
            len,
            Slot {
                count: 0,
                synced_end: HEADER_LEN,
                flags: 0,
            },
        )
    }

    /// Maps an existing segment file whose header was checked.
    pub fn map(
        fs: &F,
        path: PathBuf,
        file: F::File,
        header: SegmentHeader,
        len: u64,
        slot: Slot,
    ) -> Result<Segment<F>, JournalError> {
        // The mapping's soundness (the file is never truncated or resized while mapped, and
        // only this group's journal maps it) is argued at `OsFs::map`.
        let map = fs
            .map(&file, &path, len)
            .map_err(|e| JournalError::io(&path, "mmap", e))?;
        Ok(Segment {
            id: header.segment,
            path,
            header,
            len,
            map,
            written_end: AtomicU64::new(HEADER_LEN),
            synced_end: AtomicU64::new(slot.synced_end),
            slot_count: AtomicU64::new(slot.count),
            slot_flags: AtomicU32::new(slot.flags),
            _file: file,
        })
    }

    /// The whole file as bytes. Only while nothing else touches the segment (open, repair).
    ///
    /// # Safety
    /// No thread may write the segment while the slice lives.
    pub unsafe fn whole(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes long and lives as long as `self`; the caller
        // guarantees no concurrent writes.
        unsafe { std::slice::from_raw_parts(self.map.ptr(), self.len as usize) }
    }

    /// Record bytes `[from, to)`, both at or after the header page and at or before
    /// `written_end`. Any thread may read them: bytes below `written_end` are never written again
    /// (the compaction thread reads non-active segments this way).
    pub fn records(&self, from: u64, to: u64) -> &[u8] {
        assert!(HEADER_LEN <= from && from <= to && to <= self.written_end.load(Ordering::Acquire));
        // SAFETY: in bounds (asserted: `written_end` never exceeds `len`). Bytes below
        // `written_end` are complete records that nobody writes any more: the appender only writes
        // at and after `written_end`, and sync handles write only the header page, which starts
        // below `HEADER_LEN`.
        unsafe {
            std::slice::from_raw_parts(self.map.ptr().add(from as usize), (to - from) as usize)
        }
    }

    /// The record at `offset`: its header and payload, the CRC checked when `check_crc`. Any
    /// thread may call it (see `records`). The error says what is wrong there.
    pub fn record_at(
        &self,
        offset: u64,
        check_crc: bool,
    ) -> Result<(RecordHeader, &[u8]), &'static str> {
        let written = self.written_end.load(Ordering::Acquire);
        if offset < HEADER_LEN || offset % RECORD_ALIGN != 0 || offset + RECORD_HEADER_LEN > written
        {
            return Err("outside the segment's records");
        }
        let hb = self.records(offset, offset + RECORD_HEADER_LEN);
        if hb[0..4] != RECORD_MAGIC {
            return Err("no record starts here");
        }
        let h = RecordHeader::decode(hb);
        let total = RECORD_HEADER_LEN + h.len as u64;
        if offset + total > written {
            return Err("record length runs past the written end");
        }
        let all = self.records(offset, offset + total);
        let payload = &all[RECORD_HEADER_LEN as usize..];
        if check_crc && record_crc(all, payload) != h.crc {
            return Err("CRC mismatch");
        }
        Ok((h, payload))
    }

    /// The bytes `[at, at + n)` for the appender to fill. `at >= written_end`, `at + n <= len`.
    ///
    /// # Safety
    /// Only the appender (the `Journal` through `&mut self`) may call this, and the slice must be
    /// dropped before `written_end` is moved past it.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn tail_mut(&self, at: u64, n: u64) -> &mut [u8] {
        assert!(at >= self.written_end.load(Ordering::Relaxed) && at + n <= self.len);
        // SAFETY: in bounds (asserted). Bytes at and after `written_end` are read by no one in
        // this process (readers stop at `written_end`, sync handles only msync them, which is
        // the kernel's business) and written only by the appender, whom the caller guarantees.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr().add(at as usize), n as usize) }
    }

    /// Zeroes the bytes from `at` (the end of the records) up to the first all-zero window, so
    /// that leftovers of a torn tail do not follow the records appended from now on, and makes
    /// the zeros durable (a crash must not bring the leftovers back behind later records). Only
    /// at open, before any sync handle exists.
    pub fn zero_leftovers(&self, at: u64) -> Result<(), JournalError> {
        let mut p = at;
        while p < self.len {
            let n = crate::scan::ZERO_WINDOW.min(self.len - p);
            // SAFETY: `p >= written_end` (the caller set `written_end` to `at`) and in bounds;
            // we are the only user of the segment during open.
            let chunk = unsafe { self.tail_mut(p, n) };
            if chunk.iter().all(|&b| b == 0) {
                break;
            }
            chunk.fill(0);
            p += n;
        }
        if p > at {
            self.sync_range(at, p)?;
        }
        Ok(())
    }

    /// Whether every page of record bytes `[from, to)` is in memory (mincore), so that reading
    /// them takes no disk read. `false` when it cannot tell.
    pub fn resident(&self, from: u64, to: u64) -> bool {
        self.map.resident(from, to.min(self.len))
    }

    /// Reads one byte of every page of record bytes `[from, to)`, so that the kernel brings them
    /// into memory (on the calling thread, which may block on the disk).
    pub fn touch(&self, from: u64, to: u64) {
        let to = to.min(self.written_end.load(Ordering::Acquire));
        if from < HEADER_LEN || from >= to {
            return;
        }
        let bytes = self.records(from, to);
        let mut sum = 0u8;
        for i in (0..bytes.len()).step_by(4096) {
            sum = sum.wrapping_add(bytes[i]);
        }
        std::hint::black_box(sum);
    }

    /// Asks the kernel to drop this segment's pages from memory (its clean ones; dirty pages,
    /// not yet synced, stay). Later reads fault them in again.
    pub fn evict(&self) -> Result<(), JournalError> {
        self.map
            .evict()
            .map_err(|e| JournalError::io(&self.path, "evict", e))
    }

    /// msync (MS_SYNC) of record bytes `[from, to)`.
    pub fn sync_range(&self, from: u64, to: u64) -> Result<(), JournalError> {
        self.map
            .flush(from as usize, (to - from) as usize)
            .map_err(|e| JournalError::io(&self.path, "msync", e))
    }

    /// Writes the next sync slot saying "durable up to `end`", with the slot flags so far, `set`
    /// added and `clear` taken away (version 3 segments; older ones have none), and msyncs the
    /// header page. Called under the journal's sync lock (or at open, before any sync handle),
    /// after the records up to `end` were msynced.
    pub fn write_slot(&self, end: u64, set: u32, clear: u32) -> Result<(), JournalError> {
        let cur = Slot {
            count: self.slot_count.load(Ordering::Relaxed),
            synced_end: 0,
            flags: 0,
        };
        let flags = if self.header.version >= 3 {
            (self.slot_flags.load(Ordering::Relaxed) | set) & !clear
        } else {
            0
        };
        let next = Slot {
            count: cur.count + 1,
            synced_end: end,
            flags,
        };
        let at = cur.next_at();
        let bytes = next.encode(self.header.version);
        // SAFETY: the slot lies inside the header page (`at + SLOT_LEN <= HEADER_LEN`), which no
        // one else in this process reads or writes after open: the appender and readers touch
        // only bytes from `HEADER_LEN` on, and slot writes are serialized by the sync lock.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.ptr().add(at), SLOT_LEN);
        }
        self.map
            .flush(0, HEADER_LEN as usize)
            .map_err(|e| JournalError::io(&self.path, "msync header", e))?;
        self.slot_count.store(next.count, Ordering::Relaxed);
        self.slot_flags.store(flags, Ordering::Relaxed);
        self.synced_end.store(end, Ordering::Release);
        Ok(())
    }

    /// The flags of the current sync slot.
    pub fn slot_flags(&self) -> u32 {
        self.slot_flags.load(Ordering::Relaxed)
    }
}

/// Reads a segment file's header with `pread` (no mapping): the fixed header and the current
/// sync slot.
pub(crate) fn read_header<T: FsFile>(
    file: &T,
    path: &Path,
) -> Result<(SegmentHeader, Slot, u64), JournalError> {
    let len = file.size().map_err(|e| JournalError::io(path, "stat", e))?;
    if len < HEADER_LEN {
        return Err(JournalError::Header {
            file: path.to_path_buf(),
            reason: format!("file is {len} bytes, shorter than a header"),
        });
    }
    let mut page = vec![0u8; HEADER_LEN as usize];
    file.read_exact_at(&mut page, 0)
        .map_err(|e| JournalError::io(path, "pread", e))?;
    let header = SegmentHeader::decode(&page, path)?;
    let slot = Slot::current(&page, header.version);
    Ok((header, slot, len))
}
