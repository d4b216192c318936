#!/usr/bin/env bash
# Full-size start-up / memory / checkpoint benchmark (issue 15). NOT run in CI: needs ~16 GB of free RAM, ~40 GB
# of disk under WORK_DIR and tens of minutes on a CPU. Run one full-size process at a time (this script does).
#   scripts/bench_fullsize.sh [BUILD_DIR] [WORK_DIR]      (PARTS=memory: only the peak RSS against the plan)
# Prints one line per measurement (wall time and peak RSS from /usr/bin/time -v, --print-params predictions)
# for docs/benchmarks.md. Base weights are random: a projection-only float32 run from scratch writes a checkpoint
# whose model.safetensors then serves as checkpoint.init_weights. Delete WORK_DIR afterwards.
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-/tmp/pi0_fullsize_bench}
PARTS=${PARTS:-all}
CFG=configs/pi05_libero_lora.yaml
mkdir -p "$WORK"
rm -rf "$WORK"/runs "$WORK"/bundle

measure() {  # name, command...: wall time and peak RSS of the command
  local name=$1; shift
  local log="$WORK/$name.time"
  /usr/bin/time -v "$@" > "$WORK/$name.log" 2> "$log" || { tail -5 "$log"; exit 1; }
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$log" | awk '{printf "%.2f", $NF/1048576}')
  echo "$name: wall $wall, peak RSS $rss GiB"
}

# Generated LIBERO-layout data, its norm stats and the tiny tokenizer (its token ids fit the full vocabulary).
if [ ! -f "$WORK/data/norm_stats.json" ]; then
  "$BUILD/pi0-make-example-data" --out "$WORK/data" --episodes 2 --steps 20 --image-size 224 > /dev/null
  "$BUILD/pi0-norm-stats" --format libero --data "$WORK/data/*.hdf5" --action-horizon 10 \
    --out "$WORK/data/norm_stats.json" > /dev/null
fi
"$BUILD/pi0-make-example-data" --observation-out "$WORK/obs.safetensors" --out "$WORK/data" > /dev/null
common=(--config "$CFG" --set train.device=cpu --set train.batch_size=1 --set train.num_steps=1
        --set checkpoint.save_interval=1 --set train.log_interval=1 --set "data.dataset.paths=[$WORK/data/*.hdf5]"
        --set data.norm_stats="$WORK/data/norm_stats.json" --set data.tokenizer=data/tokenizer/tiny_spm.model
        --set data.num_workers=1)

plan() {  # extra args: --print-params' plan in GiB: "resident tensors runtime slack" (resident = the sum)
  "$BUILD/pi0-train" "${common[@]}" "$@" --print-params --json |
    python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f %.2f %.2f %.2f" % tuple(j[k]/2**30 for k in ("resident_peak_bytes", "peak_bytes", "runtime_bytes", "allocator_slack_bytes")))'
}
against_plan() {  # name, extra args: the measured peak RSS of run `name` against the plan for the same args
  local name=$1; shift
  local p rss
  p=($(plan "$@"))
  rss=$(grep "Maximum resident set size" "$WORK/$name.time" | awk '{printf "%.2f", $NF/1048576}')
  echo "  predicted ${p[0]} GiB resident (${p[1]} tensors + ${p[2]} runtime + ${p[3]} allocator slack), measured $rss GiB:" \
    "$(python3 -c "print('%+.1f %%' % (100 * ($rss - ${p[0]}) / ${p[0]}))")"
}

# Load and save against the raw disk on one ~3.5 GB file, page cache evicted (bench_safetensors_load --cold).
if [ "$PARTS" = all ]; then
  "$BUILD/bench_safetensors_load" --cold --size-gb 3.5 --repeat 3 --path "$WORK/bench_cold.safetensors"
fi

# 0. Base weights (random, float32) and the raw disk speed for a file of the same size.
measure base "$BUILD/pi0-train" "${common[@]}" --set train.freeze=projection-only --set train.precision=float32 \
  --set "checkpoint.init_weights=''" --set checkpoint.run_dir="$WORK/runs/base"
BASE=$(ls -d "$WORK"/runs/base/checkpoints/*/ | tail -1)model.safetensors
SIZE_MB=$(( $(stat -c %s "$BASE") / 1048576 ))
[ "$PARTS" = all ] && echo "raw write ($SIZE_MB MiB): $(dd if=/dev/zero of="$WORK/raw.bin" bs=16M count=$((SIZE_MB / 16)) oflag=direct conv=fsync 2>&1 | tail -1)"
[ "$PARTS" = all ] && echo "raw read: $(dd if="$WORK/raw.bin" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1)"
rm -f "$WORK/raw.bin"

# 1. Presets from the base: start-up, peak RSS vs prediction, checkpoint size and save speed.
for preset in lora action-expert-only projection-only; do
  measure "train_$preset" "$BUILD/pi0-train" "${common[@]}" --set train.freeze="$preset" \
    --set checkpoint.init_weights="$BASE" --set checkpoint.run_dir="$WORK/runs/$preset"
  against_plan "train_$preset" --set train.freeze="$preset" --set checkpoint.init_weights="$BASE"
  grep -E "model ready|loaded [0-9]+ tensors|saved checkpoint|s/step|samples/s" "$WORK/train_$preset.log" | sed 's/^/  /'
  du -sh "$WORK/runs/$preset/checkpoints/"*/ | sed 's/^/  checkpoint /'
done

# The calibration point of MemoryPlan::kRuntimeFloorBytes: the same run with a model of almost no size (the plan
# reproduces the median of repeated runs; one run varies by about ±0.04 GiB).
tiny=(--set model.paligemma_variant=dummy --set model.action_expert_variant=dummy --set model.siglip_variant=tiny/14
      --set model.vocab_size=1024 --set train.freeze=full --set "checkpoint.init_weights=''" --set train.num_steps=3)
measure runtime_floor "$BUILD/pi0-train" "${common[@]}" "${tiny[@]}" --set checkpoint.run_dir="$WORK/runs/floor"
against_plan runtime_floor "${tiny[@]}"
# The full preset: float32 weights, gradients and AdamW of the 3.4 B model (~50 GiB) do not fit 24 GiB; it is
# checked on a mid-size model with the full-size SigLIP (0.45 B parameters, from random initialization).
mid=(--set model.paligemma_variant=small_512 --set model.action_expert_variant=small_256 --set model.vocab_size=1024
     --set train.freeze=full --set "checkpoint.init_weights=''" --set train.num_steps=2)
measure train_full_mid "$BUILD/pi0-train" "${common[@]}" "${mid[@]}" --set checkpoint.run_dir="$WORK/runs/full_mid"
against_plan train_full_mid "${mid[@]}"

[ "$PARTS" = all ] || { echo "done (PARTS=$PARTS); remove $WORK when finished"; exit 0; }

# 2. Resume (LoRA) one more step, export to bf16, inference.
measure resume "$BUILD/pi0-train" "${common[@]}" --set train.freeze=lora --set train.num_steps=2 \
  --set checkpoint.init_weights="$BASE" --set checkpoint.run_dir="$WORK/runs/lora" --resume
grep -E "loaded checkpoint state|model ready|loaded [0-9]+ tensors" "$WORK/resume.log" | sed 's/^/  /'
measure export "$BUILD/pi0-export" --checkpoint "$WORK/runs/lora" --out "$WORK/bundle" --dtype bf16
du -sh "$WORK/bundle/model.safetensors" | sed 's/^/  bundle /'
measure infer "$BUILD/pi0-infer" --bundle "$WORK/bundle" --obs "$WORK/obs.safetensors" \
  --out "$WORK/actions.safetensors" --num-steps 2 --prompt "pick up the bowl"
grep -E "loaded [0-9]+ tensors|computing in|total:" "$WORK/infer.log" | sed 's/^/  /'
echo "done; remove $WORK when finished"
