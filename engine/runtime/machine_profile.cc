#include "engine/runtime/machine_profile.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

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
