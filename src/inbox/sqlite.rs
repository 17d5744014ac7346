//! The embedded default: one instance, one SQLite file in WAL mode.
//!
//! SQLite has one writer. Claims are a single `UPDATE … WHERE id IN (…) RETURNING`
//! statement, which takes the write lock before it reads, so two claims can never
//! see the same candidates; a busy timeout makes writers queue instead of failing.
//! One instance per file is enforced by [`InstanceLock`], which `inlet run` holds.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use super::StoreError;
use super::schema::Migration;
use super::sqlstore::store_impl;

/// The schema's migrations, oldest first (`inlet_schema` records which are applied).
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "inbox", include_str!("sql/sqlite_0001_inbox.sql")),
    Migration::new(2, "audit", include_str!("sql/sqlite_0002_audit.sql")),
    Migration::new(3, "not_yet_since", include_str!("sql/sqlite_0003_not_yet_since.sql")),
    Migration::new(4, "route_pause", include_str!("sql/sqlite_0004_route_pause.sql")),
    Migration::new(5, "attempts", include_str!("sql/sqlite_0005_attempts.sql")),
    Migration::new(6, "repair_jobs", include_str!("sql/sqlite_0006_repair_jobs.sql")),
    Migration::new(7, "key_in_progress", include_str!("sql/sqlite_0007_key_in_progress.sql")),
    Migration::new(8, "waiting_key", include_str!("sql/sqlite_0008_waiting_key.sql")),
    Migration::new(9, "replay_windows", include_str!("sql/sqlite_0009_replay_windows.sql")).compatible_from(8),
    Migration::new(10, "first_attempt", include_str!("sql/sqlite_0010_first_attempt.sql")).compatible_from(9),
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

/// The file a SQLite URL names; `None` for an in-memory database.
fn inbox_file(url: &str) -> Result<Option<PathBuf>, StoreError> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Ok(None);
    }
    Ok(Some(connect_options(url)?.get_filename().to_path_buf()))
}

pub struct SqliteStore {
    pool: SqlitePool,
    migrations: &'static [Migration],
    /// None kept: one writer, one file ([`super::warm`]).
    warm: super::warm::Kept<Sqlite>,
}

impl SqliteStore {
    /// Connects without looking at the schema. `create`: a missing file (and its
    /// folder) is created; else a missing file is [`StoreError::NoInbox`] and nothing
    /// is created.
    pub async fn connect(url: &str, max_connections: u32, create: bool) -> Result<Self, StoreError> {
        let options = connect_options(url)?.create_if_missing(create);
        if let Some(file) = inbox_file(url)? {
            if !create && !file.exists() {
                return Err(StoreError::NoInbox(file));
            }
            // A fresh setup has no folder for the file yet.
            if let Some(dir) = file.parent().filter(|d| create && !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
            }
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        Ok(SqliteStore { pool, migrations: MIGRATIONS, warm: super::warm::Kept::new(0) })
    }

    /// Every migration of a run applies in its one transaction: SQLite has nothing to
    /// build outside one (the migration lint refuses `outside_transaction` on this
    /// list).
    const OUTSIDE_TRANSACTIONS: bool = false;

    /// The connection a migration run is made on (no lock timeout: SQLite's busy
    /// timeout bounds the wait, and [`InstanceLock`] keeps running instances away).
    async fn migration_connection(
        &self,
        _lock_timeout: Duration,
    ) -> Result<sqlx::pool::PoolConnection<Sqlite>, StoreError> {
        Ok(self.pool.acquire().await?)
    }

    /// A migration run's transaction: `IMMEDIATE`, so it holds the write lock from its
    /// first read of `inlet_schema`.
    async fn begin_migration(conn: &mut SqliteConnection) -> Result<sqlx::Transaction<'_, Sqlite>, StoreError> {
        Ok(sqlx::Connection::begin_with(conn, "BEGIN IMMEDIATE").await?)
    }
}

/// "One instance per file", enforced: an exclusive `flock` on `<inbox>.lock` beside
/// the SQLite file, held while this value lives (`inlet run` for its whole life,
/// `inlet migrate` while it migrates). The other commands do not take it, so they work
/// beside a running instance. The file holds the holder's pid, for the refusal to
/// name; it is left in place when released (removing it would let a newcomer lock a
/// file another is about to open).
///
/// A lock file rather than the inbox itself: SQLite locks the inbox with `fcntl`
/// locks, which on some network file systems are the same locks as `flock`.
#[derive(Debug)]
pub struct InstanceLock {
    _file: std::fs::File,
    pub path: PathBuf,
}

impl InstanceLock {
    /// Takes the lock of the SQLite inbox a URL names. `None` for PostgreSQL and an
    /// in-memory database. `create`: the inbox's folder is created if missing (the
    /// caller is about to create the inbox); otherwise a missing inbox is
    /// [`StoreError::NoInbox`] and nothing is created.
    pub fn take(url: &str, create: bool) -> Result<Option<InstanceLock>, StoreError> {
        if !url.starts_with("sqlite:") {
            return Ok(None);
        }
        let Some(db) = inbox_file(url)? else { return Ok(None) };
        if !create && !db.exists() {
            return Err(StoreError::NoInbox(db));
        }
        if let Some(dir) = db.parent().filter(|d| create && !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|error| StoreError::InstanceLock { lock: lock_path(&db), error })?;
        }
        let path = lock_path(&db);
        let failed = |error| StoreError::InstanceLock { lock: path.clone(), error };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).ok().map(|pid| pid.trim().to_string());
                let holder =
                    holder.filter(|pid| !pid.is_empty()).map_or("another process".into(), |pid| format!("pid {pid}"));
                return Err(StoreError::InstanceRunning { db, lock: path, holder });
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(failed(error)),
        }
        use std::io::Write as _;
        file.set_len(0).and_then(|()| writeln!(file, "{}", std::process::id())).map_err(failed)?;
        Ok(Some(InstanceLock { _file: file, path }))
    }
}

/// `<inbox>.lock`, beside the inbox, its folder resolved (two spellings of one folder
/// lock one file).
fn lock_path(db: &Path) -> PathBuf {
    let dir = db.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.join(name)
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
/// finds a name by walking the statement's list of named parameters, so the lookups
/// grow with the square of the parameters (`sqlite3_bind_parameter_name` was the
/// hottest function of push ingest: docs/measurements.md). Unnamed parameters are not
/// in that list. The rows of a `VALUES` list are
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
    /// No batch commits without a transaction here: SQLite's `BEGIN` and `COMMIT` are
    /// calls in this process, not round trips, and its batch insert is many statements.
    async fn insert_alone(
        &self,
        _warm: &mut super::warm::Warm<'_, Sqlite>,
        _entries: &[super::NewEntry],
        _now: crate::clock::Millis,
    ) -> Result<Option<Vec<super::InsertOutcome>>, StoreError> {
        Ok(None)
    }

    /// Nor a settle batch: its statements go one by one, in the transaction.
    async fn settle_alone(
        &self,
        _warm: &mut super::warm::Warm<'_, Sqlite>,
        _items: &[super::SettleRequest],
    ) -> Result<Option<Vec<Result<Option<super::Claimed>, StoreError>>>, StoreError> {
        Ok(None)
    }

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

    /// No claim of a key's next entry with its settle: handing on is built for
    /// PostgreSQL's claims (their key locks and floors); here every ask is answered
    /// `None` and the entry waits for an ordinary claim.
    async fn claim_next(
        _conn: &mut SqliteConnection,
        items: &[super::SettleRequest],
        _settled: &[bool],
        _held: Option<&[bool]>,
    ) -> Result<Vec<Option<SqliteRow>>, StoreError> {
        Ok(items.iter().map(|_| None).collect())
    }

    /// A transaction of the hot path: an ordinary one here.
    async fn begin_hot(conn: &mut SqliteConnection) -> Result<sqlx::Transaction<'_, Sqlite>, StoreError> {
        Ok(sqlx::Connection::begin(conn).await?)
    }

    /// Claims do not count keys here.
    fn keys_counted(&self, _route: &str) -> Option<i64> {
        None
    }

    /// No batch statement: the settles of a batch go one by one.
    async fn settle_many(
        _conn: &mut SqliteConnection,
        _items: &[super::SettleRequest],
    ) -> Result<Option<Vec<(bool, bool)>>, StoreError> {
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

    /// One instance per file: every key is its own.
    async fn share_among_members(
        &self,
        _route: &str,
        _owner: &str,
        _presence: super::Presence,
    ) -> Result<Option<super::Share>, StoreError> {
        Ok(None)
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
    schema_columns_sql: "SELECT name FROM pragma_table_info('inlet_schema') ORDER BY cid",
    // One writer at a time: nothing to lock, and no key floors.
    rekey_sql: None,
}
