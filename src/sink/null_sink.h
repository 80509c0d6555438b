// A sink that stores nothing: for measuring the transport without the file system
// (`slotstream recv --discard`, the benchmark). Messages are still assembled and counted.
#pragma once

#include "slotstream/slotstream.h"

namespace slotstream::sink {

class NullSink final : public MessageSink {
 public:
  Status begin(uint16_t) override { return Status::ok(); }
  Status append(uint16_t, std::span<const std::byte>) override { return Status::ok(); }
  Status commit(uint16_t) override { return Status::ok(); }
  void abort(uint16_t) override {}
  // A batch costs nothing per message (the receive path measured without a sink's work).
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    *stored = batch.size();
    return Status::ok();
  }
};

}  // namespace slotstream::sink
