#!/usr/bin/env bash
# Runs monarch-tensor's tests, CUDA backend included, on a machine with an NVIDIA GPU,
# then examples/data-parallel with its shards on the GPU (`--device cuda`), through
# a monarch-host built with `--features cuda`.
#
# Every CUDA test runs with MONARCH_REQUIRE_GPU=1, which turns "no GPU, skipping"
# into a failure: on a GPU machine a missing driver, NVRTC or cuBLAS is a bug to
# see, not a reason to pass quietly. Takes well under 5 minutes.
#
# Usage (from anywhere):
#   tests/gpu/run.sh                   build with `--features cuda` and run the tests,
#                                      then the matmul_gflops benchmark (needs cargo
#                                      and the crates: a GPU machine with a Rust toolchain)
#   tests/gpu/run.sh --build-only DIR  build the test programs and the benchmark into DIR
#                                      (any machine: building needs no GPU)
#   tests/gpu/run.sh --prebuilt DIR    run the programs from DIR (no cargo needed: for a
#                                      GPU machine without Rust, with DIR carried over)
#
# A GPU machine without Rust: on a build machine run
#   tests/gpu/run.sh --build-only target/gpu-bundle
# copy the repository with target/gpu-bundle (about 7 MB) to the GPU machine and run
#   tests/gpu/run.sh --prebuilt target/gpu-bundle
#
# Libraries: the driver's libcuda.so.1, plus libnvrtc and libcublas (CUDA 12 or 13).
# cudarc looks them up by fixed names (libnvrtc.so, libnvrtc.so.12, ...), so this
# script finds the ones installed (LD_LIBRARY_PATH, the ld cache, /usr/local/cuda*,
# /usr/local/nvidia, Python's nvidia-* wheels) and links them under those names.
# Set MONARCH_CUDA_LIB_DIRS (colon-separated) to search other folders first.

set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mode=${1:-}
dir=${2:-}

die() {
    echo "tests/gpu/run.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

# Folders that may hold CUDA libraries, most specific first.
candidate_dirs() {
    local d sp
    if [[ -n ${MONARCH_CUDA_LIB_DIRS:-} ]]; then tr ':' '\n' <<<"$MONARCH_CUDA_LIB_DIRS"; fi
    if [[ -n ${LD_LIBRARY_PATH:-} ]]; then tr ':' '\n' <<<"$LD_LIBRARY_PATH"; fi
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/local/cuda-*/lib64 /usr/local/cuda-*/targets/x86_64-linux/lib \
        /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [[ -d $d ]] && echo "$d"
    done
    # pip's nvidia-cuda-nvrtc(-cu12) and nvidia-cublas(-cu12) wheels.
    if command -v python3 >/dev/null; then
        for sp in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
            [[ -d $sp/nvidia ]] && find "$sp/nvidia" -maxdepth 3 -type d -name lib 2>/dev/null
        done
    fi
    return 0
}

# The path of lib$1.so.N (or lib$1.so) in the first folder that has one, else the ld cache.
find_lib() {
    local name=$1 d f
    while read -r d; do
        [[ -n $d ]] || continue
        for f in "$d/lib$name.so" "$d"/lib"$name".so.[0-9]*; do
            if [[ -e $f ]]; then
                echo "$f"
                return 0
            fi
        done
    done < <(candidate_dirs)
    ldconfig -p 2>/dev/null | awk -v n="lib$name.so" 'index($1, n) == 1 { print $NF; exit }'
}

# Makes libcuda, libnvrtc and libcublas loadable under the names cudarc tries.
setup_cuda_libs() {
    local links name found dirs=""
    links=$(mktemp -d /tmp/monarch-cuda-libs.XXXXXX)
    for name in cuda nvrtc cublas; do
        found=$(find_lib "$name")
        if [[ -z $found ]]; then
            case $name in
            cuda) die "no NVIDIA driver library (libcuda.so.1) found: is this a GPU machine?" ;;
            nvrtc) die "no libnvrtc found: install the CUDA toolkit or \`pip install nvidia-cuda-nvrtc-cu12\`, or set MONARCH_CUDA_LIB_DIRS" ;;
            cublas) die "no libcublas found: install the CUDA toolkit or \`pip install nvidia-cublas-cu12\`, or set MONARCH_CUDA_LIB_DIRS" ;;
            esac
        fi
        found=$(readlink -f "$found")
        echo "using lib$name: $found"
        ln -sf "$found" "$links/lib$name.so"
        # Its neighbours (libnvrtc-builtins, libcublasLt) must be found too.
        dirs="$dirs:$(dirname "$found")"
    done
    export LD_LIBRARY_PATH="$links$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

show_gpu() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    else
        echo "(nvidia-smi not found; the tests will ask the driver directly)"
    fi
}

build_into() {
    local out=$1
    command -v cargo >/dev/null || die "cargo not found: build elsewhere with --build-only and run with --prebuilt"
    mkdir -p "$out"
    cd "$repo"
    # Release: the tests multiply and sum tens of millions of elements. Without
    # debug info the four programs are a few MB each, small enough to copy around.
    export CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=debuginfo
    {
        cargo test --release -p monarch-tensor --features cuda --no-run --message-format=json
        cargo build --release -p monarch-tensor --features cuda --example matmul_gflops --message-format=json
        cargo build --release -p monarch-host --features cuda --bin monarch-host --message-format=json
    } | python3 -c '
import json, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    exe = msg.get("executable") if msg.get("reason") == "compiler-artifact" else None
    if not exe:
        continue
    kind = msg["target"]["kind"][0]
    name = "unit" if kind == "lib" else msg["target"]["name"]
    shutil.copy(exe, f"{out}/{name}")
    print(f"built {out}/{name}")
' "$out"
    for t in unit cpu_ops cuda_ops matmul_gflops monarch-host; do
        [[ -x $out/$t ]] || die "building $t failed"
    done
    (cd guest-sdk && cargo build --release --locked --target wasm32-wasip2 -p data-parallel)
    cp guest-sdk/target/wasm32-wasip2/release/data_parallel.wasm "$out/"
    du -sh "$out"
}

run_from() {
    local from=$1 t failed=0
    export MONARCH_REQUIRE_GPU=1
    export RUST_BACKTRACE=1
    for t in unit cpu_ops cuda_ops; do
        echo "== $t"
        "$from/$t" --test-threads=4 || failed=1
    done
    [[ $failed == 0 ]] || die "some tests failed (see above)"
    echo "== matmul_gflops"
    "$from/matmul_gflops" 1024 5
    echo "== data-parallel on cuda:0 (4 procs, the tensors' shards on the GPU)"
    local log
    log=$(mktemp)
    "$from/monarch-host" run "$from/data_parallel.wasm" -- --device cuda --procs 4 --steps 20 2>&1 | tee "$log"
    grep -q "the loss fell every step" "$log" || die "data-parallel on cuda did not train"
    rm -f "$log"
}

case $mode in
-h | --help) usage 0 ;;
--build-only)
    [[ -n $dir ]] || usage 2
    build_into "$dir"
    echo "tests/gpu/run.sh: built into $dir; run it on a GPU machine with --prebuilt $dir"
    exit 0
    ;;
--prebuilt)
    [[ -n $dir ]] || usage 2
    [[ -d $dir ]] || die "no folder $dir: build it with --build-only $dir first"
    dir=$(cd "$dir" && pwd)
    show_gpu
    setup_cuda_libs
    run_from "$dir"
    ;;
"")
    show_gpu
    setup_cuda_libs
    bundle=$(mktemp -d /tmp/monarch-gpu-tests.XXXXXX)
    build_into "$bundle"
    run_from "$bundle"
    ;;
*) usage 2 ;;
esac
echo "tests/gpu/run.sh: all passed"
