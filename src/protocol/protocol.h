// The interface every flow-control protocol implements, and the registry that lists them.
//
// A protocol decides *where* in the receiver a filled send block goes and how the two sides
// agree that a receiver block is free again. It does not know about devices, fragments, files
// or which UCX transport is underneath: the stream layer (src/stream) and the fabric
// (src/fabric) handle those.
//
//   sender:   SenderProtocol::transmit_st(block) for each filled local block, in ring order
//   receiver: ReceiverProtocol::poll_full() -> block(i) -> release(i) (or keep it held)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "fabric/fabric.h"
#include "slotstream/status.h"

namespace slotstream::protocol {

struct Geometry {
  uint32_t blocks = 0;
  uint32_t block_size = 0;  // bytes, header included
};

// What a sender-side protocol works with. Owned by the Sender; valid for the protocol's life.
struct SenderFabric {
  fabric::Worker& worker;
  fabric::Endpoint& endpoint;
  Geometry geometry;
  fabric::Liveness alive;  // consulted inside every blocking wait
};

// What a receiver-side protocol works with, for one connected sender.
struct ReceiverFabric {
  fabric::Context& context;
  fabric::Worker& worker;
  Geometry geometry;
};

struct SenderCounters {
  uint64_t blocks = 0;
  uint64_t status_reads = 0;  // synchronisations
  uint64_t held_skips = 0;
};

// Threading: every method is called from the sender's one sending thread (suffix _st).
class SenderProtocol {
 public:
  virtual ~SenderProtocol() = default;
  // Moves `length` bytes of the local send block at `src` into some receiver block and makes
  // it visible there. May block (e.g. for free receiver blocks). If the data transfer is still
  // running on return, `*data_req` holds it and `src` must stay untouched until it completes.
  virtual Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) = 0;
  // Called once after the last transmit: everything must be remotely complete on return.
  virtual Status finish_st() = 0;
  virtual SenderCounters counters() const = 0;
  // Synchronisation-control latency samples in ns (benchmark, paper §4.2.1), at most
  // kMaxSyncSamples; what one sample means is the protocol's to document.
  virtual std::vector<uint64_t> sync_latencies_ns() const { return {}; }
};

inline constexpr size_t kMaxSyncSamples = 1 << 20;

// How a sender waits for the receiver (free blocks, ACKs): spin for the first polls — the
// common case is a receiver that frees a block within microseconds — then sleep, longer each
// time up to 200 µs, so that a stalled receiver (full disk, slow worker) does not cost a core.
// Every protocol uses the same policy, so none is favoured in a comparison.
class PollBackoff {
 public:
  void pause();
  void reset() { polls_ = 0; }

 private:
  uint32_t polls_ = 0;
};

// Threading: one consumer thread per connected sender calls these; set_hold may also be
// called from that thread only.
class ReceiverProtocol {
 public:
  virtual ~ReceiverProtocol() = default;
  // Bytes the sender needs to find and reach this receiver's blocks (sent in ACCEPT).
  virtual std::vector<uint8_t> setup() const = 0;
  // Appends the indices of blocks whose content is complete and not yet released.
  virtual void poll_full(std::vector<uint32_t>* out) = 0;
  virtual std::span<const std::byte> block(uint32_t index) const = 0;
  // The receiver is done with block `index` (status 0, or 2 if a hold is wanted).
  virtual void release(uint32_t index) = 0;
  // Marks an empty block unavailable (paper status 2) or available again. Returns false if
  // the protocol cannot hold individual blocks.
  virtual bool set_hold(uint32_t index, bool held) = 0;
};

struct Descriptor {
  std::string_view name;
  std::string_view summary;
  // True when the receiver must run UCX progress for this protocol even where RMA itself is
  // one-sided (two-sided notifications or ACKs).
  bool receiver_progress = false;
  // True when devices cannot share a connection (the paper's sliding window, §2.3): the sender
  // then opens one connection per device.
  bool connection_per_device = false;
  // A benchmark reference that moves bytes but delivers no messages (ucx_raw_put): not offered
  // by `slotstream send`, and its receiver confirms FIN without counting messages.
  bool reference = false;
  Status (*make_sender)(SenderFabric& fabric, std::span<const uint8_t> setup,
                        std::unique_ptr<SenderProtocol>* out) = nullptr;
  Status (*make_receiver)(ReceiverFabric& fabric, std::unique_ptr<ReceiverProtocol>* out) = nullptr;
};

// The registry: every protocol this build has, in a fixed order.
std::span<const Descriptor* const> all();
const Descriptor* find(std::string_view name);

}  // namespace slotstream::protocol
