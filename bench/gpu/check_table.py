#!/usr/bin/env python3
"""The one-screen table of bench/gpu/check.sh: correctness, then the figures beside FlexGen and the
card's bounds. Usage: check_table.py WORK_DIR STEPS_TSV (check.sh's scratch folder and step list)."""
import json
import os
import re
import sys

work, steps_path = sys.argv[1:3]
steps = {}
for line in open(steps_path):
    name, rc, secs = line.rstrip("\n").split("\t")
    steps[name] = (rc, int(secs))


def text(name):
    p = os.path.join(work, name + ".txt")
    return open(p, errors="replace").read() if os.path.exists(p) else ""


def status(name):
    if name not in steps:
        return "not run"
    rc, secs = steps[name]
    return "skipped (time)" if rc == "skipped" else ("ok" if rc == "0" else f"rc {rc}") + f", {secs} s"


def last_match(pattern, s, default="-"):
    m = re.findall(pattern, s, re.M)
    return m[-1] if m else default


gpu = open(os.path.join(work, "gpu.txt")).read().strip() if os.path.exists(os.path.join(work, "gpu.txt")) else "?"
# HBM peaks (GB/s) of the cards lent: H200 4.8 TB/s, H100 SXM 3.35 TB/s.
hbm = 4800.0 if "H200" in gpu else 3350.0
print(f"# GPU check: {gpu}\n")

print("| correctness | result |\n|---|---|")
ops = text("backend_ops")
passed, failed = last_match(r"\[  PASSED  \] (\d+) tests?", ops), last_match(r"(\d+) FAILED TESTS?", ops, "0")
print(f"| test_backend_ops | {passed} passed, {failed} failed ({status('backend_ops')}) |")
for mode, ok, n, bad in re.findall(r"SUMMARY (\S+): (\d+)/(\d+) exact, (\d+) failed runs", text("hf")):
    print(f"| HF fixtures {mode} = transformers | {ok}/{n} ({bad} failed runs) |")
for name, what in [("cmp_batch", "OpenAI batch, CUDA = CPU"), ("cmp_refill", "refill (48 requests, 6 slots), CUDA = CPU"),
                   ("cmp_prefix", "shared prefixes (24 requests, 4 families), CUDA = CPU"),
                   ("cmp_prefix_copy", "shared prefixes held once = copied (CUDA)"),
                   ("cmp_graphs_fixed", "CUDA graphs on = off, OPT-1.3B fixed B 16, 64 tokens"),
                   ("cmp_graphs_cont", "CUDA graphs on = off, continuous (refill file)")]:
    same = last_match(r"SAME \w+: (\d+/\d+)", text(name))
    print(f"| {what} | {same} ({status(name)}) |")


def metrics(name):
    p = os.path.join(work, name + ".json")
    if not os.path.exists(p):
        return None
    m = json.load(open(p))
    return m.get("prefill_throughput", 0), m.get("decode_throughput", 0), m.get("total_throughput", 0)


def flexgen(name):
    s = open(os.path.join(work, name + ".log")).read() if os.path.exists(os.path.join(work, name + ".log")) else ""
    got = [float(last_match(rf"{k} throughput: ([\d.]+)", s, "0")) for k in ("prefill", "decode", "total")]
    return tuple(got) if got[2] > 0 else None


def fmt(t):
    return "-" if t is None else f"{t[0]:,.0f} / {t[1]:,.0f} / **{t[2]:,.0f}**"


print("\n| OPT-1.3B 512 + 32, in memory | flexh2o prefill / decode / total tok/s | FlexGen 0.1.8 | total ratio |")
print("|---|---|---|---|")
for b in (256, 64):
    fg = flexgen(f"flexgen_opt13_b{b}")
    for run, label in [(f"opt13_b{b}_fixed_off", f"B {b} fixed, graphs off"), (f"opt13_b{b}_fixed_on", f"B {b} fixed, graphs on")]:
        ours = metrics(run)
        ratio = f"{ours[2] / fg[2]:.2f}x" if ours and fg else "-"
        print(f"| {label} | {fmt(ours)} | {fmt(fg)} | {ratio} |")
fg = flexgen("flexgen_opt13_b256")
for run, label in [("opt13_b256_cont_on", "B 256 continuous, graphs on"), ("opt13_b256_plan", "B 256, the planner's batch")]:
    ours = metrics(run)
    ratio = f"{ours[2] / fg[2]:.2f}x" if ours and fg else "-"
    print(f"| {label} | {fmt(ours)} | {fmt(fg)} | {ratio} |")
ours, fg = metrics("opt67_30_70"), flexgen("flexgen_opt67_30_70")
ratio = f"{ours[2] / fg[2]:.2f}x" if ours and fg else "-"
print(f"| OPT-6.7B 30/70, KV on the CPU, 32 x 2 | {fmt(ours)} | {fmt(fg)} | {ratio} |")

print(f"\n| decode attention (f16 cache) | context | KV GB/s | of HBM ({hbm / 1000:.2f} TB/s) | of copy |\n|---|---|---|---|---|")
for name, shape in [("attn_opt", "256 seqs, 32 x 64 heads"), ("attn_gqa", "64 seqs, 32 q / 8 kv x 128")]:
    for row in re.findall(r"^\| f16 \| (\d+) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|(?: ([\d.]+) \| ([\d.]+) \|)?", text(name), re.M):
        ctx, gbs, _, of_copy = row
        print(f"| {shape} | {ctx} | {float(gbs):,.0f} | {float(gbs) / hbm:.0%} | {of_copy or '-'} |")
    if name not in steps or steps[name][0] != "0":
        print(f"| {shape} | | {status(name)} | | |")

# Prefill attention: FLOPs of one layer's causal 64 x 512 x 512 over 32 heads of 64 (QK^T and PV).
ncu = text("ncu_prefill")
times = [float(v.replace(",", "")) * {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3}.get(u, 1e-6)
         for u, v in re.findall(r"gpu__time_duration\.sum\s+(\S+)\s+([\d.,]+)", ncu)]
flops = 4 * 64 * 512 * 512 * 64 * 32 / 2
if times:
    t = min(times)
    print(f"\nprefill attention (bf16, 64 x 512, ncu): {t * 1e6:,.0f} us a layer, {flops / t / 1e12:.0f} TFLOP/s")
else:
    print(f"\nprefill attention (ncu): no kernel time ({status('ncu_prefill')})")
kernels = last_match(r"^kernels: (.*)$", text("opt13_b256_fixed_off"), "")
if kernels:
    print(f"\nkernels (B 256 fixed, graphs off): {kernels}")
skipped = [n for n, (rc, _) in steps.items() if rc == "skipped"]
if skipped:
    print("skipped for time: " + ", ".join(skipped))
