// llama2.c checkpoints: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size (negative: unshared classifier), seq_len), then fp32 tensors in a fixed order,
// each stacked over layers. q/k rows are in interleaved-pair RoPE order.
#pragma once
#include <cstddef>
#include <map>
#include <span>
#include <string>

#include "engine/model/weights.h"

namespace flexh2o::engine {

class Llama2cCheckpoint final : public WeightSource {
 public:
  // From a file (read tensor by tensor with pread) ...
  explicit Llama2cCheckpoint(const std::string& path);
  // ... or from bytes in memory (the embedded model); `name` is used in messages.
  Llama2cCheckpoint(std::span<const std::byte> bytes, std::string name);
  ~Llama2cCheckpoint() override;
  Llama2cCheckpoint(const Llama2cCheckpoint&) = delete;
  Llama2cCheckpoint& operator=(const Llama2cCheckpoint&) = delete;

  const ModelConfig& config() const { return config_; }

  std::optional<std::vector<std::int64_t>> shape(const std::string& name) const override;
  std::string origin(const std::string& name) const override;
  void read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                 kernels::DType to) const override;

 private:
  struct Entry {
    std::uint64_t offset;  // byte offset in the file
    std::vector<std::int64_t> shape;
  };
  void parse(std::uint64_t file_size);
  void read_bytes(std::uint64_t offset, void* dst, std::uint64_t n) const;

  std::string name_;
  int fd_ = -1;
  std::span<const std::byte> bytes_;
  ModelConfig config_;
  std::map<std::string, Entry> entries_;
};

}  // namespace flexh2o::engine
