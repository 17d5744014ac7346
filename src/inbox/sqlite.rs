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
    (8, include_str!("sql/sqlite_0008_waiting_key.sql")),
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
    claim_where!(),
    ")\nRETURNING *"
);

/// The insert (public for the tests that interleave by hand).
#[doc(hidden)]
pub const INSERT_SQL: &str = include_str!("sql/insert.sql");

/// Rows in one multi-row insert at most (18 parameters each).
const INSERT_CHUNK: usize = 64;

/// The multi-row insert of `n` rows (a power of two up to [`INSERT_CHUNK`]): the
/// statement of `sql/insert.sql` reading its values from a `VALUES` list of `n` rows
/// of 18 anonymous `?` each, bound row by row in `$1`–`$18` order (where `insert.sql`
/// says `$k`, this says `v.columnk`), returning `(id, route, dedup key)` of the rows
/// inserted. Built once per size.
///
/// Anonymous, not numbered: sqlx asks SQLite for every parameter's name, and SQLite
/// finds a name by walking the statement's list of named parameters, so 1,152
/// numbered ones (`$1`…`$1152`) cost about 660,000 steps per statement — measured,
/// `sqlite3_bind_parameter_name` was the inlet process's hottest function during push
/// ingest. Unnamed parameters are not in that list. The rows of a `VALUES` list are
/// inserted in their order, so ids are still drawn in the batch's order (`WHERE true`
/// is SQLite's rule for an upsert whose rows come from a `SELECT`).
fn insert_many_sql(n: usize) -> &'static str {
    static SQL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let all = SQL.get_or_init(|| {
        let (columns, rest) = INSERT_SQL.split_once("VALUES (").expect("insert.sql has a VALUES row");
        let (row, _) = rest.split_once(")\nON CONFLICT").expect("insert.sql has an ON CONFLICT clause");
        let mut select = String::with_capacity(row.len() * 2);
        let mut params = 0;
        let mut chars = row.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '$' {
                select.push(c);
                continue;
            }
            let mut digits = String::new();
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                digits.push(d);
            }
            let k: usize = digits.parse().expect("a numbered parameter");
            params = params.max(k);
            select.push_str(&format!("v.column{k}"));
        }
        let one = format!("({})", vec!["?"; params].join(", "));
        (0..=INSERT_CHUNK.ilog2())
            .map(|p| {
                format!(
                    "{columns}SELECT {select}\nFROM (VALUES {}) AS v WHERE true\n\
                     ON CONFLICT (route, dedup_key) DO NOTHING\nRETURNING id, route, dedup_key",
                    vec![one.as_str(); 1 << p].join(",\n")
                )
            })
            .collect()
    });
    &all[n.ilog2() as usize]
}

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
    /// The batch insert's fast path: the new rows in multi-row `INSERT … VALUES`
    /// statements of [`INSERT_CHUNK`] rows at most (sizes in powers of two, so a few
    /// prepared statements serve every batch), in array order, so ids are drawn in
    /// the batch's order. The id of each entry inserted; `None` for the others (a
    /// redelivery, a dedup-key conflict, a second entry of the batch with an earlier
    /// one's dedup key), which the caller inserts one by one in the same transaction.
    /// A statement costs no round trip here, but each still crosses to the
    /// connection's thread and back and is bound and stepped on its own: at batch
    /// sizes, that is most of an insert's cost.
    async fn insert_new_rows(
        conn: &mut SqliteConnection,
        entries: &[super::NewEntry],
        now: crate::clock::Millis,
    ) -> Result<Option<Vec<Option<super::InsertOutcome>>>, StoreError> {
        use super::InsertOutcome;
        let mut inserted: std::collections::HashMap<(&str, &str), i64> = std::collections::HashMap::new();
        let mut rest = entries;
        while !rest.is_empty() {
            let n = INSERT_CHUNK.min(1 << rest.len().ilog2());
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let sql = insert_many_sql(n);
            let mut query = sqlx::query_as::<_, (i64, String, String)>(sql);
            for e in chunk {
                query = bind_entry!(
                    query,
                    e,
                    &e.dedup_key,
                    e.payload_digest(),
                    None::<i64>,
                    e.status,
                    e.last_error.as_deref(),
                    now
                );
            }
            for (id, route, key) in query.fetch_all(&mut *conn).await? {
                // The statement's rows are the batch's own (route, dedup key) pairs.
                if let Some(e) = chunk.iter().find(|e| e.route == route && e.dedup_key == key) {
                    inserted.insert((e.route.as_str(), e.dedup_key.as_str()), id);
                }
            }
        }
        // A dedup key inserted belongs to the first entry of the batch that has it
        // (rows go in array order); a later one with the same key goes one by one.
        Ok(Some(
            entries
                .iter()
                .map(|e| {
                    inserted.remove(&(e.route.as_str(), e.dedup_key.as_str())).map(|id| InsertOutcome::Inserted { id })
                })
                .collect(),
        ))
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
