// What `flexh2o eval` measures: the teacher-forced quality of KV eviction policies, 4-bit
// compression and bf16 compute against the full, uncompressed model, over a text's paragraphs
// (engine/runtime/kv_quality.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/runtime/kv_quality.h"
#include "kernels/dtype.h"

namespace flexh2o::job {

struct EvalOptions {
  std::string model;
  std::string tokenizer;
  bool dummy = false;
  std::string text;       // blank-line-separated paragraphs: the chunks
  std::string text_name;  // where the text came from, for messages
  std::string kv = "full,local:0.2,streaming:0.2,h2o:0.2,tova:0.2,scissorhands:0.2,pyramid:0.2,snapkv:0.2";
  std::vector<std::string> compress_modes = {"none"};  // each of none, cache, weight, both
  std::vector<kernels::DType> compute_dtypes = {kernels::DType::F32};  // each of f32, bf16
  int compress_bits = 4;
  std::int64_t chunks = 64;
  std::int64_t skip = 0;       // paragraphs skipped before the first chunk
  std::string prefill = "1";   // prompt of each chunk: a fraction (0.5) or a token count (1: BOS only)
  std::string backend = "auto";
  std::int64_t batch = 16;
};

struct EvalResults {
  std::string model;   // the model's description
  std::size_t chunks = 0;
  engine::PromptSplit split;
  std::vector<engine::KvQuality> results;  // per KV policy x compression x compute dtype
};

EvalResults evaluate(const EvalOptions& o);

}  // namespace flexh2o::job
