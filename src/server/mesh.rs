//! Every shard's inbox and the senders to it (`docs/ARCHITECTURE.md` §1, §4). Work for an owner and
//! output for a connection both travel through one inbox, so what one owner sends one connection
//! arrives in the order it was sent (O1). Sends never wait. What flows into an inbox is bounded
//! where it starts — by the blocks in flight per connection and one delivery per subscription —
//! except what no request of the receiving shard asked for (events for its connections, service
//! switches and counts): of those an inbox holds at most `MAX_INBOX_EVENTS`, and a shard that finds
//! no room holds them back in its own outbox, in order, until the receiver says it has room again
//! (`ShardMesh`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::messages::{OwnerMsg, ShardMsg};
use super::router::owner_shard;
use crate::limits::{INBOX_EVENTS_ROOM_AT, MAX_INBOX_EVENTS};

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
    pub fn fan_out<M: Into<ShardMsg>>(&self, msg: impl Fn(usize) -> M) {
        for shard in 0..self.shards() {
            self.send(shard, msg(shard));
        }
    }

    /// Never waits, whatever the inbox holds (a shard's own sends go through `ShardMesh`, which
    /// holds events back from a full inbox); a shard that has stopped drops what it is sent.
    pub fn send(&self, shard: usize, msg: impl Into<ShardMsg>) {
        let msg = msg.into();
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
    pub fn fan_out<M: Into<ShardMsg>>(&self, msg: impl Fn(usize) -> M) {
        for shard in 0..self.shards() {
            self.send(shard, msg(shard));
        }
    }

    /// Sends at once, or holds `msg` back behind what already waits for `shard`. Never waits.
    /// A shard's own inbox always takes it: what the shard sends itself comes from work it is
    /// doing, and it takes its inbox in turn.
    pub fn send(&self, shard: usize, msg: impl Into<ShardMsg>) {
        let msg = msg.into();
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
    if let ShardMsg::Owner(OwnerMsg::ServiceSwitch { key, session }) = msg {
        for m in q.iter_mut() {
            if let ShardMsg::Owner(OwnerMsg::ServiceSwitch { key: k, session: s }) = m {
                if *k == key {
                    *s = session;
                    return;
                }
            }
        }
        q.push_back(OwnerMsg::ServiceSwitch { key, session }.into());
    } else {
        q.push_back(msg);
    }
}
