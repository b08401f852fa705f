#!/usr/bin/env bash
# The project's GPU check: correctness first, then the figures, in one call of at most ~9 minutes
# on a lent H100/H200, ending with one table ($OUT/table.md, printed last). Every step is bounded
# (a step past the deadline is skipped), so an overrun loses only the last rows.
#
# Prepare on a CPU machine with nvcc (the recipe of ../shared/tools/gpu-check/README.md, plus
# this folder's two files):
#   cmake --build build --target bundle
#   d=.gpucheck; rm -rf $d; mkdir $d; cp ../shared/tools/gpu-check/* bench/gpu/check.sh bench/gpu/check_table.py $d/
#   cp build/flexh2o-bundle.tar.gz $d/; cp -r tests/data/hf $d/hf; bash $d/make_flexgen.sh $d
# On the device (the `run` tool: carry .gpucheck):  BUDGET=520 OUT=$OUT bash .gpucheck/check.sh
cd "$(dirname "$0")" || exit 1
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; L=$OUT/check.log; S=$OUT/steps.tsv; : >"$S"
W=$(mktemp -d); START=$(date +%s); DEADLINE=$((START + ${BUDGET:-520}))
say() { echo "=== $* [$(( $(date +%s) - START ))s]" | tee -a "$L"; }
# step NAME SECONDS CMD...: runs CMD (output to $W/NAME.txt and the log) within SECONDS and the deadline.
step() {
  local name=$1 t=$2; shift 2
  local left=$((DEADLINE - $(date +%s)))
  if (( left < 10 )); then say "SKIP (time) $name"; printf '%s\tskipped\t0\n' "$name" >>"$S"; return; fi
  (( t > left )) && t=$left
  say "$name: $*"
  local t0; t0=$(date +%s)
  timeout "$t" "$@" >"$W/$name.txt" 2>&1; local rc=$?
  cat "$W/$name.txt" >>"$L"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >>"$S"
  echo "rc=$rc" | tee -a "$L"
}
[ -d bundle ] || tar xzf flexh2o-bundle.tar.gz || exit 1
B=$PWD/bundle/bin; F=$B/flexh2o; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >"$W/gpu.txt" 2>&1
cat "$W/gpu.txt" >>"$L"

# ---- correctness: every op against the CPU, the HF fixtures against transformers, CUDA = CPU on
# whole jobs (OpenAI batch, refill, shared prefixes), CUDA graphs on = off.
step backend_ops 90 "$B/test_backend_ops" --gtest_brief=1
step hf 110 python3 hf_check.py "$F" hf "$OUT/hf.json"
python3 make_requests.py hf/llama3-v5 "$W" >>"$L" 2>&1
python3 - hf/llama3-v5 "$W/prefix.jsonl" <<'PY' >>"$L" 2>&1
import json, sys  # 24 requests in 4 families: a 48-token shared prefix and a tail of their own
e = json.load(open(sys.argv[1] + "/expected.json")); toks = [t for p in e["prompts"] for t in p]
with open(sys.argv[2], "w") as f:
    for i in range(24):
        fam = (toks * 8)[(i % 4) * 11:][:48]
        f.write(json.dumps({"id": i, "tokens": fam + toks[i % len(toks):][:3 + i % 5], "max_tokens": 4 + i % 9}) + "\n")
PY
for be in cuda cpu; do
  step "batch_$be" 30 "$F" run --quiet --backend $be --prompts "$W/batch.jsonl" --out "$W/batch_$be.jsonl" --gpu-batch-size 8
  step "refill_$be" 30 "$F" run --quiet --backend $be --compute-dtype f32 --model hf/llama3-v5 --prompts "$W/refill.jsonl" \
    --out "$W/refill_$be.jsonl" --ignore-eos --gpu-batch-size 6
  step "prefix_$be" 30 "$F" run --quiet --backend $be --compute-dtype f32 --model hf/llama3-v5 --prompts "$W/prefix.jsonl" \
    --out "$W/prefix_$be.jsonl" --ignore-eos --gpu-batch-size 6
done
step prefix_copy 30 "$F" run --quiet --backend cuda --compute-dtype f32 --model hf/llama3-v5 --prompts "$W/prefix.jsonl" \
  --out "$W/prefix_copy.jsonl" --ignore-eos --gpu-batch-size 6 --prefix-sharing copy
step cmp_batch 10 python3 cmp_results.py "$W/batch_cpu.jsonl" "$W/batch_cuda.jsonl" batch
step cmp_refill 10 python3 cmp_results.py "$W/refill_cpu.jsonl" "$W/refill_cuda.jsonl" plain
step cmp_prefix 10 python3 cmp_results.py "$W/prefix_cpu.jsonl" "$W/prefix_cuda.jsonl" plain
step cmp_prefix_copy 10 python3 cmp_results.py "$W/prefix_copy.jsonl" "$W/prefix_cuda.jsonl" plain
R="$F run --quiet --backend cuda --model opt-1.3b --dummy --prompt-len 512"
for g in off on; do
  step "graphs_fixed_$g" 40 $R --gen-len 64 --batch 16 --gpu-batch-size 16 --batching fixed --cuda-graphs $g \
    --out "$W/graphs_fixed_$g.jsonl"
  step "graphs_cont_$g" 40 "$F" run --quiet --backend cuda --compute-dtype f32 --model hf/llama3-v5 --prompts "$W/refill.jsonl" \
    --out "$W/graphs_cont_$g.jsonl" --ignore-eos --gpu-batch-size 6 --cuda-graphs $g
done
step cmp_graphs_fixed 10 python3 cmp_results.py "$W/graphs_fixed_off.jsonl" "$W/graphs_fixed_on.jsonl" plain
step cmp_graphs_cont 10 python3 cmp_results.py "$W/graphs_cont_off.jsonl" "$W/graphs_cont_on.jsonl" plain

# ---- figures. OPT-1.3B, random f16 weights, 512 + 32, all on the GPU, beside FlexGen 0.1.8 on the
# same card (FlexGen's throughputs: generated tokens over prefill + decode).
FG="env PYTHONPATH=$PWD python3 -m flexgen.flex_opt --path _DUMMY_ --offload-dir $W/fgoff --prompt-len 512 --gen-len 32"
mkdir -p "$W/fgoff" "$W/off"
P="$F run --quiet --backend cuda --model opt-1.3b --dummy --prompt-len 512 --offload-dir $W/off"; R="$P --gen-len 32"
for b in 256 64; do
  for g in off on; do
    step "opt13_b${b}_fixed_$g" 45 $R --batch $b --gpu-batch-size $b --batching fixed --cuda-graphs $g \
      --metrics "$W/opt13_b${b}_fixed_$g.json"
  done
  [ -d flexgen ] && step "flexgen_opt13_b$b" 60 $FG --model facebook/opt-1.3b --percent 100 0 100 0 100 0 \
    --gpu-batch-size $b --log-file "$W/flexgen_opt13_b$b.log"
done
step opt13_b256_cont_on 45 $R --batch 256 --gpu-batch-size 256 --cuda-graphs on --metrics "$W/opt13_b256_cont_on.json"
step opt13_b256_plan 45 $R --batch 256 --explain --metrics "$W/opt13_b256_plan.json"

# Decode attention's KV GB/s (against the card's HBM and its own copy), OPT-1.3B's heads and a GQA shape.
step attn_opt 40 "$B/bench_attention" 5 512,4096 f16 --backend cuda --seqs 256 --heads 32 --kv-heads 32 --head-dim 64
step attn_gqa 40 "$B/bench_attention" 5 512,4096 f16 --backend cuda --seqs 64 --heads 32 --kv-heads 8 --head-dim 128

# Prefill attention on tensor cores: ncu's time of the kernel for one layer of 64 x 512 (bf16).
step ncu_prefill 60 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:prefill_mma_kernel --launch-count 3 \
  --metrics gpu__time_duration.sum $P --gen-len 2 --batch 64 --gpu-batch-size 64 --batching fixed --compute-dtype bf16

# Offloaded: OPT-6.7B, 30% of the weights on the GPU, 70% in CPU memory, KV on the CPU, 32 x 2.
step opt67_30_70 75 "$F" run --quiet --backend cuda --model opt-6.7b --dummy --batching fixed --prompt-len 512 --gen-len 32 \
  --batch 64 --gpu-batch-size 32 --num-gpu-batches 2 --percent 30 70 0 100 100 0 --offload-dir "$W/off" \
  --metrics "$W/opt67_30_70.json"
[ -d flexgen ] && step flexgen_opt67_30_70 90 $FG --model facebook/opt-6.7b --percent 30 70 0 100 100 0 \
  --gpu-batch-size 32 --num-gpu-batches 2 --log-file "$W/flexgen_opt67_30_70.log"

say done
python3 check_table.py "$W" "$S" >"$OUT/table.md" 2>>"$L"
cat "$OUT/table.md"
