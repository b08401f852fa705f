#include "policy/hardware_profile.h"
#include "offload/text_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>
#include <utility>

#include "offload/budget.h"

namespace flexh2o::policy {

namespace {

constexpr double kGiga = 1e9;   // GB/s -> bytes/s
constexpr double kTera = 1e12;  // TFLOP/s -> flop/s

// Every field of the file, in the order hardware_to_yaml writes them.
struct SizeField {
  const char* key;
  std::int64_t HardwareProfile::*field;
};
struct RateField {
  const char* key;
  double HardwareProfile::*field;
  double scale;  // file unit -> struct unit
};

constexpr std::array<SizeField, 3> kSizes{{
    {"gpu_mem", &HardwareProfile::gpu_mem},
    {"cpu_mem", &HardwareProfile::cpu_mem},
    {"disk_mem", &HardwareProfile::disk_mem},
}};
constexpr std::array<RateField, 10> kRates{{
    {"cpu_to_gpu_gbps", &HardwareProfile::cpu_to_gpu, kGiga},
    {"gpu_to_cpu_gbps", &HardwareProfile::gpu_to_cpu, kGiga},
    {"disk_to_cpu_gbps", &HardwareProfile::disk_to_cpu, kGiga},
    {"cpu_to_disk_gbps", &HardwareProfile::cpu_to_disk, kGiga},
    {"gpu_gemm_prefill_tflops", &HardwareProfile::gpu_gemm_prefill, kTera},
    {"gpu_gemm_decode_tflops", &HardwareProfile::gpu_gemm_decode, kTera},
    {"gpu_attn_prefill_tflops", &HardwareProfile::gpu_attn_prefill, kTera},
    {"gpu_attn_decode_tflops", &HardwareProfile::gpu_attn_decode, kTera},
    {"cpu_gemm_tflops", &HardwareProfile::cpu_gemm, kTera},
    {"cpu_attn_decode_tflops", &HardwareProfile::cpu_attn_decode, kTera},
}};

[[noreturn]] void fail(const std::string& source, const std::string& key, const std::string& why) {
  throw std::invalid_argument(source + ": field '" + key + "' " + why);
}

std::string scalar_of(const YAML::Node& root, const std::string& source, const std::string& key) {
  const YAML::Node n = root[key];
  if (!n) fail(source, key, "is missing (every hardware field is required)");
  if (!n.IsScalar()) fail(source, key, "must be a single value");
  return n.Scalar();
}

std::int64_t size_of(const YAML::Node& root, const std::string& source, const std::string& key) {
  const std::string text = scalar_of(root, source, key);
  std::int64_t bytes = 0;
  try {
    bytes = offload::parse_bytes(text);
  } catch (const std::invalid_argument& e) {
    fail(source, key, std::string("is not a size: ") + e.what());
  }
  if (bytes <= 0) fail(source, key, "must be positive, got '" + text + "'");
  return bytes;
}

double rate_of(const YAML::Node& root, const std::string& source, const std::string& key) {
  const std::string text = scalar_of(root, source, key);
  double v = 0;
  try {
    v = root[key].as<double>();
  } catch (const YAML::Exception&) {
    fail(source, key, "must be a number, got '" + text + "'");
  }
  if (!std::isfinite(v) || v <= 0) fail(source, key, "must be a positive number, got '" + text + "'");
  return v;
}

// The shortest text that reads back as exactly v.
std::string shortest(double v) {
  std::array<char, 64> buf{};
  const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

// Bytes as "15GB"/"16GiB" when a unit divides them exactly, else the plain number.
std::string size_text(std::int64_t bytes) {
  static constexpr std::array<std::pair<const char*, std::int64_t>, 6> units{{
      {"TiB", std::int64_t{1} << 40},
      {"TB", 1000LL * 1000 * 1000 * 1000},
      {"GiB", std::int64_t{1} << 30},
      {"GB", 1000LL * 1000 * 1000},
      {"MiB", std::int64_t{1} << 20},
      {"MB", 1000LL * 1000},
  }};
  if (bytes > 0)
    for (const auto& [name, mult] : units)
      if (bytes % mult == 0) return std::to_string(bytes / mult) + name;
  return std::to_string(bytes);
}

}  // namespace

HardwareProfile load_hardware_yaml(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(source + ": not valid YAML: " + e.what());
  }
  if (!root.IsMap()) throw std::invalid_argument(source + ": expected a mapping of hardware fields");
  std::set<std::string> known = {"name",           "source",          "memory_safety", "activation_dtype",
                                 "gpu_memory_gbps", "gemm_tflops_by_rows", "dequant_gbps"};
  for (const auto& f : kSizes) known.insert(f.key);
  for (const auto& f : kRates) known.insert(f.key);
  for (const auto& kv : root) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : std::string("<non-scalar key>");
    if (!known.count(key)) throw std::invalid_argument(source + ": unknown field '" + key + "'");
  }

  HardwareProfile h;
  h.name = scalar_of(root, source, "name");
  if (h.name.empty()) fail(source, "name", "must not be empty");
  h.source = scalar_of(root, source, "source");
  for (const auto& f : kSizes) h.*f.field = size_of(root, source, f.key);
  if (root["memory_safety"]) {
    h.memory_safety = rate_of(root, source, "memory_safety");
    if (h.memory_safety > 1) fail(source, "memory_safety", "is a fraction of each tier, at most 1");
  }
  if (root["activation_dtype"]) {
    const std::string text = scalar_of(root, source, "activation_dtype");
    try {
      h.activation_dtype = kernels::parse_float_dtype(text);
    } catch (const std::invalid_argument& e) {
      fail(source, "activation_dtype", e.what());
    }
  }
  for (const auto& f : kRates) h.*f.field = rate_of(root, source, f.key) * f.scale;
  if (root["gpu_memory_gbps"]) h.gpu_memory = rate_of(root, source, "gpu_memory_gbps") * kGiga;
  if (const YAML::Node curve = root["gemm_tflops_by_rows"]) {
    const std::string key = "gemm_tflops_by_rows";
    if (!curve.IsMap() || curve.size() == 0) fail(source, key, "must map rows to TFLOP/s, e.g. {1: 0.01, 512: 0.08}");
    for (const auto& kv : curve) {
      std::int64_t rows = 0;
      double tflops = 0;
      try {
        rows = kv.first.as<std::int64_t>();
        tflops = kv.second.as<double>();
      } catch (const YAML::Exception&) {
        fail(source, key, "must map whole row counts to numbers");
      }
      if (rows < 1 || !std::isfinite(tflops) || tflops <= 0) fail(source, key, "needs rows >= 1 and positive rates");
      h.gemm_by_rows.emplace_back(rows, tflops * kTera);
    }
    std::sort(h.gemm_by_rows.begin(), h.gemm_by_rows.end());
  }
  if (root["dequant_gbps"]) h.dequant = rate_of(root, source, "dequant_gbps") * kGiga;
  return h;
}

double HardwareProfile::gemm_rate(double rows, double fallback) const {
  if (gemm_by_rows.empty()) return fallback;
  if (rows <= static_cast<double>(gemm_by_rows.front().first)) return gemm_by_rows.front().second;
  if (rows >= static_cast<double>(gemm_by_rows.back().first)) return gemm_by_rows.back().second;
  for (std::size_t i = 1; i < gemm_by_rows.size(); ++i) {
    const auto [r1, v1] = gemm_by_rows[i];
    if (rows > static_cast<double>(r1)) continue;
    const auto [r0, v0] = gemm_by_rows[i - 1];
    const double t = std::log(rows / static_cast<double>(r0)) / std::log(static_cast<double>(r1) / static_cast<double>(r0));
    return std::exp(std::log(v0) + t * (std::log(v1) - std::log(v0)));
  }
  return gemm_by_rows.back().second;
}

HardwareProfile load_hardware_file(const std::string& path) {
  const auto text = offload::read_text_file(path);
  if (!text) throw std::invalid_argument("cannot read hardware profile " + path);
  return load_hardware_yaml(*text, path);
}

std::string hardware_to_yaml(const HardwareProfile& h) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << h.name;
  out << YAML::Key << "source" << YAML::Value << h.source;
  for (const auto& f : kSizes) {
    out << YAML::Key << f.key << YAML::Value << size_text(h.*f.field);
    out << YAML::Comment(offload::format_bytes(h.*f.field));
  }
  out << YAML::Key << "memory_safety" << YAML::Value << shortest(h.memory_safety);
  out << YAML::Key << "activation_dtype" << YAML::Value << std::string(kernels::dtype_name(h.activation_dtype));
  for (const auto& f : kRates) {
    out << YAML::Key << f.key << YAML::Value << shortest(h.*f.field / f.scale);
  }
  if (h.gpu_memory > 0) out << YAML::Key << "gpu_memory_gbps" << YAML::Value << shortest(h.gpu_memory / kGiga);
  if (!h.gemm_by_rows.empty()) {
    out << YAML::Key << "gemm_tflops_by_rows" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [rows, rate] : h.gemm_by_rows) out << YAML::Key << rows << YAML::Value << shortest(rate / kTera);
    out << YAML::EndMap;
  }
  if (h.dequant > 0) out << YAML::Key << "dequant_gbps" << YAML::Value << shortest(h.dequant / kGiga);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace flexh2o::policy
