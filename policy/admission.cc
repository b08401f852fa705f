#include "policy/admission.h"

#include <map>
#include <vector>

namespace flexh2o::policy {

void admit_step(std::span<const std::size_t> free, std::size_t gpu_batch, std::int64_t budget,
                const std::function<std::optional<Newcomer>(std::size_t slot)>& next,
                const std::function<void(std::size_t slot, std::span<const std::size_t> forks)>& take) {
  std::vector<bool> taken(free.size(), false);
  std::size_t left = free.size();
  std::map<std::size_t, std::int64_t> prefilled;  // per GPU batch: the rows of its newcomers
  std::map<std::size_t, bool> full;               // per GPU batch: no more this step
  for (std::size_t i = 0; i < free.size(); ++i) {
    if (taken[i]) continue;  // a fork of a newcomer before it
    const std::optional<Newcomer> n = next(free[i]);
    if (!n) return;
    const std::size_t k = free[i] / gpu_batch;
    full[k] = full[k] || (prefilled[k] > 0 && prefilled[k] + n->computed > budget);
    if (full[k]) continue;
    if (static_cast<std::size_t>(n->run) > left) return;
    taken[i] = true;
    std::vector<std::size_t> forks;  // the first other free slots, before this one too (a full batch's)
    for (std::size_t j = 0; forks.size() + 1 < static_cast<std::size_t>(n->run); ++j) {
      if (taken[j]) continue;
      taken[j] = true;
      forks.push_back(free[j]);
    }
    left -= forks.size() + 1;
    prefilled[k] += n->computed;
    take(free[i], forks);
  }
}

}  // namespace flexh2o::policy
