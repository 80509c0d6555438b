#include "dgram/session.h"

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
      tagged_(reliable() ? c_.reliable_timeout_ns : c_.message_timeout_ns, reliable()),
      queues_(reliable() ? c_.reliable_timeout_ns : c_.message_timeout_ns, reliable()),
      credits_granted_(c_.rd_window) {
  const auto& devs = c_.hello.devices;
  index_.reserve(devs.size());
  for (size_t i = 0; i < devs.size(); ++i) index_.emplace_back(devs[i], uint16_t(i));
  std::sort(index_.begin(), index_.end());
  if (c_.protocol->data_op == Opcode::kSend) {
    queues_.post_all(c_.hello.ring, c_.hello.max_message);
  } else {
    tagged_.add_regions(c_.first_stag, uint32_t(devs.size() * c_.hello.ring), c_.hello.max_message);
  }
  if (c_.protocol->service == Service::kRD) rd_.emplace(c_.rd_window);
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

std::optional<size_t> Session::index_of(uint16_t device) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), std::pair<uint16_t, uint16_t>(device, 0));
  if (it == index_.end() || it->first != device) return std::nullopt;
  return it->second;
}

std::optional<uint16_t> Session::device_of_stag(uint32_t stag) const {
  if (stag < c_.first_stag) return std::nullopt;
  const uint64_t i = (uint64_t(stag) - c_.first_stag) / c_.hello.ring;
  if (i >= c_.hello.devices.size()) return std::nullopt;
  return c_.hello.devices[i];
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
  const SegmentHeader& h = seg.header;
  const Service want = c_.protocol->over_tcp() ? Service::kRC : c_.protocol->service;
  if (h.service != want) {
    ++counters_.malformed;
    return;
  }
  if (want == Service::kRD) return on_rd(seg, datagram, now_ns);
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

void Session::count_placed(Placed p, size_t bytes) {
  switch (p) {
    case Placed::kPlaced:
    case Placed::kCompleted:
      counters_.bytes += bytes;
      carried_data_ = true;
      break;
    case Placed::kConflict:
      ++counters_.conflicting;
      ++counters_.duplicates;
      break;
    case Placed::kDuplicate:
      ++counters_.duplicates;
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
  }
}

void Session::place(const Segment& seg, int64_t now_ns) {
  std::vector<Completion> done;
  switch (seg.header.opcode) {
    case Opcode::kWriteRecord:
    case Opcode::kWrite:
      place_tagged(seg, now_ns, &done);
      break;
    case Opcode::kSend:
      place_send(seg, now_ns, &done);
      break;
    default:
      ++counters_.malformed;
      return;
  }
  finish(done, now_ns);
}

void Session::place_tagged(const Segment& seg, int64_t now_ns, std::vector<Completion>* done) {
  const SegmentHeader& h = seg.header;
  if (c_.protocol->data_op != h.opcode || (h.opcode == Opcode::kWriteRecord && !h.has_msn)) {
    ++counters_.malformed;
    return;
  }
  const auto dev = device_of_stag(h.stag);
  if (!dev) {
    ++counters_.unknown;
    return;
  }
  if (h.opcode == Opcode::kWrite) {
    // RC: placed now, recorded for no one; the Send after it says the message is there.
    count_placed(tagged_.write(h.stag, h.offset, seg.payload, now_ns), seg.payload.size());
    return;
  }
  if (!admit(*dev, h.msn)) return;
  const Placed p = tagged_.write_record(h.stag, h.msn, h.offset, seg.payload, h.last, now_ns, done);
  count_placed(p, seg.payload.size());
  if (held(p)) device(*dev).order.seen(h.msn, now_ns);
}

void Session::place_send(const Segment& seg, int64_t now_ns, std::vector<Completion>* done) {
  const SegmentHeader& h = seg.header;
  if (h.queue > 0xFFFF || !index_of(uint16_t(h.queue))) {
    ++counters_.unknown;
    return;
  }
  const uint16_t d = uint16_t(h.queue);
  if (!admit(d, h.msn)) return;
  if (c_.protocol->data_op != Opcode::kWrite) {
    const Placed p = queues_.place(h.queue, h.msn, h.offset, seg.payload, h.last, now_ns, done);
    count_placed(p, seg.payload.size());
    if (held(p)) device(d).order.seen(h.msn, now_ns);
    return;
  }
  // RC: the Send after an RDMA Write says which STag holds how many bytes of message MSN.
  if (seg.payload.size() != 12) {
    ++counters_.malformed;
    return;
  }
  const uint32_t stag = uint32_t(wire::get_le(seg.payload.data(), 4));
  const uint64_t length = wire::get_le(seg.payload.data() + 4, 8);
  if (device_of_stag(stag) != d) {
    ++counters_.unknown;
    return;
  }
  device(d).order.seen(h.msn, now_ns);
  auto c = tagged_.take_written(stag, h.msn, length, now_ns);
  if (!c) {
    ++counters_.out_of_bounds;
    return;
  }
  carried_data_ = true;
  done->push_back(std::move(*c));
}

void Session::finish(std::vector<Completion>& done, int64_t now_ns) {
  for (auto& c : done) {
    if (c.outcome == Outcome::kIncomplete) ++counters_.expired;
    // An RC Write whose notification never came names no message: counted, nothing to hand over.
    if (c_.protocol->data_op == Opcode::kWrite && c.outcome != Outcome::kComplete) continue;
    const std::optional<uint16_t> d =
        c_.protocol->data_op == Opcode::kSend ? std::optional<uint16_t>(uint16_t(c.key)) : device_of_stag(c.key);
    if (d) device(*d).order.finished(std::move(c), now_ns);
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
    st.report.sent = f.messages;
    st.report.bytes_sent = f.bytes;
  }
  return true;
}

bool Session::all_released() const {
  if (!fin_complete()) return false;
  for (const auto& [_, st] : devices_) {
    if (!st.order.all_released()) return false;
  }
  return true;
}

void Session::set_backpressure(bool on, int64_t now_ns) {
  if (backpressure_ && !on && reliable()) {
    // The sender was held back: its messages' silence was ours, so their timers start over.
    tagged_.extend_all(now_ns + c_.reliable_timeout_ns);
    queues_.extend_all(now_ns + c_.reliable_timeout_ns);
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

void Session::release(int64_t now_ns, bool keep_partial, uint64_t* room, std::vector<Ready>* out) {
  if (!(backpressure_ && reliable())) {
    std::vector<Completion> done;
    tagged_.expire(now_ns, &done);
    queues_.expire(now_ns, &done);
    finish(done, now_ns);
  }
  std::vector<DeviceOrder::Release> ready;
  for (auto& [d, st] : devices_) {
    ready.clear();
    st.order.poll(now_ns, &ready);
    for (auto& r : ready) hand_over(d, st, r, keep_partial, room, out);
  }
}

void Session::hand_over(uint16_t d, DeviceState& st, DeviceOrder::Release& r, bool keep_partial, uint64_t* room,
                        std::vector<Ready>* out) {
  DeviceReport& dr = st.report;
  if (r.kind == DeviceOrder::Kind::kLost) {
    dr.lost += r.count;
    return;
  }
  Completion& c = *r.completion;
  const bool partial = r.kind != DeviceOrder::Kind::kComplete;
  bool keep = !partial;
  if (partial) {
    if (c.outcome == Outcome::kRetired) ++dr.retired;
    // Partial placement is Write-Record's: a Send delivers whole messages or nothing, and a retired
    // message's memory belongs to its successor (patent: "discard ... and do not deliver").
    keep = keep_partial && c_.protocol->data_op == Opcode::kWriteRecord && c.outcome == Outcome::kIncomplete &&
           !c.valid.empty();
  }
  // UD has no back-pressure: what the store cannot take in time is dropped (and counted).
  if (keep && !reliable() && c.data.size() > *room) keep = false;
  if (!keep) {
    ++dr.dropped;
    return;
  }
  *room -= std::min<uint64_t>(*room, c.data.size());
  ++(partial ? dr.partial : dr.complete);
  dr.valid_bytes += c.valid.bytes();
  out->push_back(Ready{d, r.msn, partial, std::move(c)});
}

int64_t Session::next_deadline() const {
  int64_t d = INT64_MAX;
  // Timers that stand still under back-pressure are not waited for (the loop would spin on them).
  if (!(backpressure_ && reliable())) d = std::min(tagged_.next_deadline(), queues_.next_deadline());
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
      const DeviceReport& r = it->second.report;
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

std::map<uint16_t, DeviceReport> Session::device_reports() const {
  std::map<uint16_t, DeviceReport> m;
  for (const auto& [d, st] : devices_) m[d] = st.report;
  return m;
}

}  // namespace slotstream::dgram
