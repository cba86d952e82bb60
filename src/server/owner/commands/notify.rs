//! Push notifications: NKEY, NDEL, NSUB and the NMSGs a SEND with the notification flag causes
//! (simplexmq `Server.hs`, `Server/NtfStore.hs`).

use rand::RngCore;
use x25519_dalek::{PublicKey as X25519Public, StaticSecret};

use super::{err, random_id, service_refusal};
use crate::crypto::keys::PublicAuthKey;
use crate::crypto::sxbox;
use crate::limits::NTFS_PER_PART;
use crate::protocol::command::ServiceRole;
use crate::protocol::encoding::{put_int64, put_short_unchecked};
use crate::protocol::error::ErrorType;
use crate::protocol::response::BrokerMsg;
use crate::server::directory::IdSpace;
use crate::server::messages::ConnMsg;
use crate::server::owner::services::same_service;
use crate::server::owner::{Owner, Turn};
use crate::server::router::{encode, Group, GroupKind, NtfReturn, Pending, Request, Session};
use crate::store::{Message, MessageStore, MsgNtf, NotifierCreds, QueueRec, QueueStore};

/// Attempts at a free notifier ID (the reference's 3).
const NOTIFIER_ID_ATTEMPTS: usize = 3;
/// NMSG metadata is padded to this before sealing.
const NMSG_META_PADDED_LEN: usize = 128;

impl<S: QueueStore + MessageStore> Owner<S> {
    /// The next `NTFS_PER_PART` stored notifications of `nid` for its subscriber `session`, and a
    /// marker to ask for more when more are stored.
    pub async fn ntf_part(&self, session: &Session, nid: &[u8]) -> Vec<Group> {
        let (part, more) = self
            .store
            .take_ntfs(nid, NTFS_PER_PART)
            .await
            .unwrap_or_default();
        let mut groups = Vec::new();
        if !part.is_empty() {
            let mut st = self.stats.borrow_mut();
            st.msg_ntfs += part.len() as u64;
            // The reference counts a batch per 80 NMSGs (simplexmq `Server.hs`, `deliverNtfsThread`).
            st.msg_ntfs_batches += part.len() as u64 / 80 + 1;
            drop(st);
            groups.push(self.ntf_group(session, nid, part));
        }
        if more {
            groups.push(self.more_ntfs(nid));
        } else {
            self.ntf_backlog.borrow_mut().remove(nid);
        }
        groups
    }

    /// Marks `nid`'s stored notifications as a backlog (NMSGs that follow are stored behind it) and
    /// returns the marker that tells its subscriber to ask for them.
    fn more_ntfs(&self, nid: &[u8]) -> Group {
        self.ntf_backlog.borrow_mut().insert(nid.to_vec());
        Group {
            transmissions: Vec::new(),
            kind: GroupKind::More(Pending::Ntfs {
                owner: self.shard,
                notifier_id: nid.to_vec(),
            }),
        }
    }

    /// NMSGs for `ntfs`, kept with them so that a connection that cannot take them returns them.
    pub fn ntf_group(&self, session: &Session, nid: &[u8], ntfs: Vec<MsgNtf>) -> Group {
        Group {
            transmissions: ntfs.iter().map(|n| nmsg(session, nid, n)).collect(),
            kind: GroupKind::Ntfs(NtfReturn {
                owner: self.shard,
                notifier_id: nid.to_vec(),
                ntfs,
            }),
        }
    }

    /// Notifications a connection could not take (it closed before they were written): stored
    /// again, ahead of any stored since, for the next NSUB.
    pub async fn store_ntfs(&self, nid: &[u8], ntfs: Vec<MsgNtf>) {
        {
            let mut st = self.stats.borrow_mut();
            st.msg_ntfs = crate::server::count::less(st.msg_ntfs, ntfs.len() as u64, "msg_ntfs");
        }
        // A notifier deleted meanwhile keeps nothing (a directory cache asks the store).
        if self
            .directory
            .find(crate::server::directory::IdSpace::Notifier, nid)
            .await
            .is_none()
        {
            return;
        }
        let _ = self.store.return_ntfs(nid, ntfs).await;
    }

    /// NKEY: a new notifier replaces any previous one, whose subscriber gets DELD.
    pub(super) async fn nkey(
        &self,
        session: &Session,
        mut q: QueueRec,
        key: PublicAuthKey,
        dh: [u8; 32],
    ) -> BrokerMsg {
        let rid = q.recipient_id.clone();
        let Some(notifier_id) = (0..NOTIFIER_ID_ATTEMPTS)
            .map(|_| random_id())
            .find(|id| self.directory.insert(IdSpace::Notifier, id, &rid))
        else {
            return err(ErrorType::Internal);
        };
        let k = StaticSecret::random_from_rng(rand::rngs::OsRng);
        let public = X25519Public::from(&k).to_bytes();
        let old = q.notifier.replace(Box::new(NotifierCreds {
            notifier_id: notifier_id.clone(),
            notifier_key: key,
            rcv_ntf_dh_secret: sxbox::dh(&k.to_bytes(), &dh),
            ntf_service_id: None,
        }));
        if let Err(e) = self.update(q).await {
            self.directory.remove(IdSpace::Notifier, &notifier_id, &rid);
            return err(e);
        }
        self.stats.borrow_mut().ntf_created += 1;
        if let Some(old) = old {
            self.directory
                .remove(IdSpace::Notifier, &old.notifier_id, &rid);
            self.notifier_gone(session, &old.notifier_id).await;
        }
        BrokerMsg::Nid {
            notifier_id,
            srv_ntf_dh_key: public,
        }
    }

    /// NDEL: the notifier and its pending notifications go; its subscriber gets DELD.
    pub(super) async fn ndel(&self, session: &Session, mut q: QueueRec) -> BrokerMsg {
        let Some(old) = q.notifier.take() else {
            return BrokerMsg::Ok;
        };
        let rid = q.recipient_id.clone();
        if let Err(e) = self.update(q).await {
            return err(e);
        }
        self.directory
            .remove(IdSpace::Notifier, &old.notifier_id, &rid);
        self.notifier_gone(session, &old.notifier_id).await;
        self.stats.borrow_mut().ntf_deleted += 1;
        BrokerMsg::Ok
    }

    /// A notifier was removed (NDEL, NKEY, DEL): drop its notifications and tell its subscriber,
    /// unless that is the connection that removed it.
    pub(super) async fn notifier_gone(&self, session: &Session, notifier_id: &[u8]) {
        let _ = self.store.delete_ntfs(notifier_id).await;
        self.ntf_backlog.borrow_mut().remove(notifier_id);
        let removed = self.ntf_subs.borrow_mut().remove(notifier_id);
        if let Some(s) = removed {
            if let Some(e) = self.by_conn.borrow_mut().get_mut(&s.conn) {
                e.ntf_subs.remove(notifier_id);
            }
            if s.conn != session.conn {
                let deld = encode(&s, b"", notifier_id, &BrokerMsg::Deld);
                self.send_event(s.conn, vec![vec![deld]]);
                self.stats.borrow_mut().sub_end += 1;
            }
        }
    }

    /// NSUB: this connection receives the queue's notifications; a previous notifier subscriber
    /// gets END. Not subject to blocking, and does not touch `updated_at`.
    pub(super) async fn nsub(
        &self,
        session: &Session,
        req: &Request,
        turn: &mut Turn,
    ) -> BrokerMsg {
        let q = match self.lookup(session, req) {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        if let Some(e) = service_refusal(req) {
            return err(e);
        }
        let Some(n) = q.notifier.as_ref() else {
            self.dummy_verify(session, req);
            self.count_auth(&req.command);
            return err(ErrorType::Auth);
        };
        if !self.verify_with(session, req, &n.notifier_key) {
            self.count_auth(&req.command);
            return err(ErrorType::Auth);
        }
        let nid = n.notifier_id.clone();
        let rid = q.recipient_id.clone();
        let newly = match self.associate_notifier(session, q).await {
            Ok(changed) => {
                if !changed && !req.associated {
                    let s = session.service.as_ref().map(|s| s.service_id.as_slice());
                    self.count_association(ServiceRole::Notifier, s, s);
                }
                changed || req.associated
            }
            Err(e) => return err(e),
        };
        self.tell_home_subscribed(session, ServiceRole::Notifier, &nid, newly);
        self.ntf_subscribed(&nid, &rid);
        let prev = self
            .ntf_subs
            .borrow_mut()
            .insert(nid.clone(), session.clone());
        self.entries(session.conn, |e| e.ntf_subs.insert(nid.clone()));
        // Counted for ordinary sessions only, as the reference does (`subscribeNotifications`).
        if session.service.is_none() {
            let mut st = self.stats.borrow_mut();
            match prev.as_ref().is_some_and(|p| p.conn == session.conn) {
                true => st.ntf_sub_duplicate += 1,
                false => st.ntf_sub += 1,
            }
        }
        if let Some(prev) = prev.filter(|p| p.conn != session.conn) {
            if let Some(e) = self.by_conn.borrow_mut().get_mut(&prev.conn) {
                e.ntf_subs.remove(&nid);
            }
            // Between connections of one service, ENDS says it (`commands/service.rs`).
            if !same_service(&prev, session) {
                let end = encode(&prev, b"", &nid, &BrokerMsg::End);
                self.send_event(prev.conn, vec![vec![end]]);
                self.stats.borrow_mut().sub_end += 1;
            }
        }
        // Notifications that waited for a subscriber follow the response, a part at a time: the
        // rest when the connection has room for them (`Owner::redeliver`).
        let part = self.ntf_part(session, &nid).await;
        turn.trailing.extend(part);
        BrokerMsg::Sok(session.service.as_ref().map(|s| s.service_id.clone()))
    }

    /// Stores an NMSG for `m` and delivers it at once when the notifier has a subscriber.
    pub(super) async fn notify(&self, rid: &[u8], n: NotifierCreds, m: &Message) {
        let mut nonce = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let mut meta = Vec::with_capacity(40);
        put_short_unchecked(&mut meta, m.msg_id());
        put_int64(&mut meta, m.ts());
        let Ok(enc_meta) =
            sxbox::seal_padded(&n.rcv_ntf_dh_secret, &nonce, &meta, NMSG_META_PADDED_LEN)
        else {
            return;
        };
        let ntf = MsgNtf {
            msg_id: *m.msg_id(),
            ts: m.ts(),
            nonce,
            enc_meta,
        };
        // Stored while earlier ones are still coming to the subscriber, so they keep their order.
        // A notifier of a subscribed notification service without a subscriber of its own is
        // delivered to the service's connection.
        let subscriber = self
            .service_ntf_sub(&n.notifier_id, rid, n.ntf_service_id.as_ref())
            .filter(|_| !self.ntf_backlog.borrow().contains(&n.notifier_id));
        match subscriber {
            // The subscriber's shard has no room for events (`limits::MAX_INBOX_EVENTS`): the
            // NMSG is stored, and the connection is told there is more, which it asks for as its
            // output allows, as after an NSUB (at most one such marker per notifier: the backlog
            // stores the NMSGs that follow).
            Some(s) if self.mesh.holds_back(s.conn.shard) => {
                let _ = self.store.add_ntf(&n.notifier_id, ntf).await;
                let more = self.more_ntfs(&n.notifier_id);
                self.mesh.send(
                    s.conn.shard,
                    ConnMsg::Event {
                        conn: s.conn,
                        groups: vec![more],
                    },
                );
            }
            Some(s) => {
                let conn = s.conn;
                let g = self.ntf_group(&s, &n.notifier_id, vec![ntf]);
                let mut st = self.stats.borrow_mut();
                st.msg_ntfs += 1;
                st.msg_ntfs_batches += 1;
                drop(st);
                self.mesh.send(
                    conn.shard,
                    ConnMsg::Event {
                        conn,
                        groups: vec![g],
                    },
                );
            }
            None => {
                let _ = self.store.add_ntf(&n.notifier_id, ntf).await;
            }
        }
    }
}

pub(crate) fn nmsg(session: &Session, nid: &[u8], n: &MsgNtf) -> Vec<u8> {
    encode(
        session,
        b"",
        nid,
        &BrokerMsg::Nmsg {
            nonce: n.nonce,
            enc_meta: n.enc_meta.clone(),
        },
    )
}
