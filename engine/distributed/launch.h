// Whether this process was started by an MPI launcher (mpirun, srun), read from the
// environment the launcher sets before the program runs, so that a plain start never
// initializes MPI and behaves exactly as a build without it.
#pragma once
#include <cstdint>
#include <optional>

namespace flexh2o::distributed {

struct Launch {
  // Ranks the launcher started; 0 when it does not say before MPI starts (srun --mpi=pmix
  // without a task count in the environment).
  std::int64_t ranks = 0;
};

// nullopt: not under an MPI launcher. Reads OMPI_COMM_WORLD_SIZE (Open MPI's mpirun),
// PMI_SIZE (srun --mpi=pmi2, MPICH), PMIX_RANK with SLURM_STEP_NUM_TASKS (srun --mpi=pmix).
std::optional<Launch> mpi_launch();

}  // namespace flexh2o::distributed
