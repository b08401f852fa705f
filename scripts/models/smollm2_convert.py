#!/usr/bin/env python3
"""Load a GGUF file with transformers (dequantized to fp32) and save it as a
Hugging Face model directory (model + tokenizer), i.e. what the running
transformers version writes with save_pretrained.

usage: smollm2_convert.py GGUF_PATH OUT_DIR

Used by make_smollm2.sh, once under transformers 5.x and once under 4.57.
"""
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    gguf_path, out_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    src_dir, gguf_name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    print(f"transformers {transformers.__version__}: loading {gguf_path}", flush=True)
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_name, dtype=torch.float32) \
        if int(transformers.__version__.split(".")[0]) >= 5 else \
        AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_name, torch_dtype=torch.float32)
    model.eval()
    # transformers 5 marks a GGUF-loaded model as "quantized" (GgufHfQuantizer) even when
    # every weight was dequantized at load time (llama goes through the legacy dequantizing
    # loader), and then refuses save_pretrained. The weights are plain fp32 tensors: drop
    # the quantizer and the config's quantization_config so the dir loads as a plain model.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    assert all(p.dtype == torch.float32 for p in model.parameters())
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    print(f"saved {out_dir}: {sorted(os.listdir(out_dir))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
