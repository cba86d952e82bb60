//! The recipient's, sender's and notifier's side of a queue, for tests and tools: key pairs of each
//! algorithm, `NEW` in any version's form, the secrets derived from `IDS`/`NID`, and the decryption of
//! `MSG` bodies and `NMSG` metadata (simplexmq `Protocol.hs`; sealing in `Server.hs`).
//!
//! Pure functions over bytes; the caller drives the connection with [`super::Client`].

use rand::RngCore;

use super::{ServerTransmission, Signer};
use crate::crypto::keys::PublicAuthKey;
use crate::crypto::{hash, sxbox};
use crate::protocol::command::{Command, NewLink, NewQueue, NtfCreds, QueueReq, SubMode};
use crate::protocol::encoding::Reader;
use crate::protocol::error::ErrorType;
use crate::protocol::response::{BrokerMsg, QueueIds};

/// The algorithm of a queue authorization key (simplexmq `Crypto.hs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyAlg {
    Ed25519,
    Ed448,
    /// An X25519 key: transmissions carry an authenticator for the server session key (v≥7).
    X25519,
}

pub const ALL_KEY_ALGS: [KeyAlg; 3] = [KeyAlg::Ed25519, KeyAlg::Ed448, KeyAlg::X25519];

/// A fresh private authorization key; its public half is `signer.public_key()`.
pub fn auth_key(alg: KeyAlg) -> Signer {
    let mut rng = rand::rngs::OsRng;
    match alg {
        KeyAlg::Ed25519 => Signer::Ed25519(ed25519_dalek::SigningKey::generate(&mut rng)),
        KeyAlg::Ed448 => {
            let mut sk = [0u8; 57];
            rng.fill_bytes(&mut sk);
            Signer::Ed448(sk)
        }
        KeyAlg::X25519 => {
            let mut sk = [0u8; 32];
            rng.fill_bytes(&mut sk);
            Signer::X25519(sk)
        }
    }
}

/// A fresh X25519 key pair for a DH exchange (the recipient's `rcvDhKey`, the notifier's DH key).
#[derive(Clone)]
pub struct DhKeyPair {
    pub secret: [u8; 32],
    pub public: [u8; 32],
}

impl DhKeyPair {
    pub fn generate() -> Self {
        let mut secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut secret);
        DhKeyPair {
            public: sxbox::x25519_public(&secret),
            secret,
        }
    }

    /// The shared secret with the server's key from `IDS`/`NID` (the server computes the same one).
    pub fn shared(&self, server_public: &[u8; 32]) -> [u8; 32] {
        sxbox::dh(&self.secret, server_public)
    }
}

/// What a recipient needs to create a queue and, later, read it.
#[derive(Clone)]
pub struct RecipientKeys {
    pub auth: Signer,
    pub dh: DhKeyPair,
}

impl RecipientKeys {
    pub fn generate(alg: KeyAlg) -> Self {
        RecipientKeys {
            auth: auth_key(alg),
            dh: DhKeyPair::generate(),
        }
    }
}

/// A notifier's key and DH pair (for `NKEY`, or `NEW`'s notifier credentials at v≥17).
#[derive(Clone)]
pub struct NotifierKeys {
    pub auth: Signer,
    pub dh: DhKeyPair,
}

impl NotifierKeys {
    pub fn generate(alg: KeyAlg) -> Self {
        NotifierKeys {
            auth: auth_key(alg),
            dh: DhKeyPair::generate(),
        }
    }

    pub fn creds(&self) -> NtfCreds {
        NtfCreds {
            key: self.auth.public_key(),
            dh: self.dh.public,
        }
    }

    /// `NKEY notifierKey dhKey`.
    pub fn nkey(&self) -> Command {
        Command::NKey {
            key: self.auth.public_key(),
            dh: self.dh.public,
        }
    }
}

/// `NEW` for these keys: subscribe mode, a messaging queue, no password, no link, no notifier. The
/// client encodes it in the form of its session's version, dropping what that version cannot carry
/// (v6–8 send no mode, v9–14 only the mode, v15–16 no notifier).
pub fn new_queue(keys: &RecipientKeys) -> NewQueue {
    NewQueue {
        rcv_auth_key: keys.auth.public_key(),
        rcv_dh_key: keys.dh.public,
        basic_auth: None,
        sub_mode: SubMode::Subscribe,
        queue_req: Some(QueueReq::Messaging(None)),
        ntf_creds: None,
    }
}

/// The sender ID a client must propose with short-link data: the first 24 bytes of
/// SHA3-384(corrId of the NEW) (simplexmq `Agent.hs`; checked by `Server.hs` at NEW).
pub fn link_sender_id(corr_id: &[u8]) -> Vec<u8> {
    hash::sha3_384(corr_id)[..24].to_vec()
}

/// Short-link data for a NEW sent with `corr_id`.
pub fn new_link(corr_id: &[u8], fixed: &[u8], user: &[u8]) -> NewLink {
    NewLink {
        sender_id: link_sender_id(corr_id),
        fixed: fixed.to_vec(),
        user: user.to_vec(),
    }
}

/// Why a response is not what a helper expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("expected {expected}, got {got}")]
    Unexpected { expected: &'static str, got: String },
    #[error("the body does not decrypt with this secret and nonce")]
    Decrypt,
    #[error("the decrypted body does not parse")]
    Parse,
}

fn unexpected(expected: &'static str, t: &ServerTransmission) -> QueueError {
    QueueError::Unexpected {
        expected,
        got: describe(t),
    }
}

/// A short text form of a server transmission for assertion messages.
pub fn describe(t: &ServerTransmission) -> String {
    match &t.msg {
        Ok(BrokerMsg::Msg { msg_id, .. }) => format!("MSG {}", hex_prefix(msg_id)),
        Ok(BrokerMsg::Ids(ids)) => format!("IDS {}", hex_prefix(&ids.rcv_id)),
        Ok(BrokerMsg::Nmsg { .. }) => "NMSG".to_string(),
        Ok(BrokerMsg::Err(e)) => format!("ERR {e:?}"),
        Ok(m) => format!("{m:?}"),
        Err(raw) => format!("unparsed {:?}", String::from_utf8_lossy(raw)),
    }
}

fn hex_prefix(b: &[u8]) -> String {
    b.iter().take(4).map(|x| format!("{x:02x}")).collect()
}

/// The `IDS` of a NEW response.
pub fn parse_ids(t: &ServerTransmission) -> Result<QueueIds, QueueError> {
    match &t.msg {
        Ok(BrokerMsg::Ids(ids)) => Ok(ids.clone()),
        _ => Err(unexpected("IDS", t)),
    }
}

/// `NID notifierId srvNtfDhKey`.
pub fn parse_nid(t: &ServerTransmission) -> Result<(Vec<u8>, [u8; 32]), QueueError> {
    match &t.msg {
        Ok(BrokerMsg::Nid {
            notifier_id,
            srv_ntf_dh_key,
        }) => Ok((notifier_id.clone(), *srv_ntf_dh_key)),
        _ => Err(unexpected("NID", t)),
    }
}

/// `ERR e` of a response.
pub fn parse_err(t: &ServerTransmission) -> Result<ErrorType, QueueError> {
    match &t.msg {
        Ok(BrokerMsg::Err(e)) => Ok(e.clone()),
        _ => Err(unexpected("ERR", t)),
    }
}

/// A decrypted `MSG` body (simplexmq `Server.hs`, `encryptMsg`; `Protocol.hs`,
/// `clientRcvMsgBodyP`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RcvMsg {
    Message {
        ts: i64,
        notification: bool,
        /// Flag bytes after the notification Bool (reserved; the reference sends none).
        reserved_flags: Vec<u8>,
        body: Vec<u8>,
    },
    /// The quota marker: no more messages were accepted after the one before it.
    Quota { ts: i64 },
}

impl RcvMsg {
    pub fn body(&self) -> Option<&[u8]> {
        match self {
            RcvMsg::Message { body, .. } => Some(body),
            RcvMsg::Quota { .. } => None,
        }
    }

    pub fn ts(&self) -> i64 {
        match self {
            RcvMsg::Message { ts, .. } | RcvMsg::Quota { ts } => *ts,
        }
    }
}

/// A received message: its ID and decrypted content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub msg_id: Vec<u8>,
    pub msg: RcvMsg,
    /// The length of the encrypted body as sent (16122 for the reference: tag + 16106).
    pub enc_len: usize,
}

/// Opens a `MSG` body with the queue's `rcvDhSecret`, nonce = msgId (simplexmq `Server.hs`,
/// `encryptMsg`), and parses it.
pub fn decrypt_msg(
    rcv_dh_secret: &[u8; 32],
    msg_id: &[u8],
    enc_body: &[u8],
) -> Result<RcvMsg, QueueError> {
    let nonce: [u8; 24] = msg_id.try_into().map_err(|_| QueueError::Decrypt)?;
    let plain =
        sxbox::open_padded(rcv_dh_secret, &nonce, enc_body).map_err(|_| QueueError::Decrypt)?;
    parse_rcv_msg(&plain)
}

/// `"QUOTA" SP Int64 ts` | `Int64 ts, msgFlags, SP, body`; the quota form is tried first, as the
/// reference's parser does.
pub fn parse_rcv_msg(plain: &[u8]) -> Result<RcvMsg, QueueError> {
    if let Some(rest) = plain.strip_prefix(b"QUOTA ") {
        let mut r = Reader::new(rest);
        let ts = r.int64().map_err(|_| QueueError::Parse)?;
        r.end().map_err(|_| QueueError::Parse)?;
        return Ok(RcvMsg::Quota { ts });
    }
    let mut r = Reader::new(plain);
    let ts = r.int64().map_err(|_| QueueError::Parse)?;
    let notification = r.bool().map_err(|_| QueueError::Parse)?;
    let rest = r.rest();
    let n = rest
        .iter()
        .position(|&b| b == b' ')
        .ok_or(QueueError::Parse)?;
    Ok(RcvMsg::Message {
        ts,
        notification,
        reserved_flags: rest[..n].to_vec(),
        body: rest[n + 1..].to_vec(),
    })
}

/// The `MSG` of a transmission, decrypted.
pub fn receive(rcv_dh_secret: &[u8; 32], t: &ServerTransmission) -> Result<Received, QueueError> {
    match &t.msg {
        Ok(BrokerMsg::Msg { msg_id, body }) => Ok(Received {
            msg_id: msg_id.clone(),
            msg: decrypt_msg(rcv_dh_secret, msg_id, body)?,
            enc_len: body.len(),
        }),
        _ => Err(unexpected("MSG", t)),
    }
}

/// `NMSG` metadata (simplexmq `Server.hs`, `mkMessageNotification`): which message arrived, and
/// when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NmsgMeta {
    pub msg_id: Vec<u8>,
    pub ts: i64,
}

/// Opens `encNMsgMeta` with `rcvNtfDhSecret` and the NMSG's nonce; extra tail bytes are ignored as
/// receivers do.
pub fn decrypt_nmsg(
    rcv_ntf_dh_secret: &[u8; 32],
    nonce: &[u8; 24],
    enc_meta: &[u8],
) -> Result<NmsgMeta, QueueError> {
    let plain =
        sxbox::open_padded(rcv_ntf_dh_secret, nonce, enc_meta).map_err(|_| QueueError::Decrypt)?;
    let mut r = Reader::new(&plain);
    let msg_id = r.short().map_err(|_| QueueError::Parse)?.to_vec();
    let ts = r.int64().map_err(|_| QueueError::Parse)?;
    Ok(NmsgMeta { msg_id, ts })
}

/// The `NMSG` of a transmission, decrypted.
pub fn receive_nmsg(
    rcv_ntf_dh_secret: &[u8; 32],
    t: &ServerTransmission,
) -> Result<NmsgMeta, QueueError> {
    match &t.msg {
        Ok(BrokerMsg::Nmsg { nonce, enc_meta }) => decrypt_nmsg(rcv_ntf_dh_secret, nonce, enc_meta),
        _ => Err(unexpected("NMSG", t)),
    }
}

/// The public key of a signer, for `KEY`/`SKEY`/`LKEY`/`RKEY`.
pub fn public(s: &Signer) -> PublicAuthKey {
    s.public_key()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::encoding::put_int64;

    #[test]
    fn message_body_round_trip() {
        let secret = [7u8; 32];
        let id = [9u8; 24];
        let mut plain = Vec::new();
        put_int64(&mut plain, 1_700_000_000);
        plain.extend_from_slice(b"T hello world");
        let enc = sxbox::seal_padded(&secret, &id, &plain, 16106).unwrap();
        assert_eq!(enc.len(), 16122);
        let m = decrypt_msg(&secret, &id, &enc).unwrap();
        assert_eq!(
            m,
            RcvMsg::Message {
                ts: 1_700_000_000,
                notification: true,
                reserved_flags: vec![],
                body: b"hello world".to_vec()
            }
        );
        assert_eq!(
            decrypt_msg(&[8u8; 32], &id, &enc),
            Err(QueueError::Decrypt),
            "another secret does not open it"
        );
    }

    #[test]
    fn quota_marker_parses() {
        let mut plain = b"QUOTA ".to_vec();
        put_int64(&mut plain, 42);
        assert_eq!(parse_rcv_msg(&plain), Ok(RcvMsg::Quota { ts: 42 }));
        plain.push(0);
        assert_eq!(parse_rcv_msg(&plain), Err(QueueError::Parse));
    }

    #[test]
    fn nmsg_meta_round_trip() {
        let secret = [3u8; 32];
        let nonce = [4u8; 24];
        let mut meta = vec![24u8];
        meta.extend_from_slice(&[5u8; 24]);
        put_int64(&mut meta, 99);
        let enc = sxbox::seal_padded(&secret, &nonce, &meta, 128).unwrap();
        assert_eq!(
            decrypt_nmsg(&secret, &nonce, &enc),
            Ok(NmsgMeta {
                msg_id: vec![5u8; 24],
                ts: 99
            })
        );
    }

    #[test]
    fn dh_secrets_agree() {
        let a = DhKeyPair::generate();
        let b = DhKeyPair::generate();
        assert_eq!(a.shared(&b.public), b.shared(&a.public));
    }

    #[test]
    fn key_algorithms_give_their_key_types() {
        assert!(matches!(
            auth_key(KeyAlg::Ed25519).public_key(),
            PublicAuthKey::Ed25519(_)
        ));
        assert!(matches!(
            auth_key(KeyAlg::Ed448).public_key(),
            PublicAuthKey::Ed448(_)
        ));
        assert!(matches!(
            auth_key(KeyAlg::X25519).public_key(),
            PublicAuthKey::X25519(_)
        ));
    }
}
