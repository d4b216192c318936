#!/usr/bin/env bash
# The README's first command: sets up, then runs the main job on the built-in example, end to end:
# example data + norm stats → parameter breakdown → train the tiny pi0.5 on CPU with a validation split (with a stop
# and --resume in the middle) → loss plot with its validation curve → export the best checkpoint by val_loss →
# pi0-infer on a sample observation, then one real-time-chunking request continuing that answer.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
RUN=runs/quickstart
# Only the programs used below (70 of a full build's 133 compiled files): the test binary, the benchmarks and
# pi0-serve are left to scripts/test.sh. Set-up and build take most of the time on a small machine (README).
PI0_BUILD_TARGETS="pi0-make-example-data pi0-norm-stats pi0-train pi0-plot pi0-export pi0-infer" \
  scripts/setup.sh "$BUILD"

step() { echo; echo "==> $*"; }

if ! ls data/generated/example/*.hdf5 >/dev/null 2>&1; then
  step "generating the example LIBERO-layout dataset"
  "$BUILD/pi0-make-example-data" --out data/generated/example --episodes 8 --steps 40
fi
if [ ! -f data/generated/example/norm_stats.json ]; then
  step "computing normalization statistics (state and actions only, no images decoded)"
  "$BUILD/pi0-norm-stats" --config configs/debug.yaml
fi

step "trainable parameters of the full-size pi0.5 LoRA config (counted from shapes, nothing allocated)"
"$BUILD/pi0-train" --config configs/pi05_libero_lora.yaml --print-params

# A validation split: 2 of the 8 episodes held out, 16 of their frames evaluated every 50 steps and at each save
# (a few seconds in all); keep_best keeps the checkpoint with the lowest val_loss for `pi0-export --best`. The
# resume must hold out the same episodes, so both runs take the same settings.
VALIDATION=(--set data.validation_split=0.25 --set train.val_samples=16 --set train.val_interval=50
            --set checkpoint.keep_best=1)

rm -rf "$RUN"
step "the first 2 samples training reads: frames as read and as the model sees them, state, actions, prompt tokens"
"$BUILD/pi0-train" --config configs/debug.yaml --dump-batches 2 "$RUN/samples"
step "training the tiny pi0.5 for 150 steps, validating on held-out episodes"
"$BUILD/pi0-train" --config configs/debug.yaml --set checkpoint.run_dir="$RUN" "${VALIDATION[@]}" \
  --set train.num_steps=150
step "resuming from the newest checkpoint to step 300"
"$BUILD/pi0-train" --config configs/debug.yaml --set checkpoint.run_dir="$RUN" "${VALIDATION[@]}" --resume

step "plotting loss (validation loss over it), validation action error and learning rate"
"$BUILD/pi0-plot" --metrics "$RUN/metrics.jsonl" --out "$RUN/loss.png"

step "exporting the best checkpoint by val_loss as an inference bundle (EMA weights, bf16, openpi's PyTorch layout)"
"$BUILD/pi0-export" --checkpoint "$RUN" --best --out "$RUN/bundle" --dtype bf16

step "running pi0-infer on a sample observation"
"$BUILD/pi0-make-example-data" --observation-out "$RUN/observation.safetensors" --out data/generated/example
"$BUILD/pi0-infer" --bundle "$RUN/bundle" --obs "$RUN/observation.safetensors" --prompt "reach the red blob" \
  --out "$RUN/actions.safetensors"

step "one real-time-chunking request: 3 rows of that answer executed, 2 more execute while this one runs"
"$BUILD/pi0-infer" --bundle "$RUN/bundle" --obs "$RUN/observation.safetensors" --prompt "reach the red blob" \
  --out "$RUN/actions_rtc.safetensors" --prev-actions "$RUN/actions.safetensors" --prev-executed 3 --inference-delay 2
echo
echo "done: run directory $RUN (samples/, config.yaml, metrics.jsonl, loss.png, checkpoints/, bundle/,"
echo "      actions.safetensors, actions_rtc.safetensors)"
