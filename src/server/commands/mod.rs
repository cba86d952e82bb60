//! Command semantics on the owner, one file per family, each next to the reference behaviour it
//! implements (simplexmq `Server.hs`, `processCommand`).
//!
//! This file holds the dispatch and the checks every queue command shares, in the reference's order
//! (`verifyQueueTransmission`, then the queue wrapper): queue lookup (missing → dummy verification →
//! AUTH), service signature (none may be present outside service sessions → SERVICE), the key, then
//! the queue's status (BLOCKED) and the daily `updated_at` touch.

pub mod connection;
mod deliver;
pub mod forward;
pub use deliver::msg_transmission;
mod link;
mod notify;
pub(crate) use notify::nmsg;
mod queue;

use super::owner::{Owner, Turn};
use super::router::{Request, Session};
use crate::protocol::command::Command;
use crate::protocol::error::ErrorType;
use crate::protocol::response::BrokerMsg;
use crate::store::{EntityId, Message, MessageStore, QueueRec, QueueStatus, QueueStore};

/// Unix seconds now, from the relay's clock (which the tests can move, `src/clock.rs`).
pub use crate::clock::now_secs;

fn err(e: ErrorType) -> BrokerMsg {
    BrokerMsg::Err(e)
}

impl<S: QueueStore + MessageStore> Owner<S> {
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
                Err(ErrorType::Auth)
            }
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
        if req.service_sig {
            return err(ErrorType::Service);
        }
        if !self.verify_recipient(session, req, &q.recipient_id, &q.recipient_keys) {
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
        let q = match self.queue_wrapper(q).await {
            Ok(q) => q,
            Err(e) => return err(e),
        };
        match &req.command {
            Command::Sub => self.sub(session, &rid, head, turn).await,
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

    /// Makes a record change durable.
    async fn update(&self, q: QueueRec) -> Result<(), ErrorType> {
        self.store.update(q).await.map_err(store_error)
    }
}

pub(crate) fn store_error(e: crate::store::StoreError) -> ErrorType {
    match e {
        crate::store::StoreError::Duplicate | crate::store::StoreError::NotFound => ErrorType::Auth,
        crate::store::StoreError::Failed(s) => ErrorType::Store(s),
    }
}

/// 24 random bytes: queue, link, notifier and message IDs.
pub fn random_id() -> EntityId {
    use rand::RngCore;
    let mut id = vec![0u8; 24];
    rand::rngs::OsRng.fill_bytes(&mut id);
    id
}
