#!/usr/bin/env python3
"""flexh2o's KV policies on make_tasks.py's prompts (issue 61's peer harness).

For each policy and kept fraction:
  question tasks  `flexh2o run --prompts --kv POLICY:KEPT` (greedy, fp32 compute and cache);
                  the generated tokens are decoded with the model's HF tokenizer and scored with
                  scoring.is_correct, as kvpress_eval.py does. Eviction runs at prefill and decode.
  fidelity        `flexh2o eval --text fidelity_<L>.txt --prefill L --kv full,POLICY:KEPT,...`:
                  the first L tokens of each text are the prompt, the rest teacher-forced.

A policy may carry the engine's spec keys joined by "+": `tova+layerwise=1+decode=0` runs
`--kv tova:KEPT,layerwise=1,decode=0` (docs/kv-eviction.md) and is named so in the CSV.

Writes OUT_DIR/flexh2o_<policy>_<kept>.jsonl (the engine's outputs; reruns resume them),
OUT_DIR/flexh2o_fidelity_<L>.csv and OUT_DIR/flexh2o.csv (scoring.CSV_COLUMNS). With
--compare KVPRESS_GENERATIONS it prints how many full-cache answers equal transformers'.

usage: flexh2o_eval.py --model MODEL_DIR --tasks-dir TASKS_DIR --out-dir OUT_DIR
         [--policies full,local,...] [--kept 0.1,0.25] [--tasks passkey,multikey] [--lengths 1000,2000]
         [--limit N] [--flexh2o build/engine/flexh2o] [--compare OUT_DIR/kvpress_generations.jsonl]
         [--score-only]
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scoring  # noqa: E402

ALL_POLICIES = "full,local,streaming,h2o,tova,scissorhands,pyramid,snapkv,flex"
# fp32 everywhere, so the full cache's greedy answers can equal transformers' fp32 ones.
FP32 = ["--compute-dtype", "f32", "--cache-dtype", "f32"]


def select(records, tasks, lengths, limit):
    per_cell = defaultdict(int)
    out = []
    for r in records:
        key = (r.get("task", "fidelity"), r["length"])
        if key[0] in tasks and key[1] in lengths and per_cell[key] < limit:
            per_cell[key] += 1
            out.append(r)
    return out


def kv_spec(policy, kept):
    """`tova+layerwise=1+decode=0`, 0.1 -> `tova:0.1,layerwise=1,decode=0`."""
    if policy == "full":
        return "full"
    name, *keys = policy.split("+")
    return ",".join([f"{name}:{kept}"] + keys)


def run_policy(args, prompts_path, policy, kept, gen_len):
    out = os.path.join(args.out_dir, f"flexh2o_{policy}_{kept}.jsonl")
    cmd = [args.flexh2o, "run", "--model", args.model, "--prompts", prompts_path, "--out", out,
           "--kv", kv_spec(policy, kept), "--gen-len", str(gen_len), "--temperature", "0", "--quiet"] + FP32
    if args.score_only:
        return scoring.read_jsonl(out) if os.path.exists(out) else []
    if os.path.exists(out):
        cmd.append("--resume")
    print(" ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)
    print(f"{kv_spec(policy, kept)}: {time.time() - t0:.0f} s", flush=True)
    return scoring.read_jsonl(out)


def run_questions(args, tok, policies, kepts, eos_ids):
    answers = {a["id"]: a for a in scoring.read_jsonl(os.path.join(args.tasks_dir, "answers.jsonl"))}
    prompts = [p for p in scoring.read_jsonl(os.path.join(args.tasks_dir, "tasks.jsonl"))
               if answers[p["id"]]["task"] in args.tasks.split(",")]
    prompts = select([dict(p, **answers[p["id"]]) for p in prompts], args.tasks.split(","),
                     [int(x) for x in args.lengths.split(",")], args.limit)
    if not prompts:
        return [], {}
    # The engine refuses fields other than id, tokens, max_tokens.
    sel = os.path.join(args.out_dir, "prompts_selected.jsonl")
    with open(sel, "w") as f:
        for p in prompts:
            f.write(json.dumps({"id": p["id"], "tokens": p["tokens"], "max_tokens": p["max_tokens"]}) + "\n")
    gen_len = max(p["max_tokens"] for p in prompts)
    ids = {p["id"] for p in prompts}
    results, full_tokens = [], {}
    for policy in policies:
        for kept in ([1.0] if policy == "full" else kepts):
            for r in run_policy(args, sel, policy, kept, gen_len):
                if r["id"] not in ids:
                    continue
                toks = scoring.until_eos(r["tokens"], eos_ids)
                results.append({"method": policy, "kept": kept, "id": r["id"],
                                "text": tok.decode(toks, skip_special_tokens=True)})
                if policy == "full":
                    full_tokens[r["id"]] = toks
    return scoring.accuracy_rows(results, answers, "flexh2o"), full_tokens


def compare_full(path, full_tokens, eos_ids):
    """Prints how many full-cache generations equal kvpress's (transformers') token for token."""
    theirs = {g["id"]: scoring.until_eos(g["tokens"], eos_ids) for g in scoring.read_jsonl(path) if g["method"] == "full"}
    common = [i for i in full_tokens if i in theirs]
    same = [i for i in common if full_tokens[i] == theirs[i]]
    print(f"full cache: flexh2o == transformers on {len(same)} of {len(common)} prompts")
    for i in sorted(set(common) - set(same)):
        print(f"  differs: {i}: flexh2o {full_tokens[i]} transformers {theirs[i]}")


def eval_group(args, text, length, skip, count, specs, out):
    """`flexh2o eval` on chunks skip .. skip + count - 1 (one batch); {label: (mean_kl, top1, tokens)}."""
    if not os.path.exists(out) or not args.fidelity_batch:
        cmd = [args.flexh2o, "eval", "--model", args.model, "--text", text, "--chunks", str(count),
               "--prefill", str(length), "--kv", ",".join(specs), "--csv", out]
        if args.fidelity_batch:
            cmd += ["--skip", str(skip), "--batch", str(count)]
        print(" ".join(cmd), flush=True)
        t0 = time.time()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(f"eval chunks {skip}-{skip + count - 1}: {time.time() - t0:.0f} s", flush=True)
    with open(out) as f:
        return {r["policy"]: (float(r["mean_kl"]), float(r["top1_agreement"]), int(r["tokens"]))
                for r in csv.DictReader(f)}


def run_fidelity(args, policies, kepts):
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        text = os.path.join(args.tasks_dir, f"fidelity_{length}.txt")
        n_items = min(args.limit, sum(1 for r in scoring.read_jsonl(os.path.join(args.tasks_dir, "fidelity.jsonl"))
                                      if r["length"] == length))
        labels = {kv_spec(p, k): (p, k) for p in policies if p != "full" for k in kepts}
        specs = ["full"] + list(labels)
        sums = defaultdict(lambda: [0.0, 0.0, 0])  # label -> kl sum, top-1 sum, tokens
        if args.fidelity_batch:
            # Groups of --fidelity-batch chunks, each one `eval` call (one batch) of the policies its
            # CSVs lack: a rerun with a larger --limit or more policies runs only what is missing.
            for skip in range(0, n_items, args.fidelity_batch):
                count = min(args.fidelity_batch, n_items - skip)
                stem = f"flexh2o_fidelity_{length}_{skip}-{skip + count - 1}"
                have = {}
                for name in sorted(os.listdir(args.out_dir)):
                    if name.startswith(stem + "_") and name.endswith(".csv"):
                        have.update(eval_group(args, text, length, skip, count, [], os.path.join(args.out_dir, name)))
                missing = [spec for spec in specs[1:] if spec not in have]
                if missing:
                    n_csv = sum(1 for name in os.listdir(args.out_dir) if name.startswith(stem + "_"))
                    out = os.path.join(args.out_dir, f"{stem}_{n_csv}.csv")
                    have.update(eval_group(args, text, length, skip, count, ["full"] + missing, out))
                for spec in specs[1:]:
                    kl, top1, tokens = have[spec]
                    sums[spec][0] += kl * tokens
                    sums[spec][1] += top1 * tokens
                    sums[spec][2] += tokens
        else:
            out = os.path.join(args.out_dir, f"flexh2o_fidelity_{length}.csv")
            for spec, (kl, top1, tokens) in eval_group(args, text, length, 0, n_items, specs, out).items():
                sums[spec] = [kl * tokens, top1 * tokens, tokens]
        for label, (policy, kept) in labels.items():
            s = sums[label]
            if s[2]:
                rows.append(scoring.fidelity_row("flexh2o", policy, kept, length, n_items, s[0] / s[2], s[1] / s[2]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scoring.add_common_args(ap)
    ap.add_argument("--policies", default=ALL_POLICIES)
    ap.add_argument("--flexh2o", default=os.path.join(HERE, "..", "..", "build", "engine", "flexh2o"))
    ap.add_argument("--fidelity-batch", type=int, default=0, metavar="N",
                    help="fidelity: one `flexh2o eval` per policy and group of N chunks (its --batch), each "
                         "kept in its own CSV and not rerun (default 0: one call for every policy and chunk)")
    ap.add_argument("--compare", help="kvpress_generations.jsonl: check the full cache's answers against it")
    ap.add_argument("--score-only", action="store_true",
                    help="run nothing: score what the outputs in OUT_DIR hold for the prompts selected")
    args = ap.parse_args()

    os.makedirs(args.out_dir, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(args.model)
    eos_ids = scoring.eos_ids(args.model)
    policies, kepts = args.policies.split(","), [float(k) for k in args.kept.split(",")]
    rows, full_tokens = run_questions(args, tok, policies, kepts, eos_ids)
    if args.compare and full_tokens:
        compare_full(args.compare, full_tokens, eos_ids)
    if "fidelity" in args.tasks.split(",") and not args.score_only:
        rows += run_fidelity(args, policies, kepts)
    path = os.path.join(args.out_dir, "flexh2o.csv")
    scoring.write_csv(path, rows)
    print(f"wrote {path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
