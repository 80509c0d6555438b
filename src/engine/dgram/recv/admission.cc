#include "engine/dgram/recv/admission.h"

#include <algorithm>
#include <iterator>
#include <random>

#include "clock.h"
#include "engine/dgram/protocol/protocol.h"
#include "engine/hello_rules.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// Lines about sessions coming and going per 10 s (other kinds: LogLimiter::kBurst).
constexpr int kSessionLines = 50;

std::span<const uint8_t> as_u8(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

}  // namespace

int64_t replace_after_ns(int64_t message_timeout_ns) {
  return std::max<int64_t>(1'000'000'000, 2 * message_timeout_ns);
}

bool takes_name(bool old_over_tcp, bool old_authenticated, int64_t silent_ns, bool newcomer_authenticated,
                int64_t replace_after_ns) {
  return !old_over_tcp && silent_ns >= replace_after_ns && (newcomer_authenticated || !old_authenticated);
}

// ------------------------------------------------------------------ RefusedAnnouncers

bool RefusedAnnouncers::rechecked(AnnounceRefusal why) {
  switch (why) {
    case AnnounceRefusal::kNameTaken:
    case AnnounceRefusal::kFull:
    case AnnounceRefusal::kMemory:
    case AnnounceRefusal::kStore:
      return true;
    case AnnounceRefusal::kMalformed:
    case AnnounceRefusal::kProtocol:
    case AnnounceRefusal::kLimits:
      return false;
  }
  return false;
}

void RefusedAnnouncers::expire(int64_t now_ns) {
  while (!entries_.empty() && now_ns - entries_.front().heard_ns > kForgetNs) {
    index_.erase(entries_.front().key);
    entries_.pop_front();
  }
}

RefusedAnnouncers::Entry& RefusedAnnouncers::touch(const std::string& key, int64_t now_ns, bool* created) {
  expire(now_ns);
  auto it = index_.find(key);
  *created = it == index_.end();
  if (*created) {
    if (index_.size() >= kMax) {
      index_.erase(entries_.front().key);
      entries_.pop_front();
    }
    entries_.push_back(Entry{key});
    it = index_.emplace(key, std::prev(entries_.end())).first;
  } else {
    entries_.splice(entries_.end(), entries_, it->second);
  }
  it->second->heard_ns = now_ns;
  return *it->second;
}

bool RefusedAnnouncers::holds(const std::string& key, int64_t now_ns) {
  expire(now_ns);
  if (!index_.contains(key)) return false;
  bool created;
  const Entry& e = touch(key, now_ns, &created);
  return !(e.why && rechecked(*e.why) && now_ns - e.refused_ns >= kRecheckNs);
}

bool RefusedAnnouncers::refuse(const std::string& key, AnnounceRefusal why, int64_t now_ns) {
  bool created;
  Entry& e = touch(key, now_ns, &created);
  const bool news = created || e.why != why;
  e.why = why;
  e.refused_ns = now_ns;
  return news;
}

void RefusedAnnouncers::shut_out(const std::string& key, int64_t now_ns) {
  bool created;
  Entry& e = touch(key, now_ns, &created);
  e.why.reset();
  e.refused_ns = now_ns;
}

void RefusedAnnouncers::forget(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  entries_.erase(it->second);
  index_.erase(it);
}

// ------------------------------------------------------------------ Admission

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
  if (refused_announces_.holds(SessionTable::udp_key(from, source_qp), now_ns())) return;
  const Request rq{from, source_qp, nullptr, request, payload, true};
  auto a = decode_announce(payload);
  if (!a) return refuse(rq, "?", {AnnounceRefusal::kMalformed, "malformed ANNOUNCE"});
  const Descriptor* proto = find_protocol(a->hello.protocol);
  if (proto && proto->reliable) {
    return refuse(rq, a->hello.name,
                  {AnnounceRefusal::kProtocol,
                   "protocol " + std::string(proto->name) +
                       " acknowledges every datagram; a multicast group carries the UD protocols only"});
  }
  const uint64_t last = uint64_t(a->first_stag) + uint64_t(a->hello.devices.size()) * a->hello.ring;
  if (a->first_stag == 0 || last > UINT32_MAX) {
    return refuse(rq, a->hello.name, {AnnounceRefusal::kMalformed, "its STags do not fit 32 bits"});
  }
  Request announced = rq;
  announced.first_stag = a->first_stag;
  admit(a->hello, announced, nullptr);
}

void Admission::shut_out(const Address& from, uint32_t source_qp) {
  refused_announces_.shut_out(SessionTable::udp_key(from, source_qp), now_ns());
}

void Admission::refuse(const Request& rq, const std::string& name, const Refusal& r) {
  if (!rq.multicast) {
    if (r.kind == AnnounceRefusal::kMemory) ++counters_.memory_refusals;
    return replies_.refuse(rq.conn, rq.from, name, r.why, rq.size);
  }
  // No one to answer (a group's sender listens to no one, and so cannot know): counted and logged, once
  // per sender and reason; one refused for a reason that may pass is checked again at a later ANNOUNCE.
  if (!refused_announces_.refuse(SessionTable::udp_key(rq.from, rq.qp), r.kind, now_ns())) return;
  ++counters_.hellos_refused;
  ++counters_.announces_refused[size_t(r.kind)];
  if (r.kind == AnnounceRefusal::kMemory) ++counters_.memory_refusals;
  log_("refused", "refused multicast sender '" + name.substr(0, 64) + "' from " + rq.from.str() + ": " + r.why +
                      (RefusedAnnouncers::rechecked(r.kind) ? "; it is checked again at its later ANNOUNCEs" : ""));
}

bool Admission::cookie_used(const DgramNonce& nr) {
  while (!used_cookies_.empty() && used_cookies_.front().second < now_ns()) used_cookies_.pop_front();
  for (const auto& [n, _] : used_cookies_) {
    if (n == nr) return true;
  }
  return false;
}

// Name conflicts and a full table; the refusal, or nullopt when the newcomer fits.
std::optional<Admission::Refusal> Admission::make_room(const Hello& hello, bool authenticated) {
  if (Peer* old = table_.named(hello.name)) {
    // A UDP sender that died cannot say so: if the old session has gone quiet, a sender restarted under
    // the same name takes over (what the old one stored stays; the new one numbers on from it).
    const int64_t quiet = now_ns() - old->last_heard_ns;
    const int64_t after = replace_after_ns(o_.message_timeout_ns);
    if (!takes_name(old->conn != nullptr, old->authenticated(), quiet, authenticated, after)) {
      std::string why = "already connected";
      if (old->multicast) {  // no REFUSE to keep short: say when the name passes
        why += " from " + old->addr.str() + " (silent for " + std::to_string(quiet / kMs) +
               " ms; the name passes to a new sender after " + std::to_string(after / kMs) + " ms of silence)";
      }
      return Refusal{AnnounceRefusal::kNameTaken, why};
    }
    end_session_(
        *old, false,
        "lost: silent for " + std::to_string(quiet / kMs) + " ms and replaced by a new session of the same name");
  }
  if (table_.size() < o_.max_sessions) return std::nullopt;
  Peer* victim = table_.eviction_victim();
  if (!victim) return Refusal{AnnounceRefusal::kFull, "too many senders (" + std::to_string(o_.max_sessions) + ")"};
  ++counters_.sessions_evicted;
  end_session_(*victim, false, "evicted: the receiver's session table was full and it was not authenticated");
  return std::nullopt;
}

// The hello's terms, a place in the table, the budget and a store; false if refused (and answered).
bool Admission::vet(const Hello& hello, const Request& rq, bool authenticated, HelloTerms* terms,
                    std::unique_ptr<MessageStore>* store) {
  limits_.over_tcp = rq.conn != nullptr;
  if (auto why = check_hello(hello, limits_, terms)) {
    refuse(rq, hello.name, {AnnounceRefusal::kLimits, *why});
    return false;
  }
  if (auto refusal = make_room(hello, authenticated)) {
    refuse(rq, hello.name, *refusal);
    return false;
  }
  if (auto over = engine::check_budget(terms->reservation, table_.promised(), o_.max_memory)) {
    refuse(rq, hello.name, {AnnounceRefusal::kMemory, *over});
    return false;
  }
  if (!o_.make_store) return true;
  SenderInfo info;
  info.name = hello.name;
  info.peer = rq.from.str();
  info.protocol = std::string(terms->protocol->name);
  info.transport = terms->protocol->over_tcp ? Transport::kTcp : Transport::kUdp;
  info.blocks = hello.ring;
  info.block_size = uint32_t(std::min<uint64_t>(hello.max_message, UINT32_MAX));
  info.devices = hello.devices;
  if (Status st = o_.make_store(info, store); !st.is_ok()) {
    refuse(rq, hello.name, {AnnounceRefusal::kStore, st.message()});
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
  if (rq.multicast) refused_announces_.forget(SessionTable::udp_key(rq.from, rq.qp));
  table_.add(p);
  log_("session",
       "sender " + hello.name + (rq.multicast ? " announced itself to the group from " : " connected from ") +
           rq.from.str() + " (" + std::string(terms.protocol->name) + (keys ? ", authenticated)" : ")"),
       kSessionLines);
  replies_.reply(*p, p->accept, false);  // the ACCEPT carries its own proof (none to a multicast sender)
}

}  // namespace slotstream::dgram
