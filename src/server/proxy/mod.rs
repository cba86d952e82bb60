//! The proxy role of private routing (PRXY/PKEY, PFWD/PRES; `reference/smp-wire.md` §5.3 notes
//! 11–12, §5.5): the relay connects to destination relays as an SMP client and forwards its own
//! clients' commands there, so that the destination never sees the client's address.
//!
//! One `ProxyAgent` per shard. Requests arrive from the connection's reader as `ProxyJob`s and run
//! as tasks of their own (bounded per connection), so a slow destination never stalls a shard.

use crate::protocol::command::Command;
use crate::protocol::error::{ErrorType, ProxyError};
use crate::protocol::response::BrokerMsg;
use crate::server::router::Session;

/// A PRXY or PFWD from a client, to be answered by the proxy agent.
pub struct ProxyJob {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    pub command: Command,
}

/// The shard's proxy: its sessions to destination relays.
#[derive(Default)]
pub struct ProxyAgent {}

impl ProxyAgent {
    pub fn new() -> Self {
        ProxyAgent {}
    }

    /// Answers one PRXY (PKEY) or PFWD (PRES); the entity to answer with is returned with it
    /// (PKEY carries an empty entity, PRES the proxy↔destination session ID).
    pub async fn handle(&self, _session: &Session, job: &ProxyJob) -> (Vec<u8>, BrokerMsg) {
        // The role is not built yet: answer as the reference does with the role off.
        let e = match job.command {
            Command::PFwd { .. } => ProxyError::NoSession,
            _ => ProxyError::BasicAuth,
        };
        (job.entity_id.clone(), BrokerMsg::Err(ErrorType::Proxy(e)))
    }
}
