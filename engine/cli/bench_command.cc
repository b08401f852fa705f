#include "engine/cli/bench_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/runtime/block_scheduler.h"
#include "engine/serving/generate.h"
#include "engine/runtime/machine_profile.h"
#include "engine/model/model_shape.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "offload/text_file.h"
#include "policy/cost_model.h"
#include "policy/policy_text.h"

namespace flexh2o::cli {

namespace {

struct SystemRun {
  std::string system;
  policy::Policy policy;
  engine::GenerationResult result;
  std::array<std::int64_t, 3> peak{};
  double prefill_tput = 0, decode_tput = 0, total_tput = 0;
};

// The largest gbs in [1, max] whose policy fits the profile's memory (the cost model's sizes).
std::int64_t largest_batch(const std::string& system, const policy::ModelShape& m, const policy::HardwareProfile& hw,
                           const policy::Workload& w, policy::Policy p, const policy::PlanOptions& o, std::int64_t max) {
  auto fits = [&](std::int64_t gbs) {
    p.gpu_batch_size = gbs;
    return policy::estimate(m, hw, w, p, o).has_value();
  };
  if (!fits(1)) {
    p.gpu_batch_size = 1;
    policy::estimate_or_throw(m, hw, w, p, o, "system '" + system + "' with one sequence");
  }
  std::int64_t lo = 1, hi = 2;
  while (hi <= max && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, max + 1);
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::vector<std::string> split_list(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

// When the weights do not fit the cpu tier next to one sequence: Accelerate's offload folder
// takes the smallest share to disk that fits; ZeRO-Inference (`whole`) offloads them all to NVMe.
void spill_weights_to_disk(const policy::ModelShape& m, const policy::HardwareProfile& hw, const policy::Workload& w,
                           policy::Policy& p, const policy::PlanOptions& o, bool whole) {
  auto fits = [&](double cpu) {
    policy::Policy q = p;
    q.gpu_batch_size = 1;
    q.weights = {0, cpu, 1 - cpu};
    return policy::estimate(m, hw, w, q, o).has_value();
  };
  if (fits(1)) return;
  if (whole) {
    p.weights = {0, 0, 1};
    return;
  }
  double lo = 0, hi = 1;  // fits(lo), !fits(hi)
  if (!fits(lo)) return;  // largest_batch reports what does not fit
  for (int i = 0; i < 30; ++i) (fits((lo + hi) / 2) ? lo : hi) = (lo + hi) / 2;
  p.weights = {0, lo, 1 - lo};
}

constexpr const char* kSystems = " (accelerate, zero, flexgen, flexgen+h2o, flexgen+4bit, flexgen+4bit+h2o)";

// The policy each system would run with on these limits.
policy::Policy policy_for(const std::string& system, const policy::ModelShape& m, const policy::HardwareProfile& hw,
                          const policy::Workload& w, std::int64_t max_batch, bool allow_ccc) {
  policy::Policy p;
  policy::PlanOptions o;
  o.allow_cpu_cache_compute = allow_ccc;
  if (system == "accelerate") {
    // Layer-by-layer weight streaming for one small batch, KV on the GPU, no overlap; weights
    // that do not fit CPU memory are offloaded to disk (device_map with an offload folder).
    p.set_percent({0, 100, 100, 0, 100, 0});
    p.overlap = false;
    spill_weights_to_disk(m, hw, w, p, o, false);
    p.gpu_batch_size = largest_batch(system, m, hw, w, p, o, max_batch);
  } else if (system == "zero") {
    // ZeRO-Inference as the FlexGen paper ran it: weights streamed per layer from CPU memory
    // (or all from NVMe when they do not fit), KV and activations on the GPU, one batch, no
    // compute/IO overlap.
    p.set_percent({0, 100, 100, 0, 100, 0});
    p.overlap = false;
    spill_weights_to_disk(m, hw, w, p, o, true);
    p.gpu_batch_size = largest_batch(system, m, hw, w, p, o, max_batch);
  } else if (system.starts_with("flexgen")) {
    // flexgen[+h2o][+4bit]: the planner's policy, for the smaller KV (h2o:0.2) and/or 4-bit
    // weights and KV (planner re-run for each).
    const std::string mods = system.substr(7);
    if (!mods.empty() && mods[0] != '+') throw std::invalid_argument("--systems: unknown system '" + system + "'" + kSystems);
    for (const std::string& mod : split_list(mods, '+')) {
      if (mod == "h2o") {
        o.kv = policy::parse_kv_spec("h2o:0.2");
      } else if (mod == "4bit") {
        o.compress_weight = o.compress_cache = true;
      } else {
        throw std::invalid_argument("--systems: unknown system '" + system + "'" + kSystems);
      }
    }
    o.max_block = max_batch;
    p = policy::plan(m, hw, w, o).policy;
  } else {
    throw std::invalid_argument("--systems: unknown system '" + system + "'" + kSystems);
  }
  return p;
}

// A bar chart of total throughput per system with gnuplot (Debian gnuplot-nox), if present.
bool plot(const std::string& dir, const std::vector<SystemRun>& runs, const std::string& title) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) return false;
  std::string data;
  for (const auto& r : runs) data += fmt::format("\"{}\\n(batch {})\" {:.4f}\n", r.system, r.policy.block_size(), r.total_tput);
  offload::write_file_atomically(dir + "/throughput.dat", data);
  const std::string script = fmt::format(
      "set terminal pngcairo size {2},540 font 'sans,12'\n"
      "set output '{0}/throughput.png'\n"
      "set title \"{1}\"\n"
      "set ylabel 'total throughput (generated tokens/s)'\n"
      "set xlabel 'system (effective batch)' offset 0,-1\n"
      "set bmargin 6\n"
      "set style fill solid 0.8\nset boxwidth 0.6\nset grid ytics\nset yrange [0:*]\nunset key\n"
      "set offsets 0, 0, graph 0.12, 0\n"
      "plot '{0}/throughput.dat' using 0:2:xtic(1) with boxes lc rgb '#3b75af', "
      "'' using 0:2:(sprintf('%.2f', $2)) with labels offset 0,1 notitle\n",
      dir, title, std::max<std::size_t>(900, 170 * runs.size()));
  offload::write_file_atomically(dir + "/throughput.gp", script);
  return std::system(("gnuplot '" + dir + "/throughput.gp' 2>/dev/null").c_str()) == 0;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchOptions& o) {
  auto* b = app.add_subcommand("bench", "Throughput of one workload under Accelerate-, ZeRO- and FlexGen-style schedules");
  b->add_option("--model", o.model, "built-in config name, model YAML or checkpoint (default opt-125m)");
  b->add_flag("--dummy", o.dummy, "random weights of the model's shape (implied for a built-in config or model YAML)");
  b->add_option("--dtype", o.dtype, "weight dtype with --dummy")->check(CLI::IsMember({"f32", "f16", "bf16"}));
  b->add_option("--prompt-len", o.prompt_len)->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  b->add_option("--gen-len", o.gen_len)->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  b->add_option("--gpu-mem", o.gpu_mem, "gpu tier capacity for every system (default 256MiB)");
  b->add_option("--cpu-mem", o.cpu_mem, "cpu tier capacity (default: the profile's)");
  b->add_option("--disk-mem", o.disk_mem, "disk tier capacity (default: the profile's)");
  b->add_option("--systems", o.systems, "comma list of accelerate, zero, flexgen, flexgen+h2o, flexgen+4bit, flexgen+4bit+h2o");
  b->add_option("--hardware", o.hardware, "profile (file or built-in name) the planner and batch choices use (default ci-cpu)");
  b->add_option("--out-dir", o.out_dir, "where table.md, results.csv and throughput.png go");
  b->add_option("--backend", o.backend, "compute backend: auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  b->add_option("--compute-dtype", o.compute_dtype, "auto, f32 or bf16 (as for run)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  b->add_option("--max-batch", o.max_batch, "largest effective batch tried")->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  return b;
}

namespace {

// The runs side by side (ratios to the first) as a Markdown table under `header`, printed and
// written to OUT_DIR/table.md, and as OUT_DIR/results.csv.
void write_results(const BenchOptions& o, const std::vector<SystemRun>& runs, const std::string& header) {
  const double base = runs.front().total_tput;
  std::string table = header;
  table += "| system | batch (gbs x K) | policy (WG WC CG CC AG AC) | prefill tok/s | decode tok/s | total tok/s | "
           "peak gpu / cpu / disk | vs " + runs.front().system + " |\n|---|---|---|---|---|---|---|---|\n";
  std::string csv = "system,gpu_batch_size,num_gpu_batches,percent,kv,compressed,prefill_tok_s,decode_tok_s,total_tok_s,peak_gpu,peak_cpu,peak_disk\n";
  for (const auto& r : runs) {
    table += fmt::format("| {} | {} x {} | {}{}{}{} | {:.1f} | {:.2f} | {:.2f} | {} / {} / {} | {:.2f}x |\n", r.system,
                         r.policy.gpu_batch_size, r.policy.num_gpu_batches, policy::percent_text(r.policy, 0),
                         r.policy.cpu_cache_compute ? ", ccc" : "", r.policy.kv == "full" ? "" : ", kv " + r.policy.kv,
                         r.policy.compress_weight ? ", 4-bit" : "",
                         r.prefill_tput, r.decode_tput, r.total_tput, offload::format_bytes(r.peak[0]),
                         offload::format_bytes(r.peak[1]), offload::format_bytes(r.peak[2]), r.total_tput / base);
    csv += fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{},{},{}\n", r.system, r.policy.gpu_batch_size,
                       r.policy.num_gpu_batches, policy::percent_text(r.policy, 0), r.policy.kv, r.policy.compress_weight,
                       r.prefill_tput, r.decode_tput,
                       r.total_tput, r.peak[0], r.peak[1], r.peak[2]);
  }
  fmt::print("{}", table);
  offload::write_file_atomically(o.out_dir + "/table.md", table);
  offload::write_file_atomically(o.out_dir + "/results.csv", csv);
}

}  // namespace

int bench_command(const BenchOptions& o) {
  engine::ModelOptions mo;
  mo.model = o.model;
  // Throughput does not depend on the weights' values: a config without weights runs random ones.
  mo.dummy = o.dummy || !engine::names_weights(o.model);
  mo.dtype = kernels::parse_dtype(o.dtype);
  auto m = engine::open_model(mo);
  m.config.stop_ids.clear();  // every sequence generates gen_len tokens
  policy::HardwareProfile hw = engine::hardware_profile(o.hardware);
  hw.gpu_mem = offload::parse_bytes(o.gpu_mem);
  if (!o.cpu_mem.empty()) hw.cpu_mem = offload::parse_bytes(o.cpu_mem);
  if (!o.disk_mem.empty()) hw.disk_mem = offload::parse_bytes(o.disk_mem);
  const policy::ModelShape shape = engine::model_shape(m.config);
  const policy::Workload w{o.prompt_len, o.gen_len};
  std::filesystem::create_directories(o.out_dir);

  auto be = kernels::make_backend(o.backend);
  // Attention over a cpu-homed KV in place needs a CPU backend beside a device one (not yet).
  const bool allow_ccc = be->kind() == kernels::DeviceKind::Cpu;
  std::vector<SystemRun> runs;
  for (const std::string& system : split_list(o.systems)) {
    SystemRun r;
    r.system = system;
    r.policy = policy_for(system, shape, hw, w, o.max_batch, allow_ccc);
    fmt::print(stderr, "bench: {}: gpu batch {} x {}, percent [{}], overlap {}{}\n", system, r.policy.gpu_batch_size,
               r.policy.num_gpu_batches, policy::percent_text(r.policy, 0), r.policy.overlap,
               r.policy.compress_weight ? ", 4-bit weights and KV" : "");
    offload::TierOptions to;
    to.gpu_bytes = hw.gpu_mem;
    to.cpu_bytes = hw.cpu_mem;
    to.disk_bytes = hw.disk_mem;
    offload::Tiers tiers(*be, to);
    m.config.compute_dtype =
        engine::job_compute_dtype(o.compute_dtype, m.config.dtype, engine::bf16_speed(*be, r.policy.weight_dtype(m.config.dtype)),
                                  r.policy.gpu_batch_size)
            .dtype;
    engine::BlockScheduler sched(*be, tiers, m.config, *m.weights, r.policy);
    engine::GenerationRequest req;
    req.sequences =
        engine::sequences_of(engine::synthetic_prompts(r.policy.block_size(), o.prompt_len, m.config.vocab_size));
    req.max_new_tokens = o.gen_len;
    r.result = serving::generate(sched, req);
    r.prefill_tput = r.result.prefill_throughput();
    r.decode_tput = r.result.decode_throughput();
    r.total_tput = r.result.total_throughput();
    for (int t = 0; t < 3; ++t) r.peak[static_cast<std::size_t>(t)] = tiers.budget(static_cast<offload::Tier>(t)).peak();
    runs.push_back(std::move(r));
  }

  write_results(o, runs,
                fmt::format("model {} ({} dummy weights), prompt {} + gen {}, gpu {} | cpu {} | disk {}\n\n", m.config.name,
                            o.dtype, o.prompt_len, o.gen_len, offload::format_bytes(hw.gpu_mem),
                            offload::format_bytes(hw.cpu_mem), offload::format_bytes(hw.disk_mem)));
  const std::string title =
      fmt::format("{} on the {} backend, {} + {} tokens, gpu {} / cpu {} / disk {}", m.config.name, be->name(),
                  o.prompt_len, o.gen_len, offload::format_bytes(hw.gpu_mem), offload::format_bytes(hw.cpu_mem),
                  offload::format_bytes(hw.disk_mem));
  if (plot(o.out_dir, runs, title))
    fmt::print("\nchart: {}/throughput.png\n", o.out_dir);
  else
    fmt::print(stderr, "flexh2o: note: gnuplot not found; no chart (install gnuplot-nox)\n");
  return 0;
}

}  // namespace flexh2o::cli
