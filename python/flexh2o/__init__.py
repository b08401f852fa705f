"""flexh2o from Python: batch jobs as vLLM's offline users write them.

    from flexh2o import LLM, SamplingParams
    llm = LLM(model="path/to/SmolLM2-135M-Instruct")
    for out in llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95)):
        print(out.outputs[0].text)

The engine runs in this process (no subprocess), the GIL released while it runs. Every option
of ``flexh2o run`` is a keyword argument of ``LLM`` by its meaning (``kv="h2o:0.2"``,
``gpu_mem="16GiB"``, ``offload_dir=...``, ``policy="auto"``); docs/python.md maps vLLM's API
onto this one and lists what differs.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from . import _flexh2o

__all__ = [
    "LLM",
    "SamplingParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
    "Plan",
]

# The jobs' notices (the planner's choice, how to calibrate): logging.getLogger("flexh2o").
logger = logging.getLogger("flexh2o")

# A prompt: its text, its token ids, or a dict with "prompt" (text) or "prompt_token_ids".
PromptType = Union[str, Sequence[int], Dict[str, Any]]


@dataclass
class GuidedDecodingParams:
    """Structured output (vLLM's GuidedDecodingParams): exactly one of the fields."""

    json: Optional[Union[str, Dict[str, Any]]] = None  # a JSON schema
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None  # GBNF
    json_object: Optional[bool] = None  # any JSON object

    def body_fields(self) -> Dict[str, Any]:
        given = {k: v for k, v in vars(self).items() if v is not None and v is not False}
        if len(given) != 1:
            raise ValueError(f"guided_decoding: give exactly one of json, regex, choice, grammar, json_object (got {sorted(given) or 'none'})")
        (kind, value), = given.items()
        if kind == "json":
            return {"guided_json": json.loads(value) if isinstance(value, str) else value}
        if kind == "json_object":
            return {"response_format": {"type": "json_object"}}
        return {"guided_" + kind: value}


@dataclass
class SamplingParams:
    """How each request samples, as vLLM's SamplingParams (its defaults: temperature 1.0,
    max_tokens 16). A field vLLM has and flexh2o does not is a TypeError naming it."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16  # None: the job's max_tokens option
    min_tokens: int = 0
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None  # top alternatives per token beside the sampled one
    logit_bias: Optional[Dict[int, float]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    guided_decoding: Optional[GuidedDecodingParams] = None

    def body_fields(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {"n": self.n, "temperature": self.temperature, "top_p": self.top_p}
        if self.top_k not in (0, -1):
            body["top_k"] = self.top_k
        optional = {
            "min_p": (self.min_p, 0.0),
            "seed": (self.seed, None),
            "max_tokens": (self.max_tokens, None),
            "min_tokens": (self.min_tokens, 0),
            "stop_token_ids": (self.stop_token_ids, None),
            "ignore_eos": (self.ignore_eos, False),
            "presence_penalty": (self.presence_penalty, 0.0),
            "frequency_penalty": (self.frequency_penalty, 0.0),
            "repetition_penalty": (self.repetition_penalty, 1.0),
        }
        for key, (value, default) in optional.items():
            if value != default:
                body[key] = value
        if self.stop is not None:
            body["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        if self.logit_bias:
            body["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        if self.guided_decoding is not None:
            body.update(self.guided_decoding.body_fields())
        return body


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None  # 1: the most likely; None: the sampled token outside the top
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: Optional[List[int]]  # None: resumed from an earlier run's results file
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, Logprob]]]
    finish_reason: Optional[str]  # "stop" or "length"


@dataclass
class RequestMetrics:
    first_token_time: Optional[float]  # seconds from the job's start
    finished_time: Optional[float]
    prompt_tokens: int = 0
    generated_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[List[int]]  # None: resumed from an earlier run's results file
    outputs: List[CompletionOutput]
    finished: bool = True
    metrics: Optional[RequestMetrics] = None


def _is_token_ids(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)


def _prompt_fields(prompt: PromptType, i: int) -> Dict[str, Any]:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if _is_token_ids(prompt):
        return {"prompt": list(prompt)}
    if isinstance(prompt, dict):
        unknown = set(prompt) - {"prompt", "prompt_token_ids"}
        if unknown:
            raise ValueError(f"prompts[{i}]: {sorted(unknown)} not supported (a prompt dict has \"prompt\" or \"prompt_token_ids\")")
        if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
            raise ValueError(f"prompts[{i}]: give exactly one of \"prompt\" and \"prompt_token_ids\"")
        if "prompt" in prompt:
            return _prompt_fields(prompt["prompt"], i) if isinstance(prompt["prompt"], str) else _bad_prompt(i)
        return {"prompt": list(prompt["prompt_token_ids"])} if _is_token_ids(prompt["prompt_token_ids"]) else _bad_prompt(i)
    return _bad_prompt(i)


def _bad_prompt(i: int) -> Dict[str, Any]:
    raise TypeError(f"prompts[{i}]: a prompt is a str, a list of token ids, or a dict with \"prompt\" or \"prompt_token_ids\"")


def _per_request(params: Union[None, SamplingParams, Sequence[SamplingParams]], count: int) -> List[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise ValueError(f"sampling_params: {len(params)} given for {count} prompts (give one, or one per prompt)")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"sampling_params[{i}] is a {type(p).__name__}, not a SamplingParams")
    return params


def _logprobs_of(choice: Dict[str, Any], tokens: List[int], logprobs: List[float],
                 top: List[List[tuple]]) -> Optional[List[Dict[int, Logprob]]]:
    if not logprobs:
        return None
    texts = (choice.get("logprobs") or {}).get("tokens") or []
    out = []
    for t, (token, lp) in enumerate(zip(tokens, logprobs)):
        entry = {tid: Logprob(alp, rank + 1) for rank, (tid, alp) in enumerate(top[t] if t < len(top) else [])}
        sampled = entry.get(token) or Logprob(lp, None)
        sampled.decoded_token = texts[t] if t < len(texts) else None
        entry[token] = sampled
        out.append(entry)
    return out


def _request_output(prompt: PromptType, done: tuple, timing: Optional[tuple]) -> RequestOutput:
    key, prompt_ids, choices, line = done
    result = json.loads(line)
    if result.get("error"):  # its generation failed (a grammar past what can be followed)
        raise ValueError(f"request {result['custom_id']}: {result['error']['message']}")
    body = result["response"]["body"]
    outputs = []
    for c, (tokens, logprobs, top) in zip(body["choices"], choices):
        text = c["message"]["content"] if "message" in c else c["text"]
        outputs.append(CompletionOutput(
            index=c["index"], text=text, token_ids=list(tokens),
            cumulative_logprob=sum(logprobs) if logprobs else None,
            logprobs=_logprobs_of(c, tokens, logprobs, top), finish_reason=c["finish_reason"]))
    metrics = RequestMetrics(timing[3], timing[4], timing[1], timing[2]) if timing else None
    text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
    return RequestOutput(json.loads(key), text if isinstance(text, str) else None, list(prompt_ids), outputs, True, metrics)


@dataclass
class Plan:
    """A job's policy and the cost model's prediction of it (LLM.plan)."""

    policy: Dict[str, Any]  # every field a run uses (as --metrics records it)
    hardware: str  # the profile planned on: "this machine" or a profile's name
    hardware_source: str  # where its capacities and rates come from
    compute: str  # the compute dtype chosen, and why
    # continuous, prefill/decode/total_tokens_per_second, step_seconds, memory_bytes
    # {gpu, cpu, disk}, bottleneck; None when nothing was estimated
    predicted: Optional[Dict[str, Any]]


def _resumed_output(prompt: PromptType, line: Dict[str, Any]) -> RequestOutput:
    """A request done by an earlier run of a resumed job, from its result line: the file holds
    no token ids (token_ids None), nor the prompt's."""
    if line.get("error"):
        raise ValueError(f"request {line['custom_id']}: {line['error']['message']}")
    body = line["response"]["body"]
    outputs = [CompletionOutput(index=c["index"], text=c["message"]["content"] if "message" in c else c["text"],
                                token_ids=None, cumulative_logprob=None, logprobs=None,
                                finish_reason=c["finish_reason"]) for c in body["choices"]]
    text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
    return RequestOutput(line["custom_id"], text if isinstance(text, str) else None, None, outputs, True, None)


class LLM:
    """A model and the options of the jobs run on it (every option of ``flexh2o run``, by its
    meaning: ``policy``, ``kv``, ``compress_weight``, ``gpu_mem``, ``offload_dir``, ``hardware``,
    ``batching``, ...). The model is opened by each call that runs a job, as each CLI run does."""

    def __init__(self, model: Optional[str] = None, **options: Any):
        unknown = sorted(set(options) - set(_flexh2o.job_option_names()))
        if unknown:
            raise TypeError(f"LLM() got unexpected keyword argument(s) {', '.join(unknown)}")
        if model and not os.path.exists(model) and (os.sep in model or model.endswith((".gguf", ".bin", ".yaml"))):
            raise FileNotFoundError(f"model: {model}: no such file or directory")
        self.model = model
        self.options = dict(options, model=model or "")
        _flexh2o.check_options(self.options)
        self.last_report: Optional[Dict[str, Any]] = None

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None, *,
                 use_tqdm: bool = True) -> List[RequestOutput]:
        """Runs one job over the prompts; returns their outputs in prompt order."""
        items = self._as_list(prompts)
        lines = self._completion_lines(items, sampling_params)
        return self._run(items, lines, use_tqdm)

    def generate_iter(self, prompts: Sequence[PromptType],
                      sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None, *,
                      use_tqdm: bool = True) -> Iterator[RequestOutput]:
        """Runs one job over the prompts; yields each request's output as it ends (any order)."""
        items = self._as_list(prompts)
        lines = self._completion_lines(items, sampling_params)
        return self._stream(items, lines, use_tqdm)

    def chat(self, messages: Union[List[Dict[str, Any]], Sequence[List[Dict[str, Any]]]],
             sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None, *,
             use_tqdm: bool = True) -> List[RequestOutput]:
        """One conversation (a list of messages) or several, through the model's chat template
        with the generation prompt added."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        lines = [self._line(i, "/v1/chat/completions", {"messages": m}, sp)
                 for i, (m, sp) in enumerate(zip(conversations, _per_request(sampling_params, len(conversations))))]
        return self._run([None] * len(conversations), lines, use_tqdm)

    def plan(self, prompts: Union[PromptType, Sequence[PromptType]],
             sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None) -> "Plan":
        """What ``generate`` would run these prompts with, nothing run: the planner's policy (or
        the one given, checked to fit) and its prediction, as ``flexh2o plan`` shows them."""
        items = self._as_list(prompts)
        lines = self._completion_lines(items, sampling_params)
        p = json.loads(_flexh2o.plan(self.options, lines, logger.info))
        return Plan(p["policy"], p["hardware"]["name"], p["hardware"]["source"], p["compute"], p["predicted"])

    def _completion_lines(self, items: List[PromptType],
                          sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]]) -> List[str]:
        return [self._line(i, "/v1/completions", _prompt_fields(p, i), sp)
                for i, (p, sp) in enumerate(zip(items, _per_request(sampling_params, len(items))))]

    @staticmethod
    def _as_list(prompts: Union[PromptType, Sequence[PromptType]]) -> List[PromptType]:
        if isinstance(prompts, (str, dict)) or _is_token_ids(prompts) and prompts:
            return [prompts]
        return list(prompts)

    def _line(self, i: int, url: str, fields: Dict[str, Any], sp: SamplingParams) -> str:
        body = {"model": self.model or "flexh2o", **fields, **sp.body_fields()}
        return json.dumps({"custom_id": str(i), "method": "POST", "url": url, "body": body})

    def _run(self, items: List[Any], lines: List[str], use_tqdm: bool) -> List[RequestOutput]:
        done: Dict[int, tuple] = {}
        timings = self._job(lines, use_tqdm, lambda d: done.__setitem__(int(json.loads(d[0])), d))
        earlier = self._earlier_results(len(items), done)
        return [self._output(items, i, done[i], timings) if i in done else _resumed_output(items[i], earlier[i])
                for i in range(len(items))]

    def _earlier_results(self, count: int, done: Dict[int, tuple]) -> Dict[int, Dict[str, Any]]:
        """The result lines of the requests a resumed job found done (in the out file)."""
        if len(done) == count:
            return {}
        earlier = {}
        with open(self.options["out"]) as f:
            for line in f:
                d = json.loads(line)
                i = int(d["custom_id"])
                if i < count and i not in done:
                    earlier[i] = d
        missing = sorted(set(range(count)) - set(done) - set(earlier))
        if missing:
            raise RuntimeError(f"requests {missing[:5]} neither ran nor are in {self.options['out']}")
        return earlier

    def _stream(self, items: List[Any], lines: List[str], use_tqdm: bool) -> Iterator[RequestOutput]:
        finished: "queue.Queue[Any]" = queue.Queue()
        end = object()

        def work() -> None:
            try:
                self._job(lines, use_tqdm, finished.put)
                finished.put(end)
            except BaseException as e:  # handed to the iterating thread
                finished.put(e)

        threading.Thread(target=work, daemon=True).start()
        while (d := finished.get()) is not end:
            if isinstance(d, BaseException):
                raise d
            yield self._output(items, int(json.loads(d[0])), d, {})

    def _job(self, lines: List[str], use_tqdm: bool, take) -> Dict[str, tuple]:
        if not lines:
            return {}
        status, report, text, timings = _flexh2o.run(self.options, lines, not use_tqdm, take, logger.info)
        self.last_report = json.loads(report) if report else None
        if text:
            logger.info(text.rstrip("\n"))
        if status == 130:
            raise KeyboardInterrupt(text.strip().splitlines()[-1] if text.strip() else "interrupted")
        return {t[0]: t for t in timings}

    @staticmethod
    def _output(items: List[Any], i: int, d: tuple, timings: Dict[str, tuple]) -> RequestOutput:
        return _request_output(items[i], d, timings.get(d[0]))
