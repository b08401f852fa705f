#include "offload/trace.h"

#include "offload/text_file.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

namespace flexh2o::offload {

void Trace::record(Span s) {
  std::lock_guard lock(mu_);
  spans_.push_back(std::move(s));
}

std::vector<Span> Trace::spans() const {
  std::lock_guard lock(mu_);
  return spans_;
}

std::map<std::string, double> Trace::time_by_primitive() const {
  std::map<std::string, double> out;
  std::lock_guard lock(mu_);
  for (const auto& s : spans_) out[s.primitive] += s.t1 - s.t0;
  return out;
}

void Trace::write_chrome_json(const std::string& path) const { offload::write_chrome_json(path, {{"", spans()}}); }

void write_chrome_json(const std::string& path, const std::vector<TraceProcess>& processes) {
  // One "thread" per track, named with metadata events so Perfetto shows the track names.
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t p = 0; p < processes.size(); ++p) {
    const int pid = static_cast<int>(p) + 1;
    if (!processes[p].name.empty())
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", processes[p].name}}}});
    std::map<std::string, int> tids;
    for (const auto& s : processes[p].spans) {
      auto [it, added] = tids.emplace(s.track, static_cast<int>(tids.size()) + 1);
      if (added)
        events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", it->second},
                          {"args", {{"name", s.track}}}});
      nlohmann::json e = {{"ph", "X"}, {"pid", pid}, {"tid", it->second}, {"name", s.name}, {"cat", s.primitive},
                          {"ts", s.t0 * 1e6}, {"dur", (s.t1 - s.t0) * 1e6}};
      if (s.bytes > 0) e["args"] = {{"bytes", s.bytes}};
      events.push_back(std::move(e));
    }
  }
  write_file_atomically(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump());
}

}  // namespace flexh2o::offload
