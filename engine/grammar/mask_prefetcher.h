// Token masks computed ahead, on a worker thread: after a sequence takes a token, the mask of
// its next state is computed while the model computes the next step, so that the sampler's
// fill_mask finds it kept (CompiledGrammar::prepare_mask) instead of walking the vocabulary
// then. A mask not ready in time is computed (or waited for) by fill_mask as before: the
// results never depend on the worker.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/grammar/matcher.h"

namespace flexh2o::grammar {

class MaskPrefetcher {
 public:
  MaskPrefetcher() = default;
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;
  // Drops the tasks not started and joins the worker.
  ~MaskPrefetcher();
  // Queues prepare_mask(state, tokens_left) of `grammar` (the worker starts on the first call);
  // dropped when kMaxPending tasks wait already. Thread-safe.
  void prepare(std::shared_ptr<const CompiledGrammar> grammar, std::int32_t state, std::int64_t tokens_left);
  // Tasks the worker has finished, for tests.
  std::uint64_t prepared() const;

  static constexpr std::size_t kMaxPending = 4096;

 private:
  struct Task {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::int32_t state;
    std::int64_t tokens_left;
  };
  void work();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  std::uint64_t prepared_ = 0;
  std::thread worker_;
};

}  // namespace flexh2o::grammar
