#!/usr/bin/env bash
# Newcomer command 1: install dependencies, build, and run the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXH2O_WERROR=ON
cmake --build build -j"$(nproc)"
./build/engine/flexh2o
