#!/usr/bin/env bash
# Downloads the Debian packages pi0-train builds against (headers, CMake configs, shared libraries and the shared
# libraries those need) and unpacks them into one folder, for a machine that has a compiler, CMake and a LibTorch
# but no package manager or network (the GPU validation machine: scripts/gpu-check.sh). Run it on a Debian bookworm
# machine with network; it needs no root (apt-get download + dpkg -x). Idempotent.
#   scripts/fetch_deps.sh [DIR] [--fixtures]   (default .deps; ignored by git, carried to the GPU machine)
# Then: cmake -DPI0_DEPS_DIR=DIR ...  and at run time LD_LIBRARY_PATH is not needed (RUNPATH), see gpu-check.sh.
# Also downloads (pip download, no install) the wheels of openpi's Python client for the GPU image's Python 3.12
# into DIR/wheels: openpi-client 0.1.2 and websockets (numpy and msgpack are there already); gpu-check.sh unpacks them.
# --fixtures: also copies the part of ../shared/fixtures/openpi that the parity tests evaluate on the GPU into
# .fixtures/openpi (16 MB; with DIR's ~45 MB it stays inside the 64 MiB one device-tool call carries).
set -euo pipefail
cd "$(dirname "$0")/.."
FIXTURES=0; args=()
for a in "$@"; do [ "$a" = --fixtures ] && FIXTURES=1 || args+=("$a"); done
DIR="${args[0]:-.deps}"
mkdir -p "$DIR/debs"
DIR="$(cd "$DIR" && pwd)"

# Headers + CMake configs (-dev) and the shared libraries the build links (pi0_core, the spm shim, tests).
# Not needed with a pip LibTorch: OpenBLAS (the wheel has MKL inside), libtorch-dev. gloo: headers only (the wheel's
# libtorch_cpu has Gloo inside; c10d's ProcessGroupGloo.hpp includes gloo headers).
DEV=(libyaml-cpp-dev libpng-dev libspdlog-dev libfmt-dev nlohmann-json3-dev catch2 libsentencepiece-dev libjpeg62-turbo-dev
     libhdf5-dev libgloo-dev zlib1g-dev libaec-dev libmsgpack-cxx-dev libcli11-dev libxxhash-dev
     libonig-dev)
# Not carried: Boost (pi0-serve's Beast/Asio), ~150 MB of headers, over the 64 MB a GPU-machine call can carry.
# Without it configure leaves pi0-serve out and says so; the server is validated on CPU machines.
RUNTIME=(libyaml-cpp0.7 libpng16-16 libspdlog1.10 libfmt9 libsentencepiece0 libjpeg62-turbo libhdf5-103-1 libsz2 libaec0 libxxhash0
         libonig5)
# Libraries assumed present on any glibc Linux the binaries run on; everything else the runtime set needs is carried.
BASE='^(libc6|libgcc-s1|libstdc\+\+6|zlib1g|gcc-12-base|libcrypt1|debconf|perl-base|libselinux1|libpcre2-8-0|dpkg|tar|install-info|ca-certificates|openssl|libssl-dev)$'

closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
            --no-enhances "${RUNTIME[@]}" 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$BASE" || true)
PKGS=($(printf '%s\n' "${DEV[@]}" $closure | sort -u))
echo "[fetch_deps] ${#PKGS[@]} packages into $DIR"
(cd "$DIR/debs" && for p in "${PKGS[@]}"; do
   ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download -qq "$p" 2>/dev/null || { apt-get update -qq && apt-get download -qq "$p"; }
 done)
for deb in "$DIR"/debs/*.deb; do dpkg -x "$deb" "$DIR"; done
# What the build and the tests never use: the large static archives (Catch2 keeps its small main library), docs, man pages, Fortran/C++ HDF5 bindings.
find "$DIR/usr" \( -name 'libhdf5*.a' -o -name 'libsentencepiece*.a' -o -name 'libpng*.a' -o -path '*/share/doc/*' -o -path '*/share/man/*' -o -name '*fortran*' \) \
  -exec rm -rf {} + 2>/dev/null || true
rm -rf "$DIR/debs"
PIP=(python3 -m pip); [ -x .venv-cuda/bin/pip ] && PIP=(.venv-cuda/bin/pip)
mkdir -p "$DIR/wheels"
"${PIP[@]}" download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$DIR/wheels" \
  openpi-client==0.1.2 websockets typing_extensions \
  || echo "[fetch_deps] pip download of the openpi-client wheels failed: gpu-check then skips the client request" >&2
if [ $FIXTURES = 1 ]; then
  SRC=../shared/fixtures/openpi
  [ -d "$SRC" ] || { echo "[fetch_deps] --fixtures: no $SRC" >&2; exit 2; }
  rm -rf .fixtures/openpi; mkdir -p .fixtures/openpi
  cp "$SRC"/README.md "$SRC"/tokenizer_* .fixtures/openpi/
  for m in pi0 pi05; do
    mkdir -p .fixtures/openpi/$m
    cp "$SRC"/$m/{config.json,weights.safetensors,inputs.safetensors,outputs.safetensors} .fixtures/openpi/$m/
  done
  echo "[fetch_deps] fixtures: $(du -sh .fixtures | cut -f1) in .fixtures/openpi (carry .fixtures with $DIR)"
fi
echo "[fetch_deps] done: $(du -sh "$DIR" | cut -f1) in $DIR (use -DPI0_DEPS_DIR=$DIR)"
