//! Saving a shard's memory store at a clean stop and restoring it at start, one file per partition
//! group (`<dir>/group-NN.bin`), so that a restart keeps queues, messages and notifications and the
//! core count may change in between. Also the offline edit behind `block`/`unblock` on a stopped relay.
//!
//! File layout (all integers big-endian):
//!
//! ```text
//! magic "SMPRMEM\0" (8) | version u16 = 1 | group u16 | payload length u64 | payload | SHA-256 (32)
//! payload  = queue count u32, then per queue:
//!   record   = bytes rId | u32 n, n × bytes SPKI | rcvDhSecret (32) | bytes sId | maybe(bytes SPKI)
//!              | maybe('M'|'C') | maybe(bytes linkId, bytes fixed, bytes user)
//!              | maybe(bytes nId, bytes SPKI, rcvNtfDhSecret (32), maybe(bytes svcId))
//!              | 'A' | 'O' | 'B' bytes BlockingInfo | maybe(int64 updatedAt) | maybe(bytes svcId)
//!   messages = u32 n, n × ('M' msgId (24) int64 ts bool body-bytes | 'Q' msgId (24) int64 ts)
//!   ntfs     = u32 n, n × (msgId (24) int64 ts nonce (24) bytes encMeta), oldest first
//! bytes = u32 length then the bytes; maybe = '0' | '1' value; bool = 'T' | 'F'
//! ```
//!
//! The checksum covers everything before it. `can_write` is not stored: a queue whose last message
//! is a marker is closed to writes. After a successful load every loaded file is renamed to
//! `group-NN.bin.bak`, as the reference does with its message log: if the relay crashes later, the
//! next start does not restore the same (by then stale) messages a second time; the `.bak` stays
//! for the operator.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{MemoryStore, Queue};
use crate::crypto::hash::{b64url, sha256};
use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::QueueMode;
use crate::protocol::encoding::{
    put_int64, put_maybe, put_word16, put_word32, DResult, DecodeError, Reader,
};
use crate::protocol::error::BlockingInfo;
use crate::store::{
    group_of, EntityId, Message, MsgNtf, NotifierCreds, QueueLink, QueueRec, QueueStatus,
    PARTITION_GROUPS,
};

const MAGIC: [u8; 8] = *b"SMPRMEM\0";
pub const FORMAT_VERSION: u16 = 1;
const HEADER_LEN: usize = 8 + 2 + 2 + 8;
const CHECKSUM_LEN: usize = 32;

/// How long pending notifications live (the reference's `expire_ntfs_hours` default, 24 h); older
/// ones are skipped at load by [`MemoryStore::load`].
pub const NTF_TTL_SECS: i64 = 24 * 3600;

/// Why saving, loading or editing the group files failed. Each message names the file and what the
/// operator can do about it.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{}: cannot {op}: {source} (check the data directory's permissions and free space)", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{} is unreadable ({reason}): restore {}.bak or remove it to start empty", path.display(), path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("partition group {0} does not exist (groups are 0..{PARTITION_GROUPS})")]
    NoSuchGroup(u32),
    #[error("no queue with {by} in the group files of {}; check the ID (base64url)", dir.display())]
    QueueNotFound { dir: PathBuf, by: String },
}

/// How the operator names a queue on a stopped relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OfflineId {
    Sender(Vec<u8>),
    Link(Vec<u8>),
}

impl OfflineId {
    fn matches(&self, rec: &QueueRec) -> bool {
        match self {
            OfflineId::Sender(id) => rec.sender_id == *id,
            OfflineId::Link(id) => rec.link.as_ref().is_some_and(|l| l.link_id == *id),
        }
    }

    fn describe(&self) -> String {
        match self {
            OfflineId::Sender(id) => format!("sender ID {}", b64url(id)),
            OfflineId::Link(id) => format!("link ID {}", b64url(id)),
        }
    }
}

pub fn group_file(dir: &Path, group: u32) -> PathBuf {
    dir.join(format!("group-{group:02}.bin"))
}

/// Whether any group file is waiting to be loaded (the relay refuses to start on another store
/// type while they exist, so that saved messages are not silently ignored).
pub fn group_files_present(dir: &Path) -> bool {
    (0..PARTITION_GROUPS).any(|g| group_file(dir, g).is_file())
}

/// Sets the status of the queue named by `by` in the group files of a stopped relay and rewrites
/// that group's file; returns the queue's recipient ID.
pub fn set_status_offline(
    dir: &Path,
    by: OfflineId,
    status: QueueStatus,
) -> Result<EntityId, PersistError> {
    for group in 0..PARTITION_GROUPS {
        let path = group_file(dir, group);
        let Some(mut queues) = read_group_file(&path, group)? else {
            continue;
        };
        if let Some(q) = queues.iter_mut().find(|q| by.matches(&q.rec)) {
            q.rec.status = status;
            let rid = q.rec.recipient_id.clone();
            let bytes = encode_file(
                group,
                queues
                    .iter()
                    .map(|q| (&q.rec, q.msgs.iter(), q.ntfs.iter())),
            );
            write_atomic(&path, &bytes)?;
            sync_dir(dir)?;
            return Ok(rid);
        }
    }
    Err(PersistError::QueueNotFound {
        dir: dir.to_path_buf(),
        by: by.describe(),
    })
}

impl MemoryStore {
    /// Writes one file per group in `groups` with the queues of this store in that group; a group
    /// without queues has its file removed. Queues of other groups are not written (the shard that
    /// owns them saves them).
    pub fn save(&self, dir: &Path, groups: &[u32]) -> Result<(), PersistError> {
        let groups = check_groups(groups)?;
        let mut by_group: HashMap<u32, Vec<&Queue>> = HashMap::new();
        for q in self.queues.values() {
            let g = group_of(&q.rec.recipient_id);
            if groups.contains(&g) {
                by_group.entry(g).or_default().push(q);
            }
        }
        // Notifications of a notifier ID no queue has any more are not saved: nobody can take them.
        let empty = VecDeque::new();
        for &g in &groups {
            let path = group_file(dir, g);
            let mut queues = by_group.remove(&g).unwrap_or_default();
            if queues.is_empty() {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(PersistError::Io {
                            path,
                            op: "remove",
                            source,
                        })
                    }
                }
                continue;
            }
            // Sorted so that the same store always gives the same bytes.
            queues.sort_by(|a, b| a.rec.recipient_id.cmp(&b.rec.recipient_id));
            let bytes = encode_file(
                g,
                queues.iter().map(|q| {
                    let ntfs = q
                        .rec
                        .notifier
                        .as_ref()
                        .and_then(|n| self.ntfs.get(&n.notifier_id))
                        .unwrap_or(&empty);
                    (&q.rec, q.msgs.iter(), ntfs.iter())
                }),
            );
            write_atomic(&path, &bytes)?;
        }
        sync_dir(dir)
    }

    /// [`MemoryStore::load_with_ntf_ttl`] with the default notification lifetime of 24 h.
    pub fn load(
        dir: &Path,
        groups: &[u32],
        message_ttl_secs: Option<i64>,
        now: i64,
    ) -> Result<MemoryStore, PersistError> {
        Self::load_with_ntf_ttl(dir, groups, message_ttl_secs, Some(NTF_TTL_SECS), now)
    }

    /// Reads the files of `groups` (a missing file is an empty group), skipping messages older than
    /// `now − message_ttl_secs` (never the quota marker) and notifications older than
    /// `now − ntf_ttl_secs`, then renames every loaded file to `.bak` (see the module comment).
    /// Nothing is renamed unless every file loaded.
    pub fn load_with_ntf_ttl(
        dir: &Path,
        groups: &[u32],
        message_ttl_secs: Option<i64>,
        ntf_ttl_secs: Option<i64>,
        now: i64,
    ) -> Result<MemoryStore, PersistError> {
        let groups = check_groups(groups)?;
        let msg_older_than = message_ttl_secs.map(|t| now.saturating_sub(t));
        let ntf_older_than = ntf_ttl_secs.map(|t| now.saturating_sub(t));
        let mut store = MemoryStore::new();
        let mut loaded = Vec::new();
        for &g in &groups {
            let path = group_file(dir, g);
            let Some(queues) = read_group_file(&path, g)? else {
                continue;
            };
            for SavedQueue {
                rec,
                mut msgs,
                mut ntfs,
            } in queues
            {
                if let Some(old) = msg_older_than {
                    msgs.retain(|m| matches!(m, Message::Quota { .. }) || m.ts() >= old);
                }
                if let Some(old) = ntf_older_than {
                    ntfs.retain(|n| n.ts >= old);
                }
                if let Some(n) = &rec.notifier {
                    for ntf in ntfs {
                        store.push_ntf(&n.notifier_id, ntf);
                    }
                }
                store.insert_loaded(rec, msgs);
            }
            loaded.push(path);
        }
        for path in &loaded {
            let mut bak = path.clone().into_os_string();
            bak.push(".bak");
            fs::rename(path, &bak).map_err(|source| PersistError::Io {
                path: path.clone(),
                op: "rename to .bak",
                source,
            })?;
        }
        if !loaded.is_empty() {
            sync_dir(dir)?;
        }
        Ok(store)
    }
}

/// Deduplicated, each checked to exist.
fn check_groups(groups: &[u32]) -> Result<Vec<u32>, PersistError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(groups.len());
    for &g in groups {
        if g >= PARTITION_GROUPS {
            return Err(PersistError::NoSuchGroup(g));
        }
        if seen.insert(g) {
            out.push(g);
        }
    }
    Ok(out)
}

/// A queue as read from a file.
#[derive(Debug)]
struct SavedQueue {
    rec: QueueRec,
    msgs: VecDeque<Message>,
    ntfs: Vec<MsgNtf>,
}

/// `None` if the file does not exist.
fn read_group_file(path: &Path, group: u32) -> Result<Option<Vec<SavedQueue>>, PersistError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(PersistError::Io {
                path: path.to_path_buf(),
                op: "read",
                source,
            })
        }
    };
    decode_file(&bytes, group)
        .map(Some)
        .map_err(|reason| PersistError::Corrupt {
            path: path.to_path_buf(),
            reason,
        })
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let mut tmp = path.to_path_buf().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let io_err = |op, source| PersistError::Io {
        path: tmp.clone(),
        op,
        source,
    };
    let mut f = fs::File::create(&tmp).map_err(|e| io_err("create", e))?;
    f.write_all(bytes).map_err(|e| io_err("write", e))?;
    f.sync_all().map_err(|e| io_err("fsync", e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| io_err("rename into place", e))
}

/// Makes renames and removals in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), PersistError> {
    let io_err = |source| PersistError::Io {
        path: dir.to_path_buf(),
        op: "fsync the directory",
        source,
    };
    fs::File::open(dir)
        .map_err(io_err)?
        .sync_all()
        .map_err(io_err)
}

// ---- encoding ----

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Every field is far below 4 GiB (bodies are at most 16 KiB, link data a few KiB).
    debug_assert!(u32::try_from(b.len()).is_ok());
    put_word32(out, b.len() as u32);
    out.extend_from_slice(b);
}

fn put_count(out: &mut Vec<u8>, n: usize) {
    debug_assert!(u32::try_from(n).is_ok());
    put_word32(out, n as u32);
}

fn encode_file<'a, M, N>(
    group: u32,
    queues: impl ExactSizeIterator<Item = (&'a QueueRec, M, N)>,
) -> Vec<u8>
where
    M: ExactSizeIterator<Item = &'a Message>,
    N: ExactSizeIterator<Item = &'a MsgNtf>,
{
    let mut payload = Vec::new();
    put_count(&mut payload, queues.len());
    for (rec, msgs, ntfs) in queues {
        encode_rec(&mut payload, rec);
        put_count(&mut payload, msgs.len());
        for m in msgs {
            encode_msg(&mut payload, m);
        }
        put_count(&mut payload, ntfs.len());
        for n in ntfs {
            payload.extend_from_slice(&n.msg_id);
            put_int64(&mut payload, n.ts);
            payload.extend_from_slice(&n.nonce);
            put_bytes(&mut payload, &n.enc_meta);
        }
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + CHECKSUM_LEN);
    out.extend_from_slice(&MAGIC);
    put_word16(&mut out, FORMAT_VERSION);
    put_word16(&mut out, group as u16);
    out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    out.extend_from_slice(&payload);
    let sum = sha256(&out);
    out.extend_from_slice(&sum);
    out
}

fn encode_rec(out: &mut Vec<u8>, rec: &QueueRec) {
    put_bytes(out, &rec.recipient_id);
    put_count(out, rec.recipient_keys.len());
    for k in &rec.recipient_keys {
        put_bytes(out, &k.to_spki());
    }
    out.extend_from_slice(&rec.rcv_dh_secret);
    put_bytes(out, &rec.sender_id);
    put_maybe(out, rec.sender_key.as_ref(), |o, k| {
        put_bytes(o, &k.to_spki())
    });
    put_maybe(out, rec.queue_mode, |o, m| {
        o.push(match m {
            QueueMode::Messaging => b'M',
            QueueMode::Contact => b'C',
        })
    });
    put_maybe(out, rec.link.as_ref(), |o, l| {
        put_bytes(o, &l.link_id);
        put_bytes(o, &l.fixed);
        put_bytes(o, &l.user);
    });
    put_maybe(out, rec.notifier.as_ref(), |o, n| {
        put_bytes(o, &n.notifier_id);
        put_bytes(o, &n.notifier_key.to_spki());
        o.extend_from_slice(&n.rcv_ntf_dh_secret);
        put_maybe(o, n.ntf_service_id.as_ref(), |o, s| put_bytes(o, s));
    });
    match &rec.status {
        QueueStatus::Active => out.push(b'A'),
        QueueStatus::Off => out.push(b'O'),
        QueueStatus::Blocked(info) => {
            out.push(b'B');
            // An empty notice has no encoding that parses back (`,notice=` needs JSON after it).
            let info = BlockingInfo {
                reason: info.reason,
                notice: info.notice.clone().filter(|n| !n.is_empty()),
            };
            let mut b = Vec::new();
            info.encode(&mut b);
            put_bytes(out, &b);
        }
    }
    put_maybe(out, rec.updated_at, put_int64);
    put_maybe(out, rec.rcv_service_id.as_ref(), |o, s| put_bytes(o, s));
}

fn encode_msg(out: &mut Vec<u8>, m: &Message) {
    match m {
        Message::Message {
            msg_id,
            ts,
            notification,
            body,
        } => {
            out.push(b'M');
            out.extend_from_slice(msg_id);
            put_int64(out, *ts);
            out.push(if *notification { b'T' } else { b'F' });
            put_bytes(out, body);
        }
        Message::Quota { msg_id, ts } => {
            out.push(b'Q');
            out.extend_from_slice(msg_id);
            put_int64(out, *ts);
        }
    }
}

// ---- decoding ----

/// Adds what was being read to a decode failure.
fn ctx<T>(r: DResult<T>, what: &str) -> Result<T, String> {
    r.map_err(|_| format!("bad {what}"))
}

fn read_bytes<'a>(r: &mut Reader<'a>) -> DResult<&'a [u8]> {
    let n = r.word32()? as usize;
    r.take(n)
}

fn read_key(r: &mut Reader<'_>) -> DResult<PublicAuthKey> {
    PublicAuthKey::from_spki(read_bytes(r)?).map_err(|_| DecodeError)
}

/// A count read from the file, checked against the bytes left so that a corrupt count cannot make
/// us reserve memory the file could never fill (each item takes at least `min_item_bytes`).
fn read_count(r: &mut Reader<'_>, min_item_bytes: usize) -> DResult<usize> {
    let n = r.word32()? as usize;
    if n.saturating_mul(min_item_bytes) > r.rest().len() {
        return Err(DecodeError);
    }
    Ok(n)
}

fn decode_file(bytes: &[u8], group: u32) -> Result<Vec<SavedQueue>, String> {
    if bytes.len() < HEADER_LEN + CHECKSUM_LEN {
        return Err(format!("truncated: {} bytes", bytes.len()));
    }
    let mut r = Reader::new(bytes);
    if r.take(8) != Ok(&MAGIC[..]) {
        return Err("not a smp-relay memory store file (bad magic)".into());
    }
    let version = ctx(r.word16(), "header")?;
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads version {FORMAT_VERSION}"
        ));
    }
    let file_group = ctx(r.word16(), "header")?;
    let payload_len = u64::from_be_bytes(ctx(r.array(), "header")?);
    let expected = (HEADER_LEN + CHECKSUM_LEN) as u64 + payload_len;
    if (bytes.len() as u64) < expected {
        return Err(format!("truncated: {} bytes of {expected}", bytes.len()));
    }
    if bytes.len() as u64 > expected {
        return Err(format!(
            "{} bytes after the end",
            bytes.len() as u64 - expected
        ));
    }
    let (content, sum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
    if sha256(content) != sum {
        return Err("checksum mismatch".into());
    }
    if u32::from(file_group) != group {
        return Err(format!("holds group {file_group}, not {group}"));
    }
    let mut r = Reader::new(&content[HEADER_LEN..]);
    let n = ctx(read_count(&mut r, 4), "queue count")?;
    let mut queues = Vec::with_capacity(n);
    let mut seen = HashSet::new();
    for _ in 0..n {
        let q = decode_queue(&mut r)?;
        let rid = &q.rec.recipient_id;
        if group_of(rid) != group {
            return Err(format!("queue {} belongs to another group", b64url(rid)));
        }
        if !seen.insert(rid.clone()) {
            return Err(format!("queue {} appears twice", b64url(rid)));
        }
        queues.push(q);
    }
    ctx(r.end(), "end of payload")?;
    Ok(queues)
}

fn decode_queue(r: &mut Reader<'_>) -> Result<SavedQueue, String> {
    let rec = ctx(decode_rec(r), "queue record")?;
    let n = ctx(read_count(r, 33), "message count")?;
    let mut msgs = VecDeque::with_capacity(n);
    for _ in 0..n {
        let m = ctx(decode_msg(r), "message")?;
        if matches!(msgs.back(), Some(Message::Quota { .. })) {
            return Err(format!(
                "queue {}: a message after the quota marker",
                b64url(&rec.recipient_id)
            ));
        }
        msgs.push_back(m);
    }
    let n = ctx(read_count(r, 60), "notification count")?;
    let mut ntfs = Vec::with_capacity(n);
    for _ in 0..n {
        ntfs.push(ctx(decode_ntf(r), "notification")?);
    }
    Ok(SavedQueue { rec, msgs, ntfs })
}

fn decode_rec(r: &mut Reader<'_>) -> DResult<QueueRec> {
    let recipient_id = read_bytes(r)?.to_vec();
    let nkeys = read_count(r, 4)?;
    let mut recipient_keys = Vec::with_capacity(nkeys);
    for _ in 0..nkeys {
        recipient_keys.push(read_key(r)?);
    }
    let rcv_dh_secret = r.array()?;
    let sender_id = read_bytes(r)?.to_vec();
    let sender_key = r.maybe(read_key)?;
    let queue_mode = r.maybe(|r| match r.byte()? {
        b'M' => Ok(QueueMode::Messaging),
        b'C' => Ok(QueueMode::Contact),
        _ => Err(DecodeError),
    })?;
    let link = r.maybe(|r| {
        Ok(QueueLink {
            link_id: read_bytes(r)?.to_vec(),
            fixed: read_bytes(r)?.to_vec(),
            user: read_bytes(r)?.to_vec(),
        })
    })?;
    let notifier = r.maybe(|r| {
        Ok(NotifierCreds {
            notifier_id: read_bytes(r)?.to_vec(),
            notifier_key: read_key(r)?,
            rcv_ntf_dh_secret: r.array()?,
            ntf_service_id: r.maybe(|r| Ok(read_bytes(r)?.to_vec()))?,
        })
    })?;
    let status = match r.byte()? {
        b'A' => QueueStatus::Active,
        b'O' => QueueStatus::Off,
        b'B' => {
            let mut br = Reader::new(read_bytes(r)?);
            let info = BlockingInfo::read(&mut br)?;
            br.end()?;
            QueueStatus::Blocked(info)
        }
        _ => return Err(DecodeError),
    };
    let updated_at = r.maybe(|r| r.int64())?;
    let rcv_service_id = r.maybe(|r| Ok(read_bytes(r)?.to_vec()))?;
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

fn decode_msg(r: &mut Reader<'_>) -> DResult<Message> {
    match r.byte()? {
        b'M' => Ok(Message::Message {
            msg_id: r.array()?,
            ts: r.int64()?,
            notification: r.bool()?,
            body: read_bytes(r)?.into(),
        }),
        b'Q' => Ok(Message::Quota {
            msg_id: r.array()?,
            ts: r.int64()?,
        }),
        _ => Err(DecodeError),
    }
}

fn decode_ntf(r: &mut Reader<'_>) -> DResult<MsgNtf> {
    Ok(MsgNtf {
        msg_id: r.array()?,
        ts: r.int64()?,
        nonce: r.array()?,
        enc_meta: read_bytes(r)?.to_vec(),
    })
}
