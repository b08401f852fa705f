#!/usr/bin/env python3
"""Expected encodings of a tokenizer.json, for flexh2o's tokenizer tests.

usage: make_tokenizer_cases.py [--skip-special-tokens] TOKENIZER_JSON TEXTS_JSONL OUT_JSONL

TEXTS_JSONL is any jsonl with a "text" field per line (for example
shared/data/tokenizers/cases-qwen2.jsonl); its texts are kept in order. Each output
line is {"text", "ids", "ids_with_special", "decoded"}, made with the Hugging Face
`tokenizers` library:
  ids              = encode(text, add_special_tokens=False).ids
  ids_with_special = encode(text).ids            (the file's post-processor, e.g. a BOS)
  decoded          = decode(ids, skip_special_tokens=False)
The format matches shared/data/tokenizers/cases-*.jsonl (json.dumps, ensure_ascii=False);
those files keep special tokens in "decoded" (e.g. "<|endoftext|>  and <|im_start|>user",
"<unk>  <0x41>"), i.e. skip_special_tokens=False, and this script reproduces
cases-qwen2.jsonl, cases-phi3.jsonl and cases-phi3-metaspace.jsonl byte for byte that way.
--skip-special-tokens gives the `tokenizers` default (drop them) instead.
"""
import json
import sys

import tokenizers
from tokenizers import Tokenizer


def main() -> int:
    args = sys.argv[1:]
    skip = "--skip-special-tokens" in args
    args = [a for a in args if a != "--skip-special-tokens"]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    tok_path, texts_path, out_path = args
    tok = Tokenizer.from_file(tok_path)
    with open(texts_path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    with open(out_path, "w", encoding="utf-8", newline="\n") as out:
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            row = {
                "text": text,
                "ids": ids,
                "ids_with_special": tok.encode(text).ids,
                "decoded": tok.decode(ids, skip_special_tokens=skip),
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(texts)} cases to {out_path} (tokenizers {tokenizers.__version__})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
