//! The `inlet` binary as an operator uses it: `check` and the `inbox` commands.

use std::path::Path;
use std::process::{Command, Output};

use inlet::clock::Millis;
use inlet::inbox::{self, NewEntry, Status};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;

fn inlet(args: &[&str]) -> Output {
    inlet_with(args, &[])
}

/// `inlet ARGS` with `envs` set, and neither `RUST_LOG` nor `INLET_CONFIG` inherited.
fn inlet_with(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inlet"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("INLET_CONFIG")
        .envs(envs.iter().copied())
        .output()
        .expect("run inlet")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_config(dir: &Path, plugin: &Path) -> String {
    let path = dir.join("inlet.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n[[route]]\nname = \"wo\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            plugin.display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn version_names_the_commit_the_contracts_and_the_schema_range_as_the_metric_does() {
    // The commit is the checkout's HEAD, as git says it (build.rs asks git, or takes
    // INLET_BUILD_COMMIT when a builder sets it).
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git runs");
    assert!(head.status.success(), "the tests run in a git checkout");
    let head = text(&head.stdout).trim().to_string();
    let commit = std::env::var("INLET_BUILD_COMMIT").ok().filter(|c| !c.trim().is_empty()).unwrap_or(head);
    let version = env!("CARGO_PKG_VERSION");

    let out = inlet(&["-V"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("inlet {version} (commit {commit}, plugin contract inlet:plugin@0.1.0)")
    );

    let out = inlet(&["--version"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let long = text(&out.stdout);
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(lines[0], format!("inlet {version}"), "{long}");
    assert_eq!(lines[1], format!("commit:           {commit}"), "{long}");
    assert_eq!(lines[2], "plugin contracts: inlet:plugin@0.1.0", "{long}");
    let newest = |url: &str| inlet::inbox::schema::known(url).unwrap().last().unwrap().version;
    let (postgres, sqlite) = (newest("postgres://"), newest("sqlite:"));
    assert!(postgres >= 9 && sqlite >= 8, "every migration released so far is embedded");
    assert!(lines[3].starts_with(&format!("inbox schema:     postgres 1–{postgres}, sqlite 1–{sqlite} (")), "{long}");

    // The metric carries the same facts, as labels of a constant 1.
    let metrics = inlet::telemetry::Metrics::new().render();
    let sample = format!(
        "inlet_build_info{{version=\"{version}\",commit=\"{commit}\",contracts=\"inlet:plugin@0.1.0\",\
         schema_postgres=\"{postgres}\",schema_sqlite=\"{sqlite}\"}} 1"
    );
    assert!(metrics.lines().any(|l| l == sample), "{sample} missing:\n{metrics}");
}

#[test]
fn check_accepts_a_good_file_and_lists_every_error_of_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_config(dir.path(), &plugin_path("work_order"));
    let out = inlet(&["check", &good]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok (1 routes"), "{}", text(&out.stdout));

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[route]]\nname = \"a\"\nplugin = \"nope.wasm\"\nsource = { kind = \"push\" }\ntarget = { kind = \"http\" }\n",
    )
    .unwrap();
    let out = inlet(&["check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("bad.toml:3:10: route[0].plugin: plugin file"), "{err}");
    assert!(err.contains("bad.toml:5:10: route[0].target: `url` is required for an http target"), "{err}");

    // A file that exists but is not a component is caught when plugins are loaded.
    let not_wasm = dir.path().join("not.wasm");
    std::fs::write(&not_wasm, b"definitely not wasm").unwrap();
    let cfg = write_config(dir.path(), &not_wasm);
    let out = inlet(&["check", &cfg]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("is not a valid WebAssembly component"), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_commands_list_show_requeue_park_and_purge() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &plugin_path("work_order"));
    let store = inbox::open(&format!("sqlite://{}", dir.path().join("inbox.db").display()), 2).await.unwrap();
    let now: Millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let parked = NewEntry {
        route: "wo".into(),
        dedup_key: "m-1".into(),
        decoded: None,
        raw_data: b"garbage".to_vec(),
        attributes: vec![],
        message_id: "m-1".into(),
        publish_time: None,
        delivery_attempt: None,
        status: Status::Parked,
        last_error: Some("decode failed: garbage".into()),
    };
    let id = store.insert(&parked, now).await.unwrap().id();
    let ignored = store
        .insert(&NewEntry { dedup_key: "m-2".into(), status: Status::Ignored, ..parked.clone() }, now - 3_600_000)
        .await
        .unwrap()
        .id();

    let out = inlet(&["inbox", "-c", &cfg, "list", "--status", "parked"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    assert!(listing.contains("PARKED") && listing.contains("decode failed: garbage"), "{listing}");
    assert!(!listing.contains("IGNORED"), "{listing}");

    let out = inlet(&["inbox", "-c", &cfg, "show", &id.to_string(), "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show --json prints JSON");
    assert_eq!(shown["raw_data"]["text"], "garbage");
    assert_eq!(shown["status"], "PARKED");

    let out = inlet(&["inbox", "-c", &cfg, "requeue", &id.to_string()]);
    assert!(out.status.success());
    assert_eq!(store.get(id).await.unwrap().unwrap().status, Status::Open);
    let out = inlet(&["inbox", "-c", &cfg, "requeue", &ignored.to_string()]);
    assert_eq!(out.status.code(), Some(1), "an ignored entry is not requeued");

    let out = inlet(&["inbox", "-c", &cfg, "park", &id.to_string(), "--reason", "waiting for the vendor"]);
    assert!(out.status.success());
    let e = store.get(id).await.unwrap().unwrap();
    assert_eq!((e.status, e.last_error.as_deref()), (Status::Parked, Some("parked by hand: waiting for the vendor")));

    let out = inlet(&["inbox", "-c", &cfg, "requeue", "--all-parked", "wo"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout).trim(), format!("requeued {id}"));

    let out = inlet(&["inbox", "-c", &cfg, "purge", "--older-than", "30m"]);
    assert_eq!(text(&out.stdout).trim(), "purged 1 finished entries");
    assert!(store.get(ignored).await.unwrap().is_none());
    assert!(store.get(id).await.unwrap().is_some(), "open entries stay");
}

/// `pubsub seek --route` names routes that pull: a push route's subscription is not
/// in the routing file, and an unknown route is no route; both are refused before
/// Pub/Sub is asked anything.
#[test]
fn pubsub_seek_refuses_a_push_route_and_an_unknown_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &plugin_path("work_order"));
    let to = "2026-08-01T10:00:00.412Z";
    let out = inlet(&["--config", &config, "pubsub", "seek", "--route", "wo", "--to", to]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("route wo is a push route"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--subscription"), "{}", text(&out.stderr));
    let out = inlet(&["--config", &config, "pubsub", "seek", "--route", "nope", "--to", to]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no route nope in"), "{}", text(&out.stderr));
}

#[test]
fn a_plugin_built_against_another_contract_version_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &plugin_path("future_contract"));
    let out = inlet(&["check", &cfg]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("was built against plugin contract 0.2.0, but this host supports 0.1.0"), "{err}");
}

/// The routing files shipped in `config/` stay valid, plugins included.
#[test]
fn the_shipped_example_configs_pass_check() {
    for file in ["config/example.toml", "config/pubsub-example.toml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let out = inlet(&["check", path.to_str().unwrap()]);
        assert!(out.status.success(), "{file}: {}{}", text(&out.stdout), text(&out.stderr));
    }
    // The outbox example reads its database's URL from the environment.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/outbox-example.toml");
    let out =
        inlet_with(&["check", path.to_str().unwrap()], &[("ORDERS_DB_URL", "postgres://orders@127.0.0.1:5432/orders")]);
    assert!(out.status.success(), "outbox-example.toml: {}{}", text(&out.stdout), text(&out.stderr));
    // The claim-check example reads its store's token from the environment.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/claim-check-example.toml");
    let out = inlet_with(&["check", path.to_str().unwrap()], &[("PAYLOADS_TOKEN", "a-token-for-the-example-check")]);
    assert!(out.status.success(), "claim-check-example.toml: {}{}", text(&out.stdout), text(&out.stderr));
}

/// A directory of routing files: the platform's (shared settings) and two teams'.
fn write_team_dir(dir: &Path, team_b_routes: &str) -> std::path::PathBuf {
    let routes = dir.join("routes.d");
    std::fs::create_dir_all(&routes).unwrap();
    let good = plugin_path("work_order");
    std::fs::write(routes.join("00-platform.toml"), "[store]\nurl = \"sqlite://inbox.db\"\n").unwrap();
    std::fs::write(
        routes.join("team-a.toml"),
        format!(
            "[[route]]\nname = \"a\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            good.display()
        ),
    )
    .unwrap();
    std::fs::write(routes.join("team-b.toml"), team_b_routes).unwrap();
    routes
}

fn push_route(name: &str, plugin: &Path, target: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {target}\n",
        plugin.display()
    )
}

#[test]
fn check_of_a_directory_lists_every_broken_route_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let team_b = format!(
        "{}\n{}",
        push_route("b-future", &plugin_path("future_contract"), "{ kind = \"log\" }"),
        push_route("b-missing", Path::new("missing.wasm"), "{ kind = \"log\" }"),
    );
    let routes = write_team_dir(dir.path(), &team_b);
    let out = inlet(&["check", routes.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("team-b.toml:9:10: route[1].plugin: plugin file"), "{err}");
    assert!(err.contains("team-b.toml: route `b-future`: "), "{err}");
    assert!(err.contains("was built against plugin contract 0.2.0"), "{err}");
    assert!(err.contains("error: 2 of 3 routes refused: b-missing, b-future"), "{err}");
    assert!(!err.contains("route `a`"), "team a is fine: {err}");

    std::fs::write(routes.join("team-b.toml"), push_route("b", &plugin_path("work_order"), "{ kind = \"log\" }"))
        .unwrap();
    let out = inlet(&["check", routes.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok (2 routes"), "{}", text(&out.stdout));
}

#[test]
fn check_of_a_directory_names_both_files_of_a_duplicate_route_or_store() {
    let dir = tempfile::tempdir().unwrap();
    let routes = write_team_dir(dir.path(), &push_route("a", &plugin_path("work_order"), "{ kind = \"log\" }"));
    let out = inlet(&["check", routes.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let a = routes.join("team-a.toml").display().to_string();
    let b = routes.join("team-b.toml").display().to_string();
    assert!(err.contains(&format!("{b}:2:8: route[0].name: route name `a` is already used at {a}:2")), "{err}");

    std::fs::write(routes.join("team-b.toml"), "[store]\nurl = \"sqlite://mine.db\"\n").unwrap();
    let out = inlet(&["check", routes.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let platform = routes.join("00-platform.toml").display().to_string();
    assert!(err.contains(&format!("{b}:1:1: store: `[store]` is already declared at {platform}:1")), "{err}");
}

/// `inlet inbox` reads only the store: a missing plugin file and an unset target
/// secret (both fine for an operator repairing the inbox) do not stop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_commands_need_only_the_store_section() {
    let dir = tempfile::tempdir().unwrap();
    let team_b = push_route(
        "b",
        Path::new("gone.wasm"),
        "{ kind = \"http\", url = \"http://engine:8080\", headers = { authorization = \"Bearer ${INLET_TEST_UNSET_SECRET}\" } }",
    );
    let routes = write_team_dir(dir.path(), &team_b);
    let single = dir.path().join("single.toml");
    std::fs::write(&single, format!("[store]\nurl = \"sqlite://routes.d/inbox.db\"\n\n{team_b}")).unwrap();
    let url = format!("sqlite://{}", routes.join("inbox.db").display());
    let store = inbox::open(&url, 2).await.unwrap();
    let now: Millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let entry = NewEntry {
        route: "b".into(),
        dedup_key: "m-1".into(),
        decoded: None,
        raw_data: b"kept".to_vec(),
        attributes: vec![],
        message_id: "m-1".into(),
        publish_time: None,
        delivery_attempt: None,
        status: Status::Parked,
        last_error: Some("waiting for team b".into()),
    };
    store.insert(&entry, now).await.unwrap();

    for config in [routes.to_str().unwrap(), single.to_str().unwrap()] {
        let out = Command::new(env!("CARGO_BIN_EXE_inlet"))
            .args(["inbox", "-c", config, "list", "--route", "b"])
            .env_remove("INLET_TEST_UNSET_SECRET")
            .output()
            .unwrap();
        assert!(out.status.success(), "{config}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("waiting for team b"), "{config}: {}", text(&out.stdout));
    }
    // `check` of the same files does complain, naming both problems.
    let out = inlet(&["check", single.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(err.contains("INLET_TEST_UNSET_SECRET") && err.contains("gone.wasm"), "{err}");
}

fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A routing file naming only a store.
fn store_only_config(dir: &Path, url: &str) -> String {
    let path = dir.join("store.toml");
    std::fs::write(&path, format!("[store]\nurl = \"{url}\"\n")).unwrap();
    path.display().to_string()
}

fn decoded_entry(route: &str, key: &str, dedup: &str, status: Status) -> NewEntry {
    NewEntry {
        route: route.into(),
        dedup_key: dedup.into(),
        decoded: Some(inbox::Decoded {
            event_type: "test".into(),
            correlation_key: key.into(),
            schema_version: None,
            body: b"{}".to_vec(),
        }),
        raw_data: dedup.as_bytes().to_vec(),
        attributes: vec![],
        message_id: dedup.into(),
        publish_time: None,
        delivery_attempt: None,
        status,
        last_error: (status == Status::Parked).then(|| format!("{dedup} is stuck")),
    }
}

/// Entries in every state, in this id order: d1 DONE, p1 PARKED, o1 OPEN, d2 DONE,
/// p2 PARKED, o2 OPEN, i1 IN_PROGRESS, ig IGNORED. Returns the ids by name.
async fn entries_in_every_state(store: &dyn inbox::Store) -> std::collections::HashMap<&'static str, i64> {
    let now = now_ms();
    let mut ids = std::collections::HashMap::new();
    let claim = |limit| inbox::ClaimRequest {
        route: "busy",
        owner: "test",
        limit,
        now,
        lease_ms: 600_000,
        ordered: false,
        parked_blocks: false,
        share: None,
    };
    for (name, route, status) in [
        ("d1", "busy", Status::Open),
        ("p1", "wo", Status::Parked),
        ("o1", "wo", Status::Open),
        ("d2", "busy", Status::Open),
        ("p2", "wo", Status::Parked),
        ("o2", "wo", Status::Open),
        ("i1", "busy", Status::Open),
        ("ig", "wo", Status::Ignored),
    ] {
        let id = store.insert(&decoded_entry(route, name, name, status), now).await.unwrap().id();
        ids.insert(name, id);
        if route == "busy" {
            let claimed = store.claim(&claim(1)).await.unwrap();
            assert_eq!(claimed.iter().map(|c| c.entry.id).collect::<Vec<_>>(), vec![id]);
            if name != "i1" {
                store.settle(id, &claimed[0].lease, now, &inbox::Settlement::Done).await.unwrap();
            }
        }
    }
    ids
}

/// The ids in the `ID` column of an `inbox list` table.
fn listed_ids(table: &str) -> Vec<i64> {
    let rows = table.lines().filter(|l| l.split_whitespace().nth(1).is_some_and(|s| s.parse::<Status>().is_ok()));
    rows.map(|l| l.split_whitespace().next().unwrap().parse().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_list_starts_from_what_needs_attention_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    inbox_list_starts_from_what_needs_attention(dir.path(), &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_list_starts_from_what_needs_attention_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let pg = TestPg::new().await;
    inbox_list_starts_from_what_needs_attention(dir.path(), &pg.url).await;
}

async fn inbox_list_starts_from_what_needs_attention(dir: &Path, url: &str) {
    let store = inbox::open(url, 2).await.unwrap();
    let ids = entries_in_every_state(store.as_ref()).await;
    let id = |names: &[&str]| names.iter().map(|n| ids[n]).collect::<Vec<i64>>();
    let cfg = store_only_config(dir, url);

    // Parked first, then open, in flight, finished; newest first within each.
    let out = inlet(&["inbox", "list", "-c", &cfg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(listed_ids(&table), id(&["p2", "p1", "o2", "o1", "i1", "ig", "d2", "d1"]), "{table}");
    assert!(table.lines().last().unwrap().starts_with("8 of 8 entries"), "{table}");

    let out = inlet(&["inbox", "list", "-c", &cfg, "--limit", "3"]);
    let table = text(&out.stdout);
    assert_eq!(listed_ids(&table), id(&["p2", "p1", "o2"]), "{table}");
    let summary = table.lines().last().unwrap();
    assert!(summary.contains("3 of 8 entries"), "{summary}");
    assert!(summary.contains("(PARKED 2, OPEN 2, IN_PROGRESS 1, DONE 2, IGNORED 1)"), "{summary}");
    assert!(summary.contains("5 more: narrow with --route, --status or --key, or raise --limit"), "{summary}");

    let out = inlet(&["--json", "inbox", "list", "-c", &cfg, "--limit", "3", "--route", "wo"]);
    let listing: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list --json prints JSON");
    let shown: Vec<i64> = listing["entries"].as_array().unwrap().iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert_eq!(shown, id(&["p2", "p1", "o2"]), "{listing}");
    assert_eq!(
        (listing["order"].as_str(), listing["matching"].as_i64(), listing["more"].as_i64()),
        (Some("attention"), Some(5), Some(2))
    );
    assert_eq!(
        listing["by_status"],
        serde_json::json!({ "PARKED": 2, "OPEN": 2, "IN_PROGRESS": 0, "DONE": 0, "IGNORED": 1 })
    );

    // A state filter lists oldest first and pages with --after.
    let out = inlet(&["inbox", "list", "-c", &cfg, "--status", "parked", "--limit", "1"]);
    let table = text(&out.stdout);
    assert_eq!(listed_ids(&table), id(&["p1"]), "{table}");
    assert!(table.contains(&format!("1 more: --after {} for the next page", ids["p1"])), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_is_accepted_anywhere_on_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &plugin_path("work_order"));
    let store = inbox::open(&format!("sqlite://{}", dir.path().join("inbox.db").display()), 2).await.unwrap();
    let id = store.insert(&decoded_entry("wo", "k", "m-1", Status::Parked), now_ms()).await.unwrap().id();
    let expect = "m-1 is stuck";
    for args in [
        vec!["inbox", "list", "-c", &cfg],
        vec!["inbox", "list", "--config", &cfg],
        vec!["-c", &cfg, "inbox", "list"],
        vec!["inbox", "-c", &cfg, "list"],
        vec!["inbox", "list", "--status", "parked", "--config", &cfg],
    ] {
        let out = inlet(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains(expect), "{args:?}: {}", text(&out.stdout));
    }
    let out = inlet_with(&["inbox", "show", &id.to_string()], &[("INLET_CONFIG", &cfg)]);
    assert!(out.status.success() && text(&out.stdout).contains(expect), "INLET_CONFIG: {}", text(&out.stderr));
    for args in [vec!["check", &cfg], vec!["check", "-c", &cfg], vec!["-c", &cfg, "check"]] {
        let out = inlet(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    let out = inlet(&["inbox", "list"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: no routing file: pass --config FILE (or set INLET_CONFIG)\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_commands_print_tables_by_default_and_json_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &plugin_path("work_order"));
    let store = inbox::open(&format!("sqlite://{}", dir.path().join("inbox.db").display()), 2).await.unwrap();
    let mut binary = decoded_entry("wo", "k", "m-1", Status::Parked);
    binary.raw_data = vec![0xff, 0x00, 0x41];
    let id = store.insert(&binary, 1_785_578_400_000).await.unwrap().id();
    let out = inlet(&["inbox", "-c", &cfg, "requeue", &id.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = inlet(&["inbox", "-c", &cfg, "show", &id.to_string()]);
    let shown = text(&out.stdout);
    for line in [
        "status          OPEN",
        "correlation key k",
        "received        2026-08-01T10:00:00Z",
        "raw data        (base64) /wBB",
        "body            {}",
    ] {
        assert!(shown.contains(line), "`{line}` missing:\n{shown}");
    }
    let out = inlet(&["inbox", "-c", &cfg, "show", &id.to_string(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["raw_data"]["base64"].as_str(), json["received_at"].as_i64()),
        (Some("/wBB"), Some(1_785_578_400_000))
    );

    let out = inlet(&["inbox", "-c", &cfg, "stats"]);
    let table = text(&out.stdout);
    assert!(table.starts_with("ROUTE") && table.lines().nth(1).unwrap().starts_with("wo "), "{table}");
    let out = inlet(&["inbox", "-c", &cfg, "stats", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["counts"],
        serde_json::json!([{ "route": "wo", "status": "OPEN", "count": 1, "oldest_received_at": 1_785_578_400_000i64 }])
    );

    let out = inlet(&["inbox", "-c", &cfg, "audit"]);
    let table = text(&out.stdout);
    assert!(table.starts_with("    ID  AT") && table.contains("requeue     wo"), "{table}");
    let out = inlet(&["inbox", "-c", &cfg, "audit", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["audit"][0]["action"].as_str(), json["audit"][0]["subject"].as_str()),
        (Some("requeue"), Some(format!("entry {id}").as_str()))
    );

    // A repair answers in JSON too, one object per line; a missing entry is one error line.
    let out = inlet(&["inbox", "-c", &cfg, "--json", "park", &id.to_string(), "--reason", "vendor"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json, serde_json::json!({ "entry": id, "action": "park", "status": "PARKED" }));
    let out = inlet(&["inbox", "-c", &cfg, "show", "999999"]);
    assert_eq!((out.status.code(), text(&out.stderr)), (Some(1), "error: no entry 999999\n".to_string()));
    let out = inlet(&["inbox", "-c", &cfg, "requeue", "--all-parked", "nothing-here"]);
    assert_eq!(out.status.code(), Some(1), "nothing to requeue is an error");
    assert!(text(&out.stderr).starts_with("error: nothing to requeue"), "{}", text(&out.stderr));
}

/// PostgreSQL's `relation … already exists, skipping` notices and Inlet's own progress
/// lines (the audit log line) stay out of the tools' output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_notices_and_progress_lines_stay_out_of_cli_output() {
    let dir = tempfile::tempdir().unwrap();
    let pg = TestPg::new().await;
    let store = inbox::open(&pg.url, 2).await.unwrap();
    let id = store.insert(&decoded_entry("wo", "k", "m-1", Status::Parked), now_ms()).await.unwrap().id();
    let cfg = store_only_config(dir.path(), &pg.url);
    for args in [vec!["inbox", "-c", &cfg, "stats"], vec!["inbox", "-c", &cfg, "requeue", &id.to_string()]] {
        // The schema exists already: every command opens the store and checks it.
        let out = inlet(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert_eq!(text(&out.stderr), "", "{args:?} printed to stderr");
        assert!(!text(&out.stdout).contains("already exists"), "{args:?}: {}", text(&out.stdout));
    }
    // Not even at `RUST_LOG=info`: the server is asked not to send them.
    let out = inlet_with(&["inbox", "-c", &cfg, "stats"], &[("RUST_LOG", "info")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("already exists"), "{}", text(&out.stderr));
}

/// A row whose attributes no longer parse (damaged by hand or by a bad restore) does not
/// hide the rest of the inbox: `inbox list` lists it with the others and `inbox show`
/// shows it, saying what is unreadable, so it can be found and repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_read_past_a_row_whose_attributes_are_broken() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inbox.db").display());
    let cfg = store_only_config(dir.path(), &url);
    let store = inbox::open(&url, 2).await.unwrap();
    let good = store.insert(&decoded_entry("wo", "k1", "m-1", Status::Open), now_ms()).await.unwrap().id();
    let bad = store.insert(&decoded_entry("wo", "k2", "m-2", Status::Open), now_ms()).await.unwrap().id();
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query("UPDATE inbox_entry SET attributes = 'not json' WHERE id = ?").bind(bad).execute(&pool).await.unwrap();
    pool.close().await;

    let out = inlet(&["inbox", "list", "-c", &cfg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(listed_ids(&text(&out.stdout)), vec![bad, good], "{}", text(&out.stdout));

    let out = inlet(&["inbox", "show", "-c", &cfg, &bad.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("UNREADABLE      attributes: expected ident at line 1 column 2 (the claim parks this entry"),
        "{shown}"
    );
    assert!(shown.contains("dedup key       m-2"), "{shown}");
    let out = inlet(&["inbox", "show", "-c", &cfg, &bad.to_string(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["unreadable"].as_str().is_some_and(|w| w.starts_with("attributes: ")), "{json}");
    let out = inlet(&["inbox", "show", "-c", &cfg, &good.to_string(), "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.get("unreadable"), None, "{json}");
}

/// `inlet plugin shadow` pointed at something that is not an Inlet admin API, which
/// answers without end: it reads no more than a report can be long and says so,
/// instead of filling its memory.
#[test]
fn plugin_shadow_reads_a_bounded_answer() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = conn.read(&mut request);
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n").unwrap();
        let chunk = vec![b' '; 64 << 10];
        let mut sent = 0usize;
        // Until the client hangs up (or 1 GiB, so a client that reads all cannot hang the test).
        while sent < (1 << 30) && conn.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
        sent
    });
    let out = inlet(&["plugin", "shadow", "orders", "--admin-url", &format!("http://{addr}")]);
    let sent = server.join().unwrap();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("answered more than 8 MiB, more than any shadow report"), "{err}");
    assert!(sent < 64 << 20, "the client stopped reading early: the server wrote {sent} bytes");
}
