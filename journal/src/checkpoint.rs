//! Checkpoints: a snapshot of a group's state (an opaque blob the caller makes) and the journal
//! point it was taken at, so that open replays only the records after that point
//! (`journal/FORMAT.md`, "Checkpoints").
//!
//! A checkpoint is only ever an accelerator: the segments stay the truth. It is written after
//! every record it covers is durable (`CheckpointBase::write` syncs first), under a temporary
//! name, fsynced and renamed. Open uses it only if the segments it covers are still the ones it
//! saw (a compaction rewrites them, `repair` cuts them: then the whole journal is replayed, with
//! a warning).

use std::path::{Path, PathBuf};

use crate::error::{JournalError, Warning};
use crate::fs::{Fs, FsFile, OsFs};
use crate::segment::sync_dir;
use crate::{group_dir, SyncHandle, SyncPoint};

/// The checkpoint file of a group: `<root>/gNN/checkpoint.jck`.
pub const CHECKPOINT_FILE: &str = "checkpoint.jck";

const MAGIC: [u8; 8] = *b"SMPJCKP\0";
const VERSION: u32 = 1;

/// A segment as a checkpoint saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeenSegment {
    pub id: u64,
    pub first_seq: u64,
    pub len: u64,
    pub flags: u32,
    /// End of its records when the checkpoint was taken (for the point's segment: the point).
    pub end: u64,
}

/// Where a checkpoint was taken: after the record ending at `point`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPoint {
    pub point: SyncPoint,
    /// Every segment up to the point's, ascending.
    pub segments: Vec<SeenSegment>,
}

/// A checkpoint read from its file.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub at: CheckpointPoint,
    /// The caller's snapshot of the group's state at the point.
    pub blob: Vec<u8>,
}

/// A checkpoint to write: taken on the appending thread ([`crate::Journal::checkpoint_base`]),
/// written on any thread with the caller's blob.
pub struct CheckpointBase<F: Fs = OsFs> {
    pub(crate) fs: F,
    pub(crate) dir: PathBuf,
    pub(crate) group: u32,
    pub(crate) at: CheckpointPoint,
    /// Every record up to here is durable before the file is written: the point itself, or
    /// where the caller finished its snapshot ([`crate::Journal::checkpoint_seal`]).
    pub(crate) durable_upto: SyncPoint,
    pub(crate) sync: SyncHandle<F>,
}

fn put_u32(out: &mut Vec<u8>, x: u32) {
    out.extend_from_slice(&x.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, x: u64) {
    out.extend_from_slice(&x.to_le_bytes());
}

impl<F: Fs> CheckpointBase<F> {
    /// The point it covers.
    pub fn point(&self) -> SyncPoint {
        self.at.point
    }

    /// Makes every record up to the point (or up to where the snapshot was finished, if it was
    /// sealed) durable, then writes the checkpoint file (temporary name, fsync, rename,
    /// directory fsync). Blocks on I/O: run it off the appending thread.
    pub fn write(self, blob: &[u8]) -> Result<(), JournalError> {
        self.sync.sync_to(self.durable_upto)?;
        let mut b = Vec::with_capacity(blob.len() + 128);
        b.extend_from_slice(&MAGIC);
        put_u32(&mut b, VERSION);
        put_u32(&mut b, self.group);
        put_u64(&mut b, self.at.point.segment);
        put_u64(&mut b, self.at.point.offset);
        put_u32(&mut b, self.at.segments.len() as u32);
        for s in &self.at.segments {
            put_u64(&mut b, s.id);
            put_u64(&mut b, s.first_seq);
            put_u64(&mut b, s.len);
            put_u32(&mut b, s.flags);
            put_u64(&mut b, s.end);
        }
        put_u64(&mut b, blob.len() as u64);
        b.extend_from_slice(blob);
        let crc = crc32c::crc32c(&b);
        put_u32(&mut b, crc);
        let path = self.dir.join(CHECKPOINT_FILE);
        let tmp = self.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let written = (|| {
            let f = self.fs.create(&tmp)?;
            f.write_all_at(&b, 0)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = self.fs.remove_file(&tmp);
            return Err(JournalError::io(&tmp, "write checkpoint", e));
        }
        self.fs
            .rename(&tmp, &path)
            .map_err(|e| JournalError::io(&tmp, "rename", e))?;
        sync_dir(&self.fs, &self.dir)
    }
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

fn decode(b: &[u8], group: u32) -> Result<(CheckpointPoint, Vec<u8>), String> {
    if b.len() < MAGIC.len() + 4 || b[..8] != MAGIC {
        return Err("not a checkpoint file (wrong magic)".into());
    }
    let (body, crc) = b.split_at(b.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().unwrap()) {
        return Err("CRC mismatch".into());
    }
    let mut c = Cursor(&body[8..]);
    let short = || "too short".to_string();
    let version = c.u32().ok_or_else(short)?;
    if version != VERSION {
        return Err(format!(
            "version {version}, this smp-journal reads {VERSION}"
        ));
    }
    let g = c.u32().ok_or_else(short)?;
    if g != group {
        return Err(format!("of group {g}"));
    }
    let point = SyncPoint {
        segment: c.u64().ok_or_else(short)?,
        offset: c.u64().ok_or_else(short)?,
    };
    let n = c.u32().ok_or_else(short)? as usize;
    let mut segments = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        segments.push(SeenSegment {
            id: c.u64().ok_or_else(short)?,
            first_seq: c.u64().ok_or_else(short)?,
            len: c.u64().ok_or_else(short)?,
            flags: c.u32().ok_or_else(short)?,
            end: c.u64().ok_or_else(short)?,
        });
    }
    let blob_len = c.u64().ok_or_else(short)? as usize;
    let blob = c.take(blob_len).ok_or_else(short)?.to_vec();
    if !c.0.is_empty() {
        return Err("trailing bytes".into());
    }
    Ok((CheckpointPoint { point, segments }, blob))
}

/// Reads the checkpoint of `group` under `root`, if there is one. A file that cannot be read
/// as one is a warning (the journal is replayed whole), not an error.
pub fn read_checkpoint<F: Fs>(
    fs: &F,
    root: &Path,
    group: u32,
) -> Result<(Option<Checkpoint>, Option<Warning>), JournalError> {
    let path = group_dir(root, group).join(CHECKPOINT_FILE);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, None)),
        Err(e) => return Err(JournalError::io(&path, "read", e)),
    };
    match decode(&bytes, group) {
        Ok((at, blob)) => Ok((Some(Checkpoint { path, at, blob }), None)),
        Err(reason) => Ok((
            None,
            Some(Warning {
                file: path,
                offset: 0,
                message: format!("checkpoint not used ({reason}): the whole journal is replayed"),
            }),
        )),
    }
}

/// Removes a group's checkpoint (after `repair` changed the segments it covers).
pub(crate) fn remove_checkpoint<F: Fs>(fs: &F, dir: &Path) -> Result<bool, JournalError> {
    let path = dir.join(CHECKPOINT_FILE);
    match fs.remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(JournalError::io(&path, "remove", e)),
    }
}

/// Why a checkpoint does not fit the segments on disk, if it does not: `found` is each segment
/// on disk (after leftovers were removed) with its header and synced end.
/// Segments a checkpoint saw that are missing now although they cannot have been removed as
/// dead: later than the last segment on disk (segments go oldest first, and the last one is the
/// one appended to). Their records are lost: `found` as for [`stale_reason`].
pub(crate) fn lost_segments(at: &CheckpointPoint, found: &[(u64, u64, u64, u32, u64)]) -> Vec<u64> {
    let last_on_disk = found.last().map_or(0, |f| f.0);
    let mut lost: Vec<u64> = at
        .segments
        .iter()
        .map(|s| s.id)
        .chain(std::iter::once(at.point.segment))
        .filter(|&id| id > last_on_disk)
        .collect();
    lost.sort_unstable();
    lost.dedup();
    lost
}

pub(crate) fn stale_reason(
    at: &CheckpointPoint,
    found: &[(u64, u64, u64, u32, u64)],
) -> Option<String> {
    let first_on_disk = found.first().map(|f| f.0)?;
    if !found.iter().any(|f| f.0 == at.point.segment) {
        return Some(format!("its segment {} is gone", at.point.segment));
    }
    for s in &at.segments {
        match found.iter().find(|f| f.0 == s.id) {
            None if s.id < first_on_disk => {} // removed as dead since
            None => return Some(format!("segment {} is gone", s.id)),
            Some(&(_, first_seq, len, flags, synced)) => {
                if first_seq != s.first_seq || len != s.len || flags != s.flags {
                    return Some(format!("segment {} was rewritten since", s.id));
                }
                if synced < s.end {
                    return Some(format!(
                        "segment {} is durable to {synced}, the checkpoint covers {}",
                        s.id, s.end
                    ));
                }
            }
        }
    }
    if found
        .iter()
        .any(|f| f.0 <= at.point.segment && !at.segments.iter().any(|s| s.id == f.0))
    {
        return Some("a segment it covers is not in it".into());
    }
    None
}
