#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time (default 60 s each; FUZZ_SECONDS=N to change)
# on seeds from the repository, in build-fuzz (clang, ASan + UBSan). Exits non-zero on the
# first crash, sanitizer report or abort; the input that did it is left in build-fuzz/crashes.
# Prints each target's run count.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-60}"
jobs="$(nproc)"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DFLEXH2O_FUZZ=ON -DFLEXH2O_CUDA=OFF -DFLEXH2O_BENCH=OFF -DFLEXH2O_PYTHON=OFF >/dev/null
targets=(fuzz_safetensors fuzz_gguf fuzz_jsonl fuzz_openai_batch fuzz_configs fuzz_chat_template fuzz_grammar)
cmake --build build-fuzz -j"$jobs" --target "${targets[@]}"

# Seeds: the repository's own files of each kind (work dirs get what the fuzzer adds).
seeds() {
  case "$1" in
    fuzz_safetensors) echo tests/fuzz/corpus ;;
    fuzz_gguf) echo tests/fuzz/corpus-gguf ;;
    fuzz_jsonl) echo tests/fuzz/corpus-jsonl ;;
    fuzz_openai_batch) echo tests/fuzz/corpus-openai ;;
    fuzz_chat_template) echo tests/data/chat_templates ;;
    fuzz_grammar) echo tests/fuzz/corpus-grammar ;;
    fuzz_configs)
      local d=build-fuzz/seeds-configs
      mkdir -p "$d"
      cp configs/models/*.yaml configs/hardware/*.yaml "$d"/
      for c in configs/policies/flexgen/*.yaml; do cp "$c" "$d/policy-$(basename "$c")"; done
      for c in tests/data/hf/*/config.json; do cp "$c" "$d/$(basename "$(dirname "$c")").json"; done
      echo "$d" ;;
  esac
}

mkdir -p build-fuzz/crashes
for t in "${targets[@]}"; do
  work="build-fuzz/work-$t"
  mkdir -p "$work"
  echo "== $t for ${seconds}s"
  # -rss_limit_mb: a config that makes the reader allocate without bound is a finding too.
  # LeakSanitizer needs ptrace, which containers often deny: FUZZ_DETECT_LEAKS=1 to turn it on.
  ./build-fuzz/tests/fuzz/"$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
    -detect_leaks="${FUZZ_DETECT_LEAKS:-0}" \
    -artifact_prefix=build-fuzz/crashes/"$t"- "$work" "$(seeds "$t")" 2>&1 |
    grep -E '^(stat::number_of_executed_units|==[0-9]+==|SUMMARY|Done)|ERROR|deadly' || true
  # libFuzzer's exit status is lost in the pipe: an artifact means it found something.
  if compgen -G "build-fuzz/crashes/$t-*" >/dev/null; then
    echo "$t: found a failing input: $(ls build-fuzz/crashes/"$t"-*)" >&2
    exit 1
  fi
done
