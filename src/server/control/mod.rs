//! The control port (`[TRANSPORT] control_port`): operators manage a running relay over text
//! lines on 127.0.0.1, with the reference's greeting, commands, roles and answers (simplexmq
//! `src/Simplex/Messaging/Server/Control.hs` for the commands, `Server.hs`, `runCPServer`, for
//! what each does and says). Shard 0 serves it; what it needs of other shards travels as
//! `ShardMsg::Control` (`request.rs`), and queue operations run on the queue's owner
//! (`commands/control.rs`), found as a sender's command finds it: the sender ID, else the link ID,
//! in the ID directory.
//!
//! Bounded: at most `MAX_CONTROL_CONNECTIONS` connections, lines of at most
//! `MAX_CONTROL_LINE_BYTES` (a longer one ends its connection, no other).

pub mod parse;
pub mod request;

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use self::parse::{BlockQuota, ControlCommand, Role};
use self::request::{ClientRow, ControlMsg, QueueOp, QueueOutcome, ShardClients};
use super::directory::IdSpace;
use crate::limits::{MAX_CONTROL_CONNECTIONS, MAX_CONTROL_LINE_BYTES};
use crate::log_limit::{self, RateLimited};
use crate::metrics::{keys, MetricsSnapshot, ProxyStats};
use crate::protocol::error::ErrorType;
use crate::server::shard::context::ShardContext;
use crate::store::QueueStatus;

/// Binds 127.0.0.1:`port` (only loopback: the reference's `runLocalTCPServer`), before the shard
/// reports ready, so that a port in use stops the start.
pub fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
        std::io::Error::other(format!(
            "cannot listen on the control port 127.0.0.1:{port}: {e}"
        ))
    })
}

/// What the connections of the port share.
struct Port {
    ctx: Rc<ShardContext>,
    quota: RefCell<BlockQuota>,
    /// Unix seconds the relay started (`fromTime`).
    started_at: i64,
    open: Cell<usize>,
}

/// Serves the port until the shard stops (the task is dropped).
pub async fn serve(listener: TcpListener, ctx: Rc<ShardContext>) {
    let port = Rc::new(Port {
        quota: RefCell::new(BlockQuota::new(ctx.config.control.daily_block_quota)),
        ctx,
        started_at: crate::clock::now_secs(),
        open: Cell::new(0),
    });
    loop {
        let mut s = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "control port accept failed");
                glommio::timer::Timer::new(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if port.open.get() >= MAX_CONTROL_CONNECTIONS {
            let refusal = format!(
                "error: {MAX_CONTROL_CONNECTIONS} control port connections are open; close one\n"
            );
            glommio::spawn_local(async move {
                let _ = s.write_all(refusal.as_bytes()).await;
                let _ = s.close().await;
            })
            .detach();
            continue;
        }
        port.open.set(port.open.get() + 1);
        let p = port.clone();
        glommio::spawn_local(async move {
            if let Err(e) = connection(&mut s, &p).await {
                tracing::debug!(error = %e, "control port connection ended");
            }
            // Free before the peer sees the end, so that it may connect again at once.
            p.open.set(p.open.get() - 1);
            let _ = s.close().await;
        })
        .detach();
    }
}

/// One connection: the greeting, then one answer per line until `quit` or the end.
async fn connection(s: &mut TcpStream, port: &Port) -> std::io::Result<()> {
    s.write_all(format!("{}\n", parse::GREETING).as_bytes())
        .await?;
    let mut role = Role::None;
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 1024];
    let mut at_end = false;
    loop {
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            if end > MAX_CONTROL_LINE_BYTES {
                return too_long(s).await;
            }
            let line: Vec<u8> = pending.drain(..=end).take(end).collect();
            let answer = match parse::parse(&line) {
                Ok(ControlCommand::Quit) => return Ok(()),
                Ok(cmd) => {
                    log_command(&line, &cmd, role);
                    port.run(cmd, &mut role).await
                }
                Err(e) => Some(format!("error: {e}")),
            };
            if let Some(mut text) = answer {
                text.push('\n');
                s.write_all(text.as_bytes()).await?;
            }
        }
        if at_end {
            return Ok(());
        }
        if pending.len() > MAX_CONTROL_LINE_BYTES {
            return too_long(s).await;
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            // A last line without its line end is still a line.
            at_end = true;
            if !pending.is_empty() {
                pending.push(b'\n');
            }
            continue;
        }
        pending.extend_from_slice(&chunk[..n]);
    }
}

async fn too_long(s: &mut TcpStream) -> std::io::Result<()> {
    let text = format!(
        "error: a line may be at most {MAX_CONTROL_LINE_BYTES} bytes; closing the connection\n"
    );
    s.write_all(text.as_bytes()).await
}

/// Commands of connections that have not authenticated, and commands refused for their role: a
/// local process can send thousands a second, so their lines go through the log limiter
/// (`log_limit`, at most one line of each kind a second, with the count of the others).
static ANONYMOUS_COMMAND: RateLimited = RateLimited::new("ControlPort: commands without auth");
static UNAUTHORIZED_COMMAND: RateLimited = RateLimited::new("Unauthorized control port command");

/// Every command but `auth`, `help`, `quit` and the empty line goes to the log, as the reference
/// logs them; those of a connection without a role through the limiter.
fn log_command(line: &[u8], cmd: &ControlCommand, role: Role) {
    if matches!(
        cmd,
        ControlCommand::Auth(_) | ControlCommand::Help | ControlCommand::Skip
    ) {
        return;
    }
    let line = String::from_utf8_lossy(line);
    if role == Role::None {
        log_limit::warn(&ANONYMOUS_COMMAND, |suppressed| {
            tracing::warn!(suppressed, "ControlPort: {line:?}")
        });
    } else {
        tracing::warn!("ControlPort: {line:?}");
    }
}

const UNAUTHORIZED: &str = "AUTH";

impl Port {
    /// The answer to one command (`None`: nothing is written).
    async fn run(&self, cmd: ControlCommand, role: &mut Role) -> Option<String> {
        let user = *role != Role::None;
        let admin = *role == Role::Admin;
        let needs = |allowed: bool| {
            if !allowed {
                log_limit::warn(&UNAUTHORIZED_COMMAND, |suppressed| {
                    tracing::error!(suppressed, "Unauthorized control port command")
                });
            }
            allowed
        };
        let c = &self.ctx.config.control;
        let answer = match cmd {
            ControlCommand::Auth(pw) => {
                let (r, text) = parse::authenticate(
                    *role,
                    &pw,
                    c.user_password.as_deref(),
                    c.admin_password.as_deref(),
                );
                *role = r;
                text
            }
            ControlCommand::Skip | ControlCommand::Quit => return None,
            ControlCommand::Help => parse::HELP.to_string(),
            ControlCommand::StatsRts => process_stats(self.started_at),
            ControlCommand::Suspend if needs(admin) => "suspend not implemented".into(),
            ControlCommand::Resume if needs(admin) => "resume not implemented".into(),
            ControlCommand::Clients if needs(admin) => self.clients().await,
            ControlCommand::Stats if needs(user) => self.stats(admin).await,
            ControlCommand::Threads if needs(admin) => threads(),
            ControlCommand::Sockets if needs(user) => self.sockets().await,
            ControlCommand::SocketThreads if needs(admin) => self.socket_threads().await,
            ControlCommand::ServerInfo if needs(user) => self.server_info(admin).await,
            ControlCommand::Delete(id) if needs(admin) => {
                match self.on_queue(&id, QueueOp::Delete).await {
                    Ok(QueueOutcome::Deleted { messages }) => {
                        format!("ok, {messages} messages deleted")
                    }
                    Ok(other) => mismatched(&other),
                    Err(e) => e,
                }
            }
            ControlCommand::Status(id) if needs(user) => {
                match self.on_queue(&id, QueueOp::Status).await {
                    Ok(QueueOutcome::Status {
                        status,
                        updated_at,
                        mode,
                    }) => parse::status_line(&status, updated_at, mode),
                    Ok(other) => mismatched(&other),
                    Err(e) => e,
                }
            }
            ControlCommand::Block(id, info) if needs(user) => {
                // Counted before the owner answers, so that blocks from several connections at
                // once cannot pass the quota together; given back unless an active queue was
                // blocked.
                let counted_on = crate::clock::now_secs();
                if let Err(e) = self.quota.borrow_mut().take(counted_on) {
                    return Some(e);
                }
                let now = QueueStatus::Blocked(info.clone());
                let answer = self.on_queue(&id, QueueOp::Block(info)).await;
                if !matches!(
                    answer,
                    Ok(QueueOutcome::Blocked {
                        was: QueueStatus::Active
                    })
                ) {
                    self.quota.borrow_mut().give_back(counted_on);
                }
                match answer {
                    Ok(QueueOutcome::Blocked {
                        was: QueueStatus::Active,
                    }) => format!("ok, queue blocked: {}", parse::show_status(&now)),
                    Ok(_) => format!("ok, already inactive: {}", parse::show_status(&now)),
                    Err(e) => e,
                }
            }
            ControlCommand::Unblock(id) if needs(user) => {
                match self.on_queue(&id, QueueOp::Unblock).await {
                    Ok(QueueOutcome::Unblocked {
                        was: QueueStatus::Blocked(info),
                    }) => format!(
                        "ok, queue unblocked, reason to block was: {}",
                        parse::show_blocking_info(&info)
                    ),
                    Ok(QueueOutcome::Unblocked {
                        was: QueueStatus::Active,
                    }) => "ok, queue was active".into(),
                    Ok(_) => "error, queue is inactive".into(),
                    Err(e) => e,
                }
            }
            ControlCommand::Save if needs(admin) => self.save().await,
            _ => UNAUTHORIZED.into(),
        };
        Some(answer)
    }

    /// Runs `op` on the queue whose sender ID (else link ID) is `id`, on its owner; the error is
    /// the whole answer line.
    async fn on_queue(&self, id: &[u8], op: QueueOp) -> Result<QueueOutcome, String> {
        let d = &self.ctx.directory;
        let recipient_id = match d.find(IdSpace::Sender, id).await {
            Some(rid) => Some(rid),
            None => d.find(IdSpace::Link, id).await,
        };
        let Some(recipient_id) = recipient_id else {
            return Err(format!("error: {}", show_error(&ErrorType::Auth)));
        };
        let owner = self.ctx.mesh.owner_of(&recipient_id);
        let (reply, answer) = flume::bounded(1);
        self.ctx.mesh.send(
            owner,
            ControlMsg::Queue {
                recipient_id,
                op,
                reply,
            },
        );
        match answer.recv_async().await {
            Ok(r) => r.map_err(|e| format!("error: {}", show_error(&e))),
            Err(_) => Err("error: the relay is stopping".into()),
        }
    }

    /// Sends every shard `make(reply)` and collects their answers; `None` if one stopped.
    async fn gather<T>(&self, make: impl Fn(flume::Sender<T>) -> ControlMsg) -> Option<Vec<T>> {
        let shards = self.ctx.mesh.shards();
        let (tx, rx) = flume::bounded(shards);
        self.ctx.mesh.fan_out(|_| make(tx.clone()));
        drop(tx);
        let mut all = Vec::with_capacity(shards);
        for _ in 0..shards {
            all.push(rx.recv_async().await.ok()?);
        }
        Some(all)
    }

    async fn clients_of_shards(&self) -> Option<Vec<ShardClients>> {
        self.gather(|reply| ControlMsg::Clients { reply }).await
    }

    /// `stats`: the counters under the reference's names and in its order (simplexmq `Server.hs`,
    /// `CPStats`), as the metrics file shows them: the shards' sum with what the statistics
    /// backup restored and without what daily lines reported (`server/shard/stats.rs`, `Daily`).
    async fn stats(&self, admin: bool) -> String {
        let Some(parts) = self.gather(|reply| ControlMsg::Stats { reply }).await else {
            return STOPPING.into();
        };
        let mut raw = MetricsSnapshot::default();
        for p in parts {
            raw.add(&p);
        }
        let (m, from_ms) = {
            let daily = self.ctx.daily.borrow();
            (daily.shown(&raw), daily.from_ms)
        };
        let notifiers = raw.notifier_count as usize;
        render_stats(&m, (from_ms / 1000) as i64, notifiers, admin)
    }

    /// `clients`: one CSV line per connection (simplexmq `Server.hs`, `CPClients`).
    async fn clients(&self) -> String {
        let Some(parts) = self.clients_of_shards().await else {
            return STOPPING.into();
        };
        let shards = self.ctx.mesh.shards();
        let now = crate::clock::now_secs();
        let subs = subscriptions_by_connection(&parts);
        let mut out = String::from(
            "clientId,sessionId,connected,createdAt,rcvActiveAt,sndActiveAt,age,subscriptions",
        );
        for c in parts.iter().flat_map(|p| &p.connections) {
            let n = subs.get(&(c.shard, c.id)).map_or(0, |(q, n)| q + n);
            let _ = write!(
                out,
                "\n{},{},True,{},{},{},{},{n}",
                client_id(c, shards),
                base64_std(&c.session_id),
                c.created_at,
                c.active_at,
                c.active_at,
                now - c.created_at,
            );
        }
        out
    }

    /// `sockets`: for each port, connections accepted, closed and open (the counters every
    /// shard's accept loop keeps for the metrics file, `server/shard/stats.rs`).
    async fn sockets(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let blocks: Vec<String> = self
            .ctx
            .stats
            .sockets
            .iter()
            .map(|p| {
                // Closes first: every close follows its accept, so `closed <= accepted` here.
                let closed = p.closed.load(Relaxed);
                let accepted = p.accepted.load(Relaxed);
                format!(
                    "Sockets for port {}:\naccepted: {accepted}\nclosed: {closed}\nactive: {}\nleaked: 0",
                    p.port,
                    crate::server::count::less(accepted, closed, "open sockets")
                )
            })
            .collect();
        blocks.join("\n")
    }

    /// `socket-threads`: one line per connection: shard, connection number, session ID.
    async fn socket_threads(&self) -> String {
        let Some(parts) = self.clients_of_shards().await else {
            return STOPPING.into();
        };
        let lines: Vec<String> = parts
            .iter()
            .flat_map(|p| &p.connections)
            .map(|c| format!("{},{},{}", c.shard, c.id, base64_std(&c.session_id)))
            .collect();
        lines.join("\n")
    }

    /// `server-info`: threads, clients and subscriptions (simplexmq `Server.hs`, `CPServerInfo`);
    /// the admin also sees the counts found through the connections.
    async fn server_info(&self, admin: bool) -> String {
        let Some(parts) = self.clients_of_shards().await else {
            return STOPPING.into();
        };
        let shards = self.ctx.mesh.shards();
        let subs = subscriptions_by_connection(&parts);
        let clients: usize = parts.iter().map(|p| p.connections.len()).sum();
        let mut out = format!("Threads: {}\nClients: {clients}", thread_count());
        let smp_clients = subs.values().filter(|(q, _)| *q > 0).count();
        let mut ntf_ids: Vec<u64> = subs
            .iter()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(&(shard, id), _)| id * shards as u64 + shard as u64)
            .collect();
        ntf_ids.sort_unstable();
        let smp: usize = parts.iter().map(|p| p.queue_subscriptions).sum();
        let ntf: usize = parts.iter().map(|p| p.ntf_subscriptions).sum();
        if admin {
            let _ = write!(
                out,
                "\nSMP subscriptions (via clients): {smp}\nSMP subscribed clients (via clients): {smp_clients}\nNtf subscriptions (via clients): {ntf}\nNtf subscribed clients (via clients): {}",
                ntf_ids.len()
            );
        }
        let ids = ntf_ids
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let _ = write!(
            out,
            "\nSMP subscriptions: {smp}\nSMP subscribed clients: {smp_clients}\nSMP subscribed clients count 2: {smp_clients}\nNtf subscriptions: {ntf}\nNtf subscribed clients: {n} [{ids}]\nNtf subscribed clients count 2: {n} fromList [{ids}]",
            n = ntf_ids.len()
        );
        out
    }

    /// `save`: every shard writes what a clean stop would write, keeping its store open (the
    /// reference's `save` closes its store while the server goes on). The journal has every
    /// answered change in its files already; the memory store writes its group files, the
    /// PostgreSQL store its pending notifications.
    async fn save(&self) -> String {
        let Some(results) = self.gather(|reply| ControlMsg::Save { reply }).await else {
            return STOPPING.into();
        };
        let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        if errors.is_empty() {
            "saving server state...\nserver state saved!".into()
        } else {
            tracing::warn!(errors = ?errors, "control port save failed");
            format!("saving server state...\nerror: {}", errors.join("; "))
        }
    }
}

/// An owner answered another operation than it was asked: a bug, said as such rather than a panic.
fn mismatched(outcome: &QueueOutcome) -> String {
    tracing::error!(
        ?outcome,
        "control port: the owner answered another operation"
    );
    "error: internal: unexpected answer".into()
}

const STOPPING: &str = "error: the relay is stopping";

/// Haskell's `show` of the errors a queue operation gives (`AUTH`, `STORE "…"`).
fn show_error(e: &ErrorType) -> String {
    match e {
        ErrorType::Auth => "AUTH".into(),
        ErrorType::Store(s) => format!("STORE {s:?}"),
        e => e.to_string(),
    }
}

/// A number for a connection, unique in the relay: its shard plus the shard count times its
/// number on the shard.
fn client_id(c: &ClientRow, shards: usize) -> u64 {
    c.id * shards as u64 + c.shard as u64
}

fn base64_std(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Queue and notifier subscriptions of each connection, over every owner.
fn subscriptions_by_connection(
    parts: &[ShardClients],
) -> std::collections::HashMap<(usize, u64), (usize, usize)> {
    let mut m = std::collections::HashMap::new();
    for (conn, q, n) in parts.iter().flat_map(|p| &p.subs) {
        let e: &mut (usize, usize) = m.entry(*conn).or_default();
        e.0 += q;
        e.1 += n;
    }
    m
}

/// `stats`' lines for the counters of `m` (simplexmq `Server.hs`, `CPStats`, in its order).
fn render_stats(m: &MetricsSnapshot, from_secs: i64, notifiers: usize, admin: bool) -> String {
    let from_time = crate::clock::utc_time(from_secs)
        .replace('T', " ")
        .replace('Z', " UTC");
    let proxy = |label: &str, p: &ProxyStats| {
        format!(
            "{label}: requests={}, successes={}, errorsConnect={}, errorsCompat={}, errorsOther={}",
            p.requests, p.successes, p.errors_connect, p.errors_compat, p.errors_other
        )
    };
    let mut lines = vec![
        format!("fromTime: {from_time}"),
        format!("{}: {}", keys::queues_created, m.queues_created),
        format!("{}: {}", keys::queues_secured, m.queues_secured),
        format!("{}: {}", keys::queues_deleted, m.queues_deleted),
        format!(
            "{}: {}",
            keys::queues_deleted_batches,
            m.queues_deleted_batches
        ),
        format!("{}: {}", keys::queues_deleted_new, m.queues_deleted_new),
        format!(
            "{}: {}",
            keys::queues_deleted_secured,
            m.queues_deleted_secured
        ),
        format!("daily active queues: {}", m.active_day),
        format!("{}: {}", keys::sub_successes, m.sub_successes),
        format!("{}: {}", keys::sub_batches, m.sub_batches),
        format!("{}: {}", keys::sub_end, m.sub_end),
        format!("{}: {}", keys::sub_end_batches, m.sub_end_batches),
        format!(
            "other SUB events (auth, duplicate, prohibited): ({},{},{})",
            m.sub_auth, m.sub_duplicate, m.sub_prohibited
        ),
        format!("{}: {}", keys::msg_sent, m.msg_sent),
        format!("{}: {}", keys::msg_recv, m.msg_recv),
        format!("{}: {}", keys::msg_recv_get, m.msg_recv_get),
        format!("{}: {}", keys::msg_get, m.msg_get),
        format!("{}: {}", keys::msg_get_no_msg, m.msg_get_no_msg),
        format!(
            "other GET events (auth, duplicate, prohibited): ({},{},{})",
            m.msg_get_auth, m.msg_get_duplicate, m.msg_get_prohibited
        ),
        format!("{}: {}", keys::msg_sent_ntf, m.msg_sent_ntf),
        format!("{}: {}", keys::msg_recv_ntf, m.msg_recv_ntf),
        format!("{}: {}", keys::msg_ntfs, m.msg_ntfs),
        format!("{}: {}", keys::msg_ntfs_batches, m.msg_ntfs_batches),
        format!("{}: {}", keys::msg_ntf_expired, m.msg_ntf_expired),
        format!("{}: {}", keys::queue_count, m.queue_count),
        format!("qCount 2: {}", m.queue_count),
        format!("notifiers: {notifiers}"),
        format!("msgCount: {}", m.msg_count),
        format!("ntfCount: {}", m.ntf_count),
    ];
    if admin {
        // The reference recounts its buffered notifications for an admin; the stores count
        // theirs exactly, so it is the same number.
        lines.push(format!("ntfCount 2: {}", m.ntf_count));
    }
    lines.extend([
        proxy("pRelays", &m.p_relays),
        proxy("pRelaysOwn", &m.p_relays_own),
        proxy("pMsgFwds", &m.p_msg_fwds),
        proxy("pMsgFwdsOwn", &m.p_msg_fwds_own),
        format!("pMsgFwdsRecv: {}", m.p_msg_fwds_recv),
        format!("rcvServiceCount: {}", m.rcv_services_count),
        format!("ntfServiceCount: {}", m.ntf_services_count),
        format!("rcvServiceQueuesCount: {}", m.rcv_services_queues),
        format!("ntfServiceQueuesCount: {}", m.ntf_services_queues),
    ]);
    lines.join("\n")
}

/// `stats-rts`: the reference prints its Haskell runtime's statistics; this relay prints its
/// process's (from `/proc/self/status`) and its uptime.
fn process_stats(started_at: i64) -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut out = format!("uptime_secs: {}", crate::clock::now_secs() - started_at);
    for line in status.lines() {
        if let Some((key, value)) = line.split_once(':') {
            if matches!(key, "VmRSS" | "VmHWM" | "VmSize" | "Threads") {
                let _ = write!(out, "\n{key}: {}", value.trim());
            }
        }
    }
    out
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// `threads`: the process's threads, each with its state and name (`/proc/self/task`).
fn threads() -> String {
    let mut tids: Vec<u64> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    let mut out = format!("Threads: {}", tids.len());
    for tid in tids {
        let dir = format!("/proc/self/task/{tid}");
        let name = std::fs::read_to_string(format!("{dir}/comm")).unwrap_or_default();
        let state = std::fs::read_to_string(format!("{dir}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("State:").map(|s| s.trim().to_string()))
            .unwrap_or_default();
        let _ = write!(out, "\n{tid} ({state}) {}", name.trim());
    }
    out
}

/// A shard's part of `clients`, `sockets` and `server-info`.
pub fn shard_clients(
    ctx: &ShardContext,
    subs: Vec<((usize, u64), usize, usize)>,
    queue_subscriptions: usize,
    ntf_subscriptions: usize,
) -> ShardClients {
    let now = crate::clock::now_secs();
    let connections = ctx
        .connections_table
        .borrow()
        .iter()
        .map(|(&id, h)| ClientRow {
            shard: ctx.shard_id,
            id,
            session_id: h.session_id.clone(),
            created_at: h.created_at,
            active_at: now - h.state.last_active.get().elapsed().as_secs() as i64,
        })
        .collect();
    ShardClients {
        connections,
        subs,
        queue_subscriptions,
        ntf_subscriptions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_use_the_reference_s_names_and_order() {
        let m = MetricsSnapshot {
            queues_created: 3,
            msg_sent: 5,
            sub_auth: 1,
            sub_duplicate: 2,
            sub_prohibited: 3,
            msg_get_auth: 4,
            ntf_count: 6,
            ..MetricsSnapshot::default()
        };
        let labels = |text: &str| -> Vec<String> {
            text.lines()
                .map(|l| l.split(": ").next().unwrap_or(l).to_string())
                .collect()
        };
        // The labels of simplexmq `Server.hs` `CPStats`, in its order.
        let reference = [
            "fromTime",
            "qCreated",
            "qSecured",
            "qDeletedAll",
            "qDeletedAllB",
            "qDeletedNew",
            "qDeletedSecured",
            "daily active queues",
            "qSub",
            "qSubAllB",
            "qSubEnd",
            "qSubEndB",
            "other SUB events (auth, duplicate, prohibited)",
            "msgSent",
            "msgRecv",
            "msgRecvGet",
            "msgGet",
            "msgGetNoMsg",
            "other GET events (auth, duplicate, prohibited)",
            "msgSentNtf",
            "msgRecvNtf",
            "msgNtfs",
            "msgNtfsB",
            "msgNtfExpired",
            "qCount",
            "qCount 2",
            "notifiers",
            "msgCount",
            "ntfCount",
            "ntfCount 2",
            "pRelays",
            "pRelaysOwn",
            "pMsgFwds",
            "pMsgFwdsOwn",
            "pMsgFwdsRecv",
            "rcvServiceCount",
            "ntfServiceCount",
            "rcvServiceQueuesCount",
            "ntfServiceQueuesCount",
        ];
        let admin = render_stats(&m, 0, 2, true);
        assert_eq!(labels(&admin), reference);
        let user = render_stats(&m, 0, 2, false);
        let without_admin: Vec<&str> = reference
            .iter()
            .copied()
            .filter(|l| *l != "ntfCount 2")
            .collect();
        assert_eq!(labels(&user), without_admin, "ntfCount 2 is the admin's");
        let lines: Vec<&str> = admin.lines().collect();
        assert_eq!(lines[0], "fromTime: 1970-01-01 00:00:00 UTC");
        assert_eq!(lines[1], "qCreated: 3");
        assert!(lines.contains(&"msgSent: 5"));
        assert!(lines.contains(&"notifiers: 2"));
        assert!(lines.contains(&"other SUB events (auth, duplicate, prohibited): (1,2,3)"));
        assert!(lines.contains(&"other GET events (auth, duplicate, prohibited): (4,0,0)"));
        assert!(lines.contains(&"ntfCount 2: 6"));
        assert!(lines.contains(
            &"pRelays: requests=0, successes=0, errorsConnect=0, errorsCompat=0, errorsOther=0"
        ));
    }

    #[test]
    fn errors_are_shown_as_the_reference_shows_them() {
        assert_eq!(show_error(&ErrorType::Auth), "AUTH");
        assert_eq!(
            show_error(&ErrorType::Store("disk full".into())),
            "STORE \"disk full\""
        );
    }
}
