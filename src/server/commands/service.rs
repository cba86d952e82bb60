//! Services on the owner (`docs/ARCHITECTURE.md` §5, "Services"; simplexmq `Server.hs`,
//! `sharedSubscribeService`, `deliverServiceMessages`, and `serverThread` for service clients).
//!
//! Each owner keeps, per service and role, the queues of its partitions associated with it and
//! their ID hash (XOR of MD5 of the recipient IDs for role M, of the notifier IDs for role N,
//! simplexmq `Protocol.hs`, `IdsHash`). The index is built from the queue records at start and
//! follows every record change the owner makes, so it never depends on how the associations were
//! logged (simplexmq issue #1618). `SUBS`/`NSUBS` ask every owner for its part of the count and
//! hash, then make the connection each owner's subscriber of the service: a queue of the service
//! without a subscriber of its own is delivered to that connection, which gets a per-queue
//! subscription when a message is handed to it (freed with the connection, simplexmq #1820).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use md5::{Digest, Md5};

use super::deliver::msg_transmission;
use crate::protocol::command::ServiceRole;
use crate::protocol::response::BrokerMsg;
use crate::server::owner::{Owner, Subscriber};
use crate::server::router::{encode, ConnRef, Session};
use crate::store::{EntityId, MessageStore, QueueRec, QueueStore};

/// A service and the role it subscribes in.
pub type ServiceKey = (EntityId, ServiceRole);

/// A count of queues and their ID hash.
pub type CountHash = (i64, [u8; 16]);

/// The ID hash of one queue: MD5 of its ID.
pub fn id_hash(id: &[u8]) -> [u8; 16] {
    Md5::digest(id).into()
}

/// `a ⊕= b`.
pub fn xor_into(a: &mut [u8; 16], b: &[u8; 16]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
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
    subscribers: RefCell<HashMap<ServiceKey, Session>>,
    /// On the service's home shard: its subscribed connection, with the count and hash it was
    /// answered, which `ENDS` reports to it when another connection takes over.
    home: RefCell<HashMap<ServiceKey, (Session, CountHash)>>,
}

/// The associations of a queue record: (service, role) and the ID its hash is of.
fn associations(q: &QueueRec) -> impl Iterator<Item = (ServiceKey, &[u8])> {
    let rcv = q
        .rcv_service_id
        .as_ref()
        .map(|s| ((s.clone(), ServiceRole::Messaging), &q.recipient_id[..]));
    let ntf = q.notifier.as_ref().and_then(|n| {
        n.ntf_service_id
            .as_ref()
            .map(|s| ((s.clone(), ServiceRole::Notifier), &n.notifier_id[..]))
    });
    rcv.into_iter().chain(ntf)
}

impl ServiceState {
    /// Adds (`add`) or removes a record's associations.
    pub fn index(&self, q: &QueueRec, add: bool) {
        let mut index = self.index.borrow_mut();
        for (key, id) in associations(q) {
            let a = index.entry(key.clone()).or_default();
            let changed = if add {
                a.queues.insert(q.recipient_id.clone())
            } else {
                a.queues.remove(&q.recipient_id)
            };
            if changed {
                xor_into(&mut a.hash, &id_hash(id));
            }
            if a.queues.is_empty() {
                index.remove(&key);
            }
        }
    }

    /// Follows a record change: `old` (none for a new queue) became `new` (none: deleted).
    pub fn changed(&self, old: Option<&QueueRec>, new: Option<&QueueRec>) {
        let same = |a: &QueueRec, b: &QueueRec| {
            associations(a).collect::<Vec<_>>() == associations(b).collect::<Vec<_>>()
        };
        if let (Some(o), Some(n)) = (old, new) {
            if same(o, n) {
                return;
            }
        }
        if let Some(o) = old {
            self.index(o, false);
        }
        if let Some(n) = new {
            self.index(n, true);
        }
    }

    /// This owner's count and hash of the service's queues.
    pub fn count(&self, key: &ServiceKey) -> CountHash {
        self.index
            .borrow()
            .get(key)
            .map_or((0, [0; 16]), |a| (a.queues.len() as i64, a.hash))
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

    /// How many services have a subscribed connection here, and how many queues the home shard's
    /// records say they were answered (the metrics' totals).
    pub fn totals(&self) -> (usize, i64) {
        let home = self.home.borrow();
        (home.len(), home.values().map(|(_, (n, _))| *n).sum())
    }
}

/// The queues of a service one owner job folds after `SUBS`, as a SUB batch is
/// (`limits::MAX_SUBS_PER_BLOCK`-sized: one head read per chunk).
pub const SERVICE_FOLD_CHUNK: usize = 135;

impl<S: QueueStore + MessageStore> Owner<S> {
    /// `SUBS`/`NSUBS`, second step on this owner: `session` becomes the service's subscriber
    /// here. On the service's home shard the previous connection, if another, gets `ENDS` with
    /// what it was answered. Returns the queues to fold (role M) and the connection that was the
    /// subscriber before.
    pub fn take_service(
        &self,
        key: &ServiceKey,
        session: &Session,
        answered: CountHash,
        home: bool,
    ) -> (Vec<EntityId>, Option<ConnRef>) {
        let prev = self
            .services
            .subscribers
            .borrow_mut()
            .insert(key.clone(), session.clone())
            .map(|s| s.conn)
            .filter(|c| *c != session.conn);
        if home {
            let before = self
                .services
                .home
                .borrow_mut()
                .insert(key.clone(), (session.clone(), answered));
            if let Some((s, (n, h))) = before.filter(|(s, _)| s.conn != session.conn) {
                let ends = encode(
                    &s,
                    b"",
                    &key.0,
                    &BrokerMsg::Ends {
                        count: n,
                        ids_hash: h,
                    },
                );
                self.send_event(s.conn, vec![vec![ends]]);
            }
        }
        let queues = match key.1 {
            ServiceRole::Messaging => self.services.queues(key),
            _ => Vec::new(),
        };
        (queues, prev)
    }

    /// Folds one chunk of a messaging service's queues after `SUBS` (simplexmq `Server.hs`,
    /// `deliverServiceMessages`): the previous subscriber connection's subscriptions of them end
    /// (it was sent `ENDS`), and each queue with a message and no subscription on `session` gets
    /// one, with its head as a MSG. Runs as a job holding the chunk's queues.
    pub async fn fold_service_chunk(
        &self,
        key: &ServiceKey,
        session: &Session,
        prev: Option<ConnRef>,
        chunk: Vec<EntityId>,
    ) {
        let mut todo = Vec::with_capacity(chunk.len());
        for rid in chunk {
            // Still associated (a job before this one may have moved it) and still subscribed
            // to by `session` on this owner (it may have closed, or another taken over).
            let ours = self
                .store
                .with_queue(&rid, |q| q.rcv_service_id.as_ref() == Some(&key.0))
                .unwrap_or(false);
            let current = self.services.subscriber(&key.0, key.1);
            if !ours || current.as_ref().map(|s| s.conn) != Some(session.conn) {
                continue;
            }
            let holder = self.subs.borrow().get(&rid).map(|s| s.session.conn);
            match holder {
                Some(c) if c == session.conn => {
                    self.stats.borrow_mut().service_sub_duplicates += 1;
                }
                Some(c) if Some(c) == prev => {
                    self.subs.borrow_mut().remove(&rid);
                    if let Some(e) = self.by_conn.borrow_mut().get_mut(&c) {
                        e.subs.remove(&rid);
                    }
                    todo.push(rid);
                }
                // An ordinary connection's subscription (it would have dissociated the queue,
                // unless a service's connection: that one keeps it).
                Some(_) => {}
                None => todo.push(rid),
            }
        }
        if todo.is_empty() {
            return;
        }
        let ids: Vec<&[u8]> = todo.iter().map(Vec::as_slice).collect();
        let heads = match self.store.peek_first_many(&ids).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("service delivery: {e}");
                return;
            }
        };
        for (rid, head) in todo.iter().zip(heads) {
            let Some(m) = head else { continue };
            // After the await: the connection may have gone, or another taken the queue.
            let current = self.services.subscriber(&key.0, key.1);
            if current.as_ref().map(|s| s.conn) != Some(session.conn)
                || self.subs.borrow().contains_key(rid)
            {
                continue;
            }
            let Some(secret) = self.store.with_queue(rid, |q| q.rcv_dh_secret) else {
                continue;
            };
            let epoch = self.new_epoch();
            self.subs.borrow_mut().insert(
                rid.clone(),
                Subscriber {
                    session: session.clone(),
                    delivered: Some(*m.msg_id()),
                    epoch,
                },
            );
            self.entries(session.conn, |e| e.subs.insert(rid.clone()));
            self.stats.borrow_mut().service_sub_msgs += 1;
            let t = msg_transmission(session, b"", rid, &secret, &m);
            let delivery = self.delivery(rid, m.msg_id());
            self.send_delivery(session.conn, t, delivery);
        }
    }

    /// A queue of a subscribed messaging service that has no subscriber gets one on the service's
    /// connection when a message is to be handed over (simplexmq `Server.hs`,
    /// `newServiceDeliverySub`). True if there is one now.
    pub fn service_delivery_sub(&self, rid: &[u8]) -> bool {
        if self.subs.borrow().contains_key(rid) {
            return true;
        }
        let Some(service) = self
            .store
            .with_queue(rid, |q| q.rcv_service_id.clone())
            .flatten()
        else {
            return false;
        };
        let Some(session) = self.services.subscriber(&service, ServiceRole::Messaging) else {
            return false;
        };
        let epoch = self.new_epoch();
        self.subs.borrow_mut().insert(
            rid.to_vec(),
            Subscriber {
                session: session.clone(),
                delivered: None,
                epoch,
            },
        );
        self.entries(session.conn, |e| e.subs.insert(rid.to_vec()));
        true
    }

    /// As `service_delivery_sub`, for a notifier of a subscribed notification service.
    pub fn service_ntf_sub(&self, nid: &[u8], service: Option<&EntityId>) -> Option<Session> {
        if let Some(s) = self.ntf_subs.borrow().get(nid) {
            return Some(s.clone());
        }
        let session = self.services.subscriber(service?, ServiceRole::Notifier)?;
        self.ntf_subs
            .borrow_mut()
            .insert(nid.to_vec(), session.clone());
        self.entries(session.conn, |e| e.ntf_subs.insert(nid.to_vec()));
        Some(session)
    }
}

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
        let left = self.left.get().saturating_sub(1);
        self.left.set(left);
        if left == 0 {
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
