//! The relay: one shard per configured core, each a pinned glommio executor that accepts and serves
//! its own connections and owns the queues of its partition groups (`docs/ARCHITECTURE.md` §1).
//!
//! Start-up: lock the data directory, load each shard's store, fill the shared ID directory and bind
//! the listeners; only when every shard has done so are the loaded files set aside (`.bak`, see
//! `store/memory/persist.rs`) and connections accepted, so no shard answers for a queue that is
//! still loading and a start that fails leaves the saved store as it was. A clean stop (SIGINT or
//! SIGTERM) tells every shard to stop, and each saves its store.

//! The connection side (`conn/`: a connection's reader, writer, output and framings), the owner
//! side (`owner/`: a shard's queues, its jobs and the commands they run), and what runs a shard
//! (`shard/`: its inbox loop, listeners, shared context and statistics). What the two sides send
//! each other is `messages.rs`, carried by the inboxes of `mesh.rs`.
pub mod conn;
pub mod control;
pub mod count;
pub mod directory;
pub mod lock;
pub mod mesh;
pub mod messages;
pub mod owner;
pub mod proxy;
pub mod router;
pub mod shard;
pub mod web;
/// RFWD, the destination role of private routing, lives with the other commands.
pub use owner::commands::forward;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{mpsc, Arc};

use glommio::{LocalExecutorBuilder, Placement};

use crate::config::{StartConfig, StartFault};
use crate::limits::IO_MEMORY_BYTES;
use crate::store::services::Services;
use crate::store::{with_store, ShardStore, StoreSettings, WithStore};
use crate::transport::{certs, tls};
use conn::ws;
use directory::{Directory, IdSpace};
use mesh::Mesh;
use messages::ShardMsg;
use owner::commands;
use router::groups_of_shard;
use shard::{admission, context, listen, stats, Serves};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("{0}")]
    Setup(String),
    /// The saved store is as it was: nothing is changed on disk before every shard can serve.
    #[error("cannot start ({0}); the saved store is unchanged")]
    Start(String),
    #[error(
        "saving failed at the stop: {0}. Free space or fix the permissions before the next start"
    )]
    Save(String),
}

/// What the store of each shard is opened with.
pub fn store_settings(config: &StartConfig) -> StoreSettings {
    StoreSettings {
        data_dir: config.data_dir.clone(),
        keep: config.keep,
        message_ttl_secs: config.settings.message_ttl.as_secs() as i64,
        ntf_ttl_secs: config.settings.notification_ttl.as_secs() as i64,
        test_delay: None,
        durability: config.durability,
        // Created here, once: the shards' settings are clones that share it.
        journal_budget: config.journal_max_size.map(smp_journal::SpaceBudget::new),
        journal_checkpoint_records: config.journal_checkpoint_records,
        // The cache's bound is the relay's: each shard holds its share.
        postgres: Some(crate::store::postgres::PgConfig {
            queue_cache: config.postgres.queue_cache / config.shards.max(1),
            ..config.postgres.clone()
        }),
    }
}

/// Large allocations (`limits::MALLOC_MMAP_THRESHOLD_BYTES` and up: a service's fold, a big
/// output backlog) are mapped on their own and unmapped when freed. glibc's default raises that
/// threshold to the size of each mapped block freed, after which such blocks come from the
/// threads' heaps and stay resident once freed (simplexmq #1820's symptom, memory that never
/// comes back after a service's connection goes); a fixed threshold turns that adjustment off.
fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let bytes = crate::limits::MALLOC_MMAP_THRESHOLD_BYTES as libc::c_int;
        // SAFETY: mallopt takes two integers and changes the allocator's parameters under its
        // own lock; it touches no memory of the caller and is safe to call from any thread.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) };
        if ok != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused; glibc's default stays");
        }
    }
}

/// Runs the relay until SIGINT or SIGTERM, on the store the configuration names.
pub fn run(config: StartConfig) -> Result<(), StartError> {
    fixed_mmap_threshold();
    struct Run(StartConfig);
    impl WithStore for Run {
        type Output = Result<(), StartError>;
        fn run<S: ShardStore>(self) -> Self::Output {
            run_on::<S>(self.0)
        }
    }
    with_store(config.store, config.test.store_delay.is_some(), Run(config))
}

fn run_on<S: ShardStore>(mut config: StartConfig) -> Result<(), StartError> {
    let _lock = lock::lock_data_dir(&config.data_dir)?;
    if let Some(warning) = open_to_others(&config.data_dir) {
        tracing::warn!("{warning}");
    }
    config
        .store
        .check_data_dir(&config.data_dir)
        .map_err(StartError::Setup)?;
    // The reference smp-server's files beside no store of ours: refused, naming the import.
    if let Some(warning) = crate::store::reference::check_start(&config.data_dir, config.store)
        .map_err(StartError::Setup)?
    {
        tracing::warn!("{warning}");
    }
    let credentials = Arc::new(
        certs::load_for_start(&config.config_dir).map_err(|e| StartError::Setup(e.to_string()))?,
    );
    let tls_config = tls::server_config(&credentials, &tls::TlsOptions::default())
        .map_err(|e| StartError::Setup(e.to_string()))?;
    drop_shared_websocket_ports(&mut config);
    let site = web_site(&config)?.map(Arc::new);
    let web_admission = admission::Admission::new(crate::limits::WEB_MAX_CONNECTIONS, usize::MAX);
    let tls_configs = context::TlsConfigs {
        websocket: tls::websocket_config(&tls_config),
        web: web_tls(&config, site.is_some())?,
        smp: tls_config,
    };
    let shared_port = tls_configs
        .web
        .as_ref()
        .and(config.web.https)
        .filter(|p| config.ports.contains(p));
    check_ports_free(&config.ports)?;
    check_ports_free(&config.websocket_ports)?;
    // The site's own ports: plain HTTP, and HTTPS on a port that is not an SMP port.
    let site_ports = web_ports(&config, site.is_some(), tls_configs.web.is_some());
    let store_settings = store_settings(&config);
    // Signals are taken before any shard runs, so a stop during start-up is not lost.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| StartError::Setup(format!("cannot handle signals: {e}")))?;

    let cpus = allowed_cpus();
    let shards = config.shards.clamp(1, crate::limits::MAX_SHARDS);
    if shards > cpus.len() {
        tracing::warn!(
            "{shards} shards on {} cores this process may run on: shards share cores, and each \
             waits for the others' turns (set --cores, or [RELAY] cores, to at most {})",
            cpus.len(),
            cpus.len()
        );
    }
    // One limit over all shards: the kernel spreads connections unevenly over SO_REUSEPORT
    // listeners, so a share per shard refused clients while others had room.
    admission::fit_memlock().map_err(StartError::Setup)?;
    let max_connections = admission::fit_open_files(&config, shards).map_err(StartError::Setup)?;
    let admission = admission::Admission::new(max_connections, config.max_handshakes_per_address);
    let (mesh, inboxes) = Mesh::new(shards);
    let (stats_shared, saved_queues) =
        stats::prepare(&config, shards).map_err(StartError::Setup)?;
    let stats_shared = Arc::new(stats_shared);
    let metrics_http = match config.metrics_listen {
        Some(addr) => Some(stats::bind_http(addr).map_err(StartError::Setup)?),
        None => None,
    };
    // On a store that keeps every ID behind unique indexes, the directory caches them, as many
    // of each kind as its records (`[RELAY] pg_queue_cache`); the others fill it at start.
    let directory = match S::id_source(&store_settings).map_err(StartError::Setup)? {
        Some(source) => Directory::cache(config.postgres.queue_cache, source),
        None => Directory::new(),
    };
    // The shards' queues at start, as their stores count them (exact, or an estimate on a
    // cache's store, whose count comes while it serves).
    let start_queues = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let services = Services::new(config.store, &store_settings);

    let (report_tx, reports) = mpsc::channel::<Report>();
    let mut gos = Vec::with_capacity(shards);
    let mut handles = Vec::with_capacity(shards);
    // Why the start failed, by shard; the first reason of each shard is kept.
    let mut failures: BTreeMap<usize, String> = BTreeMap::new();
    for (shard_id, inbox) in inboxes.into_iter().enumerate() {
        let cpu = cpus[shard_id % cpus.len()];
        let config = config.clone();
        let credentials = credentials.clone();
        let tls_configs = tls_configs.clone();
        let mut reporter = Reporter::new(shard_id, report_tx.clone());
        let (go_tx, go_rx) = flume::bounded::<bool>(1);
        let mesh = mesh.clone();
        let directory = directory.clone();
        let start_queues = start_queues.clone();
        let admission = admission.clone();
        let store_settings = store_settings.clone();
        let services = services.clone();
        let stats_shared = stats_shared.clone();
        let site = site.clone();
        let web_admission = web_admission.clone();
        let site_ports = site_ports.clone();
        let spawned = LocalExecutorBuilder::new(Placement::Fixed(cpu))
            .name(&format!("shard-{shard_id}"))
            .io_memory(IO_MEMORY_BYTES)
            .spawn(move || async move {
                let fault = config
                    .test
                    .fail_start
                    .filter(|(shard, _)| *shard == shard_id)
                    .map(|(_, f)| f);
                if fault == Some(StartFault::Exit) {
                    return Err("test hook: the shard's thread ends before it is ready".into());
                }
                let groups = groups_of_shard(shard_id, shards);
                // Both lifetimes as configured (`store_settings`), so that a start keeps exactly
                // what the running relay's periodic expiry would keep.
                let shard_settings = StoreSettings {
                    test_delay: config
                        .test
                        .store_delay
                        .filter(|(shard, _)| *shard == shard_id)
                        .map(|(_, d)| d),
                    ..store_settings.clone()
                };
                let store = S::open(&shard_settings, &groups, commands::now_secs())
                    .map_err(|e| reporter.fail(e))?;
                let queue_services =
                    index_queues(&directory, &store, shards).map_err(|e| reporter.fail(e))?;
                start_queues.fetch_add(
                    store.queue_count_estimate(),
                    std::sync::atomic::Ordering::Relaxed,
                );
                let mut listeners = Vec::with_capacity(config.ports.len());
                let ports = config.ports.iter().map(|&p| match shared_port == Some(p) {
                    true => (p, Serves::Smp(ws::PortKind::Shared)),
                    false => (p, Serves::Smp(ws::PortKind::Smp)),
                });
                let ws_ports = config.websocket_ports.iter();
                let ports =
                    ports.chain(ws_ports.map(|p| (*p, Serves::Smp(ws::PortKind::WebSocket))));
                let ports = ports.chain(site_ports.iter().copied());
                for (port, kind) in ports {
                    let bound = if fault == Some(StartFault::Bind) {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            "test hook",
                        ))
                    } else {
                        listen::shard_listener(port)
                    };
                    let l = bound
                        .map_err(|e| reporter.fail(format!("cannot listen on port {port}: {e}")))?;
                    listeners.push((l, kind));
                }
                reporter.bound();
                // Nothing is accepted until every shard has loaded (its IDs are in the directory)
                // and bound, and `run` has set the loaded files aside; a start that fails before
                // that has changed nothing on disk.
                if go_rx.recv_async().await != Ok(true) {
                    return Ok(None);
                }
                let settings = Rc::new(config.settings.clone());
                #[cfg(feature = "test-kit")]
                let late_registration = config.test.late_registration;
                // The connections and the owner send through one outbox (O1, `ShardMesh`).
                let mesh = mesh::ShardMesh::new(mesh, shard_id);
                let mut ctx = context::ShardContext::new(
                    shard_id,
                    config,
                    credentials,
                    tls_configs,
                    admission,
                    directory.clone(),
                    services,
                    mesh.clone(),
                );
                let restored = {
                    let mut r = stats_shared
                        .restored
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    r.get_mut(shard_id).and_then(Option::take)
                };
                if shard_id == 0 {
                    let daily = stats_shared
                        .daily_start
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take();
                    *ctx.daily.get_mut() = daily.unwrap_or_default();
                }
                ctx.stats = stats_shared;
                ctx.site = site;
                ctx.web_admission = web_admission;
                let ctx = Rc::new(ctx);
                let owner = owner::Owner::with_services(
                    shard_id,
                    store,
                    queue_services,
                    directory,
                    mesh,
                    settings,
                );
                if let Some(a) = restored {
                    *owner.activity.borrow_mut() = a;
                }
                #[cfg(feature = "test-kit")]
                if late_registration {
                    owner.fault.set(owner::Fault::LateRegistration);
                }
                let store = shard::run(ctx, owner, inbox, listeners, move || reporter.serving())
                    .await
                    .map_err(|e| e.to_string())?;
                // What the stop saves, for its last line.
                // (On a store that counts while it serves, the count so far: a stop does not
                // wait for one.)
                let held = (store.queue_count_estimate(), store.total_messages());
                store.close(&store_settings, &groups).map(|()| Some(held))
            });
        match spawned {
            Ok(h) => {
                handles.push((shard_id, h));
                gos.push(go_tx);
            }
            Err(e) => {
                failures.insert(shard_id, format!("cannot start its executor: {e}"));
                break;
            }
        }
    }
    drop(report_tx);

    let mut bound = 0;
    while failures.is_empty() && bound < shards {
        match reports.recv() {
            Ok(Report::Bound) => bound += 1,
            Ok(Report::Serving) => {}
            Ok(Report::Failed(shard, e)) => {
                failures.entry(shard).or_insert(e);
            }
            Err(_) => break,
        }
    }
    let mut setup_failure = None;
    if failures.is_empty() && bound == shards {
        if let Err(e) = S::all_opened(&store_settings) {
            setup_failure = Some(e);
        } else if let Err(e) = services.load() {
            setup_failure = Some(e);
        }
    }
    let go = failures.is_empty() && setup_failure.is_none() && bound == shards;
    for g in gos {
        let _ = g.send(go);
    }
    let mut serving = 0;
    while go && failures.is_empty() && serving < shards {
        match reports.recv() {
            Ok(Report::Serving) => serving += 1,
            Ok(Report::Bound) => {}
            Ok(Report::Failed(shard, e)) => {
                failures.entry(shard).or_insert(e);
            }
            Err(_) => break,
        }
    }
    let started = go && failures.is_empty() && serving == shards;
    if started {
        // Before `listening`: a supervisor (or test) that waits for it finds the backup set aside.
        let queues = start_queues.load(std::sync::atomic::Ordering::Relaxed);
        // A cache's store has not counted yet: nothing exact to compare the backup's count with.
        let store_queues = (!directory.is_cache()).then_some(queues as u64);
        stats::restored(&config, saved_queues, store_queues);
        if let Some(l) = metrics_http {
            stats::serve_http(l, mesh.clone(), stats_shared.clone());
        }
        tracing::info!(
            ports = ?config.ports,
            websocket_ports = ?config.websocket_ports,
            web_clients_by_sni = ?shared_port,
            web_site = ?site_ports.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            shards,
            queues,
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
    let mut stop_failures = BTreeMap::new();
    let (mut queues, mut messages) = (0, 0);
    for (shard_id, h) in handles {
        let e = match h.join() {
            Ok(Ok(held)) => {
                if let Some((q, m)) = held {
                    (queues, messages) = (queues + q, messages + m);
                }
                continue;
            }
            Ok(Err(e)) => e,
            Err(e) => e.to_string(),
        };
        if started {
            tracing::error!(shard = shard_id, "{e}");
            stop_failures.insert(shard_id, e);
        } else {
            failures.entry(shard_id).or_insert(e);
        }
    }
    if !started {
        let mut reasons: Vec<String> = setup_failure.into_iter().collect();
        reasons.extend(failures.iter().map(|(s, e)| format!("shard {s}: {e}")));
        if reasons.is_empty() {
            reasons.push("a shard ended before it was ready".into());
        }
        return Err(StartError::Start(reasons.join("; ")));
    }
    stats::save(&config, &stats_shared);
    if !stop_failures.is_empty() {
        let each: Vec<String> = stop_failures
            .iter()
            .map(|(s, e)| format!("shard {s}: {e}"))
            .collect();
        return Err(StartError::Save(each.join("; ")));
    }
    tracing::info!(
        queues,
        messages,
        "stopped: the {} store holds {queues} queues and {messages} messages",
        config.store.name()
    );
    Ok(())
}

/// What a shard tells `run` while it starts.
enum Report {
    /// Loaded, its IDs in the directory and its listeners bound: it waits for the go.
    Bound,
    /// Accepting connections.
    Serving,
    Failed(usize, String),
}

/// A shard's side of the start-up reports. If the shard's thread ends before it serves (an error,
/// a panic, an executor that could not be built and so never ran the shard), dropping this reports
/// the failure, so that `run` never waits for a shard that is gone.
struct Reporter {
    shard: usize,
    tx: mpsc::Sender<Report>,
    done: bool,
}

impl Reporter {
    fn new(shard: usize, tx: mpsc::Sender<Report>) -> Self {
        Reporter {
            shard,
            tx,
            done: false,
        }
    }

    fn bound(&mut self) {
        let _ = self.tx.send(Report::Bound);
    }

    fn serving(mut self) {
        self.done = true;
        let _ = self.tx.send(Report::Serving);
    }

    /// Reports `e` and returns it, for `map_err`.
    fn fail(&mut self, e: String) -> String {
        self.done = true;
        let _ = self.tx.send(Report::Failed(self.shard, e.clone()));
        e
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if !self.done {
            let e = "its thread ended before it was ready".to_string();
            let _ = self.tx.send(Report::Failed(self.shard, e));
        }
    }
}

/// A warning when users other than the relay's may read or enter `dir`: the store in it holds
/// each queue's keys and DH secret. Directories the relay creates are 0700; one an operator made
/// (or the reference's `/var/opt/simplex`) keeps its mode.
fn open_to_others(dir: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "{} may be read by other users (mode {mode:04o}), while its store holds each queue's \
             keys: chmod 700 {}",
            dir.display(),
            dir.display()
        )
    })
}

fn check_ports_free(ports: &[u16]) -> Result<(), StartError> {
    for port in ports {
        listen::check_port_free(*port).map_err(|e| StartError::Setup(port_refused(*port, &e)))?;
    }
    Ok(())
}

/// Why `port` cannot be listened on, and what to do: only `EADDRINUSE` means another process
/// holds it; a port below 1024 refuses anyone without root or `CAP_NET_BIND_SERVICE` (`EACCES`),
/// which `deploy/smp-relay.service` grants.
fn port_refused(port: u16, e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            format!(
                "port {port} is in use by another process ({e}); stop it or choose another --port"
            )
        }
        std::io::ErrorKind::PermissionDenied => format!(
            "port {port} may not be listened on by this user ({e}): a port below 1024 needs root \
             or the capability CAP_NET_BIND_SERVICE (deploy/smp-relay.service grants it with \
             AmbientCapabilities=CAP_NET_BIND_SERVICE; by hand: sudo setcap \
             cap_net_bind_service=+ep on the binary), or choose a --port of 1024 or more"
        ),
        _ => format!("cannot listen on port {port} ({e}); choose another --port"),
    }
}

/// A WebSocket port that is an SMP port too is dropped from the WebSocket ports, as the
/// reference does (simplexmq `src/Simplex/Messaging/Server/CLI.hs`, `iniTransports`): such a port
/// serves web clients only when it is `[WEB] https`, split by SNI (`web_tls`).
fn drop_shared_websocket_ports(config: &mut StartConfig) {
    let smp = config.ports.clone();
    config.websocket_ports.retain(|p| {
        let both = smp.contains(p);
        if both {
            tracing::warn!(
                "port {p} is an SMP port, so it serves no WebSocket of its own (`websockets`); \
                 to serve web clients on it too, split by TLS SNI, set `[WEB] https = {p}` with \
                 `cert` and `key` (start --web-https, --web-cert, --web-key)"
            );
        }
        !both
    });
}

/// The web clients' TLS config when `[WEB] https`, `cert` and `key` are all set (simplexmq
/// `Server/Main.hs`: web credentials need all three); otherwise none, with a warning saying why
/// when part of it is set. On an SMP port it serves the clients that name a host (SNI), and a
/// certificate or key that cannot be used stops the start with the file's name; on a port of its
/// own it serves the web site (`web_ports`), and as the reference's HTTPS server (which fails
/// alone, in its own thread), one that cannot be used is logged and that port not opened.
fn web_tls(
    config: &StartConfig,
    site: bool,
) -> Result<Option<Arc<rustls::ServerConfig>>, StartError> {
    let web = &config.web;
    match (web.https, &web.cert, &web.key) {
        (None, None, None) => Ok(None),
        (None, _, _) => {
            tracing::warn!(
                "`[WEB] cert`/`key` are set without `https`: no port serves web clients over TLS"
            );
            Ok(None)
        }
        (Some(p), Some(cert), Some(key)) if config.ports.contains(&p) => tls::web_config(cert, key)
            .map(Some)
            .map_err(StartError::Setup),
        // Without a site, a port of its own has nothing to serve (`web_site` warns).
        (Some(_), Some(_), Some(_)) if !site => Ok(None),
        (Some(p), Some(cert), Some(key)) => match tls::web_config(cert, key) {
            Ok(c) => Ok(Some(c)),
            Err(e) => {
                tracing::error!("the web site is not served over HTTPS on port {p}: {e}");
                Ok(None)
            }
        },
        (Some(p), _, _) => {
            tracing::warn!(
                "`[WEB] https = {p}` needs `cert` and `key` (start --web-cert, --web-key): port \
                 {p} serves no web client"
            );
            Ok(None)
        }
    }
}

/// The web site (`[WEB] static_path`), generated and written there; `None` when it is not set,
/// with a warning when a web port is set without it. A folder that cannot be written stops the
/// start, naming it.
fn web_site(config: &StartConfig) -> Result<Option<crate::web::site::Site>, StartError> {
    let web = &config.web;
    let Some(dir) = &web.static_path else {
        if web.http.is_some() || web.https.is_some_and(|p| !config.ports.contains(&p)) {
            tracing::warn!(
                "`[WEB] http`/`https` are set without `static_path`: no web site is generated, \
                 so no port serves one (set `[WEB] static_path`, start --web-static-path)"
            );
        }
        return Ok(None);
    };
    let public = crate::web::info::PublicConfig {
        keeps_queues: config.store != crate::store::StoreKind::Memory || config.keep.queues,
        keeps_messages: config.store != crate::store::StoreKind::Memory || config.keep.messages,
        message_ttl: config.settings.message_ttl,
        stats: config.log_stats,
        new_queues: config.settings.new_queues,
        basic_auth: config.settings.create_password.is_some(),
    };
    if !web.information.is_empty() && web.information.get("source_code").is_none() {
        tracing::warn!(
            "`[INFORMATION]` has no `source_code`: the server information page shows none of it \
             (set source_code to where the relay's source is published)"
        );
    }
    let fields = crate::web::info::fields(&web.information, &public, web.onion_host.as_deref());
    let now = crate::web::http::epoch_secs(std::time::SystemTime::now());
    let site = crate::web::site::Site::generate(&fields, now).map_err(StartError::Setup)?;
    site.write_to(dir).map_err(|e| {
        StartError::Setup(format!(
            "cannot write the web site to {} ([WEB] static_path): {e}; set it to a folder this \
             user may write",
            dir.display()
        ))
    })?;
    tracing::info!("web site generated in {}", dir.display());
    Ok(Some(site))
}

/// The ports serving the web site alone: `[WEB] http`, and `[WEB] https` when it is not an SMP port
/// (and its certificate is set); none without a site.
fn web_ports(config: &StartConfig, site: bool, web_tls: bool) -> Vec<(u16, Serves)> {
    if !site {
        return Vec::new();
    }
    let mut ports = Vec::new();
    if let Some(p) = config.web.http {
        ports.push((p, Serves::Site { tls: false }));
    }
    match config.web.https {
        Some(p) if web_tls && !config.ports.contains(&p) => {
            ports.push((p, Serves::Site { tls: true }))
        }
        _ => {}
    }
    // As the reference's web servers, which fail alone: a port that cannot be listened on is
    // logged, and the relay serves SMP without it.
    ports.retain(|(p, _)| match listen::check_port_free(*p) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(
                "the web site is not served on port {p}: {}",
                port_refused(*p, &e)
            );
            false
        }
    });
    ports
}

/// One pass over a shard's queues at start: their IDs into the shared directory (made room for
/// first: the shards' stores are of about the same size) and their service associations into the
/// owner's index, which it returns. A directory that caches the store's IDs needs none of them:
/// only the queues associated with services are read.
fn index_queues<S: ShardStore>(
    directory: &Directory,
    store: &S,
    shards: usize,
) -> Result<owner::services::ServiceState, String> {
    if directory.is_cache() {
        let services = owner::services::ServiceState::default();
        store.for_each_service_queue_ids(&mut |q| services.index_ids(q))?;
        return Ok(services);
    }
    directory.reserve(IdSpace::Sender, store.queue_count_estimate() * shards);
    let notifiers = store.notifier_count_hint();
    if notifiers > 0 {
        directory.reserve(IdSpace::Notifier, notifiers * shards);
    }
    let services = owner::services::ServiceState::default();
    let mut senders = directory.batch(IdSpace::Sender);
    let mut links = directory.batch(IdSpace::Link);
    let mut notifiers = directory.batch(IdSpace::Notifier);
    store.for_each_queue_ids(&mut |q| {
        services.index_ids(q);
        let rid = q.recipient_id;
        senders.insert(q.sender_id, rid);
        if let Some(l) = q.link_id {
            links.insert(l, rid);
        }
        if let Some(n) = q.notifier_id {
            notifiers.insert(n, rid);
        }
    })?;
    // The batches' last inserts are made as they drop, before the shard serves.
    drop((senders, links, notifiers));
    Ok(services)
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
