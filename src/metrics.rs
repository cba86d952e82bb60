//! The metrics file `<data-dir>/smp-server-metrics.txt`: Prometheus text, rewritten every
//! `prometheus_interval` seconds (simplexmq `Server/Prometheus.hs`), for a node exporter's
//! textfile collector or any scraper that reads files.
//!
//! Where the reference has a metric, its exact name is used (spelling included, e.g.
//! `subscribtion`), so dashboards built for the reference keep working; this relay's own metrics are
//! named `smprelay_…`. Every sample carries a millisecond timestamp, as the reference's do.
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

/// Counters of an owner, exported as metrics.
#[derive(Debug, Default, Clone)]
pub struct OwnerStats {
    pub queues_created: u64,
    pub queues_secured: u64,
    pub queues_deleted: u64,
    pub msg_sent: u64,
    pub msg_sent_auth: u64,
    pub msg_sent_quota: u64,
    pub msg_sent_large: u64,
    /// SENDs refused with `ERR BLOCKED` (the reference's `msgSentBlock`).
    pub msg_sent_block: u64,
    pub msg_recv: u64,
    pub msg_expired: u64,
    pub msg_ntfs: u64,
    pub sub_batches: u64,
    pub subs: u64,
    /// Blocks whose Ed25519 signatures were verified in one batch, and those whose batch failed
    /// (their requests were then verified one by one).
    pub verify_batches: u64,
    pub verify_batch_fallbacks: u64,
    /// Connections closed for spending their failed-verification budget.
    pub verify_budget_closes: u64,
    /// MSGs handed to a messaging service's connection by its `SUBS`, and queues it already
    /// held (the reference's `rcvServicesSubMsg`, `rcvServicesSubDuplicate`).
    pub service_sub_msgs: u64,
    pub service_sub_duplicates: u64,
    /// Messaging and notification services' statistics.
    pub rcv_service_stats: ServiceStats,
    pub ntf_service_stats: ServiceStats,
}

/// Plain numbers, per shard or summed over shards. Counters only grow while the relay runs;
/// gauges are current values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub queues_created: u64,
    pub queues_secured: u64,
    pub queues_deleted: u64,
    pub msg_sent: u64,
    pub msg_sent_auth: u64,
    pub msg_sent_quota: u64,
    pub msg_sent_large: u64,
    pub msg_sent_block: u64,
    pub msg_recv: u64,
    pub msg_expired: u64,
    /// Notifications sent to notification servers (`msgNtfs`).
    pub msg_ntfs: u64,
    /// SUB commands that subscribed (`qSub`).
    pub sub_successes: u64,
    /// Blocks with at least one SUB, read from the store together (`qSubAllB`).
    pub sub_batches: u64,
    /// Block parts whose Ed25519 signatures were verified in one batch, and batches that failed.
    pub verify_batches: u64,
    pub verify_batch_fallbacks: u64,
    /// Connections closed for spending their failed-verification budget (`FAILED_VERIFY_BUDGET`).
    pub verify_budget_closes: u64,
    /// Back-pressure: MSG deliveries dropped to markers, re-asks of held items, connections closed
    /// as slow readers or past the hard limit of undroppable events.
    pub output_drops: u64,
    pub output_reasks: u64,
    pub slow_reader_closes: u64,
    pub store_peek_first_calls: u64,
    pub store_peek_first_many_calls: u64,
    pub store_writes: u64,
    pub store_deletes: u64,
    /// Gauge: queues in the store.
    pub queue_count: u64,
    /// Gauge: messages in the store (quota markers included).
    pub msg_count: u64,
    /// Gauge: queues with a subscriber.
    pub subscriptions: u64,
    /// Gauge: open client connections.
    pub connections: u64,
    /// Proxy role: sessions asked for with PRXY (`pRelays`) and messages forwarded with PFWD
    /// (`pMsgFwds`), all and to `own_server_domains`; destination role: RFWDs answered
    /// (`pMsgFwdsRecv`).
    pub p_relays: ProxyStats,
    pub p_relays_own: ProxyStats,
    pub p_msg_fwds: ProxyStats,
    pub p_msg_fwds_own: ProxyStats,
    pub p_msg_fwds_recv: u64,
    /// Services with a subscribed connection, and the subscriptions those connections hold, per
    /// role (the reference's `serviceSubscribers` and `totalServiceSubs`).
    pub rcv_services: u64,
    pub rcv_service_subs: u64,
    pub ntf_services: u64,
    pub ntf_service_subs: u64,
    /// MSGs handed to messaging services by SUBS, and queues they already held
    /// (`rcvServicesSubMsg`, `rcvServicesSubDuplicate`).
    pub rcv_services_sub_msg: u64,
    pub rcv_services_sub_duplicate: u64,
    /// Known services per role, and queues associated with one (the reference's entity counts).
    pub rcv_services_count: u64,
    pub rcv_services_queues: u64,
    pub ntf_services_count: u64,
    pub ntf_services_queues: u64,
    pub rcv_service_stats: ServiceStats,
    pub ntf_service_stats: ServiceStats,
}

impl MetricsSnapshot {
    /// The counters of one shard; the gauges are left at 0 for the caller to set.
    pub fn from_shard(owner: &OwnerStats, store: &StoreCounters) -> Self {
        MetricsSnapshot {
            queues_created: owner.queues_created,
            queues_secured: owner.queues_secured,
            queues_deleted: owner.queues_deleted,
            msg_sent: owner.msg_sent,
            msg_sent_auth: owner.msg_sent_auth,
            msg_sent_quota: owner.msg_sent_quota,
            msg_sent_large: owner.msg_sent_large,
            msg_sent_block: owner.msg_sent_block,
            msg_recv: owner.msg_recv,
            msg_expired: owner.msg_expired,
            msg_ntfs: owner.msg_ntfs,
            sub_successes: owner.subs,
            sub_batches: owner.sub_batches,
            verify_batches: owner.verify_batches,
            verify_batch_fallbacks: owner.verify_batch_fallbacks,
            verify_budget_closes: owner.verify_budget_closes,
            rcv_services_sub_msg: owner.service_sub_msgs,
            rcv_services_sub_duplicate: owner.service_sub_duplicates,
            rcv_service_stats: owner.rcv_service_stats,
            ntf_service_stats: owner.ntf_service_stats,
            store_peek_first_calls: store.peek_first,
            store_peek_first_many_calls: store.peek_first_many,
            store_writes: store.writes,
            store_deletes: store.deletes,
            ..MetricsSnapshot::default()
        }
    }

    /// Adds another shard's numbers to these.
    pub fn add(&mut self, other: &MetricsSnapshot) {
        let MetricsSnapshot {
            queues_created,
            queues_secured,
            queues_deleted,
            msg_sent,
            msg_sent_auth,
            msg_sent_quota,
            msg_sent_large,
            msg_sent_block,
            msg_recv,
            msg_expired,
            msg_ntfs,
            sub_successes,
            sub_batches,
            verify_batches,
            verify_batch_fallbacks,
            verify_budget_closes,
            output_drops,
            output_reasks,
            slow_reader_closes,
            store_peek_first_calls,
            store_peek_first_many_calls,
            store_writes,
            store_deletes,
            queue_count,
            msg_count,
            subscriptions,
            connections,
            p_relays,
            p_relays_own,
            p_msg_fwds,
            p_msg_fwds_own,
            p_msg_fwds_recv,
            rcv_services,
            rcv_service_subs,
            ntf_services,
            ntf_service_subs,
            rcv_services_sub_msg,
            rcv_services_sub_duplicate,
            rcv_services_count,
            rcv_services_queues,
            ntf_services_count,
            ntf_services_queues,
            rcv_service_stats,
            ntf_service_stats,
        } = other;
        self.rcv_service_stats.add(rcv_service_stats);
        self.ntf_service_stats.add(ntf_service_stats);
        self.p_relays.add(p_relays);
        self.p_relays_own.add(p_relays_own);
        self.p_msg_fwds.add(p_msg_fwds);
        self.p_msg_fwds_own.add(p_msg_fwds_own);
        // Destructured so that a new field cannot be forgotten here.
        for (sum, n) in [
            (&mut self.queues_created, queues_created),
            (&mut self.queues_secured, queues_secured),
            (&mut self.queues_deleted, queues_deleted),
            (&mut self.msg_sent, msg_sent),
            (&mut self.msg_sent_auth, msg_sent_auth),
            (&mut self.msg_sent_quota, msg_sent_quota),
            (&mut self.msg_sent_large, msg_sent_large),
            (&mut self.msg_sent_block, msg_sent_block),
            (&mut self.msg_recv, msg_recv),
            (&mut self.msg_expired, msg_expired),
            (&mut self.msg_ntfs, msg_ntfs),
            (&mut self.sub_successes, sub_successes),
            (&mut self.sub_batches, sub_batches),
            (&mut self.verify_batches, verify_batches),
            (&mut self.verify_batch_fallbacks, verify_batch_fallbacks),
            (&mut self.verify_budget_closes, verify_budget_closes),
            (&mut self.output_drops, output_drops),
            (&mut self.output_reasks, output_reasks),
            (&mut self.slow_reader_closes, slow_reader_closes),
            (&mut self.store_peek_first_calls, store_peek_first_calls),
            (
                &mut self.store_peek_first_many_calls,
                store_peek_first_many_calls,
            ),
            (&mut self.store_writes, store_writes),
            (&mut self.store_deletes, store_deletes),
            (&mut self.queue_count, queue_count),
            (&mut self.msg_count, msg_count),
            (&mut self.subscriptions, subscriptions),
            (&mut self.connections, connections),
            (&mut self.p_msg_fwds_recv, p_msg_fwds_recv),
            (&mut self.rcv_services, rcv_services),
            (&mut self.rcv_service_subs, rcv_service_subs),
            (&mut self.ntf_services, ntf_services),
            (&mut self.ntf_service_subs, ntf_service_subs),
            (&mut self.rcv_services_sub_msg, rcv_services_sub_msg),
            (
                &mut self.rcv_services_sub_duplicate,
                rcv_services_sub_duplicate,
            ),
            (&mut self.rcv_services_count, rcv_services_count),
            (&mut self.rcv_services_queues, rcv_services_queues),
            (&mut self.ntf_services_count, ntf_services_count),
            (&mut self.ntf_services_queues, ntf_services_queues),
        ] {
            *sum = sum.saturating_add(*n);
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// One metric: its samples share the name and differ by labels (`""` for none).
struct Family<'a> {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    samples: &'a [(&'static str, u64)],
}

/// The six error samples of a proxy family, as the reference labels them.
fn proxy_errors(all: &ProxyStats, own: &ProxyStats) -> [(&'static str, u64); 6] {
    [
        ("{source=\"all\",type=\"connect\"}", all.errors_connect),
        ("{source=\"all\",type=\"compat\"}", all.errors_compat),
        ("{source=\"all\",type=\"other\"}", all.errors_other),
        ("{source=\"own\",type=\"connect\"}", own.errors_connect),
        ("{source=\"own\",type=\"compat\"}", own.errors_compat),
        ("{source=\"own\",type=\"other\"}", own.errors_other),
    ]
}

/// The Prometheus text for `s`, every sample stamped with `now_ms` (milliseconds since the epoch).
pub fn render(s: &MetricsSnapshot, now_ms: u64) -> String {
    let families = [
        Family {
            name: "simplex_smp_queues_created",
            kind: Kind::Counter,
            help: "Queues created by NEW.",
            samples: &[("", s.queues_created)],
        },
        Family {
            name: "simplex_smp_queues_secured",
            kind: Kind::Counter,
            help: "Queues secured by KEY or SKEY.",
            samples: &[("", s.queues_secured)],
        },
        Family {
            name: "simplex_smp_queues_deleted",
            kind: Kind::Counter,
            help: "Queues deleted by DEL.",
            samples: &[("{type=\"all\"}", s.queues_deleted)],
        },
        Family {
            name: "simplex_smp_queues_total1",
            kind: Kind::Gauge,
            help: "Queues in the store.",
            samples: &[("", s.queue_count)],
        },
        Family {
            name: "simplex_smp_queues_total2",
            kind: Kind::Gauge,
            help: "Queues in the store (the same count as total1 here).",
            samples: &[("", s.queue_count)],
        },
        Family {
            name: "simplex_smp_subscribtion_successes",
            kind: Kind::Counter,
            help: "SUB commands that subscribed.",
            samples: &[("", s.sub_successes)],
        },
        Family {
            name: "simplex_smp_subscribtion_successes_batch",
            kind: Kind::Counter,
            help: "Blocks whose SUBs were read from the store together.",
            samples: &[("", s.sub_batches)],
        },
        Family {
            name: "simplex_smp_messages_sent",
            kind: Kind::Counter,
            help: "Messages accepted by SEND.",
            samples: &[("", s.msg_sent)],
        },
        Family {
            name: "simplex_smp_messages_sent_errors",
            kind: Kind::Counter,
            help: "SEND commands refused, by error.",
            samples: &[
                ("{type=\"auth\"}", s.msg_sent_auth),
                ("{type=\"quota\"}", s.msg_sent_quota),
                ("{type=\"large\"}", s.msg_sent_large),
                ("{type=\"block\"}", s.msg_sent_block),
            ],
        },
        Family {
            name: "simplex_smp_messages_received",
            kind: Kind::Counter,
            help: "Messages acknowledged by their recipients.",
            samples: &[("", s.msg_recv)],
        },
        Family {
            name: "simplex_smp_messages_expired",
            kind: Kind::Counter,
            help: "Messages deleted because their TTL passed.",
            samples: &[("", s.msg_expired)],
        },
        Family {
            name: "simplex_smp_messages_total",
            kind: Kind::Gauge,
            help: "Messages in the store.",
            samples: &[("", s.msg_count)],
        },
        Family {
            name: "simplex_smp_messages_ntf_successes",
            kind: Kind::Counter,
            help: "Notifications delivered to notification servers.",
            samples: &[("", s.msg_ntfs)],
        },
        Family {
            name: "simplex_smp_subscribtion_total",
            kind: Kind::Gauge,
            help: "Queues with a subscriber.",
            samples: &[("", s.subscriptions)],
        },
        // Spelled as the reference spells them, "subscribtion" and "nts" included.
        Family {
            name: "simplex_smp_subscribtion_services_total",
            kind: Kind::Gauge,
            help: "Messaging services with a subscribed connection.",
            samples: &[("", s.rcv_services)],
        },
        Family {
            name: "simplex_smp_subscribtion_service_subs_total",
            kind: Kind::Gauge,
            help: "Queue subscriptions held by messaging services' connections.",
            samples: &[("", s.rcv_service_subs)],
        },
        Family {
            name: "simplex_smp_subscribtion_nts_services_total",
            kind: Kind::Gauge,
            help: "Notification services with a subscribed connection.",
            samples: &[("", s.ntf_services)],
        },
        Family {
            name: "simplex_smp_subscription_ntf_service_subs_total",
            kind: Kind::Gauge,
            help: "Notifier subscriptions held by notification services' connections.",
            samples: &[("", s.ntf_service_subs)],
        },
        Family {
            name: "simplex_smp_rcv_services_sub_msg_count",
            kind: Kind::Counter,
            help: "Messages handed to messaging services by SUBS.",
            samples: &[("", s.rcv_services_sub_msg)],
        },
        Family {
            name: "simplex_smp_rcv_services_sub_duplicate_count",
            kind: Kind::Counter,
            help: "Queues a messaging service's connection already held at its SUBS.",
            samples: &[("", s.rcv_services_sub_duplicate)],
        },
        Family {
            name: "simplex_smp_rcv_services_count",
            kind: Kind::Gauge,
            help: "The count of receiving services.",
            samples: &[("", s.rcv_services_count)],
        },
        Family {
            name: "simplex_smp_rcv_services_queues_count",
            kind: Kind::Gauge,
            help: "The count of queues associated with receiving services.",
            samples: &[("", s.rcv_services_queues)],
        },
        Family {
            name: "simplex_smp_ntf_services_count",
            kind: Kind::Gauge,
            help: "The count of notification services.",
            samples: &[("", s.ntf_services_count)],
        },
        Family {
            name: "simplex_smp_ntf_services_queues_count",
            kind: Kind::Gauge,
            help: "The count of queues associated with notification services.",
            samples: &[("", s.ntf_services_queues)],
        },
        Family {
            name: "simplex_smp_clients_total",
            kind: Kind::Gauge,
            help: "Open client connections.",
            samples: &[("", s.connections)],
        },
        Family {
            name: "smprelay_store_peek_first_calls_total",
            kind: Kind::Counter,
            help: "Store reads of one queue's first message.",
            samples: &[("", s.store_peek_first_calls)],
        },
        Family {
            name: "smprelay_store_peek_first_many_calls_total",
            kind: Kind::Counter,
            help: "Store reads of the first messages of a batch of queues (one per SUB batch).",
            samples: &[("", s.store_peek_first_many_calls)],
        },
        Family {
            name: "simplex_smp_relay_sessions_requests",
            kind: Kind::Counter,
            help: "Session requests through relay.",
            samples: &[
                ("{source=\"all\"}", s.p_relays.requests),
                ("{source=\"own\"}", s.p_relays_own.requests),
            ],
        },
        Family {
            name: "simplex_smp_relay_sessions_successes",
            kind: Kind::Counter,
            help: "Successful session events through relay.",
            samples: &[
                ("{source=\"all\"}", s.p_relays.successes),
                ("{source=\"own\"}", s.p_relays_own.successes),
            ],
        },
        Family {
            name: "simplex_smp_relay_sessions_errors",
            kind: Kind::Counter,
            help: "Error session events through relay.",
            samples: &proxy_errors(&s.p_relays, &s.p_relays_own),
        },
        Family {
            name: "simplex_smp_relay_messages_requests",
            kind: Kind::Counter,
            help: "Message requests sent through relay.",
            samples: &[
                ("{source=\"all\"}", s.p_msg_fwds.requests),
                ("{source=\"own\"}", s.p_msg_fwds_own.requests),
            ],
        },
        Family {
            name: "simplex_smp_relay_messages_successes",
            kind: Kind::Counter,
            help: "Successful messages sent through relay.",
            samples: &[
                ("{source=\"all\"}", s.p_msg_fwds.successes),
                ("{source=\"own\"}", s.p_msg_fwds_own.successes),
            ],
        },
        Family {
            name: "simplex_smp_relay_messages_errors",
            kind: Kind::Counter,
            help: "Error events with messages sent through relay.",
            samples: &proxy_errors(&s.p_msg_fwds, &s.p_msg_fwds_own),
        },
        Family {
            name: "simplex_smp_relay_messages_received",
            kind: Kind::Counter,
            help: "Relay messages statistics.",
            samples: &[("", s.p_msg_fwds_recv)],
        },
        Family {
            name: "smprelay_verify_batches_total",
            kind: Kind::Counter,
            help: "Block parts whose Ed25519 signatures were verified in one batch.",
            samples: &[("", s.verify_batches)],
        },
        Family {
            name: "smprelay_verify_batch_fallbacks_total",
            kind: Kind::Counter,
            help: "Batches that failed; their signatures were then verified one by one.",
            samples: &[("", s.verify_batch_fallbacks)],
        },
        Family {
            name: "smprelay_verify_budget_closes_total",
            kind: Kind::Counter,
            help: "Connections closed for causing too many failed signature verifications.",
            samples: &[("", s.verify_budget_closes)],
        },
        Family {
            name: "smprelay_output_drops_total",
            kind: Kind::Counter,
            help: "MSG deliveries dropped to a marker while their connection's output was over its bound.",
            samples: &[("", s.output_drops)],
        },
        Family {
            name: "smprelay_output_reasks_total",
            kind: Kind::Counter,
            help: "Times a connection asked its owners again for what it held (dropped MSGs, more notifications).",
            samples: &[("", s.output_reasks)],
        },
        Family {
            name: "smprelay_slow_reader_closes_total",
            kind: Kind::Counter,
            help: "Connections closed for not reading their output.",
            samples: &[("", s.slow_reader_closes)],
        },
        Family {
            name: "smprelay_store_writes_total",
            kind: Kind::Counter,
            help: "Store writes (messages and queue records).",
            samples: &[("", s.store_writes)],
        },
        Family {
            name: "smprelay_store_deletes_total",
            kind: Kind::Counter,
            help: "Store deletions (messages and queues).",
            samples: &[("", s.store_deletes)],
        },
    ];
    let mut out = String::with_capacity(8192);
    // `fmt::Write` for a String cannot fail.
    let _ = writeln!(
        out,
        "# Recorded at: {}\n",
        crate::clock::utc_time_ms(now_ms)
    );
    for f in &families {
        write_family(&mut out, f.name, f.kind, f.help, f.samples, now_ms);
    }
    for (pfx, name, stats) in [
        ("rcv", "receiving", &s.rcv_service_stats),
        ("ntf", "notification", &s.ntf_service_stats),
    ] {
        for (suffix, kind, help, value) in service_families(stats) {
            write_family(
                &mut out,
                &format!("simplex_smp_{pfx}_services_{suffix}"),
                kind,
                &help.replace("{}", name),
                &[("", value)],
                now_ms,
            );
        }
    }
    out
}

fn write_family(
    out: &mut String,
    name: &str,
    kind: Kind,
    help: &str,
    samples: &[(&str, u64)],
    now_ms: u64,
) {
    let kind = match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    };
    // `fmt::Write` for a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value} {now_ms}");
    }
    out.push('\n');
}

/// The reference's service families of one role (`showServices`, Prometheus.hs): name suffix,
/// type and help (`{}` is the role's name), and value.
fn service_families(s: &ServiceStats) -> [(&'static str, Kind, &'static str, u64); 14] {
    use Kind::{Counter, Gauge};
    let more = "Service subscriptions for {} services with more queues than in the client.";
    let fewer = "Service subscriptions for {} services with fewer queues than in the client.";
    [
        (
            "assoc_new",
            Counter,
            "New queue associations with {} services.",
            s.assoc_new,
        ),
        (
            "assoc_duplicate",
            Counter,
            "Duplicate queue associations with {} services.",
            s.assoc_duplicate,
        ),
        (
            "assoc_updated",
            Counter,
            "Updated queue associations with {} services.",
            s.assoc_updated,
        ),
        (
            "assoc_removed",
            Counter,
            "Removed queue associations with {} services.",
            s.assoc_removed,
        ),
        (
            "sub_count",
            Counter,
            "Service subscriptions by {} services.",
            s.sub_count,
        ),
        (
            "sub_duplicate",
            Counter,
            "Duplicate service subscriptions by {} services.",
            s.sub_duplicate,
        ),
        (
            "sub_queues",
            Gauge,
            "Queues subscribed by {} services.",
            s.sub_queues,
        ),
        (
            "sub_end",
            Gauge,
            "Ended subscriptions with {} services.",
            s.sub_end,
        ),
        (
            "sub_ok",
            Gauge,
            "Service subscriptions for {} services.",
            s.sub_ok,
        ),
        ("sub_more", Gauge, more, s.sub_more),
        ("sub_fewer", Gauge, fewer, s.sub_fewer),
        (
            "sub_diff",
            Gauge,
            "Service subscriptions for {} services with different hash than in the client.",
            s.sub_diff,
        ),
        (
            "sub_more_total",
            Gauge,
            "Service subscriptions for {} services with more queues than in the client total.",
            s.sub_more_total,
        ),
        (
            "sub_fewer_total",
            Gauge,
            "Service subscriptions for {} services with fewer queues than in the client total.",
            s.sub_fewer_total,
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

    fn numbered() -> MetricsSnapshot {
        MetricsSnapshot {
            queues_created: 1,
            queues_secured: 2,
            queues_deleted: 3,
            msg_sent: 4,
            msg_sent_auth: 5,
            msg_sent_quota: 6,
            msg_sent_large: 7,
            msg_recv: 8,
            msg_expired: 9,
            msg_ntfs: 10,
            sub_successes: 11,
            sub_batches: 12,
            verify_batches: 21,
            verify_batch_fallbacks: 22,
            verify_budget_closes: 44,
            output_drops: 45,
            output_reasks: 46,
            slow_reader_closes: 47,
            store_peek_first_calls: 13,
            store_peek_first_many_calls: 14,
            store_writes: 15,
            store_deletes: 16,
            queue_count: 17,
            msg_count: 18,
            subscriptions: 19,
            connections: 20,
            p_relays: proxy(23),
            p_relays_own: proxy(28),
            p_msg_fwds: proxy(33),
            p_msg_fwds_own: proxy(38),
            p_msg_fwds_recv: 43,
            msg_sent_block: 48,
            rcv_services: 49,
            rcv_service_subs: 50,
            ntf_services: 51,
            ntf_service_subs: 52,
            rcv_services_sub_msg: 53,
            rcv_services_sub_duplicate: 54,
            rcv_services_count: 55,
            rcv_services_queues: 56,
            ntf_services_count: 57,
            ntf_services_queues: 58,
            rcv_service_stats: service_stats(100),
            ntf_service_stats: service_stats(200),
        }
    }

    fn service_stats(from: u64) -> ServiceStats {
        ServiceStats {
            assoc_new: from,
            assoc_duplicate: from + 1,
            assoc_updated: from + 2,
            assoc_removed: from + 3,
            sub_count: from + 4,
            sub_duplicate: from + 5,
            sub_queues: from + 6,
            sub_end: from + 7,
            sub_ok: from + 8,
            sub_more: from + 9,
            sub_fewer: from + 10,
            sub_diff: from + 11,
            sub_more_total: from + 12,
            sub_fewer_total: from + 13,
        }
    }

    fn proxy(from: u64) -> ProxyStats {
        ProxyStats {
            requests: from,
            successes: from + 1,
            errors_connect: from + 2,
            errors_compat: from + 3,
            errors_other: from + 4,
        }
    }

    #[test]
    fn each_metric_appears_once_with_its_value_and_timestamp() {
        let text = render(&numbered(), 1_700_000_000_123);
        for (sample, value) in [
            ("simplex_smp_queues_created", 1),
            ("simplex_smp_queues_secured", 2),
            ("simplex_smp_queues_deleted{type=\"all\"}", 3),
            ("simplex_smp_messages_sent", 4),
            ("simplex_smp_messages_sent_errors{type=\"auth\"}", 5),
            ("simplex_smp_messages_sent_errors{type=\"quota\"}", 6),
            ("simplex_smp_messages_sent_errors{type=\"large\"}", 7),
            ("simplex_smp_messages_sent_errors{type=\"block\"}", 48),
            ("simplex_smp_messages_received", 8),
            ("simplex_smp_messages_expired", 9),
            ("simplex_smp_messages_ntf_successes", 10),
            ("simplex_smp_subscribtion_successes", 11),
            ("simplex_smp_subscribtion_successes_batch", 12),
            ("smprelay_store_peek_first_calls_total", 13),
            ("smprelay_store_peek_first_many_calls_total", 14),
            ("smprelay_store_writes_total", 15),
            ("smprelay_verify_batches_total", 21),
            ("smprelay_verify_batch_fallbacks_total", 22),
            ("smprelay_verify_budget_closes_total", 44),
            ("smprelay_output_drops_total", 45),
            ("smprelay_output_reasks_total", 46),
            ("smprelay_slow_reader_closes_total", 47),
            ("smprelay_store_deletes_total", 16),
            ("simplex_smp_queues_total1", 17),
            ("simplex_smp_queues_total2", 17),
            ("simplex_smp_messages_total", 18),
            ("simplex_smp_subscribtion_total", 19),
            ("simplex_smp_clients_total", 20),
            ("simplex_smp_subscribtion_services_total", 49),
            ("simplex_smp_subscribtion_service_subs_total", 50),
            ("simplex_smp_subscribtion_nts_services_total", 51),
            ("simplex_smp_subscription_ntf_service_subs_total", 52),
            ("simplex_smp_rcv_services_sub_msg_count", 53),
            ("simplex_smp_rcv_services_sub_duplicate_count", 54),
            ("simplex_smp_rcv_services_count", 55),
            ("simplex_smp_rcv_services_queues_count", 56),
            ("simplex_smp_ntf_services_count", 57),
            ("simplex_smp_ntf_services_queues_count", 58),
            ("simplex_smp_rcv_services_assoc_new", 100),
            ("simplex_smp_rcv_services_assoc_duplicate", 101),
            ("simplex_smp_rcv_services_assoc_updated", 102),
            ("simplex_smp_rcv_services_assoc_removed", 103),
            ("simplex_smp_rcv_services_sub_count", 104),
            ("simplex_smp_rcv_services_sub_duplicate", 105),
            ("simplex_smp_rcv_services_sub_queues", 106),
            ("simplex_smp_rcv_services_sub_end", 107),
            ("simplex_smp_rcv_services_sub_ok", 108),
            ("simplex_smp_rcv_services_sub_more", 109),
            ("simplex_smp_rcv_services_sub_fewer", 110),
            ("simplex_smp_rcv_services_sub_diff", 111),
            ("simplex_smp_rcv_services_sub_more_total", 112),
            ("simplex_smp_rcv_services_sub_fewer_total", 113),
            ("simplex_smp_ntf_services_assoc_new", 200),
            ("simplex_smp_ntf_services_sub_fewer_total", 213),
            ("simplex_smp_relay_sessions_requests{source=\"all\"}", 23),
            ("simplex_smp_relay_sessions_successes{source=\"all\"}", 24),
            (
                "simplex_smp_relay_sessions_errors{source=\"all\",type=\"connect\"}",
                25,
            ),
            (
                "simplex_smp_relay_sessions_errors{source=\"all\",type=\"compat\"}",
                26,
            ),
            (
                "simplex_smp_relay_sessions_errors{source=\"all\",type=\"other\"}",
                27,
            ),
            ("simplex_smp_relay_sessions_requests{source=\"own\"}", 28),
            (
                "simplex_smp_relay_sessions_errors{source=\"own\",type=\"other\"}",
                32,
            ),
            ("simplex_smp_relay_messages_requests{source=\"all\"}", 33),
            ("simplex_smp_relay_messages_successes{source=\"all\"}", 34),
            (
                "simplex_smp_relay_messages_errors{source=\"all\",type=\"other\"}",
                37,
            ),
            ("simplex_smp_relay_messages_successes{source=\"own\"}", 39),
            (
                "simplex_smp_relay_messages_errors{source=\"own\",type=\"connect\"}",
                40,
            ),
            ("simplex_smp_relay_messages_received", 43),
        ] {
            let line = format!("{sample} {value} 1700000000123");
            assert_eq!(
                text.lines().filter(|l| *l == line).count(),
                1,
                "{line:?} once in:\n{text}"
            );
            let name = sample.split('{').next().unwrap_or(sample);
            let samples = text
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("{name} ")) || l.starts_with(&format!("{name}{{"))
                })
                .count();
            let expected = match name {
                "simplex_smp_messages_sent_errors" => 4,
                "simplex_smp_relay_sessions_errors" | "simplex_smp_relay_messages_errors" => 6,
                n if n.starts_with("simplex_smp_relay_")
                    && n != "simplex_smp_relay_messages_received" =>
                {
                    2
                }
                _ => 1,
            };
            assert_eq!(samples, expected, "samples of {name}");
            assert_eq!(
                text.lines()
                    .filter(|l| l.starts_with(&format!("# TYPE {name} ")))
                    .count(),
                1,
                "TYPE of {name}"
            );
            assert_eq!(
                text.lines()
                    .filter(|l| l.starts_with(&format!("# HELP {name} ")))
                    .count(),
                1,
                "HELP of {name}"
            );
        }
        assert!(text.contains("# TYPE simplex_smp_queues_created counter\n"));
        assert!(text.contains("# TYPE simplex_smp_messages_total gauge\n"));
        assert!(text.starts_with("# Recorded at: 2023-11-14T22:13:20.123Z\n"));
    }

    #[test]
    fn every_sample_line_is_name_value_timestamp() {
        let text = render(&MetricsSnapshot::default(), 42);
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let parts: Vec<&str> = line.split(' ').collect();
            assert_eq!(parts.len(), 3, "{line}");
            assert_eq!(parts[1], "0");
            assert_eq!(parts[2], "42");
        }
    }

    #[test]
    fn shards_sum() {
        let mut total = MetricsSnapshot::default();
        total.add(&numbered());
        total.add(&numbered());
        assert_eq!(total.queues_created, 2);
        assert_eq!(total.connections, 40);
        assert_eq!(total.store_peek_first_many_calls, 28);
        assert_eq!(total.p_msg_fwds_own.errors_other, 84);
        assert_eq!(total.p_msg_fwds_recv, 86);
        let mut max = MetricsSnapshot {
            msg_sent: u64::MAX,
            ..MetricsSnapshot::default()
        };
        max.add(&numbered());
        assert_eq!(max.msg_sent, u64::MAX);
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
    fn from_shard_copies_the_counters() {
        let owner = OwnerStats {
            queues_created: 3,
            subs: 5,
            sub_batches: 2,
            ..OwnerStats::default()
        };
        let store = StoreCounters {
            peek_first: 1,
            peek_first_many: 2,
            writes: 0,
            deletes: 0,
        };
        let s = MetricsSnapshot::from_shard(&owner, &store);
        assert_eq!(s.queues_created, 3);
        assert_eq!(s.sub_successes, 5);
        assert_eq!(s.sub_batches, 2);
        assert_eq!(s.store_peek_first_calls, 1);
        assert_eq!(s.store_peek_first_many_calls, 2);
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
