// One slotstream connection per sender-name in a process, shared by every slotstreamsink of that name:
// many cameras over one connection, as in the paper (§3.4). Plain C++ on the public API; no GStreamer.
//
// Life of a connection: sinks attach their devices when they start (READY -> PAUSED); the first buffer of
// any of them connects with every device attached by then (in one pipeline all sinks start before any
// source produces, so all are); each sink ends its device (EOS) or detaches (stops); the last one to do
// either finishes the connection (waits until the receiver has stored everything) and closes it.
//
// Threading: every call may come from any thread (each sink's streaming thread, the application's for state
// changes); calls for one device come from one thread at a time, as a sink's do.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "slotstream/slotstream.h"

namespace slotstream::gst {

// What every sink of one sender-name must agree on: the connection's options (the library's
// SenderOptions, filled from the properties; its devices are the attached sinks').
struct ConnectionSpec : SenderOptions {
  // The first property that differs from `other`, for an error message; empty when they agree.
  std::string difference(const ConnectionSpec& other) const;
};

class SharedSender {
 public:
  // Attaches `device` to the connection named spec.name (made if none exists in this process). Fails when
  // another sink has the device, when the spec differs from the other sinks', or when the connection
  // already carries data (a device cannot join a connection after its hello).
  static Status attach(const ConnectionSpec& spec, uint16_t device, std::shared_ptr<SharedSender>* out);
  ~SharedSender();

  // One message of `device` (connecting first if nobody has yet). Waits while the receiver has no room; a
  // wait longer than `max_wait` (0: no limit) fails the whole connection with kTimeout, since every device
  // of it is stalled or the receiver does not take this one.
  Status send(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill, std::chrono::milliseconds max_wait);
  Status send(uint16_t device, std::span<const std::byte> message, std::chrono::milliseconds max_wait);
  // The device's stream is complete (its end-of-stream message was sent). If it was the last open device,
  // finishes the connection: waits until the receiver stored everything.
  Status end_device(uint16_t device, std::chrono::milliseconds max_wait);
  // The sink stops: like end_device when the device was still open (finishing is bounded by max_wait, or
  // 5 s without one), then the device is free for another sink. Errors are returned, not thrown away.
  Status detach(uint16_t device, std::chrono::milliseconds max_wait);
  // Wakes a send() of `device` that waits for the receiver (a sink being stopped or flushed): the
  // connection is aborted with kCancelled — its other devices cannot go on without that device's data.
  // Returns whether a send was waiting.
  bool interrupt(uint16_t device);

  const ConnectionSpec& spec() const { return spec_; }

 private:
  explicit SharedSender(ConnectionSpec spec) : spec_(std::move(spec)) {}
  Status connect_locked();
  Status finish_if_done(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds limit);
  // The watchdog: aborts the connection when a wait passes its deadline.
  void watch();
  // A wait of `key` (a device, or finish()) begins or ends.
  void arm(int key, std::chrono::milliseconds limit, const char* what);
  void disarm(int key);

  const ConnectionSpec spec_;
  std::mutex mutex_;  // guards everything below
  std::set<uint16_t> attached_;
  std::set<uint16_t> open_;  // attached and not ended
  std::unique_ptr<Sender> sender_;
  bool finished_ = false;
  Status connect_error_;  // a failed connect is not retried: every sink sees why

  struct Deadline {
    std::chrono::steady_clock::time_point at;
    std::chrono::milliseconds limit;
    const char* what;
  };
  // Guards deadlines_, stop_watch_ and (with mutex_) sender_'s pointer. Held around Sender::abort only, which
  // takes none of our locks.
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::map<int, Deadline> deadlines_;  // sends and finish() waiting now, by device (finish: -1)
  bool stop_watch_ = false;
  std::thread watchdog_;
};

}  // namespace slotstream::gst
