#!/usr/bin/env bash
# Fails when a source file includes a header of a layer above its own (docs/architecture.md
# draws the layers). The CMake link lines already fail on most such includes; this also catches
# the ones that use only a header (an inline function, a struct), which link anyway.
# Usage: scripts/check_layers.sh [--print: the table of what each layer may include]
set -euo pipefail
cd "$(dirname "$0")/.."

# Each layer (a directory) and the directories its files may include besides its own: the
# libraries its CMake link line names (PUBLIC, PRIVATE or INTERFACE), and theirs in turn. The
# link lines are the one table (docs/architecture.md draws it).
declare -A dir_of=(
  [flexh2o_kernels]=kernels [flexh2o_offload]=offload [flexh2o_policy]=policy [flexh2o_io]=engine/io
  [flexh2o_tokenizer]=engine/tokenizer [flexh2o_chat]=engine/chat [flexh2o_grammar]=engine/grammar
  [flexh2o_model]=engine/model [flexh2o_families]=engine/families [flexh2o_loaders]=engine/loaders
  [flexh2o_safetensors]=engine/loaders [flexh2o_runtime]=engine/runtime [flexh2o_serving]=engine/serving
  [flexh2o_distributed]=engine/distributed [flexh2o_mpi]=engine/distributed [flexh2o_job]=engine/job
  [flexh2o]=engine/cli [_flexh2o]=python
)
declare -A links=()  # layer -> the layers its libraries link (directly)
for lib in "${!dir_of[@]}"; do
  layer=${dir_of[$lib]}
  # The target's target_link_libraries(...) calls, joined over their lines.
  linked=$(tr '\n' ' ' <"$layer/CMakeLists.txt" | grep -oE "target_link_libraries\($lib [^)]*\)" |
           grep -oE 'flexh2o_[a-z]+' | sort -u || true)
  for l in $linked; do
    to=${dir_of[$l]:-}
    [[ -n $to && $to != "$layer" ]] && links[$layer]+=" $to"
  done
  links[$layer]+=""
done
declare -A may_use=()
for layer in "${!links[@]}"; do  # everything reachable over the link lines
  seen=" " todo=${links[$layer]}
  while [[ -n ${todo// /} ]]; do
    read -r next todo <<<"$todo"
    [[ $seen == *" $next "* ]] && continue
    seen+="$next "
    todo+=" ${links[$next]:-}"
  done
  may_use[$layer]=$seen
done
if [[ ${1:-} == --print ]]; then
  for layer in $(printf '%s\n' "${!may_use[@]}" | sort); do echo "$layer:${may_use[$layer]}"; done
  exit 0
fi

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
  [[ -d $layer ]] || { echo "check_layers: no directory $layer (update dir_of in scripts/check_layers.sh)"; failures=1; continue; }
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
