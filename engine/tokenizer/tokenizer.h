// Text <-> token ids. Hugging Face tokenizer.json pipelines (SentencePiece-style BPE with byte
// fallback as in Llama-2/Mistral/Phi-3, byte-level BPE behind a regex as in GPT-2/Llama-3/
// Qwen2), GPT-2's vocab.json + merges.txt, llama2.c's tok*.bin, and GGUF's tokenizer.ggml.*
// metadata (gguf_tokenizer.h); pipeline.h builds others from their parts.
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
  // Token ids of `text`. With add_special, the special tokens the tokenizer itself puts around
  // a text (its post-processor's, e.g. BOS), as Hugging Face's encode(text) does.
  virtual std::vector<std::int32_t> encode(std::string_view text, bool add_special) const = 0;
  // The bytes the tokens stand for; special tokens print nothing unless skip_special is
  // false. The output is prefix-consistent: decode(t[0..i)) is a byte prefix of decode(t) for
  // every i, so the text of generated tokens is decode(prompt + generated) minus
  // decode(prompt). So bytes that do not form UTF-8 (a character cut by the end of the ids)
  // stay bytes where Hugging Face prints U+FFFD. Throws on an id the vocab does not have.
  std::string decode(std::span<const std::int32_t> tokens, bool skip_special = true) const {
    return decode_ids(tokens, skip_special);
  }
  virtual std::int32_t vocab_size() const = 0;
  // The token encode(text, true) puts first, and last after the text, if any.
  virtual std::optional<std::int32_t> bos_id() const = 0;
  virtual std::optional<std::int32_t> eos_id() const = 0;
  // Whether encode(text, true) is what the model takes: tokenizer.json's post-processor and
  // llama2.c's BOS decide. GPT-2's vocab.json + merges.txt carry no such rule; then the model
  // config's BOS id applies (encode_prompt in engine/serving/prompts.h).
  virtual bool decides_special_tokens() const = 0;

 private:
  virtual std::string decode_ids(std::span<const std::int32_t> tokens, bool skip_special) const = 0;
};

// llama2.c tokenizer file (int32 max_token_length; per token: f32 score, i32 len, bytes).
// vocab_size comes from the model (the file does not store it). Throws std::runtime_error
// naming `source_name` on truncated or malformed data.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(std::span<const std::byte> data, std::int32_t vocab_size,
                                                  const std::string& source_name);
std::unique_ptr<Tokenizer> load_llama2c_tokenizer_file(const std::string& path, std::int32_t vocab_size);

// GPT-2 style byte-level BPE from vocab.json + merges.txt (optional "#version" line).
// encode(text, true) puts "<|endoftext|>" first, GPT-2's document separator.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& vocab_json_path, const std::string& merges_path);
// A Hugging Face tokenizer.json. Throws std::runtime_error naming the file and the field on
// anything it does not implement (a stage type, an option), never a silent default.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path);

}  // namespace flexh2o::engine
