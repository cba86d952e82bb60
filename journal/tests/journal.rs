//! The journal on real files in temporary directories: append and replay, rotation, torn tails
//! and damage, repair, the pread reader, syncs from another thread, random crash cuts, and child
//! processes killed mid-append or out of file space.

mod common;
use common::{splitmix, TempDir};

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use smp_journal::{
    reader, repair, segment_file_name, Journal, JournalError, Location, OpenReport, Options,
    Record, SyncPoint, HEADER_LEN,
};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A record made from a number, so that a child process and its parent agree on record `i`.
struct Gen {
    kind: u64,
    id: Vec<u8>,
    msg_id: [u8; 24],
    ts: i64,
    flags: u8,
    body: Vec<u8>,
}

impl Gen {
    fn new(i: u64, max_body: usize) -> Gen {
        let r = splitmix(i);
        let id_len = 1 + (r % 40) as usize;
        let body_len = (splitmix(r) % (max_body as u64 + 1)) as usize;
        let mut msg_id = [0u8; 24];
        msg_id[..8].copy_from_slice(&i.to_le_bytes());
        Gen {
            kind: r >> 59,
            id: (0..id_len)
                .map(|k| (i as u8).wrapping_add(k as u8))
                .collect(),
            msg_id,
            ts: 1_700_000_000 + i as i64,
            flags: (r >> 8) as u8,
            body: (0..body_len).map(|k| (r as u8) ^ (k as u8)).collect(),
        }
    }

    fn rec(&self) -> Record<'_> {
        let (id, data) = (&self.id[..], &self.body[..]);
        match self.kind % 9 {
            0 => Record::QueueCreate {
                recipient_id: id,
                data,
            },
            1 => Record::QueueUpdate {
                recipient_id: id,
                data,
            },
            2 => Record::QueueDelete { recipient_id: id },
            3 | 4 => Record::MsgAppend {
                recipient_id: id,
                msg_id: &self.msg_id,
                ts: self.ts,
                flags: self.flags,
                body: data,
            },
            5 => Record::MsgDelete {
                recipient_id: id,
                msg_id: &self.msg_id,
            },
            6 => Record::NtfAppend {
                notifier_id: id,
                data,
            },
            7 => Record::NtfDelete {
                notifier_id: id,
                msg_id: &self.msg_id,
            },
            _ => Record::Checkpoint { data },
        }
    }

    fn text(i: u64, max_body: usize) -> String {
        format!("{:?}", Gen::new(i, max_body).rec())
    }
}

fn opts(segment_size: u64) -> Options {
    Options {
        segment_size,
        initial_segment_size: segment_size,
        ..Options::default()
    }
}

/// What a replay gave: location, sequence number, the record as text.
type Replayed = Vec<(Location, u64, String)>;

/// Opens and collects what the replay gives.
fn open_collect(
    root: &Path,
    group: u32,
    o: &Options,
) -> Result<(Journal, OpenReport, Replayed), JournalError> {
    let mut got = Vec::new();
    let (j, rep) = Journal::open(root, group, o, |loc, seq, rec| {
        got.push((loc, seq, format!("{rec:?}")));
        Ok(())
    })?;
    Ok((j, rep, got))
}

fn append_gen(j: &mut Journal, i: u64, max_body: usize) -> smp_journal::Appended {
    let g = Gen::new(i, max_body);
    j.append(&g.rec()).unwrap()
}

fn seg_path(root: &Path, group: u32, id: u64) -> PathBuf {
    smp_journal::group_dir(root, group).join(segment_file_name(id))
}

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, off).unwrap();
}

fn read_at(path: &Path, off: u64, n: usize) -> Vec<u8> {
    let f = OpenOptions::new().read(true).open(path).unwrap();
    let mut b = vec![0u8; n];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn append_and_reopen_replays_everything_in_order() {
    let t = TempDir::new("replay");
    let o = opts(1 << 20);
    let (mut j, rep, got) = open_collect(t.path(), 7, &o).unwrap();
    assert!(got.is_empty() && rep.warnings.is_empty() && rep.next_seq == 1);
    assert!(seg_path(t.path(), 7, 1).exists(), "g07/seg-000000001.jnl");
    let mut appended = Vec::new();
    for i in 0..300 {
        let a = append_gen(&mut j, i, 600);
        assert_eq!(a.seq, i + 1);
        let (seq, rec) = j.read(a.loc).unwrap();
        assert_eq!((seq, format!("{rec:?}")), (i + 1, Gen::text(i, 600)));
        appended.push(a);
    }
    // Half synced, half only in the page cache: a closed (or crashed) process keeps both.
    j.sync_handle().sync_to(appended[149].end).unwrap();
    assert_eq!(j.synced(), appended[149].end);
    drop(j);
    let (j, rep, got) = open_collect(t.path(), 7, &o).unwrap();
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(got.len(), 300);
    for (i, (loc, seq, text)) in got.iter().enumerate() {
        assert_eq!(*loc, appended[i].loc);
        assert_eq!(*seq, i as u64 + 1);
        assert_eq!(*text, Gen::text(i as u64, 600));
    }
    assert_eq!(rep.synced, appended[149].end);
    assert_eq!(rep.written, appended[299].end);
    assert_eq!(rep.next_seq, 301);
    assert_eq!(j.read(appended[10].loc).unwrap().0, 11);
    // A location that is not a record start.
    let bad = Location {
        segment: 1,
        offset: appended[10].loc.offset + 8,
    };
    assert!(matches!(j.read(bad), Err(JournalError::BadLocation { .. })));
}

#[test]
fn a_second_open_of_the_same_group_is_refused() {
    let t = TempDir::new("lock");
    let o = opts(1 << 16);
    let (j, _, _) = open_collect(t.path(), 0, &o).unwrap();
    let h = j.sync_handle();
    drop(j);
    // The sync handle still holds the mapping and the lock.
    assert!(matches!(
        open_collect(t.path(), 0, &o),
        Err(JournalError::Locked { .. })
    ));
    drop(h);
    open_collect(t.path(), 0, &o).unwrap();
}

#[test]
fn a_zero_filled_preallocated_tail_is_not_corruption() {
    let t = TempDir::new("zeros");
    let o = opts(1 << 16);
    let (mut j, _, _) = open_collect(t.path(), 1, &o).unwrap();
    for i in 0..5 {
        append_gen(&mut j, i, 100);
    }
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let len = std::fs::metadata(seg_path(t.path(), 1, 1)).unwrap().len();
    assert_eq!(len, 1 << 16, "preallocated to the full segment size");
    let (j, rep, got) = open_collect(t.path(), 1, &o).unwrap();
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(got.len(), 5);
    drop(j);
    let g = reader::read_group(t.path(), 1, |_, _, _| Ok(())).unwrap();
    assert!(g.damage.is_empty());
    assert!(matches!(
        g.segments[0].stop,
        reader::SegmentEnd::Zeros { .. }
    ));
}

#[test]
fn a_torn_tail_past_the_synced_offset_is_cut_with_a_warning() {
    let t = TempDir::new("torn");
    let o = opts(1 << 20);
    let (mut j, _, _) = open_collect(t.path(), 3, &o).unwrap();
    let a: Vec<_> = (0..40).map(|i| append_gen(&mut j, i, 300)).collect();
    j.sync_handle().sync_to(a[19].end).unwrap();
    drop(j);
    // Record 25 is torn (a byte of its payload changed); 26..40 are valid records after it.
    let path = seg_path(t.path(), 3, 1);
    let off = a[25].loc.offset + RECORD_PAYLOAD_BYTE;
    let b = read_at(&path, off, 1);
    write_at(&path, off, &[b[0] ^ 0x5a]);
    let (mut j, rep, got) = open_collect(t.path(), 3, &o).unwrap();
    assert_eq!(got.len(), 25, "cut at the torn record");
    assert_eq!(rep.warnings.len(), 1, "{:?}", rep.warnings);
    let w = &rep.warnings[0];
    assert_eq!((w.file.clone(), w.offset), (path.clone(), a[25].loc.offset));
    assert!(w.to_string().contains("torn tail"), "{w}");
    assert!(w.to_string().contains(&path.display().to_string()));
    assert_eq!(rep.written.offset, a[25].loc.offset);
    // Appends go on at the cut; the old records after it never come back, even where a new
    // record ends exactly where an old one started.
    let n = append_gen(&mut j, 25, 300);
    assert_eq!(n.loc, a[25].loc);
    assert_eq!(n.end, a[25].end, "same record, same length");
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let (_j, rep, got) = open_collect(t.path(), 3, &o).unwrap();
    assert_eq!(got.len(), 26);
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
}

/// Offset of a payload byte within a record (past the 32-byte header).
const RECORD_PAYLOAD_BYTE: u64 = 33;

#[test]
fn damage_before_the_synced_offset_fails_open_and_repair_cuts_it() {
    let t = TempDir::new("damage");
    let o = opts(1 << 14);
    let (mut j, _, _) = open_collect(t.path(), 5, &o).unwrap();
    let a: Vec<_> = (0..100).map(|i| append_gen(&mut j, i, 900)).collect();
    j.sync_handle().sync_all().unwrap();
    let segs = j.segments();
    assert!(segs.len() >= 3, "rotated: {segs:?}");
    drop(j);
    // Damage record 10 (in segment 1).
    assert_eq!(a[10].loc.segment, 1);
    let path = seg_path(t.path(), 5, 1);
    let off = a[10].loc.offset + RECORD_PAYLOAD_BYTE;
    let b = read_at(&path, off, 1);
    write_at(&path, off, &[b[0] ^ 1]);
    let e = open_collect(t.path(), 5, &o).err().expect("open must fail");
    let msg = e.to_string();
    assert!(
        matches!(e, JournalError::Damage { offset, .. } if offset == a[10].loc.offset),
        "{msg}"
    );
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains(&a[10].loc.offset.to_string()), "{msg}");
    assert!(msg.contains("smp-journal repair"), "{msg}");
    // The reader sees the same damage.
    let g = reader::read_group(t.path(), 5, |_, _, _| Ok(())).unwrap();
    assert_eq!(g.damage.len(), 1, "{:?}", g.damage);
    assert!(g.damage[0].contains(&a[10].loc.offset.to_string()));

    let r = repair(t.path(), 5).unwrap();
    assert_eq!(r.records_kept, 10);
    let (file, offset, _) = r.cut.clone().unwrap();
    assert_eq!((file, offset), (path.clone(), a[10].loc.offset));
    assert_eq!(r.segments_set_aside.len(), segs.len() - 1);
    assert!(r.to_string().contains("cut"), "{r}");
    let (mut j, rep, got) = open_collect(t.path(), 5, &o).unwrap();
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(got.len(), 10);
    let n = append_gen(&mut j, 10, 900);
    assert_eq!(n.seq, 11);
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let (_j, _, got) = open_collect(t.path(), 5, &o).unwrap();
    assert_eq!(got.len(), 11);
    // Repair of a sound group changes nothing.
    drop(_j);
    let r = repair(t.path(), 5).unwrap();
    assert!(r.cut.is_none(), "{r}");
}

/// Rewrites the header field at `at` and the header CRC (the layout of `journal/FORMAT.md`).
fn patch_header(path: &Path, at: u64, bytes: &[u8]) {
    write_at(path, at, bytes);
    let h = read_at(path, 0, 96);
    write_at(path, 96, &crc32c::crc32c(&h).to_le_bytes());
}

#[test]
fn a_header_of_another_partitioning_or_group_is_an_error_naming_the_file() {
    let t = TempDir::new("mismatch");
    let o = opts(1 << 16);
    let (mut j, _, _) = open_collect(t.path(), 2, &o).unwrap();
    append_gen(&mut j, 0, 10);
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let path = seg_path(t.path(), 2, 1);
    let orig = read_at(&path, 0, 100);

    // Group count 32 instead of 64.
    patch_header(&path, 20, &32u32.to_le_bytes());
    let e = open_collect(t.path(), 2, &o).err().unwrap();
    assert!(matches!(e, JournalError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert!(e.to_string().contains("32 groups"), "{e}");
    write_at(&path, 0, &orig);

    // Another partition function name.
    patch_header(&path, 64, b"sha1-something\0\0");
    let e = open_collect(t.path(), 2, &o).err().unwrap();
    assert!(matches!(e, JournalError::Mismatch { .. }), "{e}");
    write_at(&path, 0, &orig);

    // A segment of group 2 in group 9's directory.
    std::fs::create_dir_all(smp_journal::group_dir(t.path(), 9)).unwrap();
    let other = seg_path(t.path(), 9, 1);
    std::fs::copy(&path, &other).unwrap();
    let e = open_collect(t.path(), 9, &o).err().unwrap();
    assert!(e.to_string().contains(&other.display().to_string()), "{e}");
    assert!(e.to_string().contains("group 2"), "{e}");

    // A newer format version.
    patch_header(&path, 8, &4u32.to_le_bytes());
    let e = open_collect(t.path(), 2, &o).err().unwrap();
    assert!(matches!(e, JournalError::Header { .. }), "{e}");
    assert!(e.to_string().contains("version 4"), "{e}");
    // Version 1 (no header flags) is read; a version 1 header with flags is not.
    write_at(&path, 0, &orig);
    patch_header(&path, 8, &1u32.to_le_bytes());
    open_collect(t.path(), 2, &o).unwrap();
    patch_header(&path, 60, &1u32.to_le_bytes());
    let e = open_collect(t.path(), 2, &o).err().unwrap();
    assert!(e.to_string().contains("flags"), "{e}");
    write_at(&path, 0, &orig);
    open_collect(t.path(), 2, &o).unwrap();
}

#[test]
fn a_record_of_an_unknown_kind_is_an_error_not_a_torn_tail() {
    let t = TempDir::new("kind");
    let o = opts(1 << 16);
    let (mut j, _, _) = open_collect(t.path(), 0, &o).unwrap();
    append_gen(&mut j, 0, 10);
    let a = append_gen(&mut j, 1, 10);
    drop(j);
    let path = seg_path(t.path(), 0, 1);
    let len = a.end.offset - a.loc.offset;
    let mut rec = read_at(&path, a.loc.offset, len as usize);
    let payload_len = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
    rec[16..18].copy_from_slice(&999u16.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&rec[..28]), &rec[32..32 + payload_len]);
    rec[28..32].copy_from_slice(&crc.to_le_bytes());
    write_at(&path, a.loc.offset, &rec);
    let e = open_collect(t.path(), 0, &o).err().unwrap();
    assert!(
        matches!(e, JournalError::UnknownKind { kind: 999, offset, .. } if offset == a.loc.offset),
        "{e}"
    );
    assert!(e.to_string().contains("newer version"), "{e}");
}

#[test]
fn rotation_fills_segments_and_replays_across_them() {
    let t = TempDir::new("rotate");
    let o = opts(16 << 10);
    let (mut j, _, _) = open_collect(t.path(), 63, &o).unwrap();
    let a: Vec<_> = (0..120).map(|i| append_gen(&mut j, i, 900)).collect();
    let segs = j.segments();
    assert!(segs.len() >= 4, "{segs:?}");
    assert!(segs.last().unwrap().active);
    for w in segs.windows(2) {
        assert_eq!(w[0].id + 1, w[1].id);
    }
    for (i, x) in a.iter().enumerate() {
        assert_eq!(
            format!("{:?}", j.read(x.loc).unwrap().1),
            Gen::text(i as u64, 900)
        );
    }
    // Too large for any segment.
    let big = vec![0u8; 16 << 10];
    assert!(matches!(
        j.append(&Record::Checkpoint { data: &big }),
        Err(JournalError::TooLarge { .. })
    ));
    j.sync_handle().sync_to(a[60].end).unwrap();
    drop(j);
    let (_j, rep, got) = open_collect(t.path(), 63, &o).unwrap();
    assert_eq!(got.len(), 120);
    assert_eq!(rep.segments, segs.len());
    assert_eq!(rep.synced, a[60].end);
    let texts: Vec<_> = got.into_iter().map(|g| g.2).collect();
    let want: Vec<_> = (0..120).map(|i| Gen::text(i, 900)).collect();
    assert_eq!(texts, want);
}

#[test]
fn dead_segments_can_be_removed_but_never_the_active_one() {
    let t = TempDir::new("remove");
    let o = opts(16 << 10);
    let (mut j, _, _) = open_collect(t.path(), 4, &o).unwrap();
    let a: Vec<_> = (0..200).map(|i| append_gen(&mut j, i, 900)).collect();
    let segs = j.segments();
    assert!(segs.len() >= 4, "{segs:?}");
    let active = segs.last().unwrap().id;
    assert!(matches!(
        j.remove_segment(active),
        Err(JournalError::ActiveSegment(_))
    ));
    assert!(matches!(
        j.remove_segment(999),
        Err(JournalError::NoSuchSegment(999))
    ));
    // Oldest first, never one in the middle (the numbers of the segments left have no gap).
    assert!(matches!(
        j.remove_segment(3),
        Err(JournalError::NotOldest(3))
    ));
    j.remove_segment(1).unwrap();
    j.remove_segment(2).unwrap();
    assert!(!segs[0].path.exists());
    assert!(matches!(
        j.read(a[0].loc),
        Err(JournalError::BadLocation { .. })
    ));
    j.sync_handle().sync_all().unwrap();
    drop(j);
    let kept: Vec<_> = a
        .iter()
        .enumerate()
        .filter(|(_, x)| x.loc.segment > 2)
        .map(|(i, _)| Gen::text(i as u64, 900))
        .collect();
    let (mut j, rep, got) = open_collect(t.path(), 4, &o).unwrap();
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(got.into_iter().map(|g| g.2).collect::<Vec<_>>(), kept);
    assert_eq!(append_gen(&mut j, 200, 10).seq, 201);
}

#[test]
fn the_pread_reader_sees_what_the_mapping_replays() {
    let t = TempDir::new("reader");
    let o = opts(16 << 10);
    let (mut j, _, _) = open_collect(t.path(), 8, &o).unwrap();
    for i in 0..150 {
        append_gen(&mut j, i, 700);
    }
    j.sync_handle().sync_all().unwrap();
    // Read while the journal is open (as the tool does beside a running relay).
    let mut seen = Vec::new();
    let g = reader::read_group(t.path(), 8, |loc, seq, rec| {
        seen.push((loc, seq, format!("{rec:?}")));
        Ok(())
    })
    .unwrap();
    drop(j);
    let (_j, _, got) = open_collect(t.path(), 8, &o).unwrap();
    assert_eq!(seen, got);
    assert!(g.damage.is_empty(), "{:?}", g.damage);
    assert_eq!(g.records, 150);
    assert_eq!(g.by_kind.values().sum::<u64>(), 150);
    assert_eq!(g.segments.len(), _j.segments().len());
    assert_eq!(reader::list_groups(t.path()).unwrap(), vec![8]);
}

#[test]
fn syncs_from_another_thread_while_appends_go_on() {
    let t = TempDir::new("thread");
    let o = opts(64 << 10);
    let (mut j, _, _) = open_collect(t.path(), 6, &o).unwrap();
    let h = j.sync_handle();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<SyncPoint>();
    let syncer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            loop {
                // Alternately what the appender asks for and everything so far.
                if let Ok(p) = rx.try_recv() {
                    assert!(h.sync_to(p).unwrap() >= p);
                } else {
                    h.sync_all().unwrap();
                }
                n += 1;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            h.sync_all().unwrap();
            n
        })
    };
    let mut last = None;
    for i in 0..2000 {
        let a = append_gen(&mut j, i, 400);
        if i % 50 == 0 {
            tx.send(a.end).unwrap();
        }
        last = Some(a);
    }
    stop.store(true, Ordering::Relaxed);
    let syncs = syncer.join().unwrap();
    assert!(syncs > 0);
    assert_eq!(j.synced(), last.unwrap().end);
    assert!(j.segments().iter().all(|s| s.synced_end == s.written_end));
    drop(j);
    let (_j, rep, got) = open_collect(t.path(), 6, &o).unwrap();
    assert_eq!(got.len(), 2000);
    assert_eq!(rep.synced, last.unwrap().end);
}

/// Random appends and syncs, then the file cut after the synced offset (zeros from a random
/// point, as if later writes never reached the disk, or random garbage at a random point, as
/// a torn write): everything up to the synced offset survives and the replay is a prefix of
/// what was appended.
#[test]
fn random_crash_cuts_past_the_synced_offset_keep_everything_synced() {
    for seed in 0..30u64 {
        let t = TempDir::new("cut");
        let o = opts(8 << 10);
        let mut rng = splitmix(seed * 1000 + 7);
        let mut next = || {
            rng = splitmix(rng);
            rng
        };
        let (mut j, _, _) = open_collect(t.path(), 0, &o).unwrap();
        let h = j.sync_handle();
        let n = 20 + next() % 80;
        let mut a = Vec::new();
        for i in 0..n {
            a.push(append_gen(&mut j, seed * 10_000 + i, 600));
            if next() % 16 == 0 {
                h.sync_to(a.last().unwrap().end).unwrap();
            }
        }
        let synced = h.synced();
        let written = j.written();
        let segs = j.segments();
        drop((j, h));
        let durable = a.iter().filter(|x| x.end <= synced).count();

        // Cut in the active segment, past its synced offset (and drop any later segment file
        // that holds nothing durable, as a lost rotation would).
        let last = segs.last().unwrap();
        let from = last.synced_end.max(HEADER_LEN);
        let path = last.path.clone();
        let span = (written.offset.max(from) + 200).min(last.len) - from;
        let at = from + next() % span.max(1);
        if next() % 2 == 0 {
            write_at(&path, at, &vec![0u8; (last.len - at) as usize]);
        } else {
            let junk: Vec<u8> = (0..1 + next() % 100).map(|_| next() as u8).collect();
            let m = junk.len().min((last.len - at) as usize);
            write_at(&path, at, &junk[..m]);
        }
        if segs.len() > 1 && last.synced_end == HEADER_LEN && next() % 3 == 0 {
            std::fs::remove_file(&path).unwrap();
        }

        let (mut j, rep, got) =
            open_collect(t.path(), 0, &o).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(
            got.len() >= durable,
            "seed {seed}: {} < {durable}",
            got.len()
        );
        for (k, (loc, seq, text)) in got.iter().enumerate() {
            assert_eq!(*loc, a[k].loc, "seed {seed}");
            assert_eq!(*seq, k as u64 + 1, "seed {seed}");
            assert_eq!(
                *text,
                Gen::text(seed * 10_000 + k as u64, 600),
                "seed {seed}"
            );
        }
        assert!(rep.synced >= synced || durable == 0, "seed {seed}");
        // The journal goes on from the cut, and a second open agrees.
        let more = append_gen(&mut j, 1, 50);
        assert_eq!(more.seq, got.len() as u64 + 1);
        j.sync_handle().sync_all().unwrap();
        drop(j);
        let (_j, rep2, got2) = open_collect(t.path(), 0, &o).unwrap();
        assert_eq!(got2.len(), got.len() + 1, "seed {seed}");
        assert!(rep2.warnings.is_empty(), "seed {seed}: {:?}", rep2.warnings);
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes: the test binary runs itself in a mode chosen by an environment variable.

const CHILD_ENV: &str = "SMP_JOURNAL_TEST_CHILD";
const CHILD_DIR_ENV: &str = "SMP_JOURNAL_TEST_DIR";

fn spawn_child(mode: &str, dir: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .env(CHILD_DIR_ENV, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Not a test of its own: the body of the child processes below. Without the environment
/// variable it does nothing.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(CHILD_DIR_ENV).unwrap());
    match mode.as_str() {
        "append-forever" => child_append_forever(&dir),
        "no-space" => child_no_space(&dir),
        m => panic!("unknown child mode {m}"),
    }
}

/// Appends record `i` (from `Gen`) forever with a sync thread, printing `synced N` once records
/// 1..=N are durable.
fn child_append_forever(dir: &Path) {
    use std::io::Write;
    let (mut j, _, _) = open_collect(dir, 11, &opts(32 << 10)).unwrap();
    let h = j.sync_handle();
    // Bounded, so that the appender stays a few batches ahead of the syncs (as a relay that
    // answers only after its records are durable) instead of filling the disk.
    let (tx, rx) = std::sync::mpsc::sync_channel::<(SyncPoint, u64)>(4);
    std::thread::spawn(move || {
        let out = std::io::stdout();
        while let Ok((p, seq)) = rx.recv() {
            h.sync_to(p).unwrap();
            let mut o = out.lock();
            writeln!(o, "synced {seq}").unwrap();
            o.flush().unwrap();
        }
    });
    for i in 0.. {
        let a = append_gen(&mut j, i, 500);
        if i % 7 == 0 {
            tx.send((a.end, a.seq)).unwrap();
        }
        if i % 64 == 0 {
            std::thread::yield_now();
        }
    }
}

#[test]
fn a_child_killed_mid_append_keeps_every_record_it_reported_synced() {
    for round in 0..2 {
        let t = TempDir::new("sigkill");
        let mut child = spawn_child("append-forever", t.path());
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut reported = 0u64;
        let mut lines = 0;
        for line in out.lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("synced ") {
                reported = n.parse().unwrap();
                lines += 1;
                if lines >= 10 + round * 15 {
                    break;
                }
            }
        }
        // SAFETY-free: kill(2) through the standard library sends SIGKILL.
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(reported > 0);
        let (_j, rep, got) = open_collect(t.path(), 11, &opts(32 << 10)).unwrap();
        assert!(
            got.len() as u64 >= reported,
            "round {round}: {} records, {reported} reported synced ({:?})",
            got.len(),
            rep.warnings
        );
        for (k, (_, seq, text)) in got.iter().enumerate() {
            assert_eq!(*seq, k as u64 + 1);
            assert_eq!(*text, Gen::text(k as u64, 500));
        }
        eprintln!(
            "round {round}: {reported} records reported synced, {} replayed, {} segments",
            got.len(),
            rep.segments
        );
    }
}

/// Lowers the file size limit so that no new segment can be preallocated (EFBIG, as a full disk
/// gives ENOSPC), appends until `NoSpace`, raises it again and goes on.
fn child_no_space(dir: &Path) {
    let seg = 16u64 << 10;
    let set_limit = |bytes: u64| {
        let lim = libc::rlimit {
            rlim_cur: bytes,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: plain syscall with a valid pointer to a local struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &lim) }, 0);
    };
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let (mut j, _, _) = open_collect(dir, 12, &opts(seg)).unwrap();
    set_limit(seg / 2);
    let mut n = 0u64;
    let err = loop {
        match j.append(&Gen::new(n, 800).rec()) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, JournalError::NoSpace { .. }), "{err}");
    assert!(n > 0);
    // Still no room: the same error, nothing appended.
    assert!(matches!(
        j.append(&Gen::new(n, 800).rec()),
        Err(JournalError::NoSpace { .. })
    ));
    j.sync_handle().sync_all().unwrap();
    set_limit(libc::RLIM_INFINITY);
    for k in 0..30 {
        j.append(&Gen::new(n + k, 800).rec()).unwrap();
    }
    j.sync_handle().sync_all().unwrap();
    assert!(j.segments().len() > 1);
    drop(j);
    let (_j, rep, got) = open_collect(dir, 12, &opts(seg)).unwrap();
    assert!(rep.warnings.is_empty(), "{:?}", rep.warnings);
    assert_eq!(got.len() as u64, n + 30);
    let leftovers: Vec<_> = std::fs::read_dir(smp_journal::group_dir(dir, 12))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    println!("no-space child ok");
}

#[test]
fn a_full_disk_is_no_space_at_rotation_and_the_journal_goes_on_after() {
    let t = TempDir::new("nospace");
    let child = spawn_child("no-space", t.path());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed:\n{stdout}");
    assert!(stdout.contains("no-space child ok"), "{stdout}");
}

/// A group's first segment is small and each later one twice the last, up to the segment size,
/// and a record larger than the next size gets a segment that fits it.
#[test]
fn segments_grow_from_the_initial_size() {
    let dir = TempDir::new("grow");
    let o = Options {
        segment_size: 64 << 10,
        initial_segment_size: 8 << 10,
        ..Options::default()
    };
    let (mut j, _) = Journal::open(dir.path(), 3, &o, |_, _, _| Ok(())).unwrap();
    let body = vec![1u8; 3000];
    let id = [0u8; 24];
    for _ in 0..60 {
        j.append(&Record::MsgAppend {
            recipient_id: b"q",
            msg_id: &id,
            ts: 1,
            flags: 0,
            body: &body,
        })
        .unwrap();
    }
    let sizes: Vec<u64> = j.segments().iter().map(|s| s.len).collect();
    assert_eq!(
        sizes[..4],
        [8 << 10, 16 << 10, 32 << 10, 64 << 10],
        "{sizes:?}"
    );
    assert!(sizes[4..].iter().all(|s| *s == 64 << 10), "{sizes:?}");
    // In another group, a first record larger than the second segment's doubled size.
    let (mut j2, _) = Journal::open(dir.path(), 4, &o, |_, _, _| Ok(())).unwrap();
    let big = vec![2u8; 20_000];
    j2.append(&Record::MsgAppend {
        recipient_id: b"q",
        msg_id: &id,
        ts: 1,
        flags: 0,
        body: &big,
    })
    .unwrap();
    let sizes: Vec<u64> = j2.segments().iter().map(|s| s.len).collect();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(
        sizes[1] > 16 << 10 && sizes[1] < 64 << 10,
        "fits the record, not the maximum: {sizes:?}"
    );
}

#[test]
fn the_reader_calls_a_torn_tail_before_non_durable_segments_a_warning_as_open_does() {
    let t = TempDir::new("torn-rotated");
    let o = opts(1 << 14);
    let (mut j, _, _) = open_collect(t.path(), 2, &o).unwrap();
    let a: Vec<_> = (0..150).map(|i| append_gen(&mut j, i, 900)).collect();
    assert!(a.last().unwrap().loc.segment >= 3, "rotated");
    // Durable up to record 2 only; records in segment 1 after it and every later segment are not.
    j.sync_handle().sync_to(a[2].end).unwrap();
    drop(j);
    let torn = a
        .iter()
        .position(|x| x.loc.segment == 1 && x.seq > 4)
        .unwrap();
    let path = seg_path(t.path(), 2, 1);
    let off = a[torn].loc.offset + RECORD_PAYLOAD_BYTE;
    let b = read_at(&path, off, 1);
    write_at(&path, off, &[b[0] ^ 1]);
    let g = reader::read_group(t.path(), 2, |_, _, _| Ok(())).unwrap();
    assert!(g.damage.is_empty(), "{:?}", g.damage);
    assert_eq!(g.warnings.len(), 1, "{:?}", g.warnings);
    assert!(g.warnings[0].contains("torn tail"), "{:?}", g.warnings);
    assert!(
        g.warnings[0].contains(&a[torn].loc.offset.to_string()),
        "{:?}",
        g.warnings
    );
    // Open agrees: the tail is cut and the later segments removed, no damage.
    let (_j, rep, got) = open_collect(t.path(), 2, &o).unwrap();
    assert_eq!(got.len(), torn);
    assert!(!rep.warnings.is_empty());
}
