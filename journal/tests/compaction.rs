//! Compaction on real files: the kept records replace a group's oldest segments, in order, and a
//! reopen (also one after a compaction interrupted between its rename and its removals) replays
//! exactly them followed by the later segments; a child process compacting all the time and
//! killed at random points loses none of the records it keeps, and never replays one twice.

mod common;
use common::TempDir;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use smp_journal::{
    reader, segment_file_name, Journal, JournalError, Location, Options, Record, SEGMENT_COMPACTED,
};

fn opts() -> Options {
    Options {
        segment_size: 16 << 10,
        initial_segment_size: 16 << 10,
        ..Options::default()
    }
}

/// Message `i` of queue `q`: its ID and body say which.
fn msg_id(i: u32) -> [u8; 24] {
    let mut id = [0u8; 24];
    id[..4].copy_from_slice(&i.to_be_bytes());
    id
}

fn append_msg(j: &mut Journal, q: u8, i: u32) -> Location {
    let body = vec![q ^ i as u8; 700];
    j.append(&Record::MsgAppend {
        recipient_id: &[q; 24],
        msg_id: &msg_id(i),
        ts: i as i64,
        flags: 0,
        body: &body,
    })
    .unwrap()
    .loc
}

/// Every record a reopen replays, as text, and the open's warnings.
fn replay(root: &Path) -> Result<(Vec<String>, Vec<String>), JournalError> {
    let mut got = Vec::new();
    let (_j, rep) = Journal::open(root, 5, &opts(), |_, _, r| {
        got.push(format!("{r:?}"));
        Ok(())
    })?;
    Ok((got, rep.warnings.iter().map(|w| w.to_string()).collect()))
}

fn text(j: &Journal, loc: Location) -> String {
    format!("{:?}", j.read(loc).unwrap().1)
}

/// A journal of queue 1's record and messages 0..60 of queues 1 and 2, where every message of
/// queue 2 is deleted; returns the journal and the locations of what is live.
fn build(root: &Path) -> (Journal, Vec<Location>) {
    let (mut j, _) = Journal::open(root, 5, &opts(), |_, _, _| Ok(())).unwrap();
    let mut live = vec![
        j.append(&Record::QueueCreate {
            recipient_id: &[1; 24],
            data: b"queue one",
        })
        .unwrap()
        .loc,
    ];
    for i in 0..60 {
        let a = append_msg(&mut j, 1, i);
        if i % 10 == 0 {
            live.push(a);
        }
        append_msg(&mut j, 2, i);
        j.append(&Record::MsgDelete {
            recipient_id: &[2; 24],
            msg_id: &msg_id(i),
        })
        .unwrap();
    }
    (j, live)
}

#[test]
fn a_compacted_prefix_keeps_its_live_records_in_order_and_later_segments_follow_it() {
    let t = TempDir::new("compact");
    let (mut j, live) = build(t.path());
    let before: Vec<_> = j.segments();
    assert!(before.len() >= 5, "{before:?}");
    let upto = before[before.len() - 3].id;
    let keep: Vec<Location> = live.iter().copied().filter(|l| l.segment <= upto).collect();
    let kept_texts: Vec<String> = keep.iter().map(|&l| text(&j, l)).collect();
    let later_live: Vec<Location> = live.iter().copied().filter(|l| l.segment > upto).collect();

    let job = j.start_compaction(upto, keep.clone()).unwrap();
    // While it runs, its segments stay and appends go on.
    assert!(matches!(
        j.remove_segment(before[0].id),
        Err(JournalError::Compacting(_))
    ));
    let tail = append_msg(&mut j, 1, 1000);
    let done = std::thread::spawn(move || job.run())
        .join()
        .unwrap()
        .unwrap();
    assert!(done.bytes_after < done.bytes_before);
    let (moved, retired) = j.install_compaction(done).unwrap();
    // It holds the group (its lock) until it is gone.
    drop(retired);
    assert_eq!(moved.len(), keep.len());
    for ((old, new), want) in moved.iter().zip(&kept_texts) {
        assert!(old.segment <= upto);
        assert_eq!(new.segment, upto);
        assert_eq!(
            &text(&j, *new),
            want,
            "a kept record reads the same at its new place"
        );
    }
    let after = j.segments();
    assert_eq!(after[0].id, upto, "one segment replaces the prefix");
    let later = |v: &[smp_journal::SegmentInfo]| -> Vec<u64> {
        v.iter().map(|s| s.id).filter(|&id| id > upto).collect()
    };
    let (was, now) = (later(&before), later(&after));
    assert_eq!(
        &now[..was.len()],
        &was[..],
        "later segments stay (the tail may add one)"
    );
    for id in before[0].id..upto {
        assert!(!smp_journal::group_dir(t.path(), 5)
            .join(segment_file_name(id))
            .exists());
    }
    // Appends and syncs go on after the swap.
    let last = append_msg(&mut j, 1, 1001);
    j.sync_handle().sync_all().unwrap();
    let later_texts: Vec<String> = later_live.iter().map(|&l| text(&j, l)).collect();
    let (tail_text, last_text) = (text(&j, tail), text(&j, last));
    drop(j);

    let (got, warnings) = replay(t.path()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        &got[..kept_texts.len()],
        &kept_texts[..],
        "kept records first, in order"
    );
    for w in later_texts.iter().chain([&tail_text, &last_text]) {
        assert!(got.contains(w), "later record {w} replayed");
    }
    let g = reader::read_group(t.path(), 5, |_, _, _| Ok(())).unwrap();
    assert!(g.damage.is_empty() && g.warnings.is_empty(), "{g:?}");
}

#[test]
fn segments_left_by_an_interrupted_compaction_are_removed_at_open() {
    let t = TempDir::new("interrupted");
    let (mut j, live) = build(t.path());
    let segs = j.segments();
    let upto = segs[segs.len() - 2].id;
    let first = segs[0].id;
    let dir = smp_journal::group_dir(t.path(), 5);
    let old_first = std::fs::read(dir.join(segment_file_name(first))).unwrap();
    let keep: Vec<Location> = live.iter().copied().filter(|l| l.segment <= upto).collect();
    let job = j.start_compaction(upto, keep.clone()).unwrap();
    let done = job.run().unwrap();
    j.install_compaction(done).unwrap();
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let (clean, _) = replay(t.path()).unwrap();
    // As if the crash came between the rename and the removals: an old segment is back.
    std::fs::write(dir.join(segment_file_name(first)), &old_first).unwrap();
    let header = std::fs::read(dir.join(segment_file_name(upto))).unwrap();
    let flags = u32::from_le_bytes(header[60..64].try_into().unwrap());
    assert_eq!(flags, SEGMENT_COMPACTED);
    let g = reader::read_group(t.path(), 5, |_, _, _| Ok(())).unwrap();
    assert!(g.damage.is_empty(), "the reader skips the leftover: {g:?}");
    let (got, warnings) = replay(t.path()).unwrap();
    assert_eq!(got, clean, "the leftover is not replayed");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("a later segment is the group's first"),
        "{warnings:?}"
    );
    assert!(!dir.join(segment_file_name(first)).exists());
}

#[test]
fn a_compaction_that_cannot_start_leaves_the_journal_as_it_was() {
    let t = TempDir::new("refused");
    let (mut j, live) = build(t.path());
    let active = j.segments().last().unwrap().id;
    assert!(matches!(
        j.start_compaction(active, vec![]),
        Err(JournalError::BadCompaction(_))
    ));
    let reversed: Vec<Location> = live.iter().rev().copied().collect();
    assert!(matches!(
        j.start_compaction(active - 1, reversed),
        Err(JournalError::BadCompaction(_))
    ));
    let job = j.start_compaction(active - 1, vec![]).unwrap();
    assert!(matches!(
        j.start_compaction(active - 1, vec![]),
        Err(JournalError::Compacting(_))
    ));
    drop(job);
    j.abandon_compaction();
    j.remove_segment(j.segments()[0].id).unwrap();
}

const CHILD_DIR_ENV: &str = "SMP_JOURNAL_COMPACT_CHILD_DIR";

/// Not a test of its own: the child process of the SIGKILL test. Without the environment
/// variable it does nothing. Appends messages forever, keeping every seventh (of queue 1;
/// printing `kept N` once it is appended) and dropping the others (queue 2), and after every
/// rotation compacts every inactive segment, keeping exactly the kept messages.
#[test]
fn child_compacting_forever() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let (mut j, _) = Journal::open(Path::new(&dir), 5, &opts(), |_, _, _| Ok(())).unwrap();
    let mut kept: Vec<Location> = Vec::new();
    let out = std::io::stdout();
    let mut last_active = 0;
    for i in 0u32.. {
        let q = if i % 7 == 0 { 1 } else { 2 };
        let loc = append_msg(&mut j, q, i);
        if q == 1 {
            kept.push(loc);
            let mut o = out.lock();
            writeln!(o, "kept {i}").unwrap();
            o.flush().unwrap();
        }
        let active = j.segments().last().unwrap().id;
        if active != last_active && active > 1 {
            last_active = active;
            let upto = active - 1;
            let keep: Vec<Location> = kept.iter().copied().filter(|l| l.segment <= upto).collect();
            let job = j.start_compaction(upto, keep).unwrap();
            let done = job.run().unwrap();
            // The kept records of the prefix are the first ones of `kept`, in the same order.
            let (moved, _retired) = j.install_compaction(done).unwrap();
            for (k, (old, new)) in moved.into_iter().enumerate() {
                assert_eq!(kept[k], old);
                kept[k] = new;
            }
        }
    }
}

/// The message numbers of queue 1 a reopen replays, in order.
fn replayed_kept(root: &Path) -> Vec<u32> {
    let mut got = Vec::new();
    let (_j, _) = Journal::open(root, 5, &opts(), |_, _, r| {
        if let Record::MsgAppend {
            recipient_id,
            msg_id,
            ..
        } = r
        {
            if recipient_id == [1u8; 24] {
                got.push(u32::from_be_bytes(msg_id[..4].try_into().unwrap()));
            }
        }
        Ok(())
    })
    .unwrap();
    got
}

#[test]
fn a_child_killed_while_compacting_keeps_every_kept_record_once_and_in_order() {
    for round in 0..6u64 {
        let t = TempDir::new("compact-kill");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_compacting_forever", "--nocapture"])
            .env(CHILD_DIR_ENV, t.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        // Killed after a number of kept messages that differs from round to round, so that the
        // kill lands at different steps of a compaction.
        let stop_after = 20 + common::splitmix(round) % 160;
        let mut reported = Vec::new();
        for line in out.lines() {
            if let Some(n) = line.unwrap().strip_prefix("kept ") {
                reported.push(n.parse::<u32>().unwrap());
                if reported.len() as u64 >= stop_after {
                    break;
                }
            }
        }
        child.kill().unwrap();
        assert!(!child.wait().unwrap().success());
        let got = replayed_kept(t.path());
        assert!(
            got.len() >= reported.len(),
            "round {round}: {} kept messages replayed, {} reported",
            got.len(),
            reported.len()
        );
        let want: Vec<u32> = (0..got.len() as u32).map(|k| k * 7).collect();
        assert_eq!(
            got, want,
            "round {round}: every kept message once, in order"
        );
        let dir: PathBuf = smp_journal::group_dir(t.path(), 5);
        let segments = std::fs::read_dir(&dir).unwrap().count();
        assert!(
            segments < 10,
            "round {round}: {segments} files left in {}",
            dir.display()
        );
    }
}

#[test]
fn a_size_cap_counts_the_compacted_segment_instead_of_those_it_replaces() {
    let t = TempDir::new("compact-budget");
    let budget = smp_journal::SpaceBudget::new(1 << 30);
    let o = Options {
        budget: Some(budget.clone()),
        ..opts()
    };
    let (mut j, _) = Journal::open(t.path(), 5, &o, |_, _, _| Ok(())).unwrap();
    for i in 0..60 {
        append_msg(&mut j, 2, i);
    }
    let files = |j: &Journal| j.segments().iter().map(|s| s.len).sum::<u64>();
    assert_eq!(budget.used_bytes(), files(&j));
    let upto = j.segments()[j.segments().len() - 2].id;
    let job = j.start_compaction(upto, vec![]).unwrap();
    let done = job.run().unwrap();
    j.install_compaction(done).unwrap();
    assert_eq!(budget.used_bytes(), files(&j), "counted as the files are");
    drop(j);
    assert_eq!(budget.used_bytes(), 0, "all given back at close");
}
