#include "dgram/receiver.h"

#include <malloc.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "dgram/auth.h"
#include "dgram/handshake.h"
#include "dgram/llp.h"
#include "dgram/log_limit.h"
#include "dgram/mac.h"
#include "dgram/session.h"
#include "dgram/wire.h"
#include "slotstream/slotstream.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// RD: no credits while this much of a session waits for its store (back-pressure, not loss).
constexpr uint64_t kCreditBacklog = 64u << 20;
// A finished session's FIN_ACK parts are repeated for late FINs this long.
constexpr int64_t kFinishedMemory = 10'000 * kMs;
// UDP batches handled before timers are looked at again.
constexpr int kBatchesPerTurn = 16;
// After accept() fails (the descriptor limit), the listener is not polled for this long: it stays
// readable, and polling it again at once spun the network thread at 98 % of a core.
constexpr int64_t kListenerRest = 100 * kMs;
// Ended senders' totals are kept per name for /metrics; the oldest names go beyond this many.
constexpr size_t kMaxEndedNames = 1024;
// A reply that cannot be written at once waits at most this long (the network thread is shared).
constexpr int kReplyFlushMs = 100;
// Lines about sessions coming and going per 10 s (other kinds: LogLimiter::kBurst).
constexpr int kSessionLines = 50;
// Freed message memory goes back to the system at most this often (see give_back_memory).
constexpr int64_t kTrimInterval = 1000 * kMs;

std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
std::span<const std::byte> as_bytes(std::span<const uint8_t> v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}
std::span<const uint8_t> as_u8(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

void count_decode_error(DatagramCounters& c, DecodeError e) {
  if (e == DecodeError::kCrc) {
    ++c.crc_errors;
  } else {
    ++c.malformed;
  }
}

// The size of a control segment carrying `payload` bytes.
size_t control_size(size_t payload) { return kCommonSize + kUntaggedSize + payload + kCrcSize; }

struct Conn;

// One session as the receiver keeps it: the session's bookkeeping (dgram/session.h), who it is,
// its keys, its store and what it owes the store.
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
  std::unique_ptr<MessageStore> store;
  uint64_t reservation = 0;
  int64_t start_ns = 0;
  int64_t last_heard_ns = 0;
  uint32_t control_msn = 0;
  bool fin_queued = false;
  std::atomic<bool> stored_all{false};
  std::atomic<uint64_t> backlog{0};  // bytes queued for the store

  bool authenticated() const { return rx_mac != nullptr; }
  const std::string& name() const { return session.hello().name; }
};

struct Conn {
  Conn(Fd fd, Address peer, int64_t now) : stream(std::move(fd)), peer(peer), opened_ns(now) {}
  FramedStream stream;
  Address peer;
  std::shared_ptr<Peer> session;
  int64_t opened_ns;
  bool closed = false;
  bool served = false;  // its session has ended: the sender is reading its FIN_ACK and will close
};

struct WorkItem {
  std::shared_ptr<Peer> peer;
  bool fin_marker = false;
  Delivered delivered;
  Completion completion;  // owns delivered.data / valid
  uint64_t bytes = 0;
};

// A session that finished: its FIN_ACK parts, for FINs that cross them.
struct Finished {
  std::string key;
  std::vector<std::vector<uint8_t>> parts;  // by FIN part index
  std::unique_ptr<SegmentMac> rx_mac, tx_mac;
  int64_t until_ns;
};

}  // namespace

struct DatagramReceiver::Impl {
  ReceiverOptions o;
  std::unique_ptr<UdpSocket> udp;
  Fd listener;
  Fd wake;  // eventfd: the storing thread tells the network thread a FIN marker was reached
  uint32_t qp = 0;
  std::string address;
  MacKey cookie_secret{};
  std::optional<FaultyLink> faults;
  Address held_from;  // source of the datagram the injector holds back (reorder)

  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> ended{0};
  std::atomic<int64_t> last_fin_ack_ns{0};
  std::thread net_thread, store_thread;

  // Network thread state.
  std::list<std::shared_ptr<Peer>> peers;
  std::unordered_map<std::string, Peer*> by_key;  // UDP: address identity + QP
  std::unordered_map<std::string, Peer*> by_name;
  std::unordered_map<std::string, Peer*> by_addr;  // UDP: the latest session from an address (for counters)
  std::list<std::unique_ptr<Conn>> conns;
  std::deque<Finished> finished;
  uint64_t promised = 0;  // reservations of live sessions
  DatagramCounters unattributed_counters;
  ReceiverCounters rc;
  LogLimiter log_limit;
  int64_t listener_rest_until = 0;
  // Receiver nonces of AUTHs that started a session, until their cookie has gone stale: a replayed AUTH
  // (a copy from the same address and QP, within its 20 s) starts nothing.
  std::deque<std::pair<DgramNonce, int64_t>> used_cookies;
  uint64_t expired_seen = 0;  // messages expired in all sessions, at the last check
  bool memory_freed = false;  // messages expired or a session ended since the last trim
  int64_t last_trim_ns = 0;
  Peer* last_hit = nullptr;  // the session of the previous datagram (usually the next one's too)
  UdpSocket::Inbox inbox{64};
  HelloLimits limits;

  // Shared with the storing thread.
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<WorkItem> queue;
  std::atomic<uint64_t> backlog{0};

  mutable std::mutex snap_mu;
  Snapshot snap;
  std::deque<std::string> ended_order;  // names in snap.ended, oldest first

  // Logs `line` unless lines of this kind are being rate-limited.
  void event(const char* kind, const std::string& line, int burst = LogLimiter::kBurst) {
    if (!o.on_event) return;
    if (auto l = log_limit.admit(kind, line, now_ns(), burst)) o.on_event(*l);
  }

  static std::string udp_key(const Address& a, uint32_t source_qp) {
    std::string k = a.identity();
    k.append(reinterpret_cast<const char*>(&source_qp), sizeof source_qp);
    return k;
  }

  // ------------------------------------------------------------------ sending

  std::vector<std::byte> control_segment(Service service, uint32_t msn, std::span<const uint8_t> payload,
                                         SegmentMac* mac = nullptr) {
    SegmentHeader h;
    h.service = service;
    h.opcode = Opcode::kSend;
    h.queue = kControlQueue;
    h.msn = msn;
    h.source_qp = qp;
    std::vector<std::byte> d(kMaxHeaderSize + payload.size() + kMaxTrailerSize);
    d.resize(encode_segment(h, as_bytes(payload), d, mac));
    return d;
  }

  void send_udp(std::span<const std::byte> d, const Address& to) {
    // A reply that cannot be sent is like a lost datagram: the sender repeats its request.
    (void)udp->send_one(d, &to);
  }

  void send_to(Conn* conn, const Address& to, std::span<const std::byte> d) {
    if (!conn) return send_udp(d, to);
    conn->stream.queue(d);
    if (!conn->stream.flush(kReplyFlushMs).is_ok()) conn->closed = true;
  }

  // A control message to a session; signed once the session is authenticated.
  void reply(Peer& p, std::span<const uint8_t> payload, bool sign = true) {
    const Service service = p.conn ? Service::kRC : Service::kUD;
    send_to(p.conn, p.addr, control_segment(service, p.control_msn++, payload, sign ? p.tx_mac.get() : nullptr));
  }

  // An answer to a sender not (yet) authenticated: sent only if it is no larger than the request.
  bool answer_unauthenticated(Conn* conn, const Address& to, std::span<const uint8_t> payload, size_t request) {
    if (control_size(payload.size()) > request) {
      ++rc.replies_withheld;
      return false;
    }
    send_to(conn, to, control_segment(conn ? Service::kRC : Service::kUD, 0, payload));
    return true;
  }

  void refuse(Conn* conn, const Address& to, const std::string& name, const std::string& reason, size_t request) {
    ++rc.hellos_refused;
    event("refused", "refused sender '" + name.substr(0, 64) + "' from " + to.str() + ": " + reason);
    const size_t room = request > control_size(0) ? request - control_size(0) : 0;
    const auto payload = refuse_within(reason, room);
    if (payload.empty()) {
      ++rc.replies_withheld;
    } else {
      answer_unauthenticated(conn, to, payload, request);
    }
    if (conn) conn->closed = true;
  }

  void send_ack(Peer& p, const RdFields& f) {
    SegmentHeader h;
    h.service = Service::kRD;
    h.opcode = Opcode::kAck;
    h.source_qp = qp;
    h.rd = f;
    std::byte buf[kMaxHeaderSize + kMaxTrailerSize];
    send_udp(std::span(buf, encode_segment(h, {}, buf, p.tx_mac.get())), p.addr);
  }

  // ------------------------------------------------------------------ finding sessions

  Peer* find(const Address& from, uint32_t source_qp) {
    if (last_hit && last_hit->qp == source_qp && !last_hit->conn && last_hit->addr == from) return last_hit;
    auto it = by_key.find(udp_key(from, source_qp));
    return it == by_key.end() ? nullptr : (last_hit = it->second);
  }

  DatagramCounters& counters_for(Peer* p) { return p ? p->session.counters() : unattributed_counters; }

  // ------------------------------------------------------------------ the handshake

  // HELLO: with a token a CHALLENGE (nothing kept); without one, the session itself.
  void on_hello(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn, size_t request) {
    auto hello = decode_hello(payload);
    if (!hello) return refuse(conn, from, "?", "malformed HELLO", request);
    if (!o.token.empty()) {
      if (!hello->auth()) {
        HelloTerms unused;
        limits.over_tcp = conn != nullptr;
        const auto why = check_hello(*hello, limits, &unused);
        return refuse(conn, from, hello->name, why.value_or("authentication required"), request);
      }
      Challenge c{cookie(cookie_secret, as_u8(from.identity()), source_qp, hello->nonce, now_ns())};
      if (answer_unauthenticated(conn, from, encode_control(c), request)) ++rc.challenges;
      return;
    }
    Peer* existing = conn ? conn->session.get() : find(from, source_qp);
    if (existing) {
      reply(*existing, existing->accept);  // our ACCEPT was lost: say it again
      return;
    }
    admit(*hello, payload, from, source_qp, conn, request, nullptr);
  }

  // AUTH: the cookie must be ours (this address and QP, the last 10-20 s) and the proof right; only
  // then does the hello count.
  void on_auth(const Address& from, uint32_t source_qp, std::span<const uint8_t> payload, Conn* conn, size_t request) {
    if (o.token.empty()) {
      return refuse(conn, from, "?", "this receiver has no token (recv --token-file) and takes no AUTH", request);
    }
    auto auth = decode_auth(payload);
    std::optional<Hello> hello = auth ? decode_hello(auth->hello) : std::nullopt;
    const bool genuine =
        hello &&
        cookie_valid(cookie_secret, as_u8(from.identity()), source_qp, hello->nonce, auth->receiver_nonce, now_ns()) &&
        proof_equal(hello_proof(o.token, auth->receiver_nonce, hello->nonce, auth->hello), auth->proof);
    if (!genuine) {
      ++rc.auth_failures;
      return refuse(conn, from, hello ? hello->name : "?", "authentication failed", request);
    }
    Peer* existing = conn ? conn->session.get() : find(from, source_qp);
    if (existing) {
      if (existing->receiver_nonce == auth->receiver_nonce) reply(*existing, existing->accept, false);
      return;
    }
    if (cookie_used(auth->receiver_nonce)) {
      ++rc.auth_failures;
      return refuse(conn, from, hello->name, "authentication failed (a replayed AUTH)", request);
    }
    const SessionKeys keys = session_keys(o.token, auth->receiver_nonce, hello->nonce);
    admit(*hello, auth->hello, from, source_qp, conn, request, &keys, auth->receiver_nonce);
  }

  bool cookie_used(const DgramNonce& nr) {
    while (!used_cookies.empty() && used_cookies.front().second < now_ns()) used_cookies.pop_front();
    for (const auto& [n, _] : used_cookies) {
      if (n == nr) return true;
    }
    return false;
  }

  // Name conflicts and a full table; false if the newcomer is refused (the reason in *why).
  bool make_room(const Hello& hello, bool authenticated, std::string* why) {
    if (auto it = by_name.find(hello.name); it != by_name.end()) {
      Peer& old = *it->second;
      // A UDP sender that died cannot say so: if the old session has gone quiet, a sender restarted under
      // the same name takes over (what the old one stored stays; the new one numbers on from it).
      const int64_t quiet = now_ns() - old.last_heard_ns;
      if (old.conn || quiet < replace_after_ns() || (old.authenticated() && !authenticated)) {
        *why = "already connected";
        return false;
      }
      end_session(
          old, false,
          "lost: silent for " + std::to_string(quiet / kMs) + " ms and replaced by a new session of the same name");
    }
    if (peers.size() < o.max_sessions) return true;
    std::vector<Standing> table;
    std::vector<Peer*> order;
    for (auto& p : peers) {
      table.push_back({p->authenticated(), p->session.carried_data(), p->last_heard_ns});
      order.push_back(p.get());
    }
    const auto victim = pick_eviction(table);
    if (!victim) {
      *why = "too many senders (" + std::to_string(o.max_sessions) + ")";
      return false;
    }
    ++rc.sessions_evicted;
    end_session(*order[*victim], false, "evicted: the receiver's session table was full and it was not authenticated");
    return true;
  }

  void admit(const Hello& hello, std::span<const uint8_t> hello_bytes, const Address& from, uint32_t source_qp,
             Conn* conn, size_t request, const SessionKeys* keys, const DgramNonce& nr = {}) {
    HelloTerms terms;
    limits.over_tcp = conn != nullptr;
    if (auto why = check_hello(hello, limits, &terms)) return refuse(conn, from, hello.name, *why, request);
    std::string why;
    if (!make_room(hello, keys != nullptr, &why)) return refuse(conn, from, hello.name, why, request);
    if (auto over = check_budget(terms.reservation, promised, limits_budget())) {
      ++rc.memory_refusals;
      return refuse(conn, from, hello.name, *over, request);
    }
    std::unique_ptr<MessageStore> store;
    if (o.make_store) {
      if (Status st = o.make_store(hello.name, &store); !st.is_ok())
        return refuse(conn, from, hello.name, st.message(), request);
    }
    Session::Config c;
    c.protocol = terms.protocol;
    c.hello = hello;
    c.message_timeout_ns = o.message_timeout_ns;
    c.reliable_timeout_ns = o.session_timeout_ns;
    c.rd_window = o.rd_window;
    auto p = std::make_shared<Peer>(std::move(c));
    p->addr = from;
    p->qp = source_qp;
    p->conn = conn;
    p->store = std::move(store);
    p->reservation = terms.reservation;
    p->start_ns = p->last_heard_ns = now_ns();
    p->receiver_nonce = nr;
    Accept acc = p->session.accept(qp);
    if (keys) {
      used_cookies.emplace_back(nr, now_ns() + 2 * kCookieIntervalNs);
      p->rx_mac = std::make_unique<SegmentMac>(keys->to_receiver);
      p->tx_mac = std::make_unique<SegmentMac>(keys->to_sender);
      const Proof proof = accept_proof(o.token, nr, hello.nonce, hello_bytes, acc);
      acc.proof.assign(proof.begin(), proof.end());
    }
    p->accept = encode_control(acc);
    promised += p->reservation;
    if (conn) {
      conn->session = p;
    } else {
      p->key = udp_key(from, source_qp);
      by_key[p->key] = p.get();
      by_addr[from.identity()] = p.get();
    }
    by_name[hello.name] = p.get();
    peers.push_back(p);
    event("session",
          "sender " + hello.name + " connected from " + from.str() + " (" + terms.protocol->name +
              (keys ? ", authenticated)" : ")"),
          kSessionLines);
    reply(*p, p->accept, false);  // the ACCEPT carries its own proof
  }

  uint64_t limits_budget() const { return o.max_memory; }
  int64_t replace_after_ns() const { return std::max<int64_t>(1'000'000'000, 2 * o.message_timeout_ns); }

  // ------------------------------------------------------------------ control messages of a session

  void on_fin(Peer& p, std::span<const uint8_t> payload, size_t request) {
    auto fin = decode_fin(payload);
    if (!fin) {
      ++p.session.counters().malformed;
      return;
    }
    // Its answer is a FIN_ACK part: without authentication, no larger than this request.
    const size_t answer = control_size(encode_control(p.session.fin_ack_part(fin->first)).size());
    if (!p.authenticated() && answer > request) {
      ++rc.replies_withheld;
      return;
    }
    (void)p.session.on_fin(*fin, now_ns());
  }

  // A FIN from a session that has finished: its FIN_ACK part again (the first one was lost).
  bool answer_finished(const Segment& seg, const Address& from, Conn* conn, size_t request) {
    if (conn) return false;
    const std::string key = udp_key(from, seg.header.source_qp);
    for (auto& f : finished) {
      if (f.key != key) continue;
      if (f.rx_mac && !f.rx_mac->verify(seg)) return false;
      auto fin = decode_fin(as_u8(seg.payload));
      const size_t part = fin ? fin->first / kFinPartDevices : SIZE_MAX;
      if (part >= f.parts.size()) return false;
      const auto& payload = f.parts[part];
      if (!f.rx_mac && control_size(payload.size()) > request) return false;
      send_udp(control_segment(Service::kUD, 0, payload, f.tx_mac.get()), from);
      last_fin_ack_ns = now_ns();
      return true;
    }
    return false;
  }

  // ------------------------------------------------------------------ datagrams

  static bool is_control(const SegmentHeader& h) {
    return h.opcode == Opcode::kSend && h.queue == kControlQueue && h.service != Service::kRD;
  }

  void on_datagram(std::span<const std::byte> d, const Address& from, Conn* conn) {
    DecodeError why;
    auto seg = decode_segment(d, &why);
    Peer* p = conn ? conn->session.get() : nullptr;
    if (!seg) {
      DatagramCounters& c = counters_for(p ? p : (conn ? nullptr : find_any(from)));
      ++c.datagrams;
      count_decode_error(c, why);
      return;
    }
    const SegmentHeader& h = seg->header;
    if (!conn) p = find(from, h.source_qp);
    const auto payload = as_u8(seg->payload);
    const auto type = is_control(h) ? control_type(payload) : std::nullopt;
    // The handshake's own messages come before a session's keys (a repeated HELLO or AUTH).
    if (type == ControlType::kHello) return on_hello(from, h.source_qp, payload, conn, d.size());
    if (type == ControlType::kAuth) return on_auth(from, h.source_qp, payload, conn, d.size());
    if (!p) {
      if (type == ControlType::kFin && answer_finished(*seg, from, conn, d.size())) return;
      ++unattributed_counters.datagrams;
      ++unattributed_counters.unknown;
      return;
    }
    DatagramCounters& c = p->session.counters();
    ++c.datagrams;
    if (p->rx_mac && !p->rx_mac->verify(*seg)) {
      ++c.forged;
      event("forged", "dropped a datagram without a valid MAC for sender " + p->name() + " from " + from.str());
      return;
    }
    p->last_heard_ns = now_ns();
    if (type == ControlType::kFin) return on_fin(*p, payload, d.size());
    if (is_control(h)) {
      ++c.malformed;
      return;
    }
    p->session.on_segment(*seg, d, now_ns());
  }

  // The counters of some session from `from` (a datagram too damaged to name its QP).
  Peer* find_any(const Address& from) {
    if (last_hit && !last_hit->conn && last_hit->addr == from) return last_hit;
    auto it = by_addr.find(from.identity());
    return it == by_addr.end() ? nullptr : it->second;
  }

  // ------------------------------------------------------------------ hand-over to the store

  void release(const std::shared_ptr<Peer>& p, int64_t now) {
    std::vector<Session::Ready> ready;
    const uint64_t queued = backlog.load();
    uint64_t room = queued < o.max_backlog_bytes ? o.max_backlog_bytes - queued : 0;
    p->session.release(now, o.keep_partial, &room, &ready);
    for (auto& r : ready) {
      WorkItem w;
      w.peer = p;
      w.bytes = r.completion.data.size();
      w.delivered.device = r.device;
      w.delivered.msn = r.msn;
      w.delivered.partial = r.partial;
      w.delivered.length_known = r.completion.length_known;
      w.delivered.first_ns = r.completion.first_ns;
      w.delivered.done_ns = r.completion.done_ns;
      w.completion = std::move(r.completion);
      enqueue(std::move(w));
    }
  }

  void enqueue(WorkItem w) {
    if (w.peer->store == nullptr && !w.fin_marker) return;
    w.peer->backlog += w.bytes;
    backlog += w.bytes;
    {
      std::lock_guard lock(q_mu);
      queue.push_back(std::move(w));
    }
    q_cv.notify_one();
  }

  // ------------------------------------------------------------------ session ends

  SessionReport report(const Peer& p, bool finished_ok, const std::string& reason) const {
    SessionReport r;
    r.name = p.name();
    r.peer = p.conn ? p.conn->peer.str() : p.addr.str();
    r.protocol = p.session.protocol().name;
    r.finished = finished_ok;
    r.authenticated = p.authenticated();
    r.reason = reason;
    r.seconds = double(now_ns() - p.start_ns) / 1e9;
    r.devices = p.session.device_reports();
    r.counters = p.session.counters();
    return r;
  }

  void send_fin_acks(Peer& p) {
    Finished f;
    for (const FinAck& part : p.session.fin_ack_parts()) {
      f.parts.push_back(encode_control(part));
      reply(p, f.parts.back());
    }
    last_fin_ack_ns = now_ns();
    if (p.conn) return;
    f.key = p.key;
    f.rx_mac = std::move(p.rx_mac);
    f.tx_mac = std::move(p.tx_mac);
    f.until_ns = now_ns() + kFinishedMemory;
    finished.push_back(std::move(f));
  }

  void end_session(Peer& p, bool ok, const std::string& reason) {
    std::shared_ptr<Peer> keep;
    for (auto it = peers.begin(); it != peers.end(); ++it) {
      if (it->get() == &p) {
        keep = *it;
        peers.erase(it);
        break;
      }
    }
    if (last_hit == &p) last_hit = nullptr;
    if (!p.key.empty()) by_key.erase(p.key);
    if (auto it = by_addr.find(p.addr.identity()); it != by_addr.end() && it->second == &p) by_addr.erase(it);
    if (auto it = by_name.find(p.name()); it != by_name.end() && it->second == &p) by_name.erase(it);
    promised -= p.reservation;
    memory_freed = true;
    // A hello that was never followed by data is no sender: counted, not reported.
    const bool sender = ok || p.authenticated() || p.session.carried_data();
    SessionReport r = report(p, ok, reason);
    if (ok) {
      send_fin_acks(p);
    } else if (sender) {
      event("session", "sender " + p.name() + " " + reason, kSessionLines);
    }
    if (p.conn) {
      p.conn->session.reset();
      p.conn->served = true;
      p.conn->opened_ns = now_ns();              // from now on: how long it has been served
      ::shutdown(p.conn->stream.fd(), SHUT_WR);  // after the FIN_ACK (or REFUSE): the sender sees the end
    }
    if (!sender) return;
    {
      std::lock_guard lock(snap_mu);
      record_ended_locked(r);
      ++snap.sessions_ended;
      publish_locked();
    }
    if (o.on_session_end) o.on_session_end(r);
    ++ended;
  }

  void record_ended_locked(const SessionReport& r) {
    auto [it, fresh] = snap.ended.try_emplace(r.name);
    if (fresh) ended_order.push_back(r.name);
    it->second.name = r.name;
    it->second.protocol = r.protocol;
    accumulate(&it->second, r);
    while (ended_order.size() > kMaxEndedNames) {
      snap.ended.erase(ended_order.front());
      ended_order.pop_front();
    }
  }

  // Timers, back-pressure, RD acks and the end of each session.
  // Memory of expired messages and ended sessions, freed, stays with the allocator (glibc keeps freed
  // heap memory; 77,824 expired one-byte messages left 335 MB resident): hand it back to the system, at
  // most once a second. Streaming frees and reuses buffers all the time and needs no trim.
  void give_back_memory(uint64_t expired, int64_t now) {
    if (expired != expired_seen) memory_freed = true;
    expired_seen = expired;
    if (!memory_freed || now - last_trim_ns < kTrimInterval) return;
    malloc_trim(0);
    memory_freed = false;
    last_trim_ns = now;
  }

  void check_sessions(int64_t now) {
    const bool paused = backlog.load() > o.max_backlog_bytes;
    uint64_t expired = 0;
    for (auto it = peers.begin(); it != peers.end();) {
      std::shared_ptr<Peer> p = *it++;
      Session& s = p->session;
      const bool rd = s.protocol().service == Service::kRD;
      s.set_backpressure(rd ? p->backlog.load() > kCreditBacklog : (s.reliable() && paused), now);
      release(p, now);
      if (auto ack = s.take_ack()) send_ack(*p, *ack);
      if (!p->fin_queued && s.all_released()) {
        p->fin_queued = true;
        WorkItem w;
        w.peer = p;
        w.fin_marker = true;
        enqueue(std::move(w));
      }
      expired += s.counters().expired;
      if (p->stored_all.load()) {
        end_session(*p, true, "");
      } else if (p->conn && p->conn->closed) {
        end_session(*p, false, "lost: its TCP connection closed before FIN");
      } else if (now - p->last_heard_ns > o.session_timeout_ns) {
        end_session(*p, false,
                    "lost: nothing heard for " + std::to_string(o.session_timeout_ns / 1'000'000'000) + " s");
      }
    }
    while (!finished.empty() && finished.front().until_ns < now) finished.pop_front();
    give_back_memory(expired, now);
  }

  int64_t next_deadline() const {
    int64_t d = INT64_MAX;
    for (const auto& p : peers) d = std::min(d, p->session.next_deadline());
    return d;
  }

  // ------------------------------------------------------------------ sockets

  void on_udp_readable() {
    for (int turn = 0; turn < kBatchesPerTurn; ++turn) {
      Status st = udp->receive(inbox);
      if (!st.is_ok() || inbox.size() == 0) return;  // (ICMP errors from old peers are not ours to act on)
      for (size_t i = 0; i < inbox.size(); ++i) {
        const Address& from = inbox.from(i);
        if (inbox.truncated(i)) {
          DatagramCounters& c = counters_for(find_any(from));
          ++c.datagrams;
          ++c.truncated;
          continue;
        }
        if (!faults) {
          on_datagram(inbox.datagram(i), from, nullptr);
          continue;
        }
        const bool was_holding = faults->holding();
        const Address before = held_from;
        faults->pass(inbox.datagram(i),
                     [&](std::span<const std::byte> d, bool held) { on_datagram(d, held ? before : from, nullptr); });
        if (!was_holding && faults->holding()) held_from = from;
      }
    }
  }

  // A connection without a session closed to make room — one whose session has ended, else the oldest
  // that has not said hello; false if there is none.
  bool evict_pending_connection() {
    Conn* oldest = nullptr;
    for (auto& c : conns) {
      if (c->closed || c->session) continue;
      if (c->served) {
        c->closed = true;
        return true;
      }
      if (!oldest || c->opened_ns < oldest->opened_ns) oldest = c.get();
    }
    if (!oldest) return false;
    oldest->closed = true;
    ++rc.connections_evicted;
    event("connection", "closed a connection from " + oldest->peer.str() + " that had not said hello, for a newer one");
    return true;
  }

  size_t open_connections(bool pending_only) const {
    size_t n = 0;
    for (const auto& c : conns) n += !c->closed && (!pending_only || (!c->session && !c->served));
    return n;
  }

  void on_accept() {
    for (;;) {
      Address peer;
      peer.len = sizeof peer.ss;
      int fd =
          ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        ++rc.accept_errors;
        event("accept", std::string("cannot accept a TCP connection (") + strerror(errno) + "); pausing 100 ms");
        if (!evict_pending_connection()) listener_rest_until = now_ns() + kListenerRest;
        return;
      }
      const bool full =
          open_connections(false) >= o.max_connections || open_connections(true) >= o.max_pending_connections;
      if (full && !evict_pending_connection()) {
        ++rc.connections_refused;
        event("connection", "refused a TCP connection from " + peer.str() + ": " + std::to_string(o.max_connections) +
                                " connections are open");
        ::close(fd);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      conns.push_back(std::make_unique<Conn>(Fd(fd), peer, now_ns()));
    }
  }

  void on_conn_readable(Conn& c) {
    Status st = c.stream.read_available();
    std::span<const std::byte> f;
    while (!c.closed && c.stream.next_frame(&f)) on_datagram(f, c.peer, &c);
    if (!st.is_ok()) c.closed = true;
  }

  // Connections without a session past the hello deadline are closed; closed ones are dropped.
  void check_conns(int64_t now) {
    for (auto it = conns.begin(); it != conns.end();) {
      Conn& c = **it;
      if (!c.closed && c.served && now - c.opened_ns > o.session_timeout_ns) c.closed = true;  // never closed
      if (!c.closed && !c.session && !c.served && now - c.opened_ns > o.hello_timeout_ns) {
        c.closed = true;
        ++rc.connections_timed_out;
        event("connection", "closed a connection from " + c.peer.str() + ": no session within " +
                                std::to_string(o.hello_timeout_ns / 1'000'000'000) + " s");
      }
      if (c.closed && !c.session) {
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }

  int poll_timeout_ms(int64_t now) const {
    const int64_t deadline = next_deadline();
    int timeout = 100;
    if (deadline != INT64_MAX) timeout = int(std::clamp<int64_t>((deadline - now) / kMs + 1, 0, 100));
    if (listener_rest_until > now) timeout = std::min<int>(timeout, int((listener_rest_until - now) / kMs + 1));
    if (faults && faults->holding()) timeout = std::min(timeout, 5);
    return timeout;
  }

  void poll_once(std::vector<pollfd>& fds, std::vector<Conn*>& polled) {
    const int64_t now = now_ns();
    fds.clear();
    polled.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    fds.push_back({udp->fd(), POLLIN, 0});
    // At the descriptor limit the listener stays readable: rest it instead of spinning on it.
    fds.push_back({listener.get(), short(listener_rest_until > now ? 0 : POLLIN), 0});
    const bool paused = backlog.load() > o.max_backlog_bytes;  // RC: TCP itself holds the sender back
    for (auto& c : conns) {
      if (c->closed) continue;
      fds.push_back({c->stream.fd(), short(paused ? 0 : POLLIN), 0});
      polled.push_back(c.get());
    }
    const int n = ::poll(fds.data(), fds.size(), poll_timeout_ms(now));
    if (n > 0) {
      if (fds[0].revents) {
        uint64_t v;
        if (::read(wake.get(), &v, sizeof v) < 0) { /* spurious */
        }
      }
      if (fds[1].revents) on_udp_readable();
      if (fds[2].revents) on_accept();
      for (size_t i = 0; i < polled.size(); ++i) {
        if (fds[3 + i].revents) on_conn_readable(*polled[i]);
      }
    }
    if (faults && faults->holding() && n == 0) {
      // A datagram held back for reordering goes out when nothing overtakes it for a while.
      faults->flush([&](std::span<const std::byte> d, bool) { on_datagram(d, held_from, nullptr); });
    }
  }

  void net_loop() {
    std::vector<pollfd> fds;
    std::vector<Conn*> polled;
    int64_t next_snapshot = 0;
    while (!stopping.load()) {
      poll_once(fds, polled);
      const int64_t now = now_ns();
      check_sessions(now);
      check_conns(now);
      if (now >= next_snapshot) {
        publish();
        next_snapshot = now + 100 * kMs;
      }
    }
    while (!peers.empty()) {
      end_session(*peers.front(), false,
                  "stopped: the receiver is shutting down (messages not yet stored are discarded)");
    }
    publish();
  }

  // ------------------------------------------------------------------ what /metrics shows

  void publish() {
    std::lock_guard lock(snap_mu);
    publish_locked();
  }

  void publish_locked() {
    snap.live.clear();
    // Series only for senders (authenticated, or with data placed): a flood of hellos makes none.
    for (const auto& p : peers) {
      if (p->authenticated() || p->session.carried_data()) snap.live.push_back(report(*p, false, ""));
    }
    snap.unattributed = unattributed_counters;
    if (faults) {
      const auto& f = faults->stats();
      snap.unattributed.injected_loss = f.dropped;
      snap.unattributed.injected_corrupt = f.corrupted;
      snap.unattributed.injected_duplicate = f.duplicated;
      snap.unattributed.injected_reorder = f.reordered;
    }
    snap.receiver = rc;
    snap.receiver.log_suppressed = log_limit.suppressed();
    snap.memory_promised = promised;
    snap.memory_budget = o.max_memory;
    snap.connections = open_connections(false);
  }

  // ------------------------------------------------------------------ the storing thread

  void store_loop() {
    for (;;) {
      WorkItem w;
      {
        std::unique_lock lock(q_mu);
        q_cv.wait(lock, [&] { return !queue.empty() || stopping.load(); });
        if (queue.empty()) return;
        w = std::move(queue.front());
        queue.pop_front();
      }
      if (w.fin_marker) {
        w.peer->stored_all = true;
        uint64_t one = 1;
        if (::write(wake.get(), &one, sizeof one) < 0) { /* the net thread polls every 100 ms anyway */
        }
        continue;
      }
      store_one(w);
      w.peer->backlog -= w.bytes;
      backlog -= w.bytes;
    }
  }

  void store_one(WorkItem& w) {
    w.delivered.data = w.completion.data;
    w.delivered.valid = &w.completion.valid;
    bool reported = false;
    while (!stopping.load()) {
      Status st = w.peer->store->store(w.delivered);
      if (st.is_ok()) return;
      if (!reported && o.on_event) {
        o.on_event("cannot store a message of sender " + w.peer->name() + " (retrying every 100 ms): " + st.message());
        reported = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
};

DatagramReceiver::DatagramReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DatagramReceiver::~DatagramReceiver() { stop(); }

namespace {

// One port number for both: UDP first (port 0 picks it), then TCP on the same number; if TCP finds it
// taken, another free UDP port.
Status bind_both(const ReceiverOptions& o, std::unique_ptr<UdpSocket>* udp_out, Fd* listener, std::string* address) {
  Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<UdpSocket> udp;
    SLOTSTREAM_RETURN_IF_ERROR(UdpSocket::open(o.host, o.port, o.socket_buffer, &udp));
    Address a = udp->local();
    Fd l(::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(l.get(), reinterpret_cast<const sockaddr*>(&a.ss), a.len) == 0 && ::listen(l.get(), 64) == 0) {
      *udp_out = std::move(udp);
      *listener = std::move(l);
      *address = a.str();
      return Status::ok();
    }
    last = {Code::kIoError, "cannot listen on TCP " + a.str() + ": " + strerror(errno)};
    if (o.port != 0) return last;
  }
  return last;
}

}  // namespace

Status DatagramReceiver::start(ReceiverOptions o, std::unique_ptr<DatagramReceiver>* out) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(o);
  if (impl->o.max_memory == 0) impl->o.max_memory = default_max_memory();
  std::random_device rd;
  impl->qp = rd() | 1;
  for (auto& b : impl->cookie_secret) b = uint8_t(rd());
  impl->limits.max_message = impl->o.max_message;
  impl->limits.max_ring = impl->o.max_ring;
  impl->limits.rd_window = impl->o.rd_window;
  impl->limits.token = !impl->o.token.empty();
  SLOTSTREAM_RETURN_IF_ERROR(bind_both(impl->o, &impl->udp, &impl->listener, &impl->address));
  impl->wake = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (impl->o.inject.any()) impl->faults.emplace(impl->o.inject);
  impl->publish();
  Impl* p = impl.get();
  p->net_thread = std::thread([p] { p->net_loop(); });
  p->store_thread = std::thread([p] { p->store_loop(); });
  out->reset(new DatagramReceiver(std::move(impl)));
  return Status::ok();
}

std::string DatagramReceiver::listen_address() const { return impl_->address; }

void DatagramReceiver::stop() {
  if (impl_->stopping.exchange(true)) return;
  impl_->q_cv.notify_all();
  if (impl_->net_thread.joinable()) impl_->net_thread.join();
  impl_->q_cv.notify_all();
  if (impl_->store_thread.joinable()) impl_->store_thread.join();
}

uint64_t DatagramReceiver::sessions_ended() const { return impl_->ended.load(); }

int64_t DatagramReceiver::since_last_fin_ack_ns() const { return now_ns() - impl_->last_fin_ack_ns.load(); }

std::vector<SessionReport> DatagramReceiver::live_sessions() const {
  std::lock_guard lock(impl_->snap_mu);
  return impl_->snap.live;
}

DatagramReceiver::Snapshot DatagramReceiver::snapshot() const {
  std::lock_guard lock(impl_->snap_mu);
  return impl_->snap;
}

std::string valid_ranges_json(const RangeSet& valid) {
  std::string s = "[";
  bool first = true;
  for (const auto& r : valid.ranges()) {
    if (!first) s += ",";
    first = false;
    s += "[" + std::to_string(r.offset) + "," + std::to_string(r.length) + "]";
  }
  return s + "]";
}

}  // namespace slotstream::dgram
