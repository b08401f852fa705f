// CudaBackend's graph steps (docs/backends.md, "CUDA graphs"). A key's first step runs eagerly
// and measures the op scratch and uploads its ops take (Record); its second is captured on the
// compute stream, each op's scratch at a fixed place in one arena (reused op after op: the ops
// run in order) and each host array uploaded from a fixed place of a pinned arena, copied to the
// device in one piece before the launch (Capture); later steps check each op against the
// captured one, keep its host arrays, and at the end write them to their places and launch the
// graph (Replay). A replayed op that differs runs the step eagerly (and records: the next
// step captures again); a call that needs the host runs the step's ops so far and ends it.
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_backend.h"

namespace flexh2o::kernels::cuda {

namespace {
constexpr std::size_t kMinArenaAlloc = 256;  // as alloc(): alloc(0) still returns a pointer
}  // namespace

void CudaBackend::graph_step_begin(std::uint64_t key) {
  if (graph_.mode != GraphMode::None) graph_step_cancel();  // a step an exception left open
  graph_.owner = std::this_thread::get_id();
  graph_.key = key;
  GraphMode mode = graph_.keys.begin(key);
  if (mode == GraphMode::Capture && !graph_.needs.count(key)) mode = GraphMode::Record;
  if (mode == GraphMode::Replay && !graph_.graphs.count(key)) mode = GraphMode::Record;
  if (mode == GraphMode::Record) graph_.measuring = {};
  if (mode == GraphMode::Capture) {
    try {
      ensure_arenas(graph_.needs[key]);
    } catch (const CudaOutOfMemory&) {  // the step runs eagerly, as every later one of this key
      graph_.keys.give_up(key);
      return;
    }
    FLEXH2O_CUDA_CHECK(cudaEventSynchronize(graph_.uploads_read));  // the last launch's upload has read the arena
    graph_.capturing = {};
    graph_.upload_used = 0;
    FLEXH2O_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  graph_.mode = mode;
}

void CudaBackend::graph_step_end() {
  if (graph_.owner != std::this_thread::get_id()) return;
  switch (graph_.mode) {
    case GraphMode::None: return;
    case GraphMode::Record:
      graph_.mode = GraphMode::None;
      graph_.needs[graph_.key] = graph_.measuring;
      graph_.keys.recorded(graph_.key);
      ++graph_.counts.recorded;
      return;
    case GraphMode::Capture: return end_capture();
    case GraphMode::Replay: return end_replay();
  }
}

void CudaBackend::graph_step_cancel() noexcept {
  if (graph_.mode == GraphMode::Capture) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  graph_.mode = GraphMode::None;
  graph_.in_op = false;
  graph_.uploading = false;
  graph_.calls.clear();
}

void CudaBackend::graph_call(GraphCall& call) {
  if (graph_.mode == GraphMode::Capture) return capture_op(call);
  replay_op(call);
}

// The op's own work, its scratch (and uploads) counted in arena bytes.
void CudaBackend::record_op(const std::function<void()>& run) {
  graph_.in_op = true;
  graph_.op_scratch = 0;
  try {
    run();
  } catch (...) {
    graph_.in_op = false;
    throw;
  }
  graph_.in_op = false;
  graph_.measuring.scratch = std::max(graph_.measuring.scratch, graph_.op_scratch);
}

void CudaBackend::capture_op(GraphCall& call) {
  graph_.in_op = true;
  graph_.op_scratch = 0;
  try {
    call.run();
  } catch (...) {
    // Not capturable (an arena too small, a launch the capture refused) or a bad argument:
    // eagerly, the step's ops either run or throw as they would have.
    graph_.in_op = false;
    graph_interrupt();
    return;
  }
  graph_.in_op = false;
}

void CudaBackend::replay_op(GraphCall& call) {
  const std::vector<OpSignature>& captured = graph_.graphs.at(graph_.key).ops;
  const std::size_t i = graph_.calls.size() - 1;
  if (i < captured.size() && captured[i] == call.sig) return;  // kept for the launch
  graph_miss();
}

void CudaBackend::graph_miss() {
  std::deque<GraphCall> calls = std::move(graph_.calls);
  graph_.calls.clear();
  graph_.mode = GraphMode::Record;
  graph_.measuring = {};
  graph_.keys.missed(graph_.key);
  ++graph_.counts.missed;
  for (GraphCall& c : calls) record_op(c.run);
}

void CudaBackend::graph_interrupt() {
  if (graph_.mode == GraphMode::None || graph_.in_op || graph_.owner != std::this_thread::get_id()) return;
  if (graph_.mode == GraphMode::Capture) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  graph_.mode = GraphMode::None;
  graph_.keys.give_up(graph_.key);
  ++graph_.counts.interrupted;
  run_calls_eagerly();
}

// With no step open, each op runs as it would have (mode None: graph_op is not reached).
void CudaBackend::run_calls_eagerly() {
  std::deque<GraphCall> calls = std::move(graph_.calls);
  graph_.calls.clear();
  for (GraphCall& c : calls) c.run();
}

void CudaBackend::end_capture() {
  graph_.mode = GraphMode::None;
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(stream_, &g);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess && g != nullptr) e = cudaGraphInstantiate(&exec, g, 0);
  if (g != nullptr) (void)cudaGraphDestroy(g);
  if (e != cudaSuccess || exec == nullptr) {
    (void)cudaGetLastError();
    graph_.keys.give_up(graph_.key);
    ++graph_.counts.interrupted;
    return run_calls_eagerly();
  }
  CapturedStep& step = graph_.graphs[graph_.key];
  if (step.exec != nullptr) (void)cudaGraphExecDestroy(step.exec);
  step = std::move(graph_.capturing);
  step.exec = exec;
  step.upload_bytes = graph_.upload_used;
  for (const GraphCall& c : graph_.calls) step.ops.push_back(c.sig);
  graph_.calls.clear();
  graph_.keys.captured(graph_.key);
  ++graph_.counts.captured;
  launch_graph(step);  // the uploads were staged as the ops were captured
}

void CudaBackend::end_replay() {
  const CapturedStep& step = graph_.graphs.at(graph_.key);
  if (graph_.calls.size() != step.ops.size()) {  // fewer ops than captured
    graph_miss();
    return graph_step_end();  // records
  }
  graph_.mode = GraphMode::None;
  FLEXH2O_CUDA_CHECK(cudaEventSynchronize(graph_.uploads_read));
  for (const GraphUpload& u : step.uploads)
    std::memcpy(static_cast<std::byte*>(graph_.host_uploads) + u.offset, graph_.calls[u.op].host[u.input].data(),
                u.bytes);
  graph_.calls.clear();
  graph_.keys.replayed(graph_.key);
  ++graph_.counts.replayed;
  launch_graph(step);
}

void CudaBackend::launch_graph(const CapturedStep& step) {
  if (step.upload_bytes > 0)
    FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(graph_.uploads, graph_.host_uploads, step.upload_bytes,
                                       cudaMemcpyHostToDevice, stream_));
  FLEXH2O_CUDA_CHECK(cudaEventRecord(graph_.uploads_read, stream_));
  FLEXH2O_CUDA_CHECK(cudaGraphLaunch(step.exec, stream_));
}

// Arenas at least as large as a key's Record step measured. Graphs hold the arenas' addresses:
// growing them drops every graph (their keys capture again).
void CudaBackend::ensure_arenas(const ArenaNeeds& needs) {
  if (graph_.uploads_read == nullptr)
    FLEXH2O_CUDA_CHECK(cudaEventCreateWithFlags(&graph_.uploads_read, cudaEventDisableTiming));
  if (needs.scratch <= graph_.scratch_bytes && needs.uploads <= graph_.upload_capacity) return;
  release_graphs();
  graph_.keys.dropped_graphs();
  FLEXH2O_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no graph or upload still reads them
  if (needs.scratch > graph_.scratch_bytes) {
    free(graph_.scratch);
    graph_.scratch = nullptr;
    graph_.scratch_bytes = 0;
    graph_.scratch = alloc(needs.scratch);
    graph_.scratch_bytes = needs.scratch;
  }
  if (needs.uploads > graph_.upload_capacity) {
    free(graph_.uploads);
    if (graph_.host_uploads != nullptr) FLEXH2O_CUDA_CHECK(cudaFreeHost(graph_.host_uploads));
    graph_.uploads = graph_.host_uploads = nullptr;
    graph_.upload_capacity = 0;
    graph_.uploads = alloc(needs.uploads);
    FLEXH2O_CUDA_CHECK(cudaMallocHost(&graph_.host_uploads, needs.uploads));
    graph_.upload_capacity = needs.uploads;
  }
}

void CudaBackend::release_graphs() noexcept {
  for (auto& [key, step] : graph_.graphs)
    if (step.exec != nullptr) (void)cudaGraphExecDestroy(step.exec);
  graph_.graphs.clear();
}

bool CudaBackend::in_arena(const void* p) const {
  const auto within = [p](const void* base, std::size_t bytes) {
    const auto* b = static_cast<const std::byte*>(base);
    return base != nullptr && static_cast<const std::byte*>(p) >= b && static_cast<const std::byte*>(p) < b + bytes;
  };
  return within(graph_.scratch, graph_.scratch_bytes) || within(graph_.uploads, graph_.upload_capacity);
}

// An allocation by a running op: Record counts it (and allocates as usual); Capture takes it
// from an arena: uploads one after another, scratch from the arena's start for every op.
void* CudaBackend::graph_alloc(std::size_t bytes) {
  bytes = std::max(bytes, kMinArenaAlloc);
  if (graph_.mode == GraphMode::Capture) {
    std::size_t& used = graph_.uploading ? graph_.upload_used : graph_.op_scratch;
    const std::size_t at = bump_offset(used, bytes);
    const std::size_t capacity = graph_.uploading ? graph_.upload_capacity : graph_.scratch_bytes;
    if (used > capacity)
      throw std::runtime_error("a captured op needs more than its Record step measured (" + std::to_string(used) +
                               " > " + std::to_string(capacity) + " bytes)");
    return static_cast<std::byte*>(graph_.uploading ? graph_.uploads : graph_.scratch) + at;
  }
  void* p = pool_alloc(bytes);
  (void)bump_offset(graph_.uploading ? graph_.measuring.uploads : graph_.op_scratch, bytes);
  return p;
}

DeviceBuffer CudaBackend::graph_upload(const void* host, std::size_t bytes) {
  graph_.uploading = true;
  DeviceBuffer buf;
  try {
    buf = DeviceBuffer(*this, bytes);
  } catch (...) {
    graph_.uploading = false;
    throw;
  }
  graph_.uploading = false;
  if (graph_.mode == GraphMode::Capture) {
    // Which host array of the op this is: a replay writes that array of its own call here.
    const std::size_t op = graph_.calls.size() - 1;
    const std::vector<std::vector<std::byte>>& inputs = graph_.calls.back().host;
    std::size_t input = 0;
    while (input < inputs.size() && !(inputs[input].data() == host && inputs[input].size() == bytes)) ++input;
    if (input == inputs.size()) throw std::logic_error("a captured op uploads a host array it was not given");
    const std::size_t offset = static_cast<std::size_t>(buf.as<std::byte>() - static_cast<std::byte*>(graph_.uploads));
    std::memcpy(static_cast<std::byte*>(graph_.host_uploads) + offset, host, bytes);
    graph_.capturing.uploads.push_back({op, input, offset, bytes});
    return buf;  // read from the device arena, which launch_graph fills first
  }
  std::lock_guard lock(stage_mu_);
  const void* staged = stage_for_upload(host, bytes);
  FLEXH2O_CUDA_CHECK(cudaMemcpyAsync(buf.data(), staged, bytes, cudaMemcpyHostToDevice, stream_));
  staged_upload_queued();
  return buf;
}

}  // namespace flexh2o::kernels::cuda
