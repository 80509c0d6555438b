// The header at the start of every data block (sender block and receiver block alike).
//
//   byte  0        1        2        3        4        5        6        7
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     0 | version| flags  |  device (u16 LE) |      packet number (u32 LE)       |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//     8 |      payload length (u32 LE)      |   check = ~(w0 ^ w1 ^ w2) (u32)   |
//       +--------+--------+--------+--------+--------+--------+--------+--------+
//    16 | payload ...
//
// w0, w1, w2 are the little-endian u32 words at bytes 0, 4 and 8.
//
// The paper (§3.2.1, Table 2) puts 1 byte of device number and 2 bytes of packet number in a
// block's "data status section". We widen both — 65,536 devices instead of 256, and a 32-bit
// per-device packet number so that the wrap-around is far outside any reorder window — and add
// what the paper leaves implicit: payload length (blocks are fixed-size, payloads are not),
// fragment flags (a frame larger than a block spans consecutive packets), a version and a
// check word that catches a torn or garbage header. All integers are little-endian on every
// platform. Unknown versions are rejected: no silent forward compatibility.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace slotstream::wire {

inline constexpr uint8_t kBlockHeaderVersion = 1;
inline constexpr size_t kBlockHeaderSize = 16;

enum BlockFlags : uint8_t {
  kFirstFragment = 1u << 0,  // this packet starts a message
  kLastFragment = 1u << 1,   // this packet ends a message (both set: a one-block message)
};
inline constexpr uint8_t kKnownFlags = kFirstFragment | kLastFragment;

struct BlockHeader {
  uint8_t flags = 0;
  uint16_t device = 0;
  uint32_t packet = 0;  // per device, wraps at 2^32
  uint32_t payload_length = 0;

  bool first() const { return flags & kFirstFragment; }
  bool last() const { return flags & kLastFragment; }
  bool operator==(const BlockHeader&) const = default;
};

void encode_block_header(const BlockHeader& h, std::span<std::byte, kBlockHeaderSize> out);

enum class HeaderError { kNone, kVersion, kFlags, kCheck, kLength };
// Decodes and validates against the block's payload capacity. nullopt + reason on failure.
std::optional<BlockHeader> decode_block_header(std::span<const std::byte, kBlockHeaderSize> in, size_t payload_capacity,
                                               HeaderError* why = nullptr);
const char* header_error_name(HeaderError e);

// Signed distance from `expected` to `packet` in wrap-around arithmetic (RFC 1982 style).
inline int64_t packet_distance(uint32_t expected, uint32_t packet) { return static_cast<int32_t>(packet - expected); }

}  // namespace slotstream::wire
