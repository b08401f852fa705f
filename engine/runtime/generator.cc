#include "engine/runtime/generator.h"

#include "engine/model/kv_eviction.h"
#include "engine/runtime/graph_step.h"
#include "engine/runtime/prefill_fork.h"
#include "engine/model/rope_scaling.h"
#include "kernels/option_error.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace flexh2o::engine {

Generator::Generator(kernels::Backend& be, const ModelConfig& cfg, const HostWeights& weights,
                     kernels::DType cache_dtype)
    : be_(be), cfg_(cfg), cache_dtype_(cache_dtype), layers_(build_layers(cfg_)) {
  std::map<std::string, const WeightSpec*> specs;
  const std::vector<WeightSpec> all_specs = weight_specs(cfg_);
  for (const WeightSpec& w : all_specs) specs.emplace(w.name, &w);
  std::map<std::string, MatrixRef> on_device;  // a tied head shares the input embedding's copy
  for (const auto& [name, t] : weights) {
    const auto spec = specs.find(name);
    const kernels::DType held = spec == specs.end() ? t.dtype : held_dtype(*spec->second, cfg_, t.dtype, be);
    if (be.kind() == kernels::DeviceKind::Cpu && held == t.dtype) {
      on_device[name] = t.ref();
      continue;
    }
    const auto bytes = static_cast<std::size_t>(t.rows * kernels::row_bytes(t.dtype, t.cols));
    std::vector<std::byte> converted;
    const void* host = t.data.get();
    if (held != t.dtype) {  // rounded once here, not by every GEMM
      converted.assign(t.data.get(), t.data.get() + bytes);
      hold_rows(converted.data(), t.dtype, held, t.rows, t.cols);
      host = converted.data();
    }
    device_copies_.emplace_back(be, bytes);
    be.copy_to_device(device_copies_.back().data(), host, bytes);
    on_device[name] = {device_copies_.back().data(), held, t.rows, t.cols};
  }
  for (const auto& layer : layers_)
    weights_.push_back(resolve_weights(*layer, [&](const policy::TensorSpec& t) { return on_device.at(t.name); }));
}

GenerationResult Generator::generate(const GenerationRequest& req, const GenerationHooks& hooks) {
  GenerationLog log(be_, cfg_, req, hooks);
  const std::int64_t B = static_cast<std::int64_t>(req.sequences.size());
  if (B == 0) return log.finish();
  const std::vector<std::vector<std::int32_t>> prompts = prompts_of(req.sequences);

  const std::int64_t prompt_tokens = log.prompt_tokens();
  std::int64_t capacity = log.max_prompt() + req.max_new_tokens;
  std::vector<std::unique_ptr<KvEvictionLayer>> eviction;
  if (req.kv) {
    check_kv_policy_fits(cfg_, log.max_prompt() + req.max_new_tokens);
    std::vector<std::int64_t> total;
    for (std::size_t b = 0; b < req.sequences.size(); ++b) total.push_back(sequence_tokens(req, b));
    eviction = make_kv_eviction(be_, *req.kv, cfg_, total, prompt_tokens);
    capacity = 0;
    for (const auto& e : eviction) capacity = std::max(capacity, e->capacity());
  }
  std::vector<KvCache> caches;
  for (std::int64_t l = 0; l < cfg_.n_layers; ++l) {
    caches.emplace_back(be_, cfg_, B, capacity, cache_dtype_);
    if (req.kv) caches.back().view.eviction = eviction[static_cast<std::size_t>(l)].get();
  }
  const std::int64_t rows = rows_for_batch(cfg_, prompts, req.max_new_tokens);
  Activations act(be_, cfg_, rows, B);
  kernels::DeviceBuffer hidden(be_, static_cast<std::size_t>(rows * cfg_.hidden) * sizeof(float));
  act.hidden = hidden.as<float>();

  std::vector<std::int32_t> next(static_cast<std::size_t>(B));
  const bool graphs = req.cuda_graphs && !req.kv && cfg_.moe.experts == 0;  // graph_step.h
  auto run_step = [&](const StepBatch& s, std::int64_t step) {
    GraphStepScope graph(be_, graphs ? decode_graph_key(s) : std::nullopt);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const std::int64_t c = layers_[i]->cache_index();
      layers_[i]->forward(be_, weights_[i], s, act, c < 0 ? nullptr : &caches[static_cast<std::size_t>(c)].view);
    }
    graph.end();
    const float* logits = be_.logits_on_host(act.logits.as<float>(), B, cfg_.vocab_size);  // one copy
    if (hooks.on_logits) hooks.on_logits(step, std::span(logits, static_cast<std::size_t>(B * cfg_.vocab_size)));
    kernels::SampleArgs args = log.sample_args(logits, 0, next);
    args.logits_on_host = true;
    be_.sample(args);
    log.record(step, next);
  };

  StepBatch s = StepBatch::make_prefill(prompts);
  run_step(s, 0);
  // Every sequence's tokens so far, for a re-prefill (rope_reprefills).
  std::vector<std::vector<std::int32_t>> history = prompts;
  for (std::int64_t step = 1; log.active(); ++step) {
    for (std::int64_t b = 0; b < B; ++b) history[static_cast<std::size_t>(b)].push_back(next[static_cast<std::size_t>(b)]);
    // Finished sequences keep their slot in the batch (its shape is fixed); their tokens are dropped.
    s = rope_reprefills(cfg_, s.lens) ? StepBatch::make_prefill(history) : StepBatch::make_decode(next, s.lens);
    run_step(s, step);
  }
  return log.finish();
}

}  // namespace flexh2o::engine
