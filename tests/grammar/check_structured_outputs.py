#!/usr/bin/env python3
"""Checks structured outputs of `flexh2o run` independently of engine/grammar: every choice
(finish_reason "stop", or "length": closed within max_tokens) of
tests/data/grammar/structured_outputs.jsonl, the results of the
OpenAI batch tests/data/grammar/structured_batch.jsonl on the embedded stories260K, is valid
under its request's constraint as Python sees it: JSON schemas with the `jsonschema` package
(format checker on), json_object with json.loads, regexes with re.fullmatch, choices by
equality. GBNF outputs are checked by the C++ e2e test (test_cli, CliStructuredOutput) with the
grammar's own parser. Prints the counts; exits 1 on any invalid output.

  python tests/grammar/check_structured_outputs.py --write-batch   # rewrites the batch file
  build/flexh2o run --prompts tests/data/grammar/structured_batch.jsonl \
      --out tests/data/grammar/structured_outputs.jsonl
  python tests/grammar/check_structured_outputs.py                 # venv with jsonschema

(The venv of make_json_cases.py: jsonschema, rfc3339-validator, rfc3987.)
"""
import argparse
import json
import pathlib
import re
import sys

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "grammar"
BATCH = DATA / "structured_batch.jsonl"
OUTPUTS = DATA / "structured_outputs.jsonl"

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 10},
    "age": {"type": "integer", "minimum": 1, "maximum": 99},
    "mood": {"enum": ["happy", "sad", "sleepy"]},
    "pets": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
    "required": ["name", "age", "mood"], "additionalProperties": False}
STORY = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 24},
    "characters": {"type": "array", "minItems": 1, "maxItems": 3,
                   "items": {"type": "object", "properties": {
                       "name": {"type": "string", "maxLength": 8},
                       "kind": {"anyOf": [{"const": "cat"}, {"const": "dog"}, {"type": "null"}]}},
                       "required": ["name", "kind"]}},
    "happy_end": {"type": "boolean"}},
    "required": ["title", "characters", "happy_end"]}
EVENT = {"type": "object", "properties": {
    "day": {"type": "string", "format": "date"},
    "guests": {"type": "integer", "exclusiveMinimum": 0, "maximum": 500},
    "score": {"type": "number", "minimum": 0, "maximum": 10},
    "tag": {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{2}$"}},
    "required": ["day", "guests", "score", "tag"], "additionalProperties": False}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "label": {"type": "string", "maxLength": 5},
    "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/node"}}},
    "required": ["label"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
LIST = {"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50}, "minItems": 2, "maxItems": 5}

PROMPTS = ["Once upon a time", "The cat", "Lily said", "One day, Tom", "The sun was"]


def cases():
    """(id, structured-output fields) of the batch."""
    out = []
    for name, schema in [("person", PERSON), ("story", STORY), ("event", EVENT), ("tree", TREE), ("list", LIST)]:
        out.append((f"{name}-format", {"response_format": {"type": "json_schema",
                                                           "json_schema": {"name": name, "schema": schema, "strict": True}}}))
        out.append((f"{name}-guided", {"guided_json": schema}))
    out.append(("object", {"response_format": {"type": "json_object"}}))
    for i, regex in enumerate([r"[A-Z][a-z]{1,8} (is|was) [0-9]{1,2}", r"(yes|no), because [a-z ]{3,20}\.",
                               r"\d{3}-\d{4}", r"[a-z]{1,10}(, [a-z]{1,10}){0,3}"]):
        out.append((f"regex-{i}", {"guided_regex": regex}))
    for i, choices in enumerate([["happy", "sad", "a little sleepy"], ["cat", "dog", "bird", "fish"]]):
        out.append((f"choice-{i}", {"guided_choice": choices}))
    return out


def write_batch():
    lines = []
    for i, (cid, fields) in enumerate(cases()):
        for sampled in (False, True):
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 480, **fields}
            body.update({"temperature": 1.0, "seed": i, "n": 2} if sampled else {"temperature": 0})
            lines.append(json.dumps({"custom_id": cid + ("-sampled" if sampled else "-greedy"), "method": "POST",
                                     "url": "/v1/completions", "body": body}))
    BATCH.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} requests to {BATCH}")


def check(body, text):
    """Whether `text` is valid under the body's constraint, as Python's libraries say."""
    import jsonschema
    if "guided_regex" in body:
        return re.fullmatch(body["guided_regex"], text) is not None
    if "guided_choice" in body:
        return text in body["guided_choice"]
    fmt = body.get("response_format", {})
    if fmt.get("type") == "json_object":
        return isinstance(json.loads(text), dict)
    schema = body["guided_json"] if "guided_json" in body else fmt["json_schema"]["schema"]
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
    except (ValueError, jsonschema.ValidationError) as e:
        print(f"  invalid: {e}".splitlines()[0], file=sys.stderr)
        return False
    return True


def check_outputs():
    bodies = {json.loads(l)["custom_id"]: json.loads(l)["body"] for l in BATCH.read_text().splitlines() if l}
    valid = stopped = total = 0
    failed = []
    for line in OUTPUTS.read_text().splitlines():
        result = json.loads(line)
        cid = result["custom_id"]
        if result["error"] is not None:
            failed.append(f"{cid}: error line {result['error']['message']}")
            continue
        for choice in result["response"]["body"]["choices"]:
            total += 1
            stopped += choice["finish_reason"] == "stop"
            if check(bodies[cid], choice["text"]):
                valid += 1
            else:
                failed.append(f"{cid} ({choice['finish_reason']}): {choice['text']!r}")
    print(f"{valid} of {total} outputs valid ({stopped} stopped, {total - stopped} reached max_tokens)")
    for f in failed:
        print("  " + f)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-batch", action="store_true", help="rewrite the batch file")
    args = ap.parse_args()
    if args.write_batch:
        write_batch()
        return 0
    return check_outputs()


if __name__ == "__main__":
    sys.exit(main())
