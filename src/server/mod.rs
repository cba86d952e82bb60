//! The relay: one shard per configured core, each a pinned glommio executor that accepts and serves
//! its own connections (`DESIGN.md` §1).

pub mod commands;
pub mod conn;
pub mod directory;
pub mod dispatch;
pub mod lock;
pub mod owner;
pub mod router;
pub mod shard;
pub mod tls_stream;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use glommio::{LocalExecutorBuilder, Placement};

use crate::config::StartConfig;
use crate::limits::IO_MEMORY_BYTES;
use crate::transport::{certs, tls};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("{0}")]
    Credentials(String),
    #[error("cannot start shard {0}: {1}")]
    Shard(usize, String),
    #[error("shard {0} stopped: {1}")]
    ShardFailed(usize, String),
}

/// Runs the relay until the process is stopped.
pub fn run(config: StartConfig) -> Result<(), StartError> {
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let credentials = Arc::new(
        certs::load(&config.data_dir).map_err(|e| StartError::Credentials(e.to_string()))?,
    );
    let tls_config = tls::server_config(
        &credentials,
        &tls::TlsOptions {
            request_client_cert: config.request_client_cert,
        },
    )
    .map_err(|e| StartError::Credentials(e.to_string()))?;
    let cpus = allowed_cpus();
    let shards = config.shards.max(1);
    let per_shard_connections = config.max_connections.div_ceil(shards);
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<usize>(shards);
    let mut handles = Vec::with_capacity(shards);
    for shard_id in 0..shards {
        let cpu = cpus[shard_id % cpus.len()];
        let config = config.clone();
        let credentials = credentials.clone();
        let tls_config = tls_config.clone();
        let ready_tx = ready_tx.clone();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("shard-{shard_id}"))
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || async move {
                let ctx = Rc::new(shard::ShardContext {
                    shard_id,
                    config,
                    credentials,
                    tls_config,
                    connections: Cell::new(0),
                    max_connections: per_shard_connections,
                    read_scratch: tls_stream::new_scratch(),
                });
                shard::run(ctx, move || {
                    let _ = ready_tx.send(shard_id);
                })
                .await
            })
            .map_err(|e| StartError::Shard(shard_id, e.to_string()))?;
        handles.push(handle);
    }
    drop(ready_tx);
    let mut ready = 0;
    while ready < shards {
        if ready_rx.recv().is_err() {
            break;
        }
        ready += 1;
    }
    if ready == shards {
        tracing::info!(
            ports = ?config.ports,
            shards,
            "listening on {}",
            config.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",")
        );
    }
    for (shard_id, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(StartError::ShardFailed(shard_id, e.to_string())),
            Err(e) => return Err(StartError::ShardFailed(shard_id, e.to_string())),
        }
    }
    Ok(())
}

/// The CPUs this process may run on, so that `--cores N` pins to cores it actually has.
fn allowed_cpus() -> Vec<usize> {
    match glommio::CpuSet::online() {
        Ok(set) => {
            let mut v: Vec<usize> = set.into_iter().map(|l| l.cpu).collect();
            v.sort_unstable();
            v.dedup();
            if v.is_empty() {
                vec![0]
            } else {
                v
            }
        }
        Err(_) => vec![0],
    }
}
