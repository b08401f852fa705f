// The small ops between a decoder layer's GEMMs (issue 43), each fused form beside the unfused
// sequence it replaces in engine/model/layers.cc, at one model's shape and several row counts
// (decode batches, a prefill of 12 x 512): microseconds per call (median of the reps; a rep
// queues `calls` calls back to back and then waits, so launch overheads count as in a step),
// and the fused op's bytes per second. bf16 compute throughout, as a GPU run takes it:
//   norm          norm(h) in fp32                vs  norm(h) rounded to bf16 (NormArgs::y_bf16)
//   act           activation / glu in fp32       vs  bias_act to bf16 (2 cols row stride)
//   sandwich      norm(out) + add into h         vs  norm accumulating into h
//   gemm q        q projection from fp32 x       vs  from bf16 x (GemmArgs::x_bf16): the GEMM's
//                 rounding pass, which each of q, k, v, the MLP's inputs and down saves
//   gemm down     down projection likewise, x at bias_act's 2 cols stride
// Usage: bench_small_ops [reps (7)] [rows (16,256,6144)] [--backend cpu|cuda] [--model opt|llama]
//        [--calls 20]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

using namespace flexh2o;
using kernels::DType;

namespace {

struct Shape {  // the decoder layer's
  std::int64_t hidden, ffn;
  bool layer_norm, gated;
  kernels::Activation act;
};

struct Options {
  int reps = 7, calls = 20;
  std::string rows = "16,256,6144", backend = "cpu", model = "opt";
};

kernels::DeviceBuffer random_buffer(kernels::Backend& be, std::int64_t n, std::minstd_rand& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> host(static_cast<std::size_t>(n));
  for (float& v : host) v = dist(rng);
  kernels::DeviceBuffer buf(be, host.size() * sizeof(float));
  be.copy_to_device(buf.data(), host.data(), buf.bytes());
  return buf;
}

kernels::DeviceBuffer random_bf16(kernels::Backend& be, std::int64_t n, std::minstd_rand& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<std::uint16_t> host(static_cast<std::size_t>(n));
  for (auto& v : host) v = kernels::f32_to_bf16(dist(rng));
  kernels::DeviceBuffer buf(be, host.size() * sizeof(std::uint16_t));
  be.copy_to_device(buf.data(), host.data(), buf.bytes());
  return buf;
}

// Median seconds per call of each variant, `calls` queued per timed round.
std::vector<double> per_call(kernels::Backend& be, const Options& o, const std::vector<std::function<void()>>& ops) {
  std::vector<std::function<void()>> rounds;
  for (const auto& op : ops)
    rounds.push_back([&be, &o, op] {
      for (int c = 0; c < o.calls; ++c) op();
      be.synchronize();
    });
  std::vector<double> s = bench::interleaved_medians(rounds, o.reps);
  for (double& t : s) t /= o.calls;
  return s;
}

void bench_rows(kernels::Backend& be, const Options& o, const Shape& m, std::int64_t rows, std::minstd_rand& rng) {
  const std::int64_t H = m.hidden, F = m.ffn;
  auto h = random_buffer(be, rows * H, rng), normed = random_buffer(be, rows * H, rng);
  auto weight = random_buffer(be, H, rng), bias = random_buffer(be, std::max(H, F), rng);
  auto gate = random_buffer(be, rows * F, rng), up = random_buffer(be, rows * F, rng), out = random_buffer(be, rows * F, rng);
  auto wq = random_bf16(be, H * H, rng), wdown = random_bf16(be, H * F, rng);
  kernels::DeviceBuffer y(be, static_cast<std::size_t>(rows * H * 4));
  const kernels::NormArgs base{.x = h.as<float>(), .rows = rows, .cols = H, .weight = weight.as<float>(),
                               .bias = m.layer_norm ? bias.as<float>() : nullptr};
  auto norm = [&](kernels::NormArgs a) { m.layer_norm ? be.layer_norm(a) : be.rms_norm(a); };
  kernels::NormArgs f32 = base, to_bf16 = base, sum = base;
  f32.y = normed.as<float>();
  to_bf16.y_bf16 = normed.as<std::uint16_t>();
  sum.x = normed.as<float>();
  sum.y = h.as<float>();
  sum.accumulate = true;
  kernels::BiasActArgs act{.act = m.act, .x = gate.as<float>(), .bias = m.gated ? nullptr : bias.as<float>(),
                           .up = m.gated ? up.as<float>() : nullptr, .rows = rows, .cols = F,
                           .out_bf16 = out.as<std::uint16_t>(), .out_stride = 2 * F};
  auto act_f32 = [&] {
    if (m.gated)
      be.glu(m.act, gate.as<float>(), up.as<float>(), out.as<float>(), rows * F);
    else
      be.activation(m.act, gate.as<float>(), rows * F);
  };
  const kernels::GemmArgs q{.m = rows, .w = {wq.data(), DType::BF16, H, H}, .y = y.as<float>(), .compute = DType::BF16};
  kernels::GemmArgs q_f32 = q, q_bf16 = q, down_f32 = q, down_bf16 = q;
  q_f32.x = h.as<float>();
  q_bf16.x_bf16 = normed.as<std::uint16_t>();
  down_f32.w = down_bf16.w = {wdown.data(), DType::BF16, H, F};
  down_f32.x = gate.as<float>();
  down_bf16.x_bf16 = out.as<std::uint16_t>();
  down_bf16.x_stride = 2 * F;

  const std::vector<double> s = per_call(
      be, o,
      {[&] { norm(f32); }, [&] { norm(to_bf16); }, act_f32, [&] { be.bias_act(act); },
       [&] { norm({.x = normed.as<float>(), .y = normed.as<float>(), .rows = rows, .cols = H, .weight = weight.as<float>()});
             be.add(h.as<float>(), normed.as<float>(), rows * H); },
       [&] { norm(sum); }, [&] { be.gemm(q_f32); }, [&] { be.gemm(q_bf16); }, [&] { be.gemm(down_f32); },
       [&] { be.gemm(down_bf16); }});
  // Bytes the fused forms move to and from memory (a row's later passes hit the caches): the
  // norm reads h and writes bf16; bias_act reads x (and up) and writes bf16; the accumulating
  // norm reads out and h and writes h.
  const double r = static_cast<double>(rows);
  const double norm_bytes = r * H * (4 + 2), act_bytes = r * F * (4 + (m.gated ? 4 : 0) + 2), sum_bytes = r * H * 12;
  const auto line = [&](const char* op, double unfused, double fused, double bytes) {
    fmt::print("| {} | {} | {:.2f} | {:.2f} | {:.2f} | {} |\n", rows, op, unfused * 1e6, fused * 1e6, (unfused - fused) * 1e6,
               bytes > 0 ? fmt::format("{:.0f}", bytes / fused / 1e9) : std::string("-"));
  };
  line("norm", s[0], s[1], norm_bytes);
  line("act", s[2], s[3], act_bytes);
  line("sandwich", s[4], s[5], sum_bytes);
  line("gemm q", s[6], s[7], 0);
  line("gemm down", s[8], s[9], 0);
  const int rounding_passes = 3 + (m.gated ? 2 : 1) + 1;  // q, k, v, MLP inputs, down
  fmt::print("| {} | per layer | | | {:.2f} | |\n", rows,
             1e6 * (2 * (s[0] - s[1]) + (s[2] - s[3]) + (rounding_passes - 1) * (s[6] - s[7]) + (s[8] - s[9])));
}

std::vector<std::int64_t> parse_rows(const std::string& list) {
  std::vector<std::int64_t> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"the small ops between a layer's GEMMs, fused and unfused: microseconds per call"};
  app.add_option("reps", o.reps, "measured rounds; medians are reported")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("rows", o.rows, "activation rows, comma-separated")->capture_default_str();
  app.add_option("--backend", o.backend, "cpu or cuda")->capture_default_str();
  app.add_option("--model", o.model, "opt (OPT-1.3B: LayerNorm, ReLU with bias) or llama (Llama-2-7B: RMSNorm, SwiGLU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"opt", "llama"}));
  app.add_option("--calls", o.calls, "calls queued per timed round")->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const Shape shape = o.model == "opt" ? Shape{2048, 8192, true, false, kernels::Activation::Relu}
                                       : Shape{4096, 11008, false, true, kernels::Activation::Silu};
  try {
    const std::vector<std::int64_t> rows = parse_rows(o.rows);
    auto be = kernels::make_backend(o.backend);
    fmt::print("small ops on {}, {} shape (hidden {}, ffn {}), bf16 compute, {} calls a round, median of {}\n",
               be->name(), o.model, shape.hidden, shape.ffn, o.calls, o.reps);
    fmt::print("| rows | op | unfused us | fused us | saved us | fused GB/s |\n|---|---|---|---|---|---|\n");
    std::minstd_rand rng(7);
    for (std::int64_t r : rows) bench_rows(*be, o, shape, r, rng);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_small_ops: {}\n", e.what());
    return 1;
  }
}
