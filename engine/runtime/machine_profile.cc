#include "engine/runtime/machine_profile.h"

#include <sys/statvfs.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "engine/runtime/cgroup_memory.h"
#include "engine/model/embedded.h"

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

std::int64_t cgroup_headroom() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return cgroup_memory_headroom(text.str(), "/sys/fs/cgroup").value_or(std::numeric_limits<std::int64_t>::max());
}

// The free space where the offload directory goes; one not yet made goes into its nearest
// existing ancestor.
std::int64_t free_disk(const std::string& dir) {
  fs::path p = fs::absolute(dir.empty() ? fs::temp_directory_path() : fs::path(dir));
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
  struct statvfs s {};
  if (::statvfs(p.c_str(), &s) != 0) return 0;
  return static_cast<std::int64_t>(s.f_bavail) * static_cast<std::int64_t>(s.f_frsize);
}

}  // namespace

policy::HardwareProfile hardware_profile(const std::string& name_or_path) {
  for (const auto& e : embedded_hardware_profiles())
    if (e.name == name_or_path) return policy::load_hardware_yaml(std::string(e.yaml), "configs/hardware/" + name_or_path + ".yaml");
  if (!fs::exists(name_or_path)) {
    std::string known;
    for (const auto& e : embedded_hardware_profiles()) known += (known.empty() ? "" : ", ") + std::string(e.name);
    throw std::invalid_argument("hardware profile '" + name_or_path + "': no such file and no built-in profile of that name (" +
                                known + ")");
  }
  return policy::load_hardware_file(name_or_path);
}

std::int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::int64_t available = std::numeric_limits<std::int64_t>::max();
  for (std::string key; in >> key;) {
    std::int64_t kib = 0;
    in >> kib;
    if (key == "MemAvailable:") available = kib * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::min(available, cgroup_headroom());
}

namespace {

// A GEMM of m rows over an f16 matrix of 8192 x 4096 (64 MiB: larger than a CPU's last-level
// cache, as a large model's weights are), best seconds of a few calls after a warm-up.
class DecodeGemm {
 public:
  static constexpr std::int64_t kN = 8192, kK = 4096, kMaxRows = 64;
  explicit DecodeGemm(kernels::Backend& be)
      : be_(be),
        w_(be, static_cast<std::size_t>(kN * kK) * 2),
        x_(be, static_cast<std::size_t>(kMaxRows * kK) * sizeof(float)),
        y_(be, static_cast<std::size_t>(kMaxRows * kN) * sizeof(float)) {
    const std::vector<std::uint16_t> w(static_cast<std::size_t>(kN * kK), 0x2e66);  // 0.1 in f16
    be.copy_to_device(w_.data(), w.data(), w_.bytes());
    const std::vector<float> x(static_cast<std::size_t>(kMaxRows * kK), 1.0f);
    be.copy_to_device(x_.data(), x.data(), x_.bytes());
  }
  std::int64_t weight_bytes() const { return static_cast<std::int64_t>(w_.bytes()); }
  double flops(std::int64_t m) const { return 2.0 * static_cast<double>(m * kN * kK); }
  double best_seconds(std::int64_t m) {
    kernels::GemmArgs a;
    a.x = x_.as<float>();
    a.m = m;
    a.w = {w_.data(), kernels::DType::F16, kN, kK};
    a.y = y_.as<float>();
    a.compute = kernels::DType::F32;  // decode's compute dtype (auto keeps f32 below 64 rows)
    double best = std::numeric_limits<double>::max();
    for (int call = 0; call < 4; ++call) {  // the first warms up
      const auto t0 = std::chrono::steady_clock::now();
      be_.gemm(a);
      be_.synchronize();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (call > 0) best = std::min(best, s);
    }
    return best;
  }

 private:
  kernels::Backend& be_;
  kernels::DeviceBuffer w_, x_, y_;
};

// The built-in profile's rate curves brought to this machine as it is now: each is scaled by
// measured / built-in GEMM rate at its rows (1 to 64, decode; the 64-row ratio beyond), so the
// curves keep calibrate's shape and what the engine pays around its GEMMs, at the level a
// large model's decode GEMMs reach here (the built-in curves come from OPT-125M, whose
// weights stay in cache, on another CPU, unloaded).
void scale_to_measured(policy::HardwareProfile& hw, const policy::RateCurve& measured) {
  const policy::RateCurve builtin = hw.gemm_by_rows;
  auto factor = [&](std::int64_t rows) {
    const double x = static_cast<double>(std::min<std::int64_t>(rows, DecodeGemm::kMaxRows));
    return policy::rate_at(measured, x, 1) / policy::rate_at(builtin, x, policy::rate_at(measured, x, 1));
  };
  for (policy::RateCurve* curve : {&hw.gemm_by_rows, &hw.layer_by_rows, &hw.head_by_rows})
    for (auto& [rows, rate] : *curve) rate *= factor(rows);
  if (hw.gemm_by_rows.empty()) hw.gemm_by_rows = measured;
  hw.gpu_gemm_decode = policy::rate_at(measured, 16, hw.gpu_gemm_decode);
}

}  // namespace

double weight_read_rate(kernels::Backend& be) {
  DecodeGemm g(be);
  return static_cast<double>(g.weight_bytes()) / g.best_seconds(1);
}

policy::HardwareProfile this_machine_profile(kernels::Backend& be, const std::string& offload_dir) {
  const bool cpu = be.kind() == kernels::DeviceKind::Cpu;
  const std::string rates = cpu ? "ci-cpu" : "h100-pcie";
  policy::HardwareProfile hw = hardware_profile(rates);
  const std::int64_t memory = available_memory();
  hw.name = "this machine";
  hw.source = "capacities of this machine now, rates of the built-in " + rates + " profile";
  // On the CPU backend both tiers are this RAM: the planner fits them into it together.
  hw.gpu_is_host_memory = cpu;
  hw.gpu_mem = cpu ? memory : be.memory_capacity();
  hw.cpu_mem = memory;
  hw.disk_mem = free_disk(offload_dir);
  if (cpu) {
    DecodeGemm g(be);
    policy::RateCurve measured;
    for (std::int64_t m : {std::int64_t{1}, std::int64_t{4}, std::int64_t{16}, DecodeGemm::kMaxRows})
      measured.emplace_back(m, g.flops(m) / g.best_seconds(m));
    if (hw.gpu_memory == 0) hw.gpu_memory = measured.front().second / g.flops(1) * static_cast<double>(g.weight_bytes());
    scale_to_measured(hw, measured);
    hw.source += fmt::format("; decode GEMMs measured now: {:.1f}/{:.1f}/{:.1f}/{:.1f} GFLOP/s at 1/4/16/64 rows, "
                             "weights read at {:.1f} GB/s",
                             measured[0].second / 1e9, measured[1].second / 1e9, measured[2].second / 1e9,
                             measured[3].second / 1e9, hw.gpu_memory / 1e9);
  }
  return hw;
}

}  // namespace flexh2o::engine
