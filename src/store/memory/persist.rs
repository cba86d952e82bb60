//! Saving a shard's memory store at a clean stop and restoring it at start, one file per partition
//! group (`<dir>/group-NN.bin`), so that a restart keeps queues, messages and notifications and the
//! core count may change in between. Also the offline edit behind `block`/`unblock` on a stopped relay.
//!
//! File layout (all integers big-endian):
//!
//! ```text
//! magic "SMPRMEM\0" (8) | version u16 = 1 | group u16 | payload length u64 | payload | SHA-256 (32)
//! payload  = queue count u32, then per queue:
//!   record, u32 n, n × message, u32 n, n × notification (oldest first)
//! ```
//!
//! `record`, `message` and `notification` are the encodings of `store/codec.rs`, which the store
//! export stream (`store/transfer.rs`) writes too.
//!
//! The checksum covers everything before it. `can_write` is not stored: a queue whose last message
//! is a marker is closed to writes.
//!
//! What a crash costs. Loading only reads. Once every shard of a start has loaded and can serve,
//! the loaded files are renamed to `group-NN.bin.bak` ([`set_aside_saved`]), as the reference renames
//! its message log once it has read it (`simplex-chat/simplexmq`, `src/Simplex/Messaging/Server.hs`,
//! `restoreServerMessages`), so that a file is the state of the last clean stop only while no start has
//! served since. A start that finds a group's `.bak` without its `group-NN.bin` (the relay crashed,
//! or its save at the stop failed) loads the `.bak` and warns: the group is as the clean stop before
//! that start saved it, so queues created and messages sent since that start are lost and messages
//! acknowledged since are delivered again. A start that fails changes no file. A save writes each
//! group to `.tmp`, syncs it and renames it over `group-NN.bin`; a group whose write fails keeps its
//! previous saved state (its `.bak`), and the other groups are still saved.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::{MemoryData, MemoryStore, Queue};
use crate::crypto::hash::{b64url, sha256};
use crate::protocol::encoding::{put_word16, DResult, Reader};
use crate::store::codec::{
    decode_msg, decode_ntf, decode_rec, encode_msg, encode_ntf, encode_rec, put_count, read_count,
};
use crate::store::{group_of, EntityId, Message, MsgNtf, QueueRec, QueueStatus, PARTITION_GROUPS};

const MAGIC: [u8; 8] = *b"SMPRMEM\0";
pub const FORMAT_VERSION: u16 = 1;
const HEADER_LEN: usize = 8 + 2 + 2 + 8;
const CHECKSUM_LEN: usize = 32;

/// How long pending notifications live by default (the reference's `expire_ntfs_hours` default,
/// 24 h): `config::Settings::notification_ttl`'s default and [`MemoryStore::load`]'s lifetime. The
/// relay loads with the configured lifetime ([`MemoryStore::load_with_ntf_ttl`], `server::run`).
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
    #[error("{} is missing and {} is unreadable ({reason}): remove {} to start without that group's queues", saved.display(), path.display(), path.display())]
    CorruptBackup {
        path: PathBuf,
        saved: PathBuf,
        reason: String,
    },
    #[error("{0}")]
    QueueLog(String),
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

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.to_path_buf().into_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// Where a start that served has set the group's file aside (see the module comment).
pub fn backup_file(dir: &Path, group: u32) -> PathBuf {
    with_suffix(&group_file(dir, group), ".bak")
}

/// Whether any group file, or a `.bak` a start would load instead, is waiting to be loaded.
pub fn group_files_present(dir: &Path) -> bool {
    (0..PARTITION_GROUPS).any(|g| group_file(dir, g).is_file() || backup_file(dir, g).is_file())
        || !super::queue_log::logged_groups(dir).is_empty()
}

/// Renames every `group-NN.bin` in `dir` to `group-NN.bin.bak`, once a start has loaded them all
/// and is about to serve (see the module comment). If one rename fails, those already done are
/// undone, so that the start can fail with the saved store as it was.
pub fn set_aside_saved(dir: &Path) -> Result<(), PersistError> {
    let mut done = Vec::new();
    for g in 0..PARTITION_GROUPS {
        let (path, bak) = (group_file(dir, g), backup_file(dir, g));
        if !path.is_file() {
            continue;
        }
        if let Err(source) = fs::rename(&path, &bak) {
            for (path, bak) in done.iter().rev() {
                let _ = fs::rename(bak, path);
            }
            return Err(PersistError::Io {
                path,
                op: "rename to .bak",
                source,
            });
        }
        done.push((path, bak));
    }
    if done.is_empty() {
        return Ok(());
    }
    sync_dir(dir)
}

/// Why a save failed: every group that could not be written (or removed), each with what is left
/// of it.
#[derive(Debug)]
pub struct SaveError(pub Vec<(PersistError, String)>);

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (e, left)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
            if !left.is_empty() {
                write!(f, "; {left}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for SaveError {}

/// What a group whose save failed is left with.
fn left_after_failure(dir: &Path, group: u32) -> String {
    let (path, bak) = (group_file(dir, group), backup_file(dir, group));
    if path.is_file() {
        format!("{} is kept as it was", path.display())
    } else if bak.is_file() {
        format!(
            "its previous saved state {} is kept and the next start loads it (without what changed since the start that loaded it)",
            bak.display()
        )
    } else {
        format!("no earlier saved state of {} exists", path.display())
    }
}

/// Sets the status of the queue named by `by` in the group files of a stopped relay and rewrites
/// that group's file; returns the queue's recipient ID.
pub fn set_status_offline(
    dir: &Path,
    by: OfflineId,
    status: QueueStatus,
) -> Result<EntityId, PersistError> {
    // The queue changes since the last clean stop go into the files first.
    let all: Vec<u32> = (0..PARTITION_GROUPS).collect();
    super::queue_log::fold(dir, &all).map_err(PersistError::QueueLog)?;
    for group in 0..PARTITION_GROUPS {
        let path = group_file(dir, group);
        let Some((mut queues, _)) = read_group_or_backup(dir, group)? else {
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
    /// without queues has its file and its `.bak` removed (a later start must not load queues
    /// deleted since). Queues of other groups are not written (the shard that owns them saves
    /// them). A group that fails does not stop the others; the error lists every failed group.
    pub fn save(&self, dir: &Path, groups: &[u32]) -> Result<(), SaveError> {
        let groups = check_groups(groups).map_err(|e| SaveError(vec![(e, String::new())]))?;
        let mut failed = Vec::new();
        let data = self.data.borrow();
        let mut by_group: HashMap<u32, Vec<(&[u8], &Queue)>> = HashMap::new();
        for (rid, q) in &data.queues {
            let g = group_of(rid.as_slice());
            if groups.contains(&g) {
                by_group.entry(g).or_default().push((rid.as_slice(), q));
            }
        }
        // Notifications of a notifier ID no queue has any more are not saved: nobody can take them.
        let empty = VecDeque::new();
        for &g in &groups {
            let path = group_file(dir, g);
            let mut queues = by_group.remove(&g).unwrap_or_default();
            if queues.is_empty() {
                for path in [path, backup_file(dir, g)] {
                    match fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(source) => failed.push((
                            PersistError::Io {
                                path,
                                op: "remove",
                                source,
                            },
                            String::new(),
                        )),
                    }
                }
                continue;
            }
            // Sorted so that the same store always gives the same bytes.
            queues.sort_by(|a, b| a.0.cmp(b.0));
            let recs: Vec<QueueRec> = queues.iter().map(|(rid, q)| q.record(rid)).collect();
            let bytes = encode_file(
                g,
                recs.iter().zip(&queues).map(|(rec, (_, q))| {
                    let ntfs = q
                        .notifier_id()
                        .and_then(|n| data.ntfs.get(n))
                        .unwrap_or(&empty);
                    (rec, q.msgs.iter(), ntfs.iter())
                }),
            );
            if let Err(e) = write_atomic(&path, &bytes) {
                failed.push((e, left_after_failure(dir, g)));
            }
        }
        if let Err(e) = sync_dir(dir) {
            failed.push((e, String::new()));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(SaveError(failed))
        }
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

    /// Reads the files of `groups` (a group without a file is loaded from its `.bak`, with a
    /// warning, or else is empty), skipping messages older than `now − message_ttl_secs` (never the
    /// quota marker) and notifications older than `now − ntf_ttl_secs`. Changes no file.
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
        let mut store = MemoryData::default();
        let mut from_backup = Vec::new();
        for &g in &groups {
            let Some((queues, backup)) = read_group_or_backup(dir, g)? else {
                continue;
            };
            if backup {
                from_backup.push(g);
            }
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
        }
        // The queue changes made since these files were written (`queue_log.rs`).
        super::queue_log::apply_logs(dir, &groups, &mut store).map_err(PersistError::QueueLog)?;
        if !from_backup.is_empty() {
            let names = |f: fn(&Path, u32) -> PathBuf| {
                from_backup
                    .iter()
                    .map(|&g| f(dir, g).display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            tracing::warn!(
                "{} missing: loaded {} instead. The relay did not save these groups at its last stop (it crashed, or the save failed), so their messages are as the clean stop before the start that loaded them saved them: messages sent since that start are lost, and messages acknowledged since may be delivered again (queue changes are kept by the queue log, unless the store log is off)",
                names(group_file),
                names(backup_file)
            );
        }
        Ok(MemoryStore::from_data(store))
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

/// The group's saved file, or else its `.bak` (`true`); `None` if neither exists.
fn read_group_or_backup(
    dir: &Path,
    group: u32,
) -> Result<Option<(Vec<SavedQueue>, bool)>, PersistError> {
    let path = group_file(dir, group);
    if let Some(queues) = read_group_file(&path, group)? {
        return Ok(Some((queues, false)));
    }
    let bak = backup_file(dir, group);
    match read_group_file(&bak, group) {
        Ok(found) => Ok(found.map(|q| (q, true))),
        Err(PersistError::Corrupt { reason, .. }) => Err(PersistError::CorruptBackup {
            path: bak,
            saved: path,
            reason,
        }),
        Err(e) => Err(e),
    }
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

/// Replaces `path` with `bytes` or leaves it as it was: on failure the temporary file is removed,
/// so that it does not hold the space other groups need (on a full disk).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let tmp = with_suffix(path, ".tmp");
    let io_err = |op, source| PersistError::Io {
        path: tmp.clone(),
        op,
        source,
    };
    let written = (|| {
        let mut f = crate::store::private_file()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| io_err("create", e))?;
        f.write_all(bytes).map_err(|e| io_err("write", e))?;
        f.sync_all().map_err(|e| io_err("fsync", e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| io_err("rename into place", e))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
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
            encode_ntf(&mut payload, n);
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

// ---- decoding ----

/// Adds what was being read to a decode failure.
fn ctx<T>(r: DResult<T>, what: &str) -> Result<T, String> {
    r.map_err(|_| format!("bad {what}"))
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

/// Where the memory store saves its partition groups at a clean stop, under the data directory.
pub const MEMORY_STORE_DIR: &str = "memory-store";

fn store_dir(s: &crate::store::StoreSettings) -> PathBuf {
    s.data_dir.join(MEMORY_STORE_DIR)
}

impl crate::store::ShardStore for MemoryStore {
    fn open(s: &crate::store::StoreSettings, groups: &[u32], now: i64) -> Result<Self, String> {
        let dir = store_dir(s);
        crate::store::create_private_dir(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if !s.keep.queues {
            // `[STORE_LOG] enable = off`: every start begins empty, as the reference's.
            return Self::load(&dir, &[], None, now).map_err(|e| e.to_string());
        }
        // The queue changes a crash left in the logs go into the group files first, so that a
        // log holds the changes of one start only.
        super::queue_log::fold(&dir, groups)?;
        let mut store = Self::load_with_ntf_ttl(
            &dir,
            groups,
            Some(s.message_ttl_secs),
            Some(s.ntf_ttl_secs),
            now,
        )
        .map_err(|e| e.to_string())?;
        store.log = Some(super::queue_log::QueueLog::open(
            &dir,
            groups,
            s.durability,
        )?);
        Ok(store)
    }

    fn all_opened(s: &crate::store::StoreSettings) -> Result<(), String> {
        // From here a crash must not load these files as if nothing had been served since.
        set_aside_saved(&store_dir(s)).map_err(|e| e.to_string())
    }

    fn save_running(&self, s: &crate::store::StoreSettings, groups: &[u32]) -> Result<(), String> {
        if !s.keep.queues {
            return Ok(());
        }
        if !s.keep.messages {
            return Err(
                "messages are not kept (restore_messages = off), so the store is saved at a clean stop only"
                    .into(),
            );
        }
        self.save(&store_dir(s), groups).map_err(|e| e.to_string())
    }

    fn close(mut self, s: &crate::store::StoreSettings, groups: &[u32]) -> Result<(), String> {
        let log = self.log.take();
        if let Some(log) = &log {
            log.sync();
        }
        {
            // What the configuration does not keep is not written: saving the rest of an emptied
            // group removes its file.
            let mut data = self.data.borrow_mut();
            if !s.keep.queues {
                data.queues.clear();
            }
            if !s.keep.messages {
                data.queues.values_mut().for_each(|q| q.msgs.clear());
                data.ntfs.clear();
            }
        }
        self.save(&store_dir(s), groups)
            .map_err(|e| e.to_string())?;
        // The files now hold every change the logs did.
        if let Some(log) = log {
            log.close();
            super::queue_log::reset(&store_dir(s), groups)
                .map_err(|e| format!("{}: {e}", store_dir(s).display()))?;
        }
        Ok(())
    }

    fn find_offline(
        s: &crate::store::StoreSettings,
        id: &[u8],
    ) -> Result<Option<QueueRec>, String> {
        let dir = store_dir(s);
        if !group_files_present(&dir) {
            return Err(format!(
                "no queues are saved in {} (the relay saves its queues when it stops cleanly, on SIGTERM or SIGINT)",
                dir.display()
            ));
        }
        let groups: Vec<u32> = (0..PARTITION_GROUPS).collect();
        let store =
            Self::load_with_ntf_ttl(&dir, &groups, None, None, 0).map_err(|e| e.to_string())?;
        let data = store.data.borrow();
        let found = data
            .queues
            .iter()
            .map(|(rid, q)| q.record(rid.as_slice()))
            .find(|r| r.sender_id == id || r.link.as_ref().is_some_and(|l| l.link_id == id));
        Ok(found)
    }

    fn set_status_offline(
        s: &crate::store::StoreSettings,
        sender_id: &[u8],
        status: QueueStatus,
    ) -> Result<(), String> {
        set_status_offline(&store_dir(s), OfflineId::Sender(sender_id.to_vec()), status)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn restore(&self, q: crate::store::QueueData) -> Result<(), crate::store::StoreError> {
        self.data.borrow_mut().restore(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::PublicAuthKey;
    use crate::protocol::command::QueueMode;
    use crate::protocol::error::{BlockingInfo, BlockingReason};
    use crate::store::memory::tests::{msg, ntf, rec};
    use crate::store::{MessageStore, QueueStore, WriteOutcome};
    use crate::store::{NotifierCreds, QueueLink};
    use futures_lite::future::block_on;

    /// A directory under the system temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir()
                .join(format!("smp-relay-memstore-{}-{name}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A recipient ID that lands in `group`, distinct per `tag`.
    fn rid_in(group: u32, tag: &str) -> Vec<u8> {
        (0u32..)
            .map(|i| format!("{tag}-{i:08}-rid-padding-").into_bytes())
            .find(|r| group_of(r) == group)
            .unwrap()
    }

    fn full_rec(rid: &[u8]) -> QueueRec {
        QueueRec {
            recipient_id: rid.to_vec(),
            recipient_keys: vec![
                PublicAuthKey::Ed25519([7; 32]),
                PublicAuthKey::Ed448([8; 57]),
            ],
            rcv_dh_secret: [9; 32],
            sender_id: [rid, b"-snd"].concat(),
            sender_key: Some(PublicAuthKey::X25519([10; 32])),
            queue_mode: Some(QueueMode::Contact),
            link: Some(Box::new(QueueLink {
                link_id: [rid, b"-lnk"].concat(),
                fixed: vec![11; 300],
                // The longest link data a queue can hold (`QueueLink::fits`).
                user: vec![12; crate::protocol::encoding::MAX_LARGE],
            })),
            notifier: Some(Box::new(NotifierCreds {
                notifier_id: [rid, b"-ntf"].concat(),
                notifier_key: PublicAuthKey::Ed25519([13; 32]),
                rcv_ntf_dh_secret: [14; 32],
                ntf_service_id: Some(b"ntf-service".to_vec()),
            })),
            status: QueueStatus::Blocked(BlockingInfo {
                reason: BlockingReason::Content,
                notice: Some(r#"{"ttl":3600}"#.into()),
            }),
            updated_at: Some(1_700_006_400),
            rcv_service_id: Some(b"rcv-service".to_vec()),
        }
    }

    const QUOTA: usize = 3;

    /// Group 5: a queue with every field set, full (3 messages and a marker) with notifications,
    /// and a queue with none. Group 9: one Off queue with one message.
    fn sample() -> (MemoryStore, Vec<u8>, Vec<u8>, Vec<u8>) {
        let (full, bare, off) = (rid_in(5, "full"), rid_in(5, "bare"), rid_in(9, "off"));
        let s = MemoryStore::new();
        block_on(s.create(full_rec(&full))).unwrap();
        block_on(s.create(rec(&bare))).unwrap();
        let mut r = rec(&off);
        r.status = QueueStatus::Off;
        r.queue_mode = Some(QueueMode::Messaging);
        block_on(s.create(r)).unwrap();
        for n in 1..=4 {
            block_on(s.write(&full, msg(n, 1000 + n as i64), QUOTA)).unwrap();
        }
        block_on(s.write(&off, msg(20, 500), QUOTA)).unwrap();
        let nid = [&full[..], b"-ntf"].concat();
        block_on(s.add_ntf(&nid, ntf(1, 1001))).unwrap();
        block_on(s.add_ntf(&nid, ntf(2, 1002))).unwrap();
        // Nobody's notifier: not saved.
        block_on(s.add_ntf(b"orphan", ntf(3, 1003))).unwrap();
        (s, full, bare, off)
    }

    fn drain(s: &mut MemoryStore, rid: &[u8]) -> Vec<Message> {
        let mut out = Vec::new();
        while let Some(m) = block_on(s.peek_first(rid)).unwrap() {
            block_on(s.try_del(rid, m.msg_id())).unwrap();
            out.push(m);
        }
        out
    }

    #[test]
    fn save_and_load_round_trip_over_groups() {
        let dir = TempDir::new("roundtrip");
        let (s, full, bare, off) = sample();
        // Group 12 had a file from an earlier save; it is empty now, so the file goes.
        fs::write(group_file(&dir.0, 12), b"stale").unwrap();
        s.save(&dir.0, &[5, 9, 12]).unwrap();
        assert!(group_file(&dir.0, 5).is_file());
        assert!(group_file(&dir.0, 9).is_file());
        assert!(!group_file(&dir.0, 12).exists());
        assert!(group_files_present(&dir.0));

        let mut l = MemoryStore::load(&dir.0, &[5, 9, 12], None, 2000).unwrap();
        assert_eq!(l.queue_count(), 3);
        for rid in [&full, &bare, &off] {
            assert_eq!(l.get(rid), s.get(rid), "record of {rid:?}");
        }
        assert_eq!(l.get(&full), Some(full_rec(&full)));
        assert_eq!(l.total_messages(), 5);
        assert_eq!(l.size(&full), 4);

        // The full queue is still closed to writes: its last message is the marker.
        assert_eq!(
            block_on(l.write(&full, msg(30, 3000), QUOTA)).unwrap(),
            WriteOutcome::Full
        );
        let nid = [&full[..], b"-ntf"].concat();
        assert_eq!(l.ntf_ids(), vec![nid.clone()]);
        assert_eq!(
            block_on(l.take_ntfs(&nid, usize::MAX)).unwrap().0,
            vec![ntf(1, 1001), ntf(2, 1002)]
        );
        assert_eq!(
            drain(&mut l, &full),
            vec![
                msg(1, 1001),
                msg(2, 1002),
                msg(3, 1003),
                Message::Quota {
                    msg_id: [4; 24],
                    ts: 1004
                }
            ]
        );
        assert_eq!(drain(&mut l, &off), vec![msg(20, 500)]);
        // Drained: open again.
        assert_eq!(
            block_on(l.write(&full, msg(31, 3001), QUOTA)).unwrap(),
            WriteOutcome::Written { was_empty: true }
        );

        // Loading changed no file.
        assert!(group_file(&dir.0, 5).is_file() && group_file(&dir.0, 9).is_file());
        assert!(!backup_file(&dir.0, 5).exists());
    }

    /// Once a start serves, its files become `.bak`; a start after a crash (no saved file) loads
    /// the `.bak`; a save replaces the group file, and a group emptied since loses its `.bak` too.
    #[test]
    fn a_start_after_a_crash_loads_the_files_set_aside() {
        let dir = TempDir::new("set-aside");
        let (s, full, _, off) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        let saved5 = fs::read(group_file(&dir.0, 5)).unwrap();
        set_aside_saved(&dir.0).unwrap();
        assert!(!group_file(&dir.0, 5).exists() && !group_file(&dir.0, 9).exists());
        assert_eq!(fs::read(backup_file(&dir.0, 5)).unwrap(), saved5);
        assert!(group_files_present(&dir.0));

        let l = MemoryStore::load(&dir.0, &[5, 9], None, 2000).unwrap();
        assert_eq!(l.queue_count(), 3, "loaded from the .bak files");
        assert!(!group_file(&dir.0, 5).exists(), "loading wrote nothing");

        // The Off queue (group 9) is deleted; the next save removes group 9's .bak as well, so
        // that a later crash cannot bring the queue back.
        block_on(l.delete(&off)).unwrap();
        l.save(&dir.0, &[5, 9]).unwrap();
        assert!(group_file(&dir.0, 5).is_file());
        assert!(!group_file(&dir.0, 9).exists() && !backup_file(&dir.0, 9).exists());
        set_aside_saved(&dir.0).unwrap();
        let again = MemoryStore::load(&dir.0, &[5, 9], None, 2000).unwrap();
        assert_eq!(again.queue_count(), 2);
        assert!(again.get(&full).is_some() && again.get(&off).is_none());
    }

    /// A group that cannot be written keeps its previous state; the groups after it are saved; no
    /// temporary file stays; the error names the group and what is kept.
    #[test]
    fn a_failed_group_write_keeps_its_previous_state_and_the_others_are_saved() {
        let dir = TempDir::new("failed-write");
        let (s, full, bare, off) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        set_aside_saved(&dir.0).unwrap();
        // Group 5's temporary file cannot be created: a directory is in its way.
        let tmp5 = with_suffix(&group_file(&dir.0, 5), ".tmp");
        fs::create_dir(&tmp5).unwrap();
        fs::write(tmp5.join("x"), b"x").unwrap();
        let l = MemoryStore::load(&dir.0, &[5, 9], None, 2000).unwrap();
        block_on(l.write(&off, msg(21, 600), QUOTA)).unwrap();
        let e = l.save(&dir.0, &[5, 9]).unwrap_err();
        assert_eq!(e.0.len(), 1, "{e}");
        let text = e.to_string();
        assert!(text.contains("group-05.bin"), "{text}");
        assert!(text.contains("group-05.bin.bak is kept"), "{text}");
        assert!(group_file(&dir.0, 9).is_file(), "group 9 is still saved");
        fs::remove_dir_all(&tmp5).unwrap();
        let mut again = MemoryStore::load(&dir.0, &[5, 9], None, 2000).unwrap();
        assert_eq!(again.size(&off), 2, "group 9's new state");
        assert!(again.get(&full).is_some() && again.get(&bare).is_some());
        assert_eq!(
            drain(&mut again, &full).len(),
            4,
            "group 5's previous state"
        );
    }

    #[test]
    fn a_failed_write_removes_its_temporary_file() {
        let dir = TempDir::new("tmp-removed");
        let path = dir.0.join("group-07.bin");
        fs::write(&path, b"before").unwrap();
        // A rename over a non-empty directory fails after the temporary file was written.
        fs::remove_file(&path).unwrap();
        fs::create_dir(&path).unwrap();
        fs::write(path.join("x"), b"x").unwrap();
        assert!(write_atomic(&path, b"after").is_err());
        assert!(!with_suffix(&path, ".tmp").exists());
    }

    #[test]
    fn an_unreadable_backup_is_an_error_naming_it() {
        let dir = TempDir::new("bad-bak");
        let (s, ..) = sample();
        s.save(&dir.0, &[9]).unwrap();
        set_aside_saved(&dir.0).unwrap();
        let bak = backup_file(&dir.0, 9);
        let bytes = fs::read(&bak).unwrap();
        fs::write(&bak, &bytes[..bytes.len() - 1]).unwrap();
        let e = MemoryStore::load(&dir.0, &[9], None, 0).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&format!("remove {} to start", bak.display())),
            "{text}"
        );
    }

    #[test]
    fn an_open_queue_stays_open_after_load() {
        let dir = TempDir::new("open");
        let q = rid_in(3, "q");
        let s = MemoryStore::new();
        block_on(s.create(rec(&q))).unwrap();
        block_on(s.write(&q, msg(1, 10), QUOTA)).unwrap();
        s.save(&dir.0, &[3]).unwrap();
        let l = MemoryStore::load(&dir.0, &[3], None, 20).unwrap();
        assert_eq!(
            block_on(l.write(&q, msg(2, 11), QUOTA)).unwrap(),
            WriteOutcome::Written { was_empty: false }
        );
    }

    #[test]
    fn load_with_ttl_drops_old_messages_and_notifications() {
        let dir = TempDir::new("ttl");
        let (s, full, _, off) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        // now − ttl = 1002: messages 1 (1001) and the Off queue's (500) are dropped.
        let l =
            MemoryStore::load_with_ntf_ttl(&dir.0, &[5, 9], Some(1000), Some(1000), 2002).unwrap();
        assert_eq!(l.size(&off), 0);
        assert_eq!(l.size(&full), 3);
        assert_eq!(l.total_messages(), 3);
        let nid = [&full[..], b"-ntf"].concat();
        assert_eq!(
            block_on(l.take_ntfs(&nid, usize::MAX)).unwrap().0,
            vec![ntf(2, 1002)]
        );
        assert_eq!(block_on(l.peek_first(&full)).unwrap(), Some(msg(2, 1002)));

        // Everything expired but the marker: the queue stays closed to writes.
        let (s, full, _, _) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        let l = MemoryStore::load(&dir.0, &[5, 9], Some(1), 1_000_000).unwrap();
        assert_eq!(l.size(&full), 1);
        assert_eq!(
            block_on(l.write(&full, msg(40, 1_000_000), QUOTA)).unwrap(),
            WriteOutcome::Full
        );
        // Default notification lifetime is 24 h.
        assert!(l.ntf_ids().is_empty());
    }

    #[test]
    fn loading_some_groups_loads_only_their_queues() {
        let dir = TempDir::new("some");
        let (s, full, bare, off) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        let l = MemoryStore::load(&dir.0, &[9], None, 0).unwrap();
        assert_eq!(l.queue_count(), 1);
        assert!(l.get(&off).is_some());
        assert!(l.get(&full).is_none() && l.get(&bare).is_none());
        // Loading changed no file.
        assert!(group_file(&dir.0, 5).is_file());
        assert!(group_file(&dir.0, 9).is_file());

        // Saving only some groups writes only their queues.
        let dir2 = TempDir::new("some-save");
        s.save(&dir2.0, &[9]).unwrap();
        assert!(!group_file(&dir2.0, 5).exists());
        assert_eq!(
            MemoryStore::load(&dir2.0, &[5, 9], None, 0)
                .unwrap()
                .queue_count(),
            1
        );
    }

    #[test]
    fn groups_outside_the_range_are_refused() {
        let dir = TempDir::new("range");
        let s = MemoryStore::new();
        let e = s.save(&dir.0, &[64]).unwrap_err();
        assert!(
            matches!(e.0[..], [(PersistError::NoSuchGroup(64), _)]),
            "{e}"
        );
        assert!(matches!(
            MemoryStore::load(&dir.0, &[1, 99], None, 0),
            Err(PersistError::NoSuchGroup(99))
        ));
    }

    fn assert_corrupt(r: Result<MemoryStore, PersistError>, path: &Path, why: &str) {
        let e = r.expect_err("must fail");
        assert!(matches!(e, PersistError::Corrupt { .. }), "{e:?}");
        let text = e.to_string();
        let p = path.display().to_string();
        assert!(text.contains(&p), "{text}");
        assert!(
            text.contains(&format!("restore {p}.bak or remove it")),
            "{text}"
        );
        assert!(text.contains(why), "{text}");
        // Nothing was renamed: the operator still has the file.
        assert!(path.is_file());
    }

    #[test]
    fn a_corrupted_byte_is_an_error_naming_the_file() {
        let dir = TempDir::new("corrupt");
        let (s, ..) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        let path = group_file(&dir.0, 5);
        let mut bytes = fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        fs::write(&path, &bytes).unwrap();
        assert_corrupt(
            MemoryStore::load(&dir.0, &[5, 9], None, 0),
            &path,
            "checksum",
        );
        // Group 9 loaded fine but was not moved aside either: the load as a whole failed.
        assert!(group_file(&dir.0, 9).is_file());
    }

    #[test]
    fn a_truncated_file_is_an_error_naming_the_file() {
        let dir = TempDir::new("truncated");
        let (s, ..) = sample();
        s.save(&dir.0, &[9]).unwrap();
        let path = group_file(&dir.0, 9);
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        assert_corrupt(MemoryStore::load(&dir.0, &[9], None, 0), &path, "truncated");
        fs::write(&path, &bytes[..5]).unwrap();
        assert_corrupt(MemoryStore::load(&dir.0, &[9], None, 0), &path, "truncated");
        // Every shorter prefix fails without panicking.
        for n in 0..bytes.len() {
            assert!(decode_file(&bytes[..n], 9).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn a_file_under_another_group_name_is_refused() {
        let dir = TempDir::new("wrong-group");
        let (s, ..) = sample();
        s.save(&dir.0, &[9]).unwrap();
        let path = group_file(&dir.0, 10);
        fs::rename(group_file(&dir.0, 9), &path).unwrap();
        assert_corrupt(
            MemoryStore::load(&dir.0, &[10], None, 0),
            &path,
            "holds group 9",
        );
    }

    /// Mutations behind a valid checksum reach the parser: it must reject or accept, never panic.
    #[test]
    fn mutated_payloads_never_panic() {
        let (s, ..) = sample();
        let dir = TempDir::new("mutate");
        s.save(&dir.0, &[9]).unwrap();
        let bytes = fs::read(group_file(&dir.0, 9)).unwrap();
        let mut rejected = 0;
        for i in HEADER_LEN..bytes.len() - CHECKSUM_LEN {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                let end = b.len() - CHECKSUM_LEN;
                let sum = sha256(&b[..end]);
                b[end..].copy_from_slice(&sum);
                if decode_file(&b, 9).is_err() {
                    rejected += 1;
                }
            }
        }
        assert!(rejected > 0);
    }

    #[test]
    fn set_status_offline_by_sender_and_link() {
        let dir = TempDir::new("offline");
        let (s, full, bare, off) = sample();
        s.save(&dir.0, &[5, 9]).unwrap();
        let blocked = QueueStatus::Blocked(BlockingInfo {
            reason: BlockingReason::Spam,
            notice: None,
        });

        let by_sender = OfflineId::Sender([&off[..], b"-snd"].concat());
        assert_eq!(
            set_status_offline(&dir.0, by_sender, blocked.clone()).unwrap(),
            off
        );
        let by_link = OfflineId::Link([&full[..], b"-lnk"].concat());
        assert_eq!(
            set_status_offline(&dir.0, by_link, QueueStatus::Active).unwrap(),
            full
        );

        let e = set_status_offline(
            &dir.0,
            OfflineId::Link(b"no-such-link".to_vec()),
            QueueStatus::Active,
        )
        .unwrap_err();
        assert!(matches!(e, PersistError::QueueNotFound { .. }), "{e:?}");
        assert!(e.to_string().contains(&b64url(b"no-such-link")), "{e}");
        // A sender ID is not a link ID.
        assert!(set_status_offline(
            &dir.0,
            OfflineId::Link([&off[..], b"-snd"].concat()),
            QueueStatus::Active
        )
        .is_err());

        let l = MemoryStore::load(&dir.0, &[5, 9], None, 0).unwrap();
        assert_eq!(l.get(&off).unwrap().status, blocked);
        assert_eq!(l.get(&full).unwrap().status, QueueStatus::Active);
        assert_eq!(l.get(&bare), s.get(&bare));
        // The rewrite kept messages and notifications.
        assert_eq!(l.size(&full), 4);
        assert_eq!(l.size(&off), 1);
        let nid = [&full[..], b"-ntf"].concat();
        assert_eq!(block_on(l.take_ntfs(&nid, usize::MAX)).unwrap().0.len(), 2);
    }

    #[test]
    fn an_empty_blocking_notice_is_saved_as_none() {
        let dir = TempDir::new("notice");
        let q = rid_in(1, "q");
        let s = MemoryStore::new();
        let mut r = rec(&q);
        r.status = QueueStatus::Blocked(BlockingInfo {
            reason: BlockingReason::Spam,
            notice: Some(String::new()),
        });
        block_on(s.create(r)).unwrap();
        s.save(&dir.0, &[1]).unwrap();
        let l = MemoryStore::load(&dir.0, &[1], None, 0).unwrap();
        assert_eq!(
            l.get(&q).unwrap().status,
            QueueStatus::Blocked(BlockingInfo {
                reason: BlockingReason::Spam,
                notice: None
            })
        );
    }
}
