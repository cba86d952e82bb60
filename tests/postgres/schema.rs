//! The PostgreSQL store's schema against the reference server's (simplexmq
//! `Server/QueueStore/Postgres/server_schema.sql`, master):
//!
//! - the catalog of a freshly migrated schema equals the inventory transcribed from the
//!   reference's final schema (`tests/fixtures/postgres_schema_inventory.txt`), and the
//!   `migrations` table names the reference's six migrations;
//! - the stored functions, called directly as the reference's `MsgStoreTests` call them for its
//!   postgres store (quota 3): `write_message`, `try_del_msg`, `try_del_peek_msg`,
//!   `delete_expired_msgs`, the procedure `expire_old_messages`, and the triggers keeping each
//!   service's queue count and XOR of MD5 digests (checked against digests computed here);
//! - databases as the reference server leaves them: queue rows written by SQL in the reference's
//!   encodings serve clients; rows the relay writes are in those encodings; a schema at an older
//!   migration is carried to the last one at start; an unknown migration or a missing `pgcrypto`
//!   stops the start with a clear message.

use crate::{common, support};

use std::collections::BTreeSet;

use md5::{Digest, Md5};
use postgres::{Client, NoTls};
use smp_relay::client::queue::{auth_key, KeyAlg, RecipientKeys};
use smp_relay::client::Signer;
use smp_relay::protocol::response::{BrokerMsg, QueueIds};
use smp_relay::store::postgres::schema::{self, MIGRATIONS};
use support::*;

const SCHEMA: &str = "smp_server";
/// The quota of the reference's postgres message store tests.
const QUOTA: i32 = 3;
/// No rows.
const NONE: [Msg; 0] = [];
const INVENTORY: &str = include_str!("../fixtures/postgres_schema_inventory.txt");
const REFERENCE_MIGRATIONS: [&str; 6] = [
    "20250207_initial",
    "20250319_updated_index",
    "20250320_short_links",
    "20250514_service_certs",
    "20250903_store_messages",
    "20250915_queue_ids_hash",
];

fn connect(conninfo: &str) -> Client {
    Client::connect(conninfo, NoTls).unwrap_or_else(|e| panic!("connect to {conninfo}: {e}"))
}

/// A new database of the test cluster, migrated; the client has `smp_server` on its search path,
/// as the relay's connections do. The schema's advisory lock is let go at once: a relay (or a
/// second migration) started later needs it, and the session of a dropped client may end a
/// moment after the drop.
fn migrated() -> (String, Client) {
    let conninfo = common::pg_database();
    let mut c = connect(&conninfo);
    schema::lock_and_migrate(&mut c, SCHEMA).expect("migrate a fresh database");
    c.batch_execute("SELECT pg_advisory_unlock_all()")
        .expect("release the advisory lock");
    let held: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
            &[],
        )
        .expect("advisory locks")
        .get(0);
    assert_eq!(held, 0, "the advisory lock is let go");
    c.batch_execute("SET search_path TO smp_server")
        .expect("search path");
    (conninfo, c)
}

// ---------------------------------------------------------------------------------------------
// 1. The catalog against the reference's final schema.

/// The schema's objects, one line each, in the fixture's form.
fn catalog(c: &mut Client, schema: &str) -> BTreeSet<String> {
    // Definitions name the schema when it is not on the search path.
    c.batch_execute("SET search_path = ''")
        .expect("search path");
    let mut out = BTreeSet::new();
    for r in c
        .query(
            "SELECT c.relname::text, c.relkind::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind NOT IN ('i', 'I')",
            &[&schema],
        )
        .expect("relations")
    {
        let kind = match r.get::<_, String>(1).as_str() {
            "r" => "table",
            "S" => "sequence",
            "v" => "view",
            "m" => "materialized view",
            "c" => "composite type",
            "p" => "partitioned table",
            "f" => "foreign table",
            other => panic!("relation kind {other}"),
        };
        out.insert(format!("relation | {} | {kind}", r.get::<_, String>(0)));
    }
    for r in c
        .query(
            "SELECT table_name::text, \
               row_number() OVER (PARTITION BY table_name ORDER BY ordinal_position), \
               column_name::text, data_type::text, is_nullable::text, column_default::text, \
               is_identity::text, identity_generation::text \
             FROM information_schema.columns WHERE table_schema = $1",
            &[&schema],
        )
        .expect("columns")
    {
        let nullable = if r.get::<_, String>(4) == "YES" {
            "NULL"
        } else {
            "NOT NULL"
        };
        let default = match (
            r.get::<_, Option<String>>(5),
            r.get::<_, String>(6).as_str(),
        ) {
            (None, "YES") => format!(
                "IDENTITY {}",
                r.get::<_, Option<String>>(7).unwrap_or_default()
            ),
            (Some(d), _) => format!("DEFAULT {d}"),
            (None, _) => "-".into(),
        };
        out.insert(format!(
            "column | {} | {} | {} | {} | {nullable} | {default}",
            r.get::<_, String>(0),
            r.get::<_, i64>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3),
        ));
    }
    for r in c
        .query(
            "SELECT COALESCE(t.relname::text, '-'), con.conname::text, con.contype::text, \
               pg_catalog.pg_get_constraintdef(con.oid) \
             FROM pg_catalog.pg_constraint con \
             JOIN pg_catalog.pg_namespace n ON n.oid = con.connamespace \
             LEFT JOIN pg_catalog.pg_class t ON t.oid = con.conrelid \
             WHERE n.nspname = $1",
            &[&schema],
        )
        .expect("constraints")
    {
        out.insert(format!(
            "constraint | {} | {} | {} | {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3)
        ));
    }
    for r in c
        .query(
            "SELECT tablename::text, indexname::text, indexdef FROM pg_catalog.pg_indexes \
             WHERE schemaname = $1",
            &[&schema],
        )
        .expect("indexes")
    {
        out.insert(format!(
            "index | {} | {} | {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2)
        ));
    }
    for r in c
        .query(
            "SELECT c.relname::text, t.tgname::text, pg_catalog.pg_get_triggerdef(t.oid) \
             FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND NOT t.tgisinternal",
            &[&schema],
        )
        .expect("triggers")
    {
        out.insert(format!(
            "trigger | {} | {} | {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2)
        ));
    }
    for r in c
        .query(
            "SELECT p.proname::text, p.prokind::text, \
               pg_catalog.pg_get_function_identity_arguments(p.oid), \
               pg_catalog.pg_get_function_result(p.oid), l.lanname::text, p.provolatile::text, \
               p.proisstrict \
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             JOIN pg_catalog.pg_language l ON l.oid = p.prolang \
             WHERE n.nspname = $1",
            &[&schema],
        )
        .expect("routines")
    {
        let kind = match r.get::<_, String>(1).as_str() {
            "f" => "function",
            "p" => "procedure",
            "a" => "aggregate",
            "w" => "window function",
            other => panic!("routine kind {other}"),
        };
        let volatility = match r.get::<_, String>(5).as_str() {
            "i" => "immutable",
            "s" => "stable",
            _ => "volatile",
        };
        out.insert(format!(
            "routine | {} | {kind} | {} | {} | {} | {volatility} | {}",
            r.get::<_, String>(0),
            r.get::<_, String>(2),
            r.get::<_, Option<String>>(3).unwrap_or_else(|| "-".into()),
            r.get::<_, String>(4),
            if r.get::<_, bool>(6) { "STRICT" } else { "-" }
        ));
    }
    for r in c
        .query(
            "SELECT p.proname::text, a.aggtransfn::regproc::text, \
               pg_catalog.format_type(a.aggtranstype, NULL), COALESCE(a.agginitval, '-') \
             FROM pg_catalog.pg_aggregate a JOIN pg_catalog.pg_proc p ON p.oid = a.aggfnoid \
             JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1",
            &[&schema],
        )
        .expect("aggregates")
    {
        out.insert(format!(
            "aggregate | {} | {} | {} | {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, String>(2),
            r.get::<_, String>(3)
        ));
    }
    for r in c
        .query(
            "SELECT sequencename::text, data_type::text, start_value, increment_by, min_value, \
               max_value, cache_size, cycle FROM pg_catalog.pg_sequences WHERE schemaname = $1",
            &[&schema],
        )
        .expect("sequences")
    {
        out.insert(format!(
            "sequence | {} | {} | {} | {} | {} | {} | {} | {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
            r.get::<_, i64>(4),
            r.get::<_, i64>(5),
            r.get::<_, i64>(6),
            if r.get::<_, bool>(7) {
                "CYCLE"
            } else {
                "NO CYCLE"
            }
        ));
    }
    let seq: Option<String> = c
        .query_one(
            "SELECT pg_catalog.pg_get_serial_sequence($1, 'message_id')",
            &[&format!("{}.messages", schema::ident(schema))],
        )
        .expect("the identity's sequence")
        .get(0);
    out.insert(format!(
        "identity | messages.message_id | {}",
        seq.unwrap_or_else(|| "-".into())
    ));
    c.batch_execute(&format!("SET search_path TO {}", schema::ident(schema)))
        .expect("search path");
    out
}

/// The fixture's lines: the reference's objects, and ours beyond them (`ours: ` lines).
fn inventory() -> (BTreeSet<String>, BTreeSet<String>) {
    let mut reference = BTreeSet::new();
    let mut ours = BTreeSet::new();
    for line in INVENTORY.lines().map(str::trim_end) {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_prefix("ours: ") {
            Some(l) => assert!(ours.insert(l.to_string()), "duplicate fixture line {l}"),
            None => assert!(
                reference.insert(line.to_string()),
                "duplicate fixture line {line}"
            ),
        }
    }
    (reference, ours)
}

#[test]
fn migrated_schema_is_the_reference_s_final_schema() {
    let (conninfo, mut c) = migrated();
    let actual = catalog(&mut c, SCHEMA);
    let (reference, ours) = inventory();
    assert!(
        reference.is_disjoint(&ours),
        "a fixture line is both the reference's and ours"
    );
    assert!(
        reference.len() > 60,
        "the fixture lists the reference's objects"
    );
    let expected: BTreeSet<String> = reference.union(&ours).cloned().collect();
    if actual != expected {
        let mut report = String::from(
            "the migrated schema differs from tests/fixtures/postgres_schema_inventory.txt\n",
        );
        for l in expected.difference(&actual) {
            report.push_str(&format!("- {l}\n"));
        }
        for l in actual.difference(&expected) {
            report.push_str(&format!("+ {l}\n"));
        }
        report.push_str("(- in the fixture only, + in the database only)");
        panic!("{report}");
    }

    // The migrations table: the reference's six, in order, each with its down migration but the
    // first (as the reference records them), at non-decreasing times.
    let rows = c
        .query(
            "SELECT name, down IS NOT NULL, ts FROM migrations ORDER BY name",
            &[],
        )
        .expect("migrations");
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(names, REFERENCE_MIGRATIONS);
    let downs: Vec<bool> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(downs, [false, true, true, true, true, true]);
    let ts: Vec<std::time::SystemTime> = rows.iter().map(|r| r.get(2)).collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "applied in order: {ts:?}"
    );
    assert_eq!(
        MIGRATIONS.iter().map(|m| m.name).collect::<Vec<_>>(),
        REFERENCE_MIGRATIONS
    );

    // A second migration run on the same schema (after the lock's session ends) changes nothing.
    drop(c);
    let mut again = connect(&conninfo);
    schema::lock_and_migrate(&mut again, SCHEMA).expect("migrate again");
    assert_eq!(catalog(&mut again, SCHEMA), expected);
    let n: i64 = again
        .query_one("SELECT count(*) FROM smp_server.migrations", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 6);
}

// ---------------------------------------------------------------------------------------------
// 2. The stored functions.

#[derive(Debug, Clone, PartialEq, Eq)]
struct Msg {
    id: Vec<u8>,
    ts: i64,
    quota: bool,
    ntf: bool,
    body: Vec<u8>,
}

fn msg(id: &[u8], ts: i64, ntf: bool, body: &[u8]) -> Msg {
    Msg {
        id: id.to_vec(),
        ts,
        quota: false,
        ntf,
        body: body.to_vec(),
    }
}

fn marker(id: &[u8], ts: i64) -> Msg {
    Msg {
        id: id.to_vec(),
        ts,
        quota: true,
        ntf: false,
        body: vec![],
    }
}

fn msgs_of(rows: &[postgres::Row]) -> Vec<Msg> {
    rows.iter()
        .map(|r| Msg {
            id: r.get(0),
            ts: r.get(1),
            quota: r.get(2),
            ntf: r.get(3),
            body: r.get(4),
        })
        .collect()
}

/// A queue row with placeholder keys (the functions never read them).
fn add_queue(c: &mut Client, rid: &[u8], updated_at: i64) {
    let sid = [b"s".as_slice(), rid].concat();
    c.execute(
        "INSERT INTO msg_queues (recipient_id, recipient_keys, rcv_dh_secret, sender_id, status, \
           queue_mode, updated_at) VALUES ($1, '\\x01'::bytea, $2, $3, 'active', 'M', $4)",
        &[&rid, &vec![0u8; 32], &sid, &updated_at],
    )
    .expect("insert a queue");
}

fn write_as(
    c: &mut Client,
    rid: &[u8],
    id: &[u8],
    ts: i64,
    quota: bool,
    ntf: bool,
    body: &[u8],
) -> Option<(bool, bool)> {
    let rows = c
        .query(
            "SELECT quota_written, was_empty FROM write_message($1, $2, $3, $4, $5, $6, $7)",
            &[&rid, &id, &ts, &quota, &ntf, &body, &QUOTA],
        )
        .expect("write_message");
    assert!(rows.len() <= 1, "write_message returns at most one row");
    rows.first().map(|r| (r.get(0), r.get(1)))
}

fn write(c: &mut Client, rid: &[u8], id: &[u8], ts: i64, body: &[u8]) -> Option<(bool, bool)> {
    write_as(c, rid, id, ts, false, true, body)
}

/// `(msg_queue_size, msg_can_write, msg_queue_expire)`.
fn counters(c: &mut Client, rid: &[u8]) -> (i64, bool, bool) {
    let r = c
        .query_one(
            "SELECT msg_queue_size, msg_can_write, msg_queue_expire FROM msg_queues \
             WHERE recipient_id = $1",
            &[&rid],
        )
        .expect("queue counters");
    (r.get(0), r.get(1), r.get(2))
}

fn set_counters(c: &mut Client, rid: &[u8], size: i64, can_write: bool, expire: bool) {
    c.execute(
        "UPDATE msg_queues SET msg_queue_size = $2, msg_can_write = $3, msg_queue_expire = $4 \
         WHERE recipient_id = $1",
        &[&rid, &size, &can_write, &expire],
    )
    .expect("set counters");
}

fn stored(c: &mut Client, rid: &[u8]) -> Vec<Msg> {
    let rows = c
        .query(
            "SELECT msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body FROM messages \
             WHERE recipient_id = $1 ORDER BY message_id",
            &[&rid],
        )
        .expect("messages");
    msgs_of(&rows)
}

fn try_del(c: &mut Client, rid: &[u8], id: &[u8]) -> Vec<Msg> {
    let rows = c
        .query(
            "SELECT r_msg_id, r_msg_ts, r_msg_quota, r_msg_ntf_flag, r_msg_body \
             FROM try_del_msg($1, $2)",
            &[&rid, &id],
        )
        .expect("try_del_msg");
    msgs_of(&rows)
}

fn try_del_peek(c: &mut Client, rid: &[u8], id: &[u8]) -> Vec<Msg> {
    let rows = c
        .query(
            "SELECT r_msg_id, r_msg_ts, r_msg_quota, r_msg_ntf_flag, r_msg_body \
             FROM try_del_peek_msg($1, $2)",
            &[&rid, &id],
        )
        .expect("try_del_peek_msg");
    msgs_of(&rows)
}

fn delete_expired(c: &mut Client, rid: &[u8], old_ts: i64) -> i64 {
    c.query_one("SELECT delete_expired_msgs($1, $2)", &[&rid, &old_ts])
        .expect("delete_expired_msgs")
        .get(0)
}

#[test]
fn write_message_stores_up_to_the_quota_then_one_marker() {
    let (_db, mut c) = migrated();
    let q = b"queue-write".as_slice();
    add_queue(&mut c, q, 1000);
    assert_eq!(counters(&mut c, q), (0, true, false), "a new queue");

    assert_eq!(
        write(&mut c, q, b"m1", 10, b"message 1"),
        Some((false, true))
    );
    assert_eq!(counters(&mut c, q), (1, true, true));
    assert_eq!(
        write(&mut c, q, b"m2", 11, b"message 2"),
        Some((false, false))
    );
    assert_eq!(counters(&mut c, q), (2, true, true));
    assert_eq!(
        write_as(&mut c, q, b"m3", 12, false, false, b"message 3"),
        Some((false, false))
    );
    assert_eq!(counters(&mut c, q), (3, true, true));
    // The fourth becomes the quota marker: no body, no notification, the queue closed to writes.
    assert_eq!(
        write(&mut c, q, b"m4", 13, b"message 4"),
        Some((true, false))
    );
    assert_eq!(counters(&mut c, q), (4, false, true));
    // While full, nothing is stored.
    assert_eq!(write(&mut c, q, b"m5", 14, b"message 5"), None);
    assert_eq!(counters(&mut c, q), (4, false, true));
    assert_eq!(
        stored(&mut c, q),
        [
            msg(b"m1", 10, true, b"message 1"),
            msg(b"m2", 11, true, b"message 2"),
            msg(b"m3", 12, false, b"message 3"),
            marker(b"m4", 13),
        ]
    );

    // A marker asked for by the caller, on an empty queue.
    let q2 = b"queue-write-marker".as_slice();
    add_queue(&mut c, q2, 1000);
    assert_eq!(
        write_as(&mut c, q2, b"x1", 20, true, true, b"dropped"),
        Some((true, true))
    );
    assert_eq!(stored(&mut c, q2), [marker(b"x1", 20)]);
    assert_eq!(counters(&mut c, q2), (1, false, true));
    assert_eq!(write(&mut c, q2, b"x2", 21, b"after the marker"), None);

    // An empty queue takes a message even if its flag says it is closed.
    let q3 = b"queue-write-closed-empty".as_slice();
    add_queue(&mut c, q3, 1000);
    set_counters(&mut c, q3, 0, false, false);
    assert_eq!(write(&mut c, q3, b"y1", 30, b"opens"), Some((false, true)));
    assert_eq!(counters(&mut c, q3), (1, true, true));

    // No queue, or a deleted one: no row, nothing stored.
    assert_eq!(write(&mut c, b"no-such-queue", b"z1", 40, b"lost"), None);
    let q4 = b"queue-write-deleted".as_slice();
    add_queue(&mut c, q4, 1000);
    c.execute(
        "UPDATE msg_queues SET deleted_at = 1 WHERE recipient_id = $1",
        &[&q4],
    )
    .unwrap();
    assert_eq!(write(&mut c, q4, b"z2", 41, b"lost"), None);
    assert_eq!(stored(&mut c, q4), NONE);
    assert_eq!(counters(&mut c, q4), (0, true, false));
}

#[test]
fn try_del_msg_result_shapes_and_counters() {
    let (_db, mut c) = migrated();
    assert_eq!(try_del(&mut c, b"no-such-queue", b"m1"), NONE, "no queue");

    let q = b"queue-del".as_slice();
    add_queue(&mut c, q, 1000);
    assert_eq!(try_del(&mut c, q, b"m1"), NONE, "empty queue");
    assert_eq!(counters(&mut c, q), (0, true, false));
    // Counters of an empty queue that say otherwise are reset.
    set_counters(&mut c, q, 5, false, true);
    assert_eq!(try_del(&mut c, q, b"m1"), NONE);
    assert_eq!(counters(&mut c, q), (0, true, false), "counters repaired");

    write(&mut c, q, b"m1", 10, b"message 1").unwrap();
    write(&mut c, q, b"m2", 11, b"message 2").unwrap();
    // Not the head: nothing deleted.
    assert_eq!(try_del(&mut c, q, b"m2"), NONE);
    assert_eq!(stored(&mut c, q).len(), 2);
    assert_eq!(counters(&mut c, q), (2, true, true));
    // The head, with a message after it.
    assert_eq!(
        try_del(&mut c, q, b"m1"),
        [msg(b"m1", 10, true, b"message 1")]
    );
    assert_eq!(counters(&mut c, q), (1, true, true));
    assert_eq!(stored(&mut c, q), [msg(b"m2", 11, true, b"message 2")]);
    // The last one.
    assert_eq!(
        try_del(&mut c, q, b"m2"),
        [msg(b"m2", 11, true, b"message 2")]
    );
    assert_eq!(counters(&mut c, q), (0, true, false));

    // A full queue opens again only when its marker is deleted.
    for (i, id) in [b"a1", b"a2", b"a3"].into_iter().enumerate() {
        write(&mut c, q, id, 20 + i as i64, b"body").unwrap();
    }
    assert_eq!(write(&mut c, q, b"a4", 23, b"body"), Some((true, false)));
    assert_eq!(try_del(&mut c, q, b"a1").len(), 1);
    assert_eq!(counters(&mut c, q), (3, false, true));
    assert_eq!(try_del(&mut c, q, b"a2").len(), 1);
    assert_eq!(try_del(&mut c, q, b"a3").len(), 1);
    assert_eq!(counters(&mut c, q), (1, false, true));
    assert_eq!(write(&mut c, q, b"a5", 24, b"body"), None, "still full");
    assert_eq!(try_del(&mut c, q, b"a4"), [marker(b"a4", 23)]);
    assert_eq!(counters(&mut c, q), (0, true, false));
    assert_eq!(write(&mut c, q, b"a6", 25, b"body"), Some((false, true)));

    // A size too large is decremented by a delete, and reset once the queue is found empty.
    set_counters(&mut c, q, 10, true, true);
    assert_eq!(try_del(&mut c, q, b"a6").len(), 1);
    assert_eq!(counters(&mut c, q), (9, true, true));
    assert_eq!(try_del(&mut c, q, b"a6"), NONE);
    assert_eq!(counters(&mut c, q), (0, true, false), "counters repaired");

    // A deleted queue's messages are not deleted.
    write(&mut c, q, b"b1", 30, b"kept").unwrap();
    c.execute(
        "UPDATE msg_queues SET deleted_at = 1 WHERE recipient_id = $1",
        &[&q],
    )
    .unwrap();
    assert_eq!(try_del(&mut c, q, b"b1"), NONE);
    assert_eq!(stored(&mut c, q).len(), 1);
}

#[test]
fn try_del_peek_msg_result_shapes_and_counters() {
    let (_db, mut c) = migrated();
    assert_eq!(
        try_del_peek(&mut c, b"no-such-queue", b"m1"),
        NONE,
        "no queue"
    );

    let q = b"queue-peek".as_slice();
    add_queue(&mut c, q, 1000);
    assert_eq!(try_del_peek(&mut c, q, b"m1"), NONE, "empty queue");
    set_counters(&mut c, q, 3, false, true);
    assert_eq!(try_del_peek(&mut c, q, b"m1"), NONE);
    assert_eq!(counters(&mut c, q), (0, true, false), "counters repaired");

    write(&mut c, q, b"m1", 10, b"message 1").unwrap();
    write(&mut c, q, b"m2", 11, b"message 2").unwrap();
    // Not the head: the head alone, nothing deleted.
    assert_eq!(
        try_del_peek(&mut c, q, b"m2"),
        [msg(b"m1", 10, true, b"message 1")]
    );
    assert_eq!(stored(&mut c, q).len(), 2);
    assert_eq!(counters(&mut c, q), (2, true, true));
    // Deleted, and the next one.
    assert_eq!(
        try_del_peek(&mut c, q, b"m1"),
        [
            msg(b"m1", 10, true, b"message 1"),
            msg(b"m2", 11, true, b"message 2")
        ]
    );
    assert_eq!(counters(&mut c, q), (1, true, true));
    // Deleted, nothing after it.
    assert_eq!(
        try_del_peek(&mut c, q, b"m2"),
        [msg(b"m2", 11, true, b"message 2")]
    );
    assert_eq!(counters(&mut c, q), (0, true, false));
    assert_eq!(stored(&mut c, q), NONE);

    // The reference's testUpdateMessageCounts and testResetMessageCounts: a full queue whose size
    // is then set too large and its write flag opened takes a second marker; the counters run down
    // from the wrong size and are reset when the last row goes.
    let q = b"queue-reset".as_slice();
    add_queue(&mut c, q, 1000);
    assert_eq!(
        write(&mut c, q, b"r1", 1, b"message 1"),
        Some((false, true))
    );
    assert_eq!(
        write(&mut c, q, b"r2", 2, b"message 2"),
        Some((false, false))
    );
    assert_eq!(
        write(&mut c, q, b"r3", 3, b"message 3"),
        Some((false, false))
    );
    assert_eq!(
        write(&mut c, q, b"r4", 4, b"message 4"),
        Some((true, false))
    );
    assert_eq!(counters(&mut c, q), (4, false, true));
    set_counters(&mut c, q, 10, true, true);
    assert_eq!(
        write(&mut c, q, b"r5", 5, b"message 5"),
        Some((true, false))
    );
    assert_eq!(counters(&mut c, q), (11, false, true));
    let m = |i: u8| {
        msg(
            &[b'r', b'0' + i],
            i as i64,
            true,
            format!("message {i}").as_bytes(),
        )
    };
    assert_eq!(try_del_peek(&mut c, q, b"r1"), [m(1), m(2)]);
    assert_eq!(counters(&mut c, q), (10, false, true));
    assert_eq!(try_del_peek(&mut c, q, b"r2"), [m(2), m(3)]);
    assert_eq!(counters(&mut c, q), (9, false, true));
    assert_eq!(try_del_peek(&mut c, q, b"r3"), [m(3), marker(b"r4", 4)]);
    assert_eq!(counters(&mut c, q), (8, false, true));
    assert_eq!(
        try_del_peek(&mut c, q, b"r4"),
        [marker(b"r4", 4), marker(b"r5", 5)]
    );
    assert_eq!(counters(&mut c, q), (7, false, true));
    assert_eq!(try_del_peek(&mut c, q, b"r5"), [marker(b"r5", 5)]);
    assert_eq!(counters(&mut c, q), (0, true, false), "reset");
}

#[test]
fn delete_expired_msgs_deletes_old_messages_from_the_front() {
    let (db, mut c) = migrated();
    let q = b"queue-expire".as_slice();
    add_queue(&mut c, q, 1000);
    assert_eq!(delete_expired(&mut c, q, 1_000_000), 0, "empty queue");
    write(&mut c, q, b"e1", 100, b"old").unwrap();
    write(&mut c, q, b"e2", 300, b"new").unwrap();
    write(&mut c, q, b"e3", 200, b"old, behind a new one").unwrap();
    // Only the old messages before the first one to keep.
    assert_eq!(delete_expired(&mut c, q, 250), 1);
    assert_eq!(
        stored(&mut c, q)
            .iter()
            .map(|m| m.id.clone())
            .collect::<Vec<_>>(),
        [b"e2".to_vec(), b"e3".to_vec()]
    );
    assert_eq!(counters(&mut c, q), (2, true, true));
    assert_eq!(delete_expired(&mut c, q, 250), 0, "the front is new");
    assert_eq!(delete_expired(&mut c, q, 1000), 2);
    assert_eq!(counters(&mut c, q), (0, true, false));

    // The quota marker stays, whatever its age; the queue stays closed until it is read.
    for (i, id) in [b"f1", b"f2", b"f3"].into_iter().enumerate() {
        write(&mut c, q, id, 10 * (i as i64 + 1), b"body").unwrap();
    }
    assert_eq!(write(&mut c, q, b"f4", 5, b"body"), Some((true, false)));
    assert_eq!(delete_expired(&mut c, q, 25), 2);
    assert_eq!(counters(&mut c, q), (2, false, true));
    assert_eq!(delete_expired(&mut c, q, 1000), 1);
    assert_eq!(stored(&mut c, q), [marker(b"f4", 5)]);
    assert_eq!(counters(&mut c, q), (1, false, false));
    assert_eq!(delete_expired(&mut c, q, 1000), 0);
    assert_eq!(stored(&mut c, q).len(), 1);

    // No queue; a deleted queue; a queue whose size says empty: nothing deleted.
    assert_eq!(delete_expired(&mut c, b"no-such-queue", 1000), 0);
    let q2 = b"queue-expire-2".as_slice();
    add_queue(&mut c, q2, 1000);
    write(&mut c, q2, b"g1", 1, b"old").unwrap();
    set_counters(&mut c, q2, 0, true, true);
    assert_eq!(delete_expired(&mut c, q2, 1000), 0, "size 0");
    set_counters(&mut c, q2, 1, true, true);
    c.execute(
        "UPDATE msg_queues SET deleted_at = 1 WHERE recipient_id = $1",
        &[&q2],
    )
    .unwrap();
    assert_eq!(delete_expired(&mut c, q2, 1000), 0, "deleted queue");
    assert_eq!(stored(&mut c, q2).len(), 1);

    // A queue another session holds is skipped, not waited for.
    let q3 = b"queue-expire-3".as_slice();
    add_queue(&mut c, q3, 1000);
    write(&mut c, q3, b"h1", 1, b"old").unwrap();
    let mut other = connect(&db);
    let mut tx = other.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM smp_server.msg_queues WHERE recipient_id = $1 FOR UPDATE",
        &[&q3],
    )
    .unwrap();
    assert_eq!(delete_expired(&mut c, q3, 1000), 0, "locked elsewhere");
    tx.commit().unwrap();
    assert_eq!(delete_expired(&mut c, q3, 1000), 1);
}

#[test]
fn expire_old_messages_totals() {
    let (_db, mut c) = migrated();
    // Expired: a and b; c was not updated recently enough; d is deleted; e is not flagged.
    let qs: [(&[u8], i64); 5] = [
        (b"qa", 1000),
        (b"qb", 1000),
        (b"qc", 10),
        (b"qd", 1000),
        (b"qe", 1000),
    ];
    for (q, updated) in qs {
        add_queue(&mut c, q, updated);
        write(&mut c, q, b"1", 100, b"old").unwrap();
    }
    write(&mut c, b"qa", b"2", 200, b"old").unwrap();
    write(&mut c, b"qa", b"3", 900, b"new").unwrap();
    write(&mut c, b"qb", b"2", 150, b"old").unwrap();
    c.execute(
        "UPDATE msg_queues SET deleted_at = 2000 WHERE recipient_id = 'qd'::bytea",
        &[],
    )
    .unwrap();
    c.execute(
        "UPDATE msg_queues SET msg_queue_expire = false WHERE recipient_id = 'qe'::bytea",
        &[],
    )
    .unwrap();
    // One queue a page, so that paging is crossed.
    let r = c
        .query_one(
            "CALL expire_old_messages(500, 500, 1, NULL, NULL, NULL)",
            &[],
        )
        .expect("expire_old_messages");
    let totals: (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!(totals, (4, 4, 4), "expired, messages left, live queues");
    assert_eq!(counters(&mut c, b"qa"), (1, true, true));
    assert_eq!(counters(&mut c, b"qb"), (0, true, false));
    for q in [b"qc", b"qd", b"qe"] {
        assert_eq!(stored(&mut c, q).len(), 1, "{:?} kept", lossy(q));
    }
    // Nothing left to expire.
    let r = c
        .query_one(
            "CALL expire_old_messages(500, 500, 100, NULL, NULL, NULL)",
            &[],
        )
        .unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1)), (0, 4));
}

// Services: count and XOR of MD5 digests.

fn md5(b: &[u8]) -> [u8; 16] {
    Md5::digest(b).as_slice().try_into().expect("16 bytes")
}

/// What a service's `(queue_count, queue_ids_hash)` must be for these IDs.
fn aggregate<T: AsRef<[u8]>>(ids: &[T]) -> (i64, Vec<u8>) {
    let mut h = [0u8; 16];
    for id in ids {
        for (a, b) in h.iter_mut().zip(md5(id.as_ref())) {
            *a ^= b;
        }
    }
    (ids.len() as i64, h.to_vec())
}

fn service(c: &mut Client, id: &[u8]) -> (i64, Vec<u8>) {
    let r = c
        .query_one(
            "SELECT queue_count, queue_ids_hash FROM services WHERE service_id = $1",
            &[&id],
        )
        .expect("service row");
    (r.get(0), r.get(1))
}

fn add_service(c: &mut Client, id: &[u8], role: &str) {
    c.execute(
        "INSERT INTO services (service_id, service_role, service_cert, service_cert_hash, \
           created_at) VALUES ($1, $2, $3, $4, 1)",
        &[&id, &role, &[b"cert-", id].concat(), &md5(id).to_vec()],
    )
    .expect("insert a service");
}

#[test]
fn service_triggers_keep_count_and_xor_of_md5() {
    let (_db, mut c) = migrated();
    let (m1, m2, n1) = (
        b"svc-m1".as_slice(),
        b"svc-m2".as_slice(),
        b"svc-n1".as_slice(),
    );
    add_service(&mut c, m1, "M");
    add_service(&mut c, m2, "M");
    add_service(&mut c, n1, "N");
    assert_eq!(service(&mut c, m1), aggregate::<&str>(&[]), "a new service");

    fn insert(
        c: &mut Client,
        rid: &[u8],
        rcv: Option<&[u8]>,
        nid: Option<&str>,
        ntf: Option<&[u8]>,
    ) {
        let sid = [b"s".as_slice(), rid].concat();
        let nid = nid.map(str::as_bytes);
        let nkey = nid.map(|_| b"key".to_vec());
        c.execute(
            "INSERT INTO msg_queues (recipient_id, recipient_keys, rcv_dh_secret, sender_id, \
               status, rcv_service_id, notifier_id, notifier_key, ntf_service_id) \
             VALUES ($1, '\\x01'::bytea, '\\x00'::bytea, $2, 'active', $3, $4, $5, $6)",
            &[&rid, &sid, &rcv, &nid, &nkey, &ntf],
        )
        .expect("insert a queue");
    }
    fn update(c: &mut Client, set: &str, rid: &[u8]) {
        c.execute(
            &format!("UPDATE msg_queues SET {set} WHERE recipient_id = $1"),
            &[&rid],
        )
        .expect("update a queue");
    }

    // Inserts.
    insert(&mut c, b"q1", Some(m1), None, None);
    assert_eq!(service(&mut c, m1), aggregate(&["q1"]));
    insert(&mut c, b"q2", Some(m1), Some("n2"), Some(n1));
    assert_eq!(service(&mut c, m1), aggregate(&["q1", "q2"]));
    assert_eq!(service(&mut c, n1), aggregate(&["n2"]));
    // A notifier service without a notifier ID counts nothing; the ID's arrival counts it.
    insert(&mut c, b"q3", None, None, Some(n1));
    assert_eq!(service(&mut c, n1), aggregate(&["n2"]));
    update(&mut c, "notifier_id = 'n3'::bytea", b"q3");
    assert_eq!(service(&mut c, n1), aggregate(&["n2", "n3"]));
    // A new notifier ID replaces the old one.
    update(&mut c, "notifier_id = 'n2b'::bytea", b"q2");
    assert_eq!(service(&mut c, n1), aggregate(&["n2b", "n3"]));
    // Another service.
    update(&mut c, "rcv_service_id = 'svc-m2'::bytea", b"q1");
    assert_eq!(service(&mut c, m1), aggregate(&["q2"]));
    assert_eq!(service(&mut c, m2), aggregate(&["q1"]));
    // A change of nothing the services count.
    update(&mut c, "status = 'off', updated_at = 5", b"q1");
    assert_eq!(service(&mut c, m2), aggregate(&["q1"]));
    // A role that does not match the service counts nothing.
    insert(&mut c, b"q4", Some(n1), None, None);
    assert_eq!(service(&mut c, n1), aggregate(&["n2b", "n3"]));
    // Soft deletion takes a queue out of both services, and undoing it puts it back.
    update(&mut c, "deleted_at = 100", b"q2");
    assert_eq!(service(&mut c, m1), aggregate::<&str>(&[]));
    assert_eq!(service(&mut c, n1), aggregate(&["n3"]));
    update(&mut c, "deleted_at = NULL", b"q2");
    assert_eq!(service(&mut c, m1), aggregate(&["q2"]));
    assert_eq!(service(&mut c, n1), aggregate(&["n2b", "n3"]));
    update(&mut c, "deleted_at = 100", b"q2");
    // Hard deletion of a soft-deleted queue changes nothing; of a live one, takes it out.
    c.execute(
        "DELETE FROM msg_queues WHERE recipient_id = 'q2'::bytea",
        &[],
    )
    .unwrap();
    assert_eq!(service(&mut c, m1), aggregate::<&str>(&[]));
    assert_eq!(service(&mut c, n1), aggregate(&["n3"]));
    c.execute(
        "DELETE FROM msg_queues WHERE recipient_id = 'q3'::bytea",
        &[],
    )
    .unwrap();
    assert_eq!(service(&mut c, n1), aggregate::<&str>(&[]));
    // Dropping the association.
    insert(&mut c, b"q5", Some(m2), Some("n5"), Some(n1));
    assert_eq!(service(&mut c, m2), aggregate(&["q1", "q5"]));
    update(
        &mut c,
        "rcv_service_id = NULL, ntf_service_id = NULL",
        b"q5",
    );
    assert_eq!(service(&mut c, m2), aggregate(&["q1"]));
    assert_eq!(service(&mut c, n1), aggregate::<&str>(&[]));

    // The same from SQL's own digests, and the recomputation from scratch.
    insert(&mut c, b"q6", Some(m2), Some("n6"), Some(n1));
    let expected_m2 = aggregate(&["q1", "q6"]);
    let sql_hash: Vec<u8> = c
        .query_one(
            "SELECT xor_aggregate(public.digest(recipient_id, 'md5')) FROM msg_queues \
             WHERE rcv_service_id = 'svc-m2'::bytea AND deleted_at IS NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(sql_hash, expected_m2.1);
    c.batch_execute(
        "UPDATE services SET queue_count = 99, queue_ids_hash = '\\xffffffffffffffffffffffffffffffff'",
    )
    .unwrap();
    c.execute("SELECT update_all_aggregates()", &[]).unwrap();
    assert_eq!(service(&mut c, m2), expected_m2);
    assert_eq!(service(&mut c, n1), aggregate(&["n6"]));
}

#[test]
fn xor_combine_takes_equal_lengths_only() {
    let (_db, mut c) = migrated();
    let x: Vec<u8> = c
        .query_one(
            "SELECT xor_combine('\\x0ff0aa'::bytea, '\\xffff0f'::bytea)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(x, [0xf0, 0x0f, 0xa5]);
    let null: Option<Vec<u8>> = c
        .query_one("SELECT xor_combine(NULL, '\\x01'::bytea)", &[])
        .unwrap()
        .get(0);
    assert_eq!(null, None, "strict");
    let e = c
        .query_one("SELECT xor_combine('\\x01'::bytea, '\\x0102'::bytea)", &[])
        .expect_err("unequal lengths");
    let text = e.as_db_error().map(|d| d.message().to_string());
    assert_eq!(
        text.as_deref(),
        Some("Inputs must be equal length (1 != 2)")
    );
    // The aggregate starts from 16 zero bytes: nothing to combine gives them back.
    let empty: Vec<u8> = c
        .query_one(
            "SELECT xor_aggregate(x) FROM (SELECT '\\x00'::bytea WHERE false) AS t(x)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(empty, [0u8; 16]);
}

// ---------------------------------------------------------------------------------------------
// 3. Databases as the reference server leaves them.

fn postgres_relay(conninfo: &str) -> common::Relay {
    common::Relay::start_with(common::RelayOptions {
        extra_args: vec![
            "--store".into(),
            "postgres".into(),
            "--database".into(),
            conninfo.into(),
        ],
        ..Default::default()
    })
}

/// A queue written the way the reference's `msg_queues` rows are: the recipient key list as a
/// count byte and each key as a length byte and its DER SubjectPublicKeyInfo, the sender key as
/// DER, the DH secret as its 32 bytes, status `active`, queue mode `M`.
struct FixtureQueue {
    queue: Queue,
    sender: Signer,
}

fn fixture_queue(c: &mut Client, tag: &str) -> FixtureQueue {
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let sender = auth_key(KeyAlg::Ed25519);
    let secret: [u8; 32] = rand::random();
    let rid: [u8; 24] = rand::random();
    let sid: [u8; 24] = rand::random();
    let der = keys.auth.public_key().to_spki();
    let mut key_list = vec![1u8, der.len() as u8];
    key_list.extend_from_slice(&der);
    c.execute(
        "INSERT INTO msg_queues (recipient_id, recipient_keys, rcv_dh_secret, sender_id, \
           sender_key, status, updated_at, queue_mode) \
         VALUES ($1, $2, $3, $4, $5, 'active', $6, 'M')",
        &[
            &rid.to_vec(),
            &key_list,
            &secret.to_vec(),
            &sid.to_vec(),
            &sender.public_key().to_spki(),
            &(now_secs() / 86400 * 86400),
        ],
    )
    .unwrap_or_else(|e| panic!("insert queue {tag}: {e}"));
    FixtureQueue {
        queue: Queue {
            keys,
            ids: QueueIds {
                rcv_id: rid.to_vec(),
                snd_id: sid.to_vec(),
                srv_dh_key: [0; 32],
                queue_mode: None,
                link_id: None,
                service_id: None,
                srv_ntf_creds: None,
            },
            secret,
        },
        sender,
    }
}

/// A message as the reference's SEND stores it; its ID.
fn fixture_message(c: &mut Client, q: &Queue, body: &[u8]) -> Vec<u8> {
    let id: [u8; 24] = rand::random();
    let r = c
        .query_one(
            "SELECT quota_written FROM write_message($1, $2, $3, false, false, $4, 128)",
            &[&q.rid(), &id.to_vec(), &now_secs(), &body],
        )
        .expect("write a fixture message");
    assert!(!r.get::<_, bool>(0));
    id.to_vec()
}

fn count(c: &mut Client, sql: &str, rid: &[u8]) -> i64 {
    c.query_one(sql, &[&rid]).expect(sql).get(0)
}

/// A SUB delivers the pending message `id` with `body`; ACK; then a SEND reaches the subscriber.
fn check_serves(relay: &common::Relay, fq: &FixtureQueue, id: &[u8], body: &[u8], tag: &str) {
    let mut rc = relay.client();
    let m = sub_with_msg(&mut rc, &fq.queue);
    assert_eq!(m.msg_id, id, "{tag}: the pending message's ID");
    assert_eq!(m.msg.body(), Some(body), "{tag}: the pending message");
    assert_eq!(ack(&mut rc, &fq.queue, id), BrokerMsg::Ok, "{tag}: ACK");
    let mut sc = relay.client();
    control_round(&mut rc, &mut sc, &fq.queue, &fq.sender, tag);
}

#[test]
fn reference_rows_written_by_sql_serve_clients() {
    let (conninfo, mut c) = migrated();
    let a = fixture_queue(&mut c, "a");
    let b = fixture_queue(&mut c, "b");
    let a1 = fixture_message(&mut c, &a.queue, b"first, written by SQL");
    let a2 = fixture_message(&mut c, &a.queue, b"second, written by SQL");
    let b1 = fixture_message(&mut c, &b.queue, b"only one");
    drop(c);

    let mut relay = postgres_relay(&conninfo);
    let mut rc = relay.client();
    let m = sub_with_msg(&mut rc, &a.queue);
    assert_eq!(m.msg_id, a1);
    assert_eq!(m.msg.body(), Some(&b"first, written by SQL"[..]));
    let next = msg_of(&a.queue, ack(&mut rc, &a.queue, &a1));
    assert_eq!(next.msg_id, a2);
    assert_eq!(next.msg.body(), Some(&b"second, written by SQL"[..]));
    assert_eq!(ack(&mut rc, &a.queue, &a2), BrokerMsg::Ok);
    let mut sc = relay.client();
    control_round(&mut rc, &mut sc, &a.queue, &a.sender, "fixture queue a");
    check_serves(&relay, &b, &b1, b"only one", "fixture queue b");
    // A sender without the queue's key is refused.
    let stranger = auth_key(KeyAlg::Ed25519);
    assert_eq!(send(&mut sc, &a.queue, Some(&stranger), b"no"), ERR_AUTH);
    let status = relay.stop();
    assert!(status.success(), "clean stop: {}", relay.log_text());

    // Both queues are drained in the database, counters included.
    let mut c = connect(&conninfo);
    c.batch_execute("SET search_path TO smp_server").unwrap();
    for fq in [&a, &b] {
        assert_eq!(
            count(
                &mut c,
                "SELECT count(*) FROM messages WHERE recipient_id = $1",
                fq.queue.rid()
            ),
            0
        );
        assert_eq!(counters(&mut c, fq.queue.rid()), (0, true, false));
    }
}

#[test]
fn relay_rows_are_in_the_reference_s_encodings_and_survive_restart() {
    let conninfo = common::pg_database();
    let mut relay = postgres_relay(&conninfo);
    let sender = auth_key(KeyAlg::Ed25519);
    let (q, n);
    {
        let mut h = relay.client();
        q = create_secured(&mut h, &sender);
        n = nkey(&mut h, &q);
        let mut sc = relay.client();
        send_ok(&mut sc, &q, Some(&sender), b"pending 1");
        send_ok(&mut sc, &q, Some(&sender), b"pending 2");
    }
    let status = relay.stop();
    assert!(status.success(), "clean stop: {}", relay.log_text());

    let mut c = connect(&conninfo);
    c.batch_execute("SET search_path TO smp_server").unwrap();
    let r = c
        .query_one(
            "SELECT recipient_keys, rcv_dh_secret, sender_id, sender_key, status, queue_mode, \
               notifier_id, notifier_key, rcv_ntf_dh_secret, deleted_at, msg_queue_size, \
               msg_can_write, msg_queue_expire \
             FROM msg_queues WHERE recipient_id = $1",
            &[&q.rid()],
        )
        .expect("the queue's row");
    let der = q.key().public_key().to_spki();
    let mut key_list = vec![1u8, der.len() as u8];
    key_list.extend_from_slice(&der);
    assert_eq!(r.get::<_, Vec<u8>>(0), key_list, "recipient_keys");
    assert_eq!(r.get::<_, Vec<u8>>(1), q.secret, "rcv_dh_secret");
    assert_eq!(r.get::<_, Vec<u8>>(2), q.sid(), "sender_id");
    assert_eq!(
        r.get::<_, Option<Vec<u8>>>(3),
        Some(sender.public_key().to_spki()),
        "sender_key"
    );
    assert_eq!(r.get::<_, String>(4), "active");
    assert_eq!(r.get::<_, Option<String>>(5).as_deref(), Some("M"));
    assert_eq!(r.get::<_, Option<Vec<u8>>>(6), Some(n.nid.clone()));
    assert_eq!(
        r.get::<_, Option<Vec<u8>>>(7),
        Some(n.keys.auth.public_key().to_spki()),
        "notifier_key"
    );
    assert_eq!(r.get::<_, Option<Vec<u8>>>(8), Some(n.secret.to_vec()));
    assert_eq!(r.get::<_, Option<i64>>(9), None, "deleted_at");
    let size: i64 = r.get(10);
    let rows = stored(&mut c, q.rid());
    assert_eq!(size, rows.len() as i64, "msg_queue_size is the row count");
    assert_eq!((r.get::<_, bool>(11), r.get::<_, bool>(12)), (true, true));
    let bodies: Vec<&[u8]> = rows.iter().map(|m| m.body.as_slice()).collect();
    assert_eq!(bodies, [b"pending 1".as_slice(), b"pending 2"]);
    assert!(rows.iter().all(|m| !m.quota && !m.ntf && m.id.len() == 24));
    drop(c);

    relay.restart();
    let mut rc = relay.client();
    let m = sub_with_msg(&mut rc, &q);
    assert_eq!(m.msg_id, rows[0].id);
    assert_eq!(m.msg.body(), Some(&b"pending 1"[..]));
    let next = msg_of(&q, ack(&mut rc, &q, &m.msg_id));
    assert_eq!(next.msg.body(), Some(&b"pending 2"[..]));
    assert_eq!(ack(&mut rc, &q, &next.msg_id), BrokerMsg::Ok);
    let mut sc = relay.client();
    control_round(&mut rc, &mut sc, &q, &sender, "after the restart");
}

/// Runs `start` on postgres to its end, for starts that must fail.
fn failed_start(conninfo: &str) -> (std::process::ExitStatus, String) {
    let dir = common::TempDir::new("pg-schema").expect("a temp dir");
    common::init(dir.path());
    let port = common::free_port().to_string();
    let out = common::run_cli(
        dir.path(),
        &[
            "start",
            "--port",
            &port,
            "--store",
            "postgres",
            "--database",
            conninfo,
        ],
    );
    (
        out.status,
        common::strip_ansi(&String::from_utf8_lossy(&out.stderr)),
    )
}

/// Applies the first `n` migrations as the reference would have, recording them.
fn migrate_to(c: &mut Client, n: usize) {
    c.batch_execute(
        "CREATE SCHEMA smp_server;
         CREATE TABLE smp_server.migrations (name TEXT NOT NULL PRIMARY KEY, ts TIMESTAMP NOT NULL, down TEXT);",
    )
    .unwrap();
    for m in &MIGRATIONS[..n] {
        let mut tx = c.transaction().unwrap();
        tx.batch_execute("SET LOCAL search_path TO smp_server")
            .unwrap();
        tx.batch_execute(m.up)
            .unwrap_or_else(|e| panic!("{}: {e}", m.name));
        tx.execute(
            "INSERT INTO smp_server.migrations (name, ts, down) VALUES ($1, now(), $2)",
            &[&m.name, &m.down],
        )
        .unwrap();
        tx.commit().unwrap();
    }
    c.batch_execute("SET search_path TO smp_server").unwrap();
}

fn migration_names(c: &mut Client) -> Vec<String> {
    c.query("SELECT name FROM smp_server.migrations ORDER BY name", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[test]
fn a_migration_the_relay_does_not_know_stops_the_start() {
    let conninfo = common::pg_database();
    let mut c = connect(&conninfo);
    migrate_to(&mut c, 3);
    c.execute(
        "INSERT INTO migrations (name, ts) VALUES ('20991231_from_the_future', now())",
        &[],
    )
    .unwrap();
    drop(c);
    let (status, stderr) = failed_start(&conninfo);
    assert!(!status.success(), "the start must fail: {stderr}");
    assert!(
        stderr.contains("20991231_from_the_future") && stderr.contains("does not know"),
        "stderr names the unknown migration: {stderr}"
    );
    // Nothing was applied.
    let mut c = connect(&conninfo);
    let names = migration_names(&mut c);
    assert_eq!(names.len(), 4, "{names:?}");
    assert_eq!(names[..3], REFERENCE_MIGRATIONS[..3]);
}

#[test]
fn a_database_without_pgcrypto_stops_the_start() {
    let cluster = common::pg_cluster();
    let name = format!("nocrypto_{}", std::process::id());
    cluster
        .client("postgres")
        .unwrap()
        .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE template0"))
        .unwrap();
    let conninfo = cluster.conninfo(&name);
    let (status, stderr) = failed_start(&conninfo);
    assert!(!status.success(), "the start must fail: {stderr}");
    assert!(
        stderr.contains("CREATE EXTENSION pgcrypto;"),
        "stderr says how to install pgcrypto: {stderr}"
    );
    let mut c = connect(&conninfo);
    let schemas: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'smp_server'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(schemas, 0, "nothing created");
}

#[test]
fn a_database_at_an_older_migration_is_upgraded_at_start() {
    let conninfo = common::pg_database();
    let mut c = connect(&conninfo);
    migrate_to(&mut c, 5);
    assert_eq!(migration_names(&mut c), REFERENCE_MIGRATIONS[..5]);
    // A service with a queue, whose count and hash the last migration computes.
    c.execute(
        "INSERT INTO services (service_id, service_role, service_cert, service_cert_hash, \
           created_at) VALUES ('svc'::bytea, 'M', 'cert'::bytea, 'hash'::bytea, 1)",
        &[],
    )
    .unwrap();
    let served = fixture_queue(&mut c, "served");
    let other = fixture_queue(&mut c, "with a service");
    c.execute(
        "UPDATE msg_queues SET rcv_service_id = 'svc'::bytea WHERE recipient_id = $1",
        &[&other.queue.rid()],
    )
    .unwrap();
    let id = fixture_message(&mut c, &served.queue, b"from before the upgrade");
    fixture_message(&mut c, &other.queue, b"kept");
    drop(c);

    let mut relay = postgres_relay(&conninfo);
    let mut c = connect(&conninfo);
    assert_eq!(migration_names(&mut c), REFERENCE_MIGRATIONS);
    let queues: i64 = c
        .query_one("SELECT count(*) FROM smp_server.msg_queues", &[])
        .unwrap()
        .get(0);
    assert_eq!(queues, 2, "the queue rows are kept");
    let r = c
        .query_one(
            "SELECT queue_count, queue_ids_hash FROM smp_server.services WHERE service_id = 'svc'::bytea",
            &[],
        )
        .unwrap();
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, Vec<u8>>(1)),
        aggregate(&[other.queue.rid()]),
        "the service's aggregates computed by the last migration"
    );
    check_serves(
        &relay,
        &served,
        &id,
        b"from before the upgrade",
        "upgraded database",
    );
    let status = relay.stop();
    assert!(status.success(), "clean stop: {}", relay.log_text());
    assert_eq!(
        count(
            &mut c,
            "SELECT count(*) FROM smp_server.messages WHERE recipient_id = $1",
            other.queue.rid()
        ),
        1,
        "the other queue's message is kept"
    );
}

/// `smp-relay database downgrade` leaves the reference's schema and nothing of this relay's: it
/// drops the relay's own migrations table, says the schema is the reference's, and refuses while a
/// relay holds the schema.
#[test]
fn database_downgrade_leaves_only_the_reference_schema() {
    let cluster = common::pg_cluster();
    let db = cluster.create_database().expect("database");
    let conninfo = cluster.conninfo(&db);
    let mut relay = common::Relay::start_with(common::RelayOptions {
        cores: 1,
        extra_args: vec![
            "--store".into(),
            "postgres".into(),
            "--database".into(),
            conninfo.clone(),
        ],
    });
    let dir = relay.dir.path().to_path_buf();
    let running = common::run_cli(&dir, &["database", "downgrade"]);
    assert!(!running.status.success(), "refused beside a running relay");
    assert!(
        String::from_utf8_lossy(&running.stderr).contains("running"),
        "{}",
        String::from_utf8_lossy(&running.stderr)
    );
    assert!(relay.stop().success());
    // An own-migrations table as a later version of this relay would leave it (empty).
    let mut c = cluster.client(&db).expect("connect");
    c.batch_execute(
        "CREATE TABLE smp_server.smprelay_migrations (name TEXT PRIMARY KEY, ts TIMESTAMP, down TEXT)",
    )
    .expect("own table");
    // The database the relay last used is remembered in its data directory.
    let out = common::run_cli(&dir, &["database", "downgrade"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("20250915_queue_ids_hash"), "{text}");
    let left: Option<String> = c
        .query_one(
            "SELECT to_regclass('smp_server.smprelay_migrations')::text",
            &[],
        )
        .expect("query")
        .get(0);
    assert_eq!(left, None, "the relay's own table is gone");
    let names: Vec<String> = c
        .query("SELECT name FROM smp_server.migrations ORDER BY name", &[])
        .expect("migrations")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        names,
        MIGRATIONS
            .iter()
            .map(|m| m.name.to_string())
            .collect::<Vec<_>>(),
        "the reference's migrations stay"
    );
}
