//! Shard routing in one place: which shard owns a queue, and the messages shards send each other.
//!
//! A queue belongs to the shard that owns its partition group (`docs/ARCHITECTURE.md` §1: partition
//! from the recipient ID, 64 groups, group `g` on shard `g mod shards`). Every shard has one inbox;
//! work for an owner and output for a connection both travel through it, so what one owner sends
//! one connection arrives in the order it was sent (O1). Sends never wait. What flows into an
//! inbox is bounded where it starts — by the blocks in flight per connection and one delivery per
//! subscription — except what no request of the receiving shard asked for (events for its
//! connections, service switches and counts): of those an inbox holds at most
//! `MAX_INBOX_EVENTS`, and a shard that finds no room holds them back in its own outbox, in order,
//! until the receiver says it has room again (`ShardMesh`, `docs/ARCHITECTURE.md` §4).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use x25519_dalek::StaticSecret;

use crate::crypto::sxbox::NONCE_LEN;
use crate::limits::{INBOX_EVENTS_ROOM_AT, MAX_INBOX_EVENTS};
use crate::protocol::command::{Command, ServiceRole};
use crate::protocol::response::{encode_response, BrokerMsg};
use crate::protocol::version::Version;
use crate::store::{group_of, EntityId, MsgId, MsgNtf, PARTITION_GROUPS};

/// What an answer to a forwarded transmission needs: how to seal it for the client and for the
/// proxy, and the session the inner transmission runs in.
pub struct Forwarded {
    /// The `RFWD`'s corrId (`n2`): `RRES` carries it, its reversed `cbNonce` seals `RRES`.
    pub outer_corr_id: Vec<u8>,
    /// The client's corrId from `FwdTransmission`, echoed in `FwdResponse`.
    pub fwd_corr_id: Vec<u8>,
    /// `cbNonce(fwd_corr_id)`; the answer to the client is sealed with its reverse.
    pub nonce: [u8; NONCE_LEN],
    /// X25519(client's per-command key, this connection's server key).
    pub cmd_secret: [u8; 32],
    /// X25519(proxy's hello key, this connection's server key).
    pub sess_secret: [u8; 32],
    /// The proxy connection's session at the forwarded version: the same connection, session ID and
    /// server key (the client signed with the proxy↔relay session ID implied).
    pub inner: Session,
}

/// Encodes one server transmission for `session` (`protocol::response::encode_response`).
pub fn encode(session: &Session, corr_id: &[u8], entity_id: &[u8], msg: &BrokerMsg) -> Vec<u8> {
    encode_response(
        session.version,
        &session.session_id,
        corr_id,
        entity_id,
        msg,
    )
}

/// A service and the role it subscribes in.
pub type ServiceKey = (EntityId, ServiceRole);

/// A count of queues and their ID hash (`protocol::ids_hash`).
pub type CountHash = (i64, [u8; 16]);

/// A connection, named by the shard that holds it and a number unique on that shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRef {
    pub shard: usize,
    pub id: u64,
}

/// What an owner needs of a connection's session to verify its commands and encode for it.
pub struct SessionInfo {
    pub conn: ConnRef,
    pub version: Version,
    pub session_id: Vec<u8>,
    /// The connection's X25519 key: X25519 authenticators are checked with it.
    pub server_key: StaticSecret,
    /// Set when the client is a service (its handshake carried a certificate and a role).
    pub service: Option<ServiceSession>,
}

/// A service session's identity (simplexmq `Transport.hs`, `THClientService`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSession {
    pub service_id: EntityId,
    pub role: ServiceRole,
    /// SHA-256 of the identity certificate: queue keys sign it ahead of what they authorize in
    /// NEW, SUB and NSUB.
    pub cert_hash: [u8; 32],
    /// The per-connection Ed25519 key the service signs with.
    pub key: [u8; 32],
}

/// What the connection found of a request's service signature and its sender's role; the owner
/// answers it after the queue lookup, as the reference does (simplexmq `Server.hs`,
/// `verifyTransmission`: the lookup, `checkRole`, then `verifyServiceSig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceCheck {
    /// No service signature, and none is needed.
    Plain,
    /// NEW, SUB or NSUB of a service session with a valid service signature: the queue key is
    /// checked over the certificate hash and the authorized bytes (`Request::authorized` holds both).
    Signed,
    /// `ERR SERVICE`: a signature where none may be, none where one must be, or a wrong one.
    Refused,
    /// `ERR CMD PROHIBITED`: the service's role may not send this command.
    Prohibited,
}

pub type Session = Arc<SessionInfo>;

/// One transmission on its way to its queue's owner, parsed and shape-checked by the connection.
pub struct Request {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    /// The recipient ID the entity resolved to; `None` when no queue has that ID (the owner then
    /// dummy-verifies and answers AUTH, so both AUTH paths cost the same).
    pub recipient_id: Option<EntityId>,
    pub command: Command,
    pub authorization: Vec<u8>,
    pub service: ServiceCheck,
    /// The bytes the authorization covers, session ID included.
    pub authorized: Vec<u8>,
    /// Set when this request arrived inside an `RFWD` (private routing): it runs in the forwarded
    /// session and its answer is sealed into `RRES` (`commands/forward.rs`).
    pub forward: Option<Box<Forwarded>>,
    /// The Ed25519 key this request's signature was verified with in its block's batch
    /// (`Owner::batch_verify`); set only by the owner, before execution.
    pub batch_verified: Option<[u8; 32]>,
    /// For a SUB whose block part could not be batch-verified: the outcome of verifying it before
    /// the part's heads are read, so that a wrong key causes no store read (as an unknown queue).
    /// Set only by the owner, and only for parts whose recipient keys no request changes.
    pub pre_verified: Option<bool>,
    /// For an ACK: the message the connection dropped unsent for this queue (its output was over
    /// its bound). The reference marks a message delivered only once it is queued for sending, so
    /// an ACK of it is `NO_MSG` and deletes nothing.
    pub undelivered: Option<Delivery>,
    /// For a SUB (NSUB): its queue (notifier) was moved to (or out of) the session's service with
    /// the part's others, in one store call before the part ran (`Owner::associate_part`).
    pub associated: bool,
}

/// A group of encoded transmissions packed into as few blocks as they fit. A MSG delivery is a
/// group of its own and never shares a block (`docs/ARCHITECTURE.md` §3, O4); plain groups the
/// writer finds queued together are merged, in order, so that they share blocks (`conn::coalesce`).
pub struct Group {
    pub transmissions: Vec<Vec<u8>>,
    pub kind: GroupKind,
}

/// What a connection may do with a group it cannot queue now.
pub enum GroupKind {
    /// Answers and events that are queued whatever the bound (the blocks in flight bound answers;
    /// `OUTPUT_HARD_LIMIT_BYTES` bounds events).
    Plain,
    /// One MSG delivery: a connection whose output is over its bound drops the 16 KB transmission
    /// and keeps only this, asking the owner again when it has drained.
    Msg(Delivery),
    /// NMSGs of one notifier. If they cannot be queued (the connection is gone or being closed),
    /// they go back to their owner, which stores them for the next NSUB: a notification is never
    /// dropped unsent.
    Ntfs(NtfReturn),
    /// No transmissions: the owner holds more for this connection (the rest of an NSUB's stored
    /// notifications) and hands the next part when the connection asks, under the same bound.
    More(Pending),
}

impl Group {
    pub fn plain(transmissions: Vec<Vec<u8>>) -> Self {
        Group {
            transmissions,
            kind: GroupKind::Plain,
        }
    }

    pub fn bytes(&self) -> usize {
        self.transmissions.iter().map(|t| t.len()).sum()
    }

    pub fn is_plain(&self) -> bool {
        matches!(self.kind, GroupKind::Plain)
    }
}

/// A message handed to a subscription, named well enough for its owner to hand it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub owner: usize,
    pub recipient_id: EntityId,
    pub msg_id: MsgId,
    /// The subscription it was for: a re-SUB starts a new one, and a stale request is ignored.
    pub epoch: u64,
}

/// Notifications on their way to a notifier's subscriber, kept so that they can be stored again.
pub struct NtfReturn {
    pub owner: usize,
    pub notifier_id: EntityId,
    pub ntfs: Vec<MsgNtf>,
}

/// Something a connection holds to ask its owner for when it has room again: a MSG it dropped,
/// or the rest of a notifier's stored notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    Msg(Delivery),
    Ntfs { owner: usize, notifier_id: EntityId },
}

impl Pending {
    pub fn owner(&self) -> usize {
        match self {
            Pending::Msg(d) => d.owner,
            Pending::Ntfs { owner, .. } => *owner,
        }
    }

    /// At most one pending item per queue and kind: a newer one replaces the older.
    pub fn key(&self) -> (bool, EntityId) {
        match self {
            Pending::Msg(d) => (true, d.recipient_id.clone()),
            Pending::Ntfs { notifier_id, .. } => (false, notifier_id.clone()),
        }
    }
}

pub enum ShardMsg {
    /// Requests of one block for queues this shard owns, in block order.
    Work {
        session: Session,
        block_seq: u64,
        requests: Vec<Request>,
    },
    /// The part of a block's answer one owner produced.
    Reply {
        conn: ConnRef,
        block_seq: u64,
        groups: Vec<Group>,
    },
    /// Something for a connection that no request of it caused now (END, DELD, a pushed MSG, NMSG).
    Event { conn: ConnRef, groups: Vec<Group> },
    /// The connection is gone: drop its subscriptions.
    Closed { conn: ConnRef },
    /// A connection dropped these deliveries unsent (its output was over its bound), or was told
    /// there is more for it, and has room again: hand each queue's head (or the next notifications)
    /// to it if the subscription is still the same. Always answered with `Redelivered`.
    Redeliver { conn: ConnRef, items: Vec<Pending> },
    /// The owner's answer to `Redeliver`, possibly empty: the connection then asks for the next
    /// items it holds, so that stale items never leave live ones unasked (I2).
    Redelivered { conn: ConnRef, groups: Vec<Group> },
    /// Notifications that could not be queued for their connection: store them again.
    ReturnNtfs {
        notifier_id: EntityId,
        ntfs: Vec<MsgNtf>,
    },
    /// An owner asks a connection's shard to close it (it spent its verification budget).
    Close { conn: ConnRef },
    /// Registers a subscriber after its SUB was answered: only a relay started with
    /// `--test-late-registration` sends this, to show that the race tests catch the reference's
    /// late registration.
    #[cfg(feature = "test-kit")]
    RegisterSub {
        session: Session,
        recipient_id: EntityId,
        epoch: u64,
    },
    /// `SUBS`/`NSUBS`, first step, fanned out to every shard: this owner's count and hash of the
    /// service's queues, answered to `reply_to` as a `ServicePart` of `round`.
    ServiceCount {
        key: ServiceKey,
        reply_to: usize,
        round: u64,
    },
    /// `SUBS`/`NSUBS`, second step, fanned out to every shard: `session` becomes the service's
    /// subscriber and (role M) the service's queues with messages are handed to it; a
    /// `ServicePart` of `round` says it is done. `answered` is what the connection was answered
    /// (`SOKS`), which the service's home shard keeps for `ENDS`.
    ServiceTake {
        key: ServiceKey,
        session: Session,
        answered: CountHash,
        round: u64,
    },
    /// To the service's home shard: `session` subscribed one of the service's queues.
    ServiceSubscribed {
        key: ServiceKey,
        session: Session,
        hash: [u8; 16],
        newly: bool,
    },
    /// To the service's home shard: one of the service's queues went.
    ServiceDropped { key: ServiceKey, hash: [u8; 16] },
    /// From the service's home shard to every shard: `session` is the service's subscriber now.
    ServiceSwitch { key: ServiceKey, session: Session },
    /// To the service's home shard: the count and hash of `conn`, if it is the service's
    /// subscribed connection (a repeated `SUBS`), answered as a `ServicePart` of `round`.
    ServiceCurrent {
        key: ServiceKey,
        conn: ConnRef,
        reply_to: usize,
        round: u64,
    },
    /// One shard's answer to `ServiceCount`, `ServiceTake`, `ServiceCurrent` or `ConnSubs`.
    ServicePart { round: u64, part: CountHash },
    /// How many subscriptions `conn` holds on this owner (queues, notifiers, services), answered
    /// as the count of a `ServicePart` of `round` (`[INACTIVE_CLIENTS]`).
    ConnSubs {
        conn: ConnRef,
        reply_to: usize,
        round: u64,
    },
    /// Periodic work of an owner (expiration).
    Tick,
    /// Time to write the metrics file (shard 0): it asks every shard for its numbers.
    Metrics,
    /// A request fanned out to every shard: send this shard's numbers to `reply_to`.
    StatsRequest { reply_to: usize, round: u64 },
    /// One shard's answer to `StatsRequest`, gathered by the shard that asked.
    StatsPart {
        round: u64,
        part: Box<crate::metrics::MetricsSnapshot>,
    },
    /// To shard 0: write the daily statistics line if it is due (`log_stats`), then say so on
    /// `done` (the timer, or the test hook `clock_control`).
    Daily { done: Option<flume::Sender<()>> },
    /// A daily line's request to every shard: send this shard's numbers to `reply_to`, then
    /// start its day's (and on Mondays its week's, on the 1st its month's) active queues again.
    DailyRequest {
        reply_to: usize,
        round: u64,
        week: bool,
        month: bool,
    },
    /// One shard's answer to `DailyRequest`.
    DailyPart {
        round: u64,
        part: Box<crate::metrics::MetricsSnapshot>,
    },
    /// Test hook (`clock_control`): run the expiration now, then say so on `done`.
    ExpireNow { done: flume::Sender<()> },
    /// Test hook (`clock_control`): say so on `started`, then block the shard's thread until
    /// `release` ends (at most `clock_control::MAX_HOLD`), as a shard busy with its own work would
    /// take nothing from its inbox meanwhile.
    HoldNow {
        started: flume::Sender<()>,
        release: flume::Receiver<()>,
    },
    /// Test hook (`clock_control`), to shard 0: write the metrics file now (a round of
    /// `StatsRequest`), then say so on `done`.
    MetricsNow { done: flume::Sender<()> },
    /// The control port's requests (`server/control/`).
    Control(super::control::request::ControlMsg),
    /// Shard `shard`'s inbox has room for events again (it fell to `INBOX_EVENTS_ROOM_AT` after a
    /// sender found it full): send what was held back for it (`ShardMesh::room`).
    Room { shard: usize },
    /// Stop: save what must be saved, then end the shard.
    Stop,
}

impl ShardMsg {
    /// Messages that no request of the receiving shard asked for, and that nothing else bounds
    /// where they start: events for its connections (END, DELD, ENDS, NMSG, MSG pushes), service
    /// switches and service counts. An inbox holds at most `MAX_INBOX_EVENTS` of them.
    pub fn is_event(&self) -> bool {
        matches!(
            self,
            ShardMsg::Event { .. }
                | ShardMsg::ServiceSwitch { .. }
                | ShardMsg::ServiceSubscribed { .. }
                | ShardMsg::ServiceDropped { .. }
        )
    }
}

/// Senders to every shard's inbox, by shard number, and how many events (`ShardMsg::is_event`)
/// each inbox holds.
#[derive(Clone)]
pub struct Mesh {
    inboxes: Arc<Vec<flume::Sender<ShardMsg>>>,
    /// Per shard, by shard number.
    counts: Arc<Vec<InboxCount>>,
}

/// One shard's inbox count, on a cache line of its own (every shard's senders touch it).
#[repr(align(64))]
#[derive(Default)]
struct InboxCount {
    /// Events sent to the shard that it has not taken from its inbox yet.
    events: AtomicUsize,
    /// Set when a sender found the inbox full of events: the shard says `Room` to every other
    /// shard once it has taken enough of them.
    wanted: AtomicBool,
}

impl Mesh {
    /// One inbox per shard; returns the mesh and the receivers, by shard number.
    pub fn new(shards: usize) -> (Mesh, Vec<flume::Receiver<ShardMsg>>) {
        let (tx, rx): (Vec<_>, Vec<_>) = (0..shards).map(|_| flume::unbounded()).unzip();
        (
            Mesh {
                inboxes: Arc::new(tx),
                counts: Arc::new((0..shards).map(|_| InboxCount::default()).collect()),
            },
            rx,
        )
    }

    pub fn shards(&self) -> usize {
        self.inboxes.len()
    }

    /// Sends every shard (this one included) the message `msg(shard)` makes: the fan-out half of
    /// a request whose answers a `Gathering` collects.
    pub fn fan_out(&self, msg: impl Fn(usize) -> ShardMsg) {
        for shard in 0..self.shards() {
            self.send(shard, msg(shard));
        }
    }

    /// Never waits, whatever the inbox holds (a shard's own sends go through `ShardMesh`, which
    /// holds events back from a full inbox); a shard that has stopped drops what it is sent.
    pub fn send(&self, shard: usize, msg: ShardMsg) {
        if msg.is_event() {
            self.counts[shard].events.fetch_add(1, Ordering::SeqCst);
        }
        let _ = self.inboxes[shard].send(msg);
    }

    /// Whether `shard`'s inbox takes another event now.
    pub fn has_room(&self, shard: usize) -> bool {
        self.events_waiting(shard) < MAX_INBOX_EVENTS
    }

    /// Events waiting in `shard`'s inbox.
    pub fn events_waiting(&self, shard: usize) -> usize {
        self.counts[shard].events.load(Ordering::SeqCst)
    }

    /// A sender holds events back for `shard`: it will be told `Room`.
    fn want_room(&self, shard: usize) {
        self.counts[shard].wanted.store(true, Ordering::SeqCst);
    }

    /// `shard` took `msg` from its inbox. Once its events fall to `INBOX_EVENTS_ROOM_AT` and a
    /// sender is holding some back, every other shard is told `Room`. (A sender sets `wanted`
    /// before it looks at the count once more, and this looks at `wanted` after lowering the
    /// count, so one of the two sees the other: no held event waits for a `Room` that never comes.)
    pub fn received(&self, shard: usize, msg: &ShardMsg) {
        if !msg.is_event() {
            return;
        }
        let count = &self.counts[shard];
        let before = count.events.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "an event taken that was never counted");
        if before <= INBOX_EVENTS_ROOM_AT + 1
            && count.wanted.load(Ordering::SeqCst)
            && count.wanted.swap(false, Ordering::SeqCst)
        {
            for other in (0..self.shards()).filter(|&s| s != shard) {
                let _ = self.inboxes[other].send(ShardMsg::Room { shard });
            }
        }
    }

    /// The shard owning the queue with this recipient ID (or, for an unknown ID, where its dummy
    /// verification runs).
    pub fn owner_of(&self, recipient_id: &[u8]) -> usize {
        owner_shard(recipient_id, self.shards())
    }
}

/// One shard's side of the mesh, shared by its connections and its owner: what the shard sends
/// another goes out in the order it was sent (O1), and events go out only while the receiver's
/// inbox has room for them (`MAX_INBOX_EVENTS`). Past that they wait here, with everything the
/// shard sends that receiver after them, until it says `Room`. What waits is bounded where it
/// was made: at most one END or DELD per subscription that ended, one ENDS per service
/// subscription, one MSG push per subscription, one `More` marker per notifier (`Owner::notify`
/// stores NMSGs instead of holding them here), one switch per service (a newer one replaces the
/// older), one answer per block in flight.
#[derive(Clone)]
pub struct ShardMesh {
    mesh: Mesh,
    shard: usize,
    held: Rc<RefCell<Vec<VecDeque<ShardMsg>>>>,
}

impl ShardMesh {
    pub fn new(mesh: Mesh, shard: usize) -> Self {
        let held = (0..mesh.shards()).map(|_| VecDeque::new()).collect();
        ShardMesh {
            mesh,
            shard,
            held: Rc::new(RefCell::new(held)),
        }
    }

    /// The mesh itself, for senders on other threads (the metrics listener, test hooks).
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    pub fn shards(&self) -> usize {
        self.mesh.shards()
    }

    pub fn owner_of(&self, recipient_id: &[u8]) -> usize {
        self.mesh.owner_of(recipient_id)
    }

    /// Sends every shard (this one included) the message `msg(shard)` makes.
    pub fn fan_out(&self, msg: impl Fn(usize) -> ShardMsg) {
        for shard in 0..self.shards() {
            self.send(shard, msg(shard));
        }
    }

    /// Sends at once, or holds `msg` back behind what already waits for `shard`. Never waits.
    /// A shard's own inbox always takes it: what the shard sends itself comes from work it is
    /// doing, and it takes its inbox in turn.
    pub fn send(&self, shard: usize, msg: ShardMsg) {
        if shard == self.shard {
            return self.mesh.send(shard, msg);
        }
        let mut held = self.held.borrow_mut();
        let q = &mut held[shard];
        if q.is_empty() && (!msg.is_event() || self.mesh.has_room(shard)) {
            drop(held);
            return self.mesh.send(shard, msg);
        }
        hold(q, msg);
        drop(held);
        self.room(shard);
    }

    /// Whether an event for `shard` would be held back now (nothing is held for this shard's own).
    pub fn holds_back(&self, shard: usize) -> bool {
        shard != self.shard && (!self.held.borrow()[shard].is_empty() || !self.mesh.has_room(shard))
    }

    /// Sends what was held back for `shard`, in order, while its inbox has room; if some is still
    /// held, asks `shard` for `Room` (and looks once more, in case it made room meanwhile).
    pub fn room(&self, shard: usize) {
        let mut held = self.held.borrow_mut();
        let q = &mut held[shard];
        loop {
            while let Some(front) = q.front() {
                if front.is_event() && !self.mesh.has_room(shard) {
                    break;
                }
                if let Some(m) = q.pop_front() {
                    self.mesh.send(shard, m);
                }
            }
            if q.is_empty() {
                // A burst held back leaves no large buffer behind.
                if q.capacity() > HELD_CAPACITY_KEPT {
                    q.shrink_to(HELD_CAPACITY_KEPT);
                }
                return;
            }
            self.mesh.want_room(shard);
            if !self.mesh.has_room(shard) {
                // Off the executor's tasks (the owner simulation calls this too): the count of
                // lines held back goes with the next one written.
                if let crate::log_limit::Decision::Write { suppressed } =
                    HELD_BACK.decide(std::time::Instant::now())
                {
                    tracing::warn!(
                        from = self.shard,
                        to = shard,
                        held = q.len(),
                        suppressed,
                        "shard {shard} has {MAX_INBOX_EVENTS} events waiting in its inbox: shard {} \
                         holds what it sends there until it has taken some",
                        self.shard
                    );
                }
                return;
            }
        }
    }

    /// Messages held back for `shard` (tests).
    pub fn held_for(&self, shard: usize) -> usize {
        self.held.borrow()[shard].len()
    }
}

/// What an emptied outbox keeps of its buffer.
const HELD_CAPACITY_KEPT: usize = 64;

static HELD_BACK: crate::log_limit::RateLimited =
    crate::log_limit::RateLimited::new("events held back for a busy shard");

/// Holds `msg` back at the end of `q`; a service switch replaces a held one of the same service in
/// its place (only the latest subscriber matters, and the receiver learns it no later).
fn hold(q: &mut VecDeque<ShardMsg>, msg: ShardMsg) {
    if let ShardMsg::ServiceSwitch { key, session } = msg {
        for m in q.iter_mut() {
            if let ShardMsg::ServiceSwitch { key: k, session: s } = m {
                if *k == key {
                    *s = session;
                    return;
                }
            }
        }
        q.push_back(ShardMsg::ServiceSwitch { key, session });
    } else {
        q.push_back(msg);
    }
}

/// The answers of every shard to one fanned-out request, folded as they arrive. A new round
/// replaces an unfinished one, and answers of other rounds are ignored, so a shard that never
/// answers (it is stopping) costs one round, not a stuck gatherer.
pub struct Gathering<T> {
    round: u64,
    missing: usize,
    acc: T,
}

impl<T> Gathering<T> {
    pub fn new(round: u64, shards: usize, acc: T) -> Self {
        Gathering {
            round,
            missing: shards,
            acc,
        }
    }

    pub fn round(&self) -> u64 {
        self.round
    }

    /// Folds one answer in; returns the result once every shard has answered.
    pub fn add<P>(mut self, round: u64, part: P, fold: impl FnOnce(&mut T, P)) -> Step<T> {
        if round != self.round {
            return Step::Waiting(self);
        }
        fold(&mut self.acc, part);
        self.missing -= 1;
        if self.missing == 0 {
            Step::Done(self.acc)
        } else {
            Step::Waiting(self)
        }
    }
}

/// What `Gathering::add` left: still waiting, or the folded answers of every shard.
pub enum Step<T> {
    Waiting(Gathering<T>),
    Done(T),
}

pub fn owner_shard(recipient_id: &[u8], shards: usize) -> usize {
    (group_of(recipient_id) as usize) % shards
}

/// The partition groups shard `shard` of `shards` owns.
pub fn groups_of_shard(shard: usize, shards: usize) -> Vec<u32> {
    (0..PARTITION_GROUPS)
        .filter(|g| (*g as usize) % shards == shard)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gathering_completes_after_every_shard_and_ignores_other_rounds() {
        let sum = |acc: &mut u64, p: u64| *acc += p;
        let g = Gathering::new(7, 3, 0u64);
        let Step::Waiting(g) = g.add(7, 1, sum) else {
            panic!("done after one of three")
        };
        // An answer of an older round does not count.
        let Step::Waiting(g) = g.add(6, 100, sum) else {
            panic!("done on a stale answer")
        };
        let Step::Waiting(g) = g.add(7, 2, sum) else {
            panic!("done after two of three")
        };
        assert_eq!(g.round(), 7);
        match g.add(7, 4, sum) {
            Step::Done(total) => assert_eq!(total, 7),
            Step::Waiting(_) => panic!("every shard answered"),
        }
    }

    #[test]
    fn groups_are_spread_and_owned_once() {
        for shards in 1..=5 {
            let mut all: Vec<u32> = (0..shards)
                .flat_map(|s| groups_of_shard(s, shards))
                .collect();
            all.sort_unstable();
            assert_eq!(all, (0..PARTITION_GROUPS).collect::<Vec<_>>());
        }
        let id = [7u8; 24];
        let owner = owner_shard(&id, 3);
        assert!(groups_of_shard(owner, 3).contains(&group_of(&id)));
    }
}
