//! The journal of one partition group: open (recover), append, read by location, sync, remove
//! dead segments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::checkpoint::{
    read_checkpoint, stale_reason, Checkpoint, CheckpointBase, CheckpointPoint, SeenSegment,
};
use crate::compact::{CompactJob, Compacted};
use crate::error::{JournalError, Warning};
use crate::format::{
    record_crc, Kind, Record, RecordHeader, SegmentHeader, HEADER_LEN, MIN_SEGMENT_SIZE,
    RECORD_ALIGN, RECORD_CONTINUES, RECORD_HEADER_LEN, SLOT_FIRST, SLOT_SUCCESSOR,
};
use crate::fs::{Fs, FsFile, OsFs};
use crate::scan::{scan, SliceSource};
use crate::segment::{
    list_segment_ids, read_header, replaced_ids, rewrite_slot, sync_dir, Segment,
};
use crate::space::{
    reserve_of, Priority, SpaceBudget, DEFAULT_RELEASE_RESERVE, RESERVE_SHARE_DIVISOR,
};
use crate::{group_dir, Location, SyncPoint};

/// How a journal is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options<F: Fs = OsFs> {
    /// The file system the journal's files are on: [`OsFs`], or a simulated disk in tests.
    pub fs: F,
    /// Bytes of each new segment file, header included: a multiple of 4096, at least 8192. The
    /// largest record is this minus 4096 + 32 bytes. Existing segments keep the size they were
    /// made with.
    pub segment_size: u64,
    /// Bytes of a group's first segment; each later one is twice the one before, up to
    /// `segment_size` (and always large enough for the record that needs it). A multiple of 4096,
    /// at least 8192, at most `segment_size`. Small, so that an idle group costs little disk: 64
    /// groups × 256 KiB = 16 MiB for a new relay.
    pub initial_segment_size: u64,
    /// The release reserve: the last bytes of each segment, which only [`Priority::Release`]
    /// appends fill (`journal/FORMAT.md`, "Space"). A segment's reserve is the smaller of this and
    /// an eighth of the segment. 0: no reserve.
    pub release_reserve: u64,
    /// A cap on the bytes of segment files shared with other journals; `None`: only the disk's
    /// size bounds them.
    pub budget: Option<SpaceBudget>,
}

/// 256 KiB first segments.
pub const DEFAULT_INITIAL_SEGMENT_SIZE: u64 = 256 << 10;

/// 64 MiB segments.
pub const DEFAULT_SEGMENT_SIZE: u64 = 64 << 20;

impl Default for Options {
    fn default() -> Self {
        Options::on(OsFs)
    }
}

impl<F: Fs> Options<F> {
    /// The default sizes, on `fs`.
    pub fn on(fs: F) -> Options<F> {
        Options {
            fs,
            segment_size: DEFAULT_SEGMENT_SIZE,
            initial_segment_size: DEFAULT_INITIAL_SEGMENT_SIZE,
            release_reserve: DEFAULT_RELEASE_RESERVE,
            budget: None,
        }
    }
}

impl<F: Fs> Options<F> {
    fn check(&self) -> Result<(), JournalError> {
        let s = self.segment_size;
        if s < MIN_SEGMENT_SIZE || s % HEADER_LEN != 0 || s > (1 << 40) {
            return Err(JournalError::Options(format!(
                "segment_size {s}: must be a multiple of {HEADER_LEN}, from {MIN_SEGMENT_SIZE} to 1 TiB"
            )));
        }
        let i = self.initial_segment_size;
        if i < MIN_SEGMENT_SIZE || i % HEADER_LEN != 0 || i > s {
            return Err(JournalError::Options(format!(
                "initial_segment_size {i}: must be a multiple of {HEADER_LEN}, from {MIN_SEGMENT_SIZE} to segment_size"
            )));
        }
        Ok(())
    }

    /// The reserve of a segment of `len` bytes.
    fn reserve(&self, len: u64) -> u64 {
        reserve_of(len, self.release_reserve)
    }

    /// The smallest segment length (a multiple of `HEADER_LEN`, or nearly) that holds a record of
    /// `need` bytes before its reserve: either length below does, as the reserve is at most an
    /// eighth of the segment and at most `release_reserve`.
    fn fits_before_reserve(&self, need: u64) -> u64 {
        let up = |n: u64| n.div_ceil(HEADER_LEN) * HEADER_LEN;
        let x = HEADER_LEN + need;
        let by_share = up((x * RESERVE_SHARE_DIVISOR).div_ceil(RESERVE_SHARE_DIVISOR - 1));
        let by_max = up(x + self.release_reserve);
        by_share.min(by_max)
    }

    /// Where appends of `priority` must stop in a segment of `len` bytes.
    fn limit(&self, len: u64, priority: Priority) -> u64 {
        match priority {
            Priority::Ordinary => len - self.reserve(len),
            Priority::Release => len,
        }
    }
}

/// Creates a segment, taking its bytes from the budget first (and giving them back if the
/// creation fails).
fn create_segment<F: Fs>(
    opts: &Options<F>,
    dir: &Path,
    group: u32,
    id: u64,
    len: u64,
    first_seq: u64,
) -> Result<Segment<F>, JournalError> {
    if let Some(b) = &opts.budget {
        b.take(len)?;
    }
    Segment::create(&opts.fs, dir, group, id, len, first_seq).inspect_err(|_| {
        if let Some(b) = &opts.budget {
            b.give_back(len);
        }
    })
}

/// What `append` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Where the record is: give it to [`Journal::read`].
    pub loc: Location,
    /// The record's sequence number (1, 2, 3 … over the whole group).
    pub seq: u64,
    /// Sync to this point (`SyncHandle::sync_to`) to make the record durable.
    pub end: SyncPoint,
}

/// What opening found, for the caller to log.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    /// Torn tails cut, unfinished segments removed: each with file and offset.
    pub warnings: Vec<Warning>,
    /// Records replayed.
    pub records: u64,
    /// Segments kept.
    pub segments: usize,
    /// The durable point found on disk. Records replayed past it are in the files but not yet
    /// durable: a `sync_all` makes them so.
    pub synced: SyncPoint,
    /// The end of the last record (where appends go on).
    pub written: SyncPoint,
    /// The sequence number the next record will get.
    pub next_seq: u64,
    /// The point of the checkpoint open started from, if it used one.
    pub checkpoint: Option<SyncPoint>,
}

/// One segment as `Journal::segments` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: u64,
    pub path: PathBuf,
    /// File length (as preallocated).
    pub len: u64,
    /// Sequence number of the segment's first record (of the next one, if it has none yet).
    pub first_seq: u64,
    /// End of the last record in it.
    pub written_end: u64,
    /// End of the records made durable.
    pub synced_end: u64,
    /// The segment appends go to; it cannot be removed.
    pub active: bool,
}

/// State shared by the journal and its sync handles.
struct Shared<F: Fs> {
    fs: F,
    dir: PathBuf,
    /// Segments that may hold records not yet durable, ascending; the last is the active one.
    unsynced: Mutex<Vec<Arc<Segment<F>>>>,
    /// Serializes syncs; held across msyncs (the appender never takes it).
    sync_lock: Mutex<SyncState>,
    /// Set with `SyncState::failed`, readable without the sync lock.
    sync_failed: AtomicBool,
    /// The durable point, readable without the sync lock.
    synced_segment: AtomicU64,
    synced_offset: AtomicU64,
    /// The exclusive lock on the group directory, released when the journal and every handle
    /// are gone.
    _lock: F::Lock,
}

struct SyncState {
    /// Set when a sync failed: nothing may be called durable after that.
    failed: Option<String>,
    /// Segments up to this number have their directory entry durable.
    dir_synced_upto: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data (plain fields).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The journal of one partition group: `<root>/gNN/seg-NNNNNNNNN.jnl` files. Appends, reads by
/// location and segment removal go through `&mut self`/`&self` on one thread (the relay's shard);
/// durability comes from a [`SyncHandle`] that may run on any thread.
///
/// Dropping a journal does not sync: at a clean stop call [`SyncHandle::sync_all`] first. (What
/// was appended stays in the files after a process crash; only a machine crash loses what was
/// not synced.)
pub struct Journal<F: Fs = OsFs> {
    group: u32,
    opts: Options<F>,
    segments: BTreeMap<u64, Arc<Segment<F>>>,
    active: Arc<Segment<F>>,
    next_seq: u64,
    last_crc: u32,
    /// This open's writer number, stored in every record it appends.
    writer: u32,
    /// The last segment a running compaction replaces (segments up to it must stay).
    compacting_upto: Option<u64>,
    /// Bytes of this journal's segment files counted in `opts.budget`, given back when dropped.
    counted_bytes: u64,
    shared: Arc<Shared<F>>,
}

/// Makes appended records durable, from any thread. Cheap to clone; keeps the journal's files
/// mapped and its lock held while it lives.
pub struct SyncHandle<F: Fs = OsFs> {
    shared: Arc<Shared<F>>,
}

impl<F: Fs> Clone for SyncHandle<F> {
    fn clone(&self) -> Self {
        SyncHandle {
            shared: self.shared.clone(),
        }
    }
}

/// How long a group lock held elsewhere is waited for before open says [`JournalError::Locked`].
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(300);
const LOCK_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

fn take_lock<F: Fs>(fs: &F, dir: &Path) -> Result<F::Lock, JournalError> {
    let path = dir.join(".lock");
    // A child process forked by this process between its fork and its exec holds a copy of every
    // descriptor, close-on-exec or not, and so the lock of a journal this process just closed:
    // the lock is tried again for a moment before it counts as held by someone else.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        if let Some(l) = fs
            .try_lock(&path)
            .map_err(|e| JournalError::io(&path, "flock", e))?
        {
            return Ok(l);
        }
        if std::time::Instant::now() >= deadline {
            return Err(JournalError::Locked { path });
        }
        std::thread::sleep(LOCK_RETRY_EVERY);
    }
}

/// Opens the group directory exclusively (creating it) and removes leftover temporary files.
pub(crate) fn open_dir<F: Fs>(
    fs: &F,
    root: &Path,
    group: u32,
) -> Result<(PathBuf, F::Lock), JournalError> {
    if group >= crate::JOURNAL_GROUPS {
        return Err(JournalError::Options(format!(
            "group {group}: groups are 0 to {}",
            crate::JOURNAL_GROUPS - 1
        )));
    }
    let dir = group_dir(root, group);
    crate::segment::create_dir_durable(fs, &dir)?;
    let lock = take_lock(fs, &dir)?;
    let names = fs
        .list(&dir)
        .map_err(|e| JournalError::io(&dir, "read_dir", e))?;
    for name in names {
        if (name.starts_with("seg-") && name.ends_with(".jnl.tmp"))
            || name == format!("{}.tmp", crate::checkpoint::CHECKPOINT_FILE)
        {
            let _ = fs.remove_file(&dir.join(name));
        }
    }
    Ok((dir, lock))
}

/// A segment file whose creation did not finish before a crash: shorter than a header, or a
/// header of zeros. (The sync handle makes a segment's header and directory entry durable before
/// it calls anything in it durable, so such a file never held durable records.)
fn unfinished<T: FsFile>(file: &T, path: &Path) -> Result<bool, JournalError> {
    match read_header(file, path) {
        Ok(_) => Ok(false),
        Err(JournalError::Header { reason, .. })
            if reason.contains("all zeros") || reason.contains("shorter than a header") =>
        {
            Ok(true)
        }
        Err(_) => Ok(false),
    }
}

/// Whether any segment after `ids[i]` has durable records (then a cut at `ids[i]` would lose
/// them: the cut point is damage, not a torn tail).
fn later_synced<F: Fs>(fs: &F, dir: &Path, ids: &[u64]) -> Result<Option<PathBuf>, JournalError> {
    for &id in ids {
        let path = dir.join(crate::segment_file_name(id));
        let file = fs
            .open(&path, false)
            .map_err(|e| JournalError::io(&path, "open", e))?;
        if let Ok((_, slot, _)) = read_header(&file, &path) {
            if slot.synced_end > HEADER_LEN {
                return Ok(Some(path));
            }
        }
    }
    Ok(None)
}

/// What the segment files of a group must be before any is read (`journal/FORMAT.md`,
/// "Recovery"): numbered without a gap; the first one the group's first (its first sequence
/// number is 1, it is compacted, or its sync slot says segments before it were removed); the
/// last one not followed by a segment its sync slot says was made (`last_final`: unless open
/// just removed the segments after it). Slot flags exist from format version 3: older segments
/// are taken as they are. Anything else means segment files were deleted or lost: the file to
/// name and why.
pub(crate) fn segment_list_problem(
    segs: &[(u64, &SegmentHeader, &crate::format::Slot)],
    last_final: bool,
) -> Option<(u64, String)> {
    for w in segs.windows(2) {
        let (a, b) = (w[0].0, w[1].0);
        if b != a + 1 {
            let missing = if b == a + 2 {
                crate::segment_file_name(a + 1)
            } else {
                format!(
                    "{} to {}",
                    crate::segment_file_name(a + 1),
                    crate::segment_file_name(b - 1)
                )
            };
            return Some((b, format!("segments before it are missing ({missing})")));
        }
    }
    if let Some(&(first, h, slot)) = segs.first() {
        let is_first = h.first_seq == 1
            || h.flags & crate::format::SEGMENT_COMPACTED != 0
            || slot.flags & SLOT_FIRST != 0
            || h.version < 3;
        if !is_first {
            return Some((
                first,
                format!(
                    "the segments before it are missing: its first record is number {}, and \
                     none of the group's segments was removed as dead to make it the first",
                    h.first_seq
                ),
            ));
        }
    }
    match segs.last() {
        Some(&(last, _, slot)) if last_final && slot.flags & SLOT_SUCCESSOR != 0 => Some((
            last,
            format!(
                "the segment after it, {}, is missing (it was made, and its records are lost)",
                crate::segment_file_name(last + 1)
            ),
        )),
        _ => None,
    }
}

/// [`segment_list_problem`] of the segment files `ids` of a group directory, as damage.
fn check_segment_list<F: Fs>(
    fs: &F,
    dir: &Path,
    ids: &[u64],
    last_final: bool,
) -> Result<(), JournalError> {
    let path_of = |id: u64| dir.join(crate::segment_file_name(id));
    let mut found = Vec::with_capacity(ids.len());
    for &id in ids {
        let path = path_of(id);
        let file = fs
            .open(&path, false)
            .map_err(|e| JournalError::io(&path, "open", e))?;
        let (h, slot, _) = read_header(&file, &path)?;
        found.push((id, h, slot));
    }
    let list: Vec<_> = found.iter().map(|(id, h, s)| (*id, h, s)).collect();
    match segment_list_problem(&list, last_final) {
        Some((id, reason)) => Err(JournalError::Damage {
            file: path_of(id),
            offset: 0,
            synced: 0,
            reason,
        }),
        None => Ok(()),
    }
}

/// Whether segment `next` (the one after segment `id`) exists, is numbered `id + 1` and starts
/// with sequence number `next_seq`: the segments follow on without a record missing.
pub(crate) fn next_follows<F: Fs>(
    fs: &F,
    dir: &Path,
    id: u64,
    next: Option<u64>,
    next_seq: u64,
) -> Result<bool, JournalError> {
    let Some(next) = next.filter(|&n| n == id + 1) else {
        return Ok(false);
    };
    let path = dir.join(crate::segment_file_name(next));
    let file = fs
        .open(&path, false)
        .map_err(|e| JournalError::io(&path, "open", e))?;
    Ok(read_header(&file, &path).is_ok_and(|(h, _, _)| h.first_seq == next_seq))
}

fn remove_files<F: Fs>(
    fs: &F,
    dir: &Path,
    ids: &[u64],
    report: &mut OpenReport,
) -> Result<(), JournalError> {
    for &id in ids {
        let path = dir.join(crate::segment_file_name(id));
        fs.remove_file(&path)
            .map_err(|e| JournalError::io(&path, "remove", e))?;
        report.warnings.push(Warning {
            file: path,
            offset: 0,
            message: "removed: it followed the cut and held no durable record".into(),
        });
    }
    if !ids.is_empty() {
        sync_dir(fs, dir)?;
    }
    Ok(())
}

impl<F: Fs> Journal<F> {
    /// Opens (creating if needed) the journal of `group` under `root`, replaying every record to
    /// `replay` in order with its location and sequence number.
    ///
    /// Recovery rules (`journal/FORMAT.md`, "Recovery"): a bad record at or past a segment's
    /// synced offset is a torn tail: the journal is cut there (later segments, which can hold no
    /// durable record, are removed) and a [`Warning`] names file and offset. A bad record before
    /// the synced offset is damage: [`JournalError::Damage`], which names file and offset and
    /// says to run `smp-journal repair`. A segment of another group or partitioning is
    /// [`JournalError::Mismatch`]. On any error, discard what `replay` built.
    ///
    /// Takes an exclusive lock on the group directory ([`JournalError::Locked`] if held).
    pub fn open(
        root: &Path,
        group: u32,
        opts: &Options<F>,
        replay: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
    ) -> Result<(Journal<F>, OpenReport), JournalError> {
        Self::open_inner(
            root,
            group,
            opts,
            None::<fn(&Checkpoint) -> Result<(), String>>,
            replay,
        )
    }

    /// As [`Journal::open`], starting from the group's checkpoint when it still fits the
    /// segments (`journal/FORMAT.md`, "Checkpoints"): `load` gets it first (build the state from
    /// its blob), then `replay` gets only the records after its point. Without a usable
    /// checkpoint (none, unreadable, or the segments it covers were compacted or cut since: a
    /// warning says which) `load` is not called and every record is replayed. A `load` error
    /// stops the open ([`JournalError::Replay`] naming the checkpoint file; removing the file
    /// makes the next open replay everything).
    pub fn open_from_checkpoint(
        root: &Path,
        group: u32,
        opts: &Options<F>,
        load: impl FnOnce(&Checkpoint) -> Result<(), String>,
        replay: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
    ) -> Result<(Journal<F>, OpenReport), JournalError> {
        Self::open_inner(root, group, opts, Some(load), replay)
    }

    fn open_inner(
        root: &Path,
        group: u32,
        opts: &Options<F>,
        load: Option<impl FnOnce(&Checkpoint) -> Result<(), String>>,
        mut replay: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
    ) -> Result<(Journal<F>, OpenReport), JournalError> {
        opts.check()?;
        let fs = &opts.fs;
        let (dir, lock_file) = open_dir(fs, root, group)?;
        let mut ids = list_segment_ids(fs, &dir)?;
        let mut report = OpenReport::default();

        // A segment whose creation never finished (a crash while rotating: its header or its
        // length was not durable yet) held no durable record; it goes with every later segment,
        // unless one of those has durable records (then something damaged it).
        let mut first_unfinished = None;
        for (i, &id) in ids.iter().enumerate() {
            let path = dir.join(crate::segment_file_name(id));
            let file = fs
                .open(&path, false)
                .map_err(|e| JournalError::io(&path, "open", e))?;
            if unfinished(&file, &path)? {
                first_unfinished = Some(i);
                break;
            }
        }
        if let Some(i) = first_unfinished {
            let path = dir.join(crate::segment_file_name(ids[i]));
            if let Some(p) = later_synced(fs, &dir, &ids[i + 1..])? {
                return Err(JournalError::Damage {
                    file: path,
                    offset: 0,
                    synced: 0,
                    reason: format!(
                        "the segment header is missing, and a later segment, {}, has durable \
                         records",
                        p.display()
                    ),
                });
            }
            let rest = ids.split_off(i);
            let first = report.warnings.len();
            remove_files(fs, &dir, &rest, &mut report)?;
            report.warnings[first].message =
                "removed: segment creation never finished (crash while rotating)".into();
        }
        let cut_at_open = first_unfinished.is_some();

        // Segments before the group's first, left by a compaction interrupted after its rename or
        // by a removal of dead segments that failed.
        let replaced = replaced_ids(fs, &dir, &ids)?;
        if !replaced.is_empty() {
            rewrite_slot(fs, &dir.join(crate::segment_file_name(ids[replaced.len()])))?;
            let first = report.warnings.len();
            remove_files(fs, &dir, &replaced, &mut report)?;
            for w in &mut report.warnings[first..] {
                w.message = "removed: a later segment is the group's first (a compaction or a \
                             removal of dead segments was interrupted before it removed it)"
                    .into();
            }
            ids.drain(..replaced.len());
        }

        check_segment_list(fs, &dir, &ids, !cut_at_open)?;

        let plan = match load {
            Some(load) => Self::checkpoint_plan(fs, root, &dir, group, &ids, &mut report, load)?,
            None => None,
        };

        let mut segments: BTreeMap<u64, Arc<Segment<F>>> = BTreeMap::new();
        let mut next_seq = 1u64;
        let mut last_crc = 0u32;
        let mut i = 0;
        while i < ids.len() {
            let id = ids[i];
            let path = dir.join(crate::segment_file_name(id));
            let file = fs
                .open(&path, true)
                .map_err(|e| JournalError::io(&path, "open", e))?;
            let (header, slot, len) = read_header(&file, &path)?;
            header.check(&path, group, id, len)?;
            if slot.synced_end < HEADER_LEN
                || slot.synced_end > len
                || slot.synced_end % RECORD_ALIGN != 0
            {
                return Err(JournalError::Damage {
                    file: path,
                    offset: 0,
                    synced: slot.synced_end,
                    reason: format!("impossible synced offset {} in the header", slot.synced_end),
                });
            }
            // Sequence numbers go on from segment to segment (`check_segment_list` found the
            // segment numbers consecutive).
            let follows = match segments.values().next_back() {
                None => true,
                Some(_) => header.first_seq == next_seq,
            };
            if !follows {
                // Records of the previous segment are missing (lost with a crash) or this segment
                // is stale: a cut at this segment's start.
                let reason = format!(
                    "first sequence number {}, expected {next_seq}: records before it are missing",
                    header.first_seq
                );
                if let Some(p) = later_synced(fs, &dir, &ids[i..])? {
                    return Err(JournalError::Damage {
                        file: p,
                        offset: HEADER_LEN,
                        synced: 0,
                        reason,
                    });
                }
                let rest = ids[i..].to_vec();
                let first_removed = report.warnings.len();
                remove_files(fs, &dir, &rest, &mut report)?;
                if let Some(w) = report.warnings.get_mut(first_removed) {
                    w.message = format!("{reason}; {}", w.message);
                }
                ids.truncate(i);
                if let Some(prev) = segments.values().next_back() {
                    prev.write_slot(prev.synced_end.load(Ordering::Relaxed), 0, SLOT_SUCCESSOR)?;
                }
                break;
            }
            let seg = Segment::map(fs, path.clone(), file, header, len, slot)?;
            // SAFETY: the segment was just mapped and nothing else has it: no sync handle exists
            // yet and the group lock keeps other journals out.
            let bytes = unsafe { seg.whole() };
            // Every record is read and checked, so that damage stops the open as without a
            // checkpoint; those the checkpoint covers are not replayed.
            let covered = plan.as_ref().map(|p| p.point);
            let end = scan(
                &mut SliceSource(bytes),
                &path,
                &seg.header,
                |loc, seq, rec| {
                    let at = SyncPoint {
                        segment: loc.segment,
                        offset: loc.offset,
                    };
                    if covered.is_some_and(|p| at < p) {
                        return Ok(());
                    }
                    report.records += 1;
                    replay(loc, seq, rec)
                },
            )?;
            seg.written_end.store(end.end, Ordering::Release);
            next_seq = end.last_seq.map_or(seg.header.first_seq, |s| s + 1);
            last_crc = end.last_crc;
            let seg = Arc::new(seg);
            segments.insert(id, seg.clone());
            i += 1;
            let Some(bad) = end.bad else {
                if end.end < slot.synced_end {
                    return Err(JournalError::Damage {
                        file: path,
                        offset: end.end,
                        synced: slot.synced_end,
                        reason: "the records end before the synced offset".into(),
                    });
                }
                continue;
            };
            if bad.offset < slot.synced_end {
                return Err(JournalError::Damage {
                    file: path,
                    offset: bad.offset,
                    synced: slot.synced_end,
                    reason: bad.reason,
                });
            }
            if !bad.zero {
                // Bytes left from an earlier life of the file after the records of a segment
                // that the next one follows on exactly: the end of its records, nothing lost.
                if next_follows(fs, &dir, id, ids.get(i).copied(), next_seq)? {
                    continue;
                }
                if let Some(p) = later_synced(fs, &dir, &ids[i..])? {
                    return Err(JournalError::Damage {
                        file: path,
                        offset: bad.offset,
                        synced: slot.synced_end,
                        reason: format!(
                            "{} (and a later segment, {}, has durable records)",
                            bad.reason,
                            p.display()
                        ),
                    });
                }
                report.warnings.push(Warning {
                    file: path.clone(),
                    offset: bad.offset,
                    message: format!(
                        "torn tail cut (past the synced offset {}): {}",
                        slot.synced_end, bad.reason
                    ),
                });
                seg.zero_leftovers(bad.offset)?;
                let rest = ids[i..].to_vec();
                remove_files(fs, &dir, &rest, &mut report)?;
                ids.truncate(i);
                // The segments after it are gone: it is the last.
                seg.write_slot(slot.synced_end, 0, SLOT_SUCCESSOR)?;
                break;
            }
            // Zeros: the end of this segment's records. A later segment must follow on (checked
            // by sequence number on the next turn).
        }

        // The last segment is the one appended to: none follows it (open may have removed the
        // ones that did, unfinished or cut).
        if let Some(last) = segments.values().next_back() {
            if last.slot_flags() & SLOT_SUCCESSOR != 0 {
                last.write_slot(last.synced_end.load(Ordering::Relaxed), 0, SLOT_SUCCESSOR)?;
            }
        }

        // The files kept count in the budget, over its cap or not (see `SpaceBudget`); from here
        // on nothing fails but the creation of a first segment, which counts itself.
        let found_bytes: u64 = segments.values().map(|s| s.len).sum();
        let active = match segments.values().next_back() {
            Some(s) => s.clone(),
            None => {
                let id = ids.last().map_or(1, |&x| x + 1).max(1);
                let seg = Arc::new(create_segment(
                    opts,
                    &dir,
                    group,
                    id,
                    opts.initial_segment_size,
                    next_seq,
                )?);
                last_crc = seg.header.chain_seed;
                segments.insert(id, seg.clone());
                seg
            }
        };

        let unsynced: Vec<Arc<Segment<F>>> = segments
            .values()
            .filter(|s| {
                s.id == active.id
                    || s.synced_end.load(Ordering::Relaxed) < s.written_end.load(Ordering::Relaxed)
            })
            .cloned()
            .collect();
        let synced = segments
            .values()
            .rev()
            .find(|s| s.synced_end.load(Ordering::Relaxed) > HEADER_LEN)
            .map_or(
                SyncPoint {
                    segment: *segments.keys().next().unwrap(),
                    offset: HEADER_LEN,
                },
                |s| SyncPoint {
                    segment: s.id,
                    offset: s.synced_end.load(Ordering::Relaxed),
                },
            );
        let written = SyncPoint {
            segment: active.id,
            offset: active.written_end.load(Ordering::Relaxed),
        };
        if let Some(b) = &opts.budget {
            b.count(found_bytes);
        }
        let counted_bytes = segments.values().map(|s| s.len).sum();
        report.segments = segments.len();
        report.synced = synced;
        report.written = written;
        report.next_seq = next_seq;
        let shared = Arc::new(Shared {
            fs: fs.clone(),
            dir,
            unsynced: Mutex::new(unsynced),
            sync_lock: Mutex::new(SyncState {
                failed: None,
                dir_synced_upto: 0,
            }),
            sync_failed: AtomicBool::new(false),
            synced_segment: AtomicU64::new(synced.segment),
            synced_offset: AtomicU64::new(synced.offset),
            _lock: lock_file,
        });
        Ok((
            Journal {
                group,
                opts: opts.clone(),
                segments,
                active,
                next_seq,
                last_crc,
                writer: crate::segment::random_u32(next_seq),
                compacting_upto: None,
                counted_bytes,
                shared,
            },
            report,
        ))
    }

    /// The partition group of this journal.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// The group directory (`<root>/gNN`).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The sequence number the next record will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The end of the last appended record: `sync_to(written())` makes everything durable.
    pub fn written(&self) -> SyncPoint {
        SyncPoint {
            segment: self.active.id,
            offset: self.active.written_end.load(Ordering::Relaxed),
        }
    }

    /// Whether a sync of this journal failed. After a failed msync or fsync a later success
    /// proves nothing (the system may have dropped the pages it could not write), so what was
    /// appended since the last durable point may or may not be on the disk: the caller should
    /// append nothing more and answer nothing as durable until the journal is opened again.
    pub fn sync_failed(&self) -> bool {
        self.shared.sync_failed.load(Ordering::Acquire)
    }

    /// The durable point: records ending at or before it survive a crash.
    pub fn synced(&self) -> SyncPoint {
        self.sync_handle().synced()
    }

    /// A handle that makes appends durable, for another thread.
    pub fn sync_handle(&self) -> SyncHandle<F> {
        SyncHandle {
            shared: self.shared.clone(),
        }
    }

    /// Appends a record with [`Priority::Ordinary`]: see [`Journal::append_with`].
    pub fn append(&mut self, rec: &Record<'_>) -> Result<Appended, JournalError> {
        self.append_with(rec, Priority::Ordinary)
    }

    /// Appends a record: copies it into the active segment's mapping (no syscall), or first
    /// rotates to a new preallocated segment when it does not fit. Not durable until a sync
    /// handle syncs past `Appended::end`.
    ///
    /// An ordinary record fits when it ends before the segment's release reserve, a release
    /// record when it ends before the segment's end. So when no new segment can be made, ordinary
    /// appends fail while release appends go on in the reserve until it is full too.
    ///
    /// Errors: [`JournalError::NoSpace`] when a new segment cannot be preallocated, and
    /// [`JournalError::SizeCap`] when it would pass the budget's cap (nothing was appended; try
    /// again later: [`JournalError::is_out_of_space`]), [`JournalError::TooLarge`],
    /// [`JournalError::IdTooLong`], I/O errors of segment creation.
    pub fn append_with(
        &mut self,
        rec: &Record<'_>,
        priority: Priority,
    ) -> Result<Appended, JournalError> {
        let mut done = None;
        self.append_change(std::slice::from_ref(rec), priority, |a| done = Some(a))?;
        Ok(done.expect("one record appended"))
    }

    /// Appends the records of one change (`journal/FORMAT.md`, "Records": each but the last
    /// says the next belongs to the same change), in one segment: a replay applies all of them
    /// or, when a crash cut the change short, none. Returns each record's [`Appended`]; the
    /// last one's `end` makes the change durable. Errors as [`Journal::append_with`]; nothing is
    /// appended on an error.
    pub fn append_batch(
        &mut self,
        recs: &[Record<'_>],
        priority: Priority,
    ) -> Result<Vec<Appended>, JournalError> {
        let mut out = Vec::with_capacity(recs.len());
        self.append_change(recs, priority, |a| out.push(a))?;
        Ok(out)
    }

    fn append_change(
        &mut self,
        recs: &[Record<'_>],
        priority: Priority,
        mut appended: impl FnMut(Appended),
    ) -> Result<(), JournalError> {
        let mut need = 0;
        for rec in recs {
            rec.check_ids()?;
            need += rec.stored_len();
        }
        let max = self.opts.limit(self.opts.segment_size, priority) - HEADER_LEN;
        if need > max {
            return Err(JournalError::TooLarge {
                len: need,
                max: max.saturating_sub(RECORD_HEADER_LEN),
            });
        }
        let mut at = self.active.written_end.load(Ordering::Relaxed);
        if at + need > self.opts.limit(self.active.len, priority) {
            self.rotate(need)?;
            at = HEADER_LEN;
        }
        let seg = self.active.clone();
        assert!(
            at + need <= self.opts.limit(seg.len, priority),
            "a new segment is made large enough for the change that needs it"
        );
        for (i, rec) in recs.iter().enumerate() {
            let len = rec.stored_len();
            let payload_len = rec.payload_len();
            let hdr = RecordHeader {
                len: payload_len as u32,
                seq: self.next_seq,
                kind: rec.kind() as u16,
                flags: if i + 1 < recs.len() {
                    RECORD_CONTINUES
                } else {
                    0
                },
                prev_crc: self.last_crc,
                writer: self.writer,
                crc: 0,
            };
            // SAFETY: we are the appender (`&mut self`), `at` is at or after the segment's
            // `written_end` and `at + len <= len of the segment` (checked above, or a fresh
            // segment with room for the whole change); the slice is dropped before
            // `written_end` moves.
            let dst = unsafe { seg.tail_mut(at, len) };
            let h = RECORD_HEADER_LEN as usize;
            dst[..h].copy_from_slice(&hdr.encode_without_crc());
            rec.encode_payload(&mut dst[h..h + payload_len]);
            dst[h + payload_len..].fill(0);
            let crc = record_crc(&dst[..h], &dst[h..h + payload_len]);
            dst[28..32].copy_from_slice(&crc.to_le_bytes());
            appended(Appended {
                loc: Location {
                    segment: seg.id,
                    offset: at,
                },
                seq: self.next_seq,
                end: SyncPoint {
                    segment: seg.id,
                    offset: at + len,
                },
            });
            self.next_seq += 1;
            self.last_crc = crc;
            at += len;
        }
        // Published once: a sync never sees part of a change.
        seg.written_end.store(at, Ordering::Release);
        Ok(())
    }

    /// A new active segment, twice the size of the last (up to `segment_size`) and large enough
    /// for an ordinary record of `need` bytes before its reserve.
    fn rotate(&mut self, need: u64) -> Result<(), JournalError> {
        let id = self.active.id + 1;
        // `append_with` refused records that do not fit before the reserve of `segment_size`.
        let fits = self.opts.fits_before_reserve(need);
        let size = self
            .active
            .len
            .saturating_mul(2)
            .max(self.opts.initial_segment_size)
            .max(fits)
            .min(self.opts.segment_size);
        let seg = Arc::new(create_segment(
            &self.opts,
            &self.shared.dir,
            self.group,
            id,
            size,
            self.next_seq,
        )?);
        self.counted_bytes += seg.len;
        lock(&self.shared.unsynced).push(seg.clone());
        self.segments.insert(id, seg.clone());
        self.last_crc = seg.header.chain_seed;
        self.active = seg;
        Ok(())
    }

    /// The record at `loc` (from `Appended::loc` or the replay), read from the mapping with its
    /// CRC checked, and its sequence number.
    pub fn read(&self, loc: Location) -> Result<(u64, Record<'_>), JournalError> {
        let bad = |reason: &str| JournalError::BadLocation {
            segment: loc.segment,
            offset: loc.offset,
            reason: reason.to_string(),
        };
        let seg = self
            .segments
            .get(&loc.segment)
            .ok_or_else(|| bad("no such segment"))?;
        let (h, payload) = seg.record_at(loc.offset, true).map_err(bad)?;
        let kind = Kind::from_u16(h.kind).ok_or_else(|| bad("unknown record kind"))?;
        let rec = Record::decode(kind, payload).map_err(|e| bad(&e))?;
        Ok((h.seq, rec))
    }

    /// The segments, ascending.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.segments
            .values()
            .map(|s| SegmentInfo {
                id: s.id,
                path: s.path.clone(),
                len: s.len,
                first_seq: s.header.first_seq,
                written_end: s.written_end.load(Ordering::Relaxed),
                synced_end: s.synced_end.load(Ordering::Relaxed),
                active: s.id == self.active.id,
            })
            .collect()
    }

    /// Removes the group's oldest segment, whose records the caller no longer needs (every
    /// queue, message and notification in it was deleted or rewritten later). Never the active
    /// segment. When the
    /// returned [`Retired`] is dropped, the group is synced up to what was appended before this
    /// call, then the file is unlinked (a sync handle still syncing it keeps its mapping until
    /// done) and the directory fsynced. Records in it must not be read afterwards
    /// ([`JournalError::BadLocation`]).
    pub fn remove_segment(&mut self, id: u64) -> Result<Retired<F>, JournalError> {
        if id == self.active.id {
            return Err(JournalError::ActiveSegment(id));
        }
        if self.compacting_upto.is_some_and(|u| id <= u) {
            return Err(JournalError::Compacting(id));
        }
        if !self.segments.contains_key(&id) {
            return Err(JournalError::NoSuchSegment(id));
        }
        if self.segments.keys().next() != Some(&id) {
            return Err(JournalError::NotOldest(id));
        }
        let seg = self.segments.remove(&id).expect("checked");
        // It stays among the segments to sync: until its file is gone, a crash may leave it
        // beside the later segments, whose records must follow its own (the sequence numbers
        // go on from one segment to the next). The file goes when the returned `Retired` is
        // dropped, after that sync (its blocks are freed once no sync handle maps it any more).
        if let Some(b) = &self.opts.budget {
            b.give_back(seg.len);
        }
        self.counted_bytes -= seg.len;
        Ok(Retired {
            unlink: vec![seg.path.clone()],
            segments: vec![seg],
            dir: self.shared.dir.clone(),
            fs: self.opts.fs.clone(),
            after: self.written(),
            sync: self.sync_handle(),
            first_after: self.segments.values().next().cloned(),
        })
    }
}

impl<F: Fs> Journal<F> {
    /// Reads the group's checkpoint and, when it fits the segments `ids` on disk, calls `load`
    /// with it and returns its point for open to start from.
    fn checkpoint_plan(
        fs: &F,
        root: &Path,
        dir: &Path,
        group: u32,
        ids: &[u64],
        report: &mut OpenReport,
        load: impl FnOnce(&Checkpoint) -> Result<(), String>,
    ) -> Result<Option<CheckpointPoint>, JournalError> {
        let (cp, warning) = read_checkpoint(fs, root, group)?;
        report.warnings.extend(warning);
        let Some(cp) = cp else {
            return Ok(None);
        };
        let mut found = Vec::with_capacity(ids.len());
        for &id in ids {
            let path = dir.join(crate::segment_file_name(id));
            let file = fs
                .open(&path, false)
                .map_err(|e| JournalError::io(&path, "open", e))?;
            let Ok((h, slot, _)) = read_header(&file, &path) else {
                continue;
            };
            found.push((id, h.first_seq, h.segment_len, h.flags, slot.synced_end));
        }
        let lost = crate::checkpoint::lost_segments(&cp.at, &found);
        if let Some(&first) = lost.first() {
            return Err(JournalError::Damage {
                file: cp.path.clone(),
                offset: 0,
                synced: 0,
                reason: format!(
                    "it covers {}, which is missing: the records in it are lost (the relay \
                     served them)",
                    crate::segment_file_name(first)
                ),
            });
        }
        if let Some(reason) = stale_reason(&cp.at, &found) {
            report.warnings.push(Warning {
                file: cp.path.clone(),
                offset: 0,
                message: format!("checkpoint not used ({reason}): the whole journal is replayed"),
            });
            return Ok(None);
        }
        load(&cp).map_err(|reason| JournalError::Replay {
            file: cp.path.clone(),
            offset: 0,
            reason: format!("{reason} (remove the file to replay the whole journal)"),
        })?;
        report.checkpoint = Some(cp.at.point);
        Ok(Some(cp.at))
    }

    /// The point for a checkpoint taken now (after the last appended record), with the
    /// segments it covers; give the caller's snapshot of its state at this point to
    /// [`CheckpointBase::write`], on another thread.
    pub fn checkpoint_base(&self) -> CheckpointBase<F> {
        let point = self.written();
        CheckpointBase {
            fs: self.opts.fs.clone(),
            dir: self.shared.dir.clone(),
            group: self.group,
            at: CheckpointPoint {
                point,
                segments: self.seen_segments(),
            },
            durable_upto: point,
            sync: self.sync_handle(),
        }
    }

    /// For a snapshot made in steps while records were appended (a fuzzy checkpoint, as
    /// `journal/FORMAT.md` "Checkpoints" describes): the snapshot of each part was taken at some
    /// moment between `base`'s point and now, so replay still starts at the point (the caller's
    /// replay must take records whose effect the snapshot holds already), but the checkpoint may
    /// be used only while every record appended up to now is on the disk as it is now. Call it
    /// when the snapshot is complete, before [`CheckpointBase::write`].
    pub fn checkpoint_seal(&self, base: &mut CheckpointBase<F>) {
        base.at.segments = self.seen_segments();
        base.durable_upto = self.written();
    }

    fn seen_segments(&self) -> Vec<SeenSegment> {
        self.segments
            .values()
            .map(|s| SeenSegment {
                id: s.id,
                first_seq: s.header.first_seq,
                len: s.len,
                flags: s.header.flags,
                end: s.written_end.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// Where each record a compaction kept was, and where it is now.
pub type Moved = Vec<(Location, Location)>;

/// One segment, as [`Journal::segment_sizes`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSize {
    pub id: u64,
    /// File length.
    pub len: u64,
    /// End of the last record.
    pub written_end: u64,
    pub active: bool,
}

impl<F: Fs> Journal<F> {
    /// The segments' numbers and sizes, ascending, without allocating (for deciding what to
    /// remove or compact on every delete).
    pub fn segment_sizes(&self) -> impl Iterator<Item = SegmentSize> + '_ {
        self.segments.values().map(|s| SegmentSize {
            id: s.id,
            len: s.len,
            written_end: s.written_end.load(Ordering::Relaxed),
            active: s.id == self.active.id,
        })
    }

    /// Calls `f` with up to `max` records of segment `id` from offset `from` (`HEADER_LEN` for
    /// the first), in order; returns where to go on, or `None` at the segment's end. For a
    /// compaction's caller deciding which records to keep. Records were checked when they were
    /// appended or replayed, so their CRCs are not checked again here.
    pub fn scan_segment(
        &self,
        id: u64,
        from: u64,
        max: usize,
        mut f: impl FnMut(Location, Record<'_>),
    ) -> Result<Option<u64>, JournalError> {
        let seg = self
            .segments
            .get(&id)
            .ok_or(JournalError::NoSuchSegment(id))?;
        let written = seg.written_end.load(Ordering::Acquire);
        let mut off = from.max(HEADER_LEN);
        for _ in 0..max {
            if off + RECORD_HEADER_LEN > written {
                return Ok(None);
            }
            let bad = |reason: &str| JournalError::BadLocation {
                segment: id,
                offset: off,
                reason: reason.to_string(),
            };
            let (h, payload) = seg.record_at(off, false).map_err(bad)?;
            let total = RECORD_HEADER_LEN + h.len as u64;
            let kind = Kind::from_u16(h.kind).ok_or_else(|| bad("unknown record kind"))?;
            let rec = Record::decode(kind, payload).map_err(|e| bad(&e))?;
            f(
                Location {
                    segment: id,
                    offset: off,
                },
                rec,
            );
            off += crate::format::align(total);
        }
        Ok((off + RECORD_HEADER_LEN <= written).then_some(off))
    }

    /// Starts compacting the group's segments up to `upto` (the oldest ones, never the active
    /// one), keeping the records at `keep` (ascending). Run the returned job on another thread,
    /// then give its result to [`Journal::install_compaction`] (or call
    /// [`Journal::abandon_compaction`] if it failed). Until then those segments are not removed.
    pub fn start_compaction(
        &mut self,
        upto: u64,
        keep: Vec<Location>,
    ) -> Result<CompactJob<F>, JournalError> {
        if let Some(u) = self.compacting_upto {
            return Err(JournalError::Compacting(u));
        }
        if upto >= self.active.id || !self.segments.contains_key(&upto) {
            return Err(JournalError::BadCompaction(format!(
                "segment {upto} is not an inactive segment of this journal"
            )));
        }
        let sources: Vec<Arc<Segment<F>>> = self
            .segments
            .range(..=upto)
            .map(|(_, s)| s.clone())
            .collect();
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.iter().any(|l| l.segment > upto) {
            return Err(JournalError::BadCompaction(
                "the records to keep are not ascending locations in the segments compacted".into(),
            ));
        }
        let next_seq = self
            .segments
            .range(upto + 1..)
            .next()
            .map_or(self.next_seq, |(_, s)| s.header.first_seq);
        self.compacting_upto = Some(upto);
        Ok(CompactJob {
            after: self.written(),
            sync: self.sync_handle(),
            fs: self.opts.fs.clone(),
            dir: self.shared.dir.clone(),
            group: self.group,
            sources,
            keep,
            next_seq,
        })
    }

    /// Swaps in a finished compaction: the segments it replaced are forgotten (their mappings
    /// go when the last reader drops them) and reads of kept records must now use the new
    /// locations in [`Compacted::moved`], which this returns.
    pub fn install_compaction(
        &mut self,
        c: Compacted<F>,
    ) -> Result<(Moved, Retired<F>), JournalError> {
        if self.compacting_upto != Some(c.upto) {
            return Err(JournalError::BadCompaction(format!(
                "no compaction up to segment {} was started",
                c.upto
            )));
        }
        self.compacting_upto = None;
        let gone: Vec<u64> = self.segments.range(..=c.upto).map(|(&id, _)| id).collect();
        let mut freed = 0;
        let mut retired = Retired {
            segments: Vec::new(),
            unlink: Vec::new(),
            dir: self.shared.dir.clone(),
            fs: self.opts.fs.clone(),
            after: self.written(),
            sync: self.sync_handle(),
            first_after: None,
        };
        for id in gone {
            if let Some(s) = self.segments.remove(&id) {
                freed += s.len;
                retired.segments.push(s);
            }
        }
        // The budget: the replaced files go, the new one counts (it is smaller than what it
        // replaces, so a compaction is never refused for the cap).
        if let Some(b) = &self.opts.budget {
            b.give_back(freed);
            b.count(c.segment.len);
        }
        self.counted_bytes = self.counted_bytes - freed + c.segment.len;
        lock(&self.shared.unsynced).retain(|s| s.id > c.upto);
        let seg = Arc::new(c.segment);
        self.segments.insert(seg.id, seg);
        Ok((c.moved, retired))
    }

    /// Forgets a compaction that failed before its rename (its segments may be removed again).
    pub fn abandon_compaction(&mut self) {
        self.compacting_upto = None;
    }
}

/// Segments the journal no longer uses ([`Journal::remove_segment`],
/// [`Journal::install_compaction`]). Dropping it first makes durable every record appended
/// before it was made (those records made the segments dead: a file removed before they are
/// durable could take live data along in a power loss), then removes the files still to be
/// removed, fsyncs the directory and unmaps the segments (the last reference to a removed file
/// frees its pages, which takes a while for a large one): drop it off the appending thread.
/// Should the sync or a removal fail, the files stay, and a later open finds their records dead
/// again. It keeps the group's journal open (its lock) until it is dropped.
pub struct Retired<F: Fs = OsFs> {
    segments: Vec<Arc<Segment<F>>>,
    unlink: Vec<PathBuf>,
    dir: PathBuf,
    fs: F,
    /// The group's written point when the segments were let go of.
    after: SyncPoint,
    sync: SyncHandle<F>,
    /// The segment that is the group's first once these are gone (it says so before they go).
    first_after: Option<Arc<Segment<F>>>,
}

impl<F: Fs> Drop for Retired<F> {
    fn drop(&mut self) {
        if !self.unlink.is_empty() {
            let ready = self
                .sync
                .sync_to(self.after)
                .and_then(|_| match &self.first_after {
                    Some(f) => self.sync.mark_first(f),
                    None => Ok(()),
                });
            if ready.is_err() {
                self.unlink.clear();
            }
        }
        let mut removed = false;
        for p in &self.unlink {
            removed |= self.fs.remove_file(p).is_ok();
        }
        if removed {
            let _ = sync_dir(&self.fs, &self.dir);
        }
        self.segments.clear();
    }
}

/// Pages of records to bring into memory on another thread ([`Journal::prefetch`]).
pub struct Prefetch<F: Fs = OsFs> {
    ranges: Vec<(Arc<Segment<F>>, u64, u64)>,
}

impl<F: Fs> Default for Prefetch<F> {
    fn default() -> Self {
        Prefetch { ranges: Vec::new() }
    }
}

impl<F: Fs> Prefetch<F> {
    /// Adds `other`'s records.
    pub fn append(&mut self, other: Prefetch<F>) {
        self.ranges.extend(other.ranges);
    }

    /// Reads a byte of every page of the records (blocking on the disk for cold ones): run it
    /// off the appending thread, then read the records there without waiting.
    pub fn run(self) {
        for (seg, from, to) in &self.ranges {
            seg.touch(*from, *to);
        }
    }

    /// How many records it covers.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl<F: Fs> Journal<F> {
    /// Asks the kernel to drop the pages of segment `id` from memory (its synced ones: sync
    /// first); later reads fault them in again. For memory pressure by hand and for tests of
    /// cold reads; the relay does not call it.
    pub fn evict(&self, id: u64) -> Result<(), JournalError> {
        self.segments
            .get(&id)
            .ok_or(JournalError::NoSuchSegment(id))?
            .evict()
    }

    /// The records among `records` (location and stored length) whose pages are not all in
    /// memory, as a [`Prefetch`] for another thread (empty when every page is resident). Asking
    /// costs one mincore per record outside the active segment and the one before it (recent
    /// appends are in memory).
    pub fn prefetch(&self, records: &[(Location, u64)]) -> Prefetch<F> {
        let mut ranges = Vec::new();
        let recent = self
            .segments
            .range(..self.active.id)
            .next_back()
            .map_or(self.active.id, |(&id, _)| id);
        for &(loc, len) in records {
            if loc.segment >= recent {
                continue;
            }
            let Some(seg) = self.segments.get(&loc.segment) else {
                continue;
            };
            let (from, to) = (loc.offset, loc.offset + len);
            if !seg.resident(from, to) {
                ranges.push((seg.clone(), from, to));
            }
        }
        Prefetch { ranges }
    }
}

impl<F: Fs> Drop for Journal<F> {
    /// Gives back to the budget what this journal counted: a later open counts the files again.
    fn drop(&mut self) {
        if let Some(b) = &self.opts.budget {
            b.give_back(self.counted_bytes);
        }
    }
}

impl<F: Fs> SyncHandle<F> {
    /// Makes every record ending at or before `upto` durable: msync (MS_SYNC) of the record bytes
    /// of every segment up to `upto` not yet synced, an fsync of the directory when a segment is
    /// new, then the segment's sync slot updated and its header page msynced. Returns the durable
    /// point. Blocks for the I/O: call it off the appending thread. Concurrent calls are
    /// serialized. After a failure every later call fails ([`JournalError::SyncFailed`]).
    pub fn sync_to(&self, upto: SyncPoint) -> Result<SyncPoint, JournalError> {
        let mut st = lock(&self.shared.sync_lock);
        if let Some(e) = &st.failed {
            return Err(JournalError::SyncFailed(e.clone()));
        }
        let segs: Vec<Arc<Segment<F>>> = lock(&self.shared.unsynced)
            .iter()
            .filter(|s| s.id <= upto.segment)
            .cloned()
            .collect();
        match self.sync_segments(&mut st, &segs, upto) {
            Ok(()) => {}
            Err(e) => {
                st.failed = Some(e.to_string());
                self.shared.sync_failed.store(true, Ordering::Release);
                return Err(e);
            }
        }
        // Rotated segments synced to their end need no more syncs.
        {
            let mut list = lock(&self.shared.unsynced);
            let last = list.last().map(|s| s.id);
            list.retain(|s| {
                Some(s.id) == last
                    || s.synced_end.load(Ordering::Acquire) < s.written_end.load(Ordering::Acquire)
            });
        }
        let cur = self.synced();
        let new = segs
            .iter()
            .rev()
            .find(|s| s.synced_end.load(Ordering::Acquire) > HEADER_LEN)
            .map(|s| SyncPoint {
                segment: s.id,
                offset: s.synced_end.load(Ordering::Acquire),
            });
        if let Some(new) = new.filter(|n| *n > cur) {
            self.shared
                .synced_segment
                .store(new.segment, Ordering::Relaxed);
            self.shared
                .synced_offset
                .store(new.offset, Ordering::Relaxed);
        }
        Ok(self.synced())
    }

    fn sync_segments(
        &self,
        st: &mut SyncState,
        segs: &[Arc<Segment<F>>],
        upto: SyncPoint,
    ) -> Result<(), JournalError> {
        // The segments' names (and, the first time, the group directory's) are made durable
        // first: before anything in a segment is called durable, and before a segment says that
        // the one after it was made.
        let newest = lock(&self.shared.unsynced).last().map_or(0, |s| s.id);
        if newest > st.dir_synced_upto {
            sync_dir(&self.shared.fs, &self.shared.dir)?;
            if st.dir_synced_upto == 0 {
                if let Some(parent) = self.shared.dir.parent() {
                    sync_dir(&self.shared.fs, parent)?;
                }
            }
            st.dir_synced_upto = newest;
        }
        for s in segs {
            let written = s.written_end.load(Ordering::Acquire);
            let end = if s.id < upto.segment {
                written
            } else {
                upto.offset.min(written)
            };
            let synced = s.synced_end.load(Ordering::Acquire);
            // A segment's first sync writes its header page and length even with no record to
            // sync: a crash must not leave an earlier segment unfinished beside a later one.
            let first = s.slot_count.load(Ordering::Relaxed) == 0;
            // A segment followed by one whose name is durable says so (format version 3).
            let successor = s.id < st.dir_synced_upto
                && s.header.version >= 3
                && s.slot_flags() & SLOT_SUCCESSOR == 0;
            if end <= synced && !first && !successor {
                continue;
            }
            let end = end.max(synced);
            if end > synced {
                s.sync_range(synced, end)?;
            }
            s.write_slot(end, if successor { SLOT_SUCCESSOR } else { 0 }, 0)?;
        }
        Ok(())
    }

    /// Says durably, in its sync slot, that `seg` is now the group's first segment: the ones
    /// before it are about to be removed as dead.
    fn mark_first(&self, seg: &Segment<F>) -> Result<(), JournalError> {
        let st = lock(&self.shared.sync_lock);
        if let Some(e) = &st.failed {
            return Err(JournalError::SyncFailed(e.clone()));
        }
        if seg.header.version < 3 || seg.slot_flags() & SLOT_FIRST != 0 {
            return Ok(());
        }
        seg.write_slot(seg.synced_end.load(Ordering::Acquire), SLOT_FIRST, 0)
    }

    /// Makes everything appended so far durable.
    pub fn sync_all(&self) -> Result<SyncPoint, JournalError> {
        let upto = lock(&self.shared.unsynced).last().map(|s| SyncPoint {
            segment: s.id,
            offset: s.written_end.load(Ordering::Acquire),
        });
        match upto {
            Some(p) => self.sync_to(p),
            None => Ok(self.synced()),
        }
    }

    /// The durable point so far.
    pub fn synced(&self) -> SyncPoint {
        SyncPoint {
            segment: self.shared.synced_segment.load(Ordering::Relaxed),
            offset: self.shared.synced_offset.load(Ordering::Relaxed),
        }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync + Clone>() {}
    is::<SyncHandle>();
    fn send<T: Send>() {}
    send::<Journal>();
    #[cfg(any(test, feature = "sim"))]
    send::<Journal<crate::sim::SimFs>>();
}
