#!/usr/bin/env bash
# Measures the JavaScript SDK: the size of examples/js/hello.js built, its
# cold run (a fresh compile cache each time) and warm run (cached), and
# the callOne round trip (e2e-programs/semantics.js `bench`), on child
# procs and in process. Prints medians.
#
#   guest-sdk/js/test/measure.sh [RUNS]     # RUNS per figure, 5 by default
#
# Needs node, jco and monarch-host ($MONARCH_HOST, else
# target/release/monarch-host).

set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdk="$(dirname "$here")"
repo="$(cd "$sdk/../.." && pwd)"
host="${MONARCH_HOST:-$repo/target/release/monarch-host}"
runs="${1:-5}"

out="$(mktemp -d "${TMPDIR:-/tmp}/monarch-js-measure.XXXXXX")"
trap 'rm -rf "$out"' EXIT

node "$sdk/build.mjs" "$repo/examples/js/hello.js" -o "$out/hello.wasm" --wit "$repo/wit" >/dev/null
node "$sdk/build.mjs" "$sdk/e2e-programs/semantics.js" -o "$out/bench.wasm" --wit "$repo/wit" >/dev/null

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
seconds() {
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}

echo "hello component: $(stat -c %s "$out/hello.wasm") bytes"

for i in $(seq "$runs"); do
  MONARCH_CACHE_DIR="$out/cold$i" seconds "$host" run "$out/hello.wasm"
done | median | xargs printf "hello cold run (compile + run): median %.2f s\n"

export MONARCH_CACHE_DIR="$out/cache"
"$host" run "$out/hello.wasm" >/dev/null
for mode in "" --in-process; do
  for i in $(seq "$runs"); do seconds "$host" run $mode "$out/hello.wasm"; done |
    median | xargs printf "hello warm run ${mode:-(child procs)}: median %.3f s\n"
done

for mode in "" --in-process; do
  for i in $(seq "$runs"); do
    "$host" run $mode "$out/bench.wasm" -- bench 2000 | sed -n 's/.*median \([0-9]*\) us.*/\1/p'
  done | median | xargs printf "callOne round trip ${mode:-(child procs)}: median %s us\n"
done
