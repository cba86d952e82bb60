//! Test harness: runs the real `smp-relay` binary as a child process on a fresh data directory and a
//! free port, and connects clients to it. The relay is killed and its directory removed on drop.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use smp_relay::client::{Client, ClientError, ClientOptions};
use smp_relay::transport::tls::ClientSuites;

pub const BIN: &str = env!("CARGO_BIN_EXE_smp-relay");
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Every test sleeps through this: with `SMP_TEST_SLEEP_LOG=FILE` each sleep appends `<test
/// binary> <seconds> <test>` to FILE (the test is the thread's name, `-` on a thread the test
/// spawned), so that the time the suite spends sleeping can be summed (README). Polling loops call it for each short pause, so only what they actually slept counts.
pub fn sleep(d: Duration) {
    std::thread::sleep(d);
    if let Some(path) = std::env::var_os("SMP_TEST_SLEEP_LOG") {
        use std::io::Write;
        let exe = std::env::current_exe().ok();
        let name = exe
            .as_deref()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .map(|n| n.rsplit_once('-').map_or(n, |(base, _)| base))
            .unwrap_or("?");
        // One short append per sleep: lines from parallel tests do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let test = std::thread::current().name().unwrap_or("-").to_string();
            let line = format!("{name} {:.6} {test}\n", d.as_secs_f64());
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// A fresh directory under the system temp dir, removed on drop (the load generator's, so that
/// both make and clean them the same way).
pub use smp_relay::load::proc::TempDir;

/// Runs `smp-relay --data-dir DIR <args>` to completion (bounded by `COMMAND_TIMEOUT`).
pub fn run_cli(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--data-dir", dir.to_str().expect("utf-8 temp path")];
    all.extend_from_slice(args);
    run_bin(&all)
}

/// Runs the binary with these arguments and the reference's directory variables
/// (`SMP_SERVER_CFG_PATH`, `SMP_SERVER_LOG_PATH`), killing it after `COMMAND_TIMEOUT`.
pub fn run_with_reference_env(cfg: &Path, log: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.env("SMP_SERVER_CFG_PATH", cfg)
        .env("SMP_SERVER_LOG_PATH", log);
    run_to_end(cmd.args(args))
}

/// Runs the binary with these exact arguments, killing it after `COMMAND_TIMEOUT`.
pub fn run_bin(args: &[&str]) -> Output {
    run_to_end(Command::new(BIN).args(args))
}

/// Runs `cmd` without stdin, its output piped, killing it after `COMMAND_TIMEOUT`.
fn run_to_end(cmd: &mut Command) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn smp-relay");
    wait_output(child, COMMAND_TIMEOUT)
}

/// Waits until `child` exits or `timeout` passes, without sleeping: poll(2) on a pidfd of the
/// process, which becomes readable when it exits (Linux 5.3+); then reaps it. `None`: still
/// running at the deadline.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    if let Some(s) = child.try_wait().expect("try_wait") {
        return Some(s);
    }
    // SAFETY: pidfd_open(2) on our own child's pid, not reaped yet (try_wait above returned
    // None and nothing else reaps it); the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) } as i32;
    assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 || left.is_zero() {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            break;
        }
    }
    // SAFETY: `fd` is the pidfd opened above, closed once.
    unsafe { libc::close(fd) };
    child.try_wait().expect("try_wait")
}

/// Waits for a child with piped stdout/stderr; kills it after `timeout`.
pub fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let Some(status) = wait_exit(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("smp-relay did not exit within {timeout:?}");
    };
    let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Output {
        status,
        stdout: join(out),
        stderr: join(err),
    }
}

fn drain<R: std::io::Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// `smp-relay init --host 127.0.0.1 --no-password` in `dir`; returns the key hash from `fingerprint`.
pub fn init(dir: &Path) -> [u8; 32] {
    let out = run_cli(dir, &["init", "--host", "127.0.0.1", "--no-password"]);
    assert!(
        out.status.success(),
        "init failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    read_fingerprint(dir)
}

pub fn read_fingerprint(dir: &Path) -> [u8; 32] {
    proc::read_fingerprint(dir).expect("a fingerprint file of base64url of 32 bytes")
}

pub fn decode_fingerprint(s: &str) -> Option<[u8; 32]> {
    proc::decode_key_hash(s).ok()
}

pub fn free_port() -> u16 {
    proc::free_port().expect("bind an ephemeral port")
}

/// The relay's stderr lines, shared with the thread that drains them.
use smp_relay::load::proc::{self, SharedLog};

/// How to start the relay.
#[derive(Clone, Debug)]
pub struct RelayOptions {
    pub cores: usize,
    pub extra_args: Vec<String>,
}

impl Default for RelayOptions {
    /// One shard, unless `SMP_RELAY_TEST_CORES` says otherwise: CI runs the queue suites once more
    /// with 2 so that every scenario also crosses shards.
    fn default() -> Self {
        RelayOptions {
            cores: std::env::var("SMP_RELAY_TEST_CORES")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1),
            extra_args: Vec::new(),
        }
    }
}

/// A running relay: child process, its data directory, address and identity.
pub struct Relay {
    child: Child,
    pub port: u16,
    pub addr: SocketAddr,
    pub key_hash: [u8; 32],
    log: SharedLog,
    opts: RelayOptions,
    // Dropped after the child is killed (field order).
    pub dir: TempDir,
}

impl Relay {
    /// One shard, no extra options.
    pub fn start() -> Relay {
        Self::start_with(RelayOptions::default())
    }

    pub fn start_with(opts: RelayOptions) -> Relay {
        let dir = TempDir::new("relay").expect("a temp dir");
        init(dir.path());
        Self::start_in(dir, opts)
    }

    /// Starts a relay on `dir`, a data directory that already holds an identity (keys and
    /// `fingerprint`), e.g. one a test filled with `store import`.
    /// With `--config-dir C` among `opts.extra_args`, the identity is in C and `dir` holds the
    /// data only (the reference's two directories).
    pub fn start_in(dir: TempDir, opts: RelayOptions) -> Relay {
        let config_dir = opts
            .extra_args
            .iter()
            .position(|a| a == "--config-dir")
            .and_then(|i| opts.extra_args.get(i + 1))
            .map(PathBuf::from);
        let key_hash = read_fingerprint(config_dir.as_deref().unwrap_or(dir.path()));
        // The port is chosen before the relay binds it; another process may take it in between, so
        // a failed start is retried on a new port.
        let mut last_err = String::new();
        for _ in 0..3 {
            let port = free_port();
            match spawn(dir.path(), port, &opts) {
                Ok((child, log)) => {
                    return Relay {
                        child,
                        port,
                        addr: SocketAddr::from(([127, 0, 0, 1], port)),
                        key_hash,
                        log,
                        opts,
                        dir,
                    }
                }
                Err(e) => last_err = e,
            }
        }
        panic!("relay did not start: {last_err}");
    }

    /// A clean stop: SIGTERM, then waits (bounded by `COMMAND_TIMEOUT`) for the relay to save its
    /// store and exit. Returns the exit status.
    pub fn stop(&mut self) -> ExitStatus {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        match wait_exit(&mut self.child, COMMAND_TIMEOUT) {
            Some(s) => s,
            None => panic!(
                "relay did not stop within {COMMAND_TIMEOUT:?}:\n{}",
                self.log_text()
            ),
        }
    }

    /// Starts the relay again on the same data directory and port, with `extra_args` instead of the
    /// ones it was started with (the previous run must have stopped).
    pub fn restart_with(&mut self, extra_args: &[&str]) {
        self.opts.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        // The stopped relay's listening sockets can outlive its process for a moment (io_uring
        // releases them asynchronously), so a start at once may find the port taken: retry briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match spawn(self.dir.path(), self.port, &self.opts) {
                Ok((child, log)) => {
                    self.child = child;
                    self.log = log;
                    return;
                }
                Err(e) if e.contains("in use") && Instant::now() < deadline => {
                    sleep(Duration::from_millis(50))
                }
                Err(e) => panic!("relay did not restart: {e}"),
            }
        }
    }

    /// A crash: SIGKILL, then waits for the process to end.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// One start on the same data directory, port and options, without `restart_with`'s retries:
    /// for tests of what a supervisor restarting the relay at once gets.
    pub fn restart_once(&mut self) -> Result<(), String> {
        let (child, log) = spawn(self.dir.path(), self.port, &self.opts)?;
        self.child = child;
        self.log = log;
        Ok(())
    }

    /// Runs `start` on this relay's data directory and port with `extra_args` to its end (the relay
    /// must be stopped), for starts that must fail; killed after `COMMAND_TIMEOUT`.
    pub fn failed_start(&self, extra_args: &[&str]) -> Output {
        let port = self.port.to_string();
        let cores = self.opts.cores.to_string();
        let mut args = vec!["start", "--port", &port, "--cores", &cores];
        let given: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        let store = store_args(self.dir.path(), &given);
        args.extend(store.iter().map(String::as_str));
        args.extend_from_slice(extra_args);
        run_cli(self.dir.path(), &args)
    }

    /// Shards of the next `restart` (the saved store is split by partition group, not by shard).
    pub fn set_cores(&mut self, cores: usize) {
        self.opts.cores = cores;
    }

    /// Starts the relay again on the same data directory, port and options.
    pub fn restart(&mut self) {
        let args = self.opts.extra_args.clone();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.restart_with(&args);
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Anonymous resident memory of the relay process (`RssAnon` in /proc/PID/status), in KB.
    pub fn rss_anon_kb(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("RssAnon line")
    }

    /// A client with `opts`; one that offers the apps' TLS suite offers the suites of
    /// `test_client_suites` instead.
    pub fn connect(&self, opts: ClientOptions) -> Result<Client, ClientError> {
        Client::connect(self.addr, self.key_hash, with_test_suites(opts))
    }

    /// A default client (v18, encrypted blocks); panics with the relay log if it fails.
    pub fn client(&self) -> Client {
        self.connect(ClientOptions::default())
            .unwrap_or_else(|e| panic!("connect: {e}\nrelay log:\n{}", self.log_text()))
    }

    /// The samples of the metrics file (`--metrics-interval`), by name with labels; empty before
    /// the first write.
    pub fn metrics(&self) -> std::collections::HashMap<String, u64> {
        let text = std::fs::read_to_string(self.dir.path().join("smp-server-metrics.txt"))
            .unwrap_or_default();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let mut parts = l.split_whitespace();
                let name = parts.next()?.to_string();
                let value = parts.next()?.parse().ok()?;
                Some((name, value))
            })
            .collect()
    }

    /// Waits (at most 15 s) until the metrics file satisfies `done`; returns its samples. Each
    /// look first makes the relay publish (`publish_metrics`), so that the wait is for the relay's
    /// numbers, not for its next `--metrics-interval` (the relay must have one).
    pub fn metrics_until(
        &self,
        what: &str,
        done: impl Fn(&std::collections::HashMap<String, u64>) -> bool,
    ) -> std::collections::HashMap<String, u64> {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            self.publish_metrics();
            let m = self.metrics();
            if done(&m) {
                return m;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "metrics never showed {what}: {m:?}"
            );
            sleep(Duration::from_millis(20));
        }
    }

    /// As `metrics_until`, moving the relay's clock `secs` forward before each look: a wait for
    /// what the relay does once time has passed on its clock (the slow-reader close,
    /// `src/server/conn/mod.rs`), which may not have started counting yet at the first look.
    pub fn metrics_advancing(
        &self,
        secs: u32,
        what: &str,
        done: impl Fn(&std::collections::HashMap<String, u64>) -> bool,
    ) -> std::collections::HashMap<String, u64> {
        self.metrics_until(what, |m| {
            if done(m) {
                return true;
            }
            self.advance_clock(secs);
            false
        })
    }

    /// Moves the relay's clock `secs` seconds forward (`src/server/shard/clock_control.rs`); returns once
    /// the relay has applied it. Nothing runs because of it: see [`Relay::run_expiration`].
    pub fn advance_clock(&self, secs: u32) {
        self.clock_control(&format!("advance {secs}"));
    }

    /// Makes every shard run its periodic expiration now; returns once all have finished.
    pub fn run_expiration(&self) {
        self.clock_control("expire");
    }

    /// Makes every shard publish its numbers now; returns once the metrics file holds them all.
    pub fn publish_metrics(&self) {
        self.clock_control("metrics");
    }

    /// Makes shard 0 write the daily statistics line if it is due on the relay's clock
    /// (`log_stats`); returns once it is written.
    pub fn write_daily_stats(&self) {
        self.clock_control("stats-log");
    }

    /// Blocks shard `shard`'s thread (not 0) until `release_shard`, as a shard busy with its own
    /// work: it takes nothing from its inbox meanwhile. Returns once the shard is held.
    pub fn hold_shard(&self, shard: usize) {
        self.clock_control(&format!("hold {shard}"));
    }

    pub fn release_shard(&self) {
        self.clock_control("release");
    }

    /// Sends one command on the relay's clock-control socket and asserts its `ok`.
    fn clock_control(&self, command: &str) {
        use std::io::{Read, Write};
        let path = clock_socket(self.dir.path());
        let mut s = std::os::unix::net::UnixStream::connect(&path)
            .unwrap_or_else(|e| panic!("clock control {path:?}: {e}"));
        s.set_read_timeout(Some(COMMAND_TIMEOUT))
            .expect("read timeout");
        s.write_all(format!("{command}\n").as_bytes())
            .expect("send a clock command");
        let mut answer = String::new();
        s.read_to_string(&mut answer)
            .expect("the clock command's answer");
        assert_eq!(
            answer,
            "ok\n",
            "clock command {command:?}; relay log:\n{}",
            self.log_text()
        );
    }

    /// Connects, PINGs and expects PONG: the relay still serves clients.
    pub fn assert_serves(&self) {
        let mut c = self.client();
        let r = c.ping().expect("PING");
        assert_eq!(r.msg, Ok(smp_relay::protocol::response::BrokerMsg::Pong));
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn log_text(&self) -> String {
        self.log_lines().join("\n")
    }

    /// Whether the relay's log shows `text` within 5 s: its lines are read from a pipe by another
    /// thread, so a line the relay wrote before an answer may be read after it.
    pub fn log_shows(&self, text: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if self.log_text().contains(text) {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// The relay's rate-limited warnings about `what` (`log_limit`): how many lines, and
    /// how many warnings they stand for (each line itself, unless it only reports a count, plus
    /// its `suppressed=N`).
    pub fn warnings(&self, what: &str) -> (usize, u64) {
        let lines: Vec<String> = self
            .log_lines()
            .iter()
            .map(|l| strip_ansi(l))
            .filter(|l| l.contains(what))
            .collect();
        let warnings = lines
            .iter()
            .map(|l| {
                let suppressed: u64 = l
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("suppressed="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                u64::from(!l.contains("were not logged")) + suppressed
            })
            .sum();
        (lines.len(), warnings)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test binary's throwaway PostgreSQL cluster (`smp_relay::store::postgres::cluster`), started
/// at first use and removed when the binary exits. Fails the test, naming the package to install,
/// when the server binaries are missing.
pub fn pg_cluster() -> &'static smp_relay::store::postgres::cluster::Cluster {
    use smp_relay::store::postgres::cluster::{Cluster, ClusterOptions};
    static CLUSTER: std::sync::OnceLock<Cluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| {
        Cluster::start(&ClusterOptions::default())
            .unwrap_or_else(|e| panic!("cannot start the test PostgreSQL cluster: {e}"))
    })
}

/// A connection string to a new database of the test binary's cluster.
pub fn pg_database() -> String {
    let c = pg_cluster();
    let db = c.create_database().expect("create a test database");
    c.conninfo(&db)
}

/// The TLS suites the tests' clients offer where a test does not choose: the apps' (ChaCha20-Poly1305
/// alone), or with `SMP_RELAY_TEST_TLS=web` the web clients' (AES-GCM first), so that CI runs the
/// queue suites once with each.
pub fn test_client_suites() -> ClientSuites {
    match std::env::var("SMP_RELAY_TEST_TLS").as_deref() {
        Ok("web") => ClientSuites::Web,
        Ok("apps") | Err(_) => ClientSuites::Apps,
        Ok(other) => panic!("SMP_RELAY_TEST_TLS={other}: use apps or web"),
    }
}

/// `opts` offering `test_client_suites` when it offers the apps' suite (the default).
pub fn with_test_suites(mut opts: ClientOptions) -> ClientOptions {
    if opts.tls_suites == ClientSuites::Apps {
        opts.tls_suites = test_client_suites();
    }
    opts
}

/// The suite a relay picks for a client offering `suites` (it takes the client's order).
pub fn negotiated_suite(suites: ClientSuites) -> rustls::CipherSuite {
    match suites {
        ClientSuites::Apps => rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        ClientSuites::Web => rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
    }
}

/// `SMP_RELAY_TEST_STORE` (journal, memory, postgres) picks the store of relays whose test does
/// not (`given` has no `--store`): CI runs the queue suites on each store. A relay on postgres gets
/// a database of its own in this test binary's cluster, kept for the directory's later starts.
fn store_args(dir: &Path, given: &[String]) -> Vec<String> {
    let Ok(store) = std::env::var("SMP_RELAY_TEST_STORE") else {
        return Vec::new();
    };
    if given.iter().any(|a| a.starts_with("--store")) {
        return Vec::new();
    }
    let mut args = vec!["--store".to_string(), store.clone()];
    if store == "postgres" && !given.iter().any(|a| a == "--database") {
        args.extend(["--database".to_string(), database_for(dir)]);
    }
    args
}

/// The database of the relay on `dir`: made at its first start, the same at later ones (a file in
/// the directory remembers it).
fn database_for(dir: &Path) -> String {
    let remembered = dir.join("test-database");
    if let Ok(s) = std::fs::read_to_string(&remembered) {
        return s;
    }
    let conninfo = pg_database();
    std::fs::write(&remembered, &conninfo).expect("remember the test database");
    conninfo
}

/// Where every test relay serves its clock control (`--test-clock-control`).
fn clock_socket(dir: &Path) -> PathBuf {
    dir.join("clock.sock")
}

fn spawn(dir: &Path, port: u16, opts: &RelayOptions) -> Result<(Child, SharedLog), String> {
    let port_s = port.to_string();
    let cores = opts.cores.to_string();
    let clock = clock_socket(dir);
    let mut args = vec![
        "--data-dir",
        dir.to_str().expect("utf-8 temp path"),
        "start",
        "--port",
        &port_s,
        "--cores",
        &cores,
        "--test-clock-control",
        clock.to_str().expect("utf-8 temp path"),
    ];
    let store = store_args(dir, &opts.extra_args);
    args.extend(store.iter().map(String::as_str));
    args.extend(opts.extra_args.iter().map(String::as_str));
    let child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    proc::wait_listening(child, START_TIMEOUT)
}

/// A TCP connection to `addr` from the loopback address `src` (127.0.0.2, …): the relay sees
/// another client address, though every test runs on 127.0.0.1.
pub fn tcp_from(src: std::net::Ipv4Addr, addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(dst) = addr else {
        return Err(std::io::Error::other("an IPv4 relay address"));
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket whose descriptor is owned by the TcpStream made from it (closed on
    // drop, or here on error); bind and connect read a sockaddr_in that lives for the call.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = std::net::TcpStream::from_raw_fd(fd);
        let from = sockaddr(src, 0);
        if libc::bind(fd, &from as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let to = sockaddr(*dst.ip(), dst.port());
        if libc::connect(fd, &to as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// A log line without its terminal colours.
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ … letter
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads `D/<name>` PEM and returns the DER of its first certificate.
pub fn cert_der(dir: &Path, name: &str) -> Vec<u8> {
    let pem = std::fs::read(dir.join(name)).expect("read cert");
    let mut rd = std::io::Cursor::new(pem);
    let der = rustls_pemfile::certs(&mut rd)
        .next()
        .expect("a certificate")
        .expect("valid PEM");
    der.as_ref().to_vec()
}

// ---------------------------------------------------------------------------------------------------
// Hand-written wire helpers: an independent view of the protocol (OpenSSL for TLS, byte layouts of
// simplexmq `Transport.hs` and `Protocol.hs` written out here), so that a bug shared by the relay
// and the crate's own codecs cannot hide.

pub mod wire {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    use openssl::ssl::{Ssl, SslContext, SslMethod, SslStream, SslVerifyMode, SslVersion};

    pub const BLOCK: usize = 16384;
    pub const X25519_SPKI_PREFIX: [u8; 12] = [
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00,
    ];
    pub const ED25519_ALG_ID: [u8; 7] = [0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70];

    /// TLS through OpenSSL, offering `alpn` (no extension when `None`), no SNI, no certificate
    /// verification (the SMP layer checks the identity). `tls12` pins TLS 1.2 instead of 1.3.
    /// The reference client offers ChaCha20-Poly1305 only (simplexmq `Transport.hs`).
    pub fn openssl_connect(
        addr: SocketAddr,
        alpn: Option<&[&[u8]]>,
        tls12: bool,
    ) -> Result<SslStream<TcpStream>, String> {
        openssl_connect_suites(addr, alpn, tls12, "TLS_CHACHA20_POLY1305_SHA256")
    }

    /// As `openssl_connect`, offering these TLS 1.3 suites (OpenSSL names, ':'-separated).
    pub fn openssl_connect_suites(
        addr: SocketAddr,
        alpn: Option<&[&[u8]]>,
        tls12: bool,
        suites: &str,
    ) -> Result<SslStream<TcpStream>, String> {
        openssl_connect_with(addr, alpn, tls12, suites, None)
    }

    /// As `openssl_connect_suites`, with an explicit key-exchange group list (OpenSSL sends a key
    /// share for the first one only).
    pub fn openssl_connect_with(
        addr: SocketAddr,
        alpn: Option<&[&[u8]]>,
        tls12: bool,
        suites: &str,
        groups: Option<&str>,
    ) -> Result<SslStream<TcpStream>, String> {
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        openssl_over(tcp, alpn, tls12, suites, groups)
    }

    /// TLS as `openssl_connect_with`, over a TCP connection the caller opened (from another
    /// source address, say).
    pub fn openssl_over(
        tcp: TcpStream,
        alpn: Option<&[&[u8]]>,
        tls12: bool,
        suites: &str,
        groups: Option<&str>,
    ) -> Result<SslStream<TcpStream>, String> {
        openssl_over_named(tcp, alpn, tls12, suites, groups, None)
    }

    /// TLS 1.3 to `addr` naming `host` (SNI), as a browser does, offering `alpn`.
    pub fn openssl_connect_sni(
        addr: SocketAddr,
        alpn: &[&[u8]],
        host: &str,
    ) -> Result<SslStream<TcpStream>, String> {
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        let suites = "TLS_CHACHA20_POLY1305_SHA256";
        openssl_over_named(tcp, Some(alpn), false, suites, None, Some(host))
    }

    /// `openssl_over`, naming `host` in the ClientHello (SNI) when given.
    pub fn openssl_over_named(
        tcp: TcpStream,
        alpn: Option<&[&[u8]]>,
        tls12: bool,
        suites: &str,
        groups: Option<&str>,
        host: Option<&str>,
    ) -> Result<SslStream<TcpStream>, String> {
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        // A bare context: no CA store to load (the SMP layer checks the identity), no SNI unless
        // a host is given.
        let mut b = SslContext::builder(SslMethod::tls_client()).map_err(|e| e.to_string())?;
        b.set_verify(SslVerifyMode::NONE);
        let v = if tls12 {
            SslVersion::TLS1_2
        } else {
            SslVersion::TLS1_3
        };
        b.set_min_proto_version(Some(v))
            .map_err(|e| e.to_string())?;
        b.set_max_proto_version(Some(v))
            .map_err(|e| e.to_string())?;
        b.set_ciphersuites(suites).map_err(|e| e.to_string())?;
        if let Some(g) = groups {
            b.set_groups_list(g).map_err(|e| e.to_string())?;
        }
        if let Some(protos) = alpn {
            let mut wire = Vec::new();
            for p in protos {
                wire.push(p.len() as u8);
                wire.extend_from_slice(p);
            }
            b.set_alpn_protos(&wire).map_err(|e| e.to_string())?;
        }
        let mut ssl = Ssl::new(&b.build()).map_err(|e| e.to_string())?;
        if let Some(h) = host {
            ssl.set_hostname(h).map_err(|e| e.to_string())?;
        }
        ssl.connect(tcp).map_err(|e| e.to_string())
    }

    /// The client's own Finished verify_data (tls-unique), as OpenSSL computed it.
    pub fn own_finished(s: &SslStream<TcpStream>) -> Vec<u8> {
        let mut buf = [0u8; 64];
        let n = s.ssl().finished(&mut buf);
        buf[..n].to_vec()
    }

    /// DER of the certificates the server presented in TLS, leaf first.
    pub fn tls_chain(s: &SslStream<TcpStream>) -> Vec<Vec<u8>> {
        s.ssl()
            .peer_cert_chain()
            .map(|st| st.iter().map(|c| c.to_der().expect("cert DER")).collect())
            .unwrap_or_default()
    }

    pub fn read_block<R: Read>(r: &mut R) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; BLOCK];
        r.read_exact(&mut b)?;
        Ok(b)
    }

    /// `Word16 len ‖ content ‖ '#'…` to `size` bytes.
    pub fn pad(content: &[u8], size: usize) -> Vec<u8> {
        assert!(content.len() + 2 <= size);
        let mut b = Vec::with_capacity(size);
        b.extend_from_slice(&(content.len() as u16).to_be_bytes());
        b.extend_from_slice(content);
        b.resize(size, b'#');
        b
    }

    pub fn unpad(block: &[u8]) -> &[u8] {
        let n = u16::from_be_bytes([block[0], block[1]]) as usize;
        &block[2..2 + n]
    }

    /// The server hello (simplexmq `Transport.hs`, `SMPServerHandshake`), parsed byte by byte.
    #[derive(Debug)]
    pub struct Hello {
        pub min: u16,
        pub max: u16,
        pub session_id: Vec<u8>,
        pub chain: Vec<Vec<u8>>,
        pub signed_key: Vec<u8>,
        /// Bytes after the last known field (allowed, ignored by clients).
        pub trailing: usize,
        /// Those bytes (a web identity proof, when the client sent a challenge).
        pub tail: Vec<u8>,
    }

    pub fn parse_hello(content: &[u8]) -> Hello {
        let word16 = |p: usize| u16::from_be_bytes([content[p], content[p + 1]]);
        let min = word16(0);
        let max = word16(2);
        let sid_len = content[4] as usize;
        let session_id = content[5..5 + sid_len].to_vec();
        let mut p = 5 + sid_len;
        let mut chain = Vec::new();
        let mut signed_key = Vec::new();
        if max >= 7 {
            let count = content[p] as usize;
            p += 1;
            for _ in 0..count {
                let n = word16(p) as usize;
                chain.push(content[p + 2..p + 2 + n].to_vec());
                p += 2 + n;
            }
            let n = word16(p) as usize;
            signed_key = content[p + 2..p + 2 + n].to_vec();
            p += 2 + n;
        }
        Hello {
            min,
            max,
            session_id,
            chain,
            signed_key,
            trailing: content.len() - p,
            tail: content[p..].to_vec(),
        }
    }

    /// Checks the 120-byte signed X25519 key (simplexmq `Crypto.hs`) against the leaf certificate's
    /// Ed25519 key and returns the raw X25519 public key.
    pub fn verify_signed_key(signed: &[u8], leaf_der: &[u8]) -> [u8; 32] {
        assert_eq!(signed.len(), 120, "signed key length");
        assert_eq!(&signed[..2], &[0x30, 0x76], "outer SEQUENCE");
        let spki = &signed[2..46];
        assert_eq!(&spki[..12], &X25519_SPKI_PREFIX, "X25519 SPKI");
        assert_eq!(&signed[46..53], &ED25519_ALG_ID, "Ed25519 algorithm id");
        assert_eq!(
            &signed[53..56],
            &[0x03, 0x41, 0x00],
            "BIT STRING of 64 bytes"
        );
        let sig = &signed[56..120];
        let leaf = openssl::x509::X509::from_der(leaf_der).expect("leaf DER");
        let key = leaf.public_key().expect("leaf key");
        assert_eq!(key.id(), openssl::pkey::Id::ED25519, "leaf key is Ed25519");
        let mut v = openssl::sign::Verifier::new_without_digest(&key).expect("verifier");
        assert!(
            v.verify_oneshot(sig, spki).expect("verify"),
            "signed key does not verify with the leaf key"
        );
        spki[12..].try_into().expect("32 bytes")
    }

    /// Whether `sig` is the leaf certificate's Ed25519 signature of `data`.
    pub fn leaf_signed(sig: &[u8], data: &[u8], leaf_der: &[u8]) -> bool {
        let leaf = openssl::x509::X509::from_der(leaf_der).expect("leaf DER");
        let key = leaf.public_key().expect("leaf key");
        let mut v = openssl::sign::Verifier::new_without_digest(&key).expect("verifier");
        v.verify_oneshot(sig, data).unwrap_or(false)
    }

    /// The client hello (simplexmq `Transport.hs`, `SMPClientHandshake`), byte by byte: `Word16 v,
    /// shortString keyHash, [shortString SPKI], [Bool proxy], [Maybe service]`. Optional parts are
    /// written exactly as given.
    pub fn client_hello(
        v: u16,
        key_hash: &[u8],
        key_spki: Option<&[u8]>,
        proxy: Option<bool>,
        service: Option<&[u8]>,
    ) -> Vec<u8> {
        let mut h = v.to_be_bytes().to_vec();
        h.push(key_hash.len() as u8);
        h.extend_from_slice(key_hash);
        if let Some(k) = key_spki {
            h.push(k.len() as u8);
            h.extend_from_slice(k);
        }
        if let Some(p) = proxy {
            h.push(if p { b'T' } else { b'F' });
        }
        if let Some(s) = service {
            h.extend_from_slice(s);
        }
        h
    }

    /// The hello an ordinary client sends at `v` (no key unless given).
    pub fn standard_hello(v: u16, key_hash: &[u8], key_spki: Option<&[u8]>) -> Vec<u8> {
        client_hello(
            v,
            key_hash,
            if v >= 7 { key_spki } else { None },
            (v >= 14).then_some(false),
            (v >= 16).then_some(&b"0"[..]),
        )
    }

    /// One transmission with empty authorization (simplexmq `Protocol.hs`): `00 [sessionId] corrId
    /// entityId command`.
    pub fn transmission(
        v: u16,
        session_id: &[u8],
        corr_id: &[u8],
        entity: &[u8],
        cmd: &[u8],
    ) -> Vec<u8> {
        let mut t = vec![0u8];
        if v < 7 {
            t.push(session_id.len() as u8);
            t.extend_from_slice(session_id);
        }
        t.push(corr_id.len() as u8);
        t.extend_from_slice(corr_id);
        t.push(entity.len() as u8);
        t.extend_from_slice(entity);
        t.extend_from_slice(cmd);
        t
    }

    /// A batch of one (simplexmq `Protocol.hs`): `01 ‖ Large(t)`.
    pub fn batch1(t: &[u8]) -> Vec<u8> {
        let mut c = vec![1u8];
        c.extend_from_slice(&(t.len() as u16).to_be_bytes());
        c.extend_from_slice(t);
        c
    }

    /// simplexmq `Crypto.hs` `sbcInit`: `(ck1, ck2)` from the session id and the DH secret.
    pub fn chain_init(session_id: &[u8], secret: &[u8; 32]) -> ([u8; 32], [u8; 32]) {
        let hk = hkdf::Hkdf::<sha2::Sha512>::new(Some(session_id), secret);
        let mut okm = [0u8; 64];
        hk.expand(b"SimpleXSbChainInit", &mut okm).expect("hkdf");
        (
            okm[..32].try_into().expect("32"),
            okm[32..].try_into().expect("32"),
        )
    }

    /// simplexmq `Crypto.hs` `sbcHkdf`: advances `ck`, returns the block key and nonce.
    pub fn chain_step(ck: &mut [u8; 32]) -> ([u8; 32], [u8; 24]) {
        let hk = hkdf::Hkdf::<sha2::Sha512>::new(Some(&[]), ck);
        let mut okm = [0u8; 88];
        hk.expand(b"SimpleXSbChain", &mut okm).expect("hkdf");
        ck.copy_from_slice(&okm[..32]);
        (
            okm[32..64].try_into().expect("32"),
            okm[64..].try_into().expect("24"),
        )
    }

    /// SXbox (simplexmq `Crypto.hs`): secretbox keyed with HSalsa20(key, 0^16), output
    /// `tag ‖ ciphertext`.
    pub fn sxbox_seal(key: &[u8; 32], nonce: &[u8; 24], msg: &[u8]) -> Vec<u8> {
        use xsalsa20poly1305::aead::{Aead, KeyInit};
        let cipher = xsalsa20poly1305::XSalsa20Poly1305::new(&hsalsa_key(key).into());
        // This crate already writes `tag ‖ ciphertext`, as NaCl's secretbox_easy does.
        cipher.encrypt(&(*nonce).into(), msg).expect("seal")
    }

    pub fn sxbox_open(key: &[u8; 32], nonce: &[u8; 24], boxed: &[u8]) -> Option<Vec<u8>> {
        use xsalsa20poly1305::aead::{Aead, KeyInit};
        let cipher = xsalsa20poly1305::XSalsa20Poly1305::new(&hsalsa_key(key).into());
        cipher.decrypt(&(*nonce).into(), boxed).ok()
    }

    /// Block encryption (simplexmq `Transport.hs`, `Crypto.hs`) for a client, from the helpers
    /// above.
    pub struct Chains {
        send: [u8; 32],
        recv: [u8; 32],
    }

    impl Chains {
        /// The client's chains: send with ck2, receive with ck1.
        pub fn client(session_id: &[u8], secret: &[u8; 32]) -> Chains {
            let (ck1, ck2) = chain_init(session_id, secret);
            Chains {
                send: ck2,
                recv: ck1,
            }
        }

        pub fn seal(&mut self, content: &[u8]) -> Vec<u8> {
            let (key, nonce) = chain_step(&mut self.send);
            sxbox_seal(&key, &nonce, &pad(content, BLOCK - 16))
        }

        pub fn open(&mut self, block: &[u8]) -> Option<Vec<u8>> {
            let (key, nonce) = chain_step(&mut self.recv);
            let padded = sxbox_open(&key, &nonce, block)?;
            Some(unpad(&padded).to_vec())
        }
    }

    /// SXbox keys a secretbox with HSalsa20(key, 0^16) (simplexmq `Crypto.hs`).
    fn hsalsa_key(key: &[u8; 32]) -> [u8; 32] {
        let out = salsa20::hsalsa::<salsa20::cipher::consts::U10>(key.into(), &[0u8; 16].into());
        out.into()
    }

    /// Writes a whole block and flushes.
    pub fn write_block<W: Write>(w: &mut W, block: &[u8]) -> std::io::Result<()> {
        w.write_all(block)?;
        w.flush()
    }

    /// Reads until EOF or error; returns how many bytes came before it (None on timeout).
    pub fn bytes_until_close<R: Read>(r: &mut R) -> Option<usize> {
        let mut n = 0;
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return Some(n),
                Ok(k) => n += k,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return None
                }
                Err(_) => return Some(n),
            }
        }
    }
}

/// A tmpfs of a given size mounted on a directory (a full disk for save tests); unmounted on drop,
/// also when the test fails. Mounting needs root, as CI runs.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs on {} failed (this test needs root, as CI runs): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }

    /// Grows or shrinks the tmpfs, keeping its files.
    pub fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "resizing the tmpfs on {} to {size}: {}",
            self.0.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy, so that a relay still running in a failed test does not keep it mounted.
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// A web certificate, as an operator's `[WEB] cert` and `key` (simplexmq `Server/Main.hs`): an
/// ordinary RSA certificate for a host name, made here with OpenSSL, unrelated to the relay's SMP
/// identity.
pub mod web {
    use std::path::{Path, PathBuf};

    use openssl::asn1::Asn1Time;
    use openssl::hash::MessageDigest;
    use openssl::pkey::PKey;
    use openssl::rsa::Rsa;
    use openssl::x509::{X509NameBuilder, X509};

    pub const HOST: &str = "relay.test";

    pub struct WebCert {
        pub cert: PathBuf,
        pub key: PathBuf,
        pub der: Vec<u8>,
    }

    impl WebCert {
        /// `start`'s flags that serve it on `port`, an SMP port of the relay.
        pub fn args(&self, port: u16) -> Vec<String> {
            vec![
                "--port".into(),
                port.to_string(),
                "--web-https".into(),
                port.to_string(),
                "--web-cert".into(),
                self.cert.display().to_string(),
                "--web-key".into(),
                self.key.display().to_string(),
            ]
        }
    }

    /// Writes `web.crt` and `web.key` (PEM) into `dir`.
    pub fn write(dir: &Path) -> WebCert {
        let key = PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap();
        let mut name = X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", HOST).unwrap();
        let name = name.build();
        let mut b = X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::days_from_now(30).unwrap())
            .unwrap();
        b.sign(&key, MessageDigest::sha256()).unwrap();
        let x509 = b.build();
        let (cert, key_path) = (dir.join("web.crt"), dir.join("web.key"));
        std::fs::write(&cert, x509.to_pem().unwrap()).unwrap();
        std::fs::write(&key_path, key.private_key_to_pem_pkcs8().unwrap()).unwrap();
        WebCert {
            cert,
            key: key_path,
            der: x509.to_der().unwrap(),
        }
    }
}

/// The reference's `init` as it makes certificates (simplexmq `Server/CLI.hs`,
/// `createServerX509_`): the `openssl` command line, with its configuration files, for `alg`
/// (`ED25519` or `ED448`); the fingerprint file as it writes it (padded base64url).
pub fn reference_certificates(dir: &Path, alg: &str, common_name: &str) {
    let ca_conf = "[req]\ndistinguished_name = req_distinguished_name\nprompt = no\n\n\
                   [req_distinguished_name]\nCN = SMP server CA\nO = SimpleX\n\n\
                   [v3]\nsubjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid:always\n\
                   basicConstraints = critical,CA:true\n";
    let server_conf = format!(
        "[req]\ndistinguished_name = req_distinguished_name\nprompt = no\n\n\
         [req_distinguished_name]\nCN = {common_name}\n\n\
         [v3]\nbasicConstraints = CA:FALSE\n\
         keyUsage = digitalSignature, nonRepudiation, keyAgreement\n\
         extendedKeyUsage = serverAuth\n"
    );
    std::fs::write(dir.join("openssl_ca.conf"), ca_conf).unwrap();
    std::fs::write(dir.join("openssl_server.conf"), server_conf).unwrap();
    for cmd in [
        format!("openssl genpkey -algorithm {alg} -out ca.key"),
        "openssl req -new -x509 -days 999999 -config openssl_ca.conf -extensions v3 -key ca.key -out ca.crt".into(),
        format!("openssl genpkey -algorithm {alg} -out server.key"),
        "openssl req -new -config openssl_server.conf -reqexts v3 -key server.key -out server.csr".into(),
        "openssl x509 -req -days 999999 -extfile openssl_server.conf -extensions v3 -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt".into(),
    ] {
        let out = Command::new("sh")
            .args(["-c", &cmd])
            .current_dir(dir)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pem = std::fs::read(dir.join("ca.crt")).unwrap();
    let der = openssl::x509::X509::from_pem(&pem)
        .unwrap()
        .to_der()
        .unwrap();
    let fp = openssl::sha::sha256(&der);
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE, fp);
    std::fs::write(dir.join("fingerprint"), format!("{b64}\n")).unwrap();
}
