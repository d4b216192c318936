#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan + UBSan, a separate build folder) and runs each one for
# SECONDS on a scratch copy of its committed seed corpus (fuzz/corpus/<target>/). Fails on any crash, leak,
# sanitizer report, timeout or out-of-memory; the input that caused it is kept in <build-dir>/fuzz-artifacts/.
# Usage: scripts/fuzz.sh [seconds per target, default 60] [build-dir, default build-fuzz]
#   PI0_FUZZ_RUNS=N       stop each target after N executions instead (SECONDS still caps the time; 0 = no cap)
#   PI0_FUZZ_TARGETS="a b" run only these (safetensors config config_alias observation norm_stats)
# Needs clang and its fuzzer runtime (Debian: clang, libclang-rt-dev; scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${1:-60}"
BUILD_DIR="${2:-build-fuzz}"
TARGETS=(${PI0_FUZZ_TARGETS:-safetensors config config_alias observation norm_stats})

if [ ! -f "$BUILD_DIR/build.ninja" ] && [ ! -f "$BUILD_DIR/Makefile" ]; then
  GENERATOR=()
  command -v ninja >/dev/null && GENERATOR=(-G Ninja)
  mkdir -p "$BUILD_DIR"
  if ! CXX=clang++ CC=clang cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DPI0_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       > "$BUILD_DIR/configure.log" 2>&1; then
    cat "$BUILD_DIR/configure.log" >&2
    exit 1
  fi
fi
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$(nproc)" >"$BUILD_DIR/build.log" 2>&1 || { tail -50 "$BUILD_DIR/build.log" >&2; exit 1; }
echo "[fuzz] built in $BUILD_DIR ($(( $(date +%s) - start )) s)"

ARTIFACTS="$BUILD_DIR/fuzz-artifacts"
mkdir -p "$ARTIFACTS"
status=0
for t in "${TARGETS[@]}"; do
  work="$(mktemp -d)"
  scratch="$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)"  # tmpfs: every input is written to a file
  cp -r "fuzz/corpus/$t/." "$work/"
  mkdir -p "$ARTIFACTS/$t"
  args=(-max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=4096 -max_len=4096 -detect_leaks=1
        -print_final_stats=1 -artifact_prefix="$ARTIFACTS/$t/")
  [ -n "${PI0_FUZZ_RUNS:-}" ] && args+=(-runs="$PI0_FUZZ_RUNS")
  log="$ARTIFACTS/$t.log"
  rc=0
  t0=$(date +%s)
  PI0_FUZZ_SCRATCH="$scratch" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}" UBSAN_OPTIONS="print_stacktrace=1" \
    "$BUILD_DIR/fuzz/fuzz_$t" "${args[@]}" "$work" > "$log" 2>&1 || rc=$?
  rm -rf "$work" "$scratch"
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  speed=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  if [ $rc -ne 0 ]; then
    echo "[fuzz] $t: FAILED (exit $rc) after $runs executions; log $log, input in $ARTIFACTS/$t/" >&2
    grep -E 'ERROR|SUMMARY|==[0-9]+==|terminate|what\(\)' "$log" | head -20 >&2 || true
    status=1
  else
    echo "[fuzz] $t: $runs executions in $(( $(date +%s) - t0 )) s, $speed exec/s, no crash or leak"
  fi
done
exit $status
