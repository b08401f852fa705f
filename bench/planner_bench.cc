// The cost model against the engine on this machine: for several policies of a dummy model on
// the CPU backend (weights, KV and hidden states on every tier), the planner's predicted
// throughput next to the measured one, each policy measured `repeats` times, the policies in
// turn (min / median / max; the error against the median and against the fastest run). Target:
// within +-25% once `flexh2o calibrate` has measured the machine. Then how long planning
// OPT-175B on the T4 takes.
// Usage: bench_planner [profile.yaml] [model] [prompt_len] [gen_len] [repeats]
//   defaults: configs/hardware/ci-cpu.yaml opt-125m 64 8 3
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <cmath>
#include <string>
#include <vector>

#include "engine/runtime/block_executor.h"
#include "engine/serving/generate.h"
#include "engine/model/model_shape.h"
#include "engine/families/model_yaml.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "policy/cost_model.h"

using namespace flexh2o;

int main(int argc, char** argv) {
  const std::string profile = argc > 1 ? argv[1] : std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/ci-cpu.yaml";
  engine::ModelOptions mo;
  mo.model = argc > 2 ? argv[2] : "opt-125m";
  mo.dummy = true;
  mo.dtype = kernels::DType::F16;
  const std::int64_t prompt = argc > 3 ? std::atoll(argv[3]) : 64, gen = argc > 4 ? std::atoll(argv[4]) : 8;
  const int repeats = std::max(1, argc > 5 ? std::atoi(argv[5]) : 3);
  const policy::HardwareProfile hw = policy::load_hardware_file(profile);
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();
  const policy::ModelShape shape = engine::model_shape(m.config);
  const policy::Workload w{prompt, gen};

  struct Case {
    std::string name;
    std::int64_t gbs, k;
    std::array<double, 6> percent;
    bool ccc;
  };
  const std::vector<Case> cases = {
      {"all gpu, batch 4", 4, 1, {100, 0, 100, 0, 100, 0}, false},
      {"all gpu, 8 x 2", 8, 2, {100, 0, 100, 0, 100, 0}, false},
      {"weights 50/50 gpu/cpu", 8, 1, {50, 50, 100, 0, 100, 0}, false},
      {"weights cpu, KV cpu", 8, 2, {0, 100, 0, 100, 100, 0}, false},
      {"weights cpu, KV cpu, ccc", 8, 2, {0, 100, 0, 100, 100, 0}, true},
      {"weights 20/50/30, KV 50/50", 4, 2, {20, 50, 50, 50, 100, 0}, false},
      {"weights 50/50 cpu/disk, KV disk, ccc", 8, 2, {0, 50, 0, 0, 100, 0}, true},
      {"weights disk, KV disk, hidden cpu", 4, 2, {0, 0, 0, 0, 0, 100}, false},
  };
  auto load = [] {
    std::array<double, 3> a{};
    return getloadavg(a.data(), 3) > 0 ? fmt::format("{:.2f}", a[0]) : std::string("?");
  };
  fmt::print("profile {} ({}), model {} (f16 dummy, {} KV), prompt {} + gen {}, {} runs each, interleaved; load {}\n\n",
             hw.name, hw.source, m.config.name, kernels::dtype_name(m.config.dtype), prompt, gen, repeats, load());
  // Every policy's scheduler first (warmed up), then the runs round-robin over the policies,
  // so that a burst of the neighbours' load falls on several policies, not all runs of one.
  auto be = kernels::make_cpu_backend();
  struct Runner {
    std::optional<policy::Estimate> est;
    std::unique_ptr<offload::Tiers> tiers;
    std::unique_ptr<engine::BlockExecutor> sched;
    engine::GenerationRequest req;
    std::vector<engine::GenerationResult> runs;
  };
  std::vector<Runner> runners(cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    policy::Policy p;
    p.gpu_batch_size = c.gbs;
    p.num_gpu_batches = c.k;
    p.set_percent(c.percent);
    p.cpu_cache_compute = c.ccc;
    Runner& r = runners[i];
    r.est = policy::estimate(shape, hw, w, p);
    r.tiers = std::make_unique<offload::Tiers>(*be, offload::TierOptions{});
    r.sched = std::make_unique<engine::BlockExecutor>(*be, *r.tiers, m.config, *m.weights, p);
    r.req.sequences = engine::sequences_of(engine::synthetic_prompts(p.block_size(), prompt, m.config.vocab_size));
    r.req.max_new_tokens = gen;
    serving::generate(*r.sched, r.req);  // warm-up
  }
  for (int i = 0; i < repeats; ++i)
    for (Runner& r : runners) r.runs.push_back(serving::generate(*r.sched, r.req));
  // The error against the median run, and against the fastest: calibrate keeps the fastest of
  // its timing windows (the others measure the neighbours), so the fastest run is the
  // measurement taken the same way.
  fmt::print("| policy | gbs x K | predicted tok/s | measured tok/s min / median / max | predicted / median | "
             "predicted / max | prefill s pred / fastest | decode s pred / fastest |\n|---|---|---|---|---|---|---|---|\n");
  double worst = 0, worst_fastest = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Runner& r = runners[i];
    std::ranges::sort(r.runs, {}, [](const engine::GenerationResult& g) { return g.total_throughput(); });
    const engine::GenerationResult &median = r.runs[r.runs.size() / 2], &fastest = r.runs.back();
    const double predicted = r.est ? r.est->total_throughput : 0;
    worst = std::max(worst, std::abs(predicted / median.total_throughput() - 1));
    worst_fastest = std::max(worst_fastest, std::abs(predicted / fastest.total_throughput() - 1));
    fmt::print("| {} | {} x {} | {:.2f} | {:.2f} / {:.2f} / {:.2f} | {:.2f} | {:.2f} | {:.3f} / {:.3f} | {:.3f} / {:.3f} |\n",
               c.name, c.gbs, c.k, predicted, r.runs.front().total_throughput(), median.total_throughput(),
               fastest.total_throughput(), predicted / median.total_throughput(), predicted / fastest.total_throughput(),
               r.est ? r.est->prefill_seconds : 0.0, fastest.prefill_seconds, r.est ? r.est->decode_seconds : 0.0,
               fastest.decode_seconds);
  }
  fmt::print("\nworst relative error: {:.0f}% against the median run, {:.0f}% against the fastest (target <= 25%); "
             "load {}\n", worst * 100, worst_fastest * 100, load());

  const auto t0 = std::chrono::steady_clock::now();
  auto big = engine::model_shape(engine::builtin_model("opt-175b"));
  policy::HardwareProfile t4 = policy::load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/t4-gcp.yaml");
  const auto e = policy::plan(big, t4, {512, 32});
  fmt::print("plan OPT-175B on t4-gcp: {:.3f} s (block {}, {:.2f} tok/s predicted)\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), e.policy.block_size(),
             e.total_throughput);
  return 0;
}
