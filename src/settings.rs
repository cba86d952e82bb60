//! Every setting of `start` that both the configuration file and the command line may set, declared
//! once: its `StartOptions` field and type, where it goes in `StartConfig`, its key in
//! `smp-server.ini` with that key's parser and bounds, and its `start` flag with the flag's
//! parser, bounds and help. The file layer (`ini::parse`), the command-line layer (`StartFlags`,
//! flattened into `start`'s arguments in `cli.rs`), the precedence (`StartOptions::or`) and the
//! application (`StartOptions::apply_to`) are all derived from the table below, so adding a
//! setting is one entry there. The defaults stay with the types they fill
//! (`config::StartConfig::new`, `config::Settings::default`).
//!
//! Keys of the file that set no `start` option (`[TRANSPORT] host`, the store kinds) and the
//! reference keys this relay refuses are listed in `ini::KEYS`; flags that only the command line
//! has (test hooks, the proxy switches) are in `cli.rs`.

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::StartConfig;
use crate::ini;

/// Declares the settings; see the module comment. Each entry:
///
/// ```text
/// field: Type {
///     set: |config, value| <where the value goes>,
///     ini: "SECTION" "key" => <parser: &str -> Result<Type, String>>,
///     flag: (<clap `#[arg(...)]` attributes, e.g. `long = "quota", value_parser = ini::quota`>
///            or `skip` when only the file sets it),
/// }
/// ```
///
/// The doc comment of an entry is the flag's help.
macro_rules! start_settings {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty {
            set: |$c:ident, $v:ident| $set:expr,
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
        pub(crate) const INI_KEYS: &[(&str, &str)] = &[$(($section, $key),)*];

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

        /// The settings' flags of `start` (flattened into its arguments by `cli.rs`).
        #[derive(clap::Args, Debug, Clone, Default)]
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
    /// Port to listen on; repeat for several (ini `[TRANSPORT] port`; default 5223).
    ports: Vec<u16> {
        set: |c, v| c.ports = v,
        ini: "TRANSPORT" "port" => ini::ports,
        flag: (long = "port", action = clap::ArgAction::Append),
    }
    /// Number of shards, each pinned to its own core, 1 to 64 (ini `[RELAY] cores`; default:
    /// every online core, at most 64).
    shards: usize {
        set: |c, v| c.shards = v,
        ini: "RELAY" "cores" => ini::cores,
        flag: (long = "cores", value_name = "CORES", value_parser = ini::cores),
    }
    /// Connections held at once, over all shards (ini `[RELAY] max_connections`; default 65536,
    /// or what the open-file limit allows). The relay raises its soft RLIMIT_NOFILE to fit it.
    max_connections: usize {
        set: |c, v| c.max_connections = Some(v),
        ini: "RELAY" "max_connections" => ini::max_connections,
        flag: (long, value_parser = ini::max_connections),
    }
    /// Connections of one IP address that may be in their TLS or SMP handshake at once; more are
    /// closed at accept (ini `[RELAY] max_handshakes_per_address`; default 16).
    max_handshakes_per_address: usize {
        set: |c, v| c.max_handshakes_per_address = v,
        ini: "RELAY" "max_handshakes_per_address" => ini::max_connections,
        flag: (long, value_parser = ini::max_connections),
    }
    /// Seconds a client has to complete TLS (ini `[RELAY] tls_timeout_secs`; default 60).
    tls_timeout: Duration {
        set: |c, v| c.tls_timeout = v,
        ini: "RELAY" "tls_timeout_secs" => ini::seconds,
        flag: (
            long = "tls-timeout-secs",
            value_name = "TLS_TIMEOUT_SECS",
            value_parser = ini::seconds
        ),
    }
    /// Seconds a client has to complete the SMP handshake after TLS (ini `[RELAY]
    /// handshake_timeout_secs`; default 120).
    handshake_timeout: Duration {
        set: |c, v| c.handshake_timeout = v,
        ini: "RELAY" "handshake_timeout_secs" => ini::seconds,
        flag: (
            long = "handshake-timeout-secs",
            value_name = "HANDSHAKE_TIMEOUT_SECS",
            value_parser = ini::seconds
        ),
    }
    /// Seconds a connection may leave its output over the bound (1 MiB) before it is closed
    /// (ini `[RELAY] slow_reader_close_secs`; default 60).
    slow_reader_close: Duration {
        set: |c, v| c.slow_reader_close = v,
        ini: "RELAY" "slow_reader_close_secs" => ini::seconds,
        flag: (
            long = "slow-reader-close-secs",
            value_name = "SLOW_READER_CLOSE_SECS",
            value_parser = ini::seconds
        ),
    }
    /// Messages a queue holds before senders get ERR QUOTA (ini `[RELAY] quota`; default 128).
    quota: usize {
        set: |c, v| c.settings.quota = v,
        ini: "RELAY" "quota" => ini::quota,
        flag: (long, value_parser = ini::quota),
    }
    /// Seconds a message is kept (ini `[STORE_LOG] expire_messages_days`; default 21 days).
    message_ttl: Duration {
        set: |c, v| c.settings.message_ttl = v,
        ini: "STORE_LOG" "expire_messages_days" => |v| ini::duration(v, 86400),
        flag: (
            long = "message-ttl-secs",
            value_name = "MESSAGE_TTL_SECS",
            value_parser = ini::seconds
        ),
    }
    /// Seconds between expiration runs over all queues (ini `[RELAY] expire_interval_secs`;
    /// default 2 hours).
    expire_interval: Duration {
        set: |c, v| c.settings.expire_interval = v,
        ini: "RELAY" "expire_interval_secs" => ini::seconds,
        flag: (
            long = "expire-interval-secs",
            value_name = "EXPIRE_INTERVAL_SECS",
            value_parser = ini::seconds
        ),
    }
    /// Delete a queue's expired messages before each SEND to it: on or off (ini `[STORE_LOG]
    /// expire_messages_on_send`; default on).
    expire_on_send: bool {
        set: |c, v| c.settings.expire_on_send = v,
        ini: "STORE_LOG" "expire_messages_on_send" => ini::on_off,
        flag: (long, value_parser = ini::on_off, action = clap::ArgAction::Set),
    }
    /// Seconds a notification is kept (ini `[STORE_LOG] expire_ntfs_hours`; default 24 hours).
    notification_ttl: Duration {
        set: |c, v| c.settings.notification_ttl = v,
        ini: "STORE_LOG" "expire_ntfs_hours" => |v| ini::duration(v, 3600),
        flag: (
            long = "notification-ttl-secs",
            value_name = "NOTIFICATION_TTL_SECS",
            value_parser = ini::seconds
        ),
    }
    /// Allow NEW (queue creation): on or off (ini `[AUTH] new_queues`; default on).
    new_queues: bool {
        set: |c, v| c.settings.new_queues = v,
        ini: "AUTH" "new_queues" => ini::on_off,
        flag: (long, value_parser = ini::on_off, action = clap::ArgAction::Set),
    }
    /// The password NEW must carry (the file only: a command line is visible to every user).
    create_password: Vec<u8> {
        set: |c, v| c.settings.create_password = Some(v),
        ini: "AUTH" "create_password" => ini::create_password,
        flag: (skip),
    }
    /// Rewrite <data-dir>/smp-server-metrics.txt (Prometheus text) every SECS seconds (ini
    /// `[STORE_LOG] prometheus_interval`; default: no metrics file).
    metrics_interval: Duration {
        set: |c, v| c.metrics_interval = Some(v),
        ini: "STORE_LOG" "prometheus_interval" => ini::seconds,
        flag: (long, value_name = "SECS", value_parser = ini::seconds),
    }
    /// SOCKS5 proxy (e.g. Tor, 127.0.0.1:9050) for .onion destinations; without it they are refused
    /// (ini `[PROXY] socks_proxy`).
    socks_proxy: SocketAddr {
        set: |c, v| c.settings.proxy.socks_proxy = Some(v),
        ini: "PROXY" "socks_proxy" => ini::socket_addr,
        flag: (long, value_name = "IP:PORT"),
    }
    /// Destinations on these domains (or their subdomains) are counted again as "own" in the proxy
    /// statistics (the file only, as the reference).
    own_server_domains: Vec<String> {
        set: |c, v| c.settings.proxy.own_server_domains = v,
        ini: "PROXY" "own_server_domains" => |v| {
            Ok(v.split_whitespace().map(str::to_string).collect())
        },
        flag: (skip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
                ..StartOptions::default()
            }
        );
        // The bounds and messages of the file's parsers.
        let e = flags(&["--cores", "65"]).unwrap_err();
        assert!(e.contains("expected a whole number from 1 to 64"), "{e}");
        let e = flags(&["--expire-on-send", "yes"]).unwrap_err();
        assert!(e.contains("expected on or off"), "{e}");
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
}
