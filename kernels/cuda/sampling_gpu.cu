// Sampling: the logits are copied to the host and CpuBackend::sample picks the tokens, so the
// draws are the CPU backend's bit for bit (counter-based streams, same ordering and sums). A
// step's logits cross once, into a pinned buffer kept from step to step (logits_on_host),
// however many calls sample them. An allowed-token mask (SampleArgs::allowed) is a host
// array: the CPU sampler applies it there.
#include "kernels/cuda/cuda_backend.h"

namespace flexh2o::kernels::cuda {

const float* CudaBackend::logits_on_host(const float* logits, std::int64_t rows, std::int64_t vocab) {
  graph_interrupt();  // the logits come to the host
  const std::size_t bytes = static_cast<std::size_t>(rows * vocab) * sizeof(float);
  if (bytes == 0) return host_logits_;
  if (host_logits_capacity_ < bytes) {
    if (host_logits_) FLEXH2O_CUDA_CHECK(cudaFreeHost(host_logits_));
    host_logits_ = nullptr;
    host_logits_capacity_ = 0;
    FLEXH2O_CUDA_CHECK(cudaMallocHost(&host_logits_, bytes));
    host_logits_capacity_ = bytes;
  }
  // On the compute stream, after the ops that produced the logits.
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(host_logits_, logits, bytes, cudaMemcpyDeviceToHost, stream_));
  FLEXH2O_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host_logits_;
}

void CudaBackend::do_sample(const SampleArgs& a) {
  if (a.batch <= 0) return;
  SampleArgs host = a;
  if (!a.logits_on_host) host.logits = logits_on_host(a.logits, a.batch, a.vocab);
  host.logits_on_host = true;
  cpu_.sample(host);
}

}  // namespace flexh2o::kernels::cuda
