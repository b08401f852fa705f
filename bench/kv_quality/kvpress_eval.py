#!/usr/bin/env python3
"""kvpress's KV compression methods on make_tasks.py's prompts (issue 61's peer harness).

For each method and kept fraction (kvpress's compression_ratio = 1 - kept):
  question tasks  the whole prompt (document + question) is prefilled under the press, which
                  compresses it once; the first token comes from that prefill, then greedy decode
                  of max_tokens (stopping at EOS) on the compressed cache, which is not evicted
                  further (kvpress presses act at prefill only).
  fidelity        the context is prefilled under the press; the continuation is teacher-forced in
                  one pass. KL(full || method) and top-1 agreement over every continuation
                  token's prediction (the first comes from the prefill, before compression),
                  per text into kvpress_fidelity.jsonl (resumable), pooled over the texts' tokens.

--shared-prefill (a speed-up for one CPU core, the same tokens): per prompt one prefill serves
the full cache and every ScorerPress method (tova, snapkv, ...) at every kept fraction: each
press's score() runs in the prefill's hook on the layer's whole keys, as ScorerPress.compress runs
it, and each cache is then cut as compress cuts it (a press does not change the prefill's hidden
states, so the first token is the same); KVzip scores once per prompt and prunes at each kept
fraction from those scores (compress_post), decoding each from a copy of the uncut cache. Other
methods (PyramidKV, ObservedAttention: eager) take the usual path. `--check-shared N` compares
both paths' caches on N prompts (fidelity: both paths' log-probs on N texts).

Writes OUT_DIR/kvpress_generations.jsonl (one line per request and method, resumable) and
OUT_DIR/kvpress.csv (scoring.CSV_COLUMNS).

usage: kvpress_eval.py --model MODEL_DIR --tasks-dir TASKS_DIR --out-dir OUT_DIR [--score-only]
         [--methods full,snapkv,...] [--kept 0.1,0.25] [--tasks passkey,multikey] [--lengths 1000,2000]
         [--limit N]
"""
import argparse
import copy
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
    return decode(model, cache, logits, len(ids), max_tokens, eos_ids)


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


def decode(model, cache, first_logits, pos, max_tokens, eos_ids):
    """Greedy: the first token from the prefill's logits, the rest decoded from position pos."""
    out = [int(first_logits.argmax())]
    while len(out) < max_tokens and out[-1] not in eos_ids:
        step = model(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache,
                     position_ids=torch.tensor([[pos]]))
        out.append(int(step.logits[0, -1].argmax()))
        pos += 1
    return out


def is_plain_scorer(press):
    """A ScorerPress whose compress is ScorerPress's: score, keep the top n_kept per kv head."""
    from kvpress.presses.scorer_press import ScorerPress
    return isinstance(press, ScorerPress) and type(press).compress is ScorerPress.compress


def shared_scorer_caches(model, ids, methods, kepts):
    """One prefill; returns (first logits, full cache, {(method, kept): cache}) for the scorer
    methods, each cut as ScorerPress.compress cuts it. Each (method, kept) has its own press and
    scores: StreamingLLM's scores depend on the compression ratio."""
    from kvpress.utils import compute_n_kept
    presses = {(m, k): make_press(m, k) for m in methods for k in kepts}
    stash = {}  # layer -> (keys, values, {(method, kept): scores})
    host = next(iter(presses.values()))

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        scores = {key: p.score(module, hidden_states, keys, values, attentions, kwargs) for key, p in presses.items()}
        stash[module.layer_idx] = (keys, values, scores)
        return keys, values  # the cache stays whole: it serves the full method

    for p in presses.values():
        p.post_init_from_model(model)
    host.compress = compress
    model.config._attn_implementation = "sdpa"
    cache = DynamicCache()
    with host(model):
        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, logits_to_keep=1)
    cut = {}
    for (m, kept) in presses:
        c = DynamicCache()
        for layer in sorted(stash):
            keys, values, scores = stash[layer]
            n_kept = compute_n_kept(keys.shape[2], round(1.0 - kept, 6))
            idx = scores[(m, kept)].topk(n_kept, dim=-1).indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            c.update(keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous(), layer)
        cut[(m, kept)] = c
    return out.logits[0, -1], cache, cut


@torch.inference_mode()
def generate_shared_scorers(model, ids, methods, kepts, max_tokens, eos_ids):
    """{(method, kept): tokens} for "full" (kept 1.0) and scorer methods from one prefill."""
    scorers = [m for m in methods if m != "full"]
    if scorers:
        logits, cache, cut = shared_scorer_caches(model, ids, scorers, kepts)
    else:
        (cache, logits), cut = prefill(model, ids, None, "full"), {}
    res = {key: decode(model, c, logits, len(ids), max_tokens, eos_ids) for key, c in cut.items()}
    if "full" in methods:
        res[("full", 1.0)] = decode(model, cache, logits, len(ids), max_tokens, eos_ids)
    return res


def kvzip_scored(model, ids, kepts):
    """KVzip's prefill and scoring once; returns (press, saved scores, first logits, uncut cache),
    the modules masked for kepts[0]."""
    press = make_press("kvzip", kepts[0])
    saved = {}
    compress_post = press.compress_post

    def keep_scores(m):
        saved["scores"] = press.score_val.clone()
        compress_post(m)

    press.compress_post = keep_scores
    cache, logits = prefill(model, ids, press, "kvzip")
    return press, compress_post, saved["scores"], logits, cache


def kvzip_mask(press, compress_post, scores, model, kept):
    press.compression_ratio = round(1.0 - kept, 6)
    press.score_val = scores.clone()
    compress_post(model)
    press.score_val = None


@torch.inference_mode()
def generate_shared_kvzip(model, ids, kepts, max_tokens, eos_ids):
    press, compress_post, scores, logits, cache = kvzip_scored(model, ids, kepts)
    res = {}
    for kept in kepts:
        kvzip_mask(press, compress_post, scores, model, kept)
        res[("kvzip", kept)] = decode(model, copy.deepcopy(cache), logits, len(ids), max_tokens, eos_ids)
    return res


@torch.inference_mode()
def check_shared(model, prompts, methods, kepts):
    """Both paths' caches (and KVzip's masks) equal on these prompts, or an AssertionError."""
    scorers = shareable(methods, kepts)
    for p in prompts:
        ids = p["tokens"]
        if scorers:
            logits, full, cut = shared_scorer_caches(model, ids, scorers, kepts)
            ref_full, ref_logits = prefill(model, ids, None, "full")
            assert torch.equal(logits, ref_logits), "first logits differ from the full prefill"
            for (m, kept), c in cut.items():
                ref, ref_logits = prefill(model, ids, make_press(m, kept), m)
                assert torch.equal(logits, ref_logits), (m, kept, "first logits")
                for layer in range(len(ref.layers)):
                    assert torch.equal(ref.layers[layer].keys, c.layers[layer].keys), (m, kept, layer, "keys")
                    assert torch.equal(ref.layers[layer].values, c.layers[layer].values), (m, kept, layer, "values")
                print(f"check {p['id']} {m} {kept}: caches equal", flush=True)
        if "kvzip" in methods:
            press, compress_post, scores, _, cache = kvzip_scored(model, ids, kepts)
            for kept in kepts:
                kvzip_mask(press, compress_post, scores, model, kept)
                mine = [tuple(t.clone() for t in l.self_attn.masked_key_indices) for l in model.model.layers]
                ref_cache, _ = prefill(model, ids, make_press("kvzip", kept), "kvzip")
                for l, m_idx in zip(model.model.layers, mine):
                    assert all(torch.equal(a, b) for a, b in zip(m_idx, l.self_attn.masked_key_indices)), (kept, "mask")
                for layer in range(len(ref_cache.layers)):
                    assert torch.equal(ref_cache.layers[layer].keys, cache.layers[layer].keys), (kept, layer, "kvzip keys")
                print(f"check {p['id']} kvzip {kept}: masks and caches equal", flush=True)


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
    if args.check_shared:
        check_shared(model, prompts[:args.check_shared], methods, kepts)
    with open(gen_path, "a") as f:
        if args.shared_prefill and not args.score_only:
            shared = [m for m in methods if m == "full" or m in shareable(methods, kepts)]
            groups = [g for g in (shared, ["kvzip"] if "kvzip" in methods else []) if g]
            for group in groups:
                keys = [(m, k) for m in group for k in ([1.0] if m == "full" else kepts)]
                t0, n = time.time(), 0
                for p in prompts:
                    todo = [key for key in keys if (key[0], key[1], p["id"]) not in done]
                    if not todo:
                        continue
                    if group == ["kvzip"]:
                        res = generate_shared_kvzip(model, p["tokens"], kepts, p["max_tokens"], eos_ids)
                    else:
                        res = generate_shared_scorers(model, p["tokens"], group, kepts, p["max_tokens"], eos_ids)
                    for (method, kept) in todo:
                        toks = res[(method, kept)]
                        f.write(json.dumps({"method": method, "kept": kept, "id": p["id"], "tokens": toks,
                                            "text": tok.decode(toks, skip_special_tokens=True)}) + "\n")
                        done.add((method, kept, p["id"]))
                    f.flush()
                    n += 1
                print(f"shared prefill {'+'.join(group)} at kept {kepts}: {n} prompts in {time.time() - t0:.0f} s",
                      flush=True)
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


def clear_masks(model):
    """Drops KVzip's per-head key masks from the attention modules."""
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None


@torch.inference_mode()
def teacher_forced(model, cache, first, n, continuation, method):
    """Log-probs predicting each continuation token after a (compressed) cache of a context of
    n tokens: the first from the prefill's logits, the rest teacher-forced at positions n, n+1, ..."""
    model.config._attn_implementation = attention_for(method)
    x = torch.tensor([continuation[:-1]])
    pos = torch.arange(n, n + len(continuation) - 1).unsqueeze(0)
    logits = model(input_ids=x, past_key_values=cache, position_ids=pos).logits[0]
    return torch.log_softmax(torch.cat([first[None], logits]).double(), dim=-1)


def kl_top1(full, lp):
    """Sums over the predictions: KL(full || lp) and argmax agreement."""
    kl = (full.exp() * (full - lp)).sum(-1)
    return float(kl.sum()), int((full.argmax(-1) == lp.argmax(-1)).sum()), kl.numel()


def shareable(methods, kepts):
    """Methods one prefill serves (--shared-prefill): plain ScorerPresses that run under SDPA."""
    return [m for m in methods if m not in ("full", "kvzip") and attention_for(m) == "sdpa"
            and is_plain_scorer(make_press(m, kepts[0]))]


@torch.inference_mode()
def fidelity_item(model, ctx, cont, todo, kepts, shared_prefill, check=False):
    """{(method, kept): (kl_sum, top1_sum, tokens)} for the (method, kept) pairs in todo."""
    out, n = {}, len(ctx)
    methods = sorted({m for m, _ in todo})
    shared = shareable(methods, kepts) if shared_prefill else []
    if shared:
        first, full_cache, cut = shared_scorer_caches(model, ctx, shared, kepts)
        for (m, k), c in cut.items():
            if (m, k) in todo:
                out[(m, k)] = teacher_forced(model, c, first, n, cont, m)
        full = teacher_forced(model, full_cache, first, n, cont, "full")
        if check:  # the ordinary path must give the same log-probs
            ref_full = continuation_logprobs(model, ctx, cont, None, "full")
            assert torch.allclose(ref_full, full, atol=1e-6), "full log-probs differ"
            for (m, k), lp in out.items():
                ref = continuation_logprobs(model, ctx, cont, make_press(m, k), m)
                assert torch.allclose(ref, lp, atol=1e-6), (m, k, float((ref - lp).abs().max()))
                print(f"check {m} {k}: shared == ordinary (max diff {float((ref - lp).abs().max()):.2e})", flush=True)
    else:
        full = continuation_logprobs(model, ctx, cont, None, "full")
    if shared_prefill and "kvzip" in methods:
        press, compress_post, scores, first, cache = kvzip_scored(model, ctx, kepts)
        for k in kepts:
            if ("kvzip", k) in todo:
                kvzip_mask(press, compress_post, scores, model, k)
                out[("kvzip", k)] = teacher_forced(model, copy.deepcopy(cache), first, n, cont, "kvzip")
                if check:
                    ref = continuation_logprobs(model, ctx, cont, make_press("kvzip", k), "kvzip")
                    diff = float((ref - out[("kvzip", k)]).abs().max())
                    assert diff < 1e-6, ("kvzip", k, diff)
                    print(f"check kvzip {k}: shared == ordinary (max diff {diff:.2e})", flush=True)
                    kvzip_mask(press, compress_post, scores, model, k)
        clear_masks(model)
    for (m, k) in todo:
        if (m, k) not in out:
            out[(m, k)] = continuation_logprobs(model, ctx, cont, make_press(m, k), m)
            clear_masks(model)
    return {key: kl_top1(full, lp) for key, lp in out.items()}


def run_fidelity(model, args, methods, kepts):
    """Per text and method: KL and top-1 sums into kvpress_fidelity.jsonl (resumable); rows pool
    them over every predicted token of the texts selected, as `flexh2o eval` averages."""
    items = select(scoring.read_jsonl(os.path.join(args.tasks_dir, "fidelity.jsonl")), args)
    path = os.path.join(args.out_dir, "kvpress_fidelity.jsonl")
    done = {(r["id"], r["method"], r["kept"]) for r in scoring.read_jsonl(path)} if os.path.exists(path) else set()
    keys = [(m, k) for m in methods if m != "full" for k in kepts]
    with open(path, "a") as f:
        for i, it in enumerate(items):
            todo = [key for key in keys if (it["id"], key[0], key[1]) not in done]
            if not todo or args.score_only:
                continue
            t0 = time.time()
            res = fidelity_item(model, it["context"], it["continuation"], todo, kepts, args.shared_prefill,
                                check=i < args.check_shared)
            dt = time.time() - t0
            for (m, k), (kl, top1, tokens) in res.items():
                f.write(json.dumps({"id": it["id"], "length": it["length"], "method": m, "kept": k,
                                    "kl_sum": kl, "top1": top1, "tokens": tokens,
                                    "mean_kl": kl / tokens, "seconds_item": round(dt, 1)}) + "\n")
            f.flush()
            print(f"{it['id']}: {len(res)} methods in {dt:.0f} s", flush=True)
    ids = {it["id"] for it in items}
    sums = defaultdict(lambda: [0.0, 0, 0, 0])  # (method, kept, length) -> kl, top1, tokens, texts
    for r in scoring.read_jsonl(path) if os.path.exists(path) else []:
        if r["id"] in ids and r["method"] in methods and r["kept"] in kepts:
            s = sums[(r["method"], r["kept"], r["length"])]
            s[0] += r["kl_sum"]
            s[1] += r["top1"]
            s[2] += r["tokens"]
            s[3] += 1
    return [scoring.fidelity_row("kvpress", m, k, length, s[3], s[0] / s[2], s[1] / s[2])
            for (m, k, length), s in sorted(sums.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scoring.add_common_args(ap, kept_help="kept fractions (compression_ratio = 1 - kept)")
    ap.add_argument("--methods", default=ALL_METHODS)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--shared-prefill", action="store_true",
                    help="one prefill per prompt for full + scorer presses, one KVzip scoring per prompt (above)")
    ap.add_argument("--check-shared", type=int, default=0, metavar="N",
                    help="first assert that --shared-prefill's caches equal the presses' own on N prompts")
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
    if "fidelity" in args.tasks.split(","):
        rows += run_fidelity(model, args, methods, kepts)
    path = os.path.join(args.out_dir, "kvpress.csv")
    scoring.write_csv(path, rows)
    print(f"wrote {path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
