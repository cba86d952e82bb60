//! The in-memory store of one shard (`docs/ARCHITECTURE.md` §5; the reference's is simplexmq
//! `Server/MsgStore/STM.hs`): queue records, their messages and pending notifications as plain
//! data, for tests and ephemeral relays. It is saved at a clean stop and restored at start by
//! `persist` (one file per partition group).
//!
//! Bounds: a queue holds at most `quota + 1` messages (the quota marker counts in its size and closes
//! the queue to writes until it is drained), so the messages of a store are bounded by
//! `queue_count × (quota + 1)`. Pending notifications are bounded per notifier by
//! [`MAX_NTFS_PER_NOTIFIER`] (the oldest is dropped beyond it) and by their expiry.

pub(crate) mod persist;
pub(crate) mod queue_log;

pub use persist::{
    group_file, group_files_present, set_aside_saved, set_status_offline, OfflineId, PersistError,
    SaveError, FORMAT_VERSION, MEMORY_STORE_DIR, NTF_TTL_SECS,
};

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use super::cache::RecordCache;
use super::codec::{pack_rec, packed_notifier_id, unpack_rec};
use super::id::{IdKey, Sparse};
use super::{
    group_of, EntityId, Message, MessageStore, MsgId, MsgNtf, QueueData, QueueRec, QueueStore,
    StoreCounters, StoreError, WriteOutcome,
};

/// Notifications kept per notifier ID. The reference keeps them unbounded until their 24 h expiry;
/// a notifier that never subscribes should not be able to grow a shard's memory without limit, so
/// beyond this the oldest is dropped (a notification is a hint, the message itself stays queued).
pub const MAX_NTFS_PER_NOTIFIER: usize = 4096;

/// One queue: its record, packed (`codec.rs`: every queue is kept, so an idle one should cost
/// little; the records of queues in use are kept decoded in `MemoryData::records`), and its
/// messages in arrival order.
#[derive(Debug, Clone)]
struct Queue {
    rec: Box<[u8]>,
    msgs: Sparse<Message>,
    /// False once a quota marker was written; writes resume only when the queue is empty again
    /// (the reference's `writeMsg`, simplexmq `Server/MsgStore/STM.hs`). Always equal to "the last
    /// message is not a marker" — the marker never expires and only leaves the queue as its last
    /// message — which is why the saved form does not store it.
    can_write: bool,
}

impl Queue {
    fn new(rec: &QueueRec) -> Self {
        Queue {
            rec: pack_rec(rec),
            msgs: Sparse::default(),
            can_write: true,
        }
    }

    /// The record of this queue, whose recipient ID is `rid`.
    pub(crate) fn record(&self, rid: &[u8]) -> QueueRec {
        // Packed by this store from a record a moment ago: it always unpacks.
        unpack_rec(rid, &self.rec).unwrap_or_else(|_| unreachable!("a packed record unpacks"))
    }

    pub(crate) fn notifier_id(&self) -> Option<&[u8]> {
        packed_notifier_id(&self.rec).unwrap_or_else(|_| unreachable!("a packed record unpacks"))
    }
}

/// Queue records, messages and notifications of the partition groups one shard owns, behind a
/// `RefCell` (the store traits take `&self`, `store/mod.rs`). No borrow outlives a method: none of
/// them awaits.
#[derive(Debug, Default)]
pub struct MemoryStore {
    data: RefCell<MemoryData>,
    /// The queue log, when the store keeps queues over a restart (`queue_log.rs`).
    log: Option<queue_log::QueueLog>,
}

/// The memory store's data.
#[derive(Debug, Default)]
pub(crate) struct MemoryData {
    queues: HashMap<IdKey, Queue, foldhash::quality::RandomState>,
    /// The records of the queues used lately, unpacked (`store/cache.rs`).
    records: RefCell<RecordCache>,
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

    fn from_data(data: MemoryData) -> Self {
        MemoryStore {
            data: RefCell::new(data),
            log: None,
        }
    }

    /// Replaces the records of existing queues (a block's service associations): one log append
    /// and one wait per group, not one per queue.
    async fn update_many(&self, recs: Vec<QueueRec>) -> Result<Vec<QueueRec>, StoreError> {
        let mut by_group: std::collections::BTreeMap<u32, Vec<QueueRec>> = Default::default();
        for r in recs {
            by_group
                .entry(group_of(&r.recipient_id))
                .or_default()
                .push(r);
        }
        let mut waits = Vec::new();
        let mut out = Vec::new();
        for (g, recs) in by_group {
            let bytes: Vec<Vec<u8>> = recs.iter().map(queue_log::encode).collect();
            let records: Vec<_> = recs
                .iter()
                .zip(&bytes)
                .map(|(r, b)| queue_log::change_record(r, b, false))
                .collect();
            if let Some(log) = &self.log {
                waits.push((g, log.append(g, &records)?));
            }
            let mut data = self.data.borrow_mut();
            for r in recs {
                data.update(r.clone())?;
                out.push(r);
            }
        }
        if let Some(log) = &self.log {
            for (g, end) in waits {
                log.wait(g, end).await?;
            }
        }
        Ok(out)
    }

    /// Appends a queue change to the log (if any) before `apply` changes the store, then waits
    /// for it to be durable as `--fsync` says.
    async fn logged<R>(
        &self,
        g: u32,
        recs: &[smp_journal::Record<'_>],
        apply: impl FnOnce(&mut MemoryData) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let Some(log) = &self.log else {
            return apply(&mut self.data.borrow_mut());
        };
        let end = log.append(g, recs)?;
        let r = apply(&mut self.data.borrow_mut())?;
        log.wait(g, end).await?;
        Ok(r)
    }
}

impl MemoryData {
    /// The record of queue `rid`, from the cache of recently used records or unpacked.
    fn record_of(&self, rid: &[u8]) -> Option<Rc<QueueRec>> {
        // A cached record is of a queue that exists: a delete forgets it.
        if let Some(r) = self.records.borrow_mut().get(rid) {
            return Some(r);
        }
        let q = self.queues.get(rid)?;
        let rec = Rc::new(q.record(rid));
        self.records.borrow_mut().put(rid, rec.clone());
        Some(rec)
    }

    /// Deletes head messages older than `older_than`, stopping at the quota marker (markers never
    /// expire: they keep a dormant full queue closed to writes, as in simplexmq `Server.hs`).
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
    fn insert_loaded(&mut self, rec: QueueRec, msgs: VecDeque<Message>) {
        let can_write = !matches!(msgs.back(), Some(Message::Quota { .. }));
        self.total_messages += msgs.len();
        self.records.get_mut().forget(&rec.recipient_id);
        self.queues.insert(
            IdKey::new(&rec.recipient_id),
            Queue {
                rec: pack_rec(&rec),
                msgs: msgs.into(),
                can_write,
            },
        );
    }

    /// Puts a queue back as exported (`ShardStore::restore`): no quota rule, no notification
    /// bound, `can_write` from the last message as at load.
    pub(crate) fn restore(&mut self, q: QueueData) -> Result<(), StoreError> {
        if self.queues.contains_key(&q.rec.recipient_id[..]) {
            return Err(StoreError::Duplicate);
        }
        q.check()?;
        let QueueData { rec, msgs, ntfs } = q;
        // `check` made sure that notifications come with a notifier.
        if let Some(n) = rec.notifier.as_ref().filter(|_| !ntfs.is_empty()) {
            if self.ntfs.contains_key(&n.notifier_id) {
                return Err(StoreError::Duplicate);
            }
            self.ntfs.insert(n.notifier_id.clone(), ntfs.into());
        }
        self.insert_loaded(rec, msgs.into());
        Ok(())
    }

    fn push_ntf(&mut self, notifier_id: &[u8], ntf: MsgNtf) {
        let list = self.ntfs.entry(notifier_id.to_vec()).or_default();
        if list.len() >= MAX_NTFS_PER_NOTIFIER {
            list.pop_front();
        }
        list.push_back(ntf);
    }
}

impl MemoryData {
    fn create(&mut self, rec: QueueRec) -> Result<(), StoreError> {
        if self.queues.contains_key(&rec.recipient_id[..]) {
            return Err(StoreError::Duplicate);
        }
        self.records.get_mut().forget(&rec.recipient_id);
        self.queues
            .insert(IdKey::new(&rec.recipient_id), Queue::new(&rec));
        Ok(())
    }

    /// A queue record from the queue log: replaces the queue's record (keeping its messages), or
    /// adds the queue.
    pub(crate) fn put_record(&mut self, rec: QueueRec) {
        self.records.get_mut().forget(&rec.recipient_id);
        match self.queues.get_mut(&rec.recipient_id[..]) {
            Some(q) => q.rec = pack_rec(&rec),
            None => {
                self.queues
                    .insert(IdKey::new(&rec.recipient_id), Queue::new(&rec));
            }
        }
    }

    fn update(&mut self, rec: QueueRec) -> Result<(), StoreError> {
        let q = self
            .queues
            .get_mut(&rec.recipient_id[..])
            .ok_or(StoreError::NotFound)?;
        q.rec = pack_rec(&rec);
        self.records.get_mut().forget(&rec.recipient_id);
        Ok(())
    }

    fn delete(&mut self, recipient_id: &[u8]) -> Result<QueueRec, StoreError> {
        let q = self
            .queues
            .remove(recipient_id)
            .ok_or(StoreError::NotFound)?;
        self.records.get_mut().forget(recipient_id);
        self.total_messages -= q.msgs.len();
        let rec = q.record(recipient_id);
        if let Some(n) = &rec.notifier {
            self.ntfs.remove(&n.notifier_id);
        }
        Ok(rec)
    }
}

impl MemoryData {
    fn write(
        &mut self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError> {
        self.counters.store_writes += 1;
        let q = self
            .queues
            .get_mut(recipient_id)
            .ok_or(StoreError::NotFound)?;
        let was_empty = q.msgs.is_empty();
        // As simplexmq `Server/MsgStore/STM.hs` `writeMsg`: a queue closed by a marker opens again
        // only once drained, marker included.
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

    fn peek_first(&mut self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        self.counters.store_peek_first_calls += 1;
        Ok(self
            .queues
            .get(recipient_id)
            .and_then(|q| q.msgs.front().cloned()))
    }

    fn peek_first_many(
        &mut self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        self.counters.store_peek_first_many_calls += 1;
        Ok(recipient_ids
            .iter()
            .map(|rid| self.queues.get(*rid).and_then(|q| q.msgs.front().cloned()))
            .collect())
    }

    fn try_del(
        &mut self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError> {
        self.counters.store_deletes += 1;
        Ok(self.del_head(recipient_id, msg_id).map(|(m, _)| m))
    }

    fn try_del_peek(
        &mut self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        self.counters.store_deletes += 1;
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

    fn delete_expired(
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

    fn expire_all(&mut self, older_than: i64) -> Result<usize, StoreError> {
        let n: usize = self
            .queues
            .values_mut()
            .map(|q| Self::expire_queue(q, older_than))
            .sum();
        self.total_messages -= n;
        Ok(n)
    }

    fn add_ntf(&mut self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError> {
        self.push_ntf(notifier_id, ntf);
        Ok(())
    }

    fn take_ntfs(
        &mut self,
        notifier_id: &[u8],
        max: usize,
    ) -> Result<(Vec<MsgNtf>, bool), StoreError> {
        let Some(list) = self.ntfs.get_mut(notifier_id) else {
            return Ok((Vec::new(), false));
        };
        let n = list.len().min(max);
        let part: Vec<MsgNtf> = list.drain(..n).collect();
        let more = !list.is_empty();
        if !more {
            self.ntfs.remove(notifier_id);
        }
        Ok((part, more))
    }

    fn return_ntfs(&mut self, notifier_id: &[u8], ntfs: Vec<MsgNtf>) -> Result<(), StoreError> {
        let list = self.ntfs.entry(notifier_id.to_vec()).or_default();
        for n in ntfs.into_iter().rev() {
            if list.len() >= MAX_NTFS_PER_NOTIFIER {
                break;
            }
            list.push_front(n);
        }
        Ok(())
    }

    fn delete_ntfs(&mut self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        Ok(self.ntfs.remove(notifier_id).map_or(0, |l| l.len()))
    }

    fn expire_ntfs(&mut self, older_than: i64) -> Result<usize, StoreError> {
        let mut n = 0;
        self.ntfs.retain(|_, list| {
            let before = list.len();
            list.retain(|ntf| ntf.ts >= older_than);
            n += before - list.len();
            !list.is_empty()
        });
        Ok(n)
    }
}

impl QueueStore for MemoryStore {
    fn with_queue<R>(&self, recipient_id: &[u8], f: impl FnOnce(&QueueRec) -> R) -> Option<R> {
        // Taken out of the store's borrow first: `f` may call the store again.
        let rec = self.data.borrow().record_of(recipient_id)?;
        Some(f(&rec))
    }

    fn for_each_queue(&self, f: &mut dyn FnMut(&QueueRec)) {
        let d = self.data.borrow();
        for (rid, q) in &d.queues {
            f(&q.record(rid.as_slice()));
        }
    }

    fn queue_count(&self) -> usize {
        self.data.borrow().queues.len()
    }

    async fn create(&self, rec: QueueRec) -> Result<(), StoreError> {
        if self
            .data
            .borrow()
            .queues
            .contains_key(&rec.recipient_id[..])
        {
            return Err(StoreError::Duplicate);
        }
        let bytes = queue_log::encode(&rec);
        let g = group_of(&rec.recipient_id);
        let r = [queue_log::change_record(&rec, &bytes, true)];
        self.logged(g, &r, |d| d.create(rec.clone())).await
    }

    async fn update(&self, rec: QueueRec) -> Result<(), StoreError> {
        if !self
            .data
            .borrow()
            .queues
            .contains_key(&rec.recipient_id[..])
        {
            return Err(StoreError::NotFound);
        }
        let bytes = queue_log::encode(&rec);
        let g = group_of(&rec.recipient_id);
        let r = [queue_log::change_record(&rec, &bytes, false)];
        self.logged(g, &r, |d| d.update(rec.clone())).await
    }

    async fn associate_many(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
        updated_at: i64,
    ) -> Result<Vec<QueueRec>, StoreError> {
        let recs = ids.iter().filter_map(|rid| self.get(rid)).map(|mut q| {
            q.rcv_service_id = service.cloned();
            q.updated_at = Some(updated_at);
            q
        });
        self.update_many(recs.collect()).await
    }

    async fn associate_notifiers_many(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
    ) -> Result<Vec<QueueRec>, StoreError> {
        let recs = ids
            .iter()
            .filter_map(|rid| self.get(rid))
            .filter_map(|mut q| {
                q.notifier.as_mut()?.ntf_service_id = service.cloned();
                Some(q)
            });
        self.update_many(recs.collect()).await
    }

    async fn delete(&self, recipient_id: &[u8]) -> Result<QueueRec, StoreError> {
        if !self.data.borrow().queues.contains_key(recipient_id) {
            return Err(StoreError::NotFound);
        }
        let r = [smp_journal::Record::QueueDelete { recipient_id }];
        self.logged(group_of(recipient_id), &r, |d| d.delete(recipient_id))
            .await
    }
}

impl MessageStore for MemoryStore {
    async fn write(
        &self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError> {
        self.data.borrow_mut().write(recipient_id, msg, quota)
    }

    async fn peek_first(&self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        self.data.borrow_mut().peek_first(recipient_id)
    }

    async fn peek_first_many(
        &self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        self.data.borrow_mut().peek_first_many(recipient_ids)
    }

    async fn try_del(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError> {
        self.data.borrow_mut().try_del(recipient_id, msg_id)
    }

    async fn try_del_peek(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        self.data.borrow_mut().try_del_peek(recipient_id, msg_id)
    }

    async fn delete_expired(
        &self,
        recipient_id: &[u8],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        self.data
            .borrow_mut()
            .delete_expired(recipient_id, older_than)
    }

    fn size(&self, recipient_id: &[u8]) -> usize {
        let d = self.data.borrow();
        d.queues.get(recipient_id).map_or(0, |q| q.msgs.len())
    }

    fn total_messages(&self) -> usize {
        self.data.borrow().total_messages
    }

    async fn expire_all(&self, older_than: i64) -> Result<usize, StoreError> {
        self.data.borrow_mut().expire_all(older_than)
    }

    fn expiry_candidates(&self) -> Vec<EntityId> {
        let d = self.data.borrow();
        d.queues
            .iter()
            .filter(|(_, q)| !q.msgs.is_empty())
            .map(|(rid, _)| rid.to_vec())
            .collect()
    }

    async fn add_ntf(&self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError> {
        self.data.borrow_mut().add_ntf(notifier_id, ntf)
    }

    async fn take_ntfs(
        &self,
        notifier_id: &[u8],
        max: usize,
    ) -> Result<(Vec<MsgNtf>, bool), StoreError> {
        self.data.borrow_mut().take_ntfs(notifier_id, max)
    }

    async fn return_ntfs(&self, notifier_id: &[u8], ntfs: Vec<MsgNtf>) -> Result<(), StoreError> {
        self.data.borrow_mut().return_ntfs(notifier_id, ntfs)
    }

    async fn delete_ntfs(&self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        self.data.borrow_mut().delete_ntfs(notifier_id)
    }

    fn ntf_count(&self) -> usize {
        self.data.borrow().ntfs.values().map(|l| l.len()).sum()
    }

    fn ntf_ids(&self) -> Vec<EntityId> {
        let d = self.data.borrow();
        d.ntfs
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    async fn expire_ntfs(&self, older_than: i64) -> Result<usize, StoreError> {
        self.data.borrow_mut().expire_ntfs(older_than)
    }

    async fn messages(&self, recipient_id: &[u8]) -> Result<Vec<Message>, StoreError> {
        let d = self.data.borrow();
        Ok(d.queues
            .get(recipient_id)
            .map(|q| q.msgs.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn ntfs(&self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError> {
        let d = self.data.borrow();
        Ok(d.ntfs
            .get(notifier_id)
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default())
    }

    fn counters(&self) -> StoreCounters {
        self.data.borrow().counters
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::crypto::keys::PublicAuthKey;
    use crate::store::{NotifierCreds, QueueStatus};
    use futures_lite::future::block_on;

    const QUOTA: usize = 3;

    pub(crate) fn rec(rid: &[u8]) -> QueueRec {
        QueueRec {
            recipient_id: rid.to_vec(),
            recipient_keys: vec![PublicAuthKey::Ed25519([1; 32])],
            rcv_dh_secret: [2; 32],
            sender_id: [rid, b"-snd"].concat(),
            sender_key: None,
            queue_mode: None,
            link: None,
            notifier: None,
            status: QueueStatus::Active,
            updated_at: None,
            rcv_service_id: None,
        }
    }

    fn with_notifier(mut r: QueueRec, nid: &[u8]) -> QueueRec {
        r.notifier = Some(Box::new(NotifierCreds {
            notifier_id: nid.to_vec(),
            notifier_key: PublicAuthKey::X25519([3; 32]),
            rcv_ntf_dh_secret: [4; 32],
            ntf_service_id: None,
        }));
        r
    }

    pub(crate) fn msg(n: u8, ts: i64) -> Message {
        Message::Message {
            msg_id: [n; 24],
            ts,
            notification: n % 2 == 0,
            body: format!("message {n}").into_bytes().into(),
        }
    }

    pub(crate) fn ntf(n: u8, ts: i64) -> MsgNtf {
        MsgNtf {
            msg_id: [n; 24],
            ts,
            nonce: [n.wrapping_add(1); 24],
            enc_meta: vec![n; 144],
        }
    }

    fn body(m: &Option<Message>) -> Option<String> {
        match m {
            Some(Message::Message { body, .. }) => Some(String::from_utf8_lossy(body).into_owned()),
            Some(Message::Quota { .. }) => Some("QUOTA".into()),
            None => None,
        }
    }

    fn store_with(rids: &[&[u8]]) -> MemoryStore {
        let s = MemoryStore::new();
        for rid in rids {
            block_on(s.create(rec(rid))).unwrap();
        }
        s
    }

    fn write(s: &mut MemoryStore, rid: &[u8], n: u8) -> WriteOutcome {
        block_on(s.write(rid, msg(n, 1000 + n as i64), QUOTA)).unwrap()
    }

    fn peek(s: &mut MemoryStore, rid: &[u8]) -> Option<String> {
        body(&block_on(s.peek_first(rid)).unwrap())
    }

    fn del(s: &mut MemoryStore, rid: &[u8], n: u8) -> Option<String> {
        body(&block_on(s.try_del(rid, &[n; 24])).unwrap())
    }

    fn del_peek(s: &mut MemoryStore, rid: &[u8], n: u8) -> (Option<String>, Option<String>) {
        let (a, b) = block_on(s.try_del_peek(rid, &[n; 24])).unwrap();
        (body(&a), body(&b))
    }

    fn m(n: u8) -> Option<String> {
        Some(format!("message {n}"))
    }

    const WRITTEN: WriteOutcome = WriteOutcome::Written { was_empty: false };
    const FIRST: WriteOutcome = WriteOutcome::Written { was_empty: true };

    // simplexmq `tests/CoreTests/MsgStoreTests.hs` "should get queue and store/read messages",
    // quota 3.
    #[test]
    fn get_queue_and_store_read_messages() {
        let q: &[u8] = b"queue-1";
        let mut s = store_with(&[q]);
        assert_eq!(write(&mut s, q, 1), FIRST);
        assert_eq!(write(&mut s, q, 2), WRITTEN);
        assert_eq!(write(&mut s, q, 3), WRITTEN);
        assert_eq!(peek(&mut s, q), m(1));
        assert_eq!(peek(&mut s, q), m(1), "peek is idempotent");
        assert_eq!(del(&mut s, q, 2), None, "not the head: nothing deleted");
        assert_eq!(del(&mut s, q, 1), m(1));
        assert_eq!(del(&mut s, q, 1), None);
        assert_eq!(peek(&mut s, q), m(2));
        assert_eq!(del_peek(&mut s, q, 1), (None, m(2)));
        assert_eq!(del_peek(&mut s, q, 2), (m(2), m(3)));
        assert_eq!(del_peek(&mut s, q, 2), (None, m(3)));
        assert_eq!(peek(&mut s, q), m(3));
        assert_eq!(del_peek(&mut s, q, 3), (m(3), None));
        assert_eq!(del(&mut s, q, 2), None);
        assert_eq!(del(&mut s, q, 3), None);
        assert_eq!(peek(&mut s, q), None);
        assert_eq!(s.size(q), 0);

        assert_eq!(write(&mut s, q, 4), FIRST);
        assert_eq!(peek(&mut s, q), m(4));
        assert_eq!(write(&mut s, q, 5), WRITTEN);
        assert_eq!(del_peek(&mut s, q, 3), (None, m(4)));
        assert_eq!(del_peek(&mut s, q, 4), (m(4), m(5)));
        assert_eq!(write(&mut s, q, 6), WRITTEN);
        assert_eq!(write(&mut s, q, 7), WRITTEN);
        // 3 stored: the 4th write leaves a marker with its ID and time.
        assert_eq!(
            write(&mut s, q, 8),
            WriteOutcome::QuotaMarker { was_empty: false }
        );
        assert_eq!(s.size(q), 4, "the marker counts in size");
        assert_eq!(write(&mut s, q, 9), WriteOutcome::Full);
        assert_eq!(s.size(q), 4, "nothing stored when full");
        assert_eq!(peek(&mut s, q), m(5));
        assert_eq!(del_peek(&mut s, q, 4), (None, m(5)));
        assert_eq!(del_peek(&mut s, q, 5), (m(5), m(6)));
        assert_eq!(
            write(&mut s, q, 10),
            WriteOutcome::Full,
            "closed until drained"
        );
        assert_eq!(del_peek(&mut s, q, 6), (m(6), m(7)));
        let (d, marker) = block_on(s.try_del_peek(q, &[7; 24])).unwrap();
        assert_eq!(body(&d), m(7));
        assert_eq!(
            marker,
            Some(Message::Quota {
                msg_id: [8; 24],
                ts: 1008
            })
        );
        assert_eq!(write(&mut s, q, 11), WriteOutcome::Full, "the marker too");
        assert_eq!(del_peek(&mut s, q, 8), (Some("QUOTA".into()), None));
        assert_eq!(del_peek(&mut s, q, 8), (None, None));
        // Drained: writes resume.
        assert_eq!(write(&mut s, q, 12), FIRST);
        assert_eq!(s.size(q), 1);
        assert_eq!(s.total_messages(), 1);

        let deleted = block_on(s.delete(q)).unwrap();
        assert_eq!(deleted.recipient_id, q);
        assert_eq!(s.size(q), 0);
        assert_eq!(s.total_messages(), 0);
        assert!(s.get(q).is_none());
        assert_eq!(block_on(s.delete(q)), Err(StoreError::NotFound));
    }

    // simplexmq `tests/CoreTests/MsgStoreTests.hs` "should write/ack messages": expiring with time
    // 0 removes nothing in between.
    #[test]
    fn write_ack_messages() {
        let q: &[u8] = b"queue-1";
        let mut s = store_with(&[q]);
        for n in 1..=5u8 {
            assert_eq!(write(&mut s, q, n), FIRST);
            assert_eq!(block_on(s.delete_expired(q, 0)).unwrap(), 0);
            assert_eq!(del(&mut s, q, n), m(n));
            assert_eq!(block_on(s.delete_expired(q, 0)).unwrap(), 0);
            assert_eq!(peek(&mut s, q), None);
        }
        assert_eq!(write(&mut s, q, 6), FIRST);
        assert_eq!(write(&mut s, q, 7), WRITTEN);
        assert_eq!(del(&mut s, q, 6), m(6));
        assert_eq!(write(&mut s, q, 8), WRITTEN);
        assert_eq!(del_peek(&mut s, q, 7), (m(7), m(8)));
        assert_eq!(del_peek(&mut s, q, 8), (m(8), None));
        assert_eq!(s.total_messages(), 0);
    }

    #[test]
    fn write_to_unknown_queue_is_not_found() {
        let s = MemoryStore::new();
        assert_eq!(
            block_on(s.write(b"nope", msg(1, 1), QUOTA)),
            Err(StoreError::NotFound)
        );
        assert_eq!(s.total_messages(), 0);
    }

    #[test]
    fn quota_zero_stores_only_the_marker() {
        let q: &[u8] = b"q";
        let s = store_with(&[q]);
        assert_eq!(
            block_on(s.write(q, msg(1, 1), 0)).unwrap(),
            WriteOutcome::QuotaMarker { was_empty: true }
        );
        assert_eq!(
            block_on(s.write(q, msg(2, 2), 0)).unwrap(),
            WriteOutcome::Full
        );
    }

    #[test]
    fn expiry_stops_at_the_marker() {
        let q: &[u8] = b"q";
        let other: &[u8] = b"other";
        let mut s = store_with(&[q, other]);
        for n in 1..=4 {
            write(&mut s, q, n); // 1001..1003, then the marker at 1004
        }
        write(&mut s, other, 1);
        write(&mut s, other, 9); // ts 1009
        assert_eq!(block_on(s.delete_expired(q, 1002)).unwrap(), 1);
        assert_eq!(peek(&mut s, q), m(2));
        // Everything is older than 5000, but the marker stays and keeps the queue closed.
        assert_eq!(block_on(s.delete_expired(q, 5000)).unwrap(), 2);
        assert_eq!(peek(&mut s, q), Some("QUOTA".into()));
        assert_eq!(s.size(q), 1);
        assert_eq!(write(&mut s, q, 20), WriteOutcome::Full);
        assert_eq!(block_on(s.delete_expired(b"unknown", 5000)).unwrap(), 0);

        // expire_all: over every queue, same rule.
        assert_eq!(block_on(s.expire_all(1005)).unwrap(), 1);
        assert_eq!(peek(&mut s, other), m(9));
        assert_eq!(block_on(s.expire_all(i64::MAX)).unwrap(), 1);
        assert_eq!(s.size(q), 1);
        assert_eq!(s.total_messages(), 1);
    }

    #[test]
    fn peek_first_many_returns_heads_in_order_in_one_call() {
        let (a, b, c): (&[u8], &[u8], &[u8]) = (b"a", b"b", b"empty");
        let mut s = store_with(&[a, b, c]);
        write(&mut s, a, 1);
        write(&mut s, a, 2);
        write(&mut s, b, 3);
        let heads = block_on(s.peek_first_many(&[b, b"unknown", c, a])).unwrap();
        let heads: Vec<_> = heads.iter().map(|h| body(&h.clone())).collect();
        assert_eq!(heads, vec![m(3), None, None, m(1)]);
        assert_eq!(
            s.counters(),
            StoreCounters {
                store_peek_first_many_calls: 1,
                store_writes: 3,
                ..StoreCounters::default()
            }
        );
        assert!(block_on(s.peek_first_many(&[])).unwrap().is_empty());
        assert_eq!(s.counters().store_peek_first_many_calls, 2);
    }

    #[test]
    fn counters_count_each_entry_point_call() {
        let q: &[u8] = b"q";
        let mut s = store_with(&[q]);
        assert_eq!(s.counters(), StoreCounters::default());
        for n in 1..=5 {
            write(&mut s, q, n); // 3 written, a marker, then Full: 5 calls
        }
        peek(&mut s, q);
        peek(&mut s, b"unknown");
        del(&mut s, q, 9); // no match still counts: it is a call
        del(&mut s, q, 1);
        del_peek(&mut s, q, 2);
        block_on(s.delete_expired(q, 0)).unwrap();
        assert_eq!(
            s.counters(),
            StoreCounters {
                store_peek_first_calls: 2,
                store_writes: 5,
                store_deletes: 3,
                ..StoreCounters::default()
            }
        );
    }

    #[test]
    fn notifications_order_take_expire_delete() {
        let s = MemoryStore::new();
        let (n1, n2): (&[u8], &[u8]) = (b"nid-1", b"nid-2");
        for (i, ts) in [(1, 100), (2, 200), (3, 300)] {
            block_on(s.add_ntf(n1, ntf(i, ts))).unwrap();
        }
        block_on(s.add_ntf(n2, ntf(9, 50))).unwrap();
        let mut ids = s.ntf_ids();
        ids.sort();
        assert_eq!(ids, vec![n1.to_vec(), n2.to_vec()]);

        // Expiry drops only the old ones; a list left empty disappears.
        assert_eq!(block_on(s.expire_ntfs(150)).unwrap(), 2);
        assert_eq!(s.ntf_ids(), vec![n1.to_vec()]);

        block_on(s.add_ntf(n1, ntf(4, 400))).unwrap();
        let taken = block_on(s.take_ntfs(n1, usize::MAX)).unwrap().0;
        let order: Vec<u8> = taken.iter().map(|n| n.msg_id[0]).collect();
        assert_eq!(order, vec![2, 3, 4], "oldest first");
        assert_eq!(taken[0], ntf(2, 200));
        assert!(
            block_on(s.take_ntfs(n1, usize::MAX)).unwrap().0.is_empty(),
            "taken"
        );
        assert!(s.ntf_ids().is_empty());

        block_on(s.add_ntf(n2, ntf(5, 500))).unwrap();
        block_on(s.add_ntf(n2, ntf(6, 600))).unwrap();
        assert_eq!(block_on(s.delete_ntfs(n2)).unwrap(), 2);
        assert_eq!(block_on(s.delete_ntfs(n2)).unwrap(), 0);
        assert!(s.ntf_ids().is_empty());
    }

    #[test]
    fn notifications_per_notifier_are_bounded() {
        let s = MemoryStore::new();
        for i in 0..MAX_NTFS_PER_NOTIFIER + 2 {
            block_on(s.add_ntf(b"n", ntf((i % 256) as u8, i as i64))).unwrap();
        }
        let taken = block_on(s.take_ntfs(b"n", usize::MAX)).unwrap().0;
        assert_eq!(taken.len(), MAX_NTFS_PER_NOTIFIER);
        assert_eq!(taken[0].ts, 2, "the oldest were dropped");
    }

    #[test]
    fn delete_removes_messages_and_notifications() {
        let (q, keep): (&[u8], &[u8]) = (b"q", b"keep");
        let mut s = MemoryStore::new();
        block_on(s.create(with_notifier(rec(q), b"nid-q"))).unwrap();
        block_on(s.create(with_notifier(rec(keep), b"nid-keep"))).unwrap();
        write(&mut s, q, 1);
        write(&mut s, q, 2);
        write(&mut s, keep, 3);
        block_on(s.add_ntf(b"nid-q", ntf(1, 1))).unwrap();
        block_on(s.add_ntf(b"nid-keep", ntf(3, 3))).unwrap();
        assert_eq!(s.total_messages(), 3);

        let r = block_on(s.delete(q)).unwrap();
        assert_eq!(r.notifier.unwrap().notifier_id, b"nid-q");
        assert_eq!(s.size(q), 0);
        assert_eq!(peek(&mut s, q), None);
        assert_eq!(s.total_messages(), 1);
        assert_eq!(s.ntf_ids(), vec![b"nid-keep".to_vec()]);
        assert_eq!(s.queue_count(), 1);
        // A queue created again with the same ID starts empty.
        block_on(s.create(rec(q))).unwrap();
        assert_eq!(write(&mut s, q, 5), FIRST);
    }

    #[test]
    fn create_update_get() {
        let q: &[u8] = b"q";
        let s = store_with(&[q]);
        assert_eq!(block_on(s.create(rec(q))), Err(StoreError::Duplicate));
        let mut r = rec(q);
        r.status = QueueStatus::Off;
        block_on(s.update(r.clone())).unwrap();
        assert_eq!(s.get(q), Some(r.clone()));
        assert_eq!(
            block_on(s.update(rec(b"unknown"))),
            Err(StoreError::NotFound)
        );
        assert_eq!(s.queue_count(), 1);
        assert_eq!(s.queue_count(), 1);
    }
}
