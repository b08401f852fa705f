#!/usr/bin/env bash
# Fails when a source file includes a header of a layer above its own (docs/architecture.md
# draws the layers). The CMake link lines already fail on most such includes; this also catches
# the ones that use only a header (an inline function, a struct), which link anyway.
# Usage: scripts/check_layers.sh [repository root]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# Each layer (a directory) and the directories its files may include besides its own.
declare -A may_use=(
  [kernels]=""
  [offload]="kernels"
  [policy]="kernels offload"
  [engine/io]=""
  [engine/tokenizer]="engine/io offload kernels"
  [engine/chat]=""
  [engine/grammar]="engine/io"
  [engine/model]="kernels offload policy"
  [engine/families]="engine/model engine/io kernels offload policy"
  [engine/loaders]="engine/families engine/model engine/tokenizer engine/io kernels offload policy"
  [engine/runtime]="engine/model kernels offload policy"
  [engine/serving]="engine/runtime engine/loaders engine/families engine/model engine/tokenizer engine/chat engine/grammar
                engine/io kernels offload policy"
  [engine/distributed]="engine/serving engine/runtime engine/loaders engine/families engine/model engine/tokenizer
                        engine/chat engine/grammar engine/io kernels offload policy"
  [engine/cli]="engine/distributed engine/serving engine/runtime engine/loaders engine/families engine/model
                engine/tokenizer engine/chat engine/grammar engine/io kernels offload policy"
)

# The layer a repository path belongs to: the longest key of may_use it starts with.
layer_of() {
  local path=$1 best="" key
  for key in "${!may_use[@]}"; do
    if [[ $path == "$key"/* && ${#key} -gt ${#best} ]]; then best=$key; fi
  done
  printf '%s' "$best"
}

failures=0
for layer in "${!may_use[@]}"; do
  [[ -d $layer ]] || { echo "check_layers: no directory $layer (update scripts/check_layers.sh)"; failures=1; continue; }
  while IFS=: read -r file line target; do
    [[ $target == */* ]] || continue  # a file beside the includer
    # Only files directly in this layer (engine/ keys are deeper than kernels/ etc.).
    [[ $(layer_of "$file") == "$layer" ]] || continue
    to=$(layer_of "$target")
    if [[ -z $to ]]; then
      echo "$file:$line: includes \"$target\", outside every layer"
      failures=1
    elif [[ $to != "$layer" && " ${may_use[$layer]//$'\n'/ } " != *" $to "* ]]; then
      echo "$file:$line: $layer may not include \"$target\" ($to is not below it)"
      failures=1
    fi
  done < <(grep -rnoE --include='*.cc' --include='*.h' --include='*.cu' --include='*.cuh' --include='*.inc' \
             '^#include "[^"]+"' "$layer" | sed -E 's/:#include "([^"]+)"$/:\1/')
done
if ((failures)); then
  echo "check_layers: includes go up; move the code down or the include up (docs/architecture.md)"
  exit 1
fi
echo "check_layers: every include points down"
