#include "session/admission.h"

#include <algorithm>

namespace slotstream::session {

std::optional<uint64_t> Admission::victim(const std::string* from) const {
  std::optional<uint64_t> oldest_with_hello;
  for (const auto& [id, p] : pending_) {  // oldest first
    if (from && p.source != *from) continue;
    if (!p.said_hello) return id;
    if (!oldest_with_hello) oldest_with_hello = id;
  }
  return oldest_with_hello;
}

std::optional<uint64_t> Admission::arrive(uint64_t id, const std::string& source) {
  const auto from_source = size_t(std::count_if(pending_.begin(), pending_.end(),
                                                 [&](const auto& kv) { return kv.second.source == source; }));
  std::optional<uint64_t> evict;
  if (from_source >= kMaxUnauthenticatedPerSource) {
    evict = victim(&source);
  } else if (pending_.size() >= kMaxUnauthenticated) {
    evict = victim(nullptr);
  }
  if (evict) pending_.erase(*evict);
  pending_[id] = Pending{source};
  return evict;
}

void Admission::said_hello(uint64_t id) {
  if (auto it = pending_.find(id); it != pending_.end()) it->second.said_hello = true;
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
