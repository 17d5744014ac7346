//! `scripts/check-layers`, the layering rule of ARCHITECTURE.md, holds for `src/` and
//! fails where it should: on a copy of `src/` given an import upwards, an import
//! cycle, or a module the layers block does not name.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the check on the checkout at `root`: (exit success, what it printed).
fn check(root: &Path) -> (bool, String) {
    let out = Command::new("python3")
        .arg(repo().join("scripts/check-layers"))
        .arg("--root")
        .arg(root)
        .output()
        .expect("python3 runs scripts/check-layers");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A copy of `src/` and ARCHITECTURE.md to break on purpose.
fn copy_of_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary folder");
    copy_dir(&repo().join("src"), &dir.path().join("src"));
    std::fs::copy(repo().join("ARCHITECTURE.md"), dir.path().join("ARCHITECTURE.md")).expect("copy ARCHITECTURE.md");
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a folder of the copy");
    for entry in std::fs::read_dir(from).expect("read a folder of src/") {
        let entry = entry.expect("a folder entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("its type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file of src/");
        }
    }
}

fn append(path: &Path, text: &str) {
    let mut content = std::fs::read_to_string(path).expect("read the file to change");
    content.push_str(text);
    std::fs::write(path, content).expect("write the changed file");
}

#[test]
fn src_keeps_the_layering_rule() {
    let (ok, text) = check(&repo());
    assert!(ok, "scripts/check-layers fails on src/:\n{text}");
    assert!(text.contains("no import upwards, no cycle"), "{text}");
}

#[test]
fn an_import_from_a_lower_layer_to_a_higher_one_fails_the_check() {
    let copy = copy_of_repo();
    append(&copy.path().join("src/clock.rs"), "\nfn _grace() -> std::time::Duration { crate::app::DEFAULT_GRACE }\n");
    let (ok, text) = check(copy.path());
    assert!(!ok, "an import of app from clock passed:\n{text}");
    assert!(text.contains("`clock` (layer 1) imports `app` (layer 13), a higher layer: src/clock.rs:"), "{text}");
    assert!(text.contains("import cycle between"), "app imports clock, so this is a cycle too:\n{text}");
}

#[test]
fn a_cycle_within_one_layer_fails_the_check() {
    // ingest and relay share a layer; relay -> ingest alone is allowed, both ways is not.
    let copy = copy_of_repo();
    append(&copy.path().join("src/relay/policy.rs"), "\nuse crate::ingest::Ingest as _;\n");
    append(&copy.path().join("src/ingest.rs"), "\nuse crate::relay::RelayOptions as _;\n");
    let (ok, text) = check(copy.path());
    assert!(!ok, "a cycle between ingest and relay passed:\n{text}");
    assert!(text.contains("import cycle between ingest, relay"), "{text}");
    assert!(!text.contains("a higher layer"), "the two are one layer: no upward import to report:\n{text}");
}

#[test]
fn a_comment_naming_a_higher_module_is_not_an_import() {
    let copy = copy_of_repo();
    append(&copy.path().join("src/clock.rs"), "\n/// Read by `crate::app` at start.\n// crate::console too\n");
    let (ok, text) = check(copy.path());
    assert!(ok, "a comment counted as an import:\n{text}");
}

#[test]
fn a_module_in_no_layer_fails_the_check() {
    let copy = copy_of_repo();
    std::fs::write(copy.path().join("src/stray.rs"), "//! Not in ARCHITECTURE.md's layers.\n").expect("write a module");
    let (ok, text) = check(copy.path());
    assert!(!ok, "a module in no layer passed:\n{text}");
    assert!(text.contains("module `stray` is in no layer"), "{text}");
}
