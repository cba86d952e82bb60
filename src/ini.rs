//! The configuration file `<data-dir>/smp-server.ini`, in the reference's syntax (`[SECTION]` headers,
//! `key = value` lines, `#` or `;` comments, `on`/`off` booleans; simplexmq
//! `Server/Main.hs`, `Server/CLI.hs`), plus a `[RELAY]` section for what the reference fixes in
//! code.
//!
//! Strict on purpose: a key is either applied or refused with the file, line and what to do. A
//! reference key this relay does not implement is never silently ignored, because an operator who
//! copies a reference configuration must learn that, say, the name resolver is not there.
//!
//! Keys applied:
//!
//! | section | key | meaning |
//! |---|---|---|
//! | `[STORE_LOG]` | `store_messages` | `journal` (default), `memory`, or `database` (PostgreSQL) |
//! | | `store_queues` | `memory` or `database` (records follow `store_messages`) |
//! | | `fsync` | when the journal store syncs: `every-batch`, `interval-ms N` (default 50) or `never` |
//! | | `db_connection`, `db_schema`, `db_pool_size` | the PostgreSQL store's database, schema and pool |
//! | | `expire_messages_days` | message TTL in days (default 21) |
//! | | `expire_messages_on_send` | `on`/`off` (default `on`) |
//! | | `expire_ntfs_hours` | notification TTL in hours (default 24) |
//! | | `prometheus_interval` | seconds between rewrites of the metrics file; absent = no file |
//! | | `journal_max_size` | the most bytes the journal store's segment files may take (K, M, G, T suffixes; at least 16M); absent = no cap |
//! | | `journal_checkpoint_records` | records after which a journal group takes a checkpoint while the relay runs: the most a start after a crash replays per group (default 10000; 1000 to 100000000) |
//! | | `enable`, `restore_messages` | what the memory store keeps over a restart (off: nothing; no messages) |
//! | | `expire_messages_on_start` | accepted as `on` (what this relay always does) |
//! | | `log_stats` | `on`/`off` (default `off`): the daily statistics file and the statistics backup |
//! | `[AUTH]` | `new_queues` | `on`/`off` (default `on`) |
//! | | `create_password` | password NEW must carry |
//! | | `control_port_admin_password`, `control_port_user_password` | the control port's passwords |
//! | | `daily_block_queue_quota` | queues the control port may block a UTC day (default 20; 0 no limit, -1 none) |
//! | `[TRANSPORT]` | `host` | informational (printed in the address by `init`) |
//! | | `port` | comma-separated ports to listen on (default 5223) |
//! | | `websockets` | `off`, `on` (port 80, as the reference) or comma-separated ports serving SMP over WebSocket |
//! | | `log_tls_errors` | accepted as `off` |
//! | | `control_port` | the control port, on 127.0.0.1 |
//! | `[INACTIVE_CLIENTS]` | `disconnect`, `ttl`, `check_interval` | close connections without subscriptions idle for `ttl` seconds, looked for every `check_interval` (as the reference) |
//! | `[PROXY]` | `socks_proxy` | SOCKS5 proxy (e.g. Tor) for `.onion` destinations of PFWD; without it they are refused |
//! | | `own_server_domains` | destinations on these domains are counted again as "own" in the proxy statistics |
//! | | `client_concurrency` | forwarded commands (PRXY, PFWD) of one connection answered at once, 1 to 4096 (default 32) |
//! | `[INFORMATION]` | `source_code`, `usage_conditions`, `condition_amendments`, `server_country`, `operator`, `operator_country`, `website`, `admin_simplex`, `admin_email`, `admin_pgp`, `admin_pgp_fingerprint`, `complaints_simplex`, `complaints_email`, `complaints_pgp`, `complaints_pgp_fingerprint`, `hosting`, `hosting_country`, `hosting_type` | what the server information page shows (all of it only with `source_code`; countries as ISO 3166 two-letter codes; `hosting_type` `virtual`, `dedicated`, `colocation` or `owned`) |
//! | `[WEB]` | `static_path` | the folder the web site is written to at start; no site when unset |
//! | | `http` | a port serving the site over plain HTTP |
//! | | `https` | a port serving web clients over TLS (with `cert` and `key`): an SMP port, split by TLS SNI, or a port of its own serving the site |
//! | | `cert`, `key` | the web certificate chain and key (PEM) that clients naming a host get on `https` |
//! | `[RELAY]` | `quota` | messages a queue holds before ERR QUOTA (reference: fixed 128) |
//! | | `cores` | shards, one pinned core each, 1 to 64 (default: every online core, at most 64) |
//! | | `max_connections` | connections held at once over all shards (default 65,536, or what the open-file limit allows) |
//! | | `max_handshakes_per_address` | connections of one IP address in their TLS or SMP handshake at once (default 16) |
//! | | `expire_interval_secs` | seconds between expiration runs (reference: fixed 2 h) |
//! | | `tls_timeout_secs`, `handshake_timeout_secs` | TLS and SMP handshake deadlines |
//! | | `slow_reader_close_secs` | seconds a connection may stay over its output bound before it is closed |
//! | | `metrics_listen` | `ADDR:PORT` where `GET /metrics` serves the metrics file's text (default: off) |
//! | | `db_statement_timeout_secs`, `db_pool_wait_secs` | how long a PostgreSQL statement may run (default 30) and an operation waits for a connection (default 10) before ERR STORE |
//! | | `pg_queue_cache` | queue records the PostgreSQL store holds besides those in use, over all shards (default 100000) |
//!
//! The message TTL has one key only, `expire_messages_days` (as the reference); `start
//! --message-ttl-secs` overrides it when a finer unit is needed (tests).
//!
//! The keys that set a `start` option are declared, with their flags, in `settings.rs` (one entry
//! per setting); this module parses the file, and `KEYS` lists the other keys.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::settings;

pub mod values;
pub use values::*;

pub use crate::settings::StartOptions;

/// A parsed configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IniConfig {
    /// `[TRANSPORT] host`: printed in the address, and its `.onion` host announced by the web
    /// site.
    pub host: Option<String>,
    /// `[INFORMATION]`, for the web site.
    pub information: crate::web::info::Information,
    pub options: StartOptions,
    /// Keys of the reference's features this relay does not have, accepted and ignored: each
    /// as `[SECTION] key (line N): why`, for the one warning `start` gives.
    pub ignored: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum IniError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}, line {line}: {problem}", path.display())]
    At {
        path: PathBuf,
        line: usize,
        // Boxed: the error travels up through every `?` and should stay small.
        problem: Box<Problem>,
    },
    /// Every problem of a file, one per line, so that one start shows them all.
    #[error("{} problems:\n{}", .0.len(), .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Several(Vec<IniError>),
}

/// What is wrong with one line, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Syntax(String),
    KeyOutsideSection(String),
    UnknownSection(String),
    UnknownKey {
        section: String,
        key: String,
    },
    Duplicate {
        section: String,
        key: String,
        first_line: usize,
    },
    /// A value of a reference key that this relay cannot honour (`only`: the one value it
    /// accepts). Keys of features it does not have are accepted and ignored instead
    /// (`IniConfig::ignored`).
    Unsupported {
        section: String,
        key: String,
        why: &'static str,
        only: Option<&'static str>,
    },
    BadValue {
        section: String,
        key: String,
        value: String,
        expected: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Syntax(line) => write!(
                f,
                "cannot parse {line:?}: expected `[SECTION]`, `key = value` or a `#` comment"
            ),
            Problem::KeyOutsideSection(key) => write!(
                f,
                "key `{key}` comes before any [SECTION] header; move it under its section"
            ),
            Problem::UnknownSection(s) => write!(
                f,
                "unknown section [{s}]; remove it or fix its name (sections: {})",
                SECTIONS.join(", ")
            ),
            Problem::UnknownKey { section, key } => {
                let known = keys_of(section);
                write!(
                    f,
                    "unknown key `{key}` in [{section}]; remove it or fix its name (keys of [{section}]: {})",
                    known.join(", ")
                )
            }
            Problem::Duplicate {
                section,
                key,
                first_line,
            } => write!(
                f,
                "`{key}` in [{section}] is set twice (first on line {first_line}); keep one"
            ),
            Problem::Unsupported {
                section,
                key,
                why,
                only: None,
            } => write!(
                f,
                "`{key}` in [{section}] is not supported: {why}; remove it"
            ),
            Problem::Unsupported {
                section,
                key,
                why,
                only: Some(v),
            } => write!(
                f,
                "`{key}` in [{section}] is not supported other than `{v}`: {why}; remove it or set it to {v}"
            ),
            Problem::BadValue {
                section,
                key,
                value,
                expected,
            } => write!(
                f,
                "`{key}` in [{section}] = {value:?}: {expected}"
            ),
        }
    }
}

const SECTIONS: &[&str] = &[
    "INFORMATION",
    "STORE_LOG",
    "AUTH",
    "TRANSPORT",
    "PROXY",
    "NAMES",
    "INACTIVE_CLIENTS",
    "WEB",
    "RELAY",
];

/// How a known key is treated.
#[derive(Clone, Copy)]
enum Rule {
    /// Parsed into the settings by `apply`.
    Applied,
    /// This relay always behaves as the key set to this value; that value is accepted, others are
    /// refused with the reason.
    Only(&'static str, &'static str),
    /// A feature this relay does not have: accepted and ignored, with the reason in `start`'s
    /// warning (`IniConfig::ignored`).
    Unsupported(&'static str),
}

struct KeySpec {
    section: &'static str,
    key: &'static str,
    rule: Rule,
}

const fn k(section: &'static str, key: &'static str, rule: Rule) -> KeySpec {
    KeySpec { section, key, rule }
}

const NO_NAMES: Rule = Rule::Unsupported("this relay has no name resolver role");
/// Every key of the reference's configuration and of this relay's `[RELAY]` section that is not a
/// setting of `settings.rs` (those are `Applied` by `settings::apply_ini`).
const KEYS: &[KeySpec] = &[
    k("STORE_LOG", "store_queues", Rule::Applied),
    k(
        "STORE_LOG",
        "db_store_log",
        Rule::Only(
            "off",
            "this relay keeps no store log beside the database (the database is the record)",
        ),
    ),
    k(
        "STORE_LOG",
        "db_deleted_ttl",
        Rule::Unsupported(
            "this relay deletes a queue's row at DEL rather than marking it, so there is nothing to purge later",
        ),
    ),
    k(
        "STORE_LOG",
        "expire_messages_on_start",
        Rule::Only(
            "on",
            "this relay always drops expired messages when it loads its store",
        ),
    ),
    // Checked by `web::info::Information::set` (the same list as `web::info::KEYS`).
    k("INFORMATION", "source_code", Rule::Applied),
    k("INFORMATION", "usage_conditions", Rule::Applied),
    k("INFORMATION", "condition_amendments", Rule::Applied),
    k("INFORMATION", "server_country", Rule::Applied),
    k("INFORMATION", "operator", Rule::Applied),
    k("INFORMATION", "operator_country", Rule::Applied),
    k("INFORMATION", "website", Rule::Applied),
    k("INFORMATION", "admin_simplex", Rule::Applied),
    k("INFORMATION", "admin_email", Rule::Applied),
    k("INFORMATION", "admin_pgp", Rule::Applied),
    k("INFORMATION", "admin_pgp_fingerprint", Rule::Applied),
    k("INFORMATION", "complaints_simplex", Rule::Applied),
    k("INFORMATION", "complaints_email", Rule::Applied),
    k("INFORMATION", "complaints_pgp", Rule::Applied),
    k("INFORMATION", "complaints_pgp_fingerprint", Rule::Applied),
    k("INFORMATION", "hosting", Rule::Applied),
    k("INFORMATION", "hosting_country", Rule::Applied),
    k("INFORMATION", "hosting_type", Rule::Applied),
    k("TRANSPORT", "host", Rule::Applied),
    k(
        "TRANSPORT",
        "log_tls_errors",
        Rule::Only("off", "this relay has no separate TLS error log"),
    ),
    k(
        "PROXY",
        "socks_mode",
        Rule::Only("onion", "the proxy uses SOCKS for .onion destinations only"),
    ),
    k(
        "PROXY",
        "host_mode",
        Rule::Only(
            "public",
            "the proxy connects to a destination's public host",
        ),
    ),
    k(
        "PROXY",
        "required_host_mode",
        Rule::Only("off", "the proxy does not require a host mode"),
    ),
    k(
        "NAMES",
        "enable",
        Rule::Only("off", "this relay has no name resolver role"),
    ),
    k("NAMES", "resolver_endpoint", NO_NAMES),
    k("NAMES", "resolver_auth", NO_NAMES),
    k("NAMES", "resolver_timeout_ms", NO_NAMES),
    k("NAMES", "resolver_max_response_bytes", NO_NAMES),
    k("NAMES", "resolver_concurrency", NO_NAMES),
];

/// Reads `path`; `Ok(None)` when the file does not exist (a data directory from before it did).
pub fn load(path: &Path) -> Result<Option<IniConfig>, IniError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(path, &text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IniError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses the text of the file at `path` (the path is only used in errors). Every problem of the
/// file is reported, in one error.
pub fn parse(path: &Path, text: &str) -> Result<IniConfig, IniError> {
    let mut errors = Vec::new();
    let config = parse_into(path, text, &mut errors);
    match errors.len() {
        0 => Ok(config),
        1 => Err(errors.remove(0)),
        _ => Err(IniError::Several(errors)),
    }
}

/// `parse`, each line's problem pushed to `errors` and the next line read.
fn parse_into(path: &Path, text: &str, errors: &mut Vec<IniError>) -> IniConfig {
    let at = |line: usize, problem: Problem| IniError::At {
        path: path.to_path_buf(),
        line,
        problem: Box::new(problem),
    };
    // Records the problem and goes on with the next line.
    macro_rules! fail {
        ($e:expr) => {{
            errors.push($e);
            continue;
        }};
    }
    let mut config = IniConfig::default();
    let mut section: Option<&str> = None;
    // Inside an unknown section, whose keys are not looked at.
    let mut skipping = false;
    // (section, key, line) of every key seen, to refuse duplicates.
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            if !SECTIONS.contains(&name) {
                // Its keys would only add one error each.
                section = None;
                skipping = true;
                fail!(at(n, Problem::UnknownSection(name.to_string())));
            }
            section = Some(name);
            skipping = false;
            continue;
        }
        // The reference's parser splits at the first `=` or `:`.
        let Some(sep) = line.find(['=', ':']) else {
            fail!(at(n, Problem::Syntax(line.to_string())));
        };
        let key = line[..sep].trim();
        let value = line[sep + 1..].trim();
        if key.is_empty() {
            fail!(at(n, Problem::Syntax(line.to_string())));
        }
        if skipping {
            continue;
        }
        let Some(section) = section else {
            fail!(at(n, Problem::KeyOutsideSection(key.to_string())));
        };
        if let Some(&(_, _, first_line)) = seen.iter().find(|s| s.0 == section && s.1 == key) {
            fail!(at(
                n,
                Problem::Duplicate {
                    section: section.to_string(),
                    key: key.to_string(),
                    first_line,
                },
            ));
        }
        seen.push((section, key, n));
        let Some(rule) = rule_of(section, key) else {
            fail!(at(
                n,
                Problem::UnknownKey {
                    section: section.to_string(),
                    key: key.to_string(),
                },
            ));
        };
        let unsupported = |why, only| Problem::Unsupported {
            section: section.to_string(),
            key: key.to_string(),
            why,
            only,
        };
        match rule {
            Rule::Only(v, _) if value == v => {}
            Rule::Only(v, why) => fail!(at(n, unsupported(why, Some(v)))),
            Rule::Unsupported(why) => config
                .ignored
                .push(format!("[{section}] {key} (line {n}): {why}")),
            Rule::Applied => {
                if let Err(expected) = apply(&mut config, section, key, value) {
                    fail!(at(
                        n,
                        Problem::BadValue {
                            section: section.to_string(),
                            key: key.to_string(),
                            value: value.to_string(),
                            expected,
                        },
                    ));
                }
            }
        }
    }
    config
}

/// How `[section] key` is treated: `Applied` for the settings (`settings::INI_KEYS`) and the keys
/// `apply` parses, else as `KEYS` says; `None`: an unknown key.
fn rule_of(section: &str, key: &str) -> Option<Rule> {
    if settings::INI_KEYS.contains(&(section, key)) {
        return Some(Rule::Applied);
    }
    KEYS.iter()
        .find(|s| s.section == section && s.key == key)
        .map(|s| s.rule)
}

/// `(section, key)` of every key the relay applies: the settings' (`settings.rs`) and the few
/// `apply` parses itself. The documentation table above, the template `init` writes and the
/// README are checked against it (tests here and in `cli.rs`).
pub fn applied_keys() -> Vec<(&'static str, &'static str)> {
    KEYS.iter()
        .filter(|s| matches!(s.rule, Rule::Applied))
        .map(|s| (s.section, s.key))
        .chain(settings::INI_KEYS.iter().copied())
        .collect()
}

/// Every key of `section`: those of `KEYS`, then the settings'.
fn keys_of(section: &str) -> Vec<&'static str> {
    KEYS.iter()
        .map(|k| (k.section, k.key))
        .chain(settings::INI_KEYS.iter().copied())
        .filter(|(s, _)| *s == section)
        .map(|(_, k)| k)
        .collect()
}

/// Parses one applied key into `config`; the error says what the value should be.
fn apply(config: &mut IniConfig, section: &str, key: &str, value: &str) -> Result<(), String> {
    if let Some(applied) = settings::apply_ini(&mut config.options, section, key, value) {
        return applied;
    }
    match (section, key) {
        // The queue store follows `store_messages`: `database` with the PostgreSQL store, and
        // memory (records kept with the messages) with the others.
        ("STORE_LOG", "store_queues") => store_kind(value, &["memory", "database"]),
        ("INFORMATION", key) => config.information.set(key, value),
        ("TRANSPORT", "host") => {
            config.host = Some(value.to_string());
            Ok(())
        }
        // KEYS marks a key Applied only when it has an arm above (the unit test checks every one).
        _ => Err("this key has no parser (a bug: please report it)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse_ok(text: &str) -> IniConfig {
        parse(Path::new("/d/smp-server.ini"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_err(text: &str) -> String {
        match parse(Path::new("/d/smp-server.ini"), text) {
            Ok(c) => panic!("expected an error, parsed {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_applied_key_has_a_parser() {
        let applied = KEYS
            .iter()
            .filter(|s| matches!(s.rule, Rule::Applied))
            .map(|s| (s.section, s.key))
            .chain(settings::INI_KEYS.iter().copied());
        for (section, key) in applied {
            let value = match key {
                "store_queues" | "store_messages" => "memory",
                "fsync" => "interval-ms 20",
                "expire_messages_on_send"
                | "new_queues"
                | "disconnect"
                | "enable"
                | "restore_messages"
                | "log_stats" => "on",
                "cert" | "key" => "/etc/opt/simplex/web.crt",
                k if k.ends_with("country") => "DE",
                "hosting_type" => "owned",
                "admin_simplex" | "complaints_simplex" => "https://smp.example.com/a#key",
                "create_password" => "secret",
                "host" => "example.com",
                "port" => "5223",
                "socks_proxy" | "metrics_listen" => "127.0.0.1:9050",
                "journal_max_size" => "4G",
                "journal_checkpoint_records" | "pg_queue_cache" => "20000",
                _ => "7",
            };
            let mut c = IniConfig::default();
            assert_eq!(
                apply(&mut c, section, key, value),
                Ok(()),
                "[{section}] {key}"
            );
        }
    }

    /// The table at the top of this file, as `(section, key)`: rows `| [SECTION] | keys | … |`,
    /// a row with an empty first cell continuing the section above, keys in backticks.
    fn documented_keys() -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut section = String::new();
        for line in include_str!("ini.rs").lines() {
            let Some(row) = line.strip_prefix("//! |") else {
                continue;
            };
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if cells.len() < 3 || cells[0] == "section" || cells[0].starts_with("---") {
                continue;
            }
            if let Some(s) = cells[0]
                .strip_prefix("`[")
                .and_then(|s| s.strip_suffix("]`"))
            {
                section = s.to_string();
            }
            for key in cells[1].split('`').skip(1).step_by(2) {
                out.push((section.clone(), key.to_string()));
            }
        }
        out
    }

    /// Every key the relay applies has its row in the table at the top of this file, and the
    /// table names no key the relay does not take.
    #[test]
    fn the_documentation_table_is_the_keys_the_relay_takes() {
        let documented = documented_keys();
        let has = |s: &str, k: &str| documented.iter().any(|(ds, dk)| ds == s && dk == k);
        let missing: Vec<String> = applied_keys()
            .into_iter()
            .filter(|(s, k)| !has(s, k))
            .map(|(s, k)| format!("[{s}] {k}"))
            .collect();
        assert!(
            missing.is_empty(),
            "not in the table of ini.rs: {missing:?}"
        );
        for (s, k) in &documented {
            assert!(
                matches!(rule_of(s, k), Some(Rule::Applied | Rule::Only(..))),
                "the table of ini.rs names [{s}] {k}, which the relay does not take"
            );
        }
    }

    #[test]
    fn every_key_is_in_a_known_section_once() {
        let all: Vec<(&str, &str)> = KEYS
            .iter()
            .map(|k| (k.section, k.key))
            .chain(settings::INI_KEYS.iter().copied())
            .collect();
        for (i, (section, key)) in all.iter().enumerate() {
            assert!(SECTIONS.contains(section), "{section}");
            assert!(
                !all[..i].contains(&(section, key)),
                "[{section}] {key} listed twice"
            );
        }
    }

    #[test]
    fn reference_keys_map_to_settings() {
        let c = parse_ok(
            "# comment\n\
             [STORE_LOG]\n\
             enable = on\n\
             store_queues = memory\n\
             store_messages = memory\n\
             restore_messages = on\n\
             expire_messages_days = 7\n\
             expire_messages_on_start = on\n\
             expire_messages_on_send = off\n\
             expire_ntfs_hours = 12\n\
             log_stats = off\n\
             prometheus_interval = 60\n\
             \n\
             [AUTH]\n\
             new_queues = off\n\
             ; another comment style\n\
             create_password = s3cret\n\
             control_port_admin_password = adm1n\n\
             control_port_user_password = us3r\n\
             daily_block_queue_quota = -1\n\
             \n\
             [TRANSPORT]\n\
             host = smp.example.com\n\
             port = 5223, 443\n\
             log_tls_errors = off\n\
             websockets = 8443,80\n\
             control_port = 5224\n\
             \n\
             [RELAY]\n\
             quota = 2\n\
             cores = 3\n\
             max_connections = 100\n\
             max_handshakes_per_address = 4\n\
             expire_interval_secs = 30\n\
             tls_timeout_secs = 5\n\
             handshake_timeout_secs = 6\n\
             slow_reader_close_secs = 8\n\
             [PROXY]\n\
             socks_proxy = 127.0.0.1:9050\n\
             own_server_domains = example.com relays.example.net\n\
             socks_mode = onion\n\
             client_concurrency = 8\n\
             [INACTIVE_CLIENTS]\n\
             disconnect = on\n\
             ttl = 600\n\
             check_interval = 60\n\
             [WEB]\n\
             static_path = /var/opt/simplex/www\n\
             http = 8000\n\
             https = 443\n\
             cert = /etc/opt/simplex/web.crt\n\
             key = /etc/opt/simplex/web.key\n",
        );
        assert_eq!(c.host.as_deref(), Some("smp.example.com"));
        assert_eq!(
            c.options,
            StartOptions {
                store: Some(crate::store::StoreKind::Memory),
                store_log: Some(true),
                restore_messages: Some(true),
                durability: None,
                journal_max_size: None,
                journal_checkpoint_records: None,
                database: None,
                db_schema: None,
                db_pool_size: None,
                db_statement_timeout: None,
                db_pool_wait: None,
                pg_queue_cache: None,
                proxy_client_concurrency: Some(8),
                ports: Some(vec![5223, 443]),
                websockets: Some(WebSockets(vec![8443, 80])),
                web_https: Some(443),
                web_cert: Some("/etc/opt/simplex/web.crt".to_string()),
                web_key: Some("/etc/opt/simplex/web.key".to_string()),
                web_static_path: Some("/var/opt/simplex/www".to_string()),
                web_http: Some(8000),
                shards: Some(3),
                max_connections: Some(100),
                max_handshakes_per_address: Some(4),
                tls_timeout: Some(Duration::from_secs(5)),
                handshake_timeout: Some(Duration::from_secs(6)),
                slow_reader_close: Some(Duration::from_secs(8)),
                quota: Some(2),
                message_ttl: Some(Duration::from_secs(7 * 86400)),
                expire_interval: Some(Duration::from_secs(30)),
                expire_on_send: Some(false),
                notification_ttl: Some(Duration::from_secs(12 * 3600)),
                new_queues: Some(false),
                inactive_disconnect: Some(true),
                inactive_ttl: Some(Duration::from_secs(600)),
                inactive_check_interval: Some(Duration::from_secs(60)),
                create_password: Some(b"s3cret".to_vec()),
                control_port: Some(5224),
                control_port_admin_password: Some(b"adm1n".to_vec()),
                control_port_user_password: Some(b"us3r".to_vec()),
                daily_block_queue_quota: Some(-1),
                metrics_interval: Some(Duration::from_secs(60)),
                log_stats: Some(false),
                metrics_listen: None,
                socks_proxy: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 9050))),
                own_server_domains: Some(vec![
                    "example.com".to_string(),
                    "relays.example.net".to_string()
                ]),
            }
        );
    }

    #[test]
    fn websockets_is_off_on_or_ports() {
        assert_eq!(websockets("off"), Ok(WebSockets(vec![])));
        // `on` is port 80, as the reference's `iniTransports`.
        assert_eq!(websockets("on"), Ok(WebSockets(vec![80])));
        assert_eq!(websockets("443, 8443"), Ok(WebSockets(vec![443, 8443])));
        let e = websockets("yes").unwrap_err();
        assert_eq!(
            e,
            "expected off, on or ports from 1 to 65535, separated by commas"
        );
        assert_eq!(websockets("80,80").unwrap_err(), "port 80 is listed twice");
    }

    #[test]
    fn an_empty_file_sets_nothing() {
        assert_eq!(parse_ok(""), IniConfig::default());
        assert_eq!(parse_ok("\n# only comments\n  \n"), IniConfig::default());
    }

    #[test]
    fn the_command_line_wins_over_the_file_which_wins_over_defaults() {
        let file = StartOptions {
            quota: Some(2),
            new_queues: Some(false),
            ports: Some(vec![1000]),
            ..StartOptions::default()
        };
        let cli = StartOptions {
            quota: Some(5),
            ..StartOptions::default()
        };
        let mut c = crate::config::StartConfig::new(Path::new("/d"));
        cli.or(file).apply_to(&mut c);
        assert_eq!(c.settings.quota, 5);
        assert!(!c.settings.new_queues);
        assert_eq!(c.ports, vec![1000]);
        // Untouched: the default.
        assert_eq!(
            c.settings.message_ttl,
            crate::config::Settings::default().message_ttl
        );
        assert_eq!(c.metrics_interval, None);
    }

    #[test]
    fn errors_name_the_file_line_key_and_fix() {
        let e = parse_err("[RELAY]\nquota = 2\nqouta = 3\n");
        assert!(e.contains("/d/smp-server.ini, line 3"), "{e}");
        assert!(e.contains("unknown key `qouta`"), "{e}");
        assert!(e.contains("quota"), "{e}");

        let e = parse_err("[AUTH]\nnew_queues = yes\n");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("`new_queues`"), "{e}");
        assert!(e.contains("expected on or off"), "{e}");

        let e = parse_err("[TRANSPORT]\nwebsockets = yes\n");
        assert!(e.contains("`websockets`"), "{e}");
        assert!(e.contains("expected off, on or ports"), "{e}");

        // Keys of features this relay does not have are accepted and named for start's warning.
        let c = parse(
            Path::new("/d/smp-server.ini"),
            "[NAMES]\nresolver_endpoint = x\n[STORE_LOG]\ndb_deleted_ttl = 5\n",
        )
        .expect("accepted");
        assert_eq!(c.ignored.len(), 2, "{:?}", c.ignored);
        assert!(c.ignored[0].starts_with("[NAMES] resolver_endpoint (line 2): "));
        assert!(c.ignored[0].contains("no name resolver"));
        assert!(c.ignored[1].starts_with("[STORE_LOG] db_deleted_ttl (line 4): "));

        // The web site's keys are applied: `[INFORMATION]` checked as the reference checks it.
        let c = parse_ok(
            "[INFORMATION]\nsource_code = https://example.com/src\nserver_country = nl\n\
             [WEB]\nstatic_path = /var/www\nhttp = 8080\n",
        );
        assert!(c.ignored.is_empty(), "{:?}", c.ignored);
        assert_eq!(c.information.get("server_country"), Some("NL"));
        assert_eq!(c.options.web_http, Some(8080));
        let e = parse_err("[INFORMATION]\nhosting_type = cloud\n");
        assert!(
            e.contains("line 2") && e.contains("virtual, dedicated, colocation or owned"),
            "{e}"
        );

        // Every problem of a file, in one message.
        let e = parse_err("[RELAY]\nquota = x\n[NOPE]\na = b\n[AUTH]\nnew_queues = yes\nzzz = 1\n");
        assert!(e.starts_with("4 problems:\n"), "{e}");
        for part in [
            "line 2",
            "line 3: unknown section [NOPE]",
            "line 6",
            "line 7: unknown key",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        assert!(
            !e.contains("line 4"),
            "keys of an unknown section are skipped: {e}"
        );

        let e = parse_err("[STORE_LOG]\nstore_messages = sqlite\n");
        assert!(e.contains("expected journal, memory or database"), "{e}");
        let e = parse_err("[STORE_LOG]\nfsync = sometimes\n");
        assert!(e.contains("every-batch, interval-ms N or never"), "{e}");
        let e = parse_err("[STORE_LOG]\nstore_queues = sqlite\n");
        assert!(e.contains("expected one of memory, database"), "{e}");

        let e = parse_err("[SERVER]\n");
        assert!(e.contains("unknown section [SERVER]"), "{e}");

        let e = parse_err("port = 5223\n");
        assert!(e.contains("before any [SECTION]"), "{e}");

        let e = parse_err("[RELAY]\nquota = 2\nquota = 3\n");
        assert!(e.contains("set twice (first on line 2)"), "{e}");

        let e = parse_err("[RELAY]\njust words\n");
        assert!(e.contains("cannot parse"), "{e}");
    }

    #[test]
    fn values_are_checked() {
        for (text, expected) in [
            ("[RELAY]\nquota = 0\n", "from 1 to 4096"),
            ("[RELAY]\nquota = -1\n", "whole number"),
            ("[RELAY]\ncores = many\n", "whole number"),
            ("[TRANSPORT]\nport = 5223,0\n", "ports from 1 to 65535"),
            ("[TRANSPORT]\nport = 5223,5223\n", "listed twice"),
            ("[TRANSPORT]\nport =\n", "ports from 1"),
            ("[AUTH]\ncreate_password =\n", "remove the line"),
            ("[AUTH]\ncreate_password = a@b\n", "without spaces"),
            ("[STORE_LOG]\nexpire_messages_days = 0\n", "from 1"),
            (
                "[STORE_LOG]\nexpire_messages_days = 99999999999\n",
                "from 1 to 3650",
            ),
            ("[STORE_LOG]\nexpire_messages_on_send = true\n", "on or off"),
            ("[STORE_LOG]\nenable = maybe\n", "on or off"),
            ("[STORE_LOG]\nprometheus_interval = 0\n", "from 1"),
        ] {
            let e = parse_err(text);
            assert!(e.contains(expected), "{text:?}: {e}");
        }
    }

    #[test]
    fn keys_may_use_a_colon_and_values_keep_theirs() {
        let c = parse_ok("[AUTH]\ncreate_password: pass\n[TRANSPORT]\nhost = a:b\n");
        assert_eq!(c.options.create_password, Some(b"pass".to_vec()));
        assert_eq!(c.host.as_deref(), Some("a:b"));
    }

    #[test]
    fn store_and_fsync_settings() {
        use crate::store::journal::Durability;
        use crate::store::StoreKind;
        assert_eq!(store_messages("journal"), Ok(StoreKind::Journal));
        assert_eq!(store_messages("memory"), Ok(StoreKind::Memory));
        assert!(store_messages("files").is_err());
        assert_eq!(fsync("every-batch"), Ok(Durability::EveryBatch));
        assert_eq!(fsync("never"), Ok(Durability::Never));
        for v in ["interval-ms 50", "interval-ms=50", "interval-ms:50"] {
            assert_eq!(
                fsync(v),
                Ok(Durability::Interval(Duration::from_millis(50))),
                "{v}"
            );
        }
        assert!(fsync("interval-ms 0").is_err());
        assert!(fsync("interval-ms 60001").is_err());
        assert!(fsync("interval-ms").is_err());
    }

    #[test]
    fn journal_max_size_takes_bytes_or_a_binary_suffix_within_bounds() {
        assert_eq!(size_bytes("512M"), Ok(512 << 20));
        assert_eq!(size_bytes("4g"), Ok(4 << 30));
        assert_eq!(size_bytes("2T"), Ok(2 << 40));
        assert_eq!(size_bytes(" 16777216 "), Ok(16 << 20));
        assert_eq!(size_bytes("16384K"), Ok(MIN_JOURNAL_MAX_SIZE));
        for bad in [
            "",
            "M",
            "15M",
            "4X",
            "4GB",
            "-1G",
            "1.5G",
            "1025T",
            "99999999999999999999",
        ] {
            let e = size_bytes(bad).unwrap_err();
            assert!(
                e.contains("expected a size from 16M to 1024T"),
                "{bad:?}: {e}"
            );
        }
        let c = parse_ok("[STORE_LOG]\njournal_max_size = 20G\n");
        assert_eq!(c.options.journal_max_size, Some(20 << 30));
    }
}
