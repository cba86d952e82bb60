//! One shard: a glommio executor pinned to a core, its listeners on the SMP ports (SO_REUSEPORT, so
//! every shard accepts on every port and the kernel spreads connections), and the connections it
//! accepted, which it serves until they close.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use glommio::net::TcpListener;

use super::conn;
use crate::config::StartConfig;
use crate::transport::certs::ServerCredentials;

/// What every connection of a shard reads; built once per shard.
pub struct ShardContext {
    pub shard_id: usize,
    pub config: StartConfig,
    pub credentials: Arc<ServerCredentials>,
    pub tls_config: Arc<rustls::ServerConfig>,
    /// Connections this shard holds now, against `max_connections`.
    pub connections: Cell<usize>,
    pub max_connections: usize,
    /// Every socket read of this shard lands here first (see `tls_stream`).
    pub read_scratch: super::tls_stream::ReadScratch,
}

/// Accepts on every port until the process ends. Returns an error only if a port cannot be bound.
pub async fn run(ctx: Rc<ShardContext>, ready: impl FnOnce()) -> std::io::Result<()> {
    let mut listeners = Vec::new();
    for port in &ctx.config.ports {
        let l = TcpListener::bind(("0.0.0.0", *port)).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("cannot listen on port {port}: {e}"),
            )
        })?;
        listeners.push(l);
    }
    ready();
    let tasks: Vec<_> = listeners
        .into_iter()
        .map(|l| glommio::spawn_local(accept_loop(l, ctx.clone())))
        .collect();
    for t in tasks {
        t.await;
    }
    Ok(())
}

async fn accept_loop(listener: TcpListener, ctx: Rc<ShardContext>) {
    loop {
        let sock = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors and similar: wait a little rather than spin on the error.
                tracing::warn!(shard = ctx.shard_id, error = %e, "accept failed");
                glommio::timer::Timer::new(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if ctx.connections.get() >= ctx.max_connections {
            tracing::warn!(
                shard = ctx.shard_id,
                "connection limit reached, closing a new connection"
            );
            drop(sock);
            continue;
        }
        ctx.connections.set(ctx.connections.get() + 1);
        let c = ctx.clone();
        glommio::spawn_local(async move {
            conn::serve(sock, c.clone()).await;
            c.connections.set(c.connections.get() - 1);
        })
        .detach();
    }
}
