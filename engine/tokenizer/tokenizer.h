// Text <-> token ids. Two families: llama2.c's score-merge BPE with byte fallback
// (tok*.bin) and byte-level BPE (GPT-2/OPT: vocab.json + merges.txt or HF tokenizer.json).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flexh2o::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`. With add_bos the model's BOS id comes first (when it has one).
  virtual std::vector<std::int32_t> encode(std::string_view text, bool add_bos) const = 0;
  // The bytes the tokens stand for. Special tokens (BOS/EOS/pad) print nothing. The output
  // is prefix-consistent: decode(t[0..i)) is a byte prefix of decode(t) for every i, so the
  // text of generated tokens is decode(prompt + generated) minus decode(prompt).
  virtual std::string decode(std::span<const std::int32_t> tokens) const = 0;
  virtual std::int32_t vocab_size() const = 0;
  virtual std::optional<std::int32_t> bos_id() const = 0;
  virtual std::optional<std::int32_t> eos_id() const = 0;
};

// llama2.c tokenizer file (int32 max_token_length; per token: f32 score, i32 len, bytes).
// vocab_size comes from the model (the file does not store it). Throws std::runtime_error
// naming `source_name` on truncated or malformed data.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(std::span<const std::byte> data, std::int32_t vocab_size,
                                                  const std::string& source_name);
std::unique_ptr<Tokenizer> load_llama2c_tokenizer_file(const std::string& path, std::int32_t vocab_size);

// GPT-2 style byte-level BPE from vocab.json + merges.txt (optional "#version" line).
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& vocab_json_path, const std::string& merges_path);
// Hugging Face tokenizer.json with a BPE model and ByteLevel pre-tokenizer (GPT-2, OPT, ...).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path);

}  // namespace flexh2o::engine
