// KV eviction policy specs: the text users write after --kv (`h2o:0.2`, `local:128`,
// `h2o:heavy=0.1,recent=0.1`, `scissorhands:0.2,history=400`), parsed and validated.
//
// Grammar:  spec := name [':' item (',' item)*]      item := number | key '=' number
// The optional first bare number is the budget: a number with a decimal point or exponent is a
// fraction of the sequence in (0, 1] (`h2o:0.2`), a whole number is a token count >= 1
// (`h2o:128`). Every policy except `full` needs a budget; h2o may instead name both parts,
// `heavy=` and `recent=`, each a fraction below 1 or a whole number of tokens.
//
// Parameters (defaults are filled into KvSpec::params by the parser):
//   full          (none; keeps every token)
//   local         (budget only)
//   streaming     sink=4            attention sinks (first tokens) always kept
//   h2o           heavy=, recent=   instead of a budget; default split recent = floor(B/2)
//   tova          pool=1            at prefill, rank each token by the largest score within
//                                   pool / 2 tokens of it (odd; 1: its own score)
//                 ahead=0           the pool's window moved this many tokens towards the
//                                   tokens after a high score (at most pool / 2): a copied
//                                   number keeps the digits after the one attended
//   scissorhands  history=400       steps of "below the uniform share" bits kept per token
//                 recent=10         newest tokens never dropped
//                 drop=1            tokens dropped when the cache is full: a whole number, or a
//                                   fraction below 1 of the budget (0.1 = 10% of B at a time)
//                 sink=0            first tokens never dropped and left out of the uniform
//                                   share (0: the paper's rule)
//   pyramid       r=0.9             PyramidInfer's per-layer retention floor ratio
//                 sink=4            first tokens always kept
//                 recent=0.2        fraction of the prompt that is observers / recent window
//                 floor=64          smallest per-layer budget (never above the layer-0 budget)
//   snapkv        window=32         observation window: last queries of the prompt
//                 kernel=5          pooling kernel (odd), average pooling as in SnapKV
//   flex          decay=0.92        per-step decay of a token's peak attention, in [0, 1]
//                 value=1.5         exponent of the value-vector norm in the key, in [0, 4]
//                 recent=0.15       share of the budget kept for the newest tokens, in [0, 1]
//                 sink=1            first tokens always kept
//                 merge=1           fold each evicted token into the most key-similar kept
//                                   one (0: drop it)
//   every policy but full:
//                 decode=1          evict while decoding (0: at prefill keep the budget less
//                                   the new tokens, then evict nothing while they fit, as
//                                   kvpress's presses do at prefill: an answer copied from the
//                                   prompt keeps what it copies)
//   h2o, tova, scissorhands, pyramid, snapkv:
//                 layerwise=0       1: rank by the attention summed over the layer's kv
//                                   heads, so all of them keep the same tokens (kvpress)
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flexh2o::policy {

struct KvSpec {
  std::string name;  // full|local|streaming|h2o|tova|scissorhands|pyramid|snapkv|flex
  std::string text;  // as given (trimmed), for messages and reports
  std::optional<double> fraction;     // budget as a fraction of the sequence, 0 < f <= 1
  std::optional<std::int64_t> tokens; // budget as a token count >= 1
  // Named parameters, defaults filled in. For h2o's heavy/recent and scissorhands' drop a
  // value below 1 is a fraction and a value >= 1 a whole number of tokens (0 = none).
  std::map<std::string, double> params;

  bool is_full() const { return name == "full"; }
  double param(const std::string& key) const;  // throws std::out_of_range when absent
};

// Throws std::invalid_argument naming the text and saying what is valid.
KvSpec parse_kv_spec(std::string_view text);

// A comma-separated list: "full,local:0.2,h2o:heavy=0.1,recent=0.1,tova:0.2". A comma followed
// by `word=` continues the current spec's parameters; otherwise it starts a new spec.
std::vector<KvSpec> parse_kv_specs(std::string_view list);

// Budget in tokens for a sequence of n tokens (BOS included): fraction f -> max(8, round(f*n)),
// tokens B -> B, h2o heavy+recent -> the sum (floor 8 when either part is a fraction), full -> n;
// never more than n. (docs/kv-eviction.md.) Pyramid's per-layer budget is
// KvPolicy::budget(layer, n); this is its layer-0 budget.
std::int64_t budget_tokens(const KvSpec& spec, std::int64_t n);

}  // namespace flexh2o::policy
