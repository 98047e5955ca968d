#!/usr/bin/env bash
# Builds moet and runs the bundled default model (models/tiny, a small DeepSeek-V3-architecture
# MoE trained by tools/train) on a prompt, on the CPU backend.
# Usage: bash tools/run.sh ["prompt text"]   (installs missing dependencies first)
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT=${1:-"def fibonacci(n):"}
bash tools/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j "$(nproc)" --target moet
exec ./build/moet generate --model models/tiny --prompt "$PROMPT" --max-tokens 96
