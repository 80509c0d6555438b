// Receiver(..., workers=...): Python workers run by slotstream::ViewWorkers, one per (sender, device), and
// the reference that lets go of a Python object with the GIL.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "sinks.h"
#include "slotstream/view_workers.h"

namespace slotstream::py {

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

}  // namespace slotstream::py
