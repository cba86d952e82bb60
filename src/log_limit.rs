//! Warnings a peer can cause at will (a refused connection, a failed accept, a PRXY to a relay that
//! cannot be reached), or an outage (the PostgreSQL store's database gone: every pooled connection
//! attempt fails), would otherwise fill the log: 10,000 refused connections wrote 9,112 lines. Each kind writes at most one line per `limits::WARNING_INTERVAL`; the lines held back are
//! counted, and the count is written with the next line of that kind (`suppressed=N`), or on a
//! line of its own once the interval is over, so a flood that ends is still reported whole.
//!
//! Each kind is one `static` shared by all shards: it is touched once per warning, never on a
//! request's path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::limits::WARNING_INTERVAL;

/// The interval in milliseconds: `WARNING_INTERVAL` unless the hidden test flag
/// `--test-warning-interval-ms` shortened it, so that the log tests wait for a flush in a tenth
/// of a second instead of a second.
static INTERVAL_MS: AtomicU64 = AtomicU64::new(WARNING_INTERVAL.as_millis() as u64);

/// Test hook: the interval of every kind (set once at start, before any warning).
pub fn set_interval(d: Duration) {
    INTERVAL_MS.store(d.as_millis().max(1) as u64, Ordering::Relaxed);
}

fn interval() -> Duration {
    Duration::from_millis(INTERVAL_MS.load(Ordering::Relaxed))
}

/// One kind of warning and what it held back.
pub struct RateLimited {
    what: &'static str,
    state: Mutex<State>,
}

struct State {
    /// When the last line of this kind was written.
    last: Option<Instant>,
    /// Lines held back since then.
    suppressed: u64,
    /// A task will write the count; no other is needed.
    flush_pending: bool,
}

/// What to do with one warning.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Write it, with the count held back since the previous line.
    Write { suppressed: u64 },
    /// Hold it back; `Some(at)`: no one will report the count yet, so the caller arranges a
    /// `flush` at `at`.
    Hold { flush_at: Option<Instant> },
}

/// What a `flush` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Flush {
    /// Write a line with this count.
    Write(u64),
    /// Nothing held back (a line of this kind already carried the count).
    Nothing,
    /// A line was written since the flush was arranged: try again at this time.
    Again(Instant),
}

impl RateLimited {
    pub const fn new(what: &'static str) -> Self {
        RateLimited {
            what,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
                flush_pending: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two numbers, valid whatever a panicking holder did.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn decide(&self, now: Instant) -> Decision {
        let mut s = self.state();
        match s.last {
            Some(t) if now.saturating_duration_since(t) < interval() => {
                s.suppressed += 1;
                if s.flush_pending {
                    Decision::Hold { flush_at: None }
                } else {
                    s.flush_pending = true;
                    Decision::Hold {
                        flush_at: Some(t + interval()),
                    }
                }
            }
            _ => {
                s.last = Some(now);
                Decision::Write {
                    suppressed: std::mem::take(&mut s.suppressed),
                }
            }
        }
    }

    pub fn flush(&self, now: Instant) -> Flush {
        let mut s = self.state();
        if s.suppressed == 0 {
            s.flush_pending = false;
            return Flush::Nothing;
        }
        match s.last {
            Some(t) if now.saturating_duration_since(t) < interval() => {
                Flush::Again(t + interval())
            }
            _ => {
                s.last = Some(now);
                s.flush_pending = false;
                Flush::Write(std::mem::take(&mut s.suppressed))
            }
        }
    }
}

/// Writes a warning of `kind` through `write` (given the count held back before it), or holds it
/// back. Runs on a shard's executor: the count of a flood that ends is written by a task of it.
/// (Off the executors, [`RateLimited::decide`] alone: the count goes with the next line.)
pub fn warn(kind: &'static RateLimited, write: impl FnOnce(u64)) {
    match kind.decide(Instant::now()) {
        Decision::Write { suppressed } => write(suppressed),
        Decision::Hold { flush_at: None } => {}
        Decision::Hold {
            flush_at: Some(mut at),
        } => {
            glommio::spawn_local(async move {
                loop {
                    glommio::timer::Timer::new(at.saturating_duration_since(Instant::now())).await;
                    match kind.flush(Instant::now()) {
                        Flush::Write(n) => {
                            tracing::warn!(
                                suppressed = n,
                                "{}: {n} more in the last {:?} were not logged",
                                kind.what,
                                interval()
                            );
                            break;
                        }
                        Flush::Nothing => break,
                        Flush::Again(next) => at = next,
                    }
                }
            })
            .detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn one_line_per_interval_and_the_next_carries_the_count() {
        let k = RateLimited::new("t");
        let t0 = Instant::now();
        assert_eq!(k.decide(t0), Decision::Write { suppressed: 0 });
        assert_eq!(
            k.decide(t0 + MS),
            Decision::Hold {
                flush_at: Some(t0 + WARNING_INTERVAL)
            },
            "the first held line arranges the count's report"
        );
        for i in 2..10 {
            assert_eq!(k.decide(t0 + i * MS), Decision::Hold { flush_at: None });
        }
        assert_eq!(
            k.decide(t0 + WARNING_INTERVAL),
            Decision::Write { suppressed: 9 }
        );
        // The arranged flush finds the count already written.
        assert_eq!(k.flush(t0 + WARNING_INTERVAL), Flush::Nothing);
    }

    #[test]
    fn a_flood_that_ends_is_reported_by_the_flush() {
        let k = RateLimited::new("t");
        let t0 = Instant::now();
        k.decide(t0);
        for i in 1..=5 {
            k.decide(t0 + i * MS);
        }
        assert_eq!(
            k.flush(t0 + WARNING_INTERVAL / 2),
            Flush::Again(t0 + WARNING_INTERVAL),
            "not before the interval is over"
        );
        assert_eq!(k.flush(t0 + WARNING_INTERVAL), Flush::Write(5));
        assert_eq!(k.flush(t0 + 2 * WARNING_INTERVAL), Flush::Nothing);
        // The flush was a line: the next warning within its interval is held again.
        assert_eq!(
            k.decide(t0 + WARNING_INTERVAL + MS),
            Decision::Hold {
                flush_at: Some(t0 + 2 * WARNING_INTERVAL)
            }
        );
    }

    #[test]
    fn a_long_flood_writes_few_lines_and_loses_no_count() {
        let k = RateLimited::new("t");
        let t0 = Instant::now();
        let (events, span) = (10_000u32, 5 * WARNING_INTERVAL);
        let (mut lines, mut counted) = (0u64, 0u64);
        let mut flushes = Vec::new();
        for i in 0..events {
            let now = t0 + span * i / events;
            // Flushes arranged earlier run when their time comes, as the executor would.
            flushes.retain(|at: &Instant| {
                if *at > now {
                    return true;
                }
                match k.flush(*at) {
                    Flush::Write(n) => {
                        lines += 1;
                        counted += n;
                        false
                    }
                    Flush::Nothing => false,
                    Flush::Again(_) => true,
                }
            });
            match k.decide(now) {
                Decision::Write { suppressed } => {
                    lines += 1;
                    counted += 1 + suppressed;
                }
                Decision::Hold { flush_at: Some(at) } => flushes.push(at),
                Decision::Hold { flush_at: None } => {}
            }
        }
        if let Flush::Write(n) = k.flush(t0 + span + WARNING_INTERVAL) {
            lines += 1;
            counted += n;
        }
        assert_eq!(counted, u64::from(events), "every warning is counted once");
        assert!(
            lines <= 7,
            "{lines} lines for {events} warnings over 5 intervals"
        );
    }
}
