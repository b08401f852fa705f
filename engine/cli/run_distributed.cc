#include "engine/cli/run_distributed.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/option_flags.h"
#include "engine/cli/run_job.h"
#include "engine/serving/engine.h"
#include "engine/serving/run_report.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/data_parallel.h"
#include "engine/distributed/pipeline_stage.h"
#include "engine/model/model_shape.h"
#include "policy/pipeline.h"
#include "policy/policy_text.h"

namespace flexh2o::cli {

using namespace flexh2o::engine;
using distributed::Bytes;
using distributed::Mpi;
using distributed::rank_name;
using nlohmann::json;

namespace {

// The job rank 0 reads: the requests a one-process run of these flags would make (an OpenAI
// batch file's, its bad lines' error lines written first), checked against the model before any
// rank loads weights, less those --resume finds done.
struct RootJob {
  std::optional<serving::OpenAiJob> openai;
  std::vector<serving::Request> todo;
};

RootJob read_job(const RunOptions& o, const RunSetup& s, std::optional<serving::ResultFile>& out) {
  RootJob root;
  std::vector<serving::Request> requests;
  if (is_openai_job(o)) {
    root.openai = open_openai_run(o, s, out);
    requests = root.openai->requests;
  } else {
    const std::int64_t count = o.batch.value_or(s.placed && !s.auto_policy ? s.policy.block_size() : 1);
    requests = make_requests(o, s, gather_prompts(o, s.model, count));
  }
  serving::check_requests(s.model.config, requests);
  root.todo = serving::requests_to_run(requests, out, o.resume, o.out_file);
  return root;
}

serving::ResultFormat result_format(const RunOptions& o) {
  return is_openai_job(o) ? serving::ResultFormat::OpenAi : serving::ResultFormat::Simple;
}

// This machine as one of several ranks on it: they share its memory and disk.
policy::HardwareProfile rank_profile(const RunOptions& o, const RunSetup& s, const Mpi& mpi) {
  policy::HardwareProfile hw = planning_profile(o, s);
  if (o.hardware.empty() && mpi.ranks_on_host() > 1) {
    const std::int64_t n = mpi.ranks_on_host();
    for (auto [flag, field] : {std::pair{&o.gpu_mem, &hw.gpu_mem}, std::pair{&o.cpu_mem, &hw.cpu_mem},
                               std::pair{&o.disk_mem, &hw.disk_mem}})
      if (flag->empty()) *field /= n;
    hw.name = fmt::format("this machine (1/{} of it)", n);
  }
  return hw;
}

// The engine of this rank: each rank's disk tier in its own directory under --offload-dir
// (created and removed by it).
serving::EngineOptions rank_engine_options(const RunOptions& o, const RunSetup& s, const Mpi& mpi) {
  serving::EngineOptions eo = engine_options(o, s);
  if (!eo.tiers.offload_dir.empty()) eo.tiers.offload_dir += "/rank-" + std::to_string(mpi.rank());
  return eo;
}

// The report over several ranks from their parts (in rank order): the model as rank 0 stores it,
// and the structured-output constraints as rank 0 compiled them (it reads every request).
serving::RunReport ranks_report(serving::RunMode mode, const RunOptions& o, const RunSetup& s, std::vector<serving::RunPart> parts) {
  serving::RunReport r;
  if (s.constraints) r.structured_output = s.constraints->report();
  r.mode = mode;
  r.model = s.model.description;
  r.stored = with_weight_dtype(s.model.config, s.policy.weight_dtype(s.model.config.dtype));
  r.batching = o.batching;
  r.parts = std::move(parts);
  return r;
}

// ---- data parallel -------------------------------------------------------------------------

// With an automatic policy each rank plans for the job's requests on its part of the machine,
// in blocks of at most an even share of them; a given placement is checked against that part
// before anything loads.
void plan_rank(const Mpi& mpi, const RunOptions& o, RunSetup& s, std::span<const serving::Request> todo) {
  if (todo.empty()) return;
  const policy::HardwareProfile hw = rank_profile(o, s, mpi);
  if (!s.auto_policy) return check_placement_fits(o, s, todo, hw);
  const auto share = static_cast<std::int64_t>((todo.size() + static_cast<std::size_t>(mpi.size()) - 1) /
                                               static_cast<std::size_t>(mpi.size()));
  const policy::Estimate e =
      policy::plan(model_shape(s.model.config), hw, job_workload(o, todo, s.gen_len), plan_options(o, s, share));
  adopt_plan(o, s, e.policy, hw);
  s.predicted = e;
  fmt::print(stderr, "{}: {}\n", rank_name(mpi), planned_line(hw, e));
}

// The ranks' report (the job's totals are their sums), on stderr and in --metrics and --trace;
// where an interrupt stopped some rank, says how far the job got and gives the interrupted
// run's exit status (130) as the one-process run does.
int report_data_parallel(const RunOptions& o, const RunSetup& s, std::vector<serving::RunPart> parts, std::size_t requests) {
  serving::RunReport report = ranks_report(serving::RunMode::DataParallel, o, s, std::move(parts));
  std::size_t finished = 0;
  bool stopped = false;
  for (const serving::RunPart& p : report.parts) {
    report.total.add(p.result);
    finished += p.finished_requests;
    stopped = stopped || p.stopped;
  }
  fmt::print(stderr, "{}{}", report.text(), s.constraints ? s.constraints->summary_line() : "");
  report.write_files(o.metrics_file, o.trace_file, nullptr);
  if (!stopped && finished == requests) return 0;
  fmt::print(stderr, "{}", serving::stopped_message("the ranks", finished, requests, o.out_file));
  return 130;
}

int run_data_parallel(const Mpi& mpi, const RunOptions& o) {
  const serving::InterruptWatch interrupts;  // each rank stops or abandons its own requests
  // Rank 0 opens the job first, so that an error every rank would meet is said once.
  std::optional<RunSetup> setup;
  std::optional<serving::ResultFile> out;
  RootJob root;
  if (mpi.rank() == 0) {
    if (o.micro_batches) throw std::invalid_argument("--micro-batches is for pipeline runs (--pipeline N)");
    open_out(o, out, result_format(o));
    setup.emplace(open_run(o));
    root = read_job(o, *setup, out);
    // A given placement that fits no rank is one error here, before any rank loads.
    if (!setup->auto_policy && !root.todo.empty())
      check_placement_fits(o, *setup, root.todo, rank_profile(o, *setup, mpi));
  }
  const std::vector<serving::Request> todo = distributed::share_requests(mpi, root.todo);
  if (mpi.rank() != 0) setup.emplace(open_run(o));
  RunSetup& s = *setup;
  plan_rank(mpi, o, s, todo);
  settle_compute_dtype(o, s);
  const distributed::RankEngine engine{*s.backend, s.model.config, *s.model.weights, rank_engine_options(o, s, mpi)};
  if (mpi.rank() != 0) return distributed::run_dealt_rank(mpi, engine, todo, interrupts).stopped ? 130 : 0;

  JobResults results(o, s, out, root.openai ? &*root.openai : nullptr);
  std::vector<serving::RunPart> parts =
      distributed::run_dealing_rank(mpi, engine, todo, interrupts, [&](std::size_t i, const GenerationResult& one) {
        results.add(std::span(todo).subspan(i, 1), one);
      });
  return report_data_parallel(o, s, std::move(parts), todo.size());
}

// ---- pipeline parallel ---------------------------------------------------------------------

// Rank 0's plan of every stage: the planner's over each rank's capacities (rank 0's rates),
// or the given policy on an even split of the layers.
json plan_stages(const Mpi& mpi, const RunOptions& o, const RunSetup& s, const std::vector<Bytes>& capacities,
                 std::span<const serving::Request> todo, std::int64_t micro_batches) {
  const policy::ModelShape shape = model_shape(s.model.config);
  json stages = json::array();
  if (!s.auto_policy) {
    for (const auto& slice : policy::split_layers(policy::with_compression(shape, s.policy), mpi.size()))
      stages.push_back({{"slice", serving::to_json(slice)}, {"policy", policy::policy_to_yaml(s.policy)}});
    return stages;
  }
  std::vector<policy::HardwareProfile> hws;
  for (const Bytes& b : capacities) {
    const json c = distributed::from_bytes(b);
    policy::HardwareProfile hw = rank_profile(o, s, mpi);
    hw.gpu_mem = c["gpu"].get<std::int64_t>();
    hw.cpu_mem = c["cpu"].get<std::int64_t>();
    hw.disk_mem = c["disk"].get<std::int64_t>();
    hw.name = c["name"].get<std::string>();
    hws.push_back(hw);
  }
  const policy::Workload w{std::max<std::int64_t>(serving::longest_prompt(todo), 1), serving::longest_limit(todo, s.gen_len)};
  const auto per_micro_batch = (static_cast<std::int64_t>(todo.size()) + micro_batches - 1) / micro_batches;
  const policy::PipelineEstimate e =
      policy::plan_pipeline(shape, hws, w, micro_batches, plan_options(o, s, per_micro_batch));
  const policy::Policy& p0 = e.stages.front().policy;
  fmt::print(stderr,
             "planned a pipeline of {} stages: {} micro-batches of gpu batch {} x {}; predicted total {:.2f} tok/s, "
             "bubble share {:.0f}%\n",
             mpi.size(), micro_batches, p0.gpu_batch_size, p0.num_gpu_batches, e.total_throughput, 100 * e.bubble_share);
  for (std::size_t st = 0; st < e.stages.size(); ++st)
    stages.push_back({{"slice", serving::to_json(e.slices[st])},
                      {"policy", policy::policy_to_yaml(with_schedule_flags(o, e.stages[st].policy))},
                      {"gpu", hws[st].gpu_mem},
                      {"cpu", hws[st].cpu_mem},
                      {"disk", hws[st].disk_mem}});
  return stages;
}

// Every rank's part of the job: each sends rank 0 its capacities, rank 0 plans the stages and
// sends every rank the plan and the requests.
json share_pipeline_job(const Mpi& mpi, const RunOptions& o, const RunSetup& s, std::span<const serving::Request> todo) {
  json mine;
  if (s.auto_policy) {
    const policy::HardwareProfile hw = rank_profile(o, s, mpi);
    mine = {{"gpu", hw.gpu_mem}, {"cpu", hw.cpu_mem}, {"disk", hw.disk_mem}, {"name", hw.name}};
  }
  const std::vector<Bytes> capacities = mpi.gather(distributed::to_bytes(mine), 0);
  json job;
  if (mpi.rank() == 0) {
    const std::int64_t M = o.micro_batches.value_or(mpi.size());
    json requests = json::array();
    for (const serving::Request& r : todo) requests.push_back(serving::to_json(r));
    job = {{"micro_batches", M}, {"stages", plan_stages(mpi, o, s, capacities, todo, M)}, {"requests", requests}};
  }
  return distributed::from_bytes(mpi.broadcast(mpi.rank() == 0 ? distributed::to_bytes(job) : Bytes{}, 0));
}

// Takes this rank's stage of the plan: its policy and capacities into `s`; its slice.
policy::StageSlice take_stage(const json& stage, RunSetup& s) {
  s.policy = policy::load_policy_yaml(stage["policy"].get<std::string>(), "the pipeline plan");
  if (stage.contains("gpu")) {
    s.tiers.gpu_bytes = stage["gpu"].get<std::int64_t>();
    s.tiers.cpu_bytes = stage["cpu"].get<std::int64_t>();
    s.tiers.disk_bytes = stage["disk"].get<std::int64_t>();
  }
  return serving::slice_from_json(stage["slice"]);
}

// Each stage's line, then the pipeline's (rank 0 saw every block: `total`), on stderr and in
// --metrics and --trace.
void report_pipeline(const RunOptions& o, const RunSetup& s, std::int64_t micro_batches, const GenerationResult& total,
                     const std::vector<Bytes>& gathered) {
  std::vector<serving::RunPart> parts;
  for (const Bytes& b : gathered) parts.push_back(serving::part_from_json(distributed::from_bytes(b)));
  serving::RunReport report = ranks_report(serving::RunMode::Pipeline, o, s, std::move(parts));
  report.micro_batches = micro_batches;
  report.total = total;
  fmt::print(stderr, "{}{}", report.text(), s.constraints ? s.constraints->summary_line() : "");
  report.write_files(o.metrics_file, o.trace_file, nullptr);
}

int run_pipeline(const Mpi& mpi, const RunOptions& o) {
  const serving::InterruptWatch interrupts;
  const int me = mpi.rank(), n = mpi.size();
  std::optional<RunSetup> setup;
  std::optional<serving::ResultFile> out;
  RootJob root;
  if (me == 0) {
    if (o.pipeline != n)
      throw std::invalid_argument("--pipeline " + std::to_string(o.pipeline) + " needs " + std::to_string(o.pipeline) +
                                  " ranks but the launcher started " + std::to_string(n) + "; use mpirun -np " +
                                  std::to_string(o.pipeline));
    open_out(o, out, result_format(o));
    setup.emplace(open_run(o));
    root = read_job(o, *setup, out);  // every stage steps every prompt: checked here
  }
  mpi.broadcast({}, 0);  // rank 0 took the job: the others open the model now
  if (me != 0) setup.emplace(open_run(o));
  RunSetup& s = *setup;
  const json shared = share_pipeline_job(mpi, o, s, root.todo);
  const policy::StageSlice slice = take_stage(shared["stages"][static_cast<std::size_t>(me)], s);
  std::vector<serving::Request> requests;
  for (const json& r : shared["requests"]) requests.push_back(serving::request_from_json(r));
  const auto micro_batches = shared["micro_batches"].get<std::int64_t>();
  settle_compute_dtype(o, s);
  serving::EngineOptions eo = rank_engine_options(o, s, mpi);
  eo.stage = slice;
  serving::Engine engine(*s.backend, s.model.config, *s.model.weights, std::move(eo), &interrupts);
  mpi.barrier();  // every stage loaded: the clocks (and traces) start together
  if (engine.trace()) engine.trace()->reset_clock();

  JobResults results(o, s, out, root.openai ? &*root.openai : nullptr);  // rank 0 writes them
  std::size_t finished_requests = 0;
  const auto finished = [&](std::size_t first, const GenerationResult& r) {
    results.add(std::span(requests).subspan(first, r.tokens.size()), r);
    finished_requests += r.tokens.size();
  };
  const distributed::StageStats stats = distributed::run_pipeline_stage(mpi, engine, requests, micro_batches, finished);

  serving::RunPart part = engine.part(rank_name(mpi), me, mpi.host(), stats.total);
  part.slice = slice;
  part.wall_seconds = stats.wall_seconds;
  part.wait_seconds = stats.wait_seconds;
  const std::vector<Bytes> all = mpi.gather(distributed::to_bytes(serving::to_json(part, true)), 0);
  if (me == 0) report_pipeline(o, s, micro_batches, stats.total, all);
  if (!stats.stopped) return 0;
  if (me == 0)
    fmt::print(stderr, "{}", serving::stopped_message("the pipeline", finished_requests, requests.size(), o.out_file));
  return 130;
}

}  // namespace

int run_distributed(const RunOptions& o, const std::function<int()>& one_process) {
  Mpi mpi;
  if (mpi.size() == 1 && o.pipeline == 1) return one_process();
  try {
    return o.pipeline > 1 || mpi.size() == 1 ? run_pipeline(mpi, o) : run_data_parallel(mpi, o);
  } catch (const std::exception& e) {
    // Unwinding removed this rank's offload files; the launcher ends the others (SIGTERM: they
    // remove theirs).
    fmt::print(stderr, "flexh2o: error: {}: {}\n", rank_name(mpi), error_text(e));
    std::fflush(stderr);
    mpi.abort(1);
  }
}

}  // namespace flexh2o::cli
