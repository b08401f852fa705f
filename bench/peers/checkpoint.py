"""Write a random-weight Hugging Face checkpoint with transformers' save_pretrained.

Runs in the harness venv. The shapes are those of the published models; the weights are
transformers' own random initialisation, seeded.
"""

import argparse
import json
import os
import shutil
import sys

import torch
import transformers

# Shapes of published models (config.json fields; everything else is transformers' default).
PRESETS = {
    "opt-125m": ("opt", dict(hidden_size=768, ffn_dim=3072, num_hidden_layers=12, num_attention_heads=12,
                             word_embed_proj_dim=768, vocab_size=50272, max_position_embeddings=2048)),
    "opt-1.3b": ("opt", dict(hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
                             word_embed_proj_dim=2048, vocab_size=50272, max_position_embeddings=2048)),
    "opt-6.7b": ("opt", dict(hidden_size=4096, ffn_dim=16384, num_hidden_layers=32, num_attention_heads=32,
                             word_embed_proj_dim=4096, vocab_size=50272, max_position_embeddings=2048)),
    # Llama-3.2-1B's dimensions (default RoPE: the scaling does not change the cost).
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                               max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=True,
                               bos_token_id=128000, eos_token_id=128001)),
    # The same with SmolLM2's 49152-token vocabulary and special ids: convert_hf_to_gguf.py needs a
    # tokenizer, and SmolLM2's is the one at hand (1.07 G parameters, as issue 32 measured).
    "llama-1b-smol": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                    num_attention_heads=32, num_key_value_heads=8, vocab_size=49152,
                                    max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=True,
                                    bos_token_id=1, eos_token_id=2)),
    "tinyllama-1.1b": ("llama", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                     num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                     max_position_embeddings=2048, rms_norm_eps=1e-5)),
}

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def make_config(preset, config_json):
    if config_json:
        with open(config_json) as f:
            fields = json.load(f)
        return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    model_type, fields = PRESETS[preset]
    return transformers.AutoConfig.for_model(model_type, **fields)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="checkpoint directory to write (replaced if present)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="opt-1.3b", help="model shape")
    p.add_argument("--config-json", help="a config.json to instantiate instead of a preset")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="f16", help="dtype of the stored weights")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    a = p.parse_args()

    torch.manual_seed(a.seed)
    config = make_config(a.preset, a.config_json)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=DTYPES[a.dtype])
    tmp = a.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(a.out, ignore_errors=True)
    os.rename(tmp, a.out)
    params = sum(t.numel() for t in model.parameters())
    print(f"wrote {a.out}: {config.model_type}, {params / 1e9:.2f}B parameters, {a.dtype}", file=sys.stderr)


if __name__ == "__main__":
    main()
