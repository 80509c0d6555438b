// The `slotstream._slotstream` extension: Python's Sender and Receiver over the C++ library
// (include/slotstream/slotstream.h), which stays the only implementation.
//
// Threading and the GIL:
//   * Every call that may wait (connect, send, finish, iteration, wait, close) releases the GIL
//     first and takes its own locks only after that, so no thread ever holds a lock while
//     waiting for the GIL, and other Python threads run meanwhile.
//   * Sender: send() may be called from several Python threads. DeviceStream's contract is one
//     thread per device at a time, so each device has a mutex; finish()/close() wait for sends
//     in progress (a shared/exclusive lock), as Sender::finish() requires.
//   * Receiver: the library calls the sink from one thread per connected sender. The sink never
//     touches Python objects except to call the user's callback, under the GIL; in iterator
//     mode it only queues C++ data, converted to Python objects by the iterating thread.
//   * Receiver(..., workers=...): slotstream::ViewWorkers calls each device's Python worker on that
//     device's own thread, with the GIL; Python objects it holds are let go with the GIL (PyRef).
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "slotstream/options.h"
#include "slotstream/platform.h"
#include "slotstream/slotstream.h"
#include "slotstream/view_workers.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace slotstream;

namespace {

using Clock = std::chrono::steady_clock;
// How often a waiting call wakes up to let Python handle signals (Ctrl-C).
constexpr auto kSignalCheck = std::chrono::milliseconds(100);
// How long a sink waits for room in a full iterator queue before reporting kBusy (the receiver
// then holds its blocks and retries: back-pressure reaches the sender, nothing is dropped).
constexpr auto kQueueWait = std::chrono::milliseconds(50);
constexpr size_t kMaxEvents = 100;

// ------------------------------------------------------------------------------------ errors

// Raises the Python exception for a library Status: slotstream.errors maps the library's code
// name to a class (InvalidArgument is a ValueError, PeerGone a ConnectionError, ...); the
// message is the library's. Needs the GIL.
[[noreturn]] void raise_status(const Status& st) {
  nb::object cls = nb::module_::import_("slotstream.errors").attr("error_class")(code_name(st.code()));
  PyErr_SetObject(cls.ptr(), cls(st.message(), code_name(st.code())).ptr());
  throw nb::python_error();
}

void check(const Status& st) {
  if (!st.is_ok()) raise_status(st);
}

// Numbers arrive as signed Python ints and are range-checked here, so that -1 or 2**40 raises
// InvalidArgument naming the range (as the CLI does), not nanobind's "incompatible function arguments".
template <class T>
T in_range(const char* what, int64_t v, int64_t lo, int64_t hi, const char* unit = "") {
  if (v < lo || v > hi) {
    check({Code::kInvalidArgument, std::string(what) + " " + std::to_string(v) + " is not in range " +
                                       std::to_string(lo) + ".." + std::to_string(hi) + unit + ": give an int in it"});
  }
  return T(v);
}
// A keyword argument of the option schema (slotstream/options.h): its range and its one message, as the
// CLI's flags and the GStreamer properties say it ("blocks 0 is not in range 1..4096").
template <class T>
T schema_arg(const char* name, int64_t v) {
  if (auto why = out_of_range(*find_option(name), double(v))) {
    check({Code::kInvalidArgument, std::string(name) + " " + *why});
  }
  return T(v);
}
// stall_timeout= seconds (SenderOptions::stall_timeout): 0 waits for ever; the library checks the rest.
std::chrono::milliseconds stall_timeout_arg(double seconds) {
  if (!(seconds >= 0) || seconds > 86400.0 * 365) {
    check({Code::kInvalidArgument,
           "stall_timeout " + std::to_string(seconds) + " is not a number of seconds >= 2 (or 0: wait for ever)"});
  }
  return std::chrono::milliseconds(int64_t(seconds * 1000 + 0.5));
}

// Waits (GIL released) until `done()` under `lock`, waking every kSignalCheck to run Python's
// signal handlers (KeyboardInterrupt propagates as an exception). Returns false on `deadline`.
template <typename Pred>
bool wait_interruptibly(std::mutex& m, std::condition_variable& cv, Pred done,
                        std::optional<Clock::time_point> deadline = std::nullopt) {
  for (;;) {
    bool ok;
    {
      nb::gil_scoped_release nogil;
      std::unique_lock lock(m);
      auto until = Clock::now() + kSignalCheck;
      if (deadline && *deadline < until) until = *deadline;
      ok = cv.wait_until(lock, until, done);
    }
    if (ok) return true;
    if (deadline && Clock::now() >= *deadline) return false;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

// The deadline of a call's optional `timeout=` (seconds).
std::optional<Clock::time_point> deadline_after(std::optional<double> timeout) {
  if (!timeout) return std::nullopt;
  if (*timeout < 0) throw nb::value_error("timeout must be >= 0 (or None: no limit)");
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout));
}

// One step of a wait: at most kSignalCheck, and never past the caller's deadline.
Clock::time_point next_check(std::optional<Clock::time_point> deadline) {
  const auto step = Clock::now() + kSignalCheck;
  return deadline && *deadline < step ? *deadline : step;
}

std::string seconds_text(std::optional<double> timeout) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", timeout ? *timeout : 0.0);
  return buf;
}

// A thread that asks for the GIL while the interpreter shuts down never gets it back.
bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// ------------------------------------------------------------------------------------ frames

// One received message, owned: the receiver's block is reused as soon as the sink returns, so a
// message is copied out once (append) and the Python side gets a view of this copy that it may
// keep as long as it likes. Exposed to Python through the buffer protocol (memoryview, numpy).
struct Frame {
  std::byte* data = nullptr;
  size_t size = 0;
  size_t capacity = 0;

  Frame() = default;
  Frame(Frame&& o) noexcept : data(o.data), size(o.size), capacity(o.capacity) {
    o.data = nullptr;
    o.size = o.capacity = 0;
  }
  Frame& operator=(Frame&& o) noexcept {
    std::swap(data, o.data);
    std::swap(size, o.size);
    std::swap(capacity, o.capacity);
    return *this;
  }
  Frame(const Frame&) = delete;
  ~Frame() { std::free(data); }

  // Appends a fragment; kBusy (retried later, nothing lost) if memory is short.
  Status append(std::span<const std::byte> bytes) {
    if (size + bytes.size() > capacity) {
      size_t want = std::max(size + bytes.size(), capacity * 2);
      auto* grown = static_cast<std::byte*>(std::realloc(data, want ? want : 1));
      if (!grown) return {Code::kBusy, "out of memory for a " + std::to_string(want) + "-byte message"};
      data = grown;
      capacity = want;
    }
    if (!bytes.empty()) std::memcpy(data + size, bytes.data(), bytes.size());
    size += bytes.size();
    return Status::ok();
  }
};

int frame_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  static std::byte empty{};
  Frame* f = nb::inst_ptr<Frame>(self);
  return PyBuffer_FillInfo(view, self, f->data ? f->data : &empty, Py_ssize_t(f->size), /*readonly=*/0, flags);
}

PyType_Slot frame_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(frame_getbuffer)}, {0, nullptr}};

// One message lent in place (Receiver(..., zero_copy=True); slotstream.h MessageView): the buffer
// protocol exports the receive block itself, read-only. Its block stays held (status 2: the sender
// skips it) until release(), the end of a `with` block, or garbage collection. release() while a
// memoryview or numpy array still uses the bytes is refused (BufferError): the block would be
// rewritten under it; once released, exporting raises instead of reading reused memory.
struct PyView {
  MessageView view;
  std::string sender;
  uint64_t seq = 0;
  Py_ssize_t exports = 0;  // buffers handed out and not yet given back (GIL held)

  void release() {
    if (exports > 0) {
      throw nb::buffer_error((std::to_string(exports) +
                              " memoryview/numpy object(s) still use this message: delete them before release() "
                              "(the message's block would be rewritten under them)")
                                 .c_str());
    }
    view.release();
  }
};

int view_getbuffer(PyObject* self, Py_buffer* out, int flags) {
  PyView* v = nb::inst_ptr<PyView>(self);
  if (!v->view) {
    PyErr_SetString(PyExc_ValueError,
                    "this message view was released: its receive block may hold other data now (keep the view, "
                    "or copy the bytes before releasing it)");
    out->obj = nullptr;
    return -1;
  }
  static std::byte empty{};
  auto data = v->view.data();
  void* p = data.empty() ? static_cast<void*>(&empty) : const_cast<std::byte*>(data.data());
  if (PyBuffer_FillInfo(out, self, p, Py_ssize_t(data.size()), /*readonly=*/1, flags) != 0) return -1;
  ++v->exports;
  return 0;
}

void view_releasebuffer(PyObject* self, Py_buffer*) { --nb::inst_ptr<PyView>(self)->exports; }

PyType_Slot view_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(view_getbuffer)},
                            {Py_bf_releasebuffer, reinterpret_cast<void*>(view_releasebuffer)},
                            {0, nullptr}};

// ------------------------------------------------------------------------------------ sender

std::string default_sender_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

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
std::vector<uint16_t> declare_devices(const std::vector<int>& devices, DeviceLocks* locks) {
  std::vector<uint16_t> out;
  for (int d : devices) {
    if (d < 0 || d > 65535) check({Code::kInvalidArgument, "device " + std::to_string(d) + " is not in 0..65535"});
    if (locks->contains(d)) check({Code::kInvalidArgument, "device " + std::to_string(d) + " is declared twice"});
    out.push_back(uint16_t(d));
    (*locks)[d] = std::make_unique<std::mutex>();
  }
  return out;
}

std::mutex* device_lock(DeviceLocks& locks, int device) {
  auto it = locks.find(device);
  if (it == locks.end()) {
    check({Code::kInvalidArgument,
           "device " + std::to_string(device) + " was not declared (Sender(..., devices=[...]) lists every device)"});
  }
  return it->second.get();
}

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

// transport="auto|shm|tcp|rdma|udp", rdma_transport="rc|dc|ud" or None, rdma_device="NAME:PORT" or None.
Transport transport_arg(const std::string& transport) {
  auto t = parse_transport(transport);
  if (!t) {
    check({Code::kInvalidArgument, "transport must be 'auto', 'shm', 'tcp', 'rdma' or 'udp', not '" + transport + "'"});
  }
  return *t;
}

RdmaOptions rdma_args(const std::optional<std::string>& transport, const std::optional<std::string>& device) {
  RdmaOptions o;
  if (transport) {
    o.transport = parse_rdma_transport(*transport);
    if (!o.transport) {
      check({Code::kInvalidArgument, "rdma_transport must be 'rc', 'dc' or 'ud', not '" + *transport + "'"});
    }
  }
  o.device = device.value_or("");
  return o;
}

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

class PySender : public SenderLife<Sender> {
 public:
  PySender(const std::string& to, std::optional<std::string> name, const std::string& transport,
           std::optional<std::string> protocol, int64_t blocks, int64_t block_size, const std::vector<int>& devices,
           std::optional<std::string> token, std::optional<std::string> rdma_transport,
           std::optional<std::string> rdma_device, std::optional<int64_t> segment_size,
           std::optional<int64_t> max_message, std::optional<int64_t> ttl, std::optional<std::string> interface,
           double stall_timeout)
      : SenderLife("Sender") {
    const SenderArgs args{std::move(name),
                          transport,
                          std::move(protocol),
                          blocks,
                          block_size,
                          std::move(token),
                          std::move(rdma_transport),
                          std::move(rdma_device),
                          segment_size,
                          max_message,
                          ttl,
                          std::move(interface),
                          stall_timeout};
    SenderOptions o = args.options(devices, &device_locks_);
    check(parse_address(to, &o.host, &o.port));
    Status st;
    {
      nb::gil_scoped_release nogil;  // the handshake may take seconds
      st = Sender::connect(o, &sender_);
    }
    check(st);
    transport_ = transport_name(sender_->transport());
    transport_reason_ = sender_->transport_reason();
    o.protocol = sender_->protocol();
    options_ = std::move(o);
  }

  void send(int device, nb::handle data, std::optional<double> timeout) {
    send_with(
        device, data, timeout,
        [device](Sender& s, std::span<const std::byte> bytes, Clock::time_point step,
                 DeviceStream::Progress* progress) { return s.device(uint16_t(device))->send(bytes, step, progress); });
  }
  void finish(std::optional<double> timeout) { SenderLife::finish(timeout); }
  void finish_no_timeout() { SenderLife::finish(); }
  void close() { SenderLife::close(); }

  nb::dict stats() const {
    auto s = stats_snapshot();
    nb::dict d;
    if (!s) return d;
    // The protocol counters (blocks, synchronisations) are left out: their names are still
    // changing in the C++ API, and `slotstream bench` is where they are reported.
    d["messages"] = s->messages;
    d["bytes"] = s->bytes;
    d["held_skips"] = s->held_skips;
    d["connections"] = s->connections;
    d["per_device"] = s->per_device;
    if (!s->delivered.empty()) {  // the datagram transport: what the receiver said at finish()
      nb::dict delivered;
      for (const auto& [device, c] : s->delivered) {
        nb::dict x;
        x["complete"] = c.messages;
        x["partial"] = c.partial;
        x["dropped"] = c.dropped;
        x["lost"] = c.lost;
        x["valid_bytes"] = c.bytes;
        delivered[nb::int_(device)] = x;
      }
      d["delivered"] = delivered;
    }
    return d;
  }

  const std::string& transport() const { return transport_; }
  const std::string& transport_reason() const { return transport_reason_; }
  const SenderOptions& options() const { return options_; }

 private:
  SenderOptions options_;
  std::string transport_;  // what the receiver chose
  std::string transport_reason_;
};

// A sender whose receiver the platform chooses (include/slotstream/platform.h): the same
// send/finish/close contract as PySender.
class PyPlatformSender : public SenderLife<PlatformSender> {
 public:
  PyPlatformSender(const std::string& platform, std::optional<std::string> name, const std::vector<int>& devices,
                   double need_cpu, double need_bandwidth, double need_fps, const std::string& transport,
                   std::optional<std::string> protocol, int64_t blocks, int64_t block_size,
                   std::optional<std::string> token, int64_t lease_ttl, double patience, double stall_timeout,
                   std::optional<std::string> platform_cacert, std::optional<std::string> platform_cert,
                   std::optional<std::string> platform_key, std::optional<std::string> platform_user,
                   std::optional<std::string> platform_password, std::optional<std::string> rdma_transport,
                   std::optional<std::string> rdma_device)
      : SenderLife("PlatformSender") {
    PlatformSenderOptions o;
    o.platform = platform;
    o.security = {platform_cacert.value_or(""), platform_cert.value_or(""), platform_key.value_or(""),
                  platform_user.value_or(""), platform_password.value_or("")};
    SenderArgs args{std::move(name), transport,        std::move(protocol),       blocks,
                    block_size,      std::move(token), std::move(rdma_transport), std::move(rdma_device)};
    args.stall_timeout = stall_timeout;
    o.sender = args.options(devices, &device_locks_);
    if (o.sender.protocol.empty()) o.sender.protocol = kDefaultProtocol;  // the platform serves UCX transports
    o.need = {need_cpu, need_bandwidth, need_fps};
    o.lease_ttl_seconds = lease_ttl;
    o.patience = std::chrono::milliseconds(int64_t(patience * 1000));
    Status st;
    {
      nb::gil_scoped_release nogil;  // scheduling and the handshake may take seconds
      st = PlatformSender::connect(std::move(o), &sender_);
    }
    check(st);
  }

  // A step that gives up has not taken the message (PlatformSender::send with a deadline): the next
  // step sends it afresh.
  void send(int device, nb::handle data, std::optional<double> timeout) {
    send_with(device, data, timeout,
              [device](PlatformSender& s, std::span<const std::byte> bytes, Clock::time_point deadline,
                       DeviceStream::Progress*) { return s.send(uint16_t(device), bytes, deadline); });
  }
  void finish(std::optional<double> timeout) { SenderLife::finish(timeout); }
  void finish_no_timeout() { SenderLife::finish(); }
  void close() { SenderLife::close(); }

  nb::dict stats() const {
    auto s = stats_snapshot();
    nb::dict d;
    if (!s) return d;
    d["messages"] = s->messages;
    d["resent"] = s->resent;
    d["reschedules"] = s->reschedules;
    d["connections"] = s->connections;
    d["receiver"] = s->receiver;
    d["schedule_ms"] = s->schedule_ms;
    return d;
  }
};

// ---------------------------------------------------------------------------------- receiver

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

nb::object memoryview_of(Frame&& frame) {
  nb::object obj = nb::cast(std::move(frame));
  nb::object view = nb::steal(PyMemoryView_FromObject(obj.ptr()));
  if (!view.is_valid()) throw nb::python_error();
  return view;
}

class PySink final : public MessageSink, PyDelivery {
 public:
  PySink(RxShared& shared, std::string sender) : PyDelivery(shared, std::move(sender)) {}

  Status begin(uint16_t device) override {
    open_[device] = Frame();
    return Status::ok();
  }
  Status append(uint16_t device, std::span<const std::byte> data) override { return open_[device].append(data); }
  void abort(uint16_t device) override { open_.erase(device); }

  // Every whole message of a consumer pass (issue 21): in iterator mode queued under one lock
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

// ----------------------------------------------------------------- in-process workers (issue 22)

// A Python object held by C++ code that may drop it on a thread without the GIL (a worker thread
// destroys a failed worker; the last sink may go on a session thread): the GIL is taken to let go.
struct PyRef {
  explicit PyRef(nb::object o) : obj(std::move(o)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (python_finalizing()) {
      obj.release();  // the interpreter is going: no thread can take the GIL any more
      return;
    }
    nb::gil_scoped_acquire gil;
    obj.reset();
  }
  nb::object obj;
};

// Receiver(..., workers=factory, zero_copy=True): slotstream::ViewWorkers (view_workers.h) with a
// Python worker per (sender, device), made by `factory(sender, device)` and called as
// `worker(seq, view)` on the device's own thread, with the GIL. A factory or worker that raises
// stops the receiver as a raising callback does; the view it was given is released (its
// traceback's frames are cleared first: they would keep every array made from the view alive).
class PyWorkers {
 public:
  static ViewWorkersOptions options(RxShared& shared, nb::object factory, uint32_t backlog) {
    ViewWorkersOptions o;
    o.backlog_messages = backlog;
    auto f = std::make_shared<PyRef>(std::move(factory));
    o.make_worker = [&shared, f](const std::string& sender, uint16_t device, ViewWorker* out) {
      return make(shared, *f, sender, device, out);
    };
    o.on_event = [&shared](const std::string& text) {
      std::lock_guard lock(shared.mutex);
      shared.events.push_back(text);
      if (shared.events.size() > kMaxEvents) shared.events.pop_front();
    };
    return o;
  }

 private:
  static Status refused(RxShared& shared) {
    if (python_finalizing()) return {Code::kCancelled, "Python is shutting down"};
    std::lock_guard lock(shared.mutex);
    if (shared.failed) return {Code::kCancelled, "a Python worker raised; nothing more is delivered"};
    return Status::ok();
  }

  static Status make(RxShared& shared, PyRef& factory, const std::string& sender, uint16_t device, ViewWorker* out) {
    SLOTSTREAM_RETURN_IF_ERROR(refused(shared));
    nb::gil_scoped_acquire gil;
    std::shared_ptr<PyRef> worker;
    try {
      worker = std::make_shared<PyRef>(factory.obj(sender, device));
      if (!PyCallable_Check(worker->obj.ptr())) {
        PyErr_SetString(PyExc_TypeError, "workers(sender, device) must return a callable worker(seq, view)");
        throw nb::python_error();
      }
    } catch (nb::python_error& e) {
      shared.raised(e, "the receiver's worker failed: its workers factory raised for sender '" + sender + "' device " +
                           std::to_string(device));
      return {Code::kCancelled, "the Python workers factory raised"};
    }
    *out = [&shared, worker, sender, device](MessageView& view) { return call(shared, *worker, sender, device, view); };
    return Status::ok();
  }

  static Status call(RxShared& shared, PyRef& worker, const std::string& sender, uint16_t device, MessageView& view) {
    SLOTSTREAM_RETURN_IF_ERROR(refused(shared));
    nb::gil_scoped_acquire gil;
    uint64_t seq;
    {
      std::lock_guard lock(shared.mutex);
      seq = shared.next_seq[std::make_pair(sender, device)]++;
    }
    nb::object obj = PyViewSink::make_view(std::move(view), seq);
    try {
      worker.obj(seq, obj);
    } catch (nb::python_error& e) {
      nb::module_::import_("traceback").attr("clear_frames")(e.traceback());
      PyView* v = nb::inst_ptr<PyView>(obj.ptr());
      if (v->exports == 0) v->view.release();  // else arrays kept beyond the call keep it
      shared.raised(e, "the receiver's worker failed on message " + std::to_string(seq) + " of sender '" + sender +
                           "' device " + std::to_string(device));
      return {Code::kCancelled, "the Python worker raised"};
    }
    std::lock_guard lock(shared.mutex);
    shared.changed.notify_all();  // wait(): the workers may be idle now
    return Status::ok();
  }
};

nb::dict report_dict(const SessionReport& r) {
  nb::dict d;
  d["sender"] = r.sender.name;
  d["peer"] = r.sender.peer;
  d["protocol"] = r.sender.protocol;
  d["transport"] = transport_name(r.sender.transport);
  d["devices"] = r.sender.devices;
  d["finished"] = r.finished;
  d["reason"] = r.reason;
  d["messages"] = r.messages;
  d["bytes"] = r.bytes;
  d["gaps"] = r.gaps;
  d["duplicates"] = r.duplicates;
  d["seconds"] = r.seconds;
  return d;
}

class PyReceiver {
 public:
  PyReceiver(const std::string& listen, nb::object callback, const std::string& transport,
             std::optional<std::string> token, std::optional<int64_t> exit_after_senders, int64_t max_queue,
             std::optional<std::string> rdma_transport, std::optional<std::string> rdma_device, bool zero_copy,
             int64_t max_held_blocks, nb::object workers, int64_t worker_backlog)
      : shared_(std::make_unique<RxShared>()),
        exit_after_(exit_after_senders ? std::optional<uint64_t>(in_range<uint64_t>("exit_after_senders",
                                                                                    *exit_after_senders, 0, INT64_MAX))
                                       : std::nullopt) {
    if (!callback.is_none() && !PyCallable_Check(callback.ptr())) throw nb::type_error("callback must be callable");
    if (!workers.is_none()) check_workers(workers, callback, zero_copy);
    in_range<size_t>("max_queue", max_queue, 1, INT64_MAX);
    schema_arg<uint32_t>("max_held_blocks", max_held_blocks);
    in_range<uint32_t>("worker_backlog", worker_backlog, 0, UINT32_MAX);
    ReceiverOptions o;
    check(parse_address(listen, &o.host, &o.port));
    o.transport = transport_arg(transport);
    o.rdma = rdma_args(rdma_transport, rdma_device);
    o.token = token.value_or("");
    RxShared* shared = shared_.get();
    shared->max_queue = max_queue;
    shared->callback_mode = !callback.is_none();
    if (shared->callback_mode) shared->callback = callback;
    shared->workers_mode = !workers.is_none();
    if (shared->workers_mode) {
      o.max_held_blocks = max_held_blocks;
      check(ViewWorkers::start(PyWorkers::options(*shared, std::move(workers), worker_backlog), &workers_));
      o.make_view_sink = workers_->view_sink();
    } else if (zero_copy) {
      o.max_held_blocks = max_held_blocks;
      o.make_view_sink = [shared](const SenderInfo& info, std::unique_ptr<ViewSink>* out) {
        *out = std::make_unique<PyViewSink>(*shared, info.name);
        return Status::ok();
      };
    } else {
      o.make_sink = [shared](const SenderInfo& info, std::unique_ptr<MessageSink>* out) {
        *out = std::make_unique<PySink>(*shared, info.name);
        return Status::ok();
      };
    }
    o.on_session_end = [shared](const SessionReport& r) {
      std::lock_guard lock(shared->mutex);
      shared->ended.push_back(r);
      shared->changed.notify_all();
    };
    o.on_event = [shared](const std::string& text) {
      std::lock_guard lock(shared->mutex);
      shared->events.push_back(text);
      if (shared->events.size() > kMaxEvents) shared->events.pop_front();
    };
    Status st;
    {
      nb::gil_scoped_release nogil;
      std::lock_guard lock(shared->stop_mutex);  // a callback that raises at once waits for the pointer
      st = Receiver::start(std::move(o), &receiver_);
      shared->receiver = receiver_.get();
    }
    check(st);
    address_ = receiver_->listen_address();
    live_receivers().insert(this);
  }

  ~PyReceiver() {
    stop();
    live_receivers().erase(this);
    // The callback and a stored exception are Python objects: released here, with the GIL.
  }

  // Stops accepting and ends every session (partial messages are dropped; complete ones already
  // queued can still be iterated). Idempotent.
  void stop() {
    {
      std::lock_guard lock(shared_->mutex);
      shared_->closing = true;
      shared_->changed.notify_all();
    }
    {
      nb::gil_scoped_release nogil;  // session threads may be waiting for the GIL (callback)
      shared_->stop_receiver();
      std::thread stopper;
      {
        std::lock_guard lock(shared_->mutex);
        stopper = std::move(shared_->stopper);
      }
      if (stopper.joinable()) stopper.join();
      if (workers_) workers_->stop();  // each worker finishes what was handed to it, then its thread ends
    }
    shared_->callback = nb::object();  // no session thread is left to call it
  }

  void close() {
    stop();
    raise_callback_error();
  }

  // Iterator mode: the next (sender, device, seq, memoryview); StopIteration once
  // exit_after_senders have ended (or the receiver was closed) and every queued message is out.
  nb::tuple next() {
    nb::object item = get(std::nullopt);
    if (item.is_none()) throw nb::stop_iteration();
    return nb::borrow<nb::tuple>(item);
  }

  // The next (sender, device, seq, memoryview) as iteration gives it, None where iteration would
  // end; slotstream.Timeout when nothing came within `timeout` seconds. Returns to Python every
  // kSignalCheck while it waits (Ctrl-C raises KeyboardInterrupt).
  nb::object get(std::optional<double> timeout) {
    if (shared_->callback_mode || shared_->workers_mode) {
      check({Code::kInvalidArgument, std::string("this Receiver delivers to its ") +
                                         (shared_->workers_mode ? "workers" : "callback") +
                                         "; iterate one made without a callback or workers"});
    }
    const auto deadline = deadline_after(timeout);
    std::optional<Delivered> item;
    RxShared& s = *shared_;
    const bool in_time = wait_interruptibly(
        s.mutex, s.changed,
        [&] {
          if (!s.queue.empty()) {
            item = std::move(s.queue.front());
            s.queue.pop_front();
            s.changed.notify_all();  // room for a waiting sink
            return true;
          }
          return s.closing || done_locked();
        },
        deadline);
    if (!in_time) check({Code::kTimeout, "no message within " + seconds_text(timeout)});
    if (!item) return nb::none();
    nb::object data =
        item->view ? PyViewSink::make_view(std::move(item->view), item->seq) : memoryview_of(std::move(item->data));
    return nb::make_tuple(item->sender, item->device, item->seq, data);
  }

  // Waits until `senders` sessions (default exit_after_senders) have ended; false on timeout.
  bool wait(std::optional<uint64_t> senders, std::optional<double> timeout) {
    if (!senders) senders = exit_after_;
    if (!senders) check({Code::kInvalidArgument, "wait() needs senders=N (or Receiver(..., exit_after_senders=N))"});
    std::optional<Clock::time_point> deadline;
    if (timeout)
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout));
    RxShared& s = *shared_;
    bool ok = wait_interruptibly(
        s.mutex, s.changed, [&] { return (s.ended.size() >= *senders && (!workers_ || workers_->idle())) || s.failed; },
        deadline);
    raise_callback_error();
    return ok;
  }

  nb::list sessions() const {
    std::lock_guard lock(shared_->mutex);
    nb::list out;
    for (const auto& r : shared_->ended) out.append(report_dict(r));
    return out;
  }
  nb::list live() const {
    nb::list out;
    if (receiver_) {
      for (const auto& r : receiver_->live_sessions()) out.append(report_dict(r));
    }
    return out;
  }
  std::vector<std::string> events() const {
    std::lock_guard lock(shared_->mutex);
    return {shared_->events.begin(), shared_->events.end()};
  }
  const std::string& address() const { return address_; }

  // Every receiver still open, stopped at interpreter exit (slotstream/__init__.py registers
  // close_all with atexit) before Python can no longer run a callback.
  static std::set<PyReceiver*>& live_receivers() {
    static std::set<PyReceiver*> all;
    return all;
  }

 private:
  bool done_locked() const { return exit_after_ && shared_->ended.size() >= *exit_after_; }

  void raise_callback_error() {
    if (!shared_->error.is_valid()) return;
    nb::object e = std::move(shared_->error);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
    throw nb::python_error();
  }

  static void check_workers(nb::handle workers, nb::handle callback, bool zero_copy) {
    if (!PyCallable_Check(workers.ptr())) throw nb::type_error("workers must be callable: workers(sender, device)");
    if (!callback.is_none()) check({Code::kInvalidArgument, "give a callback or workers, not both"});
    if (!zero_copy) {
      check({Code::kInvalidArgument,
             "workers= hands each device's worker the messages in place: pass zero_copy=True as well (a callback "
             "gets copies)"});
    }
  }

  std::unique_ptr<RxShared> shared_;
  std::unique_ptr<ViewWorkers> workers_;  // Receiver(..., workers=...); stopped after the receiver
  std::unique_ptr<Receiver> receiver_;
  std::optional<uint64_t> exit_after_;
  std::string address_;
};

}  // namespace

namespace {

// __enter__ returns the object; __exit__ calls `on_success` when the block ended normally and
// `on_exception` otherwise, and never suppresses the exception.
template <typename T, void (T::*on_success)(), void (T::*on_exception)()>
void def_context_manager(nb::class_<T>& cls, const char* enter_signature) {
  cls.def(
         "__enter__", [](nb::handle self) { return self; }, nb::sig(enter_signature))
      .def(
          "__exit__",
          [](T& self, nb::handle exc_type, nb::handle, nb::handle) {
            (self.*(exc_type.is_none() ? on_success : on_exception))();
            return false;
          },
          "exc_type"_a.none(), "exc"_a.none(), "tb"_a.none(),
          nb::sig("def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, "
                  "tb: types.TracebackType | None) -> bool"));
}

void bind_sender(nb::module_& m) {
  nb::class_<PySender> cls(m, "Sender",
                           "A connection to a slotstream receiver that carries the messages of several devices.\n\n"
                           "Use it as a context manager: leaving the block normally waits until the receiver has\n"
                           "stored every message (finish()); leaving it by an exception abandons the connection.");
  cls.def(nb::init<const std::string&, std::optional<std::string>, const std::string&, std::optional<std::string>,
                   int64_t, int64_t, const std::vector<int>&, std::optional<std::string>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>,
                   std::optional<std::string>, double>(),
          "to"_a, "name"_a = nb::none(), "transport"_a = "auto", "protocol"_a = nb::none(), "blocks"_a = kDefaultBlocks,
          "block_size"_a = kDefaultBlockSize, nb::kw_only(), "devices"_a.sig("(0,)") = std::vector<int>{0},
          "token"_a = nb::none(), "rdma_transport"_a = nb::none(), "rdma_device"_a = nb::none(),
          "segment_size"_a = nb::none(), "max_message"_a = nb::none(), "ttl"_a = nb::none(), "interface"_a = nb::none(),
          "stall_timeout"_a = kDefaultStallTimeout.count() / 1000.0,
          "Connects to the receiver at `to` (\"HOST:PORT\") as sender `name` (default: the host name)\n"
          "and declares `devices`, the device numbers send() will use. `transport`: 'auto' (shm on one\n"
          "host, else rdma where both ends have an RDMA NIC, else tcp), 'shm', 'tcp' or 'rdma'\n"
          "(`rdma_transport` 'rc', 'dc' or 'ud', default the receiver's; `rdma_device` 'mlx5_0:1'), or\n"
          "'udp': the datagram transport (`protocol` write_record (default), dgram_send, dgram_rd or\n"
          "rd_write_record; `blocks` message slots per device; `segment_size` bytes per datagram,\n"
          "`max_message` the largest message (default 1 MiB), `ttl` and `interface` for a multicast group).\n"
          "`stall_timeout`: seconds to wait on a receiver that says nothing (a live one says it is alive\n"
          "every second, also while it holds its blocks): then it counts as stopped or hung and send()\n"
          "and finish() raise PeerGone; at least 2, 0 waits for ever (not the datagram transport's).\n"
          "`protocol` None: the transport's default. Raises slotstream.Error subclasses (ConnectFailed,\n"
          "Refused, InvalidArgument — e.g. rdma without a usable device —, ...) with the library's message.")
      .def("send", &PySender::send, "device"_a, "data"_a, nb::kw_only(), "timeout"_a = nb::none(),
           nb::sig("def send(self, device: int, data: typing_extensions.Buffer | numpy.typing.NDArray[typing.Any], *, "
                   "timeout: float | None = None) -> None"),
           "Sends one message: any C-contiguous buffer (bytes, bytearray, memoryview, numpy array)\n"
           "is read in place and copied once, into the library's send block. Waits (GIL released) while\n"
           "every block is in flight, returning to Python every 0.1 s so that Ctrl-C raises\n"
           "KeyboardInterrupt; after `timeout` seconds raises slotstream.Timeout. An interrupted message\n"
           "was not sent (the receiver discards any part of it). Thread-safe.")
      .def("finish", &PySender::finish, nb::kw_only(), "timeout"_a = nb::none(),
           "Waits until the receiver has stored every message, then closes the connection. Ctrl-C\n"
           "(KeyboardInterrupt, within 0.2 s) or `timeout` seconds (slotstream.Timeout) abandon the\n"
           "connection instead: the receiver keeps the complete messages and reports the sender lost.")
      .def("close", &PySender::close, "Abandons the connection without waiting (unfinished messages are lost).")
      .def("stats", &PySender::stats, nb::sig("def stats(self) -> dict[str, typing.Any]"),
           "Counters: messages, bytes, per_device, held_skips (receiver blocks skipped because held),\n"
           "connections (filled in by finish()); over udp, after finish(), delivered: what the receiver\n"
           "made of each device's messages (complete, partial, dropped, lost, valid_bytes).")
      .def_prop_ro("transport", &PySender::transport, "'shm', 'tcp', 'rdma' or 'udp': what carries it.")
      .def_prop_ro("transport_reason", &PySender::transport_reason,
                   "Why the receiver chose it (and what failed on this side before it).")
      .def_prop_ro("name", [](const PySender& s) { return s.options().name; })
      .def_prop_ro("protocol", [](const PySender& s) { return s.options().protocol; })
      .def_prop_ro("blocks", [](const PySender& s) { return s.options().blocks; })
      .def_prop_ro("block_size", [](const PySender& s) { return s.options().block_size; })
      .def_prop_ro(
          "devices",
          [](const PySender& s) { return std::vector<int>(s.options().devices.begin(), s.options().devices.end()); })
      .def_prop_ro("closed", [](const PySender& s) { return s.is_closed(); });
  // Leaving the block normally waits for the receiver; leaving it by an exception abandons.
  def_context_manager<PySender, &PySender::finish_no_timeout, &PySender::close>(cls, "def __enter__(self) -> Sender");
}

void bind_platform_sender(nb::module_& m) {
  nb::class_<PyPlatformSender> cls(
      m, "PlatformSender",
      "A sender whose receiver the cloud-edge platform (etcd) chooses and reserves for the resources it\n"
      "needs; when that receiver dies it gets another and sends again what was not confirmed stored\n"
      "(docs/platform.md). The same send/finish/close contract and context manager as Sender.");
  cls.def(nb::init<const std::string&, std::optional<std::string>, const std::vector<int>&, double, double, double,
                   const std::string&, std::optional<std::string>, int64_t, int64_t, std::optional<std::string>,
                   int64_t, double, double, std::optional<std::string>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<std::string>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<std::string>>(),
          "platform"_a, "name"_a = nb::none(), nb::kw_only(), "devices"_a.sig("(0,)") = std::vector<int>{0},
          "need_cpu"_a = 0.0, "need_bandwidth"_a = 0.0, "need_fps"_a = 0.0, "transport"_a = "auto",
          "protocol"_a = nb::none(), "blocks"_a = kDefaultBlocks, "block_size"_a = kDefaultBlockSize,
          "token"_a = nb::none(), "lease_ttl"_a = 5, "patience"_a = 30.0,
          "stall_timeout"_a = kDefaultStallTimeout.count() / 1000.0, "platform_cacert"_a = nb::none(),
          "platform_cert"_a = nb::none(), "platform_key"_a = nb::none(), "platform_user"_a = nb::none(),
          "platform_password"_a = nb::none(), "rdma_transport"_a = nb::none(), "rdma_device"_a = nb::none(),
          "Asks the platform at `platform` (\"etcd://HOST:PORT[,HOST:PORT...]\") for a receiver with room for\n"
          "need_cpu cores, need_bandwidth bytes/s and need_fps messages/s (and the blocks' memory), and\n"
          "connects as sender `name`; `transport`, `protocol` (None: status_byte), `blocks`, `block_size`,\n"
          "`token`, `rdma_transport` and `rdma_device` as Sender's. Raises Refused with every receiver's\n"
          "shortfall when none has room, InvalidArgument for a negative or absurd need. A protected etcd\n"
          "(docs/platform.md): TLS with `platform_cacert` (PEM file of the members' CA;\n"
          "`platform_cert`/`platform_key`: a client certificate), etcd's own users with\n"
          "`platform_user`/`platform_password`. `stall_timeout` as Sender's; a receiver whose platform record\n"
          "went with its lease and that says nothing is left sooner (the next send moves).")
      .def("send", &PyPlatformSender::send, "device"_a, "data"_a, nb::kw_only(), "timeout"_a = nb::none(),
           nb::sig("def send(self, device: int, data: typing_extensions.Buffer | numpy.typing.NDArray[typing.Any], *, "
                   "timeout: float | None = None) -> None"),
           "Sends one message (kept until the receiver confirms it stored). Thread-safe. Waits (GIL released)\n"
           "while the receiver has no room; Ctrl-C (KeyboardInterrupt) or `timeout` seconds\n"
           "(slotstream.Timeout) give up, the message not sent (a message larger than a block whose first\n"
           "part went is sent in full).")
      .def("finish", &PyPlatformSender::finish, nb::kw_only(), "timeout"_a = nb::none(),
           "Waits until every message is stored (moving on if the receiver dies), then releases the reservation.\n"
           "Ctrl-C (KeyboardInterrupt) or `timeout` seconds (slotstream.Timeout) abandon the stream instead:\n"
           "the receiver keeps the complete messages; the reservation goes.")
      .def("close", &PyPlatformSender::close, "Abandons the stream without waiting; the reservation goes.")
      .def("stats", &PyPlatformSender::stats, nb::sig("def stats(self) -> dict[str, typing.Any]"),
           "Counters: messages, resent, reschedules, connections, receiver (the current one), schedule_ms.")
      .def_prop_ro("closed", [](const PyPlatformSender& s) { return s.is_closed(); });
  def_context_manager<PyPlatformSender, &PyPlatformSender::finish_no_timeout, &PyPlatformSender::close>(
      cls, "def __enter__(self) -> PlatformSender");
}

void bind_message_view(nb::module_& m) {
  nb::class_<PyView>(
      m, "MessageView", nb::type_slots(view_slots),
      "One message lent in place by Receiver(..., zero_copy=True): memoryview(v) or numpy.frombuffer(v)\n"
      "read the receive block itself (read-only, no copy). The block stays held (the sender skips it)\n"
      "until release(), the end of a `with` block, or garbage collection. release() while a memoryview\n"
      "or numpy array still uses it raises BufferError; reading a released view raises ValueError.")
      .def("release", &PyView::release,
           "Gives the message's block back to the sender (idempotent). Raises BufferError while a memoryview or\n"
           "numpy array made from this view still exists.")
      .def(
          "__enter__", [](nb::handle self) { return self; }, nb::sig("def __enter__(self) -> MessageView"))
      .def(
          "__exit__", [](PyView& v, nb::args) { v.release(); }, nb::sig("def __exit__(self, *args) -> None"))
      .def("__len__", [](const PyView& v) { return v.view.data().size(); })
      .def_prop_ro(
          "released", [](const PyView& v) { return !v.view; }, "Whether release() was called (or it was collected).")
      .def_prop_ro(
          "copied", [](const PyView& v) { return v.view.copied(); },
          "True for a message that spanned several blocks: it was copied once (not in place).")
      .def_prop_ro(
          "in_place", [](const PyView& v) { return v.view.in_registered_memory(); },
          "Whether the bytes lie in the receive memory registered with UCX (False for copies and once released).")
      .def_prop_ro(
          "address", [](const PyView& v) { return reinterpret_cast<uintptr_t>(v.view.data().data()); },
          "Address of the first byte (0 once released): numpy's data pointer is the same, no copy.")
      .def_ro("sender", &PyView::sender)
      .def_prop_ro("device", [](const PyView& v) { return v.view.device(); })
      .def_ro("seq", &PyView::seq, "The message's number on its device (as in the tuple).");
}

void bind_receiver(nb::module_& m) {
  nb::class_<PyReceiver> receiver(
      m, "Receiver",
      "A passive receiver: senders connect to `listen` and their messages arrive, complete\n"
      "and in order per device, either at `callback(sender, device, seq, data)` or by iterating\n"
      "(sender, device, seq, data) tuples. `data` is a memoryview of the message's own copy.");
  receiver
      .def(nb::init<const std::string&, nb::object, const std::string&, std::optional<std::string>,
                    std::optional<int64_t>, int64_t, std::optional<std::string>, std::optional<std::string>, bool,
                    int64_t, nb::object, int64_t>(),
           "listen"_a, "callback"_a = nb::none(), nb::kw_only(), "transport"_a = "auto", "token"_a = nb::none(),
           "exit_after_senders"_a = nb::none(), "max_queue"_a = 8, "rdma_transport"_a = nb::none(),
           "rdma_device"_a = nb::none(), "zero_copy"_a = false, "max_held_blocks"_a = 0, "workers"_a = nb::none(),
           "worker_backlog"_a = 16,
           nb::sig("def __init__(self, listen: str, callback: collections.abc.Callable[[str, int, int, "
                   "memoryview | MessageView], object] | None = None, *, transport: str = 'auto', "
                   "token: str | None = None, exit_after_senders: int | None = None, max_queue: int = 8, "
                   "rdma_transport: str | None = None, rdma_device: str | None = None, zero_copy: bool = False, "
                   "max_held_blocks: int = 0, workers: collections.abc.Callable[[str, int], "
                   "collections.abc.Callable[[int, MessageView], object]] | None = None, worker_backlog: int = 16) "
                   "-> None"),
           "Listens on `listen` (\"HOST:PORT\"; port 0 picks one, see .address). With `callback`, it is\n"
           "called from a receiver thread (one per connected sender) with the GIL held; if it raises,\n"
           "the receiver stops (its senders see it gone) and wait()/close() raise that exception.\n"
           "Without one, iterate the receiver;\n"
           "at most `max_queue` messages wait in memory, then the sender is slowed down (back-pressure).\n"
           "Iteration ends after `exit_after_senders` senders have ended, or after close().\n"
           "`transport`: what senders may use ('auto', 'shm', 'tcp', 'rdma'; 'rdma' without a usable RDMA\n"
           "device raises InvalidArgument; 'udp': the datagram transport, its UD and RD senders on this UDP\n"
           "port and dgram_rc senders on the TCP port of the same number, no zero_copy or workers);\n"
           "`rdma_transport` 'rc' (default), 'dc' or 'ud'; `rdma_device`.\n"
           "`zero_copy=True`: `data` is a MessageView of the message in its receive block (no copy; the\n"
           "block is held until the view is released) — senders must use status_byte; at most\n"
           "`max_held_blocks` blocks per sender (0: half) are held by views, beyond that the sender waits.\n"
           "`workers=factory` (with zero_copy=True): in-process workers, one per (sender, device) on a\n"
           "thread of its own — `factory(sender, device)` makes it, and it is called as `worker(seq, view)`\n"
           "for each of the device's messages in order, with the GIL; the view is released when the call\n"
           "returns unless the worker keeps it. At most `worker_backlog` messages wait per device (then\n"
           "that device pauses). A factory or worker that raises stops the receiver like a callback (its\n"
           "view is released); wait() also waits until the workers have processed what they were given.")
      .def_prop_ro("address", &PyReceiver::address, "The bound \"HOST:PORT\".")
      .def(
          "__iter__", [](nb::handle self) { return self; }, nb::sig("def __iter__(self) -> Receiver"))
      .def("__next__", &PyReceiver::next,
           nb::sig("def __next__(self) -> tuple[str, int, int, memoryview | MessageView]"))
      .def("get", &PyReceiver::get, nb::kw_only(), "timeout"_a = nb::none(),
           nb::sig("def get(self, *, timeout: float | None = None) -> tuple[str, int, int, memoryview | MessageView] "
                   "| None"),
           "The next message as iteration gives it, or None where iteration would end; raises\n"
           "slotstream.Timeout when none came within `timeout` seconds. Like every wait here it\n"
           "returns to Python every 0.1 s, so Ctrl-C raises KeyboardInterrupt.")
      .def("wait", &PyReceiver::wait, "senders"_a = nb::none(), "timeout"_a = nb::none(),
           "Waits until `senders` (default exit_after_senders) sender sessions have ended; False on timeout.\n"
           "Raises the callback's exception if it raised.")
      .def("close", &PyReceiver::close, "Stops the receiver (idempotent); raises the callback's exception if any.")
      .def("sessions", &PyReceiver::sessions, nb::sig("def sessions(self) -> list[dict[str, typing.Any]]"),
           "Reports of the sender sessions that have ended: sender, finished, reason, messages, bytes, gaps, ...")
      .def("live", &PyReceiver::live, nb::sig("def live(self) -> list[dict[str, typing.Any]]"),
           "Counters of the sessions being served now.")
      .def("events", &PyReceiver::events, "Recent receiver events (refused senders, back-pressure), oldest first.");
  // Leaving the block by an exception stops without raising the callback's: it would hide that one.
  def_context_manager<PyReceiver, &PyReceiver::close, &PyReceiver::stop>(receiver, "def __enter__(self) -> Receiver");
}

}  // namespace

NB_MODULE(_slotstream, m) {
  m.doc() = "slotstream's C++ library, bound for Python (use the `slotstream` package).";
  // Objects still referenced from a script's globals through an exception's traceback are freed
  // after nanobind's exit-time leak check runs; its warning would be noise for every such script.
  nb::set_leak_warnings(false);
  m.attr("__version__") = version();
  nb::class_<Frame>(m, "Frame", nb::type_slots(frame_slots),
                    "A received message's bytes, owned by this object; read it through memoryview().");
  bind_sender(m);
  bind_platform_sender(m);

  bind_message_view(m);
  bind_receiver(m);

  m.def(
      "close_all",
      [] {
        for (PyReceiver* r :
             std::vector<PyReceiver*>(PyReceiver::live_receivers().begin(), PyReceiver::live_receivers().end())) {
          r->stop();
        }
      },
      "Stops every open Receiver (registered with atexit).");
  m.def(
      "protocols",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const auto& p : slotstream::protocols()) out.emplace_back(p.name, p.summary);
        return out;
      },
      "The protocols this build knows: (name, summary) pairs.");
  m.attr("DEFAULT_BLOCKS") = kDefaultBlocks;
  m.attr("DEFAULT_BLOCK_SIZE") = kDefaultBlockSize;
}
