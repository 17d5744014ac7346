//! The database's clock: the host's clock corrected by its offset to the inbox's
//! database, so that instances on different hosts agree on lease expiry and due times.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Millis, system_now};
use crate::inbox::{Store, StoreError};

/// The host's clock corrected by an offset to the database's clock, measured at
/// start and every minute by [`DbClock::calibrate`]. A lookup per timestamp would
/// cost a round trip on every claim and settle; the offset keeps agreement between
/// instances within a round trip without that cost.
pub struct DbClock {
    offset_ms: AtomicI64,
    /// The fastest round trip of the last calibration, in microseconds.
    round_trip_us: AtomicU64,
}

/// Round trips per calibration. The offset is read from the fastest: the less time a
/// round trip took, the less its two halves can differ, and the offset's error is
/// their difference. One slow round trip (a busy host) no longer skews the clock.
const SAMPLES: usize = 3;

/// The waits before the first recalibrations after the one at start (then every
/// minute, as the caller says): the one at start runs while the process is at its
/// busiest (plugins compiling, connections opening), when a loopback round trip
/// measured 53–81 µs against 10–29 µs a second later (docs/measurements.md), and the
/// writers decide from it whether the database is near until the next.
const SOON_AFTER_START: [Duration; 3] = [Duration::from_secs(1), Duration::from_secs(3), Duration::from_secs(10)];

impl DbClock {
    pub async fn new(store: &dyn Store) -> Result<Arc<DbClock>, StoreError> {
        let clock = Arc::new(DbClock { offset_ms: AtomicI64::new(0), round_trip_us: AtomicU64::new(0) });
        clock.calibrate(store).await?;
        Ok(clock)
    }

    /// Measures the offset to the database clock, halving the fastest of [`SAMPLES`]
    /// round trips in a row on one connection ([`Store::db_now_timed`]); returns the
    /// offset.
    pub async fn calibrate(&self, store: &dyn Store) -> Result<Millis, StoreError> {
        let mut fastest: Option<(Duration, Millis)> = None;
        for (took, before, after, db) in store.db_now_timed(SAMPLES).await? {
            if fastest.is_none_or(|(t, _)| took < t) {
                fastest = Some((took, db - (before + after) / 2));
            }
        }
        let (took, offset) = fastest.expect("at least one sample");
        self.offset_ms.store(offset, Ordering::Relaxed);
        self.round_trip_us.store(took.as_micros() as u64, Ordering::Relaxed);
        Ok(offset)
    }

    /// The fastest round trip to the database at the last calibration: what a
    /// statement costs in waiting alone.
    pub fn round_trip(&self) -> Duration {
        Duration::from_micros(self.round_trip_us.load(Ordering::Relaxed))
    }

    /// Recalibrates every `every`, forever, telling `measured` each round trip; run it
    /// beside the instance. The first few come sooner ([`SOON_AFTER_START`]).
    pub async fn keep_calibrated(self: Arc<Self>, store: Arc<dyn Store>, every: Duration, measured: impl Fn(Duration)) {
        let mut soon = SOON_AFTER_START.iter();
        loop {
            tokio::time::sleep(soon.next().map_or(every, |s| (*s).min(every))).await;
            match self.calibrate(store.as_ref()).await {
                Ok(offset) => {
                    let round_trip = self.round_trip();
                    tracing::debug!(offset_ms = offset, ?round_trip, "clock offset to the database measured");
                    measured(round_trip);
                }
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
