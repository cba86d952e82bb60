//! The reference server's schema (simplexmq `Server/QueueStore/Postgres/Migrations.hs`, its final
//! form in `server_schema.sql`), built by migrations under the reference's names and recorded in
//! its `migrations` table, so that a database the reference made is recognised and carried on,
//! and one made here is the reference's (`migrations/README.md`). The statements are this
//! relay's own text with the reference's effect: the same tables, columns, defaults, constraints,
//! indexes, functions, triggers and the aggregate, under the same names.
//!
//! At start ([`lock_and_migrate`]): the relay takes an advisory lock (one relay per database and
//! schema), checks that `pgcrypto` is installed (the functions call `public.digest`), creates the
//! schema if it is missing, refuses a schema with migrations it does not know (a newer
//! reference's), and applies the missing ones in order, each in its own transaction.

use postgres::Client;

/// A migration: the reference's name, what it does, and how to undo it (stored in `migrations`
/// as the reference stores its own, so that an older reference server can step back).
pub struct Migration {
    pub name: &'static str,
    pub up: &'static str,
    pub down: Option<&'static str>,
}

/// The advisory lock's first key: "smpr" in ASCII; the second is the schema name's hash.
const LOCK_CLASS: i32 = 0x736d_7072;

/// `name` as a quoted SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Takes the schema's advisory lock for `client`'s session, if no other session holds it.
pub fn try_lock(client: &mut Client, schema: &str) -> Result<bool, postgres::Error> {
    Ok(client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            &[&LOCK_CLASS, &schema],
        )?
        .get(0))
}

/// Takes the lock, checks `pgcrypto`, creates and migrates the schema. `client` must stay open
/// while the relay runs: the lock is its session's.
pub fn lock_and_migrate(client: &mut Client, schema: &str) -> Result<(), String> {
    let db = |e: postgres::Error| super::errors::describe(&e);
    // `IF NOT EXISTS` notices are not news.
    client
        .batch_execute("SET client_min_messages TO WARNING")
        .map_err(db)?;
    if !try_lock(client, schema).map_err(db)? {
        return Err(format!(
            "another smp-relay holds the database's schema {schema} (advisory lock {LOCK_CLASS}); \
             stop it first, or give this one its own --schema"
        ));
    }
    let pgcrypto: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pgcrypto'",
            &[],
        )
        .map_err(db)?
        .get(0);
    if pgcrypto == 0 {
        let dbname: String = client
            .query_one("SELECT current_database()", &[])
            .map_err(db)?
            .get(0);
        return Err(format!(
            "the database {dbname} has no pgcrypto extension, which the store's functions use; \
             as a superuser run `CREATE EXTENSION pgcrypto;` in it (psql -d {dbname}), then start \
             again"
        ));
    }
    let s = ident(schema);
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE IF NOT EXISTS {s}.migrations (
               name TEXT NOT NULL PRIMARY KEY,
               ts TIMESTAMP NOT NULL,
               down TEXT
             );"
        ))
        .map_err(db)?;
    let applied: Vec<String> = client
        .query(
            &format!("SELECT name FROM {s}.migrations ORDER BY name"),
            &[],
        )
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let unknown: Vec<&String> = applied
        .iter()
        .filter(|a| !MIGRATIONS.iter().any(|m| m.name == a.as_str()))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "the schema {schema} has migrations this relay does not know ({}): a newer reference \
             server migrated it. Run a relay version that knows them, or step the reference \
             server back to migration {} first",
            unknown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            MIGRATIONS.last().map_or("", |m| m.name)
        ));
    }
    for m in MIGRATIONS {
        if applied.iter().any(|a| a == m.name) {
            continue;
        }
        let mut tx = client.transaction().map_err(db)?;
        tx.batch_execute(&format!("SET LOCAL search_path TO {s}"))
            .map_err(db)?;
        tx.batch_execute(m.up)
            .map_err(|e| format!("migration {}: {}", m.name, db(e)))?;
        tx.execute(
            &format!(
                "INSERT INTO {s}.migrations (name, ts, down) VALUES ($1, now() AT TIME ZONE 'UTC', $2)"
            ),
            &[&m.name, &m.down],
        )
        .map_err(db)?;
        tx.commit().map_err(db)?;
        tracing::info!(migration = m.name, schema, "database migrated");
    }
    Ok(())
}

/// The reference's migrations, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        name: "20250207_initial",
        up: INITIAL,
        down: None,
    },
    Migration {
        name: "20250319_updated_index",
        up: "DROP INDEX idx_msg_queues_deleted_at;
             CREATE INDEX idx_msg_queues_updated_at ON msg_queues (deleted_at, updated_at);",
        down: Some(
            "DROP INDEX idx_msg_queues_updated_at;
             CREATE INDEX idx_msg_queues_deleted_at ON msg_queues (deleted_at);",
        ),
    },
    Migration {
        name: "20250320_short_links",
        up: SHORT_LINKS,
        down: Some(SHORT_LINKS_DOWN),
    },
    Migration {
        name: "20250514_service_certs",
        up: SERVICE_CERTS,
        down: Some(
            "DROP INDEX idx_msg_queues_rcv_service_id;
             DROP INDEX idx_msg_queues_ntf_service_id;
             ALTER TABLE msg_queues DROP COLUMN rcv_service_id, DROP COLUMN ntf_service_id;
             DROP INDEX idx_services_service_role;
             DROP TABLE services;",
        ),
    },
    Migration {
        name: "20250903_store_messages",
        up: STORE_MESSAGES,
        down: Some(STORE_MESSAGES_DOWN),
    },
    Migration {
        name: "20250915_queue_ids_hash",
        up: QUEUE_IDS_HASH,
        down: Some(QUEUE_IDS_HASH_DOWN),
    },
];

const INITIAL: &str = "
CREATE TABLE msg_queues (
  recipient_id BYTEA NOT NULL PRIMARY KEY,
  recipient_key BYTEA NOT NULL,
  rcv_dh_secret BYTEA NOT NULL,
  sender_id BYTEA NOT NULL,
  sender_key BYTEA,
  snd_secure BOOLEAN NOT NULL,
  notifier_id BYTEA,
  notifier_key BYTEA,
  rcv_ntf_dh_secret BYTEA,
  status TEXT NOT NULL,
  updated_at BIGINT,
  deleted_at BIGINT
);
CREATE UNIQUE INDEX idx_msg_queues_sender_id ON msg_queues (sender_id);
CREATE UNIQUE INDEX idx_msg_queues_notifier_id ON msg_queues (notifier_id);
CREATE INDEX idx_msg_queues_deleted_at ON msg_queues (deleted_at);
";

// A key list is a count byte, then each key as a length byte and its DER (the reference's
// `smpEncode` of a non-empty list); the single key of older rows becomes a list of one.
const SHORT_LINKS: &str = r"
ALTER TABLE msg_queues
  ADD COLUMN queue_mode TEXT,
  ADD COLUMN link_id BYTEA,
  ADD COLUMN fixed_data BYTEA,
  ADD COLUMN user_data BYTEA;
UPDATE msg_queues SET queue_mode = 'M' WHERE snd_secure;
ALTER TABLE msg_queues DROP COLUMN snd_secure;
UPDATE msg_queues
  SET recipient_key = '\x01'::BYTEA || set_byte('\x00'::BYTEA, 0, length(recipient_key)) || recipient_key;
ALTER TABLE msg_queues RENAME COLUMN recipient_key TO recipient_keys;
CREATE UNIQUE INDEX idx_msg_queues_link_id ON msg_queues (link_id);
";

const SHORT_LINKS_DOWN: &str = r"
ALTER TABLE msg_queues ADD COLUMN snd_secure BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE msg_queues SET snd_secure = (queue_mode = 'M') WHERE queue_mode IS NOT NULL;
DROP INDEX idx_msg_queues_link_id;
ALTER TABLE msg_queues
  DROP COLUMN queue_mode,
  DROP COLUMN link_id,
  DROP COLUMN fixed_data,
  DROP COLUMN user_data;
DO $$
DECLARE
  rid BYTEA;
BEGIN
  SELECT recipient_id INTO rid FROM msg_queues
  WHERE get_byte(recipient_keys, 0) <> 1 OR get_byte(recipient_keys, 1) <> length(recipient_keys) - 2
  LIMIT 1;
  IF rid IS NOT NULL THEN
    RAISE EXCEPTION 'Cannot downgrade: queue % has several recipient keys or a malformed key list', encode(rid, 'base64');
  END IF;
END;
$$;
UPDATE msg_queues SET recipient_keys = substring(recipient_keys FROM 3);
ALTER TABLE msg_queues RENAME COLUMN recipient_keys TO recipient_key;
";

const SERVICE_CERTS: &str = "
CREATE TABLE services (
  service_id BYTEA NOT NULL PRIMARY KEY,
  service_role TEXT NOT NULL,
  service_cert BYTEA NOT NULL,
  service_cert_hash BYTEA NOT NULL UNIQUE,
  created_at BIGINT NOT NULL
);
CREATE INDEX idx_services_service_role ON services (service_role);
ALTER TABLE msg_queues
  ADD COLUMN rcv_service_id BYTEA REFERENCES services (service_id) ON UPDATE RESTRICT ON DELETE SET NULL,
  ADD COLUMN ntf_service_id BYTEA REFERENCES services (service_id) ON UPDATE RESTRICT ON DELETE SET NULL;
CREATE INDEX idx_msg_queues_rcv_service_id ON msg_queues (rcv_service_id, deleted_at);
CREATE INDEX idx_msg_queues_ntf_service_id ON msg_queues (ntf_service_id, deleted_at);
";

// The message functions. Each locks its queue's row first, so that calls on one queue run one
// after another; `msg_queue_size` counts the queue's rows (the quota marker included),
// `msg_can_write` is false from a quota marker until the queue is drained, and
// `msg_queue_expire` says whether the queue may hold messages to expire.
const STORE_MESSAGES: &str = r"
CREATE TABLE messages (
  message_id BIGINT NOT NULL PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
  recipient_id BYTEA NOT NULL REFERENCES msg_queues ON UPDATE RESTRICT ON DELETE CASCADE,
  msg_id BYTEA NOT NULL,
  msg_ts BIGINT NOT NULL,
  msg_quota BOOLEAN NOT NULL,
  msg_ntf_flag BOOLEAN NOT NULL,
  msg_body BYTEA NOT NULL
);
ALTER TABLE msg_queues
  ADD COLUMN msg_can_write BOOLEAN NOT NULL DEFAULT TRUE,
  ADD COLUMN msg_queue_expire BOOLEAN NOT NULL DEFAULT FALSE,
  ADD COLUMN msg_queue_size BIGINT NOT NULL DEFAULT 0;
CREATE INDEX idx_messages_recipient_id_message_id ON messages (recipient_id, message_id);
CREATE INDEX idx_messages_recipient_id_msg_ts ON messages (recipient_id, msg_ts);
CREATE INDEX idx_messages_recipient_id_msg_quota ON messages (recipient_id, msg_quota);
DROP INDEX idx_msg_queues_updated_at;
CREATE INDEX idx_msg_queues_updated_at_recipient_id
  ON msg_queues (deleted_at, updated_at, msg_queue_expire, recipient_id);

-- A SEND: one row if stored (the message, or the quota marker in its place), none if the queue
-- is closed to writes or gone.
CREATE FUNCTION write_message(
  p_recipient_id BYTEA, p_msg_id BYTEA, p_msg_ts BIGINT, p_msg_quota BOOLEAN,
  p_msg_ntf_flag BOOLEAN, p_msg_body BYTEA, p_quota INT
) RETURNS TABLE (quota_written BOOLEAN, was_empty BOOLEAN)
LANGUAGE plpgsql AS $$
DECLARE
  open_for_writes BOOLEAN;
  stored BIGINT;
  marker BOOLEAN;
BEGIN
  SELECT msg_can_write, msg_queue_size INTO open_for_writes, stored
  FROM msg_queues WHERE recipient_id = p_recipient_id AND deleted_at IS NULL
  FOR UPDATE;
  -- No live queue: nothing to store (and its NULLs must not reach the insert).
  IF NOT FOUND OR NOT (open_for_writes OR stored = 0) THEN
    RETURN;
  END IF;
  marker := p_msg_quota OR stored >= p_quota;
  INSERT INTO messages (recipient_id, msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body)
  VALUES (
    p_recipient_id, p_msg_id, p_msg_ts, marker, p_msg_ntf_flag AND NOT marker,
    CASE WHEN marker THEN ''::BYTEA ELSE p_msg_body END
  );
  UPDATE msg_queues
  SET msg_can_write = NOT marker, msg_queue_expire = TRUE, msg_queue_size = msg_queue_size + 1
  WHERE recipient_id = p_recipient_id;
  quota_written := marker;
  was_empty := stored = 0;
  RETURN NEXT;
END;
$$;

-- An ACK: deletes the head if it is p_msg_id and returns it.
CREATE FUNCTION try_del_msg(p_recipient_id BYTEA, p_msg_id BYTEA)
RETURNS TABLE (r_msg_id BYTEA, r_msg_ts BIGINT, r_msg_quota BOOLEAN, r_msg_ntf_flag BOOLEAN, r_msg_body BYTEA)
LANGUAGE plpgsql AS $$
DECLARE
  stored BIGINT;
  head RECORD;
BEGIN
  SELECT msg_queue_size INTO stored
  FROM msg_queues WHERE recipient_id = p_recipient_id AND deleted_at IS NULL
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT message_id, msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body INTO head
  FROM messages WHERE recipient_id = p_recipient_id
  ORDER BY message_id LIMIT 1;
  IF NOT FOUND THEN
    IF stored <> 0 THEN
      UPDATE msg_queues SET msg_can_write = TRUE, msg_queue_expire = FALSE, msg_queue_size = 0
      WHERE recipient_id = p_recipient_id;
    END IF;
    RETURN;
  END IF;
  IF head.msg_id <> p_msg_id THEN
    RETURN;
  END IF;
  DELETE FROM messages WHERE message_id = head.message_id;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  UPDATE msg_queues
  SET msg_can_write = msg_can_write OR msg_queue_size <= 1,
      msg_queue_expire = msg_queue_size > 1,
      msg_queue_size = GREATEST(msg_queue_size - 1, 0)
  WHERE recipient_id = p_recipient_id;
  r_msg_id := head.msg_id; r_msg_ts := head.msg_ts; r_msg_quota := head.msg_quota;
  r_msg_ntf_flag := head.msg_ntf_flag; r_msg_body := head.msg_body;
  RETURN NEXT;
END;
$$;

-- An ACK that also reads the next message: no row (no queue, or empty), the head alone (not
-- p_msg_id, or deleted with nothing after it), or the deleted message and the new head.
CREATE FUNCTION try_del_peek_msg(p_recipient_id BYTEA, p_msg_id BYTEA)
RETURNS TABLE (r_msg_id BYTEA, r_msg_ts BIGINT, r_msg_quota BOOLEAN, r_msg_ntf_flag BOOLEAN, r_msg_body BYTEA)
LANGUAGE plpgsql AS $$
DECLARE
  stored BIGINT;
  head RECORD;
  deleted BOOLEAN;
BEGIN
  SELECT msg_queue_size INTO stored
  FROM msg_queues WHERE recipient_id = p_recipient_id AND deleted_at IS NULL
  FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT message_id, msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body INTO head
  FROM messages WHERE recipient_id = p_recipient_id
  ORDER BY message_id LIMIT 1;
  IF NOT FOUND THEN
    IF stored <> 0 THEN
      UPDATE msg_queues SET msg_can_write = TRUE, msg_queue_expire = FALSE, msg_queue_size = 0
      WHERE recipient_id = p_recipient_id;
    END IF;
    RETURN;
  END IF;
  IF head.msg_id <> p_msg_id THEN
    r_msg_id := head.msg_id; r_msg_ts := head.msg_ts; r_msg_quota := head.msg_quota;
    r_msg_ntf_flag := head.msg_ntf_flag; r_msg_body := head.msg_body;
    RETURN NEXT;
    RETURN;
  END IF;
  DELETE FROM messages WHERE message_id = head.message_id;
  deleted := FOUND;
  IF deleted THEN
    r_msg_id := head.msg_id; r_msg_ts := head.msg_ts; r_msg_quota := head.msg_quota;
    r_msg_ntf_flag := head.msg_ntf_flag; r_msg_body := head.msg_body;
    RETURN NEXT;
  END IF;
  SELECT msg_id, msg_ts, msg_quota, msg_ntf_flag, msg_body INTO head
  FROM messages WHERE recipient_id = p_recipient_id
  ORDER BY message_id LIMIT 1;
  IF FOUND THEN
    r_msg_id := head.msg_id; r_msg_ts := head.msg_ts; r_msg_quota := head.msg_quota;
    r_msg_ntf_flag := head.msg_ntf_flag; r_msg_body := head.msg_body;
    RETURN NEXT;
    IF deleted THEN
      UPDATE msg_queues
      SET msg_can_write = msg_can_write OR msg_queue_size <= 1,
          msg_queue_expire = msg_queue_size > 1,
          msg_queue_size = GREATEST(msg_queue_size - 1, 0)
      WHERE recipient_id = p_recipient_id;
    END IF;
  ELSIF deleted OR stored <> 0 THEN
    UPDATE msg_queues SET msg_can_write = TRUE, msg_queue_expire = FALSE, msg_queue_size = 0
    WHERE recipient_id = p_recipient_id;
  END IF;
END;
$$;

-- Deletes the messages older than p_old_ts from the front of the queue (never a quota marker);
-- skips a queue another call holds. Returns how many were deleted.
CREATE FUNCTION delete_expired_msgs(p_recipient_id BYTEA, p_old_ts BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
  stored BIGINT;
  first_kept BIGINT;
  n BIGINT;
BEGIN
  SELECT msg_queue_size INTO stored
  FROM msg_queues WHERE recipient_id = p_recipient_id AND deleted_at IS NULL
  FOR UPDATE SKIP LOCKED;
  IF NOT FOUND OR stored = 0 THEN
    RETURN 0;
  END IF;
  SELECT min(message_id) INTO first_kept
  FROM messages
  WHERE recipient_id = p_recipient_id AND msg_ts >= p_old_ts AND NOT msg_quota;
  DELETE FROM messages
  WHERE recipient_id = p_recipient_id AND NOT msg_quota
    AND (first_kept IS NULL OR message_id < first_kept);
  GET DIAGNOSTICS n = ROW_COUNT;
  IF n > 0 THEN
    UPDATE msg_queues
    SET msg_can_write = msg_can_write OR msg_queue_size <= n,
        msg_queue_expire = msg_queue_size > n AND first_kept IS NOT NULL,
        msg_queue_size = GREATEST(msg_queue_size - n, 0)
    WHERE recipient_id = p_recipient_id;
  END IF;
  RETURN n;
END;
$$;

-- Expires every live queue updated after p_old_queue that may hold old messages, in pages of
-- batch_size queues, committing after each queue; a queue that fails is logged and skipped.
CREATE PROCEDURE expire_old_messages(
  p_old_queue BIGINT, p_old_ts BIGINT, batch_size INT,
  OUT r_expired_msgs_count BIGINT, OUT r_stored_msgs_count BIGINT, OUT r_stored_queues BIGINT
)
LANGUAGE plpgsql AS $$
DECLARE
  page BYTEA[];
  rid BYTEA;
  after_rid BYTEA := '\x';
  expired BIGINT := 0;
BEGIN
  LOOP
    SELECT array_agg(q.recipient_id) INTO page
    FROM (
      SELECT recipient_id FROM msg_queues
      WHERE deleted_at IS NULL AND updated_at > p_old_queue AND msg_queue_expire
        AND recipient_id > after_rid
      ORDER BY recipient_id
      LIMIT batch_size
    ) q;
    EXIT WHEN page IS NULL OR cardinality(page) = 0;
    FOREACH rid IN ARRAY page LOOP
      BEGIN
        expired := expired + delete_expired_msgs(rid, p_old_ts);
      EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'STORE, expire_old_messages, error expiring queue %: %', encode(rid, 'base64'), SQLERRM;
        CONTINUE;
      END;
      COMMIT;
    END LOOP;
    after_rid := page[cardinality(page)];
  END LOOP;
  r_expired_msgs_count := expired;
  r_stored_msgs_count := (SELECT count(1) FROM messages);
  r_stored_queues := (SELECT count(1) FROM msg_queues WHERE deleted_at IS NULL);
END;
$$;
";

const STORE_MESSAGES_DOWN: &str = "
DROP FUNCTION write_message;
DROP FUNCTION try_del_msg;
DROP FUNCTION try_del_peek_msg;
DROP FUNCTION delete_expired_msgs;
DROP PROCEDURE expire_old_messages;
DROP INDEX idx_msg_queues_updated_at_recipient_id;
CREATE INDEX idx_msg_queues_updated_at ON msg_queues (deleted_at, updated_at);
DROP INDEX idx_messages_recipient_id_message_id;
DROP INDEX idx_messages_recipient_id_msg_ts;
DROP INDEX idx_messages_recipient_id_msg_quota;
ALTER TABLE msg_queues
  DROP COLUMN msg_can_write,
  DROP COLUMN msg_queue_expire,
  DROP COLUMN msg_queue_size;
DROP TABLE messages;
";

// Each service's count of associated live queues and the XOR of the MD5 of their IDs (recipient
// IDs for role M, notifier IDs for role N), kept by triggers on msg_queues only.
const QUEUE_IDS_HASH: &str = r"
CREATE OR REPLACE FUNCTION xor_combine(state BYTEA, value BYTEA) RETURNS BYTEA
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
  n INTEGER := octet_length(value);
  acc BYTEA := state;
BEGIN
  IF octet_length(state) <> n THEN
    RAISE EXCEPTION 'Inputs must be equal length (% != %)', octet_length(state), n;
  END IF;
  FOR i IN 0 .. n - 1 LOOP
    acc := set_byte(acc, i, get_byte(state, i) # get_byte(value, i));
  END LOOP;
  RETURN acc;
END;
$$;

CREATE OR REPLACE AGGREGATE xor_aggregate(BYTEA) (
  SFUNC = xor_combine,
  STYPE = BYTEA,
  INITCOND = '\x00000000000000000000000000000000'
);

ALTER TABLE services
  ADD COLUMN queue_count BIGINT NOT NULL DEFAULT 0,
  ADD COLUMN queue_ids_hash BYTEA NOT NULL DEFAULT '\x00000000000000000000000000000000';

CREATE FUNCTION update_all_aggregates() RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
  WITH per_service AS (
    SELECT s.service_id,
           count(1) AS n,
           xor_aggregate(public.digest(
             CASE WHEN s.service_role = 'M' THEN q.recipient_id
                  ELSE COALESCE(q.notifier_id, '\x00000000000000000000000000000000') END,
             'md5')) AS h
    FROM services s
    JOIN msg_queues q
      ON (s.service_role = 'M' AND q.rcv_service_id = s.service_id)
      OR (s.service_role = 'N' AND q.ntf_service_id = s.service_id)
    WHERE q.deleted_at IS NULL
    GROUP BY s.service_id
  )
  UPDATE services s
  SET queue_count = COALESCE(per_service.n, 0),
      queue_ids_hash = COALESCE(per_service.h, '\x00000000000000000000000000000000')
  FROM per_service
  WHERE s.service_id = per_service.service_id;
END;
$$;

SELECT update_all_aggregates();

CREATE FUNCTION update_aggregates(p_service_id BYTEA, p_role TEXT, p_queue_id BYTEA, p_change BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE services
  SET queue_count = queue_count + p_change,
      queue_ids_hash = xor_combine(queue_ids_hash, public.digest(p_queue_id, 'md5'))
  WHERE service_id = p_service_id AND service_role = p_role;
END;
$$;

CREATE FUNCTION on_queue_insert() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.rcv_service_id IS NOT NULL THEN
    PERFORM update_aggregates(NEW.rcv_service_id, 'M', NEW.recipient_id, 1);
  END IF;
  IF NEW.ntf_service_id IS NOT NULL AND NEW.notifier_id IS NOT NULL THEN
    PERFORM update_aggregates(NEW.ntf_service_id, 'N', NEW.notifier_id, 1);
  END IF;
  RETURN NEW;
END;
$$;

CREATE FUNCTION on_queue_delete() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.deleted_at IS NULL THEN
    IF OLD.rcv_service_id IS NOT NULL THEN
      PERFORM update_aggregates(OLD.rcv_service_id, 'M', OLD.recipient_id, -1);
    END IF;
    IF OLD.ntf_service_id IS NOT NULL AND OLD.notifier_id IS NOT NULL THEN
      PERFORM update_aggregates(OLD.ntf_service_id, 'N', OLD.notifier_id, -1);
    END IF;
  END IF;
  RETURN OLD;
END;
$$;

-- An association counts while the row is live and names the service (and, for N, a notifier):
-- leaving that state takes it out, changing the service or notifier ID moves it, entering adds it.
CREATE FUNCTION on_queue_update() RETURNS TRIGGER
LANGUAGE plpgsql AS $$
DECLARE
  was BOOLEAN;
  now_in BOOLEAN;
BEGIN
  was := OLD.deleted_at IS NULL AND OLD.rcv_service_id IS NOT NULL;
  now_in := NEW.deleted_at IS NULL AND NEW.rcv_service_id IS NOT NULL;
  IF was AND (NOT now_in OR OLD.rcv_service_id IS DISTINCT FROM NEW.rcv_service_id) THEN
    PERFORM update_aggregates(OLD.rcv_service_id, 'M', OLD.recipient_id, -1);
  END IF;
  IF now_in AND (NOT was OR OLD.rcv_service_id IS DISTINCT FROM NEW.rcv_service_id) THEN
    PERFORM update_aggregates(NEW.rcv_service_id, 'M', NEW.recipient_id, 1);
  END IF;

  was := OLD.deleted_at IS NULL AND OLD.ntf_service_id IS NOT NULL AND OLD.notifier_id IS NOT NULL;
  now_in := NEW.deleted_at IS NULL AND NEW.ntf_service_id IS NOT NULL AND NEW.notifier_id IS NOT NULL;
  IF was AND (NOT now_in OR OLD.ntf_service_id IS DISTINCT FROM NEW.ntf_service_id
              OR OLD.notifier_id IS DISTINCT FROM NEW.notifier_id) THEN
    PERFORM update_aggregates(OLD.ntf_service_id, 'N', OLD.notifier_id, -1);
  END IF;
  IF now_in AND (NOT was OR OLD.ntf_service_id IS DISTINCT FROM NEW.ntf_service_id
                 OR OLD.notifier_id IS DISTINCT FROM NEW.notifier_id) THEN
    PERFORM update_aggregates(NEW.ntf_service_id, 'N', NEW.notifier_id, 1);
  END IF;
  RETURN NEW;
END;
$$;

CREATE TRIGGER tr_queue_insert AFTER INSERT ON msg_queues
  FOR EACH ROW EXECUTE PROCEDURE on_queue_insert();
CREATE TRIGGER tr_queue_delete AFTER DELETE ON msg_queues
  FOR EACH ROW EXECUTE PROCEDURE on_queue_delete();
CREATE TRIGGER tr_queue_update AFTER UPDATE ON msg_queues
  FOR EACH ROW EXECUTE PROCEDURE on_queue_update();
";

const QUEUE_IDS_HASH_DOWN: &str = "
DROP TRIGGER tr_queue_insert ON msg_queues;
DROP TRIGGER tr_queue_delete ON msg_queues;
DROP TRIGGER tr_queue_update ON msg_queues;
DROP FUNCTION on_queue_insert;
DROP FUNCTION on_queue_delete;
DROP FUNCTION on_queue_update;
DROP FUNCTION update_aggregates;
DROP FUNCTION update_all_aggregates;
ALTER TABLE services DROP COLUMN queue_count, DROP COLUMN queue_ids_hash;
DROP AGGREGATE xor_aggregate(BYTEA);
DROP FUNCTION xor_combine;
";

/// The table that records this relay's own migrations (none so far), apart from the reference's
/// `migrations`.
pub const OWN_MIGRATIONS_TABLE: &str = "smprelay_migrations";

/// This relay's own migrations, each with its down step; none so far: the store uses the
/// reference's schema as it is.
pub const OWN_MIGRATIONS: &[Migration] = &[];

/// `smp-relay database downgrade`: undoes this relay's own migrations (newest first) and drops
/// their table, under the same advisory lock as a start (so never beside a running relay).
/// Returns what the schema holds afterwards.
pub fn downgrade(client: &mut Client, schema: &str) -> Result<String, String> {
    let db = |e: postgres::Error| super::errors::describe(&e);
    client
        .batch_execute("SET client_min_messages TO WARNING")
        .map_err(db)?;
    let locked: bool = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            &[&LOCK_CLASS, &schema],
        )
        .map_err(db)?
        .get(0);
    if !locked {
        return Err(format!(
            "an smp-relay is running on the schema {schema}; stop it first"
        ));
    }
    let s = ident(schema);
    let exists = |client: &mut Client, table: &str| -> Result<bool, String> {
        client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL",
                &[&format!("{s}.{table}")],
            )
            .map(|r| r.get(0))
            .map_err(db)
    };
    if !exists(client, "migrations")? {
        return Err(format!(
            "the schema {schema} has no migrations table: not a store's schema"
        ));
    }
    let mut undone = Vec::new();
    if exists(client, OWN_MIGRATIONS_TABLE)? {
        let applied: Vec<String> = client
            .query(
                &format!("SELECT name FROM {s}.{OWN_MIGRATIONS_TABLE} ORDER BY name DESC"),
                &[],
            )
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut tx = client.transaction().map_err(db)?;
        tx.batch_execute(&format!("SET LOCAL search_path TO {s}"))
            .map_err(db)?;
        for name in &applied {
            let m = OWN_MIGRATIONS
                .iter()
                .find(|m| m.name == name)
                .ok_or_else(|| format!("own migration {name} is unknown to this version"))?;
            if let Some(down) = m.down {
                tx.batch_execute(down).map_err(db)?;
            }
            undone.push(name.clone());
        }
        tx.batch_execute(&format!("DROP TABLE {s}.{OWN_MIGRATIONS_TABLE}"))
            .map_err(db)?;
        tx.commit().map_err(db)?;
    }
    let reference: Vec<String> = client
        .query(
            &format!("SELECT name FROM {s}.migrations ORDER BY name"),
            &[],
        )
        .map_err(db)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(format!(
        "schema {schema}: {}; it holds the reference server's schema at migration {} and \
         nothing of smp-relay's, so the reference smp-server can start on it",
        if undone.is_empty() {
            "no objects of smp-relay's to remove".to_string()
        } else {
            format!("removed smp-relay's migrations {}", undone.join(", "))
        },
        reference.last().map_or("(none)", String::as_str)
    ))
}
