#include "engine/serving/run_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "engine/model/weights.h"
#include "engine/serving/kernels_report.h"
#include "policy/policy_text.h"

namespace flexh2o::serving {

using offload::format_bytes;

std::string model_line(const std::string& description, const engine::ModelConfig& c) {
  return fmt::format("model: {} ({} layers, hidden {}, {} weights)", description, c.n_layers, c.hidden,
                     engine::matrix_dtypes_text(c));
}

TierPeaks peaks_of(const offload::Tiers& t) {
  using offload::Tier;
  return {t.budget(Tier::Gpu).peak(), t.budget(Tier::Cpu).peak(), t.budget(Tier::Disk).peak()};
}

std::string to_text(const TierPeaks& p) {
  return fmt::format("gpu {} | cpu {} | disk {}", format_bytes(p.gpu), format_bytes(p.cpu), format_bytes(p.disk));
}

nlohmann::json to_json(const TierPeaks& p) { return {{"gpu", p.gpu}, {"cpu", p.cpu}, {"disk", p.disk}}; }

TierPeaks peaks_from_json(const nlohmann::json& j) {
  return {j.at("gpu").get<std::int64_t>(), j.at("cpu").get<std::int64_t>(), j.at("disk").get<std::int64_t>()};
}

nlohmann::json to_json(const engine::GenerationResult& r) {
  return {{"prompts", r.sequences},
          {"prompt_tokens", r.prompt_tokens},
          {"prompt_tokens_computed", r.prompt_tokens_computed},
          {"prefix_hits", r.prefix_hits},
          {"prefix_shared_tokens", r.prefix_shared_tokens},
          {"generated_tokens", r.generated_tokens},
          {"prefill_steps", r.prefill_steps},
          {"decode_steps", r.decode_steps},
          {"decode_tokens", r.decode_tokens},
          {"prefill_seconds", r.prefill_seconds},
          {"decode_seconds", r.decode_seconds},
          {"prefill_throughput", r.prefill_throughput()},
          {"decode_throughput", r.decode_throughput()},
          {"total_throughput", r.total_throughput()}};
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::ranges::sort(values);
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

namespace {

double useful_throughput(const RunReport& r) {
  return r.wall_seconds > 0 ? static_cast<double>(r.total.generated_tokens) / r.wall_seconds : 0;
}

// The prefill, decode and total lines. Where steps both prefilled and decoded (continuous
// batching), the split says it: the steps with prompt rows, their prompt tokens per second, and
// the decode-only steps, their tokens per second.
std::string phases_text(const engine::GenerationResult& t) {
  const bool mixed = t.prefill_steps > 1;
  return fmt::format("prefill{}: {:.3f} s, {:.1f} tok/s | decode{}: {:.3f} s, {:.1f} tok/s | total: {:.3f} s, {:.1f} tok/s\n",
                     mixed ? fmt::format(" ({} steps with prompt rows)", t.prefill_steps) : "", t.prefill_seconds,
                     t.prefill_throughput(), mixed ? fmt::format(" ({} decode-only steps)", t.decode_steps) : "",
                     t.decode_seconds, t.decode_throughput(), t.prefill_seconds + t.decode_seconds, t.total_throughput());
}

// "p50 A p90 B max C s" of the requests' first tokens or finishes.
std::string spread(const std::vector<RequestTiming>& timings, double RequestTiming::*field) {
  std::vector<double> v;
  for (const auto& t : timings) v.push_back(t.*field);
  return fmt::format("p50 {:.3f} p90 {:.3f} max {:.3f} s", percentile(v, 50), percentile(v, 90), percentile(v, 100));
}

}  // namespace

Prediction prediction_of(const policy::Estimate& e) {
  return {.continuous = e.continuous,
          .throughput = e.total_throughput,
          .step_seconds = e.decode_step_seconds,
          .block_seconds = e.prefill_seconds + e.decode_seconds,
          .prefill_seconds = e.continuous ? 0 : e.prefill_seconds,
          .decode_seconds = e.continuous ? 0 : e.decode_seconds,
          .peaks = {e.peak_bytes[0], e.peak_bytes[1], e.peak_bytes[2]}};
}

Prediction RunReport::measured() const {
  Prediction m;
  m.continuous = predicted && predicted->continuous;
  const double seconds = total.prefill_seconds + total.decode_seconds;
  if (m.continuous) {
    // One job: its steps, those that prefilled and those that only decoded.
    m.throughput = seconds > 0 ? static_cast<double>(total.generated_tokens) / seconds : 0;
    m.step_seconds = seconds / static_cast<double>(std::max<std::int64_t>(total.prefill_steps + total.decode_steps, 1));
    m.block_seconds = seconds;
    m.prefill_seconds = total.prefill_seconds;
    m.decode_seconds = total.decode_seconds;
  } else {
    m.throughput = total.total_throughput();
    m.step_seconds = total.decode_steps > 0 ? total.decode_seconds / static_cast<double>(total.decode_steps) : 0;
    const std::int64_t blocks = (total.sequences + policy.block_size() - 1) / std::max<std::int64_t>(policy.block_size(), 1);
    const double per_block = blocks > 0 ? 1.0 / static_cast<double>(blocks) : 0;
    m.block_seconds = seconds * per_block;
    m.prefill_seconds = total.prefill_seconds * per_block;
    m.decode_seconds = total.decode_seconds * per_block;
  }
  m.peaks = peaks;
  return m;
}

std::string RunReport::explain_text() const {
  if (!predicted) return "predicted vs measured: no prediction (the policy was not planned or checked)\n";
  const Prediction& p = *predicted;
  const Prediction m = measured();
  auto ratio = [](double measured, double predicted) {
    return predicted > 0 ? fmt::format(" (x{:.2f})", measured / predicted) : std::string();
  };
  std::string s = "predicted vs measured (measured / predicted):\n";
  s += fmt::format("  {} tok/s: {:.2f} | {:.2f}{}\n", p.continuous ? "generated" : "total", p.throughput, m.throughput,
                   ratio(m.throughput, p.throughput));
  s += fmt::format("  {}: {:.4f} s | {:.4f} s{}\n", p.continuous ? "mean step" : "decode step", p.step_seconds,
                   m.step_seconds, ratio(m.step_seconds, p.step_seconds));
  s += fmt::format("  {}: {:.3f} s | {:.3f} s{}\n", p.continuous ? "job (prefill + decode)" : "block (prefill + decode)",
                   p.block_seconds, m.block_seconds, ratio(m.block_seconds, p.block_seconds));
  if (predicted_at_lengths) {
    const Prediction& l = *predicted_at_lengths;
    s += fmt::format("  at the lengths the requests generated (the plan counts each to its max_tokens): generated "
                     "tok/s {:.2f} | {:.2f}{}, job {:.3f} s | {:.3f} s{}\n",
                     l.throughput, m.throughput, ratio(m.throughput, l.throughput), l.block_seconds, m.block_seconds,
                     ratio(m.block_seconds, l.block_seconds));
  }
  if (p.continuous)
    s += fmt::format("  of the job: steps that prefilled {:.3f} s, decode-only steps {:.3f} s (measured; predicted as "
                     "one mean step)\n",
                     m.prefill_seconds, m.decode_seconds);
  else
    s += fmt::format("  per block: prefill {:.3f} s | {:.3f} s{}, decode {:.3f} s | {:.3f} s{}\n", p.prefill_seconds,
                     m.prefill_seconds, ratio(m.prefill_seconds, p.prefill_seconds), p.decode_seconds,
                     m.decode_seconds, ratio(m.decode_seconds, p.decode_seconds));
  s += fmt::format("  peak memory: gpu {} | {}, cpu {} | {}, disk {} | {}\n", format_bytes(p.peaks.gpu),
                   format_bytes(m.peaks.gpu), format_bytes(p.peaks.cpu), format_bytes(m.peaks.cpu),
                   format_bytes(p.peaks.disk), format_bytes(m.peaks.disk));
  return s;
}

std::int64_t RunReport::decode_expert_bytes_per_token() const {
  const std::int64_t decode_tokens = total.generated_tokens - total.sequences;
  const std::int64_t decode_bytes = experts.bytes() - (experts.bytes_by_step.empty() ? 0 : experts.bytes_by_step[0]);
  return decode_tokens > 0 ? decode_bytes / decode_tokens : 0;
}

engine::KvReads RunReport::all_kv_reads() const {
  if (mode == RunMode::OneProcess) return kv_reads;
  engine::KvReads sum;
  for (const RunPart& p : parts) sum.add(p.kv_reads);
  return sum;
}

engine::KvHeld RunReport::all_kv_held() const {
  if (mode == RunMode::OneProcess) return kv_held;
  engine::KvHeld sum;
  for (const RunPart& p : parts) sum.add(p.kv_held);
  return sum;
}

engine::KvCopies RunReport::all_kv_copies() const {
  if (mode == RunMode::OneProcess) return kv_copies;
  engine::KvCopies sum;
  for (const RunPart& p : parts) sum.add(p.kv_copies);
  return sum;
}

std::string RunReport::text() const {
  switch (mode) {
    case RunMode::DataParallel: return data_parallel_text();
    case RunMode::Pipeline: return pipeline_text();
    case RunMode::OneProcess: break;
  }
  return one_process_text();
}

nlohmann::json RunReport::to_json() const {
  nlohmann::json j = mode == RunMode::DataParallel ? data_parallel_json()
                     : mode == RunMode::Pipeline   ? pipeline_json()
                                                   : one_process_json();
  if (!structured_output.is_null()) j["structured_output"] = structured_output;
  return j;
}

std::string RunReport::one_process_text() const {
  std::string s = model_line(model, stored) + "\n";
  s += fmt::format("model size: {} | cache size: {} | hidden size (prefill): {}\n", format_bytes(stored.weight_bytes()),
                   format_bytes(cache_bytes), format_bytes(hidden_bytes));
  s += fmt::format("policy: {}, cache {}, compute {}{}\n", policy::to_text(policy), kernels::dtype_name(cache_dtype),
                   kernels::dtype_name(stored.compute_dtype), compute_why.empty() ? "" : " (" + compute_why + ")");
  s += "peak memory: " + serving::to_text(peaks) + "\n";
  s += fmt::format("prompts: {}, prompt tokens: {} ({} computed; {} from shared prefixes, taken by {} prompts), "
                   "generated tokens: {}\n",
                   prompts, total.prompt_tokens, total.prompt_tokens_computed, total.prefix_shared_tokens,
                   total.prefix_hits, total.generated_tokens);
  s += kv_copies_text(kv_copies);
  s += kv_held_text(kv_held);
  s += phases_text(total);
  s += kv_reads_text(kv_reads, steps());
  if (wall_seconds > 0)
    s += fmt::format("{}useful: {} tokens in {:.3f} s, {:.1f} tok/s | slot utilisation {:.2f} ({} sequence rows "
                     "computed)\n",
                     batching.empty() ? "" : batching + " batching: ", total.generated_tokens, wall_seconds,
                     useful_throughput(*this), total.slot_utilisation(), total.sequence_steps);
  if (!timings.empty())
    s += fmt::format("per request: first token {} | finished {}\n", spread(timings, &RequestTiming::first_token),
                     spread(timings, &RequestTiming::finished));
  const auto& moe = stored.moe;
  if (moe.experts > 0 && !experts.experts_by_step.empty()) {
    const std::int64_t moe_layers = std::ranges::count(moe.layers, true);
    s += fmt::format("experts: {} loading, {} per staging slot; per step {} of {} fetched ({} layers x {}); decode "
                     "moved {} of expert weights per token\n",
                     policy.expert_loading, policy.expert_slot_count(moe.experts, moe.top_k),
                     fmt::join(experts.experts_by_step, " "), moe_layers * moe.experts, moe_layers, moe.experts,
                     format_bytes(decode_expert_bytes_per_token()));
  }
  s += kernels_text(kernels);
  if (explain) s += explain_text();
  return s;
}

nlohmann::json RunReport::one_process_json() const {
  const auto& moe = stored.moe;
  nlohmann::json j = serving::to_json(total);
  j["prompts"] = prompts;
  j["model"] = model;
  j["policy"] = policy::to_json(policy, moe.experts, moe.top_k);
  j["compute_dtype"] = std::string(kernels::dtype_name(stored.compute_dtype));
  j["model_bytes"] = stored.weight_bytes();
  j["cache_bytes"] = cache_bytes;
  j["hidden_bytes"] = hidden_bytes;
  j["peak_bytes"] = serving::to_json(peaks);
  j["time_by_primitive"] = time_by_primitive;
  if (!batching.empty()) j["batching"] = batching;
  if (wall_seconds > 0) {
    j["wall_seconds"] = wall_seconds;
    j["useful_throughput"] = useful_throughput(*this);
  }
  j["sequence_steps"] = total.sequence_steps;
  j["slot_utilisation"] = total.slot_utilisation();
  j["kv_read_bytes"] = kv_reads_json(kv_reads, steps());
  j["kv_copy_bytes"] = kv_copies_json(kv_copies);
  j["kv_held"] = kv_held_json(kv_held);
  if (!kernels.isa.empty()) j["kernels"] = kernels_json(kernels);
  nlohmann::json requests = nlohmann::json::array();
  for (const auto& t : timings)
    requests.push_back({{"id", nlohmann::json::parse(t.id_json)},
                        {"prompt_tokens", t.prompt_tokens},
                        {"generated_tokens", t.generated_tokens},
                        {"first_token_seconds", t.first_token},
                        {"finished_seconds", t.finished}});
  if (!timings.empty()) j["requests"] = std::move(requests);
  if (predicted) {
    auto as_json = [](const Prediction& p) {
      return nlohmann::json{{"throughput", p.throughput},
                            {"step_seconds", p.step_seconds},
                            {p.continuous ? "job_seconds" : "block_seconds", p.block_seconds},
                            {"prefill_seconds", p.prefill_seconds},
                            {"decode_seconds", p.decode_seconds},
                            {"peak_bytes", serving::to_json(p.peaks)}};
    };
    j["predicted"] = as_json(*predicted);
    j["predicted"]["batching"] = predicted->continuous ? "continuous" : "fixed";
    j["measured"] = as_json(measured());
    if (predicted_at_lengths) j["predicted_at_lengths"] = as_json(*predicted_at_lengths);
  }
  if (moe.experts > 0)
    j["experts"] = {{"experts", moe.experts},
                    {"top_k", moe.top_k},
                    {"moe_layers", std::ranges::count(moe.layers, true)},
                    {"loaded_by_step", experts.experts_by_step},
                    {"bytes_by_step", experts.bytes_by_step},
                    {"bytes", experts.bytes()},
                    {"decode_bytes_per_token", decode_expert_bytes_per_token()}};
  return j;
}

RunReport make_run_report(const std::string& description, const engine::ModelConfig& cfg, const policy::Policy& pol,
                          std::int64_t prompts, std::int64_t longest_prompt, std::int64_t gen_len,
                          const engine::GenerationResult& total, const offload::Tiers& tiers,
                          const engine::BlockExecutor& sched, const offload::Trace* trace) {
  RunReport r;
  r.model = description;
  r.stored = engine::with_weight_dtype(cfg, pol.weight_dtype(cfg.dtype));
  r.policy = pol;
  r.cache_dtype = pol.cache_dtype(cfg.dtype);
  r.prompts = prompts;
  r.total = total;
  const engine::ModelConfig& c = r.stored;
  // Under a KV policy a sequence's row holds its budget's slots, not all its tokens.
  const std::int64_t longest = longest_prompt + gen_len, evicting = sched.evicting_row_slots();
  const std::int64_t row_slots = evicting > 0 ? std::min(evicting, longest) : longest;
  r.cache_bytes = 2 * c.n_layers * pol.block_size() * row_slots * c.n_kv_heads * kernels::kv_slot_bytes(r.cache_dtype, c.head_dim);
  r.hidden_bytes = pol.block_size() * longest_prompt * c.hidden * 4;
  r.peaks = peaks_of(tiers);
  r.experts = sched.expert_loads();
  r.kv_reads = sched.kv_reads();
  r.kv_copies = sched.kv_copies();
  r.kv_held = sched.kv_held();
  if (trace) r.time_by_primitive = trace->time_by_primitive();
  return r;
}

}  // namespace flexh2o::serving
