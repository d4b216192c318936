#!/usr/bin/env bash
# One command on the GPU validation machine (one H100/H200, PyTorch with CUDA installed, nvcc, CMake, ninja; no
# package manager, no network): build against that machine's LibTorch with the third-party packages carried in
# .deps (made beforehand by scripts/fetch_deps.sh on a machine with network), run the [cuda] tests and the GPU
# benchmarks, and write logs and results into OUT_DIR.
#   scripts/gpu-check.sh OUT_DIR [--no-bench] [--full-suite]
# Without a usable GPU it still does everything up to the GPU work (configure, build, the [cuda] tests skipping
# visibly) — the rehearsal that keeps the first GPU run's minutes for measuring. Budget: 10 minutes on 16 cores.
# Through the workplace's device tool (whose $OUT returns at most 8 files), carry .deps and pack the folder:
#   scripts/gpu-check.sh /tmp/gc; rc=$?; tar czf $OUT/gpu-check.tgz -C /tmp gc; exit $rc
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:?usage: scripts/gpu-check.sh OUT_DIR [--no-bench] [--full-suite]}"
shift
BENCH=1; FULL=0
for a in "$@"; do
  case "$a" in --no-bench) BENCH=0 ;; --full-suite) FULL=1 ;; *) echo "unknown option $a" >&2; exit 2 ;; esac
done
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
BUILD="${BUILD_DIR:-build-gpu}"
DEPS="${PI0_DEPS_DIR:-.deps}"
log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$OUT_DIR/summary.txt"; }
: > "$OUT_DIR/summary.txt"
START=$SECONDS

[ -d "$DEPS/usr/include" ] || { log "no $DEPS: run scripts/fetch_deps.sh on a machine with network and carry $DEPS"; exit 2; }
export PATH="$PATH:/usr/local/cuda/bin"
PY="${PYTHON:-python3}"
TORCH_PREFIX="${PI0_TORCH_PREFIX:-$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)}"
[ -n "$TORCH_PREFIX" ] || { log "no LibTorch: set PI0_TORCH_PREFIX or make '$PY -c \"import torch\"' work"; exit 2; }
{
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  else echo "no nvidia-smi"; fi
  $PY -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>/dev/null
  nvcc --version 2>&1 | tail -1; cmake --version | head -1; echo "cores $(nproc)"
} > "$OUT_DIR/machine.txt"
log "machine: $(tr '\n' ';' < "$OUT_DIR/machine.txt")"
HAVE_GPU=0; $PY -c 'import torch,sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && HAVE_GPU=1

# Configure + build: only what the checks run. CMAKE_IGNORE_PREFIX_PATH keeps a system copy of a package (if any)
# from shadowing the carried one.
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
if ! cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
     -DPI0_DEPS_DIR="$DEPS" -DCMAKE_IGNORE_PREFIX_PATH=/usr > "$OUT_DIR/configure.log" 2>&1; then
  log "configure FAILED (configure.log)"; tail -20 "$OUT_DIR/configure.log"; exit 1
fi
grep '^-- pi0:' "$OUT_DIR/configure.log" | sed 's/^-- //' | while read -r l; do log "$l"; done
export LD_LIBRARY_PATH="$PWD/$DEPS/usr/lib/x86_64-linux-gnu:$PWD/$DEPS/usr/lib/x86_64-linux-gnu/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TARGETS=(pi0_tests pi0-train pi0-export pi0-infer bench_train bench_infer)
if ! cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" > "$OUT_DIR/build.log" 2>&1; then
  log "build FAILED (build.log)"; grep -m20 -B2 -A6 'error' "$OUT_DIR/build.log"; exit 1
fi
log "built in $((SECONDS - START)) s"

# [cuda] tests (each says so when it skips), then optionally the whole suite.
"$BUILD/tests/pi0_tests" "[cuda]" --durations yes > "$OUT_DIR/tests_cuda.log" 2>&1
rc=$?
log "[cuda] tests: exit $rc — $(grep -E '^(All tests passed|test cases:)' "$OUT_DIR/tests_cuda.log" | tail -1)"
grep -h "skipped \[cuda\]" "$OUT_DIR/tests_cuda.log" | sort -u | while read -r l; do log "$l"; done
status=$rc
if [ $FULL = 1 ]; then
  (cd "$BUILD" && OMP_NUM_THREADS=1 ctest -j "$(nproc)" --timeout 600 > "$OUT_DIR/tests_all.log" 2>&1)
  r=$?; log "whole suite: exit $r — $(grep -E 'tests passed' "$OUT_DIR/tests_all.log" | tail -1)"
  [ $r = 0 ] || status=$r
fi

if [ $BENCH = 1 ]; then
  if [ $HAVE_GPU = 1 ]; then
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    PEAK=989; case "$GPU_NAME" in *H200*|*H100*) PEAK=989 ;; *A100*) PEAK=312 ;; esac
    BUILD_DIR="$BUILD" BENCH_OUT="$OUT_DIR" scripts/bench.sh --gpu "$PEAK" > "$OUT_DIR/bench.log" 2>&1
    log "benchmarks: exit $? (benchmarks_gpu.md)"
  else
    log "benchmarks: skipped (no usable GPU)"
  fi
fi
log "done in $((SECONDS - START)) s, exit $status"
exit $status
