#include "engine/machine_profile.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "engine/embedded.h"

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

// A number from the first line of a file, or nullopt ("max", absent, unreadable).
std::optional<std::int64_t> read_number(const fs::path& p) {
  std::ifstream in(p);
  std::int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

std::int64_t cgroup_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::int64_t limit = std::numeric_limits<std::int64_t>::max();
  for (std::string line; std::getline(in, line);) {
    // "ID:controllers:path": v1 names the memory controller, v2 has an empty list.
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::optional<std::int64_t> v;
    if (controllers.find("memory") != std::string::npos)
      v = read_number(fs::path("/sys/fs/cgroup/memory") / path.substr(1) / "memory.limit_in_bytes");
    else if (controllers.empty())
      v = read_number(fs::path("/sys/fs/cgroup") / path.substr(1) / "memory.max");
    if (v && *v > 0) limit = std::min(limit, *v);
  }
  return limit;
}

std::int64_t free_disk(const std::string& dir) {
  const fs::path p = dir.empty() ? fs::temp_directory_path() : fs::path(dir);
  struct statvfs s {};
  if (::statvfs((fs::exists(p) ? p : p.parent_path()).c_str(), &s) != 0) return 0;
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
  return std::min(available, cgroup_limit());
}

policy::HardwareProfile this_machine_profile(const kernels::Backend& be, const std::string& offload_dir) {
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
  return hw;
}

}  // namespace flexh2o::engine
