#include "engine/runtime/prefill_fork.h"

#include <stdexcept>
#include <string>

namespace flexh2o::engine {

void check_shared_prompts(const GenerationRequest& req) {
  const auto& seqs = req.sequences;
  if (!seqs.empty() && seqs[0].shares_prompt) throw std::invalid_argument("prompt 0 has no prompt before it to share");
  for (std::size_t b = 1; b < seqs.size(); ++b)
    if (seqs[b].shares_prompt &&
        (seqs[b].prompt != seqs[b - 1].prompt || new_tokens_limit(req, b) != new_tokens_limit(req, b - 1)))
      throw std::invalid_argument("prompt " + std::to_string(b) +
                                  " shares the prefill of the one before it but differs from it in its tokens or "
                                  "its new tokens limit");
}

std::int64_t shared_prompt_run(const GenerationRequest& req, std::size_t first) {
  std::size_t end = first + 1;
  while (end < req.sequences.size() && req.sequences[end].shares_prompt) ++end;
  return static_cast<std::int64_t>(end - first);
}

std::int64_t KvCopyBytes::total() const { return read[0] + read[1] + read[2]; }

void KvCopyBytes::add(const KvCopyBytes& o) {
  for (std::size_t t = 0; t < read.size(); ++t) {
    read[t] += o.read[t];
    written[t] += o.written[t];
  }
}

void KvCopies::add(const KvCopies& o) {
  prefixes.add(o.prefixes);
  forks.add(o.forks);
}

std::int64_t KvHeld::total() const { return bytes[0] + bytes[1] + bytes[2]; }

std::int64_t KvHeld::total_without() const { return bytes_without[0] + bytes_without[1] + bytes_without[2]; }

void KvHeld::add(const KvHeld& o) {
  prefixes += o.prefixes;
  rows += o.rows;
  fills += o.fills;
  for (std::size_t t = 0; t < bytes.size(); ++t) {
    pools[t] += o.pools[t];
    bytes[t] += o.bytes[t];
    bytes_without[t] += o.bytes_without[t];
  }
}

KvCopyBytes fork_slot(offload::Tiers& tiers, offload::Staging& staging, const offload::CopyOptions& opts,
                      std::span<const std::int64_t> layers, const ForkSlot& from, const ForkSlot& to,
                      const ForkExtent& e) {
  // The same bytes of each kv head's slots, at the same offsets in the other row.
  const std::int64_t head_bytes = e.capacity * e.slot_bytes;
  const offload::RowBands bands{0, e.evicting ? head_bytes : e.tokens * e.slot_bytes, e.n_kv_heads, head_bytes};
  KvCopyBytes moved;
  for (const std::int64_t layer : layers) {
    const auto l = static_cast<std::size_t>(layer);
    from.batch->cache_stored[l].wait();  // the prefill's write-back
    to.batch->cache_stored[l].wait();    // the slot's last one
    auto pieces = from.batch->k[l]->pieces(from.seq, from.seq + 1, to.batch->k[l]->place(to.seq), false, bands);
    const auto v = from.batch->v[l]->pieces(from.seq, from.seq + 1, to.batch->v[l]->place(to.seq), false, bands);
    pieces.insert(pieces.end(), v.begin(), v.end());
    offload::copy_pieces_now(tiers, pieces, staging, opts);
    for (const offload::CopyPiece& p : pieces) {
      moved.read[static_cast<std::size_t>(p.src.tier)] += p.total();
      moved.written[static_cast<std::size_t>(p.dst.tier)] += p.total();
    }
    if (e.evicting) to.batch->eviction[l]->copy_sequence(*from.batch->eviction[l], from.seq, to.seq);
  }
  return moved;
}

}  // namespace flexh2o::engine
