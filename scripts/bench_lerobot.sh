#!/usr/bin/env bash
# format: lerobot against LeRobot's own Python loader, side by side in one run (issue 13):
#   scripts/bench_lerobot.sh [samples]      (default 320 timed samples per row; the datasets have 400 frames)
# 1. a venv build/lerobot_bench_venv with the pinned PyPI lerobot (it pulls PyPI's torch, ~8 GB with its CUDA wheels,
#    ~4 min to install; only PyPI is reachable here, so no CPU-only wheel). lerobot >= 0.4.0 reads only v3.0
#    datasets (shared/docs/lerobot-format.md), so both datasets are v3.0.
# 2. two datasets from tests/data/write_lerobot.py: 8 episodes x 50 frames, 2 cameras 256x256, AV1 video and PNG.
# 3. bench_loader --format lerobot on each (main thread and 2 worker threads, no augmentation) and bench_loader's own HDF5
#    path at 256x256 (same cameras, size and pipeline; its generated frames, 800 of them), then
#    bench/bench_lerobot_python.py: LeRobotDataset.__getitem__ (50-step action chunk) in the main process and through
#    a DataLoader with 2 worker processes.
# Prints one table: wall samples/s and samples per CPU-second (user + sys of all threads/processes doing the work),
# the per-core figure that stays meaningful on a shared machine; then the ratios. Benchmarks only: never a test.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
SAMPLES="${1:-320}"
LEROBOT_VERSION=0.4.4
VENV="$BUILD/lerobot_bench_venv"
DATA="$BUILD/lerobot_bench_data"
BATCH=16
BATCHES=$((SAMPLES / BATCH))

[ -x "$BUILD/bench_loader" ] || { echo "build $BUILD/bench_loader first (scripts/setup.sh)" >&2; exit 1; }
[ -x "$BUILD/lerobot_test_venv/bin/python" ] || { echo "no $BUILD/lerobot_test_venv: run the [lerobot] tests once" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import lerobot, sys; sys.exit(lerobot.__version__ != '$LEROBOT_VERSION')" 2>/dev/null; then
  echo "[bench_lerobot] installing lerobot==$LEROBOT_VERSION into $VENV" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir "lerobot==$LEROBOT_VERSION"
fi

rm -rf "$DATA"; mkdir -p "$DATA"
trap 'rm -rf "$DATA"' EXIT
LENGTHS=50,50,50,50,50,50,50,50
"$BUILD/lerobot_test_venv/bin/python" tests/data/write_lerobot.py --out "$DATA/av1" --version v3.0 --images av1 \
  --size 256 --lengths $LENGTHS --episodes-per-video 4 --episodes-per-file 4 >/dev/null 2>&1
"$BUILD/lerobot_test_venv/bin/python" tests/data/write_lerobot.py --out "$DATA/png" --version v3.0 --images png \
  --size 256 --lengths $LENGTHS --episodes-per-file 4 >/dev/null 2>&1

echo "# LeRobot format: pi0-train bench_loader vs LeRobot $LEROBOT_VERSION (Python), one run"
echo
echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start; $("$VENV/bin/python" -c \
  'import torch, av, datasets; print(f"torch {torch.__version__}, av {av.__version__}, datasets {datasets.__version__}")'); \
batch $BATCH, $SAMPLES timed samples per row, 2 cameras 256x256, 50-step action chunk, no augmentation"
echo "pi0-train rows also resize to 224, normalize and tokenize (the full training transform); LeRobot rows return \
decoded float images and the raw chunk"
echo
ROWS="$DATA/rows.md"
{
echo "| dataset | loader | samples | samples/s (wall) | CPU s | samples per CPU-s |"
echo "|---|---|---|---|---|---|"
cpp_rows() {  # label, bench_loader args...: its "no augment" rows as table rows (median rate; CPU over the repeat)
  local label=$1; shift
  "$BUILD/bench_loader" --batches "$BATCHES" --batch-size $BATCH --repeats 1 --image-size 256 --augment no --workers 0,2 "$@" \
    2>/dev/null | awk -F'|' -v l="$label" -v n="$SAMPLES" '$2 ~ /^ no / {
      gsub(/ /, "", $3); printf "| %s | pi0-train bench_loader, %s | %d | %.1f | %.2f | %.1f |\n",
      l, ($3 == 0 ? "main thread" : $3 " worker threads"), n, $4, $7, $8 }'
}
cpp_rows "AV1 (v3.0)" --format lerobot --data "$DATA/av1"
cpp_rows "PNG (v3.0)" --format lerobot --data "$DATA/png"
cpp_rows "HDF5 (LIBERO)" --dir "$DATA/hdf5"
for kind in av1 png; do
  label="AV1 (v3.0)"; [ $kind = png ] && label="PNG (v3.0)"
  "$VENV/bin/python" bench/bench_lerobot_python.py --root "$DATA/$kind" --label "$label" --samples "$SAMPLES" \
    --batch-size $BATCH --workers 2 2>/dev/null
done
} | tee "$ROWS"
# Ratios. Per core: main-thread rows on both sides (no prefetch, so CPU time is exactly the timed samples' work).
# Against training: bench_train's step rate (bench/results/train.json, float32, no checkpointing; target >= 3x).
python3 - "$ROWS" bench/results/train.json <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) == 6 and c[2].isdigit():
        rows[(c[0].split()[0], "pi0" if c[1].startswith("pi0") else "lerobot",
              "main" if "main" in c[1] else "workers")] = (float(c[3]), float(c[5]))
step = next(r["samples_per_s_median"] for r in json.load(open(sys.argv[2]))["rows"]
            if r["precision"] == "float32" and not r["gradient_checkpointing"])
print("\n| dataset | per core: pi0-train / LeRobot (main thread, samples per CPU-s) | wall, 2 workers: pi0-train / "
      f"LeRobot | pi0-train 2 workers / training step ({step:.2f} samples/s) |\n|---|---|---|---|")
for d in ("AV1", "PNG"):
    p, l = rows[(d, "pi0", "main")], rows[(d, "lerobot", "main")]
    pw, lw = rows[(d, "pi0", "workers")], rows[(d, "lerobot", "workers")]
    print(f"| {d} | {p[1] / l[1]:.1f}x | {pw[0] / lw[0]:.1f}x | {pw[0] / step:.0f}x |")
PY
echo
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at end"
