#include "engine/ucx/session/admission.h"

#include <algorithm>

namespace slotstream::session {

std::optional<uint64_t> Admission::victim() const {
  // The tier to take from: connections that have not spoken, if there are any.
  const bool any_silent =
      std::any_of(pending_.begin(), pending_.end(), [](const auto& kv) { return !kv.second.spoke; });
  std::map<std::string, size_t> per_source;
  for (const auto& [id, p] : pending_) {
    if (p.spoke != any_silent) ++per_source[p.source];
  }
  // Of that tier, the address with the most connections; its oldest (ties: the oldest overall).
  std::optional<uint64_t> out;
  size_t most = 0;
  for (const auto& [id, p] : pending_) {  // oldest first
    if (p.spoke == any_silent) continue;
    if (const size_t n = per_source[p.source]; n > most) {
      most = n;
      out = id;
    }
  }
  return out;
}

std::optional<uint64_t> Admission::arrive(uint64_t id, const std::string& source, const HasSpoken& has_spoken) {
  std::optional<uint64_t> evict;
  if (pending_.size() >= kMaxUnauthenticated) {
    // Each candidate found to have spoken moves up a tier, so this ends within the budget's size.
    for (evict = victim(); has_spoken && !pending_.at(*evict).spoke && has_spoken(*evict); evict = victim()) {
      pending_.at(*evict).spoke = true;
    }
    pending_.erase(*evict);
  }
  pending_[id] = Pending{source};
  return evict;
}

void Admission::spoke(uint64_t id) {
  if (auto it = pending_.find(id); it != pending_.end()) it->second.spoke = true;
}

std::optional<std::string> Admission::authenticate(uint64_t id) {
  if (!pending_.contains(id)) return "this connection was closed to make room for others";
  pending_.erase(id);
  if (authenticated_.size() >= kMaxAuthenticated) {
    return "receiver busy: " + std::to_string(kMaxAuthenticated) + " senders are connected, try again later";
  }
  authenticated_.insert(id);
  return std::nullopt;
}

void Admission::ended(uint64_t id) {
  pending_.erase(id);
  authenticated_.erase(id);
}

}  // namespace slotstream::session
