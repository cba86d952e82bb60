//! The journal store's storage layer: a crash-safe, memory-mapped, append-only journal per
//! partition group (`docs/ARCHITECTURE.md` §1 and §5).
//!
//! This crate knows bytes, not queues: the relay encodes its queue records and notifications into
//! opaque payloads, and builds its in-memory state by replaying records at start. The on-disk
//! format is described in `journal/FORMAT.md`.
//!
//! # Layout
//!
//! `<root>/gNN/seg-NNNNNNNNN.jnl`: one directory per partition group (`g00` … `g63`), each with
//! numbered segment files. A segment is preallocated to its full size when created
//! (`fallocate`), mapped `MAP_SHARED`, filled with records from the front, and never truncated;
//! when a record does not fit (an ordinary one: before the segment's release reserve), the
//! journal rotates to a new segment. Every segment header records
//! the group, the group count, the partition count and the partition function's name, so that a
//! journal is never read with another partitioning.
//!
//! # For the relay (`src/store/journal.rs`)
//!
//! - [`Journal::open`] per group the shard owns: replays every record (with its [`Location`] and
//!   sequence number) to a callback that builds the in-memory state; log the
//!   [`OpenReport::warnings`] (torn tails cut). A [`JournalError::Damage`] means the operator must
//!   run `smp-journal repair`.
//! - [`Journal::append`] on the shard thread: a copy into the mapping, no syscall except when
//!   rotating. It returns the record's [`Location`] (for [`Journal::read`], e.g. message bodies)
//!   and the [`SyncPoint`] it is durable at. [`Journal::append_with`] and [`Priority::Release`]
//!   for records that end or shrink state (deletes): they may fill the last bytes of a segment,
//!   its release reserve ([`Options::release_reserve`]), which ordinary appends leave free.
//! - [`Journal::sync_handle`] gives a [`SyncHandle`] (`Send + Sync + Clone`) for a sync thread:
//!   [`SyncHandle::sync_to`] (or [`SyncHandle::sync_all`]) msyncs and records the durable point
//!   in the segment header; answer a client only after its record's `end` is synced.
//! - [`Journal::segments`] and [`Journal::remove_segment`] when every record of an old segment is
//!   dead (the relay counts live records per segment).
//! - Space (`journal/FORMAT.md`, "Space"): [`JournalError::NoSpace`] from an append means no new
//!   segment could be preallocated (the disk is full), [`JournalError::SizeCap`] that a new one
//!   would pass the cap of the [`SpaceBudget`] the journals share ([`Options::budget`]; segment
//!   files found at open count, removed ones are given back). Either way nothing was appended, a
//!   release append still goes into the active segment's reserve until that is full too, and
//!   later appends work once there is room.
//!
//! # For the inspection tool (`smp-journal`)
//!
//! - [`reader::list_groups`], [`reader::read_group`], [`reader::read_segment`]: `pread` only, no
//!   mapping, no lock, so they run beside a running relay; they verify every record's CRC and
//!   report per segment and group counts, damage (by [`Journal::open`]'s rules: bad records,
//!   segment files missing or cut short) and warnings (torn tails, which open would cut).
//! - [`check`]: the consistency index over a group's records, by the relay's replay rules (what
//!   a replay makes of queues, messages and notifications, and the records that contradict it);
//!   the tool and the relay's storage fault simulator both use it.
//! - [`repair`]: give every damage a way out (relay stopped): cut a group at its first bad
//!   record, extend a segment file that was cut short, accept a missing first or last segment;
//!   its printable [`RepairReport`] says what was dropped, per queue ([`QueueLoss`]) and
//!   notifier ([`NotifierLoss`]).
//!
//! The crate's binary, `smp-journal` (`src/bin/smp-journal/`), is that tool: `stats`, `queues`,
//! `show`, `verify` beside a running relay, `repair` with the data directory's lock (README,
//! "Inspecting journals").
//!
//! # Compaction
//!
//! [`Journal::start_compaction`] (on the appending thread, with the records the caller keeps,
//! found with [`Journal::scan_segment`]) gives a [`CompactJob`] to run on another thread; its
//! [`Compacted`] goes back to [`Journal::install_compaction`], which returns where each kept
//! record went. The compacted segment replaces the group's oldest segments (see `compact.rs` and
//! `journal/FORMAT.md`, "Compaction").
//!
//! # Checkpoints
//!
//! [`Journal::checkpoint_base`] (on the appending thread, with the caller's snapshot of its
//! state at that point) gives a [`CheckpointBase`] whose `write` syncs and writes the group's
//! checkpoint file; [`Journal::open_from_checkpoint`] gives a checkpoint that still fits the
//! segments to the caller and replays only the records after it (`journal/FORMAT.md`,
//! "Checkpoints"). A snapshot taken in steps while records are appended is sealed with
//! [`Journal::checkpoint_seal`] before it is written.
//!
//! # Durability and its proof
//!
//! Segments are removed ([`Journal::remove_segment`], oldest first) and compactions installed
//! only after the records that made their contents dead are durable ([`Retired`], [`CompactJob`]).
//! A failed sync makes the journal refuse every later one ([`Journal::sync_failed`]). Every
//! file-system call goes through [`fs::Fs`]: the relay uses [`OsFs`]; tests use `sim::SimFs`
//! (feature `sim`), a disk in memory that crashes at any call, keeping exactly what was synced,
//! any part of the rest, or torn pages, and fails chosen calls.

pub mod check;
mod checkpoint;
mod compact;
mod error;
mod format;
pub mod fs;
mod journal;
pub mod reader;
mod repair;
mod scan;
mod segment;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod space;

pub use checkpoint::{
    read_checkpoint, Checkpoint, CheckpointBase, CheckpointPoint, SeenSegment, CHECKPOINT_FILE,
};
pub use compact::{CompactJob, Compacted};
pub use error::{JournalError, Warning};
pub use format::{
    Kind, MsgId, Record, SegmentHeader, FORMAT_VERSION, HEADER_LEN, MIN_SEGMENT_SIZE, RECORD_ALIGN,
    RECORD_HEADER_LEN, RECORD_MAGIC, SEGMENT_COMPACTED, SEGMENT_MAGIC, SLOT_FIRST, SLOT_SUCCESSOR,
};
pub use fs::{Fs, OsFs};
pub use journal::{
    Appended, Journal, Moved, OpenReport, Options, Prefetch, Retired, SegmentInfo, SegmentSize,
    SyncHandle, DEFAULT_INITIAL_SEGMENT_SIZE, DEFAULT_SEGMENT_SIZE,
};
pub use repair::{repair, repair_on, NotifierLoss, QueueLoss, RepairReport};
pub use segment::{create_dir_durable, parse_segment_file_name, segment_file_name};
pub use space::{Priority, SpaceBudget, DEFAULT_RELEASE_RESERVE, RESERVE_SHARE_DIVISOR};

use std::path::{Path, PathBuf};

/// Number of journal groups; partition `p` lives in group `p mod JOURNAL_GROUPS`.
pub const JOURNAL_GROUPS: u32 = 64;

/// Number of partitions.
pub const PARTITIONS: u32 = 4096;

/// The name of the partition function, recorded in every segment header: partition = the first
/// 8 bytes of SHA-256(recipient ID) as a big-endian integer, mod 4096; group = partition mod 64.
pub const PARTITION_FUNCTION: &str = "sha256-be64-mod4096-mod64";

/// The partition of a recipient ID (see [`PARTITION_FUNCTION`]).
pub fn partition_of(recipient_id: &[u8]) -> u32 {
    use sha2::Digest;
    let h = sha2::Sha256::digest(recipient_id);
    let b: [u8; 8] = h[..8].try_into().unwrap();
    (u64::from_be_bytes(b) % PARTITIONS as u64) as u32
}

/// The partition group of a recipient ID.
pub fn group_of(recipient_id: &[u8]) -> u32 {
    partition_of(recipient_id) % JOURNAL_GROUPS
}

/// The directory of group `g`: `<root>/gNN` (two digits).
pub fn group_dir(root: &Path, group: u32) -> PathBuf {
    root.join(format!("g{group:02}"))
}

/// Where a record is: segment number and byte offset of its header in the segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    pub segment: u64,
    pub offset: u64,
}

/// A point in a group's journal: everything that ends at or before it (segment, then offset) is
/// covered. `Appended::end` is the point just after a record; the durable point is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SyncPoint {
    pub segment: u64,
    pub offset: u64,
}
