//! Statistics the relay keeps beyond one shard's counters: the reference's daily line and its
//! counters across restarts (`[STORE_LOG] log_stats`, formats in `stats_file.rs`), sockets per
//! port, and the metrics HTTP endpoint (`[RELAY] metrics_listen`).
//!
//! Counters stay per shard and only grow; shard 0 keeps what the reference's resets and restores
//! mean for them ([`Daily`]): what the backup restored is added, what the last daily line showed
//! is taken off. Active queues are sets of hashes kept by the shard that owns each queue, so the
//! shards' counts add up (a restored hash goes back to its owner, `metrics::shard_of_hash`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::StartConfig;
use crate::limits::{
    METRICS_HTTP_FRESH, METRICS_HTTP_MAX_CONNECTIONS, METRICS_HTTP_MAX_REQUEST_BYTES,
    METRICS_HTTP_READ_TIMEOUT,
};
use crate::metrics::{Activity, MetricsSnapshot, SocketCounts, TimeBuckets};
use crate::server::mesh::Mesh;
use crate::server::messages::StatsMsg;
use crate::server::router::ConnRef;
use crate::stats_file::{self, Backup};

/// Shard 0's view of the counters' period: when it began, what to add (restored from the backup)
/// and what to take off (shown by the daily lines so far), and when the next line is due.
#[derive(Debug, Clone, Default)]
pub struct Daily {
    pub from_ms: u64,
    pub restored: MetricsSnapshot,
    pub baseline: MetricsSnapshot,
    /// Unix seconds of the next daily line; `None` without `log_stats`.
    pub next_line: Option<i64>,
}

impl Daily {
    /// The counters as the reference would show them, from the shards' sum `raw`.
    pub fn shown(&self, raw: &MetricsSnapshot) -> MetricsSnapshot {
        let mut s = *raw;
        s.add(&self.restored);
        s.minus(&self.baseline);
        s
    }
}

/// What one shard held at a clean stop.
pub struct Final {
    pub snapshot: MetricsSnapshot,
    pub activity: Activity,
    pub daily: Option<Daily>,
}

/// Accepted and closed connections of one port, counted by every shard.
pub struct PortSockets {
    pub port: u16,
    pub accepted: AtomicU64,
    pub closed: AtomicU64,
}

/// Shared by the shards and the thread that starts and stops them.
#[derive(Default)]
pub struct Shared {
    /// Restored active queues by shard, each taken by its shard as it starts.
    pub restored: Mutex<Vec<Option<Activity>>>,
    /// Shard 0's daily state at the start.
    pub daily_start: Mutex<Option<Daily>>,
    /// Each shard's numbers at its stop.
    pub finals: Mutex<Vec<Final>>,
    /// The latest metrics text and when it was made, for the HTTP endpoint.
    pub latest: Mutex<(Option<std::time::Instant>, String)>,
    pub sockets: Vec<PortSockets>,
    /// Each shard's ACK times and pending deliveries' ages, left for shard 0 as it answers a
    /// metrics round (they do not fit the plain numbers of its `StatsMsg::Part`).
    pub times: Mutex<Vec<(TimeBuckets, TimeBuckets)>>,
    /// Each shard's connections with a subscription, with a delivery waiting for its ACK, with
    /// a notifier subscription: a connection may hold them on several owners, so shard 0 counts
    /// the distinct ones.
    pub clients: Mutex<Vec<[Vec<ConnRef>; 3]>>,
}

impl Shared {
    pub fn sockets(&self) -> Vec<SocketCounts> {
        self.sockets
            .iter()
            .map(|p| SocketCounts {
                port: p.port.to_string(),
                accepted: p.accepted.load(Ordering::Relaxed),
                closed: p.closed.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Shard `shard`'s ACK times and pending deliveries' ages, for the next metrics text.
    pub fn set_times(&self, shard: usize, ack: TimeBuckets, pending: TimeBuckets) {
        if let Some(t) = lock(&self.times).get_mut(shard) {
            *t = (ack, pending);
        }
    }

    /// Shard `shard`'s connections with subscriptions, deliveries and notifier subscriptions.
    pub fn set_clients(&self, shard: usize, clients: [Vec<ConnRef>; 3]) {
        if let Some(c) = lock(&self.clients).get_mut(shard) {
            *c = clients;
        }
    }

    /// The distinct connections of each kind over every shard.
    pub fn clients(&self) -> [u64; 3] {
        let all = lock(&self.clients);
        [0, 1, 2].map(|i| {
            all.iter()
                .flat_map(|c| c[i].iter())
                .collect::<std::collections::HashSet<_>>()
                .len() as u64
        })
    }

    /// Every shard's ACK times and pending deliveries' ages, summed.
    pub fn times(&self) -> (TimeBuckets, TimeBuckets) {
        let mut sum = (TimeBuckets::default(), TimeBuckets::default());
        for (a, p) in lock(&self.times).iter() {
            sum.0.add(a);
            sum.1.add(p);
        }
        sum
    }

    pub fn port(&self, port: u16) -> Option<&PortSockets> {
        self.sockets.iter().find(|p| p.port == port)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Before the shards start: the shared state, with the backup's numbers when `log_stats` is on
/// and the file is there (its saved queue count is returned, to compare once the store is
/// loaded). A backup that cannot be read stops the start, naming the file.
pub fn prepare(config: &StartConfig, shards: usize) -> Result<(Shared, Option<u64>), String> {
    let now_ms = crate::clock::now_ms();
    let mut daily = Daily {
        from_ms: now_ms,
        next_line: config
            .log_stats
            .then(|| stats_file::first_line_at(crate::clock::now_secs())),
        ..Daily::default()
    };
    let mut restored = vec![None; shards];
    let mut saved_queues = None;
    let path = stats_file::backup_path(&config.data_dir);
    if config.log_stats && path.exists() {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read the statistics backup {}: {e}", path.display()))?;
        let b = stats_file::decode_backup(&text).map_err(|e| {
            format!(
                "the statistics backup {} cannot be read ({e}); move it away to start with new \
                 counters",
                path.display()
            )
        })?;
        tracing::info!(file = %path.display(), "restoring server stats");
        daily.from_ms = b.from_ms;
        daily.restored = b.counters;
        for (shard, slot) in restored.iter_mut().enumerate() {
            *slot = Some(b.activity.for_shard(shard, shards));
        }
        saved_queues = Some(b.q_count);
    }
    let mut ports: Vec<u16> = config.ports.clone();
    ports.extend(&config.websocket_ports);
    ports.dedup();
    let shared = Shared {
        restored: Mutex::new(restored),
        times: Mutex::new(vec![Default::default(); shards]),
        clients: Mutex::new(vec![Default::default(); shards]),
        daily_start: Mutex::new(Some(daily)),
        sockets: ports
            .into_iter()
            .map(|port| PortSockets {
                port,
                accepted: AtomicU64::new(0),
                closed: AtomicU64::new(0),
            })
            .collect(),
        ..Shared::default()
    };
    Ok((shared, saved_queues))
}

/// Every shard serves: the restored backup is set aside (`.bak`, as the reference does), and a
/// saved queue count other than the store's is warned about.
pub fn restored(config: &StartConfig, saved_queues: Option<u64>, store_queues: Option<u64>) {
    let Some(saved) = saved_queues else {
        return;
    };
    let path = stats_file::backup_path(&config.data_dir);
    let mut bak = path.clone().into_os_string();
    bak.push(".bak");
    if let Err(e) = std::fs::rename(&path, &bak) {
        tracing::warn!(error = %e, file = %path.display(), "cannot set the statistics backup aside");
    }
    tracing::info!("server stats restored");
    if let Some(store_queues) = store_queues.filter(|&n| n != saved) {
        tracing::warn!("Queue count differs: stats: {saved}, store: {store_queues}");
    }
}

/// At a clean stop: the shards' numbers as the backup file (`log_stats` only).
pub fn save(config: &StartConfig, shared: &Shared) {
    if !config.log_stats {
        return;
    }
    let finals = std::mem::take(&mut *lock(&shared.finals));
    let mut raw = MetricsSnapshot::default();
    let mut activity = Activity::default();
    let mut daily = Daily::default();
    for f in &finals {
        raw.add(&f.snapshot);
        activity.msgs.extend(&f.activity.msgs);
        activity.ntfs.extend(&f.activity.ntfs);
        if let Some(d) = &f.daily {
            daily = d.clone();
        }
    }
    let shown = daily.shown(&raw);
    let backup = Backup {
        from_ms: daily.from_ms,
        counters: shown,
        q_count: raw.queue_count,
        activity,
    };
    let path = stats_file::backup_path(&config.data_dir);
    tracing::info!(file = %path.display(), "saving server stats");
    if let Err(e) = crate::metrics::write_atomically(&path, &stats_file::encode_backup(&backup)) {
        tracing::error!(error = %e, file = %path.display(), "cannot save the server stats");
    }
}

/// Appends one line to the daily file.
pub fn append_daily(config: &StartConfig, line: &str) {
    let path = stats_file::daily_path(&config.data_dir);
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        tracing::warn!(error = %e, file = %path.display(), "cannot write the daily statistics");
    }
}

/// The process's threads now (`simplex_smp_threads_total`).
pub fn threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Binds the metrics endpoint before the shards start, so that a taken address stops the start.
pub fn bind_http(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen for metrics on {addr} ([RELAY] metrics_listen): {e}"))
}

/// Connections of the metrics endpoint that have not sent their whole request yet, oldest first:
/// at the bound, the oldest of them is closed to serve a new one, so sockets held open without a
/// request cannot keep a scraper out (a scraper sends its request as soon as it connects).
#[derive(Default)]
struct Idle {
    next_id: u64,
    waiting: std::collections::VecDeque<(u64, TcpStream)>,
}

impl Idle {
    fn add(&mut self, stream: &TcpStream) -> Option<u64> {
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, stream.try_clone().ok()?));
        Some(id)
    }

    fn remove(&mut self, id: u64) {
        self.waiting.retain(|(i, _)| *i != id);
    }

    /// Closes the oldest connection still waiting for its request; false when there is none.
    fn close_oldest(&mut self) -> bool {
        match self.waiting.pop_front() {
            Some((_, s)) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
                true
            }
            None => false,
        }
    }
}

/// Serves `GET /metrics` (and `HEAD`) on its own threads, off the shards: each request asks
/// shard 0 for a fresh round (as the metrics file's) and answers its text.
pub fn serve_http(listener: TcpListener, mesh: Mesh, shared: Arc<Shared>) {
    let active = Arc::new(AtomicUsize::new(0));
    let idle = Arc::new(Mutex::new(Idle::default()));
    let spawned = std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                // At the bound, the oldest connection without a request makes room (its thread
                // ends at once: its read fails); when every one is being answered, the new one
                // is closed at once.
                if active.load(Ordering::Acquire) >= METRICS_HTTP_MAX_CONNECTIONS
                    && !lock(&idle).close_oldest()
                {
                    continue;
                }
                active.fetch_add(1, Ordering::AcqRel);
                let Some(id) = lock(&idle).add(&stream) else {
                    active.fetch_sub(1, Ordering::AcqRel);
                    continue;
                };
                let (mesh, shared) = (mesh.clone(), shared.clone());
                let (active, idle) = (active.clone(), idle.clone());
                let ok = std::thread::Builder::new()
                    .name("metrics-http-conn".into())
                    .spawn(move || {
                        answer(stream, &mesh, &shared, || lock(&idle).remove(id));
                        lock(&idle).remove(id);
                        active.fetch_sub(1, Ordering::AcqRel);
                    });
                if ok.is_err() {
                    tracing::warn!("cannot start a metrics connection's thread");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the metrics endpoint");
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum HttpRequest {
    Metrics,
    /// `HEAD /metrics`: the answer to `GET` without its body.
    MetricsHead,
    NotFound,
    Bad,
}

/// The request line of a complete head (`GET /metrics HTTP/1.1`).
pub fn parse_request(head: &[u8]) -> HttpRequest {
    let Ok(head) = std::str::from_utf8(head) else {
        return HttpRequest::Bad;
    };
    let line = head.split("\r\n").next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return HttpRequest::Bad;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return HttpRequest::Bad;
    }
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET", "/metrics") => HttpRequest::Metrics,
        ("HEAD", "/metrics") => HttpRequest::MetricsHead,
        _ => HttpRequest::NotFound,
    }
}

/// Reads one request and answers it; `head_read` runs once the whole request head is in.
fn answer(mut stream: TcpStream, mesh: &Mesh, shared: &Shared, head_read: impl FnOnce()) {
    let _ = stream.set_read_timeout(Some(METRICS_HTTP_READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(METRICS_HTTP_READ_TIMEOUT));
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if head.len() >= METRICS_HTTP_MAX_REQUEST_BYTES {
            break false;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    head_read();
    let request = if complete {
        parse_request(&head)
    } else {
        HttpRequest::Bad
    };
    let (status, body) = match request {
        HttpRequest::Metrics | HttpRequest::MetricsHead => {
            let fresh = lock(&shared.latest)
                .0
                .is_some_and(|at| at.elapsed() < METRICS_HTTP_FRESH);
            if !fresh {
                let (tx, rx) = flume::bounded(1);
                mesh.send(0, StatsMsg::MetricsNow { done: tx });
                let _ = rx.recv_timeout(Duration::from_secs(5));
            }
            ("200 OK", lock(&shared.latest).1.clone())
        }
        HttpRequest::NotFound => ("404 Not Found", String::new()),
        HttpRequest::Bad => ("400 Bad Request", String::new()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if request != HttpRequest::MetricsHead {
        response.push_str(&body);
    }
    let _ = stream.write_all(response.as_bytes());
    let _ = stream.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_told_apart() {
        assert_eq!(
            parse_request(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            HttpRequest::Metrics
        );
        assert_eq!(
            parse_request(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            HttpRequest::Metrics
        );
        assert_eq!(
            parse_request(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            HttpRequest::MetricsHead
        );
        assert_eq!(
            parse_request(b"GET / HTTP/1.1\r\n\r\n"),
            HttpRequest::NotFound
        );
        assert_eq!(
            parse_request(b"POST /metrics HTTP/1.1\r\n\r\n"),
            HttpRequest::NotFound
        );
        assert_eq!(parse_request(b"hello\r\n\r\n"), HttpRequest::Bad);
        assert_eq!(
            parse_request(b"GET metrics HTTP/1.1\r\n\r\n"),
            HttpRequest::Bad
        );
        assert_eq!(parse_request(b"\xff\r\n\r\n"), HttpRequest::Bad);
    }

    #[test]
    fn a_daily_line_shows_what_was_counted_since_the_last() {
        let mut d = Daily::default();
        let raw = MetricsSnapshot {
            queues_created: 5,
            queue_count: 9,
            ntf_new_created: 2,
            ..MetricsSnapshot::default()
        };
        d.restored.queues_created = 3;
        let shown = d.shown(&raw);
        assert_eq!((shown.queues_created, shown.queue_count), (8, 9));
        d.baseline.add(&shown.daily_part());
        let later = MetricsSnapshot {
            queues_created: 6,
            ..raw
        };
        let shown = d.shown(&later);
        assert_eq!(shown.queues_created, 1);
        assert_eq!(shown.ntf_new_created, 2, "not reset by a daily line");
    }
}
