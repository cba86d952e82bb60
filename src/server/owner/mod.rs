//! The owner of a shard's queues: it verifies and executes every command addressed to them, keeps
//! who is subscribed to what, and delivers (`docs/ARCHITECTURE.md` §1–3).
//!
//! One owner per shard. Its work runs as jobs of the shard's pipeline (`pipeline.rs`), which holds
//! the queues of a block part from its first step to its last: a SUB's registration and its
//! first-message read happen in the same turn, and no SEND on that queue can fall between them
//! (the reference's race, `docs/ARCHITECTURE.md` §3), while jobs on other queues run meanwhile.
//! Within a turn requests run in block order. Command semantics live in `commands/`.

pub mod commands;
mod jobs;
pub mod pipeline;
pub mod services;
#[cfg(test)]
pub(crate) mod sim;

pub use jobs::{control_job, owner_job, verify_across};

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use super::directory::Directory;
use super::mesh::ShardMesh;
use super::router::{ConnRef, Delivery, Group, GroupKind, Pending, Request, ServiceCheck, Session};
use crate::config::Settings;
use crate::crypto::auth::{self, Authorization};
use crate::crypto::keys::PublicAuthKey;
use crate::limits::{FAILED_VERIFY_BUDGET, FAILED_VERIFY_REFILL_PER_SEC};
use crate::server::messages::ConnMsg;
use crate::store::{EntityId, MessageStore, MsgId, QueueStore};

/// The SUB-mode subscriber of a queue: at most one connection, with at most one message delivered
/// and not acknowledged.
pub struct Subscriber {
    pub session: Session,
    pub delivered: Option<MsgId>,
    /// When `delivered` was sent (relay seconds): its ACK's time and the pending deliveries'
    /// ages are counted from it (the reference's `TimeBuckets`).
    pub delivered_at: i64,
    /// Which subscription this is: every SUB starts a new one (see `Delivery`).
    pub epoch: u64,
}

/// What one connection holds on this owner, so that its close drops all of it.
#[derive(Default)]
pub struct ConnEntries {
    pub subs: HashSet<EntityId>,
    pub gets: HashSet<EntityId>,
    pub ntf_subs: HashSet<EntityId>,
}

/// A connection's allowance of failed signature verifications on one owner: a token bucket.
struct VerifyBudget {
    left: u32,
    at: std::time::Instant,
    /// The connection's shard was asked to close it: its requests still in flight are answered
    /// AUTH without another close (or count).
    closing: bool,
}

impl VerifyBudget {
    fn new() -> Self {
        VerifyBudget {
            left: FAILED_VERIFY_BUDGET,
            at: std::time::Instant::now(),
            closing: false,
        }
    }

    fn refill(&mut self) {
        let secs = self.at.elapsed().as_secs_f64();
        let add = (secs * f64::from(FAILED_VERIFY_REFILL_PER_SEC)) as u32;
        if add > 0 {
            self.left = self.left.saturating_add(add).min(FAILED_VERIFY_BUDGET);
            self.at = std::time::Instant::now();
        }
    }
}

/// The fewest Ed25519 signatures in a block part worth a batch: below it, single verification.
pub const BATCH_VERIFY_MIN: usize = 2;

/// After a failed batch, a connection's next this many block parts on this owner verify one by one,
/// so a client that keeps sending bad signatures costs no more than unbatched verification.
pub const BATCH_OFF_BLOCKS: u32 = 64;

/// The same guard shard-wide, against bad signatures from ever new connections: a failed batch adds
/// this to the owner's score and a passed one takes 1 off; over `BATCH_FAIL_LIMIT` the owner verifies
/// one by one for its next `BATCH_OFF_BLOCKS` block parts. If every batch fails, that is 9 failed
/// batches (each ~0.4 of its signatures' unbatched cost) per 73 parts: ~5% over unbatched. Honest
/// traffic only gets there when more than 1 batch in 9 fails.
pub const BATCH_FAIL_WEIGHT: u32 = 8;
pub const BATCH_FAIL_LIMIT: u32 = 64;

/// A block part with fewer batchable signatures than this joins the batch across the parts that
/// reached the owner together (`Owner::batch_verify_across`); a larger one batches alone.
pub const CROSS_BATCH_PART_MAX: usize = 16;
/// At most this many signatures in one batch across parts: a failed batch wastes no more than
/// ~128 × 15 µs, and the parts wait for it no longer.
pub const CROSS_BATCH_MAX: usize = 128;

/// A request a batch speaks for: (its part among the batch's parts, its index in that part, the
/// key it will be checked with, its signature).
type Candidate = (usize, usize, [u8; 32], [u8; 64]);

/// Whether a batch could speak for `r`, from the request alone (its queue's key is looked up
/// after): not verified yet, not forwarded, not refused for its service signature, a 64-byte
/// signature, a command that verifies one.
fn batch_eligible(r: &Request) -> bool {
    r.batch_verified.is_none()
        && r.forward.is_none()
        && matches!(r.service, ServiceCheck::Plain | ServiceCheck::Signed)
        && r.authorization.len() == crate::crypto::ed25519::SIG_LEN
        && r.command.facts().batch_key != crate::protocol::command::BatchKey::None
}

/// How late a relay started with `--test-late-registration` registers a SUB (the reference's
/// subscriber thread lags likewise).
#[cfg(feature = "test-kit")]
pub const T1_VARIANT_DELAY: std::time::Duration = std::time::Duration::from_millis(1000);

/// The owner's state is in cells, each borrowed only for a step that does not await: the shard
/// runs several turns at once (`server/owner/pipeline.rs`), each of which may be waiting for the store,
/// and the per-queue order keeps them off each other's queues (`docs/ARCHITECTURE.md` §2). After
/// an await a turn reads again what it needs; a connection's close may have changed it.
/// A deliberately broken owner, to show that the simulation (`sim.rs`) catches it.
#[cfg(feature = "test-kit")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fault {
    None,
    /// Answers an ACK with OK and takes the next message as delivered without sending it.
    AckWithoutNext,
    /// Runs block parts without the per-queue order: a part may start while another part's
    /// store operation on the same queue is in flight.
    NoQueueOrder,
    /// Registers a SUB's subscriber after its head was read, in a later step (the reference's
    /// race, which `start --test-late-registration` re-creates over real connections).
    LateRegistration,
}

pub struct Owner<S> {
    pub shard: usize,
    pub store: S,
    pub directory: Arc<Directory>,
    pub mesh: ShardMesh,
    pub settings: Rc<Settings>,
    pub subs: RefCell<HashMap<EntityId, Subscriber>>,
    /// GET-mode state per queue and connection: the message a GET returned and not yet
    /// acknowledged. Keyed by queue first, so that DEL finds a queue's entries without a scan.
    pub gets: RefCell<HashMap<EntityId, HashMap<ConnRef, Option<MsgId>>>>,
    /// Notifiers whose subscriber has more stored notifications coming (`limits::NTFS_PER_PART`
    /// at a time): new ones are stored behind them rather than sent ahead.
    pub ntf_backlog: RefCell<HashSet<EntityId>>,
    /// The index of the recipient key that verified last, for queues with several keys: it is
    /// tried first.
    last_key: RefCell<HashMap<EntityId, usize>>,
    /// Failed verifications each connection may still cause (`limits::FAILED_VERIFY_BUDGET`).
    verify_budget: RefCell<HashMap<ConnRef, VerifyBudget>>,
    /// Notifier ID → the connection subscribed to its notifications.
    pub ntf_subs: RefCell<HashMap<EntityId, Session>>,
    /// On a directory that caches IDs (which may not hold a notifier's): notifier ID → recipient
    /// ID of the subscribed notifiers (`ntf_subs`, swept on each tick).
    ntf_queues: RefCell<HashMap<EntityId, EntityId>>,
    pub by_conn: RefCell<HashMap<ConnRef, ConnEntries>>,
    /// The owner's counters, as the metrics snapshot declares them (`metrics.rs`, `snapshot!`):
    /// a shard's numbers are these with its store's and connections' added (`shard/rounds.rs`).
    pub stats: RefCell<crate::metrics::MetricsSnapshot>,
    /// Queues with messages sent or received this day, week and month (`metrics::Activity`).
    pub activity: RefCell<crate::metrics::Activity>,
    /// Seconds from a SUB-mode delivery to its ACK.
    pub ack_times: RefCell<crate::metrics::TimeBuckets>,
    /// Connections whose recent batch failed: block parts left before they are batched again.
    batch_off: RefCell<HashMap<ConnRef, u32>>,
    /// The shard-wide guard: failure score, and block parts left to verify one by one.
    batch_fail_score: Cell<u32>,
    batch_off_all: Cell<u32>,
    /// Source of subscription epochs.
    next_epoch: Cell<u64>,
    /// Services: associations, subscribed connections (`commands/service.rs`).
    pub services: crate::server::owner::services::ServiceState,
    /// A deliberately broken variant, for the simulation (`server::sim`) and the race tests to
    /// catch.
    #[cfg(feature = "test-kit")]
    pub fault: Cell<Fault>,
}

/// The records of a job's queues, readable by `with_queue` until this is dropped
/// (`QueueStore::prepare`, `release`; nothing on a store that holds every record).
pub struct HeldRecords<'a, S: QueueStore> {
    store: &'a S,
    rids: Vec<EntityId>,
}

impl<S: QueueStore> Drop for HeldRecords<'_, S> {
    fn drop(&mut self) {
        if !self.rids.is_empty() {
            let refs: Vec<&[u8]> = self.rids.iter().map(Vec::as_slice).collect();
            self.store.release(&refs);
        }
    }
}

/// What one owner turn produces for the connection that sent the block, besides events to others.
#[derive(Default)]
pub struct Turn {
    /// Responses, in request order.
    pub responses: Vec<Vec<u8>>,
    /// MSGs that follow a SUB's SOK (same block when the part is small, else one block each).
    pub sub_msgs: Vec<(Vec<u8>, Delivery)>,
    /// MSGs pushed to this same connection by its own SENDs: each a block of its own, before the
    /// responses (cause before effect, O2).
    pub pushes: Vec<Group>,
    /// Events for this connection that follow the responses (notifications waiting for an NSUB).
    pub trailing: Vec<Group>,
    /// Queues changed in this turn: a SUB later in the turn must read their head again.
    pub stale_heads: HashSet<EntityId>,
    /// A change of this turn has an unknown outcome (its journal sync failed): nothing of the
    /// turn is answered and the connection is closed, as a crash would do (§5).
    pub close: bool,
}

impl<S: QueueStore + MessageStore> Owner<S> {
    /// Makes the records of `rids`, the queues a job holds in the per-queue order, readable
    /// until the returned guard drops; the subscribed queues' records stay held besides
    /// (`QueueStore::prepare`). Every job that reads records outside a subscribed queue begins
    /// with it.
    pub async fn hold_records<'r>(
        &self,
        rids: impl Iterator<Item = &'r [u8]>,
    ) -> Result<HeldRecords<'_, S>, crate::store::StoreError> {
        if self.store.holds_every_record() {
            return Ok(HeldRecords {
                store: &self.store,
                rids: Vec::new(),
            });
        }
        let mut ids: Vec<EntityId> = rids.map(<[u8]>::to_vec).collect();
        ids.sort_unstable();
        ids.dedup();
        let held = HeldRecords {
            store: &self.store,
            rids: ids,
        };
        let refs: Vec<&[u8]> = held.rids.iter().map(Vec::as_slice).collect();
        // The guard releases whatever `prepare` pinned, whether it then failed or not.
        self.store
            .prepare(&refs, &|r| self.subs.borrow().contains_key(r))
            .await?;
        drop(refs);
        Ok(held)
    }

    /// `hold_records`, with a failure logged (at most a line a second, `log_limit`) as what it
    /// costs, `what`: a part answered `ERR STORE`, or a job skipped, whose work waits for the
    /// queue's next command.
    pub async fn hold_records_or_log<'r>(
        &self,
        rids: impl Iterator<Item = &'r [u8]>,
        what: &'static str,
    ) -> Result<HeldRecords<'_, S>, crate::store::StoreError> {
        static UNREAD: crate::log_limit::RateLimited =
            crate::log_limit::RateLimited::new("queue records that could not be read");
        self.hold_records(rids).await.inspect_err(|e| {
            crate::log_limit::warn(&UNREAD, |suppressed| {
                tracing::warn!(
                    suppressed,
                    "{what}: the queues' records could not be read: {e}"
                )
            })
        })
    }

    pub fn new(
        shard: usize,
        store: S,
        directory: Arc<Directory>,
        mesh: ShardMesh,
        settings: Rc<Settings>,
    ) -> Self {
        let services = crate::server::owner::services::ServiceState::default();
        store.for_each_queue(&mut |q| services.index(q));
        Self::with_services(shard, store, services, directory, mesh, settings)
    }

    /// As `new`, with the services' index of the store's queues already made (the start makes it
    /// in the one pass over the records that fills the directory).
    pub fn with_services(
        shard: usize,
        store: S,
        services: crate::server::owner::services::ServiceState,
        directory: Arc<Directory>,
        mesh: ShardMesh,
        settings: Rc<Settings>,
    ) -> Self {
        Owner {
            services,
            shard,
            store,
            directory,
            mesh,
            settings,
            subs: RefCell::default(),
            gets: RefCell::default(),
            ntf_backlog: RefCell::default(),
            last_key: RefCell::default(),
            verify_budget: RefCell::default(),
            ntf_subs: RefCell::default(),
            ntf_queues: RefCell::default(),
            by_conn: RefCell::default(),
            stats: RefCell::default(),
            activity: RefCell::default(),
            ack_times: RefCell::default(),
            batch_off: RefCell::default(),
            batch_fail_score: Cell::new(0),
            batch_off_all: Cell::new(0),
            next_epoch: Cell::new(0),
            #[cfg(feature = "test-kit")]
            fault: Cell::new(Fault::None),
        }
    }

    /// SUBs of a part that was not batch-verified are verified before the part's heads are read, so
    /// that only verified SUBs cause a store read (a wrong key then costs what an unknown queue
    /// costs). The outcome stands at execution unless a request of the part changes recipient keys.
    pub(super) fn pre_verify_subs(&self, session: &Session, requests: &mut [Request]) {
        use crate::protocol::command::Command;
        if requests
            .iter()
            .any(|r| matches!(r.command, Command::RKey(_)))
        {
            return;
        }
        for r in requests.iter_mut() {
            if !matches!(r.command, Command::Sub)
                || r.batch_verified.is_some()
                || !matches!(r.service, ServiceCheck::Plain | ServiceCheck::Signed)
            {
                continue;
            }
            let Some((rid, keys)) = r.recipient_id.as_deref().and_then(|rid| {
                self.store
                    .with_queue(rid, |q| (q.recipient_id.clone(), q.recipient_keys.clone()))
            }) else {
                continue;
            };
            let ok = self.verify_recipient(session, r, &rid, &keys);
            r.pre_verified = Some(ok);
        }
    }

    /// Checks a recipient command against the queue's recipient keys, the one that verified last
    /// first. Each failed verification is taken from the connection's budget; a connection that
    /// would need more than is left is closed (its request is answered AUTH), so a queue with 255
    /// keys cannot make one connection cost the shard more than its share.
    pub fn verify_recipient(
        &self,
        session: &Session,
        req: &Request,
        rid: &[u8],
        keys: &[PublicAuthKey],
    ) -> bool {
        if let Some(ok) = req.pre_verified {
            return ok;
        }
        let first = self
            .last_key
            .borrow()
            .get(rid)
            .copied()
            .filter(|i| *i < keys.len())
            .unwrap_or(0);
        let order = std::iter::once(first).chain((0..keys.len()).filter(|i| *i != first));
        let mut found = None;
        for (n, i) in order.enumerate() {
            // The first key costs what an unknown queue costs; each further one is counted.
            if n > 0 && !self.spend_verify_budget(session.conn) {
                return false;
            }
            if self.verify_with(session, req, &keys[i]) {
                found = Some(i);
                break;
            }
        }
        match found {
            Some(0) => {
                self.last_key.borrow_mut().remove(rid);
            }
            Some(i) => {
                self.last_key.borrow_mut().insert(rid.to_vec(), i);
            }
            None => {}
        }
        found.is_some()
    }

    /// A deleted queue's key hint goes with it.
    pub fn forget_queue(&self, rid: &[u8]) {
        self.last_key.borrow_mut().remove(rid);
    }

    /// Takes one verification beyond the first key from `conn`'s budget; false when it has run out,
    /// and then, the first time, asks the connection's shard to close it.
    fn spend_verify_budget(&self, conn: ConnRef) -> bool {
        let mut budgets = self.verify_budget.borrow_mut();
        let b = budgets.entry(conn).or_insert_with(VerifyBudget::new);
        b.refill();
        if b.left == 0 {
            if !b.closing {
                b.closing = true;
                self.stats.borrow_mut().relay.verify_budget_closes += 1;
                self.mesh.send(conn.shard, ConnMsg::Close { conn });
            }
            return false;
        }
        b.left -= 1;
        true
    }

    /// One `peek_first_many` call for every verified SUB of the block whose queue exists
    /// (`docs/ARCHITECTURE.md` §2), so that a block of 135 SUBs costs this owner one store call.
    pub(super) async fn prefetch_subs(
        &self,
        requests: &[Request],
    ) -> HashMap<usize, Option<crate::store::Message>> {
        let subs: Vec<(usize, &[u8])> = requests
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r.command, crate::protocol::command::Command::Sub))
            .filter(|(_, r)| r.batch_verified.is_some() || r.pre_verified == Some(true))
            .filter_map(|(i, r)| {
                r.recipient_id
                    .as_deref()
                    .filter(|rid| self.store.contains(rid))
                    .map(|rid| (i, rid))
            })
            .collect();
        if subs.is_empty() {
            return HashMap::new();
        }
        let ids: Vec<&[u8]> = subs.iter().map(|(_, rid)| *rid).collect();
        match self.store.peek_first_many(&ids).await {
            Ok(heads) => subs.iter().map(|(i, _)| *i).zip(heads).collect(),
            // Each SUB then reads its own head and reports its own error.
            Err(_) => HashMap::new(),
        }
    }

    /// Verifies the Ed25519 signatures of a block part in one batch (`crypto::ed25519`) before any
    /// request runs, marking each request with the key that verified it; `verify_with` then accepts
    /// that key without a second verification. Which key each request will be checked with is
    /// decided here as its command will decide it; a request whose queue is missing, or whose key is
    /// not Ed25519, joins the batch with the dummy key, so its batch fails exactly as one with a
    /// wrong key does (equal-time AUTH, per block). A failed batch marks nothing: every request is
    /// then verified on its own as without batching, which decides. Requests a batch across parts
    /// (`batch_verify_across`) already verified are left out.
    pub(super) fn batch_verify(&self, session: &Session, requests: &mut [Request]) {
        {
            let mut off = self.batch_off.borrow_mut();
            if let Some(left) = off.get_mut(&session.conn) {
                *left -= 1;
                if *left == 0 {
                    off.remove(&session.conn);
                }
                return;
            }
        }
        if self.batch_off_all.get() > 0 {
            self.batch_off_all.set(self.batch_off_all.get() - 1);
            return;
        }
        let chosen = self.batch_candidates(0, requests);
        if chosen.len() < BATCH_VERIFY_MIN {
            return;
        }
        if !self.run_batch(&mut [(session.conn, requests)], &chosen) {
            self.batch_off
                .borrow_mut()
                .insert(session.conn, BATCH_OFF_BLOCKS);
        }
    }

    /// One batch over the signatures of several block parts that reached this owner together from
    /// different connections (`docs/ARCHITECTURE.md` §2): a sender's block usually carries one
    /// SEND, too few for a batch of its own, and a batch of n signatures costs each far less than a
    /// single verification. Only parts of SENDs with fewer than `CROSS_BATCH_PART_MAX` candidates
    /// join (a larger part batches alone; a subscriber's SUBs and ACKs come in blocks that batch
    /// alone), at most `CROSS_BATCH_MAX` signatures in all, none of a
    /// connection whose batching is off; nothing while the owner's guard is on, nor on a store whose
    /// records are read when used (the records are held only when the part runs). A missing queue
    /// joins with the dummy key, as in a part's batch. A failed batch marks nothing and counts
    /// against the owner's guard (`BATCH_FAIL_WEIGHT`); each part then batches or verifies on its
    /// own as without this step. Verification only marks: whether a mark counts is decided when the
    /// request runs, against the key its queue has then (`verify_with`), so the parts may run in
    /// any order after this.
    pub fn batch_verify_across(&self, parts: &mut [(ConnRef, &mut [Request])]) {
        if parts.len() < 2 || self.batch_off_all.get() > 0 || !self.store.holds_every_record() {
            return;
        }
        let mut chosen: Vec<Candidate> = Vec::new();
        {
            let off = self.batch_off.borrow();
            for (p, (conn, requests)) in parts.iter().enumerate() {
                if off.contains_key(conn) {
                    continue;
                }
                // Counted first without looking keys up: a large part batches alone, and only
                // parts of SENDs join (a subscriber's SUBs and ACKs come in blocks of their own).
                let (eligible, sends) =
                    requests
                        .iter()
                        .filter(|r| batch_eligible(r))
                        .fold((0, 0), |(n, sends), r| {
                            let send =
                                matches!(r.command, crate::protocol::command::Command::Send { .. });
                            (n + 1, sends + usize::from(send))
                        });
                if eligible == 0
                    || sends < eligible
                    || eligible >= CROSS_BATCH_PART_MAX
                    || chosen.len() + eligible > CROSS_BATCH_MAX
                {
                    continue;
                }
                chosen.extend(self.batch_candidates(p, requests));
            }
        }
        if chosen.len() < BATCH_VERIFY_MIN || chosen.iter().all(|c| c.0 == chosen[0].0) {
            // One part alone batches itself as it runs.
            return;
        }
        self.run_batch(parts, &chosen);
    }

    /// The requests of part `part` a batch can speak for, with the key each will be checked with
    /// and its signature. Requests already verified by a batch are left out.
    fn batch_candidates(&self, part: usize, requests: &[Request]) -> Vec<Candidate> {
        let mut chosen = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if !batch_eligible(r) {
                continue;
            }
            let Ok(sig) = <[u8; 64]>::try_from(r.authorization.as_slice()) else {
                continue;
            };
            if let Some(key) = self.batch_key(r) {
                chosen.push((part, i, key, sig));
            }
        }
        chosen
    }

    /// Runs the batch of `chosen` (from `batch_candidates` over `parts`), counted, with the owner's
    /// guard against failing batches updated; marks its requests when it passes.
    fn run_batch(&self, parts: &mut [(ConnRef, &mut [Request])], chosen: &[Candidate]) -> bool {
        let items: Vec<crate::crypto::ed25519::Item> = chosen
            .iter()
            .map(|(p, i, key, sig)| crate::crypto::ed25519::Item {
                key,
                msg: &parts[*p].1[*i].authorized,
                sig,
            })
            .collect();
        {
            let mut stats = self.stats.borrow_mut();
            stats.relay.verify_batches += 1;
            stats.relay.verify_batch_signatures += items.len() as u64;
        }
        let score = self.batch_fail_score.get();
        let passed = auth::ed25519_verify_batch(&items);
        drop(items);
        if passed {
            self.batch_fail_score.set(score.saturating_sub(1));
            for (p, i, key, _) in chosen {
                parts[*p].1[*i].batch_verified = Some(*key);
            }
            return true;
        }
        self.stats.borrow_mut().relay.verify_batch_fallbacks += 1;
        if score + BATCH_FAIL_WEIGHT > BATCH_FAIL_LIMIT {
            self.batch_fail_score.set(0);
            self.batch_off_all.set(BATCH_OFF_BLOCKS);
        } else {
            self.batch_fail_score.set(score + BATCH_FAIL_WEIGHT);
        }
        false
    }

    /// The Ed25519 key `r`'s command will verify its signature with (the dummy key when its queue is
    /// missing or the key is of another algorithm), or `None` when the command verifies nothing or
    /// is not batched (NEW, SKEY/LKEY/LGET, SEND to a queue without a sender key).
    fn batch_key(&self, r: &Request) -> Option<[u8; 32]> {
        use crate::protocol::command::BatchKey;
        let which = r.command.facts().batch_key;
        if which == BatchKey::None {
            return None;
        }
        let dummy = *auth::ed25519_dummy_key();
        let Some(rid) = r.recipient_id.as_deref() else {
            return Some(dummy);
        };
        let last = self.last_key.borrow().get(rid).copied().unwrap_or(0);
        let key = self.store.with_queue(rid, |q| {
            let key = match which {
                BatchKey::Sender => Some(q.sender_key.as_ref()?),
                BatchKey::Notifier => q.notifier.as_ref().map(|n| &n.notifier_key),
                BatchKey::Recipient | BatchKey::None => {
                    q.recipient_keys.get(last).or(q.recipient_keys.first())
                }
            };
            Some(match key {
                Some(PublicAuthKey::Ed25519(k)) => *k,
                _ => dummy,
            })
        });
        match key {
            // A SEND to a queue without a sender key verifies nothing.
            Some(k) => k,
            None => Some(dummy),
        }
    }

    /// Checks `req`'s authorization with `key` (simplexmq `Server.hs`, `verifyCmdAuthorization`),
    /// or takes its block's batch verification of that very key.
    pub fn verify_with(&self, session: &Session, req: &Request, key: &PublicAuthKey) -> bool {
        if let (Some(done), PublicAuthKey::Ed25519(k)) = (&req.batch_verified, key) {
            if done == k {
                return true;
            }
        }
        let a = Authorization::from_bytes(&req.authorization).unwrap_or(Authorization::None);
        let sk = session.server_key.to_bytes();
        auth::verify(key, &a, &req.authorized, Some(&sk), &req.corr_id)
    }

    /// A verification against the dummy key of the signature's algorithm, so that AUTH for a missing
    /// queue or key takes as long as AUTH for a wrong signature.
    pub fn dummy_verify(&self, session: &Session, req: &Request) {
        let a = Authorization::from_bytes(&req.authorization).unwrap_or(Authorization::None);
        let sk = session.server_key.to_bytes();
        let _ = auth::dummy_verify(&a, &req.authorized, Some(&sk), &req.corr_id);
    }

    /// Sends groups of transmissions to a connection that is not the one being answered.
    pub fn send_event(&self, conn: ConnRef, groups: Vec<Vec<Vec<u8>>>) {
        let groups = groups.into_iter().map(Group::plain).collect();
        self.mesh.send(conn.shard, ConnMsg::Event { conn, groups });
    }

    /// Sends one MSG delivery to a connection that is not the one being answered.
    pub fn send_delivery(&self, conn: ConnRef, t: Vec<u8>, delivery: Delivery) {
        let groups = vec![Group {
            transmissions: vec![t],
            kind: GroupKind::Msg(delivery),
        }];
        self.mesh.send(conn.shard, ConnMsg::Event { conn, groups });
    }

    /// Whether `d` is still what the subscription of `d.recipient_id` on `conn` waits to have
    /// acknowledged.
    pub fn is_outstanding(&self, conn: ConnRef, d: &Delivery) -> bool {
        self.subs.borrow().get(&d.recipient_id).is_some_and(|s| {
            s.session.conn == conn && s.epoch == d.epoch && s.delivered == Some(d.msg_id)
        })
    }

    pub fn new_epoch(&self) -> u64 {
        self.next_epoch.set(self.next_epoch.get() + 1);
        self.next_epoch.get()
    }

    /// Names a delivery of `msg_id` to the current subscription of `rid`.
    pub fn delivery(&self, rid: &[u8], msg_id: &MsgId) -> Delivery {
        Delivery {
            owner: self.shard,
            recipient_id: rid.to_vec(),
            msg_id: *msg_id,
            epoch: self.subs.borrow().get(rid).map_or(0, |s| s.epoch),
        }
    }

    /// The queues a block part works on, for the per-queue order (`pipeline.rs`).
    pub fn work_keys(&self, requests: &[Request]) -> crate::server::owner::pipeline::Keys {
        #[cfg(test)]
        if self.fault.get() == Fault::NoQueueOrder {
            return crate::server::owner::pipeline::Keys::Queues(Vec::new());
        }
        crate::server::owner::pipeline::Keys::of(
            requests.iter().filter_map(|r| r.recipient_id.as_deref()),
        )
    }

    /// The queue a held item is about, for the per-queue order.
    pub fn pending_queue(&self, item: &Pending) -> Option<EntityId> {
        match item {
            Pending::Msg(d) => Some(d.recipient_id.clone()),
            Pending::Ntfs { notifier_id, .. } => self.notifier_queue(notifier_id),
        }
    }

    /// The recipient ID of the queue with this notifier ID (on a directory cache, where the
    /// cache does not hold it, known while the notifier is subscribed).
    pub fn notifier_queue(&self, notifier_id: &[u8]) -> Option<EntityId> {
        self.directory
            .lookup(super::directory::IdSpace::Notifier, notifier_id)
            .or_else(|| self.ntf_queues.borrow().get(notifier_id).cloned())
    }

    /// The notifier `nid` of queue `rid` gets a subscriber.
    pub fn ntf_subscribed(&self, nid: &[u8], rid: &[u8]) {
        if self.directory.is_cache() {
            self.ntf_queues
                .borrow_mut()
                .insert(nid.to_vec(), rid.to_vec());
        }
    }

    /// Forgets the queues of notifiers no longer subscribed (`ntf_queues`).
    pub fn sweep_ntf_queues(&self) {
        let subs = self.ntf_subs.borrow();
        self.ntf_queues
            .borrow_mut()
            .retain(|nid, _| subs.contains_key(nid));
    }

    /// The GET-mode state of `conn` on `rid`.
    pub fn get_state(&self, rid: &[u8], conn: ConnRef) -> Option<Option<MsgId>> {
        self.gets
            .borrow()
            .get(rid)
            .and_then(|m| m.get(&conn))
            .copied()
    }

    pub fn set_get_state(&self, rid: &[u8], conn: ConnRef, delivered: Option<MsgId>) {
        self.gets
            .borrow_mut()
            .entry(rid.to_vec())
            .or_default()
            .insert(conn, delivered);
    }

    pub fn remove_get_state(&self, rid: &[u8], conn: ConnRef) {
        let mut gets = self.gets.borrow_mut();
        if let Some(m) = gets.get_mut(rid) {
            m.remove(&conn);
            if m.is_empty() {
                gets.remove(rid);
            }
        }
    }

    /// Runs `f` on what `conn` holds on this owner.
    pub fn entries<R>(&self, conn: ConnRef, f: impl FnOnce(&mut ConnEntries) -> R) -> R {
        f(self.by_conn.borrow_mut().entry(conn).or_default())
    }

    /// The subscriptions `conn` holds on this owner: queues, notifiers, and services it is the
    /// subscriber of (what keeps a connection from being closed as inactive).
    pub fn subscriptions_of(&self, conn: ConnRef) -> usize {
        let entries = self
            .by_conn
            .borrow()
            .get(&conn)
            .map_or(0, |e| e.subs.len() + e.ntf_subs.len());
        entries + self.services.subscribed_by(conn)
    }

    /// A connection closed: drop its subscriptions here. Nobody is told (the reference sends no END).
    pub fn connection_closed(&self, conn: ConnRef) {
        self.services.connection_closed(conn);
        self.batch_off.borrow_mut().remove(&conn);
        self.verify_budget.borrow_mut().remove(&conn);
        let Some(e) = self.by_conn.borrow_mut().remove(&conn) else {
            return;
        };
        let mut subs = self.subs.borrow_mut();
        for rid in e.subs {
            if subs.get(&rid).map(|s| s.session.conn) == Some(conn) {
                subs.remove(&rid);
            }
        }
        for rid in e.gets {
            self.remove_get_state(&rid, conn);
        }
        let mut ntf_subs = self.ntf_subs.borrow_mut();
        for nid in e.ntf_subs {
            if ntf_subs.get(&nid).map(|s| s.conn) == Some(conn) {
                ntf_subs.remove(&nid);
                self.ntf_backlog.borrow_mut().remove(&nid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Equal-time AUTH, asserted structurally (simplexmq `Server.hs`, `verifyTransmission` and its
    //! dummy keys): a command for an unknown queue and one signed with the wrong key each run
    //! exactly one verification, with a key of the signature's algorithm. (The timing comparison
    //! itself is a benchmark.)
    use std::rc::Rc;
    use std::sync::Arc;

    use ed25519_dalek::SigningKey;
    use futures_lite::future::block_on;
    use x25519_dalek::StaticSecret;

    use super::*;
    use crate::crypto::auth::{self, verify_count_by_alg, VerifyCounts};
    use crate::limits::{self, FAILED_VERIFY_REFILL_PER_SEC};
    use crate::protocol::command::{Command, MsgFlags};
    use crate::protocol::error::ErrorType;
    use crate::protocol::response::BrokerMsg;
    use crate::protocol::transmission::{client_signed_bytes, parse_transmission};
    use crate::server::directory::IdSpace;
    use crate::server::mesh::Mesh;
    use crate::server::messages::{OwnerMsg, ShardMsg};
    use crate::server::router::{ConnRef, Request, SessionInfo};
    use crate::server::router::{GroupKind, Pending};
    use crate::store::memory::MemoryStore;
    use crate::store::{Message, MsgNtf, NotifierCreds, QueueRec, QueueStatus};

    fn owner() -> (Owner<MemoryStore>, Vec<flume::Receiver<ShardMsg>>) {
        let (mesh, inboxes) = Mesh::new(1);
        let mesh = ShardMesh::new(mesh, 0);
        let o = Owner::new(
            0,
            MemoryStore::new(),
            Directory::new(),
            mesh,
            Rc::new(Settings::default()),
        );
        (o, inboxes)
    }

    fn session() -> Session {
        Arc::new(SessionInfo {
            conn: ConnRef { shard: 0, id: 1 },
            version: 18,
            session_id: vec![7; 32],
            server_key: StaticSecret::from([9u8; 32]),
            service: None,
        })
    }

    fn queue(rid: &[u8], key: PublicAuthKey) -> QueueRec {
        QueueRec {
            recipient_id: rid.to_vec(),
            recipient_keys: vec![key],
            rcv_dh_secret: [1; 32],
            sender_id: vec![2; 24],
            sender_key: None,
            queue_mode: None,
            link: None,
            notifier: None,
            status: QueueStatus::Active,
            updated_at: None,
            rcv_service_id: None,
        }
    }

    /// `command` for `entity_id` (queue `recipient_id`), signed by `signer` over `cmd_bytes`.
    fn signed_request(
        s: &Session,
        entity_id: &[u8],
        recipient_id: Option<&[u8]>,
        command: Command,
        cmd_bytes: &[u8],
        signer: &SigningKey,
    ) -> Request {
        let corr = [5u8; 24];
        let signed = client_signed_bytes(s.version, &s.session_id, &corr, entity_id, cmd_bytes);
        let sig = auth::sign_ed25519(signer, &signed);
        Request {
            corr_id: corr.to_vec(),
            entity_id: entity_id.to_vec(),
            recipient_id: recipient_id.map(<[u8]>::to_vec),
            command,
            authorization: sig.to_vec(),
            service: ServiceCheck::Plain,
            authorized: signed,
            forward: None,
            batch_verified: None,
            pre_verified: None,
            undelivered: None,
            associated: false,
        }
    }

    /// A SUB for `rid` signed by `signer`.
    fn signed_sub(s: &Session, rid: &[u8], signer: &SigningKey) -> Request {
        signed_request(s, rid, Some(rid), Command::Sub, b"SUB", signer)
    }

    fn delta(before: VerifyCounts) -> VerifyCounts {
        let now = verify_count_by_alg();
        VerifyCounts {
            ed25519: now.ed25519 - before.ed25519,
            ed448: now.ed448 - before.ed448,
            x25519: now.x25519 - before.x25519,
        }
    }

    #[test]
    fn unknown_queue_and_wrong_key_each_run_one_verification_of_the_signatures_algorithm() {
        let (o, inboxes) = owner();
        let s = session();
        let owner_key = SigningKey::from_bytes(&[3u8; 32]);
        let other_key = SigningKey::from_bytes(&[4u8; 32]);
        let rid = vec![8u8; 24];
        let pk = PublicAuthKey::Ed25519(owner_key.verifying_key().to_bytes());
        futures_lite::future::block_on(o.store.create(queue(&rid, pk))).unwrap();

        let paths = [
            ("wrong key", signed_sub(&s, &rid, &other_key)),
            ("unknown queue", signed_sub(&s, &[6u8; 24], &other_key)),
        ];
        for (path, req) in paths {
            let before = verify_count_by_alg();
            futures_lite::future::block_on(o.process(s.clone(), 1, vec![req]));
            let d = delta(before);
            assert_eq!(
                (d.ed25519, d.ed448, d.x25519),
                (1, 0, 0),
                "{path}: exactly one Ed25519 verification"
            );
            let Ok(ShardMsg::Conn(ConnMsg::Reply { groups, .. })) = inboxes[0].try_recv() else {
                panic!("{path}: no reply");
            };
            let t = &groups[0].transmissions[0];
            assert!(
                t.ends_with(b"ERR AUTH"),
                "{path}: answered AUTH, got {:?}",
                String::from_utf8_lossy(t)
            );
        }

        // The right key verifies once too, and subscribes.
        let before = verify_count_by_alg();
        futures_lite::future::block_on(o.process(
            s.clone(),
            2,
            vec![signed_sub(&s, &rid, &owner_key)],
        ));
        assert_eq!(delta(before).ed25519, 1);
        assert!(o.subs.borrow().contains_key(&rid));
    }

    fn session_on(conn: u64) -> Session {
        let mut s = session();
        Arc::get_mut(&mut s).unwrap().conn = ConnRef { shard: 0, id: conn };
        s
    }

    /// Which requests of a block part were answered AUTH, in order.
    /// (Events to earlier subscribers, ENDs, are skipped.)
    fn auths(inbox: &flume::Receiver<ShardMsg>) -> Vec<bool> {
        let groups = loop {
            match inbox.try_recv() {
                Ok(ShardMsg::Conn(ConnMsg::Reply { groups, .. })) => break groups,
                Ok(_) => continue,
                Err(_) => panic!("no reply"),
            }
        };
        groups[0]
            .transmissions
            .iter()
            .map(|t| t.ends_with(b"ERR AUTH"))
            .collect()
    }

    /// A block part of several signed SUBs is verified in one batch; a wrong key and a missing queue
    /// each fail the batch alike (same verification counts: equal-time AUTH per block), every
    /// request is then verified alone, and that connection's next parts skip batching.
    #[test]
    fn block_parts_are_batch_verified_and_bad_signatures_fall_back_alike() {
        let (o, inboxes) = owner();
        let keys: Vec<SigningKey> = (0..3u8)
            .map(|i| SigningKey::from_bytes(&[20 + i; 32]))
            .collect();
        let rids: Vec<Vec<u8>> = (0..3u8).map(|i| vec![40 + i; 24]).collect();
        for (k, rid) in keys.iter().zip(&rids) {
            let pk = PublicAuthKey::Ed25519(k.verifying_key().to_bytes());
            futures_lite::future::block_on(o.store.create(queue(rid, pk))).unwrap();
        }
        let part = |s: &Session, third: Option<(&[u8], &SigningKey)>| -> Vec<Request> {
            let mut v: Vec<Request> = (0..2).map(|i| signed_sub(s, &rids[i], &keys[i])).collect();
            let (rid, key) = third.unwrap_or((&rids[2], &keys[2]));
            v.push(signed_sub(s, rid, key));
            v
        };

        let s = session_on(10);
        let before = verify_count_by_alg();
        futures_lite::future::block_on(o.process(s.clone(), 1, part(&s, None)));
        assert_eq!(
            delta(before).ed25519,
            3,
            "one batch of three, no single verification"
        );
        assert_eq!(
            (
                o.stats.borrow().relay.verify_batches,
                o.stats.borrow().relay.verify_batch_fallbacks
            ),
            (1, 0)
        );
        assert_eq!(auths(&inboxes[0]), [false, false, false]);
        assert!(rids.iter().all(|r| o.subs.borrow().contains_key(r)));

        let wrong_key = SigningKey::from_bytes(&[99; 32]);
        let missing = [77u8; 24];
        for (n, third) in [(&rids[2][..], &wrong_key), (&missing[..], &keys[2])]
            .into_iter()
            .enumerate()
        {
            let s = session_on(20 + n as u64);
            let before = verify_count_by_alg();
            futures_lite::future::block_on(o.process(s.clone(), 1, part(&s, Some(third))));
            assert_eq!(
                delta(before).ed25519,
                6,
                "case {n}: the batch of 3, then 3 single"
            );
            assert_eq!(o.stats.borrow().relay.verify_batch_fallbacks, 1 + n as u64);
            assert_eq!(auths(&inboxes[0]), [false, false, true], "case {n}");
            // The same connection's next part: no batch, one verification each.
            let batches = o.stats.borrow().relay.verify_batches;
            let before = verify_count_by_alg();
            futures_lite::future::block_on(o.process(s.clone(), 2, part(&s, None)));
            assert_eq!(delta(before).ed25519, 3);
            assert_eq!(o.stats.borrow().relay.verify_batches, batches);
            assert_eq!(auths(&inboxes[0]), [false, false, false]);
        }
        // Other connections still batch.
        let s = session_on(30);
        futures_lite::future::block_on(o.process(s.clone(), 1, part(&s, None)));
        assert_eq!(
            (
                o.stats.borrow().relay.verify_batches,
                o.stats.borrow().relay.verify_batch_fallbacks
            ),
            (4, 2)
        );
        assert_eq!(auths(&inboxes[0]), [false, false, false]);
    }

    /// A SEND for the queue `rid` (sender ID `sid`) signed by `signer`.
    fn signed_send(s: &Session, rid: Option<&[u8]>, sid: &[u8], signer: &SigningKey) -> Request {
        let send = Command::Send {
            flags: crate::protocol::command::MsgFlags {
                notification: false,
                reserved: Vec::new(),
            },
            body: b"hello".to_vec(),
        };
        signed_request(s, sid, rid, send, b"SEND  hello", signer)
    }

    /// A SEND's queue (if any), sender ID and signer.
    type SendOf<'a> = (Option<&'a [u8]>, &'a [u8], &'a SigningKey);

    /// SENDs of different connections, one a block, that reached the owner together are verified
    /// in one batch and run with no further verification; a wrong key and a missing queue each fail
    /// that batch alike (same counts), and every SEND is then verified alone. Parts of SUBs, and
    /// parts large enough to batch alone, do not join.
    #[test]
    fn sends_of_several_connections_share_one_batch_and_fall_back_alike() {
        let (o, inboxes) = owner();
        let keys: Vec<SigningKey> = (0..4u8)
            .map(|i| SigningKey::from_bytes(&[110 + i; 32]))
            .collect();
        let rids: Vec<Vec<u8>> = (0..4u8).map(|i| vec![120 + i; 24]).collect();
        let sids: Vec<Vec<u8>> = (0..4u8).map(|i| vec![130 + i; 24]).collect();
        for ((k, rid), sid) in keys.iter().zip(&rids).zip(&sids) {
            let mut q = queue(rid, PublicAuthKey::Ed25519([1; 32]));
            q.sender_id = sid.clone();
            q.sender_key = Some(PublicAuthKey::Ed25519(k.verifying_key().to_bytes()));
            futures_lite::future::block_on(o.store.create(q)).unwrap();
        }
        // One SEND per part, each part from its own connection; `last` replaces the fourth.
        let parts = |first_conn: u64, last: Option<SendOf>| {
            (0..4)
                .map(|i| {
                    let s = session_on(first_conn + i as u64);
                    let (rid, sid, key) = match last {
                        Some(l) if i == 3 => l,
                        _ => (Some(&rids[i][..]), &sids[i][..], &keys[i]),
                    };
                    let req = signed_send(&s, rid, sid, key);
                    (s, vec![req])
                })
                .collect::<Vec<_>>()
        };
        let run = |mut ps: Vec<(Session, Vec<Request>)>| -> (u64, Vec<bool>) {
            let before = verify_count_by_alg();
            {
                let mut refs: Vec<(ConnRef, &mut [Request])> = ps
                    .iter_mut()
                    .map(|(s, r)| (s.conn, r.as_mut_slice()))
                    .collect();
                o.batch_verify_across(&mut refs);
            }
            let mut answers = Vec::new();
            for (s, reqs) in ps {
                futures_lite::future::block_on(o.process(s, 1, reqs));
                answers.extend(auths(&inboxes[0]));
            }
            (delta(before).ed25519, answers)
        };

        let (verified, answers) = run(parts(200, None));
        assert_eq!(verified, 4, "one batch of four, nothing verified again");
        assert_eq!(answers, [false; 4]);
        assert_eq!(
            (
                o.stats.borrow().relay.verify_batches,
                o.stats.borrow().relay.verify_batch_fallbacks,
                o.stats.borrow().relay.verify_batch_signatures
            ),
            (1, 0, 4)
        );

        let wrong_key = SigningKey::from_bytes(&[98; 32]);
        let missing = [78u8; 24];
        let cases: [SendOf; 2] = [
            (Some(&rids[3][..]), &sids[3][..], &wrong_key),
            (None, &missing[..], &keys[3]),
        ];
        for (n, last) in cases.into_iter().enumerate() {
            let (verified, answers) = run(parts(300 + 10 * n as u64, Some(last)));
            assert_eq!(verified, 8, "case {n}: the batch of four, then each alone");
            assert_eq!(answers, [false, false, false, true], "case {n}");
            assert_eq!(o.stats.borrow().relay.verify_batch_fallbacks, 1 + n as u64);
        }

        // Parts of SUBs do not join; nor does a part of SENDs large enough to batch alone.
        let batches = o.stats.borrow().relay.verify_batches;
        let (a, b) = (session_on(400), session_on(401));
        let mut subs_a = [signed_sub(&a, &rids[0], &keys[0])];
        let mut subs_b = [signed_sub(&b, &rids[1], &keys[1])];
        o.batch_verify_across(&mut [(a.conn, &mut subs_a[..]), (b.conn, &mut subs_b[..])]);
        let mut big: Vec<Request> = (0..CROSS_BATCH_PART_MAX)
            .map(|i| signed_send(&a, Some(&rids[i % 4]), &sids[i % 4], &keys[i % 4]))
            .collect();
        let mut small = [signed_send(&b, Some(&rids[0]), &sids[0], &keys[0])];
        o.batch_verify_across(&mut [(a.conn, &mut big[..]), (b.conn, &mut small[..])]);
        assert_eq!(o.stats.borrow().relay.verify_batches, batches);
        assert!(subs_a
            .iter()
            .chain(&subs_b)
            .chain(&big)
            .chain(&small)
            .all(|r| r.batch_verified.is_none()));
    }

    /// Bad batches from ever new connections turn batching off for the whole owner for a while,
    /// then it comes back.
    #[test]
    fn failing_batches_from_new_connections_turn_batching_off_shard_wide_for_a_while() {
        let (mut o, inboxes) = owner();
        let keys: Vec<SigningKey> = (0..2u8)
            .map(|i| SigningKey::from_bytes(&[60 + i; 32]))
            .collect();
        let rids: Vec<Vec<u8>> = (0..2u8).map(|i| vec![70 + i; 24]).collect();
        for (k, rid) in keys.iter().zip(&rids) {
            let pk = PublicAuthKey::Ed25519(k.verifying_key().to_bytes());
            futures_lite::future::block_on(o.store.create(queue(rid, pk))).unwrap();
        }
        let wrong = SigningKey::from_bytes(&[99; 32]);
        let mut conn = 100;
        let mut part = |o: &mut Owner<MemoryStore>, good: bool| {
            conn += 1;
            let s = session_on(conn);
            let second = if good { &keys[1] } else { &wrong };
            let reqs = vec![
                signed_sub(&s, &rids[0], &keys[0]),
                signed_sub(&s, &rids[1], second),
            ];
            futures_lite::future::block_on(o.process(s, 1, reqs));
            while inboxes[0].try_recv().is_ok() {}
        };
        let failures_to_trip = BATCH_FAIL_LIMIT / BATCH_FAIL_WEIGHT + 1;
        for _ in 0..failures_to_trip {
            part(&mut o, false);
        }
        assert_eq!(
            o.stats.borrow().relay.verify_batch_fallbacks,
            failures_to_trip as u64
        );
        let batches = o.stats.borrow().relay.verify_batches;
        for _ in 0..BATCH_OFF_BLOCKS {
            part(&mut o, true);
        }
        assert_eq!(
            o.stats.borrow().relay.verify_batches,
            batches,
            "no batch while the guard is on"
        );
        part(&mut o, true);
        assert_eq!(
            o.stats.borrow().relay.verify_batches,
            batches + 1,
            "batching is back"
        );
        assert_eq!(
            o.stats.borrow().relay.verify_batch_fallbacks,
            failures_to_trip as u64
        );
    }

    // ---- Back-pressure, notifier backlogs, multi-key verification (commit 74ea7ec) ----

    fn pk(k: &SigningKey) -> PublicAuthKey {
        PublicAuthKey::Ed25519(k.verifying_key().to_bytes())
    }

    /// `cmd` for `rid` (named by `entity`), signed by `signer` over what a client signs, or unsigned.
    fn request(
        s: &Session,
        entity: &[u8],
        rid: &[u8],
        cmd: Command,
        signer: Option<&SigningKey>,
    ) -> Request {
        let corr = [6u8; 24];
        let signed = client_signed_bytes(
            s.version,
            &s.session_id,
            &corr,
            entity,
            &cmd.to_bytes(s.version),
        );
        let authorization = signer.map_or(Vec::new(), |k| auth::sign_ed25519(k, &signed).to_vec());
        Request {
            corr_id: corr.to_vec(),
            entity_id: entity.to_vec(),
            recipient_id: Some(rid.to_vec()),
            command: cmd,
            authorization,
            service: ServiceCheck::Plain,
            authorized: signed,
            forward: None,
            batch_verified: None,
            pre_verified: None,
            undelivered: None,
            associated: false,
        }
    }

    /// An unsigned SEND (the queue has no sender key), with or without the notification flag.
    fn send_req(s: &Session, rid: &[u8], notification: bool) -> Request {
        let cmd = Command::Send {
            flags: MsgFlags::new(notification),
            body: b"hello".to_vec(),
        };
        request(s, &[2; 24], rid, cmd, None)
    }

    fn message(i: u8) -> Message {
        Message::Message {
            msg_id: [i; 24],
            ts: 1_700_000_000 + i64::from(i),
            notification: false,
            body: Rc::from(&b"body"[..]),
        }
    }

    /// The `i`th stored notification: its msg_id and nonce name it.
    fn ntf(i: u32) -> MsgNtf {
        let mut id = [0u8; 24];
        id[..4].copy_from_slice(&i.to_be_bytes());
        MsgNtf {
            msg_id: id,
            ts: i64::from(i),
            nonce: id,
            enc_meta: vec![0xee; 144],
        }
    }

    /// A queue with recipient key `rkey` and a notifier `nid` with key `nkey`, known to the directory.
    fn notifier_queue(
        o: &mut Owner<MemoryStore>,
        rid: &[u8],
        rkey: &SigningKey,
        nid: &[u8],
        nkey: &SigningKey,
    ) {
        let mut q = queue(rid, pk(rkey));
        q.notifier = Some(Box::new(NotifierCreds {
            notifier_id: nid.to_vec(),
            notifier_key: pk(nkey),
            rcv_ntf_dh_secret: [3; 32],
            ntf_service_id: None,
        }));
        block_on(o.store.create(q)).unwrap();
        assert!(o.directory.insert(IdSpace::Notifier, nid, rid));
    }

    fn decode(t: &[u8]) -> (Vec<u8>, BrokerMsg) {
        let raw = parse_transmission(18, t).unwrap();
        let m = BrokerMsg::parse(18, raw.command).unwrap();
        (raw.entity_id.to_vec(), m)
    }

    /// Every transmission of `groups`, decoded, in order.
    fn decoded(groups: &[Group]) -> Vec<BrokerMsg> {
        groups
            .iter()
            .flat_map(|g| g.transmissions.iter().map(|t| decode(t).1))
            .collect()
    }

    fn what(m: &ShardMsg) -> &'static str {
        match m {
            ShardMsg::Conn(ConnMsg::Reply { .. }) => "Reply",
            ShardMsg::Conn(ConnMsg::Event { .. }) => "Event",
            ShardMsg::Conn(ConnMsg::Redelivered { .. }) => "Redelivered",
            ShardMsg::Conn(ConnMsg::Close { .. }) => "Close",
            _ => "other",
        }
    }

    /// The inbox holds exactly one message, the Reply to `conn`: its groups.
    fn only_reply(inbox: &flume::Receiver<ShardMsg>, conn: u64) -> Vec<Group> {
        let all: Vec<ShardMsg> = inbox.try_iter().collect();
        let kinds: Vec<_> = all.iter().map(what).collect();
        assert_eq!(kinds, ["Reply"], "exactly one Reply");
        match all.into_iter().next() {
            Some(ShardMsg::Conn(ConnMsg::Reply {
                conn: c, groups, ..
            })) => {
                assert_eq!(c.id, conn);
                groups
            }
            _ => unreachable!(),
        }
    }

    /// The answers of `requests` from `conn` (the first group of its Reply), and the Reply's groups.
    fn run(
        o: &mut Owner<MemoryStore>,
        inbox: &flume::Receiver<ShardMsg>,
        conn: u64,
        requests: Vec<Request>,
    ) -> Vec<BrokerMsg> {
        block_on(o.process(session_on(conn), 1, requests));
        decoded(&only_reply(inbox, conn))
    }

    /// The notifications of `nid` carried by `groups` (each NMSG checked against the stored one it
    /// stands for), and the marker for more, if any.
    fn ntfs_of(groups: Vec<Group>, nid: &[u8]) -> (Vec<MsgNtf>, Option<Pending>) {
        let mut ntfs = Vec::new();
        let mut more = None;
        for g in groups {
            match g.kind {
                GroupKind::Ntfs(r) => {
                    assert_eq!((r.owner, &r.notifier_id[..]), (0, nid));
                    assert!(r.ntfs.len() <= limits::NTFS_PER_PART, "{}", r.ntfs.len());
                    assert_eq!(g.transmissions.len(), r.ntfs.len());
                    for (t, n) in g.transmissions.iter().zip(&r.ntfs) {
                        let (entity, m) = decode(t);
                        assert_eq!(entity, nid);
                        assert_eq!(
                            m,
                            BrokerMsg::Nmsg {
                                nonce: n.nonce,
                                enc_meta: n.enc_meta.clone()
                            }
                        );
                    }
                    ntfs.extend(r.ntfs);
                }
                GroupKind::More(p) => {
                    assert!(more.is_none(), "one More marker");
                    assert!(g.transmissions.is_empty());
                    more = Some(p);
                }
                GroupKind::Plain => {}
                GroupKind::Msg(_) => panic!("a MSG among notifications"),
            }
        }
        (ntfs, more)
    }

    /// Guards the NSUB output bound: 1,000 stored notifications go out NTFS_PER_PART at a time,
    /// each exactly once and in stored order, and one arriving meanwhile queues behind them.
    #[test]
    fn nsub_delivers_a_stored_backlog_in_bounded_parts_in_order_with_new_ones_behind() {
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let (rkey, nkey) = (
            SigningKey::from_bytes(&[1; 32]),
            SigningKey::from_bytes(&[2; 32]),
        );
        let (rid, nid) = (vec![10u8; 24], vec![11u8; 24]);
        notifier_queue(&mut o, &rid, &rkey, &nid, &nkey);
        let stored: Vec<MsgNtf> = (0..1000).map(ntf).collect();
        assert!(stored.len() <= crate::store::memory::MAX_NTFS_PER_NOTIFIER);
        for n in &stored {
            block_on(o.store.add_ntf(&nid, n.clone())).unwrap();
        }

        let s = session_on(1);
        let nsub = request(&s, &nid, &rid, Command::NSub, Some(&nkey));
        block_on(o.process(s.clone(), 1, vec![nsub]));
        let groups = only_reply(inbox, 1);
        assert!(groups[0].is_plain());
        assert_eq!(decoded(&groups[..1]), [BrokerMsg::Sok(None)]);
        assert!(matches!(groups[1].kind, GroupKind::Ntfs(_)));
        assert_eq!(groups.len(), 3, "SOK, one part, the More marker");
        let (mut got, mut more) = ntfs_of(groups, &nid);
        assert_eq!(got.len(), limits::NTFS_PER_PART);
        assert_eq!(
            more,
            Some(Pending::Ntfs {
                owner: 0,
                notifier_id: nid.clone()
            })
        );
        assert!(o.ntf_backlog.borrow().contains(&nid));

        let mut asks = 0;
        let mut new_id = None;
        while let Some(p) = more.take() {
            asks += 1;
            assert!(asks <= 1000 / limits::NTFS_PER_PART + 1, "too many parts");
            if asks == 2 {
                // A notification arriving while the backlog is pending: stored, not sent ahead.
                let sender = session_on(2);
                let answers = run(&mut o, inbox, 2, vec![send_req(&sender, &rid, true)]);
                assert_eq!(answers, [BrokerMsg::Ok]);
                new_id = block_on(o.store.peek_first(&rid))
                    .unwrap()
                    .map(|m| *m.msg_id());
            }
            block_on(o.redeliver(s.conn, vec![p]));
            let all: Vec<ShardMsg> = inbox.try_iter().collect();
            assert_eq!(all.iter().map(what).collect::<Vec<_>>(), ["Redelivered"]);
            let Some(ShardMsg::Conn(ConnMsg::Redelivered { conn, groups })) =
                all.into_iter().next()
            else {
                unreachable!()
            };
            assert_eq!(conn, s.conn);
            let (part, m) = ntfs_of(groups, &nid);
            assert!(!part.is_empty());
            got.extend(part);
            more = m;
        }
        assert!(!o.ntf_backlog.borrow().contains(&nid));
        let new_id = new_id.expect("the SEND's message");
        assert_eq!(got.len(), 1001, "the 1,000 stored, then the new one");
        assert_eq!(&got[..1000], &stored[..], "each once, in stored order");
        assert_eq!(got[1000].msg_id, new_id, "the new one behind the backlog");
        assert!(block_on(o.store.take_ntfs(&nid, usize::MAX))
            .unwrap()
            .0
            .is_empty());

        // With the backlog delivered, the next notification goes to the subscriber at once.
        let sender = session_on(2);
        block_on(o.process(sender.clone(), 2, vec![send_req(&sender, &rid, true)]));
        let all: Vec<ShardMsg> = inbox.try_iter().collect();
        assert_eq!(all.iter().map(what).collect::<Vec<_>>(), ["Event", "Reply"]);
        let Some(ShardMsg::Conn(ConnMsg::Event { conn, groups })) = all.into_iter().next() else {
            unreachable!()
        };
        assert_eq!(conn, s.conn);
        let (live, m) = ntfs_of(groups, &nid);
        assert_eq!((live.len(), m), (1, None));
    }

    /// Guards ReturnNtfs: notifications a connection could not take are stored again ahead of later
    /// ones and come with the next NSUB; a notifier deleted meanwhile keeps none.
    #[test]
    fn returned_notifications_are_stored_ahead_of_later_ones_or_dropped_with_their_notifier() {
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let (rkey, nkey) = (
            SigningKey::from_bytes(&[1; 32]),
            SigningKey::from_bytes(&[2; 32]),
        );
        let (rid, nid) = (vec![20u8; 24], vec![21u8; 24]);
        notifier_queue(&mut o, &rid, &rkey, &nid, &nkey);
        for i in 0..2 {
            block_on(o.store.add_ntf(&nid, ntf(i))).unwrap();
        }

        // Connection 1 subscribes and is handed both, then closes before writing them.
        let s1 = session_on(1);
        block_on(o.process(
            s1.clone(),
            1,
            vec![request(&s1, &nid, &rid, Command::NSub, Some(&nkey))],
        ));
        let (handed, more) = ntfs_of(only_reply(inbox, 1), &nid);
        assert_eq!((handed.clone(), more), (vec![ntf(0), ntf(1)], None));
        assert_eq!(o.stats.borrow().msg_ntfs, 2);
        o.connection_closed(s1.conn);
        block_on(o.store.add_ntf(&nid, ntf(2))).unwrap();
        block_on(o.store_ntfs(&nid, handed));
        assert_eq!(
            o.stats.borrow().msg_ntfs,
            0,
            "returned ones were not delivered"
        );

        let s2 = session_on(2);
        block_on(o.process(
            s2.clone(),
            1,
            vec![request(&s2, &nid, &rid, Command::NSub, Some(&nkey))],
        ));
        let (again, more) = ntfs_of(only_reply(inbox, 2), &nid);
        assert_eq!((again, more), (vec![ntf(0), ntf(1), ntf(2)], None));
        assert_eq!(o.stats.borrow().msg_ntfs, 3);

        // NDEL removes the notifier; notifications returned for it afterwards are dropped.
        let s3 = session_on(3);
        let ndel = request(&s3, &rid, &rid, Command::NDel, Some(&rkey));
        block_on(o.process(s3.clone(), 1, vec![ndel]));
        let all: Vec<ShardMsg> = inbox.try_iter().collect();
        assert_eq!(all.iter().map(what).collect::<Vec<_>>(), ["Event", "Reply"]);
        let mut all = all.into_iter();
        let Some(ShardMsg::Conn(ConnMsg::Event { conn, groups })) = all.next() else {
            unreachable!()
        };
        assert_eq!((conn, decoded(&groups)), (s2.conn, vec![BrokerMsg::Deld]));
        let Some(ShardMsg::Conn(ConnMsg::Reply { groups, .. })) = all.next() else {
            unreachable!()
        };
        assert_eq!(decoded(&groups), [BrokerMsg::Ok]);
        assert_eq!(o.directory.lookup(IdSpace::Notifier, &nid), None);
        block_on(o.store_ntfs(&nid, vec![ntf(3)]));
        assert!(block_on(o.store.take_ntfs(&nid, usize::MAX))
            .unwrap()
            .0
            .is_empty());
        assert!(!o.store.ntf_ids().contains(&nid));
    }

    /// Guards multi-key verification (item 6): the key that verified last is tried first, and a
    /// connection signing with none of 255 keys is closed once its failed-verification budget is
    /// spent. Before the fix each such SUB cost 255 verifications, without bound.
    #[test]
    fn many_recipient_keys_try_the_last_good_key_first_and_bound_a_bad_signers_cost() {
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let keys: Vec<SigningKey> = (0..255u32)
            .map(|i| {
                let mut seed = [0x40u8; 32];
                seed[..4].copy_from_slice(&i.to_be_bytes());
                SigningKey::from_bytes(&seed)
            })
            .collect();
        let rid = vec![30u8; 24];
        let mut q = queue(&rid, pk(&keys[0]));
        q.recipient_keys = keys.iter().map(pk).collect();
        block_on(o.store.create(q)).unwrap();

        let a = session_on(1);
        let before = verify_count_by_alg();
        let answers = run(&mut o, inbox, 1, vec![signed_sub(&a, &rid, &keys[200])]);
        let first = delta(before).ed25519;
        assert!((1..=201).contains(&first), "{first} verifications");
        assert_eq!(answers, [BrokerMsg::Sok(None)]);
        let before = verify_count_by_alg();
        let answers = run(&mut o, inbox, 1, vec![signed_sub(&a, &rid, &keys[200])]);
        assert_eq!(delta(before).ed25519, 1, "the last good key is tried first");
        assert_eq!(answers, [BrokerMsg::Sok(None)]);

        // Connection B signs with a key the queue does not have, 4 SUBs a block.
        let b = session_on(2);
        let bad = SigningKey::from_bytes(&[0xbb; 32]);
        let started = std::time::Instant::now();
        let before = verify_count_by_alg();
        let (mut requests, mut closes) = (0u64, 0);
        for block in 0..100 {
            let subs = (0..4).map(|_| signed_sub(&b, &rid, &bad)).collect();
            requests += 4;
            block_on(o.process(b.clone(), block, subs));
            for m in inbox.try_iter() {
                match m {
                    ShardMsg::Conn(ConnMsg::Reply { conn, groups, .. }) => {
                        assert_eq!(conn, b.conn);
                        assert_eq!(decoded(&groups), vec![BrokerMsg::Err(ErrorType::Auth); 4]);
                    }
                    ShardMsg::Conn(ConnMsg::Close { conn }) => {
                        assert_eq!(conn, b.conn);
                        closes += 1;
                    }
                    other => panic!("unexpected {}", what(&other)),
                }
            }
            if closes > 0 {
                break;
            }
        }
        // A block already on its way when the close was asked for: answered, no second close.
        block_on(o.process(b.clone(), 100, vec![signed_sub(&b, &rid, &bad)]));
        requests += 1;
        assert_eq!(
            decoded(&only_reply(inbox, 2)),
            [BrokerMsg::Err(ErrorType::Auth)]
        );
        let spent = delta(before).ed25519;
        let refilled = (started.elapsed().as_secs_f64() * f64::from(FAILED_VERIFY_REFILL_PER_SEC))
            .ceil() as u64;
        assert_eq!(closes, 1, "B is closed once");
        assert_eq!(o.stats.borrow().relay.verify_budget_closes, 1);
        assert!(
            spent > u64::from(limits::FAILED_VERIFY_BUDGET),
            "the budget was spent first ({spent})"
        );
        // Each request's first key is free; the first block was also tried as a batch of 4.
        assert!(
            spent <= u64::from(limits::FAILED_VERIFY_BUDGET) + refilled + requests + 4,
            "{spent} verifications for {requests} requests (refilled {refilled})"
        );
        o.connection_closed(b.conn);
        assert!(!o.verify_budget.borrow().contains_key(&b.conn));

        // C, with a right key, is served; A's subscription ends.
        let c = session_on(3);
        block_on(o.process(c.clone(), 1, vec![signed_sub(&c, &rid, &keys[254])]));
        let all: Vec<ShardMsg> = inbox.try_iter().collect();
        assert_eq!(all.iter().map(what).collect::<Vec<_>>(), ["Event", "Reply"]);
        let Some(ShardMsg::Conn(ConnMsg::Reply { groups, .. })) = all.into_iter().nth(1) else {
            unreachable!()
        };
        assert_eq!(decoded(&groups), [BrokerMsg::Sok(None)]);
        assert_eq!(o.subs.borrow()[&rid].session.conn, c.conn);
    }

    /// Guards item 7: a SUB that fails verification (or names no queue) reads nothing from the
    /// store; verified SUBs of a part share one `peek_first_many`, also when the part's batch
    /// verification failed.
    #[test]
    fn subs_failing_verification_cause_no_store_read() {
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let keys: Vec<SigningKey> = (0..3u8)
            .map(|i| SigningKey::from_bytes(&[50 + i; 32]))
            .collect();
        let rids: Vec<Vec<u8>> = (0..3u8).map(|i| vec![50 + i; 24]).collect();
        for (i, (k, rid)) in keys.iter().zip(&rids).enumerate() {
            block_on(o.store.create(queue(rid, pk(k)))).unwrap();
            block_on(o.store.write(rid, message(i as u8 + 1), 128)).unwrap();
        }
        let wrong = SigningKey::from_bytes(&[99; 32]);
        let reads = |o: &Owner<MemoryStore>| {
            let c = o.store.counters();
            (c.store_peek_first_calls, c.store_peek_first_many_calls)
        };
        let is_msg = |m: &BrokerMsg| matches!(m, BrokerMsg::Msg { .. });

        let s = session_on(1);
        for (path, req) in [
            ("wrong key", signed_sub(&s, &rids[0], &wrong)),
            ("unknown queue", signed_sub(&s, &[66; 24], &keys[0])),
        ] {
            let r0 = reads(&o);
            let answers = run(&mut o, inbox, 1, vec![req]);
            assert_eq!(answers, [BrokerMsg::Err(ErrorType::Auth)], "{path}");
            assert_eq!(reads(&o), r0, "{path}: no store read");
        }
        assert!(o.subs.borrow().is_empty());

        let r0 = reads(&o);
        let answers = run(&mut o, inbox, 1, vec![signed_sub(&s, &rids[0], &keys[0])]);
        assert_eq!(answers.len(), 2);
        assert_eq!(answers[0], BrokerMsg::Sok(None));
        assert!(is_msg(&answers[1]));
        assert_eq!(reads(&o), (r0.0, r0.1 + 1), "one peek_first_many");

        // A part of 3 with one wrong key: the batch fails, each SUB is verified alone, and the
        // two verified ones are read in one call (their heads come from it: no peek_first).
        let s2 = session_on(2);
        let r0 = reads(&o);
        let fallbacks = o.stats.borrow().relay.verify_batch_fallbacks;
        let answers = run(
            &mut o,
            inbox,
            2,
            vec![
                signed_sub(&s2, &rids[1], &keys[1]),
                signed_sub(&s2, &rids[0], &wrong),
                signed_sub(&s2, &rids[2], &keys[2]),
            ],
        );
        assert_eq!(o.stats.borrow().relay.verify_batch_fallbacks, fallbacks + 1);
        assert_eq!(answers.len(), 5);
        assert_eq!(
            answers[..3],
            [
                BrokerMsg::Sok(None),
                BrokerMsg::Err(ErrorType::Auth),
                BrokerMsg::Sok(None)
            ]
        );
        assert!(answers[3..].iter().all(is_msg));
        assert_eq!(reads(&o), (r0.0, r0.1 + 1));
        assert_eq!(
            o.subs.borrow()[&rids[0]].session.conn,
            s.conn,
            "the wrong key took nothing"
        );
        assert_eq!(o.subs.borrow()[&rids[2]].session.conn, s2.conn);
    }

    /// Guards item 7: DEL drops the GET-mode state of the deleted queue, on every connection, and
    /// leaves other queues' state alone.
    #[test]
    fn del_drops_the_get_mode_entries_of_that_queue_only() {
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let (kx, ky) = (
            SigningKey::from_bytes(&[1; 32]),
            SigningKey::from_bytes(&[2; 32]),
        );
        let (x, y) = (vec![60u8; 24], vec![61u8; 24]);
        block_on(o.store.create(queue(&x, pk(&kx)))).unwrap();
        block_on(o.store.create(queue(&y, pk(&ky)))).unwrap();
        for (conn, rid, k) in [(1, &x, &kx), (2, &x, &kx), (1, &y, &ky)] {
            let get = request(&session_on(conn), rid, rid, Command::Get, Some(k));
            assert_eq!(run(&mut o, inbox, conn, vec![get]), [BrokerMsg::Ok]);
        }
        assert_eq!(o.gets.borrow()[&x].len(), 2);
        let (c1, c2) = (session_on(1).conn, session_on(2).conn);

        let del = request(&session_on(2), &x, &x, Command::Del, Some(&kx));
        assert_eq!(run(&mut o, inbox, 2, vec![del]), [BrokerMsg::Ok]);
        assert!(!o.gets.borrow().contains_key(&x));
        assert_eq!(o.get_state(&y, c1), Some(None), "Y's entry stays");
        assert_eq!(o.by_conn.borrow()[&c1].gets, HashSet::from([y.clone()]));
        assert!(o.by_conn.borrow()[&c2].gets.is_empty());
        assert!(o.store.get(&x).is_none());
    }

    /// Guards item 7: QUE reports the reference's `noSub` for the connection's own subscription
    /// (no delivery thread waits here), `prohibitSub` for a GET-mode connection, nothing otherwise.
    #[test]
    fn que_reports_no_sub_for_the_subscriber_and_prohibit_sub_for_get_mode() {
        use base64::Engine;
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let k = SigningKey::from_bytes(&[1; 32]);
        let rid = vec![70u8; 24];
        block_on(o.store.create(queue(&rid, pk(&k)))).unwrap();
        block_on(o.store.write(&rid, message(7), 128)).unwrap();
        let delivered = base64::engine::general_purpose::STANDARD.encode([7u8; 24]);
        let info = |o: &mut Owner<MemoryStore>, conn: u64| {
            let que = request(&session_on(conn), &rid, &rid, Command::Que, Some(&k));
            match &run(o, inbox, conn, vec![que])[..] {
                [BrokerMsg::Info(json)] => json.clone(),
                other => panic!("not INFO: {other:?}"),
            }
        };

        let answers = run(&mut o, inbox, 1, vec![signed_sub(&session_on(1), &rid, &k)]);
        assert_eq!(answers[0], BrokerMsg::Sok(None));
        let json = info(&mut o, 1);
        let sub = format!("\"qiSub\":{{\"qSubThread\":\"noSub\",\"qDelivered\":\"{delivered}\"}}");
        assert!(json.contains(&sub), "{json}");

        let get = request(&session_on(2), &rid, &rid, Command::Get, Some(&k));
        assert!(matches!(
            run(&mut o, inbox, 2, vec![get])[..],
            [BrokerMsg::Msg { .. }]
        ));
        let json = info(&mut o, 2);
        let sub =
            format!("\"qiSub\":{{\"qSubThread\":\"prohibitSub\",\"qDelivered\":\"{delivered}\"}}");
        assert!(json.contains(&sub), "{json}");

        let json = info(&mut o, 3);
        assert!(!json.contains("qiSub"), "{json}");
    }

    /// A SEND whose journal sync failed (every-batch) has an unknown outcome: the message is in
    /// the store, and may or may not survive a crash. Nothing of its block is answered and the
    /// connection is closed, as a crash would do; the queue's next change, from another
    /// connection, is refused before anything is applied.
    #[test]
    fn a_change_of_unknown_outcome_is_not_answered_and_its_connection_is_closed() {
        use crate::store::journal::{Durability, JournalStore, Manual, Runner, Tuning};
        use smp_journal::sim::{Fault, SimFs};
        use smp_journal::Fs;
        let fs = SimFs::new(3);
        fs.create_dir_all(std::path::Path::new("/relay")).unwrap();
        let settings = crate::store::StoreSettings::for_tests(std::path::Path::new("/relay"));
        let rid = vec![90u8; 24];
        let store = JournalStore::open_on(
            fs.clone(),
            &settings,
            &[crate::store::group_of(&rid)],
            0,
            Durability::EveryBatch,
            Tuning::default(),
            Runner::Manual(Manual::default()),
        )
        .unwrap();
        let (mesh, inboxes) = Mesh::new(1);
        let mesh = ShardMesh::new(mesh, 0);
        let o = Owner::new(
            0,
            store,
            Directory::new(),
            mesh,
            Rc::new(Settings::default()),
        );
        let k = SigningKey::from_bytes(&[1; 32]);
        // Touched today already: the SEND appends its message and nothing else.
        let today = crate::server::owner::commands::now_secs() / 86400 * 86400;
        let q = QueueRec {
            updated_at: Some(today),
            ..queue(&rid, pk(&k))
        };
        block_on(o.store.create(q)).unwrap();

        // The msync of the SEND's record fails.
        fs.fail_at(fs.ops(), Fault::Io);
        block_on(o.process(
            session_on(1),
            1,
            vec![send_req(&session_on(1), &rid, false)],
        ));
        let out: Vec<ShardMsg> = inboxes[0].try_iter().collect();
        assert_eq!(out.iter().map(what).collect::<Vec<_>>(), ["Close"]);
        assert!(matches!(&out[0], ShardMsg::Conn(ConnMsg::Close { conn }) if conn.id == 1));
        assert_eq!(o.store.size(&rid), 1, "the message is in the store");

        block_on(o.process(
            session_on(2),
            1,
            vec![send_req(&session_on(2), &rid, false)],
        ));
        assert_eq!(
            decoded(&only_reply(&inboxes[0], 2)),
            [BrokerMsg::Err(ErrorType::Store(
                crate::store::journal::SYNC_FAILED.into()
            ))]
        );
        assert_eq!(o.store.size(&rid), 1, "nothing applied");
    }

    /// Guards item 5: an ACK of a MSG the connection dropped unsent (`undelivered`) is NO_MSG and
    /// deletes nothing; the same ACK for a MSG it did send deletes it.
    #[test]
    fn ack_of_a_dropped_delivery_is_no_msg_and_keeps_the_message() {
        let (mut o, inboxes) = owner();
        let inbox = &inboxes[0];
        let k = SigningKey::from_bytes(&[1; 32]);
        let rid = vec![80u8; 24];
        block_on(o.store.create(queue(&rid, pk(&k)))).unwrap();
        let a = session_on(1);
        assert_eq!(
            run(&mut o, inbox, 1, vec![signed_sub(&a, &rid, &k)]),
            [BrokerMsg::Sok(None)]
        );

        // A SEND from another connection pushes the message to A.
        let sender = session_on(2);
        block_on(o.process(sender.clone(), 1, vec![send_req(&sender, &rid, false)]));
        let all: Vec<ShardMsg> = inbox.try_iter().collect();
        assert_eq!(all.iter().map(what).collect::<Vec<_>>(), ["Event", "Reply"]);
        let mut all = all.into_iter();
        let Some(ShardMsg::Conn(ConnMsg::Event { conn, mut groups })) = all.next() else {
            unreachable!()
        };
        assert_eq!((conn, groups.len()), (a.conn, 1));
        let GroupKind::Msg(d) = std::mem::replace(&mut groups[0].kind, GroupKind::Plain) else {
            panic!("not a MSG delivery");
        };
        assert_eq!(o.store.size(&rid), 1);
        assert!(o.is_outstanding(a.conn, &d));

        let mut ack = request(&a, &rid, &rid, Command::Ack(d.msg_id.to_vec()), Some(&k));
        ack.undelivered = Some(d.clone());
        assert_eq!(
            run(&mut o, inbox, 1, vec![ack]),
            [BrokerMsg::Err(ErrorType::NoMsg)]
        );
        assert_eq!(o.store.size(&rid), 1, "the message stays");
        assert!(
            o.is_outstanding(a.conn, &d),
            "still A's outstanding delivery"
        );

        let ack = request(&a, &rid, &rid, Command::Ack(d.msg_id.to_vec()), Some(&k));
        assert_eq!(run(&mut o, inbox, 1, vec![ack]), [BrokerMsg::Ok]);
        assert_eq!(o.store.size(&rid), 0);
    }

    // ---- The pipeline: a held store operation holds up its own queue only ----

    /// The body of a MSG sealed for a queue made by `queue` (its secret is `[1; 32]`).
    fn msg_body(m: &BrokerMsg) -> Vec<u8> {
        let BrokerMsg::Msg { msg_id, body } = m else {
            panic!("not a MSG: {m:?}");
        };
        let plain = crate::client::queue::decrypt_msg(&[1; 32], msg_id, body).expect("decrypts");
        plain.body().expect("a message").to_vec()
    }

    /// An owner on a memory store whose operations a latch holds (open at first), its pipeline,
    /// and the shard inboxes.
    #[allow(clippy::type_complexity)]
    fn latched_owner() -> (
        Rc<Owner<crate::store::held::Held<MemoryStore, Rc<crate::store::held::Latch>>>>,
        crate::server::owner::pipeline::Pipeline,
        Rc<crate::store::held::Latch>,
        Vec<flume::Receiver<ShardMsg>>,
    ) {
        use crate::store::held::{Held, Latch, LatchMode};
        let (mesh, inboxes) = Mesh::new(1);
        let mesh = ShardMesh::new(mesh, 0);
        let latch = Latch::new(LatchMode::Open);
        let store = Held {
            inner: MemoryStore::new(),
            hold: latch.clone(),
        };
        let settings = Rc::new(Settings::default());
        let o = Rc::new(Owner::new(0, store, Directory::new(), mesh, settings));
        (
            o,
            crate::server::owner::pipeline::Pipeline::new(),
            latch,
            inboxes,
        )
    }

    /// `docs/ARCHITECTURE.md` §2, over the owner as the shard runs it (`owner::owner_job` and the
    /// pipeline): while a SEND on queue A waits for its store (a latch holds every operation on A),
    /// a SEND on B is answered and its MSG pushed to B's subscriber; A's next SEND waits behind
    /// the first; released, A's operations run one at a time and its SENDs are answered and
    /// stored in order.
    #[test]
    fn a_held_store_operation_holds_up_its_queue_only_and_its_later_commands_follow_in_order() {
        use crate::server::owner::owner_job;
        use crate::store::held::LatchMode;

        let (o, p, latch, inboxes) = latched_owner();
        let inbox = &inboxes[0];
        let key = SigningKey::from_bytes(&[3u8; 32]);
        let (a, b) = (vec![0xa0; 24], vec![0xb0; 24]);
        for rid in [&a, &b] {
            block_on(o.store.create(queue(rid, pk(&key)))).unwrap();
        }
        let work = |conn: u64, requests: Vec<Request>| {
            let msg = OwnerMsg::Work {
                session: session_on(conn),
                block_seq: 0,
                requests,
            };
            owner_job(&o, &p, msg);
        };
        let send = |conn: u64, rid: &[u8], body: &[u8]| {
            let cmd = Command::Send {
                flags: MsgFlags::new(false),
                body: body.to_vec(),
            };
            request(&session_on(conn), &[2; 24], rid, cmd, None)
        };
        let replies_to = |out: &[ShardMsg], conn: u64| -> Vec<Vec<BrokerMsg>> {
            out.iter()
                .filter_map(|m| match m {
                    ShardMsg::Conn(ConnMsg::Reply {
                        conn: c, groups, ..
                    }) if c.id == conn => Some(decoded(groups)),
                    _ => None,
                })
                .collect()
        };

        // Connection 1 subscribes to B.
        work(1, vec![signed_sub(&session_on(1), &b, &key)]);
        assert_eq!(decoded(&only_reply(inbox, 1)), [BrokerMsg::Sok(None)]);

        // Connection 2 sends twice to A: the first SEND's store operation is held, the second
        // waits in line behind it.
        latch.set_mode(LatchMode::Only(vec![a.clone()]));
        work(2, vec![send(2, &a, b"a1")]);
        work(2, vec![send(2, &a, b"a2")]);
        let waiting = latch.waiting();
        assert_eq!(
            waiting.len(),
            1,
            "one operation on A in flight: {waiting:?}"
        );
        assert_eq!(p.jobs(), 2, "both SENDs to A are in the pipeline");

        // Meanwhile connection 3's SEND to B is answered and B's subscriber gets its MSG.
        work(3, vec![send(3, &b, b"b1")]);
        let out: Vec<ShardMsg> = inbox.try_iter().collect();
        assert_eq!(replies_to(&out, 3), [[BrokerMsg::Ok]], "B's SEND answered");
        let pushed: Vec<Vec<u8>> = out
            .iter()
            .filter_map(|m| match m {
                ShardMsg::Conn(ConnMsg::Event { conn, groups }) if conn.id == 1 => {
                    Some(decoded(groups))
                }
                _ => None,
            })
            .flatten()
            .map(|m| msg_body(&m))
            .collect();
        assert_eq!(pushed, [b"b1".to_vec()], "B's MSG delivered");
        assert!(replies_to(&out, 2).is_empty(), "nothing for A yet");

        // Released one operation at a time, A's SENDs complete in order: never two operations
        // on A in flight, and the second SEND's answer only after the first's.
        let mut answered = 0;
        let mut released = 0;
        while answered < 2 {
            let waiting = latch.waiting();
            assert_eq!(
                waiting.len(),
                1,
                "one operation on A at a time: {waiting:?}"
            );
            latch.release(waiting[0].0);
            released += 1;
            p.poll_woken();
            let out: Vec<ShardMsg> = inbox.try_iter().collect();
            for r in replies_to(&out, 2) {
                assert_eq!(r, [BrokerMsg::Ok]);
                answered += 1;
            }
            assert!(released < 20, "A's SENDs never finished");
        }
        assert_eq!(p.jobs(), 0);

        // Stored in order: a GET gives a1, and after its ACK a2.
        latch.set_mode(LatchMode::Open);
        let get = request(&session_on(4), &a, &a, Command::Get, Some(&key));
        work(4, vec![get]);
        let got = decoded(&only_reply(inbox, 4));
        assert_eq!(msg_body(&got[0]), b"a1");
        let BrokerMsg::Msg { msg_id, .. } = &got[0] else {
            unreachable!()
        };
        let ack = request(
            &session_on(4),
            &a,
            &a,
            Command::Ack(msg_id.clone()),
            Some(&key),
        );
        work(4, vec![ack]);
        assert_eq!(decoded(&only_reply(inbox, 4)), [BrokerMsg::Ok]);
        let get = request(&session_on(4), &a, &a, Command::Get, Some(&key));
        work(4, vec![get]);
        assert_eq!(msg_body(&decoded(&only_reply(inbox, 4))[0]), b"a2");
    }

    #[test]
    fn the_periodic_expiration_on_a_waiting_store_holds_only_the_queues_of_its_jobs() {
        use crate::server::owner::owner_job;
        use crate::store::held::{LatchMode, Op};

        let (o, p, latch, inboxes) = latched_owner();
        let inbox = &inboxes[0];
        let key = SigningKey::from_bytes(&[3u8; 32]);
        // More queues holding a message than one expiration job takes.
        let n = 2 * crate::limits::EXPIRE_QUEUES_PER_JOB + 1;
        let rids: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8 + 1; 24]).collect();
        for rid in &rids {
            block_on(o.store.create(queue(rid, pk(&key)))).unwrap();
            block_on(o.store.write(rid, message(1), 100)).unwrap();
        }
        let send = |conn: u64, rid: &[u8]| {
            let cmd = Command::Send {
                flags: MsgFlags::new(false),
                body: b"later".to_vec(),
            };
            let msg = OwnerMsg::Work {
                session: session_on(conn),
                block_seq: 0,
                requests: vec![request(&session_on(conn), &[2; 24], rid, cmd, None)],
            };
            owner_job(&o, &p, msg);
        };

        // The expiration job that holds the first queue is held by the store.
        latch.set_mode(LatchMode::Only(vec![rids[0].clone()]));
        let (done_tx, done_rx) = flume::bounded(1);
        owner_job(&o, &p, OwnerMsg::ExpireNow { done: done_tx });
        let waiting = latch.waiting();
        assert_eq!(waiting.len(), 1, "one expiration job held: {waiting:?}");
        let (held_op, (_, op, held_ids)) = (waiting[0].0, &waiting[0]);
        assert_eq!(*op, Op::ExpireAll);
        assert!(
            held_ids.len() <= crate::limits::EXPIRE_QUEUES_PER_JOB,
            "a job holds {} queues",
            held_ids.len()
        );
        assert!(done_rx.try_recv().is_err(), "the expiration has not ended");

        // A SEND to a queue of another job is answered meanwhile; one to a held queue waits.
        let free = rids
            .iter()
            .find(|r| !held_ids.contains(r))
            .expect("a queue outside the held job");
        send(1, free);
        assert_eq!(decoded(&only_reply(inbox, 1)), [BrokerMsg::Ok]);
        send(2, &rids[0]);
        assert!(
            inbox.try_iter().next().is_none(),
            "a SEND to a queue of the held job waits for it"
        );

        // Released, the job ends, the waiting SEND is answered and the expiration reports done.
        latch.set_mode(LatchMode::Open);
        latch.release(held_op);
        p.poll_woken();
        assert_eq!(decoded(&only_reply(inbox, 2)), [BrokerMsg::Ok]);
        assert!(done_rx.try_recv().is_ok(), "the expiration ended");
        assert_eq!(p.jobs(), 0);
    }

    /// A connection on shard `shard`, numbered `conn`.
    fn session_at(shard: usize, conn: u64) -> Session {
        let mut s = session();
        Arc::get_mut(&mut s).unwrap().conn = ConnRef { shard, id: conn };
        s
    }

    /// Issue: cross-shard fan-outs were not bounded. The owner of shard 0 serves a flood of DELs
    /// (a DELD each) and SENDs (an NMSG each) for a subscriber whose shard 1 takes nothing from
    /// its inbox meanwhile (it is busy with its own work): shard 1's inbox never holds more than
    /// `MAX_INBOX_EVENTS` events, the rest waits at shard 0, NMSGs in the store; once shard 1
    /// takes its inbox again, the subscriber gets every DELD once and every NMSG once, in order.
    #[test]
    fn events_for_a_busy_shard_wait_at_their_sender_and_none_is_lost() {
        const QUEUES: usize = 1500;
        const SENDS: usize = 1500;
        const { assert!(QUEUES + SENDS > limits::MAX_INBOX_EVENTS + 100) };
        const { assert!(SENDS < crate::store::memory::MAX_NTFS_PER_NOTIFIER) };
        let (mesh, inboxes) = Mesh::new(2);
        let settings = Rc::new(Settings {
            quota: SENDS + 10,
            ..Settings::default()
        });
        let o = Owner::new(
            0,
            MemoryStore::new(),
            Directory::new(),
            ShardMesh::new(mesh.clone(), 0),
            settings,
        );
        let (own, busy) = (&inboxes[0], &inboxes[1]);
        let drain = |inbox: &flume::Receiver<ShardMsg>, shard: usize| -> Vec<ShardMsg> {
            let all: Vec<ShardMsg> = inbox.try_iter().collect();
            for m in &all {
                mesh.received(shard, m);
            }
            all
        };
        let rkey = SigningKey::from_bytes(&[1; 32]);
        let nkey = SigningKey::from_bytes(&[2; 32]);
        let rid_of = |i: usize| {
            let mut id = vec![0x40u8; 24];
            id[..8].copy_from_slice(&(i as u64).to_be_bytes());
            id
        };
        // The subscriber, on shard 1: every queue subscribed, and one notifier.
        let sub = session_at(1, 7);
        for (part, chunk) in (0..QUEUES).collect::<Vec<_>>().chunks(100).enumerate() {
            for &i in chunk {
                block_on(o.store.create(queue(&rid_of(i), pk(&rkey)))).unwrap();
            }
            let reqs = chunk
                .iter()
                .map(|&i| signed_sub(&sub, &rid_of(i), &rkey))
                .collect();
            block_on(o.process(sub.clone(), part as u64, reqs));
        }
        let (nrid, nid) = (vec![0x50u8; 24], vec![0x51u8; 24]);
        let mut q = queue(&nrid, pk(&rkey));
        q.sender_id = vec![0x52; 24];
        q.notifier = Some(Box::new(NotifierCreds {
            notifier_id: nid.clone(),
            notifier_key: pk(&nkey),
            rcv_ntf_dh_secret: [3; 32],
            ntf_service_id: None,
        }));
        block_on(o.store.create(q)).unwrap();
        assert!(o.directory.insert(IdSpace::Notifier, &nid, &nrid));
        let nsub = request(&sub, &nid, &nrid, Command::NSub, Some(&nkey));
        block_on(o.process(sub.clone(), 99, vec![nsub]));
        let answers = drain(busy, 1);
        assert_eq!(answers.len(), QUEUES / 100 + 1, "one Reply per part");
        assert!(answers.iter().all(|m| what(m) == "Reply"));

        // Shard 1 is busy: the owner deletes every queue and takes every SEND meanwhile.
        let other = session_at(0, 3);
        let mut peak = 0;
        for i in 0..QUEUES {
            let del = request(&other, &rid_of(i), &rid_of(i), Command::Del, Some(&rkey));
            block_on(o.process(other.clone(), i as u64, vec![del]));
            peak = peak.max(mesh.events_waiting(1));
        }
        for i in 0..SENDS {
            let send = send_req(&other, &nrid, true);
            block_on(o.process(other.clone(), (QUEUES + i) as u64, vec![send]));
            peak = peak.max(mesh.events_waiting(1));
        }
        let answered = drain(own, 0);
        assert_eq!(
            answered.len(),
            QUEUES + SENDS,
            "every DEL and SEND answered"
        );
        assert!(answered.iter().all(|m| what(m) == "Reply"));
        assert!(
            peak <= limits::MAX_INBOX_EVENTS,
            "shard 1's inbox held {peak} events"
        );
        assert_eq!(busy.len(), limits::MAX_INBOX_EVENTS, "filled to its bound");
        assert!(o.mesh.held_for(1) > 0, "the rest waits at shard 0");

        // Shard 1 takes its inbox again; the connection asks for the notifications it is told of
        // as it would (`ask_again`), and shard 0 sends what waited when told there is room.
        let mut deld = Vec::new();
        let mut nmsgs: Vec<MsgNtf> = Vec::new();
        for _round in 0..10_000 {
            let mut asks = Vec::new();
            let got = drain(busy, 1);
            for m in &got {
                match m {
                    ShardMsg::Conn(ConnMsg::Event { conn, groups })
                    | ShardMsg::Conn(ConnMsg::Redelivered { conn, groups }) => {
                        assert_eq!(*conn, sub.conn);
                        for g in groups {
                            match &g.kind {
                                GroupKind::Plain => {
                                    for t in &g.transmissions {
                                        let (entity, msg) = decode(t);
                                        assert_eq!(msg, BrokerMsg::Deld);
                                        deld.push(entity);
                                    }
                                }
                                GroupKind::Ntfs(r) => {
                                    assert_eq!(r.notifier_id, nid);
                                    assert_eq!(g.transmissions.len(), r.ntfs.len());
                                    nmsgs.extend(r.ntfs.iter().cloned());
                                }
                                GroupKind::More(p) => asks.push(p.clone()),
                                GroupKind::Msg(_) => panic!("no message was pushed"),
                            }
                        }
                    }
                    other => panic!("unexpected {}", what(other)),
                }
            }
            for m in drain(own, 0) {
                match m {
                    ShardMsg::Room { shard } => o.mesh.room(shard),
                    other => panic!("shard 0 was sent {}", what(&other)),
                }
            }
            if !asks.is_empty() {
                block_on(o.redeliver(sub.conn, asks));
            } else if got.is_empty() && busy.is_empty() && own.is_empty() {
                break;
            }
        }
        assert_eq!(o.mesh.held_for(1), 0, "nothing left waiting");
        let mut want: Vec<Vec<u8>> = (0..QUEUES).map(rid_of).collect();
        assert_eq!(deld.len(), QUEUES, "one DELD per deleted queue");
        deld.sort();
        want.sort();
        assert_eq!(deld, want, "every deleted queue's DELD, once");
        let sent: Vec<MsgId> = block_on(o.store.messages(&nrid))
            .unwrap()
            .iter()
            .map(|m| *m.msg_id())
            .collect();
        assert_eq!(sent.len(), SENDS);
        let notified: Vec<MsgId> = nmsgs.iter().map(|n| n.msg_id).collect();
        assert_eq!(notified, sent, "every SEND's NMSG, once, in order");
        assert!(!o.ntf_backlog.borrow().contains(&nid), "the backlog ended");
        assert_eq!(mesh.events_waiting(1), 0);
    }
}
