//! The services' state on one owner (`docs/ARCHITECTURE.md` §5, "Services"): the index of its
//! queues' associations per service and role with their ID hashes, the connection subscribed to
//! each service, and on a service's home shard that connection's count and hash. What the owner
//! does with it is `commands/service.rs`.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::protocol::command::ServiceRole;
use crate::protocol::ids_hash::{id_hash, xor_into};
use crate::server::router::{ConnRef, CountHash, ServiceKey, Session};
use crate::store::{EntityId, QueueRec, RecordIds};

/// Whether two sessions are connections of one service.
pub fn same_service(a: &Session, b: &Session) -> bool {
    match (&a.service, &b.service) {
        (Some(x), Some(y)) => x.service_id == y.service_id,
        _ => false,
    }
}

/// One owner's queues of one service and role.
#[derive(Default)]
struct Assoc {
    /// Recipient IDs (the owner's key), for either role.
    queues: HashSet<EntityId>,
    hash: [u8; 16],
}

/// The services' state on one owner.
#[derive(Default)]
pub struct ServiceState {
    index: RefCell<HashMap<ServiceKey, Assoc>>,
    /// The connection subscribed to each service (`SUBS`/`NSUBS`) on this owner.
    pub(crate) subscribers: RefCell<HashMap<ServiceKey, Session>>,
    /// On the service's home shard: its subscribed connection, with the count and hash it was
    /// answered, which `ENDS` reports to it when another connection takes over.
    pub(crate) home: RefCell<HashMap<ServiceKey, (Session, CountHash)>>,
}

/// A queue's associations: (service, role) and the hash of the ID that counts for it (the
/// recipient ID for M, the notifier ID for N). Empty, and allocation-free, for most queues.
pub type Associations = Vec<(ServiceKey, [u8; 16])>;

/// The associations of a queue record.
pub fn associations_of(q: &QueueRec) -> Associations {
    associations_of_ids(&RecordIds::of(q))
}

/// As `associations_of`, from a queue's IDs.
pub fn associations_of_ids(q: &RecordIds<'_>) -> Associations {
    let rcv = q.rcv_service_id.map(|s| {
        (
            (s.to_vec(), ServiceRole::Messaging),
            id_hash(q.recipient_id),
        )
    });
    let ntf = q.notifier_id.and_then(|nid| {
        q.ntf_service_id
            .map(|s| ((s.to_vec(), ServiceRole::Notifier), id_hash(nid)))
    });
    rcv.into_iter().chain(ntf).collect()
}

impl ServiceState {
    /// Adds a record's associations (the index built at start).
    pub fn index(&self, q: &QueueRec) {
        self.index_ids(&RecordIds::of(q));
    }

    /// As `index`, from a queue's IDs.
    pub fn index_ids(&self, q: &RecordIds<'_>) {
        let list = associations_of_ids(q);
        if !list.is_empty() {
            self.apply(q.recipient_id, &list, true);
        }
    }

    /// Adds (`add`) or removes the associations `list` of the queue `rid`.
    fn apply(&self, rid: &[u8], list: &Associations, add: bool) {
        let mut index = self.index.borrow_mut();
        for (key, hash) in list {
            let a = index.entry(key.clone()).or_default();
            let changed = if add {
                a.queues.insert(rid.to_vec())
            } else {
                a.queues.remove(rid)
            };
            if changed {
                xor_into(&mut a.hash, hash);
            }
            if a.queues.is_empty() {
                index.remove(key);
            }
        }
    }

    /// Follows a change of queue `rid`'s record from associations `before` (empty for a new
    /// queue) to `after` (empty: deleted). Returns the associations that went.
    pub fn changed(&self, rid: &[u8], before: Associations, after: Associations) -> Associations {
        if before == after {
            return Vec::new();
        }
        self.apply(rid, &before, false);
        self.apply(rid, &after, true);
        before.into_iter().filter(|b| !after.contains(b)).collect()
    }

    /// This owner's count and hash of the service's queues.
    pub fn count(&self, key: &ServiceKey) -> CountHash {
        self.index
            .borrow()
            .get(key)
            .map_or((0, [0; 16]), |a| (a.queues.len() as i64, a.hash))
    }

    /// Whether the queue `rid` is associated with the service and role `key` (from the index,
    /// without the queue's record).
    pub fn holds(&self, key: &ServiceKey, rid: &[u8]) -> bool {
        self.index
            .borrow()
            .get(key)
            .is_some_and(|a| a.queues.contains(rid))
    }

    /// This owner's queues of the service.
    pub fn queues(&self, key: &ServiceKey) -> Vec<EntityId> {
        self.index
            .borrow()
            .get(key)
            .map(|a| a.queues.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The connection subscribed to `service` in `role`, if any.
    pub fn subscriber(&self, service: &[u8], role: ServiceRole) -> Option<Session> {
        self.subscribers
            .borrow()
            .get(&(service.to_vec(), role))
            .cloned()
    }

    /// A closed connection is no service's subscriber any more.
    pub fn connection_closed(&self, conn: ConnRef) {
        self.subscribers.borrow_mut().retain(|_, s| s.conn != conn);
        self.home.borrow_mut().retain(|_, (s, _)| s.conn != conn);
    }

    /// Services whose subscriber on this owner is `conn`.
    pub fn subscribed_by(&self, conn: ConnRef) -> usize {
        let subscribers = self.subscribers.borrow();
        subscribers.values().filter(|s| s.conn == conn).count()
    }

    /// Queues of this owner associated with a service of `role` (the reference's
    /// `rcvServiceQueuesCount`, `ntfServiceQueuesCount`).
    pub fn associated_queues(&self, role: ServiceRole) -> u64 {
        let index = self.index.borrow();
        let mine = index.iter().filter(|((_, r), _)| *r == role);
        mine.map(|(_, a)| a.queues.len() as u64).sum()
    }

    /// Per role: the services whose home is this shard that have a subscribed connection, and
    /// the subscriptions those connections hold (the reference's `totalServiceSubs`).
    pub fn totals(&self, role: ServiceRole) -> (u64, u64) {
        let home = self.home.borrow();
        let mine = home.iter().filter(|((_, r), _)| *r == role);
        let (mut services, mut subs) = (0, 0);
        for (_, (_, (n, _))) in mine {
            services += 1;
            subs += (*n).max(0) as u64;
        }
        (services, subs)
    }

    /// The count and hash of the service's current connection, if it is `conn` (home shard).
    pub fn current(&self, key: &ServiceKey, conn: ConnRef) -> CountHash {
        match self.home.borrow().get(key) {
            Some((s, ch)) if s.conn == conn => *ch,
            _ => (0, [0; 16]),
        }
    }
}

/// The queues of a service one owner job folds after `SUBS`, as a SUB batch is
/// (`limits::MAX_SUBS_PER_BLOCK`-sized: one head read per chunk).
pub const SERVICE_FOLD_CHUNK: usize = 135;

/// Counts the chunk jobs of one fold: the last to end tells the connection's shard.
pub struct FoldDone {
    left: Cell<usize>,
    notify: RefCell<Option<Box<dyn FnOnce()>>>,
}

impl FoldDone {
    pub fn new(jobs: usize, notify: impl FnOnce() + 'static) -> Rc<Self> {
        let done = Rc::new(FoldDone {
            left: Cell::new(jobs),
            notify: RefCell::new(Some(Box::new(notify))),
        });
        if jobs == 0 {
            done.finish();
        }
        done
    }

    /// One job ended.
    pub fn one(&self) {
        crate::server::count::take(&self.left, 1, "jobs left");
        if self.left.get() == 0 {
            self.finish();
        }
    }

    fn finish(&self) {
        if let Some(f) = self.notify.borrow_mut().take() {
            f();
        }
    }
}

/// One chunk job of a fold: its end (or its drop, should the pipeline drop it) counts.
pub struct FoldJob(pub Rc<FoldDone>);

impl Drop for FoldJob {
    fn drop(&mut self) {
        self.0.one();
    }
}
