//! The reconnect storm after a restart (`smp-load reconnect`): C connections, each the subscriber
//! of K queues, lose the relay to a restart, a clean stop (SIGTERM) or a crash (SIGKILL), and the
//! moment the new relay on the same data directory logs `listening`, every connection reconnects
//! and resubscribes its queues at once, ACKing the messages that waited in one queue in N.
//!
//! A run: the relay starts on a copy of the `setup` data directory; one queue in N gets a message
//! (`creds::fill_parallel`); C connections (one thread each, small stacks) connect and SUB their
//! queues, leaving the messages delivered but not ACKed, so that the relay holds them again after
//! the restart. Then the relay is stopped or killed and started again on the same directory and
//! port. From its `listening` line (`proc::wait_listening`) all threads are released together:
//! each drops its old socket, reconnects (refused or reset attempts are retried after
//! `CONNECT_BACKOFF`, at most `CONNECT_ATTEMPTS` times, as the apps retry), signs its SUBs for
//! the new session, sends them in full blocks (`window` blocks in flight) and ACKs every MSG.
//!
//! Connections come from many loopback source addresses (`source_addr`): the relay lets one
//! address have `limits::MAX_HANDSHAKES_PER_ADDRESS` connections in their handshake at once, so
//! at most that many share one. Measured: the times from `listening` to the last SUB answered and
//! to the last waiting message delivered, relay CPU over that interval against the floor of its
//! handshakes, SUBs and deliveries (`Floor::reconnect_us`), the relay's peak RssAnon over the
//! interval (sampled every `RSS_SAMPLE_EVERY`), and the connect attempts that failed, by kind.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::creds::{self, QueueCreds};
use super::floor::Floor;
use super::proc::{self, RelayProc, RelaySpec, TempDir};
use super::report::percentile;
use super::scenario::{wait_for, Target};
use crate::client::{Client, ClientError, ClientOptions, ClientTransmission};
use crate::protocol::batch::BatchWriter;
use crate::protocol::command::Command;
use crate::protocol::response::BrokerMsg;

/// Connections that share one loopback source address: the relay's bound on one address's
/// connections in their handshake, so that bound is never what refuses them.
pub const CONNS_PER_SOURCE_ADDRESS: usize = crate::limits::MAX_HANDSHAKES_PER_ADDRESS;
/// Connections a run may hold: the relay's own default bound on connections.
pub const MAX_CONNS: usize = crate::limits::MAX_CONNECTIONS;
/// Open files the generator needs besides its connections (the relay's pipes, /proc reads, the
/// fill's connections, standard streams).
const FILES_BESIDES_CONNS: u64 = 256;
/// Stack of each connection's thread: the client's buffers are on the heap, and 10,000 threads
/// with the default 2 MiB would reserve 20 GB of address space.
const STACK_BYTES: usize = 256 * 1024;
/// Attempts to connect (TCP, TLS and the SMP handshake) before a connection gives up.
pub const CONNECT_ATTEMPTS: u32 = 50;
/// Pause after a failed attempt before the next.
pub const CONNECT_BACKOFF: Duration = Duration::from_millis(100);
/// Bound on one attempt: TCP connect (SYNs the listen backlog dropped are sent again after 1, 3,
/// 7 and 15 s) and each wait of the handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on a wait for an answer (a SOK, a MSG or an ACK's answer) once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the relay's RssAnon is read during the measured interval.
pub const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// Connections that put the waiting messages in before the run.
const FILL_THREADS: usize = 2;
/// The kernel's counters of connections the listen queues could not take, reported as their
/// change over the measured interval: (figure, `TcpExt` counter). With `tcp_abort_on_overflow`
/// off (the default) an overflow drops the client's handshake packet, which the client sends
/// again a second or more later, instead of refusing the connection.
const KERNEL_COUNTERS: [(&str, &str); 3] = [
    ("listen_overflows", "ListenOverflows"),
    ("listen_drops", "ListenDrops"),
    ("syncookies_sent", "SyncookiesSent"),
];

/// How the relay goes down before the reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// SIGTERM, and the relay's exit waited for.
    Clean,
    /// SIGKILL: a crash.
    Kill,
}

impl Restart {
    pub fn name(self) -> &'static str {
        match self {
            Restart::Clean => "clean",
            Restart::Kill => "kill",
        }
    }
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct Params {
    pub conns: usize,
    pub queues_per_conn: usize,
    /// One queue in this many holds a waiting message (0: none).
    pub waiting_every: usize,
    /// Body bytes of each waiting message.
    pub msg_bytes: usize,
    /// SUB blocks a connection keeps in flight.
    pub window_blocks: usize,
    /// Bound on each phase of the run (connect and subscribe; reconnect until done).
    pub timeout: Duration,
    pub progress: bool,
}

impl Params {
    /// The queues the run uses: the first conns × queues_per_conn of the file.
    pub fn queues(&self) -> usize {
        self.conns.saturating_mul(self.queues_per_conn)
    }

    fn waiting(&self, q: usize) -> bool {
        self.waiting_every > 0 && q % self.waiting_every == 0
    }

    /// Checks the shape against the queues the file holds and the open-file limit.
    pub fn check(&self, queues_in_file: usize, open_files: u64) -> Result<(), String> {
        if self.conns == 0 || self.queues_per_conn == 0 {
            return Err("--conns and --queues-per-conn must be at least 1".into());
        }
        if self.conns > MAX_CONNS {
            return Err(format!(
                "--conns {} is over {MAX_CONNS}, the relay's bound on connections",
                self.conns
            ));
        }
        if self.queues() > queues_in_file {
            return Err(format!(
                "{} connections × {} queues need {} queues; the file holds {queues_in_file} (run \
                 setup with --queues {})",
                self.conns,
                self.queues_per_conn,
                self.queues(),
                self.queues()
            ));
        }
        let need = self.conns as u64 + FILES_BESIDES_CONNS;
        if open_files < need {
            return Err(format!(
                "the open-file limit is {open_files}; {} connections need {need} (raise \
                 `ulimit -Hn`)",
                self.conns
            ));
        }
        Ok(())
    }
}

/// The loopback address connection `i` binds to: 127.X.Y.Z with Z in 1..=254, Y in 0..=255 and
/// X from 1, `CONNS_PER_SOURCE_ADDRESS` connections on each (127.0.0.0/24, where the relay's own
/// address is, is left alone).
pub fn source_addr(i: usize) -> IpAddr {
    let a = i / CONNS_PER_SOURCE_ADDRESS;
    let z = 1 + a % 254;
    let y = (a / 254) % 256;
    // MAX_CONNS keeps this far below 255: 65,536 connections use X = 1 only.
    let x = 1 + (a / (254 * 256)).min(253);
    IpAddr::V4(Ipv4Addr::new(127, x as u8, y as u8, z as u8))
}

/// Why a connect attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// TCP refused it (nothing listening, or the listen backlog full with `tcp_abort_on_overflow`).
    Refused,
    /// Closed or reset during TLS or the SMP handshake: refused at accept, or dropped.
    Reset,
    /// No answer within `CONNECT_TIMEOUT`.
    Timeout,
    Other,
}

fn classify(e: &ClientError) -> Failure {
    match e {
        ClientError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Failure::Refused
        }
        ClientError::Closed => Failure::Reset,
        ClientError::Timeout => Failure::Timeout,
        _ => Failure::Other,
    }
}

/// One connection's connect attempts after the restart.
#[derive(Debug, Default, Clone)]
struct Attempts {
    tries: u32,
    refused: u32,
    reset: u32,
    timeout: u32,
    other: u32,
    /// The first error of kind `Other`, for the progress output.
    other_error: Option<String>,
}

impl Attempts {
    fn failed(&mut self, e: &ClientError) {
        match classify(e) {
            Failure::Refused => self.refused += 1,
            Failure::Reset => self.reset += 1,
            Failure::Timeout => self.timeout += 1,
            Failure::Other => {
                self.other += 1;
                self.other_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// What one connection saw after the restart.
#[derive(Debug, Default)]
struct Outcome {
    released: Option<Instant>,
    connected: Option<Instant>,
    /// When its last SUB was answered.
    resubscribed: Option<Instant>,
    /// When its last waiting message arrived.
    delivered: Option<Instant>,
    attempts: Attempts,
    tally: Tally,
    /// Why it gave up, if it did.
    error: Option<String>,
}

/// Answers counted on one connection.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    soks: u64,
    sub_errors: u64,
    /// MSGs of queues that hold a waiting message (first delivery of each).
    msgs: u64,
    acked: u64,
    ack_errors: u64,
    ends: u64,
    /// Anything else: MSGs of queues without a waiting message, repeats, stray answers.
    unexpected: u64,
}

/// What the connection threads share with the main thread.
struct Ctx {
    addr: SocketAddr,
    key_hash: [u8; 32],
    creds: Arc<Vec<QueueCreds>>,
    params: Params,
    /// Connections done with the first subscription (well or not).
    subscribed_n: AtomicU64,
    /// Progress after the restart.
    connected_n: AtomicU64,
    soks_n: AtomicU64,
    msgs_n: AtomicU64,
    finished_n: AtomicU64,
    /// Passed once every connection subscribed; the main thread then stops the relay.
    subscribed: Barrier,
    /// Passed once the relay is down: each thread closes its old connection.
    stopped: Barrier,
    /// Passed at `listening`: every connection reconnects.
    go: Barrier,
    /// Passed when the main thread has taken its figures: the connections close.
    end: Barrier,
    failed: Mutex<Option<String>>,
}

impl Ctx {
    fn fail(&self, e: String) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert(e);
        }
    }

    fn failure(&self) -> Option<String> {
        self.failed.lock().ok().and_then(|f| f.clone())
    }
}

fn corr(n: u64) -> [u8; 24] {
    let mut c = [0u8; 24];
    c[..8].copy_from_slice(&n.to_be_bytes());
    c
}

fn corr_num(c: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(c.get(..8)?.try_into().ok()?))
}

/// Connects from `local`, retrying failed attempts after `CONNECT_BACKOFF`.
fn connect(ctx: &Ctx, local: IpAddr, attempts: &mut Attempts) -> Result<Client, ClientError> {
    let opts = ClientOptions {
        local_addr: Some(local),
        timeout: CONNECT_TIMEOUT,
        ..ClientOptions::default()
    };
    loop {
        attempts.tries += 1;
        match Client::connect(ctx.addr, ctx.key_hash, opts.clone()) {
            Ok(c) => return Ok(c),
            Err(e) => {
                attempts.failed(&e);
                if attempts.tries >= CONNECT_ATTEMPTS {
                    return Err(e);
                }
                std::thread::sleep(CONNECT_BACKOFF);
            }
        }
    }
}

enum Kind {
    Sub(usize),
    Ack,
}

/// A block's content and the corrId numbers of its transmissions.
type Block = (Vec<u8>, Vec<(u64, Kind)>);

/// One connection's subscription of `mine`: SUBs signed for this session, packed into full
/// blocks, `window` blocks in flight. With `ack`, every MSG is ACKed and `run` returns once every
/// SUB is answered, every waiting queue that answered SOK has delivered its message, and every
/// ACK is answered; without, once every SUB is answered (MSGs are left unACKed, so the relay
/// delivers them again after the restart).
struct Subscription<'a> {
    ctx: &'a Ctx,
    mine: Range<usize>,
    ack: bool,
    /// Recipient ID → queue index.
    by_rid: HashMap<&'a [u8], usize>,
    /// corrId number → (block, what it was).
    pending: HashMap<u64, (u64, Kind)>,
    /// Block → answers still missing.
    in_flight: HashMap<u64, usize>,
    acks: VecDeque<(usize, Vec<u8>)>,
    /// Waiting queues that answered SOK: the MSGs to wait for.
    expected_msgs: u64,
    /// Per queue of `mine`: a MSG came.
    got_msg: Vec<bool>,
    next_corr: u64,
    next_block: u64,
    tally: Tally,
    resubscribed: Option<Instant>,
    /// When the last waiting message (so far) arrived.
    delivered: Option<Instant>,
}

impl<'a> Subscription<'a> {
    fn new(ctx: &'a Ctx, mine: Range<usize>, ack: bool) -> Self {
        let by_rid = mine
            .clone()
            .map(|q| (ctx.creds[q].rid.as_slice(), q))
            .collect();
        Subscription {
            ctx,
            got_msg: vec![false; mine.len()],
            mine,
            ack,
            by_rid,
            pending: HashMap::new(),
            in_flight: HashMap::new(),
            acks: VecDeque::new(),
            expected_msgs: 0,
            next_corr: 1,
            next_block: 1,
            tally: Tally::default(),
            resubscribed: None,
            delivered: None,
        }
    }

    fn run(&mut self, c: &mut Client) -> Result<(), ClientError> {
        c.set_timeout(REQUEST_TIMEOUT)?;
        let mut blocks = self.sub_blocks(c)?;
        loop {
            while self.in_flight.len() < self.ctx.params.window_blocks.max(1) {
                let Some((content, ids)) = blocks.pop_front() else {
                    break;
                };
                self.send(c, &content, ids)?;
            }
            while !self.acks.is_empty() {
                self.send_acks(c)?;
            }
            if blocks.is_empty() && self.done() {
                return Ok(());
            }
            for t in c.recv_block()? {
                self.handle(t);
            }
        }
    }

    fn answered(&self) -> u64 {
        self.tally.soks + self.tally.sub_errors
    }

    fn done(&self) -> bool {
        let subs_done = self.answered() == self.mine.len() as u64;
        if !self.ack {
            return subs_done;
        }
        subs_done && self.tally.msgs >= self.expected_msgs && self.pending.is_empty()
    }

    /// Every SUB, signed for this session, packed into blocks with their corrId numbers.
    fn sub_blocks(&mut self, c: &Client) -> Result<VecDeque<Block>, ClientError> {
        let mut out = VecDeque::new();
        let mut bw = BatchWriter::new();
        let mut ids = Vec::new();
        for q in self.mine.clone() {
            let cr = &self.ctx.creds[q];
            let id = self.next_corr;
            self.next_corr += 1;
            let t =
                ClientTransmission::new(&corr(id), &cr.rid, Command::Sub).signed(cr.rcv_signer());
            let enc = c.encode_transmission(&t)?;
            if !bw.try_push(&enc) {
                out.push_back((bw.content(), std::mem::take(&mut ids)));
                bw.clear();
                if !bw.try_push(&enc) {
                    return Err(ClientError::LargeMsg);
                }
            }
            ids.push((id, Kind::Sub(q)));
        }
        if !bw.is_empty() {
            out.push_back((bw.content(), ids));
        }
        Ok(out)
    }

    fn send(
        &mut self,
        c: &mut Client,
        content: &[u8],
        ids: Vec<(u64, Kind)>,
    ) -> Result<(), ClientError> {
        let b = self.next_block;
        self.next_block += 1;
        c.send_content(content)?;
        self.in_flight.insert(b, ids.len());
        for (id, k) in ids {
            self.pending.insert(id, (b, k));
        }
        Ok(())
    }

    /// The queued ACKs, as many as fit in one block.
    fn send_acks(&mut self, c: &mut Client) -> Result<(), ClientError> {
        let mut bw = BatchWriter::new();
        let mut ids = Vec::new();
        while let Some((q, msg_id)) = self.acks.front() {
            let cr = &self.ctx.creds[*q];
            let id = self.next_corr;
            let t = ClientTransmission::new(&corr(id), &cr.rid, Command::Ack(msg_id.clone()))
                .signed(cr.rcv_signer());
            let enc = c.encode_transmission(&t)?;
            if !bw.try_push(&enc) {
                if ids.is_empty() {
                    return Err(ClientError::LargeMsg);
                }
                break;
            }
            self.next_corr += 1;
            ids.push((id, Kind::Ack));
            self.acks.pop_front();
        }
        self.send(c, &bw.content(), ids)
    }

    fn finish(&mut self, block: u64) {
        if let Some(n) = self.in_flight.get_mut(&block) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&block);
            }
        }
    }

    fn msg(&mut self, entity: &[u8], msg_id: Vec<u8>) {
        let Some(&q) = self.by_rid.get(entity) else {
            self.tally.unexpected += 1;
            return;
        };
        let first = !std::mem::replace(&mut self.got_msg[q - self.mine.start], true);
        if !(first && self.ctx.params.waiting(q)) {
            self.tally.unexpected += 1;
        } else {
            self.tally.msgs += 1;
            if self.ack {
                self.ctx.msgs_n.fetch_add(1, Ordering::Relaxed);
                self.delivered = Some(Instant::now());
            }
        }
        if self.ack {
            self.acks.push_back((q, msg_id));
        }
    }

    fn handle(&mut self, t: crate::client::ServerTransmission) {
        if t.corr_id.is_empty() {
            match t.msg {
                Ok(BrokerMsg::Msg { msg_id, .. }) => self.msg(&t.entity_id, msg_id),
                Ok(BrokerMsg::End) => self.tally.ends += 1,
                _ => self.tally.unexpected += 1,
            }
            return;
        }
        let Some((block, kind)) = corr_num(&t.corr_id).and_then(|n| self.pending.remove(&n)) else {
            self.tally.unexpected += 1;
            return;
        };
        self.finish(block);
        match kind {
            Kind::Sub(q) => {
                if matches!(t.msg, Ok(BrokerMsg::Sok(_))) {
                    self.tally.soks += 1;
                    if self.ctx.params.waiting(q) {
                        self.expected_msgs += 1;
                    }
                    if self.ack {
                        self.ctx.soks_n.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    self.tally.sub_errors += 1;
                }
                if self.answered() == self.mine.len() as u64 {
                    self.resubscribed = Some(Instant::now());
                }
            }
            Kind::Ack => match t.msg {
                Ok(BrokerMsg::Ok) => self.tally.acked += 1,
                Ok(BrokerMsg::Msg { msg_id, .. }) => {
                    self.tally.acked += 1;
                    self.msg(&t.entity_id, msg_id);
                }
                _ => self.tally.ack_errors += 1,
            },
        }
    }
}

/// One connection's thread: subscribe, wait out the restart, reconnect and resubscribe.
fn connection(ctx: Arc<Ctx>, i: usize) -> Outcome {
    let k = ctx.params.queues_per_conn;
    let mine = i * k..(i + 1) * k;
    let local = source_addr(i);
    let mut before = Attempts::default();
    let first = connect(&ctx, local, &mut before).and_then(|mut c| {
        Subscription::new(&ctx, mine.clone(), false)
            .run(&mut c)
            .map(|()| c)
    });
    let old = match first {
        Ok(c) => Some(c),
        Err(e) => {
            ctx.fail(format!(
                "connection {i} (from {local}) before the restart: {e}"
            ));
            None
        }
    };
    ctx.subscribed_n.fetch_add(1, Ordering::Relaxed);
    ctx.subscribed.wait();
    ctx.stopped.wait();
    drop(old);
    ctx.go.wait();
    let mut out = Outcome {
        released: Some(Instant::now()),
        ..Outcome::default()
    };
    let mut sub = Subscription::new(&ctx, mine, true);
    let result = connect(&ctx, local, &mut out.attempts).and_then(|mut c| {
        out.connected = Some(Instant::now());
        ctx.connected_n.fetch_add(1, Ordering::Relaxed);
        sub.run(&mut c).map(|()| c)
    });
    out.tally = sub.tally;
    out.resubscribed = sub.resubscribed;
    out.delivered = sub.delivered;
    let client = match result {
        Ok(c) => Some(c),
        Err(e) => {
            out.error = Some(format!("connection {i} (from {local}): {e}"));
            None
        }
    };
    ctx.finished_n.fetch_add(1, Ordering::Relaxed);
    ctx.end.wait();
    drop(client);
    out
}

/// Reads the relay's RssAnon every `RSS_SAMPLE_EVERY` until stopped; returns the peak (KiB) and
/// the samples taken.
struct RssSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<(u64, u64)>>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::spawn(move || {
            let pid = pid.to_string();
            let (mut peak, mut n) = (0, 0);
            loop {
                peak = peak.max(proc::sample(&pid).rss_anon_kb);
                n += 1;
                if stop2.load(Ordering::Relaxed) {
                    return (peak, n);
                }
                std::thread::sleep(RSS_SAMPLE_EVERY);
            }
        });
        RssSampler {
            stop,
            handle: Some(handle),
        }
    }

    fn finish(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or((0, 0))
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn secs_since(t0: Instant, t: Option<Instant>) -> f64 {
    t.map(|t| t.saturating_duration_since(t0).as_secs_f64())
        .unwrap_or(f64::NAN)
}

/// One reconnect run: a relay on a copy of `base`, the restart of kind `restart`, and the
/// figures of the reconnect. The relay is killed and the copy removed at the end.
pub fn run(
    spec: &RelaySpec,
    base: &Path,
    creds: &Arc<Vec<QueueCreds>>,
    restart: Restart,
    p: &Params,
    floor: &Floor,
) -> Result<Vec<(&'static str, f64)>, String> {
    let n = p.queues();
    if n > creds.len() || p.conns == 0 {
        return Err(format!("{} queues asked, {} in the file", n, creds.len()));
    }
    let dir = TempDir::new("reconnect").map_err(|e| e.to_string())?;
    proc::copy_data_dir(base, dir.path()).map_err(|e| format!("copy {}: {e}", base.display()))?;
    let relay = spec.start(dir.path())?;
    let with_log = |e: String, r: &RelayProc| format!("{e}\nrelay log:\n{}", r.log_tail());
    let port = relay.addr.port();

    let waiting: Vec<QueueCreds> = (0..n)
        .filter(|&q| p.waiting(q))
        .map(|q| creds[q].clone())
        .collect();
    let waiting_n = waiting.len() as u64;
    if !waiting.is_empty() {
        creds::fill_parallel(
            relay.addr,
            relay.key_hash,
            &Arc::new(waiting),
            1,
            p.msg_bytes,
            FILL_THREADS,
        )
        .map_err(|e| with_log(format!("waiting messages: {}", e.0), &relay))?;
    }

    let ctx = Arc::new(Ctx {
        addr: relay.addr,
        key_hash: relay.key_hash,
        creds: creds.clone(),
        params: p.clone(),
        subscribed_n: AtomicU64::new(0),
        connected_n: AtomicU64::new(0),
        soks_n: AtomicU64::new(0),
        msgs_n: AtomicU64::new(0),
        finished_n: AtomicU64::new(0),
        subscribed: Barrier::new(p.conns + 1),
        stopped: Barrier::new(p.conns + 1),
        go: Barrier::new(p.conns + 1),
        end: Barrier::new(p.conns + 1),
        failed: Mutex::new(None),
    });
    let mut threads = Vec::with_capacity(p.conns);
    for i in 0..p.conns {
        let ctx = ctx.clone();
        let h = std::thread::Builder::new()
            .name(format!("conn-{i}"))
            .stack_size(STACK_BYTES)
            .spawn(move || connection(ctx, i))
            .map_err(|e| {
                format!(
                    "thread for connection {i}: {e} (each connection is a thread: lower --conns \
                     or raise kernel.threads-max and kernel.pid_max)"
                )
            })?;
        threads.push(h);
    }
    let conns = p.conns as u64;
    let c = &ctx;
    let before = || {
        format!(
            "subscribing {} {}/{conns} connections",
            super::report::bar(c.subscribed_n.load(Ordering::Relaxed) as usize, p.conns),
            c.subscribed_n.load(Ordering::Relaxed)
        )
    };
    let prog: Option<&dyn Fn() -> String> = if p.progress { Some(&before) } else { None };
    // Every thread counts itself here, failed or not: the failures are read after the barrier.
    wait_for(
        Instant::now() + p.timeout,
        "the subscriptions before the restart",
        prog,
        || Ok(c.subscribed_n.load(Ordering::Relaxed) >= conns),
    )
    .map_err(|e| with_log(e, &relay))?;
    ctx.subscribed.wait();
    if let Some(e) = ctx.failure() {
        return Err(with_log(e, &relay));
    }
    if p.progress {
        eprintln!("\r{}\rrestart ({})", " ".repeat(60), restart.name());
    }

    let t_stop = Instant::now();
    match restart {
        Restart::Clean => relay.stop_clean()?,
        Restart::Kill => relay.kill()?,
    }
    let stop_s = t_stop.elapsed().as_secs_f64();
    ctx.stopped.wait();
    let t_start = Instant::now();
    let relay = spec.start_on(dir.path(), port)?;
    // `listening` was just seen: the clock starts.
    let t0 = Instant::now();
    let start_s = (t0 - t_start).as_secs_f64();
    let target = Target {
        addr: relay.addr,
        key_hash: relay.key_hash,
        pid: Some(relay.pid()),
        db_pid: None,
        db_conninfo: None,
    };
    let load1 = proc::load1();
    let kernel0: Vec<Option<u64>> = KERNEL_COUNTERS
        .iter()
        .map(|(_, c)| proc::tcp_ext(c))
        .collect();
    let r0 = target.sample();
    let g0 = proc::cpu_seconds("self").unwrap_or(f64::NAN);
    let rss = RssSampler::start(relay.pid());
    ctx.go.wait();

    let subs = n as u64;
    let after = || {
        format!(
            "reconnected {}/{conns} resubscribed {}/{subs} delivered {}/{waiting_n}",
            c.connected_n.load(Ordering::Relaxed),
            c.soks_n.load(Ordering::Relaxed),
            c.msgs_n.load(Ordering::Relaxed)
        )
    };
    let prog: Option<&dyn Fn() -> String> = if p.progress { Some(&after) } else { None };
    wait_for(t0 + p.timeout, "the reconnect", prog, || {
        Ok(c.finished_n.load(Ordering::Relaxed) >= conns)
    })
    .map_err(|e| with_log(e, &relay))?;
    let run_s = t0.elapsed().as_secs_f64();
    let r1 = target.sample();
    let g1 = proc::cpu_seconds("self").unwrap_or(f64::NAN);
    let (peak_kb, rss_samples) = rss.finish();
    let kernel: Vec<(&'static str, f64)> = KERNEL_COUNTERS
        .iter()
        .zip(kernel0)
        .map(|((figure, counter), before)| {
            let delta = match (before, proc::tcp_ext(counter)) {
                (Some(a), Some(b)) => b.saturating_sub(a) as f64,
                _ => f64::NAN,
            };
            (*figure, delta)
        })
        .collect();
    ctx.end.wait();
    if p.progress {
        eprint!("\r{}\r", " ".repeat(80));
    }
    let mut outcomes = Vec::with_capacity(p.conns);
    for h in threads {
        outcomes.push(
            h.join()
                .map_err(|_| "a connection thread panicked".to_string())?,
        );
    }
    drop(relay);
    drop(dir);

    let mut total = Tally::default();
    let mut tries = 0u64;
    let (mut refused, mut reset, mut timeout, mut other) = (0u64, 0u64, 0u64, 0u64);
    let mut gave_up = 0u64;
    let mut ready_us = Vec::with_capacity(outcomes.len());
    let mut connect_us = Vec::with_capacity(outcomes.len());
    for o in &outcomes {
        let t = &o.tally;
        total.soks += t.soks;
        total.sub_errors += t.sub_errors;
        total.msgs += t.msgs;
        total.acked += t.acked;
        total.ack_errors += t.ack_errors;
        total.ends += t.ends;
        total.unexpected += t.unexpected;
        let a = &o.attempts;
        tries += u64::from(a.tries);
        refused += u64::from(a.refused);
        reset += u64::from(a.reset);
        timeout += u64::from(a.timeout);
        other += u64::from(a.other);
        if o.error.is_some() {
            gave_up += 1;
        }
        if let (Some(r), Some(c)) = (o.released, o.connected) {
            connect_us.push((c - r).as_micros() as u64);
        }
        if let (Some(r), Some(s)) = (o.released, o.resubscribed) {
            ready_us.push((s - r).as_micros() as u64);
        }
    }
    if p.progress {
        if let Some(e) = outcomes.iter().find_map(|o| o.error.as_deref()) {
            eprintln!("{gave_up} connections gave up; the first: {e}");
        }
        if let Some(e) = outcomes
            .iter()
            .find_map(|o| o.attempts.other_error.as_deref())
        {
            eprintln!("{other} connect attempts failed otherwise; the first: {e}");
        }
    }
    let last = |f: fn(&Outcome) -> Option<Instant>| outcomes.iter().filter_map(f).max();
    let release_spread_ms = last(|o| o.released)
        .map(|t| t.saturating_duration_since(t0).as_secs_f64() * 1e3)
        .unwrap_or(f64::NAN);
    let handshakes = conns - gave_up;
    let relay_cpu = r1.cpu_s - r0.cpu_s;
    let run_floor_us = floor.reconnect_us(handshakes, total.soks, total.msgs);
    let mb = |kb: u64| kb as f64 / 1024.0;
    let ms = |us: f64| us / 1e3;
    let mut figures = vec![
        ("conns", conns as f64),
        ("subs", subs as f64),
        ("waiting", waiting_n as f64),
        ("stop_s", stop_s),
        ("start_to_listening_s", start_s),
        ("release_spread_ms", release_spread_ms),
        ("connected_s", secs_since(t0, last(|o| o.connected))),
        ("resubscribed_s", secs_since(t0, last(|o| o.resubscribed))),
        (
            "delivered_s",
            if waiting_n == 0 {
                0.0
            } else {
                secs_since(t0, last(|o| o.delivered))
            },
        ),
        ("run_s", run_s),
        ("connect_p50_ms", ms(percentile(&mut connect_us, 0.5))),
        ("connect_p99_ms", ms(percentile(&mut connect_us, 0.99))),
        ("resubscribed_p50_ms", ms(percentile(&mut ready_us, 0.5))),
        ("resubscribed_p99_ms", ms(percentile(&mut ready_us, 0.99))),
        ("connect_attempts", tries as f64),
        ("connect_retries", tries.saturating_sub(conns) as f64),
        ("connect_refused", refused as f64),
        ("connect_reset", reset as f64),
        ("connect_timeout", timeout as f64),
        ("connect_other", other as f64),
        ("conns_gave_up", gave_up as f64),
    ];
    figures.extend(kernel);
    figures.extend([
        ("subs_answered", total.soks as f64),
        ("sub_errors", total.sub_errors as f64),
        ("delivered", total.msgs as f64),
        ("acked", total.acked as f64),
        ("ack_errors", total.ack_errors as f64),
        ("ends", total.ends as f64),
        ("unexpected", total.unexpected as f64),
        ("relay_cpu_s", relay_cpu),
        (
            "relay_cpu_us_per_handshake",
            relay_cpu * 1e6 / handshakes.max(1) as f64,
        ),
        (
            "relay_cpu_us_per_sub",
            relay_cpu * 1e6 / total.soks.max(1) as f64,
        ),
        ("cpu_over_run_floor", relay_cpu * 1e6 / run_floor_us),
        ("floor_us_per_handshake", floor.per_handshake_us()),
        ("floor_us_per_sub", floor.per_sub_us()),
        ("floor_us_per_delivery", floor.per_delivery_us()),
        ("relay_rss_anon_mb_at_listening", mb(r0.rss_anon_kb)),
        (
            "relay_rss_anon_peak_mb",
            mb(peak_kb.max(r0.rss_anon_kb).max(r1.rss_anon_kb)),
        ),
        ("relay_rss_anon_mb_at_end", mb(r1.rss_anon_kb)),
        ("relay_hwm_mb", mb(r1.hwm_kb)),
        ("rss_samples", rss_samples as f64),
        ("gen_cpu_s", g1 - g0),
        ("load1_at_start", load1),
    ]);
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_addresses_are_shared_by_at_most_the_per_address_bound() {
        let mut seen: HashMap<IpAddr, usize> = HashMap::new();
        for i in 0..MAX_CONNS {
            let a = source_addr(i);
            match a {
                IpAddr::V4(v4) => {
                    let o = v4.octets();
                    assert_eq!(o[0], 127, "{a}");
                    assert_ne!(o[1], 0, "{a} is in the relay's 127.0.0.0/24");
                    assert!((1..=254).contains(&o[3]), "{a}");
                }
                IpAddr::V6(_) => panic!("{a} is not IPv4"),
            }
            *seen.entry(a).or_default() += 1;
        }
        assert!(seen.values().all(|&n| n <= CONNS_PER_SOURCE_ADDRESS));
        assert_eq!(seen.len(), MAX_CONNS.div_ceil(CONNS_PER_SOURCE_ADDRESS));
    }

    #[test]
    fn connect_failures_are_told_apart() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(&ClientError::Io(refused)), Failure::Refused);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&ClientError::from(reset)), Failure::Reset);
        assert_eq!(classify(&ClientError::Timeout), Failure::Timeout);
        assert_eq!(classify(&ClientError::BadBlock), Failure::Other);
    }

    #[test]
    fn shapes_beyond_the_file_or_the_limits_are_refused() {
        let p = Params {
            conns: 10,
            queues_per_conn: 30,
            waiting_every: 10,
            msg_bytes: 100,
            window_blocks: 4,
            timeout: Duration::from_secs(1),
            progress: false,
        };
        assert!(p.check(300, 1_000_000).is_ok());
        assert!(p
            .check(299, 1_000_000)
            .unwrap_err()
            .contains("--queues 300"));
        assert!(p.check(300, 100).unwrap_err().contains("open-file"));
        let none = Params {
            conns: 0,
            ..p.clone()
        };
        assert!(none.check(300, 1_000_000).is_err());
        let many = Params {
            conns: MAX_CONNS + 1,
            ..p
        };
        assert!(many.check(usize::MAX, u64::MAX).is_err());
    }
}
