// Throughput with per-request sampling against greedy decoding on the same 32 prompts in
// flight (one batch, in memory, CPU backend): every request its own temperature, top_p,
// top_k, min_p, penalties, logit bias, seed and logprobs, against argmax for all. Both
// variants generate the same number of tokens (stop ids off). Variants run interleaved; the
// table gives each median and the ratio measured in this run (the target: within 5%).
// Usage: bench_sampling [model (default: SmolLM2-135M-Instruct's HF directory when present,
//        else the embedded stories260K)] [gen_len (32)] [reps (3)] [only: greedy | sampled]
// `only` runs that variant alone (for a profiler); its median is printed, no ratio.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "bench/timing.h"
#include "engine/serving/prompts.h"
#include "engine/loaders/model_source.h"
#include "engine/runtime/generator.h"

using namespace flexh2o;

namespace {

constexpr std::int64_t kInFlight = 32;

std::string default_model() {
  const char* home = std::getenv("HOME");
  const std::filesystem::path smol = std::filesystem::path(home ? home : ".") / ".cache/flexh2o/models/smollm2-135m-v5";
  return std::filesystem::exists(smol) ? smol.string() : "";
}

// A different setting per request, every sampler feature in use somewhere.
std::vector<kernels::SamplingParams> mixed_sampling(std::int64_t n, std::int64_t vocab) {
  std::vector<kernels::SamplingParams> out;
  for (std::int64_t i = 0; i < n; ++i) {
    kernels::SamplingParams p;
    p.temperature = 0.6f + 0.05f * static_cast<float>(i % 12);
    p.top_p = i % 2 ? 0.9f : 1.0f;
    p.top_k = i % 3 == 0 ? 40 : 0;
    p.min_p = i % 4 == 1 ? 0.05f : 0.0f;
    p.seed = static_cast<std::uint64_t>(i);
    p.repetition_penalty = i % 5 == 0 ? 1.1f : 1.0f;
    p.presence_penalty = i % 6 == 2 ? 0.5f : 0.0f;
    p.frequency_penalty = i % 7 == 3 ? 0.3f : 0.0f;
    if (i % 8 == 4) p.logit_bias = {{1, -5.0f}, {static_cast<std::int32_t>(vocab / 2), 2.0f}};
    p.logprobs = i % 4 == 0 ? 5 : (i % 4 == 2 ? 0 : -1);
    out.push_back(p);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  engine::ModelOptions opt;
  opt.model = argc > 1 ? argv[1] : default_model();
  const std::int64_t gen_len = argc > 2 ? std::atoll(argv[2]) : 32;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  auto m = engine::open_model(opt);
  m.config.stop_ids.clear();  // every sequence decodes the full length
  auto be = kernels::make_cpu_backend();
  const auto w = engine::load_weights(m.config, *m.weights);
  engine::Generator gen(*be, m.config, w);
  engine::GenerationRequest greedy;
  greedy.sequences = engine::sequences_of(engine::synthetic_prompts(kInFlight, 16, m.config.vocab_size));
  greedy.max_new_tokens = gen_len;
  engine::GenerationRequest sampled = greedy;
  const auto mixed = mixed_sampling(kInFlight, m.config.vocab_size);
  for (std::size_t b = 0; b < mixed.size(); ++b) sampled.sequences[b].sampling = mixed[b];
  std::int64_t tokens[2] = {0, 0};
  const std::function<void()> variants[2] = {[&] { tokens[0] = gen.generate(greedy).generated_tokens; },
                                             [&] { tokens[1] = gen.generate(sampled).generated_tokens; }};
  if (argc > 4) {
    const std::string only = argv[4];
    if (only != "greedy" && only != "sampled") {
      fmt::print(stderr, "bench_sampling: unknown variant '{}' (greedy or sampled)\n", only);
      return 2;
    }
    const int v = only == "greedy" ? 0 : 1;
    const double s = bench::interleaved_medians({variants[v]}, reps)[0];
    fmt::print("{}: {:.3f} s, {:.1f} tok/s (median of {})\n", only, s, static_cast<double>(tokens[v]) / s, reps);
    return 0;
  }
  const std::vector<double> s = bench::interleaved_medians({variants[0], variants[1]}, reps);
  const double greedy_tps = static_cast<double>(tokens[0]) / s[0], sampled_tps = static_cast<double>(tokens[1]) / s[1];
  fmt::print("model {} (vocab {}), {} in flight, {} new tokens each, median of {}\n", opt.model.empty() ? "stories260K" : opt.model,
             m.config.vocab_size, kInFlight, gen_len, reps);
  fmt::print("| variant | seconds | tok/s |\n|---|---|---|\n| greedy | {:.3f} | {:.1f} |\n| per-request sampling | {:.3f} | {:.1f} |\n",
             s[0], greedy_tps, s[1], sampled_tps);
  fmt::print("per-request sampling / greedy throughput: {:.3f}\n", sampled_tps / greedy_tps);
  return 0;
}
