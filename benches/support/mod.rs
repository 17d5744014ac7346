//! Shared by the store benchmarks (`mod support;`): the raw insert rate of a database,
//! measured beside Inlet in the same run, and the table the figures are printed in.
//!
//! The baseline writes a row of about an inbox row's size into a scratch table
//! (`bench_raw`, no secondary index) through the benchmark's own pool, opened with
//! exactly Inlet's settings: what the database can do with nothing of Inlet on top.
//!
//! A folder with a `mod.rs` and no `main.rs`: cargo does not take it for a benchmark.

#![allow(dead_code)] // each benchmark uses part of it

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqlitePool, SqlitePoolOptions};

pub mod calls;
pub mod cpu;
pub mod delay;
pub mod wal;

/// Connections of the baseline's pool: Inlet's default `store.max_connections`.
pub const POOL_SIZE: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    /// Parses `--store`: `sqlite`, `postgres` (`pg`) or `both`.
    pub fn parse_list(value: &str) -> Result<Vec<Backend>, String> {
        match value {
            "sqlite" => Ok(vec![Backend::Sqlite]),
            "postgres" | "pg" => Ok(vec![Backend::Postgres]),
            "both" => Ok(vec![Backend::Sqlite, Backend::Postgres]),
            other => Err(format!("--store: `{other}` is not sqlite, postgres or both")),
        }
    }

    fn raw_table_ddl(self) -> &'static str {
        match self {
            Backend::Sqlite => {
                "CREATE TABLE bench_raw (id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, \
                 dedup_key TEXT NOT NULL, correlation_key TEXT, body BLOB, raw_data BLOB NOT NULL, \
                 payload_digest TEXT NOT NULL, status TEXT NOT NULL, received_at INTEGER NOT NULL, \
                 updated_at INTEGER NOT NULL)"
            }
            Backend::Postgres => {
                "CREATE TABLE bench_raw (id BIGSERIAL PRIMARY KEY, route TEXT NOT NULL, \
                 dedup_key TEXT NOT NULL, correlation_key TEXT, body BYTEA, raw_data BYTEA NOT NULL, \
                 payload_digest TEXT NOT NULL, status TEXT NOT NULL, received_at BIGINT NOT NULL, \
                 updated_at BIGINT NOT NULL)"
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Raw insert baseline
// ---------------------------------------------------------------------------------------

/// A row of about an inbox row's size: the work-order payload as it arrives and as it
/// is decoded (~100 bytes each), a SHA-256 hex digest, a few short TEXT and BIGINT columns.
pub struct RawRow {
    pub route: String,
    pub dedup_key: String,
    pub correlation_key: String,
    pub body: Vec<u8>,
    pub raw_data: Vec<u8>,
    pub digest: String,
    pub now: i64,
}

impl RawRow {
    /// Row `i` of route `route`, for key `key-{i % keys}`.
    pub fn new(route: &str, i: usize, keys: usize) -> RawRow {
        let key = format!("key-{}", i % keys);
        let raw = format!(
            r#"{{"workOrderId":"{key}","completedItems":{},"completionTimestamp":"2026-08-01T10:00:00Z"}}"#,
            i / keys + 1
        );
        RawRow {
            route: route.into(),
            dedup_key: format!("bench-{i}"),
            correlation_key: key,
            body: raw.clone().into_bytes(),
            digest: inlet::inbox::digest_hex(raw.as_bytes()),
            raw_data: raw.into_bytes(),
            now: 1_785_000_000_000 + i as i64,
        }
    }

    /// Rows `0..n` of `route` over `keys` keys.
    pub fn many(route: &str, n: usize, keys: usize) -> Arc<Vec<RawRow>> {
        Arc::new((0..n).map(|i| RawRow::new(route, i, keys)).collect())
    }
}

const RAW_INSERT: &str = "INSERT INTO bench_raw (route, dedup_key, correlation_key, body, raw_data, payload_digest, \
                          status, received_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'OPEN', $7, $7)";

/// Creates the scratch table the baseline writes to.
pub async fn create_raw_table(db: &Db, backend: Backend) {
    db.exec(backend.raw_table_ddl()).await.expect("create the baseline table");
}

/// Drops the scratch table (and, on SQLite, truncates the WAL) so that what is
/// measured next starts from a database as Inlet would find it.
pub async fn drop_raw_table(db: &Db, backend: Backend) {
    db.exec("DROP TABLE bench_raw").await.expect("drop the baseline table");
    if backend == Backend::Sqlite {
        db.exec("PRAGMA wal_checkpoint(TRUNCATE)").await.expect("checkpoint");
    }
}

/// N rows, one autocommitted INSERT each (as Inlet's push ingest does), from `tasks` tasks.
pub async fn raw_insert_one_per_tx(db: &Db, rows: &Arc<Vec<RawRow>>, tasks: usize) -> Duration {
    db.exec("DELETE FROM bench_raw").await.expect("empty the baseline table");
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let (db, rows) = (db.clone(), Arc::clone(rows));
        set.spawn(async move {
            for row in rows.iter().skip(t).step_by(tasks) {
                db.insert_one(row).await.expect("raw insert");
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("insert task");
    }
    start.elapsed()
}

/// N rows, `batch` per transaction, batches shared out over `tasks` tasks.
pub async fn raw_insert_batched(db: &Db, rows: &Arc<Vec<RawRow>>, batch: usize, tasks: usize) -> Duration {
    db.exec("DELETE FROM bench_raw").await.expect("empty the baseline table");
    let batches = rows.len().div_ceil(batch);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks.min(batches) {
        let (db, rows) = (db.clone(), Arc::clone(rows));
        set.spawn(async move {
            for b in (t..batches).step_by(tasks) {
                let chunk = &rows[b * batch..((b + 1) * batch).min(rows.len())];
                db.insert_batch(chunk).await.expect("raw batch insert");
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("insert task");
    }
    start.elapsed()
}

/// Binds a [`RawRow`] to a statement written like `RAW_INSERT`.
macro_rules! bind_row {
    ($sql:expr, $row:expr) => {
        sqlx::query($sql)
            .bind(&$row.route)
            .bind(&$row.dedup_key)
            .bind(&$row.correlation_key)
            .bind($row.body.as_slice())
            .bind($row.raw_data.as_slice())
            .bind(&$row.digest)
            .bind($row.now)
    };
}
/// `sqlx::query(SQL)` with a [`RawRow`] bound as `$1`–`$7` (the baseline's statements).
#[allow(unused_imports)] // not every benchmark that includes this module binds raw rows
pub(crate) use bind_row;

/// The benchmark's own connection pool to the store's database.
#[derive(Clone)]
pub enum Db {
    Sqlite(SqlitePool),
    Pg(PgPool),
}

impl Db {
    pub async fn open(backend: Backend, url: &str) -> Db {
        match backend {
            // Exactly the pragmas Inlet's SQLite store uses.
            Backend::Sqlite => {
                let options = inlet::inbox::sqlite::connect_options(url).expect("sqlite url");
                let pool = SqlitePoolOptions::new()
                    .max_connections(POOL_SIZE)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect_with(options)
                    .await
                    .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
                Db::Sqlite(pool)
            }
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(POOL_SIZE)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
                Db::Pg(pool)
            }
        }
    }

    pub async fn exec(&self, sql: &str) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Db::Pg(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
        }
    }

    async fn insert_one(&self, row: &RawRow) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(p) => bind_row!(RAW_INSERT, row).execute(p).await.map(drop),
            Db::Pg(p) => bind_row!(RAW_INSERT, row).execute(p).await.map(drop),
        }
    }

    async fn insert_batch(&self, rows: &[RawRow]) -> Result<(), sqlx::Error> {
        match self {
            Db::Sqlite(p) => {
                let mut tx = p.begin().await?;
                for row in rows {
                    bind_row!(RAW_INSERT, row).execute(&mut *tx).await?;
                }
                tx.commit().await
            }
            Db::Pg(p) => {
                let mut tx = p.begin().await?;
                for row in rows {
                    bind_row!(RAW_INSERT, row).execute(&mut *tx).await?;
                }
                tx.commit().await
            }
        }
    }

    /// The single `BIGINT` a query like `SELECT COUNT(*) …` returns; `$1`, if the
    /// query has it, is bound to `arg`.
    pub async fn count(&self, sql: &str, arg: Option<&str>) -> i64 {
        let n = match self {
            Db::Sqlite(p) => {
                let q = sqlx::query_scalar::<_, i64>(sql);
                match arg {
                    Some(a) => q.bind(a).fetch_one(p).await,
                    None => q.fetch_one(p).await,
                }
            }
            Db::Pg(p) => {
                let q = sqlx::query_scalar::<_, i64>(sql);
                match arg {
                    Some(a) => q.bind(a).fetch_one(p).await,
                    None => q.fetch_one(p).await,
                }
            }
        };
        n.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn close(&self) {
        match self {
            Db::Sqlite(p) => p.close().await,
            Db::Pg(p) => p.close().await,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

/// `N / d` as `12345 unit  (1.23 s)`.
/// The built work-order plugin; exits with a hint when `scripts/build-plugins` has
/// not run (a benchmark has no test harness to fail in).
pub fn work_order_plugin(bench: &str) -> std::path::PathBuf {
    let plugin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/dist/work_order.wasm");
    if !plugin.is_file() {
        eprintln!("{bench}: {} is missing; run scripts/build-plugins first", plugin.display());
        std::process::exit(2);
    }
    plugin
}

pub fn rate(n: usize, d: Duration, unit: &str) -> String {
    format!("{:.0} {unit}  ({:.2} s)", n as f64 / d.as_secs_f64(), d.as_secs_f64())
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Rows of `store | metric | value`, printed aligned.
#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 3]>,
}

impl Table {
    pub fn row(&mut self, store: &str, metric: String, value: String) {
        self.rows.push([store.to_string(), metric, value]);
    }

    pub fn render(&self) -> String {
        let header = ["store".to_string(), "metric".to_string(), "value".to_string()];
        let all: Vec<&[String; 3]> = std::iter::once(&header).chain(self.rows.iter()).collect();
        let w0 = all.iter().map(|r| r[0].len()).max().unwrap_or(0);
        let w1 = all.iter().map(|r| r[1].len()).max().unwrap_or(0);
        let mut out = String::new();
        for r in all {
            let _ = writeln!(out, "{:<w0$}  {:<w1$}  {}", r[0], r[1], r[2]);
        }
        out
    }
}
