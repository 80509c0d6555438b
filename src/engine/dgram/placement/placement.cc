#include "engine/dgram/placement/placement.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace slotstream::dgram {

Buffer::Buffer(size_t capacity) : capacity_(capacity) {
  // calloc(0) may return nullptr; keep a valid pointer for empty messages.
  p_.reset(static_cast<std::byte*>(std::calloc(capacity ? capacity : 1, 1)));
  if (!p_) throw std::bad_alloc();
}

uint64_t RangeSet::add(uint64_t offset, uint64_t length) {
  if (length == 0) return 0;
  const uint64_t end = offset + length;
  // Segments mostly arrive in order: extend or append at the back.
  if (ranges_.empty() || offset > ranges_.back().end()) {
    ranges_.push_back({offset, length});
    bytes_ += length;
    return length;
  }
  // First range that ends at or after `offset` (touching ranges merge).
  auto first = std::lower_bound(ranges_.begin(), ranges_.end(), offset,
                                [](const Range& r, uint64_t off) { return r.end() < off; });
  // One past the last range that starts at or before `end`.
  auto last = std::upper_bound(first, ranges_.end(), end, [](uint64_t e, const Range& r) { return e < r.offset; });
  if (first == last) {
    ranges_.insert(first, {offset, length});
    bytes_ += length;
    return length;
  }
  uint64_t covered = 0;
  for (auto it = first; it != last; ++it) {
    const uint64_t lo = std::max(it->offset, offset), hi = std::min(it->end(), end);
    if (hi > lo) covered += hi - lo;
  }
  const uint64_t lo = std::min(first->offset, offset);
  const uint64_t hi = std::max(std::prev(last)->end(), end);
  *first = {lo, hi - lo};
  ranges_.erase(first + 1, last);
  bytes_ += length - covered;
  return length - covered;
}

bool RangeSet::covers(uint64_t end) const {
  if (end == 0) return true;
  return !ranges_.empty() && ranges_.front().offset == 0 && ranges_.front().end() >= end;
}

Placed Assembly::place(uint64_t offset, std::span<const std::byte> payload, bool last, uint64_t capacity) {
  const uint64_t end = offset + payload.size();
  if (end < offset || end > capacity) return Placed::kOutOfBounds;
  // A segment past the known end, or a second "last" that disagrees, cannot belong here.
  if (length_known_ && (end > length_ || (last && end != length_))) return Placed::kOutOfBounds;
  if (last && !length_known_ && end < valid_.end()) return Placed::kOutOfBounds;
  if (last) {
    length_known_ = true;
    length_ = end;
  }
  if (data_.capacity() < capacity) data_ = Buffer(capacity);
  // First writer wins: copy only the bytes not there yet, and tell a duplicate that differs.
  uint64_t fresh = 0;
  valid_.for_each_missing(offset, payload.size(), [&](uint64_t at, uint64_t n) {
    std::memcpy(data_.data() + at, payload.data() + (at - offset), n);
    fresh += n;
  });
  if (fresh == 0 && !payload.empty()) {
    bool differs = false;
    valid_.for_each_present(offset, payload.size(), [&](uint64_t at, uint64_t n) {
      differs = differs || std::memcmp(data_.data() + at, payload.data() + (at - offset), n) != 0;
    });
    return differs ? Placed::kConflict : Placed::kDuplicate;
  }
  valid_.add(offset, payload.size());
  return Placed::kPlaced;
}

Completion Assembly::finish(uint32_t key, Outcome outcome, int64_t now_ns) {
  Completion c;
  c.key = key;
  c.msn = msn_;
  c.outcome = outcome;
  c.length_known = length_known_;
  c.length = length_known_ ? length_ : valid_.end();
  c.valid = std::move(valid_);
  if (data_.capacity() < c.length) data_ = Buffer(c.length);  // nothing was placed (an empty message)
  data_.set_size(c.length);
  c.data = std::move(data_);
  c.first_ns = first_ns_;
  c.done_ns = now_ns;
  return c;
}

}  // namespace slotstream::dgram
