//! The compiled-plugin cache holds native code the host loads without validation:
//! it is created private, a folder others can write to or another user owns is not
//! used, and a cache file is loaded only when it is Inlet's user's own regular file,
//! never through a symbolic link. Tests run as root, so they
//! can hand a folder or a file to another user.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use inlet::plugin::{Plugin, wit};
use inlet_testkit::camunda::FakeCamunda;
use inlet_testkit::paths::plugin_path;
use inlet_testkit::ports::free_port;
use inlet_testkit::process::InletProcess;
use inlet_testkit::push::{post_push, push_envelope};
use inlet_testkit::wait::wait_until;

/// `nobody`: a user other than the one running the tests.
const OTHER_UID: u32 = 65534;

/// Everything logged in this test binary, captured by a global subscriber (a plugin
/// is compiled on a thread of its own, so a thread-local subscriber would miss it).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;
    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}

fn log() -> &'static Log {
    static LOG: OnceLock<Log> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Log::default();
        let subscriber =
            tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).with_max_level(tracing::Level::INFO);
        tracing::subscriber::set_global_default(subscriber.finish()).expect("the only subscriber");
        log
    })
}

/// The lines logged so far that mention `what`.
fn logged(what: &Path) -> Vec<String> {
    let text = String::from_utf8_lossy(&log().0.lock().unwrap()).into_owned();
    text.lines().filter(|l| l.contains(&*what.to_string_lossy())).map(str::to_string).collect()
}

fn cwasm_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect()
}

fn message(data: &[u8]) -> wit::Message {
    wit::Message {
        data: data.to_vec(),
        attributes: vec![],
        message_id: "m".into(),
        publish_time: None,
        delivery_attempt: None,
    }
}

/// The correlation key the plugin decodes from a work order `wo-7`: `wo-7` for the
/// work-order plugin, `k` for unruly (which reads its own fields and defaults) — so a
/// test can tell which compiled code was loaded.
async fn decoded_key(plugin: &Plugin) -> String {
    let data = br#"{"workOrderId":"wo-7","completedItems":1,"completionTimestamp":"t"}"#;
    match plugin.decode(message(data)).await {
        Ok(Ok(wit::Decoded::Event(ev))) => ev.correlation_key,
        other => panic!("not an event: {other:?}"),
    }
}

/// The cache file of `plugin` in a fresh cache folder under `root`: its name is what
/// the cache looks for, its content the compiled component.
fn compiled(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(format!("compiled-{name}"));
    Plugin::load(&plugin_path(name), inlet::config::PluginLimits::default(), Some(&dir)).expect("loads");
    let files = cwasm_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[test]
fn the_compiled_plugin_cache_is_private_or_not_used() {
    let cwasm = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "cwasm"))
            .count()
    };
    let plugin = plugin_path("work_order");
    let limits = inlet::config::PluginLimits::default();
    let root = tempfile::tempdir().unwrap();

    let fresh = root.path().join("new").join("components");
    inlet::plugin::Plugin::load(&plugin, limits.clone(), Some(&fresh)).expect("loads");
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "created private");
    assert_eq!(cwasm(&fresh), 1, "and used");

    let shared = root.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    inlet::plugin::Plugin::load(&plugin, limits, Some(&shared)).expect("loads without the cache");
    assert_eq!(cwasm(&shared), 0, "a world-writable cache is neither read nor written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_folder_owned_by_another_user_is_refused_and_plugins_still_load() {
    log();
    let plugin = plugin_path("work_order");
    let root = tempfile::tempdir().unwrap();
    let foreign = root.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&foreign, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    // What the other user left there: unruly's code under work-order's name.
    let planted = foreign.join(compiled(root.path(), "work_order").file_name().unwrap());
    std::fs::copy(compiled(root.path(), "unruly"), &planted).unwrap();
    std::os::unix::fs::chown(&planted, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let before = std::fs::read(&planted).unwrap();

    let loaded = Plugin::load(&plugin, inlet::config::PluginLimits::default(), Some(&foreign)).expect("loads uncached");
    assert_eq!(decoded_key(&loaded).await, "wo-7", "work-order's own code, compiled, not the planted file");
    assert_eq!(std::fs::read(&planted).unwrap(), before, "the folder is neither read nor written");
    assert_eq!(cwasm_files(&foreign).len(), 1);
    let lines = logged(&foreign);
    assert!(
        lines.iter().any(|l| l.contains("ERROR") && l.contains("owned by another user") && l.contains("65534")),
        "the refusal is logged as an error: {lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_file_is_loaded_only_when_it_is_inlets_own_and_no_link() {
    log();
    let plugin = plugin_path("work_order");
    let limits = inlet::config::PluginLimits::default;
    let root = tempfile::tempdir().unwrap();
    let unruly = compiled(root.path(), "unruly");
    let unruly_bytes = std::fs::read(&unruly).unwrap();
    let name = compiled(root.path(), "work_order").file_name().unwrap().to_owned();

    // The control: a file of Inlet's own user under that name is trusted and loaded,
    // so the decoded key tells which code ran.
    let own = root.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::fs::copy(&unruly, own.join(&name)).unwrap();
    let loaded = Plugin::load(&plugin, limits(), Some(&own)).unwrap();
    assert_eq!(decoded_key(&loaded).await, "k", "the cache file's code is what runs");

    // A symbolic link to that same code is not followed: compiled afresh, and the
    // new file replaces the link, not what it points to.
    let linked = root.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&unruly, linked.join(&name)).unwrap();
    let loaded = Plugin::load(&plugin, limits(), Some(&linked)).unwrap();
    assert_eq!(decoded_key(&loaded).await, "wo-7", "the link was not followed");
    let replaced = std::fs::symlink_metadata(linked.join(&name)).unwrap();
    assert!(replaced.file_type().is_file(), "the link is replaced by a file of its own");
    assert_eq!(std::fs::read(&unruly).unwrap(), unruly_bytes, "the link's target is untouched");
    let lines = logged(&linked);
    assert!(lines.iter().any(|l| l.contains("symbolic link")), "logged: {lines:#?}");
    let loaded = Plugin::load(&plugin, limits(), Some(&linked)).unwrap();
    assert_eq!(decoded_key(&loaded).await, "wo-7", "and the cache works again");

    // A file another user owns, in Inlet's own folder, is not loaded either.
    let foreign_file = root.path().join("foreign-file");
    std::fs::create_dir(&foreign_file).unwrap();
    std::fs::copy(&unruly, foreign_file.join(&name)).unwrap();
    std::os::unix::fs::chown(foreign_file.join(&name), Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let loaded = Plugin::load(&plugin, limits(), Some(&foreign_file)).unwrap();
    assert_eq!(decoded_key(&loaded).await, "wo-7", "another user's file was not loaded");
    let lines = logged(&foreign_file);
    assert!(lines.iter().any(|l| l.contains("owned by uid 65534")), "logged: {lines:#?}");

    // And one of Inlet's own that others may write.
    let writable = root.path().join("writable-file");
    std::fs::create_dir(&writable).unwrap();
    std::fs::copy(&unruly, writable.join(&name)).unwrap();
    std::fs::set_permissions(writable.join(&name), std::fs::Permissions::from_mode(0o666)).unwrap();
    let loaded = Plugin::load(&plugin, limits(), Some(&writable)).unwrap();
    assert_eq!(decoded_key(&loaded).await, "wo-7", "a file others may write was not loaded");
    let lines = logged(&writable);
    assert!(lines.iter().any(|l| l.contains("writable by group or others")), "logged: {lines:#?}");
}

/// The same, as an operator meets it: `inlet run` with its default cache folder
/// (`$XDG_CACHE_HOME/inlet/components`) owned by another user logs the refusal and
/// serves, its plugins compiled without the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inlet_run_with_a_foreign_cache_folder_logs_it_and_delivers() {
    let dir = tempfile::tempdir().unwrap();
    let components = dir.path().join("xdg").join("inlet").join("components");
    std::fs::create_dir_all(&components).unwrap();
    std::fs::set_permissions(&components, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&components, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let target = FakeCamunda::start().await;
    let config = dir.path().join("inlet.toml");
    let text = format!(
        "[store]\nurl = \"sqlite://{}\"\n\n[[route]]\nname = \"orders\"\nplugin = \"{}\"\nsource = {{ kind = \"push\" }}\n\
         target = {{ kind = \"http\", url = \"{}\", timeout = \"2s\" }}\n",
        dir.path().join("inbox.db").display(),
        plugin_path("work_order").display(),
        target.url()
    );
    std::fs::write(&config, text).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let xdg = dir.path().join("xdg");
    let mut inlet =
        InletProcess::spawn_with_args(&config, &["--listen", &listen], &[("XDG_CACHE_HOME", xdg.to_str().unwrap())]);
    inlet.wait_healthy(std::time::Duration::from_secs(60)).await;
    let data = br#"{"workOrderId":"4711","completedItems":3,"completionTimestamp":"2026-08-01T10:00:00Z"}"#;
    let envelope = push_envelope(data, &[], "m-1");
    assert_eq!(post_push(&reqwest::Client::new(), &inlet.base, "orders", &envelope).await, 200);
    wait_until("the message to be delivered", std::time::Duration::from_secs(30), || async { target.count() == 1 })
        .await;
    let log = inlet.log();
    assert!(
        log.lines().any(|l| l.contains("ERROR")
            && l.contains("owned by another user")
            && l.contains(&*components.to_string_lossy())),
        "the refusal is logged as an error:\n{log}"
    );
    assert!(cwasm_files(&components).is_empty(), "nothing was written to the foreign folder");
}
