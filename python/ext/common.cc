// The extension's shared helpers (common.h): errors, argument checks, deadlines.
#include "common.h"

#include <cstdio>

namespace slotstream::py {

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

// stall_timeout= seconds (SenderOptions::stall_timeout): 0 waits for ever; the library checks the rest.
std::chrono::milliseconds stall_timeout_arg(double seconds) {
  if (!(seconds >= 0) || seconds > 86400.0 * 365) {
    check({Code::kInvalidArgument,
           "stall_timeout " + std::to_string(seconds) + " is not a number of seconds >= 2 (or 0: wait for ever)"});
  }
  return std::chrono::milliseconds(int64_t(seconds * 1000 + 0.5));
}

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

}  // namespace slotstream::py
