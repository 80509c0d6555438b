// Stores each message as one file: ROOT/<sender>/device-<D>/<SEQ>.bin (paper §3.2.7: "data from
// the same sensing device are stored in the same directory ... arranged sequentially by packet
// number"). SEQ is the per-device message number, zero-padded to 10 digits.
//
// A message is written to a hidden temp file (.<SEQ>.bin.part) and renamed when complete, so a
// reader never sees a half-written message. A sender that reconnects continues after the
// highest SEQ already on disk; nothing is overwritten. A sender that numbers its messages itself
// (SenderInfo::first_message: a stream that moved between receivers, src/platform) starts at its
// number, and a message whose file exists with the same length is one stored before — sent again
// because its confirmation was lost with a receiver: dropped and counted, not an error. Leftover temp files of a
// crashed run are removed when a device directory is first opened.
//
// Writes use explicit offsets, so a failed append (disk full) can be retried with the same
// data and leaves no trace — the MessageSink contract that lets the receiver back-pressure.
// A device directory removed while the receiver runs is made again (a message being written at
// that moment is kept: its data is copied from the open file).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "slotstream/sinks.h"
#include "slotstream/slotstream.h"

namespace slotstream::sink {

// A sink whose numbers its owner may move forward (the edge's local sink when a device comes back):
// DirSink, and the pipeline's sink that stores through one. Public: slotstream/sinks.h.
using SkippableSink = slotstream::SkippableSink;

class DirSink final : public MessageSink, public SkippableSink {
 public:
  // `dir` is ROOT/<sender>; it is created if missing.
  // `first`: devices numbered by the sender (their first message's SEQ); others continue on disk.
  explicit DirSink(std::filesystem::path dir, std::map<uint16_t, uint64_t> first = {})
      : dir_(std::move(dir)),
        first_(std::move(first)) {}
  ~DirSink() override;

  Status begin(uint16_t device) override;
  Status append(uint16_t device, std::span<const std::byte> data) override;
  Status commit(uint16_t device) override;
  void abort(uint16_t device) override;
  // Each whole message is written in one go: its temp file, one write, close, link into place
  // (one file per message is the layout; the syscalls are the file's, not the receive path's).
  Status deliver(std::span<const Message> batch, size_t* stored) override;
  // Never creates anything: a device not yet opened is looked up on disk.
  std::optional<Numbering> numbering(uint16_t device) override;

  struct Committed {
    uint64_t seq = 0;
    uint64_t bytes = 0;
  };
  // The message file the last successful commit() of `device` created.
  Committed last_committed(uint16_t device) const { return devices_.at(device).last; }

  // Times a removed device directory was made again (someone deleted the output mid-stream).
  uint64_t recreated() const { return recreated_; }

  static std::string file_name(uint64_t seq);  // "0000000042.bin"
  // Highest SEQ + 1 among the message files (complete, or partial) in `device_dir` (0 if none).
  static uint64_t next_seq_on_disk(const std::filesystem::path& device_dir);

  // For transports that lose messages (the datagram transport): the SEQ the next message gets,
  // and moving it forward past messages that will never be stored, so that a message keeps its
  // sender's number. skip_to() never moves backwards and needs no message in progress.
  Status next_seq(uint16_t device, uint64_t* out);
  Status skip_to(uint16_t device, uint64_t seq) override;
  // Stores an incomplete message as <SEQ>.partial (holes zero-filled) beside <SEQ>.valid (the
  // JSON list of [offset, length] ranges that arrived), both atomically, .valid first.
  Status store_partial(uint16_t device, std::span<const std::byte> data, std::string_view valid_json);
  // The datagram transport's messages: SEQ is the sender's number plus where the device's directory
  // stood when its first message of this sender came (a message that was lost or dropped leaves its
  // number unused: the loss is visible on disk); a partial one is stored as <SEQ>.partial beside
  // <SEQ>.valid (store_partial).
  Status deliver_datagram(const DatagramMessage& m) override;
  // [[offset, length], ...]: the text of a <SEQ>.valid file.
  static std::string valid_json(const std::vector<std::pair<uint64_t, uint64_t>>& ranges);

 private:
  struct Device {
    std::filesystem::path dir;
    uint64_t next_seq = 0;
    int fd = -1;  // open temp file of the message in progress
    uint64_t offset = 0;
    Committed last;
    bool numbered = false;  // by the sender: an existing file is a duplicate
    uint64_t already_stored = 0;
  };
  Status open_device(uint16_t device, Device** out);
  Status store_whole(Device& dev, std::span<const std::byte> data);
  Status recreate_dir(Device& dev);
  Status restore_temp(Device& dev);
  Status link_in_place(Device& dev, const std::filesystem::path& tmp, const std::filesystem::path& final_path);
  std::filesystem::path temp_path(const Device& d) const;

  std::filesystem::path dir_;
  std::map<uint16_t, uint64_t> first_;
  std::map<uint16_t, Device> devices_;
  std::map<uint16_t, uint64_t> datagram_base_;  // per device: the SEQ of the datagram sender's message 0
  uint64_t recreated_ = 0;
};

}  // namespace slotstream::sink
