// --compress-weight / --compress-cache / --compress-bits / --cache-dtype, shared by run and
// plan (FlexGen's flags; the format is kernels/quantize.h).
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "engine/job/job_options.h"

namespace flexh2o::cli {

inline void add_compression_flags(CLI::App* app, job::Compression& c, const std::string& group) {
  app->add_flag("--compress-weight", c.weight, "store weight matrices as 4-bit groups (FlexGen's --compress-weight)")
      ->group(group);
  app->add_flag("--compress-cache", c.cache, "store the KV cache as 4-bit groups (FlexGen's --compress-cache)")->group(group);
  app->add_option("--compress-bits", c.bits, "bits per value when compressing: 4 (default) or 8")
      ->check(CLI::IsMember({4, 8}))
      ->group(group);
  app->add_option("--cache-dtype", c.cache_dtype, "float dtype of an uncompressed KV cache: f32, f16 or bf16 (default: the model's, e.g. f16)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->group(group);
}

}  // namespace flexh2o::cli
