//! The connection's half of a block: decode it and check each transmission in the reference's order
//! (simplexmq `Protocol.hs` `tDecodeServer`: block → batch → transmission, session ID (v6),
//! authorization shape, command parse, credential shape), answer what needs no queue, and route the
//! rest to the owners of their queues (`router`). Everything here is synchronous and local to the
//! connection's shard.

use std::collections::BTreeMap;

use crate::protocol::batch::parse_batch;
use crate::protocol::command::{
    check_credentials, parse_command, Command, EntityKind, Party, Runs, ServiceRole, ServiceSubs,
};
use crate::protocol::error::{CommandError, ErrorType};
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    authorized_bytes, parse_transmission, RawTransmission, TransmissionError,
};
use crate::server::directory::{Directory, IdSpace};
use crate::server::forward::{self, Decoded};
use crate::server::mesh::ShardMesh;
use crate::server::owner::commands::random_id;
use crate::server::proxy::ProxyJob;
use crate::server::router::encode;
use crate::server::router::{Request, ServiceCheck, Session};

/// A routed block: what the connection answers itself, and the requests for each owner shard.
#[derive(Default)]
pub struct Routed {
    pub local: Vec<Vec<u8>>,
    pub by_owner: BTreeMap<usize, Vec<Request>>,
    /// PRXY and PFWD, answered by the shard's proxy agent as tasks of their own.
    pub proxied: Vec<ProxyJob>,
    /// SUBS and NSUBS of a service session, answered by tasks of their own (`conn.rs`).
    pub services: Vec<ServiceJob>,
    /// The block is a batch as the reference counts one (two or more transmissions of one
    /// party, recipient or notifier), of the first one's command; and the RSLVs it held.
    pub batch_of: Option<BatchKind>,
    pub rslv: u64,
    /// RRES answers sealed here (a forwarded command answered without its owner).
    pub fwd_answers: u64,
    /// On a directory that caches the store's IDs: the owner requests from the first one whose
    /// ID the cache did not hold to the block's end, in block order, for [`resolve_deferred`].
    pub deferred: Vec<Request>,
}

/// The commands whose batches the reference counts (simplexmq `Server.hs`, `updateBatchStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    Sub,
    Del,
    NDel,
    NSub,
}

/// A verified `SUBS` or `NSUBS`.
pub struct ServiceJob {
    pub corr_id: Vec<u8>,
    pub role: ServiceRole,
    /// The count and hash the client expects (v19); only compared, never trusted.
    pub expected: Option<ServiceSubs>,
}

pub struct RouteCtx<'a> {
    pub session: &'a Session,
    pub directory: &'a Directory,
    pub mesh: &'a ShardMesh,
    /// X25519(server session key, client hello key), when the client sent a hello key: `RFWD`
    /// bodies are sealed with it.
    pub session_secret: Option<[u8; 32]>,
    /// Blocks of this connection whose service signatures are verified one by one after a batch
    /// of them failed (`service_sig_batch`).
    pub service_batch_off: &'a std::cell::Cell<u32>,
}

/// Blocks verified one by one after a failed batch of service signatures: a client sending bad
/// signatures makes at most every `SERVICE_BATCH_OFF_BLOCKS + 1`-th block cost twice.
const SERVICE_BATCH_OFF_BLOCKS: u32 = 8;

/// The service signatures of a block's NEW, SUB and NSUB in a service session, verified as one
/// Ed25519 batch before the block is routed (a block of SUBs that associate their queues carries
/// one per SUB): `Some(true)` at each index the batch vouches for. Empty when the session is no
/// service's, when fewer than two are signed, and when the batch fails (then `service_check`
/// verifies each as before, and the next `SERVICE_BATCH_OFF_BLOCKS` blocks skip the batch).
fn service_sig_batch(ctx: &RouteCtx<'_>, transmissions: &[&[u8]]) -> Vec<Option<bool>> {
    let session = ctx.session;
    let Some(service) = &session.service else {
        return Vec::new();
    };
    let off = ctx.service_batch_off.get();
    if off > 0 {
        ctx.service_batch_off.set(off - 1);
        return Vec::new();
    }
    let v = session.version;
    // (index, authorized bytes, signature) of each signed NEW, SUB and NSUB of the service's role.
    let mut chosen: Vec<(usize, Vec<u8>, [u8; 64])> = Vec::new();
    for (i, bytes) in transmissions.iter().enumerate() {
        let Ok(t) = parse_transmission(v, bytes) else {
            continue;
        };
        let Some(sig) = t.service_sig.and_then(|s| <[u8; 64]>::try_from(s).ok()) else {
            continue;
        };
        let Ok(cmd) = parse_command(v, t.command) else {
            continue;
        };
        let role_ok = cmd
            .facts()
            .party
            .service_role()
            .is_none_or(|r| r == service.role);
        if role_ok && matches!(cmd, Command::New(_) | Command::Sub | Command::NSub) {
            chosen.push((i, authorized_bytes(v, &session.session_id, t.signed), sig));
        }
    }
    if chosen.len() < 2 {
        return Vec::new();
    }
    let items: Vec<crate::crypto::ed25519::Item> = chosen
        .iter()
        .map(|(_, msg, sig)| crate::crypto::ed25519::Item {
            key: &service.key,
            msg,
            sig,
        })
        .collect();
    if !crate::crypto::auth::ed25519_verify_batch(&items) {
        ctx.service_batch_off.set(SERVICE_BATCH_OFF_BLOCKS);
        return Vec::new();
    }
    let mut vouched = vec![None; transmissions.len()];
    for (i, _, _) in chosen {
        vouched[i] = Some(true);
    }
    vouched
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
    let vouched = service_sig_batch(ctx, &transmissions);
    let mut parsed: Vec<(Party, Option<BatchKind>)> = Vec::new();
    for (i, t) in transmissions.into_iter().enumerate() {
        let batch_signed = vouched.get(i).copied().flatten() == Some(true);
        parsed.extend(route_transmission(ctx, t, batch_signed, &mut routed));
    }
    if let [(party, kind), rest @ ..] = &parsed[..] {
        let batch_party = matches!(party, Party::Recipient | Party::Notifier);
        if batch_party && !rest.is_empty() && rest.iter().all(|(p, _)| p == party) {
            routed.batch_of = *kind;
        }
    }
    routed
}

fn error(session: &Session, corr_id: &[u8], entity_id: &[u8], e: ErrorType) -> Vec<u8> {
    encode(session, corr_id, entity_id, &BrokerMsg::Err(e))
}

/// `batch_signed`: the block's batch verified this transmission's service signature. Returns the
/// party of a transmission that parsed and passed the credential check (and its batch kind).
fn route_transmission(
    ctx: &RouteCtx<'_>,
    bytes: &[u8],
    batch_signed: bool,
    routed: &mut Routed,
) -> Option<(Party, Option<BatchKind>)> {
    let session = ctx.session;
    let (v, sid) = (session.version, &session.session_id);
    let t = match parse_transmission(v, bytes) {
        Ok(t) => t,
        Err(TransmissionError::Block) => {
            routed
                .local
                .push(error(session, b"", b"", ErrorType::Block));
            return None;
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
            return None;
        }
    };
    if let Some(s) = t.session_id {
        if s != &sid[..] {
            routed
                .local
                .push(error(session, t.corr_id, b"", ErrorType::Session));
            return None;
        }
    }
    let cmd = match parse_command(v, t.command) {
        Ok(c) => c,
        Err(e) => {
            routed
                .local
                .push(error(session, t.corr_id, t.entity_id, ErrorType::Cmd(e)));
            return None;
        }
    };
    if let Err(e) = check_credentials(&cmd, !t.authorization.is_empty(), t.entity_id.is_empty()) {
        routed
            .local
            .push(error(session, t.corr_id, t.entity_id, ErrorType::Cmd(e)));
        return None;
    }
    let kind = match cmd {
        Command::Sub => Some(BatchKind::Sub),
        Command::Del => Some(BatchKind::Del),
        Command::NDel => Some(BatchKind::NDel),
        Command::NSub => Some(BatchKind::NSub),
        _ => None,
    };
    let parsed = Some((cmd.party(), kind));
    if matches!(cmd, Command::Rslv(_)) {
        routed.rslv += 1;
    }
    let local = |msg: BrokerMsg, entity: &[u8]| encode(session, t.corr_id, entity, &msg);
    let facts = cmd.facts();
    let mut authorized = authorized_bytes(session.version, &session.session_id, t.signed);
    let service = service_check(session, &cmd, t.service_sig, batch_signed, &mut authorized);
    // Commands without a queue meet the role check here; the owner answers the rest after their
    // lookup, as the reference orders it.
    if service == ServiceCheck::Prohibited && facts.runs != Runs::Owner {
        routed.local.push(local(
            BrokerMsg::Err(ErrorType::Cmd(CommandError::Prohibited)),
            t.entity_id,
        ));
        return parsed;
    }
    match facts.runs {
        Runs::Owner => {}
        Runs::Connection if matches!(cmd, Command::Subs(_) | Command::NSubs(_)) => {
            match service_subs(session, &cmd, &t, service, &authorized) {
                Ok(job) => routed.services.push(job),
                Err(e) => routed.local.push(local(BrokerMsg::Err(e), t.entity_id)),
            }
            return parsed;
        }
        Runs::Connection => {
            // PING is answered without its entity ID, as the reference answers it.
            let entity = if matches!(cmd, Command::Ping) {
                &b""[..]
            } else {
                t.entity_id
            };
            routed.local.push(local(
                crate::server::owner::commands::connection::answer(&cmd),
                entity,
            ));
            return parsed;
        }
        Runs::Proxy => {
            routed.proxied.push(ProxyJob {
                corr_id: t.corr_id.to_vec(),
                entity_id: t.entity_id.to_vec(),
                command: cmd,
            });
            return parsed;
        }
        // Private routing, destination role (`commands/forward.rs`): plain errors and answers that need
        // no queue are sealed here; the rest goes to the queue's owner, which seals its answer.
        Runs::Forwarded => {
            if let Command::RFwd(body) = &cmd {
                route_forwarded(ctx, t.corr_id, body, routed);
            }
            return parsed;
        }
    }
    to_owner(ctx, routed, request(&t, cmd, service, authorized));
    parsed
}

/// Routes a request to the owner of its queue, or defers it: on a directory that caches the
/// store's IDs, a request whose ID the cache does not hold waits for [`resolve_deferred`], and so
/// does every owner request after it in the block, so that an owner gets them in block order.
fn to_owner(ctx: &RouteCtx<'_>, routed: &mut Routed, mut req: Request) {
    let kind = req.command.facts().entity;
    if routed.deferred.is_empty() {
        req.recipient_id = resolve(ctx, kind, &req.entity_id);
        let missed =
            req.recipient_id.is_none() && ctx.directory.is_cache() && IdSpace::of(kind).is_some();
        if !missed {
            route_resolved(ctx, routed, req);
            return;
        }
    }
    routed.deferred.push(req);
}

/// Puts a request whose recipient ID is resolved (or known to be absent) in its owner's part.
fn route_resolved(ctx: &RouteCtx<'_>, routed: &mut Routed, req: Request) {
    // An unknown ID is dummy-verified on the shard its own hash names: one hop either way.
    let owner = ctx
        .mesh
        .owner_of(req.recipient_id.as_deref().unwrap_or(&req.entity_id));
    routed.by_owner.entry(owner).or_default().push(req);
}

/// The second step of a block whose IDs the directory's cache did not all hold: the store looks
/// up the missing IDs, one statement per ID space, while the connection reads nothing more
/// (its blocks stay in order); then the deferred requests go to their owners in block order. A
/// look-up that fails answers its requests `ERR STORE`, as a failed store operation is answered.
pub async fn resolve_deferred(ctx: &RouteCtx<'_>, routed: &mut Routed) {
    let deferred = std::mem::take(&mut routed.deferred);
    let mut failed: Vec<(IdSpace, String)> = Vec::new();
    for space in [IdSpace::Sender, IdSpace::Link, IdSpace::Notifier] {
        let mut ids: Vec<Vec<u8>> = deferred
            .iter()
            .filter(|r| IdSpace::of(r.command.facts().entity) == Some(space))
            .map(|r| r.entity_id.clone())
            .collect();
        if ids.is_empty() {
            continue;
        }
        ids.sort_unstable();
        ids.dedup();
        if let Err(e) = ctx.directory.fetch(space, ids).await {
            tracing::warn!(error = %e, "looking up the IDs of a block");
            failed.push((space, e));
        }
    }
    for mut req in deferred {
        let kind = req.command.facts().entity;
        req.recipient_id = resolve(ctx, kind, &req.entity_id);
        let failure = IdSpace::of(kind)
            .filter(|_| req.recipient_id.is_none())
            .and_then(|space| failed.iter().find(|(s, _)| *s == space));
        match failure {
            Some((_, e)) => {
                let msg = BrokerMsg::Err(ErrorType::Store(e.clone()));
                let t = match &req.forward {
                    Some(fwd) => {
                        let (t, sealed) =
                            forward::respond(ctx.session, fwd, &req.corr_id, &req.entity_id, &msg);
                        routed.fwd_answers += u64::from(sealed);
                        t
                    }
                    None => encode(ctx.session, &req.corr_id, &req.entity_id, &msg),
                };
                routed.local.push(t);
            }
            None => route_resolved(ctx, routed, req),
        }
    }
}

/// `SUBS`/`NSUBS` need a service session whose service key signed them (Ed25519), no service
/// signature, and the service ID as entity; anything else is `ERR SERVICE` (simplexmq
/// `Server.hs`, `verifyServiceCmd`).
fn service_subs(
    session: &Session,
    cmd: &Command,
    t: &RawTransmission<'_>,
    service: ServiceCheck,
    authorized: &[u8],
) -> Result<ServiceJob, ErrorType> {
    let (role, expected) = match cmd {
        Command::Subs(e) => (ServiceRole::Messaging, *e),
        Command::NSubs(e) => (ServiceRole::Notifier, *e),
        _ => return Err(ErrorType::Internal),
    };
    let s = session.service.as_ref().ok_or(ErrorType::Service)?;
    let signed = <&[u8; 64]>::try_from(t.authorization)
        .is_ok_and(|sig| crate::crypto::auth::ed25519_verify(&s.key, authorized, sig));
    if service != ServiceCheck::Plain || t.entity_id != &s.service_id[..] || !signed {
        return Err(ErrorType::Service);
    }
    Ok(ServiceJob {
        corr_id: t.corr_id.to_vec(),
        role,
        expected,
    })
}

/// The service checks the connection can make (`ServiceCheck`): the role, and for NEW, SUB and
/// NSUB of a service session the service signature, after which the queue key is checked over
/// the certificate hash and the authorized bytes (simplexmq `Server.hs`, `verifyServiceSig`, and
/// `Protocol.hs`, `useServiceAuth`). Outside service sessions any service signature is refused.
fn service_check(
    session: &Session,
    cmd: &Command,
    service_sig: Option<&[u8]>,
    batch_signed: bool,
    authorized: &mut Vec<u8>,
) -> ServiceCheck {
    let Some(service) = &session.service else {
        return match service_sig {
            Some(_) => ServiceCheck::Refused,
            None => ServiceCheck::Plain,
        };
    };
    if cmd
        .facts()
        .party
        .service_role()
        .is_some_and(|r| r != service.role)
    {
        return ServiceCheck::Prohibited;
    }
    if !matches!(cmd, Command::New(_) | Command::Sub | Command::NSub) {
        return match service_sig {
            Some(_) => ServiceCheck::Refused,
            None => ServiceCheck::Plain,
        };
    }
    let signed = batch_signed
        || service_sig
            .and_then(|sig| <&[u8; 64]>::try_from(sig).ok())
            .is_some_and(|sig| crate::crypto::auth::ed25519_verify(&service.key, authorized, sig));
    if !signed {
        return ServiceCheck::Refused;
    }
    let mut with_hash = Vec::with_capacity(32 + authorized.len());
    with_hash.extend_from_slice(&service.cert_hash);
    with_hash.extend_from_slice(authorized);
    *authorized = with_hash;
    ServiceCheck::Signed
}

/// Routes the transmission inside an `RFWD` (SEND and SKEY by sender ID, LKEY and LGET by link ID,
/// as the plain path does), or answers the proxy at once.
fn route_forwarded(ctx: &RouteCtx<'_>, corr_id: &[u8], body: &[u8], routed: &mut Routed) {
    let session = ctx.session;
    match forward::decode_rfwd(session, ctx.session_secret.as_ref(), corr_id, body) {
        Decoded::Plain(e) => routed.local.push(error(session, corr_id, b"", e)),
        Decoded::Answer {
            fwd,
            corr_id,
            entity_id,
            msg,
        } => {
            // A forwarded RSLV is refused here as a plain one is, and counted likewise.
            if msg
                == BrokerMsg::Err(ErrorType::Name(
                    crate::protocol::error::NameError::NoResolver,
                ))
            {
                routed.rslv += 1;
            }
            let (t, sealed) = forward::respond(session, &fwd, &corr_id, &entity_id, &msg);
            routed.fwd_answers += u64::from(sealed);
            routed.local.push(t)
        }
        Decoded::Route { fwd, request: r } => {
            to_owner(
                ctx,
                routed,
                Request {
                    corr_id: r.corr_id,
                    entity_id: r.entity_id,
                    recipient_id: None,
                    command: r.command,
                    authorization: r.authorization,
                    // The forwarded session is never a service's (simplexmq `Server.hs`,
                    // `processForwardedCommand`), so any service signature is refused.
                    service: if r.service_sig {
                        ServiceCheck::Refused
                    } else {
                        ServiceCheck::Plain
                    },
                    authorized: r.authorized,
                    forward: Some(fwd),
                    batch_verified: None,
                    pre_verified: None,
                    undelivered: None,
                    associated: false,
                },
            );
        }
    }
}

/// The recipient ID an entity ID names, by the ID space its command addresses (`EntityKind`);
/// `None` when no queue has it. NEW's recipient ID is chosen here, so that NEW goes to the shard
/// that will own the queue.
fn resolve(ctx: &RouteCtx<'_>, kind: EntityKind, entity_id: &[u8]) -> Option<Vec<u8>> {
    match kind {
        EntityKind::NewQueue => Some(random_id()),
        EntityKind::Sender => ctx.directory.lookup(IdSpace::Sender, entity_id),
        EntityKind::Link => ctx.directory.lookup(IdSpace::Link, entity_id),
        EntityKind::Notifier => ctx.directory.lookup(IdSpace::Notifier, entity_id),
        EntityKind::Recipient => Some(entity_id.to_vec()),
        EntityKind::None | EntityKind::Service | EntityKind::ProxySession => None,
    }
}

/// A request of the block, its recipient ID not yet resolved (`to_owner`).
fn request(
    t: &RawTransmission<'_>,
    command: Command,
    service: ServiceCheck,
    authorized: Vec<u8>,
) -> Request {
    Request {
        corr_id: t.corr_id.to_vec(),
        entity_id: t.entity_id.to_vec(),
        recipient_id: None,
        command,
        authorization: t.authorization.to_vec(),
        service,
        authorized,
        forward: None,
        batch_verified: None,
        pre_verified: None,
        undelivered: None,
        associated: false,
    }
}
