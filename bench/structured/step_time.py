#!/usr/bin/env python3
"""Decode step time with and without JSON schemas, the same schedule in both runs (issue 46: a
schema may cost at most 10% of the step).

1. Writes an OpenAI batch: one /v1/chat/completions request per schema of
   bench/structured/schemas.jsonl (the first --count), each asking for an example object under
   response_format json_schema, sampled (temperature 1, a seed per request), --max-tokens.
2. Runs it (constrained), then the same requests without response_format, each with
   max_tokens = the tokens its constrained output took and ignore_eos, so that both runs admit,
   step and end every request alike (continuous batching, --slots in flight). Requests whose
   schema is not supported (error lines) are left out of the second run; they take no slot in
   the first.
3. Repeats the pair --repeats times, alternating, and prints the decode step time of each run
   (--metrics: decode_seconds / decode_steps) and the median ratio constrained / unconstrained.

    python3 bench/structured/step_time.py --model ~/.cache/flexh2o/models/smollm2-135m-v5 \\
        --work /tmp/step_time --lock /work/build.lock
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import zlib

HERE = pathlib.Path(__file__).resolve().parent


def read_schemas(path, count):
    records = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
    return [r for r in records if "manifest" not in r][:count]


def request(record, max_tokens, constrained):
    body = {"model": "bench", "max_tokens": max_tokens, "temperature": 1.0, "seed": zlib.crc32(record["id"].encode()),
            "messages": [{"role": "user", "content": "Write an example JSON object for this schema. Reply with JSON only."}]}
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "s", "schema": record["schema"], "strict": True}}
    else:
        body["ignore_eos"] = True
    return {"custom_id": record["id"], "method": "POST", "url": "/v1/chat/completions", "body": body}


def run(args, batch, tag):
    work = pathlib.Path(args.work)
    out, metrics = work / f"{tag}.out.jsonl", work / f"{tag}.metrics.json"
    out.unlink(missing_ok=True)
    command = [args.flexh2o, "run", "--model", args.model, "--prompts", str(batch), "--out", str(out),
               "--metrics", str(metrics), "--gpu-batch-size", str(args.slots), "--num-gpu-batches", "1",
               "--batching", "continuous", *args.extra]
    if args.lock:
        command = ["flock", args.lock, *command]
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
    report = json.loads(metrics.read_text())
    totals = report.get("totals", report)
    step_ms = 1e3 * totals["decode_seconds"] / totals["decode_steps"]
    results = [json.loads(line) for line in out.read_text().splitlines()]
    return step_ms, totals["decode_steps"], results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemas", default=str(HERE / "schemas.jsonl"))
    ap.add_argument("--count", type=int, default=96, help="schemas (requests) from the start of the file")
    ap.add_argument("--flexh2o", default="build/engine/flexh2o")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", default="/tmp/step_time")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--slots", type=int, default=32, help="sequences in flight")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lock", help="run flexh2o under `flock LOCK`")
    ap.add_argument("extra", nargs="*", help="more flexh2o run flags (after --)")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    records = read_schemas(args.schemas, args.count)
    constrained_batch = work / "constrained.jsonl"
    constrained_batch.write_text("".join(json.dumps(request(r, args.max_tokens, True)) + "\n" for r in records))
    ratios = []
    for i in range(args.repeats):
        with_ms, steps, results = run(args, constrained_batch, "constrained")
        lengths = {r["custom_id"]: r["response"]["body"]["usage"]["completion_tokens"] for r in results
                   if r.get("error") is None}
        plain_batch = work / "plain.jsonl"
        plain_batch.write_text("".join(json.dumps(request(r, lengths[r["id"]], False)) + "\n" for r in records
                                       if r["id"] in lengths))
        without_ms, plain_steps, _ = run(args, plain_batch, "plain")
        if plain_steps != steps:
            print(f"warning: the runs took {steps} and {plain_steps} decode steps", file=sys.stderr)
        ratios.append(with_ms / without_ms)
        print(f"pair {i + 1}: {len(lengths)} requests, {sum(lengths.values())} tokens, {steps} decode steps: "
              f"{with_ms:.2f} ms a step with schemas, {without_ms:.2f} ms without ({ratios[-1]:.3f}x)")
    print(f"median ratio over {len(ratios)} pairs: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    sys.exit(main())
