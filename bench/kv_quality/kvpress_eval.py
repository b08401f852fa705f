#!/usr/bin/env python3
"""kvpress's KV compression methods on make_tasks.py's prompts (issue 61's peer harness).

For each method and kept fraction (kvpress's compression_ratio = 1 - kept):
  question tasks  the whole prompt (document + question) is prefilled under the press, which
                  compresses it once; the first token comes from that prefill, then greedy decode
                  of max_tokens (stopping at EOS) on the compressed cache, which is not evicted
                  further (kvpress presses act at prefill only).
  fidelity        the context is prefilled under the press; the continuation is teacher-forced in
                  one pass. KL(full || method) and top-1 agreement over every continuation
                  token's prediction (the first comes from the prefill, before compression).

Writes OUT_DIR/kvpress_generations.jsonl (one line per request and method, resumable) and
OUT_DIR/kvpress.csv (scoring.CSV_COLUMNS).

usage: kvpress_eval.py --model MODEL_DIR --tasks-dir TASKS_DIR --out-dir OUT_DIR [--score-only]
         [--methods full,snapkv,...] [--kept 0.1,0.25] [--tasks passkey,multikey] [--lengths 1000,2000]
         [--limit N]
"""
import argparse
import json
import os
import sys
import time
from collections import defaultdict

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scoring  # noqa: E402

ALL_METHODS = "full,snapkv,pyramidkv,tova,streaming_llm,expected_attention,knorm,observed_attention,kvzip"


def make_press(name, kept):
    """The kvpress press for a method name; None for the full cache."""
    import kvpress
    ratio = round(1.0 - kept, 6)
    presses = {
        "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=ratio),
        "pyramidkv": lambda: kvpress.PyramidKVPress(compression_ratio=ratio),
        "tova": lambda: kvpress.TOVAPress(compression_ratio=ratio),
        "streaming_llm": lambda: kvpress.StreamingLLMPress(compression_ratio=ratio),
        "expected_attention": lambda: kvpress.ExpectedAttentionPress(compression_ratio=ratio),
        "knorm": lambda: kvpress.KnormPress(compression_ratio=ratio),
        "observed_attention": lambda: kvpress.ObservedAttentionPress(compression_ratio=ratio),
        "kvzip": lambda: kvpress.KVzipPress(compression_ratio=ratio),
    }
    return None if name == "full" else presses[name]()


def attention_for(name):
    # ObservedAttention reads the attention weights, which only the eager kernel returns;
    # KVzip refuses eager.
    return "eager" if name == "observed_attention" else "sdpa"


def load_model(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def prefill(model, ids, press, method):
    """Forward of the prompt (compressed by the press); returns (cache, last logits)."""
    model.config._attn_implementation = attention_for(method)
    cache = DynamicCache()
    x = torch.tensor([ids])
    if press is None:
        out = model(input_ids=x, past_key_values=cache, logits_to_keep=1)
    else:
        with press(model):
            out = model(input_ids=x, past_key_values=cache, logits_to_keep=1)
    return cache, out.logits[0, -1]


@torch.inference_mode()
def generate(model, ids, press, method, max_tokens, eos_ids):
    """Greedy tokens after ids; positions continue the original prompt's, whatever was kept."""
    cache, logits = prefill(model, ids, press, method)
    out = [int(logits.argmax())]
    pos = len(ids)
    while len(out) < max_tokens and out[-1] not in eos_ids:
        step = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache,
                     position_ids=torch.tensor([[pos]]))
        out.append(int(step.logits[0, -1].argmax()))
        pos += 1
    return out


@torch.inference_mode()
def continuation_logprobs(model, context, continuation, press, method):
    """Log-probs predicting each continuation token: the first from the prefill's last position
    (as `flexh2o eval --prefill` scores it), the rest teacher-forced after the compressed context."""
    cache, first = prefill(model, context, press, method)
    n = len(context)
    x = torch.tensor([continuation[:-1]])
    pos = torch.arange(n, n + len(continuation) - 1).unsqueeze(0)
    logits = model(input_ids=x, past_key_values=cache, position_ids=pos).logits[0]
    return torch.log_softmax(torch.cat([first[None], logits]).double(), dim=-1)


def select(records, args):
    tasks, lengths = args.tasks.split(","), [int(x) for x in args.lengths.split(",")]
    per_cell = defaultdict(int)
    out = []
    for r in records:
        key = (r.get("task", "fidelity"), r["length"])
        if key[0] in tasks and key[1] in lengths and per_cell[key] < args.limit:
            per_cell[key] += 1
            out.append(r)
    return out


def run_questions(model, tok, args, methods, kepts, eos_ids):
    answers = {a["id"]: a for a in scoring.read_jsonl(os.path.join(args.tasks_dir, "answers.jsonl"))}
    prompts = [p for p in scoring.read_jsonl(os.path.join(args.tasks_dir, "tasks.jsonl"))]
    prompts = select([dict(p, **answers[p["id"]]) for p in prompts], args)
    gen_path = os.path.join(args.out_dir, "kvpress_generations.jsonl")
    done = {(g["method"], g["kept"], g["id"]) for g in scoring.read_jsonl(gen_path)} \
        if os.path.exists(gen_path) else set()
    with open(gen_path, "a") as f:
        for method in methods:
            for kept in ([1.0] if method == "full" else kepts):
                t0, todo = time.time(), [p for p in prompts if (method, kept, p["id"]) not in done]
                if args.score_only:
                    continue
                for p in todo:
                    toks = generate(model, p["tokens"], make_press(method, kept), method, p["max_tokens"], eos_ids)
                    text = tok.decode(toks, skip_special_tokens=True)
                    f.write(json.dumps({"method": method, "kept": kept, "id": p["id"], "tokens": toks,
                                        "text": text}) + "\n")
                    f.flush()
                print(f"{method} kept={kept}: {len(todo)} prompts in {time.time() - t0:.0f} s", flush=True)
    ids = {p["id"] for p in prompts}
    results = [g for g in scoring.read_jsonl(gen_path) if g["id"] in ids]
    return scoring.accuracy_rows(results, answers, "kvpress")


def run_fidelity(model, args, methods, kepts):
    items = select(scoring.read_jsonl(os.path.join(args.tasks_dir, "fidelity.jsonl")), args)
    sums = defaultdict(lambda: [0.0, 0, 0, 0])  # (method, kept, length) -> kl, top1, tokens, items
    for it in items:
        ctx, cont = it["context"], it["continuation"]
        full = continuation_logprobs(model, ctx, cont, None, "full")
        for method in [m for m in methods if m != "full"]:
            for kept in kepts:
                lp = continuation_logprobs(model, ctx, cont, make_press(method, kept), method)
                kl = (full.exp() * (full - lp)).sum(-1)
                s = sums[(method, kept, it["length"])]
                s[0] += float(kl.sum())
                s[1] += int((full.argmax(-1) == lp.argmax(-1)).sum())
                s[2] += kl.numel()
                s[3] += 1
    return [scoring.fidelity_row("kvpress", m, k, length, s[3], s[0] / s[2], s[1] / s[2])
            for (m, k, length), s in sorted(sums.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scoring.add_common_args(ap, kept_help="kept fractions (compression_ratio = 1 - kept)")
    ap.add_argument("--methods", default=ALL_METHODS)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--score-only", action="store_true",
                    help="generate nothing: score what kvpress_generations.jsonl holds (e.g. while a run goes on)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = load_model(args.model)
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    methods, kepts = args.methods.split(","), [float(k) for k in args.kept.split(",")]
    rows = run_questions(model, tok, args, methods, kepts, eos_ids)
    if "fidelity" in args.tasks.split(",") and not args.score_only:
        rows += run_fidelity(model, args, methods, kepts)
    path = os.path.join(args.out_dir, "kvpress.csv")
    scoring.write_csv(path, rows)
    print(f"wrote {path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
