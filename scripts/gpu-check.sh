#!/usr/bin/env bash
# The one command that proves the product on a GPU machine (one H100/H200, PyTorch with CUDA installed, nvcc, CMake,
# Ninja; no package manager, no network). Builds against that machine's LibTorch with the third-party packages
# carried in .deps (scripts/fetch_deps.sh, run beforehand on a machine with network), then:
#   1. the std:: symbol binding check (scripts/check_std_bindings.sh) and the whole test suite on the CUDA build,
#      with the openpi parity fixtures evaluated on the GPU too (PI0_FIXTURES_DIR: .fixtures/openpi if carried);
#   2. every user flow: pi0-train from random weights with save_interval/keep_last rotating (>= 2 rotations), stopped
#      with SIGTERM and --resume'd, pi0-export, pi0-infer, pi0-serve answering openpi's own client (the wheels carried
#      in .deps/wheels) — full size (configs/pi05_libero.yaml) on CUDA; without a GPU the same flow on the tiny
#      configs/debug.yaml on the CPU, so the script itself is rehearsed;
#   3. the benchmarks of scripts/bench.sh --gpu (rows independent; JSON + markdown in OUT_DIR).
# Logs and results go to OUT_DIR; summary.txt is the verdict, one line per step.
#   scripts/gpu-check.sh OUT_DIR [--no-bench] [--no-suite] [--no-flow] [--cuda-only] [--build-only]
#       --cuda-only: run only the [cuda] test cases instead of the whole suite (a quick look)
#       --build-only: configure, build and the binding check (then measure by hand in the same call)
# Budget: 10 minutes on 16 cores + one H100 (build ~3 min). Without a usable GPU every GPU step is skipped visibly.
# Through the workplace's device tool (8 files come back from $OUT; carried paths are replaced on each call), carry
# .deps and .fixtures (scripts/fetch_deps.sh --fixtures makes both, within the 64 MiB a call carries) and pack OUT:
#   BUILD_DIR=/tmp/bgpu scripts/gpu-check.sh /tmp/gc; rc=$?; tar czf $OUT/gpu-check.tgz -C /tmp gc; exit $rc
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:?usage: scripts/gpu-check.sh OUT_DIR [--no-bench] [--no-suite] [--no-flow] [--cuda-only] [--build-only]}"
shift
BENCH=1; SUITE=1; FLOW=1; CUDA_ONLY=0
for a in "$@"; do
  case "$a" in
    --no-bench) BENCH=0 ;; --no-suite) SUITE=0 ;; --no-flow) FLOW=0 ;; --cuda-only) CUDA_ONLY=1 ;;
    --build-only) BENCH=0; SUITE=0; FLOW=0 ;;
    --full-suite) ;;  # the default now; accepted for old command lines
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
BUILD="${BUILD_DIR:-build-gpu}"
DEPS="${PI0_DEPS_DIR:-.deps}"
log() { echo "[gpu-check $(date +%H:%M:%S)] $*" | tee -a "$OUT_DIR/summary.txt"; }
: > "$OUT_DIR/summary.txt"
START=$SECONDS
status=0
fail() { log "FAILED: $*"; status=1; }

[ -d "$DEPS/usr/include" ] || { log "no $DEPS: run scripts/fetch_deps.sh on a machine with network and carry $DEPS"; exit 2; }
export PATH="$PATH:/usr/local/cuda/bin"
PY="${PYTHON:-python3}"
TORCH_PREFIX="${PI0_TORCH_PREFIX:-$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)}"
[ -n "$TORCH_PREFIX" ] || { log "no LibTorch: set PI0_TORCH_PREFIX or make '$PY -c \"import torch\"' work"; exit 2; }
{
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  else echo "no nvidia-smi"; fi
  $PY -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>/dev/null
  nvcc --version 2>&1 | tail -1; cmake --version | head -1; echo "cores $(nproc)"; df -h . /tmp | tail -n +2
} > "$OUT_DIR/machine.txt"
log "machine: $(tr '\n' ';' < "$OUT_DIR/machine.txt")"
HAVE_GPU=0; $PY -c 'import torch,sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && HAVE_GPU=1
[ $HAVE_GPU = 1 ] || log "no usable GPU: the GPU steps are skipped; the flow runs on the CPU with configs/debug.yaml"

# Configure + build everything (the suite runs the apps and the benchmarks). PI0_CMAKE_FLAGS adds flags, as in
# setup.sh (the CPU rehearsal uses -DPI0_WERROR=ON and ccache). CMAKE_IGNORE_PREFIX_PATH keeps a
# system copy of a package (if any) from shadowing the carried one.
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
if ! cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
     -DPI0_DEPS_DIR="$DEPS" -DCMAKE_IGNORE_PREFIX_PATH=/usr ${PI0_CMAKE_FLAGS:-} > "$OUT_DIR/configure.log" 2>&1; then
  log "configure FAILED (configure.log)"; tail -20 "$OUT_DIR/configure.log"; exit 1
fi
grep '^-- pi0:' "$OUT_DIR/configure.log" | sed 's/^-- //' | while read -r l; do log "$l"; done
export LD_LIBRARY_PATH="$PWD/$DEPS/usr/lib/x86_64-linux-gnu:$PWD/$DEPS/usr/lib/x86_64-linux-gnu/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! cmake --build "$BUILD" -j "$(nproc)" > "$OUT_DIR/build.log" 2>&1; then
  log "build FAILED (build.log)"; grep -m20 -B2 -A6 'error' "$OUT_DIR/build.log"; exit 1
fi
log "built in $((SECONDS - START)) s"

# openpi's client for pi0-serve: the GPU image's Python has numpy and msgpack but not websockets or openpi-client.
# Their wheels (.deps/wheels, fetch_deps.sh) are unpacked, not installed; the suite's serve test builds its venv
# from the same wheels without an index (PIP_*), and sees numpy/msgpack through PYTHONPATH.
PYDEPS=/tmp/pi0_gpu_check_pydeps
if ls "$DEPS"/wheels/*.whl >/dev/null 2>&1; then
  rm -rf "$PYDEPS"; mkdir -p "$PYDEPS"
  for w in "$DEPS"/wheels/*.whl; do $PY -m zipfile -e "$w" "$PYDEPS" || log "cannot unpack $w"; done
  sys_dirs=$($PY -c 'import os,numpy,msgpack;print(":".join(sorted({os.path.dirname(os.path.dirname(m.__file__)) for m in (numpy,msgpack)})))' 2>/dev/null)
  export PYTHONPATH="$PYDEPS${sys_dirs:+:$sys_dirs}${PYTHONPATH:+:$PYTHONPATH}"
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/$DEPS/wheels" PIP_NO_DEPS=1
  $PY -c 'import openpi_client.websocket_client_policy' 2>/dev/null && log "openpi-client: from $DEPS/wheels" \
    || log "openpi-client: not importable with $PY (numpy or msgpack missing?): pi0-serve is checked without it"
else
  log "openpi-client: no $DEPS/wheels (scripts/fetch_deps.sh makes them): pi0-serve is checked without it"
fi
if [ -z "${PI0_FIXTURES_DIR:-}" ] && [ -d .fixtures/openpi ]; then export PI0_FIXTURES_DIR="$PWD/.fixtures/openpi"; fi
log "openpi fixtures: ${PI0_FIXTURES_DIR:-../shared/fixtures/openpi} ($(ls "${PI0_FIXTURES_DIR:-../shared/fixtures/openpi}" 2>/dev/null | tr '\n' ' '))"

# 1. Symbol bindings (issue 22's crash), then the suite.
if scripts/check_std_bindings.sh "$BUILD" > "$OUT_DIR/std_bindings.log" 2>&1; then
  log "std:: symbol bindings: none of ours binds to LibTorch ($(grep -c '^ok' "$OUT_DIR/std_bindings.log") binaries)"
else
  fail "std:: symbol bindings (std_bindings.log): $(grep -m3 '^FAIL' "$OUT_DIR/std_bindings.log" | tr '\n' ' ')"
fi
if [ $SUITE = 1 ]; then
  "$BUILD/tests/pi0_tests" "[cuda]" --durations yes > "$OUT_DIR/tests_cuda.log" 2>&1
  r=$?
  log "[cuda] tests: exit $r — $(grep -E '^(All tests passed|test cases:)' "$OUT_DIR/tests_cuda.log" | tail -1)"
  grep -h "skipped: \[cuda\]" "$OUT_DIR/tests_cuda.log" | sed 's/^ *//' | sort -u | while read -r l; do log "$l"; done
  grep -h "^parity cuda" "$OUT_DIR/tests_cuda.log" | sort -k8 -g | tail -2 | while read -r l; do log "largest: $l"; done
  # 77: every [cuda] case skipped, which is right without a GPU and a failure with one.
  [ $r = 0 ] || { [ $r = 77 ] && [ $HAVE_GPU = 0 ]; } || fail "[cuda] tests (tests_cuda.log)"
  if [ $CUDA_ONLY = 0 ]; then
    (cd "$BUILD" && OMP_NUM_THREADS=1 ctest -j "$(nproc)" --timeout 600 > "$OUT_DIR/tests_all.log" 2>&1)
    r=$?
    log "whole suite: exit $r — $(grep -E 'tests passed' "$OUT_DIR/tests_all.log" | tail -1)"
    grep -E '^\s+[0-9]+ - ' "$OUT_DIR/tests_all.log" | head -20 | while read -r l; do log "  failed: $l"; done
    [ $r = 0 ] || fail "whole suite (tests_all.log)"
  fi
fi

# 2. The user flow: train with rotation, SIGTERM, --resume, export, infer, serve + openpi-client.
flow() {
  local W=/tmp/pi0_gpu_check_flow dev cfg img n si stop_at
  if [ $HAVE_GPU = 1 ]; then
    dev=cuda; cfg=configs/pi05_libero.yaml; img=224; n=24; si=6
    # Full size from random weights; the action expert trains (AdamW and checkpoints stay ~10 GB: the disk is 64 GB).
    local extra=(--set train.batch_size=8 --set train.freeze=action-expert-only --set train.ema_decay=0
                 --set train.gradient_checkpointing=true)
  else
    dev=cpu; cfg=configs/debug.yaml; img=56; n=120; si=6   # steps take ~0.5 s: room for the SIGTERM at step 20
    local extra=(--set train.batch_size=4)
  fi
  stop_at=$((3 * si + 2))   # after the saves at si, 2 si, 3 si: two rotations done (keep_last 1)
  rm -rf "$W"; mkdir -p "$W"
  local B; B="$(cd "$BUILD" && pwd)"
  "$B/pi0-make-example-data" --out "$W/data" --episodes 4 --steps 40 --image-size $img > "$W/data.log" 2>&1 \
    || { fail "flow: pi0-make-example-data ($W/data.log)"; return; }
  local sets=(--set "data.dataset.paths=[$W/data/*.hdf5]" --set "data.norm_stats=$W/data/norm_stats.json"
              --set "data.tokenizer=$PWD/data/tokenizer/tiny_spm.model" --set "checkpoint.run_dir=$W/run"
              --set 'checkpoint.init_weights=""' --set train.device=$dev --set train.num_steps=$n --set train.log_interval=1
              --set checkpoint.save_interval=$si --set checkpoint.keep_last=1 --set checkpoint.keep_period=0
              --set data.num_workers=2 "${extra[@]}")
  "$B/pi0-norm-stats" --config $cfg "${sets[@]}" --out "$W/data/norm_stats.json" > "$W/norm_stats.log" 2>&1 \
    || { fail "flow: pi0-norm-stats ($W/norm_stats.log)"; return; }
  local t0=$SECONDS
  "$B/pi0-train" --config $cfg "${sets[@]}" > "$OUT_DIR/flow_train.log" 2>&1 &
  local pid=$! s=0
  while kill -0 $pid 2>/dev/null; do
    s=$(tail -1 "$W/run/metrics.jsonl" 2>/dev/null | sed -n 's/.*"step": *\([0-9]*\).*/\1/p'); s=${s:-0}
    [ "$s" -ge $stop_at ] && break
    sleep 0.5
  done
  kill -0 $pid 2>/dev/null || { wait $pid; fail "flow: pi0-train ended (step $s) before the SIGTERM it should get at step $stop_at"; return; }
  kill -TERM $pid 2>/dev/null; wait $pid; local r=$?
  local ck; ck=$(ls "$W/run/checkpoints" 2>/dev/null | tr '\n' ' ')
  if [ $r != 0 ]; then fail "flow: pi0-train exit $r before/at SIGTERM (flow_train.log)"; return; fi
  if [ -e "$W/run/checkpoints/$si" ] || [ -e "$W/run/checkpoints/$((2 * si))" ] || [ -z "$ck" ]; then
    fail "flow: rotation (keep_last 1) left checkpoints: $ck"; return
  fi
  log "flow: pi0-train $cfg on $dev: SIGTERM at step $s after $((SECONDS - t0)) s, exit 0; checkpoints left: $ck(steps $si and $((2 * si)) rotated away)"
  "$B/pi0-train" --config $cfg "${sets[@]}" --resume >> "$OUT_DIR/flow_train.log" 2>&1 \
    || { fail "flow: pi0-train --resume (flow_train.log)"; return; }
  [ -f "$W/run/checkpoints/$n/COMPLETE" ] || { fail "flow: no checkpoint $n after --resume"; return; }
  log "flow: --resume reached step $n; checkpoints: $(ls "$W/run/checkpoints" | tr '\n' ' ')"
  "$B/pi0-export" --checkpoint "$W/run" --out "$W/bundle" --dtype bf16 > "$OUT_DIR/flow_export.log" 2>&1 \
    || { fail "flow: pi0-export (flow_export.log)"; return; }
  rm -rf "$W/run"  # the bundle is what the rest uses; a full-size run directory is tens of GB
  "$B/pi0-make-example-data" --observation-out "$W/obs.safetensors" --out "$W/data" >> "$W/data.log" 2>&1
  "$B/pi0-infer" --bundle "$W/bundle" --obs "$W/obs.safetensors" --prompt "reach the red blob" --device $dev \
    --out "$W/actions.safetensors" > "$OUT_DIR/flow_infer.log" 2>&1 || { fail "flow: pi0-infer --device $dev (flow_infer.log)"; return; }
  log "flow: pi0-export + pi0-infer --device $dev: actions written ($(stat -c %s "$W/actions.safetensors") bytes)"
  if [ -x "$B/pi0-serve" ]; then
    # Fixed initial noise (as the suite's serve test): without it every request draws new noise, as openpi's server
    # does, and the client's "same observation, same answer" checks cannot hold.
    $PY - "$W/bundle/config.json" "$W/noise.safetensors" <<'PYEOF' || fail "flow: writing the fixed noise"
import json, struct, sys, random
c = json.load(open(sys.argv[1]))
h, a = c["action_horizon"], c["action_dim"]
rng = random.Random(0)
data = struct.pack(f"<{h * a}f", *[rng.gauss(0, 1) for _ in range(h * a)])
head = json.dumps({"noise": {"dtype": "F32", "shape": [h, a], "data_offsets": [0, len(data)]}}).encode()
head += b" " * (-len(head) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(head)) + head + data)
PYEOF
    "$B/pi0-serve" --bundle "$W/bundle" --device $dev --port 0 --robot libero --noise "$W/noise.safetensors" \
      > "$OUT_DIR/flow_serve.log" 2>&1 &
    local spid=$! port=""
    for _ in $(seq 1 600); do
      port=$(sed -n 's|.*listening on ws://[^:]*:\([0-9]*\).*|\1|p' "$OUT_DIR/flow_serve.log" | head -1)
      [ -n "$port" ] || ! kill -0 $spid 2>/dev/null && break
      sleep 0.5
    done
    if [ -z "$port" ]; then fail "flow: pi0-serve did not start (flow_serve.log)"; kill -TERM $spid 2>/dev/null; wait $spid
    elif $PY -c 'import openpi_client.websocket_client_policy' 2>/dev/null; then
      if $PY tests/serve/openpi_client_driver.py --port "$port" --robot libero --out "$W/client" --cases 2 \
           > "$OUT_DIR/flow_client.log" 2>&1; then
        log "flow: pi0-serve --device $dev answered openpi-client ($(ls "$W/client" | grep -c actions) observations)"
      else fail "flow: openpi-client against pi0-serve (flow_client.log)"; fi
    else
      if $PY -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:$port/healthz').status != 200)" 2>/dev/null; then
        log "flow: pi0-serve --device $dev up (/healthz 200); skipped the openpi-client request: openpi_client not importable with $PY"
      else fail "flow: pi0-serve /healthz"; fi
    fi
    kill -TERM $spid 2>/dev/null; wait $spid; r=$?
    [ -z "$port" ] || [ $r = 0 ] || fail "flow: pi0-serve exit $r on SIGTERM (flow_serve.log)"
  else
    log "flow: pi0-serve not built (no Boost/msgpack-cxx at configure): skipped"
  fi
  if [ $status = 0 ]; then rm -rf "$W"; else log "flow: kept $W for a look"; fi
}
if [ $FLOW = 1 ]; then t=$SECONDS; flow; log "flow: $((SECONDS - t)) s"; fi

# 3. Benchmarks (rows independent; PI0_BENCH_GPU_QUICK keeps them inside the budget unless set to 0).
if [ $BENCH = 1 ]; then
  if [ $HAVE_GPU = 1 ]; then
    GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
    PEAK=989; case "$GPU_NAME" in *H200*|*H100*) PEAK=989 ;; *A100*) PEAK=312 ;; esac
    t=$SECONDS
    PI0_BENCH_GPU_QUICK="${PI0_BENCH_GPU_QUICK:-1}" BUILD_DIR="$BUILD" BENCH_OUT="$OUT_DIR" \
      scripts/bench.sh --gpu "$PEAK" > "$OUT_DIR/bench.log" 2>&1
    r=$?
    log "benchmarks: exit $r in $((SECONDS - t)) s (benchmarks_gpu.md, benchmarks_gpu.json)"
    grep -h "out of memory at batch\|FAILED" "$OUT_DIR"/gpu_*.md 2>/dev/null | head -5 | while read -r l; do log "  $l"; done
    [ $r = 0 ] || fail "benchmarks (bench.log)"
  else
    log "benchmarks: skipped (no usable GPU)"
  fi
fi
log "done in $((SECONDS - START)) s, exit $status"
exit $status
