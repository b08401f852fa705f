#include "engine/runtime/kv_quality.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "kernels/option_error.h"

namespace flexh2o::engine {

std::int64_t PromptSplit::prompt_tokens(std::int64_t n) const {
  const std::int64_t p = fraction ? std::llround(*fraction * static_cast<double>(n)) : tokens;
  return std::clamp<std::int64_t>(p, 1, std::max<std::int64_t>(1, n - 1));
}

PromptSplit parse_prompt_split(std::string_view text) {
  const std::string t(text);
  const auto bad = [&] {
    return kernels::OptionError{kernels::Option::EvalPrefill, " '" + t +
                                "': give a fraction of each chunk in (0, 1) like 0.5, or a token count >= 1 like 32"};
  };
  if (t.empty() || t.find_first_not_of("0123456789.") != std::string::npos) throw bad();
  PromptSplit s;
  std::size_t used = 0;
  try {
    if (t.find('.') == std::string::npos) {
      s.tokens = std::stoll(t, &used);
      if (s.tokens < 1) throw bad();
    } else {
      const double f = std::stod(t, &used);
      if (!(f > 0 && f < 1)) throw bad();
      s.fraction = f;
    }
  } catch (const std::logic_error&) {  // stoll/stod: out of range or no digits
    throw bad();
  }
  if (used != t.size()) throw bad();
  return s;
}

std::vector<std::string> split_paragraphs(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  std::size_t begin = 0;
  auto flush = [&] {
    const auto a = cur.find_first_not_of(" \t\r\n"), b = cur.find_last_not_of(" \t\r\n");
    if (a != std::string::npos) out.push_back(cur.substr(a, b - a + 1));
    cur.clear();
  };
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find('\n', begin), text.size());
    const std::string_view line = text.substr(begin, end - begin);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      flush();
    } else {
      cur.append(line);
      cur.push_back('\n');
    }
    begin = end + 1;
  }
  flush();
  return out;
}

namespace {

// Log-softmax of one logits row, in double.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - mx);
  const double lse = mx + std::log(sum);
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - lse;
}

std::size_t argmax(std::span<const float> row) {
  return static_cast<std::size_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace

std::vector<KvQuality> evaluate_variants(Generator& reference, const std::vector<std::vector<std::int32_t>>& chunks,
                                         const std::vector<EvalVariant>& variants, std::int64_t batch,
                                         const PromptSplit& split) {
  const ModelConfig& cfg = reference.config();
  const auto V = static_cast<std::size_t>(cfg.vocab_size);
  std::vector<KvQuality> out;
  for (const auto& v : variants) out.push_back({v.label, v.kv, 0, 0, 0, 0, 0});
  std::vector<std::unique_ptr<policy::KvPolicy>> policies;
  for (const auto& v : variants)
    policies.push_back(v.kv.name == "full" ? nullptr : policy::make_kv_policy(v.kv, cfg.n_layers));
  std::vector<double> lp_full, lp_pol;
  for (std::size_t first = 0; first < chunks.size(); first += static_cast<std::size_t>(batch)) {
    const std::size_t last = std::min(chunks.size(), first + static_cast<std::size_t>(batch));
    GenerationRequest req;
    std::int64_t longest = 0;
    std::vector<std::size_t> prompt;  // per chunk of the batch
    for (std::size_t c = first; c < last; ++c) {
      if (chunks[c].size() < 2) throw std::invalid_argument("evaluation chunks need at least 2 tokens");
      const auto n = static_cast<std::int64_t>(chunks[c].size());
      prompt.push_back(static_cast<std::size_t>(split.prompt_tokens(n)));
      const auto split_at = chunks[c].begin() + static_cast<std::ptrdiff_t>(prompt.back());
      req.sequences.push_back({.prompt = {chunks[c].begin(), split_at}, .forced = {split_at, chunks[c].end()}});
      longest = std::max<std::int64_t>(longest, n - static_cast<std::int64_t>(prompt.back()));
    }
    req.max_new_tokens = longest;
    const std::size_t B = last - first;
    // logits[step][b * V + v]: step t predicts token prompt[b] + t of the chunk.
    auto run = [&](Generator& gen, const policy::KvPolicy* kv) {
      std::vector<std::vector<float>> logits;
      req.kv = kv;
      GenerationHooks keep;
      keep.on_logits = [&](std::int64_t, std::span<const float> l) { logits.emplace_back(l.begin(), l.end()); };
      gen.generate(req, keep);
      return logits;
    };
    const auto full = run(reference, nullptr);
    for (std::size_t p = 0; p < variants.size(); ++p) {
      const bool same = !policies[p] && variants[p].generator == &reference;
      const auto pol = same ? full : run(*variants[p].generator, policies[p].get());
      KvQuality& q = out[p];
      for (std::size_t b = 0; b < B; ++b) {
        const auto& chunk = chunks[first + b];
        for (std::size_t t = 0; prompt[b] + t < chunk.size(); ++t) {
          const std::span<const float> f(full[t].data() + b * V, V), g(pol[t].data() + b * V, V);
          log_softmax(f, lp_full);
          log_softmax(g, lp_pol);
          double kl = 0;
          for (std::size_t v = 0; v < V; ++v) kl += std::exp(lp_full[v]) * (lp_full[v] - lp_pol[v]);
          q.mean_nll += -lp_pol[static_cast<std::size_t>(chunk[prompt[b] + t])];
          q.top1_agreement += argmax(f) == argmax(g) ? 1 : 0;
          q.mean_kl += kl;
          ++q.tokens;
        }
      }
    }
  }
  for (auto& q : out) {
    const double n = static_cast<double>(std::max<std::int64_t>(q.tokens, 1));
    q.mean_nll /= n;
    q.top1_agreement /= n;
    q.mean_kl /= n;
    q.perplexity = std::exp(q.mean_nll);
  }
  return out;
}

}  // namespace flexh2o::engine
