#!/usr/bin/env bash
# Newcomer command 2: the code that parses untrusted files, does raw disk I/O or orders
# asynchronous copies (the scheduler), under
# AddressSanitizer + UBSan; then the whole suite (unit + e2e; gpu tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLEXH2O_SANITIZE=ON -DFLEXH2O_CUDA=OFF -DFLEXH2O_PYTHON=OFF \
  -DFLEXH2O_BENCH=OFF >/dev/null
sanitized=(test_safetensors test_gguf test_tokenizer test_loaders test_offload test_scheduler test_step_scheduler test_kv_eviction test_serving test_chat_template test_grammar)
cmake --build build-asan -j"$jobs" --target "${sanitized[@]}"
for t in "${sanitized[@]}"; do
  echo "== $t (AddressSanitizer + UBSan)"
  ./build-asan/tests/"$t" --gtest_brief=1
done

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXH2O_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -L 'unit|e2e|gpu'

# The numeric tests again under other OpenBLAS kernels. OpenBLAS picks its kernels by CPU
# model at run time, so float results differ in the last bits between machines: a tolerance
# that holds only on this machine's kernel fails here rather than on someone else's. Haswell,
# plus one more that differs from this machine's own (cores older than it, so they run here).
own_core=$(OPENBLAS_VERBOSE=2 ./build/tests/test_kernels --gtest_list_tests 2>&1 | sed -n 's/^Core: //p' | head -n 1)
other_core=Sandybridge
[ "$own_core" = Sandybridge ] && other_core=Nehalem
# The second run also holds oneDNN to AVX2, so that on a machine with AVX-512 BF16 both the
# native and the emulated bf16 paths and both oneDNN kernel families are tested.
echo "== unit tests with OPENBLAS_CORETYPE=Haswell"
OPENBLAS_CORETYPE=Haswell ctest --test-dir build --output-on-failure -j"$jobs" -L unit
echo "== unit tests with OPENBLAS_CORETYPE=$other_core ONEDNN_MAX_CPU_ISA=AVX2 (this machine's own: ${own_core:-unknown})"
OPENBLAS_CORETYPE=$other_core ONEDNN_MAX_CPU_ISA=AVX2 ctest --test-dir build --output-on-failure -j"$jobs" -L unit
