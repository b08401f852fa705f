#include "tests/support/test_models.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "engine/families/family.h"
#include "engine/loaders/hf_checkpoint.h"
#include "engine/loaders/safetensors.h"
#include "tests/support/fp_tolerance.h"

namespace flexh2o::testing {

std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::size_t n, std::int64_t vocab) {
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(3 + rng() % static_cast<std::uint64_t>(vocab - 3));
  return t;
}

namespace fs = std::filesystem;
using engine::HostWeights;
using engine::ModelConfig;

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "flexh2o-test-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ModelConfig tiny_opt_config() {
  ModelConfig c;
  c.name = "tiny-opt";
  c.n_layers = 2;
  c.hidden = 64;
  c.ffn = 128;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.head_dim = 16;
  c.vocab_size = 97;
  c.max_positions = 64;
  c.dtype = kernels::DType::F32;
  engine::find_family("opt", c.name).preset(c);
  c.family = "opt";
  c.bos_id = 2;
  c.stop_ids = {};
  return c;
}

ModelConfig tiny_llama_config() {
  ModelConfig c;
  c.name = "tiny-llama";
  c.n_layers = 3;
  c.hidden = 48;
  c.ffn = 72;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 101;
  c.max_positions = 64;
  c.dtype = kernels::DType::F32;
  engine::find_family("llama", c.name).preset(c);
  c.family = "llama";
  c.norm_eps = 1e-5f;
  c.bos_id = 1;
  c.stop_ids = {};
  return c;
}

ModelConfig tiny_moe_config() {
  ModelConfig c = tiny_llama_config();
  c.name = "tiny-moe";
  c.moe.experts = 6;
  c.moe.top_k = 2;
  c.moe.expert_ffn = 24;
  c.moe.norm_topk = false;
  c.moe.shared_ffn = 16;
  c.moe.layers = {true, false, true};
  return c;
}

namespace {

std::vector<float> as_f32(const engine::HostTensor& t) {
  std::vector<float> v(static_cast<std::size_t>(t.rows * t.cols));
  kernels::convert_to_f32(t.data.get(), t.dtype, v.data(), v.size());
  return v;
}

// Row permutation per head: interleaved pair (p, t) -> rotate-half (t, p).
std::vector<float> interleaved_to_rotate_half(const std::vector<float>& w, std::int64_t heads, std::int64_t hd,
                                              std::int64_t cols) {
  std::vector<float> out(w.size());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t p = 0; p < hd / 2; ++p)
      for (std::int64_t t = 0; t < 2; ++t) {
        const std::int64_t src = h * hd + 2 * p + t, dst = h * hd + t * (hd / 2) + p;
        std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
      }
  return out;
}

}  // namespace

void export_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const HostWeights& w,
                          kernels::DType file_dtype, bool from_interleaved, int shards) {
  nlohmann::json j;
  const char* dtype_name = file_dtype == kernels::DType::F32 ? "float32"
                           : file_dtype == kernels::DType::F16 ? "float16"
                                                                : "bfloat16";
  j["torch_dtype"] = dtype_name;
  j["hidden_size"] = cfg.hidden;
  j["num_hidden_layers"] = cfg.n_layers;
  j["num_attention_heads"] = cfg.n_heads;
  j["vocab_size"] = cfg.vocab_size;
  j["max_position_embeddings"] = cfg.max_positions;
  j["bos_token_id"] = cfg.bos_id;
  if (!cfg.stop_ids.empty()) j["eos_token_id"] = cfg.stop_ids.front();
  j["tie_word_embeddings"] = cfg.tie_embeddings;
  j["model_type"] = cfg.family;
  if (cfg.learned_positions) {
    j["ffn_dim"] = cfg.ffn;
    j["word_embed_proj_dim"] = cfg.hidden;
    j["do_layer_norm_before"] = true;
  } else {
    j["intermediate_size"] = cfg.ffn;
    j["num_key_value_heads"] = cfg.n_kv_heads;
    j["rms_norm_eps"] = cfg.norm_eps;
    j["rope_theta"] = cfg.rope.theta;
  }
  write_file(dir + "/config.json", j.dump(2));

  // Convert every tensor to the file dtype under its HF name.
  struct Owned {
    std::string name;
    std::vector<std::int64_t> shape;
    std::vector<std::byte> bytes;
  };
  std::vector<Owned> owned;
  for (const auto& spec : engine::weight_specs(cfg)) {
    std::vector<float> v = as_f32(w.at(spec.name));
    const bool is_q = spec.name.ends_with(".wq"), is_k = spec.name.ends_with(".wk");
    if (from_interleaved && (is_q || is_k))
      v = interleaved_to_rotate_half(v, is_q ? cfg.n_heads : cfg.n_kv_heads, cfg.head_dim, spec.cols);
    Owned o{engine::find_family(cfg.family, "export").tensor_names(cfg, spec.name).front().name,
            spec.matrix ? std::vector<std::int64_t>{spec.rows, spec.cols} : std::vector<std::int64_t>{spec.rows},
            std::vector<std::byte>(v.size() * kernels::dtype_size(file_dtype))};
    kernels::convert_from_f32(v.data(), file_dtype, o.bytes.data(), v.size());
    owned.push_back(std::move(o));
  }
  nlohmann::json index;
  for (int s = 0; s < shards; ++s) {
    std::vector<engine::SafetensorsTensor> part;
    const std::string file = shards == 1 ? "model.safetensors"
                                         : "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) +
                                               ".safetensors";
    for (std::size_t i = static_cast<std::size_t>(s); i < owned.size(); i += static_cast<std::size_t>(shards)) {
      part.push_back({owned[i].name, file_dtype, owned[i].shape, owned[i].bytes.data()});
      index["weight_map"][owned[i].name] = file;
    }
    engine::write_safetensors(dir + "/" + file, part);
  }
  if (shards > 1) write_file(dir + "/model.safetensors.index.json", index.dump(2));
}

std::vector<std::vector<double>> reference_logits(const ModelConfig& c, const HostWeights& hw,
                                                  const std::vector<std::int32_t>& tokens) {
  auto W = [&](const std::string& n) { return as_f32(hw.at(n)); };
  const std::int64_t T = static_cast<std::int64_t>(tokens.size()), H = c.hidden, hd = c.head_dim;
  // The OPT and Llama-2 shapes: LayerNorm + learned positions + ReLU, or RMSNorm + RoPE + SwiGLU.
  const bool opt = c.learned_positions;
  using Mat = std::vector<std::vector<double>>;
  auto linear = [&](const Mat& x, const std::string& w, const std::string& b, std::int64_t out, std::int64_t in) {
    const auto wm = W(w);
    std::vector<float> bias = b.empty() ? std::vector<float>(out, 0.0f) : W(b);
    Mat y(x.size(), std::vector<double>(out));
    for (std::size_t t = 0; t < x.size(); ++t)
      for (std::int64_t o = 0; o < out; ++o) {
        double s = bias[o];
        for (std::int64_t i = 0; i < in; ++i) s += x[t][i] * wm[o * in + i];
        y[t][o] = s;
      }
    return y;
  };
  auto normalize = [&](const Mat& x, const std::string& prefix) {
    const auto g = W(prefix + ".weight");
    const auto b = opt ? W(prefix + ".bias") : std::vector<float>(H, 0.0f);
    Mat y = x;
    for (auto& row : y) {
      double mean = 0, var = 0, ss = 0;
      for (double v : row) mean += v / H;
      for (double v : row) var += (v - mean) * (v - mean) / H;
      for (double v : row) ss += v * v / H;
      for (std::int64_t i = 0; i < H; ++i)
        row[i] = opt ? (row[i] - mean) / std::sqrt(var + c.norm_eps) * g[i] + b[i] : row[i] / std::sqrt(ss + c.norm_eps) * g[i];
    }
    return y;
  };
  auto rotate = [&](Mat& x, std::int64_t heads) {
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < hd / 2; ++i) {
          const double ang = t * std::pow(c.rope.theta, -2.0 * i / hd);
          const bool inter = c.rope.layout == kernels::RopeLayout::Interleaved;
          const std::int64_t a = h * hd + (inter ? 2 * i : i), b = h * hd + (inter ? 2 * i + 1 : i + hd / 2);
          const double x0 = x[t][a], x1 = x[t][b];
          x[t][a] = x0 * std::cos(ang) - x1 * std::sin(ang);
          x[t][b] = x0 * std::sin(ang) + x1 * std::cos(ang);
        }
  };

  Mat h(T, std::vector<double>(H));
  const auto emb = W("tok_embed");
  const auto pos = opt ? W("pos_embed") : std::vector<float>{};
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < H; ++i) h[t][i] = emb[tokens[t] * H + i] + (opt ? pos[(t + 2) * H + i] : 0.0);

  const std::int64_t q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd, group = c.n_heads / c.n_kv_heads;
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    auto bias = [&](const char* n) { return opt ? p + n : std::string(); };
    Mat x = normalize(h, p + "attn_norm");
    Mat q = linear(x, p + "wq", bias("bq"), q_dim, H);
    Mat k = linear(x, p + "wk", bias("bk"), kv_dim, H);
    Mat v = linear(x, p + "wv", bias("bv"), kv_dim, H);
    if (!opt) {
      rotate(q, c.n_heads);
      rotate(k, c.n_kv_heads);
    }
    Mat att(T, std::vector<double>(q_dim, 0.0));
    for (std::int64_t hh = 0; hh < c.n_heads; ++hh) {
      const std::int64_t g = hh / group;
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300, sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (std::int64_t e = 0; e < hd; ++e) d += q[i][hh * hd + e] * k[j][g * hd + e];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (auto& e : s) sum += e = std::exp(e - mx);
        for (std::int64_t j = 0; j <= i; ++j)
          for (std::int64_t e = 0; e < hd; ++e) att[i][hh * hd + e] += s[j] / sum * v[j][g * hd + e];
      }
    }
    Mat o = linear(att, p + "wo", bias("bo"), H, q_dim);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < H; ++i) h[t][i] += o[t][i];
    x = normalize(h, p + "mlp_norm");
    Mat m;
    if (opt) {
      Mat a = linear(x, p + "w_up", p + "b_up", c.ffn, H);
      for (auto& row : a)
        for (auto& e : row) e = std::max(e, 0.0);
      m = linear(a, p + "w_down", p + "b_down", H, c.ffn);
    } else {
      Mat g = linear(x, p + "w_gate", "", c.ffn, H), u = linear(x, p + "w_up", "", c.ffn, H);
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t i = 0; i < c.ffn; ++i) g[t][i] = g[t][i] / (1 + std::exp(-g[t][i])) * u[t][i];
      m = linear(g, p + "w_down", "", H, c.ffn);
    }
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t i = 0; i < H; ++i) h[t][i] += m[t][i];
  }
  h = normalize(h, "final_norm");
  return linear(h, c.tie_embeddings ? "tok_embed" : "lm_head", "", c.vocab_size, H);
}

double forward_tolerance(const ModelConfig& c, std::int64_t tokens, std::span<const float> logits) {
  const std::int64_t longest = std::max({c.hidden, c.ffn, c.n_heads * c.head_dim, tokens});
  return sum_tolerance(kF32Eps, 4 * (2 * c.n_layers + 1) * longest, max_abs(logits));
}

double rounded_weights_tolerance(const ModelConfig& c, double u_w, std::span<const float> logits) {
  return kSlack * u_w * std::sqrt(static_cast<double>(2 * c.n_layers + 1)) * std::max(1.0, max_abs(logits));
}

}  // namespace flexh2o::testing
