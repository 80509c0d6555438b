#include "session/transport_choice.h"

namespace slotstream::session {

TransportChoice choose_transport(Transport allowed, Transport requested, std::string_view sender_host_id,
                                 std::string_view receiver_host_id) {
  const bool same_host = sender_host_id == receiver_host_id;
  Transport chosen;
  switch (requested) {
    case Transport::kShm:
      chosen = Transport::kShm;
      break;
    case Transport::kTcp:
      chosen = Transport::kTcp;
      break;
    default:
      chosen = allowed != Transport::kAuto ? allowed : (same_host ? Transport::kShm : Transport::kTcp);
  }
  if (allowed != Transport::kAuto && chosen != allowed) {
    return {std::nullopt, std::string("this receiver only accepts transport ") + transport_name(allowed)};
  }
  if (chosen == Transport::kShm && !same_host) {
    return {std::nullopt, "transport shm needs sender and receiver on one host; use tcp"};
  }
  return {chosen, {}};
}

}  // namespace slotstream::session
