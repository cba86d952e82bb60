//! What a group's records say about queues, messages and notifications, built in one pass over
//! them in order, with the consistency checks that need no decoding of the relay's payloads.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use smp_journal::{group_of, segment_file_name, Kind, Location, MsgId, Record};

/// A message appended and not deleted.
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

/// A live queue (created and not deleted) and its live messages in arrival order.
#[derive(Default)]
pub struct Queue {
    /// By sequence number: arrival order.
    pub msgs: BTreeMap<u64, Msg>,
    by_id: HashMap<MsgId, u64>,
    pub msg_bytes: u64,
}

impl Queue {
    pub fn oldest(&self) -> Option<&Msg> {
        self.msgs.values().next()
    }
    pub fn newest(&self) -> Option<&Msg> {
        self.msgs.values().next_back()
    }
}

/// A queue record of the queue `show` asks for.
pub struct QueueRec {
    pub kind: Kind,
    pub seq: u64,
    pub loc: Location,
    /// Payload bytes (ID included).
    pub payload: usize,
    /// Bytes of the relay's queue record (`QueueCreate`/`QueueUpdate`), 0 for a delete.
    pub data: usize,
}

/// The queues, messages and notifications of one group.
pub struct Index {
    pub group: u32,
    dir: PathBuf,
    /// The recipient ID `show` asks for, and whether to keep its message bodies.
    want: Option<(Vec<u8>, bool)>,
    pub queues: HashMap<Vec<u8>, Queue>,
    /// Per notifier ID: notifications appended minus deleted since its last clear.
    pub ntfs: HashMap<Vec<u8>, u64>,
    /// The queue records of the wanted queue, in order.
    pub history: Vec<QueueRec>,
    /// Message records of the wanted queue: appended, deleted.
    pub history_msgs: (u64, u64),
    /// Records that contradict the ones before them, each naming the file and offset.
    pub issues: Vec<String>,
    /// How many issues there were (`issues` keeps the first [`MAX_ISSUES`]).
    pub issue_count: u64,
}

/// Issues kept per group; the rest are only counted.
pub const MAX_ISSUES: usize = 100;

impl Index {
    pub fn new(group: u32, dir: PathBuf, want: Option<(Vec<u8>, bool)>) -> Index {
        Index {
            group,
            dir,
            want,
            queues: HashMap::new(),
            ntfs: HashMap::new(),
            history: Vec::new(),
            history_msgs: (0, 0),
            issues: Vec::new(),
            issue_count: 0,
        }
    }

    fn issue(&mut self, loc: Location, what: String) {
        self.issue_count += 1;
        if self.issues.len() < MAX_ISSUES {
            self.issues.push(format!(
                "{}: record at offset {}: {what}",
                self.dir.join(segment_file_name(loc.segment)).display(),
                loc.offset
            ));
        }
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
                        crate::b64(id),
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
                            crate::b64(recipient_id)
                        ),
                    );
                } else if !create && !exists {
                    self.issue(
                        loc,
                        format!(
                            "queue-update for {}, which does not exist",
                            crate::b64(recipient_id)
                        ),
                    );
                }
                if create && !exists {
                    self.queues.insert(recipient_id.to_vec(), Queue::default());
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
                if self.queues.remove(recipient_id).is_none() {
                    self.issue(
                        loc,
                        format!(
                            "queue-delete for {}, which does not exist",
                            crate::b64(recipient_id)
                        ),
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
                let problem = match self.queues.get_mut(recipient_id) {
                    None => Some("which does not exist"),
                    Some(q) if q.by_id.contains_key(msg_id) => {
                        Some("which has a live message with this ID already")
                    }
                    Some(q) => {
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
                        None
                    }
                };
                if let Some(why) = problem {
                    self.issue(
                        loc,
                        format!(
                            "msg-append of message {} to queue {}, {why}",
                            crate::b64(msg_id),
                            crate::b64(recipient_id)
                        ),
                    );
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
                    None => Some("a queue that does not exist"),
                    Some(q) => match q.by_id.remove(msg_id) {
                        None => Some("a message that was never appended (or is deleted already)"),
                        Some(s) => {
                            if let Some(m) = q.msgs.remove(&s) {
                                q.msg_bytes -= m.size as u64;
                            }
                            None
                        }
                    },
                };
                if let Some(why) = problem {
                    self.issue(
                        loc,
                        format!(
                            "msg-delete of message {} of queue {}: {why}",
                            crate::b64(msg_id),
                            crate::b64(recipient_id)
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
}
