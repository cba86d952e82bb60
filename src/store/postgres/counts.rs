//! The count of a relay's queues and notifiers by partition group, made once for all of its
//! shards after the start (each shard's store sums its groups): one pass over the table, in
//! which each row's group costs a SHA-256, instead of one such pass per shard. It runs on a
//! session and thread of its own (`pool::Shared::spawn_own`), not on one of the pool's, which the
//! commands need meanwhile.

use std::sync::Arc;

use crate::store::PARTITION_GROUPS;

/// Queues and notifiers of each partition group.
pub type Counts = Arc<[(i64, i64); PARTITION_GROUPS as usize]>;

/// What a shard that asked gets.
pub type Answer = Result<Counts, String>;

/// The relay's count, shared by its shards' stores through the pool (`pool::Shared::counts`).
#[derive(Default)]
pub enum State {
    /// Not asked yet (or the last count failed).
    #[default]
    Idle,
    /// Sent: the shards waiting for it, and the server process running it once it runs (a stop
    /// ends that session: the statement would otherwise run to its end after the relay left).
    Running {
        waiting: Vec<flume::Sender<Answer>>,
        pid: Option<i32>,
        /// A stop came: a count that has not begun does not.
        cancelled: bool,
        /// A start's count, its snapshot taken, waits for this before it scans, so that its scan
        /// does not slow the rest of the start: the first shard that serves sends it.
        scan: Option<flume::Sender<()>>,
    },
    Done(Counts),
}

/// Gives `answer` to every shard waiting for it; a count made is kept for those that ask later.
pub fn answer(state: &mut State, answer: Answer) {
    let waiting = match std::mem::take(state) {
        State::Running { waiting, .. } => waiting,
        _ => Vec::new(),
    };
    if let Ok(c) = &answer {
        *state = State::Done(c.clone());
    }
    for w in waiting {
        let _ = w.send(answer.clone());
    }
}
