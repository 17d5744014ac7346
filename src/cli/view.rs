//! How the command line shows things to people: tables, one entry in full, dates.
//! (`--json` prints the API's typed bodies instead, `crate::admin::answer`.)

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use crate::admin::answer::Payload;
use crate::clock::Millis;
use crate::inbox::{AuditRecord, Entry, RouteStatusCount, Status};

/// A time as a date, `2026-08-01T10:00:00Z` (UTC, seconds).
pub fn date(ms: Millis) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)).to_string()
}

/// A time as a date to the millisecond, `2026-08-01T10:00:00.123Z` (UTC): what
/// `gcloud pubsub subscriptions seek --time` takes.
pub fn date_millis(ms: Millis) -> String {
    crate::clock::rfc3339_millis(ms)
}

/// A replay window on one line: id, route, publish times, state, who and why, and
/// how many entries it stored.
pub fn replay_line(w: &crate::inbox::ReplayWindow, now: Millis) -> String {
    let state = match w.closed_at {
        Some(at) => format!("closed at {}", date(at)),
        None if w.is_open(now) => format!("open until {}", date(w.closes_at)),
        None => format!("ended at {}", date(w.closes_at)),
    };
    format!(
        "window {} on {}: published from {} to {}, {state}, {} entries stored; opened by {} at {}: {}",
        w.id,
        w.route,
        date_millis(w.published_from),
        date_millis(w.published_to),
        w.taken,
        w.opened_by,
        date(w.opened_at),
        w.reason
    )
}

/// A file size for people: `512 B`, `4.0 KiB`, `12.3 MiB`, `2.1 GiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn date_or_dash(ms: Option<Millis>) -> String {
    ms.map_or_else(|| "-".into(), date)
}

/// How long ago `then` was, rounded to seconds (`3h 2m 5s`).
pub fn age(now: Millis, then: Millis) -> String {
    humantime::format_duration(Duration::from_secs(((now - then).max(0) / 1000) as u64)).to_string()
}

/// At most `n` characters of `s` on one line.
fn clip(s: &str, n: usize) -> String {
    let one_line = s.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= n {
        return one_line;
    }
    let mut out: String = one_line.chars().take(n.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// One row of the `inbox list` table.
fn entry_row(cells: [&str; 7]) -> String {
    let [id, status, route, key, attempts, received, error] = cells;
    format!("{id:>8}  {status:<11}  {route:<24}  {key:<20}  {attempts:>8}  {received:<20}  {error}")
}

pub fn entry_header() -> String {
    entry_row(["ID", "STATUS", "ROUTE", "KEY", "ATTEMPTS", "RECEIVED", "LAST ERROR"])
}

/// One line of `inbox list`.
pub fn entry_line(e: &Entry) -> String {
    entry_row([
        &e.id.to_string(),
        e.status.as_str(),
        &clip(&e.route, 24),
        &clip(e.correlation_key.as_deref().unwrap_or("-"), 20),
        &e.attempts.to_string(),
        &date(e.received_at),
        &clip(e.last_error.as_deref().unwrap_or(""), 80),
    ])
}

/// `inbox show`: every field of an entry, the payloads as text (or base64).
pub fn entry_detail(e: &Entry) -> String {
    let payload = |b: &[u8]| match Payload::of(b) {
        Payload::Text(t) => t,
        Payload::Base64(b) => format!("(base64) {b}"),
        Payload::Withheld(w) => w.to_string(),
    };
    let attributes = if e.attributes.is_empty() {
        "-".to_string()
    } else {
        e.attributes.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
    };
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut rows: Vec<(&str, String)> = vec![
        ("entry", e.id.to_string()),
        ("route", e.route.clone()),
        ("status", e.status.to_string()),
        ("correlation key", or_dash(&e.correlation_key)),
        ("dedup key", e.dedup_key.clone()),
        ("event type", or_dash(&e.event_type)),
        ("schema version", or_dash(&e.schema_version)),
        ("message id", e.message_id.clone()),
        ("publish time", or_dash(&e.publish_time)),
        ("conflict of", e.conflict_of.map_or_else(|| "-".into(), |c| format!("entry {c}"))),
        ("attempts", e.attempts.to_string()),
        ("received", date(e.received_at)),
        ("updated", date(e.updated_at)),
        ("next attempt", if e.status.is_unresolved() { date(e.next_attempt_at) } else { "-".into() }),
        ("not yet since", date_or_dash(e.not_yet_since)),
        ("finished", date_or_dash(e.finished_at)),
        (
            "lease",
            e.lease_owner
                .as_ref()
                .map_or_else(|| "-".into(), |o| format!("{o} until {}", date_or_dash(e.lease_expires_at))),
        ),
        ("last error", or_dash(&e.last_error)),
        ("attributes", attributes),
        ("payload sha256", e.payload_digest.clone()),
        ("raw data", payload(&e.raw_data)),
        ("body", e.body.as_deref().map_or_else(|| "- (not decoded)".into(), payload)),
    ];
    if let Some(what) = &e.unreadable {
        // First, so nobody takes the empty attributes for the message's own.
        rows.insert(1, ("UNREADABLE", format!("{what} (the claim parks this entry; fix the row or ignore it)")));
    }
    let mut out = String::new();
    for (name, value) in rows {
        let _ = writeln!(out, "{name:<16}{value}");
    }
    out
}

fn stats_row(cells: [&str; 4]) -> String {
    let [route, status, count, oldest] = cells;
    format!("{route:<24}  {status:<11}  {count:>8}  {oldest}")
}

pub fn stats_header() -> String {
    stats_row(["ROUTE", "STATUS", "COUNT", "OLDEST"])
}

pub fn stats_line(c: &RouteStatusCount, now: Millis) -> String {
    let age = c.oldest_received_at.map(|t| age(now, t)).unwrap_or_default();
    stats_row([&clip(&c.route, 24), c.status.as_str(), &c.count.to_string(), &age])
}

fn audit_row(cells: [&str; 7]) -> String {
    let [id, at, actor, action, route, outcome, subject] = cells;
    format!("{id:>6}  {at:<20}  {actor:<20}  {action:<10}  {route:<20}  {outcome:<9}  {subject}")
}

pub fn audit_header() -> String {
    audit_row(["ID", "AT", "ACTOR", "ACTION", "ROUTE", "OUTCOME", "SUBJECT"])
}

pub fn audit_line(a: &AuditRecord) -> String {
    let detail = a.detail.as_deref().map(|d| format!(" ({})", clip(d, 60))).unwrap_or_default();
    let subject = format!("{}{detail}", a.subject);
    audit_row([
        &a.id.to_string(),
        &date(a.at),
        &clip(&a.actor, 20),
        &a.action,
        &clip(a.route.as_deref().unwrap_or("-"), 20),
        &a.outcome,
        &subject,
    ])
}

fn route_row(cells: [&str; 5]) -> String {
    let [route, open, in_progress, parked, paused] = cells;
    format!("{route:<24}  {open:>8}  {in_progress:>11}  {parked:>8}  {paused}")
}

pub fn route_header() -> String {
    route_row(["ROUTE", "OPEN", "IN_PROGRESS", "PARKED", "PAUSED"])
}

/// One line of `route list`: the unresolved entries and the pause (`-` when running).
pub fn route_line(name: &str, unresolved: &std::collections::BTreeMap<&str, i64>, paused: Option<&str>) -> String {
    let n = |s: Status| unresolved.get(s.as_str()).copied().unwrap_or(0).to_string();
    route_row([name, &n(Status::Open), &n(Status::InProgress), &n(Status::Parked), paused.unwrap_or("-")])
}

/// `1234567` as `1,234,567`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_counts_and_clipping() {
        assert_eq!(date(1_785_578_400_000), "2026-08-01T10:00:00Z");
        assert_eq!(count(0), "0");
        assert_eq!(count(1234), "1,234");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd\nef", 4), "abc…");
        assert_eq!(age(10_000, 2_000), "8s");
        assert_eq!(date_millis(1_785_578_400_123), "2026-08-01T10:00:00.123Z");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(4096), "4.0 KiB");
        assert_eq!(size(12_900_000), "12.3 MiB");
        assert_eq!(size(5 << 40), "5120.0 GiB");
    }
}
