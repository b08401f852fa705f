// An error about one of a run's options, thrown below the CLI. The libraries know an option by
// what it means, not by the flag that sets it, so the text names each option by its meaning
// ("the new tokens limit must be at least 1"); the CLI, which knows its flags, renders the same
// error with the flag the user typed ("--gen-len must be at least 1"). Kept in the lowest
// library, so that every library above may throw it.
#pragma once
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace flexh2o::kernels {

enum class Option {
  GenLen,           // the new tokens a request may generate
  KvPolicy,         // KV eviction
  CompressWeight,   // weight compression
  ChatTemplate,     // a chat template given by hand
  TemplateName,     // which of a model's named chat templates
  Tokenizer,        // the tokenizer given by hand
  ComputeDtype,     // how projections multiply
  Model,            // the model
  DummyWeights,     // random weights of the model's shape
  GpuMem,           // the gpu tier's capacity
  CpuMem,           // the cpu tier's capacity
  DiskMem,          // the disk tier's capacity
  OffloadDir,       // the disk tier's directory
  CpuCacheCompute,  // attention over a cpu-homed KV cache on the CPU
  EvalPrefill,      // the prompt tokens an evaluation prefills before it scores
  Placement,        // where weights, KV cache and activations go, in percent per tier
  Policy,           // a policy file, or the planner's choice
  GpuBatchSize,     // sequences per GPU batch
  Resume,           // skip the requests already in the results file
  Results,          // the results file
  Pipeline,         // pipeline stages over the launcher's ranks
  MicroBatches,     // blocks in flight in a pipeline
  Hardware,         // the hardware profile the planner plans with
  Prompts,          // the prompts file
  Metrics,          // the metrics file
  Trace,            // the trace file
  Batching,         // continuous batching or fixed blocks
  PromptLen,        // the longest prompt a plan is for
  MeanPromptLen,    // a plan's mean prompt
  MeanGenLen,       // a plan's mean new tokens
  SharedPrefix,     // a plan's prefix shared by every prompt
  PrefixFamilies,   // how many such prefixes a plan's job mixes
};

// What an option means, as the libraries name it: "the new tokens limit", ...
std::string_view option_meaning(Option o);

// The text of an error that names options, in pieces: words, and the options it names. An
// exception that may name options carries one (OptionError; offload's BudgetExceeded), and the
// CLI finds it there (dynamic_cast) to render the text with its flags.
class OptionText {
 public:
  using Piece = std::variant<std::string, Option>;
  explicit OptionText(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}
  virtual ~OptionText() = default;

  // The text with each option named by `name` (the CLI: its flag).
  std::string text(const std::function<std::string(Option)>& name) const;
  // The text with each option named by option_meaning: what() of the exception.
  std::string text() const;
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  std::vector<Piece> pieces_;
};

// A bad value of an option, or a run its options cannot do.
class OptionError : public std::invalid_argument, public OptionText {
 public:
  OptionError(std::initializer_list<Piece> pieces) : OptionError(std::vector<Piece>(pieces)) {}
  explicit OptionError(std::vector<Piece> pieces);
  // `e` with `context` before it ("m.yaml: field 'dtype': "), its options still named.
  OptionError(const std::string& context, const OptionText& e);
};

// A run that failed for want of something its options give (memory, disk space).
class OptionRuntimeError : public std::runtime_error, public OptionText {
 public:
  OptionRuntimeError(std::initializer_list<Piece> pieces) : OptionRuntimeError(std::vector<Piece>(pieces)) {}
  explicit OptionRuntimeError(std::vector<Piece> pieces);
};

}  // namespace flexh2o::kernels
