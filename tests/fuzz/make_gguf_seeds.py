#!/usr/bin/env python3
"""Seed files for the GGUF fuzz target (tests/fuzz/gguf_fuzz.cc): small, valid GGUF files
that reach every branch of the reader and of the metadata -> config mapping (one per
architecture, RoPE factor tensors, a fused Phi-3 layer, quantized and float tensors, metadata
of every value type). Random values; the fuzzer only needs their structure.

usage: python make_gguf_seeds.py [OUT_DIR]     # needs: gguf, numpy (e.g. /work/venvs/gguf)
OUT_DIR defaults to tests/fuzz/corpus-gguf beside this file. Deterministic (fixed seed).
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

H, F, V, HEADS, KV = 32, 64, 8, 2, 1
HD = H // HEADS


def matrix(rng, rows, cols, qtype):
    x = rng.normal(0, 0.2, (rows, cols)).astype(np.float32)
    if qtype in (QT.F32,):
        return x, None
    if qtype == QT.F16:
        return x.astype(np.float16), None
    return gguf.quants.quantize(x, qtype), qtype


def write(path, arch, layers, extra_kv, tensors):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if arch.startswith("qwen"):
        # byte-level BPE (tokenizer.ggml.model "gpt2") behind Qwen2's pre-tokenizer
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(["<unk>", "<s>", "</s>", "a", "b", "\u0120", "\u0120a", "ab"])
        w.add_token_merges(["\u0120 a", "a b"])
        w.add_token_types([2, 3, 3, 1, 1, 1, 1, 4])
    else:
        w.add_tokenizer_model("llama")
        w.add_token_list(["<unk>", "<s>", "</s>", "a", "b", "\u2581a", "ab", "ba"])
        w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0])
        w.add_token_types([2, 3, 3, 1, 1, 1, 1, 1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for fn in extra_kv:
        fn(w)
    for name, (data, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def layer(rng, i, qtype, fused=False, qk_norm=False, bias=False, sandwich=False):
    p = f"blk.{i}."
    t = {p + "attn_norm.weight": (np.ones(H, np.float32), None),
         p + "ffn_norm.weight": (np.ones(H, np.float32), None),
         p + "attn_output.weight": matrix(rng, H, HEADS * HD, qtype),
         p + "ffn_down.weight": matrix(rng, H, F, qtype)}
    if fused:
        t[p + "attn_qkv.weight"] = matrix(rng, (HEADS + 2 * KV) * HD, H, qtype)
        t[p + "ffn_up.weight"] = matrix(rng, 2 * F, H, qtype)
    else:
        t[p + "attn_q.weight"] = matrix(rng, HEADS * HD, H, qtype)
        t[p + "attn_k.weight"] = matrix(rng, KV * HD, H, qtype)
        t[p + "attn_v.weight"] = matrix(rng, KV * HD, H, qtype)
        t[p + "ffn_gate.weight"] = matrix(rng, F, H, qtype)
        t[p + "ffn_up.weight"] = matrix(rng, F, H, qtype)
    if qk_norm:
        t[p + "attn_q_norm.weight"] = (np.ones(HD, np.float32), None)
        t[p + "attn_k_norm.weight"] = (np.ones(HD, np.float32), None)
    if bias:
        for n, rows in (("attn_q", HEADS * HD), ("attn_k", KV * HD), ("attn_v", KV * HD)):
            t[p + n + ".bias"] = (np.zeros(rows, np.float32), None)
    if sandwich:
        t[p + "post_attention_norm.weight"] = (np.ones(H, np.float32), None)
        t[p + "post_ffw_norm.weight"] = (np.ones(H, np.float32), None)
    return t


def common(rng, qtype, tied=False):
    t = {"token_embd.weight": matrix(rng, V, H, qtype), "output_norm.weight": (np.ones(H, np.float32), None)}
    if not tied:
        t["output.weight"] = matrix(rng, V, H, QT.F16)
    return t


def main() -> int:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus-gguf"))
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    pairs = np.ones(HD // 2, np.float32)

    t = common(rng, QT.Q8_0) | layer(rng, 0, QT.Q4_1) | layer(rng, 1, QT.Q4_0)
    t["rope_freqs.weight"] = (pairs * 2, None)
    write(os.path.join(out, "llama3.gguf"), "llama", 2, [], t)

    t = common(rng, QT.F16, tied=True) | layer(rng, 0, QT.Q8_0, bias=True)
    write(os.path.join(out, "qwen2-yarn.gguf"), "qwen2", 1,
          [lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN), lambda w: w.add_rope_scaling_factor(4.0),
           lambda w: w.add_rope_scaling_orig_ctx_len(16)], t)

    t = common(rng, QT.F32) | layer(rng, 0, QT.F32, qk_norm=True)
    write(os.path.join(out, "qwen3.gguf"), "qwen3", 1, [lambda w: w.add_key_length(HD), lambda w: w.add_value_length(HD)], t)

    t = common(rng, QT.F16) | layer(rng, 0, QT.Q5_1, fused=True)
    t["rope_factors_long.weight"] = (pairs * 3, None)
    t["rope_factors_short.weight"] = (pairs, None)
    write(os.path.join(out, "phi3-longrope.gguf"), "phi3", 1,
          [lambda w: w.add_rope_scaling_orig_ctx_len(16), lambda w: w.add_rope_scaling_attn_factors(1.19),
           lambda w: w.add_sliding_window(8)], t)

    t = common(rng, QT.BF16, tied=True) | layer(rng, 0, QT.Q5_0, sandwich=True) | layer(rng, 1, QT.Q5_0, sandwich=True)
    write(os.path.join(out, "gemma2.gguf"), "gemma2", 2,
          [lambda w: w.add_attn_logit_softcapping(50.0), lambda w: w.add_final_logit_softcapping(30.0),
           lambda w: w.add_sliding_window(8), lambda w: w.add_key_length(HD), lambda w: w.add_value_length(HD)], t)

    w = gguf.GGUFWriter(os.path.join(out, "values.gguf"), "flexh2o-test")
    w.add_uint8("u8", 1); w.add_int8("i8", -1); w.add_uint16("u16", 2); w.add_int16("i16", -2)
    w.add_uint32("u32", 3); w.add_int32("i32", -3); w.add_uint64("u64", 4); w.add_int64("i64", -4)
    w.add_float32("f32", 0.5); w.add_float64("f64", 0.25); w.add_bool("b", True); w.add_string("s", "x")
    w.add_array("a.i32", [1, 2]); w.add_array("a.s", ["p", "q"]); w.add_array("a.a", [[1], [2, 3]])
    for name, q in (("k2", QT.Q2_K), ("k3", QT.Q3_K), ("k4", QT.Q4_K), ("k5", QT.Q5_K), ("k6", QT.Q6_K)):
        x = rng.integers(0, 256, (1, gguf.GGML_QUANT_SIZES[q][1]), dtype=np.uint8)  # one random block
        w.add_tensor(name, x, raw_shape=x.shape, raw_dtype=q)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    for f in sorted(os.listdir(out)):
        print(f, os.path.getsize(os.path.join(out, f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
