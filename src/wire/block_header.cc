#include "wire/block_header.h"

#include "wire/codec.h"

namespace slotstream::wire {
namespace {

uint32_t check_word(const std::byte* p) {
  return ~(static_cast<uint32_t>(get_le(p, 4)) ^ static_cast<uint32_t>(get_le(p + 4, 4)) ^
           static_cast<uint32_t>(get_le(p + 8, 4)));
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
  const std::byte* p = in.data();
  auto fail = [&](HeaderError e) -> std::optional<BlockHeader> {
    if (why) *why = e;
    return std::nullopt;
  };
  if (std::to_integer<uint8_t>(p[0]) != kBlockHeaderVersion) return fail(HeaderError::kVersion);
  if (static_cast<uint32_t>(get_le(p + 12, 4)) != check_word(p)) return fail(HeaderError::kCheck);
  BlockHeader h;
  h.flags = std::to_integer<uint8_t>(p[1]);
  if (h.flags & ~kKnownFlags) return fail(HeaderError::kFlags);
  h.device = static_cast<uint16_t>(get_le(p + 2, 2));
  h.packet = static_cast<uint32_t>(get_le(p + 4, 4));
  h.payload_length = static_cast<uint32_t>(get_le(p + 8, 4));
  if (h.payload_length > payload_capacity) return fail(HeaderError::kLength);
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
  }
  return "?";
}

}  // namespace slotstream::wire
