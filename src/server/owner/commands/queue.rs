//! Queue lifecycle by its recipient: NEW (with short-link data and notifier credentials), KEY, RKEY,
//! OFF, DEL and QUE (simplexmq `Server.hs`, `Server/QueueStore.hs`).

use x25519_dalek::{PublicKey as X25519Public, StaticSecret};

use super::{err, now_secs, random_id, service_refusal, store_error};
use crate::crypto::keys::PublicAuthKey;
use crate::crypto::{hash, sxbox};
use crate::protocol::command::{Command, QueueMode, QueueReq, ServiceRole, SubMode};
use crate::protocol::error::{CommandError, ErrorType};
use crate::protocol::response::{BrokerMsg, QueueIds, ServerNtfCreds};
use crate::server::directory::IdSpace;
use crate::server::owner::services::associations_of;
use crate::server::owner::{Owner, Subscriber, Turn};
use crate::server::router::encode;
use crate::server::router::{owner_shard, Request, Session};
use crate::store::{
    EntityId, Message, MessageStore, NotifierCreds, QueueLink, QueueRec, QueueStatus, QueueStore,
    StoreError,
};

/// Attempts at finding free generated IDs before `ERR INTERNAL` (the reference's 3).
const CREATE_ATTEMPTS: usize = 3;
/// Random recipient IDs tried per attempt to find one this shard owns (1 in `shards` on average).
const OWNED_ID_TRIES: usize = 256;

impl<S: QueueStore + MessageStore> Owner<S> {
    /// Forgets the pending GETs of a deleted queue, on every connection that asked.
    pub(crate) fn forget_gets(&self, rid: &[u8]) {
        let gets = self.gets.borrow_mut().remove(rid);
        for c in gets.into_iter().flat_map(|m| m.into_keys()) {
            if let Some(e) = self.by_conn.borrow_mut().get_mut(&c) {
                e.gets.remove(rid);
            }
        }
    }

    pub(super) async fn new_queue(
        &self,
        session: &Session,
        req: &Request,
        turn: &mut Turn,
    ) -> BrokerMsg {
        let Command::New(new) = &req.command else {
            return err(ErrorType::Internal);
        };
        // NEW has no queue to look up: the role, then the service signature (`ServiceCheck`).
        if let Some(e) = service_refusal(req) {
            return err(e);
        }
        // Proof of possession of the recipient key.
        if !self.verify_with(session, req, &new.rcv_auth_key) {
            return err(ErrorType::Auth);
        }
        let s = &self.settings;
        let password_ok = match &s.create_password {
            None => true,
            Some(p) => new.basic_auth.as_deref() == Some(&p[..]),
        };
        if !s.new_queues || !password_ok {
            return err(ErrorType::Auth);
        }
        // A service creates its queues subscribed (simplexmq `Server.hs`, `createQueue`).
        let service_id = session.service.as_ref().map(|s| s.service_id.clone());
        if service_id.is_some() && new.sub_mode == SubMode::OnlyCreate {
            return err(ErrorType::Cmd(CommandError::Prohibited));
        }
        // Client-supplied IDs (short-link data): the sender ID must be derived from the corrId, so
        // that NEW cannot be used to probe whether an ID exists.
        let derived_sender: EntityId = hash::sha3_384(&req.corr_id)[..24].to_vec();
        let (client_ids, link) = match &new.queue_req {
            Some(QueueReq::Messaging(Some(l))) => (true, Some((None, l))),
            Some(QueueReq::Contact(Some((link_id, l)))) => (true, Some((Some(link_id.clone()), l))),
            _ => (false, None),
        };
        if let Some((_, l)) = &link {
            if l.sender_id != derived_sender {
                return err(ErrorType::Cmd(CommandError::Prohibited));
            }
        }
        let queue_mode = new.queue_req.as_ref().map(|r| r.mode());
        let srv_dh = StaticSecret::random_from_rng(rand::rngs::OsRng);
        let srv_dh_pub = X25519Public::from(&srv_dh).to_bytes();
        let rcv_dh_secret = sxbox::dh(&srv_dh.to_bytes(), &new.rcv_dh_key);
        let ntf = new.ntf_creds.as_ref().map(|c| {
            let k = StaticSecret::random_from_rng(rand::rngs::OsRng);
            let public = X25519Public::from(&k).to_bytes();
            (c.key.clone(), sxbox::dh(&k.to_bytes(), &c.dh), public)
        });
        let today = now_secs() / 86400 * 86400;

        for _ in 0..CREATE_ATTEMPTS {
            let Some(rid) = self.owned_recipient_id(req) else {
                return err(ErrorType::Internal);
            };
            let sender_id = match &link {
                Some((_, l)) => l.sender_id.clone(),
                None => random_id(),
            };
            let queue_link = link.as_ref().map(|(link_id, l)| QueueLink {
                link_id: link_id.clone().unwrap_or_else(random_id),
                fixed: l.fixed.clone(),
                user: l.user.clone(),
            });
            let notifier = ntf.as_ref().map(|(key, secret, _)| NotifierCreds {
                notifier_id: random_id(),
                notifier_key: key.clone(),
                rcv_ntf_dh_secret: *secret,
                ntf_service_id: None,
            });
            let rec = QueueRec {
                recipient_id: rid.clone(),
                recipient_keys: vec![new.rcv_auth_key.clone()],
                rcv_dh_secret,
                sender_id: sender_id.clone(),
                sender_key: None,
                queue_mode,
                link: queue_link.clone().map(Box::new),
                notifier: notifier.clone().map(Box::new),
                status: QueueStatus::Active,
                updated_at: Some(today),
                rcv_service_id: service_id.clone(),
            };
            match self.claim_ids(&rec) {
                Ok(()) => {}
                Err(()) if client_ids => return err(ErrorType::Auth),
                Err(()) => continue,
            }
            match self.store.create(rec.clone()).await {
                Ok(()) => {}
                Err(StoreError::Duplicate) => {
                    self.release_ids(&rec);
                    if client_ids {
                        return err(ErrorType::Auth);
                    }
                    continue;
                }
                Err(e) => {
                    self.release_ids(&rec);
                    return err(store_error(e));
                }
            }
            self.services
                .changed(&rec.recipient_id, Vec::new(), associations_of(&rec));
            if new.sub_mode == SubMode::Subscribe {
                self.tell_home_subscribed(session, ServiceRole::Messaging, &rid, true);
            }
            {
                let mut st = self.stats.borrow_mut();
                st.queues_created += 1;
                if rec.notifier.is_some() {
                    st.ntf_new_created += 1;
                }
            }
            if new.sub_mode == SubMode::Subscribe {
                // A new queue has no message and no other subscriber.
                let epoch = self.new_epoch();
                self.subs.borrow_mut().insert(
                    rid.clone(),
                    Subscriber {
                        session: session.clone(),
                        delivered: None,
                        delivered_at: 0,
                        epoch,
                    },
                );
                self.entries(session.conn, |e| e.subs.insert(rid.clone()));
            }
            turn.stale_heads.insert(rid.clone());
            return BrokerMsg::Ids(QueueIds {
                rcv_id: rid,
                snd_id: sender_id,
                srv_dh_key: srv_dh_pub,
                queue_mode,
                link_id: queue_link.map(|l| l.link_id),
                service_id,
                srv_ntf_creds: match (notifier, &ntf) {
                    (Some(n), Some((_, _, public))) => Some(ServerNtfCreds {
                        notifier_id: n.notifier_id,
                        srv_ntf_dh_key: *public,
                    }),
                    _ => None,
                },
            });
        }
        err(ErrorType::Internal)
    }

    /// A fresh recipient ID that this shard owns: the connection proposed one for routing; retries
    /// after a collision draw new ones until one falls in this shard's groups.
    fn owned_recipient_id(&self, req: &Request) -> Option<EntityId> {
        if let Some(rid) = &req.recipient_id {
            if !self.store.contains(rid) {
                return Some(rid.clone());
            }
        }
        let shards = self.mesh.shards();
        (0..OWNED_ID_TRIES)
            .map(|_| random_id())
            .find(|id| owner_shard(id, shards) == self.shard && !self.store.contains(id))
    }

    /// Inserts the queue's sender, link and notifier IDs in the shared directory; all or none.
    pub(super) fn claim_ids(&self, q: &QueueRec) -> Result<(), ()> {
        let rid = &q.recipient_id;
        let mut claimed: Vec<(IdSpace, &[u8])> = Vec::new();
        let mut wanted: Vec<(IdSpace, &[u8])> = vec![(IdSpace::Sender, &q.sender_id)];
        if let Some(l) = &q.link {
            wanted.push((IdSpace::Link, &l.link_id));
        }
        if let Some(n) = &q.notifier {
            wanted.push((IdSpace::Notifier, &n.notifier_id));
        }
        for (space, id) in wanted {
            if self.directory.insert(space, id, rid) {
                claimed.push((space, id));
            } else {
                for (space, id) in claimed {
                    self.directory.remove(space, id, rid);
                }
                return Err(());
            }
        }
        Ok(())
    }

    pub(super) fn release_ids(&self, q: &QueueRec) {
        let rid = &q.recipient_id;
        self.directory.remove(IdSpace::Sender, &q.sender_id, rid);
        if let Some(l) = &q.link {
            self.directory.remove(IdSpace::Link, &l.link_id, rid);
        }
        if let Some(n) = &q.notifier {
            self.directory
                .remove(IdSpace::Notifier, &n.notifier_id, rid);
        }
    }

    /// KEY: the recipient sets the sender key (the pre-SKEY flow); the same key again is OK.
    pub(super) async fn key(&self, mut q: QueueRec, k: PublicAuthKey) -> BrokerMsg {
        match &q.sender_key {
            Some(existing) if *existing == k => BrokerMsg::Ok,
            Some(_) => err(ErrorType::Auth),
            None => {
                q.sender_key = Some(k);
                match self.update(q).await {
                    Ok(()) => {
                        self.stats.borrow_mut().queues_secured += 1;
                        BrokerMsg::Ok
                    }
                    Err(e) => err(e),
                }
            }
        }
    }

    /// RKEY: replaces the recipient keys; contact queues only.
    pub(super) async fn rkey(&self, mut q: QueueRec, keys: Vec<PublicAuthKey>) -> BrokerMsg {
        if q.queue_mode != Some(QueueMode::Contact) || keys.is_empty() {
            return err(ErrorType::Auth);
        }
        q.recipient_keys = keys;
        match self.update(q).await {
            Ok(()) => BrokerMsg::Ok,
            Err(e) => err(e),
        }
    }

    /// OFF: senders are refused from now on; idempotent.
    pub(super) async fn off(&self, mut q: QueueRec) -> BrokerMsg {
        if q.status == QueueStatus::Off {
            return BrokerMsg::Ok;
        }
        q.status = QueueStatus::Off;
        match self.update(q).await {
            Ok(()) => BrokerMsg::Ok,
            Err(e) => err(e),
        }
    }

    /// DEL: the queue, its messages and notifier go; other subscribers get DELD (END below v10),
    /// the deleting connection nothing.
    pub(super) async fn del(&self, session: &Session, q: QueueRec, turn: &mut Turn) -> BrokerMsg {
        let rid = q.recipient_id.clone();
        if let Err(e) = self.store.delete(&rid).await {
            return err(store_error(e));
        }
        self.release_ids(&q);
        self.forget_queue(&rid);
        let gone = self.services.changed(&rid, associations_of(&q), Vec::new());
        self.tell_home_dropped(gone);
        {
            let mut st = self.stats.borrow_mut();
            st.queues_deleted += 1;
            match q.sender_key {
                None => st.queues_deleted_new += 1,
                Some(_) => st.queues_deleted_secured += 1,
            }
        }
        turn.stale_heads.insert(rid.clone());
        let sub = self.subs.borrow_mut().remove(&rid);
        // A queue of a subscribed service without a subscription of its own: the service's
        // connection is told (simplexmq `Server.hs`, `CSDeleted`).
        if sub.is_none() {
            let service = q.rcv_service_id.as_ref().and_then(|s| {
                self.services
                    .subscriber(s, crate::protocol::command::ServiceRole::Messaging)
            });
            if let Some(s) = service.filter(|s| s.conn != session.conn) {
                let deld = encode(&s, b"", &rid, &BrokerMsg::Deld);
                self.send_event(s.conn, vec![vec![deld]]);
                self.stats.borrow_mut().sub_end += 1;
            }
        }
        if let Some(sub) = sub {
            if sub.session.conn != session.conn {
                let deld = encode(&sub.session, b"", &rid, &BrokerMsg::Deld);
                self.send_event(sub.session.conn, vec![vec![deld]]);
                self.stats.borrow_mut().sub_end += 1;
            }
            if let Some(e) = self.by_conn.borrow_mut().get_mut(&sub.session.conn) {
                e.subs.remove(&rid);
            }
        }
        self.forget_gets(&rid);
        if let Some(n) = &q.notifier {
            self.notifier_gone(session, &n.notifier_id).await;
        }
        BrokerMsg::Ok
    }

    /// QUE: debugging information about the queue as JSON (simplexmq
    /// `Server/QueueStore/QueueInfo.hs`), fields in the reference's order: `qiSnd`, `qiNtf`,
    /// `qiSub` (this connection's), `qiSize`, and `qiMsg`, the head message as `getQueueInfo` peeks
    /// it.
    pub(super) async fn que(&self, session: &Session, q: &QueueRec) -> BrokerMsg {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let rid = &q.recipient_id;
        let head = match self.store.peek_first(rid).await {
            Ok(h) => h,
            Err(e) => return err(store_error(e)),
        };
        let mut json = format!(
            "{{\"qiSnd\":{},\"qiNtf\":{}",
            q.sender_key.is_some(),
            q.notifier.is_some()
        );
        let sub = match self.subs.borrow().get(rid) {
            // The reference's subscription is `noSub` unless a delivery thread waits on a full
            // send queue (`Server.hs`, `getQueueInfo`); here a waiting delivery is the
            // connection's, so the owner always reports `noSub`.
            Some(s) if s.session.conn == session.conn => Some(("noSub", s.delivered)),
            _ => self
                .get_state(rid, session.conn)
                .map(|d| ("prohibitSub", d)),
        };
        if let Some((state, delivered)) = sub {
            json.push_str(&format!(",\"qiSub\":{{\"qSubThread\":\"{state}\""));
            if let Some(d) = delivered {
                json.push_str(&format!(",\"qDelivered\":\"{}\"", b64.encode(d)));
            }
            json.push('}');
        }
        json.push_str(&format!(",\"qiSize\":{}", self.store.size(rid)));
        if let Some(m) = head {
            let msg_type = match m {
                Message::Message { .. } => "message",
                Message::Quota { .. } => "quota",
            };
            json.push_str(&format!(
                ",\"qiMsg\":{{\"msgId\":\"{}\",\"msgTs\":\"{}\",\"msgType\":\"{msg_type}\"}}",
                b64.encode(m.msg_id()),
                crate::clock::utc_time(m.ts())
            ));
        }
        json.push('}');
        BrokerMsg::Info(json)
    }
}
