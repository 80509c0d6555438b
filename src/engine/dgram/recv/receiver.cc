#include "engine/dgram/recv/receiver.h"

#include <malloc.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "clock.h"
#include "engine/dgram/recv/admission.h"
#include "engine/dgram/recv/callback_thread.h"
#include "engine/dgram/recv/net_loop.h"
#include "engine/dgram/recv/replies.h"
#include "engine/dgram/recv/session_table.h"
#include "engine/dgram/recv/store_queue.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// RD: no credits while this much of a session waits for its store (back-pressure, not loss).
constexpr uint64_t kCreditBacklog = 64u << 20;
// A finished session's FIN_ACK parts are repeated for late FINs this long.
constexpr int64_t kFinishedMemory = 10'000 * kMs;
// Lines about sessions coming and going per 10 s (other kinds: LogLimiter::kBurst).
constexpr int kSessionLines = 50;
// Freed message memory goes back to the system at most this often (see give_back_memory).
constexpr int64_t kTrimInterval = 1000 * kMs;
// A terminated session's later datagrams are answered with its TERMINATE at most this often.
constexpr int64_t kTerminateInterval = 100 * kMs;
// Live reports are refreshed this often.
constexpr int64_t kPublishInterval = 100 * kMs;

std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

bool is_control(const SegmentHeader& h) {
  return h.opcode == Opcode::kSend && h.queue == kControlQueue && h.service != Service::kRD;
}

void count_decode_error(DatagramCounters& c, DecodeError e) { ++(e == DecodeError::kCrc ? c.crc_errors : c.malformed); }

// A sender's session as slotstream's SessionReport (engine/dgram/recv/report.h says how the datagram counts map).
SessionReport report(const Peer& p, bool finished_ok, const std::string& reason) {
  SessionReport r;
  const Hello& h = p.session.hello();
  r.sender.name = h.name;
  r.sender.peer = p.peer_address().str();
  r.sender.protocol = std::string(p.session.protocol().name);
  r.sender.transport = p.session.protocol().over_tcp ? Transport::kTcp : Transport::kUdp;
  r.sender.blocks = h.ring;
  r.sender.block_size = uint32_t(std::min<uint64_t>(h.max_message, UINT32_MAX));
  r.sender.devices = h.devices;
  r.finished = finished_ok;
  r.reason = reason;
  r.seconds = double(now_ns() - p.start_ns) / 1e9;
  fill_report(p.session.device_accounts(), p.session.counters(), &r);
  for (const auto& [d, pause] : p.store->pauses()) {
    r.per_device[d].pauses = pause.count;
    r.per_device[d].paused = pause.now;
    r.stalls += pause.count;
  }
  r.held_blocks = p.session.held_slots();
  return r;
}

}  // namespace

// The network thread's receiver: datagrams to sessions, their timers and ends, and what they report.
// Sockets are NetLoop's, the handshake Admission's, the stores StoreQueue's (the storing thread), the
// application's callbacks CallbackThread's.
struct DatagramReceiver::Impl final : NetLoop::Handler {
  explicit Impl(DatagramReceiverOptions options)
      : o(std::move(options)),
        log(event_sink()),
        store(log, [this] { net->wake(); }) {}

  DatagramReceiverOptions o;
  // Sessions whose on_session_end has returned (sessions_ended(), wait_sessions()); changed under ended_mu.
  std::mutex ended_mu;
  std::condition_variable ended_cv;
  std::atomic<uint64_t> ended{0};
  // After what its callbacks use (o, ended), before what posts to it (the log, the storing and network
  // threads): destroyed once those are gone, while these still exist.
  CallbackThread callbacks;
  EventLog log;
  ReceiverCounters rc;
  DatagramCounters unattributed;
  SessionTable table;
  std::unique_ptr<NetLoop> net;
  std::unique_ptr<Replies> replies;
  std::unique_ptr<Admission> admission;
  StoreQueue store;
  std::atomic<bool> stopping{false};  // set under ended_mu, so that wait_sessions() wakes for it
  std::atomic<int64_t> last_fin_ack_ns{0};
  std::mutex join_mu;  // stop() from two threads at once: both wait for the network and storing threads
  std::thread net_thread;
  uint64_t expired_seen = 0;  // messages expired in all sessions, at the last check
  bool memory_freed = false;  // messages expired or a session ended since the last trim
  int64_t last_trim_ns = 0;

  mutable std::mutex snap_mu;  // the live reports and counters, as the network thread last published them
  std::vector<SessionReport> live;
  Counters snap;

  // ------------------------------------------------------------------ the application's callbacks

  // on_event through the callback thread, in order with the reports (none given: the log writes nothing).
  std::function<void(const std::string&)> event_sink() {
    if (!o.on_event) return nullptr;
    return [this](const std::string& line) { callbacks.post([this, line] { o.on_event(line); }); };
  }

  // An ended session's report, on the callback thread; it counts as ended once on_session_end has returned
  // (as over UCX), so that a program which exits after N senders has given all N reports.
  void report_end(SessionReport r) {
    if (!o.on_session_end) return count_ended();
    callbacks.post([this, r = std::move(r)] {
      o.on_session_end(r);
      count_ended();
    });
  }

  void count_ended() {
    std::lock_guard lock(ended_mu);
    ++ended;
    ended_cv.notify_all();
  }

  // ------------------------------------------------------------------ datagrams (NetLoop::Handler)

  DatagramCounters& counters_for(Peer* p) { return p ? p->session.counters() : unattributed; }

  void on_truncated(const Address& from) override {
    DatagramCounters& c = counters_for(table.find_any(from));
    ++c.datagrams;
    ++c.truncated;
  }

  bool hold_back(const Conn& c) const override { return c.session && held_back(*c.session); }

  void on_datagram(std::span<const std::byte> d, const Address& from, Conn* conn) override {
    DecodeError why;
    auto seg = decode_segment(d, &why);
    Peer* p = conn ? conn->session.get() : nullptr;
    if (!seg) {
      DatagramCounters& c = counters_for(p ? p : (conn ? nullptr : table.find_any(from)));
      ++c.datagrams;
      return count_decode_error(c, why);
    }
    const SegmentHeader& h = seg->header;
    if (!conn) p = table.find(from, h.source_qp);
    const auto payload = as_u8(seg->payload);
    const auto type = is_control(h) ? control_type(payload) : std::nullopt;
    // The handshake's own messages come before a session's keys (a repeated HELLO or AUTH).
    if (type == ControlType::kHello) return admission->on_hello(from, h.source_qp, payload, conn, d.size());
    if (type == ControlType::kAuth) return admission->on_auth(from, h.source_qp, payload, conn, d.size());
    if (type == ControlType::kAnnounce && !conn && net->multicast()) {
      return admission->on_announce(from, h.source_qp, payload, d.size());
    }
    if (!p) {
      if (!conn && answer_terminated(*seg, from)) return;
      if (type == ControlType::kFin && answer_finished(*seg, from, conn, d.size())) return;
      ++unattributed.datagrams;
      ++unattributed.unknown;
      return;
    }
    on_session_datagram(*p, *seg, d, type, from);
  }

  void on_session_datagram(Peer& p, const Segment& seg, std::span<const std::byte> d, std::optional<ControlType> type,
                           const Address& from) {
    DatagramCounters& c = p.session.counters();
    ++c.datagrams;
    if (p.rx_mac && !p.rx_mac->verify(seg)) {
      ++c.forged;
      log("forged", "dropped a datagram without a valid MAC for sender " + p.name() + " from " + from.str());
      return;
    }
    p.last_heard_ns = now_ns();
    if (seg.header.opcode == Opcode::kTerminate) return on_terminate(p, as_u8(seg.payload));
    if (type == ControlType::kFin) return on_fin(p, as_u8(seg.payload), d.size());
    if (is_control(seg.header)) {
      ++c.malformed;
      return;
    }
    p.session.on_segment(seg, d, now_ns());
  }

  void on_fin(Peer& p, std::span<const uint8_t> payload, size_t request) {
    auto fin = decode_fin(payload);
    if (!fin) {
      ++p.session.counters().malformed;
      return;
    }
    // Its answer is a FIN_ACK part: without authentication, no larger than this request.
    const size_t answer = control_size(encode_control(p.session.fin_ack_part(fin->first)).size());
    if (!p.authenticated() && !p.multicast && answer > request) return replies->withhold();
    (void)p.session.on_fin(*fin, now_ns());
  }

  // The sender ended the session on a protocol error of ours or an error of its own (engine/dgram/wire/control.h).
  void on_terminate(Peer& p, std::span<const uint8_t> payload) {
    auto t = decode_terminate(payload);
    if (!t) {
      ++p.session.counters().malformed;
      return;
    }
    ++rc.sessions_terminated;
    log("terminate", "sender " + p.name() + " terminated its session: " + describe(*t), kSessionLines);
    end_session(p, false, "terminated by the sender: " + describe(*t));
  }

  // A protocol error of the sender's: TERMINATE with the reason, remembered for the datagrams it sends
  // before it hears it (UDP), and the session ends.
  void terminate(Peer& p, const Terminate& t) {
    ++rc.sessions_terminated;
    log("terminate", "terminated sender " + p.name() + " from " + p.peer_address().str() + ": " + describe(t),
        kSessionLines);
    std::vector<std::byte> sent = replies->terminate(p, t);
    if (p.multicast) admission->shut_out(p.addr, p.qp);  // it cannot hear the TERMINATE: ignore it from now on
    if (!p.conn && !p.multicast) {
      Finished f;
      f.key = p.key;
      f.terminate = std::move(sent);
      f.terminate_sent_ns = now_ns();
      f.rx_mac = std::move(p.rx_mac);
      f.tx_mac = std::move(p.tx_mac);
      f.until_ns = now_ns() + kFinishedMemory;
      table.remember(std::move(f));
    }
    end_session(p, false, "terminated: " + describe(t));
  }

  // A datagram of a session the receiver terminated: its TERMINATE again, at most every 100 ms.
  bool answer_terminated(const Segment& seg, const Address& from) {
    Finished* f = table.finished(SessionTable::udp_key(from, seg.header.source_qp));
    if (!f || f->terminate.empty() || (f->rx_mac && !f->rx_mac->verify(seg))) return false;
    ++unattributed.datagrams;
    ++unattributed.unknown;
    if (now_ns() - f->terminate_sent_ns < kTerminateInterval) return true;
    f->terminate_sent_ns = now_ns();
    net->send_udp(f->terminate, from);
    return true;
  }

  // A FIN from a session that has finished: its FIN_ACK part again (the first one was lost).
  bool answer_finished(const Segment& seg, const Address& from, Conn* conn, size_t request) {
    if (conn) return false;
    Finished* f = table.finished(SessionTable::udp_key(from, seg.header.source_qp));
    if (!f || (f->rx_mac && !f->rx_mac->verify(seg))) return false;
    auto fin = decode_fin(as_u8(seg.payload));
    const size_t part = fin ? fin->first / kFinPartDevices : SIZE_MAX;
    if (part >= f->parts.size()) return false;
    if (f->silent) return true;  // a multicast session's FIN, repeated: no one to answer
    const auto& payload = f->parts[part];
    if (!f->rx_mac && control_size(payload.size()) > request) return false;
    net->send_udp(replies->control_segment(Service::kUD, 0, payload, f->tx_mac.get()), from);
    last_fin_ack_ns = now_ns();
    return true;
  }

  // ------------------------------------------------------------------ sessions' turns

  // Whether the receiver holds a reliable session's sender back: RD while much of it waits for the
  // store, RC while the store as a whole is behind; either while one of its devices is paused.
  bool held_back(const Peer& p) const {
    if (!p.session.reliable()) return false;
    if (p.store->any_paused()) return true;
    if (p.session.protocol().sequenced) return p.store->backlog() > kCreditBacklog;
    return store.backlog() > o.max_backlog_bytes;
  }

  void apply_holds(Peer& p, int64_t now) {
    const int64_t ms = (now - p.start_ns) / kMs;
    for (const HoldSpec& h : o.holds) p.session.hold(h.index, ms >= h.from_ms && ms < h.to_ms);
  }

  // Hands the messages that are ready to the store, within the room it has.
  void release(const std::shared_ptr<Peer>& p, int64_t now) {
    const uint64_t queued = store.backlog();
    Session::Room room;
    room.bytes = queued < o.max_backlog_bytes ? o.max_backlog_bytes - queued : 0;
    if (p->store->any_paused()) room.paused = [s = p->store.get()](uint16_t d) { return s->paused(d); };
    std::vector<Session::Ready> ready;
    p->session.release(now, room, &ready);
    for (auto& r : ready) store.push(p->store, std::move(r));
    if (!p->fin_queued && p->session.all_released()) {
      p->fin_queued = true;
      store.push_fin(p->store);
    }
  }

  // Timers, holds, back-pressure, RD acks, hand-over and the end of each session.
  void check_sessions(int64_t now) {
    uint64_t expired = 0;
    for (auto it = table.peers().begin(); it != table.peers().end();) {
      std::shared_ptr<Peer> p = *it++;
      if (!o.holds.empty()) apply_holds(*p, now);
      p->session.set_backpressure(held_back(*p), now);
      release(p, now);
      if (auto ack = p->session.take_ack()) replies->send_ack(*p, *ack);
      expired += p->session.counters().expired;
      if (auto error = p->session.protocol_error()) {
        terminate(*p, *error);
      } else if (auto why = ending(*p, now)) {
        end_session(*p, why->empty(), *why);
      }
    }
    table.forget_finished(now);
    give_back_memory(expired, now);
  }

  // Why a session ends now ("" if it finished), or nullopt.
  std::optional<std::string> ending(const Peer& p, int64_t now) const {
    if (p.store->stored_all()) return "";
    if (p.conn && p.conn->closed) return "lost: its TCP connection closed before FIN";
    if (now - p.last_heard_ns > o.session_timeout_ns) {
      return "lost: nothing heard for " + std::to_string(o.session_timeout_ns / 1'000'000'000) + " s";
    }
    return std::nullopt;
  }

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

  int64_t next_deadline() const {
    int64_t d = INT64_MAX;
    for (const auto& p : table.peers()) d = std::min(d, p->session.next_deadline());
    return d;
  }

  // ------------------------------------------------------------------ session ends

  void send_fin_acks(Peer& p) {
    Finished f;
    for (const FinAck& part : p.session.fin_ack_parts()) {
      f.parts.push_back(encode_control(part));
      replies->reply(p, f.parts.back());
    }
    last_fin_ack_ns = now_ns();
    if (p.conn) return;
    f.key = p.key;
    f.silent = p.multicast;
    f.rx_mac = std::move(p.rx_mac);
    f.tx_mac = std::move(p.tx_mac);
    f.until_ns = now_ns() + kFinishedMemory;
    table.remember(std::move(f));
  }

  void end_session(Peer& p, bool ok, const std::string& reason) {
    std::shared_ptr<Peer> keep = table.remove(p);
    memory_freed = true;
    // A hello that was never followed by data is no sender: counted, not reported.
    const bool sender = ok || p.authenticated() || p.session.carried_data();
    SessionReport r = report(p, ok, reason);
    if (ok) {
      send_fin_acks(p);
    } else if (sender) {
      log("session", "sender " + p.name() + " " + reason, kSessionLines);
    }
    if (p.conn) {
      p.conn->session.reset();
      p.conn->served = true;
      p.conn->opened_ns = now_ns();              // from now on: how long it has been served
      ::shutdown(p.conn->stream.fd(), SHUT_WR);  // after the FIN_ACK (or REFUSE): the sender sees the end
    }
    if (!sender) return;
    publish();  // it leaves the live reports before it is reported as ended
    report_end(std::move(r));
  }

  // ------------------------------------------------------------------ the loop and its reports

  void run() {
    int64_t next_publish = 0;
    while (!stopping.load()) {
      net->poll_once(next_deadline());
      const int64_t now = now_ns();
      check_sessions(now);
      net->check_conns(now);
      if (now >= next_publish) {
        publish();
        next_publish = now + kPublishInterval;
      }
    }
    while (!table.peers().empty()) {
      end_session(*table.peers().front(), false,
                  "stopped: the receiver is shutting down (messages not yet stored are discarded)");
    }
  }

  void publish() {
    std::vector<SessionReport> reports;
    // Reports only of senders (authenticated, or with data placed): a flood of hellos makes none.
    for (const auto& p : table.peers()) {
      if (p->authenticated() || p->session.carried_data()) reports.push_back(report(*p, false, ""));
    }
    Counters c;
    c.unattributed = unattributed;
    if (const auto* f = net->injected()) {
      c.unattributed.injected_loss = f->dropped;
      c.unattributed.injected_corrupt = f->corrupted;
      c.unattributed.injected_duplicate = f->duplicated;
      c.unattributed.injected_reorder = f->reordered;
    }
    c.receiver = rc;
    c.receiver.log_suppressed = log.suppressed();
    c.memory_promised = table.promised();
    c.memory_budget = o.max_memory;
    c.connections = net->open_connections();
    std::lock_guard lock(snap_mu);
    live = std::move(reports);
    snap = c;
  }
};

DatagramReceiver::DatagramReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DatagramReceiver::~DatagramReceiver() { stop(); }

Status DatagramReceiver::start(DatagramReceiverOptions o, std::unique_ptr<DatagramReceiver>* out) {
  if (o.max_memory == 0) o.max_memory = default_max_memory();
  auto impl = std::make_unique<Impl>(std::move(o));
  Impl& im = *impl;
  NetLoop::Options n;
  n.host = im.o.host;
  n.port = im.o.port;
  n.socket_buffer = im.o.socket_buffer;
  n.interface = im.o.interface;
  n.max_connections = im.o.max_connections;
  n.max_pending = im.o.max_pending_connections;
  n.hello_timeout_ns = im.o.hello_timeout_ns;
  n.served_timeout_ns = im.o.session_timeout_ns;
  n.inject = im.o.inject;
  SLOTSTREAM_RETURN_IF_ERROR(NetLoop::open(n, im, im.log, im.rc, &im.net));
  if (im.net->multicast() && !im.o.token.empty()) {
    return {Code::kInvalidArgument,
            "a multicast group has no handshake, so no token can be proved (--token-file): listen on a unicast "
            "address, or leave the token out"};
  }
  const uint32_t qp = std::random_device{}() | 1;
  im.replies = std::make_unique<Replies>(*im.net, qp, im.log, im.rc);
  im.admission =
      std::make_unique<Admission>(im.o, qp, im.table, *im.replies, im.log, im.rc,
                                  [&im](Peer& p, bool ok, const std::string& why) { im.end_session(p, ok, why); });
  im.publish();
  im.store.start();
  im.net_thread = std::thread([&im] { im.run(); });
  out->reset(new DatagramReceiver(std::move(impl)));
  return Status::ok();
}

std::string DatagramReceiver::listen_address() const { return impl_->net->address(); }

void DatagramReceiver::stop() {
  Impl& im = *impl_;
  {
    std::lock_guard lock(im.ended_mu);
    im.stopping = true;
    im.ended_cv.notify_all();
  }
  {
    // Every stop() waits for both threads, a second one too (the destructor's, or one from a callback while
    // another runs): the callback thread then ends after them, and no report is left behind it. Neither
    // thread waits for a callback, so a stop() from one waits here only for the network loop's last turn.
    std::lock_guard join(im.join_mu);
    im.store.stop();  // what is not stored yet is discarded
    if (im.net_thread.joinable()) im.net_thread.join();
  }
  // The callbacks still waiting, the reports of the sessions the stop ended among them. From a callback this
  // returns at once; the thread gives the rest when that callback returns.
  im.callbacks.stop();
}

uint64_t DatagramReceiver::sessions_ended() const { return impl_->ended.load(); }

void DatagramReceiver::wait_sessions(uint64_t n) {
  Impl& im = *impl_;
  std::unique_lock lock(im.ended_mu);
  im.ended_cv.wait(lock, [&] { return im.stopping.load() || im.ended.load() >= n; });
}

int64_t DatagramReceiver::since_last_fin_ack_ns() const { return now_ns() - impl_->last_fin_ack_ns.load(); }

std::vector<SessionReport> DatagramReceiver::live_sessions() const {
  std::lock_guard lock(impl_->snap_mu);
  return impl_->live;
}

DatagramReceiver::Counters DatagramReceiver::counters() const {
  std::lock_guard lock(impl_->snap_mu);
  return impl_->snap;
}

}  // namespace slotstream::dgram
