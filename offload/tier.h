// The three places a tensor can live. Order is fastest to slowest.
#pragma once
#include <cstdint>
#include <string_view>

namespace flexh2o::offload {

enum class Tier : std::uint8_t { Gpu, Cpu, Disk };

constexpr std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::Gpu: return "gpu";
    case Tier::Cpu: return "cpu";
    case Tier::Disk: return "disk";
  }
  return "unknown";
}

}  // namespace flexh2o::offload
