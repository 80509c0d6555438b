// The block header decoders (wire/block_header.h) on arbitrary bytes and an arbitrary block
// capacity: what a torn write, a foreign writer or a hostile sender leaves in a receiver block.
// Input: 4 bytes of payload capacity (LE), then the 16 header bytes (shorter inputs are padded
// with zeros), then anything: the header bytes and what follows are also read as a whole unit
// (a record, or a packed unit of records). Invariants:
//   - decoding succeeds only for version 1, known flags, a matching check word and a payload that
//     fits; a failure names one of those reasons, a success reports kNone;
//   - a decoded header re-encodes to exactly the 16 bytes it came from;
//   - every header with known flags round-trips through encode -> decode;
//   - a packed header decodes only as version 2 with a matching check word, at least two
//     records, a length that is a multiple of 8, holds a header per record and fits; it
//     re-encodes to the same 16 bytes; every packed header round-trips;
//   - the unit walker never yields a record outside the unit, yields at most the records the unit
//     declares (one unless packed), each in order of position, packed records on 8-byte steps
//     inside the declared length; a void record never comes alone;
//   - packet_distance is the inverse of adding a 31-bit distance, across the 2^32 wrap.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

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

  // The same 16 bytes as a packed unit's header.
  if (auto p = wire::decode_packed_header(raw, capacity, &why)) {
    FUZZ_CHECK(why == wire::HeaderError::kNone && std::to_integer<uint8_t>(raw[0]) == wire::kPackedVersion);
    FUZZ_CHECK(p->records >= 2 && p->length <= capacity && p->length % wire::kRecordAlign == 0);
    FUZZ_CHECK(uint64_t(p->length) >= wire::kPackedHeaderSize + uint64_t(p->records) * wire::kBlockHeaderSize);
    std::array<std::byte, wire::kPackedHeaderSize> again;
    wire::encode_packed_header(*p, again);
    FUZZ_CHECK(again == raw);
  }
  wire::PackedHeader ph{std::max<uint32_t>(2, mine.packet), mine.payload_length};
  std::array<std::byte, wire::kPackedHeaderSize> packed;
  wire::encode_packed_header(ph, packed);
  if (auto back_p = wire::decode_packed_header(packed, ~0u)) FUZZ_CHECK(*back_p == ph);

  // Header and everything after it as a unit, as a protocol hands it to the stream layer.
  std::vector<std::byte> unit(raw.begin(), raw.end());
  if (size > in.size())
    unit.insert(unit.end(), reinterpret_cast<const std::byte*>(data) + in.size(),
                reinterpret_cast<const std::byte*>(data) + size);
  wire::UnitReader reader(unit);
  uint32_t items = 0;
  const std::byte* last_end = unit.data();
  for (wire::UnitReader::Item it; reader.next(&it); ++items) {
    FUZZ_CHECK(it.index == items);
    FUZZ_CHECK(it.payload.data() >= last_end && it.payload.data() + it.payload.size() <= unit.data() + unit.size());
    FUZZ_CHECK(it.payload.size() == it.header.payload_length);
    if (reader.packed()) {
      FUZZ_CHECK((it.payload.data() - unit.data() - wire::kBlockHeaderSize) % wire::kRecordAlign == 0);
    } else {
      FUZZ_CHECK(!it.header.is_void() && it.payload.data() == unit.data() + wire::kBlockHeaderSize);
    }
    last_end = it.payload.data() + it.payload.size();
  }
  FUZZ_CHECK(items <= reader.declared());
  if (!reader.packed()) FUZZ_CHECK(items <= 1);
  if (!reader.bad()) FUZZ_CHECK(items == reader.declared());

  // Wrap-around distance: any packet within 2^31 of the expected one is found again.
  const auto distance = static_cast<int32_t>(mine.payload_length);
  FUZZ_CHECK(wire::packet_distance(mine.packet, mine.packet + uint32_t(distance)) == distance);
  return 0;
}
