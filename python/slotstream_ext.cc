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
//
// The files: ext/common.h (errors, argument checks, interruptible waits), ext/views.h (Frame, MessageView),
// ext/sender.h and sender.cc (Sender), ext/platform_sender.cc (PlatformSender), ext/sinks.h, ext/workers.h and
// ext/receiver.cc (Receiver); this one defines the module.
#include <string>
#include <utility>
#include <vector>

#include "ext/common.h"

using namespace slotstream;
using namespace slotstream::py;

NB_MODULE(_slotstream, m) {
  m.doc() = "slotstream's C++ library, bound for Python (use the `slotstream` package).";
  // Objects still referenced from a script's globals through an exception's traceback are freed
  // after nanobind's exit-time leak check runs; its warning would be noise for every such script.
  nb::set_leak_warnings(false);
  m.attr("__version__") = version();
  bind_frame(m);
  bind_sender(m);
  bind_platform_sender(m);

  bind_message_view(m);
  bind_receiver(m);

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
