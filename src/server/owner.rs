//! The owner of a shard's queues: it verifies and executes every command addressed to them, keeps
//! who is subscribed to what, and delivers (`DESIGN.md` §1–3).
//!
//! One owner per shard runs in the shard's single inbox task, so the work of one block is executed
//! from start to end before any other: a SUB's registration and its first-message read happen in the
//! same turn, and no SEND can fall between them (the reference's race, `seeds/002`, test T1). Within a
//! turn requests run in block order. Command semantics live in `commands/`.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use super::directory::Directory;
use super::router::{ConnRef, Delivery, Group, Mesh, Request, Session, ShardMsg};
use crate::config::Settings;
use crate::crypto::auth::{self, Authorization};
use crate::crypto::keys::PublicAuthKey;
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::encode_server_transmission;
use crate::store::{EntityId, MessageStore, MsgId, QueueStore};

/// The SUB-mode subscriber of a queue: at most one connection, with at most one message delivered
/// and not acknowledged.
pub struct Subscriber {
    pub session: Session,
    pub delivered: Option<MsgId>,
    /// Which subscription this is: every SUB starts a new one (see `Delivery`).
    pub epoch: u64,
}

/// What one connection holds on this owner, so that its close drops all of it.
#[derive(Default)]
pub struct ConnEntries {
    pub subs: HashSet<EntityId>,
    pub gets: HashSet<EntityId>,
    pub ntf_subs: HashSet<EntityId>,
}

/// Counters of an owner, exported as metrics.
#[derive(Debug, Default, Clone)]
pub struct OwnerStats {
    pub queues_created: u64,
    pub queues_secured: u64,
    pub queues_deleted: u64,
    pub msg_sent: u64,
    pub msg_sent_auth: u64,
    pub msg_sent_quota: u64,
    pub msg_sent_large: u64,
    /// SENDs refused with `ERR BLOCKED` (the reference's `msgSentBlock`).
    pub msg_sent_block: u64,
    pub msg_recv: u64,
    pub msg_expired: u64,
    pub msg_ntfs: u64,
    pub sub_batches: u64,
    pub subs: u64,
    /// Blocks whose Ed25519 signatures were verified in one batch, and those whose batch failed
    /// (their requests were then verified one by one).
    pub verify_batches: u64,
    pub verify_batch_fallbacks: u64,
}

/// The fewest Ed25519 signatures in a block part worth a batch: below it, single verification.
pub const BATCH_VERIFY_MIN: usize = 2;

/// After a failed batch, a connection's next this many block parts on this owner verify one by one,
/// so a client that keeps sending bad signatures costs no more than unbatched verification.
pub const BATCH_OFF_BLOCKS: u32 = 64;

/// The same guard shard-wide, against bad signatures from ever new connections: a failed batch adds
/// this to the owner's score and a passed one takes 1 off; over `BATCH_FAIL_LIMIT` the owner verifies
/// one by one for its next `BATCH_OFF_BLOCKS` block parts. If every batch fails, that is 9 failed
/// batches (each ~0.4 of its signatures' unbatched cost) per 73 parts: ~5% over unbatched. Honest
/// traffic only gets there when more than 1 batch in 9 fails.
pub const BATCH_FAIL_WEIGHT: u32 = 8;
pub const BATCH_FAIL_LIMIT: u32 = 64;

/// Whether a test build moves SUB registration after the first-message read (`t1-race-variant`),
/// to prove that the race test can fail.
pub const T1_RACE_VARIANT: bool = cfg!(feature = "t1-race-variant");

/// How late the `t1-race-variant` registers a SUB (the reference's subscriber thread lags likewise).
pub const T1_VARIANT_DELAY: std::time::Duration = std::time::Duration::from_millis(1000);

pub struct Owner<S> {
    pub shard: usize,
    pub store: S,
    pub directory: Arc<Directory>,
    pub mesh: Mesh,
    pub settings: Rc<Settings>,
    pub subs: HashMap<EntityId, Subscriber>,
    /// GET-mode state per (queue, connection): the message a GET returned and not yet acknowledged.
    pub gets: HashMap<(EntityId, ConnRef), Option<MsgId>>,
    /// Notifier ID → the connection subscribed to its notifications.
    pub ntf_subs: HashMap<EntityId, Session>,
    pub by_conn: HashMap<ConnRef, ConnEntries>,
    pub stats: OwnerStats,
    /// Connections whose recent batch failed: block parts left before they are batched again.
    batch_off: HashMap<ConnRef, u32>,
    /// The shard-wide guard: failure score, and block parts left to verify one by one.
    batch_fail_score: u32,
    batch_off_all: u32,
    /// Source of subscription epochs.
    next_epoch: u64,
}

/// What one owner turn produces for the connection that sent the block, besides events to others.
#[derive(Default)]
pub struct Turn {
    /// Responses, in request order.
    pub responses: Vec<Vec<u8>>,
    /// MSGs that follow a SUB's SOK (same block when the part is small, else one block each).
    pub sub_msgs: Vec<(Vec<u8>, Delivery)>,
    /// MSGs pushed to this same connection by its own SENDs: each a block of its own, before the
    /// responses (cause before effect, O2).
    pub pushes: Vec<Group>,
    /// Events for this connection that follow the responses (notifications waiting for an NSUB).
    pub trailing: Vec<Group>,
    /// Queues changed in this turn: a SUB later in the turn must read their head again.
    pub touched: HashSet<EntityId>,
}

impl<S: QueueStore + MessageStore> Owner<S> {
    pub fn new(
        shard: usize,
        store: S,
        directory: Arc<Directory>,
        mesh: Mesh,
        settings: Rc<Settings>,
    ) -> Self {
        Owner {
            shard,
            store,
            directory,
            mesh,
            settings,
            subs: HashMap::new(),
            gets: HashMap::new(),
            ntf_subs: HashMap::new(),
            by_conn: HashMap::new(),
            stats: OwnerStats::default(),
            batch_off: HashMap::new(),
            batch_fail_score: 0,
            batch_off_all: 0,
            next_epoch: 0,
        }
    }

    /// Executes one block's requests for this owner and sends the connection its part.
    pub async fn process(&mut self, session: Session, block_seq: u64, mut requests: Vec<Request>) {
        let mut turn = Turn::default();
        self.batch_verify(&session, &mut requests);
        let prefetched = self.prefetch_subs(&requests).await;
        let mut prefetched = prefetched;
        for (i, mut req) in requests.into_iter().enumerate() {
            let head = prefetched.remove(&i);
            let corr_id = req.corr_id.clone();
            // A forwarded request (RFWD) runs in the forwarded session and its answer is sealed
            // into RRES for the proxy (`forward.rs`).
            let fwd = req.forward.take();
            let exec_session = fwd.as_ref().map_or(&session, |f| &f.inner);
            let (entity, msg) = self.execute(exec_session, req, head, &mut turn).await;
            turn.responses.push(match fwd {
                Some(f) => super::forward::respond(&session, &f, &corr_id, &entity, &msg),
                None => encode(&session, &corr_id, &entity, &msg),
            });
        }
        // A SUB's first message goes out after the part's responses (O4); a later request of the same
        // turn may have acknowledged it, deleted the queue or subscribed again. Only a delivery that
        // is still its subscription's outstanding one is sent (I4: an ACKed message never again).
        turn.sub_msgs
            .retain(|(_, d)| self.is_outstanding(session.conn, d));
        let groups = pack_turn(turn);
        self.mesh.send(
            session.conn.shard,
            ShardMsg::Reply {
                conn: session.conn,
                block_seq,
                groups,
            },
        );
    }

    /// One `peek_first_many` call for every SUB of the block whose queue exists (DESIGN §2), so that
    /// a block of 135 SUBs costs this owner one store call.
    async fn prefetch_subs(
        &mut self,
        requests: &[Request],
    ) -> HashMap<usize, Option<crate::store::Message>> {
        let subs: Vec<(usize, &[u8])> = requests
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r.command, crate::protocol::command::Command::Sub))
            .filter_map(|(i, r)| {
                r.recipient_id
                    .as_deref()
                    .filter(|rid| self.store.get(rid).is_some())
                    .map(|rid| (i, rid))
            })
            .collect();
        if subs.is_empty() {
            return HashMap::new();
        }
        self.stats.sub_batches += 1;
        let ids: Vec<&[u8]> = subs.iter().map(|(_, rid)| *rid).collect();
        match self.store.peek_first_many(&ids).await {
            Ok(heads) => subs.iter().map(|(i, _)| *i).zip(heads).collect(),
            // Each SUB then reads its own head and reports its own error.
            Err(_) => HashMap::new(),
        }
    }

    /// Verifies the Ed25519 signatures of a block part in one batch (`crypto::ed25519`) before any
    /// request runs, marking each request with the key that verified it; `verify_with` then accepts
    /// that key without a second verification. Which key each request will be checked with is
    /// decided here as its command will decide it; a request whose queue is missing, or whose key is
    /// not Ed25519, joins the batch with the dummy key, so its batch fails exactly as one with a
    /// wrong key does (equal-time AUTH, per block). A failed batch marks nothing: every request is
    /// then verified on its own as without batching, which decides.
    fn batch_verify(&mut self, session: &Session, requests: &mut [Request]) {
        if let Some(left) = self.batch_off.get_mut(&session.conn) {
            *left -= 1;
            if *left == 0 {
                self.batch_off.remove(&session.conn);
            }
            return;
        }
        if self.batch_off_all > 0 {
            self.batch_off_all -= 1;
            return;
        }
        // (request index, key, signature): each request the batch will speak for.
        let mut chosen: Vec<(usize, [u8; 32], [u8; 64])> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            if r.forward.is_some() || r.service_sig {
                continue;
            }
            let Ok(sig) = <[u8; 64]>::try_from(r.authorization.as_slice()) else {
                continue;
            };
            if let Some(key) = self.batch_key(r) {
                chosen.push((i, key, sig));
            }
        }
        if chosen.len() < BATCH_VERIFY_MIN {
            return;
        }
        let items: Vec<crate::crypto::ed25519::Item> = chosen
            .iter()
            .map(|(i, key, sig)| crate::crypto::ed25519::Item {
                key,
                msg: &requests[*i].authorized,
                sig,
            })
            .collect();
        self.stats.verify_batches += 1;
        if auth::ed25519_verify_batch(&items) {
            for (i, key, _) in chosen {
                requests[i].batch_verified = Some(key);
            }
            self.batch_fail_score = self.batch_fail_score.saturating_sub(1);
        } else {
            self.stats.verify_batch_fallbacks += 1;
            self.batch_off.insert(session.conn, BATCH_OFF_BLOCKS);
            self.batch_fail_score += BATCH_FAIL_WEIGHT;
            if self.batch_fail_score > BATCH_FAIL_LIMIT {
                self.batch_fail_score = 0;
                self.batch_off_all = BATCH_OFF_BLOCKS;
            }
        }
    }

    /// The Ed25519 key `r`'s command will verify its signature with (the dummy key when its queue is
    /// missing or the key is of another algorithm), or `None` when the command verifies nothing or
    /// is not batched (NEW, SKEY/LKEY/LGET, SEND to a queue without a sender key).
    fn batch_key(&self, r: &Request) -> Option<[u8; 32]> {
        use crate::protocol::command::{Command, Party};
        let party = r.command.party();
        let batched = match party {
            Party::Recipient | Party::Notifier => true,
            Party::Sender => matches!(r.command, Command::Send { .. }),
            _ => false,
        };
        if !batched {
            return None;
        }
        let dummy = *auth::ed25519_dummy_key();
        let Some(q) = r
            .recipient_id
            .as_deref()
            .and_then(|rid| self.store.get(rid))
        else {
            return Some(dummy);
        };
        let key = match party {
            Party::Sender => Some(q.sender_key.as_ref()?),
            Party::Notifier => q.notifier.as_ref().map(|n| &n.notifier_key),
            _ => q.recipient_keys.first(),
        };
        Some(match key {
            Some(PublicAuthKey::Ed25519(k)) => *k,
            _ => dummy,
        })
    }

    /// Checks `req`'s authorization with `key` (`reference/smp-wire.md` §4.2), or takes its block's
    /// batch verification of that very key.
    pub fn verify_with(&self, session: &Session, req: &Request, key: &PublicAuthKey) -> bool {
        if let (Some(done), PublicAuthKey::Ed25519(k)) = (&req.batch_verified, key) {
            if done == k {
                return true;
            }
        }
        let a = Authorization::from_bytes(&req.authorization).unwrap_or(Authorization::None);
        let sk = session.server_key.to_bytes();
        auth::verify(key, &a, &req.authorized, Some(&sk), &req.corr_id)
    }

    /// A verification against the dummy key of the signature's algorithm, so that AUTH for a missing
    /// queue or key takes as long as AUTH for a wrong signature.
    pub fn dummy_verify(&self, session: &Session, req: &Request) {
        let a = Authorization::from_bytes(&req.authorization).unwrap_or(Authorization::None);
        let sk = session.server_key.to_bytes();
        let _ = auth::dummy_verify(&a, &req.authorized, Some(&sk), &req.corr_id);
    }

    /// Sends groups of transmissions to a connection that is not the one being answered.
    pub fn send_event(&self, conn: ConnRef, groups: Vec<Vec<Vec<u8>>>) {
        let groups = groups.into_iter().map(Group::plain).collect();
        self.mesh.send(conn.shard, ShardMsg::Event { conn, groups });
    }

    /// Sends one MSG delivery to a connection that is not the one being answered.
    pub fn send_delivery(&self, conn: ConnRef, t: Vec<u8>, delivery: Delivery) {
        let groups = vec![Group {
            transmissions: vec![t],
            delivery: Some(delivery),
        }];
        self.mesh.send(conn.shard, ShardMsg::Event { conn, groups });
    }

    /// Whether `d` is still what the subscription of `d.recipient_id` on `conn` waits to have
    /// acknowledged.
    pub fn is_outstanding(&self, conn: ConnRef, d: &Delivery) -> bool {
        self.subs.get(&d.recipient_id).is_some_and(|s| {
            s.session.conn == conn && s.epoch == d.epoch && s.delivered == Some(d.msg_id)
        })
    }

    pub fn new_epoch(&mut self) -> u64 {
        self.next_epoch += 1;
        self.next_epoch
    }

    /// Names a delivery of `msg_id` to the current subscription of `rid`.
    pub fn delivery(&self, rid: &[u8], msg_id: &MsgId) -> Delivery {
        Delivery {
            owner: self.shard,
            recipient_id: rid.to_vec(),
            msg_id: *msg_id,
            epoch: self.subs.get(rid).map_or(0, |s| s.epoch),
        }
    }

    /// A connection's output was over its bound and these deliveries never reached its socket:
    /// hand each queue's head again, if it is still that subscription's outstanding delivery.
    pub async fn redeliver(&mut self, conn: ConnRef, deliveries: Vec<Delivery>) {
        for d in deliveries {
            let rid = d.recipient_id.clone();
            let current = match self.subs.get(&rid) {
                Some(s) => {
                    s.session.conn == conn && s.epoch == d.epoch && s.delivered == Some(d.msg_id)
                }
                None => false,
            };
            if !current {
                continue;
            }
            let head = self.store.peek_first(&rid).await.ok().flatten();
            let Some(secret) = self.store.get(&rid).map(|q| q.rcv_dh_secret) else {
                continue;
            };
            let Some(s) = self.subs.get_mut(&rid) else {
                continue;
            };
            s.delivered = head.as_ref().map(|m| *m.msg_id());
            if let Some(m) = head {
                let session = s.session.clone();
                let t = super::commands::msg_transmission(&session, b"", &rid, &secret, &m);
                let delivery = self.delivery(&rid, m.msg_id());
                self.send_delivery(conn, t, delivery);
            }
        }
    }

    pub fn entries(&mut self, conn: ConnRef) -> &mut ConnEntries {
        self.by_conn.entry(conn).or_default()
    }

    /// The periodic expiration of messages and notifications (`reference/smp-server-behaviour.md`
    /// §4.2). A subscriber whose delivered message expired keeps waiting for its ACK, as in the
    /// reference; the ACK then returns the new head.
    pub async fn expire(&mut self) {
        let now = super::commands::now_secs();
        let old = now - self.settings.message_ttl.as_secs() as i64;
        if let Ok(n) = self.store.expire_all(old).await {
            self.stats.msg_expired += n as u64;
        }
        let old_ntf = now - self.settings.notification_ttl.as_secs() as i64;
        let _ = self.store.expire_ntfs(old_ntf).await;
    }

    /// A connection closed: drop its subscriptions here. Nobody is told (the reference sends no END).
    pub fn connection_closed(&mut self, conn: ConnRef) {
        self.batch_off.remove(&conn);
        let Some(e) = self.by_conn.remove(&conn) else {
            return;
        };
        for rid in e.subs {
            if self.subs.get(&rid).map(|s| s.session.conn) == Some(conn) {
                self.subs.remove(&rid);
            }
        }
        for rid in e.gets {
            self.gets.remove(&(rid, conn));
        }
        for nid in e.ntf_subs {
            if self.ntf_subs.get(&nid).map(|s| s.conn) == Some(conn) {
                self.ntf_subs.remove(&nid);
            }
        }
    }
}

/// Encodes one server transmission for `session`, in one allocation.
pub fn encode(session: &Session, corr_id: &[u8], entity_id: &[u8], msg: &BrokerMsg) -> Vec<u8> {
    let mut t = Vec::with_capacity(
        msg.encoded_len_hint() + session.session_id.len() + corr_id.len() + entity_id.len() + 8,
    );
    encode_server_transmission(
        session.version,
        &session.session_id,
        corr_id,
        entity_id,
        b"",
        &mut t,
    );
    msg.encode(session.version, &mut t);
    t
}

/// The block layout of a turn (`DESIGN.md` O2, O4): pushes first, each alone; then the responses,
/// with the SUBs' first messages in the same group when the part has at most 4 responses, else one
/// block per message after them.
fn pack_turn(turn: Turn) -> Vec<Group> {
    let Turn {
        responses,
        sub_msgs,
        pushes,
        trailing,
        ..
    } = turn;
    let mut groups = pushes;
    if responses.len() <= 4 {
        let mut g = responses;
        g.extend(sub_msgs.into_iter().map(|(m, _)| m));
        if !g.is_empty() {
            groups.push(Group::plain(g));
        }
    } else {
        groups.push(Group::plain(responses));
        groups.extend(sub_msgs.into_iter().map(|(m, d)| Group {
            transmissions: vec![m],
            delivery: Some(d),
        }));
    }
    groups.extend(trailing);
    groups
}

#[cfg(test)]
mod tests {
    //! Equal-time AUTH, asserted structurally (`reference/smp-wire.md` §4.4 step 6): a command for an
    //! unknown queue and one signed with the wrong key each run exactly one verification, with a key
    //! of the signature's algorithm. (The timing comparison itself is a benchmark.)
    use std::rc::Rc;
    use std::sync::Arc;

    use ed25519_dalek::SigningKey;
    use x25519_dalek::StaticSecret;

    use super::*;
    use crate::crypto::auth::{self, verify_count_by_alg, VerifyCounts};
    use crate::protocol::command::Command;
    use crate::protocol::transmission::client_signed_bytes;
    use crate::server::router::{ConnRef, Mesh, Request, SessionInfo};
    use crate::store::memory::MemoryStore;
    use crate::store::{QueueRec, QueueStatus};

    fn owner() -> (Owner<MemoryStore>, Vec<flume::Receiver<ShardMsg>>) {
        let (mesh, inboxes) = Mesh::new(1);
        let o = Owner::new(
            0,
            MemoryStore::new(),
            Directory::new(),
            mesh,
            Rc::new(Settings::default()),
        );
        (o, inboxes)
    }

    fn session() -> Session {
        Arc::new(SessionInfo {
            conn: ConnRef { shard: 0, id: 1 },
            version: 18,
            session_id: vec![7; 32],
            server_key: StaticSecret::from([9u8; 32]),
        })
    }

    fn queue(rid: &[u8], key: PublicAuthKey) -> QueueRec {
        QueueRec {
            recipient_id: rid.to_vec(),
            recipient_keys: vec![key],
            rcv_dh_secret: [1; 32],
            sender_id: vec![2; 24],
            sender_key: None,
            queue_mode: None,
            link: None,
            notifier: None,
            status: QueueStatus::Active,
            updated_at: None,
            rcv_service_id: None,
        }
    }

    /// A SUB for `rid` signed by `signer`.
    fn signed_sub(s: &Session, rid: &[u8], signer: &SigningKey) -> Request {
        let corr = [5u8; 24];
        let signed = client_signed_bytes(s.version, &s.session_id, &corr, rid, b"SUB");
        let sig = auth::sign_ed25519(signer, &signed);
        Request {
            corr_id: corr.to_vec(),
            entity_id: rid.to_vec(),
            recipient_id: Some(rid.to_vec()),
            command: Command::Sub,
            authorization: sig.to_vec(),
            service_sig: false,
            authorized: signed,
            forward: None,
            batch_verified: None,
        }
    }

    fn delta(before: VerifyCounts) -> VerifyCounts {
        let now = verify_count_by_alg();
        VerifyCounts {
            ed25519: now.ed25519 - before.ed25519,
            ed448: now.ed448 - before.ed448,
            x25519: now.x25519 - before.x25519,
        }
    }

    #[test]
    fn unknown_queue_and_wrong_key_each_run_one_verification_of_the_signatures_algorithm() {
        let (mut o, inboxes) = owner();
        let s = session();
        let owner_key = SigningKey::from_bytes(&[3u8; 32]);
        let other_key = SigningKey::from_bytes(&[4u8; 32]);
        let rid = vec![8u8; 24];
        let pk = PublicAuthKey::Ed25519(owner_key.verifying_key().to_bytes());
        futures_lite::future::block_on(o.store.create(queue(&rid, pk))).unwrap();

        let paths = [
            ("wrong key", signed_sub(&s, &rid, &other_key)),
            ("unknown queue", signed_sub(&s, &[6u8; 24], &other_key)),
        ];
        for (path, req) in paths {
            let before = verify_count_by_alg();
            futures_lite::future::block_on(o.process(s.clone(), 1, vec![req]));
            let d = delta(before);
            assert_eq!(
                (d.ed25519, d.ed448, d.x25519),
                (1, 0, 0),
                "{path}: exactly one Ed25519 verification"
            );
            let Ok(ShardMsg::Reply { groups, .. }) = inboxes[0].try_recv() else {
                panic!("{path}: no reply");
            };
            let t = &groups[0].transmissions[0];
            assert!(
                t.ends_with(b"ERR AUTH"),
                "{path}: answered AUTH, got {:?}",
                String::from_utf8_lossy(t)
            );
        }

        // The right key verifies once too, and subscribes.
        let before = verify_count_by_alg();
        futures_lite::future::block_on(o.process(
            s.clone(),
            2,
            vec![signed_sub(&s, &rid, &owner_key)],
        ));
        assert_eq!(delta(before).ed25519, 1);
        assert!(o.subs.contains_key(&rid));
    }

    fn session_on(conn: u64) -> Session {
        let mut s = session();
        Arc::get_mut(&mut s).unwrap().conn = ConnRef { shard: 0, id: conn };
        s
    }

    /// Which requests of a block part were answered AUTH, in order.
    /// (Events to earlier subscribers, ENDs, are skipped.)
    fn auths(inbox: &flume::Receiver<ShardMsg>) -> Vec<bool> {
        let groups = loop {
            match inbox.try_recv() {
                Ok(ShardMsg::Reply { groups, .. }) => break groups,
                Ok(_) => continue,
                Err(_) => panic!("no reply"),
            }
        };
        groups[0]
            .transmissions
            .iter()
            .map(|t| t.ends_with(b"ERR AUTH"))
            .collect()
    }

    /// A block part of several signed SUBs is verified in one batch; a wrong key and a missing queue
    /// each fail the batch alike (same verification counts: equal-time AUTH per block), every
    /// request is then verified alone, and that connection's next parts skip batching.
    #[test]
    fn block_parts_are_batch_verified_and_bad_signatures_fall_back_alike() {
        let (mut o, inboxes) = owner();
        let keys: Vec<SigningKey> = (0..3u8)
            .map(|i| SigningKey::from_bytes(&[20 + i; 32]))
            .collect();
        let rids: Vec<Vec<u8>> = (0..3u8).map(|i| vec![40 + i; 24]).collect();
        for (k, rid) in keys.iter().zip(&rids) {
            let pk = PublicAuthKey::Ed25519(k.verifying_key().to_bytes());
            futures_lite::future::block_on(o.store.create(queue(rid, pk))).unwrap();
        }
        let part = |s: &Session, third: Option<(&[u8], &SigningKey)>| -> Vec<Request> {
            let mut v: Vec<Request> = (0..2).map(|i| signed_sub(s, &rids[i], &keys[i])).collect();
            let (rid, key) = third.unwrap_or((&rids[2], &keys[2]));
            v.push(signed_sub(s, rid, key));
            v
        };

        let s = session_on(10);
        let before = verify_count_by_alg();
        futures_lite::future::block_on(o.process(s.clone(), 1, part(&s, None)));
        assert_eq!(
            delta(before).ed25519,
            3,
            "one batch of three, no single verification"
        );
        assert_eq!(
            (o.stats.verify_batches, o.stats.verify_batch_fallbacks),
            (1, 0)
        );
        assert_eq!(auths(&inboxes[0]), [false, false, false]);
        assert!(rids.iter().all(|r| o.subs.contains_key(r)));

        let wrong_key = SigningKey::from_bytes(&[99; 32]);
        let missing = [77u8; 24];
        for (n, third) in [(&rids[2][..], &wrong_key), (&missing[..], &keys[2])]
            .into_iter()
            .enumerate()
        {
            let s = session_on(20 + n as u64);
            let before = verify_count_by_alg();
            futures_lite::future::block_on(o.process(s.clone(), 1, part(&s, Some(third))));
            assert_eq!(
                delta(before).ed25519,
                6,
                "case {n}: the batch of 3, then 3 single"
            );
            assert_eq!(o.stats.verify_batch_fallbacks, 1 + n as u64);
            assert_eq!(auths(&inboxes[0]), [false, false, true], "case {n}");
            // The same connection's next part: no batch, one verification each.
            let batches = o.stats.verify_batches;
            let before = verify_count_by_alg();
            futures_lite::future::block_on(o.process(s.clone(), 2, part(&s, None)));
            assert_eq!(delta(before).ed25519, 3);
            assert_eq!(o.stats.verify_batches, batches);
            assert_eq!(auths(&inboxes[0]), [false, false, false]);
        }
        // Other connections still batch.
        let s = session_on(30);
        futures_lite::future::block_on(o.process(s.clone(), 1, part(&s, None)));
        assert_eq!(
            (o.stats.verify_batches, o.stats.verify_batch_fallbacks),
            (4, 2)
        );
        assert_eq!(auths(&inboxes[0]), [false, false, false]);
    }

    /// Bad batches from ever new connections turn batching off for the whole owner for a while,
    /// then it comes back.
    #[test]
    fn failing_batches_from_new_connections_turn_batching_off_shard_wide_for_a_while() {
        let (mut o, inboxes) = owner();
        let keys: Vec<SigningKey> = (0..2u8)
            .map(|i| SigningKey::from_bytes(&[60 + i; 32]))
            .collect();
        let rids: Vec<Vec<u8>> = (0..2u8).map(|i| vec![70 + i; 24]).collect();
        for (k, rid) in keys.iter().zip(&rids) {
            let pk = PublicAuthKey::Ed25519(k.verifying_key().to_bytes());
            futures_lite::future::block_on(o.store.create(queue(rid, pk))).unwrap();
        }
        let wrong = SigningKey::from_bytes(&[99; 32]);
        let mut conn = 100;
        let mut part = |o: &mut Owner<MemoryStore>, good: bool| {
            conn += 1;
            let s = session_on(conn);
            let second = if good { &keys[1] } else { &wrong };
            let reqs = vec![
                signed_sub(&s, &rids[0], &keys[0]),
                signed_sub(&s, &rids[1], second),
            ];
            futures_lite::future::block_on(o.process(s, 1, reqs));
            while inboxes[0].try_recv().is_ok() {}
        };
        let failures_to_trip = BATCH_FAIL_LIMIT / BATCH_FAIL_WEIGHT + 1;
        for _ in 0..failures_to_trip {
            part(&mut o, false);
        }
        assert_eq!(o.stats.verify_batch_fallbacks, failures_to_trip as u64);
        let batches = o.stats.verify_batches;
        for _ in 0..BATCH_OFF_BLOCKS {
            part(&mut o, true);
        }
        assert_eq!(
            o.stats.verify_batches, batches,
            "no batch while the guard is on"
        );
        part(&mut o, true);
        assert_eq!(o.stats.verify_batches, batches + 1, "batching is back");
        assert_eq!(o.stats.verify_batch_fallbacks, failures_to_trip as u64);
    }
}
