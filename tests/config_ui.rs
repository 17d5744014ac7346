//! Golden tests for routing-file errors, as in spin's `crates/manifest/tests/ui.rs`.
//!
//! Convention: every `tests/ui/NAME.toml` has a `tests/ui/NAME.err` beside it holding
//! the exact `ConfigErrors` Display output of loading it, followed by one newline.
//! An EMPTY `.err` means the file is valid and must load without errors. A directory
//! `tests/ui/NAME/` is a case too: a directory of routing files (one per team), loaded
//! as `inlet run NAME/` would, with its `tests/ui/NAME.err` beside it. Other files in
//! `tests/ui/` (such as `fake-plugin.bin`, the placeholder every `plugin =` points at)
//! are not cases.
//!
//! Each file is loaded with `Config::from_str` under the relative path
//! `tests/ui/NAME.toml` (cargo runs integration tests from the crate root), so the
//! output is the same on every machine, and with a fixed environment (see [`env`]),
//! never the process's own.
//!
//! `INLET_BLESS=1 cargo test --test config_ui` rewrites the `.err` files from the
//! actual output; review the diff before committing it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inlet::config::{Config, Ordering, ParkedPolicy, SourceConfig, TargetConfig};

const UI_DIR: &str = "tests/ui";

/// The only environment the cases see.
fn env(name: &str) -> Option<String> {
    match name {
        "INLET_TEST_TOKEN" => Some("s3cret".to_string()),
        "INLET_TEST_ADMIN_TOKEN" => Some("a-long-enough-admin-token".to_string()),
        "INLET_TEST_ENGINE_URL" => Some("http://engine.test:8080".to_string()),
        "INLET_TEST_APP_DB" => Some("postgres://app:pw@db.test:5432/orders".to_string()),
        "INLET_TEST_NOT_PG" => Some("mysql://app@db.test/orders".to_string()),
        _ => None,
    }
}

fn load(path: &Path) -> Result<Config, inlet::config::ConfigErrors> {
    if path.is_dir() {
        return Config::load_partial_with(path, &env).and_then(Config::complete);
    }
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Config::from_str(path, &text, &env)
}

/// The cases, sorted, as relative paths `tests/ui/NAME.toml` or `tests/ui/NAME` (a directory).
fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(UI_DIR)
        .unwrap_or_else(|e| panic!("reading {UI_DIR}: {e}"))
        .map(|entry| Path::new(UI_DIR).join(entry.expect("directory entry").file_name()))
        .filter(|path| path.is_dir() || path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    cases.sort();
    cases
}

/// What the `.err` file of a case must contain.
fn render(result: &Result<Config, inlet::config::ConfigErrors>) -> String {
    match result {
        Ok(_) => String::new(),
        Err(errors) => format!("{errors}\n"),
    }
}

#[test]
fn golden_error_files() {
    let bless = std::env::var_os("INLET_BLESS").is_some_and(|v| v == "1");
    let cases = cases();
    assert!(cases.len() >= 10, "expected the ui cases in {UI_DIR}, found {}", cases.len());

    let mut failures = Vec::new();
    for toml in &cases {
        let err_path = toml.with_extension("err");
        let actual = render(&load(toml));
        // Errors quote what the file says, never what a variable expanded to.
        for name in ["INLET_TEST_TOKEN", "INLET_TEST_ADMIN_TOKEN", "INLET_TEST_ENGINE_URL"] {
            let value = env(name).expect("a variable of the fixed env");
            if actual.contains(&value) {
                eprintln!("\n=== {}: the errors show the value of {name}:\n{actual}", toml.display());
                failures.push(toml.display().to_string());
            }
        }
        if bless {
            std::fs::write(&err_path, &actual).unwrap_or_else(|e| panic!("writing {}: {e}", err_path.display()));
            continue;
        }
        let expected = match std::fs::read_to_string(&err_path) {
            Ok(text) => text.replace("\r\n", "\n"),
            Err(e) => {
                eprintln!("\n=== {}: cannot read {}: {e}", toml.display(), err_path.display());
                eprintln!("actual output:\n{actual}");
                failures.push(toml.display().to_string());
                continue;
            }
        };
        if expected != actual {
            eprintln!("\n=== {}: output differs from {} (- expected, + actual)", toml.display(), err_path.display());
            eprint!("{}", diff(&expected, &actual));
            failures.push(toml.display().to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} ui case(s) differ from their .err file (see the diffs above; \
         INLET_BLESS=1 cargo test --test config_ui rewrites them):\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
}

/// A line diff (longest common subsequence): ` ` both, `-` expected only, `+` actual only.
fn diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    // lcs[i][j] = length of the LCS of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out += &format!("  {}\n", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out += &format!("- {}\n", a[i]);
            i += 1;
        } else {
            out += &format!("+ {}\n", b[j]);
            j += 1;
        }
    }
    if expected.ends_with('\n') != actual.ends_with('\n') || (expected.is_empty() != actual.is_empty()) {
        out += &format!("(expected {} bytes, actual {} bytes)\n", expected.len(), actual.len());
    }
    out
}

#[test]
fn diff_marks_changed_lines() {
    assert_eq!(diff("a\nb\nc\n", "a\nx\nc\n"), "  a\n- b\n+ x\n  c\n");
    assert_eq!(diff("", "e\n"), "+ e\n(expected 0 bytes, actual 2 bytes)\n");
}

// ----- the valid file, value by value -----------------------------------------------------

fn valid() -> Config {
    load(Path::new("tests/ui/valid.toml")).unwrap_or_else(|e| panic!("tests/ui/valid.toml must load:\n{e}"))
}

#[test]
fn valid_file_expands_env_into_header_values() {
    let config = valid();
    let route = config.route("work-order-completed").expect("route work-order-completed");
    let TargetConfig::Http(http) = &route.target else { panic!("expected an http target, got {:?}", route.target) };
    // Header names are lower-cased; `${INLET_TEST_TOKEN}` comes from the fixed env.
    assert_eq!(http.headers.get("authorization").map(String::as_str), Some("Bearer s3cret"));
    assert_eq!(http.headers.len(), 1);
    // The trailing `/` of the base URL is dropped.
    assert_eq!(http.url, "https://engine.example.com/engine-rest");
    assert_eq!(http.timeout, Duration::from_secs(5));
}

#[test]
fn valid_file_applies_defaults() {
    let config = valid();
    let route = config.route("work-order-completed").expect("route work-order-completed");
    assert_eq!(route.concurrency, 8);
    assert_eq!(route.ordering, Ordering::PerKey);
    assert_eq!(route.parked, ParkedPolicy::BlockKey);
    // Lease default: 3 × the target timeout (5s) + 5s.
    assert_eq!(route.lease, Duration::from_secs(3 * 5 + 5));

    // The explicit values of the second route win over the defaults.
    let audit = config.route("audit-log").expect("route audit-log");
    assert_eq!(audit.target, TargetConfig::Log);
    assert_eq!(audit.concurrency, 2);
    assert_eq!(audit.ordering, Ordering::None);
    assert_eq!(audit.parked, ParkedPolicy::Pass);
    assert_eq!(audit.lease, Duration::from_secs(60));
}

#[test]
fn valid_file_reads_policies_store_and_server() {
    let config = valid();
    assert_eq!(config.path, Path::new("tests/ui/valid.toml"));
    assert_eq!(config.store.url, "postgres://inlet@db.internal:5432/inlet");
    assert_eq!(config.store.max_connections, 4);
    assert_eq!(config.server.listen.to_string(), "0.0.0.0:9090");
    assert_eq!(config.routes.len(), 2);

    let route = config.route("work-order-completed").expect("route work-order-completed");
    assert_eq!(route.retry.initial, Duration::from_secs(2));
    assert_eq!(route.retry.max, Duration::from_secs(300));
    assert_eq!(route.retry.multiplier, 1.5);
    assert_eq!(route.retry.jitter, 0.1);
    assert_eq!(route.retry.max_attempts, 10);
    assert_eq!(route.not_yet.deadline, Duration::from_secs(3600));
    assert_eq!(route.not_yet.max_interval, Duration::from_secs(30));
    assert_eq!(route.limits.call_timeout, Duration::from_millis(250));
    assert_eq!(route.limits.memory_bytes, 32 << 20);
    assert_eq!(route.limits.max_key_bytes, 512);
    assert_eq!((route.limits.max_label_bytes, route.limits.max_reason_bytes), (256, 4096), "the defaults");
}

#[test]
fn server_limits_are_read_and_default_to_a_ten_megabyte_pubsub_message() {
    let config = load(Path::new("tests/ui/server-limits-valid.toml")).expect("valid");
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.server.max_body_bytes, 32 << 20);
    assert_eq!(config.server.header_read_timeout, Duration::from_secs(5));
    assert_eq!(config.server.request_timeout, Duration::from_secs(120));
    assert_eq!(config.server.max_concurrent_pushes, 64);
    assert_eq!(config.server.public_hosts, ["inlet.example.com", "push.example.org"]);
    assert_eq!((config.server.max_connections, config.server.max_connections_per_peer), (2048, 16));

    let defaults = valid().server;
    // 10 MB of data is 13.4 MB as base64, plus the envelope around it.
    assert!(defaults.max_body_bytes >= 14_000_000, "{}", defaults.max_body_bytes);
    assert_eq!(defaults.header_read_timeout, Duration::from_secs(10));
    assert_eq!(defaults.request_timeout, Duration::from_secs(60));
    assert_eq!(defaults.max_concurrent_pushes, 128);
    assert!(defaults.public_hosts.is_empty());
    assert_eq!((defaults.max_connections, defaults.max_connections_per_peer), (1024, 256));
}

#[test]
fn the_shadows_pacing_is_read_and_defaults_to_a_tenth_of_a_core_and_32_mib_of_churn_a_second() {
    let config = load(Path::new("tests/ui/shadow-pacing-valid.toml")).expect("valid");
    assert_eq!((config.plugins.shadow_cpu_percent, config.plugins.shadow_memory_churn_mib_per_s), (25, 128));
    let defaults = valid().plugins;
    assert_eq!((defaults.shadow_cpu_percent, defaults.shadow_memory_churn_mib_per_s), (10, 32));
}

#[test]
fn valid_file_resolves_plugin_against_its_folder() {
    let config = valid();
    for route in &config.routes {
        // `plugin = "fake-plugin.bin"` in tests/ui/valid.toml, not in the working directory.
        assert_eq!(route.plugin, Path::new("tests/ui/fake-plugin.bin"), "route {}", route.name);
        assert!(route.plugin.is_file());
    }
}

#[test]
fn a_pinned_plugin_keeps_its_digest_in_lowercase_and_an_unpinned_one_none() {
    let path = Path::new("tests/ui/plugin-pin-valid.toml");
    let config = load(path).expect("plugin-pin-valid.toml loads");
    let pinned = config.route("pinned").expect("route pinned");
    let expected = inlet::inbox::digest_hex(&std::fs::read("tests/ui/fake-plugin.bin").unwrap());
    assert_eq!(pinned.plugin_sha256.as_deref(), Some(expected.as_str()), "stored in lowercase");
    assert!(std::fs::read_to_string(path).unwrap().contains(&expected.to_ascii_uppercase()), "written in uppercase");
    assert_eq!(pinned.plugin, Path::new("tests/ui/fake-plugin.bin"));
    assert_eq!(pinned.plugin_shown, Path::new("tests/ui/fake-plugin.bin"));
    assert_eq!(config.route("unpinned").expect("route unpinned").plugin_sha256, None);
}

#[test]
fn default_store_is_sqlite_beside_the_file() {
    let text = "[[route]]\nname = \"r\"\nplugin = \"fake-plugin.bin\"\nsource = { kind = \"push\" }\ntarget = { kind = \"log\" }\n";
    let config = Config::from_str(Path::new("tests/ui/inline.toml"), text, &env).expect("minimal file loads");
    assert_eq!(config.store.url, "sqlite://tests/ui/inlet.db");
    assert_eq!(config.store.max_connections, 8);
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    let route = &config.routes[0];
    // A log target counts as a 1s timeout: default lease 3 × 1s + 5s.
    assert_eq!(route.lease, Duration::from_secs(8));
}

#[test]
fn env_expansion_in_url_and_dollar_escape() {
    let text = "[store]\nurl = \"postgres://u:p$$w@h/db\"\n\
                [[route]]\nname = \"r\"\nplugin = \"fake-plugin.bin\"\nsource = { kind = \"push\" }\n\
                target = { kind = \"http\", url = \"${INLET_TEST_ENGINE_URL}/engine-rest\" }\n";
    let config = Config::from_str(Path::new("tests/ui/inline.toml"), text, &env).expect("file loads");
    assert_eq!(config.store.url, "postgres://u:p$w@h/db");
    let TargetConfig::Http(http) = &config.routes[0].target else { panic!("expected an http target") };
    assert_eq!(http.url, "http://engine.test:8080/engine-rest");
}

#[test]
fn lease_one_second_over_the_timeout_is_enough() {
    let route = |lease: &str| {
        format!(
            "[[route]]\nname = \"r\"\nplugin = \"fake-plugin.bin\"\nsource = {{ kind = \"push\" }}\n\
             target = {{ kind = \"http\", url = \"http://engine:8080\", timeout = \"30s\" }}\nlease = \"{lease}\"\nmax_steps = 1\n"
        )
    };
    let path = Path::new("tests/ui/inline.toml");
    let config = Config::from_str(path, &route("31s"), &env).unwrap_or_else(|e| panic!("lease 31s must load:\n{e}"));
    assert_eq!(config.routes[0].lease, Duration::from_secs(31));
    let errors = Config::from_str(path, &route("30s 999ms"), &env).expect_err("lease 30.999s must be refused");
    assert_eq!(errors.0.len(), 1);
    assert_eq!(errors.0[0].field, "route[0].lease");
    assert_eq!((errors.0[0].line, errors.0[0].column), (6, 9));

    // With the default of 3 steps an exchange may take 3 × the timeout.
    let three = |lease: &str| route(lease).replace("max_steps = 1\n", "");
    assert!(Config::from_str(path, &three("90s"), &env).is_err(), "3 × 30s needs more than 90s");
    let config = Config::from_str(path, &three("91s"), &env).expect("91s covers 3 steps of 30s");
    assert_eq!(config.routes[0].max_steps, 3);
}

#[test]
fn pubsub_source_and_target_values_and_defaults() {
    let path = Path::new("tests/ui/pubsub-valid.toml");
    let config = load(path).unwrap_or_else(|e| panic!("{e}"));
    let route = &config.routes[0];
    let SourceConfig::Pubsub(s) = &route.source else { panic!("expected a pubsub source") };
    assert_eq!(s.subscription, "projects/p/subscriptions/orders");
    assert_eq!(s.setup.topic.as_deref(), Some("projects/p/topics/orders"));
    assert_eq!((s.max_outstanding_messages, s.max_outstanding_bytes), (2000, 50 << 20));
    assert_eq!((s.batch_size, s.batch_wait), (250, Duration::from_millis(2)));
    assert_eq!(s.lease_extension, Duration::from_secs(30));
    assert_eq!(s.setup.dead_letter_topic.as_deref(), Some("projects/p/topics/orders-dlq"));
    assert_eq!(s.setup.max_delivery_attempts, 7);
    assert_eq!(s.setup.retain_acked, Some(Duration::from_secs(7 * 24 * 3600)));
    let TargetConfig::Pubsub(t) = &route.target else { panic!("expected a pubsub target") };
    assert_eq!(t.topic, "projects/p/topics/out");
    assert!(t.ordering_key);
    assert_eq!(t.timeout, Duration::from_secs(5));
    assert_eq!(t.attributes.get("origin").map(String::as_str), Some("inlet"));

    let text = "[[route]]\nname = \"r\"\nplugin = \"fake-plugin.bin\"\n\
                source = { kind = \"pubsub\", subscription = \"projects/p/subscriptions/s\" }\n\
                target = { kind = \"pubsub\", topic = \"projects/p/topics/t\" }\n";
    let config = Config::from_str(Path::new("tests/ui/inline.toml"), text, &env).expect("minimal file loads");
    let SourceConfig::Pubsub(s) = &config.routes[0].source else { panic!("expected a pubsub source") };
    assert_eq!((s.max_outstanding_messages, s.max_outstanding_bytes), (1000, 100 << 20));
    assert_eq!(
        (s.batch_size, s.batch_wait, s.lease_extension),
        (500, Duration::from_millis(5), Duration::from_secs(60))
    );
    assert_eq!(
        (s.setup.topic.as_ref(), s.setup.dead_letter_topic.as_ref(), s.setup.max_delivery_attempts),
        (None, None, 10)
    );
    assert_eq!(s.setup.retain_acked, None, "no retention is asked for unless the file says so");
    let TargetConfig::Pubsub(t) = &config.routes[0].target else { panic!("expected a pubsub target") };
    assert!(!t.ordering_key && t.attributes.is_empty());
    assert_eq!(t.timeout, Duration::from_secs(10));
}

// ----- directories of routing files ---------------------------------------------------------

#[test]
fn a_directory_reads_every_team_file_with_paths_relative_to_each() {
    let path = Path::new("tests/ui/dir-valid");
    let config = load(path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.path, path);
    // The store and the listener come from the one file that declares them.
    assert_eq!(config.store.url, "sqlite://tests/ui/dir-valid/inbox.db");
    assert_eq!(config.server.listen.to_string(), "0.0.0.0:9090");
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["audit-log", "work-order-completed"], "files in name order");
    let orders = config.route("work-order-completed").unwrap();
    assert_eq!(orders.file, Path::new("tests/ui/dir-valid/orders.toml"));
    assert_eq!(orders.plugin, Path::new("tests/ui/dir-valid/../fake-plugin.bin"));
    assert!(config.refused.is_empty());
}

#[test]
fn a_partial_load_refuses_only_the_broken_routes_and_files() {
    let config = Config::load_partial_with(Path::new("tests/ui/dir-team-file-broken"), &env)
        .unwrap_or_else(|e| panic!("the platform file is fine, so the load goes on:\n{e}"));
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["returns"], "the one route without errors");
    let refused: Vec<(Option<&str>, String)> = config
        .refused
        .iter()
        .map(|r| (r.name.as_ref().map(|n| n.as_str()), r.file.file_name().unwrap().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(
        refused,
        [(Some("invoices"), "billing.toml".to_string()), (Some("orders"), "orders.toml".to_string())],
        "a file that does not parse still names its routes"
    );
    assert!(config.refused[0].errors.to_string().contains("unknown field `retyr`"));

    // Errors in the shared settings stop the whole load.
    assert!(Config::load_partial_with(Path::new("tests/ui/dir-two-stores"), &env).is_err());
    assert!(Config::load_partial_with(Path::new("tests/ui/dir-no-store"), &env).is_err());
}

#[test]
fn the_store_alone_loads_whatever_the_routes_say() {
    let store = inlet::config::load_store(Path::new("tests/ui/dir-team-file-broken")).unwrap();
    assert_eq!(store.url, "sqlite://tests/ui/dir-team-file-broken/inbox.db");
    let store = inlet::config::load_store(Path::new("tests/ui/missing-plugin.toml")).unwrap();
    assert_eq!(store.url, "sqlite://tests/ui/inlet.db", "the default beside the file");
}

#[test]
fn push_auth_audience_may_name_each_route_and_a_shared_one_is_warned_about() {
    let routes = |audience: &str| {
        format!(
            "[push]\nauth = {{ audience = \"{audience}\", service_account = \"push@acme.test\" }}\n\
             [[route]]\nname = \"orders\"\nplugin = \"fake-plugin.bin\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n\
             [[route]]\nname = \"billing\"\nplugin = \"fake-plugin.bin\"\nsource = {{ kind = \"push\" }}\ntarget = {{ kind = \"log\" }}\n"
        )
    };
    let path = Path::new("tests/ui/inline.toml");
    let audience = |config: &Config, route: &str| match &config.route(route).unwrap().push_auth {
        Some(inlet::config::PushAuth::Oidc(o)) => o.audience.clone(),
        other => panic!("{route}: {other:?}"),
    };
    let config = Config::from_str(path, &routes("https://inlet.test/push/{route}"), &env).unwrap();
    assert_eq!(audience(&config, "orders"), "https://inlet.test/push/orders");
    assert_eq!(audience(&config, "billing"), "https://inlet.test/push/billing");
    let shared =
        |c: &Config| c.access_warnings().into_iter().filter(|w| w.contains("one audience")).collect::<Vec<_>>();
    assert_eq!(shared(&config), Vec::<String>::new());

    let config = Config::from_str(path, &routes("https://inlet.test/push"), &env).unwrap();
    assert_eq!(audience(&config, "orders"), "https://inlet.test/push");
    let warnings = shared(&config);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("`orders`, `billing`"), "{warnings:?}");
}
