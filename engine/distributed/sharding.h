// Data-parallel bookkeeping that needs no MPI: rank 0's queue of a job's requests, dealt to the
// ranks as they ask, and a rank's hand of requests dealt to it and not yet taken.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace flexh2o::distributed {

// How the queue picks a runner's next request. Without prompts (or `min_tokens` 0) it deals in
// the job's order, first come first served. With them, requests whose prompts share their
// first `min_tokens` tokens are of one family, and each family of two or more requests is
// given to a runner, the largest first, each to the runner with the fewest requests given so
// far: the runners' shares are about even and every prefix is on one runner. Among the first
// `lookahead` waiting groups it may take, a runner is dealt the first, in this order: of its
// families or of one of its last `recent` requests' (what its cache rows hold or are about
// to); of no family; of another runner's family. The window starts at the queue's first
// waiting group, so a runner that skips the others' requests runs at most `lookahead` groups
// ahead of them (docs/prefix-sharing.md).
struct PrefixDealing {
  std::vector<std::span<const std::int32_t>> prompts;  // per request (empty: the job's order)
  std::int64_t min_tokens = 0;
  std::size_t recent = 0, lookahead = 64;
};

// A job's requests dealt a group at a time (an OpenAI line's n choices go to one runner
// together, as they are written together) to `runners` runners, each of which takes its dealt
// requests in the job's order: a runner is never dealt a request before one it was dealt, and
// a request is passed over only while some runner still taking requests may take it.
class DealQueue {
 public:
  // starts_group[i]: request i begins a group (request 0 always does).
  explicit DealQueue(std::vector<bool> starts_group, int runners = 1, PrefixDealing prefer = {});
  // The next requests for `runner`: whole groups, at least `want` (>= 1) requests unless none
  // it may take is left first; empty when none is left for it (it then takes no more).
  std::vector<std::size_t> deal(std::size_t want, int runner = 0);
  std::size_t size() const { return starts_.size(); }
  std::size_t dealt() const { return dealt_; }

 private:
  struct Runner {
    std::optional<std::size_t> last;  // the last request dealt to it
    std::deque<std::size_t> recent;   // the first requests of its last groups
    bool taking = true;               // false once dealt none
  };
  // How a runner ranks a request: of its families, of none, of another runner's.
  enum class Fit { Own, Free, Others };
  void give_families();
  std::size_t group_end(std::size_t begin) const;
  std::optional<std::size_t> pick(int runner) const;  // index into waiting_
  bool may_take(const Runner& r, std::size_t begin) const { return !r.last || *r.last < begin; }
  bool another_may_take(int runner, std::size_t begin) const;
  bool holds_family(const Runner& r, std::uint64_t family) const;
  Fit fit(int runner, std::size_t begin) const;

  std::vector<bool> starts_;
  PrefixDealing prefer_;
  std::vector<std::uint64_t> family_;  // per request: a hash of its first min_tokens tokens (0: none)
  std::unordered_map<std::uint64_t, int> runner_of_;  // each family's runner
  std::deque<std::size_t> waiting_;    // the first request of each group not dealt, in order
  std::vector<Runner> runners_;
  std::size_t dealt_ = 0;
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
