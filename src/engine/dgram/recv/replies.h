// What the datagram receiver sends: control messages (Sends on the control queue, engine/dgram/wire/control.h)
// to a session — signed once it is authenticated — or to a sender not yet authenticated, never with
// more bytes than its request carried (no amplification for a forged source address), and RD's
// acknowledgements. Counts what it refuses and withholds. Threading: the network thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/recv/log_limit.h"
#include "engine/dgram/recv/net_loop.h"
#include "engine/dgram/recv/peer.h"

namespace slotstream::dgram {

// The size of a control segment carrying `payload` bytes.
size_t control_size(size_t payload);

class Replies {
 public:
  Replies(NetLoop& net, uint32_t qp, EventLog& log, ReceiverCounters& counters)
      : net_(net),
        qp_(qp),
        log_(log),
        counters_(counters) {}

  std::vector<std::byte> control_segment(Service service, uint32_t msn, std::span<const uint8_t> payload,
                                         SegmentMac* mac = nullptr) const;
  // A control message to a session; signed once the session is authenticated (unless `sign` is false:
  // the ACCEPT carries its own proof).
  void reply(Peer& p, std::span<const uint8_t> payload, bool sign = true);
  // An answer to a sender not (yet) authenticated: sent only if it is no larger than the request.
  bool answer_unauthenticated(Conn* conn, const Address& to, std::span<const uint8_t> payload, size_t request);
  // REFUSE with the reason, cut to fit the request; logged (within limits) and counted. Closes a
  // connection.
  void refuse(Conn* conn, const Address& to, const std::string& name, const std::string& reason, size_t request);
  // A request that is not answered because its answer would be larger.
  void withhold() { ++counters_.replies_withheld; }
  void send_ack(Peer& p, const RdFields& f);
  // TERMINATE (engine/dgram/wire/control.h) to a session, signed once authenticated; returns the segment as sent.
  std::vector<std::byte> terminate(Peer& p, const Terminate& t);

 private:
  NetLoop& net_;
  uint32_t qp_;
  EventLog& log_;
  ReceiverCounters& counters_;
};

}  // namespace slotstream::dgram
