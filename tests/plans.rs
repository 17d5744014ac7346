//! The PostgreSQL store's statements keep to access paths whose cost grows with the
//! entries they are about, not with the finished entries the table keeps, whatever
//! the statistics say:
//! - those that change one entry by its id reach it by its id (the primary key). A
//!   table whose finished entries outnumber the rest a thousand to one is analyzed
//!   from a sample that can meet none of the few OPEN, IN_PROGRESS or PARKED rows; the
//!   planner then took the partial index of that status for nearly empty and read all
//!   of it, dead entries included, for every settle (seen in the sustained benchmark:
//!   settle batches of 0.2 to 0.5 s while inserts of their keys waited);
//! - the housekeeping's reads of every unresolved entry (gauges, key floors) go
//!   through the partial indexes of their statuses; written over several statuses at
//!   once they read the whole table (0.6 to 0.9 s each at 2 million entries);
//! - those run for every message of some kind are planned once per connection, not at
//!   every call: written with optional filters (`$1 IS NULL OR …`) PostgreSQL never
//!   settles on a generic plan, and planning the replay windows' list took 63 µs of
//!   PostgreSQL's 160 µs of CPU per duplicate pushed.

use inlet::inbox;
use inlet_testkit::pg::TestPg;
use sqlx::Connection;

/// When the statistics of [`table`]'s `inbox_entry` were taken.
#[derive(Clone, Copy, PartialEq)]
enum Statistics {
    /// Before the unresolved entries were written: they know only finished entries.
    BeforeTheUnresolved,
    /// After: they know the table as it is.
    AfterThem,
    /// Never, as on a fresh inbox (autovacuum is kept off the table so that none are
    /// taken while the test plans).
    Never,
}

/// Finished entries in the table, `history` of them, of which the last 1,000 are made
/// IN_PROGRESS and two more thousands OPEN and PARKED (where there are that many);
/// statistics taken as `statistics` says.
async fn table(url: &str, history: i64, statistics: Statistics) -> sqlx::PgConnection {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let unresolved = "UPDATE inbox_entry SET status = 'IN_PROGRESS', lease_owner = 'o', lease_expires_at = 1,
             finished_at = NULL WHERE id > $H - 1000;
         UPDATE inbox_entry SET status = 'OPEN', finished_at = NULL WHERE id BETWEEN $H - 3000 AND $H - 2001;
         UPDATE inbox_entry SET status = 'PARKED', finished_at = NULL WHERE id BETWEEN $H - 5000 AND $H - 4001;";
    let (first, second) = match statistics {
        Statistics::BeforeTheUnresolved => ("ANALYZE inbox_entry;", unresolved),
        Statistics::AfterThem => (unresolved, "VACUUM ANALYZE inbox_entry;"),
        Statistics::Never => (unresolved, "SELECT 1"),
    };
    if statistics == Statistics::Never {
        sqlx::raw_sql("ALTER TABLE inbox_entry SET (autovacuum_enabled = off)").execute(&mut conn).await.unwrap();
    }
    let history_rows = "INSERT INTO inbox_entry (route, dedup_key, correlation_key, raw_data, attributes,
             message_id, payload_digest, status, next_attempt_at, received_at, updated_at, finished_at)
         SELECT 'r', 'd-' || g, 'k-' || (g % 100), '\\x00', '[]', 'm-' || g, 'x', 'DONE', 0, g, g, g
         FROM generate_series(1, $H) g";
    // One at a time: a script of several runs as one transaction, and VACUUM runs
    // outside any.
    for script in [history_rows, first, second] {
        let script = script.replace("$H", &history.to_string());
        sqlx::raw_sql(&script).execute(&mut conn).await.unwrap();
    }
    conn
}

/// A value of PostgreSQL type `ty` to plan with: an id of an IN_PROGRESS entry (of
/// 50,000) for the ids, so a custom plan is made for a row that is there; with NULLs a
/// custom plan folds `id = NULL` to nothing to read.
fn value_of(ty: &str) -> &'static str {
    match ty {
        "bigint" => "49500",
        "integer" => "1",
        "boolean" => "true",
        "text" => "'r'",
        "bytea" => "'\\x00'",
        "bigint[]" => "'{49500}'",
        "integer[]" => "'{1}'",
        "boolean[]" => "'{false}'",
        "text[]" => "'{r}'",
        "bytea[]" => "'{\"\\\\x00\"}'",
        other => panic!("no value to plan with for a parameter of type {other}"),
    }
}

/// `sql` prepared on `conn` as `statement` under `mode` (`plan_cache_mode`, or
/// `DEFAULT`); what runs it: `EXECUTE statement(values)`, a value per parameter.
async fn prepare(conn: &mut sqlx::PgConnection, statement: &str, sql: &str, mode: &str) -> String {
    sqlx::raw_sql(&format!("SET plan_cache_mode = {mode}; PREPARE {statement} AS {sql}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let types: Vec<String> =
        sqlx::query_scalar("SELECT unnest(parameter_types)::regtype::text FROM pg_prepared_statements WHERE name = $1")
            .bind(statement)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let values = types.iter().map(|t| value_of(t)).collect::<Vec<_>>().join(", ");
    if values.is_empty() { format!("EXECUTE {statement}") } else { format!("EXECUTE {statement}({values})") }
}

/// `sql`'s plan on `conn` under `mode` (`plan_cache_mode`), as PostgreSQL prints it.
async fn plan(conn: &mut sqlx::PgConnection, name: &str, sql: &str, mode: &str) -> Vec<String> {
    let execute = prepare(conn, &format!("s_{mode}_{}", name.replace(' ', "_")), sql, mode).await;
    sqlx::query_scalar(&format!("EXPLAIN {execute}")).fetch_all(&mut *conn).await.unwrap()
}

/// The lines of `plan` that read `inbox_entry` itself (its heap, by a scan of any kind).
fn entry_reads(plan: &[String]) -> Vec<&String> {
    plan.iter()
        .filter(|l| l.contains("Scan") && (l.contains(" on inbox_entry ") || l.ends_with(" on inbox_entry")))
        .collect()
}

/// Plans each of `statements` on a fresh inbox whose table is made by [`table`]
/// (`history` finished entries, statistics as `statistics` says), under generic plans
/// (the hot path's, `begin_hot`) and custom ones (the rest's, at first), and holds
/// every read of `inbox_entry` in each to `keeps` (`fault`: what a read that does not
/// keep to it does).
async fn every_plan(
    statements: &[(&str, &str)],
    history: i64,
    statistics: Statistics,
    keeps: fn(&str) -> bool,
    fault: &str,
) {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 1).await.unwrap();
    let mut conn = table(&pg.url, history, statistics).await;
    for mode in ["force_generic_plan", "force_custom_plan"] {
        for (name, sql) in statements {
            let plan = plan(&mut conn, name, sql, mode).await;
            let reads = entry_reads(&plan);
            assert!(
                !reads.is_empty() && reads.iter().all(|l| keeps(l)),
                "{name} ({mode}) {fault}:\n{}",
                plan.join("\n")
            );
        }
    }
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_that_change_one_entry_reach_it_by_its_id_on_statistics_that_miss_its_status() {
    let by_id = |read: &str| read.contains("Index Scan using inbox_entry_pkey");
    let fault = "reads inbox_entry other than by its id";
    every_plan(inbox::postgres::BY_ID_STATEMENTS, 50_000, Statistics::BeforeTheUnresolved, by_id, fault).await;
}

/// A fresh inbox has no statistics, and PostgreSQL takes a table never analyzed for
/// ten pages whatever it holds: small enough that reading all of it looks cheaper than
/// an index. The hot path plans a statement once per connection (generic plans), so a
/// plan made in an inbox's first seconds is the plan for as long as the connection
/// lives; the hot path's settings (`HOT_SESSION_SQL`, which its transactions set
/// locally) keep it on the primary key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_fresh_inbox_the_hot_paths_statements_that_change_one_entry_reach_it_by_its_id() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 1).await.unwrap();
    let mut conn = table(&pg.url, 200, Statistics::Never).await;
    let (reltuples, rows): (f32, i64) = sqlx::query_as(
        "SELECT c.reltuples, (SELECT count(*) FROM inbox_entry) FROM pg_class c WHERE c.oid = 'inbox_entry'::regclass",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(
        reltuples < 0.0 && rows == 200,
        "not the fresh inbox this test is about: reltuples {reltuples}, {rows} rows"
    );
    sqlx::raw_sql(inbox::postgres::HOT_SESSION_SQL).execute(&mut conn).await.unwrap();
    for (name, sql) in inbox::postgres::BY_ID_STATEMENTS {
        let plan = plan(&mut conn, name, sql, "force_generic_plan").await;
        let reads = entry_reads(&plan);
        assert!(
            !reads.is_empty() && reads.iter().all(|l| l.contains("Index Scan using inbox_entry_pkey")),
            "{name}, under the hot path's settings on a fresh inbox, reads inbox_entry other than by its id:\n{}",
            plan.join("\n")
        );
    }
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_housekeepings_reads_of_unresolved_entries_skip_the_finished_ones() {
    let not_all = |read: &str| !read.contains("Seq Scan");
    let fault = "reads all of inbox_entry";
    every_plan(inbox::postgres::UNRESOLVED_READS, 200_000, Statistics::AfterThem, not_all, fault).await;
}

/// How many generic and custom plans PostgreSQL made for `sql`, prepared on `conn` under
/// the default `plan_cache_mode` and run `runs` times.
async fn plans_made(conn: &mut sqlx::PgConnection, name: &str, sql: &str, runs: usize) -> (i64, i64) {
    let statement = format!("s_auto_{}", name.replace(' ', "_"));
    let execute = prepare(conn, &statement, sql, "DEFAULT").await;
    for _ in 0..runs {
        sqlx::raw_sql(&execute).execute(&mut *conn).await.unwrap();
    }
    sqlx::query_as("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1")
        .bind(&statement)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_run_for_every_message_are_planned_once_not_at_every_call() {
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 1).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&pg.url).await.unwrap();
    assert!(!inbox::postgres::PER_MESSAGE_STATEMENTS.is_empty());
    for (name, sql) in inbox::postgres::PER_MESSAGE_STATEMENTS {
        // PostgreSQL makes five custom plans before it weighs the generic one.
        let (generic, custom) = plans_made(&mut conn, name, sql, 20).await;
        assert!(
            custom <= 5 && generic >= 15,
            "{name}: {custom} custom plans and {generic} generic ones in 20 runs (planned at every call)"
        );
    }
    drop(store);
}
