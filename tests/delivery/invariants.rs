//! Seeded randomized runs of concurrent SEND / SUB / ACK / GET / DEL / reconnect on two shards,
//! checked at quiescence against the delivery invariants of `docs/ARCHITECTURE.md` §3 (I1–I5).
//!
//! Each seed gets fresh queues on one shared relay (`--cores 2`): a few queues, so operations
//! collide; recipient threads that pipeline random blocks of SUB/ACK/GET/DEL/PING (and reconnect);
//! sender threads on their own connections that pipeline SENDs. Every request and everything each
//! connection receives is logged with a global logical clock. At the end every recipient connection
//! fences both owners (a request answered by each), a fresh connection drains every live queue with
//! SUB+ACK, and the pure checker below reads the logs. The seed fixes the operations each thread
//! chooses, not the interleaving: `INVARIANT_SEED=<n>` replays one seed's choices,
//! `INVARIANT_SEEDS` and `INVARIANT_OPS` scale the run.
//!
//! The logical clock makes cross-connection claims sound without timing: a request takes its
//! time before it is written, a received transmission after it is read. A request sent after the
//! response to ACK(m) was read reaches m's owner after that ACK; and since one owner's output to a
//! connection keeps its order (O1), anything that owner sends the connection after answering such a
//! request was produced after the ACK too (the "fence" of the checker).

use crate::common;
use crate::support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{self, auth_key, parse_ids, KeyAlg, RecipientKeys};
use smp_relay::client::{new_corr_id, Client, ClientError, ClientTransmission, ServerTransmission};
use smp_relay::protocol::command::{Command, SubMode};
use smp_relay::protocol::error::{CommandError, ErrorType};
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::server::router::owner_shard;
use support::{send_cmd, Queue};

const SHARDS: usize = 2;
const DEFAULT_SEEDS: u64 = 50;
const DEFAULT_OPS: usize = 2000;
const RECIPIENTS: usize = 3;
const SENDERS: usize = 2;
/// Live queues per seed: few, so that operations on one queue collide.
const QUEUES: usize = 4;
/// Share of a seed's operations done by recipients (the rest are SENDs).
const RECIPIENT_SHARE_PCT: usize = 60;
/// Blocks written before reading, and transmissions per block, of one round.
const MAX_BLOCKS_PER_ROUND: usize = 3;
const MAX_OPS_PER_BLOCK: usize = 7;
const MAX_SENDS_PER_BLOCK: usize = 8;
/// How long a fenced connection must stay silent before its log is taken as complete.
const QUIET: Duration = Duration::from_millis(100);
/// The relay's output high water mark in these runs (`--test-output-high-water-bytes`).
const OUTPUT_HIGH_WATER_BYTES: usize = 4096;
/// The slow-reader limit of these runs, and the queues the stopped reader at the end subscribes.
const SLOW_READER_CLOSE_SECS: u32 = 2;
const STOPPED_READER_QUEUES: usize = 1200;
/// Violations printed per failing seed.
const MAX_REPORTED: usize = 12;

type QId = usize;
type MsgId = Vec<u8>;
type Corr = Vec<u8>;

/// A message's identity in its body: which sender thread sent it, and its number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Body {
    sender: u32,
    n: u32,
}

impl Body {
    fn bytes(&self) -> Vec<u8> {
        format!("{}:{}", self.sender, self.n).into_bytes()
    }

    fn parse(b: &[u8]) -> Option<Body> {
        let s = std::str::from_utf8(b).ok()?;
        let (a, n) = s.split_once(':')?;
        Some(Body {
            sender: a.parse().ok()?,
            n: n.parse().ok()?,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Op {
    Sub,
    Ack(MsgId),
    Get,
    Del,
    Send(Body),
    New,
    /// A signed request to an unknown ID owned by a given shard: answered `ERR AUTH` by that owner,
    /// after everything it produced for the connection before.
    Fence,
    Ping,
}

#[derive(Clone, Debug, PartialEq)]
enum Got {
    Sok,
    Ok,
    /// A MSG and its body (`None` for the quota marker).
    Msg(MsgId, Option<Body>),
    End,
    Deld,
    Pong,
    Ids,
    Err(ErrorType),
    Other(String),
}

#[derive(Clone, Debug)]
enum Ev {
    Req {
        t: u64,
        /// Which block of its connection carried it: SUBs of one queue in one block are one owner
        /// turn, whose SOKs all precede the MSGs that follow them.
        block: u32,
        corr: Corr,
        q: Option<QId>,
        shard: Option<usize>,
        op: Op,
    },
    /// A response (non-empty corrId) or an event (empty corrId).
    Got {
        t: u64,
        corr: Corr,
        q: Option<QId>,
        got: Got,
    },
}

#[derive(Clone, Debug, Default)]
struct ConnLog {
    name: String,
    evs: Vec<Ev>,
    /// Still connected, fenced and quiet at the end: its subscriptions count for I2.
    live: bool,
    /// The final drain: its first MSG of each queue is that queue's head at quiescence.
    drain: bool,
}

/// Everything one seed produced, for the checker.
#[derive(Clone, Debug, Default)]
struct Run {
    shard_of: Vec<usize>,
    conns: Vec<ConnLog>,
}

// ------------------------------------------------------------------------------------------------
// The checker: pure, over the logs.

/// What one SEND became.
struct SendInfo {
    q: QId,
    send_t: u64,
    ok_t: Option<u64>,
}

/// What one connection's walk knows of one queue.
#[derive(Default)]
struct SubState {
    subscribed: bool,
    /// END or DELD since the last SOK.
    ended: bool,
    /// MsgIds sent to this subscription since its SOK, and how often (I3).
    epoch: HashMap<MsgId, usize>,
    /// The block of the SUBs that started it, and how many SUBs of this queue that block had: each
    /// may send the head once.
    epoch_block: Option<u32>,
    subs_in_epoch: usize,
    /// The delivered, unacknowledged message (I2).
    outstanding: Option<MsgId>,
}

#[derive(Default)]
struct Report {
    violations: Vec<String>,
    /// I2 cases where the subscriber's outstanding message was removed by another connection's
    /// GET-mode ACK: the subscriber waits for its own ACK, as in the reference.
    i2_relaxed: usize,
    /// Live subscriptions of non-empty queues at quiescence (what I2 looked at).
    i2_checked: usize,
    deliveries: usize,
    /// Messages the drain found left in the queues.
    left_over: usize,
}

/// A request awaiting its response on one connection: time, queue, owner shard, op, block.
type Pending<'a> = (u64, Option<QId>, Option<usize>, &'a Op, u32);

fn check(run: &Run) -> Report {
    let mut rep = Report::default();
    let v = &mut rep.violations;
    // Pass 1: requests by corrId, and what their responses settled.
    let mut reqs: HashMap<&[u8], (u64, Option<QId>, &Op)> = HashMap::new();
    for c in &run.conns {
        for e in &c.evs {
            if let Ev::Req { t, corr, q, op, .. } = e {
                if reqs.insert(corr, (*t, *q, op)).is_some() {
                    v.push(format!("{}: corrId used twice", c.name));
                }
            }
        }
    }
    let mut sends: HashMap<Body, SendInfo> = HashMap::new();
    let mut ack_t: HashMap<MsgId, u64> = HashMap::new();
    let mut acked_pre: HashSet<MsgId> = HashSet::new();
    let mut answered: HashSet<&[u8]> = HashSet::new();
    let mut del_t: HashMap<QId, u64> = HashMap::new();
    let mut body_of: HashMap<MsgId, Body> = HashMap::new();
    for c in &run.conns {
        for e in &c.evs {
            match e {
                Ev::Req {
                    t,
                    q: Some(q),
                    op: Op::Send(b),
                    ..
                } => {
                    let info = SendInfo {
                        q: *q,
                        send_t: *t,
                        ok_t: None,
                    };
                    let twice = sends.insert(*b, info).is_some();
                    if twice {
                        v.push(format!("{}: body {b:?} sent twice", c.name));
                    }
                }
                Ev::Got { t, corr, got, .. } if !corr.is_empty() => {
                    if !answered.insert(corr) {
                        v.push(format!("{}: two responses to one request", c.name));
                    }
                    let Some(&(_, rq, op)) = reqs.get(&corr[..]) else {
                        v.push(format!("{}: response to an unknown corrId", c.name));
                        continue;
                    };
                    match (op, got) {
                        (Op::Send(b), Got::Ok) => {
                            if let Some(s) = sends.get_mut(b) {
                                s.ok_t = Some(*t);
                            }
                        }
                        (Op::Ack(m), Got::Ok | Got::Msg(..)) => {
                            let a = ack_t.entry(m.clone()).or_insert(*t);
                            *a = (*a).min(*t);
                            if !c.drain {
                                acked_pre.insert(m.clone());
                            }
                        }
                        (Op::Del, Got::Ok) => {
                            if let Some(q) = rq {
                                del_t.entry(q).or_insert(*t);
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
            if let Ev::Got {
                got: Got::Msg(m, Some(b)),
                ..
            } = e
            {
                body_of.insert(m.clone(), *b);
            }
        }
    }
    // ACKs never answered (a connection dropped with them in flight) may have deleted their message.
    let mut maybe_acked: HashSet<Body> = HashSet::new();
    for c in &run.conns {
        for e in &c.evs {
            if let Ev::Req {
                corr,
                op: Op::Ack(m),
                ..
            } = e
            {
                if !answered.contains(&corr[..]) {
                    if let Some(b) = body_of.get(m) {
                        maybe_acked.insert(*b);
                    }
                }
            }
        }
    }
    let shard = |q: QId| run.shard_of.get(q).copied().unwrap_or(0);

    // Pass 2: each connection in its own order.
    let mut live_subs: BTreeMap<QId, Vec<(String, Option<MsgId>)>> = BTreeMap::new();
    let mut heads: HashMap<QId, Option<MsgId>> = HashMap::new();
    for c in &run.conns {
        let who = &c.name;
        let mut pending: HashMap<&[u8], Pending> = HashMap::new();
        let mut fence = [0u64; SHARDS];
        let mut subs: HashMap<QId, SubState> = HashMap::new();
        let mut acked_here: HashSet<MsgId> = HashSet::new();
        let mut first_seen: HashSet<MsgId> = HashSet::new();
        let mut last_n: HashMap<(QId, u32), u32> = HashMap::new();
        let mut max_send_seen: HashMap<QId, u64> = HashMap::new();
        for (i, e) in c.evs.iter().enumerate() {
            let (t, corr, q, got) = match e {
                Ev::Req {
                    t,
                    block,
                    corr,
                    q,
                    shard,
                    op,
                } => {
                    pending.insert(corr, (*t, *q, *shard, op, *block));
                    continue;
                }
                Ev::Got { t, corr, q, got } => (*t, corr, *q, got),
            };
            let at = format!("{who} #{i} (t={t})");
            let req = if corr.is_empty() {
                None
            } else {
                let Some(r) = pending.remove(&corr[..]) else {
                    v.push(format!("{at}: response to no pending request: {got:?}"));
                    continue;
                };
                if let Some(s) = r.2 {
                    fence[s] = fence[s].max(r.0);
                }
                if q != r.1 && !matches!(r.3, Op::New | Op::Fence | Op::Ping) {
                    v.push(format!("{at}: response names another queue: {got:?}"));
                }
                Some(r)
            };
            if let Got::Msg(m, b) = got {
                let Some(q) = q else {
                    v.push(format!("{at}: MSG for an unknown entity"));
                    continue;
                };
                rep.deliveries += 1;
                let st = subs.entry(q).or_default();
                let via = match req {
                    None => "event",
                    Some((_, _, _, Op::Ack(_), _)) => "ACK response",
                    Some((_, _, _, Op::Get, _)) => "GET response",
                    Some((_, _, _, op, _)) => {
                        v.push(format!("{at}: MSG answers {op:?}"));
                        continue;
                    }
                };
                let sub_mode = via != "GET response";
                if via == "event" && (!st.subscribed || st.ended) {
                    v.push(format!(
                        "{at}: I3: MSG event for q{q} on a connection not subscribed to it \
                         (ended: {})",
                        st.ended
                    ));
                }
                if acked_here.contains(m) {
                    v.push(format!(
                        "{at}: I4: {} ({via}) after this connection's ACK of it was answered",
                        show(m, b)
                    ));
                } else if let Some(&ta) = ack_t.get(m) {
                    if ta < fence[shard(q)] {
                        v.push(format!(
                            "{at}: I4: {} ({via}) after its ACK was answered at t={ta}",
                            show(m, b)
                        ));
                    }
                }
                if let Some(&td) = del_t.get(&q) {
                    if td < fence[shard(q)] {
                        v.push(format!(
                            "{at}: {} of q{q} ({via}) after its DEL was answered at t={td}",
                            show(m, b)
                        ));
                    }
                }
                if sub_mode {
                    let n = st.epoch.entry(m.clone()).or_insert(0);
                    *n += 1;
                    if *n > st.subs_in_epoch.max(1) {
                        v.push(format!(
                            "{at}: I3: {} ({via}) sent {n} times to one subscription of q{q}",
                            show(m, b)
                        ));
                    }
                    st.outstanding = Some(m.clone());
                }
                if c.drain {
                    heads.entry(q).or_insert_with(|| Some(m.clone()));
                    rep.left_over += 1;
                }
                if first_seen.insert(m.clone()) {
                    if let Some(b) = b {
                        match sends.get(b) {
                            None => v.push(format!("{at}: MSG with a body never sent: {b:?}")),
                            Some(s) if s.q != q => {
                                v.push(format!("{at}: {b:?} sent to q{} arrived on q{q}", s.q))
                            }
                            Some(SendInfo { ok_t: None, .. }) => {
                                v.push(format!("{at}: {b:?} delivered, but its SEND failed"))
                            }
                            Some(s) => {
                                if let Some(&last) = last_n.get(&(q, b.sender)) {
                                    if b.n <= last {
                                        v.push(format!(
                                            "{at}: I5: {b:?} on q{q} after sender {}'s \
                                             message {last}",
                                            b.sender
                                        ));
                                    }
                                }
                                last_n.insert((q, b.sender), b.n);
                                let seen = max_send_seen.entry(q).or_insert(0);
                                if s.ok_t.is_some_and(|ok| ok < *seen) {
                                    v.push(format!(
                                        "{at}: I5: {b:?} on q{q} after a message sent (t={seen}) \
                                         once this one's SEND was answered (t={:?})",
                                        s.ok_t
                                    ));
                                }
                                *seen = (*seen).max(s.send_t);
                            }
                        }
                    }
                }
                if let Some((_, _, _, Op::Ack(acked), _)) = req {
                    acked_here.insert(acked.clone());
                }
                continue;
            }
            match (req, got) {
                (None, Got::End | Got::Deld) => {
                    if let Some(q) = q {
                        let st = subs.entry(q).or_default();
                        st.ended = true;
                        st.subscribed = false;
                        st.outstanding = None;
                    } else {
                        v.push(format!("{at}: {got:?} for an unknown entity"));
                    }
                }
                (None, other) => v.push(format!("{at}: unexpected event {other:?}")),
                (Some((rt, _, _, op, block)), got) => {
                    let deleted_before = q.and_then(|q| del_t.get(&q)).is_some_and(|&d| d < rt);
                    let ever_deleted = q.is_some_and(|q| del_t.contains_key(&q));
                    if deleted_before && matches!(got, Got::Sok | Got::Ok) && *op != Op::Ping {
                        v.push(format!(
                            "{at}: {op:?} sent after the queue's DEL was answered got {got:?}"
                        ));
                    }
                    match (op, got) {
                        (Op::Sub, Got::Sok) => {
                            if let Some(q) = q {
                                let st = subs.entry(q).or_default();
                                if st.subscribed && st.epoch_block == Some(block) {
                                    st.subs_in_epoch += 1;
                                } else {
                                    *st = SubState {
                                        subscribed: true,
                                        epoch_block: Some(block),
                                        subs_in_epoch: 1,
                                        ..SubState::default()
                                    };
                                }
                            }
                        }
                        (Op::Ack(m), Got::Ok) => {
                            acked_here.insert(m.clone());
                            if let Some(st) = q.and_then(|q| subs.get_mut(&q)) {
                                st.outstanding = None;
                            }
                        }
                        (Op::Del, Got::Ok) => {
                            if let Some(st) = q.and_then(|q| subs.get_mut(&q)) {
                                st.subscribed = false;
                                st.outstanding = None;
                            }
                        }
                        (Op::Get | Op::Send(_), Got::Ok) | (Op::Ping, Got::Pong) => {}
                        (Op::New, Got::Ids) | (Op::Fence, Got::Err(ErrorType::Auth)) => {}
                        (Op::Ack(_), Got::Err(ErrorType::NoMsg)) => {}
                        (Op::Send(_), Got::Err(ErrorType::Quota)) => {}
                        (Op::Sub | Op::Get, Got::Err(ErrorType::Cmd(CommandError::Prohibited))) => {
                        }
                        (_, Got::Err(ErrorType::Auth)) if ever_deleted => {}
                        (op, got) => v.push(format!("{at}: {op:?} answered {got:?}")),
                    }
                }
            }
        }
        if c.live {
            for (q, st) in subs {
                if st.subscribed && !del_t.contains_key(&q) {
                    live_subs
                        .entry(q)
                        .or_default()
                        .push((who.clone(), st.outstanding));
                }
            }
        }
    }
    // I2 at quiescence: a live subscriber of a non-empty queue has been sent its head.
    for (q, subscribers) in &live_subs {
        if subscribers.len() > 1 {
            let names: Vec<&String> = subscribers.iter().map(|s| &s.0).collect();
            v.push(format!(
                "q{q}: several live subscribers at the end: {names:?}"
            ));
        }
        let Some(Some(head)) = heads.get(q) else {
            continue;
        };
        for (who, outstanding) in subscribers {
            rep.i2_checked += 1;
            match outstanding {
                Some(m) if m == head => {}
                Some(m) if acked_pre.contains(m) => rep.i2_relaxed += 1,
                other => v.push(format!(
                    "I2: {who} is subscribed to q{q}, whose head is {}, but was last sent {}",
                    show(head, &body_of.get(head).copied()),
                    match other {
                        Some(m) => show(m, &body_of.get(m).copied()),
                        None => "nothing since its SUB or ACK".to_string(),
                    }
                )),
            }
        }
    }
    // I1: every SEND answered OK to a queue that was not deleted was ACKed (the drain ACKs what was
    // left), or may have been by an ACK whose answer never came.
    let acked_bodies: HashSet<Body> = ack_t
        .keys()
        .filter_map(|m| body_of.get(m).copied())
        .collect();
    let mut lost: Vec<(Body, QId)> = sends
        .iter()
        .filter(|(b, s)| {
            s.ok_t.is_some()
                && !del_t.contains_key(&s.q)
                && !acked_bodies.contains(b)
                && !maybe_acked.contains(b)
        })
        .map(|(b, s)| (*b, s.q))
        .collect();
    lost.sort();
    for (b, q) in lost {
        v.push(format!(
            "I1: {b:?} to q{q} was answered OK and never ACKed or left over"
        ));
    }
    rep
}

/// The events before the first violation that names a connection and an event (`conn #i`), for
/// the failure message.
fn context(run: &Run, violations: &[String]) -> String {
    const BEFORE: usize = 40;
    let Some((conn, i)) = violations.iter().find_map(|v| {
        let (name, rest) = v.split_once(" #")?;
        let i: usize = rest.split(' ').next()?.parse().ok()?;
        Some((name.to_string(), i))
    }) else {
        return String::new();
    };
    let Some(c) = run.conns.iter().find(|c| c.name == conn) else {
        return String::new();
    };
    let short = |b: &[u8]| -> String { b.iter().take(3).map(|x| format!("{x:02x}")).collect() };
    let mut out = format!("events of {conn} up to #{i}:\n");
    for (k, e) in c
        .evs
        .iter()
        .enumerate()
        .take(i + 1)
        .skip(i.saturating_sub(BEFORE))
    {
        let line = match e {
            Ev::Req {
                t,
                block,
                corr,
                q,
                op,
                ..
            } => {
                let op = match op {
                    Op::Ack(m) => format!("ACK {}", short(m)),
                    op => format!("{op:?}"),
                };
                format!("t={t} -> block {block} corr {} q{q:?} {op}", short(corr))
            }
            Ev::Got { t, corr, q, got } => {
                let got = match got {
                    Got::Msg(m, b) => show(m, b),
                    g => format!("{g:?}"),
                };
                let corr = if corr.is_empty() {
                    "event".into()
                } else {
                    format!("corr {}", short(corr))
                };
                format!("t={t} <- {corr} q{q:?} {got}")
            }
        };
        out.push_str(&format!("  #{k} {line}\n"));
    }
    out
}

fn show(m: &[u8], b: &Option<Body>) -> String {
    let id: String = m.iter().take(3).map(|x| format!("{x:02x}")).collect();
    match b {
        Some(b) => format!("MSG {id} {}:{}", b.sender, b.n),
        None => format!("MSG {id} (quota marker)"),
    }
}

// ------------------------------------------------------------------------------------------------
// The driver: threads over real connections, logging.

struct Shared {
    clock: AtomicU64,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    queues: Vec<(Queue, bool)>,
    by_entity: HashMap<Vec<u8>, QId>,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            clock: AtomicU64::new(0),
            table: Mutex::new(Table::default()),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn add(&self, q: Queue) -> QId {
        let mut t = self.table.lock().expect("table");
        let id = t.queues.len();
        t.by_entity.insert(q.rid().to_vec(), id);
        t.by_entity.insert(q.sid().to_vec(), id);
        t.queues.push((q, false));
        id
    }

    fn live(&self) -> Vec<QId> {
        let t = self.table.lock().expect("table");
        (0..t.queues.len()).filter(|&i| !t.queues[i].1).collect()
    }

    fn queue(&self, q: QId) -> Queue {
        self.table.lock().expect("table").queues[q].0.clone()
    }

    fn mark_deleted(&self, q: QId) {
        self.table.lock().expect("table").queues[q].1 = true;
    }

    fn resolve(&self, entity: &[u8]) -> Option<(QId, [u8; 32])> {
        let t = self.table.lock().expect("table");
        let id = *t.by_entity.get(entity)?;
        Some((id, t.queues[id].0.secret))
    }

    fn shard_of(&self) -> Vec<usize> {
        let t = self.table.lock().expect("table");
        t.queues
            .iter()
            .map(|(q, _)| owner_shard(q.rid(), SHARDS))
            .collect()
    }
}

/// What a recipient thread knows from its connection's log, to choose its next requests.
#[derive(Default)]
struct View {
    outstanding: HashMap<QId, MsgId>,
    /// Every message this connection was sent (for stale ACKs).
    seen: Vec<(QId, MsgId)>,
    deleted: Vec<QId>,
}

/// One connection and its log.
struct Conn<'a> {
    sh: &'a Shared,
    c: Client,
    log: ConnLog,
    ops: HashMap<Corr, (Option<QId>, Op)>,
    waiting: HashSet<Corr>,
    new_keys: HashMap<Corr, RecipientKeys>,
    view: View,
    blocks: u32,
}

impl<'a> Conn<'a> {
    fn open(sh: &'a Shared, relay: &Relay, name: String) -> Conn<'a> {
        Conn {
            sh,
            c: relay.client(),
            log: ConnLog {
                name,
                ..ConnLog::default()
            },
            ops: HashMap::new(),
            waiting: HashSet::new(),
            new_keys: HashMap::new(),
            view: View::default(),
            blocks: 0,
        }
    }

    /// The transmission for `op` on `q`, its shard, and the log entry's queue.
    fn transmission(&mut self, q: Option<QId>, op: &Op) -> (ClientTransmission, Option<usize>) {
        let corr = new_corr_id().to_vec();
        let queue = q.map(|q| self.sh.queue(q));
        let shard = queue.as_ref().map(|q| owner_shard(q.rid(), SHARDS));
        let signed = |cmd: Command| {
            let q = queue.as_ref().expect("a queue");
            ClientTransmission::new(&corr, q.rid(), cmd).signed(q.key().clone())
        };
        match op {
            Op::Sub => (signed(Command::Sub), shard),
            Op::Ack(m) => (signed(Command::Ack(m.clone())), shard),
            Op::Get => (signed(Command::Get), shard),
            Op::Del => (signed(Command::Del), shard),
            Op::Send(b) => {
                let q = queue.as_ref().expect("a queue");
                (
                    ClientTransmission::new(&corr, q.sid(), send_cmd(&b.bytes())),
                    shard,
                )
            }
            Op::New => {
                let keys = RecipientKeys::generate(KeyAlg::Ed25519);
                let mut new = queue::new_queue(&keys);
                new.sub_mode = SubMode::OnlyCreate;
                let t = ClientTransmission::new(&corr, b"", Command::New(new))
                    .signed(keys.auth.clone());
                self.new_keys.insert(corr.clone(), keys);
                (t, None)
            }
            Op::Fence => unreachable!("fences name their shard"),
            Op::Ping => (ClientTransmission::new(&corr, b"", Command::Ping), None),
        }
    }

    /// Logs and writes each block of requests; answers are read by `read_all`.
    fn send(&mut self, blocks: Vec<Vec<(Option<QId>, Op)>>) {
        for block in blocks {
            let mut ts = Vec::with_capacity(block.len());
            for (q, op) in block {
                let (t, shard) = self.transmission(q, &op);
                self.push_req(t, q, shard, op, &mut ts);
            }
            self.write(&ts);
        }
    }

    fn push_req(
        &mut self,
        t: ClientTransmission,
        q: Option<QId>,
        shard: Option<usize>,
        op: Op,
        ts: &mut Vec<ClientTransmission>,
    ) {
        self.log.evs.push(Ev::Req {
            t: self.sh.tick(),
            block: self.blocks,
            corr: t.corr_id.clone(),
            q,
            shard,
            op: op.clone(),
        });
        self.waiting.insert(t.corr_id.clone());
        self.ops.insert(t.corr_id.clone(), (q, op));
        ts.push(t);
    }

    fn write(&mut self, ts: &[ClientTransmission]) {
        self.blocks += 1;
        let name = &self.log.name;
        self.c
            .send_batch(ts)
            .unwrap_or_else(|e| panic!("{name}: send: {e}"));
    }

    /// One fence per shard: after both answers, everything the owners produced for this connection
    /// before is in the log.
    fn fence(&mut self) {
        let key = auth_key(KeyAlg::Ed25519);
        let mut ts = Vec::new();
        for s in 0..SHARDS {
            let entity = loop {
                let e: [u8; 24] = rand::random();
                if owner_shard(&e, SHARDS) == s {
                    break e;
                }
            };
            let corr = new_corr_id();
            let t = ClientTransmission::new(&corr, &entity, Command::Ack(vec![7; 24]))
                .signed(key.clone());
            self.push_req(t, None, Some(s), Op::Fence, &mut ts);
        }
        self.write(&ts);
        self.read_all();
    }

    /// Reads until every request is answered.
    fn read_all(&mut self) {
        while !self.waiting.is_empty() {
            match self.c.recv_block() {
                Ok(b) => self.record(b),
                Err(e) => panic!(
                    "{}: waiting for {} answers: {e}",
                    self.log.name,
                    self.waiting.len()
                ),
            }
        }
    }

    /// Reads until nothing arrives for `QUIET`.
    fn quiet(&mut self) {
        self.c.set_timeout(QUIET).expect("set timeout");
        loop {
            match self.c.recv_block() {
                Ok(b) => self.record(b),
                Err(ClientError::Timeout) => break,
                Err(e) => panic!("{}: quiet wait: {e}", self.log.name),
            }
        }
    }

    fn record(&mut self, block: Vec<ServerTransmission>) {
        for st in block {
            let t = self.sh.tick();
            let resolved = self.sh.resolve(&st.entity_id);
            let q = resolved.map(|r| r.0);
            let got = match &st.msg {
                Ok(BrokerMsg::Sok(_)) => Got::Sok,
                Ok(BrokerMsg::Ok) => Got::Ok,
                Ok(BrokerMsg::End) => Got::End,
                Ok(BrokerMsg::Deld) => Got::Deld,
                Ok(BrokerMsg::Pong) => Got::Pong,
                Ok(BrokerMsg::Err(e)) => Got::Err(e.clone()),
                Ok(BrokerMsg::Ids(_)) => Got::Ids,
                Ok(BrokerMsg::Msg { msg_id, .. }) => match resolved {
                    Some((_, secret)) => match queue::receive(&secret, &st) {
                        Ok(r) => Got::Msg(msg_id.clone(), r.msg.body().and_then(Body::parse)),
                        Err(e) => Got::Other(format!("MSG that does not open: {e}")),
                    },
                    None => Got::Other("MSG for an unknown entity".into()),
                },
                _ => Got::Other(queue::describe(&st)),
            };
            let op = if st.corr_id.is_empty() {
                None
            } else {
                self.waiting.remove(&st.corr_id);
                self.ops.remove(&st.corr_id)
            };
            self.update_view(q, op.as_ref().map(|o| &o.1), &got, &st);
            self.log.evs.push(Ev::Got {
                t,
                corr: st.corr_id,
                q,
                got,
            });
        }
    }

    fn update_view(&mut self, q: Option<QId>, op: Option<&Op>, got: &Got, st: &ServerTransmission) {
        if let (Some(Op::New), Got::Ids) = (op, got) {
            let keys = self.new_keys.remove(&st.corr_id).expect("keys of the NEW");
            let ids = parse_ids(st).expect("IDS");
            self.sh.add(Queue {
                secret: keys.dh.shared(&ids.srv_dh_key),
                keys,
                ids,
            });
            return;
        }
        let Some(q) = q else { return };
        match (op, got) {
            (_, Got::Msg(m, _)) => {
                self.view.outstanding.insert(q, m.clone());
                self.view.seen.push((q, m.clone()));
            }
            (Some(Op::Del), Got::Ok) => {
                self.sh.mark_deleted(q);
                self.view.deleted.push(q);
                self.view.outstanding.remove(&q);
            }
            (Some(Op::Sub | Op::Ack(_) | Op::Get), Got::Ok | Got::Sok)
            | (None, Got::End | Got::Deld) => {
                self.view.outstanding.remove(&q);
            }
            _ => {}
        }
    }

    fn into_log(self, live: bool) -> ConnLog {
        let mut log = self.log;
        log.live = live;
        log
    }
}

/// A round of a recipient: 1..=3 blocks of 1..=7 random requests on the live queues.
fn recipient_round(
    rng: &mut StdRng,
    view: &View,
    live: &[QId],
    may_get: bool,
) -> Vec<Vec<(Option<QId>, Op)>> {
    let blocks = rng.gen_range(1..=MAX_BLOCKS_PER_ROUND);
    let mut deleting = false;
    (0..blocks)
        .map(|_| {
            let n = rng.gen_range(1..=MAX_OPS_PER_BLOCK);
            (0..n)
                .map(|_| {
                    let q = live[rng.gen_range(0..live.len())];
                    let ack = |rng: &mut StdRng| match view.outstanding.get(&q) {
                        Some(m) => Some(Op::Ack(m.clone())),
                        // A stale or foreign ID now and then (ERR NO_MSG, or a wrong-ID ACK).
                        None if rng.gen_ratio(1, 3) && !view.seen.is_empty() => {
                            let (_, m) = &view.seen[rng.gen_range(0..view.seen.len())];
                            Some(Op::Ack(m.clone()))
                        }
                        None => None,
                    };
                    let r = rng.gen_range(0..100);
                    let op = match r {
                        0..=29 => Op::Sub,
                        30..=69 => ack(rng).unwrap_or(Op::Sub),
                        70..=79 if may_get => Op::Get,
                        80..=83 => Op::Ping,
                        84 if !deleting && live.len() > 1 => {
                            deleting = true;
                            Op::Del
                        }
                        _ => ack(rng).unwrap_or(Op::Sub),
                    };
                    (if op == Op::Ping { None } else { Some(q) }, op)
                })
                .collect::<Vec<_>>()
        })
        .map(|block| {
            if !avoid_after_sub() {
                return block;
            }
            let mut subbed = HashSet::new();
            block
                .into_iter()
                .filter(|(q, op)| match (q, op) {
                    (Some(q), Op::Sub) => {
                        subbed.insert(*q);
                        true
                    }
                    (Some(q), _) => !subbed.contains(q),
                    (None, _) => true,
                })
                .collect()
        })
        .filter(|b: &Vec<_>| !b.is_empty())
        .collect()
}

/// `INVARIANT_NO_OP_AFTER_SUB=1`: no ACK/GET/DEL of a queue after its SUB in the same block, to
/// look past the known fault of a SUB's MSG sent after a later request of its block changed the
/// queue.
fn avoid_after_sub() -> bool {
    std::env::var("INVARIANT_NO_OP_AFTER_SUB").is_ok_and(|v| v == "1")
}

fn recipient(
    sh: &Shared,
    relay: &Relay,
    seed: u64,
    idx: usize,
    budget: usize,
    done: &Barrier,
) -> Vec<ConnLog> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003) + idx as u64);
    let mut logs = Vec::new();
    let mut generation = 0;
    let mut conn = Conn::open(sh, relay, format!("r{idx}.{generation}"));
    let mut ops = 0;
    // Thread 0 never uses GET, so that some connections stay in SUB mode for I2.
    let may_get = idx != 0;
    while ops < budget {
        if ops > 0 && rng.gen_ratio(3, 100) {
            // Reconnect: the old connection's subscriptions vanish. Now and then with a round
            // still unanswered (never with a DEL in it, whose outcome the next round depends on).
            if budget - ops > 50 && rng.gen_ratio(1, 4) {
                let round: Vec<Vec<(Option<QId>, Op)>> =
                    recipient_round(&mut rng, &conn.view, &sh.live(), may_get)
                        .into_iter()
                        .map(|b| b.into_iter().filter(|(_, op)| *op != Op::Del).collect())
                        .filter(|b: &Vec<_>| !b.is_empty())
                        .collect();
                ops += round.iter().map(Vec::len).sum::<usize>();
                conn.send(round);
            }
            logs.push(conn.into_log(false));
            generation += 1;
            conn = Conn::open(sh, relay, format!("r{idx}.{generation}"));
            ops += 1;
            continue;
        }
        let live = sh.live();
        let round = recipient_round(&mut rng, &conn.view, &live, may_get);
        ops += round.iter().map(Vec::len).sum::<usize>();
        conn.send(round);
        conn.read_all();
        // A deleted queue is replaced, so that the live set keeps its size.
        for _ in std::mem::take(&mut conn.view.deleted) {
            conn.send(vec![vec![(None, Op::New)]]);
            conn.read_all();
        }
    }
    done.wait();
    conn.fence();
    conn.quiet();
    logs.push(conn.into_log(true));
    logs
}

fn sender(
    sh: &Shared,
    relay: &Relay,
    seed: u64,
    idx: usize,
    budget: usize,
    done: &Barrier,
) -> Vec<ConnLog> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003) + 100 + idx as u64);
    let mut conn = Conn::open(sh, relay, format!("s{idx}"));
    let mut n = 0u32;
    let mut ops = 0;
    while ops < budget {
        let live = sh.live();
        let blocks: Vec<Vec<(Option<QId>, Op)>> = (0..rng.gen_range(1..=2))
            .map(|_| {
                (0..rng.gen_range(1..=MAX_SENDS_PER_BLOCK))
                    .map(|_| {
                        n += 1;
                        let body = Body {
                            sender: idx as u32,
                            n,
                        };
                        (Some(live[rng.gen_range(0..live.len())]), Op::Send(body))
                    })
                    .collect()
            })
            .collect();
        ops += blocks.iter().map(Vec::len).sum::<usize>();
        conn.send(blocks);
        conn.read_all();
    }
    done.wait();
    vec![conn.into_log(false)]
}

/// SUB, then ACK until OK, of every live queue on a fresh connection.
fn drain(sh: &Shared, relay: &Relay) -> ConnLog {
    let mut conn = Conn::open(sh, relay, "drain".into());
    for q in sh.live() {
        conn.send(vec![vec![(Some(q), Op::Sub)]]);
        conn.read_all();
        let mut rounds = 0;
        while let Some(m) = conn.view.outstanding.get(&q).cloned() {
            conn.send(vec![vec![(Some(q), Op::Ack(m))]]);
            conn.read_all();
            rounds += 1;
            assert!(rounds < 1000, "drain of q{q} does not end");
        }
    }
    conn.fence();
    conn.quiet();
    let mut log = conn.into_log(false);
    log.drain = true;
    log
}

/// One seed: fresh queues (at least one per shard), concurrent threads, drain, logs.
fn run_seed(relay: &Relay, seed: u64, ops: usize) -> Run {
    let sh = Shared::new();
    {
        let mut setup = Conn::open(&sh, relay, "setup".into());
        while sh.live().len() < QUEUES || {
            let shards = sh.shard_of();
            (0..SHARDS).any(|s| !shards.contains(&s))
        } {
            setup.send(vec![vec![(None, Op::New)]]);
            setup.read_all();
        }
    }
    let recipient_ops = ops * RECIPIENT_SHARE_PCT / 100 / RECIPIENTS;
    let sender_ops = ops * (100 - RECIPIENT_SHARE_PCT) / 100 / SENDERS;
    let done = Barrier::new(RECIPIENTS + SENDERS);
    let mut conns = Vec::new();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for i in 0..RECIPIENTS {
            let (sh, done) = (&sh, &done);
            handles.push(s.spawn(move || recipient(sh, relay, seed, i, recipient_ops, done)));
        }
        for i in 0..SENDERS {
            let (sh, done) = (&sh, &done);
            handles.push(s.spawn(move || sender(sh, relay, seed, i, sender_ops, done)));
        }
        for h in handles {
            match h.join() {
                Ok(logs) => conns.extend(logs),
                Err(e) => std::panic::resume_unwind(e),
            }
        }
    });
    conns.push(drain(&sh, relay));
    Run {
        shard_of: sh.shard_of(),
        conns,
    }
}

fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    let s = std::env::var(name).ok()?;
    Some(
        s.parse()
            .unwrap_or_else(|_| panic!("{name}={s:?} is not a number")),
    )
}

#[test]
fn randomized_concurrent_operations_keep_the_delivery_invariants() {
    let ops: usize = env_num("INVARIANT_OPS").unwrap_or(DEFAULT_OPS);
    let seeds: Vec<u64> = match env_num::<u64>("INVARIANT_SEED") {
        Some(s) => vec![s],
        None => (1..=env_num("INVARIANT_SEEDS").unwrap_or(DEFAULT_SEEDS)).collect(),
    };
    // Output bounds small enough that pushes are dropped to markers and asked for again on every
    // run: a single queued MSG (~16 KB) is over the high water mark.
    let relay = Relay::start_with(RelayOptions {
        cores: SHARDS,
        extra_args: vec![
            "--test-output-high-water-bytes".into(),
            OUTPUT_HIGH_WATER_BYTES.to_string(),
            "--metrics-interval".into(),
            "1".into(),
            // The randomized connections read all the time and never leave megabytes unread, so
            // only the stopped reader at the end is closed for it.
            "--slow-reader-close-secs".into(),
            SLOW_READER_CLOSE_SECS.to_string(),
            // The stopped reader's close follows the test's clock advance within this.
            "--test-slow-reader-tick-ms".into(),
            "20".into(),
        ],
    });
    let started = Instant::now();
    let mut failed = Vec::new();
    let (mut deliveries, mut relaxed, mut i2_checked, mut left_over) = (0, 0, 0, 0);
    for &seed in &seeds {
        let run =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_seed(&relay, seed, ops)))
                .unwrap_or_else(|_| {
                    panic!(
                "seed {seed} failed while running (replay: INVARIANT_SEED={seed})\nrelay log:\n{}",
                relay.log_text()
            )
                });
        let rep = check(&run);
        deliveries += rep.deliveries;
        relaxed += rep.i2_relaxed;
        i2_checked += rep.i2_checked;
        left_over += rep.left_over;
        if !rep.violations.is_empty() {
            let shown: Vec<&String> = rep.violations.iter().take(MAX_REPORTED).collect();
            eprintln!(
                "seed {seed}: {} violations (replay: INVARIANT_SEED={seed}):\n  {}",
                rep.violations.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n  ")
            );
            eprintln!("{}", context(&run, &rep.violations));
            failed.push(seed);
        }
    }
    eprintln!(
        "{} seeds × {ops} operations in {:.1?}: {deliveries} deliveries, {left_over} messages \
         left for the drain, {i2_checked} live subscriptions of non-empty queues checked for I2 \
         ({relaxed} waiting on a message another connection's GET-mode ACK removed)",
        seeds.len(),
        started.elapsed()
    );
    assert!(
        failed.is_empty(),
        "invariants violated for seeds {failed:?} (replay one with INVARIANT_SEED=<n>)"
    );
    if seeds.len() > 1 {
        stopped_reader_is_closed(&relay);
    }
    relay.publish_metrics();
    let m = relay.metrics();
    eprintln!(
        "back-pressure: {} MSGs dropped to markers, {} re-asks, {} slow-reader closes",
        m["smprelay_output_drops_total"],
        m["smprelay_output_reasks_total"],
        m["smprelay_slow_reader_closes_total"]
    );
    if seeds.len() > 1 {
        assert!(
            m["smprelay_output_drops_total"] > 0 && m["smprelay_output_reasks_total"] > 0,
            "the run never dropped and re-asked a delivery: the bounds are not small enough"
        );
        assert_eq!(
            m["smprelay_slow_reader_closes_total"], 1,
            "only the stopped reader is closed as a slow reader"
        );
    }
}

/// A connection subscribes to many queues with a message each and reads nothing: more answers
/// than the sockets hold wait, its socket takes nothing, and the relay closes it after
/// `SLOW_READER_CLOSE_SECS` on its clock, which the test advances instead of waiting.
fn stopped_reader_is_closed(relay: &Relay) {
    let mut setup = relay.client();
    // ~16 KB per MSG: well past what loopback sockets buffer.
    let qs = support::create_many(&mut setup, STOPPED_READER_QUEUES, 200);
    for chunk in qs.chunks(200) {
        let ts: Vec<ClientTransmission> = chunk
            .iter()
            .map(|q| ClientTransmission::new(&new_corr_id(), q.sid(), support::send_cmd(b"x")))
            .collect();
        setup.send_batch(&ts).expect("SENDs");
        for t in &ts {
            let r = setup.recv_for(&t.corr_id).expect("SEND answer");
            assert_eq!(r.msg, Ok(BrokerMsg::Ok));
        }
    }
    let mut stopped = relay.client();
    let subs: Vec<ClientTransmission> = qs
        .iter()
        .map(|q| {
            ClientTransmission::new(&new_corr_id(), q.rid(), Command::Sub).signed(q.key().clone())
        })
        .collect();
    stopped.send_batch(&subs).expect("SUBs");
    relay.metrics_advancing(
        SLOW_READER_CLOSE_SECS,
        "the stopped reader closed as a slow reader",
        |m| m.get("smprelay_slow_reader_closes_total") == Some(&1),
    );
}

// ------------------------------------------------------------------------------------------------
// The checker must be able to fail: constructed logs with one violation each.

/// Builds a run by hand: connections, requests and what came back, on one clock.
#[derive(Default)]
struct Fake {
    run: Run,
    t: u64,
}

impl Fake {
    fn new(queues: usize) -> Fake {
        Fake {
            run: Run {
                shard_of: vec![0; queues],
                conns: Vec::new(),
            },
            t: 0,
        }
    }

    fn conn(&mut self, name: &str, live: bool, drain: bool) -> usize {
        self.run.conns.push(ConnLog {
            name: name.into(),
            evs: Vec::new(),
            live,
            drain,
        });
        self.run.conns.len() - 1
    }

    fn req(&mut self, c: usize, q: QId, op: Op) -> Corr {
        self.t += 1;
        let corr = new_corr_id().to_vec();
        self.run.conns[c].evs.push(Ev::Req {
            t: self.t,
            block: self.t as u32,
            corr: corr.clone(),
            q: Some(q),
            shard: Some(0),
            op,
        });
        corr
    }

    fn got(&mut self, c: usize, corr: &[u8], q: QId, got: Got) {
        self.t += 1;
        self.run.conns[c].evs.push(Ev::Got {
            t: self.t,
            corr: corr.to_vec(),
            q: Some(q),
            got,
        });
    }

    fn call(&mut self, c: usize, q: QId, op: Op, got: Got) {
        let corr = self.req(c, q, op);
        self.got(c, &corr, q, got);
    }

    fn event(&mut self, c: usize, q: QId, got: Got) {
        self.got(c, &[], q, got);
    }

    fn send_ok(&mut self, c: usize, q: QId, n: u32) -> Body {
        let b = Body { sender: 0, n };
        self.call(c, q, Op::Send(b), Got::Ok);
        b
    }
}

fn msg(id: u8, b: Body) -> Got {
    Got::Msg(vec![id; 24], Some(b))
}

/// A clean run: two messages, pushed and ACKed in order, the drain finds the queue empty.
fn clean() -> Fake {
    let mut f = Fake::new(1);
    let (s, r) = (f.conn("s", false, false), f.conn("r", true, false));
    f.call(r, 0, Op::Sub, Got::Sok);
    let b1 = f.send_ok(s, 0, 1);
    let b2 = f.send_ok(s, 0, 2);
    f.event(r, 0, msg(1, b1));
    f.call(r, 0, Op::Ack(vec![1; 24]), msg(2, b2));
    f.call(r, 0, Op::Ack(vec![2; 24]), Got::Ok);
    let d = f.conn("drain", false, true);
    f.call(d, 0, Op::Sub, Got::Sok);
    f
}

fn violations(f: &Fake) -> Vec<String> {
    check(&f.run).violations
}

fn assert_flags(f: &Fake, what: &str) {
    let v = violations(f);
    assert!(
        v.iter().any(|s| s.contains(what)),
        "expected a {what} violation, got {v:?}"
    );
}

#[test]
fn checker_passes_a_clean_run() {
    assert_eq!(violations(&clean()), Vec::<String>::new());
}

#[test]
fn checker_flags_a_duplicate_within_a_subscription() {
    let mut f = clean();
    f.event(1, 0, msg(2, Body { sender: 0, n: 2 }));
    assert_flags(&f, "I3");
}

#[test]
fn checker_flags_a_resurrection_after_ack() {
    let mut f = Fake::new(1);
    let (s, r, other) = (
        f.conn("s", false, false),
        f.conn("r", true, false),
        f.conn("other", false, false),
    );
    let b1 = f.send_ok(s, 0, 1);
    f.call(r, 0, Op::Sub, Got::Sok);
    f.event(r, 0, msg(1, b1));
    f.call(r, 0, Op::Ack(vec![1; 24]), Got::Ok);
    // Another connection subscribes after that ACK was answered and is handed the message again.
    f.call(other, 0, Op::Sub, Got::Sok);
    f.event(other, 0, msg(1, b1));
    assert_flags(&f, "I4");
}

#[test]
fn checker_flags_a_lost_message() {
    let mut f = clean();
    f.send_ok(0, 0, 3);
    assert_flags(&f, "I1");
}

#[test]
fn checker_flags_a_stalled_subscriber() {
    let mut f = Fake::new(1);
    let (s, r) = (f.conn("s", false, false), f.conn("r", true, false));
    f.call(r, 0, Op::Sub, Got::Sok);
    let b1 = f.send_ok(s, 0, 1);
    // Never pushed to r; the drain finds it at the head.
    let d = f.conn("drain", false, true);
    f.call(d, 0, Op::Sub, Got::Sok);
    f.event(d, 0, msg(1, b1));
    f.call(d, 0, Op::Ack(vec![1; 24]), Got::Ok);
    assert_flags(&f, "I2");
}

#[test]
fn checker_flags_messages_out_of_order() {
    let mut f = Fake::new(1);
    let (s, r) = (f.conn("s", false, false), f.conn("r", true, false));
    let b1 = f.send_ok(s, 0, 1);
    let b2 = f.send_ok(s, 0, 2);
    f.call(r, 0, Op::Sub, Got::Sok);
    f.event(r, 0, msg(2, b2));
    f.call(r, 0, Op::Ack(vec![2; 24]), msg(1, b1));
    f.call(r, 0, Op::Ack(vec![1; 24]), Got::Ok);
    assert_flags(&f, "I5");
}

#[test]
fn checker_flags_a_delivery_after_end() {
    let mut f = clean();
    f.event(1, 0, Got::End);
    let b3 = f.send_ok(0, 0, 3);
    f.event(1, 0, msg(3, b3));
    assert_flags(&f, "not subscribed");
}
