#!/usr/bin/env bash
# Builds moet and serves the bundled default model (models/tiny, a small DeepSeek-V3-architecture
# MoE trained by tools/train) over the OpenAI-compatible API on http://127.0.0.1:8000/v1, on the
# CPU backend. Extra arguments go to `moet serve` (e.g. --port 9000 --api-key KEY).
# Usage: bash tools/run.sh [serve flags...]   (installs missing dependencies first)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)" --target moet
exec ./build/moet serve models/tiny "$@"
