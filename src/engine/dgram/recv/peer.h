// One sender as the datagram receiver keeps it (engine/dgram/recv/receiver.h): its session
// (engine/dgram/recv/session.h), who it is (UDP address and queue pair, or its TCP connection), its keys, its store and
// what it owes the store. Threading: the network thread; `store` is shared with the storing thread
// (engine/dgram/recv/store_queue.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/dgram/llp/llp.h"
#include "engine/dgram/recv/net_loop.h"
#include "engine/dgram/recv/session.h"
#include "engine/dgram/recv/store_queue.h"
#include "engine/dgram/wire/auth.h"
#include "engine/dgram/wire/mac.h"

namespace slotstream::dgram {

struct Peer {
  explicit Peer(Session::Config c) : session(std::move(c)) {}
  Session session;
  Address addr;  // UDP: the sender's address (with qp, the session's identity)
  uint32_t qp = 0;
  Conn* conn = nullptr;                        // TCP (dgram_rc)
  std::string key;                             // in the UDP index
  std::vector<uint8_t> accept;                 // the ACCEPT payload, repeated for a repeated HELLO/AUTH
  DgramNonce receiver_nonce{};                 // with a token: the AUTH's Nr (a repeated AUTH gets the same ACCEPT)
  std::unique_ptr<SegmentMac> rx_mac, tx_mac;  // with a token
  std::shared_ptr<StoreState> store;
  uint64_t reservation = 0;  // memory promised to it (handshake.h reservation_bytes)
  int64_t start_ns = 0;
  int64_t last_heard_ns = 0;
  uint32_t control_msn = 0;
  bool fin_queued = false;
  bool multicast = false;  // announced to a group (engine/dgram/wire/control.h ANNOUNCE): nothing is sent back to it

  bool authenticated() const { return rx_mac != nullptr; }
  const std::string& name() const { return session.hello().name; }
  const Address& peer_address() const { return conn ? conn->peer : addr; }
};

// A session that finished: its FIN_ACK parts, for FINs that cross them (UDP only); or one the receiver
// terminated: its TERMINATE, for the datagrams the sender sends before it hears it.
struct Finished {
  std::string key;
  std::vector<std::vector<uint8_t>> parts;  // by FIN part index
  std::vector<std::byte> terminate;         // the TERMINATE segment as sent, if terminated
  bool silent = false;                      // a multicast session's: later FINs are taken, not answered
  int64_t terminate_sent_ns = 0;
  std::unique_ptr<SegmentMac> rx_mac, tx_mac;
  int64_t until_ns;
};

}  // namespace slotstream::dgram
