#include "policy/policy_text.h"

#include <fmt/format.h>

namespace flexh2o::policy {

std::string percent_text(const Policy& p, int decimals) {
  std::string out;
  for (const double v : p.percent()) {
    if (!out.empty()) out += ' ';
    out += decimals < 0 ? fmt::format("{:g}", v) : fmt::format("{:.{}f}", v, decimals);
  }
  return out;
}

std::string to_text(const Policy& p) {
  return fmt::format("gpu batch {} x {} batches, percent [{}]{}, overlap {}, sep_layer {}, cpu_cache_compute {}, kv {}{}",
                     p.gpu_batch_size, p.num_gpu_batches, percent_text(p),
                     p.resident_embeddings ? " (embeddings and head resident)" : "", p.overlap, p.sep_layer,
                     p.cpu_cache_compute, p.kv, p.prefix_pool == "auto" ? "" : ", prefix pool on " + p.prefix_pool);
}

nlohmann::json to_json(const Policy& p, std::int64_t experts, std::int64_t top_k) {
  return {{"gpu_batch_size", p.gpu_batch_size},
          {"num_gpu_batches", p.num_gpu_batches},
          {"percent", p.percent()},
          {"overlap", p.overlap},
          {"sep_layer", p.sep_layer},
          {"pin_weight", p.pin_weight},
          {"resident_embeddings", p.resident_embeddings},
          {"cpu_cache_compute", p.cpu_cache_compute},
          {"kv", p.kv},
          {"compress_weight", p.compress_weight},
          {"compress_cache", p.compress_cache},
          {"compress_bits", p.compress_bits},
          {"expert_loading", p.expert_loading},
          {"expert_slots", p.expert_slot_count(experts, top_k)},
          {"prefix_pool", p.prefix_pool}};
}

}  // namespace flexh2o::policy
