//! The outbox source (docs/outbox.md): an application writes events into its own
//! outbox table in the transactions that change its data; Inlet reads the table,
//! publishes each row to the real Pub/Sub emulator with the aggregate as ordering
//! key, and marks the row. Google's own Python client reads the topic
//! (`tests/pubsub/read_topic.py`), so what is checked is what a consumer gets.
//!
//! Needs PostgreSQL (the application's database and the inbox, one fresh database
//! each), the emulator, the `outbox_event` plugin and Google's Python client.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use inlet_testkit::emulator::PubSubEmulator;
use inlet_testkit::paths::{inlet_bin, plugin_path};
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::py_pubsub::{ReadMessage, TopicReader};
use inlet_testkit::wait::wait_until;
use sqlx::Connection as _;

const PROJECT: &str = "inlet-outbox";
const ROUTE: &str = "orders-out";

/// The article's table, as an application would create it.
const OUTBOX_TABLE: &str = "CREATE TABLE outbox (
    id           bigserial PRIMARY KEY,
    aggregate_id text NOT NULL,
    event_type   text NOT NULL,
    payload      jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;
CREATE TABLE orders (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, total int NOT NULL);";

async fn app_database() -> TestPg {
    let app = TestPg::new().await;
    let mut conn = app.connect().await;
    sqlx::raw_sql(OUTBOX_TABLE).execute(&mut conn).await.expect("create the application's outbox");
    app
}

/// A routing file with one outbox route to `topic`, on a PostgreSQL inbox; the
/// application's URL comes from `APP_DB_URL` (a reference, as the file must).
fn routing_file(dir: &Path, inbox: &str, topic: &str, extra: &str) -> std::path::PathBuf {
    let config = dir.join("routes.toml");
    let text = format!(
        r#"[store]
url = "{inbox}"

[admin]
auth = "none-loopback"

[[route]]
name     = "{ROUTE}"
plugin   = "{plugin}"
source   = {{ kind = "outbox", url = "${{APP_DB_URL}}", poll = "200ms", batch_size = 200 }}
target   = {{ kind = "pubsub", topic = "projects/{PROJECT}/topics/{topic}", ordering_key = true, timeout = "3s" }}
lease    = "5s"
max_steps = 1
concurrency = 16
{extra}
"#,
        plugin = plugin_path("outbox_event").display(),
    );
    std::fs::write(&config, text).expect("write the routing file");
    config
}

fn spawn(config: &Path, name: &str, app: &TestPg, emulator: &PubSubEmulator) -> InletProcess {
    let listen = format!("127.0.0.1:{}", free_port());
    InletProcess::spawn_with_args(
        config,
        &["--listen", &listen, "--poll", "100ms"],
        &[("INLET_INSTANCE", name), ("APP_DB_URL", &app.url), ("PUBSUB_EMULATOR_HOST", &emulator.host)],
    )
}

/// One sample of a metric in a `/metrics` text, by name and a label it carries.
async fn metric(base: &str, name: &str, label: &str) -> Option<f64> {
    let text = reqwest::get(format!("{base}/metrics")).await.ok()?.text().await.ok()?;
    text.lines().filter(|l| l.starts_with(name) && l.contains(label)).find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Waits until the reader has received `n` messages (a published row can be marked
/// before the consumer has it).
async fn read_at_least(reader: &mut TopicReader, n: usize) {
    wait_until(&format!("{n} messages read"), Duration::from_secs(30), || {
        let read = reader.messages().len();
        async move { read >= n }
    })
    .await;
}

async fn unpublished(app: &TestPg) -> i64 {
    let mut conn = app.connect().await;
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(&mut conn)
        .await
        .expect("count unpublished rows")
}

/// The row ids each aggregate's messages carried, in the order the reader got them.
/// A message Pub/Sub delivered again (the same message id: the consumer's ack was
/// lost, nothing Inlet did) counts once; a row Inlet published again is a new message.
fn by_aggregate(messages: &[ReadMessage]) -> BTreeMap<String, Vec<i64>> {
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for m in messages.iter().filter(|m| seen.insert(m.message_id.clone())) {
        let id: i64 = m
            .attributes
            .get("outbox_id")
            .unwrap_or_else(|| panic!("a message without outbox_id: {m:?}"))
            .parse()
            .expect("outbox_id is the row id");
        assert_eq!(
            m.attributes.get("idempotency_key").map(String::as_str),
            Some(id.to_string().as_str()),
            "the idempotency key is the row id: {m:?}"
        );
        out.entry(m.ordering_key.clone()).or_default().push(id);
    }
    out
}

/// What the application committed: row ids by aggregate, in insert order; and the
/// ids of the rows it rolled back.
#[derive(Default)]
struct Written {
    committed: BTreeMap<String, Vec<i64>>,
    rolled_back: BTreeSet<i64>,
}

/// The application: `writers` tasks, each the only writer of its aggregates (so one
/// aggregate's rows are inserted one transaction after another), each inserting an
/// order and its event in one transaction and rolling back every seventh.
async fn write_events(app_url: &str, total: usize, aggregates: usize, writers: usize) -> Written {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let url = app_url.to_string();
        tasks.spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.expect("the application connects");
            let mine: Vec<usize> = (0..aggregates).filter(|a| a % writers == w).collect();
            let mut written = Written::default();
            for i in 0..total / writers {
                let aggregate = format!("order-{:03}", mine[i % mine.len()]);
                let mut tx = conn.begin().await.expect("begin");
                sqlx::query("INSERT INTO orders (aggregate_id, total) VALUES ($1, $2)")
                    .bind(&aggregate)
                    .bind(i as i32)
                    .execute(&mut *tx)
                    .await
                    .expect("insert the order");
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO outbox (aggregate_id, event_type, payload) VALUES ($1, 'order-changed', $2) RETURNING id",
                )
                .bind(&aggregate)
                .bind(serde_json::json!({ "order": aggregate, "step": i }))
                .fetch_one(&mut *tx)
                .await
                .expect("insert the event");
                sqlx::query("SELECT pg_notify('inlet_outbox', '')").execute(&mut *tx).await.expect("notify");
                if i % 7 == 3 {
                    tx.rollback().await.expect("rollback");
                    written.rolled_back.insert(id);
                } else {
                    tx.commit().await.expect("commit");
                    written.committed.entry(aggregate).or_default().push(id);
                }
            }
            written
        });
    }
    let mut all = Written::default();
    while let Some(done) = tasks.join_next().await {
        let done = done.expect("a writer panicked");
        all.committed.extend(done.committed);
        all.rolled_back.extend(done.rolled_back);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_publish_every_committed_row_once_in_order_per_aggregate_through_a_sigkill() {
    const TOTAL: usize = 10_000;
    const AGGREGATES: usize = 100;
    let started = Instant::now();
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("orders").await;
    emulator.create_subscription("orders", "orders-consumer", true).await;
    let mut reader = TopicReader::start(&emulator, "orders-consumer");
    let app = app_database().await;
    let inbox = TestPg::new().await;
    let dir = tempfile::tempdir().unwrap();
    let config = routing_file(dir.path(), &inbox.url, "orders", "");
    let mut a = spawn(&config, "a", &app, &emulator);
    let mut b = spawn(&config, "b", &app, &emulator);
    a.wait_healthy(Duration::from_secs(30)).await;
    b.wait_healthy(Duration::from_secs(30)).await;

    // The application writes while both instances relay; the kill comes mid-run.
    let writer = {
        let app_url = app.url.clone();
        tokio::spawn(async move { write_events(&app_url, TOTAL, AGGREGATES, 4).await })
    };
    wait_until("a fifth of the events published", Duration::from_secs(180), || {
        let n = reader.messages().len();
        async move { n >= TOTAL / 5 }
    })
    .await;
    // Kill the instance that reads the outbox, so the other has to take over the
    // reading as well as the killed one's leased entries.
    let readers =
        [metric(&a.base, "inlet_outbox_reading", ROUTE).await, metric(&b.base, "inlet_outbox_reading", ROUTE).await];
    let mut sorted = readers;
    sorted.sort_by(|x, y| x.partial_cmp(y).unwrap());
    assert_eq!(sorted, [Some(0.0), Some(1.0)], "one instance reads the outbox, the other stands by: {readers:?}");
    let a_reads = readers[0] == Some(1.0);
    let (killed, survivor) = if a_reads { (&mut a, &mut b) } else { (&mut b, &mut a) };
    killed.sigkill();
    let at_kill = reader.messages().len();
    println!("killed the reading instance after {at_kill} messages ({:?} in)", started.elapsed());

    let written = writer.await.expect("the application's writers");
    let committed: usize = written.committed.values().map(Vec::len).sum();
    assert!(at_kill < committed, "the kill must come mid-run ({at_kill} of {committed} published)");
    println!("the application committed {committed} events and rolled back {}", written.rolled_back.len());

    let all: BTreeSet<i64> = written.committed.values().flatten().copied().collect();
    wait_until("every committed event published", Duration::from_secs(300), || {
        let seen: BTreeSet<i64> =
            reader.messages().iter().filter_map(|m| m.attributes.get("outbox_id")?.parse().ok()).collect();
        let done = all.is_subset(&seen);
        async move { done }
    })
    .await;
    wait_until("every published row marked", Duration::from_secs(60), || async { unpublished(&app).await == 0 }).await;
    survivor.assert_running();
    // Quiet for a while: a late duplicate would show here.
    tokio::time::sleep(Duration::from_secs(3)).await; // time for stray copies to arrive
    let messages = reader.stop();

    let got = by_aggregate(&messages);
    let mut duplicates = 0;
    for (aggregate, ids) in &got {
        // Duplicates only next to themselves: a row published again is its
        // aggregate's head, published before the next.
        let mut first: Vec<i64> = ids.clone();
        first.dedup();
        duplicates += ids.len() - first.len();
        let distinct: BTreeSet<i64> = first.iter().copied().collect();
        assert_eq!(distinct.len(), first.len(), "{aggregate}: a row came again after later rows: {ids:?}");
        let expected =
            written.committed.get(aggregate).unwrap_or_else(|| panic!("an aggregate no one wrote: {aggregate}"));
        assert_eq!(&first, expected, "{aggregate}: published in insert order, each committed row once");
    }
    assert_eq!(got.len(), AGGREGATES, "every aggregate published");
    let rolled_back: Vec<i64> = messages
        .iter()
        .filter_map(|m| m.attributes.get("outbox_id")?.parse().ok())
        .filter(|id| written.rolled_back.contains(id))
        .collect();
    assert!(rolled_back.is_empty(), "rows of rolled-back transactions published: {rolled_back:?}");
    // At most one in flight per aggregate at the kill.
    assert!(duplicates <= AGGREGATES, "{duplicates} duplicates: more than the rows in flight at the kill");
    println!(
        "{} messages for {committed} committed rows ({duplicates} published again across the kill); {:?} in all",
        messages.len(),
        started.elapsed()
    );
    let marked = metric(&survivor.base, "inlet_outbox_marked_total", ROUTE).await.unwrap_or(0.0);
    assert!(marked > 0.0, "the survivor marked rows after taking over (inlet_outbox_marked_total = {marked})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_publish_holds_back_its_aggregate_while_the_others_flow_until_it_is_requeued() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    // The topic's schema takes `seq` as a number only.
    let schema = serde_json::json!({
        "type": "AVRO",
        "definition": r#"{"type":"record","name":"Step","fields":[{"name":"seq","type":"int"}]}"#,
    });
    emulator.rest(reqwest::Method::POST, "schemas?schemaId=order-step", &schema).await;
    let settings = serde_json::json!({
        "schemaSettings": { "schema": format!("projects/{PROJECT}/schemas/order-step"), "encoding": "JSON" }
    });
    let topic = emulator.rest(reqwest::Method::PUT, "topics/steps", &settings).await;
    assert!(topic.get("schemaSettings").is_some(), "the topic has the schema: {topic}");
    emulator.create_subscription("steps", "steps-consumer", true).await;
    let mut reader = TopicReader::start(&emulator, "steps-consumer");

    let app = app_database().await;
    let inbox = TestPg::new().await;
    // Five aggregates of six rows; the third row of `order-002` says its step in words.
    let mut conn = app.connect().await;
    let mut poison = 0i64;
    let mut rows: HashMap<String, Vec<i64>> = HashMap::new();
    for seq in 0..6 {
        for a in 0..5 {
            let aggregate = format!("order-{a:03}");
            let payload = if a == 2 && seq == 2 {
                serde_json::json!({ "seq": "two" })
            } else {
                serde_json::json!({ "seq": seq })
            };
            let id: i64 = sqlx::query_scalar(
                "INSERT INTO outbox (aggregate_id, event_type, payload) VALUES ($1, 'step', $2) RETURNING id",
            )
            .bind(&aggregate)
            .bind(payload)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            if a == 2 && seq == 2 {
                poison = id;
            }
            rows.entry(aggregate).or_default().push(id);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = routing_file(dir.path(), &inbox.url, "steps", "");
    let mut inlet = spawn(&config, "one", &app, &emulator);
    inlet.wait_healthy(Duration::from_secs(30)).await;

    // The refused row parks, with Pub/Sub's reason; its aggregate's later rows wait
    // behind it; the other aggregates are published and marked.
    let mut inbox_conn = inbox.connect().await;
    let parked: (i64, String, String) =
        inlet_testkit::wait::wait_for("the refused row parked", Duration::from_secs(60), || {
            let url = inbox.url.clone();
            async move {
                let mut conn = sqlx::PgConnection::connect(&url).await.ok()?;
                sqlx::query_as("SELECT id, last_error, dedup_key FROM inbox_entry WHERE status = 'PARKED'")
                    .fetch_optional(&mut conn)
                    .await
                    .ok()
                    .flatten()
            }
        })
        .await;
    assert!(parked.1.contains("400"), "parked with Pub/Sub's refusal: {}", parked.1);
    assert_eq!(parked.2, poison.to_string(), "the parked entry is the refused row");
    wait_until("the other aggregates published and marked", Duration::from_secs(60), || async {
        unpublished(&app).await == 4
    })
    .await;
    let waiting: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(waiting, rows["order-002"][2..].to_vec(), "only the refused row and the rows after it wait");
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_entry WHERE correlation_key = 'order-002' AND status = 'OPEN'")
            .fetch_one(&mut inbox_conn)
            .await
            .unwrap();
    assert_eq!(held, 3, "the aggregate's three later rows wait in the inbox behind the parked one");

    // The platform team lifts the schema; the operator requeues the parked row: the
    // aggregate goes on, in order.
    let lift = serde_json::json!({
        "topic": { "name": format!("projects/{PROJECT}/topics/steps") },
        "updateMask": "schemaSettings",
    });
    let lifted = emulator.rest(reqwest::Method::PATCH, "topics/steps", &lift).await;
    assert!(lifted.get("schemaSettings").is_none(), "the schema is lifted: {lifted}");
    let requeue = std::process::Command::new(inlet_bin())
        .args(["inbox", "requeue", &parked.0.to_string(), "--config"])
        .arg(&config)
        .env("APP_DB_URL", &app.url)
        .output()
        .expect("run inlet inbox requeue");
    assert!(requeue.status.success(), "requeue: {}", String::from_utf8_lossy(&requeue.stderr));
    wait_until("every row published and marked", Duration::from_secs(60), || async { unpublished(&app).await == 0 })
        .await;
    read_at_least(&mut reader, 30).await;
    let got = by_aggregate(&reader.stop());
    for (aggregate, ids) in &rows {
        assert_eq!(got.get(aggregate), Some(ids), "{aggregate}: every row once, in insert order");
    }
    inlet.sigterm_and_wait(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_named_column_is_reported_and_read_once_a_migration_adds_it() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("late").await;
    emulator.create_subscription("late", "late-consumer", true).await;
    let mut reader = TopicReader::start(&emulator, "late-consumer");
    // The application has not yet migrated: no `published_at`.
    let app = TestPg::new().await;
    let mut conn = app.connect().await;
    sqlx::raw_sql(
        "CREATE TABLE outbox (id bigserial PRIMARY KEY, aggregate_id text NOT NULL, event_type text NOT NULL,
                              payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO outbox (aggregate_id, event_type, payload) VALUES ('order-1', 'placed', '{\"n\": 1}');",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let inbox = TestPg::new().await;
    let dir = tempfile::tempdir().unwrap();
    let config = routing_file(dir.path(), &inbox.url, "late", "");
    let mut inlet = spawn(&config, "one", &app, &emulator);
    inlet.wait_healthy(Duration::from_secs(30)).await;
    let base = inlet.base.clone();
    wait_until("the missing column counted", Duration::from_secs(30), || {
        let base = base.clone();
        async move { metric(&base, "inlet_outbox_errors_total", "stage=\"table\"").await.unwrap_or(0.0) >= 1.0 }
    })
    .await;
    assert!(inlet.log().contains("has no column `published_at`"), "the log names the missing column:\n{}", inlet.log());
    // The migration lands; the source tries again by itself (its backoff is 2 s, then 4 s …).
    sqlx::raw_sql("ALTER TABLE outbox ADD COLUMN published_at timestamptz").execute(&mut conn).await.unwrap();
    wait_until("the row published and marked", Duration::from_secs(60), || async { unpublished(&app).await == 0 })
        .await;
    read_at_least(&mut reader, 1).await;
    let got = by_aggregate(&reader.stop());
    assert_eq!(got.get("order-1"), Some(&vec![1]), "the row published once: {got:?}");
    inlet.sigterm_and_wait(Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_its_own_shape_in_a_schema_is_published_and_its_rows_deleted() {
    let emulator = PubSubEmulator::start(PROJECT).await;
    emulator.create_topic("shaped").await;
    emulator.create_subscription("shaped", "shaped-consumer", true).await;
    let mut reader = TopicReader::start(&emulator, "shaped-consumer");
    // Another naming, in a schema of its own, with no `published` column: rows are
    // deleted once published.
    let app = TestPg::new().await;
    let mut conn = app.connect().await;
    sqlx::raw_sql(
        "CREATE SCHEMA sales;
         CREATE TABLE sales.events (event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                                    order_ref text NOT NULL, kind text NOT NULL, body text NOT NULL,
                                    at timestamptz NOT NULL DEFAULT now());
         INSERT INTO sales.events (order_ref, kind, body) VALUES
             ('o-1', 'placed', 'first'), ('o-2', 'placed', 'second'), ('o-1', 'paid', 'third');",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let inbox = TestPg::new().await;
    let dir = tempfile::tempdir().unwrap();
    let config = routing_file(dir.path(), &inbox.url, "shaped", "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        r#"source   = { kind = "outbox", url = "${APP_DB_URL}", poll = "200ms", batch_size = 200 }"#,
        r#"source   = { kind = "outbox", url = "${APP_DB_URL}", poll = "200ms", table = "sales.events",
             columns = { id = "event_id", aggregate = "order_ref", type = "kind", payload = "body", created = "at" },
             after_publish = "delete" }"#,
    );
    assert!(text.contains("sales.events"), "the route reads the shaped table");
    std::fs::write(&config, text).unwrap();
    let mut inlet = spawn(&config, "one", &app, &emulator);
    inlet.wait_healthy(Duration::from_secs(30)).await;
    wait_until("every row published and deleted", Duration::from_secs(60), || {
        let url = app.url.clone();
        async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sales.events").fetch_one(&mut conn).await.unwrap() == 0
        }
    })
    .await;
    read_at_least(&mut reader, 3).await;
    let messages = reader.stop();
    let got = by_aggregate(&messages);
    assert_eq!(got.get("o-1"), Some(&vec![1, 3]), "{got:?}");
    assert_eq!(got.get("o-2"), Some(&vec![2]), "{got:?}");
    let first = messages.iter().find(|m| m.attributes.get("outbox_id").map(String::as_str) == Some("1")).unwrap();
    assert_eq!(first.data, "first", "the text payload is the message's data");
    assert_eq!(first.attributes.get("event_type").map(String::as_str), Some("placed"));
    inlet.sigterm_and_wait(Duration::from_secs(30));
}
