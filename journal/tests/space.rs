//! When the journal cannot grow (`journal/FORMAT.md`, "Space"): on a real tmpfs filled to the last
//! byte, and under a size cap shared by two groups. Ordinary appends fail with nothing appended,
//! release appends go on in the active segment's reserve until it is full, and appends work again
//! once there is room; everything appended is replayed after a reopen.

mod common;
use common::{TempDir, Tmpfs};

use std::path::Path;

use smp_journal::{Journal, JournalError, Options, Priority, Record, SpaceBudget, HEADER_LEN};

const SEGMENT: u64 = 64 << 10;

fn opts(segment_size: u64, budget: Option<SpaceBudget>) -> Options {
    Options {
        segment_size,
        initial_segment_size: segment_size,
        budget,
        ..Options::default()
    }
}

fn msg_id(i: u32) -> [u8; 24] {
    let mut id = [0u8; 24];
    id[..4].copy_from_slice(&i.to_be_bytes());
    id
}

const BODY: [u8; 1000] = [7; 1000];

fn message(id: &[u8; 24]) -> Record<'_> {
    Record::MsgAppend {
        recipient_id: b"queue",
        msg_id: id,
        ts: 1,
        flags: 0,
        body: &BODY,
    }
}

fn delete(id: &[u8; 24]) -> Record<'_> {
    Record::MsgDelete {
        recipient_id: b"queue",
        msg_id: id,
    }
}

/// Opens group `g`, collecting the replayed records as text.
fn open(root: &Path, g: u32, o: &Options) -> (Journal, Vec<String>) {
    let mut got = Vec::new();
    let (j, _) = Journal::open(root, g, o, |_, _, r| {
        got.push(format!("{r:?}"));
        Ok(())
    })
    .unwrap();
    (j, got)
}

/// The active segment's length and written end.
fn active(j: &Journal) -> (u64, u64) {
    let s = j.segments().into_iter().find(|s| s.active).unwrap();
    (s.len, s.written_end)
}

#[test]
fn a_full_tmpfs_refuses_ordinary_appends_and_keeps_the_reserve_for_release_ones() {
    let Some(fs) = Tmpfs::mount("full", 1 << 20) else {
        return;
    };
    let root = fs.path().join("journal");
    let o = opts(SEGMENT, None);
    let (mut j, _) = open(&root, 1, &o);
    let filled = fs.fill("filler");
    assert!(filled > 0, "the filler took the rest of the tmpfs");

    // Ordinary appends fill the segment up to its reserve, then cannot rotate.
    let mut want = Vec::new();
    let mut i = 0u32;
    let err = loop {
        let id = msg_id(i);
        match j.append(&message(&id)) {
            Ok(_) => want.push(format!("{:?}", message(&id))),
            Err(e) => break e,
        }
        i += 1;
    };
    assert!(matches!(err, JournalError::NoSpace { .. }), "{err}");
    assert!(err.is_out_of_space());
    assert!(i > 0, "some messages fit before the disk was full");
    let reserve = SEGMENT / smp_journal::RESERVE_SHARE_DIVISOR;
    let (len, w0) = active(&j);
    let msg_len = message(&msg_id(0)).stored_len();
    assert!(
        w0 <= len - reserve && w0 + msg_len > len - reserve,
        "ordinary records stop at the reserve: written to {w0} of {len}"
    );
    assert_eq!(j.segments().len(), 1);

    // Release appends go on in the reserve, record after record, until it is full.
    let del_len = delete(&msg_id(0)).stored_len();
    let mut k = 0u32;
    let err = loop {
        let id = msg_id(k);
        match j.append_with(&delete(&id), Priority::Release) {
            Ok(a) => {
                assert_eq!(a.loc.segment, 1);
                want.push(format!("{:?}", delete(&id)));
            }
            Err(e) => break e,
        }
        k += 1;
    };
    assert!(matches!(err, JournalError::NoSpace { .. }), "{err}");
    assert_eq!(
        u64::from(k),
        (len - w0) / del_len,
        "the whole reserve was used"
    );
    // Nothing fits now, of either priority.
    assert!(matches!(
        j.append(&message(&msg_id(9999))),
        Err(JournalError::NoSpace { .. })
    ));
    assert!(matches!(
        j.append_with(&delete(&msg_id(9999)), Priority::Release),
        Err(JournalError::NoSpace { .. })
    ));

    // Space returns: the next appends rotate to a new segment.
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    let id = msg_id(10_000);
    let a = j.append(&message(&id)).unwrap();
    want.push(format!("{:?}", message(&id)));
    assert_eq!(a.loc.segment, 2);
    j.append_with(&delete(&id), Priority::Release).unwrap();
    want.push(format!("{:?}", delete(&id)));
    j.sync_handle().sync_all().unwrap();
    drop(j);

    let (_j, got) = open(&root, 1, &o);
    assert_eq!(got, want, "every appended record is replayed, in order");
    let leftovers: Vec<_> = std::fs::read_dir(smp_journal::group_dir(&root, 1))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_size_cap_shared_by_two_groups_refuses_new_segments_until_one_is_removed() {
    let t = TempDir::new("cap");
    let seg = 16u64 << 10;
    let budget = SpaceBudget::new(3 * seg);
    let o = opts(seg, Some(budget.clone()));
    let (mut a, _) = open(&t.journal(), 1, &o);
    let (mut b, _) = open(&t.journal(), 2, &o);
    assert_eq!(
        budget.used_bytes(),
        2 * seg,
        "each open made a first segment"
    );

    // Group 1 rotates once (the cap's third segment), then cannot.
    let fill = |j: &mut Journal, from: u32| -> (u32, JournalError) {
        let mut i = from;
        loop {
            match j.append(&message(&msg_id(i))) {
                Ok(_) => i += 1,
                Err(e) => return (i - from, e),
            }
        }
    };
    let (n, err) = fill(&mut a, 0);
    assert!(n > 0);
    assert_eq!(a.segments().len(), 2);
    assert_eq!(budget.used_bytes(), 3 * seg);
    match &err {
        JournalError::SizeCap { cap, used, need } => {
            assert_eq!((*cap, *used, *need), (3 * seg, 3 * seg, seg))
        }
        e => panic!("expected SizeCap, got {e}"),
    }
    assert!(err.is_out_of_space());
    assert!(
        err.to_string()
            .contains("journal size cap of 49152 bytes reached"),
        "{err}"
    );
    // Group 2 fills its first segment to the reserve and is refused too; its deletes go on.
    let (_, err) = fill(&mut b, 0);
    assert!(matches!(err, JournalError::SizeCap { .. }), "{err}");
    let (len, before) = active(&b);
    let d = b
        .append_with(&delete(&msg_id(0)), Priority::Release)
        .unwrap();
    assert_eq!(
        (d.loc.segment, d.loc.offset),
        (1, before),
        "after the ordinary records, no new segment"
    );
    assert!(before + message(&msg_id(0)).stored_len() > len - seg / 8);

    // Group 1's first segment goes: its bytes come back, and group 2 can rotate.
    a.remove_segment(1).unwrap();
    assert_eq!(budget.used_bytes(), 2 * seg);
    let m = b.append(&message(&msg_id(500))).unwrap();
    assert_eq!(m.loc.segment, 2);
    assert_eq!(budget.used_bytes(), 3 * seg);
    a.sync_handle().sync_all().unwrap();
    b.sync_handle().sync_all().unwrap();
    drop(a);
    drop(b);
    assert_eq!(
        budget.used_bytes(),
        0,
        "closed journals give back what they counted"
    );

    // Reopened under a cap smaller than the files: they count and are read; new segments wait.
    let small = SpaceBudget::new(seg);
    let o = opts(seg, Some(small.clone()));
    let (mut a, got_a) = open(&t.journal(), 1, &o);
    let (_b, got_b) = open(&t.journal(), 2, &o);
    assert_eq!(small.used_bytes(), 3 * seg);
    assert!(!got_a.is_empty() && !got_b.is_empty());
    let (_, err) = fill(&mut a, 1000);
    assert!(matches!(err, JournalError::SizeCap { .. }), "{err}");
    a.append_with(&delete(&msg_id(1)), Priority::Release)
        .unwrap();
}

#[test]
fn a_record_that_fits_only_with_the_reserve_is_too_large_unless_it_releases() {
    let t = TempDir::new("reserve-large");
    let seg = 16u64 << 10;
    let o = opts(seg, None);
    let (mut j, _) = open(&t.journal(), 3, &o);
    let reserve = seg / smp_journal::RESERVE_SHARE_DIVISOR;
    // The largest ordinary record ends exactly at the reserve of an empty segment.
    let room = seg - HEADER_LEN - reserve;
    let fits = vec![1u8; (room - 32) as usize];
    let over = vec![1u8; (room - 32 + 8) as usize];
    let a = j.append(&Record::Checkpoint { data: &fits }).unwrap();
    assert_eq!(a.end.offset, seg - reserve);
    assert!(matches!(
        j.append(&Record::Checkpoint { data: &over }),
        Err(JournalError::TooLarge { .. })
    ));
    let r = j
        .append_with(&Record::Checkpoint { data: &over }, Priority::Release)
        .unwrap();
    assert_eq!(r.loc.segment, 2, "it needs a segment of its own");
}
