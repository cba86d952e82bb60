//! The relay's services (`docs/ARCHITECTURE.md` §5, "Services"): clients that present a TLS client
//! certificate and a role in their handshake (simplexmq `Transport.hs`, `getClientService`), known
//! by the SHA-256 of their identity certificate. A service keeps its ID across connections and
//! restarts: the first handshake with a new certificate creates its record, later ones find it.
//!
//! One registry serves every shard. It is read at a service's handshake only (never on the path of
//! a command), and written when a service is new, so it is a mutex-guarded map, not a shard's
//! state. Records are durable before the handshake answers:
//!
//! - memory and journal stores: appended to `<data-dir>/services` (both kinds read the same file,
//!   so moving queues between them with `store export`/`store import` keeps their services);
//! - PostgreSQL: the reference's `services` table (simplexmq
//!   `src/Simplex/Messaging/Server/QueueStore/Postgres.hs`, `getCreateService`).
//!
//! The file is a sequence of records, each `u32 length | u32 CRC-32 | record`, record =
//! `bytes serviceId | role | bytes certChain | certHash (32) | int64 createdAt` (`store/codec.rs`
//! conventions). A torn last record (a crash while appending) is cut off at start; damage
//! anywhere else stops the start with a message naming the file.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::codec::{put_bytes, read_bytes};
use super::postgres::pool::Shared;
use super::{EntityId, StoreKind, StoreSettings};
pub use crate::protocol::command::ServiceRole;
use crate::protocol::encoding::{put_int64, put_word32, DResult, DecodeError, Reader};

/// The services file of the memory and journal stores, in the data directory.
pub const SERVICES_FILE: &str = "services";

/// A record longer than this is damage: a chain of 4 certificates of a few KB each fits far below.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// One service (simplexmq `Server/QueueStore.hs`, `ServiceRec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRec {
    pub service_id: EntityId,
    pub role: ServiceRole,
    /// The certificate chain as the handshake carries it: a count byte, then each DER certificate
    /// with a 2-byte length (the reference's `service_cert` column holds the same bytes).
    pub cert_chain: Vec<u8>,
    /// SHA-256 of the identity certificate's DER.
    pub cert_hash: [u8; 32],
    /// Unix seconds, rounded down to a day.
    pub created_at: i64,
}

/// Why a service cannot be had; the handshake answers `HANDSHAKE BAD_SERVICE` to each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The certificate is known with another role.
    #[error("the certificate is registered for role {}", char::from(.0.byte()))]
    RoleMismatch(ServiceRole),
    /// The record could not be made durable.
    #[error("services: {0}")]
    Failed(String),
}

enum Backend {
    /// Tests that keep nothing.
    None,
    File(PathBuf),
    Postgres(Arc<Shared>),
}

/// Every service of the relay, by certificate hash.
pub struct Services {
    by_hash: Mutex<HashMap<[u8; 32], ServiceRec>>,
    backend: Mutex<Backend>,
    kind: StoreKind,
    settings: StoreSettings,
}

impl Services {
    /// A registry for `kind`; nothing is read until [`Services::load`].
    pub fn new(kind: StoreKind, settings: &StoreSettings) -> Arc<Self> {
        Arc::new(Services {
            by_hash: Mutex::new(HashMap::new()),
            backend: Mutex::new(Backend::None),
            kind,
            settings: settings.clone(),
        })
    }

    /// A registry that keeps nothing (unit tests).
    pub fn in_memory() -> Arc<Self> {
        Services::new(
            StoreKind::Memory,
            &StoreSettings {
                data_dir: PathBuf::new(),
                keep: crate::store::Keep::ALL,
                message_ttl_secs: 0,
                ntf_ttl_secs: 0,
                test_delay: None,
                durability: super::journal::DEFAULT_DURABILITY,
                journal_budget: None,
                journal_checkpoint_records: crate::store::journal::DEFAULT_CHECKPOINT_RECORDS,
                postgres: None,
            },
        )
    }

    /// Reads every record of the store's kind. For PostgreSQL it shares the stores' pool, so the
    /// shards must have opened their stores first.
    pub fn load(&self) -> Result<usize, String> {
        let (backend, recs) = match self.kind {
            StoreKind::Memory | StoreKind::Journal => {
                let path = self.settings.data_dir.join(SERVICES_FILE);
                let recs = read_file(&path)?;
                (Backend::File(path), recs)
            }
            StoreKind::Postgres => {
                let config = self
                    .settings
                    .postgres
                    .as_ref()
                    .ok_or("services: no database settings")?;
                let shared = Shared::get(config, &[])?;
                let recs = shared.run_blocking("services", |c| {
                    let rows = c.client.query(
                        "SELECT service_id, service_role, service_cert, service_cert_hash, \
                         created_at FROM services",
                        &[],
                    )?;
                    Ok(rows
                        .iter()
                        .filter_map(|r| {
                            let role: String = r.get(1);
                            let hash: Vec<u8> = r.get(3);
                            Some(ServiceRec {
                                service_id: r.get(0),
                                role: ServiceRole::from_byte(*role.as_bytes().first()?)?,
                                cert_chain: r.get(2),
                                cert_hash: hash.try_into().ok()?,
                                created_at: r.get(4),
                            })
                        })
                        .collect::<Vec<_>>())
                })?;
                (Backend::Postgres(shared), recs)
            }
        };
        let n = recs.len();
        let mut map = lock(&self.by_hash);
        for r in recs {
            map.insert(r.cert_hash, r);
        }
        *lock(&self.backend) = backend;
        Ok(n)
    }

    /// The service of `cert_hash` with `role`, if it is known; `Err` if it is known with another
    /// role. Never blocks on I/O.
    pub fn find(
        &self,
        cert_hash: &[u8; 32],
        role: ServiceRole,
    ) -> Option<Result<EntityId, ServiceError>> {
        lock(&self.by_hash).get(cert_hash).map(|r| {
            if r.role == role {
                Ok(r.service_id.clone())
            } else {
                Err(ServiceError::RoleMismatch(r.role))
            }
        })
    }

    /// The service of `rec.cert_hash`, created as `rec` if it is new (durable when this returns).
    /// Blocks on the file or the database: call it off the shard's thread.
    pub fn get_or_create(&self, rec: ServiceRec) -> Result<EntityId, ServiceError> {
        // Held while the record is written, so two first handshakes of one certificate make one.
        let mut map = lock(&self.by_hash);
        if let Some(r) = map.get(&rec.cert_hash) {
            return if r.role == rec.role {
                Ok(r.service_id.clone())
            } else {
                Err(ServiceError::RoleMismatch(r.role))
            };
        }
        match &*lock(&self.backend) {
            Backend::None => {}
            Backend::File(path) => append(path, &rec).map_err(ServiceError::Failed)?,
            Backend::Postgres(shared) => {
                let r = rec.clone();
                shared
                    .run_blocking("services", move |c| {
                        let role = char::from(r.role.byte()).to_string();
                        let hash = r.cert_hash.to_vec();
                        c.client.execute(
                            "INSERT INTO services (service_id, service_role, service_cert, \
                             service_cert_hash, created_at) VALUES ($1, $2, $3, $4, $5)",
                            &[&r.service_id, &role, &r.cert_chain, &hash, &r.created_at],
                        )
                    })
                    .map_err(ServiceError::Failed)?;
            }
        }
        let id = rec.service_id.clone();
        map.insert(rec.cert_hash, rec);
        Ok(id)
    }

    /// Forgets every service, in memory and where they are kept (the file, the table): a failed
    /// `store import` leaves the registry as empty as it found it.
    pub fn clear(&self) -> Result<(), String> {
        let mut map = lock(&self.by_hash);
        match &*lock(&self.backend) {
            Backend::None => {}
            Backend::File(path) => match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
            },
            Backend::Postgres(shared) => {
                shared.run_blocking("services", |c| {
                    c.client.execute("DELETE FROM services", &[])
                })?;
            }
        }
        map.clear();
        Ok(())
    }

    /// Known services of `role` (the reference's `rcvServiceCount`, `ntfServiceCount`).
    pub fn count(&self, role: ServiceRole) -> u64 {
        lock(&self.by_hash)
            .values()
            .filter(|r| r.role == role)
            .count() as u64
    }

    /// Every known service (for the metrics and the tests).
    pub fn all(&self) -> Vec<ServiceRec> {
        lock(&self.by_hash).values().cloned().collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A record's encoding, as the services file frames it and `store export` writes it.
pub(crate) fn encode_body(body: &mut Vec<u8>, rec: &ServiceRec) {
    put_bytes(body, &rec.service_id);
    body.push(rec.role.byte());
    put_bytes(body, &rec.cert_chain);
    body.extend_from_slice(&rec.cert_hash);
    put_int64(body, rec.created_at);
}

fn encode(rec: &ServiceRec) -> Vec<u8> {
    let mut body = Vec::new();
    encode_body(&mut body, rec);
    let mut out = Vec::with_capacity(body.len() + 8);
    put_word32(&mut out, body.len() as u32);
    put_word32(&mut out, crc32fast::hash(&body));
    out.extend_from_slice(&body);
    out
}

fn decode(body: &[u8]) -> DResult<ServiceRec> {
    let mut r = Reader::new(body);
    let rec = decode_body(&mut r)?;
    r.end()?;
    Ok(rec)
}

/// `encode_body`'s record, from `r`.
pub(crate) fn decode_body(r: &mut Reader<'_>) -> DResult<ServiceRec> {
    let service_id = read_bytes(r)?.to_vec();
    let role = ServiceRole::from_byte(r.byte()?).ok_or(DecodeError)?;
    let cert_chain = read_bytes(r)?.to_vec();
    let cert_hash = r.array::<32>()?;
    let created_at = r.int64()?;
    Ok(ServiceRec {
        service_id,
        role,
        cert_chain,
        cert_hash,
        created_at,
    })
}

fn append(path: &Path, rec: &ServiceRec) -> Result<(), String> {
    let mut f = crate::store::private_file()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    f.write_all(&encode(rec))
        .and_then(|()| f.sync_data())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if let Some(dir) = path.parent() {
        // A new file's directory entry must be durable too.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// The records of `path` (none if it does not exist); a torn last record is cut off.
fn read_file(path: &Path) -> Result<Vec<ServiceRec>, String> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let damaged = |at: usize| {
        format!(
            "{} is damaged at byte {at}: restore it from a backup, or move it away to start \
             without the services it names (their clients then get new service IDs)",
            path.display()
        )
    };
    let mut recs = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let torn = || -> Result<(), String> {
            let f = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| format!("cannot repair {}: {e}", path.display()))?;
            f.set_len(at as u64)
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("cannot repair {}: {e}", path.display()))?;
            tracing::warn!(file = %path.display(), at, "cut off a torn last service record");
            Ok(())
        };
        if rest.len() < 8 {
            torn()?;
            break;
        }
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_be_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len > MAX_RECORD_BYTES {
            return Err(damaged(at));
        }
        if rest.len() < 8 + len {
            torn()?;
            break;
        }
        let body = &rest[8..8 + len];
        let last = rest.len() == 8 + len;
        if crc32fast::hash(body) != crc {
            if last {
                torn()?;
                break;
            }
            return Err(damaged(at));
        }
        recs.push(decode(body).map_err(|_| damaged(at))?);
        at += 8 + len;
    }
    Ok(recs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(n: u8, role: ServiceRole) -> ServiceRec {
        ServiceRec {
            service_id: vec![n; 24],
            role,
            cert_chain: vec![1, 0, 3, 1, 2, 3],
            cert_hash: [n; 32],
            created_at: 86400 * 20000,
        }
    }

    fn file_registry(dir: &Path) -> Arc<Services> {
        let mut s = Services::in_memory();
        Arc::get_mut(&mut s).expect("one owner").settings.data_dir = dir.to_path_buf();
        s
    }

    #[test]
    fn a_service_is_created_once_and_found_by_certificate_and_role_after_a_restart() {
        let dir = tempdir("reg");
        let s = file_registry(&dir);
        s.load().unwrap();
        assert_eq!(s.find(&[1; 32], ServiceRole::Messaging), None);
        let id = s.get_or_create(rec(1, ServiceRole::Messaging)).unwrap();
        // A second first handshake with another random ID gets the first one's.
        let mut again = rec(1, ServiceRole::Messaging);
        again.service_id = vec![9; 24];
        assert_eq!(s.get_or_create(again).unwrap(), id);
        assert_eq!(
            s.get_or_create(rec(1, ServiceRole::Notifier)),
            Err(ServiceError::RoleMismatch(ServiceRole::Messaging))
        );
        s.get_or_create(rec(2, ServiceRole::Notifier)).unwrap();

        let s2 = file_registry(&dir);
        assert_eq!(s2.load().unwrap(), 2);
        assert_eq!(s2.find(&[1; 32], ServiceRole::Messaging), Some(Ok(id)));
        assert_eq!(
            s2.find(&[2; 32], ServiceRole::Messaging),
            Some(Err(ServiceError::RoleMismatch(ServiceRole::Notifier)))
        );
        let mut all = s2.all();
        all.sort_by_key(|r| r.cert_hash);
        assert_eq!(
            all,
            vec![
                rec(1, ServiceRole::Messaging),
                rec(2, ServiceRole::Notifier)
            ]
        );
    }

    #[test]
    fn a_torn_last_record_is_cut_off_and_damage_before_it_names_the_file() {
        let dir = tempdir("torn");
        let s = file_registry(&dir);
        s.load().unwrap();
        s.get_or_create(rec(1, ServiceRole::Messaging)).unwrap();
        s.get_or_create(rec(2, ServiceRole::Messaging)).unwrap();
        let path = dir.join(SERVICES_FILE);
        let full = std::fs::read(&path).unwrap();
        let one = encode(&rec(1, ServiceRole::Messaging)).len();
        // A crash in the middle of the second record's append.
        std::fs::write(&path, &full[..one + 5]).unwrap();
        let s2 = file_registry(&dir);
        assert_eq!(s2.load().unwrap(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), one as u64);
        // A flipped byte in a record that is not the last.
        let mut bad = full.clone();
        bad[10] ^= 0xff;
        std::fs::write(&path, &bad).unwrap();
        let e = file_registry(&dir).load().unwrap_err();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("damaged"),
            "{e}"
        );
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "smp-relay-services-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
