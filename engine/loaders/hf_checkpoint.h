// Hugging Face checkpoint directories: config.json (through its family's converter,
// engine/families/), generation_config.json's stop ids, and model.safetensors or shards
// listed in model.safetensors.index.json, whose tensor names the family maps to the
// canonical names of engine/model/weights.h (fused projections as row ranges).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/loaders/safetensors.h"
#include "engine/model/weights.h"

namespace flexh2o::engine {

struct Family;

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
    bool part;                // of a fused tensor, from row_offset on
    std::int64_t row_offset;
  };
  std::optional<Located> locate(const std::string& canonical) const;

  std::string dir_;
  ModelConfig config_;
  const Family* family_ = nullptr;
  std::map<std::string, WeightSpec> specs_;  // the canonical tensors the config needs
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Located> by_hf_name_;
};

}  // namespace flexh2o::engine
