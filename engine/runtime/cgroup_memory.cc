#include "engine/runtime/cgroup_memory.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

// v1 writes "no limit" as a page-rounded 2^63 - 1; v2 as "max" (not a number).
constexpr std::int64_t kNoLimitAbove = std::int64_t{1} << 60;

// The number on the first line of a file; nullopt when absent, unreadable or not a number.
std::optional<std::int64_t> read_number(const fs::path& p) {
  std::ifstream in(p);
  std::int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

// The value of `key` in a memory.stat file ("key value" lines); 0 when absent.
std::int64_t stat_value(const fs::path& p, const std::string& key) {
  std::ifstream in(p);
  std::string k;
  std::int64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

struct Layout {
  fs::path dir;                    // the cgroup's directory
  const char* limit_file;
  const char* usage_file;
  const char* inactive_file_key;   // in memory.stat
};

// limit - (usage - inactive file) of one cgroup directory; nullopt when it sets no limit.
std::optional<std::int64_t> headroom_of(const Layout& l) {
  const auto limit = read_number(l.dir / l.limit_file);
  if (!limit || *limit <= 0 || *limit >= kNoLimitAbove) return std::nullopt;
  const std::int64_t usage = read_number(l.dir / l.usage_file).value_or(0);
  const std::int64_t inactive = stat_value(l.dir / "memory.stat", l.inactive_file_key);
  const std::int64_t working_set = std::max<std::int64_t>(0, usage - std::clamp<std::int64_t>(inactive, 0, usage));
  return std::max<std::int64_t>(0, *limit - working_set);
}

}  // namespace

std::optional<std::int64_t> cgroup_memory_headroom(const std::string& proc_self_cgroup, const fs::path& cgroup_root) {
  std::optional<std::int64_t> least;
  std::istringstream in(proc_self_cgroup);
  for (std::string line; std::getline(in, line);) {
    // "ID:controllers:path": v1 names the memory controller, v2 has an empty list.
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const fs::path rel = fs::path(line.substr(b + 1)).relative_path();
    const bool v1 = ("," + controllers + ",").find(",memory,") != std::string::npos;
    if (!v1 && !controllers.empty()) continue;
    const fs::path base = v1 ? cgroup_root / "memory" : cgroup_root;
    // The cgroup and each ancestor up to the mount's root: a parent's limit binds too.
    for (fs::path p = rel;; p = p.parent_path()) {
      const Layout l = v1 ? Layout{base / p, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"}
                          : Layout{base / p, "memory.max", "memory.current", "inactive_file"};
      if (const auto h = headroom_of(l)) least = std::min(least.value_or(*h), *h);
      if (p.empty()) break;
    }
  }
  return least;
}

}  // namespace flexh2o::engine
