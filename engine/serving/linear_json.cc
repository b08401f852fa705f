#include "engine/serving/linear_json.h"

#include <optional>
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
  LinearBuilder(Json& root, IdArray* ids) : root_(root), ids_(ids) {}

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return put_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return put_integer(v); }
  bool number_float(Json::number_float_t v, const std::string&) { return put(Json(v)); }
  bool string(std::string& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }

  bool start_object(std::size_t) {
    Json& j = place(Json::object());
    open_.push_back({&static_cast<Members&>(j.get_ref<Json::object_t&>()), nullptr, false, {}});
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
    const bool ids = at_id_path();
    Json& j = place(Json::array());
    open_.push_back({nullptr, &j.get_ref<Json::array_t&>(), ids, {}});
    if (ids) ids_->found = true;
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
    bool ids;             // the array IdArray reads
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

  bool at_id_path() const {
    if (!ids_ || ids_->found || open_.size() != ids_->path.size()) return false;
    for (std::size_t i = 0; i < open_.size(); ++i)
      if (!open_[i].members || open_[i].members->empty() || open_[i].members->back().first != ids_->path[i])
        return false;
    return true;
  }
  // An id goes to the IdArray; any other item of its array stays in the value.
  template <typename Integer>
  bool put_integer(Integer v) {
    if (!open_.empty() && open_.back().ids && std::in_range<std::int32_t>(v) && std::cmp_greater_equal(v, 0)) {
      ids_->ids.push_back(static_cast<std::int32_t>(v));
      return true;
    }
    return put(Json(v));
  }

  Json& root_;
  IdArray* ids_;
  std::vector<Open> open_;
  bool repeated_ = false;
  std::string repeated_key_;
  std::string parser_message_;
};

}  // namespace

Json parse_linear_json(std::string_view text, const std::string& where, IdArray* ids) {
  engine::check_json_depth(text, where);
  Json root;
  LinearBuilder builder(root, ids);
  if (!Json::sax_parse(text, &builder)) throw std::runtime_error(where + ": " + builder.failure());
  return root;
}

namespace {

// A SAX handler that builds nothing and notes the root object's keys equal to `key`.
class KeyFinder {
 public:
  explicit KeyFinder(const std::string& key) : key_(key) {}
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(Json::number_integer_t) { return true; }
  bool number_unsigned(Json::number_unsigned_t) { return true; }
  bool number_float(Json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(Json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    root_is_object_ = root_is_object_ || depth_ == 0;
    ++depth_;
    return true;
  }
  bool key(std::string& k) {
    found_ = found_ || (depth_ == 1 && k == key_);
    return true;
  }
  bool end_object() { return leave(); }
  bool start_array(std::size_t) {
    ++depth_;
    return true;
  }
  bool end_array() { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
  bool root_is_object() const { return root_is_object_; }
  bool found() const { return found_; }

 private:
  bool leave() {
    --depth_;
    return true;
  }

  const std::string& key_;
  int depth_ = 0;
  bool root_is_object_ = false, found_ = false;
};

}  // namespace

std::optional<bool> object_has_key(std::string_view text, const std::string& key) {
  KeyFinder finder(key);
  try {
    engine::check_json_depth(text, "");
  } catch (const std::runtime_error&) {
    return std::nullopt;
  }
  if (!Json::sax_parse(text, &finder) || !finder.root_is_object()) return std::nullopt;
  return finder.found();
}

}  // namespace flexh2o::serving
