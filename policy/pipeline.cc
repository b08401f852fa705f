#include "policy/pipeline.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace flexh2o::policy {

std::vector<StageSlice> split_layers(const ModelShape& m, std::int64_t stages) {
  if (stages < 1 || stages > m.layers)
    throw std::invalid_argument("a pipeline of " + std::to_string(stages) + " stages needs at least as many decoder layers; " +
                                m.name + " has " + std::to_string(m.layers));
  // Bytes and flops per token of a decoder layer and of the two ends.
  const ModelSizes z = model_sizes(m);
  ModelShape ends = m;
  ends.layers = 0;
  ends.output_head = false;
  const double in_bytes = static_cast<double>(model_sizes(ends).embedding_weights);
  ends.input_embedding = false;
  ends.output_head = true;
  ends.tied_embeddings = false;
  const double head_bytes = static_cast<double>(model_sizes(ends).embedding_weights);
  const double layer_bytes = static_cast<double>(z.layer_weights), layer_flops = 2.0 * static_cast<double>(z.layer_params);
  const double head_flops = 2.0 * static_cast<double>(m.vocab) * static_cast<double>(m.hidden);
  const double n = static_cast<double>(m.layers);
  const double all_bytes = n * layer_bytes + in_bytes + head_bytes, all_flops = n * layer_flops + head_flops;
  const auto S = static_cast<std::size_t>(stages), L = static_cast<std::size_t>(m.layers);
  auto cost = [&](std::size_t stage, std::size_t layers) {
    const double l = static_cast<double>(layers);
    const double bytes = l * layer_bytes + (stage == 0 ? in_bytes : 0) + (stage + 1 == S ? head_bytes : 0);
    const double flops = l * layer_flops + (stage + 1 == S ? head_flops : 0);
    return std::max(bytes / all_bytes, flops / all_flops);
  };
  // best[s][j]: the least largest cost of stages [0, s] holding the first j layers.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<std::size_t>> take(S, std::vector<std::size_t>(L + 1, 0));
  for (std::size_t j = 1; j <= L; ++j) {
    best[0][j] = cost(0, j);
    take[0][j] = j;
  }
  for (std::size_t s = 1; s < S; ++s)
    for (std::size_t j = s + 1; j <= L; ++j)
      for (std::size_t mine = 1; mine + s <= j; ++mine) {
        const double c = std::max(best[s - 1][j - mine], cost(s, mine));
        if (c < best[s][j]) {
          best[s][j] = c;
          take[s][j] = mine;
        }
      }
  std::vector<StageSlice> slices(S);
  for (std::size_t s = S, j = L; s-- > 0;) {
    const std::size_t mine = take[s][j];
    j -= mine;
    slices[s] = {static_cast<std::int64_t>(j), static_cast<std::int64_t>(mine), s == 0, s + 1 == S};
  }
  return slices;
}

ModelShape stage_shape(const ModelShape& m, const StageSlice& s) {
  ModelShape part = m;
  part.layers = s.layers;
  part.input_embedding = s.input;
  part.output_head = s.head;
  if (!s.input) part.extra_embedding_rows = 0;
  return part;
}

PipelineEstimate combine_stages(std::vector<StageSlice> slices, std::vector<Estimate> stages, const Workload& w,
                                std::int64_t micro_batches) {
  PipelineEstimate p;
  p.slices = std::move(slices);
  p.stages = std::move(stages);
  p.micro_batches = micro_batches;
  const double M = static_cast<double>(micro_batches), N = static_cast<double>(p.stages.size());
  double pre_sum = 0, pre_max = 0, gen_sum = 0, gen_max = 0, busy = 0;
  for (const Estimate& e : p.stages) {
    pre_sum += e.prefill_seconds;
    pre_max = std::max(pre_max, e.prefill_seconds);
    gen_sum += e.decode_step_seconds;
    gen_max = std::max(gen_max, e.decode_step_seconds);
    busy += M * (e.prefill_seconds + e.decode_seconds);
  }
  const double steps = static_cast<double>(std::max<std::int64_t>(w.gen_len - 1, 0));
  p.prefill_seconds = pre_sum + (M - 1) * pre_max;
  p.decode_seconds = steps * std::max(M * gen_max, gen_sum);
  const double seqs = M * static_cast<double>(p.stages.front().policy.block_size());
  p.prefill_throughput = seqs * static_cast<double>(w.prompt_len) / p.prefill_seconds;
  p.decode_throughput = p.decode_seconds > 0 ? seqs * steps / p.decode_seconds : 0;
  p.total_throughput = seqs * static_cast<double>(w.gen_len) / (p.prefill_seconds + p.decode_seconds);
  p.bubble_share = 1 - busy / (N * (p.prefill_seconds + p.decode_seconds));
  return p;
}

namespace {

PlanOptions stage_options(PlanOptions o, std::int64_t micro_batches) {
  o.blocks_in_flight = micro_batches;
  return o;
}

// As plan() chooses, by the compute of all the stages.
PipelineEstimate near_tie_choice(const std::vector<PipelineEstimate>& found) {
  auto compute = [](const PipelineEstimate& p) {
    double s = 0;
    for (const Estimate& e : p.stages) s += e.compute_per_token();
    return s;
  };
  return near_tie_pick(std::span<const PipelineEstimate>(found), [](const PipelineEstimate& p) { return p.total_throughput; },
                       compute);
}

void check_stages(std::span<const HardwareProfile> hws, std::int64_t micro_batches) {
  if (hws.empty()) throw std::invalid_argument("a pipeline needs at least one stage");
  if (micro_batches < 1) throw std::invalid_argument("a pipeline needs at least one micro-batch");
}

}  // namespace

PipelineEstimate plan_pipeline(const ModelShape& shape, std::span<const HardwareProfile> hws, const Workload& w,
                               std::int64_t micro_batches, const PlanOptions& options) {
  check_stages(hws, micro_batches);
  const ModelShape m = with_compression(shape, options);
  const auto slices = split_layers(m, static_cast<std::int64_t>(hws.size()));
  const PlanOptions o = stage_options(options, micro_batches);
  auto stages_at = [&](std::int64_t gbs, std::int64_t k) -> std::optional<std::vector<Estimate>> {
    std::vector<Estimate> out;
    for (std::size_t s = 0; s < slices.size(); ++s) {
      auto e = best_placement(stage_shape(m, slices[s]), hws[s], w, o, gbs, k);
      if (!e) return std::nullopt;
      out.push_back(std::move(*e));
    }
    return out;
  };
  std::vector<PipelineEstimate> found;
  search_blocks(o.max_block, [&](std::int64_t gbs, std::int64_t k) {
    auto stages = stages_at(gbs, k);
    if (!stages) return false;
    found.push_back(combine_stages(slices, std::move(*stages), w, micro_batches));
    return true;
  });
  if (!found.empty()) return near_tie_choice(found);
  // Nothing fits: say which stage does not, at the smallest block.
  for (std::size_t s = 0; s < slices.size(); ++s)
    try {
      plan(stage_shape(m, slices[s]), hws[s], w, o);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("pipeline stage " + std::to_string(s) + " (decoder layers " +
                                  std::to_string(slices[s].first_layer) + "-" +
                                  std::to_string(slices[s].first_layer + slices[s].layers - 1) + "): " + e.what());
    }
  throw std::invalid_argument("no gpu batch size fits every stage of the pipeline of " + shape.name + " with " +
                              std::to_string(micro_batches) + " micro-batches; use fewer micro-batches or more memory");
}

PipelineEstimate estimate_pipeline(const ModelShape& shape, std::span<const HardwareProfile> hws, const Workload& w,
                                   const Policy& p, std::int64_t micro_batches, const PlanOptions& options) {
  check_stages(hws, micro_batches);
  const auto slices = split_layers(with_compression(shape, p), static_cast<std::int64_t>(hws.size()));
  const PlanOptions o = stage_options(options, micro_batches);
  std::vector<Estimate> stages;
  for (std::size_t s = 0; s < slices.size(); ++s)
    stages.push_back(estimate_or_throw(stage_shape(shape, slices[s]), hws[s], w, p, o,
                                       "the policy on pipeline stage " + std::to_string(s)));
  return combine_stages(slices, std::move(stages), w, micro_batches);
}

}  // namespace flexh2o::policy
