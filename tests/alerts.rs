//! The alert rules and the dashboard: the real `promtool` checks the rules and runs
//! their unit tests (`config/alerts/inlet_test.yml`), every alert carries what an
//! operator needs and links to a RUNBOOK.md section that exists, and every metric a
//! rule, a rule test or the dashboard names is one a running Inlet exports.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::in_process::start_on_sqlite_with_env;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::pg::TestPg;
use inlet_testkit::ports::free_port;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::{wait_for, wait_until};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `INLET_PROMTOOL` (set by scripts/test through scripts/ensure-promtool), else
/// `promtool` on the PATH; a missing promtool fails the test.
fn promtool() -> PathBuf {
    if let Some(path) = std::env::var_os("INLET_PROMTOOL").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("promtool not found: set INLET_PROMTOOL or run scripts/ensure-promtool (Debian package `prometheus`)")
    })
}

/// Runs promtool with `args` in `config/alerts`; panics with its output unless it succeeds.
fn run_promtool(args: &[&str]) -> String {
    let promtool = promtool();
    let out = Command::new(&promtool)
        .args(args)
        .current_dir(repo().join("config/alerts"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", promtool.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {} failed ({}):\n{text}", args.join(" "), out.status);
    text
}

#[test]
fn promtool_checks_the_rules() {
    let out = run_promtool(&["check", "rules", "inlet.yml"]);
    let alerts = alert_blocks().len();
    assert!(out.contains(&format!("SUCCESS: {alerts} rules found")), "promtool check rules said:\n{out}");
}

#[test]
fn promtool_unit_tests_of_the_rules_pass() {
    let out = run_promtool(&["test", "rules", "inlet_test.yml"]);
    assert!(out.contains("SUCCESS"), "promtool test rules said:\n{out}");
}

/// Each `- alert:` block of inlet.yml, by alert name.
fn alert_blocks() -> Vec<(String, String)> {
    let text = read(&repo().join("config/alerts/inlet.yml"));
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.trim_start().strip_prefix("- alert:") {
            blocks.push((name.trim().to_string(), String::new()));
        } else if let Some((_, block)) = blocks.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// GitHub's anchor of a Markdown heading: lowercase, spaces to dashes, other
/// punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_says_what_and_links_to_its_runbook_section() {
    let runbook = read(&repo().join("RUNBOOK.md"));
    let anchors: BTreeSet<String> =
        runbook.lines().filter_map(|l| l.strip_prefix('#')).map(|h| anchor(h.trim_start_matches('#'))).collect();
    let blocks = alert_blocks();
    assert!(blocks.len() >= 12, "only {} alerts in inlet.yml", blocks.len());
    let tests = read(&repo().join("config/alerts/inlet_test.yml"));
    for (name, block) in &blocks {
        for field in ["expr:", "for:", "severity:", "summary:", "description:", "runbook_url:"] {
            assert!(block.contains(field), "alert {name} has no `{field}`");
        }
        let url = block
            .lines()
            .find_map(|l| l.trim().strip_prefix("runbook_url:"))
            .map(|u| u.trim().trim_matches('"'))
            .expect("runbook_url present");
        let section = url
            .strip_prefix("RUNBOOK.md#")
            .unwrap_or_else(|| panic!("alert {name}: runbook_url {url} does not point into RUNBOOK.md"));
        assert_eq!(section, anchor(name), "alert {name} links to its own section");
        assert!(anchors.contains(section), "alert {name}: RUNBOOK.md has no section #{section}");
        let fires = format!("alertname: {name}\n        exp_alerts:\n          - exp_labels");
        assert!(tests.contains(&fires), "inlet_test.yml never shows alert {name} firing");
    }
}

/// The metric names a PromQL text (or a rule file) mentions: identifiers that start
/// with `inlet_`. Comment lines (`#`) are skipped.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let bytes = line.as_bytes();
        let mut i = 0;
        while let Some(at) = line[i..].find("inlet_") {
            let start = i + at;
            let ident = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
            let mut end = start;
            while end < bytes.len() && ident(bytes[end]) {
                end += 1;
            }
            let preceded = start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
            if !preceded {
                names.insert(line[start..end].to_string());
            }
            i = end.max(start + 1);
        }
    }
    names
}

/// Every PromQL expression of the dashboard: panel targets and template queries.
fn dashboard_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains('(') => out.push(s.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// A scrape: the sample names present and the declared type of each metric family.
struct Scrape {
    samples: BTreeSet<String>,
    types: HashMap<String, String>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut samples = BTreeSet::new();
        let mut types = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    types.insert(name.to_string(), kind.to_string());
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                samples.insert(line[..end].to_string());
            }
        }
        Scrape { samples, types }
    }

    /// Why `name` is not a series of this scrape, if it is not: a histogram's series
    /// are `_bucket`, `_sum` and `_count` (the suffix is stripped only when the rest
    /// is a histogram), a counter's `_total`.
    fn missing(&self, name: &str) -> Option<String> {
        if self.samples.contains(name) {
            return None;
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix)
                && self.types.contains_key(base)
            {
                return Some(format!("{name}: {base} is a {}, with no series {name}", self.types[base]));
            }
        }
        Some(match self.types.get(name).map(String::as_str) {
            Some("histogram") => format!("{name} is a histogram: name {name}_bucket, _sum or _count"),
            Some("counter") => format!("{name} is a counter: its series is {name}_total"),
            Some(kind) => format!("{name} is declared ({kind}) but has no series"),
            None => format!("{name} is not exported at all"),
        })
    }
}

/// The names rule files, rule tests and the dashboard use, each with where it is used.
fn referenced_names() -> Vec<(String, &'static str)> {
    let mut names = Vec::new();
    for (file, what) in [("config/alerts/inlet.yml", "alert rules"), ("config/alerts/inlet_test.yml", "rule tests")] {
        names.extend(metric_names(&read(&repo().join(file))).into_iter().map(|n| (n, what)));
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&repo().join("config/grafana/inlet.json"))).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "the dashboard has only {} expressions", exprs.len());
    for expr in &exprs {
        names.extend(metric_names(expr).into_iter().map(|n| (n, "dashboard")));
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let names = metric_names(
        r#"histogram_quantile(0.9, sum by (le) (rate(inlet_queue_time_seconds_bucket{route=~"a"}[5m]))) / x_inlet_no
        # inlet_commented_out
        and inlet_store_up == 0"#,
    );
    let expected: BTreeSet<String> = ["inlet_queue_time_seconds_bucket", "inlet_store_up"].map(String::from).into();
    assert_eq!(names, expected);
    let scrape = Scrape::parse(
        "# TYPE inlet_q histogram\ninlet_q_bucket{le=\"1\"} 0\ninlet_q_sum 0\ninlet_q_count 0\n# TYPE inlet_c counter\ninlet_c_total 1\n# TYPE inlet_g_count gauge\ninlet_g_count 2\n",
    );
    assert_eq!(scrape.missing("inlet_q_bucket"), None);
    assert_eq!(scrape.missing("inlet_g_count"), None, "a gauge named _count is not a histogram's");
    assert!(scrape.missing("inlet_q").is_some_and(|why| why.contains("histogram")));
    assert!(scrape.missing("inlet_c").is_some_and(|why| why.contains("_total")));
    assert!(scrape.missing("inlet_g").is_some_and(|why| why.contains("not exported")));
}

/// A push route delivering to a fake engine and a pull route whose broker is not
/// there (a port nobody listens on): between them every series the rules and the
/// dashboard name exists, including the Pub/Sub source's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let camunda = FakeCamunda::start().await;
    let plugin = plugin_path("work_order");
    let routes = format!(
        "[[route]]\nname = \"orders\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"http\", url = \"{url}\", timeout = \"2s\" }}\n\n\
         [[route]]\nname = \"returns\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"pubsub\", subscription = \"projects/test/subscriptions/returns\" }}\ntarget = {{ kind = \"http\", url = \"{url}\", timeout = \"2s\" }}\n\n\
         [[route]]\nname = \"orders-out\"\nplugin = \"{plugin}\"\nsource = {{ kind = \"outbox\", url = \"${{APP_DB}}\" }}\ntarget = {{ kind = \"pubsub\", topic = \"projects/test/topics/orders\", ordering_key = true }}\n",
        plugin = plugin.display(),
        url = camunda.url(),
    );
    let nobody = format!("127.0.0.1:{}", free_port());
    // The outbox's database is not there either: its series show all the same.
    let app_db = format!("postgres://nobody@127.0.0.1:{}/app", free_port());
    let env = move |name: &str| (name == "APP_DB").then(|| app_db.clone());
    let inlet =
        start_on_sqlite_with_env(&routes, &env, |o| o.pubsub = inlet::pubsub_client::Connection::emulator(&nobody))
            .await;
    let http = reqwest::Client::new();
    let data = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;
    assert_eq!(post_push(&http, &inlet.base(), "orders", &push_envelope(data, &[], "m-1")).await, 200);
    wait_until("the message to be delivered", Duration::from_secs(30), || async { camunda.count() == 1 }).await;

    // Housekeeping has run once this instance publishes the inbox gauges, the pull
    // source has tried its broker once it reports itself disconnected, and the entry
    // is settled once its queue time is observed: the target's answer is counted as
    // an attempt before the settle commits, so the count alone races the settle.
    let url = format!("{}/metrics", inlet.base());
    let text = wait_for("housekeeping and the pull source to report", Duration::from_secs(30), || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let text = http.get(&url).send().await.unwrap().text().await.unwrap();
            let ready = text.contains("inlet_inbox_gauges_publisher 1")
                && text.contains(r#"inlet_inbox_entries{route="orders",status="OPEN"}"#)
                && text.contains(r#"inlet_pubsub_connected{route="returns"} 0"#)
                && text.contains(r#"inlet_outbox_errors_total{route="orders-out",stage="connect"} 1"#)
                && text.contains(r#"inlet_queue_time_seconds_count{route="orders"} 1"#);
            ready.then_some(text)
        }
    })
    .await;
    let scrape = Scrape::parse(&text);
    let names = referenced_names();
    let missing: Vec<String> =
        names.iter().filter_map(|(name, what)| scrape.missing(name).map(|why| format!("{what}: {why}"))).collect();
    assert!(missing.is_empty(), "metrics named but not exported:\n{}\n\nscrape:\n{text}", missing.join("\n"));
    let distinct: BTreeSet<&String> = names.iter().map(|(n, _)| n).collect();
    assert!(distinct.len() >= 25, "only {} distinct metrics named", distinct.len());
    // The delivery was seen: a DONE attempt counted (and a queue time observed, waited for above).
    assert!(text.contains(r#"inlet_delivery_attempts_total{route="orders",outcome="done"} 1"#), "{text}");
    inlet.running.stop().await;
}

/// The value of the series `series` (name and labels as exported) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Starts Inlet on the PostgreSQL inbox `url` with `routes`, listening on a free port.
async fn start_on(url: &str, routes: &str, dir: &Path, name: &str) -> inlet::app::Running {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, format!("[store]\nurl = \"{url}\"\n\n{routes}")).expect("write the routing file");
    let loaded = inlet::config::Config::load(&config).unwrap_or_else(|e| panic!("test routing file is invalid:\n{e}"));
    let options = inlet::app::Options {
        owner: name.to_string(),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        poll: Duration::from_millis(20),
        ..inlet::app::Options::default()
    };
    inlet::app::start(&loaded, options).await.expect("inlet starts")
}

/// Two instances on one PostgreSQL inbox: one publishes the inbox gauges, the other
/// exports none of them, so `sum()` over both is the inbox's backlog, not twice it;
/// when the publisher stops, the other takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_publish_the_inbox_gauges_once() {
    let pg = TestPg::new().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let routes = format!(
        "[[route]]\nname = \"orders\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n",
        plugin_path("work_order").display()
    );
    let a = start_on(&pg.url, &routes, dir.path(), "a").await;
    let b = start_on(&pg.url, &routes, dir.path(), "b").await;
    // Paused: the pushed entries stay OPEN, a backlog both instances see.
    let pause = inlet::inbox::Pause {
        route: "orders".into(),
        paused_at: a.shared.clock.now(),
        paused_by: "test".into(),
        reason: "hold a backlog".into(),
    };
    assert!(a.shared.store.pause_route(&pause).await.unwrap());
    let http = reqwest::Client::new();
    for (i, key) in ["k1", "k2", "k3"].iter().enumerate() {
        let data =
            format!(r#"{{"workOrderId":"{key}","completedItems":1,"completionTimestamp":"2026-08-01T10:00:00Z"}}"#);
        let base = format!("http://{}", a.addr);
        assert_eq!(
            post_push(&http, &base, "orders", &push_envelope(data.as_bytes(), &[], &format!("m-{i}"))).await,
            200
        );
    }
    let scrape = |addr: std::net::SocketAddr| {
        let http = http.clone();
        async move { http.get(format!("http://{addr}/metrics")).send().await.unwrap().text().await.unwrap() }
    };
    const OPEN: &str = r#"inlet_inbox_entries{route="orders",status="OPEN"}"#;
    let (publisher, other) = wait_for("one instance to publish a backlog of 3", Duration::from_secs(30), || async {
        let (ta, tb) = (scrape(a.addr).await, scrape(b.addr).await);
        let published =
            |t: &str| sample(t, "inlet_inbox_gauges_publisher") == Some(1.0) && sample(t, OPEN) == Some(3.0);
        let silent = |t: &str| sample(t, "inlet_inbox_gauges_publisher") == Some(0.0);
        match (published(&ta), published(&tb)) {
            (true, false) if silent(&tb) => Some(("a", tb)),
            (false, true) if silent(&ta) => Some(("b", ta)),
            _ => None,
        }
    })
    .await;
    assert!(
        !other.contains("inlet_inbox_entries{"),
        "the instance that does not publish exports no inbox gauge:\n{other}"
    );
    assert!(!other.contains("inlet_inbox_oldest_age_seconds{"), "{other}");
    assert_eq!(sample(&other, "inlet_store_up"), Some(1.0), "every instance reports its own store_up");

    // The publisher stops: the other takes the lease and publishes the same backlog.
    let (stopped, remaining) = if publisher == "a" { (a, b) } else { (b, a) };
    stopped.stop().await;
    wait_until("the other instance to take over the inbox gauges", Duration::from_secs(60), || async {
        let t = scrape(remaining.addr).await;
        sample(&t, "inlet_inbox_gauges_publisher") == Some(1.0) && sample(&t, OPEN) == Some(3.0)
    })
    .await;
    remaining.stop().await;
}
