//! The proxy role of private routing (PRXY/PKEY, PFWD/PRES; simplexmq
//! `Server.hs`, `Client.hs`): the relay connects to destination relays as an SMP client and
//! forwards its own clients' commands there, so that the destination never sees the client's
//! address.
//!
//! One `ProxyAgent` per shard, with one session per destination shared by the shard's clients (the
//! reference has one per relay; here clients stay on their shard). Requests arrive from the
//! connection's reader as `ProxyJob`s and run as tasks of their own (bounded per connection), so a
//! slow destination never stalls a shard. Errors are the reference's (`processProxiedCmd`,
//! `smpProxyError`), see `session::DestError`.

mod address;
mod resolve;
mod session;
mod socks;
mod stream;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalSender};

pub use address::{is_forbidden, parse_host, Target};
use session::{timed, Connector, DestSession};
pub use session::{DestError, DestKey, PROXY_CLIENT_VERSIONS};

use crate::config::Settings;
use crate::metrics::ProxyStats;
use crate::protocol::command::{Command, SmpServer};
use crate::protocol::error::{ErrorType, ProxyError};
use crate::protocol::response::BrokerMsg;
use crate::server::router::Session;
use crate::transport::tls::{client_config, ALPN_SMP};

/// Name lookups in flight per shard (each on a thread of its own).
const MAX_RESOLVES_IN_FLIGHT: usize = 16;
/// A request waiting for another's connection attempt gives up a little after that attempt's
/// own limit (the reference's `waitForSMPClient`: `PCEResponseTimeout`).
const WAIT_MARGIN: Duration = Duration::from_secs(5);

/// A PRXY whose destination could not be reached (`log_limit`).
static PROXY_CONNECT_FAILED: crate::log_limit::RateLimited =
    crate::log_limit::RateLimited::new("proxy: error connecting");

/// A PRXY or PFWD from a client, to be answered by the proxy agent.
pub struct ProxyJob {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    pub command: Command,
}

type Outcome = Result<Rc<DestSession>, DestError>;

/// What the shard knows of a destination.
enum Slot {
    /// A connection attempt is running; these wait for it.
    Connecting(Vec<LocalSender<Outcome>>),
    Ready(Rc<DestSession>),
    /// The last attempt failed; the error is repeated until `until` (`persistErrorInterval`).
    Failed {
        error: DestError,
        until: Instant,
    },
}

struct Inner {
    enabled: bool,
    /// What PRXY must carry (`--proxy-password`, else the create password).
    password: Option<Vec<u8>>,
    /// `None` when the TLS client config could not be built (logged; PRXY then fails).
    connector: Option<Connector>,
    dests: RefCell<HashMap<DestKey, Slot>>,
    /// Open sessions by their session ID, for PFWD.
    sessions: RefCell<HashMap<Vec<u8>, Rc<DestSession>>>,
    /// `[PROXY] own_server_domains`: destinations counted again as "own" in the statistics.
    own_domains: Vec<String>,
    stats: RefCell<ProxyAgentStats>,
}

/// The reference's proxy statistics of one shard (`pRelays*`, `pMsgFwds*`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProxyAgentStats {
    pub relays: ProxyStats,
    pub relays_own: ProxyStats,
    pub msg_fwds: ProxyStats,
    pub msg_fwds_own: ProxyStats,
}

/// How a proxied request ended, for the statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Success,
    Connect,
    Compat,
    Other,
}

impl Ended {
    /// The reference's `temporaryClientError` split: network errors and timeouts are "connect".
    fn of_error(e: &DestError) -> Ended {
        match e {
            DestError::Network(_) | DestError::Timeout => Ended::Connect,
            _ => Ended::Other,
        }
    }
}

fn count(stats: &mut ProxyStats, ended: Ended) {
    stats.requests += 1;
    match ended {
        Ended::Success => stats.successes += 1,
        Ended::Connect => stats.errors_connect += 1,
        Ended::Compat => stats.errors_compat += 1,
        Ended::Other => stats.errors_other += 1,
    }
}

/// The reference's `isOwnServer`: the first host equals a listed domain or ends with `.domain`.
fn is_own(domains: &[String], hosts: &[String]) -> bool {
    hosts.first().is_some_and(|h| {
        domains
            .iter()
            .any(|d| h == d || h.strip_suffix(d.as_str()).is_some_and(|p| p.ends_with('.')))
    })
}

/// The shard's proxy: its sessions to destination relays.
pub struct ProxyAgent {
    inner: Rc<Inner>,
}

impl ProxyAgent {
    pub fn new(settings: &Settings) -> Self {
        let p = settings.proxy.clone();
        let connector = match client_config(vec![ALPN_SMP.to_vec()]) {
            Ok(tls) => Some(Connector {
                settings: p.clone(),
                tls,
                resolver: resolve::Resolver::new(MAX_RESOLVES_IN_FLIGHT),
                read_scratch: crate::server::conn::tls_stream::new_scratch(),
            }),
            Err(e) => {
                tracing::error!(error = %e, "proxy: cannot build the TLS client configuration");
                None
            }
        };
        ProxyAgent {
            inner: Rc::new(Inner {
                enabled: p.enabled,
                password: p.password.or_else(|| settings.create_password.clone()),
                connector,
                dests: RefCell::new(HashMap::new()),
                sessions: RefCell::new(HashMap::new()),
                own_domains: p.own_server_domains.clone(),
                stats: RefCell::new(ProxyAgentStats::default()),
            }),
        }
    }

    /// Answers one PRXY (PKEY) or PFWD (PRES). Every answer carries the request's entity, as the
    /// reference's `processProxiedCmd` (empty for PRXY, the session ID for PFWD).
    pub async fn handle(&self, _session: &Session, job: &ProxyJob) -> (Vec<u8>, BrokerMsg) {
        let msg = match &job.command {
            Command::Prxy { server, auth } => self.prxy(server, auth.as_deref()).await,
            Command::PFwd { version, key, et } => {
                self.pfwd(&job.corr_id, &job.entity_id, *version, *key, et)
                    .await
            }
            // The reader sends nothing else here.
            _ => BrokerMsg::Err(ErrorType::Internal),
        };
        (job.entity_id.clone(), msg)
    }

    async fn prxy(&self, server: &SmpServer, auth: Option<&[u8]>) -> BrokerMsg {
        let inner = &self.inner;
        let allowed = inner.enabled
            && match &inner.password {
                Some(p) => auth == Some(p.as_slice()),
                None => true,
            };
        if !allowed {
            return BrokerMsg::Err(ErrorType::Proxy(ProxyError::BasicAuth));
        }
        // As the reference counts them: a session that connected but cannot be proxied (its
        // version) is "compat"; a failure to connect is "connect" or "other".
        let (result, ended) = match session_for(inner, server).await {
            Ok(s) => {
                s.touch();
                match s.pkey() {
                    Ok(pkey) => (Ok(pkey), Ended::Success),
                    Err(e) => (Err(e), Ended::Compat),
                }
            }
            Err(e) => {
                let ended = Ended::of_error(&e);
                (Err(e), ended)
            }
        };
        self.count_relay(&server.hosts, ended);
        match result {
            Ok(pkey) => pkey,
            Err(e) => {
                // Any client can ask for any host: at most one line a second, so a client
                // cannot flood the log with host names of its choosing.
                crate::log_limit::warn(
                    &PROXY_CONNECT_FAILED,
                    |suppressed| tracing::warn!(hosts = ?server.hosts, error = ?e, suppressed, "proxy: error connecting"),
                );
                BrokerMsg::Err(e.to_error())
            }
        }
    }

    fn count_relay(&self, hosts: &[String], ended: Ended) {
        let mut st = self.inner.stats.borrow_mut();
        count(&mut st.relays, ended);
        if is_own(&self.inner.own_domains, hosts) {
            count(&mut st.relays_own, ended);
        }
    }

    fn count_fwd(&self, hosts: Option<&[String]>, ended: Ended) {
        let mut st = self.inner.stats.borrow_mut();
        count(&mut st.msg_fwds, ended);
        if hosts.is_some_and(|h| is_own(&self.inner.own_domains, h)) {
            count(&mut st.msg_fwds_own, ended);
        }
    }

    /// This shard's proxy statistics so far.
    pub fn stats(&self) -> ProxyAgentStats {
        *self.inner.stats.borrow()
    }

    async fn pfwd(
        &self,
        corr_id: &[u8],
        session_id: &[u8],
        version: u16,
        key: [u8; 32],
        et: &[u8],
    ) -> BrokerMsg {
        let s = self.inner.sessions.borrow().get(session_id).cloned();
        let Some(s) = s.filter(|s| !s.is_closed()) else {
            self.count_fwd(None, Ended::Connect);
            return BrokerMsg::Err(ErrorType::Proxy(ProxyError::NoSession));
        };
        s.touch();
        // As the reference counts them: an ERR from the destination is still a success of the
        // forwarding; a destination below v8 is "compat".
        let result = s.forward(corr_id, version, key, et).await;
        let ended = match &result {
            Ok(_) | Err(DestError::Protocol(_)) => Ended::Success,
            Err(_) if !s.can_forward() => Ended::Compat,
            Err(_) => Ended::Other,
        };
        self.count_fwd(Some(&s.key.hosts), ended);
        match result {
            Ok(r2) => BrokerMsg::Pres(r2),
            Err(e) => {
                tracing::debug!(hosts = ?s.key.hosts, error = ?e, "proxy: forwarding failed");
                BrokerMsg::Err(e.to_error())
            }
        }
    }

    /// Open destination sessions of this shard.
    pub fn open_sessions(&self) -> usize {
        self.inner.sessions.borrow().len()
    }
}

/// The session to `server`: the open one, the error of a recent failure, or a new connection
/// (one attempt at a time per destination; later requests wait for it).
async fn session_for(inner: &Rc<Inner>, server: &SmpServer) -> Outcome {
    let Some(connector) = &inner.connector else {
        return Err(DestError::Network("no TLS client configuration".into()));
    };
    let key = DestKey::of(server);
    let (tx, rx) = local_channel::new_bounded(1);
    let start = {
        let mut dests = inner.dests.borrow_mut();
        match dests.get_mut(&key) {
            Some(Slot::Ready(s)) if !s.is_closed() => return Ok(s.clone()),
            Some(Slot::Failed { error, until }) if Instant::now() < *until => {
                return Err(error.clone())
            }
            Some(Slot::Connecting(waiters)) => {
                waiters.push(tx);
                false
            }
            _ => {
                make_room(inner, &mut dests, connector.settings.max_sessions_per_shard)?;
                dests.insert(key.clone(), Slot::Connecting(vec![tx]));
                true
            }
        }
    };
    if start {
        let (inner, server) = (inner.clone(), server.clone());
        glommio::spawn_local(async move { connect_and_run(inner, server).await }).detach();
    }
    let limit = connector.settings.connect_timeout + WAIT_MARGIN;
    match timed(limit, rx.recv()).await {
        Some(Some(outcome)) => outcome,
        Some(None) => Err(DestError::Network("connection attempt abandoned".into())),
        None => Err(DestError::Timeout),
    }
}

/// Keeps the slots of a shard within `max`: expired failures go first, then the session unused
/// the longest that has nothing in flight. With none to spare, the new destination is refused.
fn make_room(
    inner: &Inner,
    dests: &mut HashMap<DestKey, Slot>,
    max: usize,
) -> Result<(), DestError> {
    if dests.len() < max {
        return Ok(());
    }
    let now = Instant::now();
    dests.retain(|_, slot| match slot {
        Slot::Failed { until, .. } => now < *until,
        Slot::Ready(s) => !s.is_closed(),
        Slot::Connecting(_) => true,
    });
    while dests.len() >= max {
        let idlest = dests
            .iter()
            .filter_map(|(k, slot)| match slot {
                Slot::Ready(s) if s.in_flight() == 0 => Some((s.last_used(), k.clone())),
                _ => None,
            })
            .min_by_key(|(t, _)| *t);
        let Some((_, k)) = idlest else {
            return Err(DestError::Network(
                "too many destination sessions on this shard".into(),
            ));
        };
        if let Some(Slot::Ready(s)) = dests.remove(&k) {
            inner.sessions.borrow_mut().remove(&s.session_id);
            s.close();
        }
    }
    Ok(())
}

/// Connects, tells everyone waiting, then runs the session until it ends and forgets it.
async fn connect_and_run(inner: Rc<Inner>, server: SmpServer) {
    let Some(connector) = &inner.connector else {
        return;
    };
    let key = DestKey::of(&server);
    let outcome = DestSession::connect(connector, &server).await;
    let waiters = {
        let mut dests = inner.dests.borrow_mut();
        let slot = match &outcome {
            Ok(s) => Slot::Ready(s.clone()),
            Err(e) => Slot::Failed {
                error: e.clone(),
                until: Instant::now() + connector.settings.persist_error,
            },
        };
        match dests.insert(key.clone(), slot) {
            Some(Slot::Connecting(w)) => w,
            _ => Vec::new(),
        }
    };
    if let Ok(s) = &outcome {
        tracing::info!(hosts = ?server.hosts, version = s.version, "proxy: connected to a destination");
        inner
            .sessions
            .borrow_mut()
            .insert(s.session_id.clone(), s.clone());
    }
    for w in waiters {
        let _ = w.try_send(outcome.clone());
    }
    let Ok(s) = outcome else {
        return;
    };
    s.run().await;
    // Forget it, unless a newer session took its place.
    inner.sessions.borrow_mut().remove(&s.session_id);
    let mut dests = inner.dests.borrow_mut();
    if matches!(dests.get(&key), Some(Slot::Ready(cur)) if Rc::ptr_eq(cur, &s)) {
        dests.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_servers_are_the_domains_and_their_subdomains() {
        let d = vec!["simplex.im".to_string(), "example.net".to_string()];
        let own = |h: &str| is_own(&d, &[h.to_string(), "other.org".to_string()]);
        assert!(own("simplex.im"));
        assert!(own("smp4.simplex.im"));
        assert!(own("a.b.example.net"));
        assert!(!own("notsimplex.im"), "a suffix that is not a subdomain");
        assert!(!own("simplex.im.evil.org"));
        assert!(
            !is_own(&d, &["other.org".to_string(), "simplex.im".to_string()]),
            "first host only"
        );
        assert!(!is_own(&[], &["simplex.im".to_string()]));
    }

    #[test]
    fn every_request_is_counted_once_with_how_it_ended() {
        let mut s = ProxyStats::default();
        for e in [
            Ended::Success,
            Ended::Connect,
            Ended::Compat,
            Ended::Other,
            Ended::Success,
        ] {
            count(&mut s, e);
        }
        assert_eq!(
            (
                s.requests,
                s.successes,
                s.errors_connect,
                s.errors_compat,
                s.errors_other
            ),
            (5, 2, 1, 1, 1)
        );
        assert_eq!(Ended::of_error(&DestError::Timeout), Ended::Connect);
        assert_eq!(
            Ended::of_error(&DestError::Network("x".into())),
            Ended::Connect
        );
        assert_eq!(Ended::of_error(&DestError::Host("x".into())), Ended::Other);
        assert_eq!(Ended::of_error(&DestError::Crypto), Ended::Other);
    }
}
