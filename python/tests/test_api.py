"""The Python API against the CLI on the same jobs, its errors, streaming, threads, interrupts
and reference counting. Runs on the embedded stories260K model (and SmolLM2-135M-Instruct
where scripts/models/make_smollm2.sh put it)."""

import json
import os
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from flexh2o import LLM, GuidedDecodingParams, SamplingParams

BIN = os.environ.get("FLEXH2O_BIN", "build/engine/flexh2o")
SMOLLM2 = Path.home() / ".cache/flexh2o/models/smollm2-135m-v5"
PROMPTS = ["Once upon a time", "Tim and Lily", "The big dog", "She saw a", "One day, a little"]


def without_times(path):
    """The results file's lines with what differs from run to run (created) left out."""
    lines = []
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        if d.get("response"):
            d["response"]["body"].pop("created", None)
        lines.append(d)
    return sorted(lines, key=lambda d: d["custom_id"])


def batch_file(path, prompts, body):
    with open(path, "w") as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/completions",
                                "body": {"model": "flexh2o", "prompt": p, **body}}) + "\n")


def test_generate_returns_outputs_in_prompt_order():
    outs = LLM().generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert [o.request_id for o in outs] == [str(i) for i in range(len(PROMPTS))]
    assert [o.prompt for o in outs] == PROMPTS
    for o in outs:
        assert len(o.outputs) == 1 and o.outputs[0].finish_reason in ("stop", "length")
        assert 1 <= len(o.outputs[0].token_ids) <= 8 and o.outputs[0].text
        assert o.prompt_token_ids and o.metrics.generated_tokens == len(o.outputs[0].token_ids)


def test_same_results_file_as_the_cli(tmp_path):
    body = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 12, "n": 2, "seed": 7}
    batch_file(tmp_path / "in.jsonl", PROMPTS, body)
    subprocess.run([BIN, "run", "--prompts", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "cli.jsonl"),
                    "--quiet"], check=True, capture_output=True)
    llm = LLM(out=str(tmp_path / "py.jsonl"))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12, n=2, seed=7),
                        use_tqdm=False)
    assert without_times(tmp_path / "py.jsonl") == without_times(tmp_path / "cli.jsonl")
    cli = {d["custom_id"]: d for d in without_times(tmp_path / "cli.jsonl")}
    for o in outs:
        texts = [c["text"] for c in cli[o.request_id]["response"]["body"]["choices"]]
        assert [c.text for c in o.outputs] == texts


def test_token_prompts_logprobs_and_per_prompt_params():
    llm = LLM()
    ids = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    again = llm.generate([{"prompt_token_ids": ids.prompt_token_ids}, ids.prompt_token_ids],
                         [SamplingParams(temperature=0, max_tokens=4, logprobs=2),
                          SamplingParams(temperature=0, max_tokens=2)], use_tqdm=False)
    assert again[0].outputs[0].token_ids == ids.outputs[0].token_ids
    assert again[1].outputs[0].token_ids == ids.outputs[0].token_ids[:2]
    lp = again[0].outputs[0].logprobs
    assert len(lp) == 4 and all(t in entry for t, entry in zip(again[0].outputs[0].token_ids, lp))
    assert all(entry[t].rank == 1 for t, entry in zip(again[0].outputs[0].token_ids, lp))  # greedy: the top one
    assert again[0].outputs[0].cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in
                                                                      zip(again[0].outputs[0].token_ids, lp)))


def test_structured_output_and_stop():
    outs = LLM().generate(["Tim"], [SamplingParams(temperature=0.7, seed=1, max_tokens=16,
                                                   guided_decoding=GuidedDecodingParams(regex="(yes|no)"))],
                          use_tqdm=False)
    assert outs[0].outputs[0].text in ("yes", "no") and outs[0].outputs[0].finish_reason == "stop"


def test_errors_name_the_option():
    with pytest.raises(TypeError, match="unexpected keyword argument.*tensor_parallel_size"):
        LLM(tensor_parallel_size=2)
    with pytest.raises(TypeError, match="best_of"):
        SamplingParams(best_of=2)
    with pytest.raises(FileNotFoundError, match="model: /no/such/model"):
        LLM(model="/no/such/model")
    with pytest.raises(ValueError, match="^gpu_mem: invalid size '3XB'"):
        LLM(gpu_mem="3XB").generate(["x"], use_tqdm=False)
    with pytest.raises(ValueError, match="^resume needs out"):
        LLM(resume=True).generate(["x"], use_tqdm=False)
    with pytest.raises(ValueError, match=r"request \"1\" \(temperature\)"):
        LLM().generate(["x", "y"], [SamplingParams(), SamplingParams(temperature=-1)], use_tqdm=False)
    with pytest.raises(ValueError, match="kv"):
        LLM(kv="nonsense:0.2").generate(["x"], use_tqdm=False)
    with pytest.raises(ValueError, match="2 given for 3 prompts"):
        LLM().generate(["a", "b", "c"], [SamplingParams()] * 2, use_tqdm=False)
    with pytest.raises(ValueError, match="^gpu_mem: 16 is not a string"):
        LLM(gpu_mem=16)


def test_plan_gives_the_policy_generate_runs():
    llm = LLM()
    plan = llm.plan(PROMPTS, SamplingParams(max_tokens=8))
    assert plan.hardware == "this machine" and plan.predicted["total_tokens_per_second"] > 0
    assert plan.policy["gpu_batch_size"] >= 1 and plan.predicted["memory_bytes"]["gpu"] > 0
    llm.generate(PROMPTS, SamplingParams(max_tokens=8), use_tqdm=False)
    assert llm.last_report["policy"]["gpu_batch_size"] == plan.policy["gpu_batch_size"]
    given = LLM(gpu_batch_size=2, percent=[100, 0, 100, 0, 100, 0]).plan(PROMPTS)
    assert given.policy["gpu_batch_size"] == 2 and given.predicted is not None
    with pytest.raises(ValueError, match="^the placement given \\(percent, policy or gpu_batch_size\\) does not fit"):
        LLM(gpu_batch_size=2, percent=[100, 0, 100, 0, 100, 0], gpu_mem="1KiB").plan(PROMPTS)


def test_generate_iter_yields_every_request_as_it_ends():
    sp = SamplingParams(temperature=0, max_tokens=6)
    streamed = {o.request_id: o.outputs[0].token_ids for o in LLM().generate_iter(PROMPTS, sp, use_tqdm=False)}
    whole = {o.request_id: o.outputs[0].token_ids for o in LLM().generate(PROMPTS, sp, use_tqdm=False)}
    assert streamed == whole


def test_threads_on_separate_llms():
    sp = SamplingParams(temperature=0.9, seed=3, max_tokens=10)
    expected = [o.outputs[0].token_ids for o in LLM().generate(PROMPTS, sp, use_tqdm=False)]
    results, errors = {}, []

    def work(k):
        try:
            results[k] = [o.outputs[0].token_ids for o in LLM().generate(PROMPTS, sp, use_tqdm=False)]
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(results[k] == expected for k in range(4))


def test_interrupted_job_resumes_to_the_uninterrupted_result(tmp_path):
    prompts = [f"Story {i}:" for i in range(64)]
    sp = SamplingParams(temperature=0.8, seed=5, max_tokens=200)
    LLM(out=str(tmp_path / "whole.jsonl"), gpu_batch_size=2).generate(prompts, sp, use_tqdm=False)
    llm = LLM(out=str(tmp_path / "part.jsonl"), gpu_batch_size=2)

    def interrupt_once_some_are_done():  # SIGINT once the results file holds 4 lines
        deadline = time.monotonic() + 120
        while not (tmp_path / "part.jsonl").exists() or len((tmp_path / "part.jsonl").read_text().splitlines()) < 4:
            if time.monotonic() > deadline:
                return  # the job failed another way: pytest.raises says so
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt_once_some_are_done)
    watcher.start()
    with pytest.raises(KeyboardInterrupt, match="stopped after"):
        llm.generate(prompts, sp, use_tqdm=False)
    watcher.join()
    part = len(Path(tmp_path / "part.jsonl").read_text().splitlines())
    assert 0 < part < len(prompts)
    outs = LLM(out=str(tmp_path / "part.jsonl"), gpu_batch_size=2, resume=True).generate(prompts, sp, use_tqdm=False)
    assert without_times(tmp_path / "part.jsonl") == without_times(tmp_path / "whole.jsonl")
    # Every prompt's output, those of the first run from the file (without token ids).
    whole = {d["custom_id"]: d["response"]["body"]["choices"][0]["text"] for d in without_times(tmp_path / "whole.jsonl")}
    assert [o.outputs[0].text for o in outs] == [whole[str(i)] for i in range(len(prompts))]
    assert sum(o.outputs[0].token_ids is None for o in outs) == part


def test_no_leak_over_many_calls():
    llm = LLM()
    sp = SamplingParams(temperature=0, max_tokens=2)

    def rss_kib():
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() // 1024

    for _ in range(100):
        llm.generate(["Tim"], sp, use_tqdm=False)
    before = rss_kib()
    for _ in range(1000):
        llm.generate(["Tim"], sp, use_tqdm=False)
    assert rss_kib() - before < 16 * 1024  # KiB: a leak of 16 KiB a call would show 16 MiB


@pytest.mark.skipif(not SMOLLM2.exists(), reason="SmolLM2-135M-Instruct not fetched (scripts/models/make_smollm2.sh)")
def test_chat_on_smollm2_matches_the_cli(tmp_path):
    messages = [[{"role": "user", "content": f"Name a color and a number ({i})."}] for i in range(3)]
    with open(tmp_path / "in.jsonl", "w") as f:
        for i, m in enumerate(messages):
            f.write(json.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
                                "body": {"model": "flexh2o", "messages": m, "temperature": 0, "max_tokens": 16}}) + "\n")
    subprocess.run([BIN, "run", "--model", str(SMOLLM2), "--prompts", str(tmp_path / "in.jsonl"), "--out",
                    str(tmp_path / "cli.jsonl"), "--quiet"], check=True, capture_output=True)
    outs = LLM(model=str(SMOLLM2)).chat(messages, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    cli = {d["custom_id"]: d["response"]["body"]["choices"][0]["message"]["content"]
           for d in without_times(tmp_path / "cli.jsonl")}
    assert [o.outputs[0].text for o in outs] == [cli[str(i)] for i in range(3)]
