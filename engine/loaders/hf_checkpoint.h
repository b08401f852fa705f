// Hugging Face checkpoint directories: config.json plus model.safetensors, or shards
// listed in model.safetensors.index.json. OPT and LLaMA tensor names are mapped to the
// canonical names of engine/weights.h.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/loaders/safetensors.h"
#include "engine/weights.h"

namespace flexh2o::engine {

class HfCheckpoint final : public WeightSource {
 public:
  // Reads config.json and the safetensors headers (not the data). Throws naming the file.
  explicit HfCheckpoint(const std::string& dir);

  const ModelConfig& config() const { return config_; }

  std::optional<std::vector<std::int64_t>> shape(const std::string& name) const override;
  std::string origin(const std::string& name) const override;
  void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                 kernels::DType to) const override;

 private:
  struct Located {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };
  std::optional<Located> locate(const std::string& canonical) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Located> by_hf_name_;
};

// The Hugging Face name(s) a canonical tensor may have, most common first.
std::vector<std::string> hf_tensor_names(Family family, const std::string& canonical);

}  // namespace flexh2o::engine
