#include "policy/policy.h"
#include "offload/text_file.h"

#include "policy/eviction/kv_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace flexh2o::policy {

namespace {

offload::TierFractions from_percent(double gpu, double cpu) {
  return {gpu / 100.0, cpu / 100.0, std::max(0.0, (100.0 - gpu - cpu) / 100.0)};
}

void check_pair(double gpu, double cpu, const std::string& what) {
  if (gpu < 0 || cpu < 0 || gpu > 100 || cpu > 100 || gpu + cpu > 100 + 1e-9)
    throw std::invalid_argument(what + " percentages " + std::to_string(gpu) + " (gpu) and " +
                                std::to_string(cpu) + " (cpu) must each be in [0, 100] and sum to at most 100; " +
                                "the rest goes to disk");
}

}  // namespace

void Policy::set_percent(const std::array<double, 6>& p) {
  check_pair(p[0], p[1], "weight");
  check_pair(p[2], p[3], "cache");
  check_pair(p[4], p[5], "activation");
  weights = from_percent(p[0], p[1]);
  cache = from_percent(p[2], p[3]);
  activations = from_percent(p[4], p[5]);
}

std::array<double, 6> Policy::percent() const {
  return {weights.gpu * 100, weights.cpu * 100, cache.gpu * 100, cache.cpu * 100, activations.gpu * 100,
          activations.cpu * 100};
}

void Policy::validate(const std::string& source) const {
  if (gpu_batch_size < 1) throw std::invalid_argument(source + ": gpu_batch_size must be at least 1");
  if (num_gpu_batches < 1) throw std::invalid_argument(source + ": num_gpu_batches must be at least 1");
  weights.validate(source + ": weights");
  cache.validate(source + ": cache");
  activations.validate(source + ": activations");
  if (cache_storage && kernels::is_quantized(*cache_storage))
    throw std::invalid_argument(source + ": cache_dtype must be f32, f16 or bf16 (compress_cache quantizes)");
  if (compress_cache && cache_storage)
    throw std::invalid_argument(source + ": cache_dtype " + std::string(kernels::dtype_name(*cache_storage)) +
                                " has no effect with compress_cache (the cache is stored as q" +
                                std::to_string(compress_bits) + "); drop one of them");
  if (compress_bits != 4 && compress_bits != 8)
    throw std::invalid_argument(source + ": compress_bits must be 4 or 8, got " + std::to_string(compress_bits));
  if (expert_loading != "auto" && expert_loading != "routed" && expert_loading != "all")
    throw std::invalid_argument(source + ": expert_loading must be auto, routed or all, got '" + expert_loading + "'");
  if (prefix_pool != "auto" && prefix_pool != "gpu" && prefix_pool != "cpu" && prefix_pool != "disk")
    throw std::invalid_argument(source + ": prefix_pool must be auto, gpu, cpu or disk, got '" + prefix_pool + "'");
  if (expert_slots < 0)
    throw std::invalid_argument(source + ": expert_slots must be at least 1 (0: sized from the batch), got " +
                                std::to_string(expert_slots));
  try {
    parse_kv_spec(kv);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(source + ": kv: " + e.what());
  }
}

bool Policy::routed_expert_loading(std::int64_t experts, std::int64_t top_k, std::int64_t tokens) const {
  if (expert_loading != "auto") return expert_loading == "routed";
  if (expert_slot_count(experts, top_k) < experts) return true;
  return expected_active_experts(experts, top_k, tokens) < static_cast<double>(experts) - 0.5;
}

std::int64_t Policy::expert_slot_count(std::int64_t experts, std::int64_t top_k) const {
  if (experts <= 0) return 0;
  if (expert_loading == "all") {
    if (expert_slots > 0 && expert_slots < experts)
      throw std::invalid_argument("expert_loading all stages every expert, but expert_slots is " +
                                  std::to_string(expert_slots) + " of the model's " + std::to_string(experts) +
                                  "; use expert_loading routed or auto, or leave expert_slots unset");
    return experts;
  }
  if (expert_slots > 0) return std::min(expert_slots, experts);
  // The small margin keeps an expectation a rounding error above an integer from taking one more.
  const auto expected = static_cast<std::int64_t>(std::ceil(expected_active_experts(experts, top_k, block_size()) - 1e-9));
  return std::clamp(expected, std::min(top_k, experts), experts);
}

double expected_active_experts(std::int64_t experts, std::int64_t top_k, std::int64_t tokens) {
  if (experts <= 0) return 0;
  const double e = static_cast<double>(experts);
  return e * (1 - std::pow(1 - static_cast<double>(std::min(top_k, experts)) / e, static_cast<double>(tokens)));
}

Policy load_policy_yaml(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(source + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) throw std::invalid_argument(source + ": expected a mapping of policy fields");
  Policy p;
  static const std::set<std::string> known = {"gpu_batch_size", "num_gpu_batches", "percent",    "overlap",
                                              "sep_layer",      "pin_weight",      "resident_embeddings", "cpu_cache_compute",
                                              "compress_weight", "compress_cache", "compress_bits", "cache_dtype", "kv",
                                              "expert_loading", "expert_slots", "prefix_pool"};
  for (const auto& kv : root) {
    const auto key = kv.first.as<std::string>();
    if (!known.count(key)) throw std::invalid_argument(source + ": unknown field '" + key + "'");
  }
  auto get = [&](const char* key, auto& field) {
    using T = std::decay_t<decltype(field)>;
    if (!root[key]) return;
    try {
      field = root[key].template as<T>();
    } catch (const YAML::Exception&) {
      throw std::invalid_argument(source + ": field '" + key + "' has the wrong type");
    }
  };
  get("gpu_batch_size", p.gpu_batch_size);
  get("num_gpu_batches", p.num_gpu_batches);
  get("overlap", p.overlap);
  get("sep_layer", p.sep_layer);
  get("pin_weight", p.pin_weight);
  get("resident_embeddings", p.resident_embeddings);
  get("cpu_cache_compute", p.cpu_cache_compute);
  get("compress_weight", p.compress_weight);
  get("compress_cache", p.compress_cache);
  get("compress_bits", p.compress_bits);
  if (root["cache_dtype"]) {
    std::string dtype;
    get("cache_dtype", dtype);
    try {
      p.cache_storage = kernels::parse_dtype(dtype);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(source + ": field 'cache_dtype': " + e.what());
    }
  }
  get("kv", p.kv);
  get("expert_loading", p.expert_loading);
  get("expert_slots", p.expert_slots);
  get("prefix_pool", p.prefix_pool);
  if (root["percent"]) {
    std::vector<double> pct;
    get("percent", pct);
    if (pct.size() != 6)
      throw std::invalid_argument(source + ": field 'percent' needs 6 numbers [WG, WC, CG, CC, AG, AC], got " +
                                  std::to_string(pct.size()));
    try {
      p.set_percent({pct[0], pct[1], pct[2], pct[3], pct[4], pct[5]});
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(source + ": field 'percent': " + e.what());
    }
  }
  p.validate(source);
  return p;
}

Policy load_policy_file(const std::string& path) {
  const auto text = offload::read_text_file(path);
  if (!text) throw std::invalid_argument("cannot read policy file " + path);
  return load_policy_yaml(*text, path);
}

std::string policy_to_yaml(const Policy& p) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "gpu_batch_size" << YAML::Value << p.gpu_batch_size;
  out << YAML::Key << "num_gpu_batches" << YAML::Value << p.num_gpu_batches;
  out << YAML::Key << "percent" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (double v : p.percent()) out << std::round(v * 1e6) / 1e6;
  out << YAML::EndSeq;
  out << YAML::Key << "overlap" << YAML::Value << p.overlap;
  out << YAML::Key << "sep_layer" << YAML::Value << p.sep_layer;
  out << YAML::Key << "pin_weight" << YAML::Value << p.pin_weight;
  out << YAML::Key << "resident_embeddings" << YAML::Value << p.resident_embeddings;
  out << YAML::Key << "cpu_cache_compute" << YAML::Value << p.cpu_cache_compute;
  out << YAML::Key << "compress_weight" << YAML::Value << p.compress_weight;
  out << YAML::Key << "compress_cache" << YAML::Value << p.compress_cache;
  out << YAML::Key << "compress_bits" << YAML::Value << p.compress_bits;
  if (p.cache_storage) out << YAML::Key << "cache_dtype" << YAML::Value << std::string(kernels::dtype_name(*p.cache_storage));
  out << YAML::Key << "kv" << YAML::Value << p.kv;
  out << YAML::Key << "expert_loading" << YAML::Value << p.expert_loading;
  if (p.expert_slots > 0) out << YAML::Key << "expert_slots" << YAML::Value << p.expert_slots;
  if (p.prefix_pool != "auto") out << YAML::Key << "prefix_pool" << YAML::Value << p.prefix_pool;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace flexh2o::policy
