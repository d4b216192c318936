#!/usr/bin/env bash
# Full-size start-up / memory / checkpoint benchmark (issue 15). NOT run in CI: needs ~20 GB of RAM, ~30 GB of
# disk under $WORK and tens of minutes on a CPU. One full-size process at a time.
#   scripts/bench_fullsize.sh [BUILD_DIR] [WORK_DIR]
# Prints one line per measurement (wall seconds, peak RSS from /usr/bin/time -v, the --print-params prediction)
# for docs/benchmarks.md. Base weights are random: a projection-only float32 run from scratch writes a
# checkpoint whose model.safetensors serves as checkpoint.init_weights for the rest.
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-/tmp/pi0_fullsize_bench}
CFG=configs/pi05_libero_lora.yaml
mkdir -p "$WORK"
rm -rf "$WORK"/runs "$WORK"/bundle

measure() {  # name, command...: wall time and peak RSS of the command
  local name=$1; shift
  local log="$WORK/$name.time"
  /usr/bin/time -v "$@" > "$WORK/$name.log" 2> "$log" || { tail -5 "$log"; exit 1; }
  local wall rss
  wall=$(grep "Elapsed (wall clock)" "$log" | awk '{print $NF}')
  rss=$(grep "Maximum resident set size" "$log" | awk '{printf "%.1f", $NF/1048576}')
  echo "$name: wall $wall, peak RSS $rss GiB"
}
predict() {  # preset: --print-params total
  "$BUILD/pi0-train" --config "$CFG" --set train.freeze="$1" --print-params --json |
    python3 -c 'import json,sys; j=json.load(sys.stdin); t=j.get("total", j); print("predicted", {k: v for k, v in t.items() if "bytes" in k or "gib" in k.lower()})'
}
common=(--config "$CFG" --set train.batch_size=1 --set train.num_steps=1 --set checkpoint.save_interval=1
        --set train.log_interval=1)

# 0. Base weights (random, float32) and raw disk speed for a file of the same size.
measure base "$BUILD/pi0-train" "${common[@]}" --set train.freeze=projection-only --set train.precision=float32 \
  --set checkpoint.run_dir="$WORK/runs/base"
BASE=$(ls -d "$WORK"/runs/base/checkpoints/*/ | tail -1)model.safetensors
SIZE_MB=$(( $(stat -c %s "$BASE") / 1048576 ))
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
echo "raw write ($SIZE_MB MiB): $(dd if=/dev/zero of="$WORK/raw.bin" bs=16M count=$((SIZE_MB / 16)) oflag=direct conv=fsync 2>&1 | tail -1)"
echo "raw read: $(dd if="$WORK/raw.bin" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1)"
rm -f "$WORK/raw.bin"

# 1. Presets from the base: start-up (log lines), peak RSS vs prediction, checkpoint size and save speed.
for preset in lora action-expert-only projection-only; do
  predict "$preset"
  measure "train_$preset" "$BUILD/pi0-train" "${common[@]}" --set train.freeze="$preset" \
    --set checkpoint.init_weights="$BASE" --set checkpoint.run_dir="$WORK/runs/$preset"
  grep -E "model ready|saved checkpoint|s/step|samples/s" "$WORK/train_$preset.log" | sed 's/^/  /'
  du -sh "$WORK/runs/$preset/checkpoints/"*/ | sed 's/^/  checkpoint /'
done

# 2. Resume (LoRA) one more step, export to bf16, inference load.
measure resume "$BUILD/pi0-train" "${common[@]}" --set train.freeze=lora --set train.num_steps=2 \
  --set checkpoint.init_weights="$BASE" --set checkpoint.run_dir="$WORK/runs/lora" --resume
grep -E "loaded checkpoint state|model ready" "$WORK/resume.log" | sed 's/^/  /'
measure export "$BUILD/pi0-export" --checkpoint "$WORK/runs/lora" --out "$WORK/bundle" --dtype bf16
du -sh "$WORK/bundle/model.safetensors" | sed 's/^/  bundle /'
echo "(pi0-infer needs an observation file: see docs/formats.md; run it on \$WORK/bundle with /usr/bin/time -v)"
echo "done; remove $WORK when finished"
