//! The journal store's compaction over the relay binary (`docs/ARCHITECTURE.md` §5,
//! `journal/FORMAT.md` "Compaction"): a message nobody fetched, in a group whose other queue
//! carries megabytes of traffic, no longer keeps every segment of the group, and it is still
//! delivered after the relay is killed and started again; `smp-journal verify` beside a relay
//! under such load is clean every time.

use crate::common;
use crate::support;

use std::path::Path;

use common::Relay;
use smp_journal::SEGMENT_COMPACTED;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::store::group_of;
use support::*;

/// The segment files of a group directory, ascending.
fn segment_files(group_dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(group_dir)
        .expect("group directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "jnl"))
        .collect();
    v.sort();
    v
}

#[test]
fn an_unfetched_message_does_not_keep_its_group_growing_and_survives_a_kill() {
    let mut r = Relay::start();
    let (a, g) = {
        let mut c = r.client();
        let qs = create_many(&mut c, 256, 64);
        // Two queues of one group: `a` keeps one old message, `b` carries the traffic.
        let (i, j) = (0..qs.len())
            .flat_map(|i| (i + 1..qs.len()).map(move |j| (i, j)))
            .find(|&(i, j)| group_of(qs[i].rid()) == group_of(qs[j].rid()))
            .expect("two queues of one group");
        let (a, b) = (&qs[i], &qs[j]);
        send_ok(&mut c, a, None, b"the old message");
        let mut rc = r.client();
        sub_empty(&mut rc, b);
        // 30 MB through the group: segments of 256 KiB, 512 KiB, … 16 MiB.
        let body = vec![0x5a; 15_000];
        for _ in 0..2_000 {
            send_ok(&mut c, b, None, &body);
            let m = expect_body(&mut rc, b, &body);
            assert_eq!(ack(&mut rc, b, &m.msg_id), BrokerMsg::Ok);
        }
        (a.clone(), group_of(a.rid()))
    };
    r.kill();
    r.restart();
    let dir = r.dir.path().join("journal").join(format!("g{g:02}"));
    let files = segment_files(&dir);
    // Without compaction the old message's segment keeps all seven.
    assert!(files.len() <= 3, "{files:?}");
    let header = std::fs::read(&files[0]).expect("oldest segment");
    let flags = u32::from_le_bytes(header[60..64].try_into().unwrap());
    assert_eq!(flags, SEGMENT_COMPACTED, "the oldest segment is compacted");
    let mut c = r.client();
    let m = sub_with_msg(&mut c, &a);
    assert_eq!(m.msg.body(), Some(&b"the old message"[..]));
    assert_eq!(ack(&mut c, &a, &m.msg_id), BrokerMsg::Ok);
}

/// `smp-journal verify` beside a relay under load (SENDs of 15 KB and their ACKs, segments
/// rotating and being compacted meanwhile) reports a clean journal every time: 20 runs.
#[test]
fn verify_beside_a_relay_under_load_is_clean_every_time() {
    let r = Relay::start();
    let mut c = r.client();
    let qs = create_many(&mut c, 2, 2);
    let (a, b) = (&qs[0], &qs[1]);
    send_ok(&mut c, a, None, b"kept while the rest churns");
    let mut rc = r.client();
    sub_empty(&mut rc, b);
    let body = vec![0x3c; 15_000];
    let dir = r.dir.path().to_str().expect("utf-8").to_string();
    let bin = std::path::Path::new(common::BIN).with_file_name("smp-journal");
    for round in 0..20 {
        let verify = std::process::Command::new(&bin)
            .args(["--data-dir", &dir, "--quiet", "verify"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("smp-journal verify");
        for _ in 0..100 {
            send_ok(&mut c, b, None, &body);
            let m = expect_body(&mut rc, b, &body);
            assert_eq!(ack(&mut rc, b, &m.msg_id), BrokerMsg::Ok);
        }
        let out = verify.wait_with_output().expect("verify ends");
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let m = sub_with_msg(&mut r.client(), a);
    assert_eq!(m.msg.body(), Some(&b"kept while the rest churns"[..]));
}
