//! The web site's HTTP side (`src/server/web.rs`, `src/web/http.rs`): plain HTTP on `[WEB] http`,
//! HTTPS on a port of its own and on an SMP port shared by SNI beside native SMP and WebSocket
//! clients, requests the site refuses, and idle connections that must not cost SMP clients
//! anything. What the pages show in a browser is `tests/operations/web_page.rs`.
//!
//! The requests here are written by hand over std's TCP and OpenSSL, never with the relay's code.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::support;
use common::wire;
use common::{free_port, web, Relay, RelayOptions, TempDir};
use smp_relay::client::{Client, ClientOptions};
use smp_relay::limits::{WEB_MAX_HEADERS, WEB_MAX_REQUEST_BYTES};

/// A relay serving its site on a plain HTTP port, plus `extra` flags; returns it and that port.
fn relay_with_site(extra: &[String]) -> (Relay, SocketAddr) {
    let http = free_port();
    let dir = TempDir::new("relay").expect("a temp dir");
    common::init(dir.path());
    let mut extra_args = vec![
        "--web-static-path".to_string(),
        dir.path().join("www").display().to_string(),
        "--web-http".into(),
        http.to_string(),
    ];
    extra_args.extend(extra.iter().cloned());
    let relay = Relay::start_in(
        dir,
        RelayOptions {
            extra_args,
            ..RelayOptions::default()
        },
    );
    (relay, SocketAddr::from(([127, 0, 0, 1], http)))
}

/// An answer: status code, headers (names in lower case) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one answer from `s` (its body by `Content-Length`; none for `HEAD`, `304`).
fn read_answer(s: &mut impl Read, head_only: bool) -> Answer {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("an answer's head");
        head.push(byte[0]);
    }
    let text = String::from_utf8(head).expect("an ASCII head");
    let mut lines = text.trim_end().split("\r\n");
    let status: u16 = lines.next().unwrap()[9..12].parse().expect("a status code");
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("a header line");
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; if head_only || status == 304 { 0 } else { len }];
    s.read_exact(&mut body).expect("the body");
    Answer {
        status,
        headers,
        body,
    }
}

fn plain(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn get(addr: SocketAddr, target: &str) -> Answer {
    let mut s = plain(addr);
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: relay.test\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    read_answer(&mut s, false)
}

/// The connection was closed by the relay: a read gets the end, or a reset.
fn closed(s: &mut impl Read) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn the_site_is_served_over_plain_http_with_its_pages_and_files() {
    let (relay, http) = relay_with_site(&[]);
    let index = get(http, "/");
    assert_eq!(index.status, 200, "{index:?}");
    assert_eq!(
        index.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let html = String::from_utf8(index.body.clone()).unwrap();
    assert!(html.contains("data-field=\"persistence\""), "{html}");
    // The same page as written to `static_path` for the operator.
    let written = std::fs::read(relay.dir.path().join("www/index.html")).unwrap();
    assert_eq!(written, index.body);
    for page in [
        "/a",
        "/a/",
        "/c/",
        "/g/",
        "/r/",
        "/i/",
        "/contact/",
        "/invitation",
    ] {
        let a = get(http, page);
        assert_eq!(a.status, 200, "{page}");
        assert!(
            String::from_utf8_lossy(&a.body).contains("id=\"link-qr\""),
            "{page}"
        );
    }
    let qr = get(http, "/media/qr.js");
    assert_eq!(
        qr.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert!(qr.header("cache-control").unwrap().contains("max-age="));
    for file in ["assetlinks.json", "apple-app-site-association"] {
        let a = get(http, &format!("/.well-known/{file}"));
        assert_eq!(
            (a.status, a.header("content-type")),
            (200, Some("application/json"))
        );
        serde_json::from_slice::<serde_json::Value>(&a.body).expect("JSON");
    }
    // Nothing may load from elsewhere, nor run inline.
    let csp = index.header("content-security-policy").unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );

    // Keep-alive, pipelined: two requests in one write, answered in order; then HEAD, and a
    // request that asks whether the page changed since it was generated.
    let mut s = plain(http);
    s.write_all(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /media/style.css HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let (a, b) = (read_answer(&mut s, false), read_answer(&mut s, false));
    assert_eq!((a.status, b.status), (200, 200));
    assert!(b.header("content-type").unwrap().starts_with("text/css"));
    s.write_all(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let h = read_answer(&mut s, true);
    assert_eq!(
        h.header("content-length"),
        Some(index.body.len().to_string().as_str())
    );
    let since = index.header("last-modified").unwrap().to_string();
    write!(
        s,
        "GET / HTTP/1.1\r\nIf-Modified-Since: {since}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let n = read_answer(&mut s, false);
    assert_eq!(n.status, 304);
    assert!(closed(&mut s), "Connection: close is honoured");

    // gzip when accepted, the same bytes once inflated.
    let mut s = plain(http);
    s.write_all(b"GET /media/qr.js HTTP/1.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n")
        .unwrap();
    let z = read_answer(&mut s, false);
    assert_eq!(z.header("content-encoding"), Some("gzip"));
    let mut inflated = Vec::new();
    flate2::read::GzDecoder::new(&z.body[..])
        .read_to_end(&mut inflated)
        .unwrap();
    assert_eq!(inflated, qr.body);
}

#[test]
fn paths_outside_the_site_and_folders_without_an_index_are_not_found() {
    let (_relay, http) = relay_with_site(&[]);
    for target in [
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/a/../../etc/passwd",
        "/media/",
        "/media",
        "/.well-known/",
        "/www/index.html",
        "/smp-server.ini",
        "/server.key",
        "/nope",
    ] {
        let a = get(http, target);
        assert_eq!(a.status, 404, "{target}: {a:?}");
        assert!(
            !String::from_utf8_lossy(&a.body).contains("BEGIN"),
            "{target}"
        );
    }
    for (request, status) in [
        ("GET /%00 HTTP/1.1\r\n\r\n", 400),
        ("GET /a\\..\\b HTTP/1.1\r\n\r\n", 400),
        ("GET http://relay.test/ HTTP/1.1\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (
            "GET / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789",
            400,
        ),
        ("GET / HTTP/3\r\n\r\n", 505),
        ("hello\r\n\r\n", 400),
    ] {
        let mut s = plain(http);
        s.write_all(request.as_bytes()).unwrap();
        let a = read_answer(&mut s, false);
        assert_eq!(a.status, status, "{request:?}");
        assert!(
            closed(&mut s),
            "{request:?}: a refused request closes its connection"
        );
    }
}

#[test]
fn a_request_over_the_limits_is_refused_and_closed() {
    let (relay, http) = relay_with_site(&[]);
    // A head longer than the limit, sent without its end: refused once the limit is read.
    let mut s = plain(http);
    let filler = format!("X-Filler: {}\r\n", "a".repeat(100));
    let mut request = "GET / HTTP/1.1\r\n".to_string();
    while request.len() <= WEB_MAX_REQUEST_BYTES {
        request += &filler;
    }
    s.write_all(request.as_bytes()).unwrap();
    let a = read_answer(&mut s, false);
    assert_eq!(a.status, 431);
    assert!(closed(&mut s));
    // More header lines than the limit, in a short head.
    let mut s = plain(http);
    let lines: String = (0..=WEB_MAX_HEADERS)
        .map(|i| format!("X-{i}: v\r\n"))
        .collect();
    write!(s, "GET / HTTP/1.1\r\n{lines}\r\n").unwrap();
    assert_eq!(read_answer(&mut s, false).status, 431);
    assert!(closed(&mut s));
    // The relay goes on serving.
    assert_eq!(get(http, "/").status, 200);
    relay.assert_serves();
}

#[test]
fn a_thousand_idle_http_connections_cost_smp_clients_nothing() {
    let (relay, http) = relay_with_site(&[]);
    // Each holds a connection without a request (or half a request), as idle browsers and
    // slow-loris peers do, all from the address SMP clients use too.
    let mut idle = Vec::with_capacity(1000);
    for i in 0..1000 {
        let mut s = plain(http);
        if i % 2 == 0 {
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap();
        }
        idle.push(s);
    }
    // SMP clients connect and are served (their handshakes are not held back by the idle web
    // connections of the same address) and the site still answers.
    let mut clients: Vec<Client> = (0..20).map(|_| relay.client()).collect();
    let (rcv, snd) = clients.split_at_mut(10);
    for (r, s) in rcv.iter_mut().zip(snd.iter_mut()) {
        round_trip(r, s, b"past the idle ones");
    }
    assert_eq!(get(http, "/").status, 200);
    // The idle connections are all still open (nothing closed them to make room).
    let mut open = 0;
    for s in &mut idle {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        if matches!(s.read(&mut b), Err(e) if e.kind() == ErrorKind::WouldBlock) {
            open += 1;
        }
    }
    assert_eq!(open, 1000);
}

/// A queue made by `r`, a message sent by `s` and delivered to `r`.
fn round_trip(r: &mut Client, s: &mut Client, body: &[u8]) {
    let q = support::create(r);
    support::send_ok(s, &q, None, body);
    support::expect_body(r, &q, body);
}

/// A GET over TLS naming the web host, as a browser sends it.
fn https_get(addr: SocketAddr, target: &str) -> (Answer, Vec<u8>) {
    let mut t = wire::openssl_connect_sni(addr, &[b"h2", b"http/1.1"], web::HOST)
        .expect("TLS naming the web host");
    write!(t, "GET {target} HTTP/1.1\r\nHost: relay.test\r\n\r\n").unwrap();
    let a = read_answer(&mut t, false);
    // The connection stays open for the page's next request.
    t.write_all(b"GET /media/link.js HTTP/1.1\r\nHost: relay.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_answer(&mut t, false).status, 200, "a second request");
    let der = t.ssl().peer_certificate().unwrap().to_der().unwrap();
    (a, der)
}

#[test]
fn https_is_served_by_sni_on_a_shared_smp_port_beside_native_and_websocket_clients() {
    let files = TempDir::new("web-cert").expect("a temp dir");
    let cert = web::write(files.path());
    let shared = free_port();
    let (relay, _http) = relay_with_site(&cert.args(shared));
    let addr = SocketAddr::from(([127, 0, 0, 1], shared));
    let (page, der) = https_get(addr, "/a/");
    assert_eq!(page.status, 200, "{page:?}");
    assert!(String::from_utf8_lossy(&page.body).contains("id=\"open-in-app\""));
    assert_eq!(
        der, cert.der,
        "a client naming a host gets the web certificate"
    );
    // On the same port: a native SMP client (no SNI) and a web client of SMP over WebSocket.
    let mut native = Client::connect(addr, relay.key_hash, ClientOptions::default())
        .unwrap_or_else(|e| panic!("native SMP on the shared port: {e}"));
    let ws_opts = ClientOptions {
        sni: Some(web::HOST.to_string()),
        ..ClientOptions::websocket()
    };
    let mut browser = Client::connect(addr, relay.key_hash, ws_opts)
        .unwrap_or_else(|e| panic!("SMP over WebSocket on the shared port: {e}"));
    round_trip(&mut native, &mut browser, b"web to native");
    round_trip(&mut browser, &mut native, b"native to web");
    // A page request still works after them, and the plain SMP port is untouched.
    assert_eq!(https_get(addr, "/").0.status, 200);
    relay.assert_serves();
}

#[test]
fn https_on_a_port_of_its_own_serves_the_site_alone() {
    let files = TempDir::new("web-cert").expect("a temp dir");
    let cert = web::write(files.path());
    let own = free_port();
    let args: Vec<String> = ["--web-https", &own.to_string(), "--web-cert"]
        .iter()
        .map(|s| s.to_string())
        .chain([cert.cert.display().to_string(), "--web-key".into()])
        .chain([cert.key.display().to_string()])
        .collect();
    let (relay, _http) = relay_with_site(&args);
    let addr = SocketAddr::from(([127, 0, 0, 1], own));
    let (index, der) = https_get(addr, "/");
    assert_eq!(index.status, 200);
    assert!(String::from_utf8_lossy(&index.body).contains("data-field=\"persistence\""));
    assert_eq!(der, cert.der);
    // Not an SMP port: an SMP client's handshake gets no SMP answer.
    assert!(Client::connect(addr, relay.key_hash, ClientOptions::default()).is_err());
    relay.assert_serves();
}
