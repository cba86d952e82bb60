//! One client connection, from the first TLS byte to the last block: TLS with the tls-unique
//! extraction, the SMP handshake (simplexmq `Transport.hs`), then two tasks: a reader that decodes
//! blocks and routes their transmissions to the owners of their queues, and a writer that sends
//! what owners answer, packed into as few blocks as fit. At most `MAX_BLOCKS_IN_FLIGHT` blocks are
//! being answered at once; beyond that the reader stops reading the socket
//! (`docs/ARCHITECTURE.md` §4). On a WebSocket port the same session runs after an HTTP upgrade;
//! only how a block is read and written differs (`ws::Framing`, `server/conn/ws.rs`).

pub mod accept;
pub mod dispatch;
pub mod output;
mod services;
pub mod tls_stream;
pub mod ws;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use rand::rngs::OsRng;
use tracing::Instrument;
use x25519_dalek::{PublicKey as X25519Public, StaticSecret};

use super::router::{ConnRef, Group, GroupKind, ServiceSession, SessionInfo};
use crate::crypto::keys::PublicAuthKey;
use crate::crypto::{signed_key, sxbox};
use crate::limits::{MAX_BLOCKS_IN_FLIGHT, SLOW_READER_MIN_PROGRESS_BYTES, WS_UPGRADE_MAX_BYTES};
use crate::protocol::batch;
use crate::protocol::command::{Command, ServiceRole};
use crate::protocol::error::{HandshakeError, TransportError};
use crate::protocol::handshake::{
    encode_chain, CertChainPubKey, ClientHello, ClientService, ServerHello, ServiceResponse,
};
use crate::protocol::pad;
use crate::protocol::version::{self, VersionRange, SERVER_VERSIONS};
use crate::server::messages::OwnerMsg;
use crate::server::shard::admission::Handshaking;
use crate::server::shard::context::ShardContext;
use crate::store::services::ServiceRec;
use crate::transport::block::{BlockCodec, BLOCK_SIZE};
use crate::transport::service_cert;
use crate::transport::tls::alpn_versions;
use crate::transport::websocket::CHALLENGE_BYTES;
use dispatch::RouteCtx;
use output::{ask_again, coalesce, ConnHandle, Output, OutputState, MAX_COALESCED_OUTPUTS};
use tls_stream::{SharedTls, TlsStream};
use ws::{Framing, PortKind, WsError};

/// Why a connection ended; logged at debug level, never sent to the client.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("timed out during {0}")]
    Timeout(&'static str),
    #[error("SMP handshake: {0}")]
    Handshake(&'static str),
    #[error("the client did not read its output for too long")]
    SlowReader,
    #[error("{0}")]
    WebSocket(WsError),
}

impl From<accept::AcceptError> for ConnError {
    fn from(e: accept::AcceptError) -> Self {
        match e {
            accept::AcceptError::Io(e) => ConnError::Io(e),
            accept::AcceptError::Tls(e) => ConnError::Tls(e),
        }
    }
}

impl From<WsError> for ConnError {
    fn from(e: WsError) -> Self {
        match e {
            WsError::Io(e) => ConnError::Io(e),
            e => ConnError::WebSocket(e),
        }
    }
}

/// How a web client's first request on a shared port was answered.
enum Upgrade {
    /// As a WebSocket upgrade: the request's identity challenge, if any.
    Done(Option<[u8; CHALLENGE_BYTES]>),
    /// Not at all yet: it asks for a page of the site (its head, read).
    Page(Option<Vec<u8>>),
}

/// What the SMP handshake settled for the rest of the session.
pub struct Handshake {
    pub info: Arc<SessionInfo>,
    /// X25519(server key, client hello key), kept whenever the client sent a key: block encryption
    /// and forwarded commands (RFWD) both need it.
    pub session_secret: Option<[u8; 32]>,
    pub proxy_server: bool,
    pub codec: BlockCodec,
}

/// Blocks being answered: their count is the semaphore's taken permits; the parts still missing of
/// each block are counted here.
struct InFlight {
    permits: Semaphore,
    parts: RefCell<HashMap<u64, usize>>,
}

/// Serves an accepted connection; `handshaking` counts it against its address until its SMP
/// handshake is over (`admission`).
pub async fn serve(
    sock: TcpStream,
    ctx: Rc<ShardContext>,
    handshaking: Handshaking,
    kind: PortKind,
) {
    // Canonical: an IPv4 client of the dual-stack listener is logged as IPv4.
    let peer = sock
        .peer_addr()
        .ok()
        .map(|a| std::net::SocketAddr::new(a.ip().to_canonical(), a.port()));
    // Every debug line of the connection names its peer (`SMP_RELAY_LOG=debug`).
    let span = tracing::debug_span!("conn", peer = ?peer);
    async {
        match run(sock, &ctx, handshaking, kind).await {
            Ok(()) => tracing::debug!("connection closed"),
            Err(e) => tracing::debug!(error = %e, "connection ended"),
        }
    }
    .instrument(span)
    .await
}

async fn run(
    mut sock: TcpStream,
    ctx: &Rc<ShardContext>,
    handshaking: Handshaking,
    kind: PortKind,
) -> Result<(), ConnError> {
    // Small handshake blocks would otherwise wait for delayed ACKs.
    sock.set_nodelay(true)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let setup_deadline = Instant::now() + ctx.config.tls_timeout;
    let (tls_config, web) = match kind {
        PortKind::Smp => (&ctx.tls.smp, None),
        PortKind::WebSocket => (&ctx.tls.websocket, None),
        PortKind::Shared => (&ctx.tls.smp, ctx.tls.web.as_ref()),
    };
    let (conn, session_id) = timed(ctx.config.tls_timeout, "TLS setup", async {
        accept::tls_accept(&mut sock, &ctx.read_scratch, tls_config, web)
            .await
            .map_err(ConnError::from)
    })
    .await?;
    // On a shared port a client that named a host was given the web certificate: it is a web
    // client, a browser loading the site or speaking WebSocket from here (`AcceptState::with_web`).
    let web_client = kind == PortKind::Shared && conn.server_name().is_some();
    let kind = match kind {
        PortKind::Shared if web_client => PortKind::WebSocket,
        PortKind::Shared => PortKind::Smp,
        other => other,
    };
    // A WebSocket session offers every version: its ALPN is `http/1.1` (or none), which says
    // nothing of the SMP client's age; the raw-TLS rule (`alpn_versions`) is for native clients.
    let versions = match kind {
        PortKind::Smp | PortKind::Shared => alpn_versions(conn.alpn_protocol()),
        PortKind::WebSocket => SERVER_VERSIONS,
    };
    let tls: SharedTls = Rc::new(RefCell::new(TlsStream::new(
        sock,
        conn,
        ctx.read_scratch.clone(),
    )));
    let framing = Framing::for_port(kind);
    let mut challenge = None;
    if kind == PortKind::WebSocket {
        // The upgrade shares the TLS deadline, as the reference's TLS setup timeout covers it
        // (simplexmq `src/Simplex/Messaging/Transport/Server.hs`, `runTransportServerSocketState_`).
        let left = setup_deadline.saturating_duration_since(Instant::now());
        let upgraded = timed(left, "WebSocket upgrade", async {
            // A shared port's web client with a site to serve asks either for the site or for a
            // WebSocket: its first request says which.
            if !(web_client && ctx.site.is_some()) {
                return Ok(Upgrade::Done(ws::upgrade(&tls).await?));
            }
            let head = ws::read_head(&tls, WS_UPGRADE_MAX_BYTES).await?;
            let page = head
                .as_deref()
                .is_some_and(|h| crate::web::http::parse(h).is_ok_and(|r| !r.websocket));
            match page {
                true => Ok(Upgrade::Page(head)),
                false => Ok(Upgrade::Done(ws::answer_upgrade(&tls, head).await?)),
            }
        })
        .await;
        let upgraded = match upgraded {
            Ok(Upgrade::Done(c)) => Ok(c),
            Ok(Upgrade::Page(head)) => {
                // A page of the site: no SMP handshake follows, so the address may start others.
                drop(handshaking);
                let result = super::web::serve_tls(&tls, ctx, Some(head)).await;
                tls_stream::close(&tls).await;
                return result.map_err(ConnError::Io);
            }
            Err(e) => Err(e),
        };
        match upgraded {
            Ok(c) => challenge = c,
            Err(e) => {
                tls_stream::close(&tls).await;
                return Err(e);
            }
        }
    }
    let conn_ref = ConnRef {
        shard: ctx.shard_id,
        id: ctx.next_conn_id(),
    };
    let handshake = timed(
        ctx.config.handshake_timeout,
        "SMP handshake",
        smp_handshake(
            &tls, &framing, ctx, versions, session_id, challenge, conn_ref,
        ),
    )
    .await;
    // Done with the handshake, well or not: the address may start another.
    drop(handshaking);
    let handshake = match handshake {
        Ok(h) => h,
        Err(e) => {
            ws::queue_close(&tls, &framing);
            tls_stream::close(&tls).await;
            return Err(e);
        }
    };
    tracing::debug!(
        conn = conn_ref.id,
        version = handshake.info.version,
        web = matches!(framing, Framing::WebSocket(_)),
        service = handshake.info.service.is_some(),
        "connection open"
    );
    let result = session(ctx, &tls, &framing, handshake).await;
    ws::queue_close(&tls, &framing);
    tls_stream::close(&tls).await;
    result
}

/// The established session: reader and writer until either ends.
async fn session(
    ctx: &Rc<ShardContext>,
    tls: &SharedTls,
    framing: &Framing,
    hs: Handshake,
) -> Result<(), ConnError> {
    let Handshake {
        info,
        session_secret,
        codec,
        ..
    } = hs;
    let conn = info.conn;
    let codec = RefCell::new(codec);
    let (out_tx, out_rx) = local_channel::new_unbounded::<Output>();
    let out_tx = Rc::new(out_tx);
    let state = Rc::new(OutputState::new(ctx.config.output_limits));
    ctx.connections_table.borrow_mut().insert(
        conn.id,
        ConnHandle {
            out: out_tx.clone(),
            state: state.clone(),
            session_id: info.session_id.clone(),
            created_at: crate::clock::now_secs(),
        },
    );
    let in_flight = InFlight {
        permits: Semaphore::new(MAX_BLOCKS_IN_FLIGHT as u64),
        parts: RefCell::new(HashMap::new()),
    };
    if info.service.is_some() {
        ctx.directory.service_conn_opened(conn.shard, conn.id);
    }
    let sent_to = Cell::new(0u64);
    let reader = async {
        let r = read_loop(
            ctx,
            tls,
            framing,
            &info,
            session_secret,
            &codec,
            &in_flight,
            &out_tx,
            &state,
            &sent_to,
        )
        .await;
        // Let the answers to what was read go out before closing (a client may half-close).
        let drained = in_flight.permits.acquire(MAX_BLOCKS_IN_FLIGHT as u64);
        let _ = futures_lite::future::or(async { drained.await.map_err(|_| ()) }, async {
            glommio::timer::Timer::new(Duration::from_secs(5)).await;
            Err(())
        })
        .await;
        r
    };
    let writer = write_loop(ctx, conn, tls, framing, &codec, &in_flight, &state, &out_rx);
    let result = futures_lite::future::or(reader, writer).await;
    if matches!(result, Err(ConnError::SlowReader)) {
        ctx.conn_stats.count(|c| c.slow_reader_closes += 1);
    }
    ctx.connections_table.borrow_mut().remove(&conn.id);
    ctx.directory.service_conn_closed(conn.shard, conn.id);
    // Notifications still waiting for the socket go back to their owners, to be stored for the
    // next NSUB (the connection is out of the table, so nothing more is sent to this channel).
    while let Some(Some(o)) = futures_lite::future::poll_once(out_rx.recv()).await {
        ctx.return_ntfs(o.groups);
    }
    // Owners drop this connection's subscriptions; only shards it sent work to hold any, but a
    // service connection may have been made its service's subscriber on every owner
    // (`OwnerMsg::ServiceSwitch`, sent by the service's home shard), shards it never sent work to
    // included. (A switch that reaches an owner after this `Closed` finds the connection gone
    // from the directory's live services and installs nothing.)
    let all = info.service.is_some();
    for shard in 0..ctx.mesh.shards() {
        if all || sent_to.get() & (1u64 << (shard % 64)) != 0 {
            ctx.mesh.send(shard, OwnerMsg::Closed { conn });
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn read_loop(
    ctx: &Rc<ShardContext>,
    tls: &SharedTls,
    framing: &Framing,
    info: &Arc<SessionInfo>,
    session_secret: Option<[u8; 32]>,
    codec: &RefCell<BlockCodec>,
    in_flight: &InFlight,
    out: &Rc<LocalSender<Output>>,
    state: &Rc<OutputState>,
    sent_to: &Cell<u64>,
) -> Result<(), ConnError> {
    // PRXY/PFWD of this connection being answered at once (`[PROXY] client_concurrency`).
    let proxy_slots = Rc::new(Semaphore::new(
        ctx.config.settings.proxy.client_concurrency as u64,
    ));
    let service_batch_off = Cell::new(0);
    let route_ctx = RouteCtx {
        session: info,
        directory: &ctx.directory,
        mesh: &ctx.mesh,
        session_secret,
        service_batch_off: &service_batch_off,
    };
    let mut seq: u64 = 0;
    // The roles this connection's service subscribed in (SUBS, NSUBS), with what it was answered.
    let subscribed: Rc<RefCell<HashSet<ServiceRole>>> = Rc::default();
    loop {
        in_flight
            .permits
            .acquire(1)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        // Allocated per block, so that an idle connection holds no block buffer.
        let mut block = Vec::new();
        let read = ws::read_block(tls, framing, &mut block, Some(out)).await;
        state.last_active.set(Instant::now());
        let block: Result<&mut [u8; BLOCK_SIZE], ConnError> = match read {
            Ok(()) => (&mut block[..])
                .try_into()
                .map_err(|_| ConnError::Handshake("short block")),
            Err(e) => Err(e.into()),
        };
        let block = match block {
            Ok(b) => b,
            Err(e) => {
                // No block to answer: give its permit back, or the drain after the loop (every
                // permit back) waits for it in vain until its 5 s bound, and a closed connection
                // keeps its place, subscriptions and memory that long.
                in_flight.permits.signal(1);
                return Err(e);
            }
        };
        let mut routed = {
            let mut codec = codec.borrow_mut();
            let content = codec.decode(block).map_err(|_| ());
            dispatch::route_block(&route_ctx, content)
        };
        if !routed.deferred.is_empty() {
            dispatch::resolve_deferred(&route_ctx, &mut routed).await;
        }
        count_block(&ctx.conn_stats, &routed);
        seq += 1;
        let parts = routed.by_owner.len()
            + usize::from(!routed.local.is_empty())
            + routed.proxied.len()
            + routed.services.len();
        in_flight.parts.borrow_mut().insert(seq, parts);
        if !routed.local.is_empty() {
            let _ = out.try_send(Output {
                groups: state.admit(vec![Group::plain(routed.local)], false).kept,
                block_seq: Some(seq),
            });
        }
        for job in routed.proxied {
            let slot = proxy_slots
                .clone()
                .acquire_static_permit(1)
                .await
                .map_err(|e| io::Error::other(e.to_string()))?;
            let (ctx, info, out, state) = (ctx.clone(), info.clone(), out.clone(), state.clone());
            glommio::spawn_local(async move {
                let (entity, msg) = ctx.proxy.handle(&info, &job).await;
                let t = super::router::encode(&info, &job.corr_id, &entity, &msg);
                let _ = out.try_send(Output {
                    groups: state.admit(vec![Group::plain(vec![t])], false).kept,
                    block_seq: Some(seq),
                });
                drop(slot);
            })
            .detach();
        }
        for job in routed.services {
            // Every owner may now hold something of this connection's.
            sent_to.set(u64::MAX);
            let (ctx, info, out, state) = (ctx.clone(), info.clone(), out.clone(), state.clone());
            let subscribed = subscribed.clone();
            glommio::spawn_local(async move {
                services::subscribe_service(&ctx, &info, &subscribed, job, &out, &state, seq).await;
            })
            .detach();
        }
        for (shard, mut requests) in routed.by_owner {
            mark_undelivered_acks(state, &mut requests);
            sent_to.set(sent_to.get() | (1u64 << (shard % 64)));
            ctx.mesh.send(
                shard,
                OwnerMsg::Work {
                    session: info.clone(),
                    block_seq: seq,
                    requests,
                },
            );
        }
    }
}

/// An ACK for a queue whose MSG this connection dropped unsent carries that delivery, so that
/// the owner answers it as the reference does a message not yet queued for sending (`NO_MSG`)
/// instead of deleting a message the client never got.
fn mark_undelivered_acks(state: &OutputState, requests: &mut [super::router::Request]) {
    if state.pending.borrow().is_empty() {
        return;
    }
    for r in requests.iter_mut() {
        if matches!(r.command, Command::Ack(_)) && r.forward.is_none() {
            r.undelivered = state.held_delivery(&r.entity_id);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_loop(
    ctx: &ShardContext,
    conn: ConnRef,
    tls: &SharedTls,
    framing: &Framing,
    codec: &RefCell<BlockCodec>,
    in_flight: &InFlight,
    state: &OutputState,
    out: &LocalReceiver<Output>,
) -> Result<(), ConnError> {
    let slow_reader_close = ctx.config.slow_reader_close;
    let slow_reader_tick = ctx.config.test.slow_reader_tick;
    while let Some(first) = out.recv().await {
        if state.doomed.get() {
            return Err(ConnError::SlowReader);
        }
        // Whatever else is already waiting goes out with it: small answers and events of several
        // outputs share blocks (an NMSG stream, ACK answers, ENDs), in their order.
        let mut items = vec![first];
        while items.len() < MAX_COALESCED_OUTPUTS {
            match futures_lite::future::poll_once(out.recv()).await {
                Some(Some(item)) => items.push(item),
                _ => break,
            }
        }
        let bytes: usize = items
            .iter()
            .flat_map(|i| i.groups.iter())
            .map(Group::bytes)
            .sum();
        let event_bytes: usize = items
            .iter()
            .filter(|i| i.block_seq.is_none())
            .flat_map(|i| i.groups.iter())
            .filter(|g| !matches!(g.kind, GroupKind::Msg(_)))
            .map(Group::bytes)
            .sum();
        let seqs: Vec<u64> = items.iter().filter_map(|i| i.block_seq).collect();
        let groups = coalesce(items.into_iter().flat_map(|i| i.groups));
        queue_groups(tls, framing, codec, &groups)?;
        drop(groups);
        // The slow-reader clock is only looked at while the socket refuses output, so an idle
        // connection runs no timer.
        futures_lite::future::or(
            async { Ok(tls_stream::flush(tls).await?) },
            slow_reader_watchdog(tls, state, slow_reader_close, slow_reader_tick),
        )
        .await?;
        super::count::take(&state.queued_bytes, bytes, "queued bytes");
        super::count::take(&state.event_bytes, event_bytes, "event bytes");
        state.note_level(tls.borrow().written_bytes());
        state.last_active.set(Instant::now());
        for seq in seqs {
            let mut parts = in_flight.parts.borrow_mut();
            if let Some(n) = parts.get_mut(&seq) {
                *n -= 1;
                if *n == 0 {
                    parts.remove(&seq);
                    in_flight.permits.signal(1);
                }
            }
        }
        if ask_again(&ctx.mesh, conn, state) {
            ctx.conn_stats.count(|c| c.output_reasks += 1);
        }
    }
    Ok(())
}

/// Ends a connection whose output has stayed over its bound for `limit` while its socket took
/// less than `SLOW_READER_MIN_PROGRESS_BYTES`: a reader that reads, however slowly, stays.
/// It looks once a second, or four times per `limit` when that is shorter (a limit of a second or
/// two, as tests set, is then kept to within a quarter of itself), or every `test_tick`. The limit
/// is measured on the relay's clock (`clock::Stamp`), so that a test advances it instead of
/// waiting.
async fn slow_reader_watchdog(
    tls: &SharedTls,
    state: &OutputState,
    limit: Duration,
    test_tick: Option<Duration>,
) -> Result<(), ConnError> {
    let tick = test_tick
        .unwrap_or_else(|| (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)));
    loop {
        glommio::timer::Timer::new(tick).await;
        if state.doomed.get() {
            return Err(ConnError::SlowReader);
        }
        let written = tls.borrow().written_bytes();
        match state.stall_mark.get() {
            None => state.note_level(written),
            Some((_, mark)) if written - mark >= SLOW_READER_MIN_PROGRESS_BYTES as u64 => {
                state
                    .stall_mark
                    .set(Some((crate::clock::Stamp::now(), written)));
            }
            Some((since, _)) if since.elapsed() >= limit => return Err(ConnError::SlowReader),
            Some(_) => {}
        }
    }
}

/// Packs, encrypts and queues groups of transmissions. Synchronous on purpose: the 16 KB block
/// lives on the thread's stack, not in the connection's future.
fn queue_groups(
    tls: &SharedTls,
    framing: &Framing,
    codec: &RefCell<BlockCodec>,
    groups: &[Group],
) -> Result<(), ConnError> {
    let mut out_block = [0u8; BLOCK_SIZE];
    let mut codec = codec.borrow_mut();
    let mut tls = tls.borrow_mut();
    // A pong the reader left (WebSocket only) goes out with this flush.
    ws::queue_control(&mut tls, framing)?;
    for g in groups {
        // Each block's batch is written straight into the block (simplexmq `Protocol.hs`,
        // `batchTransmissions_`).
        let mut rest = &g.transmissions[..];
        while !rest.is_empty() {
            let n = batch::batch_prefix_len(rest);
            if n == 0 {
                // A response too large for a block of its own cannot be produced by this relay;
                // drop it loudly rather than poison the connection.
                tracing::error!(
                    len = rest[0].len(),
                    "response transmission does not fit a block"
                );
                rest = &rest[1..];
                continue;
            }
            codec
                .encode_with(&mut out_block, |out| batch::write_batch(&rest[..n], out))
                .map_err(|_| ConnError::Handshake("response block too large"))?;
            ws::queue_block(&mut tls, framing, &out_block[..])?;
            rest = &rest[n..];
        }
    }
    Ok(())
}

async fn timed<T>(
    limit: Duration,
    what: &'static str,
    f: impl Future<Output = Result<T, ConnError>>,
) -> Result<T, ConnError> {
    futures_lite::future::or(f, async {
        glommio::timer::Timer::new(limit).await;
        Err(ConnError::Timeout(what))
    })
    .await
}

async fn smp_handshake(
    tls: &SharedTls,
    framing: &Framing,
    ctx: &ShardContext,
    versions: VersionRange,
    session_id: Vec<u8>,
    challenge: Option<[u8; CHALLENGE_BYTES]>,
    conn: ConnRef,
) -> Result<Handshake, ConnError> {
    let server_key = StaticSecret::random_from_rng(OsRng);
    let server_pub = X25519Public::from(&server_key);
    let cert_key = (versions.max >= version::AUTH_CMDS).then(|| CertChainPubKey {
        chain: ctx.credentials.chain_der.clone(),
        signed_key: ctx
            .credentials
            .leaf_key
            .signed_x25519_key(server_pub.as_bytes()),
    });
    // A web client's challenge is answered with the online key's signature of it and the session
    // ID (simplexmq `Transport.hs`, `smpServerHandshake`, `webIdentityProof`): the client, which
    // may not see the TLS certificate, so learns that this relay holds the address's key.
    let web_proof = challenge.map(|c| {
        let mut signed = c.to_vec();
        signed.extend_from_slice(&session_id);
        ctx.credentials.leaf_key.sign(&signed)
    });
    let hello = ServerHello {
        versions,
        session_id: session_id.clone(),
        cert_key,
        web_proof,
    };
    write_plain_block(tls, framing, &hello.encode()).await?;

    let mut block = Vec::new();
    ws::read_block(tls, framing, &mut block, None).await?;
    let content = pad::unpad(&block).map_err(|_| ConnError::Handshake("unpadded client hello"))?;
    let client = ClientHello::decode(content).map_err(|_| ConnError::Handshake("PARSE"))?;
    // The reference closes without a word on a wrong identity or version.
    if client.key_hash[..] != ctx.credentials.key_hash[..] {
        return Err(ConnError::Handshake("IDENTITY"));
    }
    if !versions.contains(client.version) {
        return Err(ConnError::Handshake("VERSION"));
    }
    // A service's third block: its ID, or why not, after which the connection closes (simplexmq
    // `Transport.hs`, `smpServerHandshake`).
    let service = match &client.service {
        Some(offered) if client.version >= version::SERVICE_CERTS => {
            match service_session(tls, ctx, offered).await {
                Ok(s) => {
                    let ok = ServiceResponse::Ok(s.service_id.clone());
                    write_plain_block(tls, framing, &ok.encode()).await?;
                    Some(s)
                }
                Err(e) => {
                    let refusal = ServiceResponse::Err(TransportError::Handshake(e));
                    write_plain_block(tls, framing, &refusal.encode()).await?;
                    return Err(ConnError::Handshake(match e {
                        HandshakeError::BadService => "BAD_SERVICE",
                        _ => "BAD_AUTH: service credentials",
                    }));
                }
            }
        }
        _ => None,
    };
    let session_secret = client
        .client_key
        .map(|k| sxbox::dh(&server_key.to_bytes(), &k));
    let encrypt = client.version >= version::ENCRYPTED_BLOCK && !client.proxy_server;
    let codec = match session_secret {
        Some(secret) if encrypt => BlockCodec::server(&session_id, &secret),
        _ => BlockCodec::plain(),
    };
    Ok(Handshake {
        info: Arc::new(SessionInfo {
            conn,
            version: client.version,
            session_id,
            server_key,
            service,
        }),
        session_secret,
        proxy_server: client.proxy_server,
        codec,
    })
}

/// Checks a service's credentials against its TLS client chain and finds or makes its record
/// (simplexmq `Transport.hs`, `getClientService`; `Server.hs`, `getService`): the hello's chain
/// must be the TLS chain, of a shape the TLS layer accepts, and its key must be an Ed25519 key
/// signed by the chain's leaf (else `BAD_AUTH`); a certificate known with another role, or a
/// record that cannot be stored, is `BAD_SERVICE`.
async fn service_session(
    tls: &SharedTls,
    ctx: &ShardContext,
    offered: &ClientService,
) -> Result<ServiceSession, HandshakeError> {
    let tls_chain: Vec<Vec<u8>> = tls
        .borrow()
        .connection()
        .peer_certificates()
        .unwrap_or_default()
        .iter()
        .map(|c| c.as_ref().to_vec())
        .collect();
    if tls_chain.is_empty() || tls_chain != offered.chain {
        return Err(HandshakeError::BadAuth);
    }
    let cert = service_cert::service_cert(&tls_chain).map_err(|_| HandshakeError::BadAuth)?;
    let spki = signed_key::verify_signed_key(&offered.signed_key, &cert.leaf_key)
        .map_err(|_| HandshakeError::BadAuth)?;
    let key = match PublicAuthKey::from_spki(&spki) {
        Ok(PublicAuthKey::Ed25519(k)) => k,
        _ => return Err(HandshakeError::BadAuth),
    };
    let role = ServiceRole::from_byte(offered.role).ok_or(HandshakeError::BadAuth)?;
    let found = match ctx.services.find(&cert.fingerprint, role) {
        Some(found) => found,
        None => {
            let mut chain_bytes = Vec::new();
            encode_chain(&offered.chain, &mut chain_bytes);
            let rec = ServiceRec {
                service_id: crate::server::owner::commands::random_id(),
                role,
                cert_chain: chain_bytes,
                cert_hash: cert.fingerprint,
                created_at: crate::server::owner::commands::now_secs() / 86400 * 86400,
            };
            let services = ctx.services.clone();
            glommio::executor()
                .spawn_blocking(move || services.get_or_create(rec))
                .await
        }
    };
    let service_id = found.map_err(|e| {
        tracing::debug!("service refused: {e}");
        HandshakeError::BadService
    })?;
    Ok(ServiceSession {
        service_id,
        role,
        cert_hash: cert.fingerprint,
        key,
    })
}

async fn write_plain_block(
    tls: &SharedTls,
    framing: &Framing,
    content: &[u8],
) -> Result<(), ConnError> {
    let mut block = vec![0u8; BLOCK_SIZE];
    pad::pad_into(content, &mut block).map_err(|_| ConnError::Handshake("hello too large"))?;
    ws::queue_block(&mut tls.borrow_mut(), framing, &block)?;
    tls_stream::flush(tls).await?;
    Ok(())
}

/// The reference's batch counters and RSLVs of one block (`dispatch::Routed`).
fn count_block(stats: &crate::server::shard::context::ConnStats, routed: &dispatch::Routed) {
    use dispatch::BatchKind;
    let c = match routed.batch_of {
        Some(BatchKind::Sub) => Some(&stats.sub_batches),
        Some(BatchKind::Del) => Some(&stats.del_batches),
        Some(BatchKind::NDel) => Some(&stats.ndel_batches),
        Some(BatchKind::NSub) => Some(&stats.nsub_batches),
        None => None,
    };
    if let Some(c) = c {
        c.set(c.get() + 1);
    }
    if routed.rslv > 0 {
        stats.rslv_reqs.set(stats.rslv_reqs.get() + routed.rslv);
    }
    stats
        .fwd_answers
        .set(stats.fwd_answers.get() + routed.fwd_answers);
}
