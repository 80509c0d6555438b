// Python's Receiver (slotstream.h Receiver): iterator, callback, zero-copy and workers modes, its reports, and
// its Python class with close_all.
#include <set>

#include "sinks.h"
#include "workers.h"

namespace slotstream::py {

namespace {

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

  m.def(
      "close_all",
      [] {
        for (PyReceiver* r :
             std::vector<PyReceiver*>(PyReceiver::live_receivers().begin(), PyReceiver::live_receivers().end())) {
          r->stop();
        }
      },
      "Stops every open Receiver (registered with atexit).");
}

}  // namespace slotstream::py
