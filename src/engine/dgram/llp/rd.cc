#include "engine/dgram/llp/rd.h"

#include <algorithm>
#include <climits>

namespace slotstream::dgram {

RdSender::RdSender(Options o) : o_(o), credits_(o.initial_credits), rto_(o.rto_initial_ns) {}

void RdSender::sent(std::vector<std::byte> datagram, int64_t now_ns) {
  Entry e;
  e.datagram = std::move(datagram);
  e.first_sent_ns = e.last_sent_ns = now_ns;
  e.deadline_ns = now_ns + rto_;
  unacked_.push_back(std::move(e));
  ++next_;
  ++stats_.sent;
}

void RdSender::rtt_sample(int64_t rtt) {
  // RFC 6298 §2 (alpha 1/8, beta 1/4, K = 4), with bounds suited to a LAN.
  if (srtt_ == 0) {
    srtt_ = rtt;
    rttvar_ = rtt / 2;
  } else {
    const int64_t err = rtt > srtt_ ? rtt - srtt_ : srtt_ - rtt;
    rttvar_ = (3 * rttvar_ + err) / 4;
    srtt_ = (7 * srtt_ + rtt) / 8;
  }
  rto_ = std::clamp(srtt_ + 4 * rttvar_, o_.rto_min_ns, o_.rto_max_ns);
}

size_t RdSender::on_ack(uint32_t ack, uint32_t credits, uint64_t sack, int64_t now_ns) {
  const int32_t advance = seq_diff(base_, ack);
  // An ack from the past (reordered) or for data never sent is ignored entirely.
  if (advance < 0 || advance > int64_t(unacked_.size())) return 0;
  if (seq_diff(ack_, ack) >= 0) {
    ack_ = ack;
    credits_ = credits;
  }
  for (int32_t i = 0; i < advance; ++i) {
    const Entry& e = unacked_.front();
    if (e.retransmits == 0) rtt_sample(now_ns - e.first_sent_ns);  // Karn: never a retransmitted one
    unacked_.pop_front();
  }
  base_ = ack;
  // sack bit i: sequence ack + 1 + i arrived.
  for (size_t i = 0; i < 64 && i + 1 < unacked_.size(); ++i) {
    if (sack >> i & 1) unacked_[i + 1].sacked = true;
  }
  if (!window_open() && unacked_.empty()) {
    if (closed_since_ns_ < 0) closed_since_ns_ = now_ns;
  } else {
    closed_since_ns_ = -1;
  }
  return size_t(advance);
}

void RdSender::due(int64_t now_ns, std::vector<const std::vector<std::byte>*>* out) {
  // Only the datagrams the acknowledgement can speak about (the cumulative ack and the 64 after
  // it) are timed: beyond that the sender cannot tell a lost datagram from one held behind a
  // hole, and retransmitting all of those would flood a receiver that already has them. They
  // come into view as the holes fill.
  const size_t in_view = std::min<size_t>(unacked_.size(), 65);
  // Fast retransmit: a hole with at least three acknowledged datagrams after it (as TCP's three
  // duplicate acks), at most once per smoothed round trip.
  size_t sacked_after = 0;
  for (size_t i = in_view; i-- > 0;) {
    Entry& e = unacked_[i];
    if (e.sacked) {
      ++sacked_after;
      continue;
    }
    const bool timed_out = e.deadline_ns <= now_ns;
    const bool fast = sacked_after >= 3 && now_ns - e.last_sent_ns >= (srtt_ > 0 ? srtt_ : o_.rto_min_ns);
    if (!timed_out && !fast) continue;
    ++e.retransmits;
    ++stats_.retransmits;
    if (timed_out) {
      ++stats_.timeouts;
      // Exponential back-off for this datagram (RFC 6298 §5.5).
      const int64_t backoff = std::min<int64_t>(o_.rto_max_ns, rto_ << std::min(e.retransmits, 16));
      e.deadline_ns = now_ns + backoff;
    } else {
      ++stats_.fast_retransmits;
      e.deadline_ns = now_ns + rto_;
    }
    e.last_sent_ns = now_ns;
    out->push_back(&e.datagram);
  }
  std::reverse(out->begin(), out->end());  // oldest first
}

bool RdSender::wants_probe(int64_t now_ns) {
  if (window_open() || !unacked_.empty()) {
    closed_since_ns_ = -1;
    return false;
  }
  if (closed_since_ns_ < 0) closed_since_ns_ = now_ns;
  if (now_ns - closed_since_ns_ < rto_) return false;
  closed_since_ns_ = now_ns;
  ++stats_.probes;
  return true;
}

bool RdSender::failed(int64_t now_ns) const {
  return !unacked_.empty() && now_ns - unacked_.front().first_sent_ns > o_.give_up_ns;
}

int64_t RdSender::next_timer_ns() const {
  int64_t t = INT64_MAX;
  for (size_t i = 0; i < std::min<size_t>(unacked_.size(), 65); ++i) {
    if (!unacked_[i].sacked) t = std::min(t, unacked_[i].deadline_ns);
  }
  return t;
}

RdReceiver::Result RdReceiver::on_segment(uint32_t seq, std::span<const std::byte> datagram) {
  const int32_t d = seq_diff(expected_, seq);
  if (d < 0) return Result::kDuplicate;
  if (d == 0) {
    ++expected_;
    if (!ahead_.empty()) {
      ahead_.pop_front();
      have_.pop_front();
    }
    return Result::kInOrder;
  }
  if (uint32_t(d) > window_) return Result::kBeyondWindow;
  if (ahead_.size() <= size_t(d)) {
    ahead_.resize(size_t(d) + 1);
    have_.resize(size_t(d) + 1, false);
  }
  if (have_[size_t(d)]) return Result::kDuplicate;
  ahead_[size_t(d)].assign(datagram.begin(), datagram.end());
  have_[size_t(d)] = true;
  return Result::kBuffered;
}

bool RdReceiver::pop(std::vector<std::byte>* out) {
  if (have_.empty() || !have_.front()) return false;
  *out = std::move(ahead_.front());
  ahead_.pop_front();
  have_.pop_front();
  ++expected_;
  return true;
}

RdFields RdReceiver::ack(uint32_t credits) const {
  RdFields f;
  f.flags = kRdAckValid;
  f.ack = expected_;
  f.credits = credits;
  // Bit i: sequence expected_ + 1 + i is held, i.e. have_[i + 1].
  for (size_t i = 0; i < 64 && i + 1 < have_.size(); ++i) {
    if (have_[i + 1]) f.sack |= uint64_t(1) << i;
  }
  return f;
}

}  // namespace slotstream::dgram
