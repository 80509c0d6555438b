// What `slotstream send` sends (files, directories, videos, synthetic cameras), parsed from its
// options, and the functions that produce each device's messages into any message carrier: the
// library's DeviceStream (UCX) or the datagram transport (tools/dgram_cli.cc).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"

namespace slotstream::tools {

struct Synthetic {
  uint32_t first = 0, last = 0;
  double fps = 0;
  uint64_t frame_bytes = 0;
};

// What each device sends, in order.
struct Plan {
  std::map<uint16_t, std::vector<std::filesystem::path>> files;
  std::map<uint16_t, std::string> videos;
  std::optional<Synthetic> synthetic;
  std::vector<uint16_t> devices() const;
};

Status build_plan(const SendArgs& a, Plan* plan);
// build_plan and the sender name (--name, or the host name), checked; kInvalidArgument says what is wrong.
Status plan_send(const SendArgs& a, Plan* plan, std::string* name);

// `--video` decodes into raw 640x480 rgb24 frames, one message each.
inline constexpr int kVideoWidth = 640, kVideoHeight = 480;
inline constexpr size_t kVideoFrame = size_t(kVideoWidth) * kVideoHeight * 3;

// One device's outgoing messages, whatever carries them. Used by one filler thread.
class MessageOut {
 public:
  virtual ~MessageOut() = default;
  virtual uint16_t device() const = 0;
  virtual Status send_with(uint64_t length, const DeviceStream::FillFn& fill) = 0;
  virtual Status send(std::span<const std::byte> message) = 0;
};

// The library's DeviceStream as a MessageOut.
class StreamOut final : public MessageOut {
 public:
  explicit StreamOut(DeviceStream& s) : s_(s) {}
  uint16_t device() const override { return s_.device(); }
  Status send_with(uint64_t length, const DeviceStream::FillFn& fill) override { return s_.send_with(length, fill); }
  Status send(std::span<const std::byte> message) override { return s_.send(message); }

 private:
  DeviceStream& s_;
};

// Device `d` of a sender that takes the device with every call (PlatformSender, the edge's
// offloading sender) as a MessageOut; one without send(d, message) gets the copy through send_with.
template <class Target>
class DeviceOut final : public MessageOut {
 public:
  DeviceOut(Target& target, uint16_t d) : target_(target), d_(d) {}
  uint16_t device() const override { return d_; }
  Status send_with(uint64_t length, const DeviceStream::FillFn& fill) override {
    return target_.send_with(d_, length, fill);
  }
  Status send(std::span<const std::byte> message) override {
    if constexpr (requires { target_.send(d_, message); }) {
      return target_.send(d_, message);
    } else {
      return target_.send_with(d_, message.size(), [&](uint64_t off, std::span<std::byte> dst) {
        std::memcpy(dst.data(), message.data() + off, dst.size());
        return Status::ok();
      });
    }
  }

 private:
  Target& target_;
  uint16_t d_;
};

Status send_file(MessageOut& dev, const std::filesystem::path& path);
// Synthetic cameras on the wall clock: a device's frame slot k is due k / FPS seconds after the
// start, for the slots of `duration` seconds. A slot that cannot be started by the end of its
// period plus kLateAfter is not produced but counted in *late: a sender that cannot keep up sends
// fewer frames instead of queueing them, and the run ends about `duration` seconds after it began
// (`--synthetic 0-3:100000:640x480x3 --duration 2` once ran 165 s). Frames are numbered in the
// order they are sent, so a receiver sees consecutive frames either way.
inline constexpr std::chrono::milliseconds kLateAfter{250};
Status send_synthetic(MessageOut& dev, const Synthetic& s, double duration, std::atomic<uint64_t>* late);
Status send_video(MessageOut& dev, const std::string& source, bool realtime);

// One filler thread per device of the plan, each sending through its own out_for(device). join() waits
// for all of them and returns the first error any met. plan and a must outlive the threads.
using OutFactory = std::function<std::unique_ptr<MessageOut>(uint16_t device)>;
class Fillers {
 public:
  Fillers(const Plan& plan, const SendArgs& a, const OutFactory& out_for);
  ~Fillers() { (void)join(); }
  Status join();
  // Synthetic frame slots that could not be produced in time (send_synthetic): all devices', or
  // one device's (0 for a device that is not synthetic).
  uint64_t late_frames() const;
  uint64_t late_frames(uint16_t device) const;

 private:
  void record(Status st);
  std::map<uint16_t, std::atomic<uint64_t>> late_frames_;  // built before the threads start
  std::mutex mutex_;
  Status first_error_;
  std::vector<std::thread> threads_;
};

// A warning on stderr when synthetic frames were late (send_synthetic), naming the load asked for.
void warn_late_frames(uint64_t late, const Plan& plan);
// send's options as SenderOptions (with --to: the receiver, or the least loaded of a list), and
// the plan. kExitOk, or the exit code after printing what is wrong.
int check_sender_options(const SendArgs& a, Plan* plan, SenderOptions* opt);

double cpu_seconds();        // this process's user + system time
std::string default_name();  // the sender name when --name is not given: the host name

}  // namespace slotstream::tools
