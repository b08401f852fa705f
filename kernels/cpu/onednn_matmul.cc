#include "kernels/cpu/onednn_matmul.h"

#include <omp.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace flexh2o::kernels {

namespace {

using dnnl::memory;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

memory::data_type onednn_type(DType t) {
  switch (t) {
    case DType::F32: return memory::data_type::f32;
    case DType::BF16: return memory::data_type::bf16;
    default: throw std::logic_error("onednn_matmul: inputs must be f32 or bf16");
  }
}

// Every implementation a primitive of this process took (rarely added: primitives are cached).
struct Impls {
  std::mutex mu;
  std::set<std::string> names;
};
Impls& impls() {
  static Impls i;
  return i;
}

using Key = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, DType, bool, bool>;

// The primitive of one shape, with its memory descriptors.
struct Prepared {
  dnnl::matmul matmul;
  memory::desc x, w, bias, y;
};

Prepared prepare(const PanelShape& s) {
  const memory::data_type in = onednn_type(s.inputs);
  // w is [n, k] row-major: the [k, n] matrix oneDNN multiplies by, stored transposed (ba).
  Prepared p{{}, memory::desc({s.m, s.k}, in, memory::format_tag::ab), memory::desc({s.k, s.n}, in, memory::format_tag::ba),
             memory::desc({1, s.n}, memory::data_type::f32, memory::format_tag::ab),
             memory::desc({s.m, s.n}, memory::data_type::f32, memory::dims{s.ldy, 1})};
  dnnl::primitive_attr attr;
  if (s.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::matmul::desc desc = s.bias ? dnnl::matmul::desc(p.x, p.w, p.bias, p.y) : dnnl::matmul::desc(p.x, p.w, p.y);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  {
    Impls& i = impls();
    const std::lock_guard lock(i.mu);
    i.names.insert(pd.impl_info_str());
  }
  p.matmul = dnnl::matmul(pd);
  return p;
}

// Per worker thread: oneDNN's OpenMP parallel regions started from this thread use one
// thread (oneTBB already runs one panel per core), and its primitives by shape.
struct ThreadState {
  ThreadState() { omp_set_num_threads(1); }
  dnnl::stream stream{cpu_engine()};
  std::map<Key, Prepared> primitives;
};

}  // namespace

void onednn_matmul(const PanelShape& s, const void* x, const void* w, const float* bias, float* y) {
  thread_local ThreadState state;
  const Key key{s.m, s.n, s.k, s.ldy, s.inputs, s.bias, s.accumulate};
  auto it = state.primitives.find(key);
  if (it == state.primitives.end()) {
    // Prefill shapes vary with the prompts: keep the cache bounded.
    if (state.primitives.size() >= 256) state.primitives.clear();
    it = state.primitives.emplace(key, prepare(s)).first;
  }
  const Prepared& p = it->second;
  const dnnl::engine& e = cpu_engine();
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, memory(p.x, e, const_cast<void*>(x))},
      {DNNL_ARG_WEIGHTS, memory(p.w, e, const_cast<void*>(w))},
      {DNNL_ARG_DST, memory(p.y, e, y)},
  };
  if (s.bias) args.emplace(DNNL_ARG_BIAS, memory(p.bias, e, const_cast<float*>(bias)));
  p.matmul.execute(state.stream, args);
  state.stream.wait();
}

bool onednn_native_bf16() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

std::string onednn_isa_name() {
  using dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case cpu_isa::sse41: return "sse41";
    case cpu_isa::avx: return "avx";
    case cpu_isa::avx2: return "avx2";
    case cpu_isa::avx2_vnni: return "avx2_vnni";
    case cpu_isa::avx512_core: return "avx512_core";
    case cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "isa " + std::to_string(static_cast<unsigned>(dnnl::get_effective_cpu_isa()));
  }
}

std::vector<std::string> onednn_impls_used() {
  Impls& i = impls();
  const std::lock_guard lock(i.mu);
  return {i.names.begin(), i.names.end()};
}

}  // namespace flexh2o::kernels
