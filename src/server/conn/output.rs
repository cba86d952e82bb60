//! A connection's output as its shard holds it (`docs/ARCHITECTURE.md` §4): the channel to its
//! writer, the bytes waiting, what it dropped and holds to ask for again, and the asks.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use glommio::channels::local_channel::LocalSender;

use crate::limits::{OutputLimits, MAX_PENDING_PER_CONNECTION};
use crate::server::mesh::ShardMesh;
use crate::server::messages::OwnerMsg;
use crate::server::router::{ConnRef, Delivery, Group, GroupKind, NtfReturn, Pending};
use crate::store::EntityId;

/// What the shard keeps of a connection: where its output goes, and how much is waiting.
pub struct ConnHandle {
    pub out: Rc<LocalSender<Output>>,
    pub state: Rc<OutputState>,
    /// For the control port's `clients`: the session ID and when the session began (Unix
    /// seconds).
    pub session_id: Vec<u8>,
    pub created_at: i64,
}

/// The connection's output bound (`docs/ARCHITECTURE.md` §4): bytes queued for the socket,
/// what the connection holds to ask its owners for again, and the slow-reader clock.
pub struct OutputState {
    pub limits: OutputLimits,
    /// Bytes of every kind queued for the socket: over the high water mark MSG deliveries that are
    /// events become markers, and below the low water mark held items are asked for again.
    pub queued_bytes: Cell<usize>,
    /// Of those, the bytes of events that cannot be dropped (NMSG, END, DELD), bounded by the hard
    /// limit. Answers are not counted: the blocks in flight bound them, and a client that sends
    /// blocks and reads their answers must not lose its events for it.
    pub event_bytes: Cell<usize>,
    /// Dropped MSG deliveries and "more notifications" markers, at most one per queue and kind
    /// (`MAX_PENDING_PER_CONNECTION`). Ordered, so that what is asked first does not depend on a
    /// hasher's seed (the simulation in `server::sim` replays by seed).
    pub pending: RefCell<BTreeMap<(bool, EntityId), Pending>>,
    /// Owners asked for held items that have not answered yet: no new ask before they all have.
    pub asking: Cell<usize>,
    /// Since when the output has been over the high water mark, and how many bytes the socket had
    /// taken then (moved on whenever the reader makes progress).
    pub stall_mark: Cell<Option<(crate::clock::Stamp, u64)>>,
    /// An event was refused at the hard limit (or the owner asked for a close): the writer ends
    /// the connection (a lost event must not go unnoticed).
    pub doomed: Cell<bool>,
    /// Events that must follow every MSG held now (`ALLS` after a service's messages): written
    /// once nothing is held or asked for (`take_after_held`).
    pub after_held: RefCell<Vec<Vec<u8>>>,
    /// When a block last came in or output last went out (`[INACTIVE_CLIENTS]`).
    pub last_active: Cell<std::time::Instant>,
}

/// What `OutputState::admit` took, and the notifications it could not take (they go back to their
/// owner, to be stored).
pub struct Admitted {
    pub kept: Vec<Group>,
    pub returned: Vec<NtfReturn>,
    /// MSG deliveries dropped to markers.
    pub dropped: usize,
}

impl OutputState {
    pub fn new(limits: OutputLimits) -> Self {
        OutputState {
            limits,
            queued_bytes: Cell::new(0),
            event_bytes: Cell::new(0),
            pending: RefCell::new(BTreeMap::new()),
            asking: Cell::new(0),
            stall_mark: Cell::new(None),
            doomed: Cell::new(false),
            after_held: RefCell::new(Vec::new()),
            last_active: Cell::new(std::time::Instant::now()),
        }
    }

    /// Whether a held item is still to be asked for, or an ask still to be answered.
    pub fn holds(&self) -> bool {
        self.asking.get() > 0 || !self.pending.borrow().is_empty()
    }

    /// `t` as soon as nothing is held: now (returned), or once the last held item came back
    /// (`take_after_held`). Only one kind of event waits so (a service's `ALLS`, one per SUBS),
    /// so the list stays short.
    pub fn after_held(&self, t: Vec<u8>) -> Option<Vec<u8>> {
        if !self.holds() {
            return Some(t);
        }
        self.after_held.borrow_mut().push(t);
        None
    }

    /// The events `after_held` kept, once nothing is held any more.
    pub fn take_after_held(&self) -> Vec<Vec<u8>> {
        if self.holds() || self.after_held.borrow().is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut *self.after_held.borrow_mut())
    }

    /// Takes `groups` into the output. While over the bound, MSG deliveries that are events (pushes
    /// and redeliveries) become markers; the answers to a block are always kept, since the blocks
    /// in flight already bound them (`MAX_BLOCKS_IN_FLIGHT`), and dropping a SUB's message would
    /// only have it sealed again later.
    /// Other events (NMSG, END, DELD) are kept up to the hard limit of undroppable event bytes;
    /// one past it dooms the connection, whose writer then ends it.
    pub fn admit(&self, groups: Vec<Group>, is_event: bool) -> Admitted {
        let mut a = Admitted {
            kept: Vec::with_capacity(groups.len()),
            returned: Vec::new(),
            dropped: 0,
        };
        let limits = &self.limits;
        for g in groups {
            let over = self.queued_bytes.get() > limits.high_water_bytes;
            match g.kind {
                GroupKind::More(p) => self.hold(p),
                GroupKind::Msg(d) if over && is_event => {
                    a.dropped += 1;
                    self.hold(Pending::Msg(d));
                }
                GroupKind::Msg(_) => {
                    self.queued_bytes.set(self.queued_bytes.get() + g.bytes());
                    a.kept.push(g);
                }
                _ if is_event
                    && (self.doomed.get()
                        || self.event_bytes.get() + g.bytes() > limits.hard_limit_bytes) =>
                {
                    self.doomed.set(true);
                    if let GroupKind::Ntfs(r) = g.kind {
                        a.returned.push(r);
                    }
                }
                _ => {
                    let n = g.bytes();
                    self.queued_bytes.set(self.queued_bytes.get() + n);
                    if is_event {
                        self.event_bytes.set(self.event_bytes.get() + n);
                    }
                    a.kept.push(g);
                }
            }
        }
        a
    }

    /// Keeps `p` to ask for later; a newer item for the same queue replaces the older.
    fn hold(&self, p: Pending) {
        let mut pending = self.pending.borrow_mut();
        pending.insert(p.key(), p);
        if pending.len() > MAX_PENDING_PER_CONNECTION {
            self.doomed.set(true);
        }
    }

    /// Starts the slow-reader clock when the output goes over its bound.
    pub fn note_level(&self, written: u64) {
        if self.queued_bytes.get() > self.limits.high_water_bytes {
            if self.stall_mark.get().is_none() {
                self.stall_mark
                    .set(Some((crate::clock::Stamp::now(), written)));
            }
        } else {
            self.stall_mark.set(None);
        }
    }

    /// The dropped delivery held for queue `rid`, if any: an ACK of it deletes nothing.
    pub fn held_delivery(&self, rid: &[u8]) -> Option<Delivery> {
        match self.pending.borrow().get(&(true, rid.to_vec())) {
            Some(Pending::Msg(d)) => Some(d.clone()),
            _ => None,
        }
    }
}

/// Something for the writer: groups of transmissions, and the block whose part they answer.
pub struct Output {
    pub groups: Vec<Group>,
    pub block_seq: Option<u64>,
}

/// Asks the owners for what this connection holds (dropped MSGs, the rest of stored
/// notifications), a batch at a time, once its output is under the low water mark and every
/// earlier ask was answered. Each owner answers with `Redelivered` even when it has nothing to
/// send, and that answer asks again (`ShardContext::redelivered`), so stale items never leave live
/// ones behind them unasked. True if it asked (the caller counts `output_reasks`).
pub fn ask_again(mesh: &ShardMesh, conn: ConnRef, state: &OutputState) -> bool {
    if state.asking.get() > 0 || state.queued_bytes.get() > state.limits.low_water_bytes {
        return false;
    }
    let mut pending = state.pending.borrow_mut();
    if pending.is_empty() {
        return false;
    }
    let keys: Vec<(bool, EntityId)> = pending
        .keys()
        .take(state.limits.redeliver_batch)
        .cloned()
        .collect();
    let mut by_owner: HashMap<usize, Vec<Pending>> = HashMap::new();
    for k in keys {
        if let Some(p) = pending.remove(&k) {
            by_owner.entry(p.owner()).or_default().push(p);
        }
    }
    state.asking.set(by_owner.len());
    for (owner, items) in by_owner {
        mesh.send(owner, OwnerMsg::Redeliver { conn, items });
    }
    true
}

/// Outputs a writer takes at once from its channel to share blocks.
pub const MAX_COALESCED_OUTPUTS: usize = 64;

/// Merges consecutive plain groups into one, so that their transmissions share blocks; a MSG
/// delivery stays a group of its own (16 KB: a block anyway). Order is kept.
pub fn coalesce(groups: impl Iterator<Item = Group>) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for g in groups {
        match out.last_mut() {
            Some(last) if last.is_plain() && g.is_plain() => {
                last.transmissions.extend(g.transmissions)
            }
            _ => out.push(g),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{OUTPUT_HARD_LIMIT_BYTES, OUTPUT_HIGH_WATER_BYTES};
    use crate::store::MsgNtf;

    fn event(bytes: usize) -> Group {
        Group::plain(vec![vec![0u8; bytes]])
    }

    fn delivery(rid: u8) -> Delivery {
        Delivery {
            owner: 0,
            recipient_id: vec![rid; 24],
            msg_id: [2; 24],
            epoch: 1,
        }
    }

    fn msg_delivery(bytes: usize) -> Group {
        msg_delivery_for(1, bytes)
    }

    fn msg_delivery_for(rid: u8, bytes: usize) -> Group {
        Group {
            transmissions: vec![vec![0u8; bytes]],
            kind: GroupKind::Msg(delivery(rid)),
        }
    }

    fn ntfs(n: u8) -> Group {
        Group {
            transmissions: vec![vec![0u8; 200]],
            kind: GroupKind::Ntfs(NtfReturn {
                owner: 1,
                notifier_id: vec![n; 24],
                ntfs: vec![MsgNtf {
                    msg_id: [n; 24],
                    ts: 1,
                    nonce: [0; 24],
                    enc_meta: vec![0; 144],
                }],
            }),
        }
    }

    fn state() -> OutputState {
        OutputState::new(OutputLimits::default())
    }

    #[test]
    fn coalesce_merges_plain_neighbours_and_keeps_order() {
        let plain = |ts: &[&[u8]]| Group::plain(ts.iter().map(|t| t.to_vec()).collect());
        let groups = vec![
            plain(&[b"a", b"b"]),
            plain(&[b"c"]),
            msg_delivery(3),
            plain(&[b"d"]),
            plain(&[b"e"]),
            msg_delivery(4),
            msg_delivery(5),
        ];
        let out = coalesce(groups.into_iter());
        let shape: Vec<(usize, bool)> = out
            .iter()
            .map(|g| (g.transmissions.len(), !g.is_plain()))
            .collect();
        assert_eq!(
            shape,
            [(3, false), (1, true), (2, false), (1, true), (1, true)]
        );
        let flat: Vec<Vec<u8>> = out.into_iter().flat_map(|g| g.transmissions).collect();
        assert_eq!(flat[..3], [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(flat[4..6], [b"d".to_vec(), b"e".to_vec()]);
        assert_eq!(flat[6].len(), 4);
    }

    /// Every kind of output has a bound: MSG pushes become markers over the high water mark, other
    /// events doom the connection past the hard limit (and are not queued), answers to blocks are
    /// kept (the blocks in flight bound them).
    #[test]
    fn admit_bounds_every_kind_of_output() {
        let s = state();
        let chunk = 64 * 1024;
        let mut queued = 0;
        let mut rid = 0u8;
        while queued + chunk <= OUTPUT_HARD_LIMIT_BYTES {
            assert_eq!(s.admit(vec![event(chunk)], true).kept.len(), 1);
            queued += chunk;
            // Over the high water mark a pushed MSG is only a marker.
            if queued > OUTPUT_HIGH_WATER_BYTES {
                rid = rid.wrapping_add(1);
                let a = s.admit(vec![msg_delivery_for(rid, 16_000)], true);
                assert!(a.kept.is_empty());
                assert_eq!(a.dropped, 1);
            }
        }
        assert!(!s.doomed.get());
        assert_eq!(s.queued_bytes.get(), queued);
        let held = s.pending.borrow().len();
        assert!(held > 0);

        // The event that would cross the hard limit is refused and dooms the connection; so is
        // every later one, however small.
        assert!(s.admit(vec![event(chunk)], true).kept.is_empty());
        assert!(s.doomed.get());
        assert!(s.admit(vec![event(10)], true).kept.is_empty());
        assert_eq!(s.queued_bytes.get(), queued);

        // Answers are still kept.
        assert_eq!(s.admit(vec![event(100)], false).kept.len(), 1);
        assert_eq!(s.queued_bytes.get(), queued + 100);
        assert_eq!(s.pending.borrow().len(), held);
    }

    /// Unread answers do not count against the hard limit of undroppable events: a connection
    /// with megabytes of answers waiting still gets its DELD (issue: three unread SUB blocks and
    /// one DELD used to close it).
    #[test]
    fn unread_answers_do_not_doom_a_connection_that_gets_an_event() {
        let s = state();
        for _ in 0..7 {
            assert_eq!(s.admit(vec![event(1 << 20)], false).kept.len(), 1);
        }
        assert!(s.queued_bytes.get() > OUTPUT_HARD_LIMIT_BYTES);
        assert_eq!(s.admit(vec![event(100)], true).kept.len(), 1);
        assert!(!s.doomed.get());
        assert_eq!(s.event_bytes.get(), 100);
        // Pushed MSGs are still dropped to markers while the answers wait.
        assert_eq!(s.admit(vec![msg_delivery(16_000)], true).dropped, 1);
    }

    /// Notifications that cannot be queued (the connection is being closed) come back to be
    /// stored, never dropped.
    #[test]
    fn refused_notifications_are_returned() {
        let s = state();
        s.doomed.set(true);
        let a = s.admit(vec![ntfs(3), event(10), ntfs(4)], true);
        assert!(a.kept.is_empty());
        let ids: Vec<u8> = a.returned.iter().map(|r| r.notifier_id[0]).collect();
        assert_eq!(ids, [3, 4]);
        assert_eq!(a.returned[0].ntfs.len(), 1);
    }

    /// A held delivery is found for an ACK of its queue, and a newer one replaces it; a "more
    /// notifications" marker is held without transmissions and is no delivery.
    #[test]
    fn held_items_are_one_per_queue_and_kind() {
        let s = state();
        s.queued_bytes.set(OUTPUT_HIGH_WATER_BYTES + 1);
        let mut newer = delivery(7);
        newer.epoch = 2;
        s.admit(vec![msg_delivery_for(7, 100)], true);
        s.admit(
            vec![Group {
                transmissions: vec![vec![1; 100]],
                kind: GroupKind::Msg(newer.clone()),
            }],
            true,
        );
        let more = Pending::Ntfs {
            owner: 0,
            notifier_id: vec![7; 24],
        };
        let a = s.admit(
            vec![Group {
                transmissions: Vec::new(),
                kind: GroupKind::More(more),
            }],
            false,
        );
        assert!(a.kept.is_empty());
        assert_eq!(s.pending.borrow().len(), 2);
        assert_eq!(s.held_delivery(&[7; 24]), Some(newer));
        assert_eq!(s.held_delivery(&[8; 24]), None);
    }
}
