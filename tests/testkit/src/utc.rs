//! The current UTC time without a date library: civil fields and RFC 3339.

use std::time::{SystemTime, UNIX_EPOCH};

/// Current UTC time as RFC 3339 with milliseconds, e.g. `2025-01-31T12:34:56.789Z`.
pub(crate) fn rfc3339_now() -> String {
    let t = utc_now();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        t.nanos / 1_000_000
    )
}

/// The current UTC time as civil fields, for the names and stamps tests write.
pub struct UtcNow {
    pub year: i64,
    pub month: i64,
    pub day: i64,
    pub hour: i64,
    pub minute: i64,
    pub second: i64,
    pub nanos: u32,
}

pub fn utc_now() -> UtcNow {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970");
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    UtcNow {
        year,
        month,
        day,
        hour: rem / 3_600,
        minute: rem % 3_600 / 60,
        second: rem % 60,
        nanos: now.subsec_nanos(),
    }
}
