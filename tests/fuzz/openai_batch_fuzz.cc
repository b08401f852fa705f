// libFuzzer target: the input is one line of an OpenAI batch file (engine/serving/openai_batch.h).
// parse_openai_line never throws: a bad line carries its error. Any exception, crash or
// sanitizer report is a bug, and so is
//  - a good line outside what the reader promises (n, stop strings, logit_bias sorted and in
//    range, max_tokens, logprobs, a prompt or messages);
//  - the linear parser (engine/serving/linear_json.h) disagreeing with nlohmann's own ordered
//    parse: the same value where both read the text, an error where nlohmann finds one (it
//    alone takes a key twice in one object, or nesting deeper than engine::kMaxJsonDepth),
//    on inputs small enough for nlohmann's quadratic ordered parse;
//  - a line's result or error line that --resume would not key back to the line.
// The seeds (tests/fuzz/corpus-openai) hold lines of each endpoint and field, some with
// thousands of entries; the runner's -timeout catches a reader that turns slow on them.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/serving/linear_json.h"
#include "engine/serving/openai_batch.h"
#include "engine/serving/openai_results.h"
#include "engine/serving/prompts.h"

namespace {

using flexh2o::serving::OpenAiLine;

void check_good_line(const OpenAiLine& r) {
  if (r.key.empty() || r.key[0] != '"' || r.n < 1 || r.n > flexh2o::serving::kMaxChoices) std::abort();
  if (r.stop.size() > flexh2o::serving::kMaxStopStrings) std::abort();
  for (const std::string& s : r.stop)
    if (s.empty()) std::abort();
  const auto& bias = r.sampling.logit_bias;
  for (std::size_t i = 0; i < bias.size(); ++i)
    if (bias[i].token < 0 || !std::isfinite(bias[i].bias) || std::abs(bias[i].bias) > 100.0f ||
        (i > 0 && bias[i - 1].token >= bias[i].token))
      std::abort();
  if (r.max_tokens && (*r.max_tokens < 1 || *r.max_tokens > flexh2o::engine::kMaxTokensPerLine)) std::abort();
  if (r.sampling.logprobs < -1 || r.sampling.logprobs > 20) std::abort();
  if (r.endpoint == flexh2o::serving::Endpoint::Chat && (!r.messages.is_array() || r.messages.empty())) std::abort();
  if (r.endpoint == flexh2o::serving::Endpoint::Completion && !r.prompt_text && r.prompt_tokens.empty()) std::abort();
}

// nlohmann's ordered parse takes time quadratic in an object's keys: only small inputs.
constexpr std::size_t kCompareBytes = 16 << 10;

void check_against_nlohmann(const std::string& text) {
  if (text.size() > kCompareBytes) return;
  const nlohmann::ordered_json theirs = nlohmann::ordered_json::parse(text, nullptr, false);
  try {
    const nlohmann::ordered_json ours = flexh2o::serving::parse_linear_json(text, "fuzz");
    if (theirs.is_discarded() || ours != theirs) std::abort();
  } catch (const std::runtime_error& e) {
    const std::string why = e.what();
    const bool ours_alone = why.find("appears twice") != std::string::npos || why.find("nested deeper") != std::string::npos;
    if (!theirs.is_discarded() && !ours_alone) std::abort();
  }
}

// What --resume reads back from the line's output must be the line's key.
void check_resume_key(const OpenAiLine& r) {
  const std::string out = r.error.empty() ? flexh2o::serving::openai_result_line(r, {}, {}, {}) : flexh2o::serving::openai_error_line(r);
  const std::optional<std::string> key = flexh2o::serving::openai_result_key(out.substr(0, out.size() - 1));
  if (!key || *key != r.key) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const OpenAiLine r = flexh2o::serving::parse_openai_line(text, 1);
  if (r.error.empty()) check_good_line(r);
  check_against_nlohmann(text);
  check_resume_key(r);
  return 0;
}
