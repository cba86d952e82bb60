//! Private routing, proxy role (simplexmq `Server.hs`, `Client.hs`,
//! `tests/SMPProxyTests.hs`): a client asks one relay (the proxy) for a session to
//! another (the destination) with `PRXY`, gets `PKEY`, and sends `PFWD`s built as a reference
//! client builds them; the proxy forwards them as `RFWD` over its shared session and answers
//! `PRES`. Both relays run on loopback, so the proxy needs `--proxy-allow-private`; no test sends
//! a packet to any other address.

use crate::common;
use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Relay, RelayOptions, TempDir};
use smp_relay::client::proxy::{batch_of, Destination, ForwardedCommand, InnerResponse};
use smp_relay::client::queue::{auth_key, KeyAlg, RecipientKeys};
use smp_relay::client::{
    new_corr_id, Authorization, Client, ClientOptions, ClientTransmission, CommandBody,
};
use smp_relay::crypto::keys::{x25519_from_spki, PublicAuthKey};
use smp_relay::crypto::{hash, signed_key};
use smp_relay::protocol::command::{Command, QueueReq, SmpServer};
use smp_relay::protocol::error::{
    BrokerError, ErrorType, HandshakeError, NetworkError, ProxyError, TransportError,
};
use smp_relay::protocol::handshake::{CertChainPubKey, ClientHello, ServerHello};
use smp_relay::protocol::pad;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::protocol::version::VersionRange;
use smp_relay::server::router::owner_shard;
use smp_relay::transport::tls::{server_config, AcceptState, TlsOptions};
use smp_relay::transport::{block::BLOCK_SIZE, certs};
use support::{create, create_with_corr, expect_body, expect_msg, msg_of, send_cmd, Queue};

const ALLOW_PRIVATE: &str = "--proxy-allow-private";

fn proxy_relay(extra: &[&str]) -> Relay {
    Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: extra.iter().map(|s| s.to_string()).collect(),
    })
}

fn server_of(host: &str, port: u16, key_hash: &[u8]) -> SmpServer {
    SmpServer {
        hosts: vec![host.to_string()],
        port: port.to_string(),
        key_hash: key_hash.to_vec(),
    }
}

fn dest_server(dest: &Relay) -> SmpServer {
    server_of("127.0.0.1", dest.port, &dest.key_hash)
}

/// What a client keeps of `PKEY` (the reference's `ProxiedRelay`).
struct ProxiedRelay {
    session_id: Vec<u8>,
    version: u16,
    versions: VersionRange,
    server_key: [u8; 32],
}

impl ProxiedRelay {
    fn destination(&self) -> Destination {
        Destination {
            session_id: self.session_id.clone(),
            server_key: self.server_key,
            // Only the proxy knows it; the client never needs it.
            sess_secret: [0; 32],
        }
    }
}

fn prxy_raw(c: &mut Client, server: SmpServer, auth: Option<&[u8]>) -> BrokerMsg {
    let r = c
        .request(
            b"",
            Command::Prxy {
                server,
                auth: auth.map(<[u8]>::to_vec),
            },
            Authorization::None,
        )
        .expect("PRXY answered");
    assert_eq!(r.entity_id, b"", "PRXY answers carry an empty entity");
    r.msg.expect("PRXY answer parses")
}

fn proxy_err(e: ProxyError) -> BrokerMsg {
    BrokerMsg::Err(ErrorType::Proxy(e))
}

fn broker_err(e: BrokerError) -> BrokerMsg {
    proxy_err(ProxyError::Broker(e))
}

/// The bare `NETWORK` the reference sends parses as this.
fn network_err() -> BrokerMsg {
    broker_err(BrokerError::Network(NetworkError::Failed))
}

/// PRXY, then the checks `connectSMPProxiedRelay` makes of PKEY: a version in common, the
/// identity certificate matching the address, the session key signed by the chain's leaf.
fn prxy(c: &mut Client, dest: &Relay) -> ProxiedRelay {
    let msg = prxy_raw(c, dest_server(dest), None);
    let BrokerMsg::Pkey {
        session_id,
        versions,
        cert_key,
    } = msg
    else {
        panic!("PKEY expected, got {msg:?}");
    };
    let CertChainPubKey { chain, signed_key } = cert_key;
    assert_eq!(chain.len(), 2, "the destination's [leaf, CA] chain");
    assert_eq!(hash::fingerprint(&chain[1]), dest.key_hash, "identity");
    let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).expect("leaf parses");
    let leaf_key = PublicAuthKey::from_spki(leaf.public_key().raw).expect("leaf key");
    let spki = signed_key::verify_signed_key(&signed_key, &leaf_key).expect("signed by the leaf");
    let server_key = x25519_from_spki(&spki).expect("X25519 session key");
    let version = versions
        .intersect(&VersionRange { min: 6, max: 20 })
        .expect("a version in common")
        .max;
    ProxiedRelay {
        session_id,
        version,
        versions,
        server_key,
    }
}

/// What a forwarded command came back as.
#[derive(Debug)]
enum Forwarded {
    Pres(InnerResponse),
    Err(ErrorType),
}

/// Builds the PFWD of one command as `proxySMPCommand` does (corrId = nonce, entity = the
/// proxy↔destination session ID).
fn pfwd_transmission(
    pr: &ProxiedRelay,
    entity: &[u8],
    cmd: Command,
    auth: Authorization,
) -> (ForwardedCommand, ClientTransmission) {
    let dest = pr.destination();
    let fc = ForwardedCommand::new(pr.version, &dest);
    let t = fc.transmission(&dest, entity, &CommandBody::Cmd(cmd), &auth);
    let b = batch_of(&[t]).expect("a batch of one");
    let et = fc.seal(&b).expect("fits the padded length");
    let pfwd = Command::PFwd {
        version: pr.version,
        key: fc.cmd_public,
        et,
    };
    let ct = ClientTransmission::new(&fc.nonce, &pr.session_id, pfwd);
    (fc, ct)
}

fn read_forwarded(c: &mut Client, pr: &ProxiedRelay, fc: &ForwardedCommand) -> Forwarded {
    let r = c.recv_for(&fc.nonce).expect("PFWD answered");
    assert_eq!(
        r.entity_id, pr.session_id,
        "PFWD answers carry the session ID"
    );
    match r.msg {
        Ok(BrokerMsg::Pres(r2)) => {
            let inner = fc.open_response(&r2).expect("PRES opens");
            assert_eq!(
                inner.corr_id, fc.nonce,
                "the inner answer carries the nonce"
            );
            Forwarded::Pres(inner)
        }
        Ok(BrokerMsg::Err(e)) => Forwarded::Err(e),
        other => panic!("PRES or ERR expected, got {other:?}"),
    }
}

fn pfwd(
    c: &mut Client,
    pr: &ProxiedRelay,
    entity: &[u8],
    cmd: Command,
    auth: Authorization,
) -> Forwarded {
    let (fc, t) = pfwd_transmission(pr, entity, cmd, auth);
    c.send_batch(&[t]).expect("send PFWD");
    read_forwarded(c, pr, &fc)
}

/// PFWD expecting PRES; returns the destination's answer.
fn pfwd_ok(
    c: &mut Client,
    pr: &ProxiedRelay,
    entity: &[u8],
    cmd: Command,
    auth: Authorization,
) -> BrokerMsg {
    match pfwd(c, pr, entity, cmd, auth) {
        Forwarded::Pres(inner) => {
            assert_eq!(inner.entity_id, entity, "inner answer entity");
            inner.msg
        }
        Forwarded::Err(e) => panic!("PRES expected, got ERR {e:?}"),
    }
}

fn sign(s: &smp_relay::client::Signer) -> Authorization {
    Authorization::Sign(s.clone())
}

#[test]
fn forwarded_send_skey_lkey_lget_reach_the_destination() {
    let dest = Relay::start();
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut r = dest.client();
    let mut c = proxy.client();
    let pr = prxy(&mut c, &dest);
    assert_eq!(
        pr.versions,
        VersionRange { min: 8, max: 20 },
        "the destination's range, capped to 8..20"
    );
    assert_eq!(pr.session_id.len(), 32, "tls-unique of the proxy's session");

    // SKEY, then a signed SEND, for each key algorithm.
    for alg in [KeyAlg::Ed25519, KeyAlg::Ed448, KeyAlg::X25519] {
        let q = create(&mut r);
        let s = auth_key(alg);
        assert_eq!(
            pfwd_ok(
                &mut c,
                &pr,
                q.sid(),
                Command::SKey(s.public_key()),
                sign(&s)
            ),
            BrokerMsg::Ok,
            "{alg:?}: SKEY"
        );
        let body = format!("through the proxy, {alg:?}");
        assert_eq!(
            pfwd_ok(&mut c, &pr, q.sid(), send_cmd(body.as_bytes()), sign(&s)),
            BrokerMsg::Ok,
            "{alg:?}: SEND"
        );
        expect_body(&mut r, &q, body.as_bytes());
        // The destination's own errors come back inside PRES.
        assert_eq!(
            pfwd_ok(&mut c, &pr, q.sid(), send_cmd(b"x"), Authorization::None),
            BrokerMsg::Err(ErrorType::Auth),
            "{alg:?}: unsigned SEND to a secured queue"
        );
    }

    // LKEY on a messaging queue with link data: secures it and returns the data.
    let corr = new_corr_id();
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = smp_relay::client::queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Messaging(Some(
        smp_relay::client::queue::new_link(&corr, b"fixed", b"user"),
    )));
    let q = create_with_corr(&mut r, keys, new, &corr);
    let link_id = q.ids.link_id.clone().expect("link ID");
    let s = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        pfwd_ok(
            &mut c,
            &pr,
            &link_id,
            Command::LKey(s.public_key()),
            sign(&s)
        ),
        BrokerMsg::Lnk {
            sender_id: q.sid().to_vec(),
            fixed: b"fixed".to_vec(),
            user: b"user".to_vec(),
        }
    );
    assert_eq!(
        pfwd_ok(&mut c, &pr, q.sid(), send_cmd(b"after LKEY"), sign(&s)),
        BrokerMsg::Ok
    );
    expect_body(&mut r, &q, b"after LKEY");

    // LGET of a contact address, then an unsigned SEND to it.
    let corr = new_corr_id();
    let link_id = new_corr_id().to_vec();
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = smp_relay::client::queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(Some((
        link_id.clone(),
        smp_relay::client::queue::new_link(&corr, b"cfixed", b"cuser"),
    ))));
    let q = create_with_corr(&mut r, keys, new, &corr);
    assert_eq!(
        pfwd_ok(&mut c, &pr, &link_id, Command::LGet, Authorization::None),
        BrokerMsg::Lnk {
            sender_id: q.sid().to_vec(),
            fixed: b"cfixed".to_vec(),
            user: b"cuser".to_vec(),
        }
    );
    assert_eq!(
        pfwd_ok(
            &mut c,
            &pr,
            q.sid(),
            send_cmd(b"hello"),
            Authorization::None
        ),
        BrokerMsg::Ok
    );
    expect_body(&mut r, &q, b"hello");

    // Another client of the proxy shares its session to the destination.
    let mut c2 = proxy.client();
    let pr2 = prxy(&mut c2, &dest);
    assert_eq!(pr2.session_id, pr.session_id, "one session per destination");
    assert_eq!(
        pfwd_ok(
            &mut c2,
            &pr2,
            q.sid(),
            send_cmd(b"second client"),
            Authorization::None
        ),
        BrokerMsg::Ok
    );
    assert_eq!(
        msg_of(&q, support::ack(&mut r, &q, b"")).msg.body(),
        Some(&b"second client"[..])
    );

    // A session the proxy does not have.
    let unknown = ProxiedRelay {
        session_id: vec![7; 32],
        ..pr
    };
    match pfwd(
        &mut c,
        &unknown,
        q.sid(),
        send_cmd(b"x"),
        Authorization::None,
    ) {
        Forwarded::Err(e) => assert_eq!(e, ErrorType::Proxy(ProxyError::NoSession)),
        other => panic!("NO_SESSION expected, got {other:?}"),
    }
}

/// A web client routes privately through the proxy as a native one does: PRXY and PFWD over
/// WebSocket, on a dedicated WebSocket port and on a port shared with native clients by SNI.
#[test]
fn web_clients_send_through_the_proxy() {
    let dest = Relay::start();
    let files = TempDir::new("web-cert").expect("a temp dir");
    let cert = common::web::write(files.path());
    let (shared, ws) = (common::free_port(), common::free_port());
    let mut args = cert.args(shared);
    args.extend([
        "--websockets".to_string(),
        ws.to_string(),
        ALLOW_PRIVATE.to_string(),
    ]);
    let proxy = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: args,
    });
    let mut r = dest.client();
    let at = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let web = ClientOptions {
        sni: Some(common::web::HOST.to_string()),
        ..ClientOptions::websocket()
    };
    let clients = [
        (
            "shared port",
            Client::connect(at(shared), proxy.key_hash, web),
        ),
        (
            "WebSocket port",
            Client::connect(at(ws), proxy.key_hash, ClientOptions::websocket()),
        ),
    ];
    for (port, c) in clients {
        let mut c = c.unwrap_or_else(|e| panic!("{port}: {e}\n{}", proxy.log_text()));
        let pr = prxy(&mut c, &dest);
        let q = create(&mut r);
        let s = auth_key(KeyAlg::Ed25519);
        let skey = Command::SKey(s.public_key());
        assert_eq!(
            pfwd_ok(&mut c, &pr, q.sid(), skey, sign(&s)),
            BrokerMsg::Ok,
            "{port}"
        );
        let body = format!("from a web client on the {port}");
        let sent = pfwd_ok(&mut c, &pr, q.sid(), send_cmd(body.as_bytes()), sign(&s));
        assert_eq!(sent, BrokerMsg::Ok, "{port}");
        expect_body(&mut r, &q, body.as_bytes());
    }
}

#[test]
fn a_destination_that_is_down_is_a_network_error() {
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut c = proxy.client();
    // A port nothing listens on (bound, then released).
    let port = common::free_port();
    assert_eq!(
        prxy_raw(&mut c, server_of("127.0.0.1", port, &[1; 32]), None),
        network_err()
    );
    // The reference repeats a failure for a while instead of reconnecting at once.
    assert_eq!(
        prxy_raw(&mut c, server_of("127.0.0.1", port, &[1; 32]), None),
        network_err()
    );
    proxy.assert_serves();
}

#[test]
fn failed_prxy_warnings_do_not_flood_the_log() {
    const FAILED: u64 = 500;
    // One line per 100 ms instead of a second (a hidden test flag), so that the count of the last
    // interval is written a tenth of a second after the flood.
    const INTERVAL_MS: u64 = 100;
    let proxy = proxy_relay(&[
        ALLOW_PRIVATE,
        "--test-warning-interval-ms",
        &INTERVAL_MS.to_string(),
    ]);
    let mut c = proxy.client();
    let port = common::free_port();
    let started = Instant::now();
    for _ in 0..FAILED {
        assert_eq!(
            prxy_raw(&mut c, server_of("127.0.0.1", port, &[1; 32]), None),
            network_err()
        );
    }
    let what = "proxy: error connecting";
    let deadline = Instant::now() + Duration::from_secs(10);
    let (lines, counted) = loop {
        let (lines, counted) = proxy.warnings(what);
        if counted >= FAILED || Instant::now() > deadline {
            break (lines, counted);
        }
        common::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let intervals = elapsed.as_millis() as u64 / INTERVAL_MS;
    assert_eq!(counted, FAILED, "every failed PRXY is accounted for");
    // One line an interval, and one for the count of the last.
    assert!(
        lines as u64 <= intervals + 2,
        "{lines} lines for {FAILED} failed PRXY in {elapsed:?}"
    );
}

/// The reference's proxy statistics (`pRelays`, `pMsgFwds`, `pMsgFwdsRecv`) in the metrics file,
/// counted as the reference counts them: a session and a forwarded SEND that succeed, a
/// destination that is down and a PFWD without a session ("connect" errors), and the RFWD the
/// destination answered. (Nothing is "own" without `own_server_domains`; its matching is a unit
/// test of `server::proxy`.)
#[test]
fn proxy_statistics_count_sessions_and_forwarded_messages() {
    let dest = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: vec!["--metrics-interval".into(), "1".into()],
    });
    let proxy = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: vec![
            ALLOW_PRIVATE.into(),
            "--metrics-interval".into(),
            "1".into(),
        ],
    });
    let mut r = dest.client();
    let mut c = proxy.client();
    let pr = prxy(&mut c, &dest);
    let q = create(&mut r);
    assert_eq!(
        pfwd_ok(
            &mut c,
            &pr,
            q.sid(),
            send_cmd(b"counted"),
            Authorization::None
        ),
        BrokerMsg::Ok
    );
    expect_body(&mut r, &q, b"counted");
    let down = common::free_port();
    assert_eq!(
        prxy_raw(&mut c, server_of("localhost", down, &[1; 32]), None),
        network_err()
    );
    let no_session = ProxiedRelay {
        session_id: vec![3; 32],
        ..pr
    };
    let (_, t) = pfwd_transmission(&no_session, q.sid(), send_cmd(b"lost"), Authorization::None);
    c.send_batch(&[t]).expect("send PFWD");
    let answer = c.recv_block().expect("answer")[0].msg.clone();
    assert_eq!(answer, Ok(proxy_err(ProxyError::NoSession)));

    let all = |name: &str| format!("simplex_smp_relay_{name}{{source=\"all\"}}");
    let err = |name: &str, src: &str, ty: &str| {
        format!("simplex_smp_relay_{name}{{source=\"{src}\",type=\"{ty}\"}}")
    };
    let m = proxy.metrics_until("the proxy statistics", |m| {
        m.get(&all("messages_requests")).copied() == Some(2)
            && m.get(&all("sessions_requests")).copied() == Some(2)
    });
    assert_eq!(m[&all("sessions_successes")], 1);
    assert_eq!(m[&err("sessions_errors", "all", "connect")], 1);
    assert_eq!(m[&err("sessions_errors", "all", "other")], 0);
    assert_eq!(m[&all("messages_successes")], 1);
    assert_eq!(m[&err("messages_errors", "all", "connect")], 1);
    assert_eq!(m["simplex_smp_relay_sessions_requests{source=\"own\"}"], 0);
    assert_eq!(
        m["simplex_smp_relay_messages_received"], 0,
        "the proxy answered no RFWD"
    );
    let d = dest.metrics_until("the RFWD answered", |m| {
        m.get("simplex_smp_relay_messages_received").copied() == Some(1)
    });
    assert_eq!(d[&all("sessions_requests")], 0);
}

#[test]
fn a_wrong_key_hash_is_a_network_error() {
    let dest = Relay::start();
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut c = proxy.client();
    let mut kh = dest.key_hash;
    kh[5] ^= 0x40;
    assert_eq!(
        prxy_raw(&mut c, server_of("127.0.0.1", dest.port, &kh), None),
        network_err(),
        "the reference fails the TLS handshake on an identity mismatch"
    );
    // The right hash still works.
    prxy(&mut c, &dest);
}

#[test]
fn private_destinations_are_refused_without_the_allow_option() {
    let dest = Relay::start();
    let proxy = proxy_relay(&[]);
    let mut c = proxy.client();
    let host_err = broker_err(BrokerError::Host);
    for host in [
        "127.0.0.1",
        "localhost",
        "::1",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
    ] {
        assert_eq!(
            prxy_raw(&mut c, server_of(host, dest.port, &dest.key_hash), None),
            host_err,
            "{host}"
        );
    }
    // .onion needs the SOCKS proxy.
    assert_eq!(
        prxy_raw(
            &mut c,
            server_of("abcdefghijklmnop.onion", 5223, &dest.key_hash),
            None
        ),
        host_err
    );
    proxy.assert_serves();
}

#[test]
fn the_role_off_or_a_wrong_password_is_basic_auth() {
    let dest = Relay::start();
    let off = proxy_relay(&["--no-proxy", ALLOW_PRIVATE]);
    let mut c = off.client();
    assert_eq!(
        prxy_raw(&mut c, dest_server(&dest), None),
        proxy_err(ProxyError::BasicAuth)
    );
    // Without a session there is nothing to forward over.
    let pr = ProxiedRelay {
        session_id: vec![1; 32],
        version: 18,
        versions: VersionRange { min: 8, max: 18 },
        server_key: [9; 32],
    };
    match pfwd(
        &mut c,
        &pr,
        b"sender-id",
        send_cmd(b"x"),
        Authorization::None,
    ) {
        Forwarded::Err(e) => assert_eq!(e, ErrorType::Proxy(ProxyError::NoSession)),
        other => panic!("NO_SESSION expected, got {other:?}"),
    }

    let locked = proxy_relay(&["--proxy-password", "s3cret", ALLOW_PRIVATE]);
    let mut c = locked.client();
    assert_eq!(
        prxy_raw(&mut c, dest_server(&dest), None),
        proxy_err(ProxyError::BasicAuth),
        "no password"
    );
    assert_eq!(
        prxy_raw(&mut c, dest_server(&dest), Some(b"wrong")),
        proxy_err(ProxyError::BasicAuth),
        "wrong password"
    );
    assert!(matches!(
        prxy_raw(&mut c, dest_server(&dest), Some(b"s3cret")),
        BrokerMsg::Pkey { .. }
    ));
}

/// A fake destination: TLS with a relay's own certificates, then a server hello offering
/// `versions`; returns the client hello it got.
struct FakeDestination {
    port: u16,
    key_hash: [u8; 32],
    hello: thread::JoinHandle<Option<ClientHello>>,
    /// Dropped once the test has the proxy's answer: the session stays open until then.
    release: std::sync::mpsc::Sender<()>,
    _dir: TempDir,
}

impl FakeDestination {
    /// Ends the session (the test has what it needed of the proxy) and returns the client hello.
    fn finish(self) -> Option<ClientHello> {
        drop(self.release);
        self.hello.join().expect("fake thread")
    }
}

fn fake_destination(versions: VersionRange) -> FakeDestination {
    fake_destination_with(versions, Lie::None)
}

/// What a fake destination gets wrong in its hello.
#[derive(Clone, Copy, PartialEq)]
enum Lie {
    None,
    /// Another session ID than the TLS session's.
    SessionId,
    /// Another relay's chain (and key signed by that chain's leaf) in the hello.
    Chain,
}

fn fake_destination_with(versions: VersionRange, lie: Lie) -> FakeDestination {
    let dir = TempDir::new("fake-dest").expect("a temp dir");
    certs::generate("127.0.0.1")
        .expect("certificates")
        .write_files(dir.path())
        .expect("write certificates");
    let creds = certs::load(dir.path()).expect("load certificates");
    let key_hash = creds.key_hash;
    let other_dir = TempDir::new("fake-dest-other").expect("a temp dir");
    certs::generate("127.0.0.1")
        .expect("certificates")
        .write_files(other_dir.path())
        .expect("write certificates");
    let other = certs::load(other_dir.path()).expect("load certificates");
    let config = server_config(&creds, &TlsOptions::default()).expect("TLS config");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let hello = thread::spawn(move || {
        let (mut sock, _) = listener.accept().ok()?;
        sock.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let mut state = AcceptState::new(&config).ok()?;
        let mut buf = vec![0u8; 16384];
        let mut out = Vec::new();
        while state.is_handshaking() {
            let n = sock.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            state.feed(&buf[..n]).ok()?;
            state.take_output(&mut out);
            sock.write_all(&out).ok()?;
            out.clear();
        }
        let (mut tls, session_id) = state.finish().ok()?;
        let secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
        let public = x25519_dalek::PublicKey::from(&secret).to_bytes();
        let mut session_id = session_id;
        if lie == Lie::SessionId {
            session_id[0] ^= 1;
        }
        let signer = if lie == Lie::Chain { &other } else { &creds };
        let hello = ServerHello {
            versions,
            session_id,
            cert_key: Some(CertChainPubKey {
                chain: signer.chain_der.clone(),
                signed_key: signer.leaf_key.signed_x25519_key(&public),
            }),
            web_proof: None,
        };
        let block = pad::pad(&hello.encode(), BLOCK_SIZE).ok()?;
        let mut stream = rustls::Stream::new(&mut tls, &mut sock);
        stream.write_all(&block).ok()?;
        let mut got = vec![0u8; BLOCK_SIZE];
        stream.read_exact(&mut got).ok()?;
        let client = ClientHello::decode(pad::unpad(&got).ok()?).ok();
        // Keep the session open, as a live destination would, until the test has the proxy's
        // answer (bounded, should the test fail first).
        let _ = released.recv_timeout(Duration::from_secs(10));
        client
    });
    FakeDestination {
        port,
        key_hash,
        hello,
        release,
        _dir: dir,
    }
}

/// PRXY to a fake destination offering `offered`: the proxy's answer, and the hello the proxy
/// sent the destination.
fn prxy_fake(offered: VersionRange) -> (BrokerMsg, ClientHello) {
    let fake = fake_destination(offered);
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut c = proxy.client();
    let msg = prxy_raw(
        &mut c,
        server_of("127.0.0.1", fake.port, &fake.key_hash),
        None,
    );
    let hello = fake.finish().expect("client hello");
    (msg, hello)
}

/// The versions of a PKEY answer.
fn pkey_versions(msg: BrokerMsg) -> VersionRange {
    match msg {
        BrokerMsg::Pkey { versions, .. } => versions,
        other => panic!("PKEY expected, got {other:?}"),
    }
}

#[test]
fn a_destination_below_v8_is_a_transport_version_error() {
    let (msg, hello) = prxy_fake(VersionRange { min: 6, max: 7 });
    assert_eq!(
        msg,
        broker_err(BrokerError::Transport(TransportError::Version))
    );
    assert_eq!(hello.version, 7, "the highest common version");
    assert!(hello.client_key.is_some(), "the proxy sends its key");
    assert_eq!(hello.service, None);
}

#[test]
fn a_destination_below_v14_is_capped_at_v10() {
    let (msg, hello) = prxy_fake(VersionRange { min: 6, max: 13 });
    assert_eq!(pkey_versions(msg), VersionRange { min: 8, max: 10 });
    assert_eq!(
        hello.version, 10,
        "capped so that no block encryption starts"
    );
    assert!(!hello.proxy_server, "no proxy flag below v14");
    assert!(hello.client_key.is_some());
}

#[test]
fn a_proxy_announces_itself_to_a_current_destination() {
    let (msg, hello) = prxy_fake(VersionRange { min: 6, max: 20 });
    assert_eq!(pkey_versions(msg), VersionRange { min: 8, max: 20 });
    assert_eq!(hello.version, 20);
    assert!(hello.proxy_server, "proxyServer = T");
    assert!(hello.client_key.is_some());
    assert_eq!(hello.service, None);
}

#[test]
fn a_thousand_forwarded_sends_from_ten_connections() {
    const CLIENTS: usize = 10;
    const PER_CLIENT: usize = 100;
    const WINDOW: usize = 25;
    let dest = Arc::new(Relay::start());
    let proxy = Arc::new(proxy_relay(&[ALLOW_PRIVATE]));
    // A recipient connection per queue, so that each sees only its own queue's messages.
    let mut recipients: Vec<Client> = (0..CLIENTS).map(|_| dest.client()).collect();
    let queues: Vec<Queue> = recipients
        .iter_mut()
        .map(|r| support::create_alg(r, KeyAlg::Ed25519))
        .collect();
    let started = Instant::now();
    let workers: Vec<_> = queues
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let (dest, proxy, sid) = (dest.clone(), proxy.clone(), q.sid().to_vec());
            thread::spawn(move || {
                let mut c = proxy.client();
                let pr = prxy(&mut c, &dest);
                let mut answered = 0;
                for window in 0..PER_CLIENT / WINDOW {
                    let mut sent = Vec::new();
                    let mut ts = Vec::new();
                    for j in 0..WINDOW {
                        let body = format!("c{i} m{}", window * WINDOW + j);
                        let (fc, t) = pfwd_transmission(
                            &pr,
                            &sid,
                            send_cmd(body.as_bytes()),
                            Authorization::None,
                        );
                        sent.push(fc);
                        ts.push(t);
                    }
                    c.send_batch(&ts).expect("send PFWDs");
                    for fc in &sent {
                        match read_forwarded(&mut c, &pr, fc) {
                            Forwarded::Pres(inner) => assert_eq!(inner.msg, BrokerMsg::Ok),
                            Forwarded::Err(e) => panic!("client {i}: ERR {e:?}"),
                        }
                        answered += 1;
                    }
                }
                answered
            })
        })
        .collect();
    let answered: usize = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    assert_eq!(answered, CLIENTS * PER_CLIENT);
    eprintln!(
        "{answered} forwarded SENDs answered in {:?}",
        started.elapsed()
    );
    // Every message reached its queue: the first is pushed, each ACK brings the next.
    for (i, (q, r)) in queues.iter().zip(recipients.iter_mut()).enumerate() {
        let mut bodies = Vec::new();
        let mut m = expect_msg(r, q);
        loop {
            bodies.push(String::from_utf8(m.msg.body().expect("a message").to_vec()).unwrap());
            match support::ack(r, q, &m.msg_id) {
                BrokerMsg::Ok => break,
                next => m = msg_of(q, next),
            }
        }
        bodies.sort();
        let mut expected: Vec<String> = (0..PER_CLIENT).map(|j| format!("c{i} m{j}")).collect();
        expected.sort();
        assert_eq!(bodies, expected, "queue {i}");
    }
}

#[test]
fn a_forwarded_send_reaches_a_queue_owned_by_another_shard() {
    let dest = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec![],
    });
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut r = dest.client();
    // Queues owned by both shards of the destination, whichever shard holds the proxy's session.
    let mut queues: Vec<Queue> = Vec::new();
    while !(0..2).all(|s| queues.iter().any(|q| owner_shard(q.rid(), 2) == s)) {
        assert!(queues.len() < 64, "queues land on both shards");
        queues.push(create(&mut r));
    }
    let mut c = proxy.client();
    let pr = prxy(&mut c, &dest);
    for (i, q) in queues.iter().enumerate() {
        let body = format!("to shard {}", owner_shard(q.rid(), 2));
        let s = auth_key(KeyAlg::Ed25519);
        assert_eq!(
            pfwd_ok(
                &mut c,
                &pr,
                q.sid(),
                Command::SKey(s.public_key()),
                sign(&s)
            ),
            BrokerMsg::Ok,
            "queue {i}: SKEY"
        );
        assert_eq!(
            pfwd_ok(&mut c, &pr, q.sid(), send_cmd(body.as_bytes()), sign(&s)),
            BrokerMsg::Ok,
            "queue {i}: SEND"
        );
        expect_body(&mut r, q, body.as_bytes());
    }
}

#[test]
fn a_restarted_destination_gets_a_new_session() {
    let mut dest = Relay::start();
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut r = dest.client();
    let q = create(&mut r);
    let mut c = proxy.client();
    let pr = prxy(&mut c, &dest);
    assert_eq!(
        pfwd_ok(
            &mut c,
            &pr,
            q.sid(),
            send_cmd(b"before"),
            Authorization::None
        ),
        BrokerMsg::Ok
    );
    drop(r);
    dest.stop();
    // The proxy notices the lost session and forgets it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match pfwd(&mut c, &pr, q.sid(), send_cmd(b"lost"), Authorization::None) {
            Forwarded::Err(ErrorType::Proxy(ProxyError::NoSession)) => break,
            Forwarded::Err(_) if Instant::now() < deadline => {
                common::sleep(Duration::from_millis(100))
            }
            other => panic!("NO_SESSION expected once the destination is gone, got {other:?}"),
        }
    }
    dest.restart();
    let pr2 = prxy(&mut c, &dest);
    assert_ne!(pr2.session_id, pr.session_id, "a new session");
    assert_eq!(
        pfwd_ok(
            &mut c,
            &pr2,
            q.sid(),
            send_cmd(b"after"),
            Authorization::None
        ),
        BrokerMsg::Ok
    );
    // Both messages are there, in order.
    let mut r = dest.client();
    let m = support::sub_with_msg(&mut r, &q);
    assert_eq!(m.msg.body(), Some(&b"before"[..]));
    let next = msg_of(&q, support::ack(&mut r, &q, &m.msg_id));
    assert_eq!(next.msg.body(), Some(&b"after"[..]));
}

#[test]
fn the_proxy_password_defaults_to_the_create_password() {
    let dest = Relay::start();
    let mut proxy = proxy_relay(&[ALLOW_PRIVATE]);
    proxy.stop();
    let ini = proxy.dir.path().join("smp-server.ini");
    let text = std::fs::read_to_string(&ini).expect("read ini");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("# create_password"))
        .expect("the commented create_password line")
        .to_string();
    std::fs::write(&ini, text.replace(&line, "create_password = pw123")).expect("write ini");
    proxy.restart();
    let mut c = proxy.client();
    assert_eq!(
        prxy_raw(&mut c, dest_server(&dest), None),
        proxy_err(ProxyError::BasicAuth)
    );
    assert!(matches!(
        prxy_raw(&mut c, dest_server(&dest), Some(b"pw123")),
        BrokerMsg::Pkey { .. }
    ));
}

#[test]
fn a_hello_that_does_not_match_the_tls_session_is_a_transport_error() {
    let proxy = proxy_relay(&[ALLOW_PRIVATE]);
    let mut c = proxy.client();
    let current = VersionRange { min: 6, max: 20 };
    for (lie, expected) in [
        (Lie::SessionId, TransportError::Session),
        (
            Lie::Chain,
            TransportError::Handshake(HandshakeError::BadAuth),
        ),
    ] {
        let fake = fake_destination_with(current, lie);
        assert_eq!(
            prxy_raw(
                &mut c,
                server_of("127.0.0.1", fake.port, &fake.key_hash),
                None
            ),
            broker_err(BrokerError::Transport(expected))
        );
        // The proxy hung up without a client hello.
        assert_eq!(fake.finish(), None);
    }
}

/// Accepts one connection on `l` within `within`; `None` if none came.
fn accept_within(l: &TcpListener, within: Duration) -> Option<std::net::TcpStream> {
    l.set_nonblocking(true).expect("nonblocking listener");
    let deadline = Instant::now() + within;
    loop {
        match l.accept() {
            Ok((s, _)) => return Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                common::sleep(Duration::from_millis(20))
            }
            Err(_) => return None,
        }
    }
}

/// `[PROXY] client_concurrency` (`start --proxy-client-concurrency`, simplexmq `Server.hs`,
/// `forkProxiedCmd`: a client's proxied commands wait while `serverClientConcurrency` are being
/// answered). The destinations accept TCP and say nothing, so each PRXY to them is in flight until
/// the test closes its socket. With 1, a connection's second PRXY is not started while its first
/// is in flight, and the connection reads nothing after it meanwhile (a PING behind it is
/// answered after the first PRXY); with the default, both destinations are asked at once.
#[test]
fn client_concurrency_bounds_a_connection_s_forwarded_commands() {
    for limit in [Some("1"), None] {
        let mut extra = vec![ALLOW_PRIVATE];
        extra.extend(limit.iter().flat_map(|n| ["--proxy-client-concurrency", n]));
        let proxy = proxy_relay(&extra);
        let silent = || TcpListener::bind("127.0.0.1:0").expect("bind");
        let (a, b) = (silent(), silent());
        let to = |l: &TcpListener| Command::Prxy {
            server: server_of("127.0.0.1", l.local_addr().expect("addr").port(), &[1; 32]),
            auth: None,
        };
        let mut c = proxy.client();
        let send = |c: &mut Client, corr: &[u8], cmd: Command| {
            c.send_batch(&[ClientTransmission::new(corr, b"", cmd)])
                .expect("send")
        };
        send(&mut c, b"first", to(&a));
        let held_a = accept_within(&a, common::COMMAND_TIMEOUT).expect("the first PRXY connects");
        send(&mut c, b"second", to(&b));
        send(&mut c, b"ping", Command::Ping);
        let held_b = match limit {
            // Nothing may reach b while a is asked; 2 s is long enough for a relay that ignored
            // the limit to connect, and a correct one never does.
            Some(_) => {
                let early = accept_within(&b, Duration::from_secs(2));
                assert!(early.is_none(), "the second PRXY started during the first");
                None
            }
            None => Some(
                accept_within(&b, common::COMMAND_TIMEOUT)
                    .expect("by default both PRXYs are in flight at once"),
            ),
        };
        let is_proxy_err = |t: &smp_relay::client::ServerTransmission| {
            matches!(t.msg, Ok(BrokerMsg::Err(ErrorType::Proxy(_))))
        };
        // A destination that closes fails its PRXY.
        drop(held_a);
        // Answers in the order the relay sent them, up to the first PRXY's.
        let mut before = Vec::new();
        loop {
            let t = c.recv().expect("an answer");
            if t.corr_id == b"first" {
                assert!(is_proxy_err(&t), "{:?}", t.msg);
                break;
            }
            before.push(t.corr_id);
        }
        if limit.is_some() {
            assert!(
                before.is_empty(),
                "answered before the first PRXY: {before:?}"
            );
        }
        // The second PRXY connects now (with the limit) or did already: fail it too.
        let held_b = held_b.or_else(|| accept_within(&b, common::COMMAND_TIMEOUT));
        assert!(held_b.is_some(), "the second PRXY connects");
        drop(held_b);
        if !before.iter().any(|t| t == b"second") {
            let second = c.recv_for(b"second").expect("the second PRXY answered");
            assert!(is_proxy_err(&second), "{:?}", second.msg);
        }
        if !before.iter().any(|t| t == b"ping") {
            let pong = c.recv_for(b"ping").expect("PING answered");
            assert_eq!(pong.msg, Ok(BrokerMsg::Pong));
        }
        proxy.assert_serves();
    }
}
