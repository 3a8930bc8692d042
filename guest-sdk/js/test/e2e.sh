#!/usr/bin/env bash
# End-to-end tests of the JavaScript SDK: builds examples/js/hello.js,
# examples/js/counter.js and e2e-programs/semantics.js with build.mjs and
# runs each with monarch-host, on child procs and with --in-process,
# checking their output; then checks that build errors name the file and
# line.
#
#   guest-sdk/js/test/e2e.sh
#
# Needs node, jco (on PATH, or $JCO) and monarch-host: $MONARCH_HOST, else
# target/release/monarch-host of this repository, else monarch-host on PATH.
# Exits 0 when every check passes; prints what failed otherwise.

set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdk="$(dirname "$here")"
repo="$(cd "$sdk/../.." && pwd)"
build="$sdk/build.mjs"
wit="$repo/wit"

host="${MONARCH_HOST:-}"
if [[ -z "$host" ]]; then
  if [[ -x "$repo/target/release/monarch-host" ]]; then
    host="$repo/target/release/monarch-host"
  else
    host="$(command -v monarch-host || true)"
  fi
fi
if [[ -z "$host" || ! -x "$host" ]]; then
  echo "e2e.sh: no monarch-host (set MONARCH_HOST or build target/release/monarch-host)" >&2
  exit 2
fi
if ! command -v "${JCO:-jco}" >/dev/null 2>&1; then
  echo "e2e.sh: no jco (npm install -g @bytecodealliance/jco, or set JCO)" >&2
  exit 2
fi

out="$(mktemp -d "${TMPDIR:-/tmp}/monarch-js-e2e.XXXXXX")"
trap 'rm -rf "$out"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# build NAME APP.js: builds $out/NAME.wasm.
build() {
  if ! node "$build" "$2" -o "$out/$1.wasm" --wit "$wit" >"$out/$1.build.log" 2>&1; then
    fail "building $2:"
    cat "$out/$1.build.log" >&2
    return 1
  fi
}

# run_app NAME LOG [host options] [-- args]: runs $out/NAME.wasm; output in $out/LOG.
run_app() {
  local name="$1" log="$2"
  shift 2
  local opts=() args=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do opts+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift && args=("$@")
  if ! timeout 120 "$host" run "${opts[@]}" "$out/$name.wasm" -- "${args[@]}" >"$out/$log" 2>&1; then
    fail "$name ${opts[*]} ${args[*]} exited with an error:"
    cat "$out/$log" >&2
    return 1
  fi
}

# expect LOG LINE...: each LINE is a whole line of the log.
expect() {
  local log="$1"
  shift
  for line in "$@"; do
    if ! grep -qxF -- "$line" "$out/$log"; then
      fail "$log lacks the line: $line"
      echo "--- $log:" >&2
      cat "$out/$log" >&2
    fi
  done
}

# ------------------------------------------------------------------ hello
if build hello "$repo/examples/js/hello.js"; then
  for mode in "" --in-process; do
    log="hello${mode}.log"
    run_app hello "$log" $mode &&
      expect "$log" \
        "[controller] 4 greetings from a mesh shaped gpus=4:" \
        "[controller] rank 0: hello from rank 0 of 4" \
        "[controller] rank 1: hello from rank 1 of 4" \
        "[controller] rank 2: hello from rank 2 of 4" \
        "[controller] rank 3: hello from rank 3 of 4"
  done
  run_app hello hello-2.log -- 2 &&
    expect hello-2.log "[controller] 2 greetings from a mesh shaped gpus=2:" "[controller] rank 1: hello from rank 1 of 2"
  if "$host" run "$out/hello.wasm" -- zero >"$out/hello-bad.log" 2>&1; then
    fail "hello with a bad argument succeeded"
  elif ! grep -q 'usage: hello \[PROCS\]; `zero` is not a number of procs' "$out/hello-bad.log"; then
    fail "hello with a bad argument does not say why:"
    cat "$out/hello-bad.log" >&2
  fi
fi

# ---------------------------------------------------------------- counter
if build counter "$repo/examples/js/counter.js"; then
  for mode in "" --in-process; do
    log="counter${mode}.log"
    run_app counter "$log" $mode &&
      expect "$log" \
        "[controller]   counter 0: 3" \
        "[controller]   counter 1: 3" \
        "[controller]   counter 2: 3" \
        "[controller]   sum 9" \
        "[controller]   counter 1: 13" \
        "[controller]   ActorError (kind endpoint) from counters[2] in \`increment\`" \
        "[controller]   type RangeError, message: cannot add -1: counters only count up" \
        "[controller]   counter 2 lives on, still at 3" \
        "[controller]   supervisor: actor counters[0] failed in \`increment\`: endpoint: RangeError: \`increment\` returned an error to a broadcast: cannot add -5: counters only count up; carrying on" \
        "[controller]   counter 1 still counts: 14" \
        "[controller]   stream: counter 0: ActorError (kind endpoint)" \
        "[controller]   stream: counter 1 at 14" \
        "[controller]   stream: counter 2 at 3" \
        "[controller]   failures reported: 1"
  done
fi

# -------------------------------------------------------------- semantics
if build semantics "$sdk/e2e-programs/semantics.js"; then
  for mode in "" --in-process; do
    log="semantics${mode}.log"
    run_app semantics "$log" $mode &&
      expect "$log" "[controller] all checks passed" "[echo[0]] actor 0 says hello" "[echo[1]] actor 1 says hello"
  done
fi

# ------------------------------------------------------------ build errors
# build_fails NAME SOURCE PATTERN: building SOURCE fails with output matching PATTERN.
build_fails() {
  local src="$out/$1.js"
  printf '%s' "$2" >"$src"
  if node "$build" "$src" -o "$out/$1.wasm" --wit "$wit" >"$out/$1.build.log" 2>&1; then
    fail "building $1 succeeded"
  elif ! grep -qE -- "$3" "$out/$1.build.log"; then
    fail "building $1 does not report /$3/:"
    cat "$out/$1.build.log" >&2
  fi
}
build_fails syntax $'import { Actor } from "monarch";\nexport function main() {\n  let x = ;\n}\n' "syntax error in $out/syntax.js:|$out/syntax.js:3"
build_fails toplevel $'import { Actor } from "monarch";\n\nnotDefined();\nexport function main() {}\n' "$out/toplevel.js:3.*|notDefined is not defined"
build_fails badimport $'import x from "lodash";\nexport function main() {}\n' "$out/badimport.js:1: cannot import \"lodash\""
build_fails missing $'import { y } from "./nowhere.js";\nexport function main() {}\n' "$out/missing.js:1: cannot find the module \"./nowhere.js\""

if [[ $failures -gt 0 ]]; then
  echo "e2e.sh: $failures check(s) failed" >&2
  exit 1
fi
echo "e2e.sh: all checks passed (hello, counter, semantics; child procs and --in-process; build errors)"
