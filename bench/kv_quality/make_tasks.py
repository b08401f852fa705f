#!/usr/bin/env python3
"""Long-context tasks for KV eviction (issue 61), as flexh2o prompt JSONL.

Writes, under OUT_DIR:
  tasks.jsonl     {"id", "tokens", "max_tokens"} per line: what `flexh2o run --prompts` accepts
                  (the engine refuses other fields, so the scorer's fields live apart)
  answers.jsonl   {"id", "task", "length", "depth", "answer", "n_tokens"} per line
  fidelity.jsonl  {"id", "length", "context", "continuation"} (token ids) per line
  fidelity_<L>.txt  the same texts, one paragraph each, for `flexh2o eval --prefill L`

Tasks (question tasks use SmolLM2's chat template, the answer's lead-in ends the prompt):
  passkey   a 5-6 digit pass key hidden at depth 10/50/90% of a haystack
  multikey  --keys (2) "The value of key <word> is <number>." lines at random depths; one is asked
  docqa     3 facts about each of --people (1) people at random depths; one fact is asked
  fidelity  a long text (--fidelity-text: Wikipedia by default): L context tokens, then
            `--continuation` teacher-forced tokens

usage: make_tasks.py --model MODEL_DIR --out OUT_DIR [--lengths 1000,2000,4000] [--per-cell 100]
"""
import argparse
import json
import os
import random
import re

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data", "text"))

PASSKEY_DEPTHS = (0.1, 0.5, 0.9)
KEY_WORDS = ["apple", "river", "candle", "pencil", "garden", "window", "tiger", "rocket", "violin",
             "castle", "mirror", "island", "button", "ladder", "planet", "basket", "anchor", "feather",
             "lemon", "marble", "orange", "silver", "tunnel", "wallet"]
NAMES = ["Lena", "Marcus", "Priya", "Oskar", "Amara", "Tobias", "Yuki", "Diego", "Hanna", "Felix",
         "Nadia", "Rafael", "Ingrid", "Kofi", "Selma", "Victor"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Toronto", "Kyoto", "Dublin", "Lima", "Prague", "Seoul",
          "Madrid", "Cairo", "Vienna", "Sydney", "Helsinki", "Manila", "Warsaw"]
JOBS = ["baker", "pilot", "dentist", "farmer", "teacher", "plumber", "painter", "lawyer", "nurse",
        "chef", "carpenter", "librarian", "firefighter", "jeweler", "tailor", "surgeon"]
PETS = ["parrot", "turtle", "rabbit", "hamster", "goldfish", "lizard", "ferret", "pony", "snake",
        "canary", "goat", "hedgehog"]
MOJIBAKE = [("\u00e2\u20ac\u0153", '"'), ("\u00e2\u20ac\u009d", '"'), ("\u00e2\u20ac\u2122", "'"),
            ("\u00e2\u20ac\u02dc", "'"), ("\u00e2\u20ac\u201d", "-"), ("\u00e2\u20ac\u201c", "-"),
            ("\u00e2\u20ac\u00a6", "..."), ("\u00e2\u20ac", '"')]
INTRO = ("There is important information hidden inside a lot of irrelevant text. "
         "Find it and memorize it. I will quiz you about the important information there.")


# ---------------------------------------------------------------- text sources

def clean_wikitext(text):
    """Undo wikitext-2's tokenization (' @-@ ', ' , ') and drop headings and <unk>."""
    lines = [l.strip() for l in text.splitlines()]
    lines = [l for l in lines if l and not l.startswith("=")]
    out = " ".join(lines).replace("<unk>", "")
    for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" ,", ","), (" .", "."),
                 (" ;", ";"), (" :", ":"), (" 's", "'s"), ("( ", "("), (" )", ")")):
        out = out.replace(a, b)
    return re.sub(r"\s+", " ", out)


def load_text(source):
    path = os.path.join(TEXT_DIR, {"tinystories": "tinystories_val.txt", "wikitext": "wikitext2_test.txt",
                                   "shakespeare": "tinyshakespeare.txt"}[source])
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if source == "wikitext":
        return clean_wikitext(text)
    for bad, good in MOJIBAKE:  # tinystories_val.txt has UTF-8 quotes read as cp1252
        text = text.replace(bad, good)
    return re.sub(r"\s+", " ", text)


def split_sentences(text):
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


class Haystack:
    """Sentences of a text with their token counts, to cut documents of a token length."""

    def __init__(self, tok, source):
        self.sentences = split_sentences(load_text(source))
        enc = tok([" " + s for s in self.sentences], add_special_tokens=False)["input_ids"]
        self.lengths = [len(ids) for ids in enc]

    def take(self, rng, n_tokens):
        """Consecutive sentences from a random start, about n_tokens long in all."""
        i = rng.randrange(len(self.sentences))
        out, total = [], 0
        while total < n_tokens:
            out.append(self.sentences[i])
            total += self.lengths[i]
            i = (i + 1) % len(self.sentences)
        return out


# ---------------------------------------------------------------- prompts

def insert_at_depths(sentences, inserts):
    """inserts: (depth in [0, 1], sentence). Each goes between haystack sentences."""
    out = list(sentences)
    for depth, s in sorted(inserts, key=lambda x: -x[0]):  # deepest first keeps indices valid
        out.insert(round(depth * len(sentences)), s)
    return " ".join(out)


def chat_prompt(tok, document, question, lead_in):
    """Token ids of the chat prompt; the assistant turn starts with the answer's lead-in."""
    user = f"{INTRO}\n\n{document}\n\n{question}"
    text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                   add_generation_prompt=True)
    return tok.encode(text + lead_in, add_special_tokens=False)


def overhead(tok, question, lead_in):
    return len(chat_prompt(tok, "", question, lead_in))


def passkey(tok, hay, rng, length, index, opts):
    key = str(rng.randint(10000, 999999))
    depth = PASSKEY_DEPTHS[index % len(PASSKEY_DEPTHS)]
    # The lead-in ends in the space the needle has before its digits (its own token), so the
    # next token must be a digit: the tiny model otherwise answers with a made-up phrase.
    question, lead = "What is the pass key?", "The pass key is "
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    doc = insert_at_depths(hay.take(rng, length - overhead(tok, question, lead) - 25), [(depth, needle)])
    return chat_prompt(tok, doc, question, lead), key, depth, 12


def multikey(tok, hay, rng, length, index, opts):
    n_keys = opts.keys
    words = rng.sample(KEY_WORDS, n_keys)
    values = [str(rng.randint(10000, 999999)) for _ in words]
    asked = rng.randrange(n_keys)
    depths = [rng.random() for _ in words]
    question = f"What is the value of key {words[asked]}?"
    lead = f"The value of key {words[asked]} is "
    lines = [(d, f"The value of key {w} is {v}.") for d, w, v in zip(depths, words, values)]
    doc = insert_at_depths(hay.take(rng, length - overhead(tok, question, lead) - 12 * n_keys), lines)
    return chat_prompt(tok, doc, question, lead), values[asked], depths[asked], 12


def docqa(tok, hay, rng, length, index, opts):
    people = rng.sample(NAMES, opts.people)
    facts, asks = [], []
    for name in people:
        city, job, pet = rng.choice(CITIES), rng.choice(JOBS), rng.choice(PETS)
        facts += [f"{name} lives in the city of {city}.", f"{name} works as a {job}.",
                  f"{name} has a pet {pet}."]
        asks += [(f"In which city does {name} live?", f"{name} lives in the city of", city),
                 (f"What is {name}'s job?", f"{name} works as a", job),
                 (f"What pet does {name} have?", f"{name} has a pet", pet)]
    k = rng.randrange(len(asks))
    question, lead, answer = asks[k]
    depths = [rng.random() for _ in facts]
    doc = insert_at_depths(hay.take(rng, length - overhead(tok, question, lead) - 10 * len(facts)),
                           list(zip(depths, facts)))
    return chat_prompt(tok, doc, question, lead), answer, depths[k], 8


TASKS = {"passkey": passkey, "multikey": multikey, "docqa": docqa}


# ---------------------------------------------------------------- fidelity

def fidelity_items(tok, text, rng, length, count, continuation):
    """count (text, ids) of about `length + continuation` tokens from random sentence starts.

    ids are what `flexh2o eval` feeds for the text as a paragraph: the tokenizer's encoding with
    its special tokens (BOS first), which equals the engine's (checked with `flexh2o tokenize`).
    """
    starts = [m.end() for m in re.finditer(r"[.!?] ", text)]
    items = []
    while len(items) < count:
        start = rng.choice(starts)
        rough = tok.encode(text[start:start + 8 * (length + continuation)], add_special_tokens=False)
        para = tok.decode(rough[:length + continuation]).replace("\n", " ").strip()
        ids = tok.encode(para, add_special_tokens=True)
        if len(ids) > length + continuation // 2:
            items.append((para, ids))
    return items


def write_fidelity(tok, out_dir, lengths, per_cell, continuation, seed, source="wikitext"):
    text = load_text(source)
    with open(os.path.join(out_dir, "fidelity.jsonl"), "w") as f:
        for length in lengths:
            rng = random.Random(f"{seed}-fidelity-{length}")
            items = fidelity_items(tok, text, rng, length, per_cell, continuation)
            with open(os.path.join(out_dir, f"fidelity_{length}.txt"), "w") as ft:
                for i, (para, ids) in enumerate(items):
                    f.write(json.dumps({"id": f"fidelity-{length}-{i}", "length": length,
                                        "context": ids[:length], "continuation": ids[length:]}) + "\n")
                    # One paragraph per item: the engine splits its --text on blank lines.
                    ft.write(para + "\n\n")


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF model directory (its tokenizer is used)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--lengths", default="1000,2000,4000", help="prompt lengths in tokens")
    ap.add_argument("--per-cell", type=int, default=100, help="prompts per task and length")
    ap.add_argument("--tasks", default="passkey,multikey,docqa,fidelity")
    ap.add_argument("--haystack", default="tinystories", choices=["tinystories", "wikitext", "shakespeare"])
    ap.add_argument("--continuation", type=int, default=128, help="fidelity: teacher-forced tokens")
    ap.add_argument("--fidelity-text", default="wikitext", choices=["tinystories", "wikitext", "shakespeare"],
                    help="fidelity: the text the spans are cut from (issue 61's KL table: tinystories)")
    ap.add_argument("--keys", type=int, default=2, help="multikey: key-value lines per prompt (3: 70%%, 4: 65%% uncompressed at 1000)")
    ap.add_argument("--people", type=int, default=1, help="docqa: people with 3 facts each (2: 75%% uncompressed at 1000)")
    ap.add_argument("--seed", type=int, default=61)
    args = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    lengths = [int(x) for x in args.lengths.split(",")]
    tasks = args.tasks.split(",")
    os.makedirs(args.out, exist_ok=True)
    hay = Haystack(tok, args.haystack)
    n = 0
    with open(os.path.join(args.out, "tasks.jsonl"), "w") as ft, \
            open(os.path.join(args.out, "answers.jsonl"), "w") as fa:
        for task in [t for t in tasks if t in TASKS]:
            for length in lengths:
                # One generator per (task, length): a cell does not change when others are added.
                rng = random.Random(f"{args.seed}-{task}-{length}")
                for i in range(args.per_cell):
                    ids, answer, depth, max_tokens = TASKS[task](tok, hay, rng, length, i, args)
                    rid = f"{task}-{length}-{i}"
                    ft.write(json.dumps({"id": rid, "tokens": ids, "max_tokens": max_tokens}) + "\n")
                    fa.write(json.dumps({"id": rid, "task": task, "length": length, "depth": round(depth, 3),
                                         "answer": answer, "n_tokens": len(ids)}) + "\n")
                    n += 1
    if "fidelity" in tasks:
        write_fidelity(tok, args.out, lengths, args.per_cell, args.continuation, args.seed, args.fidelity_text)
    print(f"wrote {n} question prompts (+ fidelity: {'fidelity' in tasks}) to {args.out}")


if __name__ == "__main__":
    main()
