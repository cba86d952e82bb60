//! The reference's `serverSyntaxTests` (simplexmq `tests/ServerTests.hs`) and the credential rules
//! of `Protocol.hs` `checkCredentials`, at v18 and, where encodings differ, at lower versions.
//! No queue exists, so every well-formed queue command gets `ERR AUTH`.
//!
//! Commands are written here as raw bytes so that the test does not depend on the crate's command
//! encoder; each row asserts the exact response bytes, corrId and entityId.

use crate::common;

use common::{Relay, RelayOptions};
use smp_relay::client::{Authorization, Client, ClientOptions, ClientTransmission, Signer};

const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
const X25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00,
];

fn short(b: &[u8]) -> Vec<u8> {
    let mut v = vec![b.len() as u8];
    v.extend_from_slice(b);
    v
}

fn signer() -> Signer {
    Signer::Ed25519(ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]))
}

fn ed25519_spki() -> Vec<u8> {
    match signer().public_key() {
        smp_relay::crypto::keys::PublicAuthKey::Ed25519(k) => {
            [&ED25519_SPKI_PREFIX[..], &k].concat()
        }
        _ => unreachable!("an Ed25519 signer"),
    }
}

fn x25519_spki() -> Vec<u8> {
    [&X25519_SPKI_PREFIX[..], &[9u8; 32]].concat()
}

/// `NEW` with valid parameters in the encoding of version `v` (simplexmq `Protocol.hs`).
fn new_cmd(v: u16) -> Vec<u8> {
    let mut c = b"NEW ".to_vec();
    c.extend(short(&ed25519_spki()));
    c.extend(short(&x25519_spki()));
    match v {
        6..=8 => c.push(b'S'),
        9..=14 => c.extend_from_slice(b"0ST"),
        15..=16 => c.extend_from_slice(b"0S0"),
        _ => c.extend_from_slice(b"0S00"),
    }
    c
}

fn key_cmd() -> Vec<u8> {
    [&b"KEY "[..], &short(&ed25519_spki())].concat()
}

/// One row of the table: a transmission and the exact response expected.
struct Row {
    auth: Auth,
    entity: &'static [u8],
    cmd: Vec<u8>,
    expect: &'static [u8],
    /// The response's entity: the request's by default (errors keep it).
    expect_entity: Option<&'static [u8]>,
}

#[derive(Clone, Copy)]
enum Auth {
    None,
    /// A real Ed25519 signature (unknown queue: the server's dummy verification runs).
    Sig,
}

fn row(auth: Auth, entity: &'static [u8], cmd: impl Into<Vec<u8>>, expect: &'static [u8]) -> Row {
    Row {
        auth,
        entity,
        cmd: cmd.into(),
        expect,
        expect_entity: None,
    }
}

use Auth::{None as U, Sig as S};

/// Sends all rows in one batch and checks each response by corrId.
fn check_rows(c: &mut Client, rows: &[Row]) {
    let ts: Vec<ClientTransmission> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let t = ClientTransmission::raw(format!("row{i:03}").as_bytes(), r.entity, &r.cmd);
            match r.auth {
                Auth::None => t,
                Auth::Sig => t.with_auth(Authorization::Sign(signer())),
            }
        })
        .collect();
    c.send_batch(&ts).expect("send rows");
    let mut failures = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let corr = format!("row{i:03}");
        let got = c.recv_for(corr.as_bytes()).expect("response");
        let entity = r.expect_entity.unwrap_or(r.entity);
        if got.command != r.expect || got.entity_id != entity {
            failures.push(format!(
                "v{} {corr} {:?} entity {:?}: expected {:?} entity {:?}, got {:?} entity {:?}",
                c.version(),
                String::from_utf8_lossy(&r.cmd[..r.cmd.len().min(12)]),
                String::from_utf8_lossy(r.entity),
                String::from_utf8_lossy(r.expect),
                String::from_utf8_lossy(entity),
                String::from_utf8_lossy(&got.command),
                String::from_utf8_lossy(&got.entity_id),
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn connect(relay: &Relay, v: u16) -> Client {
    relay
        .connect(ClientOptions {
            version: Some(v),
            ..ClientOptions::default()
        })
        .expect("connect")
}

/// The rows whose encoding is the same at every version.
fn common_rows() -> Vec<Row> {
    let q: &'static [u8] = b"12345678";
    let mut rows = vec![
        row(U, b"1234", "HELLO", b"ERR CMD UNKNOWN"),
        // NEW
        row(S, b"", "NEW", b"ERR CMD SYNTAX"),
        row(S, b"", "NEW ", b"ERR CMD SYNTAX"),
        // KEY
        row(S, q, key_cmd(), b"ERR AUTH"),
        row(S, q, "KEY", b"ERR CMD SYNTAX"),
        row(
            S,
            q,
            [key_cmd(), b" x".to_vec()].concat(),
            b"ERR CMD SYNTAX",
        ),
        row(U, q, key_cmd(), b"ERR CMD NO_AUTH"),
        row(S, b"", key_cmd(), b"ERR CMD NO_AUTH"),
        // SEND
        row(S, q, "SEND F hello", b"ERR AUTH"),
        row(U, q, "SEND F hello", b"ERR AUTH"),
        row(S, q, "SEND", b"ERR CMD SYNTAX"),
        row(S, b"", "SEND F hello", b"ERR CMD NO_ENTITY"),
        row(U, b"", "SEND F hello", b"ERR CMD NO_ENTITY"),
        // ACK
        row(S, q, [&b"ACK "[..], &short(b"1234")].concat(), b"ERR AUTH"),
        row(S, q, "ACK", b"ERR CMD SYNTAX"),
        row(
            U,
            q,
            [&b"ACK "[..], &short(b"1234")].concat(),
            b"ERR CMD NO_AUTH",
        ),
        row(
            S,
            b"",
            [&b"ACK "[..], &short(b"1234")].concat(),
            b"ERR CMD NO_AUTH",
        ),
        // PING
        row(U, b"", "PING", b"PONG"),
        row(S, b"", "PING", b"ERR CMD HAS_AUTH"),
        row(U, q, "PING", b"ERR CMD HAS_AUTH"),
        row(U, b"", "PING ", b"ERR CMD SYNTAX"),
        // broker messages are not commands
        row(U, b"", "OK", b"ERR CMD UNKNOWN"),
        row(U, b"", "PONG", b"ERR CMD UNKNOWN"),
        row(S, q, "IDS", b"ERR CMD UNKNOWN"),
        row(U, b"", "", b"ERR CMD UNKNOWN"),
        // LGET: unsigned, with an entity
        row(U, q, "LGET", b"ERR AUTH"),
        row(S, q, "LGET", b"ERR CMD HAS_AUTH"),
        row(U, b"", "LGET", b"ERR CMD NO_ENTITY"),
        // recipient commands with parameters
        row(
            S,
            q,
            [&b"SKEY "[..], &short(&ed25519_spki())].concat(),
            b"ERR AUTH",
        ),
        row(
            S,
            q,
            [&b"LKEY "[..], &short(&ed25519_spki())].concat(),
            b"ERR AUTH",
        ),
        row(
            S,
            q,
            [
                &b"NKEY "[..],
                &short(&ed25519_spki()),
                &short(&x25519_spki()),
            ]
            .concat(),
            b"ERR AUTH",
        ),
        row(
            S,
            q,
            [&b"RKEY \x01"[..], &short(&ed25519_spki())].concat(),
            b"ERR AUTH",
        ),
        row(S, q, b"RKEY \x00".to_vec(), b"ERR CMD SYNTAX"),
        row(
            S,
            q,
            [&b"LSET "[..], &short(b"link"), b"\x00\x02ab", b"\x00\x00"].concat(),
            b"ERR AUTH",
        ),
    ];
    // Commands without parameters: valid → AUTH, wrong terminator → UNKNOWN, trailing space →
    // SYNTAX, unsigned or without entity → NO_AUTH.
    for cmd in ["SUB", "OFF", "DEL", "GET", "QUE", "NDEL", "LDEL", "NSUB"] {
        rows.push(row(S, q, cmd, b"ERR AUTH"));
        rows.push(row(S, q, format!("{cmd}="), b"ERR CMD UNKNOWN"));
        rows.push(row(S, q, format!("{cmd} "), b"ERR CMD SYNTAX"));
        rows.push(row(U, q, cmd, b"ERR CMD NO_AUTH"));
        rows.push(row(S, b"", cmd, b"ERR CMD NO_AUTH"));
    }
    rows
}

#[test]
fn syntax_table_at_v18() {
    let relay = Relay::start();
    let mut c = connect(&relay, 18);
    let q: &'static [u8] = b"12345678";
    let mut rows = common_rows();
    rows.extend([
        // NEW at v18: valid but unsigned, with an entity, with extra or malformed parameters.
        row(U, b"", new_cmd(18), b"ERR CMD NO_AUTH"),
        row(S, q, new_cmd(18), b"ERR CMD HAS_AUTH"),
        row(
            S,
            b"",
            [new_cmd(18), b" x".to_vec()].concat(),
            b"ERR CMD SYNTAX",
        ),
        row(
            S,
            b"",
            [&b"NEW \x01A"[..], &new_cmd(18)[4..]].concat(),
            b"ERR CMD SYNTAX",
        ),
        // the other versions' NEW encodings do not parse at v18
        row(U, b"", new_cmd(6), b"ERR CMD SYNTAX"),
        row(U, b"", new_cmd(9), b"ERR CMD SYNTAX"),
        row(U, b"", new_cmd(15), b"ERR CMD SYNTAX"),
        // services: this is not a service session
        row(S, q, "SUBS", b"ERR SERVICE"),
        row(S, q, "NSUBS", b"ERR SERVICE"),
    ]);
    check_rows(&mut c, &rows);
}

/// The roles turned off (the proxy with `--no-proxy`) or not built (names): answered as the reference
/// does when they are disabled.
#[test]
fn disabled_roles_at_v18() {
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec!["--no-proxy".into()],
        ..RelayOptions::default()
    });
    let mut c = connect(&relay, 18);
    let sess: &'static [u8] = b"proxy-session-id";
    let mut prxy = b"PRXY ".to_vec();
    prxy.extend_from_slice(b"\x01"); // one host
    prxy.extend(short(b"smp.example.com"));
    prxy.extend(short(b"5223"));
    prxy.extend(short(&[1u8; 32]));
    prxy.push(b'0'); // no basic auth
    let mut pfwd = b"PFWD ".to_vec();
    pfwd.extend_from_slice(&18u16.to_be_bytes());
    pfwd.extend(short(&x25519_spki()));
    pfwd.extend_from_slice(&[0x55; 64]);
    let rows = vec![
        row(U, b"", prxy.clone(), b"ERR PROXY BASIC_AUTH"),
        row(S, b"", prxy, b"ERR CMD HAS_AUTH"),
        row(U, sess, pfwd.clone(), b"ERR PROXY NO_SESSION"),
        row(U, b"", pfwd, b"ERR CMD NO_ENTITY"),
        row(U, b"", "RSLV privacy.simplex", b"ERR NAME NO_RESOLVER"),
        row(S, b"", "RSLV privacy.simplex", b"ERR CMD HAS_AUTH"),
    ];
    check_rows(&mut c, &rows);
}

/// RFWD on a session that has a hello key: the outer box does not open (`processForwardedCommand`).
#[test]
fn rfwd_with_garbage_is_a_crypto_error() {
    let relay = Relay::start();
    let mut c = connect(&relay, 18);
    let rows = vec![
        row(
            U,
            b"",
            [&b"RFWD "[..], &[0x42u8; 100][..]].concat(),
            b"ERR CRYPTO",
        ),
        row(
            S,
            b"",
            [&b"RFWD "[..], &[0x42u8; 100][..]].concat(),
            b"ERR CMD HAS_AUTH",
        ),
    ];
    check_rows(&mut c, &rows);
}

#[test]
fn new_encodings_per_version() {
    let relay = Relay::start();
    let forms = [6u16, 9, 15, 17];
    for v in [6u16, 7, 8, 9, 10, 11, 14, 15, 16, 17, 18] {
        let mut c = connect(&relay, v);
        let own = match v {
            6..=8 => 6,
            9..=14 => 9,
            15..=16 => 15,
            _ => 17,
        };
        let mut rows = vec![row(U, b"", new_cmd(v), b"ERR CMD NO_AUTH")];
        for f in forms.iter().copied().filter(|&f| f != own) {
            rows.push(row(U, b"", new_cmd(f), b"ERR CMD SYNTAX"));
        }
        if v <= 8 {
            // 'A' shortString(basicAuth) before the subscribe mode, not Maybe-encoded.
            let mut with_auth = new_cmd(v);
            with_auth.pop();
            with_auth.extend_from_slice(b"A\x03pwdS");
            rows.push(row(U, b"", with_auth, b"ERR CMD NO_AUTH"));
        } else {
            let mut with_auth = new_cmd(v);
            let at = with_auth.len() - if v >= 17 { 4 } else { 3 };
            with_auth.splice(at..at + 1, b"1\x03pwd".iter().copied());
            rows.push(row(U, b"", with_auth, b"ERR CMD NO_AUTH"));
        }
        check_rows(&mut c, &rows);
    }
}

#[test]
fn syntax_table_at_lower_versions() {
    let relay = Relay::start();
    for v in [6u16, 7, 10, 11, 15] {
        let mut c = connect(&relay, v);
        check_rows(&mut c, &common_rows());
    }
}

/// At v6 the session id travels in each transmission and must be this session's (simplexmq
/// `Protocol.hs`, `tDecodeServer`).
#[test]
fn v6_explicit_session_id() {
    let relay = Relay::start();
    let mut c = connect(&relay, 6);
    assert_eq!(c.ping().expect("PING").command, b"PONG");

    let wrong = vec![0u8; c.session_id().len()];
    let mut t = ClientTransmission::raw(b"wrongsess", b"", b"PING");
    t.session_id = Some(wrong);
    let mut t2 = ClientTransmission::raw(b"wrongsess2", b"12345678", b"HELLO");
    t2.session_id = Some(b"short".to_vec());
    let mut t3 = ClientTransmission::raw(b"wrongsess3", b"12345678", &key_cmd())
        .with_auth(Authorization::Sign(signer()));
    t3.session_id = Some(Vec::new());
    c.send_batch(&[t, t2, t3]).expect("send");
    for corr in [&b"wrongsess"[..], b"wrongsess2", b"wrongsess3"] {
        let r = c.recv_for(corr).expect("response");
        assert_eq!(
            r.command,
            b"ERR SESSION",
            "{}",
            String::from_utf8_lossy(corr)
        );
        assert!(r.entity_id.is_empty(), "ERR SESSION carries no entity");
    }
    assert_eq!(c.ping().expect("PING").command, b"PONG");
}
