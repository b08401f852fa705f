#!/usr/bin/env python3
"""What transformers makes of tiny-llama.gguf's tokenizer (tokenizer.ggml.model "llama": the
stories260K vocabulary with scores, byte tokens, add_bos true, add_space_prefix true).

Writes tests/data/gguf/tiny-llama.tokenizer-cases.jsonl: for every text of
tests/data/tokenizers/cases-qwen2.jsonl (the shared sample of stories, wiki, Shakespeare and
edge cases) plus the llama-specific edge cases below, one line
  {"text", "ids", "ids_with_special", "decoded"}
with AutoTokenizer.from_pretrained(dir, gguf_file="tiny-llama.gguf"):
  ids = encode(text, add_special_tokens=False), ids_with_special = encode(text),
  decoded = decode(ids, skip_special_tokens=False).

    /work/venvs/tf5/bin/python tests/gguf_fixtures/make_gguf_tokenizer_cases.py
Deterministic: a rerun with transformers 5.23.0 / tokenizers 0.23 gives the same file.
"""
import json
import os
import sys

import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
EXTRA = [
    "<s>Once upon a time</s> there was <unk> a cat.",
    "Lily said, \"<s>\" and then ran.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "tab\there and\nnewline",
    "",
]


def main():
    out = os.path.join(DATA, "gguf", "tiny-llama.tokenizer-cases.jsonl")
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(DATA, "gguf"), gguf_file="tiny-llama.gguf")
    with open(os.path.join(DATA, "tokenizers", "cases-qwen2.jsonl"), encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    texts += EXTRA
    with open(out, "w", encoding="utf-8") as f:
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False)
            f.write(json.dumps({
                "text": text,
                "ids": ids,
                "ids_with_special": tok.encode(text),
                "decoded": tok.decode(ids, skip_special_tokens=False),
            }, ensure_ascii=False) + "\n")
    print(f"wrote {len(texts)} cases to {out} ({type(tok).__name__}, transformers {transformers.__version__})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
