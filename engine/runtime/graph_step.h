// Decode steps as CUDA graphs (docs/backends.md, "CUDA graphs"): which steps the executors
// bracket with Backend::graph_step_begin/end, and the key that tells their shapes apart.
#pragma once
#include <cstdint>
#include <optional>

#include "engine/model/step.h"
#include "kernels/backend.h"

namespace flexh2o::engine {

// The graph key of a step that only decodes (sequences decoding or idle: no prompt rows), from
// its rows and which sequences are idle; nullopt for a step with prompt rows. The executor
// asks only where the whole step runs on the device without the host: every weight, KV cache
// and hidden state on the gpu tier, one GPU batch, no MoE routing, no KV eviction.
std::optional<std::uint64_t> decode_graph_key(const StepBatch& s);

// Opens a graph step for `key` (none: nothing); end() closes it (the backend launches what it
// kept), and leaving the scope without end() (an exception) drops it.
class GraphStepScope {
 public:
  GraphStepScope(kernels::Backend& be, std::optional<std::uint64_t> key) : be_(key ? &be : nullptr) {
    if (be_) be_->graph_step_begin(*key);
  }
  ~GraphStepScope() {
    if (be_) be_->graph_step_cancel();
  }
  GraphStepScope(const GraphStepScope&) = delete;
  GraphStepScope& operator=(const GraphStepScope&) = delete;
  void end() {
    if (be_) be_->graph_step_end();
    be_ = nullptr;
  }

 private:
  kernels::Backend* be_;
};

}  // namespace flexh2o::engine
