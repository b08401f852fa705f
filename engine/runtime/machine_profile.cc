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

double weight_read_rate(kernels::Backend& be) {
  const std::int64_t n = 8192, k = 4096;  // 64 MiB of f16
  const std::size_t bytes = static_cast<std::size_t>(n * k) * 2;
  const std::vector<std::uint16_t> host(static_cast<std::size_t>(n * k), 0x2e66);  // 0.1 in f16
  kernels::DeviceBuffer w(be, bytes), x(be, static_cast<std::size_t>(k) * sizeof(float)),
      y(be, static_cast<std::size_t>(n) * sizeof(float));
  be.copy_to_device(w.data(), host.data(), bytes);
  const std::vector<float> ones(static_cast<std::size_t>(k), 1.0f);
  be.copy_to_device(x.data(), ones.data(), x.bytes());
  kernels::GemmArgs a;
  a.x = x.as<float>();
  a.m = 1;
  a.w = {w.data(), kernels::DType::F16, n, k};
  a.y = y.as<float>();
  double best = std::numeric_limits<double>::max();
  for (int call = 0; call < 5; ++call) {  // the first warms up
    const auto t0 = std::chrono::steady_clock::now();
    be.gemm(a);
    be.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (call > 0) best = std::min(best, s);
  }
  return static_cast<double>(bytes) / best;
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
  if (cpu && hw.gpu_memory == 0) {
    hw.gpu_memory = weight_read_rate(be);
    hw.source += fmt::format("; memory read at {:.1f} GB/s (measured)", hw.gpu_memory / 1e9);
  }
  return hw;
}

}  // namespace flexh2o::engine
