//! The store body shared by both backends. sqlx's per-database types make a generic
//! implementation heavy; a macro keeps one body and one set of queries instead.

/// Statements of the shared body that other code names too (PostgreSQL's lists of
/// statements held to their access paths, `postgres::BY_ID_STATEMENTS` and
/// `postgres::UNRESOLVED_READS`, which `tests/plans.rs` plans).
pub(crate) const SETTLE_SQL: &str = include_str!("sql/settle.sql");
pub(crate) const PARK_SQL: &str = include_str!("sql/park.sql");
pub(crate) const REQUEUE_SQL: &str = include_str!("sql/requeue.sql");
pub(crate) const IGNORE_SQL: &str = include_str!("sql/ignore.sql");
pub(crate) const COUNTS_SQL: &str = include_str!("sql/counts.sql");
pub(crate) const BLOCKED_KEYS_SQL: &str = include_str!("sql/blocked_keys.sql");

/// Replay windows as `ReplayWindow` reads them, those that `$where` keeps, oldest first.
macro_rules! replay_windows {
    ($($where:tt)+) => {
        concat!(include_str!("sql/replay_window_select.sql"), $($where)+, "\nORDER BY w.id")
    };
}
/// The condition that replay window `w` of route `$route` is open at `$now` (each an
/// SQL expression of the statement it goes in): one text for the windows' list and for
/// the statements that meet a redelivery.
macro_rules! replay_open {
    ($route:literal, $now:literal) => {
        concat!("w.route = ", $route, " AND w.closed_at IS NULL AND w.closes_at > ", $now)
    };
}
pub(crate) use replay_open;

/// The replay windows of a route open at a time (`$1` route, `$2` time), asked by ingest
/// for a redelivery when its insert saw a window open (`postgres::PER_MESSAGE_STATEMENTS`).
pub(crate) const REPLAY_WINDOWS_OPEN_SQL: &str = replay_windows!("WHERE ", replay_open!("$1", "$2"));

/// The row holding a dedup key (`$1` route, `$2` key), its digest, and whether a
/// replay window of the route is open at `$3` ([`crate::inbox::InsertOutcome::Duplicate`]):
/// for a redelivery that the insert's own statement did not answer.
pub(crate) const EXISTING_SQL: &str = concat!(
    "SELECT id, payload_digest,\n    EXISTS (SELECT 1 FROM inbox_replay_window w WHERE ",
    replay_open!("$1", "$3"),
    ") AS replay_open\nFROM inbox_entry WHERE route = $1 AND dedup_key = $2"
);
/// Replay windows of a route (`$1`), open at a time (`$2`), of an id (`$3`); each filter
/// off when NULL (the admin API's and CLI's list).
pub(crate) const REPLAY_WINDOWS_SQL: &str = replay_windows!(
    "WHERE ($1 IS NULL OR w.route = $1)\n  AND ($2 IS NULL OR (w.closed_at IS NULL AND w.closes_at > $2))\n  AND ($3 IS NULL OR w.id = $3)"
);

/// Implements [`super::Store`] for `$store` (a struct with a `pool: $pool` field and
/// its `migrations`), given the backend's insert statement, clock query and the query
/// listing `inlet_schema`'s columns (none: no such table), and what a settle that gives
/// an entry a key runs before and after it (`rekey_sql`: the key's lock, taken shared
/// as an insert takes it, and the key's floor lowered; none on SQLite). Each backend brings its own
/// `claim_rows` (the claim is where the two differ), and for migrations its
/// `migration_connection`, `begin_migration` and `OUTSIDE_TRANSACTIONS`.
macro_rules! store_impl {
    (
        store: $store:ty,
        backend: $backend:literal,
        pool: $pool:ty,
        conn: $conn:ty,
        row: $row:ty,
        insert_sql: $insert_sql:expr,
        insert_or_existing_sql: $insert_or_existing_sql:expr,
        now_sql: $now_sql:expr,
        schema_columns_sql: $schema_columns_sql:expr,
        rekey_sql: $rekey_sql:expr,
    ) => {
        impl $store {
            /// What `inlet_schema` records, on `conn`, whatever shape an earlier Inlet
            /// left the table in (columns it lacks read as unrecorded).
            async fn read_schema(conn: &mut $conn) -> Result<$crate::inbox::schema::SchemaRecord, $crate::inbox::StoreError> {
                use $crate::inbox::schema::{Applied, RecordTable, SchemaRecord, RECORD_COLUMNS};
                let columns: Vec<String> = sqlx::query_scalar($schema_columns_sql).fetch_all(&mut *conn).await?;
                if columns.is_empty() {
                    return Ok(SchemaRecord { table: RecordTable::Missing, applied: Vec::new() });
                }
                let has = |name: &str| columns.iter().any(|c| c == name);
                let [binary, checksum, compatible] =
                    RECORD_COLUMNS.map(|(name, ty)| if has(name) { name.to_string() } else { format!("CAST(NULL AS {ty})") });
                let table = if RECORD_COLUMNS.iter().all(|(name, _)| has(name)) { RecordTable::Complete } else { RecordTable::VersionsOnly };
                let sql = format!("SELECT version, applied_at, {binary}, {checksum}, {compatible} FROM inlet_schema ORDER BY version");
                let rows: Vec<(i64, i64, Option<String>, Option<String>, Option<i64>)> =
                    sqlx::query_as(&sql).fetch_all(&mut *conn).await?;
                let applied = rows
                    .into_iter()
                    .map(|(version, applied_at, binary_version, checksum, compatible_from)| Applied {
                        version,
                        applied_at,
                        binary_version,
                        checksum,
                        compatible_from,
                    })
                    .collect();
                Ok(SchemaRecord { table, applied })
            }

            /// [`Store::migrate`](crate::inbox::Store::migrate), on the connection the
            /// backend gives a run (PostgreSQL: holding the migration lock, under the lock
            /// timeout): in the transaction the backend begins, `inlet_schema` made
            /// complete and the schema compared again (another instance may have migrated
            /// meanwhile); then each pending migration applied and recorded with this
            /// binary and its checksum, all in that transaction, except that on a backend
            /// that runs some outside one ([`Self::OUTSIDE_TRANSACTIONS`]) such a
            /// migration ends the transaction before it and runs alone.
            async fn migrate_schema(&self, lock_timeout: std::time::Duration)
                -> Result<Vec<$crate::inbox::schema::Migration>, $crate::inbox::StoreError>
            {
                use $crate::inbox::schema::{self, Comparison, Kept, Migration, Step, RECORD_COLUMNS};
                let mut conn = self.migration_connection(lock_timeout).await?;
                let mut tx = Self::begin_migration(&mut *conn).await?;
                let failed = |step: Step, e| step.failed(lock_timeout, Kept::Nothing, e);
                sqlx::query(schema::CREATE_TABLE).execute(&mut *tx).await.map_err(|e| failed(Step::Record, e))?;
                let columns: Vec<String> = sqlx::query_scalar($schema_columns_sql).fetch_all(&mut *tx).await?;
                let missing: Vec<String> = RECORD_COLUMNS
                    .iter()
                    .filter(|(name, _)| !columns.iter().any(|c| c == name))
                    .map(|(name, ty)| format!("ALTER TABLE inlet_schema ADD COLUMN {name} {ty}"))
                    .collect();
                for add in &missing {
                    sqlx::query(add).execute(&mut *tx).await.map_err(|e| failed(Step::Record, e))?;
                }
                let record = Self::read_schema(&mut *tx).await?;
                let cmp = Comparison { known: self.migrations, record: &record };
                cmp.refuse_newer()?;
                cmp.refuse_mismatches()?;
                let pending: Vec<Migration> = cmp.pending().into_iter().copied().collect();
                let alone = |m: &Migration| Self::OUTSIDE_TRANSACTIONS && m.outside_transaction;
                // The migrations up to the first that runs alone, in this transaction.
                let mut next = 0;
                while let Some(m) = pending.get(next).filter(|m| !alone(m)) {
                    Self::apply_recorded(&mut *tx, m, lock_timeout, Kept::Nothing).await?;
                    next += 1;
                }
                tx.commit().await?;
                while let Some(m) = pending.get(next) {
                    let kept = match next {
                        0 => Kept::Nothing,
                        n => Kept::UpTo(pending[n - 1].version),
                    };
                    if alone(m) {
                        let step = || Step::Version { version: m.version, name: m.name, outside_transaction: true };
                        for statement in $crate::inbox::sql_text::statements(m.sql) {
                            // One statement per query: PostgreSQL runs a query of several as
                            // one implicit transaction.
                            sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(statement.text))
                                .await
                                .map_err(|e| step().failed(lock_timeout, kept, e))?;
                        }
                        Self::record_applied(&mut *conn, m).await.map_err(|e| step().failed(lock_timeout, kept, e))?;
                        next += 1;
                    } else {
                        let mut tx = Self::begin_migration(&mut *conn).await?;
                        while let Some(m) = pending.get(next).filter(|m| !alone(m)) {
                            Self::apply_recorded(&mut *tx, m, lock_timeout, kept).await?;
                            next += 1;
                        }
                        tx.commit().await?;
                    }
                }
                Ok(pending)
            }

            /// One migration and its record, in the caller's transaction.
            async fn apply_recorded(
                conn: &mut $conn,
                m: &$crate::inbox::schema::Migration,
                lock_timeout: std::time::Duration,
                kept: $crate::inbox::schema::Kept,
            ) -> Result<(), $crate::inbox::StoreError> {
                let step = || $crate::inbox::schema::Step::Version { version: m.version, name: m.name, outside_transaction: false };
                // Through the executor: `RawSql::execute` is an `async fn` generic over
                // the executor, whose future the `Send` check of this trait method cannot
                // see through.
                sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(m.sql)).await.map_err(|e| step().failed(lock_timeout, kept, e))?;
                Self::record_applied(conn, m).await.map_err(|e| step().failed(lock_timeout, kept, e))
            }

            /// `m` recorded as applied now, by this binary, with its checksum.
            async fn record_applied(conn: &mut $conn, m: &$crate::inbox::schema::Migration) -> Result<(), sqlx::Error> {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
                sqlx::query(
                    "INSERT INTO inlet_schema (version, applied_at, binary_version, checksum, compatible_from) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(m.version)
                .bind(now)
                .bind($crate::inbox::schema::BINARY)
                .bind(m.checksum())
                .bind(m.compatible_from)
                .execute(conn)
                .await
                .map(drop)
            }

            /// One settle and its attempt record, inside the caller's transaction: the
            /// entry's first attempt in its own row (`first_attempt`, written by the
            /// settle), a later one as an `inbox_attempt` row. `false`: the lease is gone
            /// and nothing was written.
            async fn settle_in(
                conn: &mut $conn,
                id: i64,
                lease: &$crate::inbox::Lease,
                now: $crate::clock::Millis,
                s: &$crate::inbox::Settlement,
                attempt: Option<&$crate::inbox::failures::Attempt>,
            ) -> Result<bool, $crate::inbox::StoreError> {
                let c = s.columns(now);
                let decoded = c.decoded;
                let record = attempt.map(|a| serde_json::to_string(a).expect("attempts serialize"));
                // A re-decoded entry joins a key as an insert does: under the key's lock
                // (shared; it waits for a claim of the key in flight to commit).
                let rekey: Option<(&str, &str)> = $rekey_sql;
                let rekey = rekey.zip(decoded.map(|d| d.correlation_key.as_str()));
                if let Some(((lock, _), key)) = rekey {
                    sqlx::query(lock).bind(id).bind(key).execute(&mut *conn).await?;
                }
                let settle = sqlx::query_scalar::<_, Option<String>>($crate::inbox::sqlstore::SETTLE_SQL)
                    .bind(id)
                    .bind(&lease.owner)
                    .bind(lease.token)
                    .bind(c.status.as_str())
                    .bind(now)
                    .bind(c.next_attempt_at)
                    .bind(c.error)
                    .bind(c.finished_at)
                    .bind(decoded.map(|d| d.correlation_key.as_str()))
                    .bind(decoded.map(|d| d.event_type.as_str()))
                    .bind(decoded.and_then(|d| d.schema_version.as_deref()))
                    .bind(decoded.map(|d| d.body.as_slice()))
                    .bind(c.reset)
                    .bind(c.not_yet_since)
                    .bind(c.dedup_key)
                    .bind(c.error.map($crate::inbox::failures::fingerprint))
                    .bind(record.as_deref());
                let Some(first) = settle.fetch_optional(&mut *conn).await? else { return Ok(false) };
                if let Some(((_, lower), key)) = rekey {
                    sqlx::query(lower).bind(id).bind(key).execute(&mut *conn).await?;
                }
                // The row kept this attempt as its first (an identical record kept
                // before it is this attempt too); otherwise it is a later one.
                let (Some(a), false) = (attempt, first.is_some() && first == record) else { return Ok(true) };
                let requests = serde_json::to_string(&a.requests).expect("request records serialize");
                sqlx::query(include_str!("sql/attempt_insert.sql"))
                    .bind(id)
                    .bind(a.attempt)
                    .bind(&a.owner)
                    .bind(a.started_at)
                    .bind(a.duration_ms)
                    .bind(&a.answer)
                    .bind(a.status.as_str())
                    .bind(a.reason.as_deref())
                    .bind(requests)
                    .bind(a.plugin.as_deref())
                    .execute(&mut *conn)
                    .await?;
                Ok(true)
            }

            /// Claimed rows as entries under the leases just taken (`owner`'s, for
            /// `lease_ms` from `now` where a row lacks its expiry), and apart from them
            /// the rows that cannot be read, with the lease each was taken under and why.
            #[allow(clippy::type_complexity)]
            fn claimed_from(
                rows: &[$row],
                owner: &str,
                now: $crate::clock::Millis,
                lease_ms: i64,
            ) -> Result<(Vec<$crate::inbox::Claimed>, Vec<(i64, $crate::inbox::Lease, String)>), $crate::inbox::StoreError> {
                use sqlx::Row as _;
                let mut claimed = Vec::with_capacity(rows.len());
                let mut unreadable = Vec::new();
                for row in rows {
                    let entry = match Self::entry_from_row(row) {
                        Ok(entry) if entry.unreadable.is_none() => Ok(entry),
                        Ok(entry) => {
                            let reason = entry.unreadable.unwrap_or_default();
                            Err($crate::inbox::StoreError::Corrupt { id: entry.id, reason })
                        }
                        Err(error) => Err(error),
                    };
                    match entry {
                        Ok(entry) => {
                            let lease = $crate::inbox::Lease {
                                owner: owner.to_string(),
                                token: entry.lease_token,
                                expires_at: entry.lease_expires_at.unwrap_or(now + lease_ms),
                            };
                            claimed.push($crate::inbox::Claimed { entry, lease });
                        }
                        Err(error @ $crate::inbox::StoreError::Corrupt { .. }) => {
                            let id: i64 = row.try_get("id")?;
                            let token: i64 = row.try_get("lease_token")?;
                            let lease = $crate::inbox::Lease { owner: owner.to_string(), token, expires_at: now + lease_ms };
                            unreadable.push((id, lease, error.to_string()));
                        }
                        Err(other) => return Err(other),
                    }
                }
                Ok((claimed, unreadable))
            }

            /// Claimed rows that cannot be read would fail every claim that meets them
            /// and stall their route: each is parked (under the lease just taken) with
            /// the reason, for a person, and the others go on.
            async fn park_unreadable(
                conn: &mut $conn,
                unreadable: Vec<(i64, $crate::inbox::Lease, String)>,
                now: $crate::clock::Millis,
            ) -> Result<(), $crate::inbox::StoreError> {
                for (id, lease, error) in unreadable {
                    let reason = format!("the stored entry cannot be read, so it was parked instead of delivered: {error}");
                    let parked = $crate::inbox::Settlement::Parked { error: reason };
                    Self::settle_in(&mut *conn, id, &lease, now, &parked, None).await?;
                    tracing::error!(id, %error, "a claimed entry cannot be read; parked it");
                }
                Ok(())
            }

            /// The replay windows [`REPLAY_WINDOWS_SQL`] selects: of a route, open
            /// at a time, of an id; each filter off when `None`. Those of a route open
            /// at a time, which ingest asks for every duplicate it stores, through a
            /// statement of their own ([`REPLAY_WINDOWS_OPEN_SQL`]): the list's optional
            /// filters (`$1 IS NULL OR …`) make PostgreSQL plan it afresh at every
            /// call, 63 µs of its 160 µs of CPU per duplicate (docs/measurements.md,
            /// "What a delivery writes"); without them it is planned once per connection.
            async fn replay_window_rows(
                &self,
                route: Option<&str>,
                open_at: Option<$crate::clock::Millis>,
                id: Option<i64>,
            ) -> Result<Vec<$crate::inbox::ReplayWindow>, $crate::inbox::StoreError> {
                use sqlx::Row as _;
                let rows = match (route, open_at, id) {
                    (Some(route), Some(at), None) => {
                        sqlx::query($crate::inbox::sqlstore::REPLAY_WINDOWS_OPEN_SQL)
                            .bind(route)
                            .bind(at)
                            .fetch_all(&self.pool)
                            .await?
                    }
                    _ => {
                        sqlx::query($crate::inbox::sqlstore::REPLAY_WINDOWS_SQL)
                            .bind(route)
                            .bind(open_at)
                            .bind(id)
                            .fetch_all(&self.pool)
                            .await?
                    }
                };
                rows.iter()
                    .map(|r| {
                        Ok($crate::inbox::ReplayWindow {
                            id: r.try_get("id")?,
                            route: r.try_get("route")?,
                            published_from: r.try_get("published_from")?,
                            published_to: r.try_get("published_to")?,
                            opened_at: r.try_get("opened_at")?,
                            closes_at: r.try_get("closes_at")?,
                            closed_at: r.try_get("closed_at")?,
                            opened_by: r.try_get("opened_by")?,
                            reason: r.try_get("reason")?,
                            taken: r.try_get("taken")?,
                        })
                    })
                    .collect()
            }

            async fn insert_one(conn: &mut $conn, e: &$crate::inbox::NewEntry, now: $crate::clock::Millis)
                -> Result<$crate::inbox::InsertOutcome, $crate::inbox::StoreError>
            {
                use $crate::inbox::{InsertOutcome, Status};
                let digest = e.payload_digest();
                // A redelivery is answered by the insert's own statement where the
                // backend can (PostgreSQL); else, or if the row it met was committed
                // after that statement began, by a second one.
                let sql = $insert_or_existing_sql.unwrap_or($insert_sql);
                let first = Self::insert_row(conn, sql, e, &e.dedup_key, &digest, None, e.status, e.last_error.as_deref(), now).await?;
                let (existing, existing_digest, replay_open): (i64, String, bool) = match first {
                    Some((id, None, _)) => return Ok(InsertOutcome::Inserted { id }),
                    Some((id, Some(existing_digest), replay_open)) => (id, existing_digest, replay_open.unwrap_or(true)),
                    None => sqlx::query_as($crate::inbox::sqlstore::EXISTING_SQL)
                        .bind(&e.route)
                        .bind(&e.dedup_key)
                        .bind(now)
                        .fetch_one(&mut *conn)
                        .await?,
                };
                if existing_digest == digest {
                    return Ok(InsertOutcome::Duplicate { id: existing, replay_open });
                }
                let key = $crate::inbox::conflict_dedup_key(&e.dedup_key, &digest);
                let reason = format!(
                    "dedup key `{}` already belongs to entry {} with a different payload; kept here for a person to judge (requeue delivers it; ignore discards it, and retention then deletes it)",
                    e.dedup_key, existing
                );
                let parked = Self::insert_row(conn, $insert_sql, e, &key, &digest, Some(existing), Status::Parked, Some(&reason), now).await?;
                let (entry, first) = match parked {
                    Some((id, _, _)) => (id, true),
                    None => ( sqlx::query_scalar("SELECT id FROM inbox_entry WHERE route = $1 AND dedup_key = $2")
                        .bind(&e.route)
                        .bind(&key)
                        .fetch_one(&mut *conn)
                        .await?, false),
                };
                Ok(InsertOutcome::Conflict { existing, entry, first })
            }

            /// Runs an insert statement (`$insert_sql`, or `$insert_or_existing_sql`)
            /// for `e`: the row it returns, `(id, None, None)` for a new row, `(id of
            /// the row met, its digest, whether a replay window of the route is open)`
            /// for a redelivery that `$insert_or_existing_sql` answered.
            #[allow(clippy::too_many_arguments)]
            async fn insert_row(
                conn: &mut $conn,
                sql: &'static str,
                e: &$crate::inbox::NewEntry,
                dedup_key: &str,
                digest: &str,
                conflict_of: Option<i64>,
                status: $crate::inbox::Status,
                last_error: Option<&str>,
                now: $crate::clock::Millis,
            ) -> Result<Option<(i64, Option<String>, Option<bool>)>, $crate::inbox::StoreError> {
                Ok(bind_entry!(sqlx::query_as(sql), e, dedup_key, digest, conflict_of, status, last_error, now)
                    .fetch_optional(&mut *conn)
                    .await?)
            }

            fn repair_job_from_row(r: &$row) -> Result<$crate::inbox::repair::RepairJob, $crate::inbox::StoreError> {
                use sqlx::Row as _;
                let id: i64 = r.try_get("id")?;
                let corrupt = |reason: String| $crate::inbox::StoreError::Corrupt { id, reason };
                let action: String = r.try_get("action")?;
                let action = $crate::inbox::repair::RepairAction::parse(&action)
                    .ok_or_else(|| corrupt(format!("repair job action `{action}` is unknown")))?;
                let state: String = r.try_get("state")?;
                let state = $crate::inbox::repair::JobState::parse(&state)
                    .ok_or_else(|| corrupt(format!("repair job state `{state}` is unknown")))?;
                let filter: String = r.try_get("filter")?;
                let filter = serde_json::from_str(&filter).map_err(|e| corrupt(format!("repair job filter: {e}")))?;
                let rate: i64 = r.try_get("rate")?;
                Ok($crate::inbox::repair::RepairJob {
                    id,
                    action,
                    filter,
                    reason: r.try_get("reason")?,
                    rate: rate.clamp(1, i64::from(u32::MAX)) as u32,
                    actor: r.try_get("actor")?,
                    state,
                    total: r.try_get("total")?,
                    moved: r.try_get("moved")?,
                    cursor: r.try_get("last_id")?,
                    owner: r.try_get("owner")?,
                    created_at: r.try_get("created_at")?,
                    updated_at: r.try_get("updated_at")?,
                    finished_at: r.try_get("finished_at")?,
                    error: r.try_get("error")?,
                })
            }

            fn entry_from_row(row: &$row) -> Result<$crate::inbox::Entry, $crate::inbox::StoreError> {
                use sqlx::Row;
                use $crate::inbox::StoreError;
                let id: i64 = row.try_get("id")?;
                let corrupt = |reason: String| StoreError::Corrupt { id, reason };
                let status: String = row.try_get("status")?;
                // Attributes that do not parse leave the rest of the row readable (to
                // list, show and repair); the entry says what it lacks.
                let attributes: String = row.try_get("attributes")?;
                let (attributes, unreadable) = match serde_json::from_str(&attributes) {
                    Ok(pairs) => (pairs, None),
                    Err(e) => (Vec::new(), Some(format!("attributes: {e}"))),
                };
                Ok($crate::inbox::Entry {
                    id,
                    route: row.try_get("route")?,
                    dedup_key: row.try_get("dedup_key")?,
                    correlation_key: row.try_get("correlation_key")?,
                    event_type: row.try_get("event_type")?,
                    schema_version: row.try_get("schema_version")?,
                    body: row.try_get("body")?,
                    raw_data: row.try_get("raw_data")?,
                    attributes,
                    message_id: row.try_get("message_id")?,
                    publish_time: row.try_get("publish_time")?,
                    delivery_attempt: row.try_get("delivery_attempt")?,
                    payload_digest: row.try_get("payload_digest")?,
                    conflict_of: row.try_get("conflict_of")?,
                    status: status.parse().map_err(corrupt)?,
                    attempts: row.try_get("attempts")?,
                    next_attempt_at: row.try_get("next_attempt_at")?,
                    lease_owner: row.try_get("lease_owner")?,
                    lease_token: row.try_get("lease_token")?,
                    lease_expires_at: row.try_get("lease_expires_at")?,
                    last_error: row.try_get("last_error")?,
                    received_at: row.try_get("received_at")?,
                    not_yet_since: row.try_get("not_yet_since")?,
                    updated_at: row.try_get("updated_at")?,
                    finished_at: row.try_get("finished_at")?,
                    unreadable,
                })
            }
        }

        #[async_trait::async_trait]
        impl $crate::inbox::Store for $store {
            fn backend(&self) -> &'static str {
                $backend
            }

            fn migrations(&self) -> &'static [$crate::inbox::schema::Migration] {
                self.migrations
            }

            async fn schema_record(&self) -> Result<$crate::inbox::schema::SchemaRecord, $crate::inbox::StoreError> {
                let mut conn = self.pool.acquire().await?;
                Self::read_schema(&mut conn).await
            }

            async fn migrate(&self, lock_timeout: std::time::Duration)
                -> Result<Vec<$crate::inbox::schema::Migration>, $crate::inbox::StoreError>
            {
                self.migrate_schema(lock_timeout).await
            }

            async fn announce(&self, routes: &[String]) -> Result<(), $crate::inbox::StoreError> {
                self.announce_to_others(routes).await
            }

            fn announcements(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
                self.listen_to_others()
            }

            async fn insert(&self, e: &$crate::inbox::NewEntry, now: $crate::clock::Millis)
                -> Result<$crate::inbox::InsertOutcome, $crate::inbox::StoreError>
            {
                let mut conn = self.pool.acquire().await?;
                Self::insert_one(&mut conn, e, now).await
            }

            async fn insert_batch(&self, entries: &[$crate::inbox::NewEntry], now: $crate::clock::Millis)
                -> Result<Vec<$crate::inbox::InsertOutcome>, $crate::inbox::StoreError>
            {
                use $crate::inbox::InsertOutcome;
                let mut warm = self.warm.take(&self.pool).await?;
                // One statement that commits alone, where the backend has it and every
                // entry gets its answer there.
                if let Some(out) = self.insert_alone(&mut warm, entries, now).await? {
                    warm.keep();
                    return Ok(out);
                }
                let mut tx = Self::begin_hot(warm.conn()).await?;
                // The new rows and the redeliveries in one statement, where the backend
                // has one; then what it could not answer (dedup-key conflicts) one by one. A
                // conflict parks a row of its own, which must take its place in the
                // batch's order: if rows behind it were already inserted, the batch is
                // done again from the start, one by one.
                if entries.len() > 1 {
                    if let Some(known) = Self::insert_new_rows(&mut tx, entries, now).await? {
                        let mut out = Vec::with_capacity(entries.len());
                        for (i, e) in entries.iter().enumerate() {
                            let outcome = match known[i] {
                                Some(outcome) => outcome,
                                None => Self::insert_one(&mut tx, e, now).await?,
                            };
                            if matches!(outcome, InsertOutcome::Conflict { first: true, .. })
                                && known[i + 1..].iter().any(|k| matches!(k, Some(InsertOutcome::Inserted { .. })))
                            {
                                break;
                            }
                            out.push(outcome);
                        }
                        if out.len() == entries.len() {
                            tx.commit().await?;
                            warm.keep();
                            return Ok(out);
                        }
                        tx.rollback().await?;
                        tx = sqlx::Connection::begin(warm.conn()).await?;
                    }
                }
                let mut out = Vec::with_capacity(entries.len());
                for e in entries {
                    out.push(Self::insert_one(&mut tx, e, now).await?);
                }
                tx.commit().await?;
                warm.keep();
                Ok(out)
            }

            async fn claim(&self, req: &$crate::inbox::ClaimRequest<'_>)
                -> Result<Vec<$crate::inbox::Claimed>, $crate::inbox::StoreError>
            {
                let rows = self.claim_rows(req).await?;
                let (mut claimed, unreadable) = Self::claimed_from(&rows, req.owner, req.now, req.lease_ms)?;
                if !unreadable.is_empty() {
                    let mut conn = self.pool.acquire().await?;
                    Self::park_unreadable(&mut conn, unreadable, req.now).await?;
                }
                claimed.sort_by_key(|c| c.entry.id);
                Ok(claimed)
            }

            fn keys_met(&self, route: &str) -> Option<i64> {
                self.keys_counted(route)
            }

            async fn share(
                &self,
                route: &str,
                owner: &str,
                presence: $crate::inbox::Presence,
            ) -> Result<Option<$crate::inbox::Share>, $crate::inbox::StoreError> {
                self.share_among_members(route, owner, presence).await
            }

            async fn release_expired(&self, route: &str, now: $crate::clock::Millis) -> Result<u64, $crate::inbox::StoreError> {
                let r = sqlx::query(include_str!("sql/release_expired.sql")).bind(route).bind(now).execute(&self.pool).await?;
                Ok(r.rows_affected())
            }

            async fn release_owned(&self, owner: &str, now: $crate::clock::Millis) -> Result<Vec<String>, $crate::inbox::StoreError> {
                Ok(sqlx::query_scalar(include_str!("sql/release_owned.sql")).bind(owner).bind(now).fetch_all(&self.pool).await?)
            }

            async fn settle_recorded(
                &self,
                id: i64,
                lease: &$crate::inbox::Lease,
                now: $crate::clock::Millis,
                s: &$crate::inbox::Settlement,
                attempt: Option<&$crate::inbox::failures::Attempt>,
            ) -> Result<(), $crate::inbox::StoreError> {
                // The attempt is recorded with the settle that ends it, or not at all.
                let mut tx = self.pool.begin().await?;
                if !Self::settle_in(&mut tx, id, lease, now, s, attempt).await? {
                    return Err($crate::inbox::StoreError::LeaseLost { id });
                }
                tx.commit().await?;
                Ok(())
            }

            async fn settle_batch(
                &self,
                items: &[$crate::inbox::SettleRequest],
            ) -> Result<Vec<Result<Option<$crate::inbox::Claimed>, $crate::inbox::StoreError>>, $crate::inbox::StoreError> {
                let mut warm = self.warm.take(&self.pool).await?;
                // The settles and their hand-ons in one call that commits alone, where
                // the backend has it.
                if let Some(out) = self.settle_alone(&mut warm, items).await? {
                    warm.keep();
                    return Ok(out);
                }
                let mut tx = Self::begin_hot(warm.conn()).await?;
                // One statement for the whole batch where the backend has one (it also
                // takes the locks of the keys whose settles ask for their next entry).
                let asks = items.iter().any(|i| i.next.is_some());
                let many = if items.len() > 1 || asks { Self::settle_many(&mut tx, items).await? } else { None };
                let (settled, held) = match many {
                    Some(rows) => {
                        let (settled, held): (Vec<bool>, Vec<bool>) = rows.into_iter().unzip();
                        (settled, Some(held))
                    }
                    None => {
                        let mut settled = Vec::with_capacity(items.len());
                        for i in items {
                            settled.push(Self::settle_in(&mut tx, i.id, &i.lease, i.now, &i.settlement, i.attempt.as_ref()).await?);
                        }
                        (settled, None)
                    }
                };
                // The keys' next entries, claimed before the settles commit, so each is
                // taken with the lease of the entry before it ended (and never after it
                // is visible to an ordinary claim as free).
                let mut next = Vec::with_capacity(items.len());
                for (i, row) in items.iter().zip(Self::claim_next(&mut tx, items, &settled, held.as_deref()).await?) {
                    let Some(row) = row else {
                        next.push(None);
                        continue;
                    };
                    let lease_ms = i.next.as_ref().map_or(0, |n| n.lease_ms);
                    let (mut claimed, unreadable) = Self::claimed_from(std::slice::from_ref(&row), &i.lease.owner, i.now, lease_ms)?;
                    Self::park_unreadable(&mut tx, unreadable, i.now).await?;
                    next.push(claimed.pop());
                }
                tx.commit().await?;
                warm.keep();
                Ok(settled
                    .into_iter()
                    .zip(items)
                    .zip(next)
                    .map(|((ok, i), next)| if ok { Ok(next) } else { Err($crate::inbox::StoreError::LeaseLost { id: i.id }) })
                    .collect())
            }

            async fn attempts(&self, entry_id: i64) -> Result<Vec<$crate::inbox::failures::Attempt>, $crate::inbox::StoreError> {
                use sqlx::Row as _;
                let corrupt = |reason: String| $crate::inbox::StoreError::Corrupt { id: entry_id, reason };
                let first: Option<Option<String>> = sqlx::query_scalar("SELECT first_attempt FROM inbox_entry WHERE id = $1")
                    .bind(entry_id)
                    .fetch_optional(&self.pool)
                    .await?;
                let mut attempts: Vec<$crate::inbox::failures::Attempt> = match first.flatten() {
                    Some(json) => vec![serde_json::from_str(&json)
                        .map_err(|e| corrupt(format!("the first attempt's record is not an attempt: {e}")))?],
                    None => Vec::new(),
                };
                let rows = sqlx::query("SELECT * FROM inbox_attempt WHERE entry_id = $1 ORDER BY id")
                    .bind(entry_id)
                    .fetch_all(&self.pool)
                    .await?;
                for r in &rows {
                    let requests: String = r.try_get("requests")?;
                    let requests =
                        serde_json::from_str(&requests).map_err(|e| corrupt(format!("attempt requests are not JSON: {e}")))?;
                    attempts.push($crate::inbox::failures::Attempt {
                        attempt: r.try_get("attempt")?,
                        owner: r.try_get("owner")?,
                        started_at: r.try_get("started_at")?,
                        duration_ms: r.try_get("duration_ms")?,
                        answer: r.try_get("answer")?,
                        status: {
                            let status: String = r.try_get("status")?;
                            status.parse().map_err(corrupt)?
                        },
                        reason: r.try_get("reason")?,
                        requests,
                        plugin: r.try_get("plugin")?,
                    });
                }
                // Rows written before the column existed (or by an older binary during
                // a rolling upgrade) may precede the one in the entry's row: by start
                // time, the entry's own record first among equals (a stable sort).
                attempts.sort_by_key(|a| a.started_at);
                Ok(attempts)
            }

            async fn repair_candidates(
                &self,
                action: $crate::inbox::repair::RepairAction,
                f: &$crate::inbox::repair::RepairFilter,
                after: i64,
                limit: u32,
            ) -> Result<Vec<(i64, Option<String>)>, $crate::inbox::StoreError> {
                let (a, b) = f.statuses(action);
                Ok(sqlx::query_as(include_str!("sql/repair_candidates.sql"))
                    .bind(f.route.as_deref())
                    .bind(a.as_str())
                    .bind(b.as_str())
                    .bind(f.key.as_deref())
                    .bind(f.fingerprint.as_deref())
                    .bind(f.text_pattern())
                    .bind(f.received_after)
                    .bind(f.received_before)
                    .bind(after)
                    .bind(i64::from(limit.max(1)))
                    .fetch_all(&self.pool)
                    .await?)
            }

            async fn create_repair_job(
                &self,
                action: $crate::inbox::repair::RepairAction,
                filter: &$crate::inbox::repair::RepairFilter,
                reason: Option<&str>,
                rate: u32,
                actor: &str,
                total: i64,
                now: $crate::clock::Millis,
            ) -> Result<i64, $crate::inbox::StoreError> {
                Ok(sqlx::query_scalar(include_str!("sql/repair_create.sql"))
                    .bind(action.as_str())
                    .bind(serde_json::to_string(filter).expect("filters serialize"))
                    .bind(reason)
                    .bind(i64::from(rate))
                    .bind(actor)
                    .bind(total)
                    .bind(now)
                    .fetch_one(&self.pool)
                    .await?)
            }

            async fn take_repair_job(
                &self,
                owner: &str,
                now: $crate::clock::Millis,
                lease_ms: i64,
            ) -> Result<Option<$crate::inbox::repair::RepairJob>, $crate::inbox::StoreError> {
                let row = sqlx::query(include_str!("sql/repair_take.sql"))
                    .bind(owner)
                    .bind(now)
                    .bind(lease_ms)
                    .fetch_optional(&self.pool)
                    .await?;
                row.as_ref().map(Self::repair_job_from_row).transpose()
            }

            async fn advance_repair_job(
                &self,
                id: i64,
                owner: &str,
                cursor: i64,
                moved: i64,
                finished: bool,
                now: $crate::clock::Millis,
                lease_ms: i64,
            ) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query(include_str!("sql/repair_advance.sql"))
                    .bind(id)
                    .bind(owner)
                    .bind(cursor)
                    .bind(moved)
                    .bind(finished)
                    .bind(now)
                    .bind(lease_ms)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn list_repair_jobs(&self, limit: u32) -> Result<Vec<$crate::inbox::repair::RepairJob>, $crate::inbox::StoreError> {
                let rows = sqlx::query("SELECT * FROM repair_job ORDER BY id DESC LIMIT $1")
                    .bind(i64::from(limit.max(1)))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(Self::repair_job_from_row).collect()
            }

            async fn failure_groups(
                &self,
                route: Option<&str>,
                limit: u32,
            ) -> Result<Vec<$crate::inbox::failures::FailureGroup>, $crate::inbox::StoreError> {
                use sqlx::Row as _;
                let rows = sqlx::query(include_str!("sql/failure_groups.sql"))
                    .bind(route)
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await?;
                let mut groups = Vec::with_capacity(rows.len());
                for r in &rows {
                    let example_id: i64 = r.try_get("example_id")?;
                    let example_error: Option<String> =
                        sqlx::query_scalar("SELECT last_error FROM inbox_entry WHERE id = $1")
                            .bind(example_id)
                            .fetch_optional(&self.pool)
                            .await?
                            .flatten();
                    groups.push($crate::inbox::failures::FailureGroup {
                        route: r.try_get("route")?,
                        fingerprint: r.try_get("error_fingerprint")?,
                        parked: r.try_get("parked")?,
                        retrying: r.try_get("retrying")?,
                        keys: r.try_get("keys")?,
                        first_seen: r.try_get("first_seen")?,
                        last_seen: r.try_get("last_seen")?,
                        example_id,
                        example_error: example_error.unwrap_or_default(),
                    });
                }
                Ok(groups)
            }

            async fn get(&self, id: i64) -> Result<Option<$crate::inbox::Entry>, $crate::inbox::StoreError> {
                let row = sqlx::query("SELECT * FROM inbox_entry WHERE id = $1").bind(id).fetch_optional(&self.pool).await?;
                row.as_ref().map(Self::entry_from_row).transpose()
            }

            async fn find_by_dedup_key(
                &self,
                route: &str,
                dedup_key: &str,
            ) -> Result<Option<$crate::inbox::Entry>, $crate::inbox::StoreError> {
                let row = sqlx::query("SELECT * FROM inbox_entry WHERE route = $1 AND dedup_key = $2")
                    .bind(route)
                    .bind(dedup_key)
                    .fetch_optional(&self.pool)
                    .await?;
                row.as_ref().map(Self::entry_from_row).transpose()
            }

            async fn dedup_statuses(
                &self,
                route: &str,
                dedup_keys: &[String],
            ) -> Result<Vec<(String, $crate::inbox::Status)>, $crate::inbox::StoreError> {
                assert!(dedup_keys.len() <= $crate::inbox::DEDUP_LOOKUP_MAX, "at most DEDUP_LOOKUP_MAX keys at once");
                if dedup_keys.is_empty() {
                    return Ok(Vec::new());
                }
                let places: Vec<String> = (0..dedup_keys.len()).map(|i| format!("${}", i + 2)).collect();
                let sql = format!(
                    "SELECT dedup_key, status FROM inbox_entry WHERE route = $1 AND dedup_key IN ({})",
                    places.join(", ")
                );
                let mut query = sqlx::query_as::<_, (String, String)>(&sql).bind(route);
                for key in dedup_keys {
                    query = query.bind(key);
                }
                let rows = query.fetch_all(&self.pool).await?;
                rows.into_iter()
                    .map(|(key, status)| {
                        let parsed = status.parse().map_err(|_| $crate::inbox::StoreError::Corrupt {
                            id: 0,
                            reason: format!("entry under dedup key {key:?} has the unknown status {status:?}"),
                        })?;
                        Ok((key, parsed))
                    })
                    .collect()
            }

            async fn list(&self, f: &$crate::inbox::ListFilter) -> Result<Vec<$crate::inbox::Entry>, $crate::inbox::StoreError> {
                let sql = if f.newest_first { include_str!("sql/list_newest.sql") } else { include_str!("sql/list.sql") };
                let rows = sqlx::query(sql)
                    .bind(f.route.as_deref())
                    .bind(f.status.map(|s| s.as_str()))
                    .bind(f.correlation_key.as_deref())
                    .bind(f.after_id.unwrap_or(0))
                    .bind(i64::from(if f.limit == 0 { 100 } else { f.limit }))
                    .bind(f.fingerprint.as_deref())
                    .bind(f.error_text.as_deref().map($crate::inbox::contains_pattern))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(Self::entry_from_row).collect()
            }

            async fn count(&self, f: &$crate::inbox::ListFilter) -> Result<u64, $crate::inbox::StoreError> {
                let n: i64 = sqlx::query_scalar(include_str!("sql/count.sql"))
                    .bind(f.route.as_deref())
                    .bind(f.status.map(|s| s.as_str()))
                    .bind(f.correlation_key.as_deref())
                    .bind(f.after_id.unwrap_or(0))
                    .bind(f.fingerprint.as_deref())
                    .bind(f.error_text.as_deref().map($crate::inbox::contains_pattern))
                    .fetch_one(&self.pool)
                    .await?;
                Ok(n.max(0) as u64)
            }

            async fn requeue(&self, id: i64, now: $crate::clock::Millis) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query($crate::inbox::sqlstore::REQUEUE_SQL)
                    .bind(id)
                    .bind(now)
                    .bind(now - $crate::inbox::REQUEUED_DUE_EARLY)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn park(&self, id: i64, reason: &str, now: $crate::clock::Millis) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query($crate::inbox::sqlstore::PARK_SQL)
                    .bind(id)
                    .bind(reason)
                    .bind(now)
                    .bind($crate::inbox::failures::fingerprint(reason))
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn ignore(&self, id: i64, reason: &str, now: $crate::clock::Millis) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query($crate::inbox::sqlstore::IGNORE_SQL).bind(id).bind(reason).bind(now).execute(&self.pool).await?;
                Ok(r.rows_affected() == 1)
            }

            async fn pause_route(&self, p: &$crate::inbox::Pause) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query(include_str!("sql/pause_insert.sql"))
                    .bind(&p.route)
                    .bind(p.paused_at)
                    .bind(&p.paused_by)
                    .bind(&p.reason)
                    .execute(&self.pool)
                    .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn resume_route(&self, route: &str) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query(include_str!("sql/pause_delete.sql")).bind(route).execute(&self.pool).await?;
                Ok(r.rows_affected() == 1)
            }

            async fn paused_routes(&self, route: Option<&str>) -> Result<Vec<$crate::inbox::Pause>, $crate::inbox::StoreError> {
                use sqlx::Row;
                let rows = sqlx::query(include_str!("sql/pause_list.sql")).bind(route).fetch_all(&self.pool).await?;
                rows.iter()
                    .map(|row| {
                        Ok($crate::inbox::Pause {
                            route: row.try_get("route")?,
                            paused_at: row.try_get("paused_at")?,
                            paused_by: row.try_get("paused_by")?,
                            reason: row.try_get("reason")?,
                        })
                    })
                    .collect()
            }

            async fn open_replay_window(&self, w: &$crate::inbox::NewReplayWindow) -> Result<i64, $crate::inbox::StoreError> {
                Ok(sqlx::query_scalar(include_str!("sql/replay_window_insert.sql"))
                    .bind(&w.route)
                    .bind(w.published_from)
                    .bind(w.published_to)
                    .bind(w.opened_at)
                    .bind(w.closes_at)
                    .bind(&w.opened_by)
                    .bind(&w.reason)
                    .fetch_one(&self.pool)
                    .await?)
            }

            async fn close_replay_window(&self, id: i64, now: $crate::clock::Millis) -> Result<bool, $crate::inbox::StoreError> {
                let r = sqlx::query(
                    "UPDATE inbox_replay_window SET closed_at = $2 WHERE id = $1 AND closed_at IS NULL AND closes_at > $2",
                )
                .bind(id)
                .bind(now)
                .execute(&self.pool)
                .await?;
                Ok(r.rows_affected() == 1)
            }

            async fn replay_windows(&self, route: Option<&str>, open_at: Option<$crate::clock::Millis>)
                -> Result<Vec<$crate::inbox::ReplayWindow>, $crate::inbox::StoreError>
            {
                self.replay_window_rows(route, open_at, None).await
            }

            async fn replay_window(&self, id: i64)
                -> Result<Option<$crate::inbox::ReplayWindow>, $crate::inbox::StoreError>
            {
                Ok(self.replay_window_rows(None, None, Some(id)).await?.pop())
            }

            async fn insert_replay(
                &self,
                e: &$crate::inbox::NewEntry,
                window: i64,
                original: i64,
                now: $crate::clock::Millis,
            ) -> Result<$crate::inbox::InsertOutcome, $crate::inbox::StoreError> {
                let mut tx = self.pool.begin().await?;
                let outcome = Self::insert_one(&mut tx, e, now).await?;
                if let $crate::inbox::InsertOutcome::Inserted { id } = outcome {
                    sqlx::query("INSERT INTO inbox_replay_entry (entry_id, window_id, original_id) VALUES ($1, $2, $3)")
                        .bind(id)
                        .bind(window)
                        .bind(original)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(outcome)
            }

            async fn replay_entries(&self, window: i64) -> Result<Vec<(i64, i64)>, $crate::inbox::StoreError> {
                Ok(sqlx::query_as(
                    "SELECT entry_id, original_id FROM inbox_replay_entry WHERE window_id = $1 ORDER BY entry_id",
                )
                .bind(window)
                .fetch_all(&self.pool)
                .await?)
            }

            async fn purge_finished(&self, before: $crate::clock::Millis, limit: u32) -> Result<u64, $crate::inbox::StoreError> {
                let r = sqlx::query(include_str!("sql/purge.sql")).bind(before).bind(i64::from(limit)).execute(&self.pool).await?;
                Ok(r.rows_affected())
            }

            async fn purgeable(
                &self,
                route: &str,
                before: $crate::clock::Millis,
                after_id: i64,
                limit: u32,
            ) -> Result<Vec<(i64, Vec<(String, String)>)>, $crate::inbox::StoreError> {
                let rows: Vec<(i64, String)> = sqlx::query_as(
                    "SELECT id, attributes FROM inbox_entry WHERE route = $1 AND status IN ('DONE', 'IGNORED') \
                     AND finished_at < $2 AND id > $3 ORDER BY id LIMIT $4",
                )
                .bind(route)
                .bind(before)
                .bind(after_id)
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
                // Attributes that do not parse name no object.
                Ok(rows.into_iter().map(|(id, text)| (id, serde_json::from_str(&text).unwrap_or_default())).collect())
            }

            async fn counts(&self) -> Result<Vec<$crate::inbox::RouteStatusCount>, $crate::inbox::StoreError> {
                use sqlx::Row;
                let rows = sqlx::query($crate::inbox::sqlstore::COUNTS_SQL).fetch_all(&self.pool).await?;
                rows.iter()
                    .map(|row| {
                        let status: String = row.try_get("status")?;
                        Ok($crate::inbox::RouteStatusCount {
                            route: row.try_get("route")?,
                            status: status.parse().map_err(|reason| $crate::inbox::StoreError::Corrupt { id: 0, reason })?,
                            count: row.try_get("n")?,
                            oldest_received_at: row.try_get("oldest")?,
                        })
                    })
                    .collect()
            }

            async fn blocked_keys(&self, route: &str, parked_blocks: bool)
                -> Result<$crate::inbox::BlockedKeys, $crate::inbox::StoreError>
            {
                let (keys, oldest): (i64, Option<i64>) = sqlx::query_as($crate::inbox::sqlstore::BLOCKED_KEYS_SQL)
                    .bind(route)
                    .bind(parked_blocks)
                    .fetch_one(&self.pool)
                    .await?;
                Ok($crate::inbox::BlockedKeys { keys, oldest_head_received_at: oldest })
            }

            async fn gauge_lease(&self) -> Result<bool, $crate::inbox::StoreError> {
                self.hold_gauge_lease().await
            }

            async fn maintain(&self) -> Result<Option<String>, $crate::inbox::StoreError> {
                self.maintain_tables().await
            }

            async fn throughput(
                &self,
                since: $crate::clock::Millis,
                bucket_ms: i64,
            ) -> Result<Vec<$crate::inbox::Throughput>, $crate::inbox::StoreError> {
                use sqlx::Row;
                let rows = sqlx::query(include_str!("sql/throughput.sql"))
                    .bind(since)
                    .bind(bucket_ms.max(1))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter()
                    .map(|row| {
                        Ok($crate::inbox::Throughput {
                            route: row.try_get("route")?,
                            bucket: row.try_get("bucket")?,
                            done: row.try_get("n")?,
                        })
                    })
                    .collect()
            }

            async fn db_now(&self) -> Result<$crate::clock::Millis, $crate::inbox::StoreError> {
                Ok(sqlx::query_scalar($now_sql).fetch_one(&self.pool).await?)
            }

            async fn db_now_timed(
                &self,
                n: usize,
            ) -> Result<Vec<(std::time::Duration, $crate::clock::Millis, $crate::clock::Millis, $crate::clock::Millis)>, $crate::inbox::StoreError> {
                use $crate::clock::{Millis, system_now};
                let mut conn = self.pool.acquire().await?;
                let _: Millis = sqlx::query_scalar($now_sql).fetch_one(&mut *conn).await?;
                let mut samples = Vec::with_capacity(n);
                for _ in 0..n {
                    let started = std::time::Instant::now();
                    let before = system_now();
                    let db: Millis = sqlx::query_scalar($now_sql).fetch_one(&mut *conn).await?;
                    let after = system_now();
                    samples.push((started.elapsed(), before, after, db));
                }
                Ok(samples)
            }

            async fn record_audit(&self, a: &$crate::inbox::NewAudit, now: $crate::clock::Millis) -> Result<i64, $crate::inbox::StoreError> {
                Ok(sqlx::query_scalar(include_str!("sql/audit_insert.sql"))
                    .bind(now)
                    .bind(&a.actor)
                    .bind(a.action.as_str())
                    .bind(a.route.as_deref())
                    .bind(&a.subject)
                    .bind(a.outcome.as_str())
                    .bind(a.detail.as_deref())
                    .fetch_one(&self.pool)
                    .await?)
            }

            async fn list_audit(&self, after_id: Option<i64>, limit: u32)
                -> Result<Vec<$crate::inbox::AuditRecord>, $crate::inbox::StoreError>
            {
                use sqlx::Row;
                let rows = sqlx::query(include_str!("sql/audit_list.sql"))
                    .bind(after_id.unwrap_or(0))
                    .bind(i64::from(limit.clamp(1, 1000)))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter()
                    .map(|row| {
                        Ok($crate::inbox::AuditRecord {
                            id: row.try_get("id")?,
                            at: row.try_get("at")?,
                            actor: row.try_get("actor")?,
                            action: row.try_get("action")?,
                            route: row.try_get("route")?,
                            subject: row.try_get("subject")?,
                            outcome: row.try_get("outcome")?,
                            detail: row.try_get("detail")?,
                        })
                    })
                    .collect()
            }
        }
    };
}

pub(crate) use store_impl;
