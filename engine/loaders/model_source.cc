#include "engine/loaders/model_source.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "engine/families/model_yaml.h"
#include "engine/model/embedded.h"
#include "engine/loaders/dummy_weights.h"
#include "engine/loaders/gguf_checkpoint.h"
#include "engine/loaders/gguf_tokenizer_keys.h"
#include "engine/loaders/hf_checkpoint.h"
#include "engine/loaders/llama2c_checkpoint.h"
#include "offload/text_file.h"
#include "kernels/option_error.h"

namespace flexh2o::engine {

namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  auto text = offload::read_text_file(path);
  if (!text) throw std::runtime_error(path + ": cannot open");
  return std::move(*text);
}

std::unique_ptr<Tokenizer> hf_dir_tokenizer(const fs::path& dir) {
  if (fs::exists(dir / "tokenizer.json")) return load_hf_tokenizer((dir / "tokenizer.json").string());
  if (fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"))
    return load_gpt2_tokenizer((dir / "vocab.json").string(), (dir / "merges.txt").string());
  return nullptr;
}

// llama2.c's tokenizer next to its checkpoint: tokenizer.bin, else the one tok*.bin there
// (llama2.c names them tok512.bin, tok4096.bin, ...).
std::optional<fs::path> llama2c_tokenizer_beside(const fs::path& model) {
  const fs::path dir = model.has_parent_path() ? model.parent_path() : fs::path(".");
  if (fs::exists(dir / "tokenizer.bin")) return dir / "tokenizer.bin";
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.starts_with("tok") && e.path().extension() == ".bin" &&
        e.path().filename() != model.filename())
      found.push_back(e.path());
  }
  if (found.size() > 1) {
    std::ranges::sort(found);
    std::string names;
    for (const auto& f : found) names += (names.empty() ? "" : ", ") + f.filename().string();
    throw kernels::OptionRuntimeError{model.string() + ": several tokenizers beside it (" + names + "); pick one with ",
                                      kernels::Option::Tokenizer};
  }
  if (found.empty()) return std::nullopt;
  return found.front();
}

bool is_model_yaml(const fs::path& p) {
  return fs::is_regular_file(p) && (p.extension() == ".yaml" || p.extension() == ".yml");
}

}  // namespace

Bf16Speed bf16_speed(const kernels::Backend& be, kernels::DType matrices) {
  return {be.native_bf16(), be.bf16_faster_from_rows(matrices)};
}

ComputeChoice job_compute_dtype(const std::string& flag, kernels::DType weights, const Bf16Speed& bf16,
                                std::int64_t batch_rows) {
  if (flag == "f32") return {kernels::DType::F32, ""};
  if (flag == "bf16") return {kernels::DType::BF16, ""};
  if (flag != "auto")
    throw kernels::OptionError{kernels::Option::ComputeDtype, ": '" + flag + "' is not one of auto, f32, bf16"};
  if (weights == kernels::DType::F32) return {kernels::DType::F32, "auto: fp32 weights"};
  if (!bf16.native) return {kernels::DType::F32, "auto: no native bf16"};
  if (!bf16.faster_from_rows) return {kernels::DType::F32, "auto: these matrices' own f32 kernels beat bf16"};
  const std::string rows = fmt::format("auto: GPU batches of {} rows, bf16 the faster from {}", batch_rows,
                                       *bf16.faster_from_rows);
  return {batch_rows >= *bf16.faster_from_rows ? kernels::DType::BF16 : kernels::DType::F32, rows};
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, std::optional<std::int64_t> vocab_size) {
  const fs::path p(path);
  if (fs::is_directory(p)) {
    auto t = hf_dir_tokenizer(p);
    if (!t) throw std::runtime_error(path + ": no tokenizer.json or vocab.json + merges.txt in this directory");
    return t;
  }
  if (p.extension() == ".json") return load_hf_tokenizer(path);
  if (!vocab_size) {
    throw kernels::OptionRuntimeError{path + ": a llama2.c tokenizer file does not store its vocab size; name its model "
                                             "with ",
                                      kernels::Option::Model};
  }
  return load_llama2c_tokenizer_file(path, static_cast<std::int32_t>(*vocab_size));
}

bool names_weights(const std::string& model) {
  const fs::path p(model);
  return model.empty() || fs::is_directory(p) || (fs::is_regular_file(p) && !is_model_yaml(p));
}

ModelSource open_model(const ModelOptions& opt) {
  ModelSource m;
  const fs::path path(opt.model);
  if (opt.model.empty()) {
    auto ckpt = std::make_unique<Llama2cCheckpoint>(embedded_stories260k_model(), "stories260K.bin (embedded)");
    m.config = ckpt->config();
    m.config.name = "stories260k";
    m.tokenizer = load_llama2c_tokenizer(embedded_stories260k_tokenizer(), 512, "tok512.bin (embedded)");
    m.description = "stories260K (embedded llama2.c checkpoint)";
    m.weights = std::move(ckpt);
  } else if (fs::is_directory(path)) {
    auto ckpt = std::make_unique<HfCheckpoint>(opt.model);
    m.config = ckpt->config();
    m.tokenizer = hf_dir_tokenizer(path);
    m.description = opt.model;
    m.weights = std::move(ckpt);
  } else if (is_gguf_file(path.string())) {
    auto ckpt = std::make_unique<GgufCheckpoint>(opt.model);
    m.config = ckpt->config();
    // --tokenizer replaces the file's own, which then need not be readable.
    if (opt.tokenizer.empty()) m.tokenizer = gguf_tokenizer(ckpt->file().header());
    m.description = opt.model;
    m.weights = std::move(ckpt);
  } else if (is_model_yaml(path)) {
    m.config = load_model_yaml(read_text(opt.model), opt.model);
    m.description = opt.model;
  } else if (fs::is_regular_file(path)) {
    auto ckpt = std::make_unique<Llama2cCheckpoint>(opt.model);
    m.config = ckpt->config();
    m.config.name = path.stem().string();
    if (opt.tokenizer.empty())
      if (const auto sibling = llama2c_tokenizer_beside(path))
        m.tokenizer = load_llama2c_tokenizer_file(sibling->string(), static_cast<std::int32_t>(m.config.vocab_size));
    m.description = opt.model;
    m.weights = std::move(ckpt);
  } else if (opt.model.find('/') == std::string::npos) {
    m.config = builtin_model(opt.model);
    m.description = opt.model + " (built-in config)";
  } else {
    throw std::runtime_error(opt.model + ": no such file or directory");
  }
  if (!opt.tokenizer.empty()) m.tokenizer = open_tokenizer(opt.tokenizer, m.config.vocab_size);
  if (opt.dtype) m.config.dtype = *opt.dtype;
  if (opt.dummy) {
    m.weights = std::make_unique<DummyWeights>(m.config, opt.seed);
    m.description += ", dummy weights";
  } else if (!m.weights) {
    throw kernels::OptionRuntimeError{"model '" + opt.model + "' is a config without weights; add ",
                                      kernels::Option::DummyWeights, " or give a checkpoint directory or file"};
  }
  return m;
}

}  // namespace flexh2o::engine
