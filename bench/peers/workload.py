"""The workload every system runs: a random-weight Hugging Face checkpoint (written by
checkpoint.py in the harness venv) and token-id prompts in flexh2o's JSONL, cached in the work dir.
"""

import hashlib
import json
import os
import random
import subprocess
import sys

from isolated import HarnessError

HERE = os.path.dirname(os.path.abspath(__file__))


def ensure_checkpoint(a, python):
    """The random-weight checkpoint of --preset or --config-json, written once into the work dir."""
    if a.config_json:
        with open(a.config_json, "rb") as f:
            name = "config-" + hashlib.sha256(f.read()).hexdigest()[:12]
    else:
        name = a.preset
    path = os.path.join(a.work_dir, "checkpoints", f"{name}-{a.checkpoint_dtype}-seed{a.seed}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cmd = [python, os.path.join(HERE, "checkpoint.py"), "--out", path, "--dtype", a.checkpoint_dtype,
           "--seed", str(a.seed)]
    cmd += ["--config-json", a.config_json] if a.config_json else ["--preset", a.preset]
    print(f"peers: writing the checkpoint {path}", file=sys.stderr)
    if subprocess.run(cmd).returncode != 0:
        raise HarnessError(f"cannot write the checkpoint {path} (checkpoint.py failed, see above)")
    return path


def ensure_prompts(work_dir, checkpoint, n, length, seed):
    """n seeded random token-id prompts of `length` tokens (special ids left out), flexh2o's JSONL."""
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    special = {config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    path = os.path.join(work_dir, "prompts", f"n{n}-len{length}-seed{seed}-vocab{vocab}.jsonl")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        rng = random.Random(seed)
        with open(path + ".partial", "w") as f:
            for i in range(n):
                tokens = []
                while len(tokens) < length:
                    t = rng.randrange(vocab)
                    if t not in special:
                        tokens.append(t)
                f.write(json.dumps({"id": i, "tokens": tokens}) + "\n")
        os.rename(path + ".partial", path)
    return path
