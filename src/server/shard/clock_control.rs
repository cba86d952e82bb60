//! Test hook (`start --test-clock-control PATH`): a Unix socket on which a test moves the relay's
//! clock (`src/clock.rs`) and makes the timer-driven work run at once, so that the expiry,
//! persistence and metrics tests (tests/queues/queue_expiry.rs, tests/queues/queue_persistence.rs,
//! tests/flow/batching.rs) need not sleep on the wall clock.
//!
//! One command per connection, one line each, answered with `ok` once it has taken effect (or
//! `error ...`), so that the test goes on only after the relay applied it:
//! - `advance SECS`: the clock moves SECS seconds forward. Nothing else runs: a test can then show
//!   that an expired message stays until the next expiration run.
//! - `expire`: every shard's owner runs its periodic expiration (`Owner::expire`) now; answered
//!   when all have finished.
//! - `metrics`: every shard publishes its numbers now, shard 0 last, so that the metrics file it
//!   writes holds every shard's latest numbers.
//! - `stats-log`: the daily statistics line is written now if it is due on the relay's clock
//!   (`[STORE_LOG] log_stats`), as the timer that looks every minute would.
//! - `hold SHARD`: the shard's thread blocks until `release` (at most `MAX_HOLD`), as a shard busy
//!   with its own work would take nothing from its inbox meanwhile; answered as it starts. Shard 0
//!   serves this socket, so only other shards can be held.
//! - `release`: the held shard goes on.
//!
//! Only shard 0 serves it; without the flag nothing of this runs.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{UnixListener, UnixStream};

use crate::server::mesh::Mesh;
use crate::server::messages::{OwnerMsg, ShardMsg, StatsMsg};

/// The longest command line read.
const MAX_LINE: usize = 64;

/// The longest a `hold` lasts without a `release`.
pub const MAX_HOLD: Duration = Duration::from_secs(60);

/// Binds the socket (replacing a stale one a killed run left) before the shard reports ready, so
/// that a test may send commands as soon as the relay has started.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    UnixListener::bind(path).map_err(Into::into)
}

/// Serves the commands, one connection at a time (a test sends one command and waits).
pub async fn serve(listener: UnixListener, mesh: Mesh) {
    // The release of the shard a `hold` holds: dropped by `release`.
    let held = RefCell::new(None);
    loop {
        match listener.accept().await {
            Ok(s) => {
                if let Err(e) = command(s, &mesh, &held).await {
                    tracing::warn!(error = %e, "clock control connection failed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "clock control accept failed");
                glommio::timer::Timer::new(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn command(
    mut s: UnixStream,
    mesh: &Mesh,
    held: &RefCell<Option<flume::Sender<()>>>,
) -> std::io::Result<()> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < MAX_LINE && s.read(&mut byte).await? == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let line = String::from_utf8_lossy(&line);
    let answer = match run(line.trim(), mesh, held).await {
        Ok(()) => "ok\n".to_string(),
        Err(e) => format!("error {e}\n"),
    };
    s.write_all(answer.as_bytes()).await?;
    s.flush().await
}

async fn run(
    line: &str,
    mesh: &Mesh,
    held: &RefCell<Option<flume::Sender<()>>>,
) -> Result<(), String> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("advance"), Some(secs), None) => {
            let secs: u32 = secs.parse().map_err(|_| format!("bad seconds {secs:?}"))?;
            crate::clock::advance(i64::from(secs));
            Ok(())
        }
        (Some("expire"), None, None) => {
            let shards: Vec<usize> = (0..mesh.shards()).collect();
            on_shards(mesh, &shards, |done| OwnerMsg::ExpireNow { done }).await
        }
        // Shard 0 asks every shard for its numbers and answers once it has written their sum.
        (Some("metrics"), None, None) => {
            on_shards(mesh, &[0], |done| StatsMsg::MetricsNow { done }).await
        }
        // Shard 0 writes the daily statistics line if it is due (`log_stats`), and answers once
        // it is written.
        (Some("stats-log"), None, None) => {
            on_shards(mesh, &[0], |done| StatsMsg::Daily { done: Some(done) }).await
        }
        (Some("hold"), Some(shard), None) => {
            let shard: usize = shard
                .parse()
                .ok()
                .filter(|s| (1..mesh.shards()).contains(s))
                .ok_or_else(|| format!("bad shard {shard:?} (1 to {})", mesh.shards() - 1))?;
            if held.borrow().is_some() {
                return Err("a shard is held already".into());
            }
            let (tx, release) = flume::bounded(1);
            *held.borrow_mut() = Some(tx);
            on_shards(mesh, &[shard], |started| ShardMsg::Hold {
                started,
                release: release.clone(),
            })
            .await
        }
        (Some("release"), None, None) => match held.borrow_mut().take() {
            Some(_) => Ok(()),
            None => Err("no shard is held".into()),
        },
        _ => Err(format!("unknown command {line:?}")),
    }
}

/// Sends each of `shards` the message `make` builds and waits until every one has done it.
async fn on_shards<M: Into<ShardMsg>>(
    mesh: &Mesh,
    shards: &[usize],
    make: impl Fn(flume::Sender<()>) -> M,
) -> Result<(), String> {
    let (tx, rx) = flume::unbounded();
    for &shard in shards {
        mesh.send(shard, make(tx.clone()));
    }
    drop(tx);
    for _ in shards {
        rx.recv_async()
            .await
            .map_err(|_| "a shard stopped".to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refused commands leave the clock alone and say why (an accepted `advance` would move the
    /// clock of every test in this process, so only refusals are run here).
    #[test]
    fn bad_commands_are_refused() {
        let (mesh, _inboxes) = Mesh::new(1);
        let before = crate::clock::now_secs();
        for bad in [
            "advance",
            "advance -3",
            "advance 1.5",
            "advance 1 2",
            "rewind 3",
            "hold 0",
            "hold 1",
            "hold 1 2",
            "release",
            "",
        ] {
            let r = futures_lite::future::block_on(run(bad, &mesh, &RefCell::new(None)));
            assert!(r.is_err(), "{bad:?} was accepted");
        }
        assert!(
            crate::clock::now_secs() - before <= 1,
            "the clock did not move"
        );
    }
}
