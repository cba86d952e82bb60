//! `smp-relay store export` and `store import`: every queue of a stopped relay's store (its record,
//! its messages in order with the quota marker, its notifier's pending notifications) as one stream,
//! and that stream back into another store, so that an operator can move a relay between store kinds
//! (`docs/ARCHITECTURE.md` §5). Both sides go through the store traits only ([`ShardStore`],
//! generic over the kind), so every store kind reads and writes the same stream.
//!
//! # Stream format, version 2
//!
//! All integers big-endian.
//!
//! ```text
//! stream  = header, record*, trailer record, end of stream
//! header  = magic "SMPRXFR\0" (8) | format version u16 = 2
//! record  = kind u8 | payload length u32 | payload | CRC-32 u32
//!           (CRC-32/ISO-HDLC, as zlib's, over kind, length and payload)
//! kind 'S': service       payload = service record    (`store/services.rs`; every one before the
//!                                                      first queue, in the order of their IDs)
//! kind 'Q': queue         payload = record            (the encodings of `store/codec.rs`)
//! kind 'M': message       payload = message           (of the last queue; oldest first, the quota
//!                                                      marker 'Q' only as the queue's last message)
//! kind 'N': notification  payload = notification      (of the last queue's notifier; oldest first,
//!                                                      after that queue's messages)
//! kind 'E': trailer       payload = queues u64 | messages u64 | notifications u64 | services u64
//! ```
//!
//! Version 1 (before services) had no 'S' records and a trailer of the first three counts; it is
//! still read.
//!
//! Queues are written in the order of their recipient IDs (bytewise), so the same store always gives
//! the same bytes, whatever its kind: the export of an imported store is byte-identical to the
//! stream it was imported from. A payload is at most [`MAX_RECORD_LEN`] bytes. Nothing may follow
//! the trailer. A stream that ends early, a bad CRC, an unknown kind, a record out of place or a
//! payload that does not decode is an error naming the byte offset (from the start of the stream)
//! where it was found.
//!
//! Import checks the counts three ways: the records it read, what the store holds after each queue
//! is restored, and the trailer's counts must all agree; otherwise it removes the queues it
//! restored and fails, so that a failed import leaves the target store empty.

use std::collections::HashSet;
use std::io::{self, Read, Write};

use super::codec::{decode_msg, decode_ntf, decode_rec, encode_msg, encode_ntf, encode_rec};
use super::services::{self, ServiceRec};
use super::{QueueData, ShardStore, StoreError};
use crate::crypto::hash::b64url;
use crate::protocol::encoding::{DResult, Reader};

pub const MAGIC: [u8; 8] = *b"SMPRXFR\0";
pub const FORMAT_VERSION: u16 = 2;
/// The version before services, still read.
const FORMAT_V1: u16 = 1;
const HEADER_LEN: u64 = 10;
/// The longest payload a record may have: a message body is at most 16 KiB and a queue record's
/// link data a few KiB, so a longer length can only be corruption.
pub const MAX_RECORD_LEN: u32 = 1 << 20;

const KIND_QUEUE: u8 = b'Q';
const KIND_MESSAGE: u8 = b'M';
const KIND_NTF: u8 = b'N';
const KIND_END: u8 = b'E';
const KIND_SERVICE: u8 = b'S';

/// Queues, messages (markers included), notifications and services.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub queues: u64,
    pub messages: u64,
    pub ntfs: u64,
    pub services: u64,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} queues, {} messages, {} notifications, {} services",
            self.queues, self.messages, self.ntfs, self.services
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("cannot {op} the stream: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("the stream is truncated: it ends at byte offset {offset}, {inside}")]
    Truncated { offset: u64, inside: String },
    #[error("the stream is corrupt at byte offset {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    #[error("the store failed on the queue {rid}: {error}")]
    Store { rid: String, error: StoreError },
    #[error("count check failed: the stream's trailer records {trailer}; read {read}; the store holds {written}")]
    Counts {
        trailer: Counts,
        read: Counts,
        written: Counts,
    },
    #[error("the stream's services could not be registered: {0}")]
    Services(String),
    #[error("the store exported {exported}, but holds {held}")]
    ExportCounts { exported: Counts, held: Counts },
    /// A source other than a stream refused a queue (`QueueSource::refuse`).
    #[error("{0}")]
    Source(String),
}

fn corrupt(offset: u64, reason: impl Into<String>) -> TransferError {
    TransferError::Corrupt {
        offset,
        reason: reason.into(),
    }
}

// ---- writing ----

/// Writes the stream: the header at once, then queue by queue, then the trailer.
pub struct StreamWriter<W: Write> {
    out: W,
    counts: Counts,
    offset: u64,
    buf: Vec<u8>,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(mut out: W) -> Result<Self, TransferError> {
        let mut header = MAGIC.to_vec();
        header.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        write_all(&mut out, &header)?;
        Ok(StreamWriter {
            out,
            counts: Counts::default(),
            offset: HEADER_LEN,
            buf: Vec::new(),
        })
    }

    fn record(&mut self, kind: u8, encode: impl FnOnce(&mut Vec<u8>)) -> Result<(), TransferError> {
        self.buf.clear();
        self.buf.push(kind);
        self.buf.extend_from_slice(&[0; 4]);
        encode(&mut self.buf);
        let len = self.buf.len() - 5;
        if len > MAX_RECORD_LEN as usize {
            return Err(corrupt(
                self.offset,
                format!("a record of {len} bytes, more than {MAX_RECORD_LEN}"),
            ));
        }
        self.buf[1..5].copy_from_slice(&(len as u32).to_be_bytes());
        let crc = crc32fast::hash(&self.buf);
        self.buf.extend_from_slice(&crc.to_be_bytes());
        write_all(&mut self.out, &self.buf)?;
        self.offset += self.buf.len() as u64;
        Ok(())
    }

    /// One service (all come before the first queue).
    pub fn service(&mut self, rec: &ServiceRec) -> Result<(), TransferError> {
        self.record(KIND_SERVICE, |b| services::encode_body(b, rec))?;
        self.counts.services += 1;
        Ok(())
    }

    /// One queue: its record, its messages, its notifications.
    pub fn queue(&mut self, q: &QueueData) -> Result<(), TransferError> {
        self.record(KIND_QUEUE, |b| encode_rec(b, &q.rec))?;
        for m in &q.msgs {
            self.record(KIND_MESSAGE, |b| encode_msg(b, m))?;
        }
        for n in &q.ntfs {
            self.record(KIND_NTF, |b| encode_ntf(b, n))?;
        }
        self.counts.queues += 1;
        self.counts.messages += q.msgs.len() as u64;
        self.counts.ntfs += q.ntfs.len() as u64;
        Ok(())
    }

    /// Writes the trailer and flushes; returns what was written and the stream's length.
    pub fn finish(mut self) -> Result<(Counts, u64, W), TransferError> {
        let c = self.counts;
        self.record(KIND_END, |b| {
            for n in [c.queues, c.messages, c.ntfs, c.services] {
                b.extend_from_slice(&n.to_be_bytes());
            }
        })?;
        self.out.flush().map_err(|source| TransferError::Io {
            op: "write",
            source,
        })?;
        Ok((c, self.offset, self.out))
    }
}

fn write_all(out: &mut impl Write, b: &[u8]) -> Result<(), TransferError> {
    out.write_all(b).map_err(|source| TransferError::Io {
        op: "write",
        source,
    })
}

/// Queues an export reads the records of at once (`QueueStore::prepare`).
const EXPORT_CHUNK: usize = 1_000;

/// Writes the relay's `services` (in the order of their IDs), then every queue of `store` in the
/// order of their recipient IDs, to `out`; `progress` is told the counts after each queue. Checks
/// that what was written is what the store holds. Changes nothing in the store.
pub async fn export<S: ShardStore, W: Write>(
    store: &S,
    services: &[ServiceRec],
    out: W,
    progress: &mut dyn FnMut(Counts),
) -> Result<(Counts, u64, W), TransferError> {
    let mut rids = Vec::with_capacity(store.queue_count());
    store.for_each_queue(&mut |r| rids.push(r.recipient_id.clone()));
    rids.sort_unstable();
    let mut w = StreamWriter::new(out)?;
    let mut services: Vec<&ServiceRec> = services.iter().collect();
    services.sort_unstable_by(|a, b| a.service_id.cmp(&b.service_id));
    for rec in services {
        w.service(rec)?;
    }
    // A store that holds only the records in use reads them a chunk at a time.
    for chunk in rids.chunks(EXPORT_CHUNK) {
        let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
        let prepared = store.prepare(&refs, &|_| false).await;
        let written = async {
            prepared.map_err(|error| TransferError::Store {
                rid: b64url(&chunk[0]),
                error,
            })?;
            for rid in chunk {
                let store_err = |error| TransferError::Store {
                    rid: b64url(rid),
                    error,
                };
                let rec = store
                    .get(rid)
                    .ok_or_else(|| store_err(StoreError::NotFound))?;
                let msgs = store.messages(rid).await.map_err(store_err)?;
                let ntfs = match &rec.notifier {
                    Some(n) => store.ntfs(&n.notifier_id).await.map_err(store_err)?,
                    None => Vec::new(),
                };
                w.queue(&QueueData { rec, msgs, ntfs })?;
                progress(w.counts);
            }
            Ok::<(), TransferError>(())
        }
        .await;
        store.release(&refs);
        written?;
    }
    let exported = w.counts;
    let held = Counts {
        queues: store.queue_count() as u64,
        messages: store.total_messages() as u64,
        ntfs: exported.ntfs,
        services: exported.services,
    };
    if exported != held {
        return Err(TransferError::ExportCounts { exported, held });
    }
    w.finish()
}

// ---- reading ----

/// One record as read: where it starts, its kind and payload.
struct Record {
    offset: u64,
    kind: u8,
    payload: Vec<u8>,
}

/// Reads the stream queue by queue.
pub struct StreamReader<R: Read> {
    input: R,
    offset: u64,
    /// The record read ahead (the one after a queue's last message or notification).
    peeked: Option<Record>,
    read: Counts,
    trailer: Option<Counts>,
    version: u16,
    /// The service records, all read before the first queue.
    services: Vec<ServiceRec>,
}

impl<R: Read> StreamReader<R> {
    /// Reads and checks the header.
    pub fn new(input: R) -> Result<Self, TransferError> {
        let mut r = StreamReader {
            input,
            offset: 0,
            peeked: None,
            read: Counts::default(),
            trailer: None,
            version: FORMAT_VERSION,
            services: Vec::new(),
        };
        let mut header = [0u8; HEADER_LEN as usize];
        r.read_exact(&mut header, || "inside the header".into())?;
        if header[..8] != MAGIC {
            return Err(corrupt(
                0,
                "not a smp-relay store export (bad magic; `smp-relay store export` writes one)",
            ));
        }
        let version = u16::from_be_bytes([header[8], header[9]]);
        if version != FORMAT_VERSION && version != FORMAT_V1 {
            return Err(corrupt(
                8,
                format!(
                    "format version {version}; this build reads versions {FORMAT_V1} and \
                     {FORMAT_VERSION}"
                ),
            ));
        }
        r.version = version;
        Ok(r)
    }

    /// What was read so far.
    pub fn read_counts(&self) -> Counts {
        self.read
    }

    /// The service records read (all come before the first queue).
    pub fn services(&self) -> &[ServiceRec] {
        &self.services
    }

    /// The trailer's counts, once [`StreamReader::next_queue`] returned `None`.
    pub fn trailer(&self) -> Option<Counts> {
        self.trailer
    }

    /// Reads up to `buf.len()` bytes, fewer only at the end of the stream; returns how many.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, TransferError> {
        let mut n = 0;
        while n < buf.len() {
            match self.input.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(TransferError::Io { op: "read", source }),
            }
        }
        self.offset += n as u64;
        Ok(n)
    }

    fn read_exact(
        &mut self,
        buf: &mut [u8],
        inside: impl FnOnce() -> String,
    ) -> Result<(), TransferError> {
        if self.fill(buf)? < buf.len() {
            return Err(TransferError::Truncated {
                offset: self.offset,
                inside: inside(),
            });
        }
        Ok(())
    }

    fn next_record(&mut self) -> Result<Record, TransferError> {
        if let Some(r) = self.peeked.take() {
            return Ok(r);
        }
        let offset = self.offset;
        let mut head = [0u8; 5];
        let n = self.fill(&mut head)?;
        if n == 0 {
            return Err(TransferError::Truncated {
                offset,
                inside: "before the trailer (the export did not finish, or the copy was cut)"
                    .into(),
            });
        }
        let inside = || format!("inside the record that starts at byte offset {offset}");
        if n < head.len() {
            return Err(TransferError::Truncated {
                offset: self.offset,
                inside: inside(),
            });
        }
        let kind = head[0];
        let kinds: &[u8] = match self.version {
            FORMAT_V1 => &[KIND_QUEUE, KIND_MESSAGE, KIND_NTF, KIND_END],
            _ => &[KIND_SERVICE, KIND_QUEUE, KIND_MESSAGE, KIND_NTF, KIND_END],
        };
        if !kinds.contains(&kind) {
            return Err(corrupt(offset, format!("unknown record kind 0x{kind:02x}")));
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        if len > MAX_RECORD_LEN {
            return Err(corrupt(
                offset,
                format!("a record of {len} bytes, more than {MAX_RECORD_LEN}"),
            ));
        }
        let mut payload = vec![0u8; len as usize];
        self.read_exact(&mut payload, inside)?;
        let mut crc = [0u8; 4];
        self.read_exact(&mut crc, inside)?;
        let mut h = crc32fast::Hasher::new();
        h.update(&head);
        h.update(&payload);
        if h.finalize() != u32::from_be_bytes(crc) {
            return Err(corrupt(
                offset,
                "CRC mismatch in the record that starts here",
            ));
        }
        Ok(Record {
            offset,
            kind,
            payload,
        })
    }

    /// The next queue with its messages and notifications, or `None` after the trailer (then the
    /// stream has been read to its end).
    pub fn next_queue(&mut self) -> Result<Option<(QueueData, u64)>, TransferError> {
        if self.trailer.is_some() {
            return Ok(None);
        }
        let mut r = self.next_record()?;
        while r.kind == KIND_SERVICE {
            if self.read.queues > 0 {
                return Err(corrupt(r.offset, "a service record after the first queue"));
            }
            let rec = decode(&r, "service record", services::decode_body)?;
            self.services.push(rec);
            self.read.services += 1;
            r = self.next_record()?;
        }
        match r.kind {
            KIND_QUEUE => {}
            KIND_END => return self.end(r).map(|()| None),
            _ => {
                return Err(corrupt(
                    r.offset,
                    "a message or notification record before any queue record",
                ))
            }
        }
        let rec = decode(&r, "queue record", decode_rec)?;
        self.read.queues += 1;
        let mut q = QueueData {
            rec,
            msgs: Vec::new(),
            ntfs: Vec::new(),
        };
        loop {
            let next = self.next_record()?;
            match next.kind {
                KIND_MESSAGE => {
                    if !q.ntfs.is_empty() {
                        return Err(corrupt(
                            next.offset,
                            "a message record after the queue's notification records",
                        ));
                    }
                    let m = decode(&next, "message record", decode_msg)?;
                    q.msgs.push(m);
                    self.read.messages += 1;
                }
                KIND_SERVICE => {
                    return Err(corrupt(
                        next.offset,
                        "a service record after the first queue",
                    ));
                }
                KIND_NTF => {
                    if q.rec.notifier.is_none() {
                        return Err(corrupt(
                            next.offset,
                            "a notification record for a queue without a notifier",
                        ));
                    }
                    q.ntfs
                        .push(decode(&next, "notification record", decode_ntf)?);
                    self.read.ntfs += 1;
                }
                _ => {
                    self.peeked = Some(next);
                    return Ok(Some((q, r.offset)));
                }
            }
        }
    }

    fn end(&mut self, r: Record) -> Result<(), TransferError> {
        let v1 = self.version == FORMAT_V1;
        let counts = decode(&r, "trailer", |rd| {
            Ok(Counts {
                queues: u64::from_be_bytes(rd.array()?),
                messages: u64::from_be_bytes(rd.array()?),
                ntfs: u64::from_be_bytes(rd.array()?),
                services: if v1 {
                    0
                } else {
                    u64::from_be_bytes(rd.array()?)
                },
            })
        })?;
        let after = self.offset;
        let mut byte = [0u8; 1];
        if self.fill(&mut byte)? != 0 {
            return Err(corrupt(after, "bytes after the trailer"));
        }
        self.trailer = Some(counts);
        Ok(())
    }
}

/// Decodes a whole payload with `f`.
fn decode<T>(
    r: &Record,
    what: &str,
    f: impl FnOnce(&mut Reader<'_>) -> DResult<T>,
) -> Result<T, TransferError> {
    let mut rd = Reader::new(&r.payload);
    f(&mut rd)
        .and_then(|v| rd.end().map(|()| v))
        .map_err(|_| corrupt(r.offset, format!("bad {what}")))
}

/// Where an import takes its queues from: a `store export` stream ([`StreamReader`]), or the
/// reference server's files (`store/reference/`).
pub trait QueueSource {
    /// The services, all known before the first queue is read.
    fn services(&self) -> &[ServiceRec];
    /// The next queue and its position in the source (for errors), or `None` at the end.
    fn next_queue(&mut self) -> Result<Option<(QueueData, u64)>, TransferError>;
    /// What was read so far.
    fn read_counts(&self) -> Counts;
    /// The counts the source records of itself (a stream's trailer), once it was read to its end;
    /// `None` for a source that records none.
    fn recorded_counts(&self) -> Option<Counts>;
    /// The error for a queue at `position` that cannot be imported.
    fn refuse(&self, position: u64, reason: String) -> TransferError {
        corrupt(position, reason)
    }
}

impl<R: Read> QueueSource for StreamReader<R> {
    fn services(&self) -> &[ServiceRec] {
        StreamReader::services(self)
    }

    fn next_queue(&mut self) -> Result<Option<(QueueData, u64)>, TransferError> {
        StreamReader::next_queue(self)
    }

    fn read_counts(&self) -> Counts {
        StreamReader::read_counts(self)
    }

    fn recorded_counts(&self) -> Option<Counts> {
        // A stream always ends with its trailer.
        Some(self.trailer().unwrap_or_default())
    }
}

/// What an import read, what the store holds after it, and what the trailer recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportReport {
    pub read: Counts,
    pub written: Counts,
    pub trailer: Counts,
}

/// Where an import puts the stream's services: the relay's registry (`store::services`), which is
/// not the shards' store.
pub trait ServiceSink {
    /// Registers them, each with its ID. Called once, before the first queue is restored: a
    /// queue's association names its service (on PostgreSQL a foreign key).
    fn register(&mut self, services: &[ServiceRec]) -> Result<(), String>;
    /// Forgets them again: the import failed after `register`.
    fn undo(&mut self);
}

/// Restores the stream's services into `services` and every queue into `store`, both of which
/// must be empty (the caller checks). On any error, and when the counts do not agree, the queues
/// restored so far are deleted again and the services forgotten, so that both are left empty; the
/// caller then closes the store.
pub async fn import<S: ShardStore, R: Read>(
    store: &S,
    input: R,
    services: &mut dyn ServiceSink,
    progress: &mut dyn FnMut(Counts),
) -> Result<ImportReport, TransferError> {
    let mut reader = StreamReader::new(input)?;
    import_from(store, &mut reader, services, progress).await
}

/// As [`import`], from any [`QueueSource`]. A source that records no counts of its own is checked
/// against what was read: the store must hold exactly that.
pub async fn import_from<S: ShardStore, Src: QueueSource>(
    store: &S,
    source: &mut Src,
    services: &mut dyn ServiceSink,
    progress: &mut dyn FnMut(Counts),
) -> Result<ImportReport, TransferError> {
    let mut restored = Vec::new();
    let mut registered = false;
    let result = import_into(
        store,
        source,
        (&mut restored, &mut registered),
        services,
        progress,
    )
    .await;
    if result.is_err() {
        for rid in restored.iter().rev() {
            // The queue was restored a moment ago; if it cannot be deleted the error below still
            // stops the import, and the store is not saved as imported.
            let _ = store.delete(rid).await;
        }
        if registered {
            services.undo();
        }
    }
    result
}

async fn import_into<S: ShardStore, Src: QueueSource>(
    store: &S,
    reader: &mut Src,
    (restored, registered): (&mut Vec<Vec<u8>>, &mut bool),
    services: &mut dyn ServiceSink,
    progress: &mut dyn FnMut(Counts),
) -> Result<ImportReport, TransferError> {
    let mut register = |reader: &Src, registered: &mut bool| {
        if *registered {
            return Ok(());
        }
        *registered = true;
        services
            .register(reader.services())
            .map_err(TransferError::Services)
    };
    // The IDs the relay's directory keeps unique (`server/directory.rs`): a stream that repeats one
    // would give two queues one sender, link or notifier.
    let (mut senders, mut links, mut notifiers) = (HashSet::new(), HashSet::new(), HashSet::new());
    while let Some((q, offset)) = reader.next_queue()? {
        let rid = q.rec.recipient_id.clone();
        let dup = |what: &str, id: &[u8]| {
            reader.refuse(
                offset,
                format!(
                    "the queue {} repeats the {what} ID {} of an earlier queue",
                    b64url(&rid),
                    b64url(id)
                ),
            )
        };
        if !senders.insert(q.rec.sender_id.clone()) {
            return Err(dup("sender", &q.rec.sender_id));
        }
        if let Some(l) = &q.rec.link {
            if !links.insert(l.link_id.clone()) {
                return Err(dup("link", &l.link_id));
            }
        }
        if let Some(n) = &q.rec.notifier {
            if !notifiers.insert(n.notifier_id.clone()) {
                return Err(dup("notifier", &n.notifier_id));
            }
        }
        let store_err = |error| TransferError::Store {
            rid: b64url(&rid),
            error,
        };
        register(reader, registered)?;
        store.restore(q).await.map_err(store_err)?;
        restored.push(rid);
        progress(reader.read_counts());
    }
    let read = reader.read_counts();
    let trailer = reader.recorded_counts().unwrap_or(read);
    // What the store holds now, as it reports it (it was empty before).
    let mut written = store_counts(store)
        .await
        .map_err(|error| TransferError::Store {
            rid: "(counting)".into(),
            error,
        })?;
    register(reader, registered)?;
    // The services went to the registry, which checked them as it took them.
    written.services = read.services;
    if read != trailer || written != trailer {
        return Err(TransferError::Counts {
            trailer,
            read,
            written,
        });
    }
    Ok(ImportReport {
        read,
        written,
        trailer,
    })
}

/// Counts of a store as its traits report them: queues, messages (markers included) and the
/// pending notifications of its queues' notifiers.
pub async fn store_counts<S: ShardStore>(store: &S) -> Result<Counts, StoreError> {
    let mut nids = Vec::new();
    store.for_each_queue(&mut |r| {
        if let Some(n) = &r.notifier {
            nids.push(n.notifier_id.clone());
        }
    });
    let mut ntfs = 0;
    for nid in nids {
        ntfs += store.ntfs(&nid).await?.len() as u64;
    }
    Ok(Counts {
        queues: store.queue_count() as u64,
        messages: store.total_messages() as u64,
        ntfs,
        services: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::PublicAuthKey;
    use crate::protocol::error::{BlockingInfo, BlockingReason};
    use crate::store::memory::tests::{msg, ntf, rec};
    use crate::store::memory::MemoryStore;
    use crate::store::{
        Message, MessageStore, NotifierCreds, QueueStatus, QueueStore, WriteOutcome,
    };
    use futures_lite::future::block_on;

    const QUOTA: usize = 3;

    /// A full queue (3 messages and the marker) with a notifier and 2 notifications, a blocked
    /// queue with one message, an empty queue.
    fn sample() -> MemoryStore {
        let s = MemoryStore::new();
        let mut full = rec(b"full");
        full.notifier = Some(Box::new(NotifierCreds {
            notifier_id: b"full-ntf".to_vec(),
            notifier_key: PublicAuthKey::X25519([3; 32]),
            rcv_ntf_dh_secret: [4; 32],
            ntf_service_id: None,
        }));
        block_on(s.create(full)).unwrap();
        for n in 1..=4 {
            block_on(s.write(b"full", msg(n, 1000 + i64::from(n)), QUOTA)).unwrap();
        }
        block_on(s.add_ntf(b"full-ntf", ntf(1, 1001))).unwrap();
        block_on(s.add_ntf(b"full-ntf", ntf(2, 1002))).unwrap();
        let mut blocked = rec(b"blocked");
        blocked.status = QueueStatus::Blocked(BlockingInfo {
            reason: BlockingReason::Spam,
            notice: Some("{\"ttl\":3600}".into()),
        });
        block_on(s.create(blocked)).unwrap();
        block_on(s.write(b"blocked", msg(9, 900), QUOTA)).unwrap();
        block_on(s.create(rec(b"empty"))).unwrap();
        s
    }

    /// Two services, given out of the order of their IDs.
    fn services() -> Vec<ServiceRec> {
        use crate::protocol::command::ServiceRole;
        [
            (b'z', ServiceRole::Notifier),
            (b'a', ServiceRole::Messaging),
        ]
        .into_iter()
        .map(|(b, role)| ServiceRec {
            service_id: vec![b; 24],
            role,
            cert_chain: vec![1, 0, 3, b, b, b],
            cert_hash: [b; 32],
            created_at: 1_700_000_000,
        })
        .collect()
    }

    fn export_bytes(s: &MemoryStore) -> Vec<u8> {
        let (counts, len, out) = block_on(export(s, &services(), Vec::new(), &mut |_| {})).unwrap();
        assert_eq!(
            counts,
            Counts {
                queues: s.queue_count() as u64,
                messages: s.total_messages() as u64,
                ntfs: counts.ntfs,
                services: 2,
            }
        );
        assert_eq!(len, out.len() as u64);
        out
    }

    /// A registry in a list, which may refuse.
    struct Registry {
        got: Vec<ServiceRec>,
        refuse: bool,
    }

    impl ServiceSink for Registry {
        fn register(&mut self, services: &[ServiceRec]) -> Result<(), String> {
            if self.refuse {
                return Err("refused".to_string());
            }
            self.got.extend_from_slice(services);
            Ok(())
        }

        fn undo(&mut self) {
            self.got.clear();
        }
    }

    /// Imports into a new store; the services registered go to the returned list.
    fn import_services(
        bytes: &[u8],
        refuse: bool,
    ) -> (
        MemoryStore,
        Vec<ServiceRec>,
        Result<ImportReport, TransferError>,
    ) {
        let s = MemoryStore::new();
        let mut registry = Registry {
            got: Vec::new(),
            refuse,
        };
        let r = block_on(import(&s, bytes, &mut registry, &mut |_| {}));
        (s, registry.got, r)
    }

    fn import_bytes(bytes: &[u8]) -> (MemoryStore, Result<ImportReport, TransferError>) {
        let (s, _, r) = import_services(bytes, false);
        (s, r)
    }

    fn contents(s: &MemoryStore, rid: &[u8]) -> QueueData {
        let rec = s.get(rid).unwrap();
        let ntfs = match &rec.notifier {
            Some(n) => block_on(s.ntfs(&n.notifier_id)).unwrap(),
            None => Vec::new(),
        };
        QueueData {
            msgs: block_on(s.messages(rid)).unwrap(),
            rec,
            ntfs,
        }
    }

    #[test]
    fn a_store_round_trips_exactly_and_exports_the_same_bytes_again() {
        let s = sample();
        let bytes = export_bytes(&s);
        let (t, registered, report) = import_services(&bytes, false);
        let report = report.unwrap();
        let expected = Counts {
            queues: 3,
            messages: 5,
            ntfs: 2,
            services: 2,
        };
        // In the order of their IDs, each as it was.
        let mut want = services();
        want.reverse();
        assert_eq!(registered, want);
        assert_eq!(report.read, expected);
        assert_eq!(report.written, expected);
        assert_eq!(report.trailer, expected);
        for rid in [&b"full"[..], b"blocked", b"empty"] {
            assert_eq!(contents(&t, rid), contents(&s, rid), "{rid:?}");
        }
        assert_eq!(
            contents(&t, b"full").msgs.last(),
            Some(&Message::Quota {
                msg_id: [4; 24],
                ts: 1004
            })
        );
        // The marker still closes the queue; notifications were not taken by the export.
        assert_eq!(
            block_on(t.write(b"full", msg(5, 2000), QUOTA)).unwrap(),
            WriteOutcome::Full
        );
        assert_eq!(block_on(s.ntfs(b"full-ntf")).unwrap().len(), 2);
        assert_eq!(export_bytes(&t), bytes, "deterministic");
    }

    #[test]
    fn every_truncation_is_an_error_and_leaves_the_store_empty() {
        let bytes = export_bytes(&sample());
        for n in 0..bytes.len() {
            let (t, r) = import_bytes(&bytes[..n]);
            match r {
                Err(TransferError::Truncated { offset, .. }) => {
                    assert_eq!(offset, n as u64, "prefix {n}")
                }
                other => panic!("prefix {n}: {other:?}"),
            }
            assert_eq!(t.queue_count(), 0, "prefix {n}");
            assert_eq!(t.total_messages(), 0);
            assert!(t.ntf_ids().is_empty());
        }
    }

    #[test]
    fn every_flipped_byte_is_an_error_and_leaves_the_store_empty() {
        let bytes = export_bytes(&sample());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x04;
            let (t, r) = import_bytes(&b);
            let e = r.expect_err("a flipped byte is found");
            match &e {
                TransferError::Corrupt { offset, .. } | TransferError::Truncated { offset, .. } => {
                    assert!(*offset <= bytes.len() as u64, "byte {i}: {e}")
                }
                other => panic!("byte {i}: {other}"),
            }
            assert_eq!(t.queue_count(), 0, "byte {i}: {e}");
            assert!(t.ntf_ids().is_empty());
        }
    }

    #[test]
    fn bytes_after_the_trailer_and_wrong_counts_are_refused() {
        let s = sample();
        let mut bytes = export_bytes(&s);
        let len = bytes.len() as u64;
        bytes.push(0);
        let (t, r) = import_bytes(&bytes);
        assert!(
            matches!(r, Err(TransferError::Corrupt { offset, .. }) if offset == len),
            "{r:?}"
        );
        assert_eq!(t.queue_count(), 0);

        // A writer whose trailer claims one queue more than it wrote.
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        w.queue(&contents(&s, b"full")).unwrap();
        w.counts.queues += 1;
        let (_, _, out) = w.finish().unwrap();
        let (t, r) = import_bytes(&out);
        let e = r.unwrap_err();
        assert!(matches!(e, TransferError::Counts { .. }), "{e:?}");
        assert!(e.to_string().contains("trailer records 2 queues"), "{e}");
        assert_eq!(t.queue_count(), 0, "rolled back");
        assert!(t.ntf_ids().is_empty());
    }

    #[test]
    fn a_repeated_sender_id_is_refused_and_rolled_back() {
        let s = sample();
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        let first = contents(&s, b"empty");
        let mut second = contents(&s, b"full");
        second.rec.sender_id = first.rec.sender_id.clone();
        w.queue(&first).unwrap();
        let second_at = w.offset;
        w.queue(&second).unwrap();
        let (_, _, out) = w.finish().unwrap();
        let (t, r) = import_bytes(&out);
        match r {
            Err(TransferError::Corrupt { offset, reason }) => {
                assert_eq!(offset, second_at);
                assert!(reason.contains("sender ID"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.queue_count(), 0);
    }

    #[test]
    fn records_out_of_place_are_refused() {
        let s = sample();
        // A message record before any queue record.
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        w.record(KIND_MESSAGE, |b| encode_msg(b, &msg(1, 1)))
            .unwrap();
        let (_, _, out) = w.finish().unwrap();
        let (_, r) = import_bytes(&out);
        assert!(
            matches!(r, Err(TransferError::Corrupt { offset: 10, .. })),
            "{r:?}"
        );
        // Notifications for a queue without a notifier.
        let mut q = contents(&s, b"blocked");
        q.ntfs.push(ntf(1, 1));
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        w.queue(&q).unwrap();
        let (_, _, out) = w.finish().unwrap();
        let (t, r) = import_bytes(&out);
        let e = r.unwrap_err();
        assert!(e.to_string().contains("without a notifier"), "{e}");
        assert_eq!(t.queue_count(), 0);
        // A message after the marker.
        let mut q = contents(&s, b"full");
        q.msgs.push(msg(7, 2000));
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        w.queue(&q).unwrap();
        let (_, _, out) = w.finish().unwrap();
        let (t, r) = import_bytes(&out);
        let e = r.unwrap_err();
        assert!(e.to_string().contains("after the quota marker"), "{e}");
        assert_eq!(t.queue_count(), 0);
    }

    /// Services come before the first queue; a registry that refuses them undoes the import.
    #[test]
    fn service_records_in_place_and_a_refusing_registry() {
        let s = sample();
        let mut w = StreamWriter::new(Vec::new()).unwrap();
        w.queue(&contents(&s, b"empty")).unwrap();
        let at = w.offset;
        w.service(&services()[0]).unwrap();
        let (_, _, out) = w.finish().unwrap();
        let (t, r) = import_bytes(&out);
        match r {
            Err(TransferError::Corrupt { offset, reason }) => {
                assert_eq!(offset, at);
                assert!(reason.contains("service record after the first queue"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.queue_count(), 0);

        let (t, got, r) = import_services(&export_bytes(&s), true);
        assert!(matches!(r, Err(TransferError::Services(_))), "{r:?}");
        assert!(got.is_empty());
        assert_eq!(t.queue_count(), 0, "rolled back");
    }

    /// A stream of version 1 (before services: no service records, a trailer of three counts)
    /// is still read.
    #[test]
    fn a_version_1_stream_is_still_read() {
        let s = sample();
        let mut v1 = MAGIC.to_vec();
        v1.extend_from_slice(&1u16.to_be_bytes());
        let mut w = StreamWriter {
            out: v1,
            counts: Counts::default(),
            offset: HEADER_LEN,
            buf: Vec::new(),
        };
        for rid in [&b"blocked"[..], b"empty", b"full"] {
            w.queue(&contents(&s, rid)).unwrap();
        }
        let c = w.counts;
        w.record(KIND_END, |b| {
            for n in [c.queues, c.messages, c.ntfs] {
                b.extend_from_slice(&n.to_be_bytes());
            }
        })
        .unwrap();
        let (t, got, r) = import_services(&w.out, false);
        let report = r.unwrap();
        assert_eq!(report.trailer.queues, 3);
        assert_eq!(report.trailer.services, 0);
        assert!(got.is_empty());
        assert_eq!(contents(&t, b"full"), contents(&s, b"full"));
    }

    #[test]
    fn another_version_or_magic_is_refused_at_the_header() {
        let mut bytes = export_bytes(&sample());
        bytes[9] = 3;
        let (_, r) = import_bytes(&bytes);
        let e = r.unwrap_err();
        assert!(
            e.to_string().contains("byte offset 8: format version 3"),
            "{e}"
        );
        bytes[0] = b'X';
        let (_, r) = import_bytes(&bytes);
        assert!(r.unwrap_err().to_string().contains("bad magic"));
    }
}
