#!/usr/bin/env bash
# The venv of the LeRobot RTC cross-check (tests/unit/model/test_rtc_lerobot.cpp runs scripts/rtc_lerobot_reference.py
# in it): PyPI's lerobot==0.4.4 without its dependencies, plus a torch.
#   scripts/setup_lerobot_check.sh [python-with-torch]     (venv: $BUILD_DIR/lerobot_venv, BUILD_DIR default build)
# The RTC modules the check runs (lerobot/policies/rtc/{modeling,configuration}_rtc.py, debug_tracker.py and
# lerobot/configs/types.py) import only torch and the standard library, so lerobot's ~25 declared dependencies
# (datasets, diffusers, opencv, wandb, ...) are not installed. torch comes from, in this order:
#   1. the interpreter given as $1 (e.g. .venv-cuda/bin/python): its site-packages join the venv through a .pth file
#      (`venv --system-site-packages` would not see them: it reaches the base interpreter's, not another venv's);
#   2. python3, if it imports torch (same .pth route);
#   3. PyPI's torch wheel (only PyPI is reachable here, so the CUDA build: several GB with its nvidia-* wheels).
# lerobot 0.4.4 declares torch < 2.11; --no-deps skips that pin, and the RTC code uses only long-stable operations.
# Then:  ctest -R RTCProcessor  (or PI0_LEROBOT_PYTHON=<another python with torch and lerobot> to use that one instead).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${BUILD_DIR:-build}"
VENV="$BUILD/lerobot_venv"
LEROBOT_VERSION=0.4.4
TORCH_PYTHON="${1:-}"
if [ -z "$TORCH_PYTHON" ] && python3 -c "import torch" 2>/dev/null; then TORCH_PYTHON=python3; fi

mkdir -p "$BUILD"
rm -rf "$VENV"
if [ -n "$TORCH_PYTHON" ]; then
  "$TORCH_PYTHON" -c "import torch" || { echo "$TORCH_PYTHON does not import torch" >&2; exit 1; }
  "$TORCH_PYTHON" -m venv "$VENV"  # the same Python version, so the torch extension modules load
  torch_site=$("$TORCH_PYTHON" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  venv_site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$torch_site" > "$venv_site/torch_site.pth"
else
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir torch
fi
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "lerobot==$LEROBOT_VERSION"
"$VENV/bin/pip" install -q --disable-pip-version-check numpy  # torch warns at import without it; RTC does not use it
"$VENV/bin/python" scripts/rtc_lerobot_reference.py --check
echo "[setup_lerobot_check] $VENV ready: lerobot $LEROBOT_VERSION, torch from ${TORCH_PYTHON:-PyPI}"
