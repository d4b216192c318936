#!/usr/bin/env bash
# Runs every benchmark on CPU and writes the results table: docs/benchmarks.md (markdown) and
# bench/results/results.json (each benchmark's JSON where it has one, its markdown output otherwise).
#   scripts/bench.sh [--quick]      --quick: fewer iterations and a 1 GB safetensors file (for a smoke run)
#   scripts/bench.sh --gpu [PEAK_TFLOPS]
#       GPU mode (a CUDA build, see README): full-size pi0 and pi0.5, bf16-mixed, batch 32, checkpointing on and off
#       (samples/s, MFU against PEAK_TFLOPS — default 989, an H100 SXM's dense bf16 peak — and peak GPU memory),
#       LoRA and action-expert-only memory, and inference latency at 1 and 3 cameras with and without a CUDA graph;
#       writes benchmarks_gpu.md, benchmarks_gpu.json and gpu_*.{md,json} into $BENCH_OUT (default bench/results).
#       Rows are independent (a row that does not fit says "out of memory at batch N" after trying half the batch;
#       a failed row does not stop the others) and nothing runs apt: missing benchmarks are built in BUILD_DIR.
#       PI0_BENCH_GPU_QUICK=1: fewer steps and only the checkpointing-on training rows (gpu-check's time budget).
# Benchmarks time real work, so run them on an otherwise idle machine; the header records the load average.
# PI0_THREADS=N sets ATen, OpenMP and OpenBLAS to N threads together (default 0: ATen's default, which the other
# two follow); the header states the effective counts.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
QUICK=0; [ "${1:-}" = "--quick" ] && QUICK=1
OUT=bench/results
THREADS="${PI0_THREADS:-0}"
mkdir -p "$OUT"

if [ "${1:-}" = "--gpu" ]; then
  PEAK="${2:-989}"
  GOUT="${BENCH_OUT:-$OUT}"   # scripts/gpu-check.sh points this at its results folder
  mkdir -p "$GOUT"
  # Build what is missing with the build's own CMake (a GPU machine has no package manager: never setup.sh here).
  need=(); for t in bench_train bench_infer; do [ -x "$BUILD/$t" ] || need+=("$t"); done
  if [ ${#need[@]} -gt 0 ]; then
    [ -f "$BUILD/CMakeCache.txt" ] || { echo "bench.sh --gpu: no configured build in $BUILD (run scripts/gpu-check.sh or scripts/setup.sh --cuda)" >&2; exit 2; }
    cmake --build "$BUILD" -j "$(nproc)" --target "${need[@]}" >&2 || { echo "bench.sh --gpu: building ${need[*]} failed" >&2; exit 1; }
  fi
  if [ "${PI0_BENCH_GPU_QUICK:-0}" = 1 ]; then GSTEPS=(--warmup 2 --steps 4); MODES=1; ITERS=10
  else GSTEPS=(--warmup 3 --steps 10); MODES=0,1; ITERS=20; fi
  rows=(); failed=0
  row() {  # name, command...: markdown to $GOUT/<name>.md, the benchmark's own log to <name>.log
    local name=$1; shift
    echo "==> $name" >&2
    rows+=("$name")
    "$@" > "$GOUT/$name.md" 2> "$GOUT/$name.log" || { echo "FAILED (exit $?): see $name.log" >> "$GOUT/$name.md"; failed=1; }
  }
  for m in pi0 pi05; do
    row "gpu_train_$m" "$BUILD/bench_train" --config "configs/${m}_libero.yaml" --device cuda --batches 32 \
      --precisions bf16-mixed "${GSTEPS[@]}" --workers 8 --checkpointing-modes $MODES --peak-tflops "$PEAK" \
      --json "$GOUT/gpu_train_$m.json"
    # Issue 36: the simplified weights against the module path, eager and graphed, batch 1 and 8.
    row "gpu_infer_$m" "$BUILD/bench_infer" --config "configs/${m}_libero.yaml" --device cuda --dtype bf16 \
      --cameras 1,3 --batches 1,8 --iters $ITERS --cuda-graph off,on --fused off,on --json "$GOUT/gpu_infer_$m.json"
  done
  # Real-time chunking's cost per denoise step (issue 35): off and trained replay the CUDA graph; guided runs eager,
  # the exact product with one backward pass of the action expert per step.
  row gpu_infer_pi0_rtc "$BUILD/bench_infer" --config configs/pi0_libero.yaml --device cuda --dtype bf16 \
    --cameras 3 --iters $ITERS --cuda-graph on --rtc off,trained,guided-identity,guided-exact --rtc-delay 5 \
    --json "$GOUT/gpu_infer_pi0_rtc.json"
  # pi0-serve on top of the pi0.5 model call: round trip, overhead, throughput with 1/4/8 clients (batching on).
  [ -x "$BUILD/bench_serve" ] && row gpu_serve_pi05 "$BUILD/bench_serve" --config configs/pi05_libero.yaml --device cuda \
    --dtype bf16 --cameras 1,3 --iters 30 --clients 1,4,8 --requests 10 --json "$GOUT/gpu_serve_pi05.json"
  # Issue 33: the optimizer on the host. A 24 GB card emulated by capping the caching allocator at 22 GiB; the host
  # update runs on ATen's threads (12) beside 4 loader workers on the machine's 16 cores. Then auto on the whole GPU.
  for m in pi0 pi05; do
    row "gpu_train_${m}_offload_24gb" "$BUILD/bench_train" --config "configs/${m}_libero.yaml" --device cuda \
      --batches 32 --precisions bf16-mixed --warmup 2 --steps 4 --workers 4 --threads 12 --checkpointing-modes 1 \
      --offload optimizer --gpu-gib 22 --peak-tflops "$PEAK" --json "$GOUT/gpu_train_${m}_offload_24gb.json"
  done
  # 80 GB: what the plan frees spent on speed — train.gradient_checkpointing=auto recomputes only the layers that do not
  # fit, with offload decided by auto (it offloads pi0 full) and without offload: which of the two is faster.
  row gpu_train_pi0_offload_auto "$BUILD/bench_train" --config configs/pi0_libero.yaml --device cuda --batches 32 \
    --precisions bf16-mixed --warmup 2 --steps 4 --workers 4 --threads 12 --checkpointing-modes 1,auto --offload auto \
    --peak-tflops "$PEAK" --json "$GOUT/gpu_train_pi0_offload_auto.json"
  row gpu_train_pi0_ckpt_auto "$BUILD/bench_train" --config configs/pi0_libero.yaml --device cuda --batches 32 \
    --precisions bf16-mixed --warmup 2 --steps 4 --workers 8 --checkpointing-modes auto \
    --peak-tflops "$PEAK" --json "$GOUT/gpu_train_pi0_ckpt_auto.json"
  # Memory of the partial fine-tunes (pi0.5): LoRA (configs/pi05_libero_lora.yaml) and action-expert-only.
  row gpu_train_pi05_lora "$BUILD/bench_train" --config configs/pi05_libero_lora.yaml --device cuda --batches 32 \
    --precisions bf16-mixed --warmup 2 --steps 4 --workers 8 --checkpointing-modes 1 --peak-tflops "$PEAK" \
    --json "$GOUT/gpu_train_pi05_lora.json"
  row gpu_train_pi05_action_expert "$BUILD/bench_train" --config configs/pi05_libero.yaml --freeze action-expert-only \
    --device cuda --batches 32 --precisions bf16-mixed --warmup 2 --steps 4 --workers 8 --checkpointing-modes 1 \
    --peak-tflops "$PEAK" --json "$GOUT/gpu_train_pi05_action_expert.json"
  {
    echo "# Benchmarks (GPU)"; echo
    echo "Generated by \`scripts/bench.sh --gpu $PEAK\` on $(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)."
    for f in "${rows[@]}"; do echo; echo "## $f"; echo; cat "$GOUT/$f.md"; done
  } > "$GOUT/benchmarks_gpu.md"
  {  # every row's JSON (the benchmark's own; its markdown where it wrote none)
    echo "{"; echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"gpu\": \"$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)\","
    first=1
    for f in "${rows[@]}"; do
      [ $first = 1 ] || echo ","; first=0
      if [ -s "$GOUT/$f.json" ]; then printf '  "%s": ' "$f"; cat "$GOUT/$f.json"
      else printf '  "%s": {"markdown": %s}' "$f" "$(python3 -c 'import json,sys;print(json.dumps(sys.stdin.read()))' < "$GOUT/$f.md")"; fi
    done
    echo; echo "}"
  } > "$GOUT/benchmarks_gpu.json"
  echo "wrote $GOUT/benchmarks_gpu.md and $GOUT/benchmarks_gpu.json"
  exit $failed
fi
[ -x "$BUILD/bench_model" ] || scripts/setup.sh "$BUILD"

if [ $QUICK = 1 ]; then ITERS=2; STEPS=2; GB=1; else ITERS=5; STEPS=3; GB=3.2; fi
run() {  # name, command...: stdout (the benchmark's markdown) goes to $OUT/<name>.md
  local name=$1; shift
  echo "==> $name: $*" >&2
  "$@" > "$OUT/$name.md" 2> "$OUT/$name.log"
}

run model "$BUILD/bench_model" --config configs/bench_cpu.yaml --iters $ITERS --threads "$THREADS" --json "$OUT/model.json"
run train "$BUILD/bench_train" --warmup 1 --steps $STEPS --threads "$THREADS" --json "$OUT/train.json"
run loader "$BUILD/bench_loader" --batches 20 --repeats 3 --train-json "$OUT/train.json"
run safetensors "$BUILD/bench_safetensors_load" --size-gb $GB
run checkpoint_verify "$BUILD/bench_checkpoint_verify" --size-gb $GB
run ddp "$BUILD/bench_ddp" --ranks 2 --steps 12 --batch-size 16 --shard all
run infer "$BUILD/bench_infer" --config configs/bench_cpu.yaml --dtype float32 --cameras 1,3 --iters 5 --fused off,on \
  --json "$OUT/infer.json"
# Real-time chunking's cost per step on the CPU (issue 35): plain, trained, guided with the identity and the exact product.
run infer_rtc "$BUILD/bench_infer" --config configs/bench_cpu.yaml --dtype float32 --cameras 1 --iters 5 \
  --rtc off,trained,guided-identity,guided-exact --rtc-delay 5 --json "$OUT/infer_rtc.json"
run host_optimizer "$BUILD/bench_host_optimizer" --params-m $([ $QUICK = 1 ] && echo 16 || echo 64) --threads 1,2 --steps 3 \
  --json "$OUT/host_optimizer.json"
NAMES=(model train loader safetensors checkpoint_verify ddp infer infer_rtc host_optimizer)
# A data.datasets mixture (LIBERO HDF5, ALOHA HDF5 with JPEG rows, LeRobot v3.0 AV1 video) against LIBERO alone in the
# same run. The LeRobot dataset comes from tests/data/write_lerobot.py in the writer venv the [lerobot] tests create
# (as scripts/bench_lerobot.sh); without that venv the row is left out.
if [ -x "$BUILD/lerobot_test_venv/bin/python" ]; then
  MIX="$BUILD/loader_mixture_data"
  rm -rf "$MIX"
  SVT_LOG=1 "$BUILD/lerobot_test_venv/bin/python" tests/data/write_lerobot.py --out "$MIX" --version v3.0 --images av1 \
    --size 224 --lengths 50,50,50,50,50,50,50,50 --episodes-per-video 4 --episodes-per-file 4 > /dev/null
  run loader_mixture "$BUILD/bench_loader" --batches 20 --repeats 3 --workers 0,2 --augment no --mixture "$MIX"
  rm -rf "$MIX"
  NAMES+=(loader_mixture)
else
  echo "==> loader_mixture: skipped (no $BUILD/lerobot_test_venv: run the [lerobot] tests once)" >&2
fi
if [ -x "$BUILD/bench_serve" ]; then  # built when Boost.Beast and msgpack-cxx are found
  run serve "$BUILD/bench_serve" --config configs/bench_cpu.yaml --iters $((ITERS * 4)) --clients 1,4,8 --requests 2 \
    --json "$OUT/serve.json"
  NAMES+=(serve)
fi

{
  echo "# Benchmarks (CPU)"
  echo
  echo "Generated by \`scripts/bench.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'),"
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg). Each section is one benchmark's own output."
  echo "Effective $(grep -m1 '^threads:' "$OUT/model.md" || echo 'threads: unknown') (PI0_THREADS=$THREADS)."
  for name in "${NAMES[@]}"; do
    echo; echo "## $name"; echo
    echo '```'; grep -v '^\[' "$OUT/$name.md" || true; echo '```'
  done
} > docs/benchmarks.md

{
  echo "{"
  echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"cores\": $(nproc), \"loadavg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
  first=1
  for name in "${NAMES[@]}"; do
    [ $first = 1 ] || echo ","
    first=0
    if [ -s "$OUT/$name.json" ]; then
      printf '  "%s": ' "$name"; cat "$OUT/$name.json"
    else
      printf '  "%s": {"markdown": %s}' "$name" "$(sed 's/\\/\\\\/g; s/"/\\"/g' "$OUT/$name.md" | awk '{printf "%s\\n", $0}' | sed 's/^/"/; s/$/"/')"
    fi
  done
  echo; echo "}"
} > "$OUT/results.json"
echo "wrote docs/benchmarks.md and $OUT/results.json"
