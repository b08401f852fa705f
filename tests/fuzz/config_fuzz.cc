// libFuzzer target: the input is a config file, read as each kind the engine takes: a model
// YAML (--model x.yaml), a Hugging Face config.json, a hardware profile (--hardware) and a
// policy (--policy). Each reader may reject it with std::runtime_error or
// std::invalid_argument (yaml-cpp's exceptions are runtime_errors); any other exception, crash
// or sanitizer report is a bug, and so is an accepted model config outside ModelLimits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "engine/families/family.h"
#include "engine/families/model_yaml.h"
#include "engine/model/model_config.h"
#include "policy/hardware_profile.h"
#include "policy/policy.h"

namespace {

template <class F>
void rejected_cleanly_or_accepted(F&& read) {
  try {
    read();
  } catch (const std::runtime_error&) {
  } catch (const std::invalid_argument&) {
  }
}

void check_limits(const flexh2o::engine::ModelConfig& c) {
  using L = flexh2o::engine::ModelLimits;
  if (c.n_layers > L::kLayers || c.hidden > L::kHidden || c.ffn > L::kFfn || c.vocab_size > L::kVocab ||
      c.moe.experts > L::kExperts || c.weight_bytes() > L::kWeightBytes)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  rejected_cleanly_or_accepted([&] { check_limits(flexh2o::engine::load_model_yaml(text, "fuzz.yaml")); });
  rejected_cleanly_or_accepted([&] { check_limits(flexh2o::engine::load_hf_config(text, "config.json")); });
  rejected_cleanly_or_accepted([&] { flexh2o::policy::load_hardware_yaml(text, "hw.yaml"); });
  rejected_cleanly_or_accepted([&] { flexh2o::policy::load_policy_yaml(text, "policy.yaml"); });
  return 0;
}
