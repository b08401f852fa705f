#include "engine/distributed/rank_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "engine/serving/run_report.h"

namespace flexh2o::distributed {

using nlohmann::json;

policy::HardwareProfile rank_share(const HostProfile& host, std::int64_t ranks_on_host) {
  policy::HardwareProfile hw = host.hw;
  if (!host.shared || ranks_on_host <= 1) return hw;
  for (auto [per_rank, field] : {std::pair{host.gpu_per_rank, &hw.gpu_mem}, std::pair{host.cpu_per_rank, &hw.cpu_mem},
                                 std::pair{host.disk_per_rank, &hw.disk_mem}})
    if (!per_rank) *field /= ranks_on_host;
  hw.name = fmt::format("this machine (1/{} of it)", ranks_on_host);
  return hw;
}

policy::Estimate plan_data_parallel_rank(const policy::ModelShape& shape, const policy::HardwareProfile& hw,
                                         const policy::Workload& w, policy::PlanOptions options, std::size_t requests,
                                         int ranks) {
  const auto n = static_cast<std::size_t>(ranks);
  options.max_block = std::max<std::int64_t>(static_cast<std::int64_t>((requests + n - 1) / n), 1);
  return policy::plan(shape, hw, w, options);
}

PipelinePlan plan_stages(const PipelinePlanning& p, std::span<const policy::HardwareProfile> ranks,
                         std::span<const serving::Request> todo) {
  PipelinePlan plan;
  if (p.given) {
    const auto stages = static_cast<std::int64_t>(ranks.size());
    for (const policy::StageSlice& slice : policy::split_layers(policy::with_compression(p.shape, *p.given), stages))
      plan.stages.push_back({slice, *p.given});
    return plan;
  }
  // Every stage steps every request: it must hold the longest prompt and limit.
  const policy::Workload w{std::max<std::int64_t>(serving::longest_prompt(todo), 1),
                           serving::longest_limit(todo, p.gen_len)};
  policy::PlanOptions options = p.options;
  const auto per_micro_batch = (static_cast<std::int64_t>(todo.size()) + p.micro_batches - 1) / p.micro_batches;
  options.max_block = std::max<std::int64_t>(per_micro_batch, 1);
  const policy::PipelineEstimate e = policy::plan_pipeline(p.shape, ranks, w, p.micro_batches, options);
  for (std::size_t st = 0; st < e.stages.size(); ++st) plan.stages.push_back({e.slices[st], e.stages[st].policy});
  plan.estimate = e;
  return plan;
}

std::string pipeline_planned_line(const policy::PipelineEstimate& e, std::int64_t micro_batches) {
  const policy::Policy& p0 = e.stages.front().policy;
  return fmt::format(
      "planned a pipeline of {} stages: {} micro-batches of gpu batch {} x {}; predicted total {:.2f} tok/s, "
      "bubble share {:.0f}%",
      e.stages.size(), micro_batches, p0.gpu_batch_size, p0.num_gpu_batches, e.total_throughput, 100 * e.bubble_share);
}

json capacities_json(const policy::HardwareProfile& hw) {
  return {{"gpu", hw.gpu_mem}, {"cpu", hw.cpu_mem}, {"disk", hw.disk_mem}, {"name", hw.name}};
}

policy::HardwareProfile with_capacities(policy::HardwareProfile rates, const json& capacities) {
  rates.gpu_mem = capacities.at("gpu").get<std::int64_t>();
  rates.cpu_mem = capacities.at("cpu").get<std::int64_t>();
  rates.disk_mem = capacities.at("disk").get<std::int64_t>();
  rates.name = capacities.at("name").get<std::string>();
  return rates;
}

json to_json(const PipelineJob& job) {
  json stages = json::array(), requests = json::array();
  for (const StagePlan& s : job.stages)
    stages.push_back({{"slice", serving::to_json(s.slice)}, {"policy", policy::policy_to_yaml(s.policy)}});
  for (const serving::Request& r : job.requests) requests.push_back(serving::to_json(r));
  return {{"micro_batches", job.micro_batches}, {"stages", stages}, {"requests", requests}};
}

PipelineJob pipeline_job_from_json(const json& j) {
  PipelineJob job;
  job.micro_batches = j.at("micro_batches").get<std::int64_t>();
  for (const json& s : j.at("stages"))
    job.stages.push_back({serving::slice_from_json(s.at("slice")),
                          policy::load_policy_yaml(s.at("policy").get<std::string>(), "the pipeline plan")});
  for (const json& r : j.at("requests")) job.requests.push_back(serving::request_from_json(r));
  return job;
}

}  // namespace flexh2o::distributed
