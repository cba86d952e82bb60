//! The reference's "Timing of AUTH error" comparison (simplexmq
//! `tests/ServerTests.hs`, `testTiming`) as a benchmark: an owner answers AUTH for a queue that
//! does not exist and for a queue signed with the wrong key; both must take about as long, for
//! every pair of queue-key and signature algorithms. CI asserts the structure (one verification per
//! path, `server::owner` tests); this measures the time. Run: `cargo bench --bench auth_timing`.
//! Prints median and range over runs.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ed25519_dalek::SigningKey;
use x25519_dalek::StaticSecret;

use smp_relay::config::Settings;
use smp_relay::crypto::auth;
use smp_relay::crypto::keys::PublicAuthKey;
use smp_relay::protocol::command::Command;
use smp_relay::protocol::transmission::client_signed_bytes;
use smp_relay::server::directory::Directory;
use smp_relay::server::mesh::{Mesh, ShardMesh};
use smp_relay::server::messages::{ConnMsg, ShardMsg};
use smp_relay::server::owner::Owner;
use smp_relay::server::router::{ConnRef, Request, SessionInfo};
use smp_relay::store::memory::MemoryStore;
use smp_relay::store::{QueueRec, QueueStatus, QueueStore};

const RUNS: usize = 7;
const ITERATIONS: usize = 400;

#[derive(Clone, Copy, Debug)]
enum Alg {
    Ed25519,
    Ed448,
    X25519,
}

/// Makes the authorization of `(authorized bytes, corrId)`.
type SignFn = Box<dyn Fn(&[u8], &[u8]) -> Vec<u8>>;

struct Keys {
    public: PublicAuthKey,
    sign: SignFn,
}

fn keys(alg: Alg, seed: u8, server_pub: [u8; 32]) -> Keys {
    match alg {
        Alg::Ed25519 => {
            let k = SigningKey::from_bytes(&[seed; 32]);
            Keys {
                public: PublicAuthKey::Ed25519(k.verifying_key().to_bytes()),
                sign: Box::new(move |m, _| auth::sign_ed25519(&k, m).to_vec()),
            }
        }
        Alg::Ed448 => {
            let sk = [seed; 57];
            Keys {
                public: PublicAuthKey::Ed448(auth::ed448_public(&sk)),
                sign: Box::new(move |m, _| auth::sign_ed448(&sk, m).to_vec()),
            }
        }
        Alg::X25519 => {
            let sk = [seed; 32];
            let public = x25519_dalek::PublicKey::from(&StaticSecret::from(sk)).to_bytes();
            Keys {
                public: PublicAuthKey::X25519(public),
                sign: Box::new(move |m, corr| {
                    auth::x25519_authenticator(&sk, &server_pub, corr, m).to_vec()
                }),
            }
        }
    }
}

fn median_range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let server_secret = StaticSecret::from([9u8; 32]);
    let server_pub = x25519_dalek::PublicKey::from(&server_secret).to_bytes();
    let session = Arc::new(SessionInfo {
        conn: ConnRef { shard: 0, id: 1 },
        version: 18,
        session_id: vec![7; 32],
        server_key: server_secret,
        service: None,
    });
    println!("AUTH timing, µs per SUB answered AUTH (median [min, max] over {RUNS} runs of {ITERATIONS})");
    println!(
        "{:<9} {:<9} {:>28} {:>28} {:>8}",
        "queue", "signer", "wrong key", "no such queue", "ratio"
    );
    for queue_alg in [Alg::Ed25519, Alg::Ed448, Alg::X25519] {
        for signer_alg in [Alg::Ed25519, Alg::Ed448, Alg::X25519] {
            let (mesh, inboxes) = Mesh::new(1);
            let mesh = ShardMesh::new(mesh, 0);
            let owner = Owner::new(
                0,
                MemoryStore::new(),
                Directory::new(),
                mesh,
                Rc::new(Settings::default()),
            );
            let owner_keys = keys(queue_alg, 3, server_pub);
            let wrong = keys(signer_alg, 4, server_pub);
            let rid = vec![8u8; 24];
            let rec = QueueRec {
                recipient_id: rid.clone(),
                recipient_keys: vec![owner_keys.public.clone()],
                rcv_dh_secret: [1; 32],
                sender_id: vec![2; 24],
                sender_key: None,
                queue_mode: None,
                link: None,
                notifier: None,
                status: QueueStatus::Active,
                updated_at: None,
                rcv_service_id: None,
            };
            futures_lite::future::block_on(owner.store.create(rec)).expect("create");
            let request = |entity: &[u8]| {
                let corr = [5u8; 24];
                let signed = client_signed_bytes(18, &session.session_id, &corr, entity, b"SUB");
                Request {
                    corr_id: corr.to_vec(),
                    entity_id: entity.to_vec(),
                    recipient_id: Some(entity.to_vec()),
                    command: Command::Sub,
                    authorization: (wrong.sign)(&signed, &corr),
                    service: smp_relay::server::router::ServiceCheck::Plain,
                    authorized: signed,
                    forward: None,
                    batch_verified: None,
                    pre_verified: None,
                    undelivered: None,
                    associated: false,
                }
            };
            let time_path = |entity: &[u8]| {
                let mut per_run = Vec::with_capacity(RUNS);
                for _ in 0..RUNS {
                    // Signing is the client's work: done before the clock starts.
                    let requests: Vec<Request> = (0..ITERATIONS).map(|_| request(entity)).collect();
                    let start = Instant::now();
                    for req in requests {
                        futures_lite::future::block_on(owner.process(
                            session.clone(),
                            1,
                            vec![req],
                        ));
                        // Keep the inbox empty; the reply is AUTH on both paths.
                        let reply = inboxes[0].try_recv();
                        debug_assert!(matches!(reply, Ok(ShardMsg::Conn(ConnMsg::Reply { .. }))));
                    }
                    per_run.push(start.elapsed().as_secs_f64() * 1e6 / ITERATIONS as f64);
                }
                median_range(per_run)
            };
            let wrong_key = time_path(&rid);
            let missing = time_path(&[6u8; 24]);
            println!(
                "{:<9} {:<9} {:>9.1} [{:>6.1}, {:>6.1}] {:>9.1} [{:>6.1}, {:>6.1}] {:>8.2}",
                format!("{queue_alg:?}"),
                format!("{signer_alg:?}"),
                wrong_key.0,
                wrong_key.1,
                wrong_key.2,
                missing.0,
                missing.1,
                missing.2,
                missing.0 / wrong_key.0
            );
        }
    }
}
