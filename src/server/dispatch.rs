//! The connection's half of a block: decode it and check each transmission in the reference's order
//! (`reference/smp-wire.md` §4.4: block → batch → transmission, session ID (v6), authorization shape,
//! command parse, credential shape), answer what needs no queue, and route the rest to the owners of
//! their queues (`router`). Everything here is synchronous and local to the connection's shard.

use std::collections::BTreeMap;

use super::directory::{Directory, IdSpace};
use super::router::{Mesh, Request, Session};
use crate::protocol::batch::{parse_batch, BatchWriter};
use crate::protocol::command::{check_credentials, parse_command, Command};
use crate::protocol::error::{BrokerError, ErrorType, NameError, ProxyError, TransportError};
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    authorized_bytes, parse_transmission, RawTransmission, TransmissionError,
};
use crate::server::commands::random_id;
use crate::server::owner::encode;

/// A routed block: what the connection answers itself, and the requests for each owner shard.
#[derive(Default)]
pub struct Routed {
    pub local: Vec<Vec<u8>>,
    pub by_owner: BTreeMap<usize, Vec<Request>>,
}

pub struct RouteCtx<'a> {
    pub session: &'a Session,
    pub directory: &'a Directory,
    pub mesh: &'a Mesh,
    /// Whether the client sent a hello key (forwarded commands need the session secret).
    pub has_session_secret: bool,
}

/// Routes the transmissions of one decoded block (`content`), or answers `ERR BLOCK` for a block
/// that is not a batch.
pub fn route_block(ctx: &RouteCtx<'_>, content: Result<&[u8], ()>) -> Routed {
    let mut routed = Routed::default();
    let Ok(content) = content else {
        routed
            .local
            .push(error(ctx.session, b"", b"", ErrorType::Block));
        return routed;
    };
    let Ok(transmissions) = parse_batch(content) else {
        routed
            .local
            .push(error(ctx.session, b"", b"", ErrorType::Block));
        return routed;
    };
    for t in transmissions {
        route_transmission(ctx, t, &mut routed);
    }
    routed
}

fn error(session: &Session, corr_id: &[u8], entity_id: &[u8], e: ErrorType) -> Vec<u8> {
    encode(session, corr_id, entity_id, &BrokerMsg::Err(e))
}

fn route_transmission(ctx: &RouteCtx<'_>, bytes: &[u8], routed: &mut Routed) {
    let session = ctx.session;
    let (v, sid) = (session.version, &session.session_id);
    let t = match parse_transmission(v, bytes) {
        Ok(t) => t,
        Err(TransmissionError::Block) => {
            routed
                .local
                .push(error(session, b"", b"", ErrorType::Block));
            return;
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
            routed.local.push(error(session, &corr_id, b"", e));
            return;
        }
    };
    if let Some(s) = t.session_id {
        if s != &sid[..] {
            routed
                .local
                .push(error(session, t.corr_id, b"", ErrorType::Session));
            return;
        }
    }
    let cmd = match parse_command(v, t.command) {
        Ok(c) => c,
        Err(e) => {
            routed
                .local
                .push(error(session, t.corr_id, t.entity_id, ErrorType::Cmd(e)));
            return;
        }
    };
    if let Err(e) = check_credentials(&cmd, !t.authorization.is_empty(), t.entity_id.is_empty()) {
        routed
            .local
            .push(error(session, t.corr_id, t.entity_id, ErrorType::Cmd(e)));
        return;
    }
    let local = |msg: BrokerMsg, entity: &[u8]| encode(session, t.corr_id, entity, &msg);
    let err = |e: ErrorType| local(BrokerMsg::Err(e), t.entity_id);
    let recipient_id = match &cmd {
        Command::Ping => {
            routed.local.push(local(BrokerMsg::Pong, b""));
            return;
        }
        // Services need a TLS client certificate, which this relay does not ask for yet.
        Command::Subs(_) | Command::NSubs(_) => {
            routed.local.push(err(ErrorType::Service));
            return;
        }
        Command::Prxy { .. } => {
            routed
                .local
                .push(err(ErrorType::Proxy(ProxyError::BasicAuth)));
            return;
        }
        Command::PFwd { .. } => {
            routed
                .local
                .push(err(ErrorType::Proxy(ProxyError::NoSession)));
            return;
        }
        Command::Rslv(_) => {
            routed
                .local
                .push(err(ErrorType::Name(NameError::NoResolver)));
            return;
        }
        Command::RFwd(_) => {
            // Forwarded commands arrive with the private-routing destination role; without a
            // session secret the reference refuses exactly so.
            let e = if ctx.has_session_secret {
                ErrorType::Crypto
            } else {
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Transport(
                    TransportError::NoAuth,
                )))
            };
            routed.local.push(err(e));
            return;
        }
        // The queue's recipient ID is chosen here so that NEW goes to the shard that will own it.
        Command::New(_) => Some(random_id()),
        Command::Send { .. } | Command::SKey(_) => {
            ctx.directory.lookup(IdSpace::Sender, t.entity_id)
        }
        Command::LKey(_) | Command::LGet => ctx.directory.lookup(IdSpace::Link, t.entity_id),
        Command::NSub => ctx.directory.lookup(IdSpace::Notifier, t.entity_id),
        _ => Some(t.entity_id.to_vec()),
    };
    // An unknown ID is dummy-verified on the shard its own hash names: one hop either way.
    let owner = ctx
        .mesh
        .owner_of(recipient_id.as_deref().unwrap_or(t.entity_id));
    routed
        .by_owner
        .entry(owner)
        .or_default()
        .push(request(session, &t, cmd, recipient_id));
}

fn request(
    session: &Session,
    t: &RawTransmission<'_>,
    command: Command,
    recipient_id: Option<Vec<u8>>,
) -> Request {
    Request {
        corr_id: t.corr_id.to_vec(),
        entity_id: t.entity_id.to_vec(),
        recipient_id,
        command,
        authorization: t.authorization.to_vec(),
        service_sig: t.service_sig.is_some(),
        authorized: authorized_bytes(session.version, &session.session_id, t.signed),
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
