#!/bin/bash
# Build the fuzzers with clang into build-fuzz/ and run each for FUZZ_SECONDS
# (default 60). Exit status 0 when every harness ran its time clean; else 1,
# with the crashing input left as build-fuzz/artifacts/<harness>-crash-*
# (see README.md for how to reproduce and keep it as a regression input).
#   FUZZ_SECONDS=60 FUZZ_ONLY="workflow hdf5" bash fuzz/run.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
HARNESSES=${FUZZ_ONLY:-workflow safetensors hdf5 tiff manifest onnx}  # also: hdf5_raw (see README.md)

if ! command -v clang >/dev/null; then
    echo "fuzz: clang not found (scripts/setup.sh installs it)" >&2
    exit 1
fi
cmake -S "$ROOT/fuzz" -B "$BUILD" -DCMAKE_C_COMPILER=clang >/dev/null || exit 1
cmake --build "$BUILD" -j "${JOBS:-2}" >/dev/null || exit 1
mkdir -p "$BUILD/artifacts"

# allocator_may_return_null=1: an impossible allocation requested by a hostile
# header gets NULL, as it would in a release build, and must become an error.
ASAN_BASE=allocator_may_return_null=1
export LSAN_OPTIONS=suppressions=$ROOT/fuzz/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# One harness: libFuzzer for its time, then one line of result in $BUILD/result_$h.
fuzz_one() {
    local h=$1
    local work=$BUILD/corpus/$h           # grows across runs; the seeds stay in fuzz/corpus/
    mkdir -p "$work"
    local log=$BUILD/fuzz_$h.log
    # libhdf5 has no frame pointers: the suppressions in lsan.supp only match
    # with the slow unwinder (3-4x fewer executions, so only where needed).
    local asan=$ASAN_BASE
    [ "$h" = hdf5_raw ] && asan=$ASAN_BASE:fast_unwind_on_malloc=0:malloc_context_size=30
    # The manifest is a small JSON grammar read by jansson: its coverage stops
    # growing within seconds, so it gets half the time (30 s in `make test`).
    local secs=$SECONDS_EACH
    [ "$h" = manifest ] && secs=$(( SECONDS_EACH > 1 ? SECONDS_EACH / 2 : 1 ))
    ASAN_OPTIONS=$asan "$BUILD/fuzz_$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$h-" \
        "$work" "$ROOT/fuzz/corpus/$h" >"$log" 2>&1
    local rc=$?
    local runs cov
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    if [ $rc -eq 0 ]; then
        echo "fuzz_$h: clean, ${runs:-?} executions in ${secs}s, $cov" >"$BUILD/result_$h"
    else
        { echo "fuzz_$h: FAILED (exit $rc) after ${runs:-?} executions; log: $log"
          grep -m1 -A12 -E '^==[0-9]+==ERROR|runtime error|^SUMMARY|deadly signal' "$log"
        } >"$BUILD/result_$h"
    fi
}

# FUZZ_JOBS harnesses at a time (default JOBS; each single-threaded, for its
# full time: more than the cores share them), then the results in the
# harnesses' order.
status=0
running=0
for h in $HARNESSES; do
    rm -f "$BUILD/result_$h"
    fuzz_one "$h" &
    running=$((running + 1))
    if [ "$running" -ge "${FUZZ_JOBS:-${JOBS:-2}}" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait
for h in $HARNESSES; do
    if [ -s "$BUILD/result_$h" ]; then
        cat "$BUILD/result_$h"
        grep -q ': FAILED' "$BUILD/result_$h" && status=1
    else
        echo "fuzz_$h: FAILED (no result)"
        status=1
    fi
done
exit $status
