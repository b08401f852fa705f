// Decode throughput of the in-memory engine on the CPU backend: the embedded stories260K at
// batch 1 and 64, and a dummy OPT-1.3B (fp16 weights) at batch 1 and 16.
// Usage: bench_decode [gen_len]
#include <fmt/format.h>

#include <cstdlib>

#include "engine/runtime/generator.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"

using namespace flexh2o;

namespace {

void measure(const engine::ModelOptions& opt, std::int64_t batch, std::int64_t prompt_len, std::int64_t gen_len) {
  auto m = engine::open_model(opt);
  m.config.stop_ids.clear();  // every sequence decodes the full length
  auto be = kernels::make_cpu_backend();
  const auto w = engine::load_weights(m.config, *m.weights);
  engine::Generator gen(*be, m.config, w);
  engine::GenerationRequest req;
  req.sequences = engine::sequences_of(engine::synthetic_prompts(batch, prompt_len, m.config.vocab_size));
  req.max_new_tokens = gen_len;
  gen.generate(req);  // warm-up: thread pools, page faults
  const auto r = gen.generate(req);
  fmt::print("| {} | {} | {} | {} | {:.1f} | {:.1f} |\n", m.config.name, kernels::dtype_name(m.config.dtype), batch,
             gen_len, r.decode_throughput(), r.prefill_throughput());
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t gen_len = argc > 1 ? std::atoll(argv[1]) : 32;
  fmt::print("| model | weights | batch | gen_len | decode tok/s | prefill tok/s |\n|---|---|---|---|---|---|\n");
  engine::ModelOptions stories;
  measure(stories, 1, 8, gen_len);
  measure(stories, 64, 8, gen_len);
  engine::ModelOptions opt;
  opt.model = "opt-1.3b";
  opt.dummy = true;
  measure(opt, 1, 8, gen_len);
  measure(opt, 16, 8, gen_len);
  return 0;
}
