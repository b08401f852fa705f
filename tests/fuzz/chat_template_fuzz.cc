// libFuzzer target: the input is a chat template, rendered for a fixed conversation with tools.
// Parsing or rendering may refuse it with ChatTemplateError; any other exception, a crash, a
// hang past the step limit or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const flexh2o::engine::chat::ChatInputs inputs = [] {
    flexh2o::engine::chat::ChatInputs in;
    in.messages = nlohmann::ordered_json::parse(
        R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hé \"quoted\"\n"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
              "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
            {"role": "tool", "content": "{\"ok\": 1}"}])");
    in.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
    in.bos_token = "<s>";
    in.eos_token = "</s>";
    in.now = flexh2o::engine::chat::parse_date("2026-11-25");
    return in;
  }();
  flexh2o::engine::chat::RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output = 1 << 20;
  try {
    const flexh2o::engine::chat::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size), "fuzz.jinja", limits);
    t.render(inputs);
  } catch (const flexh2o::engine::chat::ChatTemplateError&) {
    // A clean refusal; anything else escapes and stops the fuzzer.
  }
  return 0;
}
