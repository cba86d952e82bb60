//! What a shard's connections share (`docs/ARCHITECTURE.md` §1): its settings and credentials,
//! the mesh to other shards, the table of its established connections, and how owners' answers
//! and events reach them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use crate::config::StartConfig;
use crate::server::conn::output::{ask_again, ConnHandle, Output};
use crate::server::directory::Directory;
use crate::server::mesh::ShardMesh;
use crate::server::messages::{ConnMsg, OwnerMsg};
use crate::server::router::{ConnRef, Gathering, Group, GroupKind};
use crate::server::shard::admission::Admission;
use glommio::channels::local_channel::{self, LocalSender};

use crate::metrics::MetricsSnapshot;
use crate::protocol::ids_hash::xor_into;
use crate::server::router::CountHash;
use crate::store::services::Services;
use crate::transport::certs::ServerCredentials;

/// The TLS configs of the relay's ports, built once at start.
#[derive(Clone)]
pub struct TlsConfigs {
    /// The SMP ports'.
    pub smp: Arc<rustls::ServerConfig>,
    /// The WebSocket ports': the same certificate, ALPN `http/1.1` only (`tls::websocket_config`).
    pub websocket: Arc<rustls::ServerConfig>,
    /// Web clients' on a shared port (`[WEB] https`): the web certificate (`tls::web_config`).
    pub web: Option<Arc<rustls::ServerConfig>>,
}

/// What every connection of a shard reads; built once per shard.
pub struct ShardContext {
    pub shard_id: usize,
    pub config: StartConfig,
    pub credentials: Arc<ServerCredentials>,
    pub tls: TlsConfigs,
    /// The web site (`server/web.rs`); `None` without `[WEB] static_path`.
    pub site: Option<Arc<crate::web::site::Site>>,
    /// The connections of the site's own ports, over all shards (`limits::WEB_MAX_CONNECTIONS`;
    /// no bound per address: a page's connection leaves its handshake at once).
    pub web_admission: Arc<Admission>,
    /// Connections this shard holds now (its part of the metrics' count).
    pub connections: Cell<usize>,
    /// The relay's connection limits, shared by every shard.
    pub admission: Arc<Admission>,
    /// Every socket read of this shard lands here first (see `tls_stream`).
    pub read_scratch: crate::server::conn::tls_stream::ReadScratch,
    pub directory: Arc<Directory>,
    /// The relay's services, read at a service's handshake (`store::services`).
    pub services: Arc<Services>,
    pub mesh: ShardMesh,
    /// Established connections of this shard, by number: where owners' answers go.
    pub connections_table: RefCell<HashMap<u64, ConnHandle>>,
    next_conn: Cell<u64>,
    /// The proxy role: this shard's sessions to destination relays.
    pub proxy: crate::server::proxy::ProxyAgent,
    /// Shard 0's gathering of every shard's numbers for the metrics file (`StatsMsg::Metrics`).
    pub(in crate::server) stats_round: RefCell<Option<Gathering<MetricsSnapshot>>>,
    pub(in crate::server) next_stats_round: Cell<u64>,
    /// Test hook (`clock_control`): told when the next metrics file is written.
    pub(in crate::server) stats_waiters: RefCell<Vec<flume::Sender<()>>>,
    /// Back-pressure counters of this shard's connections, exported as metrics.
    pub conn_stats: ConnStats,
    /// Statistics shared with the other shards and the stop (`server/shard/stats.rs`).
    pub stats: Arc<crate::server::shard::stats::Shared>,
    /// Shard 0: the counters' period (`stats::Daily`), and its gathering of every shard's
    /// numbers for a daily line.
    pub(in crate::server) daily: RefCell<crate::server::shard::stats::Daily>,
    pub(in crate::server) daily_round: RefCell<Option<Gathering<MetricsSnapshot>>>,
    pub(in crate::server) daily_waiters: RefCell<Vec<flume::Sender<()>>>,
    /// `SUBS`/`NSUBS` of this shard's connections waiting for every shard's part, by round.
    service_waits: RefCell<HashMap<u64, LocalSender<CountHash>>>,
    next_service_round: Cell<u64>,
}

/// Counters of this shard's connections.
#[derive(Default)]
pub struct ConnStats {
    /// The relay's own counters the connections keep (back-pressure: `counters.rs`).
    pub relay: Cell<crate::counters::RelayCounters>,
    /// How `SUBS` and `NSUBS` counts compared with the clients' (the rest of the services'
    /// statistics is the owners').
    pub rcv_services: RefCell<crate::metrics::ServiceStats>,
    pub ntf_services: RefCell<crate::metrics::ServiceStats>,
    /// Blocks of this shard's connections that the reference counts as batches: two or more
    /// transmissions of one party, by the first one's command (SUB, DEL, NDEL, NSUB); and RSLVs.
    pub sub_batches: Cell<u64>,
    pub del_batches: Cell<u64>,
    pub ndel_batches: Cell<u64>,
    pub nsub_batches: Cell<u64>,
    pub rslv_reqs: Cell<u64>,
    /// RRES answers sealed by the connections (the owners count theirs): `pMsgFwdsRecv`.
    pub fwd_answers: Cell<u64>,
}

impl ConnStats {
    /// Counts in the connections' own counters.
    pub fn count(&self, f: impl FnOnce(&mut crate::counters::RelayCounters)) {
        let mut c = self.relay.get();
        f(&mut c);
        self.relay.set(c);
    }
}

impl ShardContext {
    /// Sends `msg(round)` to every shard (or only to `only`) and sums the counts and XORs the
    /// hashes of their answers (`ServicePart`); `None` if a shard stopped before answering.
    pub async fn gather_services(
        &self,
        only: Option<usize>,
        msg: impl Fn(u64) -> OwnerMsg,
    ) -> Option<CountHash> {
        let round = self.next_service_round.get() + 1;
        self.next_service_round.set(round);
        let shards = if only.is_some() {
            1
        } else {
            self.mesh.shards()
        };
        let (tx, rx) = local_channel::new_bounded(shards);
        self.service_waits.borrow_mut().insert(round, tx);
        match only {
            Some(shard) => self.mesh.send(shard, msg(round)),
            None => self.mesh.fan_out(|_| msg(round)),
        }
        let mut acc: CountHash = (0, [0; 16]);
        let mut all = true;
        for _ in 0..shards {
            match rx.recv().await {
                Some((n, h)) => {
                    acc.0 += n;
                    xor_into(&mut acc.1, &h);
                }
                None => {
                    all = false;
                    break;
                }
            }
        }
        self.service_waits.borrow_mut().remove(&round);
        all.then_some(acc)
    }

    /// A shard's answer to a round of `gather_services`.
    pub fn service_part(&self, round: u64, part: CountHash) {
        if let Some(tx) = self.service_waits.borrow().get(&round) {
            let _ = tx.try_send(part);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shard_id: usize,
        config: StartConfig,
        credentials: Arc<ServerCredentials>,
        tls: TlsConfigs,
        admission: Arc<Admission>,
        directory: Arc<Directory>,
        services: Arc<Services>,
        mesh: ShardMesh,
    ) -> Self {
        let proxy = crate::server::proxy::ProxyAgent::new(&config.settings);
        ShardContext {
            shard_id,
            config,
            credentials,
            tls,
            site: None,
            web_admission: Admission::new(crate::limits::WEB_MAX_CONNECTIONS, usize::MAX),
            connections: Cell::new(0),
            admission,
            read_scratch: crate::server::conn::tls_stream::new_scratch(),
            directory,
            services,
            mesh,
            connections_table: RefCell::new(HashMap::new()),
            service_waits: RefCell::new(HashMap::new()),
            next_service_round: Cell::new(0),
            next_conn: Cell::new(0),
            proxy,
            stats_round: RefCell::new(None),
            next_stats_round: Cell::new(0),
            stats_waiters: RefCell::new(Vec::new()),
            conn_stats: ConnStats::default(),
            stats: Arc::default(),
            daily: RefCell::default(),
            daily_round: RefCell::new(None),
            daily_waiters: RefCell::new(Vec::new()),
        }
    }

    pub fn next_conn_id(&self) -> u64 {
        let id = self.next_conn.get();
        self.next_conn.set(id + 1);
        id
    }

    /// One connection message of the inbox: answers and events to the connection's output,
    /// service counts to the gathering that asked for them.
    pub(in crate::server) fn conn_msg(&self, msg: ConnMsg) {
        match msg {
            ConnMsg::Reply {
                conn,
                block_seq,
                groups,
            } => self.deliver(conn, groups, Some(block_seq)),
            ConnMsg::Event { conn, groups } => self.deliver(conn, groups, None),
            ConnMsg::Redelivered { conn, groups } => self.redelivered(conn, groups),
            ConnMsg::Close { conn } => self.close(conn),
            ConnMsg::ServicePart { round, part } => self.service_part(round, part),
        }
    }

    /// Hands groups to a connection of this shard. A connection that has gone drops them (its
    /// owners are told by `Closed` and forget it), except notifications, which go back to their
    /// owners to be stored.
    pub(in crate::server) fn deliver(
        &self,
        conn: ConnRef,
        groups: Vec<Group>,
        block_seq: Option<u64>,
    ) {
        let table = self.connections_table.borrow();
        let Some(h) = table.get(&conn.id) else {
            drop(table);
            self.return_ntfs(groups);
            return;
        };
        let admitted = h.state.admit(groups, block_seq.is_none());
        if admitted.dropped > 0 {
            self.conn_stats
                .count(|c| c.output_drops += admitted.dropped as u64);
        }
        // An empty output still wakes the writer: it releases the block's permit, or ends a
        // connection that was just doomed.
        let _ = h.out.try_send(Output {
            groups: admitted.kept,
            block_seq,
        });
        drop(table);
        for r in admitted.returned {
            self.return_ntfs(vec![Group {
                transmissions: Vec::new(),
                kind: GroupKind::Ntfs(r),
            }]);
        }
    }

    /// Sends the notifications among `groups` back to their owners.
    pub fn return_ntfs(&self, groups: Vec<Group>) {
        for g in groups {
            if let GroupKind::Ntfs(r) = g.kind {
                self.mesh.send(
                    r.owner,
                    OwnerMsg::ReturnNtfs {
                        notifier_id: r.notifier_id,
                        ntfs: r.ntfs,
                    },
                );
            }
        }
    }

    /// An owner answered a connection's ask (`conn::ask_again`): queue what it sent, and ask for
    /// the next items once every owner asked has answered.
    pub(in crate::server) fn redelivered(&self, conn: ConnRef, groups: Vec<Group>) {
        self.deliver(conn, groups, None);
        let table = self.connections_table.borrow();
        if let Some(h) = table.get(&conn.id) {
            crate::server::count::take(&h.state.asking, 1, "asks out");
            if ask_again(&self.mesh, conn, &h.state) {
                self.conn_stats.count(|c| c.output_reasks += 1);
            }
            let after = h.state.take_after_held();
            if !after.is_empty() {
                self.deliver(conn, vec![Group::plain(after)], None);
            }
        }
    }

    /// Ends a connection at its owner's request.
    pub(in crate::server) fn close(&self, conn: ConnRef) {
        if let Some(h) = self.connections_table.borrow().get(&conn.id) {
            h.state.doomed.set(true);
            let _ = h.out.try_send(Output {
                groups: Vec::new(),
                block_seq: None,
            });
        }
    }
}
