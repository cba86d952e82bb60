//! The relay under test as a separate process, and what `/proc` says about it: CPU time
//! (utime + stime of all its threads, dead ones included) and memory (VmRSS, RssAnon, VmHWM).
//! Also the generator's own CPU, core pinning and the file-descriptor limit.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;

/// Seconds the relay has to print `listening`.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Relay log lines kept for error messages.
const MAX_LOG_LINES: usize = 2000;

static DIR_COUNTER: AtomicU64 = AtomicU64::new(0);

/// CPU and memory of one process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub cpu_s: f64,
    /// Of `cpu_s`, what the relay's PostgreSQL cluster used (with `--pg`; else 0).
    pub db_cpu_s: f64,
    pub rss_kb: u64,
    pub rss_anon_kb: u64,
    /// Resident file pages (for the journal store: its mapped segments).
    pub rss_file_kb: u64,
    pub hwm_kb: u64,
    /// The relay's PostgreSQL cluster's WAL position in bytes (with `--pg`; else 0).
    pub wal_lsn: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of `/proc/<pid>/stat` (`self` for this process), in seconds.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; fields resume after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / clock_ticks())
}

/// CPU seconds of a process and of its children, living (utime + stime of each) and exited
/// (the parent's cutime + cstime): a PostgreSQL cluster's postmaster and its backends.
pub fn tree_cpu_seconds(parent: u32) -> Option<f64> {
    let fields = |pid: &str| -> Option<Vec<String>> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        Some(rest.split(' ').map(str::to_string).collect())
    };
    let secs = |f: &[String], i: usize| -> f64 {
        f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / clock_ticks()
    };
    // Fields from 3 (state): ppid 4, utime 14, stime 15, cutime 16, cstime 17.
    let own = fields(&parent.to_string())?;
    let mut total = secs(&own, 11) + secs(&own, 12) + secs(&own, 13) + secs(&own, 14);
    let parent_s = parent.to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if let Some(f) = fields(pid) {
            if f.get(1) == Some(&parent_s) {
                total += secs(&f, 11) + secs(&f, 12);
            }
        }
    }
    Some(total)
}

pub fn sample(pid: &str) -> ProcSample {
    let mut s = ProcSample {
        cpu_s: cpu_seconds(pid).unwrap_or(f64::NAN),
        ..ProcSample::default()
    };
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in text.lines() {
            let kb = || {
                line.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("VmRSS:") {
                s.rss_kb = kb();
            } else if line.starts_with("RssAnon:") {
                s.rss_anon_kb = kb();
            } else if line.starts_with("RssFile:") {
                s.rss_file_kb = kb();
            } else if line.starts_with("VmHWM:") {
                s.hwm_kb = kb();
            }
        }
    }
    s
}

/// A counter of the kernel's TCP statistics (`TcpExt` in `/proc/net/netstat`, e.g.
/// `ListenOverflows`): counted over the whole network namespace, so other processes' connections
/// count too.
pub fn tcp_ext(name: &str) -> Option<u64> {
    tcp_ext_in(&std::fs::read_to_string("/proc/net/netstat").ok()?, name)
}

/// `tcp_ext` of the text of a `/proc/net/netstat`.
fn tcp_ext_in(text: &str, name: &str) -> Option<u64> {
    let mut lines = text.lines();
    // Pairs of lines: `TcpExt: Name Name ...`, then `TcpExt: value value ...`.
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if names.starts_with("TcpExt:") && values.starts_with("TcpExt:") {
            let i = names.split_whitespace().position(|n| n == name)?;
            return values.split_whitespace().nth(i)?.parse().ok();
        }
    }
    None
}

/// The 1-minute load average: how busy the machine was (other processes share the 2 cores).
pub fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Pins this process's calling thread, and every thread it starts afterwards, to `cpus`.
pub fn pin_self(cpus: &[usize]) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it for indexes below CPU_SETSIZE;
    // sched_setaffinity reads the set we pass with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(format!("cpu {c} out of range"));
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
    }
    Ok(())
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (children inherit it); returns the new limit.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit read and write the rlimit struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

/// A fresh directory under the system temp dir, removed on drop; shared by the load generator and
/// the tests (`tests/common`). Readable by its owner only, as an operator's data directory should
/// be (`start` warns about one others can read).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> std::io::Result<TempDir> {
        use std::os::unix::fs::PermissionsExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = DIR_COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "smp-relay-{tag}-{}-{n}-{nanos}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))?;
        Ok(TempDir(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bytes of the files under `dir` (their lengths), recursively.
pub fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let t = entry.file_type()?;
        if t.is_dir() {
            n += dir_bytes(&entry.path())?;
        } else if t.is_file() {
            n += entry.metadata()?.len();
        }
    }
    Ok(n)
}

/// Drops the pages of every file under `dir` from the page cache (fdatasync, then
/// posix_fadvise DONTNEED), so that the next reader reads them from the disk; other files' pages
/// stay cached. Pages a running process has mapped may stay.
pub fn evict_from_page_cache(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let t = entry.file_type()?;
        if t.is_dir() {
            evict_from_page_cache(&entry.path())?;
        } else if t.is_file() {
            let f = std::fs::File::open(entry.path())?;
            // Dirty pages are not dropped: write them first.
            f.sync_data()?;
            // SAFETY: an advisory call on a descriptor we own, for its whole length.
            let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            if r != 0 {
                return Err(std::io::Error::from_raw_os_error(r));
            }
        }
    }
    Ok(())
}

/// Copies a relay data directory, leaving out the lock and the `.bak` files a start leaves.
pub fn copy_data_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let name_s = name.to_string_lossy();
        if name_s == "lock" || name_s.ends_with(".bak") {
            continue;
        }
        let dst = to.join(&name);
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&dst)?;
            copy_data_dir(&entry.path(), &dst)?;
        } else {
            std::fs::copy(entry.path(), &dst)?;
        }
    }
    Ok(())
}

/// The relay's key hash, from the `fingerprint` file `init` writes.
pub fn read_fingerprint(dir: &Path) -> Result<[u8; 32], String> {
    let text = std::fs::read_to_string(dir.join("fingerprint"))
        .map_err(|e| format!("{}: {e}", dir.join("fingerprint").display()))?;
    decode_key_hash(text.trim())
}

/// A key hash as the relay prints it: base64url of 32 bytes, padded or not.
pub fn decode_key_hash(s: &str) -> Result<[u8; 32], String> {
    use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
    URL_SAFE
        .decode(s)
        .or_else(|_| URL_SAFE_NO_PAD.decode(s))
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| format!("key hash {s:?} is not base64url of 32 bytes"))
}

/// `free_port` hands out ports from this range, below the kernel's ephemeral range (32768–60999
/// by default), from which every outbound connection takes its source port: a port found free
/// there could become a client's source port before the relay binds it.
const FREE_PORT_FIRST: u32 = 20_000;
const FREE_PORT_SPAN: u32 = 12_000;
/// The next candidate of this process (each call takes its own, so two threads never get the same
/// port until the range wraps).
static NEXT_FREE_PORT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A port that was free a moment ago: outside the ephemeral range, and never handed out twice by
/// this process (until 12,000 later). Another process may still take it before the relay binds it.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::Ordering;
    // Processes start at different places, so that two test binaries rarely try the same ports.
    let offset = std::process::id().wrapping_mul(2_654_435_761) % FREE_PORT_SPAN;
    for _ in 0..FREE_PORT_SPAN {
        let n = NEXT_FREE_PORT.fetch_add(1, Ordering::Relaxed);
        let port = (FREE_PORT_FIRST + (offset + n) % FREE_PORT_SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// How to start the relay.
#[derive(Debug, Clone)]
pub struct RelaySpec {
    pub bin: PathBuf,
    pub shards: usize,
    /// `taskset -c` list for the relay, if pinned.
    pub cpus: Option<String>,
    pub extra_args: Vec<String>,
}

impl RelaySpec {
    /// `smp-relay` next to this executable.
    pub fn default_bin() -> PathBuf {
        std::env::current_exe()
            .ok()
            .map(|p| p.with_file_name("smp-relay"))
            .unwrap_or_else(|| PathBuf::from("smp-relay"))
    }

    /// `smp-relay init` in `dir` (which must not have keys yet).
    pub fn init(&self, dir: &Path) -> Result<[u8; 32], String> {
        let out = Command::new(&self.bin)
            .arg("--data-dir")
            .arg(dir)
            .args(["init", "--host", "127.0.0.1", "--no-password"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run {}: {e}", self.bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "init failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        read_fingerprint(dir)
    }

    /// Starts the relay on `dir` and a free port; waits for `listening`.
    pub fn start(&self, dir: &Path) -> Result<RelayProc, String> {
        let key_hash = read_fingerprint(dir)?;
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port().map_err(|e| e.to_string())?;
            match self.spawn(dir, port) {
                Ok((child, log)) => {
                    return Ok(RelayProc {
                        child: Some(child),
                        addr: SocketAddr::from(([127, 0, 0, 1], port)),
                        key_hash,
                        log,
                    })
                }
                Err(e) => last = e,
            }
        }
        Err(format!("relay did not start: {last}"))
    }

    /// Starts the relay on `dir` and `port` (one try: the port is the one its clients know, as
    /// after a restart); waits for `listening`.
    pub fn start_on(&self, dir: &Path, port: u16) -> Result<RelayProc, String> {
        let key_hash = read_fingerprint(dir)?;
        let (child, log) = self.spawn(dir, port)?;
        Ok(RelayProc {
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            key_hash,
            log,
        })
    }

    fn spawn(&self, dir: &Path, port: u16) -> Result<(Child, SharedLog), String> {
        let mut cmd = match &self.cpus {
            Some(list) => {
                let mut c = Command::new("taskset");
                c.args(["-c", list]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.arg("--data-dir")
            .arg(dir)
            .args(["start", "--port", &port.to_string()])
            .args(["--cores", &self.shards.to_string()])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().map_err(|e| format!("spawn relay: {e}"))?;
        wait_listening(child, START_TIMEOUT)
    }
}

/// Keeps the last lines a relay child wrote to stderr.
pub type SharedLog = Arc<Mutex<Vec<String>>>;

/// Waits (at most `timeout`) until a relay child started with `stderr` piped logs `listening`,
/// keeping its last `MAX_LOG_LINES` stderr lines meanwhile and after. A child that exits first,
/// or stays silent too long (then killed), is an error with its log.
pub fn wait_listening(mut child: Child, timeout: Duration) -> Result<(Child, SharedLog), String> {
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let log2 = log.clone();
    std::thread::spawn(move || {
        let mut seen = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let listening = !seen && line.contains("listening");
            if let Ok(mut l) = log2.lock() {
                if l.len() >= MAX_LOG_LINES {
                    l.remove(0);
                }
                l.push(line);
            }
            // Told after the line is in the log, so that whoever waited finds it there.
            if listening {
                seen = true;
                let _ = tx.send(());
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let text = |log: &SharedLog| log.lock().map(|l| l.join("\n")).unwrap_or_default();
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(()) => return Ok((child, log)),
            Err(_) if matches!(child.try_wait(), Ok(Some(_))) => {
                return Err(format!("relay exited before listening:\n{}", text(&log)));
            }
            Err(_) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "no `listening` within {timeout:?}:\n{}",
                    text(&log)
                ));
            }
            Err(_) => {}
        }
    }
}

/// A running relay; killed on drop.
pub struct RelayProc {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub key_hash: [u8; 32],
    log: SharedLog,
}

impl RelayProc {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    pub fn log_tail(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// SIGTERM, then waits: the memory store is saved at a clean stop.
    pub fn stop_clean(mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill sends a signal to our own child by its pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return if st.success() {
                    Ok(())
                } else {
                    Err(format!("relay stopped with {st}: {}", self.log_tail()))
                };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err("relay did not stop within 120 s of SIGTERM".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl RelayProc {
    /// SIGKILL, then waits for the exit: a crash, after which the store is as the kill left it.
    pub fn kill(mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        child.kill().map_err(|e| format!("kill the relay: {e}"))?;
        child
            .wait()
            .map(|_| ())
            .map_err(|e| format!("wait for the relay: {e}"))
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_counters_are_read_by_name_from_their_pair_of_lines() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\n\
                    TcpExt: 3 17 19\n\
                    IpExt: InNoRoutes ListenOverflows\n\
                    IpExt: 5 6\n";
        assert_eq!(tcp_ext_in(text, "ListenOverflows"), Some(17));
        assert_eq!(tcp_ext_in(text, "SyncookiesSent"), Some(3));
        assert_eq!(tcp_ext_in(text, "ListenDrops"), Some(19));
        assert_eq!(tcp_ext_in(text, "InNoRoutes"), None);
        assert_eq!(tcp_ext_in("", "ListenDrops"), None);
    }
}
