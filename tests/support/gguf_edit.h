#pragma once
// A GGUF header with one metadata key replaced (or removed), for tests of bad metadata.

#include <optional>
#include <string>

#include "engine/loaders/gguf_file.h"

namespace flexh2o::testing {

// `value` nullopt: the key is removed.
inline engine::GgufHeader with_metadata(engine::GgufHeader h, const std::string& key,
                                        const std::optional<engine::GgufValue>& value) {
  if (value)
    h.metadata[key] = *value;
  else
    h.metadata.erase(key);
  return h;
}

}  // namespace flexh2o::testing
