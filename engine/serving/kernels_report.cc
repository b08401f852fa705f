#include "engine/serving/kernels_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace flexh2o::serving {

std::string kernels_text(const kernels::KernelUse& u) {
  if (u.isa.empty()) return "";
  std::int64_t flops = 0;
  for (const auto& p : u.gemm) flops += p.flops;
  std::string gemms;
  for (const auto& p : u.gemm)
    gemms += fmt::format("{}{} {:.0f}% of FLOPs ({} calls)", gemms.empty() ? "" : ", ", p.name,
                         flops > 0 ? 100.0 * static_cast<double>(p.flops) / static_cast<double>(flops) : 0.0, p.calls);
  std::string out = "kernels: " + u.isa;
  if (!gemms.empty()) out += " | GEMMs: " + gemms;
  if (!u.primitives.empty()) out += fmt::format(" | oneDNN {}", fmt::join(u.primitives, ", "));
  return out + "\n";
}

nlohmann::json kernels_json(const kernels::KernelUse& u) {
  nlohmann::json j{{"isa", u.isa}, {"gemm", nlohmann::json::array()}, {"primitives", u.primitives}};
  for (const auto& p : u.gemm) j["gemm"].push_back({{"path", p.name}, {"calls", p.calls}, {"flops", p.flops}});
  return j;
}

}  // namespace flexh2o::serving
