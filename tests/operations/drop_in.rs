//! The move from the reference `smp-server` (issue: a drop-in replacement): the configuration file
//! the reference's `init` writes, for every kind of its options, with certificates made as it makes
//! them (Ed25519 and Ed448), in the reference's two directories (`SMP_SERVER_CFG_PATH`,
//! `SMP_SERVER_LOG_PATH`): the relay starts on them as they are, prints the address the reference
//! printed, and serves clients.

use crate::common;
use crate::reference_data;
use crate::support;

use std::path::Path;
use std::time::Duration;

use common::{Relay, RelayOptions, TempDir};
use reference_data::Messages;
use smp_relay::client::queue::{KeyAlg, RecipientKeys};

/// What the reference's `smp-server init` options choose (simplexmq `Server/Main/Init.hs`,
/// `InitOptions`), as far as they reach the configuration file.
#[derive(Clone)]
struct InitOptions {
    /// Not `--disable-store-log`.
    enable_store_log: bool,
    /// `--database`, `--schema`, `--pool-size` (the template comments out the defaults).
    db: (String, String, u32),
    /// `--daily-stats`.
    log_stats: bool,
    /// `--sign-algorithm`.
    algorithm: &'static str,
    /// `--ip`.
    ip: &'static str,
    /// `--fqdn`.
    fqdn: Option<&'static str>,
    /// `--password P` (Some(P)), `--no-password` (None); a random one when not given.
    password: Option<String>,
    /// `--control-port [PORT]`.
    control_port: Option<u16>,
    /// `--socks-proxy`.
    socks_proxy: Option<&'static str>,
    /// `--own-domains`.
    own_domains: Option<&'static str>,
    /// `--source-code`.
    source_code: Option<&'static str>,
    /// `--server-country`.
    server_country: Option<&'static str>,
    /// `--operator` and `--operator-country`.
    operator: Option<(&'static str, Option<&'static str>)>,
    /// `--operator-website`.
    website: Option<&'static str>,
    /// `--hosting` and `--hosting-country`.
    hosting: Option<(&'static str, Option<&'static str>)>,
    /// `--hosting-type`.
    hosting_type: Option<&'static str>,
    /// `--web-path`.
    web_static_path: Option<&'static str>,
    /// `--disable-web`.
    disable_web: bool,
}

const DEFAULT_DB: (&str, &str, u32) = ("postgresql://smp@/smp_server_store", "smp_server", 10);

impl Default for InitOptions {
    /// `smp-server init -y`: the reference's defaults.
    fn default() -> Self {
        InitOptions {
            enable_store_log: true,
            db: (DEFAULT_DB.0.into(), DEFAULT_DB.1.into(), DEFAULT_DB.2),
            log_stats: false,
            algorithm: "ED25519",
            ip: "127.0.0.1",
            fqdn: None,
            password: Some(random_password()),
            control_port: None,
            socks_proxy: None,
            own_domains: None,
            source_code: None,
            server_country: None,
            operator: None,
            website: None,
            hosting: None,
            hosting_type: None,
            web_static_path: None,
            disable_web: false,
        }
    }
}

/// 32 random bytes in base64url, as the reference's `init` makes a create password.
fn random_password() -> String {
    use base64::Engine;
    let mut b = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
    base64::engine::general_purpose::URL_SAFE.encode(b)
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// "# " when the option is not set, as the reference's `optDisabled`.
fn off_unless(set: bool) -> &'static str {
    if set {
        ""
    } else {
        "# "
    }
}

/// The reference's `informationIniContent`.
fn information(o: &InitOptions) -> String {
    let country = |name: &str, c: Option<&str>| {
        format!(
            "{}{name}_country = {}\n",
            off_unless(c.is_some()),
            c.unwrap_or("ISO-3166 2-letter code")
        )
    };
    let entity = |name: &str, e: Option<(&str, Option<&str>)>| {
        format!(
            "{}{name} = {}\n{}",
            off_unless(e.is_some()),
            e.map(|e| e.0)
                .unwrap_or("entity (organization or person name)"),
            country(name, e.and_then(|e| e.1))
        )
    };
    let mut s = String::from(
        "[INFORMATION]\n\
         # AGPLv3 license requires that you make any source code modifications\n\
         # available to the end users of the server.\n\
         # LICENSE: https://github.com/simplex-chat/simplexmq/blob/stable/LICENSE\n\
         # Include correct source code URI in case the server source code is modified in any way.\n\
         # If any other information fields are present, source code property also MUST be present.\n\n",
    );
    s += &format!(
        "{}source_code = {}",
        off_unless(o.source_code.is_some()),
        o.source_code.unwrap_or("URI")
    );
    s += "\n\n\
          # Declaring all below information is optional, any of these fields can be omitted.\n\
          \n\
          # Server usage conditions and amendments.\n\
          # It is recommended to use standard conditions with any amendments in a separate document.\n\
          # usage_conditions = https://github.com/simplex-chat/simplex-chat/blob/stable/PRIVACY.md\n\
          # condition_amendments = link\n\
          \n\
          # Server location and operator.\n";
    s += &country("server", o.server_country);
    s += &entity("operator", o.operator);
    s += &format!(
        "{}website = {}",
        off_unless(o.website.is_some()),
        o.website.unwrap_or("")
    );
    s += "\n\n\
          # Administrative contacts.\n\
          # admin_simplex = SimpleX address\n\
          # admin_email =\n\
          # admin_pgp =\n\
          # admin_pgp_fingerprint =\n\
          \n\
          # Contacts for complaints and feedback.\n\
          # complaints_simplex = SimpleX address\n\
          # complaints_email =\n\
          # complaints_pgp =\n\
          # complaints_pgp_fingerprint =\n\
          \n\
          # Hosting provider.\n";
    s += &entity("hosting", o.hosting);
    s += "\n# Hosting type can be `virtual`, `dedicated`, `colocation`, `owned`\n";
    s += &format!("hosting_type = {}\n\n", o.hosting_type.unwrap_or("virtual"));
    s
}

/// The reference's `iniFileContent`: the file its `init` writes into the configuration directory
/// `cfg`, for the log directory `log`.
fn reference_ini(
    cfg: &Path,
    log: &Path,
    o: &InitOptions,
    host: &str,
    control_passwords: Option<(&str, &str)>,
) -> String {
    let (conn, schema, pool) = &o.db;
    let mut s = information(o);
    s += "[STORE_LOG]\n\
          # The server uses memory or PostgreSQL database for persisting queue records.\n\
          # Use `enable = on` to use append-only log to preserve and restore queue records on restart.\n\
          # Log is compacted on start (deleted objects are removed).\n";
    s += &format!("enable = {}\n\n", on_off(o.enable_store_log));
    s += "# Queue storage mode: `memory` or `database` (to store queue records in PostgreSQL database).\n\
          # `memory` - in-memory persistence, with optional append-only log (`enable = on`).\n\
          # `database`- PostgreSQL databass (requires `store_messages = journal`).\n\
          store_queues = memory\n\n\
          # Database connection settings for PostgreSQL database (`store_queues = database`).\n";
    s += &format!(
        "{}db_connection = {conn}\n",
        off_unless(conn != DEFAULT_DB.0)
    );
    s += &format!(
        "{}db_schema = {schema}\n",
        off_unless(schema != DEFAULT_DB.1)
    );
    s += &format!(
        "{}db_pool_size = {pool}\n\n",
        off_unless(*pool != DEFAULT_DB.2)
    );
    s += "# Write database changes to store log file\n\
          # db_store_log = off\n\n\
          # Time to retain deleted queues in the database, days.\n\
          # db_deleted_ttl = 21\n\n\
          # Message storage mode: `memory` or `journal`.\n\
          store_messages = memory\n\n\
          # When store_messages is `memory`, undelivered messages are optionally saved and restored\n\
          # when the server restarts, they are preserved in the .bak file until the next restart.\n";
    s += &format!("restore_messages = {}\n\n", on_off(o.enable_store_log));
    s += "# Messages and notifications expiration periods.\n\
          expire_messages_days = 21\n\
          expire_messages_on_start = on\n\
          expire_messages_on_send = off\n\
          expire_ntfs_hours = 24\n\n\
          # Log daily server statistics to CSV file\n";
    s += &format!("log_stats = {}\n\n", on_off(o.log_stats));
    s += "# Log interval for real-time Prometheus metrics\n\
          # prometheus_interval = 60\n\n\
          [AUTH]\n\
          # Set new_queues option to off to completely prohibit creating new messaging queues.\n\
          # This can be useful when you want to decommission the server, but not all connections are switched yet.\n\
          new_queues = on\n\n\
          # Use create_password option to enable basic auth to create new messaging queues.\n\
          # The password should be used as part of server address in client configuration:\n\
          # smp://fingerprint:password@host1,host2\n\
          # The password will not be shared with the connecting contacts, you must share it only\n\
          # with the users who you want to allow creating messaging queues on your server.\n";
    s += &format!(
        "{}create_password = {}",
        off_unless(o.password.is_some()),
        o.password.as_deref().unwrap_or(
            "password to create new queues and forward messages (any printable ASCII characters \
             without whitespace, '@', ':' and '/')"
        )
    );
    s += "\n\n";
    let cp = off_unless(control_passwords.is_some());
    s += &format!(
        "{cp}control_port_admin_password = {}\n",
        control_passwords.map(|p| p.0).unwrap_or("")
    );
    s += &format!(
        "{cp}control_port_user_password = {}\n\n",
        control_passwords.map(|p| p.1).unwrap_or("")
    );
    s += "# The limit for queues that can be blocked via control port per day, resets at 0:00 UTC.\n\
          # Set to 0 to disable limit, to -1 to prohibit blocking. Default is 20.\n\
          # daily_block_queue_quota = 20\n\
          \n\
          [TRANSPORT]\n\
          # Host is only used to print server address on start.\n\
          # You can specify multiple server ports.\n";
    s += &format!("host = {host}\n");
    s += "port = 5223,443\n\
          log_tls_errors = off\n\n\
          # Use `websockets = 443` to run websockets server in addition to plain TLS.\n\
          # This option is deprecated and should be used for testing only.\n\
          # , port 443 should be specified in port above\n\
          websockets = off\n";
    s += &format!(
        "{}control_port = {}",
        off_unless(o.control_port.is_some()),
        o.control_port.unwrap_or(5224)
    );
    s += "\n\n\
          [PROXY]\n\
          # Network configuration for SMP proxy client.\n\
          # `host_mode` can be 'public' (default) or 'onion'.\n\
          # It defines prefferred hostname for destination servers with multiple hostnames.\n\
          # host_mode = public\n\
          # required_host_mode = off\n\n\
          # The domain suffixes of the relays you operate (space-separated) to count as separate proxy statistics.\n";
    s += &format!(
        "{}own_server_domains = {}",
        off_unless(o.own_domains.is_some()),
        o.own_domains.unwrap_or("")
    );
    s += "\n\n\
          # SOCKS proxy port for forwarding messages to destination servers.\n\
          # You may need a separate instance of SOCKS proxy for incoming single-hop requests.\n";
    s += &format!(
        "{}socks_proxy = {}",
        off_unless(o.socks_proxy.is_some()),
        o.socks_proxy.unwrap_or("localhost:9050")
    );
    s += "\n\n\
          # `socks_mode` can be 'onion' for SOCKS proxy to be used for .onion destination hosts only (default)\n\
          # or 'always' to be used for all destination hosts (can be used if it is an .onion server).\n\
          # socks_mode = onion\n\n\
          # Limit number of threads a client can spawn to process proxy commands in parrallel.\n\
          # client_concurrency = 32\n\n\
          [NAMES]\n\
          # Public-namespace resolution via the snrc-resolve.py REST resolver.\n\
          # Operator runs the resolver alongside smp-server (default port 8000)\n\
          # with its own Ethereum JSON-RPC endpoint configured in resolver.toml.\n\
          enable: off\n\
          # Same-host:\n\
          # resolver_endpoint: http://127.0.0.1:8000\n\
          # Resolver behind TLS reverse proxy:\n\
          # resolver_endpoint: https://names.simplex.chat:443\n\
          # resolver_auth: basic <username>:<password>\n\
          # resolver_timeout_ms: 3000\n\
          # resolver_max_response_bytes: 16000\n\
          # Max concurrent name resolutions per connection (forwarded RSLVs from many\n\
          # clients share one proxy connection, so this is much higher than PROXY client_concurrency).\n\
          # resolver_concurrency = 1000\n\n\
          [INACTIVE_CLIENTS]\n\
          # TTL and interval to check inactive clients\n\
          disconnect = on\n\
          ttl = 21600\n\
          check_interval = 3600\n\n\
          [WEB]\n\
          # Set path to generate static mini-site for server information and qr codes/links\n";
    // The reference writes its site there at start, and so does the relay: under the test's
    // directory, never the machine's /var/opt.
    let static_path = log.join(o.web_static_path.unwrap_or("www"));
    s += &format!("static_path = {}\n\n", static_path.display());
    s += "# Run an embedded server on this port\n\
          # Onion sites can use any port and register it in the hidden service config.\n\
          # Running on a port 80 may require setting process capabilities.\n\
          # http = 8000\n\n\
          # You can run an embedded TLS web server too if you provide port and cert and key files.\n\
          # Not required for running relay on onion address.\n";
    let web = off_unless(!o.disable_web);
    s += &format!("{web}https = 443\n");
    s += &format!("{web}cert = {}\n", cfg.join("web.crt").display());
    s += &format!("{web}key = {}\n", cfg.join("web.key").display());
    s
}

/// A reference installation: `init` with `o` into the configuration directory `cfg` and the log
/// directory `log`, as the reference does it; returns the server address it printed.
fn reference_init(cfg: &Path, log: &Path, o: &InitOptions) -> String {
    use base64::Engine;
    let common_name = o.fqdn.unwrap_or(o.ip);
    common::reference_certificates(cfg, o.algorithm, common_name);
    let control_passwords = o.control_port.map(|_| {
        let pw = || {
            let mut b = [0u8; 18];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut b);
            base64::engine::general_purpose::URL_SAFE.encode(b)
        };
        (pw(), pw())
    });
    // The host the reference prints: the FQDN, else the IP unless it is loopback.
    let host = o.fqdn.unwrap_or(if o.ip == "127.0.0.1" {
        "<hostnames>"
    } else {
        o.ip
    });
    let ini = reference_ini(
        cfg,
        log,
        o,
        host,
        control_passwords
            .as_ref()
            .map(|(a, u)| (a.as_str(), u.as_str())),
    );
    std::fs::write(cfg.join("smp-server.ini"), ini).unwrap();
    let fingerprint = std::fs::read_to_string(cfg.join("fingerprint")).unwrap();
    let auth = o
        .password
        .as_deref()
        .map(|p| format!(":{p}"))
        .unwrap_or_default();
    format!("smp://{}{auth}@{host}", fingerprint.trim())
}

/// The kinds of `init` the reference offers, each option in at least one, and where that
/// reference server kept its messages (none: it ran without a store log, so it kept nothing).
fn init_variants() -> Vec<(&'static str, InitOptions, Option<Messages>)> {
    vec![
        ("defaults", InitOptions::default(), Some(Messages::Log)),
        (
            "ed448, fqdn, no password, no store log, daily stats, no web",
            InitOptions {
                enable_store_log: false,
                log_stats: true,
                algorithm: "ED448",
                fqdn: Some("smp.relay.example"),
                password: None,
                disable_web: true,
                ..InitOptions::default()
            },
            None,
        ),
        (
            "every other option",
            InitOptions {
                db: (
                    "postgresql://smp@localhost/smp_store".into(),
                    "smp_relay_schema".into(),
                    4,
                ),
                ip: "192.0.2.7",
                password: Some("a-password_chosen.by-the-operator".into()),
                control_port: Some(common::free_port()),
                socks_proxy: Some("localhost:9050"),
                own_domains: Some("relay.example"),
                source_code: Some("https://github.com/simplex-chat/simplexmq"),
                server_country: Some("GB"),
                operator: Some(("Operator Ltd", Some("DE"))),
                website: Some("https://relay.example"),
                hosting: Some(("Hosting Ltd", Some("NL"))),
                hosting_type: Some("dedicated"),
                web_static_path: Some("web"),
                ..InitOptions::default()
            },
            Some(Messages::Journal),
        ),
    ]
}

/// Every variant of the reference's configuration and certificates, with the data that server
/// left (its store log, and its message log or journal directory, and notification log), in its
/// two directories: `address` prints the address the reference's `init` printed; `start` refuses
/// until `store import-reference` has brought the data over, then runs on them as they are (only
/// the listening port is the test's), serves every imported message, notification, link and
/// status, and serves a queue created with the configuration's password.
#[test]
fn the_reference_configuration_and_data_of_every_init_variant_run_unchanged() {
    for (name, o, messages) in init_variants() {
        let etc = TempDir::new("drop-in-etc").expect("a temp dir");
        let var = TempDir::new("drop-in-var").expect("a temp dir");
        let printed = reference_init(etc.path(), var.path(), &o);
        let fixture = messages.map(|m| {
            if m == Messages::Journal {
                // The reference's journal message store, as its operator configured it.
                let ini = etc.path().join("smp-server.ini");
                let text = std::fs::read_to_string(&ini).unwrap();
                let text = text.replace("store_messages = memory", "store_messages = journal");
                std::fs::write(&ini, text).unwrap();
            }
            let f = reference_data::write_fixture(var.path(), m);
            let refused = common::run_with_reference_env(etc.path(), var.path(), &["start"]);
            let stderr = String::from_utf8_lossy(&refused.stderr);
            assert!(
                !refused.status.success() && stderr.contains("store import-reference"),
                "{name}: a start before the import: {stderr}"
            );
            let out = common::run_with_reference_env(
                etc.path(),
                var.path(),
                &["store", "import-reference"],
            );
            assert!(
                out.status.success(),
                "{name}: import: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            f
        });
        let out = common::run_with_reference_env(etc.path(), var.path(), &["address"]);
        assert!(
            out.status.success(),
            "{name}: address: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            printed,
            "{name}"
        );

        let relay = Relay::start_in(
            var,
            RelayOptions {
                extra_args: vec!["--config-dir".into(), etc.path().to_str().unwrap().into()],
                ..RelayOptions::default()
            },
        );
        let log = relay.log_text();
        assert!(
            log.contains(&format!("{printed}:{}", relay.port)),
            "{name}: the start's address:\n{log}"
        );
        if let Some(f) = &fixture {
            reference_data::check_served(&relay, f, true);
        }
        // The reference's `static_path` gets the site, with the `[INFORMATION]` it was given.
        let site = relay
            .dir
            .path()
            .join(o.web_static_path.unwrap_or("www"))
            .join("index.html");
        let page = std::fs::read_to_string(&site)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", site.display()));
        if let Some((operator, _)) = o.operator {
            assert!(page.contains(operator), "{name}: the operator on the page");
        }
        assert_eq!(
            page.contains("data-field=\"no_source_code\""),
            o.source_code.is_none(),
            "{name}: the source code, or the request for it"
        );
        if let Some(port) = o.control_port {
            // The control port with the admin password the reference's `init` wrote.
            let ini = std::fs::read_to_string(etc.path().join("smp-server.ini")).unwrap();
            let password = ini
                .lines()
                .find_map(|l| l.strip_prefix("control_port_admin_password = "))
                .expect("the template's admin password");
            assert_eq!(
                control_port_auth(port, password),
                "Current role is CPRAdmin",
                "{name}"
            );
        }
        let mut c = relay.client();
        let keys = RecipientKeys::generate(KeyAlg::Ed25519);
        let mut new = smp_relay::client::queue::new_queue(&keys);
        new.basic_auth = o.password.as_ref().map(|p| p.as_bytes().to_vec());
        let q = support::create_with(&mut c, keys, new);
        support::send_ok(&mut c, &q, None, name.as_bytes());
        support::expect_body(&mut c, &q, name.as_bytes());
    }
}

/// `auth PASSWORD` on the control port at 127.0.0.1:`port`: the answer after the greeting.
fn control_port_auth(port: u16, password: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut w = std::net::TcpStream::connect(("127.0.0.1", port)).expect("control port");
    w.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(w.try_clone().unwrap());
    writeln!(w, "auth {password}").unwrap();
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut l = String::new();
        r.read_line(&mut l).expect("a line");
        lines.push(l.trim_end().to_string());
    }
    assert_eq!(lines[0], "SMP server control port", "{lines:?}");
    lines.pop().unwrap()
}
