// The datagram receiver's half of the handshake (dgram/control.h, dgram/auth.h): HELLO and AUTH
// become a CHALLENGE, an ACCEPT with a new session in the table, or a REFUSE. The checks run in this
// order, and nothing is kept for a sender before the last of them:
//
//   (token: HELLO -> CHALLENGE, a cookie; AUTH -> cookie and proof, a replayed AUTH refused)
//   -> check_hello (dgram/handshake.h) -> the name (one session per name; a silent UDP one is
//   replaced) and the table's cap (an unauthenticated session evicted) -> the memory budget
//   -> the store -> the session, ACCEPT (with its proof)
//
// A repeated HELLO or AUTH of a session gets its ACCEPT again. A receiver on a multicast group takes
// ANNOUNCEs instead (dgram/control.h): the same checks from check_hello on, and nothing is sent back.
// Threading: the network thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>

#include "dgram/handshake.h"
#include "dgram/receiver.h"
#include "dgram/replies.h"
#include "dgram/session_table.h"

namespace slotstream::dgram {

class Admission {
 public:
  // `end_session(peer, finished, reason)`: the receiver's, for a session replaced or evicted.
  using EndFn = std::function<void(Peer&, bool, const std::string&)>;
  Admission(const DatagramReceiverOptions& o, uint32_t qp, SessionTable& table, Replies& replies, EventLog& log,
            ReceiverCounters& counters, EndFn end_session);

  // A HELLO (`request`: the datagram's size, what an answer may not exceed before authentication).
  void on_hello(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn, size_t request);
  void on_auth(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn, size_t request);
  // An ANNOUNCE of a multicast sender (a receiver on a group only): a session, or a refusal logged once.
  void on_announce(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, size_t request);
  // A multicast sender whose session was terminated: its ANNOUNCEs open no new one.
  void shut_out(const Address& from, uint32_t source_qp) {
    refused_announces_.insert(SessionTable::udp_key(from, source_qp));
  }

 private:
  // Who asks, and with what (the hello's bytes: AUTH's proof covers them).
  struct Request {
    const Address& from;
    uint32_t qp;
    Conn* conn;
    size_t size;
    std::span<const uint8_t> hello_bytes;
    bool multicast = false;   // an ANNOUNCE: nothing is sent back
    uint32_t first_stag = 1;  // the STags (an ANNOUNCE names its own)
  };
  void refuse(const Request& rq, const std::string& name, const std::string& why);
  void admit(const Hello& hello, const Request& rq, const SessionKeys* keys, const DgramNonce& nr = {});
  bool vet(const Hello& hello, const Request& rq, bool authenticated, HelloTerms* terms,
           std::unique_ptr<MessageStore>* store);
  bool make_room(const Hello& hello, bool authenticated, std::string* why);
  std::shared_ptr<Peer> make_peer(const Hello& hello, const HelloTerms& terms, const Request& rq);
  void sign(Peer& p, const SessionKeys& keys, const DgramNonce& nr, std::span<const uint8_t> hello_bytes, Accept* a);
  bool cookie_used(const DgramNonce& nr);
  Peer* existing(const Address& from, uint32_t source_qp, Conn* conn);
  int64_t replace_after_ns() const;

  const DatagramReceiverOptions& o_;
  uint32_t qp_;
  MacKey cookie_secret_{};
  HelloLimits limits_;
  SessionTable& table_;
  Replies& replies_;
  EventLog& log_;
  ReceiverCounters& counters_;
  EndFn end_session_;
  // Receiver nonces of AUTHs that started a session, until their cookie has gone stale: a replayed AUTH
  // (a copy from the same address and QP, within its 20 s) starts nothing.
  std::deque<std::pair<DgramNonce, int64_t>> used_cookies_;
  // Multicast senders refused (address and QP): their repeated ANNOUNCEs are not refused again.
  std::unordered_set<std::string> refused_announces_;
};

}  // namespace slotstream::dgram
