#!/usr/bin/env python3
"""The most KV eviction can buy a long-prompt batch job on a device, from the job's FLOPs and
bytes and the device's peak rates (issue 61). Eviction makes decode cheaper (less KV read a step,
room for a larger batch); it does not shorten the prompts' prefill, which computes the whole
prompt before it is compressed. So the job's speed-up is at most

    (prefill + decode with the full cache) / (prefill + decode with the kept fraction)

with each term at its floor: prefill at the peak FLOP rate, a decode step at the larger of its
FLOPs at the peak rate and its bytes (the weights once, each sequence's cache) at the memory
bandwidth. A real engine is slower on both terms; prefill further from its peak than a
memory-bound decode, so the real ratio is lower still.

  job_bound.py --model M --prompt-len 3006 --new 32 --requests 64 --tflops 989 --gbps 4800
  (an H200 at its datasheet's dense BF16 rate and HBM3e bandwidth, an f16 cache and weights)

--full-batch / --kept-batch: the batch each cache fits (default: every request at once).
"""
import argparse
import json
import math
import os


def model_shape(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    d = c.get("head_dim", c["hidden_size"] // heads)
    h, inter, layers, vocab = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    layer_params = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter
    embed = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return {"token_flops": 2 * layers * layer_params,  # a token through every layer
            "head_flops": 2 * h * vocab,
            "pair_flops": 4 * heads * d * layers,  # QK and PV per (query, key) pair, all layers
            "params": layers * layer_params + embed, "kv_elems": 2 * layers * kv * d}


def prefill_s(m, a):
    n = a.prompt_len
    flops = n * m["token_flops"] + m["pair_flops"] * n * (n + 1) / 2 + m["head_flops"]
    return a.requests * flops / (a.tflops * 1e12)


def decode_s(m, a, batch, cache_tokens):
    """All the job's decode steps: ceil(requests / batch) waves of --new steps."""
    flops = batch * (m["token_flops"] + m["head_flops"] + m["pair_flops"] * cache_tokens)
    data = m["params"] * a.weight_bytes + batch * cache_tokens * m["kv_elems"] * a.cache_bytes
    step = max(flops / (a.tflops * 1e12), data / (a.gbps * 1e9))
    return math.ceil(a.requests / batch) * a.new * step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an HF directory (its config.json)")
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--new", type=int, required=True, help="new tokens per request")
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--kept", type=float, default=0.1, help="the kept fraction of each sequence")
    ap.add_argument("--full-batch", type=int, default=0)
    ap.add_argument("--kept-batch", type=int, default=0)
    ap.add_argument("--tflops", type=float, required=True, help="the device's peak, TFLOP/s")
    ap.add_argument("--gbps", type=float, required=True, help="its memory bandwidth, GB/s")
    ap.add_argument("--cache-bytes", type=int, default=2)
    ap.add_argument("--weight-bytes", type=int, default=2)
    a = ap.parse_args()
    m = model_shape(a.model)
    full_batch, kept_batch = a.full_batch or a.requests, a.kept_batch or a.requests
    budget = max(8, round(a.kept * (a.prompt_len + a.new)))
    pre = prefill_s(m, a)
    full = decode_s(m, a, full_batch, a.prompt_len + a.new / 2)
    kept = decode_s(m, a, kept_batch, budget)
    print(f"prefill {pre * 1e3:.1f} ms | decode: full cache (batch {full_batch}) {full * 1e3:.1f} ms, "
          f"{a.kept:g} kept (batch {kept_batch}, {budget} tokens) {kept * 1e3:.1f} ms | "
          f"job {(pre + full) * 1e3:.1f} / {(pre + kept) * 1e3:.1f} ms: at most {(pre + full) / (pre + kept):.2f}x "
          f"(prefill {pre / (pre + full):.0%} of the full cache's job)")


if __name__ == "__main__":
    main()
