//! Trying a new plugin version before it serves: in shadow on live traffic, by replay
//! over stored history, then promoted (and rolled back) in one audited step each.
//!
//! A real `inlet run` process on SQLite delivers over HTTP to a recording target in
//! the test, with the real compiled plugins of plugins/dist: `work_order` serves and
//! `work_order_next` is the candidate. The candidate answers exactly as the serving
//! plugin does except by the work order id: an id ending in 7 renders the path
//! `/engine-rest/v2/message` (one message in ten of ids 0..N), and ids starting
//! `sleep-`, `trap-` and `hoard-` make every call sleep an hour, panic, or keep 8 MiB
//! more memory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_work_order;
use inlet_testkit::recording_target::RecordingTarget;
use inlet_testkit::wait::{Progress, wait_for, wait_until, wait_while_progressing};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const ADMIN: &str = "shadow-test-admin-token-01";
const OPERATOR: &str = "shadow-test-operator-token";
const VIEWER: &str = "shadow-test-viewer-token-01";
const TOKENS: [(&str, &str); 3] = [("SH_ADMIN", ADMIN), ("SH_OPERATOR", OPERATOR), ("SH_VIEWER", VIEWER)];

const SHARED: &str = "[store]\nurl = \"sqlite://inbox.db\"\n\n\
    [[admin.token]]\nname = \"ops\"\nrole = \"admin\"\nsecret = \"${SH_ADMIN}\"\n\
    [[admin.token]]\nname = \"orders-team\"\nrole = \"operator\"\nsecret = \"${SH_OPERATOR}\"\nroutes = [\"orders\"]\n\
    [[admin.token]]\nname = \"watcher\"\nrole = \"viewer\"\nsecret = \"${SH_VIEWER}\"\n\n";

const SERVING_PATH: &str = "/engine-rest/message";
const CANDIDATE_PATH: &str = "/engine-rest/v2/message";

/// A folder with the routing file and both plugins copied in (`plugins/v1.wasm`
/// serving, `plugins/v2.wasm` the candidate).
struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Setup {
    fn new(target: &RecordingTarget, extra: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::fs::copy(plugin_path("work_order"), dir.path().join("plugins/v1.wasm")).unwrap();
        std::fs::copy(plugin_path("work_order_next"), dir.path().join("plugins/v2.wasm")).unwrap();
        let config = dir.path().join("inlet.toml");
        let text = format!(
            "{SHARED}[[route]]\nname = \"orders\"\nplugin = \"plugins/v1.wasm\"  # what serves\n\
             candidate = \"plugins/v2.wasm\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"http://{}\", timeout = \"5s\" }}\n{extra}",
            target.addr()
        );
        std::fs::write(&config, text).unwrap();
        Setup { dir, config }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn get(&self, path: &str, token: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "GET {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn post(&self, path: &str, token: &str) -> (u16, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        let status = r.status().as_u16();
        (status, serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null))
    }

    async fn shadow(&self, token: &str) -> Value {
        self.get("/api/routes/orders/shadow", token).await
    }

    async fn push(&self, key: &str, seq: u32) -> i64 {
        let (status, answer) = push_work_order(&self.http, &self.base, "orders", key, seq).await;
        assert_eq!(status, 200, "push {key}: {answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        answer["entry"].as_i64().unwrap_or_else(|| panic!("no entry id in {answer}"))
    }

    async fn metrics(&self) -> String {
        self.http.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap()
    }

    /// Waits until `n` entries of the route were delivered (each is delivered once:
    /// the target answers 204), then checks that none is left unresolved.
    async fn all_done(&self, n: usize) {
        let done = "inlet_delivery_attempts_total{route=\"orders\",outcome=\"done\"}";
        wait_until(&format!("{n} entries delivered"), WAIT, || async move {
            count(&self.metrics().await, done).unwrap_or(0) >= n as u64
        })
        .await;
        // The counter moves at the attempt's end, its settle commits right after.
        wait_until("no entry left unresolved", WAIT, || async move {
            let mut left = 0;
            for status in ["open", "in_progress", "parked"] {
                let page = self.get(&format!("/api/entries?route=orders&status={status}&limit=1"), ADMIN).await;
                left += page["entries"].as_array().map_or(1, Vec::len);
            }
            left == 0
        })
        .await;
    }
}

async fn spawn(config: &Path) -> (InletProcess, Api) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(config, &["--listen", &listen, "--poll", "50ms"], &TOKENS);
    inlet.wait_healthy(WAIT).await;
    let api = Api { http: reqwest::Client::new(), base: inlet.base.clone() };
    (inlet, api)
}

fn count(metrics: &str, series: &str) -> Option<u64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `inlet …` with the routing file, as a person runs it: stdout and exit status.
fn cli(config: &Path, args: &[&str], envs: &[(&str, &str)]) -> (String, Option<i32>) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(TOKENS)
        .envs(envs.iter().copied())
        .output()
        .expect("run inlet");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (format!("{stdout}{stderr}"), out.status.code())
}

/// Every row of every table of a SQLite file, as one digest: what a command that
/// changes no entry leaves as it was.
async fn rows_digest(db: &Path) -> String {
    use sqlx::Row;
    let url = format!("sqlite://{}?mode=ro", db.display());
    let mut conn: sqlx::SqliteConnection = sqlx::Connection::connect(&url).await.unwrap();
    let tables: Vec<String> = sqlx::query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect();
    let mut all = String::new();
    for table in tables {
        let columns: Vec<String> = sqlx::query(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|r| format!("quote(\"{}\")", r.get::<String, _>(0)))
            .collect();
        let sql = format!("SELECT {} FROM \"{table}\" ORDER BY rowid", columns.join(" || ',' || "));
        all.push_str(&format!("table {table}\n"));
        for row in sqlx::query(&sql).fetch_all(&mut conn).await.unwrap() {
            all.push_str(&row.get::<String, _>(0));
            all.push('\n');
        }
    }
    assert!(all.contains("table inbox_entry"), "the inbox tables are read");
    inlet::inbox::digest_hex(all.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_reports_one_render_in_ten_and_a_replay_of_the_same_1000_entries_reports_the_same_sending_and_changing_nothing()
 {
    let target = RecordingTarget::start().await;
    // The whole of a core for the candidate: here it must keep up, so that all of it
    // is compared (at its default tenth of a core it drops what it cannot keep up with).
    let setup = Setup::new(&target, "\n[plugins]\nshadow_cpu_percent = 100\n");
    let (mut inlet, api) = spawn(&setup.config).await;

    // Live traffic: work orders wo-0 … wo-999, one at a time, in rounds the shadow's
    // queue holds whole (two jobs an entry, a decode and a delivery, against its 1,024):
    // its thread runs at the lowest CPU priority, so on a busy machine it may fall a
    // round behind the deliveries, and a full queue drops work by design.
    const N: u32 = 1000;
    const ROUND: u32 = 250;
    let mut entries = std::collections::BTreeMap::new();
    let mut report = Value::Null;
    for round in 0..N / ROUND {
        for i in round * ROUND..(round + 1) * ROUND {
            entries.insert(api.push(&format!("wo-{i}"), 1).await, format!("wo-{i}"));
        }
        let sent = (round + 1) * ROUND;
        api.all_done(sent as usize).await;
        // What fails the test is a shadow that drops or stops comparing, not a slow one.
        report = wait_while_progressing(&format!("the shadow compared {sent} deliveries"), WAIT, || async {
            let r = api.shadow(ADMIN).await;
            let compared: Vec<u64> = ["decode", "render", "classify"]
                .iter()
                .map(|c| r["counts"][c]["compared"].as_u64().unwrap_or(0))
                .collect();
            assert_eq!(r["counts"]["dropped"], 0, "the shadow dropped work: {r}");
            if compared.iter().all(|&c| c == u64::from(sent)) {
                Progress::Done(r)
            } else {
                Progress::At(compared.iter().sum(), r.to_string())
            }
        })
        .await;
    }

    // Exactly the ids ending in 7 differ, in the path alone; nothing else differs.
    assert_eq!(report["state"], "running", "{report}");
    assert_eq!(report["counts"]["dropped"], 0, "{report}");
    assert_eq!(report["counts"]["render"]["differing"], 100, "{report}");
    assert_eq!(report["counts"]["render"]["parts"], serde_json::json!({ "path": 100 }), "{report}");
    for call in ["decode", "classify"] {
        assert_eq!(report["counts"][call]["differing"], 0, "{call}: {report}");
    }
    let samples = report["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 20, "the most recent 20 differences are kept: {report}");
    for s in samples {
        let key = &entries[&s["entry"].as_i64().unwrap()];
        assert!(key.ends_with('7'), "sample of {key}: {s}");
        assert_eq!((s["call"].as_str(), s["parts"].clone()), (Some("render"), serde_json::json!(["path"])), "{s}");
        assert_eq!(s["serving"]["path"], SERVING_PATH, "{s}");
        assert_eq!(s["candidate"]["path"], CANDIDATE_PATH, "{s}");
        assert!(s["serving"]["body"].as_str().unwrap().contains(key.as_str()), "both requests in full: {s}");
        assert_eq!(s["serving"]["body"], s["candidate"]["body"], "{s}");
    }

    // The target received the serving plugin's requests only: one per entry.
    let requests = target.requests();
    assert_eq!(requests.len(), N as usize);
    assert!(requests.iter().all(|r| r.path == SERVING_PATH), "a candidate's request was sent");

    // The payload rule: a viewer without payloads sees the addresses, not the bodies.
    let seen = api.shadow(VIEWER).await;
    let sample = &seen["samples"][0];
    assert_eq!(sample["candidate"]["path"], CANDIDATE_PATH, "{sample}");
    assert!(sample["serving"]["body"].as_str().unwrap().starts_with("withheld"), "{sample}");
    assert!(!seen.to_string().contains("completedItems"), "no body reaches a viewer: {seen}");

    // The metrics and the CLI say the same.
    let metrics = api.metrics().await;
    let series = "inlet_shadow_differences_total{route=\"orders\",call=\"render\",part=\"path\"}";
    assert_eq!(count(&metrics, series), Some(100), "{series}");
    assert_eq!(count(&metrics, "inlet_shadow_compared_total{route=\"orders\",call=\"decode\"}"), Some(1000));
    let (shown, code) =
        cli(&setup.config, &["plugin", "shadow", "orders", "--admin-url", &api.base], &[("INLET_TOKEN", ADMIN)]);
    assert_eq!(code, Some(0), "{shown}");
    let render_row = shown.lines().find(|l| l.starts_with("render")).unwrap_or_else(|| panic!("{shown}"));
    assert!(render_row.contains("1000") && render_row.contains("100") && render_row.contains("path 100"), "{shown}");

    // Replay over the same stored entries, with the instance stopped: the same
    // differences, nothing sent, no row changed.
    inlet.sigterm_and_wait(WAIT);
    let db = setup.path("inbox.db");
    let before = rows_digest(&db).await;
    let candidate = setup.path("plugins/v2.wasm");
    let (out, code) =
        cli(&setup.config, &["plugin", "replay", "orders", "--candidate", candidate.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, Some(1), "differences make the exit status 1: {out}");
    let replayed: Value =
        serde_json::from_str(out.trim_start_matches(|c| c != '{')).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(replayed["entries"], N, "{replayed}");
    for call in ["decode", "render", "classify"] {
        let (live, again) = (&report["counts"][call], &replayed["counts"][call]);
        for field in ["compared", "differing", "parts", "faults"] {
            assert_eq!(live[field], again[field], "{call}.{field}: shadow {live}, replay {again}");
        }
    }
    let differing: BTreeSet<String> = replayed["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| entries[&d["entry"].as_i64().unwrap()].clone())
        .collect();
    let expected: BTreeSet<String> = (0..N).filter(|i| i % 10 == 7).map(|i| format!("wo-{i}")).collect();
    assert_eq!(differing, expected, "replay names exactly the entries whose render differs");
    let live_sampled: BTreeSet<i64> = samples.iter().map(|s| s["entry"].as_i64().unwrap()).collect();
    let replay_ids: BTreeSet<i64> =
        replayed["differences"].as_array().unwrap().iter().map(|d| d["entry"].as_i64().unwrap()).collect();
    assert!(live_sampled.is_subset(&replay_ids), "every entry the shadow sampled is one replay reports");
    assert_eq!(rows_digest(&db).await, before, "replay changed a row");
    assert_eq!(target.requests().len(), N as usize, "replay sent a request");

    // A candidate that answers like the serving plugin: no differences, exit 0.
    let same = setup.path("plugins/v1.wasm");
    let (out, code) = cli(
        &setup.config,
        &["plugin", "replay", "orders", "--candidate", same.to_str().unwrap(), "--limit", "50"],
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("replayed 50 entries"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_sleeps_traps_or_hoards_memory_changes_no_outcome_on_the_serving_path() {
    let target = RecordingTarget::start().await;
    // A small candidate memory cap so hoarding hits it within a few calls, and a short
    // backstop so the sleeping one is abandoned quickly.
    let limits = "\n[route.limits]\nmemory_mib = 48\nkeep_warm_mib = 48\ncall_timeout = \"500ms\"\n";
    let setup = Setup::new(&target, limits);
    let (_inlet, api) = spawn(&setup.config).await;

    let mut keys = Vec::new();
    for kind in ["sleep", "trap", "hoard", "plain"] {
        for i in 0..8 {
            keys.push(format!("{kind}-{i}"));
        }
    }
    for key in &keys {
        api.push(key, 1).await;
    }
    api.all_done(keys.len()).await;

    // Every message was delivered once, by the serving plugin, and took effect.
    let requests = target.requests();
    assert_eq!(requests.len(), keys.len(), "one request per message");
    assert!(requests.iter().all(|r| r.path == SERVING_PATH && r.status == 204), "{:?}", requests.len());
    let delivered: BTreeSet<String> = requests.iter().map(|r| r.key.clone()).collect();
    assert_eq!(delivered, keys.iter().cloned().collect());

    // The candidate's faults are counted apart; the serving plugin had none.
    let faults = |r: &Value, kind: &str| -> u64 {
        ["decode", "render", "classify"].iter().map(|c| r["counts"][c]["faults"][kind].as_u64().unwrap_or(0)).sum()
    };
    // At the shadow's lowest CPU priority this may take long on a busy machine; what
    // fails the test is counting that stops.
    let report = wait_while_progressing("the candidate's faults all counted", WAIT, || async {
        let r = api.shadow(ADMIN).await;
        if faults(&r, "timeout") >= 1 && faults(&r, "trap") >= 8 && faults(&r, "out_of_memory") >= 1 {
            return Progress::Done(r);
        }
        let counted = ["decode", "render", "classify"]
            .iter()
            .map(|c| r["counts"][c]["compared"].as_u64().unwrap_or(0))
            .sum::<u64>()
            + ["timeout", "trap", "out_of_memory"].iter().map(|k| faults(&r, k)).sum::<u64>();
        Progress::At(counted, r.to_string())
    })
    .await;
    assert_eq!(report["counts"]["decode"]["differing"], 0, "faults are not differences: {report}");
    let metrics = api.metrics().await;
    for call in ["decode", "render", "classify"] {
        for kind in ["timeout", "trap", "out_of_memory", "host_memory"] {
            let series = format!("inlet_plugin_faults_total{{route=\"orders\",call=\"{call}\",kind=\"{kind}\"}}");
            assert_eq!(count(&metrics, &series).unwrap_or(0), 0, "{series}");
        }
    }
    let series = "inlet_shadow_faults_total{route=\"orders\",call=\"decode\",kind=\"trap\"}";
    assert!(count(&metrics, series).unwrap_or(0) >= 8, "{series}");
    let done = "inlet_delivery_attempts_total{route=\"orders\",outcome=\"done\"}";
    assert_eq!(count(&metrics, done), Some(keys.len() as u64), "{done}");

    // A candidate that falls behind: every call sleeps until its backstop, so it
    // finishes a few jobs a second while 1,100 messages arrive. Its queue (1,024 jobs)
    // fills and the rest is dropped and counted; the deliveries do not wait for it.
    let records = |r: &Value| -> u64 {
        let call = |c: &str| {
            let faults: u64 = r["counts"][c]["faults"].as_object().unwrap().values().filter_map(Value::as_u64).sum();
            r["counts"][c]["compared"].as_u64().unwrap() + faults
        };
        call("decode") + call("render") + call("classify")
    };
    let before = api.shadow(ADMIN).await;
    assert_eq!(before["counts"]["dropped"], 0, "{before}");
    for i in 0..1100 {
        api.push(&format!("sleep-late-{i}"), 1).await;
    }
    api.all_done(keys.len() + 1100).await;
    let report = api.shadow(ADMIN).await;
    let dropped = report["counts"]["dropped"].as_u64().unwrap();
    // 2,200 jobs were offered (a decode and a delivery per message): each was dropped,
    // is queued (at most 1,024), runs (at most 4 at once) or has run (each run job
    // recorded at least one comparison or fault). None is lost without a count.
    let ran = records(&report) - records(&before);
    assert!(dropped > 0, "{report}");
    assert!(dropped + 1024 + 4 + ran >= 2200, "dropped {dropped}, ran at most {ran}: {report}");
    let metrics = api.metrics().await;
    assert_eq!(count(&metrics, "inlet_shadow_dropped_total{route=\"orders\"}"), Some(dropped));
    assert_eq!(count(&metrics, done), Some(keys.len() as u64 + 1100), "{done}");
    assert_eq!(target.requests().len(), keys.len() + 1100, "one request per message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promotion_and_rollback_are_one_audited_step_each_and_the_routing_file_says_what_serves() {
    let target = RecordingTarget::start().await;
    let setup = Setup::new(&target, "");
    let original = std::fs::read_to_string(&setup.config).unwrap();
    let (_inlet, api) = spawn(&setup.config).await;

    // A viewer may not promote; the team's operator token may, for its route.
    let (status, answer) = api.post("/api/routes/orders/promote", VIEWER).await;
    assert_eq!(status, 403, "{answer}");
    let (status, answer) = api.post("/api/routes/orders/promote", OPERATOR).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["serving"].as_str().map(|s| s.ends_with("plugins/v2.wasm")), Some(true), "{answer}");
    let promoted = std::fs::read_to_string(&setup.config).unwrap();
    assert!(promoted.contains("plugin = \"plugins/v2.wasm\"  # what serves"), "{promoted}");
    assert!(promoted.contains("previous = \"plugins/v1.wasm\""), "{promoted}");
    assert!(!promoted.contains("candidate"), "{promoted}");

    // The instance applied it: the promoted version delivers.
    let route = wait_for("the promoted plugin serves", WAIT, || async {
        let routes = api.get("/api/routes", ADMIN).await;
        let r = routes["routes"].as_array().unwrap().iter().find(|r| r["name"] == "orders").cloned().unwrap();
        r["plugin"].as_str().unwrap().ends_with("plugins/v2.wasm").then_some(r)
    })
    .await;
    assert!(route["previous"].as_str().unwrap().ends_with("plugins/v1.wasm"), "{route}");
    assert!(route["candidate"].is_null(), "{route}");
    api.push("wo-7", 1).await;
    wait_until("wo-7 delivered", WAIT, || async { target.requests().iter().any(|r| r.key == "wo-7") }).await;
    assert_eq!(target.requests().last().unwrap().path, CANDIDATE_PATH);

    // Nothing left to promote: refused, and recorded as refused.
    let (status, answer) = api.post("/api/routes/orders/promote", OPERATOR).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("no candidate"), "{answer}");

    // Rollback from the command line restores the file byte for byte.
    let (out, code) = cli(&setup.config, &["plugin", "rollback", "orders"], &[]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(std::fs::read_to_string(&setup.config).unwrap(), original, "rollback undoes the promotion exactly");
    wait_until("the rolled-back plugin serves", WAIT, || async {
        let routes = api.get("/api/routes", ADMIN).await;
        let r = routes["routes"].as_array().unwrap().iter().find(|r| r["name"] == "orders").cloned().unwrap();
        r["plugin"].as_str().unwrap().ends_with("plugins/v1.wasm") && r["candidate"].is_string()
    })
    .await;
    api.push("wo-17", 1).await;
    wait_until("wo-17 delivered", WAIT, || async { target.requests().iter().any(|r| r.key == "wo-17") }).await;
    assert_eq!(target.requests().last().unwrap().path, SERVING_PATH);

    // A candidate that is not the build its pin names is never promoted.
    let pinned = original.replace(
        "candidate = \"plugins/v2.wasm\"",
        &format!("candidate = {{ path = \"plugins/v2.wasm\", sha256 = \"{}\" }}", "0".repeat(64)),
    );
    std::fs::write(&setup.config, &pinned).unwrap();
    // `inlet check` passes (the route serves without it) but says so.
    let (out, code) = cli(&setup.config, &["check"], &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("warning:") && out.contains("candidate") && out.contains("is refused"), "{out}");
    let (out, code) = cli(&setup.config, &["plugin", "promote", "orders"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("does not load") && out.contains("sha256"), "{out}");
    assert_eq!(std::fs::read_to_string(&setup.config).unwrap(), pinned, "the file is left as it was");

    // Each step is in the audit log with who did it.
    let audit = api.get("/api/audit?limit=100", ADMIN).await;
    let steps: Vec<(String, String, String)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "promote" || a["action"] == "rollback")
        .map(|a| {
            let f = |k: &str| a[k].as_str().unwrap_or_default().to_string();
            (f("actor"), f("action"), f("outcome"))
        })
        .collect();
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    let cli_actor = format!("cli:{user}");
    let expected = [
        ("orders-team".to_string(), "promote".to_string(), "ok".to_string()),
        ("orders-team".to_string(), "promote".to_string(), "refused".to_string()),
        (cli_actor.clone(), "rollback".to_string(), "ok".to_string()),
        (cli_actor, "promote".to_string(), "refused".to_string()),
    ];
    let mut sorted = steps.clone();
    sorted.sort();
    let mut want = expected.to_vec();
    want.sort();
    assert_eq!(sorted, want, "audit: {audit}");
    let promoted =
        audit["audit"].as_array().unwrap().iter().find(|a| a["action"] == "promote" && a["outcome"] == "ok").unwrap();
    assert!(promoted["detail"].as_str().unwrap().contains("plugins/v2.wasm"), "{promoted}");
}
