#include "engine/dgram/recv/session.h"

#include <algorithm>
#include <climits>

#include "wire/codec.h"

namespace slotstream::dgram {
namespace {

// The target holds (or just finished) the segment's message, so its timer will finish it: the
// device's order may wait for it. A message that found no receive buffer is held nowhere; if none of
// its segments ever is, it counts as lost.
bool held(Placed p) {
  return p == Placed::kPlaced || p == Placed::kCompleted || p == Placed::kDuplicate || p == Placed::kConflict ||
         p == Placed::kOutOfBounds;
}

// The most messages one device can send in a session (MSNs are 32-bit).
constexpr uint64_t kMaxMessages = UINT32_MAX;

}  // namespace

Session::Session(Config c)
    : c_(std::move(c)),
      placement_(c_.protocol->make_placement(
          placement_spec(*c_.protocol, c_.hello, c_.first_stag, c_.message_timeout_ns, c_.reliable_timeout_ns))),
      credits_granted_(c_.rd_window) {
  if (c_.protocol->sequenced) rd_.emplace(c_.rd_window);
}

Accept Session::accept(uint32_t receiver_qp) const {
  Accept a;
  a.receiver_qp = receiver_qp;
  a.region_length = c_.hello.max_message;
  a.first_stag = c_.first_stag;
  a.devices = uint16_t(c_.hello.devices.size());
  if (rd_) a.credits = c_.rd_window;
  return a;
}

Session::DeviceState& Session::device(uint16_t d) {
  auto it = devices_.find(d);
  if (it == devices_.end()) {
    it = devices_.emplace(d, DeviceState(reliable() ? c_.reliable_timeout_ns : c_.message_timeout_ns)).first;
  }
  return it->second;
}

// ------------------------------------------------------------------ segments

void Session::on_segment(const Segment& seg, std::span<const std::byte> datagram, int64_t now_ns) {
  if (seg.header.service != c_.protocol->service) {
    ++counters_.malformed;
    return violated(TerminateLayer::kRdmap, TerminateCode::kProtocol,
                    "a segment of service " + std::to_string(int(seg.header.service)) + " in a " +
                        std::string(c_.protocol->name) + " session (service " +
                        std::to_string(int(c_.protocol->service)) + ")");
  }
  if (rd_) return on_rd(seg, datagram, now_ns);
  place(seg, now_ns);
}

void Session::on_rd(const Segment& seg, std::span<const std::byte> datagram, int64_t now_ns) {
  ack_due_ = true;
  if (seg.header.opcode == Opcode::kAck) return;  // a probe: the sender's window is shut and wants to hear from us
  switch (rd_->on_segment(seg.header.rd.seq, datagram)) {
    case RdReceiver::Result::kInOrder: {
      place(seg, now_ns);
      std::vector<std::byte> next;
      while (rd_->pop(&next)) {
        if (auto again = decode_segment(next)) place(*again, now_ns);
      }
      break;
    }
    case RdReceiver::Result::kBuffered:
      break;
    case RdReceiver::Result::kDuplicate:
      ++counters_.rd_duplicates;
      break;
    case RdReceiver::Result::kBeyondWindow:
      ++counters_.rd_beyond_window;
      break;
  }
}

// Checks an MSN against its device's order; false (counted) if the segment is to be dropped.
bool Session::admit(uint16_t d, uint32_t msn) {
  auto it = devices_.find(d);
  if (it == devices_.end()) {
    if (msn > DeviceOrder::kMaxAhead) {
      ++counters_.out_of_bounds;
      return false;
    }
    return true;
  }
  switch (it->second.order.check(msn)) {
    case DeviceOrder::Check::kOk:
      return true;
    case DeviceOrder::Check::kReleased:
      ++counters_.stale;
      return false;
    case DeviceOrder::Check::kTooFarAhead:
      ++counters_.out_of_bounds;
      return false;
  }
  return false;
}

void Session::count_placed(Placed p, size_t bytes, uint16_t d) {
  auto duplicate = [&] {
    ++counters_.duplicates;
    if (auto it = devices_.find(d); it != devices_.end()) ++it->second.account.duplicates;
  };
  switch (p) {
    case Placed::kPlaced:
    case Placed::kCompleted:
      counters_.bytes += bytes;
      carried_data_ = true;
      break;
    case Placed::kConflict:
      ++counters_.conflicting;
      duplicate();
      break;
    case Placed::kDuplicate:
      duplicate();
      break;
    case Placed::kStale:
      ++counters_.stale;
      break;
    case Placed::kUnknownKey:
      ++counters_.unknown;
      break;
    case Placed::kOutOfBounds:
      ++counters_.out_of_bounds;
      break;
    case Placed::kNoBuffer:
      ++counters_.no_buffer;
      break;
    case Placed::kMalformed:
      ++counters_.malformed;
      break;
  }
}

// Placement is the protocol's (engine/dgram/protocol/protocol.h): where the segment goes and which device and message
// it belongs to. The session checks it against the device's order, counts, and notes the message.
void Session::place(const Segment& seg, int64_t now_ns) {
  Reject why = Reject::kMalformed;
  const std::optional<Located> at = placement_->locate(seg.header, &why);
  if (!at) {
    const SegmentHeader& h = seg.header;
    if (why == Reject::kUnknown) {
      ++counters_.unknown;
      return violated(
          TerminateLayer::kDdp, TerminateCode::kPlacement,
          std::string(is_tagged(h.opcode) ? "STag " + std::to_string(h.stag) : "queue " + std::to_string(h.queue)) +
              " is not one of this session's");
    }
    ++counters_.malformed;
    return violated(TerminateLayer::kRdmap, TerminateCode::kProtocol,
                    "opcode " + std::to_string(int(h.opcode)) + " is not an operation of protocol " +
                        std::string(c_.protocol->name));
  }
  if (at->ordered && !admit(at->device, at->msn)) return;
  std::vector<Completion> done;
  const Placed p = placement_->place(seg, *at, now_ns, &done);
  if (at->ordered && held(p)) device(at->device).order.seen(at->msn, now_ns);
  count_placed(p, seg.payload.size(), at->device);
  check_placed(p, seg, *at);
  finish(done, now_ns);
}

// Placements that no sender following the protocol makes: a protocol error (TERMINATE).
void Session::check_placed(Placed p, const Segment& seg, const Located& at) {
  const std::string message = "message " + std::to_string(at.msn) + " of device " + std::to_string(at.device);
  if (p == Placed::kOutOfBounds) {
    violated(TerminateLayer::kDdp, TerminateCode::kPlacement,
             "a segment at offset " + std::to_string(seg.header.offset) + " (" + std::to_string(seg.payload.size()) +
                 " B) of " + message + " lies beyond its region (" + std::to_string(c_.hello.max_message) +
                 " B) or its end");
  } else if (p == Placed::kUnknownKey) {
    violated(TerminateLayer::kDdp, TerminateCode::kPlacement, message + " names an STag not of its device");
  } else if (p == Placed::kMalformed) {
    violated(TerminateLayer::kRdmap, TerminateCode::kProtocol, message + " carries a malformed notice");
  }
}

void Session::violated(TerminateLayer layer, TerminateCode code, std::string why) {
  if (!violation_) violation_ = Terminate{layer, code, std::move(why)};
}

std::optional<Terminate> Session::protocol_error() const {
  if (violation_) return violation_;
  const uint64_t bad = counters_.crc_errors, good = counters_.datagrams - std::min(counters_.datagrams, bad);
  if (bad < kCrcTerminateMin || bad <= good) return std::nullopt;
  return Terminate{TerminateLayer::kLlp, TerminateCode::kCrc,
                   std::to_string(bad) + " of " + std::to_string(bad + good) +
                       " datagrams failed their CRC32C: the path corrupts more than it delivers"};
}

void Session::finish(std::vector<Completion>& done, int64_t now_ns) {
  for (auto& c : done) {
    if (c.outcome == Outcome::kIncomplete) ++counters_.expired;
    if (const auto d = placement_->device_of(c)) device(*d).order.finished(std::move(c), now_ns);
  }
}

// ------------------------------------------------------------------ FIN, back-pressure, RD acks

bool Session::on_fin(const Fin& part, int64_t now_ns) {
  const auto& devs = c_.hello.devices;
  bool ok = part.total == devs.size() && size_t(part.first) + part.devices.size() <= devs.size();
  for (size_t i = 0; ok && i < part.devices.size(); ++i) {
    ok = part.devices[i].device == devs[part.first + i] && part.devices[i].messages <= kMaxMessages;
  }
  if (!ok) {
    ++counters_.malformed;
    return false;
  }
  if (fin_seen_.empty()) fin_seen_.assign(devs.size(), false);
  for (size_t i = 0; i < part.devices.size(); ++i) {
    if (fin_seen_[part.first + i]) continue;  // a repeated part
    fin_seen_[part.first + i] = true;
    ++fin_known_;
    const Fin::Device& f = part.devices[i];
    if (f.messages == 0 && !devices_.contains(f.device)) continue;  // nothing sent, nothing to account for
    DeviceState& st = device(f.device);
    st.order.fin(f.messages, now_ns);
    st.account.sent = f.messages;
    st.account.bytes_sent = f.bytes;
  }
  return true;
}

bool Session::all_released() const {
  if (!fin_complete()) return false;
  for (const auto& [_, st] : devices_) {
    if (!st.order.all_released() || !st.waiting.empty()) return false;
  }
  return true;
}

void Session::set_backpressure(bool on, int64_t now_ns) {
  if (backpressure_ && !on && reliable()) {
    // The sender was held back: its messages' silence was ours, so their timers start over.
    placement_->extend_all(now_ns + c_.reliable_timeout_ns);
  }
  backpressure_ = on;
  if (rd_ && (on ? 0 : rd_->window()) != credits_granted_) ack_due_ = true;  // a window update
}

std::optional<RdFields> Session::take_ack() {
  if (!rd_ || !ack_due_) return std::nullopt;
  credits_granted_ = backpressure_ ? 0 : rd_->window();
  ack_due_ = false;
  ++counters_.acks_sent;
  return rd_->ack(credits_granted_);
}

// ------------------------------------------------------------------ hand-over

void Session::hold(uint32_t slot, bool on) {
  if (slot >= c_.hello.ring) return;
  if (holds_.size() <= slot) holds_.resize(slot + 1, false);
  holds_[slot] = on;
}

size_t Session::held_slots() const { return size_t(std::count(holds_.begin(), holds_.end(), true)); }

bool Session::withheld(const DeviceOrder::Release& r) const {
  if (r.kind == DeviceOrder::Kind::kLost) return false;  // nothing of it to keep back
  const uint32_t slot = r.msn % c_.hello.ring;
  return slot < holds_.size() && holds_[slot];
}

void Session::release(int64_t now_ns, Room& room, std::vector<Ready>* out) {
  if (!(backpressure_ && reliable())) {
    std::vector<Completion> done;
    placement_->expire(now_ns, &done);
    finish(done, now_ns);
  }
  std::vector<DeviceOrder::Release> ready;
  for (auto& [d, st] : devices_) {
    ready.clear();
    st.order.poll(now_ns, &ready);
    for (auto& r : ready) st.waiting.push_back(std::move(r));
    while (!st.waiting.empty() && !withheld(st.waiting.front())) {
      hand_over(d, st, st.waiting.front(), room, out);
      st.waiting.pop_front();
    }
  }
}

void Session::hand_over(uint16_t d, DeviceState& st, DeviceOrder::Release& r, Room& room, std::vector<Ready>* out) {
  DeviceAccount& a = st.account;
  if (r.kind == DeviceOrder::Kind::kLost) {
    a.lost += r.count;
    return;
  }
  Completion& c = *r.completion;
  const bool partial = r.kind != DeviceOrder::Kind::kComplete;
  bool keep = !partial;
  if (partial) {
    if (c.outcome == Outcome::kRetired) ++a.retired;
    // Partial placement is Write-Record's: a Send delivers whole messages or nothing, and a retired
    // message's memory belongs to its successor (patent: "discard ... and do not deliver").
    keep = c_.keep_partial && c_.protocol->partial && c.outcome == Outcome::kIncomplete && !c.valid.empty();
  }
  // UD has no back-pressure: what the store cannot take in time, or a paused device's store at all,
  // is dropped (and counted).
  if (keep && !reliable() && (c.data.size() > room.bytes || (room.paused && room.paused(d)))) keep = false;
  if (!keep) {
    ++a.dropped;
    return;
  }
  room.bytes -= std::min<uint64_t>(room.bytes, c.data.size());
  ++(partial ? a.partial : a.complete);
  a.valid_bytes += c.valid.bytes();
  out->push_back(Ready{d, r.msn, partial, std::move(c)});
}

int64_t Session::next_deadline() const {
  int64_t d = INT64_MAX;
  // Timers that stand still under back-pressure are not waited for (the loop would spin on them).
  if (!(backpressure_ && reliable())) d = placement_->next_deadline();
  for (const auto& [_, st] : devices_) d = std::min(d, st.order.next_deadline());
  return d;
}

// ------------------------------------------------------------------ reports

FinAck Session::fin_ack_part(uint16_t first) const {
  const auto& devs = c_.hello.devices;
  FinAck a;
  a.total = uint16_t(devs.size());
  a.first = first;
  for (size_t i = first; i < devs.size() && i < size_t(first) + kFinPartDevices; ++i) {
    DeliveryCounts k;
    if (auto it = devices_.find(devs[i]); it != devices_.end()) {
      const DeviceAccount& r = it->second.account;
      k = {r.complete, r.partial, r.dropped, r.lost, r.valid_bytes};
    }
    a.devices.push_back({devs[i], k});
  }
  return a;
}

std::vector<FinAck> Session::fin_ack_parts() const {
  std::vector<FinAck> parts;
  for (size_t first = 0; first < c_.hello.devices.size(); first += kFinPartDevices) {
    parts.push_back(fin_ack_part(uint16_t(first)));
  }
  return parts;
}

std::map<uint16_t, DeviceAccount> Session::device_accounts() const {
  std::map<uint16_t, DeviceAccount> m;
  for (const auto& [d, st] : devices_) m[d] = st.account;
  return m;
}

}  // namespace slotstream::dgram
