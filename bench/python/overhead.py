"""The Python API's overhead against the CLI on the same job, alternated in one run.

    PYTHONPATH=build-py/python python3 bench/python/overhead.py --bin build-py/engine/flexh2o \
        [--model DIR] [--prompts 256] [--max-tokens 64] [--rounds 3]

Each round runs the job once through `flexh2o run --prompts F --out O` (a subprocess, timed
from start to exit, as a user's script would) and once through `LLM(...).generate` (timed
around the call); both greedy, the same OpenAI batch lines. Prints generated tokens per
second of each and their ratio, per round and the median.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from flexh2o import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    words = "the cat dog sat ran big small red blue house tree sun moon happy sad went to park and played".split()
    prompts = [" ".join(words[(i * 7 + k) % len(words)] for k in range(4 + i % 9)) for i in range(a.prompts)]
    tmp = tempfile.mkdtemp()
    batch = os.path.join(tmp, "in.jsonl")
    with open(batch, "w") as f:
        for i, p in enumerate(prompts):
            body = {"model": a.model or "flexh2o", "prompt": p, "n": 1, "temperature": 0, "top_p": 1.0,
                    "max_tokens": a.max_tokens}
            f.write(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    sp = SamplingParams(temperature=0, max_tokens=a.max_tokens)
    rows = []
    for r in range(a.rounds):
        out = os.path.join(tmp, f"cli{r}.jsonl")
        t0 = time.perf_counter()
        subprocess.run([a.bin, "run", "--prompts", batch, "--out", out, "--quiet"] + (["--model", a.model] if a.model else []),
                       check=True, capture_output=True)
        cli_s = time.perf_counter() - t0
        cli_tokens = sum(json.loads(l)["response"]["body"]["usage"]["completion_tokens"] for l in open(out))
        t0 = time.perf_counter()
        outs = LLM(model=a.model or None).generate(prompts, sp, use_tqdm=False)
        py_s = time.perf_counter() - t0
        py_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        assert py_tokens == cli_tokens, (py_tokens, cli_tokens)
        rows.append((cli_tokens / cli_s, py_tokens / py_s))
        print(f"round {r + 1}: cli {rows[-1][0]:.1f} tok/s, python {rows[-1][1]:.1f} tok/s, "
              f"python/cli {rows[-1][1] / rows[-1][0]:.3f}", flush=True)
    ratio = statistics.median(p / c for c, p in rows)
    print(f"median python/cli: {ratio:.3f} ({a.prompts} prompts x {a.max_tokens} tokens, {a.rounds} rounds, "
          f"model {a.model or 'embedded stories260K'}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    sys.exit(main())
