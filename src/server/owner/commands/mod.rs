//! Command semantics on the owner, one file per family, each next to the reference behaviour it
//! implements (simplexmq `Server.hs`, `processCommand`).
//!
//! This file holds the dispatch and the checks every queue command shares, in the reference's order
//! (`verifyQueueTransmission`, then the queue wrapper): queue lookup (missing → dummy verification →
//! AUTH), service signature (none may be present outside service sessions → SERVICE), the key, then
//! the queue's status (BLOCKED) and the daily `updated_at` touch.

pub mod connection;
mod control;
mod deliver;
pub mod forward;
pub use deliver::msg_transmission;
mod link;
mod notify;
mod queue;
pub mod service;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use crate::protocol::command::Command;
use crate::protocol::command::ServiceRole;
use crate::protocol::error::{CommandError, ErrorType};
use crate::protocol::response::BrokerMsg;
use crate::server::messages::ConnMsg;
use crate::server::owner::services::associations_of;
use crate::server::owner::{Owner, Turn};
use crate::server::router::{encode, Forwarded, Group, GroupKind, Request, ServiceCheck, Session};
use crate::store::{EntityId, Message, MessageStore, QueueRec, QueueStatus, QueueStore};

/// Unix seconds now, from the relay's clock (which the tests can move, `src/clock.rs`).
pub use crate::clock::now_secs;

fn err(e: ErrorType) -> BrokerMsg {
    BrokerMsg::Err(e)
}

/// What the connection found of the request's role and service signature (`ServiceCheck`),
/// answered after the queue lookup, as the reference orders it (simplexmq `Server.hs`,
/// `verifyTransmission`).
fn service_refusal(req: &Request) -> Option<ErrorType> {
    match req.service {
        ServiceCheck::Prohibited => Some(ErrorType::Cmd(CommandError::Prohibited)),
        ServiceCheck::Refused => Some(ErrorType::Service),
        ServiceCheck::Plain | ServiceCheck::Signed => None,
    }
}

impl<S: QueueStore + MessageStore> Owner<S> {
    /// Executes one block's requests for this owner and sends the connection its part.
    pub async fn process(&self, session: Session, block_seq: u64, requests: Vec<Request>) {
        let rids = requests.iter().filter_map(|r| r.recipient_id.as_deref());
        // Without its queues' records the part cannot be decided: each request is answered the
        // store's error (never AUTH, which would say the queue is gone).
        let turn = match self
            .hold_records_or_log(rids, "a block part is answered ERR STORE")
            .await
        {
            Ok(_records) => self.run_part(&session, requests).await,
            Err(e) => self.refused(&session, requests, e),
        };
        if turn.close {
            tracing::warn!(
                "a change's outcome is unknown (its journal sync failed): its connection is \
                 closed without an answer"
            );
            self.mesh
                .send(session.conn.shard, ConnMsg::Close { conn: session.conn });
            return;
        }
        let groups = pack_turn(turn);
        self.mesh.send(
            session.conn.shard,
            ConnMsg::Reply {
                conn: session.conn,
                block_seq,
                groups,
            },
        );
    }

    /// Runs a block part whose queues' records are held.
    async fn run_part(&self, session: &Session, mut requests: Vec<Request>) -> Turn {
        if self.directory.is_cache() {
            self.drop_stale_ids(&mut requests);
        }
        self.batch_verify(session, &mut requests);
        self.pre_verify_subs(session, &mut requests);
        self.associate_part(session, &mut requests).await;
        let mut prefetched = self.prefetch_subs(&requests).await;
        let items = requests
            .into_iter()
            .enumerate()
            .map(|(i, req)| (i, req, prefetched.remove(&i)));
        let mut turn = if self.store.waits() {
            self.run_side_by_side(session, items.collect()).await
        } else {
            let mut turn = Turn::default();
            for (_, req, head) in items {
                let t = self.run_request(session, req, head, &mut turn).await;
                turn.responses.push(t);
            }
            turn
        };
        // A SUB's first message goes out after the part's responses (O4); a later request of the same
        // turn may have acknowledged it, deleted the queue or subscribed again. Only a delivery that
        // is still its subscription's outstanding one is sent (I4: an ACKed message never again).
        turn.sub_msgs
            .retain(|(_, d)| self.is_outstanding(session.conn, d));
        turn
    }

    /// Runs one request of `session`'s block; returns its encoded answer.
    async fn run_request(
        &self,
        session: &Session,
        mut req: Request,
        head: Option<Option<Message>>,
        turn: &mut Turn,
    ) -> Vec<u8> {
        let corr_id = req.corr_id.clone();
        // A forwarded request (RFWD) runs in the forwarded session and its answer is sealed
        // into RRES for the proxy (`commands/forward.rs`).
        let fwd = req.forward.take();
        let exec_session = fwd.as_ref().map_or(session, |f| &f.inner);
        let (entity, msg) = self.execute(exec_session, req, head, turn).await;
        if matches!(&msg, BrokerMsg::Err(ErrorType::Store(s)) if s == crate::store::OUTCOME_UNKNOWN)
        {
            // The store made the change and cannot say whether it will survive a crash: no
            // answer, the connection is closed (`Turn::close`), as a crash would do.
            turn.close = true;
        }
        self.answer(session, fwd.as_deref(), &corr_id, &entity, &msg)
    }

    /// A turn on a store that waits (`MessageStore::waits`): the requests of each queue run in
    /// block order, one *chain* per queue, and the chains run side by side in rounds, so that the
    /// store gets the SENDs and ACKs of the block together (`docs/ARCHITECTURE.md` §2). Requests
    /// without a queue are chains of their own. Answers keep block order.
    async fn run_side_by_side(
        &self,
        session: &Session,
        items: Vec<(usize, Request, Option<Option<Message>>)>,
    ) -> Turn {
        type Chain = Vec<(usize, Request, Option<Option<Message>>)>;
        let n = items.len();
        let mut chains: Vec<Chain> = Vec::new();
        let mut of_queue: HashMap<EntityId, usize> = HashMap::new();
        for item in items {
            let c = match item.1.recipient_id.clone() {
                Some(rid) => *of_queue.entry(rid).or_insert_with(|| {
                    chains.push(Vec::new());
                    chains.len() - 1
                }),
                None => {
                    chains.push(Vec::new());
                    chains.len() - 1
                }
            };
            chains[c].push(item);
        }
        let runs: Vec<ChainRun<'_>> = chains
            .into_iter()
            .map(|chain| {
                Box::pin(async move {
                    let mut turn = Turn::default();
                    let mut answers = Vec::with_capacity(chain.len());
                    for (i, req, head) in chain {
                        answers.push((i, self.run_request(session, req, head, &mut turn).await));
                    }
                    (answers, turn)
                }) as ChainRun<'_>
            })
            .collect();
        let mut answers: Vec<Vec<u8>> = vec![Vec::new(); n];
        let mut turn = Turn::default();
        for (done, t) in in_rounds(&self.store, runs).await {
            for (i, a) in done {
                answers[i] = a;
            }
            turn.sub_msgs.extend(t.sub_msgs);
            turn.pushes.extend(t.pushes);
            turn.trailing.extend(t.trailing);
            turn.close |= t.close;
        }
        turn.responses = answers;
        turn
    }

    /// The periodic expiration of messages and notifications (simplexmq `Server.hs`,
    /// `expireMessages`), in one job over every queue (a store that never waits; on one that
    /// waits the shard runs [`Owner::expire_queues`] in bounded jobs instead). A subscriber whose
    /// delivered message expired keeps waiting for its ACK, as in the reference; the ACK then
    /// returns the new head.
    pub async fn expire(&self) {
        if let Ok(n) = self.store.expire_all(self.messages_older_than()).await {
            self.stats.borrow_mut().msg_expired += n as u64;
        }
        self.expire_ntfs().await;
    }

    /// Part of the periodic expiration: the messages of `recipient_ids`.
    pub async fn expire_queues(&self, recipient_ids: &[EntityId]) {
        let old = self.messages_older_than();
        if let Ok(n) = self.store.expire_queues(recipient_ids, old).await {
            self.stats.borrow_mut().msg_expired += n as u64;
        }
    }

    /// Part of the periodic expiration: the notifications.
    pub async fn expire_ntfs(&self) {
        let old = now_secs() - self.settings.notification_ttl.as_secs() as i64;
        if let Ok(n) = self.store.expire_ntfs(old).await {
            self.stats.borrow_mut().msg_ntf_expired += n as u64;
        }
    }

    fn messages_older_than(&self) -> i64 {
        now_secs() - self.settings.message_ttl.as_secs() as i64
    }

    /// Runs one request; returns the entity ID to answer with and the response.
    pub(super) async fn execute(
        &self,
        session: &Session,
        req: Request,
        head: Option<Option<Message>>,
        turn: &mut Turn,
    ) -> (Vec<u8>, BrokerMsg) {
        let entity = req.entity_id.clone();
        let msg = match &req.command {
            Command::New(_) => self.new_queue(session, &req, turn).await,
            Command::Send { .. } => self.send(session, &req, turn).await,
            Command::SKey(_) | Command::LKey(_) | Command::LGet => {
                self.sender_link_command(session, &req, turn).await
            }
            Command::NSub => self.nsub(session, &req, turn).await,
            Command::Sub
            | Command::Get
            | Command::Ack(_)
            | Command::Key(_)
            | Command::RKey(_)
            | Command::LSet { .. }
            | Command::LDel
            | Command::NKey { .. }
            | Command::NDel
            | Command::Off
            | Command::Del
            | Command::Que => self.recipient_command(session, &req, head, turn).await,
            // The connection answers the rest itself; nothing else is routed to an owner.
            _ => err(ErrorType::Internal),
        };
        (entity, msg)
    }

    /// Requests that a directory cache routed to a queue which no longer has their ID (an entry
    /// made from a look-up that crossed the queue's deletion or the ID's change) are requests for
    /// an unknown ID, and the entry goes.
    fn drop_stale_ids(&self, requests: &mut [Request]) {
        use crate::server::directory::IdSpace;
        for r in requests.iter_mut() {
            let Some(space) = IdSpace::of(r.command.facts().entity) else {
                continue;
            };
            let Some(rid) = r.recipient_id.as_deref() else {
                continue;
            };
            let id = &r.entity_id[..];
            let holds = self.store.with_queue(rid, |q| match space {
                IdSpace::Sender => q.sender_id == id,
                IdSpace::Link => q.link.as_ref().is_some_and(|l| l.link_id == id),
                IdSpace::Notifier => q.notifier.as_ref().is_some_and(|n| n.notifier_id == id),
            });
            if holds != Some(true) {
                self.directory.remove(space, id, rid);
                r.recipient_id = None;
            }
        }
    }

    /// Finds the queue a sender, link or notifier request resolved to, or dummy-verifies.
    fn lookup(&self, session: &Session, req: &Request) -> Result<QueueRec, ErrorType> {
        match req
            .recipient_id
            .as_deref()
            .and_then(|rid| self.store.get(rid))
        {
            Some(q) => Ok(q.clone()),
            None => {
                self.dummy_verify(session, req);
                self.count_auth(&req.command);
                Err(ErrorType::Auth)
            }
        }
    }

    /// A failed verification of SEND, SUB, NSUB or GET, counted as the reference counts them
    /// (simplexmq `Server.hs`, `verified`).
    pub(super) fn count_auth(&self, command: &Command) {
        let mut st = self.stats.borrow_mut();
        match command {
            Command::Send { .. } => st.msg_sent_auth += 1,
            Command::Sub => st.sub_auth += 1,
            Command::NSub => st.ntf_sub_auth += 1,
            Command::Get => st.msg_get_auth += 1,
            _ => {}
        }
    }

    async fn recipient_command(
        &self,
        session: &Session,
        req: &Request,
        head: Option<Option<Message>>,
        turn: &mut Turn,
    ) -> BrokerMsg {
        let q = match self.lookup(session, req) {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        if let Some(e) = service_refusal(req) {
            return err(e);
        }
        if !self.verify_recipient(session, req, &q.recipient_id, &q.recipient_keys) {
            self.count_auth(&req.command);
            return err(ErrorType::Auth);
        }
        let rid = q.recipient_id.clone();
        // OFF and DEL do not go through the status check (an operator-blocked queue can still be
        // deleted by its owner).
        match &req.command {
            Command::Off => return self.off(q).await,
            Command::Del => return self.del(session, q, turn).await,
            _ => {}
        }
        // A SUB moves the queue to the session's service, or out of any service from an ordinary
        // session, before the status check (simplexmq `Server.hs`, `prepareBatchSubs`).
        let (q, newly) = match &req.command {
            Command::Sub => match self.associate(session, q).await {
                Ok((q, changed)) => {
                    if !changed && !req.associated {
                        let s = session.service.as_ref().map(|s| s.service_id.as_slice());
                        self.count_association(ServiceRole::Messaging, s, s);
                    }
                    (q, changed || req.associated)
                }
                Err(e) => return err(e),
            },
            _ => (q, false),
        };
        let q = match self.queue_wrapper(q).await {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        match &req.command {
            Command::Sub => {
                let answer = self.sub(session, &rid, head, turn).await;
                if matches!(answer, BrokerMsg::Sok(_)) {
                    self.tell_home_subscribed(session, ServiceRole::Messaging, &rid, newly);
                }
                answer
            }
            Command::Get => self.get(session, &rid).await,
            Command::Ack(msg_id) => {
                self.ack(session, &rid, msg_id, req.undelivered.as_ref(), turn)
                    .await
            }
            Command::Key(k) => self.key(q, k.clone()).await,
            Command::RKey(keys) => self.rkey(q, keys.clone()).await,
            Command::LSet {
                link_id,
                fixed,
                user,
            } => {
                self.lset(q, link_id.clone(), fixed.clone(), user.clone())
                    .await
            }
            Command::LDel => self.ldel(q).await,
            Command::NKey { key, dh } => self.nkey(session, q, key.clone(), *dh).await,
            Command::NDel => self.ndel(session, q).await,
            Command::Que => self.que(session, &q).await,
            _ => err(ErrorType::Internal),
        }
    }

    /// The reference's common queue wrapper: blocked queues answer BLOCKED, and `updated_at` is
    /// written when the day changed (at most one write per queue per day).
    async fn queue_wrapper(&self, q: QueueRec) -> Result<QueueRec, ErrorType> {
        if let QueueStatus::Blocked(info) = &q.status {
            return Err(ErrorType::Blocked(info.clone()));
        }
        self.touch(q).await
    }

    async fn touch(&self, mut q: QueueRec) -> Result<QueueRec, ErrorType> {
        let today = now_secs() / 86400 * 86400;
        if q.updated_at != Some(today) {
            q.updated_at = Some(today);
            self.update(q.clone()).await?;
        }
        Ok(q)
    }

    /// Sets the queue's messaging service to `session`'s (none for an ordinary session) when it
    /// differs, durably (simplexmq `Server.hs`, `prepareBatchSubs`, `setQueueServices`); true if
    /// it changed.
    async fn associate(
        &self,
        session: &Session,
        mut q: QueueRec,
    ) -> Result<(QueueRec, bool), ErrorType> {
        let service = session.service.as_ref().map(|s| &s.service_id);
        let changed = q.rcv_service_id.as_ref() != service;
        if changed {
            let (was, now) = (q.rcv_service_id.as_deref(), service.map(Vec::as_slice));
            self.count_association(ServiceRole::Messaging, was, now);
            q.rcv_service_id = service.cloned();
            // The day's `updated_at` goes with it, so that the SUB writes the record once.
            q.updated_at = Some(now_secs() / 86400 * 86400);
            self.update(q.clone()).await?;
        }
        Ok((q, changed))
    }

    /// As `associate`, for the queue's notifier and NSUB.
    async fn associate_notifier(
        &self,
        session: &Session,
        mut q: QueueRec,
    ) -> Result<bool, ErrorType> {
        let service = session.service.as_ref().map(|s| &s.service_id);
        let Some(n) = q.notifier.as_mut() else {
            return Ok(false);
        };
        let changed = n.ntf_service_id.as_ref() != service;
        if changed {
            let (was, now) = (n.ntf_service_id.as_deref(), service.map(Vec::as_slice));
            self.count_association(ServiceRole::Notifier, was, now);
            n.ntf_service_id = service.cloned();
            self.update(q).await?;
        }
        Ok(changed)
    }

    /// Makes a record change durable.
    async fn update(&self, q: QueueRec) -> Result<(), ErrorType> {
        let before = self
            .store
            .with_queue(&q.recipient_id, associations_of)
            .unwrap_or_default();
        let after = associations_of(&q);
        let rid = (before != after).then(|| q.recipient_id.clone());
        self.store.update(q).await.map_err(store_error)?;
        if let Some(rid) = rid {
            let gone = self.services.changed(&rid, before, after);
            self.tell_home_dropped(gone);
        }
        Ok(())
    }
}

pub(crate) fn store_error(e: crate::store::StoreError) -> ErrorType {
    match e {
        crate::store::StoreError::Duplicate | crate::store::StoreError::NotFound => ErrorType::Auth,
        crate::store::StoreError::Failed(s) => ErrorType::Store(s),
        // Never sent: the request's turn closes the connection instead (`Owner::process`).
        crate::store::StoreError::Uncertain(_) => {
            ErrorType::Store(crate::store::OUTCOME_UNKNOWN.into())
        }
    }
}

/// 24 random bytes: queue, link, notifier and message IDs.
pub fn random_id() -> EntityId {
    use rand::RngCore;
    let mut id = vec![0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut id);
    id
}

/// The block layout of a turn (`docs/ARCHITECTURE.md` §3, O2 and O4): pushes first, each alone;
/// then the responses, with the SUBs' first messages in the same group when the part has at most 4
/// responses, else one block per message after them.
/// One chain of [`Owner::run_side_by_side`]: its answers by position, and its part of the turn.
type ChainRun<'a> = Pin<Box<dyn Future<Output = (Vec<(usize, Vec<u8>)>, Turn)> + 'a>>;

/// Runs `runs` to their ends side by side. Each poll of them is one round of `store`
/// (`MessageStore::begin_round`): what they ask of the store in it goes out together when it ends.
async fn in_rounds<S: MessageStore, T>(
    store: &S,
    mut runs: Vec<Pin<Box<dyn Future<Output = T> + '_>>>,
) -> Vec<T> {
    let mut out: Vec<Option<T>> = runs.iter().map(|_| None).collect();
    let mut left: Vec<usize> = (0..runs.len()).collect();
    std::future::poll_fn(|cx| {
        store.begin_round();
        left.retain(|&i| match runs[i].as_mut().poll(cx) {
            Poll::Ready(v) => {
                out[i] = Some(v);
                false
            }
            Poll::Pending => true,
        });
        store.end_round();
        if left.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

impl<S: QueueStore + MessageStore> Owner<S> {
    /// `msg` encoded for `session`, sealed into RRES for the proxy when the request was forwarded
    /// (`commands/forward.rs`; a sealed answer counts as the reference's `pMsgFwdsRecv`).
    fn answer(
        &self,
        session: &Session,
        fwd: Option<&Forwarded>,
        corr_id: &[u8],
        entity: &[u8],
        msg: &BrokerMsg,
    ) -> Vec<u8> {
        match fwd {
            Some(f) => {
                let (t, sealed) = forward::respond(session, f, corr_id, entity, msg);
                if sealed {
                    self.stats.borrow_mut().p_msg_fwds_recv += 1;
                }
                t
            }
            None => encode(session, corr_id, entity, msg),
        }
    }

    /// A part whose requests are each answered the store's error `e`.
    fn refused(
        &self,
        session: &Session,
        requests: Vec<Request>,
        e: crate::store::StoreError,
    ) -> Turn {
        let msg = err(store_error(e));
        let responses = requests
            .into_iter()
            .map(|mut req| {
                let fwd = req.forward.take();
                self.answer(session, fwd.as_deref(), &req.corr_id, &req.entity_id, &msg)
            })
            .collect();
        Turn {
            responses,
            ..Turn::default()
        }
    }
}

fn pack_turn(turn: Turn) -> Vec<Group> {
    let Turn {
        responses,
        sub_msgs,
        pushes,
        trailing,
        ..
    } = turn;
    let mut groups = pushes;
    if responses.len() <= 4 {
        let mut g = responses;
        g.extend(sub_msgs.into_iter().map(|(m, _)| m));
        if !g.is_empty() {
            groups.push(Group::plain(g));
        }
    } else {
        groups.push(Group::plain(responses));
        groups.extend(sub_msgs.into_iter().map(|(m, d)| Group {
            transmissions: vec![m],
            kind: GroupKind::Msg(d),
        }));
    }
    groups.extend(trailing);
    groups
}
