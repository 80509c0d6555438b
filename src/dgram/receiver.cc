#include "dgram/receiver.h"

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

#include "dgram/device_order.h"
#include "dgram/llp.h"
#include "dgram/protocols.h"
#include "dgram/rd.h"
#include "dgram/recv_queue.h"
#include "dgram/tagged.h"
#include "dgram/wire.h"
#include "slotstream/slotstream.h"
#include "wire/codec.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kMs = 1'000'000;
// RD: no credits while this much of a session waits for its store (back-pressure, not loss).
constexpr uint64_t kCreditBacklog = 64u << 20;
// A finished session's FIN_ACK is repeated for late FINs this long.
constexpr int64_t kFinishedMemory = 10'000 * kMs;
// UDP batches handled before timers are looked at again.
constexpr int kBatchesPerTurn = 16;
constexpr size_t kMaxSessions = 1024;
// "Never" for timers, far enough from INT64_MAX that adding it to a clock reading cannot overflow.
constexpr int64_t kNoTimeout = int64_t(1) << 60;

std::span<const uint8_t> as_u8(std::span<const std::byte> s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
std::span<const std::byte> as_bytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}
using wire::get_le;

void count_decode_error(DatagramCounters& c, DecodeError e) {
  if (e == DecodeError::kCrc) {
    ++c.crc_errors;
  } else {
    ++c.malformed;
  }
}

}  // namespace

namespace {

void add_device(DeviceReport* a, const DeviceReport& x) {
  for (auto f : {&DeviceReport::sent, &DeviceReport::bytes_sent, &DeviceReport::complete, &DeviceReport::partial,
                 &DeviceReport::dropped, &DeviceReport::lost, &DeviceReport::retired, &DeviceReport::valid_bytes}) {
    a->*f += x.*f;
  }
}

}  // namespace

DeviceReport device_totals(const SessionReport& r) {
  DeviceReport t;
  for (const auto& [_, d] : r.devices) add_device(&t, d);
  return t;
}

void accumulate(SessionReport* into, const SessionReport& r) {
  for (const auto& [d, x] : r.devices) add_device(&into->devices[d], x);
  DatagramCounters& a = into->counters;
  const DatagramCounters& c = r.counters;
  for (auto f : {&DatagramCounters::datagrams, &DatagramCounters::bytes, &DatagramCounters::crc_errors,
                 &DatagramCounters::malformed, &DatagramCounters::truncated, &DatagramCounters::stale,
                 &DatagramCounters::duplicates, &DatagramCounters::out_of_bounds, &DatagramCounters::no_buffer,
                 &DatagramCounters::unknown, &DatagramCounters::rd_duplicates, &DatagramCounters::rd_beyond_window,
                 &DatagramCounters::acks_sent, &DatagramCounters::injected_loss, &DatagramCounters::injected_corrupt,
                 &DatagramCounters::injected_duplicate, &DatagramCounters::injected_reorder}) {
    a.*f += c.*f;
  }
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

namespace {

struct Conn;

struct Session {
  Session(int64_t timeout_ns) : tagged(timeout_ns), queues(timeout_ns) {}
  // Identity: a UDP sender's address and QP, or a TCP connection.
  Address addr;
  uint32_t qp = 0;
  Conn* conn = nullptr;
  const Protocol* proto = nullptr;
  Hello hello;
  std::vector<uint8_t> accept;
  std::unique_ptr<MessageStore> store;

  TaggedTarget tagged;
  ReceiveQueues queues;
  std::map<uint16_t, DeviceOrder> order;
  std::map<uint32_t, uint16_t> stag_device;  // first STag of each device's ring
  std::optional<RdReceiver> rd;
  bool ack_due = false;
  uint32_t credits_granted = 0;

  std::map<uint16_t, DeviceReport> devices;
  DatagramCounters counters;
  int64_t start_ns = 0;
  int64_t last_heard_ns = 0;
  uint32_t control_msn = 0;
  bool fin_received = false;
  bool fin_queued = false;
  std::atomic<bool> stored_all{false};
  std::atomic<uint64_t> backlog{0};  // bytes queued for the store

  std::optional<uint16_t> device_of_stag(uint32_t stag) const {
    auto it = stag_device.upper_bound(stag);
    if (it == stag_device.begin()) return std::nullopt;
    --it;
    if (stag - it->first >= hello.ring) return std::nullopt;
    return it->second;
  }
};

struct Conn {
  explicit Conn(Fd fd, Address peer) : stream(std::move(fd)), peer(peer) {}
  FramedStream stream;
  Address peer;
  std::shared_ptr<Session> session;
  bool closed = false;
};

struct WorkItem {
  std::shared_ptr<Session> session;
  bool fin_marker = false;
  Delivered delivered;
  Completion completion;  // owns delivered.data / valid
  uint64_t bytes = 0;
};

}  // namespace

struct DatagramReceiver::Impl {
  ReceiverOptions o;
  std::unique_ptr<UdpSocket> udp;
  Fd listener;
  Fd wake;  // eventfd: the storing thread tells the network thread a FIN marker was reached
  uint32_t qp = 0;
  std::string address;
  std::optional<FaultyLink> faults;
  Address held_from;  // source of the datagram the injector holds back (reorder)

  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> ended{0};
  std::atomic<int64_t> last_fin_ack_ns{0};
  std::thread net_thread, store_thread;

  // Network thread state.
  std::list<std::shared_ptr<Session>> sessions;
  std::list<std::unique_ptr<Conn>> conns;
  struct Finished {
    Address addr;
    uint32_t qp;
    std::vector<uint8_t> fin_ack;
    int64_t until_ns;
  };
  std::deque<Finished> finished;
  DatagramCounters unattributed_counters;
  Session* last_hit = nullptr;  // the session of the previous datagram (usually the next one's too)
  UdpSocket::Inbox inbox{64};

  // Shared with the storing thread.
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<WorkItem> queue;
  std::atomic<uint64_t> backlog{0};

  mutable std::mutex snap_mu;
  Snapshot snap;

  void event(const std::string& s) {
    if (o.on_event) o.on_event(s);
  }

  // ------------------------------------------------------------------ sending

  std::vector<std::byte> control_segment(Service service, uint32_t msn, const std::vector<uint8_t>& payload) {
    SegmentHeader h;
    h.service = service;
    h.opcode = Opcode::kSend;
    h.queue = kControlQueue;
    h.msn = msn;
    h.source_qp = qp;
    std::vector<std::byte> d(header_size(h) + payload.size() + kCrcSize);
    d.resize(encode_segment(h, as_bytes(payload), d));
    return d;
  }

  void send_udp(std::span<const std::byte> d, const Address& to) {
    // A reply that cannot be sent is like a lost datagram: the sender repeats its request.
    (void)udp->send_one(d, &to);
  }

  void reply(Session* s, const std::vector<uint8_t>& payload) {
    if (s->conn) {
      s->conn->stream.queue(control_segment(Service::kRC, s->control_msn++, payload));
      if (!s->conn->stream.flush(1000).is_ok()) s->conn->closed = true;
    } else {
      send_udp(control_segment(Service::kUD, s->control_msn++, payload), s->addr);
    }
  }

  void refuse(Conn* conn, const Address& to, const std::string& name, const std::string& reason) {
    event("refused sender '" + name + "' from " + to.str() + ": " + reason);
    auto d = control_segment(conn ? Service::kRC : Service::kUD, 0, encode_control(Refuse{reason}));
    if (conn) {
      conn->stream.queue(d);
      (void)conn->stream.flush(1000);
      conn->closed = true;
    } else {
      send_udp(d, to);
    }
  }

  void send_ack(Session& s) {
    const uint32_t credits = s.backlog.load() > kCreditBacklog ? 0 : s.rd->window();
    SegmentHeader h;
    h.service = Service::kRD;
    h.opcode = Opcode::kAck;
    h.source_qp = qp;
    h.rd = s.rd->ack(credits);
    std::byte buf[kMaxHeaderSize + kCrcSize];
    send_udp(std::span(buf, encode_segment(h, {}, buf)), s.addr);
    s.credits_granted = credits;
    s.ack_due = false;
    ++s.counters.acks_sent;
  }

  // ------------------------------------------------------------------ sessions

  Session* find(const Address& from, uint32_t source_qp) {
    if (last_hit && last_hit->qp == source_qp && !last_hit->conn && last_hit->addr == from) return last_hit;
    for (auto& s : sessions) {
      if (!s->conn && s->qp == source_qp && s->addr == from) return last_hit = s.get();
    }
    return nullptr;
  }

  DatagramCounters& counters_for(const Address& from) {
    for (auto& s : sessions) {
      if (!s->conn && s->addr == from) return s->counters;
    }
    return unattributed_counters;
  }

  void on_hello(const Address& from, uint32_t source_qp, std::span<const std::byte> payload, Conn* conn) {
    if (!conn) {
      if (Session* s = find(from, source_qp)) {
        reply(s, s->accept);  // our ACCEPT was lost: say it again
        return;
      }
    } else if (conn->session) {
      return;
    }
    auto hello = decode_hello(as_u8(payload));
    if (!hello) return refuse(conn, from, "?", "malformed HELLO");
    const Protocol* proto = find_protocol(hello->protocol);
    if (!proto) return refuse(conn, from, hello->name, "unknown datagram protocol '" + hello->protocol + "'");
    if (proto->over_tcp() != (conn != nullptr)) {
      return refuse(conn, from, hello->name,
                    std::string("protocol ") + proto->name + " runs over " + (proto->over_tcp() ? "TCP" : "UDP"));
    }
    if (auto why = invalid_sender_name(hello->name)) return refuse(conn, from, hello->name, "sender name: " + *why);
    if (hello->devices.empty()) return refuse(conn, from, hello->name, "no devices");
    if (hello->ring == 0 || hello->ring > o.max_ring) {
      return refuse(conn, from, hello->name,
                    "ring of " + std::to_string(hello->ring) + " STags per device; this receiver allows 1.." +
                        std::to_string(o.max_ring));
    }
    if (hello->max_message > o.max_message) {
      return refuse(conn, from, hello->name,
                    "messages of up to " + std::to_string(hello->max_message) + " B; this receiver allows " +
                        std::to_string(o.max_message) + " B (recv --max-message)");
    }
    if (hello->segment_size == 0 || hello->segment_size > kMaxSegmentPayload) {
      return refuse(conn, from, hello->name, "segment size " + std::to_string(hello->segment_size) + " B");
    }
    for (auto it = sessions.begin(); it != sessions.end(); ++it) {
      if ((*it)->hello.name != hello->name) continue;
      // A UDP sender that died cannot say so: if the old session has gone quiet, a sender restarted under
      // the same name takes over (what the old one stored stays; the new one numbers on from it).
      const int64_t quiet = now_ns() - (*it)->last_heard_ns;
      if ((*it)->conn || quiet < replace_after_ns()) return refuse(conn, from, hello->name, "already connected");
      end_session(it, false,
                  "lost: silent for " + std::to_string(quiet / 1'000'000) +
                      " ms and replaced by a new session of the same name");
      break;
    }
    if (sessions.size() >= kMaxSessions) return refuse(conn, from, hello->name, "too many senders");
    std::unique_ptr<MessageStore> store;
    if (o.make_store) {
      if (Status st = o.make_store(hello->name, &store); !st.is_ok())
        return refuse(conn, from, hello->name, st.message());
    }
    // Timers are for the unreliable service: over RD and RC every segment arrives, however long
    // retransmission takes, so a message waits for its last segment.
    const int64_t timeout = proto->service == Service::kUD ? o.message_timeout_ns : kNoTimeout;
    auto s = std::make_shared<Session>(timeout);
    s->addr = from;
    s->qp = source_qp;
    s->conn = conn;
    s->proto = proto;
    s->hello = *hello;
    s->store = std::move(store);
    s->start_ns = s->last_heard_ns = now_ns();
    Accept acc;
    acc.receiver_qp = qp;
    acc.region_length = hello->max_message;
    uint32_t stag = 1;  // STag 0 names nothing
    for (uint16_t d : hello->devices) {
      if (s->order.contains(d)) continue;
      s->order.emplace(d, DeviceOrder(timeout));
      s->devices[d];
      if (proto->data_op == Opcode::kSend) {
        s->queues.post(d, hello->ring, hello->max_message);
      } else {
        acc.rings.push_back({d, stag});
        s->stag_device[stag] = d;
        for (uint32_t k = 0; k < hello->ring; ++k) s->tagged.add_region(stag + k, hello->max_message);
        stag += hello->ring;
      }
    }
    if (proto->service == Service::kRD) {
      s->rd.emplace(o.rd_window);
      acc.credits = o.rd_window;
    }
    s->accept = encode_control(acc);
    if (conn) conn->session = s;
    sessions.push_back(s);
    event("sender " + hello->name + " connected from " + from.str() + " (" + proto->name + ")");
    reply(s.get(), s->accept);
  }

  int64_t replace_after_ns() const { return std::max<int64_t>(1'000'000'000, 2 * o.message_timeout_ns); }

  void on_fin(Session& s, std::span<const std::byte> payload) {
    auto fin = decode_fin(as_u8(payload));
    if (!fin) {
      ++s.counters.malformed;
      return;
    }
    if (s.fin_received) return;  // answered once everything is stored
    s.fin_received = true;
    const int64_t now = now_ns();
    for (const auto& d : fin->devices) {
      auto it = s.order.find(d.device);
      if (it == s.order.end()) continue;
      it->second.fin(d.messages, now);
      s.devices[d.device].sent = d.messages;
      s.devices[d.device].bytes_sent = d.bytes;
    }
    for (auto& [d, ord] : s.order) {
      if (!ord.fin_known()) ord.fin(0, now);
    }
  }

  bool answer_finished(const Address& from, uint32_t source_qp, Conn* conn) {
    for (const auto& f : finished) {
      if (!conn && f.qp == source_qp && f.addr == from) {
        send_udp(control_segment(Service::kUD, 0, f.fin_ack), from);
        last_fin_ack_ns = now_ns();
        return true;
      }
    }
    return false;
  }

  // ------------------------------------------------------------------ data path

  void on_datagram(std::span<const std::byte> d, const Address& from, Conn* conn) {
    DecodeError why;
    auto seg = decode_segment(d, &why);
    if (!seg) {
      DatagramCounters& c =
          conn ? (conn->session ? conn->session->counters : unattributed_counters) : counters_for(from);
      ++c.datagrams;
      count_decode_error(c, why);
      return;
    }
    const SegmentHeader& h = seg->header;
    if (h.opcode == Opcode::kSend && h.queue == kControlQueue && h.service != Service::kRD) {
      auto type = control_type(as_u8(seg->payload));
      if (type == ControlType::kHello) return on_hello(from, h.source_qp, seg->payload, conn);
      Session* s = conn ? conn->session.get() : find(from, h.source_qp);
      if (type == ControlType::kFin) {
        if (s) {
          ++s->counters.datagrams;
          s->last_heard_ns = now_ns();
          on_fin(*s, seg->payload);
        } else if (!answer_finished(from, h.source_qp, conn)) {
          ++unattributed_counters.unknown;
        }
        return;
      }
      ++(s ? s->counters : unattributed_counters).malformed;
      return;
    }
    Session* s = conn ? conn->session.get() : find(from, h.source_qp);
    if (!s) {
      ++unattributed_counters.datagrams;
      ++unattributed_counters.unknown;
      return;
    }
    ++s->counters.datagrams;
    s->last_heard_ns = now_ns();
    const Service want = s->proto->over_tcp() ? Service::kRC : s->proto->service;
    if (h.service != want) {
      ++s->counters.malformed;
      return;
    }
    if (want != Service::kRD) return place(*s, *seg);
    if (h.opcode == Opcode::kAck) {
      s->ack_due = true;  // a probe: the sender's window is closed and wants to hear from us
      return;
    }
    switch (s->rd->on_segment(h.rd.seq, d)) {
      case RdReceiver::Result::kInOrder: {
        place(*s, *seg);
        std::vector<std::byte> next;
        while (s->rd->pop(&next)) {
          if (auto again = decode_segment(next)) place(*s, *again);
        }
        break;
      }
      case RdReceiver::Result::kBuffered:
        break;
      case RdReceiver::Result::kDuplicate:
        ++s->counters.rd_duplicates;
        break;
      case RdReceiver::Result::kBeyondWindow:
        ++s->counters.rd_beyond_window;
        break;
    }
    s->ack_due = true;
  }

  // Checks an MSN against its device's order; false (counted) if the segment is to be dropped.
  bool admit(Session& s, uint16_t device, uint32_t msn) {
    DeviceOrder& ord = s.order.at(device);
    switch (ord.check(msn)) {
      case DeviceOrder::Check::kOk:
        return true;
      case DeviceOrder::Check::kReleased:
        ++s.counters.stale;
        return false;
      case DeviceOrder::Check::kTooFarAhead:
        ++s.counters.out_of_bounds;
        return false;
    }
    return false;
  }

  // The target now holds (or just finished) the segment's message, so its timer will finish it: the
  // device's order may wait for it. A message that found no receive buffer is not held anywhere; if
  // none of its segments ever is, it counts as lost.
  static bool held(Placed p) {
    return p == Placed::kPlaced || p == Placed::kCompleted || p == Placed::kDuplicate || p == Placed::kOutOfBounds;
  }

  void count_placed(Session& s, Placed p, size_t bytes) {
    switch (p) {
      case Placed::kPlaced:
      case Placed::kCompleted:
        s.counters.bytes += bytes;
        break;
      case Placed::kDuplicate:
        ++s.counters.duplicates;
        break;
      case Placed::kStale:
        ++s.counters.stale;
        break;
      case Placed::kUnknownKey:
        ++s.counters.unknown;
        break;
      case Placed::kOutOfBounds:
        ++s.counters.out_of_bounds;
        break;
      case Placed::kNoBuffer:
        ++s.counters.no_buffer;
        break;
    }
  }

  void place(Session& s, const Segment& seg) {
    const SegmentHeader& h = seg.header;
    const int64_t now = now_ns();
    std::vector<Completion> done;
    std::optional<uint16_t> device;
    switch (h.opcode) {
      case Opcode::kWriteRecord: {
        if (s.proto->data_op != Opcode::kWriteRecord || !h.has_msn) {
          ++s.counters.malformed;
          return;
        }
        device = s.device_of_stag(h.stag);
        if (!device) {
          ++s.counters.unknown;
          return;
        }
        if (!admit(s, *device, h.msn)) return;
        const Placed p = s.tagged.write_record(h.stag, h.msn, h.offset, seg.payload, h.last, now, &done);
        count_placed(s, p, seg.payload.size());
        if (held(p)) s.order.at(*device).seen(h.msn, now);
        break;
      }
      case Opcode::kWrite: {
        if (s.proto->data_op != Opcode::kWrite) {
          ++s.counters.malformed;
          return;
        }
        count_placed(s, s.tagged.write(h.stag, h.offset, seg.payload, now), seg.payload.size());
        return;
      }
      case Opcode::kSend: {
        if (!s.order.contains(uint16_t(h.queue)) || h.queue > 0xFFFF) {
          ++s.counters.unknown;
          return;
        }
        device = uint16_t(h.queue);
        if (!admit(s, *device, h.msn)) return;
        if (s.proto->data_op == Opcode::kWrite) {
          // RC: the Send after an RDMA Write says which STag holds how many bytes of message MSN.
          if (seg.payload.size() != 12) {
            ++s.counters.malformed;
            return;
          }
          const uint32_t stag = uint32_t(get_le(seg.payload.data(), 4));
          const uint64_t length = get_le(seg.payload.data() + 4, 8);
          if (s.device_of_stag(stag) != device) {
            ++s.counters.unknown;
            return;
          }
          s.order.at(*device).seen(h.msn, now);
          auto c = s.tagged.take_written(stag, h.msn, length, now);
          if (!c) {
            ++s.counters.out_of_bounds;
            return;
          }
          done.push_back(std::move(*c));
        } else {
          const Placed p = s.queues.place(h.queue, h.msn, h.offset, seg.payload, h.last, now, &done);
          count_placed(s, p, seg.payload.size());
          if (held(p)) s.order.at(*device).seen(h.msn, now);
        }
        break;
      }
      default:
        ++s.counters.malformed;
        return;
    }
    finish(s, done, now);
  }

  void finish(Session& s, std::vector<Completion>& done, int64_t now) {
    for (auto& c : done) {
      std::optional<uint16_t> dev =
          s.proto->data_op == Opcode::kSend ? std::optional<uint16_t>(uint16_t(c.key)) : s.device_of_stag(c.key);
      if (dev) s.order.at(*dev).finished(std::move(c), now);
    }
  }

  // Releases what each device has ready, in order, to the store.
  void release(std::shared_ptr<Session>& sp, int64_t now) {
    Session& s = *sp;
    std::vector<Completion> done;
    s.tagged.expire(now, &done);
    s.queues.expire(now, &done);
    finish(s, done, now);
    std::vector<DeviceOrder::Release> out;
    for (auto& [device, ord] : s.order) {
      out.clear();
      ord.poll(now, &out);
      for (auto& r : out) deliver(sp, device, r);
    }
  }

  void deliver(std::shared_ptr<Session>& sp, uint16_t device, DeviceOrder::Release& r) {
    Session& s = *sp;
    DeviceReport& dr = s.devices[device];
    if (r.kind == DeviceOrder::Kind::kLost) {
      ++dr.lost;
      return;
    }
    Completion& c = *r.completion;
    bool keep = r.kind == DeviceOrder::Kind::kComplete;
    const bool partial = !keep;
    if (partial) {
      if (c.outcome == Outcome::kRetired) ++dr.retired;
      // Partial placement is Write-Record's: a Send delivers whole messages or nothing, and a
      // retired message's memory belongs to its successor (patent: "discard ... and do not deliver").
      keep = o.keep_partial && s.proto->data_op == Opcode::kWriteRecord && c.outcome == Outcome::kIncomplete &&
             !c.valid.empty();
    }
    // UD has no back-pressure: what the store cannot take in time is dropped (and counted).
    if (keep && backlog.load() + c.data.size() > o.max_backlog_bytes && s.proto->service == Service::kUD) keep = false;
    if (!keep) {
      ++dr.dropped;
      return;
    }
    ++(partial ? dr.partial : dr.complete);
    dr.valid_bytes += c.valid.bytes();
    WorkItem w;
    w.session = sp;
    w.bytes = c.data.size();
    w.completion = std::move(c);
    w.delivered.device = device;
    w.delivered.msn = r.msn;
    w.delivered.partial = partial;
    w.delivered.length_known = w.completion.length_known;
    w.delivered.first_ns = w.completion.first_ns;
    w.delivered.done_ns = w.completion.done_ns;
    enqueue(std::move(w));
  }

  void enqueue(WorkItem w) {
    if (w.session->store == nullptr && !w.fin_marker) return;
    w.session->backlog += w.bytes;
    backlog += w.bytes;
    {
      std::lock_guard lock(q_mu);
      queue.push_back(std::move(w));
    }
    q_cv.notify_one();
  }

  // ------------------------------------------------------------------ session ends

  SessionReport report(const Session& s, bool finished_ok, const std::string& reason) const {
    SessionReport r;
    r.name = s.hello.name;
    r.peer = s.conn ? s.conn->peer.str() : s.addr.str();
    r.protocol = s.proto->name;
    r.finished = finished_ok;
    r.reason = reason;
    r.seconds = double(now_ns() - s.start_ns) / 1e9;
    r.devices = s.devices;
    r.counters = s.counters;
    return r;
  }

  void end_session(std::list<std::shared_ptr<Session>>::iterator it, bool ok, const std::string& reason) {
    std::shared_ptr<Session> s = *it;
    if (last_hit == s.get()) last_hit = nullptr;
    if (ok) {
      FinAck ack;
      for (const auto& [d, dr] : s->devices) {
        ack.devices.push_back({d, DeliveryCounts{dr.complete, dr.partial, dr.dropped, dr.lost, dr.valid_bytes}});
      }
      auto payload = encode_control(ack);
      reply(s.get(), payload);
      last_fin_ack_ns = now_ns();
      if (!s->conn) finished.push_back({s->addr, s->qp, payload, now_ns() + kFinishedMemory});
    } else {
      event("sender " + s->hello.name + " " + reason);
    }
    if (s->conn) s->conn->session.reset();
    sessions.erase(it);
    SessionReport r = report(*s, ok, reason);
    {
      std::lock_guard lock(snap_mu);
      SessionReport& sum = snap.ended[r.name];
      sum.name = r.name;
      sum.protocol = r.protocol;
      accumulate(&sum, r);
      ++snap.sessions_ended;
      publish_locked();
    }
    if (o.on_session_end) o.on_session_end(r);
    ++ended;
  }

  void check_sessions(int64_t now) {
    for (auto it = sessions.begin(); it != sessions.end();) {
      auto cur = it++;
      std::shared_ptr<Session>& s = *cur;
      release(s, now);
      if (s->rd) {
        const uint32_t credits = s->backlog.load() > kCreditBacklog ? 0 : s->rd->window();
        if (credits != s->credits_granted) s->ack_due = true;  // a window update
        if (s->ack_due) send_ack(*s);
      }
      if (s->fin_received && !s->fin_queued) {
        bool all = true;
        for (const auto& [_, ord] : s->order) all = all && ord.all_released();
        if (all) {
          s->fin_queued = true;
          WorkItem w;
          w.session = s;
          w.fin_marker = true;
          enqueue(std::move(w));
        }
      }
      if (s->stored_all.load()) {
        end_session(cur, true, "");
      } else if (s->conn && s->conn->closed) {
        end_session(cur, false, "lost: its TCP connection closed before FIN");
      } else if (!s->conn && now - s->last_heard_ns > o.session_timeout_ns) {
        end_session(cur, false,
                    "lost: nothing heard for " + std::to_string(o.session_timeout_ns / 1'000'000'000) + " s");
      }
    }
    while (!finished.empty() && finished.front().until_ns < now) finished.pop_front();
  }

  int64_t next_deadline() const {
    int64_t d = INT64_MAX;
    for (const auto& s : sessions) {
      d = std::min({d, s->tagged.next_deadline(), s->queues.next_deadline()});
      for (const auto& [_, ord] : s->order) d = std::min(d, ord.next_deadline());
    }
    return d;
  }

  // ------------------------------------------------------------------ threads

  void on_udp_readable() {
    for (int turn = 0; turn < kBatchesPerTurn; ++turn) {
      Status st = udp->receive(inbox);
      if (!st.is_ok() || inbox.size() == 0) return;  // (ICMP errors from old peers are not ours to act on)
      for (size_t i = 0; i < inbox.size(); ++i) {
        if (inbox.truncated(i)) {
          DatagramCounters& c = counters_for(inbox.from(i));
          ++c.datagrams;
          ++c.truncated;
          continue;
        }
        const Address& from = inbox.from(i);
        if (faults) {
          const bool was_holding = faults->holding();
          const Address before = held_from;
          faults->pass(inbox.datagram(i),
                       [&](std::span<const std::byte> d, bool held) { on_datagram(d, held ? before : from, nullptr); });
          if (!was_holding && faults->holding()) held_from = from;
        } else {
          on_datagram(inbox.datagram(i), from, nullptr);
        }
      }
    }
  }

  void on_accept() {
    for (;;) {
      Address peer;
      peer.len = sizeof peer.ss;
      int fd =
          ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&peer.ss), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      conns.push_back(std::make_unique<Conn>(Fd(fd), peer));
    }
  }

  void on_conn_readable(Conn& c) {
    Status st = c.stream.read_available();
    std::span<const std::byte> f;
    while (c.stream.next_frame(&f)) on_datagram(f, c.peer, &c);
    if (!st.is_ok()) c.closed = true;
  }

  void net_loop() {
    std::vector<pollfd> fds;
    std::vector<Conn*> polled;
    int64_t next_snapshot = 0;
    while (!stopping.load()) {
      int64_t now = now_ns();
      const int64_t deadline = next_deadline();
      int timeout = 100;
      if (deadline != INT64_MAX) timeout = int(std::clamp<int64_t>((deadline - now) / kMs + 1, 0, 100));
      if (faults && faults->holding()) timeout = std::min(timeout, 5);
      fds.clear();
      polled.clear();
      fds.push_back({wake.get(), POLLIN, 0});
      fds.push_back({udp->fd(), POLLIN, 0});
      fds.push_back({listener.get(), POLLIN, 0});
      const bool paused = backlog.load() > o.max_backlog_bytes;  // RC: TCP itself holds the sender back
      for (auto& c : conns) {
        if (c->closed) continue;
        fds.push_back({c->stream.fd(), short(paused ? 0 : POLLIN), 0});
        polled.push_back(c.get());
      }
      int n = ::poll(fds.data(), fds.size(), timeout);
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
      now = now_ns();
      check_sessions(now);
      for (auto it = conns.begin(); it != conns.end();) {
        if ((*it)->closed && !(*it)->session) {
          it = conns.erase(it);
        } else {
          ++it;
        }
      }
      if (now >= next_snapshot) {
        publish();
        next_snapshot = now + 100 * kMs;
      }
    }
    for (auto it = sessions.begin(); it != sessions.end();) {
      auto cur = it++;
      end_session(cur, false, "stopped: the receiver is shutting down (messages not yet stored are discarded)");
    }
    publish();
  }

  void publish() {
    std::lock_guard lock(snap_mu);
    publish_locked();
  }

  void publish_locked() {
    snap.live.clear();
    for (const auto& s : sessions) snap.live.push_back(report(*s, false, ""));
    snap.unattributed = unattributed_counters;
    if (faults) {
      const auto& f = faults->stats();
      snap.unattributed.injected_loss = f.dropped;
      snap.unattributed.injected_corrupt = f.corrupted;
      snap.unattributed.injected_duplicate = f.duplicated;
      snap.unattributed.injected_reorder = f.reordered;
    }
  }

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
        w.session->stored_all = true;
        uint64_t one = 1;
        if (::write(wake.get(), &one, sizeof one) < 0) { /* the net thread polls every 100 ms anyway */
        }
        continue;
      }
      w.delivered.data = w.completion.data;
      w.delivered.valid = &w.completion.valid;
      bool reported = false;
      while (!stopping.load()) {
        Status st = w.session->store->store(w.delivered);
        if (st.is_ok()) break;
        if (!reported) {
          event("cannot store a message of sender " + w.session->hello.name +
                " (retrying every 100 ms): " + st.message());
          reported = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      w.session->backlog -= w.bytes;
      backlog -= w.bytes;
    }
  }
};

DatagramReceiver::DatagramReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DatagramReceiver::~DatagramReceiver() { stop(); }

Status DatagramReceiver::start(ReceiverOptions o, std::unique_ptr<DatagramReceiver>* out) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(o);
  std::random_device rd;
  impl->qp = rd() | 1;
  // One port number for both: UDP first (port 0 picks it), then TCP on the same number; if TCP
  // finds it taken, try another free UDP port.
  Status last;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::unique_ptr<UdpSocket> udp;
    SLOTSTREAM_RETURN_IF_ERROR(UdpSocket::open(impl->o.host, impl->o.port, impl->o.socket_buffer, &udp));
    Address a = udp->local();
    Fd l(::socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(l.get(), reinterpret_cast<const sockaddr*>(&a.ss), a.len) == 0 && ::listen(l.get(), 64) == 0) {
      impl->udp = std::move(udp);
      impl->listener = std::move(l);
      impl->address = a.str();
      break;
    }
    last = {Code::kIoError, "cannot listen on TCP " + a.str() + ": " + strerror(errno)};
    if (impl->o.port != 0) return last;
  }
  if (!impl->udp) return last;
  impl->wake = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (impl->o.inject.any()) impl->faults.emplace(impl->o.inject);
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

}  // namespace slotstream::dgram
