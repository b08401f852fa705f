#include "engine/loaders/llama2c_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "engine/loaders/read_rows.h"

namespace flexh2o::engine {

Llama2cCheckpoint::Llama2cCheckpoint(const std::string& path) : name_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw std::runtime_error(path + ": cannot stat: " + std::strerror(errno));
  }
  try {
    parse(static_cast<std::uint64_t>(st.st_size));
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

Llama2cCheckpoint::Llama2cCheckpoint(std::span<const std::byte> bytes, std::string name)
    : name_(std::move(name)), bytes_(bytes) {
  parse(bytes.size());
}

Llama2cCheckpoint::~Llama2cCheckpoint() {
  if (fd_ >= 0) ::close(fd_);
}

void Llama2cCheckpoint::read_bytes(std::uint64_t offset, void* dst, std::uint64_t n) const {
  if (fd_ < 0) {
    std::memcpy(dst, bytes_.data() + offset, n);  // bounds checked in parse()
    return;
  }
  read_fully(fd_, name_, offset, dst, n);
}

void Llama2cCheckpoint::parse(std::uint64_t file_size) {
  constexpr std::uint64_t kHeader = 7 * 4;
  if (file_size < kHeader)
    throw std::runtime_error(name_ + ": truncated: " + std::to_string(file_size) +
                             " bytes, a llama2.c checkpoint starts with a 28-byte header");
  std::int32_t h[7];
  read_bytes(0, h, kHeader);
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  // Bounds keep every size product below 2^63 and reject files that are not checkpoints.
  const std::int64_t limits[7] = {1 << 17, 1 << 19, 1 << 12, 1 << 12, 1 << 12, 1 << 22, 1 << 22};
  for (int i = 0; i < 7; ++i) {
    const std::int64_t v = i == 5 ? std::abs(static_cast<std::int64_t>(h[i])) : h[i];
    if (v <= 0 || v > limits[i])
      throw std::runtime_error(name_ + ": header field " + names[i] + " = " + std::to_string(h[i]) +
                               " is out of range; is this a llama2.c checkpoint?");
  }
  ModelConfig& c = config_;
  c.name = "llama2c";
  c.family = "llama";
  c.hidden = h[0];
  c.ffn = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab_size = std::abs(h[5]);
  c.tie_embeddings = h[5] > 0;
  c.max_positions = h[6];
  if (c.hidden % c.n_heads != 0) throw std::runtime_error(name_ + ": dim is not a multiple of n_heads");
  c.head_dim = c.hidden / c.n_heads;
  c.norm_eps = 1e-5f;
  c.rope.theta = 10000.0;
  c.rope.layout = kernels::RopeLayout::Interleaved;
  c.dtype = kernels::DType::F32;
  c.bos_id = 1;
  c.stop_ids = {1};  // llama2.c: BOS delimits sequences
  c.validate(name_);

  const std::int64_t L = c.n_layers, dim = c.hidden, hd = c.ffn, kv = c.n_kv_heads * c.head_dim;
  std::uint64_t off = kHeader;
  auto add = [&](const std::string& base, std::int64_t rows, std::int64_t cols, bool stacked) {
    const std::uint64_t bytes = static_cast<std::uint64_t>(rows * cols) * 4;
    const std::int64_t copies = stacked ? L : 1;
    for (std::int64_t i = 0; i < copies; ++i) {
      const std::string name = stacked ? "layers." + std::to_string(i) + "." + base : base;
      entries_[name] = {off + static_cast<std::uint64_t>(i) * bytes,
                        cols == 1 ? std::vector<std::int64_t>{rows} : std::vector<std::int64_t>{rows, cols}};
    }
    off += bytes * static_cast<std::uint64_t>(copies);
  };
  add("tok_embed", c.vocab_size, dim, false);
  add("attn_norm.weight", dim, 1, true);
  add("wq", dim, dim, true);
  add("wk", kv, dim, true);
  add("wv", kv, dim, true);
  add("wo", dim, dim, true);
  add("mlp_norm.weight", dim, 1, true);
  add("w_gate", hd, dim, true);  // llama2.c w1
  add("w_down", dim, hd, true);  // w2
  add("w_up", hd, dim, true);    // w3
  add("final_norm.weight", dim, 1, false);
  off += static_cast<std::uint64_t>(c.max_positions * c.head_dim) * 4;  // legacy freq_cis tables
  if (!c.tie_embeddings) add("lm_head", c.vocab_size, dim, false);
  if (off > file_size)
    throw std::runtime_error(name_ + ": truncated: the header describes " + std::to_string(off) + " bytes, the file has " +
                             std::to_string(file_size));
}

std::optional<std::vector<std::int64_t>> Llama2cCheckpoint::shape(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  return it->second.shape;
}

std::string Llama2cCheckpoint::origin(const std::string& name) const { return "'" + name + "' in " + name_; }

void Llama2cCheckpoint::read_rows(const std::string& name, std::int64_t row_begin, std::int64_t row_end, void* dst,
                                  kernels::DType to) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw std::runtime_error("missing tensor " + origin(name));
  const Entry& e = it->second;
  const std::int64_t cols = e.shape.size() == 2 ? e.shape[1] : 1;
  read_converted_rows(
      [&](std::uint64_t offset, void* buf, std::uint64_t n) { read_bytes(e.offset + offset, buf, n); },
      kernels::DType::F32, e.shape[0], cols, row_begin, row_end, dst, to, origin(name));
}

}  // namespace flexh2o::engine
