//! The PostgreSQL store (`docs/ARCHITECTURE.md` §5): queue records in the reference server's
//! `msg_queues`, messages in its `messages` through its stored functions (`write_message`,
//! `try_del_msg`, `delete_expired_msgs`; ACKs by a statement of the relay's own that does what
//! `try_del_peek_msg` does, `ACK_MANY`), on the reference's schema (`postgres/schema.rs`), so
//! that a database the reference server used keeps its users here.
//!
//! Nothing is loaded at start but each queue's message count (`msg_queue_size`, of the queues that
//! hold messages) and the shard's queue count. A job reads the records of its queues first
//! (`QueueStore::prepare`, one statement for the queues not held yet); the shard then holds them
//! while the job runs, while the owner says to keep them (its subscribed queues), and up to a
//! bound of others, least recently used first out (`postgres/records.rs`, `[RELAY]
//! pg_queue_cache`). A head read on a queue known to be empty costs nothing. Every change goes to
//! the database through the pool
//! (`postgres/pool.rs`): the shard sends a job and awaits it, serving other queues meanwhile. The
//! owner's per-queue order (`docs/ARCHITECTURE.md` §2) never has two operations of one queue in
//! flight, so the cache changes only when the database did, in the queue's order; the row locks of
//! the stored functions are never contended by this relay, and an advisory lock keeps a second
//! relay off the schema.
//!
//! The store waits, so the owner runs a turn's queues side by side in rounds
//! (`MessageStore::begin_round`, `docs/ARCHITECTURE.md` §2): the SENDs of a round go to the
//! database as one statement (`WRITE_MANY`), its ACKs as another (`ACK_MANY`); a lone SEND uses
//! its own statement.
//!
//! A SEND whose connection broke while it ran may or may not have committed: its message ID is
//! looked up, and the SEND is answered from what the database holds; it is never written twice.
//!
//! Deleted queues are deleted, not marked (the reference marks `deleted_at` and purges after a
//! while); rows marked by the reference are never loaded. Pending notifications are kept in memory
//! and saved at a clean stop (`postgres/ntfs.rs`), as the reference does.

pub mod cluster;
mod conninfo;
mod counts;
mod errors;
mod ntfs;
pub mod pool;
mod records;
mod rows;
pub mod schema;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use postgres::fallible_iterator::FallibleIterator;

pub use ntfs::POSTGRES_STORE_DIR;
pub use pool::PgConfig;
use pool::{outcome_unknown, Shared};
use records::Records;
use rows::{rec_columns, rec_of, MsgRow, RecRow, REC_COLUMNS};

use super::id::IdKey;
use super::memory::MemoryStore;
use super::{
    group_of, EntityId, IdSource, IdSpace, IdsFound, Message, MessageStore, MsgId, MsgNtf,
    QueueData, QueueRec, QueueStatus, QueueStore, RecordIds, ShardStore, StoreCounters, StoreError,
    StoreSettings, WriteOutcome, PARTITION_GROUPS,
};

/// Queues per statement of the expiration at start (the periodic one comes in jobs of this many):
/// each statement holds the row locks of its queues while it runs, so it stays short.
pub const EXPIRE_CHUNK: usize = crate::limits::EXPIRE_QUEUES_PER_JOB;

// A queue's group from its recipient ID in SQL: the partition is the first 8 bytes of
// SHA-256(recipient ID) as a big-endian number mod 4096, so its group (mod 64) is the low bits
// of byte 7 (`store::group_of`).
// The SQL below writes the group count (64) out: it must be the store's.
const _: () = assert!(PARTITION_GROUPS == 64);
const GROUP_OF_SQL: &str = "get_byte(public.digest(recipient_id, 'sha256'), 7) % 64";

// What a shard knows at start: an estimate of the table's rows (the catalogue's, its queue count
// until the relay's count comes, `COUNT_BY_GROUP`; a `count(*)` of its own is one more pass over
// the table, a SHA-256 per row, per shard, left to the commands that open the store without a
// start), and the message count of each queue that holds messages.
const COUNT_QUEUES: &str = "SELECT count(*) FROM msg_queues \
     WHERE deleted_at IS NULL AND {GROUP} = ANY($1::int4[])";
const ESTIMATE_ROWS: &str =
    "SELECT coalesce((SELECT reltuples::int8 FROM pg_class WHERE oid = to_regclass('msg_queues')), 0)";
const LOAD_SIZES: &str = "SELECT recipient_id, msg_queue_size FROM msg_queues \
     WHERE msg_queue_size > 0 AND deleted_at IS NULL AND {GROUP} = ANY($1::int4[])";
// Every queue's IDs, streamed once at start (the directory, the services' index). A notifier
// counts only with its ID, key and secret, as `rows::rec_of` reads it.
macro_rules! load_ids {
    () => {
        "SELECT recipient_id, sender_id, link_id, \
         CASE WHEN notifier_key IS NOT NULL AND rcv_ntf_dh_secret IS NOT NULL THEN notifier_id END, \
         rcv_service_id, \
         CASE WHEN notifier_key IS NOT NULL AND rcv_ntf_dh_secret IS NOT NULL THEN ntf_service_id END \
         FROM msg_queues WHERE deleted_at IS NULL AND {GROUP} = ANY($1::int4[])"
    };
}
const LOAD_IDS: &str = load_ids!();
const LOAD_ALL: &str = "SELECT {REC} FROM msg_queues \
     WHERE deleted_at IS NULL AND {GROUP} = ANY($1::int4[])";
// The directory is a cache in front of the table's unique indexes (`IdSource`): the queues of
// the IDs it does not hold, one statement for the IDs of a block. A notifier counts only with
// its ID, key and secret, as `rows::rec_of` reads it.
const FIND_SENDERS: &str = "SELECT sender_id, recipient_id FROM msg_queues \
     WHERE sender_id = ANY($1) AND deleted_at IS NULL";
const FIND_LINKS: &str = "SELECT link_id, recipient_id FROM msg_queues \
     WHERE link_id = ANY($1) AND deleted_at IS NULL";
const FIND_NOTIFIERS: &str = "SELECT notifier_id, recipient_id FROM msg_queues \
     WHERE notifier_id = ANY($1) AND deleted_at IS NULL \
     AND notifier_key IS NOT NULL AND rcv_ntf_dh_secret IS NOT NULL";
// The relay's queues and notifiers by partition group, counted once for all shards after the
// start, while they serve (`postgres/counts.rs`; the start itself reads no queue).
const COUNT_BY_GROUP: &str = "SELECT {GROUP} AS g, count(*), count(*) FILTER (WHERE \
     notifier_id IS NOT NULL AND notifier_key IS NOT NULL AND rcv_ntf_dh_secret IS NOT NULL) \
     FROM msg_queues WHERE deleted_at IS NULL GROUP BY 1";
// The IDs of the queues associated with a service, for the services' index at start (through
// the indexes on `rcv_service_id` and `ntf_service_id`).
const LOAD_SERVICE_IDS: &str = concat!(
    load_ids!(),
    " AND (rcv_service_id IS NOT NULL OR ntf_service_id IS NOT NULL)"
);
// The records a job needs and the shard does not hold (`QueueStore::prepare`).
const LOAD_RECORDS: &str = concat!(
    "SELECT ",
    rec_columns!(),
    " FROM msg_queues WHERE recipient_id = ANY($1) AND deleted_at IS NULL"
);
// The queues of notifiers with pending notifications, for their files at a stop.
const NOTIFIER_QUEUES: &str = "SELECT notifier_id, recipient_id FROM msg_queues \
     WHERE notifier_id = ANY($1) AND deleted_at IS NULL";
const INSERT_QUEUE: &str = "INSERT INTO msg_queues (recipient_id, recipient_keys, rcv_dh_secret, \
     sender_id, sender_key, queue_mode, notifier_id, notifier_key, rcv_ntf_dh_secret, \
     ntf_service_id, status, updated_at, link_id, rcv_service_id, fixed_data, user_data) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";
// Every column but the recipient ID, the DH secret and the sender ID, which never change.
const UPDATE_QUEUE: &str = "UPDATE msg_queues SET recipient_keys = $2, sender_key = $5, \
     queue_mode = $6, notifier_id = $7, notifier_key = $8, rcv_ntf_dh_secret = $9, \
     ntf_service_id = $10, status = $11, updated_at = $12, link_id = $13, rcv_service_id = $14, \
     fixed_data = $15, user_data = $16 \
     WHERE recipient_id = $1 AND deleted_at IS NULL AND rcv_dh_secret = $3 AND sender_id = $4";
const DELETE_QUEUE: &str = "DELETE FROM msg_queues WHERE recipient_id = $1";
// A block's associations (simplexmq `QueueStore/Postgres.hs`, `setQueueServices`).
const ASSOCIATE_MANY: &str = "UPDATE msg_queues SET rcv_service_id = $1, updated_at = $2 \
     WHERE recipient_id = ANY($3) AND deleted_at IS NULL RETURNING recipient_id";
const ASSOCIATE_NTF_MANY: &str = "UPDATE msg_queues SET ntf_service_id = $1 \
     WHERE recipient_id = ANY($2) AND deleted_at IS NULL AND notifier_id IS NOT NULL \
     RETURNING recipient_id";
const WRITE: &str =
    "SELECT quota_written, was_empty FROM write_message($1, $2, $3, $4, $5, $6, $7)";
// A SEND's expiry and its write in one round trip: the write refers to the expiry's row, so it
// runs after it (a lateral call runs per row of what it refers to). No row: not written.
const EXPIRE_AND_WRITE: &str = "SELECT w.quota_written, w.was_empty, e.n \
     FROM (SELECT delete_expired_msgs($1::bytea, $8::int8) AS n) e \
     LEFT JOIN LATERAL write_message($1::bytea, $2::bytea, $3::int8, $4::bool, $5::bool, \
       $6::bytea, CASE WHEN e.n >= 0 THEN $7::int4 END) w ON TRUE";
// The SENDs of a round (`MessageStore::begin_round`: a block part's SENDs to different queues) in
// one statement and one transaction: per SEND its expiry (when `old` is not NULL), then its write,
// as `EXPIRE_AND_WRITE` does for one. One row per SEND, by its position `i`.
const WRITE_MANY: &str = "SELECT q.i, w.quota_written, w.was_empty, e.n \
     FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bool[], $5::bool[], $6::bytea[], \
       $7::int4[], $8::int8[]) WITH ORDINALITY AS q(rid, mid, ts, quota, ntf, body, lim, old, i) \
     CROSS JOIN LATERAL (SELECT CASE WHEN q.old IS NULL THEN 0::int8 \
       ELSE delete_expired_msgs(q.rid, q.old) END AS n) e \
     LEFT JOIN LATERAL write_message(q.rid, q.mid, q.ts, q.quota, q.ntf, q.body, \
       CASE WHEN e.n >= 0 THEN q.lim END) w ON TRUE";
const FIND_MSG: &str = "SELECT msg_quota FROM messages WHERE recipient_id = $1 AND msg_id = $2";
const PEEK: &str = "SELECT msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body FROM messages \
     WHERE recipient_id = $1 ORDER BY message_id LIMIT 1";
// The head of each queue: a `LIMIT 1` index read per queue (`benches/pg_peek_many.rs`: on 135
// queues of 128 messages, p99 1.6 ms against 67 ms for `DISTINCT ON`, which reads every message).
const PEEK_MANY: &str = "SELECT q.rid, m.msg_id, m.msg_ts, m.msg_quota, m.msg_ntf_flag, \
     m.msg_body FROM unnest($1::bytea[]) AS q(rid) CROSS JOIN LATERAL (SELECT msg_id, msg_ts, \
     msg_quota, msg_ntf_flag, msg_body FROM messages WHERE recipient_id = q.rid \
     ORDER BY message_id LIMIT 1) m";
const TRY_DEL: &str = "SELECT r_msg_id, r_msg_ts, r_msg_quota, r_msg_ntf_flag, r_msg_body \
     FROM try_del_msg($1, $2)";
// The ACKs of a round whose queues all differ, in one statement of the relay's own: what the
// reference's `try_del_peek_msg` does per queue (simplexmq `QueueStore/Postgres/Migrations.hs`)
// — no row for a missing queue; the head, body and all, if it is not `mid`; else the head deleted
// (its body left out: the ACK needs only to know which message went, `MessageStore::try_del_peek`)
// and the next message; the queue's counters as the function leaves them — without the function's
// `FOR UPDATE` of the queue's row and its five statements per ACK: the owner's per-queue order
// never has two operations of one queue in flight (the module's documentation), and the
// statement is one transaction. Rows by the ACK's position `i` and, within it, in the function's
// order. The database's time per ACK here: ~40 µs against ~57 through the function (5,000
// ACKs of 16 KB messages, `benches/README.md`).
const ACK_MANY: &str = "WITH h AS ( \
       SELECT a.i, a.rid, a.mid, mq.msg_queue_size AS stored, m.message_id, m.msg_id \
       FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS a(rid, mid, i) \
       JOIN msg_queues mq ON mq.recipient_id = a.rid AND mq.deleted_at IS NULL \
       LEFT JOIN LATERAL (SELECT message_id, msg_id FROM messages \
         WHERE recipient_id = a.rid ORDER BY message_id LIMIT 1) m ON TRUE), \
     d AS (DELETE FROM messages m USING h \
       WHERE m.message_id = h.message_id AND h.msg_id = h.mid \
       RETURNING h.i, h.rid, m.message_id, m.msg_id, m.msg_ts, m.msg_quota, m.msg_ntf_flag), \
     nx AS (SELECT d.i, n.msg_id, n.msg_ts, n.msg_quota, n.msg_ntf_flag, n.msg_body \
       FROM d CROSS JOIN LATERAL (SELECT msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body \
         FROM messages WHERE recipient_id = d.rid AND message_id > d.message_id \
         ORDER BY message_id LIMIT 1) n), \
     u AS (UPDATE msg_queues mq SET \
         msg_can_write = c.reset OR mq.msg_can_write OR mq.msg_queue_size <= 1, \
         msg_queue_expire = NOT c.reset AND mq.msg_queue_size > 1, \
         msg_queue_size = CASE WHEN c.reset THEN 0 ELSE GREATEST(mq.msg_queue_size - 1, 0) END \
       FROM (SELECT d.rid, NOT EXISTS (SELECT 1 FROM messages x \
             WHERE x.recipient_id = d.rid AND x.message_id > d.message_id) AS reset FROM d \
           UNION ALL \
           SELECT h.rid, TRUE FROM h WHERE h.message_id IS NULL AND h.stored <> 0) c \
       WHERE mq.recipient_id = c.rid AND mq.deleted_at IS NULL) \
     SELECT r.i, r.msg_id, r.msg_ts, r.msg_quota, r.msg_ntf_flag, r.body FROM ( \
       SELECT d.i, 1 AS k, d.msg_id, d.msg_ts, d.msg_quota, d.msg_ntf_flag, ''::bytea AS body \
       FROM d \
       UNION ALL \
       SELECT h.i, 1, m.msg_id, m.msg_ts, m.msg_quota, m.msg_ntf_flag, m.msg_body \
       FROM h CROSS JOIN LATERAL (SELECT msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body \
         FROM messages WHERE message_id = h.message_id) m \
       WHERE h.msg_id <> h.mid \
       UNION ALL \
       SELECT nx.i, 2, nx.msg_id, nx.msg_ts, nx.msg_quota, nx.msg_ntf_flag, nx.msg_body FROM nx \
     ) r ORDER BY r.i, r.k";
// ACKs of one round on the same queue (which the owner does not make) through the reference's
// function, one call after another as the function's own statements see each other: its rows
// (what it deleted, then the new head) numbered by the ACK's position `i` and their own order
// `k`; the deleted message's body left out.
const TRY_DEL_PEEK_MANY: &str = "SELECT q.i, r.r_msg_id, r.r_msg_ts, r.r_msg_quota, \
     r.r_msg_ntf_flag, CASE WHEN r.r_msg_id = q.mid THEN ''::bytea ELSE r.r_msg_body END \
     FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS q(rid, mid, i) \
     CROSS JOIN LATERAL try_del_peek_msg(q.rid, q.mid) WITH ORDINALITY \
       AS r(r_msg_id, r_msg_ts, r_msg_quota, r_msg_ntf_flag, r_msg_body, k) \
     ORDER BY q.i, r.k";
const DELETE_EXPIRED: &str = "SELECT delete_expired_msgs($1, $2)";
const EXPIRE_MANY: &str =
    "SELECT q.rid, delete_expired_msgs(q.rid, $2) FROM unnest($1::bytea[]) AS q(rid)";
const ALL_MESSAGES: &str =
    "SELECT msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body FROM messages \
     WHERE recipient_id = $1 ORDER BY message_id";
const RESTORE_MESSAGES: &str = "INSERT INTO messages (recipient_id, msg_id, msg_ts, msg_quota, \
     msg_ntf_flag, msg_body) SELECT $1, m.id, m.ts, m.quota, m.ntf, m.body \
     FROM unnest($2::bytea[], $3::int8[], $4::bool[], $5::bool[], $6::bytea[]) \
     WITH ORDINALITY AS m(id, ts, quota, ntf, body, n) ORDER BY m.n";
const RESTORE_COUNTS: &str = "UPDATE msg_queues SET msg_queue_size = $2, msg_can_write = $3, \
     msg_queue_expire = $4 WHERE recipient_id = $1";
const FIND_OFFLINE: &str = "SELECT {REC} FROM msg_queues \
     WHERE (sender_id = $1 OR link_id = $1) AND deleted_at IS NULL";
const SET_STATUS_OFFLINE: &str =
    "UPDATE msg_queues SET status = $2 WHERE sender_id = $1 AND deleted_at IS NULL";

fn sql(template: &str) -> String {
    template
        .replace("{REC}", REC_COLUMNS)
        .replace("{GROUP}", GROUP_OF_SQL)
}

/// `smp-relay database downgrade` (`schema::downgrade`) on the database of `config`.
pub fn downgrade(config: &PgConfig) -> Result<String, String> {
    let target = conninfo::Target::parse(&config.conninfo)?;
    let mut client = target
        .connect()
        .map_err(|e| format!("cannot connect to the database {}: {e}", target.shown()))?;
    schema::downgrade(&mut client, &config.schema)
}

/// The database settings of the relay that last started on `data_dir` (written at its start),
/// for the offline tools.
pub fn remembered_config(data_dir: &std::path::Path) -> Option<PgConfig> {
    let (conninfo, schema) = ntfs::remembered_connection(&ntfs::store_dir(data_dir))?;
    Some(PgConfig {
        conninfo,
        schema,
        ..PgConfig::default()
    })
}

/// Names `config`'s database and schema as the one the relay on `data_dir` last started on (what
/// `remembered_config` reads): for a data directory made beside a database of its own
/// (`smp-load scale --pg`).
pub fn remember_config(data_dir: &std::path::Path, config: &PgConfig) -> Result<(), String> {
    ntfs::remember_connection(&ntfs::store_dir(data_dir), &config.conninfo, &config.schema)
}

/// The statements of the hot paths, prepared on every pooled connection as it opens.
pub const HOT_STATEMENTS: &[&str] = &[
    FIND_SENDERS,
    FIND_LINKS,
    FIND_NOTIFIERS,
    LOAD_RECORDS,
    INSERT_QUEUE,
    UPDATE_QUEUE,
    DELETE_QUEUE,
    ASSOCIATE_MANY,
    ASSOCIATE_NTF_MANY,
    WRITE,
    EXPIRE_AND_WRITE,
    WRITE_MANY,
    FIND_MSG,
    PEEK,
    PEEK_MANY,
    TRY_DEL,
    ACK_MANY,
    TRY_DEL_PEEK_MANY,
    DELETE_EXPIRED,
    EXPIRE_MANY,
];

/// What the look at a SEND whose connection was lost found.
enum Lookup {
    /// Written (the flag: it was the quota marker).
    Found(bool),
    Absent,
    /// The session's server process would not end, so the write may still commit.
    StillRunning(i32),
}

/// What a SEND's statement returned: (quota marker written, the queue was empty) if it wrote,
/// and how many messages its expiry deleted.
struct Written {
    outcome: Option<(bool, bool)>,
    expired: i64,
}

/// What the shard keeps of its queues.
#[derive(Debug)]
struct Data {
    records: Records,
    /// The message count (`messages` rows, the quota marker included) of each queue that holds
    /// messages, from `msg_queue_size` at start and every change since; a queue that is not here
    /// is empty. `None`: a SEND's outcome could not be learnt, until a read tells: head reads
    /// then always ask the database.
    sizes: HashMap<IdKey, Option<usize>, foldhash::fast::RandomState>,
    /// Queues of this shard in the database; an estimate until `queues_counted`.
    queues: usize,
    /// `queues` was counted: by the relay's count (`counting`), by an ID stream, or by
    /// `queue_count`'s own statement.
    queues_counted: bool,
    /// Notifiers of this shard's queues; like `queues`, an estimate (0) until counted.
    notifiers: usize,
    /// The relay's count of queues and notifiers (`COUNT_BY_GROUP`), asked for when the shard
    /// began to serve (or a tool opening the store asked for the count), until its answer is
    /// taken; with the changes made since, which it does
    /// not see.
    counting: Option<Counting>,
    /// The count was sent (once: a failed one leaves the estimate, kept by the changes).
    count_sent: bool,
    total_messages: usize,
    counters: StoreCounters,
}

/// The relay's count as a shard waits for it (`Data::counting`).
#[derive(Debug)]
struct Counting {
    answer: flume::Receiver<counts::Answer>,
    /// Queues and notifiers created less deleted since the shard asked.
    queues_since: i64,
    notifiers_since: i64,
}

impl Data {
    fn new(cache: usize) -> Self {
        Data {
            records: Records::new(cache),
            sizes: HashMap::default(),
            queues: 0,
            queues_counted: false,
            notifiers: 0,
            counting: None,
            count_sent: false,
            total_messages: 0,
            counters: StoreCounters::default(),
        }
    }

    /// A queue (`queues`) or notifier (`notifiers`) more or less.
    fn count_change(&mut self, queues: i64, notifiers: i64) {
        self.queues = self.queues.saturating_add_signed(queues as isize);
        self.notifiers = self.notifiers.saturating_add_signed(notifiers as isize);
        if let Some(c) = &mut self.counting {
            c.queues_since += queues;
            c.notifiers_since += notifiers;
        }
    }

    /// Takes the running count's answer for the shard's `groups` if it came (`wait`: waits for
    /// it); true once counted.
    fn take_count(&mut self, groups: &[i32], wait: bool) -> bool {
        let Some(c) = &self.counting else {
            return self.queues_counted;
        };
        let answer = if wait {
            c.answer.recv().ok()
        } else {
            match c.answer.try_recv() {
                Err(flume::TryRecvError::Empty) => return false,
                r => r.ok(),
            }
        };
        let c = self.counting.take().expect("checked above");
        match answer {
            Some(Ok(by_group)) => {
                let (q, n) = groups
                    .iter()
                    .filter_map(|&g| by_group.get(usize::try_from(g).ok()?))
                    .fold((0, 0), |(q, n), (gq, gn)| (q + gq, n + gn));
                let count = |total: i64, since: i64| usize::try_from(total + since).unwrap_or(0);
                self.queues = count(q, c.queues_since);
                self.notifiers = count(n, c.notifiers_since);
                self.queues_counted = true;
            }
            Some(Err(e)) => tracing::warn!(error = %e, "counting the shard's queues"),
            None => tracing::warn!("counting the shard's queues: the job was dropped"),
        }
        self.queues_counted
    }

    /// Whether the database may hold messages of the queue.
    fn may_have_messages(&self, rid: &[u8]) -> bool {
        self.sizes.contains_key(rid)
    }

    /// The queues whose messages the database may hold (what expiration looks at).
    fn holding(&self) -> Vec<EntityId> {
        self.sizes.keys().map(|k| k.to_vec()).collect()
    }

    fn add(&mut self, rid: &[u8], n: usize) {
        if n == 0 {
            return;
        }
        match self.sizes.get_mut(rid) {
            Some(Some(s)) => *s += n,
            Some(None) => return,
            None => {
                self.sizes.insert(IdKey::new(rid), Some(n));
            }
        }
        self.total_messages += n;
    }

    fn remove(&mut self, rid: &[u8], n: usize) {
        if let Some(Some(s)) = self.sizes.get_mut(rid) {
            let n = n.min(*s);
            *s -= n;
            self.total_messages -= n;
            if *s == 0 {
                self.sizes.remove(rid);
            }
        }
    }

    /// The database said the queue is empty (or it is gone).
    fn emptied(&mut self, rid: &[u8]) {
        if let Some(s) = self.sizes.remove(rid) {
            self.total_messages -= s.unwrap_or(0);
        }
    }

    /// A SEND's outcome is unknown: the count is, until a read tells.
    fn unknown(&mut self, rid: &[u8]) {
        self.emptied(rid);
        self.sizes.insert(IdKey::new(rid), None);
    }
}

/// A SEND as its statement takes it.
struct WriteArgs {
    rid: Vec<u8>,
    m: MsgRow,
    quota: i32,
    /// Delete messages older than this first.
    expire: Option<i64>,
}

/// `WRITE_MANY`'s parameters: one array per column.
struct WriteColumns {
    rid: Vec<Vec<u8>>,
    mid: Vec<Vec<u8>>,
    ts: Vec<i64>,
    quota: Vec<bool>,
    ntf: Vec<bool>,
    body: Vec<Vec<u8>>,
    lim: Vec<i32>,
    old: Vec<Option<i64>>,
}

impl WriteColumns {
    fn of(args: Vec<WriteArgs>) -> WriteColumns {
        let n = args.len();
        let mut c = WriteColumns {
            rid: Vec::with_capacity(n),
            mid: Vec::with_capacity(n),
            ts: Vec::with_capacity(n),
            quota: Vec::with_capacity(n),
            ntf: Vec::with_capacity(n),
            body: Vec::with_capacity(n),
            lim: Vec::with_capacity(n),
            old: Vec::with_capacity(n),
        };
        for w in args {
            c.rid.push(w.rid);
            c.mid.push(w.m.msg_id);
            c.ts.push(w.m.ts);
            c.quota.push(w.m.quota);
            c.ntf.push(w.m.ntf);
            c.body.push(w.m.body);
            c.lim.push(w.quota);
            c.old.push(w.expire);
        }
        c
    }

    fn params(&self) -> [&(dyn postgres::types::ToSql + Sync); 8] {
        [
            &self.rid,
            &self.mid,
            &self.ts,
            &self.quota,
            &self.ntf,
            &self.body,
            &self.lim,
            &self.old,
        ]
    }
}

/// Hands each operation of a statement its outcome: its own, or the statement's error.
fn reply_each<T>(replies: Vec<Reply<T>>, outcome: Result<Vec<Result<T, StoreError>>, StoreError>) {
    match outcome {
        Ok(each) => {
            for (r, reply) in each.into_iter().zip(replies) {
                let _ = reply.send(r);
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

fn dropped(op: &str) -> StoreError {
    StoreError::Failed(format!("{op}, the job was dropped"))
}

/// Where a job's outcome goes: the operation that waits for it.
type Reply<T> = flume::Sender<Result<T, StoreError>>;

/// An ACK as its statement takes it (recipient ID, message ID), and where its rows go.
type AckArgs = (Vec<u8>, Vec<u8>, Reply<Vec<MsgRow>>);

/// The SENDs and ACKs of the current round (`MessageStore::begin_round`), sent as one statement
/// of each kind when it ends.
#[derive(Default)]
struct Round {
    /// Rounds begun and not ended (they may nest; the outermost end sends).
    depth: u32,
    writes: Vec<(WriteArgs, Reply<Written>)>,
    acks: Vec<AckArgs>,
}

/// The PostgreSQL store of one shard.
pub struct PostgresStore {
    shared: Arc<Shared>,
    /// This shard's partition groups, as the SQL takes them.
    groups: Vec<i32>,
    data: RefCell<Data>,
    round: RefCell<Round>,
    /// Pending notifications (`postgres/ntfs.rs`): the memory store's, which keeps nothing else
    /// here.
    ntf: MemoryStore,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("records", &self.data.borrow().records.len())
            .finish_non_exhaustive()
    }
}

fn unique_violation(e: &postgres::Error) -> bool {
    e.code() == Some(&postgres::error::SqlState::UNIQUE_VIOLATION)
}

fn config_of(s: &StoreSettings) -> Result<&PgConfig, String> {
    s.postgres
        .as_ref()
        .ok_or_else(|| "the PostgreSQL store needs --database CONNINFO".to_string())
}

fn msg_of(m: MsgRow) -> Result<Message, StoreError> {
    m.message().map_err(StoreError::Failed)
}

impl PostgresStore {
    /// Streams the IDs of this shard's queues that `template` (a `load_ids!` statement) selects
    /// to `f`; returns how many.
    fn stream_ids(
        &self,
        op: &'static str,
        template: &str,
        f: &mut dyn FnMut(&RecordIds<'_>),
    ) -> Result<usize, String> {
        let load = sql(template);
        let groups = self.groups.clone();
        self.shared.run_blocking(op, |c| {
            let mut rows = c.client.query_raw(load.as_str(), [&groups])?;
            let mut n = 0usize;
            while let Some(row) = rows.next()? {
                n += 1;
                f(&RecordIds {
                    recipient_id: row.get(0),
                    sender_id: row.get(1),
                    link_id: row.get(2),
                    notifier_id: row.get(3),
                    rcv_service_id: row.get(4),
                    ntf_service_id: row.get(5),
                });
            }
            Ok(n)
        })
    }

    /// The shard's count of its queues and notifiers: asked once (`send`: when the shard starts
    /// serving, or when a command that opened the store without serving wants it), and its
    /// answer taken once it came (`wait`: waited for). Until then the counts are the catalogue's
    /// estimate and the changes since.
    fn counted(&self, send: bool, wait: bool) {
        let mut d = self.data.borrow_mut();
        if send && !d.queues_counted && !d.count_sent {
            d.count_sent = true;
            d.counting = Some(Counting {
                answer: ask_counts(&self.shared, None),
                queues_since: 0,
                notifiers_since: 0,
            });
        }
        d.take_count(&self.groups, wait);
    }

    /// One association statement for the known queues of `ids` that `eligible` keeps:
    /// `ASSOCIATE_MANY` (with `updated_at`) for recipients, `ASSOCIATE_NTF_MANY` for notifiers;
    /// `set` applies it to the cached record of each row the database changed.
    async fn associate_rows(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
        updated_at: Option<i64>,
        eligible: impl Fn(&QueueRec) -> bool,
        set: impl Fn(&mut QueueRec, Option<EntityId>),
    ) -> Result<Vec<QueueRec>, StoreError> {
        let known: Vec<EntityId> = {
            let data = self.data.borrow();
            ids.iter()
                .filter(|rid| data.records.get(rid).is_some_and(&eligible))
                .cloned()
                .collect()
        };
        if known.is_empty() {
            return Ok(Vec::new());
        }
        let svc = service.cloned();
        let changed: Vec<EntityId> = self
            .shared
            .run("associate", move |c| {
                let rows = match updated_at {
                    Some(t) => {
                        let st = c.stmt(ASSOCIATE_MANY)?;
                        c.client.query(&st, &[&svc, &t, &known])?
                    }
                    None => {
                        let st = c.stmt(ASSOCIATE_NTF_MANY)?;
                        c.client.query(&st, &[&svc, &known])?
                    }
                };
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await?;
        let mut data = self.data.borrow_mut();
        let mut out = Vec::with_capacity(changed.len());
        for rid in changed {
            if let Some(q) = data.records.get_mut(&rid) {
                set(q, service.cloned());
                out.push(q.clone());
            }
        }
        Ok(out)
    }

    /// A SEND: the write, after deleting messages older than `expire` when given (one statement
    /// either way). Returns how many expired and what the write did.
    async fn write_expiring(
        &self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
        expire: Option<i64>,
    ) -> Result<(usize, WriteOutcome), StoreError> {
        self.data.borrow_mut().counters.store_writes += 1;
        if !self.data.borrow().records.contains(recipient_id) {
            return Err(StoreError::NotFound);
        }
        // Nothing to expire in a queue known to be empty.
        let expire = expire.filter(|_| self.data.borrow().may_have_messages(recipient_id));
        let m = MsgRow::of(&msg);
        // Kept for the look-up after an ambiguous failure; the row, body and all, goes to the job.
        let msg_id = m.msg_id.clone();
        let rid = recipient_id.to_vec();
        let quota = i32::try_from(quota).unwrap_or(i32::MAX);
        let written = self
            .write_rows(WriteArgs {
                rid: rid.clone(),
                m,
                quota,
                expire,
            })
            .await;
        let written = match written {
            Ok(w) => w,
            Err(e) if outcome_unknown(&e) => {
                // Committed or not: the message ID says (it is unique per queue), once the session
                // the write ran in has ended (`pool::settle`): until then a write blocked in it
                // may still commit. Whatever the look finds, the cached count is dropped until a
                // read tells (what expired is not known, and a write found later must not hide
                // behind a count of 0 from SUB and GET).
                let was_empty = !self.data.borrow().may_have_messages(recipient_id);
                self.data.borrow_mut().unknown(recipient_id);
                let backend = pool::lost_backend(&e);
                // The look-up may get a pooled connection that broke with the write's (every
                // session terminated, the server restarted): each such one leaves the pool, so it
                // is tried again, at most once per pooled connection and once more on a new one.
                let mut tries = self.shared.config.pool_size.clamp(1, pool::MAX_POOL_SIZE) + 1;
                let found = loop {
                    let (rid, id) = (rid.clone(), msg_id.clone());
                    let found = self
                        .shared
                        .run("write_message, checking a broken write", move |c| {
                            if let Some(pid) = backend {
                                if !pool::settle(c, pid)? {
                                    return Ok(Lookup::StillRunning(pid));
                                }
                            }
                            let st = c.stmt(FIND_MSG)?;
                            Ok(match c.client.query_opt(&st, &[&rid, &id])? {
                                Some(r) => Lookup::Found(r.get::<_, bool>(0)),
                                None => Lookup::Absent,
                            })
                        })
                        .await;
                    tries -= 1;
                    match found {
                        Err(le) if outcome_unknown(&le) && tries > 0 => continue,
                        other => break other,
                    }
                };
                match found {
                    Ok(Lookup::Found(marker)) => Written {
                        outcome: Some((marker, was_empty)),
                        expired: 0,
                    },
                    Ok(Lookup::Absent) => return Err(e),
                    Ok(Lookup::StillRunning(pid)) => {
                        return Err(StoreError::Uncertain(format!(
                            "the database session of a SEND was lost, and its server process \
                             {pid} did not end when told to: the SEND may still be written"
                        )))
                    }
                    Err(_) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let expired = usize::try_from(written.expired).unwrap_or(0);
        let mut d = self.data.borrow_mut();
        d.remove(recipient_id, expired);
        Ok((
            expired,
            match written.outcome {
                None => WriteOutcome::Full,
                Some((marker, was_empty)) => {
                    d.add(recipient_id, 1);
                    if marker {
                        WriteOutcome::QuotaMarker { was_empty }
                    } else {
                        WriteOutcome::Written { was_empty }
                    }
                }
            },
        ))
    }

    /// A SEND's statement: queued for the end of the round if one is open, else sent now.
    async fn write_rows(&self, w: WriteArgs) -> Result<Written, StoreError> {
        let (tx, rx) = flume::bounded(1);
        let now = {
            let mut r = self.round.borrow_mut();
            if r.depth > 0 {
                r.writes.push((w, tx));
                None
            } else {
                Some((w, tx))
            }
        };
        if let Some(w) = now {
            self.send_writes(vec![w]);
        }
        rx.recv_async()
            .await
            .unwrap_or_else(|_| Err(dropped("write_message")))
    }

    /// An ACK's `try_del_peek_msg` rows, queued for the end of the round if one is open.
    async fn del_peek_rows(&self, rid: Vec<u8>, id: Vec<u8>) -> Result<Vec<MsgRow>, StoreError> {
        let (tx, rx) = flume::bounded(1);
        let now = {
            let mut r = self.round.borrow_mut();
            if r.depth > 0 {
                r.acks.push((rid, id, tx));
                None
            } else {
                Some((rid, id, tx))
            }
        };
        if let Some(a) = now {
            self.send_acks(vec![a]);
        }
        rx.recv_async()
            .await
            .unwrap_or_else(|_| Err(dropped("ack")))
    }

    /// One job for `writes`: the single SEND's statement, or `WRITE_MANY` for several.
    fn send_writes(&self, writes: Vec<(WriteArgs, Reply<Written>)>) {
        if writes.is_empty() {
            return;
        }
        let (mut args, replies): (Vec<WriteArgs>, Vec<Reply<Written>>) = writes.into_iter().unzip();
        let submitted = if args.len() == 1 {
            let WriteArgs {
                rid,
                m,
                quota,
                expire,
            } = args.remove(0);
            let reply = replies[0].clone();
            self.shared.submit(
                "write_message",
                move |c| match expire {
                    // `write_message` returns no row when it wrote nothing.
                    None => {
                        let st = c.stmt(WRITE)?;
                        let row = c.client.query_opt(
                            &st,
                            &[&rid, &m.msg_id, &m.ts, &m.quota, &m.ntf, &m.body, &quota],
                        )?;
                        Ok(Written {
                            outcome: row.map(|r| (r.get(0), r.get(1))),
                            expired: 0,
                        })
                    }
                    // One row always: the write's columns are NULL when it wrote nothing.
                    Some(old) => {
                        let st = c.stmt(EXPIRE_AND_WRITE)?;
                        let r = c.client.query_one(
                            &st,
                            &[
                                &rid, &m.msg_id, &m.ts, &m.quota, &m.ntf, &m.body, &quota, &old,
                            ],
                        )?;
                        Ok(Written {
                            outcome: r.get::<_, Option<bool>>(0).zip(r.get::<_, Option<bool>>(1)),
                            expired: r.get(2),
                        })
                    }
                },
                move |r| {
                    let _ = reply.send(r);
                },
            )
        } else {
            let n = args.len();
            let cols = WriteColumns::of(args);
            let to = replies.clone();
            self.shared.submit(
                "write_message",
                move |c| {
                    let st = c.stmt(WRITE_MANY)?;
                    let rows = c.client.query(&st, &cols.params())?;
                    let mut out: Vec<Option<Written>> = (0..n).map(|_| None).collect();
                    for r in rows {
                        let i = usize::try_from(r.get::<_, i64>(0) - 1).unwrap_or(usize::MAX);
                        if let Some(slot) = out.get_mut(i) {
                            *slot = Some(Written {
                                outcome: r
                                    .get::<_, Option<bool>>(1)
                                    .zip(r.get::<_, Option<bool>>(2)),
                                expired: r.get(3),
                            });
                        }
                    }
                    Ok(out)
                },
                move |r: Result<Vec<Option<Written>>, StoreError>| {
                    let each = r.map(|out| {
                        out.into_iter()
                            .map(|w| {
                                w.ok_or_else(|| {
                                    StoreError::Failed("write_message, no row for a message".into())
                                })
                            })
                            .collect()
                    });
                    reply_each(to, each)
                },
            )
        };
        if let Err(e) = submitted {
            reply_each(replies, Err(e));
        }
    }

    /// One job for `acks`: `ACK_MANY`, or `TRY_DEL_PEEK_MANY` if two are on one queue.
    fn send_acks(&self, acks: Vec<AckArgs>) {
        if acks.is_empty() {
            return;
        }
        let mut rids = Vec::with_capacity(acks.len());
        let mut ids = Vec::with_capacity(acks.len());
        let mut replies = Vec::with_capacity(acks.len());
        for (rid, id, reply) in acks {
            rids.push(rid);
            ids.push(id);
            replies.push(reply);
        }
        let n = rids.len();
        let to = replies.clone();
        let submitted = self.shared.submit(
            "ack",
            move |c| {
                let mut out: Vec<Vec<MsgRow>> = (0..n).map(|_| Vec::new()).collect();
                let distinct = rids.iter().collect::<std::collections::HashSet<_>>().len() == n;
                let st = c.stmt(if distinct {
                    ACK_MANY
                } else {
                    TRY_DEL_PEEK_MANY
                })?;
                for r in c.client.query(&st, &[&rids, &ids])? {
                    let i = usize::try_from(r.get::<_, i64>(0) - 1).unwrap_or(usize::MAX);
                    if let Some(rows) = out.get_mut(i) {
                        rows.push(MsgRow::read(&r, 1));
                    }
                }
                Ok(out)
            },
            move |r: Result<Vec<Vec<MsgRow>>, StoreError>| {
                reply_each(to, r.map(|out| out.into_iter().map(Ok).collect()))
            },
        );
        if let Err(e) = submitted {
            reply_each(replies, Err(e));
        }
    }

    async fn read_head(&self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        let rid = recipient_id.to_vec();
        let row = self
            .shared
            .run("peek", move |c| {
                let st = c.stmt(PEEK)?;
                Ok(c.client
                    .query_opt(&st, &[&rid])?
                    .map(|r| MsgRow::read(&r, 0)))
            })
            .await?;
        match row {
            None => {
                self.data.borrow_mut().emptied(recipient_id);
                Ok(None)
            }
            Some(m) => msg_of(m).map(Some),
        }
    }
}

impl QueueStore for PostgresStore {
    fn with_queue<R>(&self, recipient_id: &[u8], f: impl FnOnce(&QueueRec) -> R) -> Option<R> {
        self.data.borrow().records.get(recipient_id).map(f)
    }

    /// Every record, read from the database as it streams (the offline tools, the tests): the
    /// shard holds only those in use.
    fn for_each_queue(&self, f: &mut dyn FnMut(&QueueRec)) {
        let load = sql(LOAD_ALL);
        let groups = self.groups.clone();
        let read = self.shared.run_blocking("reading every queue", |c| {
            let mut rows = c.client.query_raw(load.as_str(), [&groups])?;
            let mut bad = None;
            while let Some(row) = rows.next()? {
                match rec_of(&row) {
                    Ok(rec) => f(&rec),
                    Err(e) => bad = bad.or(Some(e)),
                }
            }
            Ok(bad)
        });
        match read {
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => tracing::error!("{e}"),
        }
    }

    /// Every queue's IDs, streamed from the database without reading its record.
    fn for_each_queue_ids(&self, f: &mut dyn FnMut(&RecordIds<'_>)) -> Result<(), String> {
        let counted = self.stream_ids("reading the queues' IDs", LOAD_IDS, f)?;
        // No command is served before the IDs are read, so the stream's count is the shard's.
        let mut d = self.data.borrow_mut();
        (d.queues, d.queues_counted) = (counted, true);
        Ok(())
    }

    fn for_each_service_queue_ids(&self, f: &mut dyn FnMut(&RecordIds<'_>)) -> Result<(), String> {
        self.stream_ids(
            "reading the queues associated with services",
            LOAD_SERVICE_IDS,
            f,
        )
        .map(drop)
    }

    fn serving(&self) {
        self.counted(true, false);
    }

    fn notifier_count(&self) -> Option<usize> {
        self.counted(false, false);
        Some(self.data.borrow().notifiers)
    }

    fn queue_count(&self) -> usize {
        self.counted(true, true);
        if !self.data.borrow().queues_counted {
            // Not counted by a start's ID stream (store export and import open the store
            // without one): counted here, once; later creations and deletions keep it.
            let count = sql(COUNT_QUEUES);
            let groups = self.groups.clone();
            match self.shared.run_blocking("counting queues", |c| {
                let n: i64 = c.client.query_one(count.as_str(), &[&groups])?.get(0);
                Ok(usize::try_from(n).unwrap_or(0))
            }) {
                Ok(n) => {
                    let mut d = self.data.borrow_mut();
                    (d.queues, d.queues_counted) = (n, true);
                }
                Err(e) => tracing::warn!(error = %e, "counting the shard's queues"),
            }
        }
        self.data.borrow().queues
    }

    /// The count if it came, else the estimate; never waits, never sends the count.
    fn queue_count_estimate(&self) -> usize {
        self.counted(false, false);
        self.data.borrow().queues
    }

    fn holds_every_record(&self) -> bool {
        false
    }

    /// Pins the held records of `rids` and reads the others in one statement (`LOAD_RECORDS`),
    /// then evicts down to the bound what no job and no `keep` holds.
    async fn prepare(
        &self,
        rids: &[&[u8]],
        keep: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let missing: Vec<Vec<u8>> = {
            let mut d = self.data.borrow_mut();
            rids.iter()
                .filter(|r| !d.records.pin(r))
                .map(|r| r.to_vec())
                .collect()
        };
        if missing.is_empty() {
            // Queues created since the last read may have taken the cache over its bound.
            let mut d = self.data.borrow_mut();
            d.counters.store_records_evicted += d.records.evict(keep) as u64;
            return Ok(());
        }
        let asked = missing.clone();
        let read = self
            .shared
            .run("reading queue records", move |c| {
                let st = c.stmt(LOAD_RECORDS)?;
                Ok(c.client
                    .query(&st, &[&asked])?
                    .iter()
                    .map(rec_of)
                    .collect::<Vec<_>>())
            })
            .await;
        let mut d = self.data.borrow_mut();
        d.counters.store_records_read += missing.len() as u64;
        let mut failed = None;
        match read {
            Ok(recs) => {
                for rec in recs {
                    match rec {
                        Ok(rec) => d.records.insert(rec),
                        Err(e) => failed = failed.or(Some(StoreError::Failed(e))),
                    }
                }
            }
            Err(e) => failed = Some(e),
        }
        // Every asked queue is pinned once per time it was asked, whatever the read gave, as the
        // job's `release` (which follows an error too) unpins it: a record read now, or none (a
        // NEW of the job may create it).
        for rid in &missing {
            if !d.records.pin(rid) {
                d.records.pin_absent(rid);
            }
        }
        d.counters.store_records_evicted += d.records.evict(keep) as u64;
        failed.map_or(Ok(()), Err)
    }

    fn release(&self, rids: &[&[u8]]) {
        let mut d = self.data.borrow_mut();
        for r in rids {
            d.records.unpin(r);
        }
    }

    async fn create(&self, rec: QueueRec) -> Result<(), StoreError> {
        if self.data.borrow().records.contains(&rec.recipient_id) {
            return Err(StoreError::Duplicate);
        }
        let row = RecRow::of(&rec);
        let inserted = self
            .shared
            .run("create", move |c| {
                let st = c.stmt(INSERT_QUEUE)?;
                match c.client.execute(&st, &row.params()) {
                    Ok(_) => Ok(true),
                    Err(e) if unique_violation(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await?;
        if !inserted {
            return Err(StoreError::Duplicate);
        }
        let mut d = self.data.borrow_mut();
        d.count_change(1, i64::from(rec.notifier.is_some()));
        d.records.insert(rec);
        Ok(())
    }

    async fn update(&self, rec: QueueRec) -> Result<(), StoreError> {
        let row = RecRow::of(&rec);
        let changed = self
            .shared
            .run("update", move |c| {
                let st = c.stmt(UPDATE_QUEUE)?;
                match c.client.execute(&st, &row.params()) {
                    Ok(n) => Ok(Some(n)),
                    Err(e) if unique_violation(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        match changed {
            None => Err(StoreError::Duplicate),
            Some(0) => Err(StoreError::NotFound),
            Some(_) => {
                let mut d = self.data.borrow_mut();
                let had = d
                    .records
                    .get(&rec.recipient_id)
                    .map(|q| q.notifier.is_some());
                if let Some(had) = had {
                    let has = rec.notifier.is_some();
                    d.count_change(0, i64::from(has) - i64::from(had));
                }
                if let Some(q) = d.records.get_mut(&rec.recipient_id) {
                    *q = rec;
                }
                Ok(())
            }
        }
    }

    async fn associate_many(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
        updated_at: i64,
    ) -> Result<Vec<QueueRec>, StoreError> {
        self.associate_rows(
            ids,
            service,
            Some(updated_at),
            |_| true,
            |q, svc| {
                q.rcv_service_id = svc;
                q.updated_at = Some(updated_at);
            },
        )
        .await
    }

    async fn associate_notifiers_many(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
    ) -> Result<Vec<QueueRec>, StoreError> {
        self.associate_rows(
            ids,
            service,
            None,
            |q| q.notifier.is_some(),
            |q, svc| {
                if let Some(n) = q.notifier.as_mut() {
                    n.ntf_service_id = svc;
                }
            },
        )
        .await
    }

    /// Deletes a queue the job prepared (a queue the database does not have is not held).
    async fn delete(&self, recipient_id: &[u8]) -> Result<QueueRec, StoreError> {
        if !self.data.borrow().records.contains(recipient_id) {
            return Err(StoreError::NotFound);
        }
        let rid = recipient_id.to_vec();
        let n = self
            .shared
            .run("delete", move |c| {
                let st = c.stmt(DELETE_QUEUE)?;
                c.client.execute(&st, &[&rid])
            })
            .await?;
        let rec = {
            let mut d = self.data.borrow_mut();
            d.counters.store_deletes += 1;
            d.emptied(recipient_id);
            let rec = d.records.remove(recipient_id).ok_or(StoreError::NotFound)?;
            if n > 0 {
                d.count_change(-1, -i64::from(rec.notifier.is_some()));
            }
            rec
        };
        if let Some(n) = &rec.notifier {
            let _ = self.ntf.delete_ntfs(&n.notifier_id).await;
        }
        Ok(rec)
    }
}

impl MessageStore for PostgresStore {
    async fn write(
        &self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError> {
        self.write_expiring(recipient_id, msg, quota, None)
            .await
            .map(|(_, o)| o)
    }

    async fn expire_and_write(
        &self,
        recipient_id: &[u8],
        older_than: i64,
        msg: Message,
        quota: usize,
    ) -> Result<(usize, WriteOutcome), StoreError> {
        self.write_expiring(recipient_id, msg, quota, Some(older_than))
            .await
    }

    async fn peek_first(&self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        self.data.borrow_mut().counters.store_peek_first_calls += 1;
        if !self.data.borrow().may_have_messages(recipient_id) {
            return Ok(None);
        }
        self.read_head(recipient_id).await
    }

    async fn peek_first_many(
        &self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        let asked: Vec<Vec<u8>> = {
            let mut d = self.data.borrow_mut();
            d.counters.store_peek_first_many_calls += 1;
            recipient_ids
                .iter()
                .filter(|r| d.may_have_messages(r))
                .map(|r| r.to_vec())
                .collect()
        };
        let mut heads: HashMap<Vec<u8>, MsgRow> = HashMap::new();
        if !asked.is_empty() {
            let rows = self
                .shared
                .run("peek_many", move |c| {
                    let st = c.stmt(PEEK_MANY)?;
                    Ok(c.client
                        .query(&st, &[&asked])?
                        .iter()
                        .map(|r| (r.get::<_, Vec<u8>>(0), MsgRow::read(r, 1)))
                        .collect::<Vec<_>>())
                })
                .await?;
            heads.extend(rows);
        }
        // A block may subscribe one queue more than once: each gets the head.
        recipient_ids
            .iter()
            .map(|r| heads.get(*r).cloned().map(msg_of).transpose())
            .collect()
    }

    async fn try_del(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError> {
        self.data.borrow_mut().counters.store_deletes += 1;
        if !self.data.borrow().may_have_messages(recipient_id) {
            return Ok(None);
        }
        let (rid, id) = (recipient_id.to_vec(), msg_id.to_vec());
        let row = self
            .shared
            .run("try_del_msg", move |c| {
                let st = c.stmt(TRY_DEL)?;
                Ok(c.client
                    .query_opt(&st, &[&rid, &id])?
                    .map(|r| MsgRow::read(&r, 0)))
            })
            .await?;
        match row {
            Some(m) => {
                self.data.borrow_mut().remove(recipient_id, 1);
                msg_of(m).map(Some)
            }
            None => Ok(None),
        }
    }

    async fn try_del_peek(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        self.data.borrow_mut().counters.store_deletes += 1;
        if !self.data.borrow().may_have_messages(recipient_id) {
            return Ok((None, None));
        }
        let rows = self
            .del_peek_rows(recipient_id.to_vec(), msg_id.to_vec())
            .await?;
        let mut rows = rows.into_iter();
        let (first, second) = (rows.next(), rows.next());
        let mut d = self.data.borrow_mut();
        match (first, second) {
            (None, _) => {
                d.emptied(recipient_id);
                Ok((None, None))
            }
            (Some(a), None) if a.msg_id == msg_id => {
                d.emptied(recipient_id);
                Ok((Some(msg_of(a)?), None))
            }
            (Some(a), None) => Ok((None, Some(msg_of(a)?))),
            (Some(a), Some(b)) => {
                d.remove(recipient_id, 1);
                Ok((Some(msg_of(a)?), Some(msg_of(b)?)))
            }
        }
    }

    async fn delete_expired(
        &self,
        recipient_id: &[u8],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        if !self.data.borrow().may_have_messages(recipient_id) {
            return Ok(0);
        }
        let rid = recipient_id.to_vec();
        let n = self
            .shared
            .run("delete_expired_msgs", move |c| {
                let st = c.stmt(DELETE_EXPIRED)?;
                Ok(c.client
                    .query_one(&st, &[&rid, &older_than])?
                    .get::<_, i64>(0))
            })
            .await?;
        let n = usize::try_from(n).unwrap_or(0);
        self.data.borrow_mut().remove(recipient_id, n);
        Ok(n)
    }

    fn size(&self, recipient_id: &[u8]) -> usize {
        self.data
            .borrow()
            .sizes
            .get(recipient_id)
            .copied()
            .flatten()
            .unwrap_or(0)
    }

    fn total_messages(&self) -> usize {
        self.data.borrow().total_messages
    }

    async fn expire_all(&self, older_than: i64) -> Result<usize, StoreError> {
        let ids = self.data.borrow().holding();
        let mut total = 0;
        for chunk in ids.chunks(EXPIRE_CHUNK) {
            total += self.expire_queues(chunk, older_than).await?;
        }
        Ok(total)
    }

    fn expiry_candidates(&self) -> Vec<EntityId> {
        self.data.borrow().holding()
    }

    async fn expire_queues(
        &self,
        recipient_ids: &[EntityId],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        let asked: Vec<EntityId> = {
            let d = self.data.borrow();
            recipient_ids
                .iter()
                .filter(|r| d.may_have_messages(r))
                .cloned()
                .collect()
        };
        if asked.is_empty() {
            return Ok(0);
        }
        let done = self
            .shared
            .run("expire", move |c| {
                let st = c.stmt(EXPIRE_MANY)?;
                Ok(c.client
                    .query(&st, &[&asked, &older_than])?
                    .iter()
                    .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, i64>(1)))
                    .collect::<Vec<_>>())
            })
            .await?;
        let mut d = self.data.borrow_mut();
        let mut total = 0;
        for (rid, n) in done {
            let n = usize::try_from(n).unwrap_or(0);
            d.remove(&rid, n);
            total += n;
        }
        Ok(total)
    }

    fn waits(&self) -> bool {
        true
    }

    fn begin_round(&self) {
        self.round.borrow_mut().depth += 1;
    }

    fn end_round(&self) {
        let (writes, acks) = {
            let mut r = self.round.borrow_mut();
            r.depth = r.depth.saturating_sub(1);
            if r.depth > 0 {
                return;
            }
            (std::mem::take(&mut r.writes), std::mem::take(&mut r.acks))
        };
        self.send_writes(writes);
        self.send_acks(acks);
    }

    async fn add_ntf(&self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError> {
        self.ntf.add_ntf(notifier_id, ntf).await
    }

    async fn take_ntfs(
        &self,
        notifier_id: &[u8],
        max: usize,
    ) -> Result<(Vec<MsgNtf>, bool), StoreError> {
        self.ntf.take_ntfs(notifier_id, max).await
    }

    async fn return_ntfs(&self, notifier_id: &[u8], ntfs: Vec<MsgNtf>) -> Result<(), StoreError> {
        self.ntf.return_ntfs(notifier_id, ntfs).await
    }

    async fn delete_ntfs(&self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        self.ntf.delete_ntfs(notifier_id).await
    }

    fn ntf_ids(&self) -> Vec<EntityId> {
        self.ntf.ntf_ids()
    }

    fn ntf_count(&self) -> usize {
        self.ntf.ntf_count()
    }

    async fn expire_ntfs(&self, older_than: i64) -> Result<usize, StoreError> {
        self.ntf.expire_ntfs(older_than).await
    }

    async fn messages(&self, recipient_id: &[u8]) -> Result<Vec<Message>, StoreError> {
        let rid = recipient_id.to_vec();
        let rows = self
            .shared
            .run("messages", move |c| {
                let st = c.stmt(ALL_MESSAGES)?;
                Ok(c.client
                    .query(&st, &[&rid])?
                    .iter()
                    .map(|r| MsgRow::read(r, 0))
                    .collect::<Vec<_>>())
            })
            .await?;
        rows.into_iter().map(msg_of).collect()
    }

    async fn ntfs(&self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError> {
        self.ntf.ntfs(notifier_id).await
    }

    fn counters(&self) -> StoreCounters {
        self.data.borrow().counters
    }
}

/// Asks for the relay's count by group (`postgres/counts.rs`): sent by the first to ask (a start,
/// before its shards serve), shared with those that ask while it runs, kept once made. The count
/// reads one snapshot, taken before it scans; `snapshot` is told once it is taken.
fn ask_counts(
    shared: &Shared,
    snapshot: Option<flume::Sender<()>>,
) -> flume::Receiver<counts::Answer> {
    let (tx, rx) = flume::bounded(1);
    let state = shared.counts.clone();
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    match &mut *st {
        counts::State::Done(c) => {
            let _ = tx.send(Ok(c.clone()));
        }
        counts::State::Running { waiting, scan, .. } => {
            waiting.push(tx);
            if let Some(go) = scan.take() {
                let _ = go.send(());
            }
        }
        counts::State::Idle => {
            // A start's count (told of its snapshot) scans once a shard serves; another at once.
            let (scan, scan_when) = match snapshot.is_some() {
                true => {
                    let (go, when) = flume::bounded(1);
                    (Some(go), Some(when))
                }
                false => (None, None),
            };
            *st = counts::State::Running {
                waiting: vec![tx],
                pid: None,
                cancelled: false,
                scan,
            };
            let (running, done) = (state.clone(), state.clone());
            let count = sql(COUNT_BY_GROUP);
            let sent = shared.spawn_own(
                "counting queues",
                move |c| {
                    if let counts::State::Running { pid, cancelled, .. } =
                        &mut *running.lock().unwrap_or_else(|e| e.into_inner())
                    {
                        if *cancelled {
                            return Ok(None);
                        }
                        *pid = Some(c.pid);
                    }
                    let mut by_group = [(0i64, 0i64); PARTITION_GROUPS as usize];
                    // One pass over the whole table, in the background: not bound by the
                    // statements' timeout (a stop ends it instead), and on one process of the
                    // database's, not its parallel workers too (they would take every core from
                    // the relay's start and from the commands meanwhile). Its snapshot is the
                    // transaction's first read.
                    let mut tx = c.client.transaction()?;
                    tx.batch_execute(
                        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
                         SET LOCAL statement_timeout = 0; \
                         SET LOCAL max_parallel_workers_per_gather = 0; SELECT 1",
                    )?;
                    if let Some(s) = &snapshot {
                        let _ = s.try_send(());
                    }
                    if let Some(when) = &scan_when {
                        // Told, or its sender gone (a start that failed): either way, go on.
                        let _ = when.recv_timeout(COUNT_SNAPSHOT_WAIT);
                    }
                    let rows = tx.query(count.as_str(), &[])?;
                    tx.commit()?;
                    for r in rows {
                        if let Some(slot) = usize::try_from(r.get::<_, i32>(0))
                            .ok()
                            .and_then(|g| by_group.get_mut(g))
                        {
                            *slot = (r.get(1), r.get(2));
                        }
                    }
                    Ok(Some(by_group))
                },
                move |r| {
                    let answer = match r {
                        Ok(Some(c)) => Ok(Arc::new(c)),
                        Ok(None) => Err("cancelled by the stop".to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    counts::answer(&mut done.lock().unwrap_or_else(|e| e.into_inner()), answer);
                },
            );
            if let Err(e) = sent {
                counts::answer(&mut st, Err(e.to_string()));
            }
        }
    }
    rx
}

/// How long a start waits for the count's snapshot (a pooled connection and two round trips),
/// and the count, its snapshot taken, for a shard to serve.
const COUNT_SNAPSHOT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Stops the relay's count if it still runs (a stop: the server would otherwise run it to its
/// end after the relay left): one not begun does not begin, and the session of one that has is
/// ended (not only its statement cancelled, which would miss a statement about to be sent).
fn cancel_count(shared: &Shared) {
    let pid = match &mut *shared.counts.lock().unwrap_or_else(|e| e.into_inner()) {
        counts::State::Running { pid, cancelled, .. } => {
            *cancelled = true;
            *pid
        }
        _ => None,
    };
    if let Some(pid) = pid {
        let cancelled = shared.run_blocking("cancelling the count of queues", |c| {
            c.client.execute("SELECT pg_terminate_backend($1)", &[&pid])
        });
        if let Err(e) = cancelled {
            tracing::warn!(error = %e, "the count of queues was not cancelled");
        }
    }
}

/// The directory's source of the IDs it does not hold (`ShardStore::id_source`): the table's
/// unique indexes, one statement for the IDs of one space.
struct PgIds {
    shared: Arc<Shared>,
}

impl IdSource for PgIds {
    fn find(&self, space: IdSpace, ids: Vec<EntityId>) -> IdsFound {
        let (tx, rx) = flume::bounded(1);
        let stmt = match space {
            IdSpace::Sender => FIND_SENDERS,
            IdSpace::Link => FIND_LINKS,
            IdSpace::Notifier => FIND_NOTIFIERS,
        };
        let answer = tx.clone();
        let sent = self.shared.submit(
            "looking up IDs",
            move |c| {
                let st = c.stmt(stmt)?;
                let rows = c.client.query(&st, &[&ids])?;
                Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
            },
            move |r: Result<Vec<(EntityId, EntityId)>, StoreError>| {
                let _ = answer.send(r.map_err(|e| e.to_string()));
            },
        );
        if let Err(e) = sent {
            let _ = tx.send(Err(e.to_string()));
        }
        rx
    }
}

impl ShardStore for PostgresStore {
    fn open(s: &StoreSettings, groups: &[u32], now: i64) -> Result<Self, String> {
        let config = config_of(s)?;
        let shared = Shared::get(config, HOT_STATEMENTS)?;
        let groups_i: Vec<i32> = groups.iter().map(|&g| g as i32).collect();
        let mut data = Data::new(config.queue_cache);
        let sizes = sql(LOAD_SIZES);
        let rows_estimate = shared.run_blocking("estimating the queues", |c| {
            let n: i64 = c.client.query_one(ESTIMATE_ROWS, &[])?.get(0);
            Ok(usize::try_from(n).unwrap_or(0))
        })?;
        // This shard's share of the partition groups; exact once the relay's count comes.
        data.queues = rows_estimate * groups.len() / crate::store::PARTITION_GROUPS as usize;
        let rows = shared.run_blocking("reading message counts", |c| {
            c.client.query(sizes.as_str(), &[&groups_i])
        })?;
        for row in &rows {
            let n = usize::try_from(row.get::<_, i64>(1)).unwrap_or(0);
            data.add(row.get(0), n);
        }
        drop(rows);
        // As the other stores load only what is young enough: messages past the lifetime go now,
        // in short statements over this shard's queues (`EXPIRE_CHUNK`).
        if s.message_ttl_secs < i64::MAX {
            let older_than = now.saturating_sub(s.message_ttl_secs);
            let holding = data.holding();
            for chunk in holding.chunks(EXPIRE_CHUNK) {
                let done = shared.run_blocking("expiring messages at start", |c| {
                    c.client.query(EXPIRE_MANY, &[&chunk, &older_than])
                })?;
                for r in done {
                    let n = usize::try_from(r.get::<_, i64>(1)).unwrap_or(0);
                    data.remove(&r.get::<_, Vec<u8>>(0), n);
                }
            }
        }
        let ntf = MemoryStore::new();
        let dir = ntfs::store_dir(&s.data_dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for (nid, list) in ntfs::load(&dir, groups, now.saturating_sub(s.ntf_ttl_secs))? {
            futures_lite::future::block_on(ntf.return_ntfs(&nid, list))
                .map_err(|e| e.to_string())?;
        }
        Ok(PostgresStore {
            shared,
            groups: groups_i,
            data: RefCell::new(data),
            round: RefCell::default(),
            ntf,
        })
    }

    fn id_source(s: &StoreSettings) -> Result<Option<Arc<dyn IdSource>>, String> {
        let shared = Shared::get(config_of(s)?, HOT_STATEMENTS)?;
        Ok(Some(Arc::new(PgIds { shared })))
    }

    /// Also sends the relay's count of queues and notifiers and waits until it has taken its
    /// snapshot (a moment): every change the shards make once they serve comes after it, so the
    /// count and the changes each shard keeps since make its exact count.
    fn all_opened(s: &StoreSettings) -> Result<(), String> {
        let dir = ntfs::store_dir(&s.data_dir);
        let c = config_of(s)?;
        ntfs::remember_connection(&dir, &c.conninfo, &c.schema)?;
        let shared = Shared::get(c, HOT_STATEMENTS)?;
        {
            // A count made for an earlier start in this process is not this one's.
            let mut st = shared.counts.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(*st, counts::State::Done(_)) {
                *st = counts::State::Idle;
            }
        }
        let (taken, snapshot) = flume::bounded(1);
        // The answer goes to the shards, which ask as they begin to serve.
        drop(ask_counts(&shared, Some(taken)));
        if snapshot.recv_timeout(COUNT_SNAPSHOT_WAIT).is_err() {
            tracing::warn!(
                "the count of queues has not begun: the counts may miss the first changes"
            );
        }
        ntfs::set_aside(&dir)
    }

    fn close(self, s: &StoreSettings, groups: &[u32]) -> Result<(), String> {
        cancel_count(&self.shared);
        self.save_running(s, groups)
    }

    /// The pending notifications, kept in memory, go to their files (everything else is in the
    /// database already).
    fn save_running(&self, s: &StoreSettings, groups: &[u32]) -> Result<(), String> {
        let dir = ntfs::store_dir(&s.data_dir);
        let mut by_group: HashMap<u32, Vec<(EntityId, Vec<MsgNtf>)>> = HashMap::new();
        let waiting = self.ntf.ntf_ids();
        // The queue of each notifier with notifications (its group names the file).
        let queues: HashMap<Vec<u8>, Vec<u8>> = if waiting.is_empty() {
            HashMap::new()
        } else {
            self.shared
                .run_blocking("finding the notifiers' queues", |c| {
                    c.client.query(NOTIFIER_QUEUES, &[&waiting])
                })?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect()
        };
        for nid in waiting {
            let Some(rid) = queues.get(&nid) else {
                continue;
            };
            let list =
                futures_lite::future::block_on(self.ntf.ntfs(&nid)).map_err(|e| e.to_string())?;
            if !list.is_empty() {
                by_group.entry(group_of(rid)).or_default().push((nid, list));
            }
        }
        for &g in groups {
            ntfs::save(&dir, g, by_group.get(&g).map_or(&[][..], Vec::as_slice))?;
        }
        Ok(())
    }

    fn find_offline(s: &StoreSettings, id: &[u8]) -> Result<Option<QueueRec>, String> {
        let shared = Shared::get(config_of(s)?, HOT_STATEMENTS)?;
        let q = sql(FIND_OFFLINE);
        let row = shared.run_blocking("finding the queue", |c| {
            c.client.query_opt(q.as_str(), &[&id])
        })?;
        row.as_ref().map(rec_of).transpose()
    }

    fn set_status_offline(
        s: &StoreSettings,
        sender_id: &[u8],
        status: QueueStatus,
    ) -> Result<(), String> {
        let shared = Shared::get(config_of(s)?, HOT_STATEMENTS)?;
        let text = rows::status_text(&status);
        let n = shared.run_blocking("setting the queue's status", |c| {
            c.client.execute(SET_STATUS_OFFLINE, &[&sender_id, &text])
        })?;
        if n == 0 {
            return Err("no queue has this sender ID".into());
        }
        Ok(())
    }

    async fn restore(&self, q: QueueData) -> Result<(), StoreError> {
        if self.data.borrow().records.contains(&q.rec.recipient_id) {
            return Err(StoreError::Duplicate);
        }
        q.check()?;
        let QueueData { rec, msgs, ntfs } = q;
        let nid = rec
            .notifier
            .as_ref()
            .filter(|_| !ntfs.is_empty())
            .map(|n| n.notifier_id.clone());
        if nid.as_ref().is_some_and(|n| self.ntf.ntf_ids().contains(n)) {
            return Err(StoreError::Duplicate);
        }
        let row = RecRow::of(&rec);
        let rows: Vec<MsgRow> = msgs.iter().map(MsgRow::of).collect();
        let size = rows.len();
        let can_write = !rows.last().is_some_and(|m| m.quota);
        let expire = rows.iter().any(|m| !m.quota);
        let inserted = self
            .shared
            .run("restore", move |c| {
                let mut tx = c.client.transaction()?;
                if let Err(e) = tx.execute(INSERT_QUEUE, &row.params()) {
                    return if unique_violation(&e) {
                        Ok(false)
                    } else {
                        Err(e)
                    };
                }
                let rid = &row.params()[0];
                let ids: Vec<&[u8]> = rows.iter().map(|m| m.msg_id.as_slice()).collect();
                let ts: Vec<i64> = rows.iter().map(|m| m.ts).collect();
                let quota: Vec<bool> = rows.iter().map(|m| m.quota).collect();
                let ntf: Vec<bool> = rows.iter().map(|m| m.ntf).collect();
                let body: Vec<&[u8]> = rows.iter().map(|m| m.body.as_slice()).collect();
                tx.execute(RESTORE_MESSAGES, &[*rid, &ids, &ts, &quota, &ntf, &body])?;
                tx.execute(
                    RESTORE_COUNTS,
                    &[*rid, &(rows.len() as i64), &can_write, &expire],
                )?;
                tx.commit()?;
                Ok(true)
            })
            .await?;
        if !inserted {
            return Err(StoreError::Duplicate);
        }
        if let Some(nid) = nid {
            self.ntf.return_ntfs(&nid, ntfs).await?;
        }
        let mut d = self.data.borrow_mut();
        d.count_change(1, i64::from(rec.notifier.is_some()));
        d.add(&rec.recipient_id, size);
        d.records.insert(rec);
        d.counters.store_records_evicted += d.records.evict(&|_| false) as u64;
        Ok(())
    }
}
