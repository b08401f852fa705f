// Structured output for batch jobs (docs/structured-output.md): the request fields that ask for
// it (OpenAI's response_format, vLLM's guided_json / guided_regex / guided_choice /
// guided_grammar), their travel between ranks, and the job's constraints: each distinct one
// compiled once (engine/grammar) and handed to the runtime as a TokenConstraint per sequence.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grammar/constraint.h"
#include "engine/grammar/mask_prefetcher.h"
#include "engine/model/model_config.h"
#include "engine/runtime/token_constraint.h"
#include "engine/tokenizer/tokenizer.h"

namespace flexh2o::serving {

// The request fields that ask for structured output.
extern const std::vector<std::string> kStructuredOutputFields;

// The most bytes of text a constraint may compile from (a schema written compactly, a regex, a
// grammar, the choices together): compiling takes ~100 bytes a byte (an expression per byte of
// a literal, the schema parsed again), so a 59 MB enum reached 6 GiB; the largest of the 270
// JSONSchemaBench schemas (bench/structured/schemas.jsonl) is 162 KB.
constexpr std::size_t kMaxConstraintBytes = std::size_t{4} << 20;

// A structured-output field that is malformed: the message names it.
struct StructuredOutputError : std::invalid_argument {
  StructuredOutputError(std::string field_name, const std::string& message)
      : std::invalid_argument(message), field(std::move(field_name)) {}
  std::string field;
};

// A request's constraint and the field that gave it.
struct RequestedConstraint {
  std::string field;
  grammar::Constraint constraint;
};

// The constraint a request's fields ask for (`fields`: the request body or prompts line); none
// for no such field or response_format {"type": "text"}. `where` prefixes the field names in
// messages ("body." or ""). Throws StructuredOutputError; the constraint itself is checked
// when compiled (JobConstraints::get).
std::optional<RequestedConstraint> read_structured_output(const nlohmann::ordered_json& fields,
                                                          const std::string& where);

// How a constraint travels between ranks (the spec: each rank compiles it).
nlohmann::json to_json(const grammar::Constraint& c);
grammar::Constraint constraint_from_json(const nlohmann::json& j);

// The model's `vocab_size` tokens as the bytes they stand for (ids past the tokenizer's and
// special tokens: control tokens, never allowed), with `stop_ids` (the model's) as the stop tokens.
grammar::Vocabulary model_vocabulary(const engine::Tokenizer& tok, std::int64_t vocab_size,
                                     std::span<const std::int32_t> stop_ids);

// The constraints of a job over one model's vocabulary, each distinct one compiled once (the
// vocabulary's trie is built with the first); their next masks computed ahead on one worker
// when the step runs on a device.
class JobConstraints {
 public:
  // `tok` must outlive this. `masks_ahead`: compute each sequence's next mask on a worker
  // thread while the step computes (grammar::MaskPrefetcher); for a device backend, whose
  // steps leave the host idle. A CPU backend computes the step on the host's cores, which a
  // worker would take from it.
  JobConstraints(const engine::Tokenizer& tok, const engine::ModelConfig& cfg, bool masks_ahead)
      : tok_(tok), vocab_size_(cfg.vocab_size), stop_ids_(cfg.stop_ids),
        ahead_(masks_ahead ? std::make_shared<grammar::MaskPrefetcher>() : nullptr) {}
  // The constraint in its start state. Throws std::invalid_argument naming what is wrong or
  // not supported (a schema keyword, a regex construct, a grammar line). Thread-safe.
  std::shared_ptr<const engine::TokenConstraint> get(const grammar::Constraint& c);
  // The same for a request that may write `max_tokens` tokens; throws std::invalid_argument too
  // when no output the constraint allows fits in them (it would be cut short, not closed).
  std::shared_ptr<const engine::TokenConstraint> get(const grammar::Constraint& c, std::int64_t max_tokens);
  // What compiling took, for --metrics: {"distinct": constraints compiled, "compile_ms":
  // {"median", "max"} over them, "vocabulary_ms": the trie}; null when none was asked for.
  nlohmann::json report() const;
  // The same as a line for stderr ("" when none was asked for), newline included.
  std::string summary_line() const;

 private:
  std::shared_ptr<const grammar::CompiledGrammar> compiled(const grammar::Constraint& c);

  const engine::Tokenizer& tok_;
  std::int64_t vocab_size_;
  std::vector<std::int32_t> stop_ids_;
  std::once_flag built_;
  double vocabulary_seconds_ = 0;
  std::unique_ptr<grammar::ConstraintCache> cache_;
  std::shared_ptr<grammar::MaskPrefetcher> ahead_;  // null: masks are computed at the draw
};

}  // namespace flexh2o::serving
