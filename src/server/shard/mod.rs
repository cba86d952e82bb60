//! One shard: a glommio executor pinned to a core, its listeners on the SMP ports (SO_REUSEPORT,
//! so every shard accepts on every port and the kernel spreads connections; see `listen.rs`), the
//! connections it accepted, and the owner of its queues. One inbox task takes the shard's messages
//! (`server/messages.rs`) and hands each role to its one place: owner work to `owner/jobs.rs`,
//! which makes it jobs of the pipeline (`owner/pipeline.rs`, per-queue order without holding up
//! the inbox), connection output to `ShardContext::conn_msg` (`context.rs`), statistics rounds to
//! `rounds.rs`.

pub mod admission;
pub mod clock_control;
pub mod context;
pub mod listen;
pub(crate) mod rounds;
pub mod stats;

use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::time::Duration;

use glommio::net::TcpListener;

use super::conn;
use super::messages::{OwnerMsg, ShardMsg, StatsMsg};
use super::owner::pipeline::Pipeline;
use super::owner::{owner_job, verify_across, Owner};
use super::router::ConnRef;
use super::web;
use crate::log_limit::{self, RateLimited};
use crate::server::conn::ws::PortKind;
use crate::store::ShardStore;
use admission::Refused;
use context::ShardContext;

/// What a shard's listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serves {
    /// SMP: native, WebSocket, or both split by SNI (`conn::serve`).
    Smp(PortKind),
    /// The web site alone (`server/web.rs`): over HTTPS with the web certificate when `tls`
    /// (`[WEB] https` on a port of its own), else plain HTTP (`[WEB] http`).
    Site { tls: bool },
}

/// Accepts on `listeners` (bound by `listen::shard_listener`) and runs the shard until it
/// is told to stop; returns the owner's store so that the caller can save it.
pub async fn run<S: ShardStore>(
    ctx: Rc<ShardContext>,
    owner: Owner<S>,
    inbox: flume::Receiver<ShardMsg>,
    listeners: Vec<(std::net::TcpListener, Serves)>,
    ready: impl FnOnce(),
) -> std::io::Result<S> {
    let listeners = listeners.into_iter().map(|(l, kind)| {
        // SAFETY: the descriptor is a bound, listening TCP socket that `into_raw_fd` gave up, so
        // the glommio listener is its only owner.
        (unsafe { TcpListener::from_raw_fd(l.into_raw_fd()) }, kind)
    });
    for (l, kind) in listeners {
        let task = match kind {
            Serves::Smp(kind) => glommio::spawn_local(accept_loop(l, kind, ctx.clone())),
            Serves::Site { tls: false } => {
                glommio::spawn_local(web::accept_loop(l, None, ctx.clone()))
            }
            Serves::Site { tls: true } => {
                glommio::spawn_local(web::accept_loop(l, ctx.tls.web.clone(), ctx.clone()))
            }
        };
        task.detach();
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
                mesh.send(shard, OwnerMsg::Tick);
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
                    mesh.send(shard, StatsMsg::Metrics);
                }
            })
        });
    // Shard 0 looks at least once a minute whether the daily statistics line is due.
    let daily_ticker = (ctx.shard_id == 0 && ctx.config.log_stats).then(|| {
        let mesh = ctx.mesh.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::Timer::new(Duration::from_secs(60)).await;
                mesh.send(0, StatsMsg::Daily { done: None });
            }
        })
    });
    let inactive = ctx
        .config
        .inactive
        .disconnect
        .then(|| glommio::spawn_local(close_inactive(ctx.clone())));
    // Test hook: shard 0 serves the clock control; bound before `ready` so that a test can use it
    // as soon as the relay has started.
    let clock_control = match ctx.config.test.clock_control.as_deref() {
        Some(path) if ctx.shard_id == 0 => {
            let listener = crate::server::shard::clock_control::bind(path)?;
            Some(glommio::spawn_local(
                crate::server::shard::clock_control::serve(listener, ctx.mesh.mesh().clone()),
            ))
        }
        _ => None,
    };
    // The control port, on shard 0, bound before `ready` so that a port in use stops the start.
    let control_port = match ctx.config.control.port {
        Some(port) if ctx.shard_id == 0 => {
            let listener = super::control::bind(port)?;
            Some(glommio::spawn_local(super::control::serve(
                listener,
                ctx.clone(),
            )))
        }
        _ => None,
    };
    owner.store.serving();
    ready();
    let store = inbox_loop(&ctx, owner, inbox).await;
    drop(control_port);
    drop(clock_control);
    drop(ticker);
    drop(metrics_ticker);
    drop(daily_ticker);
    drop(inactive);
    Ok(store)
}

/// `[INACTIVE_CLIENTS]`: every `check_interval`, the connections of this shard that neither sent
/// nor received a block for `ttl` are closed unless they hold a subscription on some owner
/// (simplexmq `Server.hs`, `disconnectTransport`: a subscribed client is never closed for it).
async fn close_inactive(ctx: Rc<ShardContext>) {
    let cfg = ctx.config.inactive.clone();
    loop {
        glommio::timer::Timer::new(cfg.check_interval).await;
        let idle: Vec<ConnRef> = ctx
            .connections_table
            .borrow()
            .iter()
            .filter(|(_, h)| h.state.last_active.get().elapsed() >= cfg.ttl)
            .map(|(&id, _)| ConnRef {
                shard: ctx.shard_id,
                id,
            })
            .collect();
        for conn in idle {
            let reply_to = ctx.shard_id;
            let held = ctx
                .gather_services(None, |round| OwnerMsg::ConnSubs {
                    conn,
                    reply_to,
                    round,
                })
                .await;
            if held == Some((0, [0; 16])) {
                tracing::debug!(conn = conn.id, "closing an inactive connection");
                ctx.close(conn);
            }
        }
    }
}

/// At most this many messages are taken from the inbox at once (`inbox_loop`): the block parts
/// among them share a batch verification, and the first waits for the others' verification
/// (bounded by `owner::CROSS_BATCH_MAX` signatures) before it runs.
const INBOX_TAKE_MAX: usize = 64;

/// The shard's single consumer: owner work, answers and events for this shard's connections.
/// Owner work becomes jobs of the pipeline (`owner/pipeline.rs`): a job that waits for its store does
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
    // What the inbox held at once, taken together so that the block parts among it are verified
    // in one batch (`Owner::batch_verify_across`), then handled in arrival order.
    let mut taken: Vec<ShardMsg> = Vec::with_capacity(INBOX_TAKE_MAX);
    'inbox: while let Ok(first) = inbox.recv_async().await {
        taken.push(first);
        while taken.len() < INBOX_TAKE_MAX {
            match inbox.try_recv() {
                Ok(m) => taken.push(m),
                Err(_) => break,
            }
        }
        verify_across(&owner, &mut taken);
        for msg in taken.drain(..) {
            ctx.mesh.mesh().received(ctx.shard_id, &msg);
            match msg {
                ShardMsg::Owner(m) => owner_job(&owner, &pipeline, m),
                ShardMsg::Conn(m) => ctx.conn_msg(m),
                ShardMsg::Stats(m) => rounds::handle(ctx, &owner, m),
                ShardMsg::Control(m) => super::owner::control_job(ctx, &owner, &pipeline, m),
                ShardMsg::Room { shard } => ctx.mesh.room(shard),
                ShardMsg::Hold { started, release } => {
                    let _ = started.send(());
                    let _ = release.recv_timeout(crate::server::shard::clock_control::MAX_HOLD);
                }
                ShardMsg::Stop => break 'inbox,
            }
        }
    }
    // A clean stop: jobs in flight finish before the store is handed back to be closed.
    drop(driver);
    pipeline.drain().await;
    drop(pipeline);
    // What the statistics backup saves (`server/shard/stats.rs`).
    let last = crate::server::shard::stats::Final {
        snapshot: rounds::shard_stats(ctx, &owner),
        activity: std::mem::take(&mut *owner.activity.borrow_mut()),
        daily: (ctx.shard_id == 0).then(|| ctx.daily.borrow().clone()),
    };
    ctx.stats
        .finals
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(last);
    match Rc::try_unwrap(owner) {
        Ok(o) => o.store,
        Err(_) => unreachable!("every job of the owner has finished"),
    }
}

/// Warnings a peer causes at will, written at most once a second each (`log_limit`).
static ACCEPT_FAILED: RateLimited = RateLimited::new("accept failed");
static REFUSED_FULL: RateLimited = RateLimited::new("connection limit reached");
static REFUSED_ADDRESS: RateLimited = RateLimited::new("too many handshakes from one address");

/// Accepts on one port; every port, SMP or WebSocket, shares the connection limits and admission.
async fn accept_loop(listener: TcpListener, kind: PortKind, ctx: Rc<ShardContext>) {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let sockets = ctx.stats.clone();
    let count = move |closed: bool| {
        if let Some(p) = sockets.port(port) {
            let n = if closed { &p.closed } else { &p.accepted };
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    };
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
        count(false);
        // A refused socket is dropped (closed) at the `continue`.
        // An IPv4 client of the dual-stack listener counts as its IPv4 address.
        let (slot, handshaking) = match ctx.admission.admit(peer.ip().to_canonical()) {
            Ok(admitted) => admitted,
            Err(Refused::Full) => {
                log_limit::warn(&REFUSED_FULL, |suppressed| {
                    tracing::warn!(
                        max_connections = ctx.admission.max_connections(),
                        suppressed,
                        "connection limit reached, closing a new connection"
                    )
                });
                count(true);
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
                count(true);
                continue;
            }
        };
        ctx.connections.set(ctx.connections.get() + 1);
        let c = ctx.clone();
        let count = count.clone();
        glommio::spawn_local(async move {
            conn::serve(sock, c.clone(), handshaking, kind).await;
            c.connections.set(c.connections.get() - 1);
            count(true);
            drop(slot);
        })
        .detach();
    }
}
