// The memory a process may use inside its control groups: the kernel kills it (exit 137, no
// message) when its cgroup's usage reaches the limit, whatever MemAvailable says.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace flexh2o::engine {

// Bytes the cgroups in `proc_self_cgroup` (the text of /proc/self/cgroup) can still give: the
// least, over each cgroup and its ancestors that set a limit, of the limit less the working
// set (usage less inactive file pages, which the kernel reclaims before it kills). v1 reads
// <root>/memory/<path>/memory.{limit_in_bytes,usage_in_bytes,stat} (total_inactive_file), v2
// <root>/<path>/memory.{max,current,stat} (inactive_file). nullopt: no limit found.
std::optional<std::int64_t> cgroup_memory_headroom(const std::string& proc_self_cgroup,
                                                   const std::filesystem::path& cgroup_root);

}  // namespace flexh2o::engine
