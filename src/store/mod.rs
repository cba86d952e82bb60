//! The stores behind a shard's queues (`docs/ARCHITECTURE.md` §5). Each shard owns one store
//! instance for the partition groups it owns; nothing here is shared between threads.
//!
//! `QueueStore` keeps queue records (the owner reads them synchronously from the store's in-memory
//! map: every store keeps all records of its groups in memory, PostgreSQL included) and makes each
//! change durable before it returns. `MessageStore` keeps messages per queue in arrival order. The
//! write methods are `async` because the PostgreSQL store awaits its pool; the memory store completes
//! them at once. The owner calls them in a per-queue order (`docs/ARCHITECTURE.md` §2), never
//! concurrently for one queue.

pub mod cache;
mod codec;
#[cfg(feature = "test-kit")]
pub mod held;
pub mod id;
pub mod journal;
pub mod memory;
pub mod postgres;
pub mod reference;
pub mod services;
pub mod transfer;

use std::path::PathBuf;
use std::rc::Rc;

use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::QueueMode;
use crate::protocol::error::BlockingInfo;

/// Recipient, sender, notifier, link and message IDs are 24 random bytes when the server makes them;
/// client-supplied ones (sender ID of a short link, link ID of a contact address) are kept as sent.
pub type EntityId = Vec<u8>;

/// Message IDs are 24 bytes: they are also the nonce of the MSG body encryption.
pub type MsgId = [u8; 24];

/// Creates `dir` and the directories above it that are missing, readable by the relay's user
/// alone: a store holds each queue's keys and DH secret. A directory that exists keeps its mode
/// (`start` warns when others may read it).
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(smp_journal::fs::PRIVATE_DIR_MODE)
        .create(dir)
}

/// A new file of a store: its owner's alone, as `create_private_dir`'s directories.
pub fn private_file() -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.mode(smp_journal::fs::PRIVATE_FILE_MODE);
    o
}

/// Fixed numbers that reach the disk (`docs/ARCHITECTURE.md` §1): partitions, their hash and their
/// groups. One definition, the journal crate's (`journal/src/lib.rs`, `PARTITION_FUNCTION`, which
/// every segment header records): the journal, the shards' ownership of groups and the statistics'
/// queue hashes all place a queue by it, whatever its store.
pub use smp_journal::{group_of, partition_of, JOURNAL_GROUPS as PARTITION_GROUPS, PARTITIONS};

/// Short-link data of a queue (`LSET`, `NEW` with link data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLink {
    pub link_id: EntityId,
    /// Immutable once set (only `user` may change).
    pub fixed: Vec<u8>,
    pub user: Vec<u8>,
}

impl QueueLink {
    /// Whether its data fits the `Large` fields `LNK` answers with. A command's data always
    /// does (a block is 16 KiB); every store checks what it reads back (a damaged journal, an
    /// import stream or a database row could hold more), and serves such a record as one it
    /// cannot read.
    pub fn fits(&self) -> bool {
        use crate::protocol::encoding::MAX_LARGE;
        self.fixed.len() <= MAX_LARGE && self.user.len() <= MAX_LARGE
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifierCreds {
    pub notifier_id: EntityId,
    pub notifier_key: PublicAuthKey,
    /// X25519(client's rcvNtfDhKey, server's per-notifier key): NMSG metadata is sealed with it.
    pub rcv_ntf_dh_secret: [u8; 32],
    pub ntf_service_id: Option<EntityId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueStatus {
    Active,
    /// `OFF`: senders get `AUTH`, recipient commands still work.
    Off,
    /// Blocked by the operator: commands answer `ERR BLOCKED` (except OFF, DEL, NSUB).
    Blocked(BlockingInfo),
}

/// One queue, keyed by its recipient ID (simplexmq `Server/QueueStore.hs`, `QueueRec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueRec {
    pub recipient_id: EntityId,
    /// Non-empty; more than one only after `RKEY` on a contact queue.
    pub recipient_keys: Vec<PublicAuthKey>,
    /// X25519(client's rcvDhKey, server's per-queue key): MSG bodies are sealed with it.
    pub rcv_dh_secret: [u8; 32],
    pub sender_id: EntityId,
    pub sender_key: Option<PublicAuthKey>,
    /// `None` for legacy queues (created before v9).
    pub queue_mode: Option<QueueMode>,
    /// Boxed, as are the notifier's credentials: most queues have neither, and a queue record
    /// is kept for every queue (`benches/README.md`, memory per queue).
    pub link: Option<Box<QueueLink>>,
    pub notifier: Option<Box<NotifierCreds>>,
    pub status: QueueStatus,
    /// Unix seconds rounded down to a day; written at most once a day per queue.
    pub updated_at: Option<i64>,
    pub rcv_service_id: Option<EntityId>,
}

impl QueueRec {
    /// Contact mode, or a legacy queue without a sender key (pre-SKEY contact addresses).
    pub fn is_contact(&self) -> bool {
        match self.queue_mode {
            Some(QueueMode::Messaging) => false,
            Some(QueueMode::Contact) => true,
            None => self.sender_key.is_none(),
        }
    }

    /// Not contact mode and secured with a sender key.
    pub fn is_secured_messaging(&self) -> bool {
        self.queue_mode != Some(QueueMode::Contact) && self.sender_key.is_some()
    }
}

/// Which ID space an entity ID is looked up in (the party of the command): the shared
/// directory's (`server/directory.rs`) and the stores' that keep it behind unique indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdSpace {
    Sender,
    Link,
    Notifier,
}

impl IdSpace {
    /// The space a command's entity ID is looked up in, if any.
    pub fn of(kind: crate::protocol::command::EntityKind) -> Option<IdSpace> {
        use crate::protocol::command::EntityKind;
        match kind {
            EntityKind::Sender => Some(IdSpace::Sender),
            EntityKind::Link => Some(IdSpace::Link),
            EntityKind::Notifier => Some(IdSpace::Notifier),
            _ => None,
        }
    }
}

/// Where the shared directory, when it is a bounded cache, finds the IDs it does not hold: the
/// recipient IDs of the live queues that have some of `ids` in `space`, as (ID, recipient ID)
/// pairs, answered through the channel (the store looks them up on threads of its own).
pub trait IdSource: Send + Sync {
    fn find(&self, space: IdSpace, ids: Vec<EntityId>) -> IdsFound;
}

/// What an [`IdSource`] answers.
pub type IdsFound = flume::Receiver<Result<Vec<(EntityId, EntityId)>, String>>;

/// The IDs of a queue that a start indexes outside the store, borrowed: the shared directory's
/// sender, link and notifier IDs and the services' associations (`server/mod.rs`,
/// `index_queues`). A store may produce them without decoding whole records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordIds<'a> {
    pub recipient_id: &'a [u8],
    pub sender_id: &'a [u8],
    pub link_id: Option<&'a [u8]>,
    pub notifier_id: Option<&'a [u8]>,
    pub rcv_service_id: Option<&'a [u8]>,
    /// The notifier's service (only with a notifier).
    pub ntf_service_id: Option<&'a [u8]>,
}

impl<'a> RecordIds<'a> {
    pub fn of(q: &'a QueueRec) -> Self {
        RecordIds {
            recipient_id: &q.recipient_id,
            sender_id: &q.sender_id,
            link_id: q.link.as_ref().map(|l| &l.link_id[..]),
            notifier_id: q.notifier.as_ref().map(|n| &n.notifier_id[..]),
            rcv_service_id: q.rcv_service_id.as_deref(),
            ntf_service_id: q
                .notifier
                .as_ref()
                .and_then(|n| n.ntf_service_id.as_deref()),
        }
    }
}

/// A stored message or the quota marker that took the place of a rejected one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Message {
        msg_id: MsgId,
        /// Unix seconds of receipt.
        ts: i64,
        notification: bool,
        /// The sender's body, opaque; shared so that peeking does not copy 16 KB.
        body: Rc<[u8]>,
    },
    Quota {
        msg_id: MsgId,
        ts: i64,
    },
}

impl Message {
    pub fn msg_id(&self) -> &MsgId {
        match self {
            Message::Message { msg_id, .. } | Message::Quota { msg_id, .. } => msg_id,
        }
    }

    pub fn ts(&self) -> i64 {
        match self {
            Message::Message { ts, .. } | Message::Quota { ts, .. } => *ts,
        }
    }

    /// The same message with its body left empty: what a deletion may report
    /// (`MessageStore::try_del`).
    pub fn without_body(&self) -> Message {
        match self {
            Message::Message {
                msg_id,
                ts,
                notification,
                ..
            } => Message::Message {
                msg_id: *msg_id,
                ts: *ts,
                notification: *notification,
                body: Rc::from(&[][..]),
            },
            Message::Quota { .. } => self.clone(),
        }
    }
}

/// What a SEND did to the queue (simplexmq `Server/MsgStore/STM.hs`, `writeMsg`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored; `was_empty` tells whether it is now the head (a subscriber may be pushed it).
    Written { was_empty: bool },
    /// The quota was reached: a quota marker took this message's ID and time (`ERR QUOTA`).
    QuotaMarker { was_empty: bool },
    /// The queue is closed to writes until drained, marker included (`ERR QUOTA`, nothing stored).
    Full,
}

/// A pending notification (`NMSG`) for a notifier ID, already sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsgNtf {
    pub msg_id: MsgId,
    pub ts: i64,
    pub nonce: [u8; 24],
    /// `SXbox(rcvNtfDhSecret, nonce, pad(msgId ‖ ts, 128))`, 144 bytes.
    pub enc_meta: Vec<u8>,
}

/// What `store_error` makes of [`StoreError::Uncertain`] for the command code: a refusal that is
/// never sent (the owner closes the request's connection instead, `server/owner/commands/mod.rs`).
pub const OUTCOME_UNKNOWN: &str = "outcome unknown";

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// A sender, link or notifier ID (or the recipient ID) is taken.
    #[error("duplicate id")]
    Duplicate,
    #[error("no such queue")]
    NotFound,
    /// The store could not do it; the text reaches clients as `ERR STORE <text>`.
    #[error("store: {0}")]
    Failed(String),
    /// The store may or may not have done it: the change was made, and whether it will survive
    /// a crash is unknown (the journal's sync of it failed). Not answered: the request's
    /// connection is closed, as a crash would do (`server/owner/commands/mod.rs`).
    #[error("store: outcome unknown: {0}")]
    Uncertain(String),
}

/// A store counts its calls itself, at its entry points, in the relay's own counters (their
/// `store_*` fields, `counters.rs`; `docs/ARCHITECTURE.md` §2: a block of SUBs costs one
/// `peek_first_many` per owner, never one `peek_first` per SUB).
pub use crate::counters::RelayCounters as StoreCounters;

// Stores live on one shard and their futures never cross threads, so the `Send` bounds that
// `async fn` in a public trait cannot express are not needed.
//
// Every method takes `&self`: the owner runs several turns at once, each waiting for its own store
// operations (`docs/ARCHITECTURE.md` §2), so a store keeps its own state behind interior
// mutability and never holds a borrow of it across an `.await`. The owner never has two
// operations on one queue in flight at once.
#[allow(async_fn_in_trait)]
pub trait QueueStore {
    /// Runs `f` on the record of `recipient_id`, if there is one.
    fn with_queue<R>(&self, recipient_id: &[u8], f: impl FnOnce(&QueueRec) -> R) -> Option<R>;
    /// A copy of the record of `recipient_id`.
    fn get(&self, recipient_id: &[u8]) -> Option<QueueRec> {
        self.with_queue(recipient_id, QueueRec::clone)
    }
    fn contains(&self, recipient_id: &[u8]) -> bool {
        self.with_queue(recipient_id, |_| ()).is_some()
    }
    /// Every record (the offline tools, the tests).
    fn for_each_queue(&self, f: &mut dyn FnMut(&QueueRec));
    /// The IDs of every queue, for the directory and the services' index at start; a store whose
    /// records are not kept decoded reads them without decoding. An error: not every queue's IDs
    /// could be read (the start fails rather than serve queues it cannot find).
    fn for_each_queue_ids(&self, f: &mut dyn FnMut(&RecordIds<'_>)) -> Result<(), String> {
        self.for_each_queue(&mut |q| f(&RecordIds::of(q)));
        Ok(())
    }
    fn queue_count(&self) -> usize;

    /// As `for_each_queue_ids`, for a start whose directory is a cache in front of the store
    /// (`ShardStore::id_source`): only the queues associated with a service are needed (the
    /// services' index); a store may give more.
    fn for_each_service_queue_ids(&self, f: &mut dyn FnMut(&RecordIds<'_>)) -> Result<(), String> {
        self.for_each_queue_ids(f)
    }

    /// How many of its queues have a notifier, where the store knows it without a pass over its
    /// records (a start makes room for their directory entries at once); 0: not known.
    fn notifier_count_hint(&self) -> usize {
        0
    }

    /// The shard begins to serve (a store that counts its queues while it serves starts now).
    fn serving(&self) {}

    /// The notifiers of this shard's queues, where the store counts them (a store whose
    /// directory is a cache); `None`: the directory holds every notifier ID and counts them.
    fn notifier_count(&self) -> Option<usize> {
        None
    }

    /// The queue count, or an estimate where counting would cost a pass over the store (a
    /// start sizes the directory with it before `for_each_queue_ids` counts exactly).
    fn queue_count_estimate(&self) -> usize {
        self.queue_count()
    }

    /// Whether `with_queue` reads every queue's record without `prepare` (every store but the
    /// PostgreSQL one): the owner then skips `prepare` and `release`.
    fn holds_every_record(&self) -> bool {
        true
    }
    /// Makes the records of `rids` readable by `with_queue` until `release(rids)` (a store that
    /// keeps only some records, the PostgreSQL store, reads the missing ones in one statement).
    /// The owner calls it before each job that reads records, with the same queues the job holds
    /// in the per-queue order (`docs/ARCHITECTURE.md` §2). `keep`: queues whose records must stay
    /// read while it says so (the subscribed ones), whatever the store's bound. An error: the
    /// store could not read them (the job answers it; `with_queue` would wrongly say "no queue").
    async fn prepare(
        &self,
        rids: &[&[u8]],
        keep: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let _ = (rids, keep);
        Ok(())
    }
    /// Ends what `prepare(rids)` began.
    fn release(&self, rids: &[&[u8]]) {
        let _ = rids;
    }

    /// Adds a queue; `Duplicate` if its recipient ID is taken (the owner checks sender, link and
    /// notifier IDs against the shared directory first).
    async fn create(&self, rec: QueueRec) -> Result<(), StoreError>;
    /// Replaces the record of `rec.recipient_id` (KEY, SKEY, RKEY, LSET, LDEL, NKEY, NDEL, OFF,
    /// block, the daily `updated_at` touch, service associations): the owner computes the new record,
    /// the store makes it durable.
    async fn update(&self, rec: QueueRec) -> Result<(), StoreError>;
    /// Deletes the queue, its messages and its notifications; returns the deleted record.
    async fn delete(&self, recipient_id: &[u8]) -> Result<QueueRec, StoreError>;
    /// Sets the messaging service of the queues `ids` to `service` and their `updated_at` to
    /// `updated_at` (a block's SUBs from one session: simplexmq `Server.hs`, `prepareBatchSubs`),
    /// durably; returns the records as they now are, those of queues that exist. One call per
    /// block part; the PostgreSQL store makes it one statement, the others one record write per
    /// queue.
    async fn associate_many(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
        updated_at: i64,
    ) -> Result<Vec<QueueRec>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for rid in ids {
            let Some(mut q) = self.get(rid) else { continue };
            q.rcv_service_id = service.cloned();
            q.updated_at = Some(updated_at);
            self.update(q.clone()).await?;
            out.push(q);
        }
        Ok(out)
    }

    /// As `associate_many`, for the notifiers of the queues `ids` (a block's NSUBs); queues
    /// without a notifier are left out.
    async fn associate_notifiers_many(
        &self,
        ids: &[EntityId],
        service: Option<&EntityId>,
    ) -> Result<Vec<QueueRec>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for rid in ids {
            let Some(mut q) = self.get(rid) else { continue };
            let Some(n) = q.notifier.as_mut() else {
                continue;
            };
            n.ntf_service_id = service.cloned();
            self.update(q.clone()).await?;
            out.push(q);
        }
        Ok(out)
    }
}

#[allow(async_fn_in_trait)]
pub trait MessageStore {
    /// Appends a message, applying the reference's quota rule (simplexmq `Server/MsgStore/STM.hs`,
    /// `writeMsg`) (`quota` messages, then one marker).
    async fn write(
        &self,
        recipient_id: &[u8],
        msg: Message,
        quota: usize,
    ) -> Result<WriteOutcome, StoreError>;
    /// A SEND with expiry on: `delete_expired(older_than)`, then `write`; one operation where the
    /// store can make it one (PostgreSQL: one statement). Returns how many expired and the write's
    /// outcome.
    async fn expire_and_write(
        &self,
        recipient_id: &[u8],
        older_than: i64,
        msg: Message,
        quota: usize,
    ) -> Result<(usize, WriteOutcome), StoreError> {
        let n = self.delete_expired(recipient_id, older_than).await?;
        Ok((n, self.write(recipient_id, msg, quota).await?))
    }
    async fn peek_first(&self, recipient_id: &[u8]) -> Result<Option<Message>, StoreError>;
    /// The head of each queue, in the order given: one call for a whole SUB batch.
    async fn peek_first_many(
        &self,
        recipient_ids: &[&[u8]],
    ) -> Result<Vec<Option<Message>>, StoreError>;
    /// Deletes the head if its ID is `msg_id`; returns it, its body possibly left empty (as
    /// `try_del_peek`: the journal store does not read it back).
    async fn try_del(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<Option<Message>, StoreError>;
    /// Deletes the head if its ID is `msg_id`, then returns (what was deleted, the new head). What
    /// was deleted tells which message went and its kind; its body may be left empty (the
    /// PostgreSQL and journal stores do not fetch it).
    async fn try_del_peek(
        &self,
        recipient_id: &[u8],
        msg_id: &MsgId,
    ) -> Result<(Option<Message>, Option<Message>), StoreError>;
    /// Deletes expired head messages (`ts < older_than`, never the quota marker); returns how many.
    async fn delete_expired(
        &self,
        recipient_id: &[u8],
        older_than: i64,
    ) -> Result<usize, StoreError>;
    /// Number of stored messages, the marker included.
    fn size(&self, recipient_id: &[u8]) -> usize;
    /// Messages stored over all queues of this store (a metric).
    fn total_messages(&self) -> usize;
    /// The periodic expiration: `delete_expired` over every queue; returns how many were deleted.
    async fn expire_all(&self, older_than: i64) -> Result<usize, StoreError>;
    /// The queues that may hold messages: what the periodic expiration looks at when the store
    /// waits (`MessageStore::waits`), in bounded jobs, each on its own queues.
    fn expiry_candidates(&self) -> Vec<EntityId>;
    /// `delete_expired` on each of `recipient_ids` (one statement, where the store can); returns
    /// how many were deleted.
    async fn expire_queues(
        &self,
        recipient_ids: &[EntityId],
        older_than: i64,
    ) -> Result<usize, StoreError> {
        let mut n = 0;
        for rid in recipient_ids {
            n += self.delete_expired(rid, older_than).await?;
        }
        Ok(n)
    }

    /// Appends a notification for `notifier_id` (kept in arrival order).
    async fn add_ntf(&self, notifier_id: &[u8], ntf: MsgNtf) -> Result<(), StoreError>;
    /// Takes up to `max` pending notifications of `notifier_id`, oldest first, and whether more
    /// are left.
    async fn take_ntfs(
        &self,
        notifier_id: &[u8],
        max: usize,
    ) -> Result<(Vec<MsgNtf>, bool), StoreError>;
    /// Puts back notifications taken but not delivered, ahead of those stored since (the per
    /// notifier bound still applies: the oldest go first).
    async fn return_ntfs(&self, notifier_id: &[u8], ntfs: Vec<MsgNtf>) -> Result<(), StoreError>;
    /// Drops the notifications of `notifier_id` (NDEL, NKEY replacing a notifier, DEL).
    async fn delete_ntfs(&self, notifier_id: &[u8]) -> Result<usize, StoreError>;
    /// Notifier IDs with pending notifications.
    fn ntf_ids(&self) -> Vec<EntityId>;
    /// Pending notifications over every notifier (the metrics' `ntfCount`).
    fn ntf_count(&self) -> usize;
    /// Drops notifications older than `older_than`; returns how many.
    async fn expire_ntfs(&self, older_than: i64) -> Result<usize, StoreError>;

    /// Every message of the queue, oldest first, the quota marker included; nothing changes
    /// (`store export`, `store/transfer.rs`). Empty for an unknown queue.
    async fn messages(&self, recipient_id: &[u8]) -> Result<Vec<Message>, StoreError>;
    /// The pending notifications of `notifier_id`, oldest first, without taking them (`store
    /// export`).
    async fn ntfs(&self, notifier_id: &[u8]) -> Result<Vec<MsgNtf>, StoreError>;

    /// A copy of the store's call counters.
    fn counters(&self) -> StoreCounters;

    /// Whether operations may wait for something outside the shard (a database, or a test store
    /// that holds them). The owner then runs a turn's requests on different queues side by side,
    /// in rounds (`docs/ARCHITECTURE.md` §2); the memory and journal stores never wait, and their
    /// turns run in block order.
    fn waits(&self) -> bool {
        false
    }
    /// A round begins: the operations started until it ends may go to the store together (the
    /// PostgreSQL store: the SENDs in one statement, the ACKs in another). Rounds may nest.
    fn begin_round(&self) {}
    /// The round ends: what it gathered goes to the store.
    fn end_round(&self) {}
}

/// Which store a relay runs on (`start --store`, ini `[STORE_LOG] store_messages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreKind {
    /// Kept in memory, saved at a clean stop and loaded at start.
    Memory,
    /// Memory-mapped journals per partition group (`journal.rs`): the default.
    #[default]
    Journal,
    /// PostgreSQL on the reference server's schema (`postgres.rs`).
    Postgres,
}

impl StoreKind {
    /// As `--store` and ini `[STORE_LOG] store_messages` spell it.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Journal => "journal",
            StoreKind::Postgres => "postgres",
        }
    }
}

impl StoreKind {
    /// The store whose files `data_dir` holds, if any (both: the journal, the default).
    pub fn found_in(data_dir: &std::path::Path) -> Option<StoreKind> {
        let journal = data_dir.join(journal::JOURNAL_STORE_DIR);
        let has_journal = std::fs::read_dir(&journal)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if has_journal {
            Some(StoreKind::Journal)
        } else if memory::group_files_present(&data_dir.join(memory::MEMORY_STORE_DIR)) {
            Some(StoreKind::Memory)
        } else if data_dir.join(postgres::POSTGRES_STORE_DIR).is_dir() {
            Some(StoreKind::Postgres)
        } else {
            None
        }
    }

    /// Refuses to start `self` on a data directory that holds only the other kind's files, so
    /// that a changed default or setting never starts an empty store beside the users' queues.
    pub fn check_data_dir(self, data_dir: &std::path::Path) -> Result<(), String> {
        match StoreKind::found_in(data_dir) {
            Some(found) if found != self => Err(format!(
                "{d} holds a {found} store, and this start asks for the {want} store; start with \
                 --store {found} (or [STORE_LOG] store_messages = {found}), or move it: stop the \
                 relay, `smp-relay --data-dir {d} store export --store {found} --output FILE`, \
                 `smp-relay --data-dir {d} store import --store {want} --input FILE`, then move \
                 {d}/{old} away",
                d = data_dir.display(),
                found = found.name(),
                want = self.name(),
                old = match found {
                    StoreKind::Memory => memory::MEMORY_STORE_DIR,
                    StoreKind::Journal => journal::JOURNAL_STORE_DIR,
                    StoreKind::Postgres => postgres::POSTGRES_STORE_DIR,
                },
            )),
            _ => Ok(()),
        }
    }
}

/// What every store kind is opened with.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub data_dir: PathBuf,
    /// What the memory store keeps over a restart (`[STORE_LOG] enable`, `restore_messages`).
    pub keep: Keep,
    /// Messages older than this are not loaded (`[STORE_LOG] expire_messages_days`).
    pub message_ttl_secs: i64,
    /// Notifications older than this are not loaded (`[STORE_LOG] expire_ntfs_hours`).
    pub ntf_ttl_secs: i64,
    /// Test hook: this shard's reads of queue heads wait this long first (`held.rs`).
    pub test_delay: Option<std::time::Duration>,
    /// When the journal store makes its records durable (`journal.rs`).
    pub durability: journal::Durability,
    /// The cap on the journal store's segment files, one budget shared by every shard's groups
    /// (`start --journal-max-size`); `None`: no cap but the disk's size.
    pub journal_budget: Option<smp_journal::SpaceBudget>,
    /// Records after which a journal group takes a checkpoint while the relay runs (`start
    /// --journal-checkpoint-records`): the most a start after a crash replays per group.
    pub journal_checkpoint_records: u64,
    /// The PostgreSQL store's database (`start --database`, `--schema`, `--pool-size`).
    pub postgres: Option<postgres::PgConfig>,
}

/// What the memory store saves at a clean stop and loads at start, as the reference's
/// `[STORE_LOG] enable` (queues; off: nothing is kept, as the reference without a store log) and
/// `restore_messages` (their messages and notifications). The journal and PostgreSQL stores keep
/// everything by their nature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    pub queues: bool,
    pub messages: bool,
}

impl Keep {
    pub const ALL: Keep = Keep {
        queues: true,
        messages: true,
    };
}

#[cfg(test)]
impl StoreSettings {
    /// Everything kept, every change synced before its answer, no age limit: what the stores'
    /// unit tests open with, on `data_dir`.
    pub(crate) fn for_tests(data_dir: &std::path::Path) -> Self {
        StoreSettings {
            data_dir: data_dir.to_path_buf(),
            keep: Keep::ALL,
            message_ttl_secs: i64::MAX,
            ntf_ttl_secs: i64::MAX,
            test_delay: None,
            durability: journal::Durability::EveryBatch,
            journal_budget: None,
            journal_checkpoint_records: journal::DEFAULT_CHECKPOINT_RECORDS,
            postgres: None,
        }
    }
}

/// Every partition group, `0..PARTITION_GROUPS`: what the offline tools open.
pub fn all_groups() -> Vec<u32> {
    (0..PARTITION_GROUPS).collect()
}

/// A queue as `store export` writes it and `store import` restores it: its record, its messages
/// oldest first (the quota marker included) and the pending notifications of its notifier, oldest
/// first (`store/transfer.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueData {
    pub rec: QueueRec,
    pub msgs: Vec<Message>,
    pub ntfs: Vec<MsgNtf>,
}

impl QueueData {
    /// Whether a store could hold `self` (`ShardStore::restore`): nothing after the quota marker,
    /// and notifications only for a queue with a notifier.
    pub fn check(&self) -> Result<(), StoreError> {
        if let Some(i) = self
            .msgs
            .iter()
            .position(|m| matches!(m, Message::Quota { .. }))
        {
            if i + 1 != self.msgs.len() {
                return Err(StoreError::Failed(
                    "a message after the quota marker".into(),
                ));
            }
        }
        if !self.ntfs.is_empty() && self.rec.notifier.is_none() {
            return Err(StoreError::Failed(
                "notifications for a queue without a notifier".into(),
            ));
        }
        Ok(())
    }
}

/// A store as a shard holds it: opened for the partition groups the shard owns, told when every
/// shard has opened its own and the relay serves, and closed at a clean stop. The offline tools
/// (`block`, `unblock`, `store export`, `store import`) reach a stopped relay's data through it too.
/// The relay and its command line name a concrete store only in [`with_store`].
#[allow(async_fn_in_trait)]
pub trait ShardStore: QueueStore + MessageStore + Sized + 'static {
    /// Opens (loads) the groups `groups`; changes nothing on disk that a failed start would need.
    fn open(s: &StoreSettings, groups: &[u32], now: i64) -> Result<Self, String>;
    /// Every shard opened its store and the relay is about to serve.
    fn all_opened(s: &StoreSettings) -> Result<(), String>;
    /// Where the shared directory finds IDs, when the store keeps every queue's IDs behind
    /// unique indexes and the directory need only cache them (`server/directory.rs`); `None`:
    /// the directory holds every ID, filled at start.
    fn id_source(_s: &StoreSettings) -> Result<Option<std::sync::Arc<dyn IdSource>>, String> {
        Ok(None)
    }
    /// A clean stop: make everything of `groups` durable.
    fn close(self, s: &StoreSettings, groups: &[u32]) -> Result<(), String>;
    /// The control port's `save` on a running relay: write what `close` would write, keeping the
    /// store open. Stores that make every change durable before answering have nothing to write.
    fn save_running(&self, _s: &StoreSettings, _groups: &[u32]) -> Result<(), String> {
        Ok(())
    }
    /// The record of the queue with this sender or link ID in a stopped relay's store.
    fn find_offline(s: &StoreSettings, id: &[u8]) -> Result<Option<QueueRec>, String>;
    /// Sets the status of the queue with this sender ID in a stopped relay's store.
    fn set_status_offline(
        s: &StoreSettings,
        sender_id: &[u8],
        status: QueueStatus,
    ) -> Result<(), String>;

    /// Opens every partition group of a stopped relay's store (`store export`, `store import`;
    /// the caller holds the data directory's lock). Nothing is dropped for its age when `s` has
    /// lifetimes of `i64::MAX`. [`ShardStore::close`] with [`all_groups`] makes changes durable; a
    /// store dropped without it keeps what it had made durable before (the memory store: nothing).
    fn open_offline(s: &StoreSettings) -> Result<Self, String> {
        Self::open(s, &all_groups(), crate::clock::now_secs())
    }

    /// Puts a queue back exactly as `q` has it (`store import`): the record, the messages in their
    /// order with their IDs, times and flags, the quota marker included and no quota rule applied
    /// (a queue ending with its marker stays closed to writes until drained), and the notifier's
    /// pending notifications. `Duplicate` if the recipient ID or the notifier's notifications are
    /// already there; `Failed` if `q` is not a queue a store could hold (a message after the
    /// marker, notifications without a notifier). The caller checks sender, link and notifier IDs
    /// for uniqueness, as the owner does for `create`.
    async fn restore(&self, q: QueueData) -> Result<(), StoreError>;
}

/// Work generic over the store kind, run by [`with_store`] with the kind's type.
pub trait WithStore {
    type Output;
    fn run<S: ShardStore>(self) -> Self::Output;
}

/// The one place where a store kind becomes a type. `test_delayed`: the store is wrapped in the
/// test store that delays head reads (`start --test-store-delay`, `held.rs`).
/// Only builds with the `test-kit` feature have the wrapped kinds: a release build compiles the
/// relay for three store types, not six.
pub fn with_store<W: WithStore>(kind: StoreKind, test_delayed: bool, work: W) -> W::Output {
    #[cfg(feature = "test-kit")]
    if test_delayed {
        return match kind {
            StoreKind::Memory => work.run::<held::Held<memory::MemoryStore, held::Delay>>(),
            StoreKind::Journal => work.run::<held::Held<journal::JournalStore, held::Delay>>(),
            StoreKind::Postgres => work.run::<held::Held<postgres::PostgresStore, held::Delay>>(),
        };
    }
    #[cfg(not(feature = "test-kit"))]
    let _ = test_delayed;
    match kind {
        StoreKind::Memory => work.run::<memory::MemoryStore>(),
        StoreKind::Journal => work.run::<journal::JournalStore>(),
        StoreKind::Postgres => work.run::<postgres::PostgresStore>(),
    }
}
