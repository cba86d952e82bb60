//! The client against a minimal in-process SMP server built from the crate's own server-side pieces
//! (AcceptState, ServerHello, BlockCodec::server). It answers PING with PONG and anything else with
//! `ERR CMD UNKNOWN`; knobs make it lie so the client's checks can be seen to fail.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;

use super::*;
use crate::crypto::{signed_key, sxbox};
use crate::protocol::handshake::{CertChainPubKey, ClientHello, ServerHello};
use crate::protocol::pad::{pad, unpad};
use crate::protocol::transmission::encode_server_transmission;
use crate::transport::certs;
use crate::transport::tls::{self, AcceptState, TlsOptions};

#[derive(Clone, Default)]
struct Lies {
    session_id: bool,
    signed_key: bool,
    versions: Option<VersionRange>,
}

fn creds() -> certs::ServerCredentials {
    let dir = std::env::temp_dir().join(format!(
        "smp-relay-client-unit-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    certs::generate("127.0.0.1")
        .expect("generate")
        .write_files(&dir)
        .expect("write");
    let c = certs::load(&dir).expect("load");
    let _ = std::fs::remove_dir_all(&dir);
    c
}

/// Serves one connection, then returns the client hello it received (if any).
fn mini_server(lies: Lies) -> (SocketAddr, [u8; 32], JoinHandle<Option<ClientHello>>) {
    let creds = creds();
    let key_hash = creds.key_hash;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let h = std::thread::spawn(move || {
        let (sock, _) = listener.accept().ok()?;
        serve(sock, &creds, &lies)
    });
    (addr, key_hash, h)
}

fn serve(
    mut sock: TcpStream,
    creds: &certs::ServerCredentials,
    lies: &Lies,
) -> Option<ClientHello> {
    sock.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let config = tls::server_config(creds, &TlsOptions::default()).ok()?;
    let mut st = AcceptState::new(&config).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    while st.is_handshaking() {
        let mut out = Vec::new();
        st.take_output(&mut out);
        sock.write_all(&out).ok()?;
        let n = sock.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        st.feed(&buf[..n]).ok()?;
    }
    let mut out = Vec::new();
    st.take_output(&mut out);
    sock.write_all(&out).ok()?;
    let (conn, mut sid) = st.finish().ok()?;
    let versions = lies
        .versions
        .unwrap_or_else(|| tls::alpn_versions(conn.alpn_protocol()));
    let mut s = rustls::StreamOwned::new(conn, sock);

    let session_secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
    let session_public = x25519_dalek::PublicKey::from(&session_secret).to_bytes();
    let signer = if lies.signed_key {
        ed25519_dalek::SigningKey::from_bytes(&[3u8; 32])
    } else {
        match &creds.leaf_key {
            crate::transport::certs::LeafKey::Ed25519(k) => k.clone(),
            crate::transport::certs::LeafKey::Ed448(_) => unreachable!("`generate` makes Ed25519"),
        }
    };
    let real_sid = sid.clone();
    if lies.session_id {
        sid[0] ^= 1;
    }
    let hello = ServerHello {
        versions,
        session_id: sid,
        cert_key: Some(CertChainPubKey {
            chain: creds.chain_der.clone(),
            signed_key: signed_key::sign_x25519_key(&signer, &session_public),
        }),
        web_proof: None,
    };
    s.write_all(&pad(&hello.encode(), BLOCK_SIZE).ok()?).ok()?;
    let mut block = Box::new([0u8; BLOCK_SIZE]);
    s.read_exact(&mut block[..]).ok()?;
    let ch = ClientHello::decode(unpad(&block[..]).ok()?).ok()?;
    let v = ch.version;
    let mut codec = match ch.client_key {
        Some(k) if v >= 11 && !ch.proxy_server => {
            BlockCodec::server(&real_sid, &sxbox::dh(session_secret.as_bytes(), &k))
        }
        _ => BlockCodec::plain(),
    };
    loop {
        if s.read_exact(&mut block[..]).is_err() {
            return Some(ch);
        }
        let mut batch = BatchWriter::new();
        match codec
            .decode(&mut block)
            .ok()
            .and_then(|c| parse_batch(c).ok())
        {
            Some(items) => {
                for item in items {
                    let mut resp = Vec::new();
                    match parse_transmission(v, item) {
                        Ok(t) => {
                            let msg: &[u8] = if t.command == b"PING" {
                                b"PONG"
                            } else {
                                b"ERR CMD UNKNOWN"
                            };
                            encode_server_transmission(
                                v,
                                &real_sid,
                                t.corr_id,
                                t.entity_id,
                                msg,
                                &mut resp,
                            );
                        }
                        Err(_) => encode_server_transmission(
                            v,
                            &real_sid,
                            b"",
                            b"",
                            b"ERR BLOCK",
                            &mut resp,
                        ),
                    }
                    assert!(batch.try_push(&resp), "test responses fit one block");
                }
            }
            None => {
                let mut resp = Vec::new();
                encode_server_transmission(v, &real_sid, b"", b"", b"ERR BLOCK", &mut resp);
                batch.try_push(&resp);
            }
        }
        let mut out = Box::new([0u8; BLOCK_SIZE]);
        codec.encode(&batch.content(), &mut out).ok()?;
        s.write_all(&out[..]).ok()?;
    }
}

fn opts(version: Option<Version>) -> ClientOptions {
    ClientOptions {
        version,
        timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    }
}

#[test]
fn ping_at_every_version() {
    for v in 6..=18u16 {
        let (addr, kh, h) = mini_server(Lies::default());
        let mut c = Client::connect(addr, kh, opts(Some(v))).expect("connect");
        assert_eq!(c.version(), v);
        assert_eq!(c.is_encrypted(), v >= 11);
        assert_eq!(c.alpn(), Some(&b"smp/1"[..]));
        for _ in 0..3 {
            let r = c.ping().expect("ping");
            assert_eq!(r.command, b"PONG");
            assert_eq!(r.msg, Ok(BrokerMsg::Pong));
        }
        drop(c);
        let ch = h.join().expect("server").expect("client hello");
        assert_eq!(ch.version, v);
        assert_eq!(ch.key_hash, kh);
        assert_eq!(ch.client_key.is_some(), v >= 7);
    }
}

#[test]
fn default_version_is_the_highest_in_common() {
    let (addr, kh, _h) = mini_server(Lies::default());
    let c = Client::connect(addr, kh, opts(None)).expect("connect");
    assert_eq!(c.version(), 20);
    assert!(c.is_encrypted());
    assert!(c.server_session_key().is_some());
}

#[test]
fn no_key_and_proxy_sessions_are_plain() {
    let (addr, kh, h) = mini_server(Lies::default());
    let mut c = Client::connect(
        addr,
        kh,
        ClientOptions {
            send_key: false,
            ..opts(None)
        },
    )
    .expect("connect");
    assert!(!c.is_encrypted());
    assert_eq!(c.ping().expect("ping").command, b"PONG");
    drop(c);
    assert_eq!(h.join().expect("server").expect("hello").client_key, None);

    let (addr, kh, h) = mini_server(Lies::default());
    let mut c = Client::connect(
        addr,
        kh,
        ClientOptions {
            proxy_server: true,
            ..opts(None)
        },
    )
    .expect("connect");
    assert!(!c.is_encrypted());
    assert_eq!(c.ping().expect("ping").command, b"PONG");
    drop(c);
    assert!(h.join().expect("server").expect("hello").proxy_server);
}

#[test]
fn batches_raw_blocks_and_bad_auth_lengths() {
    let (addr, kh, _h) = mini_server(Lies::default());
    let mut c = Client::connect(addr, kh, opts(None)).expect("connect");
    let ts: Vec<_> = (0..300u16)
        .map(|i| ClientTransmission::raw(&i.to_be_bytes(), b"", b"PING"))
        .collect();
    c.send_batch(&ts).expect("send");
    for i in 0..300u16 {
        assert_eq!(c.recv_for(&i.to_be_bytes()).expect("pong").command, b"PONG");
    }
    // A garbage block keeps the chains in step.
    c.send_raw_block(&[7u8; BLOCK_SIZE]).expect("raw");
    let ts = c.recv_block().expect("err block");
    assert_eq!(ts[0].command, b"ERR BLOCK");
    assert_eq!(c.ping().expect("ping").command, b"PONG");
    // Signed commands encode and go through.
    let sk = ed25519_dalek::SigningKey::from_bytes(&[5u8; 32]);
    let t = ClientTransmission::raw(b"s", b"q", b"SUB").signed(Signer::Ed25519(sk));
    let x = ClientTransmission::raw(b"x", b"q", b"SUB").signed(Signer::X25519([6u8; 32]));
    let e = ClientTransmission::raw(b"e", b"q", b"SUB").signed(Signer::Ed448([8u8; 57]));
    c.send_batch(&[t, x, e]).expect("send");
    for corr in [b"s", b"x", b"e"] {
        assert_eq!(c.recv_for(corr).expect("resp").command, b"ERR CMD UNKNOWN");
    }
    assert!(matches!(
        c.send_batch(&[ClientTransmission::raw(b"big", b"", &vec![0u8; 17000])]),
        Err(ClientError::LargeMsg)
    ));
}

#[test]
fn wrong_identity_is_rejected() {
    let (addr, mut kh, _h) = mini_server(Lies::default());
    kh[0] ^= 1;
    assert!(matches!(
        Client::connect(addr, kh, opts(None)),
        Err(ClientError::Identity)
    ));
}

#[test]
fn wrong_session_id_is_rejected() {
    let (addr, kh, _h) = mini_server(Lies {
        session_id: true,
        ..Lies::default()
    });
    assert!(matches!(
        Client::connect(addr, kh, opts(None)),
        Err(ClientError::BadSession)
    ));
}

#[test]
fn session_key_signed_by_another_key_is_rejected() {
    let (addr, kh, _h) = mini_server(Lies {
        signed_key: true,
        ..Lies::default()
    });
    assert!(matches!(
        Client::connect(addr, kh, opts(None)),
        Err(ClientError::BadAuth)
    ));
}

#[test]
fn no_common_version_is_rejected() {
    let (addr, kh, _h) = mini_server(Lies {
        versions: Some(VersionRange { min: 21, max: 22 }),
        ..Lies::default()
    });
    assert!(matches!(
        Client::connect(addr, kh, opts(None)),
        Err(ClientError::Version)
    ));
}

#[test]
fn a_tls_certificate_alone_gives_an_ordinary_session() {
    let (addr, kh, h) = mini_server(Lies::default());
    let mut c = Client::connect(
        addr,
        kh,
        ClientOptions {
            tls_cert: Some(ClientCert::with_ca().expect("cert")),
            ..opts(None)
        },
    )
    .expect("connect");
    assert!(c.cert_sent());
    assert_eq!(c.ping().expect("ping").command, b"PONG");
    assert!(c.service().is_none() && c.service_role().is_none());
    drop(c);
    assert_eq!(h.join().expect("server").expect("hello").service, None);
}

#[test]
fn a_service_role_offers_the_chain_and_a_signed_session_key() {
    // The mini server sends no service response, so the client gives up waiting for it; what it
    // sent in its hello is what is checked.
    let cert = ClientCert::self_signed().expect("cert");
    let (addr, kh, h) = mini_server(Lies::default());
    let r = Client::connect(
        addr,
        kh,
        ClientOptions {
            tls_cert: Some(cert.clone()),
            service_role: Some(service::ROLE_NOTIFIER),
            timeout: Duration::from_millis(500),
            ..opts(None)
        },
    );
    assert!(r.is_err());
    let svc = h
        .join()
        .expect("server")
        .expect("hello")
        .service
        .expect("service");
    assert_eq!((svc.role, &svc.chain), (b'N', &cert.chain));
    let leaf = keys::PublicAuthKey::Ed25519(cert.key.verifying_key().to_bytes());
    let spki = signed_key::verify_signed_key(&svc.signed_key, &leaf).expect("signed by the leaf");
    assert!(matches!(
        keys::PublicAuthKey::from_spki(&spki),
        Ok(keys::PublicAuthKey::Ed25519(_))
    ));

    // A messaging service needs v19; at v18 the session is an ordinary one.
    let (addr, kh, h) = mini_server(Lies::default());
    let mut c = Client::connect(
        addr,
        kh,
        ClientOptions {
            tls_cert: Some(cert),
            service_role: Some(service::ROLE_MESSAGING),
            ..opts(Some(18))
        },
    )
    .expect("connect");
    assert_eq!(c.ping().expect("ping").command, b"PONG");
    drop(c);
    assert_eq!(h.join().expect("server").expect("hello").service, None);
}

/// `local_addr` binds the socket before connecting: the server sees that address as the peer.
#[test]
fn a_local_address_is_the_source_of_the_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let h = std::thread::spawn(move || listener.accept().map(|(_, peer)| peer.ip()));
    let local = std::net::IpAddr::from([127, 0, 0, 2]);
    let opts = ClientOptions {
        local_addr: Some(local),
        timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    // Nothing answers TLS, so the connect fails once the server drops the socket; the accepted
    // peer is what counts.
    assert!(Client::connect(addr, [0; 32], opts).is_err());
    assert_eq!(h.join().expect("accept thread").expect("accepted"), local);
}

mod signing {
    use super::*;
    use crate::client::queue::{new_queue, KeyAlg, RecipientKeys};
    use ed25519_dalek::{Signature, Verifier};

    const V: Version = 18;
    const SID: [u8; 32] = [0x33; 32];

    fn service() -> ServiceSession {
        ServiceSession {
            role: b'M',
            fingerprint: [0xf1; 32],
            session_key: ed25519_dalek::SigningKey::from_bytes(&[0x51; 32]),
            service_id: vec![0x5e; 24],
        }
    }

    fn ed_verify(key: &ed25519_dalek::SigningKey, msg: &[u8], sig: &[u8]) -> bool {
        let sig = Signature::from_slice(sig).expect("64 bytes");
        key.verifying_key().verify(msg, &sig).is_ok()
    }

    fn authorized(t: &ClientTransmission) -> Vec<u8> {
        let command = match &t.command {
            CommandBody::Cmd(c) => c.to_bytes(V),
            CommandBody::Raw(b) => b.clone(),
        };
        client_signed_bytes(V, &SID, &t.corr_id, &t.entity_id, &command)
    }

    fn run(
        t: &ClientTransmission,
        s: Option<&ServiceSession>,
        server: Option<&[u8; 32]>,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), ClientError> {
        let command = match &t.command {
            CommandBody::Cmd(c) => c.to_bytes(V),
            CommandBody::Raw(b) => b.clone(),
        };
        authorize(V, &SID, t, &command, s, server)
    }

    fn fp_then(s: &ServiceSession, bytes: &[u8]) -> Vec<u8> {
        [&s.fingerprint[..], bytes].concat()
    }

    #[test]
    fn new_sub_and_nsub_are_signed_by_both_keys_in_a_service_session() {
        let s = service();
        let queue_key = ed25519_dalek::SigningKey::from_bytes(&[0x71; 32]);
        let keys = RecipientKeys::generate(KeyAlg::Ed25519);
        let commands = [
            CommandBody::Cmd(Command::New(new_queue(&keys))),
            CommandBody::Cmd(Command::Sub),
            CommandBody::Cmd(Command::NSub),
            CommandBody::Raw(b"SUB".to_vec()),
        ];
        for command in commands {
            let t = ClientTransmission::with_body(b"c1", &[7; 24], command)
                .signed(Signer::Ed25519(queue_key.clone()));
            let (a, slot) = run(&t, Some(&s), None).unwrap();
            let signed = authorized(&t);
            assert!(ed_verify(&queue_key, &fp_then(&s, &signed), &a));
            assert!(!ed_verify(&queue_key, &signed, &a));
            assert!(ed_verify(&s.session_key, &signed, &slot.expect("slot")));
            // Without the service session, or with service signing turned off: plain.
            let (a, slot) = run(&t, None, None).unwrap();
            assert!(ed_verify(&queue_key, &signed, &a) && slot.is_none());
            let mut plain = t.clone();
            plain.service_auth = false;
            let (a, slot) = run(&plain, Some(&s), None).unwrap();
            assert!(ed_verify(&queue_key, &signed, &a) && slot.is_none());
        }
    }

    #[test]
    fn other_commands_are_signed_as_usual_in_a_service_session() {
        let s = service();
        let queue_key = ed25519_dalek::SigningKey::from_bytes(&[0x71; 32]);
        for command in [Command::Ack(vec![1; 24]), Command::Del, Command::Subs(None)] {
            let t = ClientTransmission::new(b"c2", &[7; 24], command)
                .signed(Signer::Ed25519(queue_key.clone()));
            let (a, slot) = run(&t, Some(&s), None).unwrap();
            assert!(ed_verify(&queue_key, &authorized(&t), &a));
            assert!(slot.is_none());
        }
    }

    #[test]
    fn ed448_and_x25519_queue_keys_sign_the_fingerprint_too() {
        let s = service();
        let ed448 = [0x44u8; 57];
        let t = ClientTransmission::new(b"c3", &[7; 24], Command::Sub).signed(Signer::Ed448(ed448));
        let (a, slot) = run(&t, Some(&s), None).unwrap();
        let signed = authorized(&t);
        let a448: &[u8; 114] = a.as_slice().try_into().unwrap();
        assert!(auth::ed448_verify(
            &auth::ed448_public(&ed448),
            &fp_then(&s, &signed),
            a448
        ));
        assert!(ed_verify(&s.session_key, &signed, &slot.unwrap()));

        let server_priv = [0x91u8; 32];
        let server_pub =
            x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(server_priv))
                .to_bytes();
        let x = Signer::X25519([0x92; 32]);
        let t = ClientTransmission::new(b"c4", &[7; 24], Command::Sub).signed(x.clone());
        let (a, slot) = run(&t, Some(&s), Some(&server_pub)).unwrap();
        let a80 = auth::Authorization::from_bytes(&a).unwrap();
        let signed = authorized(&t);
        let check =
            |msg: &[u8]| auth::verify(&x.public_key(), &a80, msg, Some(&server_priv), b"c4");
        assert!(check(&fp_then(&s, &signed)));
        assert!(!check(&signed));
        assert!(ed_verify(&s.session_key, &signed, &slot.unwrap()));
    }

    #[test]
    fn service_authorization_is_the_session_key_alone() {
        let s = service();
        let t = ClientTransmission::new(b"c5", &s.service_id, Command::Subs(None))
            .with_auth(Authorization::Service);
        let (a, slot) = run(&t, Some(&s), None).unwrap();
        assert!(ed_verify(&s.session_key, &authorized(&t), &a));
        assert!(slot.is_none());
        assert!(matches!(
            run(&t, None, None),
            Err(ClientError::NoServiceSession)
        ));
    }
}
