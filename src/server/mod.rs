//! The relay: one shard per configured core, each a pinned glommio executor that accepts and serves
//! its own connections and owns the queues of its partition groups (`DESIGN.md` §1).
//!
//! Start-up: lock the data directory, load each shard's store and fill the shared ID directory, and
//! only then accept connections, so no shard answers for a queue that is still loading. A clean stop
//! (SIGINT or SIGTERM) tells every shard to stop, and each saves its store.

pub mod admission;
pub mod commands;
pub mod conn;
pub mod directory;
pub mod dispatch;
pub mod forward;
pub mod lock;
pub mod log_limit;
pub mod owner;
pub mod proxy;
pub mod router;
pub mod shard;
pub mod tls_stream;

use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Barrier};

use glommio::{LocalExecutorBuilder, Placement};

use crate::config::StartConfig;
use crate::limits::IO_MEMORY_BYTES;
use crate::store::memory::MemoryStore;
use crate::store::QueueStore;
use crate::transport::{certs, tls};
use directory::{Directory, IdSpace};
use router::{groups_of_shard, Mesh, ShardMsg};

/// Where the memory store saves its partition groups at a clean stop.
pub const MEMORY_STORE_DIR: &str = "memory-store";

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("{0}")]
    Setup(String),
    #[error("cannot start shard {0}: {1}")]
    Shard(usize, String),
    #[error("shard {0} stopped: {1}")]
    ShardFailed(usize, String),
}

pub fn memory_store_dir(config: &StartConfig) -> PathBuf {
    config.data_dir.join(MEMORY_STORE_DIR)
}

/// Runs the relay until SIGINT or SIGTERM.
pub fn run(config: StartConfig) -> Result<(), StartError> {
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    let credentials = Arc::new(
        certs::load_for_start(&config.data_dir).map_err(|e| StartError::Setup(e.to_string()))?,
    );
    let tls_config = tls::server_config(
        &credentials,
        &tls::TlsOptions {
            request_client_cert: config.request_client_cert,
        },
    )
    .map_err(|e| StartError::Setup(e.to_string()))?;
    check_ports_free(&config.ports)?;
    let store_dir = memory_store_dir(&config);
    std::fs::create_dir_all(&store_dir)
        .map_err(|e| StartError::Setup(format!("cannot create {}: {e}", store_dir.display())))?;
    // Signals are taken before any shard runs, so a stop during start-up is not lost.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| StartError::Setup(format!("cannot handle signals: {e}")))?;

    let cpus = allowed_cpus();
    let shards = config.shards.clamp(1, crate::limits::MAX_SHARDS);
    // One limit over all shards: the kernel spreads connections unevenly over SO_REUSEPORT
    // listeners, so a share per shard refused clients while others had room.
    let max_connections = admission::fit_open_files(&config, shards).map_err(StartError::Setup)?;
    let admission = admission::Admission::new(max_connections, config.max_handshakes_per_address);
    let (mesh, inboxes) = Mesh::new(shards);
    let directory = Directory::new();
    let metrics = Arc::new(std::sync::Mutex::new(vec![
        crate::metrics::MetricsSnapshot::default();
        shards
    ]));
    let loaded = Arc::new(Barrier::new(shards));
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<usize, String>>(shards);
    let mut handles = Vec::with_capacity(shards);
    for (shard_id, inbox) in inboxes.into_iter().enumerate() {
        let cpu = cpus[shard_id % cpus.len()];
        let config = config.clone();
        let credentials = credentials.clone();
        let tls_config = tls_config.clone();
        let ready_tx = ready_tx.clone();
        let mesh = mesh.clone();
        let directory = directory.clone();
        let metrics = metrics.clone();
        let admission = admission.clone();
        let loaded = loaded.clone();
        let store_dir = store_dir.clone();
        let handle = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("shard-{shard_id}"))
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || async move {
                let groups = groups_of_shard(shard_id, shards);
                let ttl = config.settings.message_ttl.as_secs() as i64;
                let store = MemoryStore::load(&store_dir, &groups, Some(ttl), commands::now_secs());
                let store = match store {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        loaded.wait();
                        return Err(e.to_string());
                    }
                };
                fill_directory(&directory, &store);
                // Every shard's IDs are in the directory before any shard accepts.
                loaded.wait();
                let settings = Rc::new(config.settings.clone());
                let ctx = Rc::new(shard::ShardContext::new(
                    shard_id,
                    config,
                    credentials,
                    tls_config,
                    admission,
                    directory.clone(),
                    mesh.clone(),
                    metrics,
                ));
                let owner = owner::Owner::new(shard_id, store, directory, mesh, settings);
                let ready_tx2 = ready_tx.clone();
                let store = shard::run(ctx, owner, inbox, move || {
                    let _ = ready_tx2.send(Ok(shard_id));
                })
                .await
                .map_err(|e| {
                    let _ = ready_tx.send(Err(e.to_string()));
                    e.to_string()
                })?;
                store
                    .save(&store_dir, &groups)
                    .map_err(|e| format!("saving the store: {e}"))
            })
            .map_err(|e| StartError::Shard(shard_id, e.to_string()))?;
        handles.push(handle);
    }
    drop(ready_tx);
    let mut ready = 0;
    let mut failure = None;
    while ready < shards {
        match ready_rx.recv() {
            Ok(Ok(_)) => ready += 1,
            Ok(Err(e)) => {
                failure = Some(e);
                break;
            }
            Err(_) => break,
        }
    }
    if failure.is_none() && ready == shards {
        tracing::info!(
            ports = ?config.ports,
            shards,
            queues = directory.len(IdSpace::Sender),
            "listening on {}",
            config.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(",")
        );
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "stopping: saving queues and messages");
        }
    }
    for shard in 0..shards {
        mesh.send(shard, ShardMsg::Stop);
    }
    let mut result = Ok(());
    for (shard_id, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(StartError::ShardFailed(shard_id, e)),
            Err(e) => result = Err(StartError::ShardFailed(shard_id, e.to_string())),
        }
    }
    if let Some(e) = failure {
        // The shard's own message names what failed (a group file names itself); the shard that
        // sent it is not known here, so none is guessed.
        return Err(StartError::Setup(e));
    }
    if result.is_ok() {
        tracing::info!("stopped");
    }
    result
}

/// Shards listen with SO_REUSEPORT, which would let this relay silently share a port with another
/// process (another relay on another data directory) and get half its connections. A listener
/// without SO_REUSEPORT is refused while anyone listens there, so one is tried first.
fn check_ports_free(ports: &[u16]) -> Result<(), StartError> {
    for port in ports {
        std::net::TcpListener::bind(("0.0.0.0", *port)).map_err(|e| {
            StartError::Setup(format!(
                "port {port} is in use by another process ({e}); stop it or choose another --port"
            ))
        })?;
    }
    Ok(())
}

fn fill_directory(directory: &Directory, store: &MemoryStore) {
    for q in store.all() {
        let rid = &q.recipient_id;
        directory.insert(IdSpace::Sender, &q.sender_id, rid);
        if let Some(l) = &q.link {
            directory.insert(IdSpace::Link, &l.link_id, rid);
        }
        if let Some(n) = &q.notifier {
            directory.insert(IdSpace::Notifier, &n.notifier_id, rid);
        }
    }
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
