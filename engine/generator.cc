#include "engine/generator.h"

#include "engine/kv_eviction.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>

namespace flexh2o::engine {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void check_prompts(const ModelConfig& cfg, std::span<const std::vector<std::int32_t>> prompts,
                   std::int64_t max_new_tokens, std::span<const std::string> names) {
  if (max_new_tokens < 1) throw std::invalid_argument("--gen-len must be at least 1");
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    const std::string which = "prompt " + (i < names.size() ? names[i] : std::to_string(i));
    if (p.empty()) throw std::invalid_argument(which + " has no tokens");
    for (auto t : p)
      if (t < 0 || t >= cfg.vocab_size)
        throw std::invalid_argument(which + " holds token id " + std::to_string(t) + " outside the vocabulary [0, " +
                                    std::to_string(cfg.vocab_size) + ")");
    const auto need = static_cast<std::int64_t>(p.size()) + max_new_tokens;
    if (need > cfg.max_positions)
      throw std::invalid_argument(which + " has " + std::to_string(p.size()) + " tokens; with " +
                                  std::to_string(max_new_tokens) + " new tokens it needs " + std::to_string(need) +
                                  " positions but the model has " + std::to_string(cfg.max_positions) +
                                  "; shorten the prompt or lower --gen-len");
  }
}

Generator::Generator(kernels::Backend& be, const ModelConfig& cfg, const HostWeights& weights)
    : be_(be), cfg_(cfg), layers_(build_layers(cfg_)) {
  for (const auto& [name, t] : weights) {
    if (be.kind() == kernels::DeviceKind::Cpu) {
      weights_[name] = t.ref();
      continue;
    }
    const std::size_t bytes = static_cast<std::size_t>(t.rows * t.cols) * kernels::dtype_size(t.dtype);
    device_copies_.emplace_back(be, bytes);
    be.copy_to_device(device_copies_.back().data(), t.data.get(), bytes);
    weights_[name] = {device_copies_.back().data(), t.dtype, t.rows, t.cols};
  }
}

GenerationResult Generator::generate(const GenerationRequest& req) {
  check_prompts(cfg_, req.prompts, req.max_new_tokens);
  const std::int64_t B = static_cast<std::int64_t>(req.prompts.size());
  GenerationResult res;
  res.tokens.resize(static_cast<std::size_t>(B));
  if (B == 0) return res;

  std::vector<std::uint64_t> streams = req.streams;
  if (streams.empty()) {
    streams.resize(static_cast<std::size_t>(B));
    std::iota(streams.begin(), streams.end(), 0);
  }
  std::int64_t max_prompt = 0;
  for (const auto& p : req.prompts) {
    max_prompt = std::max<std::int64_t>(max_prompt, static_cast<std::int64_t>(p.size()));
    res.prompt_tokens += static_cast<std::int64_t>(p.size());
  }
  std::int64_t capacity = max_prompt + req.max_new_tokens;
  std::vector<std::unique_ptr<KvEvictionLayer>> eviction;
  if (req.kv) {
    std::vector<std::int64_t> total;
    for (std::size_t b = 0; b < req.prompts.size(); ++b)
      total.push_back(static_cast<std::int64_t>(req.prompts[b].size()) +
                      (b < req.forced.size() ? static_cast<std::int64_t>(req.forced[b].size()) : req.max_new_tokens));
    eviction = make_kv_eviction(be_, *req.kv, cfg_, total, res.prompt_tokens);
    capacity = 0;
    for (const auto& e : eviction) capacity = std::max(capacity, e->capacity());
  }
  std::vector<KvCache> caches;
  for (std::int64_t l = 0; l < cfg_.n_layers; ++l) {
    caches.emplace_back(be_, cfg_, B, capacity);
    if (req.kv) caches.back().view.eviction = eviction[static_cast<std::size_t>(l)].get();
  }
  Activations act(be_, cfg_, res.prompt_tokens, B);
  kernels::DeviceBuffer hidden(be_, static_cast<std::size_t>(res.prompt_tokens * cfg_.hidden) * sizeof(float));
  act.hidden = hidden.as<float>();

  std::vector<std::int32_t> next(static_cast<std::size_t>(B));
  std::vector<float> host_logits;
  std::vector<bool> done(static_cast<std::size_t>(B), false);
  std::int64_t active = B;

  auto run_step = [&](const StepBatch& s, std::int64_t step) {
    for (const auto& layer : layers_) {
      const std::int64_t c = layer->cache_index();
      layer->forward(be_, weights_, s, act, c < 0 ? nullptr : &caches[static_cast<std::size_t>(c)].view);
    }
    if (req.on_logits) {
      host_logits.resize(static_cast<std::size_t>(B * cfg_.vocab_size));
      be_.copy_to_host(host_logits.data(), act.logits.data(), host_logits.size() * sizeof(float));
      req.on_logits(step, host_logits);
    }
    be_.sample({act.logits.as<float>(), B, cfg_.vocab_size, req.sampling, streams, static_cast<std::uint64_t>(step), next});
    for (std::int64_t b = 0; b < B; ++b) {
      if (done[b]) continue;
      res.tokens[b].push_back(next[b]);
      // A forced sequence runs until its forced tokens are used up, whatever it samples.
      const bool forcing = b < static_cast<std::int64_t>(req.forced.size()) &&
                           step < static_cast<std::int64_t>(req.forced[b].size());
      const bool stop =
          !forcing && std::find(cfg_.stop_ids.begin(), cfg_.stop_ids.end(), next[b]) != cfg_.stop_ids.end();
      if (stop || static_cast<std::int64_t>(res.tokens[b].size()) >= req.max_new_tokens) {
        done[b] = true;
        --active;
      }
    }
    for (std::int64_t b = 0; b < std::min<std::int64_t>(B, static_cast<std::int64_t>(req.forced.size())); ++b)
      if (step < static_cast<std::int64_t>(req.forced[b].size())) next[b] = req.forced[b][step];
    if (req.on_step) req.on_step(step, req.max_new_tokens);
  };

  double t0 = now_seconds();
  StepBatch s = StepBatch::make_prefill(req.prompts);
  run_step(s, 0);
  be_.synchronize();
  res.prefill_seconds = now_seconds() - t0;

  t0 = now_seconds();
  std::vector<std::int64_t> lens = s.lens;
  for (std::int64_t step = 1; active > 0; ++step) {
    // Finished sequences keep their slot in the batch (its shape is fixed); their tokens are dropped.
    s = StepBatch::make_decode(next, lens);
    run_step(s, step);
    lens = s.lens;
    ++res.decode_steps;
  }
  be_.synchronize();
  res.decode_seconds = now_seconds() - t0;
  for (const auto& t : res.tokens) res.generated_tokens += static_cast<std::int64_t>(t.size());
  return res;
}

}  // namespace flexh2o::engine
