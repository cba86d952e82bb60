//! The batched head read of a SUB block on the PostgreSQL store, two ways: `DISTINCT ON` over the
//! queues' messages (what `store/postgres.rs` uses) and a `LATERAL … LIMIT 1` per queue. 135
//! queues (a full block of SUBs) holding 128 messages each, 1 KB bodies, on a throwaway cluster
//! (`store::postgres::cluster`); each query prepared once and run `RUNS` times; prints p50 and
//! p99 of each. `cargo bench --bench pg_peek_many`.

use std::time::Instant;

use smp_relay::store::postgres::cluster::{Cluster, ClusterOptions};
use smp_relay::store::postgres::schema;

const QUEUES: usize = 135;
const MSGS: usize = 128;
const RUNS: usize = 2_000;

const DISTINCT_ON: &str = "SELECT DISTINCT ON (recipient_id) recipient_id, msg_id, msg_ts, \
     msg_quota, msg_ntf_flag, msg_body FROM messages WHERE recipient_id = ANY($1::bytea[]) \
     ORDER BY recipient_id, message_id";
const LATERAL: &str = "SELECT q.rid, m.msg_id, m.msg_ts, m.msg_quota, m.msg_ntf_flag, m.msg_body \
     FROM unnest($1::bytea[]) AS q(rid) CROSS JOIN LATERAL (SELECT msg_id, msg_ts, msg_quota, \
     msg_ntf_flag, msg_body FROM messages WHERE recipient_id = q.rid ORDER BY message_id \
     LIMIT 1) m";

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let cluster = Cluster::start(&ClusterOptions::default()).expect("cluster");
    let db = cluster.create_database().expect("database");
    let mut c = cluster.client(&db).expect("connect");
    schema::lock_and_migrate(&mut c, "smp_server").expect("migrate");
    c.batch_execute(&format!(
        "SET search_path TO smp_server;
         INSERT INTO msg_queues (recipient_id, recipient_keys, rcv_dh_secret, sender_id, status)
           SELECT public.gen_random_bytes(24), '\\x00', '\\x00', public.gen_random_bytes(24), 'active'
           FROM generate_series(1, 50000);
         INSERT INTO messages (recipient_id, msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body)
           SELECT q.recipient_id, public.gen_random_bytes(24), j, FALSE, FALSE,
                  public.gen_random_bytes(1024)
           FROM (SELECT recipient_id FROM msg_queues ORDER BY recipient_id LIMIT {QUEUES}) q,
                generate_series(1, {MSGS}) j;
         ANALYZE msg_queues; ANALYZE messages;"
    ))
    .expect("fill");
    let ids: Vec<Vec<u8>> = c
        .query(
            &format!("SELECT recipient_id FROM msg_queues ORDER BY recipient_id LIMIT {QUEUES}"),
            &[],
        )
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (name, sql) in [("DISTINCT ON", DISTINCT_ON), ("LATERAL", LATERAL)] {
        let st = c.prepare(sql).expect("prepare");
        let mut us = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let t = Instant::now();
            let rows = c.query(&st, &[&ids]).expect("query");
            us.push(t.elapsed().as_secs_f64() * 1e6);
            assert_eq!(rows.len(), QUEUES, "{name}: a head per queue");
        }
        // The first runs warm the caches and settle the plan.
        let mut settled = us[RUNS / 10..].to_vec();
        let p50 = percentile(&mut settled, 0.5);
        let p99 = percentile(&mut settled, 0.99);
        println!("{name:12} {QUEUES} queues x {MSGS} messages: p50 {p50:.0} us, p99 {p99:.0} us");
    }
}
