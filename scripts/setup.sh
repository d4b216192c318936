#!/usr/bin/env bash
# Installs the Debian packages pi0-train needs (idempotent, non-interactive), then configures and builds.
# Usage: scripts/setup.sh [build-dir]      (extra CMake flags through PI0_CMAKE_FLAGS, e.g.
#        PI0_CMAKE_FLAGS="-DCMAKE_PREFIX_PATH=/path/to/libtorch" for a CUDA LibTorch)
#
#        scripts/setup.sh --cuda [build-dir]   (default build-cuda) builds against a CUDA LibTorch instead: a venv
#        .venv-cuda with the pinned PyPI wheel torch==$PI0_TORCH_VERSION (default 2.11.0, CUDA 13.0; ~3.5 GB with its
#        nvidia-* wheels). Needs the CUDA toolkit (nvcc, CUDA 13.x to match the wheel) for LibTorch's CMake config.
#        PI0_TORCH_PREFIX=<torch cmake prefix> uses an existing LibTorch instead of the venv.
#        PI0_BUILD_TARGETS="pi0-train pi0-plot ..." builds only those targets (scripts/quickstart.sh: the apps, not the
#        test binary); default: everything (apps, tests, benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA=0
if [ "${1:-}" = "--cuda" ]; then CUDA=1; shift; fi
BUILD_DIR="${1:-$([ $CUDA = 1 ] && echo build-cuda || echo build)}"

PACKAGES=(cmake ninja-build g++ pkg-config libgloo-dev libopenblas0-pthread libyaml-cpp-dev
          libspdlog-dev libhdf5-dev catch2 libcli11-dev libsentencepiece-dev sentencepiece nlohmann-json3-dev zlib1g-dev
          libxxhash-dev  # checkpoint manifests (XXH3)
          libonig-dev    # FAST action tokenizer: the GPT-2 split on Oniguruma, as HF tokenizers
          libboost-dev libmsgpack-cxx-dev python3-venv  # pi0-serve: Beast/Asio, msgpack; its test venv
          clang libclang-rt-dev                          # scripts/fuzz.sh: libFuzzer, ASan, UBSan
          libavformat-dev libavcodec-dev libswscale-dev libavutil-dev libdav1d-dev libpng-dev)  # format: lerobot
[ $CUDA = 1 ] || PACKAGES+=(libtorch-dev)
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

EXTRA=()
if [ $CUDA = 1 ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  if ! command -v nvcc >/dev/null; then
    echo "[setup] --cuda needs the CUDA toolkit (nvcc on PATH or in /usr/local/cuda/bin; CUDA 13.x for torch" \
         "${PI0_TORCH_VERSION:-2.11.0}): LibTorch's CMake config locates CUDA through it" >&2
    exit 2
  fi
  if [ -z "${PI0_TORCH_PREFIX:-}" ]; then
    TORCH_VERSION="${PI0_TORCH_VERSION:-2.11.0}"
    [ -x .venv-cuda/bin/python ] || python3 -m venv .venv-cuda
    if ! .venv-cuda/bin/python -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
      echo "[setup] installing torch==$TORCH_VERSION (CUDA wheel from PyPI) into .venv-cuda"
      .venv-cuda/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
    fi
    PI0_TORCH_PREFIX="$(.venv-cuda/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)')"
  fi
  EXTRA=(-DCMAKE_PREFIX_PATH="$PI0_TORCH_PREFIX")
fi

# Apache Arrow/Parquet C++ for format: lerobot. Debian bookworm has no Arrow package; the pinned PyPI pyarrow wheel
# ships Arrow's C++ headers and libraries (libarrow.so.<SO>, libparquet.so.<SO>), built with the same libstdc++ ABI.
# PI0_PYARROW_VERSION=none builds without it (format: lerobot then fails with one line).
PYARROW_VERSION="${PI0_PYARROW_VERSION:-26.0.1}"
if [ "$PYARROW_VERSION" != none ]; then
  ARROW_VENV="$BUILD_DIR/arrow_venv"
  mkdir -p "$BUILD_DIR"
  if ! "$ARROW_VENV/bin/python" -c "import pyarrow,sys; sys.exit(pyarrow.__version__ != '$PYARROW_VERSION')" 2>/dev/null; then
    echo "[setup] installing pyarrow==$PYARROW_VERSION (Arrow/Parquet C++ for format: lerobot) into $ARROW_VENV"
    rm -rf "$ARROW_VENV"
    python3 -m venv "$ARROW_VENV"
    "$ARROW_VENV/bin/pip" install -q --disable-pip-version-check --no-deps "pyarrow==$PYARROW_VERSION"
  fi
  EXTRA+=(-DPI0_ARROW_ROOT="$(cd "$ARROW_VENV" && pwd)/lib/$("$ARROW_VENV/bin/python" -c 'import sys;print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages/pyarrow")
fi

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
# Show our own configure lines (LibTorch found, CUDA support, NCCL headers); the rest goes to the build folder.
mkdir -p "$BUILD_DIR"
if ! cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release "${EXTRA[@]}" ${PI0_CMAKE_FLAGS:-} \
     > "$BUILD_DIR/configure.log" 2>&1; then
  cat "$BUILD_DIR/configure.log" >&2
  exit 1
fi
grep '^-- pi0:' "$BUILD_DIR/configure.log" | sed 's/^-- /[setup] /'
if [ $CUDA = 1 ] && ! grep -q 'CUDA support: ON' "$BUILD_DIR/configure.log"; then
  echo "[setup] --cuda: the LibTorch at $PI0_TORCH_PREFIX has no CUDA (see $BUILD_DIR/configure.log)" >&2
  exit 1
fi
TARGETS=()
[ -n "${PI0_BUILD_TARGETS:-}" ] && TARGETS=(--target ${PI0_BUILD_TARGETS})
cmake --build "$BUILD_DIR" -j "$(nproc)" "${TARGETS[@]}"
echo "[setup] built in $BUILD_DIR${PI0_BUILD_TARGETS:+ ($PI0_BUILD_TARGETS)}"
