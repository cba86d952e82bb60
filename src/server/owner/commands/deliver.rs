//! Messages in and out: SEND, SUB, GET, ACK and the pushes they cause
//! (simplexmq `Server.hs`, `Server/MsgStore/STM.hs`; `docs/ARCHITECTURE.md` §3).
//!
//! Every delivery path checks and sets the subscription's `delivered`: a SUB resets it and returns the
//! head; a SEND pushes only when the queue was empty and nothing is outstanding; an ACK hands out the
//! next message in its response. So a subscription has at most one unacknowledged message, and no
//! message is sent twice within a subscription.

use std::rc::Rc;

use super::{err, now_secs, random_id, service_refusal, store_error};
use crate::crypto::sxbox;
use crate::protocol::command::Command;
use crate::protocol::encoding::put_short_unchecked;
use crate::protocol::error::CommandError;
use crate::protocol::error::ErrorType;
use crate::protocol::pad::PAD_BYTE;
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::encode_server_transmission;
use crate::protocol::version::max_message_length;
use crate::server::messages::ConnMsg;
#[cfg(feature = "test-kit")]
use crate::server::messages::OwnerMsg;
use crate::server::owner::services::same_service;
use crate::server::owner::{Owner, Subscriber, Turn};
use crate::server::router::{
    encode, ConnRef, Delivery, Group, GroupKind, Pending, Request, Session,
};
use crate::store::{EntityId, Message, MessageStore, MsgId, QueueStatus, QueueStore, WriteOutcome};

/// MSG bodies are always padded to this before sealing: `MaxRcvMessageLen + 2`
/// (simplexmq `Server.hs`, `encryptMsg`).
const RCV_MSG_PADDED_LEN: usize = 16106;
/// A sealed MSG body: tag and padded ciphertext.
const SEALED_MSG_BODY_LEN: usize = sxbox::TAG_LEN + RCV_MSG_PADDED_LEN;

/// The MSG transmission for `m` on queue `rid`, sealed for its recipient: built in one allocation,
/// the message body copied once, into the place where it is sealed.
pub fn msg_transmission(
    session: &Session,
    corr_id: &[u8],
    rid: &[u8],
    rcv_dh_secret: &[u8; 32],
    m: &Message,
) -> Vec<u8> {
    let mut t = Vec::with_capacity(
        64 + session.session_id.len() + corr_id.len() + rid.len() + SEALED_MSG_BODY_LEN,
    );
    encode_server_transmission(
        session.version,
        &session.session_id,
        corr_id,
        rid,
        b"",
        &mut t,
    );
    t.extend_from_slice(b"MSG ");
    put_short_unchecked(&mut t, m.msg_id());
    seal_msg_body_into(rcv_dh_secret, m, &mut t);
    t
}

/// `MSG msgId body` with the body sealed as simplexmq `Server.hs` `encryptMsg` does (for answers
/// that go through `encode`: ACK's next message, GET).
pub fn msg_response(rcv_dh_secret: &[u8; 32], m: &Message) -> BrokerMsg {
    let mut body = Vec::with_capacity(SEALED_MSG_BODY_LEN);
    seal_msg_body_into(rcv_dh_secret, m, &mut body);
    BrokerMsg::Msg {
        msg_id: m.msg_id().to_vec(),
        body,
    }
}

/// The sealed MSG body: tag ‖ SXbox of `pad(ts flags SP body)` (or `pad(QUOTA SP ts)` for the
/// marker) to 16106 bytes, appended to `out`. The plaintext is written straight into its padded
/// place and sealed there.
fn seal_msg_body_into(rcv_dh_secret: &[u8; 32], m: &Message, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + SEALED_MSG_BODY_LEN, PAD_BYTE);
    let (tag, padded) = out[start..].split_at_mut(sxbox::TAG_LEN);
    let (len_bytes, rest) = padded.split_at_mut(2);
    let mut w = 0;
    let mut put = |bytes: &[u8]| {
        // A stored body is at most the largest SEND any version accepts, which always fits; the
        // bound keeps a bad record from panicking.
        let n = bytes.len().min(rest.len() - w);
        rest[w..w + n].copy_from_slice(&bytes[..n]);
        w += n;
    };
    match m {
        Message::Message {
            ts,
            notification,
            body,
            ..
        } => {
            put(&ts.to_be_bytes());
            put(if *notification { b"T " } else { b"F " });
            put(body);
        }
        Message::Quota { ts, .. } => {
            put(b"QUOTA ");
            put(&ts.to_be_bytes());
        }
    }
    len_bytes.copy_from_slice(&(w as u16).to_be_bytes());
    tag.copy_from_slice(&sxbox::seal_in_place(rcv_dh_secret, m.msg_id(), padded));
}

impl<S: QueueStore + MessageStore> Owner<S> {
    /// A connection asks for what it held: MSGs it dropped while its output was over its bound
    /// (each queue's head is handed again if that is still the subscription's outstanding
    /// delivery), and the next notifications of a notifier it subscribes to. Always answered, even
    /// with nothing, so that the connection asks for its next items (I2).
    pub async fn redeliver(&self, conn: ConnRef, items: Vec<Pending>) {
        let rids: Vec<EntityId> = items.iter().filter_map(|i| self.pending_queue(i)).collect();
        // Without them a held message stays in its queue for the next SUB, as it would if the
        // connection had closed.
        let Ok(_records) = self
            .hold_records_or_log(rids.iter().map(Vec::as_slice), "held deliveries wait")
            .await
        else {
            return;
        };
        let mut groups = Vec::new();
        for item in items {
            match item {
                Pending::Msg(d) => {
                    if let Some(g) = self.redeliver_msg(conn, d).await {
                        groups.push(g);
                    }
                }
                Pending::Ntfs { notifier_id, .. } => {
                    let Some(session) = self
                        .ntf_subs
                        .borrow()
                        .get(&notifier_id)
                        .filter(|s| s.conn == conn)
                        .cloned()
                    else {
                        continue;
                    };
                    groups.extend(self.ntf_part(&session, &notifier_id).await);
                }
            }
        }
        self.mesh
            .send(conn.shard, ConnMsg::Redelivered { conn, groups });
    }

    async fn redeliver_msg(&self, conn: ConnRef, d: Delivery) -> Option<Group> {
        let rid = d.recipient_id.clone();
        if !self.is_outstanding(conn, &d) {
            return None;
        }
        let head = self.store.peek_first(&rid).await.ok().flatten();
        // The connection may have closed while the head was read.
        if !self.is_outstanding(conn, &d) {
            return None;
        }
        let secret = self.store.with_queue(&rid, |q| q.rcv_dh_secret)?;
        let session = {
            let mut subs = self.subs.borrow_mut();
            let s = subs.get_mut(&rid)?;
            s.delivered = head.as_ref().map(|m| *m.msg_id());
            s.delivered_at = now_secs();
            s.session.clone()
        };
        let m = head?;
        let t = msg_transmission(&session, b"", &rid, &secret, &m);
        Some(Group {
            transmissions: vec![t],
            kind: GroupKind::Msg(self.delivery(&rid, m.msg_id())),
        })
    }

    /// SUB: registers this connection as the queue's subscriber (ending another connection's
    /// subscription) and returns the head, in the same owner turn.
    pub(super) async fn sub(
        &self,
        session: &Session,
        rid: &[u8],
        head: Option<Option<Message>>,
        turn: &mut Turn,
    ) -> BrokerMsg {
        let conn = session.conn;
        if self.get_state(rid, conn).is_some() {
            self.stats.borrow_mut().sub_prohibited += 1;
            return err(ErrorType::Cmd(CommandError::Prohibited));
        }
        // The reference counts a repeated SUB of one connection, and a new subscription only
        // when it delivers a waiting message (`qSub`, simplexmq `Stats.hs`).
        let repeated = self.subs.borrow().get(rid).map(|s| s.session.conn) == Some(conn);
        if repeated {
            self.stats.borrow_mut().sub_duplicate += 1;
        }
        let epoch = self.new_epoch();
        #[cfg(feature = "test-kit")]
        let late = self.fault.get() == crate::server::owner::Fault::LateRegistration;
        #[cfg(not(feature = "test-kit"))]
        let late = false;
        if late {
            // Test-only: register later, as the reference's subscriber thread does, so that a SEND
            // between this read and the registration is neither returned nor pushed.
            #[cfg(feature = "test-kit")]
            self.register_later(session.clone(), rid.to_vec(), epoch);
        } else {
            self.register_sub(session, rid, epoch);
        }
        // The batch read is stale if an earlier request of this turn changed the queue.
        let head = match head {
            Some(h) if !turn.stale_heads.contains(rid) => h,
            _ => match self.store.peek_first(rid).await {
                Ok(h) => h,
                Err(e) => return err(store_error(e)),
            },
        };
        if let Some(m) = head {
            let Some(secret) = self.store.with_queue(rid, |q| q.rcv_dh_secret) else {
                return err(ErrorType::Auth);
            };
            if let Some(s) = self.subs.borrow_mut().get_mut(rid) {
                s.delivered = Some(*m.msg_id());
                s.delivered_at = now_secs();
            }
            if !repeated {
                self.stats.borrow_mut().sub_successes += 1;
            }
            let delivery = self.delivery(rid, m.msg_id());
            turn.sub_msgs
                .push((msg_transmission(session, b"", rid, &secret, &m), delivery));
        }
        BrokerMsg::Sok(session.service.as_ref().map(|s| s.service_id.clone()))
    }

    /// Makes `session` the subscriber of `rid` (a new subscription, `epoch`); a previous subscriber
    /// on another connection gets END.
    pub fn register_sub(&self, session: &Session, rid: &[u8], epoch: u64) {
        let conn = session.conn;
        let mut subs = self.subs.borrow_mut();
        match subs.get_mut(rid) {
            Some(s) if s.session.conn == conn => {
                s.delivered = None;
                s.epoch = epoch;
            }
            _ => {
                let prev = subs.insert(
                    rid.to_vec(),
                    Subscriber {
                        session: session.clone(),
                        delivered: None,
                        delivered_at: 0,
                        epoch,
                    },
                );
                drop(subs);
                self.entries(conn, |e| e.subs.insert(rid.to_vec()));
                if let Some(prev) = prev {
                    if let Some(e) = self.by_conn.borrow_mut().get_mut(&prev.session.conn) {
                        e.subs.remove(rid);
                    }
                    // Between connections of one service, ENDS says it (`commands/service.rs`).
                    if !same_service(&prev.session, session) {
                        let end = encode(&prev.session, b"", rid, &BrokerMsg::End);
                        self.send_event(prev.session.conn, vec![vec![end]]);
                        self.stats.borrow_mut().sub_end += 1;
                    }
                }
            }
        }
    }

    /// The late registration (`start --test-late-registration`): a self-addressed message after
    /// `T1_VARIANT_DELAY` (in the owner simulation, whenever the seed delivers it).
    #[cfg(feature = "test-kit")]
    fn register_later(&self, session: Session, rid: Vec<u8>, epoch: u64) {
        let mesh = self.mesh.clone();
        let shard = self.shard;
        #[cfg(test)]
        if self.fault.get() == crate::server::owner::Fault::LateRegistration {
            let recipient_id = rid;
            mesh.send(
                shard,
                OwnerMsg::RegisterSub {
                    session,
                    recipient_id,
                    epoch,
                },
            );
            return;
        }
        glommio::spawn_local(async move {
            glommio::timer::Timer::new(crate::server::owner::T1_VARIANT_DELAY).await;
            mesh.send(
                shard,
                OwnerMsg::RegisterSub {
                    session,
                    recipient_id: rid,
                    epoch,
                },
            );
        })
        .detach();
    }

    /// GET: pull delivery; marks the queue as GET-mode on this connection.
    pub(super) async fn get(&self, session: &Session, rid: &[u8]) -> BrokerMsg {
        let conn = session.conn;
        if self.subs.borrow().get(rid).map(|s| s.session.conn) == Some(conn) {
            self.stats.borrow_mut().msg_get_prohibited += 1;
            return err(ErrorType::Cmd(CommandError::Prohibited));
        }
        let head = match self.store.peek_first(rid).await {
            Ok(h) => h,
            Err(e) => return err(store_error(e)),
        };
        {
            let mut st = self.stats.borrow_mut();
            match (&head, self.get_state(rid, conn)) {
                (None, _) => st.msg_get_no_msg += 1,
                (Some(_), Some(Some(_))) => st.msg_get_duplicate += 1,
                (Some(_), _) => st.msg_get += 1,
            }
        }
        self.entries(conn, |e| e.gets.insert(rid.to_vec()));
        let delivered = head.as_ref().map(|m| *m.msg_id());
        self.set_get_state(rid, conn, delivered);
        match head {
            Some(m) => {
                let secret = self
                    .store
                    .with_queue(rid, |q| q.rcv_dh_secret)
                    .unwrap_or_default();
                msg_response(&secret, &m)
            }
            None => BrokerMsg::Ok,
        }
    }

    /// ACK: acknowledges the delivered message (an empty ID acknowledges whatever was delivered);
    /// in SUB mode the next message is the response. A delivery the connection dropped unsent
    /// (`undelivered`, still this subscription's outstanding one) was never queued for sending,
    /// so, as in the reference, nothing is delivered yet: `NO_MSG`, and the message stays.
    pub(super) async fn ack(
        &self,
        session: &Session,
        rid: &[u8],
        msg_id: &[u8],
        undelivered: Option<&Delivery>,
        turn: &mut Turn,
    ) -> BrokerMsg {
        let conn = session.conn;
        if undelivered.is_some_and(|d| self.is_outstanding(conn, d)) {
            return err(ErrorType::NoMsg);
        }
        let matches = |d: &Option<MsgId>| match d {
            Some(d) => msg_id.is_empty() || msg_id == &d[..],
            None => false,
        };
        // SUB mode: what this connection's subscription has delivered, taken.
        let sub_delivered = {
            let mut subs = self.subs.borrow_mut();
            match subs.get_mut(rid).filter(|s| s.session.conn == conn) {
                Some(s) if !matches(&s.delivered) => return err(ErrorType::NoMsg),
                Some(s) => Some((s.delivered.take(), s.delivered_at)),
                None => None,
            }
        };
        if let Some((delivered, delivered_at)) = sub_delivered {
            let Some(delivered) = delivered else {
                return err(ErrorType::NoMsg);
            };
            let (deleted, next) = match self.store.try_del_peek(rid, &delivered).await {
                Ok(r) => r,
                Err(e) => return err(store_error(e)),
            };
            turn.stale_heads.insert(rid.to_vec());
            if let Some(m) = &deleted {
                self.count_received(rid, m, Some(delivered_at));
            }
            return match next {
                Some(m) => {
                    // The subscription may have ended while the store worked (its connection
                    // closed); the next message is the answer either way.
                    if let Some(s) = self
                        .subs
                        .borrow_mut()
                        .get_mut(rid)
                        .filter(|s| s.session.conn == conn)
                    {
                        s.delivered = Some(*m.msg_id());
                        s.delivered_at = now_secs();
                    }
                    #[cfg(test)]
                    if self.fault.get() == crate::server::owner::Fault::AckWithoutNext {
                        return BrokerMsg::Ok;
                    }
                    let secret = self
                        .store
                        .with_queue(rid, |q| q.rcv_dh_secret)
                        .unwrap_or_default();
                    msg_response(&secret, &m)
                }
                None => BrokerMsg::Ok,
            };
        }
        if let Some(d) = self.get_state(rid, conn) {
            if !matches(&d) {
                return err(ErrorType::NoMsg);
            }
            let Some(delivered) = d else {
                return err(ErrorType::NoMsg);
            };
            self.set_get_state(rid, conn, None);
            // GET mode deletes only a matching head; OK either way.
            match self.store.try_del(rid, &delivered).await {
                Ok(Some(m)) => self.count_received(rid, &m, None),
                Ok(None) => {}
                Err(e) => return err(store_error(e)),
            }
            turn.stale_heads.insert(rid.to_vec());
            return BrokerMsg::Ok;
        }
        err(ErrorType::NoMsg)
    }

    /// An acknowledged message left the queue (simplexmq `Server.hs`, `acknowledgeMsg`): counted,
    /// and the queue is active today; the quota marker is not a message. `delivered_at`: when a
    /// subscription delivered it (`None`: a GET, whose delivery is not timed here).
    fn count_received(&self, rid: &[u8], m: &Message, delivered_at: Option<i64>) {
        let Message::Message { notification, .. } = m else {
            return;
        };
        let h = crate::metrics::queue_hash(rid);
        let mut st = self.stats.borrow_mut();
        let mut act = self.activity.borrow_mut();
        st.msg_recv += 1;
        match delivered_at {
            None => st.msg_recv_get += 1,
            Some(at) => self
                .ack_times
                .borrow_mut()
                .record(now_secs().saturating_sub(at).max(0) as u64),
        }
        act.msgs.insert(h);
        if *notification {
            st.msg_recv_ntf += 1;
            act.ntfs.insert(h);
        }
    }

    /// SEND (simplexmq `Server.hs`, `sendMessage`).
    pub(super) async fn send(
        &self,
        session: &Session,
        req: &Request,
        turn: &mut Turn,
    ) -> BrokerMsg {
        let Command::Send { flags, body } = &req.command else {
            return err(ErrorType::Internal);
        };
        let q = match self.lookup(session, req) {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        if let Some(e) = service_refusal(req) {
            return err(e);
        }
        let authorized = match &q.sender_key {
            Some(k) => self.verify_with(session, req, k),
            // Before the queue is secured SEND must be unsigned.
            None => req.authorization.is_empty(),
        };
        if !authorized {
            self.count_auth(&req.command);
            return err(ErrorType::Auth);
        }
        if body.len() > max_message_length(session.version) {
            self.stats.borrow_mut().msg_sent_large += 1;
            return err(ErrorType::LargeMsg);
        }
        match &q.status {
            QueueStatus::Off => {
                self.stats.borrow_mut().msg_sent_auth += 1;
                return err(ErrorType::Auth);
            }
            QueueStatus::Blocked(info) => {
                self.stats.borrow_mut().msg_sent_block += 1;
                return err(ErrorType::Blocked(info.clone()));
            }
            QueueStatus::Active => {}
        }
        let mut q = match self.touch(q).await {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        let rid = q.recipient_id.clone();
        let now = now_secs();
        // One-time invitation data disappears with the first message once the queue is secured.
        if q.link.is_some() && q.is_secured_messaging() {
            if let Some(l) = q.link.take() {
                self.directory
                    .remove(crate::server::directory::IdSpace::Link, &l.link_id, &rid);
            }
            if let Err(e) = self.update(q.clone()).await {
                return err(e);
            }
        }
        let mut id = [0u8; 24];
        id.copy_from_slice(&random_id());
        let msg = Message::Message {
            msg_id: id,
            ts: now,
            notification: flags.notification,
            body: Rc::from(&body[..]),
        };
        // Expired messages go first (simplexmq `Server.hs`, `sendMessage` with `expireMessagesOnSend`).
        let written = if self.settings.expire_on_send {
            let old = now - self.settings.message_ttl.as_secs() as i64;
            self.store
                .expire_and_write(&rid, old, msg.clone(), self.settings.quota)
                .await
        } else {
            let w = self
                .store
                .write(&rid, msg.clone(), self.settings.quota)
                .await;
            w.map(|o| (0, o))
        };
        let outcome = match written {
            Ok((expired, o)) => {
                self.stats.borrow_mut().msg_expired += expired as u64;
                o
            }
            Err(e) => return err(store_error(e)),
        };
        turn.stale_heads.insert(rid.clone());
        match outcome {
            WriteOutcome::Written { was_empty } => {
                {
                    let h = crate::metrics::queue_hash(&rid);
                    let mut st = self.stats.borrow_mut();
                    let mut act = self.activity.borrow_mut();
                    st.msg_sent += 1;
                    act.msgs.insert(h);
                    if flags.notification {
                        st.msg_sent_ntf += 1;
                        act.ntfs.insert(h);
                    }
                }
                if was_empty {
                    self.push(session, &rid, &q.rcv_dh_secret, &msg, turn);
                }
                if flags.notification {
                    if let Some(n) = &q.notifier {
                        self.notify(&rid, (**n).clone(), &msg).await;
                    }
                }
                BrokerMsg::Ok
            }
            WriteOutcome::QuotaMarker { was_empty } => {
                self.stats.borrow_mut().msg_sent_quota += 1;
                if was_empty {
                    let marker = Message::Quota {
                        msg_id: id,
                        ts: now,
                    };
                    self.push(session, &rid, &q.rcv_dh_secret, &marker, turn);
                }
                err(ErrorType::Quota)
            }
            WriteOutcome::Full => {
                self.stats.borrow_mut().msg_sent_quota += 1;
                err(ErrorType::Quota)
            }
        }
    }

    /// Delivers `m`, the new head, to the queue's subscriber if nothing is outstanding there. A push
    /// to the sending connection itself precedes its response (O2); others get an event.
    fn push(&self, session: &Session, rid: &[u8], secret: &[u8; 32], m: &Message, turn: &mut Turn) {
        // A queue of a subscribed service is delivered to the service's connection.
        if !self.service_delivery_sub(rid) {
            return;
        }
        let mut subs = self.subs.borrow_mut();
        let Some(s) = subs.get_mut(rid) else {
            return;
        };
        if s.delivered.is_some() {
            return;
        }
        s.delivered = Some(*m.msg_id());
        s.delivered_at = now_secs();
        let t = msg_transmission(&s.session, b"", rid, secret, m);
        let conn = s.session.conn;
        drop(subs);
        let delivery = self.delivery(rid, m.msg_id());
        if conn == session.conn {
            turn.pushes.push(Group {
                transmissions: vec![t],
                kind: GroupKind::Msg(delivery),
            });
        } else {
            self.send_delivery(conn, t, delivery);
        }
    }
}
