// GPT-2's vocab.json + merges.txt: byte-level BPE behind GPT-2's regex, the pipeline Hugging
// Face's GPT-2 tokenizer.json spells out.
#include <sstream>
#include <stdexcept>

#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/decoders.h"
#include "engine/tokenizer/json_fields.h"
#include "engine/tokenizer/pipeline.h"
#include "engine/tokenizer/post_processors.h"
#include "engine/tokenizer/pre_tokenizers.h"
#include "offload/text_file.h"

namespace flexh2o::engine {

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& vocab_json_path, const std::string& merges_path) {
  using namespace tok;
  Vocab vocab = parse_vocab(read_json(vocab_json_path), vocab_json_path, "vocab");

  const auto merges_text = offload::read_text_file(merges_path, offload::kMaxTokenizerFileBytes);
  if (!merges_text) fail(merges_path, "cannot open");
  std::istringstream in(*merges_text);
  std::vector<MergeRule> merges;
  std::string line;
  for (std::size_t line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const auto where = [&] { return "line " + std::to_string(line_no); };
    const auto pair = split_merge(line);
    if (!pair) fail(merges_path, where() + ": " + bad_merge(line));
    try {
      merges.push_back(resolve_merge(vocab, pair->first, pair->second));
    } catch (const std::runtime_error& e) {
      fail(merges_path, where() + ": " + e.what());
    }
  }

  PipelineParts parts;
  TokenizerOptions options;
  // The model config says which BOS the model takes (OPT: "</s>"); these files do not.
  options.decides_special_tokens = false;
  // GPT-2's only special token, its document separator, serves as both BOS and EOS.
  if (const auto eot = vocab.find("<|endoftext|>")) {
    parts.added_tokens.push_back({.id = *eot, .content = "<|endoftext|>", .special = true});
    parts.post_processor = std::make_unique<TemplateProcessor>(
        std::vector<TemplateProcessor::Item>{{false, {*eot}}, {true, {}}});
    options.bos_id = options.eos_id = *eot;
  }
  parts.pre_tokenizer = std::make_unique<ByteLevelPreTokenizer>(/*add_prefix_space=*/false, /*use_regex=*/true);
  parts.model = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{});
  parts.decoder = std::make_unique<ByteLevelDecoder>();
  return make_tokenizer(std::move(parts), options, vocab_json_path);
}

}  // namespace flexh2o::engine
