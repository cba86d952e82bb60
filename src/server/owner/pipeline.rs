//! The owner's work in flight, and the per-queue order that keeps it race-free
//! (`docs/ARCHITECTURE.md` §2).
//!
//! Every piece of owner work — one block's part, a connection's re-ask, returned notifications,
//! the periodic expiration — is a *job*: a future over the owner, and the queues it works on (its
//! *keys*). A job starts when it is first in line on each of its keys; it runs until it waits for
//! its store, and meanwhile the shard goes on with everything else: other jobs, and output for
//! its connections. When a job finishes, the next job in line on each of its keys may start. So
//! operations on one queue happen one after another, in the order their jobs arrived, and a job
//! with many queues (a block of 135 SUBs) holds all of them from its first step to its last, as
//! one owner turn. An expiration job on a store that never waits holds every queue: it starts
//! when nothing else runs, and jobs that arrive meanwhile wait behind it (on a store that waits,
//! the expiration comes in jobs of a few queues each, `shard::expire`).
//!
//! A job that never waits (the memory store's) runs at once inside `submit`, with no line
//! touched. No executor is involved: the pipeline polls its jobs itself when their wakers fire,
//! so the same code runs in the shard (`drive`) and in the owner simulation (`poll_woken`,
//! `server/owner/sim.rs`), where store operations complete in an order the seed chooses.
//!
//! Keys are the first 8 bytes of a recipient ID (IDs are random): two queues that share them
//! only wait for each other more than they need to.
//!
//! Bounds: jobs come from the shard's inbox, and what flows into it is bounded where it starts
//! (`docs/ARCHITECTURE.md` §4): a connection has at most `MAX_BLOCKS_IN_FLIGHT` blocks being
//! answered (one job per owner part of each) and at most one ask out; returned notifications and
//! the expiration are one job each. So jobs waiting here are at most connections ×
//! (`MAX_BLOCKS_IN_FLIGHT` + 1) plus those few, and their lines hold no more.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};

use crate::server::router::ConnRef;

/// A job: owner work as a future.
pub type Job = Pin<Box<dyn Future<Output = ()>>>;

/// The queues a job works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keys {
    Queues(Vec<u64>),
    /// Every queue of the owner (expiration).
    Everything,
}

impl Keys {
    /// The keys of these recipient IDs.
    pub fn of<'a>(ids: impl IntoIterator<Item = &'a [u8]>) -> Keys {
        let mut keys: Vec<u64> = ids.into_iter().map(key_of).collect();
        keys.sort_unstable();
        keys.dedup();
        Keys::Queues(keys)
    }
}

/// The key of a recipient ID.
pub fn key_of(recipient_id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = recipient_id.len().min(8);
    b[..n].copy_from_slice(&recipient_id[..n]);
    u64::from_le_bytes(b)
}

struct Slot {
    /// `None` while the job is being polled.
    job: Option<Job>,
    keys: Keys,
    conn: Option<ConnRef>,
    started: bool,
    /// In the lines (or the barrier); a job started on the fast path enters them only if it
    /// waits.
    in_line: bool,
}

#[derive(Default)]
struct State {
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Per key, the jobs in line; the first is running or about to.
    lines: HashMap<u64, VecDeque<usize>>,
    /// Jobs in lines (running or waiting), the `Everything` job excluded.
    in_lines: usize,
    /// The `Everything` job that waits for the lines to empty, or runs.
    barrier: Option<usize>,
    /// Jobs that arrived while a barrier waited or ran, in arrival order.
    held: VecDeque<usize>,
    /// Jobs to poll: started ones whose waker fired, and ones that may start now.
    runnable: VecDeque<usize>,
    /// Jobs submitted while another was being polled, admitted when that poll returns (so that
    /// a job that waits enters its lines before them).
    arrived: VecDeque<usize>,
    /// Jobs per connection not finished yet, and what to do when a closed one has none left.
    per_conn: HashMap<ConnRef, usize>,
    on_idle: HashMap<ConnRef, Box<dyn FnOnce()>>,
    /// One waker per slot, made once.
    wakers: Vec<Waker>,
}

/// See the module comment.
pub struct Pipeline {
    st: RefCell<State>,
    /// A job is being polled: jobs submitted meanwhile wait for the polling loop.
    polling: Cell<bool>,
    woken_tx: flume::Sender<usize>,
    woken_rx: flume::Receiver<usize>,
}

/// Wakes a slot: its index goes to the pipeline's woken list. A waker of a slot that has since
/// been reused wakes its new job for nothing, which a future tolerates.
struct SlotWaker {
    slot: usize,
    tx: flume::Sender<usize>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        let _ = self.tx.send(self.slot);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.tx.send(self.slot);
    }
}

impl Default for Pipeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Pipeline {
    pub fn new() -> Self {
        // Unbounded: a slot is sent at most once per wake, and wakes come from the jobs' own
        // store operations, at most one in flight per job.
        let (woken_tx, woken_rx) = flume::unbounded();
        Pipeline {
            st: RefCell::new(State::default()),
            polling: Cell::new(false),
            woken_tx,
            woken_rx,
        }
    }

    /// Jobs not finished.
    pub fn jobs(&self) -> usize {
        let st = self.st.borrow();
        st.slots.len() - st.free.len()
    }

    /// Takes on a job of `conn` (if it is one connection's work) on `keys`.
    pub fn submit(&self, keys: Keys, conn: Option<ConnRef>, job: Job) {
        let mut st = self.st.borrow_mut();
        let idx = st.alloc(Slot {
            job: Some(job),
            keys,
            conn,
            started: false,
            in_line: false,
        });
        if let Some(c) = conn {
            *st.per_conn.entry(c).or_insert(0) += 1;
        }
        if self.polling.get() {
            st.arrived.push_back(idx);
            return;
        }
        if st.in_lines == 0 && st.barrier.is_none() {
            // Nothing runs: the job starts now, and enters the lines only if it waits.
            st.slot(idx).started = true;
            drop(st);
            self.run(Some(idx));
            return;
        }
        st.admit(idx);
        drop(st);
        self.run(None);
    }

    /// `conn` closed: `f` runs once its jobs have finished (at once if it has none), so that
    /// nothing a job of it does afterwards registers it again.
    pub fn closed(&self, conn: ConnRef, f: impl FnOnce() + 'static) {
        let mut st = self.st.borrow_mut();
        if st.per_conn.contains_key(&conn) {
            st.on_idle.insert(conn, Box::new(f));
        } else {
            drop(st);
            f();
        }
    }

    /// Polls the jobs whose wakers fired; returns how many wakes there were.
    pub fn poll_woken(&self) -> usize {
        let mut n = 0;
        while let Ok(idx) = self.woken_rx.try_recv() {
            n += 1;
            self.woke(idx);
        }
        self.run(None);
        n
    }

    /// A started job's waker fired: it is polled again (a stale wake of a slot whose job has
    /// not started is ignored: that job starts when it is first in its lines).
    fn woke(&self, idx: usize) {
        let mut st = self.st.borrow_mut();
        if st
            .slots
            .get(idx)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.started)
        {
            st.runnable.push_back(idx);
        }
    }

    /// Polls jobs as their store operations complete; the shard runs this as a task of its own.
    pub async fn drive(&self) {
        while let Ok(idx) = self.woken_rx.recv_async().await {
            self.woke(idx);
            self.poll_woken();
        }
    }

    /// Waits until every job has finished (a clean stop), polling them as they wake.
    pub async fn drain(&self) {
        while self.jobs() > 0 {
            match self.woken_rx.recv_async().await {
                Ok(idx) => {
                    self.woke(idx);
                    self.poll_woken();
                }
                Err(_) => return,
            }
        }
    }

    /// Polls `first`, then every runnable job, until none is left. Only the outermost call
    /// polls: a job that submits another leaves it to this loop.
    fn run(&self, first: Option<usize>) {
        if self.polling.replace(true) {
            if let Some(idx) = first {
                self.st.borrow_mut().runnable.push_back(idx);
            }
            return;
        }
        let mut next = first;
        loop {
            let idx = match next.take() {
                Some(i) => i,
                None => match self.st.borrow_mut().runnable.pop_front() {
                    Some(i) => i,
                    None => break,
                },
            };
            self.poll_one(idx);
            let mut st = self.st.borrow_mut();
            while let Some(a) = st.arrived.pop_front() {
                st.admit(a);
            }
        }
        self.polling.set(false);
    }

    fn poll_one(&self, idx: usize) {
        let (mut job, waker) = {
            let mut st = self.st.borrow_mut();
            let waker = st.waker(idx, &self.woken_tx);
            let Some(slot) = st.slots.get_mut(idx).and_then(Option::as_mut) else {
                return;
            };
            let Some(job) = slot.job.take() else {
                return;
            };
            (job, waker)
        };
        let done = job
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready();
        let mut st = self.st.borrow_mut();
        if done {
            let idle = st.finish(idx);
            drop(st);
            if let Some(f) = idle {
                f();
            }
        } else {
            let slot = st.slot(idx);
            slot.job = Some(job);
            if !slot.in_line {
                // Started on the fast path and waits: it enters the lines now, first in each
                // (nothing was in them when it started, and jobs submitted since wait in
                // `arrived`).
                st.enter_lines(idx);
            }
        }
    }
}

impl State {
    fn alloc(&mut self, slot: Slot) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    fn slot(&mut self, idx: usize) -> &mut Slot {
        self.slots[idx].as_mut().expect("a live slot")
    }

    fn waker(&mut self, idx: usize, tx: &flume::Sender<usize>) -> Waker {
        while self.wakers.len() <= idx {
            let slot = self.wakers.len();
            self.wakers.push(Waker::from(Arc::new(SlotWaker {
                slot,
                tx: tx.clone(),
            })));
        }
        self.wakers[idx].clone()
    }

    /// Puts a started job into the lines (the fast path's job that waits).
    fn enter_lines(&mut self, idx: usize) {
        self.slot(idx).in_line = true;
        match self.slot(idx).keys.clone() {
            Keys::Everything => self.barrier = Some(idx),
            Keys::Queues(keys) => {
                self.in_lines += 1;
                if keys.is_empty() {
                    self.lines.entry(KEYLESS).or_default().push_back(idx);
                }
                for k in keys {
                    self.lines.entry(k).or_default().push_back(idx);
                }
            }
        }
    }

    /// A job that was not started on the fast path takes its place: behind a barrier, as the
    /// barrier, or in its lines, and is runnable if first in each.
    fn admit(&mut self, idx: usize) {
        if self.barrier.is_some() {
            self.held.push_back(idx);
            return;
        }
        self.slot(idx).in_line = true;
        match self.slot(idx).keys.clone() {
            Keys::Everything => {
                self.barrier = Some(idx);
                if self.in_lines == 0 {
                    self.start(idx);
                }
            }
            Keys::Queues(keys) => {
                self.in_lines += 1;
                if keys.is_empty() {
                    // Waits for nothing but counts as running, so a barrier waits for it.
                    self.lines.entry(KEYLESS).or_default().push_back(idx);
                    self.start(idx);
                    return;
                }
                for k in &keys {
                    self.lines.entry(*k).or_default().push_back(idx);
                }
                if self.first_in_all(&keys, idx) {
                    self.start(idx);
                }
            }
        }
    }

    fn first_in_all(&self, keys: &[u64], idx: usize) -> bool {
        keys.iter()
            .all(|k| self.lines.get(k).and_then(|l| l.front()) == Some(&idx))
    }

    fn start(&mut self, idx: usize) {
        let slot = self.slot(idx);
        if !slot.started {
            slot.started = true;
            self.runnable.push_back(idx);
        }
    }

    /// A job finished: it leaves its lines, and whoever is next may start. Returns what to run
    /// for a closed connection that now has no job left.
    fn finish(&mut self, idx: usize) -> Option<Box<dyn FnOnce()>> {
        let slot = self.slots[idx].take().expect("a live slot");
        self.free.push(idx);
        if !slot.in_line {
            // Ran to its end on the fast path.
        } else if self.barrier == Some(idx) {
            self.barrier = None;
            let held: Vec<usize> = self.held.drain(..).collect();
            for (n, h) in held.iter().enumerate() {
                self.admit(*h);
                if self.barrier.is_some() {
                    // Another barrier: the rest wait behind it again, in order.
                    for later in held[n + 1..].iter().rev() {
                        self.held.push_front(*later);
                    }
                    break;
                }
            }
        } else if let Keys::Queues(keys) = &slot.keys {
            let keys: &[u64] = if keys.is_empty() { &[KEYLESS] } else { keys };
            let mut next = Vec::new();
            for k in keys {
                if let Some(line) = self.lines.get_mut(k) {
                    line.retain(|i| *i != idx);
                    match line.front() {
                        Some(f) => next.push(*f),
                        None => {
                            self.lines.remove(k);
                        }
                    }
                }
            }
            self.in_lines -= 1;
            for n in next {
                let ready = match &self.slots[n].as_ref().expect("a job in line").keys {
                    Keys::Queues(ks) => ks.is_empty() || self.first_in_all(ks, n),
                    Keys::Everything => false,
                };
                if ready {
                    self.start(n);
                }
            }
            if self.in_lines == 0 {
                if let Some(b) = self.barrier {
                    self.start(b);
                }
            }
        }
        let conn = slot.conn?;
        let left = self.per_conn.get_mut(&conn)?;
        *left -= 1;
        if *left > 0 {
            return None;
        }
        self.per_conn.remove(&conn);
        self.on_idle.remove(&conn)
    }
}

/// The line of jobs without keys (NEW only, or IDs no queue has): they wait for nothing, but a
/// barrier waits for them. Not a key of any recipient ID that matters: a collision only orders
/// that queue behind keyless jobs.
const KEYLESS: u64 = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;
    use std::task::Poll;

    /// A future that waits until its gate opens, then logs its name.
    struct Gate {
        open: Cell<bool>,
        waker: RefCell<Option<Waker>>,
    }

    impl Gate {
        fn new() -> Rc<Gate> {
            Rc::new(Gate {
                open: Cell::new(false),
                waker: RefCell::new(None),
            })
        }

        fn open(&self) {
            self.open.set(true);
            if let Some(w) = self.waker.borrow_mut().take() {
                w.wake();
            }
        }

        async fn wait(self: Rc<Self>) {
            std::future::poll_fn(|cx| {
                if self.open.get() {
                    Poll::Ready(())
                } else {
                    *self.waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await
        }
    }

    fn job(log: &Rc<RefCell<Vec<String>>>, name: &str, gate: Option<Rc<Gate>>) -> Job {
        let log = log.clone();
        let name = name.to_string();
        Box::pin(async move {
            log.borrow_mut().push(format!("{name} start"));
            if let Some(g) = gate {
                g.wait().await;
            }
            log.borrow_mut().push(format!("{name} end"));
        })
    }

    fn keys(ids: &[u8]) -> Keys {
        Keys::Queues(ids.iter().map(|i| *i as u64).collect())
    }

    #[test]
    fn a_waiting_job_holds_its_queues_only() {
        let p = Pipeline::new();
        let log = Rc::new(RefCell::new(Vec::new()));
        let g = Gate::new();
        p.submit(keys(&[1, 2]), None, job(&log, "a", Some(g.clone())));
        p.submit(keys(&[3]), None, job(&log, "b", None));
        p.submit(keys(&[2, 3]), None, job(&log, "c", None));
        p.submit(keys(&[4]), None, job(&log, "d", None));
        assert_eq!(
            *log.borrow(),
            ["a start", "b start", "b end", "d start", "d end"],
            "b and d run while a waits; c waits for a (queue 2)"
        );
        g.open();
        assert_eq!(p.poll_woken(), 1);
        assert_eq!(
            log.borrow()[5..],
            ["a end", "c start", "c end"],
            "c follows a"
        );
        assert_eq!(p.jobs(), 0);
    }

    #[test]
    fn jobs_on_one_queue_keep_their_arrival_order() {
        let p = Pipeline::new();
        let log = Rc::new(RefCell::new(Vec::new()));
        let gates: Vec<Rc<Gate>> = (0..3).map(|_| Gate::new()).collect();
        for (i, g) in gates.iter().enumerate() {
            p.submit(
                keys(&[7]),
                None,
                job(&log, &format!("j{i}"), Some(g.clone())),
            );
        }
        // Opened in reverse: each job still waits for the one before it.
        gates[2].open();
        gates[1].open();
        p.poll_woken();
        assert_eq!(*log.borrow(), ["j0 start"]);
        gates[0].open();
        p.poll_woken();
        assert_eq!(
            *log.borrow(),
            ["j0 start", "j0 end", "j1 start", "j1 end", "j2 start", "j2 end"]
        );
    }

    #[test]
    fn everything_waits_for_the_running_and_holds_the_later() {
        let p = Pipeline::new();
        let log = Rc::new(RefCell::new(Vec::new()));
        let g = Gate::new();
        p.submit(keys(&[1]), None, job(&log, "a", Some(g.clone())));
        p.submit(Keys::Everything, None, job(&log, "all", None));
        p.submit(keys(&[9]), None, job(&log, "b", None));
        assert_eq!(
            *log.borrow(),
            ["a start"],
            "the barrier waits for a, b for it"
        );
        g.open();
        p.poll_woken();
        assert_eq!(
            *log.borrow(),
            [
                "a start",
                "a end",
                "all start",
                "all end",
                "b start",
                "b end"
            ]
        );
    }

    #[test]
    fn a_closed_connection_is_forgotten_after_its_last_job() {
        let p = Pipeline::new();
        let log = Rc::new(RefCell::new(Vec::new()));
        let g = Gate::new();
        let c = ConnRef { shard: 0, id: 5 };
        p.submit(keys(&[1]), Some(c), job(&log, "a", Some(g.clone())));
        let l = log.clone();
        p.closed(c, move || l.borrow_mut().push("closed".into()));
        assert_eq!(*log.borrow(), ["a start"]);
        g.open();
        p.poll_woken();
        assert_eq!(*log.borrow(), ["a start", "a end", "closed"]);
        let other = ConnRef { shard: 0, id: 6 };
        let l = log.clone();
        p.closed(other, move || l.borrow_mut().push("other closed".into()));
        assert_eq!(
            log.borrow().last().map(String::as_str),
            Some("other closed")
        );
    }
}
