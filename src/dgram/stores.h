// Where the datagram receiver's messages go (dgram/receiver.h), and the stores the CLI uses.
//
// DirStore keeps slotstream's layout (src/sink/dir_sink.h): OUT/<SENDER>/device-<D>/<SEQ>.bin for
// complete messages, and for incomplete Write-Record messages kept with `recv --partial keep`
// <SEQ>.partial (holes zero-filled) beside <SEQ>.valid (JSON [[offset, length], ...]). SEQ is the
// sender's message number plus where the device's directory stood when the session began, so a
// message that was lost or dropped leaves its number unused: the loss is visible on disk. With
// per-device workers (src/pipeline/worker_manager.h) it answers kBusy while a device's backlog is over
// its limit, and tells the workers of every complete message it stored (a partial one is not a
// worker's: workers process SEQ.bin files and skip a missing number, docs/workers.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>

#include "dgram/placement.h"
#include "sink/dir_sink.h"
#include "slotstream/status.h"

namespace slotstream::dgram {

// A message handed to a store.
struct Delivered {
  uint16_t device = 0;
  uint32_t msn = 0;      // the sender's message number for this device (0, 1, 2, ...)
  bool partial = false;  // an incomplete Write-Record message kept under keep_partial
  std::span<const std::byte> data;
  const RangeSet* valid = nullptr;  // partial: the bytes that arrived (others are zero)
  bool length_known = true;         // partial: false if the last segment never came (length = highest valid end)
  int64_t first_ns = 0;             // first segment's arrival (CLOCK_MONOTONIC)
  int64_t done_ns = 0;              // complete, or its timer fired
};

// Where one session's messages go. Called from the receiver's storing thread only, a device's
// messages in MSN order. A failing call is retried with the same message: kBusy means "this device
// is paused" (its worker is behind; the device's messages wait, the others go on, retried every
// 100 ms), any other error concerns the whole store (a full disk; retried every 100 ms, reported).
class MessageStore {
 public:
  virtual ~MessageStore() = default;
  virtual Status store(const Delivered& m) = 0;
};

class DirStore final : public MessageStore {
 public:
  // What per-device workers need (src/pipeline/worker_manager.h), for one sender.
  struct Workers {
    std::function<bool(uint16_t device, std::string* why)> over_limit;  // the device's backlog is over its limit
    std::function<void(uint16_t device, uint64_t seq, uint64_t bytes)> stored;  // message file SEQ.bin written
  };
  explicit DirStore(std::filesystem::path dir, Workers workers = {})
      : sink_(std::move(dir)),
        workers_(std::move(workers)) {}
  Status store(const Delivered& m) override;

 private:
  Status store_complete(const Delivered& m);

  sink::DirSink sink_;
  Workers workers_;
  std::map<uint16_t, uint64_t> base_;  // per device: the SEQ of message 0 of this session
};

// Stores nothing (`recv --discard`): messages are still placed, ordered and counted.
class NullStore final : public MessageStore {
 public:
  Status store(const Delivered&) override { return Status::ok(); }
};

// Writes the valid ranges as the `<SEQ>.valid` JSON text: [[offset, length], ...].
std::string valid_ranges_json(const RangeSet& valid);

}  // namespace slotstream::dgram
