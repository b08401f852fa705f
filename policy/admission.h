// Continuous batching's admission at one step: which waiting requests the free slots take. The
// engine's StepScheduler runs it on a job's tokens (engine/serving/step_scheduler.h) and the
// planner on its lengths (workload.h), so the two cannot drift: only what each says of the next
// request (its rows, whether it waits) is its own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

namespace flexh2o::policy {

// The next waiting request, as a free slot would take it.
struct Newcomer {
  std::int64_t computed = 0;  // prompt rows its prefill computes (its prompt less a prefix it takes)
  std::int64_t run = 1;       // slots it takes: itself and the requests sharing its prefill (forks)
};

// Free slots, in slot order, take the waiting requests in order, first come first served.
// `next(slot)` describes the next one for free slot `slot` (it may differ by slot: a prefix
// its own row holds), or nullopt where it waits for a later step, and with it the queue
// behind it. A GPU batch (slots [k, k + 1) x gpu_batch) takes newcomers while their computed
// rows fit `budget` (its first joins whatever its length; after one that does not fit it takes
// no more this step, and the request tries the next batch); a request whose run needs more
// slots than are free waits. `take(slot, forks)` admits it into `slot` and its forks into the
// first other free slots, wherever they are.
void admit_step(std::span<const std::size_t> free, std::size_t gpu_batch, std::int64_t budget,
                const std::function<std::optional<Newcomer>(std::size_t slot)>& next,
                const std::function<void(std::size_t slot, std::span<const std::size_t> forks)>& take);

}  // namespace flexh2o::policy
