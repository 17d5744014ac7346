//! `inlet plugin new`, `inlet plugin wit` and `inlet plugin contract`: a product team
//! starts from an empty folder outside Inlet's repository, with only the `inlet`
//! binary, cargo or python3, and the registries. The generated project builds with its
//! own script, passes its own tests, fails them when a report differs, and the
//! component it builds is taken by a running Inlet by hot reload and delivers.
//!
//! The Rust build runs real cargo for wasm32-wasip2 with crates from crates.io, into
//! `$CARGO_TARGET_DIR/plugin-new-cache/rust` so repeated runs are warm. The Python
//! build uses the componentize-py venv `scripts/build-plugins` keeps under
//! `$CARGO_TARGET_DIR/plugins/py-venv` when it is there (the project's own `build.sh`
//! makes a venv of its own otherwise).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::wait_until;

/// Building, compiling a Python component and reloading take a while on a loaded host.
const WAIT: Duration = Duration::from_secs(180);

fn inlet() -> &'static str {
    env!("CARGO_BIN_EXE_inlet")
}

/// The build cache root: the target dir the `inlet` binary was built into.
fn cache_root() -> PathBuf {
    let exe = PathBuf::from(inlet());
    exe.parent().and_then(Path::parent).expect("target/PROFILE/inlet").to_path_buf()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A command with the environment a team's shell would have: none of what cargo sets
/// for this test process (a cargo run from the project must pick its own toolchain and
/// manifest), and `INLET` naming the binary under test.
fn team_command(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir);
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let cargo_set = key == "CARGO" || (key.starts_with("CARGO_") && key != "CARGO_HOME");
        if cargo_set || key == "RUSTUP_TOOLCHAIN" || key == "RUSTC" || key == "INLET_CONFIG" {
            cmd.env_remove(key);
        }
    }
    cmd.env("INLET", inlet()).env("NO_COLOR", "1");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn show(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `inlet plugin new NAME --lang LANG` in `dir`; the project's folder.
fn plugin_new(dir: &Path, name: &str, lang: &str) -> PathBuf {
    let out = run(team_command(inlet(), dir).args(["plugin", "new", name, "--lang", lang]));
    assert!(out.status.success(), "inlet plugin new {name} --lang {lang}: {}", show(&out));
    dir.join(name)
}

/// The project's `./test.sh`, with the build caches of this test run.
fn test_script(project: &Path, lang: &str) -> Output {
    let mut cmd = team_command("./test.sh", project);
    match lang {
        "rust" => {
            cmd.env("CARGO_TARGET_DIR", cache_root().join("plugin-new-cache").join("rust"));
        }
        _ => {
            let tool = cache_root().join("plugins/py-venv/bin/componentize-py");
            if tool.is_file() {
                cmd.env("INLET_COMPONENTIZE_PY", tool);
            }
        }
    }
    run(&mut cmd)
}

/// Every file of a project: (path relative to it, bytes), build outputs left out.
fn project_files(project: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if ["target", "dist", ".venv"].contains(&rel.as_str()) || rel.contains("__pycache__") {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(project, project, &mut out);
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// An HTTP target that records what arrives
// ---------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Received {
    method: String,
    path: String,
    idempotency_key: String,
    content_type: String,
    body: Vec<u8>,
}

struct Target {
    addr: std::net::SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Target {
    async fn start() -> Target {
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let log = received.clone();
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let log = log.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default().to_vec();
                let header =
                    |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                log.lock().unwrap().push(Received {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_string(),
                    idempotency_key: header("idempotency-key"),
                    content_type: header("content-type"),
                    body,
                });
                (axum::http::StatusCode::CREATED, "{\"accepted\":true}")
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Target { addr, received, server }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// SHA-256 of a file, as `/api/routes` shows a plugin's.
fn sha256_hex(path: &Path) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(std::fs::read(path).unwrap());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies `from` over `to` as a deployment does: write beside, rename over.
fn deploy(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

/// A running `inlet run` whose route names `deploy/WASM`, at first an older build
/// (Inlet's work-order plugin, which cannot read the team's events: a message pushed
/// then is parked, never delivered). The project's build is copied over it as a
/// deployment would; the running Inlet takes it by hot reload, and a pushed message is
/// delivered through it to the target.
async fn deploy_and_deliver(project: &Path, wasm: &str, route: &str) {
    let built = project.join("dist").join(wasm);
    assert!(built.is_file(), "{} was not built", built.display());
    let site = tempfile::Builder::new().prefix("inlet-site-").tempdir().unwrap();
    let deployed = site.path().join("deploy").join(wasm);
    std::fs::create_dir(deployed.parent().unwrap()).unwrap();
    deploy(&plugin_path("work_order"), &deployed);
    let target = Target::start().await;
    let port = free_port();
    let config = site.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n[server]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [admin]\nauth = \"none-loopback\"\n\n\
             [[route]]\nname = \"{route}\"\nplugin = \"deploy/{wasm}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"http://{}\" }}\n",
            target.addr
        ),
    )
    .unwrap();
    let mut process = InletProcess::spawn(&config, &[]);
    process.wait_healthy(WAIT).await;
    let http = reqwest::Client::new();
    let serving = || {
        let (http, base) = (http.clone(), process.base.clone());
        async move {
            let text = http.get(format!("{base}/api/routes")).send().await.unwrap().text().await.unwrap();
            let routes: serde_json::Value = serde_json::from_str(&text).unwrap();
            let view = routes["routes"].as_array().unwrap().iter().find(|r| r["name"] == route).cloned();
            view.and_then(|r| r["plugin_sha256"].as_str().map(str::to_owned))
        }
    };
    let old = sha256_hex(&deployed);
    assert_eq!(serving().await.as_deref(), Some(old.as_str()), "the older build serves at first");
    let before = push_envelope(br#"{"id": "evt-76", "key": "order-7"}"#, &[], "m-76");
    assert_eq!(post_push(&http, &process.base, route, &before).await, 200);

    deploy(&built, &deployed);
    let new = sha256_hex(&built);
    let reload = http.post(format!("{}/api/reload", process.base)).send().await.unwrap();
    assert!(reload.status().is_success(), "POST /api/reload: {}", reload.status());
    // The watcher may have taken it first; either way it must come to serve.
    wait_until("the running Inlet to serve the new build", WAIT, || {
        let (serving, new) = (serving(), new.clone());
        async move { serving.await.as_deref() == Some(new.as_str()) }
    })
    .await;

    let data = br#"{"id": "evt-77", "key": "order-7", "amount": 2}"#;
    let envelope = push_envelope(data, &[], "m-77");
    assert_eq!(post_push(&http, &process.base, route, &envelope).await, 200);
    wait_until("the target to receive the event", WAIT, || async { !target.received().is_empty() }).await;
    let received = target.received();
    assert_eq!(received.len(), 1, "only the event pushed after the reload: {received:?}");
    let got = &received[0];
    assert_eq!(got.method, "POST", "{got:?}");
    assert_eq!(got.path, "/events", "{got:?}");
    assert_eq!(got.idempotency_key, "evt-77", "the plugin's dedup key: {got:?}");
    assert_eq!(got.content_type, "application/json", "{got:?}");
    assert_eq!(got.body, data, "the payload as it came: {got:?}");
    process.assert_running();
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_rust_plugin_builds_passes_its_tests_and_serves_after_a_hot_reload() {
    let empty = tempfile::Builder::new().prefix("team-repo-").tempdir().unwrap();
    let project = plugin_new(empty.path(), "acme-orders", "rust");
    let out = test_script(&project, "rust");
    assert!(out.status.success(), "./test.sh of a fresh project: {}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("4 of 4 samples as expected"), "{}", show(&out));

    deploy_and_deliver(&project, "acme_orders.wasm", "acme-orders").await;

    // A report that differs from its golden fails the script, naming the sample.
    let golden = project.join("samples/created/expected.json");
    let text = std::fs::read_to_string(&golden).unwrap();
    assert!(text.contains("\"disposition\": \"done\""), "{text}");
    std::fs::write(&golden, text.replace("\"disposition\": \"done\"", "\"disposition\": \"park\"")).unwrap();
    let out = test_script(&project, "rust");
    assert!(!out.status.success(), "a changed golden must fail the script: {}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("FAIL created"), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 of 4 samples as expected"), "{}", show(&out));

    // So does a plugin whose behaviour changed: `--update` records it, and then it passes.
    std::fs::write(&golden, text).unwrap();
    let lib = project.join("src/lib.rs");
    let code = std::fs::read_to_string(&lib).unwrap();
    std::fs::write(&lib, code.replace("path: \"/events\".into()", "path: \"/v2/events\".into()")).unwrap();
    let out = test_script(&project, "rust");
    assert!(!out.status.success(), "a changed request must fail the script: {}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/v2/events"), "the diff shows it: {}", show(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_python_plugin_builds_passes_its_tests_and_serves_after_a_hot_reload() {
    let empty = tempfile::Builder::new().prefix("team-repo-").tempdir().unwrap();
    let project = plugin_new(empty.path(), "acme-orders", "python");
    let out = test_script(&project, "python");
    assert!(out.status.success(), "./test.sh of a fresh project: {}", show(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("4 of 4 samples as expected"), "{}", show(&out));

    deploy_and_deliver(&project, "acme_orders.wasm", "acme-orders").await;
}

/// Nothing in a generated project points into Inlet's source tree; its pins are the
/// ones Inlet's own plugins build with; its WIT is the host's, byte for byte.
#[test]
fn generated_projects_stand_alone_and_carry_the_hosts_contract() {
    let repo_wit = std::fs::read(repo().join("wit/plugin.wit")).unwrap();
    let repo_dir = repo().canonicalize().unwrap();
    let empty = tempfile::Builder::new().prefix("team-repo-").tempdir().unwrap();
    for lang in ["rust", "python"] {
        let project = plugin_new(empty.path(), &format!("acme-{lang}"), lang);
        let files = project_files(&project);
        assert!(files.len() >= 15, "{lang}: {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>());
        for (path, bytes) in &files {
            let text = String::from_utf8(bytes.clone()).unwrap_or_else(|_| panic!("{lang}/{path}: not UTF-8"));
            for needle in [repo_dir.to_str().unwrap(), env!("CARGO_MANIFEST_DIR"), "../", "..\\"] {
                assert!(!text.contains(needle), "{lang}/{path} mentions `{needle}`");
            }
            for needle in ["plugins/dist", "plugins/Cargo", "build-plugins", "workspace = true", ".workspace"] {
                assert!(!text.contains(needle), "{lang}/{path} points into Inlet's tree: `{needle}`");
            }
            // No absolute file path (`/events` is a request path; a README's example
            // route names a deployment folder).
            for (n, line) in text.lines().enumerate() {
                let absolute = line.split(|c: char| c.is_whitespace() || "\"'=(`<>".contains(c)).any(|word| {
                    ["/home", "/work", "/tmp", "/var", "/usr", "/etc", "/opt", "/root", "/srv", "/nix", "/mnt"]
                        .iter()
                        .any(|root| word.starts_with(root))
                });
                let example = path.ends_with("README.md") && line.contains("/srv/inlet/plugins/");
                assert!(!absolute || example, "{lang}/{path}:{}: an absolute path: {line}", n + 1);
            }
        }
        // Every template file is in the project (one added to templates/ but not to
        // src/plugin_new.rs would be missing), plus the WIT.
        let templates = ["common", lang]
            .iter()
            .map(|part| project_files(&repo().join("templates/plugin").join(part)).len())
            .sum::<usize>();
        assert_eq!(files.len(), templates + 1, "{lang}: {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>());
        let wit = files.iter().find(|(p, _)| p == "wit/plugin.wit").expect("wit/plugin.wit");
        assert_eq!(wit.1, repo_wit, "{lang}: wit/plugin.wit is the host's, byte for byte");
        let file = |name: &str| {
            let (_, bytes) = files.iter().find(|(p, _)| p == name).unwrap_or_else(|| panic!("{lang}: no {name}"));
            String::from_utf8(bytes.clone()).unwrap()
        };
        for sample in ["created", "server-error", "rejected", "not-json"] {
            let expected: serde_json::Value = serde_json::from_str(&file(&format!("samples/{sample}/expected.json")))
                .unwrap_or_else(|e| panic!("{lang}: samples/{sample}/expected.json: {e}"));
            assert!(expected["conclusion"].is_string(), "{lang}/{sample}: a real report: {expected}");
        }
        if lang == "rust" {
            let manifest: toml::Table = file("Cargo.toml").parse().unwrap();
            for (name, dep) in manifest["dependencies"].as_table().unwrap() {
                let version = dep.as_str().or_else(|| dep.get("version")?.as_str()).unwrap_or_default();
                assert!(version.starts_with('='), "{name} is pinned exactly: {dep}");
                let dep = dep.as_table().cloned().unwrap_or_default();
                for key in ["path", "git", "registry", "workspace"] {
                    assert!(!dep.contains_key(key), "{name}: crates.io only, no `{key}`");
                }
            }
            let lock = std::fs::read_to_string(repo().join("plugins/Cargo.lock")).unwrap();
            let bindgen = lock.split("[[package]]").find(|p| p.contains("name = \"wit-bindgen\"\n")).unwrap();
            let version = bindgen.split("version = \"").nth(1).unwrap().split('"').next().unwrap();
            let pinned = manifest["dependencies"]["wit-bindgen"]["version"].as_str().unwrap();
            assert_eq!(pinned, format!("={version}"), "the wit-bindgen Inlet's own plugins build with");
            let toolchain: toml::Table = file("rust-toolchain.toml").parse().unwrap();
            let ours: toml::Table =
                std::fs::read_to_string(repo().join("rust-toolchain.toml")).unwrap().parse().unwrap();
            assert_eq!(toolchain["toolchain"]["channel"], ours["toolchain"]["channel"], "Inlet's channel");
            assert_eq!(toolchain["toolchain"]["targets"], toml::Value::Array(vec!["wasm32-wasip2".into()]));
            assert!(file("src/lib.rs").contains("path: \"wit\""), "bindings from the project's own wit/");
        } else {
            let script = std::fs::read_to_string(repo().join("scripts/build-plugins")).unwrap();
            let version = script.split("componentize_py_version=\"").nth(1).unwrap().split('"').next().unwrap();
            assert!(
                file("requirements.txt").lines().any(|l| l == format!("componentize-py=={version}")),
                "the componentize-py scripts/build-plugins uses ({version})"
            );
        }
    }

    // `inlet plugin wit` is the host's contract byte for byte, on stdout and with --out.
    let out = run(team_command(inlet(), empty.path()).args(["plugin", "wit"]));
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(out.stdout, repo_wit, "inlet plugin wit");
    assert_eq!(inlet::plugin::WIT.as_bytes(), repo_wit, "the embedded WIT is the file bindgen reads");
    let out = run(team_command(inlet(), empty.path()).args(["plugin", "wit", "--out", "contract"]));
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(std::fs::read(empty.path().join("contract/0.1.0/plugin.wit")).unwrap(), repo_wit);
}

#[test]
fn the_cli_names_the_contracts_it_supports_and_refuses_a_used_folder() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(team_command(inlet(), dir.path()).arg("--version"));
    let version = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(version.contains("\nplugin contracts: inlet:plugin@0.1.0\n"), "{version}");
    let out = run(team_command(inlet(), dir.path()).args(["plugin", "contract"]));
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "inlet:plugin@0.1.0\n");
    let out = run(team_command(inlet(), dir.path()).args(["--json", "plugin", "contract"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json, serde_json::json!([{"package": "inlet:plugin@0.1.0", "interface": inlet::plugin::CONTRACT}]));
    // Every supported contract's WIT declares the package it is listed under.
    for c in inlet::plugin::CONTRACTS {
        assert!(c.wit.contains(&format!("\npackage {};\n", c.package)), "{}", c.package);
        assert!(version.contains(c.package), "--version names {}", c.package);
    }

    // A folder that holds anything is refused, and left as it was.
    std::fs::create_dir(dir.path().join("used")).unwrap();
    std::fs::write(dir.path().join("used/notes.txt"), "mine").unwrap();
    let out = run(team_command(inlet(), dir.path()).args(["plugin", "new", "acme", "--lang", "rust", "--dir", "used"]));
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"), "{}", show(&out));
    let left: Vec<_> = std::fs::read_dir(dir.path().join("used")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("notes.txt")]);
    // An empty one is fine; a bad name is refused before anything is written.
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out =
        run(team_command(inlet(), dir.path()).args(["plugin", "new", "acme", "--lang", "python", "--dir", "empty"]));
    assert!(out.status.success(), "{}", show(&out));
    assert!(dir.path().join("empty/src/app.py").is_file());
    let out = run(team_command(inlet(), dir.path()).args(["plugin", "new", "../evil", "--lang", "rust"]));
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(!dir.path().join("../evil").exists());
}
