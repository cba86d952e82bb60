//! The PostgreSQL store holds only the queue records in use (`docs/ARCHITECTURE.md` §5,
//! "PostgreSQL: records read when used"): a relay with more queues than its cache serves every
//! command on queues it does not hold (SUB, SEND, ACK, NSUB, LGET, a service's SUBS), keeps each
//! queue's order while records come and go, and never lets go of a subscribed queue's record.

use crate::common;
use crate::support;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{self, new_link, KeyAlg, RecipientKeys};
use smp_relay::client::service::ROLE_MESSAGING;
use smp_relay::client::{new_corr_id, ClientCert, ClientOptions, ClientTransmission};
use smp_relay::protocol::command::{Command, QueueReq};
use smp_relay::protocol::response::BrokerMsg;
use support::services::{bodies, ids_hash, new_as_service, service, soks, subs};
use support::*;

/// The smallest cache `--pg-queue-cache` takes: 500 records per shard on 2 shards.
const CACHE: usize = 1_000;
/// Three times what the cache holds.
const QUEUES: usize = 3 * CACHE;
/// Queues one connection keeps subscribed through everything.
const SUBSCRIBED: usize = 200;

const RECORDS_READ: &str = "smprelay_store_records_read_total";

fn records_read(relay: &Relay) -> u64 {
    relay.publish_metrics();
    relay.metrics().get(RECORDS_READ).copied().unwrap_or(0)
}

/// `(read, evicted)` at one publication of the metrics.
fn records_read_and_evicted(relay: &Relay) -> (u64, u64) {
    relay.publish_metrics();
    let m = relay.metrics();
    let get = |name: &str| m.get(name).copied().unwrap_or(0);
    (
        get(RECORDS_READ),
        get("smprelay_store_records_evicted_total"),
    )
}

/// A relay of two shards on a database of its own, with `extra` arguments.
fn pg_relay(extra: &[&str]) -> Relay {
    let conninfo = common::pg_database();
    let args = ["--store", "postgres", "--database", &conninfo];
    Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: args.iter().chain(extra).map(|s| s.to_string()).collect(),
    })
}

/// The queue and notifier gauges (`simplex_smp_queues_total1`, `…_notify_total2`) once they are
/// `want`, or the last seen: after a start they come with the relay's count, which runs while it
/// serves (polled: the count is an outcome, not a deadline).
fn counts_when(relay: &Relay, want: (u64, u64)) -> (Option<u64>, Option<u64>) {
    let mut got = (None, None);
    for _ in 0..100 {
        relay.publish_metrics();
        let m = relay.metrics();
        got = (
            m.get("simplex_smp_queues_total1").copied(),
            m.get("simplex_smp_queues_notify_total2").copied(),
        );
        if got == (Some(want.0), Some(want.1)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    got
}

#[test]
fn more_queues_than_the_cache_are_served_and_subscribed_records_stay() {
    let mut relay = pg_relay(&[
        "--pg-queue-cache",
        &CACHE.to_string(),
        "--metrics-interval",
        "3600",
    ]);
    let mut rc = relay.client();
    let qs = create_many(&mut rc, QUEUES, 100);
    // Notifiers on the last queues, a contact address with link data, a service's queues.
    let notified: Vec<(&Queue, Notifier)> = qs[QUEUES - 5..]
        .iter()
        .map(|q| (q, nkey(&mut rc, q)))
        .collect();
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let corr = new_corr_id();
    let link = new_link(&corr, b"fixed data", b"user data");
    let link_id: Vec<u8> = new_corr_id().to_vec();
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(Some((link_id.clone(), link.clone()))));
    let contact = create_with_corr(&mut rc, keys, new, &corr);
    let cert = ClientCert::self_signed().expect("certificate");
    let mut svc = service(&relay, &cert, ROLE_MESSAGING);
    let served: Vec<Queue> = (0..3)
        .map(|_| new_as_service(&mut svc, true).expect("IDS"))
        .collect();
    drop(svc);
    drop(rc);

    // A start reads no record: each is read when a command needs it.
    assert!(relay.stop().success(), "a clean stop");
    relay.restart();
    assert_eq!(records_read(&relay), 0, "no record read at start");
    // The start reads no queue: the relay's count, made while it serves, gives the gauges.
    let want = ((QUEUES + 1 + served.len()) as u64, notified.len() as u64);
    assert_eq!(
        counts_when(&relay, want),
        (Some(want.0), Some(want.1)),
        "(queues, notifiers) counted after the start"
    );
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let mut sub = relay.client();
    for q in &qs[..SUBSCRIBED] {
        sub_empty(&mut sub, q);
    }
    // A message to every other queue: each SEND reads its queue's record, and the cache, a third
    // of their number, lets most of them go again.
    for (i, q) in qs[SUBSCRIBED..].iter().enumerate() {
        send_ok(&mut sc, q, None, format!("first {i}").as_bytes());
    }
    let (read, evicted) = records_read_and_evicted(&relay);
    assert!(
        read >= QUEUES as u64,
        "every queue's record was read once at least: {read}"
    );
    // Every record held since the restart was read, and what the cache holds now is within its
    // bound (the subscribed queues' records, kept, are fewer than it): the rest was let go.
    assert!(
        read - evicted <= CACHE as u64 && evicted > 0,
        "{read} read, {evicted} let go, with a cache of {CACHE}"
    );

    // The subscribed queues' records stayed: SEND, the pushed MSG and its ACK read none again.
    for q in &qs[..SUBSCRIBED] {
        send_ok(&mut sc, q, None, b"to a subscriber");
        let m = expect_body(&mut sub, q, b"to a subscriber");
        assert_eq!(ack(&mut sub, q, &m.msg_id), BrokerMsg::Ok);
    }
    assert_eq!(
        records_read(&relay),
        read,
        "a subscribed queue's record was read again: it had been let go"
    );

    // Per-queue order across evictions: a second and third message to queues that are not held,
    // each round followed by traffic that makes the cache let them go.
    let ordered = &qs[SUBSCRIBED..SUBSCRIBED + 50];
    for round in ["second", "third"] {
        for q in ordered {
            send_ok(&mut sc, q, None, round.as_bytes());
        }
        for q in &qs[QUEUES / 2..QUEUES / 2 + CACHE] {
            send_ok(&mut sc, q, None, round.as_bytes());
        }
    }
    for (i, q) in ordered.iter().enumerate() {
        let m = sub_with_msg(&mut rc, q);
        assert_eq!(m.msg.body(), Some(format!("first {i}").as_bytes()));
        let m = msg_of(q, ack(&mut rc, q, &m.msg_id));
        assert_eq!(m.msg.body(), Some(&b"second"[..]), "in order");
        let m = msg_of(q, ack(&mut rc, q, &m.msg_id));
        assert_eq!(m.msg.body(), Some(&b"third"[..]), "in order");
        assert_eq!(ack(&mut rc, q, &m.msg_id), BrokerMsg::Ok, "nothing more");
    }

    // NSUB on notifiers whose queues are not held, then a SEND notifies.
    let mut nc = relay.client();
    for (q, n) in &notified {
        assert_eq!(nsub(&mut nc, n), sok(&nc), "NSUB");
        assert_eq!(
            send_as(&mut sc, q.sid(), None, send_ntf_cmd(b"notified")),
            BrokerMsg::Ok
        );
        expect_nmsg(&mut nc, n);
    }

    // LGET of a contact address that is not held.
    assert_eq!(
        unsigned(&mut sc, &link_id, Command::LGet),
        BrokerMsg::Lnk {
            sender_id: contact.ids.snd_id.clone(),
            fixed: link.fixed.clone(),
            user: link.user.clone(),
        }
    );

    // A service's SUBS over queues that are not held: the count, the hash and the waiting message.
    send_ok(&mut sc, &served[1], None, b"for the service");
    let mut svc = service(&relay, &cert, ROLE_MESSAGING);
    let hash = ids_hash(served.iter().map(|q| q.rid()));
    let (answer, rest) = subs(&mut svc, false, (3, hash));
    assert_eq!(answer, soks(3, hash));
    let got = bodies(&served.iter().collect::<Vec<_>>(), &rest);
    assert_eq!(got.len(), 1, "one waiting message");
    assert_eq!(got[served[1].rid()], b"for the service");
}

/// With the database down, a command on a queue whose record is not held cannot be decided: it is
/// answered `ERR STORE`, never `AUTH` (which would tell the client its queue is gone), and the
/// same command succeeds once the database is back.
#[test]
fn an_unreadable_record_is_a_store_error_not_a_missing_queue() {
    use smp_relay::store::postgres::cluster::{Cluster, ClusterOptions};
    // A cluster of this test's own: it is stopped while the relay runs.
    let cluster = Cluster::start(&ClusterOptions::default()).expect("a cluster");
    let db = cluster.create_database().expect("a database");
    let conninfo = cluster.conninfo(&db);
    let mut relay = Relay::start_with(RelayOptions {
        extra_args: [
            "--store",
            "postgres",
            "--database",
            &conninfo,
            "--db-pool-wait-secs",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..RelayOptions::default()
    });
    let q = create(&mut relay.client());
    assert!(relay.stop().success(), "a clean stop");
    relay.restart();
    cluster.stop_server("fast").expect("stop the server");
    // The relay's waits for the database are bounded (`--db-pool-wait-secs`, reconnection):
    // the clients wait longer.
    let client = || {
        relay
            .connect(ClientOptions {
                timeout: std::time::Duration::from_secs(60),
                ..ClientOptions::default()
            })
            .expect("connect")
    };
    let (mut c, mut sc) = (client(), client());
    let r = signed(&mut c, q.key(), q.rid(), Command::Sub);
    assert!(
        matches!(r, BrokerMsg::Err(ErrorType::Store(_))),
        "SUB with the database down: {r:?}"
    );
    let r = send(&mut sc, &q, None, b"later");
    assert!(
        matches!(r, BrokerMsg::Err(ErrorType::Store(_))),
        "SEND with the database down: {r:?}"
    );
    cluster.start_server().expect("start the server");
    // The pool reconnects on its own; until then the answers stay ERR STORE.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match send(&mut sc, &q, None, b"later") {
            BrokerMsg::Ok => break,
            BrokerMsg::Err(ErrorType::Store(_)) if std::time::Instant::now() < deadline => {
                common::sleep(std::time::Duration::from_millis(100))
            }
            other => panic!("SEND once the database is back: {other:?}"),
        }
    }
    assert_eq!(sub_with_msg(&mut c, &q).msg.body(), Some(&b"later"[..]));
}

/// A block whose commands name IDs the directory's cache does not hold (nothing is cached after a
/// start) waits for their look-up as a whole, so its commands reach their owners in block order:
/// each queue's GET, after a SEND to it by sender ID in the same block, finds that message (a GET
/// routed ahead of its SEND would find none). Then the IDs are cached: the same again needs no
/// look-up and keeps the order too.
#[test]
fn a_block_with_uncached_ids_keeps_its_order() {
    let mut relay = pg_relay(&[]);
    let mut c = relay.client();
    let qs = create_many(&mut c, 20, 20);
    drop(c);
    assert!(relay.stop().success(), "a clean stop");
    relay.restart();
    let mut c = relay.client();
    for round in ["after the start", "cached"] {
        let ts: Vec<ClientTransmission> = qs
            .iter()
            .flat_map(|q| {
                [
                    ClientTransmission::new(&new_corr_id(), q.sid(), send_cmd(round.as_bytes())),
                    ClientTransmission::new(&new_corr_id(), q.rid(), Command::Get)
                        .signed(q.key().clone()),
                ]
            })
            .collect();
        c.send_batch(&ts).expect("send the block");
        let mut answers = std::collections::HashMap::new();
        while answers.len() < ts.len() {
            let t = next(&mut c);
            answers.insert(t.corr_id.clone(), t);
        }
        for (q, pair) in qs.iter().zip(ts.chunks(2)) {
            assert_eq!(
                answers[&pair[0].corr_id].msg,
                Ok(BrokerMsg::Ok),
                "SEND {round}"
            );
            let got = msg_of(q, answers[&pair[1].corr_id].msg.clone().expect("parsed"));
            assert_eq!(
                got.msg.body(),
                Some(round.as_bytes()),
                "GET after SEND, {round}"
            );
            assert_eq!(ack(&mut c, q, &got.msg_id), BrokerMsg::Ok);
        }
    }
}

/// The queue and notifier gauges after a start: the relay's count (made once for all shards, from
/// a snapshot taken before they serve) plus each shard's changes since: queues made and deleted,
/// notifiers added and removed right after the start are counted once each.
#[test]
fn the_counts_after_a_start_keep_the_changes_made_meanwhile() {
    let mut relay = pg_relay(&[]);
    let mut c = relay.client();
    let before = create_many(&mut c, 20, 20);
    for q in &before[..4] {
        nkey(&mut c, q);
    }
    drop(c);
    assert!(relay.stop().success(), "a clean stop");
    relay.restart();
    let mut c = relay.client();
    // At once after the start: 6 queues more, 2 of the old ones deleted, a notifier more on a new
    // queue and one fewer on an old one.
    let made = create_many(&mut c, 6, 6);
    for q in &before[18..] {
        assert_eq!(
            signed(&mut c, q.key(), q.rid(), Command::Del),
            BrokerMsg::Ok
        );
    }
    nkey(&mut c, &made[0]);
    assert_eq!(
        signed(&mut c, before[0].key(), before[0].rid(), Command::NDel),
        BrokerMsg::Ok
    );
    assert_eq!(
        counts_when(&relay, (24, 4)),
        (Some(24), Some(4)),
        "(queues, notifiers) after the start's changes"
    );
}
