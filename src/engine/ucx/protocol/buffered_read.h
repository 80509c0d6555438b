// Buffered read (seeds/buffered-read-protocol-thesis.txt, "Buffered Read"): the status-byte idea
// turned around. The *sender* is passive: it keeps a ring in memory the receiver can reach, copies
// each record in behind a length and advances its `tail` — no network operation on the send path.
// The *receiver* pulls: it reads the sender's tail until it moves, then fetches the whole new span
// [read pointer, tail) with one RDMA get (two where it passes the end of the ring), so reads batch
// by themselves. It frees records in any order; its `head` advances over the freed prefix and is
// written back into the sender's ring now and then, not per record: when a quarter of the ring is
// free again, or when the sender says (a flag next to its tail) that it waits for the head.
//
//   sender ring (UCX-allocated)                        receiver (mirrored local copy)
//   [tail][head][ e e e e e e ..... ]   <== get tail    read_pointer, cached tail, head
//     ^ sender    ^ receiver writes     <== get span    records served from the local copy
//
// Passivity: on shared memory the receiver's gets and head writes are done by the receiver's CPU
// alone (the ring is UCX-allocated, UCX-NOTES). Over tcp UCX emulates them in software, so the
// sender's worker must be progressed: its sending thread sleeps on the worker's event fd while
// idle (Descriptor::sender_wakeup) and progresses it every kProgressEvery records while busy.
#pragma once

#include <cstdint>
#include <deque>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

// The sender's ring as both sides see it (the wire format of this protocol). Positions are byte
// counters that never wrap (u64); position p lies at data offset p % capacity.
//
//   sender region, allocated by UCX and handed to the receiver in SETUP:
//     offset   0  u64 tail   written by the sender: every entry before it is complete
//     offset   8  u64 wait   written by the sender: 1 while it waits for the head (ring full, or
//                            finishing), else 0 — read with the tail, one 16-byte get
//     offset  64  u64 head   written by the receiver: every entry before it is free again
//     offset 128  data       `capacity` bytes of entries (capacity is a multiple of 8)
//   entry at position p (p is a multiple of 8):
//     u32 record length | u32 check = low 32 bits of p | record | pad to a multiple of 8
//     The record goes on at data offset 0 where it passes the end of the data; the 8-byte
//     prefix never does (p and capacity are multiples of 8).
//   SETUP bytes: u8 version (kRingVersion) | u64 region address | u64 capacity | u32 n | n bytes
//     packed rkey. Unknown versions are rejected.
// Everything little-endian; tail and head are 8-byte aligned and written whole.
struct RingLayout {
  static constexpr uint8_t kRingVersion = 1;
  static constexpr uint64_t kTailOffset = 0;
  static constexpr uint64_t kWaitOffset = 8;   // next to the tail: both come with one read
  static constexpr uint64_t kHeadOffset = 64;  // its own cache line: written by the other side
  static constexpr uint64_t kDataOffset = 128;
  static constexpr uint64_t kPrefix = 8;

  // Ring bytes one record of `record_length` bytes takes.
  static uint64_t entry_size(uint64_t record_length) { return kPrefix + (record_length + 7) / 8 * 8; }
  // Room for `blocks` entries of the largest record (one block): as many full-size records in
  // flight as a block protocol has, and any number of smaller ones packed back to back.
  static uint64_t capacity(const Geometry& g) { return uint64_t(g.blocks) * entry_size(g.block_size); }

  struct Piece {
    uint64_t offset = 0;  // data offset in [0, capacity)
    uint64_t length = 0;
  };
  // The pieces of the data area that `length` bytes from position `pos` occupy: one, or two
  // where they pass the end. Returns how many (0 for length 0). `length` <= capacity.
  static int split(uint64_t capacity, uint64_t pos, uint64_t length, Piece out[2]);
};

// The receiver's frees, which come in any order (the stream layer releases by device): entries are
// kept in ring order and the head advances over the freed prefix only (the thesis keeps "the same
// linked list structure we used in the buffered write connection"; a deque indexed by id here).
// Pure logic, unit-tested.
class ReleaseTracker {
 public:
  struct Entry {
    uint64_t pos = 0;     // ring position of the entry (its prefix)
    uint32_t size = 0;    // ring bytes it takes (RingLayout::entry_size)
    uint32_t length = 0;  // record bytes
    bool released = false;
  };

  // Appends an entry of `size` ring bytes at end(); returns its id (0, 1, 2, ... in ring order).
  uint64_t push(uint32_t size, uint32_t length);
  // Frees entry `id`; the head moves over every freed entry at the front. False, and nothing
  // changes, when `id` is not outstanding (never pushed, or already freed).
  bool release(uint64_t id);
  // Ring position before which everything is free.
  uint64_t head() const { return head_; }
  // Ring position after the last entry pushed.
  uint64_t end() const { return end_; }
  // Entries pushed and not yet passed by the head (freed ones behind a busy one included).
  size_t outstanding() const { return entries_.size(); }
  uint64_t first_id() const { return first_id_; }
  // An outstanding entry: first_id() <= id < first_id() + outstanding().
  const Entry& entry(uint64_t id) const { return entries_[id - first_id_]; }

 private:
  std::deque<Entry> entries_;
  uint64_t first_id_ = 0;
  uint64_t head_ = 0;
  uint64_t end_ = 0;
};

extern const Descriptor kBufferedRead;

}  // namespace slotstream::protocol
