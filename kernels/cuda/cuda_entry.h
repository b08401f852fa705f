// The CUDA backend's entry points for code that must not see CUDA headers
// (kernels/backend_select.cc). Only declared and defined when FLEXH2O_HAVE_CUDA.
#pragma once
#include <memory>
#include <string>

#include "kernels/backend.h"

namespace flexh2o::kernels::cuda {

// Empty when device 0 can run this build's kernels; otherwise why not (no driver, no
// device, a GPU this binary has no code for, ...). Probed once per process.
std::string probe_device();

// The CUDA backend on device 0 (of CUDA_VISIBLE_DEVICES); throws when probe_device() is
// not empty.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace flexh2o::kernels::cuda
