//! The reference's statistics over days (`[STORE_LOG] log_stats = on`), as bytes: the daily CSV
//! line of `smp-server-stats.daily.log` and the `key=value` backup `smp-server-stats.log` that a
//! clean stop writes and the next start restores (simplexmq `src/Simplex/Messaging/Server.hs`,
//! `logServerStats`, `saveServerStats`, `restoreServerStats`; `Server/Stats.hs`, the
//! `StrEncoding` of `ServerStatsData`). No I/O here: `server/shard/stats.rs` writes and reads them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::metrics::{
    iso8601_ms, keys, Activity, MetricsSnapshot, PeriodSets, ProxyStats, ServiceStats,
};

pub const DAILY_FILE: &str = "smp-server-stats.daily.log";
pub const BACKUP_FILE: &str = "smp-server-stats.log";

pub fn daily_path(data_dir: &Path) -> PathBuf {
    data_dir.join(DAILY_FILE)
}

pub fn backup_path(data_dir: &Path) -> PathBuf {
    data_dir.join(BACKUP_FILE)
}

/// Seconds from 00:00 UTC of the first daily line, and between lines (the reference's
/// `logStatsStartTime`, `logStatsInterval`).
pub const DAILY_START_SECS: i64 = 0;
pub const DAILY_INTERVAL_SECS: i64 = 86_400;

/// When the first daily line is due for a relay started at `now` (Unix seconds): the next
/// 00:00 UTC, or now when it is exactly that.
pub fn first_line_at(now: i64) -> i64 {
    let day = now - now.rem_euclid(86_400);
    let at = day + DAILY_START_SECS;
    if at >= now {
        at
    } else {
        at + DAILY_INTERVAL_SECS
    }
}

/// Whether a line written at `now` reports (and resets) the weekly and the monthly counts:
/// on Mondays and on the 1st.
pub fn week_month_due(now: i64) -> (bool, bool) {
    let (_, _, day, weekday) = crate::clock::utc_date(now);
    (weekday == 1, day == 1)
}

/// The counts of one kind of active queues a line shows: the day's always, the week's and the
/// month's only when they are due (empty otherwise).
pub struct PeriodCounts {
    pub day: u64,
    pub week: Option<u64>,
    pub month: Option<u64>,
}

/// One line of the daily CSV (without its newline): `s` holds the period's counters (those the
/// line resets) and the current gauges; `from_secs` is when the period began, and the line is
/// dated with its UTC day.
pub fn daily_line(
    from_secs: i64,
    s: &MetricsSnapshot,
    active: &PeriodCounts,
    active_ntf: &PeriodCounts,
) -> String {
    let (y, m, d, _) = crate::clock::utc_date(from_secs);
    let opt = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_default();
    let mut cols: Vec<String> = vec![format!("{y:04}-{m:02}-{d:02}")];
    let mut push = |vals: &[u64]| cols.extend(vals.iter().map(u64::to_string));
    push(&[
        s.queues_created,
        s.queues_secured,
        s.queues_deleted,
        s.msg_sent,
        s.msg_recv,
    ]);
    cols.extend([active.day.to_string(), opt(active.week), opt(active.month)]);
    cols.extend([s.msg_sent_ntf, s.msg_recv_ntf].map(|v| v.to_string()));
    cols.extend([
        active_ntf.day.to_string(),
        opt(active_ntf.week),
        opt(active_ntf.month),
    ]);
    let mut nums: Vec<u64> = vec![
        s.queue_count,
        s.msg_count,
        s.msg_expired,
        s.queues_deleted_new,
        s.queues_deleted_secured,
    ];
    for p in [
        &s.p_relays,
        &s.p_relays_own,
        &s.p_msg_fwds,
        &s.p_msg_fwds_own,
    ] {
        nums.extend([
            p.requests,
            p.successes,
            p.errors_connect,
            p.errors_compat,
            p.errors_other,
        ]);
    }
    nums.extend([
        s.p_msg_fwds_recv,
        s.sub_successes,
        s.sub_auth,
        s.sub_duplicate,
        s.sub_prohibited,
        s.msg_sent_auth,
        s.msg_sent_quota,
        s.msg_sent_large,
        s.msg_ntfs,
        s.msg_ntf_no_sub,
        s.msg_ntf_lost,
        // The reference's removed `qSubNoMsg`.
        0,
        s.msg_recv_get,
        s.msg_get,
        s.msg_get_no_msg,
        s.msg_get_auth,
        s.msg_get_duplicate,
        s.msg_get_prohibited,
        // The reference's removed subscribed-queue counts (day, week, month).
        0,
        0,
        0,
        s.queue_count,
        s.ntf_created,
        s.ntf_deleted,
        s.ntf_sub,
        s.ntf_sub_auth,
        s.ntf_sub_duplicate,
        s.notifier_count,
        s.queues_deleted_batches,
        s.sub_batches,
        s.sub_end,
        s.sub_end_batches,
        s.ntf_deleted_batches,
        s.ntf_sub_batches,
        s.msg_ntfs_batches,
        s.msg_ntf_expired,
        s.ntf_count,
        s.rcv_services_count,
        s.ntf_services_count,
        s.rcv_services_queues,
        s.ntf_services_queues,
    ]);
    for svc in [&s.rcv_service_stats, &s.ntf_service_stats] {
        let mut v = *svc;
        nums.extend(v.fields_mut()[..8].iter().map(|f| **f));
    }
    nums.extend([
        s.rslv_reqs,
        s.rslv_success,
        s.rslv_not_found,
        s.rslv_resolver_errs,
        s.rslv_disabled,
    ]);
    cols.extend(nums.iter().map(u64::to_string));
    cols.join(",")
}

/// What the backup file holds: the counters (gauges are the store's, except the saved queue
/// count, compared with the store's at restore), the period's start and the active queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backup {
    pub from_ms: u64,
    pub counters: MetricsSnapshot,
    pub q_count: u64,
    pub activity: Activity,
}

/// The plain `key=value` counters of the file, in the reference's order, with their fields.
fn plain_fields(s: &mut MetricsSnapshot) -> Vec<(&'static str, &mut u64)> {
    // `(key, field)` of each counter named, its key from the snapshot's declaration.
    macro_rules! keyed {
        ($($f:ident),* $(,)?) => {
            vec![$((keys::$f, &mut s.$f)),*]
        };
    }
    keyed![
        queues_created,
        queues_secured,
        queues_deleted,
        queues_deleted_new,
        queues_deleted_secured,
        queues_deleted_batches,
        queues_blocked,
        queue_count,
        sub_successes,
        sub_batches,
        sub_auth,
        sub_duplicate,
        sub_prohibited,
        sub_end,
        sub_end_batches,
        ntf_created,
        ntf_new_created,
        ntf_deleted,
        ntf_deleted_batches,
        ntf_sub,
        ntf_sub_batches,
        ntf_sub_auth,
        ntf_sub_duplicate,
        msg_sent,
        msg_sent_auth,
        msg_sent_quota,
        msg_sent_large,
        msg_sent_block,
        msg_recv,
        msg_recv_get,
        msg_get,
        msg_get_no_msg,
        msg_get_auth,
        msg_get_duplicate,
        msg_get_prohibited,
        msg_expired,
        msg_sent_ntf,
        msg_recv_ntf,
        msg_ntfs,
        msg_ntfs_batches,
        msg_ntf_no_sub,
        msg_ntf_lost,
        msg_ntf_expired,
    ]
}

fn proxy_fields(p: &mut ProxyStats) -> [(&'static str, &mut u64); 5] {
    [
        ("requests", &mut p.requests),
        ("successes", &mut p.successes),
        ("errorsConnect", &mut p.errors_connect),
        ("errorsCompat", &mut p.errors_compat),
        ("errorsOther", &mut p.errors_other),
    ]
}

/// The eight service counters the reference saves (its spelling `assocUpdatedt` included).
fn service_fields(s: &mut ServiceStats) -> [(&'static str, &mut u64); 8] {
    [
        ("assocNew", &mut s.assoc_new),
        ("assocDuplicate", &mut s.assoc_duplicate),
        ("assocUpdatedt", &mut s.assoc_updated),
        ("assocRemoved", &mut s.assoc_removed),
        ("subCount", &mut s.sub_count),
        ("subDuplicate", &mut s.sub_duplicate),
        ("subQueues", &mut s.sub_queues),
        ("subEnd", &mut s.sub_end),
    ]
}

fn rslv_fields(s: &mut MetricsSnapshot) -> [(&'static str, &mut u64); 5] {
    [
        ("reqs", &mut s.rslv_reqs),
        ("succ", &mut s.rslv_success),
        ("notFound", &mut s.rslv_not_found),
        ("resolverErrs", &mut s.rslv_resolver_errs),
        ("disabled", &mut s.rslv_disabled),
    ]
}

fn hashes(set: &HashSet<i64>) -> String {
    let mut v: Vec<i64> = set.iter().copied().collect();
    v.sort_unstable();
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// The file's text, as the reference's `strEncode` of `ServerStatsData` lays it out.
pub fn encode_backup(b: &Backup) -> String {
    let mut out = format!("fromTime={}\n", iso8601_ms(b.from_ms));
    let mut c = b.counters;
    c.queue_count = b.q_count;
    for (k, v) in plain_fields(&mut c) {
        out.push_str(&format!("{k}={v}\n"));
    }
    for (section, p) in [
        ("activeQueues", &b.activity.msgs),
        ("activeQueuesNtf", &b.activity.ntfs),
    ] {
        out.push_str(&format!(
            "{section}:\ndayHashes={}\nweekHashes={}\nmonthHashes={}\n",
            hashes(&p.day),
            hashes(&p.week),
            hashes(&p.month)
        ));
    }
    let mut c = b.counters;
    for (section, p) in [
        ("pRelays", &mut c.p_relays),
        ("pRelaysOwn", &mut c.p_relays_own),
        ("pMsgFwds", &mut c.p_msg_fwds),
        ("pMsgFwdsOwn", &mut c.p_msg_fwds_own),
    ] {
        out.push_str(&format!("{section}:\n"));
        for (k, v) in proxy_fields(p) {
            out.push_str(&format!("{k}={v}\n"));
        }
    }
    out.push_str(&format!("pMsgFwdsRecv={}\n", c.p_msg_fwds_recv));
    for (section, s) in [
        ("rcvServices", &mut c.rcv_service_stats),
        ("ntfServices", &mut c.ntf_service_stats),
    ] {
        out.push_str(&format!("{section}:\n"));
        for (k, v) in service_fields(s) {
            out.push_str(&format!("{k}={v}\n"));
        }
    }
    out.push_str("rslvStats:\n");
    for (k, v) in rslv_fields(&mut c) {
        out.push_str(&format!("{k}={v}\n"));
    }
    out
}

/// Parses a backup file's text; an error names the line and what is wrong with it.
pub fn decode_backup(text: &str) -> Result<Backup, String> {
    let mut b = Backup::default();
    let mut from = None;
    let mut section = "";
    for (n, line) in text.lines().enumerate() {
        let bad = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(s) = line.strip_suffix(':').filter(|s| !s.contains('=')) {
            section = match s {
                "activeQueues" | "activeQueuesNtf" | "subscribedQueues" | "pRelays"
                | "pRelaysOwn" | "pMsgFwds" | "pMsgFwdsOwn" | "rcvServices" | "ntfServices"
                | "rslvStats" => s,
                _ => return Err(bad("unknown section")),
            };
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(bad("not key=value"));
        };
        let num = || {
            value
                .parse::<i64>()
                .map(|v| v.max(0) as u64)
                .map_err(|_| bad("not a number"))
        };
        let set = || -> Result<HashSet<i64>, String> {
            value
                .split(',')
                .filter(|v| !v.is_empty())
                .map(|v| v.parse::<i64>().map_err(|_| bad("not a list of numbers")))
                .collect()
        };
        let period = |sets: &mut PeriodSets, key: &str| -> Result<bool, String> {
            let target = match key {
                "dayHashes" | "dayMsgQueues" => &mut sets.day,
                "weekHashes" | "weekMsgQueues" => &mut sets.week,
                "monthHashes" | "monthMsgQueues" => &mut sets.month,
                _ => return Ok(false),
            };
            *target = set()?;
            Ok(true)
        };
        let known = match section {
            "" if key == "fromTime" => {
                from = Some(parse_time(value).ok_or_else(|| bad("not a time"))?);
                true
            }
            "" if key == "qDeleted" => {
                b.counters.queues_deleted = num()?;
                true
            }
            "" if key == "qSubNoMsg" || key == "pMsgFwdsRecv" => {
                if key == "pMsgFwdsRecv" {
                    b.counters.p_msg_fwds_recv = num()?;
                }
                true
            }
            // Files written before the sections (the active queues' counts came first).
            "" if key.ends_with("MsgQueues") => period(&mut b.activity.msgs, key)?,
            "" => match plain_fields(&mut b.counters)
                .into_iter()
                .find(|(k, _)| *k == key)
            {
                Some((_, f)) => {
                    *f = num()?;
                    true
                }
                None => false,
            },
            "activeQueues" => period(&mut b.activity.msgs, key)?,
            "activeQueuesNtf" => period(&mut b.activity.ntfs, key)?,
            // Kept by older versions of the reference; read and dropped, as it does.
            "subscribedQueues" => true,
            "rslvStats" => match rslv_fields(&mut b.counters)
                .into_iter()
                .find(|(k, _)| *k == key)
            {
                Some((_, f)) => {
                    *f = num()?;
                    true
                }
                None => false,
            },
            "rcvServices" | "ntfServices" => {
                let s = match section {
                    "rcvServices" => &mut b.counters.rcv_service_stats,
                    _ => &mut b.counters.ntf_service_stats,
                };
                match service_fields(s).into_iter().find(|(k, _)| *k == key) {
                    Some((_, f)) => {
                        *f = num()?;
                        true
                    }
                    None => false,
                }
            }
            _ => {
                let c = &mut b.counters;
                let p = match section {
                    "pRelays" => &mut c.p_relays,
                    "pRelaysOwn" => &mut c.p_relays_own,
                    "pMsgFwds" => &mut c.p_msg_fwds,
                    _ => &mut c.p_msg_fwds_own,
                };
                // `pMsgFwdsRecv` follows the last proxy section without a section of its own.
                if key == "pMsgFwdsRecv" {
                    c.p_msg_fwds_recv = num()?;
                    true
                } else {
                    match proxy_fields(p).into_iter().find(|(k, _)| *k == key) {
                        Some((_, f)) => {
                            *f = num()?;
                            true
                        }
                        None => false,
                    }
                }
            }
        };
        if !known {
            return Err(bad("unknown key"));
        }
    }
    b.from_ms = from.ok_or("no fromTime line")?;
    b.q_count = b.counters.queue_count;
    b.counters.queue_count = 0;
    Ok(b)
}

/// `YYYY-MM-DDTHH:MM:SS[.fff…]Z` (what `iso8601Show` writes) to Unix milliseconds.
fn parse_time(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let ms: i64 = format!("{:0<3}", &frac[..frac.len().min(3)]).parse().ok()?;
    // H. Hinnant's `days_from_civil`.
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs * 1000 + ms).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_at_the_next_midnight() {
        assert_eq!(first_line_at(1_700_000_000), 1_700_006_400);
        assert_eq!(first_line_at(1_700_006_400), 1_700_006_400);
        // 2023-11-20 was a Monday; 2023-12-01 a 1st.
        assert_eq!(week_month_due(1_700_438_400), (true, false));
        assert_eq!(week_month_due(1_701_388_800), (false, true));
        assert_eq!(week_month_due(1_700_006_400), (false, false));
    }

    #[test]
    fn a_daily_line_has_the_reference_columns() {
        let mut s = MetricsSnapshot {
            queues_created: 3,
            msg_sent: 5,
            ..MetricsSnapshot::default()
        };
        s.rcv_service_stats.sub_end = 9;
        s.rslv_disabled = 2;
        let a = PeriodCounts {
            day: 2,
            week: None,
            month: Some(4),
        };
        let n = PeriodCounts {
            day: 1,
            week: None,
            month: None,
        };
        let line = daily_line(1_700_000_000, &s, &a, &n);
        let cols: Vec<&str> = line.split(',').collect();
        assert_eq!(cols.len(), 101, "{line}");
        assert_eq!(
            &cols[..10],
            ["2023-11-14", "3", "0", "0", "5", "0", "2", "", "4", "0"]
        );
        assert_eq!(&cols[11..14], ["1", "", ""]);
        assert_eq!(cols[87], "9", "the rcv services' subEnd");
        assert_eq!(cols[100], "2", "rslvDisabled last");
    }

    #[test]
    fn a_backup_round_trips_in_the_reference_layout() {
        let mut b = Backup {
            from_ms: 1_700_000_000_250,
            q_count: 7,
            ..Backup::default()
        };
        b.counters.queues_created = 4;
        b.counters.msg_ntf_expired = 2;
        b.counters.p_msg_fwds_own.errors_other = 3;
        b.counters.p_msg_fwds_recv = 6;
        b.counters.ntf_service_stats.assoc_updated = 8;
        b.counters.rslv_reqs = 5;
        b.activity.msgs.day.extend([-3, 12]);
        b.activity.ntfs.month.insert(99);
        let text = encode_backup(&b);
        assert!(text.starts_with("fromTime=2023-11-14T22:13:20.25Z\nqCreated=4\nqSecured=0\n"));
        assert!(text.contains("\nqCount=7\n"));
        assert!(text.contains("\nactiveQueues:\ndayHashes=-3,12\nweekHashes=\nmonthHashes=\n"));
        assert!(text.contains("\npMsgFwdsOwn:\nrequests=0\nsuccesses=0\nerrorsConnect=0\nerrorsCompat=0\nerrorsOther=3\npMsgFwdsRecv=6\n"));
        assert!(text.contains("\nntfServices:\nassocNew=0\nassocDuplicate=0\nassocUpdatedt=8\n"));
        assert!(
            text.ends_with("rslvStats:\nreqs=5\nsucc=0\nnotFound=0\nresolverErrs=0\ndisabled=0\n")
        );
        assert_eq!(decode_backup(&text), Ok(b));
    }

    /// A file in the reference's layout (as its `strEncode` of `ServerStatsData` writes one) is
    /// read, and written back byte for byte.
    #[test]
    fn a_backup_in_the_reference_layout_reads_and_writes_back_the_same() {
        let text = include_str!("../tests/fixtures/reference-stats-backup.txt");
        let b = decode_backup(text).expect("the reference's layout");
        assert_eq!(b.from_ms, 1_795_996_800_250);
        assert_eq!((b.counters.queues_created, b.q_count), (12, 9));
        assert_eq!(b.counters.msg_recv_get, 4);
        assert_eq!(b.counters.p_msg_fwds.errors_other, 1);
        assert_eq!(b.counters.p_msg_fwds_recv, 11);
        assert_eq!(b.counters.rcv_service_stats.sub_queues, 2);
        assert_eq!(b.counters.rslv_disabled, 3);
        assert_eq!(b.activity.msgs.month.len(), 4);
        assert!(b.activity.msgs.day.contains(&-8_912_336_587_412_265_472));
        assert_eq!(encode_backup(&b), text);
    }

    #[test]
    fn a_bad_backup_is_refused_with_its_line() {
        let e = decode_backup("fromTime=2023-11-14T22:13:20Z\nqCreated=x\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("qCreated=x"), "{e}");
        let e = decode_backup("qCreated=1\n").unwrap_err();
        assert!(e.contains("fromTime"), "{e}");
        let e = decode_backup("fromTime=2023-11-14T22:13:20Z\nnoSuch=1\n").unwrap_err();
        assert!(e.contains("unknown key"), "{e}");
    }
}
