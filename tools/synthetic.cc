#include "synthetic.h"

#include <cstring>
#include <vector>

namespace slotstream::tools {
namespace {

constexpr char kMagic[8] = {'S', 'S', 'Y', 'N', 'T', 'H', '0', '1'};

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t seed_of(uint32_t device, uint32_t frame, uint64_t size) {
  return splitmix64((uint64_t(device) << 32 | frame) ^ splitmix64(size));
}

void header_bytes(uint32_t device, uint32_t frame, uint8_t out[kSyntheticHeader]) {
  std::memcpy(out, kMagic, 8);
  for (int i = 0; i < 4; ++i) out[8 + i] = uint8_t(device >> (8 * i));
  for (int i = 0; i < 4; ++i) out[12 + i] = uint8_t(frame >> (8 * i));
}

}  // namespace

void fill_synthetic(uint32_t device, uint32_t frame, uint64_t size, uint64_t offset, std::span<std::byte> dst) {
  uint8_t header[kSyntheticHeader];
  header_bytes(device, frame, header);
  const uint64_t seed = seed_of(device, frame, size);
  auto* out = reinterpret_cast<uint8_t*>(dst.data());
  uint64_t pos = offset, end = offset + dst.size();
  // Header and unaligned head byte by byte, then whole words, then the tail.
  while (pos < end && (pos < kSyntheticHeader || pos % 8 != 0)) {
    *out++ = pos < kSyntheticHeader ? header[pos] : uint8_t(splitmix64(seed + pos / 8) >> (8 * (pos % 8)));
    ++pos;
  }
  for (; pos + 8 <= end; pos += 8, out += 8) {
    uint64_t w = splitmix64(seed + pos / 8);  // little-endian machines only store it as is
    std::memcpy(out, &w, 8);
  }
  for (; pos < end; ++pos) *out++ = uint8_t(splitmix64(seed + pos / 8) >> (8 * (pos % 8)));
}

std::optional<SyntheticId> check_synthetic(std::span<const std::byte> data, std::string* why) {
  if (data.size() < kSyntheticHeader) {
    *why = "shorter than a synthetic frame header (" + std::to_string(data.size()) + " bytes)";
    return std::nullopt;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  if (std::memcmp(p, kMagic, 8) != 0) {
    *why = "not a synthetic frame (bad magic)";
    return std::nullopt;
  }
  SyntheticId id{};
  for (int i = 0; i < 4; ++i) id.device |= uint32_t(p[8 + i]) << (8 * i);
  for (int i = 0; i < 4; ++i) id.frame |= uint32_t(p[12 + i]) << (8 * i);
  std::vector<std::byte> expect(64 * 1024);
  for (uint64_t off = 0; off < data.size(); off += expect.size()) {
    size_t n = std::min<uint64_t>(expect.size(), data.size() - off);
    fill_synthetic(id.device, id.frame, data.size(), off, {expect.data(), n});
    if (std::memcmp(expect.data(), data.data() + off, n) != 0) {
      *why = "content differs from frame " + std::to_string(id.frame) + " of device " + std::to_string(id.device) +
             " near byte " + std::to_string(off);
      return std::nullopt;
    }
  }
  return id;
}

}  // namespace slotstream::tools
