//! The reference smp-server's data files, read by `smp-relay store import-reference`
//! (`docs/ARCHITECTURE.md` §5, "Moving from smp-server"): its queue store log, the memory store's
//! message log or the journal store's directory, and the notification log, turned into this relay's
//! records ([`QueueData`], [`ServiceRec`]), which the import restores through the same path as a
//! `store import` stream (`store/transfer.rs`, [`QueueSource`]).
//!
//! Each format is a pure parser with its own module; this one reads a directory and applies the
//! reference's rules for what it reads at start: a line that does not parse is reported with its
//! file and line and skipped, records and messages for queues the store log does not hold are
//! reported and left out (simplexmq `StoreLog/ReadWrite.hs`, `readQueueStore`; `Server.hs`,
//! `importMessages`, `restoreServerNtfs`). The reference's files are only read, never changed.

pub mod export;
pub mod journal_dir;
pub mod msg_log;
pub mod ntf_log;
pub mod store_log;
mod text;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use super::services::ServiceRec;
use super::transfer::{Counts, QueueSource, TransferError};
use super::{EntityId, Message, QueueData, StoreKind};
use text::Line;

/// The reference's queue store log (`[STORE_LOG] enable = on`, `store_queues: memory`).
pub const STORE_LOG_FILE: &str = "smp-server-store.log";
/// The memory message store's messages, written at a clean stop.
pub const MSG_LOG_FILE: &str = "smp-server-messages.log";
/// The pending notifications, written at a clean stop.
pub const NTF_LOG_FILE: &str = "smp-server-ntfs.log";
pub use journal_dir::JOURNAL_DIR;

/// Problems kept to be shown; more are counted only.
pub const MAX_KEPT_PROBLEMS: usize = 1000;

/// A line or file that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is the whole file.
    pub line: usize,
    pub what: String,
}

impl Problem {
    pub fn new(file: &Path, line: usize, what: impl Into<String>) -> Self {
        Problem {
            file: file.to_path_buf(),
            line,
            what: what.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file.display(), self.what),
            n => write!(f, "{}:{n}: {}", self.file.display(), self.what),
        }
    }
}

/// Problems of one kind: the first [`MAX_KEPT_PROBLEMS`] and how many there were.
#[derive(Debug, Default, Clone)]
pub struct Problems {
    pub kept: Vec<Problem>,
    pub total: usize,
}

impl Problems {
    pub fn push(&mut self, p: Problem) {
        self.total += 1;
        if self.kept.len() < MAX_KEPT_PROBLEMS {
            self.kept.push(p);
        }
    }
}

/// What reading the reference's files found besides the data.
#[derive(Debug, Default, Clone)]
pub struct ReadReport {
    /// The store log that was read (`<log>.start` after an interrupted compaction).
    pub store_log: PathBuf,
    /// Where the messages came from: the message log, the journal directory, or neither.
    pub messages_from: Option<PathBuf>,
    pub notifications_from: Option<PathBuf>,
    /// Lines that do not parse, skipped.
    pub unparseable: Problems,
    /// Records and messages the reference would not apply either (unknown or deleted queues,
    /// taken IDs), left out.
    pub ignored: Problems,
}

/// The reference's data as this relay's records.
pub struct ReferenceData {
    /// In the order of their IDs.
    pub services: Vec<ServiceRec>,
    /// In the order of their recipient IDs.
    pub queues: Vec<QueueData>,
    pub report: ReadReport,
}

/// Which of the reference's data files `dir` holds (a start refuses to serve an empty store
/// beside them).
pub fn files_present(dir: &Path) -> Vec<&'static str> {
    let mut found = Vec::new();
    for f in [STORE_LOG_FILE, MSG_LOG_FILE, NTF_LOG_FILE] {
        if dir.join(f).is_file() {
            found.push(f);
        }
    }
    if dir.join(format!("{STORE_LOG_FILE}.start")).is_file() && !found.contains(&STORE_LOG_FILE) {
        found.push(STORE_LOG_FILE);
    }
    if dir.join(JOURNAL_DIR).is_dir() {
        found.push(JOURNAL_DIR);
    }
    found
}

/// The start-up check (the reference's `checkMsgStoreMode` refuses inconsistent data likewise):
/// a data directory with the reference's files and no store of this relay is refused, so that an
/// operator never starts an empty relay beside the users' queues; with a store of this relay,
/// the warning to log (the reference's files are kept, for going back, but not read).
pub fn check_start(data_dir: &Path, kind: StoreKind) -> Result<Option<String>, String> {
    let present = files_present(data_dir);
    if present.is_empty() {
        return Ok(None);
    }
    let d = data_dir.display();
    let files = present.join(", ");
    // A store's directory counts even without queues in it: an imported empty store is one.
    let has_store = StoreKind::found_in(data_dir).is_some()
        || [
            super::memory::MEMORY_STORE_DIR,
            super::journal::JOURNAL_STORE_DIR,
            super::postgres::POSTGRES_STORE_DIR,
        ]
        .iter()
        .any(|d| data_dir.join(d).is_dir());
    if !has_store {
        let pg = if kind == StoreKind::Postgres {
            " --database CONNINFO --schema NAME"
        } else {
            ""
        };
        return Err(format!(
            "{d} holds the reference smp-server's data ({files}) and no smp-relay store yet; \
             starting would serve an empty relay. Stop smp-server, then import its data: \
             `smp-relay --log-dir {d} store import-reference --store {kind}{pg}` (its files are \
             only read, and stay for going back), and start again; or move those files out of {d} \
             to start an empty relay",
            kind = kind.name()
        ));
    }
    Ok(Some(format!(
        "{d} also holds the reference smp-server's data ({files}); this relay serves its own \
         store and does not read them (they stay for going back)"
    )))
}

/// Reads the reference's data from `dir`.
pub fn read_dir(dir: &Path) -> Result<ReferenceData, String> {
    let mut report = ReadReport::default();
    let log = dir.join(STORE_LOG_FILE);
    let start = dir.join(format!("{STORE_LOG_FILE}.start"));
    let msg_log = dir.join(MSG_LOG_FILE);
    let journal = dir.join(JOURNAL_DIR);
    // After a compaction the reference did not finish, `<log>.start` is the complete previous
    // log; its next start would use it (and keep the other as `.bak`).
    report.store_log = if start.is_file() { start } else { log };
    if !report.store_log.is_file() {
        let others = files_present(dir);
        return Err(if others.is_empty() {
            format!(
                "{} holds none of the reference smp-server's files ({STORE_LOG_FILE}, \
                 {MSG_LOG_FILE}, {JOURNAL_DIR}/); pass its log directory (default \
                 /var/opt/simplex) with --from",
                dir.display()
            )
        } else {
            format!(
                "{} has {} but no {STORE_LOG_FILE}, where the reference keeps its queues \
                 (store_queues: memory); if smp-server kept them in PostgreSQL, write the log \
                 first with `smp-server database export`",
                dir.display(),
                others.join(", ")
            )
        });
    }
    if msg_log.is_file() && journal.is_dir() {
        return Err(format!(
            "{} holds both {MSG_LOG_FILE} and {JOURNAL_DIR}/, and the reference starts on neither \
             (one of them is left from another store_messages setting); move the one \
             smp-server did not use last out of the directory",
            dir.display()
        ));
    }

    let mut replay = store_log::Replay::default();
    for_lines(
        &report.store_log.clone(),
        &mut report,
        |line, report, at| match store_log::parse_line(line) {
            Ok(rec) => {
                if let Err(why) = replay.apply(rec) {
                    report.ignored.push(Problem::new(at.0, at.1, why));
                }
            }
            Err(e) => report.unparseable.push(Problem::new(at.0, at.1, e)),
        },
    )?;
    let (services, recs) = replay.finish();
    let service_ids: HashSet<&EntityId> = services.iter().map(|s| &s.service_id).collect();
    let mut queues: Vec<QueueData> = Vec::with_capacity(recs.len());
    let mut index: HashMap<EntityId, usize> = HashMap::with_capacity(recs.len());
    let mut by_notifier: HashMap<EntityId, usize> = HashMap::new();
    for mut rec in recs {
        // A service the log does not hold cannot be associated (on PostgreSQL a foreign key).
        let unknown = |id: &Option<EntityId>| id.as_ref().is_some_and(|s| !service_ids.contains(s));
        let rid_text = crate::crypto::hash::b64url(&rec.recipient_id);
        if unknown(&rec.rcv_service_id) {
            rec.rcv_service_id = None;
            report.ignored.push(Problem::new(
                &report.store_log,
                0,
                format!("the queue {rid_text} names a service the log does not hold; association dropped"),
            ));
        }
        if let Some(n) = rec.notifier.as_mut() {
            if unknown(&n.ntf_service_id) {
                n.ntf_service_id = None;
                report.ignored.push(Problem::new(
                    &report.store_log,
                    0,
                    format!("the notifier of the queue {rid_text} names a service the log does not hold; association dropped"),
                ));
            }
            by_notifier.insert(n.notifier_id.clone(), queues.len());
        }
        index.insert(rec.recipient_id.clone(), queues.len());
        queues.push(QueueData {
            rec,
            msgs: Vec::new(),
            ntfs: Vec::new(),
        });
    }

    if msg_log.is_file() {
        report.messages_from = Some(msg_log.clone());
        for_lines(
            &msg_log,
            &mut report,
            |line, report, at| match msg_log::parse_line(line) {
                Ok((rid, m)) => match index.get(&rid) {
                    Some(&i) => queues[i].msgs.push(m),
                    None => report.ignored.push(Problem::new(
                        at.0,
                        at.1,
                        format!(
                            "a message for the queue {}, which the store log does not hold",
                            crate::crypto::hash::b64url(&rid)
                        ),
                    )),
                },
                Err(e) => report.unparseable.push(Problem::new(at.0, at.1, e)),
            },
        )?;
    } else if journal.is_dir() {
        report.messages_from = Some(journal.clone());
        for q in &mut queues {
            q.msgs =
                journal_dir::read_queue(&journal, &q.rec.recipient_id, &mut report.unparseable)?;
        }
        for rid in journal_dir::queues_in(&journal)? {
            if !index.contains_key(&rid) {
                report.ignored.push(Problem::new(
                    &journal_dir::queue_dir(&journal, &rid),
                    0,
                    "the messages of a queue the store log does not hold",
                ));
            }
        }
    }
    for q in &mut queues {
        drop_inner_markers(q, report.messages_from.as_deref(), &mut report.ignored);
    }

    let ntf_log = dir.join(NTF_LOG_FILE);
    if ntf_log.is_file() {
        report.notifications_from = Some(ntf_log.clone());
        for_lines(
            &ntf_log,
            &mut report,
            |line, report, at| {
                match ntf_log::parse_line(line) {
                Ok((nid, n)) => match by_notifier.get(&nid) {
                    Some(&i) => queues[i].ntfs.push(n),
                    None => report.ignored.push(Problem::new(
                        at.0,
                        at.1,
                        format!(
                            "a notification for the notifier {}, which no queue of the store log has",
                            crate::crypto::hash::b64url(&nid)
                        ),
                    )),
                },
                Err(e) => report.unparseable.push(Problem::new(at.0, at.1, e)),
            }
            },
        )?;
    }
    Ok(ReferenceData {
        services,
        queues,
        report,
    })
}

/// A quota marker is a queue's last message (writes stop until the queue is drained); one that
/// another message follows is dropped, as the reference's import merges a marker at the head of
/// a queue with the next one.
fn drop_inner_markers(q: &mut QueueData, from: Option<&Path>, ignored: &mut Problems) {
    let n = q.msgs.len();
    let before = q.msgs.len();
    let mut i = 0;
    q.msgs.retain(|m| {
        i += 1;
        !(matches!(m, Message::Quota { .. }) && i < n)
    });
    if q.msgs.len() != before {
        ignored.push(Problem::new(
            from.unwrap_or(Path::new("")),
            0,
            format!(
                "{} quota markers of the queue {} were followed by messages; dropped",
                before - q.msgs.len(),
                crate::crypto::hash::b64url(&q.rec.recipient_id)
            ),
        ));
    }
}

/// Calls `each` with every line of `path` and its place (file, 1-based line number); lines that
/// are too long or not text are reported as unparseable.
fn for_lines(
    path: &Path,
    report: &mut ReadReport,
    mut each: impl FnMut(&str, &mut ReadReport, (&Path, usize)),
) -> Result<(), String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut input = std::io::BufReader::with_capacity(64 * 1024, file);
    let mut buf = Vec::new();
    let mut n = 0;
    while let Some(line) = text::read_line(&mut input, &mut buf)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
    {
        n += 1;
        match line {
            Line::Text(l) if l.is_empty() => {}
            Line::Text(l) => each(&l, report, (path, n)),
            Line::Bad(why) => report.unparseable.push(Problem::new(path, n, why)),
        }
    }
    Ok(())
}

/// The reference's data as a source of queues for the import (`store/transfer.rs`): it records
/// no counts of its own, so what was read is what the store must hold.
pub struct ReferenceSource {
    services: Vec<ServiceRec>,
    queues: std::vec::IntoIter<QueueData>,
    read: Counts,
    position: u64,
}

impl ReferenceSource {
    pub fn new(services: Vec<ServiceRec>, queues: Vec<QueueData>) -> Self {
        ReferenceSource {
            read: Counts {
                services: services.len() as u64,
                ..Counts::default()
            },
            services,
            queues: queues.into_iter(),
            position: 0,
        }
    }
}

impl QueueSource for ReferenceSource {
    fn services(&self) -> &[ServiceRec] {
        &self.services
    }

    fn next_queue(&mut self) -> Result<Option<(QueueData, u64)>, TransferError> {
        let Some(q) = self.queues.next() else {
            return Ok(None);
        };
        self.position += 1;
        self.read.queues += 1;
        self.read.messages += q.msgs.len() as u64;
        self.read.ntfs += q.ntfs.len() as u64;
        Ok(Some((q, self.position)))
    }

    fn read_counts(&self) -> Counts {
        self.read
    }

    fn recorded_counts(&self) -> Option<Counts> {
        None
    }

    fn refuse(&self, position: u64, reason: String) -> TransferError {
        TransferError::Source(format!("the reference's queue number {position}: {reason}"))
    }
}

/// The counts of what [`read_dir`] found.
pub fn counts(data: &ReferenceData) -> Counts {
    Counts {
        queues: data.queues.len() as u64,
        messages: data.queues.iter().map(|q| q.msgs.len() as u64).sum(),
        ntfs: data.queues.iter().map(|q| q.ntfs.len() as u64).sum(),
        services: data.services.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("smp-relay-reference-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_start_beside_the_reference_files_needs_a_store_of_its_own() {
        let d = temp("start");
        assert_eq!(
            check_start(&d, StoreKind::Journal),
            Ok(None),
            "nothing there"
        );
        std::fs::write(d.join(STORE_LOG_FILE), "").unwrap();
        let e = check_start(&d, StoreKind::Memory).unwrap_err();
        assert!(
            e.contains("store import-reference --store memory"),
            "names the import: {e}"
        );
        // An imported store without queues is a store: its directory is there.
        std::fs::create_dir(d.join(crate::store::memory::MEMORY_STORE_DIR)).unwrap();
        let w = check_start(&d, StoreKind::Memory).unwrap().unwrap();
        assert!(w.contains("does not read them"), "{w}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_marker_followed_by_messages_is_dropped() {
        let rec = store_log::parse_line(&format!(
            "CREATE rid=cmlk rk={} rdh={} sid=c2lk sk=",
            crate::crypto::hash::b64url(
                &crate::crypto::keys::PublicAuthKey::Ed25519([1; 32]).to_spki()
            ),
            crate::crypto::hash::b64url(&[2; 32])
        ))
        .unwrap();
        let store_log::LogRecord::Create(rec) = rec else {
            panic!()
        };
        let m = |n: u8| Message::Message {
            msg_id: [n; 24],
            ts: 1,
            notification: false,
            body: std::rc::Rc::from(&b"x"[..]),
        };
        let q = |n: u8| Message::Quota {
            msg_id: [n; 24],
            ts: 1,
        };
        let mut data = QueueData {
            rec,
            msgs: vec![m(1), q(2), q(3), m(4), q(5)],
            ntfs: Vec::new(),
        };
        let mut ignored = Problems::default();
        drop_inner_markers(&mut data, None, &mut ignored);
        assert_eq!(data.msgs, vec![m(1), m(4), q(5)]);
        assert_eq!(ignored.total, 1);
        assert!(data.check().is_ok());
    }
}
