#include "engine/cli/tokenize_command.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/io/json_input.h"
#include "engine/loaders/model_source.h"
#include "engine/serving/prompts.h"
#include "offload/text_file.h"

namespace flexh2o::cli {

using namespace flexh2o::engine;

CLI::App* add_tokenize_command(CLI::App& app, TokenizeOptions& o) {
  auto* tok = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array, or with --decode the text of ids");
  tok->add_option("--model", o.model,
                  "model whose tokenizer to use, as for run (default: the embedded stories260K unless --tokenizer is given)");
  tok->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json, a directory with it or with vocab.json + merges.txt, or a llama2.c tok*.bin (with --model)");
  auto* text = tok->add_option("--text", o.text, "the text (with --decode: a JSON array of ids)");
  tok->add_option("--file", o.file, "read the text (with --decode: the JSON array) from this file")->excludes(text);
  tok->add_flag("--special", o.special,
                "encode: with the special tokens the model takes (e.g. BOS); decode: print special tokens too");
  tok->add_flag("--decode", o.decode, "ids -> text instead of text -> ids");
  return tok;
}

namespace {

std::vector<std::int32_t> parse_ids(const std::string& input, const std::string& source) {
  nlohmann::json j;
  try {
    j = parse_json(input, source);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(std::string(e.what()) + "; expected a JSON array of token ids, like [1, 2, 3]");
  }
  if (!j.is_array()) throw std::invalid_argument(source + ": expected a JSON array of token ids, like [1, 2, 3]");
  std::vector<std::int32_t> ids;
  for (const auto& id : j) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
        id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
      throw std::invalid_argument(source + ": " + json_excerpt(id) + " is not a token id (a non-negative integer)");
    }
    ids.push_back(id.get<std::int32_t>());
  }
  return ids;
}

}  // namespace

int tokenize_command(const TokenizeOptions& o) {
  if (!o.text && !o.file) throw std::invalid_argument("tokenize needs its input: --text or --file");
  std::string input = o.text.value_or("");
  std::string source = "--text";
  if (o.file) {
    auto content = offload::read_text_file(*o.file, offload::kMaxInputFileBytes);
    if (!content) throw std::invalid_argument("cannot read --file " + *o.file);
    input = std::move(*content);
    source = *o.file;
  }

  std::unique_ptr<Tokenizer> tok;
  std::optional<std::int32_t> config_bos_id;  // known when a model is
  if (!o.tokenizer.empty() && o.model.empty()) {
    tok = open_tokenizer(o.tokenizer, std::nullopt);
  } else {
    ModelOptions mo;
    mo.model = o.model;
    mo.tokenizer = o.tokenizer;
    mo.dummy = true;  // only the config and the tokenizer are needed
    ModelSource m = open_model(mo);
    if (!m.tokenizer) {
      throw std::invalid_argument("model '" + o.model +
                                  "' has no tokenizer (no tokenizer.json or vocab.json + merges.txt, no tokenizer.ggml.* in a GGUF file); "
                                  "pass --tokenizer");
    }
    tok = std::move(m.tokenizer);
    config_bos_id = m.config.bos_id;
  }

  if (o.decode) {
    const std::string text = tok->decode(parse_ids(input, source), /*skip_special=*/!o.special);
    fmt::print("{}\n", text);
    return 0;
  }
  // With a model, --special gives what `run` feeds it; a tokenizer alone follows its own rule.
  const std::vector<std::int32_t> ids = !o.special       ? tok->encode(input, false)
                                        : config_bos_id ? encode_prompt(*tok, input, *config_bos_id)
                                                        : tok->encode(input, true);
  fmt::print("[{}]\n", fmt::join(ids, ", "));
  return 0;
}

}  // namespace flexh2o::cli
