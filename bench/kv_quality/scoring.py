"""The scoring rule and the CSV both engines' evals write (issue 61's peer harness).

Rule: an answer is correct when the expected answer occurs in the generated text as a whole
word (not inside a longer number or word), case-insensitively. Generation is greedy and capped
by the request's max_tokens (12 for digits, 8 for words), so the answer must come first.
"""
import csv
import json
import math
import os
import re
from collections import defaultdict

CSV_COLUMNS = ["method", "kept", "task", "length", "n", "correct", "accuracy",
               "wilson95_lo", "wilson95_hi", "kl", "top1"]


def is_correct(generated, answer):
    pattern = r"(?<![0-9A-Za-z])" + re.escape(answer) + r"(?![0-9A-Za-z])"
    return re.search(pattern, generated, flags=re.IGNORECASE) is not None


def wilson(correct, n, z=1.959964):
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return float("nan"), float("nan")
    p = correct / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def eos_ids(model_dir):
    """The model's end-of-sequence ids (its generation_config.json)."""
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    return set(eos if isinstance(eos, list) else [eos])


def until_eos(tokens, eos):
    """The tokens up to and including the first end-of-sequence id."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def accuracy_rows(results, answers, engine):
    """results: dicts with method, kept, id, text. answers: id -> answer record.
    Rows are named engine/method (e.g. kvpress/snapkv, flexh2o/h2o)."""
    cells = defaultdict(lambda: [0, 0])
    for r in results:
        a = answers[r["id"]]
        cell = cells[(r["method"], r["kept"], a["task"], a["length"])]
        cell[0] += 1
        cell[1] += is_correct(r["text"], a["answer"])
    rows = []
    for (method, kept, task, length), (n, correct) in sorted(cells.items()):
        lo, hi = wilson(correct, n)
        rows.append({"method": f"{engine}/{method}", "kept": kept, "task": task, "length": length, "n": n,
                     "correct": correct, "accuracy": round(correct / n, 4),
                     "wilson95_lo": round(lo, 4), "wilson95_hi": round(hi, 4), "kl": "", "top1": ""})
    return rows


def fidelity_row(engine, method, kept, length, n_items, kl, top1):
    return {"method": f"{engine}/{method}", "kept": kept, "task": "fidelity", "length": length, "n": n_items,
            "correct": "", "accuracy": "", "wilson95_lo": "", "wilson95_hi": "",
            "kl": round(kl, 5), "top1": round(top1, 4)}


def add_common_args(ap, kept_help=None):
    """The arguments both engines' evals take: the model, tasks and output dirs, what to run."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--tasks-dir", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--kept", default="0.1,0.25", help=kept_help)
    ap.add_argument("--tasks", default="passkey,multikey,docqa,fidelity")
    ap.add_argument("--lengths", default="1000,2000,4000")
    ap.add_argument("--limit", type=int, default=10 ** 9, help="at most this many prompts per task and length")


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
