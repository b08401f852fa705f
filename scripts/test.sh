#!/usr/bin/env bash
# Newcomer command 2: run the test suite (unit + e2e; gpu tests skip without a GPU),
# then the file parsers' tests again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXH2O_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -L 'unit|e2e|gpu'

# Everything that parses untrusted files, rebuilt with sanitizers.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLEXH2O_SANITIZE=ON -DFLEXH2O_CUDA=OFF \
  -DFLEXH2O_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs" --target test_safetensors test_tokenizer test_loaders
ctest --test-dir build-asan --output-on-failure -j"$jobs" -L parsers
