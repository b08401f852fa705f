#include "engine/job/model_rates.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/job/calibrate.h"
#include "engine/job/calibrate_units.h"
#include "engine/model/model_shape.h"
#include "engine/runtime/machine_profile.h"
#include "engine/serving/openai_results.h"
#include "offload/budget.h"
#include "policy/cost_model.h"

namespace flexh2o::job {

namespace fs = std::filesystem;

namespace {

// Seconds each point is timed over: calibrate --quick's.
constexpr double kSecondsPerPoint = 0.025;

// The CPU's model name (/proc/cpuinfo), or "" where there is none.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "";
}

// The cores this process may run on.
int usable_cores() {
  cpu_set_t set;
  return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

// What the rates depend on: the machine (its CPU, the cores this process may use, the
// backend and its device) and the shape of a decoder layer and the head in the dtype a run
// holds them in (each is measured in the compute dtype --compute-dtype auto gives its rows).
// Two models of one shape share their rates. The leading version is raised where rates kept
// before would mislead (4: rates of a single pass, which a slowed core could have set).
std::string rates_key(const kernels::Backend& be, const engine::ModelConfig& c) {
  return fmt::format(
      "rates 4 | cpu {} | {} cores | backend {} | hidden {} ffn {} heads {}/{}x{} vocab {} dtype {} gated {} act {} "
      "norm {} bias {}/{}/{} qk_norm {} experts {}/{} tied {}",
      cpu_model(), usable_cores(), be.name(), c.hidden, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size,
      kernels::dtype_name(c.dtype), c.gated_mlp, static_cast<int>(c.mlp_act),
      static_cast<int>(c.norm), c.qkv_bias, c.o_bias, c.mlp_bias, c.qk_norm, c.moe.experts, c.moe.top_k,
      c.tie_embeddings);
}

nlohmann::json curve_json(const policy::RateCurve& c) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [rows, rate] : c) j.push_back({rows, rate});
  return j;
}

policy::RateCurve curve_of(const nlohmann::json& j) {
  policy::RateCurve c;
  for (const auto& p : j) c.emplace_back(p.at(0).get<std::int64_t>(), p.at(1).get<double>());
  if (c.empty()) throw std::invalid_argument("an empty curve");
  return c;
}

// The cached rates for `key` in `path`, or false (none, another key, unreadable).
bool read_cached(const std::string& path, const std::string& key, ModelRates& out) {
  std::ifstream in(path);
  if (!in) return false;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("key", "") != key) return false;
  try {
    out = {{curve_of(j.at("layer_by_rows")), curve_of(j.at("head_by_rows"))},
           curve_of(j.at("attn_decode_by_len")),
           j.at("attn_decode_read_share").get<double>(),
           j.at("host_row_seconds").get<double>()};
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// Written whole or not at all: a run beside this one reads the old file or the new one.
bool write_cached(const std::string& path, const std::string& key, const ModelRates& r) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  {
    std::ofstream out(tmp);
    out << nlohmann::json{{"key", key},
                          {"layer_by_rows", curve_json(r.units.layer_by_rows)},
                          {"head_by_rows", curve_json(r.units.head_by_rows)},
                          {"attn_decode_by_len", curve_json(r.attn_decode_by_len)},
                          {"attn_decode_read_share", r.attn_read_share},
                          {"host_row_seconds", r.host_row}}
               .dump(1)
        << "\n";
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return false;
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
  return !ec;
}

ModelRates measure_once(kernels::Backend& be, const engine::ModelConfig& cfg) {
  const bool on_cpu = be.kind() == kernels::DeviceKind::Cpu;
  const TimeCall time_call = [](const std::function<void()>& fn) { return seconds_per_call(fn, kSecondsPerPoint); };
  ModelRates r;
  r.units = measure_unit_curves(be, cfg, on_cpu ? 256 : 16384, on_cpu ? std::int64_t{1} << 30 : be.memory_capacity() / 8,
                                time_call, [](const std::string&, const std::string&) {});
  r.attn_decode_by_len = decode_attention_curve(be, cfg, {64, 256, 1024}, kSecondsPerPoint);
  r.attn_read_share = decode_attention_read_share(be, cfg, kSecondsPerPoint);
  r.host_row = host_seconds_per_row(be, cfg, time_call);
  return r;
}

// The largest ratio between two passes' rates at the same point (1: they agree).
double largest_ratio(const policy::RateCurve& a, const policy::RateCurve& b) {
  double worst = 1;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max({worst, a[i].second / b[i].second, b[i].second / a[i].second});
  return worst;
}

double largest_ratio(const ModelRates& a, const ModelRates& b) {
  return std::max({largest_ratio(a.units.layer_by_rows, b.units.layer_by_rows),
                   largest_ratio(a.units.head_by_rows, b.units.head_by_rows),
                   largest_ratio(a.attn_decode_by_len, b.attn_decode_by_len)});
}

// Each point at the faster of two passes.
void keep_faster(policy::RateCurve& kept, const policy::RateCurve& other) {
  for (std::size_t i = 0; i < std::min(kept.size(), other.size()); ++i)
    kept[i].second = std::max(kept[i].second, other[i].second);
}

void keep_faster(ModelRates& kept, const ModelRates& other) {
  keep_faster(kept.units.layer_by_rows, other.units.layer_by_rows);
  keep_faster(kept.units.head_by_rows, other.units.head_by_rows);
  if (other.attn_decode_by_len.back().second > kept.attn_decode_by_len.back().second)
    kept.attn_read_share = other.attn_read_share;  // the share as timed in the faster pass
  keep_faster(kept.attn_decode_by_len, other.attn_decode_by_len);
  kept.host_row = std::min(kept.host_row, other.host_row);
}

}  // namespace

// Two passes, each point at the faster; a third where they differ by more than a fifth.
ModelRates faster_of_passes(const std::function<ModelRates()>& measure_pass) {
  ModelRates rates = measure_pass();
  const ModelRates second = measure_pass();
  const bool disagree = largest_ratio(rates, second) > 1.2;
  keep_faster(rates, second);
  if (disagree) keep_faster(rates, measure_pass());
  return rates;
}

std::string model_rates_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return (base / "flexh2o" / "calibration").string();
}

void add_model_rates(kernels::Backend& be, const engine::ModelConfig& cfg, policy::HardwareProfile& hw) {
  // The measurement makes one decoder layer's weights and the head's on the device: never more
  // than an eighth of the memory free now (a job in a tight cgroup is not killed for it).
  const policy::ModelSizes sizes = policy::model_sizes(engine::model_shape(cfg));
  const std::int64_t made = sizes.layer_weights + sizes.head_weights;
  const std::int64_t free = be.kind() == kernels::DeviceKind::Cpu ? engine::available_memory() : be.memory_capacity();
  if (made > free / 8) {
    hw.source += fmt::format("; this model's rates not measured (a layer and the head take {}, more than an eighth of "
                             "the {} free now)",
                             offload::format_bytes(made), offload::format_bytes(free));
    return;
  }
  const std::string key = rates_key(be, cfg);
  const std::string path = fmt::format("{}/{:016x}.json", model_rates_dir(), serving::stable_hash(key));
  ModelRates rates;
  if (read_cached(path, key, rates)) {
    hw.source += "; this model's layer, head, decode attention and host rates measured on this machine before (" + path + ")";
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    rates = faster_of_passes([&] { return measure_once(be, cfg); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    hw.source += write_cached(path, key, rates)
                     ? fmt::format("; this model's layer, head, decode attention and host rates measured now in {:.1f} s, kept in {}", seconds, path)
                     : fmt::format("; this model's layer, head, decode attention and host rates measured now in {:.1f} s ({} could not be "
                                   "written: they are measured again next run)",
                                   seconds, path);
  }
  hw.layer_by_rows = std::move(rates.units.layer_by_rows);
  hw.head_by_rows = std::move(rates.units.head_by_rows);
  hw.gpu_attn_decode_by_len = std::move(rates.attn_decode_by_len);
  hw.host_row = rates.host_row;
  hw.gpu_attn_decode = hw.gpu_attn_decode_by_len.back().second;
  hw.gpu_attn_decode_read_share = rates.attn_read_share;
  if (hw.gpu_is_host_memory) {  // the CPU backend: attention in place on the cpu tier is the same
    hw.cpu_attn_decode_by_len = hw.gpu_attn_decode_by_len;
    hw.cpu_attn_decode = hw.gpu_attn_decode;
    hw.cpu_attn_decode_read_share = hw.gpu_attn_decode_read_share;
  }
}

}  // namespace flexh2o::job
