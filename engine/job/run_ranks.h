// A job over several ranks started by mpirun or srun (built with FLEXH2O_MPI): data parallel
// by default, pipeline parallel with `pipeline` N. Rank 0 reads the prompts and writes the
// output; a rank that fails says its one-line error and ends the job (MPI_Abort).
#pragma once
#include <functional>

#include "engine/job/job.h"

namespace flexh2o::job {

// Starts MPI; with one rank (and no pipeline) runs `one_process` as a plain run would.
JobEnd run_ranks(const JobOptions& o, const FrontEnd& front, const std::function<JobEnd()>& one_process);

}  // namespace flexh2o::job
