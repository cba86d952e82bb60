//! The PostgreSQL store's connections (`docs/ARCHITECTURE.md` §5): an r2d2 pool used by worker
//! threads of its own, fed jobs through a bounded crossbeam channel. A shard never blocks on the
//! database: it sends a job and awaits its answer on a one-shot flume channel, serving everything
//! else meanwhile.
//!
//! Every statement a job runs is prepared once per connection ([`Conn::stmt`]) and reused; the
//! connection checks nothing on checkout (no extra round trip), and a connection whose socket
//! closed is dropped by the pool and replaced on the next checkout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, Statement};

use super::conninfo::{ConnectError, Target};
pub use super::errors::describe;
use super::schema;
use crate::store::StoreError;

/// Jobs waiting for a worker, over all shards; one more is refused with `ERR STORE` rather than
/// queued, so a stalled database cannot grow the relay's memory without bound.
pub const MAX_PENDING_JOBS: usize = 16_384;
/// How often a job that met a deadlock or a serialization failure is run again (the service
/// triggers update one `services` row from many queues).
pub const MAX_RETRIES: usize = 3;

/// What the pool is made with (`start --database`, `--schema`, `--pool-size`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// A libpq connection string, key-value or URL (the reference's `db_connection`).
    pub conninfo: String,
    /// The schema holding the store's tables (the reference's `db_schema`).
    pub schema: String,
    /// Connections, and worker threads (the reference's `db_pool_size`).
    pub pool_size: usize,
    /// The longest a statement may run (`statement_timeout` of every connection).
    pub statement_timeout: Duration,
    /// The longest a job waits for a connection (r2d2's checkout timeout).
    pub pool_wait: Duration,
    /// Queue records held beyond those in use (`[RELAY] pg_queue_cache`): the relay's total in
    /// the settings, each shard's share in its store's settings (`server::store_settings`).
    pub queue_cache: usize,
}

pub const DEFAULT_CONNINFO: &str = "postgresql://smp@/smp_server_store";
pub const DEFAULT_SCHEMA: &str = "smp_server";
pub const DEFAULT_POOL_SIZE: usize = 10;
pub const MAX_POOL_SIZE: usize = 256;
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_POOL_WAIT: Duration = Duration::from_secs(10);
/// Queue records the relay holds beyond those in use: ~150 MB of records at most, what a small
/// VPS spares; its subscribed queues' records are held besides.
pub const DEFAULT_QUEUE_CACHE: usize = 100_000;

impl Default for PgConfig {
    fn default() -> Self {
        PgConfig {
            conninfo: DEFAULT_CONNINFO.to_string(),
            schema: DEFAULT_SCHEMA.to_string(),
            pool_size: DEFAULT_POOL_SIZE,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            pool_wait: DEFAULT_POOL_WAIT,
            queue_cache: DEFAULT_QUEUE_CACHE,
        }
    }
}

/// A pooled connection and the statements prepared on it.
pub struct Conn {
    pub client: Client,
    /// The server process of this session (`pg_backend_pid()`): after the connection is lost,
    /// the statement it ran may still commit until that process ends ([`settle`]).
    pub pid: i32,
    stmts: HashMap<&'static str, Statement>,
}

impl Conn {
    /// `sql` prepared on this connection, once.
    pub fn stmt(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.stmts.insert(sql, s.clone());
        Ok(s)
    }
}

struct Manager {
    target: Target,
    /// Run on every new connection: search path, message level, statement timeout.
    setup: String,
    /// Prepared on every new connection, so that no hot-path statement is parsed later.
    hot: &'static [&'static str],
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = ConnectError;

    fn connect(&self) -> Result<Conn, ConnectError> {
        let mut client = self.target.connect()?;
        client
            .batch_execute(&self.setup)
            .map_err(|e| ConnectError(describe(&e)))?;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .map_err(|e| ConnectError(describe(&e)))?
            .get(0);
        let mut conn = Conn {
            client,
            pid,
            stmts: HashMap::new(),
        };
        for sql in self.hot {
            conn.stmt(sql).map_err(|e| ConnectError(describe(&e)))?;
        }
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ConnectError> {
        conn.client
            .simple_query("")
            .map(|_| ())
            .map_err(|e| ConnectError(describe(&e)))
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.client.is_closed()
    }
}

/// The pool's failed connection attempts, logged at most once per `limits::WARNING_INTERVAL`
/// (`log_limit`): while the database is down, every job tries to connect, and r2d2 would log an
/// error line each time.
#[derive(Debug)]
struct LogConnectErrors;

static CONNECT_FAILED: crate::log_limit::RateLimited =
    crate::log_limit::RateLimited::new("database connection failed");

impl r2d2::HandleError<ConnectError> for LogConnectErrors {
    fn handle_error(&self, error: ConnectError) {
        if let crate::log_limit::Decision::Write { suppressed } =
            CONNECT_FAILED.decide(std::time::Instant::now())
        {
            tracing::warn!(
                suppressed,
                "database connection failed (the pool tries again as jobs come): {error}"
            );
        }
    }
}

type Job = Box<dyn FnOnce(Result<&mut Conn, String>) + Send>;

/// The pool and its workers, shared by every shard of one relay (one per database and schema).
pub struct Shared {
    pub config: PgConfig,
    jobs: Option<crossbeam_channel::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    pool: r2d2::Pool<Manager>,
    /// Holds the advisory lock that makes this relay the database's only one ([`keep_lock`]).
    lock_keeper: Option<(crossbeam_channel::Sender<()>, JoinHandle<()>)>,
    /// The relay's count of queues and notifiers (`postgres/counts.rs`).
    pub counts: Arc<Mutex<super::counts::State>>,
    /// Where and how [`Shared::spawn_own`] connects: the pool's target and session set-up.
    own: (Target, String),
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("schema", &self.config.schema)
            .finish_non_exhaustive()
    }
}

/// The relay's pools by connection string and schema, so that every shard opening its store
/// shares one (the first opener connects, locks and migrates).
static SHARED: Mutex<Vec<(String, String, Weak<Shared>)>> = Mutex::new(Vec::new());

impl Shared {
    /// The pool for `config`, made (with the lock taken and the schema migrated) if none is open.
    pub fn get(config: &PgConfig, hot: &'static [&'static str]) -> Result<Arc<Shared>, String> {
        let mut all = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(_, _, w)| w.strong_count() > 0);
        if let Some(s) = all
            .iter()
            .find(|(c, s, _)| *c == config.conninfo && *s == config.schema)
            .and_then(|(_, _, w)| w.upgrade())
        {
            return Ok(s);
        }
        let shared = Arc::new(Shared::open(config, hot)?);
        all.push((
            config.conninfo.clone(),
            config.schema.clone(),
            Arc::downgrade(&shared),
        ));
        Ok(shared)
    }

    fn open(config: &PgConfig, hot: &'static [&'static str]) -> Result<Shared, String> {
        let target = Target::parse(&config.conninfo)?;
        let lock_target = target.clone();
        let mut lock = target
            .connect()
            .map_err(|e| format!("cannot connect to the database {}: {e}", target.shown()))?;
        schema::lock_and_migrate(&mut lock, &config.schema)?;
        let setup = format!(
            "SET client_min_messages TO WARNING; SET search_path TO {}; SET statement_timeout = {}",
            schema::ident(&config.schema),
            config.statement_timeout.as_millis().max(1)
        );
        let size = config.pool_size.clamp(1, MAX_POOL_SIZE);
        let own = (target.clone(), setup.clone());
        let pool = r2d2::Pool::builder()
            .max_size(size as u32)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .error_handler(Box::new(LogConnectErrors))
            .connection_timeout(config.pool_wait)
            .build_unchecked(Manager { target, setup, hot });
        // One connection now, so that a start with bad settings fails here, not at the first SEND.
        pool.get()
            .map_err(|e| format!("cannot open a pooled connection: {e}"))?;
        let (tx, rx) = crossbeam_channel::bounded::<Job>(MAX_PENDING_JOBS);
        let workers = (0..size)
            .map(|i| {
                let rx = rx.clone();
                let pool = pool.clone();
                std::thread::Builder::new()
                    .name(format!("pg-{i}"))
                    .spawn(move || {
                        for job in rx.iter() {
                            match pool.get() {
                                Ok(mut c) => job(Ok(&mut c)),
                                Err(e) => job(Err(format!("no database connection: {e}"))),
                            }
                        }
                    })
                    .map_err(|e| format!("cannot start a database thread: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let schema = config.schema.clone();
        let keeper = std::thread::Builder::new()
            .name("pg-lock".into())
            .spawn(move || keep_lock(&lock_target, &schema, lock, &stopped))
            .map_err(|e| format!("cannot start a database thread: {e}"))?;
        Ok(Shared {
            config: config.clone(),
            jobs: Some(tx),
            workers,
            pool,
            lock_keeper: Some((stop, keeper)),
            counts: Arc::default(),
            own,
        })
    }

    /// Runs `f` on a session of its own, on a thread of its own, and hands `done` its result: a
    /// long statement in the background (the count of queues after a start), which must not hold
    /// one of the pool's connections or threads from the commands meanwhile.
    pub fn spawn_own<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Conn) -> Result<T, postgres::Error> + Send + 'static,
        done: impl FnOnce(Result<T, StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let (target, setup) = self.own.clone();
        std::thread::Builder::new()
            .name("pg-own".into())
            .spawn(move || {
                let connected = target.connect().and_then(|mut client| {
                    client
                        .batch_execute(&setup)
                        .map_err(|e| ConnectError(describe(&e)))?;
                    let pid: i32 = client
                        .query_one("SELECT pg_backend_pid()", &[])
                        .map_err(|e| ConnectError(describe(&e)))?
                        .get(0);
                    Ok(Conn {
                        client,
                        pid,
                        stmts: HashMap::new(),
                    })
                });
                done(match connected {
                    Err(e) => Err(RunError::NoConnection(e.to_string()).store_error(op)),
                    Ok(mut c) => f(&mut c).map_err(|e| RunError::Db(e, c.pid).store_error(op)),
                });
            })
            .map(|_| ())
            .map_err(|e| StoreError::Failed(format!("{op}: cannot start a thread: {e}")))
    }

    /// Runs `f` on a pooled connection off the shard and awaits its result. A deadlock or a
    /// serialization failure runs it again (at most [`MAX_RETRIES`] times); any other error is
    /// `ERR STORE "<op>, <error>"`.
    pub async fn run<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&mut Conn) -> Result<T, postgres::Error> + Send + 'static,
    {
        let (tx, rx) = flume::bounded::<Result<T, StoreError>>(1);
        self.submit(op, f, move |r| {
            let _ = tx.send(r);
        })?;
        match rx.recv_async().await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Failed(format!("{op}, the job was dropped"))),
        }
    }

    /// [`Shared::run`] without the wait: `done` gets the outcome, on the worker thread that ran
    /// `f`. An error here means the job was not taken (`done` is then not called).
    pub fn submit<T, F>(
        &self,
        op: &'static str,
        mut f: F,
        done: impl FnOnce(Result<T, StoreError>) + Send + 'static,
    ) -> Result<(), StoreError>
    where
        F: FnMut(&mut Conn) -> Result<T, postgres::Error> + Send + 'static,
    {
        let job: Job = Box::new(move |conn| {
            let r = match conn {
                Err(e) => Err(RunError::NoConnection(e)),
                Ok(c) => {
                    let mut tries = 0;
                    loop {
                        match f(c) {
                            Err(e) if retryable(&e) && tries < MAX_RETRIES => tries += 1,
                            r => break r.map_err(|e| RunError::Db(e, c.pid)),
                        }
                    }
                }
            };
            done(r.map_err(|e| e.store_error(op)));
        });
        let jobs = self.jobs.as_ref().expect("jobs open until drop");
        jobs.try_send(job).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => {
                StoreError::Failed(format!("{op}, the database job queue is full"))
            }
            crossbeam_channel::TrySendError::Disconnected(_) => {
                StoreError::Failed(format!("{op}, the database threads stopped"))
            }
        })
    }

    /// Like [`Shared::run`], but on the calling thread: for start-up, a clean stop and the
    /// offline tools, which may block.
    pub fn run_blocking<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut Conn) -> Result<T, postgres::Error>,
    ) -> Result<T, String> {
        let mut c = self
            .pool
            .get()
            .map_err(|e| format!("{op}: no database connection: {e}"))?;
        f(&mut c).map_err(|e| format!("{op}: {}", describe(&e)))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the channel ends the workers once the jobs sent before are done.
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // Closing its channel stops the lock's thread, which ends the session and the lock.
        if let Some((stop, keeper)) = self.lock_keeper.take() {
            drop(stop);
            let _ = keeper.join();
        }
    }
}

/// How often the session holding the advisory lock is checked, and how long a check may take.
pub const LOCK_CHECK: Duration = Duration::from_secs(1);

/// Holds the advisory lock (taken by `lock`'s session at start) until `stop` closes. The session
/// may die while the relay runs (the server restarted, or an administrator terminated it): the
/// pool does not need it, so the relay goes on serving, but the lock went with it and a second
/// relay could then start on the schema. So it is checked every [`LOCK_CHECK`], and when lost it
/// is logged and taken again on a new session as soon as the database answers. If another relay
/// took it meanwhile, that is logged as an error (two relays now write the schema) and the lock is
/// tried again until it is had.
fn keep_lock(target: &Target, schema: &str, lock: Client, stop: &crossbeam_channel::Receiver<()>) {
    let mut session = Some(lock);
    let mut held = true;
    let mut told_taken = false;
    loop {
        match stop.recv_timeout(LOCK_CHECK) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        if held {
            match session.as_mut().map(|c| c.is_valid(LOCK_CHECK)) {
                Some(Ok(())) => continue,
                Some(Err(e)) => tracing::warn!(
                    schema,
                    error = %describe(&e),
                    "the database session holding the schema's advisory lock was lost; the relay \
                     goes on serving and takes the lock again"
                ),
                None => {}
            }
            held = false;
            session = None;
        }
        let c = match session.as_mut() {
            Some(c) => c,
            None => match target.connect() {
                Ok(c) => session.insert(c),
                Err(_) => continue,
            },
        };
        match schema::try_lock(c, schema) {
            Ok(true) => {
                tracing::info!(schema, "the schema's advisory lock is held again");
                held = true;
                told_taken = false;
            }
            Ok(false) if !told_taken => {
                tracing::error!(
                    schema,
                    "another smp-relay took the schema's advisory lock while this relay's lock \
                     session was lost: two relays now write the schema; stop one of them"
                );
                told_taken = true;
            }
            Ok(false) => {}
            Err(_) => session = None,
        }
    }
}

enum RunError {
    NoConnection(String),
    /// The error, and the server process of the session it came on.
    Db(postgres::Error, i32),
}

/// Whether a failed statement may have committed: the connection went away while it ran, so
/// only a look at the database tells, once the session's server process has ended ([`settle`];
/// a SEND then looks up its message ID).
pub fn outcome_unknown(e: &StoreError) -> bool {
    matches!(e, StoreError::Failed(t) if t.contains(CONNECTION_LOST))
}

/// The server process of the session an [`outcome_unknown`] error was lost on.
pub fn lost_backend(e: &StoreError) -> Option<i32> {
    let StoreError::Failed(t) = e else {
        return None;
    };
    let rest = &t[t.find(BACKEND)? + BACKEND.len()..];
    rest[..rest.find(')')?].parse().ok()
}

const CONNECTION_LOST: &str = "connection lost";
const BACKEND: &str = "(server process ";

/// How long [`settle`] waits for a terminated server process to end.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Ends server process `pid` (the session a statement was lost on) and waits until it is gone, so
/// that what it ran has committed or rolled back for good: until then a statement blocked in it
/// (on a row lock, say) may still commit, and a look that finds nothing proves nothing. `Ok(true)`
/// once it is gone, `Ok(false)` if it is still there after [`SETTLE_WAIT`].
pub fn settle(c: &mut Conn, pid: i32) -> Result<bool, postgres::Error> {
    c.client
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])?;
    let deadline = std::time::Instant::now() + SETTLE_WAIT;
    loop {
        let alive: bool = c
            .client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                &[&pid],
            )?
            .get(0);
        if !alive {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl RunError {
    fn store_error(self, op: &str) -> StoreError {
        match self {
            RunError::NoConnection(e) => StoreError::Failed(format!("{op}, {e}")),
            RunError::Db(e, pid) if e.as_db_error().is_none() => {
                StoreError::Failed(format!("{op}, {CONNECTION_LOST} {BACKEND}{pid}): {e}"))
            }
            RunError::Db(e, pid) if ends_session(&e) => StoreError::Failed(format!(
                "{op}, {CONNECTION_LOST} {BACKEND}{pid}): {}",
                describe(&e)
            )),
            RunError::Db(e, _) => StoreError::Failed(format!("{op}, {}", describe(&e))),
        }
    }
}

/// An error the server sends as it ends the session (FATAL or PANIC: the session was terminated,
/// the server is shutting down). It may come after the statement committed: the server can be
/// told to end the session between the commit and the end of its answer, and then sends this
/// error instead of that end. So, like a lost connection, it leaves the outcome unknown.
fn ends_session(e: &postgres::Error) -> bool {
    use postgres::error::Severity;
    e.as_db_error().is_some_and(|d| {
        matches!(
            d.parsed_severity(),
            Some(Severity::Fatal) | Some(Severity::Panic)
        ) || d.code().code().starts_with("57P")
    })
}

fn retryable(e: &postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}
