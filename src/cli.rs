//! The `smp-relay` command line: `init` creates a data directory (keys, certificates, the server address),
//! `start` runs the relay on it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rand::RngCore;

use smp_relay::config::{self, StartConfig};
use smp_relay::crypto::hash;
use smp_relay::transport::certs;

#[derive(Parser)]
#[command(
    name = "smp-relay",
    version,
    about = "A thread-per-core SimpleX Messaging Protocol relay"
)]
struct Cli {
    /// Directory holding keys, certificates, configuration and data.
    #[arg(long, global = true, default_value = config::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the data directory: the offline CA and online server certificate (Ed25519), the
    /// fingerprint and, unless --no-password, a random password for creating queues. Prints the
    /// server address. Refuses to overwrite an existing directory's keys.
    Init {
        /// Host name or IP address clients use to reach this relay (printed in the address).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port printed in the address.
        #[arg(long, default_value_t = config::DEFAULT_PORT)]
        port: u16,
        /// Let anyone create queues (no create password).
        #[arg(long)]
        no_password: bool,
    },
    /// Run the relay: one pinned shard per core, listening on every --port.
    Start {
        /// Port to listen on; repeat for several (default 5223).
        #[arg(long = "port")]
        ports: Vec<u16>,
        /// Number of shards, each pinned to its own core (default: every online core).
        #[arg(long)]
        cores: Option<usize>,
        /// Connections held at once, over all shards.
        #[arg(long, default_value_t = smp_relay::limits::MAX_CONNECTIONS)]
        max_connections: usize,
        /// Seconds a client has to complete TLS.
        #[arg(long, default_value_t = smp_relay::limits::TLS_SETUP_TIMEOUT.as_secs())]
        tls_timeout_secs: u64,
        /// Seconds a client has to complete the SMP handshake after TLS.
        #[arg(long, default_value_t = smp_relay::limits::SMP_HANDSHAKE_TIMEOUT.as_secs())]
        handshake_timeout_secs: u64,
        /// Ask clients for a TLS certificate (test switch until services exist).
        #[arg(long, hide = true)]
        test_request_client_cert: bool,
        /// Store: `memory` (saved at a clean stop, restored at start; a crash loses what was not
        /// saved). The journal and PostgreSQL stores come later.
        #[arg(long, default_value = "memory", value_parser = ["memory"])]
        store: String,
        /// Messages a queue holds before senders get ERR QUOTA.
        #[arg(long, default_value_t = 128)]
        quota: usize,
        /// Seconds a message is kept (default 21 days).
        #[arg(long, default_value_t = 21 * 86400)]
        message_ttl_secs: u64,
        /// Seconds between expiration runs over all queues (default 2 hours).
        #[arg(long, default_value_t = 2 * 3600)]
        expire_interval_secs: u64,
        /// Delete a queue's expired messages before each SEND to it.
        #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
        expire_on_send: bool,
        /// Seconds a notification is kept (default 24 hours).
        #[arg(long, default_value_t = 24 * 3600)]
        notification_ttl_secs: u64,
        /// Allow NEW (queue creation).
        #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
        new_queues: bool,
    },
}

pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SMP_RELAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Init {
            host,
            port,
            no_password,
        } => init(&cli.data_dir, &host, port, no_password),
        Command::Start {
            ports,
            cores,
            max_connections,
            tls_timeout_secs,
            handshake_timeout_secs,
            test_request_client_cert,
            store: _,
            quota,
            message_ttl_secs,
            expire_interval_secs,
            expire_on_send,
            notification_ttl_secs,
            new_queues,
        } => {
            let mut c = StartConfig::new(&cli.data_dir);
            if !ports.is_empty() {
                c.ports = ports;
            }
            c.shards = cores
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            c.max_connections = max_connections.max(1);
            c.tls_timeout = Duration::from_secs(tls_timeout_secs);
            c.handshake_timeout = Duration::from_secs(handshake_timeout_secs);
            c.request_client_cert = test_request_client_cert;
            c.settings.quota = quota;
            c.settings.message_ttl = Duration::from_secs(message_ttl_secs);
            c.settings.expire_interval = Duration::from_secs(expire_interval_secs.max(1));
            c.settings.expire_on_send = expire_on_send;
            c.settings.notification_ttl = Duration::from_secs(notification_ttl_secs);
            c.settings.new_queues = new_queues;
            start(c)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("smp-relay: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// `on`/`off`, as the reference's configuration booleans.
fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

/// The create password `init` wrote into `[AUTH] create_password` of the configuration file.
fn read_create_password(dir: &Path) -> Result<Option<Vec<u8>>, String> {
    let path = dir.join(config::INI_FILE);
    let Ok(text) = fs::read_to_string(&path) else {
        return Ok(None);
    };
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            if k.trim() == "create_password" {
                return Ok(Some(v.trim().as_bytes().to_vec()));
            }
        }
    }
    Ok(None)
}

fn init(dir: &Path, host: &str, port: u16, no_password: bool) -> Result<(), String> {
    let existing: Vec<&str> = [
        config::CA_KEY_FILE,
        config::CA_CERT_FILE,
        config::SERVER_KEY_FILE,
        config::SERVER_CERT_FILE,
        config::FINGERPRINT_FILE,
        config::INI_FILE,
    ]
    .into_iter()
    .filter(|f| dir.join(f).exists())
    .collect();
    if !existing.is_empty() {
        return Err(format!(
            "{} is already initialised ({} present); refusing to overwrite its keys. Remove the directory or choose another --data-dir",
            dir.display(),
            existing.join(", ")
        ));
    }
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let creds = certs::generate(host).map_err(|e| e.to_string())?;
    write_file(dir, config::CA_KEY_FILE, &creds.ca_key_pem, true)?;
    write_file(dir, config::CA_CERT_FILE, &creds.ca_cert_pem, false)?;
    write_file(dir, config::SERVER_KEY_FILE, &creds.server_key_pem, true)?;
    write_file(dir, config::SERVER_CERT_FILE, &creds.server_cert_pem, false)?;
    let loaded = certs::load(dir).map_err(|e| e.to_string())?;
    let fingerprint = hash::b64url(&loaded.key_hash);
    write_file(
        dir,
        config::FINGERPRINT_FILE,
        &format!("{fingerprint}\n"),
        false,
    )?;
    let password = (!no_password).then(|| {
        let mut b = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut b);
        // URL-safe without padding: valid in a server address (no '/', ':', '@' or spaces).
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    });
    let mut ini = String::from("[TRANSPORT]\n");
    ini.push_str(&format!(
        "host = {host}\nport = {port}\n\n[AUTH]\nnew_queues = on\n"
    ));
    if let Some(p) = &password {
        ini.push_str(&format!("create_password = {p}\n"));
    }
    write_file(dir, config::INI_FILE, &ini, true)?;
    let auth = password.map(|p| format!(":{p}")).unwrap_or_default();
    println!("smp://{fingerprint}{auth}@{host}:{port}");
    Ok(())
}

fn write_file(dir: &Path, name: &str, contents: &str, private: bool) -> Result<(), String> {
    let path = dir.join(name);
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(contents.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn start(mut c: StartConfig) -> Result<(), String> {
    if !c.data_dir.join(config::SERVER_KEY_FILE).exists() {
        // The README's first command: a fresh checkout runs `start` and gets a working relay.
        let dir = c.data_dir.clone();
        eprintln!(
            "smp-relay: {} has no keys yet; initialising it (host 127.0.0.1, no password)",
            dir.display()
        );
        init(&dir, "127.0.0.1", c.ports[0], true)?;
    }
    c.settings.create_password = read_create_password(&c.data_dir)?;
    smp_relay::server::run(c).map_err(|e| e.to_string())
}
