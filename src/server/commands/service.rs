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
use crate::server::router::{encode, ConnRef, Session, ShardMsg};
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
    /// Returns the associations that went, with the hash of each queue's ID.
    pub fn changed(
        &self,
        old: Option<&QueueRec>,
        new: Option<&QueueRec>,
    ) -> Vec<(ServiceKey, [u8; 16])> {
        let of = |q: Option<&QueueRec>| -> Vec<(ServiceKey, [u8; 16])> {
            q.map(|q| associations(q).map(|(k, id)| (k, id_hash(id))).collect())
                .unwrap_or_default()
        };
        let (before, after) = (of(old), of(new));
        if before == after {
            return Vec::new();
        }
        if let Some(o) = old {
            self.index(o, false);
        }
        if let Some(n) = new {
            self.index(n, true);
        }
        before.into_iter().filter(|b| !after.contains(b)).collect()
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

impl<S: QueueStore + MessageStore> Owner<S> {
    /// Tells the service's home shard that `session` subscribed one of its queues (a service's
    /// SUB, NSUB or subscribed NEW), `newly` if the queue was not associated with it before.
    pub fn tell_home_subscribed(
        &self,
        session: &Session,
        role: ServiceRole,
        id: &[u8],
        newly: bool,
    ) {
        let Some(s) = &session.service else {
            return;
        };
        let key = (s.service_id.clone(), role);
        self.mesh.send(
            self.mesh.owner_of(&key.0),
            ShardMsg::ServiceSubscribed {
                key,
                session: session.clone(),
                hash: id_hash(id),
                newly,
            },
        );
    }

    /// Tells the home shards of services with a subscribed connection which of their queues went.
    pub fn tell_home_dropped(&self, gone: Vec<(ServiceKey, [u8; 16])>) {
        for (key, hash) in gone {
            if self.services.subscriber(&key.0, key.1).is_some() {
                let home = self.mesh.owner_of(&key.0);
                self.mesh.send(home, ShardMsg::ServiceDropped { key, hash });
            }
        }
    }

    /// On the home shard: `session` subscribed one of the service's queues. The connection's count
    /// grows by it if the queue is new to the service (or the count is 0, simplexmq `Server.hs`,
    /// `sharedSubscribeQueue`); a connection that was not the service's subscriber becomes it:
    /// the previous one gets `ENDS` with its count, and every owner switches to the new one.
    pub fn service_subscribed(
        &self,
        key: ServiceKey,
        session: Session,
        hash: [u8; 16],
        newly: bool,
    ) {
        if !self.is_live(&session) {
            return;
        }
        let mut home = self.services.home.borrow_mut();
        if let Some((s, (n, h))) = home.get_mut(&key) {
            if s.conn == session.conn {
                if newly || *n == 0 {
                    *n += 1;
                    xor_into(h, &hash);
                }
                return;
            }
        }
        let before = home.insert(key.clone(), (session.clone(), (1, hash)));
        drop(home);
        if let Some((s, (n, h))) = before {
            self.send_ends(&key, &s, (n, h));
        }
        self.mesh.fan_out(|_| ShardMsg::ServiceSwitch {
            key: key.clone(),
            session: session.clone(),
        });
    }

    /// On the home shard: a queue of the service went (deleted, dissociated, its notifier
    /// removed); the subscribed connection's count loses it (simplexmq `Protocol.hs`,
    /// `subtractServiceSubs`).
    pub fn service_dropped(&self, key: &ServiceKey, hash: [u8; 16]) {
        if let Some((_, (n, h))) = self.services.home.borrow_mut().get_mut(key) {
            if *n > 1 {
                *n -= 1;
                xor_into(h, &hash);
            } else {
                *n = 0;
                *h = [0; 16];
            }
        }
    }

    /// On every owner: `session` is now the service's subscriber. The previous connection's
    /// subscriptions of the service's queues here end with it (it was sent `ENDS`).
    pub fn service_switch(&self, key: &ServiceKey, session: &Session) {
        if !self.is_live(session) {
            return;
        }
        let prev = self
            .services
            .subscribers
            .borrow_mut()
            .insert(key.clone(), session.clone())
            .map(|s| s.conn)
            .filter(|c| *c != session.conn);
        if let Some(prev) = prev {
            self.release(key, prev);
        }
    }

    /// The subscriptions `prev` holds here of the service's queues (or notifiers) end: another
    /// connection of the service took it over.
    fn release(&self, key: &ServiceKey, prev: ConnRef) {
        match key.1 {
            ServiceRole::Messaging => {
                let held: Vec<EntityId> = self
                    .by_conn
                    .borrow()
                    .get(&prev)
                    .map(|e| e.subs.iter().cloned().collect())
                    .unwrap_or_default();
                for rid in held {
                    let ours = self
                        .store
                        .with_queue(&rid, |q| q.rcv_service_id.as_ref() == Some(&key.0))
                        .unwrap_or(false);
                    if ours {
                        self.subs.borrow_mut().remove(&rid);
                        if let Some(e) = self.by_conn.borrow_mut().get_mut(&prev) {
                            e.subs.remove(&rid);
                        }
                    }
                }
            }
            ServiceRole::Notifier => {
                let held: Vec<EntityId> = self
                    .by_conn
                    .borrow()
                    .get(&prev)
                    .map(|e| e.ntf_subs.iter().cloned().collect())
                    .unwrap_or_default();
                for nid in held {
                    let ours = self.notifier_queue(&nid).is_some_and(|rid| {
                        self.store
                            .with_queue(&rid, |q| {
                                q.notifier
                                    .as_ref()
                                    .is_some_and(|n| n.ntf_service_id.as_ref() == Some(&key.0))
                            })
                            .unwrap_or(false)
                    });
                    if ours {
                        self.ntf_subs.borrow_mut().remove(&nid);
                        self.ntf_backlog.borrow_mut().remove(&nid);
                        if let Some(e) = self.by_conn.borrow_mut().get_mut(&prev) {
                            e.ntf_subs.remove(&nid);
                        }
                    }
                }
            }
            ServiceRole::Proxy => {}
        }
    }

    /// Whether `session`'s connection is still open (`Directory::is_live_service`).
    fn is_live(&self, session: &Session) -> bool {
        self.directory
            .is_live_service(session.conn.shard, session.conn.id)
    }

    fn send_ends(&self, key: &ServiceKey, to: &Session, (count, ids_hash): CountHash) {
        let ends = encode(to, b"", &key.0, &BrokerMsg::Ends { count, ids_hash });
        self.send_event(to.conn, vec![vec![ends]]);
    }

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
        if !self.is_live(session) {
            return (Vec::new(), None);
        }
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
            if let Some((s, ch)) = before.filter(|(s, _)| s.conn != session.conn) {
                self.send_ends(key, &s, ch);
            }
        }
        let queues = match key.1 {
            ServiceRole::Messaging => self.services.queues(key),
            ServiceRole::Notifier => {
                if let Some(prev) = prev {
                    self.release(key, prev);
                }
                // Only notifiers with stored notifications have something to hand over.
                let waiting: std::collections::HashSet<EntityId> =
                    self.store.ntf_ids().into_iter().collect();
                self.services
                    .queues(key)
                    .into_iter()
                    .filter(|rid| {
                        self.store
                            .with_queue(rid, |q| {
                                q.notifier
                                    .as_ref()
                                    .is_some_and(|n| waiting.contains(&n.notifier_id))
                            })
                            .unwrap_or(false)
                    })
                    .collect()
            }
            ServiceRole::Proxy => Vec::new(),
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

    /// As `fold_service_chunk`, for a notification service after `NSUBS`: each notifier of the
    /// chunk without a subscriber of its own gets the service's connection, and its stored
    /// notifications, a part at a time as an NSUB's (the rest when the connection has room).
    pub async fn fold_ntf_chunk(&self, key: &ServiceKey, session: &Session, chunk: Vec<EntityId>) {
        for rid in chunk {
            let nid = self
                .store
                .with_queue(&rid, |q| {
                    q.notifier
                        .as_ref()
                        .filter(|n| n.ntf_service_id.as_ref() == Some(&key.0))
                        .map(|n| n.notifier_id.clone())
                })
                .flatten();
            let current = self.services.subscriber(&key.0, key.1);
            let Some(nid) = nid else { continue };
            if current.as_ref().map(|s| s.conn) != Some(session.conn)
                || self.ntf_subs.borrow().contains_key(&nid)
            {
                continue;
            }
            self.ntf_subs
                .borrow_mut()
                .insert(nid.clone(), session.clone());
            self.entries(session.conn, |e| e.ntf_subs.insert(nid.clone()));
            let groups = self.ntf_part(session, &nid).await;
            if !groups.is_empty() {
                self.mesh.send(
                    session.conn.shard,
                    ShardMsg::Event {
                        conn: session.conn,
                        groups,
                    },
                );
            }
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
