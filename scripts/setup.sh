#!/usr/bin/env bash
# Installs the Debian packages pi0-train needs (idempotent, non-interactive), then configures and builds.
# Usage: scripts/setup.sh [build-dir]      (extra CMake flags through PI0_CMAKE_FLAGS, e.g.
#        PI0_CMAKE_FLAGS="-DCMAKE_PREFIX_PATH=/path/to/libtorch" for a CUDA LibTorch)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"

PACKAGES=(cmake ninja-build g++ pkg-config libtorch-dev libgloo-dev libopenblas0-pthread libyaml-cpp-dev
          libspdlog-dev libhdf5-dev catch2 libsentencepiece-dev sentencepiece nlohmann-json3-dev zlib1g-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# LibTorch falls back to reference BLAS (~20x slower matmuls) unless OpenBLAS is the selected libblas.
if [ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] && command -v update-alternatives >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO update-alternatives --set libblas.so.3-x86_64-linux-gnu \
    /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 >/dev/null 2>&1 || true
fi

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release ${PI0_CMAKE_FLAGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "[setup] built in $BUILD_DIR"
