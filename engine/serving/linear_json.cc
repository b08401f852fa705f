#include "engine/serving/linear_json.h"

#include <stdexcept>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/io/json_input.h"

namespace flexh2o::serving {

namespace {

using Json = nlohmann::ordered_json;
// ordered_json's object is a vector of members underneath: appending to it directly skips
// the scan ordered_map::operator[] makes for the key.
using Members = Json::object_t::Container;

// nlohmann's SAX interface, building an ordered_json. Open containers are held by their
// object_t / array_t, which stay where they are when their parent's vector moves its nodes.
class LinearBuilder {
 public:
  explicit LinearBuilder(Json& root) : root_(root) {}

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(Json::number_float_t v, const std::string&) { return put(Json(v)); }
  bool string(std::string& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }

  bool start_object(std::size_t) {
    Json& j = place(Json::object());
    open_.push_back({&static_cast<Members&>(j.get_ref<Json::object_t&>()), nullptr, {}});
    return true;
  }
  bool key(std::string& k) {
    Open& o = open_.back();
    if (!o.keys.insert(k).second) {
      repeated_key_ = std::move(k);
      repeated_ = true;
      return false;
    }
    o.members->emplace_back(std::move(k), Json());
    return true;
  }
  bool end_object() {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    Json& j = place(Json::array());
    open_.push_back({nullptr, &j.get_ref<Json::array_t&>(), {}});
    return true;
  }
  bool end_array() {
    open_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    parser_message_ = e.what();
    return false;
  }

  // Why parsing stopped (after sax_parse returned false).
  std::string failure() const {
    if (repeated_)
      return "the key \"" + engine::bounded_excerpt(repeated_key_, 64) + "\" appears twice in one object";
    return "not valid JSON: " + engine::bounded_excerpt(parser_message_, 2 * engine::kJsonExcerptChars);
  }

 private:
  struct Open {
    Members* members;     // an open object (its last member awaits its value), or
    Json::array_t* items; // an open array
    std::unordered_set<std::string> keys;
  };

  // Where the next value goes: the open object's last key, the open array's end, or the root.
  Json& place(Json v) {
    if (open_.empty()) return root_ = std::move(v);
    Open& o = open_.back();
    if (o.members) return o.members->back().second = std::move(v);
    return o.items->emplace_back(std::move(v));
  }
  bool put(Json v) {
    place(std::move(v));
    return true;
  }

  Json& root_;
  std::vector<Open> open_;
  bool repeated_ = false;
  std::string repeated_key_;
  std::string parser_message_;
};

}  // namespace

Json parse_linear_json(std::string_view text, const std::string& where) {
  engine::check_json_depth(text, where);
  Json root;
  LinearBuilder builder(root);
  if (!Json::sax_parse(text, &builder)) throw std::runtime_error(where + ": " + builder.failure());
  return root;
}

}  // namespace flexh2o::serving
