// The host-side bookkeeping of CUDA-graph decode steps (docs/backends.md, "CUDA graphs"),
// plain C++ so that it is tested without a GPU: what identifies an op call (OpSignature), what
// the next step of a key does (GraphKeys), and the arenas captured ops take their scratch and
// uploads from (bump_offset).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/rope.h"

namespace flexh2o::kernels::cuda {

enum class GraphOp : std::uint8_t {
  Gemm, LayerNorm, RmsNorm, Rope, Activation, Glu, BiasAct, Softcap, Add, Embedding, AttentionDecode, KvWrite,
  CopyOnDevice
};

// Everything an op's launches depend on except the contents of its host arrays: the op, its
// device pointers, shapes and scalars (floats by their bits), its host arrays' sizes, and what
// the backend derives from their contents (attention_decode's split plan: add it). Two calls
// with equal signatures launch the same kernels with the same arguments once their host arrays
// are uploaded to the same places, so a captured call is replayed for any call equal to it.
class OpSignature {
 public:
  explicit OpSignature(GraphOp op) { words_.push_back(static_cast<std::int64_t>(op)); }
  OpSignature& add(std::int64_t v) {
    words_.push_back(v);
    return *this;
  }
  OpSignature& add(const void* p) { return add(static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p))); }
  OpSignature& add(float f);
  OpSignature& add(bool b) { return add(std::int64_t{b}); }
  OpSignature& add(DType t) { return add(static_cast<std::int64_t>(t)); }
  template <class T>
  OpSignature& add(std::span<const T> host) {
    return add(static_cast<std::int64_t>(host.size_bytes()));
  }
  bool operator==(const OpSignature&) const = default;

 private:
  std::vector<std::int64_t> words_;
};

OpSignature signature(const GemmArgs& a);
OpSignature signature(GraphOp norm, const NormArgs& a);  // LayerNorm or RmsNorm
OpSignature signature(const RopeArgs& a);
OpSignature signature(const BiasActArgs& a);
OpSignature signature(const EmbeddingArgs& a);
OpSignature signature(const AttentionDecodeArgs& a);  // without the split plan
OpSignature signature(const KvWriteArgs& a);
// The ops whose arguments are not a struct of their own.
struct ActivationCall {
  Activation act = Activation::Relu;
  float* x = nullptr;
  std::int64_t n = 0;
};
struct GluCall {
  Activation act = Activation::Relu;
  const float* gate = nullptr;
  const float* up = nullptr;
  float* out = nullptr;
  std::int64_t n = 0;
};
struct SoftcapCall {
  float* x = nullptr;
  std::int64_t n = 0;
  float cap = 0.0f;
};
struct AddCall {
  float* x = nullptr;
  const float* y = nullptr;
  std::int64_t n = 0;
};
struct CopyCall {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};
OpSignature signature(const ActivationCall& a);
OpSignature signature(const GluCall& a);
OpSignature signature(const SoftcapCall& a);
OpSignature signature(const AddCall& a);
OpSignature signature(const CopyCall& a);

// What a graph step runs as.
enum class GraphMode : std::uint8_t {
  None,     // no step open, or the step runs eagerly
  Record,   // eagerly, measuring the scratch and uploads its ops take (the next step captures)
  Capture,  // captured into a graph, launched at the step's end
  Replay,   // the ops are checked against the captured ones and the graph launched at the end
};

// Per key, what its next step does: a key's first step records, its second captures, later
// ones replay. A replay whose ops differ from the captured ones (a decode split plan that
// changed as contexts grew) runs eagerly and records again: the next captures anew. A step
// that cannot be captured (an op that needs the host, a capture that failed) runs eagerly and
// the key records again at its next step; a key is given up on (None from then on) after
// kMaxFailures such steps, or after kMaxMisses graphs in a row that no replay used.
class GraphKeys {
 public:
  static constexpr int kMaxMisses = 3;
  static constexpr int kMaxFailures = 3;
  static constexpr std::size_t kMaxKeys = 16;  // past this, new keys run eagerly

  GraphMode begin(std::uint64_t key);
  void recorded(std::uint64_t key);  // a Record step ended: the next step captures
  void captured(std::uint64_t key);  // a Capture step ended with a graph: the next replays
  void replayed(std::uint64_t key);  // a Replay step launched the graph
  void missed(std::uint64_t key);    // a replay differed: the step ran eagerly, recording
  void give_up(std::uint64_t key);   // the step could not be captured
  void dropped_graphs();             // the graphs are gone: keys that replayed capture again
  GraphMode next(std::uint64_t key) const;

 private:
  struct State {
    GraphMode next = GraphMode::Record;
    bool replayed = false;  // the current graph replayed at least once
    int misses = 0;         // graphs in a row that no replay used
    int failures = 0;       // steps that could not be captured
  };
  std::map<std::uint64_t, State> keys_;
};

// Arena sub-allocations keep the alignment the memory pool gives (and the vector-load and
// cuBLASLt alignment choices that follow from it): `used` bytes taken, where the next `bytes`
// start; `used` moves past them.
constexpr std::size_t kArenaAlignment = 256;
std::size_t bump_offset(std::size_t& used, std::size_t bytes);

}  // namespace flexh2o::kernels::cuda
