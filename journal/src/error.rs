//! Errors and warnings. Every error about a file names the file, and the offset when one matters.

use std::fmt;
use std::path::PathBuf;

/// What the journal could not do.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An I/O call failed.
    #[error("{path}: {op}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A new segment could not be preallocated: the disk (or quota, or file size limit) has no
    /// room. Nothing was appended; the journal stays usable (release appends still go into the
    /// active segment's reserve, `crate::Priority`), and the same append may be tried again once
    /// there is room.
    #[error("{path}: no space to preallocate a new segment: {source}")]
    NoSpace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A new segment would take the segment files of the journals sharing a
    /// [`crate::SpaceBudget`] past its cap. Nothing was appended; as with
    /// [`JournalError::NoSpace`], release appends still go into the reserve, and the same append
    /// works once removed segments bring the total under the cap.
    #[error(
        "journal size cap of {cap} bytes reached ({used} bytes in segment files, a new segment \
         needs {need}); deletes free segments, or raise the cap"
    )]
    SizeCap { cap: u64, used: u64, need: u64 },
    /// A segment header cannot be read (wrong magic, bad CRC, unknown version, all zeros).
    #[error("{file}: bad segment header: {reason}")]
    Header { file: PathBuf, reason: String },
    /// A segment belongs to another journal: other group, group count, partition count or
    /// partition function, or its header disagrees with its file name or length.
    #[error("{file}: segment does not match this journal: {what}")]
    Mismatch { file: PathBuf, what: String },
    /// A record the journal had made durable cannot be read: the file was damaged after the
    /// sync; or segment files are missing. Opening stops here; `smp-journal repair`
    /// (the [`crate::repair`] function) cuts the journal at this point, or accepts a missing
    /// first or last segment.
    #[error(
        "{file}: damaged record at offset {offset}, before the synced offset {synced}: {reason}; \
         run `smp-journal repair`: it cuts the journal there (records from this one on are \
         lost), or accepts a missing first or last segment, and says what is lost"
    )]
    Damage {
        file: PathBuf,
        offset: u64,
        synced: u64,
        reason: String,
    },
    /// A record with a valid CRC has a kind this version does not know: it was written by a
    /// newer smp-journal. Never treated as a torn tail.
    #[error(
        "{file}: record at offset {offset} has kind {kind}, unknown to this version of \
         smp-journal (written by a newer version?)"
    )]
    UnknownKind {
        file: PathBuf,
        offset: u64,
        kind: u16,
    },
    /// The replay callback refused a record.
    #[error("{file}: record at offset {offset}: {reason}")]
    Replay {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// Another process (or another `Journal` in this one) has the group open.
    #[error("{path}: the journal group is open elsewhere (lock held)")]
    Locked { path: PathBuf },
    /// The record does not fit in an empty segment.
    #[error("record of {len} bytes does not fit in a segment (at most {max})")]
    TooLarge { len: u64, max: u64 },
    /// IDs are stored with a one-byte length.
    #[error("ID of {len} bytes; IDs are at most 255 bytes")]
    IdTooLong { len: usize },
    /// `read` was given a location that holds no record of this journal.
    #[error("no record at segment {segment} offset {offset}: {reason}")]
    BadLocation {
        segment: u64,
        offset: u64,
        reason: String,
    },
    /// `remove_segment` on the segment being appended to.
    #[error("segment {0} is the active segment and cannot be removed")]
    ActiveSegment(u64),
    /// `remove_segment` or `start_compaction` on a segment a running compaction replaces, or a
    /// second compaction while one runs.
    #[error("segment {0} is being compacted")]
    Compacting(u64),
    /// `start_compaction` with a prefix or records it cannot compact.
    #[error("cannot compact: {0}")]
    BadCompaction(String),
    /// `remove_segment` on a segment the journal does not have.
    #[error("no segment {0}")]
    NoSuchSegment(u64),
    /// `remove_segment` on a segment that is not the group's oldest: segments go oldest first,
    /// so that the numbers of those left have no gap.
    #[error("segment {0} is not the oldest segment; segments are removed oldest first")]
    NotOldest(u64),
    /// An earlier sync failed; after a failed msync/fdatasync the kernel may have dropped the
    /// dirty pages, so nothing written since can be called durable. Reopen the journal.
    #[error("an earlier sync failed ({0}); the journal must be reopened")]
    SyncFailed(String),
    /// Bad options (segment size).
    #[error("bad options: {0}")]
    Options(String),
}

impl JournalError {
    /// The journal cannot grow now (a full disk or the size cap): nothing was appended, and the
    /// same append may work later; release appends may still work meanwhile.
    pub fn is_out_of_space(&self) -> bool {
        matches!(
            self,
            JournalError::NoSpace { .. } | JournalError::SizeCap { .. }
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        JournalError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}

/// Something opening (or repairing) found and handled, for the caller to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub file: PathBuf,
    pub offset: u64,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at offset {}: {}",
            self.file.display(),
            self.offset,
            self.message
        )
    }
}
