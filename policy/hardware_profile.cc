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

struct CurveField {
  const char* key;
  RateCurve HardwareProfile::*field;
  const char* example;
};
constexpr std::array<CurveField, 5> kCurves{{
    {"gemm_tflops_by_rows", &HardwareProfile::gemm_by_rows, "{1: 0.01, 512: 0.08}"},
    {"layer_tflops_by_rows", &HardwareProfile::layer_by_rows, "{1: 0.01, 512: 0.07}"},
    {"head_tflops_by_rows", &HardwareProfile::head_by_rows, "{1: 0.01, 64: 0.05}"},
    {"gpu_attn_decode_tflops_by_len", &HardwareProfile::gpu_attn_decode_by_len, "{64: 0.008, 1024: 0.005}"},
    {"cpu_attn_decode_tflops_by_len", &HardwareProfile::cpu_attn_decode_by_len, "{64: 0.008, 1024: 0.005}"},
}};

// A number field named by its key.
struct NamedField {
  const char* key;
  double HardwareProfile::*field;
};
// Per-request disk times and the host's per-row time: microseconds in the file, seconds in
// the struct.
constexpr std::array<NamedField, 4> kRequests{{
    {"disk_read_request_us", &HardwareProfile::disk_read_request},
    {"disk_write_request_us", &HardwareProfile::disk_write_request},
    {"disk_rows_write_request_us", &HardwareProfile::disk_rows_write_request},
    {"host_row_us", &HardwareProfile::host_row},
}};
// Fractions of decode attention's time (HardwareProfile::gpu_attn_decode_read_share).
constexpr std::array<NamedField, 2> kReadShares{{
    {"gpu_attn_decode_read_share", &HardwareProfile::gpu_attn_decode_read_share},
    {"cpu_attn_decode_read_share", &HardwareProfile::cpu_attn_decode_read_share},
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

double number_of(const YAML::Node& root, const std::string& source, const std::string& key) {
  const std::string text = scalar_of(root, source, key);
  double v = 0;
  try {
    v = root[key].as<double>();
  } catch (const YAML::Exception&) {
    fail(source, key, "must be a number, got '" + text + "'");
  }
  if (!std::isfinite(v)) fail(source, key, "must be a finite number, got '" + text + "'");
  return v;
}

// A fraction in [0, 1].
double fraction_of(const YAML::Node& root, const std::string& source, const std::string& key) {
  const double v = number_of(root, source, key);
  if (v < 0 || v > 1) fail(source, key, "is a fraction in [0, 1]");
  return v;
}

double rate_of(const YAML::Node& root, const std::string& source, const std::string& key) {
  const double v = number_of(root, source, key);
  if (v <= 0) fail(source, key, "must be a positive number, got '" + scalar_of(root, source, key) + "'");
  return v;
}

// A {x: TFLOP/s} mapping with whole, positive x and positive rates, sorted by x.
RateCurve curve_of(const YAML::Node& root, const std::string& source, const std::string& key, const char* example) {
  const YAML::Node curve = root[key];
  if (!curve.IsMap() || curve.size() == 0) fail(source, key, std::string("must map sizes to TFLOP/s, e.g. ") + example);
  RateCurve out;
  for (const auto& kv : curve) {
    std::int64_t x = 0;
    double tflops = 0;
    try {
      x = kv.first.as<std::int64_t>();
      tflops = kv.second.as<double>();
    } catch (const YAML::Exception&) {
      fail(source, key, "must map whole sizes to numbers");
    }
    if (x < 1 || !std::isfinite(tflops) || tflops <= 0) fail(source, key, "needs sizes >= 1 and positive rates");
    out.emplace_back(x, tflops * kTera);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Microseconds, to 4 significant digits.
double round_us(double seconds) {
  const double us = seconds * 1e6;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(us)));
  return std::round(us * scale) / scale;
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
  std::set<std::string> known = {"name", "source", "memory_safety", "gpu_is_host_memory", "activation_dtype", "gpu_memory_gbps",
                                 "copy_overlap", "dequant_gbps"};
  for (const auto& c : kCurves) known.insert(c.key);
  for (const auto& r : kRequests) known.insert(r.key);
  for (const auto& r : kReadShares) known.insert(r.key);
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
  if (root["gpu_is_host_memory"]) {
    try {
      h.gpu_is_host_memory = root["gpu_is_host_memory"].as<bool>();
    } catch (const YAML::Exception&) {
      fail(source, "gpu_is_host_memory", "must be true or false");
    }
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
  for (const auto& c : kCurves)
    if (root[c.key]) h.*c.field = curve_of(root, source, c.key, c.example);
  for (const auto& r : kRequests)
    if (root[r.key]) h.*r.field = rate_of(root, source, r.key) * 1e-6;
  if (root["copy_overlap"]) h.copy_overlap = fraction_of(root, source, "copy_overlap");
  if (root["dequant_gbps"]) h.dequant = rate_of(root, source, "dequant_gbps") * kGiga;
  for (const auto& r : kReadShares)
    if (root[r.key]) h.*r.field = fraction_of(root, source, r.key);
  return h;
}

double rate_at(const RateCurve& curve, double x, double fallback) {
  if (curve.empty()) return fallback;
  if (x <= static_cast<double>(curve.front().first)) return curve.front().second;
  if (x >= static_cast<double>(curve.back().first)) return curve.back().second;
  for (std::size_t i = 1; i < curve.size(); ++i) {
    const auto [x1, v1] = curve[i];
    if (x > static_cast<double>(x1)) continue;
    const auto [x0, v0] = curve[i - 1];
    const double t = std::log(x / static_cast<double>(x0)) / std::log(static_cast<double>(x1) / static_cast<double>(x0));
    return std::exp(std::log(v0) + t * (std::log(v1) - std::log(v0)));
  }
  return curve.back().second;
}

double rows_rate_at(const RateCurve& curve, double x, double fallback, double ceiling) {
  if (curve.size() < 2 || x <= static_cast<double>(curve.back().first)) return rate_at(curve, x, fallback);
  const auto [x0, v0] = curve[curve.size() - 2];
  const auto [x1, v1] = curve.back();
  const double slope = std::clamp(std::log(v1 / v0) / std::log(static_cast<double>(x1) / static_cast<double>(x0)), 0.0, 1.0);
  const double extended = v1 * std::pow(x / static_cast<double>(x1), slope);
  return std::max(v1, std::min(extended, ceiling));
}

double HardwareProfile::rows_rate(const RateCurve& unit, double rows, double fallback) const {
  if (unit.empty()) return rows_rate_at(gemm_by_rows, rows, fallback, gpu_gemm_prefill);
  const auto [last_rows, last_rate] = unit.back();
  if (gemm_by_rows.empty() || rows <= static_cast<double>(last_rows))
    return rows_rate_at(unit, rows, fallback, gpu_gemm_prefill);
  const double growth = rows_rate_at(gemm_by_rows, rows, 1, gpu_gemm_prefill) /
                        rows_rate_at(gemm_by_rows, static_cast<double>(last_rows), 1, gpu_gemm_prefill);
  return std::max(last_rate, std::min(last_rate * growth, gpu_gemm_prefill));
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
  if (h.gpu_is_host_memory) out << YAML::Key << "gpu_is_host_memory" << YAML::Value << true;
  out << YAML::Key << "activation_dtype" << YAML::Value << std::string(kernels::dtype_name(h.activation_dtype));
  for (const auto& f : kRates) {
    out << YAML::Key << f.key << YAML::Value << shortest(h.*f.field / f.scale);
  }
  if (h.gpu_memory > 0) out << YAML::Key << "gpu_memory_gbps" << YAML::Value << shortest(h.gpu_memory / kGiga);
  if (h.copy_overlap < 1) out << YAML::Key << "copy_overlap" << YAML::Value << shortest(h.copy_overlap);
  for (const auto& r : kRequests)
    if (h.*r.field > 0) out << YAML::Key << r.key << YAML::Value << shortest(round_us(h.*r.field));
  for (const auto& c : kCurves) {
    if ((h.*c.field).empty()) continue;
    out << YAML::Key << c.key << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [x, rate] : h.*c.field) out << YAML::Key << x << YAML::Value << shortest(rate / kTera);
    out << YAML::EndMap;
  }
  if (h.dequant > 0) out << YAML::Key << "dequant_gbps" << YAML::Value << shortest(h.dequant / kGiga);
  for (const auto& r : kReadShares)
    if (h.*r.field > 0) out << YAML::Key << r.key << YAML::Value << shortest(h.*r.field);
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace flexh2o::policy
