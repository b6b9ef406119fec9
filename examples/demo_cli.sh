#!/usr/bin/env bash
# The demo through the `rda` command-line tool (what `make demo` runs first).
# Starts `rda serve demo` in the background with a private directory file, drives it with
# `rda get/set/subscribe/admin`, and stops the server by pid on exit.
set -euo pipefail
BIN=${BIN:-.venv/bin}
work=$(mktemp -d)
export RDA_DIRECTORY_FILE="$work/directory.json"
"$BIN/rda" serve demo --json > "$work/serve.json" &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/serve.json" ] && break; sleep 0.1; done
[ -s "$work/serve.json" ] || { echo "demo server did not start" >&2; exit 1; }

run() { echo; echo "\$ rda $*"; "$BIN/rda" "$@"; }
run directory list
run get PS1/Acquisition
run describe PS1/Acquisition
run set PS1/Setting current=5
run get PS1/Setting
run subscribe PS1/Acquisition --count 5
run get BPM1/Orbit
echo; echo "\$ rda get FAULTY/Status   # fails on purpose"
"$BIN/rda" get FAULTY/Status || echo "(exit code $?, as documented in docs/cli.md)"
run admin RdaDemoServer info
