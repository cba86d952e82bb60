//! The storage fault simulator (`docs/ARCHITECTURE.md` §5, "Proving durability"), in the spirit
//! of TigerBeetle's VOPR and of the file systems that lose unsynced writes used to test
//! databases' fsync handling.
//!
//! A seed drives a journal store on a simulated disk (`smp_journal::sim::SimFs`) through a random
//! sequence of every store operation — queues created, updated (keys, notifiers, status, the
//! daily touch, service associations) and deleted; messages written (the quota marker too),
//! acknowledged and expired; notifications added, taken, returned, cleared and expired — with the
//! store's sizes shrunk ([`Tuning`]) so that segments rotate, retire and compact in kilobytes, its
//! background work (compaction writes, segment removals, checkpoints, interval syncs) run at
//! points the seed picks, clean restarts, and crashes at random calls of the disk, which keep
//! exactly what was durable, or that plus any part of what was not, or torn pages. A plain model
//! keeps what the store should hold, as a list of changes per partition group, each one record.
//!
//! After every recovery, each group of the store must equal the model's state after some prefix
//! of the group's changes that holds every change the durability mode's contract calls durable
//! (`--fsync every-batch`: each answered call; `interval-ms`: what a completed sync covered;
//! `never`: what a clean stop covered). So nothing answered and durable is lost, nothing deleted
//! or acknowledged comes back (its delete is in the prefix whenever a later durable change is),
//! and no message is duplicated or reordered. Between crashes every answer of the store is
//! checked against the model too.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures_lite::future::block_on;
use smp_journal::sim::{CrashMode, Fault, SimFs};
use smp_journal::Fs;

use super::runner::Manual;
use super::{Durability, JournalStore, Runner, Tuning, FLAG_NOTIFICATION, FLAG_QUOTA};
use crate::crypto::keys::PublicAuthKey;
use crate::store::memory::MAX_NTFS_PER_NOTIFIER;
use crate::store::{
    group_of, EntityId, Keep, Message, MessageStore, MsgId, MsgNtf, NotifierCreds, QueueRec,
    QueueStatus, QueueStore, StoreError, StoreSettings, WriteOutcome,
};

/// The data directory on the simulated disk.
const DATA_DIR: &str = "/sim/data";

/// Sizes that make a few kilobytes of records rotate, retire and compact.
fn small_tuning() -> Tuning {
    Tuning {
        segment_size: 16 << 10,
        initial_segment_size: 8 << 10,
        release_reserve: 1 << 10,
        compact_min_bytes: 24 << 10,
        compact_live_share: 2,
        compact_max_live_bytes: 12 << 10,
        compact_scan_step: 8,
        compact_retry_after: 20,
        checkpoint_records: 40,
        checkpoint_bytes: 6 << 10,
        checkpoint_step: 2,
    }
}

/// A small random number generator (splitmix64): the seed decides everything.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn id(&mut self) -> [u8; 24] {
        let mut id = [0u8; 24];
        for c in id.chunks_mut(8) {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        id
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> Option<&'a T> {
        if xs.is_empty() {
            None
        } else {
            Some(&xs[self.below(xs.len() as u64) as usize])
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model

/// A message as the model keeps it: ID, time, flags (`FLAG_NOTIFICATION`, `FLAG_QUOTA`), body.
type MMsg = (MsgId, i64, u8, Vec<u8>);

#[derive(Debug, Clone, PartialEq)]
struct MQueue {
    rec: QueueRec,
    msgs: VecDeque<MMsg>,
    /// False once a quota marker was written, until the queue is empty.
    can_write: bool,
}

/// What one group holds.
#[derive(Debug, Clone, Default, PartialEq)]
struct State {
    queues: BTreeMap<EntityId, MQueue>,
    ntfs: BTreeMap<EntityId, VecDeque<MsgNtf>>,
}

/// One change of a group's state: what one record of its journal does.
#[derive(Debug, Clone)]
enum Change {
    Queue(QueueRec),
    Delete(EntityId),
    Append(EntityId, MMsg),
    DelMsg(EntityId, MsgId),
    NtfAdd(EntityId, MsgNtf),
    NtfDel(EntityId, MsgId),
    NtfClear(EntityId),
    /// A notifier's list written again whole (returned notifications ahead of the rest).
    NtfList(EntityId, Vec<MsgNtf>),
}

impl State {
    fn apply(&mut self, c: &Change) {
        match c {
            Change::Queue(rec) => match self.queues.get_mut(&rec.recipient_id) {
                Some(q) => {
                    let old = q.rec.notifier.as_ref().map(|n| n.notifier_id.clone());
                    let new = rec.notifier.as_ref().map(|n| &n.notifier_id);
                    q.rec = rec.clone();
                    // A replaced or removed notifier's notifications go with it.
                    if let Some(old) = old.filter(|o| Some(o) != new) {
                        self.ntfs.remove(&old);
                    }
                }
                None => {
                    self.queues.insert(
                        rec.recipient_id.clone(),
                        MQueue {
                            rec: rec.clone(),
                            msgs: VecDeque::new(),
                            can_write: true,
                        },
                    );
                }
            },
            Change::Delete(rid) => {
                if let Some(q) = self.queues.remove(rid) {
                    if let Some(n) = &q.rec.notifier {
                        self.ntfs.remove(&n.notifier_id);
                    }
                }
            }
            Change::Append(rid, m) => {
                if let Some(q) = self.queues.get_mut(rid) {
                    q.can_write = m.2 & FLAG_QUOTA == 0;
                    q.msgs.push_back(m.clone());
                }
            }
            Change::DelMsg(rid, id) => {
                if let Some(q) = self.queues.get_mut(rid) {
                    if let Some(i) = q.msgs.iter().position(|m| &m.0 == id) {
                        q.msgs.remove(i);
                    }
                    if q.msgs.is_empty() {
                        q.can_write = true;
                    }
                }
            }
            Change::NtfAdd(nid, n) => {
                let l = self.ntfs.entry(nid.clone()).or_default();
                if l.len() >= MAX_NTFS_PER_NOTIFIER {
                    l.pop_front();
                }
                l.push_back(n.clone());
            }
            Change::NtfDel(nid, id) => {
                if let Some(l) = self.ntfs.get_mut(nid) {
                    if let Some(i) = l.iter().position(|n| &n.msg_id == id) {
                        l.remove(i);
                    }
                    if l.is_empty() {
                        self.ntfs.remove(nid);
                    }
                }
            }
            Change::NtfClear(nid) => {
                self.ntfs.remove(nid);
            }
            Change::NtfList(nid, list) => {
                if list.is_empty() {
                    self.ntfs.remove(nid);
                } else {
                    self.ntfs
                        .insert(nid.clone(), list.iter().cloned().collect());
                }
            }
        }
    }

    fn notifier_exists(&self, nid: &[u8]) -> bool {
        self.queues.values().any(|q| {
            q.rec
                .notifier
                .as_ref()
                .is_some_and(|n| n.notifier_id == nid)
        })
    }
}

/// One group's history since the last recovery: the state then, the changes since, and how many
/// of them the durability contract calls durable.
#[derive(Default)]
struct GroupModel {
    base: State,
    changes: Vec<Change>,
    required: usize,
    /// `base` with every change applied.
    now: State,
}

impl GroupModel {
    fn push(&mut self, c: Change) {
        self.now.apply(&c);
        self.changes.push(c);
    }

    fn all_durable(&mut self) {
        self.required = self.changes.len();
    }

    /// The prefix of the changes, at least `required` long, whose state is `got`, if any.
    fn matching_prefix(&self, got: &State) -> Option<(usize, State)> {
        let mut s = self.base.clone();
        for c in &self.changes[..self.required] {
            s.apply(c);
        }
        for k in self.required..=self.changes.len() {
            if k > self.required {
                s.apply(&self.changes[k - 1]);
            }
            if &s == got {
                return Some((k, s));
            }
        }
        None
    }

    fn recovered(&mut self, state: State) {
        self.base = state.clone();
        self.now = state;
        self.changes.clear();
        self.required = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// What a run found wrong, with the steps that led to it.
#[derive(Debug)]
pub(crate) struct Failure {
    pub seed: u64,
    pub step: usize,
    pub what: String,
    pub trace: Vec<String>,
}

/// What the runs did, summed over seeds (for the test's proof that the simulator reached the
/// paths it is for).
#[derive(Debug, Default, Clone)]
pub(crate) struct Coverage {
    pub seeds: u64,
    pub ops: u64,
    pub crashes: u64,
    pub clean_restarts: u64,
    pub changes_lost_allowed: u64,
    pub segments_retired: u64,
    pub compactions: u64,
    pub checkpoints_loaded: u64,
    pub checkpoints_written: u64,
    /// Calls answered with an unknown outcome (their sync failed), and refused after a fault.
    pub uncertain: u64,
    pub refused: u64,
    pub faults: u64,
}

impl Coverage {
    fn add(&mut self, c: &Coverage) {
        self.seeds += c.seeds;
        self.ops += c.ops;
        self.crashes += c.crashes;
        self.clean_restarts += c.clean_restarts;
        self.changes_lost_allowed += c.changes_lost_allowed;
        self.segments_retired += c.segments_retired;
        self.compactions += c.compactions;
        self.checkpoints_loaded += c.checkpoints_loaded;
        self.checkpoints_written += c.checkpoints_written;
        self.uncertain += c.uncertain;
        self.refused += c.refused;
        self.faults += c.faults;
    }
}

struct Sim {
    seed: u64,
    rng: Rng,
    durability: Durability,
    groups: Vec<u32>,
    /// Recipient IDs to use, per group.
    rids: Vec<Vec<EntityId>>,
    fs: SimFs,
    manual: Manual,
    store: Option<JournalStore<SimFs>>,
    models: BTreeMap<u32, GroupModel>,
    /// Every notifier ID ever made, with its queue's group.
    nid_group: BTreeMap<EntityId, u32>,
    step: usize,
    trace: Vec<String>,
    cov: Coverage,
    /// A crash is planned and has not happened yet.
    crash_planned: bool,
    /// Faults planned so far (a call refused or of unknown outcome is expected only after one).
    faults: u64,
    /// The disk that crashed last, for the calls it saw (`SMP_RELAY_SIM_CALLS`).
    crashed_fs: Option<SimFs>,
    now_ts: i64,
}

fn settings() -> StoreSettings {
    StoreSettings {
        data_dir: PathBuf::from(DATA_DIR),
        keep: Keep::ALL,
        message_ttl_secs: i64::MAX,
        ntf_ttl_secs: i64::MAX,
        test_delay: None,
        durability: Durability::Never,
        journal_budget: None,
        journal_checkpoint_records: crate::store::journal::DEFAULT_CHECKPOINT_RECORDS,
        postgres: None,
    }
}

fn flags_of(m: &Message) -> (MsgId, i64, u8, Vec<u8>) {
    match m {
        Message::Message {
            msg_id,
            ts,
            notification,
            body,
        } => (
            *msg_id,
            *ts,
            if *notification { FLAG_NOTIFICATION } else { 0 },
            body.to_vec(),
        ),
        Message::Quota { msg_id, ts } => (*msg_id, *ts, FLAG_QUOTA, Vec::new()),
    }
}

fn to_message(m: &MMsg) -> Message {
    if m.2 & FLAG_QUOTA != 0 {
        Message::Quota {
            msg_id: m.0,
            ts: m.1,
        }
    } else {
        Message::Message {
            msg_id: m.0,
            ts: m.1,
            notification: m.2 & FLAG_NOTIFICATION != 0,
            body: Rc::from(&m.3[..]),
        }
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(seed);
        let durability = match seed % 3 {
            0 => Durability::EveryBatch,
            1 => Durability::Interval(std::time::Duration::from_millis(50)),
            _ => Durability::Never,
        };
        // One or two groups, each with a handful of recipient IDs.
        let n_groups = 1 + rng.below(2) as usize;
        let mut groups = Vec::new();
        while groups.len() < n_groups {
            let g = rng.below(u64::from(crate::store::PARTITION_GROUPS)) as u32;
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        let mut rids = vec![Vec::new(); n_groups];
        while rids.iter().any(|r: &Vec<EntityId>| r.len() < 6) {
            let id = rng.id().to_vec();
            if let Some(i) = groups.iter().position(|&g| g == group_of(&id)) {
                if rids[i].len() < 6 {
                    rids[i].push(id);
                }
            }
        }
        let fs = SimFs::new(seed);
        if std::env::var_os("SMP_RELAY_SIM_CALLS").is_some() {
            fs.log_calls();
        }
        fs.create_dir_all(Path::new(DATA_DIR))
            .expect("simulated disk");
        fs.sync_dir(Path::new("/sim")).expect("simulated disk");
        fs.sync_dir(Path::new("/")).expect("simulated disk");
        let mut models = BTreeMap::new();
        for &g in &groups {
            models.insert(g, GroupModel::default());
        }
        Sim {
            seed,
            rng,
            durability,
            groups,
            rids,
            fs,
            manual: Manual::default(),
            store: None,
            models,
            nid_group: BTreeMap::new(),
            step: 0,
            trace: Vec::new(),
            cov: Coverage::default(),
            crash_planned: false,
            faults: 0,
            crashed_fs: None,
            now_ts: 1_000_000,
        }
    }

    fn fail(&self, what: String) -> Failure {
        let mut trace = self.trace.clone();
        trace.push(self.describe_disk());
        if let Some(before) = &self.crashed_fs {
            let calls = before.calls();
            trace.push(format!(
                "the disk's last calls before the crash:\n{}",
                calls[calls.len().saturating_sub(80)..].join("\n")
            ));
        }
        Failure {
            seed: self.seed,
            step: self.step,
            what,
            trace,
        }
    }

    /// The files of the disk and, per group, its segments as the reader finds them.
    fn describe_disk(&self) -> String {
        let mut out = vec!["disk:".to_string()];
        for f in self.fs.files(Path::new("/")) {
            out.push(format!("  {}", f.display()));
        }
        let root = Path::new(DATA_DIR).join(super::JOURNAL_STORE_DIR);
        for &g in &self.groups {
            let mut recs = Vec::new();
            match smp_journal::reader::read_group_on(&self.fs, &root, g, |loc, seq, rec| {
                let id = rec.id().map(short).unwrap_or_default();
                recs.push(format!(
                    "    {}:{} #{seq} {:?} {id}",
                    loc.segment,
                    loc.offset,
                    rec.kind()
                ));
                Ok(())
            }) {
                Ok(rep) => {
                    out.push(format!("  group {g}: damage {:?}", rep.damage));
                    for sg in &rep.segments {
                        out.push(format!(
                            "   segment {} len {} first_seq {} synced {} end {} {:?} flags {}/{}",
                            sg.id,
                            sg.len,
                            sg.first_seq,
                            sg.synced_end,
                            sg.end,
                            sg.stop,
                            sg.header().flags,
                            sg.slot_flags()
                        ));
                    }
                    out.extend(recs);
                }
                Err(e) => out.push(format!("  group {g}: {e}")),
            }
        }
        out.join("\n")
    }

    fn note(&mut self, s: String) {
        self.trace
            .push(format!("{:>4} [op {:>5}] {s}", self.step, self.fs.ops()));
    }

    /// Counts what the store did before it goes.
    fn harvest(&mut self) {
        if let Some(st) = &self.store {
            let a = st.activity();
            self.cov.segments_retired += a.segments_retired;
            self.cov.compactions += a.compactions;
            self.cov.checkpoints_written += a.checkpoints_written;
            self.cov.checkpoints_loaded += a.checkpoints_loaded;
        }
    }

    fn open(&mut self) -> Result<(), Failure> {
        // A restarted relay reads its files with no fault pending.
        self.fs.clear_faults();
        self.manual = Manual::default();
        match JournalStore::open_on(
            self.fs.clone(),
            &settings(),
            &self.groups,
            0,
            self.durability,
            small_tuning(),
            Runner::Manual(self.manual.clone()),
        ) {
            Ok(st) => {
                self.store = Some(st);
                Ok(())
            }
            // The planned crash came during the open: the run recovers from it.
            Err(_) if self.crashed() => Ok(()),
            Err(e) => Err(self.fail(format!("the store does not open: {e}"))),
        }
    }

    fn store(&self) -> &JournalStore<SimFs> {
        self.store.as_ref().expect("the store is open")
    }

    /// The store's state of group `g`, as the model keeps it.
    fn store_state(&self, g: u32) -> Result<State, String> {
        let st = self.store();
        let mut out = State::default();
        let mut recs = Vec::new();
        st.for_each_queue(&mut |r| {
            if group_of(&r.recipient_id) == g {
                recs.push(r.clone());
            }
        });
        for rec in recs {
            let rid = rec.recipient_id.clone();
            let msgs: VecDeque<MMsg> = block_on(st.messages(&rid))
                .map_err(|e| format!("messages of a queue: {e}"))?
                .iter()
                .map(flags_of)
                .collect();
            let can_write = msgs.back().is_none_or(|m| m.2 & FLAG_QUOTA == 0);
            out.queues.insert(
                rid,
                MQueue {
                    rec,
                    msgs,
                    can_write,
                },
            );
        }
        for nid in st.ntf_ids() {
            if self.nid_group.get(&nid) != Some(&g) {
                continue;
            }
            let l: VecDeque<MsgNtf> = block_on(st.ntfs(&nid))
                .map_err(|e| format!("notifications: {e}"))?
                .into();
            if !l.is_empty() {
                out.ntfs.insert(nid, l);
            }
        }
        Ok(out)
    }

    /// The model's `can_write` is not visible through the store's API but through a write: the
    /// comparison reads it from the messages (a queue ending with the marker cannot be written).
    fn comparable(s: &State) -> State {
        let mut s = s.clone();
        for q in s.queues.values_mut() {
            q.can_write = q.msgs.back().is_none_or(|m| m.2 & FLAG_QUOTA == 0);
        }
        s
    }

    fn check_now(&self) -> Result<(), Failure> {
        for (&g, m) in &self.models {
            let got = self.store_state(g).map_err(|e| self.fail(e))?;
            if got != Self::comparable(&m.now) {
                return Err(self.fail(format!(
                    "group {g}: the store differs from the model\n{}",
                    diff(&Self::comparable(&m.now), &got)
                )));
            }
        }
        Ok(())
    }

    fn group_of_nid(&self, nid: &[u8]) -> Option<u32> {
        self.nid_group.get(nid).copied()
    }

    fn model(&mut self, g: u32) -> &mut GroupModel {
        self.models.get_mut(&g).expect("a simulated group")
    }

    fn existing(&self) -> Vec<EntityId> {
        self.models
            .values()
            .flat_map(|m| m.now.queues.keys().cloned())
            .collect()
    }

    fn queue(&self, rid: &[u8]) -> Option<&MQueue> {
        self.models.get(&group_of(rid))?.now.queues.get(rid)
    }

    /// After a call that returned: with every-batch syncing, its group's changes are durable.
    fn answered(&mut self, g: u32) {
        if self.durability == Durability::EveryBatch {
            self.model(g).all_durable();
        }
    }

    /// Whether an error means the planned crash happened (then the run recovers).
    fn crashed(&self) -> bool {
        self.fs.crashed()
    }

    fn unexpected<T: std::fmt::Debug>(&self, what: &str, r: T) -> Failure {
        self.fail(format!("{what}: unexpected {r:?}"))
    }

    /// The prefix of `changes` (in record order) that the store applied before it refused the
    /// rest: the one whose state every group it touches holds now.
    fn applied_prefix(&self, changes: &[(u32, Change)]) -> Result<usize, Failure> {
        let groups: BTreeSet<u32> = changes.iter().map(|c| c.0).collect();
        let mut got = BTreeMap::new();
        for &g in &groups {
            got.insert(g, self.store_state(g).map_err(|e| self.fail(e))?);
        }
        for k in (0..=changes.len()).rev() {
            let fits = groups.iter().all(|&g| {
                let mut s = self.models[&g].now.clone();
                for (cg, c) in &changes[..k] {
                    if *cg == g {
                        s.apply(c);
                    }
                }
                Self::comparable(&s) == got[&g]
            });
            if fits {
                return Ok(k);
            }
        }
        Err(self.fail(format!(
            "a refused call left a state no prefix of its changes makes: {:?}",
            changes
                .iter()
                .map(|c| change_text(&c.1))
                .collect::<Vec<_>>()
        )))
    }

    /// Takes the outcome of a store call whose changes (in record order) are `changes` and whose
    /// answer `ok` checks: answered, its changes are in the model (and durable with every-batch
    /// syncing); the disk crashed under it, or its own sync failed (`StoreError::Uncertain`),
    /// they are in the model but not required; refused after a fault of the disk, the ones it
    /// applied before the refusal are.
    fn settle<T: std::fmt::Debug>(
        &mut self,
        what: &str,
        r: Result<T, StoreError>,
        ok: impl FnOnce(&T) -> bool,
        changes: Vec<(u32, Change)>,
    ) -> Result<Option<T>, Failure> {
        let groups: BTreeSet<u32> = changes.iter().map(|c| c.0).collect();
        match r {
            Ok(v) if ok(&v) => {
                for (g, c) in changes {
                    self.model(g).push(c);
                }
                for g in groups {
                    self.answered(g);
                }
                Ok(Some(v))
            }
            Err(_) if self.crashed() => {
                for (g, c) in changes {
                    self.model(g).push(c);
                }
                Ok(None)
            }
            Err(e @ (StoreError::Uncertain(_) | StoreError::Failed(_))) if self.faults > 0 => {
                match e {
                    StoreError::Uncertain(_) => self.cov.uncertain += 1,
                    _ => self.cov.refused += 1,
                }
                // A call of several changes stops at the first that fails.
                let k = self.applied_prefix(&changes)?;
                for (g, c) in changes.into_iter().take(k) {
                    self.model(g).push(c);
                }
                Ok(None)
            }
            r => Err(self.unexpected(what, r)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Operations. Each returns Ok(()) when it ran (or the disk crashed or failed under it), Err
    // on a divergence from the model.

    fn op_create(&mut self) -> Result<(), Failure> {
        let gi = self.rng.below(self.groups.len() as u64) as usize;
        let g = self.groups[gi];
        let Some(rid) = self.rng.pick(&self.rids[gi]).cloned() else {
            return Ok(());
        };
        let mut rec = crate::store::memory::tests::rec(&rid);
        if self.rng.chance(50) {
            let nid = self.rng.id().to_vec();
            self.nid_group.insert(nid.clone(), g);
            rec.notifier = Some(Box::new(NotifierCreds {
                notifier_id: nid,
                notifier_key: PublicAuthKey::X25519([3; 32]),
                rcv_ntf_dh_secret: [4; 32],
                ntf_service_id: None,
            }));
        }
        let exists = self.queue(&rid).is_some();
        self.note(format!("create {} exists={exists}", short(&rid)));
        let r = block_on(self.store().create(rec.clone()));
        if exists {
            return match r {
                Err(StoreError::Duplicate) => Ok(()),
                r => Err(self.unexpected("create of an existing queue", r)),
            };
        }
        self.settle("create", r, |_| true, vec![(g, Change::Queue(rec))])?;
        Ok(())
    }

    /// A record change as the relay makes them: keys, status, the daily touch, a notifier added,
    /// replaced or removed (its notifications dropped with it), a service association.
    fn op_update(&mut self) -> Result<(), Failure> {
        let Some(rid) = self.rng.pick(&self.existing()).cloned() else {
            return Ok(());
        };
        let g = group_of(&rid);
        let mut rec = self.queue(&rid).expect("exists").rec.clone();
        let old_nid = rec.notifier.as_ref().map(|n| n.notifier_id.clone());
        let what = self.rng.below(6);
        match what {
            0 => rec.sender_key = Some(PublicAuthKey::Ed25519([self.rng.next() as u8; 32])),
            1 => {
                rec.status = match self.rng.below(2) {
                    0 => QueueStatus::Off,
                    _ => QueueStatus::Active,
                }
            }
            2 => rec.updated_at = Some(self.rng.below(1000) as i64 * 86_400),
            3 => {
                let nid = self.rng.id().to_vec();
                self.nid_group.insert(nid.clone(), g);
                rec.notifier = Some(Box::new(NotifierCreds {
                    notifier_id: nid,
                    notifier_key: PublicAuthKey::X25519([5; 32]),
                    rcv_ntf_dh_secret: [6; 32],
                    ntf_service_id: None,
                }));
            }
            4 => rec.notifier = None,
            _ => {
                rec.rcv_service_id = match self.rng.below(3) {
                    0 => None,
                    n => Some(vec![n as u8; 32]),
                }
            }
        }
        self.note(format!("update {} kind {what}", short(&rid)));
        let r = block_on(self.store().update(rec.clone()));
        if self
            .settle("update", r, |_| true, vec![(g, Change::Queue(rec.clone()))])?
            .is_none()
        {
            return Ok(());
        }
        // A replaced or removed notifier's notifications went with the record: the relay's
        // delete of them (NKEY, NDEL) finds nothing left.
        let new_nid = rec.notifier.as_ref().map(|n| n.notifier_id.clone());
        if let Some(old) = old_nid.filter(|o| Some(o) != new_nid.as_ref()) {
            let r = block_on(self.store().delete_ntfs(&old));
            self.settle(
                "delete_ntfs after a notifier change",
                r,
                |n| *n == 0,
                vec![],
            )?;
        }
        Ok(())
    }

    fn op_associate(&mut self) -> Result<(), Failure> {
        let all = self.existing();
        let n = 1 + self.rng.below(3) as usize;
        let mut ids: Vec<EntityId> = Vec::new();
        for _ in 0..n {
            if let Some(r) = self.rng.pick(&all) {
                if !ids.contains(r) {
                    ids.push(r.clone());
                }
            }
        }
        let service = match self.rng.below(3) {
            0 => None,
            n => Some(vec![n as u8 + 10; 32]),
        };
        let at = self.rng.below(1000) as i64 * 86_400;
        self.note(format!("associate {} queues", ids.len()));
        let r = block_on(self.store().associate_many(&ids, service.as_ref(), at));
        // Each queue's record is written (and synced) in turn.
        let mut done = Vec::new();
        for rid in &ids {
            let mut rec = self.queue(rid).expect("exists").rec.clone();
            rec.rcv_service_id = service.clone();
            rec.updated_at = Some(at);
            done.push(rec);
        }
        let changes = done
            .iter()
            .map(|rec| (group_of(&rec.recipient_id), Change::Queue(rec.clone())))
            .collect();
        self.settle("associate_many", r, |recs| recs == &done, changes)?;
        Ok(())
    }

    fn op_delete(&mut self) -> Result<(), Failure> {
        let Some(rid) = self.rng.pick(&self.existing()).cloned() else {
            return Ok(());
        };
        let g = group_of(&rid);
        self.note(format!("delete {}", short(&rid)));
        let want = self.queue(&rid).expect("exists").rec.clone();
        let r = block_on(self.store().delete(&rid));
        self.settle(
            "delete",
            r,
            |rec| rec == &want,
            vec![(g, Change::Delete(rid))],
        )?;
        Ok(())
    }

    fn op_send(&mut self) -> Result<(), Failure> {
        let Some(rid) = self.rng.pick(&self.existing()).cloned() else {
            return Ok(());
        };
        let g = group_of(&rid);
        self.now_ts += self.rng.below(3) as i64;
        let len = match self.rng.below(4) {
            0 => self.rng.below(40),
            1 | 2 => self.rng.below(1200),
            _ => 1200 + self.rng.below(3000),
        } as usize;
        let body: Vec<u8> = (0..len).map(|_| self.rng.next() as u8).collect();
        let notification = self.rng.chance(30);
        let msg = Message::Message {
            msg_id: self.rng.id(),
            ts: self.now_ts,
            notification,
            body: Rc::from(&body[..]),
        };
        let quota = 1 + self.rng.below(6) as usize;
        let q = self.queue(&rid).expect("exists");
        let was_empty = q.msgs.is_empty();
        let (expect, change) = if !(q.can_write || was_empty) {
            (WriteOutcome::Full, None)
        } else if q.msgs.len() < quota {
            let m = flags_of(&msg);
            (WriteOutcome::Written { was_empty }, Some(m))
        } else {
            let m = (*msg.msg_id(), msg.ts(), FLAG_QUOTA, Vec::new());
            (WriteOutcome::QuotaMarker { was_empty }, Some(m))
        };
        self.note(format!(
            "send {} {len} bytes quota {quota}: {expect:?}",
            short(&rid)
        ));
        let r = block_on(self.store().write(&rid, msg.clone(), quota));
        let changes = change
            .into_iter()
            .map(|m| (g, Change::Append(rid.clone(), m)))
            .collect();
        if self
            .settle("write", r, |got| *got == expect, changes)?
            .is_none()
        {
            return Ok(());
        }
        // A SEND flagged for notification stores one for the queue's notifier.
        let nid = self
            .queue(&rid)
            .and_then(|q| q.rec.notifier.as_ref().map(|n| n.notifier_id.clone()));
        if let (true, Some(nid), WriteOutcome::Written { .. }) = (notification, nid, expect) {
            self.add_ntf(nid)?;
        }
        Ok(())
    }

    fn add_ntf(&mut self, nid: EntityId) -> Result<(), Failure> {
        let Some(g) = self.group_of_nid(&nid) else {
            return Ok(());
        };
        let ntf = MsgNtf {
            msg_id: self.rng.id(),
            ts: self.now_ts,
            nonce: self.rng.id(),
            enc_meta: vec![self.rng.next() as u8; 144],
        };
        let live = self.models[&g].now.notifier_exists(&nid);
        self.note(format!("add_ntf {} live={live}", short(&nid)));
        let r = block_on(self.store().add_ntf(&nid, ntf.clone()));
        let changes = if live {
            vec![(g, Change::NtfAdd(nid, ntf))]
        } else {
            vec![]
        };
        self.settle("add_ntf", r, |_| true, changes)?;
        Ok(())
    }

    fn some_nid(&mut self) -> Option<EntityId> {
        let nids: Vec<EntityId> = self
            .models
            .values()
            .flat_map(|m| {
                m.now
                    .queues
                    .values()
                    .filter_map(|q| q.rec.notifier.as_ref().map(|n| n.notifier_id.clone()))
            })
            .collect();
        self.rng.pick(&nids).cloned()
    }

    fn op_add_ntf(&mut self) -> Result<(), Failure> {
        match self.some_nid() {
            Some(nid) => self.add_ntf(nid),
            None => Ok(()),
        }
    }

    fn op_take_ntfs(&mut self) -> Result<(), Failure> {
        let Some(nid) = self.some_nid() else {
            return Ok(());
        };
        let g = self.group_of_nid(&nid).expect("known");
        let max = 1 + self.rng.below(4) as usize;
        let list: Vec<MsgNtf> = self.models[&g]
            .now
            .ntfs
            .get(&nid)
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default();
        let taken: Vec<MsgNtf> = list.iter().take(max).cloned().collect();
        let more = list.len() > max;
        self.note(format!("take_ntfs {} max {max}", short(&nid)));
        let r = block_on(self.store().take_ntfs(&nid, max));
        let changes = taken
            .iter()
            .map(|n| (g, Change::NtfDel(nid.clone(), n.msg_id)))
            .collect();
        let got = self.settle(
            "take_ntfs",
            r,
            |(got, m)| got == &taken && *m == more,
            changes,
        )?;
        // Sometimes the connection cannot take them, and they go back.
        if let Some((got, _)) = got {
            if !got.is_empty() && self.rng.chance(30) {
                return self.return_ntfs(nid, got);
            }
        }
        Ok(())
    }

    fn return_ntfs(&mut self, nid: EntityId, back: Vec<MsgNtf>) -> Result<(), Failure> {
        let g = self.group_of_nid(&nid).expect("known");
        let mut list = back.clone();
        if let Some(kept) = self.models[&g].now.ntfs.get(&nid) {
            list.extend(kept.iter().cloned());
        }
        let skip = list.len().saturating_sub(MAX_NTFS_PER_NOTIFIER);
        let list: Vec<MsgNtf> = list.into_iter().skip(skip).collect();
        self.note(format!("return_ntfs {} {}", short(&nid), back.len()));
        let r = block_on(self.store().return_ntfs(&nid, back));
        // One change: the list as a whole, or as it was.
        self.settle(
            "return_ntfs",
            r,
            |_| true,
            vec![(g, Change::NtfList(nid, list))],
        )?;
        Ok(())
    }

    fn op_delete_ntfs(&mut self) -> Result<(), Failure> {
        let Some(nid) = self.some_nid() else {
            return Ok(());
        };
        let g = self.group_of_nid(&nid).expect("known");
        let had = self.models[&g].now.ntfs.get(&nid).map_or(0, VecDeque::len);
        self.note(format!("delete_ntfs {}", short(&nid)));
        let r = block_on(self.store().delete_ntfs(&nid));
        let changes = if had > 0 {
            vec![(g, Change::NtfClear(nid))]
        } else {
            vec![]
        };
        self.settle("delete_ntfs", r, |n| *n == had, changes)?;
        Ok(())
    }

    fn op_ack(&mut self) -> Result<(), Failure> {
        let Some(rid) = self.rng.pick(&self.existing()).cloned() else {
            return Ok(());
        };
        let g = group_of(&rid);
        let q = self.queue(&rid).expect("exists");
        let head = q.msgs.front().cloned();
        let second = q.msgs.get(1).cloned();
        // Mostly the head's ID; sometimes another (answered NO_MSG: nothing deleted).
        let id = match (&head, self.rng.chance(85)) {
            (Some(h), true) => h.0,
            _ => self.rng.id(),
        };
        let hit = head.as_ref().is_some_and(|h| h.0 == id);
        let peek = self.rng.chance(50);
        self.note(format!("ack {} hit={hit} peek={peek}", short(&rid)));
        let r = if peek {
            block_on(self.store().try_del_peek(&rid, &id))
        } else {
            block_on(self.store().try_del(&rid, &id)).map(|d| (d, None))
        };
        // What went, its body left out (the store reports it from its index).
        let want_del = if hit {
            head.as_ref().map(|h| to_message(h).without_body())
        } else {
            None
        };
        let want_next = match (peek, hit) {
            (false, _) => None,
            (true, true) => second.as_ref().map(to_message),
            (true, false) => head.as_ref().map(to_message),
        };
        let changes = if hit {
            vec![(g, Change::DelMsg(rid, id))]
        } else {
            vec![]
        };
        self.settle(
            "try_del",
            r,
            |(d, n)| *d == want_del && *n == want_next,
            changes,
        )?;
        Ok(())
    }

    fn op_expire(&mut self) -> Result<(), Failure> {
        let older = self.now_ts - self.rng.below(6) as i64;
        let all = self.rng.chance(50);
        let rids: Vec<EntityId> = if all {
            self.existing()
        } else {
            self.rng
                .pick(&self.existing())
                .cloned()
                .into_iter()
                .collect()
        };
        let mut changes: Vec<(u32, Change)> = Vec::new();
        for rid in &rids {
            for m in &self.queue(rid).expect("exists").msgs {
                if m.2 & FLAG_QUOTA != 0 || m.1 >= older {
                    break;
                }
                changes.push((group_of(rid), Change::DelMsg(rid.clone(), m.0)));
            }
        }
        self.note(format!("expire all={all} n={}", changes.len()));
        let r = if all {
            block_on(self.store().expire_all(older))
        } else {
            match rids.first() {
                Some(rid) => block_on(self.store().delete_expired(rid, older)),
                None => return Ok(()),
            }
        };
        let n = changes.len();
        self.settle("expire", r, |got| *got == n, changes)?;
        Ok(())
    }

    fn op_expire_ntfs(&mut self) -> Result<(), Failure> {
        let older = self.now_ts - self.rng.below(6) as i64;
        let mut changes: Vec<(u32, Change)> = Vec::new();
        for (&g, m) in &self.models {
            for (nid, l) in &m.now.ntfs {
                for n in l {
                    if n.ts < older {
                        changes.push((g, Change::NtfDel(nid.clone(), n.msg_id)));
                    }
                }
            }
        }
        self.note(format!("expire_ntfs n={}", changes.len()));
        let r = block_on(self.store().expire_ntfs(older));
        let n = changes.len();
        self.settle("expire_ntfs", r, |got| *got == n, changes)?;
        Ok(())
    }

    /// A call of the disk fails: an msync, fsync or directory sync with `EIO` (a failed sync:
    /// its group takes no change until the relay restarts), or a file creation or allocation
    /// with `ENOSPC` (a full disk: nothing appended).
    fn op_fault(&mut self) {
        let at = self.fs.ops() + self.rng.below(12);
        let fault = if self.rng.chance(50) {
            Fault::Io
        } else {
            Fault::NoSpace
        };
        self.note(format!("fault planned at op {at} ({fault:?})"));
        self.fs.fail_at(at, fault);
        self.faults += 1;
    }

    /// One background job (a compaction written, segments removed, a checkpoint), as a thread
    /// of the store's would run it.
    fn op_background(&mut self) -> Result<(), Failure> {
        if self.manual.waiting() > 0 {
            self.note("background job".into());
            self.manual.run_next();
        }
        Ok(())
    }

    /// The interval sync thread's turn.
    fn op_tick(&mut self) -> Result<(), Failure> {
        if let Durability::Interval(_) = self.durability {
            self.note("interval sync".into());
            self.store().syncer.tick();
            if !self.crashed() {
                // What a sync that worked covers is durable; a group whose sync failed keeps
                // nothing more than before.
                let failed: Vec<u32> = {
                    let d = self.store().data.borrow();
                    d.journals
                        .iter()
                        .filter(|(_, j)| j.sync_failed())
                        .map(|(g, _)| *g)
                        .collect()
                };
                for (g, m) in self.models.iter_mut() {
                    if !failed.contains(g) {
                        m.all_durable();
                    }
                }
            }
        }
        Ok(())
    }

    fn op_clean_restart(&mut self) -> Result<(), Failure> {
        self.note("clean restart".into());
        self.manual.run_all();
        self.harvest();
        let st = self.store.take().expect("open");
        if let Err(e) = st.close_groups() {
            if self.crashed() {
                return Ok(());
            }
            if self.faults == 0 {
                return Err(self.fail(format!("clean close: {e}")));
            }
            // A stop that could not sync everything (a failed sync): the next start reads
            // what is on the disk.
            self.note(format!("clean close failed ({e}): power loss"));
            let mode = self.crash_mode();
            self.fs.crash_at(self.fs.ops(), mode);
            let _ = self.fs.power_loss(mode);
            return Ok(());
        }
        if self.crashed() {
            return Ok(());
        }
        for m in self.models.values_mut() {
            m.all_durable();
        }
        self.cov.clean_restarts += 1;
        self.open()?;
        if self.crashed() {
            return Ok(());
        }
        self.check_now()
    }

    fn crash_mode(&mut self) -> CrashMode {
        match self.rng.below(3) {
            0 => CrashMode::Durable,
            1 => CrashMode::SomeUnsynced,
            _ => CrashMode::Torn,
        }
    }

    fn op_plan_crash(&mut self) {
        let at = self.fs.ops() + self.rng.below(40);
        let mode = self.crash_mode();
        self.note(format!("crash planned at op {at} ({mode:?})"));
        self.fs.crash_at(at, mode);
        self.crash_planned = true;
    }

    /// The disk crashed: recover from its image and compare every group with the model.
    fn recover(&mut self) -> Result<(), Failure> {
        let image = self.fs.image().expect("crashed");
        self.note("recovery".into());
        self.cov.crashes += 1;
        // What the dead store does on its way out cannot reach the image.
        self.manual = Manual::default();
        self.harvest();
        drop(self.store.take());
        let before = std::mem::replace(&mut self.fs, image);
        self.crashed_fs = Some(before);
        if std::env::var_os("SMP_RELAY_SIM_CALLS").is_some() {
            self.fs.log_calls();
        }
        self.crash_planned = false;
        self.open()?;
        for g in self.groups.clone() {
            let got = self.store_state(g).map_err(|e| self.fail(e))?;
            let got = Self::comparable(&got);
            let m = &self.models[&g];
            let comparable_base = GroupModel {
                base: Self::comparable(&m.base),
                changes: m.changes.clone(),
                required: m.required,
                now: State::default(),
            };
            match comparable_base.matching_prefix(&got) {
                Some((k, _)) => {
                    self.cov.changes_lost_allowed += (m.changes.len() - k) as u64;
                    // The recovered state as the model keeps it (`can_write` from the messages).
                    let mut s = m.base.clone();
                    for c in &m.changes[..k] {
                        s.apply(c);
                    }
                    self.model(g).recovered(s);
                }
                None => {
                    // The allowed state closest to what the store holds, for the report.
                    let mut s = m.base.clone();
                    let mut best: Option<(usize, usize, String)> = None;
                    for k in 0..=m.changes.len() {
                        if k > 0 {
                            s.apply(&m.changes[k - 1]);
                        }
                        if k < m.required {
                            continue;
                        }
                        let d = diff(&Self::comparable(&s), &got);
                        let n = d.lines().count();
                        if best.as_ref().is_none_or(|b| n < b.1) {
                            best = Some((k, n, d));
                        }
                    }
                    let (k, _, d) = best.expect("at least the durable prefix");
                    return Err(self.fail(format!(
                        "group {g}: after the crash the store holds no state the model allows \
                         ({} changes, {} durable); closest, after {k} changes:\n{d}\nthe changes: {:?}",
                        m.changes.len(),
                        m.required,
                        m.changes.iter().map(change_text).collect::<Vec<_>>()
                    )));
                }
            }
        }
        self.check_disk()
    }

    /// What `smp-journal verify` says of the recovered journals (the crate's reader and its
    /// consistency index, `smp_journal::check`): no damage, no records contradicting each other.
    fn check_disk(&self) -> Result<(), Failure> {
        let root = Path::new(DATA_DIR).join(super::JOURNAL_STORE_DIR);
        for &g in &self.groups {
            let (rep, index) = smp_journal::check::check_group_on(&self.fs, &root, g, None)
                .map_err(|e| self.fail(format!("reading group {g}: {e}")))?;
            if !rep.damage.is_empty() || index.issue_count > 0 {
                return Err(self.fail(format!(
                    "group {g}: verify finds damage after recovery: {:?} {:?}",
                    rep.damage, index.issues
                )));
            }
        }
        Ok(())
    }

    fn run(mut self, steps: usize) -> Result<Coverage, Failure> {
        self.open()?;
        while self.step < steps {
            self.step += 1;
            let r = match self.rng.below(100) {
                0..=7 => self.op_create(),
                8..=29 => self.op_send(),
                30..=44 => self.op_ack(),
                45..=51 => self.op_update(),
                52..=53 => self.op_associate(),
                54..=57 => self.op_delete(),
                58..=60 => self.op_expire(),
                61..=64 => self.op_add_ntf(),
                65..=68 => self.op_take_ntfs(),
                69 => self.op_delete_ntfs(),
                70 => self.op_expire_ntfs(),
                71..=82 => self.op_background(),
                83..=91 => self.op_tick(),
                92..=93 => self.op_clean_restart(),
                94 if self.seed % 4 == 3 => {
                    self.op_fault();
                    Ok(())
                }
                _ => {
                    if !self.crash_planned {
                        self.op_plan_crash();
                    }
                    Ok(())
                }
            };
            r?;
            self.cov.ops += 1;
            if self.crashed() {
                self.recover()?;
            } else if self.step % 16 == 0 {
                self.check_now()?;
            }
        }
        // The end: a crash now, whatever was planned.
        if !self.crashed() {
            self.note("power loss at the end".into());
            let mode = self.crash_mode();
            self.fs.crash_at(self.fs.ops(), mode);
            let _ = self.fs.power_loss(mode);
        }
        self.recover()?;
        self.cov.seeds = 1;
        self.cov.faults = self.faults;
        Ok(self.cov)
    }
}

fn change_text(c: &Change) -> String {
    match c {
        Change::Queue(r) => format!("record {}", short(&r.recipient_id)),
        Change::Delete(r) => format!("delete {}", short(r)),
        Change::Append(r, m) => format!("append {} {}", short(r), short(&m.0)),
        Change::DelMsg(r, m) => format!("del {} {}", short(r), short(m)),
        Change::NtfAdd(n, x) => format!("ntf+ {} {}", short(n), short(&x.msg_id)),
        Change::NtfDel(n, x) => format!("ntf- {} {}", short(n), short(x)),
        Change::NtfClear(n) => format!("ntf0 {}", short(n)),
        Change::NtfList(n, l) => format!("ntf= {} {}", short(n), l.len()),
    }
}

fn short(id: &[u8]) -> String {
    id.iter().take(3).map(|b| format!("{b:02x}")).collect()
}

/// What differs between two states, queue by queue, briefly.
fn diff(want: &State, got: &State) -> String {
    let mut out = Vec::new();
    let ids: BTreeSet<&EntityId> = want.queues.keys().chain(got.queues.keys()).collect();
    for id in ids {
        match (want.queues.get(id), got.queues.get(id)) {
            (Some(_), None) => out.push(format!("queue {}: missing", short(id))),
            (None, Some(_)) => out.push(format!("queue {}: should not exist", short(id))),
            (Some(a), Some(b)) => {
                if a.rec != b.rec {
                    out.push(format!("queue {}: record differs", short(id)));
                }
                let ids = |q: &MQueue| q.msgs.iter().map(|m| short(&m.0)).collect::<Vec<_>>();
                if a.msgs != b.msgs {
                    out.push(format!(
                        "queue {}: messages {:?}, the store has {:?}",
                        short(id),
                        ids(a),
                        ids(b)
                    ));
                }
            }
            (None, None) => {}
        }
    }
    let nids: BTreeSet<&EntityId> = want.ntfs.keys().chain(got.ntfs.keys()).collect();
    for n in nids {
        let c = |s: &State| s.ntfs.get(n).map_or(0, VecDeque::len);
        if want.ntfs.get(n) != got.ntfs.get(n) {
            out.push(format!(
                "notifier {}: {} notifications, the store has {}",
                short(n),
                c(want),
                c(got)
            ));
        }
    }
    out.join("\n")
}

/// Runs seed `seed` for `steps` steps.
pub(crate) fn run_seed(seed: u64, steps: usize) -> Result<Coverage, Failure> {
    Sim::new(seed).run(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps per seed: `SMP_RELAY_SIM_STEPS` (default 300).
    fn steps() -> usize {
        std::env::var("SMP_RELAY_SIM_STEPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300)
    }

    /// Seeds to run: `SMP_RELAY_SIM_SEEDS` (default 10,000), from `SMP_RELAY_SIM_FIRST` (0).
    fn seeds() -> std::ops::Range<u64> {
        let n = std::env::var("SMP_RELAY_SIM_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10_000);
        let first = std::env::var("SMP_RELAY_SIM_FIRST")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        first..first + n
    }

    #[test]
    fn the_journal_keeps_every_durable_change_through_crashes_power_losses_and_faults() {
        let seeds = seeds();
        let steps = steps();
        let threads = 2u64;
        let chunk: Vec<Vec<u64>> = (0..threads)
            .map(|t| seeds.clone().filter(|s| s % threads == t).collect())
            .collect();
        let handles: Vec<_> = chunk
            .into_iter()
            .map(|ss| {
                std::thread::spawn(move || {
                    let mut cov = Coverage::default();
                    let mut failures = Vec::new();
                    for s in ss {
                        match run_seed(s, steps) {
                            Ok(c) => cov.add(&c),
                            Err(f) => failures.push(f),
                        }
                    }
                    (cov, failures)
                })
            })
            .collect();
        let mut cov = Coverage::default();
        let mut failures = Vec::new();
        for h in handles {
            let (c, f) = h.join().expect("a simulation thread");
            cov.add(&c);
            failures.extend(f);
        }
        eprintln!("{cov:?}");
        if !failures.is_empty() {
            failures.sort_by_key(|f| f.seed);
            let first = &failures[0];
            let seeds: Vec<u64> = failures.iter().map(|f| f.seed).collect();
            panic!(
                "{} of {} seeds failed: {:?}\nfirst, seed {} at step {}: {}\n{}",
                failures.len(),
                seeds.len() as u64 + cov.seeds,
                &seeds[..seeds.len().min(50)],
                first.seed,
                first.step,
                first.what,
                first.trace[first.trace.len().saturating_sub(if failures.len() == 1 {
                    100_000
                } else {
                    60
                })..]
                    .join("\n")
            );
        }
        // The runs reached what they are for: crashes of every kind, faults, segments removed
        // and compacted, checkpoints taken and loaded, changes lost as their mode allows.
        let n = cov.seeds;
        if n >= 1000 {
            for (what, got, at_least) in [
                ("crashes", cov.crashes, n),
                ("clean restarts", cov.clean_restarts, n),
                ("segments retired", cov.segments_retired, n),
                ("compactions", cov.compactions, n / 10),
                ("checkpoints written", cov.checkpoints_written, n),
                ("checkpoints loaded", cov.checkpoints_loaded, n),
                ("changes lost as allowed", cov.changes_lost_allowed, n),
                ("faults", cov.faults, n / 10),
                ("uncertain outcomes", cov.uncertain, n / 100),
                ("refusals after a fault", cov.refused, n / 10),
            ] {
                assert!(got >= at_least, "{what}: {got} in {n} seeds");
            }
        }
    }

    /// A failed msync: with every-batch syncing the change whose own sync failed has an unknown
    /// outcome (`StoreError::Uncertain`, never answered), and the group refuses every later
    /// change before applying anything; with interval syncing the group refuses too once the
    /// sync thread saw the failure. Other groups go on. After a restart the store holds what the
    /// disk holds, and the group takes changes again.
    #[test]
    fn a_failed_sync_leaves_its_change_uncertain_and_its_group_refusing_changes() {
        for durability in [
            Durability::EveryBatch,
            Durability::Interval(std::time::Duration::from_millis(50)),
        ] {
            let fs = SimFs::new(7);
            fs.create_dir_all(Path::new(DATA_DIR)).unwrap();
            fs.sync_dir(Path::new("/sim")).unwrap();
            fs.sync_dir(Path::new("/")).unwrap();
            let manual = Manual::default();
            let open = |fs: &SimFs, manual: &Manual| {
                JournalStore::open_on(
                    fs.clone(),
                    &settings(),
                    &[3, 9],
                    0,
                    durability,
                    small_tuning(),
                    Runner::Manual(manual.clone()),
                )
                .unwrap()
            };
            let st = open(&fs, &manual);
            let mut rng = Rng(1);
            let mut rid_in = |g: u32| loop {
                let id = rng.id().to_vec();
                if group_of(&id) == g {
                    return id;
                }
            };
            let (a, b) = (rid_in(3), rid_in(9));
            let msg = |n: u8| Message::Message {
                msg_id: [n; 24],
                ts: 1,
                notification: false,
                body: Rc::from(&[n; 100][..]),
            };
            block_on(st.create(crate::store::memory::tests::rec(&a))).unwrap();
            block_on(st.create(crate::store::memory::tests::rec(&b))).unwrap();
            st.syncer.tick();
            // The next call of the disk (the msync of the record that follows) fails.
            fs.fail_at(fs.ops(), Fault::Io);
            let r = block_on(st.write(&a, msg(1), 10));
            match durability {
                Durability::EveryBatch => {
                    assert!(matches!(r, Err(StoreError::Uncertain(_))), "{r:?}");
                }
                _ => {
                    assert_eq!(r, Ok(WriteOutcome::Written { was_empty: true }));
                    st.syncer.tick();
                }
            }
            assert_eq!(st.size(&a), 1, "the change was made");
            let refused = block_on(st.write(&a, msg(2), 10));
            assert_eq!(
                refused,
                Err(StoreError::Failed(super::super::SYNC_FAILED.into()))
            );
            assert_eq!(st.size(&a), 1, "a refused change is not applied");
            assert!(
                block_on(st.try_del(&a, &[1; 24])).is_err(),
                "deletes are refused too"
            );
            assert_eq!(st.size(&a), 1);
            assert_eq!(
                block_on(st.write(&b, msg(3), 10)),
                Ok(WriteOutcome::Written { was_empty: true }),
                "the other group goes on"
            );
            assert_eq!(st.counters().store_sync_failures, 1);
            assert_eq!(st.counters().store_sync_refused, 2);
            // A restart reads what the disk has: the queues, and the message or not.
            let image = fs.power_loss(CrashMode::SomeUnsynced);
            manual.run_all();
            drop(st);
            let st = open(&image, &Manual::default());
            assert!(st.contains(&a) && st.contains(&b));
            assert!(st.size(&a) <= 1);
            assert!(
                block_on(st.write(&a, msg(4), 10)).is_ok(),
                "the group takes changes again"
            );
        }
    }
}
