//! Name resolution for the proxy, off the shard: `getaddrinfo` blocks for as long as DNS takes, so
//! each lookup runs on a short-lived OS thread of its own and the shard awaits the answer through
//! a channel. Lookups in flight are bounded per shard; a lookup that outlives the caller's
//! timeout still ends on its own (the thread holds nothing of the shard).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Why a name gave no address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot resolve {0}: {1}")]
    Failed(String, String),
    #[error("{0} resolves to no address")]
    NoAddress(String),
    #[error("too many name lookups in flight")]
    Busy,
}

pub struct Resolver {
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
}

impl Resolver {
    pub fn new(max_in_flight: usize) -> Self {
        Resolver {
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: max_in_flight.max(1),
        }
    }

    /// Every address `host` resolves to, with `port`.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(ResolveError::Busy);
        }
        let (tx, rx) = flume::bounded(1);
        let name = host.to_string();
        let counter = self.in_flight.clone();
        let spawned = std::thread::Builder::new()
            .name("smp-proxy-dns".into())
            .spawn(move || {
                let r = (name.as_str(), port)
                    .to_socket_addrs()
                    .map(|a| a.collect::<Vec<_>>())
                    .map_err(|e| ResolveError::Failed(name.clone(), e.to_string()));
                counter.fetch_sub(1, Ordering::AcqRel);
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(ResolveError::Failed(host.to_string(), e.to_string()));
        }
        let addrs = rx.recv_async().await.map_err(|_| {
            ResolveError::Failed(host.to_string(), "resolver thread ended".into())
        })??;
        if addrs.is_empty() {
            return Err(ResolveError::NoAddress(host.to_string()));
        }
        Ok(addrs)
    }
}
