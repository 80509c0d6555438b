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

#include <nlohmann/json.hpp>

#include "commands.h"

namespace slotstream::tools {

struct Synthetic {
  uint32_t first = 0, last = 0;
  double fps = 0;
  uint64_t frame_bytes = 0;
};

// A --video source and the raw RGB frames it is decoded into: the source's own size (asked of
// ffprobe before connecting), or --video-size.
struct Video {
  std::string source;  // a file, or lavfi:GRAPH
  uint32_t width = 0, height = 0;
  bool scaled = false;  // --video-size: ffmpeg scales to width x height
  uint64_t frame_bytes() const { return uint64_t(width) * height * 3; }
};

// What each device sends, in order.
struct Plan {
  std::map<uint16_t, std::vector<std::filesystem::path>> files;
  std::map<uint16_t, Video> videos;
  std::optional<Synthetic> synthetic;
  std::vector<uint16_t> devices() const;
};

Status build_plan(const SendArgs& a, Plan* plan);
// build_plan and the sender name (--name, or the host name), checked; kInvalidArgument says what is wrong.
Status plan_send(const SendArgs& a, Plan* plan, std::string* name);

// The size of a --video source's frames (ffprobe), into video->width and height.
Status probe_video(Video* video);

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
// `stop` (may be null): once set (send's first Ctrl-C, tools/interrupt.h), no new message is
// started; each returns ok.
inline constexpr std::chrono::milliseconds kLateAfter{250};
Status send_synthetic(MessageOut& dev, const Synthetic& s, double duration, std::atomic<uint64_t>* late,
                      const std::atomic<bool>* stop = nullptr);
Status send_video(MessageOut& dev, const Video& video, bool realtime, const std::atomic<bool>* stop = nullptr);

// One filler thread per device of the plan, each sending through its own out_for(device). join() waits
// for all of them and returns the first error any met. plan and a must outlive the threads; so must
// `stop` (null: never stopped early), which ends every filler after its current message.
using OutFactory = std::function<std::unique_ptr<MessageOut>(uint16_t device)>;
class Fillers {
 public:
  Fillers(const Plan& plan, const SendArgs& a, const OutFactory& out_for, const std::atomic<bool>* stop = nullptr);
  ~Fillers() { (void)join(); }
  Status join();
  // Synthetic frame slots that could not be produced in time (send_synthetic): all devices', or
  // one device's (0 for a device that is not synthetic).
  uint64_t late_frames() const;
  uint64_t late_frames(uint16_t device) const;
  // Messages each device has sent (send() returned ok), and their bytes in all: what every
  // transport's summary reports (SendSummary).
  std::map<uint16_t, uint64_t> sent() const;
  uint64_t sent_bytes() const;

 private:
  struct Count {
    std::atomic<uint64_t> messages{0}, bytes{0};
  };
  class CountingOut;
  std::unique_ptr<MessageOut> counted(uint16_t d, std::unique_ptr<MessageOut> out);
  void record(Status st);
  std::map<uint16_t, std::atomic<uint64_t>> late_frames_;  // built before the threads start
  std::map<uint16_t, Count> counts_;                       // likewise
  std::mutex mutex_;
  Status first_error_;
  std::vector<std::thread> threads_;
};

// A warning on stderr when synthetic frames were late (send_synthetic), naming the load asked for.
void warn_late_frames(uint64_t late, const Plan& plan);
// send's options as SenderOptions (with --to: the receiver, or the least loaded of a list), and
// the plan; an error says what is wrong (exit_code_of: kInvalidArgument for a usage error).
// With `dgram` (send --transport udp's own options), the datagram transport's part too.
Status check_sender_options(const SendArgs& a, Plan* plan, SenderOptions* opt, const DgramArgs* dgram = nullptr);

// What `send` reports at its end, whichever transport carried it (--platform too): one schema.
struct SendSummary {
  std::map<uint16_t, uint64_t> devices;  // messages sent per device (Fillers::sent)
  uint64_t messages = 0, bytes = 0;
  double seconds = 0, cpu_seconds = 0;
  std::string transport, transport_reason, protocol;
  uint64_t blocks = 0;
  std::optional<uint64_t> block_size;  // none on the datagram transport (segment_size there)
  uint64_t late_frames = 0;
  int interrupted = 0;  // SIGINT or SIGTERM when one ended it early (tools/interrupt.h), else 0
  nlohmann::json extra = nlohmann::json::object();  // what one transport or --platform adds
};
// The counts, time and late frames of a run that used `fillers` (started at t0, cpu0).
void fill_summary(const Fillers& fillers, std::chrono::steady_clock::time_point t0, double cpu0, SendSummary* s);
// The summary as `send --json` prints it (docs/cli-contract.md): ok (exit code 0), exit_code, error
// (null, or the message; code: its Status code), interrupted (null or the signal), the counts, then
// `extra`.
nlohmann::json summary_json(const SendSummary& s, int exit_code, const Status& error);
// The end of a send run, every transport: warns about late frames; --json: summary_json on stdout;
// else, on success or interruption, one or two human lines on stdout (messages, bytes, rate,
// transport, late frames). A failure: its error on stderr. Returns the exit code: rc, or 128 + the
// signal when interrupted.
int report_send(const SendArgs& a, const Plan& plan, const SendSummary& s, const Status& st);
// A failure before anything was sent: the error on stderr and, with --json, {"ok": false, "error",
// "code", "exit_code"} on stdout. Returns rc.
int send_failed(const SendArgs& a, const Status& st, int rc);
// The --json error object alone (main's parse errors).
void print_send_error_json(const Status& st, int rc);
// The exit code of a failed Status: kInvalidArgument is a usage error (2), anything else 1.
int exit_code_of(const Status& st);

double cpu_seconds();        // this process's user + system time
std::string default_name();  // the sender name when --name is not given: the host name

}  // namespace slotstream::tools
