// Where the library's receiver threads hand messages to Python: the state they share with the Python Receiver
// (RxShared), the iterator queue and the callback (PyDelivery), and the two sinks: copies (PySink) and views
// lent in place (PyViewSink).
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common.h"
#include "views.h"

namespace slotstream::py {

struct Delivered {
  std::string sender;
  uint16_t device;
  uint64_t seq;
  Frame data;
  MessageView view;  // zero_copy=True: the message in place instead of `data`
};

// What the receiver's threads and the Python object share. Outlives the library Receiver (the
// PyReceiver destroys that first), so sinks may point at it.
struct RxShared {
  std::mutex mutex;
  std::condition_variable changed;  // queue, ended sessions, failure, closing
  std::deque<Delivered> queue;
  size_t max_queue = 8;
  std::map<std::pair<std::string, uint16_t>, uint64_t> next_seq;  // per sender name and device
  std::vector<SessionReport> ended;
  std::deque<std::string> events;
  bool closing = false;
  bool failed = false;         // the callback or a worker raised: deliver nothing more
  bool callback_mode = false;  // set before the receiver starts
  bool workers_mode = false;   // Receiver(..., workers=...): set before the receiver starts
  // Callback mode only: read with the GIL held; dropped when the receiver has stopped, which
  // breaks the cycle of a callback that refers to its own Receiver.
  nb::object callback;
  nb::object error;  // the callback's exception, raised by wait()/close(); touched with the GIL

  // Stopping the library Receiver (which joins the session threads) is serialised here: by the
  // Python object, or by `stopper` when a callback raised (a session thread cannot stop the
  // receiver itself: stop() joins it).
  std::mutex stop_mutex;
  Receiver* receiver = nullptr;  // guarded by stop_mutex
  std::thread stopper;           // guarded by mutex

  // `reason`: what each connected sender is told (Receiver::stop).
  void stop_receiver(const std::string& reason = "") {
    std::lock_guard lock(stop_mutex);
    if (receiver) receiver->stop(reason);
  }
  // A callback raised: disconnect every sender (they hear that the receiver stopped, and why) so
  // that nobody waits for messages that will never be delivered. Called with `mutex` held.
  void stop_soon(std::string reason) {
    if (!stopper.joinable()) stopper = std::thread([this, reason = std::move(reason)] { stop_receiver(reason); });
  }
  // The callback or a worker raised `e` (GIL held): the first exception is kept for wait()/close(),
  // and the receiver stops, telling the senders `who` raised what ("the receiver's worker of
  // sender 'cam' device 0 failed: RuntimeError: ...").
  void raised(nb::python_error& e, const std::string& who) {
    std::string what = who + ": " + exception_text(e);
    std::lock_guard lock(mutex);
    if (!failed) {
      failed = true;
      error = nb::borrow(e.value());
      stop_soon(std::move(what));
    }
    changed.notify_all();
  }
  // "TypeName: message" of a Python exception (GIL held).
  static std::string exception_text(nb::python_error& e) {
    try {
      std::string text = nb::cast<std::string>(nb::str(nb::handle(e.type()).attr("__name__")));
      std::string message = nb::cast<std::string>(nb::str(e.value()));
      return message.empty() ? text : text + ": " + message;
    } catch (...) {  // a __str__ that raises: the type is still worth saying
      PyErr_Clear();
      return "an exception";
    }
  }
};

// What both sinks below share: the iterator queue and the callback, for one sender.
class PyDelivery {
 protected:
  PyDelivery(RxShared& shared, std::string sender) : shared_(shared), sender_(std::move(sender)) {}

  // Iterator mode, `shared_.mutex` held: waits for room in the queue (kBusy after kQueueWait),
  // then queues the device's next message, filled in by `make(Delivered&)`.
  template <typename Make>
  Status queue_locked(std::unique_lock<std::mutex>& lock, uint16_t device, Make&& make) {
    if (shared_.closing) return {Code::kCancelled, "receiver closing"};
    if (shared_.failed) return {Code::kCancelled, "the Python callback raised; nothing more is delivered"};
    // A full queue: the consumer must hear of what this batch queued before we wait for it.
    if (shared_.queue.size() >= shared_.max_queue) shared_.changed.notify_all();
    if (!shared_.changed.wait_for(lock, kQueueWait,
                                  [&] { return shared_.queue.size() < shared_.max_queue || shared_.closing; })) {
      return {Code::kBusy,
              "the Python consumer is behind (" + std::to_string(shared_.max_queue) + " messages waiting)"};
    }
    if (shared_.closing) return {Code::kCancelled, "receiver closing"};
    Delivered d{sender_, device, 0, Frame(), MessageView()};
    SLOTSTREAM_RETURN_IF_ERROR(make(d));
    uint64_t& seq = shared_.next_seq[std::make_pair(sender_, device)];
    d.seq = seq++;
    shared_.queue.push_back(std::move(d));
    return Status::ok();
  }

  // Callback mode, GIL held: the device's next number, or why nothing more is delivered.
  Status next_seq(uint16_t device, uint64_t* seq) {
    std::lock_guard lock(shared_.mutex);
    if (shared_.closing) return {Code::kCancelled, "receiver closing"};
    if (shared_.failed) return {Code::kCancelled, "the Python callback raised; nothing more is delivered"};
    *seq = shared_.next_seq[std::make_pair(sender_, device)];
    return Status::ok();
  }
  void delivered(uint16_t device, uint64_t seq) {
    std::lock_guard lock(shared_.mutex);
    shared_.next_seq[std::make_pair(sender_, device)] = seq + 1;
  }

  // With the GIL: the callback gets `data` (a memoryview, or a MessageView). A callback that
  // raises stops the receiver.
  Status call_back(uint16_t device, uint64_t seq, const std::function<nb::object()>& data) {
    try {
      shared_.callback(sender_, device, seq, data());
    } catch (nb::python_error& e) {
      shared_.raised(e, "the receiver's callback failed on a message of sender '" + sender_ + "' device " +
                            std::to_string(device));
      return {Code::kCancelled, "the Python callback raised"};
    }
    return Status::ok();
  }

  RxShared& shared_;
  std::string sender_;
};

class PySink final : public MessageSink, PyDelivery {
 public:
  PySink(RxShared& shared, std::string sender) : PyDelivery(shared, std::move(sender)) {}

  Status begin(uint16_t device) override {
    open_[device] = Frame();
    return Status::ok();
  }
  Status append(uint16_t device, std::span<const std::byte> data) override { return open_[device].append(data); }
  void abort(uint16_t device) override { open_.erase(device); }

  // Every whole message of a consumer pass: in iterator mode queued under one lock
  // with one notification (each still waits for room as commit() does); in callback mode the GIL
  // is taken once for the batch. Each message is copied once into a Frame of its own: the Python
  // object outlives the receiver's block.
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    *stored = 0;
    if (shared_.callback_mode) return call_back_batch(batch, stored);
    std::unique_lock lock(shared_.mutex);
    Status st;
    for (; *stored < batch.size(); ++*stored) {
      const Message& m = batch[*stored];
      st = queue_locked(lock, m.device, [&](Delivered& d) { return d.data.append(m.data); });
      if (!st.is_ok()) break;
    }
    if (*stored > 0) shared_.changed.notify_all();
    return st;
  }

  // The message is complete: hand it to the callback or the iterator queue. Failing (busy,
  // closing, callback raised) leaves it here; the receiver retries this call later.
  Status commit(uint16_t device) override {
    if (!shared_.callback_mode) {
      std::unique_lock lock(shared_.mutex);
      Status st = queue_locked(lock, device, [&](Delivered& d) {
        d.data = std::move(open_[device]);
        return Status::ok();
      });
      if (st.is_ok()) {
        open_.erase(device);
        shared_.changed.notify_all();
      }
      return st;
    }
    if (python_finalizing()) return {Code::kCancelled, "Python is shutting down"};
    nb::gil_scoped_acquire gil;
    uint64_t seq;
    SLOTSTREAM_RETURN_IF_ERROR(next_seq(device, &seq));
    SLOTSTREAM_RETURN_IF_ERROR(call_back(device, seq, [&] { return memoryview_of(std::move(open_[device])); }));
    open_.erase(device);
    delivered(device, seq);
    return Status::ok();
  }

 private:
  Status call_back_batch(std::span<const Message> batch, size_t* stored) {
    if (python_finalizing()) return {Code::kCancelled, "Python is shutting down"};
    nb::gil_scoped_acquire gil;
    for (; *stored < batch.size(); ++*stored) {
      const Message& m = batch[*stored];
      uint64_t seq;
      SLOTSTREAM_RETURN_IF_ERROR(next_seq(m.device, &seq));
      Frame frame;
      SLOTSTREAM_RETURN_IF_ERROR(frame.append(m.data));
      SLOTSTREAM_RETURN_IF_ERROR(call_back(m.device, seq, [&] { return memoryview_of(std::move(frame)); }));
      delivered(m.device, seq);
    }
    return Status::ok();
  }

  std::map<uint16_t, Frame> open_;  // messages being assembled, per device
};

// Receiver(..., zero_copy=True): each message lent in place (a MessageView object, PyView).
class PyViewSink final : public ViewSink, PyDelivery {
 public:
  PyViewSink(RxShared& shared, std::string sender) : PyDelivery(shared, std::move(sender)) {}

  Status take(MessageView& view) override {
    const uint16_t device = view.device();
    if (!shared_.callback_mode) {
      std::unique_lock lock(shared_.mutex);
      Status st = queue_locked(lock, device, [&](Delivered& d) {
        d.view = std::move(view);
        return Status::ok();
      });
      if (st.is_ok()) shared_.changed.notify_all();
      return st;
    }
    if (python_finalizing()) return {Code::kCancelled, "Python is shutting down"};
    nb::gil_scoped_acquire gil;
    uint64_t seq;
    SLOTSTREAM_RETURN_IF_ERROR(next_seq(device, &seq));
    SLOTSTREAM_RETURN_IF_ERROR(call_back(device, seq, [&] { return make_view(std::move(view), seq); }));
    delivered(device, seq);
    return Status::ok();
  }

  static nb::object make_view(MessageView&& view, uint64_t seq) {
    PyView v;
    v.sender = view.sender();
    v.seq = seq;
    v.view = std::move(view);
    return nb::cast(std::move(v));
  }
};

}  // namespace slotstream::py
