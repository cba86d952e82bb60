//! The journal store when it cannot grow (`docs/ARCHITECTURE.md` §5, `journal/FORMAT.md`,
//! "Space"): a relay whose data directory is a size-limited tmpfs filled to the last byte, and one
//! under `--journal-max-size` at its smallest. Every group's segment is filled with SENDs until
//! SEND answers `ERR STORE`; then NEW answers `ERR STORE` too, while ACK, DEL and KEY (records
//! that go into each segment's reserve) answer OK, another connection is served, and the relay
//! keeps running. When space returns SEND works again, and after a restart every message answered
//! OK, and only those, is delivered in order. And `init` and `start` on a full disk fail with the
//! reason, leaving nothing half done.

use crate::common;
use crate::support;

use std::path::{Path, PathBuf};

use common::{Relay, RelayOptions, TempDir};
use smp_relay::client::queue::{auth_key, KeyAlg, RecipientKeys};
use smp_relay::client::{new_corr_id, Client, ClientTransmission, Signer};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::store::journal::{NO_SPACE, SIZE_CAP};
use smp_relay::store::{group_of, PARTITION_GROUPS};
use support::*;

/// Body sizes a group's segment is filled with, largest first, so that what is left before its
/// reserve is less than the smallest message record, and so less than any queue record.
const FILL_SIZES: [usize; 4] = [8000, 1000, 100, 10];
/// SENDs of one size before one must have been refused (a first segment holds 28 of 8000 bytes).
const MAX_SENDS_PER_SIZE: usize = 64;
/// NEWs pipelined at a time while creating a queue in every group.
const NEW_BATCH: usize = 32;
/// A tmpfs that holds a new relay (64 first segments of 256 KiB, the keys and certificates) and
/// 4 MiB more.
const TMPFS_BYTES: u64 = 20 << 20;

/// A size-limited tmpfs mounted on a directory, unmounted (lazily) when dropped; drop it after the
/// relay that uses it.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None`, after saying so, when this process may not mount (not root): the test is skipped.
    fn mount(dir: &Path, size_bytes: u64) -> Option<Tmpfs> {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let target = CString::new(dir.as_os_str().as_bytes()).expect("a path without NUL");
        let data = CString::new(format!("size={size_bytes}")).expect("no NUL");
        // SAFETY: mount(2) with NUL-terminated strings that live for the call.
        let r = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs here ({e}); run as root to test a full disk"
                );
                return None;
            }
            panic!("mount a tmpfs on {}: {e}", dir.display());
        }
        Some(Tmpfs(dir.to_path_buf()))
    }

    /// Writes `name` until the file system is full; returns its size.
    fn fill(&self, name: &str) -> u64 {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join(name)).expect("create the filler");
        let chunk = vec![0x55u8; 64 << 10];
        let mut n = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => return n,
                Ok(k) => n += k as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return n,
                Err(e) => panic!("filling {name}: {e}"),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        if let Ok(target) = CString::new(self.0.as_os_str().as_bytes()) {
            // SAFETY: umount2(2) with a NUL-terminated string that lives for the call.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One queue in each partition group, with the bodies its SENDs were answered OK for, in order.
struct Groups {
    queues: Vec<Queue>,
    ok: Vec<Vec<Vec<u8>>>,
    /// The sender key of a queue secured with KEY.
    sender: Vec<Option<Signer>>,
    next_seq: u64,
}

impl Groups {
    /// Creates queues until every group has one.
    fn create(c: &mut Client) -> Groups {
        let mut by_group: Vec<Option<Queue>> = vec![None; PARTITION_GROUPS as usize];
        while by_group.iter().any(Option::is_none) {
            for q in create_many(c, NEW_BATCH, NEW_BATCH) {
                let g = group_of(q.rid()) as usize;
                if by_group[g].is_none() {
                    by_group[g] = Some(q);
                }
            }
        }
        let queues: Vec<Queue> = by_group.into_iter().map(Option::unwrap).collect();
        Groups {
            ok: vec![Vec::new(); queues.len()],
            sender: vec![None; queues.len()],
            queues,
            next_seq: 0,
        }
    }

    /// A body of `size` bytes that names its group and sequence number.
    fn body(&mut self, g: usize, size: usize) -> Vec<u8> {
        self.next_seq += 1;
        let mut b = format!("g{g:02}s{:06}", self.next_seq).into_bytes();
        assert!(b.len() <= size, "a body of {size} bytes holds its name");
        b.resize(size, b'.');
        b
    }

    /// One SEND to group `g`'s queue; an OK goes in the ledger.
    fn send(&mut self, c: &mut Client, g: usize, size: usize) -> BrokerMsg {
        let body = self.body(g, size);
        let r = send(c, &self.queues[g], self.sender[g].as_ref(), &body);
        if r == BrokerMsg::Ok {
            self.ok[g].push(body);
        }
        r
    }

    /// Fills group `g`'s segment: SENDs of each of `FILL_SIZES` until one is refused with
    /// `ERR STORE <refused>`. Returns the SENDs answered OK.
    fn fill(&mut self, c: &mut Client, g: usize, refused: &str) -> usize {
        let mut oks = 0;
        for size in FILL_SIZES {
            let mut n = 0;
            loop {
                match self.send(c, g, size) {
                    BrokerMsg::Ok => oks += 1,
                    BrokerMsg::Err(ErrorType::Store(e)) => {
                        assert_eq!(e, refused, "group {g}: the refusal says why");
                        break;
                    }
                    other => panic!("group {g}: SEND of {size} bytes answered {other:?}"),
                }
                n += 1;
                assert!(n < MAX_SENDS_PER_SIZE, "group {g}: SENDs never refused");
            }
        }
        oks
    }
}

/// NEW, expecting `ERR STORE <refused>`.
fn new_refused(c: &mut Client, refused: &str) {
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let new = smp_relay::client::queue::new_queue(&keys);
    let corr = new_corr_id();
    let t = ClientTransmission::new(&corr, b"", Command::New(new)).signed(keys.auth.clone());
    c.send_batch(&[t]).expect("send NEW");
    let r = c.recv_for(&corr).expect("NEW answer");
    assert_eq!(
        r.msg,
        Ok(BrokerMsg::Err(ErrorType::Store(refused.into()))),
        "NEW on a full journal"
    );
}

/// Every message of `q`, by GET and ACK (each ACK answered OK) until GET finds none.
fn drain(c: &mut Client, q: &Queue) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        match signed(c, q.key(), q.rid(), Command::Get) {
            BrokerMsg::Ok => return out,
            m @ BrokerMsg::Msg { .. } => {
                let rm = msg_of(q, m);
                out.push(rm.msg.body().expect("a message").to_vec());
                assert_eq!(ack(c, q, &rm.msg_id), BrokerMsg::Ok, "ACK after GET");
            }
            other => panic!("GET answered {other:?}"),
        }
    }
}

/// The groups the scenario treats apart: `A` is read on another connection while the journal
/// is full, `D` deleted, `K` secured with KEY; `E` only gets SENDs again after the recovery.
const A: usize = 0;
const D: usize = 1;
const K: usize = 2;
const E: usize = 3;

/// While the journal cannot grow: every group filled until SEND is refused, NEW refused, and
/// ACK (all of group A's messages, on a second connection that subscribes), DEL and KEY answered
/// OK. The relay keeps running and says why in its log.
fn while_full(relay: &mut Relay, gs: &mut Groups, refused: &str) {
    let mut c = relay.client();
    for g in 0..gs.queues.len() {
        assert!(
            gs.fill(&mut c, g, refused) > 0,
            "group {g} took messages until it was full"
        );
    }
    for _ in 0..3 {
        new_refused(&mut c, refused);
    }

    // Another connection subscribes and takes group A's messages: every ACK goes in the reserve.
    let mut c2 = relay.client();
    let qa = gs.queues[A].clone();
    let want = std::mem::take(&mut gs.ok[A]);
    assert!(!want.is_empty(), "group A got messages before it was full");
    // ACK answers with the next message while there is one, then OK.
    let mut m = sub_with_msg(&mut c2, &qa);
    for (i, body) in want.iter().enumerate() {
        assert!(m.msg.body() == Some(&body[..]), "message {i} of group A");
        match ack(&mut c2, &qa, &m.msg_id) {
            next @ BrokerMsg::Msg { .. } if i + 1 < want.len() => m = msg_of(&qa, next),
            BrokerMsg::Ok if i + 1 == want.len() => {}
            BrokerMsg::Msg { .. } => panic!("ACK {i}: a message after the last one"),
            other => panic!("ACK {i} on a full journal answered {other:?}"),
        }
    }
    // SEND to the emptied queue is still refused: the reserve is for deletes only.
    let body = gs.body(A, 10);
    assert_eq!(
        send(&mut c, &qa, None, &body),
        BrokerMsg::Err(ErrorType::Store(refused.into()))
    );

    // DEL of a queue with messages, and KEY, answer OK.
    let qd = gs.queues[D].clone();
    assert_eq!(
        signed(&mut c, qd.key(), qd.rid(), Command::Del),
        BrokerMsg::Ok,
        "DEL on a full journal"
    );
    gs.ok[D].clear();
    assert_eq!(send(&mut c, &qd, None, b"deleted"), ERR_AUTH);
    let sender = auth_key(KeyAlg::Ed25519);
    let qk = gs.queues[K].clone();
    assert_eq!(
        signed(
            &mut c,
            qk.key(),
            qk.rid(),
            Command::Key(sender.public_key())
        ),
        BrokerMsg::Ok,
        "KEY on a full journal"
    );
    gs.sender[K] = Some(sender);

    relay.assert_serves();
    assert!(relay.is_running(), "no crash:\n{}", relay.log_text());
    let log = relay.log_text();
    assert!(
        log.contains("the journal cannot grow") && !log.contains("panicked"),
        "the operator is told, nothing panicked:\n{log}"
    );
}

/// With room again: SENDs to groups A, K (signed with its sender key) and E answer OK.
fn sends_work_again(relay: &Relay, gs: &mut Groups) {
    let mut c = relay.client();
    for g in [A, K, E] {
        for size in [8000, 10] {
            assert_eq!(
                gs.send(&mut c, g, size),
                BrokerMsg::Ok,
                "group {g} after recovery"
            );
        }
    }
}

/// After a restart every message answered OK is there, in order, and nothing else.
fn all_delivered(relay: &Relay, gs: &Groups) {
    let mut c = relay.client();
    for (g, q) in gs.queues.iter().enumerate() {
        if g == D {
            continue;
        }
        let got = drain(&mut c, q);
        assert_eq!(got.len(), gs.ok[g].len(), "group {g}: messages answered OK");
        assert!(got == gs.ok[g], "group {g}: delivered in order");
    }
}

fn journal_store(extra: &[&str]) -> RelayOptions {
    let mut args = vec!["--store".to_string(), "journal".to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    RelayOptions {
        extra_args: args,
        ..RelayOptions::default()
    }
}

#[test]
fn a_full_disk_refuses_send_and_new_keeps_deletes_and_recovers_when_space_returns() {
    let dir = TempDir::new("disk-full").expect("a temp dir");
    let Some(fs) = Tmpfs::mount(dir.path(), TMPFS_BYTES) else {
        return;
    };
    common::init(dir.path());
    let mut relay = Relay::start_in(dir, journal_store(&[]));
    let mut gs = Groups::create(&mut relay.client());
    let filler = fs.fill("filler");
    assert!(filler > 0, "the filler took the free space");

    while_full(&mut relay, &mut gs, NO_SPACE);

    // Space returns: SEND works again at once, and the operator is told.
    std::fs::remove_file(fs.0.join("filler")).expect("remove the filler");
    sends_work_again(&relay, &mut gs);
    assert!(relay.log_shows("the journal has room again"));

    assert!(relay.stop().success(), "clean stop:\n{}", relay.log_text());
    relay.restart();
    all_delivered(&relay, &gs);
    drop(relay);
    drop(fs);
}

#[test]
fn the_size_cap_refuses_send_and_new_keeps_deletes_and_recovers_when_raised() {
    // At the smallest cap a new relay's first segments take all of it: no group can rotate.
    let cap = smp_relay::ini::MIN_JOURNAL_MAX_SIZE.to_string();
    let mut relay = Relay::start_with(journal_store(&["--journal-max-size", &cap]));
    let mut gs = Groups::create(&mut relay.client());

    while_full(&mut relay, &mut gs, SIZE_CAP);

    // A restart at the same cap: the files found count, the relay starts and refuses as before.
    assert!(relay.stop().success(), "clean stop:\n{}", relay.log_text());
    relay.restart();
    {
        let mut c = relay.client();
        assert_eq!(
            gs.send(&mut c, E, 8000),
            BrokerMsg::Err(ErrorType::Store(SIZE_CAP.into()))
        );
    }
    // The operator raises the cap.
    assert!(relay.stop().success());
    relay.restart_with(&["--store", "journal", "--journal-max-size", "64M"]);
    sends_work_again(&relay, &mut gs);
    assert!(relay.stop().success());
    relay.restart();
    all_delivered(&relay, &gs);
}

/// The cap stops new segment files, not appends into the files already made: at the cap, NEW and
/// small SENDs are answered OK while their group's active segment has room before its release
/// reserve (a new relay's first segments: 224 KiB each), and a group's SENDs are refused once its
/// own segment is full, while other groups' go on (README, `--journal-max-size`).
#[test]
fn at_the_size_cap_each_group_fills_the_segment_it_has_before_refusing() {
    let cap = smp_relay::ini::MIN_JOURNAL_MAX_SIZE.to_string();
    // A quota above the 128 messages of the default, for a segment's worth of small messages.
    let relay = Relay::start_with(journal_store(&[
        "--journal-max-size",
        &cap,
        "--quota",
        "4000",
    ]));
    let mut c = relay.client();
    // A queue in every group: NEWs at the cap.
    let mut gs = Groups::create(&mut c);
    let mut oks = 0;
    loop {
        match gs.send(&mut c, 0, 100) {
            BrokerMsg::Ok => oks += 1,
            BrokerMsg::Err(ErrorType::Store(e)) => {
                assert_eq!(e, SIZE_CAP, "the refusal says why");
                break;
            }
            other => panic!("SEND answered {other:?}"),
        }
        assert!(oks < 10_000, "SENDs never refused at the cap");
    }
    // 224 KiB before the reserve, a 100-byte message's record under 200 bytes.
    assert!(oks > 1000, "{oks} SENDs of 100 bytes before the refusal");
    for g in 1..PARTITION_GROUPS as usize {
        assert_eq!(gs.send(&mut c, g, 100), BrokerMsg::Ok, "group {g} has room");
    }
    assert!(relay.log_shows("size cap"), "{}", relay.log_text());
}

/// `init` on a full disk fails saying so and leaves no half-written identity (which neither a
/// second `init` nor `start` would accept); `start` on a disk without room for the journal's
/// first segments fails naming the segment, instead of crashing later.
#[test]
fn init_and_start_on_a_full_disk_fail_with_the_reason_and_leave_nothing_half_done() {
    let dir = TempDir::new("disk-full-init").expect("a temp dir");
    let Some(fs) = Tmpfs::mount(dir.path(), 1 << 20) else {
        return;
    };
    let data = dir.path().join("d");
    std::fs::create_dir(&data).expect("data dir");
    fs.fill("filler");
    let out = common::run_cli(&data, &["init", "--host", "127.0.0.1", "--no-password"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("No space left on device"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&data).expect("read").collect();
    assert!(left.is_empty(), "init left {left:?}");

    std::fs::remove_file(fs.0.join("filler")).expect("remove the filler");
    common::init(&data);
    fs.fill("filler");
    let port = common::free_port().to_string();
    let out = common::run_cli(
        &data,
        &[
            "start", "--port", &port, "--cores", "1", "--store", "journal",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "start without room:\n{err}");
    assert!(
        err.contains("seg-000000001.jnl") && err.contains("no space to preallocate"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    drop(dir);
    drop(fs);
}
