//! Secrets are granted, not ambient, and nothing prints an expanded value.
//!
//! A real `inlet run` over a directory: the platform's shared file grants the orders
//! team two variables; the billing team's file reads the platform's admin token, which
//! it was not granted. Billing is refused alone, naming the variable; orders keeps
//! taking pushes and delivering, with its granted key in a header. A granted secret
//! expanded into a plugin path that does not exist makes a configuration error. Marker
//! values of the secrets appear in none of: `/readyz`, any push answer, `GET /api/routes`
//! for a viewer, `/metrics`, `inlet check`, the process log. Reloads apply the same
//! rules: a new grant brings billing up, a revoked one takes orders down.

use std::path::Path;
use std::time::Duration;

use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_work_order;
use inlet_testkit::wait::wait_until;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// The platform's admin token: never granted to a team file.
const ADMIN_TOKEN: &str = "MARKER-admin-token-5b7e0c2a";
const VIEWER_TOKEN: &str = "viewer-token-3f9a61d07c";
/// Granted to orders.toml, used in a header of its target.
const ORDERS_KEY: &str = "MARKER-orders-key-c41d9e07";
/// Granted to orders.toml, expanded into a plugin path that does not exist.
const PATH_SECRET: &str = "MARKER-path-secret-82ab4f11";
/// Set in the environment, granted to billing.toml only by the second version of the
/// shared file.
const BILLING_KEY: &str = "MARKER-billing-key-e03f5d98";

const MARKERS: [&str; 4] = [ADMIN_TOKEN, ORDERS_KEY, PATH_SECRET, BILLING_KEY];

fn envs() -> Vec<(&'static str, &'static str)> {
    vec![
        ("INLET_ADMIN_TOKEN", ADMIN_TOKEN),
        ("INLET_VIEWER_TOKEN", VIEWER_TOKEN),
        ("ORDERS_API_KEY", ORDERS_KEY),
        ("ORDERS_PLUGIN", PATH_SECRET),
        ("BILLING_API_KEY", BILLING_KEY),
    ]
}

/// The platform's file: the store, the tokens, and the grants (`billing` adds a grant
/// of `BILLING_API_KEY` to billing.toml; `orders` keeps orders.toml's).
fn platform(orders: bool, billing: bool) -> String {
    let mut text = String::from(
        "[store]\nurl = \"sqlite://inbox.db\"\n\n[admin]\nauth = \"token\"\n\n\
         [[admin.token]]\nname = \"platform\"\nrole = \"admin\"\nsecret = \"${INLET_ADMIN_TOKEN}\"\n\n\
         [[admin.token]]\nname = \"watcher\"\nrole = \"viewer\"\nsecret = \"${INLET_VIEWER_TOKEN}\"\n\n",
    );
    if orders {
        text += "[[grant]]\nfile = \"orders.toml\"\nenv = [\"ORDERS_API_KEY\", \"ORDERS_PLUGIN\"]\n\n";
    }
    if billing {
        text += "[[grant]]\nfile = \"billing.toml\"\nenv = [\"BILLING_API_KEY\"]\n";
    }
    text
}

fn route(name: &str, plugin: &str, target: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"push\" }}\ntarget = {target}\n\n"
    )
}

fn http_target(camunda: &FakeCamunda, header: &str) -> String {
    format!("{{ kind = \"http\", url = \"{}\", timeout = \"5s\", headers = {{ {header} }} }}", camunda.url())
}

fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Fails naming the marker if `text` (from `what`) holds one.
fn assert_no_marker(what: &str, text: &str) {
    for marker in MARKERS {
        assert!(!text.contains(marker), "{what} shows a secret value ({marker}):\n{text}");
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// Pushes a work-order event; the status and the answer's text.
    async fn push(&self, route: &str, key: &str, seq: u32) -> (u16, String) {
        push_work_order(&self.http, &self.base, route, key, seq).await
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut req = self.http.get(format!("{}{path}", self.base));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn reload(&self) -> Value {
        let r = self.http.post(format!("{}/api/reload", self.base)).bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        let text = r.text().await.unwrap();
        assert_no_marker("the reload report", &text);
        serde_json::from_str(&text).unwrap()
    }

    /// `GET /api/routes` as `token`, every route by name.
    async fn routes(&self, token: &str) -> Value {
        let (status, text) = self.get("/api/routes", Some(token)).await;
        assert_eq!(status, 200, "{text}");
        assert_no_marker("GET /api/routes", &text);
        let v: Value = serde_json::from_str(&text).unwrap();
        let by_name =
            v["routes"].as_array().unwrap().iter().map(|r| (r["name"].as_str().unwrap().to_string(), r.clone()));
        Value::Object(by_name.collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_file_reads_only_granted_variables_and_no_expanded_value_is_shown() {
    let camunda = FakeCamunda::start().await;
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.d");
    std::fs::create_dir(&routes).unwrap();
    let good = plugin_path("work_order").display().to_string();
    let platform_file = routes.join("00-platform.toml");
    write(&platform_file, &platform(true, false));
    let orders_file = routes.join("orders.toml");
    // A file that is not a plugin (a secret, say) named as one: its bytes are not shown.
    let not_a_plugin = dir.path().join("token.txt");
    std::fs::write(&not_a_plugin, "SECRET-file-bytes\n").unwrap();
    let orders = route("orders", &good, &http_target(&camunda, "x-api-key = \"${ORDERS_API_KEY}\""))
        + &route("orders-next", "plugins/${ORDERS_PLUGIN}.wasm", "{ kind = \"log\" }")
        + &route("orders-peek", &not_a_plugin.display().to_string(), "{ kind = \"log\" }");
    write(&orders_file, &orders);
    let billing_file = routes.join("billing.toml");
    write(
        &billing_file,
        &route("billing", &good, &http_target(&camunda, "authorization = \"Bearer ${INLET_ADMIN_TOKEN}\"")),
    );

    let envs = envs();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut inlet = InletProcess::spawn_with_args(&routes, &["--listen", &listen, "--poll", "50ms"], &envs);
    inlet.wait_healthy(WAIT).await;
    let c = Client { http: reqwest::Client::new(), base: inlet.base.clone() };

    // Orders runs, and its granted key reaches the target.
    let (status, answer) = c.push("orders", "o-1", 1).await;
    assert_eq!(status, 200, "{answer}");
    wait_until("orders delivered", WAIT, || async { camunda.correlated_seqs("o-1") == vec![1] }).await;
    let delivery = camunda.deliveries_for("o-1").remove(0);
    assert_eq!(delivery.headers.get("x-api-key").map(String::as_str), Some(ORDERS_KEY));

    // Billing is refused alone, and so is the orders route whose plugin path holds a
    // secret; their answers say so and nothing more.
    for route in ["billing", "orders-next", "orders-peek"] {
        let (status, answer) = c.push(route, "k", 1).await;
        assert_eq!(status, 503, "{route}: {answer}");
        assert_eq!(serde_json::from_str::<Value>(&answer).unwrap()["reason"], "route_refused", "{answer}");
        assert!(!answer.contains("INLET_ADMIN_TOKEN") && !answer.contains("ORDERS_PLUGIN"), "{route}: {answer}");
        assert_no_marker("a push answer", &answer);
    }
    let (status, ready) = c.get("/readyz", None).await;
    assert_eq!((status, serde_json::from_str::<Value>(&ready).unwrap()), (200, json!({ "status": "ready" })));

    // A viewer learns that routes are refused, not why; an admin reads the reasons,
    // which name the file, line, field and variable, and quote `${…}`, not the value.
    let seen = c.routes(VIEWER_TOKEN).await;
    assert_eq!((seen["orders"]["state"].as_str(), seen["billing"]["state"].as_str()), (Some("up"), Some("refused")));
    assert_eq!(seen["orders-next"]["state"], "refused", "{seen}");
    assert!(!seen["billing"]["error"].as_str().unwrap().contains("INLET_ADMIN_TOKEN"), "{seen}");
    let seen = c.routes(ADMIN_TOKEN).await;
    let error = seen["billing"]["error"].as_str().unwrap();
    assert!(error.contains("billing.toml:5:") && error.contains("route[0].target.headers.authorization"), "{error}");
    assert!(error.contains("environment variable `INLET_ADMIN_TOKEN` is not granted"), "{error}");
    let error = seen["orders-next"]["error"].as_str().unwrap();
    assert!(error.contains("plugins/${ORDERS_PLUGIN}.wasm` does not exist"), "{error}");
    assert_eq!(seen["orders-next"]["plugin"], Value::Null, "{seen}");
    let error = seen["orders-peek"]["error"].as_str().unwrap();
    assert!(error.contains("not a WebAssembly file") && !error.contains("0x53"), "{error}");
    let (_, metrics) = c.get("/metrics", None).await;
    assert!(metrics.contains("inlet_route_up{route=\"billing\"} 0"), "{metrics}");
    assert_no_marker("/metrics", &metrics);

    // `inlet check` says the same, with the same environment.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_inlet"))
        .arg("check")
        .arg(&routes)
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(!check.status.success(), "{printed}");
    assert!(printed.contains("billing.toml:5:") && printed.contains("`INLET_ADMIN_TOKEN` is not granted"), "{printed}");
    assert!(printed.contains("plugins/${ORDERS_PLUGIN}.wasm"), "{printed}");
    assert!(printed.contains("not a WebAssembly file") && !printed.contains("0x53"), "{printed}");
    assert_no_marker("inlet check", &printed);

    // Reloads apply the same rules. Billing reads a key of its own, not granted yet:
    // still refused; once the platform grants it, billing comes up with it.
    write(&billing_file, &route("billing", &good, &http_target(&camunda, "x-api-key = \"${BILLING_API_KEY}\"")));
    let report = c.reload().await;
    assert_eq!(report["routing_file"]["result"], "applied", "{report}");
    assert!(report["refused"].to_string().contains("`BILLING_API_KEY` is not granted"), "{report}");
    assert_eq!(c.push("billing", "b-1", 1).await.0, 503);
    write(&platform_file, &platform(true, true));
    let report = c.reload().await;
    assert_eq!(report["routing_file"]["added"], json!(["billing"]), "{report}");
    assert_eq!(c.push("billing", "b-1", 1).await.0, 200);
    wait_until("billing delivered", WAIT, || async { camunda.correlated_seqs("b-1") == vec![1] }).await;
    let delivery = camunda.deliveries_for("b-1").remove(0);
    assert_eq!(delivery.headers.get("x-api-key").map(String::as_str), Some(BILLING_KEY));

    // A revoked grant takes the running route down too: it holds the value.
    write(&platform_file, &platform(false, true));
    let report = c.reload().await;
    assert_eq!(report["routing_file"]["removed"], json!(["orders"]), "{report}");
    assert_eq!(c.push("orders", "o-2", 2).await.0, 503);
    assert_eq!(c.push("billing", "b-1", 2).await.0, 200, "billing is untouched");
    assert_eq!(c.routes(VIEWER_TOKEN).await["orders"]["state"], "refused");

    // Every delivery carried only what its file was granted.
    for d in camunda.deliveries() {
        assert_no_marker("a delivery's headers", &format!("{:?}", d.headers.get("authorization")));
    }
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(WAIT).success());
    let log = inlet.log();
    assert!(log.contains("INLET_ADMIN_TOKEN"), "the log names the variable:\n{log}");
    assert_no_marker("the log", &log);
}
