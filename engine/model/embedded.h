// Data compiled into the binary, so that `flexh2o` runs from any directory: the model
// configs of configs/models/, the hardware profiles of configs/hardware/ and the bundled stories260K model with its tokenizer.
#pragma once
#include <cstddef>
#include <span>
#include <string_view>

namespace flexh2o::engine {

struct EmbeddedConfig {
  std::string_view name;  // file name without .yaml
  std::string_view yaml;
};
std::span<const EmbeddedConfig> embedded_model_configs();
// configs/hardware/*.yaml: profiles --hardware takes by name (e.g. t4-gcp, ci-cpu).
std::span<const EmbeddedConfig> embedded_hardware_profiles();

// models/stories260K/stories260K.bin and tok512.bin (llama2.c formats).
std::span<const std::byte> embedded_stories260k_model();
std::span<const std::byte> embedded_stories260k_tokenizer();

}  // namespace flexh2o::engine
