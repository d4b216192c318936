#!/usr/bin/env bash
# The speed issues' GPU figures (47: training throughput, 48: inference) in one call of under 10 minutes on the lent
# GPU machine, plus what only that machine's toolchain can prove:
#   1. builds this tree (everything: the suite, the apps, the benchmarks) and, with OLD_SRC (a `git archive` of an
#      earlier tree, carried in .deps), that tree's benchmarks: the baseline on the same card. Both at once.
#   2. scripts/check_std_bindings.sh on this tree's binaries (that machine's g++ links libstdc++ statically: issue 47,
#      item 4, cmake/stdcxx_first.cmake);
#   3. the [cuda] test cases (the profiler on CUDA among them);
#   4. inference, pi0 and pi0.5, 1 and 3 cameras, graphed, simplified weights: old and new builds, alternating;
#   5. profiles: a graphed pi0 sampling call (bench_infer --profile) and the pi0 training step on an 80 GB budget
#      (bench_train --profile), with their tables (docs/profiling.md);
#   6. the whole suite on this build (LibTorch 2.x + CUDA) with the time left, so the rehearsal runs where it matters.
# Results go to OUT/results, re-packed into ${PACK_TO:-OUT}/results.tgz after every row (a time-out still returns
# what was measured).
#   [PACK_TO=DIR] [DEADLINE_S=560] scripts/gpu-speed.sh OUT [OLD_SRC.tar.gz]   (carry .deps: scripts/fetch_deps.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: scripts/gpu-speed.sh OUT [OLD_SRC.tar.gz]}"
OLD="${2:-}"
R="$OUT/results"
mkdir -p "$R"
START=$SECONDS
DEADLINE=${DEADLINE_S:-560}
log() { echo "[$(date +%H:%M:%S) +$((SECONDS - START)) s] $*" | tee -a "$R/summary.txt"; }
pack() { tar czf "${PACK_TO:-$OUT}/results.tgz" -C "$OUT" results; }
left() { echo $((DEADLINE - (SECONDS - START))); }
PY="${PYTHON:-python3}"
DEPS="$PWD/.deps"
TORCH_PREFIX="$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)')"
export PATH="$PATH:/usr/local/cuda/bin"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/usr/lib/x86_64-linux-gnu/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nproc; nvidia-smi; command -v g++ c++; g++ --version | head -1; free -g; } > "$R/machine.txt" 2>&1
J=$(nproc)
if [ -z "${PI0_FIXTURES_DIR:-}" ] && [ -d .fixtures/openpi ]; then export PI0_FIXTURES_DIR="$PWD/.fixtures/openpi"; fi
build() {  # SRC BUILD JOBS TARGET...
  local src=$1 b=$2 j=$3
  shift 3
  cmake -S "$src" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DPI0_DEPS_DIR="$DEPS" -DCMAKE_IGNORE_PREFIX_PATH=/usr > "$R/$(basename "$b")_configure.log" 2>&1 &&
    if [ $# -gt 0 ]; then cmake --build "$b" -j "$j" --target "$@"; else cmake --build "$b" -j "$j"; fi \
      > "$R/$(basename "$b")_build.log" 2>&1
}
NEW=/tmp/bnew OLDB=/tmp/bold
if [ -n "$OLD" ]; then
  rm -rf /tmp/oldsrc && mkdir -p /tmp/oldsrc && tar xzf "$OLD" -C /tmp/oldsrc
  build /tmp/oldsrc "$OLDB" $((J / 3)) bench_infer & old_pid=$!
  build . "$NEW" $((J - J / 3)); new_rc=$?
else
  build . "$NEW" "$J"; new_rc=$?
fi
grep -h '^-- pi0:' "$R/bnew_configure.log" | sed 's/^-- //' >> "$R/summary.txt"
[ $new_rc = 0 ] || { log "build FAILED"; grep -m20 -B2 -A6 'error' "$R/bnew_build.log" | tee -a "$R/summary.txt"; pack; exit 1; }
log "built this tree"

scripts/check_std_bindings.sh "$NEW" > "$R/std_bindings.log" 2>&1
log "std bindings: exit $? ($(grep -c '^ok' "$R/std_bindings.log") ok, $(grep -c '^FAIL' "$R/std_bindings.log") FAIL)"
pack

t=$SECONDS
(cd "$NEW" && timeout 150 tests/pi0_tests "[cuda]" --durations yes > "$R/tests_cuda.log" 2>&1)
log "tests [cuda]: exit $? in $((SECONDS - t)) s: $(grep -E '^(All tests passed|test cases:)' "$R/tests_cuda.log" | tail -1)"
pack

infer() {  # NAME BINARY CONFIG CAMERAS [ARGS...]
  local name=$1 bin=$2 cfg=$3 cams=$4
  shift 4
  local t=$SECONDS
  timeout 120 "$bin" --config "$cfg" --device cuda --dtype bf16 --iters 20 --cuda-graph on --fused on --cameras "$cams" \
    "$@" > "$R/$name.log" 2>&1
  log "$name: exit $? in $((SECONDS - t)) s: $(grep -E '^\| *(1|3) *\|' "$R/$name.log" | tr -s ' ' | tr '\n' '|')"
  pack
}
have_old=0
if [ -n "$OLD" ]; then
  if wait $old_pid; then have_old=1; else log "old tree build FAILED (bold_build.log)"; fi
fi
for rep in $(seq 1 "${INFER_REPS:-1}"); do
  infer "pi0_new_$rep" "$NEW/bench_infer" configs/pi0_libero.yaml 1,3 --batches 1,8
  [ $have_old = 0 ] || infer "pi0_old_$rep" "$OLDB/bench_infer" configs/pi0_libero.yaml 1,3 --batches 1,8
done
infer pi05_new "$NEW/bench_infer" configs/pi05_libero.yaml 3
[ $have_old = 0 ] || infer pi05_old "$OLDB/bench_infer" configs/pi05_libero.yaml 3
infer pi0_profile "$NEW/bench_infer" configs/pi0_libero.yaml 3 --profile "$R/profile_infer"

t=$SECONDS
timeout 150 "$NEW/bench_train" --config configs/pi0_libero.yaml --device cuda --batches 32 --precisions bf16-mixed \
  --warmup 2 --steps 3 --workers 4 --threads 12 --peak-tflops 989 --checkpointing-modes auto --gpu-gib 78 \
  --profile "$R/profile_train" --profile-steps 2 --json "$R/train_profile.json" > "$R/train_profile.log" 2>&1
log "bench_train --profile: exit $? in $((SECONDS - t)) s: $(grep -h -A3 'samples/s' "$R/train_profile.log" | tail -2 | tr -s ' ' | tr '\n' '|')"
pack

# The whole suite with what is left (the CPU cases run on this build's LibTorch: the 2.x rehearsal).
if [ "$(left)" -gt 60 ]; then
  t=$SECONDS
  (cd "$NEW" && OMP_NUM_THREADS=1 timeout "$(( $(left) - 15 ))" ctest -j "$J" --timeout 300 > "$R/tests_all.log" 2>&1)
  log "whole suite: exit $? in $((SECONDS - t)) s: $(grep -E 'tests passed' "$R/tests_all.log" | tail -1)"
  grep -E '^\s+[0-9]+ - ' "$R/tests_all.log" | head -30 >> "$R/summary.txt"
fi
log "done"
pack
