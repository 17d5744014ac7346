//! The compiled-plugin cache holds native code the host loads without validation:
//! it is created private, and a folder others can write to is not used.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::plugin_path;

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
