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
use crate::store::{Message, MsgNtf, NotifierCreds, QueueLink, QueueRec, QueueStatus};

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
    match &rec.status {
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
        Ok(QueueLink {
            link_id: read_bytes(r)?.to_vec(),
            fixed: read_bytes(r)?.to_vec(),
            user: read_bytes(r)?.to_vec(),
        })
    })?;
    let notifier = r.maybe(|r| {
        Ok(NotifierCreds {
            notifier_id: read_bytes(r)?.to_vec(),
            notifier_key: read_key(r)?,
            rcv_ntf_dh_secret: r.array()?,
            ntf_service_id: r.maybe(|r| Ok(read_bytes(r)?.to_vec()))?,
        })
    })?;
    let status = match r.byte()? {
        b'A' => QueueStatus::Active,
        b'O' => QueueStatus::Off,
        b'B' => {
            let mut br = Reader::new(read_bytes(r)?);
            let info = BlockingInfo::read(&mut br)?;
            br.end()?;
            QueueStatus::Blocked(info)
        }
        _ => return Err(DecodeError),
    };
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
