#include "engine/job/calibrate_units.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <span>
#include <vector>

#include "engine/model/layers.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/model/model_shape.h"
#include "engine/loaders/model_source.h"
#include "engine/model/step.h"
#include "engine/runtime/generation_log.h"
#include "engine/serving/step_scheduler.h"
#include "policy/cost_model.h"

namespace flexh2o::job {

namespace {

// The weights of `units` on the device, random in the model's dtype, held as a run in
// cfg.compute_dtype holds them (held_dtype); one LayerWeights per unit.
struct UnitWeights {
  std::vector<kernels::DeviceBuffer> buffers;
  std::vector<engine::LayerWeights> layers;
};

UnitWeights load_unit_weights(kernels::Backend& be, const engine::ModelConfig& cfg,
                              const std::vector<const engine::Layer*>& units) {
  std::map<std::string, engine::WeightSpec> specs;
  for (const engine::WeightSpec& s : engine::weight_specs(cfg)) specs.emplace(s.name, s);
  const engine::DummyWeights source(cfg, 0);
  UnitWeights w;
  std::map<std::string, kernels::MatrixRef> on_device;  // a tied head names the input embedding
  auto load = [&](const policy::TensorSpec& tensor) {
    if (const auto it = on_device.find(tensor.name); it != on_device.end()) return it->second;
    const engine::WeightSpec& s = specs.at(tensor.name);
    const kernels::DType t = s.dtype(cfg), held = engine::held_dtype(s, cfg, t, be);
    std::vector<std::byte> host(static_cast<std::size_t>(s.rows * kernels::row_bytes(t, s.cols)));
    source.read_rows(s.name, 0, s.rows, host.data(), t);
    engine::hold_rows(host.data(), t, held, s.rows, s.cols);
    w.buffers.emplace_back(be, host.size());
    be.copy_to_device(w.buffers.back().data(), host.data(), host.size());
    return on_device[s.name] = {w.buffers.back().data(), held, s.rows, s.cols};
  };
  for (const engine::Layer* u : units) w.layers.push_back(engine::resolve_weights(*u, load));
  return w;
}

}  // namespace

UnitCurves measure_unit_curves(kernels::Backend& be, const engine::ModelConfig& cfg, std::int64_t max_rows,
                               std::int64_t max_bytes, const TimeCall& time_call,
                               const std::function<void(const std::string&, const std::string&)>& progress) {
  engine::ModelConfig run = cfg;  // its compute dtype is set per row count below
  const auto layers = engine::build_layers(run);
  // build_layers: the input embedding, then attention and MLP per decoder layer, the head last.
  const engine::Layer *attention = layers[1].get(), *mlp = layers[2].get(), *head = layers.back().get();
  std::map<kernels::DType, UnitWeights> held_as;  // by the dtype the backend multiplies the matrices in
  const double layer_flops = 2.0 * static_cast<double>(policy::model_sizes(engine::model_shape(cfg)).layer_params);
  const double head_flops = 2.0 * static_cast<double>(cfg.vocab_size) * static_cast<double>(cfg.hidden);

  UnitCurves c;
  for (std::int64_t rows = 1; rows <= max_rows; rows *= 4) {
    const std::int64_t cache_slots = 2;
    const std::int64_t bytes = engine::Activations::bytes(be, cfg, rows, rows, cache_slots, false) +
                               rows * cfg.hidden * static_cast<std::int64_t>(sizeof(float));
    if (bytes > max_bytes) break;
    run.compute_dtype = engine::job_compute_dtype("auto", cfg.dtype, engine::bf16_speed(be, cfg.dtype), rows).dtype;
    const kernels::DType held = be.gemm_weight_dtype(cfg.dtype, run.compute_dtype);
    if (!held_as.contains(held)) held_as.emplace(held, load_unit_weights(be, run, {attention, mlp, head}));
    const UnitWeights& w = held_as.at(held);
    engine::Activations act(be, cfg, rows, rows);
    kernels::DeviceBuffer hidden(be, static_cast<std::size_t>(rows * cfg.hidden) * sizeof(float));
    const std::vector<float> small(static_cast<std::size_t>(rows * cfg.hidden), 0.01f);
    be.copy_to_device(hidden.data(), small.data(), hidden.bytes());
    act.hidden = hidden.as<float>();
    engine::KvCache kv(be, cfg, rows, cache_slots, cfg.dtype);
    const std::vector<std::vector<std::int32_t>> prompts(static_cast<std::size_t>(rows), std::vector<std::int32_t>{1});
    const engine::StepBatch step = engine::StepBatch::make_prefill(prompts);
    const double layer_s = time_call([&] {
      attention->forward(be, w.layers[0], step, act, &kv.view);
      mlp->forward(be, w.layers[1], step, act, nullptr);
      be.synchronize();
    });
    const double layer_rate = layer_flops * static_cast<double>(rows) / layer_s;
    progress(fmt::format("decoder layer, {} rows, {} compute", rows, kernels::dtype_name(run.compute_dtype)), fmt::format("{:.3g} ms, {:.3g} GFLOP/s", layer_s * 1e3, layer_rate / 1e9));
    c.layer_by_rows.emplace_back(rows, layer_rate);

    if (rows > max_rows / 4) continue;  // the head runs per GPU batch: rarely this many sequences
    std::vector<std::int32_t> next(static_cast<std::size_t>(rows));
    std::vector<std::uint64_t> streams(static_cast<std::size_t>(rows)), steps(static_cast<std::size_t>(rows));
    const std::vector<kernels::SamplingParams> greedy(static_cast<std::size_t>(rows));
    const double head_s = time_call([&] {
      head->forward(be, w.layers[2], step, act, nullptr);
      be.sample({.logits = act.logits.as<float>(), .batch = rows, .vocab = cfg.vocab_size, .params = greedy,
                 .streams = streams, .steps = steps, .out = next});
      be.synchronize();
    });
    const double head_rate = head_flops * static_cast<double>(rows) / head_s;
    progress(fmt::format("output head, {} sequences, {} compute", rows, kernels::dtype_name(run.compute_dtype)), fmt::format("{:.3g} ms, {:.3g} GFLOP/s", head_s * 1e3, head_rate / 1e9));
    c.head_by_rows.emplace_back(rows, head_rate);
  }
  return c;
}

namespace {

// One continuous block of `req` without a model: every step planned, each slot's token sampled
// from `logits` on its own and recorded; the rows sampled.
std::int64_t run_host_loop(kernels::Backend& be, const engine::ModelConfig& cfg, const engine::GenerationRequest& req,
                           std::span<const float> logits) {
  serving::StepScheduler sched(req, req.slots, false);
  const engine::GenerationHooks hooks;
  engine::GenerationLog log(be, cfg, req, hooks);
  std::vector<std::int32_t> token(1);
  std::int64_t rows = 0;
  for (std::int64_t step = 0; log.active(); ++step) {
    const engine::StepPlan plan = sched.next_step();
    std::int64_t computed = 0;
    for (std::size_t slot = 0; slot < plan.slots.size(); ++slot) {
      const engine::SlotStep& s = plan.slots[slot];
      if (s.seq < 0) continue;
      const auto seq = static_cast<std::size_t>(s.seq);
      kernels::SampleArgs args = log.sample_args(logits.data(), seq, token);
      args.logits_on_host = true;
      be.sample(args);
      sched.record(slot, token[0], log.record_token(seq, token[0]));
      ++computed;
    }
    log.end_step(step, computed, step == 0);
    rows += computed;
  }
  return rows;
}

}  // namespace

double host_seconds_per_row(kernels::Backend& be, const engine::ModelConfig& cfg, const TimeCall& time_call) {
  engine::GenerationRequest req;
  req.max_new_tokens = 8;
  req.slots = 64;
  kernels::SamplingParams greedy;
  greedy.ignore_eos = true;  // every sequence runs to its limit
  for (std::int64_t i = 0; i < req.slots; ++i) req.sequences.push_back({.prompt = {1}, .sampling = greedy});
  std::vector<float> logits(static_cast<std::size_t>(cfg.vocab_size));
  for (std::size_t v = 0; v < logits.size(); ++v) logits[v] = static_cast<float>((v * 7919) % 1000) * 1e-3f;
  std::int64_t rows = 0;
  const double seconds = time_call([&] { rows = run_host_loop(be, cfg, req, logits); });
  return seconds / static_cast<double>(std::max<std::int64_t>(rows, 1));
}

}  // namespace flexh2o::job
