// The block header decoder (wire/block_header.h) on arbitrary 16 bytes and an arbitrary block
// capacity: what a torn write, a foreign writer or a hostile sender leaves in a receiver block.
// Input: 4 bytes of payload capacity (LE), then the 16 header bytes (shorter inputs are padded
// with zeros). Invariants:
//   - decoding succeeds only for version 1, known flags, a matching check word and a payload that
//     fits; a failure names one of those reasons, a success reports kNone;
//   - a decoded header re-encodes to exactly the 16 bytes it came from;
//   - every header with known flags round-trips through encode -> decode;
//   - packet_distance is the inverse of adding a 31-bit distance, across the 2^32 wrap.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "check.h"
#include "wire/block_header.h"

namespace wire = slotstream::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::array<uint8_t, 4 + wire::kBlockHeaderSize> in{};
  std::memcpy(in.data(), data, size < in.size() ? size : in.size());
  uint32_t capacity = uint32_t(in[0]) | uint32_t(in[1]) << 8 | uint32_t(in[2]) << 16 | uint32_t(in[3]) << 24;
  std::array<std::byte, wire::kBlockHeaderSize> raw;
  std::memcpy(raw.data(), in.data() + 4, raw.size());

  wire::HeaderError why = wire::HeaderError::kNone;
  auto h = wire::decode_block_header(raw, capacity, &why);
  FUZZ_CHECK(wire::header_error_name(why) != nullptr);
  if (h) {
    FUZZ_CHECK(why == wire::HeaderError::kNone);
    FUZZ_CHECK(std::to_integer<uint8_t>(raw[0]) == wire::kBlockHeaderVersion);
    FUZZ_CHECK((h->flags & ~wire::kKnownFlags) == 0);
    FUZZ_CHECK(h->payload_length <= capacity);
    std::array<std::byte, wire::kBlockHeaderSize> again;
    wire::encode_block_header(*h, again);
    FUZZ_CHECK(again == raw);
  } else {
    FUZZ_CHECK(why != wire::HeaderError::kNone);
    if (std::to_integer<uint8_t>(raw[0]) != wire::kBlockHeaderVersion) FUZZ_CHECK(why == wire::HeaderError::kVersion);
  }

  // The same bytes read as a header to encode: it must come back unchanged.
  wire::BlockHeader mine;
  mine.flags = std::to_integer<uint8_t>(raw[1]) & wire::kKnownFlags;
  std::memcpy(&mine.device, raw.data() + 2, 2);
  std::memcpy(&mine.packet, raw.data() + 4, 4);
  std::memcpy(&mine.payload_length, raw.data() + 8, 4);
  std::array<std::byte, wire::kBlockHeaderSize> encoded;
  wire::encode_block_header(mine, encoded);
  auto back = wire::decode_block_header(encoded, mine.payload_length, &why);
  FUZZ_CHECK(back && *back == mine);
  if (mine.payload_length > 0) FUZZ_CHECK(!wire::decode_block_header(encoded, mine.payload_length - 1));

  // Wrap-around distance: any packet within 2^31 of the expected one is found again.
  const auto distance = static_cast<int32_t>(mine.payload_length);
  FUZZ_CHECK(wire::packet_distance(mine.packet, mine.packet + uint32_t(distance)) == distance);
  return 0;
}
