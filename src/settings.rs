//! Every setting of `start` that both the configuration file and the command line may set, declared
//! once: its `StartOptions` field and type, where it goes in `StartConfig`, its default, its key in
//! `smp-server.ini` with that key's parser and bounds, and its `start` flag with the flag's
//! parser, bounds and help. The file layer (`ini::parse`), the command-line layer (`StartFlags`,
//! flattened into `start`'s arguments in `cli.rs`), the defaults (`StartOptions::defaults`, which
//! `config::StartConfig::new` and `config::Settings::default` start from, and which each flag's
//! help shows), the precedence (`StartOptions::or`) and the application (`StartOptions::apply_to`)
//! are all derived from the table below, so adding a setting is one entry there. What people read
//! is checked against it by tests, which name what is missing: the key table at the top of
//! `ini.rs` (`ini::applied_keys`), the file `init` writes (`cli.rs`) and the README's table of
//! `start` options (`the_readme_names_every_setting` below).
//!
//! Keys of the file that set no `start` option (`[TRANSPORT] host`, the store kinds) and the
//! reference keys this relay refuses are listed in `ini::KEYS`; flags that only the command line
//! has (test hooks, the proxy switches) are in `cli.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::{self, StartConfig};
use crate::ini::values;
use crate::limits;

/// Declares the settings; see the module comment. Each entry:
///
/// ```text
/// field: Type {
///     set: |config, value| <where the value goes>,
///     default: <Option<Type>: `Some(value)`, or `None` to leave the field unset (an `Option` field
///               of `StartConfig`)> [=> <what the help shows instead, e.g. a default computed at
///               start>],
///     ini: "SECTION" "key" => <parser: &str -> Result<Type, String>>,
///     flag: (<clap `#[arg(...)]` attributes, e.g. `long = "quota", value_parser = ini::quota`>
///            or `skip` when only the file sets it),
/// }
/// ```
///
/// The doc comment of an entry is the flag's help; `[default: …]` is appended to it.
macro_rules! start_settings {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty {
            set: |$c:ident, $v:ident| $set:expr,
            default: $default:expr $(=> $shown:expr)?,
            ini: $section:literal $key:literal => $parse:expr,
            flag: ($($arg:tt)*),
        }
    )*) => {
        /// What a layer of configuration (the file or the command line) sets; `None` is "not set
        /// here". Precedence is command line over file over default:
        /// `cli.or(file).apply_to(&mut config)`.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct StartOptions {
            $(pub $field: Option<$ty>,)*
        }

        impl StartOptions {
            /// The defaults, the lowest layer: what `config::StartConfig::new` starts with.
            pub fn defaults() -> StartOptions {
                StartOptions {
                    $($field: $default,)*
                }
            }

            /// Each option of `self` where set, else that of `lower`.
            pub fn or(self, lower: StartOptions) -> StartOptions {
                StartOptions {
                    $($field: self.$field.or(lower.$field),)*
                }
            }

            /// Writes the options that are set into `c`; the rest keep `c`'s values (the defaults).
            pub fn apply_to(self, c: &mut StartConfig) {
                $(
                    if let Some($v) = self.$field {
                        let $c: &mut StartConfig = &mut *c;
                        $set;
                    }
                )*
            }
        }

        /// `(section, key)` of every setting of the file, in declaration order.
        pub const INI_KEYS: &[(&str, &str)] = &[$(($section, $key),)*];

        /// Parses the value of the setting at `[section] key` into `o`; `None`: no setting has
        /// that key. The error says what the value should be.
        pub(crate) fn apply_ini(
            o: &mut StartOptions,
            section: &str,
            key: &str,
            value: &str,
        ) -> Option<Result<(), String>> {
            $(
                if section == $section && key == $key {
                    let parse: fn(&str) -> Result<$ty, String> = $parse;
                    return Some(parse(value).map(|v| o.$field = Some(v)));
                }
            )*
            None
        }

        /// `arg`'s help with `[default: …]` appended when `arg` is the flag of a setting that has a
        /// default (or a text in place of one).
        fn show_default(arg: clap::Arg) -> clap::Arg {
            let defaults = StartOptions::defaults();
            let shown = match arg.get_id().as_str() {
                $(
                    stringify!($field) => Option::<String>::None
                        $(.or(Some(($shown).to_string())))?
                        .or_else(|| defaults.$field.as_ref().map(ShowDefault::show)),
                )*
                _ => None,
            };
            match shown {
                Some(shown) => {
                    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                    arg.help(format!("{help} [default: {shown}]"))
                }
                None => arg,
            }
        }

        /// The settings' flags of `start` (flattened into its arguments by `cli.rs`).
        #[derive(clap::Args, Debug, Clone, Default)]
        #[command(mut_args(show_default))]
        pub struct StartFlags {
            $(
                $(#[doc = $doc])*
                #[arg($($arg)*)]
                pub $field: Option<$ty>,
            )*
        }

        impl StartFlags {
            /// The options given on the command line; absent ones leave the file's or the default.
            pub fn options(&self) -> StartOptions {
                StartOptions {
                    $($field: self.$field.clone(),)*
                }
            }
        }
    };
}

start_settings! {
    /// The store: journal (memory-mapped journals under `<data-dir>/journal`), memory (kept in
    /// memory, saved at a clean stop) or postgres (the database of --database) (ini `[STORE_LOG]
    /// store_messages`, where `database` names postgres).
    store: crate::store::StoreKind {
        set: |c, v| c.store = v,
        default: Some(crate::store::StoreKind::Journal) => "journal".to_string(),
        ini: "STORE_LOG" "store_messages" => values::store_messages,
        flag: (long = "store", value_name = "journal|memory|postgres", value_parser = values::store_messages),
    }
    /// When the journal store makes its records durable: every-batch (answers wait for the sync),
    /// interval-ms N, or never (the system's write-back); a killed relay loses nothing either way,
    /// an OS crash what was not synced (ini `[STORE_LOG] fsync`).
    durability: crate::store::journal::Durability {
        set: |c, v| c.durability = v,
        default: Some(crate::store::journal::DEFAULT_DURABILITY) => "interval-ms 50".to_string(),
        ini: "STORE_LOG" "fsync" => values::fsync,
        flag: (long = "fsync", value_name = "MODE", value_parser = values::fsync),
    }
    /// The most bytes the journal store's segment files may take, over all groups: BYTES, or with a
    /// suffix K, M, G or T (powers of 1024). At the cap SEND and NEW answer ERR STORE, deletes go
    /// on (ini `[STORE_LOG] journal_max_size`).
    journal_max_size: u64 {
        set: |c, v| c.journal_max_size = Some(v),
        default: None => "no cap",
        ini: "STORE_LOG" "journal_max_size" => values::size_bytes,
        flag: (long, value_name = "BYTES", value_parser = values::size_bytes),
    }
    /// Records after which a journal group takes a checkpoint while the relay runs, in the
    /// background: the most a start after a crash replays per group beyond the checkpoint it
    /// loads, 1000 to 100000000 (ini `[STORE_LOG] journal_checkpoint_records`).
    journal_checkpoint_records: u64 {
        set: |c, v| c.journal_checkpoint_records = v,
        default: Some(crate::store::journal::DEFAULT_CHECKPOINT_RECORDS) => "10000".to_string(),
        ini: "STORE_LOG" "journal_checkpoint_records" => values::checkpoint_records,
        flag: (long, value_name = "N", value_parser = values::checkpoint_records),
    }
    /// The PostgreSQL store's database: a libpq connection string, key-value or URL; without a
    /// host, the socket in /var/run/postgresql (ini `[STORE_LOG] db_connection`).
    database: String {
        set: |c, v| c.postgres.conninfo = v,
        default: Some(crate::store::postgres::pool::DEFAULT_CONNINFO.to_string()),
        ini: "STORE_LOG" "db_connection" => values::text,
        flag: (long = "database", value_name = "CONNINFO"),
    }
    /// The schema of the PostgreSQL store, created with its migrations if missing (ini
    /// `[STORE_LOG] db_schema`).
    db_schema: String {
        set: |c, v| c.postgres.schema = v,
        default: Some(crate::store::postgres::pool::DEFAULT_SCHEMA.to_string()),
        ini: "STORE_LOG" "db_schema" => values::text,
        flag: (long = "schema", value_name = "NAME"),
    }
    /// Connections to the PostgreSQL store's database, each with a thread of its own, 1 to 256
    /// (ini `[STORE_LOG] db_pool_size`).
    db_pool_size: usize {
        set: |c, v| c.postgres.pool_size = v,
        default: Some(crate::store::postgres::pool::DEFAULT_POOL_SIZE),
        ini: "STORE_LOG" "db_pool_size" => values::pool_size,
        flag: (long = "pool-size", value_name = "N", value_parser = values::pool_size),
    }
    /// Seconds a statement of the PostgreSQL store may run before it is cancelled and its
    /// command answered ERR STORE (ini `[RELAY] db_statement_timeout_secs`).
    db_statement_timeout: Duration {
        set: |c, v| c.postgres.statement_timeout = v,
        default: Some(crate::store::postgres::pool::DEFAULT_STATEMENT_TIMEOUT),
        ini: "RELAY" "db_statement_timeout_secs" => values::seconds,
        flag: (
            long = "db-statement-timeout-secs",
            value_name = "SECS",
            value_parser = values::seconds
        ),
    }
    /// Seconds a PostgreSQL store operation waits for a free connection before it answers
    /// ERR STORE (ini `[RELAY] db_pool_wait_secs`).
    db_pool_wait: Duration {
        set: |c, v| c.postgres.pool_wait = v,
        default: Some(crate::store::postgres::pool::DEFAULT_POOL_WAIT),
        ini: "RELAY" "db_pool_wait_secs" => values::seconds,
        flag: (
            long = "db-pool-wait-secs",
            value_name = "SECS",
            value_parser = values::seconds
        ),
    }
    /// Queue records the PostgreSQL store holds in memory besides those in use (subscribed, or in
    /// a command being run), over all shards, 1000 to 100000000; the others are read when used
    /// (ini `[RELAY] pg_queue_cache`).
    pg_queue_cache: usize {
        set: |c, v| c.postgres.queue_cache = v,
        default: Some(crate::store::postgres::pool::DEFAULT_QUEUE_CACHE),
        ini: "RELAY" "pg_queue_cache" => values::queue_cache,
        flag: (long = "pg-queue-cache", value_name = "N", value_parser = values::queue_cache),
    }
    /// Port to listen on; repeat for several (ini `[TRANSPORT] port`).
    ports: Vec<u16> {
        set: |c, v| c.ports = v,
        default: Some(vec![config::DEFAULT_PORT]),
        ini: "TRANSPORT" "port" => values::ports,
        flag: (long = "port", value_parser = values::port, action = clap::ArgAction::Append),
    }
    /// SMP over WebSocket: off, on (port 80) or comma-separated ports, each other than the SMP
    /// ports (ini `[TRANSPORT] websockets`).
    websockets: values::WebSockets {
        set: |c, v| c.websocket_ports = v.0,
        default: Some(values::WebSockets(Vec::new())),
        ini: "TRANSPORT" "websockets" => values::websockets,
        flag: (long, value_name = "off|on|PORTS", value_parser = values::websockets),
    }
    /// Port serving web clients over TLS with --web-cert and --web-key: one of the SMP ports, split
    /// by TLS SNI (a client naming a host gets the web certificate, the web site and SMP over
    /// WebSocket, one naming none native SMP), or a port of its own serving the web site (ini
    /// `[WEB] https`).
    web_https: u16 {
        set: |c, v| c.web.https = Some(v),
        default: None,
        ini: "WEB" "https" => values::port,
        flag: (long = "web-https", value_name = "PORT", value_parser = values::port),
    }
    /// The web certificate chain (PEM) for --web-https; any key rustls signs with (RSA, ECDSA,
    /// Ed25519) (ini `[WEB] cert`).
    web_cert: String {
        set: |c, v| c.web.cert = Some(v.into()),
        default: None,
        ini: "WEB" "cert" => values::text,
        flag: (long = "web-cert", value_name = "FILE"),
    }
    /// The web certificate's private key (PEM) (ini `[WEB] key`).
    web_key: String {
        set: |c, v| c.web.key = Some(v.into()),
        default: None,
        ini: "WEB" "key" => values::text,
        flag: (long = "web-key", value_name = "FILE"),
    }
    /// Folder the web site (server information and link pages) is written to at start; the site
    /// is served on --web-http, --web-https and an SMP port shared by SNI only when it is set (ini
    /// `[WEB] static_path`).
    web_static_path: String {
        set: |c, v| c.web.static_path = Some(v.into()),
        default: None,
        ini: "WEB" "static_path" => values::text,
        flag: (long = "web-static-path", value_name = "DIR"),
    }
    /// Port serving the web site over plain HTTP, with --web-static-path (ini `[WEB] http`).
    web_http: u16 {
        set: |c, v| c.web.http = Some(v),
        default: None,
        ini: "WEB" "http" => values::port,
        flag: (long = "web-http", value_name = "PORT", value_parser = values::port),
    }
    /// Number of shards, each pinned to its own core, 1 to 64 (ini `[RELAY] cores`).
    shards: usize {
        set: |c, v| c.shards = v,
        // A default, not the operator's number: on a machine with more cores than shards allowed,
        // it takes the most allowed (an explicit `--cores` beyond it is refused by `ini::cores`).
        default: Some(
            std::thread::available_parallelism().map_or(1, |n| n.get()).min(limits::MAX_SHARDS)
        ) => format!("every online core, at most {}", limits::MAX_SHARDS),
        ini: "RELAY" "cores" => values::cores,
        flag: (long = "cores", value_name = "CORES", value_parser = values::cores),
    }
    /// Connections held at once, over all shards (ini `[RELAY] max_connections`). The relay raises
    /// its soft RLIMIT_NOFILE to fit it.
    max_connections: usize {
        set: |c, v| c.max_connections = Some(v),
        // Unset: `limits::MAX_CONNECTIONS`, or fewer if the open-file limit cannot be raised that
        // far (`server::admission::fit_open_files`).
        default: None => format!(
            "{}, or what the open-file limit allows",
            limits::MAX_CONNECTIONS
        ),
        ini: "RELAY" "max_connections" => values::max_connections,
        flag: (long, value_parser = values::max_connections),
    }
    /// Connections of one IP address that may be in their TLS or SMP handshake at once; more are
    /// closed at accept (ini `[RELAY] max_handshakes_per_address`).
    max_handshakes_per_address: usize {
        set: |c, v| c.max_handshakes_per_address = v,
        default: Some(limits::MAX_HANDSHAKES_PER_ADDRESS),
        ini: "RELAY" "max_handshakes_per_address" => values::max_connections,
        flag: (long, value_parser = values::max_connections),
    }
    /// Seconds a client has to complete TLS (ini `[RELAY] tls_timeout_secs`).
    tls_timeout: Duration {
        set: |c, v| c.tls_timeout = v,
        default: Some(limits::TLS_SETUP_TIMEOUT),
        ini: "RELAY" "tls_timeout_secs" => values::seconds,
        flag: (
            long = "tls-timeout-secs",
            value_name = "TLS_TIMEOUT_SECS",
            value_parser = values::seconds
        ),
    }
    /// Seconds a client has to complete the SMP handshake after TLS (ini `[RELAY]
    /// handshake_timeout_secs`).
    handshake_timeout: Duration {
        set: |c, v| c.handshake_timeout = v,
        default: Some(limits::SMP_HANDSHAKE_TIMEOUT),
        ini: "RELAY" "handshake_timeout_secs" => values::seconds,
        flag: (
            long = "handshake-timeout-secs",
            value_name = "HANDSHAKE_TIMEOUT_SECS",
            value_parser = values::seconds
        ),
    }
    /// Seconds a connection may leave its output over the bound (1 MiB) before it is closed
    /// (ini `[RELAY] slow_reader_close_secs`).
    slow_reader_close: Duration {
        set: |c, v| c.slow_reader_close = v,
        default: Some(limits::SLOW_READER_CLOSE),
        ini: "RELAY" "slow_reader_close_secs" => values::seconds,
        flag: (
            long = "slow-reader-close-secs",
            value_name = "SLOW_READER_CLOSE_SECS",
            value_parser = values::seconds
        ),
    }
    /// Messages a queue holds before senders get ERR QUOTA (ini `[RELAY] quota`).
    quota: usize {
        set: |c, v| c.settings.quota = v,
        default: Some(128),
        ini: "RELAY" "quota" => values::quota,
        flag: (long, value_parser = values::quota),
    }
    /// Seconds a message is kept (ini `[STORE_LOG] expire_messages_days`).
    message_ttl: Duration {
        set: |c, v| c.settings.message_ttl = v,
        default: Some(Duration::from_secs(21 * 86400)),
        ini: "STORE_LOG" "expire_messages_days" => |v| values::duration(v, 86400),
        flag: (
            long = "message-ttl-secs",
            value_name = "MESSAGE_TTL_SECS",
            value_parser = values::seconds
        ),
    }
    /// Seconds between expiration runs over all queues (ini `[RELAY] expire_interval_secs`).
    expire_interval: Duration {
        set: |c, v| c.settings.expire_interval = v,
        default: Some(Duration::from_secs(2 * 3600)),
        ini: "RELAY" "expire_interval_secs" => values::seconds,
        flag: (
            long = "expire-interval-secs",
            value_name = "EXPIRE_INTERVAL_SECS",
            value_parser = values::seconds
        ),
    }
    /// Delete a queue's expired messages before each SEND to it: on or off (ini `[STORE_LOG]
    /// expire_messages_on_send`).
    expire_on_send: bool {
        set: |c, v| c.settings.expire_on_send = v,
        default: Some(true),
        ini: "STORE_LOG" "expire_messages_on_send" => values::on_off,
        flag: (long, value_parser = values::on_off, action = clap::ArgAction::Set),
    }
    /// Seconds a notification is kept (ini `[STORE_LOG] expire_ntfs_hours`).
    notification_ttl: Duration {
        set: |c, v| c.settings.notification_ttl = v,
        default: Some(Duration::from_secs(crate::store::memory::NTF_TTL_SECS as u64)),
        ini: "STORE_LOG" "expire_ntfs_hours" => |v| values::duration(v, 3600),
        flag: (
            long = "notification-ttl-secs",
            value_name = "NOTIFICATION_TTL_SECS",
            value_parser = values::seconds
        ),
    }
    /// The memory store keeps its queues over a restart: on or off (ini `[STORE_LOG] enable`;
    /// off, as the reference without its store log, keeps nothing: no file is written).
    store_log: bool {
        set: |c, v| c.keep.queues = v,
        default: Some(true),
        ini: "STORE_LOG" "enable" => values::on_off,
        flag: (long, value_name = "on|off", value_parser = values::on_off, action = clap::ArgAction::Set),
    }
    /// The memory store keeps messages and notifications over a restart: on or off (ini
    /// `[STORE_LOG] restore_messages`; the reference's default is the value of `enable`).
    restore_messages: bool {
        set: |c, v| c.keep.messages = v,
        default: Some(true),
        ini: "STORE_LOG" "restore_messages" => values::on_off,
        flag: (long, value_name = "on|off", value_parser = values::on_off, action = clap::ArgAction::Set),
    }
    /// Allow NEW (queue creation): on or off (ini `[AUTH] new_queues`).
    new_queues: bool {
        set: |c, v| c.settings.new_queues = v,
        default: Some(true),
        ini: "AUTH" "new_queues" => values::on_off,
        flag: (long, value_parser = values::on_off, action = clap::ArgAction::Set),
    }
    /// Close connections without subscriptions that sent and received nothing for
    /// --inactive-ttl-secs, looked for every --inactive-check-secs (ini `[INACTIVE_CLIENTS]
    /// disconnect`; the reference's template turns it on).
    inactive_disconnect: bool {
        set: |c, v| c.inactive.disconnect = v,
        default: Some(false),
        ini: "INACTIVE_CLIENTS" "disconnect" => values::on_off,
        flag: (long, value_name = "on|off", value_parser = values::on_off, action = clap::ArgAction::Set),
    }
    /// Seconds without a block either way after which a connection without subscriptions is
    /// inactive (ini `[INACTIVE_CLIENTS] ttl`).
    inactive_ttl: Duration {
        set: |c, v| c.inactive.ttl = v,
        default: Some(config::DEFAULT_INACTIVE_TTL),
        ini: "INACTIVE_CLIENTS" "ttl" => values::seconds,
        flag: (long = "inactive-ttl-secs", value_name = "SECS", value_parser = values::seconds),
    }
    /// Seconds between looks for inactive connections (ini `[INACTIVE_CLIENTS]
    /// check_interval`).
    inactive_check_interval: Duration {
        set: |c, v| c.inactive.check_interval = v,
        default: Some(config::DEFAULT_INACTIVE_CHECK),
        ini: "INACTIVE_CLIENTS" "check_interval" => values::seconds,
        flag: (long = "inactive-check-secs", value_name = "SECS", value_parser = values::seconds),
    }
    /// The password NEW must carry (the file only: a command line is visible to every user).
    create_password: Vec<u8> {
        set: |c, v| c.settings.create_password = Some(v),
        // Unset: anyone may create queues.
        default: None,
        ini: "AUTH" "create_password" => values::create_password,
        flag: (skip),
    }
    /// The control port, on 127.0.0.1 (ini `[TRANSPORT] control_port`).
    control_port: u16 {
        set: |c, v| c.control.port = Some(v),
        default: None => "no control port",
        ini: "TRANSPORT" "control_port" => values::port,
        flag: (long = "control-port", value_name = "PORT", value_parser = values::port),
    }
    /// The control port's admin password (the file only).
    control_port_admin_password: Vec<u8> {
        set: |c, v| c.control.admin_password = Some(v),
        default: None,
        ini: "AUTH" "control_port_admin_password" => values::control_password,
        flag: (skip),
    }
    /// The control port's user password (the file only).
    control_port_user_password: Vec<u8> {
        set: |c, v| c.control.user_password = Some(v),
        default: None,
        ini: "AUTH" "control_port_user_password" => values::control_password,
        flag: (skip),
    }
    /// Queues the control port may block a UTC day: 0 no limit, -1 no blocking (the file only).
    daily_block_queue_quota: i64 {
        set: |c, v| c.control.daily_block_quota = v,
        default: Some(20),
        ini: "AUTH" "daily_block_queue_quota" => values::integer,
        flag: (skip),
    }
    /// Rewrite <data-dir>/smp-server-metrics.txt (Prometheus text) every SECS seconds (ini
    /// `[STORE_LOG] prometheus_interval`).
    metrics_interval: Duration {
        set: |c, v| c.metrics_interval = Some(v),
        default: None => "no metrics file",
        ini: "STORE_LOG" "prometheus_interval" => values::seconds,
        flag: (long, value_name = "SECS", value_parser = values::seconds),
    }
    /// Write the daily statistics line to <data-dir>/smp-server-stats.daily.log and keep the
    /// counters across restarts in <data-dir>/smp-server-stats.log (ini `[STORE_LOG] log_stats`).
    log_stats: bool {
        set: |c, v| c.log_stats = v,
        default: Some(false),
        ini: "STORE_LOG" "log_stats" => values::on_off,
        flag: (long, value_name = "on|off", value_parser = values::on_off, action = clap::ArgAction::Set),
    }
    /// Serve the metrics file's text over HTTP on GET /metrics at this address (ini `[RELAY]
    /// metrics_listen`).
    metrics_listen: SocketAddr {
        set: |c, v| c.metrics_listen = Some(v),
        default: None => "off",
        ini: "RELAY" "metrics_listen" => values::socket_addr,
        flag: (long, value_name = "ADDR:PORT", value_parser = values::socket_addr),
    }
    /// SOCKS5 proxy (e.g. Tor, 127.0.0.1:9050) for .onion destinations; without it they are refused
    /// (ini `[PROXY] socks_proxy`).
    socks_proxy: SocketAddr {
        set: |c, v| c.settings.proxy.socks_proxy = Some(v),
        default: None,
        ini: "PROXY" "socks_proxy" => values::socket_addr,
        flag: (long, value_name = "HOST:PORT", value_parser = values::socket_addr),
    }
    /// Forwarded commands (PRXY, PFWD) of one connection being answered at once, 1 to 4096; a
    /// connection's next ones wait for one to end (ini `[PROXY] client_concurrency`, the
    /// reference's default 32).
    proxy_client_concurrency: usize {
        set: |c, v| c.settings.proxy.client_concurrency = v,
        default: Some(limits::DEFAULT_PROXIED_IN_FLIGHT),
        ini: "PROXY" "client_concurrency" => values::proxy_concurrency,
        flag: (long, value_name = "N", value_parser = values::proxy_concurrency),
    }
    /// Destinations on these domains (or their subdomains) are counted again as "own" in the proxy
    /// statistics (the file only, as the reference).
    own_server_domains: Vec<String> {
        set: |c, v| c.settings.proxy.own_server_domains = v,
        default: Some(Vec::new()),
        ini: "PROXY" "own_server_domains" => |v| {
            Ok(v.split_whitespace().map(str::to_string).collect())
        },
        flag: (skip),
    }
}

/// A default as `start --help` shows it, in the flag's form.
trait ShowDefault {
    fn show(&self) -> String;
}

impl ShowDefault for u64 {
    fn show(&self) -> String {
        self.to_string()
    }
}

impl ShowDefault for i64 {
    fn show(&self) -> String {
        self.to_string()
    }
}

impl ShowDefault for u16 {
    fn show(&self) -> String {
        self.to_string()
    }
}

impl ShowDefault for usize {
    fn show(&self) -> String {
        self.to_string()
    }
}

impl ShowDefault for String {
    fn show(&self) -> String {
        self.clone()
    }
}

impl ShowDefault for crate::store::StoreKind {
    fn show(&self) -> String {
        self.name().to_string()
    }
}

impl ShowDefault for crate::store::journal::Durability {
    fn show(&self) -> String {
        use crate::store::journal::Durability;
        match self {
            Durability::EveryBatch => "every-batch".into(),
            Durability::Interval(d) => format!("interval-ms {}", d.as_millis()),
            Durability::Never => "never".into(),
        }
    }
}

impl ShowDefault for bool {
    fn show(&self) -> String {
        if *self { "on" } else { "off" }.to_string()
    }
}

/// Seconds, as the `--…-secs` flags take them, with days or hours when whole.
impl ShowDefault for Duration {
    fn show(&self) -> String {
        let s = self.as_secs();
        match s {
            _ if s >= 2 * 86400 && s % 86400 == 0 => format!("{s} ({} days)", s / 86400),
            _ if s >= 2 * 3600 && s % 3600 == 0 => format!("{s} ({} hours)", s / 3600),
            _ => s.to_string(),
        }
    }
}

/// As the file and the flag take it: `off`, or the ports.
impl ShowDefault for values::WebSockets {
    fn show(&self) -> String {
        if self.0.is_empty() {
            "off".to_string()
        } else {
            self.0.show()
        }
    }
}

impl ShowDefault for SocketAddr {
    fn show(&self) -> String {
        self.to_string()
    }
}

impl<T: std::fmt::Display> ShowDefault for Vec<T> {
    fn show(&self) -> String {
        let shown: Vec<String> = self.iter().map(T::to_string).collect();
        shown.join(", ")
    }
}

impl StartConfig {
    /// The configuration with every default: those of the settings (`StartOptions::defaults`,
    /// written over the blank values below) and those of the fields no setting sets. Here rather
    /// than in `config.rs`, so that `config` does not depend on this table.
    pub fn new(data_dir: &std::path::Path) -> Self {
        let mut c = StartConfig {
            data_dir: data_dir.to_path_buf(),
            config_dir: data_dir.to_path_buf(),
            keep: crate::store::Keep::ALL,
            output_limits: crate::limits::OutputLimits::default(),
            store: crate::store::StoreKind::default(),
            durability: crate::store::journal::DEFAULT_DURABILITY,
            journal_max_size: None,
            journal_checkpoint_records: crate::store::journal::DEFAULT_CHECKPOINT_RECORDS,
            postgres: crate::store::postgres::PgConfig::default(),
            test: Default::default(),
            // The settings' fields, blank until their defaults are written below.
            ports: Vec::new(),
            websocket_ports: Vec::new(),
            web: config::Web::default(),
            inactive: config::InactiveClients::default(),
            control: config::ControlPort::default(),
            shards: 0,
            max_connections: None,
            max_handshakes_per_address: 0,
            tls_timeout: Duration::ZERO,
            handshake_timeout: Duration::ZERO,
            metrics_interval: None,
            log_stats: false,
            metrics_listen: None,
            slow_reader_close: Duration::ZERO,
            settings: config::Settings {
                quota: 0,
                message_ttl: Duration::ZERO,
                expire_interval: Duration::ZERO,
                expire_on_send: false,
                notification_ttl: Duration::ZERO,
                new_queues: false,
                create_password: None,
                proxy: config::ProxySettings::default(),
            },
        };
        StartOptions::defaults().apply_to(&mut c);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ini;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Start {
        #[command(flatten)]
        settings: StartFlags,
    }

    fn flags(args: &[&str]) -> Result<StartOptions, String> {
        Start::try_parse_from(std::iter::once("start").chain(args.iter().copied()))
            .map(|s| s.settings.options())
            .map_err(|e| e.to_string())
    }

    /// The README's table of `start` options names every setting's flag (the ini keys are
    /// checked against `ini.rs`'s table and `init`'s template, in `ini.rs` and `cli.rs`).
    #[test]
    fn the_readme_names_every_setting() {
        let readme = include_str!("../README.md");
        let missing: Vec<String> = Start::command()
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(|long| format!("--{long}"))
            .filter(|flag| {
                !readme.match_indices(flag.as_str()).any(|(i, _)| {
                    !readme[i + flag.len()..]
                        .starts_with(|c: char| c == '-' || c.is_ascii_alphanumeric())
                })
            })
            .collect();
        assert!(missing.is_empty(), "not in README.md: {missing:?}");
    }

    #[test]
    fn flags_are_derived_from_the_table() {
        Start::command().debug_assert();
        assert_eq!(flags(&[]), Ok(StartOptions::default()));
        let o = flags(&[
            "--port",
            "5223",
            "--port",
            "443",
            "--cores",
            "2",
            "--notification-ttl-secs",
            "5",
            "--new-queues",
            "off",
            "--socks-proxy",
            "127.0.0.1:9050",
            "--websockets",
            "8443,8444",
        ])
        .unwrap();
        assert_eq!(
            o,
            StartOptions {
                ports: Some(vec![5223, 443]),
                shards: Some(2),
                notification_ttl: Some(Duration::from_secs(5)),
                new_queues: Some(false),
                socks_proxy: Some(SocketAddr::from(([127, 0, 0, 1], 9050))),
                websockets: Some(ini::WebSockets(vec![8443, 8444])),
                ..StartOptions::default()
            }
        );
        // The bounds and messages of the file's parsers.
        let e = flags(&["--cores", "65"]).unwrap_err();
        assert!(e.contains("expected a whole number from 1 to 64"), "{e}");
        let e = flags(&["--expire-on-send", "yes"]).unwrap_err();
        assert!(e.contains("expected on or off"), "{e}");
        // The flag and the file share one bounded parser.
        let e = flags(&["--port", "0"]).unwrap_err();
        assert!(e.contains("expected a whole number from 1 to 65535"), "{e}");
        assert!(ini::ports("5223,0").is_err());
        // 0 would hold every forwarded command for ever; the top is a named limit.
        let e = flags(&["--proxy-client-concurrency", "0"]).unwrap_err();
        assert!(e.contains("expected a whole number from 1 to 4096"), "{e}");
        assert!(flags(&["--proxy-client-concurrency", "4097"]).is_err());
        assert_eq!(
            flags(&["--proxy-client-concurrency", "4096"])
                .unwrap()
                .proxy_client_concurrency,
            Some(crate::limits::MAX_PROXIED_IN_FLIGHT)
        );
        // Settings of the file only have no flag.
        for file_only in ["--create-password", "--own-server-domains"] {
            assert!(flags(&[file_only, "x"]).is_err(), "{file_only}");
        }
    }

    #[test]
    fn the_command_line_wins_and_apply_to_sets_each_field() {
        let cli = flags(&["--quota", "5", "--notification-ttl-secs", "7"]).unwrap();
        let mut file = StartOptions::default();
        for (section, key, value) in [
            ("RELAY", "quota", "2"),
            ("STORE_LOG", "expire_ntfs_hours", "1"),
            ("RELAY", "max_connections", "9"),
        ] {
            assert_eq!(apply_ini(&mut file, section, key, value), Some(Ok(())));
        }
        assert_eq!(apply_ini(&mut file, "RELAY", "nope", "1"), None);
        let mut c = StartConfig::new(std::path::Path::new("/d"));
        cli.or(file).apply_to(&mut c);
        assert_eq!(c.settings.quota, 5);
        assert_eq!(c.settings.notification_ttl, Duration::from_secs(7));
        assert_eq!(c.max_connections, Some(9));
    }

    /// What `start` runs with when neither the file nor the command line sets anything: the
    /// defaults the help and the documentation give (written out here on purpose, so that a
    /// changed default, or one left blank in `StartConfig::new`, fails this test).
    #[test]
    fn with_nothing_set_each_setting_has_its_default() {
        let mut c = StartConfig::new(std::path::Path::new("/d"));
        StartOptions::default()
            .or(StartOptions::default())
            .apply_to(&mut c);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(c.ports, vec![5223]);
        assert!(c.websocket_ports.is_empty());
        assert_eq!(c.shards, cores.min(64));
        assert_eq!(c.max_connections, None);
        assert_eq!(c.max_handshakes_per_address, 16);
        assert_eq!(c.tls_timeout, Duration::from_secs(60));
        assert_eq!(c.handshake_timeout, Duration::from_secs(120));
        assert_eq!(c.slow_reader_close, Duration::from_secs(60));
        assert_eq!(c.metrics_interval, None);
        assert_eq!(c.journal_max_size, None);
        let s = &c.settings;
        assert_eq!(s.quota, 128);
        assert_eq!(s.message_ttl, Duration::from_secs(21 * 24 * 3600));
        assert_eq!(s.expire_interval, Duration::from_secs(2 * 3600));
        assert!(s.expire_on_send);
        assert_eq!(s.notification_ttl, Duration::from_secs(24 * 3600));
        assert!(s.new_queues);
        assert_eq!(s.create_password, None);
        assert_eq!(s.proxy.socks_proxy, None);
        assert!(s.proxy.own_server_domains.is_empty());
        // `Settings::default` (the queue settings without a `StartConfig`) is the same.
        assert_eq!(
            format!("{:?}", config::Settings::default()),
            format!("{s:?}")
        );
    }

    #[test]
    fn each_flag_s_help_ends_with_its_default() {
        let cmd = Start::command();
        let help = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id);
            arg.and_then(|a| a.get_help()).map(|h| h.to_string())
        };
        for (id, default) in [
            ("ports", "[default: 5223]"),
            ("websockets", "[default: off]"),
            ("shards", "[default: every online core, at most 64]"),
            (
                "max_connections",
                "[default: 65536, or what the open-file limit allows]",
            ),
            ("max_handshakes_per_address", "[default: 16]"),
            ("tls_timeout", "[default: 60]"),
            ("handshake_timeout", "[default: 120]"),
            ("slow_reader_close", "[default: 60]"),
            ("quota", "[default: 128]"),
            ("message_ttl", "[default: 1814400 (21 days)]"),
            ("expire_interval", "[default: 7200 (2 hours)]"),
            ("expire_on_send", "[default: on]"),
            ("notification_ttl", "[default: 86400 (24 hours)]"),
            ("new_queues", "[default: on]"),
            ("metrics_interval", "[default: no metrics file]"),
            ("journal_max_size", "[default: no cap]"),
            ("journal_checkpoint_records", "[default: 10000]"),
        ] {
            let h = help(id).unwrap_or_else(|| panic!("{id} has a help"));
            assert!(h.ends_with(&format!(" {default}")), "{id}: {h}");
            assert_eq!(h.matches("[default:").count(), 1, "{id}: {h}");
        }
        // No default, nothing appended (and the doc comment stays the help).
        let h = help("socks_proxy").expect("socks_proxy has a help");
        assert!(h.ends_with("(ini `[PROXY] socks_proxy`)"), "{h}");
    }
}
