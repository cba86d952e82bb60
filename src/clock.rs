//! UTC times as the reference prints them (aeson's `UTCTime`, the metrics file's header).

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `YYYY-MM-DDTHH:MM:SS` of Unix seconds.
fn date_time(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix seconds as aeson encodes a whole-second `UTCTime`: `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_time(secs: i64) -> String {
    format!("{}Z", date_time(secs))
}

/// Unix milliseconds as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn utc_time_ms(ms: u64) -> String {
    format!("{}.{:03}Z", date_time((ms / 1000) as i64), ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_time_of_known_instants() {
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn utc_time_ms_of_known_instants() {
        assert_eq!(utc_time_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_time_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc_time_ms(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
