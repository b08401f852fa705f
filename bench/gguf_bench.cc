// A 4-bit GGUF file (default: SmolLM2-135M-Instruct Q4_1, scripts/models/make_smollm2.sh)
// loaded four ways, side by side in one run on the CPU backend: its Q4_1/Q8_0 blocks kept as
// they are (q4g32/q8g32, what --compress-weight does with such a file), dequantized to f16 (the
// default run) and to f32, and dequantized then quantized again to the engine's 64-groups (what
// --compress-weight would cost without keeping the blocks). Per variant: load time (open +
// read every tensor into memory), bytes of the weights and the growth of the process's
// peak resident memory of a process holding them, prefill and decode tok/s of greedy generation.
// Variants run interleaved, `reps` rounds; medians (and the min of the load time). The peak
// resident memory of each is taken in a child process that only loads and generates.
// Usage: bench_gguf [model.gguf] [batch] [prompt_len] [gen_len] [reps]
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "bench/timing.h"
#include "engine/runtime/generator.h"
#include "engine/loaders/gguf_checkpoint.h"
#include "engine/serving/prompts.h"

using namespace flexh2o;

namespace {

struct Variant {
  std::string name;
  kernels::DType dtype;
  bool keep_blocks;
  std::vector<double> load_s{}, prefill_tps{}, decode_tps{};
  std::int64_t weight_bytes = 0, peak_rss = 0;
};

engine::ModelConfig config_of(const engine::GgufCheckpoint& ckpt, const Variant& v) {
  engine::ModelConfig c = ckpt.config();
  c.dtype = v.dtype;
  if (!v.keep_blocks) c.stored_group_formats.clear();
  c.stop_ids.clear();  // every sequence decodes the full length
  return c;
}

// Loads the variant and generates once in a forked child; its peak resident bytes.
std::int64_t peak_rss_of(const std::function<void()>& load_and_generate) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    load_and_generate();
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    const std::int64_t bytes = static_cast<std::int64_t>(u.ru_maxrss) * 1024;
    if (::write(fds[1], &bytes, sizeof bytes) != sizeof bytes) ::_exit(1);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::int64_t bytes = -1;
  if (::read(fds[0], &bytes, sizeof bytes) != sizeof bytes) bytes = -1;
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const char* home = std::getenv("HOME");
  const std::string model = argc > 1 ? argv[1]
                                     : std::string(home ? home : ".") + "/.cache/flexh2o/models/smollm2-135m-instruct.Q4_1.gguf";
  const std::int64_t batch = argc > 2 ? std::atoll(argv[2]) : 8, prompt_len = argc > 3 ? std::atoll(argv[3]) : 64,
                     gen_len = argc > 4 ? std::atoll(argv[4]) : 32;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
  if (!std::filesystem::exists(model)) {
    fmt::print(stderr, "{} not found (scripts/models/make_smollm2.sh makes SmolLM2's)\n", model);
    return 1;
  }
  std::vector<Variant> variants = {{"kept blocks (q4g32 + q8g32)", kernels::DType::Q4, true},
                                   {"dequantized f16", kernels::DType::F16, false},
                                   {"dequantized f32", kernels::DType::F32, false},
                                   {"requantized q4 (groups of 64)", kernels::DType::Q4, false}};
  // Before any thread pool exists: each child starts from the same bare process.
  for (Variant& v : variants)
    v.peak_rss = peak_rss_of([&] {
      engine::GgufCheckpoint ckpt(model);
      const engine::ModelConfig cfg = config_of(ckpt, v);
      auto be = kernels::make_cpu_backend();
      const auto w = engine::load_weights(cfg, ckpt);
      engine::GenerationRequest req;
      req.sequences = engine::sequences_of(engine::synthetic_prompts(batch, prompt_len, cfg.vocab_size));
      req.max_new_tokens = gen_len;
      engine::Generator(*be, cfg, w).generate(req);
    });
  auto be = kernels::make_cpu_backend();
  for (int r = 0; r <= reps; ++r) {  // round 0 warms up page cache and thread pools
    for (Variant& v : variants) {
      engine::HostWeights w;
      std::unique_ptr<engine::GgufCheckpoint> ckpt;
      const double load = bench::seconds_of([&] {
        ckpt = std::make_unique<engine::GgufCheckpoint>(model);
        w = engine::load_weights(config_of(*ckpt, v), *ckpt);
      });
      const engine::ModelConfig cfg = config_of(*ckpt, v);
      engine::Generator gen(*be, cfg, w);
      engine::GenerationRequest req;
      req.sequences = engine::sequences_of(engine::synthetic_prompts(batch, prompt_len, cfg.vocab_size));
      req.max_new_tokens = gen_len;
      const auto res = gen.generate(req);
      if (r == 0) {
        for (const auto& [name, t] : w) v.weight_bytes += t.rows * kernels::row_bytes(t.dtype, t.cols);
        continue;
      }
      v.load_s.push_back(load);
      v.prefill_tps.push_back(res.prefill_throughput());
      v.decode_tps.push_back(res.decode_throughput());
    }
  }
  fmt::print("{}: batch {}, prompt {} tokens, {} new tokens, {} rounds (medians; load also min)\n\n", model, batch,
             prompt_len, gen_len, reps);
  fmt::print("| weights | bytes | peak RSS | load s (min / median) | prefill tok/s | decode tok/s |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  for (Variant& v : variants) {
    fmt::print("| {} | {:.1f} MiB | {:.1f} MiB | {:.3f} / {:.3f} | {:.0f} | {:.1f} |\n", v.name,
               static_cast<double>(v.weight_bytes) / (1 << 20), static_cast<double>(v.peak_rss) / (1 << 20),
               *std::min_element(v.load_s.begin(), v.load_s.end()), bench::median(v.load_s),
               bench::median(v.prefill_tps), bench::median(v.decode_tps));
  }
  return 0;
}
