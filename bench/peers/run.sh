#!/usr/bin/env bash
# Real peers side by side (bench/peers/README.md): flexh2o, PyTorch eager fp32/bf16 and
# HF Accelerate with disk offload on one checkpoint, each in the same memory cgroup.
# Needs root (memory cgroup, drop_caches). Options: python3 bench/peers/peers.py --help
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PYTHON:-python3}" "$here/peers.py" "$@"
