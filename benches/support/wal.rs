//! What PostgreSQL wrote to its write-ahead log while a phase ran, from `pg_stat_wal`:
//! so a rate can be printed beside the log bytes and full-page images each unit of work
//! cost. Unlike a time, these hardly vary with what else the machine is doing: a change
//! of layout shows in them at once (an index fewer, a narrower row), and the full-page
//! images show how much of the log the checkpoints' timing adds.
//!
//! The bytes are the distance the log's insert position moved (`pg_current_wal_lsn()`),
//! exact; the full-page images are `pg_stat_wal`'s count, which each backend adds to
//! about once a second, so a phase's count is off by at most a second's worth at
//! either end. Both are the whole server's: the benchmark's databases must be the only
//! ones at work (as they are on the machines it runs on), and a vacuum or a checkpoint
//! that falls inside a phase counts in it, as it counts in the phase's CPU.

use sqlx::Connection as _;

/// The server's WAL counters when a phase began; [`WalMeter::stop`] ends it.
pub struct WalMeter {
    url: String,
    from: Counters,
}

struct Counters {
    /// The insert position, as PostgreSQL prints it (`0/1A2B3C4`).
    lsn: String,
    bytes: i64,
    full_pages: i64,
}

/// Log written per unit of work.
#[derive(Clone, Copy, Default)]
pub struct WalPer {
    pub bytes: f64,
    /// Full-page images (a page's first change after a checkpoint logs the whole page).
    pub full_pages: f64,
}

impl WalMeter {
    /// Reads the counters through `url` (any database of the server).
    pub async fn start(url: &str) -> WalMeter {
        WalMeter { url: url.to_string(), from: counters(url).await }
    }

    /// The log written since [`WalMeter::start`], per unit, for `units` units. Prints
    /// the span of the log on stderr, for `pg_waldump --start … --end … --stats=record`
    /// (what the phase wrote, by kind of record).
    pub async fn stop(self, units: usize) -> WalPer {
        let to = counters(&self.url).await;
        eprintln!("  WAL written from {} to {}", self.from.lsn, to.lsn);
        let units = units.max(1) as f64;
        WalPer {
            bytes: (to.bytes - self.from.bytes) as f64 / units,
            full_pages: (to.full_pages - self.from.full_pages) as f64 / units,
        }
    }
}

async fn counters(url: &str) -> Counters {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect to read pg_stat_wal");
    let (lsn, bytes, full_pages): (String, i64, i64) = sqlx::query_as(
        "SELECT pg_current_wal_lsn()::text, (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, wal_fpi FROM pg_stat_wal",
    )
    .fetch_one(&mut conn)
    .await
    .expect("read pg_stat_wal (PostgreSQL 14 or later)");
    conn.close().await.ok();
    Counters { lsn, bytes, full_pages }
}
