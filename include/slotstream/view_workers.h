// In-process per-device workers on zero-copy receive (MessageView): the edge pipeline's one worker per
// (sender, device) (docs/workers.md) as a function in this process, on a thread of its own, handed each
// message as a MessageView in its receive block — no directory, no file, no copy.
//
//   ViewWorkersOptions o;
//   o.make_worker = [](const std::string& sender, uint16_t device, ViewWorker* out) {
//     *out = [](MessageView& v) { analyse(v.data()); return Status::ok(); };   // v released on return
//     return Status::ok();
//   };
//   std::unique_ptr<ViewWorkers> workers;
//   ViewWorkers::start(o, &workers);
//   ReceiverOptions ro;  ro.make_view_sink = workers->view_sink();  ...  Receiver::start(ro, &rx);
//   ...  rx->stop();  workers->stop();   // stop() lets every worker finish what was handed to it
//
// The guarantees (tests/pipeline/view_workers_test.cc):
//   - Order: a device's worker gets that device's messages in order, one at a time, on one thread.
//   - Back-pressure, never loss: a view is held (its block status 2, paper §3.3) from the moment the
//     receiver lends it until the worker is done with it — queued, being processed, or kept. The
//     receiver's held limit (ReceiverOptions::max_held_blocks) therefore bounds what all workers hold
//     together, and at it the sender waits. A device with `backlog_messages` views queued is paused
//     alone (its messages wait in their blocks, its filler waits), as the directory pipeline pauses a
//     device whose worker is behind.
//   - A worker that fails (returns an error or throws) releases its views: the message's view is
//     released, the worker itself — with any views it kept in its state — is destroyed, the failure
//     is counted and reported through on_event, and a fresh worker (make_worker again) takes the
//     device's next message: the in-process form of a crashed worker's restart. The failed message is
//     not offered again (it is the worker's failure, not the transport's; it is counted).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"

namespace slotstream {

// One device's worker: processes one message. `view` is released when the call returns (or throws)
// unless the worker moved it out to keep it (it then stays held, counting against the held limit,
// until the worker releases it — e.g. a window of recent frames). Called on the device's worker thread.
using ViewWorker = std::function<Status(MessageView& view)>;

struct ViewWorkersOptions {
  // Makes the worker of (sender name, device): on that device's worker thread, before its first
  // message, and after a worker failed. An error counts the message it was made for as failed.
  std::function<Status(const std::string& sender, uint16_t device, ViewWorker* out)> make_worker;
  // Views queued for one device's worker; at it the device is paused (its messages wait in their
  // blocks; the receiver offers them again every 100 ms). 0: no per-device limit (the held limit
  // alone: one slow device can then hold every block the limit allows and slow the others).
  uint32_t backlog_messages = 16;
  // Failures and restarts, from worker threads (at most one line per device every 10 s).
  std::function<void(const std::string&)> on_event;
};

struct ViewWorkerStats {
  std::string sender;
  uint16_t device = 0;
  uint64_t processed = 0;  // messages the worker returned OK for
  uint64_t failed = 0;     // messages it failed on (released, not offered again)
  uint64_t restarts = 0;   // fresh workers made after a failure
  uint64_t backlog = 0;    // views queued for it now
  uint64_t busy = 0;       // times its device was paused at backlog_messages
};

// Threading: every method may be called from any thread except a worker's own (stop() joins them).
class ViewWorkers {
 public:
  static Status start(ViewWorkersOptions options, std::unique_ptr<ViewWorkers>* out);
  ~ViewWorkers();  // stop()

  // For ReceiverOptions::make_view_sink: each sender's messages go to these workers. The sinks it
  // makes may outlive this object (they then refuse messages, kCancelled).
  std::function<Status(const SenderInfo&, std::unique_ptr<ViewSink>*)> view_sink();
  // True when no view is queued or being processed (views workers keep are not counted).
  bool idle() const;
  // Waits until idle() or `timeout`; false on timeout.
  bool wait_idle(std::chrono::milliseconds timeout) const;
  // Stops taking messages, lets every worker finish the views queued to it, destroys the workers
  // (releasing what they kept) and joins their threads. Idempotent. Stop the Receiver first, so
  // that nothing it lends later is refused.
  void stop();
  std::vector<ViewWorkerStats> stats() const;

  struct Impl;

 private:
  explicit ViewWorkers(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

}  // namespace slotstream
