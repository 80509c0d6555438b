// What the extension's files share: raising a library Status as Python's exception, range checks of keyword
// arguments against the option schema, waits that release the GIL and still answer Ctrl-C, the context
// manager protocol, and the function each file registers its classes with (slotstream_ext.cc calls them).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "slotstream/options.h"
#include "slotstream/slotstream.h"

namespace slotstream::py {

namespace nb = nanobind;
using namespace nb::literals;

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
[[noreturn]] void raise_status(const Status& st);

void check(const Status& st);

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
std::chrono::milliseconds stall_timeout_arg(double seconds);

// transport="auto|shm|tcp|rdma|udp", rdma_transport="rc|dc|ud" or None, rdma_device="NAME:PORT" or None.
Transport transport_arg(const std::string& transport);
RdmaOptions rdma_args(const std::optional<std::string>& transport, const std::optional<std::string>& device);

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
std::optional<Clock::time_point> deadline_after(std::optional<double> timeout);

// One step of a wait: at most kSignalCheck, and never past the caller's deadline.
Clock::time_point next_check(std::optional<Clock::time_point> deadline);

std::string seconds_text(std::optional<double> timeout);

// A thread that asks for the GIL while the interpreter shuts down never gets it back.
bool python_finalizing();

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

// The classes each file registers (python/ext/*.cc), in the order the module defines them.
void bind_frame(nb::module_& m);            // views.cc
void bind_sender(nb::module_& m);           // sender.cc
void bind_platform_sender(nb::module_& m);  // platform_sender.cc
void bind_message_view(nb::module_& m);     // views.cc
void bind_receiver(nb::module_& m);         // receiver.cc (and close_all)

}  // namespace slotstream::py
