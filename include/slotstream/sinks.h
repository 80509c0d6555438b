// Where a receiver's messages go (ReceiverOptions::make_sink): the sinks `slotstream recv` and `slotstream
// edge` use, for a program that wants the same layout on disk.
//
//   ReceiverOptions o;
//   o.make_sink = [](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
//     *sink = make_directory_sink({.dir = "/data/" + info.name, .first = info.first_message});
//     return Status::ok();
//   };
//
// The directory layout (docs/cli-contract.md): DIR/device-<D>/<SEQ>.bin, one file per message, SEQ the
// device's message number zero-padded to 10 digits. A message is written to a hidden temp file and renamed
// when complete, so a reader never sees half of one; a sender that reconnects continues after the highest
// SEQ on disk, and nothing is overwritten. Threading: as MessageSink (one receiver thread at a time).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>

#include "slotstream/slotstream.h"

namespace slotstream {

// A sink whose numbers its owner may move forward past messages stored elsewhere: the edge's local sink
// when a device comes back from a receiver that stored the numbers in between. The directory sinks are
// (reach it with dynamic_cast).
class SkippableSink {
 public:
  virtual ~SkippableSink() = default;
  // The device's next message gets number `seq`. Never moves backwards and needs no message in progress
  // (kInvalidArgument otherwise).
  virtual Status skip_to(uint16_t device, uint64_t seq) = 0;
};

struct DirectorySinkOptions {
  std::filesystem::path dir;  // one sender's directory (ROOT/<sender>); created if missing
  // Devices the sender numbers itself (SenderInfo::first_message: a stream that moved between
  // receivers): their first message's SEQ. A message whose file exists with the same length is one
  // stored before (sent again after a lost confirmation): dropped and counted, not an error.
  std::map<uint16_t, uint64_t> first;
  // > 0: at most the `keep` newest message files of each device stay; as one is stored, the one `keep`
  // before it is removed (`recv --keep`: bounded disk for a receiver nobody empties). 0: all stay.
  uint64_t keep = 0;
};

// One file per message under options.dir (see above).
std::unique_ptr<MessageSink> make_directory_sink(DirectorySinkOptions options);

// Stores nothing: messages are still assembled and counted (`recv --discard`, the benchmark).
std::unique_ptr<MessageSink> make_null_sink();

}  // namespace slotstream
