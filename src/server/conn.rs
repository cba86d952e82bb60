//! One client connection, from the first TLS byte to the last block: TLS with the tls-unique
//! extraction, the SMP handshake (simplexmq `Transport.hs`), then two tasks: a reader that decodes
//! blocks and routes their transmissions to the owners of their queues, and a writer that sends
//! what owners answer, packed into as few blocks as fit. At most `MAX_BLOCKS_IN_FLIGHT` blocks are
//! being answered at once; beyond that the reader stops reading the socket
//! (`docs/ARCHITECTURE.md` §4).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncWriteExt};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use rand::rngs::OsRng;
use x25519_dalek::{PublicKey as X25519Public, StaticSecret};

use super::admission::Handshaking;
use super::dispatch::{self, RouteCtx};
use super::router::{
    ConnRef, Delivery, Group, GroupKind, NtfReturn, Pending, SessionInfo, ShardMsg,
};
use super::shard::ShardContext;
use super::tls_stream::{self, SharedTls, TlsStream};
use crate::crypto::{signed_key, sxbox};
use crate::limits::{
    OutputLimits, MAX_BLOCKS_IN_FLIGHT, MAX_PENDING_PER_CONNECTION, MAX_PROXIED_IN_FLIGHT,
    SLOW_READER_MIN_PROGRESS_BYTES,
};
use crate::protocol::batch;
use crate::protocol::command::Command;
use crate::protocol::error::{HandshakeError, TransportError};
use crate::protocol::handshake::{CertChainPubKey, ClientHello, ServerHello, ServiceResponse};
use crate::protocol::pad;
use crate::protocol::version::{self, VersionRange};
use crate::store::EntityId;
use crate::transport::block::{BlockCodec, BLOCK_SIZE};
use crate::transport::tls::{alpn_versions, AcceptState};

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

/// What the shard keeps of a connection: where its output goes, and how much is waiting.
pub struct ConnHandle {
    pub out: Rc<LocalSender<Output>>,
    pub state: Rc<OutputState>,
}

/// The connection's output bound (`docs/ARCHITECTURE.md` §4): bytes queued for the socket,
/// what the connection holds to ask its owners for again, and the slow-reader clock.
pub struct OutputState {
    pub limits: OutputLimits,
    /// Bytes of every kind queued for the socket: over the high water mark MSG deliveries that are
    /// events become markers, and below the low water mark held items are asked for again.
    pub queued_bytes: Cell<usize>,
    /// Of those, the bytes of events that cannot be dropped (NMSG, END, DELD), bounded by the hard
    /// limit. Answers are not counted: the blocks in flight bound them, and a client that sends
    /// blocks and reads their answers must not lose its events for it.
    pub event_bytes: Cell<usize>,
    /// Dropped MSG deliveries and "more notifications" markers, at most one per queue and kind
    /// (`MAX_PENDING_PER_CONNECTION`). Ordered, so that what is asked first does not depend on a
    /// hasher's seed (the simulation in `server::sim` replays by seed).
    pub pending: RefCell<BTreeMap<(bool, EntityId), Pending>>,
    /// Owners asked for held items that have not answered yet: no new ask before they all have.
    pub asking: Cell<usize>,
    /// Since when the output has been over the high water mark, and how many bytes the socket had
    /// taken then (moved on whenever the reader makes progress).
    pub stall_mark: Cell<Option<(crate::clock::Stamp, u64)>>,
    /// An event was refused at the hard limit (or the owner asked for a close): the writer ends
    /// the connection (a lost event must not go unnoticed).
    pub doomed: Cell<bool>,
}

/// What `OutputState::admit` took, and the notifications it could not take (they go back to their
/// owner, to be stored).
pub struct Admitted {
    pub kept: Vec<Group>,
    pub returned: Vec<NtfReturn>,
    /// MSG deliveries dropped to markers.
    pub dropped: usize,
}

impl OutputState {
    pub fn new(limits: OutputLimits) -> Self {
        OutputState {
            limits,
            queued_bytes: Cell::new(0),
            event_bytes: Cell::new(0),
            pending: RefCell::new(BTreeMap::new()),
            asking: Cell::new(0),
            stall_mark: Cell::new(None),
            doomed: Cell::new(false),
        }
    }

    /// Takes `groups` into the output. While over the bound, MSG deliveries that are events (pushes
    /// and redeliveries) become markers; the answers to a block are always kept, since the blocks
    /// in flight already bound them (`MAX_BLOCKS_IN_FLIGHT`), and dropping a SUB's message would
    /// only have it sealed again later.
    /// Other events (NMSG, END, DELD) are kept up to the hard limit of undroppable event bytes;
    /// one past it dooms the connection, whose writer then ends it.
    pub fn admit(&self, groups: Vec<Group>, is_event: bool) -> Admitted {
        let mut a = Admitted {
            kept: Vec::with_capacity(groups.len()),
            returned: Vec::new(),
            dropped: 0,
        };
        let limits = &self.limits;
        for g in groups {
            let over = self.queued_bytes.get() > limits.high_water_bytes;
            match g.kind {
                GroupKind::More(p) => self.hold(p),
                GroupKind::Msg(d) if over && is_event => {
                    a.dropped += 1;
                    self.hold(Pending::Msg(d));
                }
                GroupKind::Msg(_) => {
                    self.queued_bytes.set(self.queued_bytes.get() + g.bytes());
                    a.kept.push(g);
                }
                _ if is_event
                    && (self.doomed.get()
                        || self.event_bytes.get() + g.bytes() > limits.hard_limit_bytes) =>
                {
                    self.doomed.set(true);
                    if let GroupKind::Ntfs(r) = g.kind {
                        a.returned.push(r);
                    }
                }
                _ => {
                    let n = g.bytes();
                    self.queued_bytes.set(self.queued_bytes.get() + n);
                    if is_event {
                        self.event_bytes.set(self.event_bytes.get() + n);
                    }
                    a.kept.push(g);
                }
            }
        }
        a
    }

    /// Keeps `p` to ask for later; a newer item for the same queue replaces the older.
    fn hold(&self, p: Pending) {
        let mut pending = self.pending.borrow_mut();
        pending.insert(p.key(), p);
        if pending.len() > MAX_PENDING_PER_CONNECTION {
            self.doomed.set(true);
        }
    }

    /// Starts the slow-reader clock when the output goes over its bound.
    fn note_level(&self, written: u64) {
        if self.queued_bytes.get() > self.limits.high_water_bytes {
            if self.stall_mark.get().is_none() {
                self.stall_mark
                    .set(Some((crate::clock::Stamp::now(), written)));
            }
        } else {
            self.stall_mark.set(None);
        }
    }

    /// The dropped delivery held for queue `rid`, if any: an ACK of it deletes nothing.
    pub fn held_delivery(&self, rid: &[u8]) -> Option<Delivery> {
        match self.pending.borrow().get(&(true, rid.to_vec())) {
            Some(Pending::Msg(d)) => Some(d.clone()),
            _ => None,
        }
    }
}

/// Something for the writer: groups of transmissions, and the block whose part they answer.
pub struct Output {
    pub groups: Vec<Group>,
    pub block_seq: Option<u64>,
}

/// Blocks being answered: their count is the semaphore's taken permits; the parts still missing of
/// each block are counted here.
struct InFlight {
    permits: Semaphore,
    parts: RefCell<HashMap<u64, usize>>,
}

/// Serves an accepted connection; `handshaking` counts it against its address until its SMP
/// handshake is over (`admission`).
pub async fn serve(sock: TcpStream, ctx: Rc<ShardContext>, handshaking: Handshaking) {
    let peer = sock.peer_addr().ok();
    match run(sock, &ctx, handshaking).await {
        Ok(()) => tracing::debug!(?peer, "connection closed"),
        Err(e) => tracing::debug!(?peer, error = %e, "connection ended"),
    }
}

async fn run(
    mut sock: TcpStream,
    ctx: &Rc<ShardContext>,
    handshaking: Handshaking,
) -> Result<(), ConnError> {
    // Small handshake blocks would otherwise wait for delayed ACKs.
    sock.set_nodelay(true)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let (conn, session_id) = timed(
        ctx.config.tls_timeout,
        "TLS setup",
        tls_accept(&mut sock, ctx),
    )
    .await?;
    let versions = alpn_versions(conn.alpn_protocol());
    let tls: SharedTls = Rc::new(RefCell::new(TlsStream::new(
        sock,
        conn,
        ctx.read_scratch.clone(),
    )));
    let conn_ref = ConnRef {
        shard: ctx.shard_id,
        id: ctx.next_conn_id(),
    };
    let handshake = timed(
        ctx.config.handshake_timeout,
        "SMP handshake",
        smp_handshake(&tls, ctx, versions, session_id, conn_ref),
    )
    .await;
    // Done with the handshake, well or not: the address may start another.
    drop(handshaking);
    let handshake = match handshake {
        Ok(h) => h,
        Err(e) => {
            tls_stream::close(&tls).await;
            return Err(e);
        }
    };
    let result = session(ctx, &tls, handshake).await;
    tls_stream::close(&tls).await;
    result
}

/// The established session: reader and writer until either ends.
async fn session(ctx: &Rc<ShardContext>, tls: &SharedTls, hs: Handshake) -> Result<(), ConnError> {
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
        },
    );
    let in_flight = InFlight {
        permits: Semaphore::new(MAX_BLOCKS_IN_FLIGHT as u64),
        parts: RefCell::new(HashMap::new()),
    };
    let touched = Cell::new(0u64);
    let reader = async {
        let r = read_loop(
            ctx,
            tls,
            &info,
            session_secret,
            &codec,
            &in_flight,
            &out_tx,
            &state,
            &touched,
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
    let writer = write_loop(ctx, conn, tls, &codec, &in_flight, &state, &out_rx);
    let result = futures_lite::future::or(reader, writer).await;
    if matches!(result, Err(ConnError::SlowReader)) {
        ctx.conn_stats
            .slow_reader_closes
            .set(ctx.conn_stats.slow_reader_closes.get() + 1);
    }
    ctx.connections_table.borrow_mut().remove(&conn.id);
    // Notifications still waiting for the socket go back to their owners, to be stored for the
    // next NSUB (the connection is out of the table, so nothing more is sent to this channel).
    while let Some(Some(o)) = futures_lite::future::poll_once(out_rx.recv()).await {
        ctx.return_ntfs(o.groups);
    }
    // Owners drop this connection's subscriptions; only shards it sent work to hold any.
    for shard in 0..ctx.mesh.shards() {
        if touched.get() & (1u64 << (shard % 64)) != 0 {
            ctx.mesh.send(shard, ShardMsg::Closed { conn });
        }
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn read_loop(
    ctx: &Rc<ShardContext>,
    tls: &SharedTls,
    info: &Arc<SessionInfo>,
    session_secret: Option<[u8; 32]>,
    codec: &RefCell<BlockCodec>,
    in_flight: &InFlight,
    out: &Rc<LocalSender<Output>>,
    state: &Rc<OutputState>,
    touched: &Cell<u64>,
) -> Result<(), ConnError> {
    // PRXY/PFWD of this connection being answered at once (`MAX_PROXIED_IN_FLIGHT`).
    let proxy_slots = Rc::new(Semaphore::new(MAX_PROXIED_IN_FLIGHT as u64));
    let route_ctx = RouteCtx {
        session: info,
        directory: &ctx.directory,
        mesh: &ctx.mesh,
        session_secret,
    };
    let mut seq: u64 = 0;
    loop {
        in_flight
            .permits
            .acquire(1)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        // Allocated per block, so that an idle connection holds no block buffer.
        let mut block = Vec::new();
        let read = tls_stream::read_block(tls, &mut block, BLOCK_SIZE).await;
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
        let routed = {
            let mut codec = codec.borrow_mut();
            let content = codec.decode(block).map_err(|_| ());
            dispatch::route_block(&route_ctx, content)
        };
        seq += 1;
        let parts =
            routed.by_owner.len() + usize::from(!routed.local.is_empty()) + routed.proxied.len();
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
                let t = super::owner::encode(&info, &job.corr_id, &entity, &msg);
                let _ = out.try_send(Output {
                    groups: state.admit(vec![Group::plain(vec![t])], false).kept,
                    block_seq: Some(seq),
                });
                drop(slot);
            })
            .detach();
        }
        for (shard, mut requests) in routed.by_owner {
            mark_undelivered_acks(state, &mut requests);
            touched.set(touched.get() | (1u64 << (shard % 64)));
            ctx.mesh.send(
                shard,
                ShardMsg::Work {
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

async fn write_loop(
    ctx: &ShardContext,
    conn: ConnRef,
    tls: &SharedTls,
    codec: &RefCell<BlockCodec>,
    in_flight: &InFlight,
    state: &OutputState,
    out: &LocalReceiver<Output>,
) -> Result<(), ConnError> {
    let slow_reader_close = ctx.config.slow_reader_close;
    let slow_reader_tick = ctx.config.test_slow_reader_tick;
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
        queue_groups(tls, codec, &groups)?;
        drop(groups);
        // The slow-reader clock is only looked at while the socket refuses output, so an idle
        // connection runs no timer.
        futures_lite::future::or(
            async { Ok(tls_stream::flush(tls).await?) },
            slow_reader_watchdog(tls, state, slow_reader_close, slow_reader_tick),
        )
        .await?;
        state
            .queued_bytes
            .set(state.queued_bytes.get().saturating_sub(bytes));
        state
            .event_bytes
            .set(state.event_bytes.get().saturating_sub(event_bytes));
        state.note_level(tls.borrow().written_bytes());
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
        ask_again(ctx, conn, state);
    }
    Ok(())
}

/// Asks the owners for what this connection holds (dropped MSGs, the rest of stored
/// notifications), a batch at a time, once its output is under the low water mark and every
/// earlier ask was answered. Each owner answers with `Redelivered` even when it has nothing to
/// send, and that answer asks again (`ShardContext::redelivered`), so stale items never leave live
/// ones behind them unasked.
pub fn ask_again(ctx: &ShardContext, conn: ConnRef, state: &OutputState) {
    if state.asking.get() > 0 || state.queued_bytes.get() > state.limits.low_water_bytes {
        return;
    }
    let mut pending = state.pending.borrow_mut();
    if pending.is_empty() {
        return;
    }
    let keys: Vec<(bool, EntityId)> = pending
        .keys()
        .take(state.limits.redeliver_batch)
        .cloned()
        .collect();
    let mut by_owner: HashMap<usize, Vec<Pending>> = HashMap::new();
    for k in keys {
        if let Some(p) = pending.remove(&k) {
            by_owner.entry(p.owner()).or_default().push(p);
        }
    }
    state.asking.set(by_owner.len());
    ctx.conn_stats
        .output_reasks
        .set(ctx.conn_stats.output_reasks.get() + 1);
    for (owner, items) in by_owner {
        ctx.mesh.send(owner, ShardMsg::Redeliver { conn, items });
    }
}

/// Outputs a writer takes at once from its channel to share blocks.
const MAX_COALESCED_OUTPUTS: usize = 64;

/// Merges consecutive plain groups into one, so that their transmissions share blocks; a MSG
/// delivery stays a group of its own (16 KB: a block anyway). Order is kept.
fn coalesce(groups: impl Iterator<Item = Group>) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for g in groups {
        match out.last_mut() {
            Some(last) if last.is_plain() && g.is_plain() => {
                last.transmissions.extend(g.transmissions)
            }
            _ => out.push(g),
        }
    }
    out
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
    codec: &RefCell<BlockCodec>,
    groups: &[Group],
) -> Result<(), ConnError> {
    let mut out_block = [0u8; BLOCK_SIZE];
    let mut codec = codec.borrow_mut();
    let mut tls = tls.borrow_mut();
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
            tls.queue(&out_block[..])?;
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

async fn tls_accept(
    sock: &mut TcpStream,
    ctx: &ShardContext,
) -> Result<(rustls::ServerConnection, Vec<u8>), ConnError> {
    let mut state = AcceptState::new(&ctx.tls_config).map_err(|e| ConnError::Tls(e.to_string()))?;
    let mut out = Vec::new();
    loop {
        // Read into the shard's scratch buffer and feed rustls at once, so that a connection
        // waiting for its ClientHello holds no buffer of its own.
        let fed = poll_fn(|cx| {
            let mut buf = ctx.read_scratch.borrow_mut();
            match Pin::new(&mut *sock).poll_read(cx, &mut buf[..]) {
                Poll::Ready(Ok(0)) => {
                    Poll::Ready(Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into())))
                }
                Poll::Ready(Ok(n)) => Poll::Ready(Ok(state.feed(&buf[..n]))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(ConnError::Io(e))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await?;
        // Send what rustls produced even on failure: that is the alert telling the client why.
        state.take_output(&mut out);
        if !out.is_empty() {
            sock.write_all(&out).await?;
            out = Vec::new();
        }
        fed.map_err(|e| ConnError::Tls(e.to_string()))?;
        if !state.is_handshaking() {
            return state.finish().map_err(|e| ConnError::Tls(e.to_string()));
        }
    }
}

async fn smp_handshake(
    tls: &SharedTls,
    ctx: &ShardContext,
    versions: VersionRange,
    session_id: Vec<u8>,
    conn: ConnRef,
) -> Result<Handshake, ConnError> {
    let server_key = StaticSecret::random_from_rng(OsRng);
    let server_pub = X25519Public::from(&server_key);
    let cert_key = (versions.max >= version::AUTH_CMDS).then(|| CertChainPubKey {
        chain: ctx.credentials.chain_der.clone(),
        signed_key: signed_key::sign_x25519_key(&ctx.credentials.leaf_key, server_pub.as_bytes()),
    });
    let hello = ServerHello {
        versions,
        session_id: session_id.clone(),
        cert_key,
    };
    write_plain_block(tls, &hello.encode()).await?;

    let mut block = Vec::new();
    tls_stream::read_block(tls, &mut block, BLOCK_SIZE).await?;
    let content = pad::unpad(&block).map_err(|_| ConnError::Handshake("unpadded client hello"))?;
    let client = ClientHello::decode(content).map_err(|_| ConnError::Handshake("PARSE"))?;
    // The reference closes without a word on a wrong identity or version.
    if client.key_hash[..] != ctx.credentials.key_hash[..] {
        return Err(ConnError::Handshake("IDENTITY"));
    }
    if !versions.contains(client.version) {
        return Err(ConnError::Handshake("VERSION"));
    }
    if client.service.is_some() {
        // A service must present the chain it signs with as its TLS client certificate; this relay
        // does not ask for one yet, so the chains cannot match (the reference's BAD_AUTH).
        let refusal = ServiceResponse::Err(TransportError::Handshake(HandshakeError::BadAuth));
        write_plain_block(tls, &refusal.encode()).await?;
        return Err(ConnError::Handshake(
            "BAD_AUTH: service without a client certificate",
        ));
    }
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
        }),
        session_secret,
        proxy_server: client.proxy_server,
        codec,
    })
}

async fn write_plain_block(tls: &SharedTls, content: &[u8]) -> Result<(), ConnError> {
    let mut block = vec![0u8; BLOCK_SIZE];
    pad::pad_into(content, &mut block).map_err(|_| ConnError::Handshake("hello too large"))?;
    tls.borrow_mut().queue(&block)?;
    tls_stream::flush(tls).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{OUTPUT_HARD_LIMIT_BYTES, OUTPUT_HIGH_WATER_BYTES};
    use crate::store::MsgNtf;

    fn event(bytes: usize) -> Group {
        Group::plain(vec![vec![0u8; bytes]])
    }

    fn delivery(rid: u8) -> Delivery {
        Delivery {
            owner: 0,
            recipient_id: vec![rid; 24],
            msg_id: [2; 24],
            epoch: 1,
        }
    }

    fn msg_delivery(bytes: usize) -> Group {
        msg_delivery_for(1, bytes)
    }

    fn msg_delivery_for(rid: u8, bytes: usize) -> Group {
        Group {
            transmissions: vec![vec![0u8; bytes]],
            kind: GroupKind::Msg(delivery(rid)),
        }
    }

    fn ntfs(n: u8) -> Group {
        Group {
            transmissions: vec![vec![0u8; 200]],
            kind: GroupKind::Ntfs(NtfReturn {
                owner: 1,
                notifier_id: vec![n; 24],
                ntfs: vec![MsgNtf {
                    msg_id: [n; 24],
                    ts: 1,
                    nonce: [0; 24],
                    enc_meta: vec![0; 144],
                }],
            }),
        }
    }

    fn state() -> OutputState {
        OutputState::new(OutputLimits::default())
    }

    #[test]
    fn coalesce_merges_plain_neighbours_and_keeps_order() {
        let plain = |ts: &[&[u8]]| Group::plain(ts.iter().map(|t| t.to_vec()).collect());
        let groups = vec![
            plain(&[b"a", b"b"]),
            plain(&[b"c"]),
            msg_delivery(3),
            plain(&[b"d"]),
            plain(&[b"e"]),
            msg_delivery(4),
            msg_delivery(5),
        ];
        let out = coalesce(groups.into_iter());
        let shape: Vec<(usize, bool)> = out
            .iter()
            .map(|g| (g.transmissions.len(), !g.is_plain()))
            .collect();
        assert_eq!(
            shape,
            [(3, false), (1, true), (2, false), (1, true), (1, true)]
        );
        let flat: Vec<Vec<u8>> = out.into_iter().flat_map(|g| g.transmissions).collect();
        assert_eq!(flat[..3], [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(flat[4..6], [b"d".to_vec(), b"e".to_vec()]);
        assert_eq!(flat[6].len(), 4);
    }

    /// Every kind of output has a bound: MSG pushes become markers over the high water mark, other
    /// events doom the connection past the hard limit (and are not queued), answers to blocks are
    /// kept (the blocks in flight bound them).
    #[test]
    fn admit_bounds_every_kind_of_output() {
        let s = state();
        let chunk = 64 * 1024;
        let mut queued = 0;
        let mut rid = 0u8;
        while queued + chunk <= OUTPUT_HARD_LIMIT_BYTES {
            assert_eq!(s.admit(vec![event(chunk)], true).kept.len(), 1);
            queued += chunk;
            // Over the high water mark a pushed MSG is only a marker.
            if queued > OUTPUT_HIGH_WATER_BYTES {
                rid = rid.wrapping_add(1);
                let a = s.admit(vec![msg_delivery_for(rid, 16_000)], true);
                assert!(a.kept.is_empty());
                assert_eq!(a.dropped, 1);
            }
        }
        assert!(!s.doomed.get());
        assert_eq!(s.queued_bytes.get(), queued);
        let held = s.pending.borrow().len();
        assert!(held > 0);

        // The event that would cross the hard limit is refused and dooms the connection; so is
        // every later one, however small.
        assert!(s.admit(vec![event(chunk)], true).kept.is_empty());
        assert!(s.doomed.get());
        assert!(s.admit(vec![event(10)], true).kept.is_empty());
        assert_eq!(s.queued_bytes.get(), queued);

        // Answers are still kept.
        assert_eq!(s.admit(vec![event(100)], false).kept.len(), 1);
        assert_eq!(s.queued_bytes.get(), queued + 100);
        assert_eq!(s.pending.borrow().len(), held);
    }

    /// Unread answers do not count against the hard limit of undroppable events: a connection
    /// with megabytes of answers waiting still gets its DELD (issue: three unread SUB blocks and
    /// one DELD used to close it).
    #[test]
    fn unread_answers_do_not_doom_a_connection_that_gets_an_event() {
        let s = state();
        for _ in 0..7 {
            assert_eq!(s.admit(vec![event(1 << 20)], false).kept.len(), 1);
        }
        assert!(s.queued_bytes.get() > OUTPUT_HARD_LIMIT_BYTES);
        assert_eq!(s.admit(vec![event(100)], true).kept.len(), 1);
        assert!(!s.doomed.get());
        assert_eq!(s.event_bytes.get(), 100);
        // Pushed MSGs are still dropped to markers while the answers wait.
        assert_eq!(s.admit(vec![msg_delivery(16_000)], true).dropped, 1);
    }

    /// Notifications that cannot be queued (the connection is being closed) come back to be
    /// stored, never dropped.
    #[test]
    fn refused_notifications_are_returned() {
        let s = state();
        s.doomed.set(true);
        let a = s.admit(vec![ntfs(3), event(10), ntfs(4)], true);
        assert!(a.kept.is_empty());
        let ids: Vec<u8> = a.returned.iter().map(|r| r.notifier_id[0]).collect();
        assert_eq!(ids, [3, 4]);
        assert_eq!(a.returned[0].ntfs.len(), 1);
    }

    /// A held delivery is found for an ACK of its queue, and a newer one replaces it; a "more
    /// notifications" marker is held without transmissions and is no delivery.
    #[test]
    fn held_items_are_one_per_queue_and_kind() {
        let s = state();
        s.queued_bytes.set(OUTPUT_HIGH_WATER_BYTES + 1);
        let mut newer = delivery(7);
        newer.epoch = 2;
        s.admit(vec![msg_delivery_for(7, 100)], true);
        s.admit(
            vec![Group {
                transmissions: vec![vec![1; 100]],
                kind: GroupKind::Msg(newer.clone()),
            }],
            true,
        );
        let more = Pending::Ntfs {
            owner: 0,
            notifier_id: vec![7; 24],
        };
        let a = s.admit(
            vec![Group {
                transmissions: Vec::new(),
                kind: GroupKind::More(more),
            }],
            false,
        );
        assert!(a.kept.is_empty());
        assert_eq!(s.pending.borrow().len(), 2);
        assert_eq!(s.held_delivery(&[7; 24]), Some(newer));
        assert_eq!(s.held_delivery(&[8; 24]), None);
    }
}
