//! Time as the inbox sees it: milliseconds since the Unix epoch, following the
//! database's clock so that instances on different hosts agree on lease expiry
//! and due times (`inbox::DbClock` measures the offset). Tests inject a
//! [`ManualClock`] and move time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

pub(crate) fn system_now() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

/// The moment `age` before `now` (a purge's "finished before"). An age past what
/// milliseconds in an `i64` can hold means "before anything": a plain `as i64`
/// would wrap it into a moment in the future, and a purge of entries older than
/// a billion years would delete every finished entry.
pub fn ago(now: Millis, age: Duration) -> Millis {
    now.saturating_sub(Millis::try_from(age.as_millis()).unwrap_or(Millis::MAX))
}

/// `at` in milliseconds since the Unix epoch (0 before it, the largest for a time past
/// what an `i64` of milliseconds holds).
pub fn millis_of(at: SystemTime) -> Millis {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX))
}

/// A time to the millisecond as RFC 3339, `2026-08-01T10:00:00.123Z` (UTC): what
/// `inlet pubsub seek --to` and `gcloud pubsub subscriptions seek --time` take.
pub fn rfc3339_millis(at: Millis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(at.max(0) as u64)).to_string()
}

/// A clock that moves only when told to.
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(start: Millis) -> Arc<ManualClock> {
        Arc::new(ManualClock { now: AtomicI64::new(start) })
    }

    pub fn starting_now() -> Arc<ManualClock> {
        Self::new(system_now())
    }

    pub fn set(&self, t: Millis) {
        self.now.store(t, Ordering::SeqCst);
    }

    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(d.as_millis() as Millis, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ago_saturates_instead_of_wrapping_into_the_future() {
        let now = 1_700_000_000_000;
        assert_eq!(ago(now, Duration::from_secs(7 * 24 * 3600)), now - 604_800_000);
        // 10^9 years: more milliseconds than an i64 holds.
        let eons = Duration::from_secs(1_000_000_000 * 365 * 24 * 3600);
        assert_eq!(ago(now, eons), now - Millis::MAX);
        assert!(ago(now, eons) < 0, "before the epoch, not in the future");
        assert_eq!(ago(now, Duration::MAX), now - Millis::MAX);
        assert_eq!(ago(-5, Duration::MAX), Millis::MIN, "saturates at the bottom too");
    }
}
