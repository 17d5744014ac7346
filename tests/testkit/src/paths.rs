//! Where things are: the repository, the compiled guest plugins, the `inlet` binary.

use std::path::{Path, PathBuf};

/// The repository's root (the `inlet` package): this crate is its `tests/testkit/`.
pub fn repo_root() -> &'static Path {
    let testkit = Path::new(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().and_then(Path::parent).expect("the testkit lies two folders below the repository's root")
}

/// Path of a compiled guest plugin, `plugins/dist/<name>.wasm` (cargo's file name: the
/// crate name with `_`, e.g. `work_order`). Panics if it has not been built.
pub fn plugin_path(name: &str) -> PathBuf {
    let path = repo_root().join("plugins").join("dist").join(format!("{name}.wasm"));
    if !path.is_file() {
        panic!("plugin {name} not built: run scripts/build-plugins (looked for {})", path.display());
    }
    path
}

/// The `inlet` binary cargo built for the test or benchmark running now.
///
/// `env!("CARGO_BIN_EXE_inlet")` is set only while cargo compiles the root package's
/// tests and benchmarks, not this crate; cargo also sets it in their environment when it
/// runs them, which is what is read here. A test binary started by hand finds the binary
/// where cargo puts it beside the `deps/` folder the test binary is in.
pub fn inlet_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_inlet").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("inlet")))
        .filter(|path| path.is_file());
    beside.unwrap_or_else(|| {
        panic!(
            "the inlet binary is not known: CARGO_BIN_EXE_inlet is not set and there is no inlet beside this \
             test's deps/ folder; run the test through cargo"
        )
    })
}
