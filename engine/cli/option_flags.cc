#include "engine/cli/option_flags.h"

namespace flexh2o::cli {

std::string flag_of(kernels::Option o) {
  using kernels::Option;
  switch (o) {
    case Option::GenLen: return "--gen-len";
    case Option::KvPolicy: return "--kv";
    case Option::CompressWeight: return "--compress-weight";
    case Option::ChatTemplate: return "--template";
    case Option::TemplateName: return "--template-name";
    case Option::Tokenizer: return "--tokenizer";
    case Option::ComputeDtype: return "--compute-dtype";
    case Option::Model: return "--model";
    case Option::DummyWeights: return "--dummy";
    case Option::GpuMem: return "--gpu-mem";
    case Option::CpuMem: return "--cpu-mem";
    case Option::DiskMem: return "--disk-mem";
    case Option::OffloadDir: return "--offload-dir";
    case Option::CpuCacheCompute: return "--cpu-cache-compute";
    case Option::EvalPrefill: return "--prefill";
    case Option::Placement: return "--percent";
    case Option::Policy: return "--policy";
    case Option::GpuBatchSize: return "--gpu-batch-size";
    case Option::Resume: return "--resume";
    case Option::Results: return "--out";
    case Option::Pipeline: return "--pipeline";
    case Option::MicroBatches: return "--micro-batches";
    case Option::Hardware: return "--hardware";
    case Option::Prompts: return "--prompts";
    case Option::Metrics: return "--metrics";
    case Option::Trace: return "--trace";
    case Option::Batching: return "--batching";
    case Option::PromptLen: return "--prompt-len";
    case Option::MeanPromptLen: return "--mean-prompt-len";
    case Option::MeanGenLen: return "--mean-gen-len";
    case Option::SharedPrefix: return "--shared-prefix";
    case Option::PrefixFamilies: return "--prefix-families";
  }
  return std::string(kernels::option_meaning(o));
}

std::string error_text(const std::exception& e) {
  if (const auto* t = dynamic_cast<const kernels::OptionText*>(&e)) return t->text(flag_of);
  return e.what();
}

}  // namespace flexh2o::cli
