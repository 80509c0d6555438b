// The protocol interface's own code (protocol.h): defaults and the statistics helpers every
// protocol uses. No fabric here, so the delivery logic links without UCX (its fuzz target).
#include "engine/ucx/protocol/protocol.h"

#include <chrono>
#include <thread>

namespace slotstream::protocol {

void add_sample(std::vector<uint64_t>& samples, uint64_t ns) {
  if (samples.size() < kMaxSamples) samples.push_back(ns);
}

WaitTimer::~WaitTimer() {
  if (dismissed_) return;
  const uint64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
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
