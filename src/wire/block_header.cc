#include "wire/block_header.h"

#include <bit>
#include <cstring>

#include "wire/codec.h"

namespace slotstream::wire {
namespace {

// The header's four little-endian words, read at once (the receiver decodes every record).
struct Words {
  uint32_t w[4];
};
Words words(const std::byte* p) {
  Words out;
  std::memcpy(out.w, p, sizeof out.w);
  if constexpr (std::endian::native == std::endian::big) {
    for (uint32_t& v : out.w) v = __builtin_bswap32(v);
  }
  return out;
}

uint32_t check_word(const std::byte* p) {
  const Words x = words(p);
  return ~(x.w[0] ^ x.w[1] ^ x.w[2]);
}

}  // namespace

void encode_block_header(const BlockHeader& h, std::span<std::byte, kBlockHeaderSize> out) {
  std::byte* p = out.data();
  p[0] = static_cast<std::byte>(kBlockHeaderVersion);
  p[1] = static_cast<std::byte>(h.flags);
  put_le(p + 2, h.device, 2);
  put_le(p + 4, h.packet, 4);
  put_le(p + 8, h.payload_length, 4);
  put_le(p + 12, check_word(p), 4);
}

std::optional<BlockHeader> decode_block_header(std::span<const std::byte, kBlockHeaderSize> in, size_t payload_capacity,
                                               HeaderError* why) {
  const Words x = words(in.data());
  auto fail = [&](HeaderError e) -> std::optional<BlockHeader> {
    if (why) *why = e;
    return std::nullopt;
  };
  if ((x.w[0] & 0xFF) != kBlockHeaderVersion) return fail(HeaderError::kVersion);
  if (x.w[3] != ~(x.w[0] ^ x.w[1] ^ x.w[2])) return fail(HeaderError::kCheck);
  BlockHeader h;
  h.flags = uint8_t(x.w[0] >> 8);
  if (h.flags & ~kKnownFlags) return fail(HeaderError::kFlags);
  h.device = uint16_t(x.w[0] >> 16);
  h.packet = x.w[1];
  h.payload_length = x.w[2];
  if (h.payload_length > payload_capacity) return fail(HeaderError::kLength);
  if (why) *why = HeaderError::kNone;
  return h;
}

void encode_packed_header(const PackedHeader& h, std::span<std::byte, kPackedHeaderSize> out) {
  std::byte* p = out.data();
  p[0] = static_cast<std::byte>(kPackedVersion);
  p[1] = std::byte{0};
  put_le(p + 2, 0, 2);
  put_le(p + 4, h.records, 4);
  put_le(p + 8, h.length, 4);
  put_le(p + 12, check_word(p), 4);
}

std::optional<PackedHeader> decode_packed_header(std::span<const std::byte, kPackedHeaderSize> in, size_t capacity,
                                                 HeaderError* why) {
  const std::byte* p = in.data();
  auto fail = [&](HeaderError e) -> std::optional<PackedHeader> {
    if (why) *why = e;
    return std::nullopt;
  };
  if (std::to_integer<uint8_t>(p[0]) != kPackedVersion) return fail(HeaderError::kVersion);
  if (static_cast<uint32_t>(get_le(p + 12, 4)) != check_word(p)) return fail(HeaderError::kCheck);
  if (std::to_integer<uint8_t>(p[1]) != 0 || get_le(p + 2, 2) != 0) return fail(HeaderError::kFlags);
  PackedHeader h;
  h.records = static_cast<uint32_t>(get_le(p + 4, 4));
  h.length = static_cast<uint32_t>(get_le(p + 8, 4));
  if (h.records < 2) return fail(HeaderError::kCount);
  const uint64_t least = kPackedHeaderSize + uint64_t(h.records) * kBlockHeaderSize;
  if (h.length > capacity || h.length < least || h.length % kRecordAlign != 0) return fail(HeaderError::kLength);
  if (why) *why = HeaderError::kNone;
  return h;
}

const char* header_error_name(HeaderError e) {
  switch (e) {
    case HeaderError::kNone:
      return "none";
    case HeaderError::kVersion:
      return "unknown header version";
    case HeaderError::kFlags:
      return "unknown flags";
    case HeaderError::kCheck:
      return "check word mismatch";
    case HeaderError::kLength:
      return "payload length exceeds block";
    case HeaderError::kCount:
      return "record count does not match the unit";
  }
  return "?";
}

UnitReader::UnitReader(std::span<const std::byte> unit) : rest_(unit) {
  if (unit.size() >= kPackedHeaderSize && std::to_integer<uint8_t>(unit[0]) == kPackedVersion) {
    auto h = decode_packed_header(unit.first<kPackedHeaderSize>(), unit.size(), &error_);
    if (!h) {
      bad_ = true;
      return;
    }
    packed_ = true;
    declared_ = left_ = h->records;
    rest_ = unit.subspan(kPackedHeaderSize, h->length - kPackedHeaderSize);
    return;
  }
  declared_ = left_ = 1;
}

bool UnitReader::next(Item* out) {
  if (bad_ || left_ == 0) return false;
  auto fail = [&](HeaderError e) {
    bad_ = true;
    error_ = e;
    return false;
  };
  if (rest_.size() < kBlockHeaderSize) return fail(HeaderError::kLength);
  auto h = decode_block_header(rest_.first<kBlockHeaderSize>(), rest_.size() - kBlockHeaderSize, &error_);
  if (!h) return fail(error_);
  // A single record is the whole unit (a void one is only meaningful packed: it is refused alone).
  if (!packed_ && h->is_void()) return fail(HeaderError::kFlags);
  out->header = *h;
  out->payload = rest_.subspan(kBlockHeaderSize, h->payload_length);
  out->index = index_++;
  --left_;
  if (packed_) {
    const size_t size = packed_record_size(h->payload_length);
    if (size > rest_.size()) return fail(HeaderError::kLength);
    rest_ = rest_.subspan(size);
    // The count and the length must end together: a unit that does not add up is refused from here.
    if ((left_ == 0) != rest_.empty()) return fail(HeaderError::kCount);
  }
  return true;
}

}  // namespace slotstream::wire
