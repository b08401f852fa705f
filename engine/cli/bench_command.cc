#include "engine/cli/bench_command.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "offload/budget.h"
#include "offload/text_file.h"
#include "policy/policy_text.h"

namespace flexh2o::cli {

namespace {

// The runs side by side (ratios to the first) as a Markdown table under `header`, printed and
// written to OUT_DIR/table.md, and as OUT_DIR/results.csv.
void write_results(const BenchCliOptions& o, const std::vector<job::SystemRun>& runs, const std::string& header) {
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


// A bar chart of total throughput per system with gnuplot (Debian gnuplot-nox), if present.
bool plot(const std::string& dir, const std::vector<job::SystemRun>& runs, const std::string& title) {
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

CLI::App* add_bench_command(CLI::App& app, BenchCliOptions& o) {
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

int bench_command(const BenchCliOptions& o) {
  std::filesystem::create_directories(o.out_dir);
  const job::BenchRuns b = job::bench_systems(o);
  write_results(o, b.runs,
                fmt::format("model {} ({} dummy weights), prompt {} + gen {}, gpu {} | cpu {} | disk {}\n\n", b.model,
                            o.dtype, o.prompt_len, o.gen_len, offload::format_bytes(b.hw.gpu_mem),
                            offload::format_bytes(b.hw.cpu_mem), offload::format_bytes(b.hw.disk_mem)));
  const std::string title =
      fmt::format("{} on the {} backend, {} + {} tokens, gpu {} / cpu {} / disk {}", b.model, b.backend,
                  o.prompt_len, o.gen_len, offload::format_bytes(b.hw.gpu_mem), offload::format_bytes(b.hw.cpu_mem),
                  offload::format_bytes(b.hw.disk_mem));
  if (plot(o.out_dir, b.runs, title))
    fmt::print("\nchart: {}/throughput.png\n", o.out_dir);
  else
    fmt::print(stderr, "flexh2o: note: gnuplot not found; no chart (install gnuplot-nox)\n");
  return 0;
}

}  // namespace flexh2o::cli
