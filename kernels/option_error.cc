#include "kernels/option_error.h"

namespace flexh2o::kernels {

std::string_view option_meaning(Option o) {
  switch (o) {
    case Option::GenLen: return "the new tokens limit";
    case Option::KvPolicy: return "the KV eviction policy";
    case Option::CompressWeight: return "weight compression";
    case Option::ChatTemplate: return "a chat template file";
    case Option::TemplateName: return "the chat template's name";
    case Option::Tokenizer: return "a tokenizer file";
    case Option::ComputeDtype: return "the compute dtype";
    case Option::Model: return "the model";
    case Option::DummyWeights: return "random (dummy) weights";
    case Option::GpuMem: return "the gpu tier's capacity";
    case Option::CpuMem: return "the cpu tier's capacity";
    case Option::DiskMem: return "the disk tier's capacity";
    case Option::OffloadDir: return "an offload directory";
    case Option::CpuCacheCompute: return "attention on the CPU over a cpu-homed KV cache";
    case Option::EvalPrefill: return "the evaluation's prefill";
    case Option::Placement: return "the placement percentages";
    case Option::Policy: return "the policy";
    case Option::GpuBatchSize: return "the GPU batch size";
    case Option::Resume: return "resuming";
    case Option::Results: return "a results file";
    case Option::Pipeline: return "pipeline stages";
    case Option::MicroBatches: return "micro-batches";
    case Option::Hardware: return "the hardware profile";
    case Option::Prompts: return "the prompts";
    case Option::Metrics: return "the metrics";
    case Option::Trace: return "the trace";
    case Option::Batching: return "the batching";
    case Option::PromptLen: return "the prompt length";
    case Option::MeanPromptLen: return "the mean prompt length";
    case Option::MeanGenLen: return "the mean new tokens";
    case Option::SharedPrefix: return "the shared prefix";
    case Option::PrefixFamilies: return "the prefix families";
  }
  return "an option";
}

std::string OptionText::text(const std::function<std::string(Option)>& name) const {
  std::string s;
  for (const auto& p : pieces_) s += std::holds_alternative<Option>(p) ? name(std::get<Option>(p)) : std::get<std::string>(p);
  return s;
}

std::string OptionText::text() const {
  return text([](Option o) { return std::string(option_meaning(o)); });
}

OptionError::OptionError(std::vector<Piece> pieces)
    : std::invalid_argument(OptionText(pieces).text()), OptionText(std::move(pieces)) {}

OptionRuntimeError::OptionRuntimeError(std::vector<Piece> pieces)
    : std::runtime_error(OptionText(pieces).text()), OptionText(std::move(pieces)) {}

OptionError::OptionError(const std::string& context, const OptionText& e)
    : OptionError([&] {
        std::vector<Piece> p{context};
        p.insert(p.end(), e.pieces().begin(), e.pieces().end());
        return p;
      }()) {}

}  // namespace flexh2o::kernels
