//! A throwaway PostgreSQL cluster for the tests and benchmarks of the PostgreSQL store: made with
//! the system's `initdb` in a temporary directory, served by `postgres` on a private socket
//! directory (and, if asked, a loopback TCP port), with `pg_stat_statements` preloaded, and a
//! template database holding `pgcrypto`, `pg_walinspect` and `pg_stat_statements` from which each
//! test gets a database of its own.
//!
//! The server runs under a small shell that holds a pipe from this process: when this process
//! ends, however it ends, the pipe closes and the shell stops the server and removes the directory.
//! As root, the cluster runs as the `postgres` user (or `nobody`), since PostgreSQL refuses root.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The template every test database is copied from.
pub const TEMPLATE_DB: &str = "smp_relay_template";
/// The cluster's superuser.
pub const SUPERUSER: &str = "postgres";
const START_TIMEOUT: Duration = Duration::from_secs(60);

static DATABASES: AtomicU64 = AtomicU64::new(0);

/// Settings of a cluster beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// `postgresql.conf` lines appended as given.
    pub conf: Vec<String>,
    /// Also listen on 127.0.0.1 at a free port (TLS tests).
    pub tcp: bool,
}

/// A running throwaway cluster (see the module comment).
pub struct Cluster {
    pub dir: PathBuf,
    pub socket_dir: PathBuf,
    pub port: u16,
    bindir: PathBuf,
    run_as: Option<(u32, u32)>,
    /// Closing it stops the server and removes `dir`.
    guard: Mutex<Option<(Child, ChildStdin)>>,
}

/// The folder of the system's PostgreSQL server binaries, or what to install.
pub fn bindir() -> Result<PathBuf, String> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let candidates = from_pg_config.into_iter().chain(
        ["17", "16", "15", "14"]
            .iter()
            .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"))),
    );
    for c in candidates {
        if c.join("initdb").exists() && c.join("postgres").exists() {
            return Ok(c);
        }
    }
    Err(
        "the PostgreSQL server binaries (initdb, postgres) were not found: install them \
         (Debian: apt-get install postgresql-15) so that `pg_config --bindir` names their folder"
            .into(),
    )
}

fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// The cluster's port: taken, as the relays' in tests, below the kernel's ephemeral range
/// (`load::proc::free_port`), so that no client connection elsewhere in the process takes it
/// as its source port before the postmaster listens.
fn free_port() -> Result<u16, String> {
    crate::load::proc::free_port().map_err(|e| format!("no free port: {e}"))
}

/// Who the cluster's programs run as: the `postgres` user (or `nobody`) when this process is root,
/// since PostgreSQL refuses root; else this process's user (`None`).
fn run_as() -> Result<Option<(u32, u32)>, String> {
    // SAFETY: geteuid has no preconditions and only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    user_ids("postgres")
        .or_else(|| user_ids("nobody"))
        .map(Some)
        .ok_or_else(|| {
            "running as root, and there is no postgres or nobody user to run PostgreSQL as".into()
        })
}

/// `name` from `bindir`, run as `run_as`.
fn command_as(bindir: &Path, name: &str, run_as: Option<(u32, u32)>) -> Command {
    let mut c = Command::new(bindir.join(name));
    if let Some((uid, gid)) = run_as {
        std::os::unix::process::CommandExt::uid(&mut c, uid);
        std::os::unix::process::CommandExt::gid(&mut c, gid);
    }
    c
}

/// `dir` and its socket directory, readable by all and owned by `run_as`.
fn make_dirs(dir: &Path, socket_dir: &Path, run_as: Option<(u32, u32)>) -> Result<(), String> {
    std::fs::create_dir_all(socket_dir)
        .map_err(|e| format!("cannot create {}: {e}", socket_dir.display()))?;
    for d in [dir, socket_dir] {
        let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755));
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(d, Some(uid), Some(gid))
                .map_err(|e| format!("cannot chown {}: {e}", d.display()))?;
        }
    }
    Ok(())
}

/// `initdb` into `data` (trust authentication, superuser [`SUPERUSER`]), then `conf` appended to
/// its `postgresql.conf`.
fn init_data(
    bindir: &Path,
    run_as: Option<(u32, u32)>,
    data: &Path,
    no_sync: bool,
    conf: &[String],
) -> Result<(), String> {
    let mut initdb = command_as(bindir, "initdb", run_as);
    initdb
        .arg("-D")
        .arg(data)
        .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C"]);
    if no_sync {
        initdb.arg("--no-sync");
    }
    let out = initdb
        .output()
        .map_err(|e| format!("cannot run initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let conf_path = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf_path)
        .map_err(|e| format!("cannot read {}: {e}", conf_path.display()))?;
    text.push('\n');
    text.push_str(&conf.join("\n"));
    text.push('\n');
    std::fs::write(&conf_path, text)
        .map_err(|e| format!("cannot write {}: {e}", conf_path.display()))
}

/// The settings every cluster here starts with.
fn base_conf(port: u16, socket_dir: &Path, tcp: bool) -> Vec<String> {
    vec![
        format!("port = {port}"),
        format!("unix_socket_directories = '{}'", socket_dir.display()),
        format!(
            "listen_addresses = '{}'",
            if tcp { "127.0.0.1" } else { "" }
        ),
        "shared_preload_libraries = 'pg_stat_statements'".into(),
        "max_connections = 200".into(),
    ]
}

/// The template database with the extensions the store and its tests use.
fn create_template(base: &str) -> Result<(), String> {
    let mut c = postgres::Client::connect(&format!("{base} dbname=postgres"), postgres::NoTls)
        .map_err(|e| format!("cannot connect: {e}"))?;
    c.batch_execute(&format!("CREATE DATABASE {TEMPLATE_DB}"))
        .map_err(|e| format!("cannot create the template database: {e}"))?;
    postgres::Client::connect(&format!("{base} dbname={TEMPLATE_DB}"), postgres::NoTls)
        .and_then(|mut t| {
            t.batch_execute(
                "CREATE EXTENSION pgcrypto; CREATE EXTENSION pg_walinspect; \
                 CREATE EXTENSION pg_stat_statements;",
            )
        })
        .map_err(|e| format!("cannot create the extensions: {e}"))
}

impl Cluster {
    pub fn start(opts: &ClusterOptions) -> Result<Cluster, String> {
        let bindir = bindir()?;
        let run_as = run_as()?;
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("smp-relay-pg-{}-{n}", std::process::id()));
        let socket_dir = dir.join("sock");
        let data = dir.join("data");
        make_dirs(&dir, &socket_dir, run_as)?;
        let port = free_port()?;
        let mut conf = base_conf(port, &socket_dir, opts.tcp);
        conf.extend(["fsync = off".into(), "log_min_messages = warning".into()]);
        conf.extend(opts.conf.iter().cloned());
        init_data(&bindir, run_as, &data, true, &conf)?;
        // The guard: the server stops and the directory goes when stdin closes. The server it
        // stops is the one named by `postmaster.pid`, not its own child, so that a server started
        // again by `pg_ctl` ([`Cluster::start_server`]) goes too; one that is not its child it
        // cannot wait for, so it polls (a few seconds at most).
        let script = format!(
            "'{pg}' -D '{data}' >'{dir}/server.log' 2>&1 & read _; \
             pid=$(head -n 1 '{data}/postmaster.pid' 2>/dev/null); \
             [ -n \"$pid\" ] && kill -QUIT $pid 2>/dev/null; wait; i=0; \
             while [ -n \"$pid\" ] && [ $i -lt 100 ] && kill -0 $pid 2>/dev/null; do \
             sleep 0.05; i=$((i+1)); done; rm -rf '{dir}'",
            pg = bindir.join("postgres").display(),
            data = data.display(),
            dir = dir.display(),
        );
        let mut sh = command_as(Path::new("/bin"), "sh", run_as);
        sh.args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = sh
            .spawn()
            .map_err(|e| format!("cannot start postgres: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let cluster = Cluster {
            dir,
            socket_dir,
            port,
            bindir,
            run_as,
            guard: Mutex::new(Some((child, stdin))),
        };
        cluster.wait_ready()?;
        create_template(&format!(
            "host={} port={port} user={SUPERUSER}",
            cluster.socket_dir.display()
        ))?;
        Ok(cluster)
    }

    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.client("postgres") {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let mut log = String::new();
                    let _ = std::fs::File::open(self.dir.join("server.log"))
                        .and_then(|mut f| f.read_to_string(&mut log));
                    return Err(format!("PostgreSQL did not start: {e}\n{log}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// A key-value connection string to `db` over the socket.
    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={} user={SUPERUSER} dbname={db}",
            self.socket_dir.display(),
            self.port
        )
    }

    pub fn client(&self, db: &str) -> Result<postgres::Client, String> {
        postgres::Client::connect(&self.conninfo(db), postgres::NoTls)
            .map_err(|e| format!("cannot connect to {db}: {e}"))
    }

    /// A new database copied from the template; its name.
    pub fn create_database(&self) -> Result<String, String> {
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{}_{n}", std::process::id());
        self.client("postgres")?
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}"))
            .map_err(|e| format!("cannot create database {name}: {e}"))?;
        Ok(name)
    }

    /// Runs one of the cluster's programs (`pg_ctl`, `psql`, …) as the cluster's user.
    pub fn command(&self, name: &str) -> Command {
        command_as(&self.bindir, name, self.run_as)
    }

    /// Stops the server with `pg_ctl stop -m <mode>` (`smart`, `fast`, `immediate`) and waits
    /// until it is gone; the directory stays, for [`Cluster::start_server`].
    pub fn stop_server(&self, mode: &str) -> Result<(), String> {
        let data = self.data_dir();
        self.pg_ctl(&["stop", "-D", &data.display().to_string(), "-m", mode, "-w"])
    }

    /// Starts the server again on the same directory, port and socket directory (they are in its
    /// `postgresql.conf`), its output appended to the log, and waits until it takes connections.
    /// The guard stops it as it stops the first.
    pub fn start_server(&self) -> Result<(), String> {
        let data = self.data_dir();
        let log = self.dir.join("server.log");
        self.pg_ctl(&[
            "start",
            "-D",
            &data.display().to_string(),
            "-l",
            &log.display().to_string(),
            "-w",
        ])?;
        self.wait_ready()
    }

    /// [`Cluster::stop_server`] with `mode`, then [`Cluster::start_server`].
    pub fn restart(&self, mode: &str) -> Result<(), String> {
        self.stop_server(mode)?;
        self.start_server()
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let out = self
            .command("pg_ctl")
            .args(args)
            .args(["-t", &START_TIMEOUT.as_secs().to_string()])
            .stdin(Stdio::null())
            .current_dir(&self.dir)
            .output()
            .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl {}: {}{}\n{}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            ));
        }
        Ok(())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// A cluster that outlives the process that made it (`smp-load pg-start`, for benchmarks that
/// span several commands): made in `dir` if it has none, started with `pg_ctl`, stopped by
/// [`stop_detached`]. Returns its base connection string (socket and port, no database).
pub fn start_detached(dir: &Path, opts: &ClusterOptions) -> Result<String, String> {
    let bindir = bindir()?;
    let run_as = run_as()?;
    let data = dir.join("data");
    let socket_dir = dir.join("sock");
    make_dirs(dir, &socket_dir, run_as)?;
    let port_file = dir.join("port");
    if !data.exists() {
        let port = free_port()?;
        let mut conf = base_conf(port, &socket_dir, false);
        conf.extend(opts.conf.iter().cloned());
        init_data(&bindir, run_as, &data, false, &conf)?;
        std::fs::write(&port_file, port.to_string())
            .map_err(|e| format!("cannot write {}: {e}", port_file.display()))?;
    }
    let port: u16 = std::fs::read_to_string(&port_file)
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| format!("{} is missing", port_file.display()))?;
    let out = command_as(&bindir, "pg_ctl", run_as)
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("server.log"))
        .args(["-w", "start"])
        .output()
        .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pg_ctl start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let base = format!("host={} port={port} user={SUPERUSER}", socket_dir.display());
    let mut c = postgres::Client::connect(&format!("{base} dbname=postgres"), postgres::NoTls)
        .map_err(|e| format!("cannot connect: {e}"))?;
    let has_template: bool = c
        .query_one(
            "SELECT count(*) > 0 FROM pg_database WHERE datname = $1",
            &[&TEMPLATE_DB],
        )
        .map_err(|e| e.to_string())?
        .get(0);
    if !has_template {
        create_template(&base)?;
    }
    std::fs::write(dir.join("conninfo"), &base)
        .map_err(|e| format!("cannot write {}/conninfo: {e}", dir.display()))?;
    Ok(base)
}

/// The base connection string and the postmaster's process ID of a cluster [`start_detached`]
/// made in `dir`.
pub fn detached(dir: &Path) -> Result<(String, u32), String> {
    let base = std::fs::read_to_string(dir.join("conninfo")).map_err(|e| {
        format!(
            "{}: no cluster (start one with `smp-load pg-start --dir {}`): {e}",
            dir.display(),
            dir.display()
        )
    })?;
    let pid = std::fs::read_to_string(dir.join("data").join("postmaster.pid"))
        .ok()
        .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
        .ok_or_else(|| format!("{}: the cluster is not running", dir.display()))?;
    Ok((base.trim().to_string(), pid))
}

/// Stops a cluster [`start_detached`] started.
pub fn stop_detached(dir: &Path) -> Result<(), String> {
    let bindir = bindir()?;
    let out = command_as(&bindir, "pg_ctl", run_as()?)
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-m", "fast", "-w", "stop"])
        .output()
        .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let taken = self.guard.lock().ok().and_then(|mut g| g.take());
        if let Some((mut child, stdin)) = taken {
            drop(stdin);
            let _ = child.wait();
        }
    }
}
