//! The in-memory store of one shard (`DESIGN.md` §4, `reference/smp-server-behaviour.md` §5.2): queue
//! records, their messages and pending notifications as plain data, for tests and ephemeral relays.
//! It is saved at a clean stop and restored at start by `persist` (one file per partition group).
//!
//! Bounds: a queue holds at most `quota + 1` messages (the quota marker counts in its size and closes
//! the queue to writes until it is drained), so the messages of a store are bounded by
//! `queue_count × (quota + 1)`. Pending notifications are bounded per notifier by
//! [`MAX_NTFS_PER_NOTIFIER`] (the oldest is dropped beyond it) and by their expiry.

use std::collections::{HashMap, VecDeque};

use super::{
    EntityId, Message, MessageStore, MsgId, MsgNtf, QueueRec, QueueStore, StoreCounters,
    StoreError, WriteOutcome,
};

/// Notifications kept per notifier ID. The reference keeps them unbounded until their 24 h expiry;
/// a notifier that never subscribes should not be able to grow a shard's memory without limit, so
/// beyond this the oldest is dropped (a notification is a hint, the message itself stays queued).
pub const MAX_NTFS_PER_NOTIFIER: usize = 4096;

/// One queue: its record and its messages in arrival order.
#[derive(Debug, Clone)]
struct Queue {
    rec: QueueRec,
    msgs: VecDeque<Message>,
    /// False once a quota marker was written; writes resume only when the queue is empty again
    /// (§4.1). Always equal to "the last message is not a marker" — the marker never expires and
    /// only leaves the queue as its last message — which is why the saved form does not store it.
    can_write: bool,
}

impl Queue {
    fn new(rec: QueueRec) -> Self {
        Queue {
            rec,
            msgs: VecDeque::new(),
            can_write: true,
        }
    }
}

/// Queue records, messages and notifications of the partition groups one shard owns.
#[derive(Debug, Default)]
pub struct MemoryStore {
    queues: HashMap<EntityId, Queue>,
    /// Pending notifications per notifier ID, oldest first.
    ntfs: HashMap<EntityId, VecDeque<MsgNtf>>,
    /// Messages (markers included) over all queues, kept in step with every change.
    total_messages: usize,
    counters: StoreCounters,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Deletes head messages older than `older_than`, stopping at the quota marker (markers never
    /// expire: they keep a dormant full queue closed to writes, §4.2).
    fn expire_queue(q: &mut Queue, older_than: i64) -> usize {
        let mut n = 0;
        while let Some(Message::Message { ts, .. }) = q.msgs.front() {
            if *ts >= older_than {
                break;
            }
            q.msgs.pop_front();
            n += 1;
        }
        n
    }

    /// Deletes the head if its ID is `msg_id`.
    fn del_head(&mut self, recipient_id: &[u8], msg_id: &MsgId) -> Option<(Message, &Queue)> {
        let q = self.queues.get_mut(recipient_id)?;
        if q.msgs.front().map(Message::msg_id) != Some(msg_id) {
            return None;
        }
        let m = q.msgs.pop_front()?;
        self.total_messages -= 1;
        Some((m, q))
    }

    /// Restores a queue with its messages (used by `persist::load`); `can_write` follows from the
    /// last message.
    #[allow(dead_code)]
    fn insert_loaded(&mut self, rec: QueueRec, msgs: VecDeque<Message>) {
        let can_write = !matches!(msgs.back(), Some(Message::Quota { .. }));
        self.total_messages += msgs.len();
        let rid = rec.recipient_id.clone();
        self.queues.insert(
            rid,
            Queue {
                rec,
                msgs,
                can_write,
            },
        );
    }

    fn push_ntf(&mut self, notifier_id: &[u8], ntf: MsgNtf) {
        let list = self.ntfs.entry(notifier_id.to_vec()).or_default();
        if list.len() >= MAX_NTFS_PER_NOTIFIER {
            list.pop_front();
        }
        list.push_back(ntf);
    }
}

impl QueueStore for MemoryStore {
    fn get(&self, recipient_id: &[u8]) -> Option<&QueueRec> {
        self.queues.get(recipient_id).map(|q| &q.rec)
    }

    fn all(&self) -> Box<dyn Iterator<Item = &QueueRec> + '_> {
        Box::new(self.queues.values().map(|q| &q.rec))
    }

    fn queue_count(&self) -> usize {
        self.queues.len()
    }

    async fn create(&mut self, rec: QueueRec) -> Result<(), StoreError> {
        if self.queues.contains_key(&rec.recipient_id) {
            return Err(StoreError::Duplicate);
        }
        self.queues
            .insert(rec.recipient_id.clone(), Queue::new(rec));
        Ok(())
    }

    async fn update(&mut self, rec: QueueRec) -> Result<(), StoreError> {
        let q = self
            .queues
            .get_mut(&rec.recipient_id)
            .ok_or(StoreError::NotFound)?;
        q.rec = rec;
        Ok(())
    }

    async fn delete(&mut self, recipient_id: &[u8]) -> Result<QueueRec, StoreError> {
        let q = self
            .queues
            .remove(recipient_id)
            .ok_or(StoreError::NotFound)?;
        self.total_messages -= q.msgs.len();
        if let Some(n) = &q.rec.notifier {
            self.ntfs.remove(&n.notifier_id);
        }
        Ok(q.rec)
    }
}

impl MessageStore for MemoryStore {
    async fn write(
        &mut self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError> {
        self.counters.writes += 1;
        let q = self
            .queues
            .get_mut(recipient_id)
            .ok_or(StoreError::NotFound)?;
        let was_empty = q.msgs.is_empty();
        // §4.1: a queue closed by a marker opens again only once drained, marker included.
        if !(q.can_write || was_empty) {
            return Ok(WriteOutcome::Full);
        }
        let outcome = if q.msgs.len() < quota {
            q.msgs.push_back(msg);
            q.can_write = true;
            WriteOutcome::Written { was_empty }
        } else {
            // The marker takes the rejected message's ID and time, so the recipient can tell
            // the sender from which message on to resend.
            q.msgs.push_back(Message::Quota {
                msg_id: *msg.msg_id(),
                ts: msg.ts(),
            });
            q.can_write = false;
            WriteOutcome::QuotaMarker { was_empty }
        };
        self.total_messages += 1;
        debug_assert!(
            q.can_write || matches!(q.msgs.back(), Some(Message::Quota { .. })),
            "a queue closed to writes ends with its marker"
        );
        Ok(outcome)
    }

    async fn peek_first(&mut self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        self.counters.peek_first += 1;
        Ok(self
            .queues
            .get(recipient_id)
            .and_then(|q| q.msgs.front().cloned()))
    }

    async fn peek_first_many(
        &mut self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        self.counters.peek_first_many += 1;
        Ok(recipient_ids
            .iter()
            .map(|rid| self.queues.get(*rid).and_then(|q| q.msgs.front().cloned()))
            .collect())
    }

    async fn try_del(
        &mut self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError> {
        self.counters.deletes += 1;
        Ok(self.del_head(recipient_id, msg_id).map(|(m, _)| m))
    }

    async fn try_del_peek(
        &mut self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        self.counters.deletes += 1;
        match self.del_head(recipient_id, msg_id) {
            Some((m, q)) => Ok((Some(m), q.msgs.front().cloned())),
            None => Ok((
                None,
                self.queues
                    .get(recipient_id)
                    .and_then(|q| q.msgs.front().cloned()),
            )),
        }
    }

    async fn delete_expired(
        &mut self,
        recipient_id: &[u8],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        let n = match self.queues.get_mut(recipient_id) {
            Some(q) => Self::expire_queue(q, older_than),
            None => 0,
        };
        self.total_messages -= n;
        Ok(n)
    }

    fn size(&self, recipient_id: &[u8]) -> usize {
        self.queues.get(recipient_id).map_or(0, |q| q.msgs.len())
    }

    fn total_messages(&self) -> usize {
        self.total_messages
    }

    async fn expire_all(&mut self, older_than: i64) -> Result<usize, StoreError> {
        let n: usize = self
            .queues
            .values_mut()
            .map(|q| Self::expire_queue(q, older_than))
            .sum();
        self.total_messages -= n;
        Ok(n)
    }

    async fn add_ntf(&mut self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError> {
        self.push_ntf(notifier_id, ntf);
        Ok(())
    }

    async fn take_ntfs(&mut self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError> {
        Ok(self
            .ntfs
            .remove(notifier_id)
            .map(Vec::from)
            .unwrap_or_default())
    }

    async fn delete_ntfs(&mut self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        Ok(self.ntfs.remove(notifier_id).map_or(0, |l| l.len()))
    }

    fn ntf_ids(&self) -> Vec<EntityId> {
        self.ntfs
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    async fn expire_ntfs(&mut self, older_than: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        self.ntfs.retain(|_, list| {
            let before = list.len();
            list.retain(|ntf| ntf.ts >= older_than);
            n += before - list.len();
            !list.is_empty()
        });
        Ok(n)
    }

    fn counters(&self) -> &StoreCounters {
        &self.counters
    }
}
