#include "engine/dgram/shim/reassembly.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "engine/dgram/protocol/write_record.h"

namespace slotstream::dgram {

namespace {
const uint16_t kOneDevice[] = {0};  // a source is one "device": its STag ring starts at kShimFirstStag
}

struct Reassembly::Source {
  Source(const sockaddr_storage& f, socklen_t l, uint32_t q, const PlacementSpec& spec)
      : from(f),
        from_len(l),
        qp(q),
        placement(spec) {}
  sockaddr_storage from;
  socklen_t from_len;
  uint32_t qp;
  WriteRecordPlacement placement;
  int64_t last_ns = 0;
  // Ancillary data of each message in progress, by MSN: its first placed segment's (bounded: messages
  // that never finish leave theirs behind until 2 x kShimRing newer ones push it out).
  std::vector<std::pair<uint32_t, std::vector<std::byte>>> control;
  void keep_control(uint32_t msn, std::span<const std::byte> bytes) {
    if (bytes.empty() || std::any_of(control.begin(), control.end(), [&](const auto& c) { return c.first == msn; }))
      return;
    if (control.size() >= 2 * kShimRing) control.erase(control.begin());
    control.emplace_back(msn, std::vector<std::byte>(bytes.begin(), bytes.end()));
  }
  std::vector<std::byte> take_control(uint32_t msn) {
    const auto it = std::find_if(control.begin(), control.end(), [&](const auto& c) { return c.first == msn; });
    if (it == control.end()) return {};
    std::vector<std::byte> bytes = std::move(it->second);
    control.erase(it);
    return bytes;
  }
};

Reassembly::Reassembly(ReassemblyOptions o, ReassemblyCounters* counters) : o_(o), counters_(counters) {}
Reassembly::~Reassembly() = default;

Reassembly::Source* Reassembly::source(const sockaddr_storage& from, socklen_t from_len, uint32_t qp,
                                       std::deque<ShimDatagram>* out) {
  for (auto& s : sources_) {
    if (s->qp == qp && s->from_len == from_len && std::memcmp(&s->from, &from, from_len) == 0) return s.get();
  }
  if (sources_.size() >= o_.max_sources) {
    // The least recently heard source ends: its messages are handled as timed out.
    auto oldest = std::min_element(sources_.begin(), sources_.end(),
                                   [](const auto& a, const auto& b) { return a->last_ns < b->last_ns; });
    std::vector<Completion> done;
    (*oldest)->placement.expire(INT64_MAX, &done);
    finish(**oldest, done, out);
    sources_.erase(oldest);
  }
  PlacementSpec spec;
  spec.devices = kOneDevice;
  spec.ring = kShimRing;
  spec.max_message = kShimRegion;
  spec.first_stag = kShimFirstStag;
  spec.timeout_ns = o_.timeout_ns;
  sources_.push_back(std::make_unique<Source>(from, from_len, qp, spec));
  return sources_.back().get();
}

void Reassembly::feed(const Segment& seg, const sockaddr_storage& from, socklen_t from_len,
                      std::span<const std::byte> control, int64_t now_ns, std::deque<ShimDatagram>* out) {
  Reject why;
  Source* s = source(from, from_len, seg.header.source_qp, out);
  s->last_ns = now_ns;
  const auto at = s->placement.locate(seg.header, &why);
  if (!at) {
    ++counters_->bad_segments;
    return;
  }
  std::vector<Completion> done;
  switch (s->placement.place(seg, *at, now_ns, &done)) {
    case Placed::kStale:
      ++counters_->late_segments;
      break;
    case Placed::kDuplicate:
    case Placed::kConflict:
      ++counters_->duplicate_segments;
      break;
    case Placed::kUnknownKey:
    case Placed::kOutOfBounds:
    case Placed::kMalformed:
    case Placed::kNoBuffer:
      ++counters_->bad_segments;
      break;
    case Placed::kPlaced:
    case Placed::kCompleted:
      s->keep_control(seg.header.msn, control);
      break;
  }
  finish(*s, done, out);
}

void Reassembly::finish(Source& s, std::vector<Completion>& done, std::deque<ShimDatagram>* out) {
  for (Completion& c : done) {
    const bool whole = c.outcome == Outcome::kComplete;
    if (!whole && (!o_.deliver_partial || c.valid.bytes() == 0)) {
      ++counters_->partial_dropped;
      continue;
    }
    ++(whole ? counters_->reassembled : counters_->partial_delivered);
    ShimDatagram d;
    d.from = s.from;
    d.from_len = s.from_len;
    d.data = std::move(c.data);
    d.partial = !whole;
    d.control = s.take_control(c.msn);
    out->push_back(std::move(d));
  }
}

void Reassembly::expire(int64_t now_ns, std::deque<ShimDatagram>* out) {
  std::vector<Completion> done;
  for (auto& s : sources_) {
    if (s->placement.next_deadline() > now_ns) continue;
    done.clear();
    s->placement.expire(now_ns, &done);
    finish(*s, done, out);
  }
  // Forget sources long silent with nothing in progress (a late segment of theirs starts afresh).
  const int64_t forget = now_ns - kForgetAfter * o_.timeout_ns;
  std::erase_if(sources_,
                [&](const auto& s) { return s->last_ns < forget && s->placement.next_deadline() == INT64_MAX; });
}

int64_t Reassembly::wake_ns() const {
  if (!o_.deliver_partial) return INT64_MAX;
  int64_t d = INT64_MAX;
  for (const auto& s : sources_) d = std::min(d, s->placement.next_deadline());
  return d;
}

size_t Reassembly::outstanding() const {
  size_t n = 0;
  for (const auto& s : sources_) n += s->placement.next_deadline() != INT64_MAX;
  return n;
}

}  // namespace slotstream::dgram
