//! The `smp-relay` command line: `init` creates a data directory (keys, certificates, the
//! configuration file, the server address), `start` runs the relay on it, `block`/`unblock` change a
//! queue's status in the store of a stopped relay, `store export`/`store import` copy a stopped
//! relay's store to a stream and a stream into an empty store (`store/transfer.rs`).

mod import_reference;
#[cfg(feature = "test-kit")]
mod test_hooks;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use rand::RngCore;

use futures_lite::future::block_on;
use smp_relay::config::{self, StartConfig};
use smp_relay::crypto::hash;
use smp_relay::ini;
use smp_relay::protocol::error::{BlockingInfo, BlockingReason};
use smp_relay::server::{lock, lock::LockError};
use smp_relay::settings::StartFlags;
use smp_relay::store::services::{ServiceRec, Services};
use smp_relay::store::{
    all_groups, transfer, with_store, QueueRec, QueueStatus, ShardStore, StoreKind, StoreSettings,
    WithStore,
};
use smp_relay::transport::certs;

#[derive(Parser)]
#[command(
    name = "smp-relay",
    version,
    about = "A thread-per-core SimpleX Messaging Protocol relay"
)]
struct Cli {
    /// Directory holding keys, certificates, configuration and data (the one-folder layout;
    /// default ./smp-data unless the reference's environment variables below are set).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The reference smp-server's configuration directory (smp-server.ini, ca.crt, server.crt,
    /// server.key, fingerprint), e.g. /etc/opt/simplex. Default: --data-dir, else the
    /// environment variable SMP_SERVER_CFG_PATH, as the reference reads it.
    #[arg(long, global = true, value_name = "DIR")]
    config_dir: Option<PathBuf>,
    /// The reference smp-server's log directory, where this relay keeps its store, lock and
    /// metrics, e.g. /var/opt/simplex. Default: --data-dir, else the environment variable
    /// SMP_SERVER_LOG_PATH, as the reference reads it.
    #[arg(long, global = true, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// What the log shows: error, warn, info (the default), debug (each connection's peer,
    /// version, open and close) or trace; or a tracing filter such as `info,smp_relay=debug`.
    /// Without it, the environment variable SMP_RELAY_LOG, if set.
    #[arg(long, global = true, value_name = "LEVEL", value_parser = log_filter)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of `start`'s options does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Create the data directory: the offline CA and online server certificate (Ed25519), the
    /// fingerprint, the configuration file smp-server.ini and, unless --no-password, a random
    /// password for creating queues. Prints the server address. Refuses to overwrite an existing
    /// directory's keys.
    Init {
        /// Host name or IP address clients use to reach this relay (printed in the address).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port printed in the address.
        #[arg(long, default_value_t = config::DEFAULT_PORT, value_parser = ini::port)]
        port: u16,
        /// Let anyone create queues (no create password).
        #[arg(long)]
        no_password: bool,
        /// Turn the control port on (127.0.0.1, port 5224 unless given), with new admin and user
        /// passwords in smp-server.ini, as the reference's `init --control-port`.
        #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "5224", value_parser = ini::port)]
        control_port: Option<u16>,
    },
    /// Run the relay: one pinned shard per core, listening on every port. Settings come from these
    /// options, then from <data-dir>/smp-server.ini, then from the defaults.
    Start(StartArgs),
    /// Print the server address, as `init` did and `start` logs it: the fingerprint, the create
    /// password, `[TRANSPORT] host` and the first port of <data-dir>/smp-server.ini.
    Address,
    /// Make a new online certificate and key (server.crt, server.key) under the same offline CA
    /// (ca.key must be in the data directory): the server address stays. Restart the relay to
    /// serve them. As the reference's `cert`.
    Cert {
        /// ED25519 or ED448 (default: that of the current certificate).
        #[arg(long = "sign-algorithm", short = 'a', value_enum, ignore_case = true)]
        algorithm: Option<CertAlgorithm>,
        /// The new certificate's common name (default: the current one's).
        #[arg(long = "cn", value_name = "FQDN")]
        common_name: Option<String>,
    },
    /// Block a queue of a stopped relay: its clients get ERR BLOCKED (older clients AUTH) for
    /// every command but OFF and DEL. Edits the store the relay saved at its last clean stop.
    Block {
        /// The queue's sender ID or link ID, base64url (padding optional; it may start with '-').
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// Why the queue is blocked, as clients are told.
        #[arg(long, value_enum)]
        reason: Reason,
        /// A JSON object for clients (v18+), e.g. '{"ttl":3600}'.
        #[arg(long)]
        notice: Option<String>,
    },
    /// Unblock a queue of a stopped relay that `block` blocked.
    Unblock {
        /// The queue's sender ID or link ID, base64url (padding optional; it may start with '-').
        #[arg(allow_hyphen_values = true)]
        id: String,
    },
    /// The PostgreSQL store's database: going back to the reference server.
    Database {
        #[command(subcommand)]
        command: DatabaseCommand,
    },
    /// Copy the store of a stopped relay to a stream, or a stream into an empty store (to move a
    /// relay between store kinds or machines).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Write every queue of a stopped relay's store (records, messages in order with the quota
    /// marker, pending notifications) to a file or stdout. Changes nothing.
    Export {
        /// The store to read (default: the one the data directory holds).
        #[arg(long, value_enum)]
        store: Option<StoreArg>,
        /// Where to write the stream; `-` is stdout (not a terminal).
        #[arg(long, value_name = "FILE|-", default_value = "-")]
        output: PathBuf,
        /// The PostgreSQL store's database (default: the one the relay last started with).
        #[arg(long, value_name = "CONNINFO")]
        database: Option<String>,
        /// The PostgreSQL store's schema (default: as the relay last started, else smp_server).
        #[arg(long, value_name = "NAME")]
        schema: Option<String>,
        /// No progress and no summary on stderr.
        #[arg(long)]
        quiet: bool,
    },
    /// Read a stream `store export` wrote into the empty store of a stopped relay's data
    /// directory (created if missing). Checks the stream's counts; on any error the store is left
    /// empty.
    Import {
        /// The store to write.
        #[arg(long, value_enum, default_value_t = StoreArg::Journal)]
        store: StoreArg,
        /// Where to read the stream; `-` is stdin (not a terminal).
        #[arg(long, value_name = "FILE|-", default_value = "-")]
        input: PathBuf,
        /// The PostgreSQL store's database (default: the one the relay last started with).
        #[arg(long, value_name = "CONNINFO")]
        database: Option<String>,
        /// The PostgreSQL store's schema (default: as the relay last started, else smp_server).
        #[arg(long, value_name = "NAME")]
        schema: Option<String>,
        /// No progress and no summary on stderr.
        #[arg(long)]
        quiet: bool,
    },
    /// Read the reference smp-server's data (its store log, its message log or journal
    /// directory, its notification log) into the empty store of a stopped relay's data
    /// directory. The reference's files are only read. Checks the counts; on any error the store
    /// is left empty.
    ImportReference {
        /// The reference's log directory, e.g. /var/opt/simplex (default: the store's, --log-dir).
        #[arg(long, value_name = "DIR")]
        from: Option<PathBuf>,
        /// The store to write (default: the one smp-server.ini names, as `start` would open it;
        /// else the journal).
        #[arg(long, value_enum)]
        store: Option<StoreArg>,
        /// The PostgreSQL store's database (default: smp-server.ini's `db_connection`).
        #[arg(long, value_name = "CONNINFO")]
        database: Option<String>,
        /// The PostgreSQL store's schema (default: smp-server.ini's `db_schema`, else smp_server).
        #[arg(long, value_name = "NAME")]
        schema: Option<String>,
        /// No progress and no summary on stderr (skipped lines are still listed).
        #[arg(long)]
        quiet: bool,
    },
    /// Write a stopped relay's store as the reference smp-server's files (smp-server-store.log,
    /// smp-server-messages.log, smp-server-ntfs.log) into DIR, for the reference with
    /// store_queues and store_messages `memory`: the way back. Changes nothing in the store.
    ExportReference {
        /// Where to write them, e.g. /var/opt/simplex; it must hold none of them.
        #[arg(long, value_name = "DIR")]
        to: PathBuf,
        /// The store to read (default: the one the data directory holds).
        #[arg(long, value_enum)]
        store: Option<StoreArg>,
        /// The PostgreSQL store's database (default: the one the relay last started with).
        #[arg(long, value_name = "CONNINFO")]
        database: Option<String>,
        /// The PostgreSQL store's schema (default: as the relay last started, else smp_server).
        #[arg(long, value_name = "NAME")]
        schema: Option<String>,
        /// No progress and no summary on stderr.
        #[arg(long)]
        quiet: bool,
    },
}

#[derive(Subcommand)]
enum DatabaseCommand {
    /// Remove from a stopped relay's PostgreSQL schema every object of this relay's own (and
    /// their `smprelay_migrations` table), leaving the reference server's schema as it is, so
    /// that the reference smp-server can run on the database again.
    Downgrade {
        /// The database (default: the one the relay last started with).
        #[arg(long, value_name = "CONNINFO")]
        database: Option<String>,
        /// The schema (default: as the relay last started, else smp_server).
        #[arg(long, value_name = "NAME")]
        schema: Option<String>,
    },
}

/// `--store` of `store export`/`store import`: the kinds that exist.
#[derive(Clone, Copy, ValueEnum)]
enum StoreArg {
    Journal,
    Memory,
    Postgres,
}

impl StoreArg {
    fn kind(self) -> StoreKind {
        match self {
            StoreArg::Journal => StoreKind::Journal,
            StoreArg::Memory => StoreKind::Memory,
            StoreArg::Postgres => StoreKind::Postgres,
        }
    }
}

#[derive(Args)]
struct StartArgs {
    /// The settings the configuration file may also set (`smp_relay::settings`).
    #[command(flatten)]
    settings: StartFlags,
    /// The tests' hooks (`--test-*`), in builds with the `test-kit` feature only.
    #[cfg(feature = "test-kit")]
    #[command(flatten)]
    test: test_hooks::TestFlags,
    /// Turn off the proxy role of private routing (PRXY is then refused with PROXY BASIC_AUTH).
    #[arg(long)]
    no_proxy: bool,
    /// Password clients must give to use this relay as a proxy (default: the create password).
    #[arg(long, value_name = "PASSWORD",
          value_parser = |s: &str| ini::create_password(s).map(|_| s.to_string()))]
    proxy_password: Option<String>,
    /// Let the proxy connect to loopback, private and other special addresses (tests on one host).
    #[arg(long)]
    proxy_allow_private: bool,
}

impl StartArgs {
    /// The proxy role's switches that only the command line has (`config::ProxySettings`).
    fn apply_proxy(&self, p: &mut config::ProxySettings) {
        p.enabled &= !self.no_proxy;
        if let Some(pw) = &self.proxy_password {
            p.password = Some(pw.as_bytes().to_vec());
        }
        p.allow_private |= self.proxy_allow_private;
    }
}

/// `SHARD:MS` of `--test-store-delay`.
#[derive(Clone, Copy, ValueEnum)]
enum CertAlgorithm {
    #[value(name = "ED25519")]
    Ed25519,
    #[value(name = "ED448")]
    Ed448,
}

#[derive(Clone, Copy, ValueEnum)]
enum Reason {
    Spam,
    Content,
}

/// `--log-level`: a level or a filter `tracing` takes.
fn log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{e}: expected error, warn, info, debug, trace or a tracing filter"))
}

/// The reference's environment variables naming its two directories (simplexmq
/// `apps/smp-server/Main.hs`).
const CFG_PATH_ENV: &str = "SMP_SERVER_CFG_PATH";
const LOG_PATH_ENV: &str = "SMP_SERVER_LOG_PATH";

/// Where the relay's files are: certificates and configuration in `config`, store, lock and
/// metrics in `data` (the same folder in the one-folder layout of `--data-dir`).
struct Dirs {
    config: PathBuf,
    data: PathBuf,
}

impl Dirs {
    /// Each directory from its own option, else `--data-dir`, else the reference's environment
    /// variable, else `./smp-data`. `env` reads an environment variable (a parameter for tests).
    fn resolve(cli: &Cli, env: impl Fn(&str) -> Option<String>) -> Dirs {
        let pick = |own: &Option<PathBuf>, var: &str| {
            own.clone()
                .or_else(|| cli.data_dir.clone())
                .or_else(|| env(var).filter(|v| !v.is_empty()).map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(config::DEFAULT_DATA_DIR))
        };
        Dirs {
            config: pick(&cli.config_dir, CFG_PATH_ENV),
            data: pick(&cli.log_dir, LOG_PATH_ENV),
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let dirs = Dirs::resolve(&cli, |v| std::env::var(v).ok());
    let filter = match &cli.log_level {
        Some(f) => tracing_subscriber::EnvFilter::new(f),
        None => tracing_subscriber::EnvFilter::try_from_env("SMP_RELAY_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a journal (systemd) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Init {
            host,
            port,
            no_password,
            control_port,
        } => init(&dirs, &host, port, no_password, control_port),
        Command::Start(args) => start(&dirs, &args),
        Command::Address => server_address(&dirs.config).map(|a| println!("{a}")),
        Command::Cert {
            algorithm,
            common_name,
        } => reissue(&dirs.config, algorithm, common_name.as_deref()),
        Command::Block { id, reason, notice } => {
            let reason = match reason {
                Reason::Spam => BlockingReason::Spam,
                Reason::Content => BlockingReason::Content,
            };
            notice
                .as_deref()
                .map(compact_json_object)
                .transpose()
                .and_then(|notice| {
                    offline_edit(&dirs, &id, Edit::Block(BlockingInfo { reason, notice }))
                })
        }
        Command::Unblock { id } => offline_edit(&dirs, &id, Edit::Unblock),
        Command::Database {
            command: DatabaseCommand::Downgrade { database, schema },
        } => offline_settings_with(&dirs.data, database, schema)
            .postgres
            .ok_or_else(|| {
                "no database: pass --database CONNINFO (the relay records the one it last started \
                 with in <data-dir>/postgres-store)"
                    .to_string()
            })
            .and_then(|pg| smp_relay::store::postgres::downgrade(&pg))
            .map(|report| println!("{report}")),
        Command::Store {
            command:
                StoreCommand::Export {
                    store,
                    output,
                    quiet,
                    database,
                    schema,
                },
        } => match store
            .map(StoreArg::kind)
            .or_else(|| StoreKind::found_in(&dirs.data))
        {
            Some(kind) => store_export(
                &offline_settings_with(&dirs.data, database, schema),
                kind,
                &output,
                quiet,
            ),
            None => Err(format!(
                "{} holds no store to export (neither journal/ nor memory-store/ files)",
                dirs.data.display()
            )),
        },
        Command::Store {
            command:
                StoreCommand::Import {
                    store,
                    input,
                    quiet,
                    database,
                    schema,
                },
        } => store_import(
            &offline_settings_with(&dirs.data, database, schema),
            store.kind(),
            &input,
            quiet,
        ),
        Command::Store {
            command:
                StoreCommand::ImportReference {
                    from,
                    store,
                    database,
                    schema,
                    quiet,
                },
        } => load_ini(&dirs.config).map(|f| f.options).and_then(|file| {
            // What `start` will open: the file's store and database unless given here.
            let kind = store
                .map(StoreArg::kind)
                .or(file.store)
                .unwrap_or(StoreKind::Journal);
            import_reference::run(
                &offline_settings_with(
                    &dirs.data,
                    database.or(file.database),
                    schema.or(file.db_schema),
                ),
                kind,
                from.as_deref().unwrap_or(&dirs.data),
                quiet,
            )
        }),
        Command::Store {
            command:
                StoreCommand::ExportReference {
                    to,
                    store,
                    database,
                    schema,
                    quiet,
                },
        } => import_reference::export(
            &offline_settings_with(&dirs.data, database, schema),
            store.map(StoreArg::kind),
            &to,
            quiet,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("smp-relay: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// What `init` writes.
const INIT_FILES: [&str; 6] = [
    config::CA_KEY_FILE,
    config::CA_CERT_FILE,
    config::SERVER_KEY_FILE,
    config::SERVER_CERT_FILE,
    config::FINGERPRINT_FILE,
    config::INI_FILE,
];

/// The files of `INIT_FILES` present in `dir`.
fn init_files_present(dir: &Path) -> Vec<&'static str> {
    INIT_FILES
        .into_iter()
        .filter(|f| dir.join(f).exists())
        .collect()
}

fn init(
    dirs: &Dirs,
    host: &str,
    port: u16,
    no_password: bool,
    control_port: Option<u16>,
) -> Result<(), String> {
    smp_relay::store::create_private_dir(&dirs.data)
        .map_err(|e| format!("cannot create {}: {e}", dirs.data.display()))?;
    let dir = dirs.config.as_path();
    let existing = init_files_present(dir);
    if !existing.is_empty() {
        return Err(format!(
            "{} is already initialised ({} present); refusing to overwrite its keys. Remove the directory or choose another --data-dir",
            dir.display(),
            existing.join(", ")
        ));
    }
    smp_relay::store::create_private_dir(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // None of the files was there: on a failure (a full disk) every one written goes again, so
    // that the directory is not left half initialised, which neither `init` nor `start` accepts.
    write_identity(dir, host, port, no_password, control_port).inspect_err(|_| {
        for f in INIT_FILES {
            let _ = fs::remove_file(dir.join(f));
        }
    })
}

fn write_identity(
    dir: &Path,
    host: &str,
    port: u16,
    no_password: bool,
    control_port: Option<u16>,
) -> Result<(), String> {
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
    let mut ini = ini_template(host, port, password.as_deref());
    if let Some(cp) = control_port {
        // 18 random bytes each, base64url: 24 characters, as the reference's.
        let pw = || {
            let mut b = [0u8; 18];
            rand::rngs::OsRng.fill_bytes(&mut b);
            hash::b64url(&b)
        };
        ini = with_control_port(&ini, cp, &pw(), &pw());
    }
    write_file(dir, config::INI_FILE, &ini, true)?;
    println!("{}", address(&fingerprint, password.as_deref(), host, port));
    if let Some(cp) = control_port {
        // The passwords are not printed (a terminal's scrollback and logs keep what is printed).
        println!(
            "control port: 127.0.0.1:{cp}; its admin and user passwords are in {} ([AUTH] \
             control_port_admin_password, control_port_user_password)",
            dir.join(config::INI_FILE).display()
        );
    }
    Ok(())
}

/// The template with the control port's lines uncommented: the port and both passwords.
fn with_control_port(template: &str, port: u16, admin: &str, user: &str) -> String {
    template
        .replacen(
            "# control_port_admin_password = \n",
            &format!("control_port_admin_password = {admin}\n"),
            1,
        )
        .replacen(
            "# control_port_user_password = \n",
            &format!("control_port_user_password = {user}\n"),
            1,
        )
        .replacen(
            "# control_port = 5224\n",
            &format!("control_port = {port}\n"),
            1,
        )
}

/// `cert`: the new online certificate, and what it means for the running relay.
fn reissue(
    data_dir: &Path,
    algorithm: Option<CertAlgorithm>,
    common_name: Option<&str>,
) -> Result<(), String> {
    use smp_relay::transport::reissue::{self, Algorithm};
    let algorithm = algorithm.map(|a| match a {
        CertAlgorithm::Ed25519 => Algorithm::Ed25519,
        CertAlgorithm::Ed448 => Algorithm::Ed448,
    });
    let made = reissue::reissue(data_dir, algorithm, common_name)?;
    // The chain must still be one clients accept, under the fingerprint they were given.
    certs::load_for_start(data_dir).map_err(|e| format!("the new certificate: {e}"))?;
    println!(
        "a new online certificate ({:?}, CN={}) in {}, under the same CA: the server address is \
         unchanged; restart the relay to serve it",
        made.algorithm,
        made.common_name,
        data_dir.display()
    );
    Ok(())
}

/// `smp://fingerprint[:password]@host[:port]`, what users put in their apps; the port only when
/// it is not the default 5223, as the reference prints it (simplexmq `Protocol.hs`,
/// `ProtocolServer` encoding), so that the address of a relay moved from smp-server is the same
/// text.
fn address(fingerprint: &str, password: Option<&str>, host: &str, port: u16) -> String {
    let auth = password.map(|p| format!(":{p}")).unwrap_or_default();
    if port == config::DEFAULT_PORT {
        format!("smp://{fingerprint}{auth}@{host}")
    } else {
        format!("smp://{fingerprint}{auth}@{host}:{port}")
    }
}

/// The address of the relay of `data_dir`, from its `fingerprint` and `smp-server.ini`.
fn server_address(data_dir: &Path) -> Result<String, String> {
    let fp_path = data_dir.join(config::FINGERPRINT_FILE);
    let fingerprint = fs::read_to_string(&fp_path).map_err(|e| {
        format!(
            "cannot read {}: {e} (is {} a relay's data directory? `init` makes one)",
            fp_path.display(),
            data_dir.display()
        )
    })?;
    let file = load_ini(data_dir)?;
    let port = file
        .options
        .ports
        .as_ref()
        .and_then(|p| p.first().copied())
        .unwrap_or(config::DEFAULT_PORT);
    let password = file
        .options
        .create_password
        .as_deref()
        .map(String::from_utf8_lossy);
    Ok(address(
        fingerprint.trim(),
        password.as_deref(),
        file.host.as_deref().unwrap_or("127.0.0.1"),
        port,
    ))
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

/// The configuration file `init` writes: the reference's sections and keys this relay applies, with
/// their defaults, commented where the reference's template comments them (`ini.rs` lists them all).
fn ini_template(host: &str, port: u16, password: Option<&str>) -> String {
    let c = StartConfig::new(Path::new(config::DEFAULT_DATA_DIR));
    let d = &c.settings;
    let password_line = match password {
        Some(p) => format!("create_password = {p}"),
        None => "# create_password = <printable ASCII without spaces, '@', ':' or '/'>".to_string(),
    };
    format!(
        "[STORE_LOG]\n\
         # Where queues, messages and notifications are kept: journal (memory-mapped files under the\n\
         # data directory, nothing answered is lost if the relay is killed), memory (saved at a\n\
         # clean stop, SIGINT or SIGTERM, and restored at start) or database (PostgreSQL: set\n\
         # store_queues to database too, and the db_connection, db_schema and db_pool_size keys).\n\
         store_messages = journal\n\
         # store_queues = memory\n\
         # When the journal is synced to the disk: every-batch, interval-ms N, or never.\n\
         # fsync = interval-ms 50\n\
         # The most bytes the journal's files may take (K, M, G, T; at least 16M); no cap when\n\
         # unset. At the cap, as on a full disk, SEND and NEW answer ERR STORE; deletes go on.\n\
         # journal_max_size = 4G\n\
         # Records after which a journal group writes its checkpoint again (what a start after\n\
         # a crash replays at most per group).\n\
         # journal_checkpoint_records = {checkpoint}\n\
         # The PostgreSQL store (store_messages: database): database, schema, connections.\n\
         # db_connection = {conninfo}\n\
         # db_schema = {schema}\n\
         # db_pool_size = {pool_size}\n\
         # The memory store: enable off keeps nothing over a restart, restore_messages off keeps\n\
         # the queues but not their messages.\n\
         # enable = on\n\
         # restore_messages = on\n\
         \n\
         # How long messages and notifications are kept.\n\
         expire_messages_days = {days}\n\
         expire_messages_on_send = {on_send}\n\
         expire_ntfs_hours = {hours}\n\
         \n\
         # Seconds between rewrites of smp-server-metrics.txt (Prometheus text); no file when unset.\n\
         # prometheus_interval = 60\n\
         \n\
         # The daily statistics (smp-server-stats.daily.log, a CSV line at 00:00 UTC) and the\n\
         # counters kept over a restart (smp-server-stats.log).\n\
         log_stats = off\n\
         \n\
         [AUTH]\n\
         # off refuses every NEW, e.g. while moving users off this relay.\n\
         new_queues = {new_queues}\n\
         \n\
         # The password NEW must carry. It is part of the server address given to the users who may\n\
         # create queues here (smp://fingerprint:password@host), not to their contacts.\n\
         {password_line}\n\
         \n\
         # The control port's passwords (admin, and user: stats, status, block, unblock).\n\
         # control_port_admin_password = \n\
         # control_port_user_password = \n\
         \n\
         # The limit for queues that can be blocked via control port per day, resets at 0:00 UTC.\n\
         # Set to 0 to disable limit, to -1 to prohibit blocking. Default is 20.\n\
         # daily_block_queue_quota = 20\n\
         \n\
         [TRANSPORT]\n\
         # host is only printed in the server address; list several ports separated by commas.\n\
         host = {host}\n\
         port = {port}\n\
         # SMP over WebSocket for web clients (TLS with this certificate, then an HTTP/1.1\n\
         # upgrade): off, on (port 80) or ports other than those above.\n\
         websockets = off\n\
         # The control port, on 127.0.0.1 only (see the passwords under [AUTH]).\n\
         # control_port = 5224\n\
         \n\
         [PROXY]\n\
         # SOCKS5 proxy (e.g. Tor) for .onion destinations of private routing; refused without it.\n\
         # socks_proxy = 127.0.0.1:9050\n\
         # Destinations on these domains are counted again as \"own\" in the proxy statistics.\n\
         # own_server_domains = example.com\n\
         # Forwarded commands of one connection answered at once.\n\
         # client_concurrency = 32\n\
         \n\
         [INACTIVE_CLIENTS]\n\
         # Close connections without subscriptions that sent and received nothing for ttl\n\
         # seconds, looked for every check_interval seconds (as the reference's template).\n\
         disconnect = on\n\
         ttl = {inactive_ttl}\n\
         check_interval = {inactive_check}\n\
         \n\
         [INFORMATION]\n\
         # What the web site's server information page publishes (see [WEB]). source_code comes\n\
         # first: the page shows nothing else without it. The relay's licence (AGPLv3) asks you\n\
         # to publish the source code you run, your changes included.\n\
         # source_code = https://example.com/your/smp-relay\n\
         # Usage conditions, and amendments to them (links).\n\
         # usage_conditions = https://example.com/conditions\n\
         # condition_amendments = https://example.com/amendments\n\
         # Where the server is and who runs it (ISO 3166 two-letter country codes).\n\
         # server_country = DE\n\
         # operator = Example Ltd\n\
         # operator_country = DE\n\
         # website = https://example.com\n\
         # Contacts of the administrator, and for complaints and feedback: a SimpleX address,\n\
         # an email, a PGP key (its link and fingerprint, both or neither).\n\
         # admin_simplex = https://smp.example.com/a#...\n\
         # admin_email = admin@example.com\n\
         # admin_pgp = https://example.com/admin.asc\n\
         # admin_pgp_fingerprint = 0123 4567 89AB CDEF 0123  4567 89AB CDEF 0123 4567\n\
         # complaints_simplex = https://smp.example.com/a#...\n\
         # complaints_email = complaints@example.com\n\
         # complaints_pgp = https://example.com/complaints.asc\n\
         # complaints_pgp_fingerprint = 0123 4567 89AB CDEF 0123  4567 89AB CDEF 0123 4567\n\
         # The hosting provider, its country, and virtual, dedicated, colocation or owned.\n\
         # hosting = Example Hosting\n\
         # hosting_country = DE\n\
         # hosting_type = virtual\n\
         \n\
         [WEB]\n\
         # The web site: the server information page (from [INFORMATION] and the settings\n\
         # above) and the pages the apps' links open (https://<host>/a#...), written here at\n\
         # start and served on http, https and an SMP port named by https. No site when unset.\n\
         # static_path = /var/opt/simplex/www\n\
         # http = 8000\n\
         # One of the ports above may serve web clients too: a client that names a host (TLS SNI,\n\
         # as browsers do) gets this web certificate, the site and SMP over WebSocket, one that\n\
         # names none native SMP. The address stays this relay's fingerprint. Another port\n\
         # serves the site alone over HTTPS.\n\
         # https = 443\n\
         # cert = /etc/opt/simplex/web.crt\n\
         # key = /etc/opt/simplex/web.key\n\
         \n\
         [RELAY]\n\
         # What the reference fixes in code. Messages a queue holds before ERR QUOTA:\n\
         # quota = {quota}\n\
         # Shards, one pinned core each (default: every online core):\n\
         # cores = 1\n\
         # Connections over all shards (the relay raises its open-file limit to fit them):\n\
         # max_connections = {max_connections}\n\
         # Connections of one IP address in their TLS or SMP handshake at once:\n\
         # max_handshakes_per_address = {per_address}\n\
         # expire_interval_secs = {expire_interval}\n\
         # tls_timeout_secs = {tls}\n\
         # handshake_timeout_secs = {handshake}\n\
         # slow_reader_close_secs = {slow_reader}\n\
         # GET /metrics over HTTP (the metrics file's text); off when unset.\n\
         # metrics_listen = 127.0.0.1:9090\n\
         # The PostgreSQL store: seconds a statement may run and an operation may wait for a\n\
         # connection before ERR STORE; queue records held in memory besides those in use.\n\
         # db_statement_timeout_secs = {statement_timeout}\n\
         # db_pool_wait_secs = {pool_wait}\n\
         # pg_queue_cache = {queue_cache}\n",
        days = d.message_ttl.as_secs() / 86400,
        inactive_ttl = config::DEFAULT_INACTIVE_TTL.as_secs(),
        inactive_check = config::DEFAULT_INACTIVE_CHECK.as_secs(),
        on_send = if d.expire_on_send { "on" } else { "off" },
        hours = d.notification_ttl.as_secs() / 3600,
        new_queues = if d.new_queues { "on" } else { "off" },
        quota = d.quota,
        max_connections = smp_relay::limits::MAX_CONNECTIONS,
        per_address = c.max_handshakes_per_address,
        expire_interval = d.expire_interval.as_secs(),
        tls = c.tls_timeout.as_secs(),
        handshake = c.handshake_timeout.as_secs(),
        slow_reader = c.slow_reader_close.as_secs(),
        checkpoint = c.journal_checkpoint_records,
        conninfo = c.postgres.conninfo,
        schema = c.postgres.schema,
        pool_size = c.postgres.pool_size,
        statement_timeout = c.postgres.statement_timeout.as_secs(),
        pool_wait = c.postgres.pool_wait.as_secs(),
        queue_cache = c.postgres.queue_cache,
    )
}

fn start(dirs: &Dirs, args: &StartArgs) -> Result<(), String> {
    // Keys, certificates and the configuration file are in the configuration directory.
    let data_dir = dirs.config.as_path();
    let cli = args.settings.options();
    let server_key = data_dir.join(config::SERVER_KEY_FILE);
    let present = init_files_present(data_dir);
    if present == [config::INI_FILE] {
        // A configuration written before any keys: `init` would refuse to overwrite it.
        return Err(format!(
            "{} has {} but no keys, and `smp-relay init` does not overwrite an existing \
             configuration: move {} aside, run `smp-relay init` (or `start` again), then put your \
             settings back into the new file",
            data_dir.display(),
            config::INI_FILE,
            data_dir.join(config::INI_FILE).display()
        ));
    }
    if !server_key.exists() && !present.is_empty() {
        // An identity that lost its key: a new `init` here would refuse (or replace the identity
        // clients know), so the missing file is named instead.
        return Err(format!(
            "{} is missing, but {} holds the rest of an identity ({}); restore server.key from a \
             backup of this directory, or run `smp-relay init` in a fresh --data-dir (a new server \
             address)",
            server_key.display(),
            data_dir.display(),
            present.join(", ")
        ));
    }
    if present.is_empty() && dirs.config != dirs.data {
        // The reference's two directories hold an identity users know: a mistyped configuration
        // directory must not become a new one (a new address) serving the users' store.
        return Err(format!(
            "{} holds no server identity (smp-server.ini, ca.crt, server.crt, server.key, \
             fingerprint): check --config-dir (or SMP_SERVER_CFG_PATH); for a new relay run \
             `smp-relay --config-dir {} --log-dir {} init` first",
            data_dir.display(),
            data_dir.display(),
            dirs.data.display()
        ));
    }
    if present.is_empty() {
        // The README's first command: a fresh checkout runs `start` and gets a working relay.
        eprintln!(
            "smp-relay: {} has no keys yet; initialising it (host 127.0.0.1, no password)",
            data_dir.display()
        );
        let port = cli
            .ports
            .as_ref()
            .and_then(|p| p.first().copied())
            .unwrap_or(config::DEFAULT_PORT);
        init(dirs, "127.0.0.1", port, true, None)?;
    }
    let file = load_ini(data_dir)?;
    if !file.ignored.is_empty() {
        tracing::warn!(
            "{} ignores these keys of features this relay does not have:\n  {}",
            data_dir.join(config::INI_FILE).display(),
            file.ignored.join("\n  ")
        );
    }
    let mut c = StartConfig::new(&dirs.data);
    c.config_dir = dirs.config.clone();
    cli.or(file.options).apply_to(&mut c);
    c.web.information = file.information.clone();
    // The reference's `host` is a comma-separated list; the page announces its first `.onion`.
    c.web.onion_host = file.host.as_deref().and_then(|h| {
        h.split(',')
            .map(str::trim)
            .find(|h| h.ends_with(".onion"))
            .map(String::from)
    });
    #[cfg(feature = "test-kit")]
    args.test.apply(&mut c);
    args.apply_proxy(&mut c.settings.proxy);
    // The address as this start serves it: its first port, the create password in force.
    if let Ok(fp) = fs::read_to_string(data_dir.join(config::FINGERPRINT_FILE)) {
        let password = c
            .settings
            .create_password
            .as_deref()
            .map(String::from_utf8_lossy);
        let host = file.host.as_deref().unwrap_or("127.0.0.1");
        let port = c.ports.first().copied().unwrap_or(config::DEFAULT_PORT);
        let a = address(fp.trim(), password.as_deref(), host, port);
        tracing::info!("server address: {a}");
    }
    smp_relay::server::run(c).map_err(|e| e.to_string())
}

/// The configuration file in `config_dir` (every setting unset when there is no file).
fn load_ini(config_dir: &Path) -> Result<ini::IniConfig, String> {
    Ok(ini::load(&config_dir.join(config::INI_FILE))
        .map_err(|e| e.to_string())?
        .unwrap_or_default())
}

/// What `block`/`unblock` do to a saved queue.
enum Edit {
    Block(BlockingInfo),
    Unblock,
}

/// `block`/`unblock`: find the queue by sender ID, else by link ID, in the store a stopped relay
/// saved, and change its status there (the reference's control-port commands, which need a
/// running server; this relay edits the saved store instead, so the relay must be stopped).
fn offline_edit(dirs: &Dirs, id_text: &str, edit: Edit) -> Result<(), String> {
    let data_dir = dirs.data.as_path();
    let id = hash::b64url_decode(id_text.trim())
        .filter(|id| !id.is_empty())
        .ok_or_else(|| format!("{id_text:?} is not a base64url queue ID (a sender or link ID)"))?;
    if !dirs.config.join(config::SERVER_KEY_FILE).exists() {
        return Err(format!(
            "{} is not an initialised relay's directory; pass the relay's --data-dir (or \
             --config-dir and --log-dir)",
            dirs.config.display()
        ));
    }
    let _lock = lock::lock_data_dir(data_dir).map_err(|e| match e {
        LockError::Held(dir) => format!(
            "the relay is running on {}; stop it first (block and unblock edit the store it saves at a clean stop), or use its control port's block and unblock",
            dir.display()
        ),
        e => e.to_string(),
    })?;
    let settings = offline_settings(data_dir);
    let kind = StoreKind::found_in(data_dir).unwrap_or_default();
    let rec = with_store(kind, false, FindOffline(&settings, &id))?.ok_or_else(|| {
        format!(
            "no queue has the sender ID or link ID {} in the store of {}; check the ID (base64url)",
            hash::b64url(&id),
            data_dir.display()
        )
    })?;
    let rid = hash::b64url(&rec.recipient_id);
    let status = match (&edit, &rec.status) {
        (Edit::Block(info), QueueStatus::Blocked(old)) if old == info => {
            println!("the queue with recipient ID {rid} is already blocked ({}); nothing changed", describe(info));
            return Ok(());
        }
        (Edit::Block(info), _) => QueueStatus::Blocked(info.clone()),
        (Edit::Unblock, QueueStatus::Blocked(_)) => QueueStatus::Active,
        (Edit::Unblock, QueueStatus::Active) => {
            println!("the queue with recipient ID {rid} is not blocked; nothing changed");
            return Ok(());
        }
        (Edit::Unblock, QueueStatus::Off) => {
            return Err(format!(
                "the queue with recipient ID {rid} is not blocked but off (its recipient suspended it); nothing changed"
            ))
        }
    };
    with_store(
        kind,
        false,
        SetStatusOffline(&settings, &rec.sender_id, status),
    )?;
    match (edit, rec.status) {
        (Edit::Block(info), _) => {
            println!(
                "blocked the queue with recipient ID {rid} ({})",
                describe(&info)
            )
        }
        (Edit::Unblock, QueueStatus::Blocked(old)) => println!(
            "unblocked the queue with recipient ID {rid} (it was blocked: {})",
            describe(&old)
        ),
        (Edit::Unblock, _) => {}
    }
    Ok(())
}

/// What the offline tools open: the store a start would open (the memory store's saved files),
/// nothing dropped for its age.
fn offline_settings(data_dir: &Path) -> StoreSettings {
    StoreSettings {
        data_dir: data_dir.to_path_buf(),
        keep: smp_relay::store::Keep::ALL,
        message_ttl_secs: i64::MAX,
        ntf_ttl_secs: i64::MAX,
        test_delay: None,
        // Offline tools sync once, when they close the store.
        durability: smp_relay::store::journal::Durability::Never,
        // No cap: `store import` fills a stopped relay's store, whose own start applies the cap.
        journal_budget: None,
        journal_checkpoint_records: smp_relay::store::journal::DEFAULT_CHECKPOINT_RECORDS,
        // The database the last start used (`postgres-store/connection`).
        postgres: smp_relay::store::postgres::remembered_config(data_dir),
    }
}

/// [`offline_settings`] with the PostgreSQL database and schema a command names.
fn offline_settings_with(
    data_dir: &Path,
    database: Option<String>,
    schema: Option<String>,
) -> StoreSettings {
    let mut s = offline_settings(data_dir);
    if database.is_some() || schema.is_some() {
        let mut pg = s.postgres.take().unwrap_or_default();
        if let Some(d) = database {
            pg.conninfo = d;
        }
        if let Some(n) = schema {
            pg.schema = n;
        }
        s.postgres = Some(pg);
    }
    s
}

/// The data directory's lock, as `start` takes it, for an offline tool (`what` it does).
fn lock_stopped(data_dir: &Path, what: &str) -> Result<lock::DataDirLock, String> {
    lock::lock_data_dir(data_dir).map_err(|e| match e {
        LockError::Held(dir) => format!(
            "a relay is running on {}; stop it first ({what})",
            dir.display()
        ),
        e => e.to_string(),
    })
}

/// Progress on stderr while a transfer runs: only when stderr is a terminal and not `--quiet`, at
/// most every 200 ms.
struct Progress {
    on: bool,
    verb: &'static str,
    last: std::time::Instant,
    shown: bool,
}

impl Progress {
    fn new(quiet: bool, verb: &'static str) -> Self {
        use std::io::IsTerminal;
        Progress {
            on: !quiet && std::io::stderr().is_terminal(),
            verb,
            last: std::time::Instant::now(),
            shown: false,
        }
    }

    fn update(&mut self, c: transfer::Counts) {
        if self.on && self.last.elapsed() >= Duration::from_millis(200) {
            self.last = std::time::Instant::now();
            self.shown = true;
            eprint!("\r{} {c}   ", self.verb);
        }
    }

    /// Ends the progress line, if one was shown.
    fn done(&self) {
        if self.shown {
            eprintln!();
        }
    }
}

/// `store export`: every queue of the stopped relay's store to `output` (`-`: stdout). A file is
/// written as `FILE.partial` and renamed once complete, so a failed export leaves no `FILE`.
fn store_export(
    settings: &StoreSettings,
    kind: StoreKind,
    output: &Path,
    quiet: bool,
) -> Result<(), String> {
    use std::io::IsTerminal;
    let data_dir = settings.data_dir.as_path();
    if !data_dir.is_dir() {
        return Err(format!(
            "{} does not exist; pass the relay's --data-dir",
            data_dir.display()
        ));
    }
    let to_stdout = output == Path::new("-");
    if to_stdout && std::io::stdout().is_terminal() {
        return Err(
            "refusing to write the binary export to a terminal: pass --output FILE or redirect stdout"
                .into(),
        );
    }
    let _lock = lock_stopped(data_dir, "export reads the store it saves at a clean stop")?;
    let mut progress = Progress::new(quiet, "exported");
    let (counts, bytes) = if to_stdout {
        let out = std::io::BufWriter::new(std::io::stdout().lock());
        let (c, b, _) = with_store(kind, false, Export(settings, kind, out, &mut progress))?;
        (c, b)
    } else {
        let partial = with_suffix(output, ".partial");
        let file = fs::File::create(&partial)
            .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
        let written = with_store(
            kind,
            false,
            Export(settings, kind, std::io::BufWriter::new(file), &mut progress),
        )
        .and_then(|(c, b, out)| {
            let file = out
                .into_inner()
                .map_err(|e| format!("cannot write {}: {}", partial.display(), e.error()))?;
            file.sync_all()
                .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
            fs::rename(&partial, output).map_err(|e| {
                format!(
                    "cannot rename {} to {}: {e}",
                    partial.display(),
                    output.display()
                )
            })?;
            Ok((c, b))
        });
        if written.is_err() {
            let _ = fs::remove_file(&partial);
        }
        written?
    };
    progress.done();
    if !quiet {
        eprintln!(
            "smp-relay: exported {counts} ({bytes} bytes) from the {} store of {}",
            kind.name(),
            data_dir.display()
        );
    }
    Ok(())
}

/// `store import`: the stream from `input` (`-`: stdin) into the empty store of `data_dir`.
fn store_import(
    settings: &StoreSettings,
    kind: StoreKind,
    input: &Path,
    quiet: bool,
) -> Result<(), String> {
    use std::io::IsTerminal;
    let data_dir = settings.data_dir.as_path();
    let from_stdin = input == Path::new("-");
    if from_stdin && std::io::stdin().is_terminal() {
        return Err(
            "refusing to read the export from a terminal: pass --input FILE or redirect stdin"
                .into(),
        );
    }
    let input: Box<dyn std::io::Read> = if from_stdin {
        Box::new(std::io::BufReader::new(std::io::stdin().lock()))
    } else {
        let f =
            fs::File::open(input).map_err(|e| format!("cannot open {}: {e}", input.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    smp_relay::store::create_private_dir(data_dir)
        .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
    let reader = transfer::StreamReader::new(input).map_err(|e| e.to_string())?;
    let _lock = lock_stopped(data_dir, "import writes the store it opens at start")?;
    let mut progress = Progress::new(quiet, "imported");
    let report = with_store(kind, false, Import(settings, kind, reader, &mut progress));
    progress.done();
    let report = report?;
    if !quiet {
        eprintln!(
            "smp-relay: imported into the {} store of {}: read {}; written {}; the stream's trailer records {}",
            kind.name(),
            data_dir.display(),
            report.read,
            report.written,
            report.trailer
        );
    }
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// Opens every group of the stopped relay's store and its services, and writes them to the
/// stream.
struct Export<'a, W>(&'a StoreSettings, StoreKind, W, &'a mut Progress);

impl<W: std::io::Write> WithStore for Export<'_, W> {
    type Output = Result<(transfer::Counts, u64, W), String>;
    fn run<S: ShardStore>(self) -> Self::Output {
        let Export(settings, kind, out, progress) = self;
        let store = S::open_offline(settings)?;
        let services = Services::new(kind, settings);
        services.load()?;
        let services = services.all();
        block_on(transfer::export(&store, &services, out, &mut |c| {
            progress.update(c)
        }))
        .map_err(|e| e.to_string())
        // The store is dropped without `close`: an export changes nothing.
    }
}

/// Opens every group of the stopped relay's store, checks that it and its services are empty,
/// restores the stream into them and closes the store (the memory store: saves it). A failed
/// import is closed empty.
struct Import<'a, Src>(&'a StoreSettings, StoreKind, Src, &'a mut Progress);

impl<Src: transfer::QueueSource> WithStore for Import<'_, Src> {
    type Output = Result<transfer::ImportReport, String>;
    fn run<S: ShardStore>(self) -> Self::Output {
        let Import(settings, kind, mut source, progress) = self;
        let store = S::open_offline(settings)?;
        let held = block_on(transfer::store_counts(&store)).map_err(|e| e.to_string())?;
        // The services file is shared by the memory and journal stores of a data directory, so a
        // move between them in place finds the stream's services already there (`Registry`).
        let services = Services::new(kind, settings);
        let known = services.load()?;
        if held != transfer::Counts::default() {
            return Err(format!(
                "the store of {} already holds {held}; import writes only into an empty store: choose another --data-dir, or move that store aside",
                settings.data_dir.display()
            ));
        }
        let imported = block_on(transfer::import_from(
            &store,
            &mut source,
            &mut Registry(&services, known == 0),
            &mut |c| progress.update(c),
        ));
        // Closed either way: a failed import has deleted what it restored, and a store that wrote
        // as it went must make that durable too.
        let closed = store.close(settings, &all_groups());
        match (imported, closed) {
            (Ok(report), Ok(())) => Ok(report),
            (Ok(_), Err(e)) => Err(format!(
                "the stream was read, but saving the store of {} failed: {e}; it may hold part of the import: remove that store before importing again",
                settings.data_dir.display()
            )),
            (Err(e), Ok(())) => Err(format!(
                "{e}; nothing was imported (the store of {} is empty)",
                settings.data_dir.display()
            )),
            (Err(e), Err(c)) => Err(format!("{e}; and closing the store failed: {c}")),
        }
    }
}

/// The relay's services as an import fills them: each keeps its ID, so that its queues'
/// associations stay its own; one already known (the same certificate) must have that ID. The
/// flag: the registry was empty before, so a failed import empties it again.
struct Registry<'a>(&'a Services, bool);

impl transfer::ServiceSink for Registry<'_> {
    fn register(&mut self, recs: &[ServiceRec]) -> Result<(), String> {
        for rec in recs {
            let id = self
                .0
                .get_or_create(rec.clone())
                .map_err(|e| e.to_string())?;
            if id != rec.service_id {
                return Err(format!(
                    "the service {} is known here with the ID {}: import into a data directory \
                     without its services file",
                    hash::b64url(&rec.service_id),
                    hash::b64url(&id)
                ));
            }
        }
        Ok(())
    }

    fn undo(&mut self) {
        if !self.1 {
            return;
        }
        if let Err(e) = self.0.clear() {
            eprintln!("smp-relay: the imported services could not be removed again: {e}");
        }
    }
}

fn describe(info: &BlockingInfo) -> String {
    let mut out = Vec::new();
    info.encode(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The record of the queue with this sender or link ID in a stopped relay's store.
struct FindOffline<'a>(&'a StoreSettings, &'a [u8]);

impl WithStore for FindOffline<'_> {
    type Output = Result<Option<QueueRec>, String>;
    fn run<S: ShardStore>(self) -> Self::Output {
        S::find_offline(self.0, self.1)
    }
}

/// Sets a queue's status in a stopped relay's store.
struct SetStatusOffline<'a>(&'a StoreSettings, &'a [u8], QueueStatus);

impl WithStore for SetStatusOffline<'_> {
    type Output = Result<(), String>;
    fn run<S: ShardStore>(self) -> Self::Output {
        S::set_status_offline(self.0, self.1, self.2)
    }
}

/// Longest block notice accepted, compacted: it travels inside an `ERR BLOCKED` response.
const MAX_NOTICE_BYTES: usize = 1024;
/// Nesting accepted in a notice.
const MAX_JSON_DEPTH: usize = 16;

/// Checks that `text` is one JSON object (RFC 8259, checked by `serde_json`) and returns it without
/// the whitespace between tokens, every token as written (the reference re-encodes the notice it
/// parsed, which gives the same compact form).
fn compact_json_object(text: &str) -> Result<String, String> {
    if !text.trim_start_matches(JSON_WS).starts_with('{') {
        return Err(format!(
            "--notice must be a JSON object, e.g. '{{\"ttl\":3600}}'; got {text:?}"
        ));
    }
    serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| format!("--notice is not valid JSON: {e}"))?;
    let out = strip_json_whitespace(text)?;
    if out.len() > MAX_NOTICE_BYTES {
        return Err(format!(
            "--notice is {} bytes; at most {MAX_NOTICE_BYTES} are accepted",
            out.len()
        ));
    }
    Ok(out)
}

/// The whitespace RFC 8259 allows between tokens.
const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// `json`, already checked, without the whitespace outside its strings; refuses containers nested
/// more than `MAX_JSON_DEPTH` levels below the top-level object.
fn strip_json_whitespace(json: &str) -> Result<String, String> {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped, mut depth) = (false, false, 0usize);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            c if JSON_WS.contains(&c) => continue,
            '"' => in_string = true,
            '{' | '[' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH + 1 {
                    return Err(format!(
                        "--notice is not valid JSON: nested deeper than {MAX_JSON_DEPTH}"
                    ));
                }
            }
            '}' | ']' => depth -= 1,
            _ => {}
        }
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directories_come_from_options_then_data_dir_then_the_environment() {
        let dirs = |args: &[&str], env: &[(&str, &str)]| {
            let cli =
                Cli::try_parse_from(["smp-relay"].iter().chain(args).chain(&["address"])).unwrap();
            let d = Dirs::resolve(&cli, |v| {
                env.iter()
                    .find(|(k, _)| *k == v)
                    .map(|(_, x)| x.to_string())
            });
            (d.config, d.data)
        };
        let p = PathBuf::from;
        let env = [
            (CFG_PATH_ENV, "/etc/opt/simplex"),
            (LOG_PATH_ENV, "/var/opt/simplex"),
        ];
        assert_eq!(dirs(&[], &[]), (p("./smp-data"), p("./smp-data")));
        assert_eq!(
            dirs(&[], &env),
            (p("/etc/opt/simplex"), p("/var/opt/simplex"))
        );
        assert_eq!(dirs(&["--data-dir", "/d"], &env), (p("/d"), p("/d")));
        assert_eq!(
            dirs(&["--config-dir", "/c", "--log-dir", "/l"], &[]),
            (p("/c"), p("/l"))
        );
        assert_eq!(
            dirs(&["--data-dir", "/d", "--config-dir", "/c"], &env),
            (p("/c"), p("/d"))
        );
        // An empty variable is not a directory.
        assert_eq!(
            dirs(&[], &[(CFG_PATH_ENV, ""), (LOG_PATH_ENV, "/l")]),
            (p("./smp-data"), p("/l"))
        );
    }

    #[test]
    fn notices_are_json_objects_made_compact() {
        assert_eq!(
            compact_json_object("{\"ttl\":3600}"),
            Ok("{\"ttl\":3600}".to_string())
        );
        assert_eq!(
            compact_json_object(
                " { \"ttl\" : 3600 , \"a\": [1, -2.5e3, true, null, \"x y\\n\\u00e9\"] } "
            ),
            Ok("{\"ttl\":3600,\"a\":[1,-2.5e3,true,null,\"x y\\n\\u00e9\"]}".to_string())
        );
        assert_eq!(compact_json_object("{}"), Ok("{}".to_string()));
        assert_eq!(
            compact_json_object("{\"é\":\"ü\"}"),
            Ok("{\"é\":\"ü\"}".to_string())
        );
        for bad in [
            "",
            "3600",
            "[1]",
            "{ttl:3600}",
            "{\"ttl\":3600",
            "{\"ttl\":3600}}",
            "{\"ttl\":01}",
            "{\"ttl\":1.}",
            "{\"ttl\":tru}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\t\"}",
            "{\"a\":1,}",
            "{\"a\" 1}",
        ] {
            assert!(compact_json_object(bad).is_err(), "{bad:?} accepted");
        }
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(40), "]".repeat(40));
        assert!(compact_json_object(&deep).is_err());
        let nested = |n: usize| format!("{{\"a\":{}1{}}}", "[".repeat(n), "]".repeat(n));
        assert!(compact_json_object(&nested(MAX_JSON_DEPTH)).is_ok());
        let e = compact_json_object(&nested(MAX_JSON_DEPTH + 1)).unwrap_err();
        assert!(e.contains("nested deeper than 16"), "{e}");
        // Brackets and whitespace inside strings are kept as written.
        assert_eq!(
            compact_json_object("{\"a\": \" [{ \\\" \"}"),
            Ok("{\"a\":\" [{ \\\" \"}".to_string())
        );
        let e = compact_json_object("{\"ttl\":01}").unwrap_err();
        assert!(e.starts_with("--notice is not valid JSON: "), "{e}");
        let long = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_NOTICE_BYTES));
        assert!(compact_json_object(&long).is_err());
    }

    /// The file `init` writes names every key the relay applies, in its section (set, or
    /// commented with its default or an example), so that an operator finds each one there.
    #[test]
    fn the_template_names_every_key_the_relay_takes() {
        let text = ini_template("smp.example.com", 5223, None);
        let mut section = String::new();
        let mut named = Vec::new();
        for line in text.lines() {
            if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                section = s.to_string();
            }
            let setting = line.strip_prefix("# ").unwrap_or(line);
            if let Some((key, _)) = setting.split_once(" = ") {
                named.push((section.clone(), key.to_string()));
            }
        }
        let missing: Vec<String> = ini::applied_keys()
            .into_iter()
            .filter(|(s, k)| !named.iter().any(|(ns, nk)| ns == s && nk == k))
            .map(|(s, k)| format!("[{s}] {k}"))
            .collect();
        assert!(missing.is_empty(), "not in init's template: {missing:?}");
    }

    #[test]
    fn the_template_parses_and_sets_what_init_chose() {
        let text = ini_template("smp.example.com", 7001, Some("pw"));
        let c = ini::parse(Path::new("smp-server.ini"), &text).expect("template parses");
        assert_eq!(c.host.as_deref(), Some("smp.example.com"));
        assert_eq!(c.options.ports, Some(vec![7001]));
        assert_eq!(c.options.create_password, Some(b"pw".to_vec()));
        let d = config::Settings::default();
        assert_eq!(c.options.message_ttl, Some(d.message_ttl));
        assert_eq!(c.options.notification_ttl, Some(d.notification_ttl));
        assert_eq!(c.options.expire_on_send, Some(d.expire_on_send));
        assert_eq!(c.options.new_queues, Some(d.new_queues));
        assert_eq!(c.options.quota, None);
        assert_eq!(c.options.metrics_interval, None);
        // Uncommenting the commented defaults gives a valid file too.
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                // The control port's passwords are left for the operator to fill in.
                Some(rest)
                    if rest.contains(" = ") && !rest.contains('<') && !rest.ends_with("= ") =>
                {
                    format!("{rest}\n")
                }
                _ => format!("{l}\n"),
            })
            .collect();
        let c = ini::parse(Path::new("smp-server.ini"), &uncommented).expect("uncommented parses");
        assert_eq!(c.options.quota, Some(d.quota));
        assert_eq!(c.options.journal_max_size, Some(4 << 30));
        assert_eq!(c.options.control_port, Some(5224));
        assert_eq!(c.options.daily_block_queue_quota, Some(20));
        let on = with_control_port(&text, 7002, "adm", "usr");
        let c = ini::parse(Path::new("smp-server.ini"), &on).expect("with the control port");
        assert_eq!(c.options.control_port, Some(7002));
        assert_eq!(c.options.control_port_admin_password, Some(b"adm".to_vec()));
        assert_eq!(c.options.control_port_user_password, Some(b"usr".to_vec()));
        let no_password = ini_template("h", 1, None);
        let c = ini::parse(Path::new("smp-server.ini"), &no_password).expect("parses");
        assert_eq!(c.options.create_password, None);
    }
}
