//! The metrics file `<data-dir>/smp-server-metrics.txt`: Prometheus text, rewritten every
//! `prometheus_interval` seconds (simplexmq `Server/Prometheus.hs`), for a node exporter's
//! textfile collector or any scraper that reads files (and served on `GET /metrics` when
//! `metrics_listen` is set, `server/shard/stats.rs`).
//!
//! Every family of the reference is written in its order and layout — section titles, the
//! `# <counter>` line after each sample, exact names (spelling included, e.g. `subscribtion`) and
//! help texts — so dashboards built for the reference keep working; this relay's own metrics
//! follow, named `smprelay_…`. Every sample carries a millisecond timestamp, as the reference's do.
//! The counters are the reference's `ServerStats` (simplexmq `Server/Stats.hs`), counted where its
//! `Server.hs` counts them.
//!
//! The server collects one [`MetricsSnapshot`] per shard, sums them with [`MetricsSnapshot::add`],
//! and writes [`render`]'s text with [`write_atomically`] to [`metrics_path`].

use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::store::StoreCounters;

pub const METRICS_FILE: &str = "smp-server-metrics.txt";

pub fn metrics_path(data_dir: &Path) -> PathBuf {
    data_dir.join(METRICS_FILE)
}

/// One family of the reference's proxy statistics (`ProxyStatsData`): requests, and how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub requests: u64,
    pub successes: u64,
    /// Network errors and timeouts (the reference's `temporaryClientError`).
    pub errors_connect: u64,
    /// A destination whose version this relay cannot proxy.
    pub errors_compat: u64,
    pub errors_other: u64,
}

impl ProxyStats {
    pub fn minus(&mut self, o: &ProxyStats) {
        self.requests = self.requests.saturating_sub(o.requests);
        self.successes = self.successes.saturating_sub(o.successes);
        self.errors_connect = self.errors_connect.saturating_sub(o.errors_connect);
        self.errors_compat = self.errors_compat.saturating_sub(o.errors_compat);
        self.errors_other = self.errors_other.saturating_sub(o.errors_other);
    }

    #[cfg(test)]
    fn numbered(from: u64) -> ProxyStats {
        ProxyStats {
            requests: from,
            successes: from + 1,
            errors_connect: from + 2,
            errors_compat: from + 3,
            errors_other: from + 4,
        }
    }

    pub fn add(&mut self, o: &ProxyStats) {
        let ProxyStats {
            requests,
            successes,
            errors_connect,
            errors_compat,
            errors_other,
        } = o;
        self.requests = self.requests.saturating_add(*requests);
        self.successes = self.successes.saturating_add(*successes);
        self.errors_connect = self.errors_connect.saturating_add(*errors_connect);
        self.errors_compat = self.errors_compat.saturating_add(*errors_compat);
        self.errors_other = self.errors_other.saturating_add(*errors_other);
    }
}

/// The reference's statistics of the services of one role (`ServiceStatsData`, Stats.hs): queue
/// associations made by SUB/NSUB, subscriptions by them, and how `SUBS`/`NSUBS` counts compared
/// with the client's. `sub_duplicate` and `sub_end` are never counted, as in the reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// A service's SUB/NSUB associated a queue that had no service, moved one from another
    /// service, or found it associated already; an ordinary session's dissociated one.
    pub assoc_new: u64,
    pub assoc_duplicate: u64,
    pub assoc_updated: u64,
    pub assoc_removed: u64,
    /// Service SUB/NSUBs that made a connection count its first queue, and queues so counted.
    pub sub_count: u64,
    pub sub_duplicate: u64,
    pub sub_queues: u64,
    pub sub_end: u64,
    /// `SUBS`/`NSUBS` whose count and hash were the client's, more, fewer, or the same count with
    /// another hash; and by how many queues.
    pub sub_ok: u64,
    pub sub_more: u64,
    pub sub_fewer: u64,
    pub sub_diff: u64,
    pub sub_more_total: u64,
    pub sub_fewer_total: u64,
}

impl ServiceStats {
    /// A SUB/NSUB found the queue with service `before` and left it with `now`.
    pub fn count_association(&mut self, before: Option<&[u8]>, now: Option<&[u8]>) {
        let n = match (before, now) {
            (b, Some(s)) if b == Some(s) => &mut self.assoc_duplicate,
            (None, Some(_)) => &mut self.assoc_new,
            (Some(_), Some(_)) => &mut self.assoc_updated,
            (Some(_), None) => &mut self.assoc_removed,
            (None, None) => return,
        };
        *n += 1;
    }

    /// A `SUBS`/`NSUBS` found `found` queues with `found_hash` where the client expected
    /// `expected` (`None`: a client below v19, which sends no count).
    pub fn count_subs(&mut self, expected: Option<(i64, [u8; 16])>, found: (i64, [u8; 16])) {
        match expected {
            None => self.sub_ok += 1,
            Some((-1, _)) => self.sub_ok += 1,
            Some(e) if e == found => self.sub_ok += 1,
            Some((n, _)) if found.0 > n => {
                self.sub_more += 1;
                self.sub_more_total += found.0.abs_diff(n);
            }
            Some((n, _)) if found.0 < n => {
                self.sub_fewer += 1;
                self.sub_fewer_total += found.0.abs_diff(n);
            }
            Some(_) => self.sub_diff += 1,
        }
    }

    /// The fields as the reference's `ServiceStatsData` lists them.
    pub fn fields_mut(&mut self) -> [&mut u64; 14] {
        [
            &mut self.assoc_new,
            &mut self.assoc_duplicate,
            &mut self.assoc_updated,
            &mut self.assoc_removed,
            &mut self.sub_count,
            &mut self.sub_duplicate,
            &mut self.sub_queues,
            &mut self.sub_end,
            &mut self.sub_ok,
            &mut self.sub_more,
            &mut self.sub_fewer,
            &mut self.sub_diff,
            &mut self.sub_more_total,
            &mut self.sub_fewer_total,
        ]
    }

    pub fn minus(&mut self, o: &ServiceStats) {
        let mut o = *o;
        for (a, b) in self.fields_mut().into_iter().zip(o.fields_mut()) {
            *a = a.saturating_sub(*b);
        }
    }

    #[cfg(test)]
    fn numbered(from: u64) -> ServiceStats {
        let mut s = ServiceStats::default();
        for (i, f) in s.fields_mut().into_iter().enumerate() {
            *f = from + i as u64;
        }
        s
    }

    pub fn add(&mut self, o: &ServiceStats) {
        let ServiceStats {
            assoc_new,
            assoc_duplicate,
            assoc_updated,
            assoc_removed,
            sub_count,
            sub_duplicate,
            sub_queues,
            sub_end,
            sub_ok,
            sub_more,
            sub_fewer,
            sub_diff,
            sub_more_total,
            sub_fewer_total,
        } = o;
        for (sum, n) in [
            (&mut self.assoc_new, assoc_new),
            (&mut self.assoc_duplicate, assoc_duplicate),
            (&mut self.assoc_updated, assoc_updated),
            (&mut self.assoc_removed, assoc_removed),
            (&mut self.sub_count, sub_count),
            (&mut self.sub_duplicate, sub_duplicate),
            (&mut self.sub_queues, sub_queues),
            (&mut self.sub_end, sub_end),
            (&mut self.sub_ok, sub_ok),
            (&mut self.sub_more, sub_more),
            (&mut self.sub_fewer, sub_fewer),
            (&mut self.sub_diff, sub_diff),
            (&mut self.sub_more_total, sub_more_total),
            (&mut self.sub_fewer_total, sub_fewer_total),
        ] {
            *sum = sum.saturating_add(*n);
        }
    }
}

/// Declares [`MetricsSnapshot`] with its plain `u64` fields listed once, so that summing shards,
/// subtracting a baseline, the daily reset and the unit tests cannot forget one. A field marked
/// `[daily]` is one the reference's daily statistics line reports and then starts again from 0
/// (simplexmq `Server.hs`, `logServerStats`: the counters it swaps with 0); `= "key"` is its
/// name in the reference (`keys`), which the backup file, the control port's `stats` and the
/// metrics' comments print. A reference counter is then this line, its `+=` (an owner's
/// `Owner::stats`, or the shard's own numbers in `shard/rounds.rs`) and its place in each of the
/// reference's layouts (`render`, `stats_file.rs`, the control port's `render_stats`), which
/// name it by field.
macro_rules! snapshot {
    (@daily $d:ident, $s:ident, $field:ident, daily) => {
        $d.$field = $s.$field;
    };
    ($($(#[$doc:meta])* $field:ident $([$mark:ident])? $(= $key:literal)?,)*) => {
        /// The reference's name of each counter that has one (its `ServerStats` field, simplexmq
        /// `src/Simplex/Messaging/Server/Stats.hs`): the key of its line in the statistics backup
        /// and in the control port's `stats`, and the comment of its metric.
        #[allow(non_upper_case_globals)]
        pub mod keys {
            $($(pub const $field: &str = $key;)?)*
        }

        /// Plain numbers, per shard or summed over shards. Counters only grow while the relay runs
        /// (until a daily statistics line resets the reference's, `log_stats`); gauges are
        /// current values.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $($(#[$doc])* pub $field: u64,)*
            /// Proxy role: sessions asked for with PRXY (`pRelays`) and messages forwarded with
            /// PFWD (`pMsgFwds`), all and to `own_server_domains`.
            pub p_relays: ProxyStats,
            pub p_relays_own: ProxyStats,
            pub p_msg_fwds: ProxyStats,
            pub p_msg_fwds_own: ProxyStats,
            pub rcv_service_stats: ServiceStats,
            pub ntf_service_stats: ServiceStats,
            /// The relay's own counters (`counters.rs`): its store's, its owner's and its
            /// connections' summed.
            pub relay: crate::counters::RelayCounters,
        }

        impl MetricsSnapshot {
            /// Adds another shard's numbers to these.
            pub fn add(&mut self, o: &MetricsSnapshot) {
                $(self.$field = self.$field.saturating_add(o.$field);)*
                self.p_relays.add(&o.p_relays);
                self.p_relays_own.add(&o.p_relays_own);
                self.p_msg_fwds.add(&o.p_msg_fwds);
                self.p_msg_fwds_own.add(&o.p_msg_fwds_own);
                self.rcv_service_stats.add(&o.rcv_service_stats);
                self.ntf_service_stats.add(&o.ntf_service_stats);
                self.relay.add(&o.relay);
            }

            /// The counters a daily statistics line reports and then resets (the fields marked
            /// `[daily]`, and the proxy's); every other field 0.
            pub fn daily_part(&self) -> MetricsSnapshot {
                let mut d = MetricsSnapshot::default();
                $($(snapshot!(@daily d, self, $field, $mark);)?)*
                d.p_relays = self.p_relays;
                d.p_relays_own = self.p_relays_own;
                d.p_msg_fwds = self.p_msg_fwds;
                d.p_msg_fwds_own = self.p_msg_fwds_own;
                d
            }

            /// Takes `o` from these numbers (a baseline: what the last daily line showed).
            pub fn minus(&mut self, o: &MetricsSnapshot) {
                $(self.$field = self.$field.saturating_sub(o.$field);)*
                self.p_relays.minus(&o.p_relays);
                self.p_relays_own.minus(&o.p_relays_own);
                self.p_msg_fwds.minus(&o.p_msg_fwds);
                self.p_msg_fwds_own.minus(&o.p_msg_fwds_own);
                self.rcv_service_stats.minus(&o.rcv_service_stats);
                self.ntf_service_stats.minus(&o.ntf_service_stats);
                self.relay.minus(&o.relay);
            }

            #[cfg(test)]
            fn numbered(from: u64) -> MetricsSnapshot {
                let mut n = from;
                let mut next = || { n += 1; n };
                MetricsSnapshot {
                    $($field: next(),)*
                    p_relays: ProxyStats::numbered(from + 1000),
                    p_relays_own: ProxyStats::numbered(from + 1010),
                    p_msg_fwds: ProxyStats::numbered(from + 1020),
                    p_msg_fwds_own: ProxyStats::numbered(from + 1030),
                    rcv_service_stats: ServiceStats::numbered(from + 1100),
                    ntf_service_stats: ServiceStats::numbered(from + 1200),
                    relay: crate::counters::RelayCounters::numbered(from + 1300),
                }
            }
        }
    };
}

snapshot! {
    queues_created [daily] = "qCreated",
    queues_secured [daily] = "qSecured",
    queues_deleted [daily] = "qDeletedAll",
    /// `qDeletedNew`, `qDeletedSecured`, `qDeletedAllB` (blocks of DELs), `qBlocked`.
    queues_deleted_new [daily] = "qDeletedNew",
    queues_deleted_secured [daily] = "qDeletedSecured",
    queues_deleted_batches [daily] = "qDeletedAllB",
    queues_blocked [daily] = "qBlocked",
    msg_sent [daily] = "msgSent",
    msg_sent_auth [daily] = "msgSentAuth",
    msg_sent_quota [daily] = "msgSentQuota",
    msg_sent_large [daily] = "msgSentLarge",
    msg_sent_block = "msgSentBlock",
    msg_recv [daily] = "msgRecv",
    msg_expired [daily] = "msgExpired",
    /// Notifications sent to notification servers (`msgNtfs`), in batches (`msgNtfsB`); none
    /// is ever lost or sent without a subscriber here (`msgNtfNoSub`, `msgNtfLost`: 0, as on the
    /// reference); expired (`msgNtfExpired`).
    msg_ntfs [daily] = "msgNtfs",
    msg_ntfs_batches [daily] = "msgNtfsB",
    msg_ntf_no_sub [daily] = "msgNtfNoSub",
    msg_ntf_lost [daily] = "msgNtfLost",
    msg_ntf_expired [daily] = "msgNtfExpired",
    /// New subscriptions that delivered a waiting message (`qSub`).
    sub_successes [daily] = "qSub",
    /// Blocks of SUBs (`qSubAllB`).
    sub_batches [daily] = "qSubAllB",
    sub_auth [daily] = "qSubAuth",
    sub_duplicate [daily] = "qSubDuplicate",
    sub_prohibited [daily] = "qSubProhibited",
    /// END and DELD events sent (`qSubEnd`), in batches (`qSubEndB`).
    sub_end [daily] = "qSubEnd",
    sub_end_batches [daily] = "qSubEndB",
    msg_sent_ntf [daily] = "msgSentNtf",
    msg_recv_ntf [daily] = "msgRecvNtf",
    msg_get [daily] = "msgGet",
    msg_recv_get [daily] = "msgRecvGet",
    msg_get_no_msg [daily] = "msgGetNoMsg",
    msg_get_auth [daily] = "msgGetAuth",
    msg_get_duplicate [daily] = "msgGetDuplicate",
    msg_get_prohibited [daily] = "msgGetProhibited",
    ntf_created [daily] = "ntfCreated",
    ntf_new_created = "ntfNewCreated",
    ntf_deleted [daily] = "ntfDeleted",
    ntf_deleted_batches [daily] = "ntfDeletedB",
    ntf_sub [daily] = "ntfSub",
    ntf_sub_batches [daily] = "ntfSubB",
    ntf_sub_auth [daily] = "ntfSubAuth",
    ntf_sub_duplicate [daily] = "ntfSubDuplicate",
    /// RSLV requests, and those refused for want of a resolver (every one here).
    rslv_reqs [daily],
    rslv_success [daily],
    rslv_not_found [daily],
    rslv_resolver_errs [daily],
    rslv_disabled [daily],
    /// Gauges: distinct queues with a message sent or received today, this week, this month (as
    /// the reference's `activeQueues`), and of messages with the notification flag.
    active_day,
    active_week,
    active_month,
    active_ntf_day,
    active_ntf_week,
    active_ntf_month,
    /// Gauge: queues in the store.
    queue_count = "qCount",
    /// Gauge: messages in the store (quota markers included).
    msg_count,
    /// Gauges: notifications waiting (`ntfCount`), queues with a notifier.
    ntf_count,
    notifier_count,
    /// Gauge: queues with a subscriber.
    subscriptions,
    /// Gauges: connections with a subscription; subscriptions with a delivered, unacknowledged
    /// message, and connections holding one; notifier subscriptions and their connections.
    sub_clients,
    delivered_subs,
    delivered_clients,
    ntf_subscriptions,
    ntf_sub_clients,
    /// Gauge: open client connections.
    connections,
    /// Destination role: RFWDs answered (`pMsgFwdsRecv`).
    p_msg_fwds_recv [daily],
    /// Services with a subscribed connection, and the subscriptions those connections hold, per
    /// role (the reference's `serviceSubscribers` and `totalServiceSubs`).
    rcv_services,
    rcv_service_subs,
    ntf_services,
    ntf_service_subs,
    /// MSGs handed to messaging services by SUBS, and queues they already held
    /// (`rcvServicesSubMsg`, `rcvServicesSubDuplicate`).
    rcv_services_sub_msg,
    rcv_services_sub_duplicate,
    /// Known services per role, and queues associated with one (the reference's entity counts).
    rcv_services_count,
    rcv_services_queues,
    ntf_services_count,
    ntf_services_queues,
}

impl MetricsSnapshot {
    /// The counters of one shard; the gauges are left at 0 for the caller to set.
    pub fn from_shard(owner: &MetricsSnapshot, store: &StoreCounters) -> Self {
        let mut m = *owner;
        m.relay.add(store);
        // Each END or DELD goes out at once, a batch of its own (`docs/ARCHITECTURE.md` §3, O5).
        m.sub_end_batches = m.sub_end;
        m
    }
}

/// The hash a queue is counted by in the active-queue sets, and saved as in the statistics backup
/// (a signed 64-bit number, as the reference's `hash` of the recipient ID): the first 8 bytes of
/// SHA-256(recipient ID), big-endian — the number the queue's partition comes from, so that a
/// restored hash goes back to the shard that owns its queue ([`shard_of_hash`]).
pub fn queue_hash(recipient_id: &[u8]) -> i64 {
    let h = crate::crypto::hash::sha256(recipient_id);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[..8]);
    i64::from_be_bytes(b)
}

/// The shard of `shards` that owns the queues of hash `h` (`docs/ARCHITECTURE.md` §1).
pub fn shard_of_hash(h: i64, shards: usize) -> usize {
    let partition = (h as u64) % u64::from(crate::store::PARTITIONS);
    (partition % u64::from(crate::store::PARTITION_GROUPS)) as usize % shards.max(1)
}

/// Queues active in the current day, week and month (the reference's `PeriodStats`), each set
/// bounded by `MAX_ACTIVE_QUEUES_PER_SET`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeriodSets {
    pub day: std::collections::HashSet<i64>,
    pub week: std::collections::HashSet<i64>,
    pub month: std::collections::HashSet<i64>,
}

impl PeriodSets {
    pub fn insert(&mut self, h: i64) {
        for set in [&mut self.day, &mut self.week, &mut self.month] {
            if set.len() < crate::limits::MAX_ACTIVE_QUEUES_PER_SET {
                set.insert(h);
            }
        }
    }

    pub fn counts(&self) -> [u64; 3] {
        [self.day.len(), self.week.len(), self.month.len()].map(|n| n as u64)
    }

    /// A daily line was written: the day starts again, and the week on Mondays, the month on
    /// the 1st (simplexmq `Stats.hs`, `periodStatCounts`).
    pub fn reset(&mut self, week: bool, month: bool) {
        self.day.clear();
        if week {
            self.week.clear();
        }
        if month {
            self.month.clear();
        }
    }

    pub fn extend(&mut self, o: &PeriodSets) {
        for (set, from) in [
            (&mut self.day, &o.day),
            (&mut self.week, &o.week),
            (&mut self.month, &o.month),
        ] {
            set.extend(
                from.iter()
                    .take(crate::limits::MAX_ACTIVE_QUEUES_PER_SET.saturating_sub(set.len())),
            );
        }
    }
}

/// A shard's active queues: with any message, and with messages flagged for notification.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Activity {
    pub msgs: PeriodSets,
    pub ntfs: PeriodSets,
}

impl Activity {
    /// Only the hashes of queues shard `shard` of `shards` owns.
    pub fn for_shard(&self, shard: usize, shards: usize) -> Activity {
        let pick = |s: &std::collections::HashSet<i64>| {
            s.iter()
                .copied()
                .filter(|h| shard_of_hash(*h, shards) == shard)
                .collect()
        };
        let part = |p: &PeriodSets| PeriodSets {
            day: pick(&p.day),
            week: pick(&p.week),
            month: pick(&p.month),
        };
        Activity {
            msgs: part(&self.msgs),
            ntfs: part(&self.ntfs),
        }
    }
}

/// The reference's `TimeBuckets` (Stats.hs): seconds from a delivery to its acknowledgement (or,
/// for pending deliveries, to now), exact up to 5 s, then rounded up to 5 s up to 30, 10 s up to
/// 60, 30 s up to 180 and 60 s beyond; their sum and maximum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimeBuckets {
    pub sum_secs: u64,
    pub max_secs: u64,
    pub buckets: std::collections::BTreeMap<u64, u64>,
}

impl TimeBuckets {
    pub fn record(&mut self, secs: u64) {
        // Bounded: at most `MAX_TIME_BUCKET_SECS / 60` buckets beyond three minutes.
        let t = secs.min(crate::limits::MAX_TIME_BUCKET_SECS);
        self.sum_secs = self.sum_secs.saturating_add(t);
        self.max_secs = self.max_secs.max(t);
        let up = |m: u64| t.div_ceil(m) * m;
        let key = match t {
            0..=5 => t,
            6..=30 => up(5),
            31..=60 => up(10),
            61..=180 => up(30),
            _ => up(60),
        };
        *self.buckets.entry(key).or_default() += 1;
    }

    pub fn add(&mut self, o: &TimeBuckets) {
        self.sum_secs = self.sum_secs.saturating_add(o.sum_secs);
        self.max_secs = self.max_secs.max(o.max_secs);
        for (k, v) in &o.buckets {
            *self.buckets.entry(*k).or_default() += v;
        }
    }
}

/// Accepted and closed connections of one listening port (the reference's `SocketStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketCounts {
    pub port: String,
    pub accepted: u64,
    pub closed: u64,
}

/// What the metrics file shows besides the summed [`MetricsSnapshot`]: the start of the counting
/// period, sockets per port, threads, the pending deliveries' ages.
#[derive(Debug, Clone, Default)]
pub struct Extra {
    /// When the counters started (the start, a restored backup's time, or the last daily line).
    pub from_ms: u64,
    pub sockets: Vec<SocketCounts>,
    pub threads: u64,
    /// Ages of the deliveries waiting for their ACK now, and the times from deliveries to
    /// their ACKs so far.
    pub pending_times: TimeBuckets,
    pub ack_times: TimeBuckets,
}

/// The time as the reference prints a `UTCTime` (`iso8601Show`): fractional seconds only when
/// not zero, without trailing zeros.
pub fn iso8601_ms(ms: u64) -> String {
    let whole = crate::clock::utc_time((ms / 1000) as i64);
    match ms % 1000 {
        0 => whole,
        frac => {
            let f = format!("{frac:03}");
            format!(
                "{}.{}Z",
                whole.trim_end_matches('Z'),
                f.trim_end_matches('0')
            )
        }
    }
}

/// The version `simplex_smp_info` names.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Prometheus text for `s` and `x`, every sample stamped with `now_ms` (milliseconds since
/// the epoch): the reference's families in its order and layout (simplexmq
/// `src/Simplex/Messaging/Server/Prometheus.hs`, `prometheusMetrics`), then this relay's own.
pub fn render(s: &MetricsSnapshot, x: &Extra, now_ms: u64) -> String {
    let mut w = Writer {
        out: String::with_capacity(32 * 1024),
        ts: now_ms,
    };
    w.raw(&format!(
        "# Recorded at: {}\n# Stats from: {}\n\n",
        iso8601_ms(now_ms),
        iso8601_ms(x.from_ms)
    ));
    use Kind::{Counter, Gauge};
    w.section("Queues", true);
    w.one(
        "simplex_smp_queues_created",
        Counter,
        "Created queues",
        s.queues_created,
        keys::queues_created,
    );
    w.one(
        "simplex_smp_queues_secured",
        Counter,
        "Secured queues",
        s.queues_secured,
        keys::queues_secured,
    );
    w.family(
        "simplex_smp_queues_deleted",
        Counter,
        "Deleted queues",
        &[
            ("{type=\"all\"}", s.queues_deleted, "qDeleted"),
            (
                "{type=\"new\"}",
                s.queues_deleted_new,
                keys::queues_deleted_new,
            ),
            (
                "{type=\"secured\"}",
                s.queues_deleted_secured,
                keys::queues_deleted_secured,
            ),
        ],
    );
    w.one(
        "simplex_smp_queues_blocked",
        Counter,
        "Deleted queues",
        s.queues_blocked,
        keys::queues_blocked,
    );
    w.one(
        "simplex_smp_queues_deleted_batch",
        Counter,
        "Batched requests to delete queues",
        s.queues_deleted_batches,
        keys::queues_deleted_batches,
    );
    w.one(
        "simplex_smp_queues_total1",
        Gauge,
        "Total number of stored queues (first type of count).",
        s.queue_count,
        keys::queue_count,
    );
    w.one(
        "simplex_smp_queues_total2",
        Gauge,
        "Total number of stored queues (second type of count).",
        s.queue_count,
        "qCount2",
    );
    for (name, help, v, c) in [
        (
            "simplex_smp_queues_daily",
            "Daily active queues.",
            s.active_day,
            "dayMsgQueues",
        ),
        (
            "simplex_smp_queues_weekly",
            "Weekly active queues.",
            s.active_week,
            "weekMsgQueues",
        ),
        (
            "simplex_smp_queues_monthly",
            "Monthly active queues.",
            s.active_month,
            "monthMsgQueues",
        ),
        (
            "simplex_smp_queues_notify_daily",
            "Daily active queues with notifications.",
            s.active_ntf_day,
            "dayCountNtf",
        ),
        (
            "simplex_smp_queues_notify_weekly",
            "Weekly active queues with notifications.",
            s.active_ntf_week,
            "weekCountNtf",
        ),
        (
            "simplex_smp_queues_notify_monthly",
            "Monthly active queues with notifications.",
            s.active_ntf_month,
            "monthCountNtf",
        ),
    ] {
        w.one(name, Gauge, help, v, c);
    }
    w.section("Subscriptions", true);
    w.one(
        "simplex_smp_subscribtion_successes",
        Counter,
        "Successful subscriptions.",
        s.sub_successes,
        keys::sub_successes,
    );
    w.one(
        "simplex_smp_subscribtion_successes_batch",
        Counter,
        "Batched successful subscriptions.",
        s.sub_batches,
        keys::sub_batches,
    );
    w.one(
        "simplex_smp_subscribtion_end",
        Counter,
        "Ended subscriptions.",
        s.sub_end,
        keys::sub_end,
    );
    w.one(
        "simplex_smp_subscribtion_end_batch",
        Counter,
        "Batched ended subscriptions.",
        s.sub_end_batches,
        keys::sub_end_batches,
    );
    w.family(
        "simplex_smp_subscribtion_errors",
        Counter,
        "Subscription errors.",
        &[
            ("{type=\"auth\"}", s.sub_auth, keys::sub_auth),
            ("{type=\"duplicate\"}", s.sub_duplicate, keys::sub_duplicate),
            (
                "{type=\"prohibited\"}",
                s.sub_prohibited,
                keys::sub_prohibited,
            ),
        ],
    );
    w.section("Messages", true);
    w.one(
        "simplex_smp_messages_sent",
        Counter,
        "Sent messages.",
        s.msg_sent,
        keys::msg_sent,
    );
    w.family(
        "simplex_smp_messages_sent_errors",
        Counter,
        "Total number of messages errors by type.",
        &[
            ("{type=\"auth\"}", s.msg_sent_auth, keys::msg_sent_auth),
            ("{type=\"quota\"}", s.msg_sent_quota, keys::msg_sent_quota),
            ("{type=\"large\"}", s.msg_sent_large, keys::msg_sent_large),
            ("{type=\"block\"}", s.msg_sent_block, keys::msg_sent_block),
        ],
    );
    w.one(
        "simplex_smp_messages_received",
        Counter,
        "Received messages.",
        s.msg_recv,
        keys::msg_recv,
    );
    w.one(
        "simplex_smp_messages_expired",
        Counter,
        "Expired messages.",
        s.msg_expired,
        keys::msg_expired,
    );
    w.one(
        "simplex_smp_messages_total",
        Gauge,
        "Total number of messages stored.",
        s.msg_count,
        "msgCount",
    );
    w.section("Notification messages (client)", true);
    w.one(
        "simplex_smp_messages_notify_sent",
        Counter,
        "Sent messages with notification flag (cleint).",
        s.msg_sent_ntf,
        keys::msg_sent_ntf,
    );
    w.one(
        "simplex_smp_messages_notify_received",
        Counter,
        "Received messages with notification flag (client).",
        s.msg_recv_ntf,
        keys::msg_recv_ntf,
    );
    w.one(
        "simplex_smp_messages_notify_get_sent",
        Counter,
        "Requests to get messages with notification flag (client).",
        s.msg_get,
        keys::msg_get,
    );
    w.one(
        "simplex_smp_messages_notify_get_received",
        Counter,
        "Succesfully received get requests messages with notification flag (client).",
        s.msg_recv_get,
        keys::msg_recv_get,
    );
    w.family(
        "simplex_smp_messages_notify_get_errors",
        Counter,
        "Error events with messages with notification flag (client). ",
        &[
            ("{type=\"nomsg\"}", s.msg_get_no_msg, keys::msg_get_no_msg),
            ("{type=\"auth\"}", s.msg_get_auth, keys::msg_get_auth),
            (
                "{type=\"duplicate\"}",
                s.msg_get_duplicate,
                keys::msg_get_duplicate,
            ),
            (
                "{type=\"prohibited\"}",
                s.msg_get_prohibited,
                keys::msg_get_prohibited,
            ),
        ],
    );
    w.one(
        "simplex_smp_queues_notify_created",
        Counter,
        "Created queue notification credentials.",
        s.ntf_created,
        keys::ntf_created,
    );
    w.one(
        "simplex_smp_queues_notify_new_created",
        Counter,
        "Created new queues with notification credentials.",
        s.ntf_new_created,
        keys::ntf_new_created,
    );
    w.one(
        "simplex_smp_queues_notify_deleted",
        Counter,
        "Deleted queue notification credentials.",
        s.ntf_deleted,
        keys::ntf_deleted,
    );
    w.one(
        "simplex_smp_queues_notify_deleted_batch",
        Counter,
        "Deleted batched queue notification credentials.",
        s.ntf_deleted_batches,
        keys::ntf_deleted_batches,
    );
    w.one(
        "simplex_smp_queues_notify_total1",
        Gauge,
        "Total number of stored queues with notification flag (first type of count).",
        s.ntf_count,
        "ntfCount1",
    );
    w.one(
        "simplex_smp_queues_notify_total2",
        Gauge,
        "Total number of stored queues with notification flag (second type of count).",
        s.notifier_count,
        "ntfCount2",
    );
    w.section("Notifications (server)", true);
    w.one(
        "simplex_smp_messages_ntf_successes",
        Counter,
        "Successful events with notification messages (to ntf server). ",
        s.msg_ntfs,
        keys::msg_ntfs,
    );
    w.one(
        "simplex_smp_messages_ntf_successes_batch",
        Counter,
        "Successful batched events with notification messages (to ntf server). ",
        s.msg_ntfs_batches,
        keys::msg_ntfs_batches,
    );
    w.family(
        "simplex_smp_messages_ntf_errors",
        Counter,
        "Error events with notification messages (to ntf server). ",
        &[
            ("{type=\"nosub\"}", s.msg_ntf_no_sub, keys::msg_ntf_no_sub),
            ("{type=\"lost\"}", s.msg_ntf_lost, keys::msg_ntf_lost),
            (
                "{type=\"expired\"}",
                s.msg_ntf_expired,
                keys::msg_ntf_expired,
            ),
        ],
    );
    w.one(
        "simplex_smp_subscription_ntf_requests",
        Counter,
        "Subscription requests with notification flag (from ntf server). ",
        s.ntf_sub,
        keys::ntf_sub,
    );
    w.one(
        "simplex_smp_subscription_ntf_requests_batch",
        Counter,
        "Batched subscription requests with notification flag (from ntf server). ",
        s.ntf_sub_batches,
        keys::ntf_sub_batches,
    );
    w.family(
        "simplex_smp_subscribtion_ntf_errors",
        Counter,
        "Subscription errors with notification flag (from ntf server). ",
        &[
            ("{type=\"auth\"}", s.ntf_sub_auth, keys::ntf_sub_auth),
            (
                "{type=\"duplicate\"}",
                s.ntf_sub_duplicate,
                keys::ntf_sub_duplicate,
            ),
        ],
    );
    w.section("Relays", true);
    w.proxy_families(
        "simplex_smp_relay_sessions",
        [
            "Session requests through relay.",
            "Successful session events through relay.",
            "Error session events through relay.",
        ],
        [(&s.p_relays, "pRelays"), (&s.p_relays_own, "pRelaysOwn")],
    );
    w.proxy_families(
        "simplex_smp_relay_messages",
        [
            "Message requests sent through relay.",
            "Successful messages sent through relay.",
            "Error events with messages sent through relay.",
        ],
        [
            (&s.p_msg_fwds, "pMsgFwds"),
            (&s.p_msg_fwds_own, "pMsgFwdsOwn"),
        ],
    );
    w.one(
        "simplex_smp_relay_messages_received",
        Counter,
        "Relay messages statistics.",
        s.p_msg_fwds_recv,
        "pMsgFwdsRecv",
    );
    w.section("Services", false);
    w.one(
        "simplex_smp_rcv_services_count",
        Gauge,
        "The count of receiving services.",
        s.rcv_services_count,
        "rcvServiceCount",
    );
    w.one(
        "simplex_smp_rcv_services_queues_count",
        Gauge,
        "The count of queues associated with receiving services.",
        s.rcv_services_queues,
        "rcv.rcvServiceQueuesCount",
    );
    w.one(
        "simplex_smp_ntf_services_count",
        Gauge,
        "The count of notification services.",
        s.ntf_services_count,
        "ntfServiceCount",
    );
    w.one(
        "simplex_smp_ntf_services_queues_count",
        Gauge,
        "The count of queues associated with notification services.",
        s.ntf_services_queues,
        "ntfServiceQueuesCount",
    );
    w.one(
        "simplex_smp_rcv_services_sub_msg_count",
        Counter,
        "The count of subscribed service queues with messages.",
        s.rcv_services_sub_msg,
        "rcvServicesSubMsg",
    );
    w.one(
        "simplex_smp_rcv_services_sub_duplicate_count",
        Counter,
        "The count of duplicate subscribed service queues.",
        s.rcv_services_sub_duplicate,
        "rcvServicesSubDuplicate",
    );
    for (pfx, role, stats) in [
        ("rcv", "receiving", &s.rcv_service_stats),
        ("ntf", "notification", &s.ntf_service_stats),
    ] {
        for (suffix, kind, help, value, field) in service_families(stats) {
            w.one(
                &format!("simplex_smp_{pfx}_services_{suffix}"),
                kind,
                &help.replace("{}", role),
                value,
                &format!("{pfx}.{field}"),
            );
        }
    }
    w.section("Names", true);
    for (name, help, v, c) in [
        (
            "reqs",
            "Total RSLV requests forwarded to this server.",
            s.rslv_reqs,
            "rslvReqs",
        ),
        (
            "success",
            "NameRecord successfully resolved and returned.",
            s.rslv_success,
            "rslvSucc",
        ),
        (
            "not_found",
            "Name not registered (resolver returned 404 / 400).",
            s.rslv_not_found,
            "rslvNotFound",
        ),
        (
            "resolver_errs",
            "Resolver backend errors (HTTP 5xx, transport, decode, or timeout).",
            s.rslv_resolver_errs,
            "rslvResolverErrs",
        ),
        (
            "disabled",
            "RSLV requests rejected because no resolver is configured (names role off).",
            s.rslv_disabled,
            "rslvDisabled",
        ),
    ] {
        w.one(&format!("simplex_smp_names_{name}"), Counter, help, v, c);
    }
    w.section("Info", true);
    w.raw(&format!(
        "# HELP simplex_smp_info Server information. RTS options have to be passed via SMP_RTS_OPTIONS env var\n\
         # TYPE simplex_smp_info gauge\n\
         simplex_smp_info{{version=\"{VERSION}\",rts_options=\"\"}} 1\n\n"
    ));
    for (name, help, pick) in [
        ("simplex_smp_sockets_accepted", "Accepted sockets", 0),
        ("simplex_smp_sockets_closed", "Closed sockets", 1),
        ("simplex_smp_sockets_active", "Active sockets", 2),
        ("simplex_smp_sockets_leaked", "Leaked sockets", 3),
    ] {
        w.head(name, Gauge, help);
        for p in &x.sockets {
            let v = match pick {
                0 => p.accepted,
                1 => p.closed,
                2 => p.accepted.saturating_sub(p.closed),
                // Every closed socket is counted when its connection ends: none leaks.
                _ => 0,
            };
            w.sample(&format!("{name}{{port=\"{}\"}}", p.port), v);
        }
        w.raw("\n");
    }
    w.head("simplex_smp_threads_total", Gauge, "Threads");
    w.sample("simplex_smp_threads_total", x.threads);
    w.raw("\n");
    w.head("simplex_smp_clients_total", Gauge, "Clients");
    w.sample("simplex_smp_clients_total", s.connections);
    w.raw("\n");
    w.one(
        "simplex_smp_delivered_total",
        Gauge,
        "Total SMP subscriptions with delivered messages",
        s.delivered_subs,
        "delivered.subsCount",
    );
    w.one(
        "simplex_smp_delivered_clients_total",
        Gauge,
        "Subscribed clients",
        s.delivered_clients,
        "delivered.subClientsCount",
    );
    let acked = s.msg_recv.saturating_add(s.msg_recv_get);
    let t = "simplex_smp_delivery_ack_confirmed_time";
    let ack_times = &x.ack_times;
    w.head(
        t,
        Kind::Histogram,
        "Times to confirm message delivery, only confirmed deliveries",
    );
    w.sample(&format!("{t}_sum"), ack_times.sum_secs);
    w.sample(&format!("{t}_count"), acked);
    w.time_buckets(t, ack_times);
    w.sample(&format!("{t}_bucket{{le=\"+Inf\"}}"), acked);
    w.raw("\n");
    w.head(
        "simplex_smp_delivery_ack_confirmed_count",
        Counter,
        "Counts for confirmed deliveries",
    );
    w.bucket_sums("simplex_smp_delivery_ack_confirmed_count", ack_times);
    w.raw("\n");
    w.head(
        "simplex_smp_delivery_ack_pending_count",
        Gauge,
        "Counts for pending delivery",
    );
    w.bucket_sums("simplex_smp_delivery_ack_pending_count", &x.pending_times);
    w.raw("\n");
    w.one(
        "simplex_smp_delivery_ack_time_max",
        Gauge,
        "Max time to confirm message delivery",
        x.pending_times.max_secs,
        "delivered.maxTime",
    );
    for (name, help, v, c) in [
        (
            "simplex_smp_subscribtion_total",
            "Total SMP subscriptions",
            s.subscriptions,
            "smp.subsCount",
        ),
        (
            "simplex_smp_subscribtion_clients_total",
            "Subscribed clients",
            s.sub_clients,
            "smp.subClientsCount",
        ),
        (
            "simplex_smp_subscribtion_services_total",
            "Subscribed services, first counting method",
            s.rcv_services,
            "smp.subServicesCount",
        ),
        (
            "simplex_smp_subscribtion_service_subs_total",
            "Total queues subscribed via services",
            s.rcv_service_subs,
            "smp.subServiceSubsCount",
        ),
        (
            "simplex_smp_subscription_ntf_total",
            "Total notification subscripbtions (from ntf server)",
            s.ntf_subscriptions,
            "ntf.subsCount",
        ),
        (
            "simplex_smp_subscription_ntf_clients_total",
            "Total subscribed NTF servers",
            s.ntf_sub_clients,
            "ntf.subClientsCount",
        ),
        (
            "simplex_smp_subscribtion_nts_services_total",
            "Subscribed NTF services, first counting method",
            s.ntf_services,
            "ntf.subServicesCount",
        ),
        (
            "simplex_smp_subscription_ntf_service_subs_total",
            "Total queues subscribed via NTF services",
            s.ntf_service_subs,
            "ntf.subServiceSubsCount",
        ),
        (
            "simplex_smp_loaded_queues_queue_count",
            "Total loaded queues count (all queues for memory/journal storage)",
            s.queue_count,
            "loadedCounts.loadedQueueCount",
        ),
        (
            "simplex_smp_loaded_queues_ntf_count",
            "Total loaded ntf credential references (all ntf credentials for memory/journal storage)",
            s.notifier_count,
            "loadedCounts.loadedNotifierCount",
        ),
        (
            "simplex_smp_loaded_queues_open_journal_count",
            "Total opened queue journals (0 for memory storage)",
            0,
            "loadedCounts.openJournalCount",
        ),
        (
            "simplex_smp_loaded_queues_queue_lock_count",
            "Total queue locks (0 for memory storage)",
            0,
            "loadedCounts.queueLockCount",
        ),
    ] {
        w.one(name, Gauge, help, v, c);
    }
    // The reference's file ends here, without the blank line after its last family.
    w.one_last(
        "simplex_smp_loaded_queues_ntf_lock_count",
        Gauge,
        "Total notifier locks (0 for memory/journal storage)",
        0,
        "loadedCounts.notifierLockCount",
    );
    w.raw("\n# smp-relay\n# --------\n\n");
    for (name, help, v) in s.relay.families() {
        w.head(name, Counter, help);
        w.sample(name, v);
        w.raw("\n");
    }
    w.out
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Builds the text; every sample line ends with the timestamp.
struct Writer {
    out: String,
    ts: u64,
}

impl Writer {
    fn raw(&mut self, s: &str) {
        self.out.push_str(s);
    }

    /// A section's title, underlined, and (all but "Services", as the reference) a blank line.
    fn section(&mut self, title: &str, blank: bool) {
        let _ = writeln!(self.out, "# {title}\n# {}", "-".repeat(title.len()));
        if blank {
            self.out.push('\n');
        }
    }

    fn head(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name_labels: &str, v: u64) {
        let _ = writeln!(self.out, "{name_labels} {v} {}", self.ts);
    }

    /// Samples each followed by the reference's `# <counter>` comment line, then a blank line.
    fn family(&mut self, name: &str, kind: Kind, help: &str, samples: &[(&str, u64, &str)]) {
        self.head(name, kind, help);
        for (labels, v, comment) in samples {
            self.sample(&format!("{name}{labels}"), *v);
            let _ = writeln!(self.out, "# {comment}");
        }
        self.out.push('\n');
    }

    fn one(&mut self, name: &str, kind: Kind, help: &str, v: u64, comment: &str) {
        self.family(name, kind, help, &[("", v, comment)]);
    }

    fn one_last(&mut self, name: &str, kind: Kind, help: &str, v: u64, comment: &str) {
        self.one(name, kind, help, v, comment);
        self.out.pop();
    }

    /// The request, success and error families of one kind of proxy traffic: `name` and the
    /// three help texts, and the stats of all destinations and of own ones with their counters'
    /// names.
    fn proxy_families(&mut self, name: &str, helps: [&str; 3], pick: [(&ProxyStats, &str); 2]) {
        type Samples = Vec<(String, u64, String)>;
        let (mut requests, mut successes, mut errors): (Samples, Samples, Samples) =
            (Vec::new(), Vec::new(), Vec::new());
        for (src, (p, c)) in [("all", pick[0]), ("own", pick[1])] {
            let label = format!("{{source=\"{src}\"}}");
            requests.push((label.clone(), p.requests, format!("{c}_pRequests")));
            successes.push((label, p.successes, format!("{c}_pSuccesses")));
            for (ty, v, f) in [
                ("connect", p.errors_connect, "pErrorsConnect"),
                ("compat", p.errors_compat, "pErrorsCompat"),
                ("other", p.errors_other, "pErrorsOther"),
            ] {
                let label = format!("{{source=\"{src}\",type=\"{ty}\"}}");
                errors.push((label, v, format!("{c}_{f}")));
            }
        }
        for (suffix, help, v) in [
            ("requests", helps[0], requests),
            ("successes", helps[1], successes),
            ("errors", helps[2], errors),
        ] {
            let samples: Vec<(&str, u64, &str)> = v
                .iter()
                .map(|(l, x, c)| (l.as_str(), *x, c.as_str()))
                .collect();
            self.family(&format!("{name}_{suffix}"), Kind::Counter, help, &samples);
        }
    }

    /// The reference's `showTimeBuckets`: cumulative counts at each bucket, with an extra line
    /// 60 s before a bucket that follows a gap of more than a minute.
    fn time_buckets(&mut self, metric: &str, b: &TimeBuckets) {
        let (mut prev, mut total) = (0u64, 0u64);
        for (&sec, &cnt) in &b.buckets {
            if sec.saturating_sub(60) > prev {
                self.sample(&format!("{metric}_bucket{{le=\"{}\"}}", sec - 60), total);
            }
            total += cnt;
            self.sample(&format!("{metric}_bucket{{le=\"{sec}\"}}"), total);
            prev = sec;
        }
    }

    /// The reference's `showBucketSums`: counts in five periods.
    fn bucket_sums(&mut self, metric: &str, b: &TimeBuckets) {
        for (lo, hi) in [
            (0, 60),
            (60, 300),
            (300, 1200),
            (1200, 3600),
            (3600, u64::MAX),
        ] {
            let n: u64 = b
                .buckets
                .iter()
                .filter(|(k, _)| lo <= **k && **k < hi)
                .map(|(_, v)| v)
                .sum();
            let period = if hi <= 3600 {
                format!("{lo}-{hi}")
            } else {
                format!("{lo}+")
            };
            self.sample(&format!("{metric}{{period=\"{period}\"}}"), n);
        }
    }
}

/// The reference's service families of one role (`showServices`, Prometheus.hs): name suffix,
/// type, help (`{}` is the role's name), value and the counter's name.
fn service_families(
    s: &ServiceStats,
) -> [(&'static str, Kind, &'static str, u64, &'static str); 14] {
    use Kind::{Counter, Gauge};
    [
        (
            "assoc_new",
            Counter,
            "New queue associations with {} services.",
            s.assoc_new,
            "srvAssocNew",
        ),
        (
            "assoc_duplicate",
            Counter,
            "Duplicate queue associations with {} services.",
            s.assoc_duplicate,
            "srvAssocDuplicate",
        ),
        (
            "assoc_updated",
            Counter,
            "Updated queue associations with {} services.",
            s.assoc_updated,
            "srvAssocUpdated",
        ),
        (
            "assoc_removed",
            Counter,
            "Removed queue associations with {} services.",
            s.assoc_removed,
            "srvAssocRemoved",
        ),
        (
            "sub_count",
            Counter,
            "Service subscriptions by {} services.",
            s.sub_count,
            "srvSubCount",
        ),
        (
            "sub_duplicate",
            Counter,
            "Duplicate service subscriptions by {} services.",
            s.sub_duplicate,
            "srvSubDuplicate",
        ),
        (
            "sub_queues",
            Gauge,
            "Queues subscribed by {} services.",
            s.sub_queues,
            "srvSubQueues",
        ),
        (
            "sub_end",
            Gauge,
            "Ended subscriptions with {} services.",
            s.sub_end,
            "srvSubEnd",
        ),
        (
            "sub_ok",
            Gauge,
            "Service subscriptions for {} services.",
            s.sub_ok,
            "srvSubOk",
        ),
        (
            "sub_more",
            Gauge,
            "Service subscriptions for {} services with more queues than in the client.",
            s.sub_more,
            "srvSubMore",
        ),
        (
            "sub_fewer",
            Gauge,
            "Service subscriptions for {} services with fewer queues than in the client.",
            s.sub_fewer,
            "srvSubFewer",
        ),
        (
            "sub_diff",
            Gauge,
            "Service subscriptions for {} services with different hash than in the client.",
            s.sub_diff,
            "srvSubDiff",
        ),
        (
            "sub_more_total",
            Gauge,
            "Service subscriptions for {} services with more queues than in the client total.",
            s.sub_more_total,
            "srvSubMoreTotal",
        ),
        (
            "sub_fewer_total",
            Gauge,
            "Service subscriptions for {} services with fewer queues than in the client total.",
            s.sub_fewer_total,
            "srvSubFewerTotal",
        ),
    ]
}

/// Milliseconds since the Unix epoch, for [`render`], from the relay's clock (`src/clock.rs`).
pub fn now_ms() -> u64 {
    crate::clock::now_ms()
}

/// Replaces `path` with `text` so that a reader sees the old file or the new one, never a part:
/// write a temporary file in the same directory, then rename it over `path`. The directory is not
/// synced: after a crash a stale metrics file is harmless.
pub fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extra() -> Extra {
        Extra {
            from_ms: 1_699_999_000_000,
            sockets: vec![SocketCounts {
                port: "5223".into(),
                accepted: 9,
                closed: 4,
            }],
            threads: 3,
            pending_times: TimeBuckets::default(),
            ack_times: TimeBuckets::default(),
        }
    }

    /// A restored active-queue hash goes back to the shard that owns its queue: the statistics'
    /// placement (`queue_hash`, `shard_of_hash`) and the owners' (`group_of`, `owner_shard`)
    /// agree for every shard count, IDs of every length included.
    #[test]
    fn a_queue_hash_lands_on_the_queue_owner() {
        use crate::server::router::owner_shard;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..4000usize {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = 1 + i % 32;
            let id: Vec<u8> = (0..len)
                .map(|k| (seed >> ((k % 8) * 8)) as u8 ^ k as u8)
                .collect();
            for shards in 1..=9 {
                assert_eq!(
                    shard_of_hash(queue_hash(&id), shards),
                    owner_shard(&id, shards),
                    "id {id:?}, {shards} shards"
                );
            }
        }
    }

    /// Every sample line is `name{labels} value timestamp` (the info line has no timestamp, as
    /// the reference's), and each family has one HELP and one TYPE line before its samples.
    #[test]
    fn every_sample_line_is_name_value_timestamp() {
        let text = render(&MetricsSnapshot::numbered(0), &extra(), 42);
        let mut declared = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.insert(rest.split(' ').next().unwrap().to_string());
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parts: Vec<&str> = line.split(' ').collect();
            let name = parts[0].split('{').next().unwrap();
            let family = ["_sum", "_count", "_bucket"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|f| declared.contains(*f))
                .unwrap_or(name);
            assert!(declared.contains(family), "{line}: no TYPE before it");
            if name == "simplex_smp_info" {
                assert_eq!(parts.len(), 2, "{line}");
                continue;
            }
            assert_eq!(parts.len(), 3, "{line}");
            assert!(parts[1].parse::<u64>().is_ok(), "{line}");
            assert_eq!(parts[2], "42");
        }
        assert!(text.starts_with(
            "# Recorded at: 1970-01-01T00:00:00.042Z\n# Stats from: 2023-11-14T21:56:40Z\n\n# Queues\n# ------\n\n"
        ));
    }

    #[test]
    fn each_counter_has_its_value_and_comment() {
        let mut s = MetricsSnapshot {
            queues_created: 5,
            queues_deleted_secured: 2,
            msg_sent_block: 7,
            rslv_disabled: 4,
            ..MetricsSnapshot::default()
        };
        s.p_msg_fwds_own.errors_connect = 3;
        s.ntf_service_stats.sub_fewer_total = 11;
        let text = render(&s, &extra(), 1_700_000_000_123);
        for expected in [
            "simplex_smp_queues_created 5 1700000000123\n# qCreated\n",
            "simplex_smp_queues_deleted{type=\"secured\"} 2 1700000000123\n# qDeletedSecured\n",
            "simplex_smp_messages_sent_errors{type=\"block\"} 7 1700000000123\n# msgSentBlock\n",
            "simplex_smp_relay_messages_errors{source=\"own\",type=\"connect\"} 3 1700000000123\n# pMsgFwdsOwn_pErrorsConnect\n",
            "simplex_smp_ntf_services_sub_fewer_total 11 1700000000123\n# ntf.srvSubFewerTotal\n",
            "simplex_smp_names_disabled 4 1700000000123\n# rslvDisabled\n",
            "simplex_smp_sockets_active{port=\"5223\"} 5 1700000000123\n",
            "simplex_smp_delivery_ack_confirmed_count{period=\"3600+\"} 0 1700000000123\n",
            "# TYPE simplex_smp_delivery_ack_confirmed_time histogram\n",
            "\n# loadedCounts.notifierLockCount\n\n# smp-relay\n",
        ] {
            assert_eq!(text.matches(expected).count(), 1, "{expected:?} once in:\n{text}");
        }
    }

    #[test]
    fn time_buckets_round_and_print_as_the_reference() {
        let mut b = TimeBuckets::default();
        for t in [0, 5, 6, 31, 61, 181, 400] {
            b.record(t);
        }
        let keys: Vec<u64> = b.buckets.keys().copied().collect();
        assert_eq!(keys, [0, 5, 10, 40, 90, 240, 420]);
        assert_eq!((b.sum_secs, b.max_secs), (684, 400));
        let mut w = Writer {
            out: String::new(),
            ts: 1,
        };
        w.time_buckets("t", &b);
        w.bucket_sums("c", &b);
        assert_eq!(
            w.out,
            "t_bucket{le=\"0\"} 1 1\nt_bucket{le=\"5\"} 2 1\nt_bucket{le=\"10\"} 3 1\n\
             t_bucket{le=\"40\"} 4 1\nt_bucket{le=\"90\"} 5 1\nt_bucket{le=\"180\"} 5 1\n\
             t_bucket{le=\"240\"} 6 1\nt_bucket{le=\"360\"} 6 1\nt_bucket{le=\"420\"} 7 1\n\
             c{period=\"0-60\"} 4 1\nc{period=\"60-300\"} 2 1\nc{period=\"300-1200\"} 1 1\n\
             c{period=\"1200-3600\"} 0 1\nc{period=\"3600+\"} 0 1\n"
        );
    }

    #[test]
    fn shards_sum_and_a_baseline_subtracts() {
        let mut total = MetricsSnapshot::default();
        total.add(&MetricsSnapshot::numbered(0));
        total.add(&MetricsSnapshot::numbered(0));
        assert_eq!(total.queues_created, 2);
        assert_eq!(total.p_msg_fwds_own.errors_other, 2 * 1034);
        let mut max = MetricsSnapshot {
            msg_sent: u64::MAX,
            ..MetricsSnapshot::default()
        };
        max.add(&MetricsSnapshot::numbered(0));
        assert_eq!(max.msg_sent, u64::MAX);
        let daily = total.daily_part();
        total.minus(&daily);
        assert_eq!(total.queues_created, 0);
        assert_eq!(total.p_relays.requests, 0);
        assert_eq!(
            total.queue_count,
            2 * MetricsSnapshot::numbered(0).queue_count
        );
        assert_eq!(
            total.ntf_new_created,
            2 * MetricsSnapshot::numbered(0).ntf_new_created
        );
        // As the reference's `logServerStats`: msgSentBlock is not reset, pMsgFwdsRecv and the
        // RSLV counters are.
        assert_eq!(
            total.msg_sent_block,
            2 * MetricsSnapshot::numbered(0).msg_sent_block
        );
        assert_eq!((total.p_msg_fwds_recv, total.rslv_disabled), (0, 0));
    }

    #[test]
    fn times_print_as_iso8601_show() {
        assert_eq!(iso8601_ms(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(iso8601_ms(1_700_000_000_120), "2023-11-14T22:13:20.12Z");
        assert_eq!(iso8601_ms(1_700_000_000_007), "2023-11-14T22:13:20.007Z");
    }

    #[test]
    fn service_statistics_count_as_the_reference() {
        let mut s = ServiceStats::default();
        let (x, y) = (&b"service x"[..], &b"service y"[..]);
        s.count_association(None, Some(x));
        s.count_association(Some(x), Some(x));
        s.count_association(Some(x), Some(y));
        s.count_association(Some(y), None);
        s.count_association(None, None);
        assert_eq!(
            (
                s.assoc_new,
                s.assoc_duplicate,
                s.assoc_updated,
                s.assoc_removed
            ),
            (1, 1, 1, 1)
        );
        let h = [7; 16];
        s.count_subs(None, (3, h));
        s.count_subs(Some((-1, [0; 16])), (3, h));
        s.count_subs(Some((3, h)), (3, h));
        s.count_subs(Some((1, h)), (3, h));
        s.count_subs(Some((10, h)), (3, h));
        s.count_subs(Some((3, [0; 16])), (3, h));
        assert_eq!(
            (
                s.sub_ok,
                s.sub_more,
                s.sub_more_total,
                s.sub_fewer,
                s.sub_fewer_total,
                s.sub_diff
            ),
            (3, 1, 2, 1, 7, 1)
        );
        let mut sum = s;
        sum.add(&s);
        assert_eq!((sum.sub_ok, sum.assoc_removed), (6, 2));
    }

    #[test]
    fn from_shard_adds_the_store_and_counts_each_end_as_its_batch() {
        let owner = MetricsSnapshot {
            queues_created: 3,
            sub_successes: 5,
            sub_end: 2,
            msg_get_duplicate: 2,
            relay: crate::counters::RelayCounters {
                verify_batches: 4,
                store_peek_first_calls: 10,
                ..Default::default()
            },
            ..MetricsSnapshot::default()
        };
        let store = StoreCounters {
            store_peek_first_calls: 1,
            store_peek_first_many_calls: 2,
            ..StoreCounters::default()
        };
        let s = MetricsSnapshot::from_shard(&owner, &store);
        assert_eq!(s.queues_created, 3);
        assert_eq!(s.sub_successes, 5);
        assert_eq!(s.msg_get_duplicate, 2);
        assert_eq!((s.sub_end, s.sub_end_batches), (2, 2));
        assert_eq!(s.relay.store_peek_first_calls, 11);
        assert_eq!(s.relay.store_peek_first_many_calls, 2);
        assert_eq!(s.relay.verify_batches, 4);
    }

    #[test]
    fn a_reader_never_sees_a_partial_file() {
        let dir = std::env::temp_dir().join(format!(
            "smp-relay-metrics-test-{}-{}",
            std::process::id(),
            now_ms()
        ));
        fs::create_dir_all(&dir).unwrap();
        let path = metrics_path(&dir);
        // Large enough that a plain overwrite would be seen half-written.
        let a = "a".repeat(1 << 20);
        let b = "b".repeat(1 << 20);
        write_atomically(&path, &a).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (path, a, b, stop) = (path.clone(), a.clone(), b.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let text = fs::read_to_string(&path).unwrap();
                    assert!(
                        text == a || text == b,
                        "partial file of {} bytes",
                        text.len()
                    );
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..50 {
            write_atomically(&path, if i % 2 == 0 { &b } else { &a }).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.join().unwrap();
        assert!(reads > 0);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        assert!(!Path::new(&tmp).exists(), "no temporary file is left");
        fs::remove_dir_all(&dir).unwrap();
    }
}
