#!/usr/bin/env bash
# flexh2o run over MPI ranks on this machine: throughput of one process vs 2 data-parallel
# ranks vs a 2-stage pipeline, runs interleaved, each repeated; and the pipeline's bubble share
# read from its trace (time on the "pipeline" track, where a stage waits for hidden states or
# tokens, over ranks x wall time of the run).
# Usage: bench/bench_mpi.sh [build dir] [model] [prompts] [gen_len] [reps]
set -euo pipefail
build=${1:-build}
model=${2:-opt-125m}
prompts=${3:-32}
gen=${4:-32}
reps=${5:-3}
bin=$(realpath "$build/engine/flexh2o")
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/in.jsonl" "$prompts" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": i, "tokens": [2] + [100 + (37 * i + t) % 5000 for t in range(16)]}) + "\n")
EOF
# One fixed policy for every form (blocks of 4 prompts, all in memory): the ranks differ only
# in how the job is split, not in what the planner picks for each.
job=(run --model "$model" --dummy --prompts "$work/in.jsonl" --gen-len "$gen" --gpu-batch-size 4)
echo "model $model (dummy weights), $prompts prompts of 17 tokens, gen_len $gen, blocks of 4; $(nproc) cores; $reps reps"
for r in $(seq 1 "$reps"); do
  "$bin" "${job[@]}" --out "$work/one-$r.jsonl" --metrics "$work/one-$r.json" 2>/dev/null
  "${mpirun[@]}" "$bin" "${job[@]}" --out "$work/dp-$r.jsonl" --metrics "$work/dp-$r.json" 2>/dev/null
  "${mpirun[@]}" "$bin" "${job[@]}" --pipeline 2 --out "$work/pp-$r.jsonl" --metrics "$work/pp-$r.json" \
    --trace "$work/pp-$r.trace.json" 2>/dev/null
  # Lines are written as requests (pipeline: blocks) finish: the same lines, maybe in another order.
  cmp -s <(sort "$work/one-$r.jsonl") <(sort "$work/dp-$r.jsonl") || { echo "data parallel output differs"; exit 1; }
  cmp -s <(sort "$work/one-$r.jsonl") <(sort "$work/pp-$r.jsonl") || { echo "pipeline output differs"; exit 1; }
done

python3 - "$work" "$reps" <<'EOF'
import json, statistics, sys
work, reps = sys.argv[1], int(sys.argv[2])
def tput(form):
    return [json.load(open(f"{work}/{form}-{r}.json"))["total_throughput"] for r in range(1, reps + 1)]
def bubble(r):
    events = json.load(open(f"{work}/pp-{r}.trace.json"))["traceEvents"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    pids = {e["pid"] for e in spans}
    wall = max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)
    waited = sum(e["dur"] for e in spans if tracks[(e["pid"], e["tid"])] == "pipeline")
    return waited / (len(pids) * wall)
one, dp, pp = tput("one"), tput("dp"), tput("pp")
print("| form | total tok/s min | median | max | median vs 1 process |")
print("|---|---|---|---|---|")
for name, v in (("1 process", one), ("2 ranks, data parallel", dp), ("2 ranks, pipeline (2 micro-batches)", pp)):
    print(f"| {name} | {min(v):.1f} | {statistics.median(v):.1f} | {max(v):.1f} | {statistics.median(v) / statistics.median(one):.2f} |")
b = [bubble(r) for r in range(1, reps + 1)]
m = [json.load(open(f"{work}/pp-{r}.json"))["bubble_share"] for r in range(1, reps + 1)]
print(f"pipeline bubble share from the trace: min {100 * min(b):.1f}%, median {100 * statistics.median(b):.1f}% "
      f"(the run's own report: median {100 * statistics.median(m):.1f}%)")
EOF
