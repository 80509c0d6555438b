// Which transport a receiver uses for a sender: decided from the HELLO alone, no network.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream::session {

// The answer: a transport, or why the sender is refused (Code::kRefused).
struct TransportChoice {
  std::optional<Transport> transport;  // set when accepted
  std::string refusal;                 // set when refused
};

// What the sender asked for (`send --transport`: shm, tcp, or auto), within what this receiver
// allows (`recv --transport`). A sender asking for auto gets the receiver's transport when it
// allows only one, else shm when both ends run on one host (equal host ids) and tcp otherwise.
// shm between two hosts is refused: shared memory cannot cross machines. Pure; any thread.
TransportChoice choose_transport(Transport allowed, Transport requested, std::string_view sender_host_id,
                                 std::string_view receiver_host_id);

}  // namespace slotstream::session
