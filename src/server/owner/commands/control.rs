//! The control port's queue operations on the queue's owner (simplexmq `Server.hs`, the control
//! port's `status`, `block`, `unblock` and `delete`), run as jobs holding the queue
//! (`shard::control`), so they take their turn among the queue's commands. Changes go through
//! the store as any command's do, so they persist as the store persists commands.

use super::{store_error, Owner};
use crate::protocol::error::{BlockingInfo, ErrorType};
use crate::protocol::response::BrokerMsg;
use crate::server::control::request::{QueueOp, QueueOutcome};
use crate::server::owner::services::associations_of;
use crate::server::router::encode;
use crate::store::{MessageStore, QueueRec, QueueStatus, QueueStore};

impl<S: QueueStore + MessageStore> Owner<S> {
    /// Runs `op` on the queue `rid`; a queue that is not there (deleted meanwhile) is `AUTH`, as
    /// the reference answers an unknown ID.
    pub async fn control_queue(&self, rid: &[u8], op: QueueOp) -> Result<QueueOutcome, ErrorType> {
        let _record = self
            .hold_records([rid].into_iter())
            .await
            .map_err(super::store_error)?;
        let q = self.store.get(rid).ok_or(ErrorType::Auth)?;
        match op {
            QueueOp::Status => Ok(QueueOutcome::Status {
                status: q.status.clone(),
                updated_at: q.updated_at,
                mode: q.queue_mode,
            }),
            QueueOp::Block(info) => self.control_block(q, info).await,
            QueueOp::Unblock => {
                let was = q.status.clone();
                if let QueueStatus::Blocked(_) = was {
                    let mut q = q;
                    q.status = QueueStatus::Active;
                    self.update(q).await?;
                }
                Ok(QueueOutcome::Unblocked { was })
            }
            QueueOp::Delete => self.control_delete(q).await,
        }
    }

    /// Blocks the queue (whatever its status, unless it is blocked with this very info) and tells
    /// its subscriber `ERR BLOCKED`, without a correlation ID.
    async fn control_block(
        &self,
        q: QueueRec,
        info: BlockingInfo,
    ) -> Result<QueueOutcome, ErrorType> {
        let was = q.status.clone();
        let blocked = QueueStatus::Blocked(info.clone());
        if was == blocked {
            return Ok(QueueOutcome::Blocked { was });
        }
        let rid = q.recipient_id.clone();
        let mut q = q;
        q.status = blocked;
        self.update(q).await?;
        if was == QueueStatus::Active {
            self.stats.borrow_mut().queues_blocked += 1;
        }
        let subscriber = self.subs.borrow().get(&rid).map(|s| s.session.clone());
        if let Some(session) = subscriber {
            let t = encode(
                &session,
                b"",
                &rid,
                &BrokerMsg::Err(ErrorType::Blocked(info)),
            );
            self.send_event(session.conn, vec![vec![t]]);
        }
        Ok(QueueOutcome::Blocked { was })
    }

    /// Deletes the queue, its messages and its notifier's notifications, and forgets its
    /// subscribers without telling them (the reference sends no `DELD` for it): their next
    /// command on it is answered `AUTH`.
    async fn control_delete(&self, q: QueueRec) -> Result<QueueOutcome, ErrorType> {
        let rid = q.recipient_id.clone();
        let messages = self.store.size(&rid);
        self.store.delete(&rid).await.map_err(store_error)?;
        self.release_ids(&q);
        self.forget_queue(&rid);
        let gone = self.services.changed(&rid, associations_of(&q), Vec::new());
        self.tell_home_dropped(gone);
        self.stats.borrow_mut().queues_deleted += 1;
        if let Some(sub) = self.subs.borrow_mut().remove(&rid) {
            if let Some(e) = self.by_conn.borrow_mut().get_mut(&sub.session.conn) {
                e.subs.remove(&rid);
            }
        }
        self.forget_gets(&rid);
        if let Some(n) = &q.notifier {
            let nid = &n.notifier_id;
            self.ntf_backlog.borrow_mut().remove(nid);
            if let Some(s) = self.ntf_subs.borrow_mut().remove(nid) {
                if let Some(e) = self.by_conn.borrow_mut().get_mut(&s.conn) {
                    e.ntf_subs.remove(nid);
                }
            }
        }
        Ok(QueueOutcome::Deleted { messages })
    }
}
