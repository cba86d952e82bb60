//! The values of configuration keys and their `start` flags: each parser takes the text as the
//! file or the command line gives it and returns the value or what is wrong with it. Apart from
//! `ini.rs` (the file's sections and keys), so that the settings' table (`settings.rs`), which
//! names these parsers, and the file layer, which applies that table, do not import each other.

use std::time::Duration;

/// The largest per-queue quota accepted: a full queue of maximum-size messages is then 64 MB.
pub const MAX_QUOTA: usize = 4096;
/// Longest TTL or interval accepted in any unit (10 years), so that conversions cannot overflow.
pub const MAX_DURATION_SECS: u64 = 10 * 365 * 86400;
/// The smallest journal size cap: what a new relay preallocates (every group's first segment),
/// so that a relay under the cap can always start.
pub const MIN_JOURNAL_MAX_SIZE: u64 =
    smp_journal::JOURNAL_GROUPS as u64 * smp_journal::DEFAULT_INITIAL_SEGMENT_SIZE;
/// The largest journal size cap accepted (1 PiB), far above any disk, so sums cannot overflow.
pub const MAX_JOURNAL_MAX_SIZE: u64 = 1 << 50;
/// Bounds of `[STORE_LOG] journal_checkpoint_records`: below a thousand records a busy group would
/// write its checkpoint all the time; above 100 million a start after a crash would replay that
/// many per group.
pub const MIN_JOURNAL_CHECKPOINT_RECORDS: u64 = 1_000;
pub const MAX_JOURNAL_CHECKPOINT_RECORDS: u64 = 100_000_000;

/// `HOST:PORT` of `[PROXY] socks_proxy`, resolved once.
pub fn socket_addr(value: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    value
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("{value:?} is not a HOST:PORT that resolves"))
}

/// `memory`, the only store for now; the other stores of `known` are "not supported yet".
pub(super) fn store_kind(value: &str, known: &[&str]) -> Result<(), String> {
    if known.contains(&value) {
        Ok(())
    } else {
        Err(format!("expected one of {}", known.join(", ")))
    }
}

/// A value taken as written (`db_connection`, `db_schema`); empty is an error.
pub fn text(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() {
        return Err("expected a value".into());
    }
    Ok(v.to_string())
}

/// `[STORE_LOG] db_pool_size`, `start --pool-size`: 1 to 256.
pub fn pool_size(value: &str) -> Result<usize, String> {
    number(value, 1, crate::store::postgres::pool::MAX_POOL_SIZE as u64).map(|n| n as usize)
}

/// `[RELAY] pg_queue_cache`, `start --pg-queue-cache`: 1000 to 100000000 queue records.
pub fn queue_cache(value: &str) -> Result<usize, String> {
    number(value, 1_000, 100_000_000).map(|n| n as usize)
}

/// The store of `[STORE_LOG] store_messages` and `start --store`: `memory`, `journal`, or
/// `database` (also `postgres`), the reference's PostgreSQL store.
pub fn store_messages(value: &str) -> Result<crate::store::StoreKind, String> {
    use crate::store::StoreKind;
    match value {
        "memory" => Ok(StoreKind::Memory),
        "journal" => Ok(StoreKind::Journal),
        "database" | "postgres" => Ok(StoreKind::Postgres),
        _ => Err("expected journal, memory or database".into()),
    }
}

/// When the journal store syncs (`[STORE_LOG] fsync`, `start --fsync`): `every-batch`,
/// `interval-ms N` (also `interval-ms=N`; 1 to 60000) or `never`.
pub fn fsync(value: &str) -> Result<crate::store::journal::Durability, String> {
    use crate::store::journal::Durability;
    let v = value.trim();
    match v {
        "every-batch" => return Ok(Durability::EveryBatch),
        "never" => return Ok(Durability::Never),
        _ => {}
    }
    let ms = v
        .strip_prefix("interval-ms")
        .map(|r| r.trim_start_matches([' ', '=', ':']))
        .ok_or_else(|| "expected every-batch, interval-ms N or never".to_string())?;
    let ms = number(ms, 1, 60_000)?;
    Ok(Durability::Interval(Duration::from_millis(ms)))
}

/// `on` or `off`, as every boolean of the reference's configuration; anything else is an error.
pub fn on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err("expected on or off".to_string()),
    }
}

fn number(value: &str, min: u64, max: u64) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| format!("expected a whole number from {min} to {max}"))
}

/// A positive count of `unit_secs` (days: 86400, hours: 3600, seconds: 1), at most 10 years.
pub fn duration(value: &str, unit_secs: u64) -> Result<Duration, String> {
    let n = number(value, 1, MAX_DURATION_SECS / unit_secs)?;
    Ok(Duration::from_secs(n * unit_secs))
}

/// Seconds, as the command line's `--…-secs` options take them.
pub fn seconds(value: &str) -> Result<Duration, String> {
    duration(value, 1)
}

/// A size in bytes (`[STORE_LOG] journal_max_size`, `start --journal-max-size`): a whole number,
/// optionally followed by K, M, G or T (powers of 1024), from `MIN_JOURNAL_MAX_SIZE` to
/// `MAX_JOURNAL_MAX_SIZE`.
pub fn size_bytes(value: &str) -> Result<u64, String> {
    size_within(value, MIN_JOURNAL_MAX_SIZE, MAX_JOURNAL_MAX_SIZE, "4G")
}

/// Records per journal group between checkpoints (`[STORE_LOG] journal_checkpoint_records`,
/// `start --journal-checkpoint-records`): a whole number from `MIN_JOURNAL_CHECKPOINT_RECORDS` to
/// `MAX_JOURNAL_CHECKPOINT_RECORDS`.
pub fn checkpoint_records(value: &str) -> Result<u64, String> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (MIN_JOURNAL_CHECKPOINT_RECORDS..=MAX_JOURNAL_CHECKPOINT_RECORDS).contains(n))
        .ok_or_else(|| {
            format!(
                "expected a whole number of records from {MIN_JOURNAL_CHECKPOINT_RECORDS} to \
                 {MAX_JOURNAL_CHECKPOINT_RECORDS}"
            )
        })
}

fn size_within(value: &str, min: u64, max: u64, example: &str) -> Result<u64, String> {
    let unit = |n: u64| match n {
        n if n >= 1 << 40 && n % (1 << 40) == 0 => format!("{}T", n >> 40),
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n => n.to_string(),
    };
    let expected = || {
        format!(
            "expected a size from {} to {}: a whole number of bytes, or one with K, M, G or T \
             (powers of 1024), e.g. {example}",
            unit(min),
            unit(max)
        )
    };
    let v = value.trim();
    let (digits, shift) = match v.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(expected()),
            };
            (&v[..i], shift)
        }
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(expected());
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(expected)
}

pub fn quota(value: &str) -> Result<usize, String> {
    number(value, 1, MAX_QUOTA as u64).map(|n| n as usize)
}

pub fn cores(value: &str) -> Result<usize, String> {
    number(value, 1, crate::limits::MAX_SHARDS as u64).map(|n| n as usize)
}

pub fn max_connections(value: &str) -> Result<usize, String> {
    number(value, 1, crate::limits::MAX_CONNECTIONS as u64 * 16).map(|n| n as usize)
}

/// Forwarded commands of one connection at once, 1 to `limits::MAX_PROXIED_IN_FLIGHT`
/// (`[PROXY] client_concurrency`; 0 would hold every forwarded command forever).
pub fn proxy_concurrency(value: &str) -> Result<usize, String> {
    number(value, 1, crate::limits::MAX_PROXIED_IN_FLIGHT as u64).map(|n| n as usize)
}

/// One port, 1 to 65535 (each of `ports`, and `start --port`).
pub fn port(value: &str) -> Result<u16, String> {
    number(value, 1, u16::MAX.into()).map(|n| n as u16)
}

/// A comma-separated list of distinct ports (the reference's `5223,443`), each as `port`.
pub fn ports(value: &str) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    for p in value.split(',') {
        let port = port(p.trim())
            .map_err(|_| "expected ports from 1 to 65535, separated by commas".to_string())?;
        if out.contains(&port) {
            return Err(format!("port {port} is listed twice"));
        }
        out.push(port);
    }
    Ok(out)
}

/// `[TRANSPORT] websockets` (and `start --websockets`): the ports serving SMP over WebSocket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSockets(pub Vec<u16>);

/// `off` (none), `on` (port 80, as the reference: simplexmq `src/Simplex/Messaging/Server/CLI.hs`,
/// `iniTransports`) or ports as `ports`.
pub fn websockets(value: &str) -> Result<WebSockets, String> {
    match value {
        "off" => Ok(WebSockets(Vec::new())),
        "on" => Ok(WebSockets(vec![80])),
        v => ports(v)
            .map(WebSockets)
            .map_err(|e| match e.strip_prefix("expected ") {
                Some(what) => format!("expected off, on or {what}"),
                None => e,
            }),
    }
}

/// The reference's rule for the password in a server address: printable ASCII without whitespace,
/// `@`, `:` or `/`.
pub fn create_password(value: &str) -> Result<Vec<u8>, String> {
    if value.is_empty() {
        return Err(
            "empty; remove the line to let anyone create queues, or set a password".to_string(),
        );
    }
    if value
        .bytes()
        .any(|b| !(0x21..=0x7e).contains(&b) || matches!(b, b'@' | b':' | b'/'))
    {
        return Err(
            "expected printable ASCII characters without spaces, '@', ':' or '/'".to_string(),
        );
    }
    Ok(value.as_bytes().to_vec())
}

/// A control port password: a server address password's characters (simplexmq `Server/Main.hs`
/// reads both as `BasicAuth`).
pub fn control_password(value: &str) -> Result<Vec<u8>, String> {
    if value.is_empty() {
        return Err("empty; comment the line out, or set a password".to_string());
    }
    create_password(value)
}

/// A whole number, negative or not.
pub fn integer(value: &str) -> Result<i64, String> {
    value
        .parse()
        .map_err(|_| "expected a whole number, e.g. 20, 0 or -1".to_string())
}
