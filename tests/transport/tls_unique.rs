//! The server's tls-unique (SMP session id) must equal what an independent TLS stack computes as
//! its own client Finished: OpenSSL's `SSL_get_finished`, over real sockets, for every suite, with
//! and without a client certificate (the server always requests one), after a HelloRetryRequest, and with application data
//! arriving in the same read as Finished. Also the ALPN and protocol-version rules of simplexmq
//! `Transport.hs`.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{Ssl, SslContext, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::{X509NameBuilder, X509};
use rustls::pki_types::ServerName;
use rustls::ServerConfig;
use smp_relay::transport::certs;
use smp_relay::transport::tls::{
    self, AcceptState, ClientCapture, TlsOptions, ALPN_SMP, MAX_HANDSHAKE_CAPTURE_BYTES,
};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// What the test server learned from one connection.
#[derive(Debug)]
struct Served {
    session_id: Vec<u8>,
    alpn: Option<Vec<u8>>,
    captured: Vec<u8>,
    /// Application data already decrypted when the handshake completed, i.e. that arrived in the
    /// same socket reads as the client's Finished.
    early_app_data: Vec<u8>,
    peer_cert_count: usize,
}

fn credentials() -> certs::ServerCredentials {
    let dir = std::env::temp_dir().join(format!(
        "smp-relay-tls-it-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    certs::generate("localhost")
        .unwrap()
        .write_files(&dir)
        .unwrap();
    certs::load(&dir).unwrap()
}

/// The server always sends a CertificateRequest (a client certificate is optional).
fn config() -> Arc<ServerConfig> {
    tls::server_config(&credentials(), &TlsOptions::default()).unwrap()
}

/// A blocking one-connection server driving `AcceptState` over a std socket.
fn serve_one(config: Arc<ServerConfig>) -> (SocketAddr, JoinHandle<Result<Served, String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut state = AcceptState::new(&config).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; smp_relay::limits::SOCKET_READ_BYTES];
        let mut out = Vec::new();
        loop {
            out.clear();
            state.take_output(&mut out);
            sock.write_all(&out).map_err(|e| e.to_string())?;
            if !state.is_handshaking() {
                break;
            }
            let n = sock.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("eof during handshake".into());
            }
            if let Err(e) = state.feed(&buf[..n]) {
                out.clear();
                state.take_output(&mut out);
                let _ = sock.write_all(&out);
                return Err(format!("{e:?}"));
            }
        }
        let captured = state.captured().to_vec();
        let (mut conn, session_id) = state.finish().map_err(|e| format!("{e:?}"))?;
        let mut early_app_data = Vec::new();
        let mut chunk = [0u8; 1024];
        while let Ok(n) = conn.reader().read(&mut chunk) {
            if n == 0 {
                break;
            }
            early_app_data.extend_from_slice(&chunk[..n]);
        }
        Ok(Served {
            session_id,
            alpn: conn.alpn_protocol().map(|p| p.to_vec()),
            captured,
            early_app_data,
            peer_cert_count: conn.peer_certificates().map_or(0, |c| c.len()),
        })
    });
    (addr, handle)
}

/// Wire encoding of an ALPN list for OpenSSL.
fn alpn_wire(protocols: &[&[u8]]) -> Vec<u8> {
    protocols
        .iter()
        .flat_map(|p| std::iter::once(p.len() as u8).chain(p.iter().copied()))
        .collect()
}

struct OpensslClient<'a> {
    suite: &'a str,
    alpn: Option<&'a [&'a [u8]]>,
    groups: Option<&'a str>,
    max_version: SslVersion,
    client_cert: bool,
    client_cert_ed448: bool,
    sni: Option<&'a str>,
}

impl Default for OpensslClient<'_> {
    fn default() -> Self {
        Self {
            suite: "TLS_CHACHA20_POLY1305_SHA256",
            alpn: Some(&[ALPN_SMP]),
            groups: None,
            max_version: SslVersion::TLS1_3,
            client_cert: false,
            client_cert_ed448: false,
            sni: None,
        }
    }
}

struct ClientResult {
    finished: Vec<u8>,
    alpn: Option<Vec<u8>>,
}

/// A socket that holds writes back until `send`, so that Finished and the first application
/// data leave in one segment (and reach the server in one read), as real clients often do.
#[derive(Debug)]
struct Coalescing {
    sock: TcpStream,
    pending: Vec<u8>,
}

impl Coalescing {
    fn send(&mut self) -> io::Result<()> {
        self.sock.write_all(&self.pending)?;
        self.pending.clear();
        Ok(())
    }
}

impl Read for Coalescing {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.send()?;
        self.sock.read(buf)
    }
}

impl Write for Coalescing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl OpensslClient<'_> {
    fn context(&self) -> SslContext {
        let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
        b.set_verify(SslVerifyMode::NONE);
        b.set_max_proto_version(Some(self.max_version)).unwrap();
        if self.max_version == SslVersion::TLS1_3 {
            b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
            b.set_ciphersuites(self.suite).unwrap();
        }
        if let Some(alpn) = self.alpn {
            b.set_alpn_protos(&alpn_wire(alpn)).unwrap();
        }
        if let Some(groups) = self.groups {
            b.set_groups_list(groups).unwrap();
        }
        if self.client_cert {
            // Made by OpenSSL itself, so the client side shares no code with the server.
            let key = if self.client_cert_ed448 {
                PKey::generate_ed448().unwrap()
            } else {
                PKey::generate_ed25519().unwrap()
            };
            b.set_certificate(&openssl_self_signed(&key, "service client"))
                .unwrap();
            b.set_private_key(&key).unwrap();
        }
        b.build()
    }

    /// Connects, completes the handshake, then sends `app_data` coalesced with the Finished.
    fn run(&self, addr: SocketAddr, app_data: &[u8]) -> Result<ClientResult, String> {
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut ssl = Ssl::new(&self.context()).unwrap();
        if let Some(name) = self.sni {
            ssl.set_hostname(name).unwrap();
        }
        let stream = Coalescing {
            sock,
            pending: Vec::new(),
        };
        let mut stream = ssl.connect(stream).map_err(|e| format!("{e:?}"))?;
        if !app_data.is_empty() {
            stream.ssl_write(app_data).map_err(|e| format!("{e:?}"))?;
        }
        stream.get_mut().send().map_err(|e| e.to_string())?;
        let mut finished = [0u8; 64];
        let n = stream.ssl().finished(&mut finished);
        assert!(n <= finished.len());
        Ok(ClientResult {
            finished: finished[..n].to_vec(),
            alpn: stream.ssl().selected_alpn_protocol().map(|p| p.to_vec()),
        })
    }
}

fn openssl_self_signed(key: &PKey<Private>, cn: &str) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap())
        .unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    // EdDSA signs the message itself: no separate digest.
    cert.sign(key, MessageDigest::null()).unwrap();
    cert.build()
}

/// Counts the ClientHello records among the plaintext records before encryption starts.
fn client_hello_count(captured: &[u8]) -> usize {
    let mut rest = captured;
    let mut count = 0;
    while rest.len() >= 5 {
        let len = u16::from_be_bytes([rest[3], rest[4]]) as usize;
        let Some(payload) = rest.get(5..5 + len) else {
            break;
        };
        match rest[0] {
            22 if payload.first() == Some(&1) => count += 1,
            23 => break,
            _ => {}
        }
        rest = &rest[5 + len..];
    }
    count
}

fn handshake(
    config: Arc<ServerConfig>,
    client: &OpensslClient,
    app_data: &[u8],
) -> (Served, ClientResult) {
    let (addr, server) = serve_one(config);
    let client = client.run(addr, app_data).expect("client handshake");
    let served = server.join().unwrap().expect("server handshake");
    (served, client)
}

const SUITES: [(&str, usize); 3] = [
    ("TLS_CHACHA20_POLY1305_SHA256", 32),
    ("TLS_AES_256_GCM_SHA384", 48),
    ("TLS_AES_128_GCM_SHA256", 32),
];

#[test]
fn session_id_equals_openssl_finished_for_every_suite() {
    let config = config();
    for (suite, len) in SUITES {
        let client = OpensslClient {
            suite,
            ..Default::default()
        };
        let (served, result) = handshake(config.clone(), &client, b"");
        assert_eq!(served.session_id.len(), len, "{suite}");
        assert_eq!(served.session_id, result.finished, "{suite}");
        assert_eq!(client_hello_count(&served.captured), 1, "{suite}");
    }
}

#[test]
fn session_id_with_client_certificate_request() {
    let config = config();
    for (suite, _) in SUITES {
        for client_cert in [false, true] {
            let client = OpensslClient {
                suite,
                client_cert,
                ..Default::default()
            };
            let (served, result) = handshake(config.clone(), &client, b"");
            assert_eq!(
                served.session_id, result.finished,
                "{suite} cert={client_cert}"
            );
            assert_eq!(served.peer_cert_count, usize::from(client_cert));
        }
    }
}

#[test]
fn session_id_after_hello_retry_request() {
    // OpenSSL sends a key share for the first group only; the server has no X448, so it asks again.
    let config = config();
    for (suite, _) in SUITES {
        let client = OpensslClient {
            suite,
            groups: Some("X448:X25519"),
            ..Default::default()
        };
        let (served, result) = handshake(config.clone(), &client, b"");
        assert_eq!(
            client_hello_count(&served.captured),
            2,
            "{suite}: an HRR happened"
        );
        assert_eq!(served.session_id, result.finished, "{suite}");
    }
}

#[test]
fn session_id_with_hrr_and_client_certificate() {
    let client = OpensslClient {
        groups: Some("X448:X25519"),
        client_cert: true,
        ..Default::default()
    };
    let (served, result) = handshake(config(), &client, b"ping");
    assert_eq!(client_hello_count(&served.captured), 2);
    assert_eq!(served.peer_cert_count, 1);
    assert_eq!(served.session_id, result.finished);
    assert_eq!(served.early_app_data, b"ping");
}

#[test]
fn application_data_in_the_same_read_as_finished() {
    let config = config();
    for (suite, _) in SUITES {
        let client = OpensslClient {
            suite,
            ..Default::default()
        };
        let (served, result) = handshake(config.clone(), &client, b"first block");
        assert_eq!(served.session_id, result.finished, "{suite}");
        assert_eq!(served.early_app_data, b"first block", "{suite}");
    }
}

#[test]
fn alpn_negotiation() {
    let config = config();
    for proto in [ALPN_SMP, b"h2", b"http/1.1"] {
        let offered: &[&[u8]] = &[b"foo", proto];
        let client = OpensslClient {
            alpn: Some(offered),
            ..Default::default()
        };
        let (served, result) = handshake(config.clone(), &client, b"");
        assert_eq!(served.alpn.as_deref(), Some(proto));
        assert_eq!(result.alpn.as_deref(), Some(proto));
        assert_eq!(served.session_id, result.finished);
    }

    let client = OpensslClient {
        alpn: None,
        ..Default::default()
    };
    let (served, result) = handshake(config.clone(), &client, b"");
    assert_eq!(served.alpn, None);
    assert_eq!(served.session_id, result.finished);
    assert_eq!(
        tls::alpn_versions(served.alpn.as_deref()),
        smp_relay::protocol::version::LEGACY_SERVER_VERSIONS
    );

    let (addr, server) = serve_one(config);
    let offered: &[&[u8]] = &[b"foo"];
    let client = OpensslClient {
        alpn: Some(offered),
        ..Default::default()
    };
    let err = client.run(addr, b"").err().expect("client must fail");
    assert!(err.contains("no application protocol"), "{err}");
    let err = server.join().unwrap().expect_err("server must fail");
    assert!(err.contains("NoApplicationProtocol"), "{err}");
}

#[test]
fn sni_is_served_like_no_sni() {
    let client = OpensslClient {
        sni: Some("smp.example.com"),
        ..Default::default()
    };
    let (served, result) = handshake(config(), &client, b"");
    assert_eq!(served.session_id, result.finished);
    assert_eq!(served.alpn.as_deref(), Some(ALPN_SMP));
}

#[test]
fn tls12_client_is_refused() {
    let (addr, server) = serve_one(config());
    let client = OpensslClient {
        max_version: SslVersion::TLS1_2,
        ..Default::default()
    };
    let err = client.run(addr, b"").err().expect("client must fail");
    assert!(err.contains("protocol version"), "{err}");
    assert!(server.join().unwrap().is_err());
}

#[test]
fn rustls_client_session_id_equals_server() {
    let (addr, server) = serve_one(config());
    let client_config = tls::client_config(vec![ALPN_SMP.to_vec()]).unwrap();
    let mut capture =
        ClientCapture::new(&client_config, ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    capture.handshake_blocking(&mut sock).unwrap();
    let (conn, client_id) = capture.finish().unwrap();
    let served = server.join().unwrap().unwrap();
    assert_eq!(client_id.len(), 32);
    assert_eq!(client_id, served.session_id);
    assert_eq!(conn.alpn_protocol(), Some(ALPN_SMP));
}

#[test]
fn rustls_client_with_certificate_and_data_after_finished() {
    let (addr, server) = serve_one(config());
    let key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let rc_key = rcgen::KeyPair::try_from(
        ed25519_dalek::pkcs8::EncodePrivateKey::to_pkcs8_der(&key)
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let cert = rcgen::CertificateParams::new(vec!["svc".into()])
        .unwrap()
        .self_signed(&rc_key)
        .unwrap();
    let client_config =
        tls::client_config_with_cert(vec![ALPN_SMP.to_vec()], vec![cert.der().to_vec()], &key)
            .unwrap();
    let mut capture =
        ClientCapture::new(&client_config, ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    // Run until the server's flight is in, then queue data so it leaves with the client Finished.
    while capture.is_handshaking() {
        while capture.connection().wants_write() {
            capture.write_tls_to(&mut sock).unwrap();
        }
        if capture.is_handshaking() {
            assert!(capture.read_tls_from(&mut sock).unwrap() > 0);
        }
    }
    let mut conn_data = Vec::new();
    let (mut conn, client_id) = {
        // Queue before the final write: the Finished is still pending in rustls' buffer.
        assert!(capture.connection().wants_write());
        let mut pending = Vec::new();
        while capture.connection().wants_write() {
            capture.write_tls_to(&mut pending).unwrap();
        }
        conn_data.extend(pending);
        capture.finish().unwrap()
    };
    conn.writer().write_all(b"after").unwrap();
    conn.write_tls(&mut conn_data).unwrap();
    sock.write_all(&conn_data).unwrap();
    let served = server.join().unwrap().unwrap();
    assert_eq!(served.session_id, client_id);
    assert_eq!(served.peer_cert_count, 1);
    assert_eq!(served.early_app_data, b"after");
}

#[test]
fn capture_limit_is_enforced_on_a_real_socket() {
    let (addr, server) = serve_one(config());
    let mut sock = TcpStream::connect(addr).unwrap();
    // A ClientHello that announces 65520 bytes (rustls buffers messages up to 64 KiB), sent in
    // full-size records: the capture bound trips before rustls sees the end of the message.
    let mut body = vec![1u8, 0x00, 0xff, 0xf0];
    body.resize(4 + 0xfff0, 0);
    let mut wire = Vec::new();
    for chunk in body.chunks(16384) {
        wire.extend_from_slice(&[22, 3, 1]);
        wire.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        wire.extend_from_slice(chunk);
    }
    assert!(wire.len() > MAX_HANDSHAKE_CAPTURE_BYTES);
    let _ = sock.write_all(&wire);
    // rustls' own 64 KiB handshake-message buffer may trip first; either way the server refuses.
    let err = server.join().unwrap().expect_err("server must refuse");
    assert!(
        err.contains("CaptureOverflow") || err.contains("buffer full"),
        "{err}"
    );
}

#[test]
fn ed448_client_certificate_is_verified() {
    let client = OpensslClient {
        client_cert: true,
        client_cert_ed448: true,
        ..Default::default()
    };
    let (served, result) = handshake(config(), &client, b"");
    assert_eq!(served.peer_cert_count, 1);
    assert_eq!(served.session_id, result.finished);
}

/// An OpenSSL server (Ed25519 or Ed448 certificate) for checking the client side on its own:
/// returns OpenSSL's `SSL_get_peer_finished`, the client Finished as the server saw it.
fn openssl_server(ed448: bool) -> (SocketAddr, JoinHandle<Result<Vec<u8>, String>>) {
    let key = if ed448 {
        PKey::generate_ed448().unwrap()
    } else {
        PKey::generate_ed25519().unwrap()
    };
    let mut b = SslContext::builder(SslMethod::tls_server()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_certificate(&openssl_self_signed(&key, "smp server"))
        .unwrap();
    b.set_private_key(&key).unwrap();
    b.set_num_tickets(0).unwrap();
    b.set_alpn_select_callback(|_, client| {
        openssl::ssl::select_next_proto(b"\x05smp/1", client).ok_or(openssl::ssl::AlpnError::NOACK)
    });
    let ctx = b.build();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (sock, _) = listener.accept().map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut stream = Ssl::new(&ctx)
            .unwrap()
            .accept(sock)
            .map_err(|e| format!("{e:?}"))?;
        // Read the client's first bytes so its Finished is surely processed.
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).map_err(|e| e.to_string())?;
        let mut finished = [0u8; 64];
        let n = stream.ssl().peer_finished(&mut finished);
        Ok(finished[..n.min(64)].to_vec())
    });
    (addr, handle)
}

#[test]
fn rustls_client_session_id_equals_openssl_server_peer_finished() {
    for ed448 in [false, true] {
        let (addr, server) = openssl_server(ed448);
        let client_config = tls::client_config(vec![ALPN_SMP.to_vec()]).unwrap();
        let mut capture =
            ClientCapture::new(&client_config, ServerName::try_from("127.0.0.1").unwrap()).unwrap();
        let mut sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        capture.handshake_blocking(&mut sock).unwrap();
        let (mut conn, client_id) = capture.finish().unwrap();
        assert_eq!(conn.alpn_protocol(), Some(ALPN_SMP));
        conn.writer().write_all(b"x").unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        let server_view = server.join().unwrap().unwrap();
        assert_eq!(client_id.len(), 32, "ed448={ed448}");
        assert_eq!(client_id, server_view, "ed448={ed448}");
    }
}
