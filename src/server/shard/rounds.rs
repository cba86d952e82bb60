//! Rounds of statistics (`StatsMsg`): a shard asks every shard for its numbers (its owner's, its
//! connections', its proxy's) and the last answer writes their sum: the metrics file
//! (`smp-server-metrics.txt`, `metrics_interval`) on shard 0, or the daily line (`log_stats`).
//! No lock: the numbers travel as messages.

use crate::metrics::{self, MetricsSnapshot};
use crate::server::messages::StatsMsg;
use crate::server::owner::Owner;
use crate::server::router::{ConnRef, Gathering, Step};
use crate::server::shard::context::ShardContext;
use crate::store::ShardStore;

/// One statistics message of the inbox.
pub(super) fn handle<S: ShardStore>(ctx: &ShardContext, owner: &Owner<S>, msg: StatsMsg) {
    match msg {
        StatsMsg::Metrics => ask_for_stats(ctx),
        StatsMsg::MetricsNow { done } => {
            ctx.stats_waiters.borrow_mut().push(done);
            ask_for_stats(ctx);
        }
        StatsMsg::Request { reply_to, round } => {
            let pending = pending_times(owner);
            let ack = owner.ack_times.borrow().clone();
            ctx.stats.set_times(ctx.shard_id, ack, pending);
            ctx.stats.set_clients(ctx.shard_id, clients(owner));
            let part = Box::new(shard_stats(ctx, owner));
            ctx.mesh.send(reply_to, StatsMsg::Part { round, part })
        }
        StatsMsg::Part { round, part } => gather_stats(ctx, round, *part),
        StatsMsg::Daily { done } => daily_line_if_due(ctx, done),
        StatsMsg::DailyRequest {
            reply_to,
            round,
            week,
            month,
        } => {
            let part = Box::new(shard_stats(ctx, owner));
            owner.activity.borrow_mut().msgs.reset(week, month);
            owner.activity.borrow_mut().ntfs.reset(week, month);
            ctx.mesh.send(reply_to, StatsMsg::DailyPart { round, part });
        }
        StatsMsg::DailyPart { round, part } => gather_daily(ctx, round, *part),
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
    ctx.mesh.fan_out(|_| StatsMsg::Request { reply_to, round });
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
    ctx.mesh.fan_out(|_| StatsMsg::DailyRequest {
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
    let with = |f: &dyn Fn(&crate::server::owner::ConnEntries) -> bool| -> Vec<ConnRef> {
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
pub(crate) fn shard_stats<S: ShardStore>(ctx: &ShardContext, owner: &Owner<S>) -> MetricsSnapshot {
    let mut m = MetricsSnapshot::from_shard(&owner.stats.borrow(), &owner.store.counters());
    m.queue_count = owner.store.queue_count_estimate() as u64;
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
    // Counted by each shard's store where the directory is a cache, else by the directory.
    if let Some(n) = owner.store.notifier_count() {
        m.notifier_count = n as u64;
    }
    if ctx.shard_id == 0 {
        if !ctx.directory.is_cache() {
            m.notifier_count =
                ctx.directory
                    .len(crate::server::directory::IdSpace::Notifier) as u64;
        }
        m.rcv_services_count = ctx.services.count(ServiceRole::Messaging);
        m.ntf_services_count = ctx.services.count(ServiceRole::Notifier);
    }
    m.rcv_service_stats
        .add(&ctx.conn_stats.rcv_services.borrow());
    m.ntf_service_stats
        .add(&ctx.conn_stats.ntf_services.borrow());
    m
}
