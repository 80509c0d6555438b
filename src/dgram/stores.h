// Message stores for the datagram receiver (dgram/receiver.h).
//
// DirStore keeps slotstream's layout (src/sink/dir_sink.h): OUT/<SENDER>/device-<D>/<SEQ>.bin for
// complete messages, and for incomplete Write-Record messages kept with `recv --partial keep`
// <SEQ>.partial (holes zero-filled) beside <SEQ>.valid (JSON [[offset, length], ...]). SEQ is the
// sender's message number plus where the device's directory stood when the session began, so a
// message that was lost or dropped leaves its number unused: the loss is visible on disk.
#pragma once

#include <filesystem>
#include <map>

#include "dgram/receiver.h"
#include "sink/dir_sink.h"

namespace slotstream::dgram {

class DirStore final : public MessageStore {
 public:
  explicit DirStore(std::filesystem::path dir) : sink_(std::move(dir)) {}
  Status store(const Delivered& m) override;

 private:
  sink::DirSink sink_;
  std::map<uint16_t, uint64_t> base_;  // per device: the SEQ of message 0 of this session
};

// Stores nothing (`recv --discard`): messages are still placed, ordered and counted.
class NullStore final : public MessageStore {
 public:
  Status store(const Delivered&) override { return Status::ok(); }
};

}  // namespace slotstream::dgram
