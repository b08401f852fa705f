#!/usr/bin/env python3
"""Runs SmolLM2 under each real-world JSON schema of bench/structured/schemas.jsonl and checks
every output with the `jsonschema` package (a harness tool, not a dependency of the engine).

1. Writes an OpenAI batch file: one /v1/chat/completions request per schema with
   response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}},
   a short user prompt asking for an example object (with the schema in it when shorter than
   --schema-in-prompt-below characters), --temperature (0: greedy), --max-tokens tokens.
2. Runs `flexh2o run --prompts <batch> --out <results> --metrics <metrics>` (continuous
   batching, 32 in flight), under `flock --lock` when given.
3. Reports: schemas supported (compiled) or not (their error lines, counted by the keyword they
   name), outputs valid / invalid, those that stopped and those that reached max_tokens
   (finish_reason "length": the engine closes an output within its limit, so these must be
   valid too), and the compile time per distinct schema (the run's --metrics,
   "structured_output"). Exits 1 when any output is invalid.

    /work/venvs/grammar/bin/python bench/structured/run_schemas.py \\
        --flexh2o build/engine/flexh2o --model ~/.cache/flexh2o/models/smollm2-135m-v5 \\
        --work /tmp/structured --lock /work/build.lock

The validator is the one the schema's $schema names (Draft 2020-12 without one), with the
format checker on (rfc3339-validator and rfc3987 installed check date-time and uri).
"""
import argparse
import collections
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time
import zlib

HERE = pathlib.Path(__file__).resolve().parent


def read_schemas(path):
    manifest, schemas = None, []
    for line in pathlib.Path(path).read_text().splitlines():
        record = json.loads(line)
        if "manifest" in record:
            manifest = record["manifest"]
        else:
            schemas.append(record)
    return manifest, schemas


def prompt_for(record, schema_below):
    schema = record["schema"]
    text = json.dumps(schema)
    if len(text) < schema_below:  # as JSONSchemaBench's prompts: the schema itself, when it is short
        return f"Write an example JSON object that follows this JSON schema:\n{text}\nReply with the JSON only."
    title = schema.get("title") if isinstance(schema, dict) else None
    about = f' "{title}"' if isinstance(title, str) and title else ""
    return f"Write an example JSON object for the schema{about}. Reply with the JSON only."


def write_batch(schemas, path, args):
    with open(path, "w") as f:
        for record in schemas:
            name = re.sub(r"[^A-Za-z0-9_-]", "_", record["id"])[:64]
            body = {"model": "smollm2", "max_tokens": args.max_tokens, "temperature": args.temperature,
                    "messages": [{"role": "user", "content": prompt_for(record, args.schema_in_prompt_below)}],
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": name, "schema": record["schema"], "strict": True}}}
            if args.temperature > 0:
                body["seed"] = zlib.crc32(record["id"].encode())
            if args.repetition_penalty:
                body["repetition_penalty"] = args.repetition_penalty
            f.write(json.dumps({"custom_id": record["id"], "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n")


def run_flexh2o(args, batch, results, metrics):
    command = [args.flexh2o, "run", "--model", args.model, "--prompts", str(batch), "--out", str(results),
               "--metrics", str(metrics), "--gpu-batch-size", "32", "--num-gpu-batches", "1",
               "--batching", "continuous", *args.extra]
    if args.lock:
        command = ["flock", args.lock, *command]
    print("$ " + " ".join(command), file=sys.stderr)
    results.unlink(missing_ok=True)  # a fresh run, not a resume
    start = time.monotonic()
    subprocess.run(command, check=True)
    return time.monotonic() - start


def validate(schema, instance):
    """None when valid, else the first error's message."""
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    return None if error is None else f"{error.json_path}: {error.message}"[:300]


def unsupported_keyword(message):
    """What an error line says is not supported: the keyword it names, else its kind."""
    m = re.search(r"keyword '([^']+)'", message)
    if m:
        return m.group(1)
    for pattern, kind in [(r"format '([^']*)' is not supported", "format '{}'"),
                          (r"'pattern' together with", "pattern with minLength/maxLength/format"),
                          (r"'patternProperties' with more than one", "patternProperties with several patterns"),
                          (r"is not in 'properties' and 'additionalProperties' is false",
                           "required property that additionalProperties: false forbids"),
                          (r"regex: (lookaround|backreference)", "pattern with {}"),
                          (r"is not a local reference", "remote $ref")]:
        m = re.search(pattern, message)
        if m:
            return kind.format(*m.groups())
    return "other: " + message.split(": ", 2)[-1][:80]


def check_results(schemas, results):
    """Every output of a supported schema is validated, whether it stopped or reached max_tokens
    (finish_reason length: the engine closes outputs within their limit)."""
    by_id = {r["id"]: r["schema"] for r in schemas}
    counts = collections.Counter()
    keywords = collections.Counter()
    invalid, unsupported = [], []
    for line in pathlib.Path(results).read_text().splitlines():
        result = json.loads(line)
        cid = result["custom_id"]
        if result.get("error"):
            counts["unsupported"] += 1
            message = result["error"]["message"]
            keywords[unsupported_keyword(message)] += 1
            unsupported.append(f"{cid}: {message[:200]}")
            continue
        counts["supported"] += 1
        choice = result["response"]["body"]["choices"][0]
        text = choice["message"]["content"]
        reason = choice["finish_reason"]
        counts[reason] += 1
        try:
            problem = validate(by_id[cid], json.loads(text))
        except ValueError as e:
            problem = f"not JSON: {e}"
        if problem is None:
            counts["valid " + reason] += 1
        else:
            invalid.append(f"{cid} ({reason}): {problem}\n    output: {text[:400]!r}")
    return counts, keywords, invalid, unsupported


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemas", default=str(HERE / "schemas.jsonl"))
    ap.add_argument("--flexh2o", default="build/engine/flexh2o")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", default="/tmp/structured", help="where the batch, results and metrics go")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--repetition-penalty", type=float,
                    help="vLLM's repetition_penalty in each request (still greedy): fewer outputs loop to max_tokens")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--schema-in-prompt-below", type=int, default=0, metavar="CHARS",
                    help="put the schema's JSON in the prompt when it is shorter than this")
    ap.add_argument("--lock", help="run flexh2o under `flock LOCK` (a shared machine's build lock)")
    ap.add_argument("--check-only", action="store_true", help="check the results of an earlier run")
    ap.add_argument("extra", nargs="*", help="more flexh2o run flags (after --)")
    args = ap.parse_args()
    manifest, schemas = read_schemas(args.schemas)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    batch, results, metrics = work / "batch.jsonl", work / "results.jsonl", work / "metrics.json"
    if not args.check_only:
        write_batch(schemas, batch, args)
        seconds = run_flexh2o(args, batch, results, metrics)
        print(f"flexh2o ran {len(schemas)} requests in {seconds:.0f} s", file=sys.stderr)
    counts, keywords, invalid, unsupported = check_results(schemas, results)
    print(f"schemas: {len(schemas)} (JSONSchemaBench at {manifest['commit'][:12]})")
    print(f"supported (compiled): {counts['supported']}; unsupported (error line): {counts['unsupported']}")
    for keyword, n in keywords.most_common():
        print(f"  {n:4d}  {keyword}")
    print(f"outputs of supported schemas: {counts['valid stop'] + counts['valid length']} valid of {counts['supported']}: "
          f"{counts['valid stop']} of {counts['stop']} that stopped, {counts['valid length']} of {counts['length']} "
          f"that reached max_tokens={args.max_tokens} (finish_reason length, closed within the limit)")
    report = json.loads(metrics.read_text()).get("structured_output") if metrics.exists() else None
    if report and "compile_ms" in report:
        print(f"compile per distinct schema ({report['distinct']}): median {report['compile_ms']['median']:.3f} ms, "
              f"max {report['compile_ms']['max']:.3f} ms; vocabulary trie {report['vocabulary_ms']:.1f} ms")
    for line in invalid:
        print("INVALID " + line)
    (work / "unsupported.txt").write_text("\n".join(unsupported) + "\n")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
