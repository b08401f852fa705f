#!/usr/bin/env bash
# Installs flexh2o's build and test dependencies from Debian 12 packages.
# The CUDA toolkit is optional: when nvcc is on PATH the CUDA backend is built too.
set -euo pipefail
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtbb-dev            # oneTBB: CPU parallelism
  libdnnl-dev           # oneDNN: CPU matmul (f32, bf16, int8)
  ocl-icd-opencl-dev    # OpenCL headers + loader: Debian's dnnl-config.cmake requires them (libdnnl-dev only recommends it)
  libopenblas-dev       # OpenBLAS: attention's small products
  liburing-dev          # io_uring: the disk tier
  libfmt-dev            # text formatting
  libyaml-cpp-dev       # model/hardware/run configs
  nlohmann-json3-dev    # safetensors headers, config.json, JSONL, metrics
  libpcre2-dev          # tokenizer regexes (Unicode classes, lookahead)
  libutf8proc-dev       # tokenizer Unicode normalization (NFC, NFKC, ...)
  libglpk-dev           # the planner's LP
  libcli11-dev          # the command line
  libopenmpi-dev openmpi-bin   # runs over several ranks/machines (mpirun, srun); optional (FLEXH2O_MPI)
  libgtest-dev libgmock-dev libbenchmark-dev   # tests and micro-benchmarks
  python3-dev pybind11-dev python3-pytest      # the Python API (python/) and its tests
  clang libclang-rt-14-dev                     # libFuzzer target (optional build)
  fio                                          # disk benchmark reference
  gnuplot-nox                                  # flexh2o bench's chart
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
