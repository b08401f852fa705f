// Data-parallel bookkeeping that needs no MPI: dealing a job's prompts to ranks, and putting
// results that finish out of order back into the job's order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace flexh2o::distributed {

// The rank of every item, dealt in order so that the ranks' summed costs stay balanced: each
// item goes to the rank with the least cost so far (the lowest on ties). Every rank's share
// keeps input order and spreads over the whole input, so that results come back roughly in
// input order and a writer that keeps that order holds few of them back.
std::vector<int> deal_balanced(std::span<const std::int64_t> costs, int ranks);

// Texts keyed by their position in the job, released in position order: each one once it and
// every earlier one have arrived.
class InOrder {
 public:
  explicit InOrder(std::size_t count) : count_(count) {}
  // Throws std::logic_error for a position out of range or given twice.
  void put(std::size_t position, std::string text);
  // The texts now next in order, in order (removed from the buffer).
  std::vector<std::string> take_ready();
  std::size_t released() const { return next_; }
  bool complete() const { return next_ == count_; }

 private:
  std::size_t count_;
  std::size_t next_ = 0;
  std::map<std::size_t, std::string> waiting_;
};

}  // namespace flexh2o::distributed
