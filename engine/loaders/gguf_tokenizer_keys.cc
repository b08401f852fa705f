#include "engine/loaders/gguf_tokenizer_keys.h"

#include "engine/tokenizer/gguf_tokenizer.h"

namespace flexh2o::engine {

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufHeader& h) {
  GgufTokenizerSpec s;
  const auto model = h.get_string("tokenizer.ggml.model");
  if (!model) return nullptr;
  s.model = *model;
  s.architecture = h.get_string("general.architecture").value_or("");
  s.pre = h.get_string("tokenizer.ggml.pre");
  if (const auto* tokens = h.get_strings("tokenizer.ggml.tokens")) s.tokens = *tokens;
  s.scores = h.get_floats("tokenizer.ggml.scores");
  s.token_types = h.get_ints("tokenizer.ggml.token_type");
  if (const auto* merges = h.get_strings("tokenizer.ggml.merges")) s.merges = *merges;
  s.bos_id = h.get_uint("tokenizer.ggml.bos_token_id");
  s.eos_id = h.get_uint("tokenizer.ggml.eos_token_id");
  s.unk_id = h.get_uint("tokenizer.ggml.unknown_token_id");
  s.add_bos = h.get_bool("tokenizer.ggml.add_bos_token");
  s.add_eos = h.get_bool("tokenizer.ggml.add_eos_token");
  s.add_space_prefix = h.get_bool("tokenizer.ggml.add_space_prefix");
  return load_gguf_tokenizer(s, h.source);
}

}  // namespace flexh2o::engine
