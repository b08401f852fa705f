#include "engine/distributed/launch.h"

#include <cstdlib>
#include <string>

namespace flexh2o::distributed {

namespace {

std::optional<std::int64_t> env_count(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::optional<Launch> mpi_launch() {
  for (const char* size : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const auto n = env_count(size)) return Launch{*n};
  if (std::getenv("PMIX_RANK") != nullptr) return Launch{env_count("SLURM_STEP_NUM_TASKS").value_or(0)};
  return std::nullopt;
}

}  // namespace flexh2o::distributed
