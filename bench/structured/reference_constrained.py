#!/usr/bin/env python3
"""Greedy decoding of SmolLM2 in transformers (float32) restricted at each step to the tokens a
JSON schema allows, computed here independently of engine/grammar, compared token by token
with `flexh2o run` (greedy, --dtype f32) on the same prompt ids.

The allowed set is computed from a byte regex written here from the schema, following the
policy of docs/structured-output.md (properties in schema order, optional ones left out or
not, no other property when `properties` is listed, up to 20 bytes of space/tab/newline after
`{ [ , :` and after each value inside an object or array, none around the top-level value;
strings of UTF-8 characters other than `"`, `\\` and controls, or escapes, no \\u surrogate;
integers without leading zeros or -0; numbers with an exponent of at most two digits). A token
is allowed when the text so far plus its bytes is a prefix of a match (the `regex` package's
partial matching, over bytes); the stop token when the text is a whole match. Greedy takes the
allowed token of highest logit; the output ends when the stop token is taken or no byte may
follow (the engine's ending). Only the keywords listed in SUPPORTED are translated; a schema
using others is refused.

    /work/venvs/tf5/bin/python bench/structured/reference_constrained.py \\
        --model ~/.cache/flexh2o/models/smollm2-135m-v5 --flexh2o build/engine/flexh2o --work /tmp/refdec

Prints, per schema, equal or the first differing step with both tokens' logits and the margin
between the reference's best and second-best allowed tokens (a near-tie, relative margin under
1e-4, is reported as a tie: float32 sums in another order may swap such tokens).
"""
import argparse
import json
import pathlib
import subprocess
import sys

import regex
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = pathlib.Path(__file__).resolve().parent
SUPPORTED = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
             "minLength", "maxLength", "enum", "const", "description", "title", "$schema"}
WS = rb"[ \t\n]{0,20}"
CHAR = (rb'(?:[\x20\x21\x23-\x5b\x5d-\x7f]|[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]'
        rb'|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}'
        rb'|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}'
        rb'|\\(?:["\\/bfnrt]|u(?:[0-9a-cefA-CEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})))')
NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?"


class Refused(Exception):
    pass


def literal(value):
    return regex.escape(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def value_regex(schema):
    if not isinstance(schema, dict):
        raise Refused("a boolean schema")
    extra = set(schema) - SUPPORTED
    if extra:
        raise Refused(f"keywords {sorted(extra)}")
    if "const" in schema:
        return literal(schema["const"])
    if "enum" in schema:
        return b"(?:" + b"|".join(literal(v) for v in schema["enum"]) + b")"
    kind = schema.get("type")
    if kind == "string":
        lo, hi = schema.get("minLength", 0), schema.get("maxLength")
        return b'"' + CHAR + (b"{%d,%s}" % (lo, b"" if hi is None else str(hi).encode())) + b'"'
    if kind == "integer":
        return b"(?:0|-?[1-9][0-9]*)"
    if kind == "number":
        return NUMBER
    if kind == "boolean":
        return b"(?:true|false)"
    if kind == "null":
        return b"null"
    if kind == "array":
        return array_regex(schema)
    if kind == "object":
        return object_regex(schema)
    raise Refused(f"type {kind!r}")


def array_regex(schema):
    item = value_regex(schema.get("items", {"type": "string"})) + WS
    lo, hi = schema.get("minItems", 0), schema.get("maxItems")
    more = b"(?:," + WS + item + b")" + (b"{%d,%s}" % (max(lo - 1, 0), b"" if hi is None else str(hi - 1).encode()))
    body = item + more
    return b"\\[" + WS + (body if lo > 0 else b"(?:" + body + b")?") + b"\\]"


def object_regex(schema):
    properties = list(schema.get("properties", {}).items())
    if not properties or schema.get("additionalProperties", False) is not False:
        raise Refused("additional properties")
    required = set(schema.get("required", []))
    members = [literal(name) + b":" + WS + value_regex(s) + WS for name, s in properties]
    comma = b"," + WS

    def rest(i, written):  # the text from property i on, after a property (written) or not
        if i == len(members):
            return b""
        present = (comma if written else b"") + members[i] + rest(i + 1, True)
        if properties[i][0] in required:
            return present
        return b"(?:" + present + b"|" + rest(i + 1, written) + b")"

    return b"\\{" + WS + rest(0, False) + b"\\}"


class SchemaMask:
    """Which tokens may follow a text under the schema's byte regex."""

    def __init__(self, schema, token_bytes, stop_ids):
        self.pattern = regex.compile(value_regex(schema))
        self.token_bytes = token_bytes
        self.stop_ids = stop_ids

    def prefix_ok(self, text):
        return self.pattern.fullmatch(text, partial=True) is not None

    def complete(self, text):
        return self.pattern.fullmatch(text) is not None

    def allowed(self, text, token):
        if token in self.stop_ids:
            return self.complete(text)
        piece = self.token_bytes[token]
        return bool(piece) and self.prefix_ok(text + piece)

    def finished(self, text):
        return not any(self.prefix_ok(text + bytes([b])) for b in range(256))


def token_bytes_of(tok):
    """Each id's bytes (byte-level BPE); special tokens none."""
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    special = set(tok.all_special_ids) | {i for i in tok.added_tokens_decoder}
    out = []
    for i, piece in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        out.append(b"" if i in special or piece is None else bytes(byte_of[c] for c in piece))
    return out


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@torch.no_grad()
def reference_decode(model, prompt_ids, mask, max_tokens):
    """The greedy tokens and, per step, (best logit, runner-up allowed logit, logits row)."""
    text, tokens, steps = b"", [], []
    past = None
    inputs = torch.tensor([prompt_ids])
    for _ in range(max_tokens):
        out = model(input_ids=inputs, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        found = []
        for t in torch.argsort(logits, descending=True).tolist():
            if mask.allowed(text, t):
                found.append(t)
                if len(found) == 2:
                    break
        if not found:
            raise RuntimeError(f"no token allowed after {text!r}")
        best = found[0]
        steps.append((logits[best].item(), logits[found[1]].item() if len(found) > 1 else None, logits))
        tokens.append(best)
        if best in mask.stop_ids:
            break
        text += mask.token_bytes[best]
        if mask.finished(text):
            break
        inputs = torch.tensor([[best]])
    return tokens, steps


def pick_schemas(path, count, per_subset=2):
    """The first `count` schemas of the bench file this script can translate, at most
    `per_subset` from each subset."""
    picked, subsets = [], {}
    for line in pathlib.Path(path).read_text().splitlines():
        record = json.loads(line)
        if "schema" not in record:
            continue
        try:
            value_regex(record["schema"])
        except Refused:
            continue
        subset = record["id"].split("/")[0]
        subsets[subset] = subsets.get(subset, 0) + 1
        if subsets[subset] > per_subset:
            continue
        picked.append(record)
        if len(picked) == count:
            break
    return picked


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="SmolLM2 HF directory")
    ap.add_argument("--flexh2o", default="build/engine/flexh2o")
    ap.add_argument("--schemas", default=str(HERE / "schemas.jsonl"))
    ap.add_argument("--count", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--room", type=int, default=512,
                    help="tokens the engine may write past --max-tokens (its first --max-tokens are compared)")
    ap.add_argument("--work", default="/tmp/refdec")
    ap.add_argument("--lock", help="run flexh2o under `flock LOCK`")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(args.model)
    token_bytes = token_bytes_of(tok)
    stop_ids = {json.loads((pathlib.Path(args.model) / "generation_config.json").read_text())["eos_token_id"]}
    schemas = pick_schemas(args.schemas, args.count)
    prompts = []
    for r in schemas:
        messages = [{"role": "user", "content": "Write an example JSON object for this schema. Reply with the JSON only."}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        prompts.append(list(ids))
    # The engine closes an output within its max_tokens (docs/structured-output.md), which the
    # reference does not: it gets room past the tokens compared, so that the limit does not narrow them.
    engine_limit = args.max_tokens + args.room
    lines = [json.dumps({"id": r["id"], "tokens": ids, "max_tokens": engine_limit, "guided_json": r["schema"]})
             for r, ids in zip(schemas, prompts)]
    (work / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (work / "out.jsonl").unlink(missing_ok=True)
    command = [args.flexh2o, "run", "--model", args.model, "--dtype", "f32", "--prompts", str(work / "prompts.jsonl"),
               "--out", str(work / "out.jsonl"), "--temperature", "0"]
    if args.lock:
        command = ["flock", args.lock, *command]
    print("$ " + " ".join(command), file=sys.stderr)
    subprocess.run(command, check=True)
    engine = {json.loads(l)["id"]: json.loads(l)["tokens"] for l in (work / "out.jsonl").read_text().splitlines()}
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    equal = 0
    for r, ids in zip(schemas, prompts):
        mask = SchemaMask(r["schema"], token_bytes, stop_ids)
        ref, steps = reference_decode(model, ids, mask, args.max_tokens)
        ours = engine[r["id"]][:args.max_tokens]
        if ours == ref:
            equal += 1
            margins = [(a - b) / max(abs(a), 1e-30) for a, b, _ in steps if b is not None]
            print(f"{r['id']}: equal, {len(ref)} tokens (smallest relative margin {min(margins):.2e})")
            continue
        k = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
        if k >= len(steps) or k >= len(ours):
            print(f"{r['id']}: lengths differ: flexh2o {len(ours)} tokens, reference {len(ref)} (equal up to there)")
            continue
        best, second, logits = steps[k]
        theirs = logits[ours[k]].item()
        rel = (best - theirs) / max(abs(best), 1e-30)
        kind = "a near-tie" if rel < 1e-4 else "A DIFFERENCE"
        print(f"{r['id']}: {kind} at step {k} of {len(ref)}: reference {ref[k]} ({tok.decode([ref[k]])!r}, logit {best:.6f}), "
              f"flexh2o {ours[k]} ({tok.decode([ours[k]])!r}, logit {theirs:.6f}, allowed by the reference: "
              f"{mask.allowed(b''.join(token_bytes[t] for t in ref[:k]), ours[k])}); relative margin {rel:.2e}")
    print(f"{equal} of {len(schemas)} equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
