#include "engine/hello_rules.h"

#include <algorithm>
#include <vector>

#include "common.h"
#include "slotstream/slotstream.h"

namespace slotstream::engine {

std::optional<std::string> check_devices(std::span<const uint16_t> devices) {
  const std::string range = "a sender declares 1.." + std::to_string(kMaxDevices) + " devices";
  if (devices.empty()) return "no devices: " + range;
  if (devices.size() > kMaxDevices) {
    return "more than " + std::to_string(kMaxDevices) + " devices (" + std::to_string(devices.size()) + "): " + range;
  }
  std::vector<uint16_t> sorted(devices.begin(), devices.end());
  std::sort(sorted.begin(), sorted.end());
  if (auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
    return "device " + std::to_string(*twice) + " is listed twice";
  }
  return std::nullopt;
}

std::optional<std::string> check_sender_name(std::string_view name) {
  if (auto why = invalid_sender_name(name)) return "invalid sender name: " + *why;
  return std::nullopt;
}

std::optional<std::string> check_budget(uint64_t want, uint64_t in_use, uint64_t budget) {
  if (want <= budget && in_use <= budget - want) return std::nullopt;
  return "not enough receiver memory: this sender may need " + format_bytes(want) + ", " + format_bytes(in_use) +
         " of the receiver's " + format_bytes(budget) +
         " budget are promised already; give the receiver more (recv --max-memory) or ask for less (fewer or "
         "smaller blocks, smaller messages)";
}

}  // namespace slotstream::engine
