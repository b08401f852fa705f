#include "engine/cli/run_distributed.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/block_scheduler.h"
#include "engine/cli/run_job.h"
#include "engine/distributed/mpi_comm.h"
#include "engine/distributed/pipeline_stage.h"
#include "engine/distributed/sharding.h"
#include "engine/model_shape.h"
#include "offload/text_file.h"
#include "policy/pipeline.h"

namespace flexh2o::cli {

using namespace flexh2o::engine;
using distributed::Bytes;
using distributed::Mpi;
using nlohmann::json;

namespace {

constexpr int kTagShare = 1;   // rank 0 -> r: the prompts of rank r (data parallel)
constexpr int kTagToRoot = 2;  // r -> rank 0: finished lines, then its report

Bytes pack(const json& j) {
  const std::vector<std::uint8_t> v = json::to_cbor(j);
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  return Bytes(p, p + v.size());
}

json unpack(const Bytes& b) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(b.data());
  return json::from_cbor(p, p + b.size());
}

std::string rank_name(const Mpi& mpi) { return fmt::format("rank {} ({})", mpi.rank(), mpi.host()); }

// The prompts every process would make (the same as a one-process run of these flags).
std::vector<PromptItem> job_prompts(const RunOptions& o, const RunSetup& s) {
  const std::int64_t count = o.batch.value_or(s.placed && !s.auto_policy ? s.policy.block_size() : 1);
  return gather_prompts(o, s.model, count);
}

// What a one-process run would still do: the prompts not in --out yet (with --resume).
std::vector<std::size_t> todo_of(const RunOptions& o, const std::vector<PromptItem>& items,
                                 const std::optional<JsonlWriter>& out) {
  std::vector<std::size_t> todo;
  for (std::size_t i = 0; i < items.size(); ++i)
    if (!out || !out->done_ids().count(items[i].id_json)) todo.push_back(i);
  if (o.resume)
    fmt::print(stderr, "resuming: {} of {} prompts already in {}\n", items.size() - todo.size(), items.size(), o.out_file);
  return todo;
}

void check_items(const ModelConfig& cfg, std::span<const PromptItem> items, std::int64_t gen_len) {
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::string> ids;
  for (const auto& it : items) {
    prompts.push_back(it.tokens);
    ids.push_back("id " + it.id_json);
  }
  check_prompts(cfg, prompts, gen_len, ids);
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

json policy_json(const policy::Policy& p) {
  return {{"gpu_batch_size", p.gpu_batch_size},    {"num_gpu_batches", p.num_gpu_batches},
          {"percent", p.percent()},                {"overlap", p.overlap},
          {"sep_layer", p.sep_layer},              {"pin_weight", p.pin_weight},
          {"cpu_cache_compute", p.cpu_cache_compute}, {"kv", p.kv},
          {"compress_weight", p.compress_weight}, {"compress_cache", p.compress_cache},
          {"compress_bits", p.compress_bits}};
}

std::string policy_text(const policy::Policy& p) {
  const auto pct = p.percent();
  return fmt::format("gpu batch {} x {}, percent [{:g} {:g} {:g} {:g} {:g} {:g}]", p.gpu_batch_size, p.num_gpu_batches,
                     pct[0], pct[1], pct[2], pct[3], pct[4], pct[5]);
}

json peaks_json(const offload::Tiers& t) {
  using offload::Tier;
  return {{"gpu", t.budget(Tier::Gpu).peak()}, {"cpu", t.budget(Tier::Cpu).peak()}, {"disk", t.budget(Tier::Disk).peak()}};
}

std::string peaks_text(const json& p) {
  return fmt::format("peak gpu {} | cpu {} | disk {}", offload::format_bytes(p["gpu"].get<std::int64_t>()),
                     offload::format_bytes(p["cpu"].get<std::int64_t>()),
                     offload::format_bytes(p["disk"].get<std::int64_t>()));
}

json result_json(const GenerationResult& r) {
  return {{"prompts", r.sequences},
          {"prompt_tokens", r.prompt_tokens},
          {"generated_tokens", r.generated_tokens},
          {"prefill_seconds", r.prefill_seconds},
          {"decode_seconds", r.decode_seconds},
          {"prefill_throughput", r.prefill_throughput()},
          {"decode_throughput", r.decode_throughput()},
          {"total_throughput", r.total_throughput()}};
}

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

std::string model_line(const RunSetup& s) {
  const ModelConfig c = with_weight_dtype(s.model.config, s.policy.weight_dtype(s.model.config.dtype));
  return fmt::format("model: {} ({} layers, hidden {}, {} weights, {})", s.model.description, c.n_layers, c.hidden,
                     kernels::dtype_name(c.dtype), offload::format_bytes(tensor_bytes(c)));
}

// Rank 0's output: lines in the job's order, written (and fsynced) as soon as they are next.
class OrderedOutput {
 public:
  OrderedOutput(std::optional<JsonlWriter>& out, std::size_t count) : out_(out), order_(count) {}
  void put(std::size_t position, std::string line) { order_.put(position, std::move(line)); }
  void write_ready() {
    const auto lines = order_.take_ready();
    if (lines.empty()) return;
    for (const auto& l : lines)
      if (out_)
        out_->add_line(l);
      else
        fmt::print("{}", l);
    if (out_) out_->flush();
    std::fflush(stdout);
  }

 private:
  std::optional<JsonlWriter>& out_;
  distributed::InOrder order_;
};

// ---- data parallel -------------------------------------------------------------------------

int run_data_parallel(const Mpi& mpi, const RunOptions& o) {
  const int me = mpi.rank(), n = mpi.size();
  // Rank 0 opens the job first, so that an error every rank would meet is said once.
  std::optional<RunSetup> setup;
  std::optional<JsonlWriter> out;
  json share;
  std::size_t job_size = 0;
  if (me == 0) {
    if (o.micro_batches) throw std::invalid_argument("--micro-batches is for pipeline runs (--pipeline N)");
    setup.emplace(open_run(o));
    const std::vector<PromptItem> items = job_prompts(o, *setup);
    if (!o.out_file.empty()) out.emplace(o.out_file, o.resume);
    const std::vector<std::size_t> todo = todo_of(o, items, out);
    job_size = todo.size();
    // Balanced by tokens: each prompt's own plus the ones it will generate.
    std::vector<std::int64_t> cost;
    for (const std::size_t i : todo) cost.push_back(static_cast<std::int64_t>(items[i].tokens.size()) + setup->gen_len);
    const std::vector<int> owner = distributed::deal_balanced(cost, n);
    std::vector<json> shares(static_cast<std::size_t>(n), json::array());
    for (std::size_t p = 0; p < todo.size(); ++p) {
      const PromptItem& it = items[todo[p]];
      shares[static_cast<std::size_t>(owner[p])].push_back(
          {{"position", p}, {"index", todo[p]}, {"id", it.id_json}, {"text", it.text ? json(*it.text) : json()},
           {"tokens", it.tokens}});
    }
    for (int r = 1; r < n; ++r) mpi.send(r, kTagShare, pack(shares[static_cast<std::size_t>(r)]));
    share = std::move(shares[0]);
  } else {
    share = unpack(mpi.recv(0, kTagShare));
    setup.emplace(open_run(o));
  }
  RunSetup& s = *setup;
  std::vector<PromptItem> mine;
  std::vector<std::size_t> positions;
  std::vector<std::uint64_t> streams;
  for (const auto& a : share) {
    PromptItem it{a["id"].get<std::string>(), std::nullopt, a["tokens"].get<std::vector<std::int32_t>>()};
    if (a["text"].is_string()) it.text = a["text"].get<std::string>();
    mine.push_back(std::move(it));
    positions.push_back(a["position"].get<std::size_t>());
    streams.push_back(a["index"].get<std::uint64_t>());
  }
  check_items(s.model.config, mine, s.gen_len);  // this rank's prompts, before loading weights

  if (s.auto_policy && !mine.empty()) {
    const policy::HardwareProfile hw = rank_profile(o, s, mpi);
    const auto prompts = static_cast<std::int64_t>(mine.size());
    const policy::Estimate e = policy::plan(model_shape(s.model.config), hw, {longest_prompt(mine), s.gen_len},
                                            plan_options(o, s, prompts));
    adopt_plan(o, s, e.policy, hw);
    fmt::print(stderr, "{}: {}\n", rank_name(mpi), planned_line(hw, e));
  }
  std::optional<OrderedOutput> output;
  if (me == 0) output.emplace(out, job_size);
  std::vector<distributed::PendingSend> sends;
  int reports_due = n - 1;
  std::vector<json> reports(static_cast<std::size_t>(n));
  // Rank 0 takes what the others finished between its own steps, and writes what is next.
  auto take_messages = [&](bool block) {
    while (reports_due > 0 && (block || mpi.waiting(Mpi::kAnySource, kTagToRoot))) {
      int from = 0;
      const json msg = unpack(mpi.recv(Mpi::kAnySource, kTagToRoot, &from));
      if (msg.contains("report")) {
        reports[static_cast<std::size_t>(from)] = msg["report"];
        --reports_due;
      } else {
        for (std::size_t i = 0; i < msg["positions"].size(); ++i)
          output->put(msg["positions"][i].get<std::size_t>(), msg["lines"][i].get<std::string>());
      }
    }
    output->write_ready();
  };

  json report = {{"name", rank_name(mpi)}, {"rank", me}, {"host", mpi.host()}};
  GenerationResult total;
  std::optional<offload::Trace> trace;
  if (!o.metrics_file.empty() || !o.trace_file.empty()) trace.emplace();
  if (!mine.empty()) {
    const offload::TierOptions to = rank_tiers(s, mpi);
    offload::Tiers tiers(*s.backend, to);
    BlockScheduler sched(*s.backend, tiers, s.model.config, *s.model.weights, s.policy, trace ? &*trace : nullptr);
    const auto block = static_cast<std::size_t>(s.policy.block_size());
    for (std::size_t first = 0; first < mine.size(); first += block) {
      const std::size_t last = std::min(mine.size(), first + block);
      GenerationRequest req;
      req.max_new_tokens = s.gen_len;
      req.sampling = {o.temperature, o.top_p, o.seed};
      for (std::size_t t = first; t < last; ++t) {
        req.prompts.push_back(mine[t].tokens);
        req.streams.push_back(streams[t]);  // the prompt's index in the job: its sampling stream
      }
      if (me == 0) req.on_step = [&](std::int64_t, std::int64_t) { take_messages(false); };
      const GenerationResult r = sched.generate(req);
      json lines = json::array(), at = json::array();
      for (std::size_t t = first; t < last; ++t) {
        std::string line = result_line(o, s.model, mine[t], r.tokens[t - first]);
        if (me == 0) {
          output->put(positions[t], std::move(line));
        } else {
          lines.push_back(std::move(line));
          at.push_back(positions[t]);
        }
      }
      if (me == 0)
        take_messages(false);
      else
        sends.push_back(mpi.isend(0, kTagToRoot, std::make_shared<const Bytes>(pack({{"positions", at}, {"lines", lines}}))));
      total.add(r);
    }
    report["policy"] = policy_json(s.policy);
    report["policy_text"] = policy_text(s.policy);
    report["peak_bytes"] = peaks_json(tiers);
  }
  report["result"] = result_json(total);
  report["spans"] = spans_json(trace ? &*trace : nullptr);
  if (me != 0) {
    sends.push_back(mpi.isend(0, kTagToRoot, std::make_shared<const Bytes>(pack({{"report", report}}))));
    for (auto& p : sends) p.wait();
    return 0;
  }
  take_messages(true);
  reports[0] = report;

  // The report: each rank, then the job (throughput over the slowest rank's generation time).
  fmt::print(stderr, "{}\n", model_line(s));
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
    json entry = r;
    entry.erase("spans");
    entry.erase("policy_text");
    ranks.push_back(std::move(entry));
  }
  const double total_tput = static_cast<double>(generated) / std::max(slowest, 1e-9);
  fmt::print(stderr,
             "data parallel over {} ranks: {} prompts, prompt tokens: {}, generated tokens: {}; total: {:.3f} s, "
             "{:.1f} tok/s\n",
             n, prompts, prompt_tokens, generated, slowest, total_tput);
  if (!o.metrics_file.empty()) {
    const json j = {{"mode", "data_parallel"},   {"model", s.model.description}, {"ranks", ranks},
                    {"prompts", prompts},        {"prompt_tokens", prompt_tokens}, {"generated_tokens", generated},
                    {"total_seconds", slowest},  {"total_throughput", total_tput}};
    offload::write_file_atomically(o.metrics_file, j.dump(2) + "\n");
  }
  if (!o.trace_file.empty()) {
    std::vector<offload::TraceProcess> processes;
    for (const json& r : reports) processes.push_back(trace_process(r));
    offload::write_chrome_json(o.trace_file, processes);
  }
  return 0;
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

int run_pipeline(const Mpi& mpi, const RunOptions& o) {
  const int me = mpi.rank(), n = mpi.size();
  std::optional<RunSetup> setup;
  std::optional<JsonlWriter> out;
  std::vector<PromptItem> items;
  std::vector<std::size_t> todo;
  if (me == 0) {
    if (o.pipeline != n)
      throw std::invalid_argument("--pipeline " + std::to_string(o.pipeline) + " needs " + std::to_string(o.pipeline) +
                                  " ranks but the launcher started " + std::to_string(n) + "; use mpirun -np " +
                                  std::to_string(o.pipeline));
    setup.emplace(open_run(o));
    items = job_prompts(o, *setup);
    check_items(setup->model.config, items, setup->gen_len);  // every stage steps every prompt
    if (!o.out_file.empty()) out.emplace(o.out_file, o.resume);
    todo = todo_of(o, items, out);
  }
  mpi.broadcast({}, 0);  // rank 0 took the job: the others open the model now
  if (me != 0) setup.emplace(open_run(o));
  RunSetup& s = *setup;

  // Each rank's capacities to rank 0, which splits the layers and plans every stage.
  json mine;
  if (s.auto_policy) {
    const policy::HardwareProfile hw = rank_profile(o, s, mpi);
    mine = {{"gpu", hw.gpu_mem}, {"cpu", hw.cpu_mem}, {"disk", hw.disk_mem}, {"name", hw.name}};
  }
  const std::vector<Bytes> capacities = mpi.gather(pack(mine), 0);
  json job;
  if (me == 0) {
    const std::int64_t M = o.micro_batches.value_or(n);
    const policy::ModelShape shape = model_shape(s.model.config);
    std::vector<PromptItem> work;
    for (const std::size_t i : todo) work.push_back(items[i]);
    const policy::Workload w{std::max<std::int64_t>(longest_prompt(work), 1), s.gen_len};
    json stages = json::array();
    if (s.auto_policy) {
      std::vector<policy::HardwareProfile> hws;
      for (const Bytes& b : capacities) {
        const json c = unpack(b);
        policy::HardwareProfile hw = rank_profile(o, s, mpi);  // rank 0's rates, each rank's capacities
        hw.gpu_mem = c["gpu"].get<std::int64_t>();
        hw.cpu_mem = c["cpu"].get<std::int64_t>();
        hw.disk_mem = c["disk"].get<std::int64_t>();
        hw.name = c["name"].get<std::string>();
        hws.push_back(hw);
      }
      const auto per_micro_batch = (static_cast<std::int64_t>(todo.size()) + M - 1) / M;
      const policy::PipelineEstimate e = policy::plan_pipeline(shape, hws, w, M, plan_options(o, s, per_micro_batch));
      const policy::Policy& p0 = e.stages.front().policy;
      fmt::print(stderr,
                 "planned a pipeline of {} stages: {} micro-batches of gpu batch {} x {}; predicted total {:.2f} tok/s, "
                 "bubble share {:.0f}%\n",
                 n, M, p0.gpu_batch_size, p0.num_gpu_batches, e.total_throughput, 100 * e.bubble_share);
      for (std::size_t st = 0; st < e.stages.size(); ++st) {
        stages.push_back({{"slice", slice_json(e.slices[st])},
                          {"policy", policy::policy_to_yaml(with_schedule_flags(o, e.stages[st].policy))},
                          {"gpu", hws[st].gpu_mem},
                          {"cpu", hws[st].cpu_mem},
                          {"disk", hws[st].disk_mem}});
      }
    } else {
      for (const auto& slice : policy::split_layers(policy::with_compression(shape, s.policy), n))
        stages.push_back({{"slice", slice_json(slice)}, {"policy", policy::policy_to_yaml(s.policy)}});
    }
    json prompts = json::array(), streams = json::array();
    for (const std::size_t i : todo) {
      prompts.push_back(items[i].tokens);
      streams.push_back(i);
    }
    job = {{"micro_batches", M}, {"stages", stages}, {"prompts", prompts}, {"streams", streams}};
  }
  job = unpack(mpi.broadcast(me == 0 ? pack(job) : Bytes{}, 0));

  // This rank's stage.
  const json& stage = job["stages"][static_cast<std::size_t>(me)];
  const policy::StageSlice slice = slice_of(stage["slice"]);
  s.policy = policy::load_policy_yaml(stage["policy"].get<std::string>(), "the pipeline plan");
  if (stage.contains("gpu")) {
    s.tiers.gpu_bytes = stage["gpu"].get<std::int64_t>();
    s.tiers.cpu_bytes = stage["cpu"].get<std::int64_t>();
    s.tiers.disk_bytes = stage["disk"].get<std::int64_t>();
  }
  distributed::PipelineWork work;
  work.prompts = job["prompts"].get<std::vector<std::vector<std::int32_t>>>();
  work.streams = job["streams"].get<std::vector<std::uint64_t>>();
  work.max_new_tokens = s.gen_len;
  work.sampling = {o.temperature, o.top_p, o.seed};
  work.block = s.policy.block_size();
  work.micro_batches = job["micro_batches"].get<std::int64_t>();

  offload::Tiers tiers(*s.backend, rank_tiers(s, mpi));
  std::optional<offload::Trace> trace;
  if (!o.metrics_file.empty() || !o.trace_file.empty()) trace.emplace();
  BlockScheduler sched(*s.backend, tiers, s.model.config, *s.model.weights, s.policy, trace ? &*trace : nullptr, {},
                       stage_layers(s.model.config, slice));
  mpi.barrier();  // every stage loaded: the clocks (and traces) start together
  if (trace) trace->reset_clock();

  std::optional<OrderedOutput> output;
  if (me == 0) output.emplace(out, (work.prompts.size() + static_cast<std::size_t>(work.block) - 1) /
                                       static_cast<std::size_t>(work.block));
  const auto block = static_cast<std::size_t>(work.block);
  const distributed::StageStats stats =
      distributed::run_pipeline_stage(mpi, sched, work, trace ? &*trace : nullptr,
                                      [&](std::size_t chunk, const GenerationResult& r) {
                                        if (me != 0) return;
                                        std::string lines;
                                        for (std::size_t t = 0; t < r.tokens.size(); ++t)
                                          lines += result_line(o, s.model, items[todo[chunk * block + t]], r.tokens[t]);
                                        output->put(chunk, std::move(lines));
                                        output->write_ready();
                                      });

  json report = {{"name", rank_name(mpi)},
                 {"rank", me},
                 {"host", mpi.host()},
                 {"slice", slice_json(slice)},
                 {"policy", policy_json(s.policy)},
                 {"policy_text", policy_text(s.policy)},
                 {"peak_bytes", peaks_json(tiers)},
                 {"wall_seconds", stats.wall_seconds},
                 {"wait_seconds", stats.wait_seconds},
                 {"result", result_json(stats.total)},
                 {"spans", spans_json(trace ? &*trace : nullptr)}};
  const std::vector<Bytes> all = mpi.gather(pack(report), 0);
  if (me != 0) return 0;

  fmt::print(stderr, "{}\n", model_line(s));
  double waited = 0, wall = 0;
  json stage_reports = json::array();
  std::vector<offload::TraceProcess> processes;
  for (const Bytes& b : all) {
    json r = unpack(b);
    waited += r["wait_seconds"].get<double>();
    wall = std::max(wall, r["wall_seconds"].get<double>());
    fmt::print(stderr, "stage {}, {}: {}, {}, {}; waited {:.3f} s of {:.3f} s\n", r["rank"].get<int>(),
               r["name"].get<std::string>(),
               slice_text(slice_of(r["slice"])), r["policy_text"].get<std::string>(), peaks_text(r["peak_bytes"]),
               r["wait_seconds"].get<double>(), r["wall_seconds"].get<double>());
    processes.push_back(trace_process(r));
    r.erase("spans");
    r.erase("policy_text");
    stage_reports.push_back(std::move(r));
  }
  const double bubble = waited / (static_cast<double>(n) * std::max(wall, 1e-9));
  const GenerationResult& t = stats.total;  // rank 0 saw every block
  const double tput = static_cast<double>(t.generated_tokens) / std::max(wall, 1e-9);
  fmt::print(stderr,
             "pipeline over {} ranks, {} micro-batches: {} prompts, prompt tokens: {}, generated tokens: {}; total: "
             "{:.3f} s, {:.1f} tok/s; bubble share {:.1f}% (time the stages waited on each other)\n",
             n, work.micro_batches, t.sequences, t.prompt_tokens, t.generated_tokens, wall, tput, 100 * bubble);
  if (!o.metrics_file.empty()) {
    const json j = {{"mode", "pipeline"},
                    {"model", s.model.description},
                    {"micro_batches", work.micro_batches},
                    {"stages", stage_reports},
                    {"prompts", t.sequences},
                    {"prompt_tokens", t.prompt_tokens},
                    {"generated_tokens", t.generated_tokens},
                    {"total_seconds", wall},
                    {"total_throughput", tput},
                    {"bubble_share", bubble}};
    offload::write_file_atomically(o.metrics_file, j.dump(2) + "\n");
  }
  if (!o.trace_file.empty()) offload::write_chrome_json(o.trace_file, processes);
  return 0;
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
