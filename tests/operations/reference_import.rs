//! `smp-relay store import-reference` (`src/store/reference/`, `docs/ARCHITECTURE.md` §5): the
//! reference smp-server's data files, written here in its formats with keys this test holds, are
//! imported into the journal, memory and PostgreSQL stores, and a relay started on the data
//! directory serves them over SMP as the reference would: every message with its ID, time, flags
//! and body in order, the quota marker closing its queue, the notifier's pending notifications, a
//! contact address's link data, blocked and suspended queues. A start on the reference's files
//! without an import is refused, naming the import; an unparseable line is reported with its file
//! and line.

use crate::common;
use crate::reference_data;

use std::path::Path;

use common::TempDir;
use reference_data::*;
use smp_relay::crypto::hash::b64url;

/// The memory store's files (store log, message log, notification log) into the journal store,
/// in the data directory the reference's files are in: before the import a start is refused,
/// naming the import; after it the relay serves everything and warns that the reference's files
/// are not read.
#[test]
fn the_reference_memory_store_moves_into_the_journal_store() {
    let dir = data_dir("ref-journal");
    let f = write_fixture(dir.path(), Messages::Log);

    let port = common::free_port().to_string();
    let (ok, out) = cli(
        dir.path(),
        &["start", "--port", &port, "--store", "journal"],
    );
    assert!(
        !ok,
        "a start beside the reference's files without an import"
    );
    assert!(
        out.contains("holds the reference smp-server's data")
            && out.contains(&format!(
                "smp-relay --log-dir {} store import-reference --store journal",
                dir.path().display()
            )),
        "the refusal names the import: {out}"
    );

    let out = import(dir.path(), &["--store", "journal"]);
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    let log = dir.path().join("smp-server-store.log");
    assert!(
        out.contains(&format!("{}:{BAD_LINE}: ", log.display())),
        "the unparseable line with its number: {out}"
    );
    assert!(
        out.contains("1 lines skipped as unparseable, 2 records left out"),
        "{out}"
    );
    assert!(out.contains("which the store log does not hold"), "{out}");
    assert!(
        dir.path().join("smp-server-messages.log").is_file(),
        "the reference's files stay"
    );
    let (ok, out) = cli(dir.path(), &["store", "import-reference"]);
    assert!(
        !ok && out.contains("already holds"),
        "a second import: {out}"
    );

    let mut relay = start(dir, &["--store", "journal"]);
    check_served(&relay, &f, true);
    assert!(
        relay.log_shows("also holds the reference smp-server's data"),
        "{}",
        relay.log_text()
    );
    let status = relay.stop();
    assert!(status.success());
}

/// The journal store's directory `messages/` into the memory store, read from another directory
/// (`--from`), after an interrupted compaction (`smp-server-store.log.start` is the complete log);
/// a journal's acknowledged lines before the read position are not imported.
#[test]
fn the_reference_journal_store_moves_into_the_memory_store() {
    let from = TempDir::new("ref-from").expect("a temp dir");
    let f = write_fixture(from.path(), Messages::Journal);
    let log = from.path().join("smp-server-store.log");
    let start_file = from.path().join("smp-server-store.log.start");
    std::fs::rename(&log, &start_file).expect("rename");
    std::fs::write(&log, "CREATE rid=").expect("a compaction cut short");
    let dir = data_dir("ref-memory");
    let out = import(
        dir.path(),
        &["--store", "memory", "--from", from.path().to_str().unwrap()],
    );
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    assert!(
        out.contains(&format!("queues from {}", start_file.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "messages from {}",
            from.path().join("messages").display()
        )),
        "{out}"
    );
    let relay = start(dir, &["--store", "memory"]);
    check_served(&relay, &f, true);
}

/// Into PostgreSQL, as `store import` goes there.
#[test]
fn the_reference_data_moves_into_postgres() {
    let dir = data_dir("ref-pg");
    let f = write_fixture(dir.path(), Messages::Log);
    let database = common::pg_database();
    let out = import(
        dir.path(),
        &["--store", "postgres", "--database", &database],
    );
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    let relay = start(dir, &["--store", "postgres", "--database", &database]);
    check_served(&relay, &f, false);
}

/// Both message stores' files present: the reference starts on neither, and nothing is imported.
#[test]
fn both_message_stores_present_are_refused() {
    let dir = data_dir("ref-both");
    write_fixture(dir.path(), Messages::Log);
    std::fs::create_dir_all(dir.path().join("messages")).expect("messages/");
    let (ok, out) = cli(dir.path(), &["store", "import-reference"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("holds both smp-server-messages.log and messages/"),
        "{out}"
    );
    let empty = TempDir::new("ref-none").expect("a temp dir");
    let (ok, out) = cli(
        dir.path(),
        &[
            "store",
            "import-reference",
            "--from",
            empty.path().to_str().unwrap(),
        ],
    );
    assert!(
        !ok && out.contains("holds none of the reference smp-server's files"),
        "{out}"
    );
}

/// The way back: `store export-reference` writes the reference's files, whose message and
/// notification lines are the ones imported, and which import again into the same store (the
/// `store export` streams are the same bytes).
#[test]
fn export_reference_gives_back_what_was_imported() {
    let dir = data_dir("ref-back");
    write_fixture(dir.path(), Messages::Log);
    import(dir.path(), &["--store", "journal"]);
    let files = TempDir::new("ref-back-files").expect("a temp dir");
    let stream = |d: &Path, store: &str, name: &str| {
        let out = files.path().join(name);
        let (ok, text) = cli(
            d,
            &[
                "store",
                "export",
                "--store",
                store,
                "--output",
                out.to_str().unwrap(),
            ],
        );
        assert!(ok, "{text}");
        std::fs::read(&out).expect("the stream")
    };
    let first = stream(dir.path(), "journal", "first.smpx");
    let back = TempDir::new("ref-back-to").expect("a temp dir");
    let (ok, out) = cli(
        dir.path(),
        &[
            "store",
            "export-reference",
            "--to",
            back.path().to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("exported 4 queues, 6 messages, 2 notifications, 1 services"),
        "{out}"
    );

    // The message and notification lines are the reference's own, those of live queues.
    let mut imported = read_lines(&dir.path().join("smp-server-messages.log"));
    imported.retain(|l| !l.ends_with(&b64url(b"lost")));
    assert_eq!(
        read_lines(&back.path().join("smp-server-messages.log")),
        imported
    );
    assert_eq!(
        read_lines(&back.path().join("smp-server-ntfs.log")),
        read_lines(&dir.path().join("smp-server-ntfs.log"))
    );
    // The reference reads a blocking notice to the end of its line: the service goes after it.
    let log = read_lines(&back.path().join("smp-server-store.log"));
    assert_eq!(log.iter().filter(|l| l.starts_with("CREATE ")).count(), 4);
    assert_eq!(
        log.iter().filter(|l| l.starts_with("NEW_SERVICE ")).count(),
        1
    );
    assert!(
        log.iter().any(|l| l.starts_with("QUEUE_SERVICE ")
            && l.ends_with(&format!(" R {}", b64url(&SERVICE_ID)))),
        "{log:?}"
    );
    let (ok, out) = cli(
        dir.path(),
        &[
            "store",
            "export-reference",
            "--to",
            back.path().to_str().unwrap(),
        ],
    );
    assert!(
        !ok && out.contains("exists"),
        "never over the reference's files: {out}"
    );

    let again = data_dir("ref-back-again");
    let out = import(
        again.path(),
        &["--store", "memory", "--from", back.path().to_str().unwrap()],
    );
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    assert!(
        out.contains("0 lines skipped as unparseable, 0 records left out"),
        "{out}"
    );
    assert!(
        stream(again.path(), "memory", "second.smpx") == first,
        "the same store after the way back and forth"
    );
}
