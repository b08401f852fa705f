// The KV traffic a run reports (engine::KvReads, KvCopies, KvHeld): as --metrics JSON, read
// back from it (a rank's part), and as the report's lines on stderr.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/runtime/block_executor.h"

namespace flexh2o::serving {

// The KV cache bytes the attention read (engine::KvReads) over `steps` steps, as --metrics has
// them: in all, the mean per step, and per tier what was attended in place and what was staged
// through the cache ring.
nlohmann::json kv_reads_json(const engine::KvReads& r, std::int64_t steps);
engine::KvReads kv_reads_from_json(const nlohmann::json& j);
// "KV read: X per step (gpu A in place | cpu B staged | ...), Y over S steps"
std::string kv_reads_text(const engine::KvReads& r, std::int64_t steps);

// The KV bytes row copies moved (engine::KvCopies), as --metrics has them: for the shared
// prefixes and for the forked prefills, the total and per tier the bytes read and written.
nlohmann::json kv_copies_json(const engine::KvCopies& c);
engine::KvCopies kv_copies_from_json(const nlohmann::json& j);
// "KV copied: X for shared prefixes (gpu A read, B written | ...), Y for forked prefills\n",
// or "" when nothing was copied.
std::string kv_copies_text(const engine::KvCopies& c);
// The KV cache held with prefixes held once (engine::KvHeld), as --metrics and stderr have it.
nlohmann::json kv_held_json(const engine::KvHeld& h);
engine::KvHeld kv_held_from_json(const nlohmann::json& j);
std::string kv_held_text(const engine::KvHeld& h);

}  // namespace flexh2o::serving
