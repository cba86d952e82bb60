//! The `start --test-*` flags: hooks the integration tests use to reach into a running relay
//! (delays, faults, a controllable clock, shorter timers). Compiled only with the `test-kit`
//! feature, which test and bench builds turn on (`Cargo.toml`); the relay that operators build with
//! `cargo build --release` has none of them, hidden or not.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use smp_relay::config::{self, StartConfig};

#[derive(Args)]
pub struct TestFlags {
    /// Shard SHARD's reads of queue heads wait MS milliseconds first (`store/held.rs`).
    #[arg(long, hide = true, value_name = "SHARD:MS", value_parser = shard_delay)]
    test_store_delay: Option<(usize, Duration)>,
    /// Each connection's output high water mark in bytes (the low water mark, hard limit and
    /// re-ask batch follow from it as the defaults do from 1 MiB).
    #[arg(long, hide = true, value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    test_output_high_water_bytes: Option<u64>,
    /// Shard SHARD fails its start (`bind`: its listener; `exit`: its thread ends first).
    #[arg(long, hide = true, value_name = "SHARD:bind|exit", value_parser = start_fault)]
    test_fail_start: Option<(usize, config::StartFault)>,
    /// Serve clock-control commands (`advance SECS`, `expire`, `metrics`) on a Unix socket at
    /// PATH, so that tests move the relay's time instead of sleeping.
    #[arg(long, hide = true, value_name = "PATH")]
    test_clock_control: Option<PathBuf>,
    /// The relay's clock starts SECS ahead of the wall clock (it applies to the store's load at
    /// start, before the control socket serves).
    #[arg(long, hide = true, value_name = "SECS", value_parser = clap::value_parser!(u32))]
    test_clock_offset_secs: Option<u32>,
    /// Rate-limited warnings (`log_limit`) write one line per MS milliseconds instead of one a
    /// second, so that the log tests need not wait a second for the count.
    #[arg(long, hide = true, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    test_warning_interval_ms: Option<u64>,
    /// The slow-reader watchdog looks every MS milliseconds instead of every quarter of the
    /// limit, so that a test advancing the clock past a long limit sees the close at once.
    #[arg(long, hide = true, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    test_slow_reader_tick_ms: Option<u64>,
    /// The TLS handshake timeout in milliseconds instead of `--tls-timeout-secs`, so that the
    /// handshake-timeout tests need not wait a whole second.
    #[arg(long, hide = true, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    test_tls_timeout_ms: Option<u64>,
    /// SUBs register their subscriber a second after reading the queue's first message, as the
    /// reference does (`docs/ARCHITECTURE.md` §3, T1): the race tests must fail on such a relay.
    #[arg(long, hide = true)]
    test_late_registration: bool,
}

impl TestFlags {
    /// Applies the hooks over the configuration the settings made.
    pub fn apply(&self, c: &mut StartConfig) {
        c.test.store_delay = self.test_store_delay;
        if let Some(b) = self.test_output_high_water_bytes {
            c.output_limits = smp_relay::limits::OutputLimits::from_high_water(b as usize);
        }
        c.test.fail_start = self.test_fail_start;
        c.test.clock_control = self.test_clock_control.clone();
        c.test.slow_reader_tick = self.test_slow_reader_tick_ms.map(Duration::from_millis);
        c.test.late_registration = self.test_late_registration;
        if let Some(secs) = self.test_clock_offset_secs {
            smp_relay::clock::advance(i64::from(secs));
        }
        if let Some(ms) = self.test_warning_interval_ms {
            smp_relay::log_limit::set_interval(Duration::from_millis(ms));
        }
        if let Some(ms) = self.test_tls_timeout_ms {
            c.tls_timeout = Duration::from_millis(ms);
        }
    }
}

fn shard_delay(s: &str) -> Result<(usize, Duration), String> {
    let (shard, ms) = s
        .split_once(':')
        .ok_or_else(|| format!("expected SHARD:MS, got {s:?}"))?;
    let shard = shard.parse().map_err(|_| format!("bad shard in {s:?}"))?;
    let ms: u64 = ms
        .parse()
        .map_err(|_| format!("bad milliseconds in {s:?}"))?;
    Ok((shard, Duration::from_millis(ms)))
}

fn start_fault(s: &str) -> Result<(usize, config::StartFault), String> {
    let (shard, fault) = s
        .split_once(':')
        .ok_or_else(|| format!("expected SHARD:bind or SHARD:exit, got {s:?}"))?;
    let shard = shard.parse().map_err(|_| format!("bad shard in {s:?}"))?;
    let fault = match fault {
        "bind" => config::StartFault::Bind,
        "exit" => config::StartFault::Exit,
        _ => return Err(format!("expected bind or exit in {s:?}")),
    };
    Ok((shard, fault))
}
