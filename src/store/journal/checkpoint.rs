//! The journal store's checkpoints (`docs/ARCHITECTURE.md` §5, `journal/FORMAT.md`
//! "Checkpoints"): at a clean stop each group's part of the index is written as the blob of the
//! group's checkpoint, so that the next start loads it and replays only what was appended after
//! (nothing, after a clean stop; the records since, after a crash that followed one). A
//! checkpoint whose segments were compacted or cut since is not used: the whole group is
//! replayed, as without one.
//!
//! The blob (big-endian, `protocol/encoding.rs` primitives): a version byte, then the queues
//! (recipient ID, queue record in the `store/codec.rs` encoding, the record's location and bytes,
//! whether the queue can take messages, and its messages: ID, time, flags, record bytes and
//! location), then the notification lists (notifier ID, each notification in the codec encoding
//! with its record's location and bytes).

use std::collections::VecDeque;

use smp_journal::{Fs, Location};

use super::{
    decode_notification, decode_queue_record, encode_notification, encode_queue_record, Data,
    EntityId, Map, MsgEntry, NtfEntry, QueueEntry,
};
use crate::protocol::encoding::{put_bool, put_int64, put_word32, DResult, Reader};

const BLOB_VERSION: u8 = 1;

fn put_id(out: &mut Vec<u8>, id: &[u8]) {
    out.push(id.len() as u8);
    out.extend_from_slice(id);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_word32(out, b.len() as u32);
    out.extend_from_slice(b);
}

fn put_loc(out: &mut Vec<u8>, loc: Location, len: u32) {
    put_int64(out, loc.segment as i64);
    put_int64(out, loc.offset as i64);
    put_word32(out, len);
}

fn id<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.byte()? as usize;
    r.take(n)
}

fn bytes<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.word32()? as usize;
    r.take(n)
}

fn loc(r: &mut Reader<'_>) -> DResult<(Location, u32)> {
    let segment = r.int64()? as u64;
    let offset = r.int64()? as u64;
    Ok((Location { segment, offset }, r.word32()?))
}

impl<F: Fs> Data<F> {
    /// The blob of every group of this store: its queues, messages and notifications.
    pub(super) fn checkpoint_blobs(&self) -> Map<u32, Vec<u8>> {
        let mut queues: Map<u32, (u32, Vec<u8>)> = Map::default();
        for (rid, q) in &self.queues {
            let (n, out) = queues.entry(u32::from(q.group)).or_default();
            *n += 1;
            put_id(out, rid);
            put_bytes(out, &encode_queue_record(&q.rec));
            put_loc(out, q.rec_loc, q.rec_len);
            put_bool(out, q.can_write);
            put_word32(out, q.msgs.len() as u32);
            for m in &q.msgs {
                out.extend_from_slice(&m.msg_id);
                put_int64(out, m.ts);
                out.push(m.flags);
                put_loc(out, m.loc, m.len);
            }
        }
        let mut ntfs: Map<u32, (u32, Vec<u8>)> = Map::default();
        for (nid, list) in &self.ntfs {
            let Some(&g) = self.notifiers.get(nid) else {
                continue;
            };
            let (n, out) = ntfs.entry(g).or_default();
            *n += 1;
            put_id(out, nid);
            put_word32(out, list.len() as u32);
            for e in list {
                put_bytes(out, &encode_notification(&e.ntf));
                put_loc(out, e.loc, e.len);
            }
        }
        self.journals
            .keys()
            .map(|&g| {
                let mut blob = vec![BLOB_VERSION];
                let (nq, q) = queues.remove(&g).unwrap_or_default();
                put_word32(&mut blob, nq);
                blob.extend_from_slice(&q);
                let (nn, n) = ntfs.remove(&g).unwrap_or_default();
                put_word32(&mut blob, nn);
                blob.extend_from_slice(&n);
                (g, blob)
            })
            .collect()
    }

    /// Loads the blob of group `g` (before its records after the checkpoint are replayed).
    pub(super) fn load_checkpoint(&mut self, g: u32, blob: &[u8]) -> Result<(), String> {
        let bad = |what: &str| format!("checkpoint of group {g}: bad {what}");
        let mut r = Reader::new(blob);
        if r.byte().map_err(|_| bad("version"))? != BLOB_VERSION {
            return Err(bad("version"));
        }
        let nq = r.word32().map_err(|_| bad("queue count"))?;
        for _ in 0..nq {
            self.load_queue(g, &mut r).map_err(|_| bad("queue"))??;
        }
        let nn = r.word32().map_err(|_| bad("notifier count"))?;
        for _ in 0..nn {
            self.load_ntfs(g, &mut r)
                .map_err(|_| bad("notifications"))??;
        }
        if !r.is_empty() {
            return Err(bad("end (trailing bytes)"));
        }
        self.checkpoints_loaded += 1;
        Ok(())
    }

    fn load_queue(&mut self, g: u32, r: &mut Reader<'_>) -> DResult<Result<(), String>> {
        let rid: EntityId = id(r)?.to_vec();
        let rec = match decode_queue_record(bytes(r)?) {
            Ok(rec) => rec,
            Err(e) => return Ok(Err(e)),
        };
        let (rec_loc, rec_len) = loc(r)?;
        let can_write = r.bool()?;
        let n = r.word32()? as usize;
        let mut msgs = VecDeque::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let msg_id = r.array::<24>()?;
            let ts = r.int64()?;
            let flags = r.byte()?;
            let (loc, len) = loc(r)?;
            msgs.push_back(MsgEntry {
                msg_id,
                ts,
                flags,
                len,
                loc,
            });
        }
        if let Some(n) = &rec.notifier {
            self.notifiers.insert(n.notifier_id.clone(), g);
        }
        let live = self.live(g);
        live.add(rec_loc.segment, rec_len);
        for m in &msgs {
            live.add(m.loc.segment, m.len);
        }
        self.total_messages += msgs.len();
        self.queues.insert(
            rid,
            QueueEntry {
                rec,
                group: g as u8,
                rec_loc,
                rec_len,
                msgs,
                can_write,
            },
        );
        Ok(Ok(()))
    }

    fn load_ntfs(&mut self, g: u32, r: &mut Reader<'_>) -> DResult<Result<(), String>> {
        let nid: EntityId = id(r)?.to_vec();
        let n = r.word32()? as usize;
        let mut list = VecDeque::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let ntf = match decode_notification(bytes(r)?) {
                Ok(x) => x,
                Err(e) => return Ok(Err(e)),
            };
            let (loc, len) = loc(r)?;
            list.push_back(NtfEntry { ntf, loc, len });
        }
        let live = self.live(g);
        for e in &list {
            live.add(e.loc.segment, e.len);
        }
        self.ntfs.insert(nid, list);
        Ok(Ok(()))
    }
}
