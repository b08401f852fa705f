// Data-parallel bookkeeping that needs no MPI: rank 0's queue of a job's requests, dealt to the
// ranks as they ask, and a rank's hand of requests dealt to it and not yet taken.
#pragma once
#include <cstddef>
#include <deque>
#include <optional>
#include <span>
#include <vector>

namespace flexh2o::distributed {

// A job's requests in order, dealt a group at a time (an OpenAI line's n choices go to one rank
// together, as they are written together).
class DealQueue {
 public:
  // starts_group[i]: request i begins a group (request 0 always does).
  explicit DealQueue(std::vector<bool> starts_group);
  // The next requests: whole groups, at least `want` (>= 1) requests unless the queue runs out
  // first; empty when none is left.
  std::vector<std::size_t> deal(std::size_t want);
  std::size_t size() const { return starts_.size(); }
  std::size_t dealt() const { return next_; }

 private:
  std::vector<bool> starts_;
  std::size_t next_ = 0;
};

// The requests dealt to one runner and not yet taken, in the job's order.
class Hand {
 public:
  // Adds dealt requests: increasing, after those held (throws std::logic_error otherwise).
  void add(std::span<const std::size_t> dealt);
  // The first held request at or after `from` (those before it are let go); nullopt for none.
  std::optional<std::size_t> next(std::size_t from);
  std::size_t size() const { return held_.size(); }

 private:
  std::deque<std::size_t> held_;
  std::optional<std::size_t> last_;  // the last request added
};

}  // namespace flexh2o::distributed
