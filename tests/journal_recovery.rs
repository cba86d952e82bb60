//! The journal store's recovery at start, over the relay binary (`docs/ARCHITECTURE.md` §5,
//! `journal/FORMAT.md`): garbage past the synced offset is a torn tail, cut with a warning naming
//! the file; damage before it stops the start with the file and the `smp-journal repair` to run,
//! which then lets the relay start.

mod common;
mod support;

use std::path::{Path, PathBuf};

use common::Relay;
use smp_relay::store::group_of;
use support::*;

fn segment_of(dir: &Path, rid: &[u8]) -> PathBuf {
    dir.join("journal")
        .join(format!("g{:02}", group_of(rid)))
        .join("seg-000000001.jnl")
}

/// Where the records of a segment end: after its last non-zero byte, 8-aligned.
fn records_end(bytes: &[u8]) -> usize {
    let last = bytes.iter().rposition(|b| *b != 0).expect("some records");
    (last + 1).div_ceil(8) * 8
}

fn smp_journal() -> PathBuf {
    let p = Path::new(common::BIN).with_file_name("smp-journal");
    assert!(
        p.is_file(),
        "{} is missing: build the workspace (cargo test --workspace)",
        p.display()
    );
    p
}

#[test]
fn a_torn_tail_is_cut_with_a_warning_and_damage_stops_the_start_until_repaired() {
    let mut r = Relay::start();
    let (q, body) = {
        let mut c = r.client();
        let q = create_only(&mut c);
        send_ok(&mut c, &q, None, b"before the tail");
        (q, b"before the tail".to_vec())
    };
    let status = r.stop();
    assert!(status.success(), "clean stop");
    let seg = segment_of(r.dir.path(), q.rid());
    let mut bytes = std::fs::read(&seg).expect("the queue's segment");
    let end = records_end(&bytes);

    // A torn tail: what looks like the start of a record, then garbage, past the synced end.
    bytes[end..end + 4].copy_from_slice(b"JRec");
    bytes[end + 4..end + 64].fill(0xA5);
    std::fs::write(&seg, &bytes).expect("write");
    r.restart_with(&[]);
    let log = r.log_text();
    assert!(
        log.contains(&seg.display().to_string()) && log.contains("torn"),
        "the cut names the file:\n{log}"
    );
    {
        let mut c = r.client();
        let m = sub_with_msg(&mut c, &q);
        assert_eq!(
            m.msg.body(),
            Some(&body[..]),
            "the message before the tail is kept"
        );
    }
    assert!(r.stop().success());

    // Damage: a byte of the message's record flipped, before the synced end.
    let mut bytes = std::fs::read(&seg).expect("segment");
    let at = bytes
        .windows(body.len())
        .position(|w| w == &body[..])
        .expect("the body is in the segment");
    bytes[at] ^= 1;
    std::fs::write(&seg, &bytes).expect("write");
    let out = r.failed_start(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a damaged journal stops the start:\n{err}"
    );
    assert!(
        err.contains(&seg.display().to_string()) && err.contains("smp-journal repair"),
        "names the file and the repair:\n{err}"
    );

    // `smp-journal verify` says so; `repair` cuts the damage; the relay starts, its queue kept.
    let dir = r.dir.path().to_str().expect("utf-8").to_string();
    let verify = std::process::Command::new(smp_journal())
        .args(["--data-dir", &dir, "--quiet", "verify"])
        .output()
        .expect("smp-journal verify");
    assert_eq!(verify.status.code(), Some(1), "verify reports damage");
    let repair = std::process::Command::new(smp_journal())
        .args(["--data-dir", &dir, "--quiet", "repair"])
        .output()
        .expect("smp-journal repair");
    assert!(
        repair.status.success(),
        "repair: {}",
        String::from_utf8_lossy(&repair.stderr)
    );
    r.restart_with(&[]);
    let mut c = r.client();
    sub_empty(&mut c, &q);
}
