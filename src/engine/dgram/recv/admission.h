// The datagram receiver's half of the handshake (engine/dgram/wire/control.h, engine/dgram/wire/auth.h): HELLO and AUTH
// become a CHALLENGE, an ACCEPT with a new session in the table, or a REFUSE. The checks run in this
// order, and nothing is kept for a sender before the last of them:
//
//   (token: HELLO -> CHALLENGE, a cookie; AUTH -> cookie and proof, a replayed AUTH refused)
//   -> check_hello (engine/dgram/recv/handshake.h) -> the name (one session per name; a silent UDP one is
//   replaced) and the table's cap (an unauthenticated session evicted) -> the memory budget
//   -> the store -> the session, ACCEPT (with its proof)
//
// A repeated HELLO or AUTH of a session gets its ACCEPT again. A receiver on a multicast group takes
// ANNOUNCEs instead (engine/dgram/wire/control.h): the same checks from check_hello on, and nothing is sent back, so
// a refusal shows only in the receiver's log (rate-limited) and /metrics (AnnounceRefusal, by reason).
// A refused sender is remembered (RefusedAnnouncers) so that its ANNOUNCEs, every 200 ms, are not checked
// and logged each time; one refused for a reason that may pass (its name taken by a session that then
// goes silent, no room, no memory) is checked again, and a sender restarted under its old name gets in
// once the old session has been silent for replace_after_ns().
// Threading: the network thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "engine/dgram/recv/handshake.h"
#include "engine/dgram/recv/receiver.h"
#include "engine/dgram/recv/replies.h"
#include "engine/dgram/recv/session_table.h"

namespace slotstream::dgram {

// How long a UDP session must have been silent before a newcomer may take its name: max(1 s, 2 x the
// message timeout), by then its last message has expired too. Pure.
int64_t replace_after_ns(int64_t message_timeout_ns);

// Whether a newcomer takes the name of a live session silent for `silent_ns` (a UDP sender that died cannot
// say so; restarted, it has a new address or QP). Never a TCP session's (its connection says when it
// ends), and never an authenticated one's to a newcomer without the token. Pure.
bool takes_name(bool old_over_tcp, bool old_authenticated, int64_t silent_ns, bool newcomer_authenticated,
                int64_t replace_after_ns);

// Multicast senders refused, by UDP identity (SessionTable::udp_key: address and QP), so that a sender's
// repeated ANNOUNCEs are neither checked nor logged each time. Refused for a reason that may pass
// (rechecked()), a sender is checked again at its first ANNOUNCE kRecheckNs after the last refusal; for
// any other (its ANNOUNCE is wrong, or the receiver terminated it) it is held as long as it announces.
// Bounded: a sender silent for kForgetNs is forgotten, and beyond kMax the least recently heard one is (it is
// checked again at its next ANNOUNCE). Pure: the caller passes the time. Threading: one thread.
class RefusedAnnouncers {
 public:
  static constexpr size_t kMax = 1024;
  // Shorter than a sender's ANNOUNCE interval (200 ms, engine/dgram/wire/control.h): each periodic one is checked.
  static constexpr int64_t kRecheckNs = 100'000'000;
  // Longer than that interval by far: a sender still sending is not forgotten.
  static constexpr int64_t kForgetNs = 10'000'000'000;
  static_assert(kRecheckNs < 200'000'000 && kForgetNs > 10 * 200'000'000);

  // A refusal that may pass later: the name freed, room in the table, the memory budget, the store.
  static bool rechecked(AnnounceRefusal why);

  // Whether an ANNOUNCE from `key` is turned away without a check now. It counts as heard from.
  bool holds(const std::string& key, int64_t now_ns);
  // `key` refused for `why`: true when that is news (the first refusal remembered of it, or another
  // reason than the last), to be counted and logged.
  bool refuse(const std::string& key, AnnounceRefusal why, int64_t now_ns);
  // `key` terminated: held as long as it announces (it cannot hear the TERMINATE).
  void shut_out(const std::string& key, int64_t now_ns);
  void forget(const std::string& key);
  size_t size() const { return index_.size(); }

 private:
  struct Entry {
    std::string key;
    std::optional<AnnounceRefusal> why;  // nullopt: shut out
    int64_t refused_ns = 0;
    int64_t heard_ns = 0;
  };
  // `key`'s entry, heard from now (created, the least recently heard one dropped when full).
  Entry& touch(const std::string& key, int64_t now_ns, bool* created);
  void expire(int64_t now_ns);

  std::list<Entry> entries_;  // least recently heard first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

class Admission {
 public:
  // `end_session(peer, finished, reason)`: the receiver's, for a session replaced or evicted.
  using EndFn = std::function<void(Peer&, bool, const std::string&)>;
  Admission(const DatagramReceiverOptions& o, uint32_t qp, SessionTable& table, Replies& replies, EventLog& log,
            ReceiverCounters& counters, EndFn end_session);

  // A HELLO (`request`: the datagram's size, what an answer may not exceed before authentication).
  void on_hello(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn, size_t request);
  void on_auth(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn, size_t request);
  // An ANNOUNCE of a multicast sender (a receiver on a group only): a session, or a refusal logged and
  // counted once per sender and reason.
  void on_announce(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, size_t request);
  // A multicast sender whose session was terminated: its ANNOUNCEs open no new one while it sends.
  void shut_out(const Address& from, uint32_t source_qp);

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
  // Why a sender is refused: for the REFUSE or the log, and (multicast) the counter.
  struct Refusal {
    AnnounceRefusal kind;
    std::string why;
  };
  void refuse(const Request& rq, const std::string& name, const Refusal& r);
  void admit(const Hello& hello, const Request& rq, const SessionKeys* keys, const DgramNonce& nr = {});
  bool vet(const Hello& hello, const Request& rq, bool authenticated, HelloTerms* terms,
           std::unique_ptr<MessageStore>* store);
  std::optional<Refusal> make_room(const Hello& hello, bool authenticated);
  std::shared_ptr<Peer> make_peer(const Hello& hello, const HelloTerms& terms, const Request& rq);
  void sign(Peer& p, const SessionKeys& keys, const DgramNonce& nr, std::span<const uint8_t> hello_bytes, Accept* a);
  bool cookie_used(const DgramNonce& nr);
  Peer* existing(const Address& from, uint32_t source_qp, Conn* conn);

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
  RefusedAnnouncers refused_announces_;
};

}  // namespace slotstream::dgram
