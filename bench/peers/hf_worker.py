"""One peer system run: PyTorch eager (fp32 or bf16) or HF Accelerate with disk offload.

Runs in the harness venv, in its own process (the harness puts it in the memory cgroup).
Greedy `model.generate` over the prompts in batches, exactly --gen-len new tokens each;
writes the generated tokens (JSONL, like flexh2o's --out) and a JSON of timings. Only the
generate calls are timed; loading is timed separately.
"""

import argparse
import json
import re
import time

import torch
import transformers

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
UNITS = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 600MiB)")
    return int(float(m.group(1)) * UNITS[m.group(2) or ""])


def cpu_budget_for_disk_fraction(checkpoint, dtype, fraction):
    """The cpu budget for which Accelerate's auto map puts closest to `fraction` of the weight bytes on disk."""
    import accelerate  # here, not at the top: the eager systems run without it

    config = transformers.AutoConfig.from_pretrained(checkpoint)
    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    total = sum(p.numel() * p.element_size() for p in model.parameters())

    def disk_fraction(budget):
        device_map = accelerate.infer_auto_device_map(model, max_memory={"cpu": budget}, dtype=dtype,
                                                      no_split_module_classes=model._no_split_modules)
        return disk_bytes(model, device_map) / total

    # The fraction is not monotonic in the budget (a small budget sends the whole model to disk), so scan.
    budgets = [total * i // 100 for i in range(1, 100)]
    return min(budgets, key=lambda b: (abs(disk_fraction(b) - fraction), -b))


def disk_bytes(model, device_map):
    on_disk = [name for name, device in device_map.items() if device == "disk"]
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters()
               if any(m == "" or name == m or name.startswith(m + ".") for m in on_disk))


def load(a):
    dtype = DTYPES[a.dtype]
    if a.system == "eager":
        return transformers.AutoModelForCausalLM.from_pretrained(a.checkpoint, dtype=dtype), {}
    if a.cpu_mem.startswith("disk:"):
        budget = cpu_budget_for_disk_fraction(a.checkpoint, dtype, float(a.cpu_mem[len("disk:"):]))
    else:
        budget = parse_bytes(a.cpu_mem)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        a.checkpoint, dtype=dtype, device_map="auto", max_memory={"cpu": budget}, offload_folder=a.offload_folder)
    device_map = model.hf_device_map
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return model, {"accelerate_cpu_budget": budget,
                   "modules_on_disk": sum(1 for d in device_map.values() if d == "disk"),
                   "modules": len(device_map),
                   "weight_fraction_on_disk": disk_bytes(model, device_map) / total}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--system", choices=["eager", "accelerate"], required=True)
    p.add_argument("--checkpoint", required=True, help="Hugging Face checkpoint directory")
    p.add_argument("--prompts", required=True, help='JSONL of {"id", "tokens"}, all of one length')
    p.add_argument("--gen-len", type=int, required=True, help="new tokens per prompt")
    p.add_argument("--batch", type=int, required=True, help="prompts per generate call")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="compute and weight dtype")
    p.add_argument("--threads", type=int, required=True, help="torch.set_num_threads")
    p.add_argument("--cpu-mem", default="disk:0.7",
                   help="accelerate: max_memory for the cpu, a size (600MiB) or disk:F = the budget that leaves "
                        "closest to a fraction F of the weight bytes on disk")
    p.add_argument("--offload-folder", help="accelerate: offload_folder")
    p.add_argument("--out", required=True, help="generated tokens, JSONL {id, tokens}")
    p.add_argument("--metrics", required=True, help="timings JSON")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    with open(a.prompts) as f:
        prompts = [json.loads(line) for line in f if line.strip()]

    start = time.perf_counter()
    model, placement = load(a)
    model.eval()
    load_seconds = time.perf_counter() - start

    generate_seconds = 0.0
    generated = 0
    with open(a.out, "w") as out, torch.inference_mode():
        for first in range(0, len(prompts), a.batch):
            chunk = prompts[first:first + a.batch]
            ids = torch.tensor([q["tokens"] for q in chunk], dtype=torch.long)
            start = time.perf_counter()
            result = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    num_beams=1, max_new_tokens=a.gen_len, min_new_tokens=a.gen_len,
                                    pad_token_id=model.config.pad_token_id or 0)
            generate_seconds += time.perf_counter() - start
            new = result[:, ids.shape[1]:]
            generated += new.numel()
            for q, tokens in zip(chunk, new.tolist()):
                out.write(json.dumps({"id": q["id"], "tokens": tokens}) + "\n")

    with open(a.metrics, "w") as f:
        json.dump({"load_seconds": load_seconds, "generate_seconds": generate_seconds, "generated_tokens": generated,
                   "batch": a.batch, "dtype": a.dtype, "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "transformers": transformers.__version__, **placement}, f, indent=2)


if __name__ == "__main__":
    main()
