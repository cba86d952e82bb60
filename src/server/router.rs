//! Shard routing in one place: which shard owns a queue, and what travels between a connection
//! and the owners of its queues — sessions, requests, answer groups, deliveries — and the
//! gathering of fanned-out answers. The messages themselves are `messages.rs`; the inboxes that
//! carry them, `mesh.rs`.
//!
//! A queue belongs to the shard that owns its partition group (`docs/ARCHITECTURE.md` §1: partition
//! from the recipient ID, 64 groups, group `g` on shard `g mod shards`).

use std::sync::Arc;

use x25519_dalek::StaticSecret;

use crate::crypto::sxbox::NONCE_LEN;
use crate::protocol::command::{Command, ServiceRole};
use crate::protocol::response::{encode_response, BrokerMsg};
use crate::protocol::version::Version;
use crate::store::{group_of, EntityId, MsgId, MsgNtf, PARTITION_GROUPS};

/// What an answer to a forwarded transmission needs: how to seal it for the client and for the
/// proxy, and the session the inner transmission runs in.
pub struct Forwarded {
    /// The `RFWD`'s corrId (`n2`): `RRES` carries it, its reversed `cbNonce` seals `RRES`.
    pub outer_corr_id: Vec<u8>,
    /// The client's corrId from `FwdTransmission`, echoed in `FwdResponse`.
    pub fwd_corr_id: Vec<u8>,
    /// `cbNonce(fwd_corr_id)`; the answer to the client is sealed with its reverse.
    pub nonce: [u8; NONCE_LEN],
    /// X25519(client's per-command key, this connection's server key).
    pub cmd_secret: [u8; 32],
    /// X25519(proxy's hello key, this connection's server key).
    pub sess_secret: [u8; 32],
    /// The proxy connection's session at the forwarded version: the same connection, session ID and
    /// server key (the client signed with the proxy↔relay session ID implied).
    pub inner: Session,
}

/// Encodes one server transmission for `session` (`protocol::response::encode_response`).
pub fn encode(session: &Session, corr_id: &[u8], entity_id: &[u8], msg: &BrokerMsg) -> Vec<u8> {
    encode_response(
        session.version,
        &session.session_id,
        corr_id,
        entity_id,
        msg,
    )
}

/// A service and the role it subscribes in.
pub type ServiceKey = (EntityId, ServiceRole);

/// A count of queues and their ID hash (`protocol::ids_hash`).
pub type CountHash = (i64, [u8; 16]);

/// A connection, named by the shard that holds it and a number unique on that shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRef {
    pub shard: usize,
    pub id: u64,
}

/// What an owner needs of a connection's session to verify its commands and encode for it.
pub struct SessionInfo {
    pub conn: ConnRef,
    pub version: Version,
    pub session_id: Vec<u8>,
    /// The connection's X25519 key: X25519 authenticators are checked with it.
    pub server_key: StaticSecret,
    /// Set when the client is a service (its handshake carried a certificate and a role).
    pub service: Option<ServiceSession>,
}

/// A service session's identity (simplexmq `Transport.hs`, `THClientService`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSession {
    pub service_id: EntityId,
    pub role: ServiceRole,
    /// SHA-256 of the identity certificate: queue keys sign it ahead of what they authorize in
    /// NEW, SUB and NSUB.
    pub cert_hash: [u8; 32],
    /// The per-connection Ed25519 key the service signs with.
    pub key: [u8; 32],
}

/// What the connection found of a request's service signature and its sender's role; the owner
/// answers it after the queue lookup, as the reference does (simplexmq `Server.hs`,
/// `verifyTransmission`: the lookup, `checkRole`, then `verifyServiceSig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceCheck {
    /// No service signature, and none is needed.
    Plain,
    /// NEW, SUB or NSUB of a service session with a valid service signature: the queue key is
    /// checked over the certificate hash and the authorized bytes (`Request::authorized` holds both).
    Signed,
    /// `ERR SERVICE`: a signature where none may be, none where one must be, or a wrong one.
    Refused,
    /// `ERR CMD PROHIBITED`: the service's role may not send this command.
    Prohibited,
}

pub type Session = Arc<SessionInfo>;

/// One transmission on its way to its queue's owner, parsed and shape-checked by the connection.
pub struct Request {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    /// The recipient ID the entity resolved to; `None` when no queue has that ID (the owner then
    /// dummy-verifies and answers AUTH, so both AUTH paths cost the same).
    pub recipient_id: Option<EntityId>,
    pub command: Command,
    pub authorization: Vec<u8>,
    pub service: ServiceCheck,
    /// The bytes the authorization covers, session ID included.
    pub authorized: Vec<u8>,
    /// Set when this request arrived inside an `RFWD` (private routing): it runs in the forwarded
    /// session and its answer is sealed into `RRES` (`commands/forward.rs`).
    pub forward: Option<Box<Forwarded>>,
    /// The Ed25519 key this request's signature was verified with in its block's batch
    /// (`Owner::batch_verify`); set only by the owner, before execution.
    pub batch_verified: Option<[u8; 32]>,
    /// For a SUB whose block part could not be batch-verified: the outcome of verifying it before
    /// the part's heads are read, so that a wrong key causes no store read (as an unknown queue).
    /// Set only by the owner, and only for parts whose recipient keys no request changes.
    pub pre_verified: Option<bool>,
    /// For an ACK: the message the connection dropped unsent for this queue (its output was over
    /// its bound). The reference marks a message delivered only once it is queued for sending, so
    /// an ACK of it is `NO_MSG` and deletes nothing.
    pub undelivered: Option<Delivery>,
    /// For a SUB (NSUB): its queue (notifier) was moved to (or out of) the session's service with
    /// the part's others, in one store call before the part ran (`Owner::associate_part`).
    pub associated: bool,
}

/// A group of encoded transmissions packed into as few blocks as they fit. A MSG delivery is a
/// group of its own and never shares a block (`docs/ARCHITECTURE.md` §3, O4); plain groups the
/// writer finds queued together are merged, in order, so that they share blocks (`conn::coalesce`).
pub struct Group {
    pub transmissions: Vec<Vec<u8>>,
    pub kind: GroupKind,
}

/// What a connection may do with a group it cannot queue now.
pub enum GroupKind {
    /// Answers and events that are queued whatever the bound (the blocks in flight bound answers;
    /// `OUTPUT_HARD_LIMIT_BYTES` bounds events).
    Plain,
    /// One MSG delivery: a connection whose output is over its bound drops the 16 KB transmission
    /// and keeps only this, asking the owner again when it has drained.
    Msg(Delivery),
    /// NMSGs of one notifier. If they cannot be queued (the connection is gone or being closed),
    /// they go back to their owner, which stores them for the next NSUB: a notification is never
    /// dropped unsent.
    Ntfs(NtfReturn),
    /// No transmissions: the owner holds more for this connection (the rest of an NSUB's stored
    /// notifications) and hands the next part when the connection asks, under the same bound.
    More(Pending),
}

impl Group {
    pub fn plain(transmissions: Vec<Vec<u8>>) -> Self {
        Group {
            transmissions,
            kind: GroupKind::Plain,
        }
    }

    pub fn bytes(&self) -> usize {
        self.transmissions.iter().map(|t| t.len()).sum()
    }

    pub fn is_plain(&self) -> bool {
        matches!(self.kind, GroupKind::Plain)
    }
}

/// A message handed to a subscription, named well enough for its owner to hand it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub owner: usize,
    pub recipient_id: EntityId,
    pub msg_id: MsgId,
    /// The subscription it was for: a re-SUB starts a new one, and a stale request is ignored.
    pub epoch: u64,
}

/// Notifications on their way to a notifier's subscriber, kept so that they can be stored again.
pub struct NtfReturn {
    pub owner: usize,
    pub notifier_id: EntityId,
    pub ntfs: Vec<MsgNtf>,
}

/// Something a connection holds to ask its owner for when it has room again: a MSG it dropped,
/// or the rest of a notifier's stored notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pending {
    Msg(Delivery),
    Ntfs { owner: usize, notifier_id: EntityId },
}

impl Pending {
    pub fn owner(&self) -> usize {
        match self {
            Pending::Msg(d) => d.owner,
            Pending::Ntfs { owner, .. } => *owner,
        }
    }

    /// At most one pending item per queue and kind: a newer one replaces the older.
    pub fn key(&self) -> (bool, EntityId) {
        match self {
            Pending::Msg(d) => (true, d.recipient_id.clone()),
            Pending::Ntfs { notifier_id, .. } => (false, notifier_id.clone()),
        }
    }
}

/// The answers of every shard to one fanned-out request, folded as they arrive. A new round
/// replaces an unfinished one, and answers of other rounds are ignored, so a shard that never
/// answers (it is stopping) costs one round, not a stuck gatherer.
pub struct Gathering<T> {
    round: u64,
    missing: usize,
    acc: T,
}

impl<T> Gathering<T> {
    pub fn new(round: u64, shards: usize, acc: T) -> Self {
        Gathering {
            round,
            missing: shards,
            acc,
        }
    }

    pub fn round(&self) -> u64 {
        self.round
    }

    /// Folds one answer in; returns the result once every shard has answered.
    pub fn add<P>(mut self, round: u64, part: P, fold: impl FnOnce(&mut T, P)) -> Step<T> {
        if round != self.round {
            return Step::Waiting(self);
        }
        fold(&mut self.acc, part);
        self.missing -= 1;
        if self.missing == 0 {
            Step::Done(self.acc)
        } else {
            Step::Waiting(self)
        }
    }
}

/// What `Gathering::add` left: still waiting, or the folded answers of every shard.
pub enum Step<T> {
    Waiting(Gathering<T>),
    Done(T),
}

pub fn owner_shard(recipient_id: &[u8], shards: usize) -> usize {
    (group_of(recipient_id) as usize) % shards
}

/// The partition groups shard `shard` of `shards` owns.
pub fn groups_of_shard(shard: usize, shards: usize) -> Vec<u32> {
    (0..PARTITION_GROUPS)
        .filter(|g| (*g as usize) % shards == shard)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gathering_completes_after_every_shard_and_ignores_other_rounds() {
        let sum = |acc: &mut u64, p: u64| *acc += p;
        let g = Gathering::new(7, 3, 0u64);
        let Step::Waiting(g) = g.add(7, 1, sum) else {
            panic!("done after one of three")
        };
        // An answer of an older round does not count.
        let Step::Waiting(g) = g.add(6, 100, sum) else {
            panic!("done on a stale answer")
        };
        let Step::Waiting(g) = g.add(7, 2, sum) else {
            panic!("done after two of three")
        };
        assert_eq!(g.round(), 7);
        match g.add(7, 4, sum) {
            Step::Done(total) => assert_eq!(total, 7),
            Step::Waiting(_) => panic!("every shard answered"),
        }
    }

    #[test]
    fn groups_are_spread_and_owned_once() {
        for shards in 1..=5 {
            let mut all: Vec<u32> = (0..shards)
                .flat_map(|s| groups_of_shard(s, shards))
                .collect();
            all.sort_unstable();
            assert_eq!(all, (0..PARTITION_GROUPS).collect::<Vec<_>>());
        }
        let id = [7u8; 24];
        let owner = owner_shard(&id, 3);
        assert!(groups_of_shard(owner, 3).contains(&group_of(&id)));
    }
}
