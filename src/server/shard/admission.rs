//! Which accepted connections the relay keeps: `--max-connections` over all shards as one number,
//! and at most `--max-handshakes-per-address` connections of one IP address still in their TLS or
//! SMP handshake. Shards accept on the same ports with SO_REUSEPORT, which spreads connections
//! unevenly, so a share per shard refused clients while other shards had room; and without a bound
//! per address, one address holding idle sockets took every slot for the whole setup timeout.
//!
//! Both are touched once at accept and once when a connection ends or finishes its handshake, never
//! per request, so one atomic and one mutex shared by the shards cost nothing that matters.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::StartConfig;
use crate::limits::{FILES_FIXED, FILES_PER_SHARD, MAX_CONNECTIONS, MIN_MEMLOCK_BYTES};

pub struct Admission {
    max_connections: usize,
    open: AtomicUsize,
    max_handshakes_per_address: usize,
    /// Connections in their handshake, by address. An address leaves the map when its count
    /// drops to 0, so the map holds at most one entry per connection held (`max_connections`).
    handshakes: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a new connection was closed at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The relay holds `max_connections`.
    Full,
    /// Its address has `max_handshakes_per_address` connections in their handshake.
    AddressBusy,
}

/// A connection's place under `max_connections`, given back when dropped.
pub struct Slot(Arc<Admission>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection in its handshake, counted against its address until dropped.
pub struct Handshaking {
    admission: Arc<Admission>,
    addr: IpAddr,
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut map = self.admission.handshakes();
        if let Some(n) = map.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.addr);
            }
        }
    }
}

impl Admission {
    pub fn new(max_connections: usize, max_handshakes_per_address: usize) -> Arc<Self> {
        Arc::new(Admission {
            max_connections,
            open: AtomicUsize::new(0),
            max_handshakes_per_address,
            handshakes: Mutex::new(HashMap::new()),
        })
    }

    fn handshakes(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        // Counts stay consistent whatever a panicking holder did: each change is one statement.
        self.handshakes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection from `addr` just accepted: its slot and its handshake's place, or why not.
    pub fn admit(self: &Arc<Self>, addr: IpAddr) -> Result<(Slot, Handshaking), Refused> {
        // IPv4 clients of a dual-stack socket arrive as ::ffff:a.b.c.d; one address either way.
        let addr = addr.to_canonical();
        let handshaking = {
            let mut map = self.handshakes();
            let n = map.entry(addr).or_insert(0);
            if *n >= self.max_handshakes_per_address {
                return Err(Refused::AddressBusy);
            }
            *n += 1;
            Handshaking {
                admission: self.clone(),
                addr,
            }
        };
        let max = self.max_connections;
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Refused::Full)?;
        Ok((Slot(self.clone()), handshaking))
    }

    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Connections held now, over all shards.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Connections of `addr` in their handshake now.
    pub fn handshakes_of(&self, addr: IpAddr) -> usize {
        self.handshakes()
            .get(&addr.to_canonical())
            .copied()
            .unwrap_or(0)
    }
}

/// Open files the relay needs besides its client connections.
fn other_files(config: &StartConfig, shards: usize) -> usize {
    let per_shard = config.ports.len()
        + config.websocket_ports.len()
        + config.settings.proxy.max_sessions_per_shard
        + FILES_PER_SHARD;
    shards * per_shard + FILES_FIXED
}

/// The soft and hard `RLIMIT_NOFILE`.
fn nofile() -> std::io::Result<(libc::rlim_t, libc::rlim_t)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct passed by pointer, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Raises the soft locked-memory limit to glommio's minimum ([`MIN_MEMLOCK_BYTES`]) when it is
/// below and the hard limit allows; otherwise an error that says how to raise it, instead of every
/// shard failing with glommio's `MemLockLimit`.
pub fn fit_memlock() -> Result<(), String> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct passed by pointer, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(format!(
            "cannot read RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        ));
    }
    let need = MIN_MEMLOCK_BYTES as libc::rlim_t;
    if lim.rlim_cur >= need {
        return Ok(());
    }
    if lim.rlim_max >= need {
        let raised = libc::rlimit {
            rlim_cur: need,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct passed by pointer, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) } == 0 {
            return Ok(());
        }
    }
    Err(format!(
        "RLIMIT_MEMLOCK allows {} KiB of locked memory, below the {} KiB each shard's io_uring \
         needs: raise it (`ulimit -l {}` in the shell that starts the relay, or LimitMEMLOCK=infinity \
         in its systemd unit)",
        lim.rlim_cur / 1024,
        need / 1024,
        need / 1024
    ))
}

fn set_soft_nofile(soft: libc::rlim_t, hard: libc::rlim_t) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct passed by pointer, which lives for the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Raises the soft open-file limit to what `max_connections` needs (shells and services start
/// with 1,024, far below the default 65,536), up to the hard limit; returns the connections the
/// relay will hold. A number the operator set that the hard limit cannot hold is an error naming
/// the setting and how to raise the limit; the default is lowered to what fits, with a warning.
pub fn fit_open_files(config: &StartConfig, shards: usize) -> Result<usize, String> {
    let others = other_files(config, shards);
    let wanted = config.max_connections.unwrap_or(MAX_CONNECTIONS);
    let need = (wanted + others) as libc::rlim_t;
    let (soft, hard) = nofile().map_err(|e| format!("cannot read RLIMIT_NOFILE: {e}"))?;
    if soft >= need {
        return Ok(wanted);
    }
    let target = need.min(hard);
    let now = match set_soft_nofile(target, hard) {
        Ok(()) => target,
        // The kernel's own ceiling (fs.nr_open) can be below the hard limit: keep what is set.
        Err(_) => nofile().map(|(s, _)| s).unwrap_or(soft),
    };
    if now >= need {
        return Ok(wanted);
    }
    let fits = (now as usize).saturating_sub(others);
    let raise = format!(
        "raise the open-file limit (`ulimit -n {need}` in the shell that starts the relay, \
         which needs `ulimit -Hn` at least that, or LimitNOFILE={need} in its systemd unit)"
    );
    match config.max_connections {
        Some(n) => Err(format!(
            "--max-connections {n} (or [RELAY] max_connections) needs {need} open files, but \
             RLIMIT_NOFILE allows {now}: {raise}, or set --max-connections to at most {fits}"
        )),
        None if fits == 0 => Err(format!(
            "RLIMIT_NOFILE allows {now} open files, fewer than the {others} the relay needs \
             besides connections ({shards} shards, each with up to {} proxy sessions): {raise}, \
             or start fewer shards with --cores",
            config.settings.proxy.max_sessions_per_shard
        )),
        None => {
            tracing::warn!(
                max_connections = fits,
                "RLIMIT_NOFILE allows {now} open files, so the relay holds {fits} connections, \
                 not the default {wanted}: {raise}"
            );
            Ok(fits)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_limit_is_one_number_and_slots_come_back() {
        let a = Admission::new(3, 10);
        let held: Vec<_> = (0..3).map(|_| a.admit(ip("10.0.0.1")).unwrap()).collect();
        assert_eq!(a.admit(ip("10.0.0.2")).err(), Some(Refused::Full));
        assert_eq!(a.open(), 3);
        // A refusal for the limit does not keep the address's handshake place.
        assert_eq!(a.handshakes_of(ip("10.0.0.2")), 0);
        drop(held);
        assert_eq!(a.open(), 0);
        assert!(a.admit(ip("10.0.0.2")).is_ok());
    }

    #[test]
    fn handshakes_are_bounded_per_address_and_released_when_done() {
        let a = Admission::new(100, 2);
        let (s1, h1) = a.admit(ip("10.0.0.1")).unwrap();
        let (_s2, _h2) = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.1")).err(), Some(Refused::AddressBusy));
        assert_eq!(a.open(), 2, "a refused address takes no slot");
        // Another address, and the same one written as IPv4-mapped IPv6.
        assert!(a.admit(ip("10.0.0.2")).is_ok());
        assert_eq!(
            a.admit(ip("::ffff:10.0.0.1")).err(),
            Some(Refused::AddressBusy)
        );
        // The handshake ends; the connection (its slot) stays.
        drop(h1);
        assert_eq!(a.handshakes_of(ip("10.0.0.1")), 1);
        let third = a.admit(ip("10.0.0.1"));
        assert!(third.is_ok());
        drop(third);
        drop(s1);
        drop(_h2);
        assert_eq!(a.handshakes_of(ip("10.0.0.1")), 0);
        assert!(
            a.handshakes().is_empty(),
            "no entry left for idle addresses"
        );
    }
}
