#!/usr/bin/env bash
# The offload figures (docs/memory.md, docs/benchmarks_gpu.md) on the GPU machine in one call of under 10 minutes:
#   1. the offloaded pi0 full fine-tune under a 22 GiB allocator cap (a 24 GB card) with this tree;
#   2. the host replay on that machine's CPUs (bench_host_optimizer --pi0-step: stages, bandwidth ceilings, the
#      predicted step before and after);
#   3. the [cuda] and [offload] test cases (the offload on CUDA against the plain step);
#   4. with OLD_SRC (a `git archive` of an earlier tree, e.g. carried in .deps): the same offloaded row built from it,
#      the baseline on the same card (a second build: ~2 more minutes on 16 cores);
#   5. the profile of the plain step on an 80 GB budget (bench_train --profile) and of a graphed pi0 sampling call
#      (bench_infer --profile), for docs/profiling.md;
#   6. offload with gradient_checkpointing=auto on 78 GiB: whether less recomputation beats the plain row.
# Two trees build at once (half the cores each). Results go to OUT/results and are re-packed into OUT/results.tgz
# after every row, so a time-out still returns what was measured.
#   [PACK_TO=DIR] scripts/gpu-offload.sh OUT [OLD_SRC.tar.gz]   (carry .deps: scripts/fetch_deps.sh; results.tgz to DIR)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: scripts/gpu-offload.sh OUT [OLD_SRC.tar.gz]}"
OLD="${2:-}"
R="$OUT/results"
mkdir -p "$R"
START=$SECONDS
log() { echo "[$(date +%H:%M:%S) +$((SECONDS - START)) s] $*" | tee -a "$R/summary.txt"; }
pack() { tar czf "${PACK_TO:-$OUT}/results.tgz" -C "$OUT" results; }
PY="${PYTHON:-python3}"
DEPS="$PWD/.deps"
TORCH_PREFIX="$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)')"
export PATH="$PATH:/usr/local/cuda/bin"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:$DEPS/usr/lib/x86_64-linux-gnu/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nproc; lscpu; nvidia-smi; cat /sys/kernel/mm/transparent_hugepage/enabled; free -g; } > "$R/machine.txt" 2>&1
J=$(nproc)
[ -z "$OLD" ] || J=$(( $(nproc) / 2 ))
build() {  # SRC BUILD TARGET...
  local src=$1 b=$2
  shift 2
  cmake -S "$src" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DPI0_DEPS_DIR="$DEPS" -DCMAKE_IGNORE_PREFIX_PATH=/usr > "$R/$(basename "$b")_configure.log" 2>&1 &&
    cmake --build "$b" -j "$J" --target "$@" > "$R/$(basename "$b")_build.log" 2>&1
}
NEW=/tmp/bnew OLDB=/tmp/bold
build . "$NEW" bench_train bench_host_optimizer bench_infer pi0_tests & new_pid=$!
if [ -n "$OLD" ]; then
  rm -rf /tmp/oldsrc && mkdir -p /tmp/oldsrc && tar xzf "$OLD" -C /tmp/oldsrc
  build /tmp/oldsrc "$OLDB" bench_train & old_pid=$!
fi
wait $new_pid || { log "build FAILED"; tail -30 "$R/bnew_build.log"; pack; exit 1; }
log "built this tree"
pack

COMMON=(--config configs/pi0_libero.yaml --device cuda --batches 32 --precisions bf16-mixed --warmup 2 --steps 3
        --workers 4 --threads 12 --peak-tflops 989)
row() {  # NAME BINARY ARGS...
  local name=$1 bin=$2
  shift 2
  local t=$SECONDS
  "$bin" "$@" --json "$R/$name.json" > "$R/$name.log" 2>&1
  log "$name: exit $? in $((SECONDS - t)) s: $(grep -h -A4 'samples/s' "$R/$name.log" | tail -3 | tr -s ' ' | tr '\n' '|')"
  pack
}
row offload22_new "$NEW/bench_train" "${COMMON[@]}" --offload optimizer --gpu-gib 22
t=$SECONDS
(cd "$NEW" && timeout 120 tests/pi0_tests "[cuda]","[offload]" > "$R/tests_cuda_offload.log" 2>&1)
log "tests [cuda],[offload]: exit $? in $((SECONDS - t)) s: $(tail -4 "$R/tests_cuda_offload.log" | tr '\n' ' ')"
pack
t=$SECONDS
"$NEW/bench_host_optimizer" --pi0-step --scale 2 --threads 8,12,16 --steps 2 --target-cores "$(nproc)" \
  --json "$R/replay.json" > "$R/replay.txt" 2>&1
log "replay: exit $? in $((SECONDS - t)) s: $(grep -h 'projected\|predicted' "$R/replay.txt" | tail -2 | tr '\n' '|')"
pack
if [ -n "$OLD" ]; then
  if wait $old_pid; then
    row offload22_old "$OLDB/bench_train" "${COMMON[@]}" --offload optimizer --gpu-gib 22
  else
    log "old tree build FAILED (bold_build.log)"
  fi
fi
row plain78_profile "$NEW/bench_train" "${COMMON[@]}" --checkpointing-modes auto --gpu-gib 78 \
  --profile "$R/profile_train" --profile-steps 2
t=$SECONDS
"$NEW/bench_infer" --config configs/pi0_libero.yaml --device cuda --dtype bf16 --iters 10 --cuda-graph on --cameras 3 \
  --fused on --profile "$R/profile_infer" > "$R/infer_profile.log" 2>&1
log "bench_infer --profile: exit $? in $((SECONDS - t)) s"
pack
row offload78_auto_new "$NEW/bench_train" "${COMMON[@]}" --offload optimizer --checkpointing-modes auto --gpu-gib 78
log "done"
pack
