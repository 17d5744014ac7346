//! The web console in a real browser: a real `inlet` process on
//! SQLite, a real HTTP target that refuses two sets of keys at first (two failure
//! groups) and is then fixed, and headless Chromium driven by playwright-core
//! (`tests/console/drive.mjs`). An operator signs in, opens the overview and a failure
//! group, dry-runs its requeue (the count shown), requeues it and sees the entries
//! delivered; a viewer sees no write buttons and its forged POSTs are refused.
//!
//! Needs `node`, `/usr/bin/chromium` and playwright-core: `scripts/ensure-browser`
//! installs them and prints the folder for `INLET_CONSOLE_NODE_MODULES`
//! (`scripts/test` exports it). Missing, the test fails and says so.

use std::path::PathBuf;
use std::time::Duration;

use inlet_testkit::camunda::{FakeCamunda, Reply};
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_envelope;
use inlet_testkit::wait::wait_for;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
const OPS: &str = "console-ops-token-0123456789";
const VIEWER: &str = "console-viewer-token-0123456789";
const ROOT: &str = "console-root-token-0123456789";
const TEAM: &str = "console-team-token-0123456789";
/// Keys the target refuses with "2 executions match" (parked at once): the group the
/// browser requeues.
const MULTI: [&str; 6] = ["multi-1", "multi-2", "multi-3", "multi-4", "multi-5", "multi-6"];
/// Keys the target refuses with 403: the group left alone.
const GONE: [&str; 3] = ["gone-1", "gone-2", "gone-3"];
/// Keys delivered at once.
const FINE: [&str; 4] = ["fine-1", "fine-2", "fine-3", "fine-4"];

/// What the browser driver needs, or a loud failure naming what is missing.
fn browser_tools() -> (PathBuf, PathBuf) {
    let modules = std::env::var_os("INLET_CONSOLE_NODE_MODULES").map(PathBuf::from).unwrap_or_else(|| {
        panic!("INLET_CONSOLE_NODE_MODULES is not set: run `scripts/ensure-browser` and export its last line")
    });
    assert!(
        modules.join("playwright-core").is_dir(),
        "no playwright-core in {} (INLET_CONSOLE_NODE_MODULES): run scripts/ensure-browser",
        modules.display()
    );
    let chromium = PathBuf::from("/usr/bin/chromium");
    assert!(
        chromium.is_file(),
        "{} is missing: run scripts/ensure-browser (apt-get install chromium)",
        chromium.display()
    );
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.is_ok_and(|o| o.status.success()),
        "node is not installed: the console test runs tests/console/drive.mjs with it"
    );
    (modules, chromium)
}

fn work_order(key: &str) -> Vec<u8> {
    format!(r#"{{"workOrderId":"{key}","completedItems":1,"completionTimestamp":"2026-08-01T10:00:00Z"}}"#).into_bytes()
}

async fn api(http: &reqwest::Client, base: &str, path: &str, token: &str) -> Value {
    let r = http.get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {text}"))
}

/// A real `inlet` on SQLite with two push routes (`orders` to `target`, `audit-trail` to
/// the log) and four tokens: `ops` (operator), `watcher` (viewer, payloads), `team`
/// (operator of `audit-trail` only) and `root` (admin, from a file).
async fn start(target: &str) -> (InletProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("root.token"), format!("{ROOT}\n")).unwrap();
    let config = dir.path().join("inlet.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://inbox.db\"\n\n\
             [admin]\n\
             [[admin.token]]\nname = \"ops\"\nrole = \"operator\"\nsecret = \"${{T_OPS}}\"\n\
             [[admin.token]]\nname = \"watcher\"\nrole = \"viewer\"\nsecret = \"${{T_VIEWER}}\"\npayloads = true\n\
             [[admin.token]]\nname = \"team\"\nrole = \"operator\"\nsecret = \"${{T_TEAM}}\"\nroutes = [\"audit-trail\"]\n\
             [[admin.token]]\nname = \"root\"\nrole = \"admin\"\nsecret_file = \"root.token\"\n\n\
             [[route]]\nname = \"orders\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"{target}\", timeout = \"5s\" }}\nparked = \"pass\"\n\n\
             [[route]]\nname = \"audit-trail\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
            plugin = plugin_path("work_order").display(),
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(
        &config,
        &["--listen", &listen, "--poll", "20ms"],
        &[("T_OPS", OPS), ("T_VIEWER", VIEWER), ("T_TEAM", TEAM)],
    );
    inlet.wait_healthy(WAIT).await;
    (inlet, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_repairs_a_failure_group_in_the_browser_and_a_viewer_cannot() {
    let (modules, chromium) = browser_tools();
    let camunda = FakeCamunda::with_behaviour(|key, _| {
        if key.starts_with("multi-") {
            Reply::SeveralMatch
        } else if key.starts_with("gone-") {
            Reply::Status(403)
        } else {
            Reply::Ok
        }
    })
    .await;
    let (mut inlet, _dir) = start(&camunda.url()).await;
    let base = inlet.base.clone();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();

    // A payload with markup in it: the console must show it as text.
    for (i, key) in MULTI.iter().chain(&GONE).chain(&FINE).enumerate() {
        let envelope = push_envelope(&work_order(key), &[("note", "<script>alert(1)</script>")], &format!("m-{i}"));
        let r = http
            .post(format!("{base}/push/orders"))
            .header("content-type", "application/json")
            .body(envelope.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "push {key}: {}", r.text().await.unwrap());
    }
    let groups = wait_for("two failure groups with every refused key parked", WAIT, || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let groups = api(&http, &base, "/api/failures?route=orders", OPS).await["groups"].clone();
            let sizes: Vec<i64> = groups.as_array()?.iter().map(|g| g["parked"].as_i64().unwrap_or(0)).collect();
            (sizes == [MULTI.len() as i64, GONE.len() as i64]).then_some(groups)
        }
    })
    .await;
    wait_for("the good keys delivered", WAIT, || async {
        FINE.iter().all(|k| camunda.deliveries_for(k).iter().any(|d| d.status == 204)).then_some(())
    })
    .await;
    let multi_group = groups[0]["fingerprint"].as_str().unwrap().to_string();
    assert!(multi_group.contains("executions match"), "{groups:#}");
    // The target is fixed: from now on it correlates every message.
    camunda.set_behaviour(|_, _| Reply::Ok);
    let refused_before: Vec<usize> = MULTI.iter().map(|k| camunda.deliveries_for(k).len()).collect();

    let artifacts = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/console/drive.mjs");
    let driver = tokio::process::Command::new("node")
        .arg(&script)
        .env("INLET_CONSOLE_NODE_MODULES", &modules)
        .env("INLET_CHROMIUM", &chromium)
        .env("BASE", &base)
        .env("OPS_TOKEN", OPS)
        .env("VIEWER_TOKEN", VIEWER)
        .env("ROUTE", "orders")
        .env("GROUP_TEXT", "executions match")
        .env("EXPECT_GROUP", MULTI.len().to_string())
        .env("OTHER_GROUP_TEXT", "answered 403")
        .env("EXPECT_PARKED", (MULTI.len() + GONE.len()).to_string())
        .env("EXPECT_DONE", (MULTI.len() + FINE.len()).to_string())
        .env("RATE", "3")
        .env("ARTIFACTS", &artifacts)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), driver)
        .await
        .expect("the browser driver finishes within 5 minutes")
        .expect("node runs tests/console/drive.mjs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("--- drive.mjs stdout\n{stdout}--- drive.mjs stderr\n{stderr}---");
    assert!(output.status.success(), "the browser driver failed ({}):\n{stdout}\n{stderr}", output.status);

    // The target got every requeued entry again and correlated it; the other group was
    // not sent again.
    for (key, before) in MULTI.iter().zip(refused_before) {
        let delivered = camunda.deliveries_for(key);
        assert!(
            delivered[..before].iter().all(|d| d.status == 400),
            "{key} was refused before the requeue: {delivered:?}"
        );
        assert!(
            delivered[before..].iter().any(|d| d.status == 204),
            "{key} was delivered after the requeue: {delivered:?}"
        );
    }
    for key in GONE {
        assert!(camunda.deliveries_for(key).iter().all(|d| d.status == 403), "{key} was not requeued");
    }
    let groups = api(&http, &base, "/api/failures?route=orders", OPS).await;
    let left: Vec<&str> =
        groups["groups"].as_array().unwrap().iter().map(|g| g["fingerprint"].as_str().unwrap()).collect();
    assert_eq!(left.len(), 1, "{groups:#}");
    assert!(left[0].contains("answered 403"), "{groups:#}");

    // The forged POSTs changed nothing; the console's actions are audited like the API's.
    let routes = api(&http, &base, "/api/routes", ROOT).await;
    assert!(routes["routes"].as_array().unwrap().iter().all(|r| r["paused"].is_null()), "{routes:#}");
    let audit = api(&http, &base, "/api/audit?limit=1000", ROOT).await;
    let lines: Vec<(String, String, String)> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["actor"].as_str().unwrap().into(),
                a["action"].as_str().unwrap().into(),
                a["outcome"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert!(lines.contains(&("ops".into(), "repair-requeue".into(), "started".into())), "{lines:?}");
    assert!(lines.iter().all(|(actor, _, _)| actor != "watcher"), "a viewer changed nothing: {lines:?}");
    let job = api(&http, &base, "/api/repairs", OPS).await;
    assert_eq!(job["jobs"][0]["state"], "done", "{job:#}");
    assert_eq!(job["jobs"][0]["moved"], MULTI.len(), "{job:#}");
    assert_eq!(job["jobs"][0]["filter"]["fingerprint"], multi_group.as_str(), "{job:#}");

    // The OpenAPI description is served as committed.
    let served = api(&http, &base, "/api/openapi.json", VIEWER).await;
    let committed: Value = serde_json::from_str(inlet::admin::openapi::OPENAPI).unwrap();
    assert_eq!(served, committed);

    for name in ["failures", "preview", "overview", "entry", "viewer"] {
        let shot = artifacts.join(format!("console-{name}.png"));
        assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 1000), "screenshot {} was saved", shot.display());
        println!("screenshot: {}", shot.display());
    }
    inlet.assert_running();
}

/// The console's gate over plain HTTP: sign-in, the cookie's flags, the CSRF and
/// same-site checks on every POST, route scopes, escaping, and the page headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_signs_in_by_token_checks_every_post_and_escapes_what_it_shows() {
    let camunda = FakeCamunda::with_behaviour(|_, _| Reply::Status(403)).await;
    let (mut inlet, _dir) = start(&camunda.url()).await;
    let base = inlet.base.clone();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let markup = "<script>alert(1)</script>";
    let envelope = push_envelope(&work_order("k-1"), &[("note", markup)], "m-1");
    let r = http
        .post(format!("{base}/push/orders"))
        .header("content-type", "application/json")
        .body(envelope.to_string())
        .send()
        .await
        .unwrap();
    let pushed: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    let entry = pushed["entry"].as_i64().expect("the push names its entry");

    let r = http.get(format!("{base}/console")).send().await.unwrap();
    assert_eq!(r.status(), 303, "no session: to the sign-in page");
    assert_eq!(r.headers()["location"], "/console/login");
    let login = |token: &str, origin: Option<&str>| {
        let mut req = http.post(format!("{base}/console/login")).form(&[("token", token)]);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    let r = login("not-a-token-at-all-0123456789", None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("unknown token"));
    let r = login(OPS, Some("http://evil.example")).await.unwrap();
    assert_eq!(r.status(), 403, "a sign-in posted from another site is refused");
    assert!(r.headers().get("set-cookie").is_none());
    let session = |r: &reqwest::Response| {
        let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
        for flag in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
            assert!(cookie.contains(flag), "{cookie} has {flag}");
        }
        cookie.split(';').next().unwrap().to_string()
    };
    let r = login(OPS, Some(&base)).await.unwrap();
    assert_eq!(r.status(), 303);
    let ops = session(&r);

    let page = |cookie: String, path: String| {
        let req = http.get(format!("{base}{path}")).header("cookie", cookie);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let headers = r.headers().clone();
            (status, headers, r.text().await.unwrap())
        }
    };
    let (status, headers, overview) = page(ops.clone(), "/console".into()).await;
    assert_eq!(status, 200);
    assert!(headers["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["cache-control"], "no-store");
    let csrf = overview
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the page carries the CSRF token")
        .to_string();

    // The entry's attribute is shown as text, never as markup.
    let (status, _, shown) = page(ops.clone(), format!("/console/entries/{entry}")).await;
    assert_eq!(status, 200, "{shown}");
    assert!(shown.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the attribute is escaped");
    assert!(!shown.contains(markup), "no raw markup from the message reaches the page");

    let pause = |cookie: Option<&str>, csrf: &str, origin: Option<&str>| {
        let mut req =
            http.post(format!("{base}/console/routes/orders/pause")).form(&[("csrf", csrf), ("reason", "maintenance")]);
        if let Some(c) = cookie {
            req = req.header("cookie", c);
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    assert_eq!(pause(None, &csrf, None).await.unwrap().status(), 401, "no session");
    assert_eq!(pause(Some(&ops), "0".repeat(64).as_str(), None).await.unwrap().status(), 403, "a wrong CSRF token");
    assert_eq!(pause(Some(&ops), "", None).await.unwrap().status(), 403, "no CSRF token");
    assert_eq!(pause(Some(&ops), &csrf, Some("http://evil.example")).await.unwrap().status(), 403, "another site");
    let http_api = reqwest::Client::new();
    let routes = api(&http_api, &base, "/api/routes", ROOT).await;
    assert!(routes["routes"].as_array().unwrap().iter().all(|r| r["paused"].is_null()), "nothing was paused yet");
    let r = pause(Some(&ops), &csrf, Some(&base)).await.unwrap();
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap());
    let routes = api(&http_api, &base, "/api/routes", ROOT).await;
    let orders = routes["routes"].as_array().unwrap().iter().find(|r| r["name"] == "orders").unwrap().clone();
    assert_eq!(orders["paused"]["by"], "ops", "{routes:#}");
    let audit = api(&http_api, &base, "/api/audit", ROOT).await;
    let pauses: Vec<&Value> = audit["audit"].as_array().unwrap().iter().filter(|a| a["action"] == "pause").collect();
    assert_eq!(pauses.len(), 1, "the one pause that passed is audited, as the API audits it: {audit:#}");
    assert_eq!((pauses[0]["actor"].as_str(), pauses[0]["outcome"].as_str()), (Some("ops"), Some("ok")));
    let (_, _, overview) = page(ops.clone(), "/console".into()).await;
    assert!(overview.contains("Route orders paused."), "the action's result is shown once");
    assert!(overview.contains(r#"action="/console/routes/orders/resume""#), "a paused route offers resume");
    // A button of the console, pressed by the operator.
    let press = async |path: &str| {
        let r = http.post(format!("{base}{path}")).header("cookie", &ops).form(&[("csrf", &csrf)]).send().await;
        r.unwrap().status().as_u16()
    };
    assert_eq!(press("/console/routes/orders/resume").await, 303);
    let routes = api(&http_api, &base, "/api/routes", ROOT).await;
    assert!(routes["routes"].as_array().unwrap().iter().all(|r| r["paused"].is_null()), "resumed: {routes:#}");

    // An open replay window is shown on its route.
    let r = http_api
        .post(format!("{base}/api/routes/orders/replays"))
        .bearer_auth(ROOT)
        .header("content-type", "application/json")
        .body(r#"{"from": "2026-12-04T09:00:00Z", "to": "2026-12-04T10:00:00Z", "reason": "redo"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (_, _, overview) = page(ops.clone(), "/console".into()).await;
    assert!(
        overview.contains("replay window 1 open until 20") && overview.contains("redeliveries of messages published 2026-12-04T09:00:00.000Z to 2026-12-04T10:00:00.000Z are stored again (0 so far)"),
        "the open window is on the overview: {overview}"
    );
    // An operator closes it from there; the API's handler audits it.
    assert!(overview.contains(r#"action="/console/replays/1/close""#), "an operator may close it: {overview}");
    assert_eq!(press("/console/replays/1/close").await, 303);
    let (_, _, overview) = page(ops.clone(), "/console".into()).await;
    assert!(overview.contains("Replay window 1 closed"), "{overview}");
    assert!(!overview.contains("replay window 1 open until"), "no longer shown as open: {overview}");
    let window = api(&http_api, &base, "/api/replays/1", ROOT).await;
    assert!(window["window"]["closed_at"].is_number(), "closed: {window:#}");
    let audit = api(&http_api, &base, "/api/audit", ROOT).await;
    let closes: Vec<&Value> =
        audit["audit"].as_array().unwrap().iter().filter(|a| a["action"] == "replay-close").collect();
    assert_eq!(closes.len(), 1, "{audit:#}");
    assert_eq!(closes[0]["actor"], "ops", "{audit:#}");

    // The audit log is the admins', in the console as in the API.
    let (status, _, body) = page(ops.clone(), "/console/audit".into()).await;
    assert_eq!(status, 403, "{body}");
    assert!(!overview.contains(r#"href="/console/audit""#), "an operator's navigation has no audit log");
    let r = login(ROOT, None).await.unwrap();
    let root = session(&r);
    let (status, _, body) = page(root, "/console/audit".into()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<td>pause</td>") && body.contains("<td>resume</td>"), "{body}");

    // A token limited to another route: the entry is a 404, like a missing one, and
    // the overview does not list the route.
    let r = login(TEAM, None).await.unwrap();
    let team = session(&r);
    let (status, _, body) = page(team.clone(), format!("/console/entries/{entry}")).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains(&format!("no entry {entry}")));
    let (_, _, overview) = page(team.clone(), "/console".into()).await;
    assert!(overview.contains(r#"data-route="audit-trail""#) && !overview.contains(r#"data-route="orders""#));

    // Signing out ends the session on the server, whatever the browser keeps.
    let r = http.post(format!("{base}/console/logout")).header("cookie", &ops).form(&[("csrf", &csrf)]).send().await;
    assert_eq!(r.unwrap().status(), 303);
    let (status, _, _) = page(ops.clone(), "/console".into()).await;
    assert_eq!(status, 303, "the old cookie no longer signs in");
    inlet.assert_running();
}

/// A client whose connections come from `local` (127.0.0.1 and 127.0.0.2 are both
/// loopback on Linux, so the server sees two peers), never following redirects.
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(local.parse::<std::net::IpAddr>().unwrap())
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The session cookie (`name=value`) a sign-in answer sets.
fn session_cookie(r: &reqwest::Response) -> String {
    let cookie = r.headers().get("set-cookie").expect("a sign-in sets the session cookie");
    cookie.to_str().unwrap().split(';').next().unwrap().to_string()
}

async fn sign_in(http: &reqwest::Client, base: &str, token: &str) -> reqwest::Response {
    http.post(format!("{base}/console/login")).form(&[("token", token)]).send().await.unwrap()
}

/// Whether the console takes `cookie` as a live session.
async fn signed_in(http: &reqwest::Client, base: &str, cookie: &str) -> bool {
    let r = http.get(format!("{base}/console")).header("cookie", cookie).send().await.unwrap();
    match r.status().as_u16() {
        200 => true,
        303 => false,
        other => panic!("GET /console answered {other}"),
    }
}

/// A metric's value in a Prometheus text exposition, 0 when the series is absent.
fn metric(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')).map_or(0, |v| v.trim().parse().unwrap())
}

/// 10,001 sign-ins of one token end only that token's oldest
/// sessions (another token's session stays valid); 1,000 wrong tokens from one peer
/// are slowed (429 with `Retry-After`), then even its right token waits, every refusal
/// is counted in `/metrics` and logged, and a right token from another peer signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tokens_sign_ins_sign_no_one_else_out_and_wrong_tokens_are_slowed() {
    let camunda = FakeCamunda::start().await;
    let (mut inlet, _dir) = start(&camunda.url()).await;
    let base = inlet.base.clone();
    let local = client_from("127.0.0.1");

    let r = sign_in(&local, &base, ROOT).await;
    assert_eq!(r.status(), 303);
    let root = session_cookie(&r);
    let r = sign_in(&local, &base, VIEWER).await;
    assert_eq!(r.status(), 303);
    let first_viewer = session_cookie(&r);

    // 10,001 more sign-ins of the viewer token, 16 at a time.
    let started = std::time::Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let (http, base, next) = (local.clone(), base.clone(), next.clone());
            tokio::spawn(async move {
                let mut last = None;
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 10_001 {
                    let r = sign_in(&http, &base, VIEWER).await;
                    assert_eq!(r.status(), 303, "a right token signs in");
                    last = Some(session_cookie(&r));
                }
                last
            })
        })
        .collect();
    let mut last_viewer = None;
    for w in workers {
        last_viewer = w.await.unwrap().or(last_viewer);
    }
    eprintln!("figure: 10,001 console sign-ins of one token took {:?}", started.elapsed());
    assert!(signed_in(&local, &base, &root).await, "another token's session is still valid");
    assert!(!signed_in(&local, &base, &first_viewer).await, "the viewer's own oldest session made room");
    assert!(signed_in(&local, &base, &last_viewer.unwrap()).await, "the viewer's newest session is valid");

    // 1,000 wrong tokens from 127.0.0.2.
    let guesser = client_from("127.0.0.2");
    let started = std::time::Instant::now();
    let (mut unknown, mut waited) = (0u64, 0u64);
    for i in 0..1_000 {
        let r = sign_in(&guesser, &base, &format!("wrong-token-{i:04}-0123456789")).await;
        match r.status().as_u16() {
            401 => unknown += 1,
            429 => {
                let wait: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                assert!((1..=300).contains(&wait), "Retry-After {wait}");
                assert!(r.headers().get("set-cookie").is_none());
                waited += 1;
            }
            other => panic!("wrong token {i}: {other}"),
        }
    }
    eprintln!(
        "figure: 1,000 wrong sign-ins in {:?}: {unknown} looked at (401), {waited} refused unread (429)",
        started.elapsed()
    );
    assert!(unknown >= 5, "the first few are looked at: {unknown}");
    assert!(unknown <= 20, "the rest wait: {unknown} were looked at");
    assert_eq!(unknown + waited, 1_000);
    let r = sign_in(&guesser, &base, OPS).await;
    assert_eq!(r.status(), 429, "while it waits, even a right token from that peer is not looked at");
    assert!(r.headers().get("set-cookie").is_none());
    // The admin API takes the same tokens: the same wait.
    let r = guesser.get(format!("{base}/api/routes")).bearer_auth(ROOT).send().await.unwrap();
    assert_eq!(r.status(), 429, "the API's bearer tokens wait with the sign-in");
    assert!(r.headers().contains_key("retry-after"));

    // Another peer is not affected.
    let other = client_from("127.0.0.3");
    let r = sign_in(&other, &base, OPS).await;
    assert_eq!(r.status(), 303, "a right token from another peer signs in");
    assert!(signed_in(&other, &base, &session_cookie(&r)).await);

    let metrics = local.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let series = |reason: &str| format!("inlet_sign_in_refused_total{{via=\"console\",reason=\"{reason}\"}}");
    assert_eq!(metric(&metrics, &series("unknown_token")), unknown, "{metrics}");
    assert_eq!(metric(&metrics, &series("rate_limited")), waited + 1, "{metrics}");
    assert_eq!(metric(&metrics, &series("too_many_sessions")), 0);
    assert_eq!(metric(&metrics, "inlet_sign_in_refused_total{via=\"api\",reason=\"rate_limited\"}"), 1);
    let log = inlet.log();
    assert!(log.contains("this peer now waits before its next token is looked at"), "the waits are logged");
    inlet.assert_running();
}
