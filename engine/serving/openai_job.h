// An OpenAI batch file as a job: its lines made into prompts (chat messages through the model's
// chat template, completion texts through the tokenizer), checked against the model (a prompt
// too long, a token outside the vocabulary: an error for that line), expanded into one Request
// per choice, and the choices gathered back into one result line per request.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/serving/openai_batch.h"
#include "engine/serving/openai_results.h"
#include "engine/serving/request.h"
#include "engine/model/model_config.h"

namespace flexh2o::serving {

struct OpenAiPromptContext {
  const engine::ModelConfig* config = nullptr;
  const engine::Tokenizer* tok = nullptr;  // null: only completions given as token ids can run
  // The chat template rendered over a request's messages with add_generation_prompt (throws
  // naming what went wrong; null: the model has no chat template).
  std::function<std::string(const nlohmann::ordered_json& messages)> render_chat;
  std::int64_t gen_len = policy::kDefaultGenLen;       // max_tokens when a request does not say
  std::uint64_t default_seed = 0;  // the job's --seed, for requests without a seed
  // Compiles structured-output constraints (null: the model has no tokenizer, so none can run).
  JobConstraints* constraints = nullptr;
};

struct OpenAiJob {
  std::vector<OpenAiLine> lines;                  // of the file; bad ones carry their error
  std::vector<std::vector<std::int32_t>> prompts;  // per line (empty for bad lines)
  std::vector<Request> requests;                   // one per choice of every good line
};

// Reads and prepares the file; lines whose preparation fails get that error.
OpenAiJob open_openai_job(const std::string& path, const OpenAiPromptContext& ctx);
// Prepares lines read already (read_openai_batch), as the file's.
OpenAiJob open_openai_job(std::vector<OpenAiLine> lines, const OpenAiPromptContext& ctx);

// A request (line) whose n choices have all finished.
struct FinishedLine {
  std::size_t index = 0;  // into OpenAiJob::lines
  std::vector<ChoiceOutcome> choices;
  std::string text;  // its result line, newline included
};

// Collects the choices of each request as blocks finish; a request's result line is ready
// when its last choice is.
class OpenAiCollector {
 public:
  OpenAiCollector(const OpenAiJob& job, ResultContext ctx) : job_(job), ctx_(std::move(ctx)) {}
  std::vector<FinishedLine> add(std::span<const Request> block, const engine::GenerationResult& r);

 private:
  const OpenAiJob& job_;
  ResultContext ctx_;
  std::map<std::size_t, std::vector<std::optional<ChoiceOutcome>>> pending_;  // by line index
};

}  // namespace flexh2o::serving
