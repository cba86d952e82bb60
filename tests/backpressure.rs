//! Back-pressure (`DESIGN.md` §1): a connection that stops reading costs the relay a bounded amount
//! of memory and stalls nobody else; when it reads again, every message arrives exactly once; and a
//! pause past the slow-reader limit closes it without losing a message.
//!
//! The crate's `Client` reads and writes from one thread, so a connection that writes while nobody
//! reads would block the test itself. `Split` below is the same client protocol (TLS with the
//! client's tls-unique, SMP handshake, encrypted blocks) with the two directions on two threads:
//! the TLS state sits behind a mutex that is never held across a socket call.

mod common;
mod support;

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
const STALL: Duration = Duration::from_millis(1500);
/// Bound on waiting for any one phase.
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// Bound on receiving everything once the paused reader resumes. The relay hands the messages it
/// dropped to markers back 64 at a time (`REDELIVER_BATCH`) as the output drains; on a loaded
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
/// The slow-reader limit the close test starts the relay with.
const SLOW_READER_CLOSE_SECS: u64 = 3;

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
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |addr: &str| {
        addr.split(':')
            .nth(1)
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (port(f[1]) == Some(relay_port) && port(f[2]) == Some(client_port)).then(|| {
                let rx = f[4].split(':').nth(1).unwrap_or("0");
                usize::from_str_radix(rx, 16).unwrap_or(0)
            })
        })
        .expect("the relay's socket of the paused connection")
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
    let mut sock = TcpStream::connect(relay.addr).expect("connect");
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
        self.sock.write_all(&wire)
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
    let idx = index(qs);
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
        let block = match rd.recv_block() {
            Ok(b) => b,
            Err(ReadError::Timeout) => continue,
            Err(e) => panic!("the resumed connection failed: {e:?}"),
        };
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
        std::thread::sleep(Duration::from_millis(100));
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
    send_each(&mut other, &others, QUEUES);
    let mut got = HashSet::new();
    let oidx = index(&others);
    while got.len() < OTHER_SENDS {
        let t = other_rcv.recv().expect("MSG to the other subscriber");
        let i = *oidx.get(&t.entity_id).expect("one of the other queues");
        let m = queue::receive(&others[i].secret, &t).expect("MSG decrypts");
        assert_eq!(m.msg.body(), Some(&body(QUEUES + i)[..]));
        assert!(got.insert(i), "other queue {i}: one MSG");
    }

    let peak_kb = (0..10)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            relay.rss_anon_kb()
        })
        .max()
        .unwrap_or(0);
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
    // The pause: the limit, the watchdog's 1 s tick, and a margin.
    std::thread::sleep(Duration::from_secs(SLOW_READER_CLOSE_SECS + 3));
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
    for chunk in qs.chunks(PIPELINE) {
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
