#include "engine/grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>

namespace flexh2o::grammar {

std::uint32_t GrammarBuilder::add_rule(std::string name) {
  grammar_.rules_.push_back(Grammar::Rule{.name = std::move(name)});
  return static_cast<std::uint32_t>(grammar_.rules_.size() - 1);
}

void GrammarBuilder::define(std::uint32_t rule, const Expr& body) {
  if (grammar_.rules_[rule].defined)
    throw std::invalid_argument("rule '" + grammar_.rules_[rule].name + "' is defined twice");
  const std::string owner = grammar_.rules_[rule].name;
  std::vector<Sequence> alternatives;
  if (body.kind == Expr::Kind::Alt) {
    for (const Expr& item : body.items) lower(item, alternatives.emplace_back(), owner);
  } else {
    lower(body, alternatives.emplace_back(), owner);
  }
  define_alternatives(rule, alternatives);
}

void GrammarBuilder::define_alternatives(std::uint32_t rule, const std::vector<Sequence>& alternatives) {
  Grammar::Rule& r = grammar_.rules_[rule];
  r.defined = true;
  for (const Sequence& sequence : alternatives) {
    r.alt_starts.push_back(static_cast<std::int32_t>(grammar_.elements_.size()));
    grammar_.elements_.insert(grammar_.elements_.end(), sequence.begin(), sequence.end());
    grammar_.elements_.push_back(Grammar::kEnd);
  }
}

std::int32_t GrammarBuilder::class_element(const ByteClass& bytes) {
  auto [it, inserted] = class_index_.try_emplace(bytes.words(), static_cast<std::int32_t>(grammar_.classes_.size()));
  if (inserted) grammar_.classes_.push_back(bytes);
  return -2 - it->second;
}

void GrammarBuilder::lower(const Expr& expr, Sequence& out, const std::string& owner) {
  switch (expr.kind) {
    case Expr::Kind::Bytes: out.push_back(class_element(expr.bytes)); return;
    case Expr::Kind::Rule: out.push_back(static_cast<std::int32_t>(expr.rule)); return;
    case Expr::Kind::Seq:
      for (const Expr& item : expr.items) lower(item, out, owner);
      return;
    case Expr::Kind::Alt: out.push_back(lower_single(expr, owner)); return;
    case Expr::Kind::Repeat: lower_repeat(expr, out, owner); return;
  }
}

// One element standing for `expr`: itself if it is a byte class or a rule, else a helper rule.
std::int32_t GrammarBuilder::lower_single(const Expr& expr, const std::string& owner) {
  if (expr.kind == Expr::Kind::Bytes) return class_element(expr.bytes);
  if (expr.kind == Expr::Kind::Rule) return static_cast<std::int32_t>(expr.rule);
  const std::uint32_t helper = add_rule(owner + "#" + std::to_string(grammar_.rules_.size()));
  define(helper, expr);
  return static_cast<std::int32_t>(helper);
}

// item{min,max}: min copies, then a right-recursive star (unbounded) or a chain of optionals.
void GrammarBuilder::lower_repeat(const Expr& expr, Sequence& out, const std::string& owner) {
  if (expr.max < expr.min) throw std::invalid_argument("repetition {" + std::to_string(expr.min) + "," +
                                                       std::to_string(expr.max) + "} in '" + owner + "'");
  if (expr.max == 0) return;
  const std::int32_t item = lower_single(expr.items[0], owner);
  out.insert(out.end(), expr.min, item);
  if (expr.max == expr.min) return;
  if (expr.max == Expr::kUnbounded) {
    const std::uint32_t star = add_rule(owner + "#" + std::to_string(grammar_.rules_.size()));
    define_alternatives(star, {{item, static_cast<std::int32_t>(star)}, {}});
    out.push_back(static_cast<std::int32_t>(star));
    return;
  }
  std::int32_t tail = -1;  // the optional after this one (none for the last)
  for (std::uint32_t i = expr.min; i < expr.max; ++i) {
    const std::uint32_t optional_rule = add_rule(owner + "#" + std::to_string(grammar_.rules_.size()));
    Sequence present = {item};
    if (tail >= 0) present.push_back(tail);
    define_alternatives(optional_rule, {present, {}});
    tail = static_cast<std::int32_t>(optional_rule);
  }
  out.push_back(tail);
}

namespace {

// Rules that derive the empty string, and rules that derive some finite string.
std::vector<bool> fixed_point(const Grammar& g, bool nullable_only) {
  std::vector<bool> holds(g.rule_count(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < g.rule_count(); ++r) {
      if (holds[r]) continue;
      for (std::int32_t pos : g.alternatives(static_cast<std::int32_t>(r))) {
        bool all = true;
        for (std::int32_t e; (e = g.element(pos)) != Grammar::kEnd; ++pos) {
          if (Grammar::is_bytes(e) ? nullable_only : !holds[static_cast<std::size_t>(e)]) all = false;
        }
        if (all) holds[r] = changed = true;
      }
    }
  }
  return holds;
}

// A rule reachable from itself before any byte is consumed, or -1.
std::int32_t left_recursive_rule(const Grammar& g, const std::vector<bool>& nullable) {
  std::vector<std::vector<std::int32_t>> left_calls(g.rule_count());
  for (std::size_t r = 0; r < g.rule_count(); ++r) {
    for (std::int32_t pos : g.alternatives(static_cast<std::int32_t>(r))) {
      for (std::int32_t e; (e = g.element(pos)) != Grammar::kEnd && !Grammar::is_bytes(e); ++pos) {
        left_calls[r].push_back(e);
        if (!nullable[static_cast<std::size_t>(e)]) break;
      }
    }
  }
  // Depth-first search with an explicit stack (grammars may chain thousands of rules).
  std::vector<int> color(g.rule_count(), 0);  // 0 unseen, 1 on the path, 2 done
  for (std::size_t start = 0; start < g.rule_count(); ++start) {
    if (color[start] != 0) continue;
    std::vector<std::pair<std::int32_t, std::size_t>> path = {{static_cast<std::int32_t>(start), 0}};
    color[start] = 1;
    while (!path.empty()) {
      auto& [rule, next_call] = path.back();
      const std::vector<std::int32_t>& calls = left_calls[static_cast<std::size_t>(rule)];
      if (next_call == calls.size()) {
        color[static_cast<std::size_t>(rule)] = 2;
        path.pop_back();
        continue;
      }
      const std::int32_t callee = calls[next_call++];
      if (color[static_cast<std::size_t>(callee)] == 1) return callee;
      if (color[static_cast<std::size_t>(callee)] == 0) {
        color[static_cast<std::size_t>(callee)] = 1;
        path.emplace_back(callee, 0);
      }
    }
  }
  return -1;
}

}  // namespace

namespace {

std::int32_t capped_sum(std::int64_t a, std::int64_t b, std::int32_t cap) {
  return static_cast<std::int32_t>(std::min<std::int64_t>(a + b, cap));
}

// The shortest length of every rule (cap for a rule that never completes).
std::vector<std::int32_t> rule_distances(const Grammar& g, std::int32_t cap) {
  struct Alternative {
    std::int32_t rule;
    std::int32_t length;   // bytes, plus the final lengths of the rules counted so far
    std::int32_t pending;  // rule references whose length is not final yet
  };
  std::vector<Alternative> alts;
  std::vector<std::vector<std::size_t>> used_by(g.rule_count());  // alternatives, once per reference
  using Candidate = std::pair<std::int32_t, std::int32_t>;        // (length, rule)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  for (std::size_t r = 0; r < g.rule_count(); ++r) {
    for (std::int32_t pos : g.alternatives(static_cast<std::int32_t>(r))) {
      Alternative a{.rule = static_cast<std::int32_t>(r), .length = 0, .pending = 0};
      for (std::int32_t e; (e = g.element(pos)) != Grammar::kEnd; ++pos) {
        if (Grammar::is_bytes(e)) {
          a.length = capped_sum(a.length, 1, cap);
        } else {
          ++a.pending;
          used_by[static_cast<std::size_t>(e)].push_back(alts.size());
        }
      }
      if (a.pending == 0) candidates.emplace(a.length, a.rule);
      alts.push_back(a);
    }
  }
  std::vector<std::int32_t> shortest(g.rule_count(), cap);
  std::vector<bool> final(g.rule_count(), false);
  while (!candidates.empty()) {
    const auto [length, rule] = candidates.top();
    candidates.pop();
    if (final[static_cast<std::size_t>(rule)]) continue;
    final[static_cast<std::size_t>(rule)] = true;
    shortest[static_cast<std::size_t>(rule)] = length;
    for (std::size_t i : used_by[static_cast<std::size_t>(rule)]) {
      Alternative& a = alts[i];
      a.length = capped_sum(a.length, length, cap);
      if (--a.pending == 0) candidates.emplace(a.length, a.rule);
    }
  }
  return shortest;
}

}  // namespace

namespace {

// Rules in an order where each comes after the rules it calls before consuming a byte (the
// left calls, acyclic once build() has refused left recursion); depth-first, explicit stack.
std::vector<std::int32_t> left_call_order(const Grammar& g, const std::vector<bool>& nullable) {
  std::vector<std::int32_t> order;
  std::vector<bool> placed(g.rule_count(), false);
  for (std::size_t start = 0; start < g.rule_count(); ++start) {
    if (placed[start]) continue;
    std::vector<std::pair<std::int32_t, bool>> work = {{static_cast<std::int32_t>(start), false}};
    while (!work.empty()) {
      const auto [rule, callees_done] = work.back();
      work.pop_back();
      if (placed[static_cast<std::size_t>(rule)]) continue;
      if (callees_done) {
        placed[static_cast<std::size_t>(rule)] = true;
        order.push_back(rule);
        continue;
      }
      work.emplace_back(rule, true);
      for (std::int32_t pos : g.alternatives(rule))
        for (std::int32_t e; (e = g.element(pos)) != Grammar::kEnd && !Grammar::is_bytes(e); ++pos) {
          if (!placed[static_cast<std::size_t>(e)]) work.emplace_back(e, false);
          if (!nullable[static_cast<std::size_t>(e)]) break;
        }
    }
  }
  return order;
}

}  // namespace

std::int64_t widest_closure(const Grammar& g, std::int64_t cap) {
  const std::vector<bool> nullable = fixed_point(g, true);
  const auto add = [cap](std::int64_t a, std::int64_t b) { return std::min(a + b, cap + 1); };
  // The nodes entered from a position up to its alternative's end or first byte class.
  std::vector<std::int64_t> rule_cost(g.rule_count(), 0);
  const auto from = [&](std::int32_t pos) {
    std::int64_t cost = 1;
    for (std::int32_t e; (e = g.element(pos)) != Grammar::kEnd && !Grammar::is_bytes(e); ++pos) {
      cost = add(cost, rule_cost[static_cast<std::size_t>(e)]);
      if (!nullable[static_cast<std::size_t>(e)]) break;
      cost = add(cost, 1);  // the next position's node
    }
    return cost;
  };
  for (std::int32_t rule : left_call_order(g, nullable))
    for (std::int32_t pos : g.alternatives(rule))
      rule_cost[static_cast<std::size_t>(rule)] = add(rule_cost[static_cast<std::size_t>(rule)], from(pos));
  // Every position, from each alternative's end back (a nullable call adds what follows it).
  std::int64_t widest = 0;
  for (std::size_t r = 0; r < g.rule_count(); ++r) {
    for (std::int32_t start : g.alternatives(static_cast<std::int32_t>(r))) {
      std::int32_t end = start;
      while (g.element(end) != Grammar::kEnd) ++end;
      std::int64_t after = 1;  // the end node
      for (std::int32_t pos = end - 1; pos >= start; --pos) {
        const std::int32_t e = g.element(pos);
        after = Grammar::is_bytes(e) ? 1
                : add(add(1, rule_cost[static_cast<std::size_t>(e)]), nullable[static_cast<std::size_t>(e)] ? after : 0);
        widest = std::max(widest, after);
      }
    }
  }
  return widest;
}

std::vector<std::int32_t> position_distances(const Grammar& g, std::int32_t cap) {
  const std::vector<std::int32_t> shortest = rule_distances(g, cap);
  std::vector<std::int32_t> distance(g.element_count(), 0);
  for (std::size_t r = 0; r < g.rule_count(); ++r) {
    for (std::int32_t start : g.alternatives(static_cast<std::int32_t>(r))) {
      std::int32_t end = start;
      while (g.element(end) != Grammar::kEnd) ++end;
      for (std::int32_t pos = end - 1; pos >= start; --pos) {
        const std::int32_t e = g.element(pos);
        const std::int32_t length = Grammar::is_bytes(e) ? 1 : shortest[static_cast<std::size_t>(e)];
        distance[static_cast<std::size_t>(pos)] = capped_sum(length, distance[static_cast<std::size_t>(pos + 1)], cap);
      }
    }
  }
  return distance;
}

Grammar GrammarBuilder::build(std::uint32_t root) && {
  Grammar& g = grammar_;
  g.root_ = static_cast<std::int32_t>(root);
  for (const Grammar::Rule& r : g.rules_)
    if (!r.defined) throw std::invalid_argument("rule '" + r.name + "' is used but not defined");
  for (const ByteClass& c : g.classes_)
    if (c.empty()) throw std::invalid_argument("a character class matches nothing");
  const std::vector<bool> completes = fixed_point(g, false);
  for (std::size_t r = 0; r < g.rule_count(); ++r)
    if (!completes[r]) throw std::invalid_argument("rule '" + g.rules_[r].name + "' can never complete");
  const std::int32_t recursive = left_recursive_rule(g, fixed_point(g, true));
  if (recursive >= 0) throw std::invalid_argument("rule '" + g.rules_[static_cast<std::size_t>(recursive)].name +
                                                  "' is left-recursive (or repeats something that can be empty)");
  return std::move(g);
}

}  // namespace flexh2o::grammar
