// `flexh2o run` over several ranks started by mpirun or srun (built with FLEXH2O_MPI):
// data parallel by default, pipeline parallel with --pipeline N. Rank 0 reads the prompts and
// writes the output; a rank that fails prints its one-line error and ends the job (MPI_Abort).
#pragma once
#include <functional>

#include "engine/cli/run_command.h"

namespace flexh2o::cli {

// Starts MPI; with one rank (and no --pipeline) runs `one_process` as a plain run would.
int run_distributed(const RunOptions& o, const std::function<int()>& one_process);

}  // namespace flexh2o::cli
