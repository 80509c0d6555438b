// CRC32C (Castagnoli, the iSCSI/iWARP CRC of RFC 3720 §B.4 and RFC 5044 §6) over byte spans,
// computed by ISA-L's crc32_iscsi (SIMD, chosen at run time). Every datagram segment carries one
// as its trailer (patent: "We perform a cyclic redundancy check (CRC) on individual message
// segments, not the whole message").
//
// crc32c() returns the standard value (initial 0xFFFFFFFF, final inversion): "123456789" gives
// 0xE3069283. crc32c_extend() continues a CRC over a next piece, so a segment gathered from
// several buffers (header, payload, iovecs) needs no copy. Threading: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace slotstream::dgram {

uint32_t crc32c(std::span<const std::byte> data);
// crc32c(a ++ b) == crc32c_extend(crc32c(a), b).
uint32_t crc32c_extend(uint32_t crc, std::span<const std::byte> data);

}  // namespace slotstream::dgram
