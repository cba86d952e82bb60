//! The private-routing destination role (`RFWD` → `RRES`, v8+; `reference/smp-wire.md` §5.5): a
//! proxy forwards a client's sealed transmission; this relay opens it with the session secret and a
//! per-command secret, executes it as the client's own, and seals the answer back the same way.
//!
//! Everything here is pure. Which failures are a plain `ERR` to the proxy and which travel inside
//! `RRES` follows the reference's `processForwardedCommand` (`src/Simplex/Messaging/Server.hs`):
//! - plain `ERR`: no session secret (`PROXY BROKER TRANSPORT NO_AUTH`), the `RFWD` body or the inner
//!   `et` failing to open or unpad (`CRYPTO`), a `FwdTransmission` that does not parse (`CMD
//!   SYNTAX`), a batch of more than one transmission, or an answer too large to pad (`BLOCK`);
//! - inside `RRES`: everything about the inner transmission itself: a batch or transmission that
//!   does not parse (`BLOCK`), its command's parse and credential errors, `CMD PROHIBITED` for
//!   anything but SEND, SKEY, LKEY, LGET and RSLV, verification (`AUTH`, `SERVICE`), and the
//!   command's own answers and errors.

use std::sync::Arc;

use super::router::{Session, SessionInfo};
use crate::crypto::keys::{x25519_from_spki, x25519_to_spki};
use crate::crypto::sxbox::{self, cb_nonce, NONCE_LEN};
use crate::protocol::batch::parse_batch;
use crate::protocol::command::{check_credentials, parse_command, Command};
use crate::protocol::encoding::{put_short_unchecked, put_word16, DecodeError, Reader};
use crate::protocol::error::TransportError;
use crate::protocol::error::{BrokerError, CommandError, ErrorType, NameError, ProxyError};
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    authorized_bytes, encode_server_transmission, parse_transmission, TransmissionError,
};
use crate::protocol::version::{Version, AUTH_CMDS};
use crate::server::owner::encode;

/// The padded length of a forwarded transmission and of its answer (`paddedProxiedTLength`). The
/// largest SEND (16048 bytes, Ed448-signed, v20) in a batch of one fills it exactly.
pub const PADDED_PROXIED_LEN: usize = 16226;

/// `reverseNonce`: the answer's nonce is the request's, bytes reversed (not "+1" as the spec says).
pub fn reverse_nonce(nonce: &[u8; NONCE_LEN]) -> [u8; NONCE_LEN] {
    let mut r = *nonce;
    r.reverse();
    r
}

/// `FwdTransmission`: what a proxy seals for the destination in `RFWD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwdTransmission<'a> {
    /// The client's corrId (24 random bytes); its `cbNonce` seals `et`.
    pub corr_id: &'a [u8],
    pub version: Version,
    /// The client's per-command X25519 key.
    pub key: [u8; 32],
    /// `SXbox(cmdSecret, nonce, pad(batch, 16226))`.
    pub et: &'a [u8],
}

impl<'a> FwdTransmission<'a> {
    /// `shortString corrId ‖ Word16 version ‖ shortString(SPKI key) ‖ Tail et`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_short_unchecked(out, self.corr_id);
        put_word16(out, self.version);
        put_short_unchecked(out, &x25519_to_spki(&self.key));
        out.extend_from_slice(self.et);
    }

    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let corr_id = r.short()?;
        let version = r.word16()?;
        let key = x25519_from_spki(r.short()?).map_err(|_| DecodeError)?;
        let et = r.tail();
        Ok(FwdTransmission {
            corr_id,
            version,
            key,
            et,
        })
    }
}

/// `FwdResponse`: the client's corrId echoed, then the answer sealed for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwdResponse<'a> {
    pub corr_id: &'a [u8],
    /// `SXbox(cmdSecret, reverse(nonce), pad(batch, 16226))`.
    pub r2: &'a [u8],
}

impl<'a> FwdResponse<'a> {
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_short_unchecked(out, self.corr_id);
        out.extend_from_slice(self.r2);
    }

    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let corr_id = r.short()?;
        Ok(FwdResponse {
            corr_id,
            r2: r.tail(),
        })
    }
}

/// What an answer to a forwarded transmission needs: how to seal it for the client and for the
/// proxy, and the session the inner transmission runs in.
pub struct Forwarded {
    /// The `RFWD`'s corrId (`n2`): `RRES` carries it, its reversed `cbNonce` seals `RRES`.
    pub outer_corr_id: Vec<u8>,
    /// The client's corrId from `FwdTransmission`, echoed in `FwdResponse`.
    pub fwd_corr_id: Vec<u8>,
    /// `cbNonce(fwd_corr_id)`; the answer to the client is sealed with its reverse.
    pub nonce: [u8; NONCE_LEN],
    /// X25519(client's per-command key, this connection's server key).
    pub cmd_secret: [u8; 32],
    /// X25519(proxy's hello key, this connection's server key).
    pub sess_secret: [u8; 32],
    /// The proxy connection's session at the forwarded version: the same connection, session ID and
    /// server key (the client signed with the proxy↔relay session ID implied).
    pub inner: Session,
}

/// The inner transmission, checked as far as the connection checks anything (§4.4 steps 1–5 at the
/// forwarded version), with the allowed-command filter on top.
pub struct InnerRequest {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    /// SEND, SKEY, LKEY or LGET.
    pub command: Command,
    pub authorization: Vec<u8>,
    pub service_sig: bool,
    /// Authorized bytes with the proxy↔relay session ID implied.
    pub authorized: Vec<u8>,
}

/// What the connection does with an `RFWD`.
pub enum Decoded {
    /// A plain `ERR` to the proxy, with the `RFWD`'s corrId and an empty entity.
    Plain(ErrorType),
    /// An answer to the client that needs no queue, to be sealed into `RRES`.
    Answer {
        fwd: Box<Forwarded>,
        corr_id: Vec<u8>,
        entity_id: Vec<u8>,
        msg: BrokerMsg,
    },
    /// A command for the owner of its queue; its answer is sealed into `RRES` there.
    Route {
        fwd: Box<Forwarded>,
        request: InnerRequest,
    },
}

fn no_session_secret() -> ErrorType {
    ErrorType::Proxy(ProxyError::Broker(BrokerError::Transport(
        TransportError::NoAuth,
    )))
}

/// Opens and checks an `RFWD` received on `session` (`reference/smp-wire.md` §5.5 step 4).
pub fn decode_rfwd(
    session: &Session,
    session_secret: Option<&[u8; 32]>,
    outer_corr_id: &[u8],
    body: &[u8],
) -> Decoded {
    let Some(sess_secret) = session_secret else {
        return Decoded::Plain(no_session_secret());
    };
    let Ok(fwd_bytes) = sxbox::open(sess_secret, &cb_nonce(outer_corr_id), body) else {
        return Decoded::Plain(ErrorType::Crypto);
    };
    let Ok(ft) = FwdTransmission::parse(&fwd_bytes) else {
        return Decoded::Plain(ErrorType::Cmd(CommandError::Syntax));
    };
    let server_key = session.server_key.to_bytes();
    let cmd_secret = sxbox::dh(&server_key, &ft.key);
    let nonce = cb_nonce(ft.corr_id);
    let Ok(b) = sxbox::open_padded(&cmd_secret, &nonce, ft.et) else {
        return Decoded::Plain(ErrorType::Crypto);
    };
    let inner = Arc::new(SessionInfo {
        conn: session.conn,
        version: ft.version,
        session_id: session.session_id.clone(),
        server_key: session.server_key.clone(),
    });
    let fwd = Box::new(Forwarded {
        outer_corr_id: outer_corr_id.to_vec(),
        fwd_corr_id: ft.corr_id.to_vec(),
        nonce,
        cmd_secret,
        sess_secret: *sess_secret,
        inner,
    });
    let answer = |fwd, corr_id: &[u8], entity_id: &[u8], e| Decoded::Answer {
        fwd,
        corr_id: corr_id.to_vec(),
        entity_id: entity_id.to_vec(),
        msg: BrokerMsg::Err(e),
    };
    // A batch that does not parse is one failed transmission to the reference, answered inside
    // RRES; a batch of several is refused outright.
    let items = match parse_batch(&b) {
        Ok(items) => items,
        Err(_) => return answer(fwd, b"", b"", ErrorType::Block),
    };
    let [item] = items[..] else {
        return Decoded::Plain(ErrorType::Block);
    };
    let v = ft.version;
    // The session ID stays implied whatever the forwarded version: the reference changes only the
    // version of the proxy session's parameters, and that session is v7+ (it has a hello key).
    let layout = v.max(AUTH_CMDS);
    let t = match parse_transmission(layout, item) {
        Ok(t) => t,
        Err(TransmissionError::Block) => return answer(fwd, b"", b"", ErrorType::Block),
        Err(TransmissionError::BadAuthorization { corr_id, .. }) => {
            return answer(fwd, &corr_id, b"", ErrorType::Block)
        }
    };
    let cmd = match parse_command(v, t.command).and_then(|c| {
        check_credentials(&c, !t.authorization.is_empty(), t.entity_id.is_empty()).map(|_| c)
    }) {
        Ok(c) => c,
        Err(e) => return answer(fwd, t.corr_id, t.entity_id, ErrorType::Cmd(e)),
    };
    match cmd {
        Command::Send { .. } | Command::SKey(_) | Command::LKey(_) | Command::LGet => {
            let request = InnerRequest {
                corr_id: t.corr_id.to_vec(),
                entity_id: t.entity_id.to_vec(),
                command: cmd,
                authorization: t.authorization.to_vec(),
                service_sig: t.service_sig.is_some(),
                authorized: authorized_bytes(layout, &session.session_id, t.signed),
            };
            Decoded::Route { fwd, request }
        }
        // The names role is off: RSLV passes the filter and verification (unsigned, no entity)
        // and gets the answer a plain RSLV gets.
        Command::Rslv(_) => answer(
            fwd,
            t.corr_id,
            t.entity_id,
            ErrorType::Name(NameError::NoResolver),
        ),
        _ => answer(
            fwd,
            t.corr_id,
            t.entity_id,
            ErrorType::Cmd(CommandError::Prohibited),
        ),
    }
}

/// The inner answer as the client reads it: encoded at the forwarded version, session ID implied.
fn encode_inner(fwd: &Forwarded, corr_id: &[u8], entity_id: &[u8], msg: &BrokerMsg) -> Vec<u8> {
    let v = fwd.inner.version;
    let mut body = Vec::with_capacity(64);
    msg.encode(v, &mut body);
    let mut t = Vec::with_capacity(body.len() + corr_id.len() + entity_id.len() + 4);
    encode_server_transmission(
        v.max(AUTH_CMDS),
        &fwd.inner.session_id,
        corr_id,
        entity_id,
        &body,
        &mut t,
    );
    t
}

/// The body of `RRES` (§5.5 step 5), or `None` when the answer does not fit the padded length.
pub fn seal_response(
    fwd: &Forwarded,
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &BrokerMsg,
) -> Option<Vec<u8>> {
    let t = encode_inner(fwd, corr_id, entity_id, msg);
    let len = u16::try_from(t.len()).ok()?;
    let mut batch = Vec::with_capacity(t.len() + 3);
    batch.push(1);
    put_word16(&mut batch, len);
    batch.extend_from_slice(&t);
    let r2 = sxbox::seal_padded(
        &fwd.cmd_secret,
        &reverse_nonce(&fwd.nonce),
        &batch,
        PADDED_PROXIED_LEN,
    )
    .ok()?;
    let mut fr = Vec::with_capacity(r2.len() + fwd.fwd_corr_id.len() + 1);
    FwdResponse {
        corr_id: &fwd.fwd_corr_id,
        r2: &r2,
    }
    .encode(&mut fr);
    let n2 = cb_nonce(&fwd.outer_corr_id);
    Some(sxbox::seal(&fwd.sess_secret, &reverse_nonce(&n2), &fr))
}

/// The transmission answering the `RFWD` on the proxy's own session: `RRES` with the `RFWD`'s
/// corrId and an empty entity, or a plain `ERR BLOCK` when the inner answer is too large.
pub fn respond(
    outer: &Session,
    fwd: &Forwarded,
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &BrokerMsg,
) -> Vec<u8> {
    let answer = match seal_response(fwd, corr_id, entity_id, msg) {
        Some(efr) => BrokerMsg::Rres(efr),
        None => BrokerMsg::Err(ErrorType::Block),
    };
    encode(outer, &fwd.outer_corr_id, b"", &answer)
}
