// The new tokens a request may generate when neither it nor the job says (the default of
// `flexh2o run --gen-len` for a model other than the embedded one): one definition for the
// CLI, the job's requests, the runtime's generation requests and the planner's workloads.
#pragma once
#include <cstdint>

namespace flexh2o::policy {

inline constexpr std::int64_t kDefaultGenLen = 32;

}  // namespace flexh2o::policy
