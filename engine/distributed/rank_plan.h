// What the ranks of a run over several plan with, apart from MPI: a rank's share of its host's
// profile, a data-parallel rank's plan, the pipeline's stages planned over the ranks' profiles,
// and the pipeline's job as rank 0 sends it to every stage (JSON).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/serving/request.h"
#include "policy/cost_model.h"
#include "policy/hardware_profile.h"
#include "policy/pipeline.h"
#include "policy/policy.h"

namespace flexh2o::distributed {

// The profile the ranks plan within: this host's, whose capacities the ranks on it share, or a
// given one, each rank's own.
struct HostProfile {
  policy::HardwareProfile hw;
  bool shared = false;  // hw is this host's (else a given profile)
  // Capacities given for each rank, which the ranks do not split.
  bool gpu_per_rank = false, cpu_per_rank = false, disk_per_rank = false;
};

// One of `ranks_on_host` ranks' part of the host: its shared capacities split evenly.
policy::HardwareProfile rank_share(const HostProfile& host, std::int64_t ranks_on_host);

// A data-parallel rank's plan for the job's workload on its profile `hw`, in blocks of at most
// an even share of the job's `requests` over the `ranks` (the options' max_block aside).
policy::Estimate plan_data_parallel_rank(const policy::ModelShape& shape, const policy::HardwareProfile& hw,
                                         const policy::Workload& w, policy::PlanOptions options, std::size_t requests,
                                         int ranks);

// What the pipeline's stages are planned with: the model as stored and the micro-batches in
// flight; then either a given policy on every stage over an even split of the layers, or the
// planner's over the ranks' shares of `host` with `options` (max_block: a micro-batch's requests).
struct PipelinePlanning {
  policy::ModelShape shape;
  std::int64_t micro_batches = 1;
  std::int64_t gen_len = policy::kDefaultGenLen;  // the limit of a job without requests
  std::optional<policy::Policy> given;
  HostProfile host;              // planned: what each rank plans within
  policy::PlanOptions options;   // planned
};

// One stage of the pipeline: its layers and its policy.
struct StagePlan {
  policy::StageSlice slice;
  policy::Policy policy;
};

struct PipelinePlan {
  std::vector<StagePlan> stages;
  std::optional<policy::PipelineEstimate> estimate;  // planned: the planner's prediction
};

// The stages over the ranks (`ranks`: each one's profile, stage s on ranks[s]) for the job's
// `todo`: as the planner plans them, or `given` on an even split over ranks.size() stages.
PipelinePlan plan_stages(const PipelinePlanning& p, std::span<const policy::HardwareProfile> ranks,
                         std::span<const serving::Request> todo);
// "planned a pipeline of N stages: ...; predicted total X tok/s, bubble share B%" (no newline).
std::string pipeline_planned_line(const policy::PipelineEstimate& e, std::int64_t micro_batches);

// A rank's capacities as it sends them to rank 0, and rank 0's profile (`rates`) with them.
nlohmann::json capacities_json(const policy::HardwareProfile& hw);
policy::HardwareProfile with_capacities(policy::HardwareProfile rates, const nlohmann::json& capacities);

// The job every stage runs, as rank 0 sends it: the micro-batches, each stage's plan and the
// requests.
struct PipelineJob {
  std::int64_t micro_batches = 1;
  std::vector<StagePlan> stages;
  std::vector<serving::Request> requests;
};
nlohmann::json to_json(const PipelineJob& job);
PipelineJob pipeline_job_from_json(const nlohmann::json& j);

}  // namespace flexh2o::distributed
