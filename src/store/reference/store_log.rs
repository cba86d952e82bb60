//! The reference's store log, `smp-server-store.log` (simplexmq `src/Simplex/Messaging/Server/
//! StoreLog.hs`, `StoreLogRecord`; the queue record's text, `QueueRec`'s `strEncode`), and its
//! replay (`StoreLog/ReadWrite.hs`, `readQueueStore`, over `QueueStore/STM.hs`): each line is
//! applied in order; a record the reference's store would refuse (an unknown or deleted queue, a
//! taken ID, another sender key) is ignored with its reason, as the reference logs and ignores it.

use std::collections::{BTreeMap, HashMap};

use super::text::{b64, b64_or_empty, boolean, fixed, int, key, keys, shorten, Fields};
use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::QueueMode;
use crate::protocol::error::{BlockingInfo, BlockingReason};
use crate::store::services::{ServiceRec, ServiceRole};
use crate::store::{EntityId, NotifierCreds, QueueLink, QueueRec, QueueStatus};

/// Which side of a queue a `QUEUE_SERVICE` record (un)associates: its recipient (`R`) or its
/// notifier (`N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceParty {
    Recipient,
    Notifier,
}

/// One line of the store log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogRecord {
    Create(QueueRec),
    Link(EntityId, QueueLink),
    DeleteLink(EntityId),
    Secure(EntityId, PublicAuthKey),
    Keys(EntityId, Vec<PublicAuthKey>),
    Notifier(EntityId, NotifierCreds),
    Suspend(EntityId),
    Block(EntityId, BlockingInfo),
    Unblock(EntityId),
    Delete(EntityId),
    DeleteNotifier(EntityId),
    Time(EntityId, i64),
    NewService(ServiceRec),
    QueueService(EntityId, ServiceParty, Option<EntityId>),
}

/// Parses one line (without its newline).
pub fn parse_line(line: &str) -> Result<LogRecord, String> {
    let mut f = Fields::new(line);
    let tag = f.next("the record's tag")?;
    let rid = |f: &mut Fields<'_>| b64(f.next("the recipient ID")?, "the recipient ID");
    let rec = match tag {
        "CREATE" => {
            let rid = b64(f.named("rid=")?, "rid")?;
            LogRecord::Create(queue_rec(rid, &mut f)?)
        }
        "LINK" => {
            let rid = rid(&mut f)?;
            let link_id = b64(f.next("the link ID")?, "the link ID")?;
            let fixed = b64_or_empty(f.next("the fixed link data")?, "the fixed link data")?;
            let user = b64_or_empty(f.next("the user link data")?, "the user link data")?;
            LogRecord::Link(
                rid,
                QueueLink {
                    link_id,
                    fixed,
                    user,
                },
            )
        }
        "LDELETE" => LogRecord::DeleteLink(rid(&mut f)?),
        "SECURE" => {
            let rid = rid(&mut f)?;
            LogRecord::Secure(rid, key(f.next("the sender key")?, "the sender key")?)
        }
        "KEYS" => {
            let rid = rid(&mut f)?;
            LogRecord::Keys(rid, keys(f.next("the recipient keys")?, "a recipient key")?)
        }
        "NOTIFIER" => {
            let rid = rid(&mut f)?;
            let nid = f.next("the notifier ID")?;
            LogRecord::Notifier(rid, notifier(&mut f, nid)?)
        }
        "SUSPEND" => LogRecord::Suspend(rid(&mut f)?),
        "BLOCK" => {
            let rid = rid(&mut f)?;
            let info = f
                .rest()
                .ok_or("the line ends where the blocking info was expected")?;
            LogRecord::Block(rid, blocking_info(info)?)
        }
        "UNBLOCK" => LogRecord::Unblock(rid(&mut f)?),
        "DELETE" => LogRecord::Delete(rid(&mut f)?),
        "NDELETE" => LogRecord::DeleteNotifier(rid(&mut f)?),
        "TIME" => {
            let rid = rid(&mut f)?;
            LogRecord::Time(rid, int(f.next("the time")?, "the time")?)
        }
        "NEW_SERVICE" => LogRecord::NewService(service(&mut f)?),
        "QUEUE_SERVICE" => {
            let rid = rid(&mut f)?;
            let party = match f.next("the party")? {
                "R" => ServiceParty::Recipient,
                "N" => ServiceParty::Notifier,
                p => return Err(format!("the party is not R or N: {:?}", shorten(p))),
            };
            let id = b64_or_empty(f.next("the service ID")?, "the service ID")?;
            LogRecord::QueueService(rid, party, (!id.is_empty()).then_some(id))
        }
        t => return Err(format!("unknown record {:?}", shorten(t))),
    };
    f.end()?;
    Ok(rec)
}

/// `rk=… rdh=… sid=… sk=…` and the optional fields, in the reference's order.
fn queue_rec(recipient_id: EntityId, f: &mut Fields<'_>) -> Result<QueueRec, String> {
    let recipient_keys = keys(f.named("rk=")?, "a recipient key (rk)")?;
    let rcv_dh_secret = fixed(f.named("rdh=")?, "rdh")?;
    let sender_id = b64(f.named("sid=")?, "sid")?;
    let sk = f.named("sk=")?;
    let sender_key = if sk.is_empty() {
        None
    } else {
        Some(key(sk, "sk")?)
    };
    let queue_mode = if f.at("sndSecure=") {
        // Written before queue modes: a queue the sender may secure is a messaging queue.
        Some(match boolean(f.named("sndSecure=")?, "sndSecure")? {
            true => QueueMode::Messaging,
            false => QueueMode::Contact,
        })
    } else if f.at("queue_mode=") {
        Some(match f.named("queue_mode=")? {
            "M" => QueueMode::Messaging,
            "C" => QueueMode::Contact,
            m => return Err(format!("queue_mode is not M or C: {:?}", shorten(m))),
        })
    } else {
        None
    };
    let link = if f.at("link_id=") {
        let link_id = b64(f.named("link_id=")?, "link_id")?;
        let fixed = b64_or_empty(f.named("queue_data=")?, "queue_data")?;
        let user = b64_or_empty(f.next("the user link data")?, "the user link data")?;
        Some(Box::new(QueueLink {
            link_id,
            fixed,
            user,
        }))
    } else {
        None
    };
    let notifier = if f.at("notifier=") {
        let nid = f.named("notifier=")?;
        Some(Box::new(notifier(f, nid)?))
    } else {
        None
    };
    let updated_at = if f.at("updated_at=") {
        Some(int(f.named("updated_at=")?, "updated_at")?)
    } else {
        None
    };
    let mut rcv_service_id = None;
    let status = if f.at("status=") {
        let rest = f.rest().unwrap_or_default();
        let value = &rest["status=".len()..];
        match value.split_once(' ') {
            _ if value.starts_with("blocked,") => {
                // The notice is JSON and takes the rest of the line (`BlockingInfo`'s parser). The
                // reference writes ` rsrv=` after it, which its own parser then cannot read; that
                // service ID is taken off the end here so that the queue is not lost.
                let info = &value["blocked,".len()..];
                let (info, rsrv) = match info.rsplit_once(" rsrv=") {
                    Some((i, s)) if blocking_info(info).is_err() => (i, Some(s)),
                    _ => (info, None),
                };
                rcv_service_id = rsrv.map(|s| b64(s, "rsrv")).transpose()?;
                QueueStatus::Blocked(blocking_info(info)?)
            }
            Some((v, after)) => {
                *f = Fields::new(after);
                simple_status(v)?
            }
            None => simple_status(value)?,
        }
    } else {
        QueueStatus::Active
    };
    if f.at("rsrv=") {
        rcv_service_id = Some(b64(f.named("rsrv=")?, "rsrv")?);
    }
    Ok(QueueRec {
        recipient_id,
        recipient_keys,
        rcv_dh_secret,
        sender_id,
        sender_key,
        queue_mode,
        link,
        notifier,
        status,
        updated_at,
        rcv_service_id,
    })
}

fn simple_status(v: &str) -> Result<QueueStatus, String> {
    match v {
        "active" => Ok(QueueStatus::Active),
        "off" => Ok(QueueStatus::Off),
        _ => Err(format!("unknown status {:?}", shorten(v))),
    }
}

/// `<nId> <notifierKey> <rcvNtfDhSecret>[ nsrv=<serviceId>]`, the notifier ID already taken.
fn notifier(f: &mut Fields<'_>, nid: &str) -> Result<NotifierCreds, String> {
    let notifier_id = b64(nid, "the notifier ID")?;
    let notifier_key = key(f.next("the notifier key")?, "the notifier key")?;
    let rcv_ntf_dh_secret = fixed(
        f.next("the notifier's DH secret")?,
        "the notifier's DH secret",
    )?;
    let ntf_service_id = if f.at("nsrv=") {
        Some(b64(f.named("nsrv=")?, "nsrv")?)
    } else {
        None
    };
    Ok(NotifierCreds {
        notifier_id,
        notifier_key,
        rcv_ntf_dh_secret,
        ntf_service_id,
    })
}

/// `reason=spam|content[,notice=<JSON>]` (simplexmq `Protocol.hs`, `BlockingInfo`).
fn blocking_info(s: &str) -> Result<BlockingInfo, String> {
    let rest = s
        .strip_prefix("reason=")
        .ok_or_else(|| format!("expected `reason=`, found {:?}", shorten(s)))?;
    let (reason, rest) = if let Some(r) = rest.strip_prefix("spam") {
        (BlockingReason::Spam, r)
    } else if let Some(r) = rest.strip_prefix("content") {
        (BlockingReason::Content, r)
    } else {
        return Err(format!("unknown blocking reason {:?}", shorten(rest)));
    };
    let notice = match rest {
        "" => None,
        r => {
            let json = r
                .strip_prefix(",notice=")
                .ok_or_else(|| format!("unexpected text after the reason: {:?}", shorten(r)))?;
            serde_json::from_str::<serde_json::Value>(json)
                .map_err(|e| format!("the notice is not JSON ({e})"))?;
            Some(json.trim_end().to_string())
        }
    };
    Ok(BlockingInfo { reason, notice })
}

/// `service_id=… role=M|N|P cert=<der,…> cert_hash=… created_at=…`
fn service(f: &mut Fields<'_>) -> Result<ServiceRec, String> {
    let service_id = b64(f.named("service_id=")?, "service_id")?;
    let role = f.named("role=")?;
    let role = match role.as_bytes() {
        [b] => ServiceRole::from_byte(*b),
        _ => None,
    }
    .ok_or_else(|| format!("role is not M, N or P: {:?}", shorten(role)))?;
    let certs = f
        .named("cert=")?
        .split(',')
        .map(|c| b64(c, "a certificate"))
        .collect::<Result<Vec<_>, _>>()?;
    if certs.len() > 255 || certs.iter().any(|c| c.len() > u16::MAX as usize) {
        return Err("the certificate chain is too long".into());
    }
    let mut cert_chain = Vec::new();
    crate::protocol::handshake::encode_chain(&certs, &mut cert_chain);
    let cert_hash = fixed(f.named("cert_hash=")?, "cert_hash")?;
    let created_at = int(f.named("created_at=")?, "created_at")?;
    Ok(ServiceRec {
        service_id,
        role,
        cert_chain,
        cert_hash,
        created_at,
    })
}

/// The reference's in-memory queue store as the log builds it.
#[derive(Default)]
pub struct Replay {
    /// `None`: deleted. The reference keeps deleted queues (and their link IDs) until its next
    /// start, so a later record cannot reuse their IDs.
    queues: BTreeMap<EntityId, Option<QueueRec>>,
    senders: HashMap<EntityId, EntityId>,
    notifiers: HashMap<EntityId, EntityId>,
    links: HashMap<EntityId, EntityId>,
    services: BTreeMap<EntityId, ServiceRec>,
    by_cert: HashMap<[u8; 32], EntityId>,
}

impl Replay {
    /// Applies one record as the reference's store does; `Err` is why it was ignored.
    pub fn apply(&mut self, rec: LogRecord) -> Result<(), String> {
        match rec {
            LogRecord::Create(q) => self.create(q),
            LogRecord::Link(rid, link) => {
                let links = &mut self.links;
                let q = live(&mut self.queues, &rid)?;
                match &q.link {
                    Some(l) if l.link_id != link.link_id || l.fixed != link.fixed => {
                        return Err("the queue has other link data (AUTH)".into())
                    }
                    _ => {}
                }
                if links.get(&link.link_id).is_some_and(|r| *r != rid) {
                    return Err("the link ID belongs to another queue (AUTH)".into());
                }
                links.insert(link.link_id.clone(), rid);
                q.link = Some(Box::new(link));
                Ok(())
            }
            LogRecord::DeleteLink(rid) => {
                let q = live(&mut self.queues, &rid)?;
                if let Some(l) = q.link.take() {
                    self.links.remove(&l.link_id);
                }
                Ok(())
            }
            LogRecord::Secure(rid, k) => {
                let q = live(&mut self.queues, &rid)?;
                match &q.sender_key {
                    Some(old) if *old != k => Err("the queue has another sender key (AUTH)".into()),
                    _ => {
                        q.sender_key = Some(k);
                        Ok(())
                    }
                }
            }
            LogRecord::Keys(rid, ks) => {
                live(&mut self.queues, &rid)?.recipient_keys = ks;
                Ok(())
            }
            LogRecord::Notifier(rid, n) => {
                let notifiers = &mut self.notifiers;
                let q = live(&mut self.queues, &rid)?;
                if notifiers.contains_key(&n.notifier_id) {
                    return Err("the notifier ID is taken (DUPLICATE)".into());
                }
                if let Some(old) = q.notifier.take() {
                    notifiers.remove(&old.notifier_id);
                }
                notifiers.insert(n.notifier_id.clone(), rid);
                q.notifier = Some(Box::new(n));
                Ok(())
            }
            LogRecord::DeleteNotifier(rid) => {
                let q = live(&mut self.queues, &rid)?;
                if let Some(old) = q.notifier.take() {
                    self.notifiers.remove(&old.notifier_id);
                }
                Ok(())
            }
            LogRecord::Suspend(rid) => self.status(&rid, QueueStatus::Off),
            LogRecord::Block(rid, info) => self.status(&rid, QueueStatus::Blocked(info)),
            LogRecord::Unblock(rid) => self.status(&rid, QueueStatus::Active),
            LogRecord::Delete(rid) => {
                let q = live(&mut self.queues, &rid)?;
                let q = q.clone();
                self.senders.remove(&q.sender_id);
                if let Some(n) = &q.notifier {
                    self.notifiers.remove(&n.notifier_id);
                }
                self.queues.insert(rid, None);
                Ok(())
            }
            LogRecord::Time(rid, t) => {
                live(&mut self.queues, &rid)?.updated_at = Some(t);
                Ok(())
            }
            LogRecord::NewService(s) => self.new_service(s),
            LogRecord::QueueService(rid, party, id) => {
                let q = live(&mut self.queues, &rid)?;
                match party {
                    ServiceParty::Recipient => q.rcv_service_id = id,
                    ServiceParty::Notifier => match q.notifier.as_mut() {
                        Some(n) => n.ntf_service_id = id,
                        None => return Err("the queue has no notifier (AUTH)".into()),
                    },
                }
                Ok(())
            }
        }
    }

    fn create(&mut self, q: QueueRec) -> Result<(), String> {
        let taken = self.queues.contains_key(&q.recipient_id)
            || self.senders.contains_key(&q.sender_id)
            || q.notifier
                .as_ref()
                .is_some_and(|n| self.notifiers.contains_key(&n.notifier_id))
            || q.link
                .as_ref()
                .is_some_and(|l| self.links.contains_key(&l.link_id));
        if taken {
            return Err("one of its IDs is taken (DUPLICATE)".into());
        }
        let rid = q.recipient_id.clone();
        self.senders.insert(q.sender_id.clone(), rid.clone());
        if let Some(n) = &q.notifier {
            self.notifiers.insert(n.notifier_id.clone(), rid.clone());
        }
        if let Some(l) = &q.link {
            self.links.insert(l.link_id.clone(), rid.clone());
        }
        self.queues.insert(rid, Some(q));
        Ok(())
    }

    fn status(&mut self, rid: &[u8], status: QueueStatus) -> Result<(), String> {
        live(&mut self.queues, rid)?.status = status;
        Ok(())
    }

    /// As the reference's `getCreateService`: a known certificate keeps its service (and its ID).
    fn new_service(&mut self, s: ServiceRec) -> Result<(), String> {
        if let Some(id) = self.by_cert.get(&s.cert_hash) {
            let known = &self.services[id];
            return if known.role != s.role {
                Err("its certificate is known with another role (SERVICE)".into())
            } else if known.service_id != s.service_id {
                Err(format!(
                    "its certificate is known as the service {}",
                    crate::crypto::hash::b64url(&known.service_id)
                ))
            } else {
                Ok(())
            };
        }
        if self.services.contains_key(&s.service_id) {
            return Err("the service ID is taken (DUPLICATE)".into());
        }
        self.by_cert.insert(s.cert_hash, s.service_id.clone());
        self.services.insert(s.service_id.clone(), s);
        Ok(())
    }

    /// The services (in the order of their IDs) and the live queues (in the order of their
    /// recipient IDs).
    pub fn finish(self) -> (Vec<ServiceRec>, Vec<QueueRec>) {
        (
            self.services.into_values().collect(),
            self.queues.into_values().flatten().collect(),
        )
    }
}

/// The live record of `rid`, or why a record for it is ignored.
fn live<'a>(
    queues: &'a mut BTreeMap<EntityId, Option<QueueRec>>,
    rid: &[u8],
) -> Result<&'a mut QueueRec, String> {
    match queues.get_mut(rid) {
        None => Err("no such queue (AUTH)".into()),
        Some(None) => Err("the queue was already deleted".into()),
        Some(Some(q)) => Ok(q),
    }
}

// ---- writing (the reference's compacted form: `NEW_SERVICE` and `CREATE` lines) ----

fn b64w(b: &[u8]) -> String {
    crate::crypto::hash::b64url(b)
}

/// The `CREATE` line of a queue, as the reference's compaction writes it (`QueueRec`'s
/// `strEncode`).
pub fn encode_create(q: &QueueRec) -> String {
    let mut s = format!("CREATE rid={} rk=", b64w(&q.recipient_id));
    let keys: Vec<String> = q
        .recipient_keys
        .iter()
        .map(|k| b64w(&k.to_spki()))
        .collect();
    s.push_str(&keys.join(","));
    s.push_str(&format!(
        " rdh={} sid={} sk={}",
        b64w(&q.rcv_dh_secret),
        b64w(&q.sender_id),
        q.sender_key
            .as_ref()
            .map(|k| b64w(&k.to_spki()))
            .unwrap_or_default()
    ));
    match q.queue_mode {
        Some(QueueMode::Messaging) => s.push_str(" queue_mode=M"),
        Some(QueueMode::Contact) => s.push_str(" queue_mode=C"),
        None => {}
    }
    if let Some(l) = &q.link {
        s.push_str(&format!(
            " link_id={} queue_data={} {}",
            b64w(&l.link_id),
            b64w(&l.fixed),
            b64w(&l.user)
        ));
    }
    if let Some(n) = &q.notifier {
        s.push_str(" notifier=");
        s.push_str(&encode_notifier(n));
    }
    if let Some(t) = q.updated_at {
        s.push_str(&format!(" updated_at={t}"));
    }
    match &q.status {
        QueueStatus::Active => {}
        QueueStatus::Off => s.push_str(" status=off"),
        QueueStatus::Blocked(info) => {
            let mut b = Vec::new();
            info.encode(&mut b);
            s.push_str(" status=blocked,");
            s.push_str(&String::from_utf8_lossy(&b));
        }
    }
    if let Some(id) = &q.rcv_service_id {
        s.push_str(&format!(" rsrv={}", b64w(id)));
    }
    s
}

/// `<nId> <notifierKey> <rcvNtfDhSecret>[ nsrv=<serviceId>]`
pub fn encode_notifier(n: &NotifierCreds) -> String {
    let mut s = format!(
        "{} {} {}",
        b64w(&n.notifier_id),
        b64w(&n.notifier_key.to_spki()),
        b64w(&n.rcv_ntf_dh_secret)
    );
    if let Some(id) = &n.ntf_service_id {
        s.push_str(&format!(" nsrv={}", b64w(id)));
    }
    s
}

/// The `NEW_SERVICE` line of a service; `None` if its chain is not one this relay stored.
pub fn encode_service(r: &ServiceRec) -> Option<String> {
    let mut rd = crate::protocol::encoding::Reader::new(&r.cert_chain);
    let chain = crate::protocol::handshake::read_chain(&mut rd).ok()?;
    rd.end().ok()?;
    let certs: Vec<String> = chain.iter().map(|c| b64w(c)).collect();
    Some(format!(
        "NEW_SERVICE service_id={} role={} cert={} cert_hash={} created_at={}",
        b64w(&r.service_id),
        char::from(r.role.byte()),
        certs.join(","),
        b64w(&r.cert_hash),
        r.created_at
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(b: u8) -> PublicAuthKey {
        PublicAuthKey::Ed25519([b; 32])
    }

    fn kt(b: u8) -> String {
        b64w(&k(b).to_spki())
    }

    fn queue(rid: &[u8], mode: Option<QueueMode>) -> QueueRec {
        QueueRec {
            recipient_id: rid.to_vec(),
            recipient_keys: vec![k(1)],
            rcv_dh_secret: [2; 32],
            sender_id: [rid, b"-s"].concat(),
            sender_key: None,
            queue_mode: mode,
            link: None,
            notifier: None,
            status: QueueStatus::Active,
            updated_at: None,
            rcv_service_id: None,
        }
    }

    fn link() -> QueueLink {
        QueueLink {
            link_id: vec![9; 24],
            fixed: b"fixed data".to_vec(),
            user: b"user data".to_vec(),
        }
    }

    fn ntf() -> NotifierCreds {
        NotifierCreds {
            notifier_id: b"ijkl".to_vec(),
            notifier_key: PublicAuthKey::X25519([5; 32]),
            rcv_ntf_dh_secret: [6; 32],
            ntf_service_id: None,
        }
    }

    fn service() -> ServiceRec {
        let mut cert_chain = Vec::new();
        crate::protocol::handshake::encode_chain(
            &[vec![0x30, 1, 2], vec![0x30, 3]],
            &mut cert_chain,
        );
        ServiceRec {
            service_id: vec![4; 24],
            role: ServiceRole::Notifier,
            cert_chain,
            cert_hash: [8; 32],
            created_at: 1_700_006_400,
        }
    }

    /// Replays `lines`; returns the live queues and every ignored record's reason.
    fn replay(lines: &[String]) -> (Vec<ServiceRec>, Vec<QueueRec>, Vec<String>) {
        let mut r = Replay::default();
        let mut ignored = Vec::new();
        for l in lines {
            let rec = parse_line(l).unwrap_or_else(|e| panic!("{l}: {e}"));
            if let Err(e) = r.apply(rec) {
                ignored.push(e);
            }
        }
        let (s, q) = r.finish();
        (s, q, ignored)
    }

    /// The scenarios of the reference's `tests/CoreTests/StoreLogTests.hs`, for both queue modes:
    /// the saved records, and the queues the replay gives.
    #[test]
    fn the_reference_store_log_scenarios() {
        for mode in [QueueMode::Messaging, QueueMode::Contact] {
            let q = queue(b"rid-1", Some(mode));
            let with_link = QueueRec {
                link: Some(Box::new(link())),
                ..queue(b"rid-2", Some(mode))
            };
            let l = link();
            let svc = service();
            let rid = b64w(b"rid-1");
            let rid2 = b64w(b"rid-2");
            let create = encode_create(&q);
            let create2 = encode_create(&with_link);
            let create2_bare = encode_create(&QueueRec {
                link: None,
                ..with_link.clone()
            });
            let nline = format!("NOTIFIER {rid} {}", encode_notifier(&ntf()));
            let cases: Vec<(&str, Vec<String>, Vec<QueueRec>)> = vec![
                ("create new queue", vec![create.clone()], vec![q.clone()]),
                (
                    "create new queue with link data",
                    vec![create2.clone()],
                    vec![with_link.clone()],
                ),
                (
                    "create new queue, add link data",
                    vec![
                        create2_bare,
                        format!(
                            "LINK {rid2} {} {} {}",
                            b64w(&l.link_id),
                            b64w(&l.fixed),
                            b64w(&l.user)
                        ),
                    ],
                    vec![with_link.clone()],
                ),
                (
                    "create new queue with link data, delete data",
                    vec![create2.clone(), format!("LDELETE {rid2}")],
                    vec![QueueRec {
                        link: None,
                        ..with_link.clone()
                    }],
                ),
                (
                    "secure queue",
                    vec![create.clone(), format!("SECURE {rid} {}", kt(3))],
                    vec![QueueRec {
                        sender_key: Some(k(3)),
                        ..q.clone()
                    }],
                ),
                (
                    "create and delete queue",
                    vec![create.clone(), format!("DELETE {rid}")],
                    vec![],
                ),
                (
                    "create queue and add notifier",
                    vec![create.clone(), nline.clone()],
                    vec![QueueRec {
                        notifier: Some(Box::new(ntf())),
                        ..q.clone()
                    }],
                ),
                (
                    "create queue, add notifier, register and associate notification service",
                    vec![
                        create.clone(),
                        nline.clone(),
                        encode_service(&svc).unwrap(),
                        format!("QUEUE_SERVICE {rid} N {}", b64w(&svc.service_id)),
                    ],
                    vec![QueueRec {
                        notifier: Some(Box::new(NotifierCreds {
                            ntf_service_id: Some(svc.service_id.clone()),
                            ..ntf()
                        })),
                        ..q.clone()
                    }],
                ),
                (
                    "delete notifier",
                    vec![create.clone(), nline.clone(), format!("NDELETE {rid}")],
                    vec![q.clone()],
                ),
                (
                    "update time",
                    vec![create.clone(), format!("TIME {rid} 1700006400")],
                    vec![QueueRec {
                        updated_at: Some(1_700_006_400),
                        ..q.clone()
                    }],
                ),
                (
                    "update recipient keys",
                    vec![create.clone(), format!("KEYS {rid} {},{}", kt(7), kt(8))],
                    vec![QueueRec {
                        recipient_keys: vec![k(7), k(8)],
                        ..q.clone()
                    }],
                ),
            ];
            for (name, lines, want) in cases {
                let (_, got, ignored) = replay(&lines);
                assert_eq!(got, want, "{mode:?}: {name}");
                assert!(ignored.is_empty(), "{mode:?}: {name}: {ignored:?}");
                // The compacted form (CREATE lines) replays to the same queues.
                let compacted: Vec<String> = got.iter().map(encode_create).collect();
                let (_, again, _) = replay(&compacted);
                assert_eq!(again, want, "{mode:?}: {name}, compacted");
            }
        }
    }

    /// A CREATE line with every optional field, written out byte by byte.
    #[test]
    fn a_create_line_with_every_field() {
        let line = format!(
            "CREATE rid=cmlk rk={},{} rdh={} sid=c2lk sk={} queue_mode=C link_id=bG5r \
             queue_data=Zml4 dXNy notifier=bmlk {} {} nsrv=bnNydg== updated_at=1700006400 \
             status=off rsrv=cnNydg==",
            kt(1),
            kt(2),
            b64w(&[2; 32]),
            kt(3),
            b64w(&PublicAuthKey::X25519([5; 32]).to_spki()),
            b64w(&[6; 32]),
        );
        let LogRecord::Create(q) = parse_line(&line).unwrap() else {
            panic!("not a CREATE")
        };
        assert_eq!(
            q,
            QueueRec {
                recipient_id: b"rid".to_vec(),
                recipient_keys: vec![k(1), k(2)],
                rcv_dh_secret: [2; 32],
                sender_id: b"sid".to_vec(),
                sender_key: Some(k(3)),
                queue_mode: Some(QueueMode::Contact),
                link: Some(Box::new(QueueLink {
                    link_id: b"lnk".to_vec(),
                    fixed: b"fix".to_vec(),
                    user: b"usr".to_vec(),
                })),
                notifier: Some(Box::new(NotifierCreds {
                    notifier_id: b"nid".to_vec(),
                    notifier_key: PublicAuthKey::X25519([5; 32]),
                    rcv_ntf_dh_secret: [6; 32],
                    ntf_service_id: Some(b"nsrv".to_vec()),
                })),
                status: QueueStatus::Off,
                updated_at: Some(1_700_006_400),
                rcv_service_id: Some(b"rsrv".to_vec()),
            }
        );
        assert_eq!(encode_create(&q), line);
    }

    #[test]
    fn legacy_modes_blocked_queues_and_statuses() {
        let base = format!(
            "CREATE rid=cmlk rk={} rdh={} sid=c2lk sk=",
            kt(1),
            b64w(&[2; 32])
        );
        let rec = |extra: &str| match parse_line(&format!("{base}{extra}")) {
            Ok(LogRecord::Create(q)) => q,
            other => panic!("{extra}: {other:?}"),
        };
        assert_eq!(rec("").queue_mode, None, "a legacy queue without a mode");
        assert_eq!(rec(" sndSecure=T").queue_mode, Some(QueueMode::Messaging));
        assert_eq!(rec(" sndSecure=F").queue_mode, Some(QueueMode::Contact));
        let blocked = rec(" status=blocked,reason=spam,notice={\"ttl\":3600,\"m\":\"a b\"}");
        assert_eq!(
            blocked.status,
            QueueStatus::Blocked(BlockingInfo {
                reason: BlockingReason::Spam,
                notice: Some("{\"ttl\":3600,\"m\":\"a b\"}".into()),
            })
        );
        // The reference writes rsrv after the notice; its parser cannot read that back, this one
        // keeps both.
        let both = rec(" status=blocked,reason=content,notice={\"ttl\":1} rsrv=cnNydg");
        assert_eq!(both.rcv_service_id, Some(b"rsrv".to_vec()));
        assert!(
            matches!(both.status, QueueStatus::Blocked(BlockingInfo { reason: BlockingReason::Content, notice: Some(ref n) }) if n == "{\"ttl\":1}")
        );
        let plain = rec(" status=blocked,reason=spam rsrv=cnNydg");
        assert_eq!(plain.rcv_service_id, Some(b"rsrv".to_vec()));

        let rid = b64w(b"rid");
        let lines = vec![
            format!("{base} queue_mode=M"),
            format!("BLOCK {rid} reason=content,notice={{\"ttl\":60}}"),
        ];
        let (_, q, _) = replay(&lines);
        assert!(matches!(q[0].status, QueueStatus::Blocked(_)));
        let (_, q, _) = replay(&[lines.clone(), vec![format!("UNBLOCK {rid}")]].concat());
        assert_eq!(q[0].status, QueueStatus::Active);
        let (_, q, _) = replay(&[lines, vec![format!("SUSPEND {rid}")]].concat());
        assert_eq!(q[0].status, QueueStatus::Off);
    }

    /// Records the reference's store refuses are ignored with the reason it would log.
    #[test]
    fn records_for_unknown_or_deleted_queues_and_taken_ids_are_ignored() {
        let q = queue(b"rid", Some(QueueMode::Messaging));
        let rid = b64w(b"rid");
        let (_, got, ignored) = replay(&[
            format!("SECURE {} {}", b64w(b"nope"), kt(3)),
            encode_create(&q),
            format!("SECURE {rid} {}", kt(3)),
            format!("SECURE {rid} {}", kt(4)),
            encode_create(&QueueRec {
                recipient_id: b"other".to_vec(),
                ..q.clone()
            }),
            format!("QUEUE_SERVICE {rid} N "),
            format!("DELETE {rid}"),
            format!("TIME {rid} 1"),
            encode_create(&q),
        ]);
        assert_eq!(
            got,
            vec![],
            "a deleted queue's ID is not reused before a restart"
        );
        assert_eq!(
            ignored,
            vec![
                "no such queue (AUTH)",
                "the queue has another sender key (AUTH)",
                "one of its IDs is taken (DUPLICATE)",
                "the queue has no notifier (AUTH)",
                "the queue was already deleted",
                "one of its IDs is taken (DUPLICATE)",
            ]
        );
        // QUEUE_SERVICE with an empty service ID dissociates.
        let (_, got, _) = replay(&[
            encode_create(&QueueRec {
                rcv_service_id: Some(vec![1; 24]),
                ..q.clone()
            }),
            format!("QUEUE_SERVICE {rid} R "),
        ]);
        assert_eq!(got[0].rcv_service_id, None);
    }

    #[test]
    fn services_keep_their_ids() {
        let s = service();
        let line = encode_service(&s).unwrap();
        assert_eq!(
            line,
            format!(
                "NEW_SERVICE service_id={} role=N cert=MAEC,MAM= cert_hash={} created_at=1700006400",
                b64w(&[4; 24]),
                b64w(&[8; 32])
            )
        );
        let again = ServiceRec {
            service_id: vec![5; 24],
            ..s.clone()
        };
        let (services, _, ignored) = replay(&[line, encode_service(&again).unwrap()]);
        assert_eq!(services, vec![s]);
        assert_eq!(ignored.len(), 1);
        assert!(ignored[0].contains("known as the service"), "{ignored:?}");
    }

    #[test]
    fn unparseable_lines_say_why() {
        for (line, why) in [
            ("FOO x", "unknown record"),
            ("CREATE rid=cmlk", "`rk=`"),
            ("SECURE cmlk !!", "not base64url"),
            ("TIME cmlk soon", "not a number"),
            ("QUEUE_SERVICE cmlk X ", "not R or N"),
            ("DELETE cmlk extra", "unexpected text"),
            ("BLOCK cmlk reason=spam,notice={", "not JSON"),
        ] {
            let e = parse_line(line).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
    }
}
