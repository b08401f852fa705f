#include "engine/cli/run_distributed.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/runtime/block_scheduler.h"
#include "engine/cli/run_job.h"
#include "engine/job/job_runner.h"
#include "engine/job/run_report.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/job_queue.h"
#include "engine/distributed/pipeline_stage.h"
#include "engine/model/model_shape.h"
#include "offload/text_file.h"
#include "policy/pipeline.h"
#include "policy/policy_text.h"

namespace flexh2o::cli {

using namespace flexh2o::engine;
using distributed::Bytes;
using distributed::Mpi;
using nlohmann::json;

namespace {

std::string rank_name(const Mpi& mpi) { return fmt::format("rank {} ({})", mpi.rank(), mpi.host()); }

// The job rank 0 reads: the requests a one-process run of these flags would make (an OpenAI
// batch file's, its bad lines' error lines written first), checked against the model before any
// rank loads weights, less those --resume finds done.
struct RootJob {
  std::optional<job::OpenAiJob> openai;
  std::vector<job::Request> todo;
};

RootJob read_job(const RunOptions& o, const RunSetup& s, std::optional<job::ResultFile>& out) {
  RootJob root;
  std::vector<job::Request> requests;
  if (is_openai_job(o)) {
    root.openai = open_openai_run(o, s, out);
    requests = root.openai->requests;
  } else {
    const std::int64_t count = o.batch.value_or(s.placed && !s.auto_policy ? s.policy.block_size() : 1);
    requests = make_requests(o, s, gather_prompts(o, s.model, count));
  }
  job::check_requests(s.model.config, requests);
  root.todo = job::requests_to_run(requests, out, o.resume, o.out_file);
  return root;
}

// Rank 0's requests on every rank.
std::vector<job::Request> share_requests(const Mpi& mpi, const std::vector<job::Request>& todo) {
  json all = json::array();
  if (mpi.rank() == 0)
    for (const job::Request& r : todo) all.push_back(job::to_json(r));
  const json got = distributed::from_bytes(mpi.broadcast(mpi.rank() == 0 ? distributed::to_bytes(all) : Bytes{}, 0));
  if (mpi.rank() == 0) return todo;
  std::vector<job::Request> requests;
  for (const json& r : got) requests.push_back(job::request_from_json(r));
  return requests;
}

job::ResultFormat result_format(const RunOptions& o) {
  return is_openai_job(o) ? job::ResultFormat::OpenAi : job::ResultFormat::Simple;
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

// Each rank's disk tier in its own directory under --offload-dir (created and removed by it).
offload::TierOptions rank_tiers(const RunSetup& s, const Mpi& mpi) {
  offload::TierOptions to = s.tiers;
  to.pin_host = s.policy.pin_weight;
  if (!to.offload_dir.empty()) to.offload_dir += "/rank-" + std::to_string(mpi.rank());
  return to;
}

// What every rank reports of its placement: the policy (as the one-process metrics record it)
// and the peak memory of its tiers.
void add_placement(json& report, const RunSetup& s, const offload::Tiers& tiers) {
  const auto& moe = s.model.config.moe;
  report["policy"] = policy::to_json(s.policy, moe.experts, moe.top_k);
  report["policy_text"] = policy::to_text(s.policy);
  report["peak_bytes"] = job::to_json(job::peaks_of(tiers));
}

std::string peaks_text(const json& p) { return "peak " + job::to_text(job::peaks_from_json(p)); }

json spans_json(const offload::Trace* trace) {
  json out = json::array();
  if (trace)
    for (const auto& s : trace->spans()) out.push_back({s.track, s.primitive, s.name, s.t0, s.t1, s.bytes});
  return out;
}

offload::TraceProcess trace_process(const json& report) {
  offload::TraceProcess p{report["name"].get<std::string>(), {}};
  for (const auto& s : report["spans"])
    p.spans.push_back({s[0].get<std::string>(), s[1].get<std::string>(), s[2].get<std::string>(), s[3].get<double>(),
                       s[4].get<double>(), s[5].get<std::int64_t>()});
  return p;
}

// The model as the one-process report names it, and its size as stored.
std::string model_lines(const RunSetup& s) {
  const ModelConfig c = with_weight_dtype(s.model.config, s.policy.weight_dtype(s.model.config.dtype));
  return job::model_line(s.model.description, c) + "\nmodel size: " + offload::format_bytes(c.weight_bytes());
}

// Where a job's results and reports land: rank 0's output file (or stdout) and metrics.
void write_job_files(const RunOptions& o, const json& metrics, const std::vector<json>& reports) {
  if (!o.metrics_file.empty()) offload::write_file_atomically(o.metrics_file, metrics.dump(2) + "\n");
  if (!o.trace_file.empty()) {
    std::vector<offload::TraceProcess> processes;
    for (const json& r : reports) processes.push_back(trace_process(r));
    offload::write_chrome_json(o.trace_file, processes);
  }
}

// A rank's report as the metrics record it (its trace spans and text go elsewhere).
json metrics_entry(json report) {
  report.erase("spans");
  report.erase("policy_text");
  return report;
}

// ---- data parallel -------------------------------------------------------------------------

// With an automatic policy each rank plans for the job's requests on its part of the machine,
// in blocks of at most an even share of them; a given placement is checked against that part
// before anything loads.
void plan_rank(const Mpi& mpi, const RunOptions& o, RunSetup& s, std::span<const job::Request> todo) {
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

// Requests a rank keeps in hand beyond those running: under continuous batching a few, so that
// a freed slot rarely waits for rank 0's answer; fixed blocks ask for a block as one starts.
std::size_t requests_ahead(const RunOptions& o, std::int64_t slots) {
  return o.batching == "continuous" ? 1 + static_cast<std::size_t>(slots) / 16 : 0;
}

// Runs the requests `source` deals this rank with the job runner; each finished one goes to
// `finished`. A first signal stops taking requests (those running finish), a second abandons
// them (throws job::Interrupted). Returns the rank's report.
json run_rank(const Mpi& mpi, const RunOptions& o, const RunSetup& s, std::span<const job::Request> todo,
              job::RequestSource& source, const job::BlockFinished& finished, std::function<void()> between_steps,
              const job::InterruptWatch& interrupts) {
  json report = {{"name", rank_name(mpi)}, {"rank", mpi.rank()}, {"host", mpi.host()}};
  job::JobOutcome done;
  std::optional<offload::Trace> trace;
  if (!o.metrics_file.empty() || !o.trace_file.empty()) trace.emplace();
  if (!todo.empty()) {
    offload::Tiers tiers(*s.backend, rank_tiers(s, mpi));
    BlockScheduler sched(*s.backend, tiers, s.model.config, *s.model.weights, s.policy, trace ? &*trace : nullptr);
    job::BlockLoopOptions loop;
    loop.block = static_cast<std::size_t>(s.policy.block_size());
    loop.continuous = o.batching == "continuous";
    loop.prefill_budget = prefill_budget_of(o, s);
    loop.share_prefill = o.share_prefill == 1;
    loop.source = &source;
    loop.interrupts = &interrupts;
    loop.results_in = o.out_file;
    loop.between_steps = std::move(between_steps);
    loop.stop_string_seen = stop_string_watch(s);
    loop.constraints = s.constraints.get();
    done = job::run_blocks(sched, todo, loop, finished);
    add_placement(report, s, tiers);
  }
  report["result"] = job::to_json(done.total);
  report["finished_requests"] = done.finished_requests;
  report["stopped"] = done.stopped;
  report["spans"] = spans_json(trace ? &*trace : nullptr);
  return report;
}

// Where each request is in the job, by its id and choice (a fixed block hands the runner's
// callback copies of the requests).
std::map<std::pair<std::string, std::int64_t>, std::size_t> request_positions(std::span<const job::Request> todo) {
  std::map<std::pair<std::string, std::int64_t>, std::size_t> at;
  for (std::size_t i = 0; i < todo.size(); ++i) at.emplace(std::pair(todo[i].id_json, todo[i].choice), i);
  return at;
}

// A rank other than 0: runs what rank 0 deals it and sends back each finished request, then its
// report. Its exit status: 130 when a signal stopped it.
int run_other_rank(const Mpi& mpi, const RunOptions& o, const RunSetup& s, std::span<const job::Request> todo,
                   const job::InterruptWatch& interrupts) {
  const std::int64_t slots = s.policy.block_size();
  distributed::RankQueue queue(mpi, static_cast<std::size_t>(slots), requests_ahead(o, slots));
  const auto at = request_positions(todo);
  const json report = run_rank(
      mpi, o, s, todo, queue,
      [&](std::span<const job::Request> done, const GenerationResult& r) {
        for (std::size_t t = 0; t < done.size(); ++t)
          queue.send_finished(at.at({done[t].id_json, done[t].choice}), r.sequence(t));
      },
      {}, interrupts);
  queue.send_report(report);
  return report["stopped"].get<bool>() ? 130 : 0;
}

// Each rank's line, then the job's (throughput over the slowest rank's generation time).
void report_data_parallel(const RunOptions& o, const RunSetup& s, const std::vector<json>& reports) {
  fmt::print(stderr, "{}\n", model_lines(s));
  std::int64_t prompts = 0, prompt_tokens = 0, generated = 0;
  double slowest = 0;
  json ranks = json::array();
  for (const json& r : reports) {
    const json& res = r["result"];
    const double seconds = res["prefill_seconds"].get<double>() + res["decode_seconds"].get<double>();
    prompts += res["prompts"].get<std::int64_t>();
    prompt_tokens += res["prompt_tokens"].get<std::int64_t>();
    generated += res["generated_tokens"].get<std::int64_t>();
    slowest = std::max(slowest, seconds);
    fmt::print(stderr, "{}: {} prompts{}; generated {} tokens in {:.3f} s, {:.1f} tok/s\n", r["name"].get<std::string>(),
               res["prompts"].get<std::int64_t>(),
               r.contains("policy_text") ? ", " + r["policy_text"].get<std::string>() + ", " + peaks_text(r["peak_bytes"])
                                         : std::string(),
               res["generated_tokens"].get<std::int64_t>(), seconds, res["total_throughput"].get<double>());
    ranks.push_back(metrics_entry(r));
  }
  const double total_tput = static_cast<double>(generated) / std::max(slowest, 1e-9);
  fmt::print(stderr,
             "data parallel over {} ranks: {} prompts, prompt tokens: {}, generated tokens: {}; total: {:.3f} s, "
             "{:.1f} tok/s\n",
             reports.size(), prompts, prompt_tokens, generated, slowest, total_tput);
  write_job_files(o,
                  {{"mode", "data_parallel"}, {"model", s.model.description}, {"ranks", ranks}, {"prompts", prompts},
                   {"prompt_tokens", prompt_tokens}, {"generated_tokens", generated}, {"total_seconds", slowest},
                   {"total_throughput", total_tput}},
                  reports);
}

// After the reports: where an interrupt stopped some rank, says how far the job got and gives
// the interrupted run's exit status (130) as the one-process run does.
int interrupted_status(const RunOptions& o, const std::vector<json>& reports, std::size_t requests) {
  std::size_t finished = 0;
  bool stopped = false;
  for (const json& r : reports) {
    stopped = stopped || r.value("stopped", false);
    finished += r.value("finished_requests", std::size_t{0});
  }
  if (!stopped && finished == requests) return 0;
  fmt::print(stderr, "flexh2o: interrupted: the ranks stopped after {} of the job's {} requests{}\n", finished,
             requests, o.out_file.empty() ? "" : "; rerun with --resume to continue");
  return 130;
}

int run_data_parallel(const Mpi& mpi, const RunOptions& o) {
  const job::InterruptWatch interrupts;  // each rank stops or abandons its own requests
  // Rank 0 opens the job first, so that an error every rank would meet is said once.
  std::optional<RunSetup> setup;
  std::optional<job::ResultFile> out;
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
  const std::vector<job::Request> todo = share_requests(mpi, root.todo);
  if (mpi.rank() != 0) setup.emplace(open_run(o));
  RunSetup& s = *setup;
  plan_rank(mpi, o, s, todo);
  settle_compute_dtype(o, s);
  if (mpi.rank() != 0) return run_other_rank(mpi, o, s, todo, interrupts);

  JobResults results(o, s, out, root.openai ? &*root.openai : nullptr);
  const std::int64_t slots = s.policy.block_size();  // the others' too, where they plan alike
  distributed::RootQueue queue(mpi, todo, static_cast<std::size_t>(slots) + requests_ahead(o, slots),
                               [&](std::size_t i, const GenerationResult& one) {
                                 results.add(std::span(todo).subspan(i, 1), one);
                               });
  json report = run_rank(
      mpi, o, s, todo, queue.source(),
      [&](std::span<const job::Request> done, const GenerationResult& r) { results.add(done, r); },
      [&] { queue.poll(); }, interrupts);
  const std::vector<json> reports = queue.reports(std::move(report));
  report_data_parallel(o, s, reports);
  return interrupted_status(o, reports, todo.size());
}

// ---- pipeline parallel ---------------------------------------------------------------------

json slice_json(const policy::StageSlice& s) {
  return {{"first_layer", s.first_layer}, {"layers", s.layers}, {"input", s.input}, {"head", s.head}};
}

policy::StageSlice slice_of(const json& j) {
  return {j["first_layer"].get<std::int64_t>(), j["layers"].get<std::int64_t>(), j["input"].get<bool>(),
          j["head"].get<bool>()};
}

std::string slice_text(const policy::StageSlice& s) {
  const std::string layers = s.layers == 1 ? fmt::format("decoder layer {}", s.first_layer)
                                           : fmt::format("decoder layers {}-{}", s.first_layer, s.first_layer + s.layers - 1);
  return layers + (s.input ? " + input embedding" : "") + (s.head ? " + head" : "");
}

// Rank 0's plan of every stage: the planner's over each rank's capacities (rank 0's rates),
// or the given policy on an even split of the layers.
json plan_stages(const Mpi& mpi, const RunOptions& o, const RunSetup& s, const std::vector<Bytes>& capacities,
                 std::span<const job::Request> todo, std::int64_t micro_batches) {
  const policy::ModelShape shape = model_shape(s.model.config);
  json stages = json::array();
  if (!s.auto_policy) {
    for (const auto& slice : policy::split_layers(policy::with_compression(shape, s.policy), mpi.size()))
      stages.push_back({{"slice", slice_json(slice)}, {"policy", policy::policy_to_yaml(s.policy)}});
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
  const policy::Workload w{std::max<std::int64_t>(job::longest_prompt(todo), 1), job::longest_limit(todo, s.gen_len)};
  const auto per_micro_batch = (static_cast<std::int64_t>(todo.size()) + micro_batches - 1) / micro_batches;
  const policy::PipelineEstimate e =
      policy::plan_pipeline(shape, hws, w, micro_batches, plan_options(o, s, per_micro_batch));
  const policy::Policy& p0 = e.stages.front().policy;
  fmt::print(stderr,
             "planned a pipeline of {} stages: {} micro-batches of gpu batch {} x {}; predicted total {:.2f} tok/s, "
             "bubble share {:.0f}%\n",
             mpi.size(), micro_batches, p0.gpu_batch_size, p0.num_gpu_batches, e.total_throughput, 100 * e.bubble_share);
  for (std::size_t st = 0; st < e.stages.size(); ++st)
    stages.push_back({{"slice", slice_json(e.slices[st])},
                      {"policy", policy::policy_to_yaml(with_schedule_flags(o, e.stages[st].policy))},
                      {"gpu", hws[st].gpu_mem},
                      {"cpu", hws[st].cpu_mem},
                      {"disk", hws[st].disk_mem}});
  return stages;
}

// Every rank's part of the job: each sends rank 0 its capacities, rank 0 plans the stages and
// sends every rank the plan and the requests.
json share_pipeline_job(const Mpi& mpi, const RunOptions& o, const RunSetup& s, std::span<const job::Request> todo) {
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
    for (const job::Request& r : todo) requests.push_back(job::to_json(r));
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
  return slice_of(stage["slice"]);
}

// The stages' work: the job's requests (`requests`, kept alive beside it), with their stop
// strings watched alike on every stage.
distributed::PipelineWork pipeline_work(const RunOptions& o, const json& job, const RunSetup& s,
                                        std::span<const job::Request> requests) {
  distributed::PipelineWork work;
  for (const job::Request& r : requests) {
    work.prompts.push_back(r.prompt);
    work.streams.push_back(r.stream);
    work.max_new_tokens.push_back(r.max_tokens);
    work.sampling.push_back(r.sampling);
    if (o.share_prefill == 1) work.shares_prompt.push_back(job::shares_prompt_of_previous(requests, work.prompts.size() - 1));
  }
  work.constraints = job::request_constraints(requests, s.constraints.get());
  if (auto seen = stop_string_watch(s))
    work.stop_here = [requests, seen = std::move(seen)](std::size_t p, std::span<const std::int32_t> generated) {
      return job::stop_string_ends(seen, requests[p], generated);
    };
  work.block = s.policy.block_size();
  work.micro_batches = job["micro_batches"].get<std::int64_t>();
  work.continuous = o.batching == "continuous";
  work.prefill_budget = prefill_budget_of(o, s);
  return work;
}

// Each stage's line, then the pipeline's (rank 0 saw every block: `total`).
void report_pipeline(const RunOptions& o, const RunSetup& s, std::int64_t micro_batches, const GenerationResult& total,
                     const std::vector<Bytes>& gathered) {
  fmt::print(stderr, "{}\n", model_lines(s));
  double waited = 0, wall = 0;
  json stage_reports = json::array();
  std::vector<json> reports;
  for (const Bytes& b : gathered) {
    const json r = distributed::from_bytes(b);
    waited += r["wait_seconds"].get<double>();
    wall = std::max(wall, r["wall_seconds"].get<double>());
    fmt::print(stderr, "stage {}, {}: {}, {}, {}; waited {:.3f} s of {:.3f} s\n", r["rank"].get<int>(),
               r["name"].get<std::string>(), slice_text(slice_of(r["slice"])), r["policy_text"].get<std::string>(),
               peaks_text(r["peak_bytes"]), r["wait_seconds"].get<double>(), r["wall_seconds"].get<double>());
    stage_reports.push_back(metrics_entry(r));
    reports.push_back(r);
  }
  const double bubble = waited / (static_cast<double>(gathered.size()) * std::max(wall, 1e-9));
  const double tput = static_cast<double>(total.generated_tokens) / std::max(wall, 1e-9);
  fmt::print(stderr,
             "pipeline over {} ranks, {} micro-batches ({} batching): {} prompts, prompt tokens: {} ({} computed), "
             "generated tokens: {}; total: {:.3f} s, {:.1f} tok/s; slot utilisation {:.2f} ({} sequence rows "
             "computed); bubble share {:.1f}% (time the stages waited on each other)\n",
             gathered.size(), micro_batches, o.batching, total.sequences, total.prompt_tokens,
             total.prompt_tokens_computed, total.generated_tokens, wall, tput, total.slot_utilisation(),
             total.sequence_steps, 100 * bubble);
  write_job_files(o,
                  {{"mode", "pipeline"}, {"model", s.model.description}, {"micro_batches", micro_batches},
                   {"stages", stage_reports}, {"prompts", total.sequences}, {"prompt_tokens", total.prompt_tokens},
                   {"prompt_tokens_computed", total.prompt_tokens_computed}, {"generated_tokens", total.generated_tokens}, {"total_seconds", wall}, {"total_throughput", tput},
                   {"batching", o.batching}, {"slot_utilisation", total.slot_utilisation()},
                   {"bubble_share", bubble}},
                  reports);
}

// A pipeline's interrupts: a first signal on any stage stops the job from taking requests
// (every stage agrees when; the requests in flight finish), a second abandons them.
distributed::StageControl stage_control(const job::InterruptWatch& interrupts, const std::string& results_in) {
  return {.stop_requested = [&interrupts] { return interrupts.stop_requested(); },
          .before_step =
              [&interrupts, results_in] {
                if (interrupts.abandon_requested())
                  throw job::Interrupted("interrupted: the requests in flight were abandoned; finished ones are in " +
                                         (results_in.empty() ? std::string("the output")
                                                             : results_in + "; rerun with --resume to continue"));
              }};
}

int run_pipeline(const Mpi& mpi, const RunOptions& o) {
  const job::InterruptWatch interrupts;
  const int me = mpi.rank(), n = mpi.size();
  std::optional<RunSetup> setup;
  std::optional<job::ResultFile> out;
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
  std::vector<job::Request> requests;
  for (const json& r : shared["requests"]) requests.push_back(job::request_from_json(r));
  const distributed::PipelineWork work = pipeline_work(o, shared, s, requests);
  settle_compute_dtype(o, s);

  offload::Tiers tiers(*s.backend, rank_tiers(s, mpi));
  std::optional<offload::Trace> trace;
  if (!o.metrics_file.empty() || !o.trace_file.empty()) trace.emplace();
  BlockScheduler sched(*s.backend, tiers, s.model.config, *s.model.weights, s.policy, trace ? &*trace : nullptr, {},
                       stage_layers(s.model.config, slice));
  mpi.barrier();  // every stage loaded: the clocks (and traces) start together
  if (trace) trace->reset_clock();

  JobResults results(o, s, out, root.openai ? &*root.openai : nullptr);  // rank 0 writes them
  std::size_t finished_requests = 0;
  const auto finished = [&](std::size_t first, const GenerationResult& r) {
    results.add(std::span(requests).subspan(first, r.tokens.size()), r);
    finished_requests += r.tokens.size();
  };
  const distributed::StageStats stats = distributed::run_pipeline_stage(mpi, sched, work, trace ? &*trace : nullptr,
                                                                       finished, stage_control(interrupts, o.out_file));

  json report = {{"name", rank_name(mpi)},
                 {"rank", me},
                 {"host", mpi.host()},
                 {"slice", slice_json(slice)},
                 {"wall_seconds", stats.wall_seconds},
                 {"wait_seconds", stats.wait_seconds},
                 {"result", job::to_json(stats.total)},
                 {"spans", spans_json(trace ? &*trace : nullptr)}};
  add_placement(report, s, tiers);
  const std::vector<Bytes> all = mpi.gather(distributed::to_bytes(report), 0);
  if (me == 0) report_pipeline(o, s, work.micro_batches, stats.total, all);
  if (!stats.stopped) return 0;
  if (me == 0)
    fmt::print(stderr, "flexh2o: interrupted: the pipeline stopped after {} of {} requests{}\n", finished_requests,
               requests.size(), o.out_file.empty() ? "" : "; rerun with --resume to continue");
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
    fmt::print(stderr, "flexh2o: error: {}: {}\n", rank_name(mpi), e.what());
    std::fflush(stderr);
    mpi.abort(1);
  }
}

}  // namespace flexh2o::cli
