#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include "protocol/protocol.h"
#include "protocol/sliding_window.h"
#include "protocol/status_byte.h"
#include "protocol/ucx_raw_put.h"

namespace slotstream::protocol {
namespace {
// Every protocol of this build, in the order --help and the benchmark list them.
const std::array<const Descriptor*, 3> kAll = {&kStatusByte, &kSlidingWindow, &kUcxRawPut};
}  // namespace

std::span<const Descriptor* const> all() { return kAll; }

void PollBackoff::pause() {
  constexpr uint32_t kSpinPolls = 64;
  constexpr uint32_t kMaxSleepUs = 200;
  if (++polls_ <= kSpinPolls) return;
  std::this_thread::sleep_for(std::chrono::microseconds(std::min(kMaxSleepUs, polls_ - kSpinPolls)));
}

const Descriptor* find(std::string_view name) {
  for (const Descriptor* d : kAll) {
    if (d->name == name) return d;
  }
  return nullptr;
}

}  // namespace slotstream::protocol
