//! Warm connections: the group-commit writers' transactions (batches of settles and
//! of inserts) go out on the connection they used last, instead of on whichever the
//! pool hands out next.
//!
//! sqlx's pool hands out its idle connections oldest first, so two writers committing
//! in turn walk through all of its connections, and on PostgreSQL through as many
//! server processes, each with its own caches, none of them warm; and it pings each
//! connection given back (a round trip, in a task of its own). Kept apart and taken
//! newest first, the writers' batches run on about as many server processes as there
//! are writers, and nothing is pinged between batches. On a 10-key drain that is
//! 4,804–5,218 against 3,872–4,578 deliveries/s (1.14–1.24× pair by pair), PostgreSQL
//! 170–185 against 189–228 µs per delivery; 1,000 keys drain as before
//! (docs/measurements.md, "A 10-key turn, phase by phase, and warm connections for
//! the writers").
//!
//! A kept connection is a connection checked out of the pool: at most `most` are kept
//! (the rest go back), so the pool's other users are never short by more than that.
//! One kept idle for [`PING_IF_IDLE_FOR`] or longer is pinged before it is used, as
//! the pool does with its own (a server that restarted meanwhile closed it), and
//! dropped if the ping fails. A connection whose transaction failed is not kept: it
//! goes back to the pool, which rolls back what it left and closes a broken one.
//!
//! A writer may change a kept connection's session (PostgreSQL's inserts set
//! `plan_cache_mode` once per connection, so that a batch can run without a
//! transaction around it): it says so ([`Warm::alter`]), and such a connection never
//! goes back to the pool, whose other users expect the server's defaults; it is
//! closed instead when it is not kept.

use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, Database, Pool};

/// How long a connection may sit idle before it is pinged when taken (kept apart or
/// in the pool): a connection that died idle (the server restarted, a middlebox
/// dropped it) is replaced before a statement meets it, while the hot path, whose
/// connections come back and go out within milliseconds, pays no round trip.
pub const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The connections kept for the writers, the most recently used last, each with when
/// it was kept and whether its session was altered.
pub struct Kept<DB: Database> {
    stack: std::sync::Mutex<Vec<(PoolConnection<DB>, Instant, bool)>>,
    most: usize,
}

impl<DB: Database> Kept<DB> {
    /// Keeps at most `most` (0: none, every connection goes back to the pool).
    pub fn new(most: usize) -> Kept<DB> {
        Kept { stack: std::sync::Mutex::new(Vec::new()), most }
    }

    /// The most recently used kept connection that still answers, else one from
    /// `pool`.
    pub async fn take<'a>(&'a self, pool: &Pool<DB>) -> Result<Warm<'a, DB>, sqlx::Error> {
        loop {
            let top = self.stack.lock().expect("warm connections lock").pop();
            let Some((mut conn, since, altered)) = top else {
                return Ok(Warm { kept: self, conn: Some(pool.acquire().await?), altered: false });
            };
            if since.elapsed() >= PING_IF_IDLE_FOR && conn.ping().await.is_err() {
                // Not back into the pool: closed, and the pool may open another.
                conn.close_on_drop();
                continue;
            }
            return Ok(Warm { kept: self, conn: Some(conn), altered });
        }
    }
}

/// A connection taken by [`Kept::take`]: kept again by [`Warm::keep`] after a clean
/// end; back to the pool if dropped without it, or closed if its session was altered.
pub struct Warm<'a, DB: Database> {
    kept: &'a Kept<DB>,
    conn: Option<PoolConnection<DB>>,
    altered: bool,
}

impl<DB: Database> Warm<'_, DB> {
    pub fn conn(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("a warm connection until kept")
    }

    /// How many connections its keeper keeps at most.
    pub fn keeps(&self) -> usize {
        self.kept.most
    }

    /// Whether a writer changed this connection's session ([`Warm::alter`]).
    pub fn altered(&self) -> bool {
        self.altered
    }

    /// This connection's session now differs from the server's defaults: it is kept
    /// for the writers or closed, never given back to the pool.
    pub fn alter(&mut self) {
        self.altered = true;
    }

    /// Its transaction ended cleanly: kept for the next writer, unless enough are.
    pub fn keep(mut self) {
        let mut conn = self.conn.take().expect("a warm connection until kept");
        let mut stack = self.kept.stack.lock().expect("warm connections lock");
        if stack.len() < self.kept.most {
            stack.push((conn, Instant::now(), self.altered));
        } else if self.altered {
            conn.close_on_drop();
        }
    }
}

impl<DB: Database> Drop for Warm<'_, DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.as_mut().filter(|_| self.altered) {
            conn.close_on_drop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::sqlite::{Sqlite, SqlitePoolOptions};

    /// A connection whose session a writer altered is kept for the writers or closed:
    /// the pool never hands it to anyone else.
    #[tokio::test]
    async fn an_altered_connection_never_goes_back_to_the_pool() {
        let pool = SqlitePoolOptions::new().max_connections(3).connect("sqlite::memory:").await.unwrap();
        let kept: Kept<Sqlite> = Kept::new(1);
        let (mut a, mut b) = (kept.take(&pool).await.unwrap(), kept.take(&pool).await.unwrap());
        assert!(!a.altered() && !b.altered(), "fresh from the pool");
        a.alter();
        b.alter();
        a.keep();
        b.keep(); // one too many to keep: closed
        let again = kept.take(&pool).await.unwrap();
        assert!(again.altered(), "the kept one remembers its session was altered");
        drop(again); // dropped without keeping: closed too
        let plain = kept.take(&pool).await.unwrap();
        assert!(!plain.altered());
        plain.keep();
        for _ in 0..100 {
            if pool.size() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await; // closes finish in tasks of their own
        }
        assert_eq!(pool.size(), 1, "both altered connections were closed; the plain one is kept");
        assert_eq!(pool.num_idle(), 0, "and none went back idle into the pool");
    }
}
