//! Queue records and messages as the reference's `msg_queues` and `messages` rows hold them
//! (simplexmq `Server/QueueStore/Postgres.hs`, its `ToField`/`FromField` instances): keys as DER
//! (recipient keys as a count byte, then each key as a length byte and its DER), secrets as raw
//! bytes, the queue mode as `M`/`C`, the status as `active`, `off` or `blocked,<info>`.

use postgres::types::ToSql;
use postgres::Row;

use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::QueueMode;
use crate::protocol::encoding::Reader;
use crate::protocol::error::BlockingInfo;
use crate::store::{Message, MsgId, NotifierCreds, QueueLink, QueueRec, QueueStatus};

/// The record's columns in the order of [`RecRow`] and [`rec_of`] (a macro, so that statements
/// written as literals can include them with `concat!`).
macro_rules! rec_columns {
    () => {
        "recipient_id, recipient_keys, rcv_dh_secret, sender_id, \
     sender_key, queue_mode, notifier_id, notifier_key, rcv_ntf_dh_secret, ntf_service_id, \
     status, updated_at, link_id, rcv_service_id, fixed_data, user_data"
    };
}
pub(crate) use rec_columns;

/// The record's columns, for statements made at run time.
pub const REC_COLUMNS: &str = rec_columns!();

/// A queue record as its row's values, owned so that a job can take it to a worker thread.
#[derive(Debug, Clone)]
pub struct RecRow {
    recipient_id: Vec<u8>,
    recipient_keys: Vec<u8>,
    rcv_dh_secret: Vec<u8>,
    sender_id: Vec<u8>,
    sender_key: Option<Vec<u8>>,
    queue_mode: Option<String>,
    notifier_id: Option<Vec<u8>>,
    notifier_key: Option<Vec<u8>>,
    rcv_ntf_dh_secret: Option<Vec<u8>>,
    ntf_service_id: Option<Vec<u8>>,
    status: String,
    updated_at: Option<i64>,
    link_id: Option<Vec<u8>>,
    rcv_service_id: Option<Vec<u8>>,
    fixed_data: Option<Vec<u8>>,
    user_data: Option<Vec<u8>>,
}

impl RecRow {
    pub fn of(rec: &QueueRec) -> RecRow {
        let n = rec.notifier.as_deref();
        let l = rec.link.as_deref();
        RecRow {
            recipient_id: rec.recipient_id.clone(),
            recipient_keys: encode_keys(&rec.recipient_keys),
            rcv_dh_secret: rec.rcv_dh_secret.to_vec(),
            sender_id: rec.sender_id.clone(),
            sender_key: rec.sender_key.as_ref().map(PublicAuthKey::to_spki),
            queue_mode: rec.queue_mode.map(|m| mode_text(m).to_string()),
            notifier_id: n.map(|n| n.notifier_id.clone()),
            notifier_key: n.map(|n| n.notifier_key.to_spki()),
            rcv_ntf_dh_secret: n.map(|n| n.rcv_ntf_dh_secret.to_vec()),
            ntf_service_id: n.and_then(|n| n.ntf_service_id.clone()),
            status: status_text(&rec.status),
            updated_at: rec.updated_at,
            link_id: l.map(|l| l.link_id.clone()),
            rcv_service_id: rec.rcv_service_id.clone(),
            fixed_data: l.map(|l| l.fixed.clone()),
            user_data: l.map(|l| l.user.clone()),
        }
    }

    /// The 16 values in [`REC_COLUMNS`] order.
    pub fn params(&self) -> [&(dyn ToSql + Sync); 16] {
        [
            &self.recipient_id,
            &self.recipient_keys,
            &self.rcv_dh_secret,
            &self.sender_id,
            &self.sender_key,
            &self.queue_mode,
            &self.notifier_id,
            &self.notifier_key,
            &self.rcv_ntf_dh_secret,
            &self.ntf_service_id,
            &self.status,
            &self.updated_at,
            &self.link_id,
            &self.rcv_service_id,
            &self.fixed_data,
            &self.user_data,
        ]
    }
}

/// The record of a row read with [`REC_COLUMNS`] first; the error names the queue.
pub fn rec_of(row: &Row) -> Result<QueueRec, String> {
    let rid: Vec<u8> = row.get(0);
    let bad = |what: &str| {
        format!(
            "queue {} in the database: {what}",
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE, &rid)
        )
    };
    let keys: Vec<u8> = row.get(1);
    let recipient_keys = decode_keys(&keys).ok_or_else(|| bad("bad recipient_keys"))?;
    let dh: Vec<u8> = row.get(2);
    let rcv_dh_secret: [u8; 32] = dh
        .as_slice()
        .try_into()
        .map_err(|_| bad("rcv_dh_secret is not 32 bytes"))?;
    let sender_key = row
        .get::<_, Option<Vec<u8>>>(4)
        .map(|k| PublicAuthKey::from_spki(&k).map_err(|_| bad("bad sender_key")))
        .transpose()?;
    let queue_mode = match row.get::<_, Option<String>>(5).as_deref() {
        None => None,
        Some("M") => Some(QueueMode::Messaging),
        Some("C") => Some(QueueMode::Contact),
        Some(_) => return Err(bad("queue_mode is not M or C")),
    };
    let nid: Option<Vec<u8>> = row.get(6);
    let nkey: Option<Vec<u8>> = row.get(7);
    let ndh: Option<Vec<u8>> = row.get(8);
    // As the reference: a notifier only when its ID, key and secret are all there.
    let notifier = match (nid, nkey, ndh) {
        (Some(notifier_id), Some(k), Some(dh)) => Some(Box::new(NotifierCreds {
            notifier_id,
            notifier_key: PublicAuthKey::from_spki(&k).map_err(|_| bad("bad notifier_key"))?,
            rcv_ntf_dh_secret: dh
                .as_slice()
                .try_into()
                .map_err(|_| bad("rcv_ntf_dh_secret is not 32 bytes"))?,
            ntf_service_id: row.get(9),
        })),
        _ => None,
    };
    let status = parse_status(&row.get::<_, String>(10)).ok_or_else(|| bad("bad status"))?;
    let link = row.get::<_, Option<Vec<u8>>>(12).map(|link_id| {
        Box::new(QueueLink {
            link_id,
            fixed: row.get::<_, Option<Vec<u8>>>(14).unwrap_or_default(),
            user: row.get::<_, Option<Vec<u8>>>(15).unwrap_or_default(),
        })
    });
    if link.as_ref().is_some_and(|l| !l.fits()) {
        return Err(bad("fixed_data or user_data over 65535 bytes"));
    }
    Ok(QueueRec {
        sender_id: row.get(3),
        recipient_id: rid.clone(),
        recipient_keys,
        rcv_dh_secret,
        sender_key,
        queue_mode,
        link,
        notifier,
        status,
        updated_at: row.get(11),
        rcv_service_id: row.get(13),
    })
}

pub fn encode_keys(keys: &[PublicAuthKey]) -> Vec<u8> {
    let mut out = vec![keys.len() as u8];
    for k in keys {
        let der = k.to_spki();
        out.push(der.len() as u8);
        out.extend_from_slice(&der);
    }
    out
}

pub fn decode_keys(b: &[u8]) -> Option<Vec<PublicAuthKey>> {
    let (&n, mut rest) = b.split_first()?;
    let mut keys = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (&len, r) = rest.split_first()?;
        let (der, r) = (r.get(..len as usize)?, &r[len as usize..]);
        keys.push(PublicAuthKey::from_spki(der).ok()?);
        rest = r;
    }
    (rest.is_empty() && !keys.is_empty()).then_some(keys)
}

fn mode_text(m: QueueMode) -> &'static str {
    match m {
        QueueMode::Messaging => "M",
        QueueMode::Contact => "C",
    }
}

pub fn status_text(s: &QueueStatus) -> String {
    match s {
        QueueStatus::Active => "active".into(),
        QueueStatus::Off => "off".into(),
        QueueStatus::Blocked(info) => {
            let mut b = b"blocked,".to_vec();
            info.encode(&mut b);
            String::from_utf8_lossy(&b).into_owned()
        }
    }
}

pub fn parse_status(s: &str) -> Option<QueueStatus> {
    match s {
        "active" => Some(QueueStatus::Active),
        "off" => Some(QueueStatus::Off),
        _ => {
            let info = s.strip_prefix("blocked,")?;
            let mut r = Reader::new(info.as_bytes());
            let info = BlockingInfo::read(&mut r).ok()?;
            r.is_empty().then_some(QueueStatus::Blocked(info))
        }
    }
}

/// A message as read on a worker thread (bodies become shared on the shard).
#[derive(Debug, Clone)]
pub struct MsgRow {
    pub msg_id: Vec<u8>,
    pub ts: i64,
    pub quota: bool,
    pub ntf: bool,
    pub body: Vec<u8>,
}

impl MsgRow {
    /// From `msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body`, starting at column `at`.
    pub fn read(row: &Row, at: usize) -> MsgRow {
        MsgRow {
            msg_id: row.get(at),
            ts: row.get(at + 1),
            quota: row.get(at + 2),
            ntf: row.get(at + 3),
            body: row.get(at + 4),
        }
    }

    pub fn of(m: &Message) -> MsgRow {
        match m {
            Message::Message {
                msg_id,
                ts,
                notification,
                body,
            } => MsgRow {
                msg_id: msg_id.to_vec(),
                ts: *ts,
                quota: false,
                ntf: *notification,
                body: body.to_vec(),
            },
            Message::Quota { msg_id, ts } => MsgRow {
                msg_id: msg_id.to_vec(),
                ts: *ts,
                quota: true,
                ntf: false,
                body: Vec::new(),
            },
        }
    }

    pub fn message(self) -> Result<Message, String> {
        let msg_id: MsgId = self.msg_id.as_slice().try_into().map_err(|_| {
            format!(
                "a message ID of {} bytes in the database",
                self.msg_id.len()
            )
        })?;
        Ok(if self.quota {
            Message::Quota {
                msg_id,
                ts: self.ts,
            }
        } else {
            Message::Message {
                msg_id,
                ts: self.ts,
                notification: self.ntf,
                body: self.body.into(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::BlockingReason;

    #[test]
    fn statuses_are_the_reference_s_text() {
        for (s, text) in [
            (QueueStatus::Active, "active"),
            (QueueStatus::Off, "off"),
            (
                QueueStatus::Blocked(BlockingInfo {
                    reason: BlockingReason::Spam,
                    notice: None,
                }),
                "blocked,reason=spam",
            ),
            (
                QueueStatus::Blocked(BlockingInfo {
                    reason: BlockingReason::Content,
                    notice: Some("{\"ttl\":60}".into()),
                }),
                "blocked,reason=content,notice={\"ttl\":60}",
            ),
        ] {
            assert_eq!(status_text(&s), text);
            assert_eq!(parse_status(text), Some(s));
        }
        assert_eq!(parse_status("blocked,reason=ham"), None);
        assert_eq!(parse_status("on"), None);
    }

    #[test]
    fn a_key_list_is_a_count_then_length_prefixed_der() {
        let k = PublicAuthKey::from_spki(&crate::crypto::keys::ed25519_to_spki(&[7; 32])).unwrap();
        let b = encode_keys(&[k.clone(), k.clone()]);
        assert_eq!(b[0], 2);
        assert_eq!(b[1] as usize, k.to_spki().len());
        assert_eq!(decode_keys(&b), Some(vec![k.clone(), k]));
        assert_eq!(decode_keys(&b[..b.len() - 1]), None);
        assert_eq!(decode_keys(&[0]), None);
    }
}
