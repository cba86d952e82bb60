//! What the control port asks of shards (`ShardMsg::Control`) and what they answer: each shard's
//! numbers and connections, and operations on a queue, which run on the queue's owner in the
//! per-queue order (`docs/ARCHITECTURE.md` §2) like any command on it.

use crate::metrics::MetricsSnapshot;
use crate::protocol::command::QueueMode;
use crate::protocol::error::{BlockingInfo, ErrorType};
use crate::store::{EntityId, QueueStatus};

pub enum ControlMsg {
    /// This shard's numbers, as it gives them for the metrics file (`stats`).
    Stats {
        reply: flume::Sender<Box<MetricsSnapshot>>,
    },
    /// This shard's connections and the subscriptions its owner holds (`clients`, `server-info`).
    Clients { reply: flume::Sender<ShardClients> },
    /// `save`: write what a clean stop would write, without stopping (`ShardStore::save_running`).
    Save {
        reply: flume::Sender<Result<(), String>>,
    },
    /// An operation on a queue this shard owns, found by its recipient ID.
    Queue {
        recipient_id: EntityId,
        op: QueueOp,
        reply: flume::Sender<Result<QueueOutcome, ErrorType>>,
    },
}

/// What the control port does to a queue (simplexmq `Server.hs`, the control port's `delete`,
/// `status`, `block` and `unblock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueOp {
    Status,
    /// Blocks the queue with this info unless it is blocked with it already; its subscriber gets
    /// `ERR BLOCKED`.
    Block(BlockingInfo),
    Unblock,
    /// Deletes the queue and its messages; nobody is told.
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueOutcome {
    Status {
        status: QueueStatus,
        updated_at: Option<i64>,
        mode: Option<QueueMode>,
    },
    /// The status the queue had before `Block` (it is blocked now).
    Blocked { was: QueueStatus },
    /// The status the queue had before `Unblock` (only a blocked one changed).
    Unblocked { was: QueueStatus },
    /// Messages the deleted queue held (a quota marker counts as one).
    Deleted { messages: usize },
}

/// One established connection of a shard.
#[derive(Debug, Clone)]
pub struct ClientRow {
    pub shard: usize,
    pub id: u64,
    pub session_id: Vec<u8>,
    /// Unix seconds of the connection's SMP handshake.
    pub created_at: i64,
    /// Unix seconds of its last block in or out.
    pub active_at: i64,
}

/// A shard's answer to `Clients`: its connections, and its owner's subscriptions by connection
/// (shard, number) — queue subscriptions and notifier subscriptions.
#[derive(Debug, Clone, Default)]
pub struct ShardClients {
    pub connections: Vec<ClientRow>,
    pub subs: Vec<((usize, u64), usize, usize)>,
    pub queue_subscriptions: usize,
    pub ntf_subscriptions: usize,
}
