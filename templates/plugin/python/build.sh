#!/bin/sh
# Builds the component: dist/{{crate}}.wasm, with componentize-py (pinned in
# requirements.txt) from a venv in .venv, made on first use (needs python3 with venv
# and pip). INLET_COMPONENTIZE_PY=/path/to/venv/bin/componentize-py uses an existing
# install of the same version instead (e.g. a venv your CI caches).
set -eu
cd "$(dirname "$0")"
version="$(sed -n 's/^componentize-py==//p' requirements.txt)"
if [ -n "${INLET_COMPONENTIZE_PY:-}" ]; then
    tool="$INLET_COMPONENTIZE_PY"
    venv="$(dirname "$(dirname "$tool")")"
else
    venv="$PWD/.venv"
    tool="$venv/bin/componentize-py"
    if [ "$("$tool" --version 2>/dev/null)" != "componentize-py $version" ]; then
        echo "build.sh: installing componentize-py $version into .venv"
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt
    fi
fi
found="$("$tool" --version 2>/dev/null || true)"
if [ "$found" != "componentize-py $version" ]; then
    echo "build.sh: $tool is '${found:-not runnable}', requirements.txt pins componentize-py $version" >&2
    exit 1
fi
mkdir -p dist
# VIRTUAL_ENV: packages come from that venv only, not the machine's site-packages.
# Written beside and renamed: a host watching dist/ never reads half a file.
VIRTUAL_ENV="$venv" "$tool" -q -d wit -w router componentize app -p src -o dist/{{crate}}.wasm.tmp
mv dist/{{crate}}.wasm.tmp dist/{{crate}}.wasm
echo "build.sh: dist/{{crate}}.wasm ($(wc -c <dist/{{crate}}.wasm) bytes)"
