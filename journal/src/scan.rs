//! The one record scanner, used over a mapping (open, repair) and over `pread` (the reader); and
//! a lenient one that reads past bad records, for `repair`'s account of what it dropped.

use std::path::Path;

use crate::error::JournalError;
use crate::format::{
    align, record_crc, Kind, Record, RecordHeader, SegmentHeader, HEADER_LEN, RECORD_ALIGN,
    RECORD_CONTINUES, RECORD_HEADER_LEN, RECORD_MAGIC,
};
use crate::fs::FsFile;
use crate::Location;

/// How far past a bad record the scanner looks for non-zero bytes to tell a torn tail from the
/// zero-filled preallocated rest of a segment.
pub(crate) const ZERO_WINDOW: u64 = 4096;

/// Bytes of a segment file, by offset.
pub(crate) trait Source {
    fn len(&self) -> u64;
    /// `n` bytes at `off`; the caller keeps `off + n <= len()`.
    fn bytes(&mut self, off: u64, n: usize) -> Result<&[u8], JournalError>;
}

/// A segment's bytes in memory (a mapping with no writer running).
pub(crate) struct SliceSource<'a>(pub &'a [u8]);

impl Source for SliceSource<'_> {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }
    fn bytes(&mut self, off: u64, n: usize) -> Result<&[u8], JournalError> {
        Ok(&self.0[off as usize..off as usize + n])
    }
}

/// A segment file read with `pread` through a window buffer; never maps.
pub(crate) struct PreadSource<'p, T: FsFile> {
    file: T,
    path: &'p Path,
    len: u64,
    buf: Vec<u8>,
    buf_off: u64,
}

const WINDOW: usize = 1 << 20;

impl<'p, T: FsFile> PreadSource<'p, T> {
    pub fn new(file: T, path: &'p Path, len: u64) -> Self {
        PreadSource {
            file,
            path,
            len,
            buf: Vec::new(),
            buf_off: 0,
        }
    }
}

impl<T: FsFile> Source for PreadSource<'_, T> {
    fn len(&self) -> u64 {
        self.len
    }
    fn bytes(&mut self, off: u64, n: usize) -> Result<&[u8], JournalError> {
        let have = off >= self.buf_off && off + n as u64 <= self.buf_off + self.buf.len() as u64;
        if !have {
            let want = (n.max(WINDOW) as u64).min(self.len - off) as usize;
            self.buf.resize(want, 0);
            self.file
                .read_exact_at(&mut self.buf, off)
                .map_err(|e| JournalError::io(self.path, "pread", e))?;
            self.buf_off = off;
        }
        let start = (off - self.buf_off) as usize;
        Ok(&self.buf[start..start + n])
    }
}

/// Why a scan stopped before the end of the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bad {
    pub offset: u64,
    pub reason: String,
    /// The bytes at `offset` (and a little beyond) are all zero: the preallocated tail, no
    /// record was ever started there.
    pub zero: bool,
}

/// Where a scan of one segment ended.
#[derive(Debug, Clone)]
pub(crate) struct ScanEnd {
    /// Offset after the last valid record.
    pub end: u64,
    pub records: u64,
    /// Sequence number of the last valid record, if any.
    pub last_seq: Option<u64>,
    /// CRC of the last valid record (the chain seed when there is none).
    pub last_crc: u32,
    /// `None` when the scan reached the end of the file.
    pub bad: Option<Bad>,
}

fn all_zero<S: Source>(src: &mut S, off: u64) -> Result<bool, JournalError> {
    let n = ZERO_WINDOW.min(src.len() - off) as usize;
    Ok(src.bytes(off, n)?.iter().all(|&b| b == 0))
}

/// Scans a segment's records from the first, calling `f` with each valid one, and stops at the
/// first byte that is not a valid record following the previous one. A change written as several
/// records (each but its last with [`RECORD_CONTINUES`]) reaches `f` only once its last record is
/// read: a scan that stops inside one stops at its first record instead, as if none of it were
/// there. Errors are I/O, an unknown kind (never a torn tail) and `f`'s refusals; everything else
/// is a [`Bad`] stop for the caller to call a clean end, a torn tail or damage.
pub(crate) fn scan<S: Source>(
    src: &mut S,
    path: &Path,
    hdr: &SegmentHeader,
    mut f: impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
) -> Result<ScanEnd, JournalError> {
    let len = src.len();
    let mut off = HEADER_LEN;
    let mut out = ScanEnd {
        end: off,
        records: 0,
        last_seq: None,
        last_crc: hdr.chain_seed,
        bad: None,
    };
    let mut expect_seq = hdr.first_seq;
    let mut prev_crc = hdr.chain_seed;
    // The first record of a change whose last record is not read yet.
    let mut open_change: Option<u64> = None;
    loop {
        let stop = match next_record(src, path, hdr, off, expect_seq, prev_crc)? {
            Next::Record {
                seq,
                crc,
                flags,
                end,
            } => {
                expect_seq = seq + 1;
                prev_crc = crc;
                if flags & RECORD_CONTINUES != 0 {
                    open_change.get_or_insert(off);
                    off = end;
                    continue;
                }
                // A whole change: deliver its records.
                let from = open_change.take().unwrap_or(off);
                let mut at = from;
                while at < end {
                    let Next::Record { end: e, .. } = deliver(src, path, hdr, at, &mut f)? else {
                        unreachable!("a record read once reads again");
                    };
                    out.records += 1;
                    at = e;
                }
                out.last_seq = Some(seq);
                out.last_crc = crc;
                off = end;
                out.end = off.min(len);
                continue;
            }
            Next::Stop(bad) => bad,
            Next::EndOfFile => None,
        };
        if let Some(start) = open_change {
            // The scan ends inside a change: it is cut whole.
            out.bad = Some(Bad {
                offset: start,
                reason: match &stop {
                    Some(b) => format!("a change whose last records are missing ({})", b.reason),
                    None => "a change whose last records are missing".into(),
                },
                zero: false,
            });
        } else {
            out.bad = stop;
        }
        return Ok(out);
    }
}

/// What [`next_record`] found at an offset.
enum Next {
    Record {
        seq: u64,
        crc: u32,
        flags: u16,
        /// Where the next record starts.
        end: u64,
    },
    Stop(Option<Bad>),
    EndOfFile,
}

/// The record at `off` if it is valid and follows the one before (sequence number, chain CRC).
fn next_record<S: Source>(
    src: &mut S,
    path: &Path,
    hdr: &SegmentHeader,
    off: u64,
    expect_seq: u64,
    prev_crc: u32,
) -> Result<Next, JournalError> {
    let len = src.len();
    if off + RECORD_HEADER_LEN > len {
        return Ok(Next::EndOfFile);
    }
    let hb: [u8; RECORD_HEADER_LEN as usize] = src
        .bytes(off, RECORD_HEADER_LEN as usize)?
        .try_into()
        .unwrap();
    let stop = |reason: String, zero: bool| {
        Ok(Next::Stop(Some(Bad {
            offset: off,
            reason,
            zero,
        })))
    };
    if hb[0..4] != RECORD_MAGIC {
        let zero = all_zero(src, off)?;
        let reason = if zero {
            "zero bytes: end of records".to_string()
        } else {
            "no record magic".to_string()
        };
        return stop(reason, zero);
    }
    let h = RecordHeader::decode(&hb);
    if !RecordHeader::flags_known(&hb, hdr.version) {
        return stop("reserved header bytes are not zero".into(), false);
    }
    let total = RECORD_HEADER_LEN + h.len as u64;
    if off + total > len {
        return stop(
            format!(
                "impossible length {} (the segment ends {} bytes after the header)",
                h.len,
                len - off - RECORD_HEADER_LEN
            ),
            false,
        );
    }
    let all = src.bytes(off, total as usize)?;
    let payload = &all[RECORD_HEADER_LEN as usize..];
    if record_crc(&hb, payload) != h.crc {
        return stop("CRC mismatch".into(), false);
    }
    if h.prev_crc != prev_crc {
        return stop(
            "does not follow the previous record (chain CRC differs): left from an earlier write"
                .into(),
            false,
        );
    }
    if h.seq != expect_seq {
        return stop(
            format!("sequence number {}, expected {expect_seq}", h.seq),
            false,
        );
    }
    let Some(kind) = Kind::from_u16(h.kind) else {
        return Err(JournalError::UnknownKind {
            file: path.to_path_buf(),
            offset: off,
            kind: h.kind,
        });
    };
    if let Err(reason) = Record::decode(kind, payload) {
        return stop(reason, false);
    }
    Ok(Next::Record {
        seq: h.seq,
        crc: h.crc,
        flags: h.flags,
        end: off + align(total),
    })
}

/// Reads the record at `off` again (it was checked) and gives it to `f`.
fn deliver<S: Source>(
    src: &mut S,
    path: &Path,
    hdr: &SegmentHeader,
    off: u64,
    f: &mut impl FnMut(Location, u64, Record<'_>) -> Result<(), String>,
) -> Result<Next, JournalError> {
    let hb: [u8; RECORD_HEADER_LEN as usize] = src
        .bytes(off, RECORD_HEADER_LEN as usize)?
        .try_into()
        .unwrap();
    let h = RecordHeader::decode(&hb);
    let total = RECORD_HEADER_LEN + h.len as u64;
    let all = src.bytes(off, total as usize)?;
    let payload = &all[RECORD_HEADER_LEN as usize..];
    let kind = Kind::from_u16(h.kind).expect("checked");
    let rec = Record::decode(kind, payload).expect("checked");
    let loc = Location {
        segment: hdr.segment,
        offset: off,
    };
    f(loc, h.seq, rec).map_err(|reason| JournalError::Replay {
        file: path.to_path_buf(),
        offset: off,
        reason,
    })?;
    Ok(Next::Record {
        seq: h.seq,
        crc: h.crc,
        flags: h.flags,
        end: off + align(total),
    })
}

/// Finds records leniently from `from` (a multiple of 8) to the end of the segment, calling `f`
/// with each one's offset: wherever the record magic, a length that fits, the record CRC, a known
/// kind and a readable payload hold, stepping 8 bytes otherwise. Chain CRCs, sequence numbers and
/// changes are ignored, so it reads past a bad record: for saying what a cut dropped
/// (`repair`), never for replaying.
pub(crate) fn scan_lenient<S: Source>(
    src: &mut S,
    from: u64,
    mut f: impl FnMut(u64, Record<'_>),
) -> Result<(), JournalError> {
    let len = src.len();
    let mut off = align(from.max(HEADER_LEN));
    while off + RECORD_HEADER_LEN <= len {
        let hb: [u8; RECORD_HEADER_LEN as usize] = src
            .bytes(off, RECORD_HEADER_LEN as usize)?
            .try_into()
            .unwrap();
        let h = RecordHeader::decode(&hb);
        let total = RECORD_HEADER_LEN + h.len as u64;
        if hb[0..4] != RECORD_MAGIC || off + total > len {
            off += RECORD_ALIGN;
            continue;
        }
        let all = src.bytes(off, total as usize)?;
        let payload = &all[RECORD_HEADER_LEN as usize..];
        let rec = Kind::from_u16(h.kind)
            .filter(|_| record_crc(&hb, payload) == h.crc)
            .and_then(|kind| Record::decode(kind, payload).ok());
        match rec {
            Some(rec) => {
                f(off, rec);
                off += align(total);
            }
            None => off += RECORD_ALIGN,
        }
    }
    Ok(())
}
