// Timed spans of a run, one track per stream/thread (compute, each copy lane, disk), for the
// Chrome trace (--trace, opens in Perfetto) and the per-primitive times of --metrics.
// Recording is thread-safe; a null Trace* everywhere means "not tracing".
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace flexh2o::offload {

struct Span {
  std::string track;      // "compute", "copy: weights in", ...
  std::string primitive;  // what kind of work: "compute_layer", "load_weight", "store_cache", ...
  std::string name;       // this instance, e.g. "attention.3 b1"
  double t0 = 0, t1 = 0;  // seconds since the trace started
  std::int64_t bytes = 0;
};

class Trace {
 public:
  Trace() : start_(std::chrono::steady_clock::now()) {}
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  // Time 0 is now: the processes of a run over several ranks align their traces at a barrier
  // (before recording anything).
  void reset_clock() { start_ = std::chrono::steady_clock::now(); }
  void record(Span s);
  std::vector<Span> spans() const;
  // Seconds summed per primitive.
  std::map<std::string, double> time_by_primitive() const;
  // Chrome trace-event JSON; throws naming the path when it cannot be written.
  void write_chrome_json(const std::string& path) const;

 private:
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Span> spans_;
};

// The spans of one process in a trace of several (the ranks of an MPI run).
struct TraceProcess {
  std::string name;  // empty: unnamed
  std::vector<Span> spans;
};
// Chrome trace-event JSON with one process per entry (pid 1, 2, ...), one thread per track;
// throws naming the path when it cannot be written.
void write_chrome_json(const std::string& path, const std::vector<TraceProcess>& processes);

// Records the span from construction to destruction (no-op on a null trace).
class ScopedSpan {
 public:
  ScopedSpan(Trace* t, std::string track, std::string primitive, std::string name, std::int64_t bytes = 0)
      : trace_(t) {
    if (trace_) span_ = {std::move(track), std::move(primitive), std::move(name), trace_->now(), 0, bytes};
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;
  ~ScopedSpan() {
    if (trace_) {
      span_.t1 = trace_->now();
      trace_->record(std::move(span_));
    }
  }

 private:
  Trace* trace_;
  Span span_;
};

}  // namespace flexh2o::offload
