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

use std::collections::{HashMap, HashSet};

use super::deliver::msg_transmission;
use crate::protocol::command::{Command, ServiceRole};
use crate::protocol::ids_hash::{id_hash, xor_into};
use crate::protocol::response::BrokerMsg;
use crate::server::messages::{ConnMsg, OwnerMsg};
use crate::server::owner::services::{associations_of, Associations};
use crate::server::owner::{Owner, Subscriber};
use crate::server::router::{
    encode, ConnRef, CountHash, Request, ServiceCheck, ServiceKey, Session,
};
use crate::store::{EntityId, MessageStore, QueueStore};

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
            OwnerMsg::ServiceSubscribed {
                key,
                session: session.clone(),
                hash: id_hash(id),
                newly,
            },
        );
    }

    /// Counts a SUB's (or NSUB's) effect on its queue's association with a service of `role`.
    pub fn count_association(&self, role: ServiceRole, before: Option<&[u8]>, now: Option<&[u8]>) {
        let mut stats = self.stats.borrow_mut();
        let s = match role {
            ServiceRole::Notifier => &mut stats.ntf_service_stats,
            _ => &mut stats.rcv_service_stats,
        };
        s.count_association(before, now);
    }

    /// Tells the home shards of services with a subscribed connection which of their queues went.
    pub fn tell_home_dropped(&self, gone: Associations) {
        for (key, hash) in gone {
            if self.services.subscriber(&key.0, key.1).is_some() {
                let home = self.mesh.owner_of(&key.0);
                self.mesh.send(home, OwnerMsg::ServiceDropped { key, hash });
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
        // The reference counts a subscription of the service when the connection's count was 0,
        // and each queue that joins the count (`srvSubCount`, `srvSubQueues`).
        let count = |first: bool| {
            let mut stats = self.stats.borrow_mut();
            let s = match key.1 {
                ServiceRole::Notifier => &mut stats.ntf_service_stats,
                _ => &mut stats.rcv_service_stats,
            };
            s.sub_queues += 1;
            s.sub_count += u64::from(first);
        };
        if let Some((s, (n, h))) = home.get_mut(&key) {
            if s.conn == session.conn {
                if newly || *n == 0 {
                    count(*n == 0);
                    *n += 1;
                    xor_into(h, &hash);
                }
                return;
            }
        }
        count(true);
        let before = home.insert(key.clone(), (session.clone(), (1, hash)));
        drop(home);
        if let Some((s, (n, h))) = before {
            self.send_ends(&key, &s, (n, h));
        }
        self.mesh.fan_out(|_| OwnerMsg::ServiceSwitch {
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
        if let Some(prev) = self.install(key, session) {
            self.release(key, prev);
        }
    }

    /// Makes `session` the service's subscriber on this owner; returns the connection that was
    /// before, if another.
    fn install(&self, key: &ServiceKey, session: &Session) -> Option<ConnRef> {
        self.services
            .subscribers
            .borrow_mut()
            .insert(key.clone(), session.clone())
            .map(|s| s.conn)
            .filter(|c| *c != session.conn)
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
                    // From the services' index: these queues' records need not be held.
                    let ours = self
                        .notifier_queue(&nid)
                        .is_some_and(|rid| self.services.holds(key, &rid));
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
        let prev = self.install(key, session);
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
                // Only notifiers with stored notifications have something to hand over: their
                // queues, from the directory and the services' index (no record needed).
                let mut queues: Vec<EntityId> = self
                    .store
                    .ntf_ids()
                    .iter()
                    .filter_map(|nid| self.notifier_queue(nid))
                    .filter(|rid| self.services.holds(key, rid))
                    .collect();
                queues.sort_unstable();
                queues.dedup();
                queues
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
        // Still subscribed to by `session` on this owner (it may have closed, or another
        // connection taken over, since the fold began).
        let current = self.services.subscriber(&key.0, key.1);
        if current.as_ref().map(|s| s.conn) != Some(session.conn) {
            return;
        }
        let Ok(_records) = self
            .hold_records_or_log(chunk.iter().map(Vec::as_slice), "a service's queues wait")
            .await
        else {
            return;
        };
        let mut todo = Vec::with_capacity(chunk.len());
        for rid in chunk {
            // Still associated (a job before this one may have moved it).
            let ours = self
                .store
                .with_queue(&rid, |q| q.rcv_service_id.as_ref() == Some(&key.0))
                .unwrap_or(false);
            if !ours {
                continue;
            }
            let holder = self.subs.borrow().get(&rid).map(|s| s.session.conn);
            match holder {
                Some(c) if c == session.conn => {
                    self.stats.borrow_mut().rcv_services_sub_duplicate += 1;
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
                    delivered_at: super::now_secs(),
                    epoch,
                },
            );
            self.entries(session.conn, |e| e.subs.insert(rid.clone()));
            self.stats.borrow_mut().rcv_services_sub_msg += 1;
            let t = msg_transmission(session, b"", rid, &secret, &m);
            let delivery = self.delivery(rid, m.msg_id());
            self.send_delivery(session.conn, t, delivery);
        }
    }

    /// The SUBs (and the NSUBs) of a block part that move their queues (notifiers) to the
    /// session's service (or, from an ordinary session, out of one), verified before the part
    /// runs, are associated in one store call per party (simplexmq `Server.hs`,
    /// `prepareBatchSubs`: PostgreSQL, one `UPDATE … RETURNING`); each marks its request. A lone
    /// one, an unverified one, or a failed call leaves them to `associate` one by one (each then
    /// reports its own error).
    pub async fn associate_part(&self, session: &Session, requests: &mut [Request]) {
        let service = session.service.as_ref().map(|s| s.service_id.clone());
        // (SUB's, NSUB's) queues whose association the part changes.
        let (mut subs, mut nsubs): (Vec<EntityId>, Vec<EntityId>) = (Vec::new(), Vec::new());
        for r in requests.iter() {
            let verified = r.batch_verified.is_some() || r.pre_verified == Some(true);
            let eligible = r.forward.is_none()
                && matches!(r.service, ServiceCheck::Plain | ServiceCheck::Signed)
                && verified;
            let Some(rid) = r.recipient_id.as_ref().filter(|_| eligible) else {
                continue;
            };
            let (moves, list) = match r.command {
                Command::Sub => (
                    self.store
                        .with_queue(rid, |q| q.rcv_service_id != service)
                        .unwrap_or(false),
                    &mut subs,
                ),
                Command::NSub => (
                    self.store
                        .with_queue(rid, |q| {
                            q.notifier
                                .as_ref()
                                .is_some_and(|n| n.ntf_service_id != service)
                        })
                        .unwrap_or(false),
                    &mut nsubs,
                ),
                _ => continue,
            };
            if moves && !list.contains(rid) {
                list.push(rid.clone());
            }
        }
        let mut done: HashSet<(bool, EntityId)> = HashSet::new();
        for (notifier, ids) in [(false, subs), (true, nsubs)] {
            if ids.len() < 2 {
                continue;
            }
            let mut befores: HashMap<EntityId, Associations> = ids
                .iter()
                .filter_map(|rid| {
                    let before = self.store.with_queue(rid, associations_of)?;
                    Some((rid.clone(), before))
                })
                .collect();
            let news = if notifier {
                self.store
                    .associate_notifiers_many(&ids, service.as_ref())
                    .await
            } else {
                let today = crate::clock::now_secs() / 86400 * 86400;
                self.store
                    .associate_many(&ids, service.as_ref(), today)
                    .await
            };
            let Ok(news) = news else { continue };
            let role = match notifier {
                true => ServiceRole::Notifier,
                false => ServiceRole::Messaging,
            };
            for new in &news {
                let before = befores.remove(&new.recipient_id).unwrap_or_default();
                let was = before.iter().find(|((_, r), _)| *r == role);
                let was = was.map(|((s, _), _)| s.as_slice());
                self.count_association(role, was, service.as_deref());
                let gone = self
                    .services
                    .changed(&new.recipient_id, before, associations_of(new));
                self.tell_home_dropped(gone);
                done.insert((notifier, new.recipient_id.clone()));
            }
        }
        if done.is_empty() {
            return;
        }
        for r in requests.iter_mut() {
            let notifier = match r.command {
                Command::Sub => false,
                Command::NSub => true,
                _ => continue,
            };
            if let Some(rid) = &r.recipient_id {
                if done.contains(&(notifier, rid.clone())) {
                    r.associated = true;
                }
            }
        }
    }

    /// As `fold_service_chunk`, for a notification service after `NSUBS`: each notifier of the
    /// chunk without a subscriber of its own gets the service's connection, and its stored
    /// notifications, a part at a time as an NSUB's (the rest when the connection has room).
    pub async fn fold_ntf_chunk(&self, key: &ServiceKey, session: &Session, chunk: Vec<EntityId>) {
        let Ok(_records) = self
            .hold_records_or_log(
                chunk.iter().map(Vec::as_slice),
                "a notification service's notifiers wait",
            )
            .await
        else {
            return;
        };
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
            self.ntf_subscribed(&nid, &rid);
            self.ntf_subs
                .borrow_mut()
                .insert(nid.clone(), session.clone());
            self.entries(session.conn, |e| e.ntf_subs.insert(nid.clone()));
            let groups = self.ntf_part(session, &nid).await;
            if !groups.is_empty() {
                self.mesh.send(
                    session.conn.shard,
                    ConnMsg::Event {
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
                delivered_at: 0,
                epoch,
            },
        );
        self.entries(session.conn, |e| e.subs.insert(rid.to_vec()));
        true
    }

    /// As `service_delivery_sub`, for a notifier of a subscribed notification service.
    pub fn service_ntf_sub(
        &self,
        nid: &[u8],
        rid: &[u8],
        service: Option<&EntityId>,
    ) -> Option<Session> {
        if let Some(s) = self.ntf_subs.borrow().get(nid) {
            return Some(s.clone());
        }
        let session = self.services.subscriber(service?, ServiceRole::Notifier)?;
        self.ntf_subscribed(nid, rid);
        self.ntf_subs
            .borrow_mut()
            .insert(nid.to_vec(), session.clone());
        self.entries(session.conn, |e| e.ntf_subs.insert(nid.to_vec()));
        Some(session)
    }
}
