//! The consistency index: what a group's records say about queues, messages and notifications,
//! built in one pass over them in order by the relay's replay rules, with the checks that need no
//! decoding of the relay's payloads.
//!
//! One index for everything that judges records: the `smp-journal` tool (`stats`, `queues`,
//! `show`, `verify`), [`crate::repair`] (what a cut dropped means per queue) and the relay's
//! storage fault simulator, so that none of them has its own idea of what a replay makes of a
//! journal.
//!
//! The relay's replay (`src/store/journal.rs`, `replay`) meets records of queues whose older
//! records are gone: segments are removed oldest first once every record in them is dead, and
//! compacted, so a group's history may start later than its first record ("trimmed": its first
//! segment's first sequence number is past 1, it is compacted, or its sync slot says it is the
//! group's first). The replay creates a queue from a queue-update of an unknown recipient ID, and
//! parks a msg-append of an unknown queue until a queue-create or queue-update of that ID (the
//! queue then gets the parked messages first, in order); a queue-delete of that ID drops them, a
//! msg-delete removes one, and what is still parked at the end of the replay is dropped: messages
//! of a queue that has no record at all, lost. The index does the same, and:
//!
//! - in a trimmed group, a queue-update, queue-delete or msg-delete of an unknown queue (or
//!   message), and a msg-append of an unknown queue, are what trimming leaves behind, not issues;
//!   in a group whose history is whole they contradict the records before them and are issues;
//! - messages still parked at the end are an issue in every group: the relay drops them.
//!
//! Whether a group is trimmed is known once its first segment was read, which may be after
//! records were given to the index: [`Index::finish`] settles the issues that depend on it. Use
//! [`check_group`] (read and finish in one call) unless the records come from elsewhere.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use base64::Engine;

use crate::error::JournalError;
use crate::format::{Kind, MsgId, Record};
use crate::fs::{Fs, OsFs};
use crate::reader::{read_group_on, GroupReport};
use crate::{group_dir, group_of, segment_file_name, Location};

/// An ID as the relay and the `smp-journal` tool print IDs: base64url with padding.
pub fn b64(id: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE.encode(id)
}

/// A message appended and not deleted.
#[derive(Debug, Clone)]
pub struct Msg {
    pub seq: u64,
    pub loc: Location,
    pub id: MsgId,
    pub ts: i64,
    pub flags: u8,
    pub size: usize,
    /// Kept for the queue `show` asks for with `--bodies` only.
    pub body: Option<Vec<u8>>,
}

/// A live queue (created and not deleted) and its live messages in arrival order; or the
/// messages parked for a queue the index does not know (yet).
#[derive(Debug, Clone)]
pub struct Queue {
    /// By sequence number: arrival order.
    pub msgs: BTreeMap<u64, Msg>,
    by_id: HashMap<MsgId, u64>,
    pub msg_bytes: u64,
    /// The record that made the queue in this index: [`Kind::QueueCreate`], or
    /// [`Kind::QueueUpdate`] when its queue-create is not among the records (a trimmed group);
    /// [`Kind::MsgAppend`] for messages parked for a queue not known (yet).
    pub made_by: Kind,
}

impl Queue {
    fn new(made_by: Kind) -> Queue {
        Queue {
            msgs: BTreeMap::new(),
            by_id: HashMap::new(),
            msg_bytes: 0,
            made_by,
        }
    }
    pub fn oldest(&self) -> Option<&Msg> {
        self.msgs.values().next()
    }
    pub fn newest(&self) -> Option<&Msg> {
        self.msgs.values().next_back()
    }
    /// Whether message `id` is live in it.
    pub fn has(&self, id: &MsgId) -> bool {
        self.by_id.contains_key(id)
    }
    fn remove(&mut self, id: &MsgId) -> bool {
        match self.by_id.remove(id) {
            Some(s) => {
                if let Some(m) = self.msgs.remove(&s) {
                    self.msg_bytes -= m.size as u64;
                }
                true
            }
            None => false,
        }
    }
}

/// A queue record of the queue `show` asks for.
#[derive(Debug, Clone)]
pub struct QueueRec {
    pub kind: Kind,
    pub seq: u64,
    pub loc: Location,
    /// Payload bytes (ID included).
    pub payload: usize,
    /// Bytes of the relay's queue record (`QueueCreate`/`QueueUpdate`), 0 for a delete.
    pub data: usize,
}

/// Issues found so far, in record order, the first [`MAX_ISSUES`] kept.
#[derive(Debug, Clone, Default)]
struct Issues {
    list: Vec<(Location, String)>,
    count: u64,
}

impl Issues {
    fn push(&mut self, loc: Location, text: String) {
        self.count += 1;
        if self.list.len() < MAX_ISSUES {
            self.list.push((loc, text));
        }
    }
}

/// The queues, messages and notifications of one group.
#[derive(Debug, Clone)]
pub struct Index {
    pub group: u32,
    dir: PathBuf,
    /// The recipient ID `show` asks for, and whether to keep its message bodies.
    want: Option<(Vec<u8>, bool)>,
    pub queues: HashMap<Vec<u8>, Queue>,
    /// Messages of queues the index does not know (yet), per recipient ID, as the relay parks
    /// them. After [`Index::finish`]: the messages the relay drops.
    parked: HashMap<Vec<u8>, Queue>,
    /// Per notifier ID: notifications appended minus deleted since its last clear.
    pub ntfs: HashMap<Vec<u8>, u64>,
    /// The queue records of the wanted queue, in order.
    pub history: Vec<QueueRec>,
    /// Message records of the wanted queue: appended, deleted.
    pub history_msgs: (u64, u64),
    /// Records that contradict the ones before them, each naming the file and offset, in record
    /// order; complete after [`Index::finish`].
    pub issues: Vec<String>,
    /// How many issues there were (`issues` keeps the first [`MAX_ISSUES`]); complete after
    /// [`Index::finish`].
    pub issue_count: u64,
    /// Issues in any group.
    found: Issues,
    /// Issues only where the group's history is whole (not trimmed).
    unless_trimmed: Issues,
    /// What [`Index::finish`] was told.
    trimmed: Option<bool>,
}

/// Issues kept per group; the rest are only counted.
pub const MAX_ISSUES: usize = 100;

impl Index {
    /// An empty index of `group`, whose directory `dir` issues name. `want`: the recipient ID
    /// whose records `history` keeps, and whether to keep its message bodies.
    pub fn new(group: u32, dir: PathBuf, want: Option<(Vec<u8>, bool)>) -> Index {
        Index {
            group,
            dir,
            want,
            queues: HashMap::new(),
            parked: HashMap::new(),
            ntfs: HashMap::new(),
            history: Vec::new(),
            history_msgs: (0, 0),
            issues: Vec::new(),
            issue_count: 0,
            found: Issues::default(),
            unless_trimmed: Issues::default(),
            trimmed: None,
        }
    }

    fn text(&self, loc: Location, what: &str) -> String {
        format!(
            "{}: record at offset {}: {what}",
            self.dir.join(segment_file_name(loc.segment)).display(),
            loc.offset
        )
    }

    fn issue(&mut self, loc: Location, what: String) {
        let t = self.text(loc, &what);
        self.found.push(loc, t);
    }

    /// An issue only if the group turns out not to be trimmed.
    fn issue_unless_trimmed(&mut self, loc: Location, what: String) {
        let t = self.text(loc, &what);
        self.unless_trimmed.push(loc, t);
    }

    /// Live messages over all queues.
    pub fn messages(&self) -> u64 {
        self.queues.values().map(|q| q.msgs.len() as u64).sum()
    }

    /// Bytes of live message bodies.
    pub fn message_bytes(&self) -> u64 {
        self.queues.values().map(|q| q.msg_bytes).sum()
    }

    /// Pending notifications (appended minus deleted since each notifier's last clear).
    pub fn notifications(&self) -> u64 {
        self.ntfs.values().sum()
    }

    /// Messages parked for a queue the index does not know, by recipient ID (ascending): after
    /// [`Index::finish`], those the relay's replay drops (their queue has no record).
    pub fn parked(&self) -> Vec<(&[u8], &Queue)> {
        let mut v: Vec<(&[u8], &Queue)> =
            self.parked.iter().map(|(k, q)| (k.as_slice(), q)).collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Whether [`Index::finish`] was told the group is trimmed (`None` before it was called).
    pub fn trimmed(&self) -> Option<bool> {
        self.trimmed
    }

    /// Takes the next record of the group.
    pub fn record(&mut self, loc: Location, seq: u64, rec: &Record<'_>) {
        if let Some(id) = rec.id() {
            // Notifications are kept with their queue, whose recipient ID this crate never
            // sees with them: only recipient IDs can be checked.
            let recipient = !matches!(
                rec.kind(),
                Kind::NtfAppend | Kind::NtfDelete | Kind::NtfClear
            );
            if recipient && group_of(id) != self.group {
                let g = group_of(id);
                self.issue(
                    loc,
                    format!(
                        "{} for recipient ID {}, which belongs to group {g}, not {}",
                        rec.kind().name(),
                        b64(id),
                        self.group
                    ),
                );
            }
        }
        let wanted = match (&self.want, rec.id()) {
            (Some((w, _)), Some(id)) => w == id,
            _ => false,
        };
        let keep_body = wanted && self.want.as_ref().is_some_and(|w| w.1);
        match *rec {
            Record::QueueCreate { recipient_id, data }
            | Record::QueueUpdate { recipient_id, data } => {
                let create = rec.kind() == Kind::QueueCreate;
                let exists = self.queues.contains_key(recipient_id);
                if create && exists {
                    self.issue(
                        loc,
                        format!(
                            "queue-create for {}, which exists already",
                            b64(recipient_id)
                        ),
                    );
                } else if !create && !exists {
                    self.issue_unless_trimmed(
                        loc,
                        format!(
                            "queue-update for {}, which does not exist",
                            b64(recipient_id)
                        ),
                    );
                }
                if !exists {
                    // As the relay: the queue is made (from an update too), with the messages
                    // parked for it first.
                    let mut q = self
                        .parked
                        .remove(recipient_id)
                        .unwrap_or_else(|| Queue::new(rec.kind()));
                    q.made_by = rec.kind();
                    self.queues.insert(recipient_id.to_vec(), q);
                }
                if wanted {
                    self.history.push(QueueRec {
                        kind: rec.kind(),
                        seq,
                        loc,
                        payload: rec.payload_len(),
                        data: data.len(),
                    });
                }
            }
            Record::QueueDelete { recipient_id } => {
                let parked = self.parked.remove(recipient_id).is_some();
                if self.queues.remove(recipient_id).is_none() {
                    let why = if parked {
                        "which does not exist (its parked messages go with it)"
                    } else {
                        "which does not exist"
                    };
                    self.issue_unless_trimmed(
                        loc,
                        format!("queue-delete for {}, {why}", b64(recipient_id)),
                    );
                }
                if wanted {
                    self.history.push(QueueRec {
                        kind: rec.kind(),
                        seq,
                        loc,
                        payload: rec.payload_len(),
                        data: 0,
                    });
                }
            }
            Record::MsgAppend {
                recipient_id,
                msg_id,
                ts,
                flags,
                body,
            } => {
                if wanted {
                    self.history_msgs.0 += 1;
                }
                let known = self.queues.contains_key(recipient_id);
                let q = match self.queues.get_mut(recipient_id) {
                    Some(q) => q,
                    None => self
                        .parked
                        .entry(recipient_id.to_vec())
                        .or_insert_with(|| Queue::new(Kind::MsgAppend)),
                };
                let duplicate = q.by_id.contains_key(msg_id);
                if !duplicate {
                    q.by_id.insert(*msg_id, seq);
                    q.msg_bytes += body.len() as u64;
                    q.msgs.insert(
                        seq,
                        Msg {
                            seq,
                            loc,
                            id: *msg_id,
                            ts,
                            flags,
                            size: body.len(),
                            body: keep_body.then(|| body.to_vec()),
                        },
                    );
                }
                let what = |why: &str| {
                    format!(
                        "msg-append of message {} to queue {}, {why}",
                        b64(msg_id),
                        b64(recipient_id)
                    )
                };
                if duplicate {
                    self.issue(loc, what("which has a live message with this ID already"));
                } else if !known {
                    self.issue_unless_trimmed(loc, what("which does not exist"));
                }
            }
            Record::MsgDelete {
                recipient_id,
                msg_id,
            } => {
                if wanted {
                    self.history_msgs.1 += 1;
                }
                let problem = match self.queues.get_mut(recipient_id) {
                    Some(q) => (!q.remove(msg_id))
                        .then_some("a message that was never appended (or is deleted already)"),
                    None => {
                        if let Some(p) = self.parked.get_mut(recipient_id) {
                            p.remove(msg_id);
                            if p.msgs.is_empty() {
                                self.parked.remove(recipient_id);
                            }
                        }
                        Some("a queue that does not exist")
                    }
                };
                if let Some(why) = problem {
                    self.issue_unless_trimmed(
                        loc,
                        format!(
                            "msg-delete of message {} of queue {}: {why}",
                            b64(msg_id),
                            b64(recipient_id)
                        ),
                    );
                }
            }
            Record::NtfAppend { notifier_id, .. } => {
                *self.ntfs.entry(notifier_id.to_vec()).or_insert(0) += 1;
            }
            // The relay may delete a notification that was never stored (or cleared): its
            // payloads are opaque here, so this is not checked.
            Record::NtfDelete { notifier_id, .. } => {
                if let Some(n) = self.ntfs.get_mut(notifier_id) {
                    *n -= 1;
                    if *n == 0 {
                        self.ntfs.remove(notifier_id);
                    }
                }
            }
            Record::NtfClear { notifier_id } => {
                self.ntfs.remove(notifier_id);
            }
            Record::Checkpoint { .. } => {}
        }
    }

    /// Ends the replay: settles the issues that depend on whether the group is `trimmed` (see
    /// the module's comment; [`GroupReport::trimmed`] says it of a group read by the reader) and
    /// adds one for each queue whose parked messages are left (the relay drops them). Then
    /// `issues` and `issue_count` are complete. Call it once, after the last record.
    pub fn finish(&mut self, trimmed: bool) {
        assert!(self.trimmed.is_none(), "Index::finish is called once");
        self.trimmed = Some(trimmed);
        let mut all = std::mem::take(&mut self.found);
        let cond = std::mem::take(&mut self.unless_trimmed);
        if !trimmed {
            // Both lists are in record order and each holds its first `MAX_ISSUES`: so do the
            // first `MAX_ISSUES` of the two merged.
            all.list.extend(cond.list);
            all.list.sort_by_key(|(loc, _)| *loc);
            all.list.truncate(MAX_ISSUES);
            all.count += cond.count;
        }
        let left: Vec<(Location, String)> = self
            .parked()
            .into_iter()
            .filter_map(|(id, q)| {
                let first = q.oldest()?;
                Some((
                    first.loc,
                    format!(
                        "{} message(s) of queue {}, which has no record: the relay drops them",
                        q.msgs.len(),
                        b64(id)
                    ),
                ))
            })
            .collect();
        for (loc, what) in left {
            let t = self.text(loc, &what);
            all.push(loc, t);
        }
        self.issue_count = all.count;
        self.issues = all.list.into_iter().map(|(_, t)| t).collect();
    }
}

/// Reads `group` under `root` with the inspection reader ([`crate::reader::read_group`]) into a
/// finished [`Index`] (`want`: see [`Index::new`]).
pub fn check_group(
    root: &Path,
    group: u32,
    want: Option<(Vec<u8>, bool)>,
) -> Result<(GroupReport, Index), JournalError> {
    check_group_on(&OsFs, root, group, want)
}

/// [`check_group`] on the file system `fs`.
pub fn check_group_on<F: Fs>(
    fs: &F,
    root: &Path,
    group: u32,
    want: Option<(Vec<u8>, bool)>,
) -> Result<(GroupReport, Index), JournalError> {
    let mut index = Index::new(group, group_dir(root, group), want);
    let report = read_group_on(fs, root, group, |loc, seq, rec| {
        index.record(loc, seq, &rec);
        Ok(())
    })?;
    index.finish(report.trimmed());
    Ok((report, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recipient ID of group 0, so that the group check says nothing.
    fn rid(n: u8) -> Vec<u8> {
        (0u32..)
            .map(|k| {
                let mut id = vec![n; 8];
                id.extend_from_slice(&k.to_le_bytes());
                id
            })
            .find(|id| group_of(id) == 0)
            .unwrap()
    }

    fn mid(n: u8) -> MsgId {
        [n; 24]
    }

    /// An index of group 0 fed `recs` in order (record `i` at segment 2, offset 4096 + 64 i).
    fn index_of(recs: &[Record<'_>], trimmed: bool) -> Index {
        let mut ix = Index::new(0, PathBuf::from("/j/g00"), None);
        for (i, r) in recs.iter().enumerate() {
            let loc = Location {
                segment: 2,
                offset: 4096 + 64 * i as u64,
            };
            ix.record(loc, 100 + i as u64, r);
        }
        ix.finish(trimmed);
        ix
    }

    fn append<'a>(q: &'a [u8], m: &'a MsgId) -> Record<'a> {
        Record::MsgAppend {
            recipient_id: q,
            msg_id: m,
            ts: 0,
            flags: 0,
            body: b"body",
        }
    }

    fn msg_ids(ix: &Index, q: &[u8]) -> Vec<MsgId> {
        ix.queues[q].msgs.values().map(|m| m.id).collect()
    }

    #[test]
    fn parked_messages_go_to_the_queue_an_update_makes_first_and_in_order() {
        let (q, m1, m2, m3) = (rid(1), mid(1), mid(2), mid(3));
        let recs = [
            append(&q, &m1),
            append(&q, &m2),
            Record::QueueUpdate {
                recipient_id: &q,
                data: b"r",
            },
            append(&q, &m3),
        ];
        // Trimmed: what retiring leaves, no issue.
        let ix = index_of(&recs, true);
        assert_eq!(ix.issues, Vec::<String>::new());
        assert_eq!(msg_ids(&ix, &q), [m1, m2, m3]);
        assert_eq!(ix.queues[&q].made_by, Kind::QueueUpdate);
        assert_eq!(ix.messages(), 3);
        assert!(ix.parked().is_empty());
        // Whole history: the same state, and the two appends and the update are issues.
        let ix = index_of(&recs, false);
        assert_eq!(msg_ids(&ix, &q), [m1, m2, m3]);
        assert_eq!(ix.issue_count, 3, "{:?}", ix.issues);
        assert!(
            ix.issues[0].contains("/j/g00/seg-000000002.jnl: record at offset 4096: msg-append")
        );
        assert!(
            ix.issues[0].ends_with("which does not exist"),
            "{:?}",
            ix.issues
        );
        assert!(
            ix.issues[2].contains("offset 4224: queue-update for"),
            "{:?}",
            ix.issues
        );
    }

    #[test]
    fn a_create_adopts_parked_messages_too() {
        let (q, m1) = (rid(1), mid(1));
        let recs = [
            append(&q, &m1),
            Record::QueueCreate {
                recipient_id: &q,
                data: b"r",
            },
        ];
        let ix = index_of(&recs, true);
        assert!(ix.issues.is_empty(), "{:?}", ix.issues);
        assert_eq!(msg_ids(&ix, &q), [m1]);
        assert_eq!(ix.queues[&q].made_by, Kind::QueueCreate);
        assert_eq!(index_of(&recs, false).issue_count, 1);
    }

    #[test]
    fn parked_messages_left_at_the_end_are_an_issue_in_every_group() {
        let (q, other, m1, m2, m3) = (rid(1), rid(2), mid(1), mid(2), mid(3));
        let recs = [
            append(&q, &m1),
            append(&q, &m2),
            append(&q, &m3),
            // A msg-delete removes a parked message.
            Record::MsgDelete {
                recipient_id: &q,
                msg_id: &m2,
            },
            Record::QueueCreate {
                recipient_id: &other,
                data: b"r",
            },
        ];
        let ix = index_of(&recs, true);
        let want = format!(
            "/j/g00/seg-000000002.jnl: record at offset 4096: 2 message(s) of queue {}, which \
             has no record: the relay drops them",
            b64(&q)
        );
        assert_eq!(ix.issues, std::slice::from_ref(&want));
        assert_eq!(ix.issue_count, 1);
        let parked = ix.parked();
        assert_eq!(parked.len(), 1);
        assert_eq!(parked[0].0, q.as_slice());
        assert_eq!(parked[0].1.msgs.len(), 2);
        // Not counted among the live messages.
        assert_eq!(ix.messages(), 0);
        // Untrimmed: the three appends and the delete too, the leftover last.
        let ix = index_of(&recs, false);
        assert_eq!(ix.issue_count, 5, "{:?}", ix.issues);
        assert_eq!(ix.issues[4], want);
        assert!(
            ix.issues[3].contains("msg-delete of message"),
            "{:?}",
            ix.issues
        );
        assert!(ix.issues[3].ends_with("a queue that does not exist"));
    }

    #[test]
    fn a_queue_delete_drops_parked_messages() {
        let (q, m1) = (rid(1), mid(1));
        let recs = [append(&q, &m1), Record::QueueDelete { recipient_id: &q }];
        let ix = index_of(&recs, true);
        assert!(ix.issues.is_empty(), "{:?}", ix.issues);
        assert!(ix.parked().is_empty());
        assert!(ix.queues.is_empty());
        let ix = index_of(&recs, false);
        assert_eq!(ix.issue_count, 2, "{:?}", ix.issues);
        assert!(ix.issues[1].contains("its parked messages go with it"));
    }

    #[test]
    fn unknown_queues_and_messages_are_issues_only_where_the_history_is_whole() {
        let (q, gone, m1, m9) = (rid(1), rid(2), mid(1), mid(9));
        let recs = [
            Record::QueueCreate {
                recipient_id: &q,
                data: b"r",
            },
            append(&q, &m1),
            // A message appended before the first record that is left.
            Record::MsgDelete {
                recipient_id: &q,
                msg_id: &m9,
            },
            // A queue whose records are all before.
            Record::MsgDelete {
                recipient_id: &gone,
                msg_id: &m9,
            },
            Record::QueueDelete {
                recipient_id: &gone,
            },
        ];
        let ix = index_of(&recs, true);
        assert!(ix.issues.is_empty(), "{:?}", ix.issues);
        assert_eq!(msg_ids(&ix, &q), [m1]);
        let ix = index_of(&recs, false);
        assert_eq!(ix.issue_count, 3, "{:?}", ix.issues);
        assert!(ix.issues[0].contains("never appended"));
        assert!(ix.issues[1].contains("a queue that does not exist"));
        assert!(ix.issues[2].contains("queue-delete for"));
    }

    #[test]
    fn contradictions_stay_issues_in_a_trimmed_group() {
        let (q, m1) = (rid(1), mid(1));
        let recs = [
            Record::QueueCreate {
                recipient_id: &q,
                data: b"r",
            },
            Record::QueueCreate {
                recipient_id: &q,
                data: b"r",
            },
            append(&q, &m1),
            append(&q, &m1),
        ];
        let ix = index_of(&recs, true);
        assert_eq!(ix.issue_count, 2, "{:?}", ix.issues);
        assert!(ix.issues[0].contains("exists already"));
        assert!(ix.issues[1].contains("a live message with this ID already"));
    }

    #[test]
    fn issues_are_merged_in_record_order_and_capped() {
        let q = rid(1);
        let ids: Vec<MsgId> = (0..=255u8).map(mid).collect();
        let mut recs = vec![Record::QueueCreate {
            recipient_id: &q,
            data: b"r",
        }];
        for m in &ids[..75] {
            // An unknown message (an issue unless trimmed), then a second create (always).
            recs.push(Record::MsgDelete {
                recipient_id: &q,
                msg_id: m,
            });
            recs.push(Record::QueueCreate {
                recipient_id: &q,
                data: b"r",
            });
        }
        let ix = index_of(&recs, false);
        assert_eq!(ix.issue_count, 150);
        assert_eq!(ix.issues.len(), MAX_ISSUES);
        for (i, t) in ix.issues.iter().enumerate() {
            let what = if i % 2 == 0 {
                "never appended"
            } else {
                "exists already"
            };
            assert!(t.contains(what), "{i}: {t}");
            assert!(
                t.contains(&format!("offset {}:", 4096 + 64 * (i + 1))),
                "{i}: {t}"
            );
        }
        let ix = index_of(&recs, true);
        assert_eq!(ix.issue_count, 75);
        assert_eq!(ix.issues.len(), 75);
    }
}
