// --compress-weight / --compress-cache / --compress-bits / --cache-dtype, shared by run and
// plan (FlexGen's flags; the format is kernels/quantize.h).
#pragma once
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "policy/cost_model.h"
#include "policy/policy.h"

namespace flexh2o::cli {

struct CompressionFlags {
  bool weight = false, cache = false;
  std::optional<int> bits;
  std::string cache_dtype;  // f32, f16 or bf16; empty: the model's float dtype

  void add_to(CLI::App* app, const std::string& group) {
    app->add_flag("--compress-weight", weight, "store weight matrices as 4-bit groups (FlexGen's --compress-weight)")
        ->group(group);
    app->add_flag("--compress-cache", cache, "store the KV cache as 4-bit groups (FlexGen's --compress-cache)")->group(group);
    app->add_option("--compress-bits", bits, "bits per value when compressing: 4 (default) or 8")
        ->check(CLI::IsMember({4, 8}))
        ->group(group);
    app->add_option("--cache-dtype", cache_dtype, "float dtype of an uncompressed KV cache: f32, f16 or bf16 (default: the model's, e.g. f16)")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}))
        ->group(group);
  }
  // The flags switch compression on (a policy file may already have); --compress-bits overrides.
  void apply(policy::Policy& p) const {
    p.compress_weight = p.compress_weight || weight;
    p.compress_cache = p.compress_cache || cache;
    if (bits) p.compress_bits = *bits;
    if (!cache_dtype.empty()) p.cache_storage = kernels::parse_dtype(cache_dtype);
  }
  void apply(policy::PlanOptions& o) const {
    o.compress_weight = weight;
    o.compress_cache = cache;
    o.compress_bits = bits.value_or(4);
    if (!cache_dtype.empty()) o.cache_storage = kernels::parse_dtype(cache_dtype);
  }
};

}  // namespace flexh2o::cli
