//! One shard: a glommio executor pinned to a core, its listeners on the SMP ports (SO_REUSEPORT, so
//! every shard accepts on every port and the kernel spreads connections; see `listen.rs`), the connections it
//! accepted, and the owner of its queues. One inbox task hands answers and events to the shard's
//! connections as they arrive, and turns owner work into jobs of the pipeline (`pipeline.rs`),
//! which run in per-queue order without holding up the inbox.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::net::TcpListener;

use super::admission::{Admission, Refused};
use super::conn::{self, ConnHandle, Output};
use super::directory::Directory;
use super::log_limit::{self, RateLimited};
use super::owner::Owner;
use super::pipeline::{Keys, Pipeline};
use super::router::{ConnRef, Gathering, Group, GroupKind, Mesh, ShardMsg, Step};
use crate::config::StartConfig;
use crate::metrics::{self, MetricsSnapshot};
use crate::store::{MessageStore, QueueStore, ShardStore};
use crate::transport::certs::ServerCredentials;

/// What every connection of a shard reads; built once per shard.
pub struct ShardContext {
    pub shard_id: usize,
    pub config: StartConfig,
    pub credentials: Arc<ServerCredentials>,
    pub tls_config: Arc<rustls::ServerConfig>,
    /// Connections this shard holds now (its part of the metrics' count).
    pub connections: Cell<usize>,
    /// The relay's connection limits, shared by every shard.
    pub admission: Arc<Admission>,
    /// Every socket read of this shard lands here first (see `tls_stream`).
    pub read_scratch: super::tls_stream::ReadScratch,
    pub directory: Arc<Directory>,
    pub mesh: Mesh,
    /// Established connections of this shard, by number: where owners' answers go.
    pub connections_table: RefCell<HashMap<u64, ConnHandle>>,
    next_conn: Cell<u64>,
    /// The proxy role: this shard's sessions to destination relays.
    pub proxy: super::proxy::ProxyAgent,
    /// Shard 0's gathering of every shard's numbers for the metrics file (`ShardMsg::Metrics`).
    stats_round: RefCell<Option<Gathering<MetricsSnapshot>>>,
    next_stats_round: Cell<u64>,
    /// Test hook (`clock_control`): told when the next metrics file is written.
    stats_waiters: RefCell<Vec<flume::Sender<()>>>,
    /// Back-pressure counters of this shard's connections, exported as metrics.
    pub conn_stats: ConnStats,
}

/// Counters of what back-pressure did to this shard's connections.
#[derive(Default)]
pub struct ConnStats {
    pub output_drops: Cell<u64>,
    pub output_reasks: Cell<u64>,
    pub slow_reader_closes: Cell<u64>,
}

impl ShardContext {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shard_id: usize,
        config: StartConfig,
        credentials: Arc<ServerCredentials>,
        tls_config: Arc<rustls::ServerConfig>,
        admission: Arc<Admission>,
        directory: Arc<Directory>,
        mesh: Mesh,
    ) -> Self {
        let proxy = super::proxy::ProxyAgent::new(&config.settings);
        ShardContext {
            shard_id,
            config,
            credentials,
            tls_config,
            connections: Cell::new(0),
            admission,
            read_scratch: super::tls_stream::new_scratch(),
            directory,
            mesh,
            connections_table: RefCell::new(HashMap::new()),
            next_conn: Cell::new(0),
            proxy,
            stats_round: RefCell::new(None),
            next_stats_round: Cell::new(0),
            stats_waiters: RefCell::new(Vec::new()),
            conn_stats: ConnStats::default(),
        }
    }

    pub fn next_conn_id(&self) -> u64 {
        let id = self.next_conn.get();
        self.next_conn.set(id + 1);
        id
    }

    /// Hands groups to a connection of this shard. A connection that has gone drops them (its
    /// owners are told by `Closed` and forget it), except notifications, which go back to their
    /// owners to be stored.
    fn deliver(&self, conn: ConnRef, groups: Vec<Group>, block_seq: Option<u64>) {
        let table = self.connections_table.borrow();
        let Some(h) = table.get(&conn.id) else {
            drop(table);
            self.return_ntfs(groups);
            return;
        };
        let admitted = h.state.admit(groups, block_seq.is_none());
        let stats = &self.conn_stats;
        stats
            .output_drops
            .set(stats.output_drops.get() + admitted.dropped as u64);
        // An empty output still wakes the writer: it releases the block's permit, or ends a
        // connection that was just doomed.
        let _ = h.out.try_send(Output {
            groups: admitted.kept,
            block_seq,
        });
        drop(table);
        for r in admitted.returned {
            self.return_ntfs(vec![Group {
                transmissions: Vec::new(),
                kind: GroupKind::Ntfs(r),
            }]);
        }
    }

    /// Sends the notifications among `groups` back to their owners.
    pub fn return_ntfs(&self, groups: Vec<Group>) {
        for g in groups {
            if let GroupKind::Ntfs(r) = g.kind {
                self.mesh.send(
                    r.owner,
                    ShardMsg::ReturnNtfs {
                        notifier_id: r.notifier_id,
                        ntfs: r.ntfs,
                    },
                );
            }
        }
    }

    /// An owner answered a connection's ask (`conn::ask_again`): queue what it sent, and ask for
    /// the next items once every owner asked has answered.
    fn redelivered(&self, conn: ConnRef, groups: Vec<Group>) {
        self.deliver(conn, groups, None);
        let table = self.connections_table.borrow();
        if let Some(h) = table.get(&conn.id) {
            h.state.asking.set(h.state.asking.get().saturating_sub(1));
            conn::ask_again(self, conn, &h.state);
        }
    }

    /// Ends a connection at its owner's request.
    fn close(&self, conn: ConnRef) {
        if let Some(h) = self.connections_table.borrow().get(&conn.id) {
            h.state.doomed.set(true);
            let _ = h.out.try_send(Output {
                groups: Vec::new(),
                block_seq: None,
            });
        }
    }
}

/// Accepts on `listeners` (bound by `super::listen::shard_listener`) and runs the shard until it
/// is told to stop; returns the owner's store so that the caller can save it.
pub async fn run<S: ShardStore>(
    ctx: Rc<ShardContext>,
    owner: Owner<S>,
    inbox: flume::Receiver<ShardMsg>,
    listeners: Vec<std::net::TcpListener>,
    ready: impl FnOnce(),
) -> std::io::Result<S> {
    let listeners = listeners.into_iter().map(|l| {
        // SAFETY: the descriptor is a bound, listening TCP socket that `into_raw_fd` gave up, so
        // the glommio listener is its only owner.
        unsafe { TcpListener::from_raw_fd(l.into_raw_fd()) }
    });
    for l in listeners {
        glommio::spawn_local(accept_loop(l, ctx.clone())).detach();
    }
    let ticker = {
        let mesh = ctx.mesh.clone();
        let shard = ctx.shard_id;
        let every = ctx
            .config
            .settings
            .expire_interval
            .max(Duration::from_millis(100));
        glommio::spawn_local(async move {
            loop {
                glommio::timer::Timer::new(every).await;
                mesh.send(shard, ShardMsg::Tick);
            }
        })
    };
    let metrics_ticker = ctx
        .config
        .metrics_interval
        .filter(|_| ctx.shard_id == 0)
        .map(|every| {
            let mesh = ctx.mesh.clone();
            let shard = ctx.shard_id;
            let every = every.max(Duration::from_millis(100));
            glommio::spawn_local(async move {
                loop {
                    glommio::timer::Timer::new(every).await;
                    mesh.send(shard, ShardMsg::Metrics);
                }
            })
        });
    // Test hook: shard 0 serves the clock control; bound before `ready` so that a test can use it
    // as soon as the relay has started.
    let clock_control = match ctx.config.test_clock_control.as_deref() {
        Some(path) if ctx.shard_id == 0 => {
            let listener = super::clock_control::bind(path)?;
            Some(glommio::spawn_local(super::clock_control::serve(
                listener,
                ctx.mesh.clone(),
            )))
        }
        _ => None,
    };
    ready();
    let store = inbox_loop(&ctx, owner, inbox).await;
    drop(clock_control);
    drop(ticker);
    drop(metrics_ticker);
    Ok(store)
}

/// The shard's single consumer: owner work, answers and events for this shard's connections.
/// Owner work becomes jobs of the pipeline (`pipeline.rs`): a job that waits for its store does
/// not hold up this loop, nor other queues' jobs.
async fn inbox_loop<S: ShardStore>(
    ctx: &ShardContext,
    owner: Owner<S>,
    inbox: flume::Receiver<ShardMsg>,
) -> S {
    let owner = Rc::new(owner);
    let pipeline = Rc::new(Pipeline::new());
    let driver = {
        let p = pipeline.clone();
        glommio::spawn_local(async move { p.drive().await })
    };
    while let Ok(msg) = inbox.recv_async().await {
        match msg {
            ShardMsg::Reply {
                conn,
                block_seq,
                groups,
            } => ctx.deliver(conn, groups, Some(block_seq)),
            ShardMsg::Event { conn, groups } => ctx.deliver(conn, groups, None),
            ShardMsg::Redelivered { conn, groups } => ctx.redelivered(conn, groups),
            ShardMsg::Close { conn } => ctx.close(conn),
            ShardMsg::Metrics => ask_for_stats(ctx),
            ShardMsg::StatsRequest { reply_to, round } => ctx.mesh.send(
                reply_to,
                ShardMsg::StatsPart {
                    round,
                    part: Box::new(shard_stats(ctx, &owner)),
                },
            ),
            ShardMsg::StatsPart { round, part } => gather_stats(ctx, round, *part),
            ShardMsg::MetricsNow { done } => {
                ctx.stats_waiters.borrow_mut().push(done);
                ask_for_stats(ctx);
            }
            ShardMsg::Stop => break,
            m => owner_job(&owner, &pipeline, m),
        }
    }
    // A clean stop: jobs in flight finish before the store is handed back to be closed.
    drop(driver);
    pipeline.drain().await;
    drop(pipeline);
    match Rc::try_unwrap(owner) {
        Ok(o) => o.store,
        Err(_) => unreachable!("every job of the owner has finished"),
    }
}

/// The owner's messages of the inbox, as jobs of the pipeline (or at once, for what touches no
/// queue's order). The owner simulation (`sim.rs`) goes through here too.
pub fn owner_job<S: QueueStore + MessageStore + 'static>(
    owner: &Rc<Owner<S>>,
    pipeline: &Pipeline,
    msg: ShardMsg,
) {
    let o = owner.clone();
    match msg {
        ShardMsg::Work {
            session,
            block_seq,
            requests,
        } => {
            let keys = o.work_keys(&requests);
            let conn = session.conn;
            pipeline.submit(
                keys,
                Some(conn),
                Box::pin(async move { o.process(session, block_seq, requests).await }),
            );
        }
        ShardMsg::Closed { conn } => pipeline.closed(conn, move || o.connection_closed(conn)),
        ShardMsg::Redeliver { conn, items } => {
            let rids: Vec<Vec<u8>> = items.iter().filter_map(|i| o.pending_queue(i)).collect();
            pipeline.submit(
                Keys::of(rids.iter().map(Vec::as_slice)),
                Some(conn),
                Box::pin(async move { o.redeliver(conn, items).await }),
            );
        }
        ShardMsg::ReturnNtfs { notifier_id, ntfs } => {
            let rid = o.notifier_queue(&notifier_id);
            pipeline.submit(
                Keys::of(rid.as_deref()),
                None,
                Box::pin(async move { o.store_ntfs(&notifier_id, ntfs).await }),
            );
        }
        ShardMsg::RegisterSub {
            session,
            recipient_id,
            epoch,
        } => o.register_sub(&session, &recipient_id, epoch),
        ShardMsg::Tick => {
            pipeline.submit(
                Keys::Everything,
                None,
                Box::pin(async move { o.expire().await }),
            );
        }
        ShardMsg::ExpireNow { done } => {
            pipeline.submit(
                Keys::Everything,
                None,
                Box::pin(async move {
                    o.expire().await;
                    let _ = done.send(());
                }),
            );
        }
        // Connection output, metrics and stop are the loop's own.
        ShardMsg::Reply { .. }
        | ShardMsg::Event { .. }
        | ShardMsg::Redelivered { .. }
        | ShardMsg::Close { .. }
        | ShardMsg::Metrics
        | ShardMsg::StatsRequest { .. }
        | ShardMsg::StatsPart { .. }
        | ShardMsg::MetricsNow { .. }
        | ShardMsg::Stop => {}
    }
}

/// Starts a round of the metrics file: every shard is asked for its numbers, and their sum is
/// written when the last has answered (`gather_stats`). No lock: the numbers travel as messages.
fn ask_for_stats(ctx: &ShardContext) {
    let round = ctx.next_stats_round.get() + 1;
    ctx.next_stats_round.set(round);
    let shards = ctx.mesh.shards();
    *ctx.stats_round.borrow_mut() = Some(Gathering::new(round, shards, MetricsSnapshot::default()));
    let reply_to = ctx.shard_id;
    ctx.mesh
        .fan_out(|_| ShardMsg::StatsRequest { reply_to, round });
}

/// Folds one shard's numbers into the round; the last one writes
/// `<data-dir>/smp-server-metrics.txt`.
fn gather_stats(ctx: &ShardContext, round: u64, part: MetricsSnapshot) {
    let Some(g) = ctx.stats_round.borrow_mut().take() else {
        return;
    };
    match g.add(round, part, |total, p| total.add(&p)) {
        Step::Waiting(g) => *ctx.stats_round.borrow_mut() = Some(g),
        Step::Done(total) => {
            let path = metrics::metrics_path(&ctx.config.data_dir);
            let text = metrics::render(&total, metrics::now_ms());
            if let Err(e) = metrics::write_atomically(&path, &text) {
                tracing::warn!(error = %e, "cannot write the metrics file");
            }
            for done in ctx.stats_waiters.borrow_mut().drain(..) {
                let _ = done.send(());
            }
        }
    }
}

/// This shard's numbers: its owner's, its connections' and its proxy's.
fn shard_stats<S: ShardStore>(ctx: &ShardContext, owner: &Owner<S>) -> MetricsSnapshot {
    let mut m = MetricsSnapshot::from_shard(&owner.stats.borrow(), &owner.store.counters());
    m.queue_count = owner.store.queue_count() as u64;
    m.msg_count = owner.store.total_messages() as u64;
    m.subscriptions = owner.subs.borrow().len() as u64;
    m.connections = ctx.connections.get() as u64;
    m.output_drops = ctx.conn_stats.output_drops.get();
    m.output_reasks = ctx.conn_stats.output_reasks.get();
    m.slow_reader_closes = ctx.conn_stats.slow_reader_closes.get();
    let p = ctx.proxy.stats();
    m.p_relays = p.relays;
    m.p_relays_own = p.relays_own;
    m.p_msg_fwds = p.msg_fwds;
    m.p_msg_fwds_own = p.msg_fwds_own;
    m.p_msg_fwds_recv = super::forward::received_count();
    m
}

/// Warnings a peer causes at will, written at most once a second each (`log_limit`).
static ACCEPT_FAILED: RateLimited = RateLimited::new("accept failed");
static REFUSED_FULL: RateLimited = RateLimited::new("connection limit reached");
static REFUSED_ADDRESS: RateLimited = RateLimited::new("too many handshakes from one address");

async fn accept_loop(listener: TcpListener, ctx: Rc<ShardContext>) {
    loop {
        let sock = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and similar: wait a little rather than spin on the error.
                log_limit::warn(
                    &ACCEPT_FAILED,
                    |suppressed| tracing::warn!(shard = ctx.shard_id, error = %e, suppressed, "accept failed"),
                );
                glommio::timer::Timer::new(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A peer that reset before this accept has no address, and is gone anyway.
        let Ok(peer) = sock.peer_addr() else {
            continue;
        };
        // A refused socket is dropped (closed) at the `continue`.
        let (slot, handshaking) = match ctx.admission.admit(peer.ip()) {
            Ok(admitted) => admitted,
            Err(Refused::Full) => {
                log_limit::warn(&REFUSED_FULL, |suppressed| {
                    tracing::warn!(
                        max_connections = ctx.admission.max_connections(),
                        suppressed,
                        "connection limit reached, closing a new connection"
                    )
                });
                continue;
            }
            Err(Refused::AddressBusy) => {
                log_limit::warn(&REFUSED_ADDRESS, |suppressed| {
                    tracing::warn!(
                        max_per_address = ctx.config.max_handshakes_per_address,
                        suppressed,
                        "too many connections of one address in their handshake, closing a new one"
                    )
                });
                continue;
            }
        };
        ctx.connections.set(ctx.connections.get() + 1);
        let c = ctx.clone();
        glommio::spawn_local(async move {
            conn::serve(sock, c.clone(), handshaking).await;
            c.connections.set(c.connections.get() - 1);
            drop(slot);
        })
        .detach();
    }
}
