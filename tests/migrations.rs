//! The inbox schema as an explicit step, through the real binary on both stores:
//! `inlet migrate` upgrades from every earlier version with entries in every state to
//! exactly a fresh install's schema; a busy inbox of the previous version (parked heads
//! blocking keys, a live lease, a not-yet deadline) is migrated and drained in key
//! order, nothing lost or twice; a newer schema is refused by `inlet run` in every
//! mode and by the other commands; commands that only use the inbox never migrate and
//! never create it; a PostgreSQL migration blocked by a held lock fails within its
//! lock timeout; a PostgreSQL migration outside a transaction builds its index while
//! writers insert, and one whose build fails within the lock timeout is completed by
//! running again; a second `inlet run` on one SQLite file is refused while the first
//! runs on.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection as _;

use inlet::clock::Millis;
use inlet::inbox::postgres::PgStore;
use inlet::inbox::schema::{self, MigrateMode, Migration};
use inlet::inbox::{self, ClaimRequest, ListFilter, Settlement, Status, Store};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::{TestPg, TestRole};
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_work_order;
use inlet_testkit::wait::{poll_blocking, wait_until};

/// One inbox to migrate: a SQLite file in a folder of its own (which also holds the
/// routing file), or a fresh PostgreSQL database.
struct Db {
    url: String,
    dir: tempfile::TempDir,
    pg: Option<TestPg>,
}

/// A value bound to a statement of [`Db::exec`].
#[derive(Clone, Copy)]
enum V<'a> {
    Text(Option<&'a str>),
    Int(Option<i64>),
    Bytes(&'a [u8]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Db {
    async fn new(backend: Backend) -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        match backend {
            Backend::Sqlite => Db { url: format!("sqlite://{}", dir.path().join("inbox.db").display()), dir, pg: None },
            Backend::Postgres => {
                let pg = TestPg::new().await;
                Db { url: pg.url.clone(), dir, pg: Some(pg) }
            }
        }
    }

    fn backend(&self) -> Backend {
        if self.pg.is_some() { Backend::Postgres } else { Backend::Sqlite }
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("inbox.db")
    }

    /// A routing file with this inbox and one push route (`wo`, work-order plugin, log
    /// target), listening on `port`.
    fn config(&self, port: u16) -> PathBuf {
        write_config(self.dir.path(), &self.url, port)
    }

    fn latest(&self) -> i64 {
        schema::known(&self.url).expect("a store url").last().expect("migrations").version
    }

    /// Runs `sql` with `binds` on a connection of its own.
    async fn exec(&self, sql: &str, binds: &[V<'_>]) {
        macro_rules! run {
            ($conn:expr) => {{
                let mut conn = $conn;
                let mut q = sqlx::query(sql);
                for b in binds {
                    q = match *b {
                        V::Text(t) => q.bind(t),
                        V::Int(i) => q.bind(i),
                        V::Bytes(b) => q.bind(b),
                    };
                }
                q.execute(&mut conn).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
                conn.close().await.unwrap();
            }};
        }
        match self.backend() {
            Backend::Sqlite => run!(sqlx::SqliteConnection::connect(&self.url).await.unwrap()),
            Backend::Postgres => run!(sqlx::PgConnection::connect(&self.url).await.unwrap()),
        }
    }

    /// Every table's name, each column, index and constraint as the database describes
    /// them (SQLite: `sqlite_master`, whitespace normalised; PostgreSQL:
    /// `information_schema.columns`, `pg_indexes`, constraints and statistics targets),
    /// one line each, sorted.
    async fn schema(&self) -> Vec<String> {
        let normal = |s: String| s.split_whitespace().collect::<Vec<_>>().join(" ");
        match self.backend() {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                let rows: Vec<(String, String, String, Option<String>)> =
                    sqlx::query_as("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                conn.close().await.unwrap();
                rows.into_iter()
                    .map(|(t, n, tbl, sql)| format!("{t} {n} on {tbl}: {}", normal(sql.unwrap_or_default())))
                    .collect()
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                let queries = [
                    "SELECT format('column %s.%s #%s %s null=%s default=%s identity=%s', table_name, column_name, \
                     ordinal_position, data_type, is_nullable, column_default, is_identity) \
                     FROM information_schema.columns WHERE table_schema = 'public'",
                    "SELECT format('index %s on %s: %s', indexname, tablename, indexdef) FROM pg_indexes \
                     WHERE schemaname = 'public'",
                    "SELECT format('constraint %s on %s: %s', conname, conrelid::regclass, pg_get_constraintdef(oid)) \
                     FROM pg_constraint WHERE connamespace = 'public'::regnamespace",
                    "SELECT format('statistics %s.%s: %s', c.relname, a.attname, a.attstattarget) FROM pg_attribute a \
                     JOIN pg_class c ON c.oid = a.attrelid WHERE c.relnamespace = 'public'::regnamespace \
                     AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped",
                    "SELECT format('table %s options %s', relname, reloptions) FROM pg_class \
                     WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'",
                ];
                let mut lines = Vec::new();
                for q in queries {
                    let found: Vec<String> = sqlx::query_scalar(q).fetch_all(&mut conn).await.unwrap();
                    lines.extend(found.into_iter().map(normal));
                }
                conn.close().await.unwrap();
                lines.sort();
                lines
            }
        }
    }

    /// The schema and every row of every table, as text: what "changed nothing" is
    /// checked against (and, on SQLite, the file's bytes).
    async fn snapshot(&self) -> (Vec<String>, Vec<String>, Option<Vec<u8>>) {
        let mut rows = Vec::new();
        match self.backend() {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                let tables: Vec<String> =
                    sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                for t in tables {
                    let dump: Vec<String> = sqlx::query_scalar(&format!(
                        "SELECT quote(json_array(*)) FROM (SELECT * FROM \"{t}\") ORDER BY 1"
                    ))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
                    let count: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{t}\""))
                        .fetch_one(&mut conn)
                        .await
                        .unwrap();
                    rows.push(format!("{t}: {count} rows {}", inbox::digest_hex(dump.join("\n").as_bytes())));
                }
                conn.close().await.unwrap();
                let bytes = std::fs::read(self.file()).expect("read the inbox file");
                (self.schema().await, rows, Some(bytes))
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                let tables: Vec<String> = sqlx::query_scalar(
                    "SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' \
                     ORDER BY 1",
                )
                .fetch_all(&mut conn)
                .await
                .unwrap();
                for t in tables {
                    let dump: Vec<String> =
                        sqlx::query_scalar(&format!("SELECT row_to_json(t)::text FROM \"{t}\" t ORDER BY 1"))
                            .fetch_all(&mut conn)
                            .await
                            .unwrap();
                    rows.push(format!("{t}: {} rows {}", dump.len(), inbox::digest_hex(dump.join("\n").as_bytes())));
                }
                conn.close().await.unwrap();
                (self.schema().await, rows, None)
            }
        }
    }
}

/// `DIR/inlet.toml`: the inbox at `url` and one push route (`wo`, work-order plugin,
/// log target), listening on `port`.
fn write_config(dir: &Path, url: &str, port: u16) -> PathBuf {
    let path = dir.join("inlet.toml");
    let text = format!(
        "[store]\nurl = \"{url}\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n\n[[route]]\nname = \"wo\"\n\
         plugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        plugin_path("work_order").display()
    );
    std::fs::write(&path, text).expect("write the routing file");
    path
}

/// `inlet ARGS`, waited for at most a minute (an `inlet run` that should have been
/// refused would run on: it is killed, and the test fails).
fn inlet(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inlet"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("INLET_CONFIG")
        .env_remove("INLET_MIGRATE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run inlet");
    let exited = poll_blocking(Duration::from_secs(60), || child.try_wait().expect("wait for inlet"));
    if exited.is_none() {
        let _ = child.kill();
        let out = child.wait_with_output().expect("inlet output");
        panic!("inlet {args:?} still running after 60 s (killed)\nstderr: {}", text(&out.stderr));
    }
    child.wait_with_output().expect("inlet output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn succeeds(args: &[&str]) -> String {
    let out = inlet(args);
    assert!(out.status.success(), "inlet {args:?} failed:\n{}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// Runs a refused command: its stderr.
fn refused(args: &[&str]) -> String {
    let out = inlet(args);
    assert!(!out.status.success(), "inlet {args:?} was not refused:\n{}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stderr)
}

fn now() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// An entry in each state, inserted with the columns of schema version 1 only, so the
/// same statement is valid at every version: `(dedup key, status)`.
const ROWS: [(&str, &str); 5] = [
    ("k-open", "OPEN"),
    ("k-flight", "IN_PROGRESS"),
    ("k-done", "DONE"),
    ("k-parked", "PARKED"),
    ("k-ignored", "IGNORED"),
];

async fn insert_rows_of_every_state(db: &Db) {
    for (key, status) in ROWS {
        let (owner, expires, finished, error) = match status {
            // A lease that expired with its instance.
            "IN_PROGRESS" => (Some("gone-instance"), Some(1), None, None),
            "DONE" => (None, None, Some(2), None),
            "PARKED" => (None, None, None, Some("decode failed: not JSON")),
            "IGNORED" => (None, None, Some(2), Some("ignored by hand: sent twice")),
            _ => (None, None, None, None),
        };
        let raw = format!("{{\"id\":\"{key}\",\"seq\":1}}");
        db.exec(
            "INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, body, raw_data, attributes, \
             message_id, payload_digest, status, attempts, next_attempt_at, lease_owner, lease_token, \
             lease_expires_at, last_error, received_at, updated_at, finished_at) \
             VALUES ('wo', $1, $1, 'work-order', NULL, $2, '[]', $1, 'digest', $3, 0, 0, $4, 1, $5, $6, 1, 1, $7)",
            &[
                V::Text(Some(key)),
                V::Bytes(raw.as_bytes()),
                V::Text(Some(status)),
                V::Text(owner),
                V::Int(expires),
                V::Text(error),
                V::Int(finished),
            ],
        )
        .await;
    }
}

/// Every entry by dedup key, with its state.
async fn states(store: &dyn Store) -> Vec<(String, Status)> {
    let mut all: Vec<(String, Status)> = store
        .list(&ListFilter { limit: 100, ..Default::default() })
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.dedup_key, e.status))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

async fn upgrade_from_every_earlier_version(backend: Backend) {
    let fresh = Db::new(backend).await;
    succeeds(&["migrate", fresh.config(free_port()).to_str().unwrap()]);
    let fresh_schema = fresh.schema().await;
    for version in 1..fresh.latest() {
        let db = Db::new(backend).await;
        schema::create_as_of(&db.url, version).await.unwrap();
        insert_rows_of_every_state(&db).await;
        let config = db.config(free_port());
        let config = config.to_str().unwrap();

        let out = succeeds(&["migrate", config]);
        let expected = format!("the inbox schema is at version {} (was {version})", db.latest());
        assert!(out.contains(&expected), "from {version}: {out}");
        assert_eq!(
            db.schema().await,
            fresh_schema,
            "{backend:?}: the schema upgraded from {version} is a fresh install's"
        );

        // Current now: a command that never migrates opens it.
        let store = inbox::open_as(&db.url, 2, MigrateMode::Check, schema::DEFAULT_LOCK_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("from {version}: {e}"));
        let mut expected: Vec<(String, Status)> =
            ROWS.iter().map(|(k, s)| (k.to_string(), s.parse().expect("a status"))).collect();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(states(store.as_ref()).await, expected, "{backend:?} from {version}: every row is there");
        let parked = store.list(&ListFilter { status: Some(Status::Parked), limit: 10, ..Default::default() }).await;
        let parked = parked.unwrap().pop().unwrap();
        assert_eq!(parked.raw_data, br#"{"id":"k-parked","seq":1}"#);
        assert_eq!(parked.last_error.as_deref(), Some("decode failed: not JSON"));

        // Claim and settle work on the rows written before: the expired lease comes back,
        // the parked entry is requeued, and all three are delivered.
        let t = now();
        assert_eq!(store.release_expired("wo", t).await.unwrap(), 1, "from {version}");
        assert!(store.requeue(parked.id, t).await.unwrap(), "from {version}");
        let req = ClaimRequest {
            route: "wo",
            owner: "after-upgrade",
            limit: 10,
            now: t,
            lease_ms: 30_000,
            ordered: true,
            parked_blocks: false,
            share: None,
        };
        let claimed = store.claim(&req).await.unwrap();
        let mut keys: Vec<&str> = claimed.iter().map(|c| c.entry.dedup_key.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["k-flight", "k-open", "k-parked"], "{backend:?} from {version}");
        for c in &claimed {
            store.settle(c.entry.id, &c.lease, t + 1, &Settlement::Done).await.unwrap();
        }
        let done = states(store.as_ref()).await.into_iter().filter(|(_, s)| *s == Status::Done).count();
        assert_eq!(done, 4, "{backend:?} from {version}");

        let status = succeeds(&["schema", "status", "-c", config, "--json"]);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["version"], db.latest());
        assert_eq!(status["current"], true);
        let versions = status["versions"].as_array().unwrap();
        for v in versions {
            let n = v["version"].as_i64().unwrap();
            if n <= version {
                // Applied by an Inlet that did not record it.
                assert_eq!(
                    (v["applied_by"].is_null(), v["checksum_state"].as_str()),
                    (true, Some("not_recorded")),
                    "{v}"
                );
            } else {
                assert_eq!(v["applied_by"], schema::BINARY, "{v}");
                assert_eq!(v["checksum_state"], "matches", "{v}");
            }
        }
    }
}

/// Keys of the busy inbox: each with its entries' states by sequence number, in order.
/// `blocked`: a PARKED head (the route lets parked heads block their key) and three
/// waiting behind it; `held`: a head in flight under another instance's live lease;
/// `not-yet`: a head waiting out a not-yet deadline; `settled`: a DONE head; and twenty
/// keys of plain backlog.
fn busy_keys() -> Vec<(String, Vec<&'static str>)> {
    let mut keys = vec![
        ("blocked".to_string(), vec!["PARKED", "OPEN", "OPEN", "OPEN"]),
        ("held".to_string(), vec!["IN_PROGRESS", "OPEN", "OPEN"]),
        ("not-yet".to_string(), vec!["OPEN", "OPEN"]),
        ("settled".to_string(), vec!["DONE", "OPEN", "OPEN"]),
    ];
    keys.extend((0..20).map(|k| (format!("k{k:02}"), vec!["OPEN"; 10])));
    keys
}

/// A busy inbox written by the previous schema, as the binary before this one left it
/// — keys blocked by parked heads, a lease held by a live instance, a not-yet deadline
/// running, settled heads and a backlog — migrated to this binary's schema and then
/// drained by its claims: nothing lost, nothing delivered twice, every key in entry
/// order and never two of one key in flight; the blocked key waits for its repair, the
/// held one for its lease, the not-yet one for its deadline; the old lease is fenced.
async fn a_busy_inbox_of_the_previous_schema_is_migrated_and_drained_in_key_order(backend: Backend) {
    a_busy_inbox_is_migrated_and_drained_in_key_order(backend, 1).await;
}

/// The same from `back` versions before this binary's schema.
async fn a_busy_inbox_is_migrated_and_drained_in_key_order(backend: Backend, back: i64) {
    let db = Db::new(backend).await;
    let previous = db.latest() - back;
    schema::create_as_of(&db.url, previous).await.unwrap();
    let t0 = now();
    let keys = busy_keys();
    let longest = keys.iter().map(|(_, states)| states.len()).max().unwrap();
    // Inserted sequence by sequence across keys, so ids interleave as in a live inbox.
    for seq in 0..longest {
        for (key, states) in &keys {
            let Some(&status) = states.get(seq) else { continue };
            let dedup = format!("{key}-{seq}");
            let (owner, expires, finished, error, due, not_yet) = match (key.as_str(), status) {
                (_, "PARKED") => (None, None, None, Some("target refused: 422"), 0, None),
                (_, "IN_PROGRESS") => (Some("old-instance"), Some(t0 + 60_000), None, None, 0, None),
                (_, "DONE") => (None, None, Some(t0 - 1_000), None, 0, None),
                ("not-yet", _) if seq == 0 => {
                    (None, None, None, Some("not yet: no process waiting"), t0 + 30_000, Some(t0 - 10_000))
                }
                _ => (None, None, None, None, 0, None),
            };
            let body = format!("{{\"key\":\"{key}\",\"seq\":{seq}}}");
            db.exec(
                "INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, body, raw_data, attributes, \
                 message_id, payload_digest, status, attempts, next_attempt_at, lease_owner, lease_token, \
                 lease_expires_at, last_error, received_at, updated_at, finished_at, not_yet_since) \
                 VALUES ('wo', $1, $2, 'work-order', $3, $3, '[]', $1, 'digest', $4, 1, $5, $6, 1, $7, $8, $9, $9, $10, $11)",
                &[
                    V::Text(Some(&dedup)),
                    V::Text(Some(key)),
                    V::Bytes(body.as_bytes()),
                    V::Text(Some(status)),
                    V::Int(Some(due)),
                    V::Text(owner),
                    V::Int(expires),
                    V::Text(error),
                    V::Int(Some(t0 - 60_000)),
                    V::Int(finished),
                    V::Int(not_yet),
                ],
            )
            .await;
        }
    }
    let total: usize = keys.iter().map(|(_, states)| states.len()).sum();
    if backend == Backend::Postgres && previous >= 12 {
        // From schema 12 on, an insert adds its key's row to inbox_key_floor (floor 0).
        db.exec(
            "INSERT INTO inbox_key_floor (route, correlation_key) SELECT DISTINCT route, correlation_key \
             FROM inbox_entry WHERE status IN ('OPEN', 'IN_PROGRESS', 'PARKED') ON CONFLICT DO NOTHING",
            &[],
        )
        .await;
    }

    let config = db.config(free_port());
    let out = succeeds(&["migrate", config.to_str().unwrap()]);
    assert!(out.contains(&format!("(was {previous})")), "{out}");
    let store = inbox::open_as(&db.url, 4, MigrateMode::Check, schema::DEFAULT_LOCK_TIMEOUT).await.unwrap();
    let entries = store.list(&ListFilter { limit: 1000, ..Default::default() }).await.unwrap();
    assert_eq!(entries.len(), total, "{backend:?}: every entry is there after the migration");
    let old_lease = entries.iter().find(|e| e.dedup_key == "held-0").map(|e| (e.id, e.lease_token)).unwrap();
    if backend == Backend::Postgres && previous < 12 {
        // Schema 12 filled a floor for each key with unresolved entries: its oldest.
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let floors: Vec<(String, i64)> =
            sqlx::query_as("SELECT correlation_key, floor FROM inbox_key_floor ORDER BY 1")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        let mut expected: Vec<(String, i64)> = keys
            .iter()
            .filter_map(|(key, _)| {
                let oldest = entries
                    .iter()
                    .filter(|e| e.correlation_key.as_deref() == Some(key.as_str()) && e.status != Status::Done)
                    .map(|e| e.id)
                    .min()?;
                Some((key.clone(), oldest))
            })
            .collect();
        expected.sort();
        assert_eq!(floors, expected, "the key floors filled by the migration");
    }

    // The drain: claims as a relay makes them, the clock moving 5 s whenever nothing is
    // due; the parked head is repaired by hand once everything else it does not hold
    // back is delivered.
    let mut t = t0;
    let mut delivered: Vec<(String, i64, Millis)> = Vec::new();
    let mut settled = std::collections::HashSet::new();
    let mut repaired_at: Option<Millis> = None;
    // Every entry but the one finished before the migration.
    let deliverable = total - 1;
    for _ in 0..1_000 {
        store.release_expired("wo", t).await.unwrap();
        let req = ClaimRequest {
            route: "wo",
            owner: "new-instance",
            limit: 8,
            now: t,
            lease_ms: 30_000,
            ordered: true,
            parked_blocks: true,
            share: None,
        };
        let claimed = store.claim(&req).await.unwrap();
        let mut in_flight = std::collections::HashSet::new();
        for c in &claimed {
            let key = c.entry.correlation_key.clone().unwrap();
            assert!(in_flight.insert(key.clone()), "{backend:?}: two entries of {key} in flight at once");
            let seq: i64 = c.entry.dedup_key.rsplit('-').next().unwrap().parse().unwrap();
            assert!(settled.insert(c.entry.id), "{backend:?}: {} delivered twice", c.entry.dedup_key);
            delivered.push((key, seq, t));
        }
        for c in &claimed {
            store.settle(c.entry.id, &c.lease, t, &Settlement::Done).await.unwrap();
        }
        if !claimed.is_empty() {
            continue;
        }
        if settled.len() == deliverable {
            break;
        }
        if repaired_at.is_none() && settled.len() == deliverable - 4 {
            // Everything the parked head does not hold back is delivered: repair it.
            let parked = entries.iter().find(|e| e.dedup_key == "blocked-0").unwrap();
            assert!(store.requeue(parked.id, t).await.unwrap());
            repaired_at = Some(t);
            continue;
        }
        t += 5_000;
    }
    assert_eq!(settled.len(), deliverable, "{backend:?}: every entry not finished before delivered, once");
    let done = store.list(&ListFilter { status: Some(Status::Done), limit: 1000, ..Default::default() }).await.unwrap();
    assert_eq!(done.len(), total, "{backend:?}: nothing lost");
    for (key, states) in &keys {
        let seqs: Vec<i64> = delivered.iter().filter(|d| &d.0 == key).map(|d| d.1).collect();
        let expected: Vec<i64> = (0..states.len() as i64).filter(|&s| states[s as usize] != "DONE").collect();
        assert_eq!(seqs, expected, "{backend:?}: {key} delivered in entry order");
    }
    let first = |key: &str| delivered.iter().find(|d| d.0 == key).map(|d| d.2).unwrap();
    assert!(first("held") >= t0 + 60_000, "{backend:?}: the held key waited for the old instance's lease");
    assert!(first("not-yet") >= t0 + 30_000, "{backend:?}: the not-yet head waited for its deadline");
    assert!(first("blocked") >= repaired_at.unwrap(), "{backend:?}: the blocked key waited for its repair");
    let (id, token) = old_lease;
    let fenced = store
        .settle(
            id,
            &inbox::Lease { owner: "old-instance".into(), token, expires_at: t0 + 60_000 },
            t,
            &Settlement::Done,
        )
        .await;
    assert!(
        matches!(fenced, Err(inbox::StoreError::LeaseLost { .. })),
        "{backend:?}: the old instance's late settle is refused: {fenced:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_inbox_of_the_previous_schema_is_migrated_and_drained_in_key_order_on_sqlite() {
    a_busy_inbox_of_the_previous_schema_is_migrated_and_drained_in_key_order(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_inbox_of_the_previous_schema_is_migrated_and_drained_in_key_order_on_postgres() {
    a_busy_inbox_of_the_previous_schema_is_migrated_and_drained_in_key_order(Backend::Postgres).await;
}
/// From schema 11, before the key floors (PostgreSQL 12 and 13): the floors are
/// filled from the entries as they stand, the index of the keys in flight is built
/// again, and the drain keeps every key's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_inbox_from_before_the_key_floors_is_migrated_and_drained_in_key_order_on_postgres() {
    a_busy_inbox_is_migrated_and_drained_in_key_order(Backend::Postgres, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_from_every_earlier_version_on_sqlite() {
    upgrade_from_every_earlier_version(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_from_every_earlier_version_on_postgres() {
    upgrade_from_every_earlier_version(Backend::Postgres).await;
}

async fn a_newer_schema_is_refused(backend: Backend) {
    let db = Db::new(backend).await;
    let config = db.config(free_port());
    let config = config.to_str().unwrap();
    succeeds(&["migrate", config]);
    let (latest, newer) = (db.latest(), db.latest() + 1);
    db.exec(
        "INSERT INTO inlet_schema (version, applied_at, binary_version, checksum) VALUES ($1, 0, 'inlet 9.9.9', 'ab')",
        &[V::Int(Some(newer))],
    )
    .await;
    let before = db.snapshot().await;
    let both = [format!("at version {newer}"), format!("up to version {latest}")];
    for mode in ["auto", "check", "off"] {
        let err = refused(&["run", config, "--migrate", mode]);
        assert!(both.iter().all(|v| err.contains(v)), "run --migrate {mode}: {err}");
    }
    for args in [vec!["inbox", "list", "-c", config], vec!["route", "list", "-c", config], vec!["migrate", config]] {
        let err = refused(&args);
        assert!(both.iter().all(|v| err.contains(v)), "{args:?}: {err}");
    }
    let out = inlet(&["schema", "status", "-c", config]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).contains(&format!("at version {newer}")), "{}", text(&out.stdout));
    assert_eq!(db.snapshot().await, before, "{backend:?}: refusing changed nothing");

    // The same version, declared by its migration to run with this binary's schema
    // (expand): this binary starts on it.
    db.exec(
        "UPDATE inlet_schema SET compatible_from = $1 WHERE version = $2",
        &[V::Int(Some(latest)), V::Int(Some(newer))],
    )
    .await;
    let mut running = InletProcess::spawn_with_args(Path::new(config), &["--migrate", "check"], &[]);
    running.wait_healthy(Duration::from_secs(60)).await;
    assert!(running.log().contains("newer than this binary knows"), "{}", running.log());
    let status = running.sigterm_and_wait(Duration::from_secs(30));
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_at_start_naming_both_versions_on_sqlite() {
    a_newer_schema_is_refused(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_at_start_naming_both_versions_on_postgres() {
    a_newer_schema_is_refused(Backend::Postgres).await;
}

async fn commands_on_an_old_schema_change_nothing(backend: Backend) {
    let db = Db::new(backend).await;
    let old = db.latest() - 2;
    schema::create_as_of(&db.url, old).await.unwrap();
    insert_rows_of_every_state(&db).await;
    let config = db.config(free_port());
    let config = config.to_str().unwrap();
    let before = db.snapshot().await;

    let say = format!("at version {old}, this binary ({}) needs version {}", schema::BINARY, db.latest());
    for args in [
        vec!["inbox", "list", "-c", config],
        vec!["inbox", "stats", "-c", config],
        vec!["inbox", "requeue", "1", "-c", config],
        vec!["route", "list", "-c", config],
        vec!["route", "pause", "wo", "--reason", "x", "-c", config],
        vec!["run", config, "--migrate", "check"],
    ] {
        let err = refused(&args);
        assert!(err.contains(&say) && err.contains("run `inlet migrate` first"), "{args:?}: {err}");
    }
    let out = inlet(&["schema", "status", "-c", config]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let status = text(&out.stdout);
    assert!(status.contains(&format!("schema version {old};")) && status.contains("pending"), "{status}");

    let plan = succeeds(&["migrate", "--dry-run", config]);
    for m in &schema::known(&db.url).unwrap()[old as usize..] {
        assert!(plan.contains(&format!("-- version {} ({}), sha256 {}", m.version, m.name, m.checksum())), "{plan}");
        assert!(plan.contains(m.sql.trim_end()), "{plan}");
    }
    assert_eq!(db.snapshot().await, before, "{backend:?}: nothing changed (schema, rows, file bytes)");

    // `--migrate off` starts on it, with a warning, and leaves the schema as it is.
    let mut off = InletProcess::spawn_with_args(Path::new(config), &["--migrate", "off"], &[]);
    off.wait_healthy(Duration::from_secs(60)).await;
    assert!(off.log().contains("--migrate off: starting on an older inbox schema"), "{}", off.log());
    off.sigterm_and_wait(Duration::from_secs(30));
    assert_eq!(db.snapshot().await.0, before.0, "{backend:?}: --migrate off migrated nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_an_old_schema_change_nothing_and_say_to_migrate_on_sqlite() {
    commands_on_an_old_schema_change_nothing(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_an_old_schema_change_nothing_and_say_to_migrate_on_postgres() {
    commands_on_an_old_schema_change_nothing(Backend::Postgres).await;
}

#[test]
fn commands_on_a_missing_sqlite_file_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("data").join("inbox.db");
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://{}\"\n\n[[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"log\" }}\n",
            db.display(),
            plugin_path("work_order").display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let say = format!("no inbox at {}", db.display());
    for args in [
        vec!["inbox", "stats", "-c", config],
        vec!["inbox", "list", "-c", config],
        vec!["route", "list", "-c", config],
        vec!["schema", "status", "-c", config],
        vec!["run", config, "--migrate", "check"],
        vec!["run", config, "--migrate", "off"],
    ] {
        let err = refused(&args);
        assert!(err.contains(&say), "{args:?}: {err}");
    }
    let plan = succeeds(&["migrate", "--dry-run", config]);
    assert!(plan.contains(&format!("-- {say} yet: `inlet migrate` creates it")), "{plan}");
    assert!(plan.contains("-- version 1 (inbox)"), "{plan}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["inlet.toml"], "nothing was created beside the routing file");

    succeeds(&["migrate", config]);
    assert!(db.is_file(), "`inlet migrate` creates the inbox");
    succeeds(&["inbox", "stats", "-c", config]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_blocked_by_a_held_lock_fails_within_its_lock_timeout() {
    let db = Db::new(Backend::Postgres).await;
    // The newest migration that changes `inbox_entry`, the table held below (one that
    // only adds a table of its own needs no lock another session holds).
    let pending = schema::known(&db.url)
        .unwrap()
        .iter()
        .rev()
        .find(|m| m.sql.contains("ON inbox_entry") || m.sql.contains("TABLE inbox_entry"))
        .expect("a migration that changes inbox_entry");
    let before = pending.version - 1;
    schema::create_as_of(&db.url, before).await.unwrap();
    let config = db.config(free_port());
    let config = config.to_str().unwrap();

    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE inbox_entry IN ACCESS EXCLUSIVE MODE").execute(&mut *held).await.unwrap();

    let say = format!(
        "inbox schema migration {} ({}) could not take its locks within the lock timeout (1s)",
        pending.version, pending.name
    );
    for args in [vec!["migrate", config, "--lock-timeout", "1s"], vec!["run", config, "--lock-timeout", "1s"]] {
        let started = Instant::now();
        let err = refused(&args);
        let took = started.elapsed();
        // A migration outside a transaction keeps what its statements did before the
        // failure (here nothing: its first statement waited for the lock), unrecorded.
        let kept = if pending.outside_transaction { "it is not recorded" } else { "nothing was applied" };
        assert!(err.contains(&say) && err.contains(kept), "{args:?}: {err}");
        // Within the timeout plus a process start, far from the default 5 s wait or a hang.
        assert!(took < Duration::from_millis(4_500), "{args:?} took {took:?}");
    }
    let store = inbox::connect(&db.url, 1, false).await.unwrap();
    assert_eq!(store.schema_record().await.unwrap().version(), before, "nothing was applied");

    held.rollback().await.unwrap();
    let out = succeeds(&["migrate", config, "--lock-timeout", "1s"]);
    assert!(out.contains(&format!("applied {} ({})", pending.version, pending.name)), "{out}");
    assert_eq!(store.schema_record().await.unwrap().version(), db.latest());
}

/// This binary's PostgreSQL migrations, then `more`: what a store migrating with a
/// migration of the tests' own is given.
fn pg_migrations_and(more: &[Migration]) -> &'static [Migration] {
    let mut list = schema::known("postgres://").expect("the PostgreSQL list").to_vec();
    list.extend_from_slice(more);
    Box::leak(list.into_boxed_slice())
}

/// An index on `inbox_entry` built while the inbox takes writes, as UPGRADING.md says
/// to write one.
fn received_index(version: i64) -> Migration {
    Migration::new(
        version,
        "received_index",
        "-- Built while the inbox takes writes.\n\
         DROP INDEX CONCURRENTLY IF EXISTS inbox_entry_received;\n\
         CREATE INDEX CONCURRENTLY inbox_entry_received ON inbox_entry (received_at);\n",
    )
    .outside_transaction()
    .compatible_from(version - 1)
}

/// An OPEN entry with dedup key `key`, inserted on `conn`.
async fn insert_entry(conn: &mut sqlx::PgConnection, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO inbox_entry (route, dedup_key, correlation_key, event_type, raw_data, attributes, message_id, \
         payload_digest, status, next_attempt_at, received_at, updated_at) \
         VALUES ('wo', $1, $1, 'work-order', $2, '[]', $1, 'digest', 'OPEN', 0, 1, 1)",
    )
    .bind(key)
    .bind(b"{}".as_slice())
    .execute(conn)
    .await
    .map(drop)
}

/// `(valid, ready)` of each index named `name`.
async fn index_state(url: &str, name: &str) -> Vec<(bool, bool)> {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let found = sqlx::query_as(
        "SELECT i.indisvalid, i.indisready FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE c.relname = $1",
    )
    .bind(name)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    found
}

/// Whether a session runs `CREATE INDEX CONCURRENTLY` and waits for a lock.
async fn build_waits(url: &str) -> bool {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let waiting: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
         AND query LIKE 'CREATE INDEX CONCURRENTLY%' AND wait_event_type = 'Lock')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    waiting
}

/// A migration outside a transaction builds its index with `CREATE INDEX CONCURRENTLY`
/// while writers insert, is recorded after its build, and the migration after it
/// applies in a transaction of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_built_outside_a_transaction_lets_writers_insert_while_it_builds() {
    let db = Db::new(Backend::Postgres).await;
    let latest = db.latest();
    inbox::connect(&db.url, 1, true).await.unwrap().migrate(schema::DEFAULT_LOCK_TIMEOUT).await.unwrap();

    // A writer's transaction, open when the build starts: the build waits for it, so
    // it stays under way, whatever the timing, until that transaction commits.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    insert_entry(&mut held, "before-the-build").await.unwrap();

    let after = Migration::new(latest + 2, "after_the_index", "CREATE TABLE after_the_index (id BIGINT);");
    let list = pg_migrations_and(&[received_index(latest + 1), after]);
    let store = PgStore::connect_with_migrations(&db.url, 2, list).await.unwrap();
    let migrating = tokio::spawn(async move {
        let applied = store.migrate(Duration::from_secs(300)).await;
        applied.map(|a| a.iter().map(|m| m.version).collect::<Vec<_>>())
    });
    wait_until("the concurrent build to wait for the open transaction", Duration::from_secs(30), || {
        build_waits(&db.url)
    })
    .await;

    // Writers go on while the index builds: each insert commits (a plain CREATE INDEX
    // would hold them until the open transaction ends, which it does not here).
    let mut writer = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for n in 0..50 {
        let key = format!("during-the-build-{n}");
        let insert = insert_entry(&mut writer, &key);
        let done = tokio::time::timeout(Duration::from_secs(20), insert).await;
        assert!(matches!(done, Ok(Ok(()))), "insert {n} while the index builds: {done:?}");
    }
    assert!(!migrating.is_finished(), "the build waits for the open transaction");
    assert_eq!(index_state(&db.url, "inbox_entry_received").await, [(false, false)], "under way, not yet used");
    let store = inbox::connect(&db.url, 1, false).await.unwrap();
    assert_eq!(store.schema_record().await.unwrap().version(), latest, "recorded only once built");

    held.commit().await.unwrap();
    let applied = tokio::time::timeout(Duration::from_secs(120), migrating).await.expect("the build ends").unwrap();
    assert_eq!(applied.unwrap(), [latest + 1, latest + 2]);

    assert_eq!(index_state(&db.url, "inbox_entry_received").await, [(true, true)]);
    let record = store.schema_record().await.unwrap();
    assert_eq!(record.version(), latest + 2);
    for m in &list[latest as usize..] {
        let a = record.applied.iter().find(|a| a.version == m.version).unwrap();
        assert_eq!((a.checksum.as_deref(), a.binary_version.as_deref()), (Some(&*m.checksum()), Some(schema::BINARY)));
        assert_eq!(a.compatible_from, Some(m.compatible_from));
    }
    // The index holds the rows written during its build, and a query on the column
    // reads it.
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SET enable_seqscan = off").execute(&mut conn).await.unwrap();
    let query = "SELECT count(*) FROM inbox_entry WHERE received_at >= 0";
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {query}")).fetch_all(&mut conn).await.unwrap();
    assert!(plan.iter().any(|l| l.contains("inbox_entry_received")), "{plan:#?}");
    let rows: i64 = sqlx::query_scalar(query).fetch_one(&mut conn).await.unwrap();
    assert_eq!(rows, 51);
    let table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('after_the_index')::text").fetch_one(&mut conn).await.unwrap();
    assert_eq!(table.as_deref(), Some("after_the_index"));
}

/// A concurrent build that cannot finish within the lock timeout fails naming its
/// migration and leaves it unrecorded with an INVALID index, which running again
/// replaces with a valid one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_build_that_times_out_is_completed_by_running_again() {
    let db = Db::new(Backend::Postgres).await;
    let latest = db.latest();
    inbox::connect(&db.url, 1, true).await.unwrap().migrate(schema::DEFAULT_LOCK_TIMEOUT).await.unwrap();
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    insert_entry(&mut held, "before-the-build").await.unwrap();

    let list = pg_migrations_and(&[received_index(latest + 1)]);
    let store = PgStore::connect_with_migrations(&db.url, 2, list).await.unwrap();
    let started = Instant::now();
    let failed = tokio::time::timeout(Duration::from_secs(60), store.migrate(Duration::from_secs(1))).await;
    let err = failed.expect("the lock timeout ends the build").unwrap_err().to_string();
    let took = started.elapsed();
    let say = format!(
        "inbox schema migration {} (received_index) could not take its locks within the lock timeout (1s)",
        latest + 1
    );
    assert!(err.contains(&say), "{err}");
    assert!(err.contains("a transaction older than its concurrent build"), "{err}");
    assert!(err.contains("it is not recorded") && err.contains("run `inlet migrate` again"), "{err}");
    // Within the timeout, far from waiting for the open transaction, which never ends
    // on its own.
    assert!(took < Duration::from_secs(30), "{took:?}");

    assert_eq!(index_state(&db.url, "inbox_entry_received").await, [(false, false)], "left INVALID");
    let plain = inbox::connect(&db.url, 1, false).await.unwrap();
    assert_eq!(plain.schema_record().await.unwrap().version(), latest, "not recorded");

    held.rollback().await.unwrap();
    let applied = store.migrate(Duration::from_secs(1)).await.unwrap();
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), [latest + 1]);
    assert_eq!(index_state(&db.url, "inbox_entry_received").await, [(true, true)], "one index, valid");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let invalid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_index WHERE indrelid = 'inbox_entry'::regclass AND NOT (indisvalid AND indisready)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(invalid, 0, "no INVALID index left on inbox_entry");
    let record = plain.schema_record().await.unwrap();
    assert_eq!(record.version(), latest + 1);
    assert_eq!(record.applied.last().unwrap().checksum, Some(list[latest as usize].checksum()));
    // Current for a binary that knows it.
    let cmp = schema::Comparison { known: list, record: &record };
    assert!(cmp.refuse_older().is_ok() && cmp.mismatches().is_empty());
}

/// Two runs at once migrate once, and the one waiting for the migration lock does not
/// hold up the other's concurrent build: a build waits for every transaction older
/// than itself, so a run that waited for the lock inside a statement would deadlock
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_the_migration_lock_lets_the_concurrent_build_finish() {
    let db = Db::new(Backend::Postgres).await;
    let latest = db.latest();
    inbox::connect(&db.url, 1, true).await.unwrap().migrate(schema::DEFAULT_LOCK_TIMEOUT).await.unwrap();
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut held = holder.begin().await.unwrap();
    insert_entry(&mut held, "before-the-build").await.unwrap();

    let list = pg_migrations_and(&[received_index(latest + 1)]);
    let run = |store: PgStore| {
        tokio::spawn(async move {
            let applied = store.migrate(Duration::from_secs(300)).await;
            applied.map(|a| a.iter().map(|m| m.version).collect::<Vec<_>>())
        })
    };
    let first = run(PgStore::connect_with_migrations(&db.url, 2, list).await.unwrap());
    wait_until("the concurrent build to wait for the open transaction", Duration::from_secs(30), || {
        build_waits(&db.url)
    })
    .await;
    let second = run(PgStore::connect_with_migrations(&db.url, 2, list).await.unwrap());
    // The second run has tried the lock (its session's last statement) and keeps trying.
    wait_until("the second run to try the migration lock", Duration::from_secs(30), || async {
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let tried: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() \
             AND query LIKE 'SELECT pg_try_advisory_lock%')",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        tried
    })
    .await;
    assert!(!second.is_finished(), "the second run waits for the first");

    held.commit().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(120), first).await.expect("the first run ends").unwrap();
    let second = tokio::time::timeout(Duration::from_secs(120), second).await.expect("the second run ends").unwrap();
    assert_eq!(first.unwrap(), [latest + 1], "the first run builds the index");
    assert_eq!(second.unwrap(), Vec::<i64>::new(), "the second finds it applied");
    assert_eq!(index_state(&db.url, "inbox_entry_received").await, [(true, true)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_one_sqlite_file_is_refused_while_the_first_keeps_running() {
    let db = Db::new(Backend::Sqlite).await;
    let config = db.config(free_port());
    let mut first = InletProcess::spawn(&config, &[]);
    first.wait_healthy(Duration::from_secs(60)).await;
    let config = config.to_str().unwrap();

    let other_port = free_port().to_string();
    let lock = std::fs::canonicalize(db.dir.path()).unwrap().join("inbox.db.lock");
    let say = format!(
        "another Inlet is running on the SQLite inbox {} (pid {} holds {})",
        db.file().display(),
        first.pid(),
        lock.display()
    );
    let err = refused(&["run", config, "--listen", &format!("127.0.0.1:{other_port}")]);
    assert!(err.contains(&say), "{err}");
    let err = refused(&["migrate", config]);
    assert!(err.contains(&say), "`inlet migrate` takes the same lock: {err}");

    // The first instance runs on, and the commands that do not migrate work beside it.
    first.assert_running();
    let http = reqwest::Client::new();
    let (status, _) = push_work_order(&http, &first.base, "wo", "K1", 1).await;
    assert_eq!(status, 200);
    succeeds(&["inbox", "stats", "-c", config]);
    succeeds(&["schema", "status", "-c", config]);

    // Once it stops, the lock is free.
    first.sigterm_and_wait(Duration::from_secs(30));
    let mut next = InletProcess::spawn(Path::new(config), &[]);
    next.wait_healthy(Duration::from_secs(60)).await;
}

/// After `inlet migrate` as the owner, instances run as a role that may only read and
/// write rows: no DDL, no ownership (what UPGRADING.md tells production to do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_run_as_a_role_that_may_only_read_and_write_rows() {
    let db = Db::new(Backend::Postgres).await;
    succeeds(&["migrate", db.config(free_port()).to_str().unwrap()]);
    let pg = db.pg.as_ref().unwrap();
    let role = TestRole { name: format!("{}_rt", pg.name()), db_url: db.url.clone() };
    db.exec(
        &format!(
            "DO $$ BEGIN
               CREATE ROLE \"{r}\" LOGIN;
               GRANT CONNECT ON DATABASE \"{d}\" TO \"{r}\";
               GRANT USAGE ON SCHEMA public TO \"{r}\";
               GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO \"{r}\";
               GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO \"{r}\";
             END $$",
            r = role.name,
            d = pg.name()
        ),
        &[],
    )
    .await;
    let runtime_url = role.url(&db.url);
    let runtime_dir = tempfile::tempdir().unwrap();
    let config = write_config(runtime_dir.path(), &runtime_url, free_port());

    // The role cannot migrate (it may not create anything)…
    let mut conn = sqlx::PgConnection::connect(&runtime_url).await.unwrap();
    let ddl = sqlx::raw_sql("CREATE TABLE nope (id BIGINT)").execute(&mut conn).await;
    assert!(ddl.is_err(), "the runtime role may not create tables");
    conn.close().await.unwrap();

    // …and needs not: it runs, stores, delivers, pauses and reads.
    let mut inlet = InletProcess::spawn_with_args(&config, &["--migrate", "check"], &[]);
    inlet.wait_healthy(Duration::from_secs(60)).await;
    let http = reqwest::Client::new();
    let (status, answer) = push_work_order(&http, &inlet.base, "wo", "K1", 1).await;
    assert_eq!(status, 200, "{answer}");
    let store = inbox::open_as(&runtime_url, 1, MigrateMode::Check, schema::DEFAULT_LOCK_TIMEOUT).await.unwrap();
    wait_until("the entry to be delivered by the runtime role", Duration::from_secs(30), || {
        let store = std::sync::Arc::clone(&store);
        async move { states(store.as_ref()).await.iter().any(|(_, s)| *s == Status::Done) }
    })
    .await;
    let config = config.to_str().unwrap();
    succeeds(&["route", "pause", "wo", "--reason", "role test", "-c", config]);
    succeeds(&["route", "resume", "wo", "-c", config]);
    succeeds(&["inbox", "stats", "-c", config]);
    succeeds(&["schema", "status", "-c", config]);
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(Duration::from_secs(30)).success());
    assert!(!inlet.log().contains("permission denied"), "{}", inlet.log());
}
