//! Pending notifications of the PostgreSQL store. As in the reference (whose notification store is
//! in memory for every queue store, saved to a file at a clean stop), they live in memory and are
//! saved at a clean stop, one file per partition group under `<data-dir>/postgres-store/`, and
//! loaded at the next start (those older than the notification lifetime are dropped). Once every
//! shard has opened, the loaded files are set aside (`.bak`), so that a crash after it does not
//! bring back notifications that were delivered since.
//!
//! A file: the magic `SMPRNTF1`, then for each notifier its ID and its notifications (the memory
//! store's encodings, `store/codec.rs`), oldest first.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::protocol::encoding::Reader;
use crate::store::codec::{decode_ntf, encode_ntf, put_bytes, put_count, read_bytes, read_count};
use crate::store::{EntityId, MsgNtf};

/// The directory that marks a data directory as the PostgreSQL store's (`StoreKind::found_in`).
pub const POSTGRES_STORE_DIR: &str = "postgres-store";
const MAGIC: &[u8; 8] = b"SMPRNTF1";

pub fn store_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(POSTGRES_STORE_DIR)
}

fn group_file(dir: &Path, group: u32) -> PathBuf {
    dir.join(format!("ntfs-{group:02}"))
}

fn backup_file(dir: &Path, group: u32) -> PathBuf {
    dir.join(format!("ntfs-{group:02}.bak"))
}

/// The notifications saved for `groups`, per notifier, without those older than `older_than`.
pub fn load(
    dir: &Path,
    groups: &[u32],
    older_than: i64,
) -> Result<Vec<(EntityId, Vec<MsgNtf>)>, String> {
    let mut out = Vec::new();
    for &g in groups {
        let path = group_file(dir, g);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let damaged = || {
            format!(
                "{} is damaged; move it away to start without the notifications it holds",
                path.display()
            )
        };
        let body = bytes.strip_prefix(MAGIC.as_slice()).ok_or_else(damaged)?;
        let mut r = Reader::new(body);
        while !r.is_empty() {
            let nid = read_bytes(&mut r).map_err(|_| damaged())?.to_vec();
            let n = read_count(&mut r, 1).map_err(|_| damaged())?;
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                let ntf = decode_ntf(&mut r).map_err(|_| damaged())?;
                if ntf.ts >= older_than {
                    list.push(ntf);
                }
            }
            if !list.is_empty() {
                out.push((nid, list));
            }
        }
    }
    Ok(out)
}

/// Writes the notifications of one group (`by_notifier`), replacing its file (a temporary file,
/// synced, then renamed).
pub fn save(dir: &Path, group: u32, by_notifier: &[(EntityId, Vec<MsgNtf>)]) -> Result<(), String> {
    crate::store::create_private_dir(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = group_file(dir, group);
    if by_notifier.is_empty() {
        return match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("cannot remove {}: {e}", path.display()))
            }
            _ => Ok(()),
        };
    }
    let mut b = MAGIC.to_vec();
    for (nid, list) in by_notifier {
        put_bytes(&mut b, nid);
        put_count(&mut b, list.len());
        for n in list {
            encode_ntf(&mut b, n);
        }
    }
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&b)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The file where a start records the database it used (connection string and schema, one per
/// line, readable by the owner only), so that the offline tools (`block`, `unblock`, `store
/// export`) reach the same database.
pub const CONNECTION_FILE: &str = "connection";

pub fn remember_connection(dir: &Path, conninfo: &str, schema: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    crate::store::create_private_dir(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(CONNECTION_FILE);
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(format!("{conninfo}\n{schema}\n").as_bytes())
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The connection string and schema a start recorded, if any.
pub fn remembered_connection(dir: &Path) -> Option<(String, String)> {
    let text = fs::read_to_string(dir.join(CONNECTION_FILE)).ok()?;
    let mut lines = text.lines();
    Some((lines.next()?.to_string(), lines.next()?.to_string()))
}

/// Sets every group's file aside as `.bak` (after a start, see the module comment).
pub fn set_aside(dir: &Path) -> Result<(), String> {
    for g in crate::store::all_groups() {
        let path = group_file(dir, g);
        if path.exists() {
            fs::rename(&path, backup_file(dir, g))
                .map_err(|e| format!("cannot set {} aside: {e}", path.display()))?;
        }
    }
    Ok(())
}
