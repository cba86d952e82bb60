//! What shards send each other, typed by who handles it (`docs/ARCHITECTURE.md` §1): work for the
//! receiving shard's owner (`OwnerMsg`), output for its connections (`ConnMsg`), rounds of
//! statistics (`StatsMsg`), the control port's requests (`ControlMsg`), and the shard's own
//! (`Room`, `Hold`, `Stop`). The inbox loop (`shard/mod.rs`) hands each role to the one place that
//! handles it: `owner::owner_job` (`owner/jobs.rs`), `ShardContext::conn_msg`
//! (`shard/context.rs`), `shard/rounds.rs`, and `owner::control_job` (`owner/jobs.rs`).
//!
//! Senders write the role's message (`mesh.send(shard, ConnMsg::Close { conn })`): every role
//! converts into a `ShardMsg`.

use super::control::request::ControlMsg;
use super::router::{ConnRef, CountHash, Group, Pending, Request, ServiceKey, Session};
use crate::metrics::MetricsSnapshot;
use crate::store::{EntityId, MsgNtf};

/// One message of a shard's inbox.
pub enum ShardMsg {
    Owner(OwnerMsg),
    Conn(ConnMsg),
    Stats(StatsMsg),
    /// The control port's requests (`server/control/`).
    Control(ControlMsg),
    /// Shard `shard`'s inbox has room for events again (it fell to `INBOX_EVENTS_ROOM_AT` after a
    /// sender found it full): send what was held back for it (`ShardMesh::room`).
    Room {
        shard: usize,
    },
    /// Test hook (`clock_control`): say so on `started`, then block the shard's thread until
    /// `release` ends (at most `clock_control::MAX_HOLD`), as a shard busy with its own work would
    /// take nothing from its inbox meanwhile.
    Hold {
        started: flume::Sender<()>,
        release: flume::Receiver<()>,
    },
    /// Stop: save what must be saved, then end the shard.
    Stop,
}

/// Work for the owner of the receiving shard's queues: each becomes a job of its pipeline, in
/// per-queue order, or is done at once when it touches no queue's order (`owner/jobs.rs`).
pub enum OwnerMsg {
    /// Requests of one block for queues this shard owns, in block order.
    Work {
        session: Session,
        block_seq: u64,
        requests: Vec<Request>,
    },
    /// The connection is gone: drop its subscriptions.
    Closed { conn: ConnRef },
    /// A connection dropped these deliveries unsent (its output was over its bound), or was told
    /// there is more for it, and has room again: hand each queue's head (or the next notifications)
    /// to it if the subscription is still the same. Always answered with `ConnMsg::Redelivered`.
    Redeliver { conn: ConnRef, items: Vec<Pending> },
    /// Notifications that could not be queued for their connection: store them again.
    ReturnNtfs {
        notifier_id: EntityId,
        ntfs: Vec<MsgNtf>,
    },
    /// Registers a subscriber after its SUB was answered: only a relay started with
    /// `--test-late-registration` sends this, to show that the race tests catch the reference's
    /// late registration.
    #[cfg(feature = "test-kit")]
    RegisterSub {
        session: Session,
        recipient_id: EntityId,
        epoch: u64,
    },
    /// `SUBS`/`NSUBS`, first step, fanned out to every shard: this owner's count and hash of the
    /// service's queues, answered to `reply_to` as a `ConnMsg::ServicePart` of `round`.
    ServiceCount {
        key: ServiceKey,
        reply_to: usize,
        round: u64,
    },
    /// `SUBS`/`NSUBS`, second step, fanned out to every shard: `session` becomes the service's
    /// subscriber and (role M) the service's queues with messages are handed to it; a
    /// `ConnMsg::ServicePart` of `round` says it is done. `answered` is what the connection was
    /// answered (`SOKS`), which the service's home shard keeps for `ENDS`.
    ServiceTake {
        key: ServiceKey,
        session: Session,
        answered: CountHash,
        round: u64,
    },
    /// To the service's home shard: `session` subscribed one of the service's queues.
    ServiceSubscribed {
        key: ServiceKey,
        session: Session,
        hash: [u8; 16],
        newly: bool,
    },
    /// To the service's home shard: one of the service's queues went.
    ServiceDropped { key: ServiceKey, hash: [u8; 16] },
    /// From the service's home shard to every shard: `session` is the service's subscriber now.
    ServiceSwitch { key: ServiceKey, session: Session },
    /// To the service's home shard: the count and hash of `conn`, if it is the service's
    /// subscribed connection (a repeated `SUBS`), answered as a `ConnMsg::ServicePart` of `round`.
    ServiceCurrent {
        key: ServiceKey,
        conn: ConnRef,
        reply_to: usize,
        round: u64,
    },
    /// How many subscriptions `conn` holds on this owner (queues, notifiers, services), answered
    /// as the count of a `ConnMsg::ServicePart` of `round` (`[INACTIVE_CLIENTS]`).
    ConnSubs {
        conn: ConnRef,
        reply_to: usize,
        round: u64,
    },
    /// Periodic work of an owner (expiration).
    Tick,
    /// Test hook (`clock_control`): run the expiration now, then say so on `done`.
    ExpireNow { done: flume::Sender<()> },
}

/// Output for one of the receiving shard's connections, or an answer to what a connection asked
/// every shard (`ShardContext::conn_msg`).
pub enum ConnMsg {
    /// The part of a block's answer one owner produced.
    Reply {
        conn: ConnRef,
        block_seq: u64,
        groups: Vec<Group>,
    },
    /// Something for a connection that no request of it caused now (END, DELD, a pushed MSG, NMSG).
    Event { conn: ConnRef, groups: Vec<Group> },
    /// The owner's answer to `OwnerMsg::Redeliver`, possibly empty: the connection then asks for
    /// the next items it holds, so that stale items never leave live ones unasked (I2).
    Redelivered { conn: ConnRef, groups: Vec<Group> },
    /// An owner asks a connection's shard to close it (it spent its verification budget).
    Close { conn: ConnRef },
    /// One shard's answer to `ServiceCount`, `ServiceTake`, `ServiceCurrent` or `ConnSubs`.
    ServicePart { round: u64, part: CountHash },
}

/// Rounds of statistics: a shard asks every shard for its numbers and writes their sum
/// (`shard/rounds.rs`).
pub enum StatsMsg {
    /// Time to write the metrics file (shard 0): it asks every shard for its numbers.
    Metrics,
    /// Test hook (`clock_control`), to shard 0: write the metrics file now (a round of
    /// `Request`), then say so on `done`.
    MetricsNow { done: flume::Sender<()> },
    /// A request fanned out to every shard: send this shard's numbers to `reply_to`.
    Request { reply_to: usize, round: u64 },
    /// One shard's answer to `Request`, gathered by the shard that asked.
    Part {
        round: u64,
        part: Box<MetricsSnapshot>,
    },
    /// To shard 0: write the daily statistics line if it is due (`log_stats`), then say so on
    /// `done` (the timer, or the test hook `clock_control`).
    Daily { done: Option<flume::Sender<()>> },
    /// A daily line's request to every shard: send this shard's numbers to `reply_to`, then
    /// start its day's (and on Mondays its week's, on the 1st its month's) active queues again.
    DailyRequest {
        reply_to: usize,
        round: u64,
        week: bool,
        month: bool,
    },
    /// One shard's answer to `DailyRequest`.
    DailyPart {
        round: u64,
        part: Box<MetricsSnapshot>,
    },
}

impl ShardMsg {
    /// Messages that no request of the receiving shard asked for, and that nothing else bounds
    /// where they start: events for its connections (END, DELD, ENDS, NMSG, MSG pushes), service
    /// switches and service counts. An inbox holds at most `MAX_INBOX_EVENTS` of them.
    pub fn is_event(&self) -> bool {
        matches!(
            self,
            ShardMsg::Conn(ConnMsg::Event { .. })
                | ShardMsg::Owner(
                    OwnerMsg::ServiceSwitch { .. }
                        | OwnerMsg::ServiceSubscribed { .. }
                        | OwnerMsg::ServiceDropped { .. }
                )
        )
    }
}

impl From<OwnerMsg> for ShardMsg {
    fn from(m: OwnerMsg) -> Self {
        ShardMsg::Owner(m)
    }
}

impl From<ConnMsg> for ShardMsg {
    fn from(m: ConnMsg) -> Self {
        ShardMsg::Conn(m)
    }
}

impl From<StatsMsg> for ShardMsg {
    fn from(m: StatsMsg) -> Self {
        ShardMsg::Stats(m)
    }
}

impl From<ControlMsg> for ShardMsg {
    fn from(m: ControlMsg) -> Self {
        ShardMsg::Control(m)
    }
}
