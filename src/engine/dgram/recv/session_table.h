// The datagram receiver's sessions: who is connected, found by UDP identity (address and queue pair;
// the previous datagram's session first, since it is usually the next one's too), by name, or by
// address alone (a datagram too damaged to name its QP), what they have been promised (memory), which
// one to end when the table is full (handshake.h pick_eviction), and the FIN_ACK parts of sessions
// that finished, for FINs that cross them. Threading: the network thread.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "engine/dgram/recv/peer.h"

namespace slotstream::dgram {

class SessionTable {
 public:
  static std::string udp_key(const Address& a, uint32_t source_qp);

  Peer* find(const Address& from, uint32_t source_qp);
  Peer* find_any(const Address& from);
  Peer* named(const std::string& name);
  void add(std::shared_ptr<Peer> p);
  // Takes a session out of every index and the memory promised; the caller holds the last reference.
  std::shared_ptr<Peer> remove(Peer& p);
  // An unauthenticated session to end so that a newcomer fits a full table; nullptr if none may go.
  Peer* eviction_victim() const;

  size_t size() const { return peers_.size(); }
  const std::list<std::shared_ptr<Peer>>& peers() const { return peers_; }
  uint64_t promised() const { return promised_; }

  void remember(Finished f) { finished_.push_back(std::move(f)); }
  Finished* finished(const std::string& key);
  void forget_finished(int64_t now_ns);

 private:
  std::list<std::shared_ptr<Peer>> peers_;
  std::unordered_map<std::string, Peer*> by_key_;  // UDP: address identity + QP
  std::unordered_map<std::string, Peer*> by_name_;
  std::unordered_map<std::string, Peer*> by_addr_;  // UDP: the latest session from an address (for counters)
  Peer* last_hit_ = nullptr;
  std::deque<Finished> finished_;
  uint64_t promised_ = 0;  // reservations of live sessions
};

}  // namespace slotstream::dgram
