#!/usr/bin/env bash
# Builds moet and runs every test suite: C++ (GoogleTest through CTest) and Python (pytest).
# Usage: bash tools/test.sh [build-dir]   (installs missing dependencies first)
# CUDA targets compile when nvcc exists; GPU tests skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
bash tools/install_deps.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD" -j "$(nproc)"
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)"
MOET_BIN="$PWD/$BUILD/moet" python3 -m pytest -q tests/python
