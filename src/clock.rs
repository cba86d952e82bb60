//! The relay's clock, and UTC times as the reference prints them (aeson's `UTCTime`, the metrics
//! file's header).
//!
//! Every time the relay's logic reads (message timestamps, expiration, a queue's `updated_at`, the
//! metrics file's header) comes from [`now_secs`] / [`now_ms`]: wall time plus an offset. The offset
//! is 0 unless the hidden test flags (`--test-clock-offset-secs`, `--test-clock-control`, see
//! `src/server/shard/clock_control.rs`) move it, so that the expiry and persistence tests advance time
//! instead of sleeping. On the request path it costs one relaxed atomic load.
//!
//! Durations the relay measures (the slow-reader limit, `src/server/conn/mod.rs`) use [`Stamp`]: the
//! monotonic clock plus whatever the test hooks advanced since, so that a test advances the clock
//! past a limit instead of waiting for it, and wall-clock steps never move it.

use std::sync::atomic::{AtomicI64, Ordering};

/// Seconds added to the wall clock; only the test hooks change it.
static OFFSET_SECS: AtomicI64 = AtomicI64::new(0);

fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Unix seconds now, as the relay sees it.
pub fn now_secs() -> i64 {
    wall_ms().div_euclid(1000) + OFFSET_SECS.load(Ordering::Relaxed)
}

/// Unix milliseconds now, as the relay sees it.
pub fn now_ms() -> u64 {
    (wall_ms() + OFFSET_SECS.load(Ordering::Relaxed) * 1000).max(0) as u64
}

/// Moves the relay's clock `secs` forward (test hooks only): time never goes back for the relay's
/// logic, so a negative amount is refused by the callers.
pub fn advance(secs: i64) {
    OFFSET_SECS.fetch_add(secs, Ordering::Relaxed);
}

/// A monotonic instant on the relay's clock: `Instant` plus the test offset at the time, so that
/// `elapsed` counts what the test hooks advanced since as time passed.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    at: std::time::Instant,
    offset_secs: i64,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp {
            at: std::time::Instant::now(),
            offset_secs: OFFSET_SECS.load(Ordering::Relaxed),
        }
    }

    /// Time since this stamp as the relay sees it (the offset only grows: `advance`).
    pub fn elapsed(&self) -> std::time::Duration {
        let advanced = OFFSET_SECS.load(Ordering::Relaxed) - self.offset_secs;
        self.at.elapsed() + std::time::Duration::from_secs(advanced.max(0) as u64)
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The UTC date of Unix seconds: year, month (1-12), day of the month (1-31), and the day of the
/// week (1 Monday … 7 Sunday).
pub fn utc_date(secs: i64) -> (i64, i64, i64, i64) {
    let days = secs.div_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    // 1970-01-01 was a Thursday.
    (y, m, d, (days + 3).rem_euclid(7) + 1)
}

/// `YYYY-MM-DDTHH:MM:SS` of Unix seconds.
fn date_time(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix seconds as aeson encodes a whole-second `UTCTime`: `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_time(secs: i64) -> String {
    format!("{}Z", date_time(secs))
}

/// Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn utc_time_ms(ms: u64) -> String {
    format!("{}.{:03}Z", date_time((ms / 1000) as i64), ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_time_of_known_instants() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn utc_time_ms_of_known_instants() {
        assert_eq!(utc_time_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_time_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc_time_ms(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
