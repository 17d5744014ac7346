#!/bin/sh
# Builds the plugin (./build.sh) and runs every sample through `inlet plugin test`,
# comparing its JSON report with the sample's expected.json. Exits non-zero if the
# build fails or any report differs: run it in CI.
#
#   ./test.sh            build, then test every sample
#   ./test.sh --update   build, then rewrite every expected.json from what the plugin
#                        does now (review the diff before you commit it)
#
# A sample is a folder under samples/: message.* (the payload, as the broker delivers
# it), optionally `attributes` (NAME=VALUE lines), response.json, response2.json, …
# (the target's answer to each step), and expected.json.
#
# Environment: INLET, the inlet binary (default: `inlet` on PATH); CARGO_TARGET_DIR
# and the rest as build.sh says.
set -eu
cd "$(dirname "$0")"
update=no
case "${1:-}" in
    "") ;;
    --update) update=yes ;;
    *) echo "usage: ./test.sh [--update]" >&2; exit 2 ;;
esac
inlet="${INLET:-inlet}"
if ! command -v "$inlet" >/dev/null 2>&1; then
    echo "test.sh: no inlet binary: put it on PATH or set INLET=/path/to/inlet" >&2
    exit 2
fi
./build.sh
plugin="dist/{{crate}}.wasm"
echo "test.sh: $("$inlet" --version), plugin $plugin"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
total=0
failed=0
for dir in samples/*/; do
    name="$(basename "$dir")"
    total=$((total + 1))
    message=""
    for m in "$dir"message.*; do
        [ -f "$m" ] && message="$m" && break
    done
    if [ -z "$message" ]; then
        echo "FAIL $name: no message.* file in $dir" >&2
        failed=$((failed + 1))
        continue
    fi
    set -- --json plugin test "$plugin" --message "$message" --message-id "$name"
    if [ -f "${dir}attributes" ]; then
        while IFS= read -r line || [ -n "$line" ]; do
            [ -n "$line" ] && set -- "$@" --attribute "$line"
        done <"${dir}attributes"
    fi
    for r in "$dir"response.json "$dir"response[0-9]*.json; do
        [ -f "$r" ] && set -- "$@" --response "$r"
    done
    # Exit status 1 is a verdict too (a decode error, a fault): the report says so, and
    # the report is what is compared.
    "$inlet" "$@" >"$work/$name.json" 2>"$work/$name.err" || true
    if [ ! -s "$work/$name.json" ]; then
        echo "FAIL $name: inlet plugin test printed no report:" >&2
        cat "$work/$name.err" >&2
        failed=$((failed + 1))
    elif [ "$update" = yes ]; then
        cp "$work/$name.json" "${dir}expected.json"
        echo "updated $name"
    elif [ ! -f "${dir}expected.json" ]; then
        echo "FAIL $name: no expected.json (record it with ./test.sh --update)" >&2
        failed=$((failed + 1))
    elif cmp -s "${dir}expected.json" "$work/$name.json"; then
        echo "ok   $name"
    else
        echo "FAIL $name: the report differs from ${dir}expected.json:" >&2
        diff -u "${dir}expected.json" "$work/$name.json" >&2 || true
        failed=$((failed + 1))
    fi
done
if [ "$total" -eq 0 ]; then
    echo "test.sh: no samples in samples/" >&2
    exit 1
fi
echo "test.sh: $((total - failed)) of $total samples as expected"
[ "$failed" -eq 0 ]
