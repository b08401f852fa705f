// Sampling: the logits are copied to the host and CpuBackend::sample picks the tokens.
// A step samples batch x vocab values once, so the copy is small next to the step, and the
// draws are the CPU backend's bit for bit (counter-based streams, same ordering and sums). An
// allowed-token mask (SampleArgs::allowed) is a host array: the CPU sampler applies it there.
#include <stdexcept>
#include <vector>

#include "kernels/cuda/cuda_backend.h"

namespace flexh2o::kernels::cuda {

void CudaBackend::do_sample(const SampleArgs& a) {
  graph_interrupt();  // the logits come to the host
  if (a.batch <= 0) return;
  std::vector<float> logits(static_cast<std::size_t>(a.batch * a.vocab));
  // On the compute stream, after the ops that produced the logits.
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(logits.data(), a.logits, logits.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                     stream_));
  FLEXH2O_CUDA_CHECK(cudaStreamSynchronize(stream_));
  SampleArgs host = a;
  host.logits = logits.data();
  cpu_.sample(host);
}

}  // namespace flexh2o::kernels::cuda
