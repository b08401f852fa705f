#include "policy/eviction/kv_spec.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <system_error>

namespace flexh2o::policy {
namespace {

// How a named parameter's value is checked.
enum class Kind {
  Count,        // whole number >= min
  Fraction,     // 0 < x <= 1
  Amount,       // fraction in [0, 1) or whole number of tokens (h2o heavy/recent, drop)
  OddCount,     // odd whole number >= 1
  Real,         // min <= x <= max
};

struct ParamDef {
  const char* key;
  Kind kind;
  double default_value;  // NaN: no default (h2o heavy/recent)
  double min = 0;        // for Count
  double max = 1e9;      // for Count
};

struct PolicyDef {
  const char* name;
  bool needs_budget;
  std::vector<ParamDef> params;
};

// Concatenation by appending (GCC 12's -Wrestrict misfires on "literal" + std::string&&).
template <class... A>
std::string cat(const A&... a) {
  std::string out;
  (out.append(std::string_view(a)), ...);
  return out;
}

const double kNoDefault = std::nan("");

// Every policy with a budget: decode=0 keeps the budget's last slots for the new tokens (the
// prompt is cut to budget - new tokens at prefill) and evicts nothing while they fit. Those that
// rank by attention alone: layerwise=1 ranks by the attention summed over the layer's kv heads,
// so every head of a layer keeps the same tokens (as kvpress's presses do).
std::vector<PolicyDef> with_shared_params(std::vector<PolicyDef> defs) {
  const std::string_view by_attention[] = {"h2o", "tova", "scissorhands", "pyramid", "snapkv"};
  for (PolicyDef& d : defs) {
    if (d.needs_budget) d.params.push_back({"decode", Kind::Count, 1, 0, 1});
    if (std::find(std::begin(by_attention), std::end(by_attention), d.name) != std::end(by_attention))
      d.params.push_back({"layerwise", Kind::Count, 0, 0, 1});
  }
  return defs;
}

const std::vector<PolicyDef>& policy_defs() {
  static const std::vector<PolicyDef> defs = with_shared_params({
      {"full", false, {}},
      {"local", true, {}},
      {"streaming", true, {{"sink", Kind::Count, 4, 0}}},
      {"h2o", true, {{"heavy", Kind::Amount, kNoDefault}, {"recent", Kind::Amount, kNoDefault}}},
      {"tova", true, {{"pool", Kind::OddCount, 1, 1}, {"ahead", Kind::Count, 0, 0}}},
      {"scissorhands",
       true,
       {{"history", Kind::Count, 400, 1, 65536},
        {"recent", Kind::Count, 10, 0},
        {"drop", Kind::Amount, 1},
        {"sink", Kind::Count, 0, 0}}},
      {"pyramid",
       true,
       {{"r", Kind::Fraction, 0.9},
        {"sink", Kind::Count, 4, 0},
        {"recent", Kind::Fraction, 0.2},
        {"floor", Kind::Count, 64, 1}}},
      {"snapkv", true, {{"window", Kind::Count, 32, 1}, {"kernel", Kind::OddCount, 5, 1}}},
      {"flex",
       true,
       {{"decay", Kind::Real, 0.92, 0.0, 1.0},
        {"value", Kind::Real, 1.5, 0.0, 4.0},
        {"recent", Kind::Real, 0.15, 0.0, 1.0},
        {"sink", Kind::Count, 1, 0},
        {"merge", Kind::Count, 1, 0, 1}}},
  });
  return defs;
}

std::string join_names() {
  std::string out;
  for (const auto& d : policy_defs()) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

std::string valid_params(const PolicyDef& def) {
  if (def.params.empty()) return cat(def.name, " takes no named parameters");
  std::string out = cat("valid for ", def.name, ": ");
  for (std::size_t i = 0; i < def.params.size(); ++i) {
    if (i) out += ", ";
    out += def.params[i].key;
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_word(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

// A parsed number and whether it was written as a whole number (digits only).
struct Number {
  double value = 0;
  bool whole = false;
};

std::optional<Number> parse_number(std::string_view s) {
  if (s.empty()) return std::nullopt;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '-' && c != '+')
      return std::nullopt;  // no inf/nan/hex
  const bool whole = std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return Number{v, whole};
}

std::string fmt_real(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

[[noreturn]] void fail(std::string_view text, const std::string& why) {
  throw std::invalid_argument(cat("kv policy '", text, "': ", why));
}

}  // namespace

double KvSpec::param(const std::string& key) const {
  const auto it = params.find(key);
  if (it == params.end()) throw std::out_of_range(cat("kv policy '", text, "' has no parameter '", key, "'"));
  return it->second;
}

namespace {

// The first item of the text after ':' when it is a bare number: the budget, a fraction of the
// sequence or a token count.
void parse_budget(std::string_view text, std::string_view item, const PolicyDef& def, const std::string& help,
                  KvSpec& spec) {
  if (!def.needs_budget) fail(text, "full keeps every token and takes no budget");
  const auto num = parse_number(item);
  if (!num) fail(text, cat("'", item, "' is not a number; ", help));
  if (num->whole) {
    if (num->value < 1) fail(text, cat("a token budget must be at least 1; ", help));
    if (num->value > 1e15) fail(text, cat("token budget '", item, "' is too large"));
    spec.tokens = static_cast<std::int64_t>(num->value);
  } else {
    if (!(num->value > 0 && num->value <= 1)) fail(text, cat("fraction '", item, "' is outside (0, 1]; ", help));
    spec.fraction = num->value;
  }
}

// Throws where `value` (given as `shown`) is outside what parameter `p` takes.
void check_param(std::string_view text, const ParamDef& p, const std::string& key, std::string_view shown, double v,
                 bool whole) {
  switch (p.kind) {
    case Kind::Count:
      if (v != std::floor(v) || v < p.min || v > p.max)
        fail(text, cat(key, "=", shown, " must be a whole number in [", std::to_string(static_cast<long long>(p.min)),
                       ", ", std::to_string(static_cast<long long>(p.max)), "]"));
      break;
    case Kind::OddCount:
      if (v != std::floor(v) || v < 1 || v > 1e6 || static_cast<long long>(v) % 2 == 0)
        fail(text, cat(key, "=", shown, " must be an odd whole number >= 1"));
      break;
    case Kind::Real:
      if (!(v >= p.min && v <= p.max))
        fail(text, cat(key, "=", shown, " must be in [", fmt_real(p.min), ", ", fmt_real(p.max), "]"));
      break;
    case Kind::Fraction:
      if (!(v > 0 && v <= 1)) fail(text, cat(key, "=", shown, " must be a fraction in (0, 1]"));
      break;
    case Kind::Amount:
      if (!(whole || (v >= 0 && v < 1)) || v > 1e15)
        fail(text, cat(key, "=", shown,
                       " must be a fraction below 1 (of the sequence, or for drop of the budget) or a whole number of "
                       "tokens"));
      break;
  }
}

// A key=value item.
void parse_param(std::string_view text, std::string_view item, std::size_t eq, const PolicyDef& def, KvSpec& spec) {
  const std::string key = lower(trim(item.substr(0, eq)));
  const std::string_view value = trim(item.substr(eq + 1));
  const auto p = std::find_if(def.params.begin(), def.params.end(), [&](const ParamDef& d) { return key == d.key; });
  if (p == def.params.end()) fail(text, cat("unknown parameter '", key, "'; ", valid_params(def)));
  if (spec.params.count(key)) fail(text, cat("parameter '", key, "' given twice"));
  const auto num = parse_number(value);
  if (!num) fail(text, cat(key, "='", value, "' is not a number"));
  check_param(text, *p, key, value, num->value, num->whole);
  spec.params[key] = num->value;
}

// The items after ':': a budget first, or key=value ones.
void parse_items(std::string_view text, std::string_view rest, const PolicyDef& def, const std::string& help,
                 KvSpec& spec) {
  if (trim(rest).empty()) fail(text, cat("nothing after ':'; ", help));
  for (bool first = true;; first = false) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    if (item.empty()) fail(text, "empty item between commas");
    const std::size_t eq = item.find('=');
    if (eq != std::string_view::npos) {
      parse_param(text, item, eq, def, spec);
    } else if (first) {
      parse_budget(text, item, def, help, spec);
    } else {
      fail(text, cat("'", item, "' must be key=value (only the first item is a budget)"));
    }
    if (comma == std::string_view::npos) return;
    rest = rest.substr(comma + 1);
  }
}

// Which policies need a budget, and h2o's two ways of giving one.
void check_budget(std::string_view text, const PolicyDef& def, const std::string& help, const KvSpec& spec) {
  if (spec.name == "h2o") {
    const bool heavy = spec.params.count("heavy") > 0, recent = spec.params.count("recent") > 0;
    const bool budget = spec.fraction || spec.tokens;
    if (budget && (heavy || recent))
      fail(text, "give either a budget (h2o:0.2) or heavy= and recent= (h2o:heavy=0.1,recent=0.1), not both");
    if (heavy != recent) fail(text, "h2o needs both heavy= and recent= (e.g. h2o:heavy=0.1,recent=0.1)");
    if (!budget && !heavy)
      fail(text, "needs a budget: h2o:0.2 (fraction of the sequence), h2o:128 (tokens) or h2o:heavy=0.1,recent=0.1");
    if (recent && spec.params.at("recent") == 0) fail(text, "recent= must be positive (it includes the current token)");
  } else if (def.needs_budget && !spec.fraction && !spec.tokens) {
    fail(text, cat("needs a budget; ", help));
  }
  if (spec.name == "scissorhands" && spec.params.count("drop") && spec.params.at("drop") == 0)
    fail(text, "drop= must be positive");
}

}  // namespace

KvSpec parse_kv_spec(std::string_view raw) {
  const std::string_view text = trim(raw);
  if (text.empty()) fail(text, cat("empty; valid policies: ", join_names(), " (e.g. h2o:0.2)"));
  KvSpec spec;
  spec.text = std::string(text);
  const std::size_t colon = text.find(':');
  spec.name = lower(trim(text.substr(0, colon)));
  const auto def_it = std::find_if(policy_defs().begin(), policy_defs().end(),
                                   [&](const PolicyDef& d) { return spec.name == d.name; });
  if (def_it == policy_defs().end()) fail(text, cat("unknown policy '", spec.name, "'; valid: ", join_names()));
  const PolicyDef& def = *def_it;
  const std::string help =
      cat("use a fraction in (0, 1] like ", spec.name, ":0.2 or a token count like ", spec.name, ":128");
  if (colon != std::string_view::npos) parse_items(text, text.substr(colon + 1), def, help, spec);
  check_budget(text, def, help, spec);
  for (const auto& p : def.params)
    if (!std::isnan(p.default_value)) spec.params.emplace(p.key, p.default_value);
  if (spec.name == "tova" && spec.params.at("ahead") > std::floor(spec.params.at("pool") / 2))
    fail(text, "ahead= must be at most pool / 2 (the window must still hold the token it pools from)");
  return spec;
}

std::vector<KvSpec> parse_kv_specs(std::string_view list) {
  std::vector<std::string> texts;
  std::string_view rest = list;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view piece = rest.substr(0, comma);
    const std::string_view t = trim(piece);
    const std::size_t eq = t.find('=');
    const bool continues = eq != std::string_view::npos && is_word(trim(t.substr(0, eq)));
    if (continues && !texts.empty()) {
      texts.back() += ",";
      texts.back() += std::string(t);
    } else {
      if (continues)
        throw std::invalid_argument(
            cat("kv policy list '", trim(list), "': '", t, "' is a parameter without a policy before it"));
      texts.emplace_back(t);
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  std::vector<KvSpec> out;
  out.reserve(texts.size());
  for (const auto& t : texts) {
    if (t.empty())
      throw std::invalid_argument(
          cat("kv policy list '", trim(list), "': empty entry; write policies separated by commas, e.g. full,h2o:0.2"));
    out.push_back(parse_kv_spec(t));
  }
  return out;
}

namespace {
// A value below 1 is a fraction of n (rounded), a value >= 1 a whole number of tokens.
std::int64_t amount_tokens(double v, std::int64_t n) {
  if (v < 1) return std::llround(v * static_cast<double>(n));
  return static_cast<std::int64_t>(v);
}
}  // namespace

std::int64_t budget_tokens(const KvSpec& spec, std::int64_t n) {
  if (n < 0) throw std::invalid_argument(cat("kv policy '", spec.text, "': sequence length ", std::to_string(n), " < 0"));
  if (spec.is_full()) return n;
  std::int64_t b = 0;
  if (spec.fraction) {
    b = std::max<std::int64_t>(8, std::llround(*spec.fraction * static_cast<double>(n)));
  } else if (spec.tokens) {
    b = *spec.tokens;
  } else if (spec.params.count("heavy") && spec.params.count("recent")) {
    const double h = spec.params.at("heavy"), r = spec.params.at("recent");
    b = amount_tokens(h, n) + amount_tokens(r, n);
    if ((h > 0 && h < 1) || (r > 0 && r < 1)) b = std::max<std::int64_t>(8, b);
  } else {
    throw std::invalid_argument(cat("kv policy '", spec.text, "' has no budget"));
  }
  return std::min(b, n);
}

}  // namespace flexh2o::policy
