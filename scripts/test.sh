#!/usr/bin/env bash
# Sets up (scripts/setup.sh), builds and runs the whole test suite through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
scripts/setup.sh "$BUILD_DIR"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 900
