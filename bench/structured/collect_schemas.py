#!/usr/bin/env python3
"""Collects the real-world JSON schemas of bench/structured/schemas.jsonl from a git mirror of
JSONSchemaBench (github.com/guidance-ai/jsonschemabench, folder data/; the dataset is MIT
licensed, as its Hugging Face card epfl-dlab/JSONSchemaBench says).

The sample is reproducible: the first PER_SUBSET files by sorted name of each subset below,
at the mirror's HEAD commit, each written compactly (key order kept) with its source path.

    python bench/structured/collect_schemas.py --git-dir /path/to/jsonschemabench.git
"""
import argparse
import json
import subprocess
import sys

SUBSETS = ["Glaiveai2K", "Github_trivial", "Github_easy", "Github_medium", "Github_hard",
           "Snowplow", "Kubernetes", "WashingtonPost", "JsonSchemaStore"]
PER_SUBSET = 30


def git(git_dir, *args):
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--git-dir", required=True, help="a clone or mirror of guidance-ai/jsonschemabench")
    ap.add_argument("--out", default="bench/structured/schemas.jsonl")
    args = ap.parse_args()
    commit = git(args.git_dir, "rev-parse", "HEAD").decode().strip()
    lines = []
    for subset in SUBSETS:
        names = git(args.git_dir, "ls-tree", "--name-only", "HEAD", f"data/{subset}/").decode().split()
        for path in sorted(names)[:PER_SUBSET]:
            schema = json.loads(git(args.git_dir, "show", f"HEAD:{path}"))
            name = path.rsplit("/", 1)[1].removesuffix(".json")
            lines.append({"id": f"{subset}/{name}", "source": path, "schema": schema})
    with open(args.out, "w") as f:
        f.write(json.dumps({"manifest": {
            "repository": "https://github.com/guidance-ai/jsonschemabench", "commit": commit,
            "license": "MIT (the dataset card of huggingface.co/datasets/epfl-dlab/JSONSchemaBench); "
                       "the schemas themselves were collected from public sources (json-schema-corpus, "
                       "Kubernetes, GlaiveAI function-calling, Snowplow, Washington Post ARC, SchemaStore)",
            "selection": f"the first {PER_SUBSET} files by sorted name of data/<subset>/ for each subset",
            "subsets": SUBSETS, "count": len(lines)}}) + "\n")
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{args.out}: {len(lines)} schemas from {commit}", file=sys.stderr)


if __name__ == "__main__":
    main()
