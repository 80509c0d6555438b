// What Sender and PlatformSender share: a Python buffer read in place (SendBuffer), the declared devices and
// their locks, the sender's life (SenderLife: send/finish/close and their locks), and the keyword arguments
// both take (SenderArgs).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace slotstream::py {

std::string default_sender_name();

// A Python object's buffer, exported while this lives: what send() reads in place.
class SendBuffer {
 public:
  explicit SendBuffer(nb::handle data) {
    if (!PyObject_CheckBuffer(data.ptr())) {
      throw nb::type_error(("send() needs a bytes-like object (bytes, bytearray, memoryview, numpy array), not " +
                            std::string(Py_TYPE(data.ptr())->tp_name))
                               .c_str());
    }
    if (PyObject_GetBuffer(data.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      throw nb::value_error("send() needs C-contiguous data (use numpy.ascontiguousarray(frame))");
    }
  }
  ~SendBuffer() { PyBuffer_Release(&view_); }
  SendBuffer(const SendBuffer&) = delete;
  SendBuffer& operator=(const SendBuffer&) = delete;
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(view_.buf), size_t(view_.len)}; }

 private:
  Py_buffer view_;
};

using DeviceLocks = std::map<int, std::unique_ptr<std::mutex>>;

// Checks and declares devices for a sender: 0..65535, each once; one mutex each.
std::vector<uint16_t> declare_devices(const std::vector<int>& devices, DeviceLocks* locks);

std::mutex* device_lock(DeviceLocks& locks, int device);

// What both Python senders share: the library's sender and its life — send() under a shared
// lock and one mutex per declared device (DeviceStream's contract), finish()/close() exclusive, so
// they wait for sends in progress. `what` names the class in messages.
template <typename S>
class SenderLife {
 public:
  explicit SenderLife(const char* what) : what_(what) {}
  ~SenderLife() {
    nb::gil_scoped_release nogil;  // stopping the sending threads must not block other Python threads
    sender_.reset();               // unfinished: the receiver keeps the complete messages and reports the sender lost
  }

  // Waits until the receiver stored every message, then closes. Idempotent; a failed finish
  // raises again when repeated. A library sender that can be aborted (Sender::abort) finishes
  // on a thread of its own while this one returns to Python every kSignalCheck: Ctrl-C
  // (KeyboardInterrupt) or `timeout` seconds (slotstream.Timeout) abandon the connection, as
  // close() does.
  void finish(std::optional<double> timeout = std::nullopt) {
    const auto deadline = deadline_after(timeout);
    std::unique_lock<std::shared_mutex> life;
    {
      nb::gil_scoped_release nogil;
      life = std::unique_lock(life_);
    }
    if (!sender_) {
      check({Code::kInvalidArgument, "finish() on a " + std::string(what_) + " that was closed without finishing"});
    }
    closed_ = finished_ = true;
    Status st;
    if constexpr (requires(S & s) { s.abort(Status{}); }) {
      st = finish_interruptibly(deadline, timeout);
    } else {
      nb::gil_scoped_release nogil;
      st = sender_->finish();
    }
    check(st);
  }

  // Abandons the connection without waiting (what leaving a `with` block by an exception does):
  // the receiver keeps the complete messages and reports this sender lost.
  void close() {
    nb::gil_scoped_release nogil;
    std::unique_lock life(life_);
    closed_ = true;
    if (!finished_) sender_.reset();
  }

  bool is_closed() const {
    std::shared_lock life(life_);
    return closed_;
  }

 protected:
  // One message of `device` through `fn(sender, bytes, step deadline, progress)`, the buffer read
  // in place. `fn` gives up with kTimeout at the step deadline (kSignalCheck, or the caller's
  // `timeout`) and continues from `progress` when called again: between steps this thread runs
  // Python's signal handlers (Ctrl-C raises KeyboardInterrupt). An interrupted message was not sent
  // (if it had begun, the receiver discards its part).
  template <typename F>
  void send_with(int device, nb::handle data, std::optional<double> timeout, F&& fn) {
    std::mutex* lock = device_lock(device_locks_, device);
    const auto deadline = deadline_after(timeout);
    SendBuffer view(data);
    DeviceStream::Progress progress;
    for (;;) {
      Status st;
      {
        // The buffer stays exported (it cannot be resized or freed) until released; the library
        // copies it, so no copy is made here.
        nb::gil_scoped_release nogil;
        std::shared_lock life(life_);
        if (!sender_ || closed_) {
          st = {Code::kInvalidArgument, "send() on a " + std::string(what_) + " that is finished or closed"};
        } else {
          std::lock_guard one_thread_per_device(*lock);
          st = fn(*sender_, view.bytes(), next_check(deadline), &progress);
        }
      }
      if (st.code() != Code::kTimeout) return check(st);
      if (deadline && Clock::now() >= *deadline) {
        check({Code::kTimeout,
               "send() timed out after " + seconds_text(timeout) + ": " + st.message() + "; the message was not sent"});
      }
      if (PyErr_CheckSignals() != 0) throw nb::python_error();  // KeyboardInterrupt, ...
    }
  }
  auto stats_snapshot() const {
    std::optional<decltype(sender_->stats())> s;
    nb::gil_scoped_release nogil;
    std::shared_lock life(life_);
    if (sender_) s = sender_->stats();
    return s;
  }

  std::unique_ptr<S> sender_;
  DeviceLocks device_locks_;

 private:
  // finish() of a library sender with abort(), on a thread of its own (see finish()). Called with
  // the GIL held and life_ held exclusively.
  Status finish_interruptibly(std::optional<Clock::time_point> deadline, std::optional<double> timeout) {
    struct Done {
      std::mutex mutex;
      std::condition_variable cv;
      bool done = false;
      Status st;
    };
    auto done = std::make_shared<Done>();
    S* s = sender_.get();
    std::thread finisher([s, done] {
      Status st = s->finish();  // the library object stays, for stats()
      std::lock_guard l(done->mutex);
      done->st = std::move(st);
      done->done = true;
      done->cv.notify_all();
    });
    auto abandon = [&] {
      nb::gil_scoped_release nogil;
      s->abort({Code::kCancelled, "sender cancelled"});  // the library's finish() returns within ~100 ms
      finisher.join();
      finished_ = false;  // close() drops the connection
    };
    bool in_time;
    try {
      in_time = wait_interruptibly(
          done->mutex, done->cv, [&] { return done->done; }, deadline);
    } catch (...) {
      abandon();
      throw;
    }
    if (!in_time) {
      abandon();
      return {Code::kTimeout, "finish() timed out after " + seconds_text(timeout) +
                                  " (the receiver had not confirmed every message); the connection was abandoned"};
    }
    nb::gil_scoped_release nogil;
    finisher.join();
    return done->st;
  }

  const char* what_;
  mutable std::shared_mutex life_;  // send: shared; finish, close: exclusive
  bool closed_ = false;
  bool finished_ = false;
};

// The keyword arguments Sender and PlatformSender share, as the library's SenderOptions (one place:
// each checked against the option schema, the datagram ones only when given).
struct SenderArgs {
  std::optional<std::string> name;
  std::string transport = "auto";
  std::optional<std::string> protocol;  // None: the transport's default (status_byte; udp: write_record)
  int64_t blocks = kDefaultBlocks;
  int64_t block_size = kDefaultBlockSize;
  std::optional<std::string> token, rdma_transport, rdma_device;
  // The datagram transport's (transport="udp"): DatagramOptions.
  std::optional<int64_t> segment_size, max_message, ttl;
  std::optional<std::string> interface;
  double stall_timeout = kDefaultStallTimeout.count() / 1000.0;  // seconds

  SenderOptions options(const std::vector<int>& devices, DeviceLocks* locks) const {
    SenderOptions o;
    o.stall_timeout = stall_timeout_arg(stall_timeout);
    o.transport = transport_arg(transport);
    o.rdma = rdma_args(rdma_transport, rdma_device);
    o.name = name ? *name : default_sender_name();
    o.protocol = protocol.value_or("");
    o.blocks = schema_arg<uint32_t>("blocks", blocks);
    o.block_size = schema_arg<uint32_t>("block_size", block_size);
    o.token = token.value_or("");
    if (segment_size) o.datagram.segment_size = schema_arg<uint32_t>("segment_size", *segment_size);
    if (max_message) o.datagram.max_message = schema_arg<uint64_t>("max_message", *max_message);
    if (ttl) o.datagram.ttl = schema_arg<int>("ttl", *ttl);
    if (interface) o.datagram.interface = *interface;
    o.devices = declare_devices(devices, locks);
    return o;
  }
};

}  // namespace slotstream::py
