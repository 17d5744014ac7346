//! The `inlet` binary as an operator uses it: `check` and the `inbox` commands.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use inlet::clock::Millis;
use inlet::inbox::{self, NewEntry, Status};

fn inlet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inlet")).args(args).env("NO_COLOR", "1").output().expect("run inlet")
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
fn check_accepts_a_good_file_and_lists_every_error_of_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_config(dir.path(), &common::plugin_path("work_order"));
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
    let cfg = write_config(dir.path(), &common::plugin_path("work_order"));
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

    let out = inlet(&["inbox", "-c", &cfg, "show", &id.to_string()]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show prints JSON");
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

#[test]
fn a_plugin_built_against_another_contract_version_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &common::plugin_path("future_contract"));
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
}

/// A directory of routing files: the platform's (shared settings) and two teams'.
fn write_team_dir(dir: &Path, team_b_routes: &str) -> std::path::PathBuf {
    let routes = dir.join("routes.d");
    std::fs::create_dir_all(&routes).unwrap();
    let good = common::plugin_path("work_order");
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
        push_route("b-future", &common::plugin_path("future_contract"), "{ kind = \"log\" }"),
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

    std::fs::write(
        routes.join("team-b.toml"),
        push_route("b", &common::plugin_path("work_order"), "{ kind = \"log\" }"),
    )
    .unwrap();
    let out = inlet(&["check", routes.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ok (2 routes"), "{}", text(&out.stdout));
}

#[test]
fn check_of_a_directory_names_both_files_of_a_duplicate_route_or_store() {
    let dir = tempfile::tempdir().unwrap();
    let routes = write_team_dir(dir.path(), &push_route("a", &common::plugin_path("work_order"), "{ kind = \"log\" }"));
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
