#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include "protocol/carc.h"
#include "protocol/credit.h"
#include "protocol/nic_assisted.h"
#include "protocol/packed_ring.h"
#include "protocol/protocol.h"
#include "protocol/sliding_window.h"
#include "protocol/status_byte.h"
#include "protocol/ucx_raw_put.h"

namespace slotstream::protocol {
namespace {
// Every protocol of this build, in the order --help and the benchmark list them.
const std::array<const Descriptor*, 7> kAll = {&kStatusByte, &kSlidingWindow, &kCredit,     &kCarc,
                                               &kPackedRing, &kNicAssisted,   &kUcxRawPut};
}  // namespace

std::span<const Descriptor* const> all() { return kAll; }

const Descriptor* find(std::string_view name) {
  for (const Descriptor* d : kAll) {
    if (d->name == name) return d;
  }
  return nullptr;
}

Status check_options(const Descriptor& d, const Options& options) {
  if (d.check_options) return d.check_options(options);
  return options.check_known(d.name, {});
}

void PollBackoff::pause() {
  constexpr uint32_t kSpinPolls = 64;
  constexpr uint32_t kMaxSleepUs = 200;
  constexpr uint32_t kStalledPolls = kSpinPolls + 300;  // ~20 ms of sleeps up to 200 µs
  constexpr uint32_t kStalledSleepUs = 2000;
  if (++polls_ <= kSpinPolls) return;
  const uint32_t us = polls_ < kStalledPolls ? std::min(kMaxSleepUs, polls_ - kSpinPolls)
                                             : std::min(kStalledSleepUs, kMaxSleepUs + (polls_ - kStalledPolls) * 10);
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

void add_sample(std::vector<uint64_t>& samples, uint64_t ns) {
  if (samples.size() < kMaxSamples) samples.push_back(ns);
}

WaitTimer::~WaitTimer() {
  const uint64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
  ++stats_.waits;
  stats_.wait_ns += ns;
  add_sample(stats_.wait_samples_ns, ns);
}

Status ReceiverProtocol::connect(const PeerSetup& peer) {
  if (!peer.setup.empty()) return {Code::kProtocolError, "unexpected set-up bytes from the sender"};
  return Status::ok();
}

void ReceiverProtocol::wait(std::chrono::microseconds max) { std::this_thread::sleep_for(max); }

}  // namespace slotstream::protocol
