//! The subscription scenarios the load generator runs: storm (N queues subscribed at once
//! from K connections while senders send), individual (one connection alone), displace (set B takes
//! over set A's subscriptions while A stays connected) and idle connections.
//!
//! The client behaves well: each recipient connection sends its SUBs in full blocks (pre-signed
//! before the clock starts), keeps at most `window_blocks` blocks in flight and reads before it
//! sends more; every MSG is ACKed; senders send one SEND at a time per connection without a rate
//! cap. One thread per connection, blocking reads with a short timeout when nothing is in flight
//! (the relay writes whole blocks, so a timeout never splits one).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::Rng;

use super::creds::QueueCreds;
use super::floor::Floor;
use super::proc::{self, ProcSample};
use super::report::percentile;
use crate::client::{Client, ClientError, ClientOptions, ClientTransmission};
use crate::protocol::batch::BatchWriter;
use crate::protocol::command::{Command, MsgFlags};
use crate::protocol::error::ErrorType;
use crate::protocol::response::BrokerMsg;

/// Read timeout of an idle recipient connection, so it notices the end of the run.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// Read timeout while requests are in flight: a wait this long is an error of the relay.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the main thread looks at the counters.
const MONITOR_TICK: Duration = Duration::from_millis(2);

/// The relay the run talks to; `pid` gives CPU and memory figures when known.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub key_hash: [u8; 32],
    pub pid: Option<u32>,
    /// The postmaster of the relay's PostgreSQL cluster: its CPU and its processes' count as the
    /// relay's (`proc::tree_cpu_seconds`).
    pub db_pid: Option<u32>,
    /// Its database, to read the WAL position at each sample.
    pub db_conninfo: Option<String>,
}

impl Target {
    /// The relay's figures; with a database, its CPU includes the database server's.
    pub fn sample(&self) -> ProcSample {
        let mut s = match self.pid {
            Some(p) => proc::sample(&p.to_string()),
            None => ProcSample {
                cpu_s: f64::NAN,
                ..ProcSample::default()
            },
        };
        if let Some(db) = self.db_pid {
            s.db_cpu_s = proc::tree_cpu_seconds(db).unwrap_or(f64::NAN);
            s.cpu_s += s.db_cpu_s;
        }
        if let Some(conninfo) = &self.db_conninfo {
            s.wal_lsn = wal_lsn(conninfo).unwrap_or(0);
        }
        s
    }

    fn connect(&self) -> Result<Client, String> {
        Client::connect(self.addr, self.key_hash, ClientOptions::default())
            .map_err(|e| format!("connect to {}: {e}", self.addr))
    }

    /// A messaging service's connection, with a certificate of its own: each of its SUBs moves
    /// its queue to this service (the service-association storm).
    fn connect_service(&self) -> Result<Client, String> {
        let cert = crate::client::ClientCert::self_signed().map_err(|e| e.to_string())?;
        self.connect_service_as(&cert, ClientOptions::default().timeout)
    }

    /// A connection of the messaging service of `cert`.
    pub fn connect_service_as(
        &self,
        cert: &crate::client::ClientCert,
        timeout: Duration,
    ) -> Result<Client, String> {
        let opts = ClientOptions {
            tls_cert: Some(cert.clone()),
            service_role: Some(crate::client::service::ROLE_MESSAGING),
            timeout,
            ..ClientOptions::default()
        };
        let c = Client::connect(self.addr, self.key_hash, opts)
            .map_err(|e| format!("connect to {}: {e}", self.addr))?;
        match c.service() {
            Some(_) => Ok(c),
            None => Err("the relay did not take the connection as a service".into()),
        }
    }
}

/// The cluster's current WAL position, in bytes. The query's own backend (a few ms of the
/// cluster's CPU) falls into the interval after the sample.
fn wal_lsn(conninfo: &str) -> Option<u64> {
    let mut c = postgres::Client::connect(conninfo, postgres::NoTls).ok()?;
    let row = c
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .ok()?;
    u64::try_from(row.get::<_, i64>(0)).ok()
}

/// What every message scenario shares.
#[derive(Debug, Clone)]
pub struct LoadParams {
    /// Blocks a recipient connection keeps in flight.
    pub window_blocks: usize,
    /// Sender groups × threads per group; each thread is one connection.
    pub senders: usize,
    pub threads: usize,
    /// Body bytes of each SEND (16048 is the largest from v11, with block encryption).
    pub msg_bytes: usize,
    /// Bound on one run, after which it fails.
    pub timeout: Duration,
    /// Print progress on stderr.
    pub progress: bool,
    /// A shell command run over the measured interval, with RELAY_PID in its environment.
    pub profile: Option<String>,
    /// Subscribing connections are messaging services, each with its own certificate.
    pub services: bool,
}

/// The `--profile` command of a run: started at the release, stopped (SIGINT, then waited for) when
/// the measurement ends, so a profiler sees exactly the measured interval.
struct Profiler(Option<std::process::Child>);

impl Profiler {
    fn start(cmd: Option<&str>, pid: Option<u32>) -> Result<Self, String> {
        let (Some(cmd), Some(pid)) = (cmd, pid) else {
            return Ok(Profiler(None));
        };
        std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .env("RELAY_PID", pid.to_string())
            .spawn()
            .map(|c| Profiler(Some(c)))
            .map_err(|e| format!("--profile {cmd:?}: {e}"))
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: kill(2) with a pid of our own child, which has not been waited for yet (so
            // the pid cannot have been reused), and a valid signal number.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGINT);
            }
            let _ = c.wait();
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Default)]
struct Counters {
    /// ACKs answered OK or with the next MSG: messages removed from their queues.
    acked: AtomicU64,
    msgs: AtomicU64,
    prefill_acked: AtomicU64,
    sent_ok: AtomicU64,
    send_quota: AtomicU64,
    send_err: AtomicU64,
    ack_err: AtomicU64,
    /// Blocks that carried ACKs, and the ACKs in them.
    ack_blocks: AtomicU64,
    acks_sent: AtomicU64,
    sub_err: AtomicU64,
    ends: AtomicU64,
    other: AtomicU64,
}

struct Shared {
    c: Counters,
    /// Per queue: its first ACK in the run was seen (that one removed the prefilled message).
    first_acked: Vec<AtomicBool>,
    stop_send: AtomicBool,
    stop_recv: AtomicBool,
    failed: Mutex<Option<String>>,
}

impl Shared {
    fn new(queues: usize) -> Shared {
        Shared {
            c: Counters::default(),
            first_acked: (0..queues).map(|_| AtomicBool::new(false)).collect(),
            stop_send: AtomicBool::new(false),
            stop_recv: AtomicBool::new(false),
            failed: Mutex::new(None),
        }
    }

    fn fail(&self, e: String) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(e);
        }
        self.stop_send.store(true, Ordering::Relaxed);
        self.stop_recv.store(true, Ordering::Relaxed);
    }

    fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }

    fn acked(&self, q: u32) {
        self.c.acked.fetch_add(1, Ordering::Relaxed);
        if !self.first_acked[q as usize].swap(true, Ordering::Relaxed) {
            self.c.prefill_acked.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One set of recipient connections subscribing together.
struct SubSet {
    total: u64,
    soks: AtomicU64,
    done_at: Mutex<Option<Instant>>,
}

impl SubSet {
    fn sok(&self) {
        if self.soks.fetch_add(1, Ordering::Relaxed) + 1 == self.total {
            if let Ok(mut d) = self.done_at.lock() {
                *d = Some(Instant::now());
            }
        }
    }

    fn done_at(&self) -> Option<Instant> {
        self.done_at.lock().ok().and_then(|d| *d)
    }
}

#[derive(Default)]
struct ConnStats {
    sub_batch_us: Vec<u64>,
    ack_us: Vec<u64>,
}

enum Kind {
    Sub,
    Ack { q: u32, at: Instant },
}

struct InFlight {
    sent: Instant,
    remaining: u32,
    sub: bool,
}

fn corr(n: u64) -> [u8; 24] {
    let mut c = [0u8; 24];
    c[..8].copy_from_slice(&n.to_be_bytes());
    c
}

fn corr_num(c: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(c.get(..8)?.try_into().ok()?))
}

struct Recipient {
    c: Client,
    creds: Arc<Vec<QueueCreds>>,
    shared: Arc<Shared>,
    set: Arc<SubSet>,
    window: usize,
    rid_index: HashMap<Vec<u8>, u32>,
    sub_blocks: VecDeque<(Vec<u8>, Vec<u64>)>,
    pending: HashMap<u64, (u64, Kind)>,
    in_flight: HashMap<u64, InFlight>,
    acks: VecDeque<(u32, Vec<u8>)>,
    next_corr: u64,
    next_block: u64,
    stats: ConnStats,
}

impl Recipient {
    /// Signs every SUB and packs them into full blocks before the clock starts.
    fn new(
        c: Client,
        creds: Arc<Vec<QueueCreds>>,
        mine: &[u32],
        shared: Arc<Shared>,
        set: Arc<SubSet>,
        window: usize,
    ) -> Result<Recipient, ClientError> {
        let mut r = Recipient {
            c,
            creds,
            shared,
            set,
            window: window.max(1),
            rid_index: HashMap::with_capacity(mine.len()),
            sub_blocks: VecDeque::new(),
            pending: HashMap::with_capacity(mine.len()),
            in_flight: HashMap::new(),
            acks: VecDeque::new(),
            next_corr: 1,
            next_block: 1,
            stats: ConnStats::default(),
        };
        let mut bw = BatchWriter::new();
        let mut ids = Vec::new();
        for &q in mine {
            let cr = &r.creds[q as usize];
            r.rid_index.insert(cr.rid.clone(), q);
            let id = r.next_corr;
            r.next_corr += 1;
            let t =
                ClientTransmission::new(&corr(id), &cr.rid, Command::Sub).signed(cr.rcv_signer());
            let enc = r.c.encode_transmission(&t)?;
            if !bw.try_push(&enc) {
                r.sub_blocks
                    .push_back((bw.content(), std::mem::take(&mut ids)));
                bw.clear();
                if !bw.try_push(&enc) {
                    return Err(ClientError::LargeMsg);
                }
            }
            ids.push(id);
        }
        if !bw.is_empty() {
            r.sub_blocks.push_back((bw.content(), ids));
        }
        Ok(r)
    }

    fn send_block(
        &mut self,
        content: &[u8],
        ids: Vec<(u64, Kind)>,
        sub: bool,
    ) -> Result<(), ClientError> {
        let b = self.next_block;
        self.next_block += 1;
        let now = Instant::now();
        self.c.send_content(content)?;
        self.in_flight.insert(
            b,
            InFlight {
                sent: now,
                remaining: ids.len() as u32,
                sub,
            },
        );
        for (id, k) in ids {
            self.pending.insert(id, (b, k));
        }
        Ok(())
    }

    fn send_acks(&mut self) -> Result<(), ClientError> {
        let mut bw = BatchWriter::new();
        let mut ids = Vec::new();
        while let Some((q, msg_id)) = self.acks.front() {
            let cr = &self.creds[*q as usize];
            let id = self.next_corr;
            let t = ClientTransmission::new(&corr(id), &cr.rid, Command::Ack(msg_id.clone()))
                .signed(cr.rcv_signer());
            let enc = self.c.encode_transmission(&t)?;
            if !bw.try_push(&enc) {
                break;
            }
            self.next_corr += 1;
            ids.push((
                id,
                Kind::Ack {
                    q: *q,
                    at: Instant::now(),
                },
            ));
            self.acks.pop_front();
        }
        if !ids.is_empty() {
            let c = &self.shared.c;
            c.ack_blocks.fetch_add(1, Ordering::Relaxed);
            c.acks_sent.fetch_add(ids.len() as u64, Ordering::Relaxed);
            self.send_block(&bw.content(), ids, false)?;
        }
        Ok(())
    }

    fn finish(&mut self, block: u64) {
        if let Some(f) = self.in_flight.get_mut(&block) {
            f.remaining -= 1;
            if f.remaining == 0 {
                if f.sub {
                    self.stats
                        .sub_batch_us
                        .push(f.sent.elapsed().as_micros() as u64);
                }
                self.in_flight.remove(&block);
            }
        }
    }

    fn delivered(&mut self, entity: &[u8], msg_id: Vec<u8>) {
        self.shared.c.msgs.fetch_add(1, Ordering::Relaxed);
        match self.rid_index.get(entity) {
            Some(&q) => self.acks.push_back((q, msg_id)),
            None => {
                self.shared.c.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn handle(&mut self, t: crate::client::ServerTransmission) {
        let c = &self.shared.c;
        if t.corr_id.is_empty() {
            match t.msg {
                Ok(BrokerMsg::Msg { msg_id, .. }) => self.delivered(&t.entity_id, msg_id),
                Ok(BrokerMsg::End) => {
                    c.ends.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    c.other.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        let Some((block, kind)) = corr_num(&t.corr_id).and_then(|n| self.pending.remove(&n)) else {
            c.other.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match kind {
            Kind::Sub => match &t.msg {
                Ok(BrokerMsg::Sok(_)) | Ok(BrokerMsg::Ok) => self.set.sok(),
                _ => {
                    c.sub_err.fetch_add(1, Ordering::Relaxed);
                    // A failed SUB still ends the window's wait for it.
                    self.set.sok();
                }
            },
            Kind::Ack { q, at } => {
                self.stats.ack_us.push(at.elapsed().as_micros() as u64);
                match t.msg {
                    Ok(BrokerMsg::Ok) => self.shared.acked(q),
                    Ok(BrokerMsg::Msg { msg_id, .. }) => {
                        self.shared.acked(q);
                        self.delivered(&t.entity_id, msg_id);
                    }
                    _ => {
                        c.ack_err.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        self.finish(block);
    }

    fn run(mut self, ready: &Barrier, go: &Barrier) -> Result<ConnStats, ClientError> {
        self.c.set_timeout(IDLE_POLL)?;
        ready.wait();
        go.wait();
        let mut idle_timeout = true;
        loop {
            while self.in_flight.len() < self.window {
                let Some((content, ids)) = self.sub_blocks.pop_front() else {
                    break;
                };
                let ids = ids.into_iter().map(|i| (i, Kind::Sub)).collect();
                self.send_block(&content, ids, true)?;
            }
            while self.in_flight.len() < self.window && !self.acks.is_empty() {
                self.send_acks()?;
            }
            let idle = self.in_flight.is_empty();
            if idle && self.shared.stop_recv.load(Ordering::Relaxed) {
                break;
            }
            if idle != idle_timeout {
                self.c
                    .set_timeout(if idle { IDLE_POLL } else { REQUEST_TIMEOUT })?;
                idle_timeout = idle;
            }
            match self.c.recv_block() {
                Ok(ts) => {
                    for t in ts {
                        self.handle(t);
                    }
                }
                Err(ClientError::Timeout) if idle => {}
                Err(e) => return Err(e),
            }
        }
        Ok(self.stats)
    }
}

#[derive(Default)]
struct SendStats {
    sent: u64,
}

struct Sender {
    c: Client,
    creds: Arc<Vec<QueueCreds>>,
    /// The queues this run uses.
    queues: Arc<Vec<u32>>,
    shared: Arc<Shared>,
    body: Vec<u8>,
    next_corr: u64,
}

impl Sender {
    fn send_to(&mut self, q: u32) -> Result<[u8; 24], ClientError> {
        let cr = &self.creds[q as usize];
        let id = corr(self.next_corr);
        self.next_corr += 1;
        let t = ClientTransmission::new(
            &id,
            &cr.sid,
            Command::Send {
                flags: MsgFlags::new(false),
                body: self.body.clone(),
            },
        )
        .signed(cr.snd_signer());
        self.c.send_batch(std::slice::from_ref(&t))?;
        Ok(id)
    }

    fn count(&self, m: &Result<BrokerMsg, Vec<u8>>) -> bool {
        let c = &self.shared.c;
        match m {
            Ok(BrokerMsg::Ok) => {
                c.sent_ok.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(BrokerMsg::Err(ErrorType::Quota)) => {
                c.send_quota.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => {
                c.send_err.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// One message to each of `qs`, `window` SENDs in flight; not measured. Returns how many
    /// were accepted.
    fn prefill(&mut self, qs: &[u32], window: usize) -> Result<u64, ClientError> {
        let mut ok = 0;
        for chunk in qs.chunks(window.max(1)) {
            let ids = chunk
                .iter()
                .map(|&q| self.send_to(q))
                .collect::<Result<Vec<_>, _>>()?;
            for id in ids {
                let r = self.c.recv_for(&id)?;
                if matches!(r.msg, Ok(BrokerMsg::Ok)) {
                    ok += 1;
                } else {
                    self.shared.fail(format!(
                        "prefill SEND answered {}",
                        crate::client::queue::describe(&r)
                    ));
                }
            }
        }
        Ok(ok)
    }

    fn run(mut self, ready: &Barrier, go: &Barrier) -> Result<SendStats, ClientError> {
        self.c.set_timeout(REQUEST_TIMEOUT)?;
        ready.wait();
        go.wait();
        let mut rng = rand::thread_rng();
        let mut st = SendStats::default();
        while !self.shared.stop_send.load(Ordering::Relaxed) {
            let q = self.queues[rng.gen_range(0..self.queues.len())];
            let id = self.send_to(q)?;
            let r = self.c.recv_for(&id)?;
            if self.count(&r.msg) {
                st.sent += 1;
            }
        }
        Ok(st)
    }
}

/// Which scenario shape a message run has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One set of `conns` connections subscribes all queues.
    Storm,
    /// Set A subscribes all; when it is done, set B (as many connections) subscribes them.
    Displace,
}

/// One message run's inputs.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub shape: Shape,
    /// Queue indexes (into the credentials) this run uses.
    pub queues: usize,
    pub conns: usize,
    pub prefill: bool,
}

fn split(qs: &[u32], parts: usize) -> Vec<Vec<u32>> {
    let parts = parts.max(1);
    let mut out = vec![Vec::new(); parts];
    let per = qs.len().div_ceil(parts).max(1);
    for (i, chunk) in qs.chunks(per).enumerate() {
        out[i] = chunk.to_vec();
    }
    out
}

type RecvHandle = JoinHandle<Result<ConnStats, String>>;

#[allow(clippy::too_many_arguments)]
fn spawn_set(
    target: &Target,
    creds: &Arc<Vec<QueueCreds>>,
    qs: &[u32],
    conns: usize,
    shared: &Arc<Shared>,
    window: usize,
    services: bool,
    ready: &Arc<Barrier>,
    go: &Arc<Barrier>,
) -> Result<(Arc<SubSet>, Vec<RecvHandle>), String> {
    let set = Arc::new(SubSet {
        total: qs.len() as u64,
        soks: AtomicU64::new(0),
        done_at: Mutex::new(None),
    });
    let mut hs = Vec::new();
    for mine in split(qs, conns) {
        let c = if services {
            target.connect_service()?
        } else {
            target.connect()?
        };
        let (creds, shared, set2, ready, go) = (
            creds.clone(),
            shared.clone(),
            set.clone(),
            ready.clone(),
            go.clone(),
        );
        hs.push(std::thread::spawn(move || {
            let r = Recipient::new(c, creds, &mine, shared.clone(), set2, window)
                .map_err(|e| e.to_string());
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    shared.fail(format!("recipient setup: {e}"));
                    ready.wait();
                    go.wait();
                    return Err(e);
                }
            };
            r.run(&ready, &go).map_err(|e| {
                let e = format!("recipient: {e}");
                shared.fail(e.clone());
                e
            })
        }));
    }
    Ok((set, hs))
}

/// Waits until `done` says so, or the deadline, printing `progress` every second when given; an
/// error from `done` ends the wait with it.
pub(super) fn wait_for(
    deadline: Instant,
    what: &str,
    progress: Option<&dyn Fn() -> String>,
    mut done: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let mut last_print = Instant::now();
    while !done()? {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}"));
        }
        if let Some(p) = progress {
            if last_print.elapsed() >= Duration::from_secs(1) {
                eprint!("\r{}   ", p());
                last_print = Instant::now();
            }
        }
        std::thread::sleep(MONITOR_TICK);
    }
    Ok(())
}

/// `wait_for`, ended early by the first failure a connection thread reported.
fn wait_until(
    shared: &Shared,
    deadline: Instant,
    what: &str,
    progress: Option<&dyn Fn() -> String>,
    mut done: impl FnMut() -> bool,
) -> Result<(), String> {
    wait_for(deadline, what, progress, || {
        if done() {
            return Ok(true);
        }
        shared.failure().map_or(Ok(false), Err)
    })
}

fn ms(us: f64) -> f64 {
    us / 1000.0
}

/// Runs one storm, individual or displace run and returns its figures.
pub fn run_messages(
    target: &Target,
    creds: &Arc<Vec<QueueCreds>>,
    spec: &RunSpec,
    p: &LoadParams,
    floor: &Floor,
) -> Result<Vec<(&'static str, f64)>, String> {
    let n = spec.queues.min(creds.len());
    if n == 0 {
        return Err("no queues".into());
    }
    let qs: Vec<u32> = (0..n as u32).collect();
    let shared = Arc::new(Shared::new(creds.len()));
    let sender_conns = p.senders * p.threads;
    let b_conns = if spec.shape == Shape::Displace {
        spec.conns
    } else {
        0
    };
    let ready = Arc::new(Barrier::new(spec.conns + b_conns + sender_conns + 1));
    let go = Arc::new(Barrier::new(spec.conns + sender_conns + 1));
    let go_b = Arc::new(Barrier::new(b_conns + 1));

    let (set_a, mut recv_hs) = spawn_set(
        target,
        creds,
        &qs,
        spec.conns,
        &shared,
        p.window_blocks,
        p.services,
        &ready,
        &go,
    )?;
    let set_b = if b_conns > 0 {
        let (s, hs) = spawn_set(
            target,
            creds,
            &qs,
            b_conns,
            &shared,
            p.window_blocks,
            p.services,
            &ready,
            &go_b,
        )?;
        recv_hs.extend(hs);
        Some(s)
    } else {
        None
    };

    let queues = Arc::new(qs.clone());
    let prefill_ok = Arc::new(AtomicU64::new(0));
    let body = crate::load::creds::incompressible(p.msg_bytes, 0x5eed);
    let mut send_hs = Vec::new();
    for i in 0..sender_conns {
        let c = target.connect()?;
        let mine: Vec<u32> = if spec.prefill {
            qs.iter().copied().skip(i).step_by(sender_conns).collect()
        } else {
            Vec::new()
        };
        let s = Sender {
            c,
            creds: creds.clone(),
            queues: queues.clone(),
            shared: shared.clone(),
            body: body.clone(),
            next_corr: 1,
        };
        let (ready, go, prefill_ok, shared, window) = (
            ready.clone(),
            go.clone(),
            prefill_ok.clone(),
            shared.clone(),
            p.window_blocks,
        );
        send_hs.push(std::thread::spawn(move || {
            let mut s = s;
            match s.prefill(&mine, window) {
                Ok(k) => {
                    prefill_ok.fetch_add(k, Ordering::Relaxed);
                }
                Err(e) => shared.fail(format!("prefill: {e}")),
            }
            s.run(&ready, &go).map_err(|e| {
                let e = format!("sender: {e}");
                shared.fail(e.clone());
                e
            })
        }));
    }
    // Prefill without senders: one extra connection, before the clock starts.
    if spec.prefill && sender_conns == 0 {
        let mut s = Sender {
            c: target.connect()?,
            creds: creds.clone(),
            queues: queues.clone(),
            shared: shared.clone(),
            body: body.clone(),
            next_corr: 1,
        };
        let k = s
            .prefill(&qs, p.window_blocks)
            .map_err(|e| format!("prefill: {e}"))?;
        prefill_ok.fetch_add(k, Ordering::Relaxed);
    }

    if p.progress {
        eprint!("\rpreparing (prefill, signing SUBs)...   ");
    }
    ready.wait();
    let prefilled = prefill_ok.load(Ordering::Relaxed);
    // Counters from the prefill are not part of the run.
    shared.c.sent_ok.store(0, Ordering::Relaxed);
    shared.c.send_err.store(0, Ordering::Relaxed);
    shared.c.send_quota.store(0, Ordering::Relaxed);
    if spec.prefill && prefilled != n as u64 {
        shared.fail(format!("prefill: {prefilled} of {n} SENDs accepted"));
    }
    let load1 = proc::load1();
    let r0 = target.sample();
    let g0 = proc::cpu_seconds("self").unwrap_or(f64::NAN);
    // Other threads wait at `go`: a profiler that cannot start is reported, not fatal.
    let mut profiler = Profiler::start(p.profile.as_deref(), target.pid).unwrap_or_else(|e| {
        eprintln!("{e}");
        Profiler(None)
    });
    let t0 = Instant::now();
    go.wait();
    let deadline = t0 + p.timeout;
    let c = &shared.c;
    let progress = || {
        format!(
            "subscribed {}/{} delivered {} sent {}",
            set_a.soks.load(Ordering::Relaxed)
                + set_b
                    .as_ref()
                    .map(|s| s.soks.load(Ordering::Relaxed))
                    .unwrap_or(0),
            n * (1 + usize::from(set_b.is_some())),
            c.acked.load(Ordering::Relaxed),
            c.sent_ok.load(Ordering::Relaxed)
        )
    };
    let prog: Option<&dyn Fn() -> String> = if p.progress { Some(&progress) } else { None };
    let outcome = (|| -> Result<_, String> {
        wait_until(&shared, deadline, "set A's SUBs", prog, || {
            set_a.done_at().is_some()
        })?;
        let window_a = set_a.done_at().map(|t| t - t0).unwrap_or_default();
        let r_window = target.sample();
        let mut prefill_done = None;
        if spec.prefill {
            wait_until(&shared, deadline, "the prefilled messages", prog, || {
                c.prefill_acked.load(Ordering::Relaxed) >= n as u64
            })?;
            prefill_done = Some(t0.elapsed());
        }
        let mut window_b = None;
        if let Some(sb) = &set_b {
            let tb = Instant::now();
            go_b.wait();
            wait_until(&shared, deadline, "set B's SUBs", prog, || {
                sb.done_at().is_some()
            })?;
            window_b = sb.done_at().map(|t| t - tb);
        }
        Ok((window_a, r_window, prefill_done, window_b))
    })();
    shared.stop_send.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for h in send_hs {
        match h.join() {
            Ok(Ok(s)) => sent += s.sent,
            Ok(Err(e)) => shared.fail(e),
            Err(_) => shared.fail("sender thread panicked".into()),
        }
    }
    let expected = if spec.prefill { n as u64 } else { 0 } + sent;
    let drained = outcome.and_then(|o| {
        wait_until(
            &shared,
            deadline,
            "delivery of every sent message",
            prog,
            || c.acked.load(Ordering::Relaxed) >= expected,
        )
        .map(|_| o)
    });
    let total = t0.elapsed();
    let r1 = target.sample();
    let g1 = proc::cpu_seconds("self").unwrap_or(f64::NAN);
    profiler.stop();
    shared.stop_recv.store(true, Ordering::Relaxed);
    if p.progress {
        eprint!("\r{}   \r", " ".repeat(60));
    }
    let mut stats = ConnStats::default();
    for h in recv_hs {
        match h.join() {
            Ok(Ok(s)) => {
                stats.sub_batch_us.extend(s.sub_batch_us);
                stats.ack_us.extend(s.ack_us);
            }
            Ok(Err(e)) => shared.fail(e),
            Err(_) => shared.fail("recipient thread panicked".into()),
        }
    }
    let (window_a, r_window, prefill_done, window_b) = drained?;
    if let Some(e) = shared.failure() {
        return Err(e);
    }

    let delivered = c.acked.load(Ordering::Relaxed);
    let subs = n as u64 * (1 + u64::from(set_b.is_some()));
    let relay_cpu = r1.cpu_s - r0.cpu_s;
    let relay_cpu_window = r_window.cpu_s - r0.cpu_s;
    let wal_window = r_window.wal_lsn.saturating_sub(r0.wal_lsn);
    let per_delivered_us = relay_cpu * 1e6 / delivered as f64;
    let run_floor_us = floor.run_us(subs, delivered, sent);
    let secs = |d: Duration| d.as_secs_f64();
    let mut f: Vec<(&'static str, f64)> = vec![("subscribe_window_s", secs(window_a))];
    if let Some(wb) = window_b {
        f.push(("subscribe_window_b_s", secs(wb)));
    }
    f.extend([
        (
            "prefill_delivered_s",
            prefill_done.map(secs).unwrap_or(f64::NAN),
        ),
        ("run_s", secs(total)),
        ("subs", subs as f64),
        (
            "wal_bytes_per_sub_in_window",
            if target.db_conninfo.is_some() {
                wal_window as f64 / subs.max(1) as f64
            } else {
                f64::NAN
            },
        ),
        ("delivered", delivered as f64),
        ("sent", sent as f64),
        ("delivered_per_s", delivered as f64 / secs(total)),
        (
            "sub_batch_p50_ms",
            ms(percentile(&mut stats.sub_batch_us, 0.5)),
        ),
        (
            "sub_batch_p99_ms",
            ms(percentile(&mut stats.sub_batch_us, 0.99)),
        ),
        ("ack_p50_ms", ms(percentile(&mut stats.ack_us, 0.5))),
        ("ack_p99_ms", ms(percentile(&mut stats.ack_us, 0.99))),
        ("relay_cpu_s", relay_cpu),
        ("db_cpu_s", r1.db_cpu_s - r0.db_cpu_s),
        ("relay_cpu_us_per_delivered", per_delivered_us),
        (
            "relay_cpu_us_per_sub_in_window",
            relay_cpu_window * 1e6 / n as f64,
        ),
        (
            "cpu_per_delivered_over_msg_floor",
            per_delivered_us / floor.per_message_us(),
        ),
        (
            "cpu_per_sub_over_sub_floor",
            relay_cpu_window * 1e6 / n as f64 / floor.per_sub_us(),
        ),
        ("cpu_over_run_floor", relay_cpu * 1e6 / run_floor_us),
        ("gen_cpu_s", g1 - g0),
        ("relay_rss_mb", r1.rss_kb as f64 / 1024.0),
        ("relay_rss_anon_mb", r1.rss_anon_kb as f64 / 1024.0),
        ("relay_hwm_mb", r1.hwm_kb as f64 / 1024.0),
        ("ends", c.ends.load(Ordering::Relaxed) as f64),
        ("sub_errors", c.sub_err.load(Ordering::Relaxed) as f64),
        ("ack_errors", c.ack_err.load(Ordering::Relaxed) as f64),
        (
            "acks_per_block",
            c.acks_sent.load(Ordering::Relaxed) as f64
                / c.ack_blocks.load(Ordering::Relaxed).max(1) as f64,
        ),
        (
            "send_errors",
            (c.send_err.load(Ordering::Relaxed) + c.send_quota.load(Ordering::Relaxed)) as f64,
        ),
        ("unexpected", c.other.load(Ordering::Relaxed) as f64),
        ("load1_at_start", load1),
    ]);
    Ok(f)
}

/// Idle connections: relay CPU while idle with none, then RssAnon and CPU per connection with
/// `conns` connections that completed TLS and the SMP handshake and send nothing.
pub fn run_idle(
    target: &Target,
    conns: usize,
    threads: usize,
    idle: Duration,
    progress: bool,
) -> Result<Vec<(&'static str, f64)>, String> {
    std::thread::sleep(Duration::from_secs(1));
    let load1 = proc::load1();
    let s0 = target.sample();
    std::thread::sleep(idle);
    let s1 = target.sample();
    let done = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let threads = threads.clamp(1, conns.max(1));
    let hs: Vec<JoinHandle<Result<Vec<Client>, String>>> = (0..threads)
        .map(|i| {
            let share = conns / threads + usize::from(i < conns % threads);
            let (target, done) = (target.clone(), done.clone());
            std::thread::spawn(move || {
                let mut cs = Vec::with_capacity(share);
                for _ in 0..share {
                    cs.push(target.connect()?);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(cs)
            })
        })
        .collect();
    while hs.iter().any(|h| !h.is_finished()) {
        if progress {
            let d = done.load(Ordering::Relaxed) as usize;
            eprint!(
                "\rconnecting {} {d}/{conns}   ",
                super::report::bar(d, conns)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut clients = Vec::with_capacity(conns);
    for h in hs {
        clients.extend(
            h.join()
                .map_err(|_| "connect thread panicked".to_string())??,
        );
    }
    let connect_s = t.elapsed().as_secs_f64();
    if progress {
        eprint!("\r{}\r", " ".repeat(60));
    }
    let s2 = target.sample();
    // Let allocator and kernel settle before reading memory.
    std::thread::sleep(Duration::from_secs(2));
    let s3 = target.sample();
    std::thread::sleep(idle);
    let s4 = target.sample();
    // Every connection is still served.
    let mut alive = 0u64;
    for c in clients.iter_mut().take(100) {
        if matches!(c.ping().map(|r| r.msg), Ok(Ok(BrokerMsg::Pong))) {
            alive += 1;
        }
    }
    drop(clients);
    let idle_s = idle.as_secs_f64();
    Ok(vec![
        ("connections", conns as f64),
        ("connect_s", connect_s),
        (
            "idle_cpu_ms_per_s_no_conns",
            (s1.cpu_s - s0.cpu_s) * 1e3 / idle_s,
        ),
        (
            "idle_cpu_ms_per_s_with_conns",
            (s4.cpu_s - s3.cpu_s) * 1e3 / idle_s,
        ),
        (
            "relay_cpu_us_per_handshake",
            (s2.cpu_s - s1.cpu_s) * 1e6 / conns as f64,
        ),
        ("relay_rss_anon_mb_before", s1.rss_anon_kb as f64 / 1024.0),
        ("relay_rss_anon_mb_after", s3.rss_anon_kb as f64 / 1024.0),
        (
            "relay_rss_anon_kb_per_conn",
            (s3.rss_anon_kb as f64 - s1.rss_anon_kb as f64) / conns as f64,
        ),
        (
            "relay_rss_kb_per_conn",
            (s3.rss_kb as f64 - s1.rss_kb as f64) / conns as f64,
        ),
        ("pinged_ok_of_100", alive as f64),
        ("load1_at_start", load1),
    ])
}
