// Constrained decoding costs with SmolLM2's 49152-token vocabulary (tests/data/tokenizers):
// grammar compile time per schema (tests/data/grammar/json_schema_cases.json and three
// extraction-style schemas below; median, max), and the token mask's time per decode step
// while feeding the tokens of valid outputs: cold (first sequence of a job: every state's mask
// computed) and warm (later sequences: states seen before cost a copy).
#include <fmt/format.h>

#include <fstream>
#include <random>

#include "bench/timing.h"
#include "engine/grammar/constraint.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using flexh2o::grammar::CompiledGrammar;
using flexh2o::grammar::Constraint;
using flexh2o::grammar::ConstraintCache;
using flexh2o::grammar::Matcher;
using flexh2o::grammar::TokenTrie;
using flexh2o::grammar::Vocabulary;
using Json = nlohmann::ordered_json;

// Each token's bytes (decode of the token alone: exact for byte-level BPE); special tokens
// decode to nothing and are control tokens; EOS stops.
Vocabulary smollm2_vocabulary(const flexh2o::engine::Tokenizer& tokenizer) {
  Vocabulary v;
  for (std::int32_t id = 0; id < tokenizer.vocab_size(); ++id) v.token_bytes.push_back(tokenizer.decode(std::span(&id, 1)));
  if (tokenizer.eos_id()) v.stop_tokens.push_back(*tokenizer.eos_id());
  return v;
}

const char* kInvoice = R"({"type":"object","properties":{
  "invoice_number":{"type":"string","pattern":"^INV-[0-9]{4,8}$"},
  "date":{"type":"string","format":"date"},
  "vendor":{"type":"object","properties":{"name":{"type":"string","maxLength":60},"email":{"type":"string","format":"email"},
            "country":{"enum":["US","DE","FR","JP","other"]}},"required":["name","country"],"additionalProperties":false},
  "lines":{"type":"array","minItems":1,"maxItems":20,"items":{"type":"object","properties":{
      "description":{"type":"string"},"quantity":{"type":"integer","minimum":1,"maximum":10000},
      "unit_price":{"type":"number","minimum":0}},"required":["description","quantity","unit_price"],"additionalProperties":false}},
  "paid":{"type":"boolean"},"notes":{"type":["string","null"]}},
  "required":["invoice_number","date","vendor","lines","paid"],"additionalProperties":false})";
const char* kTree = R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string"},
  "weight":{"type":"number"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["label"]}},
  "$ref":"#/$defs/node"})";
const char* kPeople = R"({"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},
  "age":{"type":"integer","minimum":0,"maximum":150},"role":{"anyOf":[{"const":"admin"},{"const":"user"},{"type":"null"}]},
  "tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":5}},"required":["name","age","role"]}})";

struct Workload {
  const char* name;
  Constraint constraint;
  std::vector<std::string> outputs;  // valid outputs, fed token by token
};

std::vector<Workload> workloads() {
  return {
      {"invoice schema", {.kind = Constraint::Kind::JsonSchema, .text = kInvoice},
       {R"({"invoice_number":"INV-20240117","date":"2024-01-17","vendor":{"name":"Acme Tools GmbH","email":"billing@acme.de","country":"DE"},"lines":[{"description":"Hammer, 500 g","quantity":12,"unit_price":9.5},{"description":"Nails, box of 200","quantity":40,"unit_price":2.25}],"paid":false,"notes":null})",
        "{\n  \"invoice_number\": \"INV-0042\",\n  \"date\": \"2023-11-30\",\n  \"vendor\": {\n    \"name\": \"Tanaka Shoji\",\n    \"country\": \"JP\"\n  },\n  \"lines\": [\n    {\n      \"description\": \"Consulting, November\",\n      \"quantity\": 1,\n      \"unit_price\": 4800\n    }\n  ],\n  \"paid\": true,\n  \"notes\": \"Paid by wire transfer on 2023-12-05.\"\n}"}},
      {"recursive tree", {.kind = Constraint::Kind::JsonSchema, .text = kTree},
       {R"({"label":"root","weight":1.0,"children":[{"label":"a","children":[{"label":"a1","weight":0.25}]},{"label":"b","weight":3}]})",
        R"({"label":"top","children":[{"label":"left","children":[{"label":"leaf","weight":-2.5e-3,"children":[]}]},{"label":"right"}]})"}},
      {"people array", {.kind = Constraint::Kind::JsonSchema, .text = kPeople},
       {R"([{"name":"Ada Lovelace","age":36,"role":"admin","tags":["math","engines"]},{"name":"Alan","age":41,"role":null}])",
        R"([{"name":"Grace Hopper","age":85,"role":"user","tags":["cobol","navy","compilers"]},{"name":"Edsger","age":72,"role":"user","tags":[]}])"}},
      {"json_object", {.kind = Constraint::Kind::JsonObject},
       {R"({"title":"A short story","words":1200,"genres":["fantasy","adventure"],"rating":4.5,"published":true,"sequel":null})",
        R"({"city":"Lyon","population":522250,"districts":[{"n":1,"name":"Presqu'île"},{"n":2,"name":"Confluence"}],"metro":true})"}},
  };
}

struct StepTimes {
  std::vector<double> seconds;
  double mean() const {
    double s = 0;
    for (double x : seconds) s += x;
    return s / static_cast<double>(seconds.size());
  }
};

// One output fed token by token: the mask of each step, then the token.
void feed(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<std::int32_t>& tokens, StepTimes& times) {
  Matcher matcher(g);
  std::vector<std::uint64_t> mask(flexh2o::grammar::mask_words(g->trie().vocab_size()));
  for (std::int32_t token : tokens) {
    times.seconds.push_back(flexh2o::bench::seconds_of([&] { matcher.fill_mask(mask); }));
    if (!flexh2o::grammar::mask_allows(mask, token) || !matcher.accept_token(token))
      throw std::runtime_error("a token of a valid output is masked");
  }
  if (!matcher.is_complete()) throw std::runtime_error("a valid output is incomplete");
}

void bench_compile(const std::shared_ptr<const TokenTrie>& trie) {
  std::ifstream in(std::string(FLEXH2O_SOURCE_DIR) + "/tests/data/grammar/json_schema_cases.json");
  std::vector<std::string> schemas;
  const Json cases = Json::parse(in);
  for (const Json& c : cases["cases"]) schemas.push_back(c["schema"].dump());
  for (const char* s : {kInvoice, kTree, kPeople}) schemas.push_back(s);
  std::vector<double> compile, first_mask;
  std::vector<std::uint64_t> mask(flexh2o::grammar::mask_words(trie->vocab_size()));
  for (const std::string& schema : schemas) {
    ConstraintCache cache(trie);
    std::shared_ptr<const CompiledGrammar> g;
    compile.push_back(flexh2o::bench::seconds_of([&] { g = cache.get({.kind = Constraint::Kind::JsonSchema, .text = schema}); }));
    first_mask.push_back(flexh2o::bench::seconds_of([&] { g->fill_mask(g->initial_state(), mask); }));
  }
  fmt::print("compile, {} schemas: grammar median {:.3f} ms, max {:.3f} ms; first mask median {:.3f} ms, max {:.3f} ms\n",
             schemas.size(), 1e3 * flexh2o::bench::median(compile), 1e3 * *std::max_element(compile.begin(), compile.end()),
             1e3 * flexh2o::bench::median(first_mask), 1e3 * *std::max_element(first_mask.begin(), first_mask.end()));
}

}  // namespace

int main() {
  const auto tokenizer = flexh2o::engine::load_hf_tokenizer(std::string(FLEXH2O_SOURCE_DIR) + "/tests/data/tokenizers/smollm2/tokenizer.json");
  auto trie = std::make_shared<const TokenTrie>(smollm2_vocabulary(*tokenizer));
  fmt::print("vocabulary {} tokens, trie {} nodes\n", trie->vocab_size(), trie->node_count());
  bench_compile(trie);
  fmt::print("{:<16} {:>6} {:>12} {:>12} {:>12} {:>8}\n", "workload", "steps", "cold mean us", "cold max us", "warm mean us", "states");
  for (const Workload& w : workloads()) {
    ConstraintCache cache(trie);
    const auto g = cache.get(w.constraint);
    StepTimes cold, warm;
    feed(g, tokenizer->encode(w.outputs[0], false), cold);
    feed(g, tokenizer->encode(w.outputs[1], false), warm);  // other text: new states still cold
    StepTimes warm_again;
    for (int r = 0; r < 5; ++r) feed(g, tokenizer->encode(w.outputs[r % 2], false), warm_again);
    fmt::print("{:<16} {:>6} {:>12.1f} {:>12.1f} {:>12.2f} {:>8}   (2nd text {:.1f} us)\n", w.name, cold.seconds.size(),
               1e6 * cold.mean(), 1e6 * *std::max_element(cold.seconds.begin(), cold.seconds.end()), 1e6 * warm_again.mean(),
               g->state_count(), 1e6 * warm.mean());
  }
  return 0;
}
