//! Server responses and events (simplexmq `Protocol.hs`, `BrokerMsg`): encoders with the
//! per-version forms the relay sends, and strict parsers for the client library.

use super::command::{split_tag, QueueMode};
use super::encoding::{
    put_bool, put_int64, put_large_unchecked, put_maybe, put_short_unchecked, DResult, DecodeError,
    Reader,
};
use super::error::{CommandError, ErrorType};
use super::handshake::CertChainPubKey;
use super::version::{
    Version, VersionRange, DELETED_EVENT, NEW_NTF_CREDS, RCV_SERVICE, SERVICE_CERTS, SHORT_LINKS,
    SND_AUTH_KEY,
};
use crate::crypto::keys::{x25519_from_spki, x25519_to_spki};

/// `IDS`: the new queue's ids and keys. Fields a version cannot carry are not encoded there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueIds {
    pub rcv_id: Vec<u8>,
    pub snd_id: Vec<u8>,
    /// The server's per-queue X25519 key.
    pub srv_dh_key: [u8; 32],
    /// v9–14 carry only `Bool senderCanSecure` (mode = messaging); v15+ the `Maybe` mode.
    pub queue_mode: Option<QueueMode>,
    /// v15+.
    pub link_id: Option<Vec<u8>>,
    /// v16+.
    pub service_id: Option<Vec<u8>>,
    /// v17+.
    pub srv_ntf_creds: Option<ServerNtfCreds>,
}

/// The notifier created together with a queue (`IDS` v17+), or the `NID` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerNtfCreds {
    pub notifier_id: Vec<u8>,
    pub srv_ntf_dh_key: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerMsg {
    Ids(QueueIds),
    Lnk {
        sender_id: Vec<u8>,
        fixed: Vec<u8>,
        user: Vec<u8>,
    },
    /// Encoded as `OK` below v16.
    Sok(Option<Vec<u8>>),
    /// The hash is sent only at v19+; parsed as zeros below.
    Soks {
        count: i64,
        ids_hash: [u8; 16],
    },
    Msg {
        msg_id: Vec<u8>,
        /// The encrypted body (simplexmq `Server.hs`, `encryptMsg`), opaque here.
        body: Vec<u8>,
    },
    Alls,
    Nid {
        notifier_id: Vec<u8>,
        srv_ntf_dh_key: [u8; 32],
    },
    Nmsg {
        nonce: [u8; 24],
        enc_meta: Vec<u8>,
    },
    Pkey {
        session_id: Vec<u8>,
        versions: VersionRange,
        cert_key: CertChainPubKey,
    },
    Rres(Vec<u8>),
    Pres(Vec<u8>),
    End,
    /// As `Soks`.
    Ends {
        count: i64,
        ids_hash: [u8; 16],
    },
    /// Encoded as `END` below v10.
    Deld,
    /// JSON `QueueInfo`, not validated here.
    Info(String),
    Ok,
    Err(ErrorType),
    Pong,
    /// JSON `NameRecord`, not validated here.
    RName(String),
}

fn put_dh_key(out: &mut Vec<u8>, k: &[u8; 32]) {
    put_short_unchecked(out, &x25519_to_spki(k));
}

fn read_dh_key(r: &mut Reader<'_>) -> DResult<[u8; 32]> {
    x25519_from_spki(r.short()?).map_err(|_| DecodeError)
}

fn put_mode(out: &mut Vec<u8>, m: &QueueMode) {
    out.push(match m {
        QueueMode::Messaging => b'M',
        QueueMode::Contact => b'C',
    });
}

fn read_mode(r: &mut Reader<'_>) -> DResult<QueueMode> {
    match r.byte()? {
        b'M' => Ok(QueueMode::Messaging),
        b'C' => Ok(QueueMode::Contact),
        _ => Err(DecodeError),
    }
}

fn read_short_vec(r: &mut Reader<'_>) -> DResult<Vec<u8>> {
    Ok(r.short()?.to_vec())
}

fn read_json(r: &mut Reader<'_>) -> DResult<String> {
    String::from_utf8(r.tail().to_vec()).map_err(|_| DecodeError)
}

/// `MSG` without building a `BrokerMsg`, so the relay can encode a stored body without copying
/// it first: `"MSG" SP shortString(msgId) body`.
pub fn encode_msg(msg_id: &[u8], body: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"MSG ");
    put_short_unchecked(out, msg_id);
    out.extend_from_slice(body);
}

impl BrokerMsg {
    /// About how many bytes `encode` writes: exact enough for one allocation of a MSG or a
    /// forwarded answer, 64 for the small ones.
    pub fn encoded_len_hint(&self) -> usize {
        match self {
            BrokerMsg::Msg { msg_id, body } => 8 + msg_id.len() + body.len(),
            BrokerMsg::Rres(b) | BrokerMsg::Pres(b) => 8 + b.len(),
            _ => 64,
        }
    }

    /// Encodes in the form of version `v`. Which entity id goes with it is the caller's concern.
    pub fn encode(&self, v: Version, out: &mut Vec<u8>) {
        match self {
            BrokerMsg::Ids(ids) => {
                out.extend_from_slice(b"IDS ");
                put_short_unchecked(out, &ids.rcv_id);
                put_short_unchecked(out, &ids.snd_id);
                put_dh_key(out, &ids.srv_dh_key);
                if v >= SHORT_LINKS {
                    put_maybe(out, ids.queue_mode.as_ref(), put_mode);
                    put_maybe(out, ids.link_id.as_deref(), put_short_unchecked);
                    if v >= SERVICE_CERTS {
                        put_maybe(out, ids.service_id.as_deref(), put_short_unchecked);
                    }
                    if v >= NEW_NTF_CREDS {
                        put_maybe(out, ids.srv_ntf_creds.as_ref(), |o, c| {
                            put_short_unchecked(o, &c.notifier_id);
                            put_dh_key(o, &c.srv_ntf_dh_key);
                        });
                    }
                } else if v >= SND_AUTH_KEY {
                    put_bool(out, ids.queue_mode == Some(QueueMode::Messaging));
                }
            }
            BrokerMsg::Lnk {
                sender_id,
                fixed,
                user,
            } => {
                out.extend_from_slice(b"LNK ");
                put_short_unchecked(out, sender_id);
                put_large_unchecked(out, fixed);
                put_large_unchecked(out, user);
            }
            BrokerMsg::Sok(service_id) => {
                if v >= SERVICE_CERTS {
                    out.extend_from_slice(b"SOK ");
                    put_maybe(out, service_id.as_deref(), put_short_unchecked);
                } else {
                    out.extend_from_slice(b"OK");
                }
            }
            BrokerMsg::Soks { count, ids_hash } => {
                out.extend_from_slice(b"SOKS ");
                put_service_count(v, out, *count, ids_hash);
            }
            BrokerMsg::Msg { msg_id, body } => encode_msg(msg_id, body, out),
            BrokerMsg::Alls => out.extend_from_slice(b"ALLS"),
            BrokerMsg::Nid {
                notifier_id,
                srv_ntf_dh_key,
            } => {
                out.extend_from_slice(b"NID ");
                put_short_unchecked(out, notifier_id);
                put_dh_key(out, srv_ntf_dh_key);
            }
            BrokerMsg::Nmsg { nonce, enc_meta } => {
                out.extend_from_slice(b"NMSG ");
                out.extend_from_slice(nonce);
                put_short_unchecked(out, enc_meta);
            }
            BrokerMsg::Pkey {
                session_id,
                versions,
                cert_key,
            } => {
                out.extend_from_slice(b"PKEY ");
                put_short_unchecked(out, session_id);
                versions.encode(out);
                cert_key.encode(out);
            }
            BrokerMsg::Rres(b) => {
                out.extend_from_slice(b"RRES ");
                out.extend_from_slice(b);
            }
            BrokerMsg::Pres(b) => {
                out.extend_from_slice(b"PRES ");
                out.extend_from_slice(b);
            }
            BrokerMsg::End => out.extend_from_slice(b"END"),
            BrokerMsg::Ends { count, ids_hash } => {
                out.extend_from_slice(b"ENDS ");
                put_service_count(v, out, *count, ids_hash);
            }
            BrokerMsg::Deld => {
                out.extend_from_slice(if v >= DELETED_EVENT { b"DELD" } else { b"END" })
            }
            BrokerMsg::Info(json) => {
                out.extend_from_slice(b"INFO ");
                out.extend_from_slice(json.as_bytes());
            }
            BrokerMsg::Ok => out.extend_from_slice(b"OK"),
            BrokerMsg::Err(e) => {
                out.extend_from_slice(b"ERR ");
                e.encode(v, out);
            }
            BrokerMsg::Pong => out.extend_from_slice(b"PONG"),
            BrokerMsg::RName(json) => {
                out.extend_from_slice(b"RNAME ");
                out.extend_from_slice(json.as_bytes());
            }
        }
    }

    /// The encoding at version `v` as a new vector.
    pub fn to_bytes(&self, v: Version) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(v, &mut out);
        out
    }

    /// Parses a response of a session at version `v`: `Unknown` for an unknown tag, `Syntax`
    /// for bad parameters, as the reference client reports them.
    pub fn parse(v: Version, bytes: &[u8]) -> Result<Self, CommandError> {
        let (tag, params) = split_tag(bytes);
        let mut r = Reader::new(params);
        let msg = match read_params(v, tag, &mut r) {
            None => return Err(CommandError::Unknown),
            Some(res) => res.map_err(|_| CommandError::Syntax)?,
        };
        r.end().map_err(|_| CommandError::Syntax)?;
        Ok(msg)
    }

    pub fn tag(&self) -> &'static str {
        match self {
            BrokerMsg::Ids(_) => "IDS",
            BrokerMsg::Lnk { .. } => "LNK",
            BrokerMsg::Sok(_) => "SOK",
            BrokerMsg::Soks { .. } => "SOKS",
            BrokerMsg::Msg { .. } => "MSG",
            BrokerMsg::Alls => "ALLS",
            BrokerMsg::Nid { .. } => "NID",
            BrokerMsg::Nmsg { .. } => "NMSG",
            BrokerMsg::Pkey { .. } => "PKEY",
            BrokerMsg::Rres(_) => "RRES",
            BrokerMsg::Pres(_) => "PRES",
            BrokerMsg::End => "END",
            BrokerMsg::Ends { .. } => "ENDS",
            BrokerMsg::Deld => "DELD",
            BrokerMsg::Info(_) => "INFO",
            BrokerMsg::Ok => "OK",
            BrokerMsg::Err(_) => "ERR",
            BrokerMsg::Pong => "PONG",
            BrokerMsg::RName(_) => "RNAME",
        }
    }

    /// The entity-id rule the client enforces (simplexmq `Protocol.hs`): `IDS` and `ERR` take any
    /// entity; `PONG`, `PKEY`, `RRES`, `ALLS`, `RNAME` must have none (`HAS_AUTH`); all others need
    /// one (`NO_ENTITY`).
    pub fn check_entity(&self, entity_empty: bool) -> Result<(), CommandError> {
        match self {
            BrokerMsg::Ids(_) | BrokerMsg::Err(_) => Ok(()),
            BrokerMsg::Pong
            | BrokerMsg::Pkey { .. }
            | BrokerMsg::Rres(_)
            | BrokerMsg::Alls
            | BrokerMsg::RName(_) => {
                if entity_empty {
                    Ok(())
                } else {
                    Err(CommandError::HasAuth)
                }
            }
            _ if entity_empty => Err(CommandError::NoEntity),
            _ => Ok(()),
        }
    }
}

fn put_service_count(v: Version, out: &mut Vec<u8>, count: i64, ids_hash: &[u8; 16]) {
    put_int64(out, count);
    if v >= RCV_SERVICE {
        put_short_unchecked(out, ids_hash);
    }
}

fn read_service_count(v: Version, r: &mut Reader<'_>) -> DResult<(i64, [u8; 16])> {
    let count = r.int64()?;
    let ids_hash = if v >= RCV_SERVICE {
        r.short()?.try_into().map_err(|_| DecodeError)?
    } else {
        [0u8; 16]
    };
    Ok((count, ids_hash))
}

/// `None` for an unknown tag.
fn read_params(v: Version, tag: &[u8], r: &mut Reader<'_>) -> Option<DResult<BrokerMsg>> {
    let sp = |r: &mut Reader<'_>| r.space();
    let res = match tag {
        b"IDS" => sp(r).and_then(|_| read_ids(v, r)).map(BrokerMsg::Ids),
        b"LNK" => sp(r).and_then(|_| {
            Ok(BrokerMsg::Lnk {
                sender_id: read_short_vec(r)?,
                fixed: r.large()?.to_vec(),
                user: r.large()?.to_vec(),
            })
        }),
        b"SOK" => sp(r).and_then(|_| Ok(BrokerMsg::Sok(r.maybe(read_short_vec)?))),
        b"SOKS" => sp(r).and_then(|_| {
            let (count, ids_hash) = read_service_count(v, r)?;
            Ok(BrokerMsg::Soks { count, ids_hash })
        }),
        b"MSG" => sp(r).and_then(|_| {
            Ok(BrokerMsg::Msg {
                msg_id: read_short_vec(r)?,
                body: r.tail().to_vec(),
            })
        }),
        b"ALLS" => Ok(BrokerMsg::Alls),
        b"NID" => sp(r).and_then(|_| {
            Ok(BrokerMsg::Nid {
                notifier_id: read_short_vec(r)?,
                srv_ntf_dh_key: read_dh_key(r)?,
            })
        }),
        b"NMSG" => sp(r).and_then(|_| {
            Ok(BrokerMsg::Nmsg {
                nonce: r.array()?,
                enc_meta: read_short_vec(r)?,
            })
        }),
        b"PKEY" => sp(r).and_then(|_| {
            Ok(BrokerMsg::Pkey {
                session_id: read_short_vec(r)?,
                versions: VersionRange::decode(r)?,
                cert_key: CertChainPubKey::read(r)?,
            })
        }),
        b"RRES" => sp(r).map(|_| BrokerMsg::Rres(r.tail().to_vec())),
        b"PRES" => sp(r).map(|_| BrokerMsg::Pres(r.tail().to_vec())),
        b"END" => Ok(BrokerMsg::End),
        b"ENDS" => sp(r).and_then(|_| {
            let (count, ids_hash) = read_service_count(v, r)?;
            Ok(BrokerMsg::Ends { count, ids_hash })
        }),
        b"DELD" => Ok(BrokerMsg::Deld),
        b"INFO" => sp(r).and_then(|_| read_json(r)).map(BrokerMsg::Info),
        b"OK" => Ok(BrokerMsg::Ok),
        b"ERR" => sp(r).and_then(|_| ErrorType::read(r)).map(BrokerMsg::Err),
        b"PONG" => Ok(BrokerMsg::Pong),
        b"RNAME" => sp(r).and_then(|_| read_json(r)).map(BrokerMsg::RName),
        _ => return None,
    };
    Some(res)
}

fn read_ids(v: Version, r: &mut Reader<'_>) -> DResult<QueueIds> {
    let rcv_id = read_short_vec(r)?;
    let snd_id = read_short_vec(r)?;
    let srv_dh_key = read_dh_key(r)?;
    let mut ids = QueueIds {
        rcv_id,
        snd_id,
        srv_dh_key,
        queue_mode: None,
        link_id: None,
        service_id: None,
        srv_ntf_creds: None,
    };
    if v >= SHORT_LINKS {
        ids.queue_mode = r.maybe(read_mode)?;
        ids.link_id = r.maybe(read_short_vec)?;
        if v >= SERVICE_CERTS {
            ids.service_id = r.maybe(read_short_vec)?;
        }
        if v >= NEW_NTF_CREDS {
            ids.srv_ntf_creds = r.maybe(|r| {
                Ok(ServerNtfCreds {
                    notifier_id: read_short_vec(r)?,
                    srv_ntf_dh_key: read_dh_key(r)?,
                })
            })?;
        }
    } else if v >= SND_AUTH_KEY {
        ids.queue_mode = Some(if r.bool()? {
            QueueMode::Messaging
        } else {
            QueueMode::Contact
        });
    }
    Ok(ids)
}

/// One server transmission (response or event) at version `v`, in one allocation: the
/// transmission header of `transmission::encode_server_transmission`, then `msg`.
pub fn encode_response(
    v: Version,
    session_id: &[u8],
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &BrokerMsg,
) -> Vec<u8> {
    let mut t = Vec::with_capacity(
        msg.encoded_len_hint() + session_id.len() + corr_id.len() + entity_id.len() + 8,
    );
    super::transmission::encode_server_transmission(v, session_id, corr_id, entity_id, b"", &mut t);
    msg.encode(v, &mut t);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::X25519_SPKI_PREFIX;
    use crate::protocol::error::{
        BlockingInfo, BlockingReason, BrokerError, NetworkError, ProxyError,
    };

    fn ids(mode: Option<QueueMode>, full: bool) -> QueueIds {
        QueueIds {
            rcv_id: vec![1; 24],
            snd_id: vec![2; 24],
            srv_dh_key: [3; 32],
            queue_mode: mode,
            link_id: full.then(|| vec![4; 24]),
            service_id: full.then(|| vec![5; 24]),
            srv_ntf_creds: full.then(|| ServerNtfCreds {
                notifier_id: vec![6; 24],
                srv_ntf_dh_key: [7; 32],
            }),
        }
    }

    fn blocked(notice: bool) -> ErrorType {
        ErrorType::Blocked(BlockingInfo {
            reason: BlockingReason::Content,
            notice: notice.then(|| "{\"ttl\":3600}".to_owned()),
        })
    }

    fn all_responses() -> Vec<BrokerMsg> {
        let mut rs = vec![];
        for mode in [None, Some(QueueMode::Messaging), Some(QueueMode::Contact)] {
            for full in [false, true] {
                rs.push(BrokerMsg::Ids(ids(mode, full)));
            }
        }
        rs.extend([
            BrokerMsg::Lnk {
                sender_id: vec![1; 24],
                fixed: vec![2; 400],
                user: vec![3; 50],
            },
            BrokerMsg::Sok(None),
            BrokerMsg::Sok(Some(vec![9; 24])),
            BrokerMsg::Soks {
                count: 12,
                ids_hash: [8; 16],
            },
            BrokerMsg::Msg {
                msg_id: vec![4; 24],
                body: vec![5; 16122],
            },
            BrokerMsg::Alls,
            BrokerMsg::Nid {
                notifier_id: vec![6; 24],
                srv_ntf_dh_key: [7; 32],
            },
            BrokerMsg::Nmsg {
                nonce: [8; 24],
                enc_meta: vec![9; 144],
            },
            BrokerMsg::Pkey {
                session_id: vec![1; 32],
                versions: VersionRange::new(8, 18).unwrap(),
                cert_key: CertChainPubKey {
                    chain: vec![vec![2; 500], vec![3; 400]],
                    signed_key: vec![4; 120],
                },
            },
            BrokerMsg::Rres(vec![5; 1000]),
            BrokerMsg::Pres(vec![6; 1000]),
            BrokerMsg::End,
            BrokerMsg::Ends {
                count: -1,
                ids_hash: [1; 16],
            },
            BrokerMsg::Deld,
            BrokerMsg::Info("{\"qiSnd\":false,\"qiNtf\":false,\"qiSize\":0}".into()),
            BrokerMsg::Ok,
            BrokerMsg::Err(ErrorType::Auth),
            BrokerMsg::Err(ErrorType::Store("x y".into())),
            BrokerMsg::Err(blocked(true)),
            BrokerMsg::Err(ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                NetworkError::Timeout,
            )))),
            BrokerMsg::Pong,
            BrokerMsg::RName("{\"name\":\"a.simplex\"}".into()),
        ]);
        rs
    }

    /// What a version-`v` client reads back.
    fn expected_at(v: Version, m: &BrokerMsg) -> BrokerMsg {
        match m {
            BrokerMsg::Ids(i) => {
                let mut e = i.clone();
                if v < SHORT_LINKS {
                    e.link_id = None;
                    e.queue_mode = (v >= SND_AUTH_KEY).then_some(match i.queue_mode {
                        Some(QueueMode::Messaging) => QueueMode::Messaging,
                        _ => QueueMode::Contact,
                    });
                }
                if v < SERVICE_CERTS {
                    e.service_id = None;
                }
                if v < NEW_NTF_CREDS {
                    e.srv_ntf_creds = None;
                }
                BrokerMsg::Ids(e)
            }
            BrokerMsg::Sok(_) if v < SERVICE_CERTS => BrokerMsg::Ok,
            BrokerMsg::Soks { count, .. } if v < RCV_SERVICE => BrokerMsg::Soks {
                count: *count,
                ids_hash: [0; 16],
            },
            BrokerMsg::Ends { count, .. } if v < RCV_SERVICE => BrokerMsg::Ends {
                count: *count,
                ids_hash: [0; 16],
            },
            BrokerMsg::Deld if v < DELETED_EVENT => BrokerMsg::End,
            BrokerMsg::Err(ErrorType::Blocked(_)) if v < 12 => BrokerMsg::Err(ErrorType::Auth),
            BrokerMsg::Err(ErrorType::Blocked(b)) if v < 18 => {
                BrokerMsg::Err(ErrorType::Blocked(BlockingInfo {
                    reason: b.reason,
                    notice: None,
                }))
            }
            // NETWORK travels bare; the parser fills in FAILED.
            BrokerMsg::Err(ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(_)))) => {
                BrokerMsg::Err(ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                    NetworkError::Failed,
                ))))
            }
            m => m.clone(),
        }
    }

    #[test]
    fn every_response_round_trips_at_every_version() {
        for v in 6..=20u16 {
            for m in all_responses() {
                let b = m.to_bytes(v);
                assert_eq!(
                    BrokerMsg::parse(v, &b),
                    Ok(expected_at(v, &m)),
                    "v{v} {}",
                    m.tag()
                );
                let mut extra = b.clone();
                extra.extend_from_slice(b" 0");
                let absorbs = matches!(
                    expected_at(v, &m),
                    BrokerMsg::Msg { .. }
                        | BrokerMsg::Rres(_)
                        | BrokerMsg::Pres(_)
                        | BrokerMsg::Info(_)
                        | BrokerMsg::RName(_)
                        | BrokerMsg::Err(ErrorType::Store(_) | ErrorType::Blocked(_))
                );
                if !absorbs {
                    assert_eq!(
                        BrokerMsg::parse(v, &extra),
                        Err(CommandError::Syntax),
                        "v{v} {}",
                        m.tag()
                    );
                }
            }
        }
    }

    fn spki(k: u8) -> Vec<u8> {
        let mut s = vec![44];
        s.extend_from_slice(&X25519_SPKI_PREFIX);
        s.extend_from_slice(&[k; 32]);
        s
    }

    #[test]
    fn ids_per_version() {
        let m = BrokerMsg::Ids(ids(Some(QueueMode::Messaging), true));
        let mut head = b"IDS \x18".to_vec();
        head.extend_from_slice(&[1; 24]);
        head.push(24);
        head.extend_from_slice(&[2; 24]);
        head.extend_from_slice(&spki(3));
        let tail = |v| m.to_bytes(v)[head.len()..].to_vec();
        assert!(m.to_bytes(6).starts_with(&head));
        assert_eq!(tail(6), b"");
        assert_eq!(tail(8), b"");
        assert_eq!(tail(9), b"T");
        assert_eq!(tail(14), b"T");
        let mut t15 = b"1M1\x18".to_vec();
        t15.extend_from_slice(&[4; 24]);
        assert_eq!(tail(15), t15);
        let mut t16 = t15.clone();
        t16.extend_from_slice(b"1\x18");
        t16.extend_from_slice(&[5; 24]);
        assert_eq!(tail(16), t16);
        let mut t17 = t16.clone();
        t17.extend_from_slice(b"1\x18");
        t17.extend_from_slice(&[6; 24]);
        t17.extend_from_slice(&spki(7));
        assert_eq!(tail(17), t17);
        assert_eq!(tail(20), t17);
        // a contact queue at v9-14, and no mode at v15
        let c = BrokerMsg::Ids(ids(Some(QueueMode::Contact), false));
        assert_eq!(c.to_bytes(12)[head.len()..], *b"F");
        let n = BrokerMsg::Ids(ids(None, false));
        assert_eq!(n.to_bytes(15)[head.len()..], *b"00");
        assert_eq!(n.to_bytes(16)[head.len()..], *b"000");
        assert_eq!(n.to_bytes(17)[head.len()..], *b"0000");
    }

    #[test]
    fn version_dependent_encodings() {
        let s = |m: &BrokerMsg, v| String::from_utf8_lossy(&m.to_bytes(v)).into_owned();
        assert_eq!(s(&BrokerMsg::Sok(None), 15), "OK");
        assert_eq!(s(&BrokerMsg::Sok(None), 16), "SOK 0");
        assert_eq!(
            s(&BrokerMsg::Sok(Some(b"sid".to_vec())), 16),
            "SOK 1\x03sid"
        );
        assert_eq!(s(&BrokerMsg::Deld, 9), "END");
        assert_eq!(s(&BrokerMsg::Deld, 10), "DELD");
        let b = BrokerMsg::Err(blocked(true));
        assert_eq!(s(&b, 11), "ERR AUTH");
        assert_eq!(s(&b, 12), "ERR BLOCKED reason=content");
        assert_eq!(s(&b, 17), "ERR BLOCKED reason=content");
        assert_eq!(
            s(&b, 18),
            "ERR BLOCKED reason=content,notice={\"ttl\":3600}"
        );
        let soks = BrokerMsg::Soks {
            count: 2,
            ids_hash: [0xab; 16],
        };
        assert_eq!(soks.to_bytes(18), b"SOKS \0\0\0\0\0\0\0\x02");
        let mut v19 = b"SOKS \0\0\0\0\0\0\0\x02\x10".to_vec();
        v19.extend_from_slice(&[0xab; 16]);
        assert_eq!(soks.to_bytes(19), v19);
        assert_eq!(BrokerMsg::Pong.to_bytes(6), b"PONG");
        let mut msg = b"MSG \x02id".to_vec();
        msg.extend_from_slice(b"body");
        assert_eq!(
            BrokerMsg::Msg {
                msg_id: b"id".to_vec(),
                body: b"body".to_vec()
            }
            .to_bytes(20),
            msg
        );
        let mut direct = Vec::new();
        encode_msg(b"id", b"body", &mut direct);
        assert_eq!(direct, msg);
    }

    #[test]
    fn parse_errors() {
        for t in [&b"SEND F x"[..], b"PING", b"FOO", b"", b"OK=", b"ok"] {
            assert_eq!(BrokerMsg::parse(20, t), Err(CommandError::Unknown), "{t:?}");
        }
        for t in [
            &b"OK "[..],
            b"ERR",
            b"ERR ",
            b"ERR NOPE",
            b"IDS",
            b"SOK",
            b"SOK 2",
            b"NMSG \x01\x02",
            b"MSG",
            b"PONG x",
        ] {
            assert_eq!(BrokerMsg::parse(20, t), Err(CommandError::Syntax), "{t:?}");
        }
        // `SOK` with params is a syntax error at any version only when malformed
        assert_eq!(BrokerMsg::parse(6, b"SOK 0"), Ok(BrokerMsg::Sok(None)));
    }

    #[test]
    fn entity_rules() {
        use CommandError::{HasAuth, NoEntity};
        assert_eq!(BrokerMsg::Ids(ids(None, false)).check_entity(true), Ok(()));
        assert_eq!(BrokerMsg::Err(ErrorType::Auth).check_entity(false), Ok(()));
        assert_eq!(BrokerMsg::Err(ErrorType::Auth).check_entity(true), Ok(()));
        for m in [
            BrokerMsg::Pong,
            BrokerMsg::Alls,
            BrokerMsg::Rres(vec![]),
            BrokerMsg::RName(String::new()),
        ] {
            assert_eq!(m.check_entity(true), Ok(()));
            assert_eq!(m.check_entity(false), Err(HasAuth));
        }
        for m in [
            BrokerMsg::Ok,
            BrokerMsg::End,
            BrokerMsg::Deld,
            BrokerMsg::Pres(vec![]),
            BrokerMsg::Sok(None),
        ] {
            assert_eq!(m.check_entity(true), Err(NoEntity));
            assert_eq!(m.check_entity(false), Ok(()));
        }
    }
}

/// Every parser of the module family, fed mutated and truncated valid encodings and random
/// bytes: none may panic, whatever it returns.
#[cfg(test)]
mod robustness {
    use super::*;
    use crate::protocol::command::parse_command;
    use crate::protocol::handshake::{ClientHello, ServerHello, ServiceResponse};
    use crate::protocol::transmission::parse_transmission;
    use crate::protocol::{batch::parse_batch, error::ErrorType as E, pad::unpad};

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn feed(v: Version, b: &[u8]) {
        let _ = parse_command(v, b);
        let _ = BrokerMsg::parse(v, b);
        let _ = E::parse(v, b);
        let _ = parse_transmission(v, b);
        let _ = parse_batch(b);
        let _ = unpad(b);
        let _ = ClientHello::decode(b);
        let _ = ServerHello::decode(b);
        let _ = ServiceResponse::decode(b);
    }

    #[test]
    fn no_panics_on_mutated_input() {
        let seeds: Vec<Vec<u8>> = vec![
            b"NEW \x2c0*0\x05\x06\x03+ep\x03!\x00".to_vec(),
            b"PRXY \x02\x03[::\x071.2.3.4\x00\x00".to_vec(),
            b"SEND T body".to_vec(),
            b"RSLV a-b.simplex".to_vec(),
            b"ERR BLOCKED reason=spam,notice={}".to_vec(),
            b"ERR PROXY BROKER NETWORK CONNECT \x05".to_vec(),
            b"PKEY \x01a\x00\x08\x00\x12\x01\x00\x01x\x00\x01y".to_vec(),
            b"IDS \x01a\x01b\x2c".to_vec(),
            b"\x00\x14\x20".to_vec(),
            b"\x02\x00\x03abc\x00".to_vec(),
        ];
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for seed in &seeds {
            for cut in 0..=seed.len() {
                for v in [6u16, 9, 15, 16, 17, 19, 20] {
                    feed(v, &seed[..cut]);
                }
            }
            for _ in 0..2000 {
                let mut b = seed.clone();
                let n = (xorshift(&mut s) % 4 + 1) as usize;
                for _ in 0..n {
                    let r = xorshift(&mut s);
                    let i = (r as usize >> 8) % (b.len() + 1);
                    match r % 3 {
                        0 if i < b.len() => b[i] = (r >> 32) as u8,
                        1 => b.insert(i, (r >> 40) as u8),
                        _ if i < b.len() => {
                            b.remove(i);
                        }
                        _ => {}
                    }
                }
                feed((6 + xorshift(&mut s) % 15) as u16, &b);
            }
        }
        // The seeds are meant to parse at least partly: one of them must round-trip.
        assert_eq!(
            parse_command(20, b"RSLV a-b.simplex").map(|c| c.tag()),
            Ok("RSLV")
        );
    }
}
