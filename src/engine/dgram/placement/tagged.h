// The target side of the tagged operations: registered regions named by STags, RDMA
// Write-Record into them (with its record of valid bytes), and plain RDMA Write (the RC baseline).
//
// RDMA Write-Record (patent, "RDMA Write-Record" and "Packet Loss Design Considerations"):
//   - a segment is placed at its tagged offset in the STag's region as it arrives, in any order;
//     the target records which bytes are valid (a RangeSet) — no receive is posted, no reply sent;
//   - segments are told apart by (source, STag, MSN): "we only store state information for
//     currently active operations", one message per (source, STag) at a time; "when a message
//     segment arrives with an MSN greater than that of another outstanding operation on that
//     STag/IP/port, we discard the previous message and do not deliver it" (Outcome::kRetired);
//   - a message completes when its is_last segment has arrived and every byte before it is
//     valid, or its timer, "started upon the first reception of a message segment", fires
//     (Outcome::kIncomplete: the consumer decides to keep it as a partial message or drop it).
//
// One TaggedTarget serves one source (a session), so the source is implied. STags are declared
// as ranges (no memory); a region's bookkeeping appears with the first segment written to it, and
// its memory is allocated when a message starts and handed to the consumer with its completion (a
// user-space stack has no NIC memory to keep pinned). Timers: UD messages are given up `timeout`
// after their first segment (the patent's rule); over the reliable services (RD, RC) every segment
// comes, so there the timer measures silence instead (idle mode: restarted by every new byte), and
// extend_all() holds it while the receiver itself keeps the sender back. Threading: one thread (the
// receiver's network thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "engine/dgram/placement/placement.h"

namespace slotstream::dgram {

// The STags of a tagged session (Write-Record, RC): device i of the hello's list owns the ring
// first + i * ring .. first + i * ring + ring - 1, and message `msn` of it goes to STag
// first + i * ring + msn % ring — so ACCEPT names only `first`, whatever the device count.
inline uint32_t stag_of(uint32_t first, size_t index, uint32_t ring, uint32_t msn) {
  return first + uint32_t(index * ring + msn % ring);
}

class StagRings {
 public:
  StagRings(std::span<const uint16_t> devices, uint32_t first, uint32_t ring)
      : devices_(devices.begin(), devices.end()),
        first_(first),
        ring_(ring) {}
  // The device that owns `stag`, if any.
  std::optional<uint16_t> device_of(uint32_t stag) const;
  uint32_t first() const { return first_; }
  uint32_t count() const { return uint32_t(devices_.size() * ring_); }

 private:
  std::vector<uint16_t> devices_;
  uint32_t first_, ring_;
};

class TaggedTarget {
 public:
  explicit TaggedTarget(int64_t timeout_ns, bool idle = false) : timeout_ns_(timeout_ns), idle_(idle) {}

  // Declares STags first .. first + count - 1, each a region of `length` bytes. Nothing is allocated.
  void add_regions(uint32_t first, uint32_t count, uint64_t length);
  void add_region(uint32_t stag, uint64_t length) { add_regions(stag, 1, length); }

  // RDMA Write-Record segment. Completions (this message's, or a retired older one's) are
  // appended to *out.
  Placed write_record(uint32_t stag, uint32_t msn, uint64_t offset, std::span<const std::byte> payload, bool last,
                      int64_t now_ns, std::vector<Completion>* out);
  // Plain RDMA Write segment (RC): placed, nothing recorded for the consumer; the Send that
  // follows it on the same reliable stream says the data is there (take_written).
  Placed write(uint32_t stag, uint64_t offset, std::span<const std::byte> payload, int64_t now_ns);
  // The RC notification: the region's first `length` bytes are message `msn`.
  std::optional<Completion> take_written(uint32_t stag, uint32_t msn, uint64_t length, int64_t now_ns);

  // Ends every message whose timer has fired (Outcome::kIncomplete).
  void expire(int64_t now_ns, std::vector<Completion>* out);
  // Moves every running timer to at least `deadline_ns`.
  void extend_all(int64_t deadline_ns);
  int64_t next_deadline() const;  // INT64_MAX when nothing is outstanding
  size_t outstanding() const;
  // STags that have had a segment (each keeps a small record: the region's bookkeeping).
  size_t touched() const { return regions_.size(); }

 private:
  struct Region {
    uint64_t length = 0;
    std::optional<Assembly> active;
    uint32_t floor = 0;  // every MSN below it is finished on this STag: later segments are stale
  };
  struct Declared {
    uint32_t first, count;
    uint64_t length;
  };
  // The region of a declared STag, made on first use; nullptr if the STag was never declared.
  Region* region(uint32_t stag);
  void start_timer(Assembly& a, int64_t now_ns) const;

  int64_t timeout_ns_;
  bool idle_;
  std::vector<Declared> declared_;
  std::map<uint32_t, Region> regions_;
};

}  // namespace slotstream::dgram
