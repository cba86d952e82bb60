//! The bytes on disk: segment headers, sync slots, record headers and record payloads.
//!
//! `journal/FORMAT.md` describes the same layout in prose; the two must agree. Every integer is
//! little-endian.

use crate::error::JournalError;
use std::path::Path;

/// The first 8 bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SMPJSEG\0";
/// The on-disk format version this crate writes. Version 2 added the header flags (compaction);
/// version 3 the sync slots' flags ([`SLOT_FIRST`], [`SLOT_SUCCESSOR`]) and the records' flag
/// (`RECORD_CONTINUES`). Segments of versions 1 and 2 (no such flags) are read as they are.
pub const FORMAT_VERSION: u32 = 3;

/// Sync slot flag (version 3): no segment before this one belongs to the group any more (they
/// were removed as dead, or never existed); the group's records start here.
pub const SLOT_FIRST: u32 = 1;
/// Sync slot flag (version 3): the segment after this one was made and its name is durable; a
/// journal whose last segment says so has lost a segment.
pub const SLOT_SUCCESSOR: u32 = 2;

/// Record flag (version 3): the next record belongs to the same change. A change's records are
/// replayed whole or not at all: open cuts a journal whose last valid record says more follow
/// back to that change's first record.
pub const RECORD_CONTINUES: u16 = 1;

/// The oldest format version this crate reads.
pub const OLDEST_READ_VERSION: u32 = 1;
/// Bytes before the first record of a segment (one page: the header page holds the sync slots).
pub const HEADER_LEN: u64 = 4096;
/// Length of the fixed part of the header that the header CRC covers.
pub(crate) const HEADER_FIXED_LEN: usize = 96;
/// Where the header CRC is kept.
pub(crate) const HEADER_CRC_AT: usize = 96;
/// Where the two sync slots are (different disk sectors, written alternately).
pub(crate) const SLOT_AT: [usize; 2] = [512, 1024];
/// Bytes of one sync slot.
pub(crate) const SLOT_LEN: usize = 24;
/// Length of the partition function name field.
pub(crate) const PARTITION_NAME_LEN: usize = 32;

/// The first 4 bytes of every record.
pub const RECORD_MAGIC: [u8; 4] = *b"JRec";
/// Bytes of a record header; the payload follows.
pub const RECORD_HEADER_LEN: u64 = 32;
/// Records start at offsets that are multiples of this.
pub const RECORD_ALIGN: u64 = 8;

/// The smallest allowed segment size (the header page and one page of records).
pub const MIN_SEGMENT_SIZE: u64 = 2 * HEADER_LEN;

/// Message IDs are 24 bytes (they are also a nonce in the relay).
pub type MsgId = [u8; 24];

/// Rounds `n` up to the record alignment.
pub(crate) fn align(n: u64) -> u64 {
    n.div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The fixed part of a segment header: what the segment is and where it belongs. Written once,
/// when the segment is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Format version the segment was written with.
    pub version: u32,
    /// The partition group whose records the segment holds.
    pub group: u32,
    /// Number of partition groups of the journal that wrote it (`JOURNAL_GROUPS`).
    pub groups: u32,
    /// Number of partitions of the journal that wrote it (`PARTITIONS`).
    pub partitions: u32,
    /// The name of the partition function (`PARTITION_FUNCTION`).
    pub partition_function: String,
    /// The segment's number; also in its file name.
    pub segment: u64,
    /// The file's length as preallocated (the file is never shorter or longer).
    pub segment_len: u64,
    /// Sequence number of the segment's first record.
    pub first_seq: u64,
    /// Random number the first record's `prev_crc` must equal, so that records left in a file of
    /// an earlier life of the same name never join this one's chain.
    pub chain_seed: u32,
    /// [`SEGMENT_COMPACTED`] or 0 (other bits are zero in this version).
    pub flags: u32,
}

/// Header flag: the segment was written by compaction and replaces every lower-numbered segment
/// of its group (`journal/FORMAT.md`, "Compaction"); such segments still found at open are
/// leftovers of an interrupted compaction and are removed.
pub const SEGMENT_COMPACTED: u32 = 1;

impl SegmentHeader {
    /// The header's fixed bytes and CRC (the first `HEADER_CRC_AT + 4` bytes of the file).
    pub fn encode(&self) -> [u8; HEADER_FIXED_LEN + 4] {
        let mut b = [0u8; HEADER_FIXED_LEN + 4];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..20].copy_from_slice(&self.group.to_le_bytes());
        b[20..24].copy_from_slice(&self.groups.to_le_bytes());
        b[24..28].copy_from_slice(&self.partitions.to_le_bytes());
        b[32..40].copy_from_slice(&self.segment.to_le_bytes());
        b[40..48].copy_from_slice(&self.segment_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.first_seq.to_le_bytes());
        b[56..60].copy_from_slice(&self.chain_seed.to_le_bytes());
        b[60..64].copy_from_slice(&self.flags.to_le_bytes());
        let name = self.partition_function.as_bytes();
        let n = name.len().min(PARTITION_NAME_LEN);
        b[64..64 + n].copy_from_slice(&name[..n]);
        let crc = crc32c::crc32c(&b[..HEADER_FIXED_LEN]);
        b[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads the fixed header from the first bytes of a segment file (at least
    /// `HEADER_CRC_AT + 4`). Checks the magic, the CRC and the version; not the group or the
    /// partition settings (see [`SegmentHeader::check`]).
    pub fn decode(b: &[u8], file: &Path) -> Result<SegmentHeader, JournalError> {
        let bad = |reason: String| JournalError::Header {
            file: file.to_path_buf(),
            reason,
        };
        if b.len() < HEADER_FIXED_LEN + 4 {
            return Err(bad(format!(
                "file too short for a header ({} bytes)",
                b.len()
            )));
        }
        if b[0..8] != SEGMENT_MAGIC {
            if b[..HEADER_FIXED_LEN + 4].iter().all(|&x| x == 0) {
                return Err(bad(
                    "the header is all zeros (segment creation never finished)".into(),
                ));
            }
            return Err(bad("not a journal segment (wrong magic)".into()));
        }
        let crc = crc32c::crc32c(&b[..HEADER_FIXED_LEN]);
        if crc != u32_at(b, HEADER_CRC_AT) {
            return Err(bad("header CRC mismatch".into()));
        }
        let version = u32_at(b, 8);
        if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(bad(format!(
                "format version {version}, this smp-journal reads versions \
                 {OLDEST_READ_VERSION} to {FORMAT_VERSION}"
            )));
        }
        let flags = u32_at(b, 60);
        if flags & !SEGMENT_COMPACTED != 0 || (flags != 0 && u32_at(b, 8) < 2) {
            return Err(bad(format!("unknown header flags {flags:#x}")));
        }
        let header_len = u32_at(b, 12) as u64;
        if header_len != HEADER_LEN {
            return Err(bad(format!(
                "header length {header_len}, expected {HEADER_LEN}"
            )));
        }
        let name = &b[64..64 + PARTITION_NAME_LEN];
        let end = name.iter().position(|&x| x == 0).unwrap_or(name.len());
        Ok(SegmentHeader {
            version,
            group: u32_at(b, 16),
            groups: u32_at(b, 20),
            partitions: u32_at(b, 24),
            partition_function: String::from_utf8_lossy(&name[..end]).into_owned(),
            segment: u64_at(b, 32),
            segment_len: u64_at(b, 40),
            first_seq: u64_at(b, 48),
            chain_seed: u32_at(b, 56),
            flags,
        })
    }

    /// Checks that the segment belongs to `group` of a journal with this crate's partitioning,
    /// that its number is `segment` (the file name's) and its length `file_len`.
    pub fn check(
        &self,
        file: &Path,
        group: u32,
        segment: u64,
        file_len: u64,
    ) -> Result<(), JournalError> {
        let mismatch = |what: String| JournalError::Mismatch {
            file: file.to_path_buf(),
            what,
        };
        if self.groups != crate::JOURNAL_GROUPS
            || self.partitions != crate::PARTITIONS
            || self.partition_function != crate::PARTITION_FUNCTION
        {
            return Err(mismatch(format!(
                "written with {} groups, {} partitions, partition function {:?}; this journal uses \
                 {} groups, {} partitions, {:?}",
                self.groups,
                self.partitions,
                self.partition_function,
                crate::JOURNAL_GROUPS,
                crate::PARTITIONS,
                crate::PARTITION_FUNCTION
            )));
        }
        if self.group != group {
            return Err(mismatch(format!(
                "holds group {}, found in the directory of group {group}",
                self.group
            )));
        }
        if self.segment != segment {
            return Err(mismatch(format!(
                "holds segment {}, but its file name says {segment}",
                self.segment
            )));
        }
        if self.segment_len != file_len {
            let what = if file_len < self.segment_len {
                "it was cut short (files are never truncated): `smp-journal repair` extends it \
                 with zeros and cuts the journal where its records end"
            } else {
                "files are never grown: was it copied? `smp-journal repair` does not change it; \
                 move it away if it is not this segment"
            };
            return Err(mismatch(format!(
                "the header says {} bytes, the file has {file_len}: {what}",
                self.segment_len
            )));
        }
        if self.segment_len < MIN_SEGMENT_SIZE || self.segment_len % HEADER_LEN != 0 {
            return Err(mismatch(format!(
                "impossible segment length {}",
                self.segment_len
            )));
        }
        Ok(())
    }
}

/// One sync slot: "records up to `synced_end` are durable", and (version 3) what the segment
/// says of its neighbours. Two slots are kept and written alternately; the valid one with the
/// higher `count` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub count: u64,
    pub synced_end: u64,
    /// [`SLOT_FIRST`], [`SLOT_SUCCESSOR`]; always 0 in a segment of version 1 or 2.
    pub flags: u32,
}

/// The CRC of a slot: of its count and offset, and in version 3 of its flags too.
fn slot_crc(b: &[u8], version: u32) -> u32 {
    let c = crc32c::crc32c(&b[..16]);
    if version >= 3 {
        crc32c::crc32c_append(c, &b[20..24])
    } else {
        c
    }
}

impl Slot {
    /// The slot's bytes in a segment of format `version` (flags are written from version 3 on).
    pub fn encode(&self, version: u32) -> [u8; SLOT_LEN] {
        let mut b = [0u8; SLOT_LEN];
        b[0..8].copy_from_slice(&self.count.to_le_bytes());
        b[8..16].copy_from_slice(&self.synced_end.to_le_bytes());
        if version >= 3 {
            b[20..24].copy_from_slice(&self.flags.to_le_bytes());
        }
        let crc = slot_crc(&b, version);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8], version: u32) -> Option<Slot> {
        let count = u64_at(b, 0);
        if count == 0 || slot_crc(b, version) != u32_at(b, 16) {
            return None;
        }
        Some(Slot {
            count,
            synced_end: u64_at(b, 8),
            flags: if version >= 3 { u32_at(b, 20) } else { 0 },
        })
    }

    /// The current slot of a header page (at least `SLOT_AT[1] + SLOT_LEN` bytes) of a segment of
    /// format `version`; a segment that was never synced has none, and counts as synced up to
    /// `HEADER_LEN`.
    pub fn current(header_page: &[u8], version: u32) -> Slot {
        let a = Slot::decode(&header_page[SLOT_AT[0]..SLOT_AT[0] + SLOT_LEN], version);
        let b = Slot::decode(&header_page[SLOT_AT[1]..SLOT_AT[1] + SLOT_LEN], version);
        match (a, b) {
            (Some(a), Some(b)) => {
                if a.count >= b.count {
                    a
                } else {
                    b
                }
            }
            (Some(s), None) | (None, Some(s)) => s,
            (None, None) => Slot {
                count: 0,
                synced_end: HEADER_LEN,
                flags: 0,
            },
        }
    }

    /// Where the slot after this one is written.
    pub fn next_at(&self) -> usize {
        SLOT_AT[((self.count + 1) % 2) as usize]
    }
}

/// Record kinds, as stored in the record header. New kinds get new numbers; a reader that meets a
/// number it does not know stops with [`JournalError::UnknownKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Kind {
    QueueCreate = 1,
    QueueUpdate = 2,
    QueueDelete = 3,
    MsgAppend = 4,
    MsgDelete = 5,
    NtfAppend = 6,
    NtfDelete = 7,
    NtfClear = 8,
    Checkpoint = 9,
}

impl Kind {
    /// Every kind this version knows.
    pub const ALL: [Kind; 9] = [
        Kind::QueueCreate,
        Kind::QueueUpdate,
        Kind::QueueDelete,
        Kind::MsgAppend,
        Kind::MsgDelete,
        Kind::NtfAppend,
        Kind::NtfDelete,
        Kind::NtfClear,
        Kind::Checkpoint,
    ];

    pub fn from_u16(k: u16) -> Option<Kind> {
        Kind::ALL.into_iter().find(|x| *x as u16 == k)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::QueueCreate => "queue-create",
            Kind::QueueUpdate => "queue-update",
            Kind::QueueDelete => "queue-delete",
            Kind::MsgAppend => "msg-append",
            Kind::MsgDelete => "msg-delete",
            Kind::NtfAppend => "ntf-append",
            Kind::NtfDelete => "ntf-delete",
            Kind::NtfClear => "ntf-clear",
            Kind::Checkpoint => "checkpoint",
        }
    }
}

/// A record as the journal stores it. IDs are at most 255 bytes; `data`, `body` and checkpoint
/// bytes are opaque to the journal (the relay encodes its queue records, notifications and
/// checkpoints itself). Records read back borrow from the mapping or the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A new queue: its recipient ID and the caller's encoding of its record.
    QueueCreate {
        recipient_id: &'a [u8],
        data: &'a [u8],
    },
    /// A queue's record replaced.
    QueueUpdate {
        recipient_id: &'a [u8],
        data: &'a [u8],
    },
    /// A queue deleted, with its messages and notifications.
    QueueDelete { recipient_id: &'a [u8] },
    /// A message appended to a queue. `flags` belong to the caller (e.g. "notification",
    /// "quota marker").
    MsgAppend {
        recipient_id: &'a [u8],
        msg_id: &'a MsgId,
        ts: i64,
        flags: u8,
        body: &'a [u8],
    },
    /// A message deleted from a queue.
    MsgDelete {
        recipient_id: &'a [u8],
        msg_id: &'a MsgId,
    },
    /// A notification stored for a notifier ID (the caller's encoding).
    NtfAppend {
        notifier_id: &'a [u8],
        data: &'a [u8],
    },
    /// One notification of a notifier ID removed (by the message ID it is about).
    NtfDelete {
        notifier_id: &'a [u8],
        msg_id: &'a MsgId,
    },
    /// Every notification of a notifier ID removed.
    NtfClear { notifier_id: &'a [u8] },
    /// A caller-defined marker (e.g. "a snapshot of this group was written"); opaque.
    Checkpoint { data: &'a [u8] },
}

/// Why a payload could not be read as its kind.
pub(crate) fn payload_error(kind: Kind, why: &str) -> String {
    format!("{} payload {why}", kind.name())
}

struct Cursor<'a> {
    b: &'a [u8],
    kind: Kind,
}

impl<'a> Cursor<'a> {
    fn id(&mut self) -> Result<&'a [u8], String> {
        let (&n, rest) = self
            .b
            .split_first()
            .ok_or_else(|| payload_error(self.kind, "ends before an ID length"))?;
        if rest.len() < n as usize {
            return Err(payload_error(self.kind, "ends inside an ID"));
        }
        let (id, rest) = rest.split_at(n as usize);
        self.b = rest;
        Ok(id)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.b.len() < n {
            return Err(payload_error(self.kind, "is too short"));
        }
        let (x, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(x)
    }
    fn msg_id(&mut self) -> Result<&'a MsgId, String> {
        Ok(self.take(24)?.try_into().unwrap())
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.b)
    }
    fn end(&self) -> Result<(), String> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(payload_error(self.kind, "has trailing bytes"))
        }
    }
}

impl<'a> Record<'a> {
    pub fn kind(&self) -> Kind {
        match self {
            Record::QueueCreate { .. } => Kind::QueueCreate,
            Record::QueueUpdate { .. } => Kind::QueueUpdate,
            Record::QueueDelete { .. } => Kind::QueueDelete,
            Record::MsgAppend { .. } => Kind::MsgAppend,
            Record::MsgDelete { .. } => Kind::MsgDelete,
            Record::NtfAppend { .. } => Kind::NtfAppend,
            Record::NtfDelete { .. } => Kind::NtfDelete,
            Record::NtfClear { .. } => Kind::NtfClear,
            Record::Checkpoint { .. } => Kind::Checkpoint,
        }
    }

    /// The recipient or notifier ID the record is about, if any.
    pub fn id(&self) -> Option<&'a [u8]> {
        match *self {
            Record::QueueCreate { recipient_id, .. }
            | Record::QueueUpdate { recipient_id, .. }
            | Record::QueueDelete { recipient_id }
            | Record::MsgAppend { recipient_id, .. }
            | Record::MsgDelete { recipient_id, .. } => Some(recipient_id),
            Record::NtfAppend { notifier_id, .. }
            | Record::NtfDelete { notifier_id, .. }
            | Record::NtfClear { notifier_id } => Some(notifier_id),
            Record::Checkpoint { .. } => None,
        }
    }

    /// Bytes of the payload (without the record header and padding).
    pub fn payload_len(&self) -> usize {
        match *self {
            Record::QueueCreate { recipient_id, data }
            | Record::QueueUpdate { recipient_id, data } => 1 + recipient_id.len() + data.len(),
            Record::QueueDelete { recipient_id } => 1 + recipient_id.len(),
            Record::MsgAppend {
                recipient_id, body, ..
            } => 1 + recipient_id.len() + 24 + 8 + 1 + body.len(),
            Record::MsgDelete { recipient_id, .. } => 1 + recipient_id.len() + 24,
            Record::NtfAppend { notifier_id, data } => 1 + notifier_id.len() + data.len(),
            Record::NtfDelete { notifier_id, .. } => 1 + notifier_id.len() + 24,
            Record::NtfClear { notifier_id } => 1 + notifier_id.len(),
            Record::Checkpoint { data } => data.len(),
        }
    }

    /// Bytes the record takes in a segment: header, payload, padding to 8 bytes.
    pub fn stored_len(&self) -> u64 {
        align(RECORD_HEADER_LEN + self.payload_len() as u64)
    }

    /// Checks what `encode_payload` relies on: IDs of at most 255 bytes.
    pub(crate) fn check_ids(&self) -> Result<(), JournalError> {
        if let Some(id) = self.id() {
            if id.len() > 255 {
                return Err(JournalError::IdTooLong { len: id.len() });
            }
        }
        Ok(())
    }

    /// Writes the payload into `out` (exactly `payload_len()` bytes).
    pub(crate) fn encode_payload(&self, out: &mut [u8]) {
        let mut at = 0;
        let mut put = |x: &[u8]| {
            out[at..at + x.len()].copy_from_slice(x);
            at += x.len();
        };
        match *self {
            Record::QueueCreate { recipient_id, data }
            | Record::QueueUpdate { recipient_id, data } => {
                put(&[recipient_id.len() as u8]);
                put(recipient_id);
                put(data);
            }
            Record::QueueDelete { recipient_id } => {
                put(&[recipient_id.len() as u8]);
                put(recipient_id);
            }
            Record::MsgAppend {
                recipient_id,
                msg_id,
                ts,
                flags,
                body,
            } => {
                put(&[recipient_id.len() as u8]);
                put(recipient_id);
                put(msg_id);
                put(&ts.to_le_bytes());
                put(&[flags]);
                put(body);
            }
            Record::MsgDelete {
                recipient_id,
                msg_id,
            } => {
                put(&[recipient_id.len() as u8]);
                put(recipient_id);
                put(msg_id);
            }
            Record::NtfAppend { notifier_id, data } => {
                put(&[notifier_id.len() as u8]);
                put(notifier_id);
                put(data);
            }
            Record::NtfDelete {
                notifier_id,
                msg_id,
            } => {
                put(&[notifier_id.len() as u8]);
                put(notifier_id);
                put(msg_id);
            }
            Record::NtfClear { notifier_id } => {
                put(&[notifier_id.len() as u8]);
                put(notifier_id);
            }
            Record::Checkpoint { data } => put(data),
        }
    }

    /// Reads a payload of a known kind.
    pub(crate) fn decode(kind: Kind, payload: &'a [u8]) -> Result<Record<'a>, String> {
        let mut c = Cursor { b: payload, kind };
        let r = match kind {
            Kind::QueueCreate => Record::QueueCreate {
                recipient_id: c.id()?,
                data: c.rest(),
            },
            Kind::QueueUpdate => Record::QueueUpdate {
                recipient_id: c.id()?,
                data: c.rest(),
            },
            Kind::QueueDelete => Record::QueueDelete {
                recipient_id: c.id()?,
            },
            Kind::MsgAppend => {
                let recipient_id = c.id()?;
                let msg_id = c.msg_id()?;
                let ts = i64::from_le_bytes(c.take(8)?.try_into().unwrap());
                let flags = c.take(1)?[0];
                Record::MsgAppend {
                    recipient_id,
                    msg_id,
                    ts,
                    flags,
                    body: c.rest(),
                }
            }
            Kind::MsgDelete => Record::MsgDelete {
                recipient_id: c.id()?,
                msg_id: c.msg_id()?,
            },
            Kind::NtfAppend => Record::NtfAppend {
                notifier_id: c.id()?,
                data: c.rest(),
            },
            Kind::NtfDelete => Record::NtfDelete {
                notifier_id: c.id()?,
                msg_id: c.msg_id()?,
            },
            Kind::NtfClear => Record::NtfClear {
                notifier_id: c.id()?,
            },
            Kind::Checkpoint => Record::Checkpoint { data: c.rest() },
        };
        c.end()?;
        Ok(r)
    }
}

/// The fixed fields of a record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub len: u32,
    pub seq: u64,
    pub kind: u16,
    /// [`RECORD_CONTINUES`] or 0 (version 3; zero before).
    pub flags: u16,
    pub prev_crc: u32,
    /// Chosen at random by each open of the journal (see `FORMAT.md`, "Records").
    pub writer: u32,
    pub crc: u32,
}

impl RecordHeader {
    /// The header bytes with the CRC field zero; the CRC is computed over bytes 0..28 and the
    /// payload, then stored at 28..32.
    pub fn encode_without_crc(&self) -> [u8; RECORD_HEADER_LEN as usize] {
        let mut b = [0u8; RECORD_HEADER_LEN as usize];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..18].copy_from_slice(&self.kind.to_le_bytes());
        b[18..20].copy_from_slice(&self.flags.to_le_bytes());
        b[20..24].copy_from_slice(&self.prev_crc.to_le_bytes());
        b[24..28].copy_from_slice(&self.writer.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> RecordHeader {
        RecordHeader {
            len: u32_at(b, 4),
            seq: u64_at(b, 8),
            kind: u16_at(b, 16),
            flags: u16_at(b, 18),
            prev_crc: u32_at(b, 20),
            writer: u32_at(b, 24),
            crc: u32_at(b, 28),
        }
    }

    /// Whether the flags (bytes 18..20) are ones a segment of format `version` may hold: none
    /// before version 3, [`RECORD_CONTINUES`] from it on.
    pub fn flags_known(b: &[u8], version: u32) -> bool {
        let flags = u16_at(b, 18);
        flags == 0 || (version >= 3 && flags & !RECORD_CONTINUES == 0)
    }
}

/// The CRC stored in a record: CRC32C over the header's first 28 bytes, then the payload.
pub(crate) fn record_crc(header28: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&header28[..28]), payload)
}
