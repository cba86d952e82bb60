//! `smp-load`: creates queues once (`setup`, optionally with messages in them), then runs the
//! subscription scenarios (storm, individual, displace, idle) against a relay it starts as a child
//! process (or one already running), times the relay's start on a store (`restart-time`), or
//! measures every client reconnecting at once after a restart (`reconnect`), and
//! prints a table, and with `--json` one JSON record per run plus the median, min and max per
//! configuration. See `benches/README.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use smp_relay::load::creds::{self, QueueCreds};
use smp_relay::load::floor::Floor;
use smp_relay::load::proc::{self, RelayProc, RelaySpec, TempDir};
use smp_relay::load::report::{self, RunRecord};
use smp_relay::load::scenario::{self, LoadParams, RunSpec, Shape, Target};

#[derive(Parser)]
#[command(
    name = "smp-load",
    about = "Load generator and scenario benchmarks for smp-relay"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create queues once (NEW in full blocks, then KEY with a sender key), optionally put
    /// messages in them, and save their keys to --file. Without --relay-addr it starts a relay on
    /// a fresh --data-dir (default <file>.relay) and stops it cleanly, so the relay's store keeps
    /// the queues for later runs.
    Setup(SetupArgs),
    /// Starts the relay on a data directory --runs times and times each start from the command
    /// to its `listening` line (the store loaded), then stops it cleanly (SIGTERM).
    RestartTime(RestartArgs),
    /// N queues subscribed at once from K connections while senders send and recipients ACK.
    Storm(MsgArgs),
    /// One connection subscribes the queues alone (default 10,000, prefilled).
    Individual(MsgArgs),
    /// Set A subscribes all queues, then set B subscribes them while A stays connected.
    Displace(MsgArgs),
    /// C connections that handshake and stay idle: relay RssAnon per connection, idle CPU.
    Idle(IdleArgs),
    /// C connections, each subscribed to K queues (one in --waiting-every holding a message),
    /// lose the relay to a restart (SIGTERM or SIGKILL) and all reconnect and resubscribe at once
    /// from its `listening` line: times to every SUB answered and every message delivered, relay
    /// CPU against the floor, peak RssAnon, refused and retried connects. Journal store only.
    Reconnect(ReconnectArgs),
    /// Makes a data directory with the queues of a `setup` file and --queues idle ones after
    /// them, through `smp-relay store export` and `store import` (so millions take minutes); then
    /// `restart-time --data-dir` and `storm --file --data-dir` measure the relay on it.
    Scale(ScaleArgs),
    /// One messaging service with --queues queues associated (by SUBs from its connection),
    /// --messages of them holding a message: each run, a new connection of the service sends one
    /// SUBS; times to SOKS and to ALLS (every held message delivered once), relay CPU and memory.
    /// One relay for all runs.
    ServiceSubs(ServiceSubsArgs),
    /// The crypto floor, measured in-process (the criterion benchmark measures it properly).
    Floor,
    /// Makes (if missing) and starts a PostgreSQL cluster in --dir for `--pg` runs; it runs until
    /// `pg-stop`.
    PgStart {
        #[arg(long)]
        dir: PathBuf,
        /// A `postgresql.conf` line for a new cluster (repeat for several).
        #[arg(long)]
        conf: Vec<String>,
    },
    /// Stops the cluster `pg-start` started in --dir.
    PgStop {
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(Args, Clone)]
struct RelayArgs {
    /// Relay data directory made by `setup` (default: <file>.relay); each run uses a copy.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The smp-relay binary (default: next to smp-load).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Shards of the relay (its --cores; default: the number of --relay-cores, or every core).
    #[arg(long)]
    relay_shards: Option<usize>,
    /// Pin the relay to these CPUs (taskset list, e.g. 0 or 0,1).
    #[arg(long)]
    relay_cores: Option<String>,
    /// Pin the generator to these CPUs (comma-separated).
    #[arg(long, value_delimiter = ',')]
    gen_cores: Vec<usize>,
    /// Use a running relay at this address instead of starting one.
    #[arg(long, requires = "key_hash")]
    relay_addr: Option<SocketAddr>,
    /// The running relay's key hash (its `fingerprint`, base64url).
    #[arg(long)]
    key_hash: Option<String>,
    /// The running relay's process id, for CPU and memory figures.
    #[arg(long)]
    relay_pid: Option<u32>,
    /// An extra argument for `smp-relay start` (repeat for several), e.g. --relay-arg=--quota=256.
    #[arg(long, allow_hyphen_values = true)]
    relay_arg: Vec<String>,
    /// Run the relay on the PostgreSQL store, in the cluster `pg-start` made in this directory:
    /// `setup` fills a database of its own, each run works on a copy of it, and the cluster's CPU
    /// counts as the relay's.
    #[arg(long, value_name = "DIR")]
    pg: Option<PathBuf>,
}

impl RelayArgs {
    fn spec(&self) -> RelaySpec {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let shards = self
            .relay_shards
            .unwrap_or_else(|| self.relay_cores.as_deref().map(count_cpus).unwrap_or(cores));
        RelaySpec {
            bin: self
                .relay_bin
                .clone()
                .unwrap_or_else(RelaySpec::default_bin),
            shards,
            cpus: self.relay_cores.clone(),
            extra_args: self.relay_arg.clone(),
        }
    }

    fn external(&self) -> Result<Option<Target>, String> {
        match (&self.relay_addr, &self.key_hash) {
            (Some(addr), Some(kh)) => Ok(Some(Target {
                addr: *addr,
                key_hash: proc::decode_key_hash(kh)?,
                pid: self.relay_pid,
                db_pid: None,
                db_conninfo: None,
            })),
            _ => Ok(None),
        }
    }
}

fn count_cpus(list: &str) -> usize {
    list.split(',')
        .map(|p| match p.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().unwrap_or(0), b.parse().unwrap_or(0));
                b.saturating_sub(a) + 1
            }
            None => 1,
        })
        .sum::<usize>()
        .max(1)
}

#[derive(Args)]
struct SetupArgs {
    #[arg(long)]
    queues: usize,
    /// Where to save the queues' keys.
    #[arg(long)]
    file: PathBuf,
    /// Connections creating queues at once.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Replace an existing --file and data directory.
    #[arg(long)]
    force: bool,
    /// Messages SENT to every queue after it is created (not received: they stay in the store).
    #[arg(long, default_value_t = 0)]
    messages_per_queue: usize,
    /// Body bytes of each of those messages (at most 16048).
    #[arg(long, default_value_t = 100)]
    message_size: usize,
    #[command(flatten)]
    relay: RelayArgs,
}

#[derive(Args)]
struct RestartArgs {
    /// The queue file of `setup`, whose data directory is <file>.relay (or give --data-dir).
    #[arg(long)]
    file: Option<PathBuf>,
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Before each start, drop the data directory's files from the page cache
    /// (posix_fadvise DONTNEED, those files only), so that the start reads them from the disk.
    #[arg(long)]
    cold: bool,
    /// Before each timed start, start the relay and SIGKILL it once it is listening, so that
    /// the timed start is a start after a crash (the directory is left cleanly stopped again by
    /// the timed run).
    #[arg(long)]
    after_kill: bool,
    /// JSON records on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    /// The relay's data directory; starts on it as it is (not a copy).
    #[command(flatten)]
    relay: RelayArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Prefill {
    Yes,
    No,
    Both,
}

#[derive(Args)]
struct MsgArgs {
    /// The queue file made by `setup`.
    #[arg(long)]
    file: PathBuf,
    /// Queues to use, the first of the file (default: storm and displace 50,000; individual 10,000).
    #[arg(long)]
    queues: Option<usize>,
    /// Subscribing connections, a list to alternate (default: 8,32; individual: 1).
    #[arg(long, value_delimiter = ',')]
    conns: Vec<usize>,
    /// One message in each queue before the clock starts: yes, no, or both alternated.
    #[arg(long, value_enum, default_value = "yes")]
    prefill: Prefill,
    /// Sender groups (each of --threads connections); 0 for none.
    #[arg(long, default_value_t = 4)]
    senders: usize,
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Blocks a recipient connection keeps in flight.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Body bytes per SEND (16048, the largest a v11+ relay accepts).
    #[arg(long, default_value_t = 16048)]
    msg_bytes: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// JSON records on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    /// Bound on one run, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    /// A shell command started at the release of each run with RELAY_PID set, and stopped with
    /// SIGINT when the run's measurement ends: profiles exactly the measured interval, e.g.
    /// `--profile 'perf record -F 999 -g -o /tmp/storm.perf -p $RELAY_PID'`.
    #[arg(long)]
    profile: Option<String>,
    /// Every subscribing connection is a messaging service with a certificate of its own, so each
    /// SUB moves its queue to that service (the service-association storm).
    #[arg(long)]
    services: bool,
    #[command(flatten)]
    relay: RelayArgs,
}

#[derive(Args)]
struct ServiceSubsArgs {
    /// The queue file made by `setup`.
    #[arg(long)]
    file: PathBuf,
    /// Queues associated with the service, the first of the file.
    #[arg(long, default_value_t = 100_000)]
    queues: usize,
    /// Of them, queues holding one message when the SUBS comes (spread evenly).
    #[arg(long, default_value_t = 1_000)]
    messages: usize,
    /// Body bytes of each held message.
    #[arg(long, default_value_t = 100)]
    msg_bytes: usize,
    /// SUBS runs, each from a new connection of the service.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Bound on each wait for the relay.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    #[arg(long)]
    json: bool,
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    relay: RelayArgs,
}

#[derive(Args)]
struct ScaleArgs {
    /// The queue file of `setup`; its data directory (<file>.relay) is read, not changed.
    #[arg(long)]
    file: PathBuf,
    /// Idle queues to add (plain messaging queues: recipient and sender keys, no notifier, no
    /// short-link data).
    #[arg(long)]
    queues: u64,
    /// The data directory to make (default: <file>.scale-<queues>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The store to fill (default: the kind the setup's data directory holds).
    #[arg(long, value_parser = ["journal", "memory"])]
    store: Option<String>,
    /// Replace an existing --out.
    #[arg(long)]
    force: bool,
    /// Every idle queue has a notifier.
    #[arg(long)]
    notifiers: bool,
    /// Every idle queue has short-link data (256 bytes each of fixed and user data).
    #[arg(long)]
    links: bool,
    /// The smp-relay binary (default: next to smp-load).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// The cluster of `pg-start`, for a setup made with `--pg`: the idle queues go into a copy of
    /// its database (`smpload_scale_<queues>`), which the new data directory names.
    #[arg(long, value_name = "DIR")]
    pg: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum RestartArg {
    Clean,
    Kill,
    Both,
}

#[derive(Args)]
struct ReconnectArgs {
    /// The queue file made by `setup` (its data directory, <file>.relay, on the journal store).
    #[arg(long)]
    file: PathBuf,
    /// Connections that reconnect at once.
    #[arg(long, default_value_t = 10_000)]
    conns: usize,
    /// Queues each connection subscribes (the first conns × this of the file).
    #[arg(long, default_value_t = 30)]
    queues_per_conn: usize,
    /// How the relay goes down: clean (SIGTERM, its exit waited for), kill (SIGKILL), or both
    /// alternated run by run.
    #[arg(long, value_enum, default_value = "both")]
    restart: RestartArg,
    /// One queue in this many holds a waiting message at the restart (0: none).
    #[arg(long, default_value_t = 10)]
    waiting_every: usize,
    /// Body bytes of each waiting message (16048, the largest a v11+ relay accepts, as the
    /// message scenarios send).
    #[arg(long, default_value_t = 16048)]
    msg_bytes: usize,
    /// SUB blocks a connection keeps in flight.
    #[arg(long, default_value_t = 4)]
    window: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// JSON records on stdout (the table goes to stderr).
    #[arg(long)]
    json: bool,
    /// Bound on each phase of a run (subscribing before the restart; the reconnect), in seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    relay: RelayArgs,
}

#[derive(Args)]
struct IdleArgs {
    #[arg(long, default_value_t = 10_000)]
    conns: usize,
    /// Threads opening connections.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Seconds of idle CPU measurement, without and with the connections.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    json: bool,
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    relay: RelayArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smp-load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn prepare(relay: &RelayArgs) -> Result<(), String> {
    if !relay.gen_cores.is_empty() {
        proc::pin_self(&relay.gen_cores)?;
    }
    proc::raise_nofile();
    Ok(())
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Cmd::Setup(a) => {
            prepare(&a.relay)?;
            setup(a)
        }
        Cmd::RestartTime(a) => restart_time(a),
        Cmd::Storm(a) => messages("storm", Shape::Storm, a, 50_000, &[8, 32]),
        Cmd::Individual(a) => messages("individual", Shape::Storm, a, 10_000, &[1]),
        Cmd::Displace(a) => messages("displace", Shape::Displace, a, 50_000, &[8, 32]),
        Cmd::Idle(a) => idle(a),
        Cmd::Reconnect(a) => reconnect(a),
        Cmd::Scale(a) => scale(a),
        Cmd::ServiceSubs(a) => service_subs(a),
        Cmd::Floor => {
            print_floor(&Floor::measure(), &mut std::io::stdout());
            Ok(())
        }
        Cmd::PgStart { dir, conf } => {
            use smp_relay::store::postgres::cluster;
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let base =
                cluster::start_detached(&dir, &cluster::ClusterOptions { conf, tcp: false })?;
            eprintln!("pg-start: {base}");
            Ok(())
        }
        Cmd::PgStop { dir } => smp_relay::store::postgres::cluster::stop_detached(&dir),
    }
}

/// The database `setup --pg` fills for the queue file `file`.
fn setup_database_name(file: &Path) -> String {
    let stem: String = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("queues")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("smpload_{stem}")
}

/// Creates database `name` in the cluster of `pg` (dropping one of that name first), from
/// `template` or the cluster's template; returns its connection string.
fn pg_database(pg: &Path, name: &str, template: Option<&str>) -> Result<String, String> {
    use smp_relay::store::postgres::cluster;
    let (base, _) = cluster::detached(pg)?;
    let mut c = postgres::Client::connect(&format!("{base} dbname=postgres"), postgres::NoTls)
        .map_err(|e| format!("{}: {e}", pg.display()))?;
    // One statement each: CREATE DATABASE cannot share a transaction.
    c.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .and_then(|_| {
            c.batch_execute(&format!(
                "CREATE DATABASE {name} TEMPLATE {}",
                template.unwrap_or(cluster::TEMPLATE_DB)
            ))
        })
        .map_err(|e| {
            format!(
                "create database {name}: {}",
                smp_relay::store::postgres::pool::describe(&e)
            )
        })?;
    Ok(format!("{base} dbname={name}"))
}

/// The database `setup --pg` filled for the data directory `dir` (the one its relay last started
/// on): its name, and its settings.
fn setup_database(dir: &Path) -> Result<(String, smp_relay::store::postgres::PgConfig), String> {
    let config = smp_relay::store::postgres::remembered_config(dir).ok_or_else(|| {
        format!(
            "--pg: {} names no database (make it with `setup --pg`)",
            dir.display()
        )
    })?;
    let name = config
        .conninfo
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("dbname="))
        .ok_or_else(|| format!("--pg: the database of {} has no name", dir.display()))?
        .to_string();
    Ok((name, config))
}

/// Drops a run's database copy when the run is over.
struct RunDatabase {
    pg: PathBuf,
    name: String,
    /// Where the relay reads and writes it (the WAL position is sampled through it).
    conninfo: String,
}

impl Drop for RunDatabase {
    fn drop(&mut self) {
        if let Ok((base, _)) = smp_relay::store::postgres::cluster::detached(&self.pg) {
            if let Ok(mut c) =
                postgres::Client::connect(&format!("{base} dbname=postgres"), postgres::NoTls)
            {
                let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {}", self.name));
            }
        }
    }
}

fn default_data_dir(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(".relay");
    PathBuf::from(s)
}

fn setup(a: SetupArgs) -> Result<(), String> {
    if a.file.exists() && !a.force {
        return Err(format!(
            "{} exists (use --force to replace it and its data directory)",
            a.file.display()
        ));
    }
    if a.message_size > smp_relay::protocol::version::max_message_length(u16::MAX) {
        return Err(format!("--message-size {} is over 16048", a.message_size));
    }
    let make = |addr, key_hash| -> Result<Vec<QueueCreds>, String> {
        let qs = creds::create_parallel(addr, key_hash, a.queues, a.threads).map_err(|e| e.0)?;
        if a.messages_per_queue == 0 {
            return Ok(qs);
        }
        let qs = Arc::new(qs);
        creds::fill_parallel(
            addr,
            key_hash,
            &qs,
            a.messages_per_queue,
            a.message_size,
            a.threads,
        )
        .map_err(|e| e.0)?;
        Ok(Arc::try_unwrap(qs).unwrap_or_else(|qs| qs.to_vec()))
    };
    let qs = if let Some(t) = a.relay.external()? {
        make(t.addr, t.key_hash)?
    } else {
        let dir = a
            .relay
            .data_dir
            .clone()
            .unwrap_or_else(|| default_data_dir(&a.file));
        if dir.exists() {
            if !a.force {
                return Err(format!("{} exists (use --force)", dir.display()));
            }
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut spec = a.relay.spec();
        if let Some(pg) = &a.relay.pg {
            let name = setup_database_name(&a.file);
            let conninfo = pg_database(pg, &name, None)?;
            spec.extra_args.extend([
                "--store".into(),
                "postgres".into(),
                "--database".into(),
                conninfo,
            ]);
        }
        spec.init(&dir)?;
        let relay = spec.start(&dir)?;
        let qs = make(relay.addr, relay.key_hash)
            .map_err(|e| format!("{e}\nrelay log:\n{}", relay.log_tail()))?;
        eprintln!(
            "setup: stopping the relay (it saves the queues in {})",
            dir.display()
        );
        relay.stop_clean()?;
        qs
    };
    creds::save(&a.file, &qs).map_err(|e| e.0)?;
    eprintln!("setup: {} queues saved to {}", qs.len(), a.file.display());
    Ok(())
}

fn scale(a: ScaleArgs) -> Result<(), String> {
    use smp_relay::store::StoreKind;
    let from = default_data_dir(&a.file);
    let found = StoreKind::found_in(&from)
        .ok_or_else(|| format!("{} holds no store: run `setup` first", from.display()))?;
    let kind = match a.store.as_deref() {
        Some("memory") => StoreKind::Memory,
        Some(_) => StoreKind::Journal,
        None => found,
    };
    let out = a.out.clone().unwrap_or_else(|| {
        let mut s = a.file.as_os_str().to_owned();
        s.push(format!(".scale-{}", a.queues));
        PathBuf::from(s)
    });
    if out.exists() {
        if !a.force {
            return Err(format!("{} exists (use --force)", out.display()));
        }
        std::fs::remove_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    if found == StoreKind::Postgres {
        return scale_postgres(&a, &from, &out);
    }
    if kind == StoreKind::Postgres || a.pg.is_some() {
        return Err("--pg needs a setup made with --pg".into());
    }
    // The relay's certificates, configuration and services file, without the store.
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for entry in std::fs::read_dir(&from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        let is_store = ["journal", "memory", "postgres", "lock"]
            .iter()
            .any(|s| name == *s);
        if is_store || entry.file_type().map(|t| t.is_dir()).unwrap_or(true) {
            continue;
        }
        std::fs::copy(entry.path(), out.join(&name)).map_err(|e| e.to_string())?;
    }
    // The relay starts on the store it was filled into.
    let ini = out.join("smp-server.ini");
    if let Ok(text) = std::fs::read_to_string(&ini) {
        let text: String = text
            .lines()
            .map(|l| match l.trim_start().starts_with("store_messages") {
                true => format!("store_messages = {}\n", kind.name()),
                false => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&ini, text).map_err(|e| format!("{}: {e}", ini.display()))?;
    }
    let bin = a.relay_bin.clone().unwrap_or_else(RelaySpec::default_bin);
    let t0 = std::time::Instant::now();
    let extras = smp_relay::load::scale::Extras {
        notifier: a.notifiers,
        link: a.links,
    };
    let filled =
        smp_relay::load::scale::fill(&bin, &from, &out, kind, a.queues, extras, &mut |n| {
            eprintln!(
                "scale: {n} idle queues written ({:.0} s)",
                t0.elapsed().as_secs_f64()
            )
        })?;
    let bytes = proc::dir_bytes(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "scale: {} holds {} ({} from {}, {} idle) on the {} store, {:.0} MB, in {:.1} s",
        out.display(),
        filled.counts,
        filled.copied,
        from.display(),
        filled.added,
        kind.name(),
        bytes as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn restart_time(a: RestartArgs) -> Result<(), String> {
    prepare(&a.relay)?;
    if a.relay.relay_addr.is_some() {
        return Err("restart-time starts its own relay: --relay-addr does not apply".into());
    }
    let dir = a
        .relay
        .data_dir
        .clone()
        .or_else(|| a.file.as_deref().map(default_data_dir))
        .ok_or("give --data-dir or --file")?;
    let spec = a.relay.spec();
    let bytes = proc::dir_bytes(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let config = format!(
        "{} shards={}{}{}{}",
        dir.display(),
        spec.shards,
        if a.cold { " cold" } else { "" },
        if a.after_kill { " after-kill" } else { "" },
        spec.extra_args
            .iter()
            .fold(String::new(), |s, x| s + " " + x)
    );
    let mut records = Vec::new();
    for run in 0..a.runs {
        if a.after_kill {
            // A relay process is SIGKILLed when dropped.
            drop(spec.start(&dir)?);
        }
        if a.cold {
            proc::evict_from_page_cache(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let load1 = proc::load1();
        let t0 = std::time::Instant::now();
        let relay = spec.start(&dir)?;
        let start_s = t0.elapsed().as_secs_f64();
        let at = proc::sample(&relay.pid().to_string());
        let t1 = std::time::Instant::now();
        relay.stop_clean()?;
        let stop_s = t1.elapsed().as_secs_f64();
        if !a.json {
            eprintln!("restart-time run {}/{}: {start_s:.3} s", run + 1, a.runs);
        }
        let mb = |kb: u64| kb as f64 / 1024.0;
        records.push(RunRecord {
            scenario: "restart-time".into(),
            config: config.clone(),
            run,
            figures: vec![
                ("start_to_listening_s", start_s),
                ("relay_cpu_s_at_listening", at.cpu_s),
                ("relay_rss_anon_mb", mb(at.rss_anon_kb)),
                ("relay_rss_file_mb", mb(at.rss_file_kb)),
                ("stop_s", stop_s),
                ("data_dir_mb", bytes as f64 / 1e6),
                ("load1_at_start", load1),
            ],
        });
    }
    emit("restart-time", &records, a.json, None);
    Ok(())
}

/// `scale` on a setup made with `--pg`: a copy of its data directory naming a copy of its
/// database, to which the idle queues are added in SQL (each a copy of a setup queue's keys under
/// new random IDs: the relay never reads an idle queue's record, only its IDs at start).
fn scale_postgres(a: &ScaleArgs, from: &Path, out: &Path) -> Result<(), String> {
    let pg =
        a.pg.as_ref()
            .ok_or("the setup's store is PostgreSQL: give --pg DIR, the cluster of pg-start")?;
    if a.notifiers || a.links {
        return Err("--notifiers and --links are for the journal and memory stores".into());
    }
    let t0 = std::time::Instant::now();
    std::fs::create_dir_all(out)
        .and_then(|()| proc::copy_data_dir(from, out))
        .map_err(|e| format!("copy {} to {}: {e}", from.display(), out.display()))?;
    let (template, setup) = setup_database(from)?;
    let name = format!("smpload_scale_{}", a.queues);
    let conninfo = pg_database(pg, &name, Some(&template))?;
    let mut c = postgres::Client::connect(&conninfo, postgres::NoTls)
        .map_err(|e| format!("{name}: {e}"))?;
    let schema = &setup.schema;
    let insert = format!(
        "INSERT INTO {schema}.msg_queues (recipient_id, recipient_keys, rcv_dh_secret, \
           sender_id, sender_key, queue_mode, status, updated_at) \
         SELECT public.gen_random_bytes(24), t.recipient_keys, t.rcv_dh_secret, \
           public.gen_random_bytes(24), t.sender_key, t.queue_mode, 'active', t.updated_at \
         FROM (SELECT * FROM {schema}.msg_queues \
               WHERE deleted_at IS NULL AND sender_key IS NOT NULL LIMIT 1) t, \
           generate_series(1, $1::int4)"
    );
    const CHUNK: u64 = 1_000_000;
    let mut added = 0;
    while added < a.queues {
        let n = CHUNK.min(a.queues - added);
        let rows = c
            .execute(insert.as_str(), &[&(n as i32)])
            .map_err(|e| format!("{name}: {e}"))?;
        if rows != n {
            return Err(format!("{name}: {rows} of {n} idle queues inserted"));
        }
        added += n;
        eprintln!(
            "scale: {added} idle queues written ({:.0} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    c.batch_execute(&format!("ANALYZE {schema}.msg_queues"))
        .map_err(|e| format!("{name}: {e}"))?;
    smp_relay::store::postgres::remember_config(
        out,
        &smp_relay::store::postgres::PgConfig {
            conninfo: conninfo.clone(),
            ..setup
        },
    )?;
    eprintln!(
        "scale: {} names the database {name} ({added} idle queues added to a copy of {template}) \
         in {:.1} s; its relay starts with --store postgres --database '{conninfo}'",
        out.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A relay for one run: a fresh copy of the data directory, or the running one.
enum RunRelay {
    /// The directory (and the run's database) is removed after the relay is killed (field order).
    Managed {
        relay: RelayProc,
        _dir: TempDir,
        db: Option<(RunDatabase, u32)>,
    },
    External(Target),
}

impl RunRelay {
    fn start(relay: &RelayArgs, base: Option<&Path>) -> Result<RunRelay, String> {
        if let Some(t) = relay.external()? {
            return Ok(RunRelay::External(t));
        }
        let mut spec = relay.spec();
        let dir = TempDir::new("relay").map_err(|e| e.to_string())?;
        match base {
            Some(b) => proc::copy_data_dir(b, dir.path())
                .map_err(|e| format!("copy {}: {e}", b.display()))?,
            None => {
                spec.init(dir.path())?;
            }
        }
        let mut db = None;
        if let Some(pg) = &relay.pg {
            // The copy of the database `setup` filled (named in the data directory it made).
            let (template, _) = setup_database(dir.path())?;
            let name = format!("smpload_run_{}", std::process::id());
            let conninfo = pg_database(pg, &name, Some(&template))?;
            let (_, postmaster) = smp_relay::store::postgres::cluster::detached(pg)?;
            spec.extra_args.extend([
                "--store".into(),
                "postgres".into(),
                "--database".into(),
                conninfo.clone(),
            ]);
            db = Some((
                RunDatabase {
                    pg: pg.clone(),
                    name,
                    conninfo,
                },
                postmaster,
            ));
        }
        let p = spec.start(dir.path())?;
        Ok(RunRelay::Managed {
            relay: p,
            _dir: dir,
            db,
        })
    }

    fn target(&self) -> Target {
        match self {
            RunRelay::Managed { relay: p, db, .. } => Target {
                addr: p.addr,
                key_hash: p.key_hash,
                pid: Some(p.pid()),
                db_pid: db.as_ref().map(|(_, pid)| *pid),
                db_conninfo: db.as_ref().map(|(d, _)| d.conninfo.clone()),
            },
            RunRelay::External(t) => t.clone(),
        }
    }

    fn log_tail(&self) -> String {
        match self {
            RunRelay::Managed { relay: p, .. } => p.log_tail(),
            RunRelay::External(_) => String::new(),
        }
    }
}

fn print_floor(f: &Floor, out: &mut dyn std::io::Write) {
    let _ = writeln!(
        out,
        "crypto floor (in-process, this machine): Ed25519 verify {:.1} µs alone, {:.1} µs batched \
         ({:.1} µs with keys first seen), \
         MSG sxbox {:.1} µs, \
         block enc/dec {:.1}/{:.1} µs, TLS seal/open {:.1}/{:.1} µs\n  per SUB {:.1} µs; per \
         delivery {:.1} µs + per SEND {:.1} µs = per message {:.1} µs; per handshake {:.1} µs",
        f.verify_us,
        f.verify_batched_us,
        f.verify_batched_cold_us,
        f.sxbox_us,
        f.block_enc_us,
        f.block_dec_us,
        f.tls_seal_us,
        f.tls_open_us,
        f.per_sub_us(),
        f.per_delivery_us(),
        f.per_send_us(),
        f.per_message_us(),
        f.per_handshake_us()
    );
}

fn emit(scenario: &str, records: &[RunRecord], json: bool, floor: Option<&Floor>) {
    let table = report::table(scenario, records);
    if json {
        if let Some(f) = floor {
            print_floor(f, &mut std::io::stderr());
        }
        eprint!("{table}");
        print!("{}", report::json_lines(scenario, records));
    } else {
        if let Some(f) = floor {
            print_floor(f, &mut std::io::stdout());
        }
        print!("{table}");
    }
}

fn messages(
    scenario: &str,
    shape: Shape,
    a: MsgArgs,
    default_queues: usize,
    default_conns: &[usize],
) -> Result<(), String> {
    prepare(&a.relay)?;
    let floor = Floor::measure();
    if !a.quiet {
        print_floor(&floor, &mut std::io::stderr());
    }
    let all = creds::load(&a.file).map_err(|e| e.0)?;
    let queues = a.queues.unwrap_or(default_queues);
    if queues > all.len() {
        return Err(format!(
            "{} holds {} queues, {queues} asked (run setup with --queues {queues})",
            a.file.display(),
            all.len()
        ));
    }
    let creds: Arc<Vec<QueueCreds>> = Arc::new(all.into_iter().take(queues).collect());
    let base = a
        .relay
        .data_dir
        .clone()
        .unwrap_or_else(|| default_data_dir(&a.file));
    let conns = if a.conns.is_empty() {
        default_conns.to_vec()
    } else {
        a.conns.clone()
    };
    let prefills: &[bool] = match a.prefill {
        Prefill::Yes => &[true],
        Prefill::No => &[false],
        Prefill::Both => &[true, false],
    };
    let params = LoadParams {
        window_blocks: a.window,
        senders: a.senders,
        threads: a.threads,
        msg_bytes: a.msg_bytes,
        timeout: Duration::from_secs(a.timeout_secs),
        progress: !a.quiet,
        profile: a.profile.clone(),
        services: a.services,
    };
    let mut records = Vec::new();
    for run in 0..a.runs {
        for &k in &conns {
            for &prefill in prefills {
                let spec = RunSpec {
                    shape,
                    queues,
                    conns: k,
                    prefill,
                };
                let config = format!(
                    "queues={queues} conns={k} prefill={} senders={}x{}",
                    if prefill { "yes" } else { "no" },
                    a.senders,
                    a.threads
                );
                if !a.quiet {
                    eprintln!("{scenario} run {}/{}: {config}", run + 1, a.runs);
                }
                let relay = RunRelay::start(&a.relay, Some(&base))?;
                let figures =
                    scenario::run_messages(&relay.target(), &creds, &spec, &params, &floor)
                        .map_err(|e| {
                            format!("{scenario} {config}: {e}\nrelay log:\n{}", relay.log_tail())
                        })?;
                drop(relay);
                let mut figures = figures;
                figures.push(("floor_us_per_message", floor.per_message_us()));
                figures.push(("floor_us_per_sub", floor.per_sub_us()));
                let rec = RunRecord {
                    scenario: scenario.into(),
                    config,
                    run,
                    figures,
                };
                if !a.quiet {
                    eprintln!(
                        "  window {:.2} s, {:.0} delivered/s, relay {:.0} µs/delivered",
                        rec.get("subscribe_window_s").unwrap_or(f64::NAN),
                        rec.get("delivered_per_s").unwrap_or(f64::NAN),
                        rec.get("relay_cpu_us_per_delivered").unwrap_or(f64::NAN)
                    );
                }
                records.push(rec);
            }
        }
    }
    emit(scenario, &records, a.json, Some(&floor));
    Ok(())
}

fn service_subs(a: ServiceSubsArgs) -> Result<(), String> {
    use smp_relay::load::service_subs;
    prepare(&a.relay)?;
    let all = creds::load(&a.file).map_err(|e| e.0)?;
    if a.queues > all.len() {
        return Err(format!(
            "{} holds {} queues, {} asked (run setup with --queues {})",
            a.file.display(),
            all.len(),
            a.queues,
            a.queues
        ));
    }
    let creds: Arc<Vec<QueueCreds>> = Arc::new(all.into_iter().take(a.queues).collect());
    let base = a
        .relay
        .data_dir
        .clone()
        .unwrap_or_else(|| default_data_dir(&a.file));
    let timeout = Duration::from_secs(a.timeout_secs);
    let relay = RunRelay::start(&a.relay, Some(&base))?;
    let target = relay.target();
    let with_log = |e: String| format!("service-subs: {e}\nrelay log:\n{}", relay.log_tail());
    let config = format!("queues={} messages={}", a.queues, a.messages);
    if !a.quiet {
        eprintln!(
            "service-subs: associating {} queues with one service",
            a.queues
        );
    }
    let started = std::time::Instant::now();
    let prepared = service_subs::prepare(&target, &creds, a.messages, a.msg_bytes, timeout)
        .map_err(with_log)?;
    if !a.quiet {
        eprintln!(
            "  associated and filled in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let mut records = Vec::new();
    for run in 0..a.runs {
        let figures = service_subs::run(&target, &prepared, timeout).map_err(with_log)?;
        let rec = RunRecord {
            scenario: "service-subs".into(),
            config: config.clone(),
            run,
            figures,
        };
        if !a.quiet {
            eprintln!(
                "service-subs run {}/{}: SOKS {:.0} ms, ALLS {:.2} s, relay {:.1} µs/queue",
                run + 1,
                a.runs,
                rec.get("soks_ms").unwrap_or(f64::NAN),
                rec.get("alls_s").unwrap_or(f64::NAN),
                rec.get("relay_cpu_us_per_queue").unwrap_or(f64::NAN)
            );
        }
        records.push(rec);
    }
    drop(relay);
    emit("service-subs", &records, a.json, None);
    Ok(())
}

fn idle(a: IdleArgs) -> Result<(), String> {
    prepare(&a.relay)?;
    let mut records = Vec::new();
    for run in 0..a.runs {
        if !a.quiet {
            eprintln!("idle run {}/{}: {} connections", run + 1, a.runs, a.conns);
        }
        let relay = RunRelay::start(&a.relay, a.relay.data_dir.as_deref())?;
        let figures = scenario::run_idle(
            &relay.target(),
            a.conns,
            a.threads,
            Duration::from_secs(a.idle_secs),
            !a.quiet,
        )
        .map_err(|e| format!("idle: {e}\nrelay log:\n{}", relay.log_tail()))?;
        drop(relay);
        records.push(RunRecord {
            scenario: "idle".into(),
            config: format!("conns={}", a.conns),
            run,
            figures,
        });
    }
    emit("idle", &records, a.json, None);
    Ok(())
}

fn reconnect(a: ReconnectArgs) -> Result<(), String> {
    use smp_relay::load::reconnect::{self, Restart};
    use smp_relay::store::StoreKind;
    if a.relay.relay_addr.is_some() {
        return Err("reconnect restarts its own relay: --relay-addr does not apply".into());
    }
    if a.relay.pg.is_some() {
        return Err("reconnect runs on the journal store: --pg does not apply".into());
    }
    if a.msg_bytes > smp_relay::protocol::version::max_message_length(u16::MAX) {
        return Err(format!("--msg-bytes {} is over 16048", a.msg_bytes));
    }
    if a.window == 0 {
        return Err("--window must be at least 1".into());
    }
    if a.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    if !a.relay.gen_cores.is_empty() {
        proc::pin_self(&a.relay.gen_cores)?;
    }
    let open_files = proc::raise_nofile();
    let base = a
        .relay
        .data_dir
        .clone()
        .unwrap_or_else(|| default_data_dir(&a.file));
    match StoreKind::found_in(&base) {
        Some(StoreKind::Journal) => {}
        Some(other) => {
            return Err(format!(
                "{} holds a {} store; reconnect runs on the journal store (make it with `setup` \
                 without --store)",
                base.display(),
                other.name()
            ))
        }
        None => {
            return Err(format!(
                "{} holds no store: run `smp-load setup --file {}` first",
                base.display(),
                a.file.display()
            ))
        }
    }
    let params = reconnect::Params {
        conns: a.conns,
        queues_per_conn: a.queues_per_conn,
        waiting_every: a.waiting_every,
        msg_bytes: a.msg_bytes,
        window_blocks: a.window,
        timeout: Duration::from_secs(a.timeout_secs),
        progress: !a.quiet,
    };
    let all = creds::load(&a.file).map_err(|e| e.0)?;
    params.check(all.len(), open_files)?;
    let creds: Arc<Vec<QueueCreds>> = Arc::new(all.into_iter().take(params.queues()).collect());
    let floor = Floor::measure();
    if !a.quiet {
        print_floor(&floor, &mut std::io::stderr());
    }
    let modes: &[Restart] = match a.restart {
        RestartArg::Clean => &[Restart::Clean],
        RestartArg::Kill => &[Restart::Kill],
        RestartArg::Both => &[Restart::Clean, Restart::Kill],
    };
    let spec = a.relay.spec();
    let mut records = Vec::new();
    for run in 0..a.runs {
        for &restart in modes {
            let config = format!(
                "conns={} queues_per_conn={} restart={} waiting=1/{} msg_bytes={}",
                a.conns,
                a.queues_per_conn,
                restart.name(),
                a.waiting_every,
                a.msg_bytes
            );
            if !a.quiet {
                eprintln!("reconnect run {}/{}: {config}", run + 1, a.runs);
            }
            let figures = reconnect::run(&spec, &base, &creds, restart, &params, &floor)
                .map_err(|e| format!("reconnect {config}: {e}"))?;
            let rec = RunRecord {
                scenario: "reconnect".into(),
                config,
                run,
                figures,
            };
            if !a.quiet {
                eprintln!(
                    "  resubscribed {:.2} s, delivered {:.2} s, relay {:.0} µs CPU per connection, \
                     {:.2}× the floor, peak RssAnon {:.0} MB",
                    rec.get("resubscribed_s").unwrap_or(f64::NAN),
                    rec.get("delivered_s").unwrap_or(f64::NAN),
                    rec.get("relay_cpu_us_per_handshake").unwrap_or(f64::NAN),
                    rec.get("cpu_over_run_floor").unwrap_or(f64::NAN),
                    rec.get("relay_rss_anon_peak_mb").unwrap_or(f64::NAN)
                );
            }
            records.push(rec);
        }
    }
    emit("reconnect", &records, a.json, Some(&floor));
    Ok(())
}
