//! `inlet plugin new` and `inlet plugin wit`: what a product team needs to write a
//! plugin in a repository of its own. `new` writes a standalone project (the code,
//! the contract's WIT as this host checks it, samples with their expected reports, a
//! build script and a test script that runs `inlet plugin test` over every sample)
//! from templates embedded in the binary (`templates/plugin/`); nothing in it points
//! back into Inlet's source tree.

use std::path::{Path, PathBuf};

use crate::plugin::{CONTRACTS, Contract};

/// The language of a new plugin project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// cargo, wasm32-wasip2, wit-bindgen from crates.io.
    Rust,
    /// componentize-py from PyPI.
    Python,
}

/// One file of a template: its path in the project, its text (with `{{name}}`-style
/// placeholders), and whether it is a script.
struct Template {
    path: &'static str,
    text: &'static str,
    executable: bool,
}

macro_rules! template {
    ($path:literal, $source:literal) => {
        Template { path: $path, text: include_str!(concat!("../templates/plugin/", $source)), executable: false }
    };
    ($path:literal, $source:literal, executable) => {
        Template { path: $path, text: include_str!(concat!("../templates/plugin/", $source)), executable: true }
    };
}

/// Files of both languages. The samples' expected reports are per language (a decode
/// error's wording is the language's own).
const COMMON: &[Template] = &[
    template!("test.sh", "common/test.sh", executable),
    template!("samples/created/message.json", "common/samples/created/message.json"),
    template!("samples/created/attributes", "common/samples/created/attributes"),
    template!("samples/created/response.json", "common/samples/created/response.json"),
    template!("samples/server-error/message.json", "common/samples/server-error/message.json"),
    template!("samples/server-error/response.json", "common/samples/server-error/response.json"),
    template!("samples/rejected/message.json", "common/samples/rejected/message.json"),
    template!("samples/rejected/response.json", "common/samples/rejected/response.json"),
    template!("samples/not-json/message.txt", "common/samples/not-json/message.txt"),
];

const RUST: &[Template] = &[
    template!("Cargo.toml", "rust/Cargo.toml"),
    // Every crate of the build at the version this template was tested with.
    template!("Cargo.lock", "rust/Cargo.lock"),
    template!("rust-toolchain.toml", "rust/rust-toolchain.toml"),
    template!("src/lib.rs", "rust/src/lib.rs"),
    template!("build.sh", "rust/build.sh", executable),
    template!("README.md", "rust/README.md"),
    template!(".gitignore", "rust/gitignore"),
    template!("samples/created/expected.json", "rust/expected/created.json"),
    template!("samples/server-error/expected.json", "rust/expected/server-error.json"),
    template!("samples/rejected/expected.json", "rust/expected/rejected.json"),
    template!("samples/not-json/expected.json", "rust/expected/not-json.json"),
];

const PYTHON: &[Template] = &[
    template!("src/app.py", "python/src/app.py"),
    template!("requirements.txt", "python/requirements.txt"),
    template!("build.sh", "python/build.sh", executable),
    template!("README.md", "python/README.md"),
    template!(".gitignore", "python/gitignore"),
    template!("samples/created/expected.json", "python/expected/created.json"),
    template!("samples/server-error/expected.json", "python/expected/server-error.json"),
    template!("samples/rejected/expected.json", "python/expected/rejected.json"),
    template!("samples/not-json/expected.json", "python/expected/not-json.json"),
];

/// The contract a new project is written against: the newest this host supports.
fn newest_contract() -> &'static Contract {
    CONTRACTS.last().expect("the host supports a contract")
}

/// A plugin name: what cargo and Python accept as a package name once dashes become
/// underscores, and what reads well as a file name and event type.
fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && !name.contains("--")
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a plugin name: use 1 to 64 lower-case letters, digits and single dashes, starting with a letter (e.g. `acme-orders`)"
        ))
    }
}

/// The files of a new project, placeholders filled in: (path in the project, text,
/// executable).
pub fn project_files(name: &str, lang: Lang) -> Result<Vec<(String, String, bool)>, String> {
    check_name(name)?;
    let contract = newest_contract();
    let crate_name = name.replace('-', "_");
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &crate_name)
            .replace("{{contract}}", contract.interface)
            .replace("{{inlet_version}}", env!("CARGO_PKG_VERSION"))
    };
    let own = match lang {
        Lang::Rust => RUST,
        Lang::Python => PYTHON,
    };
    let mut files: Vec<(String, String, bool)> =
        COMMON.iter().chain(own).map(|t| (t.path.to_string(), fill(t.text), t.executable)).collect();
    // The contract exactly as the host checks it: never filled in.
    files.push(("wit/plugin.wit".to_string(), contract.wit.to_string(), false));
    files.sort();
    Ok(files)
}

/// Writes a new project into `dir` (created if missing; refused if it holds anything).
/// Returns the paths written, relative to `dir`.
pub fn create(name: &str, lang: Lang, dir: &Path) -> Result<Vec<String>, String> {
    let files = project_files(name, lang)?;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!("{} is not empty: choose a new folder with --dir", dir.display()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    }
    let mut written = Vec::new();
    for (path, text, executable) in files {
        let target = dir.join(&path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        write_new(&target, text.as_bytes(), executable)?;
        written.push(path);
    }
    Ok(written)
}

/// Creates `path` (never overwriting: a file that appeared meanwhile is an error).
fn write_new(path: &Path, bytes: &[u8], executable: bool) -> Result<(), String> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if executable { 0o755 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = executable;
    let mut file = options.open(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `inlet plugin wit --out DIR`: each supported contract's WIT package in
/// `DIR/VERSION/plugin.wit`. Returns the files written.
pub fn write_wit(out: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for contract in CONTRACTS {
        let version = contract.package.rsplit('@').next().expect("a contract package has a version");
        let dir = out.join(version);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("plugin.wit");
        std::fs::write(&path, contract.wit).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
