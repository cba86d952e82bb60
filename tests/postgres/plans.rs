//! Generic plans of the PostgreSQL store's statements (`smp_relay::store::postgres::HOT_STATEMENTS`,
//! and the statements inside the reference's message functions): with 50,000 queues and 100,000
//! messages in the tables, and `plan_cache_mode = force_generic_plan` (what a prepared statement
//! settles on after its first executions), no plan reads `msg_queues` or `messages` sequentially.

use crate::common;

use smp_relay::store::postgres::{schema, HOT_STATEMENTS};

/// The queries inside `write_message`, `try_del_msg`, `try_del_peek_msg` and
/// `delete_expired_msgs` (simplexmq `server_schema.sql`), with the functions' parameters as
/// statement parameters.
const FUNCTION_QUERIES: &[&str] = &[
    "SELECT msg_can_write, msg_queue_size FROM msg_queues \
     WHERE recipient_id = $1::bytea AND deleted_at IS NULL FOR UPDATE",
    "SELECT message_id, msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body FROM messages \
     WHERE recipient_id = $1::bytea ORDER BY message_id ASC LIMIT 1",
    "UPDATE msg_queues SET msg_queue_size = msg_queue_size + 1 WHERE recipient_id = $1::bytea",
    "DELETE FROM messages WHERE message_id = $1::int8",
    "SELECT MIN(message_id) FROM messages \
     WHERE recipient_id = $1::bytea AND msg_ts >= $2::int8 AND msg_quota = FALSE",
    "DELETE FROM messages WHERE recipient_id = $1::bytea AND message_id < $2::int8 \
     AND msg_quota = FALSE",
];

/// Sequential scans of the store's tables anywhere in a plan (its JSON form).
fn seq_scans(plan: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(o) = plan.as_object() {
        if o.get("Node Type").and_then(|v| v.as_str()) == Some("Seq Scan") {
            let rel = o
                .get("Relation Name")
                .and_then(|v| v.as_str())
                .unwrap_or("?");
            if rel == "msg_queues" || rel == "messages" {
                out.push(rel.to_string());
            }
        }
        for v in o.values() {
            seq_scans(v, out);
        }
    } else if let Some(a) = plan.as_array() {
        for v in a {
            seq_scans(v, out);
        }
    }
}

#[test]
fn no_statement_scans_a_large_table_under_a_generic_plan() {
    let cluster = common::pg_cluster();
    let db = cluster.create_database().expect("database");
    let mut c = cluster.client(&db).expect("connect");
    schema::lock_and_migrate(&mut c, "smp_server").expect("migrate");
    c.batch_execute(
        "SET search_path TO smp_server;
         INSERT INTO msg_queues (recipient_id, recipient_keys, rcv_dh_secret, sender_id, status,
                                 updated_at, notifier_id, link_id)
           SELECT public.gen_random_bytes(24), '\\x00', '\\x00', public.gen_random_bytes(24),
                  'active', 0,
                  CASE WHEN i % 3 = 0 THEN public.gen_random_bytes(24) END,
                  CASE WHEN i % 5 = 0 THEN public.gen_random_bytes(24) END
           FROM generate_series(1, 50000) i;
         INSERT INTO messages (recipient_id, msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body)
           SELECT q.recipient_id, public.gen_random_bytes(24), 1000 + j, FALSE, FALSE, '\\x00'
           FROM (SELECT recipient_id FROM msg_queues LIMIT 25000) q, generate_series(1, 4) j;
         ANALYZE msg_queues; ANALYZE messages;
         SET plan_cache_mode = force_generic_plan;",
    )
    .expect("fill the tables");
    let mut checked = 0;
    let mut bad = Vec::new();
    for (i, sql) in HOT_STATEMENTS.iter().chain(FUNCTION_QUERIES).enumerate() {
        // The parameter count comes from the server's description of the statement; a NULL of
        // any type fits each, and a generic plan does not look at the values.
        let n = c.prepare(sql).expect("prepare").params().len();
        let name = format!("p{i}");
        c.batch_execute(&format!("PREPARE {name} AS {sql}"))
            .unwrap_or_else(|e| panic!("PREPARE {sql}: {e}"));
        let args = vec!["NULL"; n].join(", ");
        let exec = if n == 0 {
            format!("EXECUTE {name}")
        } else {
            format!("EXECUTE {name}({args})")
        };
        // EXPLAIN without ANALYZE does not run the statement.
        let text = c
            .simple_query(&format!("EXPLAIN (FORMAT JSON) {exec}"))
            .unwrap_or_else(|e| panic!("EXPLAIN {sql}: {e}"))
            .into_iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                _ => None,
            })
            .expect("a plan");
        let plan: serde_json::Value = serde_json::from_str(&text).expect("JSON plan");
        let mut scans = Vec::new();
        seq_scans(&plan, &mut scans);
        if !scans.is_empty() {
            bad.push(format!("{sql}\n  scans {scans:?}\n  plan: {plan}"));
        }
        checked += 1;
    }
    assert_eq!(checked, HOT_STATEMENTS.len() + FUNCTION_QUERIES.len());
    assert!(
        bad.is_empty(),
        "sequential scans under generic plans:\n{}",
        bad.join("\n")
    );
}
