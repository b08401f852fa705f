#!/usr/bin/env bash
# Make the Python venv of the long-context peer harness (issue 61): NVIDIA's kvpress with the
# torch and transformers it pins (transformers < 5.3), plus what make_smollm2.sh's conversion
# needs (gguf, safetensors, accelerate). CPU use only; PyPI's default torch wheel is fine.
#
# usage: bench/kv_quality/setup_venv.sh [VENV_DIR]      (default: /work/venvs/kvq)
# environment:
#   PYTHON         interpreter that makes the venv     (default: python3, >= 3.10)
#   KVPRESS_SPEC   the kvpress requirement            (default: kvpress==0.5.5)
#
# Then make the model (transformers 5.x in this venv, so it serves as TF5_PYTHON):
#   TF5_PYTHON=/work/venvs/kvq/bin/python scripts/models/make_smollm2.sh   (makes smollm2-135m-v5;
#   it then asks for TF4_PYTHON for -v4, which this harness does not need)
set -euo pipefail

VENV="${1:-/work/venvs/kvq}"
PYTHON="${PYTHON:-python3}"
KVPRESS_SPEC="${KVPRESS_SPEC:-kvpress==0.5.5}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$KVPRESS_SPEC" gguf safetensors accelerate sentencepiece
"$VENV/bin/python" - <<'EOF'
import kvpress, torch, transformers
from importlib.metadata import version
print(f"kvpress {version('kvpress')}, "
      f"torch {torch.__version__}, transformers {transformers.__version__}")
EOF
