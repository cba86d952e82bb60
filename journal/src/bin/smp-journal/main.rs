//! `smp-journal`: inspect, verify and repair the journals of an smp-relay data directory
//! (`<data-dir>/journal/gNN/seg-*.jnl`).
//!
//! Reading commands (`stats`, `queues`, `show`, `verify`) read the segment files with `pread`
//! (`smp_journal::reader`), never map them and take no lock, so they run beside a running relay:
//! they see every record up to the end written so far, and call a bad record past a segment's
//! synced offset a torn tail (a warning), never damage. `repair` and `compact` take the data
//! directory's lock, so they refuse while a relay runs there.
//!
//! What the records say (queues, messages, notifications, records that contradict each other) is
//! `smp_journal::check`'s index, by the relay's replay rules; `repair` is `smp_journal::repair`.
//!
//! Exit codes: 0 done (for `verify`: clean), 1 damage or inconsistent records found (or the queue
//! `show` asks for has no record), 2 usage or I/O error (and `compact`, not written yet).

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use smp_journal::check::{self, b64, Index, MAX_ISSUES};
use smp_journal::reader::{self, GroupReport, SegmentEnd};
use smp_journal::{group_of, partition_of, Kind, Location, HEADER_LEN};

#[derive(Parser)]
#[command(
    name = "smp-journal",
    version,
    about = "Inspect, verify and repair the journals of an smp-relay data directory",
    long_about = "Inspect, verify and repair the journals of an smp-relay data directory \
                  (<data-dir>/journal/gNN/seg-*.jnl).\n\nstats, queues, show and verify read \
                  with pread and take no lock: they run beside a running relay. repair and \
                  compact take the data directory's lock and refuse while a relay runs.\n\nExit \
                  codes: 0 done (verify: clean), 1 damage or inconsistent records found, 2 usage \
                  or I/O error."
)]
struct Cli {
    /// The relay's data directory; its journals are in DIR/journal.
    #[arg(long, value_name = "DIR", global = true, default_value = "./smp-data")]
    data_dir: PathBuf,
    /// The journal directory itself (the one holding g00 … g63), instead of DATA_DIR/journal.
    #[arg(long, value_name = "DIR", global = true)]
    journal_dir: Option<PathBuf>,
    /// No progress line on stderr (it is shown only when stderr is a terminal anyway).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Per group and in total: live queues and messages, bytes, segments, records, synced
    /// offsets, damage.
    Stats {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One line per live queue: recipient ID, messages, oldest and newest message age, group.
    Queues {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A queue's records and its live messages (recipient ID in base64url).
    Show {
        /// The queue's recipient ID, base64url (padding optional; it may start with '-').
        #[arg(allow_hyphen_values = true)]
        queue_id: String,
        /// Print message bodies too (hex unless base64 is asked for).
        #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "hex")]
        bodies: Option<BodyFormat>,
    },
    /// Check every record's CRC and chain, and the records against each other; exit 0 when
    /// clean, 1 on damage. Runs beside a running relay.
    Verify {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Repair every damaged group (the relay must be stopped): cut it at its first bad record
    /// or missing segment, extend a segment file that was cut short, accept a missing first or
    /// last segment; says what was lost, per queue and notifier.
    Repair,
    /// Say how journals are compacted: by the relay, in the background (nothing is changed).
    Compact,
}

#[derive(Clone, Copy, ValueEnum)]
enum BodyFormat {
    Hex,
    Base64,
}

/// What ends a command early.
enum Fail {
    /// An error: said on stderr, exit code 2.
    Msg(String),
    /// Standard output was closed by its reader (`smp-journal queues | head`): the command ends
    /// quietly, with the status of a Unix tool that SIGPIPE ended (128 + 13). Rust ignores
    /// SIGPIPE, so the write fails with `EPIPE` instead.
    BrokenPipe,
}

/// The exit status of a command whose output was closed (`Fail::BrokenPipe`).
const BROKEN_PIPE_EXIT: u8 = 128 + libc::SIGPIPE as u8;

impl<E: std::fmt::Display + 'static> From<E> for Fail {
    fn from(e: E) -> Fail {
        let any = &e as &dyn std::any::Any;
        let kind = any
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| any.downcast_ref::<serde_json::Error>()?.io_error_kind());
        if kind == Some(std::io::ErrorKind::BrokenPipe) {
            return Fail::BrokenPipe;
        }
        Fail::Msg(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = match &cli.journal_dir {
        Some(j) => j.clone(),
        None => cli.data_dir.join("journal"),
    };
    let progress = Progress::new(!cli.quiet && std::io::stderr().is_terminal());
    let r = match &cli.cmd {
        Cmd::Stats { json } => stats(&root, &progress, *json),
        Cmd::Queues { json } => queues(&root, &progress, *json),
        Cmd::Show { queue_id, bodies } => show(&root, queue_id, *bodies),
        Cmd::Verify { json } => verify(&root, &progress, *json),
        Cmd::Repair => repair(&cli, &root, &progress),
        Cmd::Compact => compact(&cli, &root),
    };
    progress.clear();
    match r {
        Ok(code) => ExitCode::from(code),
        Err(Fail::Msg(msg)) => {
            eprintln!("smp-journal: {msg}");
            ExitCode::from(2)
        }
        Err(Fail::BrokenPipe) => ExitCode::from(BROKEN_PIPE_EXIT),
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Base64url with or without padding, as the relay's command line takes IDs.
fn b64_decode(text: &str) -> Option<Vec<u8>> {
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(text.trim()).ok()
}

/// "\r group 12/64" on stderr while groups are read, when it is a terminal.
struct Progress {
    on: bool,
}

impl Progress {
    fn new(on: bool) -> Progress {
        Progress { on }
    }
    fn step(&self, i: usize, n: usize) {
        if self.on {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r group {}/{n}", i + 1);
            let _ = e.flush();
        }
    }
    fn clear(&self) {
        if self.on {
            eprint!("\r{:20}\r", "");
        }
    }
}

fn groups(root: &Path) -> Result<Vec<u32>, Fail> {
    if !root.is_dir() {
        return Err(Fail::Msg(format!(
            "no journal directory at {} (give --data-dir or --journal-dir)",
            root.display()
        )));
    }
    Ok(reader::list_groups(root)?)
}

/// One group read: the reader's report and what the records say.
struct Group {
    report: GroupReport,
    index: Index,
}

fn read_group(root: &Path, g: u32, want: Option<(Vec<u8>, bool)>) -> Result<Group, Fail> {
    let (report, index) = check::check_group(root, g, want)?;
    Ok(Group { report, index })
}

/// Reads every group; `f` gets each as it is read (so that only one group's index is in memory
/// at a time).
fn each_group(
    root: &Path,
    progress: &Progress,
    mut f: impl FnMut(Group) -> Result<(), Fail>,
) -> Result<(), Fail> {
    let gs = groups(root)?;
    for (i, &g) in gs.iter().enumerate() {
        progress.step(i, gs.len());
        f(read_group(root, g, None)?)?;
    }
    progress.clear();
    Ok(())
}

/// The durable point of a group: the last segment with records synced, and its synced offset.
fn synced_point(r: &GroupReport) -> Option<Location> {
    r.segments
        .iter()
        .rev()
        .find(|s| s.synced_end > HEADER_LEN)
        .map(|s| Location {
            segment: s.id,
            offset: s.synced_end,
        })
}

/// The end of the records so far: the last segment and the end of its last valid record.
fn written_point(r: &GroupReport) -> Option<Location> {
    r.segments.last().map(|s| Location {
        segment: s.id,
        offset: s.end,
    })
}

fn point_text(p: Option<Location>) -> String {
    p.map_or("-".into(), |p| format!("{}:{}", p.segment, p.offset))
}

fn point_json(p: Option<Location>) -> Value {
    p.map_or(
        Value::Null,
        |p| json!({"segment": p.segment, "offset": p.offset}),
    )
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// An age in seconds as "45s", "12m05s", "3h07m", "21d04h".
fn age_text(secs: i64) -> String {
    if secs < 0 {
        return format!("{}s in the future", -secs);
    }
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if secs < 60 {
        format!("{s}s")
    } else if secs < 3600 {
        format!("{m}m{s:02}s")
    } else if secs < 86400 {
        format!("{}h{m:02}m", secs / 3600)
    } else {
        format!("{d}d{h:02}h")
    }
}

/// Unix seconds as UTC, `2024-05-01T12:00:00Z`.
fn utc_text(ts: i64) -> String {
    let days = ts.div_euclid(86400);
    let secs = ts.rem_euclid(86400);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Message flags as the relay sets them: bit 0 notification, bit 1 quota marker.
fn flags_text(f: u8) -> String {
    let mut parts = Vec::new();
    if f & 1 != 0 {
        parts.push("ntf".to_string());
    }
    if f & 2 != 0 {
        parts.push("quota".to_string());
    }
    if f & !3 != 0 {
        parts.push(format!("0x{:02x}", f & !3));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

/// A record's place, relative to the journal directory: `g05/seg-000000001.jnl @ 4096`.
fn loc_text(g: u32, loc: Location) -> String {
    format!(
        "g{g:02}/{} @ {}",
        smp_journal::segment_file_name(loc.segment),
        loc.offset
    )
}

fn print_json(v: &Value) -> Result<(), Fail> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// stats

/// The numbers of one group or of all.
#[derive(Default)]
struct Counts {
    queues: u64,
    messages: u64,
    message_bytes: u64,
    notifications: u64,
    segments: u64,
    records: u64,
    record_bytes: u64,
    file_bytes: u64,
    damage: u64,
    inconsistent: u64,
    warnings: u64,
}

impl Counts {
    fn of(g: &Group) -> Counts {
        Counts {
            queues: g.index.queues.len() as u64,
            messages: g.index.messages(),
            message_bytes: g.index.message_bytes(),
            notifications: g.index.notifications(),
            segments: g.report.segments.len() as u64,
            records: g.report.records,
            record_bytes: g.report.record_bytes,
            file_bytes: g.report.file_bytes,
            damage: g.report.damage.len() as u64,
            inconsistent: g.index.issue_count,
            warnings: g.report.warnings.len() as u64,
        }
    }
    fn add(&mut self, o: &Counts) {
        self.queues += o.queues;
        self.messages += o.messages;
        self.message_bytes += o.message_bytes;
        self.notifications += o.notifications;
        self.segments += o.segments;
        self.records += o.records;
        self.record_bytes += o.record_bytes;
        self.file_bytes += o.file_bytes;
        self.damage += o.damage;
        self.inconsistent += o.inconsistent;
        self.warnings += o.warnings;
    }
    fn json(&self) -> Value {
        json!({
            "queues": self.queues,
            "messages": self.messages,
            "message_bytes": self.message_bytes,
            "notifications": self.notifications,
            "segments": self.segments,
            "records": self.records,
            "record_bytes": self.record_bytes,
            "file_bytes": self.file_bytes,
            "damage": self.damage,
            "inconsistent": self.inconsistent,
            "warnings": self.warnings,
        })
    }
    fn row(&self, name: &str, synced: &str, written: &str) -> String {
        format!(
            "{name:<6} {:>8} {:>9} {:>13} {:>6} {:>5} {:>9} {:>13} {:>13} {:>18} {:>18} {:>6} {:>6}",
            self.queues,
            self.messages,
            self.message_bytes,
            self.notifications,
            self.segments,
            self.records,
            self.record_bytes,
            self.file_bytes,
            synced,
            written,
            self.damage + self.inconsistent,
            self.warnings
        )
    }
}

const STATS_HEADER: &str =
    "group    queues  messages message-bytes   ntfs  segs   records  record-bytes    \
                            file-bytes   synced (seg:off)  written (seg:off) damage  warns";

fn problems_of(g: &Group) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for d in &g.report.damage {
        out.push(("damage", d.clone()));
    }
    for i in &g.index.issues {
        out.push(("inconsistent", i.clone()));
    }
    if g.index.issue_count > g.index.issues.len() as u64 {
        out.push((
            "inconsistent",
            format!(
                "group {}: {} more inconsistent records (the first {MAX_ISSUES} are listed)",
                g.index.group,
                g.index.issue_count - g.index.issues.len() as u64
            ),
        ));
    }
    for w in &g.report.warnings {
        out.push(("warning", w.clone()));
    }
    out
}

fn stats(root: &Path, progress: &Progress, as_json: bool) -> Result<u8, Fail> {
    let mut total = Counts::default();
    let mut by_kind = std::collections::BTreeMap::<Kind, u64>::new();
    let mut rows = Vec::new();
    let mut problems = Vec::new();
    let mut groups_json = Vec::new();
    each_group(root, progress, |g| {
        let c = Counts::of(&g);
        total.add(&c);
        for (k, n) in &g.report.by_kind {
            *by_kind.entry(*k).or_insert(0) += n;
        }
        let (synced, written) = (synced_point(&g.report), written_point(&g.report));
        rows.push(c.row(
            &format!("g{:02}", g.index.group),
            &point_text(synced),
            &point_text(written),
        ));
        let p = problems_of(&g);
        if as_json {
            let mut v = c.json();
            v["group"] = json!(g.index.group);
            v["synced"] = point_json(synced);
            v["written"] = point_json(written);
            v["records_by_kind"] = kinds_json(&g.report.by_kind);
            v["segment_list"] = Value::Array(
                g.report
                    .segments
                    .iter()
                    .map(|s| {
                        json!({
                            "segment": s.id,
                            "file": s.path.display().to_string(),
                            "len": s.len,
                            "first_seq": s.first_seq,
                            "synced_end": s.synced_end,
                            "end": s.end,
                            "records": s.records,
                            "stop": stop_text(&s.stop),
                        })
                    })
                    .collect(),
            );
            v["problems"] = problems_json(&p);
            groups_json.push(v);
        }
        problems.extend(p);
        Ok(())
    })?;
    if as_json {
        let mut t = total.json();
        t["records_by_kind"] = kinds_json(&by_kind);
        print_json(&json!({
            "journal": root.display().to_string(),
            "groups": groups_json,
            "total": t,
        }))?;
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "journal {}: {} groups", root.display(), rows.len())?;
    writeln!(out, "{STATS_HEADER}")?;
    for r in &rows {
        writeln!(out, "{r}")?;
    }
    writeln!(out, "{}", total.row("total", "-", "-"))?;
    let kinds: Vec<String> = by_kind
        .iter()
        .map(|(k, n)| format!("{} {n}", k.name()))
        .collect();
    writeln!(
        out,
        "records by kind: {}",
        if kinds.is_empty() {
            "none".into()
        } else {
            kinds.join(", ")
        }
    )?;
    writeln!(
        out,
        "queues: live (created, not deleted); messages: appended, not deleted; ntfs: \
         notifications appended minus deleted since each notifier's last clear; damage: damaged \
         or inconsistent records (run `smp-journal verify`)"
    )?;
    for (what, msg) in &problems {
        writeln!(out, "{what}: {msg}")?;
    }
    Ok(0)
}

fn kinds_json(m: &std::collections::BTreeMap<Kind, u64>) -> Value {
    Value::Object(
        m.iter()
            .map(|(k, n)| (k.name().to_string(), json!(n)))
            .collect(),
    )
}

fn problems_json(p: &[(&'static str, String)]) -> Value {
    Value::Array(
        p.iter()
            .map(|(what, msg)| json!({"kind": what, "message": msg}))
            .collect(),
    )
}

fn stop_text(s: &SegmentEnd) -> String {
    match s {
        SegmentEnd::Full => "full".into(),
        SegmentEnd::Zeros { offset } => format!("zeros at {offset}"),
        SegmentEnd::Torn { offset, reason } => format!("torn tail at {offset}: {reason}"),
        SegmentEnd::Damage { offset, reason } => format!("damage at {offset}: {reason}"),
    }
}

// ---------------------------------------------------------------------------------------------
// queues

fn queues(root: &Path, progress: &Progress, as_json: bool) -> Result<u8, Fail> {
    let now = now();
    let mut lines = Vec::new();
    let mut items = Vec::new();
    each_group(root, progress, |g| {
        let mut qs: Vec<(String, &check::Queue)> =
            g.index.queues.iter().map(|(id, q)| (b64(id), q)).collect();
        qs.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, q) in qs {
            let oldest = q.oldest().map(|m| now - m.ts);
            let newest = q.newest().map(|m| now - m.ts);
            if as_json {
                items.push(json!({
                    "recipient_id": id,
                    "messages": q.msgs.len(),
                    "message_bytes": q.msg_bytes,
                    "oldest_age_secs": oldest,
                    "newest_age_secs": newest,
                    "group": g.index.group,
                }));
            } else {
                lines.push(format!(
                    "{id:<46} {:>8} {:>12} {:>12}  g{:02}",
                    q.msgs.len(),
                    oldest.map_or("-".into(), age_text),
                    newest.map_or("-".into(), age_text),
                    g.index.group
                ));
            }
        }
        Ok(())
    })?;
    if as_json {
        print_json(&Value::Array(items))?;
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<46} {:>8} {:>12} {:>12}  group",
        "recipient-id", "messages", "oldest", "newest"
    )?;
    for l in &lines {
        writeln!(out, "{l}")?;
    }
    writeln!(out, "{} live queues", lines.len())?;
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// show

fn show(root: &Path, queue_id: &str, bodies: Option<BodyFormat>) -> Result<u8, Fail> {
    let id = b64_decode(queue_id)
        .filter(|id| !id.is_empty() && id.len() <= 255)
        .ok_or_else(|| Fail::Msg(format!("{queue_id:?} is not a base64url recipient ID")))?;
    if !root.is_dir() {
        return Err(Fail::Msg(format!(
            "no journal directory at {}",
            root.display()
        )));
    }
    let g = group_of(&id);
    if !smp_journal::group_dir(root, g).is_dir() {
        writeln!(
            std::io::stdout(),
            "queue {}: group {g:02} has no journal directory under {}",
            b64(&id),
            root.display()
        )?;
        return Ok(1);
    }
    let grp = read_group(root, g, Some((id.clone(), bodies.is_some())))?;
    let ix = &grp.index;
    let mut out = std::io::stdout().lock();
    let live = ix.queues.get(&id);
    let state = match (live, ix.history.is_empty()) {
        (Some(_), _) => "live",
        (None, false) => "deleted",
        (None, true) => "no records",
    };
    writeln!(
        out,
        "queue {} (partition {}, group {g:02}): {state}",
        b64(&id),
        partition_of(&id)
    )?;
    if ix.history.is_empty() && ix.history_msgs == (0, 0) {
        return Ok(1);
    }
    writeln!(out, "queue records:")?;
    for r in &ix.history {
        writeln!(
            out,
            "  seq {:<10} {:<13} {:<32} payload {} bytes (queue record {} bytes)",
            r.seq,
            r.kind.name(),
            loc_text(g, r.loc),
            r.payload,
            r.data
        )?;
    }
    writeln!(
        out,
        "message records: {} appended, {} deleted",
        ix.history_msgs.0, ix.history_msgs.1
    )?;
    let Some(q) = live else {
        return Ok(0);
    };
    let now = now();
    writeln!(
        out,
        "live messages: {} ({} body bytes)",
        q.msgs.len(),
        q.msg_bytes
    )?;
    for m in q.msgs.values() {
        writeln!(
            out,
            "  {}  {} ({} ago)  flags {:<9} {:>6} bytes  seq {:<10} {}",
            b64(&m.id),
            utc_text(m.ts),
            age_text(now - m.ts),
            flags_text(m.flags),
            m.size,
            m.seq,
            loc_text(g, m.loc)
        )?;
        if let (Some(fmt), Some(body)) = (bodies, &m.body) {
            let text = match fmt {
                BodyFormat::Hex => body.iter().map(|b| format!("{b:02x}")).collect(),
                BodyFormat::Base64 => URL_SAFE.encode(body),
            };
            writeln!(out, "    body: {text}")?;
        }
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// verify

fn verify(root: &Path, progress: &Progress, as_json: bool) -> Result<u8, Fail> {
    let mut groups_json = Vec::new();
    let mut lines = Vec::new();
    let (mut n, mut records, mut bad, mut warned) = (0u64, 0u64, 0u64, 0u64);
    each_group(root, progress, |g| {
        n += 1;
        records += g.report.records;
        let p = problems_of(&g);
        bad += g.report.damage.len() as u64 + g.index.issue_count;
        warned += g.report.warnings.len() as u64;
        if as_json {
            groups_json.push(json!({
                "group": g.index.group,
                "records": g.report.records,
                "synced": point_json(synced_point(&g.report)),
                "written": point_json(written_point(&g.report)),
                "problems": problems_json(&p),
            }));
        }
        for (what, msg) in p {
            lines.push(format!("{what}: {msg}"));
        }
        Ok(())
    })?;
    if as_json {
        print_json(&json!({
            "journal": root.display().to_string(),
            "clean": bad == 0,
            "groups_checked": n,
            "records": records,
            "damage": bad,
            "warnings": warned,
            "groups": groups_json,
        }))?;
    } else {
        let mut out = std::io::stdout().lock();
        for l in &lines {
            writeln!(out, "{l}")?;
        }
        let tail = if warned > 0 {
            format!(
                "; {warned} warning(s): a torn tail past the synced offset is a record being \
                 written (relay running) or writes a crash cut short, not damage"
            )
        } else {
            String::new()
        };
        if bad == 0 {
            writeln!(
                out,
                "clean: {n} groups, {records} records checked under {}{tail}",
                root.display()
            )?;
        } else {
            writeln!(
                out,
                "DAMAGE: {bad} damaged or inconsistent record(s) in {n} groups ({records} records \
                 read) under {}{tail}; stop the relay and run `smp-journal repair` to repair \
                 damaged groups (it cuts them at their first bad record or missing segment and \
                 says what that loses)",
                root.display()
            )?;
        }
    }
    Ok(if bad == 0 { 0 } else { 1 })
}

// ---------------------------------------------------------------------------------------------
// repair, compact: with the data directory's lock

/// The data directory's lock, as `smp-relay start` takes it.
struct DataDirLock {
    _file: File,
}

/// Takes `<data-dir>/lock` (flock, exclusive, non-blocking), the lock a running relay holds.
/// With `--journal-dir`, the data directory is the journal directory's parent, and its lock is
/// taken only when that directory has one (the relay creates it at its first start); the crate's
/// per-group locks are taken in any case.
fn lock_data_dir(cli: &Cli, root: &Path) -> Result<Option<DataDirLock>, Fail> {
    let (dir, create) = match &cli.journal_dir {
        None => (cli.data_dir.clone(), true),
        Some(_) => match root.parent() {
            Some(p) if p.join("lock").exists() => (p.to_path_buf(), false),
            _ => return Ok(None),
        },
    };
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .create(create)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Fail::Msg(format!("cannot open the lock file {}: {e}", path.display())))?;
    // SAFETY: flock takes a file descriptor that `file` owns and keeps open for the call; it has
    // no memory-safety preconditions.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Fail::Msg(format!(
                "the data directory {} is locked ({} is held): a relay (or another smp-journal \
                 repair) is running there; stop it first",
                dir.display(),
                path.display()
            )));
        }
        return Err(Fail::Msg(format!("flock {}: {err}", path.display())));
    }
    Ok(Some(DataDirLock { _file: file }))
}

fn repair(cli: &Cli, root: &Path, progress: &Progress) -> Result<u8, Fail> {
    let _lock = lock_data_dir(cli, root)?;
    let gs = groups(root)?;
    let mut out = std::io::stdout().lock();
    let (mut repaired, mut failed, mut inconsistent) = (0u64, 0u64, 0u64);
    for (i, &g) in gs.iter().enumerate() {
        progress.step(i, gs.len());
        let grp = read_group(root, g, None)?;
        if grp.report.damage.is_empty() {
            inconsistent += grp.index.issue_count;
            continue;
        }
        progress.clear();
        for d in &grp.report.damage {
            writeln!(out, "damage: {d}")?;
        }
        match smp_journal::repair(root, g) {
            Ok(rep) => {
                writeln!(out, "{rep}")?;
                let after = read_group(root, g, None)?;
                inconsistent += after.index.issue_count;
                if after.report.damage.is_empty() {
                    repaired += 1;
                } else {
                    failed += 1;
                    for d in &after.report.damage {
                        writeln!(out, "still damaged: {d}")?;
                    }
                }
            }
            Err(e) => {
                failed += 1;
                inconsistent += grp.index.issue_count;
                writeln!(out, "group {g:02}: not repaired: {e}")?;
            }
        }
    }
    progress.clear();
    writeln!(
        out,
        "{} groups checked, {repaired} repaired, {failed} still damaged",
        gs.len()
    )?;
    if inconsistent > 0 {
        writeln!(
            out,
            "note: {inconsistent} inconsistent record(s) left (see `smp-journal verify`); repair \
             changes damaged bytes and segment files only, never records that contradict each \
             other"
        )?;
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

fn compact(cli: &Cli, root: &Path) -> Result<u8, Fail> {
    let _lock = lock_data_dir(cli, root)?;
    groups(root)?;
    Err(Fail::Msg(
        "nothing was changed: journals are compacted by the relay while it runs, in the \
         background, because only the relay knows which records are still live (journal/FORMAT.md, \
         \"Compaction\"); start the relay and `smp-journal stats` shows the space it gives back"
            .into(),
    ))
}
