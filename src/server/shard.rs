//! One shard: a glommio executor pinned to a core, its listeners on the SMP ports (SO_REUSEPORT, so
//! every shard accepts on every port and the kernel spreads connections; see `listen.rs`), the connections it
//! accepted, and the owner of its queues. One inbox task hands answers and events to the shard's
//! connections as they arrive, and turns owner work into jobs of the pipeline (`pipeline.rs`),
//! which run in per-queue order without holding up the inbox.

use std::os::fd::{FromRawFd, IntoRawFd};
use std::rc::Rc;
use std::time::Duration;

use glommio::net::TcpListener;

use super::admission::Refused;
use super::conn;
use super::context::ShardContext;
use super::control::request::ControlMsg;
use super::owner::Owner;
use super::pipeline::{Keys, Pipeline};
use super::router::{ConnRef, CountHash, Gathering, ServiceKey, Session, ShardMsg, Step};
use super::service_state::{FoldDone, FoldJob, SERVICE_FOLD_CHUNK};
use super::ws::PortKind;
use crate::log_limit::{self, RateLimited};
use crate::metrics::{self, MetricsSnapshot};
use crate::store::{EntityId, MessageStore, QueueStore, ShardStore};

/// Accepts on `listeners` (bound by `super::listen::shard_listener`) and runs the shard until it
/// is told to stop; returns the owner's store so that the caller can save it.
pub async fn run<S: ShardStore>(
    ctx: Rc<ShardContext>,
    owner: Owner<S>,
    inbox: flume::Receiver<ShardMsg>,
    listeners: Vec<(std::net::TcpListener, PortKind)>,
    ready: impl FnOnce(),
) -> std::io::Result<S> {
    let listeners = listeners.into_iter().map(|(l, kind)| {
        // SAFETY: the descriptor is a bound, listening TCP socket that `into_raw_fd` gave up, so
        // the glommio listener is its only owner.
        (unsafe { TcpListener::from_raw_fd(l.into_raw_fd()) }, kind)
    });
    for (l, kind) in listeners {
        glommio::spawn_local(accept_loop(l, kind, ctx.clone())).detach();
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
    // Shard 0 looks at least once a minute whether the daily statistics line is due.
    let daily_ticker = (ctx.shard_id == 0 && ctx.config.log_stats).then(|| {
        let mesh = ctx.mesh.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::Timer::new(Duration::from_secs(60)).await;
                mesh.send(0, ShardMsg::Daily { done: None });
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
            let listener = super::clock_control::bind(path)?;
            Some(glommio::spawn_local(super::clock_control::serve(
                listener,
                ctx.mesh.mesh().clone(),
            )))
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
                .gather_services(None, |round| ShardMsg::ConnSubs {
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
        ctx.mesh.mesh().received(ctx.shard_id, &msg);
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
            ShardMsg::StatsRequest { reply_to, round } => {
                let pending = pending_times(&owner);
                let ack = owner.ack_times.borrow().clone();
                ctx.stats.set_times(ctx.shard_id, ack, pending);
                ctx.stats.set_clients(ctx.shard_id, clients(&owner));
                ctx.mesh.send(
                    reply_to,
                    ShardMsg::StatsPart {
                        round,
                        part: Box::new(shard_stats(ctx, &owner)),
                    },
                )
            }
            ShardMsg::StatsPart { round, part } => gather_stats(ctx, round, *part),
            ShardMsg::ServicePart { round, part } => ctx.service_part(round, part),
            ShardMsg::MetricsNow { done } => {
                ctx.stats_waiters.borrow_mut().push(done);
                ask_for_stats(ctx);
            }
            ShardMsg::Daily { done } => daily_line_if_due(ctx, done),
            ShardMsg::DailyRequest {
                reply_to,
                round,
                week,
                month,
            } => {
                let part = Box::new(shard_stats(ctx, &owner));
                owner.activity.borrow_mut().msgs.reset(week, month);
                owner.activity.borrow_mut().ntfs.reset(week, month);
                ctx.mesh.send(reply_to, ShardMsg::DailyPart { round, part });
            }
            ShardMsg::DailyPart { round, part } => gather_daily(ctx, round, *part),
            ShardMsg::Room { shard } => ctx.mesh.room(shard),
            ShardMsg::HoldNow { started, release } => {
                let _ = started.send(());
                let _ = release.recv_timeout(super::clock_control::MAX_HOLD);
            }
            ShardMsg::Stop => break,
            ShardMsg::Control(m) => control(ctx, &owner, &pipeline, m),
            m => owner_job(&owner, &pipeline, m),
        }
    }
    // A clean stop: jobs in flight finish before the store is handed back to be closed.
    drop(driver);
    pipeline.drain().await;
    drop(pipeline);
    // What the statistics backup saves (`server/stats.rs`).
    let last = super::stats::Final {
        snapshot: shard_stats(ctx, &owner),
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
        #[cfg(feature = "test-kit")]
        ShardMsg::RegisterSub {
            session,
            recipient_id,
            epoch,
        } => o.register_sub(&session, &recipient_id, epoch),
        ShardMsg::ServiceCount {
            key,
            reply_to,
            round,
        } => {
            let part = o.services.count(&key);
            o.mesh.send(reply_to, ShardMsg::ServicePart { round, part });
        }
        ShardMsg::ServiceTake {
            key,
            session,
            answered,
            round,
        } => take_service(o, pipeline, key, session, answered, round),
        ShardMsg::ServiceSubscribed {
            key,
            session,
            hash,
            newly,
        } => o.service_subscribed(key, session, hash, newly),
        ShardMsg::ServiceDropped { key, hash } => o.service_dropped(&key, hash),
        ShardMsg::ServiceSwitch { key, session } => o.service_switch(&key, &session),
        ShardMsg::ServiceCurrent {
            key,
            conn,
            reply_to,
            round,
        } => {
            let part = o.services.current(&key, conn);
            o.mesh.send(reply_to, ShardMsg::ServicePart { round, part });
        }
        ShardMsg::ConnSubs {
            conn,
            reply_to,
            round,
        } => {
            let part = (o.subscriptions_of(conn) as i64, [0; 16]);
            o.mesh.send(reply_to, ShardMsg::ServicePart { round, part });
        }
        ShardMsg::Tick => expire(o, pipeline, None),
        ShardMsg::ExpireNow { done } => expire(o, pipeline, Some(done)),
        // Connection output, metrics and stop are the loop's own.
        ShardMsg::Reply { .. }
        | ShardMsg::Event { .. }
        | ShardMsg::Redelivered { .. }
        | ShardMsg::Close { .. }
        | ShardMsg::Metrics
        | ShardMsg::StatsRequest { .. }
        | ShardMsg::StatsPart { .. }
        | ShardMsg::MetricsNow { .. }
        | ShardMsg::Daily { .. }
        | ShardMsg::DailyRequest { .. }
        | ShardMsg::DailyPart { .. }
        | ShardMsg::ServicePart { .. }
        | ShardMsg::Control(_)
        | ShardMsg::Room { .. }
        | ShardMsg::HoldNow { .. }
        | ShardMsg::Stop => {}
    }
}

/// The control port's requests (`server/control/`): numbers and connections are answered at once;
/// a queue operation is a job holding its queue, in the per-queue order like any command on it.
fn control<S: ShardStore>(
    ctx: &ShardContext,
    owner: &Rc<Owner<S>>,
    pipeline: &Pipeline,
    msg: ControlMsg,
) {
    match msg {
        ControlMsg::Stats { reply } => {
            let _ = reply.try_send(Box::new(shard_stats(ctx, owner)));
        }
        ControlMsg::Clients { reply } => {
            let by_conn = owner.by_conn.borrow();
            let subs = by_conn
                .iter()
                .map(|(c, e)| ((c.shard, c.id), e.subs.len(), e.ntf_subs.len()))
                .filter(|(_, q, n)| q + n > 0)
                .collect();
            let part = super::control::shard_clients(
                ctx,
                subs,
                owner.subs.borrow().len(),
                owner.ntf_subs.borrow().len(),
            );
            let _ = reply.try_send(part);
        }
        // A job over every queue, so that no operation is halfway through what is saved.
        ControlMsg::Save { reply } => {
            let o = owner.clone();
            let settings = super::store_settings(&ctx.config);
            let groups = super::router::groups_of_shard(ctx.shard_id, ctx.mesh.shards());
            pipeline.submit(
                Keys::Everything,
                None,
                Box::pin(async move {
                    let _ = reply.try_send(o.store.save_running(&settings, &groups));
                }),
            );
        }
        ControlMsg::Queue {
            recipient_id,
            op,
            reply,
        } => {
            let o = owner.clone();
            pipeline.submit(
                Keys::of([recipient_id.as_slice()]),
                None,
                Box::pin(async move {
                    let _ = reply.try_send(o.control_queue(&recipient_id, op).await);
                }),
            );
        }
    }
}

/// Starts a round of the metrics file: every shard is asked for its numbers, and their sum is
/// written when the last has answered (`gather_stats`). No lock: the numbers travel as messages.
/// The periodic expiration (`done`: told when it has run). On a store that never waits, one job
/// over every queue; on one that waits, a job per `EXPIRE_QUEUES_PER_JOB` queues that may hold
/// messages, each on those queues only, and one for the notifications, so that no job holds the
/// whole shard while the database works (`docs/ARCHITECTURE.md` §2).
fn expire<S: QueueStore + MessageStore + 'static>(
    o: Rc<Owner<S>>,
    pipeline: &Pipeline,
    done: Option<flume::Sender<()>>,
) {
    if !o.store.waits() {
        pipeline.submit(
            Keys::Everything,
            None,
            Box::pin(async move {
                o.expire().await;
                if let Some(d) = done {
                    let _ = d.send(());
                }
            }),
        );
        return;
    }
    let candidates = o.store.expiry_candidates();
    let chunks: Vec<Vec<crate::store::EntityId>> = candidates
        .chunks(crate::limits::EXPIRE_QUEUES_PER_JOB)
        .map(<[crate::store::EntityId]>::to_vec)
        .collect();
    // Jobs left, and `done` told when the last one ends.
    let left = Rc::new(std::cell::Cell::new(chunks.len() + 1));
    let done = Rc::new(std::cell::RefCell::new(done));
    let finish = move || {
        left.set(left.get() - 1);
        if left.get() == 0 {
            if let Some(d) = done.borrow_mut().take() {
                let _ = d.send(());
            }
        }
    };
    for chunk in chunks {
        let (o, finish) = (o.clone(), finish.clone());
        pipeline.submit(
            Keys::of(chunk.iter().map(|r| &r[..])),
            None,
            Box::pin(async move {
                o.expire_queues(&chunk).await;
                finish();
            }),
        );
    }
    pipeline.submit(
        Keys::Queues(Vec::new()),
        None,
        Box::pin(async move {
            o.expire_ntfs().await;
            finish();
        }),
    );
}

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
            let mut total = total;
            [
                total.sub_clients,
                total.delivered_clients,
                total.ntf_sub_clients,
            ] = ctx.stats.clients();
            let daily = ctx.daily.borrow();
            let (ack_times, pending_times) = ctx.stats.times();
            let extra = metrics::Extra {
                from_ms: daily.from_ms,
                sockets: ctx.stats.sockets(),
                threads: super::stats::threads(),
                pending_times,
                ack_times,
            };
            let text = metrics::render(&daily.shown(&total), &extra, metrics::now_ms());
            drop(daily);
            if let Err(e) = metrics::write_atomically(&path, &text) {
                tracing::warn!(error = %e, "cannot write the metrics file");
            }
            if ctx.config.metrics_listen.is_some() {
                *ctx.stats.latest.lock().unwrap_or_else(|e| e.into_inner()) =
                    (Some(std::time::Instant::now()), text);
            }
            for done in ctx.stats_waiters.borrow_mut().drain(..) {
                let _ = done.send(());
            }
        }
    }
}

/// Shard 0: when the daily line is due (`log_stats`), every shard is asked for its numbers and
/// starts its active-queue periods again; the line is written when the last has answered
/// (`gather_daily`). `done` is told then, or at once when no line is due.
fn daily_line_if_due(ctx: &ShardContext, done: Option<flume::Sender<()>>) {
    let now = crate::clock::now_secs();
    let due = ctx.daily.borrow().next_line.is_some_and(|at| now >= at);
    if !due || ctx.daily_round.borrow().is_some() {
        if let Some(d) = done {
            match due {
                true => ctx.daily_waiters.borrow_mut().push(d),
                false => drop(d.send(())),
            }
        }
        return;
    }
    if let Some(d) = done {
        ctx.daily_waiters.borrow_mut().push(d);
    }
    let (week, month) = crate::stats_file::week_month_due(now);
    let round = ctx.next_stats_round.get() + 1;
    ctx.next_stats_round.set(round);
    let shards = ctx.mesh.shards();
    *ctx.daily_round.borrow_mut() = Some(Gathering::new(round, shards, MetricsSnapshot::default()));
    let reply_to = ctx.shard_id;
    ctx.mesh.fan_out(|_| ShardMsg::DailyRequest {
        reply_to,
        round,
        week,
        month,
    });
}

/// Folds one shard's numbers into the daily round; the last one writes the line, and the
/// counters the line reports start again from 0 (`stats::Daily`).
fn gather_daily(ctx: &ShardContext, round: u64, part: MetricsSnapshot) {
    let Some(g) = ctx.daily_round.borrow_mut().take() else {
        return;
    };
    match g.add(round, part, |total, p| total.add(&p)) {
        Step::Waiting(g) => *ctx.daily_round.borrow_mut() = Some(g),
        Step::Done(total) => {
            let now = crate::clock::now_secs();
            let (week, month) = crate::stats_file::week_month_due(now);
            let mut daily = ctx.daily.borrow_mut();
            let shown = daily.shown(&total);
            let counts = |d: u64, w: u64, m: u64| crate::stats_file::PeriodCounts {
                day: d,
                week: week.then_some(w),
                month: month.then_some(m),
            };
            let line = crate::stats_file::daily_line(
                (daily.from_ms / 1000) as i64,
                &shown,
                &counts(shown.active_day, shown.active_week, shown.active_month),
                &counts(
                    shown.active_ntf_day,
                    shown.active_ntf_week,
                    shown.active_ntf_month,
                ),
            );
            super::stats::append_daily(&ctx.config, &line);
            daily.baseline.add(&shown.daily_part());
            daily.from_ms = crate::clock::now_ms();
            daily.next_line = Some(crate::stats_file::first_line_at(now + 1));
            drop(daily);
            for done in ctx.daily_waiters.borrow_mut().drain(..) {
                let _ = done.send(());
            }
        }
    }
}

/// This owner's connections with a subscription, with a delivery waiting for its ACK, with a
/// notifier subscription.
fn clients<S: ShardStore>(owner: &Owner<S>) -> [Vec<ConnRef>; 3] {
    let by_conn = owner.by_conn.borrow();
    let with = |f: &dyn Fn(&super::owner::ConnEntries) -> bool| -> Vec<ConnRef> {
        by_conn
            .iter()
            .filter(|(_, e)| f(e))
            .map(|(c, _)| *c)
            .collect()
    };
    let mut delivered: Vec<ConnRef> = owner
        .subs
        .borrow()
        .values()
        .filter(|s| s.delivered.is_some())
        .map(|s| s.session.conn)
        .collect();
    delivered.sort_unstable_by_key(|c| (c.shard, c.id));
    delivered.dedup();
    [
        with(&|e| !e.subs.is_empty()),
        delivered,
        with(&|e| !e.ntf_subs.is_empty()),
    ]
}

/// The ages of this owner's deliveries that wait for their ACK.
fn pending_times<S: ShardStore>(owner: &Owner<S>) -> metrics::TimeBuckets {
    let now = crate::clock::now_secs();
    let mut t = metrics::TimeBuckets::default();
    for s in owner
        .subs
        .borrow()
        .values()
        .filter(|s| s.delivered.is_some())
    {
        t.record(now.saturating_sub(s.delivered_at).max(0) as u64);
    }
    t
}

/// This shard's numbers: its owner's, its connections' and its proxy's.
fn shard_stats<S: ShardStore>(ctx: &ShardContext, owner: &Owner<S>) -> MetricsSnapshot {
    let mut m = MetricsSnapshot::from_shard(&owner.stats.borrow(), &owner.store.counters());
    m.queue_count = owner.store.queue_count() as u64;
    m.msg_count = owner.store.total_messages() as u64;
    m.ntf_count = owner.store.ntf_count() as u64;
    {
        let subs = owner.subs.borrow();
        m.subscriptions = subs.len() as u64;
        let mut delivered_to = std::collections::HashSet::new();
        for s in subs.values().filter(|s| s.delivered.is_some()) {
            m.delivered_subs += 1;
            delivered_to.insert(s.session.conn);
        }
        m.delivered_clients = delivered_to.len() as u64;
    }
    for e in owner.by_conn.borrow().values() {
        m.sub_clients += u64::from(!e.subs.is_empty());
        m.ntf_sub_clients += u64::from(!e.ntf_subs.is_empty());
    }
    m.ntf_subscriptions = owner.ntf_subs.borrow().len() as u64;
    {
        let a = owner.activity.borrow();
        [m.active_day, m.active_week, m.active_month] = a.msgs.counts();
        [m.active_ntf_day, m.active_ntf_week, m.active_ntf_month] = a.ntfs.counts();
    }
    let cs = &ctx.conn_stats;
    m.sub_batches = cs.sub_batches.get();
    m.queues_deleted_batches = cs.del_batches.get();
    m.ntf_deleted_batches = cs.ndel_batches.get();
    m.ntf_sub_batches = cs.nsub_batches.get();
    // Without a resolver every RSLV is refused (`ERR NAME NO_RESOLVER`), as the reference counts it.
    m.rslv_reqs = cs.rslv_reqs.get();
    m.rslv_disabled = cs.rslv_reqs.get();
    m.connections = ctx.connections.get() as u64;
    m.relay.add(&ctx.conn_stats.relay.get());
    let p = ctx.proxy.stats();
    m.p_relays = p.relays;
    m.p_relays_own = p.relays_own;
    m.p_msg_fwds = p.msg_fwds;
    m.p_msg_fwds_own = p.msg_fwds_own;
    m.p_msg_fwds_recv += cs.fwd_answers.get();
    use crate::protocol::command::ServiceRole;
    (m.rcv_services, m.rcv_service_subs) = owner.services.totals(ServiceRole::Messaging);
    (m.ntf_services, m.ntf_service_subs) = owner.services.totals(ServiceRole::Notifier);
    m.rcv_services_queues = owner.services.associated_queues(ServiceRole::Messaging);
    m.ntf_services_queues = owner.services.associated_queues(ServiceRole::Notifier);
    // The registry is the relay's, not the shard's: counted once.
    if ctx.shard_id == 0 {
        m.notifier_count = ctx.directory.len(super::directory::IdSpace::Notifier) as u64;
        m.rcv_services_count = ctx.services.count(ServiceRole::Messaging);
        m.ntf_services_count = ctx.services.count(ServiceRole::Notifier);
    }
    m.rcv_service_stats
        .add(&ctx.conn_stats.rcv_services.borrow());
    m.ntf_service_stats
        .add(&ctx.conn_stats.ntf_services.borrow());
    m
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

/// `SUBS`/`NSUBS` on this owner (`ShardMsg::ServiceTake`): the connection becomes the service's
/// subscriber at once, then the service's queues are folded in jobs of `SERVICE_FOLD_CHUNK`,
/// each holding its queues (their order with SENDs, ACKs and SUBs is the per-queue order, §2);
/// the connection's shard hears when the last has ended.
fn take_service<S: QueueStore + MessageStore + 'static>(
    o: Rc<Owner<S>>,
    pipeline: &Pipeline,
    key: ServiceKey,
    session: Session,
    answered: CountHash,
    round: u64,
) {
    let home = o.mesh.owner_of(&key.0) == o.shard;
    let (queues, prev) = o.take_service(&key, &session, answered, home);
    let reply_to = session.conn.shard;
    let mesh = o.mesh.clone();
    let chunks: Vec<Vec<EntityId>> = queues
        .chunks(SERVICE_FOLD_CHUNK)
        .map(<[EntityId]>::to_vec)
        .collect();
    let done = FoldDone::new(chunks.len(), move || {
        mesh.send(
            reply_to,
            ShardMsg::ServicePart {
                round,
                part: (0, [0; 16]),
            },
        )
    });
    for chunk in chunks {
        let (o, key, session) = (o.clone(), key.clone(), session.clone());
        let job = FoldJob(done.clone());
        pipeline.submit(
            Keys::of(chunk.iter().map(Vec::as_slice)),
            Some(session.conn),
            Box::pin(async move {
                match key.1 {
                    crate::protocol::command::ServiceRole::Notifier => {
                        o.fold_ntf_chunk(&key, &session, chunk).await
                    }
                    _ => o.fold_service_chunk(&key, &session, prev, chunk).await,
                }
                drop(job);
            }),
        );
    }
}
