#include "engine/dgram/wire/crc32c.h"

#include <climits>

#include <isa-l/crc.h>

namespace slotstream::dgram {

uint32_t crc32c_extend(uint32_t crc, std::span<const std::byte> data) {
  // ISA-L works on the raw register: no inversion on entry or exit, and an int length.
  uint32_t reg = ~crc;
  // ISA-L takes a non-const pointer but only reads.
  auto* p = reinterpret_cast<unsigned char*>(const_cast<std::byte*>(data.data()));
  size_t left = data.size();
  while (left > 0) {
    const int n = left > size_t(INT_MAX) ? INT_MAX : int(left);
    reg = crc32_iscsi(p, n, reg);
    p += n;
    left -= size_t(n);
  }
  return ~reg;
}

uint32_t crc32c(std::span<const std::byte> data) { return crc32c_extend(0, data); }

}  // namespace slotstream::dgram
