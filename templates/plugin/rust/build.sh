#!/bin/sh
# Builds the component: dist/{{crate}}.wasm. Needs rustup and cargo; the toolchain and
# the wasm32-wasip2 target come from rust-toolchain.toml, the crates from crates.io.
# Honours CARGO_TARGET_DIR (default: ./target), so CI can keep a warm cache.
set -eu
cd "$(dirname "$0")"
target_dir="${CARGO_TARGET_DIR:-target}"
cargo build --release --target wasm32-wasip2 --target-dir "$target_dir"
mkdir -p dist
# Written beside and renamed: a host watching dist/ never reads half a file.
cp "$target_dir/wasm32-wasip2/release/{{crate}}.wasm" dist/{{crate}}.wasm.tmp
mv dist/{{crate}}.wasm.tmp dist/{{crate}}.wasm
echo "build.sh: dist/{{crate}}.wasm ($(wc -c <dist/{{crate}}.wasm) bytes)"
