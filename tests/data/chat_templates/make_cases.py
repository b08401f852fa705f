"""Chat-template cases rendered by transformers, for tests/engine/test_chat_template_cases.cc.

Each template is rendered the way transformers' apply_chat_template(tokenize=False) renders it:
the messages normalized (_normalize_chat_messages drops keys whose value is None), then
render_jinja_template (jinja2's ImmutableSandboxedEnvironment with transformers' settings:
trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now pinned to
DATE, dict, namespace) with bos "<s>", eos "</s>" and the case's extra variables.

  python3 make_cases.py OUT_DIR TEMPLATE.jinja...

writes OUT_DIR/<name>.jinja (copies) and OUT_DIR/cases.jsonl, one line per template x conversation:
  {"template", "case", "messages", "tools", "add_generation_prompt", "extra", "bos_token",
   "eos_token", "date", "expected" (text) | "error" ("TypeName: message": the template raised)}
"""
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

import transformers.utils.chat_template_utils as ctu

DATE = "2026-11-25"


class PinnedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 11, 25, 9, 30, 0)


ctu.datetime = PinnedDatetime

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_flights", "description": "Find flights between two airports on a day.",
    "parameters": {"type": "object", "properties": {
        "origin": {"type": "string", "description": "IATA code, e.g. \"CDG\""},
        "destination": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "passengers": {"type": "integer", "minimum": 1, "default": 1},
        "cabins": {"type": "array", "items": {"type": "string", "enum": ["economy", "business"]}},
        "flexible": {"type": "boolean"},
        "budget": {"type": "object", "properties": {"max": {"type": "number"}, "currency": {"type": "string"}}}},
        "required": ["origin", "destination", "date"]}}}
TOOLS = [WEATHER]
TOOLS2 = [WEATHER, SEARCH]


def call(id_, name, arguments):
    return {"type": "function", "id": id_, "function": {"name": name, "arguments": arguments}}


# (label, messages, tools, add_generation_prompt, extra template variables)
CONVS = [
    ("user only", [{"role": "user", "content": "Hello! How are you?"}], None, True, {}),
    ("system + user", [{"role": "system", "content": "You are a helpful assistant."},
                       {"role": "user", "content": "What is the capital of France?"}], None, True, {}),
    ("multi-turn, no generation prompt", [{"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": "Hello! How can I help?"},
                                          {"role": "user", "content": "Tell me a joke about cats."}], None, False, {}),
    ("multi-turn with system, unicode, quotes, newlines",
     [{"role": "system", "content": "Réponds en français.\nSois bref."},
      {"role": "user", "content": "Quel temps fait-il à Zürich? 🌧️ \"vraiment\""},
      {"role": "assistant", "content": "Il pleut. 雨です。"},
      {"role": "user", "content": "  Et demain?  "}], None, True, {}),
    ("tools: call and result",
     [{"role": "user", "content": "What's the weather in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"city": "Paris", "unit": "C"})]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 18}"}], TOOLS, True, {}),
    ("tools offered, system prompt, no call yet",
     [{"role": "system", "content": "You book trips. Ask before buying anything."},
      {"role": "user", "content": "Find me a flight from Paris to Tokyo on 2026-12-20, economy."}], TOOLS2, True, {}),
    ("tool call with JSON-string arguments and null content",
     [{"role": "user", "content": "Weather in Zürich, in F?"},
      {"role": "assistant", "content": None,
       "tool_calls": [call("call_7", "get_weather", "{\"city\": \"Zürich\", \"unit\": \"F\"}")]},
      {"role": "tool", "tool_call_id": "call_7", "name": "get_weather", "content": "{\"temp\": 41, \"sky\": \"snow\"}"}],
     TOOLS, True, {}),
    ("call with null content, result, answer, no generation prompt",
     [{"role": "system", "content": "Use tools when they help."},
      {"role": "user", "content": "Is it warm in Lisbon?"},
      {"role": "assistant", "content": None, "tool_calls": [call("call_3", "get_weather", {"city": "Lisbon"})]},
      {"role": "tool", "tool_call_id": "call_3", "name": "get_weather", "content": "22"},
      {"role": "assistant", "content": "Yes: 22 degrees."}], TOOLS, False, {}),
    ("two parallel calls, results, answer, follow-up",
     [{"role": "system", "content": "You are a travel agent."},
      {"role": "user", "content": "Weather in Oslo and flights OSL-LHR on 2026-12-01 for 2?"},
      {"role": "assistant", "content": "Let me check both.", "tool_calls": [
          call("call_a", "get_weather", {"city": "Oslo"}),
          call("call_b", "search_flights", {"origin": "OSL", "destination": "LHR", "date": "2026-12-01",
                                            "passengers": 2, "cabins": ["economy"], "flexible": False,
                                            "budget": {"max": 450.5, "currency": "EUR"}})]},
      {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": "{\"temp\": -3}"},
      {"role": "tool", "tool_call_id": "call_b", "name": "search_flights",
       "content": "[{\"flight\": \"SK1501\", \"price\": 312}]"},
      {"role": "assistant", "content": "Oslo is at -3°C; SK1501 costs 312 EUR per person."},
      {"role": "user", "content": "Book it."}], TOOLS2, True, {}),
    ("reasoning in history",
     [{"role": "user", "content": "What is 17 * 23?"},
      {"role": "assistant", "reasoning_content": "17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391.", "content": "391"},
      {"role": "user", "content": "And 391 / 17?"}], None, True, {}),
    ("content as a list of text parts",
     [{"role": "system", "content": [{"type": "text", "text": "Answer in one word."}]},
      {"role": "user", "content": [{"type": "text", "text": "Name a primary colour."}]}], None, True, {}),
    ("enable_thinking false", [{"role": "user", "content": "Say hi."}], None, True, {"enable_thinking": False}),
    ("assistant last, no generation prompt",
     [{"role": "user", "content": "Write a haiku about rain."},
      {"role": "assistant", "content": "Soft rain on the roof"}], None, False, {}),
]


def render(src, msgs, tools, agp, extra):
    messages = ctu._normalize_chat_messages(msgs)
    return ctu.render_jinja_template(conversations=[messages], tools=tools, chat_template=src,
                                     add_generation_prompt=agp, bos_token="<s>", eos_token="</s>", **extra)[0][0]


def main(out, templates):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cases.jsonl", "w") as f:
        for t in templates:
            t = Path(t)
            if t.resolve() != (out / t.name).resolve():
                shutil.copy(t, out / t.name)
            src = t.read_text()
            for label, msgs, tools, agp, extra in CONVS:
                case = {"template": t.name, "case": label, "messages": msgs, "tools": tools,
                        "add_generation_prompt": agp, "extra": extra, "bos_token": "<s>", "eos_token": "</s>",
                        "date": DATE}
                try:
                    case["expected"] = render(src, msgs, tools, agp, extra)
                except Exception as e:  # the template refuses this conversation (raise_exception) or cannot render
                    case["error"] = f"{type(e).__name__}: {e}"
                f.write(json.dumps(case, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
