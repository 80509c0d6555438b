#include "engine/dgram/placement/tagged.h"

#include <climits>

namespace slotstream::dgram {

std::optional<uint16_t> StagRings::device_of(uint32_t stag) const {
  if (stag < first_) return std::nullopt;
  const uint64_t i = (uint64_t(stag) - first_) / ring_;
  if (i >= devices_.size()) return std::nullopt;
  return devices_[i];
}

void TaggedTarget::add_regions(uint32_t first, uint32_t count, uint64_t length) {
  declared_.push_back({first, count, length});
}

TaggedTarget::Region* TaggedTarget::region(uint32_t stag) {
  if (auto it = regions_.find(stag); it != regions_.end()) return &it->second;
  for (const Declared& d : declared_) {
    if (stag >= d.first && stag - d.first < d.count)
      return &regions_.emplace(stag, Region{d.length, std::nullopt, 0}).first->second;
  }
  return nullptr;
}

void TaggedTarget::start_timer(Assembly& a, int64_t now_ns) const {
  if (idle_) a.extend_deadline(now_ns + timeout_ns_);
}

Placed TaggedTarget::write_record(uint32_t stag, uint32_t msn, uint64_t offset, std::span<const std::byte> payload,
                                  bool last, int64_t now_ns, std::vector<Completion>* out) {
  Region* rp = region(stag);
  if (!rp) return Placed::kUnknownKey;
  Region& r = *rp;
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
  if (p == Placed::kPlaced) start_timer(*r.active, now_ns);
  if ((p == Placed::kPlaced || p == Placed::kDuplicate || p == Placed::kConflict) && r.active->complete()) {
    out->push_back(r.active->finish(stag, Outcome::kComplete, now_ns));
    r.active.reset();
    r.floor = msn + 1;
    return Placed::kCompleted;
  }
  return p;
}

Placed TaggedTarget::write(uint32_t stag, uint64_t offset, std::span<const std::byte> payload, int64_t now_ns) {
  Region* rp = region(stag);
  if (!rp) return Placed::kUnknownKey;
  Region& r = *rp;
  // No MSN: the reliable stream orders the write before its notification.
  if (!r.active) r.active.emplace(0, now_ns, now_ns + timeout_ns_);
  Placed p = r.active->place(offset, payload, /*last=*/false, r.length);
  if (p == Placed::kPlaced) start_timer(*r.active, now_ns);
  return p == Placed::kDuplicate || p == Placed::kConflict ? Placed::kPlaced : p;
}

std::optional<Completion> TaggedTarget::take_written(uint32_t stag, uint32_t msn, uint64_t length, int64_t now_ns) {
  Region* rp = region(stag);
  if (!rp || length > rp->length) return std::nullopt;
  Region& r = *rp;
  if (!r.active) r.active.emplace(msn, now_ns, now_ns + timeout_ns_);  // a zero-length message writes nothing
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

void TaggedTarget::extend_all(int64_t deadline_ns) {
  for (auto& [_, r] : regions_) {
    if (r.active) r.active->extend_deadline(deadline_ns);
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
