#include "engine/grammar/mask_prefetcher.h"

namespace flexh2o::grammar {

MaskPrefetcher::~MaskPrefetcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    tasks_.clear();
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void MaskPrefetcher::prepare(std::shared_ptr<const CompiledGrammar> grammar, std::int32_t state,
                             std::int64_t tokens_left) {
  {
    std::lock_guard lock(mutex_);
    if (tasks_.size() >= kMaxPending) return;
    tasks_.push_back({std::move(grammar), state, tokens_left});
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
  }
  wake_.notify_one();
}

std::uint64_t MaskPrefetcher::prepared() const {
  std::lock_guard lock(mutex_);
  return prepared_;
}

void MaskPrefetcher::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (stopping_) return;
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task.grammar->prepare_mask(task.state, task.tokens_left);
    lock.lock();
    ++prepared_;
  }
}

}  // namespace flexh2o::grammar
