//! A Kubernetes ConfigMap mounted as a folder, updated the way kubelet does it: the
//! files live in a timestamped directory `..2026_…`, `..data` links to it, and each key
//! is a link `KEY -> ..data/KEY` that never changes. An update writes a new timestamped
//! directory, links `..data_tmp` to it, renames `..data_tmp` over `..data` (the one
//! atomic step) and removes the old directory. A real `inlet run` on such a folder
//! picks up a changed team file and a new plugin build within two polls of its reload
//! timer, with no refusal counted and no error logged.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::push_work_order;
use inlet_testkit::recording_target::RecordingTarget;
use inlet_testkit::utc::utc_now;
use inlet_testkit::wait::wait_until;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// `inlet run`'s reload timer (`app::Options::reload_every`'s default; `inlet run` has
/// no flag for it).
const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// What "within two polls" allows: two timer periods, plus slack for compiling a new
/// plugin build and the test's own 50 ms polling on a shared machine.
const WITHIN_TWO_POLLS: Duration = Duration::from_millis(2 * 2_000 + 1_500);

/// A ConfigMap volume as kubelet's atomic writer keeps it.
struct ConfigMapVolume {
    dir: PathBuf,
    /// The timestamped directory `..data` links to now.
    current: Option<String>,
}

impl ConfigMapVolume {
    fn new(dir: &Path) -> ConfigMapVolume {
        std::fs::create_dir(dir).unwrap();
        ConfigMapVolume { dir: dir.to_path_buf(), current: None }
    }

    /// Projects `files` as kubelet does, and returns when `..data` was renamed (the
    /// moment the new version became visible through the keys' links).
    fn project(&mut self, files: &[(&str, Vec<u8>)]) -> Instant {
        // A new timestamped directory with the payload.
        let name = timestamped_dir_name();
        let fresh = self.dir.join(&name);
        std::fs::create_dir(&fresh).unwrap();
        for (key, bytes) in files {
            std::fs::write(fresh.join(key), bytes).unwrap();
        }
        // `..data_tmp -> ..<new>`, renamed over `..data`.
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        let swapped = Instant::now();
        // The keys' links, made once: `KEY -> ..data/KEY`.
        for (key, _) in files {
            let link = self.dir.join(key);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(key), &link).unwrap();
            }
        }
        // The old directory goes, with the files Inlet read before.
        if let Some(old) = self.current.replace(name) {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
        // Last, the links of keys no longer in the ConfigMap (dangling since the rename).
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let entry = entry.unwrap();
            let key = entry.file_name().to_string_lossy().into_owned();
            if !key.starts_with("..") && !files.iter().any(|(k, _)| *k == key) {
                std::fs::remove_file(entry.path()).unwrap();
            }
        }
        swapped
    }

    /// The folder's entries, sorted.
    fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// `..2026_12_04_03_00_00.123456789`, as kubelet names its directories (UTC time, then
/// a unique suffix).
fn timestamped_dir_name() -> String {
    let t = utc_now();
    format!("..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{:09}", t.year, t.month, t.day, t.hour, t.minute, t.second, t.nanos)
}

/// The race behind a refused reload, without a process around it: one thread swaps
/// versions back to back (every other one with a key more) while this one reads the
/// folder through `config::read_version`, as the reload and its digest do. Every read
/// succeeds, always holds the keys every version has, and is one version: every file
/// it returns carries the same version number. A read that resolved a key through the
/// folder being removed used to fail, so one reload in some thousands was refused.
#[test]
fn a_read_of_a_folder_under_back_to_back_swaps_is_always_one_whole_version() {
    let dir = tempfile::tempdir().unwrap();
    let files = |version: u64| {
        let mut files = vec![
            ("inlet.toml", format!("# version {version}\n").into_bytes()),
            ("orders.toml", format!("# version {version}\n").into_bytes()),
        ];
        if version.is_multiple_of(2) {
            files.push(("extra.toml", format!("# version {version}\n").into_bytes()));
        }
        files
    };
    let mut volume = ConfigMapVolume::new(&dir.path().join("routes"));
    volume.project(&files(0));
    let folder = volume.dir.clone();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut version = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                version += 1;
                volume.project(&files(version));
            }
            version
        })
    };
    let started = Instant::now();
    let (mut reads, mut seen) = (0u64, std::collections::BTreeSet::new());
    while started.elapsed() < Duration::from_secs(3) {
        let read = inlet::config::read_version(&folder)
            .unwrap_or_else(|(file, e)| panic!("read {reads} failed at {}: {e}", file.display()));
        let names: Vec<String> =
            read.iter().map(|(f, _)| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert!(names.contains(&"inlet.toml".to_string()) && names.contains(&"orders.toml".to_string()), "{names:?}");
        let versions: std::collections::BTreeSet<String> =
            read.iter().map(|(_, bytes)| String::from_utf8(bytes.clone()).unwrap()).collect();
        assert_eq!(versions.len(), 1, "read {reads} mixes versions: {versions:?}");
        let version = versions.into_iter().next().unwrap();
        let even = version.trim_end().rsplit(' ').next().unwrap().parse::<u64>().unwrap() % 2 == 0;
        assert_eq!(names.contains(&"extra.toml".to_string()), even, "{version}: {names:?}");
        seen.insert(version);
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    eprintln!("{reads} reads saw {} of {swaps} versions", seen.len());
    assert!(seen.len() >= 10, "the reads met too few swaps to say anything: {} of {swaps}", seen.len());
}

/// A push route to the plugin `plugin.wasm` beside the file (a key of the same
/// ConfigMap), delivering to `target`.
fn route(name: &str, target: &RecordingTarget, timeout: &str) -> String {
    format!(
        "[[route]]\nname = \"{name}\"\nplugin = \"plugin.wasm\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"http://{}\", timeout = \"{timeout}\" }}\n\n",
        target.addr()
    )
}

async fn routes_api(http: &reqwest::Client, base: &str) -> Value {
    let r = http.get(format!("{base}/api/routes")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    serde_json::from_str(&r.text().await.unwrap()).unwrap()
}

fn route_in<'a>(api: &'a Value, name: &str) -> Option<&'a Value> {
    api["routes"].as_array()?.iter().find(|r| r["name"] == name)
}

/// `/api/routes` lists `count` routes, every one up with no error, and no refused file.
fn assert_all_up(api: &Value, count: usize) {
    let routes = api["routes"].as_array().unwrap();
    assert_eq!(routes.len(), count, "{api}");
    assert!(routes.iter().all(|r| r["state"] == "up" && r["error"].is_null()), "{api}");
    assert_eq!(api["refused_files"], serde_json::json!([]), "{api}");
}

/// Polls `/api/routes` every 50 ms until `done` holds, and returns how long after
/// `since` it was first seen to (an upper bound of the reload's delay) with the answer.
/// Gives up after [`WAIT`], returning the time waited, so a slow reload is reported as
/// a delay rather than a hang.
async fn seen_after(
    http: &reqwest::Client,
    base: &str,
    since: Instant,
    done: impl Fn(&Value) -> bool,
) -> (Duration, Value) {
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    loop {
        ticks.tick().await;
        let api = routes_api(http, base).await;
        if done(&api) || since.elapsed() > WAIT {
            return (since.elapsed(), api);
        }
    }
}

/// The sum of every sample of `metric` whose labels contain all of `labels`.
fn metric_sum(metrics: &str, metric: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} ")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_configmap_swap_reloads_routes_and_plugins_within_two_polls_with_no_refusal() {
    let target = RecordingTarget::start().await;
    let dir = tempfile::tempdir().unwrap();
    // The inbox lives outside the ConfigMap (which Kubernetes mounts read-only).
    let inbox = dir.path().join("state").join("inbox.db");
    std::fs::create_dir(inbox.parent().unwrap()).unwrap();
    let shared = format!("[store]\nurl = \"sqlite://{}\"\n\n[admin]\nauth = \"none-loopback\"\n", inbox.display());
    let work_order = std::fs::read(plugin_path("work_order")).unwrap();
    let work_order_next = std::fs::read(plugin_path("work_order_next")).unwrap();

    let mut volume = ConfigMapVolume::new(&dir.path().join("routes"));
    volume.project(&[
        ("inlet.toml", shared.clone().into_bytes()),
        ("orders.toml", route("orders", &target, "5s").into_bytes()),
        ("plugin.wasm", work_order.clone()),
    ]);
    let first_dir = volume.current.clone().unwrap();

    let listen = format!("127.0.0.1:{}", free_port());
    let cache = dir.path().join("plugin-cache");
    let cache = cache.to_str().unwrap();
    let mut inlet = InletProcess::spawn_with_args(
        &volume.dir,
        &["--listen", &listen, "--poll", "50ms", "--plugin-cache", cache],
        &[],
    );
    inlet.wait_healthy(WAIT).await;
    let base = inlet.base.clone();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();

    // Started on the folder: the keys' links are its routing files, read once each (a
    // second reading of a file, through `..data` or the timestamped directory, would
    // declare `orders` twice and refuse it).
    let api = routes_api(&http, &base).await;
    let names: Vec<&str> = api["routes"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, ["orders"], "{api}");
    assert_eq!(route_in(&api, "orders").unwrap()["state"], "up", "{api}");
    assert_eq!(api["refused_files"], serde_json::json!([]), "{api}");
    assert_eq!(route_in(&api, "orders").unwrap()["plugin_sha256"], inlet::inbox::digest_hex(&work_order), "{api}");
    assert_eq!(push_work_order(&http, &base, "orders", "o-1", 1).await.0, 200);
    wait_until("orders delivered", WAIT, || async { target.requests().len() == 1 }).await;
    assert_eq!(target.requests()[0].path, "/engine-rest/message");

    // (a) The team file changes: a second route, and a longer timeout for the first.
    // Wait for a reload tick to pass first, so the swap lands at an arbitrary point of
    // the timer's period rather than just after start.
    tokio::time::sleep(RELOAD_EVERY / 2).await; // off the timer's phase on purpose
    let team = route("orders", &target, "7s") + &route("billing", &target, "5s");
    let swapped = volume.project(&[
        ("inlet.toml", shared.clone().into_bytes()),
        ("orders.toml", team.into_bytes()),
        ("plugin.wasm", work_order.clone()),
    ]);
    assert!(!volume.dir.join(&first_dir).exists(), "the old timestamped directory was removed");
    let (route_delay, api) =
        seen_after(&http, &base, swapped, |api| route_in(api, "billing").is_some_and(|r| r["state"] == "up")).await;
    eprintln!("configmap swap (a), new route: served {route_delay:?} after the rename");
    assert!(
        route_delay <= WITHIN_TWO_POLLS,
        "the new route served {route_delay:?} after the swap, more than two polls ({WITHIN_TWO_POLLS:?}): {api}"
    );
    assert_all_up(&api, 2);
    assert_eq!(push_work_order(&http, &base, "billing", "b-1", 1).await.0, 200);
    assert_eq!(push_work_order(&http, &base, "orders", "o-2", 1).await.0, 200);
    wait_until("billing and orders delivered after the swap", WAIT, || async { target.requests().len() == 3 }).await;

    // (b) A new plugin build under the same key (the team file as it was).
    tokio::time::sleep(RELOAD_EVERY / 3).await;
    let second_dir = volume.current.clone().unwrap();
    let next_digest = inlet::inbox::digest_hex(&work_order_next);
    let swapped = volume.project(&[
        ("inlet.toml", shared.clone().into_bytes()),
        ("orders.toml", (route("orders", &target, "7s") + &route("billing", &target, "5s")).into_bytes()),
        ("plugin.wasm", work_order_next.clone()),
    ]);
    assert!(!volume.dir.join(&second_dir).exists(), "the old timestamped directory was removed");
    let (plugin_delay, api) = seen_after(&http, &base, swapped, |api| {
        ["orders", "billing"].iter().all(|n| route_in(api, n).is_some_and(|r| r["plugin_sha256"] == next_digest))
    })
    .await;
    eprintln!("configmap swap (b), new plugin build: running {plugin_delay:?} after the rename");
    assert!(
        plugin_delay <= WITHIN_TWO_POLLS,
        "the new plugin ran {plugin_delay:?} after the swap, more than two polls ({WITHIN_TWO_POLLS:?}): {api}"
    );
    assert_all_up(&api, 2);
    // The new build renders ids ending in 7 to its new path; others as before.
    assert_eq!(push_work_order(&http, &base, "orders", "o-17", 1).await.0, 200);
    assert_eq!(push_work_order(&http, &base, "billing", "b-2", 1).await.0, 200);
    wait_until("both delivered by the new build", WAIT, || async { target.requests().len() == 5 }).await;
    let paths: Vec<(String, String)> = target.requests().iter().map(|r| (r.key.clone(), r.path.clone())).collect();
    assert!(paths.contains(&("o-17".into(), "/engine-rest/v2/message".into())), "{paths:?}");
    assert!(paths.contains(&("b-2".into(), "/engine-rest/message".into())), "{paths:?}");

    // Let two more reload ticks pass over the settled folder: nothing more happens.
    tokio::time::sleep(2 * RELOAD_EVERY + Duration::from_millis(200)).await;

    // No refusal counted anywhere, the swaps applied, nothing logged as an error.
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    assert_eq!(metric_sum(&metrics, "inlet_route_load_failures_total", &[]), 0.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, "inlet_config_reloads_total", &["outcome=\"refused\""]), 0.0, "{metrics}");
    assert!(metric_sum(&metrics, "inlet_config_reloads_total", &["outcome=\"ok\""]) >= 1.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, "inlet_plugin_reloads_total", &["outcome=\"refused\""]), 0.0, "{metrics}");
    for route in ["orders", "billing"] {
        let label = format!("route=\"{route}\"");
        assert_eq!(
            metric_sum(&metrics, "inlet_plugin_reloads_total", &[&label, "outcome=\"ok\""]),
            1.0,
            "{route}: one swap to the new build: {metrics}"
        );
        assert!(metrics.contains(&format!("inlet_route_up{{{label}}} 1")), "{metrics}");
    }
    assert_eq!(metric_sum(&metrics, "inlet_routing_files_refused", &[]), 0.0, "{metrics}");
    let log = inlet.log();
    assert!(log.contains("added=[\"billing\"] changed=[\"orders\"] removed=[]"), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "errors logged: {errors:#?}");
    // The folder holds kubelet's entries only: Inlet wrote nothing into the ConfigMap.
    let current = volume.current.clone().unwrap();
    assert_eq!(
        volume.entries(),
        [current.as_str(), "..data", "inlet.toml", "orders.toml", "plugin.wasm"],
        "one timestamped directory, `..data` and the keys"
    );
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(WAIT).success());
}

/// Kubelet's swaps as fast as it can make them, a key (a team file) appearing and
/// disappearing with every other one, while reloads are forced back to back
/// (`POST /api/reload`): a file listed by a reload and gone when it reads it is a file
/// that was removed, not a broken one, so nothing is refused or logged as an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_coming_and_going_under_back_to_back_reloads_is_never_refused() {
    let target = RecordingTarget::start().await;
    let dir = tempfile::tempdir().unwrap();
    let inbox = dir.path().join("inbox.db");
    let shared = format!("[store]\nurl = \"sqlite://{}\"\n\n[admin]\nauth = \"none-loopback\"\n", inbox.display());
    let work_order = std::fs::read(plugin_path("work_order")).unwrap();
    let base_files = vec![
        ("inlet.toml", shared.into_bytes()),
        ("orders.toml", route("orders", &target, "5s").into_bytes()),
        ("plugin.wasm", work_order),
    ];
    let mut volume = ConfigMapVolume::new(&dir.path().join("routes"));
    volume.project(&base_files);

    let listen = format!("127.0.0.1:{}", free_port());
    let cache = dir.path().join("plugin-cache");
    let mut inlet = InletProcess::spawn_with_args(
        &volume.dir,
        &["--listen", &listen, "--poll", "50ms", "--plugin-cache", cache.to_str().unwrap()],
        &[],
    );
    inlet.wait_healthy(WAIT).await;
    let base = inlet.base.clone();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reloader = {
        let (http, base, stop) = (http.clone(), base.clone(), std::sync::Arc::clone(&stop));
        tokio::spawn(async move {
            let mut reloads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = http.post(format!("{base}/api/reload")).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 200);
                reloads += 1;
            }
            reloads
        })
    };
    let extra = route("extra", &target, "5s").into_bytes();
    let started = Instant::now();
    let mut swaps = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let mut files = base_files.clone();
        if swaps % 2 == 0 {
            files.push(("extra.toml", extra.clone()));
        }
        let volume_files = files;
        volume = tokio::task::spawn_blocking(move || {
            volume.project(&volume_files);
            volume
        })
        .await
        .unwrap();
        swaps += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reloads = reloader.await.unwrap();
    eprintln!("{swaps} swaps under {reloads} forced reloads");

    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let log = inlet.log();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("refused") || l.contains("WARN")).collect();
    assert_eq!(
        metric_sum(&metrics, "inlet_config_reloads_total", &["outcome=\"refused\""]),
        0.0,
        "{metrics}\nwhat the log says of it: {refusals:#?}"
    );
    assert_eq!(metric_sum(&metrics, "inlet_route_load_failures_total", &[]), 0.0, "{metrics}");
    assert_eq!(metric_sum(&metrics, "inlet_plugin_reloads_total", &["outcome=\"refused\""]), 0.0, "{metrics}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "errors logged: {errors:#?}");
    inlet.assert_running();
    assert!(inlet.sigterm_and_wait(WAIT).success());
}
