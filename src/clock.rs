//! Time as the inbox sees it: milliseconds since the Unix epoch, following the
//! database's clock so that instances on different hosts agree on lease expiry
//! and due times. Tests inject a [`ManualClock`] and move time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::inbox::{Store, StoreError};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

fn system_now() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as Millis)
}

/// The moment `age` before `now` (a purge's "finished before"). An age past what
/// milliseconds in an `i64` can hold means "before anything": a plain `as i64`
/// would wrap it into a moment in the future, and a purge of entries older than
/// a billion years would delete every finished entry.
pub fn ago(now: Millis, age: Duration) -> Millis {
    now.saturating_sub(Millis::try_from(age.as_millis()).unwrap_or(Millis::MAX))
}

/// The host's clock corrected by an offset to the database's clock, measured at
/// start and every minute by [`DbClock::calibrate`]. A lookup per timestamp would
/// cost a round trip on every claim and settle; the offset keeps agreement between
/// instances within a round trip without that cost.
pub struct DbClock {
    offset_ms: AtomicI64,
}

impl DbClock {
    pub async fn new(store: &dyn Store) -> Result<Arc<DbClock>, StoreError> {
        let clock = Arc::new(DbClock { offset_ms: AtomicI64::new(0) });
        clock.calibrate(store).await?;
        Ok(clock)
    }

    /// Measures the offset to the database clock, halving the round trip.
    pub async fn calibrate(&self, store: &dyn Store) -> Result<Millis, StoreError> {
        let before = system_now();
        let db = store.db_now().await?;
        let after = system_now();
        let offset = db - (before + after) / 2;
        self.offset_ms.store(offset, Ordering::Relaxed);
        Ok(offset)
    }

    /// Recalibrates every `every`, forever; run it beside the instance.
    pub async fn keep_calibrated(self: Arc<Self>, store: Arc<dyn Store>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.calibrate(store.as_ref()).await {
                Ok(offset) => tracing::debug!(offset_ms = offset, "clock offset to the database measured"),
                Err(error) => {
                    tracing::warn!(%error, "could not measure the clock offset to the database; keeping the last one")
                }
            }
        }
    }
}

impl Clock for DbClock {
    fn now(&self) -> Millis {
        system_now() + self.offset_ms.load(Ordering::Relaxed)
    }
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
