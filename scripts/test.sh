#!/usr/bin/env bash
# Newcomer command 2: the code that parses untrusted files, does raw disk I/O or orders
# asynchronous copies (the scheduler), under
# AddressSanitizer + UBSan; then the whole suite (unit + e2e; gpu tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLEXH2O_SANITIZE=ON -DFLEXH2O_CUDA=OFF \
  -DFLEXH2O_BENCH=OFF >/dev/null
sanitized=(test_safetensors test_tokenizer test_loaders test_offload test_scheduler test_kv_eviction)
cmake --build build-asan -j"$jobs" --target "${sanitized[@]}"
for t in "${sanitized[@]}"; do
  echo "== $t (AddressSanitizer + UBSan)"
  ./build-asan/tests/"$t" --gtest_brief=1
done

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXH2O_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -L 'unit|e2e|gpu'
