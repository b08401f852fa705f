// Which of a job's requests a runner takes, asked as its slots free (continuous batching) or
// its blocks start (fixed). Without a source a runner takes every request in order (the
// one-process run); a data-parallel rank takes those rank 0 deals it from the job's queue as
// it asks (distributed/job_queue.h), so that a rank whose requests end early takes more.
// Requests are taken in the job's order, an OpenAI line's n choices together.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>

namespace flexh2o::serving {

class RequestSource {
 public:
  static constexpr std::size_t kNoneLeft = SIZE_MAX;
  virtual ~RequestSource() = default;
  // The first request at or after `from` (an index into the job's requests) that this runner
  // takes, the same until `from` passes it; kNoneLeft when the job has none left for it.
  // Unless `wait`, nullopt when that is not known yet (an answer is on its way).
  virtual std::optional<std::size_t> next(std::size_t from, bool wait) = 0;
};

}  // namespace flexh2o::serving
