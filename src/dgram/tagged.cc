#include "dgram/tagged.h"

#include <climits>

namespace slotstream::dgram {

void TaggedTarget::add_region(uint32_t stag, uint64_t length) { regions_[stag] = Region{length, std::nullopt, 0}; }

Placed TaggedTarget::write_record(uint32_t stag, uint32_t msn, uint64_t offset, std::span<const std::byte> payload,
                                  bool last, int64_t now_ns, std::vector<Completion>* out) {
  auto it = regions_.find(stag);
  if (it == regions_.end()) return Placed::kUnknownKey;
  Region& r = it->second;
  if (msn < r.floor) return Placed::kStale;
  if (r.active && msn < r.active->msn()) return Placed::kStale;
  if (r.active && msn > r.active->msn()) {
    // Patent: only one MSN active per (source, STag); the newer message takes the memory.
    out->push_back(r.active->finish(stag, Outcome::kRetired, now_ns));
    r.active.reset();
  }
  if (!r.active) {
    r.active.emplace(msn, now_ns, now_ns + timeout_ns_);
    r.floor = msn;
  }
  Placed p = r.active->place(offset, payload, last, r.length);
  if ((p == Placed::kPlaced || p == Placed::kDuplicate) && r.active->complete()) {
    out->push_back(r.active->finish(stag, Outcome::kComplete, now_ns));
    r.active.reset();
    r.floor = msn + 1;
    return Placed::kCompleted;
  }
  return p;
}

Placed TaggedTarget::write(uint32_t stag, uint64_t offset, std::span<const std::byte> payload, int64_t now_ns) {
  auto it = regions_.find(stag);
  if (it == regions_.end()) return Placed::kUnknownKey;
  Region& r = it->second;
  // No MSN, no timer: the reliable stream orders the write before its notification.
  if (!r.active) r.active.emplace(0, now_ns, INT64_MAX);
  Placed p = r.active->place(offset, payload, /*last=*/false, r.length);
  return p == Placed::kDuplicate ? Placed::kPlaced : p;
}

std::optional<Completion> TaggedTarget::take_written(uint32_t stag, uint32_t msn, uint64_t length, int64_t now_ns) {
  auto it = regions_.find(stag);
  if (it == regions_.end() || length > it->second.length) return std::nullopt;
  Region& r = it->second;
  if (!r.active) r.active.emplace(msn, now_ns, INT64_MAX);  // a zero-length message writes nothing
  Completion c = r.active->finish(stag, Outcome::kComplete, now_ns);
  r.active.reset();
  if (!c.valid.covers(length) || c.valid.end() > length) return std::nullopt;
  c.msn = msn;
  c.length = length;
  c.length_known = true;
  c.data.set_size(length);
  return c;
}

void TaggedTarget::expire(int64_t now_ns, std::vector<Completion>* out) {
  for (auto& [stag, r] : regions_) {
    if (r.active && r.active->deadline_ns() <= now_ns) {
      const uint32_t msn = r.active->msn();
      out->push_back(r.active->finish(stag, Outcome::kIncomplete, now_ns));
      r.active.reset();
      r.floor = msn + 1;
    }
  }
}

int64_t TaggedTarget::next_deadline() const {
  int64_t d = INT64_MAX;
  for (const auto& [_, r] : regions_) {
    if (r.active && r.active->deadline_ns() < d) d = r.active->deadline_ns();
  }
  return d;
}

size_t TaggedTarget::outstanding() const {
  size_t n = 0;
  for (const auto& [_, r] : regions_) n += r.active.has_value();
  return n;
}

}  // namespace slotstream::dgram
