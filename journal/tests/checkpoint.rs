//! Checkpoints on real files: open starts from a group's checkpoint and replays only the records
//! after it; a checkpoint whose segments were compacted or cut since, or whose file is damaged,
//! is not used (a warning, and the whole journal is replayed).

mod common;
use common::TempDir;

use std::path::Path;

use smp_journal::{repair, Journal, Location, Options, Record, CHECKPOINT_FILE};

fn opts() -> Options {
    Options {
        segment_size: 16 << 10,
        initial_segment_size: 16 << 10,
        ..Options::default()
    }
}

const G: u32 = 7;

fn append(j: &mut Journal, i: u32) -> Location {
    let body = vec![i as u8; 500];
    let mut id = [0u8; 24];
    id[..4].copy_from_slice(&i.to_be_bytes());
    j.append(&Record::MsgAppend {
        recipient_id: &[1; 24],
        msg_id: &id,
        ts: i64::from(i),
        flags: 0,
        body: &body,
    })
    .unwrap()
    .loc
}

fn number(r: &Record<'_>) -> u32 {
    match r {
        Record::MsgAppend { msg_id, .. } => u32::from_be_bytes(msg_id[..4].try_into().unwrap()),
        _ => panic!("{r:?}"),
    }
}

/// Opens from the checkpoint: what `load` got (the blob) and the numbers replayed after it.
struct Opened {
    journal: Journal,
    blob: Option<Vec<u8>>,
    replayed: Vec<u32>,
    warnings: Vec<String>,
}

fn open(root: &Path) -> Opened {
    let mut blob = None;
    let mut replayed = Vec::new();
    let (journal, rep) = Journal::open_from_checkpoint(
        root,
        G,
        &opts(),
        |c| {
            blob = Some(c.blob.clone());
            Ok(())
        },
        |_, _, r| {
            replayed.push(number(&r));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(rep.checkpoint.is_some(), blob.is_some());
    Opened {
        journal,
        blob,
        replayed,
        warnings: rep.warnings.iter().map(|w| w.to_string()).collect(),
    }
}

#[test]
fn open_starts_after_the_checkpoint_and_appends_go_on() {
    let t = TempDir::new("ckp");
    let (mut j, _) = Journal::open(t.path(), G, &opts(), |_, _, _| Ok(())).unwrap();
    for i in 0..100 {
        append(&mut j, i);
    }
    assert!(
        j.segments().len() >= 3,
        "the checkpoint covers several segments"
    );
    j.checkpoint_base().write(b"state after 100").unwrap();
    for i in 100..130 {
        append(&mut j, i);
    }
    j.sync_handle().sync_all().unwrap();
    drop(j);

    let mut o = open(t.path());
    assert_eq!(o.blob.as_deref(), Some(&b"state after 100"[..]));
    assert_eq!(
        o.replayed,
        (100..130).collect::<Vec<_>>(),
        "only the records after it"
    );
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    // Records before the point are still readable, and appends follow on.
    let loc = o.journal.segments()[0].id;
    let first = Location {
        segment: loc,
        offset: smp_journal::HEADER_LEN,
    };
    assert_eq!(number(&o.journal.read(first).unwrap().1), 0);
    append(&mut o.journal, 130);
    o.journal.sync_handle().sync_all().unwrap();
    drop(o);
    let all: Vec<u32> = {
        let mut v = Vec::new();
        Journal::open(t.path(), G, &opts(), |_, _, r| {
            v.push(number(&r));
            Ok(())
        })
        .unwrap();
        v
    };
    assert_eq!(all, (0..=130).collect::<Vec<_>>(), "a full replay agrees");
    let g = smp_journal::reader::read_group(t.path(), G, |_, _, _| Ok(())).unwrap();
    assert!(g.damage.is_empty() && g.warnings.is_empty(), "{g:?}");
}

#[test]
fn a_checkpoint_at_the_very_end_replays_nothing() {
    let t = TempDir::new("ckp-end");
    let (mut j, _) = Journal::open(t.path(), G, &opts(), |_, _, _| Ok(())).unwrap();
    for i in 0..50 {
        append(&mut j, i);
    }
    j.checkpoint_base().write(b"all").unwrap();
    drop(j);
    let mut o = open(t.path());
    assert!(o.replayed.is_empty());
    append(&mut o.journal, 50);
    o.journal.sync_handle().sync_all().unwrap();
    drop(o);
    let o = open(t.path());
    assert_eq!(o.replayed, vec![50]);
}

#[test]
fn a_checkpoint_of_segments_compacted_since_is_not_used() {
    let t = TempDir::new("ckp-compacted");
    let (mut j, _) = Journal::open(t.path(), G, &opts(), |_, _, _| Ok(())).unwrap();
    let locs: Vec<Location> = (0..100).map(|i| append(&mut j, i)).collect();
    j.checkpoint_base().write(b"before").unwrap();
    let upto = j.segments()[j.segments().len() - 2].id;
    let keep: Vec<Location> = locs
        .iter()
        .copied()
        .filter(|l| l.segment <= upto)
        .step_by(10)
        .collect();
    let job = j.start_compaction(upto, keep).unwrap();
    j.install_compaction(job.run().unwrap()).unwrap();
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let o = open(t.path());
    assert!(o.blob.is_none(), "not loaded");
    assert!(
        o.warnings.iter().any(|w| w.contains("rewritten since")),
        "{:?}",
        o.warnings
    );
    assert!(
        o.replayed.len() < 100,
        "the compacted journal, replayed whole"
    );
}

#[test]
fn a_damaged_checkpoint_file_is_a_warning_and_repair_removes_the_checkpoint() {
    let t = TempDir::new("ckp-damaged");
    let (mut j, _) = Journal::open(t.path(), G, &opts(), |_, _, _| Ok(())).unwrap();
    for i in 0..40 {
        append(&mut j, i);
    }
    j.checkpoint_base().write(b"blob").unwrap();
    drop(j);
    let file = smp_journal::group_dir(t.path(), G).join(CHECKPOINT_FILE);
    let mut b = std::fs::read(&file).unwrap();
    let n = b.len();
    b[n - 10] ^= 0xff;
    std::fs::write(&file, &b).unwrap();
    let o = open(t.path());
    assert!(o.blob.is_none());
    assert_eq!(o.replayed, (0..40).collect::<Vec<_>>());
    assert!(
        o.warnings.iter().any(|w| w.contains("CRC")),
        "{:?}",
        o.warnings
    );
    drop(o);

    // A good checkpoint, then a cut by repair: the checkpoint goes with it.
    let (j, _) = Journal::open(t.path(), G, &opts(), |_, _, _| Ok(())).unwrap();
    j.checkpoint_base().write(b"blob").unwrap();
    let seg = j.segments()[0].path.clone();
    drop(j);
    let mut s = std::fs::read(&seg).unwrap();
    s[smp_journal::HEADER_LEN as usize + 40] ^= 1;
    std::fs::write(&seg, &s).unwrap();
    let rep = repair(t.path(), G).unwrap();
    assert!(rep.cut.is_some());
    assert!(!file.exists(), "the checkpoint is removed with the cut");
    let o = open(t.path());
    assert!(o.blob.is_none());
}
