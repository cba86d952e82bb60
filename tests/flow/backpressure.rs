//! Back-pressure (`docs/ARCHITECTURE.md` §4): a connection that stops reading costs the relay a
//! bounded amount of memory and stalls nobody else; when it reads again, every message arrives
//! exactly once; and a pause past the slow-reader limit closes it without losing a message.
//!
//! The crate's `Client` reads and writes from one thread, so a connection that writes while nobody
//! reads would block the test itself. `Split` below is the same client protocol (TLS with the
//! client's tls-unique, SMP handshake, encrypted blocks) with the two directions on two threads:
//! the TLS state sits behind a mutex that is never held across a socket call.

use crate::common;
use crate::support;

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{self};
use smp_relay::client::{
    new_corr_id, Authorization, Client, ClientTransmission, CommandBody, ServerTransmission,
    Signer, CLIENT_VERSIONS,
};
use smp_relay::crypto::{auth, sxbox};
use smp_relay::protocol::batch::{parse_batch, BatchWriter};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::error::ErrorType;
use smp_relay::protocol::handshake::{ClientHello, ServerHello};
use smp_relay::protocol::pad;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::protocol::transmission::{
    client_signed_bytes, encode_client_transmission, parse_transmission,
};
use smp_relay::protocol::version::Version;
use smp_relay::transport::block::{BlockCodec, BLOCK_SIZE};
use smp_relay::transport::tls;
use support::{create_many, send_cmd, Queue};

/// Queues subscribed on the connection that stops reading, one message each.
const QUEUES: usize = 10_000;
/// Requests written before their answers are read when setting up: a few blocks, well under the
/// relay's blocks in flight, so neither side waits on a full socket.
const PIPELINE: usize = 400;
/// The other connection's work while the reader is paused.
const OTHER_PINGS: usize = 100;
const OTHER_SENDS: usize = 100;
/// How long the paused connection's writes must make no progress to count as refused.
const STALL: Duration = Duration::from_millis(1000);
/// Bound on waiting for any one phase.
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// Bound on receiving everything once the paused reader resumes. The relay hands the messages it
/// dropped to markers back 45 at a time (`REDELIVER_BATCH`) as the output drains; on a loaded
/// 2-core host that ran at 300-1000 MSGs/s where a reading connection gets 3000/s.
const RESUME_LIMIT: Duration = Duration::from_secs(120);
/// RssAnon the relay may grow by while one connection has 10,000 MSGs (160 MB) to send and reads
/// nothing. What the relay may hold for it: at most MAX_BLOCKS_IN_FLIGHT (8) blocks being answered,
/// each a block of SOKs and its MSGs up to the 1 MiB output bound (over it a MSG is a ~100-byte
/// marker, 10,000 markers ≈ 1 MB); one flush's worth of TLS records in rustls (≈ 1 MiB); the
/// 10,000 subscriptions (≈ 2-3 MB); the read and block buffers. That is under 16 MiB; 64 MiB leaves
/// room for allocator slack and is still a small fraction of the 160 MB an unbounded relay would
/// queue. Socket buffers are kernel memory and do not count.
const RSS_GROWTH_BOUND_KB: u64 = 64 * 1024;
/// The slow-reader limit the close test starts the relay with: on the relay's clock, which the
/// test advances past it (`src/server/conn/mod.rs`), so long that real time never reaches it.
const SLOW_READER_CLOSE_SECS: u32 = 60;
/// How often the relay's slow-reader watchdog looks in the tests that advance its clock.
const SLOW_READER_TICK_MS: &str = "10";
/// Queues the re-subscribing connection takes at once: their MSGs (16 KB each) stay under the
/// 1 MiB output bound, so that the slow-reader limit cannot close that connection.
const RESUB_CHUNK: usize = 32;

/// `[min, default, max]` of `/proc/sys/net/ipv4/tcp_{w,r}mem`.
fn tcp_mem(which: &str) -> [usize; 3] {
    let text = std::fs::read_to_string(format!("/proc/sys/net/ipv4/tcp_{which}mem"))
        .unwrap_or_else(|_| "4096 131072 6291456".into());
    let v: Vec<usize> = text
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    [v[0], v[1], v[2]]
}

/// The most one direction of a loopback TCP connection can hold: the sender's largest send buffer
/// and the receiver's largest receive buffer.
fn socket_capacity_bytes() -> usize {
    tcp_mem("w")[2] + tcp_mem("r")[2]
}

/// Bytes the relay has not read yet from the connection whose client side is `client_port`
/// (`rx_queue` of the relay's socket in `/proc/net/tcp`).
fn relay_unread_bytes(relay_port: u16, client_port: u16) -> usize {
    socket_queues(relay_port, client_port).1
}

/// `(tx_queue, rx_queue)` of the loopback socket from `local_port` to `remote_port` in
/// `/proc/net/tcp` or `/proc/net/tcp6` (the relay's dual-stack listener accepts IPv4 clients on
/// IPv6 sockets): bytes written and not yet acknowledged by the peer, bytes not yet read.
fn socket_queues(local_port: u16, remote_port: u16) -> (usize, usize) {
    let mut table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    // Without IPv6 the file is missing, and the relay listens on IPv4 only.
    table += &std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    let port = |addr: &str| {
        addr.split(':')
            .nth(1)
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    let hex = |s: Option<&str>| usize::from_str_radix(s.unwrap_or("0"), 16).unwrap_or(0);
    table
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (port(f[1]) == Some(local_port) && port(f[2]) == Some(remote_port)).then(|| {
                let mut q = f[4].split(':');
                (hex(q.next()), hex(q.next()))
            })
        })
        .unwrap_or_else(|| panic!("no socket {local_port} -> {remote_port} in /proc/net/tcp{{,6}}"))
}

// ------------------------------------------------------------------------------------------------
// A client connection whose reading and writing halves run on different threads.

struct TlsHalf {
    conn: rustls::ClientConnection,
    codec: BlockCodec,
}

struct Session {
    version: Version,
    session_id: Vec<u8>,
}

struct SplitWriter {
    sock: TcpStream,
    tls: Arc<Mutex<TlsHalf>>,
    session: Arc<Session>,
    /// TLS bytes written to the socket by `send_content`.
    sent: usize,
}

struct SplitReader {
    sock: TcpStream,
    tls: Arc<Mutex<TlsHalf>>,
    session: Arc<Session>,
    plain: Vec<u8>,
}

#[derive(Debug)]
enum ReadError {
    Timeout,
    Closed(String),
}

/// Connects as `Client::connect` does (v18 or the highest common version, encrypted blocks) and
/// returns the two halves.
fn split_connect(relay: &Relay) -> (SplitWriter, SplitReader) {
    split_connect_with(relay, TcpStream::connect(relay.addr).expect("connect"))
}

/// `split_connect` over a socket whose receive buffer is only `bytes`, so that the relay's output
/// backs up after a few blocks instead of after the kernel's megabytes.
fn split_connect_small(relay: &Relay, bytes: usize) -> (SplitWriter, SplitReader) {
    let s =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    s.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
    s.connect(&relay.addr.into()).expect("connect");
    split_connect_with(relay, s.into())
}

fn split_connect_with(relay: &Relay, mut sock: TcpStream) -> (SplitWriter, SplitReader) {
    sock.set_nodelay(true).expect("nodelay");
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let config = tls::client_config(vec![b"smp/1".to_vec()]).expect("TLS config");
    let name = rustls::pki_types::ServerName::IpAddress(relay.addr.ip().into());
    let mut capture = tls::ClientCapture::new(&config, name).expect("TLS client");
    capture
        .handshake_blocking(&mut sock)
        .expect("TLS handshake");
    let (mut conn, tls_unique) = capture.finish().expect("tls-unique");
    let mut plain = Vec::new();
    while plain.len() < BLOCK_SIZE {
        let mut buf = [0u8; 16 * 1024];
        let n = sock.read(&mut buf).expect("server hello");
        assert!(n > 0, "closed before the server hello");
        let mut rd = &buf[..n];
        while !rd.is_empty() {
            conn.read_tls(&mut rd).expect("read TLS");
            conn.process_new_packets().expect("TLS records");
        }
        let _ = conn.reader().read_to_end(&mut plain);
    }
    let hello_block: Vec<u8> = plain.drain(..BLOCK_SIZE).collect();
    let hello =
        ServerHello::decode(pad::unpad(&hello_block).expect("padded hello")).expect("server hello");
    assert_eq!(hello.session_id, tls_unique, "session id is tls-unique");
    let ck = hello.cert_key.expect("a signed session key");
    let leaf = conn.peer_certificates().expect("certificates")[0].to_vec();
    let server_key = common::wire::verify_signed_key(&ck.signed_key, &leaf);
    let version = hello
        .versions
        .intersect(&CLIENT_VERSIONS)
        .expect("a common version")
        .max;
    let secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
    let public = x25519_dalek::PublicKey::from(&secret).to_bytes();
    let client_hello = ClientHello {
        version,
        key_hash: relay.key_hash.to_vec(),
        client_key: Some(public),
        proxy_server: false,
        service: None,
    };
    let mut out = [0u8; BLOCK_SIZE];
    BlockCodec::plain()
        .encode(&client_hello.encode(), &mut out)
        .expect("client hello");
    conn.writer().write_all(&out).expect("client hello");
    while conn.wants_write() {
        conn.write_tls(&mut sock).expect("write client hello");
    }
    let codec = BlockCodec::client(
        &hello.session_id,
        &sxbox::dh(secret.as_bytes(), &server_key),
    );
    let tls = Arc::new(Mutex::new(TlsHalf { conn, codec }));
    let session = Arc::new(Session {
        version,
        session_id: hello.session_id,
    });
    (
        SplitWriter {
            sock: sock.try_clone().expect("clone socket"),
            tls: tls.clone(),
            session: session.clone(),
            sent: 0,
        },
        SplitReader {
            sock,
            tls,
            session,
            plain,
        },
    )
}

impl SplitWriter {
    /// The wire bytes of a transmission, unsigned or signed with an Ed25519 key.
    fn encode(&self, t: &ClientTransmission) -> Vec<u8> {
        let CommandBody::Cmd(c) = &t.command else {
            panic!("raw commands are not used here")
        };
        let (v, sid) = (self.session.version, &self.session.session_id);
        let mut command = Vec::new();
        c.encode(v, &mut command);
        let authorization = match &t.auth {
            Authorization::None => Vec::new(),
            Authorization::Sign(Signer::Ed25519(sk)) => {
                let signed = client_signed_bytes(v, sid, &t.corr_id, &t.entity_id, &command);
                auth::sign_ed25519(sk, &signed).to_vec()
            }
            _ => panic!("only Ed25519 keys are used here"),
        };
        encode_client_transmission(
            v,
            sid,
            &authorization,
            None,
            &t.corr_id,
            &t.entity_id,
            &command,
        )
    }

    /// The block contents for `ts`, packed as many per block as fit.
    fn blocks(&self, ts: &[ClientTransmission]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut w = BatchWriter::new();
        for t in ts {
            let bytes = self.encode(t);
            if !w.try_push(&bytes) {
                out.push(w.content());
                w.clear();
                assert!(w.try_push(&bytes), "a transmission fits a block");
            }
        }
        if !w.is_empty() {
            out.push(w.content());
        }
        out
    }

    /// Writes one block; blocks while the socket is full (the TLS state is not locked meanwhile).
    fn send_content(&mut self, content: &[u8]) -> io::Result<()> {
        let mut wire = Vec::with_capacity(BLOCK_SIZE + 64);
        {
            let mut tls = self.tls.lock().expect("TLS state");
            let mut block = [0u8; BLOCK_SIZE];
            tls.codec
                .encode(content, &mut block)
                .map_err(|e| io::Error::other(format!("{e:?}")))?;
            tls.conn.writer().write_all(&block)?;
            while tls.conn.wants_write() {
                tls.conn.write_tls(&mut wire)?;
            }
        }
        self.sock.write_all(&wire)?;
        self.sent += wire.len();
        Ok(())
    }

    fn send(&mut self, ts: &[ClientTransmission]) -> io::Result<()> {
        for b in self.blocks(ts) {
            self.send_content(&b)?;
        }
        Ok(())
    }
}

impl SplitReader {
    fn set_timeout(&self, d: Duration) {
        self.sock.set_read_timeout(Some(d)).expect("set timeout");
    }

    /// The next block's transmissions. A timeout loses nothing: bytes read so far stay buffered.
    fn recv_block(&mut self) -> Result<Vec<ServerTransmission>, ReadError> {
        loop {
            if self.plain.len() >= BLOCK_SIZE {
                let mut block = [0u8; BLOCK_SIZE];
                block.copy_from_slice(&self.plain[..BLOCK_SIZE]);
                self.plain.drain(..BLOCK_SIZE);
                let content = {
                    let mut tls = self.tls.lock().expect("TLS state");
                    tls.codec
                        .decode(&mut block)
                        .map_err(|e| ReadError::Closed(format!("block: {e:?}")))?
                        .to_vec()
                };
                return Ok(self.parse(&content));
            }
            let mut buf = [0u8; 64 * 1024];
            let n = match self.sock.read(&mut buf) {
                Ok(0) => return Err(ReadError::Closed("end of stream".into())),
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ReadError::Timeout)
                }
                Err(e) => return Err(ReadError::Closed(e.to_string())),
            };
            let mut tls = self.tls.lock().expect("TLS state");
            let mut rd = &buf[..n];
            while !rd.is_empty() {
                tls.conn
                    .read_tls(&mut rd)
                    .map_err(|e| ReadError::Closed(e.to_string()))?;
                tls.conn
                    .process_new_packets()
                    .map_err(|e| ReadError::Closed(e.to_string()))?;
                let _ = tls.conn.reader().read_to_end(&mut self.plain);
            }
        }
    }

    fn parse(&self, content: &[u8]) -> Vec<ServerTransmission> {
        let v = self.session.version;
        parse_batch(content)
            .expect("a batch")
            .into_iter()
            .map(|item| {
                let t = parse_transmission(v, item).expect("a transmission");
                ServerTransmission {
                    corr_id: t.corr_id.to_vec(),
                    entity_id: t.entity_id.to_vec(),
                    command: t.command.to_vec(),
                    msg: BrokerMsg::parse(v, t.command).map_err(|_| t.command.to_vec()),
                }
            })
            .collect()
    }
}

// ------------------------------------------------------------------------------------------------
// Setup over an ordinary client.

fn body(i: usize) -> Vec<u8> {
    format!("message {i}").into_bytes()
}

/// One unsigned SEND to each queue, batched; every one must be OK.
fn send_each(c: &mut Client, qs: &[Queue], first: usize) {
    for (k, chunk) in qs.chunks(PIPELINE).enumerate() {
        let corrs: Vec<[u8; 24]> = chunk.iter().map(|_| new_corr_id()).collect();
        let ts: Vec<ClientTransmission> = chunk
            .iter()
            .zip(&corrs)
            .enumerate()
            .map(|(i, (q, corr))| {
                ClientTransmission::new(corr, q.sid(), send_cmd(&body(first + k * PIPELINE + i)))
            })
            .collect();
        c.send_batch(&ts).expect("send SENDs");
        for corr in &corrs {
            let r = c.recv_for(corr).expect("SEND response");
            assert_eq!(r.msg, Ok(BrokerMsg::Ok), "SEND: {}", queue::describe(&r));
        }
    }
}

fn sub_t(q: &Queue) -> ClientTransmission {
    ClientTransmission::new(&new_corr_id(), q.rid(), Command::Sub).signed(q.key().clone())
}

/// Which queue a transmission names, by recipient ID.
fn index(qs: &[Queue]) -> HashMap<Vec<u8>, usize> {
    qs.iter()
        .enumerate()
        .map(|(i, q)| (q.rid().to_vec(), i))
        .collect()
}

/// What the reading side has seen of the queues' messages.
struct Tally {
    soks: usize,
    acked: usize,
    /// Queue index → the message delivered to it.
    msgs: HashMap<usize, Vec<u8>>,
}

/// Reads until `done(tally)`, handing every MSG's ACK to `acks`; panics on a duplicate, a wrong
/// body, an error or `PHASE_LIMIT`.
fn read_until(
    rd: &mut SplitReader,
    qs: &[Queue],
    acks: &mpsc::Sender<Vec<ClientTransmission>>,
    done: impl Fn(&Tally) -> bool,
) -> Tally {
    read_until_paced(rd, qs, acks, done, None)
}

/// A slow but steady reader: at most `bytes_per_sec`, for its first `bytes`.
#[derive(Clone, Copy)]
struct Pace {
    bytes_per_sec: f64,
    bytes: f64,
}

/// `read_until`, keeping to `pace` when given.
fn read_until_paced(
    rd: &mut SplitReader,
    qs: &[Queue],
    acks: &mpsc::Sender<Vec<ClientTransmission>>,
    done: impl Fn(&Tally) -> bool,
    pace: Option<Pace>,
) -> Tally {
    let idx = index(qs);
    let mut read_bytes = 0f64;
    let mut tally = Tally {
        soks: 0,
        acked: 0,
        msgs: HashMap::new(),
    };
    let started = Instant::now();
    rd.set_timeout(Duration::from_secs(5));
    while !done(&tally) {
        assert!(
            started.elapsed() < RESUME_LIMIT,
            "{} SOKs, {} MSGs, {} ACKs answered after {RESUME_LIMIT:?}",
            tally.soks,
            tally.msgs.len(),
            tally.acked
        );
        if let Some(pace) = pace.filter(|p| read_bytes < p.bytes) {
            // Keep to the rate: never ahead of it.
            let due = Duration::from_secs_f64(read_bytes / pace.bytes_per_sec);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                common::sleep(wait);
            }
        }
        let block = match rd.recv_block() {
            Ok(b) => b,
            Err(ReadError::Timeout) => continue,
            Err(e) => panic!(
                "the connection failed after {:.1?} ({} SOKs, {} MSGs): {e:?}",
                started.elapsed(),
                tally.soks,
                tally.msgs.len()
            ),
        };
        read_bytes += BLOCK_SIZE as f64;
        let mut batch = Vec::new();
        for t in block {
            match &t.msg {
                Ok(BrokerMsg::Sok(None)) => tally.soks += 1,
                Ok(BrokerMsg::Ok) => tally.acked += 1,
                Ok(BrokerMsg::Msg { msg_id, .. }) if t.corr_id.is_empty() => {
                    let i = *idx
                        .get(&t.entity_id)
                        .unwrap_or_else(|| panic!("MSG for an unknown queue"));
                    let m = queue::receive(&qs[i].secret, &t).expect("MSG decrypts");
                    assert_eq!(m.msg.body(), Some(&body(i)[..]), "queue {i}'s message");
                    if let Some(prev) = tally.msgs.insert(i, msg_id.clone()) {
                        panic!(
                            "queue {i}: a second MSG (same id: {})",
                            prev == msg_id.clone()
                        );
                    }
                    batch.push(
                        ClientTransmission::new(
                            &new_corr_id(),
                            qs[i].rid(),
                            Command::Ack(msg_id.clone()),
                        )
                        .signed(qs[i].key().clone()),
                    );
                }
                _ => panic!("unexpected {}", queue::describe(&t)),
            }
        }
        if !batch.is_empty() {
            acks.send(batch).expect("ACK writer");
        }
    }
    tally
}

/// Waits until the relay's unread bytes of the connection (`unread()`) stay the same, and more than
/// zero, for `STALL`: the relay has stopped reading that socket. Returns them.
fn wait_until_unread(unread: impl Fn() -> usize) -> usize {
    let started = Instant::now();
    let mut last = unread();
    let mut since = Instant::now();
    loop {
        common::sleep(Duration::from_millis(50));
        let now = unread();
        if now != last || now == 0 {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= STALL {
            return now;
        }
        assert!(
            started.elapsed() < PHASE_LIMIT,
            "the relay still reads the paused connection after {PHASE_LIMIT:?} ({now} bytes unread)"
        );
    }
}

/// (a) 10,000 queues with a message each, subscribed on one connection that reads nothing: the
/// relay stops reading that socket (its receive queue stays full), serves another connection meanwhile, grows by a bounded amount
/// of memory, and when the reader resumes every message arrives exactly once.
#[test]
fn a_stopped_reader_is_bounded_and_gets_every_message_once_when_it_resumes() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..RelayOptions::default()
    });
    let started = Instant::now();
    let mut setup = relay.client();
    let qs = create_many(&mut setup, QUEUES, PIPELINE);
    send_each(&mut setup, &qs, 0);
    let others = create_many(&mut setup, OTHER_SENDS, PIPELINE);
    let mut other_rcv = relay.client();
    let corrs: Vec<ClientTransmission> = others.iter().map(sub_t).collect();
    other_rcv.send_batch(&corrs).expect("SUB others");
    for t in &corrs {
        let r = other_rcv.recv_for(&t.corr_id).expect("SOK");
        assert_eq!(r.msg, Ok(BrokerMsg::Sok(None)));
    }
    eprintln!("setup: {:.1?}", started.elapsed());
    let baseline_kb = relay.rss_anon_kb();
    // RssAnon while paused: sampled at each step of the other connection's work below (the paused
    // connection's share does not change while it stays paused; the other work adds its own).
    let mut paused_kb = Vec::new();

    // The paused connection writes all its SUBs from a thread of its own (the relay may stop
    // reading before they are all written) and reads nothing.
    let (mut w, mut rd) = split_connect(&relay);
    let client_port = rd.sock.local_addr().expect("local address").port();
    let unread = || relay_unread_bytes(relay.port, client_port);
    let blocks = w.blocks(&qs.iter().map(sub_t).collect::<Vec<_>>());
    let total = blocks.len();
    let written = Arc::new(AtomicUsize::new(0));
    let (ack_tx, ack_rx) = mpsc::channel::<Vec<ClientTransmission>>();
    let writer = {
        let written = written.clone();
        std::thread::spawn(move || {
            for b in &blocks {
                w.send_content(b).expect("write a block");
                written.fetch_add(1, Ordering::SeqCst);
            }
            for acks in ack_rx {
                w.send(&acks).expect("write ACKs");
            }
        })
    };
    let stalled_unread = wait_until_unread(unread);
    eprintln!(
        "paused reader: the relay stopped reading with {stalled_unread} bytes unread; the client \
         wrote {} of {total} SUB blocks",
        written.load(Ordering::SeqCst)
    );
    paused_kb.push(relay.rss_anon_kb());

    // Meanwhile another connection is served in full, and its queues' subscriber gets its MSGs.
    let mut other = relay.client();
    let pings: Vec<ClientTransmission> = (0..OTHER_PINGS)
        .map(|_| ClientTransmission::new(&new_corr_id(), b"", Command::Ping))
        .collect();
    other.send_batch(&pings).expect("PINGs");
    for p in &pings {
        let r = other.recv_for(&p.corr_id).expect("PONG");
        assert_eq!(r.msg, Ok(BrokerMsg::Pong));
    }
    paused_kb.push(relay.rss_anon_kb());
    send_each(&mut other, &others, QUEUES);
    paused_kb.push(relay.rss_anon_kb());
    let mut got = HashSet::new();
    let oidx = index(&others);
    while got.len() < OTHER_SENDS {
        let t = other_rcv.recv().expect("MSG to the other subscriber");
        let i = *oidx.get(&t.entity_id).expect("one of the other queues");
        let m = queue::receive(&others[i].secret, &t).expect("MSG decrypts");
        assert_eq!(m.msg.body(), Some(&body(QUEUES + i)[..]));
        assert!(got.insert(i), "other queue {i}: one MSG");
    }
    paused_kb.push(relay.rss_anon_kb());

    let peak_kb = paused_kb.into_iter().max().unwrap_or(0);
    let growth_kb = peak_kb.saturating_sub(baseline_kb);
    eprintln!(
        "RssAnon: {baseline_kb} kB before, {peak_kb} kB paused: +{growth_kb} kB \
         (bound {RSS_GROWTH_BOUND_KB} kB)"
    );
    assert_eq!(
        unread(),
        stalled_unread,
        "the relay read more of the paused connection while it was paused"
    );
    assert!(
        growth_kb < RSS_GROWTH_BOUND_KB,
        "the relay grew by {growth_kb} kB for one paused reader (bound {RSS_GROWTH_BOUND_KB} kB)"
    );

    // Resume: every SUB answered, every message exactly once, every ACK answered.
    let resumed = Instant::now();
    let tally = read_until(&mut rd, &qs, &ack_tx, |t| {
        t.soks == QUEUES && t.msgs.len() == QUEUES && t.acked == QUEUES
    });
    eprintln!(
        "resumed: {} SOKs, {} MSGs and {} ACKs answered in {:.1?}",
        tally.soks,
        tally.msgs.len(),
        tally.acked,
        resumed.elapsed()
    );
    drop(ack_tx);
    writer.join().expect("writer thread");
    // Nothing more: no duplicate arrives late.
    rd.set_timeout(Duration::from_millis(500));
    match rd.recv_block() {
        Err(ReadError::Timeout) => {}
        Ok(b) => panic!(
            "after every answer: {:?}",
            b.iter().map(queue::describe).collect::<Vec<_>>()
        ),
        Err(e) => panic!("after every answer: {e:?}"),
    }
    eprintln!("total: {:.1?}", started.elapsed());
}

/// (b) A reader paused past the slow-reader limit is closed; on a new connection SUB delivers every
/// message, once.
#[test]
fn b_a_reader_paused_past_the_slow_reader_limit_is_closed_and_loses_nothing() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec![
            "--slow-reader-close-secs".into(),
            SLOW_READER_CLOSE_SECS.to_string(),
            "--test-slow-reader-tick-ms".into(),
            SLOW_READER_TICK_MS.into(),
            "--metrics-interval".into(),
            "1".into(),
        ],
    });
    // Enough MSG bytes to fill both socket buffers and still leave the relay's output over its
    // 1 MiB bound.
    let n = ((socket_capacity_bytes() + (4 << 20)) / BLOCK_SIZE).max(300);
    let mut setup = relay.client();
    let qs = create_many(&mut setup, n, PIPELINE);
    send_each(&mut setup, &qs, 0);

    let (mut w, mut rd) = split_connect(&relay);
    let subs = w.blocks(&qs.iter().map(sub_t).collect::<Vec<_>>());
    let writer = std::thread::spawn(move || {
        // The relay may stop reading, then close: later writes may fail.
        for b in &subs {
            if w.send_content(b).is_err() {
                return;
            }
        }
    });
    // The pause, reading nothing, while the relay's clock moves past the limit again and again,
    // until the relay says it closed a slow reader; only then does the reader look.
    relay.metrics_advancing(SLOW_READER_CLOSE_SECS, "one slow-reader close", |m| {
        m.get("smprelay_slow_reader_closes_total") == Some(&1)
    });
    // Whatever was sent before the close may still be read; then the stream must end.
    rd.set_timeout(Duration::from_secs(10));
    let mut blocks = 0;
    let why = loop {
        match rd.recv_block() {
            Ok(_) => blocks += 1,
            Err(ReadError::Closed(why)) => break why,
            Err(ReadError::Timeout) => panic!(
                "the connection paused past the {SLOW_READER_CLOSE_SECS} s limit is still open \
                 ({blocks} blocks read, then nothing for 10 s)"
            ),
        }
    };
    eprintln!("closed after the pause ({blocks} blocks were in the socket): {why}");
    let _ = rd.sock.shutdown(Shutdown::Both);
    writer.join().expect("writer thread");

    // A new connection subscribes again: every message, once.
    let resub = Instant::now();
    let mut c = relay.client();
    let idx = index(&qs);
    let mut seen: HashMap<usize, Vec<u8>> = HashMap::new();
    for chunk in qs.chunks(RESUB_CHUNK) {
        let ts: Vec<ClientTransmission> = chunk.iter().map(sub_t).collect();
        c.send_batch(&ts).expect("SUBs");
        for t in &ts {
            let r = c.recv_for(&t.corr_id).expect("SOK");
            assert_eq!(r.msg, Ok(BrokerMsg::Sok(None)), "{}", queue::describe(&r));
        }
        // The MSGs follow their SOKs: read them, then ACK this chunk.
        let mut acks = Vec::new();
        for t in c.take_pending() {
            acks.push(take_msg(&qs, &idx, &mut seen, t));
        }
        while acks.len() < chunk.len() {
            let t = c.recv().expect("MSG");
            acks.push(take_msg(&qs, &idx, &mut seen, t));
        }
        c.send_batch(&acks).expect("ACKs");
        for a in &acks {
            let r = c.recv_for(&a.corr_id).expect("ACK response");
            assert_eq!(r.msg, Ok(BrokerMsg::Ok), "{}", queue::describe(&r));
        }
    }
    assert_eq!(seen.len(), n, "every queue's message");
    relay.metrics_until("still one slow-reader close", |m| {
        m.get("smprelay_slow_reader_closes_total") == Some(&1)
    });
    eprintln!("re-subscribed {n} queues in {:.1?}", resub.elapsed());
    support::expect_nothing(&mut c, "one MSG per queue");
}

/// Checks a MSG of the re-subscribing connection and returns its ACK.
fn take_msg(
    qs: &[Queue],
    idx: &HashMap<Vec<u8>, usize>,
    seen: &mut HashMap<usize, Vec<u8>>,
    t: ServerTransmission,
) -> ClientTransmission {
    let i = *idx
        .get(&t.entity_id)
        .unwrap_or_else(|| panic!("unexpected {}", queue::describe(&t)));
    let m = queue::receive(&qs[i].secret, &t).expect("MSG decrypts");
    assert_eq!(m.msg.body(), Some(&body(i)[..]), "queue {i}'s message");
    assert!(
        seen.insert(i, m.msg_id.clone()).is_none(),
        "queue {i}: one MSG"
    );
    ClientTransmission::new(&new_corr_id(), qs[i].rid(), Command::Ack(m.msg_id))
        .signed(qs[i].key().clone())
}

/// Reads blocks until `done` holds for what was read, giving up after `limit` of silence-free
/// waiting; returns every transmission read.
fn read_all_until(
    rd: &mut SplitReader,
    limit: Duration,
    mut done: impl FnMut(&ServerTransmission) -> bool,
) -> Result<Vec<ServerTransmission>, String> {
    let started = Instant::now();
    let mut seen = Vec::new();
    rd.set_timeout(Duration::from_secs(1));
    loop {
        if started.elapsed() > limit {
            return Err(format!("{} transmissions read, then not done", seen.len()));
        }
        match rd.recv_block() {
            Ok(block) => {
                for t in block {
                    let finished = done(&t);
                    seen.push(t);
                    if finished {
                        return Ok(seen);
                    }
                }
            }
            Err(ReadError::Timeout) => continue,
            Err(ReadError::Closed(why)) => {
                return Err(format!("closed after {} transmissions: {why}", seen.len()))
            }
        }
    }
}

/// Enough queues that their MSGs fill both socket buffers and leave the relay's output over its
/// 1 MiB bound by `extra_bytes`.
fn queues_beyond_sockets(extra_bytes: usize) -> usize {
    ((socket_capacity_bytes() + extra_bytes) / BLOCK_SIZE).max(300)
}

/// Empty queues, more than the sockets hold, subscribed on a split connection that then stops
/// reading; each queue gets one message, pushed to it, until the relay has dropped some pushes to
/// markers (the metrics say so).
fn paused_subscriber_with_drops(relay: &Relay) -> (Vec<Queue>, SplitWriter, SplitReader) {
    let n = queues_beyond_sockets(4 << 20);
    let mut setup = relay.client();
    let qs = create_many(&mut setup, n, PIPELINE);
    let (mut w, mut rd) = split_connect(relay);
    subscribe_empty(&mut w, &mut rd, &qs);
    send_each(&mut setup, &qs, 0);
    relay.metrics_until("dropped MSG deliveries", |m| {
        m.get("smprelay_output_drops_total").copied().unwrap_or(0) > 0
    });
    (qs, w, rd)
}

/// Subscribes `qs` on the split connection and reads every SOK (the queues are empty).
fn subscribe_empty(w: &mut SplitWriter, rd: &mut SplitReader, qs: &[Queue]) {
    w.send(&qs.iter().map(sub_t).collect::<Vec<_>>())
        .expect("SUBs");
    let mut soks = 0;
    read_all_until(rd, PHASE_LIMIT, |t| {
        assert_eq!(t.msg, Ok(BrokerMsg::Sok(None)), "{}", queue::describe(t));
        soks += 1;
        soks == qs.len()
    })
    .expect("every SOK");
}

/// (c) Issue: a dropped delivery could stall for good (I2). A connection holds many empty queues
/// and stops reading; one SEND to each fills its output, and the later pushes are dropped to
/// markers. Another connection then GETs and ACKs the messages of all but the last few queues, so
/// the markers asked for first are stale. When the first connection reads again, each queue that
/// still has its message gets its MSG, although the connection sends nothing.
#[test]
fn c_stale_held_deliveries_do_not_stall_the_live_ones() {
    const KEPT: usize = 20;
    // A small output bound: more markers, each asked for one at a time.
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec![
            "--metrics-interval".into(),
            "1".into(),
            "--test-output-high-water-bytes".into(),
            "16384".into(),
        ],
    });
    let (qs, _w, mut rd) = paused_subscriber_with_drops(&relay);
    let n = qs.len();

    // Another connection GETs and ACKs the message of every queue but the last KEPT: the paused
    // connection's markers for them are stale (nothing to send, and no event reaches it).
    get_and_ack_elsewhere(&relay, &qs[..n - KEPT]);

    // The paused connection reads again and sends nothing: the kept queues' MSGs all come.
    let got = msgs_of_the_last(&mut rd, &qs, KEPT, PHASE_LIMIT);
    assert_eq!(got, KEPT, "the kept queues' MSGs stalled");
    let m = relay.metrics_until("re-asks", |m| {
        m.get("smprelay_output_reasks_total").copied().unwrap_or(0) > 0
    });
    eprintln!(
        "{n} queues: {} drops, {} re-asks",
        m["smprelay_output_drops_total"], m["smprelay_output_reasks_total"]
    );
}

/// (c2) The issue's own scenario, with the default bounds: empty queues on a connection that stops
/// reading (its socket takes little), one SEND to each; ~64 pushes fill its 1 MiB of output and
/// the rest are dropped to markers. Another connection GETs and ACKs all but the last 20 queues'
/// messages, so the first markers asked for are stale. Before the fix the owner answered such an
/// ask with nothing, nothing more was written, and the last 50 queues' MSGs never came.
#[test]
fn c2_stale_markers_first_do_not_stall_the_rest_with_the_default_bounds() {
    // The relay's socket may still buffer up to tcp_wmem's maximum whatever the client's window;
    // past it and the 1 MiB bound, 300 more pushes are dropped, and all but the last 20 go stale.
    let n = (tcp_mem("w")[2] + (1 << 20)) / BLOCK_SIZE + 300;
    let taken = n - 20;
    let relay = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: vec!["--metrics-interval".into(), "1".into()],
    });
    let mut setup = relay.client();
    let qs = create_many(&mut setup, n, PIPELINE);
    let (mut w, mut rd) = split_connect_small(&relay, 4096);
    subscribe_empty(&mut w, &mut rd, &qs);
    send_each(&mut setup, &qs, 0);
    // The output is full and pushes are dropped to markers before any goes stale.
    relay.metrics_until("dropped MSG deliveries", |m| {
        m.get("smprelay_output_drops_total").copied().unwrap_or(0) > 0
    });
    get_and_ack_elsewhere(&relay, &qs[..taken]);
    let got = msgs_of_the_last(&mut rd, &qs, n - taken, Duration::from_secs(30));
    assert_eq!(got, n - taken, "the last queues' MSGs stalled");
}

/// Another connection GETs and ACKs the message of each of `qs`, so that their deliveries held
/// elsewhere go stale (nothing to send, and no event for the holder).
fn get_and_ack_elsewhere(relay: &Relay, qs: &[Queue]) {
    let mut other = relay.client();
    for chunk in qs.chunks(PIPELINE) {
        let gets: Vec<ClientTransmission> = chunk
            .iter()
            .map(|q| {
                ClientTransmission::new(&new_corr_id(), q.rid(), Command::Get)
                    .signed(q.key().clone())
            })
            .collect();
        other.send_batch(&gets).expect("GETs");
        let mut acks = Vec::new();
        for (t, q) in gets.iter().zip(chunk) {
            let r = other.recv_for(&t.corr_id).expect("GET answer");
            let m = support::msg_of(q, r.msg.expect("a MSG"));
            acks.push(
                ClientTransmission::new(&new_corr_id(), q.rid(), Command::Ack(m.msg_id))
                    .signed(q.key().clone()),
            );
        }
        other.send_batch(&acks).expect("ACKs");
        for t in &acks {
            let r = other.recv_for(&t.corr_id).expect("ACK answer");
            assert_eq!(r.msg, Ok(BrokerMsg::Ok), "{}", queue::describe(&r));
        }
    }
}

/// Reads without sending until the last `last` queues of `qs` each had their MSG (each once), or
/// `limit` passed; returns how many did.
fn msgs_of_the_last(rd: &mut SplitReader, qs: &[Queue], last: usize, limit: Duration) -> usize {
    let idx = index(qs);
    let first = qs.len() - last;
    let mut got: HashSet<usize> = HashSet::new();
    let read = read_all_until(rd, limit, |t| {
        if let Ok(BrokerMsg::Msg { .. }) = &t.msg {
            let i = idx[&t.entity_id];
            if i >= first {
                assert!(got.insert(i), "queue {i}: one MSG");
            }
        }
        got.len() == last
    });
    if let Err(e) = read {
        eprintln!("{} of {last} arrived: {e}", got.len());
    }
    got.len()
}

/// (d) Issue: an ACK could delete a message that was never sent. A push dropped to a marker is not
/// delivered (the reference marks a message delivered only once it is queued for sending), so an
/// ACK of its ID (learnt here through GET on another connection) is NO_MSG and the message stays,
/// to be delivered when the connection reads again.
#[test]
fn d_an_ack_of_a_dropped_delivery_deletes_nothing() {
    let relay = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: vec!["--metrics-interval".into(), "1".into()],
    });
    let (qs, mut w, mut rd) = paused_subscriber_with_drops(&relay);
    let n = qs.len();
    // The last queue's push came after the output was full: it was dropped.
    let last = &qs[n - 1];
    let mut getter = relay.client();
    let got = support::signed(&mut getter, last.key(), last.rid(), Command::Get);
    let m = support::msg_of(last, got);
    assert_eq!(m.msg.body(), Some(&body(n - 1)[..]));

    let ack = ClientTransmission::new(&new_corr_id(), last.rid(), Command::Ack(m.msg_id.clone()))
        .signed(last.key().clone());
    w.send(std::slice::from_ref(&ack)).expect("ACK");
    let idx = index(&qs);
    let mut answer = None;
    let mut delivered = false;
    let read = read_all_until(&mut rd, PHASE_LIMIT, |t| {
        if t.corr_id == ack.corr_id {
            answer = Some(t.msg.clone());
        } else if let Ok(BrokerMsg::Msg { msg_id, .. }) = &t.msg {
            if idx[&t.entity_id] == n - 1 {
                assert_eq!(msg_id, &m.msg_id, "the last queue's message");
                delivered = true;
            }
        }
        answer.is_some() && delivered
    });
    read.unwrap_or_else(|e| {
        panic!("answer {answer:?}, last queue's MSG delivered: {delivered} ({e})")
    });
    assert_eq!(
        answer,
        Some(Ok(BrokerMsg::Err(ErrorType::NoMsg))),
        "the ACK of an unsent message"
    );
}

/// (e) Issue: answers counted as unread output, so a client that reads steadily while draining a
/// backlog stayed over the bound and was closed as a slow reader. Reading at ~2 MB/s through
/// the MSGs the relay holds beyond what the sockets hold (its output is over the bound for the
/// first 2.5 MiB, ~1.3 s: longer than the 1 s slow-reader limit, which the relay looks at every
/// 10 ms here), it stays and gets everything.
#[test]
fn e_a_steady_slow_reader_is_not_closed() {
    const RATE_BYTES_PER_SEC: f64 = 2_000_000.0;
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec![
            "--slow-reader-close-secs".into(),
            "1".into(),
            "--test-slow-reader-tick-ms".into(),
            SLOW_READER_TICK_MS.into(),
            "--metrics-interval".into(),
            "1".into(),
        ],
    });
    // The reader's receive buffer is small, so that "more than the sockets hold" is the relay's
    // send buffer and 4 MiB, not also the kernel's largest receive buffer (32 MiB on some hosts):
    // the reading is paced, and every MB beyond what the scenario needs was a second of sleep.
    const RCVBUF: usize = 64 << 10;
    // The kernel doubles SO_RCVBUF for its bookkeeping.
    let sockets = tcp_mem("w")[2] + 2 * RCVBUF;
    let n = ((sockets + (7 << 19)) / BLOCK_SIZE).max(300);
    let mut setup = relay.client();
    let qs = create_many(&mut setup, n, PIPELINE);
    send_each(&mut setup, &qs, 0);
    let (mut w, mut rd) = split_connect_small(&relay, RCVBUF);
    let subs = w.blocks(&qs.iter().map(sub_t).collect::<Vec<_>>());
    let (ack_tx, ack_rx) = mpsc::channel::<Vec<ClientTransmission>>();
    let writer = std::thread::spawn(move || {
        for b in &subs {
            w.send_content(b).expect("SUB block");
        }
        for acks in ack_rx {
            w.send(&acks).expect("ACKs");
        }
    });
    let started = Instant::now();
    read_until_paced(
        &mut rd,
        &qs,
        &ack_tx,
        |t| t.soks == n && t.msgs.len() == n && t.acked == n,
        // Paced while the relay holds MSGs beyond what the sockets hold; the sockets' share is
        // then read at once (the relay's output is under its bound by then).
        Some(Pace {
            bytes_per_sec: RATE_BYTES_PER_SEC,
            bytes: (n * BLOCK_SIZE - sockets) as f64,
        }),
    );
    drop(ack_tx);
    writer.join().expect("writer");
    eprintln!(
        "{n} MSGs at {RATE_BYTES_PER_SEC} B/s in {:.1?}",
        started.elapsed()
    );
    let m = relay.metrics_until("the closes counted", |m| {
        m.contains_key("smprelay_slow_reader_closes_total")
    });
    assert_eq!(m["smprelay_slow_reader_closes_total"], 0);
}

/// Waits until the relay has read enough of the SUB blocks `(subs, blocks, wire bytes)` written
/// on `rd`'s connection that their MSG answers (a block each) exceed, by `bytes`, what the two
/// sockets hold (`/proc/net/tcp`): the rest waits in the relay for the client to read.
fn wait_until_held(
    relay: &Relay,
    rd: &SplitReader,
    (subs, blocks, wire): (usize, usize, usize),
    bytes: usize,
) {
    let client_port = rd.sock.local_addr().expect("local address").port();
    let started = Instant::now();
    loop {
        let (client_tx, client_rx) = socket_queues(client_port, relay.port);
        let (relay_tx, relay_rx) = socket_queues(relay.port, client_port);
        // Whole SUB blocks the relay took from its socket, each `subs / blocks` SUBs at least.
        let read_blocks = wire.saturating_sub(client_tx + relay_rx) * blocks / wire;
        let answered = read_blocks * (subs / blocks) * BLOCK_SIZE;
        let held = answered.saturating_sub(relay_tx + client_rx);
        if held > bytes {
            eprintln!(
                "the relay read {read_blocks} of {blocks} SUB blocks: {answered} bytes of MSGs, \
                 {} in the sockets",
                relay_tx + client_rx
            );
            return;
        }
        assert!(
            started.elapsed() < PHASE_LIMIT,
            "the relay read {read_blocks} of {blocks} SUB blocks in {PHASE_LIMIT:?}: it holds \
             {held} bytes of answers, not {bytes}"
        );
        common::sleep(Duration::from_millis(10));
    }
}

/// (f) Issue: unread answers counted against the hard limit of undroppable events, so a DEL from
/// another connection while megabytes of SUB answers waited closed the subscriber at once. Now the
/// DELD is queued, the connection stays, and everything arrives.
#[test]
fn f_deld_reaches_a_connection_with_megabytes_of_unread_answers() {
    let relay = Relay::start_with(RelayOptions {
        cores: 1,
        ..RelayOptions::default()
    });
    let n = queues_beyond_sockets(6 << 20);
    let mut setup = relay.client();
    let qs = create_many(&mut setup, n, PIPELINE);
    send_each(&mut setup, &qs, 0);
    let (mut w, mut rd) = split_connect(&relay);
    let subs = w.blocks(&qs.iter().map(sub_t).collect::<Vec<_>>());
    for b in &subs {
        w.send_content(b).expect("SUBs");
    }
    // The relay answers the SUB blocks it read and holds what the sockets do not take: wait until
    // it has read enough of them that their MSGs exceed the sockets' bytes by more than the hard
    // limit of undroppable events.
    wait_until_held(&relay, &rd, (n, subs.len(), w.sent), 5 << 20);
    let gone = &qs[0];
    assert_eq!(
        support::signed(&mut setup, gone.key(), gone.rid(), Command::Del),
        BrokerMsg::Ok
    );
    let (mut soks, mut msgs, mut deld) = (0, 0, false);
    let read = read_all_until(&mut rd, RESUME_LIMIT, |t| {
        match &t.msg {
            Ok(BrokerMsg::Sok(None)) => soks += 1,
            Ok(BrokerMsg::Msg { .. }) => msgs += 1,
            Ok(BrokerMsg::Deld) => {
                assert_eq!(t.entity_id, gone.rid());
                deld = true;
            }
            _ => panic!("unexpected {}", queue::describe(t)),
        }
        soks == n && msgs == n && deld
    });
    read.unwrap_or_else(|e| panic!("{soks} SOKs, {msgs} MSGs, DELD {deld}: {e}"));
    let ping = ClientTransmission::new(&new_corr_id(), b"", Command::Ping);
    w.send(std::slice::from_ref(&ping)).expect("PING");
    read_all_until(&mut rd, PHASE_LIMIT, |t| t.msg == Ok(BrokerMsg::Pong))
        .expect("the connection still serves");
}
