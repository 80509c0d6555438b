#include "wire/block_header.h"

#include <bit>
#include <cstring>

namespace slotstream::wire {
namespace {

// The header's four little-endian words, read at once (the receiver decodes every record).
struct Words {
  uint32_t w[4];
};
// Little-endian bytes to native words, and back (the same swap either way; none on little-endian hosts).
void swap_if_big_endian(Words& x) {
  if constexpr (std::endian::native == std::endian::big) {
    for (uint32_t& v : x.w) v = __builtin_bswap32(v);
  }
}
Words words(const std::byte* p) {
  Words out;
  std::memcpy(out.w, p, sizeof out.w);
  swap_if_big_endian(out);
  return out;
}

uint32_t check_word(const Words& x) { return ~(x.w[0] ^ x.w[1] ^ x.w[2]); }

// Writes a header's first three words and their check word with one 16-byte store. The check word comes
// from the values, never from reading the header back: a 4-byte load of bytes just stored one or two at a
// time cannot be forwarded from the store buffer and waits until they reach the cache (perf placed 62 % of a
// 256 B filler's samples here). The filler still waits for the send-block line it first writes, which the
// sending thread's put last read; the read-back is what went (docs/benchmarks.md, issue 32 item 4).
void store_words(std::byte* p, uint32_t w0, uint32_t w1, uint32_t w2) {
  Words x{{w0, w1, w2, 0}};
  x.w[3] = check_word(x);
  swap_if_big_endian(x);
  std::memcpy(p, x.w, sizeof x.w);
}

}  // namespace

void encode_block_header(const BlockHeader& h, std::span<std::byte, kBlockHeaderSize> out) {
  // Byte 0 the version, 1 the flags, 2-3 the device (little-endian), as decode_block_header reads them.
  store_words(out.data(), uint32_t(kBlockHeaderVersion) | uint32_t(h.flags) << 8 | uint32_t(h.device) << 16, h.packet,
              h.payload_length);
}

std::optional<BlockHeader> decode_block_header(std::span<const std::byte, kBlockHeaderSize> in, size_t payload_capacity,
                                               HeaderError* why) {
  const Words x = words(in.data());
  auto fail = [&](HeaderError e) -> std::optional<BlockHeader> {
    if (why) *why = e;
    return std::nullopt;
  };
  if ((x.w[0] & 0xFF) != kBlockHeaderVersion) return fail(HeaderError::kVersion);
  if (x.w[3] != check_word(x)) return fail(HeaderError::kCheck);
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
  store_words(out.data(), uint32_t(kPackedVersion), h.records, h.length);  // bytes 1-3 zero
}

std::optional<PackedHeader> decode_packed_header(std::span<const std::byte, kPackedHeaderSize> in, size_t capacity,
                                                 HeaderError* why) {
  const Words x = words(in.data());
  auto fail = [&](HeaderError e) -> std::optional<PackedHeader> {
    if (why) *why = e;
    return std::nullopt;
  };
  if ((x.w[0] & 0xFF) != kPackedVersion) return fail(HeaderError::kVersion);
  if (x.w[3] != check_word(x)) return fail(HeaderError::kCheck);
  if ((x.w[0] >> 8) != 0) return fail(HeaderError::kFlags);  // bytes 1-3
  PackedHeader h;
  h.records = x.w[1];
  h.length = x.w[2];
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
