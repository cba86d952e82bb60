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
}

pub const DEFAULT_CONNINFO: &str = "postgresql://smp@/smp_server_store";
pub const DEFAULT_SCHEMA: &str = "smp_server";
pub const DEFAULT_POOL_SIZE: usize = 10;
pub const MAX_POOL_SIZE: usize = 256;
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_POOL_WAIT: Duration = Duration::from_secs(10);

impl Default for PgConfig {
    fn default() -> Self {
        PgConfig {
            conninfo: DEFAULT_CONNINFO.to_string(),
            schema: DEFAULT_SCHEMA.to_string(),
            pool_size: DEFAULT_POOL_SIZE,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            pool_wait: DEFAULT_POOL_WAIT,
        }
    }
}

/// A pooled connection and the statements prepared on it.
pub struct Conn {
    pub client: Client,
    stmts: HashMap<&'static str, Statement>,
    /// Statements prepared on this connection (Parse messages sent), a figure of the budgets.
    pub prepared: u64,
}

impl Conn {
    /// `sql` prepared on this connection, once.
    pub fn stmt(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.prepared += 1;
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
        let mut conn = Conn {
            client,
            stmts: HashMap::new(),
            prepared: 0,
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

type Job = Box<dyn FnOnce(Result<&mut Conn, String>) + Send>;

/// The pool and its workers, shared by every shard of one relay (one per database and schema).
pub struct Shared {
    pub config: PgConfig,
    jobs: Option<crossbeam_channel::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    pool: r2d2::Pool<Manager>,
    /// Holds the advisory lock that makes this relay the database's only one.
    _lock: Mutex<Client>,
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
        let pool = r2d2::Pool::builder()
            .max_size(size as u32)
            .min_idle(Some(0))
            .test_on_check_out(false)
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
        Ok(Shared {
            config: config.clone(),
            jobs: Some(tx),
            workers,
            pool,
            _lock: Mutex::new(lock),
        })
    }

    /// Runs `f` on a pooled connection off the shard and awaits its result. A deadlock or a
    /// serialization failure runs it again (at most [`MAX_RETRIES`] times); any other error is
    /// `ERR STORE "<op>, <error>"`.
    pub async fn run<T, F>(&self, op: &'static str, mut f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&mut Conn) -> Result<T, postgres::Error> + Send + 'static,
    {
        let (tx, rx) = flume::bounded::<Result<T, RunError>>(1);
        let job: Job = Box::new(move |conn| {
            let r = match conn {
                Err(e) => Err(RunError::NoConnection(e)),
                Ok(c) => {
                    let mut tries = 0;
                    loop {
                        match f(c) {
                            Err(e) if retryable(&e) && tries < MAX_RETRIES => tries += 1,
                            r => break r.map_err(RunError::Db),
                        }
                    }
                }
            };
            let _ = tx.send(r);
        });
        let jobs = self.jobs.as_ref().expect("jobs open until drop");
        jobs.try_send(job).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => {
                StoreError::Failed(format!("{op}, the database job queue is full"))
            }
            crossbeam_channel::TrySendError::Disconnected(_) => {
                StoreError::Failed(format!("{op}, the database threads stopped"))
            }
        })?;
        match rx.recv_async().await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.store_error(op)),
            Err(_) => Err(StoreError::Failed(format!("{op}, the job was dropped"))),
        }
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
    }
}

enum RunError {
    NoConnection(String),
    Db(postgres::Error),
}

/// Whether a failed statement may have committed: the connection went away while it ran, so
/// only a look at the database tells (a SEND then looks up its message ID).
pub fn outcome_unknown(e: &StoreError) -> bool {
    matches!(e, StoreError::Failed(t) if t.contains(CONNECTION_LOST))
}

const CONNECTION_LOST: &str = "connection lost";

impl RunError {
    fn store_error(self, op: &str) -> StoreError {
        match self {
            RunError::NoConnection(e) => StoreError::Failed(format!("{op}, {e}")),
            RunError::Db(e) if e.as_db_error().is_none() => {
                StoreError::Failed(format!("{op}, {CONNECTION_LOST}: {e}"))
            }
            RunError::Db(e) => StoreError::Failed(format!("{op}, {}", describe(&e))),
        }
    }
}

fn retryable(e: &postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

/// A database error with its message, not just "db error".
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}
