//! Queues created once by `smp-load setup` and reused by every run: their IDs and the keys needed to
//! subscribe (recipient key), send (sender key, the queue is secured with it) and read (DH secret).
//!
//! File format, one text line per queue after a header, fields base64url without padding:
//! `rcvId sndId rcvKeySeed sndKeySeed rcvDhSecret`.

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::SigningKey;

use crate::client::queue::{self, RecipientKeys};
use crate::client::{Client, ClientOptions, ClientTransmission, Signer};
use crate::protocol::command::Command;
use crate::protocol::response::BrokerMsg;

const HEADER: &str = "smp-load-queues 1";
/// NEWs sent before waiting for their answers: about two blocks.
pub const NEW_BATCH: usize = 160;

/// One queue as the load generator knows it.
#[derive(Clone)]
pub struct QueueCreds {
    pub rid: Vec<u8>,
    pub sid: Vec<u8>,
    pub rcv_key: SigningKey,
    pub snd_key: SigningKey,
    pub dh_secret: [u8; 32],
}

impl QueueCreds {
    pub fn rcv_signer(&self) -> Signer {
        Signer::Ed25519(self.rcv_key.clone())
    }

    pub fn snd_signer(&self) -> Signer {
        Signer::Ed25519(self.snd_key.clone())
    }
}

#[derive(Debug)]
pub struct CredsError(pub String);

impl fmt::Display for CredsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CredsError {}

fn err(s: impl Into<String>) -> CredsError {
    CredsError(s.into())
}

pub fn save(path: &Path, qs: &[QueueCreds]) -> Result<(), CredsError> {
    let tmp = path.with_extension("tmp");
    let f = std::fs::File::create(&tmp).map_err(|e| err(format!("{}: {e}", tmp.display())))?;
    let mut w = BufWriter::new(f);
    let b = |x: &[u8]| URL_SAFE_NO_PAD.encode(x);
    let mut write = || -> std::io::Result<()> {
        writeln!(w, "{HEADER} {}", qs.len())?;
        for q in qs {
            writeln!(
                w,
                "{} {} {} {} {}",
                b(&q.rid),
                b(&q.sid),
                b(&q.rcv_key.to_bytes()),
                b(&q.snd_key.to_bytes()),
                b(&q.dh_secret)
            )?;
        }
        w.flush()
    };
    write().map_err(|e| err(format!("{}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| err(format!("{}: {e}", path.display())))
}

pub fn load(path: &Path) -> Result<Vec<QueueCreds>, CredsError> {
    let f = std::fs::File::open(path).map_err(|e| {
        err(format!(
            "{}: {e} (create it with `smp-load setup`)",
            path.display()
        ))
    })?;
    let mut lines = BufReader::new(f).lines();
    let header = lines
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| err("empty queue file"))?;
    if !header.starts_with(HEADER) {
        return Err(err(format!(
            "{}: not a smp-load queue file",
            path.display()
        )));
    }
    let d = |s: &str| URL_SAFE_NO_PAD.decode(s).map_err(|_| err("bad base64"));
    let arr = |v: Vec<u8>| -> Result<[u8; 32], CredsError> {
        v.try_into().map_err(|_| err("key is not 32 bytes"))
    };
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line.map_err(|e| err(e.to_string()))?;
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() != 5 {
            return Err(err(format!("line {}: expected 5 fields", i + 2)));
        }
        out.push(QueueCreds {
            rid: d(f[0])?,
            sid: d(f[1])?,
            rcv_key: SigningKey::from_bytes(&arr(d(f[2])?)?),
            snd_key: SigningKey::from_bytes(&arr(d(f[3])?)?),
            dh_secret: arr(d(f[4])?)?,
        });
    }
    Ok(out)
}

fn corr(n: u64) -> [u8; 24] {
    let mut c = [0u8; 24];
    c[..8].copy_from_slice(&n.to_be_bytes());
    c
}

/// Waits until every corrId in `want` is answered; returns the answers by corrId.
fn collect(c: &mut Client, want: &[[u8; 24]]) -> Result<HashMap<Vec<u8>, BrokerMsg>, CredsError> {
    let mut got = HashMap::with_capacity(want.len());
    while got.len() < want.len() {
        for t in c.recv_block().map_err(|e| err(format!("receive: {e}")))? {
            if let Ok(m) = t.msg {
                got.insert(t.corr_id, m);
            }
        }
    }
    Ok(got)
}

/// Creates `n` queues over one connection: NEW in batches of `NEW_BATCH` (greedily packed, about
/// 80 per block), then KEY with a fresh sender key for each, so that SENDs are signed as an
/// agent's are. `done` counts created queues for the progress line.
pub fn create(
    addr: SocketAddr,
    key_hash: [u8; 32],
    n: usize,
    done: &AtomicUsize,
) -> Result<Vec<QueueCreds>, CredsError> {
    let mut c = Client::connect(addr, key_hash, ClientOptions::default())
        .map_err(|e| err(format!("connect to {addr}: {e}")))?;
    let mut out = Vec::with_capacity(n);
    let mut next = 1u64;
    while out.len() < n {
        let k = NEW_BATCH.min(n - out.len());
        let keys: Vec<RecipientKeys> = (0..k)
            .map(|_| RecipientKeys::generate(queue::KeyAlg::Ed25519))
            .collect();
        let corrs: Vec<[u8; 24]> = (0..k as u64).map(|i| corr(next + i)).collect();
        next += k as u64;
        let ts: Vec<ClientTransmission> = keys
            .iter()
            .zip(&corrs)
            .map(|(kp, c)| {
                ClientTransmission::new(c, b"", Command::New(queue::new_queue(kp)))
                    .signed(kp.auth.clone())
            })
            .collect();
        c.send_batch(&ts)
            .map_err(|e| err(format!("send NEW: {e}")))?;
        let got = collect(&mut c, &corrs)?;
        let mut made = Vec::with_capacity(k);
        for (kp, cid) in keys.into_iter().zip(&corrs) {
            let ids = match got.get(&cid[..]) {
                Some(BrokerMsg::Ids(ids)) => ids.clone(),
                other => return Err(err(format!("NEW answered {other:?}"))),
            };
            let Signer::Ed25519(rcv_key) = kp.auth.clone() else {
                unreachable!("Ed25519 keys were generated")
            };
            made.push(QueueCreds {
                rid: ids.rcv_id.clone(),
                sid: ids.snd_id.clone(),
                rcv_key,
                snd_key: SigningKey::generate(&mut rand::rngs::OsRng),
                dh_secret: kp.dh.shared(&ids.srv_dh_key),
            });
        }
        let corrs: Vec<[u8; 24]> = (0..k as u64).map(|i| corr(next + i)).collect();
        next += k as u64;
        let ts: Vec<ClientTransmission> = made
            .iter()
            .zip(&corrs)
            .map(|(q, c)| {
                ClientTransmission::new(c, &q.rid, Command::Key(q.snd_signer().public_key()))
                    .signed(q.rcv_signer())
            })
            .collect();
        c.send_batch(&ts)
            .map_err(|e| err(format!("send KEY: {e}")))?;
        let got = collect(&mut c, &corrs)?;
        for cid in &corrs {
            match got.get(&cid[..]) {
                Some(BrokerMsg::Ok) => {}
                other => return Err(err(format!("KEY answered {other:?}"))),
            }
        }
        out.extend(made);
        done.fetch_add(k, Ordering::Relaxed);
    }
    Ok(out)
}

/// `create` over `threads` connections at once, with a progress line on stderr.
pub fn create_parallel(
    addr: SocketAddr,
    key_hash: [u8; 32],
    n: usize,
    threads: usize,
) -> Result<Vec<QueueCreds>, CredsError> {
    let threads = threads.clamp(1, n.max(1));
    let done = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let share = n / threads + usize::from(i < n % threads);
            let done = done.clone();
            std::thread::spawn(move || create(addr, key_hash, share, &done))
        })
        .collect();
    let started = std::time::Instant::now();
    while handles.iter().any(|h| !h.is_finished()) {
        let d = done.load(Ordering::Relaxed);
        eprint!(
            "\rsetup: {} {d}/{n} queues ({:.0}/s)   ",
            crate::load::report::bar(d, n),
            d as f64 / started.elapsed().as_secs_f64().max(1e-3)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!(
        "\rsetup: {} {n}/{n} queues in {:.1} s        ",
        crate::load::report::bar(n, n),
        started.elapsed().as_secs_f64()
    );
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.join().map_err(|_| err("setup thread panicked"))??);
    }
    Ok(all)
}

/// SENDs written before waiting for their answers by `fill`: a few blocks of small messages.
pub const SEND_BATCH: usize = 160;

/// Sends `per_queue` messages of `size` bytes to each of `qs` over one connection, signed with
/// the queue's sender key, `SEND_BATCH` at a time, round by round (every queue's first message,
/// then every queue's second …), each answered OK. `done` counts accepted messages.
pub fn fill(
    addr: SocketAddr,
    key_hash: [u8; 32],
    qs: &[QueueCreds],
    per_queue: usize,
    size: usize,
    done: &AtomicUsize,
) -> Result<(), CredsError> {
    let mut c = Client::connect(addr, key_hash, ClientOptions::default())
        .map_err(|e| err(format!("connect to {addr}: {e}")))?;
    let mut next = 1u64;
    for round in 0..per_queue {
        for chunk in qs.chunks(SEND_BATCH) {
            let corrs: Vec<[u8; 24]> = (0..chunk.len() as u64).map(|i| corr(next + i)).collect();
            next += chunk.len() as u64;
            let ts: Vec<ClientTransmission> = chunk
                .iter()
                .zip(&corrs)
                .map(|(q, cid)| {
                    let body = message_body(size, round, cid);
                    ClientTransmission::new(
                        cid,
                        &q.sid,
                        Command::Send {
                            flags: crate::protocol::command::MsgFlags::new(false),
                            body,
                        },
                    )
                    .signed(q.snd_signer())
                })
                .collect();
            c.send_batch(&ts)
                .map_err(|e| err(format!("send SEND: {e}")))?;
            let got = collect(&mut c, &corrs)?;
            for cid in &corrs {
                match got.get(&cid[..]) {
                    Some(BrokerMsg::Ok) => {}
                    other => return Err(err(format!("SEND answered {other:?}"))),
                }
            }
            done.fetch_add(chunk.len(), Ordering::Relaxed);
        }
    }
    Ok(())
}

/// A body of `size` bytes that names its round and corrId, then [`incompressible`] filler.
fn message_body(size: usize, round: usize, corr: &[u8; 24]) -> Vec<u8> {
    let mut b = format!("smp-load {round} {} ", URL_SAFE_NO_PAD.encode(&corr[..8])).into_bytes();
    let seed = u64::from_le_bytes(corr[..8].try_into().unwrap_or_default());
    b.extend(incompressible(size.saturating_sub(b.len()), seed));
    b.truncate(size);
    b
}

/// `size` bytes that no compressor shrinks, as the bodies SimpleX clients send are (encrypted end
/// to end): a store may compress what it keeps (PostgreSQL compresses a `bytea` over ~2 KB
/// before it moves it out of line), so a body of repeated text would make it cheaper than it is
/// for real messages. SplitMix64 from `seed`: the same seed gives the same bytes.
pub fn incompressible(size: usize, seed: u64) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(size + 8);
    while out.len() < size {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(size);
    out
}

/// `fill` over `threads` connections at once (each a share of the queues), with a progress line
/// on stderr.
pub fn fill_parallel(
    addr: SocketAddr,
    key_hash: [u8; 32],
    qs: &Arc<Vec<QueueCreds>>,
    per_queue: usize,
    size: usize,
    threads: usize,
) -> Result<(), CredsError> {
    let n = qs.len() * per_queue;
    let threads = threads.clamp(1, qs.len().max(1));
    let done = Arc::new(AtomicUsize::new(0));
    let share = qs.len().div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (qs, done) = (qs.clone(), done.clone());
            std::thread::spawn(move || {
                let from = (i * share).min(qs.len());
                let to = ((i + 1) * share).min(qs.len());
                fill(addr, key_hash, &qs[from..to], per_queue, size, &done)
            })
        })
        .collect();
    let started = std::time::Instant::now();
    while handles.iter().any(|h| !h.is_finished()) {
        let d = done.load(Ordering::Relaxed);
        eprint!(
            "\rsetup: {} {d}/{n} messages ({:.0}/s)   ",
            crate::load::report::bar(d, n),
            d as f64 / started.elapsed().as_secs_f64().max(1e-3)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    eprintln!(
        "\rsetup: {} {n}/{n} messages of {size} bytes in {:.1} s        ",
        crate::load::report::bar(n, n),
        started.elapsed().as_secs_f64()
    );
    for h in handles {
        h.join().map_err(|_| err("setup thread panicked"))??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn filler_has_nothing_to_compress() {
        let b = incompressible(16_048, 7);
        assert_eq!(b.len(), 16_048);
        assert_eq!(
            b,
            incompressible(16_048, 7),
            "the same seed, the same bytes"
        );
        assert_ne!(b, incompressible(16_048, 8));
        // No 8-byte word repeats and every byte value is about as frequent as the others: what
        // pglz or LZ4 look for (repeated sequences, skewed bytes) is absent.
        let words: HashSet<&[u8]> = b.chunks_exact(8).collect();
        assert_eq!(words.len(), 16_048 / 8);
        let mut counts = [0usize; 256];
        for x in &b {
            counts[usize::from(*x)] += 1;
        }
        let (lo, hi) = (counts.iter().min(), counts.iter().max());
        assert!(
            lo >= Some(&20) && hi <= Some(&110),
            "{lo:?}..{hi:?} of an expected 63"
        );
        let body = message_body(100, 3, &[1; 24]);
        assert_eq!(body.len(), 100);
        assert!(body.starts_with(b"smp-load 3 "));
    }
}
