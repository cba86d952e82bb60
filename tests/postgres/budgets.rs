//! Per-operation budgets of the PostgreSQL store (`benches/perf-budgets.json`): statements per SUB
//! batch and per block of SENDs or ACKs, Parse messages after warm-up, round trips per SEND, and
//! WAL bytes per SUB, SEND and ACK (one per block, and in blocks of 100: the store then makes one
//! statement and one transaction of a block's SENDs, and one of its ACKs).
//! Measured on a cluster of this test's own under fixed conditions — `full_page_writes` and
//! autovacuum off, a `CHECKPOINT` before each WAL measurement, the relay's records cached, and
//! `updated_at` already today (the queues are created by this test) — and failed above a ceiling.
//!
//! Statements are counted from the server's log: with `log_min_duration_statement = 0` it logs
//! every Parse, Bind and Execute message it gets, and the relay's lines carry its
//! `application_name`. WAL is what `pg_get_wal_records_info` (`pg_walinspect`) lists between two
//! positions, summed over records that touch a relation of the relay's schema, with commit records
//! counted apart and pruning, visibility-map and hint-bit records left out (they come from reads,
//! at PostgreSQL's discretion).

use crate::{common, support};

use std::collections::{HashMap, HashSet};

use common::{Relay, RelayOptions};
use smp_relay::client::{new_corr_id, Client, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::store::postgres::cluster::{Cluster, ClusterOptions};
use support::*;

const APP: &str = "budgeted_relay";
/// Queues for the SUB figure (WAL averaged over this many SUBs).
const SUB_QUEUES: usize = 10_000;
/// SENDs and ACKs measured, each way. Enough that the index page splits, which fall where the random IDs put them, average out:
/// over 1,000 the WAL per ACK varied by ±3% from run to run.
const MSGS: usize = 3_000;
/// SUBs of one block.
const BATCH: usize = 135;
/// SENDs or ACKs of one block.
const BLOCK: usize = 100;

struct Bench {
    cluster: Cluster,
    db: String,
    relay: Relay,
}

impl Bench {
    fn sql(&self) -> postgres::Client {
        self.cluster.client(&self.db).expect("connect")
    }

    /// The server log's length now: counting starts after it.
    fn log_mark(&self) -> usize {
        self.cluster.log().len()
    }

    /// Lines of the relay in the log since `mark` whose message starts with `what` (`parse`,
    /// `execute`) after the duration.
    fn relay_lines(&self, mark: usize, what: &str) -> Vec<String> {
        let log = self.cluster.log();
        let prefix = format!("[{APP}] ");
        log[mark.min(log.len())..]
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .filter(|l| {
                l.split_once(" ms  ")
                    .is_some_and(|(_, rest)| rest.starts_with(what))
            })
            .map(str::to_string)
            .collect()
    }

    fn checkpoint_and_lsn(&self) -> String {
        let mut c = self.sql();
        c.batch_execute("CHECKPOINT").expect("checkpoint");
        c.query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .expect("lsn")
            .get(0)
    }

    /// WAL since `start`: (bytes of records on the relay's relations, bytes of commit records).
    fn wal_since(&self, start: &str) -> (u64, u64) {
        let mut c = self.sql();
        let nodes: HashSet<String> = c
            .query(
                "SELECT format('%s/%s/%s', CASE WHEN reltablespace = 0 THEN \
                   (SELECT dattablespace FROM pg_database WHERE datname = current_database()) \
                   ELSE reltablespace END, \
                   (SELECT oid FROM pg_database WHERE datname = current_database()), \
                   pg_relation_filenode(oid)) \
                 FROM pg_class WHERE relnamespace = 'smp_server'::regnamespace \
                   AND pg_relation_filenode(oid) IS NOT NULL",
                &[],
            )
            .expect("relations")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(nodes.len() > 5, "the schema's relations: {nodes:?}");
        // A checkpoint flushes what is pending: pg_walinspect reads up to the flushed position.
        c.batch_execute("CHECKPOINT").expect("checkpoint");
        let rows = c
            .query(
                "SELECT record_length::int8, resource_manager, record_type, \
                   coalesce(block_ref, '') FROM pg_get_wal_records_info($1::text::pg_lsn, \
                   pg_current_wal_flush_lsn())",
                &[&start],
            )
            .expect("wal records");
        let (mut schema, mut commits) = (0u64, 0u64);
        for r in rows {
            let len = r.get::<_, i64>(0) as u64;
            let (rm, ty, refs): (String, String, String) = (r.get(1), r.get(2), r.get(3));
            if rm == "Transaction" {
                commits += len;
                continue;
            }
            let incidental = ty.starts_with("PRUNE") || ty == "VISIBLE" || ty == "FPI_FOR_HINT";
            let ours = nodes.iter().any(|n| {
                refs.contains(&format!("rel {n} ")) || refs.ends_with(&format!("rel {n}"))
            });
            if ours && !incidental {
                schema += len;
            }
        }
        (schema, commits)
    }
}

fn start() -> Bench {
    let cluster = Cluster::start(&ClusterOptions {
        conf: vec![
            "full_page_writes = off".into(),
            "autovacuum = off".into(),
            // The WAL read back after each measurement is kept however many checkpoints pass.
            "wal_keep_size = '2GB'".into(),
            "log_min_duration_statement = 0".into(),
            "log_line_prefix = '[%a] '".into(),
        ],
        tcp: false,
    })
    .unwrap_or_else(|e| panic!("cannot start the budgets' cluster: {e}"));
    let db = cluster.create_database().expect("database");
    let conninfo = format!("{} application_name={APP}", cluster.conninfo(&db));
    let relay = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: vec![
            "--store".into(),
            "postgres".into(),
            "--database".into(),
            conninfo,
            "--pool-size".into(),
            "4".into(),
        ],
    });
    Bench { cluster, db, relay }
}

fn budgets() -> HashMap<String, f64> {
    let v: serde_json::Value =
        serde_json::from_str(include_str!("../../benches/perf-budgets.json"))
            .expect("budgets JSON");
    v.as_object()
        .expect("an object")
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect()
}

fn sub_ts(qs: &[Queue]) -> (Vec<ClientTransmission>, Vec<[u8; 24]>) {
    let mut corrs = Vec::new();
    let ts = qs
        .iter()
        .map(|q| {
            let corr = new_corr_id();
            corrs.push(corr);
            ClientTransmission::new(&corr, q.rid(), Command::Sub).signed(q.key().clone())
        })
        .collect();
    (ts, corrs)
}

/// An answer, short: the command's name or the error.
fn what<E: std::fmt::Debug>(m: &Result<BrokerMsg, E>) -> String {
    match m {
        Ok(BrokerMsg::Msg { .. }) => "MSG".into(),
        other => format!("{other:?}"),
    }
}

/// SUBs of `qs` in full blocks; returns the MSG IDs delivered, by recipient ID.
fn sub_all(c: &mut Client, qs: &[Queue], with_msgs: bool) -> HashMap<Vec<u8>, Vec<u8>> {
    let mut got = HashMap::new();
    for chunk in qs.chunks(BATCH) {
        let (ts, corrs) = sub_ts(chunk);
        c.send_batch(&ts).expect("send SUBs");
        for corr in &corrs {
            let r = c.recv_for(corr).expect("SOK");
            assert_eq!(r.msg, Ok(sok(c)), "SUB answered SOK");
        }
        if with_msgs {
            let want = got.len() + chunk.len();
            while got.len() < want {
                let t = next(c);
                if let Ok(BrokerMsg::Msg { msg_id, .. }) = &t.msg {
                    got.insert(t.entity_id.clone(), msg_id.clone());
                }
            }
        }
    }
    got
}

/// Sends one transmission per queue of `qs`, made by `make(corr, queue)`, `per_block` in each
/// block, and checks that each is answered OK (`what`: the command, for the failure message).
fn each_answered_ok(
    c: &mut Client,
    qs: &[Queue],
    per_block: usize,
    what_cmd: &str,
    make: impl Fn(&[u8; 24], &Queue) -> ClientTransmission,
) {
    for chunk in qs.chunks(per_block) {
        let corrs: Vec<[u8; 24]> = chunk.iter().map(|_| new_corr_id()).collect();
        let ts: Vec<ClientTransmission> = chunk
            .iter()
            .zip(&corrs)
            .map(|(q, corr)| make(corr, q))
            .collect();
        c.send_batch(&ts)
            .unwrap_or_else(|e| panic!("send {what_cmd}s: {e}"));
        for corr in &corrs {
            let r = c
                .recv_for(corr)
                .unwrap_or_else(|e| panic!("{what_cmd} answer: {e}"));
            assert!(
                matches!(r.msg, Ok(BrokerMsg::Ok)),
                "{what_cmd} answered OK, not {}",
                what(&r.msg)
            );
        }
    }
}

/// SENDs to `qs`, `per_block` in each block.
fn send_each(c: &mut Client, qs: &[Queue], tag: &str, per_block: usize) {
    each_answered_ok(c, qs, per_block, "SEND", |corr, q| {
        ClientTransmission::new(corr, q.sid(), send_cmd(tag.as_bytes()))
    });
}

/// ACKs of the messages `ids` delivered from `qs`, `per_block` in each block.
fn ack_each(c: &mut Client, qs: &[Queue], ids: &HashMap<Vec<u8>, Vec<u8>>, per_block: usize) {
    each_answered_ok(c, qs, per_block, "ACK", |corr, q| {
        let id = ids.get(q.rid()).expect("a delivered message").clone();
        ClientTransmission::new(corr, q.rid(), Command::Ack(id)).signed(q.key().clone())
    });
}

#[test]
fn the_postgres_store_stays_within_its_budgets() {
    let mut b = start();
    let ceilings = budgets();
    let mut c = b.relay.client();
    let qs = create_many(&mut c, SUB_QUEUES, 100);
    let mut sender = b.relay.client();
    let mut measured: Vec<(&str, f64)> = Vec::new();

    // Warm-up: every kind of operation once, alone and in blocks (the pool prepares its
    // statements as it connects).
    send_each(&mut sender, &qs[..BATCH], "warm", BLOCK);
    {
        let mut r = b.relay.client();
        let ids = sub_all(&mut r, &qs[..BATCH], true);
        ack_each(&mut r, &qs[..2], &ids, 1);
        ack_each(&mut r, &qs[2..BATCH], &ids, BLOCK);
        send_each(&mut sender, &qs[..2], "warm", 1);
        let ids = sub_all(&mut r, &qs[..2], true);
        ack_each(&mut r, &qs[..2], &ids, 1);
    }
    let parse_mark = b.log_mark();

    // Statements per SUB batch: 135 queues that each hold a message, in one block.
    let batch = &qs[BATCH..2 * BATCH];
    send_each(&mut sender, batch, "batch", BLOCK);
    let mark = b.log_mark();
    let mut r = b.relay.client();
    let ids = sub_all(&mut r, batch, true);
    assert_eq!(ids.len(), BATCH, "every SUB delivered its message");
    let executes = b.relay_lines(mark, "execute");
    measured.push(("statements_per_sub_batch", executes.len() as f64));
    // Statements per block of ACKs: the same queues' messages acknowledged, BLOCK per block.
    let mark = b.log_mark();
    ack_each(&mut r, &batch[..BLOCK], &ids, BLOCK);
    let executes = b.relay_lines(mark, "execute");
    measured.push(("statements_per_ack_block", executes.len() as f64));
    ack_each(&mut r, &batch[BLOCK..], &ids, BLOCK);
    drop(r);

    // Round trips per SEND: SENDs one per block to queues that already hold a message (expiry on
    // SEND has something to look at), one statement each; then a block of them, one statement.
    let targets = &qs[2 * BATCH..2 * BATCH + 200];
    send_each(&mut sender, targets, "first", BLOCK);
    let mark = b.log_mark();
    send_each(&mut sender, targets, "second", 1);
    let executes = b.relay_lines(mark, "execute");
    measured.push((
        "round_trips_per_send",
        executes.len() as f64 / targets.len() as f64,
    ));
    let mark = b.log_mark();
    send_each(&mut sender, &targets[..BLOCK], "third", BLOCK);
    let executes = b.relay_lines(mark, "execute");
    measured.push(("statements_per_send_block", executes.len() as f64));

    // WAL per SUB: every queue subscribed once more, nothing to deliver in most of them.
    let fresh = &qs[2 * BATCH + 200..];
    let start_lsn = b.checkpoint_and_lsn();
    let mut r = b.relay.client();
    sub_all(&mut r, fresh, false);
    let (wal, _) = b.wal_since(&start_lsn);
    measured.push(("wal_bytes_per_sub", wal as f64 / fresh.len() as f64));
    drop(r);

    // WAL per SEND and per ACK: MSGS empty queues, one message each, then received and ACKed;
    // one operation per block, then BLOCK per block. The queues of a block are spread over the
    // table, as a block's queues are in use (its client's contacts' queues, made at different
    // times): the queues of a block made one after another share their table pages, which fill
    // with the new row versions of one transaction.
    let (single, spread) = fresh.split_at(MSGS);
    let spread: Vec<Queue> = spread
        .iter()
        .step_by(spread.len() / MSGS)
        .take(MSGS)
        .cloned()
        .collect();
    for (qs, per_block, send_key, ack_key) in [
        (single, 1, "wal_bytes_per_send", "wal_bytes_per_ack"),
        (
            &spread[..],
            BLOCK,
            "wal_bytes_per_send_in_blocks",
            "wal_bytes_per_ack_in_blocks",
        ),
    ] {
        let start_lsn = b.checkpoint_and_lsn();
        send_each(&mut sender, qs, "wal", per_block);
        let (send_wal, send_commits) = b.wal_since(&start_lsn);
        measured.push((send_key, send_wal as f64 / qs.len() as f64));
        let mut r = b.relay.client();
        let ids = sub_all(&mut r, qs, true);
        let start_lsn = b.checkpoint_and_lsn();
        ack_each(&mut r, qs, &ids, per_block);
        let (ack_wal, ack_commits) = b.wal_since(&start_lsn);
        measured.push((ack_key, ack_wal as f64 / qs.len() as f64));
        eprintln!(
            "{per_block} per block: commit records apart, {:.1} B per SEND, {:.1} B per ACK",
            send_commits as f64 / qs.len() as f64,
            ack_commits as f64 / qs.len() as f64
        );
    }

    let parses = b.relay_lines(parse_mark, "parse");
    measured.push(("parse_after_warmup", parses.len() as f64));

    // Cold: a new start holds no queue record, so a SUB batch of queues that hold a message reads
    // their records (one statement) before their heads (another).
    let cold = &qs[..BATCH];
    send_each(&mut sender, cold, "cold", BLOCK);
    drop(sender);
    assert!(b.relay.stop().success(), "a clean stop");
    b.relay.restart();
    let mark = b.log_mark();
    let mut r = b.relay.client();
    let ids = sub_all(&mut r, cold, true);
    assert_eq!(ids.len(), BATCH, "every SUB delivered its message");
    // Not the count of the shard's queues that a start sends while it serves, nor the set-up of a
    // pooled connection the pool opens meanwhile (`pg_backend_pid()`).
    let operation = |executes: Vec<String>| -> Vec<String> {
        let not_ours = ["count(*)", "pg_backend_pid()"];
        executes
            .into_iter()
            .filter(|l| !not_ours.iter().any(|s| l.contains(s)))
            .collect()
    };
    let executes = operation(b.relay_lines(mark, "execute"));
    measured.push(("statements_per_sub_batch_cold", executes.len() as f64));

    // Cold IDs: a block of SENDs to queues whose sender IDs and records the new start does not
    // hold costs one look-up of the IDs (the directory caches them, `server/directory.rs`), one
    // read of the records and the block's write.
    let cold_sends = &qs[BATCH..BATCH + BLOCK];
    let mut s = b.relay.client();
    let mark = b.log_mark();
    send_each(&mut s, cold_sends, "cold", BLOCK);
    let executes = operation(b.relay_lines(mark, "execute"));
    measured.push(("statements_per_send_block_cold", executes.len() as f64));
    // Warm again: the same block once more is the write alone (the start's count may end in this
    // window on a busy machine: it is not the block's).
    let mark = b.log_mark();
    send_each(&mut s, cold_sends, "warm", BLOCK);
    let executes = operation(b.relay_lines(mark, "execute"));
    measured.push(("statements_per_send_block", executes.len() as f64));
    let last_window = executes;

    eprintln!("measured:");
    let mut over = Vec::new();
    for (name, value) in &measured {
        let ceiling = *ceilings
            .get(*name)
            .unwrap_or_else(|| panic!("benches/perf-budgets.json has no {name}"));
        eprintln!("  {name}: {value:.2} (ceiling {ceiling})");
        if *value > ceiling {
            over.push(format!("{name} = {value:.2} > {ceiling}"));
        }
    }
    assert!(
        over.is_empty(),
        "over budget: {over:?}\nparses: {parses:?}\nlast window's statements: {last_window:#?}"
    );
}
