#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include "engine/ucx/protocol/buffered_read.h"
#include "engine/ucx/protocol/carc.h"
#include "engine/ucx/protocol/credit.h"
#include "engine/ucx/protocol/nic_assisted.h"
#include "engine/ucx/protocol/packed_ring.h"
#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/protocol/sliding_window.h"
#include "engine/ucx/protocol/status_byte.h"
#include "engine/ucx/protocol/ucx_raw_put.h"
#include "slotstream/slotstream.h"
#include "wire/codec.h"

namespace slotstream::protocol {
namespace {
// Every protocol of this build, in the order --help and the benchmark list them.
const std::array<const Descriptor*, 8> kAll = {&kStatusByte, &kSlidingWindow, &kCredit,       &kCarc,
                                               &kPackedRing, &kNicAssisted,   &kBufferedRead, &kUcxRawPut};
}  // namespace

std::span<const Descriptor* const> all() { return kAll; }

const Descriptor* find(std::string_view name) {
  for (const Descriptor* d : kAll) {
    if (d->name == name) return d;
  }
  return nullptr;
}

Status check_options(const Descriptor& d, const Options& options) {
  bool pack = false;
  SLOTSTREAM_RETURN_IF_ERROR(packs(d, options, &pack));
  const Options own = protocol_options(options);
  if (d.check_options) return d.check_options(own);
  return own.check_known(d.name, {});
}

Status packs(const Descriptor& d, const Options& options, bool* out) { return options.flag("pack", d.packs, out); }

Options protocol_options(const Options& options) { return options.without("pack"); }

Status read_keyed_setup(std::span<const uint8_t> setup, std::string_view protocol, fabric::Endpoint& endpoint,
                        std::span<uint64_t> words, std::unique_ptr<fabric::RemoteKey>* rkey) {
  wire::Reader r(setup);
  for (uint64_t& w : words) w = r.u64();
  std::vector<uint8_t> packed = r.blob32(setup.size());
  if (!r.ok() || !r.at_end())
    return {Code::kProtocolError, "malformed " + std::string(protocol) + " set-up from receiver"};
  return fabric::RemoteKey::unpack(endpoint, packed, rkey);
}

namespace {
constexpr uint32_t kSpinPolls = 64;
constexpr uint32_t kMaxSleepUs = 200;

constexpr uint32_t kStalledPolls = kSpinPolls + 300;  // ~20 ms of sleeps up to 200 µs
constexpr uint32_t kStalledSleepUs = 2000;
uint32_t stalled_sleep_us(uint32_t polls) {
  return std::min(kStalledSleepUs, kMaxSleepUs + (polls - kStalledPolls) * 10);
}
}  // namespace

void PollBackoff::pause() {
  if (++polls_ <= kSpinPolls) return;
  const uint32_t us = polls_ < kStalledPolls ? std::min(kMaxSleepUs, polls_ - kSpinPolls) : stalled_sleep_us(polls_);
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

std::chrono::microseconds PollBackoff::round_trip_sleep(uint32_t polls, std::chrono::nanoseconds poll_cost) {
  // No spin phase: the reads themselves were the spin. The usual growth towards 200 µs and,
  // for a stalled receiver, 2 ms, counted from the first read.
  if (polls >= kStalledPolls) return std::chrono::microseconds(stalled_sleep_us(polls));
  const auto cost_us = uint32_t(std::chrono::ceil<std::chrono::microseconds>(poll_cost).count());
  return std::chrono::microseconds(std::min(kMaxSleepUs, std::max(cost_us, polls)));
}

void PollBackoff::pause(fabric::Worker& worker, std::chrono::nanoseconds poll_cost) {
  if (poll_cost < fabric::wait_policy::kPeerRoundTrip) return pause();
  worker.wait_or_sleep(round_trip_sleep(++polls_, poll_cost));
}

void PollBackoff::pause(fabric::Worker& worker) {
  if (++polls_ <= kSpinPolls) return;
  const std::chrono::microseconds t(std::min(kMaxSleepUs, polls_ - kSpinPolls));
  worker.wait_or_sleep(t);
}

}  // namespace slotstream::protocol

namespace slotstream::protocol {

std::vector<ProtocolInfo> infos(bool with_references) {
  // Every transport the fabric configures, for receiver_progress_on.
  static const fabric::FabricSpec kSpecs[] = {{Transport::kShm},
                                              {Transport::kTcp},
                                              {Transport::kRdma, RdmaTransport::kRc},
                                              {Transport::kRdma, RdmaTransport::kDc},
                                              {Transport::kRdma, RdmaTransport::kUd}};
  std::vector<ProtocolInfo> out;
  for (const auto* d : all()) {
    if (d->reference && !with_references) continue;
    ProtocolInfo info;
    info.name = d->name;
    info.summary = d->summary;
    info.engine = "ucx";
    info.transports = {"shm", "tcp", "rdma"};
    info.options = d->options_help;
    if (!d->reference) info.options += (info.options.empty() ? "" : "; ") + std::string(kPackHelp);
    info.reference = d->reference;
    info.holds = d->holds;
    info.connection_per_device = d->connection_per_device;
    info.receiver_progress = d->receiver_progress;
    info.receiver_endpoint = d->receiver_endpoint;
    info.sender_wakeup = d->sender_wakeup;
    info.packs = d->packs;
    // The receiver takes part where the protocol needs it or the transport's RMA does.
    for (const auto& spec : kSpecs) {
      info.receiver_progress_on[fabric::spec_name(spec)] = d->receiver_progress || fabric::traits(spec).target_progress;
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace slotstream::protocol
