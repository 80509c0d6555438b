// How a message is cut into DDP segments, one per datagram: each carries its byte offset (TO for tagged
// operations, MO for untagged ones; RFC 5041 §5), and the last one is flagged L — so the target can
// place every segment on its own, in any order (patent: "multiple datagrams comprise a single message,
// and they are recombined at the receiver"). Shared by the sender (`send --transport udp`, sender.cc) and
// the preload shim's large datagrams (shim/send.cc). Pure; header only.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram {

// Calls emit(header, offset, length) for each segment of a `length`-byte message of at most `max_payload`
// bytes each, h.offset and h.last set; an empty message is one empty last segment. Stops at, and returns
// false on, the first emit that returns false.
template <class Emit>
bool for_each_segment(SegmentHeader h, uint64_t length, uint64_t max_payload, Emit&& emit) {
  uint64_t off = 0;
  do {
    const uint64_t n = std::min(max_payload, length - off);
    h.offset = off;
    h.last = off + n == length;
    if (!emit(h, off, n)) return false;
    off += n;
  } while (off < length);
  return true;
}

// Segments of a `length`-byte message (at least one).
inline uint64_t segment_count(uint64_t length, uint64_t max_payload) {
  return length == 0 ? 1 : (length + max_payload - 1) / max_payload;
}

}  // namespace slotstream::dgram
