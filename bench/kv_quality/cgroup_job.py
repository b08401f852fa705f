#!/usr/bin/env python3
"""The throughput KV eviction buys (issue 61): one long-prompt batch job through `flexh2o run` in a
fresh memory cgroup (page cache counted), then its answers scored as flexh2o_eval.py scores them.

  cgroup_job.py --model M --tasks-dir T --kv tova:0.1,layerwise=1,pool=9 --max-tokens 32 --out-dir O

T is make_tasks.py's output (tasks.jsonl, answers.jsonl); every request's max_tokens is set to
--max-tokens. Writes O/<tag>.jsonl (results), O/<tag>.metrics.json, O/<tag>.log (the run's report
and --explain) and prints one JSON line: wall seconds, the cgroup's peak, whether it was
OOM-killed, the run's useful tok/s (generated tokens over the job) and the accuracy per task. Runs as root (it makes the cgroup).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "peers"))
import scoring  # noqa: E402
from cgroup import MemoryCgroup  # noqa: E402


def accuracy(model, answers_path, results_path, kv):
    """Per task: "correct/scored", each answer cut at the model's end-of-sequence ids."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    eos = scoring.eos_ids(model)
    answers = {a["id"]: a for a in scoring.read_jsonl(answers_path)}
    results = [{"method": kv, "kept": "", "id": r["id"],
                "text": tok.decode(scoring.until_eos(r["tokens"], eos), skip_special_tokens=True)}
               for r in scoring.read_jsonl(results_path)]
    return {row["task"]: f"{row['correct']}/{row['n']}" for row in scoring.accuracy_rows(results, answers, "flexh2o")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--kv", default="full")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--limit", default=str(2 << 30), help="the cgroup's memory limit in bytes (2 GiB)")
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "..", "build", "engine", "flexh2o"))
    ap.add_argument("--tag", default=None)
    ap.add_argument("extra", nargs="*", help="more `flexh2o run` flags (after --)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    tag = args.tag or f"{args.kv.replace(':', '_').replace(',', '_')}_gen{args.max_tokens}"
    prompts = os.path.join(args.out_dir, f"{tag}.prompts.jsonl")
    with open(prompts, "w") as f:
        for r in scoring.read_jsonl(os.path.join(args.tasks_dir, "tasks.jsonl")):
            f.write(json.dumps(dict(r, max_tokens=args.max_tokens)) + "\n")
    out = os.path.join(args.out_dir, f"{tag}.jsonl")
    metrics = os.path.join(args.out_dir, f"{tag}.metrics.json")
    cmd = [args.bin, "run", "--model", args.model, "--prompts", prompts, "--out", out, "--metrics", metrics,
           "--kv", args.kv, "--temperature", "0", "--explain", *args.extra]
    group = MemoryCgroup(f"flexh2o_kv_{os.getpid()}", int(args.limit))
    try:
        start = time.time()
        with open(os.path.join(args.out_dir, f"{tag}.log"), "w") as log:
            rc = subprocess.run(group.wrap(cmd), stdout=log, stderr=subprocess.STDOUT).returncode
        result = {"tag": tag, "rc": rc, "wall_s": round(time.time() - start, 1),
                  "peak_mib": round(group.peak_bytes() / 2**20, 1), "oom_killed": group.oom_killed()}
    finally:
        group.remove()
    if rc == 0:
        with open(metrics) as f:
            m = json.load(f)
        result["useful_tok_s"] = m["useful_throughput"]
        result["accuracy"] = accuracy(args.model, os.path.join(args.tasks_dir, "answers.jsonl"), out, args.kv)
    print(json.dumps(result))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
