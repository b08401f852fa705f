"""Real peers, side by side: flexh2o, PyTorch eager (fp32, bf16) and HF Accelerate with disk offload.

Every system runs the same Hugging Face checkpoint (random weights written by transformers'
save_pretrained) on the same token-id prompts, each in its own process inside the same memory
cgroup, page cache included, with the page cache dropped before each run. Only generation is
timed (loading is reported apart); total tok/s = prompts x gen_len / generation seconds. Prints
one markdown table with ratios to a baseline measured in the same run, and writes table.md and
runs.csv (every run) to --out-dir.

This script needs only the Python standard library; torch, transformers and accelerate live in
the harness venv (--venv), which runs the checkpoint writer and the Python systems.
"""

import argparse
import csv
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

from cgroup import CgroupError
import recipes
from isolated import HarnessError, machine_line, run_isolated, wait_for_quiet
from workload import ensure_checkpoint, ensure_prompts

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SYSTEMS = ["flexh2o", "flexh2o-default", "pytorch-fp32", "pytorch-bf16", "accelerate"]
PRESETS = ["llama-1b", "llama-1b-smol", "opt-125m", "opt-1.3b", "opt-6.7b", "tinyllama-1.1b"]  # checkpoint.py's
UNITS = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
FLEXH2O_BATCH_FLAGS = ("--gpu-batch-size", "--num-gpu-batches")
# Issue 15's two comparisons; flags given on the command line override these defaults.
RECIPES = {
    "in-memory": dict(prompts=16, prompt_len=64, gen_len=32, batch=16,
                      systems="flexh2o,flexh2o-default,pytorch-fp32,pytorch-bf16", baseline="pytorch-bf16", repeat=3),
    "offloaded": dict(prompts=64, prompt_len=64, gen_len=32, mem_cap=3 * 2**30,
                      systems="flexh2o,flexh2o-default,accelerate", baseline="accelerate",
                      batches=["flexh2o=16x4,32x2,64x1", "accelerate=8,16,32,64"],
                      flexh2o_args="--percent 0 30 100 0 100 0 --cache-dtype f16 --cpu-mem 1GiB",
                      accelerate_cpu_mem="disk:0.7"),
}


def parse_bytes(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 3GiB)")
    return int(float(m.group(1)) * UNITS[m.group(2) or ""])


def format_bytes(n):
    return "-" if n is None else f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def parse_batches(specs, default):
    """{system: [batch labels]} from `SYSTEM=B1,B2` options; flexh2o labels are B or BxK."""
    batches = {s: [str(default)] for s in SYSTEMS}
    batches["flexh2o-default"] = ["own"]
    for spec in specs:
        system, _, values = spec.partition("=")
        if system not in SYSTEMS or system == "flexh2o-default" or not values:
            raise HarnessError(f"bad --batches {spec!r}: give SYSTEM=B1,B2,... for one of "
                               f"{', '.join(s for s in SYSTEMS if s != 'flexh2o-default')}")
        pattern = r"\d+(x\d+)?" if system == "flexh2o" else r"\d+"
        labels = values.split(",")
        if not all(re.fullmatch(pattern, b) for b in labels):
            raise HarnessError(f"bad --batches {spec!r}: batches are integers" +
                               (" or BxK (gpu batch x gpu batches)" if system == "flexh2o" else ""))
        batches[system] = labels
    return batches


def batch_size(label):
    """Sequences per block of a batch label (16 or 16x4)."""
    b, _, k = label.partition("x")
    return int(b) * int(k or 1)


# ---------------------------------------------------------------- venv, checkpoint, prompts

def ensure_venv(venv, explicit, work_dir):
    python = os.path.join(venv, "bin", "python")
    probe = [python, "-c", "import torch, transformers, accelerate, safetensors"]
    if os.path.exists(python) and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    if explicit:
        raise HarnessError(f"venv {venv} lacks torch, transformers, accelerate or safetensors; "
                           f"pass a working one or leave --venv out to build {os.path.join(HERE, '.venv')}")
    log = os.path.join(work_dir, "venv-install.log")
    print(f"peers: building the harness venv {venv} from PyPI (log: {log})", file=sys.stderr)
    with open(log, "w") as f:
        ok = subprocess.run([sys.executable, "-m", "venv", venv], stdout=f, stderr=f).returncode == 0 and \
            subprocess.run([python, "-m", "pip", "install", "-r", os.path.join(HERE, "requirements.txt")],
                           stdout=f, stderr=f).returncode == 0
    if not ok or subprocess.run(probe, capture_output=True).returncode != 0:
        raise HarnessError(f"cannot build the venv {venv} (pip failed, see {log}); "
                           "fix the network or pass an existing venv with --venv")
    return python


# ---------------------------------------------------------------- one run

@dataclasses.dataclass
class Run:
    system: str
    batch: str
    rep: int
    status: str = "ok"  # ok, OOM, timeout, failed
    reason: str = ""
    generate_seconds: float = 0.0
    load_seconds: float = 0.0
    generated_tokens: int = 0
    tok_s: float = 0.0
    peak_rss: int = None
    peak_cgroup: int = None
    others_cores: float = 0.0  # CPU cores other processes used during the run
    tokens_file: str = ""
    detail: str = ""


def system_command(a, system, batch, paths, out, metrics):
    """The command line of one system run, and its environment."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if system.startswith("flexh2o"):
        cmd = [a.flexh2o, "run", "--model", paths["checkpoint"], "--prompts", paths["prompts"], "--out", out,
               "--gen-len", str(a.gen_len), "--metrics", metrics]
        if system == "flexh2o":
            b, _, k = batch.partition("x")
            cmd += ["--gpu-batch-size", b, "--num-gpu-batches", k or "1"] + shlex.split(a.flexh2o_args)
        else:
            cmd += shlex.split(a.flexh2o_default_args)
        return cmd, env
    cmd = [paths["python"], os.path.join(HERE, "hf_worker.py"), "--checkpoint", paths["checkpoint"],
           "--prompts", paths["prompts"], "--gen-len", str(a.gen_len), "--batch", batch,
           "--threads", str(a.threads), "--out", out, "--metrics", metrics]
    if system == "accelerate":
        cmd += ["--system", "accelerate", "--dtype", a.accelerate_dtype, "--cpu-mem", a.accelerate_cpu_mem,
                "--offload-folder", paths["offload"]]
    else:
        cmd += ["--system", "eager", "--dtype", system.removeprefix("pytorch-")]
    return cmd, env


def read_metrics(system, metrics):
    """(generate seconds, load seconds or None, generated tokens, detail) from a system's metrics file."""
    with open(metrics) as f:
        m = json.load(f)
    if system.startswith("flexh2o"):
        pol = m["policy"]
        pct = " ".join(f"{p:g}" for p in pol["percent"])
        detail = f"gpu batch {pol['gpu_batch_size']} x {pol['num_gpu_batches']}, percent {pct}"
        return m["prefill_seconds"] + m["decode_seconds"], None, m["generated_tokens"], detail
    detail = ""
    if "modules_on_disk" in m:
        detail = (f"{m['modules_on_disk']} of {m['modules']} modules on disk, "
                  f"{100 * m['weight_fraction_on_disk']:.0f}% of the weight bytes "
                  f"(max_memory cpu {format_bytes(m['accelerate_cpu_budget'])}), {m.get('dtype', '?')}")
    return m["generate_seconds"], m["load_seconds"], m["generated_tokens"], detail


def run_system(a, paths, system, batch, rep, index):
    tag = f"{system}-b{batch}-r{rep}"
    run = Run(system, batch, rep, tokens_file=os.path.join(a.out_dir, "tokens", tag + ".jsonl"))
    metrics = os.path.join(a.out_dir, "metrics", tag + ".json")
    log = os.path.join(a.out_dir, "logs", tag + ".log")
    paths = dict(paths, offload=os.path.join(a.work_dir, "offload", tag))
    cmd, env = system_command(a, system, batch, paths, run.tokens_file, metrics)
    for path in (run.tokens_file, metrics):
        if os.path.exists(path):
            os.remove(path)
    wait_for_quiet(a.quiet_below, a.max_wait)
    try:
        outcome = run_isolated(cmd, log, a.mem_cap, f"flexh2o-peers-{os.getpid()}-{index}", env, a.timeout)
    finally:
        shutil.rmtree(paths["offload"], ignore_errors=True)
    run.others_cores, run.peak_rss, run.peak_cgroup = outcome.others_cores, outcome.peak_rss, outcome.peak_cgroup
    if outcome.status != "ok":
        run.status, run.reason = outcome.status, f"{outcome.reason} at batch {batch}"
    else:
        run.generate_seconds, load, run.generated_tokens, run.detail = read_metrics(system, metrics)
        run.load_seconds = outcome.wall_seconds - run.generate_seconds if load is None else load
        run.tok_s = a.prompts * a.gen_len / run.generate_seconds
        if run.generated_tokens != a.prompts * a.gen_len:
            run.status = "failed"
            run.reason = f"generated {run.generated_tokens} tokens, not {a.prompts} x {a.gen_len}"
    shown = f"{run.tok_s:.1f} tok/s" if run.status == "ok" else run.reason
    print(f"peers: {tag}: {shown} (log {log})", file=sys.stderr)
    return run


# ---------------------------------------------------------------- summary

def read_tokens(path):
    with open(path) as f:
        return {json.dumps(r["id"]): r["tokens"] for r in map(json.loads, f) if r}


def compare_tokens(run, reference):
    """('k/n', first differences) of run's tokens against the reference run's."""
    mine, ref = read_tokens(run.tokens_file), read_tokens(reference.tokens_file)
    same, diffs = 0, []
    for key, tokens in ref.items():
        other = mine.get(key, [])
        if other == tokens:
            same += 1
        else:
            at = next((i for i, (x, y) in enumerate(zip(other, tokens)) if x != y), min(len(other), len(tokens)))
            diffs.append(f"id {key} from new token {at}")
    return f"{same}/{len(ref)}", diffs


@dataclasses.dataclass
class Best:
    system: str
    runs: list  # the chosen batch's runs (all ok), or []
    failure: str  # why nothing ran, or the batches that failed
    swept: list


def choose_best(system, runs):
    by_batch = {}
    for r in runs:
        by_batch.setdefault(r.batch, []).append(r)
    ok = {b: rs for b, rs in by_batch.items() if all(r.status == "ok" for r in rs)}
    failures = [next(r.reason for r in rs if r.status != "ok") for b, rs in by_batch.items() if b not in ok]
    if not ok:
        return Best(system, [], "; ".join(failures), list(by_batch))
    best = max(ok, key=lambda b: statistics.median(r.tok_s for r in ok[b]))
    return Best(system, ok[best], "; ".join(failures), list(by_batch))


def summarize(a, paths, runs, bests, load_start, load_end):
    by_name = {b.system: b for b in bests}
    base = by_name.get(a.baseline)
    base_tok_s = statistics.median(r.tok_s for r in base.runs) if base and base.runs else None
    ref = by_name.get(a.reference)
    ref_run = ref.runs[0] if ref and ref.runs else None
    cgroup_file = "memory.limit_in_bytes (v1)" if os.path.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes") \
        else "memory.max (v2)"
    cap = (f"memory cap: {format_bytes(a.mem_cap)} per process, cgroup {cgroup_file}, page cache included: "
           "a system cannot keep in the page cache what it put on disk" if a.mem_cap else
           "memory cap: none (each process in its own cgroup to measure its peak, page cache included)")
    others = [r.others_cores for r in runs]
    lines = [
        f"checkpoint: {os.path.basename(paths['checkpoint'])} (random weights, save_pretrained, safetensors); "
        f"{a.prompts} prompts x {a.prompt_len} tokens, {a.gen_len} new tokens each, greedy; "
        f"{a.repeat} run(s) per system and batch, interleaved",
        f"{cap}; page cache dropped before each run",
        *([f"flexh2o: {a.flexh2o_source}"] if a.flexh2o_source else []),
        machine_line(load_start, load_end) + f"; other processes used {min(others):.2f}-{max(others):.2f} cores "
        "during the runs",
        "",
        f"| system | batch | tok/s (median) | min-max | gen s | load s | peak RSS | peak cgroup | others' CPU | "
        f"tokens = {a.reference} | vs {a.baseline} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for b in bests:
        if not b.runs:
            lines.append(f"| {b.system} | - | {b.failure} | | | | | | | | |")
            continue
        tok_s = [r.tok_s for r in b.runs]
        med = statistics.median(tok_s)
        r0 = b.runs[0]
        same = "-"
        if ref_run and b.system != a.reference:
            same, diffs = compare_tokens(r0, ref_run)
            if diffs:
                notes.append(f"{b.system} vs {a.reference} tokens: " + ", ".join(diffs))
        ratio = f"{med / base_tok_s:.2f}x" if base_tok_s else "n/a"
        batch = r0.batch if b.system != "flexh2o-default" else "own"
        lines.append(f"| {b.system} | {batch} | {med:.1f} | {min(tok_s):.1f}-{max(tok_s):.1f} | "
                     f"{statistics.median(r.generate_seconds for r in b.runs):.1f} | "
                     f"{statistics.median(r.load_seconds for r in b.runs):.1f} | "
                     f"{format_bytes(max(r.peak_rss for r in b.runs))} | "
                     f"{format_bytes(max(r.peak_cgroup or 0 for r in b.runs) or None)} | "
                     f"{statistics.median(r.others_cores for r in b.runs):.2f} | {same} | {ratio} |")
        if r0.detail:
            notes.append(f"{b.system}: {r0.detail}")
        if len(b.swept) > 1 or b.failure:
            notes.append(f"{b.system}: best of batches {', '.join(b.swept)}" +
                         (f" ({b.failure})" if b.failure else ""))
    lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_csv(path, runs):
    fields = [f.name for f in dataclasses.fields(Run)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in runs:
            w.writerow(dataclasses.asdict(r))


# ---------------------------------------------------------------- main

def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", choices=sorted(RECIPES) + sorted(recipes.RECIPES),
                   help="defaults of one of the comparisons in README.md (in-memory, offloaded: issue 15; "
                        "llamacpp-*: issue 32; sharegpt*: issue 30; shared-prefix*: issue 45); other flags override them")
    g = p.add_argument_group("workload")
    g.add_argument("--preset", choices=PRESETS, default="opt-1.3b", help="model shape of the checkpoint")
    g.add_argument("--config-json", help="a config.json (with model_type) to instantiate instead of --preset")
    g.add_argument("--checkpoint-dtype", choices=["f16", "bf16", "f32"], default="f16",
                   help="dtype of the stored weights (default f16)")
    g.add_argument("--prompts", type=int, default=16, help="number of prompts (default 16)")
    g.add_argument("--prompt-len", type=int, default=64, help="tokens per prompt (default 64)")
    g.add_argument("--gen-len", type=int, default=32, help="new tokens per prompt (default 32)")
    g.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts")
    g = p.add_argument_group("systems")
    g.add_argument("--systems", default="flexh2o,flexh2o-default,pytorch-fp32,pytorch-bf16",
                   help=f"comma-separated, from {', '.join(SYSTEMS)}")
    g.add_argument("--batch", type=int, default=16, help="batch of every system without --batches (default 16)")
    g.add_argument("--batches", action="append", default=[], metavar="SYSTEM=B1,B2",
                   help="batches to sweep for one system, keeping its best (flexh2o: B or BxK = --gpu-batch-size B "
                        "--num-gpu-batches K); repeatable")
    g.add_argument("--flexh2o", default=os.path.join(REPO, "build", "engine", "flexh2o"), help="flexh2o binary")
    g.add_argument("--flexh2o-args", default="",
                   help="extra flags of the flexh2o system, e.g. '--percent 0 30 100 0 100 0 --cache-dtype f16'")
    g.add_argument("--flexh2o-default-args", default="",
                   help="extra flags of flexh2o-default (no placement flags; limits such as --cpu-mem)")
    g.add_argument("--accelerate-cpu-mem", default="disk:0.7",
                   help="Accelerate's max_memory for the cpu: a size (600MiB) or disk:F = the largest that leaves "
                        "a fraction F of the weight bytes on disk (default disk:0.7)")
    g.add_argument("--accelerate-dtype", choices=["bf16", "fp32"], default="bf16",
                   help="Accelerate's weight and compute dtype (default bf16; fp32 is faster on CPUs without "
                        "AVX-512 BF16 or AMX, where PyTorch emulates bf16)")
    g.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    g = p.add_argument_group("llama.cpp, ShareGPT and shared-prefix recipes (recipes.py)")
    g.add_argument("--weights", default="f16", help="GGUF weight types, comma-separated: f16 and llama-quantize's "
                                                     "(Q8_0, Q4_0, ...) (default f16)")
    g.add_argument("--batch-sizes", default="16", help="sequences per batch, comma-separated (default 16)")
    g.add_argument("--tuned", action="append", default=[], metavar="'BxK FLAGS'",
                   help="a hand-tuned flexh2o policy for llamacpp-offloaded: gpu batch x gpu batches, then flags; "
                        "repeatable (replaces the recipe's list)")
    g.add_argument("--requests", type=int, default=96, help="requests of the sharegpt and shared-prefix recipes "
                                                             "(default 96; shared-prefix: 512, shared-prefix-offloaded: 64)")
    g.add_argument("--in-flight", type=int, default=32,
                   help="sequences in flight for every system: flexh2o's block, llama-server's -np (default 32)")
    g.add_argument("--max-len", type=int, default=512, help="longest ShareGPT prompt and reply in tokens (default 512)")
    g.add_argument("--flexh2o-block", metavar="BxK", help="flexh2o's blocks (slots) in the sharegpt and shared-prefix "
                                                           "recipes: gpu batch x gpu batches, B x K = --in-flight "
                                                           "(default IN_FLIGHTx1)")
    g.add_argument("--flexh2o-variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="another flexh2o row of the sharegpt recipes beside fixed blocks, e.g. "
                        "'continuous=--FLAG'; repeatable")
    g.add_argument("--prefixes", type=int, default=1,
                   help="shared-prefix recipes: different prefixes, each with its own few-shot examples (default 1)")
    g.add_argument("--prefix-order", choices=["random", "grouped"], default="random",
                   help="shared-prefix recipes: the requests' prefixes mixed at random (default), or each prefix's "
                        "requests together (per-document questions)")
    g.add_argument("--prefix-tokens", type=int, default=1000,
                   help="shared-prefix recipes: most tokens of a prefix (instruction and few-shot examples; default 1000)")
    g.add_argument("--model-dir", default=recipes.SMOLLM2_DIR,
                   help="HF directory of the sharegpt recipe's model (default SmolLM2-135M-Instruct from "
                        "scripts/models/make_smollm2.sh)")
    g.add_argument("--tokenizer-dir", default=recipes.SMOLLM2_DIR,
                   help="tokenizer for random checkpoints (GGUF conversion, ShareGPT sampling) (default SmolLM2's)")
    g.add_argument("--build-jobs", type=int, default=1, help="parallel jobs building llama.cpp (default 1: the "
                                                             "build runs niced beside other work)")
    g = p.add_argument_group("measurement")
    g.add_argument("--mem-cap", type=parse_bytes, help="memory cgroup limit of each run, e.g. 3GiB (default none)")
    g.add_argument("--repeat", type=int, default=1, help="runs per system and batch, interleaved (default 1)")
    g.add_argument("--baseline", help="system the ratios are to (default: the first non-flexh2o system)")
    g.add_argument("--reference", default="pytorch-fp32",
                   help="system whose greedy tokens the others are compared with (default pytorch-fp32)")
    g.add_argument("--quiet-below", type=float, metavar="CORES",
                   help="before each run, wait until other processes use at most CORES cores (sampled over 3 s)")
    g.add_argument("--max-wait", type=int, default=1800,
                   help="seconds --quiet-below waits at most before running anyway (default 1800)")
    g.add_argument("--timeout", type=int, default=3600, help="seconds before a run is killed (default 3600)")
    g = p.add_argument_group("files")
    g.add_argument("--venv", help="venv with torch, transformers, accelerate (default: $PEERS_VENV, else "
                                  "bench/peers/.venv, built from PyPI if missing)")
    g.add_argument("--work-dir", default=os.path.join(HERE, "work"), help="checkpoints and prompts cache")
    g.add_argument("--out-dir", help="table.md, runs.csv, logs, tokens (default: WORK_DIR/out)")
    recipe = p.parse_known_args()[0].recipe
    if recipe:
        p.set_defaults(**{**RECIPES, **recipes.RECIPES}[recipe])
    a = p.parse_args()
    a.flexh2o_source = None  # the binary the copy in out_dir was taken from
    if a.recipe in recipes.DRIVERS:
        a.out_dir = a.out_dir or os.path.join(a.work_dir, "out", a.recipe)
        a.tuned = a.tuned or getattr(a, "recipe_tuned", [])
        return a
    a.out_dir = a.out_dir or os.path.join(a.work_dir, "out")
    a.systems = a.systems.split(",")
    for s in a.systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    if any(flag in shlex.split(a.flexh2o_args) for flag in FLEXH2O_BATCH_FLAGS):
        p.error("give flexh2o's batch with --batch or --batches flexh2o=BxK, not in --flexh2o-args")
    a.baseline = a.baseline or next((s for s in a.systems if not s.startswith("flexh2o")), a.systems[0])
    return a


def copy_flexh2o(a):
    """Run a copy: the build may be replaced while the benchmark runs."""
    if not os.access(a.flexh2o, os.X_OK):
        raise HarnessError(f"no flexh2o binary at {a.flexh2o}; build it or pass --flexh2o PATH")
    os.makedirs(a.out_dir, exist_ok=True)
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(a.flexh2o)))
    a.flexh2o_source = f"{a.flexh2o} (built {built})"
    a.flexh2o = shutil.copy2(a.flexh2o, os.path.join(a.out_dir, "flexh2o"))


def main():
    a = parse_args()
    venv = a.venv or os.environ.get("PEERS_VENV")
    if a.recipe in recipes.DRIVERS:
        copy_flexh2o(a)
        recipes.run(a, ensure_venv(venv or os.path.join(HERE, ".venv"), venv is not None, a.work_dir))
        return
    batches = parse_batches(a.batches, a.batch)
    for system in a.systems:
        too_big = [b for b in batches[system] if b != "own" and batch_size(b) > a.prompts]
        if too_big:
            raise HarnessError(f"{system} batch {too_big[0]} is larger than --prompts {a.prompts}")
    for d in ("logs", "tokens", "metrics"):
        os.makedirs(os.path.join(a.out_dir, d), exist_ok=True)
    if any(s.startswith("flexh2o") for s in a.systems):
        copy_flexh2o(a)
    python = ensure_venv(venv or os.path.join(HERE, ".venv"), venv is not None, a.work_dir)
    checkpoint = ensure_checkpoint(a, python)
    paths = {"python": python, "checkpoint": checkpoint,
             "prompts": ensure_prompts(a.work_dir, checkpoint, a.prompts, a.prompt_len, a.seed)}

    load_start = os.getloadavg()[0]
    runs, dropped = [], set()  # dropped: (system, batch) past a batch that ran out of memory
    for rep in range(a.repeat):
        for system in recipes.rotated(a.systems, rep):
            for batch in batches[system]:
                if (system, batch) in dropped:
                    continue
                run = run_system(a, paths, system, batch, rep, len(runs))
                runs.append(run)
                if run.status == "OOM":
                    later = batches[system][batches[system].index(batch):]
                    dropped.update((system, b) for b in later)
    load_end = os.getloadavg()[0]

    bests = [choose_best(s, [r for r in runs if r.system == s]) for s in a.systems]
    table = summarize(a, paths, runs, bests, load_start, load_end)
    with open(os.path.join(a.out_dir, "table.md"), "w") as f:
        f.write(table)
    write_csv(os.path.join(a.out_dir, "runs.csv"), runs)
    print(table, end="")


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C: the running system is killed and its cgroup removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        main()
    except (HarnessError, CgroupError) as e:
        sys.exit(f"peers: error: {e}")
