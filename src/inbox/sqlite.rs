//! The embedded default: one instance, one SQLite file in WAL mode.
//!
//! SQLite has one writer. Claims are a single `UPDATE … WHERE id IN (…) RETURNING`
//! statement, which takes the write lock before it reads, so two claims can never
//! see the same candidates; a busy timeout makes writers queue instead of failing.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use super::StoreError;
use super::sqlstore::store_impl;

const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("sql/sqlite_0001_inbox.sql")),
    (2, include_str!("sql/sqlite_0002_audit.sql")),
    (3, include_str!("sql/sqlite_0003_not_yet_since.sql")),
    (4, include_str!("sql/sqlite_0004_route_pause.sql")),
    (5, include_str!("sql/sqlite_0005_attempts.sql")),
    (6, include_str!("sql/sqlite_0006_repair_jobs.sql")),
    (7, include_str!("sql/sqlite_0007_key_in_progress.sql")),
];

/// The connection settings of the inbox file (also what the benchmark's raw-insert
/// baseline uses, so the two are compared on equal terms).
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    Ok(SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: a committed row survives power loss, which is what the ack promises.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true))
}

pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options = connect_options(url)?;
        // A fresh setup has no folder for the file yet.
        if let Some(dir) = options.get_filename().parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        let store = SqliteStore { pool };
        store.migrate(MIGRATIONS, &[]).await?;
        Ok(store)
    }
}

/// The claim: one statement, which takes the write lock before it reads.
#[doc(hidden)]
pub const CLAIM_SQL: &str = concat!(
    "UPDATE inbox_entry SET\n",
    include_str!("sql/claim_set.sql"),
    "WHERE id IN (\n",
    include_str!("sql/claim_where.sql"),
    ")\nRETURNING *"
);

/// The insert (public for the tests that interleave by hand).
#[doc(hidden)]
pub const INSERT_SQL: &str = include_str!("sql/insert.sql");

impl SqliteStore {
    /// [`super::Store::gauge_lease`]: one instance per file, so always this one.
    async fn hold_gauge_lease(&self) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn claim_rows(&self, req: &super::ClaimRequest<'_>) -> Result<Vec<SqliteRow>, StoreError> {
        Ok(sqlx::query(CLAIM_SQL)
            .bind(req.route)
            .bind(req.now)
            .bind(req.ordered)
            .bind(req.parked_blocks)
            .bind(i64::from(req.limit))
            .bind(req.owner)
            .bind(req.lease_ms)
            .fetch_all(&self.pool)
            .await?)
    }
}

impl SqliteStore {
    /// No batch statement: the rows of a batch go one by one (in-process, a statement
    /// costs no round trip).
    async fn insert_new_rows(
        _conn: &mut SqliteConnection,
        _entries: &[super::NewEntry],
        _now: crate::clock::Millis,
    ) -> Result<Option<Vec<Option<i64>>>, StoreError> {
        Ok(None)
    }

    /// Nothing to do: SQLite reuses freed pages by itself, and its claim does not
    /// walk dead rows.
    async fn maintain_tables(&self) -> Result<Option<String>, StoreError> {
        Ok(None)
    }

    /// No batch statement: the settles of a batch go one by one.
    async fn settle_many(
        _conn: &mut SqliteConnection,
        _items: &[super::SettleRequest],
    ) -> Result<Option<Vec<bool>>, StoreError> {
        Ok(None)
    }
}

impl SqliteStore {
    /// One instance per file: nobody else to tell.
    async fn announce_to_others(&self, _routes: &[String]) -> Result<(), StoreError> {
        Ok(())
    }

    fn listen_to_others(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        None
    }
}

store_impl! {
    store: SqliteStore,
    backend: "sqlite",
    pool: SqlitePool,
    conn: SqliteConnection,
    row: SqliteRow,
    insert_sql: INSERT_SQL,
    // SQLite has no data-modifying CTE; its second statement costs no round trip.
    insert_or_existing_sql: None::<&str>,
    now_sql: "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)",
}
