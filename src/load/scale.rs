//! `smp-load scale`: a data directory that holds many queues, made quickly through the store's own
//! import path. The queues of a `setup` file (whose keys the scenarios hold) are exported from
//! their data directory by `smp-relay store export`, and the stream is piped into `smp-relay store
//! import` on a new data directory with `idle` queues added after them: messaging queues that no
//! scenario uses, plain (recipient and sender keys) or with a notifier and short-link data
//! ([`Extras`]). The start
//! time, RssAnon per queue and the storm over the setup's queues among them are then measured on
//! that directory by `restart-time` and `storm --data-dir` (`benches/README.md`, "Scale").

use std::io::{BufReader, BufWriter};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use rand::RngCore;

use crate::crypto::keys::PublicAuthKey;
use crate::protocol::command::QueueMode;
use crate::store::transfer::{Counts, StreamReader, StreamWriter};
use crate::store::{NotifierCreds, QueueData, QueueLink, QueueRec, QueueStatus, StoreKind};

/// What `fill` wrote.
#[derive(Debug, Clone, Copy)]
pub struct Filled {
    /// The setup's queues, copied.
    pub copied: u64,
    /// Idle queues added.
    pub added: u64,
    pub counts: Counts,
}

/// What the idle queues carry besides their keys, to measure what each part costs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extras {
    /// A notifier (its ID, key and DH secret; no service).
    pub notifier: bool,
    /// Short-link data: a link ID and `LINK_DATA_BYTES` each of fixed and user data.
    pub link: bool,
}

/// Bytes of fixed and of user data in an idle queue's short link (`Extras::link`).
pub const LINK_DATA_BYTES: usize = 256;

/// One idle queue: random IDs and DH secret; `key` as both the recipient's and the sender's key
/// (the record must hold valid keys, and no one signs for these queues), and the notifier's. Its
/// `updated_at` is `day`, as a queue used that day.
pub fn idle_queue(
    rng: &mut impl RngCore,
    key: &PublicAuthKey,
    day: i64,
    extras: Extras,
) -> QueueData {
    let id = |rng: &mut dyn RngCore| {
        let mut b = vec![0u8; 24];
        rng.fill_bytes(&mut b);
        b
    };
    let (recipient_id, sender_id) = (id(rng), id(rng));
    let link = extras.link.then(|| {
        let link_id = id(rng);
        let mut data = vec![0u8; 2 * LINK_DATA_BYTES];
        rng.fill_bytes(&mut data);
        let user = data.split_off(LINK_DATA_BYTES);
        Box::new(QueueLink {
            link_id,
            fixed: data,
            user,
        })
    });
    let notifier = extras.notifier.then(|| {
        let notifier_id = id(rng);
        let mut rcv_ntf_dh_secret = [0u8; 32];
        rng.fill_bytes(&mut rcv_ntf_dh_secret);
        Box::new(NotifierCreds {
            notifier_id,
            notifier_key: key.clone(),
            rcv_ntf_dh_secret,
            ntf_service_id: None,
        })
    });
    let mut rcv_dh_secret = [0u8; 32];
    rng.fill_bytes(&mut rcv_dh_secret);
    QueueData {
        rec: QueueRec {
            recipient_id,
            recipient_keys: vec![key.clone()],
            rcv_dh_secret,
            sender_id,
            sender_key: Some(key.clone()),
            queue_mode: Some(QueueMode::Messaging),
            link,
            notifier,
            status: QueueStatus::Active,
            updated_at: Some(day),
            rcv_service_id: None,
        },
        msgs: Vec::new(),
        ntfs: Vec::new(),
    }
}

fn spawn(cmd: &mut Command, what: &str) -> Result<Child, String> {
    cmd.spawn().map_err(|e| format!("cannot run {what}: {e}"))
}

fn wait(mut child: Child, what: &str) -> Result<(), String> {
    let status = child.wait().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Exports the store of `from` (a stopped relay's data directory) into the empty `kind` store of
/// `to` (a data directory with the relay's certificates and no store), adding `idle` queues after
/// the exported ones; `progress` is called every million queues.
pub fn fill(
    relay_bin: &Path,
    from: &Path,
    to: &Path,
    kind: StoreKind,
    idle: u64,
    extras: Extras,
    progress: &mut dyn FnMut(u64),
) -> Result<Filled, String> {
    let mut export = spawn(
        Command::new(relay_bin)
            .arg("--data-dir")
            .arg(from)
            .args(["store", "export", "--quiet", "--output", "-"])
            .stdout(Stdio::piped()),
        "store export",
    )?;
    let mut import = spawn(
        Command::new(relay_bin)
            .arg("--data-dir")
            .arg(to)
            .args([
                "store",
                "import",
                "--quiet",
                "--store",
                kind.name(),
                "--input",
                "-",
            ])
            .stdin(Stdio::piped()),
        "store import",
    )?;
    let out = export.stdout.take().ok_or("store export: no stdout")?;
    let input = import.stdin.take().ok_or("store import: no stdin")?;
    let written = (|| -> Result<Filled, String> {
        let mut reader =
            StreamReader::new(BufReader::with_capacity(1 << 20, out)).map_err(|e| e.to_string())?;
        let mut writer = StreamWriter::new(BufWriter::with_capacity(1 << 20, input))
            .map_err(|e| e.to_string())?;
        for s in reader.services().to_vec() {
            writer.service(&s).map_err(|e| e.to_string())?;
        }
        let mut copied = 0u64;
        while let Some((q, _)) = reader.next_queue().map_err(|e| e.to_string())? {
            writer.queue(&q).map_err(|e| e.to_string())?;
            copied += 1;
        }
        let key = PublicAuthKey::Ed25519(
            ed25519_dalek::SigningKey::from_bytes(&[7; 32])
                .verifying_key()
                .to_bytes(),
        );
        let day = crate::clock::now_secs() / 86_400 * 86_400;
        let mut rng = rand::rngs::OsRng;
        for i in 0..idle {
            writer
                .queue(&idle_queue(&mut rng, &key, day, extras))
                .map_err(|e| e.to_string())?;
            if (i + 1) % 1_000_000 == 0 {
                progress(i + 1);
            }
        }
        let (counts, _, out) = writer.finish().map_err(|e| e.to_string())?;
        // Closing the pipe ends the import's input.
        drop(out);
        Ok(Filled {
            copied,
            added: idle,
            counts,
        })
    })();
    let exported = wait(export, "store export");
    let imported = wait(import, "store import");
    let filled = written?;
    exported?;
    imported?;
    Ok(filled)
}
