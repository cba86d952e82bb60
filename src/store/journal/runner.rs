//! Where the journal store's background work runs: the sync thread, the compaction writer, the
//! removal of retired segments and the writing of checkpoints. The relay runs them on threads of
//! the store's own; the storage fault simulator (`journal/sim.rs`) queues them and runs each at a
//! point its seed chooses, on its one thread, so that a seed replays the same calls in the same
//! order every time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send>;

/// How the store runs background work.
#[derive(Clone, Default)]
pub(crate) enum Runner {
    /// Threads of the store's own.
    #[default]
    Threads,
    /// A queue the caller runs ([`Manual::run_next`]): the storage fault simulator.
    #[cfg_attr(not(test), allow(dead_code))]
    Manual(Manual),
}

/// Background jobs waiting for their caller to run them.
#[derive(Clone, Default)]
pub(crate) struct Manual(Arc<Mutex<VecDeque<Job>>>);

impl Manual {
    fn jobs(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the oldest waiting job; false when none waits.
    #[cfg(test)]
    pub(crate) fn run_next(&self) -> bool {
        let job = self.jobs().pop_front();
        match job {
            Some(job) => {
                job();
                true
            }
            None => false,
        }
    }

    /// Runs jobs until none waits (jobs may queue more).
    #[cfg(test)]
    pub(crate) fn run_all(&self) {
        while self.run_next() {}
    }

    /// Jobs waiting.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.jobs().len()
    }
}

impl Runner {
    /// Runs `job` on a thread named `name`, or queues it. A thread that cannot be started is an
    /// error (the caller says what it could not do).
    pub(crate) fn spawn(
        &self,
        name: &str,
        job: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Option<JoinHandle<()>>> {
        match self {
            Runner::Threads => std::thread::Builder::new()
                .name(name.into())
                .spawn(job)
                .map(Some),
            Runner::Manual(m) => {
                m.jobs().push_back(Box::new(job));
                Ok(None)
            }
        }
    }

    pub(crate) fn is_manual(&self) -> bool {
        matches!(self, Runner::Manual(_))
    }
}
