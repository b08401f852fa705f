#!/usr/bin/env python3
"""Transformers' answers to a few chat requests on SmolLM2-135M-Instruct, for flexh2o's
OpenAI-batch parity test (tests/engine/test_openai_batch_smollm2.cc).

Writes tests/data/smollm2/chat_expected.json. Needs smollm2-135m-v5/ made by
scripts/models/make_smollm2.sh. Run with the transformers 5.x interpreter:
    /work/venvs/tf5/bin/python tests/data/smollm2/make_chat_expected.py [--models ROOT] [--out PATH]

Per conversation (model in fp32, eager attention, CPU):
  * prompt_ids: apply_chat_template(messages, add_generation_prompt=True) rendered, then
    tokenized without added special tokens (as apply_chat_template(tokenize=True) does)
  * greedy: generate(do_sample=False, max_new_tokens=N): its new ids (stopping at EOS, as the
    model's generation_config says), their text (skip_special_tokens), and the log-softmax of
    the raw logits at each chosen token (output_logits)
  * repetition: the same with repetition_penalty=1.3
"""
import argparse
import json
import os

import torch
import transformers

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Write one sentence about the sea."}],
    [{"role": "user", "content": "List three colours."},
     {"role": "assistant", "content": "Red, green and blue."},
     {"role": "user", "content": "Three more, please."}],
    [{"role": "user", "content": "Count from one to ten in words."}],
]
N_NEW = 24


def run(model, tok, ids, **kw):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=N_NEW, output_logits=True,
                             return_dict_in_generate=True, **kw)
    new = [int(t) for t in out.sequences[0, len(ids):]]
    logprobs = []
    for step, t in enumerate(new):
        lp = torch.log_softmax(out.logits[step][0].float(), dim=-1)
        logprobs.append(round(float(lp[t]), 6))
    return {"ids": new, "text": tok.decode(new, skip_special_tokens=True), "logprobs": logprobs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=os.environ.get("FLEXH2O_MODELS", os.path.expanduser("~/.cache/flexh2o/models")))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_expected.json"))
    a = ap.parse_args()
    path = os.path.join(a.models, "smollm2-135m-v5")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    cases = []
    for messages in CONVERSATIONS:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({"messages": messages, "prompt_text": text, "prompt_ids": ids, "greedy": run(model, tok, ids),
                      "repetition_penalty": 1.3, "repetition": run(model, tok, ids, repetition_penalty=1.3)})
    with open(a.out, "w") as f:
        json.dump({"model": "smollm2-135m-v5", "transformers": transformers.__version__, "torch": torch.__version__,
                   "max_new_tokens": N_NEW, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
