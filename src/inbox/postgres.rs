//! PostgreSQL: production, any number of instances on one database.
//!
//! Claims pick candidates with `FOR UPDATE SKIP LOCKED`, so instances never wait on
//! each other's rows; "no older unresolved entry with this key" is answered from a
//! partial index over unresolved rows only. Migrations run under an advisory lock so
//! instances starting together apply them once, and under a `lock_timeout`.
//!
//! **Per-key order across instances rests on a lock per (route, key), not on
//! snapshots.** `FOR UPDATE SKIP LOCKED` locks only the candidate row; the check over
//! the key's other entries reads rows it does not lock, in a snapshot taken when the
//! statement starts. Two claims whose snapshots straddle a change (another claim's
//! commit, a requeue, a re-decoded key, an insert whose id was drawn before an older
//! one committed) could each take an entry of one key. So, for ordered routes:
//! - every insert takes a *shared* transaction-level advisory lock on its
//!   (route, key) before its id is drawn, and holds it until it commits;
//! - a claim runs in a transaction: first it try-locks (exclusively, never waiting)
//!   the keys of its candidates, then — in a new statement, so a new snapshot taken
//!   after the locks — it claims only those candidates whose key it holds (or that
//!   have no key), each checked again in that snapshot. Only the candidates are read
//!   twice, not the route's backlog.
//!   Whatever changed a key before the lock was granted has committed, and whatever
//!   would change it now waits or is skipped, so the check sees the key as it is.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow, Postgres};

use super::StoreError;
use super::schema::Migration;
use super::sqlstore::store_impl;
use super::warm::PING_IF_IDLE_FOR;

/// The schema's migrations, oldest first (`inlet_schema` records which are applied).
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration::new(1, "inbox", include_str!("sql/postgres_0001_inbox.sql")),
    Migration::new(2, "audit", include_str!("sql/postgres_0002_audit.sql")),
    Migration::new(3, "not_yet_since", include_str!("sql/postgres_0003_not_yet_since.sql")),
    Migration::new(4, "route_pause", include_str!("sql/postgres_0004_route_pause.sql")),
    Migration::new(5, "attempts", include_str!("sql/postgres_0005_attempts.sql")),
    Migration::new(6, "repair_jobs", include_str!("sql/postgres_0006_repair_jobs.sql")),
    Migration::new(7, "key_in_progress", include_str!("sql/postgres_0007_key_in_progress.sql")),
    Migration::new(8, "statistics", include_str!("sql/postgres_0008_statistics.sql")),
    Migration::new(9, "hot_path_indexes", include_str!("sql/postgres_0009_hot_path_indexes.sql")),
    Migration::new(10, "replay_windows", include_str!("sql/postgres_0010_replay_windows.sql")).compatible_from(9),
    Migration::new(11, "first_attempt", include_str!("sql/postgres_0011_first_attempt.sql")).compatible_from(10),
    Migration::new(12, "key_floor", include_str!("sql/postgres_0012_key_floor.sql")).compatible_from(11),
    Migration::new(
        13,
        "key_in_flight_from_the_floor",
        include_str!("sql/postgres_0013_key_in_flight_from_the_floor.sql"),
    )
    .compatible_from(11)
    .outside_transaction(),
    Migration::new(14, "route_members", include_str!("sql/postgres_0014_route_members.sql")).compatible_from(11),
    Migration::new(15, "refuse_batch", include_str!("sql/postgres_0015_refuse_batch.sql")).compatible_from(11),
];

/// Serializes migrations across instances (the key is "inlet" in ASCII). Taken for
/// the session: a run may commit more than once (around a migration outside a
/// transaction) and holds it throughout.
const MIGRATION_LOCK: i64 = 452_824_163_700;

/// How often a run waiting for another's migration lock tries it again.
const MIGRATION_LOCK_RETRY: Duration = Duration::from_millis(100);

/// Connections kept warm for the group-commit writers ([`super::warm`]): two writers
/// for settles, two for inserts (`app.rs`); at most half of the pool. A batch insert
/// commits alone ([`PgStore::insert_alone`]) only where all of them are kept (a pool
/// of 8 or more).
const WARM_KEEP: u32 = 4;

/// The session advisory lock whose holder publishes the inbox gauges (the migration
/// lock's key plus one).
const GAUGE_LOCK: i64 = 452_824_163_701;

pub struct PgStore {
    pool: PgPool,
    migrations: &'static [Migration],
    /// The connection the gauge lease is tried and held on (outside the pool, so
    /// the lock lives exactly as long as it), and whether it holds the lock.
    gauge_lease: tokio::sync::Mutex<Option<(PgConnection, bool)>>,
    /// What each route's claims last learned of its keys and its waiting entries
    /// ([`RouteSeen`]), which decides whether they start from its heads.
    seen: std::sync::Mutex<std::collections::HashMap<String, RouteSeen>>,
    /// When [`PgStore::keep_floors`] last ran.
    floors_kept: std::sync::Mutex<Option<std::time::Instant>>,
    /// The group-commit writers' connections between batches ([`super::warm`]).
    warm: super::warm::Kept<Postgres>,
    /// The server refused a function in a session's temporary schema (the role lacks
    /// `TEMP` on the database): settle batches and claims keep their transactions
    /// ([`SETTLE_FUNCTION_SQL`], [`CLAIM_FUNCTION_SQL`]). Until then, every altered
    /// writer's connection has the settle function, and a pool connection gets the
    /// claim function at its first claim.
    no_session_functions: std::sync::atomic::AtomicBool,
}

impl PgStore {
    /// Connects without looking at the schema.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_with_migrations(url, max_connections, MIGRATIONS).await
    }

    /// Connects with other migrations than this binary's: for tests of the migration
    /// runner.
    #[doc(hidden)]
    pub async fn connect_with_migrations(
        url: &str,
        max_connections: u32,
        migrations: &'static [Migration],
    ) -> Result<Self, StoreError> {
        // The server's NOTICEs (`relation "inlet_schema" already exists, skipping`)
        // say nothing an operator needs; sqlx would log each one.
        let options = PgConnectOptions::from_str(url)?.options([("client_min_messages", "warning")]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(Duration::from_secs(3))
            // sqlx pings a connection before it hands it out (a round trip before
            // every transaction and every query on the pool), and again when it comes
            // back, where a broken one is closed. Here the first ping is only for a
            // connection that sat idle for `PING_IF_IDLE_FOR`: one that died idle (the
            // server restarted, a middlebox dropped it) is replaced before a statement
            // meets it, while the hot path, whose connections come back and go out
            // within milliseconds, pays no round trip. Across a 0.5 ms round trip, 10
            // keys: 1,116-1,124 -> 1,294-1,357 deliveries/s (docs/measurements.md).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        Ok(PgStore {
            pool,
            migrations,
            gauge_lease: tokio::sync::Mutex::new(None),
            seen: Default::default(),
            floors_kept: Default::default(),
            warm: super::warm::Kept::new(WARM_KEEP.min(max_connections / 2) as usize),
            no_session_functions: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// A migration outside a transaction runs statement by statement, each committed
    /// on its own.
    const OUTSIDE_TRANSACTIONS: bool = true;

    /// The connection a migration run is made on: it holds the migration lock, waited
    /// for without a limit (another instance is migrating, and its own statements are
    /// bounded by its lock timeout), and `lock_timeout` for everything after, so a
    /// migration that needs a table another session holds fails within it. Waiting
    /// longer would be worse than failing: every later query on that table (claims,
    /// inserts) would queue behind the migration's pending lock.
    ///
    /// The lock is tried, not waited for in one statement: a statement waiting holds a
    /// snapshot, and `CREATE INDEX CONCURRENTLY` in the run holding the lock waits for
    /// every snapshot older than its build, which would be a deadlock. The connection
    /// closes when the run drops it (never back to the pool), which releases the lock
    /// and the setting on every path, a failure's included.
    async fn migration_connection(
        &self,
        lock_timeout: Duration,
    ) -> Result<sqlx::pool::PoolConnection<Postgres>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        conn.close_on_drop();
        let mut waiting = false;
        while !sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .fetch_one(&mut *conn)
            .await?
        {
            if !waiting {
                tracing::info!("another instance is migrating the inbox schema; waiting for it");
                waiting = true;
            }
            tokio::time::sleep(MIGRATION_LOCK_RETRY).await;
        }
        sqlx::query("SELECT set_config('lock_timeout', $1, false)")
            .bind(format!("{}ms", lock_timeout.as_millis()))
            .execute(&mut *conn)
            .await?;
        Ok(conn)
    }

    /// A transaction of a migration run.
    async fn begin_migration(conn: &mut PgConnection) -> Result<sqlx::Transaction<'_, Postgres>, StoreError> {
        Ok(sqlx::Connection::begin(conn).await?)
    }
}

/// The advisory lock key of (route $1, correlation key): routes are `[a-z0-9-]`, so
/// `route:key` is unambiguous.
macro_rules! key_lock {
    ($key:literal) => {
        concat!("hashtextextended($1 || ':' || ", $key, ", 0)")
    };
}

/// Whether `$key` is in the claim's part of the route's keys (its hash modulo `$n` is
/// `$i`, [`super::Store::share`]); every key where `$n` is NULL.
macro_rules! in_share {
    ($key:literal, $i:literal, $n:literal) => {
        concat!(
            "(",
            $n,
            "::bigint IS NULL OR (hashtextextended(",
            $key,
            ", 0) & 9223372036854775807) % ",
            $n,
            "::bigint = ",
            $i,
            "::bigint)"
        )
    };
}

/// The claim of an unordered route: one statement.
const CLAIM_SQL: &str = concat!(
    "WITH picked AS (\n",
    claim_where!(),
    "    FOR UPDATE SKIP LOCKED\n)\nUPDATE inbox_entry SET\n",
    include_str!("sql/claim_set.sql"),
    "FROM picked WHERE inbox_entry.id = picked.id\nRETURNING inbox_entry.*"
);

/// The ordered claim as one statement, without the key locks (`$3` = true): what
/// ordered routes ran before the locks, unsafe with many instances (see the module
/// doc). Kept only so the claim benchmark can measure what the locks cost; returns
/// `(id, lease_token)`.
#[doc(hidden)]
pub const CLAIM_SQL_UNLOCKED: &str = concat!(
    "WITH picked AS (\n",
    claim_where!(),
    "    FOR UPDATE SKIP LOCKED\n)\nUPDATE inbox_entry SET\n",
    include_str!("sql/claim_set.sql"),
    "FROM picked WHERE inbox_entry.id = picked.id\nRETURNING inbox_entry.id, inbox_entry.lease_token"
);

/// The window's bound in [`CLAIM_KEYS_SQL`]: the id of route `$1`'s `$6`th oldest OPEN
/// entry, or the largest id where fewer wait. The claim function reads it beforehand,
/// with how many wait ([`WAITING_SQL`]), and puts it in the statement's place.
macro_rules! window_bound {
    () => {
        concat!(
            "COALESCE((\n",
            "        SELECT w.id FROM inbox_entry w WHERE w.route = $1 AND w.status = 'OPEN'\n",
            "        ORDER BY w.id OFFSET $6 - 1 LIMIT 1), 9223372036854775807)"
        )
    };
}

/// Step one of an ordered claim: the candidates among the route's oldest `$6` OPEN
/// entries (the window: up to the id of the `$6`th, found once), and the keys among
/// them each try-locked (never waiting); returns `(id, key)` of the candidates this
/// transaction may claim: those without a key and those whose key it now holds. The
/// claim's `$1`–`$5`, `$6`, and its part of the keys, `$7` of `$8` (NULL: every key). (`held` calls a volatile function, so PostgreSQL runs
/// it once, as written; `candidate` is read twice, so it is materialized once.)
///
/// Its check of each windowed entry is the one without the key's floor
/// (`sql/claim_eligible.sql`): there "one of the key in flight?" is one hashed pass
/// over the entries in flight per claim, where from each key's floor it is a probe per
/// windowed entry (at 1,000 keys: 5,587 against 8,248 deliveries/s,
/// docs/measurements.md). Step two checks again from the floor.
///
/// The window bounds the statement: without it, a route whose few keys are all in
/// flight (or whose heads all wait for a retry) has every claim read its whole backlog
/// entry by entry before it knows there is nothing to take. Heads beyond the window
/// are found by [`CLAIM_HEADS_SQL`].
///
/// The bound is written `(route, id) <= ($1, …)`, a row comparison, because only an
/// index that leads with the route can use it: so the scan stays one range of
/// `inbox_entry_open`. Written `e.id <= …`, it also fits the primary key, and on
/// statistics older than a drain the planner walks the primary key from the table's
/// first row through every settled one. A `LIMIT` subquery joined back by id, simpler
/// to read, makes the in-flight check a probe per windowed entry. (Figures and the
/// variants that lost: docs/measurements.md.)
#[doc(hidden)]
pub const CLAIM_KEYS_SQL: &str = concat!(
    "WITH candidate AS (\n",
    "  SELECT c.id, c.correlation_key FROM inbox_entry c WHERE c.id IN (\n",
    "    SELECT e.id FROM inbox_entry e\n",
    "    WHERE e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2\n",
    "      AND (e.route, e.id) <= ($1, ",
    window_bound!(),
    ")\n",
    "      AND (e.correlation_key IS NULL OR ",
    in_share!("e.correlation_key", "$7", "$8"),
    ")\n",
    include_str!("sql/claim_eligible.sql"),
    "    ORDER BY e.id\n",
    "    LIMIT $5\n",
    ")), held AS (\n",
    "  SELECT k.correlation_key FROM (\n",
    "    SELECT DISTINCT correlation_key FROM candidate WHERE correlation_key IS NOT NULL) k\n",
    "  WHERE pg_try_advisory_xact_lock(",
    key_lock!("k.correlation_key"),
    "))\n",
    "SELECT id, correlation_key FROM candidate\n",
    "WHERE correlation_key IS NULL OR correlation_key IN (SELECT correlation_key FROM held)"
);

/// Step one, continued when the window did not fill the claim and did not hold every
/// waiting entry of the route (as many wait as it reads: [`WAITING_SQL`]), or on a
/// route claimed heads first: the heads of the
/// route's keys, found key by key (the route's rows of `inbox_key_floor`, each key's
/// head one descent of `inbox_entry_unresolved_key` from its floor) instead of entry
/// by entry, so its cost grows with the keys, not the backlog or the key's history
/// (a walk from the key's first index entry stepped over every entry settled since
/// the last vacuum, 2–4 ms per key: docs/measurements.md). The oldest `$4` heads that are OPEN, due, not
/// blocked by a PARKED entry where `$3` says parked blocks, of a key with nothing in
/// flight and not among step one's keys (`$5`), of the claim's part of the keys (`$6`
/// of `$7`), each try-locked as in [`CLAIM_KEYS_SQL`]. Each row also says how many keys the walk met (the
/// part's); when it takes
/// none, one row without an id says so. Entries without a key are left to the window,
/// which reaches them as the entries ahead of them are delivered, or, on a route
/// claimed heads first, to [`CLAIM_UNKEYED_SQL`].
#[doc(hidden)]
pub const CLAIM_HEADS_SQL: &str = concat!(
    "WITH head AS (\n",
    "    SELECT h.*, f.floor FROM inbox_key_floor f CROSS JOIN LATERAL (\n",
    "        SELECT e.id, e.correlation_key, e.status, e.next_attempt_at FROM inbox_entry e\n",
    "        WHERE e.route = $1 AND e.correlation_key = f.correlation_key AND e.id >= f.floor\n",
    "          AND e.status IN ('OPEN', 'PARKED') AND (e.status = 'OPEN' OR $3)\n",
    "        ORDER BY e.id LIMIT 1) h\n",
    "    WHERE f.route = $1 AND ",
    in_share!("f.correlation_key", "$6", "$7"),
    "\n",
    "), candidate AS (\n",
    "    SELECT c.id, c.correlation_key FROM head c\n",
    "    WHERE c.status = 'OPEN' AND c.next_attempt_at <= $2 AND NOT (c.correlation_key = ANY($5))\n",
    "      AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)\n",
    "      AND NOT EXISTS (\n",
    "        SELECT 1 FROM inbox_entry o\n",
    "        WHERE o.route = $1 AND o.correlation_key = c.correlation_key AND o.status = 'IN_PROGRESS'\n",
    "          AND o.id >= c.floor)\n",
    "    ORDER BY c.id LIMIT $4\n",
    "), held AS (\n",
    "    SELECT c.correlation_key FROM candidate c WHERE pg_try_advisory_xact_lock(",
    key_lock!("c.correlation_key"),
    ")), walked AS (\n",
    "    SELECT count(*) AS keys FROM inbox_key_floor f WHERE f.route = $1 AND ",
    in_share!("f.correlation_key", "$6", "$7"),
    "\n",
    ")\n",
    "SELECT c.id, c.correlation_key, walked.keys FROM walked\n",
    "LEFT JOIN candidate c ON c.correlation_key IN (SELECT correlation_key FROM held)"
);

/// A route whose keys with waiting entries are few is claimed from their heads (found
/// key by key, [`CLAIM_HEADS_SQL`]) rather than from its window of oldest entries:
/// when keys are few, nearly all of the window's 4,096 entries stand behind a head,
/// and a claim read and checked every one of them to take a handful. Whether the last
/// walk of the heads met at most this many keys decides, with how many entries wait
/// per key ([`HEADS_FIRST_WAITING_PER_KEY`]); a walk that meets more keys, or a count
/// of fewer waiting entries, sends the route back to the window.
const HEADS_FIRST_KEYS: i64 = 256;

/// A route of few keys is claimed from its heads only while more than this many
/// entries per key wait (counted up to the window, 4,096 entries for most claims: so a
/// route of 64 keys or more stays with its window). A window claim reads the oldest waiting entries until it has its fill, checking
/// each against its key: where most keys are free, a few entries do; where every key
/// has a long run waiting behind an entry in flight, it reads the whole window for
/// nothing. A walk of the heads reads every key once, whatever waits. Push→DONE at
/// route concurrency 16 over 100 keys: claims 1.30–1.38 ms from the window against
/// 1.62–1.98 ms walking the heads; 200,000 waiting over 10 keys stays heads first
/// (docs/measurements.md).
const HEADS_FIRST_WAITING_PER_KEY: i64 = 64;

/// How often a route claimed heads first has its waiting entries counted
/// ([`WAITING_SQL`]; a route claimed from its window counts them at every claim): a
/// backlog drained to a few entries per key goes back to the window within this.
const WAITING_RECOUNT: Duration = Duration::from_secs(1);

/// What a route's claims last learned of it, in this instance's part of its keys, each
/// figure with when.
#[derive(Debug, Default, Clone, Copy)]
struct RouteSeen {
    /// Its keys, as a walk of its heads met them or a count ([`KEYS_COUNT_SQL`]).
    keys: Option<(i64, std::time::Instant)>,
    /// Its waiting (OPEN) entries, counted up to a claim's window ([`WAITING_SQL`]);
    /// of the whole route, not of the part.
    waiting: Option<(i64, std::time::Instant)>,
}

/// How often a route claimed from its window (whose claims do not walk the heads)
/// has its keys counted ([`KEYS_COUNT_SQL`]).
const KEYS_RECOUNT: Duration = Duration::from_secs(10);

/// The keys of route `$1` in the claim's part (`$2` of `$3`), as a walk of the heads
/// meets them: its rows of `inbox_key_floor`.
const KEYS_COUNT_SQL: &str = concat!(
    "SELECT count(*) FROM inbox_key_floor f WHERE f.route = $1 AND ",
    in_share!("f.correlation_key", "$2", "$3")
);

/// How many entries of route `$1` wait (OPEN), counted up to `$2` (a claim's window),
/// and the id of the last counted: the window's bound where `$2` wait or more.
const WAITING_SQL: &str = "\
SELECT count(*), max(s.id) FROM (
    SELECT w.id FROM inbox_entry w WHERE w.route = $1 AND w.status = 'OPEN' ORDER BY w.id LIMIT $2) s";

/// In heads-first mode, the entries without a key, which the walk of the heads does
/// not reach: the oldest `$3` due OPEN ones (from `inbox_entry_unresolved_key`, where
/// they sort last), unless the route is paused. They are anyone's to claim.
const CLAIM_UNKEYED_SQL: &str = "\
SELECT e.id, NULL::text AS correlation_key FROM inbox_entry e
WHERE e.route = $1 AND e.correlation_key IS NULL AND e.status = 'OPEN' AND e.next_attempt_at <= $2
  AND NOT EXISTS (SELECT 1 FROM inbox_route_pause p WHERE p.route = $1)
ORDER BY e.id LIMIT $3";

/// Entries the window of [`CLAIM_KEYS_SQL`] reads for a claim of `limit`: enough to
/// find the heads of the keys free for it when keys interleave, few enough that a
/// claim with nothing to take stays cheap.
fn claim_window(limit: u32) -> i64 {
    (i64::from(limit) * 4).max(4_096)
}

/// [`CLAIM_HELD_SQL`] and [`CLAIM_NEXT_SQL`]: step two of a claim over the candidates
/// `$ids` (an array of entry ids), after `$head` (the statement's start: `WITH ` and
/// any CTEs the candidates come from).
macro_rules! claim_held {
    ($head:expr, $ids:expr) => {
        concat!(
            $head,
            "picked AS (\n",
            "    SELECT e.id FROM inbox_entry e\n",
            "    WHERE e.id = ANY(",
            $ids,
            ") AND e.route = $1 AND e.status = 'OPEN' AND e.next_attempt_at <= $2\n",
            include_str!("sql/claim_eligible_floor.sql"),
            "    LIMIT $5\n",
            "    FOR UPDATE SKIP LOCKED\n), claimed AS (\nUPDATE inbox_entry SET\n",
            include_str!("sql/claim_set.sql"),
            "FROM picked WHERE inbox_entry.id = picked.id\n",
            "  AND (inbox_entry.correlation_key IS NULL OR inbox_entry.correlation_key = ANY($9))\n",
            "RETURNING inbox_entry.*\n",
            "), heads AS (\n",
            // Each claimed key's floor moves up to its head: the entry claimed, or an older one
            // parked where parked lets the key pass (it stays unresolved). The key is held and
            // this snapshot came after, so nothing older is unresolved or about to be.
            "    SELECT c.route, c.correlation_key, f.floor AS old, LEAST(c.id, (\n",
            "        SELECT min(o.id) FROM inbox_entry o\n",
            "        WHERE o.route = c.route AND o.correlation_key = c.correlation_key\n",
            "          AND o.id >= COALESCE(f.floor, 0) AND o.id < c.id AND o.status = 'PARKED')) AS floor\n",
            "    FROM claimed c\n",
            "    LEFT JOIN inbox_key_floor f ON f.route = c.route AND f.correlation_key = c.correlation_key\n",
            "    WHERE c.correlation_key IS NOT NULL\n",
            "), raised AS (\n",
            // Only from the floor this statement read: a re-decoded entry that lowered it
            // since (committed while this waited for the row) keeps it lowered.
            "    UPDATE inbox_key_floor f SET floor = h.floor FROM heads h\n",
            "    WHERE f.route = h.route AND f.correlation_key = h.correlation_key AND f.floor = h.old AND h.floor > h.old\n",
            "), created AS (\n",
            "    INSERT INTO inbox_key_floor (route, correlation_key, floor)\n",
            "    SELECT h.route, h.correlation_key, h.floor FROM heads h WHERE h.old IS NULL\n",
            "    ON CONFLICT (route, correlation_key) DO NOTHING\n",
            ")\n",
            "SELECT claimed.* FROM claimed"
        )
    };
}

/// Step two: of step one's candidates (`$8`), those still OPEN, due and the head of
/// their key, now that the keys are held (`$9`): the snapshot of this statement is
/// taken after the locks, so it sees every insert and claim of those keys that
/// committed before them. Only the candidates are read again, not the route's whole
/// backlog. A candidate without a key that has meanwhile been decoded into a key not
/// held is left (`$9` again, on the row as updated). The floor of each key claimed
/// moves up to the key's head (`sql/postgres_0012_key_floor.sql`), so the next
/// claim's questions about the key start there.
#[doc(hidden)]
pub const CLAIM_HELD_SQL: &str = claim_held!("WITH ", "$8");

/// [`CLAIM_HELD_SQL`] for settles that hand their keys on: the candidates are each
/// held key's (`$9`) first unresolved entry after the one just settled (`$8`, in the
/// same order), found in this statement's snapshot, which came after the keys'
/// locks ([`SETTLE_MANY_SQL`] or [`LOCK_KEYS_SQL`] took them).
const CLAIM_NEXT_SQL: &str = claim_held!(
    concat!(
        "WITH candidates AS (\n",
        "    SELECT h.id FROM unnest($8::bigint[], $9::text[]) AS v(after, key)\n",
        "    CROSS JOIN LATERAL (\n",
        "        SELECT o.id FROM inbox_entry o\n",
        "        WHERE o.route = $1 AND o.correlation_key = v.key AND o.id > v.after AND o.status IN ('OPEN', 'PARKED')\n",
        "        ORDER BY o.id LIMIT 1) h\n",
        "), "
    ),
    "ARRAY(SELECT id FROM candidates)"
);

/// The insert without its `RETURNING`: the shared key lock is taken in the scan that
/// feeds the row, so before the row's id is drawn, and held until the insert's
/// transaction commits.
macro_rules! insert_body {
    () => {
        concat!(
            "INSERT INTO inbox_entry (\n",
            "    route, dedup_key, correlation_key, event_type, schema_version, body, raw_data, attributes,\n",
            "    message_id, publish_time, delivery_attempt, payload_digest, conflict_of, status, attempts,\n",
            "    next_attempt_at, last_error, received_at, updated_at, finished_at, error_fingerprint)\n",
            "SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::bytea, $7::bytea, $8::text,\n",
            "    $9::text, $10::text, $11::integer, $12::text, $13::bigint, $14::text, 0,\n",
            "    $15::bigint, $16::text, $15::bigint, $15::bigint, $17::bigint, $18::text\n",
            "FROM (SELECT pg_advisory_xact_lock_shared(",
            key_lock!("COALESCE($3::text, '')"),
            ")) AS key_guard\n",
            "ON CONFLICT (route, dedup_key) DO NOTHING\n"
        )
    };
}

/// After an insert whose rows are returned as `new` (`route`, `correlation_key`,
/// `status`): the key row of each unresolved one (`inbox_key_floor`, floor 0: only a
/// claim raises it), so a claim can list the route's keys from there. In key order,
/// so two inserts creating keys wait for each other in one order only.
macro_rules! key_floor_rows {
    () => {
        concat!(
            "key_floor AS (\n",
            "    INSERT INTO inbox_key_floor (route, correlation_key)\n",
            "    SELECT DISTINCT n.route, n.correlation_key FROM new n\n",
            "    WHERE n.correlation_key IS NOT NULL AND n.status IN ('OPEN', 'PARKED')\n",
            "    ORDER BY n.route, n.correlation_key\n",
            "    ON CONFLICT (route, correlation_key) DO NOTHING)\n"
        )
    };
}

/// The insert: the new row's id, and no digest.
#[doc(hidden)]
pub const INSERT_SQL: &str = concat!(
    "WITH new AS (\n",
    insert_body!(),
    "RETURNING id, route, correlation_key, status), ",
    key_floor_rows!(),
    "SELECT id, NULL::text AS payload_digest, NULL::boolean AS replay_open FROM new"
);

/// The first insert of a message, answered in one statement whether it is new or a
/// redelivery: the new row's id and no digest, or the existing row's id and digest
/// and whether a replay window of the route is open (at `$15`, the insert's time).
/// Nothing comes back when the row it conflicts with was committed after this
/// statement's snapshot was taken (a concurrent insert of the same key): the caller
/// then reads it in a statement of its own.
#[doc(hidden)]
pub const INSERT_OR_EXISTING_SQL: &str = concat!(
    "WITH new AS (\n",
    insert_body!(),
    "RETURNING id, route, correlation_key, status), ",
    key_floor_rows!(),
    "SELECT id, NULL::text AS payload_digest, NULL::boolean AS replay_open FROM new\n",
    "UNION ALL\n",
    "SELECT id, payload_digest,\n",
    "    EXISTS (SELECT 1 FROM inbox_replay_window w WHERE ",
    super::sqlstore::replay_open!("$1::text", "$15::bigint"),
    ")\nFROM inbox_entry\n",
    "WHERE route = $1 AND dedup_key = $2 AND NOT EXISTS (SELECT 1 FROM new)"
);

/// Many rows in one statement (the batch insert's fast path): the same columns as
/// [`INSERT_SQL`], one array per column, ids drawn in array order. Each row takes its
/// key's shared lock in the scan that feeds it, as the single insert does (same lock
/// key: route, `:`, correlation key). Returns, for every row in array order, the id
/// it was inserted under, or else the id and digest of the row already holding its
/// dedup key in this statement's snapshot (a redelivery, or a conflict for the caller
/// to settle), with whether a replay window of the row's route is open at `$17` (asked
/// of redeliveries only). A row with neither — its dedup key taken by an earlier row of the same
/// batch, or by a row committed after the snapshot was taken — is left to the caller
/// to insert one by one; or, where `$18` says the statement commits alone (it runs
/// without a transaction around it), makes the statement fail instead, so that none of
/// its rows stay (`inbox_refuse_batch`, `sql/postgres_0015_refuse_batch.sql`): a
/// conflict, or a row it cannot answer, then goes through the caller's transaction.
/// The lookup is a `LATERAL` probe per row, so that a plan made
/// while the table was small (a prepared statement's generic plan, kept until the
/// next `ANALYZE`) cannot turn it into a scan of the whole table per batch, as a join
/// did; and it is made only for a row the insert did not take (`new.id IS NULL`, a
/// one-time filter of the probe): an inserted row's answer is its new id, and the
/// probe, reading this statement's snapshot, could not see that row anyway.
const INSERT_MANY_SQL: &str = concat!(
    "\
WITH new AS (
INSERT INTO inbox_entry (
    route, dedup_key, correlation_key, event_type, schema_version, body, raw_data, attributes,
    message_id, publish_time, delivery_attempt, payload_digest, status, attempts,
    next_attempt_at, last_error, received_at, updated_at, finished_at, error_fingerprint)
SELECT r.route, r.dedup_key, r.correlation_key, r.event_type, r.schema_version, r.body, r.raw_data,
    r.attributes, r.message_id, r.publish_time, r.delivery_attempt, r.payload_digest, r.status, 0,
    $17::bigint, r.last_error, $17::bigint, $17::bigint, r.finished_at, r.error_fingerprint
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::bytea[],
        $8::text[], $9::text[], $10::text[], $11::integer[], $12::text[], $13::text[], $14::text[],
        $15::bigint[], $16::text[])
    WITH ORDINALITY AS r(route, dedup_key, correlation_key, event_type, schema_version, body, raw_data,
        attributes, message_id, publish_time, delivery_attempt, payload_digest, status, last_error,
        finished_at, error_fingerprint, ord)
CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock_shared(
    hashtextextended(r.route || ':' || COALESCE(r.correlation_key, ''), 0))) AS key_guard
ORDER BY r.ord
ON CONFLICT (route, dedup_key) DO NOTHING
RETURNING id, route, dedup_key, correlation_key, status), ",
    key_floor_rows!(),
    "SELECT new.id, old.id, old.payload_digest,
    CASE WHEN new.id IS NULL AND old.id IS NOT NULL
        THEN EXISTS (SELECT 1 FROM inbox_replay_window w WHERE ",
    super::sqlstore::replay_open!("k.route", "$17::bigint"),
    ") END,
    CASE WHEN $18 AND new.id IS NULL AND (old.id IS NULL OR old.payload_digest IS DISTINCT FROM k.digest)
        THEN inbox_refuse_batch('row ' || k.ord || ' has no answer of its own') END
FROM unnest($1::text[], $2::text[], $12::text[]) WITH ORDINALITY AS k(route, dedup_key, digest, ord)
LEFT JOIN new ON new.route = k.route AND new.dedup_key = k.dedup_key
LEFT JOIN LATERAL (
    SELECT o.id, o.payload_digest FROM inbox_entry o
    WHERE new.id IS NULL AND o.route = k.route AND o.dedup_key = k.dedup_key
    LIMIT 1) old ON true
ORDER BY k.ord"
);

/// A row of [`INSERT_MANY_SQL`]: the id inserted; else the id and digest of the row
/// met, and whether a replay window of the route is open; and the refusal's column
/// (never true: a refusal is an error).
type InsertManyRow = (Option<i64>, Option<i64>, Option<String>, Option<bool>, Option<bool>);

/// `$1`–`$5` of every claim statement (the `claim_where!` parameters) and of the claim
/// function, from the claim request `$req`.
macro_rules! claim_binds {
    ($query:expr, $req:expr) => {
        $query.bind($req.route).bind($req.now).bind($req.ordered).bind($req.parked_blocks).bind(i64::from($req.limit))
    };
}

/// SQLSTATEs of a call of a session's function that is not there yet: `pg_temp`
/// before the session has a temporary schema, and a function not in it.
const UNDEFINED_SCHEMA: &str = "3F000";
const UNDEFINED_FUNCTION: &str = "42883";

/// The SQLSTATE of `inbox_refuse_batch`'s error.
const BATCH_REFUSED: &str = "INLT1";

/// How the hot path's statements are planned, after `SET` or `SET LOCAL`: once per
/// connection, on their generic plans (see [`PgStore::begin_hot`]), and without
/// sequential scans. Every statement of the hot path reaches its rows through an
/// index (by id, by key, by status); a generic plan is made at a connection's first
/// use and kept, and made on a fresh inbox — never analyzed, which PostgreSQL takes
/// for ten pages whatever it holds — it read the whole table for every settle and
/// went on doing so as the table grew (2–3 ms against 0.3–0.6 ms by the primary key:
/// docs/measurements.md, "Plans without sequential scans, and claims in one call").
/// `tests/plans.rs` holds the by-id statements to their index on such a table.
macro_rules! hot_plans {
    // Inside a function, for its transaction (the claim function's).
    (set_config) => {
        "set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)"
    };
    ($set:literal) => {
        concat!($set, " plan_cache_mode TO force_generic_plan; ", $set, " enable_seqscan TO off")
    };
}

/// [`hot_plans!`] for a session: what a writer's connection sets once, for the batch
/// inserts and settles that run without a transaction ([`PgStore::insert_alone`],
/// [`PgStore::settle_alone`]). The writers then keep such a connection or close it,
/// never give it back to the pool ([`super::warm`]). Also what `tests/plans.rs` plans
/// under.
#[doc(hidden)]
pub const HOT_SESSION_SQL: &str = hot_plans!("SET");

impl PgStore {
    /// The batch insert's fast path, in one statement: what became of each entry
    /// ([`INSERT_MANY_SQL`]), or `None` for those the caller inserts one by one in the
    /// same transaction.
    async fn insert_new_rows(
        conn: &mut PgConnection,
        entries: &[super::NewEntry],
        now: crate::clock::Millis,
    ) -> Result<Option<Vec<Option<super::InsertOutcome>>>, StoreError> {
        Self::insert_rows(conn, entries, now, false).await
    }

    /// A batch of inserts as one statement that commits alone: one round trip, where a
    /// transaction takes three (`BEGIN`, the statement, `COMMIT`). The outcome of every
    /// entry, or `None` where the batch must go through a transaction instead: two
    /// entries share a dedup key, or the statement refused (a conflict, or a row whose
    /// holder committed after its snapshot: see [`INSERT_MANY_SQL`]), and then nothing
    /// of it stayed.
    async fn insert_alone(
        &self,
        warm: &mut super::warm::Warm<'_, Postgres>,
        entries: &[super::NewEntry],
        now: crate::clock::Millis,
    ) -> Result<Option<Vec<super::InsertOutcome>>, StoreError> {
        // An altered connection that is not kept is closed: with fewer kept than the
        // writers of both groups may hold at once, some would be, batch after batch.
        if warm.keeps() < WARM_KEEP as usize {
            return Ok(None);
        }
        if !unique_dedup_keys(entries) {
            return Ok(None);
        }
        self.hot_session(warm).await?;
        match Self::insert_rows(warm.conn(), entries, now, true).await {
            // Every row answered (a row without an answer refuses), but should one
            // not have been, the transaction's path answers from what is stored.
            Ok(Some(known)) => Ok(known.into_iter().collect()),
            Ok(None) => Ok(None),
            Err(e) if e.code().as_deref() == Some(BATCH_REFUSED) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`INSERT_MANY_SQL`], committing alone (`alone`: it refuses rather than leave a
    /// row unanswered) or in the caller's transaction.
    async fn insert_rows(
        conn: &mut PgConnection,
        entries: &[super::NewEntry],
        now: crate::clock::Millis,
        alone: bool,
    ) -> Result<Option<Vec<Option<super::InsertOutcome>>>, StoreError> {
        use super::{InsertOutcome, Status};
        let col = |f: fn(&super::NewEntry) -> Option<&str>| entries.iter().map(f).collect::<Vec<_>>();
        let body: Vec<Option<&[u8]>> = entries.iter().map(|e| e.decoded.as_ref().map(|d| d.body.as_slice())).collect();
        let raw_data: Vec<&[u8]> = entries.iter().map(|e| e.raw_data.as_slice()).collect();
        let attributes: Vec<String> =
            entries.iter().map(|e| serde_json::to_string(&e.attributes).expect("string pairs serialize")).collect();
        let delivery_attempt: Vec<Option<i32>> = entries.iter().map(|e| e.delivery_attempt).collect();
        let digest: Vec<String> = entries.iter().map(super::NewEntry::payload_digest).collect();
        let finished: Vec<Option<i64>> =
            entries.iter().map(|e| matches!(e.status, Status::Done | Status::Ignored).then_some(now)).collect();
        let fingerprint: Vec<Option<String>> =
            entries.iter().map(|e| e.last_error.as_deref().map(super::failures::fingerprint)).collect();
        let rows: Vec<InsertManyRow> = sqlx::query_as(INSERT_MANY_SQL)
            .bind(col(|e| Some(e.route.as_str())))
            .bind(col(|e| Some(e.dedup_key.as_str())))
            .bind(col(|e| e.decoded.as_ref().map(|d| d.correlation_key.as_str())))
            .bind(col(|e| e.decoded.as_ref().map(|d| d.event_type.as_str())))
            .bind(col(|e| e.decoded.as_ref().and_then(|d| d.schema_version.as_deref())))
            .bind(body)
            .bind(raw_data)
            .bind(attributes)
            .bind(col(|e| Some(e.message_id.as_str())))
            .bind(col(|e| e.publish_time.as_deref()))
            .bind(delivery_attempt)
            .bind(&digest)
            .bind(col(|e| Some(e.status.as_str())))
            .bind(col(|e| e.last_error.as_deref()))
            .bind(finished)
            .bind(fingerprint)
            .bind(now)
            .bind(alone)
            .fetch_all(&mut *conn)
            .await?;
        if rows.len() != entries.len() {
            // One row per entry by construction; if not, the one-by-one path decides.
            return Ok(None);
        }
        // A dedup key inserted belongs to the first entry of the batch that has it
        // (rows go in array order); a later one with the same key goes one by one.
        let mut taken = std::collections::HashSet::new();
        let outcomes = rows.into_iter().zip(&digest).map(|(row, digest)| match row {
            (Some(id), _, _, _, _) if taken.insert(id) => Some(InsertOutcome::Inserted { id }),
            (None, Some(id), Some(existing), replay_open, _) if existing == *digest => {
                Some(InsertOutcome::Duplicate { id, replay_open: replay_open.unwrap_or(true) })
            }
            _ => None,
        });
        Ok(Some(outcomes.collect()))
    }
}

/// Before a settle that gives entry `$1` the key `$2` (a requeued entry decoded again):
/// the key's lock, shared, as an insert takes it, so no claim of the key runs between
/// the key's floor and the entry joining the key.
const REKEY_LOCK_SQL: &str = "\
SELECT 1 FROM inbox_entry e
CROSS JOIN LATERAL (SELECT pg_advisory_xact_lock_shared(hashtextextended(e.route || ':' || $2::text, 0))) AS key_guard
WHERE e.id = $1";

/// After it: the key's floor lowered to the entry, which may be older than the key's
/// head (`sql/postgres_0012_key_floor.sql`); a key without a row gets one at 0 (an
/// older binary's entries of the key may have none).
const REKEY_FLOOR_SQL: &str = "\
INSERT INTO inbox_key_floor AS f (route, correlation_key, floor)
SELECT e.route, $2::text, 0 FROM inbox_entry e WHERE e.id = $1
ON CONFLICT (route, correlation_key) DO UPDATE SET floor = $1 WHERE f.floor > $1";

/// The statements that change one entry found by its id, on the condition that it is
/// in a status: the batch settle's own, and those the stores share. Each compares the
/// status through a sub-select (`status = (SELECT 'IN_PROGRESS')`), a value unknown
/// when the statement is planned, so no partial index of that status can serve it and
/// the row is reached by its id. With the status as a literal, statistics that call the
/// status nearly empty (an `ANALYZE` whose sample met none of its few rows, a common
/// draw once finished entries outnumber them a thousand to one) made PostgreSQL read
/// the whole partial index instead, dead entries included: a settle batch took 0.2 to
/// 0.5 s while holding its keys' locks, and inserts of those keys waited behind it
/// (docs/measurements.md, "Ten minutes at 80 %"). Listed for the test that plans them
/// on such statistics (`tests/plans.rs`).
#[doc(hidden)]
pub const BY_ID_STATEMENTS: &[(&str, &str)] = &[
    ("settle many", SETTLE_MANY_SQL),
    ("settle", super::sqlstore::SETTLE_SQL),
    ("park", super::sqlstore::PARK_SQL),
    ("requeue", super::sqlstore::REQUEUE_SQL),
    ("ignore", super::sqlstore::IGNORE_SQL),
];

/// Statements that read for every message of some kind (a redelivery the insert did
/// not answer, ingest's question about replay windows when one is open): each must be
/// planned once per connection and then run on its generic plan, not planned afresh
/// at every call as a statement with optional filters is (`tests/plans.rs`, which
/// runs each twenty times: reads only).
#[doc(hidden)]
pub const PER_MESSAGE_STATEMENTS: &[(&str, &str)] =
    &[("existing", super::sqlstore::EXISTING_SQL), ("open replay windows", super::sqlstore::REPLAY_WINDOWS_OPEN_SQL)];

/// The statements of the housekeeping that read every unresolved entry (the inbox
/// gauges, the key floors' mending): each must read them through the partial indexes
/// of their statuses, never the table with its finished entries (`tests/plans.rs`).
#[doc(hidden)]
pub const UNRESOLVED_READS: &[(&str, &str)] = &[
    ("counts", super::sqlstore::COUNTS_SQL),
    ("blocked keys", super::sqlstore::BLOCKED_KEYS_SQL),
    ("floors mend", FLOORS_MEND_SQL),
];

/// [`SETTLE_MANY_SQL`] up to its last `SELECT`: the settles, the attempt records and
/// the key locks, as CTEs (`settled`: the ids settled; `locked`: those whose key is
/// now held).
macro_rules! settle_many_ctes {
    () => {
        "\
WITH v AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::bigint[],
            $7::text[], $8::bigint[], $9::text[], $10::text[], $11::text[], $12::bytea[], $13::boolean[],
            $14::bigint[], $15::text[], $16::text[], $27::text[])
        AS v(id, owner, token, status, now, next, error, finished, ck, et, sv, body, reset, nys, dedup, fp, first)
), settled AS (
    UPDATE inbox_entry e SET
        status = v.status,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = v.now,
        next_attempt_at = COALESCE(v.next, e.next_attempt_at),
        last_error = COALESCE(v.error, e.last_error),
        finished_at = v.finished,
        correlation_key = COALESCE(v.ck, e.correlation_key),
        event_type = COALESCE(v.et, e.event_type),
        schema_version = COALESCE(v.sv, e.schema_version),
        body = COALESCE(v.body, e.body),
        attempts = CASE WHEN v.reset THEN 0 ELSE e.attempts END,
        not_yet_since = COALESCE(e.not_yet_since, v.nys),
        dedup_key = COALESCE(v.dedup, e.dedup_key),
        error_fingerprint = COALESCE(v.fp, e.error_fingerprint),
        first_attempt = COALESCE(e.first_attempt, v.first)
    FROM v
    WHERE e.id = v.id AND e.status = (SELECT 'IN_PROGRESS') AND e.lease_owner = v.owner AND e.lease_token = v.token
    RETURNING e.id, v.first IS NOT NULL AND e.first_attempt = v.first AS kept
), recorded AS (
    INSERT INTO inbox_attempt (entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
    SELECT a.* FROM unnest($17::bigint[], $18::integer[], $19::text[], $20::bigint[], $21::bigint[], $22::text[],
            $23::text[], $24::text[], $25::text[], $26::text[])
        AS a(entry_id, attempt, owner, started_at, duration_ms, answer, status, reason, requests, plugin)
    WHERE a.entry_id IN (SELECT id FROM settled WHERE NOT kept)
), locked AS (
    SELECT l.id FROM unnest($28::bigint[], $29::text[], $30::text[]) AS l(id, route, key)
    WHERE CASE WHEN l.id IN (SELECT id FROM settled)
        THEN pg_try_advisory_xact_lock(hashtextextended(l.route || ':' || l.key, 0)) ELSE false END
)"
    };
}

/// A batch of settles in one statement: the same changes as `settle.sql` for every
/// entry whose lease still holds, and the attempt records of those, in the same
/// statement: an entry's first attempt into its own row (`$27`, as `settle.sql`
/// does), a later one into `inbox_attempt`. The settles that ask for their key's next
/// entry (`$28` their ids, `$29` routes, `$30` keys) try-lock their keys, as
/// [`LOCK_KEYS_SQL`] would, once settled: a round trip less for the hand-on
/// ([`CLAIM_NEXT_SQL`] then runs in a snapshot taken after those locks). Returns the
/// ids settled, each with whether its key is now held.
const SETTLE_MANY_SQL: &str =
    concat!(settle_many_ctes!(), "\nSELECT id, id IN (SELECT id FROM locked) AS locked FROM settled");

/// The settle batch and its hand-on as one call that commits alone
/// ([`PgStore::settle_alone`]): one round trip where the transaction takes four
/// (`BEGIN`, [`SETTLE_MANY_SQL`], [`CLAIM_NEXT_SQL`], `COMMIT`). A PL/pgSQL function of
/// the writer's session (in `pg_temp`, created when the writer first alters its
/// connection, [`PgStore::hot_session`]) runs the two statements in turn: a VOLATILE
/// function's statements each take a snapshot of their own, so the claim's comes after
/// the keys' locks, as in the transaction, and the locks are held until the call
/// commits. Its statements are the constants' own text (the claim's parameters bound
/// to the function's variables), so it cannot drift from them, and it lives in the
/// session, so no schema version carries a copy. Parameters: `$1`–`$30` as
/// [`SETTLE_MANY_SQL`]'s; `$31` the hand-on's route, `$32` its lease owner, `$33` the
/// lease's length, `$34` whether parked entries block their key, `$35` each ask's
/// time (beside `$28`–`$30`). Returns a row per entry settled (`settled_id`,
/// `key_held`), then a row per entry claimed (`claimed_entry`): of each key asked for,
/// in the batch's order, the first ask that settled and holds its key, as
/// [`PgStore::claim_next`] picks them.
static SETTLE_FUNCTION_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let claim = CLAIM_NEXT_SQL
        .strip_suffix("SELECT claimed.* FROM claimed")
        .expect("CLAIM_NEXT_SQL ends by selecting what it claimed");
    let claim = rebind(claim, |n| {
        match n {
            1 => "$31",
            2 => "ask_now",
            3 => "true",
            4 => "$34",
            5 => "cardinality(after_ids)",
            6 => "$32",
            7 => "$33",
            8 => "after_ids",
            9 => "ask_keys",
            _ => panic!("CLAIM_NEXT_SQL has no parameter ${n}"),
        }
        .to_string()
    });
    format!(
        "CREATE OR REPLACE FUNCTION pg_temp.inlet_settle_batch(
    bigint[], text[], bigint[], text[], bigint[], bigint[], text[], bigint[], text[], text[], text[], bytea[],
    boolean[], bigint[], text[], text[], bigint[], integer[], text[], bigint[], bigint[], text[], text[], text[],
    text[], text[], text[], bigint[], text[], text[], text, text, bigint, boolean, bigint[])
RETURNS TABLE (settled_id bigint, key_held boolean, claimed_entry inbox_entry)
LANGUAGE plpgsql VOLATILE AS $inlet$
#variable_conflict use_column
DECLARE
    s_ids bigint[];
    s_held boolean[];
    after_ids bigint[];
    ask_keys text[];
    ask_now bigint;
BEGIN
{settle}
SELECT array_agg(id), array_agg(id IN (SELECT id FROM locked)) INTO s_ids, s_held FROM settled;
RETURN QUERY SELECT u.id, u.held, NULL::inbox_entry FROM unnest(s_ids, s_held) AS u(id, held);
SELECT array_agg(a.id ORDER BY a.i), array_agg(a.key ORDER BY a.i), max(a.now) INTO after_ids, ask_keys, ask_now
FROM (
    SELECT DISTINCT ON (l.key) l.id, l.key, l.now, l.i
    FROM unnest($28, $30, $35) WITH ORDINALITY AS l(id, key, now, i)
    JOIN unnest(s_ids, s_held) AS u(id, held) ON u.id = l.id AND u.held
    ORDER BY l.key, l.i) a;
IF after_ids IS NOT NULL THEN
RETURN QUERY {claim}SELECT NULL::bigint, NULL::boolean, ROW(claimed.*)::inbox_entry FROM claimed;
END IF;
END
$inlet$",
        settle = settle_many_ctes!(),
    )
});

/// Calls [`SETTLE_FUNCTION_SQL`]'s function: the claimed entries' columns spread out,
/// so a row reads as a claim's row does.
const SETTLE_ALONE_SQL: &str = "\
SELECT s.settled_id, s.key_held, (s.claimed_entry).*
FROM pg_temp.inlet_settle_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
    $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35) AS s";

/// An ordered claim as one call that commits alone ([`PgStore::claim_alone`]): one
/// round trip where the transaction takes four or five (`BEGIN`, step one's
/// [`CLAIM_KEYS_SQL`] and/or [`CLAIM_HEADS_SQL`], [`CLAIM_UNKEYED_SQL`] on a route
/// claimed heads first, [`CLAIM_HELD_SQL`], `COMMIT`). A PL/pgSQL function in the
/// session's temporary schema, made the way [`SETTLE_FUNCTION_SQL`] is: the
/// statements' own text, parameters rebound to the function's, each statement in a
/// snapshot of its own (VOLATILE), so step two's comes after step one's key locks,
/// which hold to the call's commit. It sets for its transaction what
/// [`CLAIM_BEGIN_SQL`] sets (a commit that does not wait for the disk, the hot path's
/// plans). Parameters: `$1`–`$5` as every claim statement's, `$6` the lease's owner,
/// `$7` its length, `$8` the window ([`claim_window`]), `$9`/`$10` the claim's part of
/// the keys (NULL: every key), `$11` whether the route is claimed heads first, `$12`
/// whether its keys are due a count ([`PgStore::keys_due`]), `$13` whether its waiting
/// entries are ([`WAITING_RECOUNT`]; on a route claimed from its window they are
/// counted at every claim, with the window's bound: [`WAITING_SQL`]). Returns, when the keys were walked or
/// counted or the waiting entries counted, a row with how many (`keys_met`,
/// `waiting_met`), then a row per entry claimed (`claimed_entry`). The branches are
/// those of [`PgStore::claim_rows`]' transaction.
static CLAIM_FUNCTION_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let to = |map: &'static [(u32, &'static str)]| {
        move |n: u32| {
            map.iter()
                .find(|(from, _)| *from == n)
                .map_or_else(|| panic!("no ${n} to rebind"), |(_, to)| to.to_string())
        }
    };
    let window = rebind(
        CLAIM_KEYS_SQL,
        to(&[(1, "$1"), (2, "$2"), (3, "$3"), (4, "$4"), (5, "$5"), (6, "$8"), (7, "$9"), (8, "$10")]),
    );
    // The window's bound as read beforehand, with how many wait (`WAITING_SQL`).
    let bound = rebind(window_bound!(), to(&[(1, "$1"), (6, "$8")]));
    assert!(window.contains(&bound), "CLAIM_KEYS_SQL bounds its window with window_bound!()");
    let window = window.replace(&bound, "w_bound");
    let waiting = rebind(WAITING_SQL, to(&[(1, "$1"), (2, "$8")]));
    let count = rebind(KEYS_COUNT_SQL, to(&[(1, "$1"), (2, "$9"), (3, "$10")]));
    let heads = rebind(
        CLAIM_HEADS_SQL,
        to(&[(1, "$1"), (2, "$2"), (3, "$4"), (4, "wanted"), (5, "array_remove(c_keys, NULL)"), (6, "$9"), (7, "$10")]),
    );
    let unkeyed = rebind(CLAIM_UNKEYED_SQL, to(&[(1, "$1"), (2, "$2"), (3, "wanted")]));
    let held = CLAIM_HELD_SQL
        .strip_suffix("SELECT claimed.* FROM claimed")
        .expect("CLAIM_HELD_SQL ends by selecting what it claimed");
    let held = rebind(
        held,
        to(&[
            (1, "$1"),
            (2, "$2"),
            (3, "$3"),
            (4, "$4"),
            (5, "$5"),
            (6, "$6"),
            (7, "$7"),
            (8, "c_ids"),
            (9, "held_keys"),
        ]),
    );
    format!(
        "CREATE OR REPLACE FUNCTION pg_temp.inlet_claim(
    text, bigint, boolean, boolean, bigint, text, bigint, bigint, bigint, bigint, boolean, boolean, boolean)
RETURNS TABLE (keys_met bigint, waiting_met bigint, claimed_entry inbox_entry)
LANGUAGE plpgsql VOLATILE AS $inlet$
#variable_conflict use_column
DECLARE
    c_ids bigint[] := '{{}}';
    c_keys text[] := '{{}}';
    held_keys text[];
    wanted bigint := $5;
    met bigint;
    waiting bigint;
    w_last bigint;
    w_bound bigint;
BEGIN
PERFORM set_config('synchronous_commit', 'off', true), {hot_plans};
IF NOT $11 OR $13 THEN
    {waiting} INTO waiting, w_last;
END IF;
IF NOT $11 THEN
    w_bound := CASE WHEN waiting >= $8 THEN w_last ELSE 9223372036854775807 END;
    SELECT coalesce(array_agg(w.id), '{{}}'), coalesce(array_agg(w.correlation_key), '{{}}') INTO c_ids, c_keys
    FROM ({window}) w;
    wanted := $5 - cardinality(c_ids);
    IF $12 AND (wanted <= 0 OR waiting < $8) THEN
        {count} INTO met;
    END IF;
END IF;
IF wanted > 0 AND ($11 OR waiting >= $8) THEN
    SELECT c_ids || coalesce(array_agg(h.id) FILTER (WHERE h.id IS NOT NULL), '{{}}'),
        c_keys || coalesce(array_agg(h.correlation_key) FILTER (WHERE h.id IS NOT NULL), '{{}}'),
        coalesce(max(h.keys), 0)
    INTO c_ids, c_keys, met
    FROM ({heads}) h;
    wanted := $5 - cardinality(c_ids);
    IF $11 AND wanted > 0 THEN
        SELECT c_ids || coalesce(array_agg(u.id), '{{}}'), c_keys || coalesce(array_agg(u.correlation_key), '{{}}')
        INTO c_ids, c_keys
        FROM ({unkeyed}) u;
    END IF;
END IF;
IF met IS NOT NULL OR waiting IS NOT NULL THEN
    RETURN QUERY SELECT met, waiting, NULL::inbox_entry;
END IF;
IF cardinality(c_ids) > 0 THEN
    held_keys := array_remove(c_keys, NULL);
    RETURN QUERY {held}SELECT NULL::bigint, NULL::bigint, ROW(claimed.*)::inbox_entry FROM claimed;
END IF;
END
$inlet$",
        hot_plans = hot_plans!(set_config),
    )
});

/// Calls [`CLAIM_FUNCTION_SQL`]'s function: the claimed entries' columns spread out,
/// so a row reads as a claim's row does.
const CLAIM_ALONE_SQL: &str = "\
SELECT c.keys_met, c.waiting_met, (c.claimed_entry).*
FROM pg_temp.inlet_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) AS c";

/// `sql` with each parameter `$n` written as `to(n)`.
fn rebind(sql: &str, to: impl Fn(u32) -> String) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push('$');
        } else {
            out.push_str(&to(rest[at + 1..at + 1 + digits].parse().expect("digits")));
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// How a transaction of the hot path begins (a batch of inserts or settles): its
/// statements on their generic plans ([`PgStore::begin_hot`]), in the round trip of
/// the `BEGIN`.
const HOT_BEGIN_SQL: &str = concat!("BEGIN; ", hot_plans!("SET LOCAL"));

/// How a claim's transaction begins: generic plans as [`HOT_BEGIN_SQL`], and a commit
/// that does not wait for the disk (see `claim_rows`).
const CLAIM_BEGIN_SQL: &str = concat!("BEGIN; SET LOCAL synchronous_commit TO OFF; ", hot_plans!("SET LOCAL"));

/// For settles that ask for their key's next entry (`$1` routes, `$2` keys), where
/// [`SETTLE_MANY_SQL`] did not run: try-locks each key (as a claim's step one does;
/// held to the commit), returning the positions (from 1) of the keys now held. The
/// candidates are found by [`CLAIM_NEXT_SQL`], in a snapshot taken after the locks.
const LOCK_KEYS_SQL: &str = "\
SELECT v.i FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS v(route, key, i)
WHERE pg_try_advisory_xact_lock(hashtextextended(v.route || ':' || v.key, 0))";

impl PgStore {
    /// Begins a transaction of the hot path (a batch of inserts or of settles),
    /// whose statements run on their generic plans. PostgreSQL plans a prepared
    /// statement afresh at every execution while a plan made for the values at hand
    /// looks cheaper than the generic one, which for these statements (CTEs, partial
    /// indexes, parameters that switch rules on and off) it always does; planning then
    /// cost as much as running them. On a 10-key drain, PostgreSQL's CPU per delivery
    /// went 454 → 277–298 µs and the rate 2,095–2,334 → 2,846–2,985 deliveries/s
    /// (docs/measurements.md, "Claims handed on, and generic plans").
    async fn begin_hot(conn: &mut PgConnection) -> Result<sqlx::Transaction<'_, Postgres>, StoreError> {
        Ok(sqlx::Connection::begin_with(conn, HOT_BEGIN_SQL).await?)
    }

    /// The next entries of the settled items' keys, claimed on `conn` (the settles'
    /// transaction) for the items that ask ([`super::SettleRequest::next`]) and
    /// settled: step two of an ordinary claim over each held key's next entry
    /// ([`CLAIM_NEXT_SQL`]), so every rule of a claim holds. `held`: whose keys
    /// [`SETTLE_MANY_SQL`] locked, if it ran; else they are try-locked here
    /// ([`LOCK_KEYS_SQL`]). A row per item.
    async fn claim_next(
        conn: &mut PgConnection,
        items: &[super::SettleRequest],
        settled: &[bool],
        held: Option<&[bool]>,
    ) -> Result<Vec<Option<PgRow>>, StoreError> {
        use sqlx::Row as _;
        let mut next: Vec<Option<PgRow>> = items.iter().map(|_| None).collect();
        // One ask per key: a key appears once in flight, but a batch may hold a
        // settle whose lease was lost beside the settle of the key's new holder.
        let mut asked = std::collections::HashSet::new();
        let mut asking: Vec<(usize, &super::NextOfKey)> = items
            .iter()
            .zip(settled)
            .enumerate()
            .filter_map(|(n, (i, ok))| i.next.as_ref().filter(|_| *ok).map(|next| (n, next)))
            .filter(|(n, _)| held.is_none_or(|held| held[*n]))
            .filter(|(_, next)| asked.insert((next.route.as_str(), next.key.as_str())))
            .collect();
        if asking.is_empty() {
            return Ok(next);
        }
        if held.is_none() {
            let locked: Vec<i64> = sqlx::query_scalar(LOCK_KEYS_SQL)
                .bind(asking.iter().map(|(_, n)| n.route.as_str()).collect::<Vec<_>>())
                .bind(asking.iter().map(|(_, n)| n.key.as_str()).collect::<Vec<_>>())
                .fetch_all(&mut *conn)
                .await?;
            let locked: std::collections::HashSet<i64> = locked.into_iter().collect();
            let mut position = 0;
            asking.retain(|_| {
                position += 1;
                locked.contains(&position)
            });
        }
        // Step two once per route and lease (one in practice: a relay's settles).
        while let Some(&(first, _)) = asking.first() {
            let of = |n: usize| {
                let (i, ask) = (&items[n], items[n].next.as_ref().expect("asked"));
                (ask.route.as_str(), i.lease.owner.as_str(), ask.lease_ms, ask.parked_blocks)
            };
            let group = of(first);
            let (mine, rest): (Vec<_>, Vec<_>) = asking.into_iter().partition(|(n, _)| of(*n) == group);
            asking = rest;
            let (route, owner, lease_ms, parked_blocks) = group;
            let now = mine.iter().map(|(n, _)| items[*n].now).max().expect("an ask");
            let rows = sqlx::query(CLAIM_NEXT_SQL)
                .bind(route)
                .bind(now)
                .bind(true)
                .bind(parked_blocks)
                .bind(mine.len() as i64)
                .bind(owner)
                .bind(lease_ms)
                .bind(mine.iter().map(|(n, _)| items[*n].id).collect::<Vec<_>>())
                .bind(mine.iter().map(|(_, ask)| ask.key.as_str()).collect::<Vec<_>>())
                .fetch_all(&mut *conn)
                .await?;
            // Each claimed entry to the settle of its key (one ask per key).
            for row in rows {
                let key: Option<String> = row.try_get("correlation_key")?;
                if let Some(&(n, _)) = mine.iter().find(|(_, ask)| Some(ask.key.as_str()) == key.as_deref()) {
                    next[n] = Some(row);
                }
            }
        }
        Ok(next)
    }

    /// [`super::Store::settle_batch`] in one statement: whether each item settled
    /// (`false`: its lease is gone, nothing of it was written), and whether its key is
    /// now held, where it asks for its key's next entry. `None` (done one by one
    /// instead) if an entry appears twice.
    async fn settle_many(
        conn: &mut PgConnection,
        items: &[super::SettleRequest],
    ) -> Result<Option<Vec<(bool, bool)>>, StoreError> {
        use sqlx::Row as _;
        if !Self::settle_many_fits(items) {
            return Ok(None);
        }
        let rows = Self::settle_rows(conn, SETTLE_MANY_SQL, items, None).await?;
        let mut settled = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            settled.insert(row.try_get::<i64, _>("id")?, row.try_get::<bool, _>("locked")?);
        }
        Ok(Some(items.iter().map(|i| settled.get(&i.id).map_or((false, false), |held| (true, *held))).collect()))
    }

    /// Whether [`SETTLE_MANY_SQL`] can settle `items`: no entry twice, and none
    /// decoded again (such an entry joins its key under the key's lock, `settle_in`).
    fn settle_many_fits(items: &[super::SettleRequest]) -> bool {
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        items.iter().all(|i| seen.insert(i.id))
            && !items.iter().any(|i| matches!(i.settlement, super::Settlement::Decoded { .. }))
    }

    /// Runs `sql`, [`SETTLE_MANY_SQL`] or [`SETTLE_ALONE_SQL`], with `items` bound as
    /// its first 30 parameters, and for the second the hand-on's five.
    async fn settle_rows(
        conn: &mut PgConnection,
        sql: &str,
        items: &[super::SettleRequest],
        hand_on: Option<HandOn<'_>>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let cols: Vec<super::SettleColumns<'_>> = items.iter().map(|i| i.settlement.columns(i.now)).collect();
        let decoded =
            |f: fn(&super::Decoded) -> Option<&str>| cols.iter().map(|c| c.decoded.and_then(f)).collect::<Vec<_>>();
        let attempts: Vec<(i64, &super::failures::Attempt)> =
            items.iter().filter_map(|i| i.attempt.as_ref().map(|a| (i.id, a))).collect();
        let requests: Vec<String> = attempts
            .iter()
            .map(|(_, a)| serde_json::to_string(&a.requests).expect("request records serialize"))
            .collect();
        let firsts: Vec<Option<String>> = items
            .iter()
            .map(|i| i.attempt.as_ref().map(|a| serde_json::to_string(a).expect("attempts serialize")))
            .collect();
        let asking: Vec<(&super::SettleRequest, &super::NextOfKey)> =
            items.iter().filter_map(|i| i.next.as_ref().map(|next| (i, next))).collect();
        let mut query = sqlx::query(sql)
            .bind(items.iter().map(|i| i.id).collect::<Vec<_>>())
            .bind(items.iter().map(|i| i.lease.owner.as_str()).collect::<Vec<_>>())
            .bind(items.iter().map(|i| i.lease.token).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.status.as_str()).collect::<Vec<_>>())
            .bind(items.iter().map(|i| i.now).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.next_attempt_at).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.error).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.finished_at).collect::<Vec<_>>())
            .bind(decoded(|d| Some(d.correlation_key.as_str())))
            .bind(decoded(|d| Some(d.event_type.as_str())))
            .bind(decoded(|d| d.schema_version.as_deref()))
            .bind(cols.iter().map(|c| c.decoded.map(|d| d.body.as_slice())).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.reset).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.not_yet_since).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.dedup_key).collect::<Vec<_>>())
            .bind(cols.iter().map(|c| c.error.map(super::failures::fingerprint)).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(id, _)| *id).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.attempt).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.owner.as_str()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.started_at).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.duration_ms).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.answer.as_str()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.status.as_str()).collect::<Vec<_>>())
            .bind(attempts.iter().map(|(_, a)| a.reason.as_deref()).collect::<Vec<_>>())
            .bind(requests)
            .bind(attempts.iter().map(|(_, a)| a.plugin.as_deref()).collect::<Vec<_>>())
            .bind(firsts)
            .bind(asking.iter().map(|(i, _)| i.id).collect::<Vec<_>>())
            .bind(asking.iter().map(|(_, n)| n.route.as_str()).collect::<Vec<_>>())
            .bind(asking.iter().map(|(_, n)| n.key.as_str()).collect::<Vec<_>>());
        if let Some(h) = hand_on {
            query = query
                .bind(h.route)
                .bind(h.owner)
                .bind(h.lease_ms)
                .bind(h.parked_blocks)
                .bind(asking.iter().map(|(i, _)| i.now).collect::<Vec<_>>());
        }
        Ok(query.fetch_all(&mut *conn).await?)
    }

    /// Prepares a writer's connection, once, for the statements that commit alone:
    /// generic plans for its session ([`HOT_SESSION_SQL`]) and the settle function
    /// ([`SETTLE_FUNCTION_SQL`]). Such a connection is kept for the writers or closed.
    async fn hot_session(&self, warm: &mut super::warm::Warm<'_, Postgres>) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        if warm.altered() {
            return Ok(());
        }
        // Two statements: the simple protocol (a `&str` runs unprepared).
        sqlx::Executor::execute(&mut *warm.conn(), HOT_SESSION_SQL).await?;
        warm.alter();
        if !self.no_session_functions.load(Relaxed) {
            // Once per connection: not kept among its prepared statements.
            match sqlx::query(&SETTLE_FUNCTION_SQL).persistent(false).execute(&mut *warm.conn()).await {
                Ok(_) => {}
                // The server said no (no `TEMP` on the database): the transaction serves.
                Err(sqlx::Error::Database(error)) => self.refused_session_function(&*error),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// A settle batch and its hand-on as one call that commits alone
    /// ([`SETTLE_FUNCTION_SQL`]): what [`super::Store::settle_batch`] answers, or `None`
    /// where the batch goes through the transaction instead: fewer writers'
    /// connections kept than [`WARM_KEEP`] (an altered connection not kept is closed),
    /// no settle function, what [`SETTLE_MANY_SQL`] cannot settle, or hand-ons for more
    /// than one route or lease. An entry claimed that cannot be read is parked after
    /// the call, as an ordinary claim's is.
    async fn settle_alone(
        &self,
        warm: &mut super::warm::Warm<'_, Postgres>,
        items: &[super::SettleRequest],
    ) -> Result<Option<Vec<Result<Option<super::Claimed>, StoreError>>>, StoreError> {
        use sqlx::Row as _;
        use std::sync::atomic::Ordering::Relaxed;
        if warm.keeps() < WARM_KEEP as usize
            || self.no_session_functions.load(Relaxed)
            || !Self::settle_many_fits(items)
        {
            return Ok(None);
        }
        let Some(hand_on) = HandOn::of(items) else {
            return Ok(None);
        };
        self.hot_session(warm).await?;
        if self.no_session_functions.load(Relaxed) {
            return Ok(None);
        }
        let rows = Self::settle_rows(warm.conn(), SETTLE_ALONE_SQL, items, Some(hand_on)).await?;
        let mut settled = std::collections::HashMap::with_capacity(items.len());
        let mut claimed_rows = Vec::new();
        for row in rows {
            match row.try_get::<Option<i64>, _>("settled_id")? {
                Some(id) => {
                    settled.insert(id, row.try_get::<bool, _>("key_held")?);
                }
                None => claimed_rows.push(row),
            }
        }
        // Each entry claimed to the first settle that asked for its key and holds it.
        let mut next: Vec<Option<super::Claimed>> = items.iter().map(|_| None).collect();
        for row in claimed_rows {
            let key: Option<String> = row.try_get("correlation_key")?;
            let Some(n) = items.iter().position(|i| {
                i.next.as_ref().is_some_and(|ask| Some(ask.key.as_str()) == key.as_deref())
                    && settled.get(&i.id) == Some(&true)
            }) else {
                continue;
            };
            let (i, lease_ms) = (&items[n], items[n].next.as_ref().map_or(0, |ask| ask.lease_ms));
            let (mut claimed, unreadable) =
                Self::claimed_from(std::slice::from_ref(&row), &i.lease.owner, i.now, lease_ms)?;
            Self::park_unreadable(warm.conn(), unreadable, i.now).await?;
            next[n] = claimed.pop();
        }
        Ok(Some(
            items
                .iter()
                .zip(next)
                .map(|(i, next)| match settled.contains_key(&i.id) {
                    true => Ok(next),
                    false => Err(StoreError::LeaseLost { id: i.id }),
                })
                .collect(),
        ))
    }
}

/// The claim a settle batch's hand-ons make, as [`SETTLE_ALONE_SQL`] takes it: one
/// route and lease for all of them (a relay's settles).
#[derive(Clone, Copy, PartialEq)]
struct HandOn<'a> {
    route: &'a str,
    owner: &'a str,
    lease_ms: i64,
    parked_blocks: bool,
}

impl<'a> HandOn<'a> {
    /// The one claim `items`' hand-ons make (without any, one that is never read), or
    /// `None` if they make more than one.
    fn of(items: &'a [super::SettleRequest]) -> Option<HandOn<'a>> {
        let mut claims = items.iter().filter_map(|i| {
            i.next.as_ref().map(|n| HandOn {
                route: n.route.as_str(),
                owner: i.lease.owner.as_str(),
                lease_ms: n.lease_ms,
                parked_blocks: n.parked_blocks,
            })
        });
        let first = claims.next();
        if claims.any(|c| Some(c) != first) {
            return None;
        }
        Some(first.unwrap_or(HandOn { route: "", owner: "", lease_ms: 0, parked_blocks: false }))
    }
}

/// Whether no two of `entries` share a route and dedup key.
fn unique_dedup_keys(entries: &[super::NewEntry]) -> bool {
    let mut keys = std::collections::HashSet::with_capacity(entries.len());
    entries.iter().all(|e| keys.insert((e.route.as_str(), e.dedup_key.as_str())))
}

/// Dead or changed rows of `inbox_entry` that make [`PgStore::maintain_tables`] act,
/// at least; and at least this share (1/N) of the live rows: dead ones for a vacuum,
/// changed ones for new statistics.
const MAINTAIN_MIN_ROWS: i64 = 10_000;
const VACUUM_SHARE: i64 = 20;
const ANALYZE_SHARE: i64 = 10;

impl PgStore {
    /// [`super::Store::maintain`]: the key floors ([`PgStore::keep_floors`]), then the
    /// entry table ([`PgStore::maintain_entries`]).
    async fn maintain_tables(&self) -> Result<Option<String>, StoreError> {
        let floors = self.keep_floors().await?;
        let tables = self.maintain_entries().await?;
        Ok(match (floors, tables) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        })
    }

    /// `inbox_key_floor` kept whole and small, every [`FLOORS_EVERY`]: the rows of
    /// keys with nothing unresolved left are deleted, each under its key's lock taken
    /// exclusively and checked again after it (as a claim checks), so an insert of
    /// the key in flight keeps its row; and what an older binary left undone during a
    /// rolling upgrade is made good (sql/postgres_0012_key_floor.sql): a row added for
    /// each key with unresolved entries and none (floor 0), a floor above an
    /// unresolved entry lowered to it. Lowering a floor or adding a row at 0 is always
    /// safe; only a claim raises one.
    async fn keep_floors(&self) -> Result<Option<String>, StoreError> {
        {
            let mut last = self.floors_kept.lock().expect("floors lock");
            if last.is_some_and(|at| at.elapsed() < FLOORS_EVERY) {
                return Ok(None);
            }
            *last = Some(std::time::Instant::now());
        }
        let (lowered, added): (i64, i64) = sqlx::query_as(FLOORS_MEND_SQL).fetch_one(&self.pool).await?;
        if lowered > 0 {
            // Only an older binary's re-decode (during a rolling upgrade) leaves a floor
            // above an unresolved entry; anything else is a fault in the floor's rule.
            tracing::warn!(lowered, "key floors found above an unresolved entry of their key, lowered");
        }
        // In batches, each its own transaction: every key of a batch is locked until
        // it commits, and advisory locks share the server's lock table with the rest.
        let mut deleted = 0;
        for _ in 0..FLOORS_BATCHES {
            let mut tx = self.pool.begin().await?;
            let held: Vec<(String, String)> =
                sqlx::query_as(FLOORS_IDLE_SQL).bind(FLOORS_BATCH).fetch_all(&mut *tx).await?;
            let (routes, keys): (Vec<String>, Vec<String>) = held.into_iter().unzip();
            if !keys.is_empty() {
                let sql = sqlx::query(FLOORS_DELETE_SQL).bind(&routes).bind(&keys);
                deleted += sql.execute(&mut *tx).await?.rows_affected();
            }
            tx.commit().await?;
            if (keys.len() as i64) < FLOORS_BATCH {
                break;
            }
        }
        Ok((lowered + added > 0 || deleted > 0)
            .then(|| format!("key floors: {deleted} rows of finished keys deleted, {added} added, {lowered} lowered")))
    }

    /// The entry table vacuumed and analyzed when enough changed. Every claim and
    /// settle leaves a dead row version behind, and the partial indexes the claim
    /// reads (OPEN, IN_PROGRESS) keep pointing at them until a vacuum; autovacuum's
    /// defaults wait for a fifth of the table to die, and its statistics go stale, so
    /// the planner walks the primary key past every settled row, and a claim grows
    /// from milliseconds to tens of them. A
    /// vacuum here is the table owner's (Inlet created the table); without the right,
    /// PostgreSQL skips it with a warning.
    ///
    /// Statistics are gathered less often than dead rows are cleared: a vacuum only
    /// visits the pages that changed and the indexes, while `ANALYZE` samples pages
    /// whatever changed, and a drain makes enough dead versions every 5 s that
    /// analyzing each time would cost a tenth of a core. `sql/postgres_0008_statistics.sql`
    /// keeps statistics on the filtered columns only, from a fifth of the sample.
    /// (Figures: docs/measurements.md.)
    ///
    /// Without parallel workers (`PARALLEL 0`), as autovacuum runs: a manual `VACUUM`
    /// otherwise vacuums the indexes with up to `max_parallel_maintenance_workers`
    /// more processes, which speeds the vacuum by taking cores from the claims,
    /// settles and inserts it runs beside (seen on 2 cores at 4,500 msg/s: a vacuum
    /// every 10–25 s, and two parallel workers running beside it in a sixth of the
    /// seconds `scripts/pg-watch` caught one). This bounds what maintenance takes; it
    /// is not a speed-up: three minutes at 4,000 msg/s, two runs each way, moved p99 by
    /// no more than the runs spread (docs/measurements.md).
    async fn maintain_entries(&self) -> Result<Option<String>, StoreError> {
        let stats: Option<(i64, i64, i64)> = sqlx::query_as(
            "SELECT n_live_tup, n_dead_tup, n_mod_since_analyze FROM pg_stat_user_tables \
             WHERE relid = 'inbox_entry'::regclass",
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some((live, dead, changed)) = stats else { return Ok(None) };
        let analyze = changed >= (live / ANALYZE_SHARE).max(MAINTAIN_MIN_ROWS);
        if dead >= (live / VACUUM_SHARE).max(MAINTAIN_MIN_ROWS) {
            if analyze {
                sqlx::raw_sql("VACUUM (ANALYZE, PARALLEL 0) inbox_entry").execute(&self.pool).await?;
                return Ok(Some(format!("vacuumed and analyzed inbox_entry ({dead} dead rows, {live} live)")));
            }
            sqlx::raw_sql("VACUUM (PARALLEL 0) inbox_entry").execute(&self.pool).await?;
            return Ok(Some(format!("vacuumed inbox_entry ({dead} dead rows, {live} live)")));
        }
        if analyze {
            sqlx::raw_sql("ANALYZE inbox_entry").execute(&self.pool).await?;
            return Ok(Some(format!("analyzed inbox_entry ({changed} rows changed, {live} live)")));
        }
        Ok(None)
    }
}

/// How often [`PgStore::keep_floors`] runs.
const FLOORS_EVERY: Duration = Duration::from_secs(60);
/// Keys of finished work whose rows one transaction deletes, and batches per run (a
/// route of one key per entry makes a row per entry).
const FLOORS_BATCH: i64 = 500;
const FLOORS_BATCHES: usize = 200;

/// A row (floor 0) for each key with unresolved entries and none, and a floor above
/// a key's oldest unresolved entry lowered to it. The unresolved entries a status at a
/// time, each through its partial index (as `sql/counts.sql`).
const FLOORS_MEND_SQL: &str = "\
WITH m AS (
    SELECT route, correlation_key, min(id) AS oldest FROM (
        SELECT route, correlation_key, id FROM inbox_entry WHERE status = 'OPEN' AND correlation_key IS NOT NULL
        UNION ALL
        SELECT route, correlation_key, id FROM inbox_entry WHERE status = 'IN_PROGRESS' AND correlation_key IS NOT NULL
        UNION ALL
        SELECT route, correlation_key, id FROM inbox_entry WHERE status = 'PARKED' AND correlation_key IS NOT NULL
    ) u
    GROUP BY route, correlation_key
), lowered AS (
    UPDATE inbox_key_floor f SET floor = m.oldest FROM m
    WHERE f.route = m.route AND f.correlation_key = m.correlation_key AND f.floor > m.oldest
    RETURNING 1
), added AS (
    INSERT INTO inbox_key_floor (route, correlation_key, floor)
    SELECT route, correlation_key, 0 FROM m ORDER BY route, correlation_key
    ON CONFLICT (route, correlation_key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM lowered), (SELECT count(*) FROM added)";

/// Of the key row `f`: nothing of its key unresolved from its floor up (waiting or
/// parked, through `inbox_entry_unresolved_key`; in flight, through
/// `inbox_entry_key_in_progress`).
macro_rules! key_idle {
    () => {
        concat!(
            "NOT EXISTS (\n",
            "        SELECT 1 FROM inbox_entry o WHERE o.route = f.route AND o.correlation_key = f.correlation_key\n",
            "          AND o.id >= f.floor AND o.status IN ('OPEN', 'PARKED'))\n",
            "      AND NOT EXISTS (\n",
            "        SELECT 1 FROM inbox_entry o WHERE o.route = f.route AND o.correlation_key = f.correlation_key\n",
            "          AND o.id >= f.floor AND o.status = 'IN_PROGRESS')"
        )
    };
}

/// Step one of deleting the rows of finished keys: up to `$1` keys with nothing
/// unresolved from their floor up, each try-locked exclusively (never waiting); the
/// keys held.
const FLOORS_IDLE_SQL: &str = concat!(
    "WITH idle AS MATERIALIZED (\n",
    "    SELECT f.route, f.correlation_key FROM inbox_key_floor f\n",
    "    WHERE ",
    key_idle!(),
    "\n    LIMIT $1\n",
    ")\n",
    "SELECT i.route, i.correlation_key FROM idle i\n",
    "WHERE pg_try_advisory_xact_lock(hashtextextended(i.route || ':' || i.correlation_key, 0))"
);

/// Step two, in a snapshot taken after the locks: the rows of the held keys (`$1`
/// routes, `$2` keys) that still have nothing unresolved.
const FLOORS_DELETE_SQL: &str = concat!(
    "DELETE FROM inbox_key_floor f USING unnest($1::text[], $2::text[]) AS h(route, correlation_key)\n",
    "WHERE f.route = h.route AND f.correlation_key = h.correlation_key AND ",
    key_idle!()
);

impl PgStore {
    /// [`super::Store::gauge_lease`]: keeps the lock while its connection answers;
    /// otherwise tries to take it, never waiting. A failing connection is dropped
    /// (and with it the lock, for another instance to take).
    async fn hold_gauge_lease(&self) -> Result<bool, StoreError> {
        let mut lease = self.gauge_lease.lock().await;
        let (mut conn, held) = match lease.take() {
            Some(kept) => kept,
            None => (self.pool.acquire().await?.detach(), false),
        };
        let answer = if held {
            sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&mut conn).await.map(|_| true)
        } else {
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(GAUGE_LOCK).fetch_one(&mut conn).await
        };
        let held = answer?;
        *lease = Some((conn, held));
        Ok(held)
    }

    /// Records what a claim of `route` learned: how many keys a walk of its heads (or
    /// a count) met, how many entries wait (counted up to the window), either or both.
    fn remember(&self, route: &str, keys: Option<i64>, waiting: Option<i64>) {
        let now = std::time::Instant::now();
        let mut all = self.seen.lock().expect("route-seen lock");
        if !all.contains_key(route) {
            all.insert(route.to_string(), RouteSeen::default());
        }
        let seen = all.get_mut(route).expect("inserted above");
        if let Some(keys) = keys {
            seen.keys = Some((keys, now));
        }
        if let Some(waiting) = waiting {
            seen.waiting = Some((waiting, now));
        }
    }

    /// Records that a walk of `route`'s heads met `walked` keys.
    fn remember_keys(&self, route: &str, walked: i64) {
        self.remember(route, Some(walked), None);
    }

    /// What the claims of `route` last learned of it.
    fn seen(&self, route: &str) -> RouteSeen {
        self.seen.lock().expect("route-seen lock").get(route).copied().unwrap_or_default()
    }

    /// How many keys the last walk (or count) of `route`'s heads met.
    fn keys_counted(&self, route: &str) -> Option<i64> {
        self.seen(route).keys.map(|(n, _)| n)
    }

    /// Whether `route`'s keys were last counted longer than [`KEYS_RECOUNT`] ago, or
    /// never.
    fn keys_stale(&self, route: &str) -> bool {
        self.seen(route).keys.is_none_or(|(_, at)| at.elapsed() >= KEYS_RECOUNT)
    }

    /// Whether a claim of `route` from its window counts its keys: at every claim while
    /// they are few ([`HEADS_FIRST_KEYS`]), as a walk of the heads did (whether a key's
    /// settles hand on without a bound depends on it: one key that becomes two must
    /// not wait ten seconds to be seen), else when stale.
    fn keys_due(&self, route: &str) -> bool {
        self.keys_stale(route) || self.keys_counted(route).is_some_and(|keys| keys <= HEADS_FIRST_KEYS)
    }

    /// Whether `route`'s waiting entries were last counted longer than
    /// [`WAITING_RECOUNT`] ago, or never.
    fn waiting_stale(&self, route: &str) -> bool {
        self.seen(route).waiting.is_none_or(|(_, at)| at.elapsed() >= WAITING_RECOUNT)
    }

    /// Whether `route`'s claims start from its heads: its last walk met few keys
    /// ([`HEADS_FIRST_KEYS`]), and many more entries wait than it has keys
    /// ([`HEADS_FIRST_WAITING_PER_KEY`]; or how many wait is not known yet).
    fn heads_first(&self, route: &str) -> bool {
        let seen = self.seen(route);
        seen.keys.is_some_and(|(keys, _)| {
            keys <= HEADS_FIRST_KEYS && seen.waiting.is_none_or(|(w, _)| w > keys * HEADS_FIRST_WAITING_PER_KEY)
        })
    }

    /// An ordered claim as one call that commits alone ([`CLAIM_FUNCTION_SQL`]): the
    /// rows of the entries claimed, or `None` where the server refuses the function
    /// (the role lacks `TEMP` on the database), and then the transaction serves. The
    /// function is made in a pool connection's session at its first claim (the call
    /// finds none: no temporary schema yet, or none in it) and stays there as long as
    /// the connection; the pool's other users never call it and their statements do
    /// not see it.
    async fn claim_alone(
        &self,
        req: &super::ClaimRequest<'_>,
        heads_first: bool,
        part: Option<i64>,
        parts: Option<i64>,
    ) -> Result<Option<Vec<PgRow>>, StoreError> {
        use sqlx::Row as _;
        use std::sync::atomic::Ordering::Relaxed;
        if self.no_session_functions.load(Relaxed) {
            return Ok(None);
        }
        let mut conn = self.pool.acquire().await?;
        let mut made = false;
        let rows = loop {
            let call = claim_binds!(sqlx::query(CLAIM_ALONE_SQL), req)
                .bind(req.owner)
                .bind(req.lease_ms)
                .bind(claim_window(req.limit))
                .bind(part)
                .bind(parts)
                .bind(heads_first)
                .bind(self.keys_due(req.route))
                .bind(self.waiting_stale(req.route));
            match call.fetch_all(&mut *conn).await {
                Ok(rows) => break rows,
                // Not made in this session yet: `pg_temp` names no schema until the
                // session's first temporary object, then no such function in it.
                Err(sqlx::Error::Database(e))
                    if !made && matches!(e.code().as_deref(), Some(UNDEFINED_SCHEMA | UNDEFINED_FUNCTION)) => {}
                Err(e) => return Err(e.into()),
            }
            made = true;
            // Once per connection: not kept among its prepared statements.
            match sqlx::query(&CLAIM_FUNCTION_SQL).persistent(false).execute(&mut *conn).await {
                Ok(_) => {}
                Err(sqlx::Error::Database(error)) => {
                    self.refused_session_function(&*error);
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        };
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let keys: Option<i64> = row.try_get("keys_met")?;
            let waiting: Option<i64> = row.try_get("waiting_met")?;
            if keys.is_some() || waiting.is_some() {
                self.remember(req.route, keys, waiting);
            } else {
                claimed.push(row);
            }
        }
        Ok(Some(claimed))
    }

    /// The server refused to make a function in a session's temporary schema: from
    /// now on settle batches and claims keep their transactions.
    fn refused_session_function(&self, error: &dyn sqlx::error::DatabaseError) {
        self.no_session_functions.store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(
            %error,
            "cannot create a function in the session's temporary schema (does the role lack TEMP on the database?); settle batches and claims keep their transactions"
        );
    }

    async fn claim_rows(&self, req: &super::ClaimRequest<'_>) -> Result<Vec<PgRow>, StoreError> {
        if !req.ordered {
            let claim = claim_binds!(sqlx::query(CLAIM_SQL), req).bind(req.owner).bind(req.lease_ms);
            return Ok(claim.fetch_all(&self.pool).await?);
        }
        let heads_first = self.heads_first(req.route);
        // Alone, an instance's part is every key: no hash to compute.
        let (part, parts) = match req.share {
            Some(s) if s.count > 1 => (Some(i64::from(s.index)), Some(i64::from(s.count))),
            _ => (None, None),
        };
        if let Some(rows) = self.claim_alone(req, heads_first, part, parts).await? {
            return Ok(rows);
        }
        let mut tx = self.pool.begin_with(CLAIM_BEGIN_SQL).await?;
        // A claim's commit need not wait for its WAL to reach the disk: a claim lost
        // in a server crash leaves its entries OPEN under their old lease token, so the
        // attempt's settle is refused (lease lost) and the entry is delivered again —
        // at least once, as after any crash, and never ahead of an older entry of its
        // key. Settles and inserts keep waiting for the disk.
        // And its statements run on generic plans, as a batch of settles' do
        // ([`PgStore::begin_hot`]). Both are set by the `BEGIN` (`CLAIM_BEGIN_SQL`).
        let mut candidates: Vec<(i64, Option<String>)> = if heads_first {
            Vec::new()
        } else {
            claim_binds!(sqlx::query_as(CLAIM_KEYS_SQL), req)
                .bind(claim_window(req.limit))
                .bind(part)
                .bind(parts)
                .fetch_all(&mut *tx)
                .await?
        };
        let short = i64::from(req.limit) - candidates.len() as i64;
        // A head can lie beyond the window only where as many entries wait as the
        // window reads: how many wait is read where the window came up short, and now
        // and then on a route claimed heads first (it decides whether they stay so).
        let window = claim_window(req.limit);
        let waiting = if (!heads_first && short > 0) || (heads_first && self.waiting_stale(req.route)) {
            let (n, _last): (i64, Option<i64>) =
                sqlx::query_as(WAITING_SQL).bind(req.route).bind(window).fetch_one(&mut *tx).await?;
            self.remember(req.route, None, Some(n));
            Some(n)
        } else {
            None
        };
        let beyond = heads_first || waiting.is_none_or(|n| n >= window);
        // A route whose claims do not walk its heads (its window fills them, or holds
        // every waiting entry) has its keys counted now and then instead: how many there
        // are decides how long its settles hand on (`Store::keys_met`), and whether its
        // claims start from the heads.
        if !heads_first && (short <= 0 || !beyond) && self.keys_due(req.route) {
            let keys: i64 =
                sqlx::query_scalar(KEYS_COUNT_SQL).bind(req.route).bind(part).bind(parts).fetch_one(&mut *tx).await?;
            self.remember_keys(req.route, keys);
        }
        if short > 0 && beyond {
            let taken: Vec<&str> = candidates.iter().filter_map(|(_, k)| k.as_deref()).collect();
            let heads: Vec<(Option<i64>, Option<String>, i64)> = sqlx::query_as(CLAIM_HEADS_SQL)
                .bind(req.route)
                .bind(req.now)
                .bind(req.parked_blocks)
                .bind(short)
                .bind(&taken)
                .bind(part)
                .bind(parts)
                .fetch_all(&mut *tx)
                .await?;
            self.remember_keys(req.route, heads.first().map_or(0, |h| h.2));
            candidates.extend(heads.into_iter().filter_map(|(id, key, _)| Some((id?, key))));
        }
        let short = i64::from(req.limit) - candidates.len() as i64;
        if heads_first && short > 0 {
            let unkeyed: Vec<(i64, Option<String>)> =
                sqlx::query_as(CLAIM_UNKEYED_SQL).bind(req.route).bind(req.now).bind(short).fetch_all(&mut *tx).await?;
            candidates.extend(unkeyed);
        }
        if candidates.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let (ids, keys): (Vec<i64>, Vec<Option<String>>) = candidates.into_iter().unzip();
        let held: Vec<String> = keys.into_iter().flatten().collect();
        let claim =
            claim_binds!(sqlx::query(CLAIM_HELD_SQL), req).bind(req.owner).bind(req.lease_ms).bind(&ids).bind(&held);
        let rows = claim.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(rows)
    }
}

/// `$2` relays route `$1` (as of the database's clock) and forgets members silent for an
/// hour; its part of the route's keys among the members heard from within `$3` seconds,
/// in the order of their names: `(index, count)`. (The statement does not see its own
/// upsert in the table, so `me` adds it.)
const MEMBER_HERE_SQL: &str = "\
WITH me AS (
    INSERT INTO inbox_route_member (route, owner, seen_at) VALUES ($1, $2, clock_timestamp())
    ON CONFLICT (route, owner) DO UPDATE SET seen_at = excluded.seen_at
    RETURNING owner
), gone AS (
    DELETE FROM inbox_route_member
    WHERE route = $1 AND owner <> $2 AND seen_at < clock_timestamp() - interval '1 hour'
), live AS (
    SELECT owner FROM inbox_route_member
    WHERE route = $1 AND owner <> $2 AND seen_at >= clock_timestamp() - make_interval(secs => $3)
    UNION ALL SELECT owner FROM me
)
SELECT count(*) FILTER (WHERE owner < $2), count(*) FROM live";

/// `$2` stops relaying route `$1`.
const MEMBER_LEAVING_SQL: &str = "DELETE FROM inbox_route_member WHERE route = $1 AND owner = $2";

impl PgStore {
    async fn share_among_members(
        &self,
        route: &str,
        owner: &str,
        presence: super::Presence,
    ) -> Result<Option<super::Share>, StoreError> {
        let ttl = match presence {
            super::Presence::Here { ttl } => ttl,
            super::Presence::Leaving => {
                sqlx::query(MEMBER_LEAVING_SQL).bind(route).bind(owner).execute(&self.pool).await?;
                return Ok(None);
            }
        };
        let (index, count): (i64, i64) = sqlx::query_as(MEMBER_HERE_SQL)
            .bind(route)
            .bind(owner)
            .bind(ttl.as_secs_f64())
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(super::Share { index: index as u32, count: count as u32 }))
    }
}

/// The channel instances announce new work on; the payload is the route's name.
const WAKE_CHANNEL: &str = "inlet_wake";

impl PgStore {
    async fn announce_to_others(&self, routes: &[String]) -> Result<(), StoreError> {
        // One statement for all: NOTIFY per route, each delivered at commit.
        sqlx::query("SELECT pg_notify($1, route) FROM unnest($2::text[]) AS route")
            .bind(WAKE_CHANNEL)
            .bind(routes)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn listen_to_others(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<String>> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // A pool of one of its own, so the listener does not hold one of the store's.
        let options = (*self.pool.connect_options()).clone();
        let pool =
            PgPoolOptions::new().max_connections(1).acquire_timeout(Duration::from_secs(3)).connect_lazy_with(options);
        tokio::spawn(listen(pool, tx));
        Some(rx)
    }
}

/// Forwards announcements to `tx` until its receiver is gone; reconnects after a
/// lost connection, waiting longer each time the server cannot be reached.
async fn listen(pool: PgPool, tx: tokio::sync::mpsc::UnboundedSender<String>) {
    let mut wait = Duration::from_millis(500);
    loop {
        let result = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(WAKE_CHANNEL).await?;
            wait = Duration::from_millis(500);
            loop {
                // `None`: the connection was lost (and is made again on the next call).
                if let Some(n) = listener.try_recv().await? {
                    if tx.send(n.payload().to_string()).is_err() {
                        return Ok::<bool, sqlx::Error>(true);
                    }
                } else if tx.is_closed() {
                    return Ok(true);
                }
            }
        }
        .await;
        match result {
            Ok(_) => return,
            Err(error) => {
                tracing::debug!(%error, "cannot listen for other instances' announcements; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
                if tx.is_closed() {
                    return;
                }
            }
        }
    }
}

store_impl! {
    store: PgStore,
    backend: "postgres",
    pool: PgPool,
    conn: PgConnection,
    row: PgRow,
    insert_sql: INSERT_SQL,
    insert_or_existing_sql: Some(INSERT_OR_EXISTING_SQL),
    now_sql: "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT",
    // Resolved through the search path, as every other statement's tables are.
    schema_columns_sql: "SELECT attname::text FROM pg_attribute \
        WHERE attrelid = to_regclass('inlet_schema') AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
    rekey_sql: Some((REKEY_LOCK_SQL, REKEY_FLOOR_SQL)),
}
