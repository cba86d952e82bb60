//! Settings of the relay: the data directory layout and the options of `start`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::limits;
use std::time::Duration;

/// Default SMP port (the reference's `defaultSMPPort`).
pub const DEFAULT_PORT: u16 = 5223;
pub const DEFAULT_DATA_DIR: &str = "./smp-data";

pub const CA_KEY_FILE: &str = "ca.key";
pub const CA_CERT_FILE: &str = "ca.crt";
pub const SERVER_KEY_FILE: &str = "server.key";
pub const SERVER_CERT_FILE: &str = "server.crt";
pub const FINGERPRINT_FILE: &str = "fingerprint";
pub const INI_FILE: &str = "smp-server.ini";
pub const LOCK_FILE: &str = "lock";

/// The reference's defaults for `[INACTIVE_CLIENTS]` (simplexmq `Server/Env/STM.hs`,
/// `defaultInactiveClientExpiration`): 6 hours, looked for every hour.
pub const DEFAULT_INACTIVE_TTL: Duration = Duration::from_secs(6 * 3600);
pub const DEFAULT_INACTIVE_CHECK: Duration = Duration::from_secs(3600);

/// `[INACTIVE_CLIENTS]`: a connection without subscriptions that sent and received nothing for
/// `ttl` is closed, looked for every `check_interval` (simplexmq `Server.hs`,
/// `disconnectTransport`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InactiveClients {
    pub disconnect: bool,
    pub ttl: Duration,
    pub check_interval: Duration,
}

impl Default for InactiveClients {
    fn default() -> Self {
        InactiveClients {
            disconnect: false,
            ttl: DEFAULT_INACTIVE_TTL,
            check_interval: DEFAULT_INACTIVE_CHECK,
        }
    }
}

/// The control port (`[TRANSPORT] control_port`, `[AUTH] control_port_admin_password`,
/// `control_port_user_password`, `daily_block_queue_quota`; `server/control/`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlPort {
    /// Listened on at 127.0.0.1; `None`: no control port.
    pub port: Option<u16>,
    pub admin_password: Option<Vec<u8>>,
    pub user_password: Option<Vec<u8>>,
    /// Queues `block` may block a UTC day: 0 no limit, negative no blocking.
    pub daily_block_quota: i64,
}

/// `[WEB]` and what the web site shows (`[INFORMATION]`, the `.onion` host of `[TRANSPORT] host`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Web {
    pub https: Option<u16>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Where the site is written at start; `None`: no site (`server/web.rs`).
    pub static_path: Option<PathBuf>,
    /// The port serving the site over plain HTTP.
    pub http: Option<u16>,
    /// `[INFORMATION]`, shown on the server information page.
    pub information: crate::web::info::Information,
    /// The first `.onion` host of `[TRANSPORT] host`, announced by the page (`onion-location`).
    pub onion_host: Option<String>,
}

/// What `start` runs with, after the command line and the data directory are read.
#[derive(Debug, Clone)]
pub struct StartConfig {
    /// Where the store, the lock and the metrics file are (the reference's log directory).
    pub data_dir: PathBuf,
    /// Where the certificates and keys are (the reference's configuration directory; the data
    /// directory in the one-folder layout of `--data-dir`).
    pub config_dir: PathBuf,
    /// What the memory store keeps over a restart (`[STORE_LOG] enable`, `restore_messages`).
    pub keep: crate::store::Keep,
    pub ports: Vec<u16>,
    /// Ports serving SMP over WebSocket (`[TRANSPORT] websockets`); none when off.
    pub websocket_ports: Vec<u16>,
    /// The web site and certificate (`[WEB]`): on `https`, when it is an SMP port too, a client
    /// that names a host (TLS SNI) gets this certificate, the site and SMP over WebSocket; one that
    /// names none stays native SMP (simplexmq `Server.hs`, `runServer`); on a port of its own,
    /// the site over HTTPS; on `http`, the site over plain HTTP.
    pub web: Web,
    /// `[INACTIVE_CLIENTS]`.
    pub inactive: InactiveClients,
    pub control: ControlPort,
    /// Number of shards, one per pinned core.
    pub shards: usize,
    /// Connections held at once over all shards; `None`: `limits::MAX_CONNECTIONS`, or fewer if
    /// the open-file limit cannot be raised that far (`server::admission::fit_open_files`).
    pub max_connections: Option<usize>,
    /// Connections of one IP address in their TLS or SMP handshake at once.
    pub max_handshakes_per_address: usize,
    pub tls_timeout: Duration,
    pub handshake_timeout: Duration,
    pub settings: Settings,
    /// How often the metrics file is rewritten; `None`: no metrics file (`prometheus_interval`).
    pub metrics_interval: Option<Duration>,
    /// The daily statistics file and the statistics backup (`[STORE_LOG] log_stats`).
    pub log_stats: bool,
    /// Where the metrics are served over HTTP (`[RELAY] metrics_listen`); `None`: nowhere.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// A connection whose output stays over its bound this long is closed.
    pub slow_reader_close: Duration,
    /// Each connection's output bounds (`limits::OutputLimits`).
    pub output_limits: limits::OutputLimits,
    /// The store the relay runs on.
    pub store: crate::store::StoreKind,
    /// When the journal store makes its records durable (`start --fsync`).
    pub durability: crate::store::journal::Durability,
    /// The cap on the bytes of the journal store's segment files (`start --journal-max-size`);
    /// `None`: no cap.
    pub journal_max_size: Option<u64>,
    /// Records after which a journal group takes a checkpoint while the relay runs (`start
    /// --journal-checkpoint-records`).
    pub journal_checkpoint_records: u64,
    /// The PostgreSQL store's database, schema and pool (`start --database`, …).
    pub postgres: crate::store::postgres::PgConfig,
    /// What the tests' hooks change; all unset unless the binary is built with the `test-kit`
    /// feature (which only test builds enable) and a `--test-*` flag sets them.
    pub test: TestHooks,
}

/// The tests' hooks into a running relay (`start --test-*`, only in builds with the `test-kit`
/// feature: `cargo test` turns it on, `cargo build --release` does not).
#[derive(Debug, Clone, Default)]
pub struct TestHooks {
    /// Shard `.0`'s reads of queue heads wait `.1` first (`store/held.rs`).
    pub store_delay: Option<(usize, Duration)>,
    /// Shard `.0` fails its start in the way `.1` names (failed-start tests).
    pub fail_start: Option<(usize, StartFault)>,
    /// Shard 0 serves clock-control commands on this Unix socket (`src/server/shard/clock_control.rs`).
    pub clock_control: Option<PathBuf>,
    /// How often the slow-reader watchdog looks (`src/server/conn/mod.rs`), instead of a quarter of
    /// the limit: tests that advance the clock past a long limit need not wait for it.
    pub slow_reader_tick: Option<Duration>,
    /// SUBs register their subscriber a second after their first-message read, as the
    /// reference's subscriber thread does (`docs/ARCHITECTURE.md` §3, the T1 race): the race
    /// tests must fail on such a relay.
    pub late_registration: bool,
}

/// How the start-up test hook makes a shard fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFault {
    /// Its listener cannot bind.
    Bind,
    /// Its thread ends before it reports anything, as when its executor cannot be built.
    Exit,
}

/// Queue-protocol settings; their defaults, the reference's (simplexmq `Server/Main.hs`,
/// `Server/Env/STM.hs`), are declared with the settings in `settings.rs`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Messages a queue holds before the quota marker (`msgQueueQuota`).
    pub quota: usize,
    pub message_ttl: Duration,
    /// How often expired messages are deleted from every queue.
    pub expire_interval: Duration,
    /// Delete a queue's expired messages before each SEND to it.
    pub expire_on_send: bool,
    pub notification_ttl: Duration,
    /// NEW is refused with AUTH when off.
    pub new_queues: bool,
    /// Basic auth NEW must carry when set (`create_password`).
    pub create_password: Option<Vec<u8>>,
    /// The proxy role of private routing (PRXY/PFWD).
    pub proxy: ProxySettings,
}

/// The proxy role (simplexmq `Server.hs`), on by default as in the reference.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    /// Off: PRXY is answered `ERR PROXY BASIC_AUTH`, as the reference without the role.
    pub enabled: bool,
    /// Password PRXY must carry; `None`: the create password, as the reference.
    pub password: Option<Vec<u8>>,
    /// Connect to loopback, private and other special addresses (tests on one host).
    pub allow_private: bool,
    /// SOCKS5 proxy for `.onion` destinations (Tor); without it they are refused.
    pub socks_proxy: Option<SocketAddr>,
    /// TCP, TLS and the SMP handshake with a destination (reference: 45 s, background).
    pub connect_timeout: Duration,
    /// An answer to a forwarded command (reference: 30 s, background).
    pub command_timeout: Duration,
    /// A failed connection is reported again without retrying for this long (reference: 30 s).
    pub persist_error: Duration,
    /// A destination session nobody used for this long is closed.
    pub idle_close: Duration,
    /// Destination sessions per shard, connecting or open.
    pub max_sessions_per_shard: usize,
    /// `[PROXY] client_concurrency`: forwarded commands of one connection answered at once.
    pub client_concurrency: usize,
    /// `[PROXY] own_server_domains`: destinations on these domains (or their subdomains) are
    /// counted again as "own" in the proxy statistics.
    pub own_server_domains: Vec<String>,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            enabled: true,
            password: None,
            allow_private: false,
            // Blank: `socks_proxy` and `own_server_domains` are settings (`settings.rs`).
            socks_proxy: None,
            connect_timeout: Duration::from_secs(45),
            command_timeout: Duration::from_secs(30),
            persist_error: Duration::from_secs(30),
            idle_close: Duration::from_secs(10 * 60),
            max_sessions_per_shard: 1024,
            client_concurrency: crate::limits::DEFAULT_PROXIED_IN_FLIGHT,
            own_server_domains: Vec::new(),
        }
    }
}

impl Default for Settings {
    /// The settings' defaults (`settings.rs`), as `StartConfig::new` has them.
    fn default() -> Self {
        StartConfig::new(Path::new(DEFAULT_DATA_DIR)).settings
    }
}
