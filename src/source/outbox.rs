//! The outbox source: an application's outbox table in PostgreSQL, read in id order
//! and turned into inbox entries, each marked published (or deleted) once its entry
//! is finished (docs/outbox.md).
//!
//! - **One reader per outbox.** Every instance runs this source; the one that holds
//!   a session advisory lock on the application's database (keyed by the table) reads,
//!   the others stand by and try again every poll. A reader that dies loses its
//!   connection and so its lock, and another takes over. One reader keeps the inbox
//!   order of an aggregate's rows the row-id order: two readers splitting the rows
//!   (`FOR UPDATE SKIP LOCKED`) would let a later row of an aggregate into the inbox
//!   before an earlier one.
//! - **A row becomes an entry** through ingest like any message: its payload is the
//!   data, its id the message id (so the dedup key), its aggregate the ordering key
//!   (so the correlation key), its type and creation time attributes. Reading a row
//!   twice adds nothing. The relay publishes entries in order per aggregate, with
//!   leases, retries and parking, from every instance.
//! - **Marking is a reconciliation**, not a step after the publish: the reader looks
//!   up the entries of the unpublished rows it has read, and marks (or deletes) the rows
//!   whose entries are DONE or IGNORED. A crash anywhere leaves a row unmarked, never
//!   an entry lost; the next look marks it. A row found without an entry (its
//!   transaction committed after later rows were read) is read then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnection, PgListener};
use sqlx::{Connection, Row};
use tokio::sync::watch;

use crate::config::{AfterPublish, OutboxSource};
use crate::inbox::{DEDUP_LOOKUP_MAX, Status};
use crate::ingest::{Incoming, Ingest, IngestError};
use crate::routing::Route;
use crate::telemetry::{Metrics, RouteStage};

/// Reads one route's outbox while it runs.
pub struct OutboxReader {
    pub config: OutboxSource,
    pub route: Arc<Route>,
    pub ingest: Arc<Ingest>,
    pub metrics: Arc<Metrics>,
}

/// Why a reading session ended; the reader starts another after a pause.
#[derive(Debug, thiserror::Error)]
enum OutboxError {
    #[error("{stage}: {source}")]
    Db { stage: &'static str, source: sqlx::Error },
    #[error("table: {0}")]
    Table(String),
    #[error("store: {0}")]
    Store(#[from] IngestError),
}

impl OutboxError {
    fn stage(&self) -> &'static str {
        match self {
            OutboxError::Db { stage, .. } => stage,
            OutboxError::Table(_) => "table",
            OutboxError::Store(_) => "store",
        }
    }
}

/// `map_err` for a database call at `stage`.
fn at(stage: &'static str) -> impl Fn(sqlx::Error) -> OutboxError {
    move |source| OutboxError::Db { stage, source }
}

/// A row as read.
struct OutboxRow {
    id: i64,
    aggregate: String,
    event_type: String,
    payload: Vec<u8>,
    created_ms: i64,
}

/// The SQL of one outbox, built once from its checked identifiers.
struct Queries {
    /// The last id the table's sequence gave out.
    last_drawn: String,
    /// The transactions other than this session's that hold a write lock on the
    /// table now, by virtual transaction id.
    writers: String,
    /// Of the virtual transactions given, those that still hold it.
    still_writing: String,
    read: String,
    pending: String,
    mark: String,
    waiting: String,
    reread: String,
}

/// The longest pause between two sessions after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl OutboxReader {
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let name = self.route.name().to_string();
        let mut failures = 0u32;
        loop {
            let result = self.session(&mut stop).await;
            // What this instance counted as the reader is not its to report any more.
            let label = Metrics::route(&name);
            self.metrics.outbox_reading.get_or_create(&label).set(0);
            self.metrics.outbox_rows_waiting.get_or_create(&label).set(0);
            self.metrics.outbox_oldest_seconds.get_or_create(&label).set(0.0);
            match result {
                Ok(()) => return,
                Err(error) => {
                    failures += 1;
                    let stage = RouteStage { route: name.clone(), stage: error.stage() };
                    self.metrics.outbox_errors.get_or_create(&stage).inc();
                    tracing::warn!(route = %name, outbox = %self.config.table, %error, failures, "outbox reading stopped; trying again");
                    let pause = Duration::from_secs(1).saturating_mul(1 << failures.min(5)).min(MAX_BACKOFF);
                    if !sleep_or_stop(pause, &mut stop).await {
                        return;
                    }
                }
            }
        }
    }

    /// Connects, waits to be the reader, then reads until stopped (`Ok`) or until
    /// something fails (`Err`: the connection, and with it the lock, is dropped).
    async fn session(&self, stop: &mut watch::Receiver<bool>) -> Result<(), OutboxError> {
        let name = self.route.name();
        let mut conn = PgConnection::connect(self.config.url.expose()).await.map_err(at("connect"))?;
        let queries = self.queries(&mut conn).await?;
        let lock = lock_key(&self.config.table);
        let standby = self.config.poll.max(Duration::from_secs(1));
        let mut said_standby = false;
        loop {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(lock)
                .fetch_one(&mut conn)
                .await
                .map_err(at("connect"))?;
            if got {
                break;
            }
            if !said_standby {
                tracing::info!(route = name, outbox = %self.config.table, "another instance reads this outbox; standing by");
                said_standby = true;
            }
            if !sleep_or_stop(standby, stop).await {
                return Ok(());
            }
        }
        tracing::info!(route = name, outbox = %self.config.table, "this instance reads the outbox");
        self.metrics.outbox_reading.get_or_create(&Metrics::route(name)).set(1);
        let mut listener = PgListener::connect(self.config.url.expose()).await.map_err(at("connect"))?;
        listener.listen(&self.config.channel).await.map_err(at("connect"))?;
        let reconcile_every = self.config.poll.max(Duration::from_secs(1));
        let mut reconciled = Instant::now().checked_sub(reconcile_every).unwrap_or_else(Instant::now);
        // Every row with an id up to here was read and stored (or found stored).
        let mut cursor: i64 = 0;
        let mut horizon = Horizon::default();
        loop {
            horizon.advance(&mut conn, &queries).await?;
            let rows = read_rows(&mut conn, &queries.read, cursor, horizon.settled, self.config.batch_size).await?;
            let full = rows.len() == self.config.batch_size;
            if let Some(last) = rows.last().map(|r| r.id) {
                self.store(rows).await?;
                cursor = last;
            }
            if reconciled.elapsed() >= reconcile_every {
                self.reconcile(&mut conn, &queries, cursor).await?;
                reconciled = Instant::now();
            }
            if *stop.borrow() {
                return Ok(());
            }
            if full {
                continue;
            }
            // The writers the horizon waits for are mostly a commit away: look again
            // soon, for a while, then at the pace of the poll.
            if horizon.waiting_since().is_some_and(|since| since.elapsed() < self.config.poll) {
                if !sleep_or_stop(HORIZON_RECHECK, stop).await {
                    return Ok(());
                }
                continue;
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return Ok(()),
                // A lost listener connection reconnects inside `recv`; the poll covers
                // what was announced meanwhile.
                woken = listener.recv() => { woken.map_err(at("connect"))?; }
                _ = tokio::time::sleep(self.config.poll) => {}
            }
        }
    }

    /// Checks the table's columns and builds its queries: a missing table or column
    /// stops the session with its name (and is retried: a migration may add it).
    async fn queries(&self, conn: &mut PgConnection) -> Result<Queries, OutboxError> {
        let c = &self.config.columns;
        let (schema, table) = match self.config.table.split_once('.') {
            Some((schema, table)) => (Some(schema), table),
            None => (None, self.config.table.as_str()),
        };
        let found: Vec<(String, String)> = sqlx::query_as(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_name = $1 AND table_schema = coalesce($2, current_schema())",
        )
        .bind(table)
        .bind(schema)
        .fetch_all(&mut *conn)
        .await
        .map_err(at("table"))?;
        if found.is_empty() {
            return Err(OutboxError::Table(format!("table `{}` not found", self.config.table)));
        }
        let type_of = |column: &str| found.iter().find(|(n, _)| n == column).map(|(_, t)| t.as_str());
        let mut needed = vec![&c.id, &c.aggregate, &c.event_type, &c.payload, &c.created];
        if self.config.after_publish == AfterPublish::Mark {
            needed.push(&c.published);
        }
        for column in needed {
            if type_of(column).is_none() {
                return Err(OutboxError::Table(format!("table `{}` has no column `{column}`", self.config.table)));
            }
        }
        if !matches!(type_of(&c.id), Some("bigint" | "integer" | "smallint")) {
            return Err(OutboxError::Table(format!(
                "column `{}` of `{}` is {}, not an increasing integer (bigserial or identity)",
                c.id,
                self.config.table,
                type_of(&c.id).unwrap_or("?")
            )));
        }
        let sequence: Option<String> = sqlx::query_scalar("SELECT pg_get_serial_sequence($1, $2)")
            .bind(&self.config.table)
            .bind(&c.id)
            .fetch_one(&mut *conn)
            .await
            .map_err(at("table"))?;
        let Some(sequence) = sequence else {
            return Err(OutboxError::Table(format!(
                "column `{}` of `{}` draws from no sequence (make it bigserial or an identity column): \
                 the insert order is read from it",
                c.id, self.config.table
            )));
        };
        let payload = match type_of(&c.payload) {
            Some("bytea") => format!("coalesce({}, ''::bytea)", c.payload),
            _ => format!("convert_to(coalesce({}::text, ''), 'UTF8')", c.payload),
        };
        let t = &self.config.table;
        let unpublished = match self.config.after_publish {
            AfterPublish::Mark => format!("{} IS NULL", c.published),
            AfterPublish::Delete => "TRUE".to_string(),
        };
        let columns = format!(
            "{id}::bigint AS id, coalesce({agg}::text, '') AS aggregate, coalesce({ty}::text, '') AS event_type, \
             {payload} AS payload, (extract(epoch FROM {created}) * 1000)::bigint AS created_ms",
            id = c.id,
            agg = c.aggregate,
            ty = c.event_type,
            created = c.created,
        );
        let mark = match self.config.after_publish {
            AfterPublish::Mark => format!(
                "UPDATE {t} SET {p} = now() WHERE {id} = ANY($1) AND {p} IS NULL \
                 RETURNING extract(epoch FROM now() - {created})::float8",
                p = c.published,
                id = c.id,
                created = c.created
            ),
            AfterPublish::Delete => format!(
                "DELETE FROM {t} WHERE {id} = ANY($1) RETURNING extract(epoch FROM now() - {created})::float8",
                id = c.id,
                created = c.created
            ),
        };
        let table_lock = format!(
            "FROM pg_locks WHERE relation = to_regclass('{t}') AND mode = 'RowExclusiveLock' AND granted \
             AND pid IS DISTINCT FROM pg_backend_pid()"
        );
        // Unpublished rows after $1, up to $2, at most $3.
        let range =
            format!("FROM {t} WHERE {unpublished} AND {id} > $1 AND {id} <= $2 ORDER BY {id} LIMIT $3", id = c.id);
        Ok(Queries {
            last_drawn: format!(
                "SELECT coalesce(pg_sequence_last_value('{}'::regclass), 0)",
                sequence.replace('\'', "''")
            ),
            writers: format!("SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{{}}') {table_lock}"),
            still_writing: format!("SELECT count(*) {table_lock} AND virtualtransaction = ANY($1)"),
            read: format!("SELECT {columns} {range}"),
            pending: format!("SELECT {id}::bigint {range}", id = c.id),
            mark,
            waiting: format!(
                "SELECT count(*), extract(epoch FROM now() - min({created}))::float8 FROM {t} WHERE {unpublished}",
                created = c.created
            ),
            reread: format!(
                "SELECT {columns} FROM {t} WHERE {unpublished} AND {id} = ANY($1) ORDER BY {id}",
                id = c.id
            ),
        })
    }

    /// Hands rows to ingest in one batch, in id order.
    async fn store(&self, rows: Vec<OutboxRow>) -> Result<(), OutboxError> {
        let messages: Vec<Incoming> = rows.into_iter().map(incoming).collect();
        let outcomes = self.ingest.accept_batch(&self.route, messages).await?;
        let new = outcomes.iter().filter(|o| matches!(o, crate::inbox::InsertOutcome::Inserted { .. })).count();
        self.metrics.outbox_read.get_or_create(&Metrics::route(self.route.name())).inc_by(new as u64);
        Ok(())
    }

    /// Marks the rows up to `cursor` whose entries are finished, reads those that
    /// have none, and counts what still waits.
    async fn reconcile(&self, conn: &mut PgConnection, q: &Queries, cursor: i64) -> Result<(), OutboxError> {
        let name = self.route.name();
        let limits = &self.route.config.limits;
        let mut after = 0i64;
        loop {
            let ids: Vec<i64> = sqlx::query_scalar(&q.pending)
                .bind(after)
                .bind(cursor)
                .bind(DEDUP_LOOKUP_MAX as i64)
                .fetch_all(&mut *conn)
                .await
                .map_err(at("read"))?;
            let Some(&last) = ids.last() else { break };
            let keys: Vec<String> =
                ids.iter().map(|id| crate::rules::message_id_key(&id.to_string(), limits)).collect();
            let statuses = self
                .ingest
                .store
                .dedup_statuses(name, &keys)
                .await
                .map_err(|e| OutboxError::Store(IngestError::Store(e)))?;
            let status_of = |key: &str| statuses.iter().find(|(k, _)| k == key).map(|(_, s)| *s);
            let mut finished = Vec::new();
            let mut missing = Vec::new();
            for (id, key) in ids.iter().zip(&keys) {
                match status_of(key) {
                    Some(Status::Done | Status::Ignored) => finished.push(*id),
                    Some(_) => {}
                    None => missing.push(*id),
                }
            }
            if !finished.is_empty() {
                let lags: Vec<Option<f64>> =
                    sqlx::query_scalar(&q.mark).bind(&finished).fetch_all(&mut *conn).await.map_err(at("mark"))?;
                self.metrics.outbox_marked.get_or_create(&Metrics::route(name)).inc_by(lags.len() as u64);
                let histogram = self.metrics.outbox_lag_seconds.get_or_create(&Metrics::route(name)).clone();
                for lag in lags.into_iter().flatten() {
                    histogram.observe(lag.max(0.0));
                }
            }
            if !missing.is_empty() {
                let rows: Vec<OutboxRow> = sqlx::query(&q.reread)
                    .bind(&missing)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(at("read"))?
                    .iter()
                    .map(row_of)
                    .collect::<Result<_, _>>()
                    .map_err(at("read"))?;
                if !rows.is_empty() {
                    tracing::warn!(route = name, outbox = %self.config.table, rows = ?missing, "outbox rows committed after later rows were read; reading them now (each after the later rows of its aggregate)");
                    self.store(rows).await?;
                }
            }
            after = last;
        }
        let (waiting, oldest): (i64, Option<f64>) =
            sqlx::query_as(&q.waiting).fetch_one(&mut *conn).await.map_err(at("read"))?;
        self.metrics.outbox_rows_waiting.get_or_create(&Metrics::route(name)).set(waiting);
        self.metrics.outbox_oldest_seconds.get_or_create(&Metrics::route(name)).set(oldest.unwrap_or(0.0).max(0.0));
        Ok(())
    }
}

/// How far the table is settled: every id up to `settled` was given to a transaction
/// that has ended (committed, so its row is visible, or rolled back), so no row below
/// it can still appear. Rows are read only up to it, so an aggregate's rows enter
/// the inbox in id order even when transactions commit out of id order.
///
/// Why this holds: a transaction takes its write lock on the table before its
/// insert draws an id, and keeps it until it ends. So at any moment, the ids drawn so
/// far (`last_drawn`, read first) belong to ended transactions or to those holding the
/// lock (`writers`, read second). Once those have ended, every id up to `last_drawn`
/// is settled. The one way around it is an id drawn with `nextval` by a transaction
/// that inserts it later, not by the column's default; such a row committed late is
/// found by the reconciliation and published then (docs/outbox.md).
#[derive(Default)]
struct Horizon {
    settled: i64,
    /// A `last_drawn` waiting for its writers to end, and since when.
    pending: Option<(i64, Vec<String>, Instant)>,
}

/// How soon the horizon is looked at again while it waits for writers.
const HORIZON_RECHECK: Duration = Duration::from_millis(20);

impl Horizon {
    async fn advance(&mut self, conn: &mut PgConnection, q: &Queries) -> Result<(), OutboxError> {
        if let Some((drawn, writers, _)) = &self.pending {
            let still: i64 =
                sqlx::query_scalar(&q.still_writing).bind(writers).fetch_one(&mut *conn).await.map_err(at("read"))?;
            if still > 0 {
                return Ok(());
            }
            self.settled = self.settled.max(*drawn);
            self.pending = None;
        }
        let drawn: i64 = sqlx::query_scalar(&q.last_drawn).fetch_one(&mut *conn).await.map_err(at("read"))?;
        let writers: Vec<String> = sqlx::query_scalar(&q.writers).fetch_one(&mut *conn).await.map_err(at("read"))?;
        if writers.is_empty() {
            self.settled = self.settled.max(drawn);
        } else {
            self.pending = Some((drawn, writers, Instant::now()));
        }
        Ok(())
    }

    fn waiting_since(&self) -> Option<Instant> {
        self.pending.as_ref().map(|(_, _, since)| *since)
    }
}

async fn read_rows(
    conn: &mut PgConnection,
    sql: &str,
    cursor: i64,
    horizon: i64,
    limit: usize,
) -> Result<Vec<OutboxRow>, OutboxError> {
    let rows =
        sqlx::query(sql).bind(cursor).bind(horizon).bind(limit as i64).fetch_all(conn).await.map_err(at("read"))?;
    rows.iter().map(row_of).collect::<Result<_, _>>().map_err(at("read"))
}

fn row_of(row: &sqlx::postgres::PgRow) -> Result<OutboxRow, sqlx::Error> {
    Ok(OutboxRow {
        id: row.try_get("id")?,
        aggregate: row.try_get("aggregate")?,
        event_type: row.try_get("event_type")?,
        payload: row.try_get("payload")?,
        created_ms: row.try_get::<Option<i64>, _>("created_ms")?.unwrap_or(0),
    })
}

/// A row as a message: the id names it, the aggregate is its ordering key (the
/// last attribute, where the rules look for it).
fn incoming(row: OutboxRow) -> Incoming {
    let created = std::time::UNIX_EPOCH + Duration::from_millis(row.created_ms.max(0) as u64);
    let created = humantime::format_rfc3339_millis(created).to_string();
    Incoming {
        data: row.payload,
        attributes: vec![
            ("created_at".into(), created.clone()),
            ("event_type".into(), row.event_type),
            ("outbox_id".into(), row.id.to_string()),
            ("ordering_key".into(), row.aggregate),
        ],
        message_id: row.id.to_string(),
        publish_time: Some(created),
        delivery_attempt: None,
    }
}

/// The advisory lock that makes one instance the reader of `table`: the first eight
/// bytes of the SHA-256 of a name no application would use.
fn lock_key(table: &str) -> i64 {
    let digest = crate::inbox::digest_hex(format!("inlet outbox reader {table}").as_bytes());
    u64::from_str_radix(&digest[..16], 16).expect("hex digits") as i64
}

/// Sleeps `d` unless stopped first; false if stopped.
async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = stop.wait_for(|s| *s) => false,
        _ = tokio::time::sleep(d) => true,
    }
}
