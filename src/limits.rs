//! Named limits and their defaults (`docs/ARCHITECTURE.md` §4). Every queue, buffer and connection
//! count of the relay is bounded by one of these or by a setting that defaults to one of these.

use std::time::Duration;

/// Connections the relay holds open at once, over all shards as one number (`server::admission`).
pub const MAX_CONNECTIONS: usize = 65536;

/// TLS handshake must complete within this time after accept (reference: 60 s).
pub const TLS_SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The SMP handshake (server hello out, client hello in) must complete within this (reference: 120 s).
pub const SMP_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(120);

/// Blocks of one connection being processed at once; beyond this the shard stops reading the socket.
pub const MAX_BLOCKS_IN_FLIGHT: usize = 8;

/// A connection whose output stays over its bound this long is closed.
pub const SLOW_READER_CLOSE: Duration = Duration::from_secs(60);

/// Bytes read from a socket in one call.
pub const SOCKET_READ_BYTES: usize = 32 * 1024;

/// Bytes of TLS handshake captured per connection for the tls-unique extraction.
pub const TLS_CAPTURE_MAX_BYTES: usize = 64 * 1024;

/// Bytes of a WebSocket upgrade request (request line and headers) read at most; a longer one is
/// answered `431` and closed (`server/conn/ws.rs`). Browsers send well under 2 KiB.
pub const WS_UPGRADE_MAX_BYTES: usize = 8 * 1024;

/// Header lines of a WebSocket upgrade request accepted at most (`transport/websocket.rs`).
pub const WS_UPGRADE_MAX_HEADERS: usize = 64;

/// A client's WebSocket message, reassembled from its frames, is at most this long (the reference's
/// `connectionMessageDataSizeLimit`, simplexmq `src/Simplex/Messaging/Transport/WebSockets.hs`);
/// every accepted message is then exactly one 16384-byte block.
pub const WS_MAX_MESSAGE_BYTES: usize = 65536;

/// Memory glommio registers per executor ring with io_uring (counted against RLIMIT_MEMLOCK by
/// kernels before 5.12; later ones charge it to the memory cgroup).
pub const IO_MEMORY_BYTES: usize = 1 << 20;

/// The RLIMIT_MEMLOCK below which glommio refuses to make an executor (glommio 0.9
/// `sys/uring.rs`, `MIN_MEMLOCK_LIMIT`), whatever the number of shards.
pub const MIN_MEMLOCK_BYTES: u64 = 512 * 1024;

/// Bytes a connection may have queued for its socket before MSG deliveries to it are dropped to
/// a small marker and handed again when it has drained (one slow reader never grows the relay).
pub const OUTPUT_HIGH_WATER_BYTES: usize = 1 << 20;

/// Events that cannot be dropped and asked again (NMSG, END, DELD) stop here: one that would take a
/// connection's queued output past this ends the connection (the client stopped reading; it
/// reconnects and subscribes again), instead of growing its output until the slow-reader close.
pub const OUTPUT_HARD_LIMIT_BYTES: usize = 4 * OUTPUT_HIGH_WATER_BYTES;

/// Below this the connection asks the owners for the deliveries it dropped.
pub const OUTPUT_LOW_WATER_BYTES: usize = 256 * 1024;

/// Dropped deliveries asked for again at once, per connection: sized so that a batch of 16 KB MSGs
/// fits between the low and the high water mark and none of it is dropped (and sealed) again.
pub const REDELIVER_BATCH: usize = (OUTPUT_HIGH_WATER_BYTES - OUTPUT_LOW_WATER_BYTES) / (17 * 1024);

/// What a connection may hold to ask its owners for again (dropped MSGs, the rest of stored
/// notifications): at most one per subscription, so this is also a bound on the subscriptions of
/// a connection that stops reading; past it the connection is closed (its messages stay queued).
pub const MAX_PENDING_PER_CONNECTION: usize = 1 << 20;

/// A connection over its output bound must have its socket take at least this many bytes every
/// `SLOW_READER_CLOSE`; a reader that keeps reading, however slowly, is never closed for it.
pub const SLOW_READER_MIN_PROGRESS_BYTES: usize = 64 * 1024;

/// Events (END, DELD, ENDS, NMSG, MSG pushes, service switches and counts: what no request of the
/// receiving shard asked for) one shard's inbox holds at most. A shard that finds it full holds
/// its events for that shard back, in order, until the inbox has fallen to
/// `INBOX_EVENTS_ROOM_AT` (`server::router::ShardMesh`): a shard busy with its own work is not
/// buried under other shards' events meanwhile.
pub const MAX_INBOX_EVENTS: usize = 2048;
pub const INBOX_EVENTS_ROOM_AT: usize = MAX_INBOX_EVENTS / 2;

/// Stored notifications an NSUB (or a connection asking for more) gets at once; the rest follow as
/// the connection's output drains, like dropped MSGs.
pub const NTFS_PER_PART: usize = 64;

/// Failed signature verifications one connection may cause an owner at once (a queue may have up
/// to 255 recipient keys, each tried), refilled at `FAILED_VERIFY_REFILL_PER_SEC`; a connection
/// that needs more is closed, so that it cannot take more than its share of the shard.
pub const FAILED_VERIFY_BUDGET: u32 = 4096;
pub const FAILED_VERIFY_REFILL_PER_SEC: u32 = 1024;

/// The output bounds of one connection. The defaults are the constants above; tests shrink them
/// (`--test-output-high-water-bytes`) so that drops and re-asks happen on every run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    pub high_water_bytes: usize,
    pub low_water_bytes: usize,
    pub hard_limit_bytes: usize,
    pub redeliver_batch: usize,
}

impl OutputLimits {
    /// The bounds derived from a high water mark as the defaults are.
    pub fn from_high_water(high_water_bytes: usize) -> Self {
        let low_water_bytes = high_water_bytes / 4;
        OutputLimits {
            high_water_bytes,
            low_water_bytes,
            hard_limit_bytes: 4 * high_water_bytes,
            redeliver_batch: ((high_water_bytes - low_water_bytes) / (17 * 1024)).max(1),
        }
    }
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits {
            high_water_bytes: OUTPUT_HIGH_WATER_BYTES,
            low_water_bytes: OUTPUT_LOW_WATER_BYTES,
            hard_limit_bytes: OUTPUT_HARD_LIMIT_BYTES,
            redeliver_batch: REDELIVER_BATCH,
        }
    }
}

/// PRXY/PFWD of one connection being answered at once, by default (the reference's
/// `client_concurrency`, 32; `[PROXY] client_concurrency` sets it).
pub const DEFAULT_PROXIED_IN_FLIGHT: usize = 32;
/// The most `[PROXY] client_concurrency` may allow: each forwarded command in flight holds its
/// request and its answer (a block each) on the connection.
pub const MAX_PROXIED_IN_FLIGHT: usize = 4096;

/// Shards (pinned cores) at most: a connection records the shards it sent work to in one `u64`
/// (`server::conn`), and `--cores` / `[RELAY] cores` beyond it are refused, not cut.
pub const MAX_SHARDS: usize = 64;
const _: () = assert!(MAX_SHARDS <= u64::BITS as usize);

/// A warning a peer can cause (refused connection, failed accept, failed PRXY) is written at most
/// once per this interval per kind; the rest are counted (`log_limit`).
pub const WARNING_INTERVAL: Duration = Duration::from_secs(1);

/// Connections from one IP address that may be in their TLS or SMP handshake at once; one more is
/// closed at accept. Without it, one address holding idle sockets takes every connection slot for
/// the whole setup timeout. Clients complete a handshake in a few round trips, so even many
/// clients behind one NAT rarely have this many in flight.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 16;

/// Open files the relay needs besides client connections, per shard: its io_uring rings, eventfds
/// and timers (its listeners and proxy sessions are counted from the settings).
pub const FILES_PER_SHARD: usize = 16;

/// Open files the process needs besides the shards': standard streams, the data directory's lock,
/// store, metrics and certificate files while they are read or written.
pub const FILES_FIXED: usize = 64;

/// Queues one job of the periodic expiration works on, on a store that waits (PostgreSQL: one
/// statement, holding its queues' row locks while it runs). The job holds only these queues, so
/// the rest of the shard goes on meanwhile (`docs/ARCHITECTURE.md` §2).
pub const EXPIRE_QUEUES_PER_JOB: usize = 64;

/// Decoded queue records the journal and memory stores keep per shard (`store/cache.rs`): the
/// journal's index holds where each record is and the memory store keeps records packed, and the
/// records of the queues in use are kept decoded, up to this many (the most recently used; ~0.5 KB
/// each).
pub const RECORD_CACHE: usize = 65_536;

/// Allocations of at least this many bytes are mapped on their own and returned to the system
/// when freed (`server::fixed_mmap_threshold`).
pub const MALLOC_MMAP_THRESHOLD_BYTES: usize = 1024 * 1024;

/// Control port connections open at once; another is told so and closed.
pub const MAX_CONTROL_CONNECTIONS: usize = 8;

/// The longest control port line read (a block command with a notice fits); a longer one ends its
/// connection.
pub const MAX_CONTROL_LINE_BYTES: usize = 4096;

/// Seconds a statistics time bucket may say (ACK and pending-delivery ages beyond are counted
/// as this old), so that the buckets of minutes beyond three minutes stay at most 1440.
pub const MAX_TIME_BUCKET_SECS: u64 = 86_400;

/// Distinct queues each of a shard's active-queue sets (day, week, month; all messages and those
/// with the notification flag) holds: beyond it a new queue is not counted until the period
/// starts again. 8 bytes a queue, so at most 32 MiB a set.
pub const MAX_ACTIVE_QUEUES_PER_SET: usize = 1 << 22;

/// The metrics HTTP endpoint (`[RELAY] metrics_listen`): connections served at once (more are
/// closed at accept), the longest request head read, and how long a request may take to arrive.
pub const METRICS_HTTP_MAX_CONNECTIONS: usize = 8;
pub const METRICS_HTTP_MAX_REQUEST_BYTES: usize = 8 * 1024;
pub const METRICS_HTTP_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests within this long of the last metrics round are answered with its text, so that
/// scrapers, however many, make the shards publish at most once in it.
pub const METRICS_HTTP_FRESH: Duration = Duration::from_secs(1);

/// The web site (`[WEB] http`, `https`, and an SMP port shared by SNI; `server/web.rs`): HTTP
/// connections held at once over all shards on the site's own ports (more are closed at accept;
/// the site's clients on a shared SMP port count among the SMP connections instead), so that idle
/// browsers cannot take the descriptors SMP clients need.
pub const WEB_MAX_CONNECTIONS: usize = 4096;
/// The longest request head read (request line and headers); a longer one is answered `431`.
pub const WEB_MAX_REQUEST_BYTES: usize = 8 * 1024;
/// The most header lines a request may have; more is answered `431`.
pub const WEB_MAX_HEADERS: usize = 64;
/// How long a request head may take to arrive once its connection is open or its previous
/// request answered (the keep-alive wait included): a slow or silent client is closed after it.
pub const WEB_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long writing one answer may take before the connection is closed.
pub const WEB_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests one connection may send before it is closed (after that request's answer).
pub const WEB_MAX_REQUESTS_PER_CONNECTION: usize = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_limits_derive_as_the_defaults() {
        assert_eq!(
            OutputLimits::from_high_water(OUTPUT_HIGH_WATER_BYTES),
            OutputLimits::default()
        );
        assert_eq!(OutputLimits::from_high_water(4096).redeliver_batch, 1);
    }
}
