// The report of a run over several ranks: each rank's part (what it sends rank 0), and the
// data-parallel and pipeline renderings of RunReport.
#include <fmt/format.h>

#include <algorithm>

#include "engine/serving/run_report.h"
#include "offload/text_file.h"
#include "offload/trace.h"

namespace flexh2o::serving {

using nlohmann::json;

namespace {

// The counts and times of a result as to_json(GenerationResult) gives them.
engine::GenerationResult result_of(const json& j) {
  engine::GenerationResult r;
  r.sequences = j.at("prompts").get<std::int64_t>();
  r.prompt_tokens = j.at("prompt_tokens").get<std::int64_t>();
  r.prompt_tokens_computed = j.at("prompt_tokens_computed").get<std::int64_t>();
  r.prefix_hits = j.at("prefix_hits").get<std::int64_t>();
  r.prefix_shared_tokens = j.at("prefix_shared_tokens").get<std::int64_t>();
  r.generated_tokens = j.at("generated_tokens").get<std::int64_t>();
  r.prefill_steps = j.at("prefill_steps").get<std::int64_t>();
  r.decode_steps = j.at("decode_steps").get<std::int64_t>();
  r.decode_tokens = j.at("decode_tokens").get<std::int64_t>();
  r.prefill_seconds = j.at("prefill_seconds").get<double>();
  r.decode_seconds = j.at("decode_seconds").get<double>();
  return r;
}

json spans_json(const std::vector<offload::Span>& spans) {
  json out = json::array();
  for (const auto& s : spans) out.push_back({s.track, s.primitive, s.name, s.t0, s.t1, s.bytes});
  return out;
}

std::vector<offload::Span> spans_of(const json& j) {
  std::vector<offload::Span> spans;
  for (const auto& s : j)
    spans.push_back({s[0].get<std::string>(), s[1].get<std::string>(), s[2].get<std::string>(), s[3].get<double>(),
                     s[4].get<double>(), s[5].get<std::int64_t>()});
  return spans;
}

std::string peaks_text(const RunPart& p) { return "peak " + to_text(p.placement->peaks); }

std::string model_lines(const RunReport& r) {
  return model_line(r.model, r.stored) + "\nmodel size: " + offload::format_bytes(r.stored.weight_bytes()) + "\n";
}

json parts_json(const std::vector<RunPart>& parts) {
  json out = json::array();
  for (const RunPart& p : parts) out.push_back(to_json(p, false));
  return out;
}

// The job's totals over `seconds` of generation (`kv_reads`, `kv_copies`, `kv_held`: the ranks'
// sums), the keys both multi-rank modes report.
json totals_json(const engine::GenerationResult& total, double seconds, const engine::KvReads& kv_reads,
                 const engine::KvCopies& kv_copies, const engine::KvHeld& kv_held) {
  return {{"prompts", total.sequences},
          {"prompt_tokens", total.prompt_tokens},
          {"prompt_tokens_computed", total.prompt_tokens_computed},
          {"prefix_hits", total.prefix_hits},
          {"prefix_shared_tokens", total.prefix_shared_tokens},
          {"generated_tokens", total.generated_tokens},
          {"total_seconds", seconds},
          {"total_throughput", static_cast<double>(total.generated_tokens) / std::max(seconds, 1e-9)},
          {"kv_read_bytes", kv_reads_json(kv_reads, total.prefill_steps + total.decode_steps)},
          {"kv_copy_bytes", kv_copies_json(kv_copies)},
          {"kv_held", kv_held_json(kv_held)}};
}

}  // namespace

json to_json(const policy::StageSlice& s) {
  return {{"first_layer", s.first_layer}, {"layers", s.layers}, {"input", s.input}, {"head", s.head}};
}

policy::StageSlice slice_from_json(const json& j) {
  return {j.at("first_layer").get<std::int64_t>(), j.at("layers").get<std::int64_t>(), j.at("input").get<bool>(),
          j.at("head").get<bool>()};
}

std::string slice_text(const policy::StageSlice& s) {
  const std::string layers = s.layers == 1 ? fmt::format("decoder layer {}", s.first_layer)
                                           : fmt::format("decoder layers {}-{}", s.first_layer, s.first_layer + s.layers - 1);
  return layers + (s.input ? " + input embedding" : "") + (s.head ? " + head" : "");
}

json to_json(const RunPart& p, bool with_trace) {
  json j = {{"name", p.name},
            {"rank", p.rank},
            {"host", p.host},
            {"result", to_json(p.result)},
            {"kv_read_bytes", kv_reads_json(p.kv_reads, p.result.prefill_steps + p.result.decode_steps)},
            {"kv_copy_bytes", kv_copies_json(p.kv_copies)},
            {"kv_held", kv_held_json(p.kv_held)}};
  if (p.placement) {
    j["policy"] = p.placement->policy;
    j["peak_bytes"] = to_json(p.placement->peaks);
    if (with_trace) j["policy_text"] = p.placement->policy_text;
  }
  if (p.slice) {
    j["slice"] = to_json(*p.slice);
    j["wall_seconds"] = p.wall_seconds;
    j["wait_seconds"] = p.wait_seconds;
  } else {
    j["finished_requests"] = p.finished_requests;
    j["stopped"] = p.stopped;
  }
  if (with_trace) j["spans"] = spans_json(p.spans);
  return j;
}

RunPart part_from_json(const json& j) {
  RunPart p;
  p.name = j.at("name").get<std::string>();
  p.rank = j.at("rank").get<int>();
  p.host = j.at("host").get<std::string>();
  p.result = result_of(j.at("result"));
  p.kv_reads = kv_reads_from_json(j.at("kv_read_bytes"));
  p.kv_copies = kv_copies_from_json(j.at("kv_copy_bytes"));
  p.kv_held = kv_held_from_json(j.at("kv_held"));
  if (j.contains("policy"))
    p.placement = Placement{j["policy"], j.value("policy_text", std::string()), peaks_from_json(j.at("peak_bytes"))};
  if (j.contains("slice")) {
    p.slice = slice_from_json(j["slice"]);
    p.wall_seconds = j.at("wall_seconds").get<double>();
    p.wait_seconds = j.at("wait_seconds").get<double>();
  } else {
    p.finished_requests = j.at("finished_requests").get<std::size_t>();
    p.stopped = j.at("stopped").get<bool>();
  }
  if (j.contains("spans")) p.spans = spans_of(j["spans"]);
  return p;
}

double RunReport::slowest_part_seconds() const {
  double slowest = 0;
  for (const RunPart& p : parts) slowest = std::max(slowest, p.result.prefill_seconds + p.result.decode_seconds);
  return slowest;
}

double RunReport::longest_wall() const {
  double wall = 0;
  for (const RunPart& p : parts) wall = std::max(wall, p.wall_seconds);
  return wall;
}

double RunReport::bubble_share() const {
  double waited = 0;
  for (const RunPart& p : parts) waited += p.wait_seconds;
  return waited / (static_cast<double>(parts.size()) * std::max(longest_wall(), 1e-9));
}

// Each rank's line, then the job's (throughput over the slowest rank's generation time).
std::string RunReport::data_parallel_text() const {
  std::string s = model_lines(*this);
  for (const RunPart& p : parts)
    s += fmt::format("{}: {} prompts{}; generated {} tokens in {:.3f} s, {:.1f} tok/s\n", p.name, p.result.sequences,
                     p.placement ? ", " + p.placement->policy_text + ", " + peaks_text(p) : std::string(),
                     p.result.generated_tokens, p.result.prefill_seconds + p.result.decode_seconds,
                     p.result.total_throughput());
  const double slowest = slowest_part_seconds();
  s += fmt::format("data parallel over {} ranks: {} prompts, prompt tokens: {}, generated tokens: {}; total: {:.3f} s, "
                   "{:.1f} tok/s\n",
                   parts.size(), total.sequences, total.prompt_tokens, total.generated_tokens, slowest,
                   static_cast<double>(total.generated_tokens) / std::max(slowest, 1e-9));
  s += kv_copies_text(all_kv_copies());
  s += kv_held_text(all_kv_held());
  s += kv_reads_text(all_kv_reads(), steps());
  return s;
}

json RunReport::data_parallel_json() const {
  json j = totals_json(total, slowest_part_seconds(), all_kv_reads(), all_kv_copies(), all_kv_held());
  j["mode"] = "data_parallel";
  j["model"] = model;
  j["ranks"] = parts_json(parts);
  return j;
}

// Each stage's line, then the pipeline's (`total`: rank 0's, which saw every block).
std::string RunReport::pipeline_text() const {
  std::string s = model_lines(*this);
  for (const RunPart& p : parts)
    s += fmt::format("stage {}, {}: {}, {}, {}; waited {:.3f} s of {:.3f} s\n", p.rank, p.name, slice_text(*p.slice),
                     p.placement->policy_text, peaks_text(p), p.wait_seconds, p.wall_seconds);
  const double wall = longest_wall();
  s += fmt::format("pipeline over {} ranks, {} micro-batches ({} batching): {} prompts, prompt tokens: {} ({} computed), "
                   "generated tokens: {}; total: {:.3f} s, {:.1f} tok/s; slot utilisation {:.2f} ({} sequence rows "
                   "computed); bubble share {:.1f}% (time the stages waited on each other)\n",
                   parts.size(), micro_batches, batching, total.sequences, total.prompt_tokens,
                   total.prompt_tokens_computed, total.generated_tokens, wall,
                   static_cast<double>(total.generated_tokens) / std::max(wall, 1e-9), total.slot_utilisation(),
                   total.sequence_steps, 100 * bubble_share());
  s += kv_copies_text(all_kv_copies());
  s += kv_held_text(all_kv_held());
  s += kv_reads_text(all_kv_reads(), steps());
  return s;
}

json RunReport::pipeline_json() const {
  json j = totals_json(total, longest_wall(), all_kv_reads(), all_kv_copies(), all_kv_held());
  j["mode"] = "pipeline";
  j["model"] = model;
  j["micro_batches"] = micro_batches;
  j["stages"] = parts_json(parts);
  j["batching"] = batching;
  j["slot_utilisation"] = total.slot_utilisation();
  j["bubble_share"] = bubble_share();
  return j;
}

void RunReport::write_files(const std::string& metrics_path, const std::string& trace_path,
                            const offload::Trace* trace) const {
  if (!metrics_path.empty()) offload::write_file_atomically(metrics_path, to_json().dump(2) + "\n");
  if (trace_path.empty()) return;
  if (mode == RunMode::OneProcess) {
    if (trace) trace->write_chrome_json(trace_path);
    return;
  }
  std::vector<offload::TraceProcess> processes;
  for (const RunPart& p : parts) processes.push_back({p.name, p.spans});
  offload::write_chrome_json(trace_path, processes);
}

}  // namespace flexh2o::serving
