// Which transport a receiver uses for a sender: decided from the HELLO and the receiver's own
// facts alone, no network.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream::session {

// What one end says about itself (the sender in its HELLO, the receiver of itself).
struct EndFacts {
  std::string host_id;     // common.h host_id()
  std::string shm_domain;  // common.h shm_domain()
  bool shm = true;         // may use shared memory (a sender whose shm set-up failed: false)
  bool rdma = false;       // has a usable RDMA device
};

// The answer: a transport and why, or why the sender is refused (Code::kRefused).
struct TransportChoice {
  std::optional<Transport> transport;  // set when accepted
  std::string refusal;                 // set when refused
  std::string reason;                  // set when accepted: why this transport, for people
};

// What the sender asked for (`send --transport`: auto, shm, tcp or rdma), within what this
// receiver allows (`recv --transport`). A sender asking for auto gets the receiver's transport when
// it allows only one; else shm when both ends run on one host, in one shm domain (the same IPC
// namespace and user), and both may use it; else rdma when both have a usable RDMA device; else
// tcp. An explicit transport the two ends cannot use is refused with what to do instead. Pure;
// any thread.
TransportChoice choose_transport(Transport allowed, Transport requested, const EndFacts& sender,
                                 const EndFacts& receiver);

// Why two shm domains differ, for people ("in another IPC namespace", "as another user", both
// joined by " and "); empty when they are equal. Pure.
std::string shm_domain_difference(std::string_view sender, std::string_view receiver);

}  // namespace slotstream::session
