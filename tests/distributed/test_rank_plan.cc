// What the ranks plan apart from MPI: a rank's share of its host, a data-parallel rank's blocks,
// the pipeline's stages over the ranks' profiles, and the pipeline job as it travels (JSON).
#include "engine/distributed/rank_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "engine/serving/run_report.h"

namespace flexh2o::distributed {
namespace {

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

policy::ModelShape opt_1_3b() {
  return {"opt-1.3b", 24, 2048, 8192, 32, 32, 64, 50272, false, true, kernels::DType::F16, kernels::DType::F32, 2050};
}

policy::HardwareProfile t4() {
  return policy::load_hardware_file(std::string(FLEXH2O_SOURCE_DIR) + "/configs/hardware/t4-gcp.yaml");
}

std::vector<serving::Request> requests(std::size_t n, std::int64_t prompt_len, std::int64_t max_tokens) {
  std::vector<serving::Request> r(n);
  for (std::size_t i = 0; i < n; ++i) {
    r[i].id_json = std::to_string(i);
    r[i].prompt.assign(static_cast<std::size_t>(prompt_len), static_cast<std::int32_t>(i + 2));
    r[i].max_tokens = max_tokens;
    r[i].stream = i;
  }
  return r;
}

TEST(DistributedRankShare, SplitsTheHostsCapacitiesButThoseGivenPerRank) {
  HostProfile host{.hw = t4(), .shared = true, .cpu_per_rank = true};
  host.hw.gpu_mem = 16 * kGiB;
  host.hw.cpu_mem = 64 * kGiB;
  host.hw.disk_mem = 1000 * kGiB;
  const policy::HardwareProfile quarter = rank_share(host, 4);
  EXPECT_EQ(quarter.gpu_mem, 4 * kGiB);
  EXPECT_EQ(quarter.cpu_mem, 64 * kGiB);
  EXPECT_EQ(quarter.disk_mem, 250 * kGiB);
  EXPECT_EQ(quarter.name, "this machine (1/4 of it)");
  EXPECT_EQ(quarter.gpu_to_cpu, host.hw.gpu_to_cpu);

  EXPECT_EQ(rank_share(host, 1).gpu_mem, 16 * kGiB);  // alone on its host
  host.shared = false;                                // a given profile: each rank's
  EXPECT_EQ(rank_share(host, 4).gpu_mem, 16 * kGiB);
  EXPECT_EQ(rank_share(host, 4).name, host.hw.name);
}

TEST(DataParallelPlan, BlocksAreAtMostAnEvenShareOfTheRequests) {
  const policy::Workload w{64, 16};
  for (auto [n, ranks, most] : {std::tuple{10, 4, 3}, std::tuple{8, 4, 2}, std::tuple{1, 4, 1}}) {
    const policy::Estimate e = plan_data_parallel_rank(opt_1_3b(), t4(), w, {}, static_cast<std::size_t>(n), ranks);
    EXPECT_GE(e.policy.block_size(), 1);
    EXPECT_LE(e.policy.block_size(), most) << n << " requests over " << ranks << " ranks";
  }
  // Unbounded, the planner takes a larger block on this machine: the share is what bounds it.
  EXPECT_GT(policy::plan(opt_1_3b(), t4(), w, {}).policy.block_size(), 3);
}

TEST(PipelinePlan, GivenPolicyOnAnEvenSplitOfTheLayers) {
  policy::Policy given;
  given.gpu_batch_size = 4;
  given.num_gpu_batches = 2;
  const PipelinePlanning p{.shape = opt_1_3b(), .micro_batches = 2, .given = given};
  const std::vector<policy::HardwareProfile> ranks(3);
  const PipelinePlan plan = plan_stages(p, ranks, requests(5, 8, 8));
  EXPECT_FALSE(plan.estimate);
  ASSERT_EQ(plan.stages.size(), 3u);
  std::int64_t next = 0;
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(plan.stages[s].slice.first_layer, next);
    EXPECT_EQ(plan.stages[s].slice.input, s == 0);
    EXPECT_EQ(plan.stages[s].slice.head, s == 2);
    EXPECT_EQ(policy::policy_to_yaml(plan.stages[s].policy), policy::policy_to_yaml(given));
    next += plan.stages[s].slice.layers;
  }
  EXPECT_EQ(next, 24);
}

TEST(PipelinePlan, PlannedStagesTakeAMicroBatchOfTheRequestsEach) {
  PipelinePlanning p{.shape = opt_1_3b(), .micro_batches = 2};
  std::vector<policy::HardwareProfile> ranks{t4(), t4()};
  ranks[1].gpu_mem = 4 * kGiB;
  const std::vector<serving::Request> todo = requests(9, 40, 12);
  const PipelinePlan plan = plan_stages(p, ranks, todo);
  ASSERT_TRUE(plan.estimate);
  ASSERT_EQ(plan.stages.size(), 2u);
  // The planner's pipeline for the longest prompt and limit, blocks of at most ceil(9 / 2).
  p.options.max_block = 5;
  const policy::PipelineEstimate want = policy::plan_pipeline(opt_1_3b(), ranks, {40, 12}, 2, p.options);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_LE(plan.stages[s].policy.block_size(), 5);
    EXPECT_EQ(policy::policy_to_yaml(plan.stages[s].policy), policy::policy_to_yaml(want.stages[s].policy));
    EXPECT_EQ(plan.stages[s].slice.layers, want.slices[s].layers);
  }
  EXPECT_EQ(plan.estimate->total_throughput, want.total_throughput);
  // Unbounded, the planner takes larger blocks here: the micro-batch is what bounds them.
  p.options.max_block = policy::PlanOptions{}.max_block;
  EXPECT_GT(policy::plan_pipeline(opt_1_3b(), ranks, {40, 12}, 2, p.options).stages[0].policy.block_size(), 5);
}

TEST(PipelinePlan, CapacitiesTravelOnRankZerosRates) {
  policy::HardwareProfile mine = t4();
  mine.gpu_mem = 3 * kGiB;
  mine.cpu_mem = 5 * kGiB;
  mine.disk_mem = 7 * kGiB;
  mine.name = "this machine (1/2 of it)";
  policy::HardwareProfile rates = t4();
  rates.cpu_gemm = 123;
  const policy::HardwareProfile got = with_capacities(rates, capacities_json(mine));
  EXPECT_EQ(got.gpu_mem, 3 * kGiB);
  EXPECT_EQ(got.cpu_mem, 5 * kGiB);
  EXPECT_EQ(got.disk_mem, 7 * kGiB);
  EXPECT_EQ(got.name, mine.name);
  EXPECT_EQ(got.cpu_gemm, 123);
}

TEST(PipelinePlan, JobSurvivesItsJson) {
  PipelineJob job;
  job.micro_batches = 3;
  policy::Policy p;
  p.gpu_batch_size = 6;
  p.set_percent({50, 50, 100, 0, 100, 0});
  job.stages = {{{0, 10, true, false}, p}, {{10, 14, false, true}, policy::Policy{}}};
  job.requests = requests(4, 3, 7);
  job.requests[2].stop = {"\n\n"};
  const PipelineJob back = pipeline_job_from_json(nlohmann::json::parse(to_json(job).dump()));
  EXPECT_EQ(back.micro_batches, 3);
  ASSERT_EQ(back.stages.size(), 2u);
  for (std::size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(serving::to_json(back.stages[s].slice), serving::to_json(job.stages[s].slice));
    EXPECT_EQ(policy::policy_to_yaml(back.stages[s].policy), policy::policy_to_yaml(job.stages[s].policy));
  }
  ASSERT_EQ(back.requests.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(serving::to_json(back.requests[i]), serving::to_json(job.requests[i]));
}

}  // namespace
}  // namespace flexh2o::distributed
