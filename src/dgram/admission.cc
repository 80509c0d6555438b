#include "dgram/admission.h"

#include <random>

#include "clock.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// Lines about sessions coming and going per 10 s (other kinds: LogLimiter::kBurst).
constexpr int kSessionLines = 50;
// Multicast senders remembered as refused, at most (then forgotten all at once: refused again, once).
constexpr size_t kRefusedAnnounces = 1024;

std::span<const uint8_t> as_u8(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

}  // namespace

Admission::Admission(const DatagramReceiverOptions& o, uint32_t qp, SessionTable& table, Replies& replies,
                     EventLog& log, ReceiverCounters& counters, EndFn end_session)
    : o_(o),
      qp_(qp),
      table_(table),
      replies_(replies),
      log_(log),
      counters_(counters),
      end_session_(std::move(end_session)) {
  std::random_device rd;
  for (auto& b : cookie_secret_) b = uint8_t(rd());
  limits_.max_message = o.max_message;
  limits_.max_ring = o.max_ring;
  limits_.rd_window = o.rd_window;
  limits_.token = !o.token.empty();
}

Peer* Admission::existing(const Address& from, uint32_t source_qp, Conn* conn) {
  return conn ? conn->session.get() : table_.find(from, source_qp);
}

// HELLO: with a token a CHALLENGE (nothing kept); without one, the session itself.
void Admission::on_hello(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn,
                         size_t request) {
  auto hello = decode_hello(payload);
  if (!hello) return replies_.refuse(conn, from, "?", "malformed HELLO", request);
  if (!o_.token.empty()) {
    if (!hello->auth()) {
      HelloTerms unused;
      limits_.over_tcp = conn != nullptr;
      const auto why = check_hello(*hello, limits_, &unused);
      return replies_.refuse(conn, from, hello->name, why.value_or("authentication required"), request);
    }
    Challenge c{cookie(cookie_secret_, as_u8(from.identity()), source_qp, hello->nonce, now_ns())};
    if (replies_.answer_unauthenticated(conn, from, encode_control(c), request)) ++counters_.challenges;
    return;
  }
  if (Peer* p = existing(from, source_qp, conn)) return replies_.reply(*p, p->accept);  // our ACCEPT was lost
  admit(*hello, {from, source_qp, conn, request, payload}, nullptr);
}

// AUTH: the cookie must be ours (this address and QP, the last 10-20 s) and the proof right; only
// then does the hello count.
void Admission::on_auth(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn,
                        size_t request) {
  if (o_.token.empty()) {
    return replies_.refuse(conn, from, "?", "this receiver has no token (recv --token-file) and takes no AUTH",
                           request);
  }
  auto auth = decode_auth(payload);
  std::optional<Hello> hello = auth ? decode_hello(auth->hello) : std::nullopt;
  const bool genuine =
      hello &&
      cookie_valid(cookie_secret_, as_u8(from.identity()), source_qp, hello->nonce, auth->receiver_nonce, now_ns()) &&
      proof_equal(hello_proof(o_.token, auth->receiver_nonce, hello->nonce, auth->hello), auth->proof);
  if (!genuine) {
    ++counters_.auth_failures;
    return replies_.refuse(conn, from, hello ? hello->name : "?", "authentication failed", request);
  }
  if (Peer* p = existing(from, source_qp, conn)) {
    if (p->receiver_nonce == auth->receiver_nonce) replies_.reply(*p, p->accept, false);
    return;
  }
  if (cookie_used(auth->receiver_nonce)) {
    ++counters_.auth_failures;
    return replies_.refuse(conn, from, hello->name, "authentication failed (a replayed AUTH)", request);
  }
  const SessionKeys keys = session_keys(o_.token, auth->receiver_nonce, hello->nonce);
  admit(*hello, {from, source_qp, conn, request, auth->hello}, &keys, auth->receiver_nonce);
}

void Admission::on_announce(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, size_t request) {
  if (table_.find(from, source_qp)) return;  // announced again: the session is there
  const std::string key = SessionTable::udp_key(from, source_qp);
  if (refused_announces_.contains(key)) return;
  if (refused_announces_.size() >= kRefusedAnnounces) refused_announces_.clear();
  const Request rq{from, source_qp, nullptr, request, payload, true};
  auto a = decode_announce(payload);
  if (!a) return refuse(rq, "?", "malformed ANNOUNCE");
  const Descriptor* proto = find_protocol(a->hello.protocol);
  if (proto && proto->reliable) {
    return refuse(rq, a->hello.name,
                  "protocol " + std::string(proto->name) +
                      " acknowledges every datagram; a multicast group carries the UD protocols only");
  }
  const uint64_t last = uint64_t(a->first_stag) + uint64_t(a->hello.devices.size()) * a->hello.ring;
  if (a->first_stag == 0 || last > UINT32_MAX) return refuse(rq, a->hello.name, "its STags do not fit 32 bits");
  Request announced = rq;
  announced.first_stag = a->first_stag;
  admit(a->hello, announced, nullptr);
}

void Admission::refuse(const Request& rq, const std::string& name, const std::string& why) {
  if (!rq.multicast) return replies_.refuse(rq.conn, rq.from, name, why, rq.size);
  // No one to answer (a group sender listens to no one): logged and counted, once per sender.
  ++counters_.hellos_refused;
  refused_announces_.insert(SessionTable::udp_key(rq.from, rq.qp));
  log_("refused", "refused multicast sender '" + name.substr(0, 64) + "' from " + rq.from.str() + ": " + why);
}

bool Admission::cookie_used(const DgramNonce& nr) {
  while (!used_cookies_.empty() && used_cookies_.front().second < now_ns()) used_cookies_.pop_front();
  for (const auto& [n, _] : used_cookies_) {
    if (n == nr) return true;
  }
  return false;
}

int64_t Admission::replace_after_ns() const { return std::max<int64_t>(1'000'000'000, 2 * o_.message_timeout_ns); }

// Name conflicts and a full table; false if the newcomer is refused (the reason in *why).
bool Admission::make_room(const Hello& hello, bool authenticated, std::string* why) {
  if (Peer* old = table_.named(hello.name)) {
    // A UDP sender that died cannot say so: if the old session has gone quiet, a sender restarted under
    // the same name takes over (what the old one stored stays; the new one numbers on from it).
    const int64_t quiet = now_ns() - old->last_heard_ns;
    if (old->conn || quiet < replace_after_ns() || (old->authenticated() && !authenticated)) {
      *why = "already connected";
      return false;
    }
    end_session_(
        *old, false,
        "lost: silent for " + std::to_string(quiet / kMs) + " ms and replaced by a new session of the same name");
  }
  if (table_.size() < o_.max_sessions) return true;
  Peer* victim = table_.eviction_victim();
  if (!victim) {
    *why = "too many senders (" + std::to_string(o_.max_sessions) + ")";
    return false;
  }
  ++counters_.sessions_evicted;
  end_session_(*victim, false, "evicted: the receiver's session table was full and it was not authenticated");
  return true;
}

// The hello's terms, a place in the table, the budget and a store; false if refused (and answered).
bool Admission::vet(const Hello& hello, const Request& rq, bool authenticated, HelloTerms* terms,
                    std::unique_ptr<MessageStore>* store) {
  limits_.over_tcp = rq.conn != nullptr;
  if (auto why = check_hello(hello, limits_, terms)) {
    refuse(rq, hello.name, *why);
    return false;
  }
  if (std::string why; !make_room(hello, authenticated, &why)) {
    refuse(rq, hello.name, why);
    return false;
  }
  if (auto over = check_budget(terms->reservation, table_.promised(), o_.max_memory)) {
    ++counters_.memory_refusals;
    refuse(rq, hello.name, *over);
    return false;
  }
  if (!o_.make_store) return true;
  if (Status st = o_.make_store(hello.name, store); !st.is_ok()) {
    refuse(rq, hello.name, st.message());
    return false;
  }
  return true;
}

std::shared_ptr<Peer> Admission::make_peer(const Hello& hello, const HelloTerms& terms, const Request& rq) {
  Session::Config c;
  c.protocol = terms.protocol;
  c.hello = hello;
  c.message_timeout_ns = o_.message_timeout_ns;
  c.reliable_timeout_ns = o_.session_timeout_ns;
  c.rd_window = o_.rd_window;
  c.keep_partial = o_.keep_partial;
  c.first_stag = rq.first_stag;
  auto p = std::make_shared<Peer>(std::move(c));
  p->multicast = rq.multicast;
  p->addr = rq.from;
  p->qp = rq.qp;
  p->conn = rq.conn;
  p->reservation = terms.reservation;
  p->start_ns = p->last_heard_ns = now_ns();
  return p;
}

// With a token: the session's keys, and the ACCEPT's proof that this receiver has the token too.
void Admission::sign(Peer& p, const SessionKeys& keys, const DgramNonce& nr, std::span<const uint8_t> hello_bytes,
                     Accept* a) {
  used_cookies_.emplace_back(nr, now_ns() + 2 * kCookieIntervalNs);
  p.receiver_nonce = nr;
  p.rx_mac = std::make_unique<SegmentMac>(keys.to_receiver);
  p.tx_mac = std::make_unique<SegmentMac>(keys.to_sender);
  const Proof proof = accept_proof(o_.token, nr, p.session.hello().nonce, hello_bytes, *a);
  a->proof.assign(proof.begin(), proof.end());
}

void Admission::admit(const Hello& hello, const Request& rq, const SessionKeys* keys, const DgramNonce& nr) {
  HelloTerms terms;
  std::unique_ptr<MessageStore> store;
  if (!vet(hello, rq, keys != nullptr, &terms, &store)) return;
  std::shared_ptr<Peer> p = make_peer(hello, terms, rq);
  p->store = std::make_shared<StoreState>(hello.name, std::move(store));
  Accept acc = p->session.accept(qp_);
  if (keys) sign(*p, *keys, nr, rq.hello_bytes, &acc);
  p->accept = encode_control(acc);
  if (rq.conn) rq.conn->session = p;
  table_.add(p);
  log_("session",
       "sender " + hello.name + (rq.multicast ? " announced itself to the group from " : " connected from ") +
           rq.from.str() + " (" + std::string(terms.protocol->name) + (keys ? ", authenticated)" : ")"),
       kSessionLines);
  replies_.reply(*p, p->accept, false);  // the ACCEPT carries its own proof (none to a multicast sender)
}

}  // namespace slotstream::dgram
