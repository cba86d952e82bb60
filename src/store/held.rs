//! Test stores: a store whose operations are held back before they run, by a [`Hold`]. They show
//! that an owner whose store is slow holds up only the queues it works on
//! (`docs/ARCHITECTURE.md` §2):
//!
//! - [`Delay`] (`start --test-store-delay SHARD:MS`): one shard's reads of queue heads
//!   (`peek_first`, `peek_first_many`: what SUB, GET and QUE wait for) take that long, over real
//!   connections (`tests/flow/ordering.rs`). The rest is not delayed, so that tests can still set up
//!   many queues quickly.
//! - `Latch` (unit tests and the owner simulation, `server/owner/sim.rs`): every operation waits until
//!   the test lets it complete, in any order it chooses.

use std::time::Duration;

use super::{
    EntityId, Message, MessageStore, MsgId, MsgNtf, QueueData, QueueRec, QueueStatus, QueueStore,
    ShardStore, StoreCounters, StoreError, StoreSettings, WriteOutcome,
};

/// A store operation, as a [`Hold`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
    Delete,
    Write,
    PeekFirst,
    PeekFirstMany,
    TryDel,
    TryDelPeek,
    DeleteExpired,
    ExpireAll,
    AddNtf,
    TakeNtfs,
    ReturnNtfs,
    DeleteNtfs,
    ExpireNtfs,
}

/// Decides how long an operation waits before it runs. `ids`: the recipient IDs (or, for
/// notifications, the notifier ID) it is about.
#[allow(async_fn_in_trait)]
pub trait Hold {
    async fn hold(&self, op: Op, ids: &[&[u8]]);
}

/// `inner`, each of its operations first held by `hold`.
pub struct Held<S, H> {
    pub inner: S,
    pub hold: H,
}

impl<S: QueueStore, H: Hold> QueueStore for Held<S, H> {
    fn with_queue<R>(&self, recipient_id: &[u8], f: impl FnOnce(&QueueRec) -> R) -> Option<R> {
        self.inner.with_queue(recipient_id, f)
    }

    fn for_each_queue(&self, f: &mut dyn FnMut(&QueueRec)) {
        self.inner.for_each_queue(f)
    }

    fn for_each_queue_ids(
        &self,
        f: &mut dyn FnMut(&crate::store::RecordIds<'_>),
    ) -> Result<(), String> {
        self.inner.for_each_queue_ids(f)
    }

    fn queue_count(&self) -> usize {
        self.inner.queue_count()
    }

    fn queue_count_estimate(&self) -> usize {
        self.inner.queue_count_estimate()
    }

    fn for_each_service_queue_ids(
        &self,
        f: &mut dyn FnMut(&crate::store::RecordIds<'_>),
    ) -> Result<(), String> {
        self.inner.for_each_service_queue_ids(f)
    }

    fn notifier_count(&self) -> Option<usize> {
        self.inner.notifier_count()
    }

    fn serving(&self) {
        self.inner.serving()
    }

    fn notifier_count_hint(&self) -> usize {
        self.inner.notifier_count_hint()
    }

    fn holds_every_record(&self) -> bool {
        self.inner.holds_every_record()
    }

    async fn prepare(
        &self,
        rids: &[&[u8]],
        keep: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(), StoreError> {
        self.inner.prepare(rids, keep).await
    }

    fn release(&self, rids: &[&[u8]]) {
        self.inner.release(rids)
    }

    async fn create(&self, rec: QueueRec) -> Result<(), StoreError> {
        self.hold.hold(Op::Create, &[&rec.recipient_id]).await;
        self.inner.create(rec).await
    }

    async fn update(&self, rec: QueueRec) -> Result<(), StoreError> {
        self.hold.hold(Op::Update, &[&rec.recipient_id]).await;
        self.inner.update(rec).await
    }

    async fn delete(&self, recipient_id: &[u8]) -> Result<QueueRec, StoreError> {
        self.hold.hold(Op::Delete, &[recipient_id]).await;
        self.inner.delete(recipient_id).await
    }
}

impl<S: MessageStore, H: Hold> MessageStore for Held<S, H> {
    async fn write(
        &self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError> {
        self.hold.hold(Op::Write, &[recipient_id]).await;
        self.inner.write(recipient_id, msg, quota).await
    }

    async fn peek_first(&self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError> {
        self.hold.hold(Op::PeekFirst, &[recipient_id]).await;
        self.inner.peek_first(recipient_id).await
    }

    async fn peek_first_many(
        &self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError> {
        self.hold.hold(Op::PeekFirstMany, recipient_ids).await;
        self.inner.peek_first_many(recipient_ids).await
    }

    async fn try_del(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError> {
        self.hold.hold(Op::TryDel, &[recipient_id]).await;
        self.inner.try_del(recipient_id, msg_id).await
    }

    async fn try_del_peek(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError> {
        self.hold.hold(Op::TryDelPeek, &[recipient_id]).await;
        self.inner.try_del_peek(recipient_id, msg_id).await
    }

    async fn delete_expired(
        &self,
        recipient_id: &[u8],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        self.hold.hold(Op::DeleteExpired, &[recipient_id]).await;
        self.inner.delete_expired(recipient_id, older_than).await
    }

    fn size(&self, recipient_id: &[u8]) -> usize {
        self.inner.size(recipient_id)
    }

    fn total_messages(&self) -> usize {
        self.inner.total_messages()
    }

    async fn expire_all(&self, older_than: i64) -> Result<usize, StoreError> {
        self.hold.hold(Op::ExpireAll, &[]).await;
        self.inner.expire_all(older_than).await
    }

    fn expiry_candidates(&self) -> Vec<EntityId> {
        self.inner.expiry_candidates()
    }

    async fn expire_queues(
        &self,
        recipient_ids: &[EntityId],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        let ids: Vec<&[u8]> = recipient_ids.iter().map(|r| &r[..]).collect();
        self.hold.hold(Op::ExpireAll, &ids).await;
        self.inner.expire_queues(recipient_ids, older_than).await
    }

    async fn add_ntf(&self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError> {
        self.hold.hold(Op::AddNtf, &[notifier_id]).await;
        self.inner.add_ntf(notifier_id, ntf).await
    }

    async fn take_ntfs(
        &self,
        notifier_id: &[u8],
        max: usize,
    ) -> Result<(Vec<MsgNtf>, bool), StoreError> {
        self.hold.hold(Op::TakeNtfs, &[notifier_id]).await;
        self.inner.take_ntfs(notifier_id, max).await
    }

    async fn return_ntfs(&self, notifier_id: &[u8], ntfs: Vec<MsgNtf>) -> Result<(), StoreError> {
        self.hold.hold(Op::ReturnNtfs, &[notifier_id]).await;
        self.inner.return_ntfs(notifier_id, ntfs).await
    }

    async fn delete_ntfs(&self, notifier_id: &[u8]) -> Result<usize, StoreError> {
        self.hold.hold(Op::DeleteNtfs, &[notifier_id]).await;
        self.inner.delete_ntfs(notifier_id).await
    }

    fn ntf_ids(&self) -> Vec<EntityId> {
        self.inner.ntf_ids()
    }

    fn ntf_count(&self) -> usize {
        self.inner.ntf_count()
    }

    async fn expire_ntfs(&self, older_than: i64) -> Result<usize, StoreError> {
        self.hold.hold(Op::ExpireNtfs, &[]).await;
        self.inner.expire_ntfs(older_than).await
    }

    fn waits(&self) -> bool {
        true
    }

    fn begin_round(&self) {
        self.inner.begin_round()
    }

    fn end_round(&self) {
        self.inner.end_round()
    }

    fn counters(&self) -> StoreCounters {
        self.inner.counters()
    }

    // Offline reads (`store export`): not held.
    async fn messages(&self, recipient_id: &[u8]) -> Result<Vec<Message>, StoreError> {
        self.inner.messages(recipient_id).await
    }

    async fn ntfs(&self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError> {
        self.inner.ntfs(notifier_id).await
    }
}

/// Head reads wait this long (on a glommio timer), when set.
pub struct Delay(pub Option<Duration>);

impl Hold for Delay {
    async fn hold(&self, op: Op, _ids: &[&[u8]]) {
        if let (Some(d), Op::PeekFirst | Op::PeekFirstMany) = (self.0, op) {
            glommio::timer::Timer::new(d).await;
        }
    }
}

impl<S: ShardStore> ShardStore for Held<S, Delay> {
    fn open(s: &StoreSettings, groups: &[u32], now: i64) -> Result<Self, String> {
        Ok(Held {
            inner: S::open(s, groups, now)?,
            hold: Delay(s.test_delay),
        })
    }

    fn all_opened(s: &StoreSettings) -> Result<(), String> {
        S::all_opened(s)
    }

    fn id_source(
        s: &StoreSettings,
    ) -> Result<Option<std::sync::Arc<dyn crate::store::IdSource>>, String> {
        S::id_source(s)
    }

    fn close(self, s: &StoreSettings, groups: &[u32]) -> Result<(), String> {
        self.inner.close(s, groups)
    }

    fn find_offline(s: &StoreSettings, id: &[u8]) -> Result<Option<QueueRec>, String> {
        S::find_offline(s, id)
    }

    fn set_status_offline(
        s: &StoreSettings,
        sender_id: &[u8],
        status: QueueStatus,
    ) -> Result<(), String> {
        S::set_status_offline(s, sender_id, status)
    }

    fn open_offline(s: &StoreSettings) -> Result<Self, String> {
        Ok(Held {
            inner: S::open_offline(s)?,
            hold: Delay(s.test_delay),
        })
    }

    async fn restore(&self, q: QueueData) -> Result<(), StoreError> {
        self.inner.restore(q).await
    }
}

#[cfg(test)]
pub use latch::{Latch, LatchMode};

#[cfg(test)]
mod latch {
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    use std::task::{Poll, Waker};

    use super::{Hold, Op};

    /// Which operations a [`Latch`] holds.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum LatchMode {
        /// None: every operation runs at once.
        Open,
        /// Every operation.
        All,
        /// Those about any of these IDs.
        Only(Vec<Vec<u8>>),
    }

    struct HeldOp {
        id: u64,
        op: Op,
        ids: Vec<Vec<u8>>,
        released: bool,
        waker: Option<Waker>,
    }

    /// Holds store operations until the test releases them (`release`), in any order. Shared
    /// (`Rc`) between the store and the test.
    pub struct Latch {
        mode: RefCell<LatchMode>,
        held: RefCell<Vec<HeldOp>>,
        next: Cell<u64>,
    }

    impl Latch {
        pub fn new(mode: LatchMode) -> Rc<Latch> {
            Rc::new(Latch {
                mode: RefCell::new(mode),
                held: RefCell::new(Vec::new()),
                next: Cell::new(0),
            })
        }

        pub fn set_mode(&self, mode: LatchMode) {
            *self.mode.borrow_mut() = mode;
        }

        /// The operations waiting now, oldest first: (id, operation, the IDs it is about).
        pub fn waiting(&self) -> Vec<(u64, Op, Vec<Vec<u8>>)> {
            self.held
                .borrow()
                .iter()
                .filter(|h| !h.released)
                .map(|h| (h.id, h.op, h.ids.clone()))
                .collect()
        }

        /// Lets operation `id` complete (its job is woken).
        pub fn release(&self, id: u64) {
            let mut held = self.held.borrow_mut();
            if let Some(h) = held.iter_mut().find(|h| h.id == id) {
                h.released = true;
                if let Some(w) = h.waker.take() {
                    w.wake();
                }
            }
        }

        fn holds(&self, ids: &[&[u8]]) -> bool {
            match &*self.mode.borrow() {
                LatchMode::Open => false,
                LatchMode::All => true,
                LatchMode::Only(these) => ids.iter().any(|i| these.iter().any(|t| t == i)),
            }
        }
    }

    impl Hold for Rc<Latch> {
        async fn hold(&self, op: Op, ids: &[&[u8]]) {
            if !self.holds(ids) {
                return;
            }
            let id = self.next.get();
            self.next.set(id + 1);
            self.held.borrow_mut().push(HeldOp {
                id,
                op,
                ids: ids.iter().map(|i| i.to_vec()).collect(),
                released: false,
                waker: None,
            });
            std::future::poll_fn(|cx| {
                let mut held = self.held.borrow_mut();
                let Some(pos) = held.iter().position(|h| h.id == id) else {
                    return Poll::Ready(());
                };
                if held[pos].released {
                    held.remove(pos);
                    Poll::Ready(())
                } else {
                    held[pos].waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await
        }
    }
}
