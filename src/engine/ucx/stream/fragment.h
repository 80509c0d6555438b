// Splitting a message over consecutive packets of one device (sender) — pure arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>

#include "wire/block_header.h"

namespace slotstream::stream {

struct Fragment {
  uint64_t offset = 0;  // into the message
  uint32_t length = 0;
  uint8_t flags = 0;  // wire::kFirstFragment | wire::kLastFragment
};

// A message of `length` bytes needs this many packets of at most `capacity` payload bytes.
// An empty message still takes one packet (first and last at once).
inline uint64_t fragment_count(uint64_t length, uint32_t capacity) {
  return length == 0 ? 1 : (length + capacity - 1) / capacity;
}

inline Fragment fragment_at(uint64_t length, uint32_t capacity, uint64_t i) {
  Fragment f;
  f.offset = i * capacity;
  f.length = static_cast<uint32_t>(std::min<uint64_t>(capacity, length - std::min(length, f.offset)));
  uint64_t n = fragment_count(length, capacity);
  f.flags = (i == 0 ? wire::kFirstFragment : 0) | (i + 1 == n ? wire::kLastFragment : 0);
  return f;
}

}  // namespace slotstream::stream
