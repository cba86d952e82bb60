//! Answers the transmissions of one block, in the reference's order of checks
//! (`reference/smp-wire.md` §4.4): block → batch → transmission, session id (v6), authorization shape,
//! command parse, credential shape, then the command itself.
//!
//! No queue exists until the queue-protocol issue lands, so every well-formed queue command is
//! answered `ERR AUTH` after a dummy verification with the signature's algorithm, exactly what the
//! reference answers for an unknown queue; the roles this relay does not play yet answer as the
//! reference does with those roles off.

use super::conn::Session;
use crate::crypto::auth::{self, Authorization};
use crate::protocol::batch::{parse_batch, BatchWriter};
use crate::protocol::command::{check_credentials, parse_command, Command};
use crate::protocol::error::{BrokerError, ErrorType, NameError, ProxyError, TransportError};
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    authorized_bytes, encode_server_transmission, parse_transmission, RawTransmission,
    TransmissionError,
};
use crate::transport::block::BLOCK_SIZE;

/// Appends to `out` the encoded response transmissions for one received block, in request order.
pub fn process_block(session: &mut Session, block: &mut [u8; BLOCK_SIZE], out: &mut Vec<Vec<u8>>) {
    let Session {
        codec,
        version,
        session_id,
        ..
    } = session;
    let (v, sid) = (*version, session_id.clone());
    let content = match codec.decode(block) {
        Ok(c) => c,
        Err(_) => {
            out.push(respond(
                v,
                &sid,
                b"",
                b"",
                &BrokerMsg::Err(ErrorType::Block),
            ));
            return;
        }
    };
    let transmissions = match parse_batch(content) {
        Ok(ts) => ts,
        Err(_) => {
            out.push(respond(
                v,
                &sid,
                b"",
                b"",
                &BrokerMsg::Err(ErrorType::Block),
            ));
            return;
        }
    };
    for t in transmissions {
        let resp = process_transmission(session, t);
        out.push(resp);
    }
}

fn respond(
    v: u16,
    session_id: &[u8],
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &BrokerMsg,
) -> Vec<u8> {
    let mut body = Vec::with_capacity(64);
    msg.encode(v, &mut body);
    let mut t = Vec::with_capacity(body.len() + 64);
    encode_server_transmission(v, session_id, corr_id, entity_id, &body, &mut t);
    t
}

fn process_transmission(session: &Session, bytes: &[u8]) -> Vec<u8> {
    let v = session.version;
    let sid = &session.session_id;
    let t = match parse_transmission(v, bytes) {
        Ok(t) => t,
        Err(TransmissionError::Block) => {
            return respond(v, sid, b"", b"", &BrokerMsg::Err(ErrorType::Block));
        }
        Err(TransmissionError::BadAuthorization {
            corr_id,
            session_id,
        }) => {
            // v6 checks the session before the authorization's shape.
            let e = match session_id {
                Some(s) if s != *sid => ErrorType::Session,
                _ => ErrorType::Block,
            };
            return respond(v, sid, &corr_id, b"", &BrokerMsg::Err(e));
        }
    };
    if let Some(s) = t.session_id {
        if s != &sid[..] {
            return respond(v, sid, t.corr_id, b"", &BrokerMsg::Err(ErrorType::Session));
        }
    }
    let reply = |msg: BrokerMsg| respond(v, sid, t.corr_id, t.entity_id, &msg);
    let cmd = match parse_command(v, t.command) {
        Ok(c) => c,
        Err(e) => return reply(BrokerMsg::Err(ErrorType::Cmd(e))),
    };
    if let Err(e) = check_credentials(&cmd, !t.authorization.is_empty(), t.entity_id.is_empty()) {
        return reply(BrokerMsg::Err(ErrorType::Cmd(e)));
    }
    let (entity, msg) = execute(session, &t, cmd);
    respond(v, sid, t.corr_id, entity.unwrap_or(t.entity_id), &msg)
}

/// Runs one well-formed command. Returns the entity to answer with when it differs from the
/// request's (PONG carries an empty one) and the response.
fn execute<'a>(
    session: &Session,
    t: &RawTransmission<'a>,
    cmd: Command,
) -> (Option<&'static [u8]>, BrokerMsg) {
    let auth = Authorization::from_bytes(t.authorization).unwrap_or(Authorization::None);
    let err = |e: ErrorType| (None, BrokerMsg::Err(e));
    match cmd {
        Command::Ping => (Some(b""), BrokerMsg::Pong),
        // Services need a TLS client certificate, which this relay does not ask for yet.
        Command::Subs(_) | Command::NSubs(_) => err(ErrorType::Service),
        Command::Prxy { .. } => err(ErrorType::Proxy(ProxyError::BasicAuth)),
        Command::PFwd { .. } => err(ErrorType::Proxy(ProxyError::NoSession)),
        Command::Rslv(_) => err(ErrorType::Name(NameError::NoResolver)),
        Command::RFwd(_) => {
            // The destination role arrives with the queue protocol; without a session secret the
            // reference refuses in exactly this way, and with one no queue could be reached anyway.
            if session.session_secret.is_none() {
                err(ErrorType::Proxy(ProxyError::Broker(
                    BrokerError::Transport(TransportError::NoAuth),
                )))
            } else {
                err(ErrorType::Crypto)
            }
        }
        Command::New(ref new) => {
            // A service signature outside a service session is refused before any verification.
            if t.service_sig.is_some() {
                return err(ErrorType::Service);
            }
            let authorized = authorized_bytes(session.version, &session.session_id, t.signed);
            let server_key = session.server_key.to_bytes();
            // Proof of possession of the recipient key, as the reference checks it; creation itself
            // is not available until queues exist, which is the answer of a relay with new queues off.
            let _ = auth::verify(
                &new.rcv_auth_key,
                &auth,
                &authorized,
                Some(&server_key),
                t.corr_id,
            );
            err(ErrorType::Auth)
        }
        _ => {
            // Queue commands: the queue cannot exist, so verify against the dummy key of the
            // signature's algorithm (equal time with the wrong-key path) and refuse.
            let authorized = authorized_bytes(session.version, &session.session_id, t.signed);
            let server_key = session.server_key.to_bytes();
            let _ = auth::dummy_verify(&auth, &authorized, Some(&server_key), t.corr_id);
            err(ErrorType::Auth)
        }
    }
}

/// Packs encoded transmissions into block contents: as many per block as fit (`reference/smp-wire.md`
/// §3.2), in order.
pub fn pack(transmissions: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut blocks = Vec::new();
    let mut w = BatchWriter::new();
    for t in transmissions {
        if !w.try_push(t) {
            if !w.is_empty() {
                blocks.push(w.content());
                w.clear();
            }
            // A response too large for a block of its own cannot be produced by this relay; drop
            // it loudly rather than poison the connection.
            if !w.try_push(t) {
                tracing::error!(len = t.len(), "response transmission does not fit a block");
            }
        }
    }
    if !w.is_empty() {
        blocks.push(w.content());
    }
    blocks
}
