//! The binary encodings of a queue record, a message and a stored notification, shared by the
//! memory store's group files (`store/memory/persist.rs`) and the store export stream
//! (`store/transfer.rs`), so that both write a queue the same way (`docs/ARCHITECTURE.md` §5).
//!
//! All integers big-endian:
//!
//! ```text
//! record       = bytes rId | u32 n, n × bytes SPKI | rcvDhSecret (32) | bytes sId | maybe(bytes SPKI)
//!                | maybe('M'|'C') | maybe(bytes linkId, bytes fixed, bytes user)
//!                | maybe(bytes nId, bytes SPKI, rcvNtfDhSecret (32), maybe(bytes svcId))
//!                | 'A' | 'O' | 'B' bytes BlockingInfo | maybe(int64 updatedAt) | maybe(bytes svcId)
//! message      = 'M' msgId (24) int64 ts bool body-bytes | 'Q' msgId (24) int64 ts   (quota marker)
//! notification = msgId (24) int64 ts nonce (24) bytes encMeta
//! bytes = u32 length then the bytes; maybe = '0' | '1' value; bool = 'T' | 'F'
//! ```

use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::QueueMode;
use crate::protocol::encoding::{put_int64, put_maybe, put_word32, DResult, DecodeError, Reader};
use crate::protocol::error::BlockingInfo;
use crate::store::{Message, MsgNtf, NotifierCreds, QueueLink, QueueRec, QueueStatus, RecordIds};

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Every field is far below 4 GiB (bodies are at most 16 KiB, link data a few KiB).
    debug_assert!(u32::try_from(b.len()).is_ok());
    put_word32(out, b.len() as u32);
    out.extend_from_slice(b);
}

pub(crate) fn put_count(out: &mut Vec<u8>, n: usize) {
    debug_assert!(u32::try_from(n).is_ok());
    put_word32(out, n as u32);
}

pub(crate) fn encode_rec(out: &mut Vec<u8>, rec: &QueueRec) {
    put_bytes(out, &rec.recipient_id);
    put_count(out, rec.recipient_keys.len());
    for k in &rec.recipient_keys {
        put_bytes(out, &k.to_spki());
    }
    out.extend_from_slice(&rec.rcv_dh_secret);
    put_bytes(out, &rec.sender_id);
    put_maybe(out, rec.sender_key.as_ref(), |o, k| {
        put_bytes(o, &k.to_spki())
    });
    put_maybe(out, rec.queue_mode, |o, m| {
        o.push(match m {
            QueueMode::Messaging => b'M',
            QueueMode::Contact => b'C',
        })
    });
    put_maybe(out, rec.link.as_ref(), |o, l| {
        put_bytes(o, &l.link_id);
        put_bytes(o, &l.fixed);
        put_bytes(o, &l.user);
    });
    put_maybe(out, rec.notifier.as_ref(), |o, n| {
        put_bytes(o, &n.notifier_id);
        put_bytes(o, &n.notifier_key.to_spki());
        o.extend_from_slice(&n.rcv_ntf_dh_secret);
        put_maybe(o, n.ntf_service_id.as_ref(), |o, s| put_bytes(o, s));
    });
    put_status(out, &rec.status);
    put_maybe(out, rec.updated_at, put_int64);
    put_maybe(out, rec.rcv_service_id.as_ref(), |o, s| put_bytes(o, s));
}

pub(crate) fn encode_msg(out: &mut Vec<u8>, m: &Message) {
    match m {
        Message::Message {
            msg_id,
            ts,
            notification,
            body,
        } => {
            out.push(b'M');
            out.extend_from_slice(msg_id);
            put_int64(out, *ts);
            out.push(if *notification { b'T' } else { b'F' });
            put_bytes(out, body);
        }
        Message::Quota { msg_id, ts } => {
            out.push(b'Q');
            out.extend_from_slice(msg_id);
            put_int64(out, *ts);
        }
    }
}

pub(crate) fn encode_ntf(out: &mut Vec<u8>, n: &MsgNtf) {
    out.extend_from_slice(&n.msg_id);
    put_int64(out, n.ts);
    out.extend_from_slice(&n.nonce);
    put_bytes(out, &n.enc_meta);
}

// ---- the memory store's packed form ----
//
// The memory store keeps every queue's record in memory, packed (`store/memory.rs`): the same
// fields as `record` above, less the recipient ID (the store's key), with raw keys and one-byte
// lengths for IDs (a protocol ID is at most 255 bytes):
//
//   packed = u8 n, n × key | rcvDhSecret (32) | id sId | maybe(key) | '0'|'M'|'C'
//            | maybe(id linkId, bytes fixed, bytes user) | maybe(id nId, key, secret (32), maybe(id))
//            | 'A' | 'O' | 'B' bytes BlockingInfo | maybe(int64) | maybe(id)
//   key = 'e' 32 bytes (Ed25519) | 'x' 32 bytes (X25519) | 'E' 57 bytes (Ed448);  id = u8 length, bytes

fn pack_id(out: &mut Vec<u8>, id: &[u8]) {
    // Entity IDs are protocol short strings: at most 255 bytes.
    debug_assert!(id.len() <= 255);
    out.push(id.len().min(255) as u8);
    out.extend_from_slice(&id[..id.len().min(255)]);
}

fn pack_key(out: &mut Vec<u8>, k: &PublicAuthKey) {
    match k {
        PublicAuthKey::Ed25519(b) => {
            out.push(b'e');
            out.extend_from_slice(b);
        }
        PublicAuthKey::X25519(b) => {
            out.push(b'x');
            out.extend_from_slice(b);
        }
        PublicAuthKey::Ed448(b) => {
            out.push(b'E');
            out.extend_from_slice(b);
        }
    }
}

fn unpack_id<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.byte()? as usize;
    r.take(n)
}

fn unpack_key(r: &mut Reader<'_>) -> DResult<PublicAuthKey> {
    Ok(match r.byte()? {
        b'e' => PublicAuthKey::Ed25519(r.array()?),
        b'x' => PublicAuthKey::X25519(r.array()?),
        b'E' => PublicAuthKey::Ed448(r.array()?),
        _ => return Err(DecodeError),
    })
}

/// `rec` packed, without its recipient ID.
pub(crate) fn pack_rec(rec: &QueueRec) -> Box<[u8]> {
    let mut out = Vec::with_capacity(160);
    out.push(rec.recipient_keys.len().min(255) as u8);
    for k in rec.recipient_keys.iter().take(255) {
        pack_key(&mut out, k);
    }
    out.extend_from_slice(&rec.rcv_dh_secret);
    pack_id(&mut out, &rec.sender_id);
    put_maybe(&mut out, rec.sender_key.as_ref(), pack_key);
    out.push(match rec.queue_mode {
        None => b'0',
        Some(QueueMode::Messaging) => b'M',
        Some(QueueMode::Contact) => b'C',
    });
    put_maybe(&mut out, rec.link.as_ref(), |o, l| {
        pack_id(o, &l.link_id);
        put_bytes(o, &l.fixed);
        put_bytes(o, &l.user);
    });
    put_maybe(&mut out, rec.notifier.as_ref(), |o, n| {
        pack_id(o, &n.notifier_id);
        pack_key(o, &n.notifier_key);
        o.extend_from_slice(&n.rcv_ntf_dh_secret);
        put_maybe(o, n.ntf_service_id.as_ref(), |o, s| pack_id(o, s));
    });
    put_status(&mut out, &rec.status);
    put_maybe(&mut out, rec.updated_at, put_int64);
    put_maybe(&mut out, rec.rcv_service_id.as_ref(), |o, s| pack_id(o, s));
    out.into_boxed_slice()
}

/// The record of `recipient_id` packed in `b` by [`pack_rec`].
pub(crate) fn unpack_rec(recipient_id: &[u8], b: &[u8]) -> DResult<QueueRec> {
    let r = &mut Reader::new(b);
    let nkeys = r.byte()? as usize;
    let recipient_keys = (0..nkeys)
        .map(|_| unpack_key(r))
        .collect::<DResult<Vec<_>>>()?;
    let rcv_dh_secret = r.array()?;
    let sender_id = unpack_id(r)?.to_vec();
    let sender_key = r.maybe(unpack_key)?;
    let queue_mode = match r.byte()? {
        b'0' => None,
        b'M' => Some(QueueMode::Messaging),
        b'C' => Some(QueueMode::Contact),
        _ => return Err(DecodeError),
    };
    // The packed form holds only what this process packed (records the store was given).
    let link = r.maybe(|r| {
        Ok(Box::new(QueueLink {
            link_id: unpack_id(r)?.to_vec(),
            fixed: read_bytes(r)?.to_vec(),
            user: read_bytes(r)?.to_vec(),
        }))
    })?;
    let notifier = r.maybe(|r| {
        Ok(Box::new(NotifierCreds {
            notifier_id: unpack_id(r)?.to_vec(),
            notifier_key: unpack_key(r)?,
            rcv_ntf_dh_secret: r.array()?,
            ntf_service_id: r.maybe(|r| Ok(unpack_id(r)?.to_vec()))?,
        }))
    })?;
    let status = read_status(r)?;
    let updated_at = r.maybe(|r| r.int64())?;
    let rcv_service_id = r.maybe(|r| Ok(unpack_id(r)?.to_vec()))?;
    r.end()?;
    Ok(QueueRec {
        recipient_id: recipient_id.to_vec(),
        recipient_keys,
        rcv_dh_secret,
        sender_id,
        sender_key,
        queue_mode,
        link,
        notifier,
        status,
        updated_at,
        rcv_service_id,
    })
}

/// The notifier ID of a packed record, read without unpacking the rest.
pub(crate) fn packed_notifier_id(b: &[u8]) -> DResult<Option<&[u8]>> {
    let r = &mut Reader::new(b);
    let nkeys = r.byte()?;
    for _ in 0..nkeys {
        unpack_key(r)?;
    }
    r.take(32)?;
    unpack_id(r)?;
    r.maybe(unpack_key)?;
    r.byte()?;
    r.maybe(|r| {
        unpack_id(r)?;
        read_bytes(r)?;
        read_bytes(r)
    })?;
    r.maybe(unpack_id)
}

fn put_status(out: &mut Vec<u8>, status: &QueueStatus) {
    match status {
        QueueStatus::Active => out.push(b'A'),
        QueueStatus::Off => out.push(b'O'),
        QueueStatus::Blocked(info) => {
            out.push(b'B');
            // An empty notice has no encoding that parses back (`,notice=` needs JSON after it).
            let info = BlockingInfo {
                reason: info.reason,
                notice: info.notice.clone().filter(|n| !n.is_empty()),
            };
            let mut b = Vec::new();
            info.encode(&mut b);
            put_bytes(out, &b);
        }
    }
}

fn read_status(r: &mut Reader<'_>) -> DResult<QueueStatus> {
    Ok(match r.byte()? {
        b'A' => QueueStatus::Active,
        b'O' => QueueStatus::Off,
        b'B' => {
            let mut br = Reader::new(read_bytes(r)?);
            let info = BlockingInfo::read(&mut br)?;
            br.end()?;
            QueueStatus::Blocked(info)
        }
        _ => return Err(DecodeError),
    })
}

// ---- decoding ----

pub(crate) fn read_bytes<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.word32()? as usize;
    r.take(n)
}

pub(crate) fn read_key(r: &mut Reader<'_>) -> DResult<PublicAuthKey> {
    PublicAuthKey::from_spki(read_bytes(r)?).map_err(|_| DecodeError)
}

/// A count read from the file, checked against the bytes left so that a corrupt count cannot make
/// us reserve memory the file could never fill (each item takes at least `min_item_bytes`).
pub(crate) fn read_count(r: &mut Reader<'_>, min_item_bytes: usize) -> DResult<usize> {
    let n = r.word32()? as usize;
    if n.saturating_mul(min_item_bytes) > r.rest().len() {
        return Err(DecodeError);
    }
    Ok(n)
}

/// The IDs of an encoded record, borrowed from its bytes, without decoding the rest (keys,
/// link data, blocking info are skipped by their lengths): what a start indexes for every queue.
pub(crate) fn read_ids<'a>(r: &mut Reader<'a>) -> DResult<RecordIds<'a>> {
    let recipient_id = read_bytes(r)?;
    let nkeys = read_count(r, 4)?;
    for _ in 0..nkeys {
        read_bytes(r)?;
    }
    r.take(32)?;
    let sender_id = read_bytes(r)?;
    r.maybe(read_bytes)?;
    r.maybe(|r| r.byte())?;
    let link_id = r.maybe(|r| {
        let id = read_bytes(r)?;
        read_bytes(r)?;
        read_bytes(r)?;
        Ok(id)
    })?;
    let notifier = r.maybe(|r| {
        let id = read_bytes(r)?;
        read_bytes(r)?;
        r.take(32)?;
        Ok((id, r.maybe(read_bytes)?))
    })?;
    match r.byte()? {
        b'A' | b'O' => {}
        b'B' => {
            read_bytes(r)?;
        }
        _ => return Err(DecodeError),
    }
    r.maybe(|r| r.int64())?;
    let rcv_service_id = r.maybe(read_bytes)?;
    Ok(RecordIds {
        recipient_id,
        sender_id,
        link_id,
        notifier_id: notifier.map(|n| n.0),
        rcv_service_id,
        ntf_service_id: notifier.and_then(|n| n.1),
    })
}

pub(crate) fn decode_rec(r: &mut Reader<'_>) -> DResult<QueueRec> {
    let recipient_id = read_bytes(r)?.to_vec();
    let nkeys = read_count(r, 4)?;
    let mut recipient_keys = Vec::with_capacity(nkeys);
    for _ in 0..nkeys {
        recipient_keys.push(read_key(r)?);
    }
    let rcv_dh_secret = r.array()?;
    let sender_id = read_bytes(r)?.to_vec();
    let sender_key = r.maybe(read_key)?;
    let queue_mode = r.maybe(|r| match r.byte()? {
        b'M' => Ok(QueueMode::Messaging),
        b'C' => Ok(QueueMode::Contact),
        _ => Err(DecodeError),
    })?;
    let link = r.maybe(|r| {
        let l = QueueLink {
            link_id: read_bytes(r)?.to_vec(),
            fixed: read_bytes(r)?.to_vec(),
            user: read_bytes(r)?.to_vec(),
        };
        l.fits().then_some(l).ok_or(DecodeError)
    })?;
    let notifier = r.maybe(|r| {
        Ok(NotifierCreds {
            notifier_id: read_bytes(r)?.to_vec(),
            notifier_key: read_key(r)?,
            rcv_ntf_dh_secret: r.array()?,
            ntf_service_id: r.maybe(|r| Ok(read_bytes(r)?.to_vec()))?,
        })
    })?;
    let status = read_status(r)?;
    let updated_at = r.maybe(|r| r.int64())?;
    let rcv_service_id = r.maybe(|r| Ok(read_bytes(r)?.to_vec()))?;
    Ok(QueueRec {
        recipient_id,
        recipient_keys,
        rcv_dh_secret,
        sender_id,
        sender_key,
        queue_mode,
        link: link.map(Box::new),
        notifier: notifier.map(Box::new),
        status,
        updated_at,
        rcv_service_id,
    })
}

pub(crate) fn decode_msg(r: &mut Reader<'_>) -> DResult<Message> {
    match r.byte()? {
        b'M' => Ok(Message::Message {
            msg_id: r.array()?,
            ts: r.int64()?,
            notification: r.bool()?,
            body: read_bytes(r)?.into(),
        }),
        b'Q' => Ok(Message::Quota {
            msg_id: r.array()?,
            ts: r.int64()?,
        }),
        _ => Err(DecodeError),
    }
}

pub(crate) fn decode_ntf(r: &mut Reader<'_>) -> DResult<MsgNtf> {
    Ok(MsgNtf {
        msg_id: r.array()?,
        ts: r.int64()?,
        nonce: r.array()?,
        enc_meta: read_bytes(r)?.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::BlockingReason;

    fn key(b: u8) -> PublicAuthKey {
        PublicAuthKey::Ed25519([b; 32])
    }

    /// Every shape a record takes: with and without sender key, mode, link, notifier (with and
    /// without its service), each status, `updated_at` and the recipient's service.
    fn shapes() -> Vec<QueueRec> {
        let mut out = Vec::new();
        for i in 0..64u32 {
            let bit = |n: u32| i & (1 << n) != 0;
            out.push(QueueRec {
                recipient_id: vec![1; 24],
                recipient_keys: if bit(0) {
                    vec![key(2), key(3)]
                } else {
                    vec![key(2)]
                },
                rcv_dh_secret: [4; 32],
                sender_id: vec![5; 24],
                sender_key: bit(1).then(|| key(6)),
                queue_mode: bit(2).then_some(QueueMode::Contact),
                link: bit(3).then(|| {
                    Box::new(QueueLink {
                        link_id: vec![7; 30],
                        fixed: vec![8; 100],
                        user: vec![9; 10],
                    })
                }),
                notifier: bit(4).then(|| {
                    Box::new(NotifierCreds {
                        notifier_id: vec![10; 24],
                        notifier_key: PublicAuthKey::X25519([11; 32]),
                        rcv_ntf_dh_secret: [12; 32],
                        ntf_service_id: bit(5).then(|| vec![13; 24]),
                    })
                }),
                status: match i % 3 {
                    0 => QueueStatus::Active,
                    1 => QueueStatus::Off,
                    _ => QueueStatus::Blocked(BlockingInfo {
                        reason: BlockingReason::Spam,
                        notice: None,
                    }),
                },
                updated_at: bit(1).then_some(86_400),
                rcv_service_id: bit(5).then(|| vec![14; 24]),
            });
        }
        out
    }

    #[test]
    fn the_ids_read_from_a_record_are_those_of_the_decoded_record() {
        for q in shapes() {
            let mut b = Vec::new();
            encode_rec(&mut b, &q);
            let mut r = Reader::new(&b);
            let ids = read_ids(&mut r).unwrap();
            assert!(r.rest().is_empty(), "{q:?}");
            let decoded = decode_rec(&mut Reader::new(&b)).unwrap();
            assert_eq!(decoded, q);
            assert_eq!(ids, RecordIds::of(&q), "{q:?}");
            // The packed form, without the recipient ID, gives the same record back.
            let packed = pack_rec(&q);
            assert_eq!(unpack_rec(&q.recipient_id, &packed).unwrap(), q);
            assert_eq!(
                packed_notifier_id(&packed).unwrap(),
                q.notifier.as_ref().map(|n| &n.notifier_id[..])
            );
            assert!(unpack_rec(&q.recipient_id, &packed[..packed.len() - 1]).is_err());
            // A record cut short is refused, not read past its end.
            let mut short = Reader::new(&b[..b.len() - 1]);
            let whole = read_ids(&mut short).is_ok() && short.rest().is_empty();
            assert!(!whole, "{q:?}");
        }
    }

    /// Link data longer than LNK's `Large` fields is refused when a record is read back (from a
    /// journal, a group file or an import stream), not served cut short.
    #[test]
    fn link_data_over_a_large_field_is_refused() {
        use crate::protocol::encoding::MAX_LARGE;
        for (fixed, user) in [
            (MAX_LARGE + 1, 0),
            (0, MAX_LARGE + 1),
            (MAX_LARGE, MAX_LARGE),
        ] {
            let mut q = shapes().remove(8);
            q.link = Some(Box::new(QueueLink {
                link_id: vec![7; 24],
                fixed: vec![1; fixed],
                user: vec![2; user],
            }));
            let fits = fixed <= MAX_LARGE && user <= MAX_LARGE;
            let mut b = Vec::new();
            encode_rec(&mut b, &q);
            assert_eq!(decode_rec(&mut Reader::new(&b)).is_ok(), fits);
        }
    }
}
