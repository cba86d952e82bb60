//! SMP over WebSocket on a dedicated port (`start --websockets`, simplexmq
//! `src/Simplex/Messaging/Transport/WebSockets.hs`): the queue commands over wss next to a native
//! client, and every malformed upgrade and frame closing only its own connection. The WebSocket
//! side of these tests is written here by hand over OpenSSL (upgrade, masking, fragments), or is
//! the client library's own framing (`src/client/conn.rs`), never the relay's.

use crate::common;
use crate::support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};

use base64::Engine;
use common::wire::{self, BLOCK};
use common::{free_port, web, Relay, RelayOptions, TempDir};
use openssl::ssl::SslStream;
use smp_relay::client::queue::{auth_key, KeyAlg};
use smp_relay::client::{Client, ClientOptions};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::protocol::version::SERVER_VERSIONS;
use support::*;

type Tls = SslStream<TcpStream>;

/// A relay with one WebSocket port; returns it and that port's address.
fn relay_with_ws(extra: &[&str]) -> (Relay, SocketAddr) {
    let ws_port = free_port();
    let mut extra_args = vec!["--websockets".to_string(), ws_port.to_string()];
    extra_args.extend(extra.iter().map(|a| a.to_string()));
    let relay = Relay::start_with(RelayOptions {
        extra_args,
        ..RelayOptions::default()
    });
    (relay, SocketAddr::from(([127, 0, 0, 1], ws_port)))
}

/// A relay whose second SMP port also serves web clients by SNI (`[WEB] https`); returns it, that
/// port's address, the web certificate and the folder holding its files.
fn relay_with_shared_port() -> (Relay, SocketAddr, web::WebCert, TempDir) {
    let files = TempDir::new("web-cert").expect("a temp dir");
    let cert = web::write(files.path());
    let port = free_port();
    let relay = Relay::start_with(RelayOptions {
        extra_args: cert.args(port),
        ..RelayOptions::default()
    });
    (relay, SocketAddr::from(([127, 0, 0, 1], port)), cert, files)
}

/// A web client of the library on a shared port: SNI, WebSocket, the challenge checked.
fn web_client(relay: &Relay, shared: SocketAddr) -> Client {
    let opts = ClientOptions {
        sni: Some(web::HOST.to_string()),
        ..ClientOptions::websocket()
    };
    Client::connect(shared, relay.key_hash, opts)
        .unwrap_or_else(|e| panic!("web client: {e}\nrelay log:\n{}", relay.log_text()))
}

fn ws_client(relay: &Relay, ws: SocketAddr) -> Client {
    Client::connect(ws, relay.key_hash, ClientOptions::websocket())
        .unwrap_or_else(|e| panic!("wss connect: {e}\nrelay log:\n{}", relay.log_text()))
}

fn tls(ws: SocketAddr) -> Tls {
    wire::openssl_connect(ws, Some(&[b"http/1.1"]), false).expect("TLS to the WebSocket port")
}

fn request(extra: &[&str], key: Option<&str>, version: &str) -> String {
    request_to("/smp?x=1", extra, key, version)
}

fn request_to(target: &str, extra: &[&str], key: Option<&str>, version: &str) -> String {
    let mut r = format!(
        "GET {target} HTTP/1.1\r\nHost: relay.test\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\n"
    );
    if let Some(k) = key {
        r += &format!("Sec-WebSocket-Key: {k}\r\n");
    }
    r += &format!("Sec-WebSocket-Version: {version}\r\n");
    for h in extra {
        r += h;
        r += "\r\n";
    }
    r + "\r\n"
}

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// The answer's head, up to its empty line (or what came before the connection closed).
fn read_head(s: &mut Tls) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A client frame, masked unless `mask` is `None`.
fn frame(fin: bool, opcode: u8, mask: Option<[u8; 4]>, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![(if fin { 0x80 } else { 0 }) | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => f.push(m | n as u8),
        n if n <= 0xffff => {
            f.push(m | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(m | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(k) => {
            f.extend_from_slice(&k);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ k[i % 4]));
        }
        None => f.extend_from_slice(payload),
    }
    f
}

const MASK: Option<[u8; 4]> = Some([0x12, 0x34, 0x56, 0x78]);

/// A server frame: (fin, opcode, payload); the server must never mask.
fn read_frame(s: &mut Tls) -> std::io::Result<(bool, u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h)?;
    assert_eq!(h[1] & 0x80, 0, "a server frame is never masked");
    assert_eq!(h[0] & 0x70, 0, "no reserved bit");
    let len = match h[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l)?;
            u16::from_be_bytes(l) as usize
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l)?;
            u64::from_be_bytes(l) as usize
        }
        n => n as usize,
    };
    let mut p = vec![0u8; len];
    s.read_exact(&mut p)?;
    Ok((h[0] & 0x80 != 0, h[0] & 0x0f, p))
}

/// A block from the relay: exactly one final binary frame of 16384 bytes.
fn read_block_frame(s: &mut Tls) -> Vec<u8> {
    let (fin, op, p) = read_frame(s).expect("a block frame");
    assert!(fin, "a block is never fragmented");
    assert_eq!(op, 2, "a block is a binary frame");
    assert_eq!(p.len(), BLOCK, "one frame is one block");
    p
}

/// TLS, the upgrade, and the server hello; returns the stream and the hello.
fn open(ws: SocketAddr) -> (Tls, wire::Hello) {
    open_at(ws, "/smp?x=1")
}

/// `open` with this request target.
fn open_at(ws: SocketAddr, target: &str) -> (Tls, wire::Hello) {
    upgrade_on(tls(ws), target)
}

/// The upgrade to `target` and the server hello, on a TLS connection made by the caller.
fn upgrade_on(mut s: Tls, target: &str) -> (Tls, wire::Hello) {
    s.write_all(request_to(target, &[], Some(KEY), "13").as_bytes())
        .unwrap();
    let head = read_head(&mut s);
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols\r\n"),
        "{head}"
    );
    // RFC 6455 §1.3's example key and answer, computed by hand there.
    assert!(
        head.contains("\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
        "{head}"
    );
    assert!(!head
        .to_ascii_lowercase()
        .contains("sec-websocket-extensions"));
    assert!(!head.to_ascii_lowercase().contains("sec-websocket-protocol"));
    let block = read_block_frame(&mut s);
    let hello = wire::parse_hello(wire::unpad(&block));
    (s, hello)
}

/// `open`, then the client hello (no key: plain blocks) in one frame.
fn session(relay: &Relay, ws: SocketAddr) -> (Tls, wire::Hello) {
    let (mut s, hello) = open(ws);
    let ch = wire::standard_hello(hello.max, &relay.key_hash, None);
    s.write_all(&frame(true, 2, MASK, &wire::pad(&ch, BLOCK)))
        .unwrap();
    (s, hello)
}

fn ping_block(hello: &wire::Hello, corr: &[u8]) -> Vec<u8> {
    let t = wire::transmission(hello.max, &hello.session_id, corr, b"", b"PING");
    wire::pad(&wire::batch1(&t), BLOCK)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The relay closes the connection: what it sends until then is at most a close frame (whose
/// status is returned), and the end comes before the read timeout. A reset counts as closed (the
/// relay closes without reading what the client still sent).
fn expect_closed(s: &mut Tls) -> Option<u16> {
    let mut code = None;
    loop {
        match read_frame(s) {
            Ok((_, 8, p)) => {
                code = (p.len() >= 2).then(|| u16::from_be_bytes([p[0], p[1]]));
            }
            Ok((_, op, p)) => panic!("opcode {op} ({} bytes) instead of the close", p.len()),
            Err(e) => {
                assert!(
                    !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
                    "the relay did not close the connection: {e}"
                );
                return code;
            }
        }
    }
}

fn still_served(keeper: &mut Client, native: &mut Client, what: &str) {
    let p = keeper
        .ping()
        .unwrap_or_else(|e| panic!("wss after {what}: {e}"));
    assert_eq!(p.msg, Ok(BrokerMsg::Pong), "wss after {what}");
    let p = native
        .ping()
        .unwrap_or_else(|e| panic!("native after {what}: {e}"));
    assert_eq!(p.msg, Ok(BrokerMsg::Pong), "native after {what}");
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A queue's whole life with its recipient on wss and its sender on the SMP port, at once:
/// NEW, SEND, MSG, ACK, KEY, SUB from a second wss connection, DEL.
#[test]
fn queue_commands_over_websocket_next_to_a_native_client() {
    let (relay, ws) = relay_with_ws(&[]);
    let mut alice = ws_client(&relay, ws);
    assert_eq!(alice.alpn(), Some(&b"http/1.1"[..]));
    assert_eq!(alice.server_versions(), SERVER_VERSIONS, "the full range");
    assert!(alice.is_encrypted(), "block encryption as over raw TLS");
    let mut bob = relay.client();
    // Each gets the suite it prefers: a web client AES-GCM, the apps ChaCha20-Poly1305, the only
    // suite they offer (unless the suite runs with SMP_RELAY_TEST_TLS=web, which makes the native
    // client offer the web clients' suites). The rest of this test runs the queue commands over
    // both.
    assert_eq!(
        alice.cipher_suite(),
        Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
    );
    assert_eq!(
        bob.cipher_suite(),
        Some(common::negotiated_suite(common::test_client_suites()))
    );

    let q = create(&mut alice);
    send_ok(&mut bob, &q, None, b"hello over the SMP port");
    let m1 = expect_body(&mut alice, &q, b"hello over the SMP port");
    assert_eq!(ack(&mut alice, &q, &m1.msg_id), BrokerMsg::Ok);

    let bob_key = auth_key(KeyAlg::Ed25519);
    let key = Command::Key(bob_key.public_key());
    assert_eq!(signed(&mut alice, q.key(), q.rid(), key), BrokerMsg::Ok);
    assert_eq!(send(&mut bob, &q, None, b"unsigned"), ERR_AUTH);
    let body = format!("signed {}", b64(&[7; 40]));
    send_ok(&mut bob, &q, Some(&bob_key), body.as_bytes());
    let m2 = expect_body(&mut alice, &q, body.as_bytes());

    // Unacknowledged, the message goes to the next subscriber, on another wss connection.
    let mut alice2 = ws_client(&relay, ws);
    let again = sub_with_msg(&mut alice2, &q);
    assert_eq!(again.msg_id, m2.msg_id);
    assert_eq!(ack(&mut alice2, &q, &again.msg_id), BrokerMsg::Ok);
    expect_event(&mut alice, q.rid(), BrokerMsg::End);

    // A large message crosses as well (the 16 KB block, one frame each way).
    let large = vec![b'x'; 15_000];
    send_ok(&mut bob, &q, Some(&bob_key), &large);
    let m3 = expect_body(&mut alice2, &q, &large);
    assert_eq!(ack(&mut alice2, &q, &m3.msg_id), BrokerMsg::Ok);

    assert_eq!(
        signed(&mut alice2, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    assert_eq!(send(&mut bob, &q, Some(&bob_key), b"gone"), ERR_AUTH);
    expect_nothing(&mut alice2, "after DEL");
}

/// A web client's `challenge=` (simplexmq `Transport/WebSockets.hs`, `parseChallenge`; the server
/// hello's `webIdentityProof` of `Transport.hs`): the hello ends with `shortString` of the online
/// certificate's signature of challenge ‖ session ID, and the session goes on as any other. A
/// challenge that is not unpadded base64url of 32 bytes is no challenge: no proof, same session.
#[test]
fn the_identity_challenge_is_signed_by_the_online_key() {
    let (relay, ws) = relay_with_ws(&[]);
    let challenge: [u8; 32] = rand::random();
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let target = format!("/smp?a=b&challenge={}&c=d", url.encode(challenge));
    let (mut s, hello) = open_at(ws, &target);
    assert_eq!(hello.max, SERVER_VERSIONS.max);
    assert_eq!(hello.tail.len(), 65, "shortString of an Ed25519 signature");
    assert_eq!(hello.tail[0], 64);
    let (proof, leaf) = (&hello.tail[1..], &hello.chain[0]);
    let signed = [&challenge[..], &hello.session_id].concat();
    assert!(
        wire::leaf_signed(proof, &signed, leaf),
        "the proof verifies"
    );
    let mut other = signed.clone();
    other[0] ^= 1;
    assert!(!wire::leaf_signed(proof, &other, leaf), "and only for it");
    // A second connection with the same challenge gets another proof (another session ID).
    let (_, hello2) = open_at(ws, &target);
    assert_ne!(hello2.session_id, hello.session_id);
    let signed2 = [&challenge[..], &hello2.session_id].concat();
    assert!(wire::leaf_signed(&hello2.tail[1..], &signed2, leaf));

    let ch = wire::standard_hello(hello.max, &relay.key_hash, None);
    s.write_all(&frame(true, 2, MASK, &wire::pad(&ch, BLOCK)))
        .unwrap();
    s.write_all(&frame(true, 2, MASK, &ping_block(&hello, b"after-proof")))
        .unwrap();
    let answer = read_block_frame(&mut s);
    assert!(contains(wire::unpad(&answer), b"PONG"));

    let padded = base64::engine::general_purpose::URL_SAFE.encode(challenge);
    let short = url.encode(&challenge[..31]);
    for bad in [
        format!("/?challenge={padded}"),
        format!("/?challenge={short}"),
        "/?challenge=".to_string(),
        "/smp".to_string(),
    ] {
        let (_, hello) = open_at(ws, &bad);
        assert_eq!(hello.trailing, 0, "no proof for {bad}");
    }
}

/// A port shared by native and web clients, as the reference's `[WEB] https` on an SMP port
/// (simplexmq `Server.hs`, `attachStaticAndWS`; `Transport/Server.hs`, SNI): a ClientHello naming
/// no host gets the SMP certificate and raw SMP; one naming a host gets the web certificate,
/// ALPN `http/1.1` whatever it offers first, and WebSocket, whose server hello carries the SMP
/// chain and the identity proof signed by the SMP online key.
#[test]
fn a_shared_port_splits_web_and_native_clients_by_sni() {
    let (relay, shared, cert, _files) = relay_with_shared_port();

    let mut native = wire::openssl_connect(shared, Some(&[b"smp/1"]), false).expect("native TLS");
    let smp_leaf = native.ssl().peer_certificate().unwrap().to_der().unwrap();
    assert_ne!(smp_leaf, cert.der);
    let mut block = vec![0u8; BLOCK];
    native.read_exact(&mut block).expect("raw SMP hello");
    let native_hello = wire::parse_hello(wire::unpad(&block));
    assert_eq!(native_hello.chain[0], smp_leaf);
    assert_eq!(native_hello.max, SERVER_VERSIONS.max);

    let s = wire::openssl_connect_sni(shared, &[b"h2", b"http/1.1"], web::HOST).expect("web TLS");
    assert_eq!(s.ssl().selected_alpn_protocol(), Some(&b"http/1.1"[..]));
    let web_leaf = s.ssl().peer_certificate().unwrap().to_der().unwrap();
    assert_eq!(web_leaf, cert.der, "the web certificate");
    let challenge: [u8; 32] = rand::random();
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (mut s, hello) = upgrade_on(s, &format!("/?challenge={}", url.encode(challenge)));
    assert_eq!(hello.session_id, wire::own_finished(&s), "tls-unique");
    assert_eq!(
        hello.chain, native_hello.chain,
        "the SMP chain in the hello"
    );
    assert_eq!(
        (hello.min, hello.max),
        (SERVER_VERSIONS.min, SERVER_VERSIONS.max)
    );
    assert_eq!(hello.tail.first(), Some(&64));
    let signed = [&challenge[..], &hello.session_id].concat();
    assert!(wire::leaf_signed(&hello.tail[1..], &signed, &smp_leaf));
    let ch = wire::standard_hello(hello.max, &relay.key_hash, None);
    s.write_all(&frame(true, 2, MASK, &wire::pad(&ch, BLOCK)))
        .unwrap();
    s.write_all(&frame(true, 2, MASK, &ping_block(&hello, b"web-ping")))
        .unwrap();
    assert!(contains(wire::unpad(&read_block_frame(&mut s)), b"PONG"));

    // A web client offering only h2 has no protocol in common.
    assert!(wire::openssl_connect_sni(shared, &[b"h2"], web::HOST).is_err());
    // The relay's other SMP port is not shared: a host name there changes nothing.
    let plain = wire::openssl_connect_sni(relay.addr, &[b"smp/1"], web::HOST).expect("TLS");
    assert_eq!(
        plain.ssl().peer_certificate().unwrap().to_der().unwrap(),
        smp_leaf
    );
}

/// The library's web client (SNI, WebSocket, the proof checked) and a native client on the same
/// shared port at once: a queue's life across both (NEW, SEND, ACK, KEY, SUB, DEL).
#[test]
fn web_and_native_clients_share_a_port() {
    let (relay, shared, _cert, _files) = relay_with_shared_port();
    let mut alice = web_client(&relay, shared);
    assert_eq!(alice.alpn(), Some(&b"http/1.1"[..]));
    assert_eq!(alice.server_versions(), SERVER_VERSIONS);
    let mut bob = Client::connect(
        shared,
        relay.key_hash,
        common::with_test_suites(ClientOptions::default()),
    )
    .expect("native client on the shared port");
    assert_eq!(bob.alpn(), Some(&b"smp/1"[..]));

    let q = create(&mut alice);
    send_ok(&mut bob, &q, None, b"from the native side");
    let m = expect_body(&mut alice, &q, b"from the native side");
    assert_eq!(ack(&mut alice, &q, &m.msg_id), BrokerMsg::Ok);
    let bob_key = auth_key(KeyAlg::Ed25519);
    let key = Command::Key(bob_key.public_key());
    assert_eq!(signed(&mut alice, q.key(), q.rid(), key), BrokerMsg::Ok);
    assert_eq!(send(&mut bob, &q, None, b"unsigned"), ERR_AUTH);
    let large = vec![b'w'; 15_000];
    send_ok(&mut bob, &q, Some(&bob_key), &large);
    let m = expect_body(&mut alice, &q, &large);
    // Unacknowledged, it goes to the next subscriber, another web client on the port.
    let mut alice2 = web_client(&relay, shared);
    assert_eq!(sub_with_msg(&mut alice2, &q).msg_id, m.msg_id);
    expect_event(&mut alice, q.rid(), BrokerMsg::End);
    assert_eq!(ack(&mut alice2, &q, &m.msg_id), BrokerMsg::Ok);
    assert_eq!(
        signed(&mut alice2, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    assert_eq!(send(&mut bob, &q, Some(&bob_key), b"gone"), ERR_AUTH);
}

/// `[WEB]` settings that cannot serve web clients: a missing certificate file for a shared SMP port
/// stops the start naming it; `https` on a port that is not an SMP port without a site and
/// certificate (it would serve the web site alone: `tests/transport/web_site.rs`), and a WebSocket
/// port that is an SMP port, are warned about, and the SMP ports serve as before (the reference's
/// rules).
#[test]
fn web_settings_that_cannot_serve() {
    let mut relay = Relay::start();
    relay.stop();
    let port = relay.port.to_string();
    let missing = relay.dir.path().join("no-such-web.crt");
    let missing = missing.display().to_string();
    let key = relay.dir.path().join("server.key").display().to_string();
    let out = relay.failed_start(&[
        "--web-https",
        &port,
        "--web-cert",
        &missing,
        "--web-key",
        &key,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-web.crt"), "{err}");

    let other = free_port().to_string();
    relay.restart_with(&["--web-https", &other, "--websockets", &port]);
    relay.client().ping().expect("SMP as before");
    for warning in ["set without `static_path`", "needs `cert` and `key`"] {
        assert!(relay.log_shows(warning), "{warning}: {}", relay.log_text());
    }
    assert!(
        relay.log_shows("serves no WebSocket of its own"),
        "{}",
        relay.log_text()
    );
}

/// Without ALPN a WebSocket session still gets every version (the raw-TLS rule gives v6 only).
/// A client offering `h2` and `http/1.1` gets `http/1.1`; one offering only `h2` no session.
#[test]
fn versions_and_alpn_on_the_websocket_port() {
    let (relay, ws) = relay_with_ws(&[]);
    let c = Client::connect(
        ws,
        relay.key_hash,
        ClientOptions {
            alpn: None,
            ..ClientOptions::websocket()
        },
    )
    .expect("wss without ALPN");
    assert_eq!(c.alpn(), None);
    assert_eq!(c.server_versions(), SERVER_VERSIONS);

    let both: &[&[u8]] = &[b"h2", b"http/1.1"];
    let s = wire::openssl_connect(ws, Some(both), false).expect("TLS");
    assert_eq!(s.ssl().selected_alpn_protocol(), Some(&b"http/1.1"[..]));
    let h2 = wire::openssl_connect(ws, Some(&[b"h2"]), false);
    assert!(h2.is_err(), "h2 is never chosen on the WebSocket port");
    // The SMP port is unchanged: no ALPN, v6 only.
    let legacy = relay
        .connect(ClientOptions {
            alpn: None,
            ..ClientOptions::default()
        })
        .expect("legacy native client");
    assert_eq!(legacy.server_versions().max, 6);
}

/// The session ID is the tls-unique of the WebSocket's TLS; a client hello in three fragments with
/// a ping between them is accepted (the pong comes at once); in the session, a block in two
/// fragments is answered, a ping too, and a close with a close.
#[test]
fn fragments_pings_and_close() {
    let (relay, ws) = relay_with_ws(&[]);
    let (mut s, hello) = open(ws);
    assert_eq!(hello.session_id, wire::own_finished(&s), "tls-unique");
    assert_eq!(
        (hello.min, hello.max),
        (SERVER_VERSIONS.min, SERVER_VERSIONS.max)
    );

    let ch = wire::pad(
        &wire::standard_hello(hello.max, &relay.key_hash, None),
        BLOCK,
    );
    s.write_all(&frame(false, 2, MASK, &ch[..5000])).unwrap();
    s.write_all(&frame(true, 9, MASK, b"are you there"))
        .unwrap();
    s.write_all(&frame(false, 0, MASK, &ch[5000..12000]))
        .unwrap();
    assert_eq!(
        read_frame(&mut s).unwrap(),
        (true, 10, b"are you there".to_vec()),
        "pong with the ping's payload"
    );
    s.write_all(&frame(true, 0, MASK, &ch[12000..])).unwrap();

    let ping = ping_block(&hello, b"corr-1");
    s.write_all(&frame(false, 2, MASK, &ping[..1])).unwrap();
    s.write_all(&frame(true, 0, MASK, &ping[1..])).unwrap();
    let answer = read_block_frame(&mut s);
    let content = wire::unpad(&answer);
    assert!(contains(content, b"corr-1") && contains(content, b"PONG"));

    s.write_all(&frame(true, 9, MASK, b"")).unwrap();
    assert_eq!(read_frame(&mut s).unwrap(), (true, 10, vec![]), "pong");
    s.write_all(&frame(true, 10, MASK, b"unsolicited pong"))
        .unwrap();
    let ping = ping_block(&hello, b"corr-2");
    s.write_all(&frame(true, 2, MASK, &ping)).unwrap();
    assert!(contains(wire::unpad(&read_block_frame(&mut s)), b"corr-2"));

    s.write_all(&frame(true, 8, MASK, &1000u16.to_be_bytes()))
        .unwrap();
    assert_eq!(expect_closed(&mut s), Some(1000), "the close is answered");
}

/// Each bad frame closes its own connection only, in the handshake or the session.
#[test]
fn bad_frames_close_only_their_connection() {
    let (relay, ws) = relay_with_ws(&[]);
    let mut keeper = ws_client(&relay, ws);
    let mut native = relay.client();

    // A message of another length than one block, read whole, is refused with 1003.
    let (mut s, _) = session(&relay, ws);
    s.write_all(&frame(true, 2, MASK, &[0u8; 100])).unwrap();
    assert_eq!(expect_closed(&mut s), Some(1003), "short message");
    still_served(&mut keeper, &mut native, "a short message");

    let (mut s, _) = open(ws);
    s.write_all(&frame(true, 2, MASK, &vec![0u8; BLOCK + 1]))
        .unwrap();
    let code = expect_closed(&mut s);
    assert!(matches!(code, None | Some(1009)), "{code:?}");
    still_served(&mut keeper, &mut native, "a long frame");

    // A block as text.
    let (mut s, hello) = session(&relay, ws);
    let _ = s.write_all(&frame(true, 1, MASK, &ping_block(&hello, b"t")));
    let code = expect_closed(&mut s);
    assert!(matches!(code, None | Some(1003)), "{code:?}");
    still_served(&mut keeper, &mut native, "a text message");

    // Unmasked.
    let (mut s, hello) = session(&relay, ws);
    let _ = s.write_all(&frame(true, 2, None, &ping_block(&hello, b"u")));
    let code = expect_closed(&mut s);
    assert!(matches!(code, None | Some(1002)), "{code:?}");
    still_served(&mut keeper, &mut native, "an unmasked frame");

    // Fragments past 65536 bytes: four block-sized fragments are taken, the fifth is too many.
    let (mut s, _) = session(&relay, ws);
    for i in 0..5 {
        let op = if i == 0 { 2 } else { 0 };
        if s.write_all(&frame(false, op, MASK, &[1u8; BLOCK])).is_err() {
            break;
        }
    }
    let code = expect_closed(&mut s);
    assert!(matches!(code, None | Some(1009)), "{code:?}");
    still_served(&mut keeper, &mut native, "an oversized message");

    // A message of 20000 bytes in two fragments (under the 65536 limit): read, then refused.
    let (mut s, _) = session(&relay, ws);
    s.write_all(&frame(false, 2, MASK, &[2u8; 10_000])).unwrap();
    s.write_all(&frame(true, 0, MASK, &[2u8; 10_000])).unwrap();
    assert_eq!(
        expect_closed(&mut s),
        Some(1003),
        "a message of two blocks' worth"
    );

    // A continuation with no message begun.
    let (mut s, _) = session(&relay, ws);
    s.write_all(&frame(true, 0, MASK, &[3u8; 10])).unwrap();
    assert_eq!(expect_closed(&mut s), Some(1002), "orphan continuation");
    still_served(&mut keeper, &mut native, "every bad frame");
}

/// A refused upgrade gets its HTTP answer and the connection is closed; others go on.
#[test]
fn malformed_upgrades_are_refused() {
    let (relay, ws) = relay_with_ws(&[]);
    let mut keeper = ws_client(&relay, ws);
    let mut native = relay.client();
    let refused = |req: &[u8], status: &str| {
        let mut s = tls(ws);
        s.write_all(req).unwrap();
        let head = read_head(&mut s);
        assert!(head.starts_with(&format!("HTTP/1.1 {status}")), "{head}");
        let mut rest = Vec::new();
        let end = s.read_to_end(&mut rest);
        assert!(
            !matches!(&end, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
            "closed after the answer: {end:?}"
        );
        assert!(rest.is_empty(), "nothing after the answer");
        head
    };
    refused(request(&[], None, "13").as_bytes(), "400");
    refused(request(&[], Some("c2hvcnQ="), "13").as_bytes(), "400");
    let head = refused(request(&[], Some(KEY), "8").as_bytes(), "426");
    assert!(head.contains("\r\nSec-WebSocket-Version: 13\r\n"), "{head}");
    refused(b"GET / HTTP/1.1\r\nHost: relay.test\r\n\r\n", "400");
    refused(
        request(&[], Some(KEY), "13")
            .replace("GET", "POST")
            .as_bytes(),
        "400",
    );
    // Headers that never end: refused once the limit (8 KiB) is read.
    let mut endless = request(&[], Some(KEY), "13");
    endless.truncate(endless.len() - 2);
    let filler = format!("X-Filler: {}\r\n", "f".repeat(100));
    while endless.len() + filler.len() < 8192 {
        endless += &filler;
    }
    endless += &"g".repeat(8192 - endless.len());
    refused(endless.as_bytes(), "431");
    still_served(&mut keeper, &mut native, "malformed upgrades");
}

/// An upgrade still unfinished when the TLS deadline passes is closed without an answer.
#[test]
fn an_unfinished_upgrade_is_closed_at_the_tls_deadline() {
    let (relay, ws) = relay_with_ws(&["--tls-timeout-secs", "2"]);
    let mut s = tls(ws);
    s.write_all(b"GET / HTTP/1.1\r\nHost: relay.test\r\n")
        .unwrap();
    let mut got = Vec::new();
    let end = s.read_to_end(&mut got);
    assert!(
        !matches!(&end, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "closed by the relay, not by our read timeout: {end:?}"
    );
    assert!(
        got.is_empty(),
        "no answer: {:?}",
        String::from_utf8_lossy(&got)
    );
    ws_client(&relay, ws).ping().expect("a new wss connection");
}

/// 1,000 upgrades left half-open — TLS done and part of a request, or TLS done and nothing —
/// cost the other clients nothing: a wss and a native client are served while they hang, each is
/// closed by the relay at its TLS deadline, and new connections are taken afterwards.
#[test]
fn a_thousand_half_open_upgrades_leave_other_clients_served() {
    const HALF_OPEN: usize = 1000;
    let (relay, ws) = relay_with_ws(&[
        "--tls-timeout-secs",
        "5",
        "--max-handshakes-per-address",
        "2000",
    ]);
    let mut keeper = ws_client(&relay, ws);
    let mut native = relay.client();
    let mut hanging = Vec::with_capacity(HALF_OPEN);
    for i in 0..HALF_OPEN {
        let mut s = tls(ws);
        if i % 2 == 0 {
            s.write_all(b"GET /smp HTTP/1.1\r\nHost: relay.test\r\nUpgrade: web")
                .unwrap();
        }
        hanging.push(s);
        if i % 250 == 249 {
            still_served(&mut keeper, &mut native, "half-open upgrades");
        }
    }
    still_served(&mut keeper, &mut native, "1,000 half-open upgrades");
    for (i, mut s) in hanging.into_iter().enumerate() {
        let mut got = Vec::new();
        let end = s.read_to_end(&mut got);
        assert!(
            !matches!(&end, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
            "half-open upgrade {i} was not closed by the relay: {end:?}"
        );
        assert!(got.is_empty(), "no answer to half-open upgrade {i}");
    }
    still_served(&mut keeper, &mut native, "the half-open upgrades closed");
    ws_client(&relay, ws).ping().expect("a new wss connection");
}
