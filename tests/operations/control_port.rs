//! The control port (`[TRANSPORT] control_port`) on a running relay, as the reference's
//! (simplexmq `src/Simplex/Messaging/Server.hs`, `runCPClient`; `Server/Control.hs`): its
//! greeting, roles and answers, and `block`, `unblock`, `delete` and `status` acting on queues
//! that clients use meanwhile.

use crate::common;
use crate::support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{free_port, init, run_cli, Relay, RelayOptions, TempDir};
use smp_relay::client::new_corr_id;
use smp_relay::client::queue::{self, KeyAlg, RecipientKeys};
use smp_relay::crypto::hash::b64url;
use smp_relay::protocol::command::{Command, QueueReq};
use smp_relay::protocol::error::{BlockingInfo, BlockingReason};
use smp_relay::protocol::response::BrokerMsg;
use support::*;

const ADMIN: &str = "admin-pw";
const USER: &str = "user-pw";
const HELP: &str = "commands: stats, stats-rts, clients, sockets, socket-threads, threads, server-info, delete, save, help, quit";

/// A relay whose control port is on, with both passwords and `quota` as the daily block quota
/// (the reference's default, 20, when `None`).
fn relay_with_control(quota: Option<i64>) -> (Relay, u16) {
    relay_with_control_on(quota, RelayOptions::default())
}

fn relay_with_control_on(quota: Option<i64>, opts: RelayOptions) -> (Relay, u16) {
    let dir = TempDir::new("control").expect("a temp dir");
    init(dir.path());
    let ini = dir.path().join("smp-server.ini");
    let text = std::fs::read_to_string(&ini).expect("read the ini");
    let port = free_port();
    let mut auth = format!(
        "[AUTH]\ncontrol_port_admin_password = {ADMIN}\ncontrol_port_user_password = {USER}\n"
    );
    if let Some(q) = quota {
        auth.push_str(&format!("daily_block_queue_quota = {q}\n"));
    }
    let text = text.replacen("[AUTH]\n", &auth, 1).replacen(
        "[TRANSPORT]\n",
        &format!("[TRANSPORT]\ncontrol_port = {port}\n"),
        1,
    );
    std::fs::write(&ini, text).expect("write the ini");
    (Relay::start_in(dir, opts), port)
}

/// A control port connection.
struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Control {
    /// Connects and reads the greeting, which must be the reference's.
    fn open(port: u16) -> Control {
        let mut c = Control::raw(port);
        assert_eq!(c.line(), "SMP server control port");
        assert_eq!(c.line(), "'help' for supported commands");
        c
    }

    fn raw(port: u16) -> Control {
        let w = TcpStream::connect(("127.0.0.1", port)).expect("connect to the control port");
        w.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let r = BufReader::new(w.try_clone().expect("clone"));
        Control { r, w }
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.r.read_line(&mut s).expect("read a line");
        assert!(s.ends_with('\n'), "a whole line, got {s:?}");
        s.trim_end_matches('\n').to_string()
    }

    /// The lines `cmd` is answered with: `help` is sent after it, and its answer ends them.
    fn ask(&mut self, cmd: &str) -> Vec<String> {
        write!(self.w, "{cmd}\nhelp\n").expect("write");
        let mut lines = Vec::new();
        loop {
            let l = self.line();
            if l == HELP {
                return lines;
            }
            lines.push(l);
        }
    }

    /// The one line `cmd` is answered with.
    fn one(&mut self, cmd: &str) -> String {
        let lines = self.ask(cmd);
        assert_eq!(lines.len(), 1, "{cmd}: {lines:?}");
        lines.into_iter().next().unwrap()
    }

    fn auth(port: u16, password: &str) -> Control {
        let mut c = Control::open(port);
        let role = if password == ADMIN {
            "CPRAdmin"
        } else {
            "CPRUser"
        };
        assert_eq!(
            c.one(&format!("auth {password}")),
            format!("Current role is {role}")
        );
        c
    }

    /// True when the relay closed the connection (EOF).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0))
    }
}

/// The value of a `stats` line `name: value`.
fn stat(lines: &[String], name: &str) -> String {
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("no {name} in {lines:?}"))
        .to_string()
}

#[test]
fn roles_commands_and_answers() {
    let (relay, port) = relay_with_control(None);
    let mut rc = relay.client();
    let _q = create(&mut rc);

    // No role: help, the empty line, stats-rts and auth only.
    let mut none = Control::open(port);
    assert_eq!(none.ask(""), Vec::<String>::new(), "the empty line");
    assert_eq!(
        none.one("hello"),
        "error: Failed reading: bad ControlProtocol command"
    );
    assert_eq!(none.one("stats now"), "error: endOfInput");
    assert_eq!(none.one("delete"), "error: space: not enough input");
    assert!(
        none.ask("stats-rts")
            .iter()
            .any(|l| l.starts_with("uptime_secs: ")),
        "stats-rts needs no role"
    );
    for cmd in [
        "stats",
        "clients",
        "sockets",
        "socket-threads",
        "threads",
        "server-info",
        "suspend",
        "resume",
        "save",
        "status AAAA",
        "delete AAAA",
        "block AAAA reason=spam",
        "unblock AAAA",
    ] {
        assert_eq!(none.one(cmd), "AUTH", "{cmd} without a role");
    }
    assert_eq!(none.one("auth wrong"), "Current role is CPRNone");
    assert_eq!(none.one("stats"), "AUTH", "a wrong password gives no role");
    // Still no role: the next auth sets it.
    assert_eq!(none.one(&format!("auth {USER}")), "Current role is CPRUser");

    // User: stats, sockets, server-info, status, block, unblock; not the admin's commands.
    let mut user = Control::auth(port, USER);
    let stats = user.ask("stats");
    assert_eq!(stat(&stats, "qCreated"), "1");
    assert_eq!(stat(&stats, "qCount"), "1");
    assert!(stats[0].starts_with("fromTime: "), "{stats:?}");
    assert!(
        !stats.iter().any(|l| l.starts_with("ntfCount 2:")),
        "the admin's line: {stats:?}"
    );
    assert!(stats.iter().any(|l| l.starts_with("pRelays: requests=")));
    let sockets = user.ask("sockets");
    assert!(sockets[0].starts_with("Sockets for port "), "{sockets:?}");
    assert_eq!(
        sockets[3], "active: 1",
        "the client connection: {sockets:?}"
    );
    let info = user.ask("server-info");
    assert!(info[0].starts_with("Threads: "), "{info:?}");
    assert_eq!(info[1], "Clients: 1");
    assert!(
        info.contains(&"SMP subscriptions: 1".to_string()),
        "{info:?}"
    );
    for cmd in [
        "clients",
        "threads",
        "socket-threads",
        "suspend",
        "save",
        "delete AAAA",
    ] {
        assert_eq!(user.one(cmd), "AUTH", "{cmd} as user");
    }
    // A second auth cannot change the role.
    assert_eq!(
        user.one(&format!("auth {ADMIN}")),
        "Current role is CPRUser, start new session to change."
    );
    assert_eq!(user.one("clients"), "AUTH");
    assert_eq!(user.one(&format!("auth {USER}")), "Current role is CPRUser");

    // Admin: everything.
    let mut admin = Control::auth(port, ADMIN);
    assert_eq!(admin.one("suspend"), "suspend not implemented");
    assert_eq!(admin.one("resume"), "resume not implemented");
    let clients = admin.ask("clients");
    assert_eq!(
        clients[0],
        "clientId,sessionId,connected,createdAt,rcvActiveAt,sndActiveAt,age,subscriptions"
    );
    assert_eq!(clients.len(), 2, "one client: {clients:?}");
    let fields: Vec<&str> = clients[1].split(',').collect();
    assert_eq!(fields.len(), 8, "{clients:?}");
    assert_eq!(fields[2], "True");
    assert_eq!(fields[7], "1", "its subscription (NEW subscribes)");
    let threads = admin.ask("threads");
    let n: usize = threads[0]
        .strip_prefix("Threads: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{threads:?}"));
    assert_eq!(threads.len(), n + 1, "one line per thread");
    assert_eq!(admin.ask("socket-threads").len(), 1, "one connection");
    let info = admin.ask("server-info");
    assert!(
        info.contains(&"SMP subscriptions (via clients): 1".to_string()),
        "{info:?}"
    );
    assert_eq!(
        admin.ask("save"),
        ["saving server state...", "server state saved!"]
    );

    // quit closes the connection; the others stay.
    writeln!(admin.w, "quit").unwrap();
    assert!(admin.closed(), "quit closes");
    assert!(
        !user.ask("stats-rts").is_empty(),
        "the user's connection still serves"
    );
    drop(rc);
}

#[test]
fn block_unblock_delete_and_status_on_a_running_relay() {
    // Two shards: the port runs on shard 0, and the queues' owners are either.
    let opts = RelayOptions {
        cores: 2,
        extra_args: vec!["--metrics-interval".into(), "3600".into()],
    };
    let (mut relay, port) = relay_with_control_on(None, opts);
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let sender = queue::auth_key(KeyAlg::Ed25519);
    // NEW subscribes `rc` to the queue; one that shard 1 owns, so that the block crosses shards.
    let q = loop {
        let q = create_secured(&mut rc, &sender);
        if smp_relay::server::router::owner_shard(q.rid(), 2) == 1 {
            break q;
        }
    };
    let sid = b64url(q.sid());
    let mut user = Control::auth(port, USER);

    let status = user.one(&format!("status {sid}"));
    let today = now_secs() / 86400 * 86400;
    assert_eq!(
        status,
        format!("status: EntityActive, updatedAt: Just (RoundedSystemTime {{roundedSeconds = {today}}}), queueMode: Just QMMessaging")
    );
    assert_eq!(user.one("status AAAAAAAA"), "error: AUTH", "no such queue");

    // Block: the subscriber is told at once, and every command is refused.
    let shown = "EntityBlocked (BlockingInfo {reason = BRSpam, notice = Just (ClientNotice {ttl = Just 3600})})";
    assert_eq!(
        user.one(&format!("block {sid} reason=spam,notice={{\"ttl\": 3600}}")),
        format!("ok, queue blocked: {shown}")
    );
    let info = BlockingInfo {
        reason: BlockingReason::Spam,
        notice: Some("{\"ttl\":3600}".into()),
    };
    let blocked = BrokerMsg::Err(ErrorType::Blocked(info));
    expect_event(&mut rc, q.rid(), blocked.clone());
    assert_eq!(send(&mut sc, &q, Some(&sender), b"hi"), blocked);
    assert_eq!(signed(&mut rc, q.key(), q.rid(), Command::Sub), blocked);
    assert_eq!(
        user.one(&format!("block {sid} reason=spam,notice={{\"ttl\":3600}}")),
        format!("ok, already inactive: {shown}"),
        "the same block again"
    );
    // One queue blocked (`qBlocked`), the second block changed nothing.
    relay.metrics_until("the blocked queue counted once", |m| {
        m.get("simplex_smp_queues_blocked") == Some(&1)
    });
    assert!(user
        .one(&format!("status {sid}"))
        .starts_with(&format!("status: {shown}, updatedAt: Just")),);

    // It persists: a restart keeps the block.
    drop((rc, sc));
    relay.stop();
    relay.restart();
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let mut user = Control::auth(port, USER);
    assert!(user
        .one(&format!("status {sid}"))
        .starts_with(&format!("status: {shown}")));
    assert_eq!(send(&mut sc, &q, Some(&sender), b"hi"), blocked);

    // Unblock restores the queue.
    assert_eq!(
        user.one(&format!("unblock {sid}")),
        "ok, queue unblocked, reason to block was: BlockingInfo {reason = BRSpam, notice = Just (ClientNotice {ttl = Just 3600})}"
    );
    assert_eq!(user.one(&format!("unblock {sid}")), "ok, queue was active");
    send_ok(&mut sc, &q, Some(&sender), b"after unblock");
    let m = sub_with_msg(&mut rc, &q);
    assert_eq!(m.msg.body(), Some(&b"after unblock"[..]));

    // A queue its recipient turned off cannot be unblocked.
    let off = create(&mut rc);
    assert_eq!(
        signed(&mut rc, off.key(), off.rid(), Command::Off),
        BrokerMsg::Ok
    );
    assert_eq!(
        user.one(&format!("unblock {}", b64url(off.sid()))),
        "error, queue is inactive"
    );

    // A contact address is found by its link ID too.
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let lnk_id = new_corr_id().to_vec();
    let corr = new_corr_id();
    let link = queue::new_link(&corr, b"fixed", b"user");
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(Some((lnk_id.clone(), link))));
    let contact = create_with_corr(&mut rc, keys, new, &corr);
    let status = user.one(&format!("status {}", b64url(&lnk_id)));
    assert!(
        status.starts_with("status: EntityActive") && status.ends_with("queueMode: Just QMContact"),
        "{status}"
    );
    assert!(user
        .one(&format!("block {} reason=content", b64url(&lnk_id)))
        .starts_with("ok, queue blocked: EntityBlocked (BlockingInfo {reason = BRContent, notice = Nothing})"));
    assert_eq!(
        unsigned(&mut sc, contact.sid(), send_cmd(b"x")),
        BrokerMsg::Err(ErrorType::Blocked(BlockingInfo {
            reason: BlockingReason::Content,
            notice: None
        }))
    );

    // Delete (admin only): the queue and its messages go, and the recipient gets AUTH after.
    let full = create(&mut sc);
    for body in [&b"one"[..], b"two"] {
        send_ok(&mut rc, &full, None, body);
    }
    let mut admin = Control::auth(port, ADMIN);
    assert_eq!(
        admin.one(&format!("delete {}", b64url(full.sid()))),
        "ok, 2 messages deleted"
    );
    assert_eq!(
        signed(&mut sc, full.key(), full.rid(), Command::Sub),
        ERR_AUTH
    );
    assert_eq!(send(&mut rc, &full, None, b"three"), ERR_AUTH);
    assert_eq!(
        user.one(&format!("status {}", b64url(full.sid()))),
        "error: AUTH"
    );
    assert_eq!(
        admin.one(&format!("delete {}", b64url(full.sid()))),
        "error: AUTH"
    );
    let stats = admin.ask("stats");
    assert_eq!(stat(&stats, "qDeletedAll"), "1");
    assert_eq!(stat(&stats, "ntfCount 2"), stat(&stats, "ntfCount"));
}

#[test]
fn the_daily_block_quota_counts_per_utc_day() {
    let (relay, port) = relay_with_control(Some(1));
    let mut c = relay.client();
    let (a, b) = (create(&mut c), create(&mut c));
    let mut user = Control::auth(port, USER);
    // Only blocks of active queues count.
    assert_eq!(user.one("block AAAAAAAA reason=spam"), "error: AUTH");
    assert!(user
        .one(&format!("block {} reason=spam", b64url(a.sid())))
        .starts_with("ok, queue blocked: "));
    assert_eq!(
        user.one(&format!("block {} reason=spam", b64url(b.sid()))),
        "error: reached limit of 1 queues blocked daily"
    );
    assert!(user
        .one(&format!("status {}", b64url(b.sid())))
        .starts_with("status: EntityActive"));
    // A new UTC day starts the count again.
    relay.advance_clock(86400);
    assert!(user
        .one(&format!("block {} reason=spam", b64url(b.sid())))
        .starts_with("ok, queue blocked: "));

    // -1: no blocking at all.
    let (relay, port) = relay_with_control(Some(-1));
    let mut c = relay.client();
    let q = create(&mut c);
    let mut user = Control::auth(port, USER);
    assert_eq!(
        user.one(&format!("block {} reason=spam", b64url(q.sid()))),
        "error: reached limit of -1 queues blocked daily"
    );
}

#[test]
fn bounded_lines_and_connections_on_loopback_only() {
    let (_relay, port) = relay_with_control(None);
    let mut other = Control::open(port);

    // An over-long line ends its own connection with a clear answer, and no other.
    let mut long = Control::open(port);
    long.w.write_all(&vec![b'a'; 5000]).unwrap();
    let answer = long.line();
    assert!(
        answer.starts_with("error: a line may be at most 4096 bytes"),
        "{answer}"
    );
    assert!(long.closed());
    assert_eq!(other.ask("help"), Vec::<String>::new());

    // A last line without its line end is answered before the connection ends.
    let mut last = Control::open(port);
    write!(last.w, "auth {USER}\nsockets").unwrap();
    last.w.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = String::new();
    last.r.read_to_string(&mut rest).unwrap();
    assert!(
        rest.starts_with("Current role is CPRUser\nSockets for port "),
        "{rest}"
    );

    // At most 8 connections at once: the next is told so and closed.
    let mut open: Vec<Control> = (0..7).map(|_| Control::open(port)).collect();
    let mut refused = Control::raw(port);
    assert_eq!(
        refused.line(),
        "error: 8 control port connections are open; close one"
    );
    assert!(refused.closed());
    assert_eq!(
        open[6].ask(""),
        Vec::<String>::new(),
        "the others still serve"
    );
    assert_eq!(other.ask(""), Vec::<String>::new());

    // 127.0.0.1 only: another loopback address finds no listener.
    let elsewhere: SocketAddr = ([127, 0, 0, 2], port).into();
    assert!(
        TcpStream::connect_timeout(&elsewhere, Duration::from_secs(2)).is_err(),
        "the control port must listen on 127.0.0.1 only"
    );
    open.clear();
}

/// `init --control-port PORT` turns the port on with two new passwords, as the reference's `init`.
#[test]
fn init_with_control_port_writes_its_passwords() {
    let dir = TempDir::new("control-init").expect("a temp dir");
    let port = free_port();
    let out = run_cli(
        dir.path(),
        &["init", "--no-password", "--control-port", &port.to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ini = std::fs::read_to_string(dir.path().join("smp-server.ini")).unwrap();
    let value = |key: &str| {
        ini.lines()
            .find_map(|l| l.strip_prefix(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in\n{ini}"))
            .to_string()
    };
    assert_eq!(value("control_port"), port.to_string());
    let (admin, user) = (
        value("control_port_admin_password"),
        value("control_port_user_password"),
    );
    assert_eq!(admin.len(), 24, "18 random bytes, base64url");
    assert_ne!(admin, user);
    // It says where the passwords are, without printing them.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let ini_path = dir.path().join("smp-server.ini");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains(&format!("127.0.0.1:{port}"))
                && l.contains("passwords are in")
                && l.contains(ini_path.to_str().unwrap())),
        "init names the control port and the file with its passwords:\n{stdout}"
    );
    assert!(
        !stdout.contains(&admin) && !stdout.contains(&user),
        "the passwords are not printed:\n{stdout}"
    );
    let _relay = Relay::start_in(dir, RelayOptions::default());
    let mut c = Control::open(port);
    assert_eq!(c.one(&format!("auth {admin}")), "Current role is CPRAdmin");
    let mut c = Control::open(port);
    assert_eq!(c.one(&format!("auth {user}")), "Current role is CPRUser");
}

/// `save` on the memory store writes its files while the relay runs: a relay killed afterwards
/// comes back with the messages that were saved, and without those sent after the save; queue
/// changes are kept either way (the queue log).
#[test]
fn save_writes_the_memory_store_without_stopping() {
    let opts = RelayOptions {
        extra_args: vec!["--store".into(), "memory".into()],
        ..RelayOptions::default()
    };
    let (mut relay, port) = relay_with_control_on(None, opts);
    let mut c = relay.client();
    let saved = create(&mut c);
    send_ok(&mut c, &saved, None, b"kept");
    let mut admin = Control::auth(port, ADMIN);
    assert_eq!(
        admin.ask("save"),
        ["saving server state...", "server state saved!"]
    );
    let unsaved = create(&mut c);
    send_ok(&mut c, &saved, None, b"after the save");
    relay.kill();
    relay.restart();
    let mut user = Control::auth(port, USER);
    assert!(
        user.one(&format!("status {}", b64url(saved.sid())))
            .starts_with("status: EntityActive"),
        "the saved queue is back"
    );
    assert!(
        user.one(&format!("status {}", b64url(unsaved.sid())))
            .starts_with("status: EntityActive"),
        "a queue made after the save is kept by the queue log"
    );
    let mut c = relay.client();
    let m = sub_with_msg(&mut c, &saved);
    assert_eq!(m.msg.body(), Some(&b"kept"[..]));
    assert_eq!(
        ack(&mut c, &saved, &m.msg_id),
        BrokerMsg::Ok,
        "a message sent after the save is not back (messages are saved, not logged)"
    );
}

/// A block that lands while a sender sends takes its turn among the queue's commands: the
/// sender's answers are OKs and then only BLOCKED, and once unblocked the recipient receives
/// exactly the messages answered OK, in order.
#[test]
fn a_block_amid_sends_splits_them_cleanly() {
    let opts = RelayOptions {
        cores: 2,
        extra_args: vec!["--quota".into(), "4096".into()],
    };
    let (relay, port) = relay_with_control_on(None, opts);
    let mut rc = relay.client();
    let sender = queue::auth_key(KeyAlg::Ed25519);
    let q = create_secured(&mut rc, &sender);
    let sid = b64url(q.sid());
    let mut sc = relay.client();
    let flood = {
        let (q_sid, key) = (q.sid().to_vec(), sender.clone());
        std::thread::spawn(move || {
            let mut answered_ok = Vec::new();
            for i in 0..4096u32 {
                let body = i.to_string();
                match send_as(&mut sc, &q_sid, Some(&key), send_cmd(body.as_bytes())) {
                    BrokerMsg::Ok => answered_ok.push(body.into_bytes()),
                    BrokerMsg::Err(ErrorType::Blocked(_)) => {
                        // Once blocked, every later SEND is refused too.
                        for _ in 0..5 {
                            let again = send_as(&mut sc, &q_sid, Some(&key), send_cmd(b"late"));
                            assert!(
                                matches!(again, BrokerMsg::Err(ErrorType::Blocked(_))),
                                "{again:?}"
                            );
                        }
                        return answered_ok;
                    }
                    other => panic!("SEND {i}: {other:?}"),
                }
            }
            panic!("the block did not reach the queue within 4096 sends");
        })
    };
    let mut user = Control::auth(port, USER);
    assert!(user
        .one(&format!("block {sid} reason=spam"))
        .starts_with("ok, queue blocked: "));
    let sent = flood.join().expect("the sender's thread");
    assert!(user
        .one(&format!("unblock {sid}"))
        .starts_with("ok, queue unblocked"));

    // A new subscriber takes the queue over and reads it to the end.
    let mut reader = relay.client();
    let mut got = Vec::new();
    if !sent.is_empty() {
        let mut m = sub_with_msg(&mut reader, &q);
        loop {
            got.push(m.msg.body().expect("a message").to_vec());
            match ack(&mut reader, &q, &m.msg_id) {
                BrokerMsg::Ok => break,
                r => m = msg_of(&q, r),
            }
        }
    }
    assert_eq!(
        got.len(),
        sent.len(),
        "every message answered OK, none other"
    );
    assert_eq!(got, sent, "in the order answered");
    drop(rc);
}

/// Commands of a connection without a role are logged through the log limiter: a local process
/// that sends thousands of them writes a line or two per interval, not two lines each (the
/// reference's `ControlPort: …` warning and `Unauthorized control port command` error), and the
/// lines held back are counted.
#[test]
fn a_flood_of_unauthorized_commands_writes_a_bounded_number_of_lines() {
    const COMMANDS: u64 = 5000;
    // One line per 100 ms instead of a second (a hidden test flag), so that the count of the last
    // interval is written a tenth of a second after the flood.
    const INTERVAL_MS: u64 = 100;
    let opts = RelayOptions {
        extra_args: vec!["--test-warning-interval-ms".into(), INTERVAL_MS.to_string()],
        ..RelayOptions::default()
    };
    let (relay, port) = relay_with_control_on(None, opts);
    let started = std::time::Instant::now();
    let mut c = Control::open(port);
    let writer = {
        let mut w = c.w.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..COMMANDS {
                w.write_all(b"stats\n").unwrap();
            }
        })
    };
    for i in 0..COMMANDS {
        assert_eq!(c.line(), "AUTH", "answer {i}");
    }
    writer.join().unwrap();
    let counted = |what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (lines, counted) = relay.warnings(what);
            if counted >= COMMANDS || std::time::Instant::now() > deadline {
                return (lines as u64, counted);
            }
            common::sleep(Duration::from_millis(20));
        }
    };
    let (command_lines, commands) = counted("ControlPort: ");
    let (refusal_lines, refusals) = counted("Unauthorized control port command");
    let elapsed = started.elapsed();
    let intervals = elapsed.as_millis() as u64 / INTERVAL_MS;
    assert_eq!(commands, COMMANDS, "every command is accounted for");
    assert_eq!(refusals, COMMANDS, "every refusal is accounted for");
    // One line an interval, and one for the count of the last.
    for (what, lines) in [("command", command_lines), ("refusal", refusal_lines)] {
        assert!(
            lines <= intervals + 2,
            "{lines} {what} lines for {COMMANDS} commands in {elapsed:?}"
        );
    }
    // An operator's commands are logged each.
    let mut admin = Control::auth(port, ADMIN);
    admin.ask("sockets");
    assert!(relay.log_shows("ControlPort: \"sockets\""));
}

/// On PostgreSQL the directory caches IDs and a start holds none (`docs/ARCHITECTURE.md` §1): the
/// control port finds a queue by a sender ID it does not hold in the database, and blocks it.
#[test]
fn on_postgres_a_queue_is_found_by_an_id_the_directory_does_not_hold() {
    let conninfo = common::pg_database();
    let opts = RelayOptions {
        cores: 2,
        extra_args: ["--store", "postgres", "--database", &conninfo]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    let (mut relay, port) = relay_with_control_on(None, opts);
    let mut rc = relay.client();
    let sender = queue::auth_key(KeyAlg::Ed25519);
    let q = create_secured(&mut rc, &sender);
    drop(rc);
    assert!(relay.stop().success(), "a clean stop");
    relay.restart();
    let sid = b64url(q.sid());
    let mut user = Control::auth(port, USER);
    let today = now_secs() / 86400 * 86400;
    assert_eq!(
        user.one(&format!("status {sid}")),
        format!("status: EntityActive, updatedAt: Just (RoundedSystemTime {{roundedSeconds = {today}}}), queueMode: Just QMMessaging")
    );
    assert_eq!(user.one("status AAAAAAAA"), "error: AUTH", "no such queue");
    assert_eq!(
        user.one(&format!("block {sid} reason=spam")),
        "ok, queue blocked: EntityBlocked (BlockingInfo {reason = BRSpam, notice = Nothing})"
    );
    let mut sc = relay.client();
    let blocked = BrokerMsg::Err(ErrorType::Blocked(BlockingInfo {
        reason: BlockingReason::Spam,
        notice: None,
    }));
    assert_eq!(send(&mut sc, &q, Some(&sender), b"hi"), blocked);
}
