// Direct data placement bookkeeping shared by the tagged (Write-Record) and untagged (Send)
// targets: which bytes of a message have arrived (a set of ranges), the message being put
// together, and the completion entry handed to the consumer.
//
// Patent ("Packet Loss Design Considerations"): completions carry "the STag, offsets and length
// ... required to determine the valid areas of memory"; "the length of the message is determined
// while the communication is outstanding by tracking an accumulator variable for that operation
// corresponding to the lengths of all of the segments written into memory", and its total is
// known only when the is_last segment arrives. Threading: plain values, no locking.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

namespace slotstream::dgram {

// Disjoint, sorted, non-adjacent byte ranges [offset, offset + length).
class RangeSet {
 public:
  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t end() const { return offset + length; }
    bool operator==(const Range&) const = default;
  };
  // Adds a range; returns how many of its bytes were not valid before (0: a duplicate).
  uint64_t add(uint64_t offset, uint64_t length);
  // Calls fn(offset, length) for each part of [offset, offset + length) that is not valid yet, in order.
  template <class Fn>
  void for_each_missing(uint64_t offset, uint64_t length, Fn&& fn) const;
  // Calls fn(offset, length) for each part of [offset, offset + length) that is already valid.
  template <class Fn>
  void for_each_present(uint64_t offset, uint64_t length, Fn&& fn) const;
  // True if [0, end) is entirely valid.
  bool covers(uint64_t end) const;
  uint64_t bytes() const { return bytes_; }
  uint64_t end() const { return ranges_.empty() ? 0 : ranges_.back().end(); }
  const std::vector<Range>& ranges() const { return ranges_; }
  bool empty() const { return ranges_.empty(); }

 private:
  std::vector<Range> ranges_;
  uint64_t bytes_ = 0;
};

template <class Fn>
void RangeSet::for_each_missing(uint64_t offset, uint64_t length, Fn&& fn) const {
  uint64_t at = offset;
  const uint64_t end = offset + length;
  for (const Range& r : ranges_) {
    if (r.end() <= at) continue;
    if (r.offset >= end) break;
    if (r.offset > at) fn(at, r.offset - at);
    at = r.end();
    if (at >= end) return;
  }
  if (at < end) fn(at, end - at);
}

template <class Fn>
void RangeSet::for_each_present(uint64_t offset, uint64_t length, Fn&& fn) const {
  const uint64_t end = offset + length;
  for (const Range& r : ranges_) {
    if (r.end() <= offset) continue;
    if (r.offset >= end) break;
    const uint64_t lo = std::max(r.offset, offset), hi = std::min(r.end(), end);
    fn(lo, hi - lo);
  }
}

// A zero-filled byte buffer of fixed capacity from calloc: a large one comes from the kernel as untouched
// zero pages, so a region the size of the largest message costs only the pages a message writes (a
// growing std::vector would zero, copy and fault it over and over: ~90 ms stalls at 50 MB). Only at
// first: once such a buffer is freed, glibc serves the next ones from its heap and zeroes them in full
// (still ~20x cheaper than fresh pages here: 40 us against 900 us for 900 KB). So a partial message
// may hold its whole capacity — which is what the receiver charged the session for (recv/handshake.h).
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t capacity);
  std::byte* data() { return p_.get(); }
  const std::byte* data() const { return p_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  void set_size(size_t n) { size_ = n <= capacity_ ? n : capacity_; }
  std::byte& operator[](size_t i) { return p_.get()[i]; }
  const std::byte& operator[](size_t i) const { return p_.get()[i]; }
  const std::byte* begin() const { return data(); }
  const std::byte* end() const { return data() + size_; }
  operator std::span<const std::byte>() const { return {data(), size_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> p_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

enum class Outcome {
  kComplete,    // every byte up to the last segment's end arrived
  kIncomplete,  // the message's timer fired first (patent: "or the timeout value for that DDP message reaches zero")
  kRetired,     // a newer MSN for the same (source, STag) arrived first; its bytes would be overwritten
};

// One completion queue entry: a message as the consumer gets it.
struct Completion {
  uint32_t key = 0;  // STag (tagged) or queue number (untagged)
  uint32_t msn = 0;
  Outcome outcome = Outcome::kComplete;
  bool length_known = false;  // the last segment arrived
  uint64_t length = 0;        // message length if known, else the end of the highest valid byte
  RangeSet valid;
  Buffer data;           // `length` bytes; bytes outside `valid` are zero
  int64_t first_ns = 0;  // first segment's arrival
  int64_t done_ns = 0;
};

enum class Placed {
  kPlaced,       // new bytes placed; the message is not complete yet
  kCompleted,    // this segment completed the message (its completion was emitted)
  kDuplicate,    // every byte was already valid
  kConflict,     // every byte was already valid, and some differ: the first writer's bytes stay
  kStale,        // the message was already completed, timed out or retired
  kUnknownKey,   // no such STag / queue
  kOutOfBounds,  // beyond the region, or past the message's known end
  kNoBuffer,     // untagged: no receive posted (receiver not ready)
  kMalformed,    // not a segment this placement takes (e.g. RC's notice of the wrong length)
};

// A message being placed.
class Assembly {
 public:
  Assembly(uint32_t msn, int64_t now_ns, int64_t deadline_ns)
      : msn_(msn),
        first_ns_(now_ns),
        deadline_ns_(deadline_ns) {}
  // Places a segment of a message that may be at most `capacity` bytes long. Only bytes not yet
  // valid are written: a later segment with different bytes for the same offsets (a forged or
  // corrupted duplicate) never replaces what arrived first.
  Placed place(uint64_t offset, std::span<const std::byte> payload, bool last, uint64_t capacity);
  bool complete() const { return length_known_ && valid_.covers(length_); }
  Completion finish(uint32_t key, Outcome outcome, int64_t now_ns);
  uint32_t msn() const { return msn_; }
  int64_t deadline_ns() const { return deadline_ns_; }
  // Moves the timer to at least `deadline_ns` (reliable services: the timer measures silence).
  void extend_deadline(int64_t deadline_ns) { deadline_ns_ = std::max(deadline_ns_, deadline_ns); }

 private:
  uint32_t msn_;
  int64_t first_ns_;
  int64_t deadline_ns_;
  bool length_known_ = false;
  uint64_t length_ = 0;
  RangeSet valid_;
  Buffer data_;  // allocated at the first segment, the region's (message's) capacity
};

}  // namespace slotstream::dgram
