//! The database's clock: the host's clock corrected by its offset to the inbox's
//! database, so that instances on different hosts agree on lease expiry and due times.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, Millis, system_now};
use crate::inbox::{Store, StoreError};

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
