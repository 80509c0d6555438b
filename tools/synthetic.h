// Synthetic camera frames whose every byte is derived from (device, frame number, frame size),
// so a receiver can verify each stored frame without the original.
//
//   bytes 0..7   "SSYNTH01"
//   bytes 8..11  device (u32 LE)
//   bytes 12..15 frame number (u32 LE)
//   bytes 16..   word k (8 bytes, LE) = splitmix64(seed + k), seed from device, frame and size
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace slotstream::tools {

inline constexpr size_t kSyntheticHeader = 16;

// Writes bytes [offset, offset + dst.size()) of the frame into dst.
void fill_synthetic(uint32_t device, uint32_t frame, uint64_t size, uint64_t offset, std::span<std::byte> dst);

struct SyntheticId {
  uint32_t device;
  uint32_t frame;
};
// Checks a whole frame; returns its identity, or nullopt with the reason in *why.
std::optional<SyntheticId> check_synthetic(std::span<const std::byte> data, std::string* why);

}  // namespace slotstream::tools
