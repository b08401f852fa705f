"""llama.cpp as a peer: built in the harness from the llama-cpp-python sdist on PyPI (its
vendor/llama.cpp), a Hugging Face checkpoint converted to GGUF with its convert_hf_to_gguf.py
and quantized with llama-quantize, and the two ways CPU users run it: llama-batched-bench
(one batch of equal requests) and llama-server (continuous batching, requests sent
concurrently). Standard library only; everything lands in WORK_DIR/llamacpp and WORK_DIR/gguf.
"""

import concurrent.futures
import contextlib
import fcntl
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time

from isolated import HarnessError, IsolatedProcess

SDIST = "llama-cpp-python==0.3.36"  # pinned: its vendor/llama.cpp is the peer's version
TARGETS = ("llama-server", "llama-batched-bench", "llama-quantize")
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=OFF"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@contextlib.contextmanager
def locked(path):
    """One harness at a time builds or converts (a second waits)."""
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run_logged(cmd, log, what, env=None):
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode != 0:
            raise HarnessError(f"{what} failed (see {log})")


def source_dir(root, pip_python, log):
    """vendor/llama.cpp of the sdist, downloaded with pip and unpacked once."""
    version = SDIST.split("==")[1]
    src = os.path.join(root, f"llama_cpp_python-{version}", "vendor", "llama.cpp")
    if os.path.exists(os.path.join(src, "CMakeLists.txt")):
        return src
    sdist = os.path.join(root, f"llama_cpp_python-{version}.tar.gz")
    if not os.path.exists(sdist):
        print(f"peers: downloading {SDIST} (sdist) from PyPI", file=sys.stderr)
        run_logged([pip_python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", root],
                   log, f"pip download {SDIST}")
    with tarfile.open(sdist) as t:
        t.extractall(root, filter="data")
    if not os.path.exists(os.path.join(src, "CMakeLists.txt")):
        raise HarnessError(f"{sdist} has no vendor/llama.cpp")
    return src


class LlamaCpp:
    """The built tools and the converter of one llama.cpp source tree."""

    def __init__(self, work_dir, pip_python, jobs):
        root = os.path.join(work_dir, "llamacpp")
        os.makedirs(root, exist_ok=True)
        self.build_dir = os.path.join(root, "build")
        self.bin = {t: os.path.join(self.build_dir, "bin", t) for t in TARGETS}
        self.log = os.path.join(root, "build.log")
        with locked(os.path.join(root, ".lock")):
            self.src = source_dir(root, pip_python, self.log)
            if not all(os.access(b, os.X_OK) for b in self.bin.values()):
                self._build(jobs)

    def _build(self, jobs):
        print(f"peers: building llama.cpp ({', '.join(TARGETS)}, -j{jobs}; log {self.log})", file=sys.stderr)
        if not os.path.exists(os.path.join(self.build_dir, "build.ninja")):
            run_logged(["cmake", "-S", self.src, "-B", self.build_dir] + CMAKE_FLAGS, self.log,
                       "configuring llama.cpp")
        # nice: the build shares the machine with whatever else runs there
        run_logged(["nice", "-n", "10", "cmake", "--build", self.build_dir, f"-j{jobs}", "--target", *TARGETS],
                   self.log, "building llama.cpp")

    def version(self):
        return f"{SDIST} (vendor/llama.cpp)"

    # ------------------------------------------------------------ GGUF files

    def ensure_gguf(self, checkpoint, gguf_dir, venv_python, tokenizer_dir):
        """The f16 GGUF of an HF checkpoint. A checkpoint without a tokenizer (the random ones) gets
        tokenizer_dir's, which the converter needs; its vocabulary must not exceed the model's."""
        out = os.path.join(gguf_dir, os.path.basename(checkpoint.rstrip("/")) + "-f16.gguf")
        if os.path.exists(out):
            return out
        os.makedirs(gguf_dir, exist_ok=True)
        log = out + ".log"
        name = os.path.basename(checkpoint.rstrip("/"))
        staged = self._with_tokenizer(checkpoint, tokenizer_dir, os.path.join(gguf_dir, "staged-" + name))
        env = dict(os.environ, PYTHONPATH=os.path.join(self.src, "gguf-py"))  # the converter's own gguf-py
        print(f"peers: converting {checkpoint} to {out}", file=sys.stderr)
        run_logged([venv_python, os.path.join(self.src, "convert_hf_to_gguf.py"), staged, "--outtype", "f16",
                    "--outfile", out + ".partial"], log, f"convert_hf_to_gguf.py of {checkpoint}", env)
        os.rename(out + ".partial", out)
        if staged != checkpoint:
            shutil.rmtree(staged)
        return out

    @staticmethod
    def _with_tokenizer(checkpoint, tokenizer_dir, staged):
        if os.path.exists(os.path.join(checkpoint, "tokenizer.json")) or \
                os.path.exists(os.path.join(checkpoint, "tokenizer.model")):
            return checkpoint
        if not tokenizer_dir or not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
            raise HarnessError(f"{checkpoint} has no tokenizer and --tokenizer-dir {tokenizer_dir!r} has no "
                               "tokenizer.json; convert_hf_to_gguf.py needs one (make SmolLM2's with "
                               "scripts/models/make_smollm2.sh)")
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged)
        for name in os.listdir(checkpoint):
            os.symlink(os.path.abspath(os.path.join(checkpoint, name)), os.path.join(staged, name))
        for name in TOKENIZER_FILES:
            if os.path.exists(os.path.join(tokenizer_dir, name)):
                shutil.copy(os.path.join(tokenizer_dir, name), staged)
        return staged

    def ensure_quantized(self, f16_gguf, qtype, threads):
        """f16_gguf quantized by llama-quantize to qtype (Q8_0, Q4_0, ...), its default mix."""
        if qtype == "f16":
            return f16_gguf
        out = f16_gguf.removesuffix("-f16.gguf") + f"-{qtype}.gguf"
        if not os.path.exists(out):
            print(f"peers: quantizing to {out}", file=sys.stderr)
            run_logged([self.bin["llama-quantize"], f16_gguf, out + ".partial", qtype, str(threads)], out + ".log",
                       f"llama-quantize {qtype}")
            os.rename(out + ".partial", out)
        return out

    # ------------------------------------------------------------ llama-batched-bench

    def batched_bench_command(self, gguf, prompt_len, gen_len, batch, threads, mmap=True):
        """One batch of `batch` sequences, each a prompt_len prompt and gen_len new tokens."""
        cmd = [self.bin["llama-batched-bench"], "-m", gguf, "-t", str(threads),
               "-c", str(batch * (prompt_len + gen_len)), "-npp", str(prompt_len), "-ntg", str(gen_len),
               "-npl", str(batch)]
        return cmd + ([] if mmap else ["--no-mmap"])


def parse_batched_bench(log):
    """{prefill_seconds, decode_seconds, total_seconds} from llama-batched-bench's table row."""
    with open(log, errors="replace") as f:
        rows = [line for line in f if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|\n").split("|")] if rows else []
    data = [r for r in rows[1:] if re.match(r"\|\s*\d", r)]
    if not data or "T_PP s" not in header:
        raise HarnessError(f"no result table in {log}")
    cells = dict(zip(header, (float(c) for c in data[-1].strip("|\n").split("|"))))
    return {"prefill_seconds": cells["T_PP s"], "decode_seconds": cells["T_TG s"], "total_seconds": cells["T s"],
            "batch": int(cells["B"])}


# ---------------------------------------------------------------- llama-server

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(llama, gguf, slots, ctx_per_slot, threads, port):
    return [llama.bin["llama-server"], "-m", gguf, "-t", str(threads), "-np", str(slots),
            "-c", str(slots * ctx_per_slot), "--cont-batching", "--metrics", "--host", "127.0.0.1", "--port", str(port)]


def post(port, path, body, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise HarnessError(f"llama-server {path}: HTTP {resp.status}: {data[:200]!r}")
        return json.loads(data)
    finally:
        conn.close()


def busy_slots_per_decode(port):
    """llama-server's average busy slots per llama_decode call (its Prometheus /metrics), or None."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    except OSError:
        return None
    m = re.search(r"^llamacpp:n_busy_slots_per_decode\s+(\S+)", text, re.M)
    return float(m.group(1)) if m else None


def wait_healthy(server, port, timeout):
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if not server.alive():
            return False
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def complete(port, request, timeout, cache_prompt):
    """One request: its prompt token ids, exactly max_tokens new tokens (greedy, EOS ignored). With
    cache_prompt the server reuses the KV of the longest prefix the slot it picks already holds
    (its prompt cache); `prompt_n` of its timings is the prompt tokens it computed."""
    body = {"prompt": request["tokens"], "n_predict": request["max_tokens"], "ignore_eos": True,
            "temperature": 0.0, "cache_prompt": cache_prompt, "return_tokens": True, "stream": False}
    r = post(port, "/completion", body, timeout)
    return {"id": request["id"], "tokens": r.get("tokens", []), "predicted": r["tokens_predicted"],
            "prompt_computed": r.get("timings", {}).get("prompt_n")}


def serve_requests(llama, gguf, requests, slots, ctx_per_slot, threads, log, mem_cap, name, timeout,
                   cache_prompt=False):
    """Start llama-server in its cgroup, send every request (at most `slots` in flight), stop it.
    (Outcome, {load_seconds, generate_seconds, generated_tokens, prompt_tokens_computed, results});
    prompt_tokens_computed is None where the server's answers do not say."""
    port = free_port()
    cmd = server_command(llama, gguf, slots, ctx_per_slot, threads, port)
    with IsolatedProcess(cmd, log, mem_cap, name, timeout=timeout) as server:
        if not wait_healthy(server, port, timeout):
            return server.finish(stop=True), None
        load = time.perf_counter() - server.start
        start = time.perf_counter()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=slots) as pool:
                results = list(pool.map(lambda r: complete(port, r, timeout, cache_prompt), requests))
        except (OSError, HarnessError) as e:
            outcome = server.finish(stop=True)
            if outcome.status == "ok":
                outcome.status, outcome.reason = "failed", f"failed: {e}"
            return outcome, None
        generate = time.perf_counter() - start
        busy = busy_slots_per_decode(port)
        outcome = server.finish(stop=True)
    computed = [r["prompt_computed"] for r in results]
    return outcome, {"load_seconds": load, "generate_seconds": generate, "busy_slots_per_decode": busy,
                     "generated_tokens": sum(r["predicted"] for r in results), "results": results,
                     "prompt_tokens_computed": None if None in computed else sum(computed)}
