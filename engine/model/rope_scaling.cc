#include "engine/model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace flexh2o::engine {

namespace {

// theta^(-2i/d) for the d / 2 pairs of the rotated dims.
std::vector<double> base_frequencies(double theta, std::int64_t d) {
  std::vector<double> f(static_cast<std::size_t>(d / 2));
  for (std::int64_t i = 0; i < d / 2; ++i) f[static_cast<std::size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  return f;
}

std::int64_t original_max(const ModelConfig& c) {
  return c.rope.original_max_positions > 0 ? c.rope.original_max_positions : c.max_positions;
}

double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

}  // namespace

bool rope_depends_on_length(const RopeConfig& r) { return r.type == RopeType::Dynamic || r.type == RopeType::LongRope; }

bool rope_uses_long_factors(const ModelConfig& c, std::int64_t seq_len) {
  return c.rope.type == RopeType::LongRope && seq_len > original_max(c);
}

bool rope_reprefills(const ModelConfig& c, std::span<const std::int64_t> cached) {
  return c.rope.reprefill_on_long && std::ranges::find(cached, original_max(c)) != cached.end();
}

std::int64_t rows_for_batch(const ModelConfig& c, std::span<const std::vector<std::int32_t>> prompts,
                            std::int64_t max_new_tokens) {
  std::int64_t rows = 0;
  for (const auto& p : prompts) rows += static_cast<std::int64_t>(p.size()) + (c.rope.reprefill_on_long ? max_new_tokens : 0);
  return rows;
}

RopeFrequencies rope_frequencies(const ModelConfig& c, std::int64_t seq_len) {
  const RopeConfig& r = c.rope;
  const std::int64_t d = c.rotary_dim();
  std::vector<double> f = base_frequencies(r.theta, d);
  double attention_factor = 1.0;
  switch (r.type) {
    case RopeType::Default:
      break;
    case RopeType::Linear:
      for (double& x : f) x /= r.factor;
      break;
    case RopeType::Dynamic: {
      // NTK: a larger base once the sequence outgrows max_positions.
      const double len = static_cast<double>(std::max(seq_len, c.max_positions)), maxp = static_cast<double>(c.max_positions);
      const double dd = static_cast<double>(d);
      const double theta = r.theta * std::pow(r.factor * len / maxp - (r.factor - 1), dd / (dd - 2));
      f = base_frequencies(theta, d);
      break;
    }
    case RopeType::Llama3: {
      // Long wavelengths are interpolated by `factor`, short ones kept, a smooth ramp between.
      const double old_len = static_cast<double>(original_max(c));
      const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
      for (double& x : f) {
        const double wavelen = 2 * std::numbers::pi / x;
        if (wavelen > low_wavelen) {
          x /= r.factor;
        } else if (wavelen >= high_wavelen) {
          const double s = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          x = (1 - s) * x / r.factor + s * x;
        }
      }
      break;
    }
    case RopeType::Yarn: {
      const double factor = r.factor > 0 ? r.factor : static_cast<double>(c.max_positions) / static_cast<double>(original_max(c));
      const double dd = static_cast<double>(d), orig = static_cast<double>(original_max(c));
      auto correction_dim = [&](double rotations) {
        return dd * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(r.theta));
      };
      double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dd - 1);
      if (low == high) high += 0.001;  // as transformers: no division by zero
      for (std::size_t i = 0; i < f.size(); ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // share of the unscaled frequency
        f[i] = f[i] / factor * (1 - extrapolation) + f[i] * extrapolation;
      }
      if (r.attention_factor > 0) {
        attention_factor = r.attention_factor;
      } else if (r.mscale > 0 && r.mscale_all_dim > 0) {
        attention_factor = yarn_mscale(factor, r.mscale) / yarn_mscale(factor, r.mscale_all_dim);
      } else {
        attention_factor = yarn_mscale(factor, 1.0);
      }
      break;
    }
    case RopeType::LongRope: {
      const auto& ext = rope_uses_long_factors(c, seq_len) ? r.long_factor : r.short_factor;
      if (ext.size() != f.size()) throw std::logic_error("longrope: factor lists do not match the rotary dims");
      for (std::size_t i = 0; i < f.size(); ++i) f[i] /= ext[i];
      const double orig = static_cast<double>(original_max(c));
      const double factor = r.factor > 0 ? r.factor : static_cast<double>(c.max_positions) / orig;
      attention_factor = r.attention_factor > 0 ? r.attention_factor
                         : factor <= 1.0        ? 1.0
                                                : std::sqrt(1 + std::log(factor) / std::log(orig));
      break;
    }
  }
  RopeFrequencies out;
  out.inv_freq.assign(f.begin(), f.end());
  out.attention_factor = static_cast<float>(attention_factor);
  return out;
}

}  // namespace flexh2o::engine
