//! Server responses and events (`reference/smp-wire.md` §5.2): encoders with the per-version
//! forms the relay sends, and strict parsers for the client library.

use super::command::{split_tag, QueueMode};
use super::encoding::{
    put_bool, put_int64, put_large, put_maybe, put_short_unchecked, put_word16, DResult,
    DecodeError, Reader,
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
        /// The encrypted body (§6.2), opaque here.
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

fn put_large_blob(out: &mut Vec<u8>, s: &[u8]) {
    let r = put_large(out, s);
    debug_assert!(r.is_ok(), "Large value over 65535 bytes");
    if r.is_err() {
        put_word16(out, 0);
    }
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
                put_large_blob(out, fixed);
                put_large_blob(out, user);
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

    /// The entity-id rule the client enforces (§5.2): `IDS` and `ERR` take any entity;
    /// `PONG`, `PKEY`, `RRES`, `ALLS`, `RNAME` must have none (`HAS_AUTH`); all others need one
    /// (`NO_ENTITY`).
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
