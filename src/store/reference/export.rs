//! `smp-relay store export-reference`: the way back. A stopped relay's store as the files the
//! reference smp-server starts on with `store_queues: memory` and `store_messages: memory`:
//! `smp-server-store.log` as its compaction writes it (`NEW_SERVICE` for every service, then
//! `CREATE` for every queue; simplexmq `StoreLog/ReadWrite.hs`, `writeQueueStore`),
//! `smp-server-messages.log` and `smp-server-ntfs.log` as its clean stop writes them
//! (`Server.hs`, `exportMessages`, `saveServerNtfs`).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{msg_log, ntf_log, store_log, JOURNAL_DIR, MSG_LOG_FILE, NTF_LOG_FILE, STORE_LOG_FILE};
use crate::crypto::hash::b64url;
use crate::store::services::ServiceRec;
use crate::store::transfer::{store_counts, Counts};
use crate::store::{Message, QueueStatus, ShardStore};

/// The reference's per-queue quota (hard-coded in its CLI): its start drops a queue's messages
/// beyond it.
pub const REFERENCE_QUOTA: usize = 128;

/// What an export wrote, and what the reference will not take as it is.
#[derive(Debug, Default)]
pub struct ExportReport {
    pub counts: Counts,
    /// Queues holding more messages than the reference's quota: its start keeps the first 128.
    pub over_quota: Vec<String>,
}

/// One file being written: `FILE.partial`, renamed to `FILE` once every file is complete.
struct Out {
    path: PathBuf,
    partial: PathBuf,
    w: std::io::BufWriter<std::fs::File>,
}

impl Out {
    fn create(dir: &Path, name: &str) -> Result<Out, String> {
        let path = dir.join(name);
        let partial = dir.join(format!("{name}.partial"));
        let f = std::fs::File::create(&partial)
            .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
        Ok(Out {
            path,
            partial,
            w: std::io::BufWriter::new(f),
        })
    }

    fn line(&mut self, l: &str) -> Result<(), String> {
        self.w
            .write_all(l.as_bytes())
            .and_then(|()| self.w.write_all(b"\n"))
            .map_err(|e| format!("cannot write {}: {e}", self.partial.display()))
    }

    fn finish(self) -> Result<(PathBuf, PathBuf), String> {
        let f = self
            .w
            .into_inner()
            .map_err(|e| format!("cannot write {}: {}", self.partial.display(), e.error()))?;
        f.sync_all()
            .map_err(|e| format!("cannot write {}: {e}", self.partial.display()))?;
        Ok((self.partial, self.path))
    }
}

/// Writes `store` and `services` into `dir` (created if missing), which must hold none of the
/// reference's files. On any error the partial files are removed and nothing is left.
pub async fn export<S: ShardStore>(
    store: &S,
    services: &[ServiceRec],
    dir: &Path,
    progress: &mut dyn FnMut(Counts),
) -> Result<ExportReport, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for name in [STORE_LOG_FILE, MSG_LOG_FILE, NTF_LOG_FILE, JOURNAL_DIR] {
        let p = dir.join(name);
        if p.exists() {
            return Err(format!(
                "{} exists; export-reference writes only where the reference has no data: choose \
                 another --to, or move it away",
                p.display()
            ));
        }
    }
    let mut outs = Vec::new();
    let result = write_all(store, services, dir, &mut outs, progress).await;
    let renamed = result.and_then(|report| {
        for (partial, path) in outs.drain(..) {
            std::fs::rename(&partial, &path).map_err(|e| {
                format!(
                    "cannot rename {} to {}: {e}",
                    partial.display(),
                    path.display()
                )
            })?;
        }
        Ok(report)
    });
    for (partial, _) in outs {
        let _ = std::fs::remove_file(partial);
    }
    if renamed.is_err() {
        for name in [STORE_LOG_FILE, MSG_LOG_FILE, NTF_LOG_FILE] {
            let _ = std::fs::remove_file(dir.join(format!("{name}.partial")));
        }
    }
    renamed
}

async fn write_all<S: ShardStore>(
    store: &S,
    services: &[ServiceRec],
    dir: &Path,
    outs: &mut Vec<(PathBuf, PathBuf)>,
    progress: &mut dyn FnMut(Counts),
) -> Result<ExportReport, String> {
    let mut log = Out::create(dir, STORE_LOG_FILE)?;
    let mut msgs = Out::create(dir, MSG_LOG_FILE)?;
    let mut ntfs = Out::create(dir, NTF_LOG_FILE)?;
    let mut report = ExportReport::default();
    let mut services: Vec<&ServiceRec> = services.iter().collect();
    services.sort_unstable_by(|a, b| a.service_id.cmp(&b.service_id));
    for s in services {
        let line = store_log::encode_service(s).ok_or_else(|| {
            format!(
                "the service {} has a certificate chain this relay cannot read back",
                b64url(&s.service_id)
            )
        })?;
        log.line(&line)?;
        report.counts.services += 1;
    }
    let mut rids = Vec::with_capacity(store.queue_count());
    store.for_each_queue(&mut |r| rids.push(r.recipient_id.clone()));
    rids.sort_unstable();
    let store_err = |e: crate::store::StoreError| e.to_string();
    for rid in rids {
        // A store that holds only the records in use reads this one first.
        store
            .prepare(&[rid.as_slice()], &|_| false)
            .await
            .map_err(store_err)?;
        let rec = store.get(&rid);
        store.release(&[rid.as_slice()]);
        let Some(mut rec) = rec else {
            continue;
        };
        // The reference reads a blocking notice to the end of the line, so a service ID after it
        // would be lost: it goes on a line of its own.
        let service_after = match (&rec.status, &rec.rcv_service_id) {
            (QueueStatus::Blocked(info), Some(_)) if info.notice.is_some() => {
                rec.rcv_service_id.take()
            }
            _ => None,
        };
        log.line(&store_log::encode_create(&rec))?;
        if let Some(s) = service_after {
            log.line(&format!("QUEUE_SERVICE {} R {}", b64url(&rid), b64url(&s)))?;
        }
        let queue_msgs = store.messages(&rid).await.map_err(store_err)?;
        let normal = queue_msgs
            .iter()
            .filter(|m| matches!(m, Message::Message { .. }))
            .count();
        if normal > REFERENCE_QUOTA {
            report.over_quota.push(b64url(&rid));
        }
        for m in &queue_msgs {
            msgs.line(&msg_log::encode_line(&rid, m))?;
        }
        report.counts.messages += queue_msgs.len() as u64;
        if let Some(n) = &rec.notifier {
            for ntf in store.ntfs(&n.notifier_id).await.map_err(store_err)? {
                ntfs.line(&ntf_log::encode_line(&n.notifier_id, &ntf))?;
                report.counts.ntfs += 1;
            }
        }
        report.counts.queues += 1;
        progress(report.counts);
    }
    let held = Counts {
        services: report.counts.services,
        ..store_counts(store).await.map_err(store_err)?
    };
    if held != report.counts {
        return Err(format!(
            "the store holds {held}, but {} were written",
            report.counts
        ));
    }
    for o in [log, msgs, ntfs] {
        outs.push(o.finish()?);
    }
    Ok(report)
}
